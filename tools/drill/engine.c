/*
 * Engine-level drills and their traffic worker.
 *
 * The blocks worker (also used by partition and slow-link) owns one slice
 * of the target's pool and keeps a mirror of what that slice must hold:
 * the target's seeded bytes at start, then every block it wrote with
 * success. Each call is one batch of random 8 KiB blocks of its slice,
 * READ or WRITE, waited at most call_ms (then cancelled, bounded by the
 * engine timeout). A READ operation reported successful must return the
 * mirror's bytes, else the difference counts as wrong bytes. A block
 * whose WRITE failed is retired: its bytes are undefined, and may even
 * change later (bytes already sent on a connection that timed out can
 * still land when the link heals), so it is never verified again.
 *
 * target-kill: the target is SIGKILLed under traffic; every call fails
 * within its bound; a new target starts and the workers reopen their
 * peer. engine-faults: the workers' peers are wrapped by the fault
 * transport (KVF_FAULT: drops, delays, resets) for a while, then opened
 * plain again.
 */
#include "tools/drill/drill.h"

#include <kvferry/config.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/rng.h"
#include "core/time.h"

#define KVF_BW_BLOCK    8192
#define KVF_BW_PER_CALL 32
#define KVF_BW_POOL     "16M"
#define KVF_BW_RETIRED  2

typedef struct kvf_bw {
    kvf_drill_t *d;
    kvf_drill_shared_t *sh;
    kvf_engine_h eng;
    kvf_region_h reg;
    unsigned char *local; /* src blocks, then dst blocks */
    kvf_peer_h peer;
    uint64_t remote, remote_len;
    uint64_t lo, nblocks; /* the slice, in blocks */
    unsigned char *mirror;
    unsigned char *state; /* 1 known, 2 retired */
    kvf_rng_t rng;
    int gen;
    uint64_t seed;
    int selftest_wrong; /* KVF_DRILL_SELFTEST=wrong: flip one read byte */
    int selftest_leak;  /* KVF_DRILL_SELFTEST=leak: keep fds open */
} kvf_bw_t;

static int kvf_bw_setup_fail(kvf_bw_t *w, const char *what, kvf_status_t st)
{
    snprintf(w->sh->note, sizeof(w->sh->note), "%s: %s", what,
             kvf_status_str(st));
    __atomic_store_n(&w->sh->failed, 1, __ATOMIC_RELEASE);
    return 1;
}

/* The slice's expected bytes: the target's seeded pool. */
static int kvf_bw_mirror_reset(kvf_bw_t *w)
{
    unsigned char *all;
    kvf_rng_t rng;

    /* mapped and unmapped here, so the pool copy never stays in the
     * worker's heap and its RSS compares across the drill */
    all = mmap(NULL, w->remote_len, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (all == MAP_FAILED) {
        return -1;
    }
    kvf_rng_seed(&rng, w->seed);
    kvf_rng_fill(&rng, all, w->remote_len);
    memcpy(w->mirror, all + w->lo * KVF_BW_BLOCK, w->nblocks * KVF_BW_BLOCK);
    memset(w->state, 1, w->nblocks);
    munmap(all, w->remote_len);
    return 0;
}

/* Opens the peer at sh->addr (KVF_FAULT from sh->fault); one call. */
static kvf_status_t kvf_bw_open(kvf_bw_t *w)
{
    kvf_drill_shared_t *sh = w->sh;
    uint64_t t0 = kvf_time_ns(), addr, total;
    kvf_mem_type_t type;
    kvf_status_t st;
    size_t len, i;

    if (sh->fault[0] != '\0') {
        setenv("KVF_FAULT", sh->fault, 1);
    } else {
        unsetenv("KVF_FAULT");
    }
    st = kvf_peer_open(w->eng, sh->addr, &w->peer);
    kvf_drill_count(sh, st, (kvf_time_ns() - t0) / 1000, 0, 0);
    if (st != KVF_OK) {
        w->peer = NULL;
        return st;
    }
    snprintf(sh->transport, sizeof(sh->transport), "%s",
             kvf_peer_transport(w->peer));
    w->remote_len = 0;
    for (i = 0; kvf_peer_region(w->peer, i, &addr, &len, &type) == KVF_OK;
         i++) {
        if (type != KVF_MEM_CUDA && len > w->remote_len) {
            w->remote = addr;
            w->remote_len = len;
        }
    }
    total = w->remote_len / KVF_BW_BLOCK;
    if (w->mirror == NULL) {
        w->nblocks = total / (uint64_t)sh->nworkers;
        w->lo = w->nblocks * (uint64_t)sh->index;
        w->mirror = malloc(w->nblocks * KVF_BW_BLOCK);
        w->state = malloc(w->nblocks);
        if (w->nblocks < 4 * KVF_BW_PER_CALL || w->mirror == NULL ||
            w->state == NULL || kvf_bw_mirror_reset(w) != 0) {
            return KVF_ERR_NO_MEMORY;
        }
    }
    return KVF_OK;
}

/* Picks n distinct, non-retired blocks of the slice; returns how many. */
static unsigned kvf_bw_pick(kvf_bw_t *w, uint64_t *blk, unsigned n)
{
    unsigned got = 0, tries = 0, j;
    uint64_t b;

    while (got < n && tries++ < n * 8) {
        b = kvf_rng_below(&w->rng, w->nblocks);
        if (w->state[b] == KVF_BW_RETIRED) {
            continue;
        }
        for (j = 0; j < got && blk[j] != b; j++) {
        }
        if (j == got) {
            blk[got++] = b;
        }
    }
    return got;
}

/* One batch call: READ or WRITE of random blocks, verified. */
static void kvf_bw_call(kvf_bw_t *w)
{
    kvf_drill_shared_t *sh = w->sh;
    kvf_drill_t *d = w->d;
    kvf_op_t ops[KVF_BW_PER_CALL];
    kvf_status_t st, ost[KVF_BW_PER_CALL];
    uint64_t blk[KVF_BW_PER_CALL], t0, moved = 0;
    size_t bytes[KVF_BW_PER_CALL], k, diff;
    unsigned n, j;
    int write = kvf_rng_below(&w->rng, 100) < 40;
    unsigned char *src = w->local;
    unsigned char *dst = w->local + KVF_BW_PER_CALL * KVF_BW_BLOCK;
    kvf_batch_h b;

    n = kvf_bw_pick(w, blk, KVF_BW_PER_CALL);
    if (n == 0) {
        return;
    }
    for (j = 0; j < n; j++) {
        ops[j].type = write ? KVF_OP_WRITE : KVF_OP_READ;
        ops[j].local = (write ? src : dst) + (size_t)j * KVF_BW_BLOCK;
        ops[j].peer = w->peer;
        ops[j].remote = w->remote + (w->lo + blk[j]) * KVF_BW_BLOCK;
        ops[j].length = KVF_BW_BLOCK;
        if (write) {
            kvf_rng_fill(&w->rng, ops[j].local, KVF_BW_BLOCK);
        } else {
            memset(ops[j].local, 0xA5, KVF_BW_BLOCK);
        }
    }
    t0 = kvf_time_ns();
    st = kvf_batch_submit(w->eng, ops, n, &b);
    if (st == KVF_OK) {
        st = kvf_batch_wait(b, (int)d->call_ms);
        if (st == KVF_ERR_TIMEOUT) {
            kvf_batch_cancel(b);
            kvf_batch_wait(b, (int)d->timeout_ms * 2);
        }
        for (j = 0; j < n; j++) {
            ost[j] = kvf_batch_op_status(b, j, &bytes[j]);
        }
        kvf_batch_destroy(b);
    } else {
        for (j = 0; j < n; j++) {
            ost[j] = st;
            bytes[j] = 0;
        }
    }
    for (j = 0; j < n; j++) {
        unsigned char *m = w->mirror + blk[j] * KVF_BW_BLOCK;

        if (ost[j] == KVF_OK && bytes[j] == KVF_BW_BLOCK) {
            moved += KVF_BW_BLOCK;
        }
        if (write) {
            if (ost[j] == KVF_OK && bytes[j] == KVF_BW_BLOCK) {
                memcpy(m, ops[j].local, KVF_BW_BLOCK);
                w->state[blk[j]] = 1;
            } else {
                w->state[blk[j]] = KVF_BW_RETIRED;
            }
            continue;
        }
        if (ost[j] != KVF_OK) {
            continue; /* a failed read hands nothing back */
        }
        if (bytes[j] != KVF_BW_BLOCK) {
            kvf_drill_wrong(sh, KVF_BW_BLOCK - bytes[j]);
            continue;
        }
        if (w->selftest_wrong && j == 0 && sh->phase == KVF_DRILL_RECOVER) {
            ((unsigned char *)ops[j].local)[100] ^= 1; /* must be caught */
            w->selftest_wrong = 0;
        }
        if (memcmp(ops[j].local, m, KVF_BW_BLOCK) != 0) {
            for (k = 0, diff = 0; k < KVF_BW_BLOCK; k++) {
                diff += (((unsigned char *)ops[j].local)[k] != m[k]);
            }
            kvf_drill_wrong(sh, diff);
        }
        __atomic_add_fetch(&sh->checked_bytes, KVF_BW_BLOCK, __ATOMIC_RELAXED);
    }
    kvf_drill_count(sh, st, (kvf_time_ns() - t0) / 1000, moved, 0);
    if (st != KVF_OK) {
        usleep(KVF_DRILL_BACKOFF_US); /* a client backs off on errors */
    }
}

static int kvf_bw_main(kvf_drill_t *d, kvf_drill_shared_t *sh, void *arg)
{
    kvf_engine_params_t p = {0};
    size_t local_len = 2u * KVF_BW_PER_CALL * KVF_BW_BLOCK;
    kvf_status_t st;
    uint64_t t0;
    kvf_bw_t w;
    int gen;

    memset(&w, 0, sizeof(w));
    w.d = d;
    w.sh = sh;
    w.seed = *(const uint64_t *)arg;
    kvf_rng_seed(&w.rng, d->seed * 1000003u + (uint64_t)sh->index + 1);
    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_TIMEOUT |
                   KVF_ENGINE_PARAM_CONNS;
    p.no_listen = 1;
    p.timeout_ms = d->timeout_ms;
    p.conns = 2;
    if (sh->tcp_only) {
        /* a drill of the network path: never a same-host shortcut */
        p.transports = "tcp";
        p.field_mask |= KVF_ENGINE_PARAM_TRANSPORTS;
    }
    st = kvf_engine_create(&p, &w.eng);
    if (st != KVF_OK) {
        return kvf_bw_setup_fail(&w, "engine", st);
    }
    w.local = aligned_alloc(4096, local_len);
    if (w.local == NULL) {
        return kvf_bw_setup_fail(&w, "buffer", KVF_ERR_NO_MEMORY);
    }
    st = kvf_engine_reg(w.eng, w.local, local_len, KVF_MEM_HOST, 0, &w.reg);
    if (st != KVF_OK) {
        return kvf_bw_setup_fail(&w, "register", st);
    }
    if (kvf_config_get("drill_selftest") != NULL) {
        w.selftest_wrong =
            strcmp(kvf_config_get("drill_selftest"), "wrong") == 0;
        w.selftest_leak = strcmp(kvf_config_get("drill_selftest"), "leak") == 0;
    }
    /* the slices need the number of workers, known once all forked */
    for (t0 = kvf_time_ms() + 10000;
         __atomic_load_n(&sh->nworkers, __ATOMIC_ACQUIRE) == 0;) {
        if (kvf_time_ms() > t0) {
            return kvf_bw_setup_fail(&w, "worker count", KVF_ERR_TIMEOUT);
        }
        usleep(1000);
    }
    w.gen = __atomic_load_n(&sh->gen, __ATOMIC_ACQUIRE);
    st = kvf_bw_open(&w);
    if (st != KVF_OK) {
        return kvf_bw_setup_fail(&w, "first peer open", st);
    }
    __atomic_store_n(&sh->ready, 1, __ATOMIC_RELEASE);
    while (!kvf_drill_worker_poll(sh)) {
        gen = __atomic_load_n(&sh->gen, __ATOMIC_ACQUIRE);
        if (gen != w.gen) {
            w.gen = gen;
            if (w.peer != NULL && w.selftest_leak) {
                w.peer = NULL; /* the checks must notice */
            } else if (w.peer != NULL) {
                kvf_peer_close(w.peer);
                w.peer = NULL;
            }
            if (__atomic_load_n(&sh->fresh, __ATOMIC_ACQUIRE) &&
                w.mirror != NULL && kvf_bw_mirror_reset(&w) != 0) {
                return kvf_bw_setup_fail(&w, "mirror", KVF_ERR_NO_MEMORY);
            }
            kvf_bw_open(&w);
            __atomic_store_n(&sh->gen_seen, gen, __ATOMIC_RELEASE);
            continue;
        }
        if (w.peer == NULL) {
            if (kvf_bw_open(&w) != KVF_OK) {
                usleep(50000);
            }
            continue;
        }
        kvf_bw_call(&w);
    }
    if (w.peer != NULL) {
        kvf_peer_close(w.peer);
    }
    kvf_engine_dereg(w.eng, w.reg);
    kvf_engine_destroy(w.eng);
    free(w.local);
    free(w.mirror);
    free(w.state);
    return 0;
}

int kvf_drill_blocks_workers(kvf_drill_t *d, const char *netns,
                             const char *segment, unsigned n)
{
    static uint64_t seed;
    unsigned i;

    seed = d->seed + 2; /* the target's --seed */
    for (i = 0; i < n; i++) {
        if (kvf_drill_worker(d, netns, kvf_bw_main, &seed, segment) < 0) {
            kvf_drill_fail(d, "cannot start worker %u", i);
            return -1;
        }
    }
    return kvf_drill_workers_ready(d, 15000);
}

pid_t kvf_drill_start_target(kvf_drill_t *d, const char *netns,
                             const char *listen, char *segment, size_t seglen)
{
    char seed[32], line[512];
    pid_t pid;

    snprintf(seed, sizeof(seed), "%lu", (unsigned long)(d->seed + 2));
    /* in a namespace the drill is about the network: tcp only */
    pid = kvf_drill_spawn(
        d, netns, "target", line, sizeof(line),
        (const char *const[]){"target", "--listen", listen, "--pool",
                              KVF_BW_POOL, "--seed", seed, "--transports",
                              netns != NULL ? "tcp" : "auto", NULL});
    if (pid < 0 || kvf_drill_field(line, "segment", segment, seglen) != 0) {
        kvf_drill_fail(d, "the target did not start ('%s')", line);
        kvf_drill_kill(pid, SIGKILL);
        return -1;
    }
    return pid;
}

int kvf_drill_target_kill(kvf_drill_t *d)
{
    kvf_drill_res_t base, after;
    char seg[KVF_DRILL_ADDR], text[512];
    uint64_t bound = d->call_ms + d->timeout_ms, t_kill, t_heal, t_end;
    double first_err, rec;
    pid_t target;

    snprintf(text, sizeof(text),
             "the target dies mid-batch: every call in flight fails within "
             "its bound (%u ms wait + %u ms engine timeout for the cancel), "
             "none hands back wrong bytes; once a new target runs, the "
             "clients reopen their peer and traffic resumes; their fds, "
             "sockets, allocations and RSS come back to the baseline",
             d->call_ms, d->timeout_ms);
    kvf_drill_expect(d, text);
    target = kvf_drill_start_target(d, NULL, "127.0.0.1:0", seg, sizeof(seg));
    if (target < 0 || kvf_drill_blocks_workers(d, NULL, seg, 2) != 0) {
        return -1;
    }
    kvf_drill_phase(d, KVF_DRILL_BASE);
    kvf_drill_sleep(d, d->phase_ms);
    kvf_drill_workers_pause(d, &base, 1);
    d->phase_secs[KVF_DRILL_BASE] = d->phase_ms / 1000.0;

    kvf_drill_phase(d, KVF_DRILL_FAULT);
    t_kill = kvf_time_ms();
    kvf_drill_kill(target, SIGKILL);
    kvf_drill_log(d, "target %d SIGKILLed under traffic", (int)target);
    snprintf(text, sizeof(text),
             "SIGKILL to the target (pid %d, pool %s) while 2 client "
             "processes ran batches of %d x 8 KiB READ/WRITE",
             (int)target, KVF_BW_POOL, KVF_BW_PER_CALL);
    kvf_record_drill_text(d->rec, "injected", text);
    kvf_drill_sleep(d, (unsigned)bound + 500);
    first_err = kvf_drill_first_error_after(d, KVF_DRILL_FAULT, t_kill);
    kvf_record_figure(d->rec, "first error after the kill (slowest client)",
                      first_err, "ms", NAN, NAN);
    kvf_drill_check(
        d, first_err >= 0 && first_err <= (double)bound + KVF_DRILL_SLACK_MS,
        "clients saw the dead target after %.0f ms (bound %lu)", first_err,
        (unsigned long)bound);

    target = kvf_drill_start_target(d, NULL, "127.0.0.1:0", seg, sizeof(seg));
    if (target < 0) {
        return -1;
    }
    t_heal = kvf_time_ms();
    d->phase_secs[KVF_DRILL_FAULT] = (double)(t_heal - t_kill) / 1000.0;
    kvf_drill_phase(d, KVF_DRILL_RECOVER);
    kvf_drill_workers_retarget(d, seg, NULL, 1);
    rec = kvf_drill_wait_recovered(d, t_heal, 10000);
    d->time_to_recover_ms = rec;
    kvf_drill_check(d, rec >= 0, "traffic did not resume on the new target");
    kvf_drill_sleep(d, d->phase_ms);
    kvf_drill_workers_pause(d, &after, 1);
    t_end = kvf_time_ms();
    d->phase_secs[KVF_DRILL_RECOVER] = (double)(t_end - t_heal) / 1000.0;
    kvf_drill_workers_stop(d);
    kvf_drill_kill(target, SIGTERM);
    kvf_drill_resources(d, "clients", &base, &after);
    kvf_drill_traffic_report(d, bound);
    snprintf(text, sizeof(text),
             "every client saw errors %.0f ms after the kill at the latest; "
             "%lu wrong bytes; longest call %.0f ms (bound %lu ms)",
             first_err, (unsigned long)d->wrong_bytes, d->max_wait_ms,
             (unsigned long)bound);
    kvf_record_drill_text(d->rec, "observed", text);
    snprintf(text, sizeof(text),
             "a new target started with the same seed; the clients closed "
             "the dead peer, opened the new one and served again %.0f ms "
             "after it was up",
             rec);
    kvf_record_drill_text(d->rec, "recovery", text);
    return 0;
}

int kvf_drill_engine_faults(kvf_drill_t *d)
{
    kvf_drill_res_t base, after;
    char seg[KVF_DRILL_ADDR], text[512], spec[128];
    uint64_t bound = d->call_ms + d->timeout_ms, t0, t_heal, t_end;
    double rec;
    pid_t target;

    snprintf(spec, sizeof(spec),
             "seed=%lu,drop=0.03,delay_ms=1,jitter_ms=4,reset_after=40",
             (unsigned long)d->seed);
    snprintf(text, sizeof(text),
             "requests dropped, delayed and reset by the fault wrapper turn "
             "into KVF_ERR_TIMEOUT / KVF_ERR_CONN_RESET within the bound "
             "(%lu ms), never into wrong bytes; with the wrapper gone, "
             "service is clean again and the clients' resources are back",
             (unsigned long)bound);
    kvf_drill_expect(d, text);
    target = kvf_drill_start_target(d, NULL, "127.0.0.1:0", seg, sizeof(seg));
    if (target < 0 || kvf_drill_blocks_workers(d, NULL, seg, 2) != 0) {
        return -1;
    }
    kvf_drill_phase(d, KVF_DRILL_BASE);
    kvf_drill_sleep(d, d->phase_ms);
    kvf_drill_workers_pause(d, &base, 1);
    d->phase_secs[KVF_DRILL_BASE] = d->phase_ms / 1000.0;

    t0 = kvf_time_ms();
    kvf_drill_phase(d, KVF_DRILL_FAULT);
    kvf_drill_workers_retarget(d, NULL, spec, 0);
    snprintf(text, sizeof(text),
             "KVF_FAULT=%s on every client peer for "
             "%u ms",
             spec, 2 * d->phase_ms);
    kvf_record_drill_text(d->rec, "injected", text);
    kvf_record_config(d->rec, "fault spec", spec);
    kvf_drill_sleep(d, 2 * d->phase_ms);

    kvf_drill_workers_retarget(d, NULL, "", 0);
    t_heal = kvf_time_ms();
    d->phase_secs[KVF_DRILL_FAULT] = (double)(t_heal - t0) / 1000.0;
    kvf_drill_phase(d, KVF_DRILL_RECOVER);
    rec = kvf_drill_wait_recovered(d, t_heal, 10000);
    d->time_to_recover_ms = rec;
    kvf_drill_check(d, rec >= 0, "traffic did not resume without faults");
    kvf_drill_sleep(d, d->phase_ms);
    kvf_drill_workers_pause(d, &after, 1);
    t_end = kvf_time_ms();
    d->phase_secs[KVF_DRILL_RECOVER] = (double)(t_end - t_heal) / 1000.0;
    kvf_drill_workers_stop(d);
    kvf_drill_kill(target, SIGTERM);
    kvf_drill_resources(d, "clients", &base, &after);
    kvf_drill_traffic_report(d, bound);
    kvf_drill_check(d, d->err_calls[KVF_DRILL_FAULT] > 0,
                    "the injected faults caused no error at all");
    kvf_drill_check(d, d->err_calls[KVF_DRILL_RECOVER] == 0,
                    "%lu calls failed after the faults were removed",
                    (unsigned long)d->err_calls[KVF_DRILL_RECOVER]);
    snprintf(text, sizeof(text),
             "%lu calls failed under faults, %lu succeeded; 0 failed after; "
             "%lu wrong bytes; longest call %.0f ms (bound %lu ms)",
             (unsigned long)d->err_calls[KVF_DRILL_FAULT],
             (unsigned long)d->ok_calls[KVF_DRILL_FAULT],
             (unsigned long)d->wrong_bytes, d->max_wait_ms,
             (unsigned long)bound);
    kvf_record_drill_text(d->rec, "observed", text);
    kvf_record_drill_text(d->rec, "recovery",
                          "the clients reopened their peers without the "
                          "wrapper; the next call succeeded");
    return 0;
}
