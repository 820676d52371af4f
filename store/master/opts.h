/*
 * The store master's options and handle type, apart from master.h so
 * that master_int.h (the master's state) needs them without including
 * master.h (no header cycle).
 */
#ifndef KVF_STORE_MASTER_OPTS_H
#define KVF_STORE_MASTER_OPTS_H
#if !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "store/master/opts.h is private to store/: use <kvferry/store.h>"
#endif

#include <stdint.h>

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

#endif
