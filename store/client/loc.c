/*
 * Store client: the location cache, and the two look-up strategies of
 * a single-key get built on it (get.c picks them).
 *
 * A get is a GET round trip to the master (lease, location, checksum)
 * followed by an engine read from a node: two round trips, one after the
 * other. Many gets are of keys this client has seen before (a serving
 * engine reading back the KV blocks it offloaded, a prefix read again),
 * and objects do not move. So the handle keeps where each key's bytes
 * were last seen, in a direct-mapped table
 * (key hash -> segment, address, size), filled by its own puts and gets.
 * A single-key get with a cached location sends the GET, reads the cached
 * location into the caller's buffer and checksums it while the master
 * answers, then takes the master's answer:
 *
 *   - the master names that replica (same segment, address and size) and
 *     the bytes read have the master's checksum: the get is done, in one
 *     round trip's time instead of two;
 *   - anything else (moved, removed, evicted, reused, a failed read, a
 *     checksum that does not match): the bytes are not used; the get reads
 *     the replicas the master named, as a plain get does.
 *
 * Why this is safe: the read may start before the master grants the
 * lease, so the slot may be reused under it; but the bytes are accepted
 * only if they hash to the checksum the master holds for the object it
 * names at that address: the same guarantee that protects a reader slower
 * than its lease. The master still sees every get (hits, misses, LRU,
 * leases); the cache only saves waiting. On a failed get the caller's
 * buffer holds unspecified bytes (as on a failed plain get).
 *
 * The second strategy, lease reads (`lease_reads`, off by default),
 * skips the master: an entry a get learnt keeps the master's checksum and
 * the end of the read lease that get was granted; until then a get reads
 * there and checks the bytes against that checksum alone. The master
 * frees no space a lease covers, so the bytes are the object's or the
 * check fails (then the master is asked). Another client's remove is seen
 * when the lease ends.
 *
 * Config: `loc_cache` (store table) = entries, a power of two; 0 = off
 * (KVF_LOC_CACHE=0); `lease_reads`.
 */
#include "store/client/client_int.h"
#include "core/alloc.h"
#include "core/checksum.h"
#include "core/log.h"
#include "core/time.h"

#include <stdio.h>
#include <string.h>

#define KVF_SLOC_SEED 0x6b76666c6f63ull /* "kvfloc" */

kvf_status_t kvf_sloc_init(kvf_sloc_t *loc, size_t entries)
{
    unsigned i;

    memset(loc, 0, sizeof(*loc));
    if (entries == 0) {
        return KVF_OK;
    }
    if ((entries & (entries - 1)) != 0 || entries > (1u << 24)) {
        kvf_error("store loc_cache=%zu: a power of two up to 16M, or 0",
                  entries);
        return KVF_ERR_INVALID_PARAM;
    }
    loc->ents = kvf_calloc(entries, sizeof(*loc->ents));
    if (loc->ents == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    loc->mask = entries - 1;
    for (i = 0; i < KVF_SLOC_LOCKS; i++) {
        pthread_mutex_init(&loc->locks[i], NULL);
    }
    pthread_mutex_init(&loc->seg_lock, NULL);
    return KVF_OK;
}

void kvf_sloc_fini(kvf_sloc_t *loc)
{
    unsigned i;

    if (loc->ents == NULL) {
        return;
    }
    for (i = 0; i < KVF_SLOC_LOCKS; i++) {
        pthread_mutex_destroy(&loc->locks[i]);
    }
    pthread_mutex_destroy(&loc->seg_lock);
    kvf_free(loc->ents);
    loc->ents = NULL;
}

static uint64_t kvf_sloc_tag(const char *key)
{
    uint64_t h = kvf_hash64(key, strlen(key), KVF_SLOC_SEED);

    return h ? h : 1;
}

/* The index of a segment name (added if new); KVF_SLOC_SEGS if full. */
static unsigned kvf_sloc_seg(kvf_sloc_t *loc, const char *seg)
{
    unsigned i, n;

    n = __atomic_load_n(&loc->nseg, __ATOMIC_ACQUIRE);
    for (i = 0; i < n; i++) {
        if (strcmp(loc->segs[i], seg) == 0) {
            return i;
        }
    }
    pthread_mutex_lock(&loc->seg_lock);
    for (i = 0; i < loc->nseg; i++) {
        if (strcmp(loc->segs[i], seg) == 0) {
            break;
        }
    }
    if (i == loc->nseg && i < KVF_SLOC_SEGS) {
        snprintf(loc->segs[i], sizeof(loc->segs[i]), "%s", seg);
        __atomic_store_n(&loc->nseg, i + 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&loc->seg_lock);
    return i;
}

void kvf_sloc_note(kvf_sloc_t *loc, const char *key, const kvf_sreps_t *e,
                   unsigned k, uint64_t lease_end_ns)
{
    kvf_sloc_ent_t *ent;
    uint64_t tag;
    size_t idx;
    unsigned seg;

    if (loc->ents == NULL || k >= e->nrep || e->size == 0) {
        return;
    }
    seg = kvf_sloc_seg(loc, e->seg[k]);
    if (seg >= KVF_SLOC_SEGS) {
        return;
    }
    tag = kvf_sloc_tag(key);
    idx = tag & loc->mask;
    pthread_mutex_lock(&loc->locks[idx % KVF_SLOC_LOCKS]);
    ent = &loc->ents[idx];
    ent->tag = tag;
    ent->addr = e->addr[k];
    ent->size = e->size;
    ent->checksum = e->checksum;
    ent->lease_end_ns = lease_end_ns;
    ent->seg = seg;
    pthread_mutex_unlock(&loc->locks[idx % KVF_SLOC_LOCKS]);
}

uint64_t kvf_sloc_lease_end(const kvf_sloc_t *loc, uint64_t sent_ns,
                            unsigned lease_ms)
{
    if (!loc->lease_reads || lease_ms == 0) {
        return 0;
    }
    /* the master started the lease after sent_ns; an eighth is kept back
     * for the two clocks' rates */
    return sent_ns + (uint64_t)lease_ms * 1000000ull / 8 * 7;
}

void kvf_sloc_forget(kvf_sloc_t *loc, const char *key)
{
    uint64_t tag;
    size_t idx;

    if (loc->ents == NULL) {
        return;
    }
    tag = kvf_sloc_tag(key);
    idx = tag & loc->mask;
    pthread_mutex_lock(&loc->locks[idx % KVF_SLOC_LOCKS]);
    if (loc->ents[idx].tag == tag) {
        loc->ents[idx].tag = 0;
    }
    pthread_mutex_unlock(&loc->locks[idx % KVF_SLOC_LOCKS]);
}

/* The cached location of key, if any. */
static int kvf_sloc_find(kvf_sloc_t *loc, const char *key, kvf_sloc_ent_t *out)
{
    uint64_t tag;
    size_t idx;
    int hit;

    if (loc->ents == NULL) {
        return 0;
    }
    tag = kvf_sloc_tag(key);
    idx = tag & loc->mask;
    pthread_mutex_lock(&loc->locks[idx % KVF_SLOC_LOCKS]);
    *out = loc->ents[idx];
    pthread_mutex_unlock(&loc->locks[idx % KVF_SLOC_LOCKS]);
    hit = (out->tag == tag && out->seg < KVF_SLOC_SEGS);
    return hit;
}

/* Which replica of the master's answer is the one read (-1: none)? */
static int kvf_store_spec_same(kvf_sloc_t *loc, const kvf_sloc_ent_t *l,
                               const kvf_sreps_t *e)
{
    unsigned k;

    if (e->status != KVF_OK || e->size != l->size) {
        return -1;
    }
    for (k = 0; k < e->nrep; k++) {
        if (e->addr[k] == l->addr &&
            strcmp(e->seg[k], loc->segs[l->seg]) == 0) {
            return (int)k;
        }
    }
    return -1;
}

/* Reads the cached location l into buf; its checksum into *sum_p. */
static kvf_status_t kvf_store_spec_read(kvf_store_h st, const kvf_sloc_ent_t *l,
                                        void *buf, uint64_t *sum_p)
{
    kvf_store_timing_t *tm = &kvf_store_tl_timing;
    kvf_status_t op_st = KVF_ERR_INTERNAL;
    kvf_speer_t *sp = NULL;
    uint64_t t0 = kvf_time_ns();
    uint32_t key = 0;
    unsigned rep = 0;
    kvf_op_t op;
    kvf_smove_t mv = {&op, &sp, &op_st, &key, &rep, 0, NULL};

    if (kvf_store_peer_ref(st, st->loc.segs[l->seg], &sp) == KVF_OK) {
        memset(&op, 0, sizeof(op));
        op.type = KVF_OP_READ;
        op.local = buf;
        op.peer = sp->peer;
        op.remote = l->addr;
        op.length = l->size;
        mv.n = 1;
        kvf_smove_run(st, &mv, NULL, NULL);
    }
    tm->read_ns = kvf_time_ns() - t0;
    if (op_st == KVF_OK) {
        t0 = kvf_time_ns();
        *sum_p = kvf_checksum(buf, l->size);
        tm->verify_ns = kvf_time_ns() - t0;
    }
    return op_st;
}

/* A lease read: the location and checksum a get of this handle learnt,
 * under the read lease that get was granted (the space is neither freed
 * nor reused before it ends, whatever happens to the key): no master
 * round trip. */
static kvf_sloc_res_t kvf_sloc_leased(kvf_store_h st, const char *key,
                                      void *buf, const kvf_sloc_ent_t *l,
                                      kvf_sreps_t *e)
{
    kvf_status_t op_st;
    uint64_t sum = 0;

    op_st = kvf_store_spec_read(st, l, buf, &sum);
    if (op_st == KVF_OK && sum == l->checksum) {
        e->status = KVF_OK;
        e->size = l->size;
        e->checksum = l->checksum;
        __atomic_add_fetch(&st->loc.lease, 1, __ATOMIC_RELAXED);
        return KVF_SLOC_DONE;
    }
    /* the read failed (a dead node) or the bytes are not the object's
     * (a read that outlived the lease): ask the master */
    kvf_sloc_forget(&st->loc, key);
    kvf_log_rl(KVF_LOG_DEBUG, "store get '%s': lease read unusable (%s)",
               KVF_LOG_KEY(key),
               (op_st == KVF_OK) ? "checksum" : kvf_status_str(op_st));
    return KVF_SLOC_NONE;
}

/* The GET of key sent, the cached location l read while it is in
 * flight, then the master's answer decides. */
static kvf_sloc_res_t kvf_sloc_spec(kvf_store_h st, const char *key, void *buf,
                                    const kvf_sloc_ent_t *l, kvf_sreps_t *e,
                                    uint64_t *sent_ns_p)
{
    kvf_store_timing_t *tm = &kvf_store_tl_timing;
    kvf_status_t status, op_st;
    uint64_t t0, sum = 0;
    kvf_sconn_t *c;
    int closed, k;
    kvf_wr_t w;
    kvf_rd_t r;

    kvf_wr_init(&w);
    kvf_sm_key_enc(&w, key);
    t0 = kvf_time_ns();
    *sent_ns_p = t0;
    status = kvf_store_rpc_send(st, KVF_SP_GET, 1, &w, &c);
    kvf_wr_free(&w);
    if (status != KVF_OK) {
        return KVF_SLOC_NONE; /* the plain get retries and reports */
    }
    tm->query_ns = kvf_time_ns() - t0;
    op_st = kvf_store_spec_read(st, l, buf, &sum);
    t0 = kvf_time_ns();
    status = kvf_store_rpc_recv(st, c, KVF_SP_GET, &closed);
    if (closed) {
        return KVF_SLOC_NONE;
    }
    if (status == KVF_OK) {
        kvf_rd_init(&r, c->f.body, c->f.hdr.meta_len);
        kvf_sm_get_rep_dec(&r, e);
        status = kvf_sm_rep_end(&r, c->f.hdr.count, 1);
    }
    kvf_store_release(st, c);
    tm->query_ns += kvf_time_ns() - t0;
    if (status != KVF_OK) {
        return KVF_SLOC_NONE;
    }
    __atomic_add_fetch(&st->loc.gets, 1, __ATOMIC_RELAXED);
    k = (op_st == KVF_OK) ? kvf_store_spec_same(&st->loc, l, e) : -1;
    if (k < 0) {
        if (e->status != KVF_OK) {
            kvf_sloc_forget(&st->loc, key);
        }
        kvf_log_rl(KVF_LOG_DEBUG,
                   "store get '%s': cached location unusable "
                   "(read %s, master %s)",
                   KVF_LOG_KEY(key), kvf_status_str(op_st),
                   kvf_status_str(e->status));
        return KVF_SLOC_LOOKED;
    }
    if (sum != e->checksum) {
        return KVF_SLOC_LOOKED;
    }
    __atomic_add_fetch(&st->loc.used, 1, __ATOMIC_RELAXED);
    kvf_sloc_note(&st->loc, key, e, (unsigned)k,
                  kvf_sloc_lease_end(&st->loc, *sent_ns_p, e->lease_ms));
    return KVF_SLOC_DONE;
}

kvf_sloc_res_t kvf_sloc_get(kvf_store_h st, const char *key, void *buf,
                            size_t cap, kvf_sreps_t *e, uint64_t *sent_ns_p)
{
    kvf_sloc_ent_t l;

    if (buf == NULL || !kvf_sloc_find(&st->loc, key, &l) || l.size > cap) {
        return KVF_SLOC_NONE;
    }
    if (l.lease_end_ns != 0 && kvf_time_ns() < l.lease_end_ns) {
        return kvf_sloc_leased(st, key, buf, &l, e);
    }
    return kvf_sloc_spec(st, key, buf, &l, e, sent_ns_p);
}

void kvf_store_loc_stats(kvf_store_h st, kvf_store_loc_stats_t *stats_p)
{
    if (stats_p == NULL) {
        return;
    }
    stats_p->gets =
        (st != NULL) ? __atomic_load_n(&st->loc.gets, __ATOMIC_RELAXED) : 0;
    stats_p->used =
        (st != NULL) ? __atomic_load_n(&st->loc.used, __ATOMIC_RELAXED) : 0;
    stats_p->lease =
        (st != NULL) ? __atomic_load_n(&st->loc.lease, __ATOMIC_RELAXED) : 0;
}
