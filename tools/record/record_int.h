/*
 * Private part of records: the in-memory record (struct kvf_record of
 * record.h) that record.c fills and write.c turns into JSON and Markdown
 * files. It needs nothing of record.h, so the two do not include each
 * other.
 */
#ifndef KVF_TOOLS_RECORD_INT_H
#define KVF_TOOLS_RECORD_INT_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/record/record_int.h is private to tools/"
#endif

#include <stddef.h>

#define KVF_REC_SCHEMA "kvferry-record/1"

typedef struct kvf_rec_kv {
    char *key;
    char *text; /* NULL when the value is the number */
    double num;
} kvf_rec_kv_t;

typedef struct kvf_rec_figure {
    char *name;
    char *unit;
    double value, p50, p99;
} kvf_rec_figure_t;

typedef struct kvf_rec_series {
    char *name, *x_label, *y_label;
    double *xy; /* x0 y0 x1 y1 ... */
    size_t npoints, cap;
} kvf_rec_series_t;

typedef struct kvf_rec_resource {
    char *name;
    double baseline, after;
} kvf_rec_resource_t;

/* A growable array of fixed-size items. */
typedef struct kvf_rec_vec {
    void *items;
    size_t n, cap;
} kvf_rec_vec_t;

struct kvf_record {
    char *kind, *name, *hypothesis;
    kvf_rec_vec_t config;       /* kvf_rec_kv_t */
    kvf_rec_vec_t figures;      /* kvf_rec_figure_t */
    kvf_rec_vec_t series;       /* kvf_rec_series_t */
    kvf_rec_vec_t not_verified; /* char * */
    int has_estimate, has_gap;
    double est_value, gap_ratio;
    char *est_unit, *est_source, *gap_text;
    char *conclusion, *conclusion_text;
    char *raw;
    char *env_json, *env_md; /* kvf_record_environment */
    /* drill */
    kvf_rec_vec_t drill_text;   /* kvf_rec_kv_t, text */
    kvf_rec_vec_t drill_num;    /* kvf_rec_kv_t, numbers */
    kvf_rec_vec_t drill_errors; /* kvf_rec_kv_t, numbers */
    kvf_rec_vec_t drill_res;    /* kvf_rec_resource_t */
    int oom; /* an allocation failed: the record is incomplete */
};

#endif
