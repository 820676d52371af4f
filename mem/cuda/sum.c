/*
 * mem/cuda: copies that checksum what they move. kvf_cuda_copy_sum runs
 * the checksumming warp kernel (kern.cu) over a batch: each block is
 * copied and its kvf_checksum() computed from the same loads, so
 * verifying a load costs no second pass over the bytes and no trip of
 * the bytes to the host. Without a destination the same kernel only
 * checksums ranges in place (GPU memory hashed where it lies). Or, per
 * mode, the batch goes through the tuned copy path and the side in GPU
 * memory is checksummed by that read-only pass afterwards (a second
 * read, but of HBM, tens of times faster than the link).
 *
 * The batch's descriptors go through the context's two pinned descriptor
 * buffers, in launches of up to KVF_CUDA_LAUNCH_MAX on alternating
 * streams like kvf_cuda_copy_blocks, but blocks are never split: one
 * warp hashes a block from start to end. The checksums land in a pinned,
 * mapped array of the context (one store per block, no atomics).
 */
#include "mem/cuda/kern.h"
#include "core/alloc.h"
#include "core/checksum.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>

/* Sides the kernels reach without staging. */
static kvf_status_t kvf_cuda_sum_side(kvf_cuda_copy_t *cp,
                                      const kvf_cuda_mem_t *m)
{
    if (m->base == NULL && m->len > 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (m->type == KVF_MEM_PINNED) {
        return KVF_OK;
    }
    if (m->type != KVF_MEM_CUDA) {
        return KVF_ERR_UNSUPPORTED; /* pageable: the caller stages */
    }
    if (m->device < 0 || m->device >= kvf_cuda_device_count()) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (m->device != cp->device &&
        !kvf_cuda_peer_enable(cp->device, m->device)) {
        kvf_error("GPU %d cannot reach GPU %d's memory", cp->device, m->device);
        return KVF_ERR_UNSUPPORTED;
    }
    return KVF_OK;
}

/* Room for n checksums in the context's mapped array. */
static kvf_status_t kvf_cuda_sums_room(kvf_cuda_copy_t *cp, size_t n)
{
    size_t cap = cp->sums_cap ? cp->sums_cap : 4096;
    kvf_status_t status;
    void *p = NULL;

    if (n <= cp->sums_cap) {
        return KVF_OK;
    }
    while (cap < n) {
        cap *= 2;
    }
    status = KVF_CUDA_CHECK(
        cudaHostAlloc(&p, cap * sizeof(uint64_t),
                      cudaHostAllocPortable | cudaHostAllocMapped));
    if (status != KVF_OK) {
        return status;
    }
    if (cp->sums != NULL) {
        cudaFreeHost(cp->sums);
    }
    cp->sums = p;
    cp->sums_cap = cap;
    return KVF_OK;
}

/* Launches the batch in pieces, the descriptors copied into the
 * context's descriptor buffers (alternating, each reused once its last
 * launch is done). */
static kvf_status_t kvf_cuda_sum_launch(kvf_cuda_copy_t *cp,
                                        kvf_cuda_launch_t *l,
                                        const kvf_cuda_blk_t *blks, size_t n,
                                        int store, int tail_dst,
                                        uint64_t deadline)
{
    kvf_status_t status = KVF_OK;
    size_t i, m;
    unsigned k;

    for (i = 0, k = 0; i < n && status == KVF_OK; i += m, k++) {
        kvf_cuda_dbuf_t *b = &cp->dbuf[k & 1];
        cudaStream_t stream = (k & 1) ? cp->stream_b : cp->stream;

        m = n - i < KVF_CUDA_LAUNCH_MAX ? n - i : KVF_CUDA_LAUNCH_MAX;
        if (b->busy) {
            status = kvf_cuda_event_wait(b->ev, deadline);
            if (status != KVF_OK) {
                break;
            }
            b->busy = 0;
        }
        memcpy(b->h, blks + i, m * sizeof(*blks));
        l->blks = b->h;
        l->n = (unsigned)m;
        status = KVF_CUDA_CHECK((cudaError_t)kvf_cuda_kern_sum_launch(
            l, cp->sums + i, store, tail_dst, cp->sm_count, stream));
        if (status == KVF_OK) {
            status = KVF_CUDA_CHECK(cudaEventRecord(b->ev, stream));
        }
        if (status == KVF_OK) {
            b->busy = 1;
        }
    }
    return status;
}

/* KVF_CUDA_SUM_AFTER / _ENGINES: the batch through the tuned copy path
 * or the copy engines, then the checksums of the side in GPU memory by a
 * read-only pass there. */
static kvf_status_t
kvf_cuda_copy_then_sum(kvf_cuda_copy_t *cp, const kvf_cuda_mem_t *src,
                       const kvf_cuda_mem_t *dst, const kvf_cuda_blk_t *blks,
                       size_t n, uint64_t *sums, int engines, int timeout_ms)
{
    int on_src = src->type == KVF_MEM_CUDA;
    kvf_cuda_blk_t *h;
    kvf_status_t status;
    size_t i;

    status = engines ? kvf_cuda_copy_engines(cp, src, dst, blks, n, timeout_ms)
                     : kvf_cuda_copy_blocks(cp, src, dst, blks, n, timeout_ms);
    if (status == KVF_ERR_OUT_OF_BOUNDS) {
        /* error path: the fused kernel says which blocks (sum 0) */
        return kvf_cuda_copy_sum(cp, src, dst, blks, n, sums,
                                 KVF_CUDA_SUM_FUSED, timeout_ms);
    }
    if (status != KVF_OK) {
        return status;
    }
    h = kvf_malloc((n + 1) * sizeof(*h));
    if (h == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0; i < n; i++) {
        h[i].src_off = on_src ? blks[i].src_off : blks[i].dst_off;
        h[i].dst_off = 0;
        h[i].len = blks[i].len;
    }
    status = kvf_cuda_copy_sum(cp, on_src ? src : dst, NULL, h, n, sums,
                               KVF_CUDA_SUM_FUSED, timeout_ms);
    kvf_free(h);
    return status;
}

/* The mode auto stands for: GPU -> host copies keep the tuned kernels
 * (the bulk engine writes pinned memory faster) and checksum the source
 * where it lies, in GPU memory; everything else is fused. */
static int kvf_cuda_sum_mode(int mode, const kvf_cuda_mem_t *src,
                             const kvf_cuda_mem_t *dst)
{
    if (dst == NULL ||
        (src->type != KVF_MEM_CUDA && dst->type != KVF_MEM_CUDA)) {
        return KVF_CUDA_SUM_FUSED;
    }
    if (mode == KVF_CUDA_SUM_AUTO) {
        return src->type == KVF_MEM_CUDA && dst->type == KVF_MEM_PINNED
                   ? KVF_CUDA_SUM_AFTER
                   : KVF_CUDA_SUM_FUSED;
    }
    return mode;
}

/* kvf_cuda_copy_blocks' wait: both descriptor buffers (the first error
 * kept: status, then the waits'). */
static kvf_status_t kvf_cuda_sum_wait(kvf_cuda_copy_t *cp, kvf_status_t status,
                                      uint64_t deadline)
{
    unsigned k;

    for (k = 0; k < 2; k++) {
        if (cp->dbuf[k].busy) {
            kvf_status_t w = kvf_cuda_event_wait(cp->dbuf[k].ev, deadline);

            status = status == KVF_OK ? w : status;
            if (w == KVF_OK) {
                cp->dbuf[k].busy = 0;
            }
        }
    }
    return status;
}

kvf_status_t kvf_cuda_copy_sum(kvf_cuda_copy_t *cp, const kvf_cuda_mem_t *src,
                               const kvf_cuda_mem_t *dst,
                               const kvf_cuda_blk_t *blks, size_t n,
                               uint64_t *sums, int mode, int timeout_ms)
{
    uint64_t deadline =
        kvf_time_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    kvf_status_t status;
    kvf_cuda_launch_t l;
    int tail_dst;

    if (cp == NULL || src == NULL ||
        (n > 0 && (blks == NULL || sums == NULL))) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_cuda_sum_side(cp, src);
    if (status == KVF_OK && dst != NULL) {
        status = kvf_cuda_sum_side(cp, dst);
    }
    if (status != KVF_OK || n == 0) {
        return status;
    }
    mode = kvf_cuda_sum_mode(mode, src, dst);
    if (mode == KVF_CUDA_SUM_AFTER || mode == KVF_CUDA_SUM_ENGINES) {
        return kvf_cuda_copy_then_sum(cp, src, dst, blks, n, sums,
                                      mode == KVF_CUDA_SUM_ENGINES, timeout_ms);
    }
    status = KVF_CUDA_CHECK(cudaSetDevice(cp->device));
    if (status == KVF_OK) {
        status = kvf_cuda_sums_room(cp, n);
    }
    if (status != KVF_OK) {
        return status;
    }
    memset(&l, 0, sizeof(l));
    l.src_base = (uint64_t)(uintptr_t)src->base;
    l.src_len = src->len;
    l.dst_base = dst != NULL ? (uint64_t)(uintptr_t)dst->base : 0;
    l.dst_len = dst != NULL ? dst->len : UINT64_MAX;
    l.err = cp->err;
    /* re-read a block's tail from whichever side is in GPU memory */
    tail_dst = dst != NULL && dst->type == KVF_MEM_CUDA;
    *(volatile unsigned *)cp->err = 0;
    status =
        kvf_cuda_sum_launch(cp, &l, blks, n, dst != NULL, tail_dst, deadline);
    status = kvf_cuda_sum_wait(cp, status, deadline);
    if (status == KVF_OK && *(volatile unsigned *)cp->err != 0) {
        kvf_log_rl(KVF_LOG_ERROR, "block(s) outside their memory refused");
        status = KVF_ERR_OUT_OF_BOUNDS;
    }
    if (status == KVF_OK || status == KVF_ERR_OUT_OF_BOUNDS) {
        memcpy(sums, cp->sums, n * sizeof(*sums));
    }
    return status;
}

kvf_status_t kvf_cuda_sum_blocks(kvf_cuda_copy_t *cp, const kvf_cuda_mem_t *mem,
                                 const uint64_t *offs, const uint64_t *lens,
                                 size_t n, uint64_t *sums, int timeout_ms)
{
    kvf_cuda_blk_t *blks;
    kvf_status_t status;
    size_t i;

    blks = kvf_malloc((n + 1) * sizeof(*blks));
    if (blks == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0; i < n; i++) {
        blks[i].src_off = offs[i];
        blks[i].dst_off = 0;
        blks[i].len = lens[i];
    }
    status = kvf_cuda_copy_sum(cp, mem, NULL, blks, n, sums, KVF_CUDA_SUM_FUSED,
                               timeout_ms);
    kvf_free(blks);
    return status;
}

void kvf_cuda_sums_free(kvf_cuda_copy_t *cp)
{
    if (cp->sums != NULL) {
        cudaFreeHost(cp->sums);
        cp->sums = NULL;
        cp->sums_cap = 0;
    }
}
