/*
 * The store master (interface for `kvferry master`): metadata only. It
 * knows the nodes (pools registered with their engines, heartbeats with
 * a TTL), the objects (key -> size, checksum, replicas, state), the space
 * of each pool, read leases and the LRU order; it never touches object
 * bytes. Clients and nodes speak store/proto to it; /metrics and /status
 * are served over HTTP.
 */
#ifndef KVF_STORE_MASTER_H
#define KVF_STORE_MASTER_H
#if !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "store/master/master.h is private to store/: use <kvferry/store.h>"
#endif

#include <kvferry/store.h>

#include "store/master/opts.h"

/* Fills opts from the `store` config table (defaults, file, KVF_* env). */
kvf_status_t kvf_master_opts_default(kvf_master_opts_t *opts);

kvf_status_t kvf_master_start(const kvf_master_opts_t *opts,
                              kvf_master_t **master_p);
/* Stops serving, closes every connection, frees all metadata. */
void kvf_master_stop(kvf_master_t *master);

const char *kvf_master_address(const kvf_master_t *master);
const char *kvf_master_http_address(const kvf_master_t *master);

#endif
