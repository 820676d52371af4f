/*
 * Integration test of the master's HTTP endpoint, with a real master
 * process on 127.0.0.1:
 * - 20 connections from another address that are open but send nothing
 *   do not delay /status or /metrics from another client (each answered
 *   within a second); a client that sends half a request and stalls does
 *   not either; after the idle ones are closed, /status still answers,
 *   with the same body shape (starts with {"epoch":, ends with
 *   "node_list":[]});
 * - 70 idle connections from one address, then 7 from each of 10: a
 *   scrape from 127.0.0.1 is answered within a second each time (a cap
 *   per address, and the idle ones closed after their deadline);
 * - two masters on one host with different --listen ports and no --http
 *   both serve HTTP, each at its RPC port + 1.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_store_harness.h"
#include "core/sock.h"
#include "core/time.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define IDLE 20

/* A plain connection to addr (HOST:PORT) from the local address from. */
static int connect_from(const char *addr, const char *from)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    char host[64];
    uint16_t port;
    int fd;

    assert_int_equal(kvf_sock_parse_addr(addr, host, sizeof(host), &port),
                     KVF_OK);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    inet_pton(AF_INET, from, &a.sin_addr);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    a.sin_port = htons(port);
    inet_pton(AF_INET, host, &a.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* /status from 127.0.0.1: answered (200) within a second. */
static void scrape_fast(const char *http)
{
    static char buf[65536];
    uint64_t t0 = kvf_time_ms(), dt;

    assert_int_equal(kvs_http(http, "/status", buf, sizeof(buf)), 200);
    dt = kvf_time_ms() - t0;
    print_message("/status answered in %lu ms\n", (unsigned long)dt);
    assert_true(dt < 1000);
}

static void test_idle_connections(void **state)
{
    static char buf[65536];
    int idle[IDLE + 1], i, code;
    kvs_proc_t m;
    uint64_t t0, dt;

    (void)state;
    kvs_bin();
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_http(m.http, "/status", buf, sizeof(buf)), 200);
    for (i = 0; i < IDLE; i++) {
        idle[i] = connect_from(m.http, "127.0.0.2");
    }
    idle[IDLE] = kvs_plain_connect(m.http); /* half a request, then nothing */
    assert_true(idle[IDLE] >= 0);
    assert_true(write(idle[IDLE], "GET /sta", 8) == 8);
    kvs_sleep_ms(100); /* all accepted and waiting */
    t0 = kvf_time_ms();
    code = kvs_http(m.http, "/status", buf, sizeof(buf));
    dt = kvf_time_ms() - t0;
    assert_int_equal(code, 200);
    assert_true(dt < 1000);
    assert_non_null(strstr(buf, "\"node_list\":[]"));
    t0 = kvf_time_ms();
    assert_int_equal(kvs_http(m.http, "/metrics", buf, sizeof(buf)), 200);
    assert_true(kvf_time_ms() - t0 < 1000);
    assert_non_null(strstr(buf, "kvferry_store_nodes 0"));
    for (i = 0; i <= IDLE; i++) {
        close(idle[i]);
    }
    assert_int_equal(kvs_http(m.http, "/status", buf, sizeof(buf)), 200);
    assert_true(strncmp(buf, "{\"epoch\":", 9) == 0);
    assert_int_equal(kvs_http(m.http, "/nope", buf, sizeof(buf)), 404);
    assert_string_equal(buf, "try /metrics or /status\n");
    kvs_stop(&m, 0);
}

/* 70 idle connections from one address (what delayed /status 8.5 s
 * with one global cap of 64), then 7 from each of 10 addresses: scrapes
 * from another address are answered at once; an idle connection is
 * closed after the idle deadline. */
static void test_idle_flood(void **state)
{
    enum { N = 70 };
    int fds[N], i;
    char from[32], b;
    kvs_proc_t m;
    uint64_t t0;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    for (i = 0; i < N; i++) {
        fds[i] = connect_from(m.http, "127.0.0.2");
    }
    kvs_sleep_ms(200);
    scrape_fast(m.http);
    scrape_fast(m.http);
    for (i = 0; i < N; i++) {
        close(fds[i]);
    }
    for (i = 0; i < N; i++) {
        snprintf(from, sizeof(from), "127.0.0.%d", 3 + i / 7);
        fds[i] = connect_from(m.http, from);
    }
    kvs_sleep_ms(200);
    scrape_fast(m.http);
    /* the idle deadline: closed within a few seconds, not kept */
    t0 = kvf_time_ms();
    assert_int_equal(kvf_sock_wait(fds[0], POLLIN, t0 + 6000), KVF_OK);
    assert_true(recv(fds[0], &b, 1, 0) <= 0);
    print_message("an idle connection closed after %lu ms\n",
                  (unsigned long)(kvf_time_ms() - t0 + 200));
    for (i = 0; i < N; i++) {
        close(fds[i]);
    }
    scrape_fast(m.http);
    kvs_stop(&m, 0);
}

/* 1 if port is free to listen on (127.0.0.1). */
static int port_free(unsigned port)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ok;

    a.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0) {
        close(fd);
    }
    return ok;
}

/* A port p with p + 1 free as well, below the ephemeral range (where
 * the outgoing connections of other processes could take p + 1 between
 * this check and the master's bind). Both may still be taken by then;
 * the test then fails loudly, it does not pass wrongly. */
static unsigned two_free_ports(void)
{
    unsigned lo = 32768, hi, p = 0;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    int tries;

    if (f != NULL) {
        if (fscanf(f, "%u %u", &lo, &hi) != 2) {
            lo = 32768;
        }
        fclose(f);
    }
    lo = lo > 12000 ? lo : 12000;
    srand((unsigned)getpid());
    for (tries = 0; tries < 100 && p == 0; tries++) {
        p = lo - 10000 + (unsigned)rand() % 9000;
        if (!port_free(p) || !port_free(p + 1)) {
            p = 0;
        }
    }
    assert_true(p != 0);
    return p;
}

/* Two masters on one host, different --listen ports, no --http: both
 * serve HTTP, at their RPC port + 1. */
static void test_http_port(void **state)
{
    static const char *const autohttp[] = {"--http", "auto", NULL};
    static char buf[65536];
    kvs_proc_t m[2];
    char want[64];
    unsigned p;
    int i;

    (void)state;
    for (i = 0; i < 2; i++) {
        p = two_free_ports();
        assert_int_equal(kvs_master(&m[i], p, autohttp), 0);
        snprintf(want, sizeof(want), "127.0.0.1:%u", p + 1);
        print_message("master %s: http %s\n", m[i].addr, m[i].http);
        assert_string_equal(m[i].http, want);
    }
    for (i = 0; i < 2; i++) {
        assert_int_equal(kvs_http(m[i].http, "/status", buf, sizeof(buf)), 200);
        kvs_stop(&m[i], 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idle_connections),
        cmocka_unit_test(test_idle_flood),
        cmocka_unit_test(test_http_port),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
