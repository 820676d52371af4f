/*
 * mem/cuda's kernel interface: device table, copy-kernel launchers,
 * completion slots and events, shared by the files of mem/cuda/ and by
 * the cuda_ipc transport, which runs the same kernels on slots of its
 * own. The launchers (kern.cu, compiled by nvcc) are plain C entry
 * points so the host code stays C; the rest uses the CUDA runtime's C
 * API. Built only with CUDA; tcp, shm and the engine use mem/mem.h.
 */
#ifndef KVF_MEM_CUDA_KERN_H
#define KVF_MEM_CUDA_KERN_H
#if !defined(KVF_LAYER_MEM) && !defined(KVF_MEM_GPU_IFACE) &&                  \
    !defined(KVF_TEST_INTERNALS)
#error "mem/cuda/kern.h is private to mem/ (transports: mem/gpu.h)"
#endif

#include "mem/cuda/cuda.h"

#include <kvferry/gpu.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Blocks longer than this are split into pieces before a launch, so one
 * large block does not keep a single warp busy while the others idle. */
#define KVF_CUDA_SPLIT (64u << 10)
/* Descriptors per launch (the first launches of a batch are smaller so
 * the GPU starts early while the host prepares the rest: 512, 2048,
 * 8192, then 32768). */
#define KVF_CUDA_LAUNCH_MAX 32768u
#define KVF_CUDA_LAUNCH_MIN 512u

/* Arguments of one copy launch. blks is device-accessible (device memory
 * or mapped pinned memory); each block is checked against both sides'
 * lengths, and a refused block sets *err to 1 (mapped pinned). */
typedef struct kvf_cuda_launch {
    const kvf_cuda_blk_t *blks;
    unsigned n;
    uint64_t src_base;
    uint64_t src_len;
    uint64_t dst_base;
    uint64_t dst_len;
    unsigned *err;
    /* optional completion signal (warp kernel): the last CTA to finish
     * resets *ctr (device memory) and stores seq into *flag (mapped) */
    unsigned *ctr;
    unsigned *flag;
    unsigned seq;
} kvf_cuda_launch_t;

/* Resident copy kernel (res.c drives it, kern.cu runs it).
 * Control block in pinned, mapped host memory, one per copy context:
 * the host writes the addresses (when they change) and then the job
 * word; CTA 0 polls the job word (one PCIe read per poll). The GPU
 * writes done/alive/exited on their own cache line. */
#define KVF_RES_N_SHIFT   32 /* job word: bits 0-31 sequence number, */
#define KVF_RES_N_MAX     ((1u << 27) - 1) /* 32-58 n, */
#define KVF_RES_P_SHIFT   59               /* 59-60 pshift, */
#define KVF_RES_FRESH_BIT 61               /* 61: addresses below are new, */
#define KVF_RES_STOP_BIT  62               /* 62: leave now */

typedef struct kvf_cuda_res_host {
    uint64_t job;
    uint64_t blks; /* device address of the block list */
    uint64_t src_base, src_len, dst_base, dst_len;
    uint64_t pad0[2];
    unsigned done;   /* last job finished (GPU) */
    unsigned alive;  /* epoch of the instance that started (GPU) */
    unsigned exited; /* epoch of the instance that left (GPU) */
    unsigned pad1[13];
} kvf_cuda_res_host_t;

/* Device memory: CTA 0's copy of the job for the other CTAs. */
typedef struct kvf_cuda_res_dev {
    uint64_t blks, src_base, src_len, dst_base, dst_len;
    unsigned n, pshift;
    unsigned gen;  /* sequence number of the job handed out */
    unsigned quit; /* epoch of the instance that is leaving */
    unsigned ctr;  /* CTAs done with the current job */
    unsigned pad;
} kvf_cuda_res_dev_t;

/* Launches the variant's kernel on stream (kern.cu). The current
 * device must be the one that owns the stream. Returns a cudaError_t. */
int kvf_cuda_kern_launch(kvf_cuda_kernel_t kernel, const kvf_cuda_launch_t *l,
                         int sm_count, cudaStream_t stream);
/* Launches the checksumming warp kernel on stream: store != 0 copies
 * each block and puts its kvf_checksum() in sums[i] (device-accessible,
 * one per descriptor); store == 0 only checksums the source ranges.
 * tail_dst: the last partial KiB of each block is read back from the
 * destination (in GPU memory) rather than the source. Blocks are never
 * split. Returns a cudaError_t. */
int kvf_cuda_kern_sum_launch(const kvf_cuda_launch_t *l, uint64_t *sums,
                             int store, int tail_dst, int sm_count,
                             cudaStream_t stream);
/* Warps sharing one block (cuda_warps_per_block): 1, 2, 4, or 0 for auto
 * (more warps per block while the batch has fewer blocks than the GPU
 * holds warps). */
void kvf_cuda_kern_parts(int warps_per_block);
/* Warps per block (as a shift) for n blocks over `warps` resident warps,
 * per cuda_warps_per_block. */
unsigned kvf_cuda_kern_pshift(size_t n, unsigned warps);
/* CTAs of the resident kernel one multiprocessor holds (0: unknown). */
int kvf_cuda_kern_res_fit(void);
/* Cooperative launch of the resident kernel (h: device address of the
 * control block); returns a cudaError_t. */
int kvf_cuda_kern_res_launch(kvf_cuda_res_host_t *h, kvf_cuda_res_dev_t *dv,
                             unsigned *err, unsigned seen, unsigned epoch,
                             uint64_t idle_ns, unsigned grid,
                             cudaStream_t stream);
/* Resource figures of the compiled kernels, for `kvferry version`-style
 * reports and tests: registers per thread, or -1. */
int kvf_cuda_kern_regs(kvf_cuda_kernel_t kernel);

/* Runtime state (dev.c). */
typedef struct kvf_cuda_devstate {
    int sm_count;
    int host_ptr_ok;            /* can use host pointers of registered memory */
    int peer[KVF_CUDA_DEV_MAX]; /* 0 unknown, 1 enabled, -1 impossible */
} kvf_cuda_devstate_t;

extern kvf_cuda_devstate_t kvf_cuda_devs[KVF_CUDA_DEV_MAX];

/* Translates a CUDA error into a status, logging the call that failed. */
kvf_status_t kvf_cuda_status(cudaError_t err, const char *what);
#define KVF_CUDA_CHECK(_call) kvf_cuda_status((_call), #_call)

/* Makes device current for this thread (and checks it exists). */
kvf_status_t kvf_cuda_use(int device);

/* Fast check for the socket paths: is any GPU region registered? */
int kvf_cuda_have_gpu_regions(void);

/* Polls ev until it completes or deadline_ms passes (KVF_ERR_TIMEOUT). */
kvf_status_t kvf_cuda_event_wait(cudaEvent_t ev, uint64_t deadline_ms);

/* Kernel variant chosen by configuration (cuda_kernel key). */
kvf_cuda_kernel_t kvf_cuda_default_kernel(void);

/* Pinned, mapped buffers with a descriptor array: the unit of staging.
 * Used by the pageable paths (copy.c) and by socket I/O
 * (stage.c). */
typedef struct kvf_cuda_slot {
    char *buf; /* pinned, mapped */
    uint64_t cap;
    uint64_t used;
    kvf_cuda_blk_t *blks; /* pinned, mapped */
    unsigned nblks;
    unsigned blks_cap;
    unsigned *flag;                  /* pinned, mapped: last completed seq */
    unsigned seq;                    /* of the last launch */
    unsigned *ctr[KVF_CUDA_DEV_MAX]; /* CTAs finished, per device */
    int ev_dev;                      /* device whose copy is pending, -1 none */
} kvf_cuda_slot_t;

kvf_status_t kvf_cuda_slot_init(kvf_cuda_slot_t *s, uint64_t cap,
                                unsigned blks_cap);
void kvf_cuda_slot_fini(kvf_cuda_slot_t *s);
/* Waits for the slot's pending copy (if any); the caller resets it. */
kvf_status_t kvf_cuda_slot_wait(kvf_cuda_slot_t *s, uint64_t deadline_ms);
/* Launches the slot's blocks on device's stream and records its event.
 * to_gpu: slot -> GPU blocks (src is the slot); else GPU -> slot. */
kvf_status_t kvf_cuda_slot_post(kvf_cuda_slot_t *s, int device,
                                cudaStream_t stream, int to_gpu, unsigned *err);

/* ---- copy contexts (copy.c; slot.c and base.c share
 * them) ------------------------------------------------------------------ */

#define KVF_COPY_STAGE_SLOTS 3
/* posted copy-engine batches a copier tells apart (kvferry/gpu.h) */
#define KVF_CUDA_POSTS       KVF_GPU_POSTS
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
    /* posted copy-engine batches (kvf_cuda_ce_post_ticket): post k
     * recorded ce_posts[k % KVF_CUDA_POSTS]; ce_next the next ticket */
    cudaEvent_t ce_posts[KVF_CUDA_POSTS];
    uint64_t ce_next;
    void **ce_dst;
    const void **ce_src;
    size_t *ce_len;
    size_t ce_cap;
    /* resident kernel (res.c): mode from cuda_resident, state on
     * first use */
    int res_mode;
    struct kvf_cuda_res *res;
    /* checksums of the checksumming kernels (sum.c): pinned, mapped */
    uint64_t *sums;
    size_t sums_cap;
};

static inline int kvf_cuda_blk_in(uint64_t off, uint64_t len, uint64_t side)
{
    return off <= side && len <= side - off;
}

/* One side pageable host memory: staged through the context's pinned
 * slots (slot.c). */
kvf_status_t kvf_cuda_copy_staged(kvf_cuda_copy_t *cp,
                                  const kvf_cuda_mem_t *src,
                                  const kvf_cuda_mem_t *dst,
                                  const kvf_cuda_blk_t *blks, size_t n,
                                  uint64_t deadline);
/* cuda_resident values. */
#define KVF_RES_OFF 0
#define KVF_RES_ON  1 /* every in-place batch of the warp kernel */
#define KVF_RES_P2P 2 /* GPU -> other GPU batches only */

/* The mode configured for new copy contexts (res.c). */
int kvf_cuda_res_mode(void);
/* Moves n descriptors at dev (device-accessible) with l's sides through
 * the context's resident kernel, starting it when needed, and waits (up
 * to deadline). KVF_ERR_UNSUPPORTED: not possible now (not started in
 * time, too many blocks, a failed launch): use the launch path. */
kvf_status_t kvf_cuda_res_copy(kvf_cuda_copy_t *cp, const kvf_cuda_launch_t *l,
                               const kvf_cuda_blk_t *dev, size_t n,
                               uint64_t deadline);
/* Stops the resident kernel (bounded wait) and frees its state. */
void kvf_cuda_res_free(kvf_cuda_copy_t *cp);

/* Posts blocks first, first+stride, ... as one cudaMemcpyBatchAsync on
 * the context's copy-engine stream (base.c). */
kvf_status_t kvf_cuda_ce_post(kvf_cuda_copy_t *cp, const kvf_cuda_mem_t *src,
                              const kvf_cuda_mem_t *dst,
                              const kvf_cuda_blk_t *blks, size_t n,
                              size_t first, size_t stride);

#ifdef __cplusplus
}
#endif

#endif
