/*
 * A target's listener (see listener.h): the accept loop and the
 * connection threads the tcp target and the ucx side channel share.
 */
#include "transport/listener.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/log.h"
#include "core/sock.h"
#include "core/time.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct kvf_tl_listener {
    kvf_tl_listener_params_t p;
    int lfd;
    int wake[2];
    pthread_t thread;
    pthread_mutex_t lock;
    kvf_tl_conn_t *conns;
    unsigned nconns;
    int stop;
};

int kvf_tl_listener_stopping(const kvf_tl_listener_t *l)
{
    return __atomic_load_n(&l->stop, __ATOMIC_ACQUIRE);
}

static void *kvf_tl_conn_main(void *arg)
{
    kvf_tl_conn_t *c = arg;

    c->listener->p.serve(c);
    shutdown(c->fd, SHUT_RDWR);
    __atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Joins connections whose thread has finished (all of them with all). */
static void kvf_tl_reap(kvf_tl_listener_t *l, int all)
{
    kvf_tl_conn_t **pp, *c;

    pthread_mutex_lock(&l->lock);
    pp = &l->conns;
    while ((c = *pp) != NULL) {
        if (all || __atomic_load_n(&c->done, __ATOMIC_ACQUIRE)) {
            *pp = c->next;
            l->nconns--;
            pthread_mutex_unlock(&l->lock);
            pthread_join(c->thread, NULL);
            close(c->fd);
            kvf_free(c);
            pthread_mutex_lock(&l->lock);
            pp = &l->conns;
        } else {
            pp = &c->next;
        }
    }
    pthread_mutex_unlock(&l->lock);
}

/* 1 if a and b are the same host (port ignored). */
static int kvf_tl_same_host(const struct sockaddr_storage *a,
                            const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family) {
        return 0;
    }
    if (a->ss_family == AF_INET) {
        return ((const struct sockaddr_in *)(const void *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)(const void *)b)->sin_addr.s_addr;
    }
    if (a->ss_family == AF_INET6) {
        return memcmp(
                   &((const struct sockaddr_in6 *)(const void *)a)->sin6_addr,
                   &((const struct sockaddr_in6 *)(const void *)b)->sin6_addr,
                   sizeof(struct in6_addr)) == 0;
    }
    return 0;
}

/* The address of peer, for log lines. */
static const char *kvf_tl_host_str(const struct sockaddr_storage *peer,
                                   char *out, size_t len)
{
    snprintf(out, len, "?");
    if (peer->ss_family == AF_INET) {
        inet_ntop(AF_INET,
                  &((const struct sockaddr_in *)(const void *)peer)->sin_addr,
                  out, (socklen_t)len);
    } else if (peer->ss_family == AF_INET6) {
        inet_ntop(AF_INET6,
                  &((const struct sockaddr_in6 *)(const void *)peer)->sin6_addr,
                  out, (socklen_t)len);
    }
    return out;
}

/* Counts of the live connections: from peer's host (all, and still
 * authenticating), authenticating in all, and the oldest of those. */
typedef struct kvf_tl_counts {
    unsigned same, unauth_same, unauth;
    kvf_tl_conn_t *oldest;
} kvf_tl_counts_t;

static void kvf_tl_count(kvf_tl_listener_t *l,
                         const struct sockaddr_storage *peer,
                         kvf_tl_counts_t *n)
{
    kvf_tl_conn_t *c;
    int s;

    memset(n, 0, sizeof(*n));
    for (c = l->conns; c != NULL; c = c->next) {
        if (__atomic_load_n(&c->done, __ATOMIC_ACQUIRE) || c->evicted) {
            continue;
        }
        s = kvf_tl_same_host(&c->peer, peer);
        n->same += s;
        if (!c->authed) {
            n->unauth++;
            n->unauth_same += s;
            if (n->oldest == NULL || c->since < n->oldest->since) {
                n->oldest = c;
            }
        }
    }
}

/* Whether a new connection from peer fits under the caps (threads in
 * all, then per address, then the unauthenticated budget, whose oldest
 * connection is dropped when it is full); logs a refusal, rate-limited.
 * Caller holds l->lock. */
static int kvf_tl_admit(kvf_tl_listener_t *l,
                        const struct sockaddr_storage *peer)
{
    const kvf_tl_limits_t *lim = &l->p.lim;
    kvf_tl_counts_t n;
    char host[64];

    if (l->nconns >= lim->conns_max + lim->unauth_max) {
        kvf_log_rl(KVF_LOG_WARN,
                   "%s: refusing a connection: %u already open (conns_max "
                   "and conns_unauth_max)",
                   l->p.name, l->nconns);
        return 0;
    }
    kvf_tl_count(l, peer, &n);
    if (n.same >= lim->conns_per_addr ||
        n.unauth_same >= lim->unauth_per_addr) {
        kvf_log_rl(KVF_LOG_WARN,
                   "%s: refusing a connection from %s: %u already open from "
                   "there, %u of them not authenticated (conns_per_addr, "
                   "conns_unauth_per_addr)",
                   l->p.name, kvf_tl_host_str(peer, host, sizeof(host)), n.same,
                   n.unauth_same);
        return 0;
    }
    if (n.unauth >= lim->unauth_max && n.oldest != NULL) {
        kvf_log_rl(KVF_LOG_WARN,
                   "%s: %u connections without authentication: dropping the "
                   "oldest, from %s (conns_unauth_max)",
                   l->p.name, n.unauth,
                   kvf_tl_host_str(&n.oldest->peer, host, sizeof(host)));
        n.oldest->evicted = 1;
        shutdown(n.oldest->fd, SHUT_RDWR); /* its thread ends */
    }
    return 1;
}

uint64_t kvf_tl_conn_auth_deadline(const kvf_tl_conn_t *c)
{
    return c->since + c->listener->p.lim.auth_timeout_ms;
}

kvf_status_t kvf_tl_conn_authed(kvf_tl_conn_t *c)
{
    kvf_tl_listener_t *l = c->listener;
    const kvf_tl_conn_t *o;
    kvf_status_t st = KVF_OK;
    unsigned authed = 0;
    char host[64];

    pthread_mutex_lock(&l->lock);
    for (o = l->conns; o != NULL; o = o->next) {
        authed += o->authed && !__atomic_load_n(&o->done, __ATOMIC_ACQUIRE);
    }
    if (c->evicted) {
        st = KVF_ERR_CONN_RESET;
    } else if (authed >= l->p.lim.conns_max) {
        kvf_log_rl(KVF_LOG_WARN,
                   "%s: refusing an authenticated connection from %s: %u "
                   "open (conns_max)",
                   l->p.name, kvf_tl_host_str(&c->peer, host, sizeof(host)),
                   authed);
        st = KVF_ERR_BUSY;
    } else {
        c->authed = 1;
    }
    pthread_mutex_unlock(&l->lock);
    return st;
}

static void kvf_tl_accept_one(kvf_tl_listener_t *l)
{
    struct sockaddr_storage peer;
    socklen_t plen = sizeof(peer);
    kvf_tl_conn_t *c;
    int fd, ok;

    memset(&peer, 0, sizeof(peer));
    fd = accept4(l->lfd, (struct sockaddr *)&peer, &plen, SOCK_CLOEXEC);
    if (fd < 0) {
        if (errno != EAGAIN && errno != EINTR &&
            !kvf_tl_accept_backoff(errno)) {
            kvf_log_rl(KVF_LOG_WARN, "%s: accept failed: %m", l->p.name);
        }
        return;
    }
    pthread_mutex_lock(&l->lock);
    ok = kvf_tl_admit(l, &peer);
    pthread_mutex_unlock(&l->lock);
    c = ok ? kvf_calloc(1, sizeof(*c)) : NULL;
    if (c == NULL) {
        if (ok) {
            kvf_error("%s: no memory for a new connection", l->p.name);
        }
        close(fd);
        return;
    }
    if (l->p.setup != NULL) {
        l->p.setup(fd);
    }
    c->listener = l;
    c->fd = fd;
    c->peer = peer;
    c->arg = l->p.arg;
    c->since = kvf_time_ms();
    pthread_mutex_lock(&l->lock);
    if (pthread_create(&c->thread, NULL, kvf_tl_conn_main, c) != 0) {
        pthread_mutex_unlock(&l->lock);
        kvf_log_rl(KVF_LOG_ERROR, "%s: cannot start a connection thread",
                   l->p.name);
        kvf_free(c);
        close(fd);
        return;
    }
    c->next = l->conns;
    l->conns = c;
    l->nconns++;
    pthread_mutex_unlock(&l->lock);
}

static void *kvf_tl_accept_main(void *arg)
{
    kvf_tl_listener_t *l = arg;
    struct pollfd pfd[2];

    pfd[0].fd = l->lfd;
    pfd[0].events = POLLIN;
    pfd[1].fd = l->wake[0];
    pfd[1].events = POLLIN;
    while (!kvf_tl_listener_stopping(l)) {
        if (poll(pfd, 2, 1000) > 0 && (pfd[0].revents & POLLIN)) {
            kvf_tl_accept_one(l);
        }
        kvf_tl_reap(l, 0);
    }
    return NULL;
}

kvf_status_t kvf_tl_listener_start(const kvf_tl_listener_params_t *p,
                                   kvf_tl_listener_t **l_p, uint16_t *port_p)
{
    kvf_tl_listener_t *l;
    kvf_status_t status;

    l = kvf_calloc(1, sizeof(*l));
    if (l == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    l->p = *p;
    pthread_mutex_init(&l->lock, NULL);
    status = kvf_auth_check_bind(p->host);
    if (status == KVF_OK) {
        status = kvf_sock_listen(p->host, p->port, 512, &l->lfd, port_p);
    }
    if (status != KVF_OK) {
        goto err_free;
    }
    if (pipe2(l->wake, O_CLOEXEC) < 0) {
        kvf_error("%s: pipe failed: %m", p->name);
        status = KVF_ERR_IO;
        goto err_close;
    }
    if (pthread_create(&l->thread, NULL, kvf_tl_accept_main, l) != 0) {
        kvf_error("%s: cannot start the accept thread", p->name);
        status = KVF_ERR_NO_RESOURCE;
        goto err_pipe;
    }
    *l_p = l;
    return KVF_OK;

err_pipe:
    close(l->wake[0]);
    close(l->wake[1]);
err_close:
    close(l->lfd);
err_free:
    pthread_mutex_destroy(&l->lock);
    kvf_free(l);
    return status;
}

void kvf_tl_listener_stop(kvf_tl_listener_t *l)
{
    kvf_tl_conn_t *c;

    __atomic_store_n(&l->stop, 1, __ATOMIC_RELEASE);
    if (write(l->wake[1], "x", 1) < 0) {
        /* the accept thread notices stop within its poll period */
    }
    pthread_join(l->thread, NULL);
    pthread_mutex_lock(&l->lock);
    for (c = l->conns; c != NULL; c = c->next) {
        shutdown(c->fd, SHUT_RDWR);
    }
    pthread_mutex_unlock(&l->lock);
    kvf_tl_reap(l, 1);
    close(l->lfd);
    close(l->wake[0]);
    close(l->wake[1]);
    pthread_mutex_destroy(&l->lock);
    kvf_free(l);
}
