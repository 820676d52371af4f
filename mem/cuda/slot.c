/*
 * cuda module: pinned staging slots and the copies that go through them.
 * A slot is a pinned, mapped buffer with its descriptor array; its copy
 * launch signals completion through a mapped host word. Socket I/O of GPU
 * memory (stage.c) and the pageable-host paths of
 * kvf_cuda_copy_blocks (here) use them: host->GPU, the CPU gathers blocks
 * into a slot while the GPU scatters the previous one; GPU->host, the GPU
 * gathers into a slot while the CPU scatters the previous one.
 */
#include "mem/cuda/cuda_int.h"
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
    int to_gpu = (src->type == KVF_MEM_HOST);
    const kvf_cuda_mem_t *host = to_gpu ? src : dst;
    const kvf_cuda_mem_t *gpu = to_gpu ? dst : src;
    uint64_t gbase = (uint64_t)(uintptr_t)gpu->base;
    kvf_status_t status, first = KVF_OK;
    int k = 0, prev = -1, j;
    uint64_t off = 0;
    size_t i = 0;

    status = kvf_cuda_stage_ready(cp);
    if (status != KVF_OK) {
        return status;
    }
    *(volatile unsigned *)cp->err = 0;
    for (j = 0; j < KVF_COPY_STAGE_SLOTS && status == KVF_OK; j++) {
        status = kvf_cuda_slot_wait(&cp->slot[j], deadline);
        cp->slot[j].used = 0;
        cp->slot[j].nblks = 0;
    }
    while (status == KVF_OK && i < n) {
        kvf_cuda_slot_t *s = &cp->slot[k];
        const kvf_cuda_blk_t *b = &blks[i];
        uint64_t hoff = to_gpu ? b->src_off : b->dst_off;
        uint64_t goff = to_gpu ? b->dst_off : b->src_off;
        uint64_t piece;

        if (!kvf_cuda_blk_in(hoff, b->len, host->len) ||
            !kvf_cuda_blk_in(goff, b->len, gpu->len)) {
            first = KVF_ERR_OUT_OF_BOUNDS;
            i++;
            continue;
        }
        piece = b->len - off;
        if (piece > s->cap - s->used) {
            piece = s->cap - s->used;
        }
        if (piece > 0 && s->nblks < s->blks_cap) {
            kvf_cuda_blk_t *d = &s->blks[s->nblks];

            if (to_gpu) {
                memcpy(s->buf + s->used, (char *)host->base + hoff + off,
                       piece);
                d->src_off = s->used;
                d->dst_off = gbase + goff + off;
            } else {
                cp->slot_host[k][s->nblks] = hoff + off;
                d->src_off = gbase + goff + off;
                d->dst_off = s->used;
            }
            d->len = piece;
            s->nblks++;
            s->used += piece;
            off += piece;
            if (off == b->len) {
                off = 0;
                i++;
            }
            if (i < n && s->used < s->cap && s->nblks < s->blks_cap) {
                continue;
            }
        }
        /* slot full (or batch done): post it, move on */
        status = kvf_cuda_slot_post(s, cp->device, cp->stream, to_gpu, cp->err);
        if (status != KVF_OK) {
            break;
        }
        if (!to_gpu && prev >= 0) {
            status = kvf_cuda_slot_wait(&cp->slot[prev], deadline);
            if (status != KVF_OK) {
                break;
            }
            kvf_cuda_slot_scatter(cp, prev, dst);
        }
        prev = k;
        k = (k + 1) % KVF_COPY_STAGE_SLOTS;
        /* the next slot's earlier copy must be over before reuse; for
         * GPU->host it was scattered already */
        status = kvf_cuda_slot_wait(&cp->slot[k], deadline);
        cp->slot[k].used = 0;
        cp->slot[k].nblks = 0;
    }
    if (status == KVF_OK && cp->slot[k].nblks > 0) {
        status = kvf_cuda_slot_post(&cp->slot[k], cp->device, cp->stream,
                                    to_gpu, cp->err);
        if (status == KVF_OK && !to_gpu && prev >= 0) {
            status = kvf_cuda_slot_wait(&cp->slot[prev], deadline);
            if (status == KVF_OK) {
                kvf_cuda_slot_scatter(cp, prev, dst);
            }
        }
        prev = k;
    }
    if (status == KVF_OK && prev >= 0) {
        /* wait the last one (and, GPU->host, scatter it) */
        if (!to_gpu) {
            status = kvf_cuda_slot_wait(&cp->slot[prev], deadline);
            if (status == KVF_OK) {
                kvf_cuda_slot_scatter(cp, prev, dst);
            }
        }
    }
    for (j = 0; j < KVF_COPY_STAGE_SLOTS && status == KVF_OK; j++) {
        status = kvf_cuda_slot_wait(&cp->slot[j], deadline);
    }
    if (status == KVF_OK && *(volatile unsigned *)cp->err != 0) {
        status = KVF_ERR_OUT_OF_BOUNDS;
    }
    return status != KVF_OK ? status : first;
}
