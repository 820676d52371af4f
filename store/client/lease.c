/*
 * Store client: lease reads, a get strategy (behind the handle's
 * strategy table, tried before the location cache), on the location
 * table of loctab.c.
 *
 * Lease reads (`lease_reads`, off by default) skip the master: an entry
 * a get learnt keeps the master's checksum and the end of the read lease
 * that get was granted; until then a get reads there and checks the
 * bytes against that checksum alone. The master frees no space a lease
 * covers, so the bytes are the object's or the check fails (then the
 * master is asked). Another client's remove is seen when the lease ends.
 */
#include "store/client/client_int.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>

/* A lease read: the location and checksum a get of this handle learnt,
 * under the read lease that get was granted (the space is neither freed
 * nor reused before it ends, whatever happens to the key): no master
 * round trip. */
static kvf__sget_res_t kvf_slease_read(kvf_store_h st, const char *key,
                                       void *buf, const kvf_sloc_ent_t *l,
                                       kvf_sreps_t *e)
{
    kvf_status_t op_st;
    uint64_t sum = 0;

    op_st = kvf__sloc_read(st, l, buf, &sum);
    if (op_st == KVF_OK && sum == l->checksum) {
        e->status = KVF_OK;
        e->size = l->size;
        e->checksum = l->checksum;
        __atomic_add_fetch(&st->loc.lease, 1, __ATOMIC_RELAXED);
        return KVF__SGET_DONE;
    }
    /* the read failed (a dead node) or the bytes are not the object's
     * (a read that outlived the lease): ask the master */
    kvf__sloc_forget(&st->loc, key);
    kvf_log_rl(KVF_LOG_DEBUG, "store get '%s': lease read unusable (%s)",
               KVF_LOG_KEY(key),
               (op_st == KVF_OK) ? "checksum" : kvf_status_str(op_st));
    return KVF__SGET_NONE;
}

/* A single-key host get under a lease this handle's get was granted;
 * no lease (or lease reads off): KVF__SGET_NONE. */
static kvf__sget_res_t kvf_slease_get(kvf_store_h st, const char *key,
                                      void *buf, size_t cap, kvf_sreps_t *e,
                                      uint64_t *sent_ns_p)
{
    kvf_sloc_ent_t l;

    (void)sent_ns_p;
    if (!st->loc.lease_reads || buf == NULL ||
        !kvf__sloc_find(&st->loc, key, &l) || l.size > cap ||
        l.lease_end_ns == 0 || kvf_time_ns() >= l.lease_end_ns) {
        return KVF__SGET_NONE;
    }
    return kvf_slease_read(st, key, buf, &l, e);
}

/* Lease reads on: the location table keeps the end of each get's lease
 * (set before the location cache opens the table). */
static kvf_status_t kvf_slease_open(kvf_store_h st)
{
    kvf_status_t status;
    uint64_t v = 0;

    status = kvf_config_u64(&kvf_store_config, "lease_reads", &v);
    st->loc.lease_reads = (status == KVF_OK && v != 0);
    return status;
}

const kvf__sstrat_ops_t kvf__slease_ops = {
    .name = "lease",
    .init = kvf_slease_open,
    .get = kvf_slease_get,
};
