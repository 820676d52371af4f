/*
 * Records (seed 003 §5): every bench and drill can write one Markdown and
 * one JSON file describing what was measured: name, date, executor,
 * environment (as `bench env` detects it), hypothesis, configuration,
 * results (raw data file and key figures with P50/P99, chart series),
 * the gap to the estimate, the conclusion, and what was not verified.
 * The JSON follows docs/record.schema.json.
 *
 * Use: kvf_record_new(), add configuration / figures / series, set the
 * estimate and conclusion, then kvf_record_write(rec, dir) and
 * kvf_record_free(rec). The environment is data the caller gives
 * (kvf_record_environment); tools/bench/env.h detects it. Drills add their
 * fields with kvf_record_drill_*.
 */
#ifndef KVF_TOOLS_RECORD_H
#define KVF_TOOLS_RECORD_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/record/record.h is private to tools/"
#endif

#include "tools/record/json.h"

typedef struct kvf_record kvf_record_t;

/* kind: "bench" or "drill"; name: e.g. "bench blocks"; hypothesis: the
 * default, replaced by --hypothesis when the command got one. */
kvf_record_t *kvf_record_new(const char *kind, const char *name,
                             const char *hypothesis);
void kvf_record_free(kvf_record_t *rec);

void kvf_record_hypothesis(kvf_record_t *rec, const char *text);
void kvf_record_config(kvf_record_t *rec, const char *key, const char *value);
void kvf_record_config_num(kvf_record_t *rec, const char *key, double value);

/* A key figure; p50/p99 may be NAN when they do not apply. */
void kvf_record_figure(kvf_record_t *rec, const char *name, double value,
                       const char *unit, double p50, double p99);
/* A point of a chart series (x and y labels fixed by the first call). */
void kvf_record_point(kvf_record_t *rec, const char *series,
                      const char *x_label, const char *y_label, double x,
                      double y);

/* The estimate the result is compared with, and where it came from. */
void kvf_record_estimate(kvf_record_t *rec, double value, const char *unit,
                         const char *source);
/* measured / estimate, and why they differ. */
void kvf_record_gap(kvf_record_t *rec, double ratio, const char *explanation);
/* conclusion: "holds", "does not hold" or "holds under conditions". */
void kvf_record_conclude(kvf_record_t *rec, const char *conclusion,
                         const char *text);
void kvf_record_not_verified(kvf_record_t *rec, const char *text);

/* Drill fields (seed 003 §4): expected, injected, observed, recovery as
 * text; counters as numbers. */
void kvf_record_drill_text(kvf_record_t *rec, const char *field,
                           const char *text);
void kvf_record_drill_num(kvf_record_t *rec, const char *field, double v);
/* Errors clients saw, counted by status name. */
void kvf_record_drill_error(kvf_record_t *rec, const char *status_name,
                            long count);
/* Resource figure before (baseline) and after recovery. */
void kvf_record_drill_resource(kvf_record_t *rec, const char *name,
                               double baseline, double after);

/* Raw data: the JSON text the bench produced, written beside the record
 * as <base>.data.json and named in results.raw_data. */
void kvf_record_raw(kvf_record_t *rec, const char *json_text);

/* The environment the record describes, as data: env_json is the JSON
 * object of the record's "environment", env_md its Markdown table rows
 * ("| item | value |" lines). Copied; required before kvf_record_write. */
void kvf_record_environment(kvf_record_t *rec, const char *env_json,
                            const char *env_md);

/* Writes DIR/<date>-<name>.json and .md; prints their paths on stderr.
 * Returns 0 on success. */
int kvf_record_write(kvf_record_t *rec, const char *dir);

#endif
