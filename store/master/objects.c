/*
 * Store master metadata and its rules: put (PUT_START, PUT_END), the
 * one-round-trip COMMIT with reservations, get, remove, exists, and an
 * object rebuilt from a node's inventory. Objects live in a chained hash
 * table by key (table.c); committed ones are also on an LRU list (a get
 * moves an object to the front), pending ones on a list of puts in
 * progress. Space comes from each node's TLSF allocator, replicas placed
 * by placement.c, room made by eviction.c; a remove or an eviction
 * releases an object through leases.c (its key goes at once, its space
 * when the last lease on it ends). The periodic tick (nodes.c) frees
 * those, reclaims puts never committed by their deadline, drops nodes
 * silent past their TTL and evicts down to the low watermark.
 *
 * Reservations: space allocated for a client's *next* put before it
 * knows the key (key NULL, not in the table, on the pending list with a
 * put deadline like any pending put). A COMMIT names the key, and the
 * reserved space becomes that object; one never committed is reclaimed
 * at its deadline like a zombie put, and a dead node's reservations go
 * with it. So a client that keeps a reservation puts with one round
 * trip (write, then COMMIT) instead of two.
 * Every function here runs with the master's lock held.
 */
#include "store/master/master_int.h"
#include "core/alloc.h"
#include "core/checksum.h"
#include "core/log.h"
#include "core/time.h"

#include <stdio.h>
#include <string.h>

/* May a new object take this key? A pending put past its deadline is
 * reclaimed on the way. */
static kvf_status_t kvf_m_key_free(kvf_master_t *m, const char *key,
                                   uint64_t now)
{
    kvf_mobj_t *o = kvf_m_find(m, key);

    if (o != NULL) {
        if (o->state == KVF_OBJ_COMMITTED) {
            return KVF_ERR_EXISTS;
        }
        if (o->deadline_ms > now) {
            return KVF_ERR_BUSY;
        }
        m->st.reclaimed++;
        kvf_m_obj_free(m, o);
    }
    return KVF_OK;
}

/* The limits of one request and of its client: a put larger than
 * max_put_share_pct of the largest pool (it would evict everything), a
 * client (every connection of one peer) past client_max_pending puts or
 * client_max_reserved_pct of the capacity in pending bytes, or every
 * client together past pending_max puts. KVF_ERR_QUOTA, nothing
 * evicted. */
static kvf_status_t kvf_m_limits(kvf_master_t *m, kvf_mclient_t *cl,
                                 const char *key, uint64_t size,
                                 unsigned replicas, uint64_t maxlen)
{
    char esc[KVF_LOG_KEY_MAX];
    uint64_t cap;

    if (size > maxlen / 100 * m->opts.max_put_share_pct +
                   maxlen % 100 * m->opts.max_put_share_pct / 100) {
        kvf_log_rl(KVF_LOG_WARN,
                   "put '%s': %lu bytes exceed max_put_share_pct=%u of the "
                   "largest pool (%lu): refused",
                   kvf_log_key(esc, sizeof(esc), key ? key : "(reservation)"),
                   (unsigned long)size, m->opts.max_put_share_pct,
                   (unsigned long)maxlen);
        return KVF_ERR_QUOTA;
    }
    if (m->npend >= m->opts.pending_max) {
        kvf_log_rl(KVF_LOG_WARN,
                   "%zu puts pending in all: over pending_max=%lu; refused",
                   m->npend, (unsigned long)m->opts.pending_max);
        return KVF_ERR_QUOTA;
    }
    if (cl == NULL) {
        return KVF_OK;
    }
    cap = kvf_m_capacity(m);
    if (cl->pending >= m->opts.client_max_pending ||
        cl->bytes + size * replicas >
            cap / 100 * m->opts.client_max_reserved_pct) {
        kvf_log_rl(KVF_LOG_WARN,
                   "a client holds %lu pending put(s) of %lu bytes: over "
                   "client_max_pending=%lu or client_max_reserved_pct=%u; "
                   "refused",
                   (unsigned long)cl->pending, (unsigned long)cl->bytes,
                   (unsigned long)m->opts.client_max_pending,
                   m->opts.client_max_reserved_pct);
        return KVF_ERR_QUOTA;
    }
    return KVF_OK;
}

/* Allocates replicas for a pending object (key NULL: a reservation). */
static kvf_status_t kvf_m_alloc_obj(kvf_master_t *m, kvf_mclient_t *cl,
                                    const char *key, uint64_t size,
                                    unsigned replicas, unsigned flags,
                                    uint64_t now, kvf_mobj_t **obj_p)
{
    char esc[KVF_LOG_KEY_MAX];
    kvf_mnode_t *cand[64], *n;
    uint64_t maxlen = 0;
    size_t ncand = 0;
    kvf_status_t st;
    kvf_mobj_t *o;

    for (n = m->nodes; n != NULL && ncand < 64; n = n->next) {
        if (n->rebuilding) {
            continue;
        }
        if (n->pa.len > maxlen) {
            maxlen = n->pa.len;
        }
        if (n->pa.len >= size) {
            cand[ncand++] = n;
        }
    }
    if (m->nodes == NULL) {
        return KVF_ERR_UNAVAILABLE;
    }
    if (ncand == 0) {
        kvf_log_rl(KVF_LOG_WARN,
                   "put '%s': %lu bytes exceed the largest pool (%lu)",
                   kvf_log_key(esc, sizeof(esc), key ? key : "(reservation)"),
                   (unsigned long)size, (unsigned long)maxlen);
        return KVF_ERR_MSG_TOO_LARGE;
    }
    st = kvf_m_limits(m, cl, key, size, replicas, maxlen);
    if (st != KVF_OK) {
        return st;
    }
    kvf_m_place_order(m, cand, ncand);
    o = kvf_calloc(1, sizeof(*o));
    if (o == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf_m_place(m, o, cand, ncand, size, replicas,
                key != NULL || (flags & KVF_STORE_REPLACE), now);
    if (o->nrep == 0) {
        kvf_free(o);
        m->st.errors++;
        return KVF_ERR_NO_SPACE;
    }
    o->size = size;
    o->flags = (uint8_t)(flags & (KVF_STORE_PIN | KVF_STORE_REPLACE));
    o->state = KVF_OBJ_PENDING;
    o->put_id = m->next_put_id++;
    o->deadline_ms = now + m->opts.put_timeout_ms;
    kvf_m_pend_add(m, o, cl);
    if (key == NULL) {
        m->reserved += kvf_m_obj_bytes(o);
    }
    if (key != NULL && kvf_m_obj_name(m, o, key) != KVF_OK) {
        kvf_m_obj_free(m, o);
        return KVF_ERR_NO_MEMORY;
    }
    *obj_p = o;
    return KVF_OK;
}

kvf_status_t kvf_m_put_start(kvf_master_t *m, kvf_mclient_t *cl,
                             const char *key, uint64_t size, unsigned replicas,
                             unsigned flags, kvf_mobj_t **obj_p)
{
    uint64_t now = kvf_time_ms();
    kvf_status_t st;

    if (replicas == 0) {
        replicas = m->opts.replicas;
    }
    if (replicas > KVF_STORE_REPLICA_MAX) {
        return KVF_ERR_INVALID_PARAM;
    }
    st = kvf_m_key_free(m, key, now);
    if (st == KVF_ERR_EXISTS && (flags & KVF_STORE_REPLACE)) {
        /* unnamed until its commit replaces the object (kvf_m_commit) */
        return kvf_m_alloc_obj(m, cl, NULL, size, replicas, flags, now, obj_p);
    }
    if (st != KVF_OK) {
        return st;
    }
    return kvf_m_alloc_obj(m, cl, key, size, replicas, flags, now, obj_p);
}

kvf_status_t kvf_m_reserve(kvf_master_t *m, kvf_mclient_t *cl, uint64_t size,
                           unsigned replicas, kvf_mobj_t **obj_p)
{
    if (replicas == 0) {
        replicas = m->opts.replicas;
    }
    if (replicas > KVF_STORE_REPLICA_MAX || size == 0 ||
        size > KVF_STORE_RESV_MAX) {
        return KVF_ERR_INVALID_PARAM;
    }
    /* under pressure, no reservations: they would crowd out objects */
    if ((double)(kvf_m_held(m) + size * replicas) >
        m->opts.high_watermark * (double)kvf_m_capacity(m)) {
        return KVF_ERR_NO_SPACE;
    }
    return kvf_m_alloc_obj(m, cl, NULL, size, replicas, 0, kvf_time_ms(),
                           obj_p);
}

/* Commits (mask != 0) or aborts the pending object o. */
static kvf_status_t kvf_m_obj_commit(kvf_master_t *m, kvf_mobj_t *o,
                                     uint64_t checksum, unsigned mask)
{
    unsigned i, k = 0;

    mask &= (1u << o->nrep) - 1;
    if (mask == 0) {
        m->st.aborted++;
        kvf_m_obj_free(m, o);
        return KVF_OK;
    }
    for (i = 0; i < o->nrep; i++) {
        if (mask & (1u << i)) {
            o->rep[k++] = o->rep[i];
        } else {
            kvf_pa_free(&o->rep[i].node->pa, o->rep[i].blk);
        }
    }
    o->nrep = (uint8_t)k;
    o->checksum = checksum;
    kvf_m_pend_del(m, o);
    o->state = KVF_OBJ_COMMITTED;
    kvf_m_list_unlink(o);
    kvf_m_list_push(&m->lru, o);
    m->st.puts++;
    kvf_m_inv_add(m, o);
    m->hooks.tier_commit(m, o);
    kvf_m_evict_watermark(m, kvf_time_ms());
    return KVF_OK;
}

kvf_status_t kvf_m_put_end(kvf_master_t *m, const char *key, uint64_t put_id,
                           uint64_t checksum, unsigned mask)
{
    kvf_mobj_t *o = kvf_m_find(m, key);

    if (o == NULL || o->state != KVF_OBJ_PENDING || o->put_id != put_id) {
        /* a replacing put is unnamed until its commit */
        o = kvf_m_pfind(m, put_id);
        if (o != NULL && o->key == NULL && (o->flags & KVF_STORE_REPLACE)) {
            return kvf_m_commit(m, key, put_id, o->size, checksum, mask,
                                o->flags);
        }
        /* reclaimed after its deadline, or its node died */
        return KVF_ERR_STALE;
    }
    return kvf_m_obj_commit(m, o, checksum, mask);
}

kvf_status_t kvf_m_commit(kvf_master_t *m, const char *key, uint64_t put_id,
                          uint64_t size, uint64_t checksum, unsigned mask,
                          unsigned flags)
{
    kvf_mobj_t *o;
    kvf_status_t st;

    o = kvf_m_pfind(m, put_id);
    if (o == NULL || (o->key != NULL && strcmp(o->key, key) != 0)) {
        return KVF_ERR_STALE; /* reclaimed, its node died, or not ours */
    }
    if (o->key != NULL || (mask & ((1u << o->nrep) - 1)) == 0) {
        return kvf_m_obj_commit(m, o, checksum, mask); /* or abort */
    }
    /* a reservation becomes the object `key`: on a refusal it stays */
    if (o->size != size) {
        return KVF_ERR_INVALID_PARAM;
    }
    st = kvf_m_key_free(m, key, kvf_time_ms());
    if (st == KVF_ERR_EXISTS && (flags & KVF_STORE_REPLACE)) {
        /* the old object leaves the table in the same step the new one
         * enters it: readers see one or the other */
        m->st.removes++;
        kvf_m_release(m, kvf_m_find(m, key), 0);
        st = KVF_OK;
    }
    if (st == KVF_OK) {
        st = kvf_m_obj_name(m, o, key);
    }
    if (st != KVF_OK) {
        return st;
    }
    m->reserved -= kvf_m_obj_bytes(o);
    o->flags = (uint8_t)(flags & KVF_STORE_PIN);
    return kvf_m_obj_commit(m, o, checksum, mask);
}

kvf_status_t kvf_m_get(kvf_master_t *m, kvf_mclient_t *cl, const char *key,
                       kvf_mobj_t **obj_p, int *leased_p)
{
    kvf_mobj_t *o = kvf_m_find(m, key);

    if (o == NULL || o->state != KVF_OBJ_COMMITTED) {
        m->st.misses++;
        return (o == NULL) ? KVF_ERR_NO_KEY : KVF_ERR_NOT_READY;
    }
    if (!m->hooks.tier_usable(o)) {
        /* on disk only: its load failed or did not end in time */
        m->st.misses++;
        return KVF_ERR_NO_KEY;
    }
    m->st.hits++;
    *leased_p = kvf_m_lease_grant(m, cl, o, kvf_m_obj_bytes(o), kvf_time_ms());
    m->st.unleased += (*leased_p == 0);
    kvf_m_list_unlink(o);
    kvf_m_list_push(&m->lru, o);
    *obj_p = o;
    return KVF_OK;
}

kvf_status_t kvf_m_remove(kvf_master_t *m, const char *key)
{
    kvf_mobj_t *o = kvf_m_find(m, key);

    if (o == NULL) {
        return KVF_ERR_NO_KEY;
    }
    if (o->state != KVF_OBJ_COMMITTED) {
        return KVF_ERR_BUSY;
    }
    m->st.removes++;
    kvf_m_release(m, o, 1);
    return KVF_OK;
}

kvf_status_t kvf_m_exists(kvf_master_t *m, const char *key)
{
    kvf_mobj_t *o = kvf_m_find(m, key);

    if (o == NULL) {
        return KVF_ERR_NO_KEY;
    }
    return (o->state == KVF_OBJ_COMMITTED) ? KVF_OK : KVF_ERR_NOT_READY;
}

/* A committed object of one replica, blk on n, under e's key. */
kvf_mobj_t *kvf_m_rebuild_obj(kvf_master_t *m, const kvf_sm_inv_ent_t *e)
{
    kvf_mobj_t *o = kvf_calloc(1, sizeof(*o));

    if (o == NULL || kvf_m_obj_name(m, o, e->key) != KVF_OK) {
        kvf_free(o);
        return NULL;
    }
    o->size = e->size;
    o->checksum = e->checksum;
    o->inv_epoch = (e->flags & KVF_SM_INV_DISK) ? 0 : e->epoch;
    o->inv_seq = (e->flags & KVF_SM_INV_DISK) ? 0 : e->seq;
    o->flags = (uint8_t)(e->flags & KVF_STORE_PIN);
    o->state = KVF_OBJ_COMMITTED;
    o->put_id = m->next_put_id++;
    kvf_m_list_push(&m->lru, o);
    return o;
}
