/*
 * GETs sent from store views: when the node holding a value is reached
 * over shm, the door does not copy the value into its pool. One
 * kvf_store_view_get per batch maps every GET's object where it lies
 * (the node's pool, mapped into this process) under a lease; each view's
 * bytes are checked against the checksum recorded at put (a mismatch
 * goes to the copy path, which tries the other replicas, so no bad byte
 * is ever sent); the reply's header and the bulk are sent straight from
 * the mapping, and the lease is released once every value of the batch
 * is sent.
 *
 * A client that reads slowly must not make the door hold a lease past
 * its time: each loop checks its leases (before every send from a view,
 * and on a timer) and, once a lease has less than KVF_RESP_VIEW_MARGIN_MS
 * left, copies the values still being sent into memory of their own
 * (checked again against their checksum) and releases the lease. A value
 * whose copy fails its check is lost: the connections sending it are
 * closed (the client sees a cut reply, never wrong bytes).
 *
 * The node leases the store keeps open for shared views are trimmed on
 * the loop's timer (kvf_store_view_trim), so one left unused ends before
 * its time.
 *
 * Nodes reached over tcp have no views: a batch where no key could be
 * viewed turns views off for a second, so tcp-only stores pay the
 * look-up once a second, not once a batch.
 */
#include "store/resp/resp_int.h"

#include "core/log.h"
#include "core/time.h"

#include <kvferry/engine.h>

#include <stdlib.h>
#include <string.h>

/* A lease is left for the copy path this long before it ends. */
#define KVF_RESP_VIEW_MARGIN_MS 250u
/* Views are not tried for this long after a batch had none. */
#define KVF_RESP_VIEW_OFF_MS 1000u
/* The store's shared node leases are trimmed this often (at most: the
 * loop's timer is at most a second). */
#define KVF_RESP_TRIM_MS 250u

static void kvf_resp_vlease_release(kvf_resp_vlease_t *vl)
{
    kvf_resp_loop_t *lp = vl->lp;
    kvf_status_t st;

    if (vl->prev != NULL) {
        vl->prev->next = vl->next;
    } else {
        lp->vleases = vl->next;
    }
    if (vl->next != NULL) {
        vl->next->prev = vl->prev;
    }
    st = kvf_store_view_release(vl->h);
    if (st != KVF_OK) {
        kvf_log_rl(KVF_LOG_WARN, "resp: view lease released: %s",
                   kvf_status_str(st));
    }
    free(vl->vals);
    free(vl);
}

void kvf_resp_vlease_drop(kvf_resp_vlease_t *vl, kvf_resp_val_t *v)
{
    vl->vals[v->vidx] = NULL;
    v->vl = NULL;
    if (--vl->refs == 0) {
        kvf_resp_vlease_release(vl);
    }
}

/* Moves v's bytes out of its view into memory of its own, checked
 * against the recorded checksum; on failure v is broken. */
static void kvf_resp_val_rescue(kvf_resp_val_t *v)
{
    struct kvf_resp *s = v->vl->lp->srv;
    char *copy = malloc(v->len ? v->len : 1);

    atomic_fetch_add(&s->nrescue, 1);
    if (copy != NULL) {
        memcpy(copy, v->p, v->len);
        if (kvf_checksum(copy, v->len) != v->sum) {
            kvf_log_rl(KVF_LOG_WARN, "resp: a value's bytes changed in its "
                                     "view before they were sent; its "
                                     "connections are closed");
            free(copy);
            copy = NULL;
        }
    }
    v->p = copy;
    v->heap = copy != NULL;
    v->broken = copy == NULL;
    if (copy != NULL) { /* counted in slow_held by its readers already */
        atomic_fetch_add(&s->slow_copied, v->len);
    }
    kvf_resp_vlease_drop(v->vl, v);
}

/* Copies every value still in vl's views; vl is released (and freed). */
static void kvf_resp_vlease_rescue(kvf_resp_vlease_t *vl)
{
    size_t i, n = vl->nvals;
    unsigned left = vl->refs;

    for (i = 0; i < n && left > 0; i++) {
        kvf_resp_val_t *v = vl->vals[i];

        if (v != NULL) {
            left--;
            kvf_resp_val_rescue(v); /* the last one frees vl */
        }
    }
}

int kvf_resp_views_tick(kvf_resp_loop_t *lp, int wait_ms)
{
    kvf_resp_vlease_t *vl = lp->vleases, *next;
    uint64_t now = kvf_time_ms();
    unsigned left;

    /* the node leases kept for shared views that no view uses any more
     * end before their time, not when their node revokes them */
    if (lp->srv->views && now - lp->trim_ms >= KVF_RESP_TRIM_MS) {
        lp->trim_ms = now;
        kvf_store_view_trim(lp->srv->st);
    }
    for (; vl != NULL; vl = next) {
        next = vl->next;
        left = kvf_store_view_left_ms(vl->h);
        if (left <= KVF_RESP_VIEW_MARGIN_MS) {
            kvf_resp_vlease_rescue(vl);
        } else if ((int)(left - KVF_RESP_VIEW_MARGIN_MS) < wait_ms) {
            wait_ms = (int)(left - KVF_RESP_VIEW_MARGIN_MS);
        }
    }
    return wait_ms;
}

int kvf_resp_val_ready(kvf_resp_val_t *v)
{
    if (v->vl != NULL &&
        kvf_store_view_left_ms(v->vl->h) <= KVF_RESP_VIEW_MARGIN_MS) {
        kvf_resp_vlease_rescue(v->vl);
    }
    return v->broken ? -1 : 0;
}

/* A value for view i of the lease, one reference. */
static kvf_resp_val_t *kvf_resp_view_val(kvf_resp_vlease_t *vl,
                                         const kvf_store_view_t *w, size_t i)
{
    kvf_resp_val_t *v = calloc(1, sizeof(*v));

    if (v == NULL) {
        return NULL;
    }
    v->p = (char *)w->ptr;
    v->len = (size_t)w->len;
    v->sum = w->checksum;
    v->refs = 1;
    v->vl = vl;
    v->vidx = i;
    vl->vals[i] = v;
    vl->refs++;
    return v;
}

/* One key's view into its GET's outcome: served (ost, oget), a miss, or
 * left to the copy path (ost KVF_INPROGRESS). Returns 1 when the key had
 * a replica on a node reached over shm. */
static int kvf_resp_view_one(kvf_resp_vlease_t *vl, kvf_resp_conn_t *c,
                             const kvf_store_view_t *w, size_t i)
{
    c->ost = KVF_INPROGRESS;
    if (w->status == KVF_ERR_NO_KEY || w->status == KVF_ERR_NOT_READY) {
        c->ost = w->status; /* a miss, as the copy path says it */
        return 1;
    }
    if (w->status != KVF_OK || w->len == 0) {
        return w->status != KVF_ERR_UNSUPPORTED;
    }
    if (kvf_checksum(w->ptr, (size_t)w->len) != w->checksum) {
        kvf_log_rl(KVF_LOG_WARN,
                   "resp: GET '%s': a view failed its checksum; "
                   "read through the copy path",
                   c->okey);
        return 1;
    }
    if ((c->oget = kvf_resp_view_val(vl, w, i)) != NULL) {
        c->ost = KVF_OK;
        atomic_fetch_add(&c->lp->srv->nview, 1);
    }
    return 1;
}

/* The views of keys[0..n) under one lease; NULL when views are off, the
 * look-up failed, or no memory (every op then takes the copy path). */
static kvf_resp_vlease_t *kvf_resp_view_get(struct kvf_resp *s,
                                            kvf_resp_conn_t **u, size_t n,
                                            kvf_store_view_t *w)
{
    kvf_resp_vlease_t *vl = calloc(1, sizeof(*vl));
    const char **keys = calloc(n, sizeof(*keys));
    size_t i;

    if (vl == NULL || keys == NULL ||
        (vl->vals = calloc(n, sizeof(*vl->vals))) == NULL) {
        goto fail;
    }
    for (i = 0; i < n; i++) {
        keys[i] = u[i]->okey;
    }
    if (kvf_store_view_get_flags(s->st, n, keys, KVF_STORE_VIEW_SHARED, w,
                                 &vl->h) != KVF_OK) {
        goto fail;
    }
    free(keys);
    vl->nvals = n;
    return vl;

fail:
    free(keys);
    if (vl != NULL) {
        free(vl->vals);
    }
    free(vl);
    return NULL;
}

void kvf_resp_view_batch(struct kvf_resp *s, kvf_resp_conn_t **u, size_t n)
{
    kvf_store_view_t *w = NULL;
    kvf_resp_vlease_t *vl = NULL;
    kvf_resp_loop_t *lp = u[0]->lp;
    size_t i, shm = 0;

    for (i = 0; i < n; i++) {
        u[i]->ost = KVF_INPROGRESS;
        u[i]->oget = NULL;
    }
    if (!s->views || kvf_time_ms() < atomic_load(&s->views_off_until) ||
        (w = calloc(n, sizeof(*w))) == NULL ||
        (vl = kvf_resp_view_get(s, u, n, w)) == NULL) {
        free(w);
        return;
    }
    vl->lp = lp;
    for (i = 0; i < n; i++) {
        shm += (size_t)kvf_resp_view_one(vl, u[i], &w[i], i);
    }
    if (shm == 0) {
        atomic_store(&s->views_off_until, kvf_time_ms() + KVF_RESP_VIEW_OFF_MS);
    }
    free(w);
    if (vl->refs == 0) {
        (void)kvf_store_view_release(vl->h);
        free(vl->vals);
        free(vl);
        return;
    }
    vl->next = lp->vleases;
    if (lp->vleases != NULL) {
        lp->vleases->prev = vl;
    }
    lp->vleases = vl;
}
