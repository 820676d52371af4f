/*
 * The etcd client (coord/etcd.h) and the engine's `etcd` metadata
 * backend against a real etcd started by scripts/etcd.sh: put, range,
 * delete, create-if-absent, leases and their expiry, endpoint failover;
 * unreachable, silent, garbage and not-etcd endpoints (clear status,
 * bounded wait); segment descriptors published under leases, a peer
 * opened by name through etcd and used, the time a peer open takes, no
 * etcd request on the data path, a SIGKILLed target's descriptor gone
 * after its lease, foreign and damaged keys under the prefix. Skips (77)
 * when etcd is not installed.
 */
#include "coord/election.h"
#include "coord/etcd.h"
#include "core/time.h"
#include "etcd_harness.h"
#include "test_util.h"

#include <kvferry/kvferry.h>

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

static kvf_test_etcd_t g_etcd;

static kvf_etcd_t *open_etcd(const char *eps, unsigned timeout_ms)
{
    kvf_etcd_t *e = NULL;

    assert_int_equal(kvf_etcd_open(eps, timeout_ms, &e), KVF_OK);
    return e;
}

static void test_kv(void **state)
{
    static const unsigned char bin[] = {0, 1, 2, 0xff, 0, '=', '\n'};
    kvf_etcd_t *e = open_etcd(g_etcd.endpoint, 2000);
    kvf_etcd_kv_t *kv, *kvs;
    int64_t rev = 0, n64;
    size_t n;

    (void)state;
    assert_int_equal(kvf_etcd_put(e, "/t/kv/a", bin, sizeof(bin), 0, &rev),
                     KVF_OK);
    assert_true(rev > 0);
    assert_int_equal(kvf_etcd_put(e, "/t/kv/b", "", 0, 0, NULL), KVF_OK);
    assert_int_equal(kvf_etcd_get(e, "/t/kv/a", &kv), KVF_OK);
    assert_int_equal(kv->len, sizeof(bin));
    assert_memory_equal(kv->val, bin, sizeof(bin));
    assert_int_equal(kv->mod_rev, rev);
    kvf_etcd_kvs_free(kv, 1);
    assert_int_equal(kvf_etcd_get(e, "/t/kv/b", &kv), KVF_OK);
    assert_int_equal(kv->len, 0);
    kvf_etcd_kvs_free(kv, 1);
    assert_int_equal(kvf_etcd_get(e, "/t/kv/none", &kv), KVF_ERR_NOT_FOUND);
    assert_int_equal(kvf_etcd_range_prefix(e, "/t/kv/", 0, &kvs, &n), KVF_OK);
    assert_int_equal(n, 2);
    assert_string_equal(kvs[0].key, "/t/kv/a");
    assert_string_equal(kvs[1].key, "/t/kv/b");
    kvf_etcd_kvs_free(kvs, n);
    assert_int_equal(kvf_etcd_delete(e, "/t/kv/a", &n64), KVF_OK);
    assert_int_equal(n64, 1);
    assert_int_equal(kvf_etcd_delete(e, "/t/kv/a", &n64), KVF_OK);
    assert_int_equal(n64, 0);
    assert_int_equal(kvf_etcd_put(e, "", "x", 1, 0, NULL),
                     KVF_ERR_INVALID_PARAM);
    kvf_etcd_close(e);
}

static void test_create(void **state)
{
    kvf_etcd_t *e = open_etcd(g_etcd.endpoint, 2000);
    kvf_etcd_kv_t *cur = NULL;
    int64_t rev1 = 0, rev2 = 0;
    int created = -1, deleted = -1;

    (void)state;
    assert_int_equal(
        kvf_etcd_create(e, "/t/leader", "one", 3, 0, &created, &rev1, &cur),
        KVF_OK);
    assert_int_equal(created, 1);
    assert_null(cur);
    assert_int_equal(
        kvf_etcd_create(e, "/t/leader", "two", 3, 0, &created, &rev2, &cur),
        KVF_OK);
    assert_int_equal(created, 0);
    assert_int_equal(rev2, rev1);
    assert_non_null(cur);
    assert_int_equal(cur->len, 3);
    assert_memory_equal(cur->val, "one", 3);
    kvf_etcd_kvs_free(cur, 1);
    assert_int_equal(kvf_etcd_delete_if(e, "/t/leader", rev1 + 1000, &deleted),
                     KVF_OK);
    assert_int_equal(deleted, 0);
    assert_int_equal(kvf_etcd_delete_if(e, "/t/leader", rev1, &deleted),
                     KVF_OK);
    assert_int_equal(deleted, 1);
    kvf_etcd_close(e);
}

static void test_lease(void **state)
{
    kvf_etcd_t *e = open_etcd(g_etcd.endpoint, 2000);
    int64_t lease = 0, lease2 = 0, ttl = 0;
    kvf_etcd_kv_t *kv;
    uint64_t t0;
    int i;

    (void)state;
    assert_int_equal(kvf_etcd_lease_grant(e, 1, &lease), KVF_OK);
    assert_int_equal(kvf_etcd_put(e, "/t/lease/a", "v", 1, lease, NULL),
                     KVF_OK);
    /* kept alive for 2 s: the key stays */
    for (i = 0; i < 8; i++) {
        assert_int_equal(kvf_etcd_lease_keepalive(e, lease, &ttl), KVF_OK);
        assert_true(ttl >= 1);
        usleep(250 * 1000);
    }
    assert_int_equal(kvf_etcd_get(e, "/t/lease/a", &kv), KVF_OK);
    assert_int_equal(kv->lease, lease);
    kvf_etcd_kvs_free(kv, 1);
    /* no more keepalives: gone within a few seconds */
    t0 = kvf_time_ms();
    while (kvf_etcd_get(e, "/t/lease/a", &kv) == KVF_OK) {
        kvf_etcd_kvs_free(kv, 1);
        assert_true(kvf_time_ms() - t0 < 5000);
        usleep(100 * 1000);
    }
    printf("lease of 1 s: key gone %lu ms after the last keepalive\n",
           (unsigned long)(kvf_time_ms() - t0 + 250));
    assert_int_equal(kvf_etcd_lease_keepalive(e, lease, &ttl),
                     KVF_ERR_NOT_FOUND);
    /* revoke: the key goes at once */
    assert_int_equal(kvf_etcd_lease_grant(e, 30, &lease2), KVF_OK);
    assert_int_equal(kvf_etcd_put(e, "/t/lease/b", "v", 1, lease2, NULL),
                     KVF_OK);
    assert_int_equal(kvf_etcd_lease_revoke(e, lease2), KVF_OK);
    assert_int_equal(kvf_etcd_get(e, "/t/lease/b", &kv), KVF_ERR_NOT_FOUND);
    assert_int_equal(kvf_etcd_lease_revoke(e, lease2), KVF_ERR_NOT_FOUND);
    /* a put bound to a lease that does not exist */
    assert_int_equal(kvf_etcd_put(e, "/t/lease/c", "v", 1, lease2, NULL),
                     KVF_ERR_NOT_FOUND);
    kvf_etcd_close(e);
}

/* Runs one call against eps and checks its status and its time. */
static void expect_fail(const char *eps, unsigned timeout_ms, kvf_status_t want)
{
    kvf_etcd_t *e = open_etcd(eps, timeout_ms);
    kvf_etcd_kv_t *kv;
    uint64_t t0 = kvf_time_ms(), dt;
    kvf_status_t st;

    st = kvf_etcd_get(e, "/t/x", &kv);
    dt = kvf_time_ms() - t0;
    printf("%s: %s in %lu ms (timeout %u)\n", eps, kvf_status_name(st),
           (unsigned long)dt, timeout_ms);
    assert_int_equal(st, want);
    assert_true(dt <= timeout_ms + 300);
    kvf_etcd_close(e);
}

static void test_bad_endpoints(void **state)
{
    kvf_test_http_t *silent, *garbage, *notetcd;
    char a1[64], a2[64], a3[64], eps[256];
    kvf_etcd_t *e;
    kvf_etcd_kv_t *kv;

    (void)state;
    assert_int_equal(kvf_etcd_open("", 100, &e), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_etcd_open("etcd://nohost", 100, &e),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_etcd_open("a:1,,b:2", 100, &e), KVF_ERR_INVALID_PARAM);
    silent = kvf_test_http_start(KVF_TEST_HTTP_SILENT, a1, sizeof(a1));
    garbage = kvf_test_http_start(KVF_TEST_HTTP_GARBAGE, a2, sizeof(a2));
    notetcd = kvf_test_http_start(KVF_TEST_HTTP_NOTETCD, a3, sizeof(a3));
    assert_non_null(silent);
    assert_non_null(garbage);
    assert_non_null(notetcd);
    expect_fail("127.0.0.1:1", 500, KVF_ERR_CONNECT);
    expect_fail(a1, 400, KVF_ERR_TIMEOUT);
    expect_fail(a2, 500, KVF_ERR_PROTOCOL);
    expect_fail(a3, 500, KVF_ERR_PROTOCOL);
    /* all of them, then etcd: the call moves on and succeeds */
    snprintf(eps, sizeof(eps), "etcd://127.0.0.1:1,%s,%s,%s", a2, a3,
             g_etcd.endpoint);
    e = open_etcd(eps, 2000);
    assert_int_equal(kvf_etcd_put(e, "/t/fo", "x", 1, 0, NULL), KVF_OK);
    assert_string_equal(kvf_etcd_endpoint(e), g_etcd.endpoint);
    assert_int_equal(kvf_etcd_get(e, "/t/fo", &kv), KVF_OK);
    kvf_etcd_kvs_free(kv, 1);
    kvf_etcd_close(e);
    /* a silent first endpoint eats the deadline: a clear timeout */
    snprintf(eps, sizeof(eps), "%s,%s", a1, g_etcd.endpoint);
    expect_fail(eps, 300, KVF_ERR_TIMEOUT);
    kvf_test_http_stop(silent);
    kvf_test_http_stop(garbage);
    kvf_test_http_stop(notetcd);
}

static void test_etcd_stopped(void **state)
{
    kvf_etcd_t *e = open_etcd(g_etcd.endpoint, 500);
    kvf_etcd_kv_t *kv;
    uint64_t t0;
    kvf_status_t st;

    (void)state;
    assert_int_equal(kvf_test_etcd_signal(&g_etcd, SIGSTOP), 0);
    usleep(200 * 1000); /* the stop reaches every etcd thread */
    t0 = kvf_time_ms();
    st = kvf_etcd_get(e, "/t/x", &kv);
    printf("SIGSTOPped etcd: %s in %lu ms\n", kvf_status_name(st),
           (unsigned long)(kvf_time_ms() - t0));
    assert_int_equal(st, KVF_ERR_TIMEOUT);
    assert_true(kvf_time_ms() - t0 < 900);
    assert_int_equal(kvf_test_etcd_signal(&g_etcd, SIGCONT), 0);
    assert_int_equal(kvf_etcd_put(e, "/t/after", "x", 1, 0, NULL), KVF_OK);
    kvf_etcd_close(e);
}

static kvf_engine_h engine_etcd(void)
{
    kvf_engine_params_t p = {0};
    char uri[128];
    kvf_engine_h eng = NULL;

    snprintf(uri, sizeof(uri), "etcd://%s", g_etcd.endpoint);
    p.field_mask = KVF_ENGINE_PARAM_METADATA | KVF_ENGINE_PARAM_TIMEOUT |
                   KVF_ENGINE_PARAM_TRANSPORTS;
    p.metadata = uri;
    p.timeout_ms = 2000;
    p.transports = "tcp";
    assert_int_equal(kvf_engine_create(&p, &eng), KVF_OK);
    return eng;
}

/* The etcd half of a peer open: the descriptor's range request. */
static void resolve_time(const char *name, int n)
{
    kvf_etcd_t *e = open_etcd(g_etcd.endpoint, 2000);
    uint64_t t0, dt, best = ~0ull, sum = 0;
    kvf_etcd_kv_t *kv;
    char key[256];
    int i;

    snprintf(key, sizeof(key), "/kvferry/seg/%s", name);
    for (i = 0; i < n; i++) {
        t0 = kvf_time_ns();
        assert_int_equal(kvf_etcd_get(e, key, &kv), KVF_OK);
        dt = kvf_time_ns() - t0;
        kvf_etcd_kvs_free(kv, 1);
        sum += dt;
        best = dt < best ? dt : best;
    }
    printf("descriptor lookup in etcd: mean %.3f ms, best %.3f ms over %d\n",
           (double)sum / n / 1e6, (double)best / 1e6, n);
    kvf_etcd_close(e);
}

/* A region change is published by the backend's thread, within moments
 * (a registration never waits for etcd): wait until a peer sees it. */
static void wait_region(kvf_engine_h e, const char *name)
{
    uint64_t t0 = kvf_time_ms(), addr;
    kvf_mem_type_t type;
    kvf_peer_h peer;
    size_t len;
    int seen = 0;

    while (!seen && kvf_time_ms() - t0 < 3000) {
        assert_int_equal(kvf_peer_open(e, name, &peer), KVF_OK);
        seen = kvf_peer_region(peer, 0, &addr, &len, &type) == KVF_OK;
        kvf_peer_close(peer);
        if (!seen) {
            usleep(10 * 1000);
        }
    }
    printf("region change published after %lu ms\n",
           (unsigned long)(kvf_time_ms() - t0));
    assert_true(seen);
}

static void test_engine_peer(void **state)
{
    enum { LEN = 1 << 20, OPENS = 50 };
    char *src = malloc(LEN), *dst = malloc(LEN);
    kvf_engine_h a = engine_etcd(), b = engine_etcd();
    kvf_region_h ra, rb;
    kvf_peer_h peer;
    uint64_t t0, best = ~0ull, sum = 0, dt, reqs;
    kvf_op_t op;
    int i;

    (void)state;
    memset(src, 0x5a, LEN);
    memset(dst, 0, LEN);
    assert_int_equal(kvf_engine_reg(a, src, LEN, KVF_MEM_HOST, 0, &ra), KVF_OK);
    assert_int_equal(kvf_engine_reg(b, dst, LEN, KVF_MEM_HOST, 0, &rb), KVF_OK);
    wait_region(b, kvf_engine_segment_name(a));
    for (i = 0; i < OPENS; i++) {
        t0 = kvf_time_ns();
        assert_int_equal(kvf_peer_open(b, kvf_engine_segment_name(a), &peer),
                         KVF_OK);
        dt = kvf_time_ns() - t0;
        sum += dt;
        best = dt < best ? dt : best;
        if (i + 1 < OPENS) {
            kvf_peer_close(peer);
        }
    }
    printf("peer open through etcd (loopback, tcp): mean %.3f ms, best "
           "%.3f ms over %d\n",
           (double)sum / OPENS / 1e6, (double)best / 1e6, OPENS);
    resolve_time(kvf_engine_segment_name(a), OPENS);
    op = (kvf_op_t){KVF_OP_READ, dst, peer, (uint64_t)(uintptr_t)src, LEN};
    reqs = kvf_etcd_requests();
    for (i = 0; i < 20; i++) {
        assert_int_equal(kvf_transfer_sync(b, &op, 1, 2000), KVF_OK);
    }
    /* keepalives may run meanwhile (a few per second); the transfers
     * themselves send none */
    printf("etcd requests during 20 transfers: %lu\n",
           (unsigned long)(kvf_etcd_requests() - reqs));
    assert_true(kvf_etcd_requests() - reqs <= 4);
    assert_memory_equal(src, dst, LEN);
    kvf_peer_close(peer);
    kvf_engine_dereg(a, ra);
    kvf_engine_dereg(b, rb);
    kvf_engine_destroy(a);
    /* a closed engine revokes its lease: its descriptor is gone */
    assert_int_equal(kvf_peer_open(b, "127.0.0.1:1", &peer),
                     KVF_ERR_PEER_UNREACHABLE);
    kvf_engine_destroy(b);
    free(src);
    free(dst);
}

/* Descriptors written by someone without the cluster secret: refused
 * before any connection is tried. */
static void test_bad_descriptors(void **state)
{
    kvf_etcd_t *e = open_etcd(g_etcd.endpoint, 2000);
    kvf_engine_h a = engine_etcd(), b = engine_etcd();
    unsigned char env[40] = {'K', 'V', 'F', 'S', 1, 0, 0, 0};
    unsigned char *val;
    kvf_etcd_kv_t *kv;
    kvf_peer_h peer;
    char key[256];

    (void)state;
    assert_int_equal(
        kvf_etcd_put(e, "/kvferry/seg/foreign", "{\"x\":1}", 7, 0, NULL),
        KVF_OK);
    assert_int_equal(kvf_peer_open(b, "foreign", &peer), KVF_ERR_PROTOCOL);
    /* an envelope of the older version, which carried no MAC */
    assert_int_equal(
        kvf_etcd_put(e, "/kvferry/seg/damaged", env, sizeof(env), 0, NULL),
        KVF_OK);
    assert_int_equal(kvf_peer_open(b, "damaged", &peer), KVF_ERR_VERSION);
    /* a real descriptor (engine a's) copied to another name: its MAC
     * names the key it was written at */
    snprintf(key, sizeof(key), "/kvferry/seg/%s", kvf_engine_segment_name(a));
    assert_int_equal(kvf_etcd_get(e, key, &kv), KVF_OK);
    assert_true(kv->len > 40);
    assert_int_equal(
        kvf_etcd_put(e, "/kvferry/seg/moved", kv->val, kv->len, 0, NULL),
        KVF_OK);
    assert_int_equal(kvf_peer_open(b, "moved", &peer), KVF_ERR_AUTH);
    /* the same descriptor at its own key with its MAC zeroed, then with
     * one byte of the descriptor changed: both refused */
    val = malloc(kv->len);
    memcpy(val, kv->val, kv->len);
    memset(val + 8, 0, 32);
    assert_int_equal(kvf_etcd_put(e, key, val, kv->len, 0, NULL), KVF_OK);
    assert_int_equal(kvf_peer_open(b, kvf_engine_segment_name(a), &peer),
                     KVF_ERR_AUTH);
    memcpy(val, kv->val, kv->len);
    val[kv->len - 1] ^= 1;
    assert_int_equal(kvf_etcd_put(e, key, val, kv->len, 0, NULL), KVF_OK);
    assert_int_equal(kvf_peer_open(b, kvf_engine_segment_name(a), &peer),
                     KVF_ERR_AUTH);
    /* put back as written: opened */
    assert_int_equal(kvf_etcd_put(e, key, kv->val, kv->len, 0, NULL), KVF_OK);
    assert_int_equal(kvf_peer_open(b, kvf_engine_segment_name(a), &peer),
                     KVF_OK);
    kvf_peer_close(peer);
    free(val);
    kvf_etcd_kvs_free(kv, 1);
    assert_int_equal(kvf_peer_open(b, "nobody:1", &peer),
                     KVF_ERR_PEER_UNREACHABLE);
    kvf_engine_destroy(b);
    kvf_engine_destroy(a);
    kvf_etcd_close(e);
}

/* etcd over https with client certificates and its auth on: kvferry's
 * client with etcd_tls_dir reads and writes, and the leader election
 * (MAC-sealed record) works through it; a certificate of the cluster's
 * CA without the etcd user is refused (KVF_ERR_AUTH); plain http gets
 * nothing. */
static void test_tls_auth(void **state)
{
    kvf_elect_opts_t o = {0};
    char dir[300], val[128];
    kvf_test_etcd_t t;
    kvf_etcd_kv_t *kv;
    kvf_elect_t *el;
    kvf_etcd_t *e;
    uint64_t epoch, t0;

    (void)state;
    assert_int_equal(kvf_test_etcd_start_tls(&t), 0);
    snprintf(dir, sizeof(dir), "%s/tls", t.dir);
    setenv("KVF_ETCD_TLS_DIR", dir, 1);
    e = open_etcd(t.endpoint, 3000);
    assert_int_equal(kvf_etcd_put(e, "/t/tls", "yes", 3, 0, NULL), KVF_OK);
    assert_int_equal(kvf_etcd_get(e, "/t/tls", &kv), KVF_OK);
    assert_int_equal(kv->len, 3);
    assert_memory_equal(kv->val, "yes", 3);
    kvf_etcd_kvs_free(kv, 1);
    kvf_etcd_close(e);
    o.endpoints = t.endpoint;
    o.key = "/t/tls/leader";
    o.value = "127.0.0.1:9";
    o.lease_ms = 2000;
    assert_int_equal(kvf_elect_start(&o, &el), KVF_OK);
    for (t0 = kvf_time_ms(); !kvf_elect_is_leader(el, NULL);) {
        assert_true(kvf_time_ms() - t0 < 5000);
        usleep(20 * 1000);
    }
    assert_int_equal(
        kvf_elect_lookup(t.endpoint, 3000, o.key, val, sizeof(val), &epoch),
        KVF_OK);
    assert_string_equal(val, "127.0.0.1:9");
    kvf_elect_stop(el);
    /* a good certificate, no etcd user: refused */
    snprintf(dir, sizeof(dir), "%s/tls-nobody", t.dir);
    setenv("KVF_ETCD_TLS_DIR", dir, 1);
    e = open_etcd(t.endpoint, 2000);
    assert_int_equal(kvf_etcd_put(e, "/t/tls", "no", 2, 0, NULL), KVF_ERR_AUTH);
    kvf_etcd_close(e);
    /* plain http to the https endpoint: nothing */
    unsetenv("KVF_ETCD_TLS_DIR");
    e = open_etcd(t.endpoint, 2000);
    assert_int_not_equal(kvf_etcd_put(e, "/t/tls", "no", 2, 0, NULL), KVF_OK);
    kvf_etcd_close(e);
    kvf_test_etcd_stop(&t);
}

static void test_dead_target(void **state)
{
    kvf_test_target_t t;
    kvf_etcd_kv_t *kv;
    kvf_etcd_t *e = open_etcd(g_etcd.endpoint, 2000);
    char uri[128], key[256];
    uint64_t t0;
    int st;

    (void)state;
    snprintf(uri, sizeof(uri), "etcd://%s", g_etcd.endpoint);
    setenv("KVF_METADATA", uri, 1);
    setenv("KVF_ETCD_LEASE_MS", "1000", 1);
    assert_int_equal(kvf_test_target_start(&t, 1 << 20, 7, NULL, NULL), 0);
    unsetenv("KVF_METADATA");
    unsetenv("KVF_ETCD_LEASE_MS");
    snprintf(key, sizeof(key), "/kvferry/seg/%s", t.segment);
    assert_int_equal(kvf_etcd_get(e, key, &kv), KVF_OK);
    kvf_etcd_kvs_free(kv, 1);
    kill(t.pid, SIGKILL);
    waitpid(t.pid, &st, 0);
    t0 = kvf_time_ms();
    while (kvf_etcd_get(e, key, &kv) == KVF_OK) {
        kvf_etcd_kvs_free(kv, 1);
        assert_true(kvf_time_ms() - t0 < 5000);
        usleep(100 * 1000);
    }
    printf("SIGKILLed target: descriptor gone after %lu ms (lease 1 s)\n",
           (unsigned long)(kvf_time_ms() - t0));
    kvf_etcd_close(e);
}

static void test_unreachable_at_start(void **state)
{
    kvf_engine_params_t p = {0};
    kvf_engine_h eng = NULL;
    uint64_t t0 = kvf_time_ms();

    (void)state;
    p.field_mask = KVF_ENGINE_PARAM_METADATA | KVF_ENGINE_PARAM_TIMEOUT;
    p.metadata = "etcd://127.0.0.1:1";
    p.timeout_ms = 500;
    assert_int_equal(kvf_engine_create(&p, &eng), KVF_ERR_CONNECT);
    assert_true(kvf_time_ms() - t0 < 1500);
    p.metadata = "zookeeper://x:1";
    assert_int_equal(kvf_engine_create(&p, &eng), KVF_ERR_INVALID_PARAM);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv),
        cmocka_unit_test(test_create),
        cmocka_unit_test(test_lease),
        cmocka_unit_test(test_bad_endpoints),
        cmocka_unit_test(test_etcd_stopped),
        cmocka_unit_test(test_engine_peer),
        cmocka_unit_test(test_bad_descriptors),
        cmocka_unit_test(test_tls_auth),
        cmocka_unit_test(test_dead_target),
        cmocka_unit_test(test_unreachable_at_start),
    };
    int rc;

    rc = kvf_test_etcd_up(&g_etcd);
    if (rc != 0) {
        return rc;
    }
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    kvf_test_etcd_stop(&g_etcd);
    return rc;
}
