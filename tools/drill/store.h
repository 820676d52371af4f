/*
 * Store drills, shared part (store.c): a cluster of `kvferry
 * master` and `kvferry node` child processes, the master's /status, the
 * store traffic worker with self-describing, versioned objects, and
 * one-shot helper processes (the conductor itself never opens a store
 * handle: it must stay single-threaded to fork workers).
 */
#ifndef KVF_TOOLS_DRILL_STORE_H
#define KVF_TOOLS_DRILL_STORE_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/drill/store.h is private to tools/"
#endif

#include "tools/drill/drill.h"

#define KVF_DRILL_NODES_MAX 4
#define KVF_DRILL_LEASE_MS  1000 /* read lease the drills' master grants */
#define KVF_DRILL_LEASE_ARG "1000ms"

typedef struct kvf_drill_cluster {
    /* set before start (0 = default) */
    unsigned replicas;
    unsigned node_ttl_ms;    /* default 1500 */
    unsigned put_timeout_ms; /* default 3000 */
    unsigned high_pct, low_pct;
    uint64_t node_pool;     /* default 32 MiB */
    const char *disk_dir;   /* nodes get a disk tier in DIR/node<i> */
    uint64_t disk_size;     /* its bytes (default 4x the pool) */
    const char *netns;      /* namespace of master and nodes (NULL) */
    char node_listen[48];   /* default 127.0.0.1:0 */
    char master_listen[48]; /* default 127.0.0.1:0 */
    /* filled in */
    pid_t master;
    char master_addr[64];
    char http_addr[64];
    char http_listen[64];
    unsigned nnodes;
    pid_t node[KVF_DRILL_NODES_MAX];
    char node_seg[KVF_DRILL_NODES_MAX][KVF_DRILL_ADDR];
    uint64_t node_base[KVF_DRILL_NODES_MAX];
    kvf_drill_res_t node_snap[2]; /* last node: baseline, after */
    unsigned nsnaps;
} kvf_drill_cluster_t;

/* The master's /status, numbers only (NAN when absent). */
typedef struct kvf_drill_mstatus {
    double nodes, capacity, used, objects, pending, evictions, reclaimed;
    double nodes_lost, objects_lost, puts, hits, misses;
    double leader, term; /* HA: 1 leader, 0 standby, -1 the only one */
    /* disk tiers */
    double disk_only, disk_capacity, tier_reads, tier_writes, tier_corrupt;
    double tiers_off;
} kvf_drill_mstatus_t;

/* The hit rate of the store workers over time (hits.c). */
typedef struct kvf_drill_hits {
    uint64_t hits, all;           /* at the last sample */
    uint64_t next_ms;             /* the next window ends */
    uint64_t base_hits, base_all; /* at begin */
    uint64_t t0_ms, fault_ms;
    double before;  /* % of gets that hit before the fault */
    double low;     /* lowest window after it */
    double back_ms; /* first window back at 90 % of before, -1: never */
} kvf_drill_hits_t;

/* Starts counting (the baseline): from now on every kvf_drill_sleep of
 * the conductor takes a window every 500 ms into the record. */
void kvf_drill_hits_begin(kvf_drill_t *d, kvf_drill_hits_t *h);
/* kvf_drill_sleep (h is d->hits). */
void kvf_drill_hits_sleep(kvf_drill_t *d, kvf_drill_hits_t *h, unsigned ms);
/* The fault happens now: the baseline's rate is what came before. */
void kvf_drill_hits_fault(kvf_drill_t *d, kvf_drill_hits_t *h);
/* Figures into the record; within_ms > 0: checks the comeback. The
 * sampling stops. */
void kvf_drill_hits_report(kvf_drill_t *d, kvf_drill_hits_t *h,
                           double within_ms);

/* Store worker workload (copied into the worker at fork). */
typedef struct kvf_kv_arg {
    const char *prefix; /* key prefix per worker ("w" by default) */
    unsigned keys;      /* key space per worker */
    unsigned min_kb, max_kb;
    unsigned replicas;   /* 0 = the master's default */
    unsigned get_pct;    /* gets (read-through on a miss) */
    unsigned remove_pct; /* removes; the rest are puts */
    int heal_checksum;   /* on KVF_ERR_CHECKSUM: remove and put again */
    int sequential;      /* only puts, each of a new key */
    unsigned pace_us;    /* pause between steps */
    const char *fault;   /* KVF_FAULT for this client's peers */
} kvf_kv_arg_t;

int kvf_drill_cluster_start(kvf_drill_t *d, kvf_drill_cluster_t *c,
                            unsigned nnodes);
void kvf_drill_cluster_stop(kvf_drill_cluster_t *c);
/* (Re)starts the master on listen (a restart passes the old address). */
int kvf_drill_master_start(kvf_drill_t *d, kvf_drill_cluster_t *c,
                           const char *listen);
int kvf_drill_node_start(kvf_drill_t *d, kvf_drill_cluster_t *c, unsigned i);
int kvf_drill_status(kvf_drill_t *d, kvf_drill_cluster_t *c,
                     kvf_drill_mstatus_t *s);
/* Waits until the master counts n nodes; ms waited or -1. */
double kvf_drill_wait_nodes(kvf_drill_t *d, kvf_drill_cluster_t *c, unsigned n,
                            unsigned max_ms);
/* The master's process resources plus objects and allocated pool bytes;
 * the first call also snapshots the last node as the baseline, later
 * calls as "after". */
void kvf_drill_master_res(kvf_drill_t *d, kvf_drill_cluster_t *c,
                          kvf_drill_res_t *res);
/* Waits (at most max_ms) until the last node's fds are back to its
 * baseline (+2): a connection whose FIN was lost in a cut closes only
 * when TCP retransmits it. Returns ms waited, -1 if never, NAN if no
 * baseline. */
double kvf_drill_node_settle(kvf_drill_t *d, kvf_drill_cluster_t *c,
                             unsigned max_ms);
/* Master resources and counters into the record. */
void kvf_drill_store_report(kvf_drill_t *d, kvf_drill_cluster_t *c,
                            const kvf_drill_res_t *mbase,
                            const kvf_drill_res_t *mafter);

/* A store drill's start: the cluster with nnodes nodes and n store
 * workers running a; everything stopped again on failure (-1). */
int kvf_drill_store_begin(kvf_drill_t *d, kvf_drill_cluster_t *c,
                          unsigned nnodes, const kvf_kv_arg_t *a, unsigned n);
/* The baseline phase of a store drill: traffic for the phase length, then
 * with the clients paused their resources, the master's and (s_p not
 * NULL) its status; the clients resume unless keep_paused. */
void kvf_drill_store_baseline(kvf_drill_t *d, kvf_drill_cluster_t *c,
                              kvf_drill_res_t *base, kvf_drill_res_t *mbase,
                              kvf_drill_mstatus_t *s_p, int keep_paused);
/* Starts n store workers (netns NULL = here) and waits until they run. */
int kvf_drill_kv_workers(kvf_drill_t *d, kvf_drill_cluster_t *c,
                         const char *netns, const kvf_kv_arg_t *a, unsigned n);
/* The store worker itself (arg: a kvf_kv_arg_t), for kvf_drill_worker. */
int kvf_drill_kv_main(kvf_drill_t *d, kvf_drill_shared_t *sh, void *arg);
void kvf_drill_kv_key(char *out, size_t len, const kvf_drill_t *d,
                      const kvf_kv_arg_t *a, int worker, unsigned k);
uint64_t kvf_drill_store_bound(const kvf_drill_t *d, unsigned replicas);

/* Objects: size from the key, bytes from (key, version), and the check
 * of a returned object (0 = right; else the wrong bytes). */
uint64_t kvf_drill_obj_size(const char *key, unsigned min_kb, unsigned max_kb);
void kvf_drill_obj_fill(unsigned char *buf, const char *key, uint64_t version,
                        uint64_t size);
uint64_t kvf_drill_obj_check(const unsigned char *buf, size_t len,
                             const char *key, unsigned min_epoch,
                             unsigned char *scratch);

/* Runs fn in a child process (bounded); returns its exit status or -1. */
int kvf_drill_oneshot(kvf_drill_t *d, const char *netns,
                      int (*fn)(kvf_drill_t *d, void *arg), void *arg,
                      unsigned max_ms);
/* Zeroed memory shared with children (never freed: drills are short). */
void *kvf_drill_shared_alloc(size_t len);

int kvf_drill_node_kill(kvf_drill_t *d);
int kvf_drill_client_kill(kvf_drill_t *d);
int kvf_drill_master_restart(kvf_drill_t *d);
/* ha.c: two masters over a real etcd (skipped without etcd) */
int kvf_drill_master_failover(kvf_drill_t *d);
int kvf_drill_etcd_leader_stop(kvf_drill_t *d);
int kvf_drill_etcd_down(kvf_drill_t *d);
int kvf_drill_master_partition(kvf_drill_t *d);
int kvf_drill_corruption(kvf_drill_t *d);
int kvf_drill_cache_clear(kvf_drill_t *d);
int kvf_drill_capacity_pressure(kvf_drill_t *d);
int kvf_drill_store_partition(kvf_drill_t *d);
int kvf_drill_store_slow_link(kvf_drill_t *d);
/* warm.c: a cache that comes back warm */
int kvf_drill_warm_restart(kvf_drill_t *d);
int kvf_drill_dtype_swap(kvf_drill_t *d);
int kvf_drill_disk_corrupt(kvf_drill_t *d);
int kvf_drill_disk_full(kvf_drill_t *d);

#endif
