/*
 * Memory layer: the memory types kvferry moves -- host (pageable), host
 * memfd-backed shared memory, pinned host memory and CUDA device memory --
 * behind one ops table per type. The engine and every transport reach
 * memory only through this header: allocation, registration and look-up
 * of registered ranges, export to same-host peers, and the copies a
 * transport needs (plain copies, staged socket I/O, checksums).
 *
 * Without a GPU (or in a build without CUDA) the pinned and CUDA entries
 * answer KVF_ERR_UNAVAILABLE and the copies are plain host copies, so one
 * build runs anywhere.
 */
#ifndef KVF_MEM_MEM_H
#define KVF_MEM_MEM_H
#if !defined(KVF_LAYER_MEM) && !defined(KVF_LAYER_TRANSPORT) && \
    !defined(KVF_LAYER_ENGINE) && !defined(KVF_TEST_INTERNALS)
#error "mem/mem.h is mem/'s interface, for the transports and the engine"
#endif

#include <kvferry/status.h>
#include <kvferry/types.h>

/* memfd-backed host memory, shared with same-host peers by fd */
#include "mem/shm_mem.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define KVF_MEM_NTYPES     3
#define KVF_MEM_IPC_HANDLE 64

/* A set of memory types, one bit per kvf_mem_type_t. 0 means unknown:
 * the functions taking a mask then look each address up. */
typedef unsigned kvf_mem_mask_t;
#define KVF_MEM_BIT(_type) (1u << (unsigned)(_type))

/* A registered range as the engine records it and describes it to peers
 * (kvf_region_h of the public API). */
struct kvf_region {
    uint64_t addr;
    uint64_t len;
    kvf_mem_type_t type;
    int device;
    /* exported for same-host peers (CUDA IPC): the handle of the
     * allocation holding the region and addr's offset in it */
    int ipc;
    uint64_t ipc_off;
    unsigned char ipc_handle[KVF_MEM_IPC_HANDLE];
};
typedef struct kvf_region kvf_mem_region_t;

/* Per-connection staging state for socket I/O of non-host memory;
 * created on first need, freed with kvf_mem_stage_free(). */
typedef struct kvf_mem_stage kvf_mem_stage_t;

/* One memory type. NULL entries: the type has nothing to do there. */
typedef struct kvf_mem_ops {
    kvf_mem_type_t type;
    const char *name;
    /* kvf_mem_alloc's allocator (NULL: KVF_ERR_UNAVAILABLE) */
    kvf_status_t (*alloc)(size_t len, int device, void **ptr_p);
    /* KVF_ERR_NOT_FOUND when ptr is not one of this type's allocations */
    kvf_status_t (*free)(void *ptr);
    /* Records a range the engine registers (checked against its
     * allocation); registrations nest. */
    kvf_status_t (*reg)(uint64_t addr, uint64_t len, int device);
    void (*dereg)(uint64_t addr, uint64_t len);
    /* Exports the allocation holding addr to same-host processes. */
    kvf_status_t (*export_ipc)(uint64_t addr,
                               unsigned char handle[KVF_MEM_IPC_HANDLE],
                               uint64_t *offset_p);
    /* Copies len bytes when either side is memory of this type. */
    kvf_status_t (*copy)(void *dst, const void *src, size_t len);
    /* Socket I/O of a vector some bytes of which are memory of this type
     * (the rest host memory), like kvf_sock_readv_all / writev_all. */
    kvf_status_t (*stage_readv)(kvf_mem_stage_t **stage_p, int fd,
                                struct iovec *iov, size_t iovcnt,
                                uint64_t deadline_ms);
    kvf_status_t (*stage_writev)(kvf_mem_stage_t **stage_p, int fd,
                                 struct iovec *iov, size_t iovcnt,
                                 uint64_t deadline_ms);
    /* kvf_checksum of a registered range of this type. */
    kvf_status_t (*hash)(kvf_mem_stage_t **stage_p, uint64_t addr, uint64_t len,
                         uint64_t *hash_p, uint64_t deadline_ms);
} kvf_mem_ops_t;

/* The table of `type`; NULL for an unknown type. */
const kvf_mem_ops_t *kvf_mem_ops(kvf_mem_type_t type);

/* ---- allocation -------------------------------------------------------- */

/* kvf_mem_alloc's back end: KVF_MEM_HOST is memfd-backed shared memory
 * (mem/shm_mem.h), KVF_MEM_PINNED the same memory pinned, KVF_MEM_CUDA
 * device memory. */
kvf_status_t kvf_mem_type_alloc(kvf_mem_type_t type, size_t len, int device,
                                void **ptr_p);
/* Frees memory of any type from kvf_mem_type_alloc; KVF_ERR_NOT_FOUND
 * for any other pointer. */
kvf_status_t kvf_mem_type_free(void *ptr);

/* ---- registered ranges ------------------------------------------------- */

/* Records / forgets a range the engine registers. Host ranges need no
 * record; the others are checked (a GPU range must lie inside one
 * allocation of `device`, a pinned one must be page-locked). */
kvf_status_t kvf_mem_region_add(uint64_t addr, uint64_t len,
                                kvf_mem_type_t type, int device);
void kvf_mem_region_del(uint64_t addr, uint64_t len, kvf_mem_type_t type);
/* The type of the registered range holding addr, its device and the bytes
 * from addr to its end; KVF_MEM_HOST with *left_p = bytes up to the next
 * recorded range when addr is in none. Lock-free when no GPU range is
 * recorded. device_p may be NULL. */
kvf_mem_type_t kvf_mem_region_lookup(uint64_t addr, int *device_p,
                                     uint64_t *left_p);
/* Fills r->ipc, ipc_handle and ipc_off when r's type exports to
 * same-host processes (r->ipc stays 0 otherwise). */
void kvf_mem_region_export(kvf_mem_region_t *r);

/* ---- copies ----------------------------------------------------------- */

/* memcpy for memory of the types in `types` (0: looked up): a plain
 * memcpy when both sides are host memory. */
kvf_status_t kvf_mem_copy(void *dst, const void *src, size_t len,
                          kvf_mem_mask_t types);
/* 1 when p is host memory (not in a registered GPU range). */
int kvf_mem_is_host(const void *p);

/* Socket I/O of local memory of the types in `types` (0: looked up per
 * iovec): the plain socket calls when every type is host memory, else
 * staged through pinned buffers for the GPU bytes. iov is consumed. */
kvf_status_t kvf_mem_stage_readv(kvf_mem_stage_t **stage_p,
                                 kvf_mem_mask_t types, int fd,
                                 struct iovec *iov, size_t iovcnt,
                                 uint64_t deadline_ms);
kvf_status_t kvf_mem_stage_writev(kvf_mem_stage_t **stage_p,
                                  kvf_mem_mask_t types, int fd,
                                  struct iovec *iov, size_t iovcnt,
                                  uint64_t deadline_ms);
/* kvf_checksum of [addr, addr+len) of memory of `type`. */
kvf_status_t kvf_mem_hash(kvf_mem_stage_t **stage_p, kvf_mem_type_t type,
                          uint64_t addr, uint64_t len, uint64_t *hash_p,
                          uint64_t deadline_ms);
void kvf_mem_stage_free(kvf_mem_stage_t *stage);

/* Usable GPUs in this process (0 without a GPU or CUDA support). */
int kvf_mem_gpu_count(void);

#endif
