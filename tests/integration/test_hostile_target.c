/*
 * Hostile clients against the engine's targets (real `kvferry target`
 * processes): a checksum request over the limits is refused and one the
 * peer walks away from stops; a WRITE naming a refused 1 TiB entry costs
 * no memory; a flood of idle connections from one address leaves others
 * served and threads bounded; idle connections are closed and clients
 * reconnect by themselves; connections that never finish the
 * authentication exchange are closed at its deadline; out of
 * descriptors, the accept loop backs off and serves again once some are
 * free; crafted frames (truncated, oversize counts, unknown types) are
 * refused. After each attack a real client moves verified bytes.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <pthread.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <kvferry/kvferry.h>

#include "core/auth.h"
#include "core/sock.h"
#include "core/time.h"
#include "core/wire.h"
#include "engine/engine_int.h"
#include "transport/shm/shm.h"
#include "transport/tcp/msg.h"
#include "test_util.h"

#define POOL (32u << 20)
#define SEED 23

static kvf_engine_h new_engine(void)
{
    kvf_engine_params_t p = {0};
    kvf_engine_h e;

    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_TIMEOUT |
                   KVF_ENGINE_PARAM_CONNS;
    p.no_listen = 1;
    p.timeout_ms = 3000;
    p.conns = 2;
    assert_int_equal(kvf_engine_create(&p, &e), KVF_OK);
    return e;
}

/* Writes then reads back a block through peer and checks the bytes. */
static void move_verified(kvf_engine_h e, kvf_peer_h peer, uint64_t remote,
                          unsigned char *buf, size_t len, unsigned salt)
{
    kvf_op_t op;
    size_t i;

    for (i = 0; i < len; i++) {
        buf[i] = (unsigned char)(i * 7 + salt);
    }
    op = (kvf_op_t){KVF_OP_WRITE, buf, peer, remote, len};
    assert_int_equal(kvf_transfer_sync(e, &op, 1, 5000), KVF_OK);
    memset(buf, 0, len);
    op = (kvf_op_t){KVF_OP_READ, buf, peer, remote, len};
    assert_int_equal(kvf_transfer_sync(e, &op, 1, 5000), KVF_OK);
    for (i = 0; i < len; i++) {
        assert_int_equal(buf[i], (unsigned char)(i * 7 + salt));
    }
}

/* A real client opens a peer and moves verified bytes; returns the ms it
 * took. */
static uint64_t check_serving(const kvf_test_target_t *t)
{
    uint64_t t0 = kvf_time_ms();
    unsigned char got[4096];
    kvf_engine_h e = new_engine();
    kvf_region_h r;
    kvf_peer_h peer;

    assert_int_equal(kvf_engine_reg(e, got, sizeof(got), KVF_MEM_HOST, 0, &r),
                     KVF_OK);
    assert_int_equal(kvf_peer_open(e, t->segment, &peer), KVF_OK);
    move_verified(e, peer, t->pool_addr + 8192, got, sizeof(got), 3);
    kvf_peer_close(peer);
    kvf_engine_dereg(e, r);
    kvf_engine_destroy(e);
    return kvf_time_ms() - t0;
}

static int raw_connect_from(const kvf_test_target_t *t, const char *from)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    char host[64];
    uint16_t port;
    int fd;

    assert_int_equal(kvf_sock_parse_addr(t->segment, host, sizeof(host), &port),
                     KVF_OK);
    if (from == NULL) {
        /* past authentication: what a holder of the secret can send */
        assert_int_equal(kvf_test_connect(host, port, 2000, "tcp", &fd),
                         KVF_OK);
        return fd;
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    inet_pton(AF_INET, from, &a.sin_addr);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    a.sin_port = htons(port);
    inet_pton(AF_INET, host, &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int raw_connect(const kvf_test_target_t *t)
{
    return raw_connect_from(t, NULL);
}

/* Sends a frame header and count entries (addr, len each), with its
 * tag (the connection's, as a holder of the secret sends it). */
static void send_frame(int fd, uint8_t type, uint32_t count, uint64_t data_len,
                       uint64_t addr, uint64_t len)
{
    kvf_wr_t w;
    uint32_t i;

    unsigned char hb[KVF_WIRE_HDR_LEN], tag[KVF_WIRE_TAG_LEN];
    kvf_frame_hdr_t h;

    kvf_wr_init(&w);
    for (i = 0; i < count; i++) {
        kvf_tcp_entry_enc(&w, addr, len);
    }
    kvf_tcp_hdr_init(&h, type, 1, KVF_OK, count, data_len);
    kvf_frame_pack(&h, hb);
    kvf_wire_mac_seal(kvf_test_mac(fd), hb, w.buf, w.len, tag);
    kvf_sock_send_all(fd, hb, sizeof(hb), kvf_time_ms() + 2000);
    kvf_sock_send_all(fd, w.buf, w.len, kvf_time_ms() + 2000);
    kvf_sock_send_all(fd, tag, sizeof(tag), kvf_time_ms() + 2000);
    kvf_wr_free(&w);
}

/* A reply's header and metadata (left unread: the caller skips it), its
 * tag checked when it has no metadata. */
static kvf_frame_hdr_t recv_reply(int fd)
{
    unsigned char hb[KVF_WIRE_HDR_LEN], tag[KVF_WIRE_TAG_LEN];
    kvf_frame_hdr_t h;

    assert_int_equal(
        kvf_sock_recv_all(fd, hb, sizeof(hb), kvf_time_ms() + 3000), KVF_OK);
    assert_int_equal(kvf_frame_unpack(hb, &h), KVF_OK);
    if (h.meta_len == 0) {
        assert_int_equal(
            kvf_sock_recv_all(fd, tag, sizeof(tag), kvf_time_ms() + 3000),
            KVF_OK);
        assert_int_equal(
            kvf_wire_mac_check(kvf_test_mac(fd), hb, NULL, 0, tag, "test"),
            KVF_OK);
    }
    return h;
}

/* Sum of utime and stime of pid, in clock ticks. */
static uint64_t cpu_ticks(pid_t pid)
{
    char path[64], buf[1024], *p;
    unsigned long ut = 0, st = 0;
    FILE *f;
    size_t n;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    assert_non_null(f);
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    p = strrchr(buf, ')');
    assert_non_null(p);
    /* after ") ": state is field 3; utime, stime are fields 14, 15 */
    assert_int_equal(sscanf(p + 2,
                            "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
                            "%lu %lu",
                            &ut, &st),
                     2);
    return ut + st;
}

/* Percent of one core pid used over ms milliseconds. */
static double cpu_percent(pid_t pid, unsigned ms)
{
    uint64_t a = cpu_ticks(pid), b;

    usleep(ms * 1000);
    b = cpu_ticks(pid);
    return 100.0 * (double)(b - a) / (double)sysconf(_SC_CLK_TCK) /
           (ms / 1000.0);
}

static long status_field(pid_t pid, const char *key)
{
    char path[64], line[256];
    long v = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, key, strlen(key)) == 0) {
            v = strtol(line + strlen(key), NULL, 10);
        }
    }
    fclose(f);
    return v;
}

static int nthreads(pid_t pid)
{
    return (int)status_field(pid, "Threads:");
}

/* The fewest threads of pid over 3 looks 30 ms apart: threads of
 * connections the target dropped are still ending at the first look on
 * a loaded machine (more so under ASan), while held connections keep
 * theirs at every look. */
static int nthreads_settled(pid_t pid)
{
    int k, th, best = nthreads(pid);

    for (k = 0; k < 2; k++) {
        usleep(30 * 1000);
        th = nthreads(pid);
        best = th < best ? th : best;
    }
    return best;
}

static int start_target(kvf_test_target_t *t)
{
    setenv("KVF_TRANSPORTS", "tcp", 1);
    return kvf_test_target_start(t, POOL, SEED, NULL, NULL);
}

/* SUM over the limits: refused with a status before any work. */
static void test_sum_limits(void **state)
{
    kvf_test_target_t t;
    kvf_frame_hdr_t h;
    uint64_t t0;
    int fd;

    (void)state;
    assert_int_equal(start_target(&t), 0);
    fd = raw_connect(&t);
    t0 = kvf_time_ms();
    send_frame(fd, KVF_TCP_SUM, 5000, 0, t.pool_addr, 4096);
    h = recv_reply(fd);
    assert_int_equal(h.type, KVF_TCP_SUM_RESP);
    assert_int_equal(h.status, KVF_ERR_MSG_TOO_LARGE);
    /* whole pool 64 times: 2 GiB, over sum_max_bytes */
    send_frame(fd, KVF_TCP_SUM, 64, 0, t.pool_addr, POOL);
    h = recv_reply(fd);
    assert_int_equal(h.status, KVF_ERR_MSG_TOO_LARGE);
    assert_true(kvf_time_ms() - t0 < 1000);
    /* within the limits: served on the same connection */
    send_frame(fd, KVF_TCP_SUM, 2, 0, t.pool_addr, 4096);
    h = recv_reply(fd);
    assert_int_equal(h.status, KVF_OK);
    assert_int_equal(h.count, 2);
    close(fd);
    check_serving(&t);
    assert_int_equal(kvf_test_target_stop(&t), 0);
}

/* The same limits on the shm target, through a real client. */
static void test_sum_limits_shm(void **state)
{
    unsigned char *pool = malloc(POOL);
    uint64_t remote[16], sums[16];
    size_t lengths[16];
    kvf_test_target_t t;
    kvf_peer_h peer;
    kvf_engine_h e;
    int i;

    (void)state;
    assert_non_null(pool);
    setenv("KVF_SUM_MAX_ENTRIES", "8", 1);
    setenv("KVF_SUM_MAX_BYTES", "1M", 1);
    setenv("KVF_TRANSPORTS", "shm", 1);
    assert_int_equal(kvf_test_target_start(&t, POOL, SEED, NULL, NULL), 0);
    unsetenv("KVF_SUM_MAX_ENTRIES");
    unsetenv("KVF_SUM_MAX_BYTES");
    kvf_test_pool_bytes(pool, POOL, SEED);
    e = new_engine();
    assert_int_equal(kvf_peer_open(e, t.segment, &peer), KVF_OK);
    assert_string_equal(kvf_peer_transport(peer), "shm");
    for (i = 0; i < 16; i++) {
        remote[i] = t.pool_addr + (uint64_t)i * 4096;
        lengths[i] = 4096;
    }
    assert_int_equal(kvf_peer_checksum(peer, remote, lengths, 4, sums), KVF_OK);
    for (i = 0; i < 4; i++) {
        assert_true(sums[i] == kvf_checksum(pool + (size_t)i * 4096, 4096));
    }
    assert_int_equal(kvf_peer_checksum(peer, remote, lengths, 16, sums),
                     KVF_ERR_MSG_TOO_LARGE);
    lengths[0] = lengths[1] = 1u << 20;
    assert_int_equal(kvf_peer_checksum(peer, remote, lengths, 2, sums),
                     KVF_ERR_MSG_TOO_LARGE);
    kvf_peer_close(peer);
    kvf_engine_destroy(e);
    check_serving(&t);
    assert_int_equal(kvf_test_target_stop(&t), 0);
    setenv("KVF_TRANSPORTS", "tcp", 1);
    free(pool);
}

/* A SUM the peer walks away from stops; the stop is not held up. */
static void test_sum_cancel(void **state)
{
    kvf_test_target_t t;
    uint64_t t0;
    double cpu;
    int fd;

    (void)state;
    setenv("KVF_SUM_MAX_ENTRIES", "100000", 1);
    setenv("KVF_SUM_MAX_BYTES", "4T", 1);
    assert_int_equal(start_target(&t), 0);
    unsetenv("KVF_SUM_MAX_ENTRIES");
    unsetenv("KVF_SUM_MAX_BYTES");
    fd = raw_connect(&t);
    /* 100000 x 32 MiB: minutes of hashing if it were not cancelled */
    send_frame(fd, KVF_TCP_SUM, 100000, 0, t.pool_addr, POOL);
    usleep(300 * 1000);
    close(fd);
    usleep(500 * 1000);
    cpu = cpu_percent(t.pid, 1000);
    print_message("target cpu after the peer left: %.1f %%\n", cpu);
    assert_true(cpu < 10.0);
    check_serving(&t);
    /* again, and stop the target while it hashes */
    fd = raw_connect(&t);
    send_frame(fd, KVF_TCP_SUM, 100000, 0, t.pool_addr, POOL);
    usleep(300 * 1000);
    t0 = kvf_time_ms();
    assert_int_equal(kvf_test_target_stop(&t), 0);
    print_message("stop during a SUM took %lu ms\n",
                  (unsigned long)(kvf_time_ms() - t0));
    assert_true(kvf_time_ms() - t0 < 2000);
    close(fd);
}

/* A 56-byte WRITE naming a refused 1 TiB entry costs no memory. */
static void test_write_drain(void **state)
{
    kvf_test_target_t t;
    long rss0, rss1;
    int fd;

    (void)state;
    assert_int_equal(start_target(&t), 0);
    rss0 = status_field(t.pid, "VmRSS:");
    fd = raw_connect(&t);
    send_frame(fd, KVF_TCP_WRITE, 1, 1ull << 40, 0x1000, 1ull << 40);
    usleep(1000 * 1000);
    rss1 = status_field(t.pid, "VmRSS:");
    print_message("target rss %ld -> %ld KiB\n", rss0, rss1);
    assert_true(rss1 - rss0 < 8 * 1024);
    assert_true(check_serving(&t) < 1000);
    /* the entry's length is what the frame says is coming: a lie (less
     * payload, then silence) ends that connection at its timeout */
    close(fd);
    check_serving(&t);
    assert_int_equal(kvf_test_target_stop(&t), 0);
}

static void raise_nofile(rlim_t want)
{
    struct rlimit rl;

    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < want) {
        rl.rlim_cur = (rl.rlim_max < want) ? rl.rlim_max : want;
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
    }
}

/* 2000 idle connections from 127.0.0.2: a client from 127.0.0.1 is
 * served within 1 s, the target's threads stay bounded. */
static void test_conn_flood(void **state)
{
    enum { FLOOD = 2000 };
    static int fds[FLOOD];
    kvf_test_target_t t;
    int i, n = 0, th0, th1;
    uint64_t ms;

    (void)state;
    raise_nofile(FLOOD + 256);
    assert_int_equal(start_target(&t), 0);
    th0 = nthreads(t.pid);
    for (i = 0; i < FLOOD; i++) {
        fds[i] = raw_connect_from(&t, "127.0.0.2");
        n += (fds[i] >= 0);
    }
    usleep(500 * 1000);
    th1 = nthreads(t.pid);
    print_message("%d connections made; target threads %d -> %d\n", n, th0,
                  th1);
    assert_true(th1 <= th0 + 256 + 8); /* conns_per_addr */
    ms = check_serving(&t);
    print_message("a client from 127.0.0.1 served in %lu ms\n",
                  (unsigned long)ms);
    assert_true(ms < 1000);
    for (i = 0; i < FLOOD; i++) {
        if (fds[i] >= 0) {
            close(fds[i]);
        }
    }
    check_serving(&t);
    assert_int_equal(kvf_test_target_stop(&t), 0);
}

/* Keeps naddr x per connections that never authenticate open to t from
 * 127.0.0.2, .3, ... (reopening what the target dropped), and 12 times
 * has a real client from 127.0.0.1 open a peer and move verified bytes.
 * Returns the target's largest thread count seen. */
static int unauth_flood(const kvf_test_target_t *t, int naddr, int per)
{
    enum { ROUNDS = 12 };
    static int fds[16][256];
    int a, i, r, open_now, th, thmax = 0;
    uint64_t ms, msmax = 0;
    char from[32], b;

    memset(fds, -1, sizeof(fds));
    for (r = 0; r < ROUNDS; r++) {
        open_now = 0;
        for (a = 0; a < naddr; a++) {
            snprintf(from, sizeof(from), "127.0.0.%d", a + 2);
            for (i = 0; i < per; i++) {
                if (fds[a][i] >= 0 &&
                    recv(fds[a][i], &b, 1, MSG_DONTWAIT) < 0 &&
                    errno == EAGAIN) {
                    open_now++;
                    continue; /* still held open by the target */
                }
                if (fds[a][i] >= 0) {
                    close(fds[a][i]);
                }
                fds[a][i] = raw_connect_from(t, from);
            }
        }
        th = nthreads_settled(t->pid);
        thmax = th > thmax ? th : thmax;
        ms = check_serving(t); /* asserts that it is served */
        msmax = ms > msmax ? ms : msmax;
        print_message("%d x %d, round %d: %d flood connections held open, "
                      "target threads %d, client served in %lu ms\n",
                      naddr, per, r, open_now, th, (unsigned long)ms);
    }
    print_message("flood of %d addresses x %d: a client served %d of %d "
                  "times, slowest %lu ms\n",
                  naddr, per, ROUNDS, ROUNDS, (unsigned long)msmax);
    for (a = 0; a < naddr; a++) {
        for (i = 0; i < per; i++) {
            if (fds[a][i] >= 0) {
                close(fds[a][i]);
            }
        }
    }
    return thmax;
}

/* 256 connections that never authenticate from each of 4 addresses
 * (1024, what filled conns_max before the unauthenticated budget), then
 * 16 from each of 16 (past conns_unauth_max: the oldest are dropped): a
 * real client is served every time, and the target's threads stay
 * within the unauthenticated budget. */
static void test_unauth_flood(void **state)
{
    kvf_test_target_t t;
    int th0, th;

    (void)state;
    raise_nofile(16 * 256 + 512);
    assert_int_equal(start_target(&t), 0);
    th0 = nthreads(t.pid);
    th = unauth_flood(&t, 4, 256);
    assert_true(th <= th0 + 4 * 16 + 16); /* conns_unauth_per_addr */
    /* conns_unauth_max, plus dropped ones whose threads are ending */
    th = unauth_flood(&t, 16, 16);
    assert_true(th <= th0 + 128 + 64);
    check_serving(&t);
    assert_int_equal(kvf_test_target_stop(&t), 0);
}

/* Idle connections are closed; a client whose pooled connections were
 * closed reconnects by itself (tcp, then shm). */
static void idle_one(const char *transport)
{
    unsigned char buf[8192];
    kvf_test_target_t t;
    kvf_region_h r;
    kvf_peer_h peer;
    kvf_engine_h e;
    char b;
    int fd;

    setenv("KVF_IDLE_TIMEOUT_MS", "300", 1);
    setenv("KVF_TRANSPORTS", transport, 1);
    assert_int_equal(kvf_test_target_start(&t, POOL, SEED, NULL, NULL), 0);
    unsetenv("KVF_IDLE_TIMEOUT_MS");
    e = new_engine();
    assert_int_equal(kvf_engine_reg(e, buf, sizeof(buf), KVF_MEM_HOST, 0, &r),
                     KVF_OK);
    assert_int_equal(kvf_peer_open(e, t.segment, &peer), KVF_OK);
    move_verified(e, peer, t.pool_addr, buf, sizeof(buf), 1);
    if (strcmp(transport, "tcp") == 0) {
        fd = raw_connect(&t);
        usleep(900 * 1000);
        assert_int_equal(recv(fd, &b, 1, MSG_DONTWAIT), 0); /* closed */
        close(fd);
    } else {
        usleep(900 * 1000);
    }
    move_verified(e, peer, t.pool_addr + 65536, buf, sizeof(buf), 2);
    usleep(900 * 1000);
    move_verified(e, peer, t.pool_addr, buf, sizeof(buf), 5);
    kvf_peer_close(peer);
    kvf_engine_dereg(e, r);
    kvf_engine_destroy(e);
    assert_int_equal(kvf_test_target_stop(&t), 0);
}

static void test_idle_timeout(void **state)
{
    (void)state;
    idle_one("tcp");
    idle_one("shm");
    setenv("KVF_TRANSPORTS", "tcp", 1);
}

/* Waits (at most ms) for the peer to close fd (EOF or reset); the time
 * then since t0, or ms past t0 when it is still open. */
static uint64_t closed_at(int fd, uint64_t t0, unsigned ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char b;

    while (kvf_time_ms() - t0 < ms) {
        if (poll(&p, 1, 20) == 1 && recv(fd, &b, 1, MSG_DONTWAIT) <= 0) {
            return kvf_time_ms() - t0;
        }
    }
    return ms;
}

/* Connections that never finish the exchange (one sends nothing, one a
 * HELLO cut short, one a right HELLO and then no PROOF) are closed at
 * auth_timeout_ms after accept, long before idle_timeout_ms; a real
 * client is served meanwhile. */
static void test_auth_deadline(void **state)
{
    unsigned char hello[KVF_AUTH_MSG_LEN];
    kvf_auth_msg_t m = {.type = KVF_AUTH_HELLO};
    kvf_test_target_t t;
    uint64_t t0, ms[3];
    int fd[3], i;

    (void)state;
    setenv("KVF_AUTH_TIMEOUT_MS", "500", 1);
    setenv("KVF_IDLE_TIMEOUT_MS", "60000", 1);
    assert_int_equal(start_target(&t), 0);
    unsetenv("KVF_AUTH_TIMEOUT_MS");
    unsetenv("KVF_IDLE_TIMEOUT_MS");
    t0 = kvf_time_ms();
    for (i = 0; i < 3; i++) {
        fd[i] = raw_connect_from(&t, "127.0.0.2");
        assert_true(fd[i] >= 0);
    }
    /* the endpoint this socket reached: the target answers a CHALLENGE
     * and then waits for the PROOF */
    assert_int_equal(kvf_auth_sock_name(fd[2], 1, m.mac), 0);
    kvf_auth_msg_enc(&m, hello);
    assert_int_equal(send(fd[1], hello, sizeof(hello) / 2, 0),
                     (ssize_t)sizeof(hello) / 2);
    assert_int_equal(send(fd[2], hello, sizeof(hello), 0),
                     (ssize_t)sizeof(hello));
    assert_int_equal(recv(fd[2], hello, sizeof(hello), MSG_WAITALL),
                     (ssize_t)sizeof(hello)); /* the CHALLENGE */
    check_serving(&t);
    for (i = 0; i < 3; i++) {
        ms[i] = closed_at(fd[i], t0, 5000);
        close(fd[i]);
    }
    print_message("auth_timeout_ms 500: closed %lu, %lu, %lu ms after "
                  "connect\n",
                  (unsigned long)ms[0], (unsigned long)ms[1],
                  (unsigned long)ms[2]);
    for (i = 0; i < 3; i++) {
        assert_true(ms[i] >= 400 && ms[i] < 3000);
    }
    check_serving(&t);
    assert_int_equal(kvf_test_target_stop(&t), 0);
}

/* Out of descriptors: the accept loop backs off, then serves again. */
static void test_emfile(void **state)
{
    enum { HOLD = 64 };
    int fds[HOLD], i, n = 0, used;
    kvf_test_target_t t;
    struct rlimit rl;
    char path[64];
    struct dirent *d;
    DIR *dir;
    double cpu;

    (void)state;
    assert_int_equal(start_target(&t), 0);
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)t.pid);
    dir = opendir(path);
    assert_non_null(dir);
    for (used = 0; (d = readdir(dir)) != NULL;) {
        used += (d->d_name[0] != '.');
    }
    closedir(dir);
    assert_int_equal(prlimit(t.pid, RLIMIT_NOFILE, NULL, &rl), 0);
    rl.rlim_cur = (rlim_t)used + 8;
    assert_int_equal(prlimit(t.pid, RLIMIT_NOFILE, &rl, NULL), 0);
    for (i = 0; i < HOLD; i++) {
        fds[i] = raw_connect_from(&t, "127.0.0.1"); /* no exchange: idle */
        n++;
    }
    usleep(300 * 1000);
    cpu = cpu_percent(t.pid, 2000);
    print_message("target cpu while out of descriptors: %.1f %%\n", cpu);
    assert_true(cpu < 5.0);
    for (i = 0; i < n; i++) {
        close(fds[i]);
    }
    usleep(600 * 1000);
    rl.rlim_cur = rl.rlim_max < 4096 ? rl.rlim_max : 4096;
    assert_int_equal(prlimit(t.pid, RLIMIT_NOFILE, &rl, NULL), 0);
    check_serving(&t);
    assert_int_equal(kvf_test_target_stop(&t), 0);
}

typedef struct holder {
    kvf_peer_h peer;
    uint64_t remote;
    int rounds;
    kvf_status_t last;
} holder_t;

/* A hostile shm peer: after the handshake, BEGIN a lease, then forever
 * BEGIN the next one before it ENDs the previous, so one of its leases is
 * always open. Returns when the target breaks them. */
static void *hold_leases(void *arg)
{
    holder_t *h = arg;
    kvf_tl_ep_t *ep = ((struct kvf_peer *)h->peer)->ep;
    kvf_shm_conn_t c = {.fd = -1};
    unsigned char meta[KVF_SHM_ENTRY_LEN];
    kvf_shm_buf_t reply = {0};
    kvf_frame_hdr_t hdr;
    kvf_status_t st;
    kvf_wr_t w;

    st = kvf_shm_conn_open(ep, &c);
    kvf_wr_init_fixed(&w, meta, sizeof(meta));
    kvf_shm_entry_enc(&w, h->remote, 4096);
    if (st == KVF_OK) {
        st = kvf_shm_send(c.fd, KVF_SHM_BEGIN, KVF_OP_WRITE, KVF_OK, meta,
                          sizeof(meta), 1, -1, kvf_time_ms() + 2000);
    }
    while (st == KVF_OK) {
        st = kvf_shm_recv(c.fd, &hdr, &reply, NULL, kvf_time_ms() + 2000);
        if (st == KVF_OK && (hdr.type != KVF_SHM_GRANT || hdr.status != 0)) {
            st = KVF_ERR_PROTOCOL;
        }
        if (st == KVF_OK && h->rounds++ > 0) {
            st = kvf_shm_send(c.fd, KVF_SHM_END, 0, KVF_OK, NULL, 0, 0, -1,
                              kvf_time_ms() + 2000);
        }
        if (st == KVF_OK) {
            st = kvf_shm_send(c.fd, KVF_SHM_BEGIN, KVF_OP_WRITE, KVF_OK, meta,
                              sizeof(meta), 1, -1, kvf_time_ms() + 2000);
        }
    }
    h->last = st;
    kvf_shm_buf_free(&reply);
    kvf_shm_conn_free(&c);
    return NULL;
}

/* A peer holding leases in a loop does not hold up the target's stop
 * (which deregisters its pool first): its leases are broken after
 * lease_break_ms, and its next transfer fails with a status. */
static void test_lease_starve(void **state)
{
    kvf_test_target_t t;
    holder_t h = {0};
    pthread_t th;
    uint64_t t0, ms;
    kvf_engine_h e;

    (void)state;
    setenv("KVF_TRANSPORTS", "shm", 1);
    assert_int_equal(kvf_test_target_start(&t, POOL, SEED, NULL, NULL), 0);
    e = new_engine();
    h.remote = t.pool_addr;
    assert_int_equal(kvf_peer_open(e, t.segment, &h.peer), KVF_OK);
    assert_string_equal(kvf_peer_transport(h.peer), "shm");
    assert_int_equal(pthread_create(&th, NULL, hold_leases, &h), 0);
    usleep(300 * 1000);
    assert_true(h.rounds > 10);
    t0 = kvf_time_ms();
    assert_int_equal(kvf_test_target_stop(&t), 0);
    ms = kvf_time_ms() - t0;
    pthread_join(th, NULL);
    print_message("stop under overlapping leases took %lu ms (%d leases); "
                  "the holder got %s\n",
                  (unsigned long)ms, h.rounds, kvf_status_str(h.last));
    assert_true(ms < 2000);
    assert_int_not_equal(h.last, KVF_OK);
    kvf_peer_close(h.peer);
    kvf_engine_destroy(e);
    setenv("KVF_TRANSPORTS", "tcp", 1);
}

/* Crafted frames: each refused, a real client served after each. */
static void test_crafted(void **state)
{
    unsigned char hb[KVF_WIRE_HDR_LEN];
    kvf_test_target_t t;
    kvf_frame_hdr_t h;
    int fd;

    (void)state;
    assert_int_equal(start_target(&t), 0);
    /* oversize count: metadata over the frame limit */
    fd = raw_connect(&t);
    kvf_tcp_hdr_init(&h, KVF_TCP_READ, 1, KVF_OK, 1u << 30, 0);
    kvf_frame_pack(&h, hb);
    kvf_sock_send_all(fd, hb, sizeof(hb), kvf_time_ms() + 1000);
    h = recv_reply(fd);
    assert_int_equal(h.type, KVF_TCP_ERROR);
    close(fd);
    check_serving(&t);
    /* unknown type */
    fd = raw_connect(&t);
    kvf_tcp_hdr_init(&h, KVF_TCP_READ, 1, KVF_OK, 0, 0);
    h.type = 99;
    kvf_frame_pack(&h, hb);
    kvf_sock_send_all(fd, hb, sizeof(hb), kvf_time_ms() + 1000);
    h = recv_reply(fd);
    assert_int_equal(h.type, KVF_TCP_ERROR);
    close(fd);
    check_serving(&t);
    /* a WRITE whose entries do not add up to its payload */
    fd = raw_connect(&t);
    send_frame(fd, KVF_TCP_WRITE, 1, 10, t.pool_addr, 1ull << 40);
    h = recv_reply(fd);
    assert_int_equal(h.type, KVF_TCP_ERROR);
    close(fd);
    check_serving(&t);
    /* truncated: half a header, then gone */
    fd = raw_connect(&t);
    kvf_sock_send_all(fd, hb, 7, kvf_time_ms() + 1000);
    close(fd);
    check_serving(&t);
    assert_int_equal(kvf_test_target_stop(&t), 0);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sum_limits),
        cmocka_unit_test(test_sum_limits_shm),
        cmocka_unit_test(test_sum_cancel),
        cmocka_unit_test(test_write_drain),
        cmocka_unit_test(test_conn_flood),
        cmocka_unit_test(test_unauth_flood),
        cmocka_unit_test(test_idle_timeout),
        cmocka_unit_test(test_auth_deadline),
        cmocka_unit_test(test_emfile),
        cmocka_unit_test(test_crafted),
        cmocka_unit_test(test_lease_starve),
    };

    signal(SIGPIPE, SIG_IGN);
    if (argc > 1) {
        cmocka_set_test_filter(argv[1]); /* run one test by name */
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
