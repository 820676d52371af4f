/*
 * mem/cuda: copies through the copy engines (cudaMemcpyBatchAsync, also
 * the copy-engine share of the hybrid kernel variant), a copy context's
 * stream for benches that measure other copies against the kernels, and
 * checksums of GPU ranges.
 */
#include "mem/cuda/kern.h"
#include "core/alloc.h"
#include "core/checksum.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>

/*
 * Posts blocks first, first+stride, ... as one cudaMemcpyBatchAsync on
 * the copy-engine stream (created on first use) and records ce_done.
 * Out-of-bounds blocks are left out and make it return
 * KVF_ERR_OUT_OF_BOUNDS after posting the others.
 */
kvf_status_t kvf_cuda_ce_post(kvf_cuda_copy_t *cp, const kvf_cuda_mem_t *src,
                              const kvf_cuda_mem_t *dst,
                              const kvf_cuda_blk_t *blks, size_t n,
                              size_t first, size_t stride)
{
    struct cudaMemcpyAttributes attr;
    kvf_status_t status = KVF_OK, oob = KVF_OK;
    size_t i, m = 0, attr_idx = 0, need = n / stride + 2;

    if (cp->ce_stream == NULL) {
        status = KVF_CUDA_CHECK(
            cudaStreamCreateWithFlags(&cp->ce_stream, cudaStreamNonBlocking));
        if (status == KVF_OK) {
            status = KVF_CUDA_CHECK(
                cudaEventCreateWithFlags(&cp->ce_done, cudaEventDisableTiming));
        }
        if (status != KVF_OK) {
            return status;
        }
    }
    if (need > cp->ce_cap) {
        kvf_free(cp->ce_dst);
        kvf_free(cp->ce_src);
        kvf_free(cp->ce_len);
        cp->ce_dst = kvf_malloc(need * sizeof(*cp->ce_dst));
        cp->ce_src = kvf_malloc(need * sizeof(*cp->ce_src));
        cp->ce_len = kvf_malloc(need * sizeof(*cp->ce_len));
        cp->ce_cap = need;
        if (cp->ce_dst == NULL || cp->ce_src == NULL || cp->ce_len == NULL) {
            cp->ce_cap = 0;
            return KVF_ERR_NO_MEMORY;
        }
    }
    for (i = first; i < n; i += stride) {
        if (!kvf_cuda_blk_in(blks[i].src_off, blks[i].len, src->len) ||
            !kvf_cuda_blk_in(blks[i].dst_off, blks[i].len, dst->len)) {
            oob = KVF_ERR_OUT_OF_BOUNDS;
            continue;
        }
        if (blks[i].len == 0) {
            continue;
        }
        cp->ce_dst[m] = (char *)dst->base + blks[i].dst_off;
        cp->ce_src[m] = (const char *)src->base + blks[i].src_off;
        cp->ce_len[m] = blks[i].len;
        m++;
    }
    memset(&attr, 0, sizeof(attr));
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    if (m > 0) {
        status = KVF_CUDA_CHECK(
            cudaMemcpyBatchAsync(cp->ce_dst, cp->ce_src, cp->ce_len, m, &attr,
                                 &attr_idx, 1, cp->ce_stream));
    }
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(cudaEventRecord(cp->ce_done, cp->ce_stream));
    }
    return status != KVF_OK ? status : oob;
}

kvf_status_t kvf_cuda_copy_engines(kvf_cuda_copy_t *cp,
                                   const kvf_cuda_mem_t *src,
                                   const kvf_cuda_mem_t *dst,
                                   const kvf_cuda_blk_t *blks, size_t n,
                                   int timeout_ms)
{
    kvf_status_t status, w;

    if (cp == NULL || src == NULL || dst == NULL || (n > 0 && blks == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = KVF_CUDA_CHECK(cudaSetDevice(cp->device));
    if (status == KVF_OK) {
        status = kvf_cuda_ce_post(cp, src, dst, blks, n, 0, 1);
    }
    if (cp->ce_done != NULL && status != KVF_ERR_NO_MEMORY) {
        w = kvf_cuda_event_wait(cp->ce_done,
                                kvf_time_ms() + (uint64_t)timeout_ms);
        if (status == KVF_OK) {
            status = w;
        }
    }
    return status;
}

/* Every block in bounds of both sides (nothing is posted otherwise). */
static int kvf_cuda_blks_in(const kvf_cuda_mem_t *src,
                            const kvf_cuda_mem_t *dst,
                            const kvf_cuda_blk_t *blks, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        if (!kvf_cuda_blk_in(blks[i].src_off, blks[i].len, src->len) ||
            !kvf_cuda_blk_in(blks[i].dst_off, blks[i].len, dst->len)) {
            return 0;
        }
    }
    return 1;
}

kvf_status_t kvf_cuda_ce_post_ticket(kvf_cuda_copy_t *cp,
                                     const kvf_cuda_mem_t *src,
                                     const kvf_cuda_mem_t *dst,
                                     const kvf_cuda_blk_t *blks, size_t n,
                                     uint64_t *ticket_p)
{
    cudaEvent_t *ev;
    kvf_status_t status;

    if (cp == NULL || src == NULL || dst == NULL || ticket_p == NULL ||
        (n > 0 && blks == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (!kvf_cuda_blks_in(src, dst, blks, n)) {
        return KVF_ERR_OUT_OF_BOUNDS;
    }
    status = KVF_CUDA_CHECK(cudaSetDevice(cp->device));
    ev = &cp->ce_posts[cp->ce_next % KVF_CUDA_POSTS];
    if (status == KVF_OK && *ev == NULL) {
        status = KVF_CUDA_CHECK(
            cudaEventCreateWithFlags(ev, cudaEventDisableTiming));
    }
    if (status == KVF_OK) {
        status = kvf_cuda_ce_post(cp, src, dst, blks, n, 0, 1);
    }
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(cudaEventRecord(*ev, cp->ce_stream));
    }
    if (status == KVF_OK) {
        *ticket_p = cp->ce_next++;
    }
    return status;
}

kvf_status_t kvf_cuda_ce_wait_ticket(kvf_cuda_copy_t *cp, uint64_t ticket,
                                     int timeout_ms)
{
    cudaEvent_t ev;
    cudaError_t e;

    if (cp == NULL || ticket >= cp->ce_next) {
        return KVF_ERR_INVALID_PARAM;
    }
    /* a ticket's event may since mark a later post: waiting for that one
     * covers it too (one stream, posts in order) */
    ev = cp->ce_posts[ticket % KVF_CUDA_POSTS];
    if (timeout_ms == 0) { /* asked once */
        e = cudaEventQuery(ev);
        return e == cudaErrorNotReady ? KVF_ERR_TIMEOUT : KVF_CUDA_CHECK(e);
    }
    return kvf_cuda_event_wait(ev, kvf_time_ms() + (uint64_t)timeout_ms);
}

int kvf_cuda_copy_device(const kvf_cuda_copy_t *cp)
{
    return cp->device;
}

void *kvf_cuda_copy_stream(kvf_cuda_copy_t *cp)
{
    return cp->stream;
}

kvf_status_t kvf_cuda_copy_sync(kvf_cuda_copy_t *cp, int timeout_ms)
{
    kvf_status_t status;

    status = KVF_CUDA_CHECK(cudaSetDevice(cp->device));
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(cudaEventRecord(cp->done, cp->stream));
    }
    if (status == KVF_OK) {
        status =
            kvf_cuda_event_wait(cp->done, kvf_time_ms() + (uint64_t)timeout_ms);
    }
    return status;
}

kvf_status_t kvf_cuda_checksum_blocks(kvf_cuda_copy_t *cp,
                                      const kvf_cuda_mem_t *mem,
                                      const uint64_t *offs,
                                      const uint64_t *lens, size_t n,
                                      uint64_t *sums, int timeout_ms)
{
    kvf_cuda_blk_t *blks = NULL;
    kvf_cuda_mem_t host;
    kvf_status_t status;
    uint64_t total = 0, at;
    char *buf = NULL;
    size_t i;

    if (cp == NULL || mem == NULL ||
        (n > 0 && (offs == NULL || lens == NULL || sums == NULL))) {
        return KVF_ERR_INVALID_PARAM;
    }
    for (i = 0; i < n; i++) {
        if (!kvf_cuda_blk_in(offs[i], lens[i], mem->len)) {
            return KVF_ERR_OUT_OF_BOUNDS;
        }
        total += lens[i];
    }
    if (mem->type != KVF_MEM_CUDA) {
        for (i = 0; i < n; i++) {
            sums[i] = kvf_hash64((const char *)mem->base + offs[i], lens[i], 0);
        }
        return KVF_OK;
    }
    /* on the GPU, where the bytes are: no trip to the host */
    status = kvf_cuda_sum_blocks(cp, mem, offs, lens, n, sums, timeout_ms);
    if (status != KVF_ERR_UNSUPPORTED) {
        return status;
    }
    blks = kvf_malloc((n + 1) * sizeof(*blks));
    buf = kvf_malloc(total + 1);
    if (blks == NULL || buf == NULL) {
        kvf_free(blks);
        kvf_free(buf);
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0, at = 0; i < n; i++) {
        blks[i].src_off = offs[i];
        blks[i].dst_off = at;
        blks[i].len = lens[i];
        at += lens[i];
    }
    host.base = buf;
    host.len = total;
    host.type = KVF_MEM_HOST;
    host.device = -1;
    status = kvf_cuda_copy_blocks(cp, mem, &host, blks, n, timeout_ms);
    for (i = 0; i < n && status == KVF_OK; i++) {
        sums[i] = kvf_hash64(buf + blks[i].dst_off, lens[i], 0);
    }
    kvf_free(blks);
    kvf_free(buf);
    return status;
}
