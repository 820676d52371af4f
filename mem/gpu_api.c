/*
 * The public GPU calls (kvferry/gpu.h): thin wrappers over mem/cuda, so
 * programs and bindings reach devices, GPU memory and the batched copy
 * kernels without a private header. Without a GPU every call answers
 * KVF_ERR_UNAVAILABLE before touching its arguments.
 */
#include <kvferry/gpu.h>

#include "core/alloc.h"
#include "core/checksum.h"
#include "mem/cuda/cuda.h"

#include <stddef.h>
#include <string.h>

/* The public types are the library's own, seen from outside. */
_Static_assert(sizeof(kvf_gpu_block_t) == sizeof(kvf_cuda_blk_t) &&
                   offsetof(kvf_gpu_block_t, src_off) ==
                       offsetof(kvf_cuda_blk_t, src_off) &&
                   offsetof(kvf_gpu_block_t, dst_off) ==
                       offsetof(kvf_cuda_blk_t, dst_off) &&
                   offsetof(kvf_gpu_block_t, len) ==
                       offsetof(kvf_cuda_blk_t, len),
               "kvf_gpu_block_t differs from kvf_cuda_blk_t");
_Static_assert(
    sizeof(kvf_gpu_mem_t) == sizeof(kvf_cuda_mem_t) &&
        offsetof(kvf_gpu_mem_t, base) == offsetof(kvf_cuda_mem_t, base) &&
        offsetof(kvf_gpu_mem_t, len) == offsetof(kvf_cuda_mem_t, len) &&
        offsetof(kvf_gpu_mem_t, type) == offsetof(kvf_cuda_mem_t, type) &&
        offsetof(kvf_gpu_mem_t, device) == offsetof(kvf_cuda_mem_t, device),
    "kvf_gpu_mem_t differs from kvf_cuda_mem_t");
_Static_assert(sizeof(kvf_gpu_info_t) == sizeof(kvf_cuda_dev_info_t),
               "kvf_gpu_info_t differs from kvf_cuda_dev_info_t");
_Static_assert((int)KVF_GPU_KERNEL_HYBRID == (int)KVF_CUDA_KERNEL_HYBRID &&
                   (int)KVF_GPU_KERNEL_BULK == (int)KVF_CUDA_KERNEL_BULK &&
                   (int)KVF_GPU_KERNEL_WARP == (int)KVF_CUDA_KERNEL_WARP,
               "kvf_gpu_kernel_t differs from kvf_cuda_kernel_t");

/* A copier is a copy context; the public name keeps it opaque. */
static kvf_cuda_copy_t *kvf_gpu_cp(kvf_gpu_copier_t *c)
{
    return (kvf_cuda_copy_t *)(void *)c;
}

static int kvf_gpu_none(void)
{
    return kvf_cuda_device_count() == 0;
}

/* ---- devices ---------------------------------------------------------- */

int kvf_gpu_count(void)
{
    return kvf_cuda_device_count();
}

int kvf_gpu_built(void)
{
    return kvf_cuda_built();
}

kvf_status_t kvf_gpu_info(int device, kvf_gpu_info_t *info_p)
{
    kvf_cuda_dev_info_t in;
    kvf_status_t status;

    if (kvf_gpu_none()) {
        return KVF_ERR_UNAVAILABLE;
    }
    if (info_p == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_cuda_device_info(device, &in);
    if (status == KVF_OK) {
        memcpy(info_p->name, in.name, sizeof(info_p->name));
        memcpy(info_p->pci_bus_id, in.pci_bus_id, sizeof(info_p->pci_bus_id));
        info_p->numa_node = in.numa_node;
        info_p->pcie_gen = in.pcie_gen;
        info_p->pcie_width = in.pcie_width;
        info_p->cc_major = in.cc_major;
        info_p->cc_minor = in.cc_minor;
        info_p->sm_count = in.sm_count;
        info_p->mem_bytes = in.mem_bytes;
        info_p->driver_version = in.driver_version;
        info_p->runtime_version = in.runtime_version;
    }
    return status;
}

/* ---- memory ----------------------------------------------------------- */

kvf_status_t kvf_gpu_alloc(kvf_mem_type_t type, int device, size_t len,
                           void **ptr_p)
{
    if (ptr_p != NULL) {
        *ptr_p = NULL;
    }
    if (kvf_gpu_none()) {
        return KVF_ERR_UNAVAILABLE;
    }
    if (ptr_p == NULL || len == 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    return kvf_cuda_mem_alloc(type, device, len, ptr_p);
}

void kvf_gpu_free(kvf_mem_type_t type, void *ptr)
{
    if (ptr != NULL && !kvf_gpu_none()) {
        kvf_cuda_mem_free(type, ptr);
    }
}

kvf_status_t kvf_gpu_host_register(void *ptr, size_t len)
{
    if (kvf_gpu_none()) {
        return KVF_ERR_UNAVAILABLE;
    }
    return kvf_cuda_host_register(ptr, len);
}

void kvf_gpu_host_unregister(void *ptr)
{
    if (ptr != NULL && !kvf_gpu_none()) {
        kvf_cuda_host_unregister(ptr);
    }
}

kvf_status_t kvf_gpu_copy(void *dst, const void *src, size_t len)
{
    if (kvf_gpu_none()) {
        return KVF_ERR_UNAVAILABLE;
    }
    if (len == 0) {
        return KVF_OK;
    }
    if (dst == NULL || src == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    return kvf_cuda_memcpy(dst, src, len);
}

kvf_status_t kvf_gpu_checksum(const void *ptr, size_t len, uint64_t *sum_p)
{
    kvf_status_t status;
    void *buf;

    if (kvf_gpu_none()) {
        return KVF_ERR_UNAVAILABLE;
    }
    if (sum_p == NULL || (ptr == NULL && len > 0)) {
        return KVF_ERR_INVALID_PARAM;
    }
    buf = kvf_malloc(len + 1);
    if (buf == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    /* cudaMemcpyDefault reads host and GPU memory alike */
    status = len > 0 ? kvf_cuda_memcpy(buf, ptr, len) : KVF_OK;
    if (status == KVF_OK) {
        *sum_p = kvf_checksum(buf, len);
    }
    kvf_free(buf);
    return status;
}

/* ---- copiers ---------------------------------------------------------- */

const char *kvf_gpu_kernel_name(kvf_gpu_kernel_t kernel)
{
    return kvf_cuda_kernel_name((kvf_cuda_kernel_t)kernel);
}

int kvf_gpu_kernel_parse(const char *name)
{
    return name == NULL ? -1 : (int)kvf_cuda_kernel_parse(name);
}

const char *kvf_gpu_resident_name(void)
{
    return kvf_cuda_resident_name();
}

kvf_status_t kvf_gpu_copier_create(int device, kvf_gpu_copier_t **c_p)
{
    kvf_cuda_copy_t *cp = NULL;
    kvf_status_t status;

    if (c_p != NULL) {
        *c_p = NULL;
    }
    if (kvf_gpu_none()) {
        return KVF_ERR_UNAVAILABLE;
    }
    if (c_p == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_cuda_copy_create(device, &cp);
    if (status == KVF_OK) {
        *c_p = (kvf_gpu_copier_t *)(void *)cp;
    }
    return status;
}

void kvf_gpu_copier_destroy(kvf_gpu_copier_t *c)
{
    if (c != NULL) {
        kvf_cuda_copy_destroy(kvf_gpu_cp(c));
    }
}

void kvf_gpu_copier_set_kernel(kvf_gpu_copier_t *c, kvf_gpu_kernel_t kernel)
{
    if (c != NULL && (int)kernel >= (int)KVF_GPU_KERNEL_AUTO &&
        (int)kernel <= (int)KVF_GPU_KERNEL_HYBRID) {
        kvf_cuda_copy_set_kernel(kvf_gpu_cp(c), (kvf_cuda_kernel_t)kernel);
    }
}

int kvf_gpu_copier_device(const kvf_gpu_copier_t *c)
{
    return c == NULL
               ? -1
               : kvf_cuda_copy_device((const kvf_cuda_copy_t *)(const void *)c);
}

void kvf_gpu_copier_park(kvf_gpu_copier_t *c)
{
    if (c != NULL) {
        kvf_cuda_copy_park(kvf_gpu_cp(c));
    }
}

void kvf_gpu_copier_stats(const kvf_gpu_copier_t *c,
                          kvf_gpu_copier_stats_t *stats_p)
{
    if (stats_p == NULL) {
        return;
    }
    memset(stats_p, 0, sizeof(*stats_p));
    if (c != NULL) {
        kvf_cuda_copy_res_stats((const kvf_cuda_copy_t *)(const void *)c,
                                &stats_p->resident_batches,
                                &stats_p->resident_starts, &stats_p->fallbacks);
    }
}

/* KVF_GPU_VERIFY: the source's checksums computed by the kernel that
 * copies the blocks, the destination's by a checksum-only pass on the
 * GPU; a pageable side (or the copy engines) falls back to copying and
 * then checksumming both sides. */
static kvf_status_t kvf_gpu_copy_verified(kvf_cuda_copy_t *cp,
                                          const kvf_cuda_mem_t *src,
                                          const kvf_cuda_mem_t *dst,
                                          const kvf_cuda_blk_t *blocks,
                                          size_t n, int engines, int timeout_ms)
{
    uint64_t *v = kvf_malloc(5 * n * sizeof(uint64_t) + 1);
    uint64_t *so = v, *dof = v + n, *len = v + 2 * n;
    uint64_t *s1 = v + 3 * n, *s2 = v + 4 * n;
    kvf_status_t status = KVF_ERR_UNSUPPORTED;
    size_t i;

    if (v == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0; i < n; i++) {
        so[i] = blocks[i].src_off;
        dof[i] = blocks[i].dst_off;
        len[i] = blocks[i].len;
    }
    if (!engines) {
        status = kvf_cuda_copy_sum(cp, src, dst, blocks, n, s1,
                                   KVF_CUDA_SUM_FUSED, timeout_ms);
    }
    if (status == KVF_ERR_UNSUPPORTED) {
        status =
            engines ? kvf_cuda_copy_engines(cp, src, dst, blocks, n, timeout_ms)
                    : kvf_cuda_copy_blocks(cp, src, dst, blocks, n, timeout_ms);
        if (status == KVF_OK) {
            status =
                kvf_cuda_checksum_blocks(cp, src, so, len, n, s1, timeout_ms);
        }
    }
    if (status == KVF_OK) {
        status = kvf_cuda_checksum_blocks(cp, dst, dof, len, n, s2, timeout_ms);
    }
    for (i = 0; i < n && status == KVF_OK; i++) {
        if (s1[i] != s2[i]) {
            status = KVF_ERR_CHECKSUM;
        }
    }
    kvf_free(v);
    return status;
}

kvf_status_t kvf_gpu_copy_blocks(kvf_gpu_copier_t *c, const kvf_gpu_mem_t *src,
                                 const kvf_gpu_mem_t *dst,
                                 const kvf_gpu_block_t *blocks, size_t n,
                                 unsigned flags, int timeout_ms)
{
    const kvf_cuda_mem_t *s = (const kvf_cuda_mem_t *)(const void *)src;
    const kvf_cuda_mem_t *d = (const kvf_cuda_mem_t *)(const void *)dst;
    const kvf_cuda_blk_t *b = (const kvf_cuda_blk_t *)(const void *)blocks;
    kvf_cuda_copy_t *cp = kvf_gpu_cp(c);
    kvf_status_t status;

    if (kvf_gpu_none()) {
        return KVF_ERR_UNAVAILABLE;
    }
    if (c == NULL || src == NULL || dst == NULL || (n > 0 && blocks == NULL) ||
        (flags & ~(KVF_GPU_BLOCKS_ON_GPU | KVF_GPU_COPY_ENGINES |
                   KVF_GPU_VERIFY)) != 0 ||
        ((flags & KVF_GPU_BLOCKS_ON_GPU) &&
         (flags & (KVF_GPU_COPY_ENGINES | KVF_GPU_VERIFY)))) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (flags & KVF_GPU_BLOCKS_ON_GPU) {
        return kvf_cuda_copy_blocks_dev(cp, s, d, b, n, timeout_ms);
    }
    if ((flags & KVF_GPU_VERIFY) && n > 0) {
        return kvf_gpu_copy_verified(
            cp, s, d, b, n, (flags & KVF_GPU_COPY_ENGINES) != 0, timeout_ms);
    }
    if (flags & KVF_GPU_COPY_ENGINES) {
        status = kvf_cuda_copy_engines(cp, s, d, b, n, timeout_ms);
    } else {
        status = kvf_cuda_copy_blocks(cp, s, d, b, n, timeout_ms);
    }
    return status;
}

kvf_status_t kvf_gpu_copy_post(kvf_gpu_copier_t *c, const kvf_gpu_mem_t *src,
                               const kvf_gpu_mem_t *dst,
                               const kvf_gpu_block_t *blocks, size_t n,
                               uint64_t *ticket_p)
{
    if (kvf_gpu_none()) {
        return KVF_ERR_UNAVAILABLE;
    }
    if (c == NULL || src == NULL || dst == NULL || ticket_p == NULL ||
        (n > 0 && blocks == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    return kvf_cuda_ce_post_ticket(
        kvf_gpu_cp(c), (const kvf_cuda_mem_t *)(const void *)src,
        (const kvf_cuda_mem_t *)(const void *)dst,
        (const kvf_cuda_blk_t *)(const void *)blocks, n, ticket_p);
}

kvf_status_t kvf_gpu_copy_wait(kvf_gpu_copier_t *c, uint64_t ticket,
                               int timeout_ms)
{
    if (kvf_gpu_none()) {
        return KVF_ERR_UNAVAILABLE;
    }
    if (c == NULL || timeout_ms < 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    return kvf_cuda_ce_wait_ticket(kvf_gpu_cp(c), ticket, timeout_ms);
}

kvf_status_t kvf_gpu_copy_blocks_sum(kvf_gpu_copier_t *c,
                                     const kvf_gpu_mem_t *src,
                                     const kvf_gpu_mem_t *dst,
                                     const kvf_gpu_block_t *blocks, size_t n,
                                     unsigned flags, const uint64_t *expect,
                                     uint64_t *sums, int timeout_ms)
{
    int mode = KVF_CUDA_SUM_AUTO;
    uint64_t *out = sums;
    kvf_status_t status;
    size_t i;

    if (kvf_gpu_none()) {
        return KVF_ERR_UNAVAILABLE;
    }
    if (c == NULL || src == NULL || dst == NULL ||
        (n > 0 && (blocks == NULL || (sums == NULL && expect == NULL))) ||
        (flags != 0 && flags != KVF_GPU_SUM_FUSED &&
         flags != KVF_GPU_SUM_AFTER && flags != KVF_GPU_SUM_ENGINES)) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (flags == KVF_GPU_SUM_FUSED) {
        mode = KVF_CUDA_SUM_FUSED;
    } else if (flags == KVF_GPU_SUM_AFTER) {
        mode = KVF_CUDA_SUM_AFTER;
    } else if (flags == KVF_GPU_SUM_ENGINES) {
        mode = KVF_CUDA_SUM_ENGINES;
    }
    if (out == NULL) {
        out = kvf_malloc(n * sizeof(*out) + 1);
        if (out == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
    }
    status = kvf_cuda_copy_sum(
        kvf_gpu_cp(c), (const kvf_cuda_mem_t *)(const void *)src,
        (const kvf_cuda_mem_t *)(const void *)dst,
        (const kvf_cuda_blk_t *)(const void *)blocks, n, out, mode, timeout_ms);
    for (i = 0; i < n && status == KVF_OK && expect != NULL; i++) {
        if (out[i] != expect[i]) {
            status = KVF_ERR_CHECKSUM;
        }
    }
    if (out != sums) {
        kvf_free(out);
    }
    return status;
}

kvf_status_t kvf_gpu_checksum_blocks(kvf_gpu_copier_t *c,
                                     const kvf_gpu_mem_t *mem,
                                     const uint64_t *offs, const uint64_t *lens,
                                     size_t n, uint64_t *sums, int timeout_ms)
{
    if (kvf_gpu_none()) {
        return KVF_ERR_UNAVAILABLE;
    }
    return kvf_cuda_checksum_blocks(kvf_gpu_cp(c),
                                    (const kvf_cuda_mem_t *)(const void *)mem,
                                    offs, lens, n, sums, timeout_ms);
}
