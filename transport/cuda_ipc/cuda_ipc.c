/*
 * cuda_ipc transport: the same-host GPU path. A peer on this host whose segment
 * descriptor carries CUDA IPC handles for its GPU regions is reached
 * through an ep that wraps the peer's ordinary ep (shm or tcp): segments
 * whose remote range lies in such a region, and whose local memory a GPU
 * can reach (device memory or pinned host memory), are moved by this
 * process's GPUs directly with the batched copy kernels (the peer's
 * allocation mapped with cudaIpcOpenMemHandle; over NVLink when the GPUs
 * differ), everything else goes to the wrapped ep. A request mixing both
 * kinds is split and completes when both parts have.
 *
 * One worker thread per ep turns requests into launches: descriptors go
 * into pinned, mapped slots the kernels read in place, one launch per
 * request (per GPU), up to KVF_IPC_SLOTS launches in flight; each launch
 * signals its own completion through a mapped host word (no CUDA call to
 * wait), and the worker completes requests in order.
 *
 * Bounds: a remote range must lie inside one region of the descriptor
 * (one that starts inside an exported region but runs past its end is
 * refused with KVF_ERR_OUT_OF_BOUNDS here); ranges in no exported region
 * go to the wrapped ep, whose target checks them. The peer's memory is
 * mapped once per process and handle (a table shared by every ep), on
 * the GPU that first needs it; kernels touching it run on that GPU.
 */
#include "transport/cuda_ipc/cuda_ipc.h"
#define KVF_MEM_GPU_KERNELS 1 /* copy kernels, slots, CUDA checks */
#include "mem/gpu.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/time.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define KVF_IPC_SLOTS     8
#define KVF_IPC_SLOT_BLKS 8192u

/* ---- process-wide table of opened handles ----------------------------- */

typedef struct kvf_ipc_map {
    unsigned char handle[KVF_CUDA_IPC_HANDLE];
    void *base; /* allocation start in this process */
    int device; /* opened on (kernels that touch it run there) */
    unsigned refs;
    struct kvf_ipc_map *next;
} kvf_ipc_map_t;

static pthread_mutex_t kvf_ipc_maps_lock = PTHREAD_MUTEX_INITIALIZER;
static kvf_ipc_map_t *kvf_ipc_maps;

static kvf_status_t kvf_ipc_map_get(const unsigned char *handle, int device,
                                    kvf_ipc_map_t **map_p)
{
    kvf_ipc_map_t *m;
    kvf_status_t status;

    pthread_mutex_lock(&kvf_ipc_maps_lock);
    for (m = kvf_ipc_maps; m != NULL; m = m->next) {
        if (memcmp(m->handle, handle, KVF_CUDA_IPC_HANDLE) == 0) {
            m->refs++;
            *map_p = m;
            pthread_mutex_unlock(&kvf_ipc_maps_lock);
            return KVF_OK;
        }
    }
    m = kvf_calloc(1, sizeof(*m));
    if (m == NULL) {
        pthread_mutex_unlock(&kvf_ipc_maps_lock);
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_cuda_ipc_open(handle, device, &m->base);
    if (status != KVF_OK) {
        pthread_mutex_unlock(&kvf_ipc_maps_lock);
        kvf_free(m);
        return status;
    }
    memcpy(m->handle, handle, KVF_CUDA_IPC_HANDLE);
    m->device = device;
    m->refs = 1;
    m->next = kvf_ipc_maps;
    kvf_ipc_maps = m;
    pthread_mutex_unlock(&kvf_ipc_maps_lock);
    *map_p = m;
    return KVF_OK;
}

static void kvf_ipc_map_put(kvf_ipc_map_t *map)
{
    kvf_ipc_map_t **pp;

    pthread_mutex_lock(&kvf_ipc_maps_lock);
    if (--map->refs > 0) {
        pthread_mutex_unlock(&kvf_ipc_maps_lock);
        return;
    }
    for (pp = &kvf_ipc_maps; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == map) {
            *pp = map->next;
            break;
        }
    }
    pthread_mutex_unlock(&kvf_ipc_maps_lock);
    kvf_cuda_ipc_close(map->device, map->base);
    kvf_free(map);
}

/* ---- the wrapping ep --------------------------------------------------- */

typedef struct kvf_ipc_region {
    kvf_cuda_remote_t r;
    kvf_ipc_map_t *map; /* NULL until first use (or same process) */
    char *local;        /* region start in this process, NULL unmapped */
    int exec_dev;       /* GPU that runs kernels touching it */
    kvf_status_t open_status;
} kvf_ipc_region_t;

/* A request the worker handles (its GPU part), and the forwarded part. */
typedef struct kvf_ipc_job {
    kvf_tl_req_t *parent;
    struct kvf_ipc_ep *ep;
    int parts;   /* outstanding parts (atomic) */
    size_t *gpu; /* parent indices of segments moved here */
    size_t ngpu;
    int *region;         /* their regions */
    int *ldev;           /* GPU of their local memory, -1 pinned host */
    unsigned launches;   /* launches not yet retired */
    kvf_tl_req_t inner;  /* segments forwarded to the wrapped ep */
    size_t *inner_idx;   /* parent index of each forwarded segment */
    kvf_tl_seg_t *isegs; /* forwarded segments */
    kvf_status_t *ist;
    struct kvf_ipc_job *next;
} kvf_ipc_job_t;

typedef struct kvf_ipc_slot {
    kvf_cuda_slot_t s;    /* blks, flag, counters; buf holds the err word */
    kvf_ipc_job_t **jobs; /* jobs with descriptors in this launch */
    unsigned njobs;
    int dev; /* GPU of the open (or launched) launch, -1 none */
    int busy;
    cudaStream_t stream[KVF_CUDA_DEV_MAX];
} kvf_ipc_slot_t;

typedef struct kvf_ipc_ep {
    const kvf_transport_ops_t *inner_ops;
    kvf_tl_ep_t *inner;
    int same_process;
    unsigned timeout_ms;
    kvf_ipc_region_t *regions; /* sorted by address */
    size_t nregions;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    kvf_ipc_job_t *head, *tail;
    int stop;
    pthread_t worker;
    int worker_started;
    kvf_ipc_slot_t slot[KVF_IPC_SLOTS];
    unsigned slot_next, slot_old; /* ring: next to fill, oldest busy */
    pthread_mutex_t open_lock;    /* region mappings */
} kvf_ipc_ep_t;

/* Region holding [addr, addr+len): its index, or -1 when addr lies in
 * none; -2 when it starts in one but runs past its end. */
static int kvf_ipc_find(const kvf_ipc_ep_t *ep, uint64_t addr, uint64_t len)
{
    size_t lo = 0, hi = ep->nregions, mid;
    const kvf_cuda_remote_t *r;

    while (lo < hi) {
        mid = lo + (hi - lo) / 2;
        if (ep->regions[mid].r.addr <= addr) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (lo == 0) {
        return -1;
    }
    r = &ep->regions[lo - 1].r;
    if (addr - r->addr >= r->len) {
        return -1;
    }
    if (len > r->len - (addr - r->addr)) {
        return -2;
    }
    return (int)(lo - 1);
}

/* Can a GPU kernel reach this local memory, and on which GPU does it
 * live (-1: pinned host)? */
static int kvf_ipc_local_ok(const void *local, uint64_t len, int *dev_p)
{
    uint64_t left = 0;
    kvf_mem_type_t t;

    t = kvf_cuda_region_lookup((uint64_t)(uintptr_t)local, dev_p, &left);
    if (t == KVF_MEM_HOST || left < len) {
        return 0;
    }
    if (t == KVF_MEM_PINNED) {
        *dev_p = -1;
    }
    return 1;
}

/* Maps region i (once) and gives its start in this process. */
static kvf_status_t kvf_ipc_region_open(kvf_ipc_ep_t *ep, size_t i, int want)
{
    kvf_ipc_region_t *g = &ep->regions[i];
    kvf_status_t status;
    int dev;

    if (__atomic_load_n(&g->local, __ATOMIC_ACQUIRE) != NULL) {
        return KVF_OK; /* mapped: exec_dev was set before local */
    }
    pthread_mutex_lock(&ep->open_lock);
    if (g->local != NULL || g->open_status != KVF_OK) {
        status = g->open_status;
        pthread_mutex_unlock(&ep->open_lock);
        return status;
    }
    dev = want;
    if (dev < 0 || dev >= kvf_cuda_device_count()) {
        dev = (g->r.device >= 0 && g->r.device < kvf_cuda_device_count())
                  ? g->r.device
                  : 0;
    }
    if (ep->same_process) {
        /* the peer's addresses are ours */
        g->exec_dev = dev;
        if (g->r.device >= 0 && g->r.device < kvf_cuda_device_count() &&
            dev != g->r.device && !kvf_cuda_peer_enable(dev, g->r.device)) {
            g->exec_dev = g->r.device;
        }
        __atomic_store_n(&g->local, (char *)(uintptr_t)g->r.addr,
                         __ATOMIC_RELEASE);
        status = KVF_OK;
    } else {
        status = kvf_ipc_map_get(g->r.handle, dev, &g->map);
        if (status == KVF_OK) {
            g->exec_dev = g->map->device;
            __atomic_store_n(&g->local, (char *)g->map->base + g->r.ipc_off,
                             __ATOMIC_RELEASE);
        } else {
            g->open_status = status;
            kvf_warn("cuda ipc: cannot map the peer's GPU region "
                     "0x%lx+%lu: %s (its blocks fail)",
                     (unsigned long)g->r.addr, (unsigned long)g->r.len,
                     kvf_status_str(status));
        }
    }
    pthread_mutex_unlock(&ep->open_lock);
    return status;
}

static void kvf_ipc_job_free(kvf_ipc_job_t *j)
{
    kvf_free(j); /* one allocation with its arrays */
}

/* One part of a job is done; the last one completes the parent. */
static void kvf_ipc_part_done(kvf_ipc_job_t *j)
{
    kvf_tl_req_t *p = j->parent;
    size_t i;

    if (__atomic_sub_fetch(&j->parts, 1, __ATOMIC_ACQ_REL) != 0) {
        return;
    }
    p->status = KVF_OK;
    for (i = 0; i < p->nsegs; i++) {
        if (p->seg_status[i] != KVF_OK) {
            p->status = p->seg_status[i];
            break;
        }
    }
    if (p->status == KVF_OK) {
        KVF_TL_COUNT(bytes, p->bytes - j->inner.bytes); /* inner counts its */
    } else {
        KVF_TL_COUNT(errors, 1);
    }
    kvf_ipc_job_free(j);
    p->complete(p);
}

static void kvf_ipc_inner_done(kvf_tl_req_t *req)
{
    kvf_ipc_job_t *j = req->arg;
    size_t i;

    for (i = 0; i < req->nsegs; i++) {
        j->parent->seg_status[j->inner_idx[i]] =
            (req->status == KVF_OK) ? KVF_OK : j->ist[i];
    }
    kvf_ipc_part_done(j);
}

/* ---- worker ------------------------------------------------------------ */

/*
 * The worker packs the descriptors of every queued job into the open
 * slot (one launch, up to KVF_IPC_SLOT_BLKS descriptors, one GPU), so
 * the many small requests of a batch become a few large launches; each
 * slot has its own stream per GPU, so launches overlap.
 */

/* Retires the oldest busy slot once its launch is done (wait: block for
 * it, else return KVF_INPROGRESS when it is still running). */
static kvf_status_t kvf_ipc_retire(kvf_ipc_ep_t *ep, int wait)
{
    kvf_ipc_slot_t *sl = &ep->slot[ep->slot_old];
    kvf_status_t status = KVF_OK;
    unsigned k;
    size_t i;

    if (!sl->busy) {
        return KVF_OK;
    }
    if (!wait && __atomic_load_n(sl->s.flag, __ATOMIC_ACQUIRE) != sl->s.seq) {
        return KVF_INPROGRESS;
    }
    status = kvf_cuda_slot_wait(&sl->s, kvf_time_ms() + ep->timeout_ms);
    if (status == KVF_OK && *(volatile unsigned *)sl->s.buf != 0) {
        status = KVF_ERR_OUT_OF_BOUNDS; /* a kernel refused a block */
    }
    sl->busy = 0;
    sl->dev = -1;
    ep->slot_old = (ep->slot_old + 1) % KVF_IPC_SLOTS;
    for (k = 0; k < sl->njobs; k++) {
        kvf_ipc_job_t *j = sl->jobs[k];

        if (status != KVF_OK) {
            /* the launch failed or never signalled: its jobs' GPU
             * segments fail */
            for (i = 0; i < j->ngpu; i++) {
                if (j->parent->seg_status[j->gpu[i]] == KVF_OK) {
                    j->parent->seg_status[j->gpu[i]] = status;
                }
            }
        }
        if (--j->launches == 0) {
            kvf_ipc_part_done(j);
        }
    }
    sl->njobs = 0;
    return KVF_OK;
}

/* Launches the open slot (if it holds descriptors) and moves on. */
static void kvf_ipc_launch(kvf_ipc_ep_t *ep)
{
    kvf_ipc_slot_t *sl = &ep->slot[ep->slot_next];
    int dev = sl->dev;
    kvf_cuda_launch_t l;
    kvf_status_t status;
    unsigned k;
    size_t i;

    if (sl->busy || dev < 0 || sl->s.nblks == 0) {
        return;
    }
    status = KVF_CUDA_CHECK(cudaSetDevice(dev));
    if (status == KVF_OK && sl->stream[dev] == NULL) {
        status = KVF_CUDA_CHECK(
            cudaStreamCreateWithFlags(&sl->stream[dev], cudaStreamNonBlocking));
    }
    if (status == KVF_OK && sl->s.ctr[dev] == NULL) {
        status = KVF_CUDA_CHECK(cudaMalloc((void **)&sl->s.ctr[dev], 64));
        if (status == KVF_OK) {
            status = KVF_CUDA_CHECK(cudaMemset(sl->s.ctr[dev], 0, 64));
        }
    }
    if (status == KVF_OK) {
        *(volatile unsigned *)sl->s.buf = 0;
        memset(&l, 0, sizeof(l));
        l.blks = sl->s.blks;
        l.n = sl->s.nblks;
        l.src_len = l.dst_len = UINT64_MAX; /* offsets are addresses */
        l.err = (unsigned *)sl->s.buf;
        l.ctr = sl->s.ctr[dev];
        l.flag = sl->s.flag;
        l.seq = sl->s.seq + 1;
        status = KVF_CUDA_CHECK((cudaError_t)kvf_cuda_kern_launch(
            KVF_CUDA_KERNEL_WARP, &l, kvf_cuda_devs[dev].sm_count,
            sl->stream[dev]));
    }
    if (status != KVF_OK) {
        /* nothing runs: fail the jobs' GPU segments now */
        for (k = 0; k < sl->njobs; k++) {
            kvf_ipc_job_t *j = sl->jobs[k];

            for (i = 0; i < j->ngpu; i++) {
                if (j->parent->seg_status[j->gpu[i]] == KVF_OK) {
                    j->parent->seg_status[j->gpu[i]] = status;
                }
            }
            if (--j->launches == 0) {
                kvf_ipc_part_done(j);
            }
        }
        sl->njobs = 0;
        sl->s.nblks = 0;
        sl->dev = -1;
        return;
    }
    sl->s.seq++;
    sl->s.ev_dev = dev;
    sl->busy = 1;
    ep->slot_next = (ep->slot_next + 1) % KVF_IPC_SLOTS;
}

/* The open slot, for descriptors that run on dev: a slot holding another
 * GPU's or a full one is launched first; all slots busy: the oldest is
 * retired. */
static kvf_ipc_slot_t *kvf_ipc_open_slot(kvf_ipc_ep_t *ep, int dev)
{
    kvf_ipc_slot_t *sl = &ep->slot[ep->slot_next];

    if (!sl->busy && sl->dev >= 0 &&
        (sl->dev != dev || sl->s.nblks == sl->s.blks_cap)) {
        kvf_ipc_launch(ep);
        sl = &ep->slot[ep->slot_next];
    }
    if (sl->busy) {
        kvf_ipc_retire(ep, 1);
    }
    if (sl->dev < 0) {
        sl->dev = dev;
        sl->s.nblks = 0;
        sl->njobs = 0;
    }
    return sl;
}

/* Notes that job j has descriptors in slot sl. */
static void kvf_ipc_slot_join(kvf_ipc_slot_t *sl, kvf_ipc_job_t *j)
{
    if (sl->njobs == 0 || sl->jobs[sl->njobs - 1] != j) {
        sl->jobs[sl->njobs++] = j;
        j->launches++;
    }
}

/* Adds a job's GPU segments to the open slot(s). */
static void kvf_ipc_job_add(kvf_ipc_ep_t *ep, kvf_ipc_job_t *j)
{
    kvf_tl_req_t *p = j->parent;
    kvf_ipc_slot_t *sl;
    size_t i;
    int ldev;

    j->launches = 1; /* held while adding */
    for (i = 0; i < j->ngpu; i++) {
        kvf_tl_seg_t *s = &p->segs[j->gpu[i]];
        kvf_ipc_region_t *g = &ep->regions[j->region[i]];
        uint64_t loc, rem, off, len;
        kvf_status_t st;

        /* map the region (first use); the segment runs on its GPU */
        ldev = j->ldev[i];
        st = kvf_ipc_region_open(ep, (size_t)j->region[i], ldev);
        if (st == KVF_OK && ldev >= 0 && ldev != g->exec_dev &&
            !kvf_cuda_peer_enable(g->exec_dev, ldev)) {
            st = KVF_ERR_UNSUPPORTED;
        }
        p->seg_status[j->gpu[i]] = st;
        if (st != KVF_OK) {
            continue;
        }
        loc = (uint64_t)(uintptr_t)s->local;
        rem = (uint64_t)(uintptr_t)g->local + (s->remote - g->r.addr);
        for (off = 0; off < s->len; off += len) {
            kvf_cuda_blk_t *b;

            sl = kvf_ipc_open_slot(ep, g->exec_dev);
            kvf_ipc_slot_join(sl, j);
            len = s->len - off;
            if (len > KVF_CUDA_SPLIT) {
                len = KVF_CUDA_SPLIT;
            }
            b = &sl->s.blks[sl->s.nblks++];
            b->src_off = (p->type == KVF_OP_WRITE) ? loc + off : rem + off;
            b->dst_off = (p->type == KVF_OP_WRITE) ? rem + off : loc + off;
            b->len = len;
        }
    }
    if (--j->launches == 0) {
        kvf_ipc_part_done(j); /* nothing of it went into a slot */
    }
}

static void *kvf_ipc_worker(void *arg)
{
    kvf_ipc_ep_t *ep = arg;
    kvf_ipc_job_t *list, *j;
    struct timespec ts, nap = {0, 20000};
    unsigned spins = 0;
    size_t i;

    for (;;) {
        pthread_mutex_lock(&ep->lock);
        while (ep->head == NULL && !ep->stop && !ep->slot[ep->slot_old].busy) {
            kvf_time_abs_after(&ts, 100);
            pthread_cond_timedwait(&ep->cond, &ep->lock, &ts);
        }
        list = ep->head;
        ep->head = ep->tail = NULL;
        if (list == NULL && ep->stop && !ep->slot[ep->slot_old].busy) {
            pthread_mutex_unlock(&ep->lock);
            break;
        }
        pthread_mutex_unlock(&ep->lock);
        while ((j = list) != NULL) {
            list = j->next;
            if (j->parent->cancel != NULL &&
                __atomic_load_n(j->parent->cancel, __ATOMIC_ACQUIRE)) {
                for (i = 0; i < j->ngpu; i++) {
                    j->parent->seg_status[j->gpu[i]] = KVF_ERR_CANCELED;
                }
                kvf_ipc_part_done(j);
                continue;
            }
            kvf_ipc_job_add(ep, j);
        }
        kvf_ipc_launch(ep);
        spins = 0;
        /* retire finished launches; wait for the oldest only while no
         * new request is queued */
        while (ep->slot[ep->slot_old].busy) {
            if (kvf_ipc_retire(ep, 0) == KVF_OK) {
                spins = 0;
                continue;
            }
            if (__atomic_load_n(&ep->head, __ATOMIC_ACQUIRE) != NULL) {
                break;
            }
            if (++spins > 200000) {
                kvf_ipc_retire(ep, 1); /* bounded by the timeout */
                spins = 0;
            } else if (spins > 100000) {
                nanosleep(&nap, NULL);
            } else {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
            }
        }
    }
    return NULL;
}

/* ---- ops --------------------------------------------------------------- */

static kvf_status_t kvf_ipc_post(kvf_tl_ep_t *tl_ep, kvf_tl_req_t *req)
{
    kvf_ipc_ep_t *ep = (kvf_ipc_ep_t *)tl_ep;
    size_t i, n = req->nsegs;
    kvf_ipc_job_t *j;
    char *mem;
    int r, dev;

    /* nothing in an exported region: the wrapped ep's request */
    for (i = 0; i < n; i++) {
        if (kvf_ipc_find(ep, req->segs[i].remote, req->segs[i].len) != -1) {
            break;
        }
    }
    if (i == n) {
        return ep->inner_ops->ep_post(ep->inner, req);
    }
    /* one allocation: the job and its arrays, each for n segments */
    mem = kvf_malloc(sizeof(*j) +
                     n * (2 * sizeof(size_t) + 2 * sizeof(int) +
                          sizeof(kvf_tl_seg_t) + sizeof(kvf_status_t)));
    if (mem == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    j = (kvf_ipc_job_t *)mem;
    memset(j, 0, sizeof(*j));
    mem += sizeof(*j);
    j->gpu = (size_t *)mem;
    j->inner_idx = j->gpu + n;
    j->isegs = (kvf_tl_seg_t *)(j->inner_idx + n);
    j->region = (int *)(j->isegs + n);
    j->ldev = j->region + n;
    j->ist = (kvf_status_t *)(j->ldev + n);
    j->parent = req;
    j->ep = ep;
    j->inner.type = req->type;
    j->inner.segs = j->isegs;
    j->inner.seg_status = j->ist;
    j->inner.cancel = req->cancel;
    j->inner.local_mem = req->local_mem;
    j->inner.complete = kvf_ipc_inner_done;
    j->inner.arg = j;
    for (i = 0; i < n; i++) {
        r = kvf_ipc_find(ep, req->segs[i].remote, req->segs[i].len);
        req->seg_status[i] = KVF_OK;
        dev = -1;
        if (r == -2) {
            kvf_log_rl(KVF_LOG_ERROR,
                       "remote range 0x%lx+%lu runs past the peer's GPU "
                       "region",
                       (unsigned long)req->segs[i].remote,
                       (unsigned long)req->segs[i].len);
            req->seg_status[i] = KVF_ERR_OUT_OF_BOUNDS;
        } else if (r >= 0 && req->segs[i].len > 0 &&
                   kvf_ipc_local_ok(req->segs[i].local, req->segs[i].len,
                                    &dev)) {
            j->region[j->ngpu] = r;
            j->ldev[j->ngpu] = dev;
            j->gpu[j->ngpu++] = i;
        } else {
            j->inner_idx[j->inner.nsegs] = i;
            j->isegs[j->inner.nsegs++] = req->segs[i];
            j->inner.bytes += req->segs[i].len;
        }
    }
    j->parts = 1 + (j->inner.nsegs > 0);
    if (j->inner.nsegs > 0 &&
        ep->inner_ops->ep_post(ep->inner, &j->inner) != KVF_OK) {
        kvf_tl_req_fail(&j->inner, KVF_ERR_IO);
    }
    KVF_TL_COUNT(wire_entries, j->ngpu);
    pthread_mutex_lock(&ep->lock);
    if (ep->tail != NULL) {
        ep->tail->next = j;
    } else {
        __atomic_store_n(&ep->head, j, __ATOMIC_RELEASE);
    }
    ep->tail = j;
    pthread_cond_signal(&ep->cond);
    pthread_mutex_unlock(&ep->lock);
    return KVF_OK;
}

static void kvf_ipc_close(kvf_tl_ep_t *tl_ep)
{
    kvf_ipc_ep_t *ep = (kvf_ipc_ep_t *)tl_ep;
    size_t i;
    int d;

    if (ep->worker_started) {
        pthread_mutex_lock(&ep->lock);
        ep->stop = 1;
        pthread_cond_signal(&ep->cond);
        pthread_mutex_unlock(&ep->lock);
        pthread_join(ep->worker, NULL);
    }
    for (i = 0; i < KVF_IPC_SLOTS; i++) {
        kvf_cuda_slot_fini(&ep->slot[i].s);
        kvf_free(ep->slot[i].jobs);
        for (d = 0; d < KVF_CUDA_DEV_MAX; d++) {
            if (ep->slot[i].stream[d] != NULL) {
                cudaSetDevice(d);
                cudaStreamDestroy(ep->slot[i].stream[d]);
            }
        }
    }
    for (i = 0; i < ep->nregions; i++) {
        if (ep->regions[i].map != NULL) {
            kvf_ipc_map_put(ep->regions[i].map);
        }
    }
    if (ep->inner != NULL) {
        ep->inner_ops->ep_close(ep->inner);
    }
    pthread_mutex_destroy(&ep->lock);
    pthread_mutex_destroy(&ep->open_lock);
    pthread_cond_destroy(&ep->cond);
    kvf_free(ep->regions);
    kvf_free(ep);
}

static kvf_status_t kvf_ipc_checksum(kvf_tl_ep_t *tl_ep, const uint64_t *remote,
                                     const size_t *lengths, size_t count,
                                     uint64_t *sums)
{
    kvf_ipc_ep_t *ep = (kvf_ipc_ep_t *)tl_ep;

    /* the target hashes its own memory (GPU ranges through staging) */
    if (ep->inner_ops->ep_checksum == NULL) {
        return KVF_ERR_UNSUPPORTED;
    }
    return ep->inner_ops->ep_checksum(ep->inner, remote, lengths, count, sums);
}

/* The contiguous ceiling of this path: one cudaMemcpyAsync between the
 * local range and the mapped peer range (copy engines over NVLink, or
 * within one GPU), timed with events on the GPU that runs the kernels. */
static kvf_status_t kvf_ipc_link_test(kvf_tl_ep_t *tl_ep, kvf_op_type_t type,
                                      void *local, uint64_t remote,
                                      size_t length, double *seconds_p)
{
    kvf_ipc_ep_t *ep = (kvf_ipc_ep_t *)tl_ep;
    cudaEvent_t e0 = NULL, e1 = NULL;
    kvf_status_t status;
    cudaStream_t stream;
    float ms = 0;
    char *rem;
    int r, ldev = -1;

    r = kvf_ipc_find(ep, remote, length);
    if (r < 0 || !kvf_ipc_local_ok(local, length, &ldev)) {
        if (ep->inner_ops->ep_link_test == NULL) {
            return KVF_ERR_UNSUPPORTED;
        }
        return ep->inner_ops->ep_link_test(ep->inner, type, local, remote,
                                           length, seconds_p);
    }
    status = kvf_ipc_region_open(ep, (size_t)r, ldev);
    if (status != KVF_OK) {
        return status;
    }
    rem = ep->regions[r].local + (remote - ep->regions[r].r.addr);
    /* its own stream: the worker's streams are the worker's */
    status = KVF_CUDA_CHECK(cudaSetDevice(ep->regions[r].exec_dev));
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(
            cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    }
    if (status != KVF_OK) {
        return status;
    }
    if (ldev >= 0 && ldev != ep->regions[r].exec_dev) {
        kvf_cuda_peer_enable(ep->regions[r].exec_dev, ldev);
        kvf_cuda_peer_enable(ldev, ep->regions[r].exec_dev);
        cudaSetDevice(ep->regions[r].exec_dev);
    }
    status = KVF_CUDA_CHECK(cudaEventCreate(&e0));
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(cudaEventCreate(&e1));
    }
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(cudaEventRecord(e0, stream));
    }
    if (status == KVF_OK) {
        status =
            KVF_CUDA_CHECK(cudaMemcpyAsync(type == KVF_OP_WRITE ? rem : local,
                                           type == KVF_OP_WRITE ? local : rem,
                                           length, cudaMemcpyDefault, stream));
    }
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(cudaEventRecord(e1, stream));
    }
    if (status == KVF_OK) {
        status = kvf_cuda_event_wait(e1, kvf_time_ms() + ep->timeout_ms);
    }
    if (status == KVF_OK) {
        status = KVF_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    }
    if (e0 != NULL) {
        cudaEventDestroy(e0);
    }
    if (e1 != NULL) {
        cudaEventDestroy(e1);
    }
    cudaStreamDestroy(stream);
    *seconds_p = ms / 1e3;
    return status;
}

static int kvf_ipc_available(void)
{
    return kvf_cuda_device_count() > 0;
}

static const kvf_transport_ops_t kvf_cuda_ipc_ops = {
    .name = "cuda",
    .available = kvf_ipc_available,
    .ep_post = kvf_ipc_post,
    .ep_close = kvf_ipc_close,
    .ep_checksum = kvf_ipc_checksum,
    .ep_link_test = kvf_ipc_link_test,
};

static int kvf_ipc_cmp(const void *a, const void *b)
{
    const kvf_ipc_region_t *x = a, *y = b;

    return (x->r.addr > y->r.addr) - (x->r.addr < y->r.addr);
}

kvf_status_t kvf_cuda_ep_wrap(const kvf_cuda_remote_t *regions, size_t n,
                              int same_process, unsigned timeout_ms,
                              const kvf_transport_ops_t **ops_p,
                              kvf_tl_ep_t **ep_p)
{
    kvf_ipc_ep_t *ep;
    kvf_status_t status = KVF_OK;
    size_t i;

    if (n == 0 || regions == NULL || ops_p == NULL || ep_p == NULL ||
        *ops_p == NULL || *ep_p == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (kvf_cuda_device_count() == 0) {
        return KVF_ERR_UNAVAILABLE;
    }
    ep = kvf_calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    ep->regions = kvf_calloc(n, sizeof(*ep->regions));
    if (ep->regions == NULL) {
        kvf_free(ep);
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0; i < n; i++) {
        ep->regions[i].r = regions[i];
        ep->regions[i].exec_dev = -1;
    }
    qsort(ep->regions, n, sizeof(*ep->regions), kvf_ipc_cmp);
    for (i = 1; i < n; i++) {
        if (ep->regions[i].r.addr <
            ep->regions[i - 1].r.addr + ep->regions[i - 1].r.len) {
            kvf_free(ep->regions);
            kvf_free(ep);
            return KVF_ERR_PROTOCOL; /* overlapping regions */
        }
    }
    ep->nregions = n;
    ep->same_process = same_process;
    ep->timeout_ms = timeout_ms ? timeout_ms : 5000;
    pthread_mutex_init(&ep->lock, NULL);
    pthread_mutex_init(&ep->open_lock, NULL);
    kvf_cond_init(&ep->cond);
    for (i = 0; i < KVF_IPC_SLOTS && status == KVF_OK; i++) {
        ep->slot[i].dev = -1;
        status = kvf_cuda_slot_init(&ep->slot[i].s, 64, KVF_IPC_SLOT_BLKS);
        ep->slot[i].jobs =
            kvf_calloc(KVF_IPC_SLOT_BLKS, sizeof(*ep->slot[i].jobs));
        if (status == KVF_OK && ep->slot[i].jobs == NULL) {
            status = KVF_ERR_NO_MEMORY;
        }
    }
    if (status == KVF_OK &&
        pthread_create(&ep->worker, NULL, kvf_ipc_worker, ep) != 0) {
        status = KVF_ERR_NO_MEMORY;
    }
    if (status != KVF_OK) {
        kvf_ipc_close((kvf_tl_ep_t *)ep);
        return status;
    }
    ep->worker_started = 1;
    ep->inner_ops = *ops_p;
    ep->inner = *ep_p;
    *ops_p = &kvf_cuda_ipc_ops;
    *ep_p = (kvf_tl_ep_t *)ep;
    return KVF_OK;
}
