/*
 * The store's storage node (interface for `kvferry node`): a memory pool
 * registered with a transfer engine (the node is an engine target; clients
 * read and write its pool directly), announced to the master with the
 * segment name and the pool's address and size, and kept alive by
 * heartbeats. When the master restarts or forgets the node (its epoch or
 * the node's generation no longer match), the node registers again and
 * its pool counts as empty: the master never serves locations from an
 * earlier registration. With a disk tier (tier.h), objects the master
 * evicts from the pool stay on disk, and a node restarted on the same
 * directory reports them again after it registers.
 */
#ifndef KVF_STORE_NODE_H
#define KVF_STORE_NODE_H
#if !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "store/node/node.h is private to store/: use <kvferry/store.h>"
#endif

#include <kvferry/store.h>

typedef struct kvf_node kvf_node_t;

typedef struct kvf_node_opts {
    const char *master;     /* master "host:port" */
    const char *listen;     /* engine "host:port" (port 0 = any) */
    uint64_t pool;          /* pool bytes */
    uint64_t claim;         /* bytes told to the master; 0 = pool (a larger
                               claim is a lie the master must refuse) */
    const char *transports; /* engine transports (NULL = auto) */
    int anon;               /* private anonymous pool (else shareable,
                               kvf_mem_alloc) */
    int lazy;               /* do not fault the pool in at start */
    unsigned timeout_ms;    /* bound on every wait */
    const char *disk;       /* disk tier directory (NULL: none, tier.h) */
    uint64_t disk_size;     /* bytes of its data file */
} kvf_node_opts_t;

/* Maps and registers the pool, starts the engine, and registers with the
 * master; fails if the first registration fails (master unreachable
 * within the timeout, or the claim refused). */
kvf_status_t kvf_node_start(const kvf_node_opts_t *opts, kvf_node_t **node_p);
void kvf_node_stop(kvf_node_t *node);

const char *kvf_node_segment(const kvf_node_t *node);
void *kvf_node_pool(const kvf_node_t *node);
/* The node's disk tier (tier.h), or NULL. */
struct kvf_tier *kvf_node_tier(const kvf_node_t *n);
/* Objects in the node's inventory (0 with a single master). */
size_t kvf_node_inventory(const kvf_node_t *n);
/* Registrations so far (1 after start; more after master restarts). */
unsigned kvf_node_registrations(const kvf_node_t *node);

#endif
