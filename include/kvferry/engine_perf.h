/*
 * kvferry engine measurement calls (engine layer): engine counters, the
 * raw link test, checksums of a peer's memory in place, the transports
 * built in. Programs include <kvferry/perf.h>, which includes this
 * header and adds the store's; GPU calls are in <kvferry/gpu.h>.
 */
#ifndef KVFERRY_ENGINE_PERF_H
#define KVFERRY_ENGINE_PERF_H

#include <kvferry/engine.h>

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif

#endif
