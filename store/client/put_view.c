/*
 * Store client: put views (kvf_store_view_put). An object is written in
 * place, in this process's mapping of a node's pool, by the caller
 * itself (a GPU copy kernel, threads), instead of copied from its
 * buffer by a put:
 *
 *   allocate  one PUT_START round trip for all keys (the master's
 *             pending puts: not found by anyone until committed)
 *   open      the keys of one node in one WRITE view lease of its
 *             transport (engine/view.h: shm checks the ranges as for a
 *             write and says where they lie in the mapping); a key that
 *             cannot be written in place (node over tcp, pool not
 *             shareable, more than one replica) is aborted at once, one
 *             PUT_END of mask 0 for all of them, so the caller can put
 *             it the ordinary way
 *   commit    the checksums (the caller's, or computed here from the
 *             mapping while the leases hold) -> every lease closed and
 *             judged (held until now?) -> one PUT_END: mask 1 for a key
 *             kept whose lease held and whose put deadline has not
 *             passed, 0 (abort) for every other
 *
 * The handle holds a reference on each node's peer (its mappings stay)
 * until the commit or abort; open handles are listed on the store
 * handle so that a disconnect aborts them.
 */
#include "store/client/client_int.h"
#include <kvferry/view.h>
#include "core/alloc.h"
#include "core/config.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>

#define KVF_PV_NOPART UINT32_MAX

/* What a commit does with one key (kvf_pv_end). */
enum { KVF_PV_SKIP = 0, KVF_PV_ABORT = 1, KVF_PV_COMMIT = 2 };

/* One node's write lease, holding a reference on its peer. */
typedef struct kvf_pvpart {
    kvf_speer_t *sp;
    kvf_view_lease_h tl;
} kvf_pvpart_t;

/* One key of a put view. */
typedef struct kvf_pvkey {
    const char *key; /* in the handle's copy; NULL if it was bad */
    uint64_t put_id; /* 0: not allocated (or no longer) */
    uint64_t len;
    unsigned char *ptr;  /* where it is written (view KVF_OK) */
    kvf_status_t status; /* its view's */
    uint32_t part;       /* its lease, or KVF_PV_NOPART */
} kvf_pvkey_t;

struct kvf_store_put_view {
    kvf_store_h st;
    size_t count;
    uint64_t until_ms; /* the first lease or put deadline to end */
    kvf_pvkey_t *k;
    kvf_pvpart_t *parts;
    size_t nparts;
    struct kvf_store_put_view *next; /* st->pviews */
};

/* One kvf_store_view_put call: the handle being built, the caller's
 * views, the master's allocations and a node group's scratch. */
typedef struct kvf_pv_job {
    kvf_store_put_view_h pv;
    kvf_store_view_t *views;
    unsigned replicas, flags;
    kvf_sreps_t *e;
    unsigned char *taken;
    uint32_t *idx;
    uint64_t *remote, *lens;
    kvf_view_t *tv;
    kvf_sarena_t arena;
} kvf_pv_job_t;

static void kvf_pv_layout(kvf_pv_job_t *j, size_t n)
{
    kvf_sarena_t *a = &j->arena;

    j->e = kvf__sarena_take(a, n * sizeof(*j->e));
    j->taken = kvf__sarena_take(a, n * sizeof(*j->taken));
    j->idx = kvf__sarena_take(a, n * sizeof(*j->idx));
    j->remote = kvf__sarena_take(a, n * sizeof(*j->remote));
    j->lens = kvf__sarena_take(a, n * sizeof(*j->lens));
    j->tv = kvf__sarena_take(a, n * sizeof(*j->tv));
}

/* A handle for count keys, in one allocation: the keys' state, room for
 * one lease per key and a copy of the good keys (a bad one gets its
 * verdict as status). */
static kvf_store_put_view_h kvf_pv_new(kvf_store_h st, size_t count,
                                       const char *const *keys,
                                       const size_t *lens)
{
    size_t i, room = 0, off;
    kvf_store_put_view_h pv;
    char *kb;

    for (i = 0; i < count; i++) {
        room += (kvf_sp_key_check(keys[i]) == KVF_OK) ? strlen(keys[i]) + 1 : 0;
    }
    off = sizeof(*pv) + count * (sizeof(kvf_pvkey_t) + sizeof(kvf_pvpart_t));
    pv = kvf_calloc(1, off + room);
    if (pv == NULL) {
        return NULL;
    }
    pv->st = st;
    pv->count = count;
    pv->k = (kvf_pvkey_t *)(void *)(pv + 1);
    pv->parts = (kvf_pvpart_t *)(void *)(pv->k + count);
    kb = (char *)pv + off;
    for (i = 0; i < count; i++) {
        pv->k[i].part = KVF_PV_NOPART;
        pv->k[i].len = lens[i];
        pv->k[i].status = kvf_sp_key_check(keys[i]);
        if (pv->k[i].status == KVF_OK) {
            pv->k[i].key = memcpy(kb, keys[i], strlen(keys[i]) + 1);
            pv->k[i].status = KVF_INPROGRESS;
            kb += strlen(keys[i]) + 1;
        }
    }
    return pv;
}

/* Allocate: PUT_START for every good key; e[i] per key sent. */
static kvf_status_t kvf_pv_alloc(kvf_pv_job_t *j)
{
    kvf_store_put_view_h pv = j->pv;
    kvf_status_t status;
    uint32_t nsent = 0;
    kvf_sm_req_t q;
    kvf_sconn_t *c;
    kvf_wr_t w;
    kvf_rd_t r;
    size_t i;

    kvf_wr_init(&w);
    q.replicas = (uint8_t)j->replicas;
    q.flags = (uint8_t)(j->flags & (KVF_STORE_PIN | KVF_STORE_REPLACE));
    for (i = 0; i < pv->count; i++) {
        if (pv->k[i].key != NULL) {
            q.key = pv->k[i].key;
            q.size = pv->k[i].len;
            kvf_sm_put_start_enc(&w, &q);
            nsent++;
        }
    }
    if (nsent == 0) {
        kvf_wr_free(&w);
        return KVF_OK;
    }
    status = kvf__srpc(pv->st, KVF_SP_PUT_START, nsent, &w, &c);
    kvf_wr_free(&w);
    if (status != KVF_OK) {
        return status;
    }
    kvf_rd_init(&r, c->f.body, c->f.hdr.meta_len);
    for (i = 0; i < pv->count && c->f.hdr.count == nsent; i++) {
        if (pv->k[i].key != NULL) {
            kvf_sm_put_start_rep_dec(&r, &j->e[i]);
        }
    }
    status = kvf_sm_rep_end(&r, c->f.hdr.count, nsent);
    kvf__srelease(pv->st, c);
    return status;
}

/* The allocations into the keys: a key of one replica waits for its
 * node's lease (an empty one needs none); a refusal is its status; a
 * key of several replicas is UNSUPPORTED (aborted by kvf_pv_drop). */
static void kvf_pv_plan(kvf_pv_job_t *j)
{
    kvf_store_put_view_h pv = j->pv;
    kvf_pvkey_t *k;
    size_t i;

    for (i = 0; i < pv->count; i++) {
        k = &pv->k[i];
        if (k->key == NULL) {
            continue;
        }
        k->status = j->e[i].status;
        if (k->status != KVF_OK) {
            continue;
        }
        k->put_id = j->e[i].put_id;
        if (j->e[i].nrep != 1) {
            k->status = KVF_ERR_UNSUPPORTED;
        } else if (k->len > 0) {
            k->status = KVF_INPROGRESS;
        }
    }
}

/* The n keys of j->idx, all on node seg: one write lease. Keys it views
 * are KVF_OK; the others get its verdict. */
static void kvf_pv_node(kvf_pv_job_t *j, const char *seg, size_t n)
{
    kvf_store_put_view_h pv = j->pv;
    kvf_view_lease_h tl = NULL;
    kvf_speer_t *sp = NULL;
    uint64_t until = 0;
    kvf_status_t st;
    size_t i, good = 0;

    st = kvf__speer_ref(pv->st, seg, &sp);
    if (st == KVF_OK) {
        st = kvf_peer_view_open(sp->peer, KVF_OP_WRITE, n, j->remote, j->lens,
                                j->tv, &until, &tl);
        if (st != KVF_OK) {
            kvf__speer_unref(pv->st, sp, kvf__speer_error(st));
        }
    }
    for (i = 0; i < n; i++) {
        kvf_pvkey_t *k = &pv->k[j->idx[i]];
        kvf_store_view_t *v = &j->views[j->idx[i]];

        k->status = (st != KVF_OK) ? st : j->tv[i].status;
        if (k->status != KVF_OK) {
            continue;
        }
        k->ptr = (unsigned char *)(uintptr_t)j->tv[i].ptr;
        k->part = (uint32_t)pv->nparts;
        v->map_base = j->tv[i].map_base;
        v->map_len = j->tv[i].map_len;
        good++;
    }
    if (st != KVF_OK) {
        return;
    }
    if (good == 0) { /* nothing of it is written in place */
        (void)kvf_peer_view_close(sp->peer, tl);
        kvf__speer_unref(pv->st, sp, 0);
        return;
    }
    pv->parts[pv->nparts].sp = sp;
    pv->parts[pv->nparts].tl = tl;
    pv->nparts++;
    pv->until_ms = (until < pv->until_ms) ? until : pv->until_ms;
}

/* The keys waiting for a lease, grouped by node: one lease each. */
static void kvf_pv_open(kvf_pv_job_t *j)
{
    kvf_store_put_view_h pv = j->pv;
    size_t i, k, n;
    const char *seg;

    for (i = 0; i < pv->count; i++) {
        if (pv->k[i].status != KVF_INPROGRESS || j->taken[i]) {
            continue;
        }
        seg = j->e[i].seg[0];
        for (k = i, n = 0; k < pv->count; k++) {
            if (pv->k[k].status == KVF_INPROGRESS && !j->taken[k] &&
                strcmp(j->e[k].seg[0], seg) == 0) {
                j->taken[k] = 1;
                j->idx[n] = (uint32_t)k;
                j->remote[n] = j->e[k].addr[0];
                j->lens[n] = pv->k[k].len;
                n++;
            }
        }
        kvf_pv_node(j, seg, n);
    }
}

/* PUT_END for every key whose sel is not SKIP: mask 1 and sums[i] for
 * COMMIT, mask 0 for ABORT; s[i] gets a committed key's verdict (an
 * aborted key's stays). Every key sent is spent (put_id 0): on a failed
 * round trip the master undoes them at its put timeout. */
static kvf_status_t kvf_pv_end(kvf_store_put_view_h pv,
                               const unsigned char *sel, const uint64_t *sums,
                               kvf_status_t *s)
{
    kvf_status_t status, ks;
    uint32_t nsent = 0;
    kvf_sm_req_t q;
    kvf_sconn_t *c;
    kvf_wr_t w;
    kvf_rd_t r;
    size_t i;

    kvf_wr_init(&w);
    for (i = 0; i < pv->count; i++) {
        if (sel[i] != KVF_PV_SKIP) {
            q.key = pv->k[i].key;
            q.put_id = pv->k[i].put_id;
            q.checksum = (sel[i] == KVF_PV_COMMIT) ? sums[i] : 0;
            q.mask = (sel[i] == KVF_PV_COMMIT) ? 1 : 0;
            kvf_sm_put_end_enc(&w, &q);
            nsent++;
        }
    }
    status =
        (nsent > 0) ? kvf__srpc(pv->st, KVF_SP_PUT_END, nsent, &w, &c) : KVF_OK;
    kvf_wr_free(&w);
    if (nsent > 0 && status == KVF_OK) {
        kvf_rd_init(&r, c->f.body, c->f.hdr.meta_len);
        for (i = 0; i < pv->count && c->f.hdr.count == nsent; i++) {
            if (sel[i] == KVF_PV_SKIP) {
                continue;
            }
            ks = kvf_sm_status_dec(&r);
            s[i] = (sel[i] == KVF_PV_COMMIT) ? ks : s[i];
        }
        status = kvf_sm_rep_end(&r, c->f.hdr.count, nsent);
        kvf__srelease(pv->st, c);
    }
    for (i = 0; i < pv->count; i++) {
        if (sel[i] != KVF_PV_SKIP) {
            pv->k[i].put_id = 0;
            s[i] =
                (status != KVF_OK && sel[i] == KVF_PV_COMMIT) ? status : s[i];
        }
    }
    return status;
}

/* Aborts the allocated keys that will not be written in place. */
static void kvf_pv_drop(kvf_store_put_view_h pv)
{
    kvf_status_t *s = kvf_calloc(pv->count, sizeof(*s));
    unsigned char *sel = kvf_calloc(pv->count, 1);
    kvf_status_t st = KVF_OK;
    size_t i, n = 0;

    for (i = 0; sel != NULL && s != NULL && i < pv->count; i++) {
        sel[i] = (pv->k[i].put_id != 0 && pv->k[i].status != KVF_OK)
                     ? KVF_PV_ABORT
                     : KVF_PV_SKIP;
        n += sel[i] != KVF_PV_SKIP;
    }
    if (n > 0) {
        st = kvf_pv_end(pv, sel, NULL, s);
    }
    if (sel == NULL || s == NULL || st != KVF_OK) {
        kvf_log_rl(KVF_LOG_WARN,
                   "store put view: keys not written in place stay "
                   "allocated until the master's put timeout (%s)",
                   kvf_status_str(st != KVF_OK ? st : KVF_ERR_NO_MEMORY));
    }
    kvf_free(sel);
    kvf_free(s);
}

/* The master's put deadline as this client counts it: its own
 * put_timeout_ms key (the master's default) from before the PUT_START. */
static uint64_t kvf_pv_put_timeout_ms(void)
{
    uint64_t v = 0;

    if (kvf_config_u64(&kvf_store_config, "put_timeout_ms", &v) != KVF_OK ||
        v == 0) {
        v = 10000;
    }
    return v;
}

static void kvf_pv_list(kvf_store_put_view_h pv, int add)
{
    kvf_store_put_view_h *pp;
    kvf_store_h st = pv->st;

    pthread_mutex_lock(&st->lock);
    if (add) {
        pv->next = st->pviews;
        st->pviews = pv;
    } else {
        for (pp = &st->pviews; *pp != NULL; pp = &(*pp)->next) {
            if (*pp == pv) {
                *pp = pv->next;
                break;
            }
        }
    }
    pthread_mutex_unlock(&st->lock);
}

/* The keys' verdicts into the caller's views. */
static void kvf_pv_views(const kvf_pv_job_t *j)
{
    const kvf_store_put_view_h pv = j->pv;
    size_t i;

    for (i = 0; i < pv->count; i++) {
        kvf_store_view_t *v = &j->views[i];

        v->ptr = (pv->k[i].status == KVF_OK) ? pv->k[i].ptr : NULL;
        v->len = pv->k[i].len;
        v->checksum = 0;
        v->status = pv->k[i].status;
        if (v->ptr == NULL) {
            v->map_base = NULL;
            v->map_len = 0;
        }
    }
}

/* allocate -> open -> drop what cannot be written in place */
static kvf_status_t kvf_pv_run(kvf_pv_job_t *j)
{
    kvf_store_put_view_h pv = j->pv;
    uint64_t sent_ms = kvf_time_ms();
    kvf_status_t status;
    size_t i;

    pv->until_ms = sent_ms + kvf_pv_put_timeout_ms();
    if (j->replicas > 1) { /* never several replicas in place */
        for (i = 0; i < pv->count; i++) {
            pv->k[i].status =
                (pv->k[i].key != NULL) ? KVF_ERR_UNSUPPORTED : pv->k[i].status;
        }
        return KVF_OK;
    }
    status = kvf_pv_alloc(j);
    if (status != KVF_OK) {
        return status;
    }
    kvf_pv_plan(j);
    kvf_pv_open(j);
    kvf_pv_drop(pv);
    return KVF_OK;
}

kvf_status_t kvf_store_view_put(kvf_store_h st, size_t count,
                                const char *const *keys, const size_t *lens,
                                const kvf_store_put_opts_t *opts,
                                kvf_store_view_t *views,
                                kvf_store_put_view_h *pv_p)
{
    kvf_pv_job_t j = {.views = views};
    kvf_status_t status;
    size_t i;

    if (st == NULL || keys == NULL || lens == NULL || views == NULL ||
        pv_p == NULL || count == 0 || count > KVF_STORE_BATCH_MAX) {
        return KVF_ERR_INVALID_PARAM;
    }
    memset(views, 0, count * sizeof(*views));
    j.replicas = opts ? opts->replicas : 0;
    j.flags = opts ? opts->flags : 0;
    status =
        (j.replicas > KVF_STORE_REPLICA_MAX) ? KVF_ERR_INVALID_PARAM : KVF_OK;
    if (status == KVF_OK) {
        j.pv = kvf_pv_new(st, count, keys, lens);
        kvf_pv_layout(&j, count);
        status =
            (j.pv == NULL) ? KVF_ERR_NO_MEMORY : kvf__sarena_alloc(&j.arena);
    }
    if (status == KVF_OK) {
        kvf_pv_layout(&j, count);
        status = kvf_pv_run(&j);
        kvf__sarena_free(&j.arena);
    }
    if (status != KVF_OK) {
        kvf_free(j.pv); /* allocated nothing */
        for (i = 0; i < count; i++) {
            views[i].status = status;
        }
        return status;
    }
    kvf_pv_views(&j);
    kvf_pv_list(j.pv, 1);
    *pv_p = j.pv;
    return KVF_OK;
}

unsigned kvf_store_view_put_left_ms(kvf_store_put_view_h pv)
{
    uint64_t now = kvf_time_ms();

    if (pv == NULL || now >= pv->until_ms) {
        return 0;
    }
    return (pv->until_ms - now > 0xffffffffu) ? 0xffffffffu
                                              : (unsigned)(pv->until_ms - now);
}

/* Ends every lease of pv: a key to commit whose lease did not hold gets
 * why (s) and is aborted instead (sel NULL: nothing to commit). */
static void kvf_pv_close(kvf_store_put_view_h pv, unsigned char *sel,
                         kvf_status_t *s)
{
    kvf_status_t held;
    size_t p, i;

    for (p = 0; p < pv->nparts; p++) {
        held = kvf_peer_view_close(pv->parts[p].sp->peer, pv->parts[p].tl);
        kvf__speer_unref(pv->st, pv->parts[p].sp, 0);
        for (i = 0; sel != NULL && held != KVF_OK && i < pv->count; i++) {
            if (pv->k[i].part == p && sel[i] == KVF_PV_COMMIT) {
                sel[i] = KVF_PV_ABORT;
                s[i] = held;
            }
        }
    }
    pv->nparts = 0;
}

/* Closes the leases, then commits the keys sel says (their lease held,
 * the put deadline not passed) and aborts the others; frees pv. */
static kvf_status_t kvf_pv_finish(kvf_store_put_view_h pv, unsigned char *sel,
                                  const uint64_t *sums, kvf_status_t *s)
{
    kvf_status_t status;
    size_t i;

    if (kvf_time_ms() + 1 >= pv->until_ms) { /* the master's deadline */
        for (i = 0; i < pv->count; i++) {
            if (sel[i] == KVF_PV_COMMIT) {
                sel[i] = KVF_PV_ABORT;
                s[i] = KVF_ERR_TIMEOUT;
            }
        }
    }
    kvf_pv_close(pv, sel, s);
    status = kvf_pv_end(pv, sel, sums, s);
    kvf_free(pv);
    return status;
}

/* The commit's plan: sel and sums per key, s the verdicts so far. */
static void kvf_pv_choose(kvf_store_put_view_h pv, const int *keep,
                          const uint64_t *sums, unsigned char *sel,
                          uint64_t *sumv, kvf_status_t *s)
{
    const kvf_pvkey_t *k;
    size_t i;

    for (i = 0; i < pv->count; i++) {
        k = &pv->k[i];
        s[i] = k->status;
        sel[i] = (k->put_id != 0) ? KVF_PV_ABORT : KVF_PV_SKIP;
        if (k->status != KVF_OK || k->put_id == 0) {
            continue;
        }
        if (keep != NULL && !keep[i]) {
            s[i] = KVF_ERR_CANCELED;
            continue;
        }
        sel[i] = KVF_PV_COMMIT;
        /* computed while the lease holds (the bytes are the node's) */
        sumv[i] = (sums != NULL) ? sums[i]
                  : (k->len > 0) ? kvf_checksum(k->ptr, k->len)
                                 : kvf_checksum("", 0);
    }
}

/* Aborts every allocated key of pv (off the list) and frees it. */
static void kvf_pv_abort(kvf_store_put_view_h pv)
{
    unsigned char *sel = kvf_calloc(pv->count, 1);
    kvf_status_t *s = kvf_calloc(pv->count, sizeof(*s));
    size_t i;

    if (sel == NULL || s == NULL) {
        kvf_pv_close(pv, NULL, NULL);
        kvf_log_rl(KVF_LOG_WARN, "store put view: out of memory to abort; "
                                 "the master undoes its puts at its timeout");
        kvf_free(pv);
    } else {
        for (i = 0; i < pv->count; i++) {
            sel[i] = (pv->k[i].put_id != 0) ? KVF_PV_ABORT : KVF_PV_SKIP;
        }
        (void)kvf_pv_finish(pv, sel, NULL, s);
    }
    kvf_free(sel);
    kvf_free(s);
}

kvf_status_t kvf_store_view_put_commit(kvf_store_put_view_h pv, const int *keep,
                                       const uint64_t *sums,
                                       kvf_status_t *statuses)
{
    kvf_status_t status, *s = statuses, *own = NULL;
    unsigned char *sel;
    uint64_t *sumv;
    size_t i, n;

    if (pv == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    kvf_pv_list(pv, 0);
    n = pv->count;
    sel = kvf_calloc(n, 1);
    sumv = kvf_calloc(n, sizeof(*sumv));
    if (s == NULL) {
        s = own = kvf_calloc(n, sizeof(*s));
    }
    if (sel == NULL || sumv == NULL || s == NULL) {
        kvf_free(sel);
        kvf_free(sumv);
        kvf_free(own);
        kvf_pv_abort(pv);
        return KVF_ERR_NO_MEMORY;
    }
    kvf_pv_choose(pv, keep, sums, sel, sumv, s);
    status = kvf_pv_finish(pv, sel, sumv, s);
    for (i = 0; i < n && status == KVF_OK; i++) {
        if (s[i] != KVF_OK && s[i] != KVF_ERR_CANCELED &&
            (keep == NULL || keep[i]) && sel[i] != KVF_PV_SKIP) {
            status = s[i]; /* the first key kept that did not commit */
        }
    }
    kvf_free(sel);
    kvf_free(sumv);
    kvf_free(own);
    return status;
}

void kvf_store_view_put_abort(kvf_store_put_view_h pv)
{
    if (pv != NULL) {
        kvf_pv_list(pv, 0);
        kvf_pv_abort(pv);
    }
}

/* At disconnect: ends what the caller left open, logging an error. */
static void kvf_store_put_view_end_all(kvf_store_h st)
{
    kvf_store_put_view_h pv;
    size_t n = 0;

    pthread_mutex_lock(&st->lock);
    while ((pv = st->pviews) != NULL) {
        st->pviews = pv->next;
        pthread_mutex_unlock(&st->lock);
        kvf_pv_abort(pv);
        n++;
        pthread_mutex_lock(&st->lock);
    }
    pthread_mutex_unlock(&st->lock);
    if (n > 0) {
        kvf_error("store: disconnect aborted %zu put view(s) never committed",
                  n);
    }
}

const kvf__sstrat_ops_t kvf__spview_ops = {
    .name = "put_view",
    .fini = kvf_store_put_view_end_all,
};
