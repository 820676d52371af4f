/*
 * Batches: a list of operations is checked (local addresses against the
 * local regions), cut into transport requests of at most chunk_bytes and
 * KVF_CHUNK_SEGS segments (large operations are split, small ones packed
 * together; transports then merge adjacent segments), and posted to the
 * peers' eps, which spread them over their connections. Each request's
 * completion credits bytes or an error to the operations it carries; the
 * batch is done when the last request completes.
 *
 * Inline (KVF_BATCH_INLINE, for a caller that waits at once): requests
 * of host memory (each at most KVF_INLINE_MAX_BYTES) are offered to the
 * transport's ep_post_inline, which moves one on the calling thread when
 * it can do so at once (tcp: an idle connection; shm: an open lease
 * covering it). A batch of one request is offered whatever the
 * transport; when the transport's inline path is a copy (inline_batch:
 * shm), a small batch (nothing posted while it was cut: at most
 * KVF_OPEN_CHUNKS requests) offers every request and a large one posts
 * its other requests first and offers one, so the transport's threads
 * move the rest meanwhile. A batch that went inline whole returns done
 * from submit: no hand-off to a transport thread and no wake-up of the
 * caller, which for small objects cost more than the bytes. A request
 * the transport does not take is posted as usual.
 *
 * While other batches of the engine are live (callers on other threads),
 * an inline batch of at most KVF_INLINE_ALL_BYTES offers every request
 * of an inline_batch transport to the inline path, posting nothing
 * during the cut: the transport's threads are already busy with the
 * other callers' requests, and handing this caller's to them only adds
 * two wake-ups per batch. A lone caller keeps the split above, which
 * puts the transport's threads to work beside it (docs/shm.md).
 */
#include "engine/engine_int.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>

#define KVF_CHUNK_SEGS       256
#define KVF_OPEN_CHUNKS      8
#define KVF_INLINE_MAX_BYTES (1u << 20)
#define KVF_INLINE_ALL_BYTES (8u << 20)

typedef struct kvf_chunk {
    kvf_tl_req_t req;
    struct kvf_batch *batch;
    kvf_peer_h peer;
    struct kvf_chunk *next_alloc;
    uint32_t seg_op[KVF_CHUNK_SEGS];
    kvf_tl_seg_t segs[KVF_CHUNK_SEGS];
    kvf_status_t seg_status[KVF_CHUNK_SEGS];
} kvf_chunk_t;

struct kvf_batch {
    kvf_engine_h engine;
    size_t nops;
    kvf_status_t *op_status;
    uint64_t *op_bytes;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    size_t pending; /* requests posted and not completed */
    int building;   /* submit still posting */
    int cancel;
    unsigned flags; /* KVF_BATCH_* */
    int inline_all; /* offer every request inline, post none in the cut */
    int device_mem; /* some local memory is not host memory */
    kvf_status_t first_error;
    kvf_chunk_t *chunks;
};

static void kvf_batch_op_fail(struct kvf_batch *b, size_t op,
                              kvf_status_t status)
{
    kvf_status_t expect = KVF_INPROGRESS;

    __atomic_compare_exchange_n(&b->op_status[op], &expect, status, 0,
                                __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

/* Marks operations still in progress as done once nothing is pending. */
static void kvf_batch_finish(struct kvf_batch *b)
{
    size_t i;

    for (i = 0; i < b->nops; i++) {
        if (b->op_status[i] == KVF_INPROGRESS) {
            b->op_status[i] = KVF_OK;
        } else if (b->op_status[i] != KVF_OK && b->first_error == KVF_OK) {
            b->first_error = b->op_status[i];
        }
    }
    pthread_cond_broadcast(&b->cond);
}

static void kvf_chunk_complete(kvf_tl_req_t *req)
{
    kvf_chunk_t *c = req->arg;
    struct kvf_batch *b = c->batch;
    kvf_status_t st;
    size_t i;

    for (i = 0; i < req->nsegs; i++) {
        st = (req->status == KVF_OK) ? KVF_OK : c->seg_status[i];
        if (st == KVF_OK) {
            /* release: whoever reads an op's full count (acquire, in
             * kvf_batch_op_status) sees its bytes in place */
            __atomic_add_fetch(&b->op_bytes[c->seg_op[i]], c->segs[i].len,
                               __ATOMIC_RELEASE);
        } else {
            kvf_batch_op_fail(b, c->seg_op[i], st);
        }
    }
    pthread_mutex_lock(&b->lock);
    if (--b->pending == 0 && !b->building) {
        kvf_batch_finish(b);
    }
    pthread_mutex_unlock(&b->lock);
}

static kvf_chunk_t *kvf_chunk_new(struct kvf_batch *b, kvf_peer_h peer,
                                  kvf_op_type_t type)
{
    kvf_chunk_t *c = kvf_malloc(sizeof(*c));

    if (c == NULL) {
        return NULL;
    }
    memset(&c->req, 0, sizeof(c->req));
    c->req.type = type;
    c->req.segs = c->segs;
    c->req.seg_status = c->seg_status;
    c->req.cancel = &b->cancel;
    c->req.complete = kvf_chunk_complete;
    c->req.arg = c;
    c->batch = b;
    c->peer = peer;
    c->next_alloc = b->chunks;
    b->chunks = c;
    return c;
}

static void kvf_chunk_post(kvf_chunk_t *c)
{
    struct kvf_batch *b = c->batch;
    kvf_status_t status;

    pthread_mutex_lock(&b->lock);
    b->pending++;
    pthread_mutex_unlock(&b->lock);
    KVF_TL_COUNT(requests, 1);
    KVF_TL_COUNT(segments, c->req.nsegs);
    status = c->peer->ops->ep_post(c->peer->ep, &c->req);
    if (status != KVF_OK) {
        kvf_tl_req_fail(&c->req, status);
    }
}

/* Offers a lone small request to its transport's inline path; 1 when it
 * was moved (completed), 0 to post it. */
static int kvf_chunk_try_inline(kvf_chunk_t *c)
{
    struct kvf_batch *b = c->batch;
    const kvf_transport_ops_t *ops = c->peer->ops;

    if (!(b->flags & KVF_BATCH_INLINE) || b->device_mem ||
        ops->ep_post_inline == NULL || c->req.bytes > KVF_INLINE_MAX_BYTES) {
        return 0;
    }
    pthread_mutex_lock(&b->lock);
    b->pending++;
    pthread_mutex_unlock(&b->lock);
    if (ops->ep_post_inline(c->peer->ep, &c->req) == KVF_OK) {
        KVF_TL_COUNT(requests, 1);
        KVF_TL_COUNT(segments, c->req.nsegs);
        return 1;
    }
    pthread_mutex_lock(&b->lock);
    b->pending--;
    pthread_mutex_unlock(&b->lock);
    return 0;
}

static kvf_status_t kvf_batch_check_op(kvf_engine_h e, const kvf_op_t *op,
                                       int *device_mem_p,
                                       kvf_mem_type_t *type_p)
{
    struct kvf_region *r;

    if ((op->type != KVF_OP_READ && op->type != KVF_OP_WRITE) ||
        op->peer == NULL || op->peer->engine != e) {
        return KVF_ERR_INVALID_PARAM;
    }
    *type_p = KVF_MEM_HOST;
    if (op->length == 0) {
        return KVF_OK;
    }
    r = kvf_region_find(e, (uint64_t)(uintptr_t)op->local, op->length);
    if (r == NULL) {
        kvf_log_rl(KVF_LOG_ERROR, "local address %p+%zu is not registered",
                   op->local, op->length);
        return KVF_ERR_NOT_REGISTERED;
    }
    *type_p = r->type;
    if (r->type != KVF_MEM_HOST) {
        *device_mem_p = 1;
    }
    return KVF_OK;
}

/* A chunk the cut is done with: posted now, or (inline_all) kept on
 * b->chunks for kvf_batch_offer_all. */
static void kvf_batch_close(struct kvf_batch *b, kvf_chunk_t *c, unsigned *held,
                            int *posted)
{
    if (b->inline_all) {
        return;
    }
    *posted = 1;
    if (*held > 0) {
        pthread_rwlock_unlock(&b->engine->regions_lock);
        *held = 0;
    }
    kvf_chunk_post(c);
}

/* inline_all: requests of other transports posted first, so they move
 * meanwhile; then each of the others offered inline, posted if refused. */
static void kvf_batch_offer_all(struct kvf_batch *b)
{
    kvf_chunk_t *c;

    for (c = b->chunks; c != NULL; c = c->next_alloc) {
        if (!c->peer->ops->inline_batch) {
            kvf_chunk_post(c);
        }
    }
    for (c = b->chunks; c != NULL; c = c->next_alloc) {
        if (c->peer->ops->inline_batch && !kvf_chunk_try_inline(c)) {
            kvf_chunk_post(c);
        }
    }
}

/* Whether ops move at most KVF_INLINE_ALL_BYTES in all, every one to a
 * peer whose transport's inline path is a copy (shm; tcp's takes a lone
 * request only, which the usual path offers already). */
static int kvf_batch_small(const kvf_op_t *ops, size_t count)
{
    uint64_t bytes = 0;
    size_t i;

    for (i = 0; i < count; i++) {
        if (ops[i].peer == NULL || !ops[i].peer->ops->inline_batch) {
            return 0;
        }
        bytes += ops[i].length;
        if (bytes > KVF_INLINE_ALL_BYTES) {
            return 0;
        }
    }
    return 1;
}

/* The cut's state: up to KVF_OPEN_CHUNKS chunks being filled (one per
 * peer and type), the regions read lock count, whether any request went
 * out. */
typedef struct kvf_batch_cut {
    kvf_chunk_t *open[KVF_OPEN_CHUNKS];
    unsigned held; /* checks under the current read lock, 0: unlocked */
    int posted;    /* some request went out during the build */
} kvf_batch_cut_t;

/* The open chunk that takes `piece` more bytes for op's peer and type:
 * one is closed (posted) when all are taken or it is full, a new one
 * started. NULL when no memory is left. */
static kvf_chunk_t *kvf_batch_chunk_for(struct kvf_batch *b,
                                        kvf_batch_cut_t *cut,
                                        const kvf_op_t *op, uint64_t piece)
{
    kvf_chunk_t **open = cut->open;
    kvf_chunk_t *c;
    size_t k;

    for (k = 0; k < KVF_OPEN_CHUNKS && open[k] != NULL; k++) {
        if (open[k]->peer == op->peer && open[k]->req.type == op->type) {
            break;
        }
    }
    if (k == KVF_OPEN_CHUNKS) {
        kvf_batch_close(b, open[0], &cut->held, &cut->posted);
        memmove(open, open + 1, sizeof(open[0]) * (k - 1));
        open[--k] = NULL;
    }
    c = open[k];
    if (c != NULL && (c->req.nsegs == KVF_CHUNK_SEGS ||
                      c->req.bytes + piece > b->engine->cfg.chunk_bytes)) {
        kvf_batch_close(b, c, &cut->held, &cut->posted);
        c = NULL;
    }
    if (c == NULL) {
        c = kvf_chunk_new(b, op->peer, op->type);
        open[k] = c;
    }
    return c;
}

/* Cuts operation i into segments of at most chunk_bytes. */
static void kvf_batch_cut_op(struct kvf_batch *b, kvf_batch_cut_t *cut,
                             const kvf_op_t *op, size_t i, kvf_mem_type_t type)
{
    uint64_t chunk_max = b->engine->cfg.chunk_bytes, off, piece;
    kvf_chunk_t *c;

    for (off = 0; off < op->length; off += piece) {
        piece = op->length - off;
        if (piece > chunk_max) {
            piece = chunk_max;
        }
        c = kvf_batch_chunk_for(b, cut, op, piece);
        if (c == NULL) {
            kvf_batch_op_fail(b, i, KVF_ERR_NO_MEMORY);
            break;
        }
        c->segs[c->req.nsegs].local = (char *)op->local + off;
        c->segs[c->req.nsegs].remote = op->remote + off;
        c->segs[c->req.nsegs].len = piece;
        c->seg_op[c->req.nsegs] = (uint32_t)i;
        c->req.nsegs++;
        c->req.bytes += piece;
        c->req.local_mem |= KVF_MEM_BIT(type);
    }
}

/* After the cut: the chunks still open go out, inline where it pays. */
static void kvf_batch_dispatch(struct kvf_batch *b, kvf_batch_cut_t *cut)
{
    kvf_chunk_t **open = cut->open;
    size_t k;

    if (b->inline_all) {
        kvf_batch_offer_all(b);
        return;
    }
    if (!cut->posted) {
        /* a small batch (every request still open): all inline when the
         * transport's inline path is a copy, a lone request whatever it
         * is; no hand-off at all */
        for (k = 0; k < KVF_OPEN_CHUNKS && open[k] != NULL; k++) {
            if ((open[1] != NULL && !open[k]->peer->ops->inline_batch) ||
                !kvf_chunk_try_inline(open[k])) {
                kvf_chunk_post(open[k]);
            }
        }
        return;
    }
    /* a large one: the other requests are posted first, so the
     * transport's threads move them while this thread moves one */
    for (k = 1; k < KVF_OPEN_CHUNKS && open[k] != NULL; k++) {
        kvf_chunk_post(open[k]);
    }
    if (open[0] != NULL &&
        (!open[0]->peer->ops->inline_batch || !kvf_chunk_try_inline(open[0]))) {
        kvf_chunk_post(open[0]);
    }
}

/* Cuts the operations into chunks and posts them. */
static kvf_status_t kvf_batch_build(struct kvf_batch *b, const kvf_op_t *ops)
{
    kvf_engine_h e = b->engine;
    kvf_batch_cut_t cut;
    kvf_mem_type_t type;
    kvf_status_t st;
    size_t i;

    memset(&cut, 0, sizeof(cut));
    for (i = 0; i < b->nops; i++) {
        /* the regions read lock is kept over a run of checks (taking it
         * per operation is a fifth of the per-block cost), released
         * before any post and every 256 checks */
        if (cut.held == 256) {
            pthread_rwlock_unlock(&e->regions_lock);
            cut.held = 0;
        }
        if (cut.held++ == 0) {
            pthread_rwlock_rdlock(&e->regions_lock);
        }
        st = kvf_batch_check_op(e, &ops[i], &b->device_mem, &type);
        if (st != KVF_OK) {
            b->op_status[i] = st;
            continue;
        }
        kvf_batch_cut_op(b, &cut, &ops[i], i, type);
    }
    if (cut.held > 0) {
        pthread_rwlock_unlock(&e->regions_lock);
    }
    kvf_batch_dispatch(b, &cut);
    return KVF_OK;
}

kvf_status_t kvf_batch_submit(kvf_engine_h e, const kvf_op_t *ops, size_t count,
                              kvf_batch_h *batch_p)
{
    return kvf_batch_submit_ex(e, ops, count, 0, batch_p);
}

kvf_status_t kvf_batch_submit_ex(kvf_engine_h e, const kvf_op_t *ops,
                                 size_t count, unsigned flags,
                                 kvf_batch_h *batch_p)
{
    struct kvf_batch *b;
    size_t i;

    if (e == NULL || batch_p == NULL || (count > 0 && ops == NULL) ||
        count > UINT32_MAX) {
        return KVF_ERR_INVALID_PARAM;
    }
    b = kvf_calloc(1, sizeof(*b));
    if (b == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    b->op_status = kvf_malloc((count + 1) * sizeof(*b->op_status));
    b->op_bytes = kvf_calloc(count + 1, sizeof(*b->op_bytes));
    if (b->op_status == NULL || b->op_bytes == NULL) {
        kvf_free(b->op_status);
        kvf_free(b->op_bytes);
        kvf_free(b);
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0; i < count; i++) {
        b->op_status[i] = KVF_INPROGRESS;
    }
    b->engine = e;
    b->nops = count;
    b->flags = flags;
    /* other callers' batches live: this one moves on its own thread */
    b->inline_all =
        __atomic_fetch_add(&e->batches_live, 1, __ATOMIC_RELAXED) > 0 &&
        (flags & KVF_BATCH_INLINE) && kvf_batch_small(ops, count);
    b->building = 1;
    b->first_error = KVF_OK;
    pthread_mutex_init(&b->lock, NULL);
    kvf_cond_init(&b->cond);
    kvf_batch_build(b, ops);
    pthread_mutex_lock(&b->lock);
    b->building = 0;
    if (b->pending == 0) {
        kvf_batch_finish(b);
    }
    pthread_mutex_unlock(&b->lock);
    *batch_p = b;
    return KVF_OK;
}

kvf_status_t kvf_batch_test(kvf_batch_h b)
{
    kvf_status_t status;

    pthread_mutex_lock(&b->lock);
    status = (b->pending > 0 || b->building) ? KVF_INPROGRESS : b->first_error;
    pthread_mutex_unlock(&b->lock);
    return status;
}

kvf_status_t kvf_batch_wait(kvf_batch_h b, int timeout_ms)
{
    struct timespec ts;
    kvf_status_t status;

    kvf_time_abs_after(&ts, timeout_ms < 0 ? 0 : timeout_ms);
    pthread_mutex_lock(&b->lock);
    while (b->pending > 0 || b->building) {
        if (pthread_cond_timedwait(&b->cond, &b->lock, &ts) != 0) {
            break;
        }
    }
    status = (b->pending > 0 || b->building) ? KVF_ERR_TIMEOUT : b->first_error;
    pthread_mutex_unlock(&b->lock);
    return status;
}

void kvf_batch_cancel(kvf_batch_h b)
{
    __atomic_store_n(&b->cancel, 1, __ATOMIC_RELEASE);
}

kvf_status_t kvf_batch_op_status(kvf_batch_h b, size_t index, size_t *bytes_p)
{
    kvf_status_t status;

    if (index >= b->nops) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = __atomic_load_n(&b->op_status[index], __ATOMIC_RELAXED);
    if (bytes_p != NULL) {
        *bytes_p =
            (size_t)__atomic_load_n(&b->op_bytes[index], __ATOMIC_ACQUIRE);
    }
    return status;
}

void kvf_batch_destroy(kvf_batch_h b)
{
    kvf_chunk_t *c;

    if (b == NULL) {
        return;
    }
    if (kvf_batch_test(b) == KVF_INPROGRESS) {
        kvf_batch_cancel(b);
        /* transports complete every request within their timeout */
        /* (a batch that finished with KVF_ERR_TIMEOUT is done too) */
        while (kvf_batch_wait(b, (int)b->engine->cfg.timeout_ms * 2) ==
                   KVF_ERR_TIMEOUT &&
               kvf_batch_test(b) == KVF_INPROGRESS) {
            kvf_warn("batch %p still running after cancel", (void *)b);
        }
    }
    while ((c = b->chunks) != NULL) {
        b->chunks = c->next_alloc;
        kvf_free(c);
    }
    __atomic_fetch_sub(&b->engine->batches_live, 1, __ATOMIC_RELAXED);
    pthread_mutex_destroy(&b->lock);
    pthread_cond_destroy(&b->cond);
    kvf_free(b->op_status);
    kvf_free(b->op_bytes);
    kvf_free(b);
}

kvf_status_t kvf_transfer_sync(kvf_engine_h e, const kvf_op_t *ops,
                               size_t count, int timeout_ms)
{
    kvf_batch_h b;
    kvf_status_t status;

    status = kvf_batch_submit_ex(e, ops, count, KVF_BATCH_INLINE, &b);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_batch_wait(b, timeout_ms);
    kvf_batch_destroy(b);
    return status;
}

void kvf_engine_stats(kvf_engine_h engine, kvf_engine_stats_t *stats_p)
{
    (void)engine;
    stats_p->requests =
        __atomic_load_n(&kvf_tl_counters.requests, __ATOMIC_RELAXED);
    stats_p->segments =
        __atomic_load_n(&kvf_tl_counters.segments, __ATOMIC_RELAXED);
    stats_p->wire_entries =
        __atomic_load_n(&kvf_tl_counters.wire_entries, __ATOMIC_RELAXED);
    stats_p->wire_iovs =
        __atomic_load_n(&kvf_tl_counters.wire_iovs, __ATOMIC_RELAXED);
    stats_p->bytes = __atomic_load_n(&kvf_tl_counters.bytes, __ATOMIC_RELAXED);
    stats_p->errors =
        __atomic_load_n(&kvf_tl_counters.errors, __ATOMIC_RELAXED);
}
