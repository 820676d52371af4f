/*
 * cuda module, private: what the files of transport/cuda/ share. The
 * kernel launchers (cuda_kern.cu, compiled by nvcc) are plain C entry
 * points so the host code stays C; the rest uses the CUDA runtime's C
 * API. Nothing outside this folder includes this header.
 */
#ifndef KVF_TRANSPORT_CUDA_INT_H
#define KVF_TRANSPORT_CUDA_INT_H

#include "transport/cuda/cuda.h"

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

/* Launches the variant's kernel on stream (cuda_kern.cu). The current
 * device must be the one that owns the stream. Returns a cudaError_t. */
int kvf_cuda_kern_launch(kvf_cuda_kernel_t kernel, const kvf_cuda_launch_t *l,
                         int sm_count, cudaStream_t stream);
/* Grid size (CTAs per SM) and unrolling (4 or 8 vectors in flight per
 * lane) of the copy kernels; out-of-range values keep the defaults. */
void kvf_cuda_kern_tune(int ctas_per_sm, int unroll);
/* Resource figures of the compiled kernels, for `kvferry version`-style
 * reports and tests: registers per thread, or -1. */
int kvf_cuda_kern_regs(kvf_cuda_kernel_t kernel);

/* Runtime state (cuda_dev.c). */
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
 * Used by the pageable paths (cuda_copy.c) and by socket I/O
 * (cuda_stage.c). */
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

#ifdef __cplusplus
}
#endif

#endif
