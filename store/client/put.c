/*
 * Store client: put. One entry, kvf_store_put_batch, in stages:
 *
 *   look up  PUT_START: the master allocates every replica of every key
 *   move     one engine batch writes them all; the checksums are
 *            computed on the CPU while it is in flight
 *   verify   memory the CPU cannot read: each node checksums its replica
 *   commit   PUT_END with each key's mask of written replicas (a mask of
 *            0 aborts); a single key commits with COMMIT instead, which
 *            also asks for a reservation of the same size for the
 *            connection's next put
 *
 * One strategy skips the look-up: a single-key host put finding such a
 * reservation (same size and replica count, used within 250 ms and half
 * the put timeout, on a connection the master has not closed) writes
 * into it and commits with one COMMIT: one master round trip instead of
 * two (store config `put_reserve`). A COMMIT finding its reservation
 * gone (STALE) falls back to the full path; one refused for the key
 * (EXISTS, BUSY) keeps the reservation.
 */
#include "store/client/client_int.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>

/* A reservation is used at most this long after it was granted. */
#define KVF_STORE_RESV_USE_MS 250

/* One put batch: the caller's arrays and the per-key and per-op state,
 * the latter from one arena. */
typedef struct kvf_put_job {
    kvf_store_h st;
    size_t count;
    const char *const *keys;
    const void *const *bufs;
    const size_t *lens;
    unsigned replicas;
    unsigned flags;
    int device; /* KVF_STORE_DEVICE_MEM */
    int resv;   /* a single host put: reservations apply */
    kvf_status_t *s;
    kvf_store_timing_t *tm;
    size_t nalloc;  /* keys sent in PUT_START */
    kvf_sreps_t *e; /* per key: the master's allocation */
    uint64_t *sums; /* per key */
    unsigned *mask; /* per key: replicas written */
    kvf_smove_t mv; /* up to count x KVF_STORE_REPLICA_MAX writes */
    kvf_sarena_t arena;
} kvf_put_job_t;

static void kvf_put_layout(kvf_put_job_t *j)
{
    size_t n = j->count, nops = n * KVF_STORE_REPLICA_MAX;
    kvf_sarena_t *a = &j->arena;

    j->e = kvf__sarena_take(a, n * sizeof(*j->e));
    j->sums = kvf__sarena_take(a, n * sizeof(*j->sums));
    j->mask = kvf__sarena_take(a, n * sizeof(*j->mask));
    j->mv.ops = kvf__sarena_take(a, nops * sizeof(*j->mv.ops));
    j->mv.sps = kvf__sarena_take(a, nops * sizeof(*j->mv.sps));
    j->mv.st = kvf__sarena_take(a, nops * sizeof(*j->mv.st));
    j->mv.key = kvf__sarena_take(a, nops * sizeof(*j->mv.key));
    j->mv.rep = kvf__sarena_take(a, nops * sizeof(*j->mv.rep));
}

static kvf_status_t kvf_put_job_alloc(kvf_put_job_t *j)
{
    kvf_status_t status;

    kvf_put_layout(j);
    status = kvf__sarena_alloc(&j->arena);
    if (status == KVF_OK) {
        kvf_put_layout(j);
    }
    return status;
}

/* The strategies learn where a put wrote (its first replica). */
static void kvf_put_note(kvf_store_h st, const char *key, kvf_sreps_t *e,
                         size_t len, unsigned mask)
{
    unsigned k;

    for (k = 0; k < e->nrep; k++) {
        if (mask & (1u << k)) {
            e->size = len;
            kvf__strat_seen(st, key, e, k, 0);
            return;
        }
    }
}

/* ---- commit: COMMIT of one key, with or without a reservation ---- */

/* Reads a COMMIT reply from c->f: the key's status, and the new
 * reservation into c->resv (when one came and c holds none). */
static kvf_status_t kvf_put_rd_commit(kvf_store_h st, kvf_sconn_t *c,
                                      uint64_t size, unsigned replicas)
{
    kvf_sreps_t nr;
    kvf_rd_t r;

    kvf_rd_init(&r, c->f.body, c->f.hdr.meta_len);
    kvf_sm_commit_rep_dec(&r, &nr);
    if (kvf_sm_rep_end(&r, c->f.hdr.count, 1) != KVF_OK) {
        return KVF_ERR_PROTOCOL;
    }
    if (nr.put_id != 0 && nr.nrep > 0 && c->resv.r.put_id == 0) {
        nr.size = size;
        c->resv.r = nr;
        c->resv.replicas = replicas;
        c->resv.peer_epoch = __atomic_load_n(&st->peer_epoch, __ATOMIC_ACQUIRE);
        /* used only while young: well within the master's deadline, and
         * too short for its node to restart and register again (a
         * reservation's address would then be another object's) */
        c->resv.until_ms =
            kvf_time_ms() + (nr.put_timeout_ms / 2 < KVF_STORE_RESV_USE_MS
                                 ? nr.put_timeout_ms / 2
                                 : KVF_STORE_RESV_USE_MS);
    }
    return nr.status;
}

/* One COMMIT round trip on c (q: the key's commit, and the reservation
 * asked for the next put); *closed_p: c is gone. */
static kvf_status_t kvf_put_commit_on(kvf_store_h st, kvf_sconn_t *c,
                                      const kvf_sm_req_t *q, int *closed_p)
{
    kvf_store_timing_t *tm = &kvf__stl_timing;
    kvf_status_t status;
    uint64_t t0;
    kvf_wr_t w;

    kvf_wr_init(&w);
    kvf_sm_commit_enc(&w, q);
    t0 = kvf_time_ns();
    status = kvf__srpc_on(st, c, KVF_SP_COMMIT, 1, &w, closed_p);
    tm->commit_ns = kvf_time_ns() - t0;
    kvf_wr_free(&w);
    if (!*closed_p && status == KVF_OK) {
        status = kvf_put_rd_commit(st, c, q->size, q->next_replicas);
    }
    return status;
}

/* A COMMIT entry for a key written at put_id. */
static void kvf_put_commit_req(kvf_sm_req_t *q, const char *key,
                               uint64_t put_id, size_t len, uint64_t sum,
                               unsigned mask, unsigned flags,
                               uint64_t next_size, unsigned replicas)
{
    q->key = key;
    q->put_id = put_id;
    q->size = len;
    q->checksum = sum;
    q->mask = (uint8_t)mask;
    q->flags = (uint8_t)(flags & (KVF_STORE_PIN | KVF_STORE_REPLACE));
    q->next_size = next_size;
    q->next_replicas = (uint8_t)replicas;
}

/* ---- the reservation strategy ---- */

/* Writes every replica of one key at e's addresses; returns the mask of
 * replicas written and sets *err to the first failure. */
static unsigned kvf_put_write_one(kvf_store_h st, const kvf_sreps_t *e,
                                  const void *buf, size_t len,
                                  kvf_status_t *err)
{
    kvf_speer_t *sps[KVF_STORE_REPLICA_MAX];
    kvf_status_t op_st[KVF_STORE_REPLICA_MAX], status;
    kvf_op_t ops[KVF_STORE_REPLICA_MAX];
    unsigned rep[KVF_STORE_REPLICA_MAX], mask = 0, k;
    uint32_t key[KVF_STORE_REPLICA_MAX];
    kvf_smove_t mv = {ops, sps, op_st, key, rep, 0, NULL};
    size_t i;

    *err = KVF_OK;
    for (k = 0; k < e->nrep; k++) {
        status =
            kvf__smove_add(st, &mv, KVF_OP_WRITE, (void *)buf, e, k, len, 0);
        *err = (*err == KVF_OK) ? status : *err;
    }
    kvf__smove_run(st, &mv, NULL, NULL);
    for (i = 0; i < mv.n; i++) {
        if (op_st[i] == KVF_OK) {
            mask |= 1u << rep[i];
        } else if (*err == KVF_OK) {
            *err = op_st[i];
        }
    }
    return mask;
}

/* A single-key put through a connection's reservation. *done = 0 when
 * there was none usable (or it turned out stale): the caller puts the
 * full way. */
static kvf_status_t kvf_put_resv(kvf_put_job_t *j, int *done)
{
    const char *key = j->keys[0];
    size_t len = j->lens[0];
    kvf_store_h st = j->st;
    kvf_status_t status, werr;
    unsigned mask;
    uint64_t t0, sum, id;
    kvf_sm_req_t q;
    kvf_sconn_t *c;
    int closed;

    *done = 0;
    c = kvf__stake_resv(st, len, j->replicas);
    if (c == NULL) {
        return KVF_OK;
    }
    *done = 1;
    t0 = kvf_time_ns();
    mask = kvf_put_write_one(st, &c->resv.r, j->bufs[0], len, &werr);
    j->tm->read_ns = kvf_time_ns() - t0;
    t0 = kvf_time_ns();
    (void)kvf__ssum(st, j->bufs[0], len, 0, &c->resv.r, 0, &sum);
    j->tm->verify_ns = kvf_time_ns() - t0;
    kvf_put_note(st, key, &c->resv.r, len, mask);
    id = c->resv.r.put_id;
    c->resv.r.put_id = 0; /* spent, unless the master says it stays */
    kvf_put_commit_req(&q, key, id, len, sum, mask, j->flags, mask ? len : 0,
                       j->replicas);
    status = kvf_put_commit_on(st, c, &q, &closed);
    if (closed) {
        return status;
    }
    if ((status == KVF_ERR_EXISTS || status == KVF_ERR_BUSY) && mask != 0) {
        c->resv.r.put_id = id; /* refused for the key: the space stays */
    }
    kvf__srelease(st, c);
    if (status != KVF_OK) {
        kvf__strat_gone(st, key);
    }
    if (status == KVF_ERR_STALE || (status == KVF_OK && mask == 0)) {
        /* reclaimed under us, or no replica could be written (aborted):
         * put again the full way, on space allocated now */
        kvf_log_rl(KVF_LOG_DEBUG, "store put '%s': reservation unusable (%s)",
                   KVF_LOG_KEY(key), kvf_status_str(mask ? status : werr));
        *done = 0;
        return KVF_OK;
    }
    return status;
}

/* ---- the full path ---- */

/* Look up: PUT_START for every key that checks; e[i] per key sent. */
static kvf_status_t kvf_put_alloc(kvf_put_job_t *j)
{
    kvf_status_t status, *s = j->s;
    kvf_sm_req_t q;
    kvf_sconn_t *c;
    uint64_t t0;
    kvf_wr_t w;
    kvf_rd_t r;
    size_t i;

    kvf_wr_init(&w);
    q.replicas = (uint8_t)j->replicas;
    q.flags = (uint8_t)(j->flags & (KVF_STORE_PIN | KVF_STORE_REPLACE));
    for (i = 0; i < j->count; i++) {
        s[i] = kvf_sp_key_check(j->keys[i]);
        if (s[i] == KVF_OK && j->bufs[i] == NULL && j->lens[i] > 0) {
            s[i] = KVF_ERR_INVALID_PARAM;
        }
        if (s[i] == KVF_OK) {
            q.key = j->keys[i];
            q.size = j->lens[i];
            kvf_sm_put_start_enc(&w, &q);
            j->nalloc++;
        }
    }
    if (j->nalloc == 0) {
        kvf_wr_free(&w);
        return KVF_OK;
    }
    t0 = kvf_time_ns();
    status = kvf__srpc(j->st, KVF_SP_PUT_START, (uint32_t)j->nalloc, &w, &c);
    j->tm->query_ns = kvf_time_ns() - t0;
    kvf_wr_free(&w);
    if (status != KVF_OK) {
        return status;
    }
    kvf_rd_init(&r, c->f.body, c->f.hdr.meta_len);
    for (i = 0; i < j->count && c->f.hdr.count == j->nalloc; i++) {
        if (s[i] == KVF_OK) {
            kvf_sm_put_start_rep_dec(&r, &j->e[i]);
        }
    }
    status = kvf_sm_rep_end(&r, c->f.hdr.count, (uint32_t)j->nalloc);
    kvf__srelease(j->st, c);
    return status;
}

/* Checksums of the keys being written, computed during their writes:
 * every allocated key (its status may already carry a failed replica,
 * yet another replica may be written and committed). */
static void kvf_put_sum_all(void *arg)
{
    kvf_put_job_t *j = arg;
    uint64_t t0 = kvf_time_ns();
    size_t i;

    for (i = 0; i < j->count; i++) {
        if (j->e[i].status == KVF_OK && j->e[i].put_id != 0) {
            (void)kvf__ssum(j->st, j->bufs[i], j->lens[i], 0, &j->e[i], 0,
                            &j->sums[i]);
        }
    }
    j->tm->verify_ns = kvf_time_ns() - t0;
}

/* Move: every replica of every allocated key in one engine batch. A
 * key's error is kept only if none of its replicas is written. */
static void kvf_put_write(kvf_put_job_t *j)
{
    kvf_smove_t *mv = &j->mv;
    kvf_status_t status, *s = j->s;
    uint64_t t0;
    size_t i;
    unsigned k;

    for (i = 0; i < j->count; i++) {
        if (s[i] != KVF_OK || (s[i] = j->e[i].status) != KVF_OK) {
            continue;
        }
        for (k = 0; k < j->e[i].nrep; k++) {
            status = kvf__smove_add(j->st, mv, KVF_OP_WRITE, (void *)j->bufs[i],
                                    &j->e[i], k, j->lens[i], (uint32_t)i);
            s[i] = (status != KVF_OK) ? status : s[i];
        }
    }
    t0 = kvf_time_ns();
    kvf__smove_run(j->st, mv, j->device ? NULL : kvf_put_sum_all, j);
    j->tm->read_ns = kvf_time_ns() - t0;
    for (i = 0; i < mv->n; i++) {
        if (mv->st[i] == KVF_OK) {
            j->mask[mv->key[i]] |= 1u << mv->rep[i];
        } else if (s[mv->key[i]] == KVF_OK) {
            s[mv->key[i]] = mv->st[i];
        }
    }
}

/* Verify, for memory the CPU cannot read: the node holding a key's
 * first written replica computes its checksum; none: not committed. */
static void kvf_put_verify_device(kvf_put_job_t *j)
{
    kvf_smove_t *mv = &j->mv;
    size_t i, key;

    for (i = 0; i < mv->n; i++) {
        key = mv->key[i];
        if (mv->st[i] != KVF_OK || j->mask[key] == 0 ||
            mv->rep[i] != (unsigned)__builtin_ctz(j->mask[key])) {
            continue; /* failed, or not the first written */
        }
        if (kvf__ssum(j->st, NULL, j->lens[key], 1, &j->e[key], mv->rep[i],
                      &j->sums[key]) != KVF_OK) {
            j->mask[key] = 0;
        }
    }
}

/* Commit, single key: COMMIT, asking for a reservation for the next put
 * when the connection holds none. Folds the outcome into s[0]. */
static void kvf_put_commit_single(kvf_put_job_t *j)
{
    kvf_status_t status = KVF_ERR_CONNECT;
    int may_reserve = 0, closed = 0;
    kvf_sm_req_t q;
    kvf_sconn_t *c;

    c = kvf__stake_plain(j->st, &may_reserve);
    if (c != NULL) {
        kvf_put_commit_req(&q, j->keys[0], j->e[0].put_id, j->lens[0],
                           j->sums[0], j->mask[0], j->flags,
                           (j->mask[0] && may_reserve) ? j->lens[0] : 0,
                           j->replicas);
        status = kvf_put_commit_on(j->st, c, &q, &closed);
    }
    if (c != NULL && !closed) {
        kvf__srelease(j->st, c);
    }
    if (j->s[0] == KVF_OK && status != KVF_OK) {
        j->s[0] = status;
    }
}

/* Commit, batch: PUT_END for every allocated key. */
static kvf_status_t kvf_put_end(kvf_put_job_t *j, uint32_t nsent)
{
    kvf_status_t status;
    kvf_sm_req_t q;
    kvf_sconn_t *c;
    uint64_t t0;
    kvf_wr_t w;
    kvf_rd_t r;
    size_t i;

    kvf_wr_init(&w);
    for (i = 0; i < j->count; i++) {
        if (j->e[i].status == KVF_OK && j->e[i].put_id != 0) {
            q.key = j->keys[i];
            q.put_id = j->e[i].put_id;
            q.checksum = j->sums[i];
            q.mask = (uint8_t)j->mask[i];
            kvf_sm_put_end_enc(&w, &q);
        }
    }
    t0 = kvf_time_ns();
    status = kvf__srpc(j->st, KVF_SP_PUT_END, nsent, &w, &c);
    j->tm->commit_ns = kvf_time_ns() - t0;
    kvf_wr_free(&w);
    if (status != KVF_OK) {
        return status;
    }
    kvf_rd_init(&r, c->f.body, c->f.hdr.meta_len);
    for (i = 0; i < j->count && c->f.hdr.count == nsent; i++) {
        if (j->e[i].status != KVF_OK || j->e[i].put_id == 0) {
            continue;
        }
        status = kvf_sm_status_dec(&r);
        j->s[i] = (j->s[i] == KVF_OK) ? status : j->s[i];
    }
    status = kvf_sm_rep_end(&r, c->f.hdr.count, nsent);
    kvf__srelease(j->st, c);
    return status;
}

/* Commit (or abort, mask 0) every allocated key. */
static kvf_status_t kvf_put_commit(kvf_put_job_t *j)
{
    uint32_t nsent = 0;
    size_t i;

    for (i = 0; i < j->count; i++) {
        if (j->e[i].status != KVF_OK || j->e[i].put_id == 0) {
            continue;
        }
        if (j->mask[i] != 0) {
            j->s[i] = KVF_OK;
        } else if (j->s[i] == KVF_OK) {
            j->s[i] = KVF_ERR_IO;
        }
        nsent++;
    }
    if (nsent == 1 && j->resv) {
        kvf_put_commit_single(j);
        return KVF_OK;
    }
    return (nsent > 0) ? kvf_put_end(j, nsent) : KVF_OK;
}

/* Reservations serve single puts of host memory up to
 * KVF_STORE_RESV_MAX bytes (store config `put_reserve`). */
static int kvf_put_may_reserve(const kvf_put_job_t *j)
{
    return j->st->reserve && j->count == 1 && !j->device && j->lens[0] > 0 &&
           j->lens[0] <= KVF_STORE_RESV_MAX && j->bufs[0] != NULL &&
           kvf_sp_key_check(j->keys[0]) == KVF_OK;
}

/* look up -> move -> verify -> commit */
static kvf_status_t kvf_put_full(kvf_put_job_t *j)
{
    kvf_status_t status;
    size_t i;

    status = kvf_put_alloc(j);
    if (status == KVF_OK && j->nalloc > 0) {
        kvf_put_write(j);
        if (j->device) {
            kvf_put_verify_device(j);
        }
        status = kvf_put_commit(j);
    }
    for (i = 0; i < j->count; i++) {
        if (j->s[i] == KVF_OK && status != KVF_OK) {
            j->s[i] = status; /* the batch failed as a whole */
        } else if (j->s[i] == KVF_OK) {
            kvf_put_note(j->st, j->keys[i], &j->e[i], j->lens[i], j->mask[i]);
        }
    }
    return (status != KVF_OK) ? status : kvf__sfirst_error(j->s, j->count);
}

kvf_status_t kvf_store_put_batch(kvf_store_h st, size_t count,
                                 const char *const *keys,
                                 const void *const *bufs, const size_t *lens,
                                 const kvf_store_put_opts_t *opts,
                                 kvf_status_t *statuses)
{
    kvf_put_job_t j = {.st = st,
                       .count = count,
                       .keys = keys,
                       .bufs = bufs,
                       .lens = lens,
                       .s = statuses,
                       .tm = &kvf__stl_timing};
    kvf_status_t status = KVF_OK, *own = NULL;
    int done = 0;

    j.replicas = opts ? opts->replicas : 0;
    j.flags = opts ? opts->flags : 0;
    if (st == NULL || keys == NULL || bufs == NULL || lens == NULL ||
        count == 0 || count > KVF_STORE_BATCH_MAX ||
        j.replicas > KVF_STORE_REPLICA_MAX) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (j.s == NULL && (j.s = own = kvf_calloc(count, sizeof(*j.s))) == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    memset(j.tm, 0, sizeof(*j.tm));
    j.device = (j.flags & KVF_STORE_DEVICE_MEM) != 0;
    j.resv = kvf_put_may_reserve(&j);
    if (j.resv) {
        status = kvf_put_resv(&j, &done);
        j.s[0] = status;
    }
    if (!done) {
        status = kvf_put_job_alloc(&j);
        status = (status == KVF_OK) ? kvf_put_full(&j) : status;
        kvf__sarena_free(&j.arena);
    }
    kvf_free(own);
    return status;
}

kvf_status_t kvf_store_put(kvf_store_h st, const char *key, const void *buf,
                           size_t len, const kvf_store_put_opts_t *opts)
{
    kvf_status_t s;

    return kvf_store_put_batch(st, 1, &key, &buf, &len, opts, &s);
}
