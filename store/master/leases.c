/*
 * The master's read leases, as they hold an object's space: a committed
 * object that leaves (a remove, an eviction) loses its key at once but
 * keeps its space on the doomed list while a read lease is left on it,
 * a disk-tier operation reads it, or (with inventories) a node has not
 * yet forgotten it; it is freed when the last of these ends. Lease
 * grants and each client's lease budget are in limits.c. Lock held.
 */
#include "store/master/master_int.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <stdio.h>
#include <string.h>

/* Committed object o leaves (a remove, an eviction): its key goes now
 * (gets miss, a new put may take it); its space once no read lease is
 * left on it and, where nodes record inventories, once each of its
 * nodes has forgotten it (so no new put writes over bytes a node could
 * still report to a new leader). Until then it waits on the doomed
 * list, freed by kvf_m_released or the reaper. wait: the frame served
 * is answered only once the nodes forgot o (a remove). */
void kvf_m_release(kvf_master_t *m, kvf_mobj_t *o, int wait)
{
    kvf_mobj_t **pp;

    for (pp = &m->table[o->hash & (m->nbuckets - 1)]; !o->shadow && *pp != NULL;
         pp = &(*pp)->hnext) {
        if (*pp == o) {
            *pp = o->hnext;
            break;
        }
    }
    o->hnext = NULL;
    kvf_m_obj_unlist(m, o);
    m->hooks.tier_forget(m, o); /* its disk copies go now */
    o->inv_rel = kvf_m_inv_del(m, o, wait);
    if (o->inv_rel > 0) {
        o->rel_bytes = kvf_m_obj_bytes(o);
        m->releasing += o->rel_bytes;
    }
    if (kvf_m_doomed_done(o, kvf_time_ms())) {
        kvf_m_obj_free(m, o);
        return;
    }
    o->released = 1;
    kvf_m_list_push(&m->doomed, o);
}

int kvf_m_doomed_done(const kvf_mobj_t *o, uint64_t now)
{
    return o->inv_rel == 0 && o->tier_busy == 0 && o->lease_until_ms <= now;
}

void kvf_m_released(kvf_master_t *m, kvf_mobj_t *o)
{
    if (o->inv_rel == 0 || --o->inv_rel > 0) {
        return;
    }
    m->releasing -= o->rel_bytes;
    o->rel_bytes = 0;
    if (kvf_m_doomed_done(o, kvf_time_ms())) {
        kvf_m_obj_free(m, o);
    }
}
