/*
 * Store client: the location cache, a get strategy (behind the handle's
 * strategy table: get.c, put.c and keys.c reach it only through
 * kvf__strat_get/seen/gone), on the location table of loctab.c.
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
 * Config: `loc_cache` (store table) = entries, a power of two; 0 = off
 * (KVF_LOC_CACHE=0).
 */
#include "store/client/client_int.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>

/* Which replica of the master's answer is the one read (-1: none)? */
static int kvf_sloc_same(kvf_sloc_t *loc, const kvf_sloc_ent_t *l,
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

/* The GET of key sent, the cached location l read while it is in
 * flight, then the master's answer decides. */
static kvf__sget_res_t kvf_sloc_spec(kvf_store_h st, const char *key, void *buf,
                                     const kvf_sloc_ent_t *l, kvf_sreps_t *e,
                                     uint64_t *sent_ns_p)
{
    kvf_store_timing_t *tm = &kvf__stl_timing;
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
    status = kvf__srpc_send(st, KVF_SP_GET, 1, &w, &c);
    kvf_wr_free(&w);
    if (status != KVF_OK) {
        return KVF__SGET_NONE; /* the plain get retries and reports */
    }
    tm->query_ns = kvf_time_ns() - t0;
    op_st = kvf__sloc_read(st, l, buf, &sum);
    t0 = kvf_time_ns();
    status = kvf__srpc_recv(st, c, KVF_SP_GET, &closed);
    if (closed) {
        return KVF__SGET_NONE;
    }
    if (status == KVF_OK) {
        kvf_rd_init(&r, c->f.body, c->f.hdr.meta_len);
        kvf_sm_get_rep_dec(&r, e);
        status = kvf_sm_rep_end(&r, c->f.hdr.count, 1);
    }
    kvf__srelease(st, c);
    tm->query_ns += kvf_time_ns() - t0;
    if (status != KVF_OK) {
        return KVF__SGET_NONE;
    }
    __atomic_add_fetch(&st->loc.gets, 1, __ATOMIC_RELAXED);
    k = (op_st == KVF_OK) ? kvf_sloc_same(&st->loc, l, e) : -1;
    if (k < 0) {
        if (e->status != KVF_OK) {
            kvf__sloc_forget(&st->loc, key);
        }
        kvf_log_rl(KVF_LOG_DEBUG,
                   "store get '%s': cached location unusable "
                   "(read %s, master %s)",
                   KVF_LOG_KEY(key), kvf_status_str(op_st),
                   kvf_status_str(e->status));
        return KVF__SGET_LOOKED;
    }
    if (sum != e->checksum) {
        return KVF__SGET_LOOKED;
    }
    __atomic_add_fetch(&st->loc.used, 1, __ATOMIC_RELAXED);
    kvf__sloc_note(&st->loc, key, e, (unsigned)k,
                   kvf__sloc_lease_end(&st->loc, *sent_ns_p, e->lease_ms));
    return KVF__SGET_DONE;
}

/* A single-key host get: the GET in flight while the cached location is
 * read (kvf_sloc_spec); nothing known: KVF__SGET_NONE. */
static kvf__sget_res_t kvf_sloc_get(kvf_store_h st, const char *key, void *buf,
                                    size_t cap, kvf_sreps_t *e,
                                    uint64_t *sent_ns_p)
{
    kvf_sloc_ent_t l;

    if (buf == NULL || !kvf__sloc_find(&st->loc, key, &l) || l.size > cap) {
        return KVF__SGET_NONE;
    }
    return kvf_sloc_spec(st, key, buf, &l, e, sent_ns_p);
}

/* A put wrote, or a get read, replica k of e: remembered (with the
 * end of its read lease when lease reads are on and a GET sent at
 * sent_ns granted one; 0 for a put). */
static void kvf_sloc_seen(kvf_store_h st, const char *key, const kvf_sreps_t *e,
                          unsigned k, uint64_t sent_ns)
{
    kvf__sloc_note(
        &st->loc, key, e, k,
        sent_ns != 0 ? kvf__sloc_lease_end(&st->loc, sent_ns, e->lease_ms) : 0);
}

static void kvf_sloc_gone(kvf_store_h st, const char *key)
{
    kvf__sloc_forget(&st->loc, key);
}

static kvf_status_t kvf_sloc_open(kvf_store_h st)
{
    kvf_status_t status;
    uint64_t v = 0;

    status = kvf_config_u64(&kvf_store_config, "loc_cache", &v);
    return (status == KVF_OK) ? kvf__sloc_init(&st->loc, (size_t)v) : status;
}

static void kvf_sloc_close(kvf_store_h st)
{
    kvf__sloc_fini(&st->loc);
}

const kvf__sstrat_ops_t kvf__sloc_ops = {
    .name = "loc",
    .init = kvf_sloc_open,
    .fini = kvf_sloc_close,
    .get = kvf_sloc_get,
    .seen = kvf_sloc_seen,
    .gone = kvf_sloc_gone,
};
