/*
 * Integration test of the store's put views (kvf_store_view_put, store/
 * client/put_view.c, over the shm transport's WRITE view leases), with
 * a real master and nodes on 127.0.0.1:
 * - objects of various sizes (an empty one too) on two nodes are
 *   written in place and committed, checksums computed by the commit:
 *   a plain get (which verifies the checksum) returns them byte for
 *   byte; before the commit nobody finds them (NOT_READY);
 * - four threads putting views on one handle, every object read back;
 * - the caller's checksums, keep[i] 0 aborting that key; a wrong
 *   checksum makes every later get fail with KVF_ERR_CHECKSUM;
 * - an abort leaves nothing: no object, no pending put, the space back;
 * - a stored key is KVF_ERR_EXISTS (KVF_STORE_REPLACE replaces it);
 * - a client reaching the node over tcp only, or two replicas (asked, or
 *   the master's default), gets KVF_ERR_UNSUPPORTED with nothing left
 *   allocated, and the ordinary put of the same key works;
 * - a commit after the node's write lease or the master's put deadline
 *   ended fails with KVF_ERR_TIMEOUT and leaves no object;
 * - a node stopping while a put view is open: the commit fails with
 *   KVF_ERR_CONN_RESET, nothing is committed, the mapping is unmapped
 *   (the unmap hook told) once the handle is gone;
 * - a disconnect with put views open aborts them: the master's pending
 *   puts and used bytes go back, and the node holds no lease (its stop
 *   does not wait);
 * - bad input: clear statuses;
 * - kvf_store_view_maps: the mappings of every node's pool, in which
 *   later views and put views lie.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_store_harness.h"
#include "core/time.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KiB 1024
#define MiB (1024 * 1024)

static const size_t sizes[] = {1, 4 * KiB, 64 * KiB + 3, 1 * MiB, 0,
                               3 * MiB + 5};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define NKEYS  (2 * NSIZES)

/* A master and two nodes of 32 MiB (extra args for the master). */
typedef struct cluster {
    kvs_proc_t m, n1, n2;
    kvs_client_t c;
} cluster_t;

static void cluster_start(cluster_t *t, int nodes)
{
    assert_int_equal(kvs_master(&t->m, 0, NULL), 0);
    assert_int_equal(kvs_node(&t->n1, t->m.addr, "32M", NULL), 0);
    if (nodes > 1) {
        assert_int_equal(kvs_node(&t->n2, t->m.addr, "32M", NULL), 0);
    }
    assert_int_equal(kvs_client_open(&t->c, t->m.addr, 4 * MiB), 0);
}

static void cluster_stop(cluster_t *t, int nodes)
{
    kvs_client_close(&t->c);
    kvs_stop(&t->n1, 0);
    if (nodes > 1) {
        kvs_stop(&t->n2, 0);
    }
    kvs_stop(&t->m, 0);
}

static void names_make(char (*names)[32], const char **keys, size_t n,
                       const char *prefix)
{
    size_t i;

    for (i = 0; i < n; i++) {
        snprintf(names[i], 32, "%s/%zu", prefix, i);
        keys[i] = names[i];
    }
}

/* v is writable in place: inside its mapping (or empty). */
static void check_put_view(const kvf_store_view_t *v, size_t len)
{
    const unsigned char *p = v->ptr, *base = v->map_base;

    assert_int_equal(v->status, KVF_OK);
    assert_int_equal(v->len, len);
    if (len == 0) {
        assert_null(p);
        return;
    }
    assert_non_null(p);
    assert_non_null(base);
    assert_true(p >= base && p + len <= base + v->map_len);
}

/* key holds the bytes of seed (a plain get: checksum verified). */
static void check_get(kvs_client_t *c, const char *key, size_t len,
                      uint64_t seed, unsigned char *tmp)
{
    size_t got = 0;

    assert_int_equal(kvf_store_get(c->st, key, c->buf, c->len, &got, 0),
                     KVF_OK);
    assert_int_equal(got, len);
    kvs_fill(tmp, len, seed);
    assert_memory_equal(c->buf, tmp, len);
}

static long metric(const cluster_t *t, const char *name)
{
    return kvs_metric(t->m.http, name);
}

static void test_put_view_bytes(void **state)
{
    kvf_store_view_t v[NKEYS];
    kvf_status_t s[NKEYS];
    size_t lens[NKEYS], i, got;
    const char *keys[NKEYS];
    char names[NKEYS][32];
    kvf_store_put_view_h pv;
    unsigned char *tmp = malloc(4 * MiB);
    kvf_store_view_lease_h lease;
    kvf_store_view_t rv;
    cluster_t t;
    unsigned left;

    (void)state;
    assert_non_null(tmp);
    cluster_start(&t, 2);
    names_make(names, keys, NKEYS, "pv");
    for (i = 0; i < NKEYS; i++) {
        lens[i] = sizes[i % NSIZES];
    }
    assert_int_equal(
        kvf_store_view_put(t.c.st, NKEYS, keys, lens, NULL, v, &pv), KVF_OK);
    left = kvf_store_view_put_left_ms(pv);
    assert_true(left > 0 && left <= 5000); /* the node's shm lease */
    for (i = 0; i < NKEYS; i++) {
        check_put_view(&v[i], lens[i]);
        if (lens[i] > 0) {
            kvs_fill((void *)(uintptr_t)v[i].ptr, lens[i], 500 + i);
        }
    }
    /* not committed: not found by anyone */
    assert_int_equal(kvf_store_exists(t.c.st, keys[1]), KVF_ERR_NOT_READY);
    assert_int_equal(kvf_store_get(t.c.st, keys[1], t.c.buf, t.c.len, &got, 0),
                     KVF_ERR_NOT_READY);
    assert_int_equal(kvf_store_view_get(t.c.st, 1, &keys[1], &rv, &lease),
                     KVF_OK);
    assert_int_equal(rv.status, KVF_ERR_NOT_READY);
    assert_int_equal(kvf_store_view_release(lease), KVF_OK);
    assert_int_equal(metric(&t, "pending_puts"), NKEYS);

    assert_int_equal(kvf_store_view_put_commit(pv, NULL, NULL, s), KVF_OK);
    for (i = 0; i < NKEYS; i++) {
        assert_int_equal(s[i], KVF_OK);
        check_get(&t.c, keys[i], lens[i], 500 + i, tmp);
    }
    assert_int_equal(metric(&t, "pending_puts"), 0);
    /* a view of what was written in place: the checksum recorded */
    assert_int_equal(kvf_store_view_get(t.c.st, 1, &keys[3], &rv, &lease),
                     KVF_OK);
    assert_int_equal(rv.status, KVF_OK);
    kvs_fill(tmp, lens[3], 503);
    assert_true(rv.checksum == kvf_checksum(tmp, lens[3]));
    assert_int_equal(kvf_store_view_release(lease), KVF_OK);

    /* many put views in a row reuse the nodes' view connections */
    for (i = 0; i < 40; i++) {
        char key[32];
        const char *k1 = key;
        size_t l1 = 8 * KiB;

        snprintf(key, sizeof(key), "pv/loop/%zu", i);
        assert_int_equal(kvf_store_view_put(t.c.st, 1, &k1, &l1, NULL, v, &pv),
                         KVF_OK);
        check_put_view(&v[0], l1);
        kvs_fill((void *)(uintptr_t)v[0].ptr, l1, 900 + i);
        assert_int_equal(kvf_store_view_put_commit(pv, NULL, NULL, NULL),
                         KVF_OK);
        check_get(&t.c, key, l1, 900 + i, tmp);
    }
    cluster_stop(&t, 2);
    free(tmp);
}

/* Threads sharing one handle: put views in a loop, each object read
 * back byte for byte. */
typedef struct thr_arg {
    kvs_client_t *c;
    unsigned id;
    int errors;
} thr_arg_t;

static void *thr_main(void *p)
{
    thr_arg_t *a = p;
    unsigned char *tmp = malloc(64 * KiB), *buf = malloc(64 * KiB);
    char names[8][48];
    const char *keys[8];
    size_t lens[8], i, got;
    kvf_store_view_t v[8];
    kvf_status_t s[8];
    kvf_store_put_view_h pv;
    kvf_region_h r = NULL;
    int it;

    if (buf == NULL || tmp == NULL ||
        kvf_engine_reg(kvf_store_engine(a->c->st), buf, 64 * KiB,
                       KVF_MEM_HOST, 0, &r) != KVF_OK) {
        a->errors++;
    }
    for (it = 0; it < 20 && r != NULL; it++) {
        for (i = 0; i < 8; i++) {
            snprintf(names[i], sizeof(names[i]), "thr/%u/%d/%zu", a->id, it, i);
            keys[i] = names[i];
            lens[i] = 1000 + 7000 * i;
        }
        if (kvf_store_view_put(a->c->st, 8, keys, lens, NULL, v, &pv) !=
            KVF_OK) {
            a->errors++;
            continue;
        }
        for (i = 0; i < 8; i++) {
            a->errors += v[i].status != KVF_OK;
            if (v[i].status == KVF_OK) {
                kvs_fill((void *)(uintptr_t)v[i].ptr, lens[i],
                         a->id * 1000 + (unsigned)it * 10 + i);
            }
        }
        a->errors += kvf_store_view_put_commit(pv, NULL, NULL, s) != KVF_OK;
        for (i = 0; i < 8; i++) {
            kvs_fill(tmp, lens[i], a->id * 1000 + (unsigned)it * 10 + i);
            a->errors += kvf_store_get(a->c->st, keys[i], buf, 64 * KiB, &got,
                                       0) != KVF_OK ||
                         got != lens[i] || memcmp(buf, tmp, got) != 0;
        }
    }
    if (r != NULL) {
        kvf_engine_dereg(kvf_store_engine(a->c->st), r);
    }
    free(tmp);
    free(buf);
    return NULL;
}

static void test_put_view_threads(void **state)
{
    thr_arg_t args[4];
    pthread_t th[4];
    cluster_t t;
    unsigned i;

    (void)state;
    cluster_start(&t, 2);
    for (i = 0; i < 4; i++) {
        args[i] = (thr_arg_t){.c = &t.c, .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, thr_main, &args[i]), 0);
    }
    for (i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].errors, 0);
    }
    assert_int_equal(metric(&t, "pending_puts"), 0);
    assert_int_equal(metric(&t, "objects"), 4 * 20 * 8);
    cluster_stop(&t, 2);
}

static void test_put_view_sums_keep(void **state)
{
    const char *keys[4] = {"sum/a", "sum/b", "sum/c", "sum/d"};
    size_t lens[4] = {64 * KiB, 100, 3 * KiB, 1 * MiB}, i, got;
    int keep[4] = {1, 0, 1, 1};
    uint64_t sums[4];
    kvf_store_view_t v[4];
    kvf_status_t s[4];
    kvf_store_put_view_h pv;
    unsigned char *tmp = malloc(4 * MiB);
    cluster_t t;

    (void)state;
    assert_non_null(tmp);
    cluster_start(&t, 1);
    assert_int_equal(kvf_store_view_put(t.c.st, 4, keys, lens, NULL, v, &pv),
                     KVF_OK);
    for (i = 0; i < 4; i++) {
        check_put_view(&v[i], lens[i]);
        kvs_fill(tmp, lens[i], 40 + i);
        memcpy((void *)(uintptr_t)v[i].ptr, tmp, lens[i]);
        sums[i] = kvf_checksum(tmp, lens[i]);
    }
    sums[3] ^= 1; /* a wrong checksum: never wrong bytes later */
    assert_int_equal(kvf_store_view_put_commit(pv, keep, sums, s), KVF_OK);
    assert_int_equal(s[0], KVF_OK);
    assert_int_equal(s[1], KVF_ERR_CANCELED);
    assert_int_equal(s[2], KVF_OK);
    assert_int_equal(s[3], KVF_OK);
    check_get(&t.c, keys[0], lens[0], 40, tmp);
    check_get(&t.c, keys[2], lens[2], 42, tmp);
    assert_int_equal(kvf_store_exists(t.c.st, keys[1]), KVF_ERR_NO_KEY);
    assert_int_equal(kvf_store_get(t.c.st, keys[3], t.c.buf, t.c.len, &got, 0),
                     KVF_ERR_CHECKSUM);
    assert_int_equal(metric(&t, "pending_puts"), 0);
    /* the aborted key is free again: an ordinary put stores it */
    kvs_fill(t.c.buf, lens[1], 41);
    assert_int_equal(kvf_store_put(t.c.st, keys[1], t.c.buf, lens[1], NULL),
                     KVF_OK);
    check_get(&t.c, keys[1], lens[1], 41, tmp);
    cluster_stop(&t, 1);
    free(tmp);
}

static void test_put_view_abort_exists(void **state)
{
    const char *keys[3] = {"ab/stored", "ab/new", "ab/new2"};
    size_t lens[3] = {4 * KiB, 256 * KiB, 8 * KiB};
    kvf_store_put_opts_t o = {.replicas = 1, .flags = KVF_STORE_REPLACE};
    kvf_store_view_t v[3];
    kvf_status_t s[3];
    kvf_store_put_view_h pv;
    unsigned char *tmp = malloc(4 * MiB);
    long used0;
    cluster_t t;

    (void)state;
    assert_non_null(tmp);
    cluster_start(&t, 1);
    kvs_fill(t.c.buf, lens[0], 1);
    assert_int_equal(kvf_store_put(t.c.st, keys[0], t.c.buf, lens[0], NULL),
                     KVF_OK);
    used0 = metric(&t, "used_bytes");
    assert_true(used0 > 0);
    assert_int_equal(kvf_store_view_put(t.c.st, 3, keys, lens, NULL, v, &pv),
                     KVF_OK);
    assert_int_equal(v[0].status, KVF_ERR_EXISTS);
    assert_null(v[0].ptr);
    check_put_view(&v[1], lens[1]);
    check_put_view(&v[2], lens[2]);
    assert_true(metric(&t, "used_bytes") > used0);
    kvs_fill((void *)(uintptr_t)v[1].ptr, lens[1], 2);
    /* the abort leaves nothing: no object, no pending put, no space */
    kvf_store_view_put_abort(pv);
    assert_int_equal(kvf_store_exists(t.c.st, keys[1]), KVF_ERR_NO_KEY);
    assert_int_equal(kvf_store_exists(t.c.st, keys[2]), KVF_ERR_NO_KEY);
    assert_int_equal(metric(&t, "pending_puts"), 0);
    assert_int_equal(metric(&t, "used_bytes"), used0);
    check_get(&t.c, keys[0], lens[0], 1, tmp);

    /* a commit reports the stored key's EXISTS and commits the others */
    assert_int_equal(kvf_store_view_put(t.c.st, 3, keys, lens, NULL, v, &pv),
                     KVF_OK);
    kvs_fill((void *)(uintptr_t)v[1].ptr, lens[1], 3);
    kvs_fill((void *)(uintptr_t)v[2].ptr, lens[2], 4);
    assert_int_equal(kvf_store_view_put_commit(pv, NULL, NULL, s), KVF_OK);
    assert_int_equal(s[0], KVF_ERR_EXISTS);
    assert_int_equal(s[1], KVF_OK);
    assert_int_equal(s[2], KVF_OK);
    check_get(&t.c, keys[1], lens[1], 3, tmp);

    /* KVF_STORE_REPLACE: the stored key is replaced at the commit */
    assert_int_equal(kvf_store_view_put(t.c.st, 1, keys, lens, &o, v, &pv),
                     KVF_OK);
    check_put_view(&v[0], lens[0]);
    kvs_fill((void *)(uintptr_t)v[0].ptr, lens[0], 5);
    check_get(&t.c, keys[0], lens[0], 1, tmp); /* the old one until then */
    assert_int_equal(kvf_store_view_put_commit(pv, NULL, NULL, s), KVF_OK);
    check_get(&t.c, keys[0], lens[0], 5, tmp);
    cluster_stop(&t, 1);
    free(tmp);
}

static void test_put_view_unsupported(void **state)
{
    const char *keys[2] = {"uns/a", "uns/b"};
    size_t lens[2] = {64 * KiB, 4 * KiB};
    kvf_store_put_opts_t two = {.replicas = 2};
    kvf_store_params_t p = {0};
    const void *bufs[2];
    kvf_store_view_t v[2];
    kvf_status_t s[2];
    kvf_store_put_view_h pv;
    unsigned char *tmp = malloc(4 * MiB);
    kvf_region_h r;
    kvf_store_h st;
    cluster_t t;

    (void)state;
    assert_non_null(tmp);
    cluster_start(&t, 2);
    /* over tcp: nothing can be written in place, nothing stays allocated */
    p.field_mask = KVF_STORE_PARAM_MASTER | KVF_STORE_PARAM_TRANSPORTS;
    p.master = t.m.addr;
    p.transports = "tcp";
    assert_int_equal(kvf_store_connect(&p, &st), KVF_OK);
    assert_int_equal(kvf_store_view_put(st, 2, keys, lens, NULL, v, &pv),
                     KVF_OK);
    assert_int_equal(v[0].status, KVF_ERR_UNSUPPORTED);
    assert_int_equal(v[1].status, KVF_ERR_UNSUPPORTED);
    assert_null(v[0].ptr);
    assert_int_equal(metric(&t, "pending_puts"), 0);
    assert_int_equal(metric(&t, "used_bytes"), 0);
    assert_int_equal(kvf_store_view_put_commit(pv, NULL, NULL, s), KVF_OK);
    assert_int_equal(s[0], KVF_ERR_UNSUPPORTED);
    /* the fallback: an ordinary put of the same keys */
    assert_int_equal(kvf_engine_reg(kvf_store_engine(st), tmp, 4 * MiB,
                                    KVF_MEM_HOST, 0, &r),
                     KVF_OK);
    kvs_fill(tmp, lens[0], 60);
    bufs[0] = tmp;
    bufs[1] = tmp;
    assert_int_equal(kvf_store_put_batch(st, 2, keys, bufs, lens, NULL, s),
                     KVF_OK);
    kvf_engine_dereg(kvf_store_engine(st), r);
    kvf_store_disconnect(st);
    check_get(&t.c, keys[0], lens[0], 60, tmp);

    /* two replicas asked: refused before any allocation */
    keys[0] = "uns/c";
    keys[1] = "uns/d";
    assert_int_equal(kvf_store_view_put(t.c.st, 2, keys, lens, &two, v, &pv),
                     KVF_OK);
    assert_int_equal(v[0].status, KVF_ERR_UNSUPPORTED);
    assert_int_equal(v[1].status, KVF_ERR_UNSUPPORTED);
    assert_int_equal(metric(&t, "pending_puts"), 0);
    kvf_store_view_put_abort(pv);
    assert_int_equal(kvf_store_exists(t.c.st, keys[0]), KVF_ERR_NO_KEY);
    cluster_stop(&t, 2);

    /* the master's default of two replicas: allocated, then aborted */
    setenv("KVF_REPLICAS", "2", 1);
    assert_int_equal(kvs_master(&t.m, 0, NULL), 0);
    unsetenv("KVF_REPLICAS");
    assert_int_equal(kvs_node(&t.n1, t.m.addr, "32M", NULL), 0);
    assert_int_equal(kvs_node(&t.n2, t.m.addr, "32M", NULL), 0);
    assert_int_equal(kvs_client_open(&t.c, t.m.addr, 4 * MiB), 0);
    assert_int_equal(kvf_store_view_put(t.c.st, 2, keys, lens, NULL, v, &pv),
                     KVF_OK);
    assert_int_equal(v[0].status, KVF_ERR_UNSUPPORTED);
    assert_int_equal(metric(&t, "pending_puts"), 0);
    assert_int_equal(metric(&t, "used_bytes"), 0);
    assert_int_equal(kvf_store_view_put_commit(pv, NULL, NULL, s), KVF_OK);
    kvs_fill(t.c.buf, lens[0], 61);
    assert_int_equal(kvf_store_put(t.c.st, keys[0], t.c.buf, lens[0], NULL),
                     KVF_OK);
    check_get(&t.c, keys[0], lens[0], 61, tmp);
    cluster_stop(&t, 2);
    free(tmp);
}

/* A put view held past its time: the commit fails, no object is left. */
static void expire_once(cluster_t *t, const char *key, unsigned max_ms)
{
    size_t len = 16 * KiB;
    kvf_store_put_view_h pv;
    kvf_store_view_t v;
    kvf_status_t s;
    unsigned left;

    assert_int_equal(kvf_store_view_put(t->c.st, 1, &key, &len, NULL, &v, &pv),
                     KVF_OK);
    check_put_view(&v, len);
    left = kvf_store_view_put_left_ms(pv);
    assert_true(left > 0 && left <= max_ms);
    kvs_fill((void *)(uintptr_t)v.ptr, len, 70);
    kvs_sleep_ms((int)max_ms + 200);
    assert_int_equal(kvf_store_view_put_left_ms(pv), 0);
    assert_int_equal(kvf_store_view_put_commit(pv, NULL, NULL, &s),
                     KVF_ERR_TIMEOUT);
    assert_int_equal(s, KVF_ERR_TIMEOUT);
    assert_int_equal(kvf_store_exists(t->c.st, key), KVF_ERR_NO_KEY);
    assert_int_equal(metric(t, "pending_puts"), 0);
}

static void test_put_view_expired(void **state)
{
    cluster_t t;

    (void)state;
    /* the node's write lease ends first (its engine's timeout) */
    setenv("KVF_STORE_TIMEOUT_MS", "600", 1);
    assert_int_equal(kvs_master(&t.m, 0, NULL), 0);
    assert_int_equal(kvs_node(&t.n1, t.m.addr, "32M", NULL), 0);
    unsetenv("KVF_STORE_TIMEOUT_MS");
    assert_int_equal(kvs_client_open(&t.c, t.m.addr, 4 * MiB), 0);
    expire_once(&t, "exp/node", 600);
    cluster_stop(&t, 1);

    /* the master's put deadline ends first */
    setenv("KVF_PUT_TIMEOUT_MS", "700", 1);
    assert_int_equal(kvs_master(&t.m, 0, NULL), 0);
    assert_int_equal(kvs_node(&t.n1, t.m.addr, "32M", NULL), 0);
    assert_int_equal(kvs_client_open(&t.c, t.m.addr, 4 * MiB), 0);
    expire_once(&t, "exp/master", 700);
    unsetenv("KVF_PUT_TIMEOUT_MS");
    cluster_stop(&t, 1);
}

/* The unmap hook: records the mappings unmapped. */
static const void *unmapped[64];
static unsigned nunmapped;

static void on_unmap(void *arg, const void *base, uint64_t len)
{
    (void)arg;
    (void)len;
    if (nunmapped < 64) {
        unmapped[__atomic_fetch_add(&nunmapped, 1, __ATOMIC_RELAXED)] = base;
    }
}

static int was_unmapped(const void *base)
{
    unsigned i, n = __atomic_load_n(&nunmapped, __ATOMIC_RELAXED);

    for (i = 0; i < n; i++) {
        if (unmapped[i] == base) {
            return 1;
        }
    }
    return 0;
}

static void test_put_view_node_stop(void **state)
{
    const char *key = "stop/a";
    size_t len = 64 * KiB;
    kvf_store_put_view_h pv;
    kvf_store_view_t v;
    kvf_status_t s;
    uint64_t t0, held_ms;
    cluster_t t;
    int i;

    (void)state;
    kvf_store_view_unmap_hook(on_unmap, NULL);
    setenv("KVF_LEASE_BREAK_MS", "1500", 1);
    assert_int_equal(kvs_master(&t.m, 0, NULL), 0);
    assert_int_equal(kvs_node(&t.n1, t.m.addr, "32M", NULL), 0);
    unsetenv("KVF_LEASE_BREAK_MS");
    assert_int_equal(kvs_client_open(&t.c, t.m.addr, 64 * KiB), 0);
    assert_int_equal(kvf_store_view_put(t.c.st, 1, &key, &len, NULL, &v, &pv),
                     KVF_OK);
    check_put_view(&v, len);
    kvs_fill((void *)(uintptr_t)v.ptr, len, 80);
    /* the write lease keeps the stop waiting (lease_break_ms), then the
     * node breaks it */
    t0 = kvf_time_ms();
    kvs_stop(&t.n1, 0);
    held_ms = kvf_time_ms() - t0;
    assert_true(held_ms >= 1300 && held_ms < 5000);
    /* the mapping stays writable while the put view is open */
    kvs_fill((void *)(uintptr_t)v.ptr, len, 81);
    assert_false(was_unmapped(v.map_base));
    assert_int_equal(kvf_store_view_put_commit(pv, NULL, NULL, &s),
                     KVF_ERR_CONN_RESET);
    assert_int_equal(s, KVF_ERR_CONN_RESET);
    for (i = 0; i < 50 && !was_unmapped(v.map_base); i++) {
        kvs_sleep_ms(100);
    }
    assert_true(was_unmapped(v.map_base));
    assert_int_equal(kvf_store_exists(t.c.st, key), KVF_ERR_NO_KEY);
    kvf_store_view_unmap_hook(NULL, NULL);
    kvs_client_close(&t.c);
    kvs_stop(&t.m, 0);
}

static void test_put_view_disconnect(void **state)
{
    const char *keys[3] = {"dis/a", "dis/b", "dis/c"};
    size_t lens[3] = {1 * MiB, 4 * KiB, 200 * KiB};
    kvf_store_put_view_h pv, pv2;
    kvf_store_view_t v[3];
    kvs_client_t c2;
    uint64_t t0;
    cluster_t t;

    (void)state;
    setenv("KVF_LEASE_BREAK_MS", "2000", 1);
    assert_int_equal(kvs_master(&t.m, 0, NULL), 0);
    assert_int_equal(kvs_node(&t.n1, t.m.addr, "32M", NULL), 0);
    unsetenv("KVF_LEASE_BREAK_MS");
    assert_int_equal(kvs_client_open(&t.c, t.m.addr, 64 * KiB), 0);
    assert_int_equal(kvs_client_open(&c2, t.m.addr, 64 * KiB), 0);
    assert_int_equal(kvf_store_view_put(c2.st, 2, keys, lens, NULL, v, &pv),
                     KVF_OK);
    assert_int_equal(kvf_store_view_put(c2.st, 1, &keys[2], &lens[2], NULL, v,
                                        &pv2),
                     KVF_OK);
    kvs_fill((void *)(uintptr_t)v[0].ptr, lens[2], 90);
    assert_int_equal(metric(&t, "pending_puts"), 3);
    assert_true(metric(&t, "used_bytes") >= (long)(lens[0] + lens[1]));
    /* the disconnect aborts both (an error logged) */
    kvs_client_close(&c2);
    assert_int_equal(metric(&t, "pending_puts"), 0);
    assert_int_equal(metric(&t, "used_bytes"), 0);
    assert_int_equal(metric(&t, "objects"), 0);
    assert_int_equal(kvf_store_exists(t.c.st, keys[0]), KVF_ERR_NO_KEY);
    /* and the node holds no lease: its stop does not wait for one */
    t0 = kvf_time_ms();
    kvs_stop(&t.n1, 0);
    assert_true(kvf_time_ms() - t0 < 1800);
    kvs_client_close(&t.c);
    kvs_stop(&t.m, 0);
}

static void test_put_view_bad_input(void **state)
{
    const char *keys[2] = {"bad/a", NULL};
    size_t lens[2] = {16, 16};
    kvf_store_put_opts_t nine = {.replicas = KVF_STORE_REPLICA_MAX + 1};
    kvf_store_put_view_h pv = NULL;
    kvf_store_view_t v[2];
    kvf_status_t s[2];
    char longkey[KVF_STORE_KEY_MAX + 2];
    cluster_t t;

    (void)state;
    cluster_start(&t, 1);
    assert_int_equal(kvf_store_view_put(NULL, 1, keys, lens, NULL, v, &pv),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_store_view_put(t.c.st, 1, NULL, lens, NULL, v, &pv),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_store_view_put(t.c.st, 1, keys, NULL, NULL, v, &pv),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_store_view_put(t.c.st, 1, keys, lens, NULL, NULL, &pv),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_store_view_put(t.c.st, 1, keys, lens, NULL, v, NULL),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_store_view_put(t.c.st, 0, keys, lens, NULL, v, &pv),
                     KVF_ERR_INVALID_PARAM);
    v[0].status = KVF_OK;
    assert_int_equal(kvf_store_view_put(t.c.st, KVF_STORE_BATCH_MAX + 1, keys,
                                        lens, NULL, v, &pv),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(v[0].status, KVF_OK); /* untouched */
    assert_int_equal(kvf_store_view_put(t.c.st, 1, keys, lens, &nine, v, &pv),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(v[0].status, KVF_ERR_INVALID_PARAM);
    assert_null(pv);
    assert_int_equal(kvf_store_view_put_commit(NULL, NULL, NULL, s),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_store_view_put_left_ms(NULL), 0);
    kvf_store_view_put_abort(NULL);
    /* bad keys: their status, the good one allocated */
    assert_int_equal(kvf_store_view_put(t.c.st, 2, keys, lens, NULL, v, &pv),
                     KVF_OK);
    assert_int_equal(v[0].status, KVF_OK);
    assert_int_equal(v[1].status, KVF_ERR_INVALID_PARAM);
    memset(longkey, 'k', sizeof(longkey) - 1);
    longkey[sizeof(longkey) - 1] = '\0';
    kvf_store_view_put_abort(pv);
    keys[1] = longkey;
    assert_int_equal(kvf_store_view_put(t.c.st, 2, keys, lens, NULL, v, &pv),
                     KVF_OK);
    assert_int_equal(v[1].status, KVF_ERR_KEY_TOO_LARGE);
    assert_int_equal(kvf_store_view_put_commit(pv, NULL, NULL, s), KVF_OK);
    assert_int_equal(s[0], KVF_OK);
    assert_int_equal(s[1], KVF_ERR_KEY_TOO_LARGE);
    /* a master gone: the call fails, no handle */
    kvs_stop(&t.m, SIGKILL);
    pv = NULL;
    keys[0] = "bad/b";
    assert_int_not_equal(
        kvf_store_view_put(t.c.st, 1, keys, lens, NULL, v, &pv), KVF_OK);
    assert_null(pv);
    assert_int_not_equal(v[0].status, KVF_OK);
    kvs_client_close(&t.c);
    kvs_stop(&t.n1, 0);
}

/* kvf_store_view_maps' callback: the mappings it told. */
typedef struct maps {
    const unsigned char *base[8];
    uint64_t len[8];
    unsigned n;
} maps_t;

static void on_map(void *arg, const void *base, uint64_t len)
{
    maps_t *m = arg;

    if (m->n < 8) {
        m->base[m->n] = base;
        m->len[m->n++] = len;
    }
}

/* Whether v lies inside one of m's mappings. */
static int in_maps(const maps_t *m, const kvf_store_view_t *v)
{
    const unsigned char *p = v->ptr;
    unsigned i;

    for (i = 0; i < m->n; i++) {
        if (p >= m->base[i] && p + v->len <= m->base[i] + m->len[i]) {
            return 1;
        }
    }
    return 0;
}

static void test_view_maps(void **state)
{
    const char *keys[NKEYS];
    char names[NKEYS][32];
    size_t lens[NKEYS], i;
    kvf_store_view_t v[NKEYS];
    kvf_store_put_view_h pv;
    kvf_store_view_lease_h lease;
    kvf_store_params_t p = {0};
    maps_t m = {0}, m2 = {0};
    kvf_store_h st;
    cluster_t t;

    (void)state;
    cluster_start(&t, 2);
    assert_int_equal(kvf_store_view_maps(t.c.st, on_map, &m), KVF_OK);
    assert_int_equal(m.n, 2); /* both pools, whole */
    assert_true(m.len[0] >= 32 * MiB && m.len[1] >= 32 * MiB);
    assert_ptr_not_equal(m.base[0], m.base[1]);
    /* views and put views into those pools lie in those mappings */
    names_make(names, keys, NKEYS, "maps");
    for (i = 0; i < NKEYS; i++) {
        lens[i] = 64 * KiB + i;
    }
    assert_int_equal(
        kvf_store_view_put(t.c.st, NKEYS, keys, lens, NULL, v, &pv), KVF_OK);
    for (i = 0; i < NKEYS; i++) {
        check_put_view(&v[i], lens[i]);
        assert_true(in_maps(&m, &v[i]));
        kvs_fill((void *)(uintptr_t)v[i].ptr, lens[i], 300 + i);
    }
    assert_int_equal(kvf_store_view_put_commit(pv, NULL, NULL, NULL), KVF_OK);
    assert_int_equal(kvf_store_view_get(t.c.st, NKEYS, keys, v, &lease),
                     KVF_OK);
    for (i = 0; i < NKEYS; i++) {
        assert_int_equal(v[i].status, KVF_OK);
        assert_true(in_maps(&m, &v[i]));
    }
    assert_int_equal(kvf_store_view_release(lease), KVF_OK);
    /* again: the same mappings */
    assert_int_equal(kvf_store_view_maps(t.c.st, on_map, &m2), KVF_OK);
    assert_int_equal(m2.n, 2);
    assert_true((m2.base[0] == m.base[0] && m2.base[1] == m.base[1]) ||
                (m2.base[0] == m.base[1] && m2.base[1] == m.base[0]));
    /* over tcp: nothing to map */
    p.field_mask = KVF_STORE_PARAM_MASTER | KVF_STORE_PARAM_TRANSPORTS;
    p.master = t.m.addr;
    p.transports = "tcp";
    assert_int_equal(kvf_store_connect(&p, &st), KVF_OK);
    memset(&m2, 0, sizeof(m2));
    assert_int_equal(kvf_store_view_maps(st, on_map, &m2), KVF_OK);
    assert_int_equal(m2.n, 0);
    assert_int_equal(kvf_store_view_maps(st, NULL, &m2), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_store_view_maps(NULL, on_map, &m2),
                     KVF_ERR_INVALID_PARAM);
    kvf_store_disconnect(st);
    cluster_stop(&t, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_view_bytes),
        cmocka_unit_test(test_put_view_threads),
        cmocka_unit_test(test_put_view_sums_keep),
        cmocka_unit_test(test_put_view_abort_exists),
        cmocka_unit_test(test_put_view_unsupported),
        cmocka_unit_test(test_put_view_expired),
        cmocka_unit_test(test_put_view_node_stop),
        cmocka_unit_test(test_put_view_disconnect),
        cmocka_unit_test(test_put_view_bad_input),
        cmocka_unit_test(test_view_maps),
    };

    kvs_bin();
    /* single puts keep no reservation: the master's gauges count puts */
    setenv("KVF_PUT_RESERVE", "0", 1);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
