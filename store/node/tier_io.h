/*
 * A node's disk tier, the device (tier_io.c): the data file opened with
 * O_DIRECT, io_uring (or pread/pwrite) and the aligned staging buffers
 * that objects of the pool go through. tier.c owns one and decides what
 * it moves; this part only moves bytes and checks them.
 */
#ifndef KVF_STORE_NODE_TIER_IO_H
#define KVF_STORE_NODE_TIER_IO_H
#if !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "store/node/tier_io.h is private to store/: use <kvferry/store.h>"
#endif

#include "store/proto/msg.h"

#include <stddef.h>
#include <stdint.h>

#define KVF_TIER_ALIGN 4096u
#define KVF_TIER_CHUNK (1u << 20) /* one staging buffer, one request */
#define KVF_TIER_QD    16         /* requests in flight at once */
#define KVF_TIER_IO_MS 30000      /* a request not done by then fails */

typedef struct kvf_tdev {
    int fd;              /* the data file, O_DIRECT */
    unsigned char *pool; /* the node's pool (borrowed) */
    uint64_t pool_len;
    int uring;
    void *ring;             /* struct io_uring, when uring */
    unsigned char *staging; /* KVF_TIER_QD x KVF_TIER_CHUNK, aligned */
} kvf_tdev_t;

/* Where the device failed: the request, and why. */
typedef struct kvf_tdev_fail {
    int write;
    uint64_t off, len;
    int err; /* errno */
} kvf_tdev_fail_t;

/* Staging buffers and a ring (pread/pwrite where io_uring is refused,
 * with one line). d->fd, d->pool and d->pool_len are set. */
kvf_status_t kvf_tdev_init(kvf_tdev_t *d);
void kvf_tdev_fini(kvf_tdev_t *d);
/* Moves WRITEs and READs ops[0..n) whose status is KVF_OK, a stream of
 * pieces; 0, or -1 with *fail when the device failed (nothing more may be
 * trusted of it). One caller at a time. */
int kvf_tdev_run(kvf_tdev_t *d, kvf_sm_tier_op_t *ops, size_t n,
                 kvf_tdev_fail_t *fail);
/* Checks the pool bytes of the ops of kind op still to do against their
 * checksums (KVF_ERR_CHECKSUM if not): WRITEs before the device, READs
 * after. Any thread: the bytes are the batch's own. */
void kvf_tdev_check(const kvf_tdev_t *d, kvf_sm_tier_op_t *ops, size_t n,
                    uint8_t op);
/* Reads [off, off + size) back in pieces and hashes it in order: 1 if it
 * matches checksum, 0 if not, -1 if the device failed. */
int kvf_tdev_check_entry(kvf_tdev_t *d, uint64_t off, uint64_t size,
                         uint64_t checksum);

#endif
