/*
 * mem/cuda, build without CUDA (no nvcc, or -DKVF_CUDA=OFF): the same
 * interface, every GPU feature answering KVF_ERR_UNAVAILABLE, socket I/O
 * falling through to the plain socket calls (no GPU region can exist).
 */
#include "mem/cuda/cuda.h"
#include "core/config.h"
#include "core/sock.h"

#include <string.h>

static const kvf_config_entry_t kvf_cuda_config_entries[] = {
    {"cuda_kernel", "auto",
     "copy kernel for scattered GPU blocks: auto, warp, bulk, hybrid",
     KVF_CONFIG_TUNING},
    {"cuda_stage_bytes", "1M",
     "pinned staging buffer size for GPU memory reached over sockets",
     KVF_CONFIG_TUNING},
    {"cuda_stage_slots", "4", "staging buffers in flight per connection",
     KVF_CONFIG_TUNING},
};

KVF_CONFIG_TABLE(kvf_cuda_config, "cuda", kvf_cuda_config_entries)

int kvf_cuda_device_count(void)
{
    return 0;
}

int kvf_cuda_built(void)
{
    return 0;
}

kvf_status_t kvf_cuda_device_info(int device, kvf_cuda_dev_info_t *info)
{
    (void)device;
    if (info != NULL) {
        memset(info, 0, sizeof(*info));
    }
    return KVF_ERR_UNAVAILABLE;
}

int kvf_cuda_peer_enable(int device, int peer)
{
    (void)device;
    (void)peer;
    return 0;
}

kvf_status_t kvf_cuda_mem_alloc(kvf_mem_type_t type, int device, size_t len,
                                void **addr_p)
{
    (void)type;
    (void)device;
    (void)len;
    (void)addr_p;
    return KVF_ERR_UNAVAILABLE;
}

void kvf_cuda_mem_free(kvf_mem_type_t type, void *addr)
{
    (void)type;
    (void)addr;
}

kvf_status_t kvf_cuda_mem_track_alloc(int device, size_t len, void **addr_p)
{
    (void)device;
    (void)len;
    (void)addr_p;
    return KVF_ERR_UNAVAILABLE;
}

kvf_status_t kvf_cuda_mem_track_pin(void *addr, size_t len)
{
    (void)addr;
    (void)len;
    return KVF_ERR_UNAVAILABLE;
}

kvf_status_t kvf_cuda_mem_track_release(void *addr, kvf_mem_type_t type)
{
    (void)addr;
    (void)type;
    return KVF_ERR_NOT_FOUND;
}

kvf_status_t kvf_cuda_host_register(void *addr, size_t len)
{
    (void)addr;
    (void)len;
    return KVF_ERR_UNAVAILABLE;
}

void kvf_cuda_host_unregister(void *addr)
{
    (void)addr;
}

kvf_status_t kvf_cuda_memcpy(void *dst, const void *src, size_t len)
{
    (void)dst;
    (void)src;
    (void)len;
    return KVF_ERR_UNAVAILABLE;
}

kvf_status_t kvf_cuda_memset(void *dst, int value, size_t len)
{
    (void)dst;
    (void)value;
    (void)len;
    return KVF_ERR_UNAVAILABLE;
}

kvf_status_t kvf_cuda_region_add(uint64_t addr, uint64_t len,
                                 kvf_mem_type_t type, int device)
{
    (void)addr;
    (void)len;
    (void)type;
    (void)device;
    return KVF_ERR_UNAVAILABLE;
}

void kvf_cuda_region_del(uint64_t addr, uint64_t len, kvf_mem_type_t type)
{
    (void)addr;
    (void)len;
    (void)type;
}

kvf_mem_type_t kvf_cuda_region_lookup(uint64_t addr, int *device_p,
                                      uint64_t *left_p)
{
    (void)addr;
    if (device_p != NULL) {
        *device_p = -1;
    }
    if (left_p != NULL) {
        *left_p = UINT64_MAX;
    }
    return KVF_MEM_HOST;
}

kvf_status_t kvf_cuda_copy_create(int device, kvf_cuda_copy_t **cp_p)
{
    (void)device;
    (void)cp_p;
    return KVF_ERR_UNAVAILABLE;
}

void kvf_cuda_copy_destroy(kvf_cuda_copy_t *cp)
{
    (void)cp;
}

void kvf_cuda_copy_set_kernel(kvf_cuda_copy_t *cp, kvf_cuda_kernel_t k)
{
    (void)cp;
    (void)k;
}

void kvf_cuda_copy_park(kvf_cuda_copy_t *cp)
{
    (void)cp;
}

void kvf_cuda_copy_res_stats(const kvf_cuda_copy_t *cp, uint64_t *jobs,
                             uint64_t *launches, uint64_t *fallbacks)
{
    (void)cp;
    *jobs = *launches = *fallbacks = 0;
}

const char *kvf_cuda_resident_name(void)
{
    return "off";
}

kvf_cuda_kernel_t kvf_cuda_kernel_parse(const char *name)
{
    if (name == NULL || strcmp(name, "auto") == 0) {
        return KVF_CUDA_KERNEL_AUTO;
    }
    if (strcmp(name, "warp") == 0) {
        return KVF_CUDA_KERNEL_WARP;
    }
    if (strcmp(name, "bulk") == 0) {
        return KVF_CUDA_KERNEL_BULK;
    }
    if (strcmp(name, "hybrid") == 0) {
        return KVF_CUDA_KERNEL_HYBRID;
    }
    return (kvf_cuda_kernel_t)-1;
}

const char *kvf_cuda_kernel_name(kvf_cuda_kernel_t k)
{
    return k == KVF_CUDA_KERNEL_WARP     ? "warp"
           : k == KVF_CUDA_KERNEL_BULK   ? "bulk"
           : k == KVF_CUDA_KERNEL_HYBRID ? "hybrid"
                                         : "auto";
}

kvf_status_t kvf_cuda_copy_blocks_dev(kvf_cuda_copy_t *cp,
                                      const kvf_cuda_mem_t *src,
                                      const kvf_cuda_mem_t *dst,
                                      const kvf_cuda_blk_t *dev_blks, size_t n,
                                      int timeout_ms)
{
    (void)cp;
    (void)src;
    (void)dst;
    (void)dev_blks;
    (void)n;
    (void)timeout_ms;
    return KVF_ERR_UNAVAILABLE;
}

kvf_status_t kvf_cuda_copy_blocks(kvf_cuda_copy_t *cp,
                                  const kvf_cuda_mem_t *src,
                                  const kvf_cuda_mem_t *dst,
                                  const kvf_cuda_blk_t *blks, size_t n,
                                  int timeout_ms)
{
    (void)cp;
    (void)src;
    (void)dst;
    (void)blks;
    (void)n;
    (void)timeout_ms;
    return KVF_ERR_UNAVAILABLE;
}

kvf_status_t kvf_cuda_copy_engines(kvf_cuda_copy_t *cp,
                                   const kvf_cuda_mem_t *src,
                                   const kvf_cuda_mem_t *dst,
                                   const kvf_cuda_blk_t *blks, size_t n,
                                   int timeout_ms)
{
    return kvf_cuda_copy_blocks(cp, src, dst, blks, n, timeout_ms);
}

kvf_status_t kvf_cuda_ce_post_ticket(kvf_cuda_copy_t *cp,
                                     const kvf_cuda_mem_t *src,
                                     const kvf_cuda_mem_t *dst,
                                     const kvf_cuda_blk_t *blks, size_t n,
                                     uint64_t *ticket_p)
{
    (void)ticket_p;
    return kvf_cuda_copy_blocks(cp, src, dst, blks, n, 0);
}

kvf_status_t kvf_cuda_ce_wait_ticket(kvf_cuda_copy_t *cp, uint64_t ticket,
                                     int timeout_ms)
{
    (void)cp;
    (void)ticket;
    (void)timeout_ms;
    return KVF_ERR_UNAVAILABLE;
}

int kvf_cuda_copy_device(const kvf_cuda_copy_t *cp)
{
    (void)cp;
    return -1;
}

void *kvf_cuda_copy_stream(kvf_cuda_copy_t *cp)
{
    (void)cp;
    return NULL;
}

kvf_status_t kvf_cuda_copy_sync(kvf_cuda_copy_t *cp, int timeout_ms)
{
    (void)cp;
    (void)timeout_ms;
    return KVF_ERR_UNAVAILABLE;
}

kvf_status_t kvf_cuda_checksum_blocks(kvf_cuda_copy_t *cp,
                                      const kvf_cuda_mem_t *mem,
                                      const uint64_t *offs,
                                      const uint64_t *lens, size_t n,
                                      uint64_t *sums, int timeout_ms)
{
    (void)cp;
    (void)mem;
    (void)offs;
    (void)lens;
    (void)n;
    (void)sums;
    (void)timeout_ms;
    return KVF_ERR_UNAVAILABLE;
}

kvf_status_t kvf_cuda_copy_sum(kvf_cuda_copy_t *cp, const kvf_cuda_mem_t *src,
                               const kvf_cuda_mem_t *dst,
                               const kvf_cuda_blk_t *blks, size_t n,
                               uint64_t *sums, int mode, int timeout_ms)
{
    (void)cp;
    (void)src;
    (void)dst;
    (void)blks;
    (void)n;
    (void)sums;
    (void)mode;
    (void)timeout_ms;
    return KVF_ERR_UNAVAILABLE;
}

kvf_status_t kvf_cuda_sum_blocks(kvf_cuda_copy_t *cp, const kvf_cuda_mem_t *mem,
                                 const uint64_t *offs, const uint64_t *lens,
                                 size_t n, uint64_t *sums, int timeout_ms)
{
    (void)cp;
    (void)mem;
    (void)offs;
    (void)lens;
    (void)n;
    (void)sums;
    (void)timeout_ms;
    return KVF_ERR_UNAVAILABLE;
}

void kvf_cuda_sums_free(kvf_cuda_copy_t *cp)
{
    (void)cp;
}

kvf_status_t kvf_cuda_readv(kvf_cuda_stage_t **stage_p, int fd,
                            struct iovec *iov, size_t iovcnt,
                            uint64_t deadline_ms)
{
    (void)stage_p;
    return kvf_sock_readv_all(fd, iov, iovcnt, deadline_ms);
}

kvf_status_t kvf_cuda_writev(kvf_cuda_stage_t **stage_p, int fd,
                             struct iovec *iov, size_t iovcnt,
                             uint64_t deadline_ms)
{
    (void)stage_p;
    return kvf_sock_writev_all(fd, iov, iovcnt, deadline_ms);
}

kvf_status_t kvf_cuda_hash(kvf_cuda_stage_t **stage_p, uint64_t addr,
                           uint64_t len, uint64_t *hash_p, uint64_t deadline_ms)
{
    (void)stage_p;
    (void)addr;
    (void)len;
    (void)hash_p;
    (void)deadline_ms;
    return KVF_ERR_UNAVAILABLE;
}

void kvf_cuda_stage_free(kvf_cuda_stage_t *stage)
{
    (void)stage;
}

kvf_status_t kvf_cuda_ipc_export(uint64_t addr,
                                 unsigned char handle[KVF_CUDA_IPC_HANDLE],
                                 uint64_t *offset_p)
{
    (void)addr;
    (void)handle;
    (void)offset_p;
    return KVF_ERR_UNAVAILABLE;
}

kvf_status_t kvf_cuda_ipc_open(const unsigned char handle[KVF_CUDA_IPC_HANDLE],
                               int device, void **base_p)
{
    (void)handle;
    (void)device;
    (void)base_p;
    return KVF_ERR_UNAVAILABLE;
}

void kvf_cuda_ipc_close(int device, void *base)
{
    (void)device;
    (void)base;
}
