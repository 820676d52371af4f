/*
 * Store master metadata and its rules. Objects live in a chained hash
 * table by key; committed ones are also on an LRU list (a get moves an
 * object to the front), pending ones on a list of puts in progress. Space
 * comes from each node's TLSF allocator; replicas of one object go to
 * distinct nodes on distinct hosts where there are enough (a node's host
 * is the address part of its segment name, host:port), the host with the
 * most free space first, then its node with the most free space; only
 * when the hosts run out do two replicas share a host. Eviction walks the LRU
 * list from its cold end and skips pinned objects and objects under a read
 * lease (a get grants a lease of lease_ms). A remove takes the key away at
 * once; an object still under a lease keeps its space, off the table,
 * until the lease ends. The periodic tick frees those, reclaims puts
 * never committed by their deadline, drops nodes silent past their TTL
 * (their replicas go; an object left without replicas is lost), and
 * evicts down to the low watermark once used space passes the high one.
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
static void kvf_m_pend_add(kvf_master_t *m, kvf_mobj_t *o, kvf_mclient_t *cl)
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
static void kvf_m_pend_del(kvf_master_t *m, kvf_mobj_t *o)
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

static kvf_mobj_t *kvf_m_pfind(kvf_master_t *m, uint64_t put_id)
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

    for (pp = &m->table[o->hash & (m->nbuckets - 1)];
         !o->shadow && *pp != NULL; pp = &(*pp)->hnext) {
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
kvf_pa_block_t *kvf_m_alloc_on(kvf_master_t *m, kvf_mnode_t *n,
                                      uint64_t size, int evict, uint64_t now)
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

/* Puts a key on an object of the pending list (in the table). */
static kvf_status_t kvf_m_obj_name(kvf_master_t *m, kvf_mobj_t *o,
                                   const char *key)
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

/* The length of the host part of a segment name: the address before
 * its ":port" ("10.0.0.2:7000", "[::1]:7000"); a name without a port is
 * a host of its own. */
static size_t kvf_m_host_len(const char *seg)
{
    const char *colon = strrchr(seg, ':');

    if (colon == NULL || colon == seg ||
        (strchr(seg, ':') != colon && seg[0] != '[')) {
        return strlen(seg);
    }
    return (size_t)(colon - seg);
}

static int kvf_m_same_host(const kvf_mnode_t *a, const kvf_mnode_t *b)
{
    size_t la = kvf_m_host_len(a->segment);

    return la == kvf_m_host_len(b->segment) &&
           memcmp(a->segment, b->segment, la) == 0;
}

/* Free bytes of every node on n's host. */
static uint64_t kvf_m_host_free(const kvf_master_t *m, const kvf_mnode_t *n)
{
    const kvf_mnode_t *x;
    uint64_t free_b = 0;

    for (x = m->nodes; x != NULL; x = x->next) {
        if (x == n || kvf_m_same_host(x, n)) {
            free_b += x->pa.len - x->pa.used;
        }
    }
    return free_b;
}

/* Orders the candidates: the host with the most free space first, within
 * a host the node with the most free space first. */
static void kvf_m_place_order(const kvf_master_t *m, kvf_mnode_t **cand,
                              size_t ncand)
{
    uint64_t hfree[64], hf;
    kvf_mnode_t *t;
    size_t i, j;

    for (i = 0; i < ncand; i++) {
        hfree[i] = kvf_m_host_free(m, cand[i]);
    }
    for (i = 1; i < ncand; i++) {
        for (j = i; j > 0; j--) {
            if (hfree[j - 1] > hfree[j] ||
                (hfree[j - 1] == hfree[j] &&
                 cand[j - 1]->pa.len - cand[j - 1]->pa.used >=
                     cand[j]->pa.len - cand[j]->pa.used)) {
                break;
            }
            t = cand[j];
            cand[j] = cand[j - 1];
            cand[j - 1] = t;
            hf = hfree[j];
            hfree[j] = hfree[j - 1];
            hfree[j - 1] = hf;
        }
    }
}

/* Is a replica of o already on n's host? */
static int kvf_m_host_taken(const kvf_mobj_t *o, const kvf_mnode_t *n)
{
    unsigned i;

    for (i = 0; i < o->nrep; i++) {
        if (kvf_m_same_host(o->rep[i].node, n)) {
            return 1;
        }
    }
    return 0;
}

/* Takes space for o's replicas from the ordered candidates: first on
 * hosts without a replica of o (without evicting, then evicting), then
 * on any node left (likewise). A reservation never evicts. */
static void kvf_m_place(kvf_master_t *m, kvf_mobj_t *o, kvf_mnode_t **cand,
                        size_t ncand, uint64_t size, unsigned replicas,
                        int may_evict, uint64_t now)
{
    kvf_pa_block_t *b;
    int pass, evict, spread;
    size_t i;

    for (pass = 0; pass < 4 && o->nrep < replicas; pass++) {
        spread = pass < 2;
        evict = pass & 1;
        if (evict && !may_evict) {
            continue;
        }
        for (i = 0; i < ncand && o->nrep < replicas; i++) {
            if (cand[i] == NULL || (spread && kvf_m_host_taken(o, cand[i]))) {
                continue;
            }
            b = kvf_m_alloc_on(m, cand[i], size, evict, now);
            if (b != NULL) {
                o->rep[o->nrep] = (kvf_mrep_t){.node = cand[i], .blk = b};
                o->nrep++;
                cand[i] = NULL;
            }
        }
    }
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
    *leased_p =
        kvf_m_lease_grant(m, cl, o, kvf_m_obj_bytes(o), kvf_time_ms());
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

