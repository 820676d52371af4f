/*
 * master-restart: the store master is SIGKILLed under traffic and started
 * again on the same address a second later, with no metadata. Expected:
 * while it is down every client call fails within its bound (the data
 * path cannot be reached without it); the nodes notice the new epoch and
 * register again, their pools counted empty; the clients reconnect by
 * themselves; every key stored before the restart is a clean miss and is
 * put again (read-through), and no get ever returns an object stored
 * before the restart: the store epoch in each object's version says when
 * it was written, so a location served from the old master's metadata
 * would show as wrong bytes.
 */
#include "tools/drill/store.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/time.h"

static void kvf_drill_epoch_bump(kvf_drill_t *d)
{
    unsigned i;

    for (i = 0; i < d->nworkers; i++) {
        __atomic_add_fetch(&d->sh[i]->epoch, 1, __ATOMIC_RELEASE);
    }
}

int kvf_drill_master_restart(kvf_drill_t *d)
{
    kvf_drill_cluster_t c = {.replicas = 1};
    kvf_kv_arg_t a = {
        .keys = 150, .min_kb = 8, .max_kb = 64, .get_pct = 80, .remove_pct = 5};
    kvf_drill_res_t base, after, mbase, mafter;
    kvf_drill_mstatus_t s0, s1;
    uint64_t bound = kvf_drill_store_bound(d, 1), t_kill, t_up, t_end;
    double first_err, reg, rec;
    char text[640], listen[64];

    snprintf(text, sizeof(text),
             "with the master down every call fails within its bound "
             "(%lu ms); restarted empty on the same address, it gets both "
             "nodes back (they register again) and the clients back "
             "(they reconnect) without any restart of theirs; keys stored "
             "before are clean misses, put again; no get returns an "
             "object stored before the restart; client resources back to "
             "the baseline, no pending put left",
             (unsigned long)bound);
    kvf_drill_expect(d, text);
    if (kvf_drill_store_begin(d, &c, 2, &a, 2) != 0) {
        return -1;
    }
    kvf_drill_store_baseline(d, &c, &base, &mbase, &s0, 0);

    kvf_drill_phase(d, KVF_DRILL_FAULT);
    t_kill = kvf_time_ms();
    kvf_drill_kill(c.master, SIGKILL);
    c.master = 0;
    /* anything written from now on belongs to the new master */
    kvf_drill_epoch_bump(d);
    snprintf(text, sizeof(text),
             "SIGKILL to the master (%s, %.0f objects, %.0f bytes in the "
             "pools) under traffic of 2 clients; started again on the same "
             "address 1 s later, empty",
             c.master_addr, s0.objects, s0.used);
    kvf_drill_injected(d, text);
    kvf_drill_sleep(d, 1000);
    first_err = kvf_drill_first_error_after(d, KVF_DRILL_FAULT, t_kill);
    kvf_record_figure(d->rec, "first client error after the kill (slowest)",
                      first_err, "ms", NAN, NAN);
    snprintf(listen, sizeof(listen), "%s", c.master_addr);
    if (kvf_drill_master_start(d, &c, listen) != 0) {
        kvf_drill_cluster_stop(&c);
        return -1;
    }
    t_up = kvf_time_ms();
    d->phase_secs[KVF_DRILL_FAULT] = (double)(t_up - t_kill) / 1000.0;
    kvf_drill_phase(d, KVF_DRILL_RECOVER);
    reg = kvf_drill_wait_nodes(d, &c, 2, 10000);
    kvf_record_figure(d->rec, "nodes registered again after the restart", reg,
                      "ms", NAN, NAN);
    kvf_drill_check(d, reg >= 0, "the nodes did not register again");
    rec = kvf_drill_wait_recovered(d, t_up, 10000);
    d->time_to_recover_ms = rec;
    kvf_drill_check(d, rec >= 0, "the clients did not come back");
    kvf_drill_sleep(d, d->phase_ms);
    kvf_drill_workers_pause(d, &after, 0);
    kvf_drill_master_res(d, &c, &mafter);
    kvf_drill_status(d, &c, &s1);
    t_end = kvf_time_ms();
    d->phase_secs[KVF_DRILL_RECOVER] = (double)(t_end - t_up) / 1000.0;
    kvf_drill_workers_stop(d);
    kvf_drill_store_report(d, &c, &mbase, &mafter);
    kvf_drill_resources(d, "clients", &base, &after);
    kvf_drill_traffic_report(d, bound);
    kvf_drill_check(
        d, first_err >= 0 && first_err <= (double)bound + KVF_DRILL_SLACK_MS,
        "clients noticed the dead master after %.0f ms", first_err);
    kvf_drill_check(d,
                    d->ok_calls[KVF_DRILL_FAULT] == 0 ||
                        d->err_calls[KVF_DRILL_FAULT] > 0,
                    "no call failed with the master down");
    kvf_drill_check(d, s1.pending == 0, "%.0f puts left pending", s1.pending);
    snprintf(text, sizeof(text),
             "calls failed %.0f ms after the kill at the latest; the nodes "
             "registered again %.0f ms after the restart; objects %.0f -> "
             "%.0f (refilled by read-through); %lu wrong bytes, none stale; "
             "longest call %.0f ms (bound %lu)",
             first_err, reg, s0.objects, s1.objects,
             (unsigned long)d->wrong_bytes, d->max_wait_ms,
             (unsigned long)bound);
    kvf_record_drill_text(d->rec, "observed", text);
    snprintf(text, sizeof(text),
             "no action: the nodes registered again, the clients' pooled "
             "connections reopened; first successful call %.0f ms after "
             "the restart",
             rec);
    kvf_record_drill_text(d->rec, "recovery", text);
    kvf_record_not_verified(d->rec, "metadata persistence across restarts "
                                    "(the master keeps none by design)");
    kvf_drill_cluster_stop(&c);
    return 0;
}
