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

#define KVF_M_HASH_SEED 0x6b766673746f7265ull

static void kvf_m_list_init(kvf_mobj_t *s)
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

kvf_status_t kvf_m_init(kvf_master_t *m)
{
    m->nbuckets = 1024;
    m->table = kvf_calloc(m->nbuckets, sizeof(*m->table));
    m->npbuckets = 1024;
    m->ptable = kvf_calloc(m->npbuckets, sizeof(*m->ptable));
    if (m->table == NULL || m->ptable == NULL) {
        kvf_free(m->table);
        kvf_free(m->ptable);
        m->table = NULL;
        m->ptable = NULL;
        return KVF_ERR_NO_MEMORY;
    }
    kvf_m_list_init(&m->lru);
    kvf_m_list_init(&m->pending);
    kvf_m_list_init(&m->doomed);
    kvf_m_list_init(&m->dlru);
    if (kvf_m_clients_init(m) != KVF_OK) {
        kvf_free(m->table);
        kvf_free(m->ptable);
        m->table = NULL;
        m->ptable = NULL;
        return KVF_ERR_NO_MEMORY;
    }
    return KVF_OK;
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

void kvf_m_fini(kvf_master_t *m)
{
    kvf_m_clear(m);
    kvf_free(m->table);
    m->table = NULL;
    kvf_free(m->ptable);
    m->ptable = NULL;
    kvf_m_clients_fini(m);
}

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

static uint64_t kvf_m_hash(const char *key, size_t len)
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
static uint64_t kvf_m_held(const kvf_master_t *m)
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

/* May o leave the pool now? Not pinned, not leased, and no tier
 * operation reading its pool bytes (a load filling them, a write-through
 * copying them to disk). Pass 0 also keeps objects whose disk copy is
 * not made yet (they would be lost); pass 1 takes them too. */
static int kvf_m_evictable(const kvf_mobj_t *o, uint64_t now, int pass)
{
    unsigned i;

    if (o->state != KVF_OBJ_COMMITTED || (o->flags & KVF_STORE_PIN) ||
        o->lease_until_ms > now || o->on_disk_list ||
        (pass == 0 && kvf_m_tier_uncopied(o))) {
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
    kvf_m_tier_forget(m, o); /* its disk copies go now */
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

    if (kvf_m_tier_demote(m, o)) {
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
            if (!kvf_m_evictable(o, now, pass) || !kvf_m_obj_on(o, n)) {
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
static void kvf_m_evict_watermark(kvf_master_t *m, uint64_t now)
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
        if (kvf_m_evictable(o, now, 0)) {
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
    kvf_m_tier_commit(m, o);
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
    if (!kvf_m_tier_usable(o)) {
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
