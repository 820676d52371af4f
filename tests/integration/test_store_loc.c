/*
 * Integration test of the client's location cache (store/client/
 * loc.c), with a real master and nodes on 127.0.0.1: a single-key
 * get of a key the handle has seen reads its cached location while the
 * master answers, and keeps those bytes only when the master names that
 * location and the checksum matches.
 * - hits: keys this handle put are read in one round trip (counted as
 *   used), byte for byte, odd sizes included;
 * - stale entries: a key removed and stored again elsewhere by another
 *   client, a key removed (the get misses), a key whose old place now
 *   holds another object: the right bytes or the right status, never
 *   the cached place's bytes;
 * - loc_cache=0 turns it off; a bad size is refused at connect;
 * - under churn (a writer removing and storing keys again while readers
 *   get them through their caches) every get that succeeds returns one
 *   whole version of its key, never a mix; the same with lease reads;
 * - lease_reads=1: a key got within its read lease is read without the
 *   master (its hit counter does not move), byte for byte; another
 *   client's remove or new version is seen once the lease ends, the
 *   handle's own remove at once; a dead node's key still answers.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <kvferry/perf.h>

#include "test_store_harness.h"
#include "core/time.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KiB 1024

/* A value: its seed in the first 8 bytes, then bytes derived from it. */
static void fill_version(unsigned char *buf, size_t len, uint64_t seed)
{
    kvs_fill(buf, len, seed);
    memcpy(buf, &seed, sizeof(seed));
}

/* Is buf one whole value (of any seed)? The seed is returned. */
static int is_whole(const unsigned char *buf, size_t len, unsigned char *tmp,
                    uint64_t *seed_p)
{
    uint64_t seed;

    memcpy(&seed, buf, sizeof(seed));
    fill_version(tmp, len, seed);
    *seed_p = seed;
    return memcmp(buf, tmp, len) == 0;
}

static kvf_store_loc_stats_t stats(kvs_client_t *c)
{
    kvf_store_loc_stats_t s;

    kvf_store_loc_stats(c->st, &s);
    return s;
}

static void get_check(kvs_client_t *c, const char *key, size_t len,
                      uint64_t seed)
{
    size_t got = 0;

    memset(c->buf, 0xee, len);
    assert_int_equal(kvf_store_get(c->st, key, c->buf, c->len / 2, &got, 0),
                     KVF_OK);
    assert_int_equal(got, len);
    fill_version(c->buf + c->len / 2, len, seed);
    assert_memory_equal(c->buf, c->buf + c->len / 2, len);
}

static void put_ok(kvs_client_t *c, const char *key, size_t len, uint64_t seed)
{
    fill_version(c->buf, len, seed);
    assert_int_equal(kvf_store_put(c->st, key, c->buf, len, NULL), KVF_OK);
}

/* After a node died: keys prefix<first..last-1> (seed base + i) read
 * back whole with the right bytes, or fail with a clear status. */
static void get_after_node_death(kvs_client_t *c, const char *prefix, int first,
                                 int last, uint64_t base)
{
    kvf_status_t st;
    char key[32];
    size_t got;
    int i;

    for (i = first; i < last; i++) {
        snprintf(key, sizeof(key), "%s%d", prefix, i);
        st = kvf_store_get(c->st, key, c->buf, c->len / 2, &got, 0);
        if (st == KVF_OK) {
            fill_version(c->buf + c->len / 2, got, base + (uint64_t)i);
            assert_memory_equal(c->buf, c->buf + c->len / 2, got);
        } else {
            assert_true(st == KVF_ERR_NO_KEY || st == KVF_ERR_CONNECT ||
                        st == KVF_ERR_CONN_RESET ||
                        st == KVF_ERR_PEER_UNREACHABLE ||
                        st == KVF_ERR_PEER_CLOSED);
        }
    }
}

static void test_loc_hits_and_stale(void **state)
{
    static const size_t sizes[] = {64 * KiB, 100 * KiB + 3, 4 * KiB + 1};
    kvf_store_loc_stats_t s0, s1;
    kvs_proc_t m, n1, n2;
    kvs_client_t a, b;
    char key[32];
    size_t got;
    int i;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_node(&n1, m.addr, "32M", NULL), 0);
    assert_int_equal(kvs_node(&n2, m.addr, "32M", NULL), 0);
    assert_int_equal(kvs_client_open(&a, m.addr, 512 * KiB), 0);
    assert_int_equal(kvs_client_open(&b, m.addr, 512 * KiB), 0);

    /* hits: every key a put, then a get in one round trip */
    for (i = 0; i < 12; i++) {
        snprintf(key, sizeof(key), "loc/%d", i);
        put_ok(&a, key, sizes[i % 3], (uint64_t)i + 1);
    }
    s0 = stats(&a);
    for (i = 0; i < 12; i++) {
        snprintf(key, sizeof(key), "loc/%d", i);
        get_check(&a, key, sizes[i % 3], (uint64_t)i + 1);
    }
    s1 = stats(&a);
    assert_int_equal(s1.gets - s0.gets, 12);
    assert_int_equal(s1.used - s0.used, 12);
    /* b has never seen them: plain gets, then it knows them too */
    s0 = stats(&b);
    get_check(&b, "loc/0", sizes[0], 1);
    assert_int_equal(stats(&b).gets, s0.gets);
    get_check(&b, "loc/0", sizes[0], 1);
    assert_int_equal(stats(&b).used, s0.used + 1);

    /* stored again elsewhere by b, its old place taken by another
     * object of the same size: a's cached place holds other bytes */
    assert_int_equal(kvf_store_remove(b.st, "loc/0"), KVF_OK);
    put_ok(&b, "other", sizes[0], 500);
    put_ok(&b, "loc/0", sizes[0], 600);
    s0 = stats(&a);
    get_check(&a, "loc/0", sizes[0], 600);
    s1 = stats(&a);
    assert_int_equal(s1.gets, s0.gets + 1);
    assert_int_equal(s1.used, s0.used); /* the master named another place */
    /* and now the new place is cached */
    get_check(&a, "loc/0", sizes[0], 600);
    assert_int_equal(stats(&a).used, s1.used + 1);
    get_check(&a, "other", sizes[0], 500);

    /* removed by b: a's get misses, the entry goes */
    assert_int_equal(kvf_store_remove(b.st, "loc/1"), KVF_OK);
    s0 = stats(&a);
    assert_int_equal(kvf_store_get(a.st, "loc/1", a.buf, a.len, &got, 0),
                     KVF_ERR_NO_KEY);
    s1 = stats(&a);
    assert_int_equal(s1.gets, s0.gets + 1);
    assert_int_equal(s1.used, s0.used);
    assert_int_equal(kvf_store_get(a.st, "loc/1", a.buf, a.len, &got, 0),
                     KVF_ERR_NO_KEY);
    assert_int_equal(stats(&a).gets, s1.gets); /* not cached any more */

    /* removed by a itself: forgotten at once, no read is tried */
    assert_int_equal(kvf_store_remove(a.st, "loc/2"), KVF_OK);
    s0 = stats(&a);
    assert_int_equal(kvf_store_get(a.st, "loc/2", a.buf, a.len, &got, 0),
                     KVF_ERR_NO_KEY);
    assert_int_equal(stats(&a).gets, s0.gets);

    /* a buffer too small for the cached size: a plain get, which says so */
    s0 = stats(&a);
    assert_int_equal(kvf_store_get(a.st, "loc/4", a.buf, 1024, &got, 0),
                     KVF_ERR_NO_RESOURCE);
    assert_int_equal(stats(&a).gets, s0.gets);

    /* the node holding a cached place dies: the get still answers */
    kvs_stop(&n1, 9);
    get_after_node_death(&a, "loc/", 3, 12, 1);
    kvs_client_close(&a);
    kvs_client_close(&b);
    kvs_stop(&n2, 0);
    kvs_stop(&m, 0);
}

static void test_loc_config(void **state)
{
    kvf_store_params_t p = {0};
    kvs_proc_t m, n;
    kvs_client_t a;
    kvf_store_h st;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_node(&n, m.addr, "16M", NULL), 0);
    setenv("KVF_LOC_CACHE", "0", 1);
    assert_int_equal(kvs_client_open(&a, m.addr, 256 * KiB), 0);
    put_ok(&a, "off", 64 * KiB, 7);
    get_check(&a, "off", 64 * KiB, 7);
    get_check(&a, "off", 64 * KiB, 7);
    assert_int_equal(stats(&a).gets, 0);
    kvs_client_close(&a);
    setenv("KVF_LOC_CACHE", "1000", 1); /* not a power of two */
    p.field_mask = KVF_STORE_PARAM_MASTER;
    p.master = m.addr;
    assert_int_equal(kvf_store_connect(&p, &st), KVF_ERR_INVALID_PARAM);
    unsetenv("KVF_LOC_CACHE");
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

#define LEASE_MS 600

static const char *const lease_args[] = {"--lease", "600ms", NULL};

static void test_loc_lease_reads(void **state)
{
    kvf_store_loc_stats_t s0, s1;
    kvs_proc_t m, n1, n2;
    kvs_client_t a, b;
    long hits;
    char key[32];
    size_t got;
    int i;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, lease_args), 0);
    assert_int_equal(kvs_node(&n1, m.addr, "16M", NULL), 0);
    assert_int_equal(kvs_node(&n2, m.addr, "16M", NULL), 0);
    setenv("KVF_LEASE_READS", "1", 1);
    assert_int_equal(kvs_client_open(&a, m.addr, 512 * KiB), 0);
    unsetenv("KVF_LEASE_READS");
    assert_int_equal(kvs_client_open(&b, m.addr, 512 * KiB), 0);

    /* a put teaches no lease: the first get asks the master (and is
     * granted one); the next ones within it do not */
    put_ok(&a, "lr/0", 64 * KiB + 5, 1);
    s0 = stats(&a);
    get_check(&a, "lr/0", 64 * KiB + 5, 1);
    assert_int_equal(stats(&a).lease, s0.lease);
    hits = kvs_metric(m.http, "hits_total");
    for (i = 0; i < 5; i++) {
        get_check(&a, "lr/0", 64 * KiB + 5, 1);
    }
    s1 = stats(&a);
    assert_int_equal(s1.lease - s0.lease, 5);
    assert_int_equal(kvs_metric(m.http, "hits_total"), hits);

    /* b (lease reads off) always asks the master */
    get_check(&b, "lr/0", 64 * KiB + 5, 1);
    get_check(&b, "lr/0", 64 * KiB + 5, 1);
    assert_int_equal(stats(&b).lease, 0);
    assert_int_equal(kvs_metric(m.http, "hits_total"), hits + 2);

    /* b removes it and stores a new version: within a's lease a still
     * reads the old bytes (the space is kept until the lease ends);
     * after it, the master's answer: the new version */
    assert_int_equal(kvf_store_remove(b.st, "lr/0"), KVF_OK);
    put_ok(&b, "lr/0", 64 * KiB + 5, 2);
    get_check(&a, "lr/0", 64 * KiB + 5, 1);
    kvs_sleep_ms(LEASE_MS + 50);
    s0 = stats(&a);
    get_check(&a, "lr/0", 64 * KiB + 5, 2);
    assert_int_equal(stats(&a).lease, s0.lease);
    get_check(&a, "lr/0", 64 * KiB + 5, 2);
    assert_int_equal(stats(&a).lease, s0.lease + 1);

    /* removed by b: a misses once its lease has ended */
    put_ok(&b, "lr/1", 8 * KiB, 3);
    get_check(&a, "lr/1", 8 * KiB, 3);
    assert_int_equal(kvf_store_remove(b.st, "lr/1"), KVF_OK);
    kvs_sleep_ms(LEASE_MS + 50);
    assert_int_equal(kvf_store_get(a.st, "lr/1", a.buf, a.len, &got, 0),
                     KVF_ERR_NO_KEY);

    /* removed by a itself: at once */
    get_check(&a, "lr/0", 64 * KiB + 5, 2);
    assert_int_equal(kvf_store_remove(a.st, "lr/0"), KVF_OK);
    assert_int_equal(kvf_store_get(a.st, "lr/0", a.buf, a.len, &got, 0),
                     KVF_ERR_NO_KEY);

    /* keys on both nodes, leased; one node dies: a's gets answer the
     * right bytes or a clear status, never another's bytes */
    for (i = 0; i < 8; i++) {
        snprintf(key, sizeof(key), "lr/n%d", i);
        put_ok(&b, key, 32 * KiB, 10 + (uint64_t)i);
        get_check(&a, key, 32 * KiB, 10 + (uint64_t)i);
    }
    kvs_stop(&n1, 9);
    get_after_node_death(&a, "lr/n", 0, 8, 10);
    kvs_client_close(&a);
    kvs_client_close(&b);
    kvs_stop(&n2, 0);
    kvs_stop(&m, 0);
}

#define CHURN_KEYS    6
#define CHURN_LEN     (48 * KiB)
#define CHURN_READERS 3

typedef struct churn {
    const char *master;
    uint64_t stop_ns;
    int done;
    long ok, bad, versions_seen;
} churn_t;

static void *churn_reader(void *arg)
{
    churn_t *ch = arg;
    unsigned char *tmp = malloc(CHURN_LEN);
    kvs_client_t c;
    uint64_t seed;
    char key[32];
    size_t got;
    long i = 0;

    if (tmp == NULL || kvs_client_open(&c, ch->master, CHURN_LEN) != 0) {
        __atomic_add_fetch(&ch->bad, 1000, __ATOMIC_RELAXED);
        free(tmp);
        return NULL;
    }
    while (!__atomic_load_n(&ch->done, __ATOMIC_ACQUIRE)) {
        kvf_status_t st;

        snprintf(key, sizeof(key), "churn/%ld", i++ % CHURN_KEYS);
        st = kvf_store_get(c.st, key, c.buf, c.len, &got, 0);
        if (st == KVF_OK) {
            if (got != CHURN_LEN || !is_whole(c.buf, got, tmp, &seed) ||
                seed % 100 != (uint64_t)((i - 1) % CHURN_KEYS)) {
                __atomic_add_fetch(&ch->bad, 1, __ATOMIC_RELAXED);
            } else {
                __atomic_add_fetch(&ch->ok, 1, __ATOMIC_RELAXED);
            }
        } else if (st != KVF_ERR_NO_KEY && st != KVF_ERR_NOT_READY &&
                   st != KVF_ERR_BUSY) {
            __atomic_add_fetch(&ch->bad, 1, __ATOMIC_RELAXED);
        }
    }
    kvs_client_close(&c);
    free(tmp);
    return NULL;
}

static void loc_churn(int lease_reads)
{
    pthread_t th[CHURN_READERS];
    kvf_store_loc_stats_t s;
    kvs_proc_t m, n1, n2;
    kvs_client_t w;
    churn_t ch = {0};
    char key[32];
    uint64_t v;
    int i;

    assert_int_equal(kvs_master(&m, 0, lease_reads ? lease_args : NULL), 0);
    assert_int_equal(kvs_node(&n1, m.addr, "8M", NULL), 0);
    assert_int_equal(kvs_node(&n2, m.addr, "8M", NULL), 0);
    assert_int_equal(kvs_client_open(&w, m.addr, CHURN_LEN), 0);
    if (lease_reads) { /* the readers' handles */
        setenv("KVF_LEASE_READS", "1", 1);
    }
    for (i = 0; i < CHURN_KEYS; i++) {
        snprintf(key, sizeof(key), "churn/%d", i);
        put_ok(&w, key, CHURN_LEN, (uint64_t)i);
    }
    ch.master = m.addr;
    for (i = 0; i < CHURN_READERS; i++) {
        assert_int_equal(pthread_create(&th[i], NULL, churn_reader, &ch), 0);
    }
    /* versions: seed = 100 * v + key, so a reader can tell the key */
    for (v = 1; v <= 300; v++) {
        int k = (int)(v % CHURN_KEYS);
        kvf_status_t st;

        snprintf(key, sizeof(key), "churn/%d", k);
        st = kvf_store_remove(w.st, key);
        assert_true(st == KVF_OK || st == KVF_ERR_NO_KEY);
        fill_version(w.buf, CHURN_LEN, 100 * v + (uint64_t)k);
        st = kvf_store_put(w.st, key, w.buf, CHURN_LEN, NULL);
        assert_true(st == KVF_OK || st == KVF_ERR_NO_SPACE);
    }
    /* the readers go on over the last versions until one got a whole
     * value (at most 5 s): a fast writer can end its churn first */
    for (i = 0; i < 500 && __atomic_load_n(&ch.ok, __ATOMIC_RELAXED) == 0;
         i++) {
        usleep(10000);
    }
    __atomic_store_n(&ch.done, 1, __ATOMIC_RELEASE);
    for (i = 0; i < CHURN_READERS; i++) {
        pthread_join(th[i], NULL);
    }
    unsetenv("KVF_LEASE_READS");
    print_message("churn (lease reads %s): %ld whole gets, %ld bad\n",
                  lease_reads ? "on" : "off", ch.ok, ch.bad);
    assert_int_equal(ch.bad, 0);
    assert_true(ch.ok > 0);
    kvf_store_loc_stats(w.st, &s);
    assert_int_equal(s.gets, 0); /* the writer never got */
    kvs_client_close(&w);
    kvs_stop(&n1, 0);
    kvs_stop(&n2, 0);
    kvs_stop(&m, 0);
}

static void test_loc_churn(void **state)
{
    (void)state;
    loc_churn(0);
}

static void test_loc_churn_lease_reads(void **state)
{
    (void)state;
    loc_churn(1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loc_hits_and_stale),
        cmocka_unit_test(test_loc_config),
        cmocka_unit_test(test_loc_churn),
        cmocka_unit_test(test_loc_lease_reads),
        cmocka_unit_test(test_loc_churn_lease_reads),
    };

    kvs_bin();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
