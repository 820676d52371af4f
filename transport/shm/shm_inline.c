/*
 * shm transport, initiator side: requests moved on the caller's thread.
 *
 * A worker that keeps a lease open after its copy (a range grant, see
 * shm_ep.c) publishes it here. A caller that will wait for its request
 * at once (the engine's KVF_BATCH_INLINE, ep_post_inline) may then copy
 * inside that lease itself: no queue, no worker wake-up, no wake-up of
 * the caller afterwards. On a small machine, where four threads share
 * two cores, those hand-offs cost more than copying 64 KiB.
 *
 * Safety is the posted path's: the caller copies only ranges the open
 * lease granted, through mappings the ep holds, and counts the copy only
 * if it ended within the validity the GRANT announced with no hang-up on
 * the lease's connection (kvf_shm_lease_held). The caller read-holds
 * ride_lock while it copies and judges; the worker write-holds it to
 * publish or withdraw, and withdraws before it ends the lease or closes
 * its connection, so the target never sees an END (nor a close) while an
 * inline copy inside the lease is under way.
 *
 * Anything else (no open lease, a range outside it, the lease past
 * KVF_SHM_RIDE_MS, the ep down after a lost connection, ride_lock being
 * changed) answers KVF_ERR_NOT_FOUND
 * and touches nothing: the caller posts the request as usual.
 */
#include "transport/shm/shm.h"
#include "core/log.h"
#include "core/time.h"

#include <poll.h>

void kvf_shm_ride_publish(kvf_tl_ep_t *ep, unsigned owner,
                          const kvf_shm_lease_t *l, int fd)
{
    pthread_rwlock_wrlock(&ep->ride_lock);
    ep->ride = l;
    ep->ride_fd = fd;
    ep->ride_owner = owner;
    pthread_rwlock_unlock(&ep->ride_lock);
}

void kvf_shm_ride_withdraw(kvf_tl_ep_t *ep, unsigned owner)
{
    pthread_rwlock_wrlock(&ep->ride_lock);
    if (ep->ride != NULL && ep->ride_owner == owner) {
        ep->ride = NULL;
        ep->ride_fd = -1;
    }
    pthread_rwlock_unlock(&ep->ride_lock);
}

int kvf_shm_ride_busy(kvf_tl_ep_t *ep)
{
    uint64_t used = __atomic_load_n(&ep->ride_used_ns, __ATOMIC_RELAXED);

    return used != 0 && kvf_time_ns() - used < KVF_SHM_LINGER_US * 1000ull;
}

/* Pointer of [remote, remote + len) inside the lease's range grants and
 * the ep's mappings, or NULL. Caller holds map_lock. */
static unsigned char *kvf_shm_ride_ptr(kvf_tl_ep_t *ep,
                                       const kvf_shm_lease_t *l,
                                       uint64_t remote, uint64_t len)
{
    unsigned char *base;
    unsigned k;

    for (k = 0; k < l->nallocs; k++) {
        if (l->ranges[k] == 0 || remote < l->bases[k] ||
            remote - l->bases[k] >= l->ranges[k] ||
            len > l->ranges[k] - (remote - l->bases[k])) {
            continue;
        }
        base = kvf_shm_map_ptr(ep, l->ids[k]);
        return base != NULL ? base + (remote - l->bases[k]) : NULL;
    }
    return NULL;
}

/* Was the lease still valid when the copy ended? (kvf_shm_lease_held on
 * the worker's connection, which stays open while ride_lock is held.) */
static kvf_status_t kvf_shm_ride_held(const kvf_tl_ep_t *ep)
{
    struct pollfd pfd = {.fd = ep->ride_fd, .events = POLLRDHUP};

    if (kvf_time_ms() + 1 >= ep->ride->valid_until_ms) {
        return KVF_ERR_TIMEOUT;
    }
    if (ep->ride_fd < 0 || (poll(&pfd, 1, 0) > 0 &&
                            (pfd.revents & (POLLHUP | POLLRDHUP | POLLERR)))) {
        return KVF_ERR_CONN_RESET;
    }
    return KVF_OK;
}

static void kvf_shm_inline_complete(kvf_tl_req_t *req, kvf_status_t st)
{
    size_t s;

    req->status = st;
    if (req->seg_status != NULL) {
        for (s = 0; s < req->nsegs; s++) {
            req->seg_status[s] = st;
        }
    }
    if (st == KVF_OK) {
        KVF_TL_COUNT(bytes, req->bytes);
    } else {
        KVF_TL_COUNT(errors, 1);
    }
    req->complete(req);
}

/* Segments s and s + 1 copied together (kvf_shm_copy_stream2), p the
 * view of the first; 0 when they do not qualify and neither moved. */
static int kvf_shm_inline_pair(kvf_tl_ep_t *ep, const kvf_shm_lease_t *l,
                               const kvf_tl_req_t *req, size_t s,
                               unsigned char *p)
{
    const kvf_tl_seg_t *a = &req->segs[s], *b = &req->segs[s + 1];
    unsigned char *q = kvf_shm_ride_ptr(ep, l, b->remote, b->len);

    return req->type == KVF_OP_WRITE
               ? kvf_shm_copy_stream2(p, a->local, q, b->local, a->len)
               : kvf_shm_copy_stream2(a->local, p, b->local, q, a->len);
}

kvf_status_t kvf_shm_ep_post_inline(kvf_tl_ep_t *ep, kvf_tl_req_t *req)
{
    kvf_status_t (*copy)(void *, const void *, size_t);
    const kvf_shm_lease_t *l;
    kvf_status_t st = KVF_OK;
    unsigned char *p;
    size_t s;

    if ((req->type != KVF_OP_READ && req->type != KVF_OP_WRITE) ||
        (req->cancel != NULL &&
         __atomic_load_n(req->cancel, __ATOMIC_ACQUIRE))) {
        return KVF_ERR_NOT_FOUND;
    }
    if (pthread_rwlock_tryrdlock(&ep->ride_lock) != 0) {
        return KVF_ERR_NOT_FOUND; /* the worker is changing it */
    }
    l = ep->ride;
    /* after a connection failure the ep is down for one timeout: what
     * is posted then fails at once, and nothing moves inline either */
    if (l == NULL || kvf_time_ms() >= l->begin_ms + KVF_SHM_RIDE_MS ||
        kvf_time_ms() + 1 >= l->valid_until_ms ||
        kvf_time_ms() < __atomic_load_n(&ep->down_until, __ATOMIC_RELAXED)) {
        pthread_rwlock_unlock(&ep->ride_lock);
        return KVF_ERR_NOT_FOUND;
    }
    pthread_rwlock_rdlock(&ep->map_lock);
    /* every segment inside the grants first: all or nothing */
    for (s = 0; s < req->nsegs; s++) {
        if (req->segs[s].len > 0 &&
            kvf_shm_ride_ptr(ep, l, req->segs[s].remote, req->segs[s].len) ==
                NULL) {
            pthread_rwlock_unlock(&ep->map_lock);
            pthread_rwlock_unlock(&ep->ride_lock);
            return KVF_ERR_NOT_FOUND;
        }
    }
    copy =
        req->bytes >= KVF_SHM_STREAM_MIN ? kvf_shm_copy_stream : kvf_shm_copy;
    for (s = 0; s < req->nsegs && st == KVF_OK; s++) {
        if (req->segs[s].len == 0) {
            continue;
        }
        p = kvf_shm_ride_ptr(ep, l, req->segs[s].remote, req->segs[s].len);
        if (copy == kvf_shm_copy_stream && s + 1 < req->nsegs &&
            req->segs[s + 1].len == req->segs[s].len &&
            kvf_shm_inline_pair(ep, l, req, s, p)) {
            s++; /* both moved */
            continue;
        }
        st = req->type == KVF_OP_WRITE
                 ? copy(p, req->segs[s].local, req->segs[s].len)
                 : copy(req->segs[s].local, p, req->segs[s].len);
    }
    if (copy == kvf_shm_copy_stream) {
        kvf_shm_fence();
    }
    kvf_shm_copy_stamp(ep);
    pthread_rwlock_unlock(&ep->map_lock);
    if (st == KVF_OK) {
        st = kvf_shm_ride_held(ep);
        if (st != KVF_OK) {
            kvf_log_rl(KVF_LOG_ERROR,
                       "shm: an inline copy outlived its "
                       "lease or the target hung up: %s",
                       kvf_status_str(st));
        }
    }
    __atomic_store_n(&ep->ride_used_ns, kvf_time_ns(), __ATOMIC_RELAXED);
    pthread_rwlock_unlock(&ep->ride_lock);
    kvf_shm_inline_complete(req, st);
    return KVF_OK;
}
