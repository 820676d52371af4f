/*
 * A storage node's disk tier (see tier.h): the data file, its manifest,
 * and the batches of operations the master sends. I/O goes through
 * tier_io.c (io_uring with O_DIRECT, or pread/pwrite); this file keeps
 * the index of entries (store/proto/inv.h, by offset in the file) and
 * the manifest that makes it survive a restart.
 *
 * Manifest record, little-endian: u32 magic "KVTM", u8 kind (1 add,
 * 2 drop), u8 flags, u16 key length, u64 offset, u64 size, u64 checksum,
 * u64 seq, the key, then u64 hash of all the bytes before it. Records are
 * appended after the data they name is on the device; replay skips a
 * damaged record (counted) and resynchronises on the next magic.
 */
#include "store/node/tier.h"
#include "store/node/tier_io.h"
#include "core/alloc.h"
#include "core/checksum.h"
#include "core/log.h"
#include "core/wire.h"

#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define KVF_TM_MAGIC    0x4d54564bu /* "KVTM" */
#define KVF_TM_FIXED    40u         /* bytes before the key */
#define KVF_TM_SEED     0x6b7674696572ull
#define KVF_TM_ADD      1
#define KVF_TM_DROP     2
#define KVF_TM_MAX_READ (1ull << 30) /* a larger manifest is refused */
#define KVF_TIER_PATH_MAX 512

struct kvf_tier {
    char dir[KVF_TIER_PATH_MAX];
    uint64_t len; /* bytes of the data file */
    int lockfd, mfd;
    kvf_tdev_t dev;          /* the data file and the I/O (tier_io.c) */
    pthread_mutex_t io_lock; /* the device: one batch at a time */
    pthread_mutex_t lock;    /* idx, st, on, the manifest */
    kvf_inv_t idx;           /* entries by offset in the data file */
    kvf_tier_stats_t st;
    int on;
    /* manifest records of the batch under way */
    unsigned char *mbuf;
    size_t mbuf_len, mbuf_cap;
    int mbuf_failed;
    uint64_t appended; /* records in the manifest file */
};

static void kvf_tier_off(kvf_tier_t *t, const char *what, uint64_t off,
                         uint64_t len, int err);

/* ---- manifest ---- */

/* Encodes one record into buf (room for KVF_TM_FIXED + key + 8). */
static size_t kvf_tm_enc(unsigned char *buf, int kind, const char *key,
                         uint64_t off, uint64_t size, uint64_t checksum,
                         uint64_t seq, uint8_t flags)
{
    size_t klen = strlen(key);
    kvf_wr_t w;

    kvf_wr_init_fixed(&w, buf, KVF_TM_FIXED + klen + 8);
    kvf_wr_u32(&w, KVF_TM_MAGIC);
    kvf_wr_u8(&w, (uint8_t)kind);
    kvf_wr_u8(&w, flags);
    kvf_wr_u64(&w, off);
    kvf_wr_u64(&w, size);
    kvf_wr_u64(&w, checksum);
    kvf_wr_u64(&w, seq);
    kvf_wr_str(&w, key);
    kvf_wr_u64(&w, kvf_hash64(buf, KVF_TM_FIXED + klen, KVF_TM_SEED));
    return w.len;
}

/* Appends records to the manifest buffer of this batch. */
static void kvf_tm_add(kvf_tier_t *t, int kind, const char *key, uint64_t off,
                       uint64_t size, uint64_t checksum, uint64_t seq,
                       uint8_t flags)
{
    size_t need = KVF_TM_FIXED + strlen(key) + 8, cap;
    unsigned char *nb;

    if (t->mbuf_len + need > t->mbuf_cap) {
        cap = t->mbuf_cap ? t->mbuf_cap * 2 : 65536;
        while (cap < t->mbuf_len + need) {
            cap *= 2;
        }
        nb = kvf_realloc(t->mbuf, cap);
        if (nb == NULL) {
            t->mbuf_failed = 1;
            return;
        }
        t->mbuf = nb;
        t->mbuf_cap = cap;
    }
    t->mbuf_len += kvf_tm_enc(t->mbuf + t->mbuf_len, kind, key, off, size,
                              checksum, seq, flags);
    t->appended++;
}

/* Writes the batch's records; a failure turns the tier off. */
static void kvf_tm_flush(kvf_tier_t *t)
{
    size_t at = 0;
    ssize_t n;

    if (t->mbuf_failed) {
        kvf_tier_off(t, "manifest", 0, 0, ENOMEM);
    }
    while (at < t->mbuf_len && t->on) {
        n = write(t->mfd, t->mbuf + at, t->mbuf_len - at);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            kvf_tier_off(t, "manifest write", 0, t->mbuf_len - at,
                         n < 0 ? errno : ENOSPC);
            break;
        }
        at += (size_t)n;
    }
    t->mbuf_len = 0;
    t->mbuf_failed = 0;
}

/* Parses one record at p (len bytes left); its length, or 0 if none
 * starts there. */
static size_t kvf_tm_parse(const unsigned char *p, size_t len, int *kind,
                           kvf_inv_ent_t *e, char *key)
{
    size_t klen;
    kvf_rd_t r;

    if (len < KVF_TM_FIXED + 8) {
        return 0;
    }
    kvf_rd_init(&r, p, len);
    if (kvf_rd_u32(&r) != KVF_TM_MAGIC) {
        return 0;
    }
    *kind = kvf_rd_u8(&r);
    e->flags = kvf_rd_u8(&r);
    e->off = kvf_rd_u64(&r);
    e->size = kvf_rd_u64(&r);
    e->checksum = kvf_rd_u64(&r);
    e->seq = kvf_rd_u64(&r);
    kvf_rd_str(&r, key, KVF_STORE_KEY_MAX + 1);
    klen = strlen(key);
    if (kvf_rd_status(&r) != KVF_OK || klen == 0 ||
        (*kind != KVF_TM_ADD && *kind != KVF_TM_DROP) ||
        kvf_rd_u64(&r) != kvf_hash64(p, KVF_TM_FIXED + klen, KVF_TM_SEED) ||
        kvf_rd_status(&r) != KVF_OK) {
        return 0;
    }
    return KVF_TM_FIXED + klen + 8;
}

/* Applies the records of buf to the index; damaged stretches are
 * skipped (one count each) up to the next record that parses. */
static void kvf_tm_replay(kvf_tier_t *t, const unsigned char *buf, size_t len)
{
    static char key[KVF_STORE_KEY_MAX + 1];
    size_t at = 0, rl;
    kvf_inv_ent_t e;
    int kind, bad = 0;

    while (at < len) {
        rl = kvf_tm_parse(buf + at, len - at, &kind, &e, key);
        if (rl == 0) {
            t->st.bad_records += !bad;
            bad = 1;
            at++;
            continue;
        }
        bad = 0;
        at += rl;
        if (kind == KVF_TM_ADD) {
            if (kvf_inv_put(&t->idx, KVF_INV_RECORD, key, e.off, e.size,
                            e.checksum, 0, e.seq, e.flags) != KVF_OK) {
                t->st.bad_records++;
            }
        } else {
            (void)kvf_inv_del(&t->idx, key, e.off, 0);
        }
    }
}

/* Reads the manifest file whole (bounded). */
static kvf_status_t kvf_tm_read(kvf_tier_t *t, unsigned char **buf_p,
                                size_t *len_p)
{
    struct stat sb;
    unsigned char *buf;
    size_t at = 0;
    ssize_t n;

    if (fstat(t->mfd, &sb) != 0 || (uint64_t)sb.st_size > KVF_TM_MAX_READ) {
        kvf_error("node: disk tier manifest %s/tier.manifest: %s", t->dir,
                  (uint64_t)sb.st_size > KVF_TM_MAX_READ ? "over 1 GiB"
                                                         : "cannot stat");
        return KVF_ERR_IO;
    }
    buf = kvf_malloc((size_t)sb.st_size + 1);
    if (buf == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    while (at < (size_t)sb.st_size) {
        n = pread(t->mfd, buf + at, (size_t)sb.st_size - at, (off_t)at);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) {
                continue;
            }
            break;
        }
        at += (size_t)n;
    }
    *buf_p = buf;
    *len_p = at;
    return KVF_OK;
}

/* Writes the live entries as a new manifest (tmp, fsync, rename). */
static kvf_status_t kvf_tm_compact(kvf_tier_t *t)
{
    char path[KVF_TIER_PATH_MAX + 32], tmp[KVF_TIER_PATH_MAX + 40];
    const kvf_inv_ent_t *e;
    int fd, ok;
    size_t i;

    snprintf(path, sizeof(path), "%s/tier.manifest", t->dir);
    snprintf(tmp, sizeof(tmp), "%s/tier.manifest.tmp", t->dir);
    t->mbuf_len = 0;
    for (i = 0; i < t->idx.n; i++) {
        e = &t->idx.ent[i];
        kvf_tm_add(t, KVF_TM_ADD, e->key, e->off, e->size, e->checksum,
                   e->seq, e->flags);
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ok = fd >= 0 && !t->mbuf_failed &&
         write(fd, t->mbuf, t->mbuf_len) == (ssize_t)t->mbuf_len &&
         fdatasync(fd) == 0 && rename(tmp, path) == 0;
    if (fd >= 0) {
        close(fd);
    }
    t->mbuf_len = 0;
    t->mbuf_failed = 0;
    t->appended = t->idx.n;
    if (!ok) {
        kvf_error("node: disk tier: cannot write %s: %m", tmp);
        unlink(tmp);
        return KVF_ERR_IO;
    }
    close(t->mfd);
    t->mfd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    return t->mfd >= 0 ? KVF_OK : KVF_ERR_IO;
}

/* ---- operations ---- */

static void kvf_tier_off(kvf_tier_t *t, const char *what, uint64_t off,
                         uint64_t len, int err)
{
    if (!t->on) {
        return;
    }
    __atomic_store_n(&t->on, 0, __ATOMIC_RELEASE);
    kvf_error("node: disk tier %s turned off: %s of %lu bytes at %lu "
              "failed: %s%s; its objects are dropped, the node serves its "
              "memory pool only",
              t->dir, what, (unsigned long)len, (unsigned long)off,
              strerror(err), err == ENOSPC ? " (the disk is full)" : "");
}

/* Checks an operation's places; KVF_ERR_OUT_OF_BOUNDS when outside the
 * pool or the file, or misaligned in the file. */
static kvf_status_t kvf_tier_check_op(const kvf_tier_t *t,
                                      const kvf_sm_tier_op_t *o)
{
    uint64_t alen = (o->size + KVF_TIER_ALIGN - 1) & ~(uint64_t)(KVF_TIER_ALIGN - 1);

    if (o->size == 0 || alen < o->size || o->disk_off % KVF_TIER_ALIGN ||
        o->disk_off > t->len || alen > t->len - o->disk_off) {
        return KVF_ERR_OUT_OF_BOUNDS;
    }
    if (o->op != KVF_TIER_DROP &&
        (o->pool_off > t->dev.pool_len ||
         o->size > t->dev.pool_len - o->pool_off)) {
        return KVF_ERR_OUT_OF_BOUNDS;
    }
    return KVF_OK;
}

/* The result of one finished WRITE or READ (lock held). */
static void kvf_tier_done(kvf_tier_t *t, kvf_sm_tier_op_t *o)
{
    if (o->status != KVF_OK) {
        if (o->op == KVF_TIER_READ && o->status == KVF_ERR_CHECKSUM) {
            t->st.corrupt++;
            (void)kvf_inv_del(&t->idx, o->key, o->disk_off, 0);
            kvf_tm_add(t, KVF_TM_DROP, o->key, o->disk_off, o->size,
                       o->checksum, o->seq, o->flags);
            kvf_log_rl(KVF_LOG_WARN,
                       "node: disk tier %s: entry at %lu (%lu bytes) fails "
                       "its checksum: dropped",
                       t->dir, (unsigned long)o->disk_off,
                       (unsigned long)o->size);
        }
        return;
    }
    if (o->op == KVF_TIER_WRITE) {
        if (kvf_inv_put(&t->idx, KVF_INV_RECORD, o->key, o->disk_off, o->size,
                        o->checksum, 0, o->seq, o->flags) != KVF_OK) {
            o->status = KVF_ERR_NO_MEMORY;
            return;
        }
        kvf_tm_add(t, KVF_TM_ADD, o->key, o->disk_off, o->size, o->checksum,
                   o->seq, o->flags);
        t->st.writes++;
        t->st.write_bytes += o->size;
    } else {
        t->st.reads++;
        t->st.read_bytes += o->size;
    }
}

static void kvf_tier_drop(kvf_tier_t *t, kvf_sm_tier_op_t *o)
{
    if (kvf_inv_del(&t->idx, o->key, o->disk_off, 0) != KVF_OK) {
        return; /* not there: done already */
    }
    kvf_tm_add(t, KVF_TM_DROP, o->key, o->disk_off, o->size, o->checksum,
               o->seq, o->flags);
    t->st.drops++;
}

/* A run of WRITEs and READs: checked, moved, checked, recorded. Batches
 * of two connections overlap outside the device part. */
static void kvf_tier_run_io(kvf_tier_t *t, kvf_sm_tier_op_t *ops, size_t n)
{
    kvf_tdev_fail_t fail;
    size_t i;
    int rc = 0;

    kvf_tdev_check(&t->dev, ops, n, KVF_TIER_WRITE); /* wrong bytes: no */
    pthread_mutex_lock(&t->io_lock);
    if (__atomic_load_n(&t->on, __ATOMIC_ACQUIRE)) {
        rc = kvf_tdev_run(&t->dev, ops, n, &fail);
    }
    pthread_mutex_unlock(&t->io_lock);
    kvf_tdev_check(&t->dev, ops, n, KVF_TIER_READ);
    pthread_mutex_lock(&t->lock);
    if (rc != 0) {
        kvf_tier_off(t, fail.write ? "write" : "read", fail.off, fail.len,
                     fail.err);
    }
    for (i = 0; i < n; i++) {
        if (!t->on && ops[i].status == KVF_OK) {
            ops[i].status = KVF_ERR_IO;
        }
        kvf_tier_done(t, &ops[i]);
    }
    pthread_mutex_unlock(&t->lock);
}

void kvf_tier_run(kvf_tier_t *t, kvf_sm_tier_op_t *ops, size_t n)
{
    size_t i, first;

    pthread_mutex_lock(&t->lock);
    for (i = 0; i < n; i++) {
        ops[i].status = t->on ? kvf_tier_check_op(t, &ops[i]) : KVF_ERR_IO;
    }
    pthread_mutex_unlock(&t->lock);
    /* runs of WRITEs and READs go to the device together; a DROP ends a
     * run, so every operation takes effect in order */
    for (i = 0; i < n;) {
        if (ops[i].op == KVF_TIER_DROP) {
            pthread_mutex_lock(&t->lock);
            if (ops[i].status == KVF_OK) {
                kvf_tier_drop(t, &ops[i]);
            }
            pthread_mutex_unlock(&t->lock);
            i++;
            continue;
        }
        for (first = i; i < n && ops[i].op != KVF_TIER_DROP; i++) {
        }
        kvf_tier_run_io(t, ops + first, i - first);
    }
    pthread_mutex_lock(&t->lock);
    kvf_tm_flush(t);
    if (t->on && t->appended > 2 * t->idx.n + 65536) {
        (void)kvf_tm_compact(t);
    }
    pthread_mutex_unlock(&t->lock);
}

uint32_t kvf_tier_page(kvf_tier_t *t, kvf_wr_t *w, uint64_t *from,
                       uint32_t max)
{
    kvf_sm_inv_ent_t e;
    uint32_t n = 0;
    size_t i;

    pthread_mutex_lock(&t->lock);
    for (i = kvf_inv_seek(&t->idx, *from); t->on && i < t->idx.n && n < max;
         i++, n++) {
        e.key = t->idx.ent[i].key;
        e.off = t->idx.ent[i].off;
        e.size = t->idx.ent[i].size;
        e.checksum = t->idx.ent[i].checksum;
        e.epoch = 0;
        e.seq = t->idx.ent[i].seq;
        e.flags = (uint8_t)(t->idx.ent[i].flags | KVF_SM_INV_DISK);
        kvf_sm_inv_ent_enc(w, &e);
        *from = e.off + 1;
    }
    pthread_mutex_unlock(&t->lock);
    return n;
}

void kvf_tier_stats(kvf_tier_t *t, kvf_tier_stats_t *s)
{
    pthread_mutex_lock(&t->lock);
    *s = t->st;
    s->entries = t->idx.n;
    s->on = t->on;
    pthread_mutex_unlock(&t->lock);
}

uint64_t kvf_tier_len(const kvf_tier_t *t)
{
    return t->len;
}

int kvf_tier_uses_uring(const kvf_tier_t *t)
{
    return t->dev.uring;
}

/* ---- open, close ---- */

/* The directory, its lock (one node at a time) and its two files. */
static kvf_status_t kvf_tier_files(kvf_tier_t *t, int *fresh_p)
{
    char path[KVF_TIER_PATH_MAX + 32];
    struct stat sb;

    if (mkdir(t->dir, 0700) != 0 && errno != EEXIST) {
        kvf_error("node: disk tier: cannot create %s: %m", t->dir);
        return KVF_ERR_IO;
    }
    snprintf(path, sizeof(path), "%s/tier.lock", t->dir);
    t->lockfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (t->lockfd < 0 || flock(t->lockfd, LOCK_EX | LOCK_NB) != 0) {
        kvf_error("node: disk tier %s: %s", t->dir,
                  t->lockfd < 0 ? "cannot create its lock file"
                                : "used by another node (locked)");
        return KVF_ERR_BUSY;
    }
    snprintf(path, sizeof(path), "%s/tier.data", t->dir);
    *fresh_p = stat(path, &sb) != 0;
    t->dev.fd = open(path, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
    if (t->dev.fd < 0) {
        kvf_error("node: disk tier: cannot open %s with O_DIRECT: %m "
                  "(a file system without direct I/O, such as tmpfs?)",
                  path);
        return KVF_ERR_IO;
    }
    if (ftruncate(t->dev.fd, (off_t)t->len) != 0) {
        kvf_error("node: disk tier: cannot size %s to %lu bytes: %m", path,
                  (unsigned long)t->len);
        return KVF_ERR_IO;
    }
    snprintf(path, sizeof(path), "%s/tier.manifest", t->dir);
    t->mfd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (t->mfd < 0) {
        kvf_error("node: disk tier: cannot open %s: %m", path);
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

/* Reads every entry back and drops (counting them) those whose bytes
 * fail their checksum; a device that cannot be read leaves it empty. */
static void kvf_tier_verify(kvf_tier_t *t)
{
    const kvf_inv_ent_t *e;
    size_t i = 0;
    int ok;

    while (i < t->idx.n) {
        e = &t->idx.ent[i];
        ok = kvf_tdev_check_entry(&t->dev, e->off, e->size, e->checksum);
        if (ok < 0) {
            kvf_error("node: disk tier %s: cannot read its entries back: "
                      "it starts empty",
                      t->dir);
            while (t->idx.n > 0) {
                (void)kvf_inv_del(&t->idx, t->idx.ent[0].key,
                                  t->idx.ent[0].off, 0);
            }
            return;
        }
        if (ok) {
            i++;
            continue;
        }
        kvf_log_rl(KVF_LOG_WARN,
                   "node: disk tier %s: entry at %lu (%lu bytes) fails its "
                   "checksum: dropped",
                   t->dir, (unsigned long)e->off, (unsigned long)e->size);
        t->st.bad_objects++;
        (void)kvf_inv_del(&t->idx, e->key, e->off, 0);
    }
}

/* Replays the manifest, checks every entry's data, writes the log anew. */
static kvf_status_t kvf_tier_restore(kvf_tier_t *t, int verify)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    kvf_status_t st;

    st = kvf_tm_read(t, &buf, &len);
    if (st != KVF_OK) {
        return st;
    }
    kvf_tm_replay(t, buf, len);
    kvf_free(buf);
    if (verify) {
        kvf_tier_verify(t);
    }
    t->st.restored = t->idx.n;
    st = kvf_tm_compact(t);
    if (t->idx.n > 0 || t->st.bad_records > 0 || t->st.bad_objects > 0) {
        kvf_info("node: disk tier %s: %zu object(s) restored, %lu damaged "
                 "manifest record(s) and %lu damaged object(s) dropped",
                 t->dir, t->idx.n, (unsigned long)t->st.bad_records,
                 (unsigned long)t->st.bad_objects);
    }
    return st;
}

kvf_status_t kvf_tier_open(const char *dir, uint64_t size, void *pool,
                           uint64_t pool_len, int verify, kvf_tier_t **tier_p)
{
    kvf_tier_t *t;
    kvf_status_t st;
    int fresh = 1;

    size &= ~(uint64_t)(KVF_TIER_ALIGN - 1);
    if (dir == NULL || dir[0] == '\0' || strlen(dir) >= KVF_TIER_PATH_MAX ||
        size < KVF_TIER_ALIGN) {
        kvf_error("node: disk tier needs a directory and a size of at least "
                  "4 KiB");
        return KVF_ERR_INVALID_PARAM;
    }
    t = kvf_calloc(1, sizeof(*t));
    if (t == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    snprintf(t->dir, sizeof(t->dir), "%s", dir);
    t->len = size;
    t->dev.pool = pool;
    t->dev.pool_len = pool_len;
    t->lockfd = t->dev.fd = t->mfd = -1;
    t->on = 1;
    pthread_mutex_init(&t->lock, NULL);
    pthread_mutex_init(&t->io_lock, NULL);
    kvf_inv_init(&t->idx, size);
    st = kvf_tier_files(t, &fresh);
    if (st == KVF_OK) {
        st = kvf_tdev_init(&t->dev);
    }
    if (st == KVF_OK && !fresh) {
        st = kvf_tier_restore(t, verify);
    }
    if (st != KVF_OK) {
        kvf_tier_close(t);
        return st;
    }
    kvf_info("node: disk tier %s: %lu bytes, O_DIRECT through %s", t->dir,
             (unsigned long)t->len, t->dev.uring ? "io_uring" : "pread/pwrite");
    *tier_p = t;
    return KVF_OK;
}

void kvf_tier_close(kvf_tier_t *t)
{
    if (t == NULL) {
        return;
    }
    kvf_tdev_fini(&t->dev);
    if (t->dev.fd >= 0) {
        close(t->dev.fd);
    }
    if (t->mfd >= 0) {
        close(t->mfd);
    }
    if (t->lockfd >= 0) {
        close(t->lockfd); /* releases the lock */
    }
    kvf_inv_fini(&t->idx);
    kvf_free(t->mbuf);
    pthread_mutex_destroy(&t->io_lock);
    pthread_mutex_destroy(&t->lock);
    kvf_free(t);
}
