/*
 * Memory layer: one ops table per memory type, and the front functions
 * the engine and the transports call.
 *
 *   KVF_MEM_HOST    memfd-backed shared memory (mem/shm_mem.h), recorded
 *                   so the shm transport can pass its fd to a same-host
 *                   peer; plain copies and socket calls.
 *   KVF_MEM_PINNED  the same memfd memory, pinned (mem/cuda), so pinned
 *                   memory stays shareable with same-host peers.
 *   KVF_MEM_CUDA    cudaMalloc on `device` (mem/cuda), exported to
 *                   same-host peers through CUDA IPC, moved over sockets
 *                   through pinned staging buffers.
 *   Pinned and CUDA answer KVF_ERR_UNAVAILABLE without a GPU.
 *
 * kvf_mem_type_free() finds the owner by asking each type in turn
 * whether the pointer is one of its allocations (each answers
 * KVF_ERR_NOT_FOUND when not), so the caller does not have to remember
 * the type.
 */
#include "mem/mem.h"
#include "mem/shm_mem.h"
#include "mem/cuda/cuda.h"
#include "core/checksum.h"
#include "core/log.h"
#include "core/sock.h"

#include <string.h>

_Static_assert(KVF_MEM_IPC_HANDLE == KVF_CUDA_IPC_HANDLE, "IPC handle size");

static kvf_status_t kvf_mem_host_alloc(size_t len, int device, void **ptr_p)
{
    (void)device;
    return kvf_shm_mem_alloc(len, ptr_p);
}

static kvf_status_t kvf_mem_host_copy(void *dst, const void *src, size_t len)
{
    memcpy(dst, src, len);
    return KVF_OK;
}

static kvf_status_t kvf_mem_pinned_alloc(size_t len, int device, void **ptr_p)
{
    kvf_status_t status;

    (void)device;
    if (kvf_cuda_device_count() == 0) {
        return KVF_ERR_UNAVAILABLE;
    }
    status = kvf_shm_mem_alloc(len, ptr_p);
    if (status == KVF_OK) {
        status = kvf_cuda_mem_track_pin(*ptr_p, len);
        if (status != KVF_OK) {
            kvf_shm_mem_free(*ptr_p);
        }
    }
    return status;
}

static kvf_status_t kvf_mem_pinned_free(void *ptr)
{
    kvf_status_t status = kvf_cuda_mem_track_release(ptr, KVF_MEM_PINNED);

    return status == KVF_OK ? kvf_shm_mem_free(ptr) : status;
}

static kvf_status_t kvf_mem_pinned_reg(uint64_t addr, uint64_t len, int device)
{
    return kvf_cuda_region_add(addr, len, KVF_MEM_PINNED, device);
}

static void kvf_mem_pinned_dereg(uint64_t addr, uint64_t len)
{
    kvf_cuda_region_del(addr, len, KVF_MEM_PINNED);
}

static kvf_status_t kvf_mem_cuda_alloc(size_t len, int device, void **ptr_p)
{
    return kvf_cuda_mem_track_alloc(device, len, ptr_p);
}

static kvf_status_t kvf_mem_cuda_free(void *ptr)
{
    return kvf_cuda_mem_track_release(ptr, KVF_MEM_CUDA);
}

static kvf_status_t kvf_mem_cuda_reg(uint64_t addr, uint64_t len, int device)
{
    return kvf_cuda_region_add(addr, len, KVF_MEM_CUDA, device);
}

static void kvf_mem_cuda_dereg(uint64_t addr, uint64_t len)
{
    kvf_cuda_region_del(addr, len, KVF_MEM_CUDA);
}

static const kvf_mem_ops_t kvf_mem_host_ops = {
    .type = KVF_MEM_HOST,
    .name = "host (memfd)",
    .alloc = kvf_mem_host_alloc,
    .free = kvf_shm_mem_free,
    .dereg = kvf_shm_mem_dereg,
    .copy = kvf_mem_host_copy,
};

/* Pinned memory is host memory to the CPU: copies and socket I/O are the
 * host ones; only allocation and registration differ. */
static const kvf_mem_ops_t kvf_mem_pinned_ops = {
    .type = KVF_MEM_PINNED,
    .name = "pinned host (memfd)",
    .alloc = kvf_mem_pinned_alloc,
    .free = kvf_mem_pinned_free,
    .reg = kvf_mem_pinned_reg,
    .dereg = kvf_mem_pinned_dereg,
    .copy = kvf_mem_host_copy,
};

static const kvf_mem_ops_t kvf_mem_cuda_ops = {
    .type = KVF_MEM_CUDA,
    .name = "GPU",
    .alloc = kvf_mem_cuda_alloc,
    .free = kvf_mem_cuda_free,
    .reg = kvf_mem_cuda_reg,
    .dereg = kvf_mem_cuda_dereg,
    .export_ipc = kvf_cuda_ipc_export,
    .copy = kvf_cuda_memcpy,
    .stage_readv = kvf_cuda_readv,
    .stage_writev = kvf_cuda_writev,
    .hash = kvf_cuda_hash,
};

static const kvf_mem_ops_t *const kvf_mem_table[KVF_MEM_NTYPES] = {
    [KVF_MEM_HOST] = &kvf_mem_host_ops,
    [KVF_MEM_PINNED] = &kvf_mem_pinned_ops,
    [KVF_MEM_CUDA] = &kvf_mem_cuda_ops,
};

/* The order kvf_mem_type_free asks in: pinned first, its memory is also
 * memfd memory the host entry would free without unpinning. */
static const kvf_mem_type_t kvf_mem_free_order[KVF_MEM_NTYPES] = {
    KVF_MEM_PINNED, KVF_MEM_CUDA, KVF_MEM_HOST};

const kvf_mem_ops_t *kvf_mem_ops(kvf_mem_type_t type)
{
    if ((unsigned)type >= KVF_MEM_NTYPES) {
        return NULL;
    }
    return kvf_mem_table[type];
}

kvf_status_t kvf_mem_type_alloc(kvf_mem_type_t type, size_t len, int device,
                                void **ptr_p)
{
    const kvf_mem_ops_t *ops = kvf_mem_ops(type);
    kvf_status_t status;

    if (len == 0 || ptr_p == NULL || ops == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (ops->alloc == NULL) {
        kvf_debug("kvf_mem_alloc: type %d has no allocator", (int)type);
        return KVF_ERR_UNAVAILABLE;
    }
    status = ops->alloc(len, device, ptr_p);
    if (status != KVF_OK) {
        kvf_error("cannot allocate %zu bytes of %s memory: %s", len, ops->name,
                  kvf_status_str(status));
    }
    return status;
}

kvf_status_t kvf_mem_type_free(void *ptr)
{
    const kvf_mem_ops_t *ops;
    kvf_status_t status;
    size_t i;

    for (i = 0; i < KVF_MEM_NTYPES; i++) {
        ops = kvf_mem_table[kvf_mem_free_order[i]];
        if (ops->free == NULL) {
            continue;
        }
        status = ops->free(ptr);
        if (status != KVF_ERR_NOT_FOUND) {
            return status;
        }
    }
    return KVF_ERR_NOT_FOUND;
}

kvf_status_t kvf_mem_region_add(uint64_t addr, uint64_t len,
                                kvf_mem_type_t type, int device)
{
    const kvf_mem_ops_t *ops = kvf_mem_ops(type);

    if (ops == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    return ops->reg != NULL ? ops->reg(addr, len, device) : KVF_OK;
}

void kvf_mem_region_del(uint64_t addr, uint64_t len, kvf_mem_type_t type)
{
    const kvf_mem_ops_t *ops = kvf_mem_ops(type);

    if (ops != NULL && ops->dereg != NULL) {
        ops->dereg(addr, len);
    }
}

kvf_mem_type_t kvf_mem_region_lookup(uint64_t addr, int *device_p,
                                     uint64_t *left_p)
{
    return kvf_cuda_region_lookup(addr, device_p, left_p);
}

void kvf_mem_region_export(kvf_mem_region_t *r)
{
    const kvf_mem_ops_t *ops = kvf_mem_ops(r->type);

    r->ipc = 0;
    if (ops != NULL && ops->export_ipc != NULL &&
        ops->export_ipc(r->addr, r->ipc_handle, &r->ipc_off) == KVF_OK) {
        r->ipc = 1;
    }
}

int kvf_mem_is_host(const void *p)
{
    uint64_t left;

    return kvf_mem_region_lookup((uint64_t)(uintptr_t)p, NULL, &left) !=
           KVF_MEM_CUDA;
}

/* The ops whose stage functions serve `types`: the CUDA entry when the
 * set may hold GPU memory (or is unknown), else NULL (plain sockets). */
static const kvf_mem_ops_t *kvf_mem_stager(kvf_mem_mask_t types)
{
    if (types != 0 && (types & KVF_MEM_BIT(KVF_MEM_CUDA)) == 0) {
        return NULL;
    }
    return &kvf_mem_cuda_ops;
}

kvf_status_t kvf_mem_copy(void *dst, const void *src, size_t len,
                          kvf_mem_mask_t types)
{
    if (kvf_mem_stager(types) != NULL &&
        (!kvf_mem_is_host(dst) || !kvf_mem_is_host(src))) {
        return kvf_mem_cuda_ops.copy(dst, src, len);
    }
    memcpy(dst, src, len);
    return KVF_OK;
}

kvf_status_t kvf_mem_stage_readv(kvf_mem_stage_t **stage_p,
                                 kvf_mem_mask_t types, int fd,
                                 struct iovec *iov, size_t iovcnt,
                                 uint64_t deadline_ms)
{
    const kvf_mem_ops_t *ops = kvf_mem_stager(types);

    if (ops == NULL) {
        return kvf_sock_readv_all(fd, iov, iovcnt, deadline_ms);
    }
    return ops->stage_readv(stage_p, fd, iov, iovcnt, deadline_ms);
}

kvf_status_t kvf_mem_stage_writev(kvf_mem_stage_t **stage_p,
                                  kvf_mem_mask_t types, int fd,
                                  struct iovec *iov, size_t iovcnt,
                                  uint64_t deadline_ms)
{
    const kvf_mem_ops_t *ops = kvf_mem_stager(types);

    if (ops == NULL) {
        return kvf_sock_writev_all(fd, iov, iovcnt, deadline_ms);
    }
    return ops->stage_writev(stage_p, fd, iov, iovcnt, deadline_ms);
}

kvf_status_t kvf_mem_hash(kvf_mem_stage_t **stage_p, kvf_mem_type_t type,
                          uint64_t addr, uint64_t len, uint64_t *hash_p,
                          uint64_t deadline_ms)
{
    const kvf_mem_ops_t *ops = kvf_mem_ops(type);

    if (ops != NULL && ops->hash != NULL) {
        return ops->hash(stage_p, addr, len, hash_p, deadline_ms);
    }
    *hash_p = kvf_hash64((const void *)(uintptr_t)addr, len, 0);
    return KVF_OK;
}

void kvf_mem_stage_free(kvf_mem_stage_t *stage)
{
    kvf_cuda_stage_free(stage);
}

int kvf_mem_gpu_count(void)
{
    return kvf_cuda_device_count();
}
