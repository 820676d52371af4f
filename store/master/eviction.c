/*
 * The master's eviction: the coldest objects leave a node's pool when an
 * allocation does not fit there, and the whole store's when used space
 * passes the high watermark (down to the low one). Pinned, leased and
 * pending objects stay, so do objects a disk-tier operation reads; an
 * object with a disk copy goes to the disk tier (it stays in the table)
 * and only then, from the disk tier's own LRU, for good. Lock held.
 */
#include "store/master/master_int.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <stdio.h>
#include <string.h>

/* May o leave the pool now? Not pinned, not leased, and no tier
 * operation reading its pool bytes (a load filling them, a write-through
 * copying them to disk). Pass 0 also keeps objects whose disk copy is
 * not made yet (they would be lost); pass 1 takes them too. */
static int kvf_m_evictable(const kvf_master_t *m, const kvf_mobj_t *o,
                           uint64_t now, int pass)
{
    unsigned i;

    if (o->state != KVF_OBJ_COMMITTED || (o->flags & KVF_STORE_PIN) ||
        o->lease_until_ms > now || o->on_disk_list ||
        (pass == 0 && m->hooks.tier_uncopied(o))) {
        return 0;
    }
    for (i = 0; i < o->nrep; i++) {
        if (o->rep[i].loading || o->rep[i].dstate == KVF_D_WRITING) {
            return 0;
        }
    }
    return 1;
}

static int kvf_m_obj_on(const kvf_mobj_t *o, const kvf_mnode_t *n)
{
    unsigned i;

    for (i = 0; i < o->nrep; i++) {
        if (o->rep[i].node == n && o->rep[i].blk != NULL) {
            return 1;
        }
    }
    return 0;
}

/* o leaves the pool: to the disk tiers where it has a copy there (it
 * stays in the table, on the disk list), else for good. */
static void kvf_m_evict(kvf_master_t *m, kvf_mobj_t *o)
{
    char esc[KVF_LOG_KEY_MAX];

    if (m->hooks.tier_demote(m, o)) {
        return;
    }
    kvf_debug("evicting '%s' (%lu bytes)",
              kvf_log_key(esc, sizeof(esc), o->key), (unsigned long)o->size);
    m->st.evictions++;
    kvf_m_release(m, o, 0);
}

/* Allocates size bytes on n, evicting cold objects that live on n when
 * evict is set. NULL when it cannot. */
kvf_pa_block_t *kvf_m_alloc_on(kvf_master_t *m, kvf_mnode_t *n, uint64_t size,
                               int evict, uint64_t now)
{
    kvf_pa_block_t *b = kvf_pa_alloc(&n->pa, size);
    kvf_mobj_t *o, *prev;
    uint64_t freed = 0;
    int pass;

    if (b != NULL || !evict || size > n->pa.len) {
        return b;
    }
    /* where nodes must first forget an evicted object, its space comes
     * later: evict about `size` bytes, and this put goes elsewhere or
     * fails (KVF_ERR_NO_SPACE) rather than emptying the node; objects
     * that would be lost for want of a disk copy go last */
    for (pass = 0; pass < 2 && b == NULL && freed < size; pass++) {
        for (o = m->lru.lprev; o != &m->lru && b == NULL && freed < size;
             o = prev) {
            prev = o->lprev;
            if (!kvf_m_evictable(m, o, now, pass) || !kvf_m_obj_on(o, n)) {
                continue;
            }
            freed += (m->elect != NULL) ? o->size : 0;
            kvf_m_evict(m, o);
            b = kvf_pa_alloc(&n->pa, size);
        }
    }
    return b;
}

/* Evicts cold objects until used space is at most the low watermark. */
void kvf_m_evict_watermark(kvf_master_t *m, uint64_t now)
{
    uint64_t cap = kvf_m_capacity(m), used = kvf_m_used(m);
    kvf_mobj_t *o, *prev;

    if (cap == 0 || (double)used <= m->opts.high_watermark * (double)cap) {
        return;
    }
    for (o = m->lru.lprev; o != &m->lru; o = prev) {
        prev = o->lprev;
        if ((double)used <= m->opts.low_watermark * (double)cap) {
            break;
        }
        if (kvf_m_evictable(m, o, now, 0)) {
            used -= o->size < used ? o->size : used;
            kvf_m_evict(m, o);
            used = kvf_m_used(m);
        }
    }
}
