/*
 * ucx transport ops table: the iface (a UCP context, and on a listening
 * engine the target worker and its side channel), remote checksums over
 * the side channel, and the link test (one contiguous put or get of the
 * whole length, cut into one piece per lane, through the same lanes as
 * the blocks, one-sided in every read mode: the ceiling `bench link`
 * reports for them).
 */
#include "transport/ucx/ucx.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>

static int kvf_ucx_available(void)
{
    return kvf_ucx_resources()[0] != '\0';
}

/* Under transports=auto: only where UCX drives an RDMA device (other
 * hosts are then reached over RDMA; one host keeps shm and CUDA IPC). */
static int kvf_ucx_auto_select(void)
{
    return kvf_ucx_has_rdma(kvf_ucx_resources());
}

/* Releases the target workers that exist (no progress thread runs). */
static void kvf_ucx_tw_destroy(kvf_tl_iface_t *iface)
{
    unsigned i;

    for (i = 0; i < iface->nworkers; i++) {
        kvf_ucx_tworker_t *tw = &iface->tw[i];

        if (tw->worker == NULL) {
            continue;
        }
        if (tw->addr != NULL) {
            ucp_worker_release_address(tw->worker, tw->addr);
        }
        kvf_ucx_worker_destroy(tw->worker, tw->efd, tw->wake);
    }
    kvf_free(iface->tw);
    iface->tw = NULL;
}

static kvf_status_t kvf_ucx_tw_create(kvf_tl_iface_t *iface,
                                      kvf_ucx_tworker_t *tw)
{
    ucp_address_t *addr;
    kvf_status_t status;
    ucs_status_t s;

    tw->iface = iface;
    tw->spin.ns = iface->spin_ns;
    status =
        kvf_ucx_worker_create(iface->ctx, &tw->worker, &tw->efd, &tw->wake);
    if (status != KVF_OK) {
        tw->worker = NULL;
        return status;
    }
    s = ucp_worker_get_address(tw->worker, &addr, &tw->addr_len);
    if (s != UCS_OK) {
        kvf_error("ucx: ucp_worker_get_address: %s", ucs_status_string(s));
        return KVF_ERR_INTERNAL;
    }
    tw->addr = addr;
    if (kvf_ucx_addr_check(tw->addr_len) != KVF_OK) {
        return KVF_ERR_INTERNAL;
    }
    return kvf_ucx_push_serve(tw);
}

/* The target's workers, then its side channel and progress threads. */
static kvf_status_t kvf_ucx_target_open(kvf_tl_iface_t *iface)
{
    kvf_status_t status = KVF_OK;
    unsigned i;

    iface->tw = kvf_calloc(iface->nworkers, sizeof(*iface->tw));
    if (iface->tw == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0; i < iface->nworkers && status == KVF_OK; i++) {
        status = kvf_ucx_tw_create(iface, &iface->tw[i]);
    }
    if (status == KVF_OK) {
        status = kvf_ucx_server_start(iface);
    }
    if (status != KVF_OK) {
        kvf_ucx_tw_destroy(iface);
    }
    return status;
}

static kvf_status_t kvf_ucx_iface_open(const kvf_tl_config_t *cfg,
                                       const kvf_tl_target_t *target,
                                       kvf_tl_iface_t **iface_p)
{
    kvf_tl_iface_t *iface;
    kvf_status_t status;
    uint16_t port;

    iface = kvf_calloc(1, sizeof(*iface));
    if (iface == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    iface->cfg = *cfg;
    iface->target = *target;
    pthread_mutex_init(&iface->maps_lock, NULL);
    status = kvf_sock_parse_addr(cfg->listen, iface->host, sizeof(iface->host),
                                 &port);
    if (status == KVF_OK) {
        status =
            kvf_ucx_tuning(cfg->ucx_workers, &iface->nworkers, &iface->spin_ns);
    }
    if (status == KVF_OK) {
        status = kvf_ucx_read_mode(&iface->read_mode);
    }
    if (status == KVF_OK) {
        status = kvf_ucx_write_mode(&iface->write_mode);
    }
    if (status == KVF_OK) {
        status = kvf_ucx_ctx_create(iface->host, &iface->ctx);
    }
    if (status == KVF_OK && !cfg->no_listen) {
        status = kvf_ucx_target_open(iface);
        if (status != KVF_OK) {
            ucp_cleanup(iface->ctx);
        }
    }
    if (status != KVF_OK) {
        pthread_mutex_destroy(&iface->maps_lock);
        kvf_free(iface);
        return status;
    }
    *iface_p = iface;
    return KVF_OK;
}

static void kvf_ucx_iface_close(kvf_tl_iface_t *iface)
{
    if (iface->tw != NULL) {
        kvf_ucx_server_stop(iface);
    }
    while (iface->nmaps > 0) {
        kvf_ucx_mem_dereg(iface, iface->maps[0].base, iface->maps[0].len);
    }
    kvf_free(iface->maps);
    if (iface->tw != NULL) {
        kvf_ucx_tw_destroy(iface);
    }
    ucp_cleanup(iface->ctx);
    pthread_mutex_destroy(&iface->maps_lock);
    kvf_free(iface);
}

static const char *kvf_ucx_iface_address(kvf_tl_iface_t *iface)
{
    return iface->tw != NULL ? iface->address : NULL;
}

static kvf_status_t kvf_ucx_sum_some(kvf_tl_ep_t *ep, const uint64_t *remote,
                                     const size_t *lengths, size_t n,
                                     uint64_t *sums)
{
    kvf_frame_hdr_t h;
    kvf_status_t status;
    void *reply = NULL;
    kvf_wr_t w;
    kvf_rd_t r;
    size_t i;

    kvf_wr_init(&w);
    for (i = 0; i < n; i++) {
        kvf_ucx_range_enc(&w, remote[i], lengths[i]);
    }
    status = kvf_wr_status(&w);
    if (status == KVF_OK) {
        status = kvf_ucx_ep_call(ep, KVF_UCX_SUM, (uint32_t)n, w.buf, w.len, &h,
                                 &reply);
    }
    if (status == KVF_OK && h.count != n) {
        status = KVF_ERR_PROTOCOL;
    }
    if (status == KVF_OK) {
        kvf_rd_init(&r, reply, h.meta_len);
        for (i = 0; i < n; i++) {
            sums[i] = kvf_rd_u64(&r);
        }
        status = kvf_rd_end(&r);
    }
    kvf_free(reply);
    kvf_wr_free(&w);
    return status;
}

static kvf_status_t kvf_ucx_ep_checksum(kvf_tl_ep_t *ep, const uint64_t *remote,
                                        const size_t *lengths, size_t count,
                                        uint64_t *sums)
{
    kvf_status_t status = KVF_OK;
    size_t done, n;

    pthread_mutex_lock(&ep->fd_lock);
    for (done = 0; done < count && status == KVF_OK; done += n) {
        n = kvf_tl_sum_batch(lengths + done, count - done);
        if (n > KVF_UCX_SUM_MAX) {
            n = KVF_UCX_SUM_MAX;
        }
        status =
            kvf_ucx_sum_some(ep, remote + done, lengths + done, n, sums + done);
    }
    pthread_mutex_unlock(&ep->fd_lock);
    return status;
}

typedef struct kvf_ucx_wait {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    unsigned left;
} kvf_ucx_wait_t;

static void kvf_ucx_link_done(kvf_tl_req_t *req)
{
    kvf_ucx_wait_t *w = req->arg;

    pthread_mutex_lock(&w->lock);
    if (--w->left == 0) {
        pthread_cond_signal(&w->cond);
    }
    pthread_mutex_unlock(&w->lock);
}

/* One contiguous transfer of length bytes cut into one piece per lane
 * (page-aligned cuts), all posted at once: the ceiling the blocks are
 * measured against uses the same workers and endpoints they do. */
static kvf_status_t kvf_ucx_ep_link_test(kvf_tl_ep_t *ep, kvf_op_type_t type,
                                         void *local, uint64_t remote,
                                         size_t length, double *seconds_p)
{
    kvf_ucx_wait_t w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    kvf_tl_seg_t seg[KVF_UCX_WORKERS_MAX];
    kvf_status_t seg_status[KVF_UCX_WORKERS_MAX], status = KVF_OK;
    kvf_tl_req_t req[KVF_UCX_WORKERS_MAX];
    uint64_t t0, off = 0, piece;
    unsigned i, n = 0;

    piece = (length / ep->nlanes + 4095) & ~(uint64_t)4095;
    memset(req, 0, sizeof(req));
    for (i = 0; i < ep->nlanes && off < length; i++, n++) {
        seg[i] = (kvf_tl_seg_t){(char *)local + off, remote + off,
                                piece < length - off ? piece : length - off};
        off += seg[i].len;
        req[i].type = type;
        req[i].segs = &seg[i];
        req[i].nsegs = 1;
        req[i].bytes = seg[i].len;
        req[i].seg_status = &seg_status[i];
        req[i].complete = kvf_ucx_link_done;
        req[i].arg = &w;
        req[i].deadline_ms = KVF_UCX_REQ_ONE_SIDED;
    }
    w.left = n;
    t0 = kvf_time_ns();
    for (i = 0; i < n; i++) {
        if (kvf_ucx_lane_post(ep, i, &req[i]) != KVF_OK) {
            kvf_ucx_link_done(&req[i]); /* not posted: counted down here */
            req[i].status = KVF_ERR_INVALID_PARAM;
        }
    }
    pthread_mutex_lock(&w.lock);
    while (w.left > 0) {
        pthread_cond_wait(&w.cond, &w.lock);
    }
    pthread_mutex_unlock(&w.lock);
    for (i = 0; i < n && status == KVF_OK; i++) {
        status = req[i].status;
    }
    if (status == KVF_OK) {
        *seconds_p = (double)(kvf_time_ns() - t0) / 1e9;
    }
    return status;
}

const kvf_transport_ops_t kvf_ucx_ops = {
    .name = "ucx",
    .available = kvf_ucx_available,
    .auto_select = kvf_ucx_auto_select,
    .iface_open = kvf_ucx_iface_open,
    .iface_close = kvf_ucx_iface_close,
    .iface_address = kvf_ucx_iface_address,
    .ep_open = kvf_ucx_ep_open,
    .ep_close = kvf_ucx_ep_close,
    .ep_post = kvf_ucx_ep_post,
    .ep_checksum = kvf_ucx_ep_checksum,
    .ep_link_test = kvf_ucx_ep_link_test,
    .mem_dereg = kvf_ucx_mem_dereg,
};
