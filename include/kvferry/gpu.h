/*
 * kvferry GPU calls: devices, GPU and pinned memory, and batched copies
 * of many scattered blocks through kvferry's copy kernels -- between
 * host (pinned or pageable) and GPU memory, within a GPU, or between
 * GPUs -- in one call, with checksums computed by the copy kernels.
 * kvferry-layer: mem
 *
 *   kvf_gpu_copier_t *c;
 *   kvf_gpu_copier_create(0, &c);                   // GPU 0 runs kernels
 *   kvf_gpu_mem_t cache = {kv, kv_bytes, KVF_MEM_CUDA, 0};
 *   kvf_gpu_mem_t stage = {buf, buf_bytes, KVF_MEM_PINNED, 0};
 *   kvf_gpu_block_t b[2] = {{blk7 * bs, 0, bs}, {blk3 * bs, bs, bs}};
 *   kvf_gpu_copy_blocks(c, &cache, &stage, b, 2, KVF_GPU_VERIFY, 5000);
 *   kvf_gpu_copier_destroy(c);
 *
 * Without a GPU, or in a build without CUDA, every call answers
 * KVF_ERR_UNAVAILABLE (kvf_gpu_count() returns 0) and nothing crashes,
 * so one program runs anywhere. Sizes and offsets are bytes; timeouts
 * are milliseconds and bound every wait (0 or less: do not wait beyond
 * what is already done).
 */
#ifndef KVFERRY_GPU_H
#define KVFERRY_GPU_H

#include <kvferry/status.h>
#include <kvferry/types.h> /* kvf_mem_type_t */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- devices ---------------------------------------------------------- */

/* GPUs this process can use; 0 without a GPU or without CUDA support.
 * The first call initializes the CUDA runtime (thread-safe). */
KVF_API int kvf_gpu_count(void);
/* 1 when the library was built with CUDA (whether or not a GPU is
 * present). */
KVF_API int kvf_gpu_built(void);

typedef struct kvf_gpu_info {
    char name[256];         /* "NVIDIA H200" */
    char pci_bus_id[32];    /* "0000:3b:00.0" */
    int numa_node;          /* host NUMA node closest to the GPU, -1 unknown */
    int pcie_gen;           /* current PCIe link generation, 0 unknown */
    int pcie_width;         /* current PCIe link width (lanes), 0 unknown */
    int cc_major, cc_minor; /* compute capability */
    int sm_count;           /* multiprocessors */
    uint64_t mem_bytes;     /* device memory */
    int driver_version;     /* e.g. 13000 */
    int runtime_version;
} kvf_gpu_info_t;

/* Describes GPU `device` (0 .. kvf_gpu_count() - 1). */
KVF_API kvf_status_t kvf_gpu_info(int device, kvf_gpu_info_t *info_p);

/* ---- memory ----------------------------------------------------------- */

/* KVF_MEM_PINNED: page-locked host memory mapped into every GPU at the
 * same address (device is ignored). KVF_MEM_CUDA: memory of GPU
 * `device`. KVF_MEM_HOST: KVF_ERR_INVALID_PARAM (use malloc). Owned by
 * the caller; released with kvf_gpu_free() of the same type. */
KVF_API kvf_status_t kvf_gpu_alloc(kvf_mem_type_t type, int device, size_t len,
                                   void **ptr_p);
KVF_API void kvf_gpu_free(kvf_mem_type_t type, void *ptr);

/* Pins existing host memory (e.g. huge pages, a numpy array) so that it
 * can be used as KVF_MEM_PINNED; undo with kvf_gpu_host_unregister()
 * before the memory is freed. */
KVF_API kvf_status_t kvf_gpu_host_register(void *ptr, size_t len);
KVF_API void kvf_gpu_host_unregister(void *ptr);

/* Copies len bytes between any host and GPU memory (either side may be
 * either kind), waiting for the copy (cudaMemcpy). */
KVF_API kvf_status_t kvf_gpu_copy(void *dst, const void *src, size_t len);

/* kvf_checksum() of [ptr, ptr + len) of host or GPU memory: the same
 * value kvf_checksum() gives for the same bytes on the host. */
KVF_API kvf_status_t kvf_gpu_checksum(const void *ptr, size_t len,
                                      uint64_t *sum_p);

/* ---- batched copies --------------------------------------------------- */

/* One side of a batch: the memory the blocks' offsets refer to. Every
 * block must lie inside [base, base + len); a block that does not is not
 * copied and the call answers KVF_ERR_OUT_OF_BOUNDS (the others are
 * still copied). A side may span several allocations of one type and
 * device (e.g. every layer's KV tensor on one GPU: base = the lowest
 * address, len = the span); only the span is checked then. KVF_MEM_HOST
 * (pageable) sides are staged through pinned buffers; at most one side
 * of a batch may be pageable. Same layout as the library's own side. */
typedef struct kvf_gpu_mem {
    void *base;
    uint64_t len;
    kvf_mem_type_t type;
    int device; /* GPU of KVF_MEM_CUDA memory */
} kvf_gpu_mem_t;

/* A block: len bytes from src_side.base + src_off to dst_side.base +
 * dst_off. Same layout as the kernels' descriptors, so a list in pinned
 * memory (kvf_gpu_alloc(KVF_MEM_PINNED)) is read by the kernels in
 * place, with no host work per block. */
typedef struct kvf_gpu_block {
    uint64_t src_off;
    uint64_t dst_off;
    uint64_t len;
} kvf_gpu_block_t;

/* Copy kernel of a copier; AUTO follows the library configuration
 * (config key cuda_kernel). */
typedef enum kvf_gpu_kernel {
    KVF_GPU_KERNEL_AUTO = 0,
    KVF_GPU_KERNEL_WARP = 1,  /* a warp per block, vector loads/stores */
    KVF_GPU_KERNEL_BULK = 2,  /* Hopper bulk copies through shared memory */
    KVF_GPU_KERNEL_HYBRID = 3 /* warp kernel, the copy engines taking
                                 every 4th block */
} kvf_gpu_kernel_t;

/* "auto", "warp", "bulk", "hybrid"; and back (-1 for an unknown name). */
KVF_API const char *kvf_gpu_kernel_name(kvf_gpu_kernel_t kernel);
KVF_API int kvf_gpu_kernel_parse(const char *name);
/* The resident copy kernel as configured (cuda_resident): "off", "on" or
 * "p2p". */
KVF_API const char *kvf_gpu_resident_name(void);

/* A copier: the GPU that runs the kernels, its streams, descriptor and
 * staging buffers. Used by one thread at a time; several copiers may
 * run at once. Destroy waits (bounded) for its work. */
typedef struct kvf_gpu_copier kvf_gpu_copier_t;

KVF_API kvf_status_t kvf_gpu_copier_create(int device, kvf_gpu_copier_t **c_p);
KVF_API void kvf_gpu_copier_destroy(kvf_gpu_copier_t *c);
KVF_API void kvf_gpu_copier_set_kernel(kvf_gpu_copier_t *c,
                                       kvf_gpu_kernel_t kernel);
/* The GPU the copier runs on (-1 for NULL). */
KVF_API int kvf_gpu_copier_device(const kvf_gpu_copier_t *c);
/* Stops the copier's resident copy kernel if one runs, so its GPU is
 * idle (e.g. before timing other work); the next batch restarts it. */
KVF_API void kvf_gpu_copier_park(kvf_gpu_copier_t *c);

typedef struct kvf_gpu_copier_stats {
    uint64_t resident_batches; /* batches the resident kernel moved */
    uint64_t resident_starts;  /* launches of the resident kernel */
    uint64_t fallbacks;        /* batches launched because it could not */
} kvf_gpu_copier_stats_t;

KVF_API void kvf_gpu_copier_stats(const kvf_gpu_copier_t *c,
                                  kvf_gpu_copier_stats_t *stats_p);

/* Flags of kvf_gpu_copy_blocks. */
/* blocks is GPU memory the copier's GPU reads (a block table kept on the
 * GPU); neither side may then be pageable. */
#define KVF_GPU_BLOCKS_ON_GPU 0x1u
/* Every block through the copy engines (one cudaMemcpyBatchAsync), not
 * the kernels. */
#define KVF_GPU_COPY_ENGINES 0x2u
/* Compare each block's checksum on both sides; KVF_ERR_CHECKSUM when one
 * differs. The kernel that copies a block computes the source's checksum
 * from the bytes it moves; the destination's is computed on the GPU by a
 * second, read-only pass (a pageable side or KVF_GPU_COPY_ENGINES: both
 * after the copy). Not with KVF_GPU_BLOCKS_ON_GPU. To check blocks
 * against known checksums in one pass, use kvf_gpu_copy_blocks_sum. */
#define KVF_GPU_VERIFY 0x4u

/* Copies n blocks from src to dst and waits for them (at most
 * timeout_ms). Either side may be pinned host memory or GPU memory (of
 * the copier's GPU or a peer it reaches over NVLink / PCIe P2P); one
 * may be pageable host memory. blocks is only read during the call.
 * Returns KVF_OK or the first error: KVF_ERR_INVALID_PARAM,
 * KVF_ERR_OUT_OF_BOUNDS, KVF_ERR_UNSUPPORTED (a GPU the copier cannot
 * reach), KVF_ERR_TIMEOUT, KVF_ERR_CHECKSUM (KVF_GPU_VERIFY),
 * KVF_ERR_UNAVAILABLE (no GPU). */
KVF_API kvf_status_t kvf_gpu_copy_blocks(
    kvf_gpu_copier_t *c, const kvf_gpu_mem_t *src, const kvf_gpu_mem_t *dst,
    const kvf_gpu_block_t *blocks, size_t n, unsigned flags, int timeout_ms);

/* Posts a copier tells apart: the completion of its last KVF_GPU_POSTS
 * posts is kept, so waiting for an older ticket waits for a later post
 * (which the copier's stream orders after it). A pipeline that keeps at
 * most this many posts in flight waits for exactly the one it names. */
#define KVF_GPU_POSTS 8

/* Posts n blocks from src to dst through the copy engines (what
 * kvf_gpu_copy_blocks does with KVF_GPU_COPY_ENGINES) and returns at
 * once: *ticket_p names the post for kvf_gpu_copy_wait. A copier's posts
 * run one after the other in the order made, so the engines go from one
 * to the next without waiting for the caller (a pipeline posts the next
 * slice before it waits for the last). Neither side may be pageable;
 * both must stay valid until the post was waited for; blocks is only read
 * during the call. Nothing is posted when a block falls outside its side
 * (KVF_ERR_OUT_OF_BOUNDS). Other errors: KVF_ERR_INVALID_PARAM,
 * KVF_ERR_UNAVAILABLE (no GPU). */
KVF_API kvf_status_t kvf_gpu_copy_post(kvf_gpu_copier_t *c,
                                       const kvf_gpu_mem_t *src,
                                       const kvf_gpu_mem_t *dst,
                                       const kvf_gpu_block_t *blocks, size_t n,
                                       uint64_t *ticket_p);
/* Waits (at most timeout_ms: KVF_ERR_TIMEOUT) until the post named ticket
 * and every one before it ended; timeout_ms 0 asks once and answers
 * KVF_ERR_TIMEOUT while it runs. KVF_ERR_INVALID_PARAM for a ticket the
 * copier never gave or a negative timeout (no wait is unbounded). */
KVF_API kvf_status_t kvf_gpu_copy_wait(kvf_gpu_copier_t *c, uint64_t ticket,
                                       int timeout_ms);

/* Flags of kvf_gpu_copy_blocks_sum (neither: per direction, the way
 * docs/gpu.md gives as the faster one). */
/* Checksums computed by the kernel that copies each block, from the
 * bytes it moves. */
#define KVF_GPU_SUM_FUSED 0x1u
/* The blocks copied by the usual kernels, then checksummed by a second,
 * read-only pass over the side in GPU memory (HBM, not the link). */
#define KVF_GPU_SUM_AFTER 0x2u
/* Like KVF_GPU_SUM_AFTER, but the blocks move through the copy engines
 * (DMA, no multiprocessor time), so a load overlapped with compute
 * kernels leaves them the multiprocessors; only the short checksum pass
 * over GPU memory runs as a kernel. */
#define KVF_GPU_SUM_ENGINES 0x4u

/* Copies n blocks from src to dst like kvf_gpu_copy_blocks and computes
 * kvf_checksum() of each block on the GPU (see the flags), bit-identical
 * to kvf_checksum() on the host, i.e. what the store records at put: no
 * trip of the bytes to the host, no CPU pass. sums[i] receives block
 * i's checksum (sums may be NULL when expect is given). expect (may be
 * NULL): the checksums the blocks must have; when one differs the call
 * answers KVF_ERR_CHECKSUM, after every block was copied and summed, so
 * the caller finds the bad ones in sums. Both sides must be pinned or
 * GPU memory (pageable: KVF_ERR_UNSUPPORTED). A block is hashed by one
 * warp from start to end (XXH3 is sequential per KiB), so batches of
 * many blocks of tens of KiB reach the link's rate and a few huge
 * blocks do not. A refused block (KVF_ERR_OUT_OF_BOUNDS) has sum 0. */
KVF_API kvf_status_t kvf_gpu_copy_blocks_sum(
    kvf_gpu_copier_t *c, const kvf_gpu_mem_t *src, const kvf_gpu_mem_t *dst,
    const kvf_gpu_block_t *blocks, size_t n, unsigned flags,
    const uint64_t *expect, uint64_t *sums, int timeout_ms);

/* kvf_checksum() of n ranges (offs[i], lens[i]) of one side into sums[i]
 * (host memory is hashed in place by the CPU, GPU memory on the GPU by the
 * checksumming kernel, where it lies). KVF_ERR_OUT_OF_BOUNDS when a range is
 * outside the side. */
KVF_API kvf_status_t kvf_gpu_checksum_blocks(kvf_gpu_copier_t *c,
                                             const kvf_gpu_mem_t *mem,
                                             const uint64_t *offs,
                                             const uint64_t *lens, size_t n,
                                             uint64_t *sums, int timeout_ms);

#ifdef __cplusplus
}
#endif

#endif
