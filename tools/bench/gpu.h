/*
 * GPU benches, shared: options of `kvferry bench blocks --device gpu`
 * (gpu.c: local paths h2d, d2h, d2d, p2p; gpu_net.c: GPU pools
 * over transports, and the hidden serving mode it spawns), pools in any
 * memory kind, random block picking, and small output helpers also used
 * by `kvferry bench h2d` (h2d.c).
 */
#ifndef KVF_TOOLS_BENCH_GPU_H
#define KVF_TOOLS_BENCH_GPU_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/bench/gpu.h is private to tools/"
#endif

#include "tools/bench/bench.h"
#include <kvferry/gpu.h>
#include "core/rng.h"

#define KVF_GPU_SIZES_MAX 16

/* Baselines the copy kernels are measured against, on a stream of
 * their own on the copier's GPU (gpu_baselines.c): one contiguous
 * cudaMemcpyAsync (cudaMemcpyPeerAsync across GPUs), one cudaMemcpyAsync
 * per block, and one cudaMemcpyBatchAsync (the library's copy-engine
 * path). */
kvf_status_t kvf_gpu_base_contig(kvf_gpu_copier_t *cp, const kvf_gpu_mem_t *src,
                                 uint64_t src_off, const kvf_gpu_mem_t *dst,
                                 uint64_t dst_off, uint64_t len,
                                 int timeout_ms);
kvf_status_t kvf_gpu_base_each(kvf_gpu_copier_t *cp, const kvf_gpu_mem_t *src,
                               const kvf_gpu_mem_t *dst,
                               const kvf_gpu_block_t *blks, size_t n,
                               int timeout_ms);
kvf_status_t kvf_gpu_base_batchapi(kvf_gpu_copier_t *cp,
                                   const kvf_gpu_mem_t *src,
                                   const kvf_gpu_mem_t *dst,
                                   const kvf_gpu_block_t *blks, size_t n,
                                   int timeout_ms);

typedef struct kvf_gpu_opts {
    const char *path;  /* h2d, d2h, d2d, p2p; NULL: over transports */
    int gpu;           /* GPU of the initiator (source for p2p) */
    int peer_gpu;      /* p2p destination / target's GPU; -1 auto */
    int on_dst;        /* p2p: kernels run on the destination GPU */
    int pageable;      /* h2d/d2h: host side pageable, not pinned */
    int sequential;    /* blocks in pool order (diagnostic) */
    int blocks_on_gpu; /* local paths: block list in GPU memory */
    uint64_t pool;
    uint64_t block;
    uint64_t sizes[KVF_GPU_SIZES_MAX];
    unsigned nsizes;
    unsigned iters;
    unsigned each_iters; /* per-block cudaMemcpyAsync baseline */
    int ops;             /* transports: bit 0 write, bit 1 read */
    unsigned conns;
    unsigned timeout_ms;
    const char *transports; /* comma list, default "tcp" */
    int host_baseline;      /* transports: host pools measured first */
    kvf_gpu_kernel_t kernel;
    int verify;
    uint64_t seed;
    const char *json;
    const char *record;
    const char *hypothesis;
    kvf_expect_t *expect; /* --expect rules (plus the defaults) */
    int strict;           /* a missed rule fails the command */
    /* hidden serving mode (spawned by the transports mode) */
    int serve;
    const char *serve_mem; /* "host" or "gpu" */
} kvf_gpu_opts_t;

/* A pool of one memory kind, filled with seeded random bytes. */
typedef struct kvf_gpu_pool {
    kvf_gpu_mem_t mem;
    int mapped; /* 1: mmap; 2: mmap + cudaHostRegister */
    void *map_base;
} kvf_gpu_pool_t;

/* Pinned pools from transparent huge pages + cudaHostRegister instead of
 * cudaHostAlloc (bench option --host-alloc thp). */
void kvf_gpu_pool_use_thp(int on);

int kvf_gpu_pool_alloc(kvf_gpu_pool_t *p, kvf_mem_type_t type, int device,
                       uint64_t len, uint64_t seed);
void kvf_gpu_pool_free(kvf_gpu_pool_t *p);

/* Picks n distinct slots among nslots (partial Fisher-Yates over perm). */
void kvf_gpu_pick(uint32_t *perm, uint64_t nslots, uint64_t n, kvf_rng_t *rng);

/* Prints "GPU 0 (NVIDIA H200, PCI 0000:..., NUMA n, PCIe Gen5 x16)". */
void kvf_gpu_describe(int gpu, char *buf, size_t len);
/* Adds the GPU's description to a JSON object. */
void kvf_gpu_json_info(kvf_json_t *j, const char *key, int gpu);
/* "resident copy kernel: ..." counters of cp, when it used one. */
void kvf_gpu_print_resident(const kvf_gpu_copier_t *cp);

/* Transports mode and serving mode (gpu_net.c). */
int kvf_gpu_bench_net(const kvf_gpu_opts_t *o);
int kvf_gpu_serve(const kvf_gpu_opts_t *o);

#endif
