/*
 * A storage node's inventory server: the node's record of its committed
 * objects (store/proto/inv.h), filled by the leader before it
 * acknowledges a commit (INV_ADD on a connection the leader opens to
 * this server, authenticated like every store connection) and sent to a
 * new leader after the node registers with it (INV_REPORT pages on the
 * node's master connection), so committed objects survive a failover.
 * Every INV_ADD / INV_DEL entry carries its leader's epoch; one older
 * than the newest this node has seen is refused (KVF_ERR_STALE).
 * The same server applies the master's TIER_OP frames to the node's
 * disk tier (tier.h), and a report carries the tier's entries too.
 */
#ifndef KVF_STORE_NODE_INVENTORY_H
#define KVF_STORE_NODE_INVENTORY_H
#if !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "store/node/inventory.h is private to store/: use <kvferry/store.h>"
#endif

#include "store/proto/inv.h"
#include "store/proto/msg.h"

typedef struct kvf_node_inv kvf_node_inv_t;

/* Listens on host (port chosen by the system) for up to a few leader
 * connections, and names itself adv_host:port (the host masters reach
 * the node by); timeout_ms bounds each exchange. */
kvf_status_t kvf_node_inv_start(const char *host, const char *adv_host,
                                uint64_t pool_len, unsigned timeout_ms,
                                kvf_node_inv_t **inv_p);
void kvf_node_inv_stop(kvf_node_inv_t *ni);
/* "host:port" the server listens on. */
const char *kvf_node_inv_addr(const kvf_node_inv_t *ni);
/* Raises the newest epoch seen (a registration's), or KVF_ERR_STALE. */
kvf_status_t kvf_node_inv_fence(kvf_node_inv_t *ni, uint64_t epoch);
/* Entries held. */
size_t kvf_node_inv_count(kvf_node_inv_t *ni);
/* Sends the inventory to the master on fd as INV_REPORT pages (the
 * pool's entries when inv_on, then those of the disk tier), then the
 * empty page that ends it; each call bounded by timeout_ms. */
kvf_status_t kvf_node_inv_report(kvf_node_inv_t *ni, int inv_on, int fd,
                                 kvf_wire_mac_t *mac, uint64_t uid,
                                 uint64_t gen, uint64_t *next_id,
                                 kvf_sp_frame_t *f, unsigned timeout_ms);
/* The disk tier whose TIER_OP frames this server applies (borrowed; set
 * before the node registers). */
struct kvf_tier;
void kvf_node_inv_set_tier(kvf_node_inv_t *ni, struct kvf_tier *tier);

#endif
