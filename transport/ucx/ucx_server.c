/*
 * ucx transport, target side. The iface's UCX workers (ucx_workers of
 * them) receive the peers' RMA (with UCX's tcp transport they move the
 * bytes themselves, each in its progress thread, which sleeps on the
 * worker's fd when idle). A tcp side channel, authenticated with the
 * cluster secret like every other connection, hands each initiator's
 * lane n the address of worker n modulo their number (HELLO) and, per
 * registered region it asks for, a remote key (RKEY): a range is mapped
 * with ucp_mem_map on its first request only if the engine's access
 * check finds it inside one registered host region, and the mapping
 * (memory handle and key) is dropped when the region is deregistered.
 * It also answers checksum requests (SUM) for verification.
 */
#include "transport/ucx/ucx.h"
#include "transport/listener.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/log.h"
#include "core/time.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct kvf_ucx_sconn {
    kvf_tl_iface_t *iface;
    kvf_tl_conn_t *conn; /* the listener's */
    int fd;
    kvf_wire_mac_t mac;
} kvf_ucx_sconn_t;

struct kvf_ucx_server {
    kvf_tl_listener_t *listener;
    kvf_tl_limits_t lim;
};

kvf_status_t kvf_ucx_send(int fd, kvf_wire_mac_t *mac, uint8_t type,
                          kvf_status_t status, uint32_t count, const void *meta,
                          size_t len, uint64_t deadline_ms)
{
    unsigned char hdr[KVF_WIRE_HDR_LEN], tag[KVF_WIRE_TAG_LEN];
    kvf_frame_hdr_t h = {0};
    struct iovec iov[3];

    h.magic = KVF_WIRE_MAGIC;
    h.version = KVF_WIRE_VERSION;
    h.type = type;
    h.meta_len = (uint32_t)len;
    h.count = count;
    h.status = status;
    kvf_frame_pack(&h, hdr);
    iov[0] = (struct iovec){hdr, sizeof(hdr)};
    iov[1] = (struct iovec){(void *)meta, len};
    iov[2] = (struct iovec){tag, 0};
    if (kvf_wire_mac_on(mac)) {
        kvf_wire_mac_seal(mac, hdr, meta, len, tag);
        iov[2].iov_len = sizeof(tag);
    }
    return kvf_sock_writev_all(fd, iov, 3, deadline_ms);
}

kvf_status_t kvf_ucx_recv_meta(int fd, kvf_wire_mac_t *mac,
                               const kvf_frame_hdr_t *h, void *meta,
                               uint64_t deadline)
{
    unsigned char tag[KVF_WIRE_TAG_LEN];
    struct iovec iov[2] = {{meta, h->meta_len}, {tag, 0}};
    kvf_status_t s;

    if (kvf_wire_mac_on(mac)) {
        iov[1].iov_len = sizeof(tag);
    }
    s = kvf_sock_readv_all(fd, iov, 2, deadline);
    if (s == KVF_OK && kvf_wire_mac_on(mac)) {
        s = kvf_wire_mac_check_hdr(mac, h, meta, h->meta_len, tag,
                                   "ucx side channel");
    }
    return s;
}

kvf_status_t kvf_ucx_recv_hdr(int fd, kvf_frame_hdr_t *h, uint64_t deadline)
{
    unsigned char hdr[KVF_WIRE_HDR_LEN];
    kvf_status_t s;

    s = kvf_sock_recv_all(fd, hdr, sizeof(hdr), deadline);
    if (s == KVF_OK) {
        s = kvf_frame_unpack(hdr, h);
    }
    if (s == KVF_OK) {
        s = kvf_ucx_hdr_check(h);
    }
    return s;
}

/* The mapping of exactly [base, base+len), or NULL; maps_lock held. */
static kvf_ucx_map_t *kvf_ucx_map_find(kvf_tl_iface_t *iface, uint64_t base,
                                       uint64_t len)
{
    size_t i;

    for (i = 0; i < iface->nmaps; i++) {
        if (iface->maps[i].base == base && iface->maps[i].len == len) {
            return &iface->maps[i];
        }
    }
    return NULL;
}

/* Maps a registered region for peers; maps_lock held. */
static kvf_status_t kvf_ucx_map_add(kvf_tl_iface_t *iface, uint64_t base,
                                    uint64_t len, kvf_ucx_map_t **map_p)
{
    ucp_mem_map_params_t mp = {0};
    kvf_ucx_map_t m = {.base = base, .len = len}, *grown;
    uint64_t t0 = kvf_time_ns();
    ucs_status_t s;

    if (iface->nmaps == iface->maps_cap) {
        size_t cap = iface->maps_cap ? iface->maps_cap * 2 : 8;

        grown = kvf_realloc(iface->maps, cap * sizeof(*grown));
        if (grown == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        iface->maps = grown;
        iface->maps_cap = cap;
    }
    mp.field_mask =
        UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = (void *)(uintptr_t)base;
    mp.length = len;
    s = ucp_mem_map(iface->ctx, &mp, &m.memh);
    if (s != UCS_OK) {
        kvf_error("ucx: ucp_mem_map of 0x%lx+%lu: %s", (unsigned long)base,
                  (unsigned long)len, ucs_status_string(s));
        return kvf_ucx_status(s);
    }
    s = ucp_rkey_pack(iface->ctx, m.memh, &m.rkey_buf, &m.rkey_len);
    if (s != UCS_OK || m.rkey_len == 0 || m.rkey_len > KVF_UCX_RKEY_MAX) {
        kvf_error("ucx: ucp_rkey_pack: %s (%zu bytes)", ucs_status_string(s),
                  m.rkey_len);
        if (s == UCS_OK) {
            ucp_rkey_buffer_release(m.rkey_buf);
        }
        ucp_mem_unmap(iface->ctx, m.memh);
        return KVF_ERR_INTERNAL;
    }
    kvf_debug("ucx: mapped 0x%lx+%lu in %.3f ms, key %zu bytes",
              (unsigned long)base, (unsigned long)len,
              (double)(kvf_time_ns() - t0) / 1e6, m.rkey_len);
    iface->maps[iface->nmaps] = m;
    *map_p = &iface->maps[iface->nmaps++];
    return KVF_OK;
}

static void kvf_ucx_map_drop(kvf_tl_iface_t *iface, size_t i)
{
    ucp_rkey_buffer_release(iface->maps[i].rkey_buf);
    ucp_mem_unmap(iface->ctx, iface->maps[i].memh);
    iface->maps[i] = iface->maps[--iface->nmaps];
}

void kvf_ucx_mem_dereg(kvf_tl_iface_t *iface, uint64_t addr, uint64_t len)
{
    size_t i;

    pthread_mutex_lock(&iface->maps_lock);
    for (i = 0; i < iface->nmaps; i++) {
        if (iface->maps[i].base == addr && iface->maps[i].len == len) {
            kvf_ucx_map_drop(iface, i);
            break;
        }
    }
    pthread_mutex_unlock(&iface->maps_lock);
}

/* RKEY: the key of the registered host region holding [addr, addr+len),
 * mapped on first use, encoded into w. */
static kvf_status_t kvf_ucx_rkey_reply(kvf_tl_iface_t *iface, uint64_t addr,
                                       uint64_t len, kvf_wr_t *w)
{
    const kvf_tl_target_t *t = &iface->target;
    kvf_ucx_map_t *m = NULL;
    kvf_tl_mem_t mem;
    kvf_status_t status;

    t->acquire(t->arg);
    status = t->access(t->arg, addr, len, &mem);
    if (status == KVF_OK && mem.type == KVF_MEM_CUDA) {
        status = KVF_ERR_UNSUPPORTED; /* GPU memory: kvferry's own paths */
    }
    if (status == KVF_OK) {
        pthread_mutex_lock(&iface->maps_lock);
        m = kvf_ucx_map_find(iface, mem.base, mem.len);
        if (m == NULL) {
            status = kvf_ucx_map_add(iface, mem.base, mem.len, &m);
        }
        if (status == KVF_OK) {
            kvf_ucx_rkey_enc(w, m->base, m->len, m->rkey_buf,
                             (uint32_t)m->rkey_len);
            status = kvf_wr_status(w);
        }
        pthread_mutex_unlock(&iface->maps_lock);
    }
    t->release(t->arg);
    return status;
}

/* SUM: checksums of registered ranges, bounded by the target limits. */
static kvf_status_t kvf_ucx_sum_reply(kvf_ucx_sconn_t *c, kvf_rd_t *r,
                                      uint32_t count, kvf_wr_t *w)
{
    const kvf_tl_target_t *t = &c->iface->target;
    kvf_ucx_server_t *srv = c->iface->server;
    kvf_status_t status = KVF_OK;
    kvf_mem_stage_t *stage = NULL;
    uint64_t addr, len, total = 0, h = 0;
    kvf_tl_mem_t mem;
    uint32_t i;

    if (count > srv->lim.sum_max_entries) {
        return KVF_ERR_QUOTA;
    }
    t->acquire(t->arg);
    for (i = 0; i < count && status == KVF_OK; i++) {
        status = kvf_ucx_range_dec(r, &addr, &len);
        total += len;
        if (status == KVF_OK && total > srv->lim.sum_max_bytes) {
            status = KVF_ERR_QUOTA;
        }
        if (status == KVF_OK) {
            status = t->access(t->arg, addr, len, &mem);
        }
        if (status == KVF_OK) {
            status = kvf_mem_hash(&stage, mem.type, addr, len, &h,
                                  kvf_time_ms() + c->iface->cfg.timeout_ms);
        }
        kvf_wr_u64(w, h);
    }
    t->release(t->arg);
    kvf_mem_stage_free(stage);
    return status == KVF_OK ? kvf_wr_status(w) : status;
}

/* One request on the side channel: reads its body, answers. */
static kvf_status_t kvf_ucx_serve_one(kvf_ucx_sconn_t *c,
                                      const kvf_frame_hdr_t *h)
{
    kvf_tl_iface_t *iface = c->iface;
    uint64_t deadline = kvf_time_ms() + iface->cfg.timeout_ms;
    unsigned char *meta = NULL;
    kvf_status_t status, st;
    uint64_t addr, len;
    uint8_t type;
    kvf_wr_t w;
    kvf_rd_t r;

    if (h->meta_len > 0) {
        meta = kvf_malloc(h->meta_len);
        if (meta == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
    }
    status = kvf_ucx_recv_meta(c->fd, &c->mac, h, meta, deadline);
    if (status != KVF_OK) {
        kvf_free(meta);
        return status;
    }
    kvf_wr_init(&w);
    kvf_rd_init(&r, meta, h->meta_len);
    switch (h->type) {
    case KVF_UCX_HELLO: {
        const kvf_ucx_tworker_t *tw = &iface->tw[h->count % iface->nworkers];

        type = KVF_UCX_HELLO_RESP;
        kvf_wr_bytes(&w, tw->addr, tw->addr_len);
        st = kvf_wr_status(&w);
        break;
    }
    case KVF_UCX_RKEY:
        type = KVF_UCX_RKEY_RESP;
        st = kvf_ucx_range_dec(&r, &addr, &len);
        if (st == KVF_OK) {
            st = kvf_ucx_rkey_reply(iface, addr, len, &w);
        }
        break;
    case KVF_UCX_SUM:
        type = KVF_UCX_SUM_RESP;
        st = kvf_ucx_sum_reply(c, &r, h->count, &w);
        break;
    default: /* a reply type sent to the target */
        kvf_free(meta);
        kvf_wr_free(&w);
        return KVF_ERR_PROTOCOL;
    }
    status = kvf_ucx_send(c->fd, &c->mac, type, st, st == KVF_OK ? h->count : 0,
                          w.buf, st == KVF_OK ? w.len : 0, deadline);
    kvf_wr_free(&w);
    kvf_free(meta);
    return status;
}

/* A side channel connection's thread (the listener's serve function). */
static void kvf_ucx_serve_conn(kvf_tl_conn_t *tc)
{
    kvf_tl_iface_t *iface = tc->arg;
    kvf_ucx_server_t *srv = iface->server;
    kvf_ucx_sconn_t c = {iface, tc, tc->fd, {0}};
    kvf_frame_hdr_t h;
    kvf_status_t status;
    char peer[64];

    kvf_auth_peer_name(c.fd, peer, sizeof(peer));
    status = kvf_auth_server(c.fd, iface->host, "ucx", peer,
                             kvf_tl_conn_auth_deadline(tc), &c.mac);
    if (status == KVF_OK) {
        status = kvf_tl_conn_authed(tc);
    }
    while (status == KVF_OK && !kvf_tl_listener_stopping(tc->listener)) {
        status = kvf_ucx_recv_hdr(c.fd, &h,
                                  kvf_time_ms() + srv->lim.idle_timeout_ms);
        if (status == KVF_OK) {
            status = kvf_ucx_serve_one(&c, &h);
        } else if (status == KVF_ERR_PROTOCOL || status == KVF_ERR_VERSION ||
                   status == KVF_ERR_MSG_TOO_LARGE) {
            kvf_warn("ucx: closing side channel of %s: %s", peer,
                     kvf_status_str(status));
        }
    }
    kvf_wire_mac_free(&c.mac);
}

static void *kvf_ucx_target_progress(void *arg)
{
    kvf_ucx_tworker_t *tw = arg;

    while (!tw->stop) {
        kvf_ucx_worker_wait(tw->worker, tw->efd, tw->wake, -1,
                            &tw->iface->target, &tw->spin, NULL, NULL);
    }
    return NULL;
}

static void kvf_ucx_progress_stop(kvf_tl_iface_t *iface)
{
    unsigned i;

    for (i = 0; i < iface->nworkers; i++) {
        kvf_ucx_tworker_t *tw = &iface->tw[i];

        if (tw->thread_on) {
            tw->stop = 1;
            kvf_ucx_wake(tw->wake);
            pthread_join(tw->thread, NULL);
            tw->thread_on = 0;
        }
    }
}

static kvf_status_t kvf_ucx_progress_start(kvf_tl_iface_t *iface)
{
    unsigned i;

    for (i = 0; i < iface->nworkers; i++) {
        kvf_ucx_tworker_t *tw = &iface->tw[i];

        tw->stop = 0;
        if (pthread_create(&tw->thread, NULL, kvf_ucx_target_progress, tw) !=
            0) {
            kvf_ucx_progress_stop(iface);
            return KVF_ERR_NO_RESOURCE;
        }
        tw->thread_on = 1;
    }
    return KVF_OK;
}

kvf_status_t kvf_ucx_server_start(kvf_tl_iface_t *iface)
{
    kvf_tl_listener_params_t lp = {0};
    kvf_ucx_server_t *srv;
    kvf_status_t status;
    uint16_t port;

    srv = kvf_calloc(1, sizeof(*srv));
    if (srv == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_tl_limits_load(&srv->lim);
    if (status != KVF_OK) {
        kvf_free(srv);
        return status;
    }
    iface->server = srv;
    status = kvf_ucx_progress_start(iface);
    if (status == KVF_OK) {
        lp.name = "ucx";
        lp.host = iface->host;
        lp.port = 0;
        lp.lim = srv->lim;
        lp.serve = kvf_ucx_serve_conn;
        lp.arg = iface;
        status = kvf_tl_listener_start(&lp, &srv->listener, &port);
        if (status != KVF_OK) {
            kvf_ucx_progress_stop(iface);
        }
    }
    if (status != KVF_OK) {
        iface->server = NULL;
        kvf_free(srv);
        return status;
    }
    snprintf(iface->address, sizeof(iface->address), "%s:%u",
             strcmp(iface->host, "0.0.0.0") == 0 ? "127.0.0.1" : iface->host,
             port);
    return KVF_OK;
}

void kvf_ucx_server_stop(kvf_tl_iface_t *iface)
{
    kvf_ucx_server_t *srv = iface->server;

    if (srv == NULL) {
        return;
    }
    kvf_tl_listener_stop(srv->listener);
    kvf_ucx_progress_stop(iface);
    kvf_free(srv);
    iface->server = NULL;
}
