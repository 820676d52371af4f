/*
 * Drills of a cache that comes back warm (store/node/tier.h): nodes with
 * a disk tier under store traffic whose working set is larger than their
 * pools, so objects live on disk as well as in memory.
 *
 *   warm-restart  the node is SIGKILLed and started again on its disk
 *                 directory: it checks and offers its objects again; at
 *                 least 90 % of the probe objects put before the kill are
 *                 served again, byte for byte; the hit rate over time
 *   disk-corrupt  bytes flipped all over the tier's file under traffic:
 *                 the damaged copies are misses (dropped and counted by
 *                 the master), never wrong data; read-through heals
 *   disk-full     the tier's file system fills up (a filler file on a
 *                 small tmpfs, root only): the tier turns off with one
 *                 line, the node serves its pool on, no wrong byte
 *   dtype-swap    two clients of different dtypes (bf16, fp8) over one
 *                 store and the same token chunks: with a fingerprint in
 *                 their keys they never share a hit; the fault drops the
 *                 fingerprint, and the check of every returned object
 *                 sees the other dtype's bytes (counted, never taken as
 *                 data); with the fingerprint back, none again
 * Every returned object is checked byte for byte (store.c); waits are
 * bounded as in every store drill.
 */
#include "tools/drill/store.h"

#include <kvferry/store.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/time.h"
#include "core/rng.h"

#define KVF_WARM_PROBES     100
#define KVF_WARM_PROBE_SIZE (32 * 1024)

/* A directory for the nodes' tiers under the drill's log directory. */
static const char *kvf_warm_dir(kvf_drill_t *d, char *out, size_t len)
{
    snprintf(out, len, "%s/tiers-%s-%d", d->logdir, d->name, (int)getpid());
    mkdir(out, 0700);
    return out;
}

static void kvf_warm_rmdir(const char *dir)
{
    char cmd[700];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "drill: could not remove %s\n", dir);
    }
}

/* --- the probe objects ---------------------------------------------------- */

typedef struct kvf_warm_probe {
    char master[64];
    unsigned timeout_ms;
    int phase; /* 0 put, 1 read back */
    int put, served, wrong;
    int status;
} kvf_warm_probe_t;

static int kvf_warm_probe_run(kvf_drill_t *d, void *arg)
{
    static unsigned char buf[KVF_WARM_PROBE_SIZE], scratch[KVF_WARM_PROBE_SIZE];
    kvf_warm_probe_t *p = arg;
    kvf_store_params_t sp = {0};
    kvf_region_h reg;
    kvf_status_t s;
    kvf_store_h st;
    char key[64];
    size_t len;
    int i;

    (void)d;
    sp.field_mask = KVF_STORE_PARAM_MASTER | KVF_STORE_PARAM_TIMEOUT;
    sp.master = p->master;
    sp.timeout_ms = p->timeout_ms;
    if (kvf_store_connect(&sp, &st) != KVF_OK) {
        return 1;
    }
    if (kvf_engine_reg(kvf_store_engine(st), buf, sizeof(buf), KVF_MEM_HOST, 0,
                       &reg) != KVF_OK) {
        kvf_store_disconnect(st);
        return 1;
    }
    for (i = 0; i < KVF_WARM_PROBES; i++) {
        snprintf(key, sizeof(key), "warm-probe/%d", i);
        if (p->phase == 0) {
            kvf_drill_obj_fill(buf, key, 1, sizeof(buf));
            s = kvf_store_put(st, key, buf, sizeof(buf), NULL);
            p->put += s == KVF_OK;
        } else {
            len = 0;
            s = kvf_store_get(st, key, buf, sizeof(buf), &len, 0);
            if (s == KVF_OK &&
                kvf_drill_obj_check(buf, len, key, 0, scratch) != 0) {
                p->wrong++;
            }
            p->served += s == KVF_OK;
        }
        p->status = s != KVF_OK ? s : p->status;
    }
    kvf_engine_dereg(kvf_store_engine(st), reg);
    kvf_store_disconnect(st);
    return 0;
}

static void kvf_warm_probe(kvf_drill_t *d, kvf_drill_cluster_t *c,
                           kvf_warm_probe_t *p, int phase)
{
    snprintf(p->master, sizeof(p->master), "%s", c->master_addr);
    p->timeout_ms = d->timeout_ms;
    p->phase = phase;
    if (kvf_drill_oneshot(d, NULL, kvf_warm_probe_run, p, 30000) != 0) {
        kvf_drill_fail(d, "the probe client failed (phase %d)", phase);
    }
}

/* Waits (10 s at most) until the tiers have copied every committed put:
 * what the master acknowledged is then on disk too. */
static void kvf_warm_copied(kvf_drill_t *d, kvf_drill_cluster_t *c)
{
    uint64_t end = kvf_time_ms() + 10000;
    kvf_drill_mstatus_t s;

    while (kvf_time_ms() < end) {
        if (kvf_drill_status(d, c, &s) == 0 && s.tier_writes >= s.puts - 8) {
            return;
        }
        kvf_drill_sleep(d, 50);
    }
}

/* --- warm-restart --------------------------------------------------------- */

static const kvf_kv_arg_t kvf_warm_load = {
    .keys = 600, .min_kb = 8, .max_kb = 64, .get_pct = 90, .remove_pct = 0};

/* The node back on its directory: the master drops the dead one after
 * its ttl and counts the new one. ms from t0, or -1. */
static double kvf_warm_node_back(kvf_drill_t *d, kvf_drill_cluster_t *c,
                                 kvf_drill_hits_t *h, uint64_t t0)
{
    kvf_drill_mstatus_t s;
    uint64_t end = kvf_time_ms() + 15000;

    if (kvf_drill_node_start(d, c, 0) != 0) {
        return -1;
    }
    while (kvf_time_ms() < end) {
        if (kvf_drill_status(d, c, &s) == 0 && s.nodes == 1 &&
            s.nodes_lost >= 1) {
            return (double)(kvf_time_ms() - t0);
        }
        kvf_drill_hits_sleep(d, h, 100);
    }
    return -1;
}

static void kvf_warm_restart_report(kvf_drill_t *d,
                                    const kvf_warm_probe_t *p,
                                    const kvf_drill_mstatus_t *s0,
                                    const kvf_drill_mstatus_t *s1,
                                    double back_ms, uint64_t bound)
{
    char text[640];

    kvf_record_figure(d->rec, "probe objects served again", p->served, "of 100",
                      NAN, NAN);
    kvf_record_figure(d->rec, "node registered again, its report taken",
                      back_ms, "ms", NAN, NAN);
    kvf_record_figure(d->rec, "objects before the kill", s0->objects, "", NAN,
                      NAN);
    kvf_record_figure(d->rec, "objects after the restart", s1->objects, "",
                      NAN, NAN);
    kvf_drill_check(d, p->served * 10 >= KVF_WARM_PROBES * 9,
                    "%d of %d probe objects served again (%s)", p->served,
                    KVF_WARM_PROBES, kvf_status_name((kvf_status_t)p->status));
    kvf_drill_check(d, p->wrong == 0, "%d probe objects with wrong bytes",
                    p->wrong);
    kvf_drill_traffic_report(d, bound);
    snprintf(text, sizeof(text),
             "%d of %d probe objects served again byte for byte; node back "
             "%.0f ms after the restart; objects %.0f before, %.0f after "
             "(%.0f of them on disk only); %lu wrong bytes; longest call "
             "%.0f ms (bound %lu)",
             p->served, KVF_WARM_PROBES, back_ms, s0->objects, s1->objects,
             s1->disk_only, (unsigned long)d->wrong_bytes, d->max_wait_ms,
             (unsigned long)bound);
    kvf_record_drill_text(d->rec, "observed", text);
    kvf_record_drill_text(d->rec, "recovery",
                          "the node restarted on its directory: it checked "
                          "its manifest and every object against its "
                          "checksum, registered and reported them; the "
                          "clients read through the rest");
}

int kvf_drill_warm_restart(kvf_drill_t *d)
{
    char dir[600];
    kvf_drill_cluster_t c = {.replicas = 1,
                             .node_pool = 16u << 20,
                             .disk_dir = kvf_warm_dir(d, dir, sizeof(dir)),
                             .disk_size = 128u << 20};
    kvf_warm_probe_t *p = kvf_drill_shared_alloc(sizeof(*p));
    uint64_t bound = kvf_drill_store_bound(d, 1), t_kill, since;
    kvf_drill_mstatus_t s0, s1;
    kvf_drill_hits_t h;
    double back;

    kvf_drill_expect(d, "a node with a disk tier SIGKILLed under traffic and "
                        "started again on its directory offers its objects "
                        "again: at least 90 % of the probe objects put "
                        "before the kill are served again, byte for byte; "
                        "no wrong bytes; every call within its bound");
    if (p == NULL || kvf_drill_store_begin(d, &c, 1, &kvf_warm_load, 2) != 0) {
        kvf_warm_rmdir(dir);
        return -1;
    }
    kvf_drill_phase(d, KVF_DRILL_BASE);
    kvf_drill_hits_begin(d, &h);
    kvf_warm_probe(d, &c, p, 0);
    kvf_drill_hits_sleep(d, &h, d->phase_ms);
    kvf_warm_copied(d, &c);
    kvf_drill_status(d, &c, &s0);
    d->phase_secs[KVF_DRILL_BASE] = d->phase_ms / 1000.0;
    kvf_drill_phase(d, KVF_DRILL_FAULT);
    kvf_drill_hits_fault(d, &h);
    t_kill = kvf_time_ms();
    kvf_drill_kill(c.node[0], SIGKILL);
    c.node[0] = 0;
    kvf_drill_injected(d, "SIGKILL to the node (16 MiB pool, 128 MiB disk "
                          "tier) under traffic of 2 clients over 600 keys of "
                          "8..64 KiB; started again on the same directory "
                          "0.5 s later");
    kvf_drill_hits_sleep(d, &h, 500);
    back = kvf_warm_node_back(d, &c, &h, kvf_time_ms());
    d->phase_secs[KVF_DRILL_FAULT] = (double)(kvf_time_ms() - t_kill) / 1e3;
    kvf_drill_phase(d, KVF_DRILL_RECOVER);
    d->time_to_recover_ms = kvf_drill_wait_recovered(d, t_kill, 15000);
    since = kvf_time_ms() - t_kill;
    kvf_drill_hits_sleep(d, &h, since < 10000 ? (unsigned)(10000 - since)
                                              : d->phase_ms);
    kvf_drill_workers_stop(d);
    kvf_warm_probe(d, &c, p, 1);
    kvf_drill_status(d, &c, &s1);
    d->phase_secs[KVF_DRILL_RECOVER] =
        (double)(kvf_time_ms() - t_kill) / 1e3 - d->phase_secs[1];
    kvf_drill_hits_report(d, &h, 0);
    kvf_warm_restart_report(d, p, &s0, &s1, back, bound);
    kvf_drill_cluster_stop(&c);
    kvf_warm_rmdir(dir);
    return 0;
}

/* --- disk-corrupt --------------------------------------------------------- */

/* Flips one byte in every 4 KiB of the file; the bytes flipped. */
static long kvf_warm_flip(const char *path)
{
    unsigned char b;
    struct stat sb;
    off_t off;
    long n = 0;
    int fd = open(path, O_RDWR | O_CLOEXEC);

    if (fd < 0 || fstat(fd, &sb) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    for (off = 100; off < sb.st_size; off += 4096) {
        if (pread(fd, &b, 1, off) == 1) {
            b ^= 0x5a;
            n += pwrite(fd, &b, 1, off) == 1;
        }
    }
    fsync(fd);
    close(fd);
    return n;
}

int kvf_drill_disk_corrupt(kvf_drill_t *d)
{
    char dir[600], path[700], text[512];
    kvf_drill_cluster_t c = {.replicas = 1,
                             .node_pool = 16u << 20,
                             .disk_dir = kvf_warm_dir(d, dir, sizeof(dir)),
                             .disk_size = 64u << 20};
    uint64_t bound = kvf_drill_store_bound(d, 1), t0;
    kvf_drill_mstatus_t s0, s1;
    kvf_drill_hits_t h;
    long flipped;

    kvf_drill_expect(d, "bytes flipped all over the disk tier's file under "
                        "traffic: every damaged copy read is a miss (the "
                        "node's checksum refuses it, the master drops and "
                        "counts it), never wrong data; the clients read "
                        "through; no wrong bytes, every call within its "
                        "bound");
    if (kvf_drill_store_begin(d, &c, 1, &kvf_warm_load, 2) != 0) {
        kvf_warm_rmdir(dir);
        return -1;
    }
    kvf_drill_phase(d, KVF_DRILL_BASE);
    kvf_drill_hits_begin(d, &h);
    kvf_drill_hits_sleep(d, &h, d->phase_ms);
    kvf_drill_status(d, &c, &s0);
    d->phase_secs[KVF_DRILL_BASE] = d->phase_ms / 1000.0;
    kvf_drill_phase(d, KVF_DRILL_FAULT);
    kvf_drill_hits_fault(d, &h);
    t0 = kvf_time_ms();
    snprintf(path, sizeof(path), "%s/node0/tier.data", dir);
    flipped = kvf_warm_flip(path);
    snprintf(text, sizeof(text),
             "one byte in every 4 KiB of the tier's file (%.300s) flipped: "
             "%ld bytes, under traffic",
             path, flipped);
    kvf_drill_injected(d, text);
    kvf_drill_hits_sleep(d, &h, d->phase_ms);
    d->phase_secs[KVF_DRILL_FAULT] = (double)(kvf_time_ms() - t0) / 1e3;
    kvf_drill_phase(d, KVF_DRILL_RECOVER);
    kvf_drill_hits_sleep(d, &h, d->phase_ms);
    d->phase_secs[KVF_DRILL_RECOVER] = d->phase_ms / 1000.0;
    kvf_drill_workers_stop(d);
    kvf_drill_status(d, &c, &s1);
    kvf_record_figure(d->rec, "damaged copies dropped (tier_corrupt)",
                      s1.tier_corrupt, "", NAN, NAN);
    kvf_record_figure(d->rec, "gets loaded from disk", s1.tier_reads, "", NAN,
                      NAN);
    kvf_drill_check(d, flipped > 0, "no byte could be flipped in %s", path);
    kvf_drill_check(d, s1.tier_corrupt > 0,
                    "no damaged copy was caught (tier reads %.0f)",
                    s1.tier_reads);
    kvf_drill_hits_report(d, &h, 0);
    kvf_drill_traffic_report(d, bound);
    snprintf(text, sizeof(text),
             "%.0f damaged copies caught and dropped (%.0f loads from disk "
             "in all); %lu wrong bytes; the clients put the missing objects "
             "again (read-through)",
             s1.tier_corrupt, s1.tier_reads, (unsigned long)d->wrong_bytes);
    kvf_record_drill_text(d->rec, "observed", text);
    kvf_record_drill_text(d->rec, "recovery", "no action: read-through");
    kvf_drill_cluster_stop(&c);
    kvf_warm_rmdir(dir);
    (void)s0;
    return 0;
}

/* --- disk-full ------------------------------------------------------------ */

/* Takes the free space of the file system at dir with a filler file. */
static long kvf_warm_fill(const char *dir, char *path, size_t len)
{
    struct statvfs vs;
    off_t bytes;
    int fd;

    snprintf(path, len, "%s/filler", dir);
    if (statvfs(dir, &vs) != 0) {
        return -1;
    }
    bytes = (off_t)vs.f_bavail * (off_t)vs.f_frsize;
    fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        return -1;
    }
    if (posix_fallocate(fd, 0, bytes) != 0) {
        bytes = -1;
    }
    close(fd);
    return (long)bytes;
}

static void kvf_warm_full_report(kvf_drill_t *d, const kvf_drill_mstatus_t *s,
                                 double off_ms, long filled, uint64_t bound)
{
    char text[512];

    kvf_record_figure(d->rec, "tier off after the disk filled", off_ms, "ms",
                      NAN, NAN);
    kvf_record_figure(d->rec, "disk tiers off", s->tiers_off, "", NAN, NAN);
    kvf_drill_check(d, s->tiers_off == 1 && off_ms >= 0,
                    "the tier did not turn off (%.0f tiers off)", s->tiers_off);
    kvf_drill_traffic_report(d, bound);
    snprintf(text, sizeof(text),
             "%ld bytes of filler took the file system; the tier turned off "
             "%.0f ms later (one line on the node, one on the master); the "
             "pool served on; %lu wrong bytes; longest call %.0f ms",
             filled, off_ms, (unsigned long)d->wrong_bytes, d->max_wait_ms);
    kvf_record_drill_text(d->rec, "observed", text);
    kvf_record_drill_text(d->rec, "recovery",
                          "none needed for the traffic (memory only now); "
                          "the tier comes back when the node restarts with "
                          "room on its disk");
}

int kvf_drill_disk_full(kvf_drill_t *d)
{
    char dir[600], filler[700];
    kvf_drill_cluster_t c = {.replicas = 1,
                             .node_pool = 16u << 20,
                             .disk_dir = kvf_warm_dir(d, dir, sizeof(dir)),
                             .disk_size = 40u << 20};
    uint64_t bound = kvf_drill_store_bound(d, 1), t0, end;
    kvf_drill_mstatus_t s = {0};
    double off_ms = -1;
    long filled;

    kvf_drill_expect(d, "the disk tier's file system fills up under "
                        "traffic: the tier turns off with one clear line "
                        "(\"the disk is full\"), the master forgets its "
                        "copies, the node serves its pool on; no wrong "
                        "bytes, every call within its bound");
    if (mount("tmpfs", dir, "tmpfs", 0, "size=48m") != 0) {
        kvf_warm_rmdir(dir);
        kvf_drill_skip(d, "cannot mount a small tmpfs for the tier (%s)",
                       strerror(errno));
        return -1;
    }
    if (kvf_drill_store_begin(d, &c, 1, &kvf_warm_load, 2) != 0) {
        umount(dir);
        kvf_warm_rmdir(dir);
        return -1;
    }
    kvf_drill_store_baseline(d, &c, &(kvf_drill_res_t){0},
                             &(kvf_drill_res_t){0}, NULL, 0);
    kvf_drill_phase(d, KVF_DRILL_FAULT);
    t0 = kvf_time_ms();
    filled = kvf_warm_fill(dir, filler, sizeof(filler));
    kvf_drill_injected(d, "the tier's file system (a 48 MiB tmpfs) filled "
                          "with a filler file under traffic");
    for (end = t0 + 15000; kvf_time_ms() < end; kvf_drill_sleep(d, 50)) {
        if (kvf_drill_status(d, &c, &s) == 0 && s.tiers_off >= 1) {
            off_ms = (double)(kvf_time_ms() - t0);
            break;
        }
    }
    d->phase_secs[KVF_DRILL_FAULT] = (double)(kvf_time_ms() - t0) / 1e3;
    kvf_drill_phase(d, KVF_DRILL_RECOVER);
    unlink(filler);
    kvf_drill_sleep(d, d->phase_ms);
    d->phase_secs[KVF_DRILL_RECOVER] = d->phase_ms / 1000.0;
    kvf_drill_workers_stop(d);
    kvf_drill_status(d, &c, &s);
    kvf_warm_full_report(d, &s, off_ms, filled, bound);
    kvf_drill_cluster_stop(&c);
    umount(dir);
    kvf_warm_rmdir(dir);
    return 0;
}

/* --- dtype-swap ----------------------------------------------------------- */

typedef struct kvf_dt_w {
    kvf_store_h st;
    unsigned char *buf, *get, *scratch;
    const char *dtype, *other;
    kvf_rng_t rng;
} kvf_dt_w_t;

#define KVF_DT_KEYS 200
#define KVF_DT_SIZE (16 * 1024)

/* The key a server of dtype uses for chunk k: with the fingerprint, its
 * namespace; without (the fault), the chunk alone. */
static void kvf_dt_key(char *out, size_t len, const char *dtype, int fp,
                       unsigned k)
{
    if (fp) {
        snprintf(out, len, "dt/model-a/rev1/%s/tp0of1/chunk%u", dtype, k);
    } else {
        snprintf(out, len, "dt/model-a/rev1/chunk%u", k);
    }
}

/* The object's identity names its dtype: what a server of that dtype
 * wrote for chunk k. */
static void kvf_dt_ident(char *out, size_t len, const char *dtype, unsigned k)
{
    snprintf(out, len, "%s/chunk%u", dtype, k);
}

static void kvf_dt_step(kvf_drill_shared_t *sh, kvf_dt_w_t *w)
{
    unsigned k = (unsigned)kvf_rng_below(&w->rng, KVF_DT_KEYS);
    int phase = __atomic_load_n(&sh->phase, __ATOMIC_ACQUIRE);
    int fp = phase != KVF_DRILL_FAULT; /* one phase for the whole step */
    char key[128], mine[64], theirs[64];
    uint64_t t0 = kvf_time_ns();
    kvf_status_t s;
    size_t len = 0;

    kvf_dt_key(key, sizeof(key), w->dtype, fp, k);
    kvf_dt_ident(mine, sizeof(mine), w->dtype, k);
    s = kvf_store_get(w->st, key, w->get, KVF_DT_SIZE, &len, 0);
    kvf_drill_count(sh, s, (kvf_time_ns() - t0) / 1000, s == KVF_OK ? len : 0,
                    s == KVF_ERR_NO_KEY);
    if (s == KVF_ERR_NO_KEY) {
        kvf_drill_obj_fill(w->buf, mine, 1, KVF_DT_SIZE);
        s = kvf_store_put(w->st, key, w->buf, KVF_DT_SIZE, NULL);
        return;
    }
    if (s != KVF_OK) {
        return;
    }
    __atomic_add_fetch(&sh->get_hits, 1, __ATOMIC_RELAXED);
    if (kvf_drill_obj_check(w->get, len, mine, 0, w->scratch) == 0) {
        __atomic_add_fetch(&sh->checked_bytes, len, __ATOMIC_RELAXED);
        return;
    }
    kvf_dt_ident(theirs, sizeof(theirs), w->other, k);
    if (kvf_drill_obj_check(w->get, len, theirs, 0, w->scratch) == 0) {
        /* the other dtype's bytes: caught here, never used as data */
        __atomic_add_fetch(&sh->cross_ph[phase], 1, __ATOMIC_RELAXED);
        return;
    }
    kvf_drill_wrong(sh, len);
}

static int kvf_dt_main(kvf_drill_t *d, kvf_drill_shared_t *sh, void *arg)
{
    kvf_store_params_t p = {0};
    kvf_region_h reg;
    kvf_dt_w_t w = {0};

    (void)arg;
    w.dtype = sh->index == 0 ? "bf16" : "fp8";
    w.other = sh->index == 0 ? "fp8" : "bf16";
    kvf_rng_seed(&w.rng, d->seed * 31 + (uint64_t)sh->index);
    w.buf = aligned_alloc(4096, 3 * KVF_DT_SIZE);
    p.field_mask = KVF_STORE_PARAM_MASTER | KVF_STORE_PARAM_TIMEOUT;
    p.master = sh->addr;
    p.timeout_ms = d->timeout_ms;
    if (w.buf == NULL || kvf_store_connect(&p, &w.st) != KVF_OK ||
        kvf_engine_reg(kvf_store_engine(w.st), w.buf, 2 * KVF_DT_SIZE,
                       KVF_MEM_HOST, 0, &reg) != KVF_OK) {
        __atomic_store_n(&sh->failed, 1, __ATOMIC_RELEASE);
        return 1;
    }
    w.get = w.buf + KVF_DT_SIZE;
    w.scratch = w.get + KVF_DT_SIZE;
    __atomic_store_n(&sh->ready, 1, __ATOMIC_RELEASE);
    while (!kvf_drill_worker_poll(sh)) {
        kvf_dt_step(sh, &w);
    }
    kvf_engine_dereg(kvf_store_engine(w.st), reg);
    kvf_store_disconnect(w.st);
    return 0;
}

/* Cross-dtype hits of every worker in phase p. */
static uint64_t kvf_dt_cross(kvf_drill_t *d, int p)
{
    uint64_t n = 0;
    unsigned i;

    for (i = 0; i < d->nworkers; i++) {
        n += __atomic_load_n(&d->sh[i]->cross_ph[p], __ATOMIC_RELAXED);
    }
    return n;
}

int kvf_drill_dtype_swap(kvf_drill_t *d)
{
    kvf_drill_cluster_t c = {.replicas = 1};
    uint64_t bound = kvf_drill_store_bound(d, 1), x[KVF_DRILL_PHASES];
    char text[512];
    unsigned i;
    int p;

    kvf_drill_expect(d, "two clients of different dtypes (bf16, fp8) over "
                        "one store and the same token chunks, each with "
                        "its fingerprint (model, revision, dtype, TP rank) "
                        "in its keys, never share a hit; without it (the "
                        "fault) the other dtype's bytes come back and only "
                        "the check of each object catches them");
    if (kvf_drill_cluster_start(d, &c, 1) != 0) {
        return -1;
    }
    for (i = 0; i < 2; i++) {
        if (kvf_drill_worker(d, NULL, kvf_dt_main, NULL, c.master_addr) < 0) {
            kvf_drill_cluster_stop(&c);
            return -1;
        }
    }
    if (kvf_drill_workers_ready(d, 15000) != 0) {
        kvf_drill_cluster_stop(&c);
        return -1;
    }
    for (p = 0; p < KVF_DRILL_PHASES; p++) {
        kvf_drill_phase(d, p);
        if (p == KVF_DRILL_FAULT) {
            kvf_drill_injected(d, "both clients drop the fingerprint from "
                                  "their keys (as servers whose keys ignore "
                                  "the dtype) for one phase");
        }
        kvf_drill_sleep(d, d->phase_ms);
        d->phase_secs[p] = d->phase_ms / 1000.0;
    }
    kvf_drill_workers_stop(d);
    for (p = 0; p < KVF_DRILL_PHASES; p++) {
        x[p] = kvf_dt_cross(d, p);
    }
    kvf_record_figure(d->rec, "cross-dtype hits with fingerprints",
                      (double)(x[0] + x[2]), "gets", NAN, NAN);
    kvf_record_figure(d->rec, "cross-dtype hits without (the fault)",
                      (double)x[1], "gets", NAN, NAN);
    kvf_drill_check(d, x[0] + x[2] == 0,
                    "%lu cross-dtype hits with fingerprints",
                    (unsigned long)(x[0] + x[2]));
    kvf_drill_check(d, x[1] > 0,
                    "without fingerprints no cross-dtype hit was seen (the "
                    "check would not catch one)");
    kvf_drill_traffic_report(d, bound);
    snprintf(text, sizeof(text),
             "%lu cross-dtype hits with fingerprints (baseline and "
             "recovery), %lu without (each caught by the object check); "
             "%lu wrong bytes",
             (unsigned long)(x[0] + x[2]), (unsigned long)x[1],
             (unsigned long)d->wrong_bytes);
    kvf_record_drill_text(d->rec, "observed", text);
    kvf_record_drill_text(d->rec, "recovery",
                          "fingerprints back: each dtype's keys are its own "
                          "again");
    kvf_drill_cluster_stop(&c);
    return 0;
}
