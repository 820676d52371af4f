/*
 * Drill report: what every drill's record shows about its traffic (wrong
 * bytes, the longest call against its bound, errors by status, calls,
 * throughput and latency P50/P99 by phase, the raw counters of every
 * worker as the record's raw data) and about resources (baseline against
 * after recovery, with the tolerances the checks allow).
 */
#include "tools/drill/drill.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- report --------------------------------------------------------------- */

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

/* Raw data beside the record: every worker's counters by phase. */
static void kvf_drill_raw(kvf_drill_t *d)
{
    char *text = NULL, name[32];
    size_t len = 0;
    unsigned i, p, k;
    kvf_json_t j;
    FILE *f;

    f = open_memstream(&text, &len);
    if (f == NULL) {
        return;
    }
    kvf_json_begin(&j, f);
    kvf_json_obj(&j, NULL);
    kvf_json_str(&j, "drill", d->name);
    kvf_json_arr(&j, "phase_seconds");
    for (p = 0; p < KVF_DRILL_PHASES; p++) {
        kvf_json_num(&j, NULL, d->phase_secs[p]);
    }
    kvf_json_end_arr(&j);
    kvf_json_arr(&j, "workers");
    for (i = 0; i < d->nworkers; i++) {
        const kvf_drill_shared_t *sh = d->sh[i];

        kvf_json_obj(&j, NULL);
        kvf_json_int(&j, "index", (long long)i);
        kvf_json_bool(&j, "killed_by_drill", sh->gone);
        kvf_json_int(&j, "wrong_bytes", (long long)sh->wrong_bytes);
        kvf_json_int(&j, "verified_bytes", (long long)sh->checked_bytes);
        kvf_json_num(&j, "max_wait_ms", (double)sh->max_wait_us / 1000.0);
        kvf_json_obj(&j, "statuses");
        for (k = 1; k < KVF_DRILL_CODES; k++) {
            if (sh->errs[k] > 0) {
                kvf_json_int(&j, kvf_status_name(-(int)k),
                             (long long)sh->errs[k]);
            }
        }
        kvf_json_end_obj(&j);
        kvf_json_arr(&j, "phases");
        for (p = 0; p < KVF_DRILL_PHASES; p++) {
            const kvf_drill_phase_t *ph = &sh->ph[p];

            kvf_json_obj(&j, NULL);
            kvf_json_str(&j, "phase", kvf_phase_names[p]);
            kvf_json_int(&j, "calls_ok", (long long)ph->calls_ok);
            kvf_json_int(&j, "calls_failed", (long long)ph->calls_err);
            kvf_json_int(&j, "clean_misses", (long long)ph->misses);
            kvf_json_int(&j, "bytes_ok", (long long)ph->bytes_ok);
            kvf_json_obj(&j, "latency_us_histogram");
            for (k = 0; k < KVF_DRILL_HIST; k++) {
                if (ph->hist[k] > 0) {
                    snprintf(name, sizeof(name), "%.0f",
                             kvf_drill_bucket_us(k));
                    kvf_json_int(&j, name, (long long)ph->hist[k]);
                }
            }
            kvf_json_end_obj(&j);
            kvf_json_end_obj(&j);
        }
        kvf_json_end_arr(&j);
        kvf_json_end_obj(&j);
    }
    kvf_json_end_arr(&j);
    kvf_json_end_obj(&j);
    fputc('\n', f);
    fclose(f);
    kvf_record_raw(d->rec, text);
    free(text);
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
        kvf_record_figure(d->rec, name, (double)sum[p].calls_err, "calls", NAN,
                          NAN);
        if (sum[p].misses > 0) {
            snprintf(name, sizeof(name), "%s: clean misses",
                     kvf_phase_names[p]);
            kvf_record_figure(d->rec, name, (double)sum[p].misses, "calls", NAN,
                              NAN);
        }
        snprintf(name, sizeof(name), "%s: throughput", kvf_phase_names[p]);
        kvf_record_figure(d->rec, name, (double)sum[p].bytes_ok / 1e6 / secs,
                          "MB/s", NAN, NAN);
        snprintf(name, sizeof(name), "%s: call latency", kvf_phase_names[p]);
        kvf_record_figure(d->rec, name, kvf_drill_quantile(sum[p].hist, 0.5),
                          "ms", kvf_drill_quantile(sum[p].hist, 0.5),
                          kvf_drill_quantile(sum[p].hist, 0.99));
        d->ok_calls[p] = sum[p].calls_ok;
        d->err_calls[p] = sum[p].calls_err;
        d->tput[p] = (double)sum[p].bytes_ok / 1e6 / secs;
    }
    if (d->nworkers > 0 && d->sh[0]->transport[0] != '\0') {
        kvf_record_config(d->rec, "client transport", d->sh[0]->transport);
    }
    kvf_drill_raw(d);
    d->wrong_bytes = wrong;
    d->max_wait_ms = (double)max_us / 1000.0;
    d->wait_bound_ms = (double)wait_bound_ms;
    kvf_drill_check(d, wrong == 0, "%lu wrong bytes handed back in %lu calls",
                    (unsigned long)wrong, (unsigned long)wrong_calls);
    kvf_drill_check(d, checked > 0, "no bytes were verified");
    kvf_drill_check(d,
                    (double)max_us / 1000.0 <=
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
                        "%s allocated bytes %.0f -> %.0f", who, b->alloc_bytes,
                        a->alloc_bytes);
    }
    KVF_RES(conns, "sockets");
    KVF_RES(fds, "fds");
    KVF_RES(rss_kb, "RSS KiB");
#undef KVF_RES
    kvf_drill_check(d, a->fds <= b->fds + 2, "%s fds %.0f -> %.0f", who, b->fds,
                    a->fds);
    kvf_drill_check(d, a->conns <= b->conns + 2, "%s sockets %.0f -> %.0f", who,
                    b->conns, a->conns);
#if KVF_BUILD_SANITIZE
    /* ASan keeps freed memory in quarantine: RSS only grows */
    kvf_record_not_verified(d->rec, "RSS against the baseline: sanitizer "
                                    "build (freed memory is quarantined)");
#else
    kvf_drill_check(d, a->rss_kb <= b->rss_kb * 1.25 + 16384,
                    "%s RSS %.0f KiB -> %.0f KiB", who, b->rss_kb, a->rss_kb);
#endif
}
