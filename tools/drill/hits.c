/*
 * The hit rate of the store workers over time, for the drills about a
 * cache that comes back warm (master-failover, warm-restart, the disk
 * drills). The workers count each get as a hit, a clean miss or a failed
 * call; the conductor samples the sums every KVF_DRILL_HIT_MS and records
 * each window's share of gets that returned data as a point of the
 * record's "hit rate" series (x: seconds from the fault), the baseline's
 * rate, and how long after the fault the rate of a window first came back
 * to 90 % of the baseline's.
 */
#include "tools/drill/store.h"

#include <math.h>

#include "core/time.h"

#define KVF_DRILL_HIT_MS 500

/* Sums of the workers' get counters. */
static void kvf_drill_hits_sum(kvf_drill_t *d, uint64_t *hits, uint64_t *all)
{
    uint64_t h = 0, a = 0;
    unsigned i;

    for (i = 0; i < d->nworkers; i++) {
        uint64_t x = __atomic_load_n(&d->sh[i]->get_hits, __ATOMIC_RELAXED);

        h += x;
        a += x + __atomic_load_n(&d->sh[i]->get_misses, __ATOMIC_RELAXED) +
             __atomic_load_n(&d->sh[i]->get_errs, __ATOMIC_RELAXED);
    }
    *hits = h;
    *all = a;
}

void kvf_drill_hits_begin(kvf_drill_t *d, kvf_drill_hits_t *h)
{
    h->t0_ms = kvf_time_ms();
    h->fault_ms = 0;
    h->before = NAN;
    h->back_ms = -1;
    h->low = NAN;
    kvf_drill_hits_sum(d, &h->hits, &h->all);
    h->base_hits = h->hits;
    h->base_all = h->all;
    h->next_ms = h->t0_ms + KVF_DRILL_HIT_MS;
    d->hits = h;
}

/* One window ended now: its point, and the comeback once faulted. */
static void kvf_drill_hits_window(kvf_drill_t *d, kvf_drill_hits_t *h)
{
    uint64_t hits, all, now = kvf_time_ms();
    double rate, x;

    kvf_drill_hits_sum(d, &hits, &all);
    if (all == h->all) {
        return; /* no get ended in this window */
    }
    rate = 100.0 * (double)(hits - h->hits) / (double)(all - h->all);
    h->hits = hits;
    h->all = all;
    x = (double)((int64_t)now - (int64_t)(h->fault_ms ? h->fault_ms : now)) /
        1000.0;
    kvf_record_point(d->rec, "hit rate", "seconds from the fault",
                     "% of gets that returned data", x, rate);
    if (h->fault_ms == 0) {
        return;
    }
    if (isnan(h->low) || rate < h->low) {
        h->low = rate;
    }
    if (h->back_ms < 0 && !isnan(h->before) && rate >= 0.9 * h->before &&
        now - h->fault_ms >= KVF_DRILL_HIT_MS) {
        h->back_ms = (double)(now - h->fault_ms);
    }
}

void kvf_drill_hits_tick(kvf_drill_t *d)
{
    kvf_drill_hits_t *h = d->hits;

    if (h != NULL && kvf_time_ms() >= h->next_ms) {
        h->next_ms = kvf_time_ms() + KVF_DRILL_HIT_MS;
        kvf_drill_hits_window(d, h);
    }
}

void kvf_drill_hits_sleep(kvf_drill_t *d, kvf_drill_hits_t *h, unsigned ms)
{
    (void)h;
    kvf_drill_sleep(d, ms);
}

void kvf_drill_hits_fault(kvf_drill_t *d, kvf_drill_hits_t *h)
{
    uint64_t hits, all;

    kvf_drill_hits_window(d, h);
    kvf_drill_hits_sum(d, &hits, &all);
    h->before = all > h->base_all ? 100.0 * (double)(hits - h->base_hits) /
                                        (double)(all - h->base_all)
                                  : NAN;
    h->fault_ms = kvf_time_ms();
    h->next_ms = h->fault_ms + KVF_DRILL_HIT_MS;
    kvf_record_figure(d->rec, "hit rate before the fault", h->before, "%",
                      NAN, NAN);
}

void kvf_drill_hits_report(kvf_drill_t *d, kvf_drill_hits_t *h,
                           double within_ms)
{
    d->hits = NULL;
    kvf_record_figure(d->rec, "lowest hit rate of a window after the fault",
                      h->low, "%", NAN, NAN);
    kvf_record_figure(d->rec,
                      "hit rate back to 90 % of the baseline after", h->back_ms,
                      "ms", NAN, NAN);
    if (within_ms > 0) {
        kvf_drill_check(d, h->back_ms >= 0 && h->back_ms <= within_ms,
                        "the hit rate (%.1f %% before the fault) was not "
                        "back to 90 %% of it within %.0f ms (%.0f ms)",
                        h->before, within_ms, h->back_ms);
    }
}
