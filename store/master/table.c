/*
 * The master's object table, written: an object named (put in the
 * table by key), the pending index (puts in progress by put id, counted
 * against their client), and an object freed (out of the table, its
 * lists and leases, its blocks back to their allocators). Below the
 * rules that decide an object's fate (leases.c, eviction.c, objects.c);
 * state.c has the reads. Lock held.
 */
#include "store/master/master_int.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <stdio.h>
#include <string.h>

static size_t kvf_m_pslot(const kvf_master_t *m, uint64_t put_id)
{
    return (size_t)((put_id * 0x9e3779b97f4a7c15ull) >> 24) &
           (m->npbuckets - 1);
}

static void kvf_m_pgrow(kvf_master_t *m)
{
    size_t old = m->npbuckets, i;
    kvf_mobj_t **t = kvf_calloc(old * 2, sizeof(*t)), **ot = m->ptable, *o;

    if (t == NULL) {
        return; /* longer chains, still correct */
    }
    m->ptable = t;
    m->npbuckets = old * 2;
    for (i = 0; i < old; i++) {
        while ((o = ot[i]) != NULL) {
            ot[i] = o->pnext;
            o->pnext = t[kvf_m_pslot(m, o->put_id)];
            t[kvf_m_pslot(m, o->put_id)] = o;
        }
    }
    kvf_free(ot);
}

/* o becomes pending: on the list, in the put id index, counted against
 * its client. */
void kvf_m_pend_add(kvf_master_t *m, kvf_mobj_t *o, kvf_mclient_t *cl)
{
    size_t b = kvf_m_pslot(m, o->put_id);

    kvf_m_list_push(&m->pending, o);
    o->pnext = m->ptable[b];
    m->ptable[b] = o;
    if (++m->npend > m->npbuckets) {
        kvf_m_pgrow(m);
    }
    o->owner = cl;
    if (cl != NULL) {
        o->owner_bytes = kvf_m_obj_bytes(o);
        kvf_m_client_ref(cl);
        cl->pending++;
        cl->bytes += o->owner_bytes;
    }
}

/* o stops being pending (committed or freed). */
void kvf_m_pend_del(kvf_master_t *m, kvf_mobj_t *o)
{
    kvf_mobj_t **pp;

    for (pp = &m->ptable[kvf_m_pslot(m, o->put_id)]; *pp != NULL;
         pp = &(*pp)->pnext) {
        if (*pp == o) {
            *pp = o->pnext;
            m->npend--;
            break;
        }
    }
    o->pnext = NULL;
    if (o->owner != NULL) {
        o->owner->pending--;
        o->owner->bytes -= o->owner_bytes;
        kvf_m_client_unref(m, o->owner);
        o->owner = NULL;
    }
}

kvf_mobj_t *kvf_m_pfind(kvf_master_t *m, uint64_t put_id)
{
    kvf_mobj_t *o;

    for (o = m->ptable[kvf_m_pslot(m, put_id)]; o != NULL; o = o->pnext) {
        if (o->put_id == put_id) {
            return o;
        }
    }
    return NULL;
}

static void kvf_m_grow(kvf_master_t *m)
{
    size_t nb = m->nbuckets * 2, i;
    kvf_mobj_t **t, *o;

    t = kvf_calloc(nb, sizeof(*t));
    if (t == NULL) {
        return; /* longer chains, still correct */
    }
    for (i = 0; i < m->nbuckets; i++) {
        while ((o = m->table[i]) != NULL) {
            m->table[i] = o->hnext;
            o->hnext = t[o->hash & (nb - 1)];
            t[o->hash & (nb - 1)] = o;
        }
    }
    kvf_free(m->table);
    m->table = t;
    m->nbuckets = nb;
}

/* Puts a key on an object of the pending list (in the table). */
kvf_status_t kvf_m_obj_name(kvf_master_t *m, kvf_mobj_t *o, const char *key)
{
    o->key = kvf_strdup(key);
    if (o->key == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    o->keylen = strlen(key);
    o->hash = kvf_m_hash(key, o->keylen);
    o->hnext = m->table[o->hash & (m->nbuckets - 1)];
    m->table[o->hash & (m->nbuckets - 1)] = o;
    m->nobjs++;
    if (m->nobjs > m->nbuckets) {
        kvf_m_grow(m);
    }
    return KVF_OK;
}

/* Unlinks o from the table and lists, frees its space and itself. */
void kvf_m_obj_free(kvf_master_t *m, kvf_mobj_t *o)
{
    kvf_mobj_t **pp;
    unsigned i;

    for (pp = &m->table[o->hash & (m->nbuckets - 1)];
         o->key != NULL && *pp != NULL; pp = &(*pp)->hnext) {
        if (*pp == o) {
            *pp = o->hnext;
            break;
        }
    }
    kvf_m_obj_unlist(m, o);
    kvf_m_lease_drop(m, o);
    if (o->state == KVF_OBJ_PENDING) {
        kvf_m_pend_del(m, o);
    }
    if (o->key == NULL) {
        m->reserved -= kvf_m_obj_bytes(o);
    }
    for (i = 0; i < o->nrep; i++) {
        if (o->rep[i].blk != NULL) {
            kvf_pa_free(&o->rep[i].node->pa, o->rep[i].blk);
        }
        if (o->rep[i].dblk != NULL) {
            kvf_pa_free(&o->rep[i].node->dpa, o->rep[i].dblk);
        }
    }
    if (o->key != NULL && !o->shadow) {
        m->nobjs--;
    }
    kvf_free(o->key);
    kvf_free(o);
}
