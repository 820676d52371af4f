/*
 * tcp transport, target side: an accept thread and one thread per
 * connection. Each connection reads framed requests, checks every entry
 * against the engine's registered regions (refused entries are reported
 * per entry, their payload drained, and the connection keeps serving),
 * and moves payloads straight between the socket and the registered
 * memory with vectored I/O. A malformed frame (bad magic, unknown version
 * or type, inconsistent lengths) gets an ERROR frame and closes that
 * connection only. Threads sleep in a blocking read of the next
 * request's header when idle (SO_RCVTIMEO wakes them to notice stop and
 * the idle timeout), so a waiting request costs no extra poll. Bytes of GPU
 * regions go through pinned staging buffers (mem/mem.h), pipelined.
 */
#include "transport/tcp/tcp.h"
#include "transport/listener.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/checksum.h"
#include "core/log.h"
#include "core/time.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define KVF_TCP_IDLE_POLL_MS 250

typedef struct kvf_tcp_sconn {
    struct kvf_tcp_server *srv;
    kvf_tl_conn_t *conn; /* the listener's */
    int fd;
    kvf_tcp_scratch_t scratch;
    unsigned char *refuse; /* reply metadata: refused entries */
    size_t refuse_cap;
    kvf_mem_stage_t *stage; /* pinned staging for GPU regions */
    kvf_mem_mask_t mem;     /* memory types the last mapped entries hit */
    kvf_wire_mac_t mac;     /* frame tags (core/wire.h) */
    int recv_wait_ms;       /* SO_RCVTIMEO set, 0 none */
    char peer[96];
} kvf_tcp_sconn_t;

struct kvf_tcp_server {
    kvf_tl_iface_t *iface;
    kvf_tl_listener_t *listener;
    kvf_tl_limits_t lim;
};

static uint64_t kvf_tcp_deadline(kvf_tcp_sconn_t *c)
{
    return kvf_time_ms() + c->srv->iface->cfg.timeout_ms;
}

/* Reads a request's metadata and tag; acts on nothing before the tag
 * checked. */
static kvf_status_t kvf_tcp_recv_request(kvf_tcp_sconn_t *c,
                                         const kvf_frame_hdr_t *hdr)
{
    kvf_status_t status;

    status = kvf_tcp_scratch_meta(&c->scratch, hdr->meta_len + 1);
    if (status == KVF_OK) {
        status = kvf_tcp_recv_meta(c->fd, &c->mac, hdr, c->scratch.meta,
                                   kvf_tcp_deadline(c), c->peer);
    }
    return status;
}

/* Checks a request's entry list (read) is self-consistent. */
static kvf_status_t kvf_tcp_recv_entries(kvf_tcp_sconn_t *c,
                                         const kvf_frame_hdr_t *hdr)
{
    kvf_status_t status;

    status = kvf_tcp_entries_check(hdr, c->scratch.meta);
    if (status != KVF_OK) {
        kvf_warn("request %lu: %u entries do not match %lu bytes of payload",
                 (unsigned long)hdr->id, hdr->count,
                 (unsigned long)hdr->data_len);
        return status;
    }
    status = kvf_tcp_scratch_iov(&c->scratch, (size_t)hdr->count + 2);
    if (status != KVF_OK) {
        return status;
    }
    if (c->refuse_cap < (size_t)hdr->count * KVF_TCP_REFUSE_LEN) {
        unsigned char *p =
            kvf_realloc(c->refuse, (size_t)hdr->count * KVF_TCP_REFUSE_LEN);

        if (p == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        c->refuse = p;
        c->refuse_cap = (size_t)hdr->count * KVF_TCP_REFUSE_LEN;
    }
    return KVF_OK;
}

/* Adds [addr, addr + len) to the iovec list, merged with the last
 * iovec when adjacent. */
static kvf_status_t kvf_tcp_iov_add(kvf_tcp_sconn_t *c, size_t *n_p,
                                    uint64_t addr, uint64_t len)
{
    struct iovec *iov = c->scratch.iov;
    size_t n = *n_p;

    if (n > 0 && (char *)iov[n - 1].iov_base + iov[n - 1].iov_len ==
                     (char *)(uintptr_t)addr) {
        iov[n - 1].iov_len += len;
        return KVF_OK;
    }
    if (kvf_tcp_scratch_iov(&c->scratch, n + 2) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    c->scratch.iov[n].iov_base = (void *)(uintptr_t)addr;
    c->scratch.iov[n].iov_len = len;
    *n_p = n + 1;
    return KVF_OK;
}

/* Where kvf_tcp_map_entries is in a request: the entry reader, the next
 * entry's index, the refusals written so far. */
typedef struct kvf_tcp_walk {
    kvf_rd_t r;
    uint32_t i;
    uint32_t nref;
    kvf_wr_t ref;
} kvf_tcp_walk_t;

static void kvf_tcp_walk_init(kvf_tcp_sconn_t *c, const kvf_frame_hdr_t *hdr,
                              kvf_tcp_walk_t *wk)
{
    kvf_rd_init(&wk->r, c->scratch.meta, hdr->meta_len);
    kvf_wr_init_fixed(&wk->ref, c->refuse, c->refuse_cap);
    wk->i = 0;
    wk->nref = 0;
}

/*
 * Checks the entries from wk's position and builds the iovec list of the
 * accepted ones (adjacent entries merged). With stop_refused (WRITE), the
 * walk stops after a refused entry and *skip_p says how many payload
 * bytes it names: the caller reads the accepted ones, then drains those
 * with a fixed buffer, so a refused entry costs no memory whatever its
 * length. Caller holds the target's acquire().
 */
static kvf_status_t kvf_tcp_map_entries(kvf_tcp_sconn_t *c,
                                        const kvf_frame_hdr_t *hdr,
                                        kvf_tcp_walk_t *wk, int stop_refused,
                                        size_t *iovcnt_p, uint64_t *accepted_p,
                                        uint64_t *skip_p)
{
    const kvf_tl_target_t *t = &c->srv->iface->target;
    kvf_tl_mem_t mem;
    kvf_tcp_entry_t e;
    uint64_t accepted = 0;
    size_t n = 0;
    kvf_status_t st;

    c->mem = KVF_MEM_BIT(KVF_MEM_HOST); /* headers */
    *skip_p = 0;
    while (wk->i < hdr->count) {
        kvf_tcp_entry_dec(&wk->r, &e);
        st = t->access(t->arg, e.addr, e.len, &mem);
        if (st == KVF_OK && c->mac.payload && mem.type != KVF_MEM_HOST) {
            st = KVF_ERR_UNSUPPORTED; /* payload tags read host memory */
        }
        if (st != KVF_OK) {
            kvf_log_rl(KVF_LOG_WARN, "refused remote access 0x%lx+%lu: %s",
                       (unsigned long)e.addr, (unsigned long)e.len,
                       kvf_status_str(st));
            kvf_tcp_refusal_enc(&wk->ref, wk->i++, st);
            wk->nref++;
            if (stop_refused) {
                *skip_p = e.len;
                break;
            }
            continue;
        }
        wk->i++;
        if (e.len == 0) {
            continue;
        }
        c->mem |= KVF_MEM_BIT(mem.type);
        if (kvf_tcp_iov_add(c, &n, e.addr, e.len) != KVF_OK) {
            return KVF_ERR_NO_MEMORY;
        }
        accepted += e.len;
    }
    *iovcnt_p = n;
    *accepted_p = accepted;
    return KVF_OK;
}

/* Reads and throws away len payload bytes, feeding them to the payload
 * tag p when it is running. */
static kvf_status_t kvf_tcp_drain(kvf_tcp_sconn_t *c, uint64_t len,
                                  kvf_wire_pmac_t *p)
{
    unsigned char buf[16384];
    kvf_status_t status = KVF_OK;
    size_t n;

    if (p->ctx == NULL) {
        return kvf_sock_drain(c->fd, len, kvf_tcp_deadline(c));
    }
    while (len > 0 && status == KVF_OK) {
        n = len < sizeof(buf) ? (size_t)len : sizeof(buf);
        status = kvf_sock_recv_all(c->fd, buf, n, kvf_tcp_deadline(c));
        kvf_wire_pmac_update(p, buf, n);
        len -= n;
    }
    return status;
}

/* Reads n iovecs of payload into registered memory (c->mem), feeding
 * them to the payload tag p when it is running. */
static kvf_status_t kvf_tcp_read_into(kvf_tcp_sconn_t *c, size_t n,
                                      kvf_wire_pmac_t *p)
{
    kvf_status_t status;
    size_t i;

    if (p->ctx != NULL &&
        kvf_tcp_scratch_pmac(&c->scratch, c->scratch.iov, n) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_mem_stage_readv(&c->stage, c->mem, c->fd, c->scratch.iov, n,
                                 kvf_tcp_deadline(c));
    for (i = 0; status == KVF_OK && p->ctx != NULL && i < n; i++) {
        kvf_wire_pmac_update(p, c->scratch.pmac[i].iov_base,
                             c->scratch.pmac[i].iov_len);
    }
    return status;
}

/* Reads the tag after a payload and checks it against the running
 * payload tag p (ended). */
static kvf_status_t kvf_tcp_ptag_in(kvf_tcp_sconn_t *c, kvf_wire_pmac_t *p)
{
    unsigned char tag[KVF_WIRE_TAG_LEN];
    kvf_status_t status;

    status = kvf_sock_recv_all(c->fd, tag, sizeof(tag), kvf_tcp_deadline(c));
    if (status == KVF_OK && kvf_wire_pmac_end(p, 1, tag) != KVF_OK) {
        kvf_log_rl(KVF_LOG_WARN,
                   "%s: a payload's tag does not match the session key "
                   "(bytes altered in flight): closing the connection",
                   c->peer);
        status = KVF_ERR_AUTH;
    }
    return status;
}

/* Reads a WRITE's payload into the accepted entries; the payload of a
 * refused one is drained outside the region lock. With payload tags,
 * the tag after the payload is checked (the bytes are in place by then:
 * a wrong tag closes the connection and the initiator's WRITE fails). */
static kvf_status_t kvf_tcp_write_payload(kvf_tcp_sconn_t *c,
                                          const kvf_frame_hdr_t *hdr,
                                          kvf_tcp_walk_t *wk)
{
    const kvf_tl_target_t *t = &c->srv->iface->target;
    kvf_status_t status = KVF_OK;
    uint64_t accepted, skip;
    kvf_wire_pmac_t p = {NULL};
    size_t n;

    if (c->mac.payload && hdr->data_len > 0) {
        kvf_wire_pmac_begin(&c->mac, 0, &p);
    }
    kvf_tcp_walk_init(c, hdr, wk);
    while (status == KVF_OK && wk->i < hdr->count) {
        t->acquire(t->arg);
        status = kvf_tcp_map_entries(c, hdr, wk, 1, &n, &accepted, &skip);
        if (status == KVF_OK && n > 0) {
            status = kvf_tcp_read_into(c, n, &p);
        }
        t->release(t->arg);
        if (status == KVF_OK && skip > 0) {
            status = kvf_tcp_drain(c, skip, &p);
        }
    }
    if (p.ctx != NULL && status == KVF_OK) {
        status = kvf_tcp_ptag_in(c, &p);
    }
    return status;
}

static kvf_status_t kvf_tcp_serve_write(kvf_tcp_sconn_t *c,
                                        const kvf_frame_hdr_t *hdr)
{
    unsigned char rh[KVF_WIRE_HDR_LEN], tag[KVF_WIRE_TAG_LEN];
    struct iovec out[3];
    kvf_frame_hdr_t reply;
    kvf_status_t status;
    kvf_tcp_walk_t wk;
    uint32_t nref;

    status = kvf_tcp_recv_entries(c, hdr);
    if (status == KVF_OK) {
        status = kvf_tcp_write_payload(c, hdr, &wk);
    }
    if (status != KVF_OK) {
        return status;
    }
    nref = wk.nref;
    kvf_tcp_hdr_init(&reply, KVF_TCP_WRITE_ACK, hdr->id,
                     nref ? KVF_ERR_OUT_OF_BOUNDS : KVF_OK, nref, 0);
    out[2].iov_len = kvf_tcp_seal(&c->mac, &reply, c->refuse, rh, tag);
    out[2].iov_base = tag;
    out[0].iov_base = rh;
    out[0].iov_len = sizeof(rh);
    out[1].iov_base = c->refuse;
    out[1].iov_len = reply.meta_len;
    return kvf_sock_writev_all(c->fd, out, 3, kvf_tcp_deadline(c));
}

static kvf_status_t kvf_tcp_serve_read(kvf_tcp_sconn_t *c,
                                       const kvf_frame_hdr_t *hdr)
{
    const kvf_tl_target_t *t = &c->srv->iface->target;
    unsigned char rh[KVF_WIRE_HDR_LEN], tag[KVF_WIRE_TAG_LEN];
    unsigned char ptag[KVF_WIRE_TAG_LEN];
    struct iovec *iov;
    kvf_frame_hdr_t reply;
    kvf_status_t status;
    uint64_t accepted, skip;
    kvf_tcp_walk_t wk;
    uint32_t nref;
    size_t n, last;

    status = kvf_tcp_recv_entries(c, hdr);
    if (status != KVF_OK) {
        return status;
    }
    t->acquire(t->arg);
    /* iov[0..2] are the reply header, refusals and tag: map after them */
    kvf_tcp_walk_init(c, hdr, &wk);
    status = kvf_tcp_map_entries(c, hdr, &wk, 0, &n, &accepted, &skip);
    nref = wk.nref;
    if (status == KVF_OK) {
        status = kvf_tcp_scratch_iov(&c->scratch, n + 4);
    }
    if (status != KVF_OK) {
        t->release(t->arg);
        return status;
    }
    iov = c->scratch.iov;
    memmove(iov + 3, iov, n * sizeof(struct iovec));
    kvf_tcp_hdr_init(&reply, KVF_TCP_READ_RESP, hdr->id,
                     nref ? KVF_ERR_OUT_OF_BOUNDS : KVF_OK, nref, accepted);
    iov[2].iov_len = kvf_tcp_seal(&c->mac, &reply, c->refuse, rh, tag);
    iov[2].iov_base = tag;
    iov[0].iov_base = rh;
    iov[0].iov_len = sizeof(rh);
    iov[1].iov_base = c->refuse;
    iov[1].iov_len = reply.meta_len;
    last = n + 3;
    if (c->mac.payload && accepted > 0) {
        kvf_tcp_ptag(&c->mac, 1, iov + 3, n, ptag);
        iov[last].iov_base = ptag;
        iov[last++].iov_len = sizeof(ptag);
    }
    status = kvf_mem_stage_writev(&c->stage, c->mem, c->fd, iov, last,
                                  kvf_tcp_deadline(c));
    t->release(t->arg);
    return status;
}

/* 1 when a request in progress should stop: the server stops or the
 * peer went away (nobody would read the answer). */
static int kvf_tcp_abandoned(kvf_tcp_sconn_t *c)
{
    return kvf_tl_listener_stopping(c->conn->listener) ||
           kvf_tl_peer_gone(c->fd);
}

/* Checks a SUM against the limits before any work. */
static kvf_status_t kvf_tcp_sum_check(kvf_tcp_sconn_t *c,
                                      const kvf_frame_hdr_t *hdr)
{
    const kvf_tl_limits_t *lim = &c->srv->lim;
    uint64_t bytes = 0;
    kvf_tcp_entry_t e;
    kvf_rd_t r;
    uint32_t i;

    if (hdr->count > lim->sum_max_entries) {
        kvf_log_rl(KVF_LOG_WARN,
                   "refused a checksum request of %u entries "
                   "(sum_max_entries=%lu)",
                   hdr->count, (unsigned long)lim->sum_max_entries);
        return KVF_ERR_MSG_TOO_LARGE;
    }
    kvf_rd_init(&r, c->scratch.meta, hdr->meta_len);
    for (i = 0; i < hdr->count; i++) {
        kvf_tcp_entry_dec(&r, &e);
        bytes += e.len; /* each len <= KVF_WIRE_DATA_MAX: no overflow */
    }
    if (bytes > lim->sum_max_bytes) {
        kvf_log_rl(KVF_LOG_WARN,
                   "refused a checksum request of %lu bytes "
                   "(sum_max_bytes=%lu)",
                   (unsigned long)bytes, (unsigned long)lim->sum_max_bytes);
        return KVF_ERR_MSG_TOO_LARGE;
    }
    return KVF_OK;
}

/*
 * Checksums of the entries, the region lock taken per entry (an entry is
 * at most sum_max_bytes), and between entries a look for a stop or a
 * peer that went away: then the request is dropped (KVF_ERR_CANCELED).
 */
static kvf_status_t kvf_tcp_sum_entries(kvf_tcp_sconn_t *c,
                                        const kvf_frame_hdr_t *hdr,
                                        kvf_wr_t *sums)
{
    const kvf_tl_target_t *t = &c->srv->iface->target;
    kvf_status_t st = KVF_OK;
    kvf_tcp_entry_t e;
    kvf_tl_mem_t mem;
    uint64_t h, since = 0;
    uint32_t i;
    kvf_rd_t r;

    kvf_rd_init(&r, c->scratch.meta, hdr->meta_len);
    for (i = 0; i < hdr->count && st == KVF_OK; i++) {
        kvf_tcp_entry_dec(&r, &e);
        if (since >= KVF_TL_SUM_CHUNK) {
            since = 0;
            if (kvf_tcp_abandoned(c)) {
                return KVF_ERR_CANCELED;
            }
        }
        since += e.len + 4096; /* many tiny entries cost too */
        t->acquire(t->arg);
        st = t->access(t->arg, e.addr, e.len, &mem);
        h = 0;
        if (st == KVF_OK) {
            st = kvf_mem_hash(&c->stage, mem.type, e.addr, e.len, &h,
                              kvf_tcp_deadline(c));
        }
        t->release(t->arg);
        kvf_tcp_sum_enc(sums, h);
    }
    return st;
}

static kvf_status_t kvf_tcp_serve_sum(kvf_tcp_sconn_t *c,
                                      const kvf_frame_hdr_t *hdr)
{
    kvf_status_t status, st;
    kvf_wr_t sums;

    status = kvf_tcp_recv_entries(c, hdr);
    if (status != KVF_OK) {
        return status;
    }
    kvf_wr_init(&sums);
    st = kvf_tcp_sum_check(c, hdr);
    if (st == KVF_OK) {
        st = kvf_tcp_sum_entries(c, hdr, &sums);
    }
    if (st == KVF_ERR_CANCELED) {
        kvf_wr_free(&sums);
        return st; /* ends the connection */
    }
    if (kvf_wr_status(&sums) != KVF_OK) {
        kvf_wr_free(&sums);
        return KVF_ERR_NO_MEMORY;
    }
    if (st != KVF_OK) {
        status = kvf_tcp_send_frame(c->fd, &c->mac, KVF_TCP_SUM_RESP, hdr->id,
                                    st, 0, NULL, 0, 0, kvf_tcp_deadline(c));
    } else {
        status = kvf_tcp_send_frame(c->fd, &c->mac, KVF_TCP_SUM_RESP, hdr->id,
                                    KVF_OK, hdr->count, sums.buf,
                                    (uint32_t)sums.len, 0, kvf_tcp_deadline(c));
    }
    kvf_wr_free(&sums);
    return status;
}

/* LINK_WRITE: the range's bytes into place (or drained when refused),
 * then, with payload tags, its tag checked. */
static kvf_status_t kvf_tcp_link_in(kvf_tcp_sconn_t *c, kvf_status_t st,
                                    kvf_tl_mem_t *mem, struct iovec *iov)
{
    kvf_wire_pmac_t p = {NULL};
    kvf_status_t status;

    if (c->mac.payload && iov->iov_len > 0) {
        kvf_wire_pmac_begin(&c->mac, 0, &p);
    }
    if (st != KVF_OK) {
        status = kvf_tcp_drain(c, iov->iov_len, &p);
    } else if (kvf_tcp_scratch_iov(&c->scratch, 1) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    } else {
        c->mem = KVF_MEM_BIT(mem->type);
        c->scratch.iov[0] = *iov;
        status = kvf_tcp_read_into(c, 1, &p);
    }
    if (status == KVF_OK && p.ctx != NULL) {
        status = kvf_tcp_ptag_in(c, &p);
    }
    return status;
}

/* Raw stream for `bench link`: one contiguous range, no block handling. */
static kvf_status_t kvf_tcp_serve_link(kvf_tcp_sconn_t *c,
                                       const kvf_frame_hdr_t *hdr)
{
    const kvf_tl_target_t *t = &c->srv->iface->target;
    int is_write = (hdr->type == KVF_TCP_LINK_WRITE);
    unsigned char ptag[KVF_WIRE_TAG_LEN];
    kvf_status_t status, st;
    struct iovec iov[2];
    kvf_tl_mem_t mem;
    kvf_tcp_entry_t e;
    kvf_rd_t r;
    size_t n = 1;

    status = kvf_tcp_recv_entries(c, hdr); /* exactly one: msg.h */
    if (status != KVF_OK) {
        return status;
    }
    kvf_rd_init(&r, c->scratch.meta, hdr->meta_len);
    kvf_tcp_entry_dec(&r, &e);
    t->acquire(t->arg);
    st = t->access(t->arg, e.addr, e.len, &mem);
    if (st == KVF_OK && c->mac.payload && mem.type != KVF_MEM_HOST) {
        st = KVF_ERR_UNSUPPORTED;
    }
    iov[0].iov_base = (void *)(uintptr_t)e.addr;
    iov[0].iov_len = e.len;
    if (is_write) {
        status = kvf_tcp_link_in(c, st, &mem, iov);
        if (status == KVF_OK) {
            status =
                kvf_tcp_send_frame(c->fd, &c->mac, KVF_TCP_LINK_RESP, hdr->id,
                                   st, 0, NULL, 0, 0, kvf_tcp_deadline(c));
        }
    } else {
        status = kvf_tcp_send_frame(c->fd, &c->mac, KVF_TCP_LINK_RESP, hdr->id,
                                    st, 0, NULL, 0, (st == KVF_OK) ? e.len : 0,
                                    kvf_tcp_deadline(c));
        if (status == KVF_OK && st == KVF_OK) {
            if (c->mac.payload && e.len > 0) {
                kvf_tcp_ptag(&c->mac, 1, iov, 1, ptag);
                iov[n].iov_base = ptag;
                iov[n++].iov_len = sizeof(ptag);
            }
            status = kvf_mem_stage_writev(&c->stage, KVF_MEM_BIT(mem.type),
                                          c->fd, iov, n, kvf_tcp_deadline(c));
        }
    }
    t->release(t->arg);
    return status;
}

static kvf_status_t kvf_tcp_serve_hello(kvf_tcp_sconn_t *c,
                                        const kvf_frame_hdr_t *hdr)
{
    const kvf_tl_target_t *t = &c->srv->iface->target;
    kvf_status_t status;
    kvf_wr_t w;

    kvf_wr_init(&w);
    status = t->describe(t->arg, &w);
    if (status == KVF_OK) {
        status = kvf_wr_status(&w);
    }
    if (status == KVF_OK) {
        status =
            kvf_tcp_send_frame(c->fd, &c->mac, KVF_TCP_DESC, hdr->id, KVF_OK, 0,
                               w.buf, (uint32_t)w.len, 0, kvf_tcp_deadline(c));
    }
    kvf_wr_free(&w);
    return status;
}

/* Waits for the next request and reads what has come of its header into
 * hdr: a blocking read (one system call when a request is waiting)
 * that wakes at least every KVF_TCP_IDLE_POLL_MS to notice stop and
 * idle_timeout_ms. Returns the header bytes read; 0 when the connection
 * should end (stop, the peer's close, an error, idle_timeout_ms). */
static size_t kvf_tcp_wait_request(kvf_tcp_sconn_t *c,
                                   unsigned char hdr[KVF_WIRE_HDR_LEN])
{
    uint64_t idle_end = kvf_time_ms() + c->srv->lim.idle_timeout_ms;
    struct iovec iov = {.iov_base = hdr, .iov_len = KVF_WIRE_HDR_LEN};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    int wait_ms;
    ssize_t n;

    while (!kvf_tl_listener_stopping(c->conn->listener)) {
        wait_ms = kvf_time_left_ms(idle_end);
        if (wait_ms == 0) {
            kvf_debug("closing a connection idle for %u ms",
                      c->srv->lim.idle_timeout_ms);
            return 0;
        }
        n = kvf_sock_recvmsg_wait(
            c->fd, &msg,
            wait_ms < KVF_TCP_IDLE_POLL_MS ? wait_ms : KVF_TCP_IDLE_POLL_MS,
            &c->recv_wait_ms);
        if (n > 0) {
            return (size_t)n;
        }
        if (n == 0 ||
            (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            return 0;
        }
    }
    return 0;
}

/* The authentication exchange, before any request is read: a peer
 * without the secret learns nothing and changes nothing, and holds only
 * a slot of the listener's unauthenticated budget until then. */
static kvf_status_t kvf_tcp_sconn_auth(kvf_tcp_sconn_t *c)
{
    kvf_status_t st;

    kvf_auth_peer_name(c->fd, c->peer, sizeof(c->peer));
    st = kvf_auth_server(c->fd, NULL, "tcp", c->peer,
                         kvf_tl_conn_auth_deadline(c->conn), &c->mac);
    return st == KVF_OK ? kvf_tl_conn_authed(c->conn) : st;
}

static void kvf_tcp_sconn_main(kvf_tcp_sconn_t *c)
{
    unsigned char raw[KVF_WIRE_HDR_LEN];
    kvf_frame_hdr_t hdr;
    kvf_status_t status;
    size_t got;

    if (kvf_tcp_sconn_auth(c) != KVF_OK) {
        goto out;
    }
    while ((got = kvf_tcp_wait_request(c, raw)) > 0) {
        status =
            kvf_tcp_recv_hdr_rest(c->fd, raw, got, &hdr, kvf_tcp_deadline(c));
        if (status == KVF_ERR_CONN_RESET) {
            break;
        }
        if (status != KVF_OK) {
            kvf_warn("closing connection: bad frame header (%s)",
                     kvf_status_str(status));
            goto err_reply;
        }
        status = kvf_tcp_recv_request(c, &hdr);
        if (status != KVF_OK) {
            kvf_debug("connection ends: %s", kvf_status_str(status));
            break;
        }
        switch (hdr.type) {
        case KVF_TCP_HELLO:
            status = kvf_tcp_serve_hello(c, &hdr);
            break;
        case KVF_TCP_WRITE:
            status = kvf_tcp_serve_write(c, &hdr);
            break;
        case KVF_TCP_READ:
            status = kvf_tcp_serve_read(c, &hdr);
            break;
        case KVF_TCP_SUM:
            status = kvf_tcp_serve_sum(c, &hdr);
            break;
        case KVF_TCP_LINK_WRITE:
        case KVF_TCP_LINK_READ:
            status = kvf_tcp_serve_link(c, &hdr);
            break;
        default:
            kvf_warn("closing connection: unknown message type %u", hdr.type);
            status = KVF_ERR_PROTOCOL;
            break;
        }
        if (status == KVF_ERR_PROTOCOL || status == KVF_ERR_NO_MEMORY) {
            kvf_warn("closing connection: request %lu: %s",
                     (unsigned long)hdr.id, kvf_status_str(status));
            goto err_reply;
        }
        if (status != KVF_OK) {
            kvf_debug("connection ends: %s", kvf_status_str(status));
            break;
        }
    }
    goto out;

err_reply:
    /* best effort: tell the peer why, then close */
    kvf_tcp_send_frame(c->fd, &c->mac, KVF_TCP_ERROR, 0, status, 0, NULL, 0, 0,
                       kvf_time_ms() + 100);
out:
    return;
}

/* A connection's thread (the listener's serve function). */
static void kvf_tcp_serve_conn(kvf_tl_conn_t *tc)
{
    kvf_tcp_sconn_t *c;

    c = kvf_calloc(1, sizeof(*c));
    if (c == NULL) {
        kvf_error("no memory for a new connection");
        return;
    }
    c->srv = tc->arg;
    c->conn = tc;
    c->fd = tc->fd;
    kvf_tcp_sconn_main(c);
    kvf_wire_mac_free(&c->mac);
    kvf_tcp_scratch_free(&c->scratch);
    kvf_mem_stage_free(c->stage);
    kvf_free(c->refuse);
    kvf_free(c);
}

static void kvf_tcp_conn_setup(int fd)
{
    int one = 1;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    kvf_sock_set_bufs(fd, KVF_TCP_SOCKBUF);
}

kvf_status_t kvf_tcp_server_start(kvf_tl_iface_t *iface)
{
    kvf_tl_listener_params_t lp = {0};
    char host[KVF_HOST_MAX];
    kvf_tcp_server_t *srv;
    kvf_status_t status;
    uint16_t port;

    status = kvf_sock_parse_addr(iface->cfg.listen, host, sizeof(host), &port);
    if (status != KVF_OK) {
        return status;
    }
    srv = kvf_calloc(1, sizeof(*srv));
    if (srv == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    srv->iface = iface;
    status = kvf_tl_limits_load(&srv->lim);
    if (status == KVF_OK) {
        lp.name = "tcp";
        lp.host = host;
        lp.port = port;
        lp.lim = srv->lim;
        lp.setup = kvf_tcp_conn_setup;
        lp.serve = kvf_tcp_serve_conn;
        lp.arg = srv;
        status = kvf_tl_listener_start(&lp, &srv->listener, &port);
    }
    if (status != KVF_OK) {
        kvf_free(srv);
        return status;
    }
    if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "*") == 0) {
        snprintf(host, sizeof(host), "127.0.0.1");
    }
    snprintf(iface->address, sizeof(iface->address), "%s:%u", host, port);
    iface->server = srv;
    return KVF_OK;
}

void kvf_tcp_server_stop(kvf_tl_iface_t *iface)
{
    kvf_tcp_server_t *srv = iface->server;

    if (srv == NULL) {
        return;
    }
    kvf_tl_listener_stop(srv->listener);
    kvf_free(srv);
    iface->server = NULL;
}
