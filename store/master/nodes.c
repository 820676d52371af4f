/*
 * The master's nodes: registration (the claim checked against the node's
 * engine, a live segment never taken over by another instance), the
 * drop of a node silent past its TTL (its replicas go, objects left with
 * none are lost), heartbeats, the rebuild of objects from a node's report
 * (inventory entries in its pool, disk tier entries), the periodic tick
 * (reclaims, doomed objects, node TTLs, the watermark) and the clearing
 * of a term. Lock held unless said.
 */
#include "store/master/master_int.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <kvferry/engine.h>

#include <stdio.h>
#include <string.h>

/* Is [base, base+len) inside one region the node's engine registered? */
static kvf_status_t kvf_m_verify_node(kvf_master_t *m, const char *segment,
                                      uint64_t base, uint64_t len)
{
    char esc[KVF_LOG_KEY_MAX];
    kvf_status_t st;
    kvf_peer_h peer;
    uint64_t addr;
    size_t rlen, i;

    st = kvf_peer_open(m->engine, segment, &peer);
    if (st != KVF_OK) {
        kvf_log_rl(KVF_LOG_WARN, "node %s: cannot reach its segment: %s",
                   kvf_log_key(esc, sizeof(esc), segment), kvf_status_str(st));
        return st;
    }
    st = KVF_ERR_OUT_OF_BOUNDS;
    for (i = 0; kvf_peer_region(peer, i, &addr, &rlen, NULL) == KVF_OK; i++) {
        if (base >= addr && base - addr <= rlen &&
            len <= rlen - (base - addr)) {
            st = KVF_OK;
            break;
        }
    }
    kvf_peer_close(peer);
    if (st != KVF_OK) {
        kvf_log_rl(KVF_LOG_ERROR,
                   "node %s claims pool 0x%lx+%lu, which its segment does "
                   "not register: refused",
                   kvf_log_key(esc, sizeof(esc), segment), (unsigned long)base,
                   (unsigned long)len);
    }
    return st;
}

kvf_status_t kvf_m_node_claim(kvf_master_t *m, const kvf_sm_node_reg_t *q)
{
    if (!q->has_instance) {
        kvf_log_rl(KVF_LOG_ERROR,
                   "node %s registers in the older format (no instance "
                   "id): refused; upgrade the node",
                   q->segment);
        return KVF_ERR_VERSION;
    }
    if (q->pool_len < KVF_PA_GRANULE ||
        q->pool_addr + q->pool_len < q->pool_addr) {
        return KVF_ERR_INVALID_PARAM;
    }
    return kvf_m_verify_node(m, q->segment, q->pool_addr, q->pool_len);
}

void kvf_m_report_page(kvf_master_t *m, kvf_mnode_t *n, uint32_t count,
                       size_t refused)
{
    if (count == 0 && n->rebuilding) {
        n->rebuilding = 0;
        kvf_info("node %s: inventory rebuilt, %zu object(s) in all", n->segment,
                 m->nobjs);
    }
    if (refused > 0) {
        kvf_warn("node %s: %zu inventory entr%s refused", n->segment, refused,
                 refused == 1 ? "y" : "ies");
    }
}

/* A node's record and its allocators. */
static void kvf_m_node_free(kvf_mnode_t *n)
{
    kvf_pa_fini(&n->pa);
    if (n->dpa.len > 0) {
        kvf_pa_fini(&n->dpa);
    }
    kvf_free(n);
}

void kvf_m_clear(kvf_master_t *m)
{
    kvf_mnode_t *n;
    size_t i;

    for (i = 0; i < m->nbuckets; i++) {
        while (m->table[i] != NULL) {
            kvf_m_obj_free(m, m->table[i]);
        }
    }
    while (m->doomed.lnext != &m->doomed) {
        kvf_m_obj_free(m, m->doomed.lnext);
    }
    /* reservations: on the pending list only */
    while (m->pending.lnext != &m->pending) {
        kvf_m_obj_free(m, m->pending.lnext);
    }
    while ((n = m->nodes) != NULL) {
        m->nodes = n->next;
        kvf_m_node_free(n);
    }
    m->nnodes = 0;
    m->releasing = 0;
    kvf_m_inv_clear(m);
}

/* A replica of size bytes of o is dropped: no longer released space. */
static void kvf_m_rel_drop(kvf_master_t *m, kvf_mobj_t *o, uint64_t bytes)
{
    if (o->rel_bytes >= bytes) {
        o->rel_bytes -= bytes;
        m->releasing -= bytes;
    }
}

/* Drops node n: its replicas go, objects left with none are lost. */
static void kvf_m_node_drop(kvf_master_t *m, kvf_mnode_t *n, const char *why)
{
    kvf_mnode_t **pp;
    kvf_mobj_t *o, *next;
    size_t i, lost = 0, dropped = 0;
    char esc[KVF_LOG_KEY_MAX];
    unsigned r, k;

    for (i = 0; i <= m->nbuckets; i++) {
        /* every bucket, then the removed objects awaiting their lease */
        o = (i < m->nbuckets) ? m->table[i] : m->doomed.lnext;
        for (; o != NULL && o != &m->doomed; o = next) {
            next = (i < m->nbuckets) ? o->hnext : o->lnext;
            for (r = 0, k = 0; r < o->nrep; r++) {
                if (o->rep[r].node != n) {
                    o->rep[k++] = o->rep[r];
                } else {
                    dropped++;
                    kvf_m_rel_drop(m, o, o->rep[r].blk ? o->rep[r].blk->size
                                                       : 0);
                }
            }
            o->nrep = (uint8_t)k;
            if (k > 0) {
                kvf_m_tier_relist(m, o); /* maybe on disk only now */
                continue;
            }
            if (o->inv_rel > 0 || (o->released && o->tier_busy > 0)) {
                continue; /* freed once its other nodes answered */
            }
            lost += (o->state == KVF_OBJ_COMMITTED && i < m->nbuckets);
            if (o->tier_busy > 0) {
                kvf_m_release(m, o, 0); /* freed when the answers come */
            } else {
                kvf_m_obj_free(m, o);
            }
        }
    }
    /* reservations (not in the table) */
    for (o = m->pending.lnext; o != &m->pending; o = next) {
        next = o->lnext;
        if (o->key != NULL) {
            continue;
        }
        for (r = 0, k = 0; r < o->nrep; r++) {
            if (o->rep[r].node != n) {
                o->rep[k++] = o->rep[r];
            } else {
                m->reserved -= o->rep[r].blk->size;
                dropped++;
            }
        }
        o->nrep = (uint8_t)k;
        if (k == 0) {
            kvf_m_obj_free(m, o);
        }
    }
    for (pp = &m->nodes; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == n) {
            *pp = n->next;
            break;
        }
    }
    m->nnodes--;
    m->st.nodes_lost++;
    m->st.objects_lost += lost;
    kvf_warn("node %s (gen %lu) dropped: %s; %zu replica(s) dropped, "
             "%zu object(s) lost",
             kvf_log_key(esc, sizeof(esc), n->segment), (unsigned long)n->gen,
             why, dropped, lost);
    kvf_m_node_free(n);
}

/* May a registration of `segment` by `instance` replace the records
 * that exist? The same instance may (a node registering again); another
 * one only once the live record's ttl has run out (a restarted node),
 * never while it lives (a hijack). KVF_OK after dropping the records it
 * replaces, KVF_ERR_EXISTS (logged) to refuse. */
static kvf_status_t kvf_m_node_admit(kvf_master_t *m, const char *segment,
                                     uint64_t uid,
                                     const unsigned char *instance)
{
    uint64_t now = kvf_time_ms();
    char esc[KVF_LOG_KEY_MAX];
    kvf_mnode_t *n, *next;
    int same;

    for (n = m->nodes; n != NULL; n = n->next) {
        same = memcmp(n->instance, instance, KVF_SM_INSTANCE_LEN) == 0;
        if (!same && strcmp(n->segment, segment) == 0 &&
            n->last_hb_ms + m->opts.node_ttl_ms > now) {
            kvf_log_rl(KVF_LOG_WARN,
                       "registration of live node %s from another "
                       "instance: refused",
                       kvf_log_key(esc, sizeof(esc), segment));
            return KVF_ERR_EXISTS;
        }
    }
    /* a node registering again (or a new instance on the segment of an
     * expired one) replaces the old record: its space is new, its old
     * replicas gone */
    for (n = m->nodes; n != NULL; n = next) {
        next = n->next;
        same = memcmp(n->instance, instance, KVF_SM_INSTANCE_LEN) == 0;
        if ((same && n->uid == uid) || strcmp(n->segment, segment) == 0) {
            kvf_m_node_drop(m, n, "registered again");
        }
    }
    return KVF_OK;
}

kvf_status_t kvf_m_node_register(kvf_master_t *m, const char *segment,
                                 uint64_t uid, const unsigned char *instance,
                                 uint64_t base, uint64_t len,
                                 const char *inv_addr, uint64_t disk_len,
                                 uint64_t *gen_p)
{
    char esc[KVF_LOG_KEY_MAX];
    kvf_mnode_t *n;
    kvf_status_t status;

    status = kvf_m_node_admit(m, segment, uid, instance);
    if (status != KVF_OK) {
        return status;
    }
    n = kvf_calloc(1, sizeof(*n));
    if (n == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_pa_init(&n->pa, len);
    if (status == KVF_OK) {
        status = kvf_m_tier_node_init(m, n, disk_len, inv_addr);
        if (status != KVF_OK) {
            kvf_pa_fini(&n->pa);
        }
    }
    if (status != KVF_OK) {
        kvf_free(n);
        return status;
    }
    n->uid = uid;
    memcpy(n->instance, instance, KVF_SM_INSTANCE_LEN);
    n->gen = ++m->next_gen;
    n->base = base;
    n->last_hb_ms = kvf_time_ms();
    snprintf(n->segment, sizeof(n->segment), "%s", segment);
    snprintf(n->inv_addr, sizeof(n->inv_addr), "%s", inv_addr);
    /* its report (inventory, disk tier) comes next */
    n->rebuilding = inv_addr[0] != '\0' && (m->elect != NULL || n->tier_on);
    n->next = m->nodes;
    m->nodes = n;
    m->nnodes++;
    kvf_info("node %s registered: pool 0x%lx+%lu, gen %lu",
             kvf_log_key(esc, sizeof(esc), segment), (unsigned long)base,
             (unsigned long)len, (unsigned long)n->gen);
    *gen_p = n->gen;
    return KVF_OK;
}

kvf_status_t kvf_m_heartbeat(kvf_master_t *m, uint64_t uid, uint64_t gen,
                             uint64_t epoch)
{
    kvf_mnode_t *n;

    if (epoch != m->epoch) {
        return KVF_ERR_STALE;
    }
    for (n = m->nodes; n != NULL; n = n->next) {
        if (n->uid == uid && n->gen == gen) {
            n->last_hb_ms = kvf_time_ms();
            return KVF_OK;
        }
    }
    return KVF_ERR_STALE;
}

void kvf_m_tick(kvf_master_t *m)
{
    uint64_t now = kvf_time_ms();
    kvf_mnode_t *n, *nnext;
    kvf_mobj_t *o, *prev;
    char esc[KVF_LOG_KEY_MAX];
    size_t reclaimed = 0;

    /* oldest last, every deadline put_timeout_ms after its start: the
     * expired ones are at the tail */
    for (o = m->pending.lprev; o != &m->pending && o->deadline_ms <= now;
         o = prev) {
        prev = o->lprev;
        if (o->key == NULL) {
            /* a client's unused reservation: expected, not counted */
            kvf_m_obj_free(m, o);
            continue;
        }
        if (reclaimed++ == 0) {
            kvf_log_key(esc, sizeof(esc), o->key);
        }
        m->st.reclaimed++;
        kvf_m_obj_free(m, o);
    }
    if (reclaimed > 0) {
        kvf_warn("%zu put(s) not committed within %lu ms reclaimed "
                 "(first: '%s')",
                 reclaimed, (unsigned long)m->opts.put_timeout_ms, esc);
    }
    kvf_m_lease_expire(m, now);
    for (o = m->doomed.lprev; o != &m->doomed; o = prev) {
        prev = o->lprev;
        if (kvf_m_doomed_done(o, now)) {
            kvf_m_obj_free(m, o); /* removed, its last lease over */
        }
    }
    for (n = m->nodes; n != NULL; n = nnext) {
        nnext = n->next;
        if (n->last_hb_ms + m->opts.node_ttl_ms <= now) {
            kvf_m_node_drop(m, n, "no heartbeat within its ttl");
        }
    }
    kvf_m_evict_watermark(m, now);
}

kvf_mnode_t *kvf_m_node_find(kvf_master_t *m, uint64_t uid, uint64_t gen)
{
    kvf_mnode_t *n;

    for (n = m->nodes; n != NULL; n = n->next) {
        if (n->uid == uid && n->gen == gen) {
            return n;
        }
    }
    return NULL;
}

/* A replica of o at offset off of node n? */
static int kvf_m_rep_at(const kvf_mobj_t *o, const kvf_mnode_t *n, uint64_t off)
{
    unsigned i;

    for (i = 0; i < o->nrep; i++) {
        if (o->rep[i].node == n && o->rep[i].blk != NULL &&
            o->rep[i].blk->off == off) {
            return 1;
        }
    }
    return 0;
}

/* Was o committed before the entry e (its epoch, then its seq)? */
static int kvf_m_rebuild_older(const kvf_mobj_t *o, const kvf_sm_inv_ent_t *e)
{
    return o->inv_epoch < e->epoch ||
           (o->inv_epoch == e->epoch && o->inv_seq < e->seq);
}

static kvf_status_t kvf_m_rebuild_new(kvf_master_t *m, kvf_mnode_t *n,
                                      kvf_pa_block_t *blk,
                                      const kvf_sm_inv_ent_t *e)
{
    kvf_mobj_t *o = kvf_m_rebuild_obj(m, e);

    if (o == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    o->nrep = 1;
    o->rep[0] = (kvf_mrep_t){.node = n, .blk = blk};
    return KVF_OK;
}

kvf_status_t kvf_m_rebuild_add(kvf_master_t *m, kvf_mnode_t *n,
                               const kvf_sm_inv_ent_t *e, kvf_pa_block_t **hint)
{
    kvf_mobj_t *o = kvf_m_find(m, e->key);
    char esc[KVF_LOG_KEY_MAX];
    kvf_pa_block_t *blk;

    if (e->flags & KVF_SM_INV_DISK) {
        return kvf_m_tier_rebuild(m, n, e, hint);
    }
    if (o != NULL && o->state == KVF_OBJ_COMMITTED &&
        kvf_m_rep_at(o, n, e->off)) {
        return KVF_OK; /* known already: a report sent again */
    }
    if (o != NULL && o->state == KVF_OBJ_COMMITTED &&
        (o->size != e->size || o->checksum != e->checksum) &&
        kvf_m_rebuild_older(o, e)) {
        /* an older commit of the key (removed or evicted, then put
         * again, with its entry still on a node): the newer one wins,
         * and the nodes forget the older one */
        kvf_m_release(m, o, 0);
        o = NULL;
        *hint = NULL; /* it may have been that block */
    }
    if (o != NULL &&
        (o->state != KVF_OBJ_COMMITTED || o->size != e->size ||
         o->checksum != e->checksum || o->nrep >= KVF_STORE_REPLICA_MAX)) {
        kvf_log_rl(KVF_LOG_WARN,
                   "rebuild: node %s reports %s (%lu bytes) but the key "
                   "holds other bytes: entry refused",
                   n->segment, kvf_log_key(esc, sizeof(esc), e->key),
                   (unsigned long)e->size);
        return KVF_ERR_EXISTS;
    }
    blk = kvf_pa_alloc_at(&n->pa, *hint, e->off, e->size);
    if (blk == NULL) {
        kvf_log_rl(KVF_LOG_WARN,
                   "rebuild: node %s reports %s at %lu+%lu, outside its "
                   "pool or over another object: entry refused",
                   n->segment, kvf_log_key(esc, sizeof(esc), e->key),
                   (unsigned long)e->off, (unsigned long)e->size);
        return KVF_ERR_EXISTS;
    }
    if (o != NULL) {
        o->rep[o->nrep] = (kvf_mrep_t){.node = n, .blk = blk};
        o->nrep++;
        kvf_m_tier_relist(m, o); /* back in a pool */
        *hint = blk;
        return KVF_OK;
    }
    if (kvf_m_rebuild_new(m, n, blk, e) != KVF_OK) {
        kvf_pa_free(&n->pa, blk);
        *hint = NULL;
        return KVF_ERR_NO_MEMORY;
    }
    *hint = blk;
    return KVF_OK;
}
