/*
 * The device's own ceiling for a store node's disk tier, measured the
 * way the tier uses it (fio-style, no kvferry code in the path): a file
 * in the directory given, written sequentially, then read at random
 * offsets, with O_DIRECT, requests of KVF_ENV_DISK_BLOCK bytes (and, for
 * a workload, once more in the requests a tier makes for its objects),
 * KVF_ENV_DISK_QD of them in flight through io_uring (or pread/pwrite
 * one at a time where io_uring is not allowed). The file is removed
 * afterwards. `bench env --disk DIR` prints it; `bench store
 * --working-set` measures it in the same run as the store.
 */
#include "tools/bench/env.h"
#include "core/time.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#ifdef KVF_HAVE_URING
#include <liburing.h>
#endif

/* The requests of one pass: request k moves len[k] bytes (len NULL:
 * KVF_ENV_DISK_BLOCK each) at offset off[k] of the file. */
typedef struct kvf_env_reqs {
    uint64_t *off;
    uint32_t *len;
    unsigned n;
} kvf_env_reqs_t;

static uint32_t kvf_env_req_len(const kvf_env_reqs_t *q, unsigned k)
{
    return q->len != NULL ? q->len[k] : KVF_ENV_DISK_BLOCK;
}

#ifdef KVF_HAVE_URING
/* The pass through io_uring, QD requests in flight (each on a slot of
 * buf; a slot may serve two requests at once when they complete out of
 * order: their bytes do not matter here). Bytes moved, or -errno. */
static long long kvf_env_disk_ring(struct io_uring *ring, int fd,
                                   unsigned char *buf, int write,
                                   const kvf_env_reqs_t *q)
{
    struct io_uring_cqe *cqe;
    unsigned sub = 0, done = 0;
    long long moved = 0;
    uint32_t len;

    while (done < q->n) {
        while (sub < q->n && sub - done < KVF_ENV_DISK_QD) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
            unsigned char *at = buf + (size_t)(sub % KVF_ENV_DISK_QD) *
                                          KVF_ENV_DISK_BLOCK;

            len = kvf_env_req_len(q, sub);
            if (write) {
                io_uring_prep_write(sqe, fd, at, len, q->off[sub]);
            } else {
                io_uring_prep_read(sqe, fd, at, len, q->off[sub]);
            }
            io_uring_sqe_set_data64(sqe, sub);
            sub++;
        }
        io_uring_submit(ring);
        if (io_uring_wait_cqe(ring, &cqe) != 0) {
            return -EIO;
        }
        len = kvf_env_req_len(q, (unsigned)io_uring_cqe_get_data64(cqe));
        if (cqe->res != (int)len) {
            int err = cqe->res < 0 ? -cqe->res : EIO;

            io_uring_cqe_seen(ring, cqe);
            return -err;
        }
        io_uring_cqe_seen(ring, cqe);
        moved += len;
        done++;
    }
    return moved;
}
#endif

/* Moves the requests of q, QD at a time through io_uring, else one by
 * one (*uring set to 0). Returns the bytes moved, or -errno. */
static long long kvf_env_disk_io(int fd, unsigned char *buf, int write,
                                 const kvf_env_reqs_t *q, int *uring)
{
    long long moved = 0;
    unsigned k;
    ssize_t r;

#ifdef KVF_HAVE_URING
    struct io_uring ring;

    if (*uring && io_uring_queue_init(KVF_ENV_DISK_QD, &ring, 0) == 0) {
        moved = kvf_env_disk_ring(&ring, fd, buf, write, q);
        io_uring_queue_exit(&ring);
        return moved;
    }
#endif
    *uring = 0;
    for (k = 0; k < q->n; k++) {
        uint32_t len = kvf_env_req_len(q, k);

        r = write ? pwrite(fd, buf, len, (off_t)q->off[k])
                  : pread(fd, buf, len, (off_t)q->off[k]);
        if (r != (ssize_t)len) {
            return r < 0 ? -errno : -EIO;
        }
        moved += len;
    }
    return moved;
}

/* The file system's device ("/dev/vda", or major:minor). */
static void kvf_env_disk_dev(const char *dir, char *out, size_t cap)
{
    char line[512], dev[256], mnt[256], best[256] = "";
    size_t bestlen = 0, l;
    FILE *f = fopen("/proc/self/mounts", "r");
    char real[PATH_MAX];

    snprintf(out, cap, "unknown");
    if (f == NULL || realpath(dir, real) == NULL) {
        if (f != NULL) {
            fclose(f);
        }
        return;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "%255s %255s", dev, mnt) != 2) {
            continue;
        }
        l = strlen(mnt);
        if (strncmp(real, mnt, l) == 0 &&
            (real[l] == '/' || real[l] == '\0' || l == 1) && l >= bestlen) {
            bestlen = l;
            snprintf(best, sizeof(best), "%.120s (%.120s)", dev, mnt);
        }
    }
    fclose(f);
    if (best[0] != '\0') {
        snprintf(out, cap, "%s", best);
    }
}

static uint64_t kvf_env_rng(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* A permutation of the file's blocks (fixed seed: the same every run). */
static void kvf_env_disk_shuffle(uint64_t *offs, unsigned n)
{
    uint64_t x = 0x9e3779b97f4a7c15ull, t;
    unsigned i, j;

    for (i = 0; i < n; i++) {
        offs[i] = (uint64_t)i * KVF_ENV_DISK_BLOCK;
    }
    for (i = n; i > 1; i--) {
        j = (unsigned)(kvf_env_rng(&x) % i);
        t = offs[i - 1];
        offs[i - 1] = offs[j];
        offs[j] = t;
    }
}

/* The requests a disk tier makes reading objects drawn from mix (n
 * sizes) until file bytes were read: each object at a random 4 KiB
 * place, in pieces of at most KVF_ENV_DISK_BLOCK rounded up to 4 KiB.
 * 0, or -1 out of memory. */
static int kvf_env_disk_mix(uint64_t file, const uint64_t *mix, size_t n,
                            kvf_env_reqs_t *q)
{
    uint64_t x = 0x2545f4914f6cdd1dull, total = 0, size, at, room;
    unsigned cap = (unsigned)(file / 4096) + 1;

    q->n = 0;
    q->off = calloc(cap, sizeof(*q->off));
    q->len = calloc(cap, sizeof(*q->len));
    if (q->off == NULL || q->len == NULL) {
        return -1;
    }
    while (total < file && q->n < cap) {
        size = (mix[kvf_env_rng(&x) % n] + 4095) & ~4095ull;
        size = size < 4096 ? 4096 : (size > file ? file : size);
        room = (file - size) / 4096 + 1;
        at = (kvf_env_rng(&x) % room) * 4096;
        for (uint64_t p = 0; p < size && q->n < cap; p += KVF_ENV_DISK_BLOCK) {
            q->off[q->n] = at + p;
            q->len[q->n] = (uint32_t)(size - p < KVF_ENV_DISK_BLOCK
                                          ? size - p
                                          : KVF_ENV_DISK_BLOCK);
            total += q->len[q->n++];
        }
    }
    return 0;
}

/* One timed pass of q: its rate in 10^9 bytes/s (*moved_p: bytes or
 * -errno). */
static double kvf_env_disk_pass(int fd, unsigned char *buf, int write,
                                const kvf_env_reqs_t *q, int *uring,
                                long long *moved_p)
{
    uint64_t t0 = kvf_time_ns();

    *moved_p = kvf_env_disk_io(fd, buf, write, q, uring);
    if (*moved_p > 0 && write && fdatasync(fd) != 0) {
        *moved_p = -errno;
    }
    return *moved_p > 0 ? (double)*moved_p / (double)(kvf_time_ns() - t0)
                        : 0;
}

/* The reads of a workload's sizes (mix), after the 1 MiB passes. */
static long long kvf_env_disk_mix_pass(int fd, unsigned char *buf,
                                       const uint64_t *mix, size_t n,
                                       kvf_env_disk_t *d)
{
    kvf_env_reqs_t q = {0};
    long long moved = -ENOMEM;

    if (kvf_env_disk_mix(d->file_bytes, mix, n, &q) == 0) {
        d->read_mix_gbs = kvf_env_disk_pass(fd, buf, 0, &q, &d->uring, &moved);
    }
    free(q.off);
    free(q.len);
    return moved;
}

int kvf_env_disk_measure(const char *dir, uint64_t bytes, const uint64_t *mix,
                         size_t nmix, kvf_env_disk_t *d)
{
    unsigned n = (unsigned)(bytes / KVF_ENV_DISK_BLOCK), i;
    size_t blen = (size_t)KVF_ENV_DISK_QD * KVF_ENV_DISK_BLOCK;
    kvf_env_reqs_t q = {.n = n};
    unsigned char *buf;
    long long moved;
    int fd;

    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "%s", dir);
    kvf_env_disk_dev(dir, d->dev, sizeof(d->dev));
    d->uring = 1;
    d->file_bytes = (uint64_t)n * KVF_ENV_DISK_BLOCK;
    snprintf(d->path, sizeof(d->path), "%s/.kvferry-odirect-%d", dir,
             (int)getpid());
    fd = open(d->path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
    if (n == 0 || fd < 0) {
        snprintf(d->err, sizeof(d->err), "cannot open %.180s with O_DIRECT: %.60s",
                 d->path, n == 0 ? "size under one block" : strerror(errno));
        return -1;
    }
    buf = mmap(NULL, blen, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    q.off = calloc(n, sizeof(*q.off));
    if (buf == MAP_FAILED || q.off == NULL) {
        close(fd);
        unlink(d->path);
        free(q.off);
        snprintf(d->err, sizeof(d->err), "out of memory");
        return -1;
    }
    for (i = 0; i < blen; i++) {
        buf[i] = (unsigned char)(i * 131 + 7); /* not zeros: no shortcuts */
    }
    for (i = 0; i < n; i++) {
        q.off[i] = (uint64_t)i * KVF_ENV_DISK_BLOCK;
    }
    d->write_gbs = kvf_env_disk_pass(fd, buf, 1, &q, &d->uring, &moved);
    if (moved > 0) {
        kvf_env_disk_shuffle(q.off, n);
        d->read_gbs = kvf_env_disk_pass(fd, buf, 0, &q, &d->uring, &moved);
    }
    if (moved > 0 && mix != NULL && nmix > 0) {
        moved = kvf_env_disk_mix_pass(fd, buf, mix, nmix, d);
    }
    if (moved <= 0) {
        snprintf(d->err, sizeof(d->err), "O_DIRECT I/O in %.180s failed: %.60s", dir,
                 strerror(moved < 0 ? (int)-moved : EIO));
    }
    munmap(buf, blen);
    free(q.off);
    close(fd);
    unlink(d->path);
    return moved > 0 ? 0 : -1;
}

double kvf_env_disk_read_ceiling(const kvf_env_disk_t *d)
{
    return d->read_mix_gbs > 0 ? d->read_mix_gbs : d->read_gbs;
}

void kvf_env_disk_text(const kvf_env_disk_t *d, char *out, size_t cap)
{
    if (d->err[0] != '\0') {
        snprintf(out, cap, "not measured: %s", d->err);
        return;
    }
    char mix[96] = "";

    if (d->read_mix_gbs > 0) {
        snprintf(mix, sizeof(mix), ", read %.2f GB/s at the workload's sizes",
                 d->read_mix_gbs);
    }
    snprintf(out, cap,
             "O_DIRECT read %.2f GB/s (random), write %.2f GB/s "
             "(sequential); %u KiB requests, %u in flight, %s%s; %.0f MiB "
             "file in %s on %s",
             d->read_gbs, d->write_gbs, KVF_ENV_DISK_BLOCK >> 10,
             d->uring ? KVF_ENV_DISK_QD : 1u,
             d->uring ? "io_uring" : "pread/pwrite", mix,
             (double)d->file_bytes / (1 << 20), d->dir, d->dev);
}
