/*
 * TLSF-style allocator of node pool space (see pool_alloc.h): size-class
 * mapping, bin insert/remove with bitmaps, good-fit search, split and
 * immediate coalescing with address neighbours.
 */
#include "store/master/pool_alloc.h"
#include "core/alloc.h"

#include <string.h>

static int kvf_pa_log2(uint64_t v)
{
    return 63 - __builtin_clzll(v);
}

/* Bin of a block of u granules (u >= 1). */
static void kvf_pa_mapping(uint64_t u, int *fl_p, int *sl_p)
{
    int fl = kvf_pa_log2(u);

    *fl_p = fl;
    if (fl < KVF_PA_SL_BITS) {
        *sl_p = (int)(u - (1ull << fl));
    } else {
        *sl_p = (int)((u >> (fl - KVF_PA_SL_BITS)) & (KVF_PA_SL - 1));
    }
}

static void kvf_pa_bin_insert(kvf_pool_alloc_t *pa, kvf_pa_block_t *b)
{
    int fl, sl;

    kvf_pa_mapping(b->size / KVF_PA_GRANULE, &fl, &sl);
    b->free = 1;
    b->fprev = NULL;
    b->fnext = pa->bins[fl][sl];
    if (b->fnext != NULL) {
        b->fnext->fprev = b;
    }
    pa->bins[fl][sl] = b;
    pa->fl_map |= 1ull << fl;
    pa->sl_map[fl] |= 1u << sl;
    pa->nfree++;
}

static void kvf_pa_bin_remove(kvf_pool_alloc_t *pa, kvf_pa_block_t *b)
{
    int fl, sl;

    kvf_pa_mapping(b->size / KVF_PA_GRANULE, &fl, &sl);
    if (b->fprev != NULL) {
        b->fprev->fnext = b->fnext;
    } else {
        pa->bins[fl][sl] = b->fnext;
    }
    if (b->fnext != NULL) {
        b->fnext->fprev = b->fprev;
    }
    if (pa->bins[fl][sl] == NULL) {
        pa->sl_map[fl] &= ~(1u << sl);
        if (pa->sl_map[fl] == 0) {
            pa->fl_map &= ~(1ull << fl);
        }
    }
    b->free = 0;
    b->fprev = b->fnext = NULL;
    pa->nfree--;
}

kvf_status_t kvf_pa_init(kvf_pool_alloc_t *pa, uint64_t len)
{
    kvf_pa_block_t *b;

    memset(pa, 0, sizeof(*pa));
    pa->len = len - len % KVF_PA_GRANULE;
    if (pa->len == 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    b = kvf_calloc(1, sizeof(*b));
    if (b == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    b->size = pa->len;
    pa->head = b;
    pa->nblocks = 1;
    kvf_pa_bin_insert(pa, b);
    return KVF_OK;
}

void kvf_pa_fini(kvf_pool_alloc_t *pa)
{
    kvf_pa_block_t *b = pa->head, *next;

    while (b != NULL) {
        next = b->anext;
        kvf_free(b);
        b = next;
    }
    memset(pa, 0, sizeof(*pa));
}

/* First free block of a class >= (fl, sl), or NULL. */
static kvf_pa_block_t *kvf_pa_find(kvf_pool_alloc_t *pa, int fl, int sl)
{
    uint32_t smap;
    uint64_t fmap;

    if (fl >= KVF_PA_FL) {
        return NULL;
    }
    smap = (sl < KVF_PA_SL) ? pa->sl_map[fl] & (~0u << sl) : 0;
    if (smap == 0) {
        fmap = (fl + 1 < KVF_PA_FL) ? pa->fl_map & (~0ull << (fl + 1)) : 0;
        if (fmap == 0) {
            return NULL;
        }
        fl = __builtin_ctzll(fmap);
        smap = pa->sl_map[fl];
    }
    sl = __builtin_ctz(smap);
    return pa->bins[fl][sl];
}

kvf_pa_block_t *kvf_pa_alloc(kvf_pool_alloc_t *pa, uint64_t size)
{
    uint64_t u, want;
    kvf_pa_block_t *b, *rest;
    int fl, sl;

    if (size > pa->len) {
        return NULL;
    }
    u = (size + KVF_PA_GRANULE - 1) / KVF_PA_GRANULE;
    if (u == 0) {
        u = 1;
    }
    /* round up to the next class boundary so any block found fits */
    want = u;
    fl = kvf_pa_log2(u);
    if (fl >= KVF_PA_SL_BITS) {
        want = u + (1ull << (fl - KVF_PA_SL_BITS)) - 1;
    }
    kvf_pa_mapping(want, &fl, &sl);
    b = kvf_pa_find(pa, fl, sl);
    if (b == NULL) {
        /* the exact class may still hold a block that fits */
        kvf_pa_mapping(u, &fl, &sl);
        for (b = pa->bins[fl][sl]; b != NULL; b = b->fnext) {
            if (b->size >= u * KVF_PA_GRANULE) {
                break;
            }
        }
        if (b == NULL) {
            return NULL;
        }
    }
    kvf_pa_bin_remove(pa, b);
    if (b->size > u * KVF_PA_GRANULE) {
        rest = kvf_calloc(1, sizeof(*rest));
        if (rest != NULL) {
            rest->off = b->off + u * KVF_PA_GRANULE;
            rest->size = b->size - u * KVF_PA_GRANULE;
            rest->aprev = b;
            rest->anext = b->anext;
            if (b->anext != NULL) {
                b->anext->aprev = rest;
            }
            b->anext = rest;
            b->size = u * KVF_PA_GRANULE;
            pa->nblocks++;
            kvf_pa_bin_insert(pa, rest);
        }
        /* without memory for the split the whole block is handed out */
    }
    pa->used += b->size;
    return b;
}

/* A free block of `size` bytes at `off` linked after b (out of any bin
 * yet), or NULL without memory. */
static kvf_pa_block_t *kvf_pa_split_after(kvf_pool_alloc_t *pa,
                                          kvf_pa_block_t *b, uint64_t off,
                                          uint64_t size)
{
    kvf_pa_block_t *n = kvf_calloc(1, sizeof(*n));

    if (n == NULL) {
        return NULL;
    }
    n->off = off;
    n->size = size;
    n->aprev = b;
    n->anext = b->anext;
    if (b->anext != NULL) {
        b->anext->aprev = n;
    }
    b->anext = n;
    pa->nblocks++;
    return n;
}

kvf_pa_block_t *kvf_pa_alloc_at(kvf_pool_alloc_t *pa, kvf_pa_block_t *from,
                                uint64_t off, uint64_t size)
{
    uint64_t u = (size + KVF_PA_GRANULE - 1) / KVF_PA_GRANULE;
    kvf_pa_block_t *b, *mid, *tail;
    uint64_t end;

    if (u == 0) {
        u = 1;
    }
    end = off + u * KVF_PA_GRANULE;
    if (off % KVF_PA_GRANULE != 0 || end < off || end > pa->len) {
        return NULL;
    }
    b = (from != NULL && from->off <= off) ? from : pa->head;
    while (b != NULL && b->off + b->size <= off) {
        b = b->anext;
    }
    if (b == NULL || !b->free || b->off > off || b->off + b->size < end) {
        return NULL;
    }
    kvf_pa_bin_remove(pa, b);
    mid = b;
    if (off > b->off) {
        mid = kvf_pa_split_after(pa, b, off, b->off + b->size - off);
        if (mid == NULL) {
            kvf_pa_bin_insert(pa, b);
            return NULL;
        }
        b->size = off - b->off;
        kvf_pa_bin_insert(pa, b);
    }
    if (mid->off + mid->size > end) {
        tail = kvf_pa_split_after(pa, mid, end, mid->off + mid->size - end);
        if (tail == NULL) {
            /* the block is handed out whole, as kvf_pa_alloc does */
            pa->used += mid->size;
            return mid;
        }
        mid->size = end - mid->off;
        kvf_pa_bin_insert(pa, tail);
    }
    pa->used += mid->size;
    return mid;
}

/* Merges b's successor into b (both free, successor out of its bin). */
static void kvf_pa_absorb_next(kvf_pool_alloc_t *pa, kvf_pa_block_t *b)
{
    kvf_pa_block_t *n = b->anext;

    b->size += n->size;
    b->anext = n->anext;
    if (n->anext != NULL) {
        n->anext->aprev = b;
    }
    pa->nblocks--;
    kvf_free(n);
}

void kvf_pa_free(kvf_pool_alloc_t *pa, kvf_pa_block_t *b)
{
    kvf_pa_block_t *p;

    if (b == NULL || b->free) {
        return;
    }
    pa->used -= b->size;
    if (b->anext != NULL && b->anext->free) {
        kvf_pa_bin_remove(pa, b->anext);
        kvf_pa_absorb_next(pa, b);
    }
    p = b->aprev;
    if (p != NULL && p->free) {
        kvf_pa_bin_remove(pa, p);
        kvf_pa_absorb_next(pa, p);
        b = p;
    }
    kvf_pa_bin_insert(pa, b);
}

uint64_t kvf_pa_largest_free(const kvf_pool_alloc_t *pa)
{
    const kvf_pa_block_t *b;
    uint64_t best = 0;
    int fl, sl;

    if (pa->fl_map == 0) {
        return 0;
    }
    fl = kvf_pa_log2(pa->fl_map);
    sl = kvf_pa_log2(pa->sl_map[fl]);
    for (b = pa->bins[fl][sl]; b != NULL; b = b->fnext) {
        if (b->size > best) {
            best = b->size;
        }
    }
    return best;
}
