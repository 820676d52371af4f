/*
 * Records (seed 003 §5), building side: a bench or drill fills a
 * kvf_record_t in memory (configuration, key figures, series, estimate,
 * gap, conclusion, drill fields); write.c writes it out. Setters
 * copy their strings; an allocation failure marks the record incomplete
 * and kvf_record_write() then refuses it.
 */
#include "tools/record/record.h"
#include "tools/record/record_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static char *kvf_rec_dup(kvf_record_t *rec, const char *s)
{
    char *d = strdup(s != NULL ? s : "");

    if (d == NULL) {
        rec->oom = 1;
    }
    return d;
}

/* Returns a new zeroed slot at the end of v, or NULL. */
static void *kvf_rec_push(kvf_record_t *rec, kvf_rec_vec_t *v, size_t size)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        void *p = realloc(v->items, cap * size);

        if (p == NULL) {
            rec->oom = 1;
            return NULL;
        }
        v->items = p;
        v->cap = cap;
    }
    memset((char *)v->items + v->n * size, 0, size);
    return (char *)v->items + (v->n++) * size;
}

kvf_record_t *kvf_record_new(const char *kind, const char *name,
                             const char *hypothesis)
{
    kvf_record_t *rec = calloc(1, sizeof(*rec));

    if (rec == NULL) {
        return NULL;
    }
    rec->kind = kvf_rec_dup(rec, kind);
    rec->name = kvf_rec_dup(rec, name);
    rec->hypothesis = kvf_rec_dup(rec, hypothesis);
    if (rec->oom) {
        kvf_record_free(rec);
        return NULL;
    }
    return rec;
}

static void kvf_rec_kv_free(kvf_rec_vec_t *v)
{
    kvf_rec_kv_t *kv = v->items;
    size_t i;

    for (i = 0; i < v->n; i++) {
        free(kv[i].key);
        free(kv[i].text);
    }
    free(v->items);
}

void kvf_record_free(kvf_record_t *rec)
{
    size_t i;

    if (rec == NULL) {
        return;
    }
    kvf_rec_kv_free(&rec->config);
    kvf_rec_kv_free(&rec->drill_text);
    kvf_rec_kv_free(&rec->drill_num);
    kvf_rec_kv_free(&rec->drill_errors);
    for (i = 0; i < rec->figures.n; i++) {
        kvf_rec_figure_t *f = (kvf_rec_figure_t *)rec->figures.items + i;

        free(f->name);
        free(f->unit);
    }
    free(rec->figures.items);
    for (i = 0; i < rec->series.n; i++) {
        kvf_rec_series_t *s = (kvf_rec_series_t *)rec->series.items + i;

        free(s->name);
        free(s->x_label);
        free(s->y_label);
        free(s->xy);
    }
    free(rec->series.items);
    for (i = 0; i < rec->not_verified.n; i++) {
        free(((char **)rec->not_verified.items)[i]);
    }
    free(rec->not_verified.items);
    for (i = 0; i < rec->drill_res.n; i++) {
        free(((kvf_rec_resource_t *)rec->drill_res.items)[i].name);
    }
    free(rec->drill_res.items);
    free(rec->kind);
    free(rec->name);
    free(rec->hypothesis);
    free(rec->est_unit);
    free(rec->est_source);
    free(rec->gap_text);
    free(rec->conclusion);
    free(rec->conclusion_text);
    free(rec->raw);
    free(rec->env_json);
    free(rec->env_md);
    free(rec);
}

static void kvf_rec_replace(kvf_record_t *rec, char **slot, const char *s)
{
    free(*slot);
    *slot = kvf_rec_dup(rec, s);
}

void kvf_record_hypothesis(kvf_record_t *rec, const char *text)
{
    if (rec != NULL && text != NULL) {
        kvf_rec_replace(rec, &rec->hypothesis, text);
    }
}

/* Sets key in v (replacing an earlier value of the same key). */
static void kvf_rec_kv_set(kvf_record_t *rec, kvf_rec_vec_t *v, const char *key,
                           const char *text, double num)
{
    kvf_rec_kv_t *kv = v->items;
    size_t i;

    for (i = 0; i < v->n; i++) {
        if (strcmp(kv[i].key, key) == 0) {
            break;
        }
    }
    if (i == v->n) {
        kv = kvf_rec_push(rec, v, sizeof(*kv));
        if (kv == NULL) {
            return;
        }
        kv->key = kvf_rec_dup(rec, key);
    } else {
        kv = &kv[i];
        free(kv->text);
        kv->text = NULL;
    }
    if (text != NULL) {
        kv->text = kvf_rec_dup(rec, text);
    }
    kv->num = num;
}

void kvf_record_config(kvf_record_t *rec, const char *key, const char *value)
{
    if (rec != NULL && key != NULL) {
        kvf_rec_kv_set(rec, &rec->config, key, value ? value : "", NAN);
    }
}

void kvf_record_config_num(kvf_record_t *rec, const char *key, double value)
{
    if (rec != NULL && key != NULL) {
        kvf_rec_kv_set(rec, &rec->config, key, NULL, value);
    }
}

void kvf_record_figure(kvf_record_t *rec, const char *name, double value,
                       const char *unit, double p50, double p99)
{
    kvf_rec_figure_t *f;

    if (rec == NULL || name == NULL) {
        return;
    }
    f = kvf_rec_push(rec, &rec->figures, sizeof(*f));
    if (f == NULL) {
        return;
    }
    f->name = kvf_rec_dup(rec, name);
    f->unit = kvf_rec_dup(rec, unit);
    f->value = value;
    f->p50 = p50;
    f->p99 = p99;
}

void kvf_record_point(kvf_record_t *rec, const char *series,
                      const char *x_label, const char *y_label, double x,
                      double y)
{
    kvf_rec_series_t *s = NULL;
    size_t i;

    if (rec == NULL || series == NULL) {
        return;
    }
    for (i = 0; i < rec->series.n; i++) {
        kvf_rec_series_t *c = (kvf_rec_series_t *)rec->series.items + i;

        if (strcmp(c->name, series) == 0) {
            s = c;
            break;
        }
    }
    if (s == NULL) {
        s = kvf_rec_push(rec, &rec->series, sizeof(*s));
        if (s == NULL) {
            return;
        }
        s->name = kvf_rec_dup(rec, series);
        s->x_label = kvf_rec_dup(rec, x_label);
        s->y_label = kvf_rec_dup(rec, y_label);
    }
    if (s->npoints == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        double *p = realloc(s->xy, cap * 2 * sizeof(double));

        if (p == NULL) {
            rec->oom = 1;
            return;
        }
        s->xy = p;
        s->cap = cap;
    }
    s->xy[2 * s->npoints] = x;
    s->xy[2 * s->npoints + 1] = y;
    s->npoints++;
}

void kvf_record_estimate(kvf_record_t *rec, double value, const char *unit,
                         const char *source)
{
    if (rec == NULL) {
        return;
    }
    rec->has_estimate = 1;
    rec->est_value = value;
    kvf_rec_replace(rec, &rec->est_unit, unit);
    kvf_rec_replace(rec, &rec->est_source, source);
}

void kvf_record_gap(kvf_record_t *rec, double ratio, const char *explanation)
{
    if (rec == NULL) {
        return;
    }
    rec->has_gap = 1;
    rec->gap_ratio = ratio;
    kvf_rec_replace(rec, &rec->gap_text, explanation);
}

void kvf_record_conclude(kvf_record_t *rec, const char *conclusion,
                         const char *text)
{
    if (rec == NULL || conclusion == NULL) {
        return;
    }
    if (strcmp(conclusion, "holds") != 0 &&
        strcmp(conclusion, "does not hold") != 0 &&
        strcmp(conclusion, "holds under conditions") != 0) {
        fprintf(stderr, "kvferry: record: '%s' is not a conclusion\n",
                conclusion);
        return;
    }
    kvf_rec_replace(rec, &rec->conclusion, conclusion);
    kvf_rec_replace(rec, &rec->conclusion_text, text);
}

void kvf_record_not_verified(kvf_record_t *rec, const char *text)
{
    char **slot;

    if (rec == NULL || text == NULL) {
        return;
    }
    slot = kvf_rec_push(rec, &rec->not_verified, sizeof(char *));
    if (slot != NULL) {
        *slot = kvf_rec_dup(rec, text);
    }
}

void kvf_record_drill_text(kvf_record_t *rec, const char *field,
                           const char *text)
{
    if (rec != NULL && field != NULL) {
        kvf_rec_kv_set(rec, &rec->drill_text, field, text ? text : "", NAN);
    }
}

void kvf_record_drill_num(kvf_record_t *rec, const char *field, double v)
{
    if (rec != NULL && field != NULL) {
        kvf_rec_kv_set(rec, &rec->drill_num, field, NULL, v);
    }
}

void kvf_record_drill_error(kvf_record_t *rec, const char *status_name,
                            long count)
{
    kvf_rec_kv_t *kv;
    size_t i;

    if (rec == NULL || status_name == NULL) {
        return;
    }
    kv = rec->drill_errors.items;
    for (i = 0; i < rec->drill_errors.n; i++) {
        if (strcmp(kv[i].key, status_name) == 0) {
            kv[i].num += (double)count; /* counts add up */
            return;
        }
    }
    kvf_rec_kv_set(rec, &rec->drill_errors, status_name, NULL, (double)count);
}

void kvf_record_drill_resource(kvf_record_t *rec, const char *name,
                               double baseline, double after)
{
    kvf_rec_resource_t *r;

    if (rec == NULL || name == NULL) {
        return;
    }
    r = kvf_rec_push(rec, &rec->drill_res, sizeof(*r));
    if (r != NULL) {
        r->name = kvf_rec_dup(rec, name);
        r->baseline = baseline;
        r->after = after;
    }
}

void kvf_record_raw(kvf_record_t *rec, const char *json_text)
{
    if (rec != NULL && json_text != NULL) {
        kvf_rec_replace(rec, &rec->raw, json_text);
    }
}

void kvf_record_environment(kvf_record_t *rec, const char *env_json,
                            const char *env_md)
{
    if (rec != NULL && env_json != NULL) {
        kvf_rec_replace(rec, &rec->env_json, env_json);
        kvf_rec_replace(rec, &rec->env_md, env_md != NULL ? env_md : "");
    }
}
