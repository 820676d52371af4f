/*
 * The master's state, read: the object table's hash and look-up, the
 * intrusive lists objects sit on (LRU, pending, doomed, disk), and the
 * sums /status and the limits read (capacity, used, pending puts,
 * reservations, removing). Nothing here changes an object's fate; the
 * files above do (table.c writes the table, leases.c, eviction.c,
 * objects.c, nodes.c and tier.c decide). Lock held.
 */
#include "store/master/master_int.h"
#include "core/checksum.h"

#include <string.h>

#define KVF_M_HASH_SEED 0x6b766673746f7265ull

void kvf_m_list_init(kvf_mobj_t *s)
{
    s->lnext = s->lprev = s;
}

void kvf_m_list_unlink(kvf_mobj_t *o)
{
    if (o->lnext != NULL) {
        o->lnext->lprev = o->lprev;
        o->lprev->lnext = o->lnext;
        o->lnext = o->lprev = NULL;
    }
}

void kvf_m_list_push(kvf_mobj_t *s, kvf_mobj_t *o)
{
    o->lnext = s->lnext;
    o->lprev = s;
    s->lnext->lprev = o;
    s->lnext = o;
}

uint64_t kvf_m_hash(const char *key, size_t len)
{
    return kvf_hash64(key, len, KVF_M_HASH_SEED);
}

kvf_mobj_t *kvf_m_find(kvf_master_t *m, const char *key)
{
    size_t len = strlen(key);
    uint64_t h = kvf_m_hash(key, len);
    kvf_mobj_t *o;

    for (o = m->table[h & (m->nbuckets - 1)]; o != NULL; o = o->hnext) {
        if (o->hash == h && o->keylen == len && memcmp(o->key, key, len) == 0) {
            return o;
        }
    }
    return NULL;
}

uint64_t kvf_m_obj_bytes(const kvf_mobj_t *o)
{
    uint64_t b = 0;
    unsigned i;

    for (i = 0; i < o->nrep; i++) {
        b += (o->rep[i].blk != NULL) ? o->rep[i].blk->size : 0;
    }
    return b;
}

/* o leaves the LRU list it is on (the pool's or the disk tiers'). */
void kvf_m_obj_unlist(kvf_master_t *m, kvf_mobj_t *o)
{
    kvf_m_list_unlink(o);
    if (o->on_disk_list) {
        o->on_disk_list = 0;
        m->ndisk_only--;
    }
}

uint64_t kvf_m_capacity(const kvf_master_t *m)
{
    const kvf_mnode_t *n;
    uint64_t c = 0;

    for (n = m->nodes; n != NULL; n = n->next) {
        c += n->pa.len;
    }
    return c;
}

/* Bytes in allocated blocks, reservations included. */
uint64_t kvf_m_held(const kvf_master_t *m)
{
    const kvf_mnode_t *n;
    uint64_t u = 0;

    for (n = m->nodes; n != NULL; n = n->next) {
        u += n->pa.used;
    }
    return u;
}

uint64_t kvf_m_used(const kvf_master_t *m)
{
    uint64_t u = kvf_m_held(m), r = m->reserved + m->releasing;

    return u > r ? u - r : 0;
}

size_t kvf_m_pending(const kvf_master_t *m)
{
    const kvf_mobj_t *o;
    size_t n = 0;

    for (o = m->pending.lnext; o != &m->pending; o = o->lnext) {
        n += (o->key != NULL);
    }
    return n;
}

size_t kvf_m_reservations(const kvf_master_t *m)
{
    const kvf_mobj_t *o;
    size_t n = 0;

    for (o = m->pending.lnext; o != &m->pending; o = o->lnext) {
        n += (o->key == NULL);
    }
    return n;
}

size_t kvf_m_removing(const kvf_master_t *m)
{
    const kvf_mobj_t *o;
    size_t n = 0;

    for (o = m->doomed.lnext; o != &m->doomed; o = o->lnext) {
        n++;
    }
    return n;
}
