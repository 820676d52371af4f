/*
 * shm transport, initiator side: the ep and its workers.
 *
 * An ep has a few worker threads (the engine's conns, at most one per
 * online CPU), each with its own connection to the target, sharing one
 * request queue. A worker gathers queued requests of one type into a
 * lease (up to KVF_SHM_LEASE_BYTES / KVF_SHM_LEASE_SEGS) and pipelines
 * leases on its connection (shm_lease.c):
 *
 *     BEGIN(n+1)  copy(n)  END(n)  GRANT(n+1)  BEGIN(n+2)  copy(n+1) ...
 *
 * so the target's checks of the next lease overlap the current copy; a
 * lease's requests complete as soon as its copy is over and it is known
 * to have held (shm_lease.c). Large leases copy with streaming stores.
 * A lease kept open (below) is also published to callers that copy on
 * their own thread (shm_inline.c), and withdrawn before it ends.
 *
 * When the target granted a whole range (a pool registered whole, the
 * common case), the lease stays open after its copy, for at most
 * KVF_SHM_RIDE_MS and KVF_SHM_LINGER_US of idleness: later requests
 * inside that range ride on it with no message at all (small batches
 * then cost no round trip); anything else ends it and begins a new one.
 *
 * Failures: a lost connection fails every lease in flight on it; for one
 * timeout afterwards, new leases fail at once (a frozen target costs one
 * timeout, not one per lease), then the next one reconnects. When the
 * target is gone, its mappings are dropped. While idle, worker 0 asks
 * every second which mapped allocations the target released (SYNC).
 */
#include "transport/shm/shm.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>
#include <unistd.h>

#define KVF_SHM_IDLE_SYNC_MS 1000

struct kvf_shm_worker {
    kvf_tl_ep_t *ep;
    unsigned index;
    pthread_t thread;
    kvf_shm_conn_t conn;
    kvf_shm_lease_t lease[KVF_SHM_PIPE];
    uint64_t last_active_ms;
    uint64_t last_take_ms; /* last time it took requests */
    /* where the time goes (logged at debug level when the ep closes) */
    uint64_t leases, bytes, ns_wait, ns_copy;
};

/* After a connection failure, leases fail at once for one timeout
 * instead of each waiting a timeout on a dead or frozen target. */
static void kvf_shm_mark_down(kvf_tl_ep_t *ep)
{
    __atomic_store_n(&ep->down_until, kvf_time_ms() + ep->timeout_ms,
                     __ATOMIC_RELAXED);
}

static int kvf_shm_is_down(kvf_tl_ep_t *ep)
{
    return kvf_time_ms() < __atomic_load_n(&ep->down_until, __ATOMIC_RELAXED);
}

/* Completes the requests of a lease whose results are final (DONE, or
 * OPEN: kept open for later requests), and frees the slot of a DONE
 * one. */
static void kvf_shm_lease_finish(kvf_shm_lease_t *l)
{
    kvf_tl_req_t *q;
    size_t r, s;

    if (l->warm) { /* nothing to complete */
        l->n = 0;
        l->warm = l->state == KVF_SHM_L_OPEN;
        if (l->state != KVF_SHM_L_OPEN) {
            l->state = KVF_SHM_L_FREE;
        }
        return;
    }
    for (r = 0; r < l->nreqs; r++) {
        q = l->reqs[r];
        q->status = KVF_OK;
        if (q->seg_status != NULL) {
            for (s = 0; s < q->nsegs; s++) {
                q->seg_status[s] = KVF_OK;
            }
        }
    }
    for (s = 0; s < l->n; s++) {
        kvf_status_t st = l->st[s];

        if (st == KVF_OK && l->end_status != KVF_OK) {
            st = l->end_status; /* revoked or lost: nothing counts */
        }
        if (st != KVF_OK) {
            q = l->reqs[l->owner[s]];
            if (q->status == KVF_OK) {
                q->status = st;
            }
            if (q->seg_status != NULL) {
                q->seg_status[l->segi[s]] = st;
            }
        }
    }
    for (r = 0; r < l->nreqs; r++) {
        q = l->reqs[r];
        if (q->status == KVF_OK) {
            KVF_TL_COUNT(bytes, q->bytes);
        } else {
            KVF_TL_COUNT(errors, 1);
        }
        q->complete(q);
    }
    l->nreqs = 0;
    l->n = 0;
    if (l->state != KVF_SHM_L_OPEN) {
        l->state = KVF_SHM_L_FREE;
    }
}

static void kvf_shm_finish_done(kvf_shm_worker_t *w)
{
    unsigned i;

    for (i = 0; i < KVF_SHM_PIPE; i++) {
        if (w->lease[i].state == KVF_SHM_L_DONE) {
            kvf_shm_lease_finish(&w->lease[i]);
        }
    }
}

/* The connection is lost: every lease in flight fails with status. */
static void kvf_shm_fail_all(kvf_shm_worker_t *w, kvf_status_t status)
{
    unsigned i;
    size_t s;

    kvf_log_rl(KVF_LOG_ERROR, "shm: connection to the target lost: %s",
               kvf_status_str(status));
    kvf_shm_mark_down(w->ep); /* inline callers stop here too */
    kvf_shm_ride_withdraw(w->ep, w->index);
    kvf_shm_conn_close(&w->conn);
    for (i = 0; i < KVF_SHM_PIPE; i++) {
        kvf_shm_lease_t *l = &w->lease[i];

        if (l->state == KVF_SHM_L_FREE) {
            continue;
        }
        if (l->state == KVF_SHM_L_BEGUN || l->state == KVF_SHM_L_GRANTED) {
            for (s = 0; s < l->n; s++) {
                l->st[s] = status;
            }
        }
        l->end_status = status;
        l->state = KVF_SHM_L_DONE;
    }
    kvf_shm_finish_done(w);
}

static kvf_shm_lease_t *kvf_shm_slot(kvf_shm_worker_t *w, int state)
{
    unsigned i;

    for (i = 0; i < KVF_SHM_PIPE; i++) {
        if (w->lease[i].state == state) {
            return &w->lease[i];
        }
    }
    return NULL;
}

static int kvf_shm_in_flight(kvf_shm_worker_t *w)
{
    unsigned i;

    for (i = 0; i < KVF_SHM_PIPE; i++) {
        if (w->lease[i].state != KVF_SHM_L_FREE) {
            return 1;
        }
    }
    return 0;
}

/*
 * Moves queued requests of one type into lease l; 0 when none. Requests
 * canceled meanwhile complete at once.
 *
 * A lease takes at most its share of what is queued (queued bytes over
 * the workers times the leases each pipelines, between KVF_SHM_LEASE_MIN
 * and KVF_SHM_LEASE_BYTES): a
 * worker also takes a second lease for its pipeline, and without the
 * share the first worker awake took a 16 MB batch whole and copied it
 * alone while the other slept; and a worker the scheduler sets aside
 * holds back only its share, not the rest of the batch. The least share
 * is small (512 KiB) so that a batch submitted in slices as its caller
 * builds it (the Python package's lists) keeps every worker busy from
 * its first slice on; 1 MiB left half of them idle until the next.
 */
static size_t kvf_shm_take(kvf_shm_worker_t *w, kvf_shm_lease_t *l)
{
    kvf_tl_ep_t *ep = w->ep;
    kvf_tl_req_t *q, *canceled = NULL;
    uint64_t bytes = 0, share;
    size_t segs = 0, r, s, n;

    l->nreqs = 0;
    pthread_mutex_lock(&ep->lock);
    share = ep->qbytes / (ep->nworkers * KVF_SHM_PIPE);
    share = share < KVF_SHM_LEASE_MIN     ? KVF_SHM_LEASE_MIN
            : share > KVF_SHM_LEASE_BYTES ? KVF_SHM_LEASE_BYTES
                                          : share;
    while (!ep->stop && (q = ep->head) != NULL) {
        if (l->nreqs > 0 && (q->type != l->type || bytes + q->bytes > share ||
                             segs + q->nsegs > KVF_SHM_LEASE_SEGS)) {
            break;
        }
        if (l->nreqs == l->reqs_cap) {
            size_t cap = l->reqs_cap ? l->reqs_cap * 2 : 64;
            kvf_tl_req_t **p = kvf_realloc(l->reqs, cap * sizeof(*p));

            if (p == NULL) {
                break;
            }
            l->reqs = p;
            l->reqs_cap = cap;
        }
        ep->head = q->next;
        if (ep->head == NULL) {
            ep->tail = NULL;
        }
        ep->qbytes -= q->bytes;
        q->next = NULL;
        if (q->cancel != NULL && __atomic_load_n(q->cancel, __ATOMIC_ACQUIRE)) {
            q->next = canceled;
            canceled = q;
            continue;
        }
        if (l->nreqs == 0) {
            l->type = q->type;
        }
        l->reqs[l->nreqs++] = q;
        bytes += q->bytes;
        segs += q->nsegs;
    }
    if (ep->head != NULL) {
        pthread_cond_signal(&ep->cond); /* more for another worker */
    }
    pthread_mutex_unlock(&ep->lock);
    while ((q = canceled) != NULL) {
        canceled = q->next;
        kvf_tl_req_fail(q, KVF_ERR_CANCELED);
    }
    if (l->nreqs == 0) {
        return 0;
    }
    if (kvf_shm_lease_reserve(l, segs) != KVF_OK) {
        for (r = 0; r < l->nreqs; r++) {
            kvf_tl_req_fail(l->reqs[r], KVF_ERR_NO_MEMORY);
        }
        l->nreqs = 0;
        return 0;
    }
    for (r = 0, n = 0; r < l->nreqs; r++) {
        q = l->reqs[r];
        for (s = 0; s < q->nsegs; s++) {
            if (q->segs[s].len == 0) {
                continue;
            }
            l->local[n] = q->segs[s].local;
            l->remote[n] = q->segs[s].remote;
            l->lens[n] = q->segs[s].len;
            l->st[n] = KVF_ERR_INTERNAL;
            l->owner[n] = (uint32_t)r;
            l->segi[n] = (uint32_t)s;
            n++;
        }
    }
    l->n = n;
    l->bytes = bytes;
    w->last_take_ms = kvf_time_ms();
    return l->nreqs;
}

/* Closes the worker's connection, when nothing is in flight on it and
 * the target closed it while idle
 * (idle_timeout_ms), so the caller reconnects; always 1. */
static int kvf_shm_reopen_idle(kvf_shm_worker_t *w)
{
    if (w->conn.fd >= 0 && w->conn.ecount == 0 &&
        kvf_tl_peer_gone(w->conn.fd)) {
        kvf_debug("shm: the target closed an idle connection; reconnecting");
        kvf_shm_conn_close(&w->conn);
    }
    return 1;
}

/* Sends a taken lease's BEGIN, or fails it at once. */
static void kvf_shm_start(kvf_shm_worker_t *w, kvf_shm_lease_t *l)
{
    kvf_status_t st = KVF_OK;
    size_t s;

    if (l->n == 0 || l->n > KVF_SHM_ENTRIES_MAX) {
        /* only empty segments, or more than one message holds */
        st = (l->n == 0) ? KVF_OK : KVF_ERR_MSG_TOO_LARGE;
    } else if (kvf_shm_is_down(w->ep)) {
        st = KVF_ERR_PEER_UNREACHABLE;
    } else if (kvf_shm_reopen_idle(w) && w->conn.fd < 0 &&
               kvf_shm_conn_open(w->ep, &w->conn) != KVF_OK) {
        kvf_log_rl(KVF_LOG_ERROR, "shm: target unreachable");
        kvf_shm_mark_down(w->ep);
        kvf_shm_drop_maps(w->ep); /* it is gone: release its pages */
        st = KVF_ERR_PEER_UNREACHABLE;
    } else {
        st = kvf_shm_post_begin(w->ep, &w->conn, l);
        if (st == KVF_OK) {
            return;
        }
        l->state = KVF_SHM_L_FREE;
        kvf_shm_fail_all(w, st);
    }
    for (s = 0; s < l->n; s++) {
        l->st[s] = st;
    }
    l->end_status = st;
    l->state = KVF_SHM_L_DONE;
    kvf_shm_lease_finish(l);
}

/* 1 if later requests may ride on lease l (it has a range grant). */
static int kvf_shm_rideable(const kvf_shm_lease_t *l)
{
    unsigned k;

    for (k = 0; k < l->nallocs; k++) {
        if (l->ranges[k] > 0) {
            return 1;
        }
    }
    return 0;
}

/* Copies a granted lease (riding or not), judges whether its lease held,
 * and either ends it or, when later requests may ride on it, keeps it
 * open. `ride` is the open lease it rode on, or NULL. */
static void kvf_shm_run(kvf_shm_worker_t *w, kvf_shm_lease_t *cur,
                        kvf_shm_lease_t *ride)
{
    kvf_tl_ep_t *ep = w->ep;
    kvf_status_t st = KVF_OK;
    uint64_t t0 = kvf_time_ns();

    if (ride == NULL) {
        st = kvf_shm_lease_prepare(ep, &w->conn, cur);
    }
    if (st == KVF_OK && cur->warm) {
        pthread_rwlock_unlock(&ep->map_lock); /* nothing to copy */
    } else if (st == KVF_OK) {
        st = kvf_shm_lease_copy(ep, &w->conn, cur,
                                cur->bytes >= KVF_SHM_STREAM_MIN);
    }
    w->ns_copy += kvf_time_ns() - t0;
    w->bytes += cur->bytes;
    w->leases++;
    if (st == KVF_OK && ride != NULL) {
        cur->end_status = kvf_shm_lease_held(&w->conn, ride);
        cur->state = KVF_SHM_L_DONE;
        st = cur->end_status;
    } else if (st == KVF_OK && kvf_shm_rideable(cur) &&
               kvf_time_ms() < cur->begin_ms + KVF_SHM_RIDE_MS) {
        cur->end_status = kvf_shm_lease_held(&w->conn, cur);
        cur->state = KVF_SHM_L_OPEN;
        st = cur->end_status;
        if (st == KVF_OK) {
            kvf_shm_ride_publish(ep, w->index, cur, w->conn.fd);
        }
    } else if (st == KVF_OK) {
        st = kvf_shm_post_end(ep, &w->conn, cur);
    }
    if (st != KVF_OK) {
        kvf_shm_fail_all(w, st);
    }
}

/* Ends the open lease (its requests completed already). */
static void kvf_shm_end_open(kvf_shm_worker_t *w, kvf_shm_lease_t *open)
{
    kvf_status_t st;

    kvf_shm_ride_withdraw(w->ep, w->index); /* no inline copy in it now */
    st = kvf_shm_post_end(w->ep, &w->conn, open);
    if (st != KVF_OK) {
        kvf_shm_fail_all(w, st);
    }
    kvf_shm_finish_done(w);
}

static int kvf_shm_wait_work(kvf_tl_ep_t *ep, int wait_us);

/* KVF_SHM_WARM_MS, or the key shm_warm_ms (0: off), read once. */
static uint64_t kvf_shm_warm_ms(void)
{
    static int64_t cached = -1;

    return (uint64_t)kvf_shm_env_knob(&cached, "shm_warm_ms", KVF_SHM_WARM_MS,
                                      10000);
}

/* Ends the open lease and begins a warm one in its place: one entry (a
 * byte at the start of a range the open lease was granted), no
 * requests; once granted it stays open like any other (shm_ep.c). */
static void kvf_shm_renew(kvf_shm_worker_t *w, kvf_shm_lease_t *open)
{
    kvf_shm_lease_t *l;
    uint64_t base = 0;
    unsigned k;

    for (k = 0; k < open->nallocs && base == 0; k++) {
        if (open->ranges[k] > 0) {
            base = open->bases[k];
        }
    }
    kvf_shm_end_open(w, open);
    /* nothing in flight now: unmap what the target released (a GRANT
     * showed a new epoch), as an idle worker would; a worker kept warm by
     * steady traffic would otherwise never do it */
    if (__atomic_exchange_n(&w->ep->need_sync, 0, __ATOMIC_RELAXED) &&
        w->conn.fd >= 0 && kvf_shm_sync(w->ep, &w->conn) != KVF_OK) {
        kvf_shm_conn_close(&w->conn);
    }
    l = kvf_shm_slot(w, KVF_SHM_L_FREE);
    if (base == 0 || l == NULL || w->conn.fd < 0 ||
        kvf_shm_lease_reserve(l, 1) != KVF_OK) {
        return;
    }
    l->warm = 1;
    l->type = KVF_OP_READ;
    l->nreqs = 0;
    l->n = 1;
    l->local[0] = NULL;
    l->remote[0] = base;
    l->lens[0] = 1;
    l->st[0] = KVF_OK;
    l->owner[0] = 0;
    l->segi[0] = 0;
    l->bytes = 0;
    kvf_shm_start(w, l);
}

/*
 * Nothing queued and a lease open: keep it for the next batch. Without
 * warmth it lingers KVF_SHM_LINGER_US (inline copies in it count as
 * activity). A worker that took requests within KVF_SHM_WARM_MS keeps
 * it until its KVF_SHM_RIDE_MS are over and then renews it (END, BEGIN
 * of a warm lease), so the next batch starts copying at once instead of
 * after a BEGIN/GRANT round trip that wakes both sides. The read lock
 * still has a gap at least every KVF_SHM_RIDE_MS, and a (de)registration
 * waits for an open lease as before (<= KVF_SHM_RIDE_MS). Why: see
 * docs/decisions/shm-copy-path.md.
 */
static void kvf_shm_linger(kvf_shm_worker_t *w, kvf_shm_lease_t *open)
{
    kvf_tl_ep_t *ep = w->ep;
    uint64_t now = kvf_time_ms(), ride_end = open->begin_ms + KVF_SHM_RIDE_MS;
    uint64_t warm_end = w->last_take_ms + kvf_shm_warm_ms();
    uint64_t used = __atomic_load_n(&ep->ride_used_ns, __ATOMIC_RELAXED);
    int wait_us = KVF_SHM_LINGER_US;

    if (kvf_shm_warm_ms() == 0) {
        warm_end = 0;
    } else if (used / 1000000 + kvf_shm_warm_ms() > warm_end) {
        warm_end = used / 1000000 + kvf_shm_warm_ms(); /* inline callers */
    }
    if (now < warm_end && now < ride_end) {
        wait_us =
            (int)(((warm_end < ride_end ? warm_end : ride_end) - now) * 1000);
    }
    if (kvf_shm_wait_work(ep, wait_us)) {
        return; /* the loop takes it (riding on this lease) */
    }
    now = kvf_time_ms();
    if (!__atomic_load_n(&ep->stop, __ATOMIC_RELAXED) && now < ride_end &&
        (now < warm_end || kvf_shm_ride_busy(ep))) {
        return; /* keep it */
    }
    if (!__atomic_load_n(&ep->stop, __ATOMIC_RELAXED) && now < warm_end) {
        kvf_shm_renew(w, open);
    } else {
        kvf_shm_end_open(w, open);
    }
}

/* Reads one reply; a lost connection fails what is in flight. */
static void kvf_shm_pump_one(kvf_shm_worker_t *w)
{
    uint64_t t0 = kvf_time_ns();
    kvf_status_t st;

    st = kvf_shm_pump(w->ep, &w->conn, 0, NULL, NULL);
    w->ns_wait += kvf_time_ns() - t0;
    if (st != KVF_OK) {
        kvf_shm_fail_all(w, st);
    } else {
        __atomic_store_n(&w->ep->down_until, 0, __ATOMIC_RELAXED);
    }
    kvf_shm_finish_done(w);
}

/* Waits at most wait_us for queued work (or stop). 1 when there is. */
static int kvf_shm_wait_work(kvf_tl_ep_t *ep, int wait_us)
{
    struct timespec ts;
    int have;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)wait_us * 1000;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&ep->lock);
    while (!ep->stop && ep->head == NULL) {
        if (pthread_cond_timedwait(&ep->cond, &ep->lock, &ts) != 0) {
            break;
        }
    }
    have = !ep->stop && ep->head != NULL;
    pthread_mutex_unlock(&ep->lock);
    return have;
}

/* Idle: waits for work; worker 0 syncs released allocations. Returns 0
 * when the ep stops. */
static int kvf_shm_idle(kvf_shm_worker_t *w)
{
    kvf_tl_ep_t *ep = w->ep;
    struct timespec ts;
    int timed_out = 0;

    pthread_mutex_lock(&ep->lock);
    while (!ep->stop && ep->head == NULL && !timed_out) {
        kvf_time_abs_after(&ts, KVF_SHM_IDLE_SYNC_MS);
        timed_out = pthread_cond_timedwait(&ep->cond, &ep->lock, &ts) != 0;
    }
    if (ep->stop) {
        pthread_mutex_unlock(&ep->lock);
        return 0;
    }
    pthread_mutex_unlock(&ep->lock);
    if (timed_out && w->index == 0 &&
        __atomic_load_n(&ep->nmaps, __ATOMIC_RELAXED) > 0 &&
        kvf_time_ms() - w->last_active_ms >= KVF_SHM_IDLE_SYNC_MS) {
        kvf_shm_reopen_idle(w);
        if ((w->conn.fd >= 0 || kvf_shm_conn_open(ep, &w->conn) == KVF_OK) &&
            kvf_shm_sync(ep, &w->conn) == KVF_OK) {
            w->last_active_ms = kvf_time_ms();
        } else {
            kvf_shm_conn_close(&w->conn);
            kvf_shm_drop_maps(ep); /* the target is gone */
        }
    }
    return 1;
}

static void *kvf_shm_worker_main(void *arg)
{
    kvf_shm_worker_t *w = arg;
    kvf_tl_ep_t *ep = w->ep;
    kvf_shm_lease_t *cur, *next, *open;

    for (;;) {
        cur = kvf_shm_slot(w, KVF_SHM_L_GRANTED);
        open = kvf_shm_slot(w, KVF_SHM_L_OPEN);
        if (cur == NULL) {
            if (kvf_shm_slot(w, KVF_SHM_L_BEGUN) != NULL) {
                kvf_shm_pump_one(w); /* its grant */
                continue;
            }
            next = kvf_shm_slot(w, KVF_SHM_L_FREE);
            if (next != NULL && kvf_shm_take(w, next) > 0) {
                if (open != NULL &&
                    kvf_shm_lease_ride(ep, open, next) == KVF_OK) {
                    kvf_shm_run(w, next, open); /* no round trip */
                    kvf_shm_finish_done(w);
                    continue;
                }
                if (open != NULL) {
                    kvf_shm_end_open(w, open);
                }
                kvf_shm_start(w, next);
                continue;
            }
            if (open != NULL) {
                kvf_shm_linger(w, open);
                continue;
            }
            if (kvf_shm_in_flight(w)) {
                kvf_shm_pump_one(w);
                continue;
            }
            if (__atomic_exchange_n(&ep->need_sync, 0, __ATOMIC_RELAXED) &&
                w->conn.fd >= 0 && kvf_shm_sync(ep, &w->conn) != KVF_OK) {
                kvf_shm_conn_close(&w->conn);
            }
            w->last_active_ms = kvf_time_ms();
            if (!kvf_shm_idle(w)) {
                break;
            }
            continue;
        }
        /* look ahead (unless later requests may ride on this lease): the
         * next lease's grant travels during this copy */
        if (!kvf_shm_rideable(cur)) {
            next = kvf_shm_slot(w, KVF_SHM_L_FREE);
            if (next != NULL && kvf_shm_take(w, next) > 0) {
                kvf_shm_start(w, next);
            }
        }
        if (cur->state == KVF_SHM_L_GRANTED) {
            kvf_shm_run(w, cur, NULL);
        }
        kvf_shm_finish_done(w);
        if (cur->state == KVF_SHM_L_OPEN) {
            kvf_shm_lease_finish(cur); /* complete, keep it open */
        }
    }
    return NULL;
}

/* ---- ep ---------------------------------------------------------------- */

static void kvf_shm_worker_free(kvf_shm_worker_t *w)
{
    unsigned i;

    if (w->leases > 0) {
        kvf_debug("shm worker %u: %lu leases, %.1f MB; ms copying %.1f, "
                  "waiting for the target %.1f",
                  w->index, (unsigned long)w->leases, (double)w->bytes / 1e6,
                  (double)w->ns_copy / 1e6, (double)w->ns_wait / 1e6);
    }
    kvf_shm_conn_free(&w->conn);
    for (i = 0; i < KVF_SHM_PIPE; i++) {
        kvf_shm_lease_free(&w->lease[i]);
    }
}

kvf_status_t kvf_shm_ep_open(kvf_tl_iface_t *iface, const char *address,
                             kvf_tl_ep_t **ep_p)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    kvf_tl_ep_t *ep;
    kvf_status_t st;
    uint64_t host_id;
    unsigned i, started = 0;

    ep = kvf_calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    st = kvf_shm_parse_address(address, &host_id, ep->nonce);
    if (st != KVF_OK) {
        kvf_warn("shm: bad address '%s'", address);
        kvf_free(ep);
        return st;
    }
    if (host_id != iface->host_id) {
        kvf_info("shm: target on another host or network namespace");
        kvf_free(ep);
        return KVF_ERR_UNAVAILABLE;
    }
    ep->iface = iface;
    ep->timeout_ms = iface->cfg.timeout_ms;
    ep->nworkers = iface->cfg.conns ? iface->cfg.conns : 1;
    if (ncpu > 0 && ep->nworkers > (unsigned)ncpu) {
        ep->nworkers = (unsigned)ncpu;
    }
    pthread_mutex_init(&ep->lock, NULL);
    kvf_cond_init(&ep->cond);
    pthread_rwlock_init(&ep->map_lock, NULL);
    pthread_rwlock_init(&ep->ride_lock, NULL);
    ep->ride_fd = -1;
    ep->workers = kvf_calloc(ep->nworkers, sizeof(*ep->workers));
    if (ep->workers == NULL) {
        st = KVF_ERR_NO_MEMORY;
        goto err;
    }
    for (i = 0; i < ep->nworkers; i++) {
        ep->workers[i].conn.fd = -1;
    }
    for (i = 0; i < ep->nworkers; i++) {
        kvf_shm_worker_t *w = &ep->workers[i];

        w->ep = ep;
        w->index = i;
        /* every connection shakes hands now: a refusal falls back */
        st = kvf_shm_conn_open(ep, &w->conn);
        if (st != KVF_OK) {
            goto err;
        }
    }
    for (i = 0; i < ep->nworkers; i++) {
        if (pthread_create(&ep->workers[i].thread, NULL, kvf_shm_worker_main,
                           &ep->workers[i]) != 0) {
            st = KVF_ERR_NO_RESOURCE;
            goto err;
        }
        started++;
    }
    kvf_shm_populator_start(ep);
    kvf_debug("shm: ep to %s with %u worker(s)", address, ep->nworkers);
    *ep_p = ep;
    return KVF_OK;

err:
    pthread_mutex_lock(&ep->lock);
    ep->stop = 1;
    pthread_cond_broadcast(&ep->cond);
    pthread_mutex_unlock(&ep->lock);
    for (i = 0; i < started; i++) {
        pthread_join(ep->workers[i].thread, NULL);
    }
    for (i = 0; ep->workers != NULL && i < ep->nworkers; i++) {
        kvf_shm_worker_free(&ep->workers[i]);
    }
    kvf_free(ep->workers);
    pthread_rwlock_destroy(&ep->map_lock);
    pthread_rwlock_destroy(&ep->ride_lock);
    pthread_cond_destroy(&ep->cond);
    pthread_mutex_destroy(&ep->lock);
    kvf_free(ep);
    return st;
}

void kvf_shm_ep_close(kvf_tl_ep_t *ep)
{
    kvf_tl_req_t *q;
    unsigned i;

    pthread_mutex_lock(&ep->lock);
    ep->stop = 1;
    pthread_cond_broadcast(&ep->cond);
    pthread_mutex_unlock(&ep->lock);
    for (i = 0; i < ep->nworkers; i++) {
        pthread_join(ep->workers[i].thread, NULL);
    }
    while ((q = ep->head) != NULL) {
        ep->head = q->next;
        kvf_tl_req_fail(q, KVF_ERR_CANCELED);
    }
    for (i = 0; i < ep->nworkers; i++) {
        kvf_shm_worker_free(&ep->workers[i]);
    }
    kvf_shm_populator_stop(ep);
    kvf_shm_view_fini(ep);
    kvf_shm_drop_maps(ep);
    kvf_free(ep->workers);
    pthread_rwlock_destroy(&ep->map_lock);
    pthread_rwlock_destroy(&ep->ride_lock);
    pthread_cond_destroy(&ep->cond);
    pthread_mutex_destroy(&ep->lock);
    kvf_free(ep);
}

kvf_status_t kvf_shm_ep_post(kvf_tl_ep_t *ep, kvf_tl_req_t *req)
{
    req->next = NULL;
    pthread_mutex_lock(&ep->lock);
    if (ep->stop) {
        pthread_mutex_unlock(&ep->lock);
        return KVF_ERR_PEER_CLOSED;
    }
    if (ep->tail != NULL) {
        ep->tail->next = req;
    } else {
        ep->head = req;
    }
    ep->tail = req;
    ep->qbytes += req->bytes;
    if (!__atomic_load_n(&ep->posted, __ATOMIC_RELAXED)) {
        __atomic_store_n(&ep->posted, 1, __ATOMIC_RELAXED); /* populator */
    }
    pthread_cond_signal(&ep->cond);
    pthread_mutex_unlock(&ep->lock);
    return KVF_OK;
}
