/*
 * Integration test of the store's views (kvf_store_view_get, store/
 * client/view.c, over the shm transport's view leases), with a real
 * master and nodes on 127.0.0.1:
 * - objects of various sizes on two nodes are viewed in one call: byte
 *   for byte the bytes put, the checksum equals kvf_checksum of them,
 *   each view inside the mapping it names, one mapping per node; missing
 *   keys give KVF_ERR_NO_KEY, bad keys their status, an empty object
 *   KVF_OK with no pointer; the lease has a
 *   bounded life and its release says it held;
 * - four threads viewing all keys in a loop on one handle next to two
 *   getting them: every view byte for byte, every release KVF_OK;
 * - a client whose engine reaches the nodes over tcp gets
 *   KVF_ERR_UNSUPPORTED per key, with size and checksum (copy it);
 * - bad input: NULL arguments, count 0 or too large: clear statuses;
 * - the node's leases: while a view is held, a node's stop waits for it
 *   (its deregistration, up to lease_break_ms) and then breaks it: the
 *   release says so (KVF_ERR_CONN_RESET), the mapping stays readable
 *   until then and is unmapped (the unmap hook told) after; with the
 *   views released, a stop does not wait;
 * - views held past their lease: the release says KVF_ERR_TIMEOUT;
 * - the shm view lease under the store, two engines of this process:
 *   a deregistration waits for a held view (lease_break_ms), then breaks
 *   it; a range deregistered is never granted again; with the view
 *   closed a deregistration does not wait.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_store_harness.h"
#include <kvferry/view.h>
#include "core/time.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KiB 1024
#define MiB (1024 * 1024)

static const size_t sizes[] = {1, 4 * KiB, 64 * KiB + 3, 1 * MiB, 3 * MiB + 5};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

static void put_seeded(kvs_client_t *c, const char *key, size_t len,
                       uint64_t seed)
{
    kvs_fill(c->buf, len, seed);
    assert_int_equal(kvf_store_put(c->st, key, c->buf, len, NULL), KVF_OK);
}

/* A master, two nodes of 32 MiB and a client holding 2 * NSIZES
 * objects named prefix/i (sizes[i % NSIZES], seed 100 + i); keys[i]
 * points at names[i]. */
typedef struct two_nodes {
    kvs_proc_t m, n1, n2;
    kvs_client_t c;
} two_nodes_t;

static void two_nodes_start(two_nodes_t *t, const char *prefix,
                            char (*names)[32], const char **keys)
{
    size_t i;

    assert_int_equal(kvs_master(&t->m, 0, NULL), 0);
    assert_int_equal(kvs_node(&t->n1, t->m.addr, "32M", NULL), 0);
    assert_int_equal(kvs_node(&t->n2, t->m.addr, "32M", NULL), 0);
    assert_int_equal(kvs_client_open(&t->c, t->m.addr, 4 * MiB), 0);
    for (i = 0; i < 2 * NSIZES; i++) {
        snprintf(names[i], 32, "%s/%zu", prefix, i);
        keys[i] = names[i];
        put_seeded(&t->c, keys[i], sizes[i % NSIZES], 100 + i);
    }
}

static void two_nodes_stop(two_nodes_t *t)
{
    kvs_client_close(&t->c);
    kvs_stop(&t->n1, 0);
    kvs_stop(&t->n2, 0);
    kvs_stop(&t->m, 0);
}

/* v holds the bytes of seed, and lies inside its mapping. */
static void check_view(const kvf_store_view_t *v, size_t len, uint64_t seed,
                       unsigned char *tmp)
{
    const unsigned char *p = v->ptr, *base = v->map_base;

    assert_int_equal(v->status, KVF_OK);
    assert_int_equal(v->len, len);
    assert_non_null(p);
    assert_non_null(base);
    assert_true(p >= base && p + len <= base + v->map_len);
    kvs_fill(tmp, len, seed);
    assert_memory_equal(p, tmp, len);
    assert_true(v->checksum == kvf_checksum(p, len));
}

static void test_view_bytes(void **state)
{
    kvf_store_view_t v[2 * NSIZES + 3];
    const char *keys[2 * NSIZES + 3];
    char names[2 * NSIZES][32];
    kvf_store_view_lease_h lease;
    unsigned char *tmp = malloc(4 * MiB);
    char longkey[KVF_STORE_KEY_MAX + 2];
    two_nodes_t t;
    size_t i, n = 2 * NSIZES;
    unsigned left;

    (void)state;
    assert_non_null(tmp);
    two_nodes_start(&t, "view", names, keys);
    memset(longkey, 'k', sizeof(longkey) - 1);
    longkey[sizeof(longkey) - 1] = '\0';
    keys[n] = "view/missing";
    keys[n + 1] = longkey;
    keys[n + 2] = NULL;

    assert_int_equal(kvf_store_view_get(t.c.st, n + 3, keys, v, &lease),
                     KVF_OK);
    for (i = 0; i < n; i++) {
        check_view(&v[i], sizes[i % NSIZES], 100 + i, tmp);
    }
    assert_int_equal(v[n].status, KVF_ERR_NO_KEY);
    assert_null(v[n].ptr);
    assert_int_equal(v[n + 1].status, KVF_ERR_KEY_TOO_LARGE);
    assert_int_equal(v[n + 2].status, KVF_ERR_INVALID_PARAM);
    /* one mapping per node: the views of a node share it */
    for (i = 0; i < n; i++) {
        size_t k, same = 0;

        for (k = 0; k < n; k++) {
            same += v[k].map_base == v[i].map_base;
        }
        assert_true(same >= 2);
    }
    left = kvf_store_view_left_ms(lease);
    assert_true(left > 0 && left <= 2000); /* the master's lease_ms */
    /* the views stay good while held: a second look byte for byte */
    for (i = 0; i < n; i++) {
        check_view(&v[i], sizes[i % NSIZES], 100 + i, tmp);
    }
    assert_int_equal(kvf_store_view_release(lease), KVF_OK);

    /* an empty object: KVF_OK, nothing to point at */
    assert_int_equal(kvf_store_put(t.c.st, "view/empty", t.c.buf, 0, NULL),
                     KVF_OK);
    keys[n + 2] = "view/empty";
    assert_int_equal(kvf_store_view_get(t.c.st, 1, &keys[n + 2], v, &lease),
                     KVF_OK);
    assert_int_equal(v[0].status, KVF_OK);
    assert_int_equal(v[0].len, 0);
    assert_null(v[0].ptr);
    assert_true(v[0].checksum == kvf_checksum(t.c.buf, 0));
    assert_int_equal(kvf_store_view_release(lease), KVF_OK);

    /* a call of only missing keys still gives a lease to release */
    assert_int_equal(kvf_store_view_get(t.c.st, 1, &keys[n], v, &lease),
                     KVF_OK);
    assert_int_equal(v[0].status, KVF_ERR_NO_KEY);
    assert_int_equal(kvf_store_view_release(lease), KVF_OK);

    /* many leases in a row reuse the view connections */
    for (i = 0; i < 50; i++) {
        assert_int_equal(kvf_store_view_get(t.c.st, 2, keys, v, &lease),
                         KVF_OK);
        check_view(&v[1], sizes[1], 101, tmp);
        assert_int_equal(kvf_store_view_release(lease), KVF_OK);
    }
    two_nodes_stop(&t);
    free(tmp);
}

static void test_view_tcp(void **state)
{
    kvf_store_params_t p = {0};
    kvf_store_view_lease_h lease;
    kvf_store_view_t v[2];
    const char *keys[2] = {"tcp/a", "tcp/none"};
    kvs_proc_t m, n1;
    kvs_client_t c;
    kvf_store_h st;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_node(&n1, m.addr, "32M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 64 * KiB), 0);
    put_seeded(&c, "tcp/a", 64 * KiB, 7);
    p.field_mask = KVF_STORE_PARAM_MASTER | KVF_STORE_PARAM_TRANSPORTS;
    p.master = m.addr;
    p.transports = "tcp";
    assert_int_equal(kvf_store_connect(&p, &st), KVF_OK);
    assert_int_equal(kvf_store_view_get(st, 2, keys, v, &lease), KVF_OK);
    assert_int_equal(v[0].status, KVF_ERR_UNSUPPORTED);
    assert_null(v[0].ptr);
    assert_int_equal(v[0].len, 64 * KiB);
    assert_true(v[0].checksum == kvf_checksum(c.buf, 64 * KiB));
    assert_int_equal(v[1].status, KVF_ERR_NO_KEY);
    assert_int_equal(kvf_store_view_release(lease), KVF_OK);
    kvf_store_disconnect(st);
    kvs_client_close(&c);
    kvs_stop(&n1, 0);
    kvs_stop(&m, 0);
}

static void test_view_bad_input(void **state)
{
    kvf_store_view_lease_h lease = NULL;
    kvf_store_view_t v[2];
    const char *keys[2] = {"a", "b"};
    kvs_proc_t m;
    kvs_client_t c;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 4 * KiB), 0);
    assert_int_equal(kvf_store_view_get(NULL, 2, keys, v, &lease),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(v[0].status, KVF_ERR_INVALID_PARAM);
    assert_int_equal(v[1].status, KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_store_view_get(c.st, 2, NULL, v, &lease),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_store_view_get(c.st, 2, keys, NULL, &lease),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_store_view_get(c.st, 2, keys, v, NULL),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_store_view_get(c.st, 0, keys, v, &lease),
                     KVF_ERR_INVALID_PARAM);
    v[0].status = KVF_OK;
    assert_int_equal(
        kvf_store_view_get(c.st, KVF_STORE_BATCH_MAX + 1, keys, v, &lease),
        KVF_ERR_INVALID_PARAM);
    assert_int_equal(v[0].status, KVF_OK); /* too many: views untouched */
    assert_null(lease);
    assert_int_equal(kvf_store_view_release(NULL), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_store_view_left_ms(NULL), 0);
    /* no node at all: the keys are simply missing */
    assert_int_equal(kvf_store_view_get(c.st, 2, keys, v, &lease), KVF_OK);
    assert_int_equal(v[0].status, KVF_ERR_NO_KEY);
    assert_int_equal(v[1].status, KVF_ERR_NO_KEY);
    assert_int_equal(kvf_store_view_release(lease), KVF_OK);
    /* a master gone: the call fails, no lease */
    kvs_stop(&m, SIGKILL);
    lease = NULL;
    assert_int_not_equal(kvf_store_view_get(c.st, 2, keys, v, &lease), KVF_OK);
    assert_null(lease);
    assert_int_not_equal(v[0].status, KVF_OK);
    kvs_client_close(&c);
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

static void test_view_node_stop(void **state)
{
    const char *keys[1] = {"stop/a"};
    kvf_store_view_lease_h lease;
    unsigned char *tmp = malloc(64 * KiB);
    kvf_store_view_t v;
    kvs_proc_t m, n1, n2;
    uint64_t t0, held_ms, free_ms;
    kvs_client_t c;
    int i;

    (void)state;
    assert_non_null(tmp);
    kvf_store_view_unmap_hook(on_unmap, NULL);
    /* the nodes break a lease that keeps their deregistration waiting
     * after 2 s: long enough to see the stop wait for the view */
    setenv("KVF_LEASE_BREAK_MS", "2000", 1);
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_node(&n1, m.addr, "32M", NULL), 0);
    unsetenv("KVF_LEASE_BREAK_MS");
    assert_int_equal(kvs_client_open(&c, m.addr, 64 * KiB), 0);
    put_seeded(&c, keys[0], 64 * KiB, 9);

    /* held: the stop waits for the lease (>= lease_break_ms), breaks it */
    assert_int_equal(kvf_store_view_get(c.st, 1, keys, &v, &lease), KVF_OK);
    check_view(&v, 64 * KiB, 9, tmp);
    t0 = kvf_time_ms();
    kvs_stop(&n1, 0);
    held_ms = kvf_time_ms() - t0;
    assert_true(held_ms >= 1800);
    assert_true(held_ms < 5000); /* bounded: it did not need SIGKILL */
    /* the node is gone but the mapping stays while the view is held */
    kvs_fill(tmp, 64 * KiB, 9);
    assert_memory_equal(v.ptr, tmp, 64 * KiB);
    assert_false(was_unmapped(v.map_base));
    assert_int_equal(kvf_store_view_release(lease), KVF_ERR_CONN_RESET);
    /* unmapped once released: at the release, or when the client
     * notices the node is gone (within about a second) */
    for (i = 0; i < 50 && !was_unmapped(v.map_base); i++) {
        kvs_sleep_ms(100);
    }
    assert_true(was_unmapped(v.map_base));

    /* released: the stop does not wait */
    setenv("KVF_LEASE_BREAK_MS", "2000", 1);
    assert_int_equal(kvs_node(&n2, m.addr, "32M", NULL), 0);
    unsetenv("KVF_LEASE_BREAK_MS");
    keys[0] = "stop/b";
    put_seeded(&c, keys[0], 64 * KiB, 10);
    assert_int_equal(kvf_store_view_get(c.st, 1, keys, &v, &lease), KVF_OK);
    check_view(&v, 64 * KiB, 10, tmp);
    assert_int_equal(kvf_store_view_release(lease), KVF_OK);
    t0 = kvf_time_ms();
    kvs_stop(&n2, 0);
    free_ms = kvf_time_ms() - t0;
    assert_true(free_ms < 1800);
    kvf_store_view_unmap_hook(NULL, NULL);
    kvs_client_close(&c);
    kvs_stop(&m, 0);
    free(tmp);
}

static void test_view_expired(void **state)
{
    const char *keys[1] = {"exp/a"};
    kvf_store_view_lease_h lease;
    unsigned char *tmp = malloc(4 * KiB);
    kvf_store_view_t v;
    kvs_proc_t m, n1;
    kvs_client_t c;

    (void)state;
    assert_non_null(tmp);
    setenv("KVF_LEASE_MS", "300", 1);
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    unsetenv("KVF_LEASE_MS");
    assert_int_equal(kvs_node(&n1, m.addr, "32M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 4 * KiB), 0);
    put_seeded(&c, keys[0], 4 * KiB, 11);
    assert_int_equal(kvf_store_view_get(c.st, 1, keys, &v, &lease), KVF_OK);
    check_view(&v, 4 * KiB, 11, tmp);
    assert_true(kvf_store_view_left_ms(lease) <= 300);
    kvs_sleep_ms(400);
    assert_int_equal(kvf_store_view_left_ms(lease), 0);
    assert_int_equal(kvf_store_view_release(lease), KVF_ERR_TIMEOUT);
    /* a view left open is ended by the disconnect (an error logged) */
    assert_int_equal(kvf_store_view_get(c.st, 1, keys, &v, &lease), KVF_OK);
    kvs_client_close(&c);
    kvs_stop(&n1, 0);
    kvs_stop(&m, 0);
    free(tmp);
}

/* Threads sharing one handle: views in a loop, each checked byte for
 * byte, next to threads copying the same keys with gets. */
typedef struct thr_arg {
    kvs_client_t *c;
    const char *const *keys;
    size_t n;
    int views; /* 1: view_get loop, 0: get loop */
    int errors;
} thr_arg_t;

static void *thr_main(void *p)
{
    thr_arg_t *a = p;
    kvf_store_view_lease_h lease;
    unsigned char *tmp = malloc(4 * MiB), *buf = malloc(4 * MiB);
    kvf_store_view_t v[2 * NSIZES];
    kvf_region_h r = NULL;
    size_t i, got;
    int it;

    if (buf == NULL || kvf_engine_reg(kvf_store_engine(a->c->st), buf, 4 * MiB,
                                      KVF_MEM_HOST, 0, &r) != KVF_OK) {
        a->errors++;
    }
    for (it = 0; it < 40 && tmp != NULL && r != NULL; it++) {
        if (!a->views) {
            i = (size_t)it % a->n;
            kvs_fill(tmp, sizes[i % NSIZES], 100 + i);
            a->errors += kvf_store_get(a->c->st, a->keys[i], buf, 4 * MiB, &got,
                                       0) != KVF_OK ||
                         memcmp(buf, tmp, got) != 0;
            continue;
        }
        if (kvf_store_view_get(a->c->st, a->n, a->keys, v, &lease) != KVF_OK) {
            a->errors++;
            continue;
        }
        for (i = 0; i < a->n; i++) {
            kvs_fill(tmp, sizes[i % NSIZES], 100 + i);
            a->errors +=
                v[i].status != KVF_OK || memcmp(v[i].ptr, tmp, v[i].len) != 0;
        }
        a->errors += kvf_store_view_release(lease) != KVF_OK;
    }
    if (r != NULL) {
        kvf_engine_dereg(kvf_store_engine(a->c->st), r);
    }
    free(tmp);
    free(buf);
    return NULL;
}

static void test_view_threads(void **state)
{
    const char *keys[2 * NSIZES];
    char names[2 * NSIZES][32];
    thr_arg_t args[6];
    pthread_t th[6];
    two_nodes_t t;
    size_t i, n = 2 * NSIZES;

    (void)state;
    two_nodes_start(&t, "thr", names, keys);
    for (i = 0; i < 6; i++) {
        args[i] = (thr_arg_t){.c = &t.c, .keys = keys, .n = n, .views = i < 4};
        assert_int_equal(pthread_create(&th[i], NULL, thr_main, &args[i]), 0);
    }
    for (i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].errors, 0);
    }
    two_nodes_stop(&t);
}

typedef struct dereg_arg {
    kvf_engine_h e;
    kvf_region_h r;
    kvf_status_t st;
    uint64_t ms;
} dereg_arg_t;

static void *dereg_main(void *p)
{
    dereg_arg_t *a = p;
    uint64_t t0 = kvf_time_ms();

    a->st = kvf_engine_dereg(a->e, a->r);
    a->ms = kvf_time_ms() - t0;
    return NULL;
}

/* One view of [remote, remote + len) on peer: its verdict; *vl_p the
 * lease when the call worked. */
static kvf_status_t view_one(kvf_peer_h peer, uint64_t remote, uint64_t len,
                             kvf_view_t *v, kvf_view_lease_h *vl_p)
{
    uint64_t until = 0;
    kvf_status_t st;

    *vl_p = NULL;
    st = kvf_peer_view_open(peer, KVF_OP_READ, 1, &remote, &len, v, &until, vl_p);
    if (st == KVF_OK) {
        assert_true(until > kvf_time_ms());
    }
    return st;
}

static void test_view_engine_dereg(void **state)
{
    kvf_engine_params_t tp = {0}, ip = {0};
    const size_t pool_len = 4 * MiB;
    kvf_engine_h te, ie;
    kvf_view_lease_h vl;
    kvf_region_h r;
    kvf_peer_h peer;
    kvf_view_t v;
    dereg_arg_t da;
    pthread_t th;
    unsigned char *pool;
    uint64_t at;

    (void)state;
    setenv("KVF_LEASE_BREAK_MS", "1500", 1);
    tp.field_mask = KVF_ENGINE_PARAM_LISTEN;
    tp.listen = "127.0.0.1:0";
    assert_int_equal(kvf_engine_create(&tp, &te), KVF_OK);
    unsetenv("KVF_LEASE_BREAK_MS");
    ip.field_mask = KVF_ENGINE_PARAM_NO_LISTEN;
    ip.no_listen = 1;
    assert_int_equal(kvf_engine_create(&ip, &ie), KVF_OK);
    assert_int_equal(kvf_mem_alloc(pool_len, KVF_MEM_HOST, 0, (void **)&pool),
                     KVF_OK);
    kvs_fill(pool, pool_len, 42);
    assert_int_equal(kvf_engine_reg(te, pool, pool_len, KVF_MEM_HOST, 0, &r),
                     KVF_OK);
    assert_int_equal(kvf_peer_open(ie, kvf_engine_segment_name(te), &peer),
                     KVF_OK);
    assert_string_equal(kvf_peer_transport(peer), "shm");
    at = (uint64_t)(uintptr_t)pool + 4096;

    /* held: the deregistration waits for the lease, then breaks it */
    assert_int_equal(view_one(peer, at, 8192, &v, &vl), KVF_OK);
    assert_int_equal(v.status, KVF_OK);
    assert_ptr_not_equal(v.ptr, pool + 4096); /* a mapping of its own */
    assert_memory_equal(v.ptr, pool + 4096, 8192);
    da = (dereg_arg_t){.e = te, .r = r};
    assert_int_equal(pthread_create(&th, NULL, dereg_main, &da), 0);
    pthread_join(th, NULL);
    assert_int_equal(da.st, KVF_OK);
    assert_true(da.ms >= 1300 && da.ms < 5000);
    assert_int_equal(kvf_peer_view_close(peer, vl), KVF_ERR_CONN_RESET);
    /* deregistered: never granted again */
    assert_int_equal(view_one(peer, at, 8192, &v, &vl), KVF_OK);
    assert_int_not_equal(v.status, KVF_OK);
    assert_null(v.ptr);
    assert_int_equal(kvf_peer_view_close(peer, vl), KVF_OK);

    /* registered again, viewed, closed: a deregistration does not wait */
    assert_int_equal(kvf_engine_reg(te, pool, pool_len, KVF_MEM_HOST, 0, &r),
                     KVF_OK);
    assert_int_equal(view_one(peer, at, 8192, &v, &vl), KVF_OK);
    assert_int_equal(v.status, KVF_OK);
    assert_memory_equal(v.ptr, pool + 4096, 8192);
    assert_int_equal(kvf_peer_view_close(peer, vl), KVF_OK);
    da = (dereg_arg_t){.e = te, .r = r};
    dereg_main(&da);
    assert_int_equal(da.st, KVF_OK);
    assert_true(da.ms < 1000);
    /* bad input to the engine's view calls */
    assert_int_equal(view_one(NULL, at, 8192, &v, &vl), KVF_ERR_INVALID_PARAM);
    assert_int_equal(view_one(peer, at, 0, &v, &vl), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_peer_view_close(peer, NULL), KVF_ERR_INVALID_PARAM);

    kvf_peer_close(peer);
    kvf_engine_destroy(ie);
    kvf_engine_destroy(te);
    kvf_mem_free(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_view_bytes),
        cmocka_unit_test(test_view_threads),
        cmocka_unit_test(test_view_tcp),
        cmocka_unit_test(test_view_bad_input),
        cmocka_unit_test(test_view_node_stop),
        cmocka_unit_test(test_view_expired),
        cmocka_unit_test(test_view_engine_dereg),
    };

    kvs_bin();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
