/*
 * A streaming JSON writer for bench output and records: callers open
 * objects and arrays, add members, close them; commas, escaping and
 * indentation are handled here.
 */
#include "tools/record/json.h"

#include <errno.h>
#include <math.h>
#include <string.h>

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

static void kvf_json_sep(kvf_json_t *j, const char *key)
{
    if (j->depth > 0) {
        if (!j->first[j->depth]) {
            fputc(',', j->f);
        }
        j->first[j->depth] = 0;
        fprintf(j->f, "\n%*s", j->depth * 2, "");
    }
    if (key != NULL) {
        fputc('"', j->f);
        fputs(key, j->f);
        fputs("\": ", j->f);
    }
}

static void kvf_json_escape(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s != '\0'; s++) {
        unsigned char ch = (unsigned char)*s;

        if (ch == '"' || ch == '\\') {
            fputc('\\', f);
            fputc(ch, f);
        } else if (ch == '\n') {
            fputs("\\n", f);
        } else if (ch < 0x20) {
            fprintf(f, "\\u%04x", ch);
        } else {
            fputc(ch, f);
        }
    }
    fputc('"', f);
}

void kvf_json_begin(kvf_json_t *j, FILE *f)
{
    j->f = f;
    j->depth = 0;
    j->first[0] = 1;
}

static void kvf_json_open(kvf_json_t *j, const char *key, char ch)
{
    kvf_json_sep(j, key);
    fputc(ch, j->f);
    if (j->depth < 15) {
        j->depth++;
    }
    j->first[j->depth] = 1;
}

static void kvf_json_close(kvf_json_t *j, char ch)
{
    int empty = j->first[j->depth];

    if (j->depth > 0) {
        j->depth--;
    }
    if (!empty) {
        fprintf(j->f, "\n%*s", j->depth * 2, "");
    }
    fputc(ch, j->f);
    if (j->depth == 0) {
        fputc('\n', j->f);
    }
}

void kvf_json_obj(kvf_json_t *j, const char *key)
{
    kvf_json_open(j, key, '{');
}

void kvf_json_arr(kvf_json_t *j, const char *key)
{
    kvf_json_open(j, key, '[');
}

void kvf_json_end_obj(kvf_json_t *j)
{
    kvf_json_close(j, '}');
}

void kvf_json_end_arr(kvf_json_t *j)
{
    kvf_json_close(j, ']');
}

void kvf_json_str(kvf_json_t *j, const char *key, const char *v)
{
    kvf_json_sep(j, key);
    if (v == NULL) {
        fputs("null", j->f);
    } else {
        kvf_json_escape(j->f, v);
    }
}

void kvf_json_num(kvf_json_t *j, const char *key, double v)
{
    kvf_json_sep(j, key);
    if (isfinite(v)) {
        fprintf(j->f, "%.6g", v);
    } else {
        fputs("null", j->f);
    }
}

void kvf_json_int(kvf_json_t *j, const char *key, long long v)
{
    kvf_json_sep(j, key);
    fprintf(j->f, "%lld", v);
}

void kvf_json_bool(kvf_json_t *j, const char *key, int v)
{
    kvf_json_sep(j, key);
    fputs(v ? "true" : "false", j->f);
}

void kvf_json_raw(kvf_json_t *j, const char *key, const char *text)
{
    size_t n = strlen(text);

    while (n > 0 && text[n - 1] == '\n') {
        n--;
    }
    kvf_json_sep(j, key);
    for (; n > 0; text++, n--) {
        fputc(*text, j->f);
        if (*text == '\n') {
            fprintf(j->f, "%*s", j->depth * 2, "");
        }
    }
}
