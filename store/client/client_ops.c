/*
 * Store client operations. put: one PUT_START round trip for the batch,
 * one engine batch writing every replica (the checksums are computed
 * while it is in flight), one PUT_END round trip committing (each key with the
 * mask of replicas that were written; a mask of 0 aborts). get: one GET round
 * trip (it grants a read lease), then rounds of one engine batch each: round r
 * reads every key not yet good from its next replica, and each read is verified
 * against the checksum before it counts; a key whose replicas are all
 * bad fails with KVF_ERR_CHECKSUM (or the read's error). remove, exists,
 * list and query are one round trip each.
 *
 * A single-key put (host memory, at most KVF_STORE_RESV_MAX) commits with
 * COMMIT instead of PUT_END, which also asks for a reservation of the
 * same size for the connection's next put. A put finding such a
 * reservation (same size and replica count, younger than 250 ms and half
 * the put timeout, on a connection the master has not closed) writes straight
 * into it and commits with one COMMIT: one master round trip instead of
 * two. A COMMIT that finds its reservation gone (STALE) falls back to
 * the two-round-trip put; one refused for the key (EXISTS, BUSY) keeps
 * the reservation.
 */
#include "store/client/client_int.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>

/* A reservation is used at most this long after it was granted. */
#define KVF_STORE_RESV_USE_MS 250

static const char kvf_store_empty[1];
static __thread unsigned kvf_store_tl_rr;

void kvf_store_rd_reps(kvf_rd_t *r, kvf_sreps_t *e)
{
    unsigned i;

    e->nrep = kvf_rd_u8(r);
    if (e->nrep > KVF_STORE_REPLICA_MAX) {
        r->failed = 1;
        e->nrep = 0;
    }
    for (i = 0; i < e->nrep; i++) {
        kvf_rd_str(r, e->seg[i], sizeof(e->seg[i]));
        e->addr[i] = kvf_rd_u64(r);
    }
}

static kvf_status_t kvf_store_first_error(const kvf_status_t *s, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        if (s[i] != KVF_OK) {
            return s[i];
        }
    }
    return KVF_OK;
}

static uint64_t kvf_store_sum(const void *buf, size_t len)
{
    return kvf_checksum(len ? buf : kvf_store_empty, len);
}

/* Peers that failed leave the cache. */
void kvf_store_run(kvf_store_h st, kvf_op_t *ops, kvf_speer_t **sps, size_t n,
                   kvf_status_t *op_st, void (*during)(void *arg), void *arg)
{
    kvf_status_t status;
    kvf_batch_h b;
    size_t i;

    status = (n > 0)
                 ? kvf_batch_submit_ex(st->engine, ops, n, KVF_BATCH_INLINE, &b)
                 : KVF_OK;
    if (during != NULL) {
        during(arg);
    }
    if (n > 0 && status == KVF_OK) {
        status = kvf_batch_wait(b, (int)st->timeout_ms);
        for (i = 0; i < n; i++) {
            op_st[i] = (status == KVF_ERR_TIMEOUT)
                           ? KVF_ERR_TIMEOUT
                           : kvf_batch_op_status(b, i, NULL);
        }
        kvf_batch_destroy(b);
    } else {
        for (i = 0; i < n; i++) {
            op_st[i] = status;
        }
    }
    for (i = 0; i < n; i++) {
        kvf_store_peer_put(st, sps[i], kvf_store_peer_error(op_st[i]));
    }
}

/* Checksums of the keys being written, computed during their writes. */
typedef struct kvf_store_sum_job {
    size_t count;
    const void *const *bufs;
    const size_t *lens;
    uint64_t *sums;
    const kvf_sreps_t *e;
    uint64_t ns;
} kvf_store_sum_job_t;

static void kvf_store_sum_all(void *arg)
{
    kvf_store_sum_job_t *j = arg;
    uint64_t t0 = kvf_time_ns();
    size_t i;

    /* every allocated key (put_id != 0): its status may already carry a
     * failed replica, yet another replica may be written and committed */
    for (i = 0; i < j->count; i++) {
        if (j->e[i].status == KVF_OK && j->e[i].put_id != 0) {
            j->sums[i] = kvf_store_sum(j->bufs[i], j->lens[i]);
        }
    }
    j->ns = kvf_time_ns() - t0;
}

/* The location cache learns where a put wrote (its first replica). */
static void kvf_store_note_put(kvf_store_h st, const char *key, kvf_sreps_t *e,
                               size_t len, unsigned mask)
{
    unsigned k;

    for (k = 0; k < e->nrep; k++) {
        if (mask & (1u << k)) {
            e->size = len;
            kvf_sloc_note(&st->loc, key, e, k, 0);
            return;
        }
    }
}

/* Writes every replica of one key at e's addresses; returns the mask of
 * replicas written and sets *err to the first failure. */
static unsigned kvf_store_write_one(kvf_store_h st, const kvf_sreps_t *e,
                                    const void *buf, size_t len,
                                    kvf_status_t *err)
{
    kvf_speer_t *sps[KVF_STORE_REPLICA_MAX];
    kvf_status_t op_st[KVF_STORE_REPLICA_MAX], status;
    kvf_op_t ops[KVF_STORE_REPLICA_MAX];
    unsigned oprep[KVF_STORE_REPLICA_MAX], mask = 0;
    size_t j, nops = 0;

    *err = KVF_OK;
    for (j = 0; j < e->nrep; j++) {
        status = kvf_store_peer_get(st, e->seg[j], &sps[nops]);
        if (status != KVF_OK) {
            *err = (*err == KVF_OK) ? status : *err;
            continue;
        }
        ops[nops].type = KVF_OP_WRITE;
        ops[nops].local = (void *)buf;
        ops[nops].peer = sps[nops]->peer;
        ops[nops].remote = e->addr[j];
        ops[nops].length = len;
        oprep[nops] = (unsigned)j;
        nops++;
    }
    kvf_store_run(st, ops, sps, nops, op_st, NULL, NULL);
    for (j = 0; j < nops; j++) {
        if (op_st[j] == KVF_OK) {
            mask |= 1u << oprep[j];
        } else if (*err == KVF_OK) {
            *err = op_st[j];
        }
    }
    return mask;
}

/* Encodes one COMMIT entry. */
static void kvf_store_wr_commit(kvf_wr_t *w, const char *key, uint64_t put_id,
                                uint64_t size, uint64_t sum, unsigned mask,
                                unsigned flags, uint64_t next_size,
                                unsigned next_rep)
{
    kvf_wr_str(w, key);
    kvf_wr_u64(w, put_id);
    kvf_wr_u64(w, size);
    kvf_wr_u64(w, sum);
    kvf_wr_u8(w, (uint8_t)mask);
    kvf_wr_u8(w, (uint8_t)(flags & KVF_STORE_PIN));
    kvf_wr_u64(w, next_size);
    kvf_wr_u8(w, (uint8_t)next_rep);
}

/* Reads one COMMIT reply entry from c->f: the key's status, and the new
 * reservation into c->resv (when one came and c holds none). */
static kvf_status_t kvf_store_rd_commit(kvf_store_h st, kvf_sconn_t *c,
                                        uint64_t size, unsigned replicas)
{
    kvf_sreps_t *nr = kvf_malloc(sizeof(*nr));
    kvf_status_t status;
    uint32_t ttl_ms;
    kvf_rd_t r;

    if (nr == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf_rd_init(&r, c->f.body, c->f.hdr.meta_len);
    status = (kvf_status_t)(int32_t)kvf_rd_u32(&r);
    ttl_ms = kvf_rd_u32(&r);
    nr->put_id = kvf_rd_u64(&r);
    kvf_store_rd_reps(&r, nr);
    if (kvf_rd_status(&r) != KVF_OK || c->f.hdr.count != 1) {
        kvf_free(nr);
        return KVF_ERR_PROTOCOL;
    }
    if (nr->put_id != 0 && nr->nrep > 0 && c->resv.r.put_id == 0) {
        nr->size = size;
        c->resv.r = *nr;
        c->resv.replicas = replicas;
        c->resv.peer_epoch = __atomic_load_n(&st->peer_epoch, __ATOMIC_ACQUIRE);
        /* used only while young: well within the master's deadline, and
         * too short for its node to restart and register again (a
         * reservation's address would then be another object's) */
        c->resv.until_ms = kvf_time_ms() + (ttl_ms / 2 < KVF_STORE_RESV_USE_MS
                                                ? ttl_ms / 2
                                                : KVF_STORE_RESV_USE_MS);
    }
    kvf_free(nr);
    return status;
}

/* A single-key put through the connection's reservation. *done = 0 when
 * there was none usable (or it turned out stale): the caller puts the
 * usual way. */
static kvf_status_t kvf_store_put_resv(kvf_store_h st, const char *key,
                                       const void *buf, size_t len,
                                       unsigned replicas, unsigned flags,
                                       int *done)
{
    kvf_store_timing_t *tm = &kvf_store_tl_timing;
    kvf_status_t status, werr;
    uint64_t t0, sum, id;
    unsigned mask;
    kvf_sconn_t *c;
    int closed;
    kvf_wr_t w;

    *done = 0;
    c = kvf_store_take_resv(st, len, replicas);
    if (c == NULL) {
        return KVF_OK;
    }
    *done = 1;
    t0 = kvf_time_ns();
    mask = kvf_store_write_one(st, &c->resv.r, buf, len, &werr);
    tm->read_ns = kvf_time_ns() - t0;
    t0 = kvf_time_ns();
    sum = kvf_store_sum(buf, len);
    tm->verify_ns = kvf_time_ns() - t0;
    kvf_store_note_put(st, key, &c->resv.r, len, mask);
    kvf_wr_init(&w);
    kvf_store_wr_commit(&w, key, c->resv.r.put_id, len, sum, mask, flags,
                        mask ? len : 0, replicas);
    id = c->resv.r.put_id;
    c->resv.r.put_id = 0; /* spent, unless the master says it stays */
    t0 = kvf_time_ns();
    status = kvf_store_rpc_on(st, c, KVF_SP_COMMIT, 1, &w, &closed);
    tm->commit_ns = kvf_time_ns() - t0;
    kvf_wr_free(&w);
    if (closed) {
        return status;
    }
    if (status == KVF_OK) {
        status = kvf_store_rd_commit(st, c, len, replicas);
    }
    if ((status == KVF_ERR_EXISTS || status == KVF_ERR_BUSY) && mask != 0) {
        c->resv.r.put_id = id; /* refused for the key: the space stays */
    }
    kvf_store_release(st, c);
    if (status != KVF_OK) {
        kvf_sloc_forget(&st->loc, key);
    }
    if (status == KVF_ERR_STALE || (status == KVF_OK && mask == 0)) {
        /* reclaimed under us, or no replica could be written (aborted):
         * put again the usual way, on space allocated now */
        kvf_log_rl(KVF_LOG_DEBUG, "store put '%s': reservation unusable (%s)",
                   key, kvf_status_str(mask ? status : werr));
        *done = 0;
        return KVF_OK;
    }
    return status;
}

kvf_status_t kvf_store_put_batch(kvf_store_h st, size_t count,
                                 const char *const *keys,
                                 const void *const *bufs, const size_t *lens,
                                 const kvf_store_put_opts_t *opts,
                                 kvf_status_t *statuses)
{
    kvf_store_timing_t *tm = &kvf_store_tl_timing;
    kvf_store_sum_job_t sj = {0};
    unsigned replicas = opts ? opts->replicas : 0;
    unsigned flags = opts ? opts->flags : 0;
    uint64_t t0;
    kvf_sreps_t *e = NULL;
    kvf_op_t *ops = NULL;
    kvf_speer_t **sps = NULL;
    kvf_status_t status, *op_st = NULL, *s = statuses, *own = NULL;
    uint64_t *sums = NULL;
    uint32_t *opkey = NULL;
    unsigned *mask = NULL, *oprep = NULL;
    size_t i, j, nops = 0, nsent = 0;
    kvf_sconn_t *c;
    int resv, done, closed, may_reserve = 0;
    kvf_wr_t w;
    kvf_rd_t r;

    if (st == NULL || keys == NULL || bufs == NULL || lens == NULL ||
        count == 0 || count > KVF_STORE_BATCH_MAX ||
        replicas > KVF_STORE_REPLICA_MAX) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (s == NULL && (s = own = kvf_calloc(count, sizeof(*s))) == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    memset(tm, 0, sizeof(*tm));
    resv = st->reserve && count == 1 && !(flags & KVF_STORE_DEVICE_MEM) &&
           lens[0] > 0 && lens[0] <= KVF_STORE_RESV_MAX && bufs[0] != NULL &&
           kvf_sp_key_check(keys[0]) == KVF_OK;
    if (resv) {
        status = kvf_store_put_resv(st, keys[0], bufs[0], lens[0], replicas,
                                    flags, &done);
        if (done) {
            s[0] = status;
            kvf_free(own);
            return status;
        }
    }
    kvf_wr_init(&w);
    t0 = kvf_time_ns();
    e = kvf_calloc(count, sizeof(*e));
    sums = kvf_calloc(count, sizeof(*sums));
    mask = kvf_calloc(count, sizeof(*mask));
    ops = kvf_calloc(count * KVF_STORE_REPLICA_MAX, sizeof(*ops));
    sps = kvf_calloc(count * KVF_STORE_REPLICA_MAX, sizeof(*sps));
    op_st = kvf_calloc(count * KVF_STORE_REPLICA_MAX, sizeof(*op_st));
    opkey = kvf_calloc(count * KVF_STORE_REPLICA_MAX, sizeof(*opkey));
    oprep = kvf_calloc(count * KVF_STORE_REPLICA_MAX, sizeof(*oprep));
    if (!e || !sums || !mask || !ops || !sps || !op_st || !opkey || !oprep) {
        status = KVF_ERR_NO_MEMORY;
        goto out;
    }
    for (i = 0; i < count; i++) {
        s[i] = kvf_sp_key_check(keys[i]);
        if (s[i] == KVF_OK && bufs[i] == NULL && lens[i] > 0) {
            s[i] = KVF_ERR_INVALID_PARAM;
        }
        if (s[i] != KVF_OK) {
            continue;
        }
        kvf_wr_str(&w, keys[i]);
        kvf_wr_u64(&w, lens[i]);
        kvf_wr_u8(&w, (uint8_t)replicas);
        kvf_wr_u8(&w, (uint8_t)(flags & KVF_STORE_PIN));
        nsent++;
    }
    if (nsent == 0) {
        status = kvf_store_first_error(s, count);
        goto out;
    }
    t0 = kvf_time_ns();
    status = kvf_store_rpc(st, KVF_SP_PUT_START, (uint32_t)nsent, &w, &c);
    tm->query_ns = kvf_time_ns() - t0;
    if (status != KVF_OK) {
        goto fail_all;
    }
    kvf_rd_init(&r, c->f.body, c->f.hdr.meta_len);
    for (i = 0; i < count && c->f.hdr.count == nsent; i++) {
        if (s[i] != KVF_OK) {
            continue;
        }
        e[i].status = (kvf_status_t)(int32_t)kvf_rd_u32(&r);
        e[i].put_id = kvf_rd_u64(&r);
        kvf_store_rd_reps(&r, &e[i]);
    }
    status = (c->f.hdr.count != nsent) ? KVF_ERR_PROTOCOL : kvf_rd_status(&r);
    kvf_store_release(st, c);
    if (status != KVF_OK) {
        goto fail_all;
    }
    /* write every replica of every allocated key in one engine batch */
    for (i = 0; i < count; i++) {
        if (s[i] != KVF_OK || (s[i] = e[i].status) != KVF_OK) {
            continue;
        }
        for (j = 0; j < e[i].nrep; j++) {
            status = kvf_store_peer_get(st, e[i].seg[j], &sps[nops]);
            if (status != KVF_OK) {
                s[i] = status; /* kept only if no replica is written */
                continue;
            }
            ops[nops].type = KVF_OP_WRITE;
            ops[nops].local = (void *)bufs[i];
            ops[nops].peer = sps[nops]->peer;
            ops[nops].remote = e[i].addr[j];
            ops[nops].length = lens[i];
            opkey[nops] = (uint32_t)i;
            oprep[nops] = (unsigned)j;
            nops++;
        }
    }
    /* the checksums are computed while the writes are in flight */
    sj.count = count;
    sj.bufs = bufs;
    sj.lens = lens;
    sj.sums = sums;
    sj.e = e;
    t0 = kvf_time_ns();
    kvf_store_run(st, ops, sps, nops, op_st,
                  (flags & KVF_STORE_DEVICE_MEM) ? NULL : kvf_store_sum_all,
                  &sj);
    tm->read_ns = kvf_time_ns() - t0;
    tm->verify_ns = sj.ns;
    for (j = 0; j < nops; j++) {
        if (op_st[j] == KVF_OK) {
            mask[opkey[j]] |= 1u << oprep[j];
        } else if (s[opkey[j]] == KVF_OK) {
            s[opkey[j]] = op_st[j]; /* kept only if no replica is written */
        }
    }
    /* GPU buffers: the node computes the checksum of what it holds */
    for (i = 0; i < count && (flags & KVF_STORE_DEVICE_MEM); i++) {
        for (j = 0; j < nops; j++) {
            if (opkey[j] == i && op_st[j] == KVF_OK) {
                kvf_speer_t *sp;
                size_t len = lens[i];

                if (kvf_store_peer_get(st, e[i].seg[oprep[j]], &sp) == KVF_OK) {
                    if (kvf_peer_checksum(sp->peer, &e[i].addr[oprep[j]], &len,
                                          1, &sums[i]) != KVF_OK) {
                        mask[i] = 0;
                    }
                    kvf_store_peer_put(st, sp, 0);
                }
                break;
            }
        }
    }
    /* commit (or abort, mask 0) every allocated key */
    w.len = 0;
    nsent = 0;
    for (i = 0; i < count; i++) {
        if (e[i].status != KVF_OK || e[i].put_id == 0) {
            continue;
        }
        if (mask[i] != 0) {
            s[i] = KVF_OK;
        } else if (s[i] == KVF_OK) {
            s[i] = KVF_ERR_IO;
        }
        kvf_wr_str(&w, keys[i]);
        kvf_wr_u64(&w, e[i].put_id);
        kvf_wr_u64(&w, sums[i]);
        kvf_wr_u8(&w, (uint8_t)mask[i]);
        nsent++;
    }
    if (nsent == 1 && resv) {
        /* COMMIT, asking for a reservation for the next put */
        t0 = kvf_time_ns();
        c = kvf_store_take_plain(st, &may_reserve);
        w.len = 0;
        kvf_store_wr_commit(&w, keys[0], e[0].put_id, lens[0], sums[0], mask[0],
                            flags, (mask[0] && may_reserve) ? lens[0] : 0,
                            replicas);
        status = (c == NULL)
                     ? KVF_ERR_CONNECT
                     : kvf_store_rpc_on(st, c, KVF_SP_COMMIT, 1, &w, &closed);
        tm->commit_ns = kvf_time_ns() - t0;
        if (c != NULL && !closed) {
            if (status == KVF_OK) {
                status = kvf_store_rd_commit(st, c, lens[0], replicas);
            }
            kvf_store_release(st, c);
        }
        if (s[0] == KVF_OK && status != KVF_OK) {
            s[0] = status;
        }
        if (s[0] == KVF_OK) {
            kvf_store_note_put(st, keys[0], &e[0], lens[0], mask[0]);
        }
        status = s[0];
        goto out;
    }
    if (nsent > 0) {
        t0 = kvf_time_ns();
        status = kvf_store_rpc(st, KVF_SP_PUT_END, (uint32_t)nsent, &w, &c);
        tm->commit_ns = kvf_time_ns() - t0;
        if (status != KVF_OK) {
            goto fail_all;
        }
        kvf_rd_init(&r, c->f.body, c->f.hdr.meta_len);
        for (i = 0; i < count && c->f.hdr.count == nsent; i++) {
            if (e[i].status != KVF_OK || e[i].put_id == 0) {
                continue;
            }
            status = (kvf_status_t)(int32_t)kvf_rd_u32(&r);
            if (s[i] == KVF_OK && status != KVF_OK) {
                s[i] = status;
            }
        }
        status =
            (c->f.hdr.count != nsent) ? KVF_ERR_PROTOCOL : kvf_rd_status(&r);
        kvf_store_release(st, c);
        if (status != KVF_OK) {
            goto fail_all;
        }
    }
    for (i = 0; i < count; i++) {
        if (s[i] == KVF_OK) {
            kvf_store_note_put(st, keys[i], &e[i], lens[i], mask[i]);
        }
    }
    status = kvf_store_first_error(s, count);
    goto out;

fail_all:
    for (i = 0; i < count; i++) {
        if (s[i] == KVF_OK) {
            s[i] = status;
        }
    }
out:
    kvf_wr_free(&w);
    kvf_free(e);
    kvf_free(sums);
    kvf_free(mask);
    kvf_free(ops);
    kvf_free(sps);
    kvf_free(op_st);
    kvf_free(opkey);
    kvf_free(oprep);
    kvf_free(own);
    return status;
}

/* GET round trip for count keys; e[i].status per key. */
static kvf_status_t kvf_store_lookup(kvf_store_h st, size_t count,
                                     const char *const *keys, kvf_sreps_t *e,
                                     unsigned *lease_ms_p)
{
    kvf_status_t status;
    size_t i, nsent = 0;
    kvf_sconn_t *c;
    kvf_wr_t w;
    kvf_rd_t r;

    kvf_wr_init(&w);
    for (i = 0; i < count; i++) {
        e[i].status = kvf_sp_key_check(keys[i]);
        if (e[i].status == KVF_OK) {
            kvf_wr_str(&w, keys[i]);
            nsent++;
        }
    }
    if (nsent == 0) {
        kvf_wr_free(&w);
        return KVF_OK;
    }
    status = kvf_store_rpc(st, KVF_SP_GET, (uint32_t)nsent, &w, &c);
    kvf_wr_free(&w);
    if (status != KVF_OK) {
        return status;
    }
    kvf_rd_init(&r, c->f.body, c->f.hdr.meta_len);
    for (i = 0; i < count && c->f.hdr.count == nsent; i++) {
        if (e[i].status != KVF_OK) {
            continue;
        }
        e[i].status = (kvf_status_t)(int32_t)kvf_rd_u32(&r);
        e[i].size = kvf_rd_u64(&r);
        e[i].checksum = kvf_rd_u64(&r);
        *lease_ms_p = kvf_rd_u32(&r);
        kvf_store_rd_reps(&r, &e[i]);
        if (e[i].status == KVF_OK && e[i].nrep == 0) {
            e[i].status = KVF_ERR_NOT_FOUND;
        }
    }
    status = (c->f.hdr.count != nsent) ? KVF_ERR_PROTOCOL : kvf_rd_status(&r);
    kvf_store_release(st, c);
    return status;
}

kvf_status_t kvf_store_get_batch(kvf_store_h st, size_t count,
                                 const char *const *keys, void *const *bufs,
                                 const size_t *caps, size_t *lens,
                                 unsigned flags, kvf_status_t *statuses)
{
    kvf_store_timing_t *tm = &kvf_store_tl_timing;
    kvf_status_t status, *s = statuses, *own = NULL, *op_st = NULL;
    kvf_speer_t **sps = NULL;
    kvf_sreps_t *e = NULL;
    kvf_op_t *ops = NULL;
    uint32_t *opkey = NULL;
    unsigned round, maxrep = 0, lease_ms = 0, *mism = NULL, *oprep = NULL;
    unsigned char *want = NULL;
    unsigned start;
    int spec_used = 0, spec_done = 0;
    size_t i, nops;
    uint64_t t0, sum, sent_ns, spec_sent_ns = 0;
    unsigned spec_lease_ms = 0;

    if (st == NULL || keys == NULL || bufs == NULL || caps == NULL ||
        count == 0 || count > KVF_STORE_BATCH_MAX) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (s == NULL && (s = own = kvf_calloc(count, sizeof(*s))) == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    memset(tm, 0, sizeof(*tm));
    e = kvf_calloc(count, sizeof(*e));
    ops = kvf_calloc(count, sizeof(*ops));
    sps = kvf_calloc(count, sizeof(*sps));
    op_st = kvf_calloc(count, sizeof(*op_st));
    opkey = kvf_calloc(count, sizeof(*opkey));
    mism = kvf_calloc(count, sizeof(*mism));
    oprep = kvf_calloc(count, sizeof(*oprep));
    want = kvf_calloc(count, 1);
    if (!e || !ops || !sps || !op_st || !opkey || !mism || !oprep || !want) {
        status = KVF_ERR_NO_MEMORY;
        goto out;
    }
    if (count == 1 && !(flags & KVF_STORE_DEVICE_MEM) &&
        kvf_sp_key_check(keys[0]) == KVF_OK) {
        kvf_store_get_spec(st, keys[0], bufs[0], caps[0], &e[0], &spec_used,
                           &spec_done, &spec_sent_ns, &spec_lease_ms);
    }
    if (spec_done) {
        s[0] = KVF_OK;
        if (lens != NULL) {
            lens[0] = e[0].size;
        }
        status = KVF_OK;
        goto out;
    }
    t0 = kvf_time_ns();
    sent_ns = spec_used ? spec_sent_ns : t0;
    lease_ms = spec_used ? spec_lease_ms : 0;
    status =
        spec_used ? KVF_OK : kvf_store_lookup(st, count, keys, e, &lease_ms);
    if (!spec_used) {
        tm->query_ns = kvf_time_ns() - t0;
    }
    if (status != KVF_OK) {
        for (i = 0; i < count; i++) {
            s[i] = status;
        }
        goto out;
    }
    for (i = 0; i < count; i++) {
        s[i] = e[i].status;
        if (s[i] == KVF_OK && (bufs[i] == NULL || caps[i] < e[i].size)) {
            s[i] = KVF_ERR_NO_RESOURCE;
        }
        if (s[i] == KVF_OK) {
            s[i] = KVF_INPROGRESS;
            want[i] = 1;
            if (e[i].nrep > maxrep) {
                maxrep = e[i].nrep;
            }
        }
    }
    /* round r reads each key still wanted from its next replica; the
     * first replica rotates from call to call to spread the reads */
    start = kvf_store_tl_rr++;
    for (round = 0; round < maxrep; round++) {
        nops = 0;
        for (i = 0; i < count; i++) {
            unsigned k;

            if (!want[i] || round >= e[i].nrep) {
                continue;
            }
            k = (unsigned)((start + i + round) % e[i].nrep);
            status = kvf_store_peer_get(st, e[i].seg[k], &sps[nops]);
            if (status != KVF_OK) {
                s[i] = status;
                continue;
            }
            ops[nops].type = KVF_OP_READ;
            ops[nops].local = bufs[i];
            ops[nops].peer = sps[nops]->peer;
            ops[nops].remote = e[i].addr[k];
            ops[nops].length = e[i].size;
            opkey[nops] = (uint32_t)i;
            oprep[nops] = k;
            nops++;
        }
        if (nops == 0) {
            continue;
        }
        t0 = kvf_time_ns();
        kvf_store_run(st, ops, sps, nops, op_st, NULL, NULL);
        tm->read_ns += kvf_time_ns() - t0;
        t0 = kvf_time_ns();
        for (i = 0; i < nops; i++) {
            size_t key = opkey[i], len = e[key].size;
            kvf_speer_t *sp;

            if (op_st[i] != KVF_OK) {
                kvf_log_rl(KVF_LOG_WARN,
                           "store get '%s': read from %s "
                           "failed: %s",
                           keys[key], e[key].seg[oprep[i]],
                           kvf_status_str(op_st[i]));
                s[key] = op_st[i];
                continue;
            }
            if (flags & KVF_STORE_DEVICE_MEM) {
                /* not CPU-readable: the node checksums its replica */
                sum = ~e[key].checksum;
                if (kvf_store_peer_get(st, e[key].seg[oprep[i]], &sp) ==
                    KVF_OK) {
                    if (kvf_peer_checksum(sp->peer, &ops[i].remote, &len, 1,
                                          &sum) != KVF_OK) {
                        sum = ~e[key].checksum;
                    }
                    kvf_store_peer_put(st, sp, 0);
                }
            } else {
                sum = kvf_store_sum(bufs[key], len);
            }
            if (sum != e[key].checksum) {
                kvf_log_rl(KVF_LOG_ERROR,
                           "store get '%s': replica on %s "
                           "has checksum %016lx, expected %016lx: not used",
                           keys[key], e[key].seg[oprep[i]], (unsigned long)sum,
                           (unsigned long)e[key].checksum);
                mism[key]++;
                s[key] = KVF_ERR_CHECKSUM;
                continue;
            }
            s[key] = KVF_OK;
            want[key] = 0;
            kvf_sloc_note(&st->loc, keys[key], &e[key], oprep[i],
                          kvf_sloc_lease_end(&st->loc, sent_ns, lease_ms));
            if (lens != NULL) {
                lens[key] = e[key].size;
            }
        }
        tm->verify_ns += kvf_time_ns() - t0;
    }
    for (i = 0; i < count; i++) {
        if (s[i] == KVF_INPROGRESS) {
            s[i] = KVF_ERR_INTERNAL;
        } else if (s[i] != KVF_OK && mism[i] > 0) {
            s[i] = KVF_ERR_CHECKSUM;
        }
    }
    status = kvf_store_first_error(s, count);
out:
    kvf_free(e);
    kvf_free(ops);
    kvf_free(sps);
    kvf_free(op_st);
    kvf_free(opkey);
    kvf_free(oprep);
    kvf_free(mism);
    kvf_free(want);
    kvf_free(own);
    return status;
}

static kvf_status_t kvf_store_keys_call(kvf_store_h st, uint8_t type,
                                        size_t count, const char *const *keys,
                                        kvf_status_t *statuses)
{
    kvf_status_t status, *s = statuses, *own = NULL;
    size_t i, nsent = 0;
    kvf_sconn_t *c;
    kvf_wr_t w;
    kvf_rd_t r;

    if (st == NULL || keys == NULL || count == 0 ||
        count > KVF_STORE_BATCH_MAX) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (s == NULL && (s = own = kvf_calloc(count, sizeof(*s))) == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf_wr_init(&w);
    for (i = 0; i < count; i++) {
        s[i] = kvf_sp_key_check(keys[i]);
        if (s[i] == KVF_OK) {
            kvf_wr_str(&w, keys[i]);
            nsent++;
        }
    }
    status = KVF_OK;
    if (nsent > 0) {
        status = kvf_store_rpc(st, type, (uint32_t)nsent, &w, &c);
    }
    if (nsent > 0 && status == KVF_OK) {
        kvf_rd_init(&r, c->f.body, c->f.hdr.meta_len);
        for (i = 0; i < count && c->f.hdr.count == nsent; i++) {
            if (s[i] == KVF_OK) {
                s[i] = (kvf_status_t)(int32_t)kvf_rd_u32(&r);
            }
        }
        status =
            (c->f.hdr.count != nsent) ? KVF_ERR_PROTOCOL : kvf_rd_status(&r);
        kvf_store_release(st, c);
    }
    for (i = 0; i < count && status != KVF_OK; i++) {
        s[i] = (s[i] == KVF_OK) ? status : s[i];
    }
    kvf_wr_free(&w);
    status = kvf_store_first_error(s, count);
    kvf_free(own);
    return status;
}

kvf_status_t kvf_store_remove_batch(kvf_store_h st, size_t count,
                                    const char *const *keys,
                                    kvf_status_t *statuses)
{
    size_t i;

    for (i = 0;
         st != NULL && keys != NULL && i < count && i <= KVF_STORE_BATCH_MAX;
         i++) {
        if (keys[i] != NULL) {
            kvf_sloc_forget(&st->loc, keys[i]);
        }
    }
    return kvf_store_keys_call(st, KVF_SP_REMOVE, count, keys, statuses);
}

kvf_status_t kvf_store_exists_batch(kvf_store_h st, size_t count,
                                    const char *const *keys,
                                    kvf_status_t *statuses)
{
    return kvf_store_keys_call(st, KVF_SP_EXISTS, count, keys, statuses);
}

kvf_status_t kvf_store_put(kvf_store_h st, const char *key, const void *buf,
                           size_t len, const kvf_store_put_opts_t *opts)
{
    kvf_status_t s;

    return kvf_store_put_batch(st, 1, &key, &buf, &len, opts, &s);
}

kvf_status_t kvf_store_get(kvf_store_h st, const char *key, void *buf,
                           size_t cap, size_t *len_p, unsigned flags)
{
    kvf_status_t s;

    return kvf_store_get_batch(st, 1, &key, &buf, &cap, len_p, flags, &s);
}

kvf_status_t kvf_store_remove(kvf_store_h st, const char *key)
{
    return kvf_store_remove_batch(st, 1, &key, NULL);
}

kvf_status_t kvf_store_exists(kvf_store_h st, const char *key)
{
    return kvf_store_keys_call(st, KVF_SP_EXISTS, 1, &key, NULL);
}

kvf_status_t kvf_store_query(kvf_store_h st, const char *key,
                             kvf_store_info_t *info_p)
{
    kvf_status_t status;
    unsigned lease_ms = 0, i;
    kvf_sreps_t *e;

    if (st == NULL || info_p == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    e = kvf_calloc(1, sizeof(*e));
    if (e == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_store_lookup(st, 1, &key, e, &lease_ms);
    if (status == KVF_OK) {
        status = e->status;
    }
    if (status == KVF_OK) {
        memset(info_p, 0, sizeof(*info_p));
        info_p->size = e->size;
        info_p->checksum = e->checksum;
        info_p->replicas = e->nrep;
        info_p->lease_ms = lease_ms;
        for (i = 0; i < e->nrep; i++) {
            memcpy(info_p->segment[i], e->seg[i], KVF_STORE_SEG_MAX);
            info_p->addr[i] = e->addr[i];
        }
    }
    kvf_free(e);
    return status;
}

kvf_status_t kvf_store_list(kvf_store_h st, const char *prefix, size_t max,
                            void (*fn)(const kvf_store_entry_t *e, void *arg),
                            void *arg)
{
    char key[KVF_STORE_KEY_MAX + 1];
    kvf_store_entry_t ent;
    kvf_status_t status;
    kvf_sconn_t *c;
    uint32_t i;
    kvf_wr_t w;
    kvf_rd_t r;

    if (st == NULL || fn == NULL ||
        (prefix != NULL && strlen(prefix) > KVF_STORE_KEY_MAX)) {
        return KVF_ERR_INVALID_PARAM;
    }
    kvf_wr_init(&w);
    kvf_wr_str(&w, prefix ? prefix : "");
    kvf_wr_u32(&w, (uint32_t)(max > UINT32_MAX ? UINT32_MAX : max));
    status = kvf_store_rpc(st, KVF_SP_LIST, 0, &w, &c);
    kvf_wr_free(&w);
    if (status != KVF_OK) {
        return status;
    }
    kvf_rd_init(&r, c->f.body, c->f.hdr.meta_len);
    for (i = 0; i < c->f.hdr.count; i++) {
        kvf_rd_str(&r, key, sizeof(key));
        ent.key = key;
        ent.size = kvf_rd_u64(&r);
        ent.committed = kvf_rd_u8(&r);
        ent.replicas = kvf_rd_u8(&r);
        if (kvf_rd_status(&r) != KVF_OK) {
            break;
        }
        fn(&ent, arg);
    }
    status = kvf_rd_status(&r);
    if (status == KVF_OK && (c->f.hdr.flags & KVF_SP_TRUNCATED)) {
        kvf_info("store list: reply truncated (more keys match)");
    }
    kvf_store_release(st, c);
    return status;
}
