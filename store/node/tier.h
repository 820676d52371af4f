/*
 * A storage node's disk tier: one data file in a directory the node is
 * given (`--disk DIR --disk-size N`), read and written with O_DIRECT
 * through io_uring (pread/pwrite on a thread where io_uring is not
 * allowed), and a manifest that says which object lies where, so a node
 * restarted on the same directory offers its objects again.
 *
 * The master owns the placement: it allocates each object's place in the
 * file (4 KiB aligned, sizes rounded up to 4 KiB) and tells the node what
 * to do, one batch of operations at a time (store/proto TIER_OP):
 *  - WRITE: copy the object from the pool (pool_off, size) to the file
 *    (disk_off), after checking its bytes against its checksum (bytes
 *    that do not match are never written);
 *  - READ: copy it back from the file into the pool and check it against
 *    its checksum (KVF_ERR_CHECKSUM: the entry is dropped and counted; the
 *    master never hands out the pool bytes);
 *  - DROP: forget the entry (removed or evicted from the disk).
 * Pieces of up to 1 MiB go through aligned staging buffers, up to the
 * queue depth in flight at once.
 *
 * Every write and drop is recorded in the manifest (DIR/tier.manifest):
 * records with a hash each, appended after the data is on the device. At
 * start the manifest is replayed (a damaged record is skipped and
 * counted; the log is then written anew with the live entries), and
 * every entry's data is read back and checked against its checksum
 * before it is offered (a damaged one is dropped and counted).
 *
 * A disk that fails or fills (an I/O error, ENOSPC) turns the tier off
 * with one error line naming the file, the operation and the cause: from
 * then on every operation is answered KVF_ERR_IO and the master drops the
 * node's disk copies. Never a wrong byte: reads are checked.
 */
#ifndef KVF_STORE_NODE_TIER_H
#define KVF_STORE_NODE_TIER_H
#if !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "store/node/tier.h is private to store/: use <kvferry/store.h>"
#endif

#include "store/proto/inv.h"
#include "store/proto/msg.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kvf_tier kvf_tier_t;

typedef struct kvf_tier_stats {
    uint64_t writes, write_bytes;
    uint64_t reads, read_bytes;
    uint64_t drops;
    uint64_t corrupt;     /* reads whose bytes failed their checksum */
    uint64_t bad_records; /* manifest records skipped at start */
    uint64_t bad_objects; /* entries whose data failed at start */
    uint64_t restored;    /* entries offered again at start */
    size_t entries;
    int on;
} kvf_tier_stats_t;

/* Opens (creating if need be) the tier in dir with a data file of size
 * bytes (rounded down to KVF_TIER_ALIGN) over the node's pool; replays
 * and checks the manifest unless the directory is new. verify: read
 * every restored entry back and check it. Fails (logged) when the
 * directory cannot be used (not a directory, taken by another node,
 * O_DIRECT refused). */
kvf_status_t kvf_tier_open(const char *dir, uint64_t size, void *pool,
                           uint64_t pool_len, int verify, kvf_tier_t **tier_p);
void kvf_tier_close(kvf_tier_t *t);

uint64_t kvf_tier_len(const kvf_tier_t *t);
int kvf_tier_uses_uring(const kvf_tier_t *t);
void kvf_tier_stats(kvf_tier_t *t, kvf_tier_stats_t *s);

/* Runs a batch of operations in order (writes and reads batched on the
 * device); each op's status in ops[i].status. */
void kvf_tier_run(kvf_tier_t *t, kvf_sm_tier_op_t *ops, size_t n);

/* Encodes the entries at disk offset *from onwards, at most max of them,
 * as inventory entries flagged KVF_SM_INV_DISK; returns their count and
 * moves *from past them. */
uint32_t kvf_tier_page(kvf_tier_t *t, kvf_wr_t *w, uint64_t *from,
                       uint32_t max);

#endif
