/*
 * libFuzzer target: the master's HTTP endpoint (store/master/http.c
 * behind libmicrohttpd). A real master runs in this process (started
 * once, RPC and HTTP on 127.0.0.1, a random secret); each input is sent
 * as the bytes of one HTTP connection, and the reply is read. The input
 * cannot know the bearer token (it comes from the secret), so the
 * property checked is: no reply carries what /status or /metrics tell
 * (their bodies start with {"epoch": and kvferry_store_), whatever the
 * requests on the connection (several may be pipelined); the master
 * answers within its bounds (a reply or a close within 10 s, the idle
 * deadline being 3 s; tried twice, for a loaded host); and it
 * keeps serving: every 4096 inputs /health must still answer 200.
 */
#include <kvferry/server.h>

#include "core/auth.h"
#include "core/log.h"
#include "core/sock.h"
#include "core/time.h"

#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char kvf_fuzz_secret[64];
static char kvf_fuzz_host[64];
static uint16_t kvf_fuzz_port;
static unsigned long kvf_fuzz_n;
static kvf_master_h kvf_fuzz_master; /* serves until the process ends */

static void kvf_fuzz_secret_rm(void)
{
    unlink(kvf_fuzz_secret);
}

static void kvf_fuzz_secret_new(void)
{
    unsigned char key[32];
    int fd;

    snprintf(kvf_fuzz_secret, sizeof(kvf_fuzz_secret),
             "/tmp/kvf-fuzz-secret-XXXXXX");
    fd = mkstemp(kvf_fuzz_secret);
    if (fd < 0 || kvf_auth_random(key, sizeof(key)) != KVF_OK ||
        write(fd, key, sizeof(key)) != (ssize_t)sizeof(key)) {
        abort();
    }
    close(fd);
    atexit(kvf_fuzz_secret_rm);
    setenv("KVF_SECRET_FILE", kvf_fuzz_secret, 1);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    kvf_server_master_params_t p;

    (void)argc;
    (void)argv;
    kvf_log_set_level(KVF_LOG_ERROR);
    kvf_fuzz_secret_new();
    if (kvf_server_master_defaults(&p) != KVF_OK) {
        abort();
    }
    p.listen = "127.0.0.1:0";
    p.http = "127.0.0.1:0";
    if (kvf_server_master_start(&p, &kvf_fuzz_master) != KVF_OK ||
        kvf_sock_parse_addr(kvf_server_master_http(kvf_fuzz_master),
                            kvf_fuzz_host, sizeof(kvf_fuzz_host),
                            &kvf_fuzz_port) != KVF_OK) {
        abort();
    }
    return 0;
}

/* Sends len bytes as one connection's request and reads the reply
 * (at most cap - 1 bytes, NUL-terminated) until the master closes.
 * Returns -1 when neither came within 10 s (the endpoint closes an idle
 * connection after 3 s). */
static int kvf_fuzz_try(const void *req, size_t len, char *out, size_t cap)
{
    struct linger lg = {1, 0}; /* reset at close: no TIME_WAIT pile-up */
    uint64_t deadline = kvf_time_ms() + 10000;
    struct pollfd pfd;
    size_t got = 0;
    ssize_t n;
    int fd;

    if (kvf_sock_connect(kvf_fuzz_host, kvf_fuzz_port, 2000, &fd) != KVF_OK) {
        abort();
    }
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    if (len > 0) {
        (void)kvf_sock_send_all(fd, req, len, deadline);
    }
    shutdown(fd, SHUT_WR);
    for (;;) {
        pfd = (struct pollfd){.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, (int)kvf_time_left_ms(deadline)) <= 0) {
            close(fd);
            return -1;
        }
        n = recv(fd, out + got, cap - 1 - got, 0);
        if (n <= 0 || got + (size_t)n >= cap - 1) {
            got += n > 0 ? (size_t)n : 0;
            break;
        }
        got += (size_t)n;
    }
    out[got] = '\0';
    close(fd);
    return 0;
}

/* kvf_fuzz_try, once more when the first try timed out (a loaded host
 * can stall one connection); abort when the second does too: the
 * endpoint does not end a connection within its bounds. */
static void kvf_fuzz_exchange(const void *req, size_t len, char *out,
                              size_t cap)
{
    if (kvf_fuzz_try(req, len, out, cap) != 0 &&
        kvf_fuzz_try(req, len, out, cap) != 0) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char health[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    static char out[65536];

    kvf_fuzz_exchange(data, size, out, sizeof(out));
    if (strstr(out, "{\"epoch\":") != NULL ||
        strstr(out, "kvferry_store_") != NULL) {
        abort(); /* /status or /metrics told without the token */
    }
    if (++kvf_fuzz_n % 4096 == 0) {
        kvf_fuzz_exchange(health, sizeof(health) - 1, out, sizeof(out));
        if (strncmp(out + 9, "200", 3) != 0) {
            abort(); /* the endpoint stopped serving */
        }
    }
    return 0;
}
