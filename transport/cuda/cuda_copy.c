/*
 * cuda module: batched copies of scattered blocks.
 *
 * A copy context owns a GPU's two streams, two descriptor buffers
 * (pinned, mapped: the kernels read them in place) and, for pageable host
 * memory, pinned staging slots. kvf_cuda_copy_blocks cuts a batch into a
 * few launches: the first small (512 descriptors) so the GPU starts while
 * the host prepares the next, then x4 up to 32768; blocks over 64 KiB
 * are split so no warp is left with a giant block. Launches alternate
 * between the two streams (one's tail overlaps the next one's start)
 * and the host fills one descriptor buffer while the other is in use.
 *
 * Pageable host memory is staged: host->GPU, the CPU gathers blocks into
 * a pinned slot while the GPU scatters the previous slot; GPU->host, the
 * GPU gathers into a slot while the CPU scatters the previous one.
 *
 * Bounds: the kernels refuse blocks outside either side (counted in a
 * mapped word read after the batch); the staging code checks the host
 * side itself.
 */
#include "transport/cuda/cuda_int.h"
#include "core/alloc.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>

#define KVF_COPY_STAGE_SLOTS 3
#define KVF_COPY_STAGE_BYTES (8u << 20)
#define KVF_COPY_STAGE_BLKS  16384u
/* room for the pieces of one split block beyond the launch size */
#define KVF_COPY_DESC_CAP (KVF_CUDA_LAUNCH_MAX + 64)

typedef struct kvf_cuda_dbuf {
    kvf_cuda_blk_t *h; /* pinned, mapped: read by the kernels */
    cudaEvent_t ev;
    int busy;
} kvf_cuda_dbuf_t;

struct kvf_cuda_copy {
    int device;
    int sm_count;
    kvf_cuda_kernel_t kernel;
    cudaStream_t stream;
    cudaStream_t stream_b; /* every other launch of a batch */
    cudaEvent_t done;
    kvf_cuda_dbuf_t dbuf[2];
    unsigned *err; /* pinned, mapped */
    kvf_cuda_slot_t slot[KVF_COPY_STAGE_SLOTS];
    uint64_t *slot_host[KVF_COPY_STAGE_SLOTS]; /* D2H: host offsets */
    int staged;
    /* copy-engine batches (hybrid variant, batch API baseline) */
    cudaStream_t ce_stream;
    cudaEvent_t ce_done;
    void **ce_dst;
    const void **ce_src;
    size_t *ce_len;
    size_t ce_cap;
};

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

/* ---- contexts --------------------------------------------------------- */

kvf_status_t kvf_cuda_copy_create(int device, kvf_cuda_copy_t **cp_p)
{
    kvf_cuda_copy_t *cp;
    kvf_status_t status;
    int i;

    if (cp_p == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_cuda_use(device);
    if (status != KVF_OK) {
        return status;
    }
    cp = kvf_calloc(1, sizeof(*cp));
    if (cp == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    cp->device = device;
    cp->sm_count = kvf_cuda_devs[device].sm_count;
    cp->kernel = kvf_cuda_default_kernel();
    status = KVF_CUDA_CHECK(
        cudaStreamCreateWithFlags(&cp->stream, cudaStreamNonBlocking));
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(
            cudaStreamCreateWithFlags(&cp->stream_b, cudaStreamNonBlocking));
    }
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(
            cudaEventCreateWithFlags(&cp->done, cudaEventDisableTiming));
    }
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(
            cudaHostAlloc((void **)&cp->err, 64,
                          cudaHostAllocPortable | cudaHostAllocMapped));
    }
    for (i = 0; i < 2 && status == KVF_OK; i++) {
        kvf_cuda_dbuf_t *b = &cp->dbuf[i];
        size_t bytes = KVF_COPY_DESC_CAP * sizeof(kvf_cuda_blk_t);

        status = KVF_CUDA_CHECK(
            cudaHostAlloc((void **)&b->h, bytes,
                          cudaHostAllocPortable | cudaHostAllocMapped));
        if (status == KVF_OK) {
            status = KVF_CUDA_CHECK(
                cudaEventCreateWithFlags(&b->ev, cudaEventDisableTiming));
        }
    }
    if (status != KVF_OK) {
        kvf_cuda_copy_destroy(cp);
        return status;
    }
    *cp_p = cp;
    return KVF_OK;
}

void kvf_cuda_copy_destroy(kvf_cuda_copy_t *cp)
{
    int i;

    if (cp == NULL) {
        return;
    }
    cudaSetDevice(cp->device);
    if (cp->stream != NULL) {
        /* bounded: a copy never outlives its own deadline by much */
        if (cp->done != NULL &&
            cudaEventRecord(cp->done, cp->stream) == cudaSuccess) {
            kvf_cuda_event_wait(cp->done, kvf_time_ms() + 10000);
        }
        cudaStreamDestroy(cp->stream);
    }
    for (i = 0; i < 2; i++) {
        if (cp->dbuf[i].ev != NULL && cp->dbuf[i].busy) {
            kvf_cuda_event_wait(cp->dbuf[i].ev, kvf_time_ms() + 10000);
        }
    }
    if (cp->stream_b != NULL) {
        cudaStreamDestroy(cp->stream_b);
    }
    if (cp->done != NULL) {
        cudaEventDestroy(cp->done);
    }
    for (i = 0; i < 2; i++) {
        if (cp->dbuf[i].h != NULL) {
            cudaFreeHost(cp->dbuf[i].h);
        }
        if (cp->dbuf[i].ev != NULL) {
            cudaEventDestroy(cp->dbuf[i].ev);
        }
    }
    for (i = 0; i < KVF_COPY_STAGE_SLOTS; i++) {
        kvf_cuda_slot_fini(&cp->slot[i]);
        kvf_free(cp->slot_host[i]);
    }
    if (cp->ce_stream != NULL) {
        if (cp->ce_done != NULL &&
            cudaEventRecord(cp->ce_done, cp->ce_stream) == cudaSuccess) {
            kvf_cuda_event_wait(cp->ce_done, kvf_time_ms() + 10000);
        }
        cudaStreamDestroy(cp->ce_stream);
    }
    if (cp->ce_done != NULL) {
        cudaEventDestroy(cp->ce_done);
    }
    kvf_free(cp->ce_dst);
    kvf_free(cp->ce_src);
    kvf_free(cp->ce_len);
    if (cp->err != NULL) {
        cudaFreeHost(cp->err);
    }
    cudaGetLastError();
    kvf_free(cp);
}

void kvf_cuda_copy_set_kernel(kvf_cuda_copy_t *cp, kvf_cuda_kernel_t k)
{
    cp->kernel = k;
}

/* The kernel for a path when configuration says auto. */
static kvf_cuda_kernel_t kvf_cuda_pick(kvf_cuda_copy_t *cp,
                                       const kvf_cuda_mem_t *src,
                                       const kvf_cuda_mem_t *dst)
{
    if (cp->kernel != KVF_CUDA_KERNEL_AUTO) {
        return cp->kernel;
    }
    /* measured on H200 (docs/gpu.md): GPU -> pinned host writes go
     * faster through the bulk copy engine; everything else with warps */
    if (src->type == KVF_MEM_CUDA && dst->type == KVF_MEM_PINNED) {
        return KVF_CUDA_KERNEL_BULK;
    }
    return KVF_CUDA_KERNEL_WARP;
}

/* Is mem usable by kernels of the context's GPU? */
static kvf_status_t kvf_cuda_reach(kvf_cuda_copy_t *cp, const kvf_cuda_mem_t *m)
{
    if (m->base == NULL && m->len > 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    switch (m->type) {
    case KVF_MEM_HOST:
    case KVF_MEM_PINNED:
        return KVF_OK;
    case KVF_MEM_CUDA:
        if (m->device < 0 || m->device >= kvf_cuda_device_count()) {
            return KVF_ERR_INVALID_PARAM;
        }
        if (m->device != cp->device &&
            !kvf_cuda_peer_enable(cp->device, m->device)) {
            kvf_error("GPU %d cannot reach GPU %d's memory", cp->device,
                      m->device);
            return KVF_ERR_UNSUPPORTED;
        }
        return KVF_OK;
    default:
        return KVF_ERR_INVALID_PARAM;
    }
}

static int kvf_blk_in(uint64_t off, uint64_t len, uint64_t side)
{
    return off <= side && len <= side - off;
}

/*
 * Posts blocks first, first+stride, ... as one cudaMemcpyBatchAsync on
 * the copy-engine stream (created on first use) and records ce_done.
 * Out-of-bounds blocks are left out and make it return
 * KVF_ERR_OUT_OF_BOUNDS after posting the others.
 */
static kvf_status_t kvf_cuda_ce_post(kvf_cuda_copy_t *cp,
                                     const kvf_cuda_mem_t *src,
                                     const kvf_cuda_mem_t *dst,
                                     const kvf_cuda_blk_t *blks, size_t n,
                                     size_t first, size_t stride)
{
    struct cudaMemcpyAttributes attr;
    kvf_status_t status = KVF_OK, oob = KVF_OK;
    size_t i, m = 0, attr_idx = 0, need = n / stride + 2;

    if (cp->ce_stream == NULL) {
        status = KVF_CUDA_CHECK(
            cudaStreamCreateWithFlags(&cp->ce_stream, cudaStreamNonBlocking));
        if (status == KVF_OK) {
            status = KVF_CUDA_CHECK(
                cudaEventCreateWithFlags(&cp->ce_done, cudaEventDisableTiming));
        }
        if (status != KVF_OK) {
            return status;
        }
    }
    if (need > cp->ce_cap) {
        kvf_free(cp->ce_dst);
        kvf_free(cp->ce_src);
        kvf_free(cp->ce_len);
        cp->ce_dst = kvf_malloc(need * sizeof(*cp->ce_dst));
        cp->ce_src = kvf_malloc(need * sizeof(*cp->ce_src));
        cp->ce_len = kvf_malloc(need * sizeof(*cp->ce_len));
        cp->ce_cap = need;
        if (cp->ce_dst == NULL || cp->ce_src == NULL || cp->ce_len == NULL) {
            cp->ce_cap = 0;
            return KVF_ERR_NO_MEMORY;
        }
    }
    for (i = first; i < n; i += stride) {
        if (!kvf_blk_in(blks[i].src_off, blks[i].len, src->len) ||
            !kvf_blk_in(blks[i].dst_off, blks[i].len, dst->len)) {
            oob = KVF_ERR_OUT_OF_BOUNDS;
            continue;
        }
        if (blks[i].len == 0) {
            continue;
        }
        cp->ce_dst[m] = (char *)dst->base + blks[i].dst_off;
        cp->ce_src[m] = (const char *)src->base + blks[i].src_off;
        cp->ce_len[m] = blks[i].len;
        m++;
    }
    memset(&attr, 0, sizeof(attr));
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    if (m > 0) {
        status = KVF_CUDA_CHECK(
            cudaMemcpyBatchAsync(cp->ce_dst, cp->ce_src, cp->ce_len, m, &attr,
                                 &attr_idx, 1, cp->ce_stream));
    }
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(cudaEventRecord(cp->ce_done, cp->ce_stream));
    }
    return status != KVF_OK ? status : oob;
}

/* The batch's own descriptor array is device-accessible: launches of up
 * to KVF_CUDA_LAUNCH_MAX descriptors straight from it, alternating
 * streams. Blocks are not split (a large one just keeps its warp longer). */
static kvf_status_t kvf_cuda_copy_inplace(kvf_cuda_copy_t *cp,
                                          kvf_cuda_kernel_t kern,
                                          kvf_cuda_launch_t *l,
                                          const void *dev_blks, size_t n,
                                          uint64_t deadline)
{
    const kvf_cuda_blk_t *d = dev_blks;
    kvf_status_t status = KVF_OK;
    size_t i, m;
    unsigned k;

    for (i = 0, k = 0; i < n && status == KVF_OK; i += m, k++) {
        kvf_cuda_dbuf_t *b = &cp->dbuf[k & 1];
        cudaStream_t stream = (k & 1) ? cp->stream_b : cp->stream;

        m = n - i < KVF_CUDA_LAUNCH_MAX ? n - i : KVF_CUDA_LAUNCH_MAX;
        l->blks = d + i;
        l->n = (unsigned)m;
        status = KVF_CUDA_CHECK(
            (cudaError_t)kvf_cuda_kern_launch(kern, l, cp->sm_count, stream));
        if (status == KVF_OK) {
            status = KVF_CUDA_CHECK(cudaEventRecord(b->ev, stream));
        }
        if (status == KVF_OK) {
            b->busy = 1;
        }
    }
    for (k = 0; k < 2 && status == KVF_OK; k++) {
        if (cp->dbuf[k].busy) {
            status = kvf_cuda_event_wait(cp->dbuf[k].ev, deadline);
        }
    }
    if (status == KVF_OK) {
        cp->dbuf[0].busy = cp->dbuf[1].busy = 0;
        if (*(volatile unsigned *)cp->err != 0) {
            kvf_log_rl(KVF_LOG_ERROR, "block(s) outside their memory "
                                      "refused");
            status = KVF_ERR_OUT_OF_BOUNDS;
        }
    }
    return status;
}

/* Both sides device-accessible: descriptor buffers, a few launches. */
static kvf_status_t kvf_cuda_copy_direct(kvf_cuda_copy_t *cp,
                                         const kvf_cuda_mem_t *src,
                                         const kvf_cuda_mem_t *dst,
                                         const kvf_cuda_blk_t *blks, size_t n,
                                         uint64_t deadline)
{
    kvf_cuda_kernel_t kern = kvf_cuda_pick(cp, src, dst);
    unsigned chunk = KVF_CUDA_LAUNCH_MIN, m, k = 0;
    kvf_status_t status = KVF_OK, ce = KVF_OK;
    size_t stride = 0;
    uint64_t piece_off = 0;
    kvf_cuda_launch_t l;
    size_t i = 0;

    *(volatile unsigned *)cp->err = 0;
    memset(&l, 0, sizeof(l));
    l.src_base = (uint64_t)(uintptr_t)src->base;
    l.src_len = src->len;
    l.dst_base = (uint64_t)(uintptr_t)dst->base;
    l.dst_len = dst->len;
    l.err = cp->err;
    if (kern != KVF_CUDA_KERNEL_HYBRID) {
        struct cudaPointerAttributes a;

        /* descriptors already in pinned memory are read in place: no host
         * work per block, the whole batch launched at once */
        if (cudaPointerGetAttributes(&a, blks) == cudaSuccess &&
            a.type == cudaMemoryTypeHost && a.devicePointer != NULL) {
            return kvf_cuda_copy_inplace(cp, kern, &l, a.devicePointer, n,
                                         deadline);
        }
        cudaGetLastError();
    }
    if (kern == KVF_CUDA_KERNEL_HYBRID) {
        /* the copy engines take every 4th block, the kernel the rest */
        stride = 4;
        kern = KVF_CUDA_KERNEL_WARP;
        ce = kvf_cuda_ce_post(cp, src, dst, blks, n, 0, stride);
        if (ce != KVF_OK && ce != KVF_ERR_OUT_OF_BOUNDS) {
            return ce;
        }
    }
    while (i < n && status == KVF_OK) {
        kvf_cuda_dbuf_t *b = &cp->dbuf[k & 1];
        cudaStream_t stream = (k & 1) ? cp->stream_b : cp->stream;

        if (b->busy) {
            status = kvf_cuda_event_wait(b->ev, deadline);
            if (status != KVF_OK) {
                break;
            }
            b->busy = 0;
        }
        m = 0;
        while (i < n && m < chunk) {
            const kvf_cuda_blk_t *s = &blks[i];

            if (stride && i % stride == 0) {
                i++; /* on the copy engines */
                continue;
            }
            if (s->len <= KVF_CUDA_SPLIT ||
                !kvf_blk_in(s->src_off, s->len, src->len) ||
                !kvf_blk_in(s->dst_off, s->len, dst->len)) {
                b->h[m++] = *s; /* the kernel refuses it if out of bounds */
                i++;
                continue;
            }
            /* split a large block; it may continue in the next launch */
            while (piece_off < s->len && m < KVF_COPY_DESC_CAP) {
                uint64_t left = s->len - piece_off;

                b->h[m].src_off = s->src_off + piece_off;
                b->h[m].dst_off = s->dst_off + piece_off;
                b->h[m].len = left < KVF_CUDA_SPLIT ? left : KVF_CUDA_SPLIT;
                piece_off += b->h[m].len;
                m++;
            }
            if (piece_off < s->len) {
                break;
            }
            piece_off = 0;
            i++;
        }
        /* the kernel reads the descriptors through the host mapping: no
         * upload between launches, and each warp prefetches its next */
        l.blks = b->h;
        l.n = m;
        status = KVF_CUDA_CHECK(
            (cudaError_t)kvf_cuda_kern_launch(kern, &l, cp->sm_count, stream));
        if (status == KVF_OK) {
            status = KVF_CUDA_CHECK(cudaEventRecord(b->ev, stream));
        }
        if (status == KVF_OK) {
            b->busy = 1;
        }
        k++;
        chunk =
            chunk * 4 < KVF_CUDA_LAUNCH_MAX ? chunk * 4 : KVF_CUDA_LAUNCH_MAX;
    }
    /* launches alternate between two streams so that one's tail overlaps
     * the next one's start; the batch is done when both are */
    for (k = 0; k < 2 && status == KVF_OK; k++) {
        if (cp->dbuf[k].busy) {
            status = kvf_cuda_event_wait(cp->dbuf[k].ev, deadline);
        }
    }
    if (stride) {
        kvf_status_t w = kvf_cuda_event_wait(cp->ce_done, deadline);

        if (status == KVF_OK) {
            status = (w != KVF_OK) ? w : ce;
        }
    }
    if (status == KVF_OK) {
        cp->dbuf[0].busy = cp->dbuf[1].busy = 0;
        if (*(volatile unsigned *)cp->err != 0) {
            kvf_log_rl(KVF_LOG_ERROR, "block(s) outside their memory "
                                      "refused");
            status = KVF_ERR_OUT_OF_BOUNDS;
        }
    }
    return status;
}

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
static kvf_status_t kvf_cuda_copy_staged(kvf_cuda_copy_t *cp,
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

        if (!kvf_blk_in(hoff, b->len, host->len) ||
            !kvf_blk_in(goff, b->len, gpu->len)) {
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

kvf_status_t kvf_cuda_copy_blocks(kvf_cuda_copy_t *cp,
                                  const kvf_cuda_mem_t *src,
                                  const kvf_cuda_mem_t *dst,
                                  const kvf_cuda_blk_t *blks, size_t n,
                                  int timeout_ms)
{
    uint64_t deadline =
        kvf_time_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    kvf_status_t status, first = KVF_OK;
    size_t i;

    if (cp == NULL || src == NULL || dst == NULL || (n > 0 && blks == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_cuda_reach(cp, src);
    if (status == KVF_OK) {
        status = kvf_cuda_reach(cp, dst);
    }
    if (status != KVF_OK || n == 0) {
        return status;
    }
    if (src->type == KVF_MEM_HOST && dst->type == KVF_MEM_HOST) {
        for (i = 0; i < n; i++) {
            if (!kvf_blk_in(blks[i].src_off, blks[i].len, src->len) ||
                !kvf_blk_in(blks[i].dst_off, blks[i].len, dst->len)) {
                first = KVF_ERR_OUT_OF_BOUNDS;
                continue;
            }
            memcpy((char *)dst->base + blks[i].dst_off,
                   (const char *)src->base + blks[i].src_off, blks[i].len);
        }
        return first;
    }
    status = KVF_CUDA_CHECK(cudaSetDevice(cp->device));
    if (status != KVF_OK) {
        return status;
    }
    if (src->type == KVF_MEM_HOST || dst->type == KVF_MEM_HOST) {
        return kvf_cuda_copy_staged(cp, src, dst, blks, n, deadline);
    }
    return kvf_cuda_copy_direct(cp, src, dst, blks, n, deadline);
}

kvf_status_t kvf_cuda_copy_contig(kvf_cuda_copy_t *cp,
                                  const kvf_cuda_mem_t *src, uint64_t src_off,
                                  const kvf_cuda_mem_t *dst, uint64_t dst_off,
                                  uint64_t len, int timeout_ms)
{
    const char *s;
    char *d;
    kvf_status_t status;

    if (cp == NULL || src == NULL || dst == NULL ||
        !kvf_blk_in(src_off, len, src->len) ||
        !kvf_blk_in(dst_off, len, dst->len)) {
        return KVF_ERR_INVALID_PARAM;
    }
    s = (const char *)src->base + src_off;
    d = (char *)dst->base + dst_off;
    status = KVF_CUDA_CHECK(cudaSetDevice(cp->device));
    if (status != KVF_OK) {
        return status;
    }
    if (src->type == KVF_MEM_CUDA && dst->type == KVF_MEM_CUDA &&
        src->device != dst->device) {
        kvf_cuda_peer_enable(src->device, dst->device);
        kvf_cuda_peer_enable(dst->device, src->device);
        cudaSetDevice(cp->device);
        status = KVF_CUDA_CHECK(cudaMemcpyPeerAsync(
            d, dst->device, s, src->device, len, cp->stream));
    } else {
        status = KVF_CUDA_CHECK(
            cudaMemcpyAsync(d, s, len, cudaMemcpyDefault, cp->stream));
    }
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(cudaEventRecord(cp->done, cp->stream));
    }
    if (status == KVF_OK) {
        status =
            kvf_cuda_event_wait(cp->done, kvf_time_ms() + (uint64_t)timeout_ms);
    }
    return status;
}

kvf_status_t kvf_cuda_copy_each(kvf_cuda_copy_t *cp, const kvf_cuda_mem_t *src,
                                const kvf_cuda_mem_t *dst,
                                const kvf_cuda_blk_t *blks, size_t n,
                                int timeout_ms)
{
    kvf_status_t status;
    size_t i;

    if (cp == NULL || src == NULL || dst == NULL || (n > 0 && blks == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = KVF_CUDA_CHECK(cudaSetDevice(cp->device));
    for (i = 0; i < n && status == KVF_OK; i++) {
        if (!kvf_blk_in(blks[i].src_off, blks[i].len, src->len) ||
            !kvf_blk_in(blks[i].dst_off, blks[i].len, dst->len)) {
            return KVF_ERR_OUT_OF_BOUNDS;
        }
        status = KVF_CUDA_CHECK(
            cudaMemcpyAsync((char *)dst->base + blks[i].dst_off,
                            (const char *)src->base + blks[i].src_off,
                            blks[i].len, cudaMemcpyDefault, cp->stream));
    }
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(cudaEventRecord(cp->done, cp->stream));
    }
    if (status == KVF_OK) {
        status =
            kvf_cuda_event_wait(cp->done, kvf_time_ms() + (uint64_t)timeout_ms);
    }
    return status;
}

kvf_status_t kvf_cuda_copy_batchapi(kvf_cuda_copy_t *cp,
                                    const kvf_cuda_mem_t *src,
                                    const kvf_cuda_mem_t *dst,
                                    const kvf_cuda_blk_t *blks, size_t n,
                                    int timeout_ms)
{
    kvf_status_t status, w;

    if (cp == NULL || src == NULL || dst == NULL || (n > 0 && blks == NULL)) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = KVF_CUDA_CHECK(cudaSetDevice(cp->device));
    if (status == KVF_OK) {
        status = kvf_cuda_ce_post(cp, src, dst, blks, n, 0, 1);
    }
    if (cp->ce_done != NULL && status != KVF_ERR_NO_MEMORY) {
        w = kvf_cuda_event_wait(cp->ce_done,
                                kvf_time_ms() + (uint64_t)timeout_ms);
        if (status == KVF_OK) {
            status = w;
        }
    }
    return status;
}

kvf_status_t kvf_cuda_checksum_blocks(kvf_cuda_copy_t *cp,
                                      const kvf_cuda_mem_t *mem,
                                      const uint64_t *offs,
                                      const uint64_t *lens, size_t n,
                                      uint64_t *sums, int timeout_ms)
{
    kvf_cuda_blk_t *blks = NULL;
    kvf_cuda_mem_t host;
    kvf_status_t status;
    uint64_t total = 0, at;
    char *buf = NULL;
    size_t i;

    if (cp == NULL || mem == NULL ||
        (n > 0 && (offs == NULL || lens == NULL || sums == NULL))) {
        return KVF_ERR_INVALID_PARAM;
    }
    for (i = 0; i < n; i++) {
        if (!kvf_blk_in(offs[i], lens[i], mem->len)) {
            return KVF_ERR_OUT_OF_BOUNDS;
        }
        total += lens[i];
    }
    if (mem->type != KVF_MEM_CUDA) {
        for (i = 0; i < n; i++) {
            sums[i] = kvf_hash64((const char *)mem->base + offs[i], lens[i], 0);
        }
        return KVF_OK;
    }
    blks = kvf_malloc((n + 1) * sizeof(*blks));
    buf = kvf_malloc(total + 1);
    if (blks == NULL || buf == NULL) {
        kvf_free(blks);
        kvf_free(buf);
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0, at = 0; i < n; i++) {
        blks[i].src_off = offs[i];
        blks[i].dst_off = at;
        blks[i].len = lens[i];
        at += lens[i];
    }
    host.base = buf;
    host.len = total;
    host.type = KVF_MEM_HOST;
    host.device = -1;
    status = kvf_cuda_copy_blocks(cp, mem, &host, blks, n, timeout_ms);
    for (i = 0; i < n && status == KVF_OK; i++) {
        sums[i] = kvf_hash64(buf + blks[i].dst_off, lens[i], 0);
    }
    kvf_free(blks);
    kvf_free(buf);
    return status;
}
