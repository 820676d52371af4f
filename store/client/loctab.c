/*
 * Store client: the location table, where each key's bytes were last
 * seen, shared by two get strategies: the location cache (loc.c) and
 * lease reads (lease.c). A direct-mapped table (key hash -> segment,
 * address, size, the master's checksum, the end of a read lease) filled
 * by this handle's puts and gets, and the read of one location into a
 * caller's buffer with its checksum. Not trusted alone: the strategies
 * accept bytes only when they hash to the master's checksum.
 */
#include "store/client/client_int.h"
#include "core/alloc.h"
#include "core/checksum.h"
#include "core/log.h"
#include "core/time.h"

#include <stdio.h>
#include <string.h>

#define KVF_SLOC_SEED 0x6b76666c6f63ull /* "kvfloc" */

kvf_status_t kvf__sloc_init(kvf_sloc_t *loc, size_t entries)
{
    unsigned i;

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

void kvf__sloc_fini(kvf_sloc_t *loc)
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

void kvf__sloc_note(kvf_sloc_t *loc, const char *key, const kvf_sreps_t *e,
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

uint64_t kvf__sloc_lease_end(const kvf_sloc_t *loc, uint64_t sent_ns,
                             unsigned lease_ms)
{
    if (!loc->lease_reads || lease_ms == 0) {
        return 0;
    }
    /* the master started the lease after sent_ns; an eighth is kept back
     * for the two clocks' rates */
    return sent_ns + (uint64_t)lease_ms * 1000000ull / 8 * 7;
}

void kvf__sloc_forget(kvf_sloc_t *loc, const char *key)
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

int kvf__sloc_find(kvf_sloc_t *loc, const char *key, kvf_sloc_ent_t *out)
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

kvf_status_t kvf__sloc_read(kvf_store_h st, const kvf_sloc_ent_t *l, void *buf,
                            uint64_t *sum_p)
{
    kvf_store_timing_t *tm = &kvf__stl_timing;
    kvf_status_t op_st = KVF_ERR_INTERNAL;
    kvf_speer_t *sp = NULL;
    uint64_t t0 = kvf_time_ns();
    uint32_t key = 0;
    unsigned rep = 0;
    kvf_op_t op;
    kvf_smove_t mv = {&op, &sp, &op_st, &key, &rep, 0, NULL};

    if (kvf__speer_ref(st, st->loc.segs[l->seg], &sp) == KVF_OK) {
        memset(&op, 0, sizeof(op));
        op.type = KVF_OP_READ;
        op.local = buf;
        op.peer = sp->peer;
        op.remote = l->addr;
        op.length = l->size;
        mv.n = 1;
        kvf__smove_run(st, &mv, NULL, NULL);
    }
    tm->read_ns = kvf_time_ns() - t0;
    if (op_st == KVF_OK) {
        t0 = kvf_time_ns();
        *sum_p = kvf_checksum(buf, l->size);
        tm->verify_ns = kvf_time_ns() - t0;
    }
    return op_st;
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
