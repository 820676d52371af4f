/*
 * The table model of bench output (out.h): rows of cells under columns
 * declared once, rendered as text lines, a JSON document and a record's
 * key figures and series.
 */
#include "tools/bench/out.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void kvf_out_init(kvf_out_table_t *t, const kvf_out_col_t *cols, unsigned ncols)
{
    memset(t, 0, sizeof(*t));
    t->cols = cols;
    t->ncols = ncols < KVF_OUT_COLS_MAX ? ncols : KVF_OUT_COLS_MAX;
}

void kvf_out_free(kvf_out_table_t *t)
{
    unsigned i;

    for (i = 0; i < t->nrows * t->ncols; i++) {
        free(t->cells[i].str);
    }
    for (i = 0; i < t->nrows; i++) {
        free(t->labels[i]);
        free(t->groups[i]);
    }
    free(t->cells);
    free(t->labels);
    free(t->groups);
    t->cells = NULL;
    t->labels = t->groups = NULL;
    t->nrows = t->cap = 0;
}

static char *kvf_out_dup(const char *s)
{
    return s != NULL ? strdup(s) : NULL;
}

int kvf_out_row(kvf_out_table_t *t, const char *label, const char *group)
{
    if (t->nrows == t->cap) {
        unsigned cap = t->cap ? 2 * t->cap : 16;
        kvf_out_cell_t *c =
            realloc(t->cells, (size_t)cap * t->ncols * sizeof(*c));
        char **l, **g;

        if (c == NULL) {
            return -1;
        }
        t->cells = c;
        l = realloc(t->labels, cap * sizeof(*l));
        if (l == NULL) {
            return -1;
        }
        t->labels = l;
        g = realloc(t->groups, cap * sizeof(*g));
        if (g == NULL) {
            return -1;
        }
        t->groups = g;
        t->cap = cap;
    }
    memset(t->cells + (size_t)t->nrows * t->ncols, 0,
           t->ncols * sizeof(*t->cells));
    t->labels[t->nrows] = kvf_out_dup(label);
    t->groups[t->nrows] = kvf_out_dup(group);
    return (int)t->nrows++;
}

static int kvf_out_col_of(const kvf_out_table_t *t, const char *key)
{
    unsigned c;

    for (c = 0; c < t->ncols; c++) {
        if (strcmp(t->cols[c].key, key) == 0) {
            return (int)c;
        }
    }
    fprintf(stderr, "kvferry: bench output has no column '%s'\n", key);
    abort();
}

static kvf_out_cell_t *kvf_out_last(kvf_out_table_t *t, const char *key)
{
    if (t->nrows == 0) {
        fprintf(stderr, "kvferry: bench output cell before any row\n");
        abort();
    }
    return &t->cells[(size_t)(t->nrows - 1) * t->ncols +
                     (unsigned)kvf_out_col_of(t, key)];
}

void kvf_out_num(kvf_out_table_t *t, const char *key, double v)
{
    kvf_out_cell_t *c = kvf_out_last(t, key);

    c->num = v;
    c->set = 1;
}

void kvf_out_str(kvf_out_table_t *t, const char *key, const char *v)
{
    kvf_out_cell_t *c = kvf_out_last(t, key);

    free(c->str);
    c->str = kvf_out_dup(v != NULL ? v : "");
    c->set = 1;
}

void kvf_out_set(kvf_out_table_t *t, unsigned i, const char *key, double v)
{
    kvf_out_cell_t *c =
        &t->cells[(size_t)i * t->ncols + (unsigned)kvf_out_col_of(t, key)];

    c->num = v;
    c->set = 1;
}

const kvf_out_cell_t *kvf_out_cell(const kvf_out_table_t *t, unsigned i,
                                   const char *key)
{
    return &t->cells[(size_t)i * t->ncols + (unsigned)kvf_out_col_of(t, key)];
}

double kvf_out_get(const kvf_out_table_t *t, unsigned i, const char *key)
{
    const kvf_out_cell_t *c = kvf_out_cell(t, i, key);

    return c->set ? c->num : NAN;
}

/* One cell's text by the column's format and scale. */
static void kvf_out_text_value(const kvf_out_col_t *col,
                               const kvf_out_cell_t *v, FILE *f)
{
    if (col->kind == KVF_OUT_STR) {
        fprintf(f, col->fmt ? col->fmt : "%s", v->str);
    } else if (col->kind == KVF_OUT_INT) {
        fprintf(f, col->fmt ? col->fmt : "%lld",
                (long long)(v->num * (col->scale ? col->scale : 1)));
    } else {
        fprintf(f, col->fmt ? col->fmt : "%g",
                v->num * (col->scale ? col->scale : 1));
    }
}

/* The text columns of an aligned table: by text_keys, else in order. */
static unsigned kvf_out_text_cols(const kvf_out_table_t *t, unsigned *idx)
{
    unsigned c, n = 0;

    if (t->text_keys != NULL) {
        for (c = 0; t->text_keys[c] != NULL && n < t->ncols; c++) {
            idx[n++] = (unsigned)kvf_out_col_of(t, t->text_keys[c]);
        }
        return n;
    }
    for (c = 0; c < t->ncols; c++) {
        if (t->cols[c].header != NULL) {
            idx[n++] = c;
        }
    }
    return n;
}

void kvf_out_text_header(const kvf_out_table_t *t, FILE *f)
{
    unsigned idx[KVF_OUT_COLS_MAX], n = kvf_out_text_cols(t, idx), k;

    for (k = 0; k < n; k++) {
        const kvf_out_col_t *col = &t->cols[idx[k]];

        fprintf(f, "%s%*s", k ? " " : "", col->width,
                col->header ? col->header : col->key);
    }
    fputc('\n', f);
}

/* The aligned text line: every text column's cell, blank when unset. */
static void kvf_out_text_aligned(const kvf_out_table_t *t, unsigned i, FILE *f)
{
    unsigned idx[KVF_OUT_COLS_MAX], n = kvf_out_text_cols(t, idx), k;

    for (k = 0; k < n; k++) {
        const kvf_out_col_t *col = &t->cols[idx[k]];
        const kvf_out_cell_t *v = &t->cells[(size_t)i * t->ncols + idx[k]];

        fputs(k ? " " : "", f);
        if (v->set) {
            kvf_out_text_value(col, v, f);
        } else {
            fprintf(f, "%*s", col->width, "");
        }
    }
}

/* The default text line: "header=value unit" cells joined by " | ". */
static void kvf_out_text_cells(const kvf_out_table_t *t, unsigned i, FILE *f)
{
    const char *sep = "";
    unsigned c;

    for (c = 0; c < t->ncols; c++) {
        const kvf_out_col_t *col = &t->cols[c];
        const kvf_out_cell_t *v = &t->cells[(size_t)i * t->ncols + c];

        if (col->header == NULL || !v->set) {
            continue;
        }
        fprintf(f, "%s%s=", sep, col->header);
        kvf_out_text_value(col, v, f);
        if (col->unit != NULL && col->kind != KVF_OUT_STR) {
            fprintf(f, " %s", col->unit);
        }
        sep = " | ";
    }
}

void kvf_out_text_row(const kvf_out_table_t *t, unsigned i, FILE *f)
{
    if (t->row_fmt != NULL) {
        t->row_fmt(t, i, f, t->row_ctx);
    } else if (t->aligned) {
        kvf_out_text_aligned(t, i, f);
    } else {
        kvf_out_text_cells(t, i, f);
    }
    fputc('\n', f);
    fflush(f);
}

void kvf_out_text(const kvf_out_table_t *t, FILE *f)
{
    unsigned i;

    for (i = 0; i < t->nrows; i++) {
        kvf_out_text_row(t, i, f);
    }
}

void kvf_out_json_rows(const kvf_out_table_t *t, kvf_json_t *j, const char *key)
{
    unsigned i, c;

    kvf_json_arr(j, key);
    for (i = 0; i < t->nrows; i++) {
        kvf_json_obj(j, NULL);
        for (c = 0; c < t->ncols; c++) {
            const kvf_out_col_t *col = &t->cols[c];
            const kvf_out_cell_t *v = &t->cells[(size_t)i * t->ncols + c];

            if (!v->set || col->nojson) {
                continue;
            }
            if (col->kind == KVF_OUT_STR) {
                kvf_json_str(j, col->key, v->str);
            } else if (col->kind == KVF_OUT_INT) {
                kvf_json_int(j, col->key, (long long)v->num);
            } else {
                kvf_json_num(j, col->key, v->num);
            }
        }
        kvf_json_end_obj(j);
    }
    kvf_json_end_arr(j);
}

void kvf_out_json_doc(const kvf_out_table_t *t, FILE *f, kvf_out_head_fn head,
                      void *ctx)
{
    kvf_json_t j;

    kvf_json_begin(&j, f);
    kvf_json_obj(&j, NULL);
    if (head != NULL) {
        head(&j, ctx);
    }
    kvf_out_json_rows(t, &j, "rows");
    if (t->json_tail != NULL) {
        t->json_tail(&j, ctx);
    }
    kvf_json_end_obj(&j);
}

void kvf_out_json_file(const kvf_out_table_t *t, const char *path,
                       kvf_out_head_fn head, void *ctx)
{
    FILE *f;

    if (path == NULL) {
        return;
    }
    f = kvf_json_file_open(path);
    if (f != NULL) {
        kvf_out_json_doc(t, f, head, ctx);
        kvf_json_file_close(f);
    }
}

/* A figure or series name: the row's label or group, then the column's
 * suffix (spaced unless it starts with ':'). */
static void kvf_out_name(char *name, size_t cap, const char *row,
                         const char *suffix)
{
    snprintf(name, cap, "%s%s%s", row ? row : "",
             row && row[0] && suffix[0] && suffix[0] != ':' ? " " : "", suffix);
}

/* One row's key figures and series points. */
static void kvf_out_record_row(const kvf_out_table_t *t, kvf_record_t *rec,
                               unsigned i)
{
    const kvf_out_cell_t *row = &t->cells[(size_t)i * t->ncols];
    const kvf_out_cell_t *x =
        t->x_key != NULL ? kvf_out_cell(t, i, t->x_key) : NULL;
    char name[160];
    unsigned c;

    for (c = 0; c < t->ncols; c++) {
        const kvf_out_col_t *col = &t->cols[c];

        if (!row[c].set || col->kind == KVF_OUT_STR) {
            continue;
        }
        if (col->fig != NULL) {
            double p50 = col->p50 ? kvf_out_get(t, i, col->p50) : NAN;
            double p99 = col->p99 ? kvf_out_get(t, i, col->p99) : NAN;

            kvf_out_name(name, sizeof(name), t->labels[i], col->fig);
            kvf_record_figure(rec, name, row[c].num, col->unit, p50, p99);
        }
        if (col->series != NULL && x != NULL && x->set) {
            kvf_out_name(name, sizeof(name), t->groups[i], col->series);
            kvf_record_point(rec, name, t->x_label, col->unit, x->num,
                             row[c].num);
        }
    }
}

void kvf_out_record_figures(const kvf_out_table_t *t, kvf_record_t *rec)
{
    unsigned i;

    for (i = 0; i < t->nrows; i++) {
        kvf_out_record_row(t, rec, i);
    }
}

void kvf_out_record(const kvf_out_table_t *t, kvf_record_t *rec,
                    kvf_out_head_fn head, void *ctx)
{
    char *raw = NULL;
    size_t rawlen = 0;
    FILE *mf;

    kvf_out_record_figures(t, rec);
    mf = open_memstream(&raw, &rawlen);
    if (mf != NULL) {
        kvf_out_json_doc(t, mf, head, ctx);
        fclose(mf);
        kvf_record_raw(rec, raw);
    }
    free(raw);
}
