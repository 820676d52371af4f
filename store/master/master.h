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

#include <kvferry/store.h>

#include "core/config.h"

typedef struct kvf_master kvf_master_t;

#define KVF_MASTER_LOOPS_MAX 64

typedef struct kvf_master_opts {
    const char *listen;      /* RPC "host:port" (port 0 = any) */
    const char *http;        /* HTTP "host:port", NULL = none */
    uint64_t lease_ms;       /* read lease granted by a get */
    uint64_t put_timeout_ms; /* a put not committed by then is undone */
    uint64_t node_ttl_ms;    /* a node silent this long is dead */
    uint64_t heartbeat_ms;   /* interval asked of nodes */
    double high_watermark;   /* evict when used/capacity exceeds this */
    double low_watermark;    /* ... down to this */
    unsigned replicas;       /* default replica count of a put */
    unsigned io_timeout_ms;  /* bound on reading a started frame */
    unsigned loops;          /* connection event loops; 0 = by CPUs */
    /* limits (docs/security.md) */
    uint64_t client_max_pending;      /* pending puts of one client */
    unsigned client_max_reserved_pct; /* their bytes, % of the capacity */
    uint64_t pending_max;             /* pending puts of all clients */
    unsigned client_max_leased_pct;   /* a client's leased bytes, % */
    uint64_t client_max_leases;       /* its lease records */
    unsigned max_put_share_pct;       /* one put, % of the largest pool */
    uint64_t idle_timeout_ms;         /* close a connection idle this long */
    unsigned conn_max_per_peer;       /* per tcp address / unix uid */
    unsigned conn_max_tcp;            /* all tcp connections */
    unsigned conn_max_unix;           /* all unix connections */
    unsigned reg_workers;             /* threads checking registrations */
    /* disk tiers (tier.c) */
    uint64_t tier_write_max; /* bytes of write-through in flight per node */
    int tier_promote;        /* a loaded object goes to the hot end */
} kvf_master_opts_t;

/* Fills opts from the `store` config table (defaults, file, KVF_* env). */
kvf_status_t kvf_master_opts_default(kvf_master_opts_t *opts);

kvf_status_t kvf_master_start(const kvf_master_opts_t *opts,
                              kvf_master_t **master_p);
/* Stops serving, closes every connection, frees all metadata. */
void kvf_master_stop(kvf_master_t *master);

const char *kvf_master_address(const kvf_master_t *master);
const char *kvf_master_http_address(const kvf_master_t *master);

#endif
