/*
 * mem/cuda: the resident copy kernel, a copy kernel that stays on the
 * GPU between batches so that a batch costs no kernel launch.
 *
 * A launch of the warp kernel costs the host call, the GPU's start of
 * the grid and an event behind it, more than the copy engine's fixed
 * cost; this kernel removes most of it (docs/decisions/mem-gpu-copy.md).
 * Here the host writes the job (block list address, sides, n) into a
 * pinned control block and rings by storing the job word; CTA 0 of the
 * resident grid polls that word over PCIe, hands the job to the other
 * CTAs through device memory, every CTA moves its share with the warp
 * kernel's code (same bounds checks), and the last CTA stores the job's
 * number into the control block, which the host polls.
 *
 * Bounded everywhere: the grid is launched cooperatively (all CTAs
 * resident, no CTA waits for one that cannot start), leaves after
 * cuda_resident_idle_us without a job (its CTAs hold a share of every
 * SM meanwhile: cuda_resident_ctas per SM, 2 of the 3 an SM fits) or
 * when the host sets the stop bit; the host waits for a start at most
 * 2 ms (else the batch takes the launch path), relaunches an
 * instance that left while a job was rung, and gives up at the
 * caller's deadline (then the stop bit is set and the context goes back
 * to launches for good). One thread per copy context, as for the rest.
 */
#include "mem/cuda/kern.h"
#include "core/alloc.h"
#include "core/config.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define KVF_RES_PAUSE() __builtin_ia32_pause()
#else
#define KVF_RES_PAUSE() ((void)0)
#endif

extern const kvf_config_table_t kvf_cuda_config;

struct kvf_cuda_res {
    kvf_cuda_res_host_t *h;     /* pinned, mapped: host address */
    kvf_cuda_res_host_t *h_dev; /* the same, device address */
    kvf_cuda_res_dev_t *dv;
    cudaStream_t stream;
    cudaEvent_t ev; /* behind the last launch: complete once it left */
    unsigned seq;   /* last job rung (and done) */
    unsigned epoch; /* of the last launch */
    unsigned grid;
    int running; /* launched, not seen to leave */
    int broken;  /* a wait timed out: launches only from now on */
    int have_params;
    uint64_t blks, sb, sl, db, dl; /* the addresses last handed out */
    uint64_t jobs, launches, fallbacks;
};

int kvf_cuda_res_mode(void)
{
    const char *m;

    kvf_cuda_device_count();
    m = kvf_config_str(&kvf_cuda_config, "cuda_resident");
    if (m == NULL || strcmp(m, "off") == 0) {
        return KVF_RES_OFF;
    }
    if (strcmp(m, "on") == 0) {
        return KVF_RES_ON;
    }
    if (strcmp(m, "p2p") == 0) {
        return KVF_RES_P2P;
    }
    kvf_log_rl(KVF_LOG_WARN, "cuda_resident: unknown value '%s', using p2p", m);
    return KVF_RES_P2P;
}

static uint64_t kvf_cuda_res_idle_ns(void)
{
    uint64_t us = 2000;

    kvf_config_u64(&kvf_cuda_config, "cuda_resident_idle_us", &us);
    if (us < 50) {
        us = 50;
    }
    if (us > 1000000) {
        us = 1000000; /* a second at most */
    }
    return us * 1000;
}

static kvf_status_t kvf_cuda_res_init(kvf_cuda_copy_t *cp)
{
    struct kvf_cuda_res *r;
    kvf_status_t status;
    uint64_t ctas = 2;
    int coop = 0, fit;

    if (cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch,
                               cp->device) != cudaSuccess ||
        !coop) {
        cudaGetLastError();
        return KVF_ERR_UNSUPPORTED;
    }
    fit = kvf_cuda_kern_res_fit();
    kvf_config_u64(&kvf_cuda_config, "cuda_resident_ctas", &ctas);
    if (ctas < 1) {
        ctas = 1;
    }
    if (fit <= 0) {
        return KVF_ERR_UNSUPPORTED;
    }
    if (ctas > (uint64_t)fit) {
        ctas = (uint64_t)fit;
    }
    r = kvf_calloc(1, sizeof(*r));
    if (r == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    r->grid = (unsigned)ctas * (unsigned)cp->sm_count;
    status = KVF_CUDA_CHECK(
        cudaHostAlloc((void **)&r->h, sizeof(*r->h),
                      cudaHostAllocPortable | cudaHostAllocMapped));
    if (status == KVF_OK) {
        memset(r->h, 0, sizeof(*r->h));
        status = KVF_CUDA_CHECK(
            cudaHostGetDevicePointer((void **)&r->h_dev, r->h, 0));
    }
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(cudaMalloc((void **)&r->dv, sizeof(*r->dv)));
    }
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(cudaMemset(r->dv, 0, sizeof(*r->dv)));
    }
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(
            cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking));
    }
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(
            cudaEventCreateWithFlags(&r->ev, cudaEventDisableTiming));
    }
    cp->res = r;
    if (status != KVF_OK) {
        r->broken = 1;
    }
    return status;
}

/* Starts an instance; waits (at most 2 ms) until its CTA 0 runs. */
static kvf_status_t kvf_cuda_res_start(kvf_cuda_copy_t *cp,
                                       struct kvf_cuda_res *r)
{
    uint64_t until;
    kvf_status_t status;
    unsigned spins = 0;

    r->epoch++;
    /* the new instance takes the job word if its number is not done */
    status = KVF_CUDA_CHECK((cudaError_t)kvf_cuda_kern_res_launch(
        r->h_dev, r->dv, cp->err,
        __atomic_load_n(&r->h->done, __ATOMIC_ACQUIRE), r->epoch,
        kvf_cuda_res_idle_ns(), r->grid, r->stream));
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(cudaEventRecord(r->ev, r->stream));
    }
    if (status != KVF_OK) {
        r->broken = 1;
        return KVF_ERR_UNSUPPORTED;
    }
    r->running = 1;
    r->launches++;
    until = kvf_time_ms() + 2;
    while (__atomic_load_n(&r->h->alive, __ATOMIC_ACQUIRE) != r->epoch) {
        if ((++spins & 1023) == 0 && kvf_time_ms() > until) {
            /* not started (the SMs are taken): this batch is launched;
             * the instance idles out once it runs */
            return KVF_ERR_UNSUPPORTED;
        }
        KVF_RES_PAUSE();
    }
    return KVF_OK;
}

static int kvf_cuda_res_left(const struct kvf_cuda_res *r)
{
    return __atomic_load_n(&r->h->exited, __ATOMIC_ACQUIRE) == r->epoch;
}

/* The context's resident kernel, running and taking jobs; any other
 * answer: this batch takes the launch path. */
static kvf_status_t kvf_cuda_res_ready(kvf_cuda_copy_t *cp,
                                       struct kvf_cuda_res **r_p)
{
    struct kvf_cuda_res *r = cp->res;
    kvf_status_t status;

    if (r == NULL) {
        if (kvf_cuda_res_init(cp) != KVF_OK) {
            kvf_log_rl(KVF_LOG_WARN,
                       "GPU %d: no resident copy kernel, "
                       "launching per batch",
                       cp->device);
        }
        r = cp->res;
        if (r == NULL) {
            return KVF_ERR_UNSUPPORTED;
        }
    }
    if (r->broken) {
        r->fallbacks++;
        return KVF_ERR_UNSUPPORTED;
    }
    if (!r->running || kvf_cuda_res_left(r) ||
        __atomic_load_n(&r->h->alive, __ATOMIC_ACQUIRE) != r->epoch) {
        if (r->running && !kvf_cuda_res_left(r)) {
            /* launched earlier, still not running (the SMs are taken):
             * no second wait, it takes jobs once it runs */
            r->fallbacks++;
            return KVF_ERR_UNSUPPORTED;
        }
        status = kvf_cuda_res_start(cp, r);
        if (status != KVF_OK) {
            r->fallbacks++;
            return status;
        }
    }
    *r_p = r;
    return KVF_OK;
}

/* Writes the job (and the addresses when they changed) and rings it;
 * returns the job word. */
static uint64_t kvf_cuda_res_ring(struct kvf_cuda_res *r,
                                  const kvf_cuda_launch_t *l,
                                  const kvf_cuda_blk_t *dev, size_t n)
{
    uint64_t word, fresh;
    unsigned pshift;

    fresh = !r->have_params || r->blks != (uint64_t)(uintptr_t)dev ||
            r->sb != l->src_base || r->sl != l->src_len ||
            r->db != l->dst_base || r->dl != l->dst_len;
    if (fresh) {
        r->h->blks = r->blks = (uint64_t)(uintptr_t)dev;
        r->h->src_base = r->sb = l->src_base;
        r->h->src_len = r->sl = l->src_len;
        r->h->dst_base = r->db = l->dst_base;
        r->h->dst_len = r->dl = l->dst_len;
        r->have_params = 1;
    }
    pshift = kvf_cuda_kern_pshift(n, r->grid * 8u);
    r->seq++;
    word = (uint64_t)r->seq | ((uint64_t)n << KVF_RES_N_SHIFT) |
           ((uint64_t)pshift << KVF_RES_P_SHIFT) | (fresh << KVF_RES_FRESH_BIT);
    /* the addresses above are visible before the job word (release) */
    __atomic_store_n(&r->h->job, word, __ATOMIC_RELEASE);
    return word;
}

/* Spins until the job is done, restarting an instance that left just as
 * it was rung; 1 when done by the deadline. */
static int kvf_cuda_res_wait(kvf_cuda_copy_t *cp, struct kvf_cuda_res *r,
                             uint64_t deadline)
{
    unsigned spins = 0, restarts = 0;

    while (__atomic_load_n(&r->h->done, __ATOMIC_ACQUIRE) != r->seq) {
        if ((++spins & 255) != 0) {
            KVF_RES_PAUSE();
            continue;
        }
        if (kvf_cuda_res_left(r) &&
            __atomic_load_n(&r->h->done, __ATOMIC_ACQUIRE) != r->seq) {
            /* it left (idle) just as the job was rung: a new instance
             * finds the job word unanswered and runs it (once it runs:
             * keep waiting even if it has not started yet) */
            if (++restarts > 2) {
                break;
            }
            kvf_cuda_res_start(cp, r);
            if (r->broken) {
                break;
            }
            continue;
        }
        if (kvf_time_ms() >= deadline) {
            break;
        }
    }
    return __atomic_load_n(&r->h->done, __ATOMIC_ACQUIRE) == r->seq;
}

kvf_status_t kvf_cuda_res_copy(kvf_cuda_copy_t *cp, const kvf_cuda_launch_t *l,
                               const kvf_cuda_blk_t *dev, size_t n,
                               uint64_t deadline)
{
    struct kvf_cuda_res *r;
    kvf_status_t status;
    uint64_t word;

    if (n == 0 || n > KVF_RES_N_MAX) {
        return KVF_ERR_UNSUPPORTED;
    }
    status = kvf_cuda_res_ready(cp, &r);
    if (status != KVF_OK) {
        return status;
    }
    word = kvf_cuda_res_ring(r, l, dev, n);
    if (kvf_cuda_res_wait(cp, r, deadline)) {
        r->jobs++;
        return KVF_OK;
    }
    kvf_log_rl(KVF_LOG_ERROR,
               "GPU %d: resident copy kernel did not finish "
               "job %u in time; launching per batch from now on",
               cp->device, r->seq);
    __atomic_store_n(&r->h->job, word | (1ull << KVF_RES_STOP_BIT),
                     __ATOMIC_RELEASE);
    r->broken = 1;
    return KVF_ERR_TIMEOUT;
}

void kvf_cuda_copy_park(kvf_cuda_copy_t *cp)
{
    struct kvf_cuda_res *r;
    uint64_t w;

    if (cp == NULL || cp->res == NULL || !cp->res->running) {
        return;
    }
    r = cp->res;
    cudaSetDevice(cp->device);
    w = __atomic_load_n(&r->h->job, __ATOMIC_RELAXED);
    __atomic_store_n(&r->h->job, w | (1ull << KVF_RES_STOP_BIT),
                     __ATOMIC_RELEASE);
    /* an instance that has not started yet reads the stop bit first */
    if (kvf_cuda_event_wait(r->ev, kvf_time_ms() + 2000) != KVF_OK) {
        r->broken = 1;
        return; /* the stop bit stays: it leaves when it runs */
    }
    __atomic_store_n(&r->h->job, w & ~(1ull << KVF_RES_STOP_BIT),
                     __ATOMIC_RELEASE);
    r->running = 0;
}

void kvf_cuda_res_free(kvf_cuda_copy_t *cp)
{
    struct kvf_cuda_res *r = cp->res;

    if (r == NULL) {
        return;
    }
    kvf_cuda_copy_park(cp);
    if (r->stream != NULL) {
        cudaStreamDestroy(r->stream);
    }
    if (r->ev != NULL) {
        cudaEventDestroy(r->ev);
    }
    if (r->dv != NULL) {
        cudaFree(r->dv);
    }
    if (r->h != NULL) {
        cudaFreeHost(r->h);
    }
    cudaGetLastError();
    kvf_free(r);
    cp->res = NULL;
}

void kvf_cuda_copy_res_stats(const kvf_cuda_copy_t *cp, uint64_t *jobs,
                             uint64_t *launches, uint64_t *fallbacks)
{
    const struct kvf_cuda_res *r = cp != NULL ? cp->res : NULL;

    *jobs = r != NULL ? r->jobs : 0;
    *launches = r != NULL ? r->launches : 0;
    *fallbacks = r != NULL ? r->fallbacks : 0;
}

const char *kvf_cuda_resident_name(void)
{
    static const char *names[] = {"off", "on", "p2p"};

    return names[kvf_cuda_res_mode()];
}
