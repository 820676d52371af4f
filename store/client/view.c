/*
 * Store client: views (kvf_store_view_get). An object on a node of this
 * host is read in place, in this process's mapping of the node's pool,
 * instead of copied into the caller's buffer:
 *
 *   look up  one GET round trip for all keys (the master's read leases:
 *            the objects' space is not reused for lease_ms)
 *   view     rounds over the replicas (round r tries each key's replica
 *            r): the keys of one node go in one view lease of its
 *            transport (engine/view.h: shm grants the ranges under a
 *            lease and says where they lie in the mapping); a node
 *            reached over tcp has no views (KVF_ERR_UNSUPPORTED), the
 *            next round tries the key's next replica
 *   release  ends every node's lease (kvf_store_view_release)
 *
 * The lease handle holds a reference on each node's peer, so the peer
 * (and its mappings) stays open until the release. The views expire
 * with the first lease to end: the master's read lease (counted from
 * before the GET) or a node's shm lease. Open leases are listed on the
 * store handle so that a disconnect ends them.
 */
#include "store/client/client_int.h"
#include "engine/view.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>

/* One node's view lease. */
typedef struct kvf_svpart {
    kvf_speer_t *sp;
    kvf_tl_vlease_t *tl;
} kvf_svpart_t;

struct kvf_store_view_lease {
    kvf_store_h st;
    uint64_t until_ms; /* the first lease to end (kvf_time_ms clock) */
    kvf_svpart_t *parts;
    size_t nparts, cap;
    struct kvf_store_view_lease *next; /* st->vleases */
};

/* One view call: the caller's arrays, the look-up, per-round scratch. */
typedef struct kvf_view_job {
    kvf_store_h st;
    size_t count;
    const char *const *keys;
    kvf_store_view_t *views;
    kvf_store_view_lease_h vl;
    kvf_sreps_t *e;
    unsigned char *want;  /* per key: no view yet */
    unsigned char *taken; /* per key: in a node's group this round */
    uint32_t *idx;        /* a group's keys */
    uint64_t *remote, *lens;
    kvf_tl_view_t *tv;
    kvf_sarena_t arena;
} kvf_view_job_t;

static void kvf_view_layout(kvf_view_job_t *j)
{
    size_t n = j->count;
    kvf_sarena_t *a = &j->arena;

    j->e = kvf_sarena_take(a, n * sizeof(*j->e));
    j->want = kvf_sarena_take(a, n * sizeof(*j->want));
    j->taken = kvf_sarena_take(a, n * sizeof(*j->taken));
    j->idx = kvf_sarena_take(a, n * sizeof(*j->idx));
    j->remote = kvf_sarena_take(a, n * sizeof(*j->remote));
    j->lens = kvf_sarena_take(a, n * sizeof(*j->lens));
    j->tv = kvf_sarena_take(a, n * sizeof(*j->tv));
}

/* A key's verdict from one replica: a real error is not hidden by a
 * later replica that merely cannot be viewed. */
static void kvf_view_verdict(kvf_store_view_t *v, kvf_status_t st)
{
    if (st != KVF_ERR_UNSUPPORTED || v->status == KVF_INPROGRESS) {
        v->status = st;
    }
}

static kvf_status_t kvf_view_add_part(kvf_store_view_lease_h vl,
                                      kvf_speer_t *sp, kvf_tl_vlease_t *tl,
                                      uint64_t until_ms)
{
    kvf_svpart_t *grown;
    size_t cap;

    if (vl->nparts == vl->cap) {
        cap = vl->cap ? vl->cap * 2 : 4;
        grown = kvf_realloc(vl->parts, cap * sizeof(*grown));
        if (grown == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        vl->parts = grown;
        vl->cap = cap;
    }
    vl->parts[vl->nparts].sp = sp;
    vl->parts[vl->nparts].tl = tl;
    vl->nparts++;
    if (until_ms < vl->until_ms) {
        vl->until_ms = until_ms;
    }
    return KVF_OK;
}

/* The n keys of j->idx, all on node seg this round: one view lease.
 * Keys it views are done; the others get its verdict. */
static void kvf_view_node(kvf_view_job_t *j, const char *seg, size_t n)
{
    kvf_tl_vlease_t *tl = NULL;
    kvf_status_t st;
    kvf_speer_t *sp;
    uint64_t until = 0;
    size_t i, good = 0;

    st = kvf_store_peer_ref(j->st, seg, &sp);
    if (st == KVF_OK) {
        st = kvf_peer_view_open(sp->peer, n, j->remote, j->lens, j->tv, &until,
                                &tl);
        if (st != KVF_OK) {
            kvf_store_peer_unref(j->st, sp, kvf_store_peer_error(st));
        }
    }
    for (i = 0; i < n; i++) {
        kvf_store_view_t *v = &j->views[j->idx[i]];

        if (st != KVF_OK || j->tv[i].status != KVF_OK) {
            kvf_view_verdict(v, st != KVF_OK ? st : j->tv[i].status);
            continue;
        }
        v->ptr = j->tv[i].ptr;
        v->map_base = j->tv[i].map_base;
        v->map_len = j->tv[i].map_len;
        v->status = KVF_OK;
        j->want[j->idx[i]] = 0;
        good++;
    }
    if (st != KVF_OK) {
        return;
    }
    if (good > 0 && kvf_view_add_part(j->vl, sp, tl, until) == KVF_OK) {
        return;
    }
    for (i = 0; i < n && good > 0; i++) { /* no room to keep it */
        if (j->views[j->idx[i]].status == KVF_OK) {
            memset(&j->views[j->idx[i]], 0, sizeof(kvf_store_view_t));
            j->views[j->idx[i]].status = KVF_ERR_NO_MEMORY;
        }
    }
    kvf_peer_view_close(sp->peer, tl);
    kvf_store_peer_unref(j->st, sp, 0);
}

/* Round r: the keys still wanted, grouped by the node of their replica
 * r, one view lease per node. */
static void kvf_view_round(kvf_view_job_t *j, unsigned r)
{
    size_t i, k, n;
    const char *seg;

    memset(j->taken, 0, j->count);
    for (i = 0; i < j->count; i++) {
        if (!j->want[i] || j->taken[i] || r >= j->e[i].nrep) {
            continue;
        }
        seg = j->e[i].seg[r];
        for (k = i, n = 0; k < j->count; k++) {
            if (j->want[k] && !j->taken[k] && r < j->e[k].nrep &&
                strcmp(j->e[k].seg[r], seg) == 0) {
                j->taken[k] = 1;
                j->idx[n] = (uint32_t)k;
                j->remote[n] = j->e[k].addr[r];
                j->lens[n] = j->e[k].size;
                n++;
            }
        }
        kvf_view_node(j, seg, n);
    }
}

/* The look-up's answer into the views; the master's leases bound the
 * lease handle's life. Returns the most replicas a key has. */
static unsigned kvf_view_plan(kvf_view_job_t *j, uint64_t sent_ms)
{
    unsigned maxrep = 0;
    size_t i;

    for (i = 0; i < j->count; i++) {
        kvf_store_view_t *v = &j->views[i];
        const kvf_sreps_t *e = &j->e[i];

        memset(v, 0, sizeof(*v));
        v->status = e->status;
        if (e->status != KVF_OK) {
            continue;
        }
        v->len = e->size;
        v->checksum = e->checksum;
        if (sent_ms + e->lease_ms < j->vl->until_ms) {
            j->vl->until_ms = sent_ms + e->lease_ms;
        }
        if (e->size == 0) {
            continue; /* nothing to view: KVF_OK, ptr NULL */
        }
        v->status = (e->nrep > 0) ? KVF_INPROGRESS : KVF_ERR_UNSUPPORTED;
        j->want[i] = e->nrep > 0;
        maxrep = (e->nrep > maxrep) ? e->nrep : maxrep;
    }
    return maxrep;
}

/* look up -> view (rounds over the replicas) */
static kvf_status_t kvf_view_run(kvf_view_job_t *j)
{
    uint64_t sent_ms = kvf_time_ms();
    kvf_status_t st;
    unsigned r, maxrep;
    size_t i;

    st = kvf_store_lookup(j->st, j->count, j->keys, j->e);
    if (st != KVF_OK) {
        return st;
    }
    maxrep = kvf_view_plan(j, sent_ms);
    for (r = 0; r < maxrep; r++) {
        kvf_view_round(j, r);
    }
    for (i = 0; i < j->count; i++) {
        if (j->views[i].status == KVF_INPROGRESS) {
            j->views[i].status = KVF_ERR_UNSUPPORTED;
        }
    }
    return KVF_OK;
}

static void kvf_view_list(kvf_store_view_lease_h vl, int add)
{
    kvf_store_view_lease_h *pp;
    kvf_store_h st = vl->st;

    pthread_mutex_lock(&st->lock);
    if (add) {
        vl->next = st->vleases;
        st->vleases = vl;
    } else {
        for (pp = &st->vleases; *pp != NULL; pp = &(*pp)->next) {
            if (*pp == vl) {
                *pp = vl->next;
                break;
            }
        }
    }
    pthread_mutex_unlock(&st->lock);
}

kvf_status_t kvf_store_view_get(kvf_store_h st, size_t count,
                                const char *const *keys,
                                kvf_store_view_t *views,
                                kvf_store_view_lease_h *lease_p)
{
    kvf_view_job_t j = {.st = st, .count = count, .keys = keys, .views = views};
    kvf_status_t status;
    size_t i;

    if (st == NULL || keys == NULL || views == NULL || lease_p == NULL ||
        count == 0 || count > KVF_STORE_BATCH_MAX) {
        status = KVF_ERR_INVALID_PARAM;
        goto err;
    }
    j.vl = kvf_calloc(1, sizeof(*j.vl));
    if (j.vl == NULL) {
        status = KVF_ERR_NO_MEMORY;
        goto err;
    }
    j.vl->st = st;
    j.vl->until_ms = UINT64_MAX;
    kvf_view_layout(&j);
    status = kvf_sarena_alloc(&j.arena);
    if (status == KVF_OK) {
        kvf_view_layout(&j);
        status = kvf_view_run(&j);
        kvf_sarena_free(&j.arena);
    }
    if (status != KVF_OK) {
        kvf_store_view_release(j.vl); /* holds nothing yet */
        goto err;
    }
    kvf_view_list(j.vl, 1);
    *lease_p = j.vl;
    return KVF_OK;

err:
    for (i = 0; views != NULL && count <= KVF_STORE_BATCH_MAX && i < count;
         i++) {
        memset(&views[i], 0, sizeof(views[i]));
        views[i].status = status;
    }
    return status;
}

unsigned kvf_store_view_left_ms(kvf_store_view_lease_h vl)
{
    uint64_t now = kvf_time_ms();

    if (vl == NULL || now >= vl->until_ms) {
        return 0;
    }
    return (vl->until_ms - now > 0xffffffffu) ? 0xffffffffu
                                              : (unsigned)(vl->until_ms - now);
}

/* Ends the node leases of vl and frees it (not listed any more). */
static kvf_status_t kvf_view_end(kvf_store_view_lease_h vl)
{
    kvf_status_t st = KVF_OK, s;
    int expired = kvf_time_ms() >= vl->until_ms;
    size_t i;

    for (i = 0; i < vl->nparts; i++) {
        s = kvf_peer_view_close(vl->parts[i].sp->peer, vl->parts[i].tl);
        kvf_store_peer_unref(vl->st, vl->parts[i].sp, 0);
        st = (st == KVF_OK) ? s : st;
    }
    if (st == KVF_OK && expired && vl->nparts > 0) {
        kvf_log_rl(KVF_LOG_WARN, "store: views released after their lease "
                                 "ended (held too long)");
        st = KVF_ERR_TIMEOUT;
    }
    kvf_free(vl->parts);
    kvf_free(vl);
    return st;
}

kvf_status_t kvf_store_view_release(kvf_store_view_lease_h vl)
{
    if (vl == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    kvf_view_list(vl, 0);
    return kvf_view_end(vl);
}

void kvf_store_view_end_all(kvf_store_h st)
{
    kvf_store_view_lease_h vl;
    size_t n = 0;

    pthread_mutex_lock(&st->lock);
    while ((vl = st->vleases) != NULL) {
        st->vleases = vl->next;
        pthread_mutex_unlock(&st->lock);
        kvf_view_end(vl);
        n++;
        pthread_mutex_lock(&st->lock);
    }
    pthread_mutex_unlock(&st->lock);
    if (n > 0) {
        kvf_error("store: disconnect ended %zu view lease(s) never released",
                  n);
    }
}

void kvf_store_view_unmap_hook(kvf_store_unmap_fn fn, void *arg)
{
    kvf_tl_unmap_hook(fn, arg);
}
