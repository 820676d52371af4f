/*
 * GPU benches: the copies kvferry's kernels are measured against, on a
 * copy context's stream: one contiguous cudaMemcpyAsync (or
 * cudaMemcpyPeerAsync across GPUs) of the same bytes, one
 * cudaMemcpyAsync per block, and cudaMemcpyBatchAsync (the library's
 * copy-engine path). Without CUDA they answer KVF_ERR_UNAVAILABLE.
 */
#include "tools/bench/gpu.h"

#ifdef KVF_HAVE_CUDA
#include <cuda_runtime_api.h>

static int kvf_base_in(uint64_t off, uint64_t len, uint64_t side)
{
    return off <= side && len <= side - off;
}

static kvf_status_t kvf_base_check(cudaError_t err)
{
    return err == cudaSuccess ? KVF_OK : KVF_ERR_IO;
}

kvf_status_t kvf_cuda_copy_contig(kvf_cuda_copy_t *cp,
                                  const kvf_cuda_mem_t *src, uint64_t src_off,
                                  const kvf_cuda_mem_t *dst, uint64_t dst_off,
                                  uint64_t len, int timeout_ms)
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
    dev = kvf_cuda_copy_device(cp);
    stream = (cudaStream_t)kvf_cuda_copy_stream(cp);
    status = kvf_base_check(cudaSetDevice(dev));
    if (status != KVF_OK) {
        return status;
    }
    if (src->type == KVF_MEM_CUDA && dst->type == KVF_MEM_CUDA &&
        src->device != dst->device) {
        kvf_cuda_peer_enable(src->device, dst->device);
        kvf_cuda_peer_enable(dst->device, src->device);
        cudaSetDevice(dev);
        status = kvf_base_check(
            cudaMemcpyPeerAsync(d, dst->device, s, src->device, len, stream));
    } else {
        status = kvf_base_check(
            cudaMemcpyAsync(d, s, len, cudaMemcpyDefault, stream));
    }
    return status == KVF_OK ? kvf_cuda_copy_sync(cp, timeout_ms) : status;
}

kvf_status_t kvf_cuda_copy_each(kvf_cuda_copy_t *cp, const kvf_cuda_mem_t *src,
                                const kvf_cuda_mem_t *dst,
                                const kvf_cuda_blk_t *blks, size_t n,
                                int timeout_ms)
{
    cudaStream_t stream;
    kvf_status_t status;
    size_t i;

    if (cp == NULL || src == NULL || dst == NULL || (n > 0 && blks == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    stream = (cudaStream_t)kvf_cuda_copy_stream(cp);
    status = kvf_base_check(cudaSetDevice(kvf_cuda_copy_device(cp)));
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
    return status == KVF_OK ? kvf_cuda_copy_sync(cp, timeout_ms) : status;
}

#else /* !KVF_HAVE_CUDA */

kvf_status_t kvf_cuda_copy_contig(kvf_cuda_copy_t *cp,
                                  const kvf_cuda_mem_t *src, uint64_t src_off,
                                  const kvf_cuda_mem_t *dst, uint64_t dst_off,
                                  uint64_t len, int timeout_ms)
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

kvf_status_t kvf_cuda_copy_each(kvf_cuda_copy_t *cp, const kvf_cuda_mem_t *src,
                                const kvf_cuda_mem_t *dst,
                                const kvf_cuda_blk_t *blks, size_t n,
                                int timeout_ms)
{
    return kvf_cuda_copy_blocks(cp, src, dst, blks, n, timeout_ms);
}

#endif

kvf_status_t kvf_cuda_copy_batchapi(kvf_cuda_copy_t *cp,
                                    const kvf_cuda_mem_t *src,
                                    const kvf_cuda_mem_t *dst,
                                    const kvf_cuda_blk_t *blks, size_t n,
                                    int timeout_ms)
{
    return kvf_cuda_copy_engines(cp, src, dst, blks, n, timeout_ms);
}
