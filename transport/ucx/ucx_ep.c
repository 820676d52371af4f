/*
 * ucx transport, initiator side: an ep is one authenticated side
 * channel and ucx_workers lanes, each a UCX worker, an endpoint to one
 * of the target's workers and a progress thread. ep_post hands each
 * request to the next lane (round robin: the engine cuts batches into
 * requests of at most chunk_bytes, so a batch spreads over all lanes)
 * and wakes its thread; the thread turns the request's segments into
 * ucp_put_nbx / ucp_get_nbx calls (segments adjacent on both sides
 * merged into one call), each under the remote key of the region
 * holding it, fetched once per region and lane over the side channel.
 * A WRITE completes after an endpoint flush (the bytes are at the
 * target); a READ when its gets have landed. On a lane without an RMA
 * lane (ucx_read_mode, ucx_write_mode, ucx_push.c) a request is active
 * messages instead: a READ completes when the target's reply has been
 * copied into place, a WRITE when the target acknowledged that its bytes
 * are in place. A thread sleeps on its worker's fd when idle.
 *
 * Failures: endpoints run in UCP's peer error mode, so a dead peer
 * fails every outstanding operation; requests in flight that see no
 * completion for timeout_ms fail with KVF_ERR_TIMEOUT (the endpoint is
 * closed by force). The first lane that fails marks the ep failed and
 * wakes the others, which close their endpoints by force too: the ep
 * stays failed, later requests fail at once and the caller reopens the
 * peer.
 */
#include "transport/ucx/ucx.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

kvf_status_t kvf_ucx_ep_call(kvf_tl_ep_t *ep, uint8_t type, uint32_t count,
                             const void *meta, size_t len, kvf_frame_hdr_t *h,
                             void **reply_p)
{
    uint64_t deadline = kvf_time_ms() + ep->iface->cfg.timeout_ms;
    kvf_status_t status;
    void *reply = NULL;

    ep->side_ms = kvf_time_ms();
    status = kvf_ucx_send(ep->fd, &ep->mac, type, KVF_OK, count, meta, len,
                          deadline);
    if (status == KVF_OK) {
        status = kvf_ucx_recv_hdr(ep->fd, h, deadline);
    }
    if (status == KVF_OK && h->type != type + 1) {
        status = KVF_ERR_PROTOCOL;
    }
    if (status == KVF_OK && h->meta_len > 0) {
        reply = kvf_malloc(h->meta_len);
        status = reply == NULL ? KVF_ERR_NO_MEMORY : KVF_OK;
    }
    if (status == KVF_OK) {
        status = kvf_ucx_recv_meta(ep->fd, &ep->mac, h, reply, deadline);
    }
    if (status == KVF_OK && h->status != KVF_OK) {
        status = (kvf_status_t)h->status;
    }
    if (status != KVF_OK) {
        kvf_free(reply);
        return status;
    }
    *reply_p = reply;
    return KVF_OK;
}

/* Marks the ep failed (the first cause wins) and wakes every lane, so
 * each closes its endpoint and fails what it holds. */
static void kvf_ucx_ep_fail(kvf_tl_ep_t *ep, kvf_status_t why)
{
    kvf_status_t ok = KVF_OK;
    unsigned i;

    if (__atomic_compare_exchange_n(&ep->failed, &ok, why, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        for (i = 0; i < ep->nlanes; i++) {
            if (ep->lanes[i].worker != NULL) {
                kvf_ucx_wake(ep->lanes[i].wake);
            }
        }
    }
}

static kvf_status_t kvf_ucx_ep_failed(kvf_tl_ep_t *ep)
{
    return __atomic_load_n(&ep->failed, __ATOMIC_ACQUIRE);
}

/* The cached key whose region holds [addr, addr+len), or NULL. */
static kvf_ucx_rkey_t *kvf_ucx_rkey_find(kvf_ucx_lane_t *ln, uint64_t addr,
                                         uint64_t len)
{
    kvf_ucx_rkey_t *k;
    size_t i;

    for (i = 0; i < ln->nrkeys; i++) {
        k = &ln->rkeys[i];
        if (addr >= k->base && addr - k->base <= k->len &&
            len <= k->len - (addr - k->base)) {
            return k;
        }
    }
    return NULL;
}

/* Asks the target for the key of the region holding [addr, addr+len). */
static kvf_status_t kvf_ucx_rkey_fetch(kvf_ucx_lane_t *ln, uint64_t addr,
                                       uint64_t len, kvf_ucx_rkey_t **k_p)
{
    unsigned char meta[KVF_UCX_RANGE_LEN];
    kvf_tl_ep_t *ep = ln->ep;
    kvf_ucx_rkey_msg_t m;
    kvf_ucx_rkey_t *grown;
    kvf_frame_hdr_t h;
    kvf_status_t status;
    void *reply = NULL;
    ucp_rkey_h rkey;
    ucs_status_t s;
    kvf_wr_t w;

    if (ln->nrkeys == ln->rkeys_cap) {
        size_t cap = ln->rkeys_cap ? ln->rkeys_cap * 2 : 4;

        grown = kvf_realloc(ln->rkeys, cap * sizeof(*grown));
        if (grown == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        ln->rkeys = grown;
        ln->rkeys_cap = cap;
    }
    kvf_wr_init_fixed(&w, meta, sizeof(meta));
    kvf_ucx_range_enc(&w, addr, len);
    pthread_mutex_lock(&ep->fd_lock);
    status =
        kvf_ucx_ep_call(ep, KVF_UCX_RKEY, 0, meta, sizeof(meta), &h, &reply);
    pthread_mutex_unlock(&ep->fd_lock);
    if (status == KVF_OK) {
        status = kvf_ucx_rkey_dec(reply, h.meta_len, addr, len, &m);
    }
    if (status == KVF_OK) {
        s = ucp_ep_rkey_unpack(ln->uep, m.rkey, &rkey);
        if (s != UCS_OK) {
            kvf_error("ucx: peer %s:%u sent a remote key UCX refuses: %s",
                      ep->host, ep->port, ucs_status_string(s));
            status = KVF_ERR_PROTOCOL;
        }
    }
    if (status == KVF_OK) {
        ln->rkeys[ln->nrkeys].base = m.base;
        ln->rkeys[ln->nrkeys].len = m.len;
        ln->rkeys[ln->nrkeys].rkey = rkey;
        *k_p = &ln->rkeys[ln->nrkeys++];
    }
    kvf_free(reply);
    return status;
}

void kvf_ucx_segs_fail(kvf_ucx_rctx_t *rc, uint32_t first, uint32_t count,
                       kvf_status_t status)
{
    uint32_t i;

    if (rc->err == KVF_OK) {
        rc->err = status;
    }
    for (i = first; i < first + count; i++) {
        rc->req->seg_status[i] = status;
    }
}

void kvf_ucx_rctx_finish(kvf_ucx_rctx_t *rc)
{
    kvf_ucx_lane_t *ln = rc->ln;
    kvf_tl_req_t *req = rc->req;

    if (rc->prev != NULL) {
        rc->prev->next = rc->next;
    } else if (ln->active == rc) {
        ln->active = rc->next;
    }
    if (rc->next != NULL) {
        rc->next->prev = rc->prev;
    }
    ln->nactive--;
    ln->inflight -= req->bytes;
    req->status = rc->err;
    if (rc->err == KVF_OK) {
        KVF_TL_COUNT(bytes, req->bytes);
    } else {
        KVF_TL_COUNT(errors, 1);
    }
    kvf_ucx_push_free(rc);
    kvf_free(rc);
    req->complete(req);
}

static void kvf_ucx_op_done(void *request, ucs_status_t s, void *user_data)
{
    kvf_ucx_op_t *op = user_data;
    kvf_ucx_rctx_t *rc = op->rc;
    kvf_ucx_lane_t *ln = rc->ln;

    ucp_request_free(request);
    if (rc->zombie) {
        rc->pending--;
        return;
    }
    if (s != UCS_OK) {
        kvf_ucx_segs_fail(rc, op->first, op->count,
                          ln->failed != KVF_OK ? ln->failed
                                               : kvf_ucx_status(s));
    }
    ln->last_ms = kvf_time_ms();
    if (--rc->pending == 0) {
        kvf_ucx_rctx_finish(rc);
    }
}

/* Issues one UCP call for op (or a flush when len is 0). */
static void kvf_ucx_op_issue(kvf_ucx_lane_t *ln, kvf_ucx_op_t *op, int write,
                             void *local, uint64_t remote, uint64_t len,
                             ucp_rkey_h rkey)
{
    ucp_request_param_t p = {0};
    ucs_status_ptr_t sp;

    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = kvf_ucx_op_done;
    p.user_data = op;
    if (len == 0) {
        sp = ucp_ep_flush_nbx(ln->uep, &p);
    } else if (write) {
        sp = ucp_put_nbx(ln->uep, local, len, remote, rkey, &p);
    } else {
        sp = ucp_get_nbx(ln->uep, local, len, remote, rkey, &p);
    }
    if (UCS_PTR_IS_PTR(sp)) {
        op->rc->pending++; /* the callback frees the request */
    } else if (UCS_PTR_STATUS(sp) != UCS_OK) {
        kvf_ucx_segs_fail(op->rc, op->first, op->count,
                          kvf_ucx_status(UCS_PTR_STATUS(sp)));
    }
}

/* Segments [i, j) adjacent on both sides and inside key k. */
static uint32_t kvf_ucx_merge(const kvf_tl_req_t *req, uint32_t i,
                              const kvf_ucx_rkey_t *k, uint64_t *len_p)
{
    const kvf_tl_seg_t *s = req->segs;
    uint64_t len = s[i].len;
    uint32_t j = i + 1;

    while (j < req->nsegs && (char *)s[i].local + len == s[j].local &&
           s[i].remote + len == s[j].remote &&
           s[j].remote + s[j].len <= k->base + k->len && s[j].len > 0) {
        len += s[j].len;
        j++;
    }
    *len_p = len;
    return j;
}

/* Whether every local segment is host memory: this UCX build cannot
 * touch GPU memory, whose requests go through pinned buffers. */
static int kvf_ucx_local_host(const kvf_tl_req_t *req)
{
    size_t i;

    if (req->local_mem != 0) {
        return !(req->local_mem & KVF_MEM_BIT(KVF_MEM_CUDA));
    }
    for (i = 0; i < req->nsegs; i++) {
        if (!kvf_mem_is_host(req->segs[i].local)) {
            return 0;
        }
    }
    return 1;
}

/* A request's context, linked into the lane's active list. */
static kvf_ucx_rctx_t *kvf_ucx_rctx_new(kvf_ucx_lane_t *ln, kvf_tl_req_t *req)
{
    kvf_ucx_rctx_t *rc;

    rc = kvf_calloc(1, sizeof(*rc) + (req->nsegs + 1) * sizeof(rc->ops[0]));
    if (rc == NULL) {
        return NULL;
    }
    rc->req = req;
    rc->ln = ln;
    rc->pending = 1; /* the starter's own, dropped when all is issued */
    rc->next = ln->active;
    if (ln->active != NULL) {
        ln->active->prev = rc;
    }
    ln->active = rc;
    ln->nactive++;
    ln->inflight += req->bytes;
    if (ln->nactive == 1) {
        ln->last_ms = kvf_time_ms();
    }
    return rc;
}

/* Turns a request into UCP calls (progress thread). */
static void kvf_ucx_req_start(kvf_ucx_lane_t *ln, kvf_tl_req_t *req)
{
    int write = req->type == KVF_OP_WRITE;
    int push = (write ? ln->wpush : ln->push) &&
               req->deadline_ms != KVF_UCX_REQ_ONE_SIDED;
    kvf_ucx_rctx_t *rc;
    kvf_ucx_rkey_t *k;
    kvf_status_t st;
    uint64_t len;
    uint32_t i, j, nops = 0;

    if (ln->failed != KVF_OK || (req->cancel != NULL && *req->cancel)) {
        kvf_tl_req_fail(req,
                        ln->failed != KVF_OK ? ln->failed : KVF_ERR_CANCELED);
        return;
    }
    if (!kvf_ucx_local_host(req) && (req = kvf_ucx_stage(ln, req)) == NULL) {
        return; /* GPU memory goes through a pinned buffer, or failed */
    }
    rc = kvf_ucx_rctx_new(ln, req);
    if (rc == NULL) {
        kvf_tl_req_fail(req, KVF_ERR_NO_MEMORY);
        return;
    }
    KVF_TL_COUNT(requests, 1);
    KVF_TL_COUNT(segments, req->nsegs);
    for (i = 0; i < req->nsegs; i++) {
        req->seg_status[i] = KVF_OK;
    }
    for (i = 0; i < req->nsegs; i = j) {
        j = i + 1;
        k = kvf_ucx_rkey_find(ln, req->segs[i].remote, req->segs[i].len);
        st = (k != NULL) ? KVF_OK
                         : kvf_ucx_rkey_fetch(ln, req->segs[i].remote,
                                              req->segs[i].len, &k);
        if (st != KVF_OK) {
            kvf_ucx_segs_fail(rc, i, 1, st);
            continue;
        }
        j = kvf_ucx_merge(req, i, k, &len);
        if (push) {
            kvf_ucx_push_add(rc, i, j - i, req->segs[i].local,
                             req->segs[i].remote, len);
            nops++;
            continue;
        }
        rc->ops[nops] = (kvf_ucx_op_t){rc, i, j - i};
        kvf_ucx_op_issue(ln, &rc->ops[nops++], write, req->segs[i].local,
                         req->segs[i].remote, len, k->rkey);
    }
    KVF_TL_COUNT(wire_entries, nops);
    if (push) {
        kvf_ucx_push_send(rc);
    }
    if (write && !push && nops > 0) {
        rc->ops[nops] = (kvf_ucx_op_t){rc, 0, (uint32_t)req->nsegs};
        kvf_ucx_op_issue(ln, &rc->ops[nops], write, NULL, 0, 0, NULL);
    }
    if (--rc->pending == 0) {
        kvf_ucx_rctx_finish(rc);
    }
}

static void kvf_ucx_ep_err(void *arg, ucp_ep_h uep, ucs_status_t s)
{
    kvf_ucx_lane_t *ln = arg;
    kvf_tl_ep_t *ep = ln->ep;

    (void)uep;
    if (ln->failed == KVF_OK) {
        kvf_warn("ucx: peer %s:%u failed (lane %u): %s", ep->host, ep->port,
                 ln->idx, ucs_status_string(s));
        ln->failed = kvf_ucx_status(s) == KVF_ERR_IO ? KVF_ERR_PEER_CLOSED
                                                     : kvf_ucx_status(s);
        kvf_ucx_ep_fail(ep, ln->failed);
    }
}

/* Closes the lane's UCP endpoint by force (outstanding operations
 * complete with an error) and waits, bounded, for the close to finish. */
static void kvf_ucx_lane_abort(kvf_ucx_lane_t *ln, kvf_status_t why)
{
    ucp_request_param_t p = {0};
    ucs_status_ptr_t sp;
    uint64_t end = kvf_time_ms() + 2000;

    if (ln->failed == KVF_OK) {
        ln->failed = why;
    }
    kvf_ucx_ep_fail(ln->ep, ln->failed);
    if (ln->uep == NULL) {
        return;
    }
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    sp = ucp_ep_close_nbx(ln->uep, &p);
    ln->uep = NULL;
    if (UCS_PTR_IS_PTR(sp)) {
        while (ucp_request_check_status(sp) == UCS_INPROGRESS &&
               kvf_time_ms() < end) {
            ucp_worker_progress(ln->worker);
        }
        ucp_request_free(sp);
    }
    /* operations UCX did not complete (no peer error handling): fail
     * them here; their memory stays until the worker is gone */
    while (ln->active != NULL) {
        kvf_ucx_rctx_t *rc = ln->active;
        kvf_tl_req_t *req = rc->req;

        ln->active = rc->next;
        ln->nactive--;
        ln->inflight -= req->bytes;
        rc->zombie = 1;
        rc->next = ln->zombies;
        ln->zombies = rc;
        kvf_ucx_segs_fail(rc, 0, (uint32_t)req->nsegs, ln->failed);
        req->status = ln->failed;
        KVF_TL_COUNT(errors, 1);
        req->complete(req);
    }
}

/* Moves posted requests into UCP (progress thread) while fewer than
 * the lane's share of KVF_UCX_WINDOW bytes are in flight (at least one
 * request): a batch of a million blocks does not become a million
 * queued UCP operations, on either side (over tcp the target queues a
 * reply per get), however many lanes the peer has. */
static void kvf_ucx_lane_drain(void *arg)
{
    kvf_ucx_lane_t *ln = arg;
    uint64_t window = KVF_UCX_WINDOW / ln->ep->nlanes;
    kvf_tl_req_t *req;

    while (ln->nactive == 0 || ln->inflight < window) {
        pthread_mutex_lock(&ln->lock);
        req = ln->head;
        if (req != NULL) {
            ln->head = req->next;
            if (ln->head == NULL) {
                ln->tail = NULL;
            }
        }
        pthread_mutex_unlock(&ln->lock);
        if (req == NULL) {
            return;
        }
        kvf_ucx_req_start(ln, req);
    }
}

/* How often a lane looks at the side channel (a syscall) for a peer
 * that closed it: the transports without peer error handling (shared
 * memory) learn of a dead target that way. */
#define KVF_UCX_PEER_CHECK_MS 20
/* Longest silence on the side channel (see kvf_ucx_keepalive_ms). */
#define KVF_UCX_KEEPALIVE_MS 10000

/* Why the lane should stop, after a wait: the ep failed (another lane
 * saw it), the side channel closed, or nothing completed for too long. */
static kvf_status_t kvf_ucx_lane_check(kvf_ucx_lane_t *ln)
{
    kvf_tl_ep_t *ep = ln->ep;
    unsigned tmo = ep->iface->cfg.timeout_ms;
    kvf_status_t why = kvf_ucx_ep_failed(ep);

    if (ln->failed != KVF_OK) {
        return ln->failed;
    }
    if (why != KVF_OK) {
        return why;
    }
    if (kvf_time_ms() - ln->peer_ms >= KVF_UCX_PEER_CHECK_MS &&
        pthread_mutex_trylock(&ep->fd_lock) == 0) {
        ln->peer_ms = kvf_time_ms();
        if (kvf_tl_peer_gone(ep->fd)) {
            kvf_warn("ucx: peer %s:%u closed its side channel", ep->host,
                     ep->port);
            why = KVF_ERR_PEER_CLOSED;
        }
        pthread_mutex_unlock(&ep->fd_lock);
    }
    if (why == KVF_OK && ln->nactive > 0 && kvf_time_ms() - ln->last_ms > tmo) {
        kvf_warn("ucx: no completion from %s:%u for %u ms (lane %u)", ep->host,
                 ep->port, tmo, ln->idx);
        why = KVF_ERR_TIMEOUT;
    }
    return why;
}

/* How often the side channel carries something: a target closes a
 * connection idle for its idle_timeout_ms (60 s by default), and a
 * closed side channel fails the peer. Lane 0 sends a HELLO (answered
 * with a worker address) when nothing else went for this long. */
static unsigned kvf_ucx_keepalive_ms(const kvf_tl_ep_t *ep)
{
    unsigned half = ep->iface->cfg.timeout_ms / 2;

    return half < KVF_UCX_KEEPALIVE_MS ? (half ? half : 1)
                                       : KVF_UCX_KEEPALIVE_MS;
}

static kvf_status_t kvf_ucx_keepalive(kvf_ucx_lane_t *ln)
{
    kvf_tl_ep_t *ep = ln->ep;
    kvf_status_t status = KVF_OK;
    void *reply = NULL;
    kvf_frame_hdr_t h;

    if (ln->idx != 0 ||
        kvf_time_ms() - ep->side_ms < kvf_ucx_keepalive_ms(ep) ||
        pthread_mutex_trylock(&ep->fd_lock) != 0) {
        return KVF_OK;
    }
    status = kvf_ucx_ep_call(ep, KVF_UCX_HELLO, 0, NULL, 0, &h, &reply);
    pthread_mutex_unlock(&ep->fd_lock);
    kvf_free(reply);
    if (status != KVF_OK) {
        kvf_warn("ucx: peer %s:%u: side channel keepalive: %s", ep->host,
                 ep->port, kvf_status_str(status));
        return KVF_ERR_PEER_CLOSED;
    }
    return KVF_OK;
}

static void *kvf_ucx_lane_main(void *arg)
{
    kvf_ucx_lane_t *ln = arg;
    int idle_ms = ln->idx == 0 ? (int)kvf_ucx_keepalive_ms(ln->ep) : -1;
    kvf_status_t why;

    while (!ln->stop) {
        kvf_ucx_lane_drain(ln);
        kvf_ucx_worker_wait(ln->worker, ln->efd, ln->wake,
                            ln->nactive > 0 ? 50 : idle_ms, NULL, &ln->spin,
                            kvf_ucx_lane_drain, ln);
        if (ln->uep == NULL) {
            continue;
        }
        why = kvf_ucx_lane_check(ln);
        if (why == KVF_OK) {
            why = kvf_ucx_keepalive(ln);
        }
        if (why != KVF_OK) {
            kvf_ucx_lane_abort(ln, why);
        }
    }
    return NULL;
}

kvf_status_t kvf_ucx_lane_post(kvf_tl_ep_t *ep, unsigned lane,
                               kvf_tl_req_t *req)
{
    kvf_ucx_lane_t *ln = &ep->lanes[lane];

    if (req->nsegs == 0 || req->nsegs > UINT32_MAX - 1) {
        return KVF_ERR_INVALID_PARAM;
    }
    req->next = NULL;
    pthread_mutex_lock(&ln->lock);
    if (ln->tail != NULL) {
        ln->tail->next = req;
    } else {
        ln->head = req;
    }
    ln->tail = req;
    pthread_mutex_unlock(&ln->lock);
    kvf_ucx_wake(ln->wake);
    return KVF_OK;
}

kvf_status_t kvf_ucx_ep_post(kvf_tl_ep_t *ep, kvf_tl_req_t *req)
{
    unsigned lane = __atomic_fetch_add(&ep->next, 1, __ATOMIC_RELAXED);

    return kvf_ucx_lane_post(ep, lane % ep->nlanes, req);
}

/* HELLO for lane ln's target worker, the lane's worker and endpoint
 * (peer error mode). */
static kvf_status_t kvf_ucx_lane_connect(kvf_ucx_lane_t *ln)
{
    kvf_tl_ep_t *ep = ln->ep;
    struct epoll_event ev = {.events = EPOLLRDHUP};
    ucp_ep_params_t p = {0};
    kvf_frame_hdr_t h;
    kvf_status_t status;
    void *addr = NULL;
    ucs_status_t s;

    status = kvf_ucx_ep_call(ep, KVF_UCX_HELLO, ln->idx, NULL, 0, &h, &addr);
    if (status != KVF_OK) {
        return status;
    }
    status =
        kvf_ucx_worker_create(ep->iface->ctx, &ln->worker, &ln->efd, &ln->wake);
    if (status != KVF_OK) {
        kvf_free(addr);
        return status;
    }
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                   UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = addr;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = kvf_ucx_ep_err;
    p.err_handler.arg = ln;
    s = ucp_ep_create(ln->worker, &p, &ln->uep);
    if (s == UCS_ERR_UNREACHABLE) {
        /* shared memory alone (sysv, posix, cma) has no peer failure
         * detection: without it the side channel and the timeout tell */
        if (ln->idx == 0) {
            kvf_info("ucx: %s:%u: no transport with peer error handling, "
                     "continuing without it",
                     ep->host, ep->port);
        }
        p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        s = ucp_ep_create(ln->worker, &p, &ln->uep);
    }
    kvf_free(addr);
    if (s != UCS_OK) {
        kvf_error("ucx: ucp_ep_create to %s:%u: %s", ep->host, ep->port,
                  ucs_status_string(s));
        kvf_ucx_worker_destroy(ln->worker, ln->efd, ln->wake);
        ln->worker = NULL;
        return kvf_ucx_status(s);
    }
    /* a dead target closes the side channel: wake up and tell */
    ev.data.fd = ep->fd;
    epoll_ctl(ln->efd, EPOLL_CTL_ADD, ep->fd, &ev);
    return kvf_ucx_push_lane_init(ln, ep->iface->read_mode,
                                  ep->iface->write_mode);
}

/* Flushes and closes the lane's endpoint, by force when it does not
 * finish within the timeout (its progress thread is not running). */
static void kvf_ucx_lane_shut(kvf_ucx_lane_t *ln)
{
    ucp_request_param_t p = {0};
    uint64_t end = kvf_time_ms() + ln->ep->iface->cfg.timeout_ms;
    ucs_status_ptr_t sp;

    if (ln->uep == NULL) {
        return;
    }
    sp = ucp_ep_close_nbx(ln->uep, &p);
    if (UCS_PTR_IS_PTR(sp)) {
        while (ucp_request_check_status(sp) == UCS_INPROGRESS &&
               kvf_time_ms() < end) {
            ucp_worker_progress(ln->worker);
        }
        if (ucp_request_check_status(sp) == UCS_INPROGRESS) {
            ucp_request_cancel(ln->worker, sp);
        }
        ucp_request_free(sp);
    }
    ln->uep = NULL;
}

/* Stops the lane's thread, fails what it still holds, frees it all. */
static void kvf_ucx_lane_destroy(kvf_ucx_lane_t *ln)
{
    size_t i;

    if (ln->thread_on) {
        ln->stop = 1;
        kvf_ucx_wake(ln->wake);
        pthread_join(ln->thread, NULL);
    }
    /* queued requests never started: fail them */
    while (ln->head != NULL) {
        kvf_tl_req_t *req = ln->head;

        ln->head = req->next;
        kvf_tl_req_fail(req, KVF_ERR_CANCELED);
    }
    if (ln->worker != NULL) {
        if (ln->nactive > 0) {
            kvf_ucx_lane_abort(ln, KVF_ERR_CANCELED);
        }
        for (i = 0; i < ln->nrkeys; i++) {
            ucp_rkey_destroy(ln->rkeys[i].rkey);
        }
        kvf_ucx_lane_shut(ln);
        kvf_ucx_worker_destroy(ln->worker, ln->efd, ln->wake);
    }
    kvf_ucx_stage_fini(ln);
    kvf_free(ln->rkeys);
    while (ln->zombies != NULL) {
        kvf_ucx_rctx_t *rc = ln->zombies;

        ln->zombies = rc->next;
        kvf_ucx_push_free(rc);
        kvf_free(rc);
    }
    pthread_mutex_destroy(&ln->lock);
}

/* Stops every lane's thread, then fails (CANCELED) and frees what each
 * holds. The ep is marked failed while no lane thread runs, so a lane
 * closing by force wakes nobody (the lanes' fds go one by one). */
static void kvf_ucx_lanes_close(kvf_tl_ep_t *ep)
{
    kvf_status_t ok = KVF_OK;
    unsigned i;

    for (i = 0; i < ep->nlanes; i++) {
        ep->lanes[i].stop = 1;
        if (ep->lanes[i].worker != NULL) {
            kvf_ucx_wake(ep->lanes[i].wake);
        }
    }
    for (i = 0; i < ep->nlanes; i++) {
        if (ep->lanes[i].thread_on) {
            pthread_join(ep->lanes[i].thread, NULL);
            ep->lanes[i].thread_on = 0;
        }
    }
    __atomic_compare_exchange_n(&ep->failed, &ok, KVF_ERR_CANCELED, 0,
                                __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    for (i = 0; i < ep->nlanes; i++) {
        kvf_ucx_lane_destroy(&ep->lanes[i]);
    }
    kvf_free(ep->lanes);
    ep->lanes = NULL;
    ep->nlanes = 0;
}

/* Connects every lane, then starts their threads. */
static kvf_status_t kvf_ucx_lanes_open(kvf_tl_ep_t *ep)
{
    kvf_status_t status = KVF_OK;
    unsigned i;

    ep->lanes = kvf_calloc(ep->iface->nworkers, sizeof(*ep->lanes));
    if (ep->lanes == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0; i < ep->iface->nworkers && status == KVF_OK; i++) {
        kvf_ucx_lane_t *ln = &ep->lanes[i];

        ln->ep = ep;
        ln->idx = i;
        ln->spin.ns = ep->iface->spin_ns;
        pthread_mutex_init(&ln->lock, NULL);
        ep->nlanes++;
        status = kvf_ucx_lane_connect(ln);
    }
    for (i = 0; i < ep->nlanes && status == KVF_OK; i++) {
        if (pthread_create(&ep->lanes[i].thread, NULL, kvf_ucx_lane_main,
                           &ep->lanes[i]) != 0) {
            status = KVF_ERR_NO_RESOURCE;
            break;
        }
        ep->lanes[i].thread_on = 1;
    }
    if (status != KVF_OK) {
        kvf_ucx_lanes_close(ep);
    }
    return status;
}

kvf_status_t kvf_ucx_ep_open(kvf_tl_iface_t *iface, const char *address,
                             kvf_tl_ep_t **ep_p)
{
    kvf_status_t status;
    kvf_tl_ep_t *ep;

    ep = kvf_calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    ep->iface = iface;
    ep->fd = -1;
    pthread_mutex_init(&ep->fd_lock, NULL);
    status =
        kvf_sock_parse_addr(address, ep->host, sizeof(ep->host), &ep->port);
    if (status == KVF_OK) {
        status =
            kvf_auth_connect(ep->host, ep->port, (int)iface->cfg.timeout_ms,
                             "ucx", &ep->fd, &ep->mac);
    }
    if (status == KVF_OK) {
        status = kvf_ucx_lanes_open(ep);
    }
    if (status != KVF_OK) {
        if (ep->fd >= 0) {
            close(ep->fd);
        }
        kvf_wire_mac_free(&ep->mac);
        pthread_mutex_destroy(&ep->fd_lock);
        kvf_free(ep);
        return status;
    }
    *ep_p = ep;
    return KVF_OK;
}

void kvf_ucx_ep_close(kvf_tl_ep_t *ep)
{
    kvf_ucx_lanes_close(ep);
    close(ep->fd);
    kvf_wire_mac_free(&ep->mac);
    pthread_mutex_destroy(&ep->fd_lock);
    kvf_free(ep);
}
