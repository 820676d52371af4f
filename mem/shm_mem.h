/*
 * Memory layer: shareable host memory (memfd), the KVF_MEM_HOST entry of
 * mem/mem.c. Included through mem/mem.h.
 *
 * kvf_shm_mem_alloc() backs an allocation with a memfd (hugetlb pages
 * when the system has them reserved, else normal pages with
 * MADV_HUGEPAGE) and records it in a process-wide table, so that the shm
 * transport can hand the file descriptor of an allocation to a peer of
 * the same host whose request touches a registered region inside it.
 * Memory that is not in this table is never exposed by fd; the shm
 * transport moves it through the target's own copies (see shm.h).
 *
 * mem/mem.c is its switch point; engine/memory.c (kvf_mem_alloc /
 * kvf_mem_free) the public front.
 */
#ifndef KVF_MEM_SHM_MEM_H
#define KVF_MEM_SHM_MEM_H
#if !defined(KVF_LAYER_MEM) && !defined(KVF_LAYER_TRANSPORT) && \
    !defined(KVF_LAYER_ENGINE) && !defined(KVF_TEST_INTERNALS)
#error "mem/shm_mem.h is mem/'s interface, for the transports and the engine"
#endif

#include <kvferry/status.h>

#include <stddef.h>
#include <stdint.h>

/* Allocates len bytes (rounded up to pages) of zeroed shareable memory.
 * Falls back to private anonymous memory (still usable everywhere, just
 * not shareable by fd) when memfd_create is refused. Owned by the caller,
 * released with kvf_shm_mem_free(). */
kvf_status_t kvf_shm_mem_alloc(size_t len, void **ptr_p);

/* Releases an allocation made by kvf_shm_mem_alloc(); ptr must be the
 * pointer it returned. KVF_ERR_NOT_FOUND (and nothing freed) otherwise.
 * Peers that mapped it keep their mapping (of pages no longer reachable
 * from this process) until they learn of the release (shm.h). */
kvf_status_t kvf_shm_mem_free(void *ptr);

/* One shareable allocation as the transport sees it. */
typedef struct kvf_shm_alloc_info {
    uint64_t id;    /* unique in this process, never reused */
    uint64_t base;  /* address in this process */
    uint64_t len;   /* mapped length */
    uint64_t asked; /* length asked for (<= len) */
    uint64_t unit;  /* page size of its memfd (mapping offsets align to it) */
} kvf_shm_alloc_info_t;

/* Finds the shareable allocation holding [addr, addr+len) entirely.
 * 0 and *info_p filled when found, -1 otherwise (also for fallback
 * allocations, which have no fd). */
int kvf_shm_mem_find(uint64_t addr, uint64_t len, kvf_shm_alloc_info_t *info_p);

/* A duplicate of the memfd of allocation id (caller closes it), or -1
 * when it was freed meanwhile. */
int kvf_shm_mem_dup_fd(uint64_t id, kvf_shm_alloc_info_t *info_p);

/* 1 while allocation id is alive. */
int kvf_shm_mem_alive(uint64_t id);

/* A host range was deregistered: bumps the epoch, so peers that map
 * part of it ask whether their mappings still stand (mem.c's dereg). */
void kvf_shm_mem_dereg(uint64_t addr, uint64_t len);

/* Bumped at every release and deregistration: peers compare it to know
 * when to ask which of their mappings died. */
uint64_t kvf_shm_mem_epoch(void);

/* Live allocations and their bytes (tests). */
void kvf_shm_mem_stats(long *count_p, uint64_t *bytes_p);

#endif
