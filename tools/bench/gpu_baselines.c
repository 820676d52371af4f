/*
 * GPU benches: the copies kvferry's kernels are measured against, on a
 * stream of their own on the copier's GPU: one contiguous
 * cudaMemcpyAsync (or cudaMemcpyPeerAsync across GPUs) of the same
 * bytes, one cudaMemcpyAsync per block, and cudaMemcpyBatchAsync (the
 * library's copy-engine path). These call the CUDA runtime directly;
 * without CUDA they answer KVF_ERR_UNAVAILABLE.
 */
#include "tools/bench/gpu.h"

#ifdef KVF_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <sched.h>

#include "core/time.h"

#define KVF_BASE_DEV_MAX 64

/* One stream per GPU, created on first use and kept for the process. */
static cudaStream_t kvf_base_stream[KVF_BASE_DEV_MAX];
static cudaEvent_t kvf_base_done[KVF_BASE_DEV_MAX];

static int kvf_base_in(uint64_t off, uint64_t len, uint64_t side)
{
    return off <= side && len <= side - off;
}

static kvf_status_t kvf_base_check(cudaError_t err)
{
    return err == cudaSuccess ? KVF_OK : KVF_ERR_IO;
}

/* Makes the copier's GPU current and returns its baseline stream. */
static kvf_status_t kvf_base_use(kvf_gpu_copier_t *cp, int *dev_p,
                                 cudaStream_t *stream_p)
{
    int dev = kvf_gpu_copier_device(cp);
    kvf_status_t status;

    if (dev < 0 || dev >= KVF_BASE_DEV_MAX) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_base_check(cudaSetDevice(dev));
    if (status == KVF_OK && kvf_base_stream[dev] == NULL) {
        status = kvf_base_check(cudaStreamCreateWithFlags(
            &kvf_base_stream[dev], cudaStreamNonBlocking));
        if (status == KVF_OK) {
            status = kvf_base_check(cudaEventCreateWithFlags(
                &kvf_base_done[dev], cudaEventDisableTiming));
        }
    }
    *dev_p = dev;
    *stream_p = kvf_base_stream[dev];
    return status;
}

/* Waits (at most timeout_ms) for the work posted on dev's stream. */
static kvf_status_t kvf_base_sync(int dev, int timeout_ms)
{
    uint64_t end = kvf_time_ns() +
                   (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull;
    cudaError_t err = cudaEventRecord(kvf_base_done[dev], kvf_base_stream[dev]);

    while (err == cudaSuccess) {
        err = cudaEventQuery(kvf_base_done[dev]);
        if (err == cudaErrorNotReady) {
            if (kvf_time_ns() > end) {
                return KVF_ERR_TIMEOUT;
            }
            sched_yield();
            err = cudaSuccess;
            continue;
        }
        break;
    }
    return kvf_base_check(err);
}

/* Peer access both ways (already enabled is fine). */
static void kvf_base_peer(int a, int b)
{
    int can = 0;

    if (cudaDeviceCanAccessPeer(&can, a, b) == cudaSuccess && can &&
        cudaSetDevice(a) == cudaSuccess &&
        cudaDeviceEnablePeerAccess(b, 0) != cudaSuccess) {
        cudaGetLastError(); /* cudaErrorPeerAccessAlreadyEnabled */
    }
}

kvf_status_t kvf_gpu_base_contig(kvf_gpu_copier_t *cp, const kvf_gpu_mem_t *src,
                                 uint64_t src_off, const kvf_gpu_mem_t *dst,
                                 uint64_t dst_off, uint64_t len, int timeout_ms)
{
    cudaStream_t stream;
    kvf_status_t status;
    const char *s;
    char *d;
    int dev;

    if (cp == NULL || src == NULL || dst == NULL ||
        !kvf_base_in(src_off, len, src->len) ||
        !kvf_base_in(dst_off, len, dst->len)) {
        return KVF_ERR_INVALID_PARAM;
    }
    s = (const char *)src->base + src_off;
    d = (char *)dst->base + dst_off;
    status = kvf_base_use(cp, &dev, &stream);
    if (status != KVF_OK) {
        return status;
    }
    if (src->type == KVF_MEM_CUDA && dst->type == KVF_MEM_CUDA &&
        src->device != dst->device) {
        kvf_base_peer(src->device, dst->device);
        kvf_base_peer(dst->device, src->device);
        cudaSetDevice(dev);
        status = kvf_base_check(
            cudaMemcpyPeerAsync(d, dst->device, s, src->device, len, stream));
    } else {
        status = kvf_base_check(
            cudaMemcpyAsync(d, s, len, cudaMemcpyDefault, stream));
    }
    return status == KVF_OK ? kvf_base_sync(dev, timeout_ms) : status;
}

kvf_status_t kvf_gpu_base_each(kvf_gpu_copier_t *cp, const kvf_gpu_mem_t *src,
                               const kvf_gpu_mem_t *dst,
                               const kvf_gpu_block_t *blks, size_t n,
                               int timeout_ms)
{
    cudaStream_t stream;
    kvf_status_t status;
    size_t i;
    int dev;

    if (cp == NULL || src == NULL || dst == NULL || (n > 0 && blks == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_base_use(cp, &dev, &stream);
    for (i = 0; i < n && status == KVF_OK; i++) {
        if (!kvf_base_in(blks[i].src_off, blks[i].len, src->len) ||
            !kvf_base_in(blks[i].dst_off, blks[i].len, dst->len)) {
            return KVF_ERR_OUT_OF_BOUNDS;
        }
        status = kvf_base_check(
            cudaMemcpyAsync((char *)dst->base + blks[i].dst_off,
                            (const char *)src->base + blks[i].src_off,
                            blks[i].len, cudaMemcpyDefault, stream));
    }
    return status == KVF_OK ? kvf_base_sync(dev, timeout_ms) : status;
}

#else /* !KVF_HAVE_CUDA */

kvf_status_t kvf_gpu_base_contig(kvf_gpu_copier_t *cp, const kvf_gpu_mem_t *src,
                                 uint64_t src_off, const kvf_gpu_mem_t *dst,
                                 uint64_t dst_off, uint64_t len, int timeout_ms)
{
    (void)cp;
    (void)src;
    (void)src_off;
    (void)dst;
    (void)dst_off;
    (void)len;
    (void)timeout_ms;
    return KVF_ERR_UNAVAILABLE;
}

kvf_status_t kvf_gpu_base_each(kvf_gpu_copier_t *cp, const kvf_gpu_mem_t *src,
                               const kvf_gpu_mem_t *dst,
                               const kvf_gpu_block_t *blks, size_t n,
                               int timeout_ms)
{
    return kvf_gpu_copy_blocks(cp, src, dst, blks, n, 0, timeout_ms);
}

#endif

kvf_status_t kvf_gpu_base_batchapi(kvf_gpu_copier_t *cp,
                                   const kvf_gpu_mem_t *src,
                                   const kvf_gpu_mem_t *dst,
                                   const kvf_gpu_block_t *blks, size_t n,
                                   int timeout_ms)
{
    return kvf_gpu_copy_blocks(cp, src, dst, blks, n, KVF_GPU_COPY_ENGINES,
                               timeout_ms);
}
