/*
 * Transport interface: what the engine asks of tcp, shm... One ops table
 * per transport (libfabric's provider model); the engine calls only
 * through it. Wrappers over any transport's ep (fault, cuda_ipc) are
 * hooks (transport/hook.h). Memory is reached through mem/mem.h.
 *
 * A transport has two sides. The *iface* serves this process's memory to
 * peers: it is opened with a kvf_tl_target_t, the engine's hooks that
 * check every remote access against the registered regions. The *ep*
 * reaches one peer: requests posted to it complete asynchronously through
 * their callback, from a transport thread, exactly once.
 */
#ifndef KVF_TRANSPORT_H
#define KVF_TRANSPORT_H
#if !defined(KVF_LAYER_TRANSPORT) && !defined(KVF_LAYER_ENGINE) && \
    !defined(KVF_TEST_INTERNALS)
#error "transport/transport.h is transport/'s interface, for the engine"
#endif

#include "mem/mem.h"
#include "core/wire.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kvf_tl_iface kvf_tl_iface_t;
typedef struct kvf_tl_ep kvf_tl_ep_t;

/* One contiguous piece of a request. */
typedef struct kvf_tl_seg {
    void *local;
    uint64_t remote;
    uint64_t len;
} kvf_tl_seg_t;

/* One unit of work for a transport: segments of one type to one peer. */
typedef struct kvf_tl_req {
    kvf_op_type_t type;
    kvf_tl_seg_t *segs;
    size_t nsegs;
    uint64_t bytes;           /* sum of segs[].len */
    const int *cancel;        /* non-zero: fail with KVF_ERR_CANCELED */
    kvf_status_t status;      /* set by the transport before complete():
                                 KVF_OK if every segment moved; otherwise
                                 seg_status[i] holds each segment's result */
    kvf_status_t *seg_status; /* nsegs entries, owned by the poster */
    kvf_mem_mask_t local_mem; /* types of the segments' local memory
                                 (0: unknown, looked up per address) */
    void (*complete)(struct kvf_tl_req *req);
    void *arg;               /* owner's */
    struct kvf_tl_req *next; /* transport's queue link */
    uint64_t deadline_ms;    /* transport's */
} kvf_tl_req_t;

/* A view of a remote range: where it lies in this process's mapping of
 * the target's memory (shm), read in place instead of copied. */
typedef struct kvf_tl_view {
    const void *ptr;      /* the range here; NULL unless status is KVF_OK */
    const void *map_base; /* the whole mapping holding it (NULL: none) */
    uint64_t map_len;
    kvf_status_t status;
} kvf_tl_view_t;

/* The lease views of one ep_view_open call hold (transport's). */
typedef struct kvf_tl_vlease kvf_tl_vlease_t;

/* Called just before a mapping that views lay in is unmapped (no view
 * into it is held any more), from the thread that unmaps it; it must not
 * call into kvferry. One per process: a later call replaces it, NULL
 * removes it. */
typedef void (*kvf_tl_unmap_fn)(void *arg, const void *base, uint64_t len);
void kvf_tl_unmap_hook(kvf_tl_unmap_fn fn, void *arg);
/* Calls the hook (transports, before they unmap a mapping). */
void kvf_tl_unmap_notify(const void *base, uint64_t len);

/* Memory description the target hook returns for a remote range. */
typedef struct kvf_tl_mem {
    kvf_mem_type_t type;
    int device;
    uint64_t base; /* the registered region holding the range (0, 0: not */
    uint64_t len;  /* told; shm then exposes none of it by fd) */
} kvf_tl_mem_t;

/* Engine hooks for serving remote accesses. access() checks that
 * [addr, addr+len) lies inside one registered region and, on success,
 * pins the region set until release() (deregistration waits). */
typedef struct kvf_tl_target {
    void *arg;
    kvf_status_t (*access)(void *arg, uint64_t addr, uint64_t len,
                           kvf_tl_mem_t *mem_p);
    void (*acquire)(void *arg);
    void (*release)(void *arg);
    /* Optional: 1 while a (de)registration waits for the region set, so
     * a transport whose holds overlap without a gap lets it in. */
    int (*writer_waiting)(void *arg);
    /* Encodes this segment's descriptor (answer to a peer's HELLO). */
    kvf_status_t (*describe)(void *arg, kvf_wr_t *out);
} kvf_tl_target_t;

typedef struct kvf_tl_config {
    const char *listen; /* "host:port" (tcp) */
    unsigned conns;     /* connections per ep */
    unsigned timeout_ms;
    size_t chunk_bytes;
    int no_listen;
    unsigned ucx_workers; /* 0: the ucx_workers key */
} kvf_tl_config_t;

typedef struct kvf_transport_ops {
    const char *name;
    /* Non-zero if usable in this process (devices, permissions). */
    int (*available)(void);
    /* Optional: under transports=auto, whether to open this transport at
     * all (NULL: whenever available); ucx only where an RDMA device is. */
    int (*auto_select)(void);
    kvf_status_t (*iface_open)(const kvf_tl_config_t *cfg,
                               const kvf_tl_target_t *target,
                               kvf_tl_iface_t **iface_p);
    void (*iface_close)(kvf_tl_iface_t *iface);
    /* Address peers use to reach this iface (goes in the descriptor). */
    const char *(*iface_address)(kvf_tl_iface_t *iface);
    kvf_status_t (*ep_open)(kvf_tl_iface_t *iface, const char *address,
                            kvf_tl_ep_t **ep_p);
    void (*ep_close)(kvf_tl_ep_t *ep);
    kvf_status_t (*ep_post)(kvf_tl_ep_t *ep, kvf_tl_req_t *req);
    /* Optional: moves a small request in the calling thread when the ep
     * can do it at once (an idle connection, an open lease covering it),
     * completing it (complete() called) before returning KVF_OK. Any
     * other return: nothing was done, the caller posts it instead. */
    kvf_status_t (*ep_post_inline)(kvf_tl_ep_t *ep, kvf_tl_req_t *req);
    /* 1: ep_post_inline is a copy (shm), worth taking every request of a
     * small batch and one of a large one; 0: only a batch of a single
     * request (tcp: inline requests of one batch would go one after the
     * other on one connection instead of in parallel on all) */
    int inline_batch;
    kvf_status_t (*ep_checksum)(kvf_tl_ep_t *ep, const uint64_t *remote,
                                const size_t *lengths, size_t count,
                                uint64_t *sums);
    kvf_status_t (*ep_link_test)(kvf_tl_ep_t *ep, kvf_op_type_t type,
                                 void *local, uint64_t remote, size_t length,
                                 double *seconds_p);
    /* Optional: connects to this transport's iface at address and returns
     * the segment descriptor it serves (caller kvf_free()s *desc_p); the
     * p2p metadata backend's resolve. */
    kvf_status_t (*fetch_descriptor)(const char *address, int timeout_ms,
                                     void **desc_p, size_t *len_p);
    /* Optional: the engine deregistered [addr, addr+len) (no remote
     * access holds it any more); a transport that mapped the range for
     * peers (ucx: memory handle and remote key) drops the mapping before
     * this returns, so the range's remote key stops working. */
    void (*mem_dereg)(kvf_tl_iface_t *iface, uint64_t addr, uint64_t len);
    /* Optional (shm): opens a lease of type (KVF_OP_READ: the views are
     * read in place; KVF_OP_WRITE: written in place, the target checks
     * the ranges as for a write) on the target over count ranges
     * [remote[i], remote[i] + lens[i]) and sets views[i] to where each
     * lies in this process's mapping of it, or its status (refused, or
     * not mappable: KVF_ERR_UNSUPPORTED). The views stay valid (the
     * target keeps the ranges registered, the mappings stay) until
     * ep_view_close, at most until *until_ms_p (kvf_time_ms clock); the
     * target revokes the lease then, or earlier when a deregistration
     * has waited for it for its lease_break_ms. Any other return than
     * KVF_OK: no lease, views untouched. */
    kvf_status_t (*ep_view_open)(kvf_tl_ep_t *ep, kvf_op_type_t type,
                                 size_t count, const uint64_t *remote,
                                 const uint64_t *lens, kvf_tl_view_t *views,
                                 uint64_t *until_ms_p,
                                 kvf_tl_vlease_t **lease_p);
    /* Ends the lease; the views are gone (a WRITE lease's stores are
     * ordered before its end). KVF_OK when it held until now (every
     * access made through its views reached the target's registered
     * memory), else why not (KVF_ERR_TIMEOUT: held past its time,
     * KVF_ERR_CONN_RESET: revoked, or the target is gone). */
    kvf_status_t (*ep_view_close)(kvf_tl_vlease_t *lease);
} kvf_transport_ops_t;

/* Process-wide data-path counters, updated by transports with relaxed
 * atomics; read through kvf_engine_stats(). */
typedef struct kvf_tl_counters {
    uint64_t requests;     /* requests posted to eps */
    uint64_t segments;     /* segments in those requests */
    uint64_t wire_entries; /* remote entries after merging adjacent ones */
    uint64_t wire_iovs;    /* local iovecs after merging adjacent ones */
    uint64_t bytes;        /* payload bytes moved */
    uint64_t errors;       /* requests completed with an error */
} kvf_tl_counters_t;

extern kvf_tl_counters_t kvf_tl_counters;

#define KVF_TL_COUNT(_field, _n)                                               \
    __atomic_add_fetch(&kvf_tl_counters._field, (_n), __ATOMIC_RELAXED)

/* Registered transports, NULL-terminated, in default preference order. */
extern const kvf_transport_ops_t *const kvf_transports[];

const kvf_transport_ops_t *kvf_transport_find(const char *name);

/* Completes a request whose segments all failed with status. */
void kvf_tl_req_fail(kvf_tl_req_t *req, kvf_status_t status);

#endif
