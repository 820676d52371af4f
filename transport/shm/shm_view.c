/*
 * shm transport, initiator side: views. A view lease is a lease like a
 * copy's (BEGIN -> GRANT -> MAP of the windows not mapped yet,
 * shm_lease.c) whose ranges are not copied: their addresses in this
 * process's mapping of the target's allocation are handed to the caller,
 * who reads them in place (a READ lease) or writes them in place (a
 * WRITE lease: the target checks the ranges as it checks a copy's
 * writes), a GPU kernel through a host registration of the mapping, for
 * one. Closing a WRITE lease fences the caller's stores before END, as
 * a copy's WRITE lease is fenced before its END. The lease stays open on the target until the
 * caller closes it (END); while it is open the target keeps the ranges
 * registered (its deregistration waits for the lease, and no later lease
 * grants a range deregistered since), bounded as any lease: revoked at
 * the GRANT's left_ms, or once a waiting deregistration has waited
 * lease_break_ms for it (shm_server.c). Closing tells whether the lease
 * held until then (own clock, and no hang-up on its connection), as a
 * copy's lease is judged after the copy.
 *
 * Each view lease has a connection of its own (one open lease each, so
 * a view held long delays no copy of the ep's workers); an ep keeps a
 * few idle ones for the next lease. The mappings views point into hold
 * a count: SYNC or a dropped target marks such a mapping dead instead
 * of unmapping it, and the last view released unmaps it, after the
 * process's unmap hook (kvf_tl_unmap_hook) was told.
 */
#include "transport/shm/shm.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>

struct kvf_tl_vlease {
    kvf_tl_ep_t *ep;
    kvf_shm_conn_t *conn;
    kvf_shm_lease_t l;
    unsigned nids;
    uint64_t ids[KVF_SHM_LEASE_ALLOCS]; /* mappings its views count on */
};

/* An idle view connection of the ep, or a new one. */
static kvf_status_t kvf_shm_vconn_take(kvf_tl_ep_t *ep, kvf_shm_conn_t **c_p)
{
    kvf_shm_conn_t *c = NULL;
    kvf_status_t st;

    pthread_mutex_lock(&ep->lock);
    if (ep->nvidle > 0) {
        c = ep->vidle[--ep->nvidle];
    }
    pthread_mutex_unlock(&ep->lock);
    if (c != NULL && (c->fd < 0 || kvf_tl_peer_gone(c->fd))) {
        kvf_shm_conn_free(c); /* the target closed it while idle */
        kvf_free(c);
        c = NULL;
    }
    if (c == NULL) {
        c = kvf_calloc(1, sizeof(*c));
        if (c == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        c->fd = -1;
        st = kvf_shm_conn_open(ep, c);
        if (st != KVF_OK) {
            kvf_shm_conn_free(c);
            kvf_free(c);
            return st;
        }
    }
    *c_p = c;
    return KVF_OK;
}

/* Keeps connection c for the next lease (ok: no lease open on it), or
 * closes it. */
static void kvf_shm_vconn_give(kvf_tl_ep_t *ep, kvf_shm_conn_t *c, int ok)
{
    if (ok && c->fd >= 0 && c->ecount == 0) {
        pthread_mutex_lock(&ep->lock);
        if (!ep->stop && ep->nvidle < KVF_SHM_VIDLE_MAX) {
            ep->vidle[ep->nvidle++] = c;
            c = NULL;
        }
        pthread_mutex_unlock(&ep->lock);
    }
    if (c != NULL) {
        kvf_shm_conn_free(c);
        kvf_free(c);
    }
}

void kvf_shm_view_fini(kvf_tl_ep_t *ep)
{
    unsigned n = __atomic_load_n(&ep->nvleases, __ATOMIC_RELAXED);

    if (n > 0) {
        kvf_error("shm: ep closed with %u view lease(s) open; their "
                  "mappings stay until the process ends",
                  n);
    }
    while (ep->nvidle > 0) {
        kvf_shm_vconn_give(ep, ep->vidle[--ep->nvidle], 0);
    }
}

/* The mapping holding ptr (a view just granted): its view count goes
 * up once per lease. Caller holds map_lock's read side. */
static void kvf_shm_view_ref(kvf_tl_vlease_t *vl, const unsigned char *ptr,
                             kvf_tl_view_t *v)
{
    kvf_tl_ep_t *ep = vl->ep;
    kvf_shm_map_t *m;
    unsigned k;
    size_t i;

    for (i = 0; i < ep->nmaps; i++) {
        m = &ep->maps[i];
        if (!m->dead && ptr >= m->ptr && ptr < m->ptr + m->len) {
            break;
        }
    }
    if (i == ep->nmaps) { /* lease_prepare found it: not reached */
        v->status = KVF_ERR_INTERNAL;
        return;
    }
    v->ptr = ptr;
    v->map_base = m->ptr;
    v->map_len = m->len;
    v->status = KVF_OK;
    for (k = 0; k < vl->nids; k++) {
        if (vl->ids[k] == m->id) {
            return;
        }
    }
    if (vl->nids == KVF_SHM_LEASE_ALLOCS) { /* a GRANT lists no more */
        v->ptr = NULL;
        v->status = KVF_ERR_INTERNAL;
        return;
    }
    vl->ids[vl->nids++] = m->id;
    __atomic_add_fetch(&m->views, 1, __ATOMIC_RELAXED);
}

/* A granted lease's verdicts into views: addresses for the mapped
 * entries, KVF_ERR_UNSUPPORTED for those the target would move itself
 * (not in shareable memory). */
static kvf_status_t kvf_shm_view_fill(kvf_tl_vlease_t *vl, kvf_tl_view_t *views)
{
    kvf_shm_lease_t *l = &vl->l;
    kvf_status_t st;
    size_t i;

    st = kvf_shm_lease_prepare(vl->ep, vl->conn, l);
    if (st != KVF_OK) {
        return st; /* the connection failed: no lock held */
    }
    for (i = 0; i < l->n; i++) {
        memset(&views[i], 0, sizeof(views[i]));
        if (l->excs[i] == KVF_OK) {
            kvf_shm_view_ref(vl, l->ptrs[i], &views[i]);
        } else {
            views[i].status = (l->excs[i] == KVF_INPROGRESS)
                                  ? KVF_ERR_UNSUPPORTED
                                  : l->excs[i];
        }
    }
    pthread_rwlock_unlock(&vl->ep->map_lock);
    return KVF_OK;
}

/* BEGIN, GRANT: the lease opened on the target (KVF_OK), or why not. */
static kvf_status_t kvf_shm_view_begin(kvf_tl_vlease_t *vl,
                                       kvf_op_type_t type, size_t count,
                                       const uint64_t *remote,
                                       const uint64_t *lens)
{
    kvf_shm_lease_t *l = &vl->l;
    kvf_status_t st;
    size_t i;

    st = kvf_shm_lease_reserve(l, count);
    if (st != KVF_OK) {
        return st;
    }
    l->type = type;
    l->n = count;
    for (i = 0; i < count; i++) {
        l->local[i] = NULL;
        l->remote[i] = remote[i];
        l->lens[i] = lens[i];
        l->st[i] = KVF_OK;
    }
    st = kvf_shm_post_begin(vl->ep, vl->conn, l);
    if (st == KVF_OK) {
        st = kvf_shm_pump(vl->ep, vl->conn, KVF_SHM_GRANT, NULL, NULL);
    }
    if (st == KVF_OK && l->state != KVF_SHM_L_GRANTED) {
        st = (l->end_status != KVF_OK) ? l->end_status : KVF_ERR_PROTOCOL;
        l->state = KVF_SHM_L_FREE; /* no lease was opened */
    }
    return st;
}

kvf_status_t kvf_shm_view_open(kvf_tl_ep_t *ep, kvf_op_type_t type,
                               size_t count, const uint64_t *remote,
                               const uint64_t *lens, kvf_tl_view_t *views,
                               uint64_t *until_ms_p, kvf_tl_vlease_t **lease_p)
{
    kvf_tl_vlease_t *vl;
    kvf_status_t st;
    size_t i;

    if (count == 0 || count > KVF_SHM_ENTRIES_MAX || remote == NULL ||
        lens == NULL || views == NULL || lease_p == NULL ||
        (type != KVF_OP_READ && type != KVF_OP_WRITE)) {
        return KVF_ERR_INVALID_PARAM;
    }
    for (i = 0; i < count; i++) {
        if (lens[i] == 0) {
            return KVF_ERR_INVALID_PARAM;
        }
    }
    if (kvf_time_ms() < __atomic_load_n(&ep->down_until, __ATOMIC_RELAXED)) {
        return KVF_ERR_PEER_UNREACHABLE; /* failed within a timeout */
    }
    vl = kvf_calloc(1, sizeof(*vl));
    if (vl == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    vl->ep = ep;
    st = kvf_shm_vconn_take(ep, &vl->conn);
    if (st == KVF_OK) {
        st = kvf_shm_view_begin(vl, type, count, remote, lens);
        if (st == KVF_OK) {
            st = kvf_shm_view_fill(vl, views);
        }
        if (st != KVF_OK) {
            /* a refusal of the whole lease leaves the connection usable */
            kvf_shm_vconn_give(ep, vl->conn, vl->l.state == KVF_SHM_L_FREE);
        }
    }
    if (st != KVF_OK) {
        kvf_shm_lease_free(&vl->l);
        kvf_free(vl);
        return st;
    }
    __atomic_add_fetch(&ep->nvleases, 1, __ATOMIC_RELAXED);
    *until_ms_p = vl->l.valid_until_ms;
    *lease_p = vl;
    return KVF_OK;
}

kvf_status_t kvf_shm_view_close(kvf_tl_vlease_t *vl)
{
    kvf_tl_ep_t *ep;
    kvf_status_t st;
    unsigned k;

    if (vl == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    ep = vl->ep;
    if (vl->l.type == KVF_OP_WRITE) {
        kvf_shm_fence(); /* the caller's streaming stores, before END */
    }
    /* judged first: after END the target may reuse the ranges */
    if (kvf_time_ms() + 1 >= vl->l.valid_until_ms) {
        st = KVF_ERR_TIMEOUT; /* held past its time: the caller's error */
    } else {
        st = kvf_shm_lease_held(vl->conn, &vl->l);
    }
    vl->l.state = KVF_SHM_L_OPEN; /* judged: END only if it held */
    vl->l.end_status = st;
    st = kvf_shm_post_end(ep, vl->conn, &vl->l);
    pthread_rwlock_wrlock(&ep->map_lock);
    for (k = 0; k < vl->nids; k++) {
        kvf_shm_map_unview(ep, vl->ids[k]);
    }
    pthread_rwlock_unlock(&ep->map_lock);
    kvf_shm_vconn_give(ep, vl->conn, st == KVF_OK);
    __atomic_sub_fetch(&ep->nvleases, 1, __ATOMIC_RELAXED);
    kvf_shm_lease_free(&vl->l);
    kvf_free(vl);
    if (st != KVF_OK) {
        kvf_log_rl(KVF_LOG_WARN,
                   "shm: a view lease did not hold until its "
                   "release: %s",
                   kvf_status_str(st));
    }
    return st;
}
