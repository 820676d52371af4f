/*
 * The JSON writer of bench output and records (json.h), on jansson: the
 * calls build a document (objects and arrays opened and closed in
 * order), and closing the outermost container writes it, indented by two
 * spaces, with a newline. Numbers that are not finite are written as
 * null; reals keep six significant digits.
 */
#include "tools/record/json.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#define KVF_JSON_FLAGS (JSON_INDENT(2) | JSON_REAL_PRECISION(6))

FILE *kvf_json_file_open(const char *path)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "w") : stdout;

    if (f == NULL) {
        fprintf(stderr, "kvferry: --json %s: %s\n", path, strerror(errno));
    }
    return f;
}

void kvf_json_file_close(FILE *f)
{
    if (f != NULL && f != stdout) {
        fclose(f);
    }
}

void kvf_json_begin(kvf_json_t *j, FILE *f)
{
    memset(j, 0, sizeof(*j));
    j->f = f;
}

/* Writes a finished top-level value and releases it. */
static void kvf_json_emit(kvf_json_t *j, json_t *v)
{
    if (v != NULL) {
        json_dumpf(v, j->f, KVF_JSON_FLAGS | JSON_ENCODE_ANY);
        fputc('\n', j->f);
        json_decref(v);
    }
}

/* Adds v (a new reference) to the open container under key. */
static void kvf_json_add(kvf_json_t *j, const char *key, json_t *v)
{
    json_t *parent;

    if (v == NULL) {
        v = json_null();
    }
    if (j->depth == 0) {
        kvf_json_emit(j, v);
        return;
    }
    parent = j->stack[j->depth - 1];
    if (json_is_array(parent)) {
        json_array_append_new(parent, v);
    } else {
        json_object_set_new(parent, key != NULL ? key : "", v);
    }
}

static void kvf_json_open(kvf_json_t *j, const char *key, json_t *c)
{
    if (j->depth == KVF_JSON_DEPTH) {
        json_decref(c);
        return;
    }
    if (j->depth > 0) {
        kvf_json_add(j, key, json_incref(c));
        json_decref(c); /* the parent holds it */
    }
    j->stack[j->depth++] = c;
}

static void kvf_json_close(kvf_json_t *j)
{
    if (j->depth == 0) {
        return;
    }
    j->depth--;
    if (j->depth == 0) {
        kvf_json_emit(j, j->stack[0]);
    }
}

void kvf_json_obj(kvf_json_t *j, const char *key)
{
    kvf_json_open(j, key, json_object());
}

void kvf_json_arr(kvf_json_t *j, const char *key)
{
    kvf_json_open(j, key, json_array());
}

void kvf_json_end_obj(kvf_json_t *j)
{
    kvf_json_close(j);
}

void kvf_json_end_arr(kvf_json_t *j)
{
    kvf_json_close(j);
}

void kvf_json_str(kvf_json_t *j, const char *key, const char *v)
{
    kvf_json_add(j, key, v != NULL ? json_string(v) : json_null());
}

void kvf_json_num(kvf_json_t *j, const char *key, double v)
{
    kvf_json_add(j, key, isfinite(v) ? json_real(v) : json_null());
}

void kvf_json_int(kvf_json_t *j, const char *key, long long v)
{
    kvf_json_add(j, key, json_integer((json_int_t)v));
}

void kvf_json_bool(kvf_json_t *j, const char *key, int v)
{
    kvf_json_add(j, key, json_boolean(v));
}

int kvf_json_raw(kvf_json_t *j, const char *key, const char *text)
{
    json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);

    if (v == NULL) {
        return -1;
    }
    kvf_json_add(j, key, v);
    return 0;
}
