/*
 * Test etcd and fake HTTP servers (etcd_harness.h).
 */
#include "etcd_harness.h"

#include <arpa/inet.h>
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

static int kvf_test_etcd_script(const char *cmd, const char *dir, char *out,
                                size_t len)
{
    const char *src = getenv("KVF_SRC");
    char line[1024];
    FILE *p;
    int rc;

    snprintf(line, sizeof(line), "%s/scripts/etcd.sh %s '%s'", src ? src : ".",
             cmd, dir);
    p = popen(line, "r");
    if (p == NULL) {
        return -1;
    }
    if (out != NULL && fgets(out, (int)len, p) != NULL) {
        out[strcspn(out, "\n")] = '\0';
    }
    rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int kvf_test_etcd_start_as(kvf_test_etcd_t *t, const char *how)
{
    int rc;

    snprintf(t->dir, sizeof(t->dir), "/tmp/kvf_etcd.XXXXXX");
    if (mkdtemp(t->dir) == NULL) {
        return -1;
    }
    t->endpoint[0] = '\0';
    rc = kvf_test_etcd_script(how, t->dir, t->endpoint, sizeof(t->endpoint));
    if (rc == 77) {
        rmdir(t->dir);
        return 77;
    }
    return (rc == 0 && t->endpoint[0] != '\0') ? 0 : -1;
}

int kvf_test_etcd_start(kvf_test_etcd_t *t)
{
    return kvf_test_etcd_start_as(t, "start");
}

int kvf_test_etcd_start_tls(kvf_test_etcd_t *t)
{
    return kvf_test_etcd_start_as(t, "start-tls");
}

int kvf_test_etcd_up(kvf_test_etcd_t *t)
{
    int rc = kvf_test_etcd_start(t);

    if (rc == 77) {
        printf("etcd is not installed: skipped\n");
        return 77;
    }
    if (rc != 0) {
        fprintf(stderr, "could not start etcd\n");
        return 1;
    }
    return 0;
}

void kvf_test_etcd_stop(kvf_test_etcd_t *t)
{
    char cmd[400];

    kvf_test_etcd_script("stop", t->dir, NULL, 0);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t->dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "could not remove %s\n", t->dir);
    }
}

int kvf_test_etcd_signal(kvf_test_etcd_t *t, int sig)
{
    char path[300];
    FILE *f;
    int pid = 0;

    snprintf(path, sizeof(path), "%s/etcd.pid", t->dir);
    f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    if (fscanf(f, "%d", &pid) != 1) {
        pid = 0;
    }
    fclose(f);
    return pid > 0 ? kill(pid, sig) : -1;
}

struct kvf_test_http {
    int fd;
    int mode;
    int stop;
    pthread_t thread;
};

static void kvf_test_http_serve(kvf_test_http_t *h, int c)
{
    static const char garbage[] = "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n"
                                  "\r\nnot json!";
    static const char html[] = "HTTP/1.1 404 Not Found\r\nContent-Length: 13"
                               "\r\nContent-Type: text/html\r\n\r\n"
                               "<h1>nope</h1>";
    char buf[4096];
    struct pollfd p = {.fd = c, .events = POLLIN};

    while (!__atomic_load_n(&h->stop, __ATOMIC_RELAXED)) {
        if (poll(&p, 1, 50) <= 0) {
            continue;
        }
        if (read(c, buf, sizeof(buf)) <= 0) {
            break;
        }
        if (h->mode == KVF_TEST_HTTP_GARBAGE &&
            write(c, garbage, sizeof(garbage) - 1) < 0) {
            break;
        }
        if (h->mode == KVF_TEST_HTTP_NOTETCD &&
            write(c, html, sizeof(html) - 1) < 0) {
            break;
        }
    }
    close(c);
}

static void *kvf_test_http_main(void *arg)
{
    kvf_test_http_t *h = arg;
    struct pollfd p = {.fd = h->fd, .events = POLLIN};
    int c;

    while (!__atomic_load_n(&h->stop, __ATOMIC_RELAXED)) {
        if (poll(&p, 1, 50) <= 0) {
            continue;
        }
        c = accept(h->fd, NULL, NULL);
        if (c >= 0) {
            kvf_test_http_serve(h, c); /* one client at a time */
        }
    }
    return NULL;
}

kvf_test_http_t *kvf_test_http_start(int mode, char *addr, size_t len)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof(sa);
    kvf_test_http_t *h = calloc(1, sizeof(*h));

    if (h == NULL) {
        return NULL;
    }
    h->mode = mode;
    h->fd = socket(AF_INET, SOCK_STREAM, 0);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (h->fd < 0 || bind(h->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(h->fd, 16) != 0 ||
        getsockname(h->fd, (struct sockaddr *)&sa, &sl) != 0 ||
        pthread_create(&h->thread, NULL, kvf_test_http_main, h) != 0) {
        if (h->fd >= 0) {
            close(h->fd);
        }
        free(h);
        return NULL;
    }
    snprintf(addr, len, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    return h;
}

void kvf_test_http_stop(kvf_test_http_t *h)
{
    __atomic_store_n(&h->stop, 1, __ATOMIC_RELAXED);
    pthread_join(h->thread, NULL);
    close(h->fd);
    free(h);
}

#define KVF_PROXY_CONNS 32

struct kvf_test_proxy {
    int lfd;
    struct sockaddr_in up;
    int frozen;                 /* atomic */
    int thaw;                   /* atomic: drop every connection */
    int stop;                   /* atomic */
    int fd[KVF_PROXY_CONNS][2]; /* client, upstream; -1 = free */
    pthread_t thread;
};

static void kvf_proxy_close(kvf_test_proxy_t *p, int i)
{
    close(p->fd[i][0]);
    close(p->fd[i][1]);
    p->fd[i][0] = p->fd[i][1] = -1;
}

static void kvf_proxy_accept(kvf_test_proxy_t *p)
{
    int c = accept(p->lfd, NULL, NULL), u, i;

    if (c < 0) {
        return;
    }
    u = socket(AF_INET, SOCK_STREAM, 0);
    if (u < 0 || connect(u, (struct sockaddr *)&p->up, sizeof(p->up)) != 0) {
        close(c);
        if (u >= 0) {
            close(u);
        }
        return;
    }
    for (i = 0; i < KVF_PROXY_CONNS; i++) {
        if (p->fd[i][0] < 0) {
            p->fd[i][0] = c;
            p->fd[i][1] = u;
            return;
        }
    }
    close(c);
    close(u);
}

/* Forwards what is readable on pfd (index k of connection i). */
static void kvf_proxy_move(kvf_test_proxy_t *p, int i, int k)
{
    char buf[16384];
    ssize_t n = read(p->fd[i][k], buf, sizeof(buf));

    if (n <= 0 || write(p->fd[i][1 - k], buf, (size_t)n) != n) {
        kvf_proxy_close(p, i);
    }
}

static void kvf_proxy_round(kvf_test_proxy_t *p)
{
    struct pollfd pf[1 + 2 * KVF_PROXY_CONNS];
    int n = 1, i, k, frozen = __atomic_load_n(&p->frozen, __ATOMIC_RELAXED);

    pf[0] = (struct pollfd){.fd = p->lfd, .events = POLLIN};
    for (i = 0; i < KVF_PROXY_CONNS; i++) {
        for (k = 0; k < 2; k++) {
            pf[n++] = (struct pollfd){.fd = frozen ? -1 : p->fd[i][k],
                                      .events = POLLIN};
        }
    }
    if (poll(pf, (nfds_t)n, 20) <= 0) {
        return;
    }
    if (pf[0].revents & POLLIN) {
        kvf_proxy_accept(p);
    }
    for (i = 0; i < KVF_PROXY_CONNS; i++) {
        for (k = 0; k < 2; k++) {
            if (p->fd[i][k] >= 0 &&
                (pf[1 + 2 * i + k].revents & (POLLIN | POLLHUP | POLLERR))) {
                kvf_proxy_move(p, i, k);
            }
        }
    }
}

static void *kvf_proxy_main(void *arg)
{
    kvf_test_proxy_t *p = arg;
    int i;

    while (!__atomic_load_n(&p->stop, __ATOMIC_RELAXED)) {
        if (__atomic_exchange_n(&p->thaw, 0, __ATOMIC_RELAXED)) {
            for (i = 0; i < KVF_PROXY_CONNS; i++) {
                if (p->fd[i][0] >= 0) {
                    kvf_proxy_close(p, i);
                }
            }
        }
        kvf_proxy_round(p);
    }
    for (i = 0; i < KVF_PROXY_CONNS; i++) {
        if (p->fd[i][0] >= 0) {
            kvf_proxy_close(p, i);
        }
    }
    return NULL;
}

kvf_test_proxy_t *kvf_test_proxy_start(const char *upstream, char *addr,
                                       size_t len)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof(sa);
    kvf_test_proxy_t *p = calloc(1, sizeof(*p));
    const char *colon = strrchr(upstream, ':');

    if (p == NULL || colon == NULL) {
        free(p);
        return NULL;
    }
    memset(p->fd, -1, sizeof(p->fd));
    p->up.sin_family = AF_INET;
    p->up.sin_port = htons((uint16_t)atoi(colon + 1));
    p->up.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    p->lfd = socket(AF_INET, SOCK_STREAM, 0);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(p->lfd, 64) != 0 ||
        getsockname(p->lfd, (struct sockaddr *)&sa, &sl) != 0 ||
        pthread_create(&p->thread, NULL, kvf_proxy_main, p) != 0) {
        if (p->lfd >= 0) {
            close(p->lfd);
        }
        free(p);
        return NULL;
    }
    snprintf(addr, len, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    return p;
}

void kvf_test_proxy_freeze(kvf_test_proxy_t *p, int frozen)
{
    if (!frozen) {
        __atomic_store_n(&p->thaw, 1, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&p->frozen, frozen, __ATOMIC_RELAXED);
}

void kvf_test_proxy_stop(kvf_test_proxy_t *p)
{
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELAXED);
    pthread_join(p->thread, NULL);
    close(p->lfd);
    free(p);
}
