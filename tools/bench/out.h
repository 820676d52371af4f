/*
 * One output path per bench: a small table model. A bench declares its
 * columns once (JSON key, text header, unit, printf format, scale, and
 * whether the record shows the column as a key figure or a series) and
 * fills rows of numbers and strings; the text lines, the --json document
 * and the record's key figures and series are all rendered from the same
 * table, so the three outputs cannot disagree.
 */
#ifndef KVF_TOOLS_BENCH_OUT_H
#define KVF_TOOLS_BENCH_OUT_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/bench/out.h is private to tools/"
#endif

#include "tools/record/json.h"
#include "tools/record/record.h"

#include <stdio.h>

#define KVF_OUT_COLS_MAX 32 /* columns of a table */

typedef enum kvf_out_kind {
    KVF_OUT_NUM, /* a double, written as a JSON number */
    KVF_OUT_INT, /* a whole number, written as a JSON integer */
    KVF_OUT_STR, /* a string, copied into the table */
} kvf_out_kind_t;

typedef struct kvf_out_col {
    const char *key;    /* JSON key of the row member */
    const char *header; /* text header ("BW"); NULL: not in the text */
    const char *unit;   /* unit of the value ("GiB/s", "ms", "ratio") */
    const char *fmt;    /* printf format of the text cell ("%7.2f") */
    double scale;       /* text cell = value * scale (0: 1) */
    kvf_out_kind_t kind;
    /* record: a key figure named "<row label> <fig>" (NULL: none), with
     * its P50 and P99 taken from the columns keyed p50/p99 (NULL: none) */
    const char *fig;
    const char *p50, *p99;
    /* record: a series point of "<row group> <series>" over the table's
     * x column (NULL: none). A fig or series "" names it by the row's
     * label or group alone; one starting with ':' follows it unspaced. */
    const char *series;
    int width;  /* aligned text: the column's width (header and cell),
                 * negative to align left */
    int nojson; /* a text-only column (e.g. a size written "8.0 KB") */
} kvf_out_col_t;

typedef struct kvf_out_cell {
    int set;
    double num;
    char *str;
} kvf_out_cell_t;

typedef struct kvf_out_table kvf_out_table_t;

/* Writes members of the open JSON object (the run's configuration before
 * "rows", a summary after them). */
typedef void (*kvf_out_head_fn)(kvf_json_t *j, void *ctx);

/* Renders row i as one text line (without the newline) on f; a bench
 * whose line format is published keeps it through this callback. */
typedef void (*kvf_out_row_fmt_fn)(const kvf_out_table_t *t, unsigned i,
                                   FILE *f, void *ctx);

struct kvf_out_table {
    const kvf_out_col_t *cols;
    unsigned ncols;
    unsigned nrows, cap;
    kvf_out_cell_t *cells; /* nrows * ncols */
    char **labels;         /* per row: figure name prefix ("write 16 MB") */
    char **groups;         /* per row: series name prefix ("write") */
    const char *x_key;     /* the column of the series' x; NULL: none */
    const char *x_label;
    /* text lines: row_fmt, else aligned columns under a header line
     * (aligned), else "header=value unit | ..." */
    kvf_out_row_fmt_fn row_fmt;
    void *row_ctx;
    int aligned;
    /* aligned text: the columns by key, in the order printed (NULL-ended);
     * NULL: every column with a header, in column order */
    const char *const *text_keys;
    kvf_out_head_fn json_tail; /* members after "rows", or NULL */
};

/* cols: at most KVF_OUT_COLS_MAX, kept by the caller. */
void kvf_out_init(kvf_out_table_t *t, const kvf_out_col_t *cols,
                  unsigned ncols);
void kvf_out_free(kvf_out_table_t *t);

/* Appends a row; label and group may be NULL. Returns its index, or -1
 * when out of memory. */
int kvf_out_row(kvf_out_table_t *t, const char *label, const char *group);
/* Sets a cell of the last row by column key (unknown keys are a bug and
 * abort). An unset cell is left out of every output. */
void kvf_out_num(kvf_out_table_t *t, const char *key, double v);
void kvf_out_str(kvf_out_table_t *t, const char *key, const char *v);
/* Sets a number of row i (a figure known once every row is measured). */
void kvf_out_set(kvf_out_table_t *t, unsigned i, const char *key, double v);

/* Reading cells back (for row-format callbacks): by column key. */
const kvf_out_cell_t *kvf_out_cell(const kvf_out_table_t *t, unsigned i,
                                   const char *key);
double kvf_out_get(const kvf_out_table_t *t, unsigned i, const char *key);

/* Text: the header line of an aligned table, one row's line (with the
 * newline), and every row. */
void kvf_out_text_header(const kvf_out_table_t *t, FILE *f);
void kvf_out_text_row(const kvf_out_table_t *t, unsigned i, FILE *f);
void kvf_out_text(const kvf_out_table_t *t, FILE *f);

/* JSON: the rows as an array member `key` of the open object. */
void kvf_out_json_rows(const kvf_out_table_t *t, kvf_json_t *j,
                       const char *key);
/* JSON: a whole document on f: an object with head's members (the run's
 * configuration), then "rows", then the table's json_tail members. */
void kvf_out_json_doc(const kvf_out_table_t *t, FILE *f, kvf_out_head_fn head,
                      void *ctx);
/* The --json destination (path or "-"); does nothing when path is NULL. */
void kvf_out_json_file(const kvf_out_table_t *t, const char *path,
                       kvf_out_head_fn head, void *ctx);

/* Record: key figures and series points of every row (a column's fig ""
 * names the figure by the row label alone). */
void kvf_out_record_figures(const kvf_out_table_t *t, kvf_record_t *rec);
/* The same, and the JSON document as the record's raw data. */
void kvf_out_record(const kvf_out_table_t *t, kvf_record_t *rec,
                    kvf_out_head_fn head, void *ctx);

#endif
