/*
 * Hostile tests of authentication, with real processes on 127.0.0.1
 * (target, master, nodes) and the test binary as client or attacker:
 * - a wrong secret: engine peer open, store connect and node
 *   registration fail with KVF_ERR_AUTH (or the node exits);
 * - garbage or a protocol frame instead of the authentication exchange:
 *   the target and the master close the connection without answering,
 *   and still serve a real client;
 * - node hijack: a NODE_REG reusing a live node's segment name from
 *   another instance is refused; the node's 10 objects stay readable;
 * - rogue node: a node or target without the secret cannot register or
 *   be chosen for placement;
 * - HTTP: /metrics and /status answer 401 without the bearer token, 200
 *   with it; /health is open;
 * - binding 0.0.0.0 without a secret is refused (exit status non-zero);
 *   with KVF_INSECURE=1 it starts and warns.
 * Every refusal is followed by a real client being served.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_store_harness.h"
#include "test_util.h"
#include "core/auth.h"
#include "core/sock.h"
#include "core/time.h"
#include "store/proto/msg.h"
#include "store/proto/proto.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_good[256]; /* the secret every process of the test holds */
static char g_bad[256];  /* another one: the stranger's */

static void use_secret(const char *path)
{
    setenv("KVF_SECRET_FILE", path, 1);
    kvf_auth_reset();
}

/* Expects the peer to close fd within 3 s without sending a byte. */
static void expect_closed_silent(int fd)
{
    unsigned char b;

    assert_int_equal(kvf_sock_recv_all(fd, &b, 1, kvf_time_ms() + 3000),
                     KVF_ERR_CONN_RESET);
    close(fd);
}

static kvf_engine_h engine_new(const char *transports)
{
    kvf_engine_params_t p = {0};
    kvf_engine_h e;

    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_TIMEOUT |
                   KVF_ENGINE_PARAM_TRANSPORTS;
    p.no_listen = 1;
    p.timeout_ms = 2000;
    p.transports = transports;
    assert_int_equal(kvf_engine_create(&p, &e), KVF_OK);
    return e;
}

/* Reads 4 KiB of the target's pool and checks it against its seed. */
static void read_target(kvf_test_target_t *t, const char *transports)
{
    static unsigned char want[8192], got[4096];
    kvf_engine_h e = engine_new(transports);
    kvf_region_h r;
    kvf_peer_h peer;
    kvf_op_t op;

    kvf_test_pool_bytes(want, sizeof(want), 7);
    assert_int_equal(kvf_engine_reg(e, got, sizeof(got), KVF_MEM_HOST, 0, &r),
                     KVF_OK);
    assert_int_equal(kvf_peer_open(e, t->segment, &peer), KVF_OK);
    op = (kvf_op_t){KVF_OP_READ, got, peer, t->pool_addr + 1000, 4096};
    assert_int_equal(kvf_transfer_sync(e, &op, 1, 5000), KVF_OK);
    assert_memory_equal(got, want + 1000, 4096);
    kvf_peer_close(peer);
    kvf_engine_dereg(e, r);
    kvf_engine_destroy(e);
}

static void test_engine_wrong_secret(void **state)
{
    const char *const transports[] = {"tcp", "shm"};
    kvf_test_target_t t;
    kvf_peer_h peer;
    kvf_engine_h e;
    size_t i;

    (void)state;
    kvs_bin();
    assert_int_equal(kvf_test_target_start(&t, 1 << 20, 7, NULL, NULL), 0);
    for (i = 0; i < 2; i++) {
        use_secret(g_bad);
        e = engine_new(transports[i]);
        assert_int_equal(kvf_peer_open(e, t.segment, &peer), KVF_ERR_AUTH);
        kvf_engine_destroy(e);
        use_secret(g_good);
        read_target(&t, transports[i]);
    }
    kvf_test_target_stop(&t);
}

static int plain_connect_target(const kvf_test_target_t *t)
{
    char host[64];
    uint16_t port;
    int fd;

    assert_int_equal(kvf_sock_parse_addr(t->segment, host, sizeof(host), &port),
                     KVF_OK);
    assert_int_equal(kvf_sock_connect(host, port, 2000, &fd), KVF_OK);
    return fd;
}

static void test_target_garbage(void **state)
{
    unsigned char junk[KVF_AUTH_MSG_LEN], hdr[KVF_WIRE_HDR_LEN];
    kvf_frame_hdr_t h = {0};
    kvf_test_target_t t;
    int fd;

    (void)state;
    kvs_bin();
    assert_int_equal(kvf_test_target_start(&t, 1 << 20, 7, NULL, NULL), 0);
    memset(junk, 0xa5, sizeof(junk));
    fd = plain_connect_target(&t);
    assert_int_equal(
        kvf_sock_send_all(fd, junk, sizeof(junk), kvf_time_ms() + 2000),
        KVF_OK);
    expect_closed_silent(fd);
    /* the descriptor request (HELLO, type 1) of an unauthenticated peer:
     * nothing about the target (pid, host, addresses) comes back */
    h.magic = KVF_WIRE_MAGIC;
    h.version = KVF_WIRE_VERSION;
    h.type = 1;
    h.id = 1;
    kvf_frame_pack(&h, hdr);
    memcpy(junk, hdr, sizeof(hdr));
    fd = plain_connect_target(&t);
    assert_int_equal(
        kvf_sock_send_all(fd, junk, sizeof(junk), kvf_time_ms() + 2000),
        KVF_OK);
    expect_closed_silent(fd);
    read_target(&t, "tcp");
    kvf_test_target_stop(&t);
}

/* A master and one node (good secret); a client with 10 objects. */
static void store_up(kvs_proc_t *m, kvs_proc_t *n)
{
    assert_int_equal(kvs_master(m, 0, NULL), 0);
    assert_int_equal(kvs_node(n, m->addr, "16M", NULL), 0);
    assert_true(kvs_metric_wait(m->http, "nodes", 1, 5000));
}

static void put_ten(kvs_client_t *c)
{
    char key[32];
    int i;

    for (i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "obj/%d", i);
        kvs_fill(c->buf, 65536, (uint64_t)i + 1);
        assert_int_equal(kvf_store_put(c->st, key, c->buf, 65536, NULL),
                         KVF_OK);
    }
}

/* All 10 objects read back with their bytes. */
static void get_ten(kvs_client_t *c)
{
    static unsigned char want[65536];
    char key[32];
    size_t got;
    int i;

    for (i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "obj/%d", i);
        kvs_fill(want, sizeof(want), (uint64_t)i + 1);
        memset(c->buf, 0, 65536);
        assert_int_equal(kvf_store_get(c->st, key, c->buf, 65536, &got, 0),
                         KVF_OK);
        assert_int_equal(got, 65536);
        assert_memory_equal(c->buf, want, 65536);
    }
}

static void test_store_wrong_secret(void **state)
{
    kvf_store_params_t p = {0};
    kvs_proc_t m, n, rogue;
    kvf_store_h st;
    kvs_client_t c;

    (void)state;
    kvs_bin();
    store_up(&m, &n);
    use_secret(g_bad);
    p.field_mask = KVF_STORE_PARAM_MASTER | KVF_STORE_PARAM_TIMEOUT;
    p.master = m.addr;
    p.timeout_ms = 3000;
    assert_int_equal(kvf_store_connect(&p, &st), KVF_ERR_AUTH);
    /* a node with the stranger's secret: refused, it exits */
    assert_true(kvs_node(&rogue, m.addr, "16M", NULL) != 0);
    use_secret(g_good);
    assert_int_equal(kvs_metric(m.http, "nodes"), 1);
    assert_int_equal(kvs_client_open(&c, m.addr, 65536), 0);
    put_ten(&c);
    get_ten(&c);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

static void test_master_garbage(void **state)
{
    unsigned char junk[KVF_AUTH_MSG_LEN], hdr[KVF_WIRE_HDR_LEN];
    kvf_frame_hdr_t h = {0};
    kvs_proc_t m, n;
    kvs_client_t c;
    int fd;

    (void)state;
    kvs_bin();
    store_up(&m, &n);
    memset(junk, 0x5a, sizeof(junk));
    fd = kvs_plain_connect(m.addr);
    assert_true(fd >= 0);
    assert_int_equal(
        kvf_sock_send_all(fd, junk, sizeof(junk), kvf_time_ms() + 2000),
        KVF_OK);
    expect_closed_silent(fd);
    /* a LIST request instead of the exchange: no keys come back */
    h.magic = KVF_WIRE_MAGIC;
    h.version = KVF_WIRE_VERSION;
    h.type = KVF_SP_LIST;
    h.id = 1;
    kvf_frame_pack(&h, hdr);
    memset(junk, 0, sizeof(junk));
    memcpy(junk, hdr, sizeof(hdr));
    fd = kvs_plain_connect(m.addr);
    assert_true(fd >= 0);
    assert_int_equal(
        kvf_sock_send_all(fd, junk, sizeof(junk), kvf_time_ms() + 2000),
        KVF_OK);
    expect_closed_silent(fd);
    assert_int_equal(kvs_client_open(&c, m.addr, 65536), 0);
    put_ten(&c);
    get_ten(&c);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

/* Sends a NODE_REG on fd; returns the reply's status (1: no reply). */
static int send_node_reg(int fd, const char *segment, uint64_t addr,
                         uint64_t len, int with_instance)
{
    kvf_sp_frame_t f = {0};
    kvf_sm_node_reg_t q = {0};
    kvf_status_t st;
    kvf_wr_t w;

    snprintf(q.segment, sizeof(q.segment), "%s", segment);
    q.uid = 0x726f677565ull;
    q.pool_addr = addr;
    q.pool_len = len;
    memset(q.instance, 0x42, sizeof(q.instance));
    kvf_wr_init(&w);
    kvf_sm_node_reg_enc(&w, &q);
    if (!with_instance) {
        w.len -= KVF_SM_INSTANCE_LEN; /* the older format */
    }
    st = kvf_sp_call(fd, kvf_test_mac(fd), KVF_SP_NODE_REG, 1, 0, &w, &f,
                     kvf_time_ms() + 5000);
    kvf_wr_free(&w);
    kvf_sp_frame_free(&f);
    close(fd);
    return st == KVF_OK ? (int)f.hdr.status : 1;
}

static void test_node_hijack(void **state)
{
    kvs_proc_t m, n;
    kvs_client_t c;
    int rc;

    (void)state;
    kvs_bin();
    store_up(&m, &n);
    assert_true(n.pool_len > 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 65536), 0);
    put_ten(&c);
    /* an insider's process (it holds the secret) claims the live node's
     * segment and pool: refused, the node keeps its objects */
    rc = send_node_reg(kvs_raw_connect(m.addr), n.addr, n.pool_addr, n.pool_len,
                       1);
    assert_int_equal(rc, KVF_ERR_EXISTS);
    /* the older format (no instance id): refused clearly */
    rc = send_node_reg(kvs_raw_connect(m.addr), n.addr, n.pool_addr, n.pool_len,
                       0);
    assert_int_equal(rc, KVF_ERR_VERSION);
    /* a stranger: the master closes before reading the frame */
    rc = send_node_reg(kvs_plain_connect(m.addr), n.addr, n.pool_addr,
                       n.pool_len, 1);
    assert_int_equal(rc, 1);
    assert_int_equal(kvs_metric(m.http, "nodes"), 1);
    assert_int_equal(kvs_metric(m.http, "nodes_lost_total"), 0);
    get_ten(&c);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

static void test_rogue_node(void **state)
{
    kvf_test_target_t t;
    kvs_proc_t m, n, rogue;
    kvs_client_t c;
    int rc;

    (void)state;
    kvs_bin();
    store_up(&m, &n);
    /* a `kvferry target` without the secret, named by an insider's
     * NODE_REG: the master cannot open it, so it is never placed on */
    use_secret(g_bad);
    assert_int_equal(kvf_test_target_start(&t, 16 << 20, 7, NULL, NULL), 0);
    use_secret(g_good);
    rc = send_node_reg(kvs_raw_connect(m.addr), t.segment, t.pool_addr,
                       t.pool_len, 1);
    assert_true(rc != KVF_OK && rc != 1);
    /* a `kvferry node` without the secret */
    setenv("KVF_SECRET_FILE", g_bad, 1);
    assert_true(kvs_node(&rogue, m.addr, "16M", NULL) != 0);
    use_secret(g_good);
    assert_int_equal(kvs_metric(m.http, "nodes"), 1);
    assert_int_equal(kvs_client_open(&c, m.addr, 65536), 0);
    put_ten(&c);
    get_ten(&c);
    kvs_client_close(&c);
    kvf_test_target_stop(&t);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

/* "Bearer " + a 64-hex-character token that is not the real one: all
 * of it wrong (last_only = 0), or the real one with its last character
 * changed. */
static const char *wrong_bearer(int last_only)
{
    static char out[KVF_AUTH_TOKEN_LEN + 16];
    char tok[KVF_AUTH_TOKEN_LEN + 1];
    size_t i;

    assert_int_equal(kvf_auth_http_token("127.0.0.1", tok, sizeof(tok)),
                     KVF_OK);
    assert_int_equal(strlen(tok), KVF_AUTH_TOKEN_LEN);
    for (i = last_only ? KVF_AUTH_TOKEN_LEN - 1 : 0; i < KVF_AUTH_TOKEN_LEN;
         i++) {
        tok[i] = tok[i] == 'a' ? 'b' : 'a';
    }
    snprintf(out, sizeof(out), "Bearer %s", tok);
    return out;
}

static void test_http_token(void **state)
{
    static char buf[65536];
    kvs_proc_t m;

    (void)state;
    kvs_bin();
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_http_auth(m.http, "/status", NULL, buf, sizeof(buf)),
                     401);
    assert_int_equal(kvs_http_auth(m.http, "/metrics", NULL, buf, sizeof(buf)),
                     401);
    assert_int_equal(
        kvs_http_auth(m.http, "/status", "Bearer 0123", buf, sizeof(buf)), 401);
    /* a token of the right length, every character wrong, and one that
     * differs from the real token in its last character only */
    assert_int_equal(
        kvs_http_auth(m.http, "/status", wrong_bearer(0), buf, sizeof(buf)),
        401);
    assert_int_equal(
        kvs_http_auth(m.http, "/metrics", wrong_bearer(1), buf, sizeof(buf)),
        401);
    assert_int_equal(kvs_http_auth(m.http, "/health", NULL, buf, sizeof(buf)),
                     200);
    assert_string_equal(buf, "ok\n");
    assert_int_equal(kvs_http(m.http, "/status", buf, sizeof(buf)), 200);
    assert_true(strncmp(buf, "{\"epoch\":", 9) == 0);
    assert_int_equal(kvs_http(m.http, "/metrics", buf, sizeof(buf)), 200);
    kvs_stop(&m, 0);
}

/* Runs `kvferry ARGS` with no secret file and HOME in a fresh directory
 * (insecure: KVF_INSECURE=1). Returns 0 when it started (printed its
 * line; then stopped), else its exit status; stderr in err. */
static int run_no_secret(const char *const *args, int insecure, char *err,
                         size_t cap)
{
    char home[] = "/tmp/kvf-test-home-XXXXXX", errf[300], line[512];
    char *argv[16];
    int out[2], fd, st, i = 0, rc = -1;
    struct pollfd pfd;
    ssize_t n;
    pid_t pid;

    assert_non_null(mkdtemp(home));
    snprintf(errf, sizeof(errf), "%s/stderr", home);
    argv[i++] = (char *)kvs_bin();
    while (*args != NULL) {
        argv[i++] = (char *)*args++;
    }
    argv[i] = NULL;
    assert_int_equal(pipe(out), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        unsetenv("KVF_SECRET_FILE");
        setenv("HOME", home, 1);
        setenv("KVF_LOG_LEVEL", "warn", 1);
        if (insecure) {
            setenv("KVF_INSECURE", "1", 1);
        }
        fd = open(errf, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, STDERR_FILENO);
        dup2(out[1], STDOUT_FILENO);
        close(out[0]);
        close(out[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(out[1]);
    pfd = (struct pollfd){.fd = out[0], .events = POLLIN};
    n = poll(&pfd, 1, 5000) > 0 ? read(out[0], line, sizeof(line) - 1) : 0;
    if (n > 0) {
        kill(pid, SIGTERM);
        rc = 0;
    }
    close(out[0]);
    waitpid(pid, &st, 0);
    if (n <= 0) {
        rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    }
    fd = open(errf, O_RDONLY);
    n = fd >= 0 ? read(fd, err, cap - 1) : 0;
    err[n > 0 ? n : 0] = '\0';
    if (fd >= 0) {
        close(fd);
    }
    unlink(errf);
    snprintf(errf, sizeof(errf), "%s/.kvferry", home);
    rmdir(errf);
    rmdir(home);
    return rc;
}

static void test_bind_refused(void **state)
{
    static const char *const target[] = {"target", "--listen", "0.0.0.0:0",
                                         "--pool", "1M",       NULL};
    static const char *const master[] = {"master", "--listen",    "0.0.0.0:0",
                                         "--http", "127.0.0.1:0", NULL};
    static char err[8192];

    (void)state;
    kvs_bin();
    assert_true(run_no_secret(target, 0, err, sizeof(err)) != 0);
    assert_non_null(strstr(err, "without a cluster secret"));
    assert_true(run_no_secret(master, 0, err, sizeof(err)) != 0);
    assert_non_null(strstr(err, "without a cluster secret"));
    assert_int_equal(run_no_secret(target, 1, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "insecure=1"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_wrong_secret),
        cmocka_unit_test(test_target_garbage),
        cmocka_unit_test(test_store_wrong_secret),
        cmocka_unit_test(test_master_garbage),
        cmocka_unit_test(test_node_hijack),
        cmocka_unit_test(test_rogue_node),
        cmocka_unit_test(test_http_token),
        cmocka_unit_test(test_bind_refused),
    };
    const char *good = getenv("KVF_SECRET_FILE");

    if (good == NULL || kvf_test_secret_new(g_bad, sizeof(g_bad)) != 0) {
        fprintf(stderr, "no secret files\n");
        return 1;
    }
    snprintf(g_good, sizeof(g_good), "%s", good);
    /* warnings of the refusals are expected: keep the output short */
    setenv("KVF_LOG_LEVEL", "error", 0);
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(g_bad);
    return rc;
}
