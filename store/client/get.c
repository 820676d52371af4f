/*
 * Store client: get. One path, kvf_get_run, behind kvf_store_get_batch,
 * kvf_store_get and kvf_store_read, in stages:
 *
 *   look up  each key's size, checksum and replicas, by one strategy:
 *            - the master's GET round trip (it grants a read lease);
 *            - the location cache (loc.c), for a single-key host get: a
 *              lease read, or a read of the cached location while the
 *              GET is in flight;
 *            - what the caller learnt from kvf_store_query
 *              (kvf_store_read): no round trip
 *   move     rounds of one engine batch each: round r reads every key
 *            not yet good from its next replica: replicas on this
 *            client's host first (a node whose segment address is
 *            loopback or the address this client reaches the master
 *            from), then the others; within each group the first
 *            replica rotates from call to call to spread the reads
 *   verify   each read against the checksum before it counts; a key
 *            whose replicas are all bad fails with KVF_ERR_CHECKSUM (or
 *            the read's error); one read from a location the master
 *            gave without a lease (the client's lease budget spent) is
 *            looked up again instead, up to KVF_GET_PASSES passes
 *   release  the location cache learns where each key was read
 */
#include "store/client/client_int.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/log.h"
#include "core/time.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <string.h>
#include <sys/socket.h>

static __thread unsigned kvf_get_tl_rr;

/* One get batch: the caller's arrays and the per-key and per-op state,
 * the latter from one arena. */
typedef struct kvf_get_job {
    kvf_store_h st;
    size_t count;
    const char *const *keys;
    void *const *bufs;
    const size_t *caps;
    size_t *lens;
    int device; /* KVF_STORE_DEVICE_MEM */
    kvf_status_t *s;
    kvf_store_timing_t *tm;
    const kvf_store_info_t *given; /* kvf_store_read's look-up, or NULL */
    uint64_t *sums;        /* kvf_store_get_batch_sums: recorded checksums out,
                              no host hashing (the caller verifies) */
    uint64_t sent_ns;      /* when the look-up left */
    kvf_sreps_t *e;        /* per key: the look-up's answer */
    unsigned *mism;        /* per key: replicas with wrong bytes */
    unsigned char *want;   /* per key: still to read */
    uint64_t *opsum;       /* per op of a round: its buffer's checksum, */
    unsigned char *summed; /* computed while the batch ran (1) or not */
    kvf_smove_t mv;        /* one read per key per round */
    kvf_sarena_t arena;
} kvf_get_job_t;

static void kvf_get_layout(kvf_get_job_t *j)
{
    size_t n = j->count;
    kvf_sarena_t *a = &j->arena;

    j->e = kvf__sarena_take(a, n * sizeof(*j->e));
    j->mism = kvf__sarena_take(a, n * sizeof(*j->mism));
    j->want = kvf__sarena_take(a, n * sizeof(*j->want));
    j->opsum = kvf__sarena_take(a, n * sizeof(*j->opsum));
    j->summed = kvf__sarena_take(a, n * sizeof(*j->summed));
    j->mv.ops = kvf__sarena_take(a, n * sizeof(*j->mv.ops));
    j->mv.sps = kvf__sarena_take(a, n * sizeof(*j->mv.sps));
    j->mv.st = kvf__sarena_take(a, n * sizeof(*j->mv.st));
    j->mv.key = kvf__sarena_take(a, n * sizeof(*j->mv.key));
    j->mv.rep = kvf__sarena_take(a, n * sizeof(*j->mv.rep));
}

/* The look-up a kvf_store_query made, as a GET's answer. Its lease began
 * before this call: no lease read is built on it (lease_ms 0). */
static void kvf_get_given(const kvf_store_info_t *info, kvf_sreps_t *e)
{
    unsigned k;

    e->status = KVF_OK;
    e->size = info->size;
    e->checksum = info->checksum;
    e->lease_ms = 0;
    e->nrep = (info->replicas <= KVF_STORE_REPLICA_MAX) ? info->replicas : 0;
    for (k = 0; k < e->nrep; k++) {
        memcpy(e->seg[k], info->segment[k], KVF_STORE_SEG_MAX);
        e->seg[k][KVF_STORE_SEG_MAX - 1] = '\0';
        e->addr[k] = info->addr[k];
    }
    if (e->nrep == 0) {
        e->status = KVF_ERR_INVALID_PARAM;
    }
}

/* Look up, by strategy. *done_p = 1: the cached location served the get
 * whole (buf holds the object). */
static kvf_status_t kvf_get_lookup(kvf_get_job_t *j, int *done_p)
{
    kvf__sget_res_t res = KVF__SGET_NONE;
    kvf_status_t status;
    uint64_t t0;

    *done_p = 0;
    j->sent_ns = kvf_time_ns();
    if (j->given != NULL) {
        kvf_get_given(j->given, &j->e[0]);
        return KVF_OK;
    }
    if (j->count == 1 && !j->device && j->sums == NULL &&
        kvf_sp_key_check(j->keys[0]) == KVF_OK) {
        res = kvf__strat_get(j->st, j->keys[0], j->bufs[0], j->caps[0],
                             &j->e[0], &j->sent_ns);
    }
    if (res != KVF__SGET_NONE) {
        *done_p = (res == KVF__SGET_DONE);
        return KVF_OK;
    }
    t0 = kvf_time_ns();
    j->sent_ns = t0;
    status = kvf__slookup(j->st, j->count, j->keys, j->e);
    j->tm->query_ns = kvf_time_ns() - t0;
    return status;
}

/* Which keys to read: found, and fitting the caller's buffer. Returns
 * the most replicas any has (the rounds to run). */
static unsigned kvf_get_plan(kvf_get_job_t *j)
{
    kvf_status_t *s = j->s;
    unsigned maxrep = 0;
    size_t i;

    for (i = 0; i < j->count; i++) {
        s[i] = j->e[i].status;
        if (s[i] == KVF_OK &&
            (j->bufs[i] == NULL || j->caps[i] < j->e[i].size)) {
            s[i] = KVF_ERR_NO_RESOURCE;
        }
        if (s[i] == KVF_OK) {
            s[i] = KVF_INPROGRESS;
            j->want[i] = 1;
            maxrep = (j->e[i].nrep > maxrep) ? j->e[i].nrep : maxrep;
        }
    }
    return maxrep;
}

/* Verify one round's reads; a good one ends its key (release: the
 * location cache learns where it was read). */
static void kvf_get_verify(kvf_get_job_t *j)
{
    kvf_smove_t *mv = &j->mv;
    kvf_sreps_t *e;
    uint64_t sum;
    size_t i, key;

    for (i = 0; i < mv->n; i++) {
        key = mv->key[i];
        e = &j->e[key];
        if (mv->st[i] != KVF_OK) {
            kvf_log_rl(KVF_LOG_WARN, "store get '%s': read from %s failed: %s",
                       KVF_LOG_KEY(j->keys[key]),
                       KVF_LOG_KEY(e->seg[mv->rep[i]]),
                       kvf_status_str(mv->st[i]));
            j->s[key] = mv->st[i];
            continue;
        }
        if (j->sums != NULL) {
            sum = e->checksum; /* the caller verifies against it */
            j->sums[key] = e->checksum;
        } else if (j->summed[i]) {
            sum = j->opsum[i]; /* hashed as it landed */
        } else if (kvf__ssum(j->st, j->bufs[key], e->size, j->device, e,
                             mv->rep[i], &sum) != KVF_OK) {
            sum = ~e->checksum;
        }
        if (sum != e->checksum) {
            kvf_log_rl((e->lease_ms == 0) ? KVF_LOG_WARN : KVF_LOG_ERROR,
                       "store get '%s': replica on %s has checksum %016lx, "
                       "expected %016lx: not used",
                       KVF_LOG_KEY(j->keys[key]),
                       KVF_LOG_KEY(e->seg[mv->rep[i]]), (unsigned long)sum,
                       (unsigned long)e->checksum);
            j->mism[key]++;
            j->s[key] = KVF_ERR_CHECKSUM;
            continue;
        }
        j->s[key] = KVF_OK;
        j->want[key] = 0;
        kvf__strat_seen(j->st, j->keys[key], e, mv->rep[i], j->sent_ns);
        if (j->lens != NULL) {
            j->lens[key] = e->size;
        }
    }
}

/*
 * Verification overlapped with the reads: while the round's batch runs,
 * the calling thread hashes each op's buffer once all its bytes are in
 * (kvf_batch_op_status: bytes moved = length), in op order, yielding
 * while the next has not landed. Stops when every op is hashed, at a
 * batch that ended (kvf_get_verify hashes what is left) or after the
 * store's timeout. Host memory only, and batches of several ops (a lone
 * op gains nothing from it).
 */
static void kvf_get_sum_landed(void *arg)
{
    kvf_get_job_t *j = arg;
    kvf_smove_t *mv = &j->mv;
    uint64_t end = kvf_time_ns() + (uint64_t)j->st->timeout_ms * 1000000u;
    const kvf_sreps_t *e;
    kvf_status_t s;
    size_t i = 0, got;

    while (i < mv->n && mv->batch != NULL) {
        e = &j->e[mv->key[i]];
        s = kvf_batch_op_status(mv->batch, i, &got);
        if (s == KVF_INPROGRESS && got == e->size) {
            j->summed[i] = kvf__ssum(j->st, j->bufs[mv->key[i]], e->size, 0, e,
                                     mv->rep[i], &j->opsum[i]) == KVF_OK;
            i++;
        } else if (s != KVF_INPROGRESS && s != KVF_OK) {
            i++; /* this op failed; verify reports it */
        } else if (s == KVF_OK || kvf_time_ns() > end) {
            return; /* the batch ended (or is late): verify does the rest */
        } else {
            sched_yield();
        }
    }
}

/* Is a node of this segment (host:port, [v6]:port) on this client's
 * host? Its address is loopback or the one this client reaches the
 * master from. */
static int kvf_get_local(kvf_store_h st, const char *seg)
{
    char host[KVF_STORE_SEG_MAX];
    const char *colon = strrchr(seg, ':');
    size_t n = (colon != NULL) ? (size_t)(colon - seg) : strlen(seg);

    if (n > 1 && seg[0] == '[' && seg[n - 1] == ']') {
        seg++;
        n -= 2;
    }
    if (n == 0 || n >= sizeof(host)) {
        return 0;
    }
    memcpy(host, seg, n);
    host[n] = '\0';
    return kvf_auth_is_loopback(host) ||
           (st->self_host[0] != '\0' && strcmp(host, st->self_host) == 0);
}

/* The replica a get reads in round `round` (each round the next one):
 * those on this client's host first, then the others, each group
 * rotated by rot to spread the reads. */
static unsigned kvf_get_pick(kvf_store_h st, const kvf_sreps_t *e,
                             unsigned round, unsigned rot)
{
    uint8_t local[KVF_STORE_REPLICA_MAX];
    unsigned k, nloc = 0, want, seen = 0;

    if (e->nrep <= 1) {
        return 0;
    }
    for (k = 0; k < e->nrep; k++) {
        local[k] = (uint8_t)kvf_get_local(st, e->seg[k]);
        nloc += local[k];
    }
    if (nloc == 0 || nloc == e->nrep) {
        return (rot + round) % e->nrep;
    }
    want = (round < nloc) ? (rot + round) % nloc
                          : (rot + round - nloc) % (e->nrep - nloc);
    for (k = 0; k < e->nrep; k++) {
        if (local[k] == (round < nloc) && seen++ == want) {
            return k;
        }
    }
    return round % e->nrep; /* not reached */
}

/* Move and verify, round `round`: each key still wanted from its next
 * replica. */
static void kvf_get_round(kvf_get_job_t *j, unsigned round, unsigned start)
{
    kvf_status_t status;
    uint64_t t0;
    size_t i;
    unsigned k;
    int overlap;

    j->mv.n = 0;
    for (i = 0; i < j->count; i++) {
        if (!j->want[i] || round >= j->e[i].nrep) {
            continue;
        }
        k = kvf_get_pick(j->st, &j->e[i], round, (unsigned)(start + i));
        status = kvf__smove_add(j->st, &j->mv, KVF_OP_READ, j->bufs[i],
                                &j->e[i], k, j->e[i].size, (uint32_t)i);
        j->s[i] = (status != KVF_OK) ? status : j->s[i];
    }
    if (j->mv.n == 0) {
        return;
    }
    memset(j->summed, 0, j->mv.n * sizeof(*j->summed));
    overlap = !j->device && j->sums == NULL && j->mv.n > 1;
    t0 = kvf_time_ns();
    kvf__smove_run(j->st, &j->mv, overlap ? kvf_get_sum_landed : NULL, j);
    j->tm->read_ns += kvf_time_ns() - t0;
    t0 = kvf_time_ns();
    kvf_get_verify(j);
    j->tm->verify_ns += kvf_time_ns() - t0;
}

/* One pass: look up -> move -> verify -> release */
static kvf_status_t kvf_get_pass(kvf_get_job_t *j)
{
    kvf_status_t status;
    unsigned round, maxrep, start;
    int done;
    size_t i;

    status = kvf_get_lookup(j, &done);
    if (status != KVF_OK) {
        for (i = 0; i < j->count; i++) {
            j->s[i] = status;
        }
        return status;
    }
    if (done) {
        j->s[0] = KVF_OK;
        if (j->lens != NULL) {
            j->lens[0] = j->e[0].size;
        }
        return KVF_OK;
    }
    maxrep = kvf_get_plan(j);
    start = kvf_get_tl_rr++;
    for (round = 0; round < maxrep; round++) {
        kvf_get_round(j, round, start);
    }
    for (i = 0; i < j->count; i++) {
        if (j->s[i] == KVF_INPROGRESS) {
            j->s[i] = KVF_ERR_INTERNAL;
        } else if (j->s[i] != KVF_OK && j->mism[i] > 0) {
            j->s[i] = KVF_ERR_CHECKSUM;
        }
    }
    return kvf__sfirst_error(j->s, j->count);
}

/* Did a key read wrong bytes from a location the master gave without a
 * read lease (its budget spent)? Its space may have been freed and
 * reused under the read: a fresh look-up tells the key's present. */
static int kvf_get_unleased_bad(const kvf_get_job_t *j)
{
    size_t i;

    for (i = 0; i < j->count && j->given == NULL; i++) {
        if (j->s[i] == KVF_ERR_CHECKSUM && j->e[i].lease_ms == 0) {
            return 1;
        }
    }
    return 0;
}

/* kvf_get_pass, again (at most KVF_GET_PASSES in all) while a key read
 * an unleased location that changed under it. */
#define KVF_GET_PASSES 3
static kvf_status_t kvf_get_run(kvf_get_job_t *j)
{
    kvf_status_t status;
    unsigned pass;

    for (pass = 1;; pass++) {
        status = kvf_get_pass(j);
        if (pass == KVF_GET_PASSES || !kvf_get_unleased_bad(j)) {
            return status;
        }
        memset(j->mism, 0, j->count * sizeof(*j->mism));
        memset(j->want, 0, j->count * sizeof(*j->want));
    }
}

/* The entry of every get: checks, the job's arena, kvf_get_run. */
static kvf_status_t kvf_get_entry(kvf_get_job_t *j)
{
    kvf_status_t status, *own = NULL;

    if (j->st == NULL || j->keys == NULL || j->bufs == NULL ||
        j->caps == NULL || j->count == 0 || j->count > KVF_STORE_BATCH_MAX) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (j->s == NULL &&
        (j->s = own = kvf_calloc(j->count, sizeof(*j->s))) == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    memset(j->tm, 0, sizeof(*j->tm));
    kvf_get_layout(j);
    status = kvf__sarena_alloc(&j->arena);
    if (status == KVF_OK) {
        kvf_get_layout(j);
        status = kvf_get_run(j);
        kvf__sarena_free(&j->arena);
    }
    kvf_free(own);
    return status;
}

kvf_status_t kvf_store_get_batch(kvf_store_h st, size_t count,
                                 const char *const *keys, void *const *bufs,
                                 const size_t *caps, size_t *lens,
                                 unsigned flags, kvf_status_t *statuses)
{
    kvf_get_job_t j = {.st = st,
                       .count = count,
                       .keys = keys,
                       .bufs = bufs,
                       .caps = caps,
                       .lens = lens,
                       .s = statuses,
                       .tm = &kvf__stl_timing};

    j.device = (flags & KVF_STORE_DEVICE_MEM) != 0;
    return kvf_get_entry(&j);
}

kvf_status_t kvf_store_get_batch_sums(kvf_store_h st, size_t count,
                                      const char *const *keys,
                                      void *const *bufs, const size_t *caps,
                                      size_t *lens, unsigned flags,
                                      uint64_t *sums, kvf_status_t *statuses)
{
    kvf_get_job_t j = {.st = st,
                       .count = count,
                       .keys = keys,
                       .bufs = bufs,
                       .caps = caps,
                       .lens = lens,
                       .s = statuses,
                       .sums = sums,
                       .tm = &kvf__stl_timing};

    if (sums == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    j.device = (flags & KVF_STORE_DEVICE_MEM) != 0;
    return kvf_get_entry(&j);
}

kvf_status_t kvf_store_get(kvf_store_h st, const char *key, void *buf,
                           size_t cap, size_t *len_p, unsigned flags)
{
    kvf_status_t s;

    return kvf_store_get_batch(st, 1, &key, &buf, &cap, len_p, flags, &s);
}

kvf_status_t kvf_store_read(kvf_store_h st, const char *key,
                            const kvf_store_info_t *info, void *buf, size_t cap,
                            size_t *len_p, unsigned flags)
{
    kvf_get_job_t j = {.st = st,
                       .count = 1,
                       .keys = &key,
                       .bufs = &buf,
                       .caps = &cap,
                       .lens = len_p,
                       .given = info,
                       .tm = &kvf__stl_timing};
    kvf_status_t s;

    if (info == NULL || kvf_sp_key_check(key) != KVF_OK) {
        return KVF_ERR_INVALID_PARAM;
    }
    j.s = &s;
    j.device = (flags & KVF_STORE_DEVICE_MEM) != 0;
    return kvf_get_entry(&j);
}
