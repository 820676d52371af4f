/*
 * Integration test of puts that replace an existing key at commit
 * (KVF_STORE_REPLACE), with a real master and node on 127.0.0.1:
 * - without the flag an existing key is KVF_ERR_EXISTS; with it the put
 *   succeeds and a get reads the new bytes; on the reservation path
 *   (one size again and again), on the full path (sizes that change),
 *   for a key that did not exist, and in a put batch (existing and new
 *   keys together, committed by PUT_END);
 * - many replaces of one key in a small pool: the old objects' space
 *   comes back (no KVF_ERR_NO_SPACE);
 * - two writers replacing one key while two readers read it (gets and
 *   shared views): every read finds the key (never a miss, never "not
 *   ready") and its bytes are whole, one value a writer put.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_store_harness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KiB 1024

static const kvf_store_put_opts_t replace = {.flags = KVF_STORE_REPLACE};

/* A value of len bytes derived from seed, the seed in its first bytes. */
static void fill_tagged(unsigned char *buf, size_t len, uint64_t seed)
{
    kvs_fill(buf, len, seed);
    memcpy(buf, &seed, sizeof(seed));
}

/* Whether buf (len bytes) is whole: the value its tag names. */
static int tagged_ok(const unsigned char *buf, size_t len, unsigned char *tmp)
{
    uint64_t seed;

    if (len < sizeof(seed)) {
        return 0;
    }
    memcpy(&seed, buf, sizeof(seed));
    fill_tagged(tmp, len, seed);
    return memcmp(buf, tmp, len) == 0;
}

static void get_check(kvs_client_t *c, const char *key, size_t len,
                      uint64_t seed)
{
    unsigned char *tmp = malloc(len);
    size_t got = 0;

    assert_non_null(tmp);
    assert_int_equal(kvf_store_get(c->st, key, c->buf, c->len, &got, 0),
                     KVF_OK);
    assert_int_equal(got, len);
    fill_tagged(tmp, len, seed);
    assert_memory_equal(c->buf, tmp, len);
    free(tmp);
}

static void put_tagged(kvs_client_t *c, const char *key, size_t len,
                       uint64_t seed, const kvf_store_put_opts_t *o)
{
    fill_tagged(c->buf, len, seed);
    assert_int_equal(kvf_store_put(c->st, key, c->buf, len, o), KVF_OK);
}

static void test_replace_basic(void **state)
{
    static const size_t sizes[] = {64 * KiB,  64 * KiB,  64 * KiB, 100,
                                   300 * KiB, 300 * KiB, 8};
    const char *keys[3] = {"rb/a", "rb/b", "rb/new"};
    const void *bufs[3];
    size_t lens[3] = {5000, 70000, 12};
    kvf_status_t sts[3];
    kvs_proc_t m, n;
    kvs_client_t c;
    size_t i;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_node(&n, m.addr, "32M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 1024 * KiB), 0);

    put_tagged(&c, "rb/a", 64 * KiB, 1, NULL);
    fill_tagged(c.buf, 64 * KiB, 2);
    assert_int_equal(kvf_store_put(c.st, "rb/a", c.buf, 64 * KiB, NULL),
                     KVF_ERR_EXISTS);
    get_check(&c, "rb/a", 64 * KiB, 1);
    /* the reservation path (same size) and the full one (new sizes) */
    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        put_tagged(&c, "rb/a", sizes[i], 10 + i, &replace);
        get_check(&c, "rb/a", sizes[i], 10 + i);
    }
    put_tagged(&c, "rb/fresh", 4 * KiB, 3, &replace); /* absent: a put */
    get_check(&c, "rb/fresh", 4 * KiB, 3);

    /* a batch: two existing keys and a new one, committed by PUT_END */
    put_tagged(&c, "rb/b", 100, 4, NULL);
    fill_tagged(c.buf, lens[0], 20);
    fill_tagged(c.buf + 100 * KiB, lens[1], 21);
    fill_tagged(c.buf + 200 * KiB, lens[2], 22);
    bufs[0] = c.buf;
    bufs[1] = c.buf + 100 * KiB;
    bufs[2] = c.buf + 200 * KiB;
    assert_int_equal(
        kvf_store_put_batch(c.st, 3, keys, bufs, lens, &replace, sts), KVF_OK);
    for (i = 0; i < 3; i++) {
        assert_int_equal(sts[i], KVF_OK);
    }
    for (i = 0; i < 3; i++) {
        get_check(&c, keys[i], lens[i], 20 + i);
    }
    /* the old objects' space comes back: 400 x 256 KiB through 32 MiB */
    for (i = 0; i < 400; i++) {
        put_tagged(&c, "rb/churn", 256 * KiB, 100 + i, &replace);
    }
    get_check(&c, "rb/churn", 256 * KiB, 499);
    assert_int_equal(kvf_store_exists(c.st, "rb/churn"), KVF_OK);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

typedef struct race {
    const char *master;
    atomic_int stop;
    atomic_long reads, misses, torn, errors, writes;
    int id;
} race_t;

static void *writer(void *arg)
{
    race_t *r = arg;
    kvs_client_t c;
    uint64_t seed = 1000;
    int i;

    if (kvs_client_open(&c, r->master, 256 * KiB) != 0) {
        atomic_fetch_add(&r->errors, 1);
        return NULL;
    }
    for (i = 0; i < 150; i++) {
        /* mostly one size (reservations), at times another (full path) */
        size_t len = (i % 25 == 24) ? 100 * KiB + 3 : 64 * KiB;

        seed = (uint64_t)atomic_fetch_add(&r->writes, 1) + 1000;
        fill_tagged(c.buf, len, seed);
        if (kvf_store_put(c.st, "race/k", c.buf, len, &replace) != KVF_OK) {
            atomic_fetch_add(&r->errors, 1);
        }
    }
    kvs_client_close(&c);
    return NULL;
}

static void read_one(race_t *r, kvs_client_t *c, unsigned char *tmp, int view)
{
    const char *key = "race/k";
    kvf_store_view_lease_h lease;
    kvf_store_view_t v;
    kvf_status_t st;
    size_t got = 0;

    if (!view) {
        st = kvf_store_get(c->st, key, c->buf, c->len, &got, 0);
        if (st == KVF_ERR_NO_KEY || st == KVF_ERR_NOT_READY) {
            atomic_fetch_add(&r->misses, 1);
        } else if (st != KVF_OK) {
            atomic_fetch_add(&r->errors, 1);
        } else if (!tagged_ok(c->buf, got, tmp)) {
            atomic_fetch_add(&r->torn, 1);
        }
        atomic_fetch_add(&r->reads, 1);
        return;
    }
    if (kvf_store_view_get_flags(c->st, 1, &key, KVF_STORE_VIEW_SHARED, &v,
                                 &lease) != KVF_OK) {
        atomic_fetch_add(&r->errors, 1);
        return;
    }
    if (v.status == KVF_ERR_NO_KEY || v.status == KVF_ERR_NOT_READY) {
        atomic_fetch_add(&r->misses, 1);
    } else if (v.status != KVF_OK) {
        atomic_fetch_add(&r->errors, 1);
    } else if (kvf_checksum(v.ptr, (size_t)v.len) != v.checksum ||
               !tagged_ok(v.ptr, (size_t)v.len, tmp)) {
        atomic_fetch_add(&r->torn, 1); /* the old space kept while leased */
    }
    (void)kvf_store_view_release(lease);
    atomic_fetch_add(&r->reads, 1);
}

static void *reader(void *arg)
{
    race_t *r = arg;
    unsigned char *tmp = malloc(256 * KiB);
    kvs_client_t c;
    int view = r->id++ % 2;

    if (tmp == NULL || kvs_client_open(&c, r->master, 256 * KiB) != 0) {
        atomic_fetch_add(&r->errors, 1);
        free(tmp);
        return NULL;
    }
    while (!atomic_load(&r->stop)) {
        read_one(r, &c, tmp, view);
    }
    kvs_client_close(&c);
    free(tmp);
    return NULL;
}

static void test_replace_readers(void **state)
{
    pthread_t w[2], rd[2];
    race_t r = {0};
    kvs_proc_t m, n;
    kvs_client_t c;
    int i;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_node(&n, m.addr, "64M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 64 * KiB), 0);
    put_tagged(&c, "race/k", 64 * KiB, 1, NULL);
    r.master = m.addr;
    for (i = 0; i < 2; i++) {
        assert_int_equal(pthread_create(&rd[i], NULL, reader, &r), 0);
    }
    kvs_sleep_ms(20); /* both readers set up */
    for (i = 0; i < 2; i++) {
        assert_int_equal(pthread_create(&w[i], NULL, writer, &r), 0);
    }
    for (i = 0; i < 2; i++) {
        pthread_join(w[i], NULL);
    }
    atomic_store(&r.stop, 1);
    for (i = 0; i < 2; i++) {
        pthread_join(rd[i], NULL);
    }
    print_message("replace race: %ld writes, %ld reads, %ld misses, "
                  "%ld torn, %ld errors\n",
                  atomic_load(&r.writes), atomic_load(&r.reads),
                  atomic_load(&r.misses), atomic_load(&r.torn),
                  atomic_load(&r.errors));
    assert_int_equal(atomic_load(&r.writes), 300);
    assert_true(atomic_load(&r.reads) > 0);
    assert_int_equal(atomic_load(&r.misses), 0);
    assert_int_equal(atomic_load(&r.torn), 0);
    assert_int_equal(atomic_load(&r.errors), 0);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replace_basic),
        cmocka_unit_test(test_replace_readers),
    };

    kvs_bin();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
