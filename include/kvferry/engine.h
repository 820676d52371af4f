/*
 * kvferry transfer engine: register memory, open peers by segment name,
 * submit batches of READ/WRITE operations of many blocks, and wait for
 * them with a timeout.
 *
 *   kvf_engine_params_t p = {0};
 *   kvf_engine_h eng;
 *   kvf_engine_create(&p, &eng);                  // listens on 127.0.0.1:0
 *   kvf_engine_reg(eng, pool, len, KVF_MEM_HOST, 0, &region);
 *   kvf_peer_open(eng, "10.0.0.2:17777", &peer);   // p2p metadata
 *   kvf_op_t op = {KVF_OP_READ, local, peer, remote_addr, 8192};
 *   kvf_batch_submit(eng, &op, 1, &batch);
 *   kvf_batch_wait(batch, 5000);
 *   kvf_batch_destroy(batch);
 *
 * Ownership: the engine never owns user buffers; a region must be
 * deregistered before its memory is freed; handles are destroyed by their
 * symmetric call (create/destroy, reg/dereg, open/close, submit/destroy).
 */
#ifndef KVFERRY_ENGINE_H
#define KVFERRY_ENGINE_H

#include <kvferry/status.h>
#include <kvferry/types.h> /* kvf_mem_type_t, kvf_op_type_t */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvf_engine *kvf_engine_h;
typedef struct kvf_region *kvf_region_h;
typedef struct kvf_peer *kvf_peer_h;
typedef struct kvf_batch *kvf_batch_h;

enum kvf_engine_params_field {
    KVF_ENGINE_PARAM_LISTEN = 1u << 0,
    KVF_ENGINE_PARAM_CONNS = 1u << 1,
    KVF_ENGINE_PARAM_TIMEOUT = 1u << 2,
    KVF_ENGINE_PARAM_TRANSPORTS = 1u << 3,
    KVF_ENGINE_PARAM_METADATA = 1u << 4,
    KVF_ENGINE_PARAM_CHUNK = 1u << 5,
    KVF_ENGINE_PARAM_NO_LISTEN = 1u << 6,
    KVF_ENGINE_PARAM_UCX_WORKERS = 1u << 7
};

/* Engine parameters. Only the fields named in field_mask are read; the
 * rest come from configuration (`kvferry config` lists the keys, each
 * also settable as KVF_<KEY>). */
typedef struct kvf_engine_params {
    uint64_t field_mask;
    const char *listen;     /* "host:port" to serve on; port 0 = any */
    unsigned conns;         /* connections per peer (tcp) */
    unsigned timeout_ms;    /* bound on any wait for a peer */
    const char *transports; /* "tcp", "shm,tcp", ... in preference order;
                               NULL or "auto" = best available */
    const char *metadata;   /* "p2p" (default) or "etcd://h:p[,h:p]" */
    size_t chunk_bytes;     /* largest single wire request */
    int no_listen;          /* initiator only: expose no segment */
    unsigned ucx_workers;   /* UCX workers per peer and on the target,
                               1..16 (key ucx_workers) */
} kvf_engine_params_t;

KVF_API kvf_status_t kvf_engine_create(const kvf_engine_params_t *params,
                                       kvf_engine_h *engine_p);
/* Closes remaining peers (with a warning), stops serving, frees all. */
KVF_API void kvf_engine_destroy(kvf_engine_h engine);

/* The local segment's name ("host:port"), valid until destroy. */
KVF_API const char *kvf_engine_segment_name(kvf_engine_h engine);

/* The engine's transports preference list as set at create ("auto" or
 * names such as "shm,tcp"), valid until destroy. */
KVF_API const char *kvf_engine_transports(kvf_engine_h engine);

/* Allocates len bytes of memory of `type` that peers of the same host can
 * reach without copies through the target (shm transport):
 * KVF_MEM_HOST = zeroed, memfd-backed shared memory (huge pages when the
 * system offers them). KVF_MEM_PINNED and KVF_MEM_CUDA: not yet
 * (KVF_ERR_UNAVAILABLE). Any memory can be registered; memory from here
 * is the fast path of the shm transport. Owned by the caller; released
 * with kvf_mem_free() after its regions are deregistered. A peer that
 * was granted access keeps its mapping of it until it learns of the
 * release (next transfer, or within about a second while idle). */
KVF_API kvf_status_t kvf_mem_alloc(size_t len, kvf_mem_type_t type, int device,
                                   void **ptr_p);
/* Releases memory from kvf_mem_alloc(); warns on any other pointer. */
KVF_API void kvf_mem_free(void *ptr);

/* Registers [addr, addr+length) for local and remote access. Fast: no
 * pages are touched. device is the GPU index for KVF_MEM_CUDA. */
KVF_API kvf_status_t kvf_engine_reg(kvf_engine_h engine, void *addr,
                                    size_t length, kvf_mem_type_t type,
                                    int device, kvf_region_h *region_p);
/* Waits for remote accesses in flight, then removes the region. */
KVF_API kvf_status_t kvf_engine_dereg(kvf_engine_h engine, kvf_region_h region);

/* Opens a peer by segment name through the metadata backend and picks a
 * transport. Fails with KVF_ERR_PEER_UNREACHABLE within the timeout. */
KVF_API kvf_status_t kvf_peer_open(kvf_engine_h engine,
                                   const char *segment_name,
                                   kvf_peer_h *peer_p);
KVF_API void kvf_peer_close(kvf_peer_h peer);
/* The peer's registered regions as its descriptor listed them when the
 * peer was opened. Returns KVF_ERR_NOT_FOUND past the last one. */
KVF_API kvf_status_t kvf_peer_region(kvf_peer_h peer, size_t index,
                                     uint64_t *addr_p, size_t *length_p,
                                     kvf_mem_type_t *type_p);
/* Name of the transport serving the peer ("tcp", "shm", ...). */
KVF_API const char *kvf_peer_transport(kvf_peer_h peer);

typedef struct kvf_op {
    kvf_op_type_t type;
    void *local; /* inside a local registered region */
    kvf_peer_h peer;
    uint64_t remote; /* address inside one of the peer's regions */
    size_t length;
} kvf_op_t;

/* Submits count operations at once (ops is copied). Safe to call from
 * several threads. Local addresses are checked here; remote ones by the
 * target. */
KVF_API kvf_status_t kvf_batch_submit(kvf_engine_h engine, const kvf_op_t *ops,
                                      size_t count, kvf_batch_h *batch_p);
/* kvf_batch_submit with flags. KVF_BATCH_INLINE: the caller waits for
 * the batch right away; the calling thread may then move requests itself
 * (host memory): a small batch whole, so it returns done with no
 * transport-thread hand-off (lower latency and CPU per op), a large one
 * a request while the transport's threads move the others. */
#define KVF_BATCH_INLINE 0x1u
KVF_API kvf_status_t kvf_batch_submit_ex(kvf_engine_h engine,
                                         const kvf_op_t *ops, size_t count,
                                         unsigned flags, kvf_batch_h *batch_p);
/* KVF_INPROGRESS while running, then KVF_OK or the first error. */
KVF_API kvf_status_t kvf_batch_test(kvf_batch_h batch);
/* Waits at most timeout_ms: KVF_ERR_TIMEOUT if still running. */
KVF_API kvf_status_t kvf_batch_wait(kvf_batch_h batch, int timeout_ms);
/* Operations not yet started finish with KVF_ERR_CANCELED. */
KVF_API void kvf_batch_cancel(kvf_batch_h batch);
/* Status and bytes moved of operation index. KVF_INPROGRESS until the
 * whole batch ends; once its bytes moved equal its length, its bytes are
 * in place for the caller to read (a read) while the batch runs on. */
KVF_API kvf_status_t kvf_batch_op_status(kvf_batch_h batch, size_t index,
                                         size_t *bytes_p);
/* Cancels and waits (bounded by the engine timeout) if still running. */
KVF_API void kvf_batch_destroy(kvf_batch_h batch);

/* Submit + wait + destroy. */
KVF_API kvf_status_t kvf_transfer_sync(kvf_engine_h engine, const kvf_op_t *ops,
                                       size_t count, int timeout_ms);

/* The checksum kvferry uses everywhere (64-bit, non-cryptographic). */
KVF_API uint64_t kvf_checksum(const void *data, size_t length);

#ifdef __cplusplus
}
#endif

#endif
