/*
 * Connections and event loops: each loop is an epoll thread with its own
 * connections, sharing the listening socket (EPOLLEXCLUSIVE) and the
 * store client. A connection reads only while it is not blocked (output
 * backed up, a store op in flight), so a long pipeline is served with
 * bounded memory; idle connections are closed after resp_idle_ms, and
 * connections past resp_max_clients are refused with an error line.
 */
#include "store/resp/resp_int.h"

#include "core/time.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

static void kvf_resp_close(kvf_resp_conn_t *c)
{
    kvf_resp_loop_t *lp = c->lp;

    kvf_resp_cur = c;
    redisReaderFree(c->rd);
    kvf_resp_cur = NULL;
    kvf_resp_val_unref(lp->srv, c->big);
    if (c->op != KVF_RESP_OP_NONE) { /* leave the batch */
        for (size_t i = 0; i < lp->nq; i++) {
            lp->q[i] = (lp->q[i] == c) ? NULL : lp->q[i];
        }
        kvf_resp_oval_free(lp->srv, c->oval);
        kvf_resp_val_unref(lp->srv, c->oget);
    }
    if (c->dbuf != NULL) {
        kvf_resp_pool_free(&lp->srv->pool, c->dbuf, c->dlen);
    }
    epoll_ctl(lp->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (c->prev != NULL) {
        c->prev->next = c->next;
    } else {
        lp->conns = c->next;
    }
    if (c->next != NULL) {
        c->next->prev = c->prev;
    }
    atomic_fetch_sub(&lp->srv->nclients, 1);
    free(c->out);
    free(c);
}

/* Parses and runs requests until input runs out or output backs up. */
static void kvf_resp_process(kvf_resp_conn_t *c)
{
    void *obj = NULL;
    int ok;

    kvf_resp_cur = c;
    while (!kvf_resp_blocked(c)) {
        kvf_resp_skip_blank(c->rd);
        if (redisReaderGetReply(c->rd, &obj) != REDIS_OK) {
            kvf_resp_err(c, "-ERR protocol error: %s", c->rd->errstr);
            c->closing = 1;
            break;
        }
        if (obj == NULL) {
            c->closing = !kvf_resp_check_pending(c);
            if (!c->closing && kvf_resp_direct_start(c)) {
                continue;
            }
            break;
        }
        ok = kvf_resp_dispatch(c, obj);
        kvf_ro_free(obj);
        if (!ok) {
            kvf_resp_outs(c, "-ERR protocol error: expected a command "
                             "(an array of bulk strings)\r\n");
            c->closing = 1;
        }
    }
    kvf_resp_cur = NULL;
}

/* Receives the rest of a direct bulk, and in the same call what follows
 * it (its "\r\n", the next request) into the reader; -1 = EOF or error. */
static int kvf_resp_read_direct(kvf_resp_conn_t *c)
{
    size_t want = c->dlen - c->dgot;
    struct iovec iov[2] = {{c->dbuf + c->dgot, want},
                           {c->lp->rbuf, KVF_RESP_RECV}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
    ssize_t n;

    n = recvmsg(c->fd, &msg, 0);
    if (n <= 0) {
        return (n < 0 && (errno == EAGAIN || errno == EINTR)) ? 0 : -1;
    }
    c->last_ms = kvf_time_ms();
    if ((size_t)n < want) {
        c->dgot += (size_t)n;
        return 0;
    }
    c->dgot = c->dlen;
    kvf_resp_direct_done(c);
    if ((size_t)n > want &&
        redisReaderFeed(c->rd, c->lp->rbuf, (size_t)n - want) != REDIS_OK) {
        return -1;
    }
    return 0;
}

/* Reads once (unless blocked) and feeds the reader; -1 = EOF or error. */
static int kvf_resp_read(kvf_resp_conn_t *c)
{
    ssize_t n;

    if (kvf_resp_blocked(c)) {
        return 0;
    }
    if (c->dbuf != NULL && !c->dready) {
        return kvf_resp_read_direct(c);
    }
    n = recv(c->fd, c->lp->rbuf, KVF_RESP_RECV, 0);
    if (n == 0) {
        return -1;
    }
    if (n < 0) {
        return (errno == EAGAIN || errno == EINTR) ? 0 : -1;
    }
    c->last_ms = kvf_time_ms();
    if (redisReaderFeed(c->rd, c->lp->rbuf, (size_t)n) != REDIS_OK) {
        return -1;
    }
    return 0;
}

/* Runs a connection after an event; closes it when done with it. */
/* Parses, runs and flushes until the connection waits; 0 = closed. */
static int kvf_resp_run(kvf_resp_conn_t *c)
{
    int was_blocked;

    for (;;) {
        kvf_resp_process(c);
        was_blocked = kvf_resp_blocked(c);
        if (kvf_resp_flush(c) < 0) {
            kvf_resp_close(c);
            return 0;
        }
        /* output drained: parse what the reader still holds */
        if (!was_blocked || kvf_resp_blocked(c)) {
            return 1;
        }
    }
}

/* Runs a connection after an event (0: after its batch); closes it when
 * done with it. */
void kvf_resp_serve(kvf_resp_conn_t *c, uint32_t ev)
{
    struct epoll_event e;
    uint32_t want;

    if ((ev & (EPOLLERR | EPOLLHUP)) && !(ev & EPOLLIN)) {
        kvf_resp_close(c);
        return;
    }
    if ((ev & EPOLLIN) && kvf_resp_read(c) < 0) {
        kvf_resp_close(c);
        return;
    }
    if (!kvf_resp_run(c)) {
        return;
    }
    /* a long bulk just began: the rest of it has likely arrived too */
    if ((ev & EPOLLIN) && c->dbuf != NULL && !c->dready) {
        if (kvf_resp_read(c) < 0) {
            kvf_resp_close(c);
            return;
        }
        if (!kvf_resp_run(c)) {
            return;
        }
    }
    if (c->op != KVF_RESP_OP_NONE) {
        return; /* the loop's batch answers it, then serves it again */
    }
    if (c->closing && c->out_len == c->out_off && c->big == NULL) {
        kvf_resp_close(c);
        return;
    }
    want = (kvf_resp_blocked(c) ? 0 : EPOLLIN) |
           (c->out_len > c->out_off || c->big != NULL ? EPOLLOUT : 0);
    if (want != c->events) {
        e.events = want;
        e.data.ptr = c;
        epoll_ctl(c->lp->ep, EPOLL_CTL_MOD, c->fd, &e);
        c->events = want;
    }
}

/* Makes an accepted socket one of the loop's connections. */
static void kvf_resp_adopt(kvf_resp_loop_t *lp, int fd)
{
    struct epoll_event e;
    kvf_resp_conn_t *c;
    int one = 1;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c = calloc(1, sizeof(*c));
    if (c != NULL) {
        c->out = malloc(KVF_RESP_OUT_CAP);
        c->rd = kvf_resp_reader_new();
    }
    if (c == NULL || c->out == NULL || c->rd == NULL) {
        atomic_fetch_sub(&lp->srv->nclients, 1);
        if (c != NULL) {
            free(c->out);
            if (c->rd != NULL) {
                redisReaderFree(c->rd);
            }
        }
        free(c);
        close(fd);
        return;
    }
    c->fd = fd;
    c->lp = lp;
    c->last_ms = kvf_time_ms();
    c->events = EPOLLIN;
    c->next = lp->conns;
    if (lp->conns != NULL) {
        lp->conns->prev = c;
    }
    lp->conns = c;
    e.events = EPOLLIN;
    e.data.ptr = c;
    epoll_ctl(lp->ep, EPOLL_CTL_ADD, fd, &e);
}

/* Hands an accepted socket to another loop; 0 when its queue is full. */
static int kvf_resp_hand(kvf_resp_loop_t *to, int fd)
{
    uint64_t one = 1;
    int ok;

    pthread_mutex_lock(&to->hmu);
    ok = to->nhand < KVF_RESP_HAND_MAX;
    if (ok) {
        to->hand[to->nhand++] = fd;
    }
    pthread_mutex_unlock(&to->hmu);
    if (ok) {
        (void)!write(to->wakefd, &one, sizeof(one));
    }
    return ok;
}

/* Takes over the sockets other loops accepted for this one. */
static void kvf_resp_take_hand(kvf_resp_loop_t *lp)
{
    int fds[KVF_RESP_HAND_MAX];
    unsigned n, i;
    uint64_t v;

    (void)!read(lp->wakefd, &v, sizeof(v));
    pthread_mutex_lock(&lp->hmu);
    n = lp->nhand;
    memcpy(fds, lp->hand, n * sizeof(int));
    lp->nhand = 0;
    pthread_mutex_unlock(&lp->hmu);
    for (i = 0; i < n; i++) {
        kvf_resp_adopt(lp, fds[i]);
    }
}

void kvf_resp_loop_drop_hand(kvf_resp_loop_t *lp)
{
    unsigned i;

    for (i = 0; i < lp->nhand; i++) {
        close(lp->hand[i]);
        atomic_fetch_sub(&lp->srv->nclients, 1);
    }
    lp->nhand = 0;
}

/* Accepts one connection and gives it to the loops in turn (resp_spread):
 * the kernel wakes the loops unevenly (a few loops would serve most
 * clients), and a client's requests run on its loop's thread. */
static void kvf_resp_accept(kvf_resp_loop_t *lp)
{
    static const char full[] = "-ERR max number of clients reached\r\n";
    struct kvf_resp *s = lp->srv;
    kvf_resp_loop_t *to;
    int fd;

    fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
        return;
    }
    if (atomic_fetch_add(&s->nclients, 1) >= s->p.max_clients) {
        atomic_fetch_sub(&s->nclients, 1);
        (void)!write(fd, full, sizeof(full) - 1);
        close(fd);
        return;
    }
    to = s->spread ? &s->loops[atomic_fetch_add(&s->next_loop, 1) % s->nloops]
                   : lp;
    if (to == lp || !kvf_resp_hand(to, fd)) {
        kvf_resp_adopt(lp, fd);
    }
}

static void kvf_resp_reap_idle(kvf_resp_loop_t *lp)
{
    uint64_t now = kvf_time_ms(), idle = lp->srv->p.idle_ms;
    kvf_resp_conn_t *c = lp->conns, *next;

    if (idle == 0) {
        return;
    }
    for (; c != NULL; c = next) {
        next = c->next;
        if (now - c->last_ms > idle) {
            kvf_resp_close(c);
        }
    }
}

/* Serves the connections epoll_wait found ready (waiting wait_ms). */
static void kvf_resp_poll(kvf_resp_loop_t *lp, int wait_ms)
{
    struct epoll_event ev[64];
    int n, i;

    n = epoll_wait(lp->ep, ev, 64, wait_ms);
    for (i = 0; i < n; i++) {
        if (ev[i].data.ptr == &lp->srv->lfd) {
            kvf_resp_accept(lp);
        } else if (ev[i].data.ptr == &lp->wakefd) {
            kvf_resp_take_hand(lp);
        } else if (ev[i].data.ptr != &lp->srv->stopfd) {
            kvf_resp_serve(ev[i].data.ptr, ev[i].events);
        }
    }
}

/* Runs the queued batch and serves its connections again (what they
 * had pipelined may queue the next batch). */
static void kvf_resp_batch_serve(kvf_resp_loop_t *lp)
{
    kvf_resp_conn_t **ops;
    size_t n, i;

    ops = kvf_resp_batch_run(lp, &n);
    for (i = 0; i < n; i++) {
        if (ops[i] != NULL) {
            kvf_resp_serve(ops[i], 0);
        }
    }
    free(ops);
}

void *kvf_resp_loop_main(void *arg)
{
    kvf_resp_loop_t *lp = arg;
    int wait_ms;

    wait_ms = (lp->srv->p.idle_ms > 0 && lp->srv->p.idle_ms < 1000)
                  ? (int)lp->srv->p.idle_ms
                  : 1000;
    while (!atomic_load(&lp->srv->stop)) {
        kvf_resp_poll(lp, kvf_resp_views_tick(lp, wait_ms));
        while (lp->nq > 0) {
            /* commands that arrived meanwhile join the batch */
            kvf_resp_poll(lp, 0);
            kvf_resp_batch_serve(lp);
            (void)kvf_resp_views_tick(lp, 0);
        }
        kvf_resp_reap_idle(lp);
    }
    while (lp->conns != NULL) {
        kvf_resp_close(lp->conns);
    }
    free(lp->q);
    return NULL;
}
