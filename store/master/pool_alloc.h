/*
 * Space allocator for one node's pool, kept on the master (the pool's
 * memory is never touched). Two-level segregated fits (TLSF): free blocks
 * sit in bins by size class (64 power-of-two classes x 16 linear
 * sub-classes, found through two bitmaps), a request takes the first
 * block of the smallest class guaranteed to fit (good fit in O(1)), the
 * remainder of a split goes back to its bin, and a freed block is merged
 * at once with free neighbours (blocks are also linked in address order),
 * so free space stays in as few, large pieces as the live objects allow.
 * Sizes are rounded up to KVF_PA_GRANULE bytes.
 */
#ifndef KVF_STORE_POOL_ALLOC_H
#define KVF_STORE_POOL_ALLOC_H
#if !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "store/master/pool_alloc.h is private to store/: use <kvferry/store.h>"
#endif

#include <kvferry/status.h>

#include <stddef.h>
#include <stdint.h>

#define KVF_PA_GRANULE 64u
#define KVF_PA_FL      64
#define KVF_PA_SL_BITS 4
#define KVF_PA_SL      (1 << KVF_PA_SL_BITS)

typedef struct kvf_pa_block {
    uint64_t off;                       /* from the pool's base */
    uint64_t size;                      /* bytes, a multiple of the granule */
    struct kvf_pa_block *aprev, *anext; /* address order */
    struct kvf_pa_block *fprev, *fnext; /* its bin, when free */
    int free;
} kvf_pa_block_t;

typedef struct kvf_pool_alloc {
    uint64_t len;  /* usable bytes (multiple of the granule) */
    uint64_t used; /* bytes in allocated blocks */
    size_t nblocks;
    size_t nfree;
    uint64_t fl_map;
    uint32_t sl_map[KVF_PA_FL];
    kvf_pa_block_t *bins[KVF_PA_FL][KVF_PA_SL];
    kvf_pa_block_t *head; /* lowest address */
} kvf_pool_alloc_t;

/* One free block covering [0, len) rounded down to the granule. */
kvf_status_t kvf_pa_init(kvf_pool_alloc_t *pa, uint64_t len);
/* Frees every block (allocated ones included: the pool is forgotten). */
void kvf_pa_fini(kvf_pool_alloc_t *pa);

/* A block of at least size bytes (size 0 takes one granule), or NULL. */
kvf_pa_block_t *kvf_pa_alloc(kvf_pool_alloc_t *pa, uint64_t size);
void kvf_pa_free(kvf_pool_alloc_t *pa, kvf_pa_block_t *b);
/* The block [off, off + size) exactly (size rounded up to the granule;
 * off must be a multiple of it), for a leader that rebuilds a node's
 * objects at the offsets they hold; NULL if any byte of it is not free.
 * from: a block at or before off where the search may start (NULL: the
 * lowest), so that ascending offsets cost one walk in all. */
kvf_pa_block_t *kvf_pa_alloc_at(kvf_pool_alloc_t *pa, kvf_pa_block_t *from,
                                uint64_t off, uint64_t size);

/* Largest free block (bytes), for fragmentation figures. */
uint64_t kvf_pa_largest_free(const kvf_pool_alloc_t *pa);

#endif
