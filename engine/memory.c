/*
 * Memory the engine can share: kvf_mem_alloc / kvf_mem_free, the public
 * front of the per-type allocators that live with their transports.
 *
 *   KVF_MEM_HOST    transport/shm (shm_mem.h): memfd-backed, recorded so
 *                   the shm transport can pass its fd to a same-host peer
 *                   whose request touches a registered region in it.
 *   KVF_MEM_PINNED  transport/cuda pins memfd memory from shm (so pinned
 *                   memory stays shareable with same-host peers).
 *   KVF_MEM_CUDA    transport/cuda: cudaMalloc on `device`.
 *   Both answer KVF_ERR_UNAVAILABLE without a GPU.
 *
 * kvf_mem_free() finds the owner by asking each backend in turn whether
 * the pointer is one of its allocations (each answers KVF_ERR_NOT_FOUND
 * when not), so the caller does not have to remember the type.
 */
#include "engine/engine_int.h"
#include "transport/shm/shm_mem.h"
#include "transport/cuda/cuda.h"
#include "core/log.h"

typedef struct kvf_mem_backend {
    kvf_mem_type_t type;
    const char *name;
    kvf_status_t (*alloc)(size_t len, int device, void **ptr_p);
    /* KVF_ERR_NOT_FOUND when ptr is not one of this backend's */
    kvf_status_t (*free)(void *ptr);
} kvf_mem_backend_t;

static kvf_status_t kvf_mem_host_alloc(size_t len, int device, void **ptr_p)
{
    (void)device;
    return kvf_shm_mem_alloc(len, ptr_p);
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

static kvf_status_t kvf_mem_cuda_free(void *ptr)
{
    return kvf_cuda_mem_track_release(ptr, KVF_MEM_CUDA);
}

static kvf_status_t kvf_mem_cuda_alloc(size_t len, int device, void **ptr_p)
{
    return kvf_cuda_mem_track_alloc(device, len, ptr_p);
}

/* The switch point: one entry per memory type that has an allocator.
 * Pinned memory is memfd + cudaHostRegister (shareable over shm); GPU
 * memory is plain cudaMalloc, reached by same-host peers through CUDA
 * IPC handles rather than shm. */
static const kvf_mem_backend_t kvf_mem_backends[] = {
    /* pinned first: its memory is also memfd memory the host entry
     * would free without unpinning */
    {KVF_MEM_PINNED, "pinned host (memfd)", kvf_mem_pinned_alloc,
     kvf_mem_pinned_free},
    {KVF_MEM_CUDA, "GPU", kvf_mem_cuda_alloc, kvf_mem_cuda_free},
    {KVF_MEM_HOST, "host (memfd)", kvf_mem_host_alloc, kvf_shm_mem_free},
};

#define KVF_MEM_NBACKENDS                                                      \
    (sizeof(kvf_mem_backends) / sizeof(kvf_mem_backends[0]))

kvf_status_t kvf_mem_alloc(size_t len, kvf_mem_type_t type, int device,
                           void **ptr_p)
{
    kvf_status_t status;
    size_t i;

    if (len == 0 || ptr_p == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    for (i = 0; i < KVF_MEM_NBACKENDS; i++) {
        if (kvf_mem_backends[i].type == type) {
            status = kvf_mem_backends[i].alloc(len, device, ptr_p);
            if (status != KVF_OK) {
                kvf_error("cannot allocate %zu bytes of %s memory: %s", len,
                          kvf_mem_backends[i].name, kvf_status_str(status));
            }
            return status;
        }
    }
    if (type == KVF_MEM_PINNED || type == KVF_MEM_CUDA) {
        kvf_debug("kvf_mem_alloc: type %d has no allocator yet", (int)type);
        return KVF_ERR_UNAVAILABLE;
    }
    return KVF_ERR_INVALID_PARAM;
}

void kvf_mem_free(void *ptr)
{
    size_t i;

    if (ptr == NULL) {
        return;
    }
    for (i = 0; i < KVF_MEM_NBACKENDS; i++) {
        if (kvf_mem_backends[i].free(ptr) != KVF_ERR_NOT_FOUND) {
            return;
        }
    }
    kvf_warn("kvf_mem_free(%p): not memory from kvf_mem_alloc, ignored", ptr);
}
