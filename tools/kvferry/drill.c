/*
 * `kvferry drill NAME|all|list`: runs fault drills (seed 003 §4) and
 * writes one record per drill (--record DIR, default a fresh temporary
 * directory, printed). Exit status: 0 every expectation held, 1 one did
 * not, 77 skipped (a single drill that needs root or the store), 2 usage.
 *
 * This file holds the drill table, the command, and the conductor's side
 * of the workers (start, pause for resource snapshots, phases, stop) plus
 * the report that every drill shares: wrong bytes, the longest wait
 * against its bound, errors by status, per-phase calls, throughput and
 * latency, time to recover, resources before and after.
 */
#include "tools/kvferry/drill.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/time.h"

static const kvf_drill_def_t kvf_drills[] = {
    {"target-kill", kvf_drill_target_kill, 0, 0,
     "engine target SIGKILLed mid-batch: operations fail within the "
     "timeout, a new target serves again"},
    {"engine-faults", kvf_drill_engine_faults, 0, 0,
     "fault wrapper drops, delays and resets requests: bounded waits, no "
     "wrong bytes, clean service after"},
    {"partition", kvf_drill_partition, 1, 0,
     "client and target in two namespaces, veth cut (nft drop, then link "
     "down) and healed: traffic resumes"},
    {"slow-link", kvf_drill_slow_link, 1, 0,
     "the veth throttled with tc tbf: throughput degrades, waits stay "
     "bounded, no wrong bytes"},
    {NULL, NULL, 0, 0, NULL},
};

/* --- conductor messages and verdict ----------------------------------- */

static void kvf_drill_vappend(kvf_drill_t *d, const char *fmt, va_list ap)
{
    size_t n = strlen(d->why);

    if (n > 0 && n + 2 < sizeof(d->why)) {
        d->why[n++] = ';';
        d->why[n++] = ' ';
        d->why[n] = '\0';
    }
    if (n < sizeof(d->why)) {
        vsnprintf(d->why + n, sizeof(d->why) - n, fmt, ap);
    }
}

void kvf_drill_log(kvf_drill_t *d, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "[drill %s %6.1fs] ", d->name,
            (double)(kvf_time_ms() - d->t_start_ms) / 1000.0);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void kvf_drill_fail(kvf_drill_t *d, const char *fmt, ...)
{
    va_list ap;

    d->failed = 1;
    va_start(ap, fmt);
    kvf_drill_vappend(d, fmt, ap);
    va_end(ap);
    kvf_drill_log(d, "EXPECTATION FAILED: %s", d->why);
}

int kvf_drill_check(kvf_drill_t *d, int cond, const char *fmt, ...)
{
    va_list ap;

    if (cond) {
        return 1;
    }
    d->failed = 1;
    va_start(ap, fmt);
    kvf_drill_vappend(d, fmt, ap);
    va_end(ap);
    kvf_drill_log(d, "EXPECTATION FAILED: %s", d->why);
    return 0;
}

void kvf_drill_expect(kvf_drill_t *d, const char *text)
{
    kvf_record_drill_text(d->rec, "expected", text);
    if (d->hypothesis == NULL) {
        kvf_record_hypothesis(d->rec, text);
    }
}

void kvf_drill_skip(kvf_drill_t *d, const char *fmt, ...)
{
    va_list ap;

    d->skipped = 1;
    va_start(ap, fmt);
    kvf_drill_vappend(d, fmt, ap);
    va_end(ap);
}

/* --- workers, conductor side ------------------------------------------- */

static int kvf_drill_workers_alive(kvf_drill_t *d)
{
    unsigned i;
    int st;

    for (i = 0; i < d->nworkers; i++) {
        if (d->wpid[i] > 0 && waitpid(d->wpid[i], &st, WNOHANG) == d->wpid[i]) {
            kvf_drill_fail(d, "worker %u exited early (%s%s)", i,
                           d->sh[i]->note[0] ? "" : "status ",
                           d->sh[i]->note[0] ? d->sh[i]->note : "?");
            d->wpid[i] = 0;
            return 0;
        }
    }
    return 1;
}

void kvf_drill_sleep(kvf_drill_t *d, unsigned ms)
{
    uint64_t end = kvf_time_ms() + ms;

    while (kvf_time_ms() < end) {
        usleep(10000);
        if (!kvf_drill_workers_alive(d)) {
            return;
        }
    }
}

void kvf_drill_phase(kvf_drill_t *d, int phase)
{
    unsigned i;

    for (i = 0; i < d->nworkers; i++) {
        __atomic_store_n(&d->sh[i]->phase, phase, __ATOMIC_RELEASE);
    }
}

double kvf_drill_wait_recovered(kvf_drill_t *d, uint64_t since_ms,
                                unsigned max_ms)
{
    uint64_t end = kvf_time_ms() + max_ms, t, worst;
    unsigned i, done;

    for (;;) {
        worst = 0;
        done = 0;
        for (i = 0; i < d->nworkers; i++) {
            t = __atomic_load_n(&d->sh[i]->ph[KVF_DRILL_RECOVER].first_ok_ms,
                                __ATOMIC_ACQUIRE);
            if (t >= since_ms && t != 0) {
                done++;
                worst = (t - since_ms > worst) ? t - since_ms : worst;
            }
        }
        if (done == d->nworkers) {
            return (double)worst;
        }
        if (kvf_time_ms() > end || !kvf_drill_workers_alive(d)) {
            return -1.0;
        }
        usleep(5000);
    }
}

int kvf_drill_worker(kvf_drill_t *d, const char *netns,
                     kvf_drill_worker_fn fn, void *arg, const char *addr)
{
    kvf_drill_shared_t *sh;
    unsigned i = d->nworkers;
    pid_t pid;

    if (i >= KVF_DRILL_WORKERS_MAX) {
        return -1;
    }
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        return -1;
    }
    memset(sh, 0, sizeof(*sh));
    sh->index = (int)i;
    snprintf(sh->addr, sizeof(sh->addr), "%s", addr ? addr : "");
    d->sh[i] = sh;
    d->nworkers++;
    pid = kvf_drill_fork(netns);
    if (pid < 0) {
        d->nworkers--;
        munmap(sh, sizeof(*sh));
        return -1;
    }
    if (pid == 0) {
        char tag[32];
        int rc;

        snprintf(tag, sizeof(tag), "worker%u", i);
        kvf_drill_log_to(d, tag);
        rc = fn(d, sh, arg);
        _exit(rc);
    }
    d->wpid[i] = pid;
    return (int)i;
}

int kvf_drill_workers_ready(kvf_drill_t *d, unsigned max_ms)
{
    uint64_t end = kvf_time_ms() + max_ms;
    unsigned i, n;

    for (i = 0; i < d->nworkers; i++) {
        d->sh[i]->nworkers = (int)d->nworkers;
    }
    do {
        n = 0;
        for (i = 0; i < d->nworkers; i++) {
            n += (__atomic_load_n(&d->sh[i]->ready, __ATOMIC_ACQUIRE) != 0);
        }
        if (n == d->nworkers) {
            return 0;
        }
        if (!kvf_drill_workers_alive(d)) {
            return -1;
        }
        usleep(5000);
    } while (kvf_time_ms() < end);
    kvf_drill_fail(d, "workers not ready after %u ms", max_ms);
    return -1;
}

int kvf_drill_workers_pause(kvf_drill_t *d, kvf_drill_res_t *res_p,
                            int resume)
{
    uint64_t end = kvf_time_ms() + d->call_ms + d->timeout_ms * 3 + 5000;
    unsigned i, n;
    int rc = 0;

    for (i = 0; i < d->nworkers; i++) {
        __atomic_store_n(&d->sh[i]->pause, 1, __ATOMIC_RELEASE);
    }
    do {
        n = 0;
        for (i = 0; i < d->nworkers; i++) {
            n += (__atomic_load_n(&d->sh[i]->paused, __ATOMIC_ACQUIRE) != 0);
        }
        if (n == d->nworkers || !kvf_drill_workers_alive(d)) {
            break;
        }
        usleep(2000);
    } while (kvf_time_ms() < end);
    if (n != d->nworkers) {
        kvf_drill_fail(d, "workers did not pause (a call hung?)");
        rc = -1;
    }
    if (res_p != NULL) {
        memset(res_p, 0, sizeof(*res_p));
        res_p->objects = NAN;
        for (i = 0; i < d->nworkers; i++) {
            const kvf_drill_res_t *r = &d->sh[i]->res;

            res_p->alloc_bytes += r->alloc_bytes;
            res_p->conns += r->conns;
            res_p->fds += r->fds;
            res_p->rss_kb += r->rss_kb;
        }
    }
    if (resume) {
        for (i = 0; i < d->nworkers; i++) {
            __atomic_store_n(&d->sh[i]->pause, 0, __ATOMIC_RELEASE);
        }
    }
    return rc;
}

void kvf_drill_workers_stop(kvf_drill_t *d)
{
    uint64_t end = kvf_time_ms() + d->call_ms + d->timeout_ms * 3 + 5000;
    unsigned i;
    int st;

    for (i = 0; i < d->nworkers; i++) {
        __atomic_store_n(&d->sh[i]->stop, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&d->sh[i]->pause, 0, __ATOMIC_RELEASE);
    }
    for (i = 0; i < d->nworkers; i++) {
        if (d->wpid[i] <= 0) {
            continue;
        }
        while (waitpid(d->wpid[i], &st, WNOHANG) == 0) {
            if (kvf_time_ms() > end) {
                kvf_drill_fail(d, "worker %u did not stop in time", i);
                kvf_drill_kill(d->wpid[i], SIGKILL);
                break;
            }
            usleep(5000);
        }
        kvf_drill_untrack_pid(d->wpid[i]);
        if (d->sh[i]->failed) {
            kvf_drill_fail(d, "worker %u: %s", i, d->sh[i]->note);
        }
        d->wpid[i] = 0;
    }
}

int kvf_drill_workers_retarget(kvf_drill_t *d, const char *addr,
                               const char *fault, int fresh)
{
    uint64_t end = kvf_time_ms() + d->call_ms + d->timeout_ms * 4 + 5000;
    unsigned i, n;
    int gen[KVF_DRILL_WORKERS_MAX];

    for (i = 0; i < d->nworkers; i++) {
        kvf_drill_shared_t *sh = d->sh[i];

        if (addr != NULL) {
            snprintf(sh->addr, sizeof(sh->addr), "%s", addr);
        }
        if (fault != NULL) {
            snprintf(sh->fault, sizeof(sh->fault), "%s", fault);
        }
        __atomic_store_n(&sh->fresh, fresh, __ATOMIC_RELEASE);
        gen[i] = __atomic_add_fetch(&sh->gen, 1, __ATOMIC_RELEASE);
    }
    do {
        n = 0;
        for (i = 0; i < d->nworkers; i++) {
            n += (__atomic_load_n(&d->sh[i]->gen_seen, __ATOMIC_ACQUIRE) ==
                  gen[i]);
        }
        if (n == d->nworkers) {
            return 0;
        }
        if (!kvf_drill_workers_alive(d)) {
            return -1;
        }
        usleep(2000);
    } while (kvf_time_ms() < end);
    kvf_drill_fail(d, "workers did not switch to the new service in time");
    return -1;
}

uint64_t kvf_drill_bytes(kvf_drill_t *d, int phase)
{
    uint64_t sum = 0;
    unsigned i;

    for (i = 0; i < d->nworkers; i++) {
        sum += __atomic_load_n(&d->sh[i]->ph[phase].bytes_ok,
                               __ATOMIC_ACQUIRE);
    }
    return sum;
}

/* --- worker side -------------------------------------------------------- */

static unsigned kvf_drill_bucket(uint64_t us)
{
    unsigned e, idx;

    if (us < 4) {
        return (unsigned)us;
    }
    e = 63u - (unsigned)__builtin_clzll(us);
    idx = 4 + (e - 2) * 4 + (unsigned)((us >> (e - 2)) & 3);
    return idx < KVF_DRILL_HIST ? idx : KVF_DRILL_HIST - 1;
}

static double kvf_drill_bucket_us(unsigned idx)
{
    unsigned e, sub;

    if (idx < 4) {
        return idx;
    }
    e = (idx - 4) / 4 + 2;
    sub = (idx - 4) % 4;
    /* middle of the bucket */
    return (double)((4u + sub) * (1ull << (e - 2))) +
           (double)(1ull << (e - 2)) / 2.0;
}

static void kvf_drill_first(uint64_t *slot, uint64_t now)
{
    uint64_t zero = 0;

    __atomic_compare_exchange_n(slot, &zero, now, 0, __ATOMIC_RELEASE,
                                __ATOMIC_RELAXED);
}

void kvf_drill_count(kvf_drill_shared_t *sh, kvf_status_t st, uint64_t us,
                     uint64_t bytes, int miss)
{
    int phase = __atomic_load_n(&sh->phase, __ATOMIC_ACQUIRE);
    kvf_drill_phase_t *ph = &sh->ph[phase];
    uint64_t now = kvf_time_ms(), cur;

    if (st == KVF_OK || miss) {
        if (st == KVF_OK) {
            __atomic_add_fetch(&ph->calls_ok, 1, __ATOMIC_RELAXED);
            __atomic_add_fetch(&ph->bytes_ok, bytes, __ATOMIC_RELAXED);
        } else {
            __atomic_add_fetch(&ph->misses, 1, __ATOMIC_RELAXED);
        }
        kvf_drill_first(&ph->first_ok_ms, now);
        __atomic_store_n(&ph->last_ok_ms, now, __ATOMIC_RELEASE);
    } else {
        __atomic_add_fetch(&ph->calls_err, 1, __ATOMIC_RELAXED);
        kvf_drill_first(&ph->first_err_ms, now);
        if (st < 0 && -st < KVF_DRILL_CODES) {
            __atomic_add_fetch(&sh->errs[-st], 1, __ATOMIC_RELAXED);
        }
    }
    __atomic_add_fetch(&ph->hist[kvf_drill_bucket(us)], 1, __ATOMIC_RELAXED);
    cur = __atomic_load_n(&sh->max_wait_us, __ATOMIC_RELAXED);
    while (us > cur && !__atomic_compare_exchange_n(&sh->max_wait_us, &cur,
                                                    us, 0, __ATOMIC_RELAXED,
                                                    __ATOMIC_RELAXED)) {
    }
}

void kvf_drill_wrong(kvf_drill_shared_t *sh, uint64_t bytes)
{
    __atomic_add_fetch(&sh->wrong_bytes, bytes, __ATOMIC_RELAXED);
    __atomic_add_fetch(&sh->wrong_calls, 1, __ATOMIC_RELAXED);
}

int kvf_drill_worker_poll(kvf_drill_shared_t *sh)
{
    long blocks, bytes;

    if (__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE)) {
        return 1;
    }
    if (!__atomic_load_n(&sh->pause, __ATOMIC_ACQUIRE)) {
        return 0;
    }
    kvf_drill_proc_res(getpid(), &sh->res);
    kvf_alloc_stats(&blocks, &bytes);
    sh->res.alloc_bytes = (double)bytes;
    __atomic_store_n(&sh->paused, 1, __ATOMIC_RELEASE);
    while (__atomic_load_n(&sh->pause, __ATOMIC_ACQUIRE) &&
           !__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE)) {
        usleep(2000);
    }
    __atomic_store_n(&sh->paused, 0, __ATOMIC_RELEASE);
    return __atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE);
}

/* --- report -------------------------------------------------------------- */

static const char *const kvf_phase_names[KVF_DRILL_PHASES] = {
    "baseline", "fault", "recovery"};

static double kvf_drill_quantile(const uint64_t *hist, double q)
{
    uint64_t total = 0, acc = 0;
    unsigned i;

    for (i = 0; i < KVF_DRILL_HIST; i++) {
        total += hist[i];
    }
    if (total == 0) {
        return NAN;
    }
    for (i = 0; i < KVF_DRILL_HIST; i++) {
        acc += hist[i];
        if ((double)acc >= q * (double)total) {
            return kvf_drill_bucket_us(i) / 1000.0;
        }
    }
    return kvf_drill_bucket_us(KVF_DRILL_HIST - 1) / 1000.0;
}

void kvf_drill_traffic_report(kvf_drill_t *d, uint64_t wait_bound_ms)
{
    kvf_drill_phase_t sum[KVF_DRILL_PHASES];
    uint64_t wrong = 0, wrong_calls = 0, checked = 0, max_us = 0;
    uint64_t errs[KVF_DRILL_CODES] = {0};
    char name[96];
    unsigned i, p, k;
    double secs;

    memset(sum, 0, sizeof(sum));
    for (i = 0; i < d->nworkers; i++) {
        const kvf_drill_shared_t *sh = d->sh[i];

        wrong += sh->wrong_bytes;
        wrong_calls += sh->wrong_calls;
        checked += sh->checked_bytes;
        max_us = sh->max_wait_us > max_us ? sh->max_wait_us : max_us;
        for (k = 0; k < KVF_DRILL_CODES; k++) {
            errs[k] += sh->errs[k];
        }
        for (p = 0; p < KVF_DRILL_PHASES; p++) {
            sum[p].calls_ok += sh->ph[p].calls_ok;
            sum[p].calls_err += sh->ph[p].calls_err;
            sum[p].misses += sh->ph[p].misses;
            sum[p].bytes_ok += sh->ph[p].bytes_ok;
            for (k = 0; k < KVF_DRILL_HIST; k++) {
                sum[p].hist[k] += sh->ph[p].hist[k];
            }
        }
    }
    kvf_record_drill_num(d->rec, "wrong_bytes", (double)wrong);
    kvf_record_drill_num(d->rec, "wrong_calls", (double)wrong_calls);
    kvf_record_drill_num(d->rec, "verified_bytes", (double)checked);
    kvf_record_drill_num(d->rec, "max_wait_ms", (double)max_us / 1000.0);
    kvf_record_drill_num(d->rec, "timeout_ms", (double)wait_bound_ms);
    kvf_record_drill_num(d->rec, "time_to_recover_ms", d->time_to_recover_ms);
    kvf_record_estimate(d->rec, (double)wait_bound_ms, "ms",
                        "the bound every call must end within: its own wait "
                        "plus one engine timeout for the cancel");
    kvf_record_gap(d->rec, ((double)max_us / 1000.0) / (double)wait_bound_ms,
                   "longest call of any client / that bound (at most 1)");
    for (k = 1; k < KVF_DRILL_CODES; k++) {
        if (errs[k] > 0) {
            kvf_record_drill_error(d->rec, kvf_status_name(-(int)k),
                                   (long)errs[k]);
        }
    }
    for (p = 0; p < KVF_DRILL_PHASES; p++) {
        secs = d->phase_secs[p] > 0 ? d->phase_secs[p] : NAN;
        snprintf(name, sizeof(name), "%s: calls ok", kvf_phase_names[p]);
        kvf_record_figure(d->rec, name, (double)sum[p].calls_ok, "calls", NAN,
                          NAN);
        snprintf(name, sizeof(name), "%s: calls failed", kvf_phase_names[p]);
        kvf_record_figure(d->rec, name, (double)sum[p].calls_err, "calls",
                          NAN, NAN);
        if (sum[p].misses > 0) {
            snprintf(name, sizeof(name), "%s: clean misses",
                     kvf_phase_names[p]);
            kvf_record_figure(d->rec, name, (double)sum[p].misses, "calls",
                              NAN, NAN);
        }
        snprintf(name, sizeof(name), "%s: throughput", kvf_phase_names[p]);
        kvf_record_figure(d->rec, name,
                          (double)sum[p].bytes_ok / 1e6 / secs, "MB/s", NAN,
                          NAN);
        snprintf(name, sizeof(name), "%s: call latency", kvf_phase_names[p]);
        kvf_record_figure(d->rec, name,
                          kvf_drill_quantile(sum[p].hist, 0.5), "ms",
                          kvf_drill_quantile(sum[p].hist, 0.5),
                          kvf_drill_quantile(sum[p].hist, 0.99));
        d->ok_calls[p] = sum[p].calls_ok;
        d->err_calls[p] = sum[p].calls_err;
        d->tput[p] = (double)sum[p].bytes_ok / 1e6 / secs;
    }
    d->wrong_bytes = wrong;
    d->max_wait_ms = (double)max_us / 1000.0;
    d->wait_bound_ms = (double)wait_bound_ms;
    kvf_drill_check(d, wrong == 0,
                    "%lu wrong bytes handed back in %lu calls",
                    (unsigned long)wrong, (unsigned long)wrong_calls);
    kvf_drill_check(d, checked > 0, "no bytes were verified");
    kvf_drill_check(d, (double)max_us / 1000.0 <=
                           (double)wait_bound_ms + KVF_DRILL_SLACK_MS,
                    "a call waited %.0f ms, bound %lu ms (+%d ms slack)",
                    (double)max_us / 1000.0, (unsigned long)wait_bound_ms,
                    KVF_DRILL_SLACK_MS);
    kvf_drill_check(d, sum[KVF_DRILL_BASE].calls_ok > 0,
                    "no successful call in the baseline");
    kvf_drill_check(d, sum[KVF_DRILL_RECOVER].calls_ok > 0,
                    "no successful call after recovery");
}

void kvf_drill_resources(kvf_drill_t *d, const char *who,
                         const kvf_drill_res_t *b, const kvf_drill_res_t *a)
{
    char name[96];

#define KVF_RES(_field, _label)                                                \
    do {                                                                       \
        snprintf(name, sizeof(name), "%s %s", who, _label);                    \
        kvf_record_drill_resource(d->rec, name, b->_field, a->_field);         \
    } while (0)
    if (!isnan(b->objects) || !isnan(a->objects)) {
        KVF_RES(objects, "objects");
    }
    if (!isnan(b->alloc_bytes)) {
        KVF_RES(alloc_bytes, "allocated bytes");
        kvf_drill_check(d, a->alloc_bytes <= b->alloc_bytes * 1.10 + 65536,
                        "%s allocated bytes %.0f -> %.0f", who,
                        b->alloc_bytes, a->alloc_bytes);
    }
    KVF_RES(conns, "sockets");
    KVF_RES(fds, "fds");
    KVF_RES(rss_kb, "RSS KiB");
#undef KVF_RES
    kvf_drill_check(d, a->fds <= b->fds + 2, "%s fds %.0f -> %.0f", who,
                    b->fds, a->fds);
    kvf_drill_check(d, a->conns <= b->conns + 2, "%s sockets %.0f -> %.0f",
                    who, b->conns, a->conns);
    kvf_drill_check(d, a->rss_kb <= b->rss_kb * 1.25 + 16384,
                    "%s RSS %.0f KiB -> %.0f KiB", who, b->rss_kb, a->rss_kb);
}

/* --- the command --------------------------------------------------------- */

static void kvf_drill_usage(void)
{
    size_t i;

    fprintf(stderr,
            "usage: kvferry drill NAME|all|list [options]\n"
            "  --record DIR    write records there (default: a new temp dir)\n"
            "  --phase MS      length of the baseline and recovery phases\n"
            "                  (default 1500)\n"
            "  --timeout MS    engine / store timeout of the clients "
            "(default 1000)\n"
            "  --seed N        seed of pools, keys and injected faults "
            "(default 1)\n"
            "  --hypothesis T  replaces the drill's stated expectation\n"
            "drills:\n");
    for (i = 0; kvf_drills[i].name != NULL; i++) {
        fprintf(stderr, "  %-18s %s%s\n", kvf_drills[i].name,
                kvf_drills[i].needs_root ? "[root] " : "",
                kvf_drills[i].help);
    }
    fprintf(stderr, "exit: 0 held, 1 an expectation failed, 77 skipped\n");
}

typedef struct kvf_drill_opts {
    const char *record;
    unsigned phase_ms, timeout_ms;
    uint64_t seed;
    const char *hypothesis;
} kvf_drill_opts_t;

/* Runs one drill; returns 0 held, 1 failed, 77 skipped. */
static int kvf_drill_run_one(const kvf_drill_def_t *def,
                             const kvf_drill_opts_t *o, const char *dir)
{
    kvf_drill_t d;
    const char *verdict;
    int rc;

    memset(&d, 0, sizeof(d));
    d.name = def->name;
    d.timeout_ms = o->timeout_ms;
    d.call_ms = o->timeout_ms * 2;
    d.phase_ms = o->phase_ms;
    d.seed = o->seed;
    d.hypothesis = o->hypothesis;
    d.t_start_ms = kvf_time_ms();
    d.time_to_recover_ms = NAN;
    snprintf(d.logdir, sizeof(d.logdir), "%s/logs", dir);
    mkdir(d.logdir, 0755);
    if (def->needs_root && geteuid() != 0) {
        printf("%-16s SKIP  needs root (network namespaces, nft, tc)\n",
               def->name);
        return KVF_CLI_SKIP;
    }
    snprintf(d.title, sizeof(d.title), "drill %s", def->name);
    d.rec = kvf_record_new("drill", d.title, def->help);
    if (d.rec == NULL) {
        return KVF_CLI_FAIL;
    }
    kvf_record_hypothesis(d.rec, o->hypothesis);
    kvf_drill_log(&d, "start");
    rc = def->run(&d);
    kvf_drill_workers_stop(&d);
    kvf_drill_reap_all();
    if (d.skipped) {
        printf("%-16s SKIP  %s\n", def->name, d.why);
        kvf_record_free(d.rec);
        return KVF_CLI_SKIP;
    }
    if (rc != 0 && !d.failed) {
        kvf_drill_fail(&d, "the drill could not run to its end");
    }
    if (d.rec != NULL) {
        verdict = d.failed ? "does not hold" : "holds";
        kvf_record_conclude(d.rec, verdict,
                            d.failed ? d.why
                                     : "every expectation held: no wrong "
                                       "bytes, bounded waits, service back, "
                                       "resources back to the baseline");
        kvf_record_config_num(d.rec, "client timeout_ms", d.timeout_ms);
        kvf_record_config_num(d.rec, "call bound_ms", d.call_ms);
        kvf_record_config_num(d.rec, "phase_ms", d.phase_ms);
        kvf_record_config_num(d.rec, "seed", (double)d.seed);
        kvf_record_config(d.rec, "logs", d.logdir);
        if (kvf_record_write(d.rec, dir) != 0) {
            kvf_drill_fail(&d, "cannot write the record in %s", dir);
        }
        kvf_record_free(d.rec);
    }
    printf("%-16s %-5s wrong_bytes=%lu max_wait=%.0fms bound=%.0fms "
           "recover=%.0fms calls ok/err base %lu/%lu fault %lu/%lu "
           "recovery %lu/%lu%s%s\n",
           def->name, d.failed ? "FAIL" : "PASS", (unsigned long)d.wrong_bytes,
           d.max_wait_ms, d.wait_bound_ms, d.time_to_recover_ms,
           (unsigned long)d.ok_calls[0], (unsigned long)d.err_calls[0],
           (unsigned long)d.ok_calls[1], (unsigned long)d.err_calls[1],
           (unsigned long)d.ok_calls[2], (unsigned long)d.err_calls[2],
           d.failed ? "\n    " : "", d.failed ? d.why : "");
    fflush(stdout);
    return d.failed ? KVF_CLI_FAIL : KVF_CLI_OK;
}

int kvf_cmd_drill(int argc, char **argv)
{
    static const struct option opts[] = {
        {"record", required_argument, NULL, 'r'},
        {"phase", required_argument, NULL, 'p'},
        {"timeout", required_argument, NULL, 't'},
        {"seed", required_argument, NULL, 's'},
        {"hypothesis", required_argument, NULL, 'H'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    kvf_drill_opts_t o = {NULL, 1500, 1000, 1, NULL};
    char tmp[] = "/tmp/kvferry-drill-XXXXXX";
    const char *what, *dir;
    int c, rc, worst = KVF_CLI_OK, ran = 0, skipped = 0;
    size_t i;

    while ((c = getopt_long(argc, argv, "r:p:t:s:H:h", opts, NULL)) != -1) {
        switch (c) {
        case 'r':
            o.record = optarg;
            break;
        case 'p':
            o.phase_ms = (unsigned)kvf_cli_ms("--phase", optarg);
            break;
        case 't':
            o.timeout_ms = (unsigned)kvf_cli_ms("--timeout", optarg);
            break;
        case 's':
            o.seed = (uint64_t)kvf_cli_long("--seed", optarg, 0, 1L << 62);
            break;
        case 'H':
            o.hypothesis = optarg;
            break;
        case 'h':
            kvf_drill_usage();
            return KVF_CLI_OK;
        default:
            kvf_drill_usage();
            return KVF_CLI_USAGE;
        }
    }
    if (optind != argc - 1 || o.timeout_ms < 100 || o.phase_ms < 200) {
        kvf_drill_usage();
        return KVF_CLI_USAGE;
    }
    what = argv[optind];
    if (strcmp(what, "list") == 0) {
        for (i = 0; kvf_drills[i].name != NULL; i++) {
            printf("%-18s %s%s\n", kvf_drills[i].name,
                   kvf_drills[i].needs_root ? "[root] " : "",
                   kvf_drills[i].help);
        }
        return KVF_CLI_OK;
    }
    for (i = 0; kvf_drills[i].name != NULL; i++) {
        if (strcmp(what, "all") == 0 || strcmp(what, kvf_drills[i].name) == 0) {
            break;
        }
    }
    if (kvf_drills[i].name == NULL) {
        fprintf(stderr, "kvferry drill: unknown drill '%s'\n", what);
        kvf_drill_usage();
        return KVF_CLI_USAGE;
    }
    dir = o.record;
    if (dir == NULL) {
        dir = mkdtemp(tmp);
        if (dir == NULL) {
            fprintf(stderr, "kvferry drill: mkdtemp: %s\n", strerror(errno));
            return KVF_CLI_FAIL;
        }
    } else if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        fprintf(stderr, "kvferry drill: %s: %s\n", dir, strerror(errno));
        return KVF_CLI_FAIL;
    }
    printf("kvferry drill: records in %s\n", dir);
    fflush(stdout);
    for (; kvf_drills[i].name != NULL; i++) {
        if (strcmp(what, "all") != 0 && strcmp(what, kvf_drills[i].name) != 0) {
            continue;
        }
        rc = kvf_drill_run_one(&kvf_drills[i], &o, dir);
        ran++;
        skipped += (rc == KVF_CLI_SKIP);
        if (rc == KVF_CLI_FAIL) {
            worst = KVF_CLI_FAIL;
        }
    }
    if (strcmp(what, "all") != 0 && skipped == ran) {
        return KVF_CLI_SKIP;
    }
    return worst;
}
