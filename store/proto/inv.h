/*
 * Object inventory of one node's pool: which committed objects lie where
 * (key, offset from the pool's base, size, checksum) and the epoch of
 * the leader that recorded each. A node keeps one so that a new leader
 * can rebuild its key -> location map from the nodes after a failover;
 * a leader fills one per node from what the node reports, with the same
 * checks, before it allocates each entry at its offset.
 *
 * Rules (kvf_inv_put):
 *  - an entry lies inside the pool (offset + size <= pool_len, no
 *    wrap-around) and has a key of 1..KVF_STORE_KEY_MAX bytes and a size
 *    above 0; anything else is refused (KVF_ERR_INVALID_PARAM);
 *  - KVF_INV_RECORD (a node, from its leader): an epoch older than the
 *    newest seen is refused (KVF_ERR_STALE: fencing of a deposed
 *    leader); an entry overlapping older or equal-epoch ones replaces
 *    them (the leader reused that space, so they are gone);
 *  - KVF_INV_REPORT (a leader, from a node's report): an entry
 *    overlapping one as new or newer (epoch, then seq) is refused
 *    (KVF_ERR_EXISTS); overlapping only older ones, it replaces them.
 * Entries never overlap one another; they are kept in offset order.
 * Not thread-safe: the owner locks.
 */
#ifndef KVF_STORE_INV_H
#define KVF_STORE_INV_H
#if !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "store/proto/inv.h is private to store/: use <kvferry/store.h>"
#endif

#include "store/proto/proto.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kvf_inv_ent {
    char *key; /* owned, NUL-terminated */
    uint64_t off;
    uint64_t size;
    uint64_t checksum;
    uint64_t epoch;
    uint64_t seq;  /* the leader's commit number: orders one epoch's */
    uint8_t flags; /* KVF_STORE_PIN */
} kvf_inv_ent_t;

typedef struct kvf_inv {
    uint64_t pool_len;
    uint64_t max_epoch; /* newest epoch seen (fence) */
    kvf_inv_ent_t *ent; /* by offset */
    size_t n, cap;
    uint64_t dropped; /* entries replaced by overlapping newer ones */
} kvf_inv_t;

enum { KVF_INV_RECORD = 0, KVF_INV_REPORT = 1 };

void kvf_inv_init(kvf_inv_t *inv, uint64_t pool_len);
void kvf_inv_fini(kvf_inv_t *inv);

/* Fencing: KVF_ERR_STALE if epoch is older than the newest seen, else
 * KVF_OK (and epoch becomes the newest seen). */
kvf_status_t kvf_inv_fence(kvf_inv_t *inv, uint64_t epoch);

/* Adds an entry (the key is copied) under the rules above. */
kvf_status_t kvf_inv_put(kvf_inv_t *inv, int mode, const char *key,
                         uint64_t off, uint64_t size, uint64_t checksum,
                         uint64_t epoch, uint64_t seq, uint8_t flags);

/* Removes the entry at off if its key is key (a remove or an eviction
 * by the leader of epoch `epoch`, fenced as kvf_inv_fence).
 * KVF_ERR_NOT_FOUND if there is none. */
kvf_status_t kvf_inv_del(kvf_inv_t *inv, const char *key, uint64_t off,
                         uint64_t epoch);

/* Index of the first entry at or after offset `from` (inv->n if none),
 * for reports in pages: entries [i, i + page) then from = last off + 1. */
size_t kvf_inv_seek(const kvf_inv_t *inv, uint64_t from);

#endif
