/*
 * Store integration tests, shared harness (see test_store_harness.h).
 * Spawned processes get PR_SET_PDEATHSIG so they never outlive the test;
 * their stderr goes to /tmp/kvf-test-store-<test pid>.log (one file per
 * test run, appended) for post-mortems.
 */
#include "test_store_harness.h"

#include "core/auth.h"
#include "core/rng.h"
#include "core/sock.h"
#include "core/time.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *kvs_bin(void)
{
    const char *b = getenv("KVF_BIN");

    if (b == NULL || access(b, X_OK) != 0) {
        fprintf(stderr, "KVF_BIN not set or not executable: skipped\n");
        exit(77);
    }
    return b;
}

void kvs_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Spawns argv with stdout on a pipe; reads its first line (5 s). Returns
 * 0 with the line, or the child's exit status if it exits first. */
static int kvs_spawn(char *const argv[], pid_t *pid_p, char *line, size_t cap)
{
    char logname[64];
    struct pollfd pfd;
    size_t len = 0;
    int fds[2], st, logfd;
    uint64_t deadline = kvf_time_ms() + 5000;
    pid_t pid;
    ssize_t n;

    if (pipe(fds) < 0) {
        return -1;
    }
    pid = fork();
    if (pid < 0) {
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fds[1], STDOUT_FILENO);
        snprintf(logname, sizeof(logname), "/tmp/kvf-test-store-%d.log",
                 (int)getppid());
        logfd = open(logname, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (logfd >= 0) {
            dup2(logfd, STDERR_FILENO);
            close(logfd);
        }
        close(fds[0]);
        close(fds[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    line[0] = '\0';
    while (len + 1 < cap && strchr(line, '\n') == NULL) {
        pfd.fd = fds[0];
        pfd.events = POLLIN;
        if (poll(&pfd, 1, kvf_time_left_ms(deadline)) <= 0) {
            break;
        }
        n = read(fds[0], line + len, cap - 1 - len);
        if (n <= 0) {
            break;
        }
        len += (size_t)n;
        line[len] = '\0';
    }
    close(fds[0]);
    if (strchr(line, '\n') == NULL) {
        if (waitpid(pid, &st, 0) == pid && WIFEXITED(st)) {
            return WEXITSTATUS(st) ? WEXITSTATUS(st) : 1;
        }
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    *pid_p = pid;
    return 0;
}

static void kvs_field(const char *line, const char *key, char *out, size_t cap)
{
    const char *p = strstr(line, key);
    size_t n;

    out[0] = '\0';
    if (p == NULL) {
        return;
    }
    p += strlen(key);
    n = strcspn(p, " \n");
    if (n >= cap) {
        n = cap - 1;
    }
    memcpy(out, p, n);
    out[n] = '\0';
}

int kvs_master(kvs_proc_t *p, unsigned port, const char *const *extra)
{
    char *argv[32], listen[64], line[512];
    const char *const *e;
    int i = 0, rc, http = 0;

    for (e = extra; e != NULL && *e != NULL; e++) {
        http |= strcmp(*e, "--http") == 0;
    }
    snprintf(listen, sizeof(listen), "127.0.0.1:%u", port);
    argv[i++] = (char *)kvs_bin();
    argv[i++] = "master";
    argv[i++] = "--listen";
    argv[i++] = listen;
    if (!http) {
        argv[i++] = "--http";
        argv[i++] = "127.0.0.1:0";
    }
    while (extra != NULL && *extra != NULL && i < 31) {
        argv[i++] = (char *)*extra++;
    }
    argv[i] = NULL;
    memset(p, 0, sizeof(*p));
    rc = kvs_spawn(argv, &p->pid, line, sizeof(line));
    if (rc != 0) {
        return rc;
    }
    kvs_field(line, "master=", p->addr, sizeof(p->addr));
    kvs_field(line, "http=", p->http, sizeof(p->http));
    return 0;
}

int kvs_node(kvs_proc_t *p, const char *master, const char *pool,
             const char *const *extra)
{
    char *argv[32], line[512];
    int i = 0, rc;

    argv[i++] = (char *)kvs_bin();
    argv[i++] = "node";
    argv[i++] = "--pool";
    argv[i++] = (char *)pool;
    argv[i++] = "--master";
    argv[i++] = (char *)master;
    while (extra != NULL && *extra != NULL && i < 31) {
        argv[i++] = (char *)*extra++;
    }
    argv[i] = NULL;
    memset(p, 0, sizeof(*p));
    rc = kvs_spawn(argv, &p->pid, line, sizeof(line));
    if (rc != 0) {
        return rc;
    }
    kvs_field(line, "node=", p->addr, sizeof(p->addr));
    if (strstr(line, " pool=0x") != NULL) {
        sscanf(strstr(line, " pool=0x"), " pool=0x%lx+%lu",
               (unsigned long *)&p->pool_addr, (unsigned long *)&p->pool_len);
    }
    return 0;
}

void kvs_stop(kvs_proc_t *p, int sig)
{
    int i;

    if (p->pid <= 0) {
        return;
    }
    kill(p->pid, sig ? sig : SIGTERM);
    for (i = 0; i < 500; i++) {
        if (waitpid(p->pid, NULL, WNOHANG) == p->pid) {
            p->pid = 0;
            return;
        }
        kvs_sleep_ms(10);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
}

int kvs_plain_connect(const char *addr)
{
    char host[KVF_HOST_MAX];
    uint16_t port;
    int fd;

    if (kvf_sock_parse_addr(addr, host, sizeof(host), &port) != KVF_OK ||
        kvf_sock_connect(host, port, 2000, &fd) != KVF_OK) {
        return -1;
    }
    return fd;
}

int kvs_raw_connect(const char *addr)
{
    char host[KVF_HOST_MAX];
    uint16_t port;
    int fd;

    if (kvf_sock_parse_addr(addr, host, sizeof(host), &port) != KVF_OK ||
        kvf_test_connect(host, port, 2000, "store", &fd) != KVF_OK) {
        return -1;
    }
    return fd;
}

int kvs_http(const char *addr, const char *path, char *buf, size_t cap)
{
    char token[KVF_AUTH_TOKEN_LEN + 1], auth[KVF_AUTH_TOKEN_LEN + 32];

    if (kvf_auth_http_token("127.0.0.1", token, sizeof(token)) != KVF_OK) {
        return -1;
    }
    snprintf(auth, sizeof(auth), "Bearer %s", token);
    return kvs_http_auth(addr, path, token[0] ? auth : NULL, buf, cap);
}

int kvs_http_auth(const char *addr, const char *path, const char *auth,
                  char *buf, size_t cap)
{
    uint64_t deadline = kvf_time_ms() + 3000;
    char req[512];
    size_t len = 0;
    int fd, code = -1;
    ssize_t n;
    char *body;

    fd = kvs_plain_connect(addr);
    if (fd < 0) {
        return -1;
    }
    snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: %s\r\n%s%s%s\r\n",
             path, addr, auth ? "Authorization: " : "", auth ? auth : "",
             auth ? "\r\n" : "");
    if (kvf_sock_send_all(fd, req, strlen(req), deadline) != KVF_OK) {
        close(fd);
        return -1;
    }
    while (len + 1 < cap && kvf_sock_wait(fd, POLLIN, deadline) == KVF_OK) {
        n = recv(fd, buf + len, cap - 1 - len, 0);
        if (n <= 0) {
            break;
        }
        len += (size_t)n;
    }
    buf[len] = '\0';
    close(fd);
    if (sscanf(buf, "HTTP/1.%*d %d", &code) != 1) {
        return -1;
    }
    body = strstr(buf, "\r\n\r\n");
    if (body != NULL) {
        memmove(buf, body + 4, strlen(body + 4) + 1);
    }
    return code;
}

long kvs_metric(const char *http, const char *name)
{
    static char buf[65536];
    char key[128];
    const char *p;
    size_t klen;

    if (kvs_http(http, "/metrics", buf, sizeof(buf)) != 200) {
        return -1;
    }
    snprintf(key, sizeof(key), "\nkvferry_store_%s ", name);
    klen = strlen(key);
    p = strstr(buf, key);
    return p ? strtol(p + klen, NULL, 10) : -1;
}

/* Polls metric until it is within [lo, hi] or timeout_ms passes. */
static int kvs_metric_wait_in(const char *http, const char *name, long lo,
                              long hi, int timeout_ms)
{
    uint64_t deadline = kvf_time_ms() + (uint64_t)timeout_ms;
    long v;

    for (;;) {
        v = kvs_metric(http, name);
        if (v >= lo && v <= hi) {
            return 1;
        }
        if (kvf_time_ms() >= deadline) {
            return 0;
        }
        kvs_sleep_ms(50);
    }
}

int kvs_metric_wait(const char *http, const char *name, long want,
                    int timeout_ms)
{
    return kvs_metric_wait_in(http, name, want, want, timeout_ms);
}

int kvs_metric_wait_le(const char *http, const char *name, long max,
                       int timeout_ms)
{
    return kvs_metric_wait_in(http, name, 0, max, timeout_ms);
}

int kvs_client_open(kvs_client_t *c, const char *master, size_t len)
{
    kvf_store_params_t p = {0};

    memset(c, 0, sizeof(*c));
    p.field_mask = KVF_STORE_PARAM_MASTER | KVF_STORE_PARAM_TIMEOUT;
    p.master = master;
    p.timeout_ms = 3000;
    if (kvf_store_connect(&p, &c->st) != KVF_OK) {
        return -1;
    }
    c->buf = malloc(len);
    c->len = len;
    if (c->buf == NULL || kvf_engine_reg(kvf_store_engine(c->st), c->buf, len,
                                         KVF_MEM_HOST, 0, &c->reg) != KVF_OK) {
        kvs_client_close(c);
        return -1;
    }
    return 0;
}

void kvs_client_close(kvs_client_t *c)
{
    if (c->reg != NULL) {
        kvf_engine_dereg(kvf_store_engine(c->st), c->reg);
    }
    if (c->st != NULL) {
        kvf_store_disconnect(c->st);
    }
    free(c->buf);
    memset(c, 0, sizeof(*c));
}

void kvs_fill(void *buf, size_t len, uint64_t seed)
{
    kvf_rng_t r;

    kvf_rng_seed(&r, seed);
    kvf_rng_fill(&r, buf, len);
}
