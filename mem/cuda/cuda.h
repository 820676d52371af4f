/*
 * mem/cuda: GPU memory for kvferry, the CUDA half of the memory layer.
 * mem/mem.c reaches it for the engine and the transports (mem/mem.h);
 * transports that drive GPUs themselves reach it through mem/gpu.h, the
 * GPU tests directly. It needs nothing of mem/mem.h (no cycle).
 *
 * - Devices: count, properties, PCIe and NUMA placement. Without a GPU, or
 *   in a build without CUDA, every call reports KVF_ERR_UNAVAILABLE (and
 *   kvf_cuda_device_count() returns 0), so one build runs anywhere.
 * - Memory: pinned host memory (cudaHostAlloc, portable + mapped, so every
 *   GPU reaches it at the same address) and device memory (cudaMalloc).
 * - Address registry: the engine records its KVF_MEM_CUDA / KVF_MEM_PINNED
 *   regions here (kvf_cuda_region_add), after checking that a GPU range
 *   really lies inside one allocation of that device; transports ask it
 *   which bytes of an I/O vector live on a GPU.
 * - Batched copies: many scattered blocks moved by one or a few kernel
 *   launches (a warp per block, 16-byte vector accesses when aligned,
 *   narrower ones otherwise), for host->GPU (pinned host memory read
 *   through its device mapping), GPU->host, within one GPU, and GPU->GPU
 *   over NVLink (peer access). Pageable host memory is staged through
 *   pinned buffers. Block bounds are checked against both sides.
 * - Staged socket I/O: kvf_cuda_readv / kvf_cuda_writev behave like the
 *   socket helpers but move the bytes that live on a GPU through pinned
 *   buffers, pipelined so the GPU copy overlaps the network.
 * - CUDA IPC: export a device allocation as a handle another process of
 *   the same host opens (the cuda_ipc transport maps them).
 *
 * Every wait is bounded by a deadline (events are polled, never
 * synchronized on without a bound).
 */
#ifndef KVF_MEM_CUDA_H
#define KVF_MEM_CUDA_H
#if !defined(KVF_LAYER_MEM) && !defined(KVF_MEM_GPU_IFACE) && \
    !defined(KVF_TEST_INTERNALS)
#error "mem/cuda/cuda.h is private to mem/ (transports: mem/gpu.h)"
#endif

#include <kvferry/status.h>
#include <kvferry/types.h>

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define KVF_CUDA_DEV_MAX    16
#define KVF_CUDA_IPC_HANDLE 64 /* = KVF_MEM_IPC_HANDLE (mem.c checks) */

/* ---- devices ---------------------------------------------------------- */

/* Number of usable GPUs; 0 without a GPU or without CUDA support. The
 * first call initializes the runtime (thread-safe). */
int kvf_cuda_device_count(void);

/* 1 when the build has CUDA support (whether or not a GPU is present). */
int kvf_cuda_built(void);

typedef struct kvf_cuda_dev_info {
    char name[256];
    char pci_bus_id[32]; /* "0000:3b:00.0" (sysfs spelling) */
    int numa_node;       /* host NUMA node closest to the GPU, -1 unknown */
    int pcie_gen;        /* current link generation, 0 unknown */
    int pcie_width;      /* current link width, 0 unknown */
    int cc_major, cc_minor;
    int sm_count;
    uint64_t mem_bytes;
    int driver_version; /* e.g. 13000 */
    int runtime_version;
} kvf_cuda_dev_info_t;

kvf_status_t kvf_cuda_device_info(int device, kvf_cuda_dev_info_t *info);

/* 1 if `device` can access `peer`'s memory directly (NVLink or PCIe P2P);
 * enables it on first use. */
int kvf_cuda_peer_enable(int device, int peer);

/* ---- memory ----------------------------------------------------------- */

/* KVF_MEM_PINNED: page-locked, portable, mapped host memory (device is
 * ignored; the NUMA placement follows the calling thread). KVF_MEM_CUDA:
 * cudaMalloc on `device`. Other types: KVF_ERR_INVALID_PARAM. Owned by
 * the caller, released with kvf_cuda_mem_free(type, addr). */
kvf_status_t kvf_cuda_mem_alloc(kvf_mem_type_t type, int device, size_t len,
                                void **addr_p);
void kvf_cuda_mem_free(kvf_mem_type_t type, void *addr);

/* The allocators behind kvf_mem_alloc (engine/memory.c): GPU memory, and
 * pinning of host memory allocated elsewhere (memfd, so it stays
 * shareable with same-host peers), both tracked so that release can tell
 * them from other memory. Release frees a tracked GPU allocation
 * (type KVF_MEM_CUDA) or unpins tracked host memory (KVF_MEM_PINNED; the
 * caller then frees it), and answers KVF_ERR_NOT_FOUND for anything not
 * tracked as that type. Without a GPU: unavailable. */
kvf_status_t kvf_cuda_mem_track_alloc(int device, size_t len, void **addr_p);
kvf_status_t kvf_cuda_mem_track_pin(void *addr, size_t len);
kvf_status_t kvf_cuda_mem_track_release(void *addr, kvf_mem_type_t type);

/* Pins existing host memory (portable, mapped), e.g. a pool backed by
 * huge pages, so it can be used as KVF_MEM_PINNED; undone by unregister
 * before the memory is freed. */
kvf_status_t kvf_cuda_host_register(void *addr, size_t len);
void kvf_cuda_host_unregister(void *addr);

/* Fills / reads device or host memory of any type (tests, benches). */
kvf_status_t kvf_cuda_memcpy(void *dst, const void *src, size_t len);
kvf_status_t kvf_cuda_memset(void *dst, int value, size_t len);

/* ---- address registry ------------------------------------------------ */

/* Records a region the engine registered. KVF_MEM_CUDA ranges must lie
 * inside one allocation of `device` (else KVF_ERR_OUT_OF_BOUNDS);
 * KVF_MEM_PINNED ranges must be page-locked (else KVF_ERR_INVALID_PARAM).
 * Without CUDA: KVF_ERR_UNAVAILABLE. Registrations nest (reference
 * counted on (addr, len, type)). */
kvf_status_t kvf_cuda_region_add(uint64_t addr, uint64_t len,
                                 kvf_mem_type_t type, int device);
void kvf_cuda_region_del(uint64_t addr, uint64_t len, kvf_mem_type_t type);

/* The registered region holding addr: its type, device and the bytes
 * from addr to its end. KVF_MEM_HOST with *left_p = bytes up to the next
 * registered region (or UINT64_MAX) when addr is in none. */
kvf_mem_type_t kvf_cuda_region_lookup(uint64_t addr, int *device_p,
                                      uint64_t *left_p);

/* ---- batched copies --------------------------------------------------- */

/* One side of a copy: a memory range the blocks' offsets refer to. Every
 * block must lie inside it; blocks that do not are refused
 * (KVF_ERR_OUT_OF_BOUNDS) and not copied. For KVF_MEM_HOST (pageable)
 * the bytes are staged through pinned buffers. */
typedef struct kvf_cuda_mem {
    void *base;
    uint64_t len;
    kvf_mem_type_t type;
    int device; /* KVF_MEM_CUDA */
} kvf_cuda_mem_t;

/* A block: len bytes from src.base + src_off to dst.base + dst_off.
 * Same layout as the kernels' descriptors. */
typedef struct kvf_cuda_blk {
    uint64_t src_off;
    uint64_t dst_off;
    uint64_t len;
} kvf_cuda_blk_t;

/* Kernel variant for copies (config key cuda_kernel / KVF_CUDA_KERNEL). */
typedef enum kvf_cuda_kernel {
    KVF_CUDA_KERNEL_AUTO = 0,
    KVF_CUDA_KERNEL_WARP = 1,  /* a warp per block, vector loads/stores */
    KVF_CUDA_KERNEL_BULK = 2,  /* Hopper bulk copies through shared memory */
    KVF_CUDA_KERNEL_HYBRID = 3 /* warp kernel plus the copy engines taking
                                  every 4th block (cudaMemcpyBatchAsync) */
} kvf_cuda_kernel_t;

/* A copy context: a GPU that runs the kernels, its stream, descriptor
 * and staging buffers. One thread at a time. */
typedef struct kvf_cuda_copy kvf_cuda_copy_t;

kvf_status_t kvf_cuda_copy_create(int device, kvf_cuda_copy_t **cp_p);
void kvf_cuda_copy_destroy(kvf_cuda_copy_t *cp);
void kvf_cuda_copy_set_kernel(kvf_cuda_copy_t *cp, kvf_cuda_kernel_t k);
/* Stops the context's resident copy kernel (cuda_resident) if it runs,
 * so that its GPU is idle (benches park it before timing baselines);
 * the next batch starts it again. Bounded wait. */
void kvf_cuda_copy_park(kvf_cuda_copy_t *cp);
/* Batches the resident kernel moved, its launches, and batches that took
 * the launch path because it could not start (or had failed). */
void kvf_cuda_copy_res_stats(const kvf_cuda_copy_t *cp, uint64_t *jobs,
                             uint64_t *launches, uint64_t *fallbacks);
/* cuda_resident as configured: "off", "on" or "p2p". */
const char *kvf_cuda_resident_name(void);
kvf_cuda_kernel_t kvf_cuda_kernel_parse(const char *name);
const char *kvf_cuda_kernel_name(kvf_cuda_kernel_t k);

/* Copies n blocks from src to dst with a few kernel launches and waits
 * for them (at most timeout_ms). Either side may be pinned host memory
 * or device memory (of the context's GPU or a peer it reaches); one side
 * may be pageable host memory (staged). When blks itself lies in pinned
 * memory (kvf_cuda_mem_alloc(KVF_MEM_PINNED)), the kernels read it in
 * place and the host does no work per block. Returns KVF_OK, or the first
 * error (KVF_ERR_OUT_OF_BOUNDS when a block falls outside its side; the
 * others are still copied). */
kvf_status_t kvf_cuda_copy_blocks(kvf_cuda_copy_t *cp,
                                  const kvf_cuda_mem_t *src,
                                  const kvf_cuda_mem_t *dst,
                                  const kvf_cuda_blk_t *blks, size_t n,
                                  int timeout_ms);
/* The same with the block list in GPU memory (device-resident, as
 * serving engines keep their block tables): dev_blks is device memory
 * that the context's GPU reads (its own or a peer's), n descriptors,
 * read by the kernels in place. Neither side may be pageable host memory
 * (KVF_ERR_INVALID_PARAM, as for a dev_blks that is not GPU memory). */
kvf_status_t kvf_cuda_copy_blocks_dev(kvf_cuda_copy_t *cp,
                                      const kvf_cuda_mem_t *src,
                                      const kvf_cuda_mem_t *dst,
                                      const kvf_cuda_blk_t *dev_blks, size_t n,
                                      int timeout_ms);

/* Every block through the copy engines (one cudaMemcpyBatchAsync on the
 * context's copy-engine stream, the copy-engine share of the hybrid
 * variant), waited for (at most timeout_ms). */
kvf_status_t kvf_cuda_copy_engines(kvf_cuda_copy_t *cp,
                                   const kvf_cuda_mem_t *src,
                                   const kvf_cuda_mem_t *dst,
                                   const kvf_cuda_blk_t *blks, size_t n,
                                   int timeout_ms);

/* Posts every block through the copy engines like kvf_cuda_copy_engines
 * but does not wait: *ticket_p names the post for
 * kvf_cuda_ce_wait_ticket. Posts run in the order made, one after the
 * other on the copy-engine stream. Nothing is posted when a block falls
 * outside its side (KVF_ERR_OUT_OF_BOUNDS). The blocks are read only
 * during the call; both sides must stay valid until the post is waited
 * for. */
kvf_status_t kvf_cuda_ce_post_ticket(kvf_cuda_copy_t *cp,
                                     const kvf_cuda_mem_t *src,
                                     const kvf_cuda_mem_t *dst,
                                     const kvf_cuda_blk_t *blks, size_t n,
                                     uint64_t *ticket_p);
/* Waits (at most timeout_ms) until the post named ticket has ended;
 * timeout_ms 0 asks once (KVF_ERR_TIMEOUT while it runs). */
kvf_status_t kvf_cuda_ce_wait_ticket(kvf_cuda_copy_t *cp, uint64_t ticket,
                                     int timeout_ms);

/* For copies measured against the kernels (benches): the context's GPU,
 * its stream (a cudaStream_t), and a bounded wait for all work posted on
 * that stream so far. */
int kvf_cuda_copy_device(const kvf_cuda_copy_t *cp);
void *kvf_cuda_copy_stream(kvf_cuda_copy_t *cp);
kvf_status_t kvf_cuda_copy_sync(kvf_cuda_copy_t *cp, int timeout_ms);

/* 64-bit checksums (kvf_checksum) of n ranges of one side: host memory
 * hashed in place, GPU memory by the checksumming kernel on the GPU. */
kvf_status_t kvf_cuda_checksum_blocks(kvf_cuda_copy_t *cp,
                                      const kvf_cuda_mem_t *mem,
                                      const uint64_t *offs,
                                      const uint64_t *lens, size_t n,
                                      uint64_t *sums, int timeout_ms);

/* Copies n blocks from src to dst (pinned or GPU memory, not pageable:
 * KVF_ERR_UNSUPPORTED) with the checksumming kernel: sums[i] receives
 * kvf_checksum() of block i's bytes, computed while they move. dst NULL:
 * only checksums the source ranges (dst_off ignored). mode: one of
 * KVF_CUDA_SUM_*. Blocks outside a
 * side are not copied (sum 0) and the call answers KVF_ERR_OUT_OF_BOUNDS;
 * the other sums are still filled in. */
#define KVF_CUDA_SUM_AUTO    0 /* AFTER for GPU -> pinned, else FUSED */
#define KVF_CUDA_SUM_FUSED   1 /* checksummed by the kernel that copies */
#define KVF_CUDA_SUM_AFTER   2 /* tuned copy, then a pass on the GPU side */
#define KVF_CUDA_SUM_ENGINES 3 /* copy engines, then that pass */
kvf_status_t kvf_cuda_copy_sum(kvf_cuda_copy_t *cp, const kvf_cuda_mem_t *src,
                               const kvf_cuda_mem_t *dst,
                               const kvf_cuda_blk_t *blks, size_t n,
                               uint64_t *sums, int mode, int timeout_ms);
/* kvf_checksum() of n ranges of pinned or GPU memory, on the GPU. */
kvf_status_t kvf_cuda_sum_blocks(kvf_cuda_copy_t *cp, const kvf_cuda_mem_t *mem,
                                 const uint64_t *offs, const uint64_t *lens,
                                 size_t n, uint64_t *sums, int timeout_ms);
/* Frees the context's checksum array (copy context destruction). */
void kvf_cuda_sums_free(kvf_cuda_copy_t *cp);

/* ---- staged socket I/O (transports) ---------------------------------- */

typedef struct kvf_mem_stage kvf_cuda_stage_t;

/* Like kvf_sock_readv_all / kvf_sock_writev_all (iov is consumed), but
 * the bytes of iovecs that lie in registered KVF_MEM_CUDA regions go
 * through pinned staging buffers: received into them and scattered to
 * the GPU (readv), or gathered from the GPU into them and sent (writev),
 * a few buffers in flight so GPU copies overlap the socket. *stage_p is
 * created on first need and freed with kvf_cuda_stage_free. When no GPU
 * region is registered in the process these are the plain socket calls. */
kvf_status_t kvf_cuda_readv(kvf_cuda_stage_t **stage_p, int fd,
                            struct iovec *iov, size_t iovcnt,
                            uint64_t deadline_ms);
kvf_status_t kvf_cuda_writev(kvf_cuda_stage_t **stage_p, int fd,
                             struct iovec *iov, size_t iovcnt,
                             uint64_t deadline_ms);
/* Checksum (kvf_checksum) of [addr, addr+len) of registered GPU memory. */
kvf_status_t kvf_cuda_hash(kvf_cuda_stage_t **stage_p, uint64_t addr,
                           uint64_t len, uint64_t *hash_p,
                           uint64_t deadline_ms);
void kvf_cuda_stage_free(kvf_cuda_stage_t *stage);

/* ---- CUDA IPC --------------------------------------------------------- */

/* Exports the allocation holding addr: its handle and addr's offset in
 * it. */
kvf_status_t kvf_cuda_ipc_export(uint64_t addr,
                                 unsigned char handle[KVF_CUDA_IPC_HANDLE],
                                 uint64_t *offset_p);
/* Maps another process's allocation on `device`; *base_p is the start of
 * the allocation in this process. Closed with kvf_cuda_ipc_close. */
kvf_status_t kvf_cuda_ipc_open(const unsigned char handle[KVF_CUDA_IPC_HANDLE],
                               int device, void **base_p);
void kvf_cuda_ipc_close(int device, void *base);

#endif
