/*
 * ucx transport, READs served by the target and WRITEs by active message
 * ("push" modes). Where UCP has
 * no RMA lane to the peer (UCX's tcp transport: a get there is a software
 * request message per block and a reply), a lane sends the target one
 * active message per request of up to KVF_UCX_PUSH_MAX entries, each
 * (remote address, length) with adjacent blocks merged; the target's
 * worker checks every entry against its registered regions, exactly as
 * the side channel does before it hands out a key, and answers with one
 * active message that gathers the entries (an iov, packed by UCX into its
 * segments); the lane scatters the reply into the request's local
 * blocks. So a READ costs what a WRITE costs: messages of full segments,
 * not a request and a reply per block.
 *
 * A WRITE in push mode is the mirror: one active message per request
 * (the same cut) whose data is the entries followed by the blocks, sent
 * from the local pieces as an iov (no copy here); the target checks
 * every entry and that the payload is exactly their bytes, copies the
 * blocks into place (all or nothing) and answers with a status alone.
 * The request completes from that status: the bytes are in place, as
 * after a put's flush.
 *
 * Trust: the target only reads and writes its own registered regions,
 * and writes only where a WRITE's entries say (each entry is checked; a
 * bad one fails the request with the target's status, and nothing of a
 * refused WRITE is written); it never writes into the initiator: the initiator
 * copies each reply into the local ranges it recorded when it sent the request,
 * after checking that the reply's id is one of its requests in flight and that
 * its length is the request's. Replies with unknown ids (a late reply to a
 * request failed by timeout, or a stranger on UCX's unauthenticated tcp
 * listener) are dropped. A reply still queued in UCX reads the target's
 * memory after its check, as a software get's reply does: deregistering
 * a region while a peer reads it is unsafe over UCX's tcp in both modes.
 *
 * Wire (little-endian, fixed size headers):
 *   READ   header: u32 magic, u32 count, u64 id; data: count x (u64
 *          addr, u64 len)
 *   BLOCK  header: u32 magic, i32 status, u64 id; data: a READ's
 *          entries' bytes in order (nothing for a WRITE, nothing when
 *          status is not KVF_OK)
 *   WRITE  header: as READ's; data: count x (u64 addr, u64 len), then
 *          the entries' bytes in order
 * All are eager: a target never waits on an initiator's receive, and
 * holds at most one request's data per message (a rendezvous request is
 * refused as malformed).
 *
 * Where the endpoint has an RMA lane (RDMA, and CMA on one host), auto
 * mode keeps one-sided gets and puts: the NIC or the kernel moves the
 * bytes and the target's CPU is not involved.
 */
#include "transport/ucx/ucx.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One READ or WRITE request sent to the target, until its reply is
 * handled. */
struct kvf_ucx_push {
    kvf_ucx_rctx_t *rc;
    kvf_ucx_push_t *next; /* rc's */
    uint64_t id;
    uint32_t first, last; /* segments [first, last) of the request */
    uint32_t nent, cap;
    uint64_t total;
    int sent;  /* posted to UCP: no more entries */
    int done;  /* the reply was handled, or the request failed */
    int write; /* a WRITE: the blocks go with the entries */
    unsigned char hdr[KVF_UCX_PUSH_HDR];
    ucp_dt_iov_t *wiov; /* cap + 1: the entries, then iov (a WRITE's) */
    ucp_dt_iov_t *iov;  /* cap: local ranges, in request order */
    unsigned char *ent; /* cap x KVF_UCX_PUSH_ENT: the wire entries */
};

/* A target's reply in flight: its header and the gathered ranges. */
typedef struct kvf_ucx_push_reply {
    unsigned char hdr[KVF_UCX_PUSH_HDR];
    ucp_dt_iov_t iov[];
} kvf_ucx_push_reply_t;

/* ---- target ------------------------------------------------------------ */

static void kvf_ucx_push_reply_done(void *request, ucs_status_t s, void *arg)
{
    (void)s;
    ucp_request_free(request);
    kvf_free(arg);
}

static void kvf_ucx_push_hdr(unsigned char *buf, uint32_t v, uint64_t id)
{
    kvf_wr_t w;

    kvf_wr_init_fixed(&w, buf, KVF_UCX_PUSH_HDR);
    kvf_wr_u32(&w, KVF_UCX_PUSH_MAGIC);
    kvf_wr_u32(&w, v);
    kvf_wr_u64(&w, id);
}

/* Checks each entry against the registered regions (the progress thread
 * holds the region set) and fills rp's iov: KVF_OK or the first refusal. */
static kvf_status_t kvf_ucx_push_check(kvf_ucx_tworker_t *tw, const void *data,
                                       size_t length, uint32_t count,
                                       kvf_ucx_push_reply_t *rp)
{
    const kvf_tl_target_t *t = &tw->iface->target;
    kvf_status_t status = KVF_OK;
    uint64_t addr, len, total = 0;
    kvf_tl_mem_t mem;
    kvf_rd_t r;
    uint32_t i;

    kvf_rd_init(&r, data, length);
    for (i = 0; i < count && status == KVF_OK; i++) {
        status = kvf_ucx_range_dec(&r, &addr, &len);
        if (status == KVF_OK && len > KVF_UCX_PUSH_BYTES - total) {
            status = KVF_ERR_QUOTA;
        }
        total += status == KVF_OK ? len : 0;
        if (status == KVF_OK) {
            status = t->access(t->arg, addr, len, &mem);
        }
        if (status == KVF_OK && mem.type == KVF_MEM_CUDA) {
            status = KVF_ERR_UNSUPPORTED; /* GPU memory: kvferry's own paths */
        }
        rp->iov[i].buffer = (void *)(uintptr_t)addr;
        rp->iov[i].length = len;
    }
    if (status == KVF_OK) {
        status = kvf_rd_end(&r);
    }
    return status;
}

/* Sends rp (owned by the send from here) on ep: the status, with the
 * count blocks of rp's iov (a READ's) when it is KVF_OK. */
static void kvf_ucx_push_reply(ucp_ep_h ep, kvf_ucx_push_reply_t *rp,
                               kvf_status_t status, uint64_t id, uint32_t count)
{
    ucp_request_param_t p = {0};
    ucs_status_ptr_t sp;

    kvf_ucx_push_hdr(rp->hdr, (uint32_t)status, id);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = kvf_ucx_push_reply_done;
    p.user_data = rp;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    if (status != KVF_OK) {
        count = 0;
    }
    if (count > 0) {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        p.datatype = ucp_dt_make_iov();
    }
    sp = ucp_am_send_nbx(ep, KVF_UCX_AM_BLOCK, rp->hdr, KVF_UCX_PUSH_HDR,
                         count > 0 ? (void *)rp->iov : NULL, count, &p);
    if (!UCS_PTR_IS_PTR(sp)) {
        if (UCS_PTR_STATUS(sp) != UCS_OK) {
            kvf_log_rl(KVF_LOG_WARN, "ucx: reply to a read request: %s",
                       ucs_status_string(UCS_PTR_STATUS(sp)));
        }
        kvf_free(rp);
    }
}

/*
 * The header of a request AM (what: "read" or "write") and its reply,
 * allocated for count iov entries: NULL when the request is dropped
 * unanswered (no reply ep, a header of another size, no memory; the
 * initiator times out). *status_p is KVF_ERR_PROTOCOL (and *count_p 0)
 * for a request refused: bad magic or count, a rendezvous payload, or a
 * payload shorter than the entries (other than them exactly when exact).
 */
static kvf_ucx_push_reply_t *
kvf_ucx_push_open(const char *what, const void *header, size_t header_length,
                  size_t length, int exact, const ucp_am_recv_param_t *param,
                  uint64_t *id_p, uint32_t *count_p, kvf_status_t *status_p)
{
    kvf_ucx_push_reply_t *rp;
    uint32_t magic, count;
    size_t ents;
    kvf_rd_t r;

    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ||
        header_length != KVF_UCX_PUSH_HDR) {
        kvf_log_rl(KVF_LOG_WARN, "ucx: malformed %s request dropped", what);
        return NULL;
    }
    kvf_rd_init(&r, header, header_length);
    magic = kvf_rd_u32(&r);
    count = kvf_rd_u32(&r);
    *id_p = kvf_rd_u64(&r);
    ents = (size_t)count * KVF_UCX_PUSH_ENT;
    *status_p = KVF_OK;
    if (magic != KVF_UCX_PUSH_MAGIC || count == 0 || count > KVF_UCX_PUSH_MAX ||
        (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length < ents ||
        (exact && length != ents)) {
        kvf_log_rl(KVF_LOG_WARN,
                   "ucx: %s request refused: magic 0x%x, %u entries, %zu "
                   "bytes",
                   what, magic, count, length);
        *status_p = KVF_ERR_PROTOCOL;
        count = 0;
    }
    rp = kvf_malloc(sizeof(*rp) + (size_t)count * sizeof(rp->iov[0]));
    if (rp == NULL) {
        kvf_log_rl(KVF_LOG_WARN, "ucx: no memory for a %s reply", what);
    }
    *count_p = count;
    return rp;
}

/* Checks a WRITE request's entries (data: count entries, then their
 * bytes in order) and copies the bytes into place, all or nothing. */
static kvf_status_t kvf_ucx_push_write(kvf_ucx_tworker_t *tw, const void *data,
                                       size_t length, uint32_t count,
                                       kvf_ucx_push_reply_t *rp)
{
    size_t ents = (size_t)count * KVF_UCX_PUSH_ENT, total = 0;
    const char *src = (const char *)data + ents;
    kvf_status_t status;
    uint32_t i;

    status = kvf_ucx_push_check(tw, data, ents, count, rp);
    for (i = 0; i < count && status == KVF_OK; i++) {
        total += rp->iov[i].length;
    }
    if (status == KVF_OK && total != length - ents) {
        kvf_log_rl(KVF_LOG_WARN,
                   "ucx: write request refused: %zu bytes for entries of %zu",
                   length - ents, total);
        status = KVF_ERR_PROTOCOL;
    }
    for (i = 0; i < count && status == KVF_OK; i++) {
        memcpy(rp->iov[i].buffer, src, rp->iov[i].length);
        src += rp->iov[i].length;
    }
    return status;
}

/* A READ or WRITE request on a target worker (its progress thread,
 * holding the region set): checked, then answered with the gathered
 * blocks (READ) or written into place and answered with its status. */
static ucs_status_t kvf_ucx_push_am(kvf_ucx_tworker_t *tw, int read,
                                    const void *header, size_t header_length,
                                    void *data, size_t length,
                                    const ucp_am_recv_param_t *param)
{
    kvf_ucx_push_reply_t *rp;
    kvf_status_t status;
    uint32_t count;
    uint64_t id;

    rp = kvf_ucx_push_open(read ? "read" : "write", header, header_length,
                           length, read, param, &id, &count, &status);
    if (rp == NULL) {
        return UCS_OK;
    }
    if (status == KVF_OK) {
        status = read ? kvf_ucx_push_check(tw, data, length, count, rp)
                      : kvf_ucx_push_write(tw, data, length, count, rp);
    }
    kvf_ucx_push_reply(param->reply_ep, rp, status, id, read ? count : 0);
    return UCS_OK;
}

static ucs_status_t kvf_ucx_push_am_read(void *arg, const void *header,
                                         size_t header_length, void *data,
                                         size_t length,
                                         const ucp_am_recv_param_t *param)
{
    return kvf_ucx_push_am(arg, 1, header, header_length, data, length, param);
}

static ucs_status_t kvf_ucx_push_am_write(void *arg, const void *header,
                                          size_t header_length, void *data,
                                          size_t length,
                                          const ucp_am_recv_param_t *param)
{
    return kvf_ucx_push_am(arg, 0, header, header_length, data, length, param);
}

static kvf_status_t kvf_ucx_push_handler(ucp_worker_h worker, unsigned id,
                                         ucp_am_recv_callback_t cb, void *arg)
{
    ucp_am_handler_param_t p = {0};
    ucs_status_t s;

    p.field_mask =
        UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
        UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    p.id = id;
    p.cb = cb;
    p.arg = arg;
    p.flags = UCP_AM_FLAG_WHOLE_MSG;
    s = ucp_worker_set_am_recv_handler(worker, &p);
    if (s != UCS_OK) {
        kvf_error("ucx: ucp_worker_set_am_recv_handler: %s",
                  ucs_status_string(s));
        return kvf_ucx_status(s);
    }
    return KVF_OK;
}

kvf_status_t kvf_ucx_push_serve(kvf_ucx_tworker_t *tw)
{
    kvf_status_t status;

    status = kvf_ucx_push_handler(tw->worker, KVF_UCX_AM_READ,
                                  kvf_ucx_push_am_read, tw);
    if (status == KVF_OK) {
        status = kvf_ucx_push_handler(tw->worker, KVF_UCX_AM_WRITE,
                                      kvf_ucx_push_am_write, tw);
    }
    return status;
}

/* ---- initiator ---------------------------------------------------------- */

/* The request in flight with this id on the lane, or NULL. */
static kvf_ucx_push_t *kvf_ucx_push_find(kvf_ucx_lane_t *ln, uint64_t id)
{
    kvf_ucx_push_t *p;
    kvf_ucx_rctx_t *rc;

    for (rc = ln->active; rc != NULL; rc = rc->next) {
        for (p = rc->pushes; p != NULL; p = p->next) {
            if (p->id == id) {
                return p->done ? NULL : p;
            }
        }
    }
    return NULL;
}

/* One of rc's pending counts is over (the reply or the send). */
static void kvf_ucx_push_settle(kvf_ucx_rctx_t *rc)
{
    if (--rc->pending == 0 && !rc->zombie) {
        kvf_ucx_rctx_finish(rc);
    }
}

/* The request p failed: its segments fail, its reply is not awaited. */
static void kvf_ucx_push_fail(kvf_ucx_push_t *p, kvf_status_t status)
{
    p->done = 1;
    kvf_ucx_segs_fail(p->rc, p->first, p->last - p->first, status);
}

static void kvf_ucx_push_scatter(const kvf_ucx_push_t *p, const void *data)
{
    const char *src = data;
    uint32_t i;

    for (i = 0; i < p->nent; i++) {
        memcpy(p->iov[i].buffer, src, p->iov[i].length);
        src += p->iov[i].length;
    }
}

/* A reply on a lane's worker (its progress thread). */
static ucs_status_t kvf_ucx_push_am_block(void *arg, const void *header,
                                          size_t header_length, void *data,
                                          size_t length,
                                          const ucp_am_recv_param_t *param)
{
    kvf_ucx_lane_t *ln = arg;
    kvf_status_t status;
    kvf_ucx_push_t *p;
    uint32_t magic;
    uint64_t id;
    kvf_rd_t r;

    if (header_length != KVF_UCX_PUSH_HDR) {
        kvf_log_rl(KVF_LOG_WARN, "ucx: malformed read reply dropped");
        return UCS_OK;
    }
    kvf_rd_init(&r, header, header_length);
    magic = kvf_rd_u32(&r);
    status = (kvf_status_t)(int32_t)kvf_rd_u32(&r);
    id = kvf_rd_u64(&r);
    p = magic == KVF_UCX_PUSH_MAGIC ? kvf_ucx_push_find(ln, id) : NULL;
    if (p == NULL) {
        kvf_debug("ucx: read reply %lu for no request in flight dropped",
                  (unsigned long)id);
        return UCS_OK;
    }
    ln->last_ms = kvf_time_ms();
    if (status == KVF_OK && ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ||
                             length != (p->write ? 0 : p->total))) {
        kvf_log_rl(KVF_LOG_WARN,
                   "ucx: peer %s:%u sent %zu bytes for a %s of %lu",
                   ln->ep->host, ln->ep->port, length,
                   p->write ? "write" : "read", (unsigned long)p->total);
        status = KVF_ERR_PROTOCOL;
    } else if (status > 0) {
        status = KVF_ERR_PROTOCOL; /* no status a target sends */
    }
    if (status == KVF_OK && !p->write) {
        kvf_ucx_push_scatter(p, data);
        p->done = 1;
    } else if (status == KVF_OK) {
        p->done = 1; /* a WRITE's bytes are in place */
    } else {
        kvf_ucx_push_fail(p, status);
    }
    kvf_ucx_push_settle(p->rc);
    return UCS_OK;
}

static void kvf_ucx_push_sent(void *request, ucs_status_t s, void *arg)
{
    kvf_ucx_push_t *p = arg;
    kvf_ucx_rctx_t *rc = p->rc;

    ucp_request_free(request);
    if (!rc->zombie && s != UCS_OK && !p->done) {
        kvf_ucx_push_fail(p, rc->ln->failed != KVF_OK ? rc->ln->failed
                                                      : kvf_ucx_status(s));
        kvf_ucx_push_settle(rc); /* the reply's share */
    }
    kvf_ucx_push_settle(rc);
}

/* Whether UCP gave the endpoint an RMA lane for gets: ucp_ep_print_info
 * lists one "get[n]" protocol line per such lane (RDMA, CMA, shared
 * memory); over UCX's tcp there is none (its "rma_bw" lane serves
 * rendezvous only, and gets are emulated with messages). UCX 1.13 has no
 * query for it. */
static int kvf_ucx_ep_has_rma(ucp_ep_h uep)
{
    char *text = NULL;
    size_t len = 0;
    int rma = 0;
    FILE *f;

    f = open_memstream(&text, &len);
    if (f == NULL) {
        return 1;
    }
    ucp_ep_print_info(uep, f);
    fclose(f);
    rma = text != NULL && strstr(text, " get[") != NULL;
    kvf_trace("ucx: endpoint lanes:\n%s", text != NULL ? text : "");
    free(text);
    return rma;
}

kvf_status_t kvf_ucx_push_lane_init(kvf_ucx_lane_t *ln, unsigned read_mode,
                                    unsigned write_mode)
{
    kvf_status_t status;
    int rma = 1;

    status = kvf_ucx_push_handler(ln->worker, KVF_UCX_AM_BLOCK,
                                  kvf_ucx_push_am_block, ln);
    if (status != KVF_OK) {
        return status;
    }
    if (read_mode == KVF_UCX_MODE_AUTO || write_mode == KVF_UCX_MODE_AUTO) {
        rma = kvf_ucx_ep_has_rma(ln->uep);
    }
    ln->push = read_mode == KVF_UCX_MODE_PUSH ||
               (read_mode == KVF_UCX_MODE_AUTO && !rma);
    ln->wpush = write_mode == KVF_UCX_MODE_PUSH ||
                (write_mode == KVF_UCX_MODE_AUTO && !rma);
    if (ln->idx == 0) {
        kvf_debug("ucx: %s:%u: reads by %s, writes by %s", ln->ep->host,
                  ln->ep->port, ln->push ? "the target's pushes" : "gets",
                  ln->wpush ? "active messages" : "puts");
    }
    return KVF_OK;
}

/* A new request of at most cap entries, linked to rc (NULL: no memory). */
static kvf_ucx_push_t *kvf_ucx_push_new(kvf_ucx_rctx_t *rc, uint32_t cap)
{
    kvf_ucx_push_t *p;

    p = kvf_calloc(1, sizeof(*p) + sizeof(p->iov[0]) +
                          (size_t)cap * (sizeof(p->iov[0]) + KVF_UCX_PUSH_ENT));
    if (p == NULL) {
        return NULL;
    }
    p->rc = rc;
    p->cap = cap;
    p->write = rc->req->type == KVF_OP_WRITE;
    p->wiov = (ucp_dt_iov_t *)(p + 1);
    p->iov = p->wiov + 1;
    p->ent = (unsigned char *)(p->iov + cap);
    p->id = rc->ln->push_seq++;
    p->first = UINT32_MAX;
    p->next = rc->pushes;
    rc->pushes = p;
    return p;
}

void kvf_ucx_push_send(kvf_ucx_rctx_t *rc)
{
    kvf_ucx_push_t *p = rc->pushes;
    ucp_request_param_t rp = {0};
    ucs_status_ptr_t sp;

    if (p == NULL || p->nent == 0 || p->sent) {
        return; /* nothing built, or already sent */
    }
    p->sent = 1;
    kvf_ucx_push_hdr(p->hdr, p->nent, p->id);
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                      UCP_OP_ATTR_FIELD_FLAGS;
    rp.cb.send = kvf_ucx_push_sent;
    rp.user_data = p;
    rp.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    rc->pending++; /* the reply */
    if (p->write) {
        /* the entries, then the blocks from where they lie */
        p->wiov[0].buffer = p->ent;
        p->wiov[0].length = (size_t)p->nent * KVF_UCX_PUSH_ENT;
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        rp.datatype = ucp_dt_make_iov();
        sp = ucp_am_send_nbx(rc->ln->uep, KVF_UCX_AM_WRITE, p->hdr,
                             KVF_UCX_PUSH_HDR, p->wiov, p->nent + 1, &rp);
    } else {
        sp = ucp_am_send_nbx(rc->ln->uep, KVF_UCX_AM_READ, p->hdr,
                             KVF_UCX_PUSH_HDR, p->ent,
                             (size_t)p->nent * KVF_UCX_PUSH_ENT, &rp);
    }
    if (UCS_PTR_IS_PTR(sp)) {
        rc->pending++; /* the send's callback */
    } else if (UCS_PTR_STATUS(sp) != UCS_OK) {
        kvf_ucx_push_fail(p, kvf_ucx_status(UCS_PTR_STATUS(sp)));
        rc->pending--;
    }
}

/* rc's request being built, or a new one when there is none, it was
 * sent or it is full (NULL: no memory). */
static kvf_ucx_push_t *kvf_ucx_push_room(kvf_ucx_rctx_t *rc, uint32_t first)
{
    kvf_ucx_push_t *p = rc->pushes;
    uint32_t cap;

    if (p != NULL && !p->sent && p->nent < p->cap &&
        p->total < KVF_UCX_PUSH_BYTES) {
        return p;
    }
    kvf_ucx_push_send(rc);
    cap = (uint32_t)(rc->req->nsegs - first);
    return kvf_ucx_push_new(rc,
                            cap < KVF_UCX_PUSH_MAX ? cap : KVF_UCX_PUSH_MAX);
}

void kvf_ucx_push_add(kvf_ucx_rctx_t *rc, uint32_t first, uint32_t count,
                      void *local, uint64_t remote, uint64_t len)
{
    kvf_ucx_push_t *p;
    uint64_t piece;
    kvf_wr_t w;

    while (len > 0) {
        p = kvf_ucx_push_room(rc, first);
        if (p == NULL) {
            kvf_ucx_segs_fail(rc, first, count, KVF_ERR_NO_MEMORY);
            return;
        }
        piece = KVF_UCX_PUSH_BYTES - p->total;
        piece = piece < len ? piece : len;
        if (p->first == UINT32_MAX) {
            p->first = first;
        }
        p->last = first + count;
        p->iov[p->nent].buffer = local;
        p->iov[p->nent].length = piece;
        kvf_wr_init_fixed(&w, p->ent + (size_t)p->nent * KVF_UCX_PUSH_ENT,
                          KVF_UCX_PUSH_ENT);
        kvf_ucx_range_enc(&w, remote, piece);
        p->total += piece;
        p->nent++;
        local = (char *)local + piece;
        remote += piece;
        len -= piece;
    }
}

void kvf_ucx_push_free(kvf_ucx_rctx_t *rc)
{
    kvf_ucx_push_t *p;

    while ((p = rc->pushes) != NULL) {
        rc->pushes = p->next;
        kvf_free(p);
    }
}
