/*
 * mem/cuda: batched copies of scattered blocks.
 *
 * A copy context owns a GPU's two streams, two descriptor buffers
 * (pinned, mapped: the kernels read them in place) and, for pageable host
 * memory, pinned staging slots. kvf_cuda_copy_blocks cuts a batch into a
 * few launches: the first small (512 descriptors) so the GPU starts while
 * the host prepares the next, then x4 up to 32768; blocks over 64 KiB
 * are split so no warp is left with a giant block. Launches alternate
 * between the two streams (one's tail overlaps the next one's start)
 * and the host fills one descriptor buffer while the other is in use.
 *
 * A block list in GPU memory (kvf_cuda_copy_blocks_dev) is read in place
 * too; the context's GPU moves every block of a batch, GPU->GPU included
 * (docs/decisions/gpu-block-copies.md). Pageable host memory is staged
 * (slot.c); the copy-engine baselines are in base.c.
 *
 * Bounds: the kernels refuse blocks outside either side (counted in a
 * mapped word read after the batch); the staging code checks the host
 * side itself.
 */
#include "mem/cuda/kern.h"
#include "core/alloc.h"
#include "core/checksum.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>

/* ---- contexts --------------------------------------------------------- */

kvf_status_t kvf_cuda_copy_create(int device, kvf_cuda_copy_t **cp_p)
{
    kvf_cuda_copy_t *cp;
    kvf_status_t status;
    int i;

    if (cp_p == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_cuda_use(device);
    if (status != KVF_OK) {
        return status;
    }
    cp = kvf_calloc(1, sizeof(*cp));
    if (cp == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    cp->device = device;
    cp->sm_count = kvf_cuda_devs[device].sm_count;
    cp->kernel = kvf_cuda_default_kernel();
    cp->res_mode = kvf_cuda_res_mode();
    status = KVF_CUDA_CHECK(
        cudaStreamCreateWithFlags(&cp->stream, cudaStreamNonBlocking));
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(
            cudaStreamCreateWithFlags(&cp->stream_b, cudaStreamNonBlocking));
    }
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(
            cudaEventCreateWithFlags(&cp->done, cudaEventDisableTiming));
    }
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(
            cudaHostAlloc((void **)&cp->err, 64,
                          cudaHostAllocPortable | cudaHostAllocMapped));
    }
    for (i = 0; i < 2 && status == KVF_OK; i++) {
        kvf_cuda_dbuf_t *b = &cp->dbuf[i];
        size_t bytes = KVF_COPY_DESC_CAP * sizeof(kvf_cuda_blk_t);

        status = KVF_CUDA_CHECK(
            cudaHostAlloc((void **)&b->h, bytes,
                          cudaHostAllocPortable | cudaHostAllocMapped));
        if (status == KVF_OK) {
            status = KVF_CUDA_CHECK(
                cudaEventCreateWithFlags(&b->ev, cudaEventDisableTiming));
        }
    }
    if (status != KVF_OK) {
        kvf_cuda_copy_destroy(cp);
        return status;
    }
    *cp_p = cp;
    return KVF_OK;
}

void kvf_cuda_copy_destroy(kvf_cuda_copy_t *cp)
{
    int i;

    if (cp == NULL) {
        return;
    }
    cudaSetDevice(cp->device);
    kvf_cuda_res_free(cp);
    if (cp->stream != NULL) {
        /* bounded: a copy never outlives its own deadline by much */
        if (cp->done != NULL &&
            cudaEventRecord(cp->done, cp->stream) == cudaSuccess) {
            kvf_cuda_event_wait(cp->done, kvf_time_ms() + 10000);
        }
        cudaStreamDestroy(cp->stream);
    }
    for (i = 0; i < 2; i++) {
        if (cp->dbuf[i].ev != NULL && cp->dbuf[i].busy) {
            kvf_cuda_event_wait(cp->dbuf[i].ev, kvf_time_ms() + 10000);
        }
    }
    if (cp->stream_b != NULL) {
        cudaStreamDestroy(cp->stream_b);
    }
    if (cp->done != NULL) {
        cudaEventDestroy(cp->done);
    }
    for (i = 0; i < 2; i++) {
        if (cp->dbuf[i].h != NULL) {
            cudaFreeHost(cp->dbuf[i].h);
        }
        if (cp->dbuf[i].ev != NULL) {
            cudaEventDestroy(cp->dbuf[i].ev);
        }
    }
    for (i = 0; i < KVF_COPY_STAGE_SLOTS; i++) {
        kvf_cuda_slot_fini(&cp->slot[i]);
        kvf_free(cp->slot_host[i]);
    }
    if (cp->ce_stream != NULL) {
        if (cp->ce_done != NULL &&
            cudaEventRecord(cp->ce_done, cp->ce_stream) == cudaSuccess) {
            kvf_cuda_event_wait(cp->ce_done, kvf_time_ms() + 10000);
        }
        cudaStreamDestroy(cp->ce_stream);
    }
    if (cp->ce_done != NULL) {
        cudaEventDestroy(cp->ce_done);
    }
    for (i = 0; i < KVF_CUDA_POSTS; i++) {
        if (cp->ce_posts[i] != NULL) {
            cudaEventDestroy(cp->ce_posts[i]);
        }
    }
    kvf_free(cp->ce_dst);
    kvf_free(cp->ce_src);
    kvf_free(cp->ce_len);
    kvf_cuda_sums_free(cp); /* after the waits: kernels store into it */
    if (cp->err != NULL) {
        cudaFreeHost(cp->err);
    }
    cudaGetLastError();
    kvf_free(cp);
}

void kvf_cuda_copy_set_kernel(kvf_cuda_copy_t *cp, kvf_cuda_kernel_t k)
{
    cp->kernel = k;
}

/* The kernel for a path when configuration says auto. */
static kvf_cuda_kernel_t kvf_cuda_pick(kvf_cuda_copy_t *cp,
                                       const kvf_cuda_mem_t *src,
                                       const kvf_cuda_mem_t *dst)
{
    if (cp->kernel != KVF_CUDA_KERNEL_AUTO) {
        return cp->kernel;
    }
    /* GPU -> pinned host writes go faster through the bulk copy engine;
     * everything else with warps (docs/decisions/mem-gpu-copy.md) */
    if (src->type == KVF_MEM_CUDA && dst->type == KVF_MEM_PINNED) {
        return KVF_CUDA_KERNEL_BULK;
    }
    return KVF_CUDA_KERNEL_WARP;
}

/* Is mem usable by kernels of the context's GPU? */
static kvf_status_t kvf_cuda_reach(kvf_cuda_copy_t *cp, const kvf_cuda_mem_t *m)
{
    if (m->base == NULL && m->len > 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    switch (m->type) {
    case KVF_MEM_HOST:
    case KVF_MEM_PINNED:
        return KVF_OK;
    case KVF_MEM_CUDA:
        if (m->device < 0 || m->device >= kvf_cuda_device_count()) {
            return KVF_ERR_INVALID_PARAM;
        }
        if (m->device != cp->device &&
            !kvf_cuda_peer_enable(cp->device, m->device)) {
            kvf_error("GPU %d cannot reach GPU %d's memory", cp->device,
                      m->device);
            return KVF_ERR_UNSUPPORTED;
        }
        return KVF_OK;
    default:
        return KVF_ERR_INVALID_PARAM;
    }
}

/* Launches n descriptors from d in pieces of up to KVF_CUDA_LAUNCH_MAX,
 * alternating the two streams and descriptor buffers. */
static kvf_status_t kvf_cuda_inplace_launch(kvf_cuda_copy_t *cp,
                                            kvf_cuda_kernel_t kern,
                                            kvf_cuda_launch_t *l,
                                            const kvf_cuda_blk_t *d, size_t n)
{
    kvf_status_t status = KVF_OK;
    size_t i, m;
    unsigned k;

    for (i = 0, k = 0; i < n && status == KVF_OK; i += m, k++) {
        kvf_cuda_dbuf_t *b = &cp->dbuf[k & 1];
        cudaStream_t stream = (k & 1) ? cp->stream_b : cp->stream;

        m = n - i < KVF_CUDA_LAUNCH_MAX ? n - i : KVF_CUDA_LAUNCH_MAX;
        l->blks = d + i;
        l->n = (unsigned)m;
        status = KVF_CUDA_CHECK(
            (cudaError_t)kvf_cuda_kern_launch(kern, l, cp->sm_count, stream));
        if (status == KVF_OK) {
            status = KVF_CUDA_CHECK(cudaEventRecord(b->ev, stream));
        }
        if (status == KVF_OK) {
            b->busy = 1;
        }
    }
    return status;
}

/* Waits for the busy descriptor buffers; then the first error, or
 * KVF_ERR_OUT_OF_BOUNDS when a kernel refused a block. */
static kvf_status_t kvf_cuda_inplace_wait(kvf_cuda_copy_t *cp,
                                          kvf_status_t status,
                                          uint64_t deadline)
{
    kvf_status_t w;
    unsigned k;

    for (k = 0; k < 2; k++) {
        if (cp->dbuf[k].busy) {
            w = kvf_cuda_event_wait(cp->dbuf[k].ev, deadline);
            status = (status == KVF_OK) ? w : status;
            if (w == KVF_OK) {
                cp->dbuf[k].busy = 0;
            }
        }
    }
    if (status == KVF_OK && *(volatile unsigned *)cp->err != 0) {
        kvf_log_rl(KVF_LOG_ERROR, "block(s) outside their memory refused");
        status = KVF_ERR_OUT_OF_BOUNDS;
    }
    return status;
}

/* The batch's own descriptor array is device-accessible: launches of up
 * to KVF_CUDA_LAUNCH_MAX descriptors read straight from it, alternating
 * streams. Blocks are not split (a large one just keeps its warp
 * longer). resident: the whole batch goes to the context's resident
 * kernel (res.c) instead, when it can take it. */
static kvf_status_t kvf_cuda_copy_inplace(kvf_cuda_copy_t *cp,
                                          kvf_cuda_kernel_t kern,
                                          kvf_cuda_launch_t *l,
                                          const void *dev_blks, size_t n,
                                          int resident, uint64_t deadline)
{
    const kvf_cuda_blk_t *d = dev_blks;
    kvf_status_t status = KVF_OK;

    if (resident && kern == KVF_CUDA_KERNEL_WARP) {
        status = kvf_cuda_res_copy(cp, l, d, n, deadline);
        if (status != KVF_ERR_UNSUPPORTED) {
            if (status == KVF_OK && *(volatile unsigned *)cp->err != 0) {
                kvf_log_rl(KVF_LOG_ERROR,
                           "block(s) outside their memory refused");
                status = KVF_ERR_OUT_OF_BOUNDS;
            }
            return status;
        }
        status = KVF_OK; /* not now: launches below */
    }
    status = kvf_cuda_inplace_launch(cp, kern, l, d, n);
    return kvf_cuda_inplace_wait(cp, status, deadline);
}

/* Does the context's resident kernel take this batch (cuda_resident)? */
static int kvf_cuda_res_wants(const kvf_cuda_copy_t *cp,
                              const kvf_cuda_mem_t *src,
                              const kvf_cuda_mem_t *dst)
{
    if (cp->res_mode == KVF_RES_ON) {
        return 1;
    }
    /* p2p (the default): GPU -> other GPU batches, where the launch is
     * most of what a batch pays beyond the copy engine's fixed cost.
     * Other paths gain less than the resident grid costs (2 CTAs per SM
     * held for cuda_resident_idle_us after each batch), so they keep
     * launches unless cuda_resident = on (docs/decisions/mem-gpu-copy.md). */
    return cp->res_mode == KVF_RES_P2P && src->type == KVF_MEM_CUDA &&
           dst->type == KVF_MEM_CUDA && src->device != dst->device;
}

/* A walk over a batch's blocks, cutting large ones into pieces of
 * KVF_CUDA_SPLIT; every stride-th block (stride > 0) is left out (the
 * copy engines take it). */
typedef struct kvf_cuda_walk {
    const kvf_cuda_blk_t *blks;
    size_t n;
    size_t i;           /* next block */
    uint64_t piece_off; /* bytes of block i already cut */
    size_t stride;
    uint64_t src_len, dst_len;
} kvf_cuda_walk_t;

/* Fills h with up to about chunk descriptors from the walk; returns how
 * many. */
static unsigned kvf_cuda_walk_fill(kvf_cuda_walk_t *w, kvf_cuda_blk_t *h,
                                   unsigned chunk)
{
    unsigned m = 0;

    while (w->i < w->n && m < chunk) {
        const kvf_cuda_blk_t *s = &w->blks[w->i];

        if (w->stride && w->i % w->stride == 0) {
            w->i++; /* on the copy engines */
            continue;
        }
        if (s->len <= KVF_CUDA_SPLIT ||
            !kvf_cuda_blk_in(s->src_off, s->len, w->src_len) ||
            !kvf_cuda_blk_in(s->dst_off, s->len, w->dst_len)) {
            h[m++] = *s; /* the kernel refuses it if out of bounds */
            w->i++;
            continue;
        }
        /* split a large block; it may continue in the next launch */
        while (w->piece_off < s->len && m < KVF_COPY_DESC_CAP) {
            uint64_t left = s->len - w->piece_off;

            h[m].src_off = s->src_off + w->piece_off;
            h[m].dst_off = s->dst_off + w->piece_off;
            h[m].len = left < KVF_CUDA_SPLIT ? left : KVF_CUDA_SPLIT;
            w->piece_off += h[m].len;
            m++;
        }
        if (w->piece_off < s->len) {
            break;
        }
        w->piece_off = 0;
        w->i++;
    }
    return m;
}

/* Descriptors already in pinned memory are read in place: no host work
 * per block, the whole batch launched at once. KVF_INPROGRESS when blks
 * is not mapped pinned memory (the caller copies descriptors). */
static kvf_status_t
kvf_cuda_direct_mapped(kvf_cuda_copy_t *cp, kvf_cuda_kernel_t kern,
                       kvf_cuda_launch_t *l, const kvf_cuda_mem_t *src,
                       const kvf_cuda_mem_t *dst, const kvf_cuda_blk_t *blks,
                       size_t n, uint64_t deadline)
{
    struct cudaPointerAttributes a;

    if (cudaPointerGetAttributes(&a, blks) != cudaSuccess ||
        a.type != cudaMemoryTypeHost || a.devicePointer == NULL) {
        cudaGetLastError();
        return KVF_INPROGRESS;
    }
    return kvf_cuda_copy_inplace(cp, kern, l, a.devicePointer, n,
                                 kvf_cuda_res_wants(cp, src, dst), deadline);
}

/* Waits for both streams (launches alternate so that one's tail overlaps
 * the next one's start) and the copy engines' share (stride > 0). */
static kvf_status_t kvf_cuda_direct_wait(kvf_cuda_copy_t *cp,
                                         kvf_status_t status, size_t stride,
                                         kvf_status_t ce, uint64_t deadline)
{
    kvf_status_t w;
    unsigned k;

    for (k = 0; k < 2 && status == KVF_OK; k++) {
        if (cp->dbuf[k].busy) {
            status = kvf_cuda_event_wait(cp->dbuf[k].ev, deadline);
        }
    }
    if (stride) {
        w = kvf_cuda_event_wait(cp->ce_done, deadline);
        if (status == KVF_OK) {
            status = (w != KVF_OK) ? w : ce;
        }
    }
    if (status == KVF_OK) {
        cp->dbuf[0].busy = cp->dbuf[1].busy = 0;
        if (*(volatile unsigned *)cp->err != 0) {
            kvf_log_rl(KVF_LOG_ERROR, "block(s) outside their memory "
                                      "refused");
            status = KVF_ERR_OUT_OF_BOUNDS;
        }
    }
    return status;
}

/* Launches the walk's descriptors in growing pieces (KVF_CUDA_LAUNCH_MIN,
 * x4 each time up to KVF_CUDA_LAUNCH_MAX) on alternating streams. */
static kvf_status_t kvf_cuda_direct_launch(kvf_cuda_copy_t *cp,
                                           kvf_cuda_kernel_t kern,
                                           kvf_cuda_launch_t *l,
                                           kvf_cuda_walk_t *w,
                                           uint64_t deadline)
{
    unsigned chunk = KVF_CUDA_LAUNCH_MIN, k = 0;
    kvf_status_t status = KVF_OK;

    while (w->i < w->n && status == KVF_OK) {
        kvf_cuda_dbuf_t *b = &cp->dbuf[k & 1];
        cudaStream_t stream = (k & 1) ? cp->stream_b : cp->stream;

        if (b->busy) {
            status = kvf_cuda_event_wait(b->ev, deadline);
            if (status != KVF_OK) {
                break;
            }
            b->busy = 0;
        }
        l->n = kvf_cuda_walk_fill(w, b->h, chunk);
        /* the kernel reads the descriptors through the host mapping, each
         * warp prefetching its next */
        l->blks = b->h;
        status = KVF_CUDA_CHECK(
            (cudaError_t)kvf_cuda_kern_launch(kern, l, cp->sm_count, stream));
        if (status == KVF_OK) {
            status = KVF_CUDA_CHECK(cudaEventRecord(b->ev, stream));
        }
        if (status == KVF_OK) {
            b->busy = 1;
        }
        k++;
        chunk =
            chunk * 4 < KVF_CUDA_LAUNCH_MAX ? chunk * 4 : KVF_CUDA_LAUNCH_MAX;
    }
    return status;
}

/* Both sides device-accessible: descriptor buffers, a few launches. */
static kvf_status_t kvf_cuda_copy_direct(kvf_cuda_copy_t *cp,
                                         const kvf_cuda_mem_t *src,
                                         const kvf_cuda_mem_t *dst,
                                         const kvf_cuda_blk_t *blks, size_t n,
                                         uint64_t deadline)
{
    kvf_cuda_kernel_t kern = kvf_cuda_pick(cp, src, dst);
    kvf_status_t status, ce = KVF_OK;
    kvf_cuda_launch_t l;
    kvf_cuda_walk_t w;

    *(volatile unsigned *)cp->err = 0;
    memset(&l, 0, sizeof(l));
    l.src_base = (uint64_t)(uintptr_t)src->base;
    l.src_len = src->len;
    l.dst_base = (uint64_t)(uintptr_t)dst->base;
    l.dst_len = dst->len;
    l.err = cp->err;
    memset(&w, 0, sizeof(w));
    w.blks = blks;
    w.n = n;
    w.src_len = src->len;
    w.dst_len = dst->len;
    if (kern != KVF_CUDA_KERNEL_HYBRID) {
        status =
            kvf_cuda_direct_mapped(cp, kern, &l, src, dst, blks, n, deadline);
        if (status != KVF_INPROGRESS) {
            return status;
        }
    } else {
        /* the copy engines take every 4th block, the kernel the rest */
        w.stride = 4;
        kern = KVF_CUDA_KERNEL_WARP;
        ce = kvf_cuda_ce_post(cp, src, dst, blks, n, 0, w.stride);
        if (ce != KVF_OK && ce != KVF_ERR_OUT_OF_BOUNDS) {
            return ce;
        }
    }
    status = kvf_cuda_direct_launch(cp, kern, &l, &w, deadline);
    return kvf_cuda_direct_wait(cp, status, w.stride, ce, deadline);
}

kvf_status_t kvf_cuda_copy_blocks(kvf_cuda_copy_t *cp,
                                  const kvf_cuda_mem_t *src,
                                  const kvf_cuda_mem_t *dst,
                                  const kvf_cuda_blk_t *blks, size_t n,
                                  int timeout_ms)
{
    uint64_t deadline =
        kvf_time_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    kvf_status_t status, first = KVF_OK;
    size_t i;

    if (cp == NULL || src == NULL || dst == NULL || (n > 0 && blks == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_cuda_reach(cp, src);
    if (status == KVF_OK) {
        status = kvf_cuda_reach(cp, dst);
    }
    if (status != KVF_OK || n == 0) {
        return status;
    }
    if (src->type == KVF_MEM_HOST && dst->type == KVF_MEM_HOST) {
        for (i = 0; i < n; i++) {
            if (!kvf_cuda_blk_in(blks[i].src_off, blks[i].len, src->len) ||
                !kvf_cuda_blk_in(blks[i].dst_off, blks[i].len, dst->len)) {
                first = KVF_ERR_OUT_OF_BOUNDS;
                continue;
            }
            memcpy((char *)dst->base + blks[i].dst_off,
                   (const char *)src->base + blks[i].src_off, blks[i].len);
        }
        return first;
    }
    status = KVF_CUDA_CHECK(cudaSetDevice(cp->device));
    if (status != KVF_OK) {
        return status;
    }
    if (src->type == KVF_MEM_HOST || dst->type == KVF_MEM_HOST) {
        return kvf_cuda_copy_staged(cp, src, dst, blks, n, deadline);
    }
    return kvf_cuda_copy_direct(cp, src, dst, blks, n, deadline);
}

kvf_status_t kvf_cuda_copy_blocks_dev(kvf_cuda_copy_t *cp,
                                      const kvf_cuda_mem_t *src,
                                      const kvf_cuda_mem_t *dst,
                                      const kvf_cuda_blk_t *dev_blks, size_t n,
                                      int timeout_ms)
{
    uint64_t deadline =
        kvf_time_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    struct cudaPointerAttributes a;
    kvf_cuda_launch_t l;
    kvf_cuda_kernel_t kern;
    kvf_status_t status;

    if (cp == NULL || src == NULL || dst == NULL ||
        (n > 0 && dev_blks == NULL) || src->type == KVF_MEM_HOST ||
        dst->type == KVF_MEM_HOST) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_cuda_reach(cp, src);
    if (status == KVF_OK) {
        status = kvf_cuda_reach(cp, dst);
    }
    if (status != KVF_OK || n == 0) {
        return status;
    }
    /* the list must be GPU memory this GPU reads */
    if (cudaPointerGetAttributes(&a, dev_blks) != cudaSuccess ||
        a.type != cudaMemoryTypeDevice ||
        (a.device != cp->device &&
         !kvf_cuda_peer_enable(cp->device, a.device))) {
        cudaGetLastError();
        return KVF_ERR_INVALID_PARAM;
    }
    kern = kvf_cuda_pick(cp, src, dst);
    if (kern == KVF_CUDA_KERNEL_HYBRID) {
        kern = KVF_CUDA_KERNEL_WARP;
    }
    *(volatile unsigned *)cp->err = 0;
    memset(&l, 0, sizeof(l));
    l.src_base = (uint64_t)(uintptr_t)src->base;
    l.src_len = src->len;
    l.dst_base = (uint64_t)(uintptr_t)dst->base;
    l.dst_len = dst->len;
    l.err = cp->err;
    status = KVF_CUDA_CHECK(cudaSetDevice(cp->device));
    if (status != KVF_OK) {
        return status;
    }
    return kvf_cuda_copy_inplace(cp, kern, &l, dev_blks, n,
                                 kvf_cuda_res_wants(cp, src, dst), deadline);
}
