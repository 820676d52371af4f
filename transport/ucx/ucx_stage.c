/*
 * ucx transport, initiator side: requests whose local memory lies on a
 * GPU, moved through pinned host buffers. UCX as built here cannot touch
 * GPU memory, so a lane puts such a request's place a host request over
 * one of its pinned buffers: a WRITE's blocks are gathered from the GPU
 * into the buffer (one kernel launch per device) before the puts; a
 * READ's gets land in the buffer and are scattered to the GPU (one
 * launch per device) when they all completed, before the caller's
 * request completes. Only segments that moved are scattered; the
 * caller sees each segment's status as the host request ended it.
 *
 * Everything here runs on the lane's progress thread (or the closing
 * thread after it stopped), which owns the buffers and copy contexts.
 * Buffers are freed only after the lane's worker is gone: a get that
 * UCX had not finished when its request was failed by force may still
 * land in one until then.
 */
#include "transport/ucx/ucx.h"
#include "core/alloc.h"
#include "core/log.h"
#include "mem/gpu.h"
#include "mem/mem.h"

#include <string.h>

/* Longest wait for one gather or scatter on the GPU. */
#define KVF_UCX_STAGE_TIMEOUT_MS 10000
/* Smallest buffer (requests are at most chunk_bytes, 1 MiB by default). */
#define KVF_UCX_STAGE_MIN (1u << 20)

typedef struct kvf_ucx_buf {
    struct kvf_ucx_buf *next;     /* the free list */
    struct kvf_ucx_buf *all_next; /* every buffer of the lane */
    size_t cap;
    char *p;
} kvf_ucx_buf_t;

struct kvf_ucx_stage {
    kvf_ucx_buf_t *free_bufs; /* ready for a request */
    kvf_ucx_buf_t *all;       /* every buffer, freed at fini */
    kvf_cuda_copy_t *cp[KVF_CUDA_DEV_MAX];
};

/* A staged request: the host request posted in the caller's place. */
typedef struct kvf_ucx_staged {
    kvf_tl_req_t inner;
    kvf_tl_req_t *outer;
    kvf_ucx_lane_t *ln;
    kvf_ucx_buf_t *buf;
    kvf_tl_seg_t *segs;     /* inner's: the buffer's pieces */
    kvf_status_t *statuses; /* inner's seg_status */
} kvf_ucx_staged_t;

static kvf_ucx_buf_t *kvf_ucx_buf_get(kvf_ucx_stage_t *st, size_t len)
{
    kvf_ucx_buf_t **pp, *b;

    for (pp = &st->free_bufs; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->cap >= len) {
            b = *pp;
            *pp = b->next;
            return b;
        }
    }
    b = kvf_calloc(1, sizeof(*b));
    if (b == NULL) {
        return NULL;
    }
    b->cap = len < KVF_UCX_STAGE_MIN ? KVF_UCX_STAGE_MIN : len;
    if (kvf_mem_type_alloc(KVF_MEM_PINNED, b->cap, 0, (void **)&b->p) !=
        KVF_OK) {
        kvf_free(b);
        return NULL;
    }
    b->all_next = st->all;
    st->all = b;
    return b;
}

static kvf_cuda_copy_t *kvf_ucx_stage_cp(kvf_ucx_stage_t *st, int dev)
{
    if (dev < 0 || dev >= KVF_CUDA_DEV_MAX) {
        return NULL;
    }
    if (st->cp[dev] == NULL &&
        kvf_cuda_copy_create(dev, &st->cp[dev]) != KVF_OK) {
        st->cp[dev] = NULL;
    }
    return st->cp[dev];
}

/* Copies the segments of device dev that `moved` selects between the
 * GPU and the buffer: gather (GPU to buffer) or scatter (buffer to GPU).
 * Host segments are copied with memcpy by the caller. */
static kvf_status_t kvf_ucx_stage_copy_dev(kvf_ucx_staged_t *s, int dev,
                                           int gather, const int *devs)
{
    kvf_tl_req_t *req = s->outer;
    kvf_cuda_copy_t *cp = kvf_ucx_stage_cp(s->ln->stage, dev);
    kvf_cuda_mem_t gpu = {0},
                   host = {s->buf->p, s->buf->cap, KVF_MEM_PINNED, 0};
    kvf_cuda_blk_t *blks;
    uint64_t lo = UINT64_MAX, hi = 0, off = 0;
    size_t i, n = 0;
    kvf_status_t status;

    if (cp == NULL) {
        return KVF_ERR_UNAVAILABLE;
    }
    blks = kvf_calloc(req->nsegs, sizeof(*blks));
    if (blks == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0; i < req->nsegs; i++) {
        uint64_t a = (uint64_t)(uintptr_t)req->segs[i].local;

        if (devs[i] == dev && s->statuses[i] == KVF_OK) {
            lo = a < lo ? a : lo;
            hi = a + req->segs[i].len > hi ? a + req->segs[i].len : hi;
        }
    }
    for (i = 0; i < req->nsegs; off += req->segs[i].len, i++) {
        if (devs[i] == dev && s->statuses[i] == KVF_OK) {
            uint64_t g = (uint64_t)(uintptr_t)req->segs[i].local - lo;

            blks[n++] = gather ? (kvf_cuda_blk_t){g, off, req->segs[i].len}
                               : (kvf_cuda_blk_t){off, g, req->segs[i].len};
        }
    }
    gpu = (kvf_cuda_mem_t){(void *)(uintptr_t)lo, hi - lo, KVF_MEM_CUDA, dev};
    status = n == 0 ? KVF_OK
                    : kvf_cuda_copy_blocks(cp, gather ? &gpu : &host,
                                           gather ? &host : &gpu, blks, n,
                                           KVF_UCX_STAGE_TIMEOUT_MS);
    kvf_free(blks);
    return status;
}

/* Gathers (WRITE, before) or scatters (READ, after) every segment whose
 * status is KVF_OK: host ones with memcpy, GPU ones per device. */
static kvf_status_t kvf_ucx_stage_copy(kvf_ucx_staged_t *s, int gather)
{
    kvf_tl_req_t *req = s->outer;
    kvf_status_t status = KVF_OK, st;
    uint64_t off = 0;
    int *devs, done[KVF_CUDA_DEV_MAX] = {0};
    size_t i;

    devs = kvf_calloc(req->nsegs, sizeof(*devs));
    if (devs == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0; i < req->nsegs; off += req->segs[i].len, i++) {
        char *b = s->buf->p + off;

        if (kvf_mem_region_lookup((uint64_t)(uintptr_t)req->segs[i].local,
                                  &devs[i], NULL) != KVF_MEM_CUDA) {
            devs[i] = -1;
            if (s->statuses[i] == KVF_OK) {
                memcpy(gather ? b : req->segs[i].local,
                       gather ? req->segs[i].local : b, req->segs[i].len);
            }
        }
    }
    for (i = 0; i < req->nsegs; i++) {
        if (devs[i] >= 0 && devs[i] < KVF_CUDA_DEV_MAX && !done[devs[i]]) {
            done[devs[i]] = 1;
            st = kvf_ucx_stage_copy_dev(s, devs[i], gather, devs);
            status = status == KVF_OK ? st : status;
        }
    }
    kvf_free(devs);
    return status;
}

static void kvf_ucx_staged_free(kvf_ucx_staged_t *s)
{
    kvf_ucx_stage_t *st = s->ln->stage;

    s->buf->next = st->free_bufs;
    st->free_bufs = s->buf;
    kvf_free(s->segs);
    kvf_free(s->statuses);
    kvf_free(s);
}

/* The host request ended: a READ's moved segments go to the GPU, then
 * the caller's request completes with the host request's statuses. */
static void kvf_ucx_staged_done(kvf_tl_req_t *inner)
{
    kvf_ucx_staged_t *s = inner->arg;
    kvf_tl_req_t *req = s->outer;
    kvf_status_t status = inner->status;
    size_t i;

    if (status != KVF_OK) {
        for (i = 0; i < req->nsegs; i++) {
            req->seg_status[i] = s->statuses[i];
        }
    } else {
        for (i = 0; i < req->nsegs; i++) {
            s->statuses[i] = KVF_OK;
        }
    }
    if (req->type == KVF_OP_READ) {
        kvf_status_t st = kvf_ucx_stage_copy(s, 0);

        if (st != KVF_OK) {
            kvf_warn("ucx: scattering a staged read to the GPU: %s",
                     kvf_status_str(st));
            status = st;
            for (i = 0; i < req->nsegs; i++) {
                req->seg_status[i] = st;
            }
        }
    }
    req->status = status;
    kvf_ucx_staged_free(s);
    req->complete(req);
}

static kvf_ucx_staged_t *kvf_ucx_staged_new(kvf_ucx_lane_t *ln,
                                            kvf_tl_req_t *req)
{
    kvf_ucx_staged_t *s = kvf_calloc(1, sizeof(*s));
    uint64_t off = 0;
    size_t i;

    if (s == NULL) {
        return NULL;
    }
    s->segs = kvf_calloc(req->nsegs, sizeof(*s->segs));
    s->statuses = kvf_calloc(req->nsegs, sizeof(*s->statuses));
    s->buf = kvf_ucx_buf_get(ln->stage, req->bytes);
    if (s->segs == NULL || s->statuses == NULL || s->buf == NULL) {
        if (s->buf != NULL) {
            s->buf->next = ln->stage->free_bufs;
            ln->stage->free_bufs = s->buf;
        }
        kvf_free(s->segs);
        kvf_free(s->statuses);
        kvf_free(s);
        return NULL;
    }
    for (i = 0; i < req->nsegs; off += req->segs[i].len, i++) {
        s->segs[i] = (kvf_tl_seg_t){s->buf->p + off, req->segs[i].remote,
                                    req->segs[i].len};
    }
    s->outer = req;
    s->ln = ln;
    s->inner = (kvf_tl_req_t){.type = req->type,
                              .segs = s->segs,
                              .nsegs = req->nsegs,
                              .bytes = req->bytes,
                              .cancel = req->cancel,
                              .seg_status = s->statuses,
                              .local_mem = KVF_MEM_BIT(KVF_MEM_PINNED),
                              .complete = kvf_ucx_staged_done,
                              .arg = s,
                              .deadline_ms = req->deadline_ms};
    return s;
}

kvf_tl_req_t *kvf_ucx_stage(kvf_ucx_lane_t *ln, kvf_tl_req_t *req)
{
    kvf_ucx_staged_t *s;
    kvf_status_t status = KVF_ERR_NO_MEMORY;

    if (ln->stage == NULL) {
        ln->stage = kvf_calloc(1, sizeof(*ln->stage));
    }
    s = ln->stage != NULL ? kvf_ucx_staged_new(ln, req) : NULL;
    if (s != NULL && req->type == KVF_OP_WRITE) {
        status = kvf_ucx_stage_copy(s, 1);
        if (status != KVF_OK) {
            kvf_warn("ucx: gathering a staged write from the GPU: %s",
                     kvf_status_str(status));
            kvf_ucx_staged_free(s);
            s = NULL;
        }
    }
    if (s == NULL) {
        kvf_tl_req_fail(req, status);
        return NULL;
    }
    return &s->inner;
}

void kvf_ucx_stage_fini(kvf_ucx_lane_t *ln)
{
    kvf_ucx_stage_t *st = ln->stage;
    int d;

    if (st == NULL) {
        return;
    }
    while (st->all != NULL) {
        kvf_ucx_buf_t *b = st->all;

        st->all = b->all_next;
        kvf_mem_type_free(b->p);
        kvf_free(b);
    }
    for (d = 0; d < KVF_CUDA_DEV_MAX; d++) {
        if (st->cp[d] != NULL) {
            kvf_cuda_copy_destroy(st->cp[d]);
        }
    }
    kvf_free(st);
    ln->stage = NULL;
}
