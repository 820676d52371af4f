/*
 * Drill traffic workers: the conductor's side (fork into a namespace,
 * wait until ready, move phases, pause for resource snapshots, point at
 * a restarted service, kill on purpose, stop and reap) and the worker's
 * side (count every call by phase and status into shared memory, with a
 * latency histogram of 4 buckets per power of two, and honour pause and
 * stop between calls).
 */
#include "tools/drill/drill.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/time.h"

/* --- workers, conductor side ---------------------------------------------- */

static int kvf_drill_workers_alive(kvf_drill_t *d)
{
    unsigned i;
    int st;

    for (i = 0; i < d->nworkers; i++) {
        if (d->sh[i]->gone) {
            continue;
        }
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
        kvf_drill_hits_tick(d);
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
            if (d->sh[i]->gone) {
                done++;
            } else if (t >= since_ms && t != 0) {
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
        kvf_drill_hits_tick(d);
    }
}

int kvf_drill_worker(kvf_drill_t *d, const char *netns, kvf_drill_worker_fn fn,
                     void *arg, const char *addr)
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
    sh->tcp_only = (netns != NULL);
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
        __atomic_store_n(&d->sh[i]->nworkers, (int)d->nworkers,
                         __ATOMIC_RELEASE);
    }
    do {
        n = 0;
        for (i = 0; i < d->nworkers; i++) {
            n += (__atomic_load_n(&d->sh[i]->ready, __ATOMIC_ACQUIRE) != 0 ||
                  d->sh[i]->gone);
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

int kvf_drill_workers_pause(kvf_drill_t *d, kvf_drill_res_t *res_p, int resume)
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
            n += (__atomic_load_n(&d->sh[i]->paused, __ATOMIC_ACQUIRE) != 0 ||
                  d->sh[i]->gone);
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

            if (d->sh[i]->gone) {
                continue;
            }
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

void kvf_drill_worker_kill(kvf_drill_t *d, unsigned i)
{
    if (i >= d->nworkers || d->wpid[i] <= 0) {
        return;
    }
    __atomic_store_n(&d->sh[i]->gone, 1, __ATOMIC_RELEASE);
    kvf_drill_kill(d->wpid[i], SIGKILL);
    d->wpid[i] = 0;
}

const kvf_drill_res_t *kvf_drill_worker_res(kvf_drill_t *d, unsigned i)
{
    return &d->sh[i]->res;
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
                      gen[i] ||
                  d->sh[i]->gone);
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
        sum += __atomic_load_n(&d->sh[i]->ph[phase].bytes_ok, __ATOMIC_ACQUIRE);
    }
    return sum;
}

/* Latest first error of any worker in phase, in ms after t0 (-1: none). */
double kvf_drill_first_error_after(kvf_drill_t *d, int phase, uint64_t t0)
{
    double worst = -1.0, v;
    unsigned i;
    uint64_t t;

    for (i = 0; i < d->nworkers; i++) {
        if (d->sh[i]->gone) {
            continue;
        }
        t = __atomic_load_n(&d->sh[i]->ph[phase].first_err_ms,
                            __ATOMIC_ACQUIRE);
        if (t == 0) {
            return -1.0;
        }
        v = (t > t0) ? (double)(t - t0) : 0.0;
        worst = v > worst ? v : worst;
    }
    return worst;
}

/* --- worker side ---------------------------------------------------------- */

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

double kvf_drill_bucket_us(unsigned idx)
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

    if (st == KVF_OK) {
        __atomic_add_fetch(&ph->calls_ok, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&ph->bytes_ok, bytes, __ATOMIC_RELAXED);
        kvf_drill_first(&ph->first_ok_ms, now);
        __atomic_store_n(&ph->last_ok_ms, now, __ATOMIC_RELEASE);
    } else if (miss) {
        /* a clean outcome, but not yet a served call */
        __atomic_add_fetch(&ph->misses, 1, __ATOMIC_RELAXED);
        if (st < 0 && -st < KVF_DRILL_CODES) {
            __atomic_add_fetch(&sh->errs[-st], 1, __ATOMIC_RELAXED);
        }
    } else {
        __atomic_add_fetch(&ph->calls_err, 1, __ATOMIC_RELAXED);
        kvf_drill_first(&ph->first_err_ms, now);
        if (st < 0 && -st < KVF_DRILL_CODES) {
            __atomic_add_fetch(&sh->errs[-st], 1, __ATOMIC_RELAXED);
        }
    }
    __atomic_add_fetch(&ph->hist[kvf_drill_bucket(us)], 1, __ATOMIC_RELAXED);
    cur = __atomic_load_n(&sh->max_wait_us, __ATOMIC_RELAXED);
    while (us > cur &&
           !__atomic_compare_exchange_n(&sh->max_wait_us, &cur, us, 0,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
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
