/*
 * kvferry performance and debug calls: what benchmarks, drills and tests
 * measure or check beside the data path. Not needed to move or store
 * bytes; kept apart from engine.h and store.h so those read as the API a
 * user programs against.
 *
 *   kvf_engine_stats_t s;
 *   kvf_engine_stats(eng, &s);            // requests, segments, bytes...
 *   kvf_peer_link_test(peer, KVF_OP_READ, buf, remote, 1 << 30, &secs);
 *   kvf_peer_checksum(peer, &remote, &len, 1, &sum);  // verify in place
 *   kvf_store_last_timing(&t);            // stages of this thread's get
 */
#ifndef KVFERRY_PERF_H
#define KVFERRY_PERF_H

#include <kvferry/engine.h>
#include <kvferry/store.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- transfer engine ---- */

/* Asks the peer for the 64-bit checksum (kvf_checksum) of each remote
 * range; used to verify transfers without moving the bytes back. */
KVF_API kvf_status_t kvf_peer_checksum(kvf_peer_h peer, const uint64_t *remote,
                                       const size_t *lengths, size_t count,
                                       uint64_t *sums);

/* Raw ceiling of the path to the peer: moves `length` contiguous bytes
 * between local and remote with plain streams, one per connection, no
 * block handling. Returns the elapsed seconds. */
KVF_API kvf_status_t kvf_peer_link_test(kvf_peer_h peer, kvf_op_type_t type,
                                        void *local, uint64_t remote,
                                        size_t length, double *seconds_p);

/* Data-path counters of this process (all engines): requests posted to
 * transports (after splitting and packing), their segments, the remote
 * entries and local iovecs they became after adjacent ones were merged,
 * payload bytes moved and requests that failed. */
typedef struct kvf_engine_stats {
    uint64_t requests;
    uint64_t segments;
    uint64_t wire_entries;
    uint64_t wire_iovs;
    uint64_t bytes;
    uint64_t errors;
} kvf_engine_stats_t;

KVF_API void kvf_engine_stats(kvf_engine_h engine, kvf_engine_stats_t *stats_p);

/* Names of the transports built into this library ("tcp", "shm", ...),
 * in the engine's order; stores at most max and returns how many exist. */
KVF_API size_t kvf_transport_names(const char **names, size_t max);

/* ---- GPU memory (benches of the load path) ---- */

/* GPUs this process can use; 0 without a GPU or without CUDA support. */
KVF_API int kvf_gpu_count(void);
/* Copies len bytes between any host and GPU memory (either side may be
 * either kind); KVF_ERR_UNAVAILABLE without CUDA. */
KVF_API kvf_status_t kvf_gpu_copy(void *dst, const void *src, size_t len);

/* ---- store client ---- */

/* Time spent in the calling thread's last get or put, by stage. */
typedef struct kvf_store_timing {
    uint64_t query_ns;  /* master round trip: get lookup / put allocation */
    uint64_t read_ns;   /* engine transfer: get read / put write(s) */
    uint64_t verify_ns; /* checksums: get verification / put computation */
    uint64_t commit_ns; /* put only: the commit round trip */
} kvf_store_timing_t;

/* Stage times of the calling thread's last get or put (zeros before
 * any). */
KVF_API void kvf_store_last_timing(kvf_store_timing_t *timing_p);

/* The handle's location cache (store config `loc_cache`): a single-key
 * get of a key whose location the handle knows (its own put, an earlier
 * get) reads there while the master answers, and keeps those bytes only
 * if the master names that location and their checksum matches. */
typedef struct kvf_store_loc_stats {
    uint64_t gets;  /* gets that read a cached location */
    uint64_t used;  /* ... whose bytes were the object's: one round trip */
    uint64_t lease; /* gets served by a lease read (`lease_reads`): the
                       master not asked */
} kvf_store_loc_stats_t;

KVF_API void kvf_store_loc_stats(kvf_store_h store,
                                 kvf_store_loc_stats_t *stats_p);

#ifdef __cplusplus
}
#endif

#endif
