/*
 * tcp transport, initiator side. An ep holds `conns` connections to one
 * peer, each with a worker thread and a request queue. A posted request
 * goes to the connection with the fewest queued bytes. Workers pipeline
 * up to KVF_TCP_WINDOW requests (a WRITE never follows an outstanding
 * READ, so neither side can block the other), gather WRITE payloads and
 * scatter READ payloads with vectored I/O, and sleep on a condition
 * variable when idle. A broken or silent connection fails its requests
 * within the timeout and is re-established on the next request. Local
 * GPU memory is gathered/scattered through pinned staging buffers
 * (mem/mem.h), overlapped with the socket.
 *
 * Inline path (ep_post_inline): a caller about to wait for one small
 * request takes an idle connection (its worker asleep, nothing queued)
 * for itself, sends and receives on its own thread, and gives the
 * connection back; no hand-off to the worker and no wake-up of the
 * caller, which cost more than the transfer itself for small objects.
 * A connection held by a caller (`inl`) is skipped by its worker, and
 * its worker is `wbusy` from taking a request until it sleeps again
 * with nothing in flight; a caller may take the connection only when
 * neither is set, so the socket and the worker-private fields have one
 * user at a time. The caller then reads the reply with one recvmsg into
 * [header | the request's local buffers] once the socket is readable
 * (the common reply: no refusals, all the bytes); any other reply's
 * bytes that landed in the buffers are taken back out and the reply is
 * read the usual way from them (the `pre` prefix), so refusals keep
 * their per-segment results.
 */
#include "transport/tcp/tcp.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/log.h"
#include "core/time.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct kvf_tcp_cconn {
    struct kvf_tl_ep *ep;
    int fd;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    kvf_tl_req_t *head, *tail;
    uint64_t queued;
    uint64_t inl_bytes; /* the request a caller moves inline */
    int stop;
    int inl;   /* held by a caller for an inline request */
    int wbusy; /* the worker is not asleep */
    /* worker-private */
    kvf_tl_req_t *flight_head, *flight_tail;
    unsigned nflight;
    unsigned nreads;
    uint64_t next_id;
    kvf_tcp_scratch_t scratch;
    unsigned char *pre; /* reply bytes already read (inline), then socket */
    size_t pre_len, pre_off;
    unsigned char *drain;
    kvf_mem_stage_t *stage; /* pinned staging for local GPU memory */
    kvf_wire_mac_t mac;     /* frame tags (core/wire.h) */
    int recv_wait_ms;       /* SO_RCVTIMEO set on fd, 0 none */
    uint64_t last_reply_ms; /* when a reply last completed */
};

#define KVF_TCP_DRAIN_LEN (64u << 10)
/* A blocking read for a reply wakes at least this often. */
#define KVF_TCP_WAIT_SLICE_MS 1000

static kvf_status_t kvf_tcp_cconn_connect(kvf_tcp_cconn_t *c)
{
    kvf_tl_ep_t *ep = c->ep;
    kvf_status_t status;

    kvf_wire_mac_free(&c->mac);
    status =
        kvf_auth_connect(ep->host, ep->port, (int)ep->iface->cfg.timeout_ms,
                         "tcp", &c->fd, &c->mac);
    if (status != KVF_OK) {
        c->fd = -1;
        return status;
    }
    kvf_sock_set_bufs(c->fd, KVF_TCP_SOCKBUF);
    c->recv_wait_ms = 0;
    return KVF_OK;
}

/*
 * The connection failed (reset, protocol error or a silent peer): fail the
 * requests in flight and those queued behind them, which would meet the
 * same peer, so a whole batch fails within one timeout rather than one
 * timeout per queued request. The next request reconnects.
 */
static void kvf_tcp_cconn_break(kvf_tcp_cconn_t *c, kvf_status_t status)
{
    kvf_tl_req_t *req, *queued;

    if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
    kvf_wire_mac_free(&c->mac);
    while ((req = c->flight_head) != NULL) {
        c->flight_head = req->next;
        kvf_tl_req_fail(req, status);
    }
    c->flight_tail = NULL;
    c->nflight = 0;
    c->nreads = 0;
    pthread_mutex_lock(&c->lock);
    queued = c->head;
    c->head = c->tail = NULL;
    c->queued = 0;
    pthread_mutex_unlock(&c->lock);
    while ((req = queued) != NULL) {
        queued = req->next;
        kvf_tl_req_fail(req, status);
    }
}

/*
 * Builds the entry list (remote-adjacent segments merged) in scratch.meta
 * and the local iovec list (local-adjacent merged) after `iov_first`
 * slots, with room for one more iovec after them.
 */
static kvf_status_t kvf_tcp_build(kvf_tcp_cconn_t *c, kvf_tl_req_t *req,
                                  size_t iov_first, uint32_t *nentries_p,
                                  size_t *niov_p)
{
    struct iovec *iov;
    uint64_t last_remote = 0, last_len = 0;
    uint32_t ne = 0;
    size_t ni = iov_first, i;
    kvf_status_t status;
    kvf_wr_t w;

    status =
        kvf_tcp_scratch_meta(&c->scratch, req->nsegs * KVF_TCP_ENTRY_LEN + 1);
    if (status == KVF_OK) { /* one more: a payload tag */
        status = kvf_tcp_scratch_iov(&c->scratch, req->nsegs + iov_first + 1);
    }
    if (status != KVF_OK) {
        return status;
    }
    iov = c->scratch.iov;
    kvf_wr_init_fixed(&w, c->scratch.meta, c->scratch.meta_cap);
    for (i = 0; i < req->nsegs; i++) {
        const kvf_tl_seg_t *s = &req->segs[i];

        if (ne > 0 && last_remote + last_len == s->remote) {
            last_len += s->len;
        } else {
            if (ne > 0) {
                kvf_tcp_entry_enc(&w, last_remote, last_len);
            }
            last_remote = s->remote;
            last_len = s->len;
            ne++;
        }
        if (ni > iov_first &&
            (char *)iov[ni - 1].iov_base + iov[ni - 1].iov_len ==
                (char *)s->local) {
            iov[ni - 1].iov_len += s->len;
        } else {
            iov[ni].iov_base = s->local;
            iov[ni].iov_len = s->len;
            ni++;
        }
    }
    if (ne > 0) {
        kvf_tcp_entry_enc(&w, last_remote, last_len);
    }
    *nentries_p = ne;
    *niov_p = ni;
    KVF_TL_COUNT(wire_entries, ne);
    KVF_TL_COUNT(wire_iovs, ni - iov_first);
    return KVF_OK;
}

/* Payload tags cover host memory only (the tag reads the bytes). */
static kvf_status_t kvf_tcp_pmac_mem(const kvf_tcp_cconn_t *c,
                                     const kvf_tl_req_t *req)
{
    if (c->mac.payload && req->local_mem != KVF_MEM_BIT(KVF_MEM_HOST)) {
        kvf_log_rl(KVF_LOG_ERROR,
                   "auth_payload_mac covers host memory only: a request to "
                   "%s:%u with local GPU memory is refused",
                   c->ep->host, c->ep->port);
        return KVF_ERR_UNSUPPORTED;
    }
    return KVF_OK;
}

static kvf_status_t kvf_tcp_send_req(kvf_tcp_cconn_t *c, kvf_tl_req_t *req)
{
    unsigned char hdrbuf[KVF_WIRE_HDR_LEN], tag[KVF_WIRE_TAG_LEN];
    unsigned char ptag[KVF_WIRE_TAG_LEN];
    int w = (req->type == KVF_OP_WRITE);
    struct iovec *iov;
    kvf_frame_hdr_t h;
    kvf_status_t status;
    uint32_t ne;
    size_t niov;

    status = kvf_tcp_pmac_mem(c, req);
    if (status == KVF_OK) {
        status = kvf_tcp_build(c, req, 3, &ne, &niov);
    }
    if (status != KVF_OK) {
        return status;
    }
    iov = c->scratch.iov;
    kvf_tcp_hdr_init(&h, w ? KVF_TCP_WRITE : KVF_TCP_READ, ++c->next_id, KVF_OK,
                     ne, w ? req->bytes : 0);
    iov[2].iov_len = kvf_tcp_seal(&c->mac, &h, c->scratch.meta, hdrbuf, tag);
    iov[2].iov_base = tag;
    iov[0].iov_base = hdrbuf;
    iov[0].iov_len = sizeof(hdrbuf);
    iov[1].iov_base = c->scratch.meta;
    iov[1].iov_len = h.meta_len;
    if (!w) {
        niov = 3;
    } else if (c->mac.payload && req->bytes > 0) {
        kvf_tcp_ptag(&c->mac, 1, iov + 3, niov - 3, ptag);
        iov[niov].iov_base = ptag;
        iov[niov++].iov_len = sizeof(ptag);
    }
    req->deadline_ms = kvf_time_ms() + c->ep->iface->cfg.timeout_ms;
    return kvf_mem_stage_writev(&c->stage, req->local_mem, c->fd, iov, niov,
                                req->deadline_ms);
}

/*
 * Maps refused wire entries back to segments: entries were built by
 * merging remote-adjacent segments in order, so walk the same merge.
 */
static kvf_status_t kvf_tcp_mark_refused(kvf_tl_req_t *req,
                                         const unsigned char *meta,
                                         uint32_t nref)
{
    uint64_t last_remote = 0, last_len = 0;
    uint32_t entry = 0, r;
    kvf_tcp_refusal_t *ref;
    kvf_rd_t rd;
    size_t i;
    int started = 0;

    ref = kvf_malloc(nref * sizeof(*ref));
    if (ref == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf_rd_init(&rd, meta, (size_t)nref * KVF_TCP_REFUSE_LEN);
    for (r = 0; r < nref; r++) {
        kvf_tcp_refusal_dec(&rd, &ref[r]);
    }
    for (i = 0; i < req->nsegs; i++) {
        req->seg_status[i] = KVF_OK;
    }
    for (i = 0; i < req->nsegs; i++) {
        const kvf_tl_seg_t *s = &req->segs[i];

        if (started && last_remote + last_len == s->remote) {
            last_len += s->len;
        } else {
            if (started) {
                entry++;
            }
            started = 1;
            last_remote = s->remote;
            last_len = s->len;
        }
        for (r = 0; r < nref; r++) {
            if (ref[r].index == entry) {
                req->seg_status[i] = ref[r].status;
            }
        }
    }
    kvf_free(ref);
    return kvf_rd_end(&rd);
}

/* Reads into iov (memory of the types in mem): first what is left of the
 * prefix, then the socket. */
static kvf_status_t kvf_tcp_take(kvf_tcp_cconn_t *c, kvf_mem_mask_t mem,
                                 struct iovec *iov, size_t n,
                                 uint64_t deadline_ms)
{
    size_t i = 0, k;

    while (c->pre_off < c->pre_len && i < n) {
        k = c->pre_len - c->pre_off;
        k = k < iov[i].iov_len ? k : iov[i].iov_len;
        memcpy(iov[i].iov_base, c->pre + c->pre_off, k);
        c->pre_off += k;
        iov[i].iov_base = (char *)iov[i].iov_base + k;
        iov[i].iov_len -= k;
        if (iov[i].iov_len == 0) {
            i++;
        }
    }
    if (i == n) {
        return KVF_OK;
    }
    return kvf_mem_stage_readv(&c->stage, mem, c->fd, iov + i, n - i,
                               deadline_ms);
}

/* With payload tags: the tag after a READ payload that landed in
 * scratch.pmac[0..n), read through the prefix, checked. */
static kvf_status_t kvf_tcp_take_ptag(kvf_tcp_cconn_t *c, kvf_tl_req_t *req,
                                      size_t n)
{
    unsigned char tag[KVF_WIRE_TAG_LEN];
    struct iovec t = {tag, sizeof(tag)};
    kvf_wire_pmac_t p;
    kvf_status_t status;
    size_t i;

    status =
        kvf_tcp_take(c, KVF_MEM_BIT(KVF_MEM_HOST), &t, 1, req->deadline_ms);
    if (status != KVF_OK) {
        return status;
    }
    kvf_wire_pmac_begin(&c->mac, 0, &p);
    for (i = 0; i < n; i++) {
        kvf_wire_pmac_update(&p, c->scratch.pmac[i].iov_base,
                             c->scratch.pmac[i].iov_len);
    }
    if (kvf_wire_pmac_end(&p, 1, tag) != KVF_OK) {
        kvf_log_rl(KVF_LOG_WARN,
                   "%s: a READ payload's tag does not match the session key "
                   "(bytes altered in flight): closing the connection",
                   c->ep->where);
        return KVF_ERR_AUTH;
    }
    return KVF_OK;
}

/* Reads a READ payload into iov[0..n) (and its tag, with payload tags). */
static kvf_status_t kvf_tcp_take_payload(kvf_tcp_cconn_t *c, kvf_tl_req_t *req,
                                         struct iovec *iov, size_t n,
                                         uint64_t data_len)
{
    int pm = c->mac.payload && data_len > 0;
    kvf_status_t status;

    if (pm && kvf_tcp_scratch_pmac(&c->scratch, iov, n) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_tcp_take(c, req->local_mem, iov, n, req->deadline_ms);
    return status == KVF_OK && pm ? kvf_tcp_take_ptag(c, req, n) : status;
}

/* Receives the READ payload, skipping the segments the target refused. */
static kvf_status_t kvf_tcp_recv_read(kvf_tcp_cconn_t *c, kvf_tl_req_t *req,
                                      uint64_t data_len, int refused)
{
    struct iovec *iov;
    size_t i, n = 0;
    uint64_t sum = 0;
    kvf_status_t status;

    if (!refused) {
        if (data_len != req->bytes) {
            return KVF_ERR_PROTOCOL;
        }
        status = kvf_tcp_build(c, req, 0, &(uint32_t){0}, &n);
        if (status != KVF_OK) {
            return status;
        }
        return kvf_tcp_take_payload(c, req, c->scratch.iov, n, data_len);
    }
    status = kvf_tcp_scratch_iov(&c->scratch, req->nsegs);
    if (status != KVF_OK) {
        return status;
    }
    iov = c->scratch.iov;
    for (i = 0; i < req->nsegs; i++) {
        if (req->seg_status[i] == KVF_OK) {
            iov[n].iov_base = req->segs[i].local;
            iov[n].iov_len = req->segs[i].len;
            sum += req->segs[i].len;
            n++;
        }
    }
    if (sum != data_len) {
        return KVF_ERR_PROTOCOL;
    }
    return kvf_tcp_take_payload(c, req, iov, n, data_len);
}

/* Checks a reply header against the oldest request in flight. */
static kvf_status_t kvf_tcp_check_hdr(kvf_tcp_cconn_t *c,
                                      const kvf_tl_req_t *req,
                                      const kvf_frame_hdr_t *hp)
{
    uint8_t want =
        (req->type == KVF_OP_WRITE) ? KVF_TCP_WRITE_ACK : KVF_TCP_READ_RESP;
    kvf_frame_hdr_t h = *hp;

    if (h.type == KVF_TCP_ERROR) {
        kvf_error("peer %s:%u closed the connection: %s", c->ep->host,
                  c->ep->port, kvf_status_str((kvf_status_t)h.status));
        return KVF_ERR_PROTOCOL;
    }
    if (h.type != want || h.id != c->next_id - c->nflight + 1 ||
        kvf_tcp_hdr_check(&h) != KVF_OK) {
        kvf_error("unexpected reply type %u id %lu from %s:%u", h.type,
                  (unsigned long)h.id, c->ep->host, c->ep->port);
        return KVF_ERR_PROTOCOL;
    }
    return KVF_OK;
}

/* The metadata of reply h into scratch.meta and its tag, read through
 * the prefix; the tag checked. */
static kvf_status_t kvf_tcp_recv_rmeta(kvf_tcp_cconn_t *c, kvf_tl_req_t *req,
                                       const kvf_frame_hdr_t *h)
{
    unsigned char tag[KVF_WIRE_TAG_LEN];
    struct iovec iov[2];
    kvf_status_t status;
    size_t n = 0;

    status = kvf_tcp_scratch_meta(&c->scratch, h->meta_len + 1);
    if (status != KVF_OK) {
        return status;
    }
    if (h->meta_len > 0) {
        iov[n].iov_base = c->scratch.meta;
        iov[n++].iov_len = h->meta_len;
    }
    if (kvf_wire_mac_on(&c->mac)) {
        iov[n].iov_base = tag;
        iov[n++].iov_len = sizeof(tag);
    }
    status = n > 0 ? kvf_tcp_take(c, KVF_MEM_BIT(KVF_MEM_HOST), iov, n,
                                  req->deadline_ms)
                   : KVF_OK;
    if (status == KVF_OK && kvf_wire_mac_on(&c->mac)) {
        status = kvf_wire_mac_check_hdr(&c->mac, h, c->scratch.meta,
                                        h->meta_len, tag, c->ep->where);
    }
    return status;
}

/* The rest of a reply whose header is h (checked, metadata read). */
static kvf_status_t kvf_tcp_recv_body(kvf_tcp_cconn_t *c, kvf_tl_req_t *req,
                                      const kvf_frame_hdr_t *hp)
{
    kvf_frame_hdr_t h = *hp;
    kvf_status_t status;

    req->status = KVF_OK;
    if (h.count > 0) {
        if (req->seg_status == NULL) {
            return KVF_ERR_INTERNAL;
        }
        status = kvf_tcp_mark_refused(req, c->scratch.meta, h.count);
        if (status != KVF_OK) {
            return status;
        }
        req->status = KVF_ERR_OUT_OF_BOUNDS;
    }
    if (req->type == KVF_OP_READ) {
        return kvf_tcp_recv_read(c, req, h.data_len, h.count > 0);
    }
    return (h.data_len == 0) ? KVF_OK : KVF_ERR_PROTOCOL;
}

static kvf_status_t kvf_tcp_recv_reply(kvf_tcp_cconn_t *c, kvf_tl_req_t *req)
{
    kvf_frame_hdr_t h;
    kvf_status_t status;

    status = kvf_tcp_recv_hdr(c->fd, &h, req->deadline_ms);
    if (status == KVF_OK) {
        status = kvf_tcp_recv_rmeta(c, req, &h);
    }
    if (status == KVF_OK) {
        status = kvf_tcp_check_hdr(c, req, &h);
    }
    if (status != KVF_OK) {
        return status;
    }
    return kvf_tcp_recv_body(c, req, &h);
}

/* Receives into iov[0..n) until at least want bytes (the header and its
 * tag) are in, by deadline_ms: blocking reads that wait for the reply
 * themselves (no poll before each), advancing *idx_p past filled
 * entries and counting bytes in *got_p. */
static kvf_status_t kvf_tcp_recv_until_hdr(kvf_tcp_cconn_t *c,
                                           struct iovec *iov, size_t n,
                                           size_t want, uint64_t deadline_ms,
                                           size_t *idx_p, size_t *got_p)
{
    size_t idx = 0, got = 0, k, t;
    struct msghdr msg;
    int wait_ms;
    ssize_t r;

    while (got < want) {
        wait_ms = kvf_time_left_ms(deadline_ms);
        if (wait_ms == 0) {
            return KVF_ERR_TIMEOUT;
        }
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = iov + idx;
        msg.msg_iovlen = n - idx;
        r = kvf_sock_recvmsg_wait(
            c->fd, &msg,
            wait_ms < KVF_TCP_WAIT_SLICE_MS ? wait_ms : KVF_TCP_WAIT_SLICE_MS,
            &c->recv_wait_ms);
        if (r == 0) {
            return KVF_ERR_CONN_RESET;
        }
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                continue;
            }
            return errno == ECONNRESET ? KVF_ERR_CONN_RESET : KVF_ERR_IO;
        }
        got += (size_t)r;
        for (k = (size_t)r; k > 0 && idx < n;) {
            t = k < iov[idx].iov_len ? k : iov[idx].iov_len;
            iov[idx].iov_base = (char *)iov[idx].iov_base + t;
            iov[idx].iov_len -= t;
            k -= t;
            if (iov[idx].iov_len == 0) {
                idx++;
            }
        }
        while (idx < n && iov[idx].iov_len == 0) {
            idx++; /* an empty tag slot */
        }
    }
    *idx_p = idx;
    *got_p = got;
    return KVF_OK;
}

/* Copies up to *left bytes of [p, p + len) to the prefix's end. */
static void kvf_tcp_pre_add(kvf_tcp_cconn_t *c, const void *p, size_t len,
                            size_t *left)
{
    size_t t = *left < len ? *left : len;

    memcpy(c->pre + c->pre_len, p, t);
    c->pre_len += t;
    *left -= t;
}

/* Takes the extra bytes that landed after the header (in the tag slot
 * tb, the request's local buffers, the payload tag slot pb) back into
 * the prefix, to be read again the usual way. */
static kvf_status_t kvf_tcp_pre_take_back(kvf_tcp_cconn_t *c,
                                          const kvf_tl_req_t *req, size_t extra,
                                          const unsigned char *tb, size_t tl,
                                          const unsigned char *pb)
{
    size_t i, left = extra;

    c->pre = kvf_malloc(extra);
    if (c->pre == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    c->pre_len = 0;
    c->pre_off = 0;
    kvf_tcp_pre_add(c, tb, tl, &left);
    for (i = 0; req->type == KVF_OP_READ && i < req->nsegs && left > 0; i++) {
        kvf_tcp_pre_add(c, req->segs[i].local, req->segs[i].len, &left);
    }
    kvf_tcp_pre_add(c, pb, KVF_WIRE_TAG_LEN, &left);
    return left == 0 ? KVF_OK : KVF_ERR_INTERNAL;
}

/* The common inline reply (no refusals, all its bytes): its tag checked,
 * the rest of its bytes read in place, and its payload tag checked. */
static kvf_status_t kvf_tcp_inline_whole(kvf_tcp_cconn_t *c, kvf_tl_req_t *req,
                                         const kvf_frame_hdr_t *h,
                                         const unsigned char *tb,
                                         struct iovec *iov, size_t idx,
                                         size_t n, const unsigned char *pb,
                                         size_t nloc)
{
    kvf_wire_pmac_t p;
    kvf_status_t status = KVF_OK;
    size_t i;

    if (kvf_wire_mac_on(&c->mac)) {
        status = kvf_wire_mac_check_hdr(&c->mac, h, NULL, 0, tb, c->ep->where);
    }
    if (status == KVF_OK) {
        status = kvf_tcp_check_hdr(c, req, h);
    }
    if (status == KVF_OK && idx < n) {
        status =
            kvf_sock_readv_all(c->fd, iov + idx, n - idx, req->deadline_ms);
    }
    if (status != KVF_OK || pb == NULL) {
        return status;
    }
    kvf_wire_pmac_begin(&c->mac, 0, &p);
    for (i = 0; i < nloc; i++) {
        kvf_wire_pmac_update(&p, c->scratch.pmac[i].iov_base,
                             c->scratch.pmac[i].iov_len);
    }
    if (kvf_wire_pmac_end(&p, 1, (unsigned char *)pb) != KVF_OK) {
        kvf_log_rl(KVF_LOG_WARN,
                   "%s: a READ payload's tag does not match the session key "
                   "(bytes altered in flight): closing the connection",
                   c->ep->where);
        return KVF_ERR_AUTH;
    }
    return KVF_OK;
}

/*
 * The reply of an inline request (host memory): waits until the socket
 * is readable, then one recvmsg into [header | tag | local buffers |
 * payload tag] (READ) or [header | tag] (WRITE). The common reply (no
 * refusals, all its bytes) is then finished in place; any other has the
 * bytes that landed after the header taken back into the prefix and is
 * read the usual way.
 */
static kvf_status_t kvf_tcp_recv_reply_inline(kvf_tcp_cconn_t *c,
                                              kvf_tl_req_t *req)
{
    unsigned char hb[KVF_WIRE_HDR_LEN], tb[KVF_WIRE_TAG_LEN];
    unsigned char pb[KVF_WIRE_TAG_LEN];
    size_t tl = kvf_wire_mac_on(&c->mac) ? KVF_WIRE_TAG_LEN : 0;
    int rd = req->type == KVF_OP_READ;
    int pm = c->mac.payload && rd && req->bytes > 0;
    size_t n = 2, nloc, idx = 0, got = 0;
    struct iovec *iov;
    kvf_frame_hdr_t h;
    kvf_status_t status;

    status = rd ? kvf_tcp_build(c, req, 2, &(uint32_t){0}, &n)
                : kvf_tcp_scratch_iov(&c->scratch, 2);
    if (status != KVF_OK) {
        return status;
    }
    iov = c->scratch.iov;
    iov[0] = (struct iovec){hb, sizeof(hb)};
    iov[1] = (struct iovec){tb, tl};
    nloc = n - 2;
    if (pm) {
        if (kvf_tcp_scratch_pmac(&c->scratch, iov + 2, nloc) != KVF_OK) {
            return KVF_ERR_NO_MEMORY;
        }
        iov[n++] = (struct iovec){pb, sizeof(pb)};
    }
    status = kvf_tcp_recv_until_hdr(c, iov, n, sizeof(hb) + tl,
                                    req->deadline_ms, &idx, &got);
    if (status == KVF_OK) {
        status = kvf_frame_unpack(hb, &h);
    }
    if (status != KVF_OK) {
        return status;
    }
    if (h.count == 0 &&
        ((rd && h.data_len == req->bytes) || (!rd && h.data_len == 0))) {
        req->status = KVF_OK;
        return kvf_tcp_inline_whole(c, req, &h, tb, iov, idx, n, pm ? pb : NULL,
                                    nloc);
    }
    /* refusals: what landed after the header goes back to the prefix */
    if (got > sizeof(hb)) {
        status = kvf_tcp_pre_take_back(c, req, got - sizeof(hb), tb, tl, pb);
    }
    if (status == KVF_OK) {
        status = kvf_tcp_recv_rmeta(c, req, &h);
    }
    if (status == KVF_OK) {
        status = kvf_tcp_check_hdr(c, req, &h);
    }
    if (status == KVF_OK) {
        status = kvf_tcp_recv_body(c, req, &h);
    }
    if (status == KVF_OK && c->pre_off != c->pre_len) {
        status = KVF_ERR_PROTOCOL; /* bytes past the reply */
    }
    kvf_free(c->pre);
    c->pre = NULL;
    c->pre_len = c->pre_off = 0;
    return status;
}

/* Takes the next request the window allows, or NULL. Caller holds lock. */
static kvf_tl_req_t *kvf_tcp_next(kvf_tcp_cconn_t *c)
{
    kvf_tl_req_t *req = c->head;

    if (req == NULL || c->inl || c->nflight >= KVF_TCP_WINDOW ||
        (req->type == KVF_OP_WRITE && c->nreads > 0)) {
        return NULL;
    }
    c->head = req->next;
    if (c->head == NULL) {
        c->tail = NULL;
    }
    c->queued -= req->bytes;
    req->next = NULL;
    return req;
}

static void kvf_tcp_flight_push(kvf_tcp_cconn_t *c, kvf_tl_req_t *req)
{
    if (c->flight_tail != NULL) {
        c->flight_tail->next = req;
    } else {
        c->flight_head = req;
    }
    c->flight_tail = req;
    c->nflight++;
    if (req->type == KVF_OP_READ) {
        c->nreads++;
    }
}

static void kvf_tcp_issue(kvf_tcp_cconn_t *c, kvf_tl_req_t *req)
{
    kvf_status_t status;

    if (req->cancel != NULL && __atomic_load_n(req->cancel, __ATOMIC_ACQUIRE)) {
        kvf_tl_req_fail(req, KVF_ERR_CANCELED);
        return;
    }
    if (c->fd >= 0 && c->nflight == 0 &&
        kvf_time_ms() - c->last_reply_ms >= KVF_TL_QUIET_MS &&
        kvf_tl_peer_gone(c->fd)) {
        /* the target closed it while idle (idle_timeout_ms): reconnect.
         * A connection with a reply in the last KVF_TL_QUIET_MS cannot
         * have been idle that long, so it is not looked at (a poll per
         * request saved). */
        kvf_debug("%s:%u closed an idle connection; reconnecting", c->ep->host,
                  c->ep->port);
        close(c->fd);
        c->fd = -1;
    }
    if (c->fd < 0 && kvf_tcp_cconn_connect(c) != KVF_OK) {
        kvf_log_rl(KVF_LOG_ERROR, "cannot reconnect to %s:%u", c->ep->host,
                   c->ep->port);
        kvf_tl_req_fail(req, KVF_ERR_PEER_UNREACHABLE);
        kvf_tcp_cconn_break(c, KVF_ERR_PEER_UNREACHABLE);
        return;
    }
    status = kvf_tcp_send_req(c, req);
    if (status != KVF_OK) {
        kvf_log_rl(KVF_LOG_ERROR, "send to %s:%u failed: %s", c->ep->host,
                   c->ep->port, kvf_status_str(status));
        kvf_tcp_cconn_break(c, status);
        kvf_tl_req_fail(req, status);
        return;
    }
    kvf_tcp_flight_push(c, req);
}

static void kvf_tcp_complete_oldest(kvf_tcp_cconn_t *c, int inl)
{
    kvf_tl_req_t *req = c->flight_head;
    kvf_status_t status;

    status =
        inl ? kvf_tcp_recv_reply_inline(c, req) : kvf_tcp_recv_reply(c, req);
    if (status != KVF_OK) {
        kvf_log_rl(KVF_LOG_ERROR, "transfer with %s:%u failed: %s", c->ep->host,
                   c->ep->port, kvf_status_str(status));
        kvf_tcp_cconn_break(c, status);
        return;
    }
    c->flight_head = req->next;
    if (c->flight_head == NULL) {
        c->flight_tail = NULL;
    }
    c->nflight--;
    if (req->type == KVF_OP_READ) {
        c->nreads--;
    }
    c->last_reply_ms = kvf_time_ms();
    req->next = NULL;
    if (req->status == KVF_OK) {
        KVF_TL_COUNT(bytes, req->bytes);
    }
    req->complete(req);
}

static void *kvf_tcp_cconn_main(void *arg)
{
    kvf_tcp_cconn_t *c = arg;
    struct timespec ts;
    kvf_tl_req_t *req;

    for (;;) {
        pthread_mutex_lock(&c->lock);
        /* while a caller holds the connection, nflight and the socket
         * are the caller's: sleep whatever they say */
        while (!c->stop && (c->inl || (c->nflight == 0 && c->head == NULL))) {
            c->wbusy = 0;
            kvf_time_abs_after(&ts, 1000);
            pthread_cond_timedwait(&c->cond, &c->lock, &ts);
        }
        if (c->stop && (c->inl || c->nflight == 0)) {
            pthread_mutex_unlock(&c->lock);
            break;
        }
        c->wbusy = 1;
        req = kvf_tcp_next(c);
        pthread_mutex_unlock(&c->lock);
        if (req != NULL) {
            kvf_tcp_issue(c, req);
        } else if (c->nflight > 0) {
            kvf_tcp_complete_oldest(c, 0);
        }
    }
    /* fail whatever is still queued */
    pthread_mutex_lock(&c->lock);
    while ((req = c->head) != NULL) {
        c->head = req->next;
        kvf_tl_req_fail(req, KVF_ERR_CANCELED);
    }
    c->tail = NULL;
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

kvf_status_t kvf_tcp_ep_open(kvf_tl_iface_t *iface, const char *address,
                             kvf_tl_ep_t **ep_p)
{
    kvf_tl_ep_t *ep;
    kvf_status_t status;
    unsigned i, started = 0;

    ep = kvf_calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    ep->iface = iface;
    status =
        kvf_sock_parse_addr(address, ep->host, sizeof(ep->host), &ep->port);
    if (status != KVF_OK) {
        goto err_free;
    }
    snprintf(ep->where, sizeof(ep->where), "tcp %s:%u", ep->host, ep->port);
    ep->nconns = iface->cfg.conns ? iface->cfg.conns : 1;
    ep->conns = kvf_calloc(ep->nconns, sizeof(*ep->conns));
    if (ep->conns == NULL) {
        status = KVF_ERR_NO_MEMORY;
        goto err_free;
    }
    for (i = 0; i < ep->nconns; i++) {
        ep->conns[i].fd = -1;
    }
    for (i = 0; i < ep->nconns; i++) {
        kvf_tcp_cconn_t *c = &ep->conns[i];

        c->ep = ep;
        pthread_mutex_init(&c->lock, NULL);
        kvf_cond_init(&c->cond);
        c->drain = kvf_malloc(KVF_TCP_DRAIN_LEN);
        if (c->drain == NULL) {
            status = KVF_ERR_NO_MEMORY;
            goto err_conns;
        }
        status = kvf_tcp_cconn_connect(c);
        if (status != KVF_OK) {
            kvf_error("cannot connect to %s: %s", address,
                      kvf_status_str(status));
            goto err_conns;
        }
        if (pthread_create(&c->thread, NULL, kvf_tcp_cconn_main, c) != 0) {
            status = KVF_ERR_NO_RESOURCE;
            goto err_conns;
        }
        started++;
    }
    *ep_p = ep;
    return KVF_OK;

err_conns:
    for (i = started; i < ep->nconns; i++) {
        if (ep->conns[i].fd >= 0) {
            close(ep->conns[i].fd);
        }
        kvf_wire_mac_free(&ep->conns[i].mac);
        kvf_free(ep->conns[i].drain);
        pthread_mutex_destroy(&ep->conns[i].lock);
        pthread_cond_destroy(&ep->conns[i].cond);
    }
    ep->nconns = started;
    kvf_tcp_ep_close(ep);
    return status;
err_free:
    kvf_free(ep);
    return status;
}

void kvf_tcp_ep_close(kvf_tl_ep_t *ep)
{
    unsigned i;

    for (i = 0; i < ep->nconns; i++) {
        kvf_tcp_cconn_t *c = &ep->conns[i];

        pthread_mutex_lock(&c->lock);
        c->stop = 1;
        pthread_cond_signal(&c->cond);
        pthread_mutex_unlock(&c->lock);
    }
    for (i = 0; i < ep->nconns; i++) {
        kvf_tcp_cconn_t *c = &ep->conns[i];
        struct timespec ts;

        pthread_join(c->thread, NULL);
        /* a caller moving a request inline ends within its timeout */
        pthread_mutex_lock(&c->lock);
        while (c->inl) {
            kvf_time_abs_after(&ts, 100);
            pthread_cond_timedwait(&c->cond, &c->lock, &ts);
        }
        pthread_mutex_unlock(&c->lock);
        if (c->fd >= 0) {
            close(c->fd);
        }
        kvf_wire_mac_free(&c->mac);
        kvf_tcp_scratch_free(&c->scratch);
        kvf_mem_stage_free(c->stage);
        kvf_free(c->drain);
        pthread_mutex_destroy(&c->lock);
        pthread_cond_destroy(&c->cond);
    }
    kvf_free(ep->conns);
    kvf_free(ep);
}

kvf_status_t kvf_tcp_ep_post(kvf_tl_ep_t *ep, kvf_tl_req_t *req)
{
    unsigned i, first = __atomic_fetch_add(&ep->rr, 1, __ATOMIC_RELAXED);
    kvf_tcp_cconn_t *c, *best = &ep->conns[first % ep->nconns];

    for (i = 1; i < ep->nconns; i++) {
        c = &ep->conns[(first + i) % ep->nconns];
        if (__atomic_load_n(&c->queued, __ATOMIC_RELAXED) +
                __atomic_load_n(&c->inl_bytes, __ATOMIC_RELAXED) <
            __atomic_load_n(&best->queued, __ATOMIC_RELAXED) +
                __atomic_load_n(&best->inl_bytes, __ATOMIC_RELAXED)) {
            best = c;
        }
    }
    req->next = NULL;
    pthread_mutex_lock(&best->lock);
    if (best->stop) {
        pthread_mutex_unlock(&best->lock);
        return KVF_ERR_PEER_CLOSED;
    }
    if (best->tail != NULL) {
        best->tail->next = req;
    } else {
        best->head = req;
    }
    best->tail = req;
    best->queued += req->bytes;
    pthread_cond_signal(&best->cond);
    pthread_mutex_unlock(&best->lock);
    return KVF_OK;
}

kvf_status_t kvf_tcp_ep_post_inline(kvf_tl_ep_t *ep, kvf_tl_req_t *req)
{
    unsigned i, first = __atomic_fetch_add(&ep->rr, 1, __ATOMIC_RELAXED);
    kvf_tcp_cconn_t *c = NULL, *t;

    for (i = 0; i < ep->nconns && c == NULL; i++) {
        t = &ep->conns[(first + i) % ep->nconns];
        if (__atomic_load_n(&t->queued, __ATOMIC_RELAXED) != 0 ||
            __atomic_load_n(&t->inl, __ATOMIC_RELAXED) ||
            pthread_mutex_trylock(&t->lock) != 0) {
            continue;
        }
        if (!t->stop && !t->inl && !t->wbusy && t->head == NULL) {
            t->inl = 1;
            __atomic_store_n(&t->inl_bytes, req->bytes, __ATOMIC_RELAXED);
            c = t;
        }
        pthread_mutex_unlock(&t->lock);
    }
    if (c == NULL) {
        return KVF_ERR_BUSY;
    }
    /* the connection is ours: the worker sleeps and takes nothing */
    req->next = NULL;
    kvf_tcp_issue(c, req);
    if (c->nflight > 0) {
        kvf_tcp_complete_oldest(c, 1); /* completes it, or breaks c */
    }
    pthread_mutex_lock(&c->lock);
    c->inl = 0;
    __atomic_store_n(&c->inl_bytes, 0, __ATOMIC_RELAXED);
    if (c->head != NULL || c->stop) {
        pthread_cond_broadcast(&c->cond);
    }
    pthread_mutex_unlock(&c->lock);
    return KVF_OK;
}
