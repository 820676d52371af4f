/*
 * Integration test of the master connection over the abstract unix
 * socket, with real processes on 127.0.0.1 (a master, a node, clients):
 * - a client of a loopback master goes over unix (kvf_store_master_link,
 *   the master's connections_unix gauge and /status), over tcp when
 *   KVF_MASTER_UNIX=0 or when its engine is forced onto tcp
 *   (KVF_TRANSPORTS=tcp, or transports "tcp" in its parameters);
 * - values put over one kind are read back byte for byte over the
 *   other, both ways, single and batch;
 * - garbage on the unix socket (bad magic, version, length, a cut frame,
 *   an unknown type) is answered as on tcp, and the master keeps serving;
 * - descriptors, allocations and the master's connection gauges come back
 *   to their baseline.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_store_harness.h"
#include "test_util.h"
#include "store/proto/proto.h"
#include "core/auth.h"
#include "core/sock.h"
#include "core/time.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define KiB 1024
#define MiB (1024 * 1024)

static kvs_proc_t g_master, g_node;
static char g_unix[96];

static int setup(void **state)
{
    char host[KVF_HOST_MAX];
    uint16_t port;

    (void)state;
    kvs_bin();
    unsetenv("KVF_MASTER_UNIX");
    unsetenv("KVF_TRANSPORTS");
    setenv("KVF_STORE_TIMEOUT_MS", "1000", 1); /* the master's frame bound */
    if (kvs_master(&g_master, 0, NULL) != 0) {
        return -1;
    }
    unsetenv("KVF_STORE_TIMEOUT_MS");
    if (kvs_node(&g_node, g_master.addr, "64M", NULL) != 0) {
        return -1;
    }
    if (kvf_sock_parse_addr(g_master.addr, host, sizeof(host), &port) !=
            KVF_OK ||
        !kvf_sp_unix_name(host, port, 0, g_unix, sizeof(g_unix))) {
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvs_stop(&g_node, 0);
    kvs_stop(&g_master, 0);
    return 0;
}

/* A client of the master; env_unix/env_tp set KVF_MASTER_UNIX and
 * KVF_TRANSPORTS while it connects (NULL = unset). */
static void open_with(kvs_client_t *c, const char *env_unix, const char *env_tp)
{
    if (env_unix != NULL) {
        setenv("KVF_MASTER_UNIX", env_unix, 1);
    }
    if (env_tp != NULL) {
        setenv("KVF_TRANSPORTS", env_tp, 1);
    }
    assert_int_equal(kvs_client_open(c, g_master.addr, 4 * MiB), 0);
    unsetenv("KVF_MASTER_UNIX");
    unsetenv("KVF_TRANSPORTS");
}

static void test_link_choice(void **state)
{
    kvf_store_params_t p = {0};
    long u0, t0;
    kvs_client_t c;
    kvf_store_h st;
    char body[4096];

    (void)state;
    u0 = kvs_metric(g_master.http, "connections_unix");
    t0 = kvs_metric(g_master.http, "connections_tcp");
    assert_true(u0 >= 0 && t0 >= 1); /* the node's connection */
    assert_int_equal(kvs_http(g_master.http, "/status", body, sizeof(body)),
                     200);
    assert_non_null(strstr(body, g_unix));

    open_with(&c, NULL, NULL);
    assert_string_equal(kvf_store_master_link(c.st), "unix");
    assert_true(
        kvs_metric_wait(g_master.http, "connections_unix", u0 + 1, 2000));
    assert_int_equal(kvs_metric(g_master.http, "connections_tcp"), t0);
    assert_int_equal(kvs_http(g_master.http, "/status", body, sizeof(body)),
                     200);
    assert_non_null(strstr(body, "\"connections\":{\"tcp\":"));
    kvs_client_close(&c);
    assert_true(kvs_metric_wait(g_master.http, "connections_unix", u0, 2000));

    /* switched off */
    open_with(&c, "0", NULL);
    assert_string_equal(kvf_store_master_link(c.st), "tcp");
    assert_true(
        kvs_metric_wait(g_master.http, "connections_tcp", t0 + 1, 2000));
    assert_int_equal(kvs_metric(g_master.http, "connections_unix"), u0);
    kvs_client_close(&c);

    /* engine forced onto tcp: the master stays on tcp too */
    open_with(&c, NULL, "tcp");
    assert_string_equal(kvf_store_master_link(c.st), "tcp");
    assert_int_equal(kvs_metric(g_master.http, "connections_unix"), u0);
    kvs_client_close(&c);
    p.field_mask = KVF_STORE_PARAM_MASTER | KVF_STORE_PARAM_TRANSPORTS;
    p.master = g_master.addr;
    p.transports = "tcp";
    assert_int_equal(kvf_store_connect(&p, &st), KVF_OK);
    assert_string_equal(kvf_store_master_link(st), "tcp");
    kvf_store_disconnect(st);
    /* a same-host transport listed: unix */
    p.transports = "shm,tcp";
    assert_int_equal(kvf_store_connect(&p, &st), KVF_OK);
    assert_string_equal(kvf_store_master_link(st), "unix");
    kvf_store_disconnect(st);
    assert_true(kvs_metric_wait(g_master.http, "connections_tcp", t0, 2000));
    assert_true(kvs_metric_wait(g_master.http, "connections_unix", u0, 2000));
}

/* Puts through `from`, reads through `to` (into the upper half of its
 * buffer), byte for byte; from and to may be the same client. */
static void cross(kvs_client_t *from, kvs_client_t *to, const char *tag,
                  uint64_t seed)
{
    static const size_t sizes[] = {1, 4 * KiB, 64 * KiB, 1 * MiB + 13};
    unsigned char *ref = malloc(MiB + 13), *dst = to->buf + 2 * MiB;
    const char *keys[4];
    void *bufs[4];
    size_t lens[4];
    kvf_status_t sts[4];
    char key[4][64];
    size_t i, got, off;

    assert_non_null(ref);
    for (i = 0; i < 4; i++) {
        snprintf(key[i], sizeof(key[i]), "unix/%s/%zu", tag, i);
        kvs_fill(from->buf, sizes[i], seed + i);
        assert_int_equal(
            kvf_store_put(from->st, key[i], from->buf, sizes[i], NULL), KVF_OK);
        memset(dst, 0, sizes[i]);
        assert_int_equal(kvf_store_get(to->st, key[i], dst, 2 * MiB, &got, 0),
                         KVF_OK);
        assert_int_equal(got, sizes[i]);
        kvs_fill(ref, sizes[i], seed + i);
        assert_memory_equal(ref, dst, sizes[i]);
    }
    /* the batch form, into one buffer */
    for (i = 0, off = 0; i < 4; i++) {
        keys[i] = key[i];
        bufs[i] = dst + off;
        off += sizes[i];
    }
    memset(dst, 0, off);
    assert_int_equal(
        kvf_store_get_batch(to->st, 4, keys, bufs, sizes, lens, 0, sts),
        KVF_OK);
    for (i = 0, off = 0; i < 4; i++) {
        assert_int_equal(sts[i], KVF_OK);
        assert_int_equal(lens[i], sizes[i]);
        kvs_fill(ref, sizes[i], seed + i);
        assert_memory_equal(ref, dst + off, sizes[i]);
        off += sizes[i];
    }
    for (i = 0; i < 4; i++) {
        assert_int_equal(kvf_store_remove(from->st, key[i]), KVF_OK);
        assert_int_equal(kvf_store_exists(to->st, key[i]), KVF_ERR_NO_KEY);
    }
    free(ref);
}

static void test_round_trips(void **state)
{
    kvs_client_t u, t;

    (void)state;
    open_with(&u, NULL, NULL);
    open_with(&t, "0", NULL);
    assert_string_equal(kvf_store_master_link(u.st), "unix");
    assert_string_equal(kvf_store_master_link(t.st), "tcp");
    cross(&u, &t, "u2t", 100);
    cross(&t, &u, "t2u", 200);
    cross(&u, &u, "u2u", 300);
    kvs_client_close(&u);
    kvs_client_close(&t);
}

/* Raw bytes on the unix socket; the reply's status (1: none, 0: closed
 * early on purpose). */
/* A connection on the master's unix socket, authenticated. */
static int unix_open(void)
{
    int fd;

    assert_int_equal(kvf_sp_unix_connect(g_unix, &fd), KVF_OK);
    kvf_wire_mac_free(kvf_test_mac(fd));
    assert_int_equal(kvf_auth_client(fd, "127.0.0.1", "store", "master",
                                     kvf_time_ms() + 2000, kvf_test_mac(fd)),
                     KVF_OK);
    return fd;
}

/* A whole frame (header and body in buf) with its tag: the reply's
 * status, or 1 when the master closed without one. */
static int unix_sealed(const unsigned char *buf, size_t len)
{
    unsigned char tag[KVF_WIRE_TAG_LEN];
    kvf_sp_frame_t f = {0};
    kvf_status_t st;
    int fd, rc;

    fd = unix_open();
    kvf_wire_mac_seal(kvf_test_mac(fd), buf, buf + KVF_WIRE_HDR_LEN,
                      len - KVF_WIRE_HDR_LEN, tag);
    assert_int_equal(kvf_sock_send_all(fd, buf, len, kvf_time_ms() + 2000),
                     KVF_OK);
    assert_int_equal(
        kvf_sock_send_all(fd, tag, sizeof(tag), kvf_time_ms() + 2000), KVF_OK);
    st = kvf_sp_recv(fd, kvf_test_mac(fd), &f, kvf_time_ms() + 3000,
                     kvf_time_ms() + 3000);
    rc = (st == KVF_OK) ? f.hdr.status : 1;
    kvf_sp_frame_free(&f);
    close(fd);
    return rc;
}

static int unix_bytes(const void *buf, size_t len, int close_early)
{
    kvf_sp_frame_t f = {0};
    kvf_status_t st;
    int fd, rc;

    fd = unix_open();
    assert_int_equal(kvf_sock_send_all(fd, buf, len, kvf_time_ms() + 2000),
                     KVF_OK);
    if (close_early) {
        close(fd);
        return 0;
    }
    st = kvf_sp_recv(fd, kvf_test_mac(fd), &f, kvf_time_ms() + 3000,
                     kvf_time_ms() + 3000);
    rc = (st == KVF_OK) ? f.hdr.status : 1;
    kvf_sp_frame_free(&f);
    close(fd);
    return rc;
}

static void hdr_bytes(unsigned char out[KVF_WIRE_HDR_LEN], uint8_t version,
                      uint8_t type, uint32_t meta, uint32_t count,
                      uint64_t data)
{
    kvf_frame_hdr_t h = {0};

    h.magic = KVF_WIRE_MAGIC;
    h.version = version;
    h.type = type;
    h.meta_len = meta;
    h.count = count;
    h.data_len = data;
    h.id = 1;
    kvf_frame_pack(&h, out);
}

static void test_garbage(void **state)
{
    unsigned char junk[64], hdr[KVF_WIRE_HDR_LEN], frame[256];
    kvf_sp_frame_t f = {0};
    long errors0, u0;
    kvs_client_t c;
    size_t got;
    kvf_wr_t w;
    kvf_rd_t r;
    int fd;

    (void)state;
    errors0 = kvs_metric(g_master.http, "errors_total");
    u0 = kvs_metric(g_master.http, "connections_unix");
    kvs_fill(junk, sizeof(junk), 77);
    assert_int_equal(unix_bytes(junk, sizeof(junk), 0), KVF_ERR_PROTOCOL);
    hdr_bytes(hdr, 9, KVF_SP_GET, 0, 0, 0);
    assert_int_equal(unix_bytes(hdr, sizeof(hdr), 0), KVF_ERR_VERSION);
    hdr_bytes(hdr, KVF_WIRE_VERSION, KVF_SP_GET, 100u << 20, 1, 0);
    assert_int_equal(unix_bytes(hdr, sizeof(hdr), 0), KVF_ERR_MSG_TOO_LARGE);
    hdr_bytes(hdr, KVF_WIRE_VERSION, KVF_SP_GET, 0, 0, 4096);
    assert_int_equal(unix_bytes(hdr, sizeof(hdr), 0), KVF_ERR_MSG_TOO_LARGE);
    hdr_bytes(hdr, KVF_WIRE_VERSION, KVF_SP_GET, 0, 5, 0);
    assert_int_equal(unix_sealed(hdr, sizeof(hdr)), KVF_ERR_PROTOCOL);
    /* cut short, then gone */
    hdr_bytes(frame, KVF_WIRE_VERSION, KVF_SP_GET, 100, 1, 0);
    assert_int_equal(unix_bytes(frame, KVF_WIRE_HDR_LEN + 10, 1), 0);
    /* cut short and left open: closed after the master's bound (1 s) */
    fd = unix_open();
    assert_int_equal(kvf_sock_send_all(fd, frame, KVF_WIRE_HDR_LEN + 10,
                                       kvf_time_ms() + 2000),
                     KVF_OK);
    assert_int_equal(kvf_sock_wait(fd, POLLIN, kvf_time_ms() + 4000), KVF_OK);
    assert_true(recv(fd, junk, sizeof(junk), 0) <= 0);
    close(fd);
    /* unknown type: an error reply, and the connection goes on */
    fd = unix_open();
    assert_int_equal(kvf_sp_call(fd, kvf_test_mac(fd), 0x30, 7, 0, NULL, &f,
                                 kvf_time_ms() + 2000),
                     KVF_ERR_PROTOCOL);
    kvf_wr_init(&w);
    kvf_wr_str(&w, "nothing");
    assert_int_equal(kvf_sp_call(fd, kvf_test_mac(fd), KVF_SP_EXISTS, 8, 1, &w,
                                 &f, kvf_time_ms() + 2000),
                     KVF_OK);
    kvf_rd_init(&r, f.body, f.hdr.meta_len);
    assert_int_equal((int32_t)kvf_rd_u32(&r), KVF_ERR_NO_KEY);
    kvf_wr_free(&w);
    kvf_sp_frame_free(&f);
    close(fd);
    assert_true(kvs_metric(g_master.http, "errors_total") >= errors0 + 7);
    assert_true(kvs_metric_wait(g_master.http, "connections_unix", u0, 3000));
    /* and the master serves, over unix */
    open_with(&c, NULL, NULL);
    assert_string_equal(kvf_store_master_link(c.st), "unix");
    kvs_fill(c.buf, 65536, 9);
    assert_int_equal(kvf_store_put(c.st, "unix/ok", c.buf, 65536, NULL),
                     KVF_OK);
    assert_int_equal(
        kvf_store_get(c.st, "unix/ok", c.buf + 65536, 65536, &got, 0), KVF_OK);
    assert_memory_equal(c.buf, c.buf + 65536, 65536);
    assert_int_equal(kvf_store_remove(c.st, "unix/ok"), KVF_OK);
    kvs_client_close(&c);
}

static void test_baseline(void **state)
{
    long blocks0, bytes0, blocks1, bytes1, u0, t0;
    int fds0, i;
    kvs_client_t c;
    size_t got;

    (void)state;
    /* warm once: thread-local and lazily made state */
    open_with(&c, NULL, NULL);
    kvs_client_close(&c);
    open_with(&c, "0", NULL);
    kvs_client_close(&c);
    fds0 = kvf_test_fd_count();
    kvf_alloc_stats(&blocks0, &bytes0);
    /* the baseline once the master has seen the warm-up clients go (no
     * client is open now; the node keeps its one tcp connection): read at
     * once, it could still count a warm-up connection (seen under ASan) */
    assert_true(kvs_metric_wait(g_master.http, "connections_unix", 0, 2000));
    assert_true(kvs_metric_wait(g_master.http, "connections_tcp", 1, 2000));
    u0 = kvs_metric(g_master.http, "connections_unix");
    t0 = kvs_metric(g_master.http, "connections_tcp");
    for (i = 0; i < 4; i++) {
        open_with(&c, (i & 1) ? "0" : NULL, NULL);
        kvs_fill(c.buf, 65536, (uint64_t)i);
        assert_int_equal(kvf_store_put(c.st, "unix/leak", c.buf, 65536, NULL),
                         KVF_OK);
        assert_int_equal(
            kvf_store_get(c.st, "unix/leak", c.buf + 65536, 65536, &got, 0),
            KVF_OK);
        assert_memory_equal(c.buf, c.buf + 65536, 65536);
        assert_int_equal(kvf_store_remove(c.st, "unix/leak"), KVF_OK);
        kvs_client_close(&c);
    }
    assert_int_equal(kvf_test_fd_count(), fds0);
    kvf_alloc_stats(&blocks1, &bytes1);
    assert_int_equal(blocks1, blocks0);
    assert_int_equal(bytes1, bytes0);
    assert_true(kvs_metric_wait(g_master.http, "connections_unix", u0, 2000));
    assert_true(kvs_metric_wait(g_master.http, "connections_tcp", t0, 2000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_link_choice),
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_baseline),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
