/*
 * Reference figures and measured records as calculator inputs (see
 * calc_data.h). data/reference.json is embedded at build time, so a fresh
 * clone's binary finds it without the source tree; --ref-file reads
 * another copy. Records are read with a size bound and their best
 * throughput key figure is converted to GB/s.
 */
#include "tools/calc/calc_data.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

/* Records and reference files larger than this are refused. */
#define KVF_CALC_JSON_MAX (64u << 20)

static void kvf_calc_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void kvf_calc_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || errlen == 0) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Copies a string member (or "" when absent) into buf, truncating. */
static void kvf_calc_copy(char *buf, size_t len, json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));

    snprintf(buf, len, "%s", s != NULL ? s : "");
}

int kvf_calc_ref_kind_valid(const char *kind)
{
    return kind != NULL && (strcmp(kind, KVF_REF_KIND_SPEC) == 0 ||
                            strcmp(kind, KVF_REF_KIND_MEASURED) == 0 ||
                            strcmp(kind, KVF_REF_KIND_PROJECT) == 0);
}

static int kvf_calc_use_valid(const char *use)
{
    return use[0] == '\0' || strcmp(use, "tflops") == 0 ||
           strcmp(use, "link_gbs") == 0 || strcmp(use, "h2d_gbs") == 0;
}

/* Checks one figure and fills r; returns 0 or -1 with err set. */
static int kvf_calc_ref_one(json_t *f, size_t idx, kvf_calc_ref_t *r, char *err,
                            size_t errlen)
{
    json_t *v = json_object_get(f, "value");
    const char *id = json_string_value(json_object_get(f, "id"));

    if (!json_is_object(f) || id == NULL || id[0] == '\0' ||
        strlen(id) >= sizeof(r->id)) {
        kvf_calc_err(err, errlen, "figure %zu: no id (or longer than %zu)", idx,
                     sizeof(r->id) - 1);
        return -1;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v))) {
        kvf_calc_err(err, errlen, "figure '%s': value is not a number", id);
        return -1;
    }
    snprintf(r->id, sizeof(r->id), "%s", id);
    r->value = json_number_value(v);
    kvf_calc_copy(r->what, sizeof(r->what), f, "what");
    kvf_calc_copy(r->unit, sizeof(r->unit), f, "unit");
    kvf_calc_copy(r->kind, sizeof(r->kind), f, "kind");
    kvf_calc_copy(r->use, sizeof(r->use), f, "use");
    kvf_calc_copy(r->source, sizeof(r->source), f, "source");
    if (r->unit[0] == '\0' || r->source[0] == '\0' || r->what[0] == '\0') {
        kvf_calc_err(err, errlen, "figure '%s': needs what, unit and source",
                     id);
        return -1;
    }
    if (!kvf_calc_ref_kind_valid(r->kind)) {
        kvf_calc_err(err, errlen,
                     "figure '%s': kind '%s' is not '%s', '%s' or '%s'", id,
                     r->kind, KVF_REF_KIND_SPEC, KVF_REF_KIND_MEASURED,
                     KVF_REF_KIND_PROJECT);
        return -1;
    }
    if (!kvf_calc_use_valid(r->use)) {
        kvf_calc_err(err, errlen, "figure '%s': unknown use '%s'", id, r->use);
        return -1;
    }
    return 0;
}

kvf_status_t kvf_calc_refs_parse(const char *text, const char *origin,
                                 kvf_calc_refs_t *refs, char *err,
                                 size_t errlen)
{
    kvf_calc_refs_t out;
    json_error_t jerr;
    json_t *root, *figs;
    size_t i, k, n;

    memset(&out, 0, sizeof(out));
    root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        kvf_calc_err(err, errlen, "%s: line %d: %s", origin, jerr.line,
                     jerr.text);
        return KVF_ERR_INVALID_PARAM;
    }
    figs = json_object_get(root, "figures");
    n = json_array_size(figs);
    if (!json_is_array(figs) || n == 0 || n > 100000) {
        kvf_calc_err(err, errlen, "%s: no 'figures' array", origin);
        json_decref(root);
        return KVF_ERR_INVALID_PARAM;
    }
    out.items = calloc(n, sizeof(*out.items));
    if (out.items == NULL) {
        json_decref(root);
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0; i < n; i++) {
        if (kvf_calc_ref_one(json_array_get(figs, i), i, &out.items[i], err,
                             errlen) != 0) {
            goto err_bad;
        }
        for (k = 0; k < i; k++) {
            if (strcmp(out.items[k].id, out.items[i].id) == 0) {
                kvf_calc_err(err, errlen, "figure '%s' appears twice",
                             out.items[i].id);
                goto err_bad;
            }
        }
    }
    out.n = n;
    snprintf(out.origin, sizeof(out.origin), "%s", origin);
    json_decref(root);
    *refs = out;
    return KVF_OK;

err_bad:
    free(out.items);
    json_decref(root);
    return KVF_ERR_INVALID_PARAM;
}

/* Reads a whole file of at most KVF_CALC_JSON_MAX bytes; caller frees. */
static char *kvf_calc_slurp(const char *path, char *err, size_t errlen)
{
    struct stat st;
    size_t got;
    char *buf;
    FILE *f;

    f = fopen(path, "rb");
    if (f == NULL) {
        kvf_calc_err(err, errlen, "%s: %m", path);
        return NULL;
    }
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) ||
        st.st_size > (off_t)KVF_CALC_JSON_MAX) {
        kvf_calc_err(err, errlen, "%s: not a regular file of at most %u MiB",
                     path, KVF_CALC_JSON_MAX >> 20);
        fclose(f);
        return NULL;
    }
    buf = malloc((size_t)st.st_size + 1);
    if (buf == NULL) {
        kvf_calc_err(err, errlen, "%s: out of memory", path);
        fclose(f);
        return NULL;
    }
    got = fread(buf, 1, (size_t)st.st_size, f);
    fclose(f);
    buf[got] = '\0';
    return buf;
}

kvf_status_t kvf_calc_refs_load(const char *path, kvf_calc_refs_t *refs,
                                char *err, size_t errlen)
{
    kvf_status_t status;
    char *text;

    if (path == NULL) {
        return kvf_calc_refs_parse(kvf_asset_reference_json,
                                   "built-in data/reference.json", refs, err,
                                   errlen);
    }
    text = kvf_calc_slurp(path, err, errlen);
    if (text == NULL) {
        return KVF_ERR_IO;
    }
    status = kvf_calc_refs_parse(text, path, refs, err, errlen);
    free(text);
    return status;
}

void kvf_calc_refs_free(kvf_calc_refs_t *refs)
{
    if (refs != NULL) {
        free(refs->items);
        refs->items = NULL;
        refs->n = 0;
    }
}

const kvf_calc_ref_t *kvf_calc_refs_find(const kvf_calc_refs_t *refs,
                                         const char *id)
{
    size_t i;

    for (i = 0; id != NULL && i < refs->n; i++) {
        if (strcasecmp(refs->items[i].id, id) == 0) {
            return &refs->items[i];
        }
    }
    return NULL;
}

int kvf_calc_unit_gbs(const char *unit, double value, double *gbs_p)
{
    static const struct {
        const char *unit;
        double factor;
    } units[] = {
        {"GB/s", 1.0},          {"GiB/s", 1.073741824}, {"MB/s", 1e-3},
        {"MiB/s", 1.048576e-3}, {"TB/s", 1e3},          {"Gb/s", 0.125},
        {"Gbps", 0.125},        {"Gbit/s", 0.125},
    };
    size_t i;

    if (unit == NULL || !isfinite(value)) {
        return 0;
    }
    for (i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(unit, units[i].unit) == 0) {
            *gbs_p = value * units[i].factor;
            return 1;
        }
    }
    return 0;
}

/* Best throughput figure of key_figures; with want_name set, only figures
 * whose name contains it. Returns the index or -1. */
static long kvf_calc_best_figure(json_t *figs, const char *want_name,
                                 double *gbs_p)
{
    long best = -1;
    double best_gbs = 0;
    size_t i;

    for (i = 0; i < json_array_size(figs) && i < 100000; i++) {
        json_t *f = json_array_get(figs, i);
        const char *name = json_string_value(json_object_get(f, "name"));
        const char *unit = json_string_value(json_object_get(f, "unit"));
        json_t *v = json_object_get(f, "value");
        double gbs;

        if (name == NULL || !json_is_number(v)) {
            continue;
        }
        if (want_name != NULL && strcasestr(name, want_name) == NULL) {
            continue;
        }
        if (!kvf_calc_unit_gbs(unit, json_number_value(v), &gbs) ||
            !(gbs > 0)) {
            continue;
        }
        if (best < 0 || gbs > best_gbs) {
            best = (long)i;
            best_gbs = gbs;
        }
    }
    if (best >= 0) {
        *gbs_p = best_gbs;
    }
    return best;
}

json_t *kvf_calc_json_load(const char *path, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *root;
    char *text;

    text = kvf_calc_slurp(path, err, errlen);
    if (text == NULL) {
        return NULL;
    }
    root = json_loads(text, 0, &jerr);
    free(text);
    if (root == NULL) {
        kvf_calc_err(err, errlen, "%s: line %d: %s", path, jerr.line,
                     jerr.text);
    }
    return root;
}

kvf_status_t kvf_calc_record_read(const char *path, const char *role,
                                  kvf_calc_measured_t *out, char *err,
                                  size_t errlen)
{
    kvf_calc_measured_t m;
    const char *schema, *name;
    json_t *root, *figs, *f;
    double gbs = 0;
    long idx = -1;

    root = kvf_calc_json_load(path, err, errlen);
    if (root == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    schema = json_string_value(json_object_get(root, "schema"));
    name = json_string_value(json_object_get(root, "name"));
    figs = json_object_get(json_object_get(root, "results"), "key_figures");
    if (schema == NULL || strncmp(schema, "kvferry-record/", 15) != 0 ||
        name == NULL || !json_is_array(figs)) {
        kvf_calc_err(err, errlen,
                     "%s: not a kvferry record (schema kvferry-record/N, "
                     "name, results.key_figures)",
                     path);
        json_decref(root);
        return KVF_ERR_INVALID_PARAM;
    }
    memset(&m, 0, sizeof(m));
    if (role == NULL) {
        role = strcasestr(name, "h2d") != NULL ? "h2d" : "link";
    }
    snprintf(m.role, sizeof(m.role), "%s", role);
    if (strcmp(role, "h2d") == 0) {
        idx = kvf_calc_best_figure(figs, "h2d", &gbs);
    }
    if (idx < 0) {
        idx = kvf_calc_best_figure(figs, NULL, &gbs);
    }
    if (idx < 0) {
        kvf_calc_err(err, errlen,
                     "%s: no key figure in GB/s, GiB/s, MB/s or Gb/s", path);
        json_decref(root);
        return KVF_ERR_NOT_FOUND;
    }
    f = json_array_get(figs, (size_t)idx);
    m.gbs = gbs;
    kvf_calc_copy(m.figure, sizeof(m.figure), f, "name");
    kvf_calc_copy(m.unit, sizeof(m.unit), f, "unit");
    snprintf(m.record, sizeof(m.record), "%s", name);
    kvf_calc_copy(m.date, sizeof(m.date), root, "date");
    json_decref(root);
    *out = m;
    return KVF_OK;
}

/* Writes s up to the first occurrence of mark; returns what follows the
 * mark, or NULL (all of s written) when it is not there. */
static const char *kvf_calc_upto(FILE *f, const char *s, const char *mark)
{
    const char *at = strstr(s, mark);

    if (at == NULL) {
        fputs(s, f);
        return NULL;
    }
    fwrite(s, 1, (size_t)(at - s), f);
    return at + strlen(mark);
}

int kvf_calc_page_write(const char *path, const char *tmpl, json_t *data)
{
    static const char js_mark[] = "/*@CHART_JS@*/";
    static const char data_mark[] = "/*@DATA@*/null";
    const char *rest;
    char *text;
    FILE *f;
    int rc = 0;

    text = json_dumps(data, JSON_COMPACT | JSON_ESCAPE_SLASH |
                                JSON_REAL_PRECISION(17));
    if (text == NULL) {
        fprintf(stderr, "kvferry: cannot encode the page's data\n");
        return -1;
    }
    f = strcmp(path, "-") == 0 ? stdout : fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "kvferry: %s: %m\n", path);
        free(text);
        return -1;
    }
    rest = kvf_calc_upto(f, tmpl, js_mark);
    if (rest != NULL) {
        fputs(kvf_asset_chart_js, f);
        rest = kvf_calc_upto(f, rest, data_mark);
        if (rest != NULL) {
            fputs(text, f);
            fputs(rest, f);
        }
    }
    if (rest == NULL) {
        fprintf(stderr, "kvferry: page template lacks its markers\n");
        rc = -1;
    }
    if (f == stdout) {
        rc = fflush(f) == 0 ? rc : -1;
    } else if (fclose(f) != 0) {
        fprintf(stderr, "kvferry: %s: %m\n", path);
        rc = -1;
    }
    free(text);
    return rc;
}
