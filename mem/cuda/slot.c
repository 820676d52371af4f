/*
 * mem/cuda: pinned staging slots and the copies that go through them.
 * A slot is a pinned, mapped buffer with its descriptor array; its copy
 * launch signals completion through a mapped host word. Socket I/O of GPU
 * memory (stage.c) and the pageable-host paths of
 * kvf_cuda_copy_blocks (here) use them: host->GPU, the CPU gathers blocks
 * into a slot while the GPU scatters the previous one; GPU->host, the GPU
 * gathers into a slot while the CPU scatters the previous one.
 */
#include "mem/cuda/kern.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>
#include <time.h>

/* ---- slots ------------------------------------------------------------ */

/*
 * A slot's copies signal completion themselves: the last CTA of the
 * launch writes the slot's sequence number into a mapped host word after
 * a system-scope fence, so waiting is a read of host memory, with no
 * CUDA call (connection threads polling events would contend for the
 * driver's locks with the threads launching).
 */
kvf_status_t kvf_cuda_slot_init(kvf_cuda_slot_t *s, uint64_t cap,
                                unsigned blks_cap)
{
    kvf_status_t status;

    memset(s, 0, sizeof(*s));
    s->ev_dev = -1;
    status = KVF_CUDA_CHECK(cudaHostAlloc(
        (void **)&s->buf, cap, cudaHostAllocPortable | cudaHostAllocMapped));
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(cudaHostAlloc(
            (void **)&s->blks, (size_t)blks_cap * sizeof(kvf_cuda_blk_t),
            cudaHostAllocPortable | cudaHostAllocMapped));
    }
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(
            cudaHostAlloc((void **)&s->flag, 64,
                          cudaHostAllocPortable | cudaHostAllocMapped));
    }
    if (status != KVF_OK) {
        kvf_cuda_slot_fini(s);
        return status;
    }
    *(volatile unsigned *)s->flag = 0;
    s->cap = cap;
    s->blks_cap = blks_cap;
    return KVF_OK;
}

void kvf_cuda_slot_fini(kvf_cuda_slot_t *s)
{
    int d;

    for (d = 0; d < KVF_CUDA_DEV_MAX; d++) {
        if (s->ctr[d] != NULL) {
            cudaSetDevice(d);
            cudaFree(s->ctr[d]);
        }
    }
    if (s->buf != NULL) {
        cudaFreeHost(s->buf);
    }
    if (s->blks != NULL) {
        cudaFreeHost(s->blks);
    }
    if (s->flag != NULL) {
        cudaFreeHost(s->flag);
    }
    memset(s, 0, sizeof(*s));
    s->ev_dev = -1;
}

kvf_status_t kvf_cuda_slot_wait(kvf_cuda_slot_t *s, uint64_t deadline_ms)
{
    struct timespec nap = {0, 20000};
    unsigned spins = 0;
    int p;

    if (s->ev_dev < 0) {
        return KVF_OK;
    }
    while (__atomic_load_n(s->flag, __ATOMIC_ACQUIRE) != s->seq) {
        spins++;
        if ((spins & 255) == 0 && kvf_time_ms() >= deadline_ms) {
            kvf_log_rl(KVF_LOG_ERROR, "GPU staging copy still running at "
                                      "deadline");
            return KVF_ERR_TIMEOUT;
        }
        if (spins < 200000) {
            for (p = 0; p < 8; p++) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
            }
        } else {
            nanosleep(&nap, NULL);
        }
    }
    s->ev_dev = -1;
    return KVF_OK;
}

kvf_status_t kvf_cuda_slot_post(kvf_cuda_slot_t *s, int device,
                                cudaStream_t stream, int to_gpu, unsigned *err)
{
    kvf_cuda_launch_t l;
    kvf_status_t status;

    if (s->nblks == 0) {
        return KVF_OK;
    }
    if (s->ctr[device] == NULL) {
        status = KVF_CUDA_CHECK(cudaMalloc((void **)&s->ctr[device], 64));
        if (status == KVF_OK) {
            status = KVF_CUDA_CHECK(cudaMemset(s->ctr[device], 0, 64));
        }
        if (status != KVF_OK) {
            return status;
        }
    }
    memset(&l, 0, sizeof(l));
    l.blks = s->blks;
    l.n = s->nblks;
    l.err = err;
    l.ctr = s->ctr[device];
    l.flag = s->flag;
    l.seq = ++s->seq;
    if (to_gpu) {
        l.src_base = (uint64_t)(uintptr_t)s->buf;
        l.src_len = s->cap;
        l.dst_base = 0;
        l.dst_len = UINT64_MAX;
    } else {
        l.src_base = 0;
        l.src_len = UINT64_MAX;
        l.dst_base = (uint64_t)(uintptr_t)s->buf;
        l.dst_len = s->cap;
    }
    status = KVF_CUDA_CHECK((cudaError_t)kvf_cuda_kern_launch(
        KVF_CUDA_KERNEL_WARP, &l, kvf_cuda_devs[device].sm_count, stream));
    if (status == KVF_OK) {
        s->ev_dev = device;
    }
    return status;
}

/* ---- pageable host memory --------------------------------------------- */

static kvf_status_t kvf_cuda_stage_ready(kvf_cuda_copy_t *cp)
{
    kvf_status_t status;
    int i;

    if (cp->staged) {
        return KVF_OK;
    }
    for (i = 0; i < KVF_COPY_STAGE_SLOTS; i++) {
        status = kvf_cuda_slot_init(&cp->slot[i], KVF_COPY_STAGE_BYTES,
                                    KVF_COPY_STAGE_BLKS);
        if (status != KVF_OK) {
            return status;
        }
        cp->slot_host[i] =
            kvf_malloc(KVF_COPY_STAGE_BLKS * sizeof(*cp->slot_host[i]));
        if (cp->slot_host[i] == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
    }
    cp->staged = 1;
    return KVF_OK;
}

/* Scatters a finished GPU->host slot into the pageable destination. */
static void kvf_cuda_slot_scatter(kvf_cuda_copy_t *cp, int k,
                                  const kvf_cuda_mem_t *dst)
{
    kvf_cuda_slot_t *s = &cp->slot[k];
    unsigned j;

    for (j = 0; j < s->nblks; j++) {
        memcpy((char *)dst->base + cp->slot_host[k][j],
               s->buf + s->blks[j].dst_off, s->blks[j].len);
    }
}

/* A staged copy in progress: the sides, the slot being filled (k) and
 * the one posted before it (prev, -1: none). */
typedef struct kvf_cuda_stg {
    kvf_cuda_copy_t *cp;
    int to_gpu;
    const kvf_cuda_mem_t *host, *gpu, *dst;
    uint64_t gbase;
    int k, prev;
    uint64_t deadline;
} kvf_cuda_stg_t;

/* Waits for every slot and empties it. */
static kvf_status_t kvf_cuda_stg_reset(kvf_cuda_copy_t *cp, uint64_t deadline)
{
    kvf_status_t status = KVF_OK;
    int j;

    for (j = 0; j < KVF_COPY_STAGE_SLOTS && status == KVF_OK; j++) {
        status = kvf_cuda_slot_wait(&cp->slot[j], deadline);
        cp->slot[j].used = 0;
        cp->slot[j].nblks = 0;
    }
    return status;
}

/* Puts what fits of block b, from byte *off on, into the current slot;
 * advances *off (and *i when the block is done). 1 when the slot must
 * be posted now: full, or the batch done. */
static int kvf_cuda_stg_fill(kvf_cuda_stg_t *g, const kvf_cuda_blk_t *b,
                             uint64_t *off, size_t *i, size_t n)
{
    kvf_cuda_slot_t *s = &g->cp->slot[g->k];
    uint64_t hoff = g->to_gpu ? b->src_off : b->dst_off;
    uint64_t goff = g->to_gpu ? b->dst_off : b->src_off;
    uint64_t piece = b->len - *off;
    kvf_cuda_blk_t *d;

    if (piece > s->cap - s->used) {
        piece = s->cap - s->used;
    }
    if (piece == 0 || s->nblks >= s->blks_cap) {
        return 1;
    }
    d = &s->blks[s->nblks];
    if (g->to_gpu) {
        memcpy(s->buf + s->used, (char *)g->host->base + hoff + *off, piece);
        d->src_off = s->used;
        d->dst_off = g->gbase + goff + *off;
    } else {
        g->cp->slot_host[g->k][s->nblks] = hoff + *off;
        d->src_off = g->gbase + goff + *off;
        d->dst_off = s->used;
    }
    d->len = piece;
    s->nblks++;
    s->used += piece;
    *off += piece;
    if (*off == b->len) {
        *off = 0;
        (*i)++;
    }
    return !(*i < n && s->used < s->cap && s->nblks < s->blks_cap);
}

/* GPU->host: waits for the previously posted slot and scatters it. */
static kvf_status_t kvf_cuda_stg_drain_prev(kvf_cuda_stg_t *g)
{
    kvf_status_t status;

    if (g->to_gpu || g->prev < 0) {
        return KVF_OK;
    }
    status = kvf_cuda_slot_wait(&g->cp->slot[g->prev], g->deadline);
    if (status == KVF_OK) {
        kvf_cuda_slot_scatter(g->cp, g->prev, g->dst);
    }
    return status;
}

/* Posts the current slot, drains the one before it, and takes the next
 * (its earlier copy over before reuse; GPU->host: scattered already). */
static kvf_status_t kvf_cuda_stg_rotate(kvf_cuda_stg_t *g)
{
    kvf_cuda_copy_t *cp = g->cp;
    kvf_status_t status;

    status = kvf_cuda_slot_post(&cp->slot[g->k], cp->device, cp->stream,
                                g->to_gpu, cp->err);
    if (status == KVF_OK) {
        status = kvf_cuda_stg_drain_prev(g);
    }
    if (status != KVF_OK) {
        return status;
    }
    g->prev = g->k;
    g->k = (g->k + 1) % KVF_COPY_STAGE_SLOTS;
    status = kvf_cuda_slot_wait(&cp->slot[g->k], g->deadline);
    cp->slot[g->k].used = 0;
    cp->slot[g->k].nblks = 0;
    return status;
}

/* Posts the last partial slot and waits for everything. */
static kvf_status_t kvf_cuda_stg_finish(kvf_cuda_stg_t *g, kvf_status_t status)
{
    kvf_cuda_copy_t *cp = g->cp;
    int j;

    if (status == KVF_OK && cp->slot[g->k].nblks > 0) {
        status = kvf_cuda_slot_post(&cp->slot[g->k], cp->device, cp->stream,
                                    g->to_gpu, cp->err);
        if (status == KVF_OK) {
            status = kvf_cuda_stg_drain_prev(g);
        }
        g->prev = g->k;
    }
    if (status == KVF_OK) {
        /* wait the last one (and, GPU->host, scatter it) */
        status = kvf_cuda_stg_drain_prev(g);
    }
    for (j = 0; j < KVF_COPY_STAGE_SLOTS && status == KVF_OK; j++) {
        status = kvf_cuda_slot_wait(&cp->slot[j], g->deadline);
    }
    if (status == KVF_OK && *(volatile unsigned *)cp->err != 0) {
        status = KVF_ERR_OUT_OF_BOUNDS;
    }
    return status;
}

/*
 * One side pageable host memory: staged through pinned slots. to_gpu:
 * the CPU gathers into a slot, the GPU scatters it; else the GPU gathers
 * into a slot and the CPU scatters it after the next slot is posted.
 */
kvf_status_t kvf_cuda_copy_staged(kvf_cuda_copy_t *cp,
                                  const kvf_cuda_mem_t *src,
                                  const kvf_cuda_mem_t *dst,
                                  const kvf_cuda_blk_t *blks, size_t n,
                                  uint64_t deadline)
{
    kvf_status_t status, first = KVF_OK;
    kvf_cuda_stg_t g;
    uint64_t off = 0;
    size_t i = 0;

    status = kvf_cuda_stage_ready(cp);
    if (status != KVF_OK) {
        return status;
    }
    memset(&g, 0, sizeof(g));
    g.cp = cp;
    g.to_gpu = (src->type == KVF_MEM_HOST);
    g.host = g.to_gpu ? src : dst;
    g.gpu = g.to_gpu ? dst : src;
    g.dst = dst;
    g.gbase = (uint64_t)(uintptr_t)g.gpu->base;
    g.prev = -1;
    g.deadline = deadline;
    *(volatile unsigned *)cp->err = 0;
    status = kvf_cuda_stg_reset(cp, deadline);
    while (status == KVF_OK && i < n) {
        const kvf_cuda_blk_t *b = &blks[i];
        uint64_t hoff = g.to_gpu ? b->src_off : b->dst_off;
        uint64_t goff = g.to_gpu ? b->dst_off : b->src_off;

        if (!kvf_cuda_blk_in(hoff, b->len, g.host->len) ||
            !kvf_cuda_blk_in(goff, b->len, g.gpu->len)) {
            first = KVF_ERR_OUT_OF_BOUNDS;
            i++;
            continue;
        }
        if (kvf_cuda_stg_fill(&g, b, &off, &i, n)) {
            /* slot full (or batch done): post it, move on */
            status = kvf_cuda_stg_rotate(&g);
        }
    }
    status = kvf_cuda_stg_finish(&g, status);
    return status != KVF_OK ? status : first;
}
