/*
 * The device's own ceiling for a store node's disk tier, measured the
 * way the tier uses it (fio-style, no kvferry code in the path): a file
 * in the directory given, written sequentially, then read at random
 * offsets, with O_DIRECT, requests of KVF_ENV_DISK_BLOCK bytes,
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

/* Moves n blocks (block b of the file at offs[b]), QD at a time. Returns
 * the bytes moved, or -errno. */
static long long kvf_env_disk_io(int fd, unsigned char *buf, int write,
                                 const uint64_t *offs, unsigned n, int *uring)
{
    unsigned k, done = 0;
    ssize_t r;

#ifdef KVF_HAVE_URING
    struct io_uring ring;

    if (*uring && io_uring_queue_init(KVF_ENV_DISK_QD, &ring, 0) == 0) {
        struct io_uring_cqe *cqe;
        unsigned sub = 0, slot;
        int err = 0;

        while (done < n && err == 0) {
            while (sub < n && sub - done < KVF_ENV_DISK_QD) {
                struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);

                slot = sub % KVF_ENV_DISK_QD;
                if (write) {
                    io_uring_prep_write(sqe, fd,
                                        buf + (size_t)slot * KVF_ENV_DISK_BLOCK,
                                        KVF_ENV_DISK_BLOCK, offs[sub]);
                } else {
                    io_uring_prep_read(sqe, fd,
                                       buf + (size_t)slot * KVF_ENV_DISK_BLOCK,
                                       KVF_ENV_DISK_BLOCK, offs[sub]);
                }
                sub++;
            }
            io_uring_submit(&ring);
            if (io_uring_wait_cqe(&ring, &cqe) != 0) {
                err = EIO;
                break;
            }
            if (cqe->res != (int)KVF_ENV_DISK_BLOCK) {
                err = cqe->res < 0 ? -cqe->res : EIO;
            }
            io_uring_cqe_seen(&ring, cqe);
            done++;
        }
        io_uring_queue_exit(&ring);
        return err ? -err : (long long)done * KVF_ENV_DISK_BLOCK;
    }
#endif
    *uring = 0;
    for (k = 0; k < n; k++) {
        r = write ? pwrite(fd, buf, KVF_ENV_DISK_BLOCK, (off_t)offs[k])
                  : pread(fd, buf, KVF_ENV_DISK_BLOCK, (off_t)offs[k]);
        if (r != (ssize_t)KVF_ENV_DISK_BLOCK) {
            return r < 0 ? -errno : -EIO;
        }
    }
    return (long long)n * KVF_ENV_DISK_BLOCK;
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

/* A permutation of the file's blocks (fixed seed: the same every run). */
static void kvf_env_disk_shuffle(uint64_t *offs, unsigned n)
{
    uint64_t x = 0x9e3779b97f4a7c15ull, t;
    unsigned i, j;

    for (i = 0; i < n; i++) {
        offs[i] = (uint64_t)i * KVF_ENV_DISK_BLOCK;
    }
    for (i = n; i > 1; i--) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        j = (unsigned)(x % i);
        t = offs[i - 1];
        offs[i - 1] = offs[j];
        offs[j] = t;
    }
}

int kvf_env_disk_measure(const char *dir, uint64_t bytes, kvf_env_disk_t *d)
{
    unsigned n = (unsigned)(bytes / KVF_ENV_DISK_BLOCK), i;
    size_t blen = (size_t)KVF_ENV_DISK_QD * KVF_ENV_DISK_BLOCK;
    unsigned char *buf;
    uint64_t *offs;
    long long moved;
    double t0;
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
    offs = calloc(n, sizeof(*offs));
    if (buf == MAP_FAILED || offs == NULL) {
        close(fd);
        unlink(d->path);
        free(offs);
        snprintf(d->err, sizeof(d->err), "out of memory");
        return -1;
    }
    for (i = 0; i < blen; i++) {
        buf[i] = (unsigned char)(i * 131 + 7); /* not zeros: no shortcuts */
    }
    for (i = 0; i < n; i++) {
        offs[i] = (uint64_t)i * KVF_ENV_DISK_BLOCK;
    }
    t0 = ((double)kvf_time_ns() / 1e9);
    moved = kvf_env_disk_io(fd, buf, 1, offs, n, &d->uring);
    if (moved > 0 && fdatasync(fd) == 0) {
        d->write_gbs = (double)moved / (((double)kvf_time_ns() / 1e9) - t0) / 1e9;
        kvf_env_disk_shuffle(offs, n);
        t0 = ((double)kvf_time_ns() / 1e9);
        moved = kvf_env_disk_io(fd, buf, 0, offs, n, &d->uring);
        if (moved > 0) {
            d->read_gbs = (double)moved / (((double)kvf_time_ns() / 1e9) - t0) / 1e9;
        }
    }
    if (moved <= 0) {
        snprintf(d->err, sizeof(d->err), "O_DIRECT I/O in %.180s failed: %.60s", dir,
                 strerror(moved < 0 ? (int)-moved : EIO));
    }
    munmap(buf, blen);
    free(offs);
    close(fd);
    unlink(d->path);
    return moved > 0 ? 0 : -1;
}

void kvf_env_disk_text(const kvf_env_disk_t *d, char *out, size_t cap)
{
    if (d->err[0] != '\0') {
        snprintf(out, cap, "not measured: %s", d->err);
        return;
    }
    snprintf(out, cap,
             "O_DIRECT read %.2f GB/s (random), write %.2f GB/s "
             "(sequential); %u KiB requests, %u in flight, %s; %.0f MiB "
             "file in %s on %s",
             d->read_gbs, d->write_gbs, KVF_ENV_DISK_BLOCK >> 10,
             d->uring ? KVF_ENV_DISK_QD : 1u,
             d->uring ? "io_uring" : "pread/pwrite",
             (double)d->file_bytes / (1 << 20), d->dir, d->dev);
}
