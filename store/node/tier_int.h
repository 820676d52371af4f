/*
 * A node's disk tier, private: the state tier.c (index, manifest) and
 * tier_io.c (the device: io_uring or pread/pwrite, staging buffers)
 * share.
 */
#ifndef KVF_STORE_NODE_TIER_INT_H
#define KVF_STORE_NODE_TIER_INT_H

#include "store/node/tier.h"

#include <pthread.h>

#define KVF_TIER_PATH_MAX 512
#define KVF_TIER_CHUNK    (1u << 20) /* one staging buffer, one request */
#define KVF_TIER_QD       16         /* requests in flight at once */
#define KVF_TIER_IO_MS    30000      /* a request not done by then fails */

struct kvf_tier {
    char dir[KVF_TIER_PATH_MAX];
    uint64_t len;        /* bytes of the data file */
    unsigned char *pool; /* the node's pool (borrowed) */
    uint64_t pool_len;
    int lockfd, dfd, mfd;
    pthread_mutex_t io_lock; /* one batch on the device at a time */
    pthread_mutex_t lock;    /* idx, st, on, the manifest */
    kvf_inv_t idx;           /* entries by offset in the data file */
    kvf_tier_stats_t st;
    int on;
    /* manifest records of the batch under way */
    unsigned char *mbuf;
    size_t mbuf_len, mbuf_cap;
    int mbuf_failed;
    uint64_t appended; /* records in the manifest file */
    /* the device (tier_io.c) */
    int uring;
    void *ring;             /* struct io_uring, when uring */
    unsigned char *staging; /* KVF_TIER_QD x KVF_TIER_CHUNK, aligned */
};

/* tier.c: turns the tier off (once) with one error line. */
void kvf_tier_off(kvf_tier_t *t, const char *what, uint64_t off, uint64_t len,
                  int err);

/* tier_io.c */
kvf_status_t kvf_tier_io_init(kvf_tier_t *t);
void kvf_tier_io_fini(kvf_tier_t *t);
/* Runs WRITEs and READs ops[0..n) (their status KVF_OK going in means
 * "to do") on the device, a queue of pieces at a time; sets each one's
 * status (a READ whose bytes fail the checksum: KVF_ERR_CHECKSUM). An
 * I/O error turns the tier off. io_lock held. */
void kvf_tier_io_run(kvf_tier_t *t, kvf_sm_tier_op_t *ops, size_t n);
/* Reads every entry of the index back and drops (counting them) those
 * whose bytes fail their checksum. At open. */
void kvf_tier_io_verify(kvf_tier_t *t);

#endif
