/*
 * Hostile tests of the authentication exchange itself (core/handshake.c),
 * each written so that a broken check lets the attack through and the
 * test fails:
 * - relay: a process in the middle (on 127.0.0.2, another host for the
 *   client) forwards the four messages between a real client and a real
 *   master. The master refuses the address the client reached, so the
 *   relay never sees ACCEPTED and the client gets KVF_ERR_AUTH. With
 *   that address allowed (auth_names, as behind NAT) the exchange
 *   completes through the relay, but the frames the relay then injects
 *   (a REMOVE, untagged and with a tag under a key of its own) are not
 *   served: the master closes the connection and the key is still there;
 * - a raw client that sends a PROOF with a zero MAC to a master and to a
 *   tcp target gets no ACCEPTED, and no answer to a frame after it;
 * - a fake server without the secret answers HELLO with a garbage
 *   CHALLENGE MAC: the client returns KVF_ERR_AUTH and sends no PROOF;
 * - payload bytes altered in flight by a relay the target answers to
 *   (auth_names): a tcp READ completes with the altered byte when
 *   payload tags are off, and fails with KVF_ERR_AUTH when the client
 *   asks for them (auth_payload_mac=1).
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
#include "transport/transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MSG KVF_AUTH_MSG_LEN

/* A listening socket on ip, port 0; *port_p gets the port. */
static int listen_on(const char *ip, uint16_t *port_p)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    assert_true(fd >= 0);
    inet_pton(AF_INET, ip, &a.sin_addr);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 8), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port_p = ntohs(a.sin_port);
    return fd;
}

/* 1 when fd sends any byte within ms (0 when it closes or stays
 * silent). */
static int answers_within(int fd, int ms)
{
    unsigned char b;

    return kvf_sock_recv_all(fd, &b, 1, kvf_time_ms() + (uint64_t)ms) == KVF_OK;
}

/* ---- relay ---- */

typedef struct relay_out {
    int forwarded; /* messages passed on, of 4 */
    int accepted;  /* a RESULT with ACCEPTED went through */
    int refused;   /* a CHALLENGE refusing the name went through */
    int answered;  /* the master answered a frame the relay injected */
} relay_out_t;

/* A REMOVE of key on the master's connection mfd: untagged (mac NULL)
 * or tagged under mac. */
static void relay_inject(int mfd, kvf_wire_mac_t *mac, const char *key)
{
    kvf_wr_t w;

    kvf_wr_init(&w);
    kvf_sm_key_enc(&w, key);
    kvf_sp_send(mfd, mac, KVF_SP_REMOVE, 99, KVF_OK, 1, 0, &w,
                kvf_time_ms() + 1000);
    kvf_wr_free(&w);
}

/* Forwards the exchange between the client cfd and the master mfd,
 * message by message, noting what goes through. */
static void relay_forward(int cfd, int mfd, relay_out_t *r)
{
    unsigned char b[MSG];
    kvf_auth_msg_t m;
    int i, from, to;

    for (i = 0; i < 4; i++) {
        from = i % 2 == 0 ? cfd : mfd;
        to = i % 2 == 0 ? mfd : cfd;
        if (kvf_sock_recv_all(from, b, MSG, kvf_time_ms() + 3000) != KVF_OK) {
            return;
        }
        if (kvf_auth_msg_dec(b, MSG, &m) == KVF_OK) {
            r->accepted |= m.type == KVF_AUTH_RESULT &&
                           (m.flags & KVF_AUTH_F_ACCEPTED) != 0;
            r->refused |= m.type == KVF_AUTH_CHALLENGE &&
                          (m.flags & KVF_AUTH_F_NAME) != 0;
        }
        if (kvf_sock_send_all(to, b, MSG, kvf_time_ms() + 3000) != KVF_OK) {
            return;
        }
        r->forwarded++;
    }
}

/* The relay process: one client on lfd, relayed to the master at
 * 127.0.0.1:mport, then (inject) a REMOVE of "victim" of its own,
 * untagged (tagged = 0) or tagged under a key it made up. Writes its
 * relay_out_t to out and exits. */
static void relay_run(int lfd, uint16_t mport, int tagged, int out)
{
    unsigned char k1[KVF_WIRE_KEY_LEN], k2[KVF_WIRE_KEY_LEN];
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    relay_out_t r = {0};
    kvf_wire_mac_t fake;
    int cfd = -1, mfd = -1;

    if (poll(&p, 1, 5000) == 1) {
        cfd = accept(lfd, NULL, NULL);
    }
    if (cfd >= 0 &&
        kvf_sock_connect("127.0.0.1", mport, 2000, &mfd) == KVF_OK) {
        relay_forward(cfd, mfd, &r);
        memset(k1, 0x11, sizeof(k1));
        memset(k2, 0x22, sizeof(k2));
        kvf_wire_mac_init(&fake, k1, k2);
        relay_inject(mfd, tagged ? &fake : NULL, "victim");
        r.answered = answers_within(mfd, 2000);
    }
    if (write(out, &r, sizeof(r)) != (ssize_t)sizeof(r)) {
        _exit(1);
    }
    _exit(0);
}

static pid_t relay_start(int lfd, uint16_t mport, int tagged, int *out_p)
{
    int pp[2];
    pid_t pid;

    assert_int_equal(pipe(pp), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pp[0]);
        relay_run(lfd, mport, tagged, pp[1]);
    }
    close(pp[1]);
    *out_p = pp[0];
    return pid;
}

static relay_out_t relay_end(pid_t pid, int out)
{
    relay_out_t r = {-1, -1, -1, -1};
    int st;

    assert_int_equal(read(out, &r, sizeof(r)), (ssize_t)sizeof(r));
    close(out);
    waitpid(pid, &st, 0);
    return r;
}

/* The master and a node, a key "victim" stored; the master's port. */
static uint16_t store_with_victim(kvs_proc_t *m, kvs_proc_t *n)
{
    char host[KVF_HOST_MAX];
    kvs_client_t c;
    uint16_t port;

    assert_int_equal(kvs_node(n, m->addr, "16M", NULL), 0);
    assert_true(kvs_metric_wait(m->http, "nodes", 1, 5000));
    assert_int_equal(kvs_client_open(&c, m->addr, 4096), 0);
    kvs_fill(c.buf, 4096, 3);
    assert_int_equal(kvf_store_put(c.st, "victim", c.buf, 4096, NULL), KVF_OK);
    kvs_client_close(&c);
    assert_int_equal(kvf_sock_parse_addr(m->addr, host, sizeof(host), &port),
                     KVF_OK);
    return port;
}

/* "victim" is still there, byte for byte. */
static void victim_intact(const char *master)
{
    unsigned char want[4096];
    kvs_client_t c;
    size_t got;

    assert_int_equal(kvs_client_open(&c, master, 4096), 0);
    assert_int_equal(kvf_store_get(c.st, "victim", c.buf, 4096, &got, 0),
                     KVF_OK);
    kvs_fill(want, sizeof(want), 3);
    assert_int_equal(got, 4096);
    assert_memory_equal(c.buf, want, 4096);
    kvs_client_close(&c);
}

/* The master refuses the address the client reached: no ACCEPTED for
 * the relay, KVF_ERR_AUTH for the client. */
static void test_relay_refused(void **state)
{
    uint16_t mport, rport;
    kvf_wire_mac_t mac;
    kvs_proc_t m, n;
    relay_out_t r;
    int lfd, out, fd;
    pid_t pid;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    mport = store_with_victim(&m, &n);
    lfd = listen_on("127.0.0.2", &rport);
    pid = relay_start(lfd, mport, 0, &out);
    close(lfd);
    assert_int_equal(
        kvf_auth_connect("127.0.0.2", rport, 3000, "store", &fd, &mac),
        KVF_ERR_AUTH);
    r = relay_end(pid, out);
    print_message("relay: %d messages forwarded, accepted %d, refused %d, "
                  "injected frame answered %d\n",
                  r.forwarded, r.accepted, r.refused, r.answered);
    assert_int_equal(r.accepted, 0);
    assert_int_equal(r.refused, 1);
    assert_int_equal(r.answered, 0);
    victim_intact(m.addr);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

/* The relay's address allowed (auth_names): the exchange goes through,
 * but the relay holds no session key, so its frames are not served. */
static void test_relay_named(void **state)
{
    char names[64];
    uint16_t mport, rport;
    kvf_wire_mac_t mac;
    kvs_proc_t m, n;
    relay_out_t r;
    int lfd, out, fd, tagged;

    (void)state;
    for (tagged = 0; tagged < 2; tagged++) {
        lfd = listen_on("127.0.0.2", &rport);
        snprintf(names, sizeof(names), "127.0.0.2:%u", rport);
        setenv("KVF_AUTH_NAMES", names, 1);
        assert_int_equal(kvs_master(&m, 0, NULL), 0);
        unsetenv("KVF_AUTH_NAMES");
        mport = store_with_victim(&m, &n);
        pid_t pid = relay_start(lfd, mport, tagged, &out);

        close(lfd);
        assert_int_equal(
            kvf_auth_connect("127.0.0.2", rport, 3000, "store", &fd, &mac),
            KVF_OK);
        r = relay_end(pid, out);
        print_message("relay (named, %s frame): %d forwarded, accepted %d, "
                      "injected frame answered %d\n",
                      tagged ? "tagged" : "untagged", r.forwarded, r.accepted,
                      r.answered);
        assert_int_equal(r.accepted, 1);
        assert_int_equal(r.answered, 0);
        victim_intact(m.addr);
        kvf_wire_mac_free(&mac);
        close(fd);
        kvs_stop(&n, 0);
        kvs_stop(&m, 0);
    }
}

/* ---- forged PROOF ---- */

/* HELLO as a client of fd would send it, then the CHALLENGE; then a
 * PROOF with a zero MAC. Returns 1 when a RESULT with ACCEPTED comes
 * back, or when a frame sent after it is answered. */
static int forged_proof(int fd)
{
    unsigned char b[MSG];
    kvf_auth_msg_t m = {0}, c;
    int accepted = 0;

    m.type = KVF_AUTH_HELLO;
    assert_int_equal(kvf_auth_random(m.nonce, sizeof(m.nonce)), KVF_OK);
    assert_int_equal(kvf_auth_sock_name(fd, 1, m.mac), 0);
    kvf_auth_msg_enc(&m, b);
    assert_int_equal(kvf_sock_send_all(fd, b, MSG, kvf_time_ms() + 2000),
                     KVF_OK);
    assert_int_equal(kvf_sock_recv_all(fd, b, MSG, kvf_time_ms() + 3000),
                     KVF_OK);
    assert_int_equal(kvf_auth_msg_dec(b, MSG, &c), KVF_OK);
    assert_int_equal(c.type, KVF_AUTH_CHALLENGE); /* a real challenge */
    memset(&m, 0, sizeof(m));
    m.type = KVF_AUTH_PROOF; /* MAC all zero */
    kvf_auth_msg_enc(&m, b);
    assert_int_equal(kvf_sock_send_all(fd, b, MSG, kvf_time_ms() + 2000),
                     KVF_OK);
    if (kvf_sock_recv_all(fd, b, MSG, kvf_time_ms() + 3000) == KVF_OK &&
        kvf_auth_msg_dec(b, MSG, &c) == KVF_OK && c.type == KVF_AUTH_RESULT) {
        accepted = (c.flags & KVF_AUTH_F_ACCEPTED) != 0;
    }
    /* and a frame after it, as if accepted: never answered */
    relay_inject(fd, NULL, "victim");
    return accepted || answers_within(fd, 1000);
}

static void test_forged_proof(void **state)
{
    char host[KVF_HOST_MAX];
    kvf_test_target_t t;
    kvs_proc_t m, n;
    uint16_t port;
    int fd;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    port = store_with_victim(&m, &n);
    assert_int_equal(kvf_sock_connect("127.0.0.1", port, 2000, &fd), KVF_OK);
    assert_int_equal(forged_proof(fd), 0);
    close(fd);
    victim_intact(m.addr);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
    /* the tcp target's exchange (the blocking server) */
    assert_int_equal(kvf_test_target_start(&t, 1 << 20, 7, NULL, NULL), 0);
    assert_int_equal(kvf_sock_parse_addr(t.segment, host, sizeof(host), &port),
                     KVF_OK);
    assert_int_equal(kvf_sock_connect(host, port, 2000, &fd), KVF_OK);
    assert_int_equal(forged_proof(fd), 0);
    close(fd);
    kvf_test_target_stop(&t);
}

/* ---- fake server ---- */

typedef struct fake_srv {
    int lfd;
    int got_hello;
    int got_more; /* bytes after HELLO: a PROOF */
} fake_srv_t;

/* Accepts one client, answers its HELLO with a CHALLENGE whose MAC is
 * garbage (it holds no secret), and watches for a PROOF. */
static void *fake_server(void *arg)
{
    fake_srv_t *f = arg;
    struct pollfd p = {.fd = f->lfd, .events = POLLIN};
    unsigned char b[MSG];
    kvf_auth_msg_t m = {0};
    int fd;

    if (poll(&p, 1, 5000) != 1 || (fd = accept(f->lfd, NULL, NULL)) < 0) {
        return NULL;
    }
    if (kvf_sock_recv_all(fd, b, MSG, kvf_time_ms() + 3000) == KVF_OK) {
        f->got_hello = 1;
        m.type = KVF_AUTH_CHALLENGE;
        kvf_auth_random(m.nonce, sizeof(m.nonce));
        memset(m.mac, 0xab, sizeof(m.mac));
        kvf_auth_msg_enc(&m, b);
        kvf_sock_send_all(fd, b, MSG, kvf_time_ms() + 2000);
        f->got_more = answers_within(fd, 2000);
    }
    close(fd);
    return NULL;
}

static void test_fake_server(void **state)
{
    fake_srv_t f = {0};
    kvf_wire_mac_t mac;
    pthread_t th;
    uint16_t port;
    int fd;

    (void)state;
    f.lfd = listen_on("127.0.0.1", &port);
    assert_int_equal(pthread_create(&th, NULL, fake_server, &f), 0);
    assert_int_equal(
        kvf_auth_connect("127.0.0.1", port, 3000, "store", &fd, &mac),
        KVF_ERR_AUTH);
    pthread_join(th, NULL);
    close(f.lfd);
    assert_int_equal(f.got_hello, 1);
    assert_int_equal(f.got_more, 0); /* no PROOF for a server unproven */
}

/* ---- payload tampering ---- */

/* The relay of the tamper test: one client on lfd, relayed to the target
 * at 127.0.0.1:tport byte for byte, but the byte at offset flip of the
 * target's stream to the client is inverted. Exits when a side closes
 * or after 10 s. */
static void tamper_run(int lfd, uint16_t tport, uint64_t flip)
{
    struct pollfd p[2] = {{.fd = lfd, .events = POLLIN}};
    unsigned char buf[65536];
    uint64_t down = 0, t0 = kvf_time_ms();
    int cfd = -1, tfd = -1, i;
    ssize_t n;

    if (poll(p, 1, 5000) == 1) {
        cfd = accept(lfd, NULL, NULL);
    }
    if (cfd < 0 || kvf_sock_connect("127.0.0.1", tport, 2000, &tfd) != KVF_OK) {
        _exit(1);
    }
    p[0] = (struct pollfd){.fd = cfd, .events = POLLIN};
    p[1] = (struct pollfd){.fd = tfd, .events = POLLIN};
    while (kvf_time_ms() - t0 < 10000 && poll(p, 2, 500) >= 0) {
        for (i = 0; i < 2; i++) {
            if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) {
                continue;
            }
            n = recv(p[i].fd, buf, sizeof(buf), 0);
            if (n <= 0) {
                _exit(0);
            }
            if (i == 1 && flip >= down && flip < down + (uint64_t)n) {
                buf[flip - down] ^= 0xff;
            }
            down += i == 1 ? (uint64_t)n : 0;
            kvf_sock_send_all(p[1 - i].fd, buf, (size_t)n,
                              kvf_time_ms() + 2000);
        }
    }
    _exit(0);
}

typedef struct tamper_done {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;
} tamper_done_t;

static void tamper_complete(kvf_tl_req_t *req)
{
    tamper_done_t *d = req->arg;

    pthread_mutex_lock(&d->lock);
    d->done = 1;
    pthread_cond_signal(&d->cond);
    pthread_mutex_unlock(&d->lock);
}

/* One READ of 4 KiB at remote through the tcp transport's own client
 * code, over the relay at 127.0.0.2:rport; its status, bytes in buf. */
static kvf_status_t tamper_read(uint16_t rport, uint64_t remote,
                                unsigned char *buf)
{
    const kvf_transport_ops_t *tcp = kvf_transport_find("tcp");
    tamper_done_t d = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    kvf_tl_config_t cfg = {.conns = 1, .timeout_ms = 3000, .no_listen = 1};
    kvf_tl_target_t none = {0};
    kvf_tl_seg_t seg = {buf, remote, 4096};
    kvf_status_t segst;
    kvf_tl_req_t req = {0};
    kvf_tl_iface_t *iface;
    kvf_tl_ep_t *ep;
    char addr[64];

    assert_non_null(tcp);
    assert_int_equal(tcp->iface_open(&cfg, &none, &iface), KVF_OK);
    snprintf(addr, sizeof(addr), "127.0.0.2:%u", rport);
    assert_int_equal(tcp->ep_open(iface, addr, &ep), KVF_OK);
    req.type = KVF_OP_READ;
    req.segs = &seg;
    req.nsegs = 1;
    req.bytes = 4096;
    req.seg_status = &segst;
    req.local_mem = KVF_MEM_BIT(KVF_MEM_HOST);
    req.complete = tamper_complete;
    req.arg = &d;
    assert_int_equal(tcp->ep_post(ep, &req), KVF_OK);
    pthread_mutex_lock(&d.lock);
    while (!d.done) {
        pthread_cond_wait(&d.cond, &d.lock); /* the ep's timeout bounds it */
    }
    pthread_mutex_unlock(&d.lock);
    tcp->ep_close(ep);
    tcp->iface_close(iface);
    return req.status;
}

/* A READ whose payload a relay alters: through unless payload tags are
 * on. The byte flipped is the 100th of the reply's payload: after the
 * target's CHALLENGE and RESULT (2 x 72 bytes), the reply's header (40)
 * and its tag (16). */
static void test_payload_tamper(void **state)
{
    unsigned char want[4096], got[4096];
    const uint64_t flip = 2 * MSG + 40 + 16 + 100;
    char names[64], host[KVF_HOST_MAX];
    kvf_test_target_t t;
    uint16_t tport, rport;
    int pm, lfd, st, diff, i;
    kvf_status_t rs;
    pid_t pid;

    (void)state;
    kvf_test_pool_bytes(want, sizeof(want), 7);
    for (pm = 0; pm < 2; pm++) {
        lfd = listen_on("127.0.0.2", &rport);
        snprintf(names, sizeof(names), "127.0.0.2:%u", rport);
        setenv("KVF_AUTH_NAMES", names, 1);
        setenv("KVF_TRANSPORTS", "tcp", 1);
        assert_int_equal(kvf_test_target_start(&t, 1 << 20, 7, NULL, NULL), 0);
        unsetenv("KVF_AUTH_NAMES");
        unsetenv("KVF_TRANSPORTS");
        assert_int_equal(
            kvf_sock_parse_addr(t.segment, host, sizeof(host), &tport), KVF_OK);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            tamper_run(lfd, tport, flip);
        }
        close(lfd);
        if (pm) {
            setenv("KVF_AUTH_PAYLOAD_MAC", "1", 1);
        }
        memset(got, 0, sizeof(got));
        rs = tamper_read(rport, t.pool_addr, got);
        unsetenv("KVF_AUTH_PAYLOAD_MAC");
        for (i = 0, diff = 0; i < 4096; i++) {
            diff += got[i] != want[i];
        }
        print_message("payload tags %s: READ %s, %d byte(s) differ\n",
                      pm ? "on" : "off", kvf_status_str(rs), diff);
        if (pm) {
            assert_int_equal(rs, KVF_ERR_AUTH); /* caught */
        } else {
            assert_int_equal(rs, KVF_OK); /* through, altered */
            assert_int_equal(diff, 1);
            assert_int_equal(got[100], (unsigned char)(want[100] ^ 0xff));
        }
        waitpid(pid, &st, 0);
        kvf_test_target_stop(&t);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_relay_refused),
        cmocka_unit_test(test_relay_named),
        cmocka_unit_test(test_forged_proof),
        cmocka_unit_test(test_fake_server),
        cmocka_unit_test(test_payload_tamper),
    };

    kvs_bin();
    /* the refusals' warnings are expected: keep the output short */
    setenv("KVF_LOG_LEVEL", "error", 0);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
