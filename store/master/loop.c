/*
 * The master's connection event loops: one or more threads (master option
 * `loops`, store config `master_loops`; 0 = one per 8 CPUs, 1 to 4), each
 * with its own epoll set and connections, non-blocking sockets. The first
 * loop accepts and hands connections round robin to all loops (an eventfd
 * wakes the receiver); the metadata they serve is one, under the master's
 * lock, which a request holds only while it is applied: the system calls
 * of many clients then run on several cores while the table stays one.
 * The first loop accepts on the tcp listening socket and, when the master
 * listens on a loopback or wildcard address, on its abstract unix socket
 * (store/proto kvf_sp_unix_name): both kinds are served by the same code,
 * frames, bounds and limits; they are counted apart for /metrics. Each
 * connection has an input buffer: whatever recv() returns is appended, and
 * every whole frame in it is served in order (a frame is parsed only once all
 * its bytes are in); replies go out with one writev, and what the socket does
 * not take waits in an output buffer (the connection is then not read until it
 * drains). Under load one wake-up serves the requests of many clients, with one
 * recv and one send each.
 *
 * Node registrations check the node's claim over the network (opening its
 * segment), which may take up to the timeout: such a frame is handed to a
 * fixed pool of registration workers (store config `reg_workers`) while the
 * connection leaves the epoll set, and comes back when the reply is sent;
 * past a bounded queue a registration is refused busy at once, so frames in
 * flight never cost a thread each. On an elected leader COMMIT and PUT_END
 * frames go the same way: their reply waits until the nodes holding the
 * objects have recorded them in their inventories (inventory.c).
 *
 * Limits (docs/security.md): connections are capped per peer and in all
 * (limits.c), a connection idle for master_idle_ms is closed, and out of
 * descriptors the accepting stops for a moment instead of spinning.
 *
 * Every connection first runs the authentication exchange (core/auth)
 * as a non-blocking state machine on its loop; no frame is read before
 * it succeeds, and a connection that has not finished it within
 * io_timeout_ms is closed.
 *
 * Bad input never stops the master: a bad magic, version or length gets
 * an ERROR reply and closes that connection only; a frame left incomplete
 * for io_timeout_ms (a client that vanished mid-frame) closes it. Each
 * counts in `errors`.
 */
#include "store/master/master_int.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/log.h"
#include "core/time.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <poll.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define KVF_LOOP_IN_MIN          (64u << 10)
#define KVF_LOOP_EVENTS          64
#define KVF_LOOP_TICK_MS         100
#define KVF_LOOPS_AUTO_MAX       4
#define KVF_ACCEPT_PAUSE_MS      100
#define KVF_REG_QUEUE_PER_WORKER 16

struct kvf_mloop {
    kvf_master_t *m;
    int epfd;
    int efd; /* eventfd: connections handed over by the first loop */
    pthread_t thread;
    int started;
    kvf_mconn_t *conns; /* owned by this loop's thread */
    pthread_mutex_t in_lock;
    kvf_mconn_t *incoming;        /* handed over, not yet watched */
    uint64_t accept_paused_until; /* first loop: out of descriptors */
};

/* epoll tags of the listening sockets (connections carry their own) */
static char kvf_loop_tcp_tag, kvf_loop_unix_tag;

struct kvf_mconn {
    kvf_master_t *m;
    kvf_mloop_t *loop; /* the loop that serves it */
    int fd;
    int is_unix;       /* accepted on the abstract unix socket */
    int busy;          /* with a helper thread (atomic) */
    int dead;          /* close it (set by a helper) */
    kvf_mclient_t *cl; /* its client identity, for the per-client limits */
    kvf_mpeer_t *peer; /* counted in the connection caps */
    uint64_t last_ms;  /* ms: last time bytes came in */
    unsigned char *in;
    size_t in_len, in_cap;
    uint64_t partial_since; /* ms; input holds part of a frame */
    unsigned char *out;     /* unsent reply bytes */
    size_t out_len, out_off, out_cap;
    kvf_auth_srv_t *auth; /* the authentication exchange; NULL once done */
    kvf_wire_mac_t mac;   /* frame tags once authenticated (core/wire.h) */
    uint64_t since;       /* ms: accepted */
    kvf_mconn_t *next;
};

/* Frees a connection that is on no list and in no epoll set. */
static void kvf_loop_free(kvf_mconn_t *c)
{
    __atomic_sub_fetch(&c->m->nconns, 1, __ATOMIC_RELAXED);
    if (c->is_unix) {
        __atomic_sub_fetch(&c->m->nconns_unix, 1, __ATOMIC_RELAXED);
    }
    kvf_m_caps_release(c->m, c->peer, c->is_unix);
    kvf_m_client_put(c->m, c->cl);
    close(c->fd);
    kvf_free(c->auth);
    kvf_wire_mac_free(&c->mac);
    kvf_free(c->in);
    kvf_free(c->out);
    kvf_free(c);
}

static void kvf_loop_close(kvf_mloop_t *l, kvf_mconn_t *c)
{
    kvf_mconn_t **pp;

    for (pp = &l->conns; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    epoll_ctl(l->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    kvf_loop_free(c);
}

static void kvf_loop_watch(kvf_mconn_t *c, uint32_t ev, int op)
{
    struct epoll_event e = {.events = ev, .data.ptr = c};

    epoll_ctl(c->loop->epfd, op, c->fd, &e);
}

/* Appends up to len bytes of p past the first *skip_p (bytes already
 * sent) to the output buffer (room made by the caller). */
static void kvf_loop_keep(kvf_mconn_t *c, const void *p, size_t len,
                          size_t *skip_p)
{
    size_t skip = *skip_p < len ? *skip_p : len;

    memcpy(c->out + c->out_len, (const unsigned char *)p + skip, len - skip);
    c->out_len += len - skip;
    *skip_p -= skip;
}

/* Queues header + body + tag; sends what the socket takes now. 0, or -1
 * when the connection broke. */
static int kvf_loop_reply(kvf_mconn_t *c, uint8_t type, uint64_t id,
                          kvf_status_t st, uint32_t count, uint16_t flags,
                          const kvf_wr_t *w)
{
    unsigned char hdr[KVF_WIRE_HDR_LEN], tag[KVF_WIRE_TAG_LEN];
    kvf_frame_hdr_t h = {0};
    size_t blen = w ? w->len : 0, tl = 0, total, need, sent;
    struct iovec iov[3];
    unsigned char *nb;
    ssize_t n = 0;

    h.magic = KVF_WIRE_MAGIC;
    h.version = KVF_WIRE_VERSION;
    h.type = type;
    h.flags = flags;
    h.meta_len = (uint32_t)blen;
    h.count = count;
    h.id = id;
    h.status = st;
    kvf_frame_pack(&h, hdr);
    if (kvf_wire_mac_on(&c->mac)) {
        kvf_wire_mac_seal(&c->mac, hdr, blen ? w->buf : NULL, blen, tag);
        tl = sizeof(tag);
    }
    total = sizeof(hdr) + blen + tl;
    if (c->out_len == c->out_off) {
        iov[0].iov_base = hdr;
        iov[0].iov_len = sizeof(hdr);
        iov[1].iov_base = blen ? w->buf : NULL;
        iov[1].iov_len = blen;
        iov[2].iov_base = tag;
        iov[2].iov_len = tl;
        do {
            n = writev(c->fd, iov, 3);
        } while (n < 0 && errno == EINTR);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            return -1;
        }
        if (n < 0) {
            n = 0;
        }
        if ((size_t)n == total) {
            return 0;
        }
        c->out_len = c->out_off = 0;
    }
    /* keep the rest for EPOLLOUT */
    need = c->out_len + total - (size_t)n;
    if (need > c->out_cap) {
        nb = kvf_realloc(c->out, need);
        if (nb == NULL) {
            return -1;
        }
        c->out = nb;
        c->out_cap = need;
    }
    sent = (size_t)n;
    kvf_loop_keep(c, hdr, sizeof(hdr), &sent);
    if (blen > 0) {
        kvf_loop_keep(c, w->buf, blen, &sent);
    }
    kvf_loop_keep(c, tag, tl, &sent);
    return 0;
}

/* Sends queued output; 1 when all is out, 0 when some is left, -1. */
static int kvf_loop_flush(kvf_mconn_t *c)
{
    ssize_t n;

    while (c->out_off < c->out_len) {
        n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                 MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            c->out_off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 0;
        } else {
            return -1;
        }
    }
    c->out_len = c->out_off = 0;
    return 1;
}

/* ---- registration workers ---- */

typedef struct kvf_loop_job {
    kvf_mconn_t *c;
    kvf_sp_frame_t f;
    struct kvf_loop_job *next;
} kvf_loop_job_t;

struct kvf_mreg {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    kvf_loop_job_t *head, *tail;
    unsigned queued, max_queued;
    unsigned queued_reg, max_reg; /* of queued: node registrations */
    int stop;
    unsigned nthreads;
    pthread_t threads[];
};

/* One registration, then the connection goes back to its loop. */
static void kvf_reg_run(kvf_loop_job_t *j)
{
    kvf_mconn_t *c = j->c;
    kvf_master_t *m = c->m;
    uint32_t count;
    uint16_t flags;
    uint8_t rtype;
    kvf_status_t st;
    kvf_wr_t w;

    kvf_wr_init(&w);
    st = kvf_m_serve_worker(m, c->cl, &j->f, &w, &count, &flags, &rtype);
    st = kvf_sp_send(c->fd, &c->mac, rtype, j->f.hdr.id, st, count, flags, &w,
                     kvf_time_ms() + m->opts.io_timeout_ms);
    if (st != KVF_OK) {
        c->dead = 1;
    }
    kvf_wr_free(&w);
    kvf_free(j);
    c->last_ms = kvf_time_ms();
    __atomic_store_n(&c->busy, 0, __ATOMIC_RELEASE);
    /* EPOLLOUT fires at once: the loop serves any frame already buffered */
    kvf_loop_watch(c, EPOLLIN | EPOLLOUT, EPOLL_CTL_ADD);
    __atomic_sub_fetch(&m->helpers, 1, __ATOMIC_ACQ_REL);
}

static void *kvf_reg_main(void *arg)
{
    struct kvf_mreg *r = arg;
    kvf_loop_job_t *j;

    for (;;) {
        pthread_mutex_lock(&r->lock);
        while (!r->stop && r->head == NULL) {
            pthread_cond_wait(&r->cond, &r->lock);
        }
        if (r->stop) {
            pthread_mutex_unlock(&r->lock);
            return NULL;
        }
        j = r->head;
        r->head = j->next;
        if (r->head == NULL) {
            r->tail = NULL;
        }
        r->queued--;
        r->queued_reg -= j->f.hdr.type == KVF_SP_NODE_REG;
        pthread_mutex_unlock(&r->lock);
        kvf_reg_run(j);
    }
}

/* Stops the workers (each ends its registration, bounded by the
 * timeouts); queued ones are dropped, their connections closed later. */
static void kvf_reg_stop(kvf_master_t *m)
{
    struct kvf_mreg *r = m->reg;
    kvf_loop_job_t *j;
    unsigned i;

    if (r == NULL) {
        return;
    }
    pthread_mutex_lock(&r->lock);
    r->stop = 1;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
    for (i = 0; i < r->nthreads; i++) {
        pthread_join(r->threads[i], NULL);
    }
    while ((j = r->head) != NULL) {
        r->head = j->next;
        kvf_free(j);
    }
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
    kvf_free(r);
    m->reg = NULL;
}

static kvf_status_t kvf_reg_start(kvf_master_t *m)
{
    unsigned n = m->opts.reg_workers ? m->opts.reg_workers : 1;
    struct kvf_mreg *r = kvf_calloc(1, sizeof(*r) + n * sizeof(pthread_t));

    if (r == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&r->lock, NULL);
    kvf_cond_init(&r->cond);
    /* commits of an elected leader and gets of objects on disk go to
     * the workers too: a connection has at most one frame there, so the
     * connection caps bound the queue; registrations have their own
     * bound within it */
    r->max_reg = n * KVF_REG_QUEUE_PER_WORKER;
    r->max_queued = r->max_reg + m->opts.conn_max_tcp + m->opts.conn_max_unix;
    m->reg = r;
    for (r->nthreads = 0; r->nthreads < n; r->nthreads++) {
        if (pthread_create(&r->threads[r->nthreads], NULL, kvf_reg_main, r) !=
            0) {
            kvf_error("master cannot start its registration workers");
            kvf_reg_stop(m);
            return KVF_ERR_NO_RESOURCE;
        }
    }
    return KVF_OK;
}

/* Queues a node registration (the frame at the head of c->in) for the
 * workers. Returns 0, or -1 when the queue is full (refuse it busy). */
static int kvf_loop_offload(kvf_master_t *m, kvf_mconn_t *c,
                            const kvf_frame_hdr_t *h)
{
    struct kvf_mreg *r = m->reg;
    kvf_loop_job_t *j;

    int reg = h->type == KVF_SP_NODE_REG;

    pthread_mutex_lock(&r->lock);
    if (r->queued >= r->max_queued || (reg && r->queued_reg >= r->max_reg)) {
        pthread_mutex_unlock(&r->lock);
        kvf_log_rl(KVF_LOG_WARN,
                   "master has %u frames (%u node registrations) queued for "
                   "its workers: refusing one more (busy)",
                   r->queued, r->queued_reg);
        return -1;
    }
    r->queued++;
    r->queued_reg += reg;
    pthread_mutex_unlock(&r->lock);
    j = kvf_calloc(1, sizeof(*j) + h->meta_len + 1);
    if (j == NULL) {
        pthread_mutex_lock(&r->lock);
        r->queued--;
        r->queued_reg -= reg;
        pthread_mutex_unlock(&r->lock);
        return -1;
    }
    j->c = c;
    j->f.hdr = *h;
    j->f.body = (unsigned char *)(j + 1);
    memcpy(j->f.body, c->in + KVF_WIRE_HDR_LEN, h->meta_len);
    epoll_ctl(c->loop->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    __atomic_store_n(&c->busy, 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&m->helpers, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_lock(&r->lock);
    if (r->tail != NULL) {
        r->tail->next = j;
    } else {
        r->head = j;
    }
    r->tail = j;
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->lock);
    return 0;
}

/* Serves every whole frame in c->in. 0 to go on, -1 to close, 1 when the
 * connection went to a registration worker. */
static int kvf_loop_frames(kvf_master_t *m, kvf_mconn_t *c, kvf_wr_t *w)
{
    kvf_sp_frame_t f = {0};
    uint32_t count;
    uint16_t flags;
    uint8_t rtype;
    kvf_status_t st;
    size_t used = 0, need;

    while (c->in_len - used >= KVF_WIRE_HDR_LEN && c->out_len == 0) {
        st = kvf_frame_unpack(c->in + used, &f.hdr);
        if (st == KVF_OK &&
            (f.hdr.data_len != 0 || f.hdr.meta_len > KVF_SP_BODY_MAX)) {
            st = KVF_ERR_MSG_TOO_LARGE;
        }
        if (st != KVF_OK) {
            kvf_m_count_error(m);
            kvf_log_rl(KVF_LOG_WARN,
                       "store connection fd %d: bad frame: "
                       "%s; closing it",
                       c->fd, kvf_status_str(st));
            kvf_loop_reply(c, KVF_SP_ERROR | KVF_SP_REPLY, 0, st, 0, 0, NULL);
            kvf_loop_flush(c);
            return -1;
        }
        need = kvf_sp_frame_len(&c->mac, &f.hdr);
        if (c->in_len - used < need) {
            break;
        }
        if (kvf_wire_mac_on(&c->mac) &&
            kvf_wire_mac_check_hdr(
                &c->mac, &f.hdr, c->in + used + KVF_WIRE_HDR_LEN,
                f.hdr.meta_len,
                c->in + used + KVF_WIRE_HDR_LEN + f.hdr.meta_len,
                c->is_unix ? "store connection (local)" : "store connection") !=
                KVF_OK) {
            kvf_m_count_error(m);
            return -1;
        }
        f.body = c->in + used + KVF_WIRE_HDR_LEN;
        if (kvf_m_to_worker(m, &f)) {
            if (used > 0) {
                memmove(c->in, c->in + used, c->in_len - used);
                c->in_len -= used;
                used = 0;
            }
            if (kvf_loop_offload(m, c, &f.hdr) == 0) {
                memmove(c->in, c->in + need, c->in_len - need);
                c->in_len -= need;
                return 1;
            }
            if (kvf_loop_reply(c, f.hdr.type | KVF_SP_REPLY, f.hdr.id,
                               KVF_ERR_BUSY, 0, 0, NULL) != 0) {
                return -1;
            }
            used += need;
            continue;
        }
        f.body = c->in + used + KVF_WIRE_HDR_LEN;
        st = kvf_m_serve(m, c->cl, &f, w, &count, &flags, &rtype);
        if (kvf_loop_reply(c, rtype, f.hdr.id, st, count, flags, w) != 0) {
            return -1;
        }
        used += need;
    }
    if (used > 0) {
        memmove(c->in, c->in + used, c->in_len - used);
        c->in_len -= used;
        /* the clock of a cut frame starts with its first byte */
        c->partial_since = c->in_len ? kvf_time_ms() : 0;
    }
    return 0;
}

/* Reads what is there and serves it; -1 to close the connection. */
static int kvf_loop_read(kvf_master_t *m, kvf_mconn_t *c, kvf_wr_t *w)
{
    kvf_frame_hdr_t h;
    unsigned char *nb;
    size_t want;
    ssize_t n;
    int rc;

    for (;;) {
        want = KVF_LOOP_IN_MIN;
        if (c->in_len >= KVF_WIRE_HDR_LEN &&
            kvf_frame_unpack(c->in, &h) == KVF_OK &&
            h.meta_len <= KVF_SP_BODY_MAX) {
            want = kvf_sp_frame_len(&c->mac, &h);
            want = want > KVF_LOOP_IN_MIN ? want : KVF_LOOP_IN_MIN;
        }
        if (c->in_cap < want) {
            nb = kvf_realloc(c->in, want);
            if (nb == NULL) {
                return -1;
            }
            c->in = nb;
            c->in_cap = want;
        }
        n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
        if (n == 0) {
            if (c->in_len > 0) {
                kvf_m_count_error(m);
                kvf_log_rl(KVF_LOG_WARN,
                           "store connection fd %d closed "
                           "inside a frame (%zu bytes)",
                           c->fd, c->in_len);
            }
            return -1;
        }
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
        }
        c->last_ms = kvf_time_ms();
        if (c->in_len == 0) {
            c->partial_since = c->last_ms;
        }
        c->in_len += (size_t)n;
        rc = kvf_loop_frames(m, c, w);
        if (rc != 0) {
            return rc > 0 ? 0 : -1;
        }
        if (c->out_len > 0) {
            kvf_loop_watch(c, EPOLLOUT, EPOLL_CTL_MOD);
            return 0; /* read again once the replies are out */
        }
        if (c->in_len < c->in_cap) {
            return 0; /* the socket had no more */
        }
    }
}

/* Puts a connection in its loop's list and epoll set (its own thread). */
static void kvf_loop_adopt(kvf_mloop_t *l, kvf_mconn_t *c)
{
    c->next = l->conns;
    l->conns = c;
    kvf_loop_watch(c, EPOLLIN, EPOLL_CTL_ADD);
}

/* Takes the connections the first loop handed over. */
static void kvf_loop_take_incoming(kvf_mloop_t *l)
{
    kvf_mconn_t *c, *next;
    uint64_t v;

    if (read(l->efd, &v, sizeof(v)) < 0 && errno != EAGAIN) {
        kvf_log_rl(KVF_LOG_WARN, "master loop eventfd read: %m");
    }
    pthread_mutex_lock(&l->in_lock);
    c = l->incoming;
    l->incoming = NULL;
    pthread_mutex_unlock(&l->in_lock);
    for (; c != NULL; c = next) {
        next = c->next;
        kvf_loop_adopt(l, c);
    }
}

/* The first loop's: gives a new connection to the next loop in turn. */
static void kvf_loop_hand_over(kvf_master_t *m, kvf_mconn_t *c)
{
    kvf_mloop_t *l = &m->loops[m->next_loop++ % m->nloops];
    uint64_t one = 1;

    c->loop = l;
    if (l == &m->loops[0]) {
        kvf_loop_adopt(l, c);
        return;
    }
    pthread_mutex_lock(&l->in_lock);
    c->next = l->incoming;
    l->incoming = c;
    pthread_mutex_unlock(&l->in_lock);
    if (write(l->efd, &one, sizeof(one)) < 0) {
        kvf_log_rl(KVF_LOG_WARN, "master loop eventfd write: %m");
    }
}

/* Starts the authentication exchange of a new connection. */
static kvf_status_t kvf_loop_auth_init(kvf_master_t *m, kvf_mconn_t *c)
{
    kvf_status_t st;

    c->since = kvf_time_ms();
    c->auth = kvf_calloc(1, sizeof(*c->auth));
    if (c->auth == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    st = kvf_auth_srv_init(c->auth, NULL, "store");
    if (st != KVF_OK || !c->auth->on) {
        kvf_free(c->auth);
        c->auth = NULL;
    }
    (void)m;
    return st;
}

/* Advances a connection's authentication: 0 while it goes on (the
 * connection waits for the events it needs), 1 once done, -1 to close. */
static int kvf_loop_auth_step(kvf_mconn_t *c)
{
    char peer[96];
    uint32_t events = 0;
    kvf_status_t st;

    if (c->is_unix) {
        snprintf(peer, sizeof(peer), "local");
    } else {
        kvf_auth_peer_name(c->fd, peer, sizeof(peer));
    }
    st = kvf_auth_srv_step(c->auth, c->fd, peer, &events);
    if (st == KVF_INPROGRESS) {
        kvf_loop_watch(c, events == POLLOUT ? EPOLLOUT : EPOLLIN,
                       EPOLL_CTL_MOD);
        return 0;
    }
    if (st == KVF_OK) {
        st = kvf_auth_srv_mac(c->auth, &c->mac);
    }
    if (st != KVF_OK) {
        kvf_m_count_error(c->m);
        return -1;
    }
    kvf_free(c->auth);
    c->auth = NULL;
    kvf_loop_watch(c, EPOLLIN, EPOLL_CTL_MOD);
    return 1;
}

/* Out of descriptors: the first loop stops watching the listening
 * sockets for a moment (the pending connections wait in the backlog)
 * instead of waking on them again and again. */
static void kvf_loop_accept_pause(kvf_master_t *m)
{
    kvf_mloop_t *l = &m->loops[0];

    kvf_log_rl(KVF_LOG_ERROR, "master cannot accept: %m; pausing %u ms",
               KVF_ACCEPT_PAUSE_MS);
    epoll_ctl(l->epfd, EPOLL_CTL_DEL, m->lfd, NULL);
    if (m->ufd >= 0) {
        epoll_ctl(l->epfd, EPOLL_CTL_DEL, m->ufd, NULL);
    }
    l->accept_paused_until = kvf_time_ms() + KVF_ACCEPT_PAUSE_MS;
}

static void kvf_loop_accept_resume(kvf_master_t *m)
{
    kvf_mloop_t *l = &m->loops[0];
    struct epoll_event e = {.events = EPOLLIN};

    if (l->accept_paused_until == 0 || kvf_time_ms() < l->accept_paused_until) {
        return;
    }
    l->accept_paused_until = 0;
    e.data.ptr = &kvf_loop_tcp_tag;
    epoll_ctl(l->epfd, EPOLL_CTL_ADD, m->lfd, &e);
    if (m->ufd >= 0) {
        e.data.ptr = &kvf_loop_unix_tag;
        epoll_ctl(l->epfd, EPOLL_CTL_ADD, m->ufd, &e);
    }
}

/* A new connection's record, counted in the caps; NULL (fd closed) when
 * a cap refuses it or memory is short. */
static kvf_mconn_t *kvf_loop_admit(kvf_master_t *m, int fd, int is_unix,
                                   const struct sockaddr *sa)
{
    kvf_mconn_t *c = kvf_calloc(1, sizeof(*c));
    int one = 1;

    if (c == NULL || kvf_m_caps_admit(m, fd, is_unix, sa, &c->peer) != KVF_OK) {
        kvf_free(c);
        close(fd);
        return NULL;
    }
    c->cl = kvf_m_client_get(m, c->peer);
    if (c->cl == NULL) {
        kvf_m_caps_release(m, c->peer, is_unix);
        kvf_free(c);
        close(fd);
        return NULL;
    }
    if (!is_unix) {
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    c->m = m;
    c->fd = fd;
    c->is_unix = is_unix;
    c->last_ms = kvf_time_ms();
    return c;
}

/* Accepts on the tcp or the unix listening socket: the connections are
 * then served alike (same frames, same bounds, same limits). */
static void kvf_loop_accept(kvf_master_t *m, int is_unix)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    kvf_mconn_t *c;
    int fd;

    for (;;) {
        sl = sizeof(ss);
        fd = accept4(is_unix ? m->ufd : m->lfd, (struct sockaddr *)&ss, &sl,
                     SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOMEM ||
                errno == ENOBUFS) {
                kvf_loop_accept_pause(m);
            }
            return;
        }
        c = kvf_loop_admit(m, fd, is_unix, (struct sockaddr *)&ss);
        if (c == NULL) {
            continue;
        }
        if (kvf_loop_auth_init(m, c) != KVF_OK) {
            kvf_m_caps_release(m, c->peer, is_unix);
            kvf_m_client_put(m, c->cl);
            close(fd);
            kvf_free(c);
            continue;
        }
        __atomic_add_fetch(&m->nconns, 1, __ATOMIC_RELAXED);
        if (is_unix) {
            __atomic_add_fetch(&m->nconns_unix, 1, __ATOMIC_RELAXED);
        }
        kvf_loop_hand_over(m, c);
    }
}

/* Is c idle past master_idle_ms (nothing in or out)? */
static int kvf_loop_idle(const kvf_mconn_t *c, uint64_t now)
{
    return c->in_len == 0 && c->out_len == 0 &&
           now - c->last_ms > c->m->opts.idle_timeout_ms;
}

/* Closes connections whose frame stalled past the timeout, and idle
 * ones. */
static void kvf_loop_sweep(kvf_mloop_t *l)
{
    kvf_master_t *m = l->m;
    uint64_t now = kvf_time_ms();
    kvf_mconn_t *c, *next;

    for (c = l->conns; c != NULL; c = next) {
        next = c->next;
        if (__atomic_load_n(&c->busy, __ATOMIC_ACQUIRE)) {
            continue;
        }
        if (c->auth != NULL && now - c->since > m->opts.io_timeout_ms) {
            kvf_m_count_error(m);
            kvf_log_rl(KVF_LOG_WARN,
                       "store connection fd %d: no authentication within "
                       "%lu ms; closing it",
                       c->fd, (unsigned long)m->opts.io_timeout_ms);
            kvf_loop_close(l, c);
            continue;
        }
        if (kvf_loop_idle(c, now)) {
            kvf_debug("store connection fd %d idle for %lu ms: closing it",
                      c->fd, (unsigned long)(now - c->last_ms));
            kvf_loop_close(l, c);
            continue;
        }
        if (c->in_len > 0 && c->partial_since != 0 &&
            now - c->partial_since > m->opts.io_timeout_ms) {
            kvf_m_count_error(m);
            kvf_log_rl(KVF_LOG_WARN,
                       "store connection fd %d: frame cut "
                       "short (%zu bytes for %lu ms); closing it",
                       c->fd, c->in_len,
                       (unsigned long)(now - c->partial_since));
            kvf_loop_close(l, c);
        }
    }
}

static void *kvf_loop_main(void *arg)
{
    struct epoll_event ev[KVF_LOOP_EVENTS];
    kvf_mloop_t *l = arg;
    kvf_master_t *m = l->m;
    uint64_t last_sweep = kvf_time_ms();
    kvf_mconn_t *c;
    kvf_wr_t w;
    int n, i, rc;

    kvf_wr_init(&w);
    while (!__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE)) {
        n = epoll_wait(l->epfd, ev, KVF_LOOP_EVENTS, KVF_LOOP_TICK_MS);
        for (i = 0; i < n; i++) {
            if (ev[i].data.ptr == &kvf_loop_tcp_tag ||
                ev[i].data.ptr == &kvf_loop_unix_tag) {
                kvf_loop_accept(m, ev[i].data.ptr == &kvf_loop_unix_tag);
                continue;
            }
            if (ev[i].data.ptr == l) {
                kvf_loop_take_incoming(l);
                continue;
            }
            c = ev[i].data.ptr;
            if (__atomic_load_n(&c->busy, __ATOMIC_ACQUIRE)) {
                continue;
            }
            rc = c->dead ? -1 : 0;
            if (rc == 0 && c->auth != NULL) {
                rc = kvf_loop_auth_step(c);
                rc = rc < 0 ? -1 : 0;
                if (rc == 0 && c->auth != NULL) {
                    continue;
                }
            }
            if (rc == 0 && (ev[i].events & EPOLLOUT)) {
                rc = kvf_loop_flush(c);
                if (rc == 1) {
                    kvf_loop_watch(c, EPOLLIN, EPOLL_CTL_MOD);
                    rc = kvf_loop_frames(m, c, &w);
                    if (rc == 0 && c->out_len > 0) {
                        kvf_loop_watch(c, EPOLLOUT, EPOLL_CTL_MOD);
                    }
                    rc = rc > 0 ? 0 : rc;
                }
            }
            if (rc == 0 && c->out_len == 0 &&
                (ev[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))) {
                rc = kvf_loop_read(m, c, &w);
            }
            if (rc < 0) {
                kvf_loop_close(l, c);
            }
        }
        if (kvf_time_ms() - last_sweep >= KVF_LOOP_TICK_MS) {
            kvf_loop_sweep(l);
            if (l == &m->loops[0]) {
                kvf_loop_accept_resume(m);
            }
            last_sweep = kvf_time_ms();
        }
    }
    kvf_wr_free(&w);
    return NULL;
}

static int kvf_loop_watch_fd(int epfd, int fd, void *tag)
{
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = tag};
    int flags = fcntl(fd, F_GETFL);

    return (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 ||
            epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &e) != 0)
               ? -1
               : 0;
}

/* The number of loops: the option, or one per 8 CPUs (1 to 4). */
static unsigned kvf_loop_count(const kvf_master_t *m)
{
    long cpus;

    if (m->opts.loops > 0) {
        return m->opts.loops;
    }
    cpus = sysconf(_SC_NPROCESSORS_ONLN);
    cpus = cpus < 8 ? 1 : cpus / 8;
    return cpus > KVF_LOOPS_AUTO_MAX ? KVF_LOOPS_AUTO_MAX : (unsigned)cpus;
}

/* Closes every connection of the loops and their descriptors; the loop
 * threads have stopped (or never started). */
static void kvf_loop_teardown(kvf_master_t *m)
{
    kvf_mloop_t *l;
    kvf_mconn_t *c;
    unsigned i;

    for (i = 0; i < m->nloops; i++) {
        l = &m->loops[i];
        while (l->conns != NULL) {
            kvf_loop_close(l, l->conns);
        }
        while ((c = l->incoming) != NULL) {
            l->incoming = c->next;
            kvf_loop_free(c);
        }
        if (l->efd >= 0) {
            close(l->efd);
        }
        if (l->epfd >= 0) {
            close(l->epfd);
        }
        pthread_mutex_destroy(&l->in_lock);
    }
    kvf_free(m->loops);
    m->loops = NULL;
    m->nloops = 0;
}

static void kvf_loop_join(kvf_master_t *m)
{
    unsigned i;

    __atomic_store_n(&m->stop, 1, __ATOMIC_RELEASE);
    for (i = 0; i < m->nloops; i++) {
        if (m->loops[i].started) {
            pthread_join(m->loops[i].thread, NULL);
        }
    }
}

kvf_status_t kvf_m_loop_start(kvf_master_t *m)
{
    unsigned n = kvf_loop_count(m), i;
    kvf_mloop_t *l;

    m->loops = kvf_calloc(n, sizeof(*m->loops));
    if (m->loops == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    m->nloops = n;
    for (i = 0; i < n; i++) { /* all fit for teardown before any can fail */
        l = &m->loops[i];
        l->m = m;
        l->epfd = l->efd = -1;
        pthread_mutex_init(&l->in_lock, NULL);
    }
    for (i = 0; i < n; i++) {
        l = &m->loops[i];
        l->epfd = epoll_create1(EPOLL_CLOEXEC);
        l->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (l->epfd < 0 || l->efd < 0 ||
            kvf_loop_watch_fd(l->epfd, l->efd, l) != 0) {
            kvf_error("master cannot create its event loops: %m");
            goto err;
        }
    }
    if (kvf_loop_watch_fd(m->loops[0].epfd, m->lfd, &kvf_loop_tcp_tag) != 0 ||
        (m->ufd >= 0 && kvf_loop_watch_fd(m->loops[0].epfd, m->ufd,
                                          &kvf_loop_unix_tag) != 0)) {
        kvf_error("master cannot watch its listening sockets: %m");
        goto err;
    }
    if (kvf_reg_start(m) != KVF_OK) {
        goto err;
    }
    for (i = 0; i < n; i++) {
        if (pthread_create(&m->loops[i].thread, NULL, kvf_loop_main,
                           &m->loops[i]) != 0) {
            goto err;
        }
        m->loops[i].started = 1;
    }
    return KVF_OK;

err:
    kvf_loop_join(m);
    kvf_reg_stop(m);
    kvf_loop_teardown(m);
    return KVF_ERR_NO_RESOURCE;
}

void kvf_m_loop_stop(kvf_master_t *m)
{
    kvf_loop_join(m);
    /* registrations in flight end within their timeouts */
    kvf_reg_stop(m);
    kvf_loop_teardown(m);
}
