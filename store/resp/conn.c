/*
 * Connections and event loops: each loop is an epoll thread with its own
 * connections, sharing the listening socket (EPOLLEXCLUSIVE) and the
 * store client. A connection reads only while it is not blocked (output
 * backed up, a store op in flight), so a long pipeline is served with
 * bounded memory; idle connections are closed after resp_idle_ms, and
 * connections that do not authenticate after resp_auth_timeout_ms. The
 * loop that accepts a connection admits it (guard.c: caps per address
 * and in all) and gives it to a loop; one refused gets an error line.
 */
#include "store/resp/resp_int.h"

#include "core/time.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* Frees a connection that is in no loop's list (its socket closed). */
static void kvf_resp_conn_free(kvf_resp_conn_t *c)
{
    kvf_resp_cur = c;
    if (c->rd != NULL) {
        redisReaderFree(c->rd);
    }
    kvf_resp_txn_free(c);
    kvf_resp_cur = NULL;
    free(c->out);
    free(c);
}

static void kvf_resp_close(kvf_resp_conn_t *c)
{
    kvf_resp_loop_t *lp = c->lp;

    kvf_resp_slow_give(lp->srv, c->big_resv);
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
    kvf_resp_guard_release(c); /* before the descriptor may be reused */
    close(c->fd);
    if (c->prev != NULL) {
        c->prev->next = c->next;
    } else {
        lp->conns = c->next;
    }
    if (c->next != NULL) {
        c->next->prev = c->prev;
    }
    kvf_resp_conn_free(c);
}

/* The reader stopped on bad input: a limit of ours (perr) or its own
 * error; the connection answers why and closes. */
static void kvf_resp_bad_reader(kvf_resp_conn_t *c)
{
    char why[160];

    if (c->perr != NULL) {
        kvf_resp_bad(c, c->perr);
        return;
    }
    snprintf(why, sizeof(why), "protocol error: %s", c->rd->errstr);
    kvf_resp_bad(c, why);
}

/* Parses and runs requests until input runs out or output backs up. */
static void kvf_resp_process(kvf_resp_conn_t *c)
{
    void *obj = NULL;
    int ok;

    kvf_resp_cur = c;
    while (!kvf_resp_blocked(c)) {
        if ((obj = kvf_resp_txn_next(c)) == NULL) { /* after EXEC */
            kvf_resp_skip_blank(c->rd);
            if (redisReaderGetReply(c->rd, &obj) != REDIS_OK) {
                kvf_resp_bad_reader(c);
                break;
            }
            if (obj == NULL) {
                c->closing = !kvf_resp_check_pending(c);
                if (!c->closing && kvf_resp_direct_start(c)) {
                    continue;
                }
                break;
            }
        }
        ok = kvf_resp_dispatch(c, obj);
        if (ok != KVF_RESP_KEPT) {
            kvf_ro_free(obj);
        }
        if (ok == KVF_RESP_NOT_CMD) {
            kvf_resp_bad(c, "protocol error: expected a command (an array of "
                            "bulk strings)");
        }
    }
    kvf_resp_cur = NULL;
}

/* A bulk the pool had no room for: its bytes are received and dropped
 * (its command is answered "pool full"), what follows goes to the
 * reader; -1 = EOF or error. */
static int kvf_resp_read_drop(kvf_resp_conn_t *c, size_t want)
{
    ssize_t n = recv(c->fd, c->lp->rbuf, KVF_RESP_RECV, 0);

    if (n <= 0) {
        return (n < 0 && (errno == EAGAIN || errno == EINTR)) ? 0 : -1;
    }
    c->last_ms = kvf_time_ms();
    if ((size_t)n < want) {
        c->dgot += (size_t)n;
        return 0;
    }
    c->dgot = c->dlen;
    if (kvf_resp_direct_done(c) != 0 ||
        ((size_t)n > want && redisReaderFeed(c->rd, c->lp->rbuf + want,
                                             (size_t)n - want) != REDIS_OK)) {
        return -1;
    }
    return 0;
}

/* Receives the rest of a direct bulk into its pool buffer, and in the
 * same call what follows it (its "\r\n", the next request) into the
 * reader; -1 = EOF or error. */
static int kvf_resp_read_into(kvf_resp_conn_t *c, size_t want)
{
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
    if (kvf_resp_direct_done(c) != 0 ||
        ((size_t)n > want &&
         redisReaderFeed(c->rd, c->lp->rbuf, (size_t)n - want) != REDIS_OK)) {
        return -1;
    }
    return 0;
}

static int kvf_resp_read_direct(kvf_resp_conn_t *c)
{
    size_t want = c->dlen - c->dgot;

    return c->ddrop ? kvf_resp_read_drop(c, want) : kvf_resp_read_into(c, want);
}

/* Reads once (unless blocked) and feeds the reader; -1 = EOF or error. */
static int kvf_resp_read(kvf_resp_conn_t *c)
{
    ssize_t n;

    if (kvf_resp_blocked(c)) {
        return 0;
    }
    if (kvf_resp_in_direct(c)) {
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
    if ((ev & EPOLLIN) && kvf_resp_in_direct(c)) {
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

/* A connection for an accepted socket (not yet any loop's); NULL when
 * out of memory. */
static kvf_resp_conn_t *kvf_resp_conn_new(struct kvf_resp *s, int fd)
{
    kvf_resp_conn_t *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        return NULL;
    }
    c->out = malloc(KVF_RESP_OUT_CAP);
    c->rd = kvf_resp_reader_new();
    if (c->out == NULL || c->rd == NULL) {
        kvf_resp_conn_free(c);
        return NULL;
    }
    c->fd = fd;
    c->authed = s->pwlen == 0; /* no password: nothing to give */
    c->born_ms = c->last_ms = kvf_time_ms();
    return c;
}

/* Makes an admitted connection one of the loop's. */
static void kvf_resp_adopt(kvf_resp_loop_t *lp, kvf_resp_conn_t *c)
{
    struct epoll_event e;
    int one = 1;

    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->lp = lp;
    c->events = EPOLLIN;
    c->next = lp->conns;
    if (lp->conns != NULL) {
        lp->conns->prev = c;
    }
    lp->conns = c;
    e.events = EPOLLIN;
    e.data.ptr = c;
    epoll_ctl(lp->ep, EPOLL_CTL_ADD, c->fd, &e);
}

/* Hands an admitted connection to another loop; 0 when its queue is
 * full. */
static int kvf_resp_hand(kvf_resp_loop_t *to, kvf_resp_conn_t *c)
{
    uint64_t one = 1;
    int ok;

    pthread_mutex_lock(&to->hmu);
    ok = to->nhand < KVF_RESP_HAND_MAX;
    if (ok) {
        to->hand[to->nhand++] = c;
    }
    pthread_mutex_unlock(&to->hmu);
    if (ok) {
        (void)!write(to->wakefd, &one, sizeof(one));
    }
    return ok;
}

/* Takes over the connections other loops accepted for this one. */
static void kvf_resp_take_hand(kvf_resp_loop_t *lp)
{
    kvf_resp_conn_t *cs[KVF_RESP_HAND_MAX];
    unsigned n, i;
    uint64_t v;

    (void)!read(lp->wakefd, &v, sizeof(v));
    pthread_mutex_lock(&lp->hmu);
    n = lp->nhand;
    memcpy(cs, lp->hand, n * sizeof(cs[0]));
    lp->nhand = 0;
    pthread_mutex_unlock(&lp->hmu);
    for (i = 0; i < n; i++) {
        kvf_resp_adopt(lp, cs[i]);
    }
}

void kvf_resp_loop_drop_hand(kvf_resp_loop_t *lp)
{
    unsigned i;

    for (i = 0; i < lp->nhand; i++) {
        kvf_resp_guard_release(lp->hand[i]);
        close(lp->hand[i]->fd);
        kvf_resp_conn_free(lp->hand[i]);
    }
    lp->nhand = 0;
}

kvf_resp_conn_t *kvf_resp_conn_attach(kvf_resp_loop_t *lp, int fd,
                                      const struct sockaddr *sa)
{
    struct kvf_resp *s = lp->srv;
    const char *why = "memory";
    kvf_resp_loop_t *to;
    kvf_resp_conn_t *c;
    char line[128];
    int n;

    to = s->spread ? &s->loops[atomic_fetch_add(&s->next_loop, 1) % s->nloops]
                   : lp;
    c = kvf_resp_conn_new(s, fd);
    if (c != NULL) {
        c->lp = to;
    }
    if (c == NULL || kvf_resp_guard_admit(s, c, sa, &why) != 0) {
        n = snprintf(line, sizeof(line), "-ERR %s\r\n",
                     strcmp(why, "resp_conns_per_addr") == 0
                         ? "max number of clients per address reached"
                         : "max number of clients reached");
        (void)!write(fd, line, (size_t)n);
        close(fd);
        if (c != NULL) {
            kvf_resp_conn_free(c);
        }
        return NULL;
    }
    if (to == lp || !kvf_resp_hand(to, c)) {
        kvf_resp_adopt(lp, c);
    }
    return c;
}

/* Accepts one connection and attaches it. */
static void kvf_resp_accept(kvf_resp_loop_t *lp)
{
    struct sockaddr_storage sa = {0};
    socklen_t slen = sizeof(sa);
    int fd;

    fd = accept4(lp->srv->lfd, (struct sockaddr *)&sa, &slen,
                 SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
        (void)kvf_resp_conn_attach(lp, fd, (struct sockaddr *)&sa);
    }
}

/* Closes connections idle past resp_idle_ms, and those that did not
 * authenticate within resp_auth_timeout_ms (told why). */
static void kvf_resp_reap(kvf_resp_loop_t *lp)
{
    struct kvf_resp *s = lp->srv;
    uint64_t now = kvf_time_ms(), idle = s->p.idle_ms;
    uint64_t auth = s->lim.auth_timeout_ms;
    kvf_resp_conn_t *c = lp->conns, *next;

    for (; c != NULL; c = next) {
        next = c->next;
        if (!c->authed && auth > 0 && now - c->born_ms > auth) {
            atomic_fetch_add(&s->stats.auth_timeouts, 1);
            kvf_resp_outs(c, "-ERR no AUTH within resp_auth_timeout_ms, "
                             "closing\r\n");
            (void)kvf_resp_flush(c);
            kvf_resp_close(c);
        } else if (idle > 0 && now - c->last_ms > idle) {
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
void kvf_resp_batch_serve(kvf_resp_loop_t *lp)
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
    uint64_t idle = lp->srv->p.idle_ms, auth = lp->srv->lim.auth_timeout_ms;
    int wait_ms = 1000;

    /* the timer that closes idle and unauthenticated connections */
    if (idle > 0 && idle < (uint64_t)wait_ms) {
        wait_ms = (int)idle;
    }
    if (auth > 0 && auth / 2 < (uint64_t)wait_ms) {
        wait_ms = auth / 2 > 0 ? (int)(auth / 2) : 1;
    }
    while (!atomic_load(&lp->srv->stop)) {
        kvf_resp_poll(lp, kvf_resp_views_tick(lp, wait_ms));
        while (lp->nq > 0) {
            /* commands that arrived meanwhile join the batch */
            kvf_resp_poll(lp, 0);
            kvf_resp_batch_serve(lp);
            (void)kvf_resp_views_tick(lp, 0);
        }
        kvf_resp_reap(lp);
    }
    while (lp->conns != NULL) {
        kvf_resp_close(lp->conns);
    }
    free(lp->q);
    return NULL;
}
