/*
 * Store client: views (kvf_store_view_get). An object on a node of this
 * host is read in place, in this process's mapping of the node's pool,
 * instead of copied into the caller's buffer:
 *
 *   look up  one GET round trip for all keys (the master's read leases:
 *            the objects' space is not reused for lease_ms)
 *   view     rounds over the replicas (round r tries each key's replica
 *            r): the keys of one node go in one view lease of its
 *            transport (kvferry/view.h: shm grants the ranges under a
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
#include <kvferry/view.h>
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>

/* A node's view lease kept open for the views of several calls
 * (KVF_STORE_VIEW_SHARED): the node grants a lease over the whole
 * registered region a range lies in, so while it is open every object
 * of that region [rbase, rbase + rlen) is viewed at mbase + offset with
 * no node round trip (the master's read lease of each call keeps the
 * object's bytes; this lease keeps the region registered). One is
 * listed per node; it is not reused with less than KVF_SVSHARE_MIN_MS
 * left, and is closed by the last view handle using it. */
typedef struct kvf_svshare {
    kvf_speer_t *sp; /* its reference on the node's peer */
    kvf_view_lease_h tl;
    uint64_t until_ms;
    uint64_t rbase, rlen;
    const unsigned char *mbase;
    const void *map_base;
    uint64_t map_len;
    unsigned refs; /* view handles using it, plus one while listed */
    int listed;
    struct kvf_svshare *next; /* st->vshares */
} kvf_svshare_t;

#define KVF_SVSHARE_MIN_MS 1000

/* One node's view lease (tl, holding a reference on sp), or a share. */
typedef struct kvf_svpart {
    kvf_speer_t *sp;
    kvf_view_lease_h tl;
    kvf_svshare_t *sh;
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
    kvf_view_t *tv;
    unsigned flags;
    kvf_sarena_t arena;
} kvf_view_job_t;

static void kvf_view_layout(kvf_view_job_t *j)
{
    size_t n = j->count;
    kvf_sarena_t *a = &j->arena;

    j->e = kvf__sarena_take(a, n * sizeof(*j->e));
    j->want = kvf__sarena_take(a, n * sizeof(*j->want));
    j->taken = kvf__sarena_take(a, n * sizeof(*j->taken));
    j->idx = kvf__sarena_take(a, n * sizeof(*j->idx));
    j->remote = kvf__sarena_take(a, n * sizeof(*j->remote));
    j->lens = kvf__sarena_take(a, n * sizeof(*j->lens));
    j->tv = kvf__sarena_take(a, n * sizeof(*j->tv));
}

/* A key's verdict from one replica: a real error is not hidden by a
 * later replica that merely cannot be viewed. */
static void kvf_view_verdict(kvf_store_view_t *v, kvf_status_t st)
{
    if (st != KVF_ERR_UNSUPPORTED || v->status == KVF_INPROGRESS) {
        v->status = st;
    }
}

/* Room in vl for one more part. */
static kvf_status_t kvf_view_room(kvf_store_view_lease_h vl)
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
    return KVF_OK;
}

static kvf_status_t kvf_view_add_part(kvf_store_view_lease_h vl,
                                      kvf_speer_t *sp, kvf_view_lease_h tl,
                                      kvf_svshare_t *sh, uint64_t until_ms)
{
    if (kvf_view_room(vl) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    vl->parts[vl->nparts].sp = sp;
    vl->parts[vl->nparts].tl = tl;
    vl->parts[vl->nparts].sh = sh;
    vl->nparts++;
    if (until_ms < vl->until_ms) {
        vl->until_ms = until_ms;
    }
    return KVF_OK;
}

static void kvf_svshare_close(kvf_store_h st, kvf_svshare_t *sh)
{
    (void)kvf_peer_view_close(sh->sp->peer, sh->tl);
    kvf__speer_unref(st, sh->sp, 0);
    kvf_free(sh);
}

/* Takes sh off st's list (st->lock held); 1 when that was its last
 * reference (the caller closes it, unlocked). */
static int kvf_svshare_unlist(kvf_store_h st, kvf_svshare_t *sh)
{
    kvf_svshare_t **pp;

    for (pp = &st->vshares; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == sh) {
            *pp = sh->next;
            break;
        }
    }
    sh->listed = 0;
    return --sh->refs == 0;
}

/* Drops a reference on sh; the last one closes its lease, and says
 * whether it held (KVF_OK otherwise). A share left only on the list that
 * no call may use any more (too little time left) is closed now too: no
 * later call would, and it must end before its time. */
static kvf_status_t kvf_svshare_put(kvf_store_h st, kvf_svshare_t *sh)
{
    kvf_status_t s;
    int last;

    pthread_mutex_lock(&st->lock);
    last = --sh->refs == 0;
    if (!last && sh->refs == 1 && sh->listed &&
        kvf_time_ms() + KVF_SVSHARE_MIN_MS >= sh->until_ms) {
        last = kvf_svshare_unlist(st, sh);
    }
    pthread_mutex_unlock(&st->lock);
    if (!last) {
        return KVF_OK;
    }
    s = kvf_peer_view_close(sh->sp->peer, sh->tl);
    kvf__speer_unref(st, sh->sp, 0);
    kvf_free(sh);
    return s;
}

/* The listed share of node sp with time left, one reference taken (or
 * NULL); a listed share of its segment that is no longer good (too
 * little time left, another peer) is unlisted. */
static kvf_svshare_t *kvf_svshare_find(kvf_store_h st, kvf_speer_t *sp)
{
    kvf_svshare_t *sh, *gone = NULL;

    pthread_mutex_lock(&st->lock);
    for (sh = st->vshares; sh != NULL; sh = sh->next) {
        if (strcmp(sh->sp->name, sp->name) == 0) {
            break;
        }
    }
    if (sh != NULL && (sh->sp != sp || sp->dead ||
                       kvf_time_ms() + KVF_SVSHARE_MIN_MS >= sh->until_ms)) {
        gone = kvf_svshare_unlist(st, sh) ? sh : NULL;
        sh = NULL;
    }
    if (sh != NULL) {
        sh->refs++;
    }
    pthread_mutex_unlock(&st->lock);
    if (gone != NULL) {
        kvf_svshare_close(st, gone);
    }
    return sh;
}

/* Whether [remote, remote + len) lies in sh's region. */
static int kvf_svshare_covers(const kvf_svshare_t *sh, uint64_t remote,
                              uint64_t len)
{
    return remote >= sh->rbase && len <= sh->rlen &&
           remote - sh->rbase <= sh->rlen - len;
}

/* The n keys of j->idx that lie in node sp's listed share are viewed
 * through it; the others are moved to the front of j->idx (remote,
 * lens), their count returned. */
static size_t kvf_view_shared(kvf_view_job_t *j, kvf_speer_t *sp, size_t n)
{
    kvf_svshare_t *sh = kvf_svshare_find(j->st, sp);
    size_t i, m = 0, good = 0;

    if (sh == NULL) {
        return n;
    }
    for (i = 0; i < n; i++) {
        good += (size_t)kvf_svshare_covers(sh, j->remote[i], j->lens[i]);
    }
    if (good == 0 ||
        kvf_view_add_part(j->vl, NULL, NULL, sh, sh->until_ms) != KVF_OK) {
        (void)kvf_svshare_put(j->st, sh);
        return n; /* they take a lease of their own */
    }
    for (i = 0; i < n; i++) {
        kvf_store_view_t *v = &j->views[j->idx[i]];

        if (!kvf_svshare_covers(sh, j->remote[i], j->lens[i])) {
            j->idx[m] = j->idx[i];
            j->remote[m] = j->remote[i];
            j->lens[m++] = j->lens[i];
            continue;
        }
        v->ptr = sh->mbase + (j->remote[i] - sh->rbase);
        v->map_base = sh->map_base;
        v->map_len = sh->map_len;
        v->status = KVF_OK;
        j->want[j->idx[i]] = 0;
    }
    return m;
}

/* A lease just opened on sp (tl, until) becomes sp's listed share when
 * the region of its view v (of remote address remote) is registered
 * whole from the start of its mapping, as a node's pool is: then the
 * node's grant covers that whole region. Returns the share (one
 * reference for the caller, one for the list; it holds sp's reference
 * and tl), or NULL (tl stays the caller's). */
static kvf_svshare_t *kvf_svshare_make(kvf_store_h st, kvf_speer_t *sp,
                                       kvf_view_lease_h tl, uint64_t until,
                                       const kvf_view_t *v, uint64_t remote)
{
    const unsigned char *ptr = v->ptr, *mb = v->map_base;
    uint64_t rb = remote - (uint64_t)(ptr - mb), ra;
    kvf_svshare_t *sh, *old = NULL;
    size_t k, rl;

    for (k = 0; kvf_peer_region(sp->peer, k, &ra, &rl, NULL) == KVF_OK; k++) {
        if (ra == rb && remote - ra < rl) {
            break;
        }
    }
    if (kvf_peer_region(sp->peer, k, NULL, NULL, NULL) != KVF_OK ||
        (sh = kvf_calloc(1, sizeof(*sh))) == NULL) {
        return NULL;
    }
    *sh = (kvf_svshare_t){.sp = sp,
                          .tl = tl,
                          .until_ms = until,
                          .rbase = ra,
                          .rlen = rl < v->map_len ? rl : v->map_len,
                          .mbase = mb,
                          .map_base = v->map_base,
                          .map_len = v->map_len,
                          .refs = 2,
                          .listed = 1};
    pthread_mutex_lock(&st->lock);
    for (old = st->vshares; old != NULL; old = old->next) {
        if (strcmp(old->sp->name, sp->name) == 0) {
            break;
        }
    }
    if (old != NULL && !kvf_svshare_unlist(st, old)) {
        old = NULL;
    }
    sh->next = st->vshares;
    st->vshares = sh;
    pthread_mutex_unlock(&st->lock);
    if (old != NULL) {
        kvf_svshare_close(st, old);
    }
    return sh;
}

/* Keeps the lease just opened on sp for this call's handle: as sp's
 * listed share when the call asked for shared views and it can be one,
 * else as a lease of the handle's own. */
static kvf_status_t kvf_view_keep(kvf_view_job_t *j, kvf_speer_t *sp,
                                  kvf_view_lease_h tl, uint64_t until, size_t n)
{
    kvf_svshare_t *sh = NULL;
    size_t i;

    if (kvf_view_room(j->vl) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0; i < n && (j->flags & KVF_STORE_VIEW_SHARED); i++) {
        if (j->tv[i].status == KVF_OK) {
            sh =
                kvf_svshare_make(j->st, sp, tl, until, &j->tv[i], j->remote[i]);
            break;
        }
    }
    if (sh == NULL) {
        return kvf_view_add_part(j->vl, sp, tl, NULL, until);
    }
    return kvf_view_add_part(j->vl, NULL, NULL, sh, until); /* has room */
}

/* The n keys of j->idx, all on node seg this round: one view lease.
 * Keys it views are done; the others get its verdict. */
static void kvf_view_node(kvf_view_job_t *j, const char *seg, size_t n)
{
    kvf_view_lease_h tl = NULL;
    kvf_status_t st;
    kvf_speer_t *sp;
    uint64_t until = 0;
    size_t i, good = 0;

    st = kvf__speer_ref(j->st, seg, &sp);
    if (st == KVF_OK && (j->flags & KVF_STORE_VIEW_SHARED)) {
        n = kvf_view_shared(j, sp, n);
        if (n == 0) {
            kvf__speer_unref(j->st, sp, 0);
            return;
        }
    }
    if (st == KVF_OK) {
        st = kvf_peer_view_open(sp->peer, KVF_OP_READ, n, j->remote, j->lens,
                                j->tv, &until, &tl);
        if (st != KVF_OK) {
            kvf__speer_unref(j->st, sp, kvf__speer_error(st));
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
    if (good > 0 && kvf_view_keep(j, sp, tl, until, n) == KVF_OK) {
        return;
    }
    for (i = 0; i < n && good > 0; i++) { /* no room to keep it */
        if (j->views[j->idx[i]].status == KVF_OK) {
            memset(&j->views[j->idx[i]], 0, sizeof(kvf_store_view_t));
            j->views[j->idx[i]].status = KVF_ERR_NO_MEMORY;
        }
    }
    kvf_peer_view_close(sp->peer, tl);
    kvf__speer_unref(j->st, sp, 0);
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

    st = kvf__slookup(j->st, j->count, j->keys, j->e);
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
    return kvf_store_view_get_flags(st, count, keys, 0, views, lease_p);
}

kvf_status_t kvf_store_view_get_flags(kvf_store_h st, size_t count,
                                      const char *const *keys, unsigned flags,
                                      kvf_store_view_t *views,
                                      kvf_store_view_lease_h *lease_p)
{
    kvf_view_job_t j = {
        .st = st, .count = count, .keys = keys, .views = views, .flags = flags};
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
    status = kvf__sarena_alloc(&j.arena);
    if (status == KVF_OK) {
        kvf_view_layout(&j);
        status = kvf_view_run(&j);
        kvf__sarena_free(&j.arena);
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
        if (vl->parts[i].sh != NULL) {
            s = kvf_svshare_put(vl->st, vl->parts[i].sh);
        } else {
            s = kvf_peer_view_close(vl->parts[i].sp->peer, vl->parts[i].tl);
            kvf__speer_unref(vl->st, vl->parts[i].sp, 0);
        }
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

/* At disconnect: ends what the caller left open, logging an error. */
static void kvf_store_view_end_all(kvf_store_h st)
{
    kvf_store_view_lease_h vl;
    kvf_svshare_t *sh;
    size_t n = 0;
    int gone;

    pthread_mutex_lock(&st->lock);
    while ((vl = st->vleases) != NULL) {
        st->vleases = vl->next;
        pthread_mutex_unlock(&st->lock);
        kvf_view_end(vl);
        n++;
        pthread_mutex_lock(&st->lock);
    }
    while ((sh = st->vshares) != NULL) { /* no handle uses them now */
        gone = kvf_svshare_unlist(st, sh);
        pthread_mutex_unlock(&st->lock);
        if (gone) {
            kvf_svshare_close(st, sh);
        }
        pthread_mutex_lock(&st->lock);
    }
    pthread_mutex_unlock(&st->lock);
    if (n > 0) {
        kvf_error("store: disconnect ended %zu view lease(s) never released",
                  n);
    }
}

void kvf_store_view_trim(kvf_store_h st)
{
    kvf_svshare_t *sh, *next, *gone = NULL;
    uint64_t now = kvf_time_ms();

    if (st == NULL) {
        return;
    }
    pthread_mutex_lock(&st->lock);
    for (sh = st->vshares; sh != NULL; sh = next) {
        next = sh->next;
        if (sh->refs == 1 && now + 2 * KVF_SVSHARE_MIN_MS >= sh->until_ms &&
            kvf_svshare_unlist(st, sh)) {
            sh->next = gone; /* closed below, unlocked */
            gone = sh;
        }
    }
    pthread_mutex_unlock(&st->lock);
    for (sh = gone; sh != NULL; sh = next) {
        next = sh->next;
        kvf_svshare_close(st, sh);
    }
}

const kvf__sstrat_ops_t kvf__sview_ops = {
    .name = "view",
    .fini = kvf_store_view_end_all,
};

void kvf_store_view_unmap_hook(kvf_store_unmap_fn fn, void *arg)
{
    kvf_view_unmap_hook(fn, arg);
}
