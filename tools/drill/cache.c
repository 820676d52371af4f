/*
 * Cache drills: the store as a cache that is emptied, or asked to hold
 * more than it can.
 *
 * cache-clear: with clients reading through the cache (a miss puts the
 * object back), an operator process lists every key and removes them
 * all. Expected: the clients see clean misses (KVF_ERR_NO_KEY), never an
 * error nor wrong bytes, refill the cache by themselves, and once the
 * same keys are back the master holds exactly the same objects and
 * allocated bytes as before the clear.
 *
 * capacity-pressure: two nodes of 8 MiB, high / low watermarks 80 / 60 %;
 * a few pinned objects, then clients that put and get a key space many
 * times the capacity. Expected: eviction keeps puts succeeding (at most a
 * few KVF_ERR_NO_SPACE while it runs), used bytes never pass the high
 * watermark by more than one object per client, evicted keys are clean
 * misses, no
 * wrong bytes, pinned objects survive; with the key space small again
 * the clients are served from the cache again.
 */
#include "tools/drill/store.h"

#include <kvferry/store.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/time.h"

#define KVF_CLEAR_MAX 4096
#define KVF_PINS      4

typedef struct kvf_cache_job {
    char master[64];
    char prefix[64];
    unsigned timeout_ms;
    int mode; /* 0: clear by prefix, 1: put pins, 2: check pins */
    long listed, removed, failed, starved;
    int last_status;
    int status[KVF_PINS];
    uint64_t wrong;
} kvf_cache_job_t;

typedef struct kvf_key_list {
    char (*keys)[KVF_STORE_KEY_MAX + 1];
    size_t n;
} kvf_key_list_t;

static void kvf_cache_collect(const kvf_store_entry_t *e, void *arg)
{
    kvf_key_list_t *l = arg;

    if (l->n < KVF_CLEAR_MAX) {
        snprintf(l->keys[l->n++], KVF_STORE_KEY_MAX + 1, "%s", e->key);
    }
}

static void kvf_cache_pin_key(char *out, size_t len, const char *drill,
                              unsigned i)
{
    snprintf(out, len, "dr/%s/pin/k%u", drill, i);
}

static int kvf_cache_helper(kvf_drill_t *d, void *arg)
{
    kvf_cache_job_t *j = arg;
    kvf_store_params_t sp = {0};
    kvf_store_put_opts_t po = {1, KVF_STORE_PIN};
    kvf_key_list_t l = {0};
    unsigned char *buf, *done;
    size_t left;
    uint64_t end;
    kvf_region_h reg;
    kvf_store_h st;
    kvf_status_t s;
    char key[128];
    size_t i, len;

    sp.field_mask = KVF_STORE_PARAM_MASTER | KVF_STORE_PARAM_TIMEOUT;
    sp.master = j->master;
    sp.timeout_ms = j->timeout_ms;
    if (kvf_store_connect(&sp, &st) != KVF_OK) {
        return 1;
    }
    if (j->mode == 0) {
        l.keys = calloc(KVF_CLEAR_MAX, sizeof(*l.keys));
        if (l.keys == NULL || kvf_store_list(st, j->prefix, KVF_CLEAR_MAX,
                                             kvf_cache_collect, &l) != KVF_OK) {
            return 1;
        }
        j->listed = (long)l.n;
        done = calloc(l.n ? l.n : 1, 1);
        if (done == NULL) {
            return 1;
        }
        /* sweeps over the keys: a leased (or still written) object is
         * tried again in the next sweep; the store promises it is
         * removable within one lease, so two leases bound the clear */
        end = kvf_time_ms() + 2 * KVF_DRILL_LEASE_MS + 500;
        do {
            left = 0;
            for (i = 0; i < l.n; i++) {
                if (done[i]) {
                    continue;
                }
                s = kvf_store_remove(st, l.keys[i]);
                if (s == KVF_OK || s == KVF_ERR_NO_KEY) {
                    done[i] = 1;
                    j->removed += (s == KVF_OK);
                } else if (s == KVF_ERR_LEASED || s == KVF_ERR_BUSY) {
                    left++;
                    j->last_status = s;
                } else {
                    done[i] = 1;
                    j->failed++;
                    j->last_status = s;
                }
            }
            if (left > 0) {
                usleep(20000);
            }
        } while (left > 0 && kvf_time_ms() < end);
        j->starved = (long)left;
        free(done);
        free(l.keys);
        kvf_store_disconnect(st);
        return 0;
    }
    buf = aligned_alloc(4096, 2u << 20);
    if (buf == NULL || kvf_engine_reg(kvf_store_engine(st), buf, 1u << 20,
                                      KVF_MEM_HOST, 0, &reg) != KVF_OK) {
        return 1;
    }
    for (i = 0; i < KVF_PINS; i++) {
        kvf_cache_pin_key(key, sizeof(key), d->name, (unsigned)i);
        if (j->mode == 1) {
            kvf_drill_obj_fill(buf, key, 1, 64u << 10);
            j->status[i] = kvf_store_put(st, key, buf, 64u << 10, &po);
        } else {
            s = kvf_store_get(st, key, buf, 1u << 20, &len, 0);
            j->status[i] = s;
            if (s == KVF_OK) {
                j->wrong +=
                    kvf_drill_obj_check(buf, len, key, 0, buf + (1u << 20));
            }
        }
    }
    kvf_engine_dereg(kvf_store_engine(st), reg);
    kvf_store_disconnect(st);
    free(buf);
    return 0;
}

int kvf_drill_cache_clear(kvf_drill_t *d)
{
    kvf_drill_cluster_t c = {.replicas = 1};
    kvf_kv_arg_t a = {.keys = 120, .min_kb = 8, .max_kb = 64, .get_pct = 100};
    kvf_drill_res_t base, after, mbase, mafter;
    kvf_drill_mstatus_t s0, s;
    kvf_cache_job_t *j;
    uint64_t bound = kvf_drill_store_bound(d, 1), t0, t_clear, t_rec = 0;
    uint64_t end;
    int moved;
    char text[640];

    snprintf(text, sizeof(text),
             "every object removed while clients read through the cache: "
             "they see clean misses (KVF_ERR_NO_KEY) and no error, put the "
             "objects back themselves, and the master ends with exactly "
             "the objects and allocated bytes it had before; no wrong "
             "bytes; client resources back to the baseline");
    kvf_drill_expect(d, text);
    j = kvf_drill_shared_alloc(sizeof(*j));
    if (j == NULL || kvf_drill_store_begin(d, &c, 2, &a, 2) != 0) {
        return -1;
    }
    kvf_drill_store_baseline(d, &c, &base, &mbase, &s0, 0);

    kvf_drill_phase(d, KVF_DRILL_FAULT);
    t0 = kvf_time_ms();
    snprintf(j->master, sizeof(j->master), "%s", c.master_addr);
    snprintf(j->prefix, sizeof(j->prefix), "dr/%s/", d->name);
    j->timeout_ms = d->timeout_ms;
    j->mode = 0;
    kvf_drill_oneshot(d, NULL, kvf_cache_helper, j, 60000);
    t_clear = kvf_time_ms();
    snprintf(text, sizeof(text),
             "an operator process listed the %ld objects under '%s' and "
             "removed them under traffic, retrying leased ones for two "
             "leases (%d ms): %ld removed, %ld still leased, %ld failed, "
             "in %lu ms",
             j->listed, j->prefix, 2 * KVF_DRILL_LEASE_MS, j->removed,
             j->starved, j->failed, (unsigned long)(t_clear - t0));
    kvf_drill_injected(d, text);
    kvf_record_figure(d->rec, "objects the clear could not remove (leased)",
                      (double)j->starved, "objects", NAN, NAN);
    kvf_drill_check(d, j->starved == 0,
                    "%ld of %ld objects could not be removed within two "
                    "leases: every get renews the read lease, so a key "
                    "read continuously stays KVF_ERR_LEASED for good",
                    j->starved, j->listed);
    kvf_drill_check(d, j->removed > 0 && j->failed == 0,
                    "the clear removed %ld of %ld objects, %ld failed (%s)",
                    j->removed, j->listed, j->failed,
                    kvf_status_name((kvf_status_t)j->last_status));
    d->phase_secs[KVF_DRILL_FAULT] = (double)(t_clear - t0) / 1000.0;
    kvf_drill_phase(d, KVF_DRILL_RECOVER);
    /* refilled: the same keys, so the same objects and bytes. A removed
     * object still read under a lease keeps counting until its lease
     * ends, so right after the clear the figures may not have moved
     * yet: only a return to the baseline after they moved counts. */
    end = t_clear + 20000;
    moved = 0;
    while (kvf_time_ms() < end) {
        if (kvf_drill_status(d, &c, &s) == 0) {
            if (s.objects != s0.objects || s.used != s0.used) {
                moved = 1;
            } else if (moved) {
                t_rec = kvf_time_ms();
                break;
            }
        }
        usleep(20000);
    }
    d->time_to_recover_ms = t_rec ? (double)(t_rec - t_clear) : -1.0;
    kvf_drill_check(d, t_rec != 0,
                    "the cache did not refill to %.0f objects / %.0f bytes",
                    s0.objects, s0.used);
    kvf_drill_sleep(d, d->phase_ms / 2);
    kvf_drill_workers_pause(d, &after, 0);
    kvf_drill_master_res(d, &c, &mafter);
    d->phase_secs[KVF_DRILL_RECOVER] =
        (double)(kvf_time_ms() - t_clear) / 1000.0;
    kvf_drill_workers_stop(d);
    kvf_drill_store_report(d, &c, &mbase, &mafter);
    kvf_drill_resources(d, "clients", &base, &after);
    kvf_drill_traffic_report(d, bound);
    kvf_drill_check(d,
                    mafter.objects == mbase.objects &&
                        mafter.alloc_bytes == mbase.alloc_bytes,
                    "master objects %.0f -> %.0f, used %.0f -> %.0f",
                    mbase.objects, mafter.objects, mbase.alloc_bytes,
                    mafter.alloc_bytes);
    kvf_drill_check(
        d, d->err_calls[KVF_DRILL_FAULT] + d->err_calls[KVF_DRILL_RECOVER] == 0,
        "clients saw %lu errors (misses excluded)",
        (unsigned long)(d->err_calls[KVF_DRILL_FAULT] +
                        d->err_calls[KVF_DRILL_RECOVER]));
    snprintf(text, sizeof(text),
             "clients saw only clean misses, %lu errors, %lu wrong bytes; "
             "objects %.0f -> %.0f, bytes %.0f -> %.0f",
             (unsigned long)(d->err_calls[KVF_DRILL_FAULT] +
                             d->err_calls[KVF_DRILL_RECOVER]),
             (unsigned long)d->wrong_bytes, mbase.objects, mafter.objects,
             mbase.alloc_bytes, mafter.alloc_bytes);
    kvf_record_drill_text(d->rec, "observed", text);
    snprintf(text, sizeof(text),
             "read-through refilled the cache %.0f ms after the clear ended",
             d->time_to_recover_ms);
    kvf_record_drill_text(d->rec, "recovery", text);
    kvf_drill_cluster_stop(&c);
    return 0;
}

static void kvf_drill_keys_now(kvf_drill_t *d, unsigned keys)
{
    unsigned i;

    for (i = 0; i < d->nworkers; i++) {
        __atomic_store_n(&d->sh[i]->keys_now, keys, __ATOMIC_RELEASE);
    }
}

int kvf_drill_capacity_pressure(kvf_drill_t *d)
{
    kvf_drill_cluster_t c = {
        .replicas = 1, .node_pool = 8u << 20, .high_pct = 80, .low_pct = 60};
    kvf_kv_arg_t a = {.keys = 4000, .min_kb = 16, .max_kb = 64, .get_pct = 60};
    kvf_drill_res_t base, after, mbase, mafter;
    kvf_drill_mstatus_t s0, s, s1;
    kvf_cache_job_t *j;
    uint64_t bound = kvf_drill_store_bound(d, 1), t0, t_rel, end, nospace;
    double used_max = 0, limit, rec;
    unsigned pins_ok = 0, i;
    char text[640];

    snprintf(
        text, sizeof(text),
        "two 8 MiB nodes, watermarks 80/60 %%, clients putting a key "
        "space about 20 times the capacity: puts keep succeeding "
        "(eviction makes room; KVF_ERR_NO_SPACE on at most 2 %% of "
        "calls), used bytes stay under the high watermark plus one "
        "object per client, evicted keys are clean misses, no wrong bytes, the "
        "%d pinned objects survive; with a small key space again the "
        "clients are served from the cache",
        KVF_PINS);
    kvf_drill_expect(d, text);
    j = kvf_drill_shared_alloc(sizeof(*j));
    if (j == NULL || kvf_drill_cluster_start(d, &c, 2) != 0) {
        kvf_drill_cluster_stop(&c);
        return -1;
    }
    snprintf(j->master, sizeof(j->master), "%s", c.master_addr);
    j->timeout_ms = d->timeout_ms;
    j->mode = 1;
    kvf_drill_oneshot(d, NULL, kvf_cache_helper, j, 20000);
    for (i = 0; i < KVF_PINS; i++) {
        kvf_drill_check(d, j->status[i] == KVF_OK, "pinned put %u: %s", i,
                        kvf_status_name((kvf_status_t)j->status[i]));
    }
    if (kvf_drill_kv_workers(d, &c, NULL, &a, 2) != 0) {
        kvf_drill_cluster_stop(&c);
        return -1;
    }
    /* baseline: a key space that fits (2 x 40 keys of at most 64 KiB) */
    kvf_drill_keys_now(d, 40);
    kvf_drill_store_baseline(d, &c, &base, &mbase, &s0, 0);

    kvf_drill_phase(d, KVF_DRILL_FAULT);
    t0 = kvf_time_ms();
    kvf_drill_keys_now(d, a.keys);
    snprintf(text, sizeof(text),
             "key space raised to 2 x %u keys of 16-64 KiB (about %.0f "
             "MiB) against %.0f MiB of pools for %u ms",
             a.keys, 2.0 * a.keys * 40 / 1024, s0.capacity / 1048576.0,
             3 * d->phase_ms);
    kvf_drill_injected(d, text);
    end = t0 + 3 * d->phase_ms;
    while (kvf_time_ms() < end && kvf_drill_status(d, &c, &s) == 0) {
        used_max = s.used > used_max ? s.used : used_max;
        usleep(20000);
    }
    t_rel = kvf_time_ms();
    d->phase_secs[KVF_DRILL_FAULT] = (double)(t_rel - t0) / 1000.0;
    kvf_drill_keys_now(d, 40);
    kvf_drill_phase(d, KVF_DRILL_RECOVER);
    rec = kvf_drill_wait_recovered(d, t_rel, 10000);
    d->time_to_recover_ms = rec;
    kvf_drill_sleep(d, d->phase_ms);
    kvf_drill_workers_pause(d, &after, 0);
    kvf_drill_master_res(d, &c, &mafter);
    kvf_drill_status(d, &c, &s1);
    d->phase_secs[KVF_DRILL_RECOVER] = (double)(kvf_time_ms() - t_rel) / 1e3;
    kvf_drill_workers_stop(d);
    j->mode = 2;
    j->wrong = 0;
    kvf_drill_oneshot(d, NULL, kvf_cache_helper, j, 20000);
    for (i = 0; i < KVF_PINS; i++) {
        pins_ok += (j->status[i] == KVF_OK);
    }
    kvf_drill_store_report(d, &c, &mbase, &mafter);
    kvf_drill_resources(d, "clients", &base, &after);
    kvf_drill_traffic_report(d, bound);
    nospace = 0;
    for (i = 0; i < d->nworkers; i++) {
        nospace += d->sh[i]->errs[-KVF_ERR_NO_SPACE];
    }
    /* each client's put in flight may pass the mark by one object
     * before its commit evicts */
    limit = 0.80 * s0.capacity + d->nworkers * 64.0 * 1024;
    kvf_record_figure(d->rec, "used bytes, highest sample under pressure",
                      used_max, "bytes", NAN, NAN);
    kvf_record_figure(d->rec, "high watermark + one object per client", limit,
                      "bytes", NAN, NAN);
    kvf_record_figure(d->rec, "evictions", s1.evictions - s0.evictions,
                      "objects", NAN, NAN);
    kvf_drill_check(d, used_max <= limit,
                    "used %.0f bytes passed the high watermark + one object "
                    "per client "
                    "(%.0f)",
                    used_max, limit);
    kvf_drill_check(d, s1.evictions > s0.evictions, "nothing was evicted");
    kvf_drill_check(
        d,
        (double)nospace <= 0.02 * (double)(d->ok_calls[KVF_DRILL_FAULT] +
                                           d->err_calls[KVF_DRILL_FAULT]),
        "%lu puts failed with KVF_ERR_NO_SPACE", (unsigned long)nospace);
    kvf_drill_check(d,
                    d->err_calls[KVF_DRILL_FAULT] +
                            d->err_calls[KVF_DRILL_RECOVER] ==
                        nospace,
                    "clients saw errors other than KVF_ERR_NO_SPACE");
    kvf_drill_check(d, pins_ok == KVF_PINS && j->wrong == 0,
                    "%u of %d pinned objects survived (wrong bytes %lu)",
                    pins_ok, KVF_PINS, (unsigned long)j->wrong);
    snprintf(text, sizeof(text),
             "used at most %.1f MiB of %.1f MiB (limit %.1f); %.0f "
             "evictions; %lu KVF_ERR_NO_SPACE; %u/%d pinned objects "
             "intact; %lu wrong bytes; longest call %.0f ms (bound %lu)",
             used_max / 1048576.0, s0.capacity / 1048576.0, limit / 1048576.0,
             s1.evictions - s0.evictions, (unsigned long)nospace, pins_ok,
             KVF_PINS, (unsigned long)d->wrong_bytes, d->max_wait_ms,
             (unsigned long)bound);
    kvf_record_drill_text(d->rec, "observed", text);
    snprintf(text, sizeof(text),
             "key space back to 2 x 40: the next calls succeeded %.0f ms "
             "later, read-through refilled the small key space",
             rec);
    kvf_record_drill_text(d->rec, "recovery", text);
    kvf_drill_cluster_stop(&c);
    return 0;
}
