/*
 * A node's disk tier, the device (tier_io.h): objects move between
 * the pool and the data file in pieces of up to KVF_TIER_CHUNK bytes,
 * each through its own 4 KiB-aligned staging buffer (the pool's objects
 * lie at any 64-byte granule, O_DIRECT needs aligned memory), up to
 * KVF_TIER_QD pieces in flight: submitted together to io_uring and
 * reaped together, or, where io_uring is not allowed (kernel setting
 * io_uring_disabled, a seccomp profile), read and written one by one with
 * pread/pwrite on the same O_DIRECT descriptor. A piece's length is
 * rounded up to 4 KiB; the master allocates the file in 4 KiB units, so
 * the padding stays inside the object's place.
 *
 * A WRITE's bytes are checked against the object's checksum before they
 * go to the device; a READ's once they are in the pool. A failed or
 * short request is reported (tier.c turns the tier off).
 */
#include "store/node/tier_io.h"
#include "core/alloc.h"
#include "core/checksum.h"
#include "core/log.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef KVF_HAVE_URING
#include <liburing.h>
#endif

#define XXH_STATIC_LINKING_ONLY 1 /* XXH3_state_t on the stack */
#include <xxhash.h>

typedef struct kvf_tpiece {
    kvf_sm_tier_op_t *op;
    uint64_t at;  /* offset in the object */
    size_t len;   /* bytes of the object */
    size_t alen;  /* len rounded up to KVF_TIER_ALIGN */
    int write;
    int res;      /* bytes moved, or -errno */
} kvf_tpiece_t;

static size_t kvf_tio_align(size_t n)
{
    return (n + KVF_TIER_ALIGN - 1) & ~(size_t)(KVF_TIER_ALIGN - 1);
}

static unsigned char *kvf_tio_slot(const kvf_tdev_t *t, size_t k)
{
    return t->staging + k * KVF_TIER_CHUNK;
}

kvf_status_t kvf_tdev_init(kvf_tdev_t *t)
{
    t->staging = mmap(NULL, (size_t)KVF_TIER_QD * KVF_TIER_CHUNK,
                      PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                      0);
    if (t->staging == MAP_FAILED) {
        t->staging = NULL;
        return KVF_ERR_NO_MEMORY;
    }
#ifdef KVF_HAVE_URING
    {
        struct io_uring *ring = kvf_calloc(1, sizeof(*ring));
        int rc = ring ? io_uring_queue_init(KVF_TIER_QD, ring, 0) : -ENOMEM;

        if (rc == 0) {
            t->ring = ring;
            t->uring = 1;
            return KVF_OK;
        }
        kvf_free(ring);
        kvf_warn("node: disk tier: io_uring not available (%s): pread/pwrite "
                 "with O_DIRECT instead",
                 strerror(-rc));
    }
#endif
    return KVF_OK;
}

void kvf_tdev_fini(kvf_tdev_t *t)
{
#ifdef KVF_HAVE_URING
    if (t->ring != NULL) {
        io_uring_queue_exit(t->ring);
        kvf_free(t->ring);
        t->ring = NULL;
    }
#endif
    if (t->staging != NULL) {
        munmap(t->staging, (size_t)KVF_TIER_QD * KVF_TIER_CHUNK);
        t->staging = NULL;
    }
}

/* One piece with pread/pwrite, partial transfers continued. */
static int kvf_tio_sync_one(kvf_tdev_t *t, const kvf_tpiece_t *p,
                            unsigned char *buf)
{
    off_t off = (off_t)(p->op->disk_off + p->at);
    size_t done = 0;
    ssize_t n;

    while (done < p->alen) {
        n = p->write ? pwrite(t->fd, buf + done, p->alen - done, off + done)
                     : pread(t->fd, buf + done, p->alen - done, off + done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return n < 0 ? -errno : -EIO;
        }
        done += (size_t)n;
    }
    return (int)done;
}

#ifdef KVF_HAVE_URING
/* Submits pieces p[0..n) to the ring and reaps their completions, each
 * within KVF_TIER_IO_MS. */
static void kvf_tio_uring(kvf_tdev_t *t, kvf_tpiece_t *p, size_t n)
{
    struct __kernel_timespec ts = {.tv_sec = KVF_TIER_IO_MS / 1000};
    struct io_uring *ring = t->ring;
    struct io_uring_cqe *cqe;
    struct io_uring_sqe *sqe;
    size_t k, got = 0;

    for (k = 0; k < n; k++) {
        sqe = io_uring_get_sqe(ring);
        if (p[k].write) {
            io_uring_prep_write(sqe, t->fd, kvf_tio_slot(t, k),
                                (unsigned)p[k].alen,
                                p[k].op->disk_off + p[k].at);
        } else {
            io_uring_prep_read(sqe, t->fd, kvf_tio_slot(t, k),
                               (unsigned)p[k].alen,
                               p[k].op->disk_off + p[k].at);
        }
        io_uring_sqe_set_data64(sqe, k);
        p[k].res = -ETIMEDOUT;
    }
    io_uring_submit(ring);
    while (got < n) {
        if (io_uring_wait_cqe_timeout(ring, &cqe, &ts) != 0) {
            break; /* what is left reports -ETIMEDOUT */
        }
        k = (size_t)io_uring_cqe_get_data64(cqe);
        if (k < n) {
            p[k].res = cqe->res;
        }
        io_uring_cqe_seen(ring, cqe);
        got++;
    }
}
#endif

/* Moves pieces p[0..n) (piece k on staging slot k). Returns 0, or the
 * -errno of the first piece that failed or fell short. */
static int kvf_tio_submit(kvf_tdev_t *t, kvf_tpiece_t *p, size_t n)
{
    size_t k;

#ifdef KVF_HAVE_URING
    if (t->uring) {
        kvf_tio_uring(t, p, n);
    } else
#endif
    {
        for (k = 0; k < n; k++) {
            p[k].res = kvf_tio_sync_one(t, &p[k], kvf_tio_slot(t, k));
        }
    }
    for (k = 0; k < n; k++) {
        if (p[k].res >= 0 && p[k].res < (int)p[k].alen) {
            /* a short transfer: the rest by hand, to learn why (ENOSPC) */
            kvf_tpiece_t rest = p[k];

            rest.at += (uint64_t)p[k].res;
            rest.alen -= (size_t)p[k].res;
            rest.res = kvf_tio_sync_one(t, &rest, kvf_tio_slot(t, k) + p[k].res);
            p[k].res = rest.res < 0 ? rest.res : p[k].res + rest.res;
        }
        if (p[k].res != (int)p[k].alen) {
            return p[k].res < 0 ? p[k].res : -EIO;
        }
    }
    return 0;
}

/* The next piece of ops from ops[*i] at offset *at into *p, on staging
 * slot k (a WRITE's bytes staged now); 0 when no piece is left. */
static int kvf_tio_fill_one(kvf_tdev_t *t, kvf_sm_tier_op_t *ops, size_t n,
                            size_t *i, uint64_t *at, kvf_tpiece_t *p, size_t k)
{
    kvf_sm_tier_op_t *o;

    while (*i < n && ops[*i].status != KVF_OK) {
        (*i)++;
        *at = 0;
    }
    if (*i == n) {
        return 0;
    }
    o = &ops[*i];
    p->op = o;
    p->at = *at;
    p->len = o->size - *at < KVF_TIER_CHUNK ? (size_t)(o->size - *at)
                                            : KVF_TIER_CHUNK;
    p->alen = kvf_tio_align(p->len);
    p->write = o->op == KVF_TIER_WRITE;
    if (p->write) {
        memcpy(kvf_tio_slot(t, k), t->pool + o->pool_off + *at, p->len);
        memset(kvf_tio_slot(t, k) + p->len, 0, p->alen - p->len);
    }
    *at += p->len;
    if (*at == o->size) {
        (*i)++;
        *at = 0;
    }
    return 1;
}

/* Fills up to KVF_TIER_QD pieces (piece k on slot k). Returns their
 * number. */
static size_t kvf_tio_fill(kvf_tdev_t *t, kvf_sm_tier_op_t *ops, size_t n,
                           size_t *i, uint64_t *at, kvf_tpiece_t *p)
{
    size_t k = 0;

    while (k < KVF_TIER_QD && kvf_tio_fill_one(t, ops, n, i, at, &p[k], k)) {
        k++;
    }
    return k;
}

#ifdef KVF_HAVE_URING
/* A completed piece (res as the ring gave it): a short transfer is
 * finished by hand (to learn why, ENOSPC), a READ's bytes go to the
 * pool. Returns the bytes moved, or -errno. */
static int kvf_tio_finish(kvf_tdev_t *t, kvf_tpiece_t *p, size_t k, int res)
{
    if (res >= 0 && res < (int)p->alen) {
        kvf_tpiece_t rest = *p;

        rest.at += (uint64_t)res;
        rest.alen -= (size_t)res;
        rest.res = kvf_tio_sync_one(t, &rest, kvf_tio_slot(t, k) + res);
        res = rest.res < 0 ? rest.res : res + rest.res;
    }
    p->res = res;
    if (res == (int)p->alen && !p->write) {
        memcpy(t->pool + p->op->pool_off + p->at, kvf_tio_slot(t, k), p->len);
    }
    return res;
}
#endif

/* The device failed under pieces p: which one, and every operation not
 * done yet fails. */
static void kvf_tio_failed(const kvf_tpiece_t *p, size_t np, int err,
                           kvf_sm_tier_op_t *ops, size_t n,
                           kvf_tdev_fail_t *fail)
{
    size_t k;

    for (k = 0; k < np && p[k].res == (int)p[k].alen; k++) {
    }
    if (k == np) {
        k = 0;
    }
    fail->write = p[k].write;
    fail->off = p[k].op->disk_off + p[k].at;
    fail->len = p[k].alen;
    fail->err = -err;
    for (k = 0; k < n; k++) {
        if (ops[k].status == KVF_OK) {
            ops[k].status = KVF_ERR_IO;
        }
    }
}

#ifdef KVF_HAVE_URING
/* Queues piece p (its bytes on slot k) on the ring. */
static void kvf_tio_prep(kvf_tdev_t *t, const kvf_tpiece_t *p, size_t k)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(t->ring);

    if (p->write) {
        io_uring_prep_write(sqe, t->fd, kvf_tio_slot(t, k), (unsigned)p->alen,
                            p->op->disk_off + p->at);
    } else {
        io_uring_prep_read(sqe, t->fd, kvf_tio_slot(t, k), (unsigned)p->alen,
                           p->op->disk_off + p->at);
    }
    io_uring_sqe_set_data64(sqe, k);
}

/* The pieces of ops through the ring as a stream: a slot freed by one
 * completion takes the next piece at once, so the device always has
 * KVF_TIER_QD requests while pieces remain. Returns 0, or the -errno of
 * the piece in *bad that failed. */
static int kvf_tio_stream(kvf_tdev_t *t, kvf_sm_tier_op_t *ops, size_t n,
                          kvf_tpiece_t *bad)
{
    struct __kernel_timespec ts = {.tv_sec = KVF_TIER_IO_MS / 1000};
    kvf_tpiece_t p[KVF_TIER_QD];
    size_t freeslot[KVF_TIER_QD], nfree = KVF_TIER_QD, k, i = 0;
    struct io_uring_cqe *cqe;
    unsigned inflight = 0;
    uint64_t at = 0;
    int res;

    for (k = 0; k < KVF_TIER_QD; k++) {
        freeslot[k] = KVF_TIER_QD - 1 - k;
    }
    for (;;) {
        while (nfree > 0) {
            k = freeslot[nfree - 1];
            if (kvf_tio_fill_one(t, ops, n, &i, &at, &p[k], k) == 0) {
                break;
            }
            nfree--;
            kvf_tio_prep(t, &p[k], k);
            inflight++;
        }
        if (inflight == 0) {
            return 0;
        }
        io_uring_submit(t->ring);
        if (io_uring_wait_cqe_timeout(t->ring, &cqe, &ts) != 0) {
            *bad = p[freeslot[0]]; /* any of them: the device hangs */
            return -ETIMEDOUT;
        }
        k = (size_t)io_uring_cqe_get_data64(cqe);
        res = cqe->res;
        io_uring_cqe_seen(t->ring, cqe);
        inflight--;
        res = kvf_tio_finish(t, &p[k], k, res);
        if (res != (int)p[k].alen) {
            *bad = p[k];
            return res < 0 ? res : -EIO;
        }
        freeslot[nfree++] = k;
    }
}
#endif

void kvf_tdev_check(const kvf_tdev_t *t, kvf_sm_tier_op_t *ops, size_t n,
                    uint8_t op)
{
    size_t k;

    for (k = 0; k < n; k++) {
        if (ops[k].status == KVF_OK && ops[k].op == op &&
            kvf_checksum(t->pool + ops[k].pool_off, ops[k].size) !=
                ops[k].checksum) {
            ops[k].status = KVF_ERR_CHECKSUM;
        }
    }
}

int kvf_tdev_run(kvf_tdev_t *t, kvf_sm_tier_op_t *ops, size_t n,
                 kvf_tdev_fail_t *fail)
{
    kvf_tpiece_t p[KVF_TIER_QD];
    uint64_t at = 0;
    size_t i = 0, k, np;
    int err = 0;

#ifdef KVF_HAVE_URING
    if (t->uring) {
        err = kvf_tio_stream(t, ops, n, &p[0]);
        np = 1;
    } else
#endif
    {
        while (err == 0 && (np = kvf_tio_fill(t, ops, n, &i, &at, p)) > 0) {
            err = kvf_tio_submit(t, p, np);
            for (k = 0; err == 0 && k < np; k++) {
                if (!p[k].write) {
                    memcpy(t->pool + p[k].op->pool_off + p[k].at,
                           kvf_tio_slot(t, k), p[k].len);
                }
            }
        }
    }
    if (err != 0) {
        kvf_tio_failed(p, np, err, ops, n, fail);
        return -1;
    }
    return 0;
}

int kvf_tdev_check_entry(kvf_tdev_t *t, uint64_t off, uint64_t size,
                         uint64_t checksum)
{
    kvf_sm_tier_op_t op = {0};
    kvf_tpiece_t p[KVF_TIER_QD];
    XXH3_state_t hs;
    uint64_t at = 0;
    size_t k, np;

    op.op = KVF_TIER_READ;
    op.disk_off = off;
    op.size = size;
    XXH3_INITSTATE(&hs);
    XXH3_64bits_reset(&hs);
    while (at < size) {
        for (np = 0; np < KVF_TIER_QD && at < size; np++) {
            p[np].op = &op;
            p[np].at = at;
            p[np].len = size - at < KVF_TIER_CHUNK ? (size_t)(size - at)
                                                   : KVF_TIER_CHUNK;
            p[np].alen = kvf_tio_align(p[np].len);
            p[np].write = 0;
            at += p[np].len;
        }
        if (kvf_tio_submit(t, p, np) != 0) {
            return -1;
        }
        for (k = 0; k < np; k++) {
            XXH3_64bits_update(&hs, kvf_tio_slot(t, k), p[k].len);
        }
    }
    return XXH3_64bits_digest(&hs) == checksum;
}
