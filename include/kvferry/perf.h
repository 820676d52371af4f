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

#include <kvferry/engine_perf.h>
#include <kvferry/store.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- transfer engine: declared in <kvferry/engine_perf.h> ---- */

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
