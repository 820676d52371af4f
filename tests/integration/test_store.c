/*
 * Integration test of the store with real processes on 127.0.0.1: a
 * master and two nodes (64 MiB pools) and in-process clients. Round trips
 * of many sizes verified byte for byte, remove/exists/list, replicas on
 * distinct nodes, batch forms, many concurrent clients, the metrics and
 * status endpoints scraped and checked, a read of what a query found
 * (no second round trip), the command-line client (`kvferry get` in one
 * master round trip), no
 * client-side leak, and the client engine's shape (node_conns,
 * node_chunk: objects cut into many requests still verified byte for
 * byte; a bad node_conns refused at connect).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_store_harness.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB (1024 * 1024)

static kvs_proc_t g_master, g_node[2];

static int setup(void **state)
{
    (void)state;
    if (kvs_master(&g_master, 0, NULL) != 0 ||
        kvs_node(&g_node[0], g_master.addr, "64M", NULL) != 0 ||
        kvs_node(&g_node[1], g_master.addr, "64M", NULL) != 0) {
        return -1;
    }
    return kvs_metric_wait(g_master.http, "nodes", 2, 3000) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kvs_stop(&g_node[0], 0);
    kvs_stop(&g_node[1], 0);
    kvs_stop(&g_master, 0);
    return 0;
}

/* Fills len bytes from seed, keeps a copy in want, puts them at key. */
static void put_filled(kvs_client_t *c, const char *key, size_t len,
                       uint64_t seed, unsigned char *want)
{
    kvs_fill(c->buf, len, seed);
    memcpy(want, c->buf, len);
    assert_int_equal(kvf_store_put(c->st, key, c->buf, len, NULL), KVF_OK);
}

/* Gets key over a poisoned buffer and compares it with want. */
static void get_equal(kvs_client_t *c, const char *key, size_t len,
                      const unsigned char *want)
{
    size_t got = 12345;

    memset(c->buf, 0xee, 4 * MiB);
    assert_int_equal(kvf_store_get(c->st, key, c->buf, 4 * MiB, &got, 0),
                     KVF_OK);
    assert_int_equal(got, len);
    if (len > 0) {
        assert_memory_equal(c->buf, want, len);
    }
}

static void test_round_trips(void **state)
{
    static const size_t sizes[] = {0,    1,    63,    64,      65,
                                   4095, 8192, 65536, 1000003, 3 * MiB + 17};
    unsigned char *want;
    kvs_client_t c;
    char key[64];
    size_t i, got;

    (void)state;
    assert_int_equal(kvs_client_open(&c, g_master.addr, 8 * MiB), 0);
    want = malloc(4 * MiB);
    assert_non_null(want);
    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        snprintf(key, sizeof(key), "rt/%zu", sizes[i]);
        put_filled(&c, key, sizes[i], 100 + i, want);
        assert_int_equal(kvf_store_exists(c.st, key), KVF_OK);
        /* same key again: refused, first object kept */
        assert_int_equal(kvf_store_put(c.st, key, c.buf, sizes[i], NULL),
                         KVF_ERR_EXISTS);
        get_equal(&c, key, sizes[i], want);
    }
    /* a buffer too small is refused, not overrun */
    assert_int_equal(kvf_store_get(c.st, "rt/65536", c.buf, 1000, &got, 0),
                     KVF_ERR_NO_RESOURCE);
    /* unregistered memory is refused */
    assert_int_not_equal(
        kvf_store_get(c.st, "rt/65536", want, 4 * MiB, &got, 0), KVF_OK);
    /* removed while leased (just read): the key goes at once, and may be
     * stored again right away with other bytes */
    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        snprintf(key, sizeof(key), "rt/%zu", sizes[i]);
        assert_int_equal(kvf_store_remove(c.st, key), KVF_OK);
        assert_int_equal(kvf_store_exists(c.st, key), KVF_ERR_NO_KEY);
        assert_int_equal(kvf_store_get(c.st, key, c.buf, 4 * MiB, &got, 0),
                         KVF_ERR_NO_KEY);
        assert_int_equal(kvf_store_remove(c.st, key), KVF_ERR_NO_KEY);
    }
    kvs_fill(c.buf, 65536, 4242);
    memcpy(want, c.buf, 65536);
    assert_int_equal(kvf_store_put(c.st, "rt/65536", c.buf, 65536, NULL),
                     KVF_OK);
    memset(c.buf, 0, 65536);
    assert_int_equal(kvf_store_get(c.st, "rt/65536", c.buf, 65536, &got, 0),
                     KVF_OK);
    assert_memory_equal(c.buf, want, 65536);
    assert_int_equal(kvf_store_get(c.st, "rt/none", c.buf, 10, &got, 0),
                     KVF_ERR_NO_KEY);
    assert_int_equal(kvf_store_exists(c.st, "rt/none"), KVF_ERR_NO_KEY);
    assert_int_equal(kvf_store_remove(c.st, "rt/none"), KVF_ERR_NO_KEY);
    free(want);
    kvs_client_close(&c);
}

static void test_engine_shape(void **state)
{
    static const size_t sizes[] = {65536, 262144, 262145, 1000003,
                                   3 * MiB + 17};
    kvf_store_params_t p = {0};
    unsigned char *want;
    kvf_store_h st;
    kvs_client_t c;
    char key[64];
    size_t i;

    (void)state;
    setenv("KVF_NODE_CHUNK", "64K", 1); /* 1 MiB = 16 requests */
    setenv("KVF_NODE_CONNS", "3", 1);
    assert_int_equal(kvs_client_open(&c, g_master.addr, 8 * MiB), 0);
    want = malloc(4 * MiB);
    assert_non_null(want);
    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        snprintf(key, sizeof(key), "shape/%zu", sizes[i]);
        put_filled(&c, key, sizes[i], 300 + i, want);
        get_equal(&c, key, sizes[i], want);
        assert_int_equal(kvf_store_remove(c.st, key), KVF_OK);
    }
    kvs_client_close(&c);
    free(want);
    setenv("KVF_NODE_CONNS", "65", 1);
    p.field_mask = KVF_STORE_PARAM_MASTER;
    p.master = g_master.addr;
    assert_int_equal(kvf_store_connect(&p, &st), KVF_ERR_INVALID_PARAM);
    unsetenv("KVF_NODE_CONNS");
    unsetenv("KVF_NODE_CHUNK");
}

static void test_replicas(void **state)
{
    kvf_store_put_opts_t po = {.replicas = 2};
    kvf_store_info_t info;
    kvs_client_t c;
    size_t got;

    (void)state;
    assert_int_equal(kvs_client_open(&c, g_master.addr, 2 * MiB), 0);
    kvs_fill(c.buf, MiB, 7);
    assert_int_equal(kvf_store_put(c.st, "rep/two", c.buf, MiB, &po), KVF_OK);
    assert_int_equal(kvf_store_query(c.st, "rep/two", &info), KVF_OK);
    assert_int_equal(info.replicas, 2);
    assert_int_equal(info.size, MiB);
    assert_string_not_equal(info.segment[0], info.segment[1]);
    assert_true(strcmp(info.segment[0], g_node[0].addr) == 0 ||
                strcmp(info.segment[0], g_node[1].addr) == 0);
    assert_int_equal(info.checksum, kvf_checksum(c.buf, MiB));
    /* more replicas than nodes: one per node */
    po.replicas = 3;
    assert_int_equal(kvf_store_put(c.st, "rep/three", c.buf, MiB, &po), KVF_OK);
    assert_int_equal(kvf_store_query(c.st, "rep/three", &info), KVF_OK);
    assert_int_equal(info.replicas, 2);
    memset(c.buf, 0, MiB);
    assert_int_equal(kvf_store_get(c.st, "rep/three", c.buf, 2 * MiB, &got, 0),
                     KVF_OK);
    assert_int_equal(kvf_checksum(c.buf, MiB), info.checksum);
    po.replicas = KVF_STORE_REPLICA_MAX + 1;
    assert_int_equal(kvf_store_put(c.st, "rep/bad", c.buf, MiB, &po),
                     KVF_ERR_INVALID_PARAM);
    kvs_client_close(&c);
}

static void kvs_count_entry(const kvf_store_entry_t *e, void *arg)
{
    size_t *n = arg;

    if (strncmp(e->key, "batch/", 6) == 0 && e->committed && e->size == 8192) {
        (*n)++;
    }
}

static void test_batch_and_list(void **state)
{
    enum { N = 64, SZ = 8192 };
    const char *keys[N + 1];
    const void *bufs[N + 1];
    void *gbufs[N + 1];
    size_t lens[N + 1], caps[N + 1], got[N + 1], i, n = 0;
    kvf_status_t s[N + 1];
    char names[N + 1][32];
    kvs_client_t c;

    (void)state;
    assert_int_equal(kvs_client_open(&c, g_master.addr, 2 * N * SZ), 0);
    for (i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "batch/%03zu", i);
        keys[i] = names[i];
        bufs[i] = c.buf + i * SZ;
        gbufs[i] = c.buf + (N + i) * SZ;
        lens[i] = SZ;
        caps[i] = SZ;
        kvs_fill(c.buf + i * SZ, SZ, 1000 + i);
    }
    assert_int_equal(kvf_store_put_batch(c.st, N, keys, bufs, lens, NULL, s),
                     KVF_OK);
    /* one absent key among present ones */
    keys[N] = "batch/absent";
    gbufs[N] = c.buf;
    caps[N] = SZ;
    assert_int_equal(
        kvf_store_get_batch(c.st, N + 1, keys, gbufs, caps, got, 0, s),
        KVF_ERR_NO_KEY);
    for (i = 0; i < N; i++) {
        assert_int_equal(s[i], KVF_OK);
        assert_int_equal(got[i], SZ);
        assert_memory_equal(gbufs[i], bufs[i], SZ);
    }
    assert_int_equal(s[N], KVF_ERR_NO_KEY);
    assert_int_equal(kvf_store_exists_batch(c.st, N + 1, keys, s),
                     KVF_ERR_NO_KEY);
    assert_int_equal(s[0], KVF_OK);
    assert_int_equal(s[N], KVF_ERR_NO_KEY);
    assert_int_equal(kvf_store_list(c.st, "batch/", 0, kvs_count_entry, &n),
                     KVF_OK);
    assert_int_equal(n, N);
    n = 0;
    assert_int_equal(kvf_store_list(c.st, "batch/", 10, kvs_count_entry, &n),
                     KVF_OK);
    assert_int_equal(n, 10);
    kvs_client_close(&c);
}

typedef struct kvs_worker {
    kvf_store_h st;     /* shared handle, or NULL: open its own */
    unsigned char *buf; /* 2 x 64 KiB, registered */
    int id;
    int errors;
} kvs_worker_t;

static void *kvs_worker_main(void *arg)
{
    kvs_worker_t *w = arg;
    size_t len, got;
    char key[64];
    int i;

    for (i = 0; i < 40; i++) {
        len = 1024 + (size_t)((w->id * 131 + i * 977) % 60000);
        snprintf(key, sizeof(key), "conc/%d/%d", w->id, i);
        kvs_fill(w->buf, len, (uint64_t)(w->id * 1000 + i));
        if (kvf_store_put(w->st, key, w->buf, len, NULL) != KVF_OK) {
            w->errors++;
            continue;
        }
        memset(w->buf + 65536, 0, len);
        if (kvf_store_get(w->st, key, w->buf + 65536, 65536, &got, 0) !=
                KVF_OK ||
            got != len || memcmp(w->buf, w->buf + 65536, len) != 0) {
            w->errors++;
        }
    }
    return NULL;
}

static void test_concurrent_clients(void **state)
{
    enum { SHARED = 8, OWN = 8 };
    kvs_worker_t w[SHARED + OWN];
    kvs_client_t shared, own[OWN];
    pthread_t th[SHARED + OWN];
    long tcp0, unix0;
    int i;

    (void)state;
    tcp0 = kvs_metric(g_master.http, "connections_tcp");
    unix0 = kvs_metric(g_master.http, "connections_unix");
    assert_true(tcp0 >= 0 && unix0 >= 0);
    assert_int_equal(kvs_client_open(&shared, g_master.addr, SHARED * 131072),
                     0);
    for (i = 0; i < SHARED + OWN; i++) {
        memset(&w[i], 0, sizeof(w[i]));
        w[i].id = i;
        if (i < SHARED) {
            w[i].st = shared.st;
            w[i].buf = shared.buf + (size_t)i * 131072;
        } else {
            assert_int_equal(
                kvs_client_open(&own[i - SHARED], g_master.addr, 131072), 0);
            w[i].st = own[i - SHARED].st;
            w[i].buf = own[i - SHARED].buf;
        }
    }
    for (i = 0; i < SHARED + OWN; i++) {
        assert_int_equal(pthread_create(&th[i], NULL, kvs_worker_main, &w[i]),
                         0);
    }
    for (i = 0; i < SHARED + OWN; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].errors, 0);
    }
    for (i = 0; i < OWN; i++) {
        kvs_client_close(&own[i]);
    }
    kvs_client_close(&shared);
    /* every loop of the master closed its share of them (bounded, with
     * room for a loaded machine: ctest -j beside other suites); at most
     * the baseline, which may still have counted the previous test's
     * client while the master closed it */
    assert_true(
        kvs_metric_wait_le(g_master.http, "connections_tcp", tcp0, 10000));
    assert_true(
        kvs_metric_wait_le(g_master.http, "connections_unix", unix0, 10000));
}

static void test_metrics(void **state)
{
    static char body[65536];
    long hits0, misses0, puts0;
    kvs_client_t c;
    size_t got;

    (void)state;
    assert_int_equal(kvs_http(g_master.http, "/metrics", body, sizeof(body)),
                     200);
    assert_non_null(strstr(body, "# TYPE kvferry_store_hits_total counter"));
    assert_non_null(strstr(body, "kvferry_store_capacity_bytes 134217728"));
    assert_int_equal(kvs_metric(g_master.http, "nodes"), 2);
    hits0 = kvs_metric(g_master.http, "hits_total");
    misses0 = kvs_metric(g_master.http, "misses_total");
    puts0 = kvs_metric(g_master.http, "puts_total");
    assert_true(hits0 >= 0 && misses0 >= 0 && puts0 >= 0);
    assert_int_equal(kvs_client_open(&c, g_master.addr, 65536), 0);
    kvs_fill(c.buf, 65536, 3);
    assert_int_equal(kvf_store_put(c.st, "met/a", c.buf, 65536, NULL), KVF_OK);
    assert_int_equal(kvf_store_get(c.st, "met/a", c.buf, 65536, &got, 0),
                     KVF_OK);
    assert_int_equal(kvf_store_get(c.st, "met/a", c.buf, 65536, &got, 0),
                     KVF_OK);
    assert_int_equal(kvf_store_get(c.st, "met/none", c.buf, 65536, &got, 0),
                     KVF_ERR_NO_KEY);
    kvs_client_close(&c);
    assert_int_equal(kvs_metric(g_master.http, "hits_total"), hits0 + 2);
    assert_int_equal(kvs_metric(g_master.http, "misses_total"), misses0 + 1);
    assert_int_equal(kvs_metric(g_master.http, "puts_total"), puts0 + 1);
    assert_true(kvs_metric(g_master.http, "used_bytes") >= 65536);
    assert_int_equal(kvs_http(g_master.http, "/status", body, sizeof(body)),
                     200);
    assert_non_null(strstr(body, "\"nodes\":2"));
    assert_non_null(strstr(body, "\"capacity\":134217728"));
    assert_non_null(strstr(body, g_node[0].addr));
    assert_int_equal(kvs_http(g_master.http, "/nope", body, sizeof(body)), 404);
}

/* kvf_store_read: the bytes a query described, with no second round
 * trip; verified like a get. */
static void test_query_read(void **state)
{
    kvf_store_info_t info;
    unsigned char *want;
    kvs_client_t c;
    long hits0;
    size_t got = 0;

    (void)state;
    want = malloc(100000);
    assert_non_null(want);
    assert_int_equal(kvs_client_open(&c, g_master.addr, 4 * MiB), 0);
    put_filled(&c, "qr/a", 100000, 17, want);
    hits0 = kvs_metric(g_master.http, "hits_total");
    assert_int_equal(kvf_store_query(c.st, "qr/a", &info), KVF_OK);
    assert_int_equal(info.size, 100000);
    memset(c.buf, 0xee, 100000);
    assert_int_equal(
        kvf_store_read(c.st, "qr/a", &info, c.buf, 100000, &got, 0), KVF_OK);
    assert_int_equal(got, 100000);
    assert_memory_equal(c.buf, want, 100000);
    assert_int_equal(kvs_metric(g_master.http, "hits_total"), hits0 + 1);
    assert_int_equal(kvf_store_read(c.st, "qr/a", &info, c.buf, 99999, &got, 0),
                     KVF_ERR_NO_RESOURCE);
    info.checksum ^= 1; /* bytes that are not the object's: refused */
    assert_int_equal(
        kvf_store_read(c.st, "qr/a", &info, c.buf, 100000, &got, 0),
        KVF_ERR_CHECKSUM);
    assert_int_equal(kvf_store_read(c.st, "qr/a", NULL, c.buf, 100000, &got, 0),
                     KVF_ERR_INVALID_PARAM);
    kvs_client_close(&c);
    free(want);
}

static void test_cli(void **state)
{
    char cmd[1024], path[64], out[64];
    unsigned char *a, *b;
    long hits0;
    FILE *f;
    int rc;

    (void)state;
    snprintf(path, sizeof(path), "/tmp/kvf-test-store-%d.in", (int)getpid());
    snprintf(out, sizeof(out), "/tmp/kvf-test-store-%d.out", (int)getpid());
    a = malloc(300000);
    b = malloc(300000);
    assert_non_null(a);
    assert_non_null(b);
    kvs_fill(a, 300000, 99);
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(a, 1, 300000, f), 300000);
    fclose(f);
    snprintf(cmd, sizeof(cmd), "%s put --master %s cli/x %s", kvs_bin(),
             g_master.addr, path);
    assert_int_equal(system(cmd), 0);
    /* `kvferry get` asks the master once (the hit of its GET) */
    hits0 = kvs_metric(g_master.http, "hits_total");
    snprintf(cmd, sizeof(cmd), "%s get --master %s cli/x %s", kvs_bin(),
             g_master.addr, out);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(kvs_metric(g_master.http, "hits_total"), hits0 + 1);
    snprintf(cmd, sizeof(cmd),
             "%s exists --master %s cli/x >/dev/null && "
             "%s ls --master %s cli/ | grep -q 'cli/x'",
             kvs_bin(), g_master.addr, kvs_bin(), g_master.addr);
    rc = system(cmd);
    assert_int_equal(rc, 0);
    f = fopen(out, "rb");
    assert_non_null(f);
    assert_int_equal(fread(b, 1, 300000, f), 300000);
    fclose(f);
    assert_memory_equal(a, b, 300000);
    snprintf(cmd, sizeof(cmd),
             "%s rm --master %s cli/x && ! %s exists --master %s cli/x "
             ">/dev/null && ! %s get --master %s cli/x %s 2>/dev/null",
             kvs_bin(), g_master.addr, kvs_bin(), g_master.addr, kvs_bin(),
             g_master.addr, out);
    assert_int_equal(system(cmd), 0);
    unlink(path);
    unlink(out);
    free(a);
    free(b);
}

static void test_no_leak(void **state)
{
    long blocks0, bytes0, blocks1, bytes1;
    kvs_client_t c;
    size_t got;
    int i;

    (void)state;
    /* warm once: thread-local and lazily made state */
    assert_int_equal(kvs_client_open(&c, g_master.addr, 65536), 0);
    kvs_client_close(&c);
    kvf_alloc_stats(&blocks0, &bytes0);
    for (i = 0; i < 3; i++) {
        assert_int_equal(kvs_client_open(&c, g_master.addr, 65536), 0);
        kvs_fill(c.buf, 4096, 5);
        kvf_store_put(c.st, "leak/a", c.buf, 4096, NULL);
        assert_int_equal(kvf_store_get(c.st, "leak/a", c.buf, 65536, &got, 0),
                         KVF_OK);
        kvs_client_close(&c);
    }
    kvf_alloc_stats(&blocks1, &bytes1);
    assert_int_equal(blocks1, blocks0);
    assert_int_equal(bytes1, bytes0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_engine_shape),
        cmocka_unit_test(test_replicas),
        cmocka_unit_test(test_batch_and_list),
        cmocka_unit_test(test_concurrent_clients),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_query_read),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_no_leak),
    };

    kvs_bin();
    return cmocka_run_group_tests(tests, setup, teardown);
}
