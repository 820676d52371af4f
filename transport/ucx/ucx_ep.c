/*
 * ucx transport, initiator side: one UCX worker, one endpoint and one
 * progress thread per peer. ep_post queues a request and wakes the
 * thread; the thread turns its segments into ucp_put_nbx / ucp_get_nbx
 * calls (segments adjacent on both sides merged into one call), each
 * under the remote key of the region holding it, fetched once per
 * region over the authenticated side channel. A WRITE completes after
 * an endpoint flush (the bytes are at the target); a READ when its gets
 * have landed. The thread sleeps on the worker's fd when idle.
 *
 * Failures: the endpoint runs in UCP's peer error mode, so a dead peer
 * fails every outstanding operation; requests in flight that see no
 * completion for timeout_ms fail with KVF_ERR_TIMEOUT (the endpoint is
 * closed by force). Either way the ep stays failed: later requests fail
 * at once and the caller reopens the peer.
 */
#include "transport/ucx/ucx.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

/* One UCP call (or the flush): the segments it covers. */
typedef struct kvf_ucx_op {
    kvf_ucx_rctx_t *rc;
    uint32_t first;
    uint32_t count;
} kvf_ucx_op_t;

struct kvf_ucx_rctx {
    kvf_tl_req_t *req;
    kvf_tl_ep_t *ep;
    unsigned pending;
    kvf_status_t err;
    int zombie; /* completed by force: late callbacks only count down */
    kvf_ucx_rctx_t *prev, *next;
    kvf_ucx_op_t ops[]; /* nsegs + 1 (the flush) */
};

kvf_status_t kvf_ucx_ep_call(kvf_tl_ep_t *ep, uint8_t type, uint32_t count,
                             const void *meta, size_t len, kvf_frame_hdr_t *h,
                             void **reply_p)
{
    uint64_t deadline = kvf_time_ms() + ep->iface->cfg.timeout_ms;
    kvf_status_t status;
    void *reply = NULL;

    status = kvf_ucx_send(ep->fd, type, KVF_OK, count, meta, len, deadline);
    if (status == KVF_OK) {
        status = kvf_ucx_recv_hdr(ep->fd, h, deadline);
    }
    if (status == KVF_OK && h->type != type + 1) {
        status = KVF_ERR_PROTOCOL;
    }
    if (status == KVF_OK && h->meta_len > 0) {
        reply = kvf_malloc(h->meta_len);
        status = reply == NULL
                     ? KVF_ERR_NO_MEMORY
                     : kvf_sock_recv_all(ep->fd, reply, h->meta_len, deadline);
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

/* The cached key whose region holds [addr, addr+len), or NULL. */
static kvf_ucx_rkey_t *kvf_ucx_rkey_find(kvf_tl_ep_t *ep, uint64_t addr,
                                         uint64_t len)
{
    kvf_ucx_rkey_t *k;
    size_t i;

    for (i = 0; i < ep->nrkeys; i++) {
        k = &ep->rkeys[i];
        if (addr >= k->base && addr - k->base <= k->len &&
            len <= k->len - (addr - k->base)) {
            return k;
        }
    }
    return NULL;
}

/* Asks the target for the key of the region holding [addr, addr+len). */
static kvf_status_t kvf_ucx_rkey_fetch(kvf_tl_ep_t *ep, uint64_t addr,
                                       uint64_t len, kvf_ucx_rkey_t **k_p)
{
    unsigned char meta[KVF_UCX_RANGE_LEN];
    kvf_ucx_rkey_msg_t m;
    kvf_ucx_rkey_t *grown;
    kvf_frame_hdr_t h;
    kvf_status_t status;
    void *reply = NULL;
    ucp_rkey_h rkey;
    ucs_status_t s;
    kvf_wr_t w;

    if (ep->nrkeys == ep->rkeys_cap) {
        size_t cap = ep->rkeys_cap ? ep->rkeys_cap * 2 : 4;

        grown = kvf_realloc(ep->rkeys, cap * sizeof(*grown));
        if (grown == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        ep->rkeys = grown;
        ep->rkeys_cap = cap;
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
        s = ucp_ep_rkey_unpack(ep->uep, m.rkey, &rkey);
        if (s != UCS_OK) {
            kvf_error("ucx: peer %s:%u sent a remote key UCX refuses: %s",
                      ep->host, ep->port, ucs_status_string(s));
            status = KVF_ERR_PROTOCOL;
        }
    }
    if (status == KVF_OK) {
        ep->rkeys[ep->nrkeys].base = m.base;
        ep->rkeys[ep->nrkeys].len = m.len;
        ep->rkeys[ep->nrkeys].rkey = rkey;
        *k_p = &ep->rkeys[ep->nrkeys++];
    }
    kvf_free(reply);
    return status;
}

static void kvf_ucx_segs_fail(kvf_ucx_rctx_t *rc, uint32_t first,
                              uint32_t count, kvf_status_t status)
{
    uint32_t i;

    if (rc->err == KVF_OK) {
        rc->err = status;
    }
    for (i = first; i < first + count; i++) {
        rc->req->seg_status[i] = status;
    }
}

static void kvf_ucx_rctx_finish(kvf_ucx_rctx_t *rc)
{
    kvf_tl_ep_t *ep = rc->ep;
    kvf_tl_req_t *req = rc->req;

    if (rc->prev != NULL) {
        rc->prev->next = rc->next;
    } else if (ep->active == rc) {
        ep->active = rc->next;
    }
    if (rc->next != NULL) {
        rc->next->prev = rc->prev;
    }
    ep->nactive--;
    ep->inflight -= req->bytes;
    req->status = rc->err;
    if (rc->err == KVF_OK) {
        KVF_TL_COUNT(bytes, req->bytes);
    } else {
        KVF_TL_COUNT(errors, 1);
    }
    kvf_free(rc);
    req->complete(req);
}

static void kvf_ucx_op_done(void *request, ucs_status_t s, void *user_data)
{
    kvf_ucx_op_t *op = user_data;
    kvf_ucx_rctx_t *rc = op->rc;
    kvf_tl_ep_t *ep = rc->ep;

    ucp_request_free(request);
    if (rc->zombie) {
        rc->pending--;
        return;
    }
    if (s != UCS_OK) {
        kvf_ucx_segs_fail(rc, op->first, op->count,
                          ep->failed != KVF_OK ? ep->failed
                                               : kvf_ucx_status(s));
    }
    ep->last_ms = kvf_time_ms();
    if (--rc->pending == 0) {
        kvf_ucx_rctx_finish(rc);
    }
}

/* Issues one UCP call for op (or a flush when len is 0). */
static void kvf_ucx_op_issue(kvf_tl_ep_t *ep, kvf_ucx_op_t *op, int write,
                             void *local, uint64_t remote, uint64_t len,
                             ucp_rkey_h rkey)
{
    ucp_request_param_t p = {0};
    ucs_status_ptr_t sp;

    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = kvf_ucx_op_done;
    p.user_data = op;
    if (len == 0) {
        sp = ucp_ep_flush_nbx(ep->uep, &p);
    } else if (write) {
        sp = ucp_put_nbx(ep->uep, local, len, remote, rkey, &p);
    } else {
        sp = ucp_get_nbx(ep->uep, local, len, remote, rkey, &p);
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
 * touch GPU memory (GPU regions keep kvferry's own paths). */
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

/* Turns a request into UCP calls (progress thread). */
static void kvf_ucx_req_start(kvf_tl_ep_t *ep, kvf_tl_req_t *req)
{
    int write = req->type == KVF_OP_WRITE;
    kvf_ucx_rctx_t *rc;
    kvf_ucx_rkey_t *k;
    kvf_status_t st;
    uint64_t len;
    uint32_t i, j, nops = 0;

    if (ep->failed != KVF_OK || (req->cancel != NULL && *req->cancel)) {
        kvf_tl_req_fail(req,
                        ep->failed != KVF_OK ? ep->failed : KVF_ERR_CANCELED);
        return;
    }
    if (!kvf_ucx_local_host(req)) {
        kvf_tl_req_fail(req, KVF_ERR_UNSUPPORTED);
        return;
    }
    rc = kvf_calloc(1, sizeof(*rc) + (req->nsegs + 1) * sizeof(rc->ops[0]));
    if (rc == NULL) {
        kvf_tl_req_fail(req, KVF_ERR_NO_MEMORY);
        return;
    }
    rc->req = req;
    rc->ep = ep;
    rc->pending = 1; /* this function's own, dropped at the end */
    rc->next = ep->active;
    if (ep->active != NULL) {
        ep->active->prev = rc;
    }
    ep->active = rc;
    ep->nactive++;
    ep->inflight += req->bytes;
    if (ep->nactive == 1) {
        ep->last_ms = kvf_time_ms();
    }
    KVF_TL_COUNT(requests, 1);
    KVF_TL_COUNT(segments, req->nsegs);
    for (i = 0; i < req->nsegs; i++) {
        req->seg_status[i] = KVF_OK;
    }
    for (i = 0; i < req->nsegs; i = j) {
        j = i + 1;
        k = kvf_ucx_rkey_find(ep, req->segs[i].remote, req->segs[i].len);
        st = (k != NULL) ? KVF_OK
                         : kvf_ucx_rkey_fetch(ep, req->segs[i].remote,
                                              req->segs[i].len, &k);
        if (st != KVF_OK) {
            kvf_ucx_segs_fail(rc, i, 1, st);
            continue;
        }
        j = kvf_ucx_merge(req, i, k, &len);
        rc->ops[nops] = (kvf_ucx_op_t){rc, i, j - i};
        kvf_ucx_op_issue(ep, &rc->ops[nops++], write, req->segs[i].local,
                         req->segs[i].remote, len, k->rkey);
    }
    KVF_TL_COUNT(wire_entries, nops);
    if (write && nops > 0) {
        rc->ops[nops] = (kvf_ucx_op_t){rc, 0, (uint32_t)req->nsegs};
        kvf_ucx_op_issue(ep, &rc->ops[nops], write, NULL, 0, 0, NULL);
    }
    if (--rc->pending == 0) {
        kvf_ucx_rctx_finish(rc);
    }
}

static void kvf_ucx_ep_err(void *arg, ucp_ep_h uep, ucs_status_t s)
{
    kvf_tl_ep_t *ep = arg;

    (void)uep;
    if (ep->failed == KVF_OK) {
        kvf_warn("ucx: peer %s:%u failed: %s", ep->host, ep->port,
                 ucs_status_string(s));
        ep->failed = kvf_ucx_status(s) == KVF_ERR_IO ? KVF_ERR_PEER_CLOSED
                                                     : kvf_ucx_status(s);
    }
}

/* Closes the UCP endpoint by force (outstanding operations complete
 * with an error) and waits, bounded, for the close to finish. */
static void kvf_ucx_ep_abort(kvf_tl_ep_t *ep, kvf_status_t why)
{
    ucp_request_param_t p = {0};
    ucs_status_ptr_t sp;
    uint64_t end = kvf_time_ms() + 2000;

    if (ep->failed == KVF_OK) {
        ep->failed = why;
    }
    if (ep->uep == NULL) {
        return;
    }
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    sp = ucp_ep_close_nbx(ep->uep, &p);
    ep->uep = NULL;
    if (UCS_PTR_IS_PTR(sp)) {
        while (ucp_request_check_status(sp) == UCS_INPROGRESS &&
               kvf_time_ms() < end) {
            ucp_worker_progress(ep->worker);
        }
        ucp_request_free(sp);
    }
    /* operations UCX did not complete (no peer error handling): fail
     * them here; their memory stays until the worker is gone */
    while (ep->active != NULL) {
        kvf_ucx_rctx_t *rc = ep->active;
        kvf_tl_req_t *req = rc->req;

        ep->active = rc->next;
        ep->nactive--;
        ep->inflight -= req->bytes;
        rc->zombie = 1;
        rc->next = ep->zombies;
        ep->zombies = rc;
        kvf_ucx_segs_fail(rc, 0, (uint32_t)req->nsegs, ep->failed);
        req->status = ep->failed;
        KVF_TL_COUNT(errors, 1);
        req->complete(req);
    }
}

/* Moves posted requests into UCP (progress thread) while fewer than
 * KVF_UCX_WINDOW bytes are in flight (at least one request): a batch of
 * a million blocks does not become a million queued UCP operations, on
 * either side (over tcp the target queues a reply per get). */
static void kvf_ucx_ep_drain(kvf_tl_ep_t *ep)
{
    kvf_tl_req_t *req;

    while (ep->nactive == 0 || ep->inflight < KVF_UCX_WINDOW) {
        pthread_mutex_lock(&ep->lock);
        req = ep->head;
        if (req != NULL) {
            ep->head = req->next;
            if (ep->head == NULL) {
                ep->tail = NULL;
            }
        }
        pthread_mutex_unlock(&ep->lock);
        if (req == NULL) {
            return;
        }
        kvf_ucx_req_start(ep, req);
    }
}

static void *kvf_ucx_ep_main(void *arg)
{
    kvf_tl_ep_t *ep = arg;
    unsigned tmo = ep->iface->cfg.timeout_ms;

    while (!ep->stop) {
        kvf_ucx_ep_drain(ep);
        kvf_ucx_worker_wait(ep->worker, ep->efd, ep->wake,
                            ep->nactive > 0 ? 50 : -1, NULL);
        if (ep->failed == KVF_OK && ep->uep != NULL &&
            pthread_mutex_trylock(&ep->fd_lock) == 0) {
            if (kvf_tl_peer_gone(ep->fd)) {
                kvf_warn("ucx: peer %s:%u closed its side channel", ep->host,
                         ep->port);
                ep->failed = KVF_ERR_PEER_CLOSED;
            }
            pthread_mutex_unlock(&ep->fd_lock);
        }
        if (ep->failed != KVF_OK && ep->uep != NULL) {
            kvf_ucx_ep_abort(ep, ep->failed);
        } else if (ep->nactive > 0 && kvf_time_ms() - ep->last_ms > tmo) {
            kvf_warn("ucx: no completion from %s:%u for %u ms", ep->host,
                     ep->port, tmo);
            kvf_ucx_ep_abort(ep, KVF_ERR_TIMEOUT);
        }
    }
    return NULL;
}

kvf_status_t kvf_ucx_ep_post(kvf_tl_ep_t *ep, kvf_tl_req_t *req)
{
    if (req->nsegs == 0 || req->nsegs > UINT32_MAX - 1) {
        return KVF_ERR_INVALID_PARAM;
    }
    req->next = NULL;
    pthread_mutex_lock(&ep->lock);
    if (ep->tail != NULL) {
        ep->tail->next = req;
    } else {
        ep->head = req;
    }
    ep->tail = req;
    pthread_mutex_unlock(&ep->lock);
    kvf_ucx_wake(ep->wake);
    return KVF_OK;
}

/* HELLO, worker, endpoint (peer error mode), progress thread. */
static kvf_status_t kvf_ucx_ep_connect(kvf_tl_ep_t *ep)
{
    struct epoll_event ev = {.events = EPOLLRDHUP};
    ucp_ep_params_t p = {0};
    kvf_frame_hdr_t h;
    kvf_status_t status;
    void *addr = NULL;
    ucs_status_t s;

    status = kvf_ucx_ep_call(ep, KVF_UCX_HELLO, 0, NULL, 0, &h, &addr);
    if (status != KVF_OK) {
        return status;
    }
    status =
        kvf_ucx_worker_create(ep->iface->ctx, &ep->worker, &ep->efd, &ep->wake);
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
    p.err_handler.arg = ep;
    s = ucp_ep_create(ep->worker, &p, &ep->uep);
    if (s == UCS_ERR_UNREACHABLE) {
        /* shared memory alone (sysv, posix, cma) has no peer failure
         * detection: without it the side channel and the timeout tell */
        kvf_info("ucx: %s:%u: no transport with peer error handling, "
                 "continuing without it",
                 ep->host, ep->port);
        p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        s = ucp_ep_create(ep->worker, &p, &ep->uep);
    }
    kvf_free(addr);
    if (s != UCS_OK) {
        kvf_error("ucx: ucp_ep_create to %s:%u: %s", ep->host, ep->port,
                  ucs_status_string(s));
        status = kvf_ucx_status(s);
        goto err_worker;
    }
    /* a dead target closes the side channel: wake up and tell */
    ev.data.fd = ep->fd;
    epoll_ctl(ep->efd, EPOLL_CTL_ADD, ep->fd, &ev);
    if (pthread_create(&ep->thread, NULL, kvf_ucx_ep_main, ep) != 0) {
        status = KVF_ERR_NO_RESOURCE;
        kvf_ucx_ep_abort(ep, status);
        goto err_worker;
    }
    return KVF_OK;

err_worker:
    kvf_ucx_worker_destroy(ep->worker, ep->efd, ep->wake);
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
    pthread_mutex_init(&ep->lock, NULL);
    pthread_mutex_init(&ep->fd_lock, NULL);
    status =
        kvf_sock_parse_addr(address, ep->host, sizeof(ep->host), &ep->port);
    if (status == KVF_OK) {
        status = kvf_auth_connect(ep->host, ep->port,
                                  (int)iface->cfg.timeout_ms, "ucx", &ep->fd);
    }
    if (status == KVF_OK) {
        status = kvf_ucx_ep_connect(ep);
    }
    if (status != KVF_OK) {
        if (ep->fd >= 0) {
            close(ep->fd);
        }
        pthread_mutex_destroy(&ep->lock);
        pthread_mutex_destroy(&ep->fd_lock);
        kvf_free(ep);
        return status;
    }
    *ep_p = ep;
    return KVF_OK;
}

/* Flushes and closes the endpoint, by force when it does not finish
 * within the timeout (no progress thread runs). */
static void kvf_ucx_ep_shut(kvf_tl_ep_t *ep)
{
    ucp_request_param_t p = {0};
    uint64_t end = kvf_time_ms() + ep->iface->cfg.timeout_ms;
    ucs_status_ptr_t sp;

    if (ep->uep == NULL) {
        return;
    }
    sp = ucp_ep_close_nbx(ep->uep, &p);
    if (UCS_PTR_IS_PTR(sp)) {
        while (ucp_request_check_status(sp) == UCS_INPROGRESS &&
               kvf_time_ms() < end) {
            ucp_worker_progress(ep->worker);
        }
        if (ucp_request_check_status(sp) == UCS_INPROGRESS) {
            ucp_request_cancel(ep->worker, sp);
        }
        ucp_request_free(sp);
    }
    ep->uep = NULL;
}

void kvf_ucx_ep_close(kvf_tl_ep_t *ep)
{
    size_t i;

    ep->stop = 1;
    kvf_ucx_wake(ep->wake);
    pthread_join(ep->thread, NULL);
    /* queued requests never started: fail them */
    while (ep->head != NULL) {
        kvf_tl_req_t *req = ep->head;

        ep->head = req->next;
        kvf_tl_req_fail(req, KVF_ERR_CANCELED);
    }
    if (ep->nactive > 0) {
        kvf_ucx_ep_abort(ep, KVF_ERR_CANCELED);
    }
    for (i = 0; i < ep->nrkeys; i++) {
        ucp_rkey_destroy(ep->rkeys[i].rkey);
    }
    kvf_free(ep->rkeys);
    kvf_ucx_ep_shut(ep);
    kvf_ucx_worker_destroy(ep->worker, ep->efd, ep->wake);
    while (ep->zombies != NULL) {
        kvf_ucx_rctx_t *rc = ep->zombies;

        ep->zombies = rc->next;
        kvf_free(rc);
    }
    close(ep->fd);
    pthread_mutex_destroy(&ep->lock);
    pthread_mutex_destroy(&ep->fd_lock);
    kvf_free(ep);
}
