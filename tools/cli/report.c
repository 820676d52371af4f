/*
 * `kvferry report DIR [-o FILE]`: turns a folder of records (the JSON
 * files `--record DIR` writes, docs/record.schema.json) into one static
 * HTML page for people who would rather look than read: throughput over
 * block size and over transfer size (results.series), latency percentiles
 * (key figures with P50/P99), and drill outcomes (wrong bytes, longest
 * wait against the timeout, recovered or not, resources reclaimed).
 *
 * The records are embedded as JSON in the page (tools/calc/report.html);
 * its inline script draws the SVG charts and tables, so the page needs no
 * server and no network. Raw data files (*.data.json) and files that are
 * not records are skipped and listed at the bottom of the page.
 */
#include "tools/cli/cli.h"
#include "tools/cli/opts.h"
#include "tools/calc/calc_data.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A folder with more JSON files than this is refused. */
#define KVF_REPORT_MAX_FILES 10000

static int kvf_report_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int kvf_report_suffix(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);

    return n > k && strcmp(name + n - k, suffix) == 0;
}

/* Names of DIR's *.json files except raw data, sorted; NULL on error. */
static char **kvf_report_list(const char *dir, size_t *count_p)
{
    struct dirent *de;
    char **names = NULL;
    size_t n = 0, cap = 0;
    DIR *d;

    d = opendir(dir);
    if (d == NULL) {
        fprintf(stderr, "kvferry report: %s: %m\n", dir);
        return NULL;
    }
    while ((de = readdir(d)) != NULL) {
        if (!kvf_report_suffix(de->d_name, ".json") ||
            kvf_report_suffix(de->d_name, ".data.json")) {
            continue;
        }
        if (n == KVF_REPORT_MAX_FILES) {
            fprintf(stderr, "kvferry report: %s: more than %d records\n", dir,
                    KVF_REPORT_MAX_FILES);
            break;
        }
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            char **p = realloc(names, ncap * sizeof(*names));

            if (p == NULL) {
                break;
            }
            names = p;
            cap = ncap;
        }
        names[n] = strdup(de->d_name);
        if (names[n] != NULL) {
            n++;
        }
    }
    closedir(d);
    if (n > 0) {
        qsort(names, n, sizeof(*names), kvf_report_cmp);
    }
    *count_p = n;
    return names != NULL ? names : calloc(1, sizeof(*names));
}

/* Returns NULL when rec is a record, else why it is not. */
static const char *kvf_report_why_not(json_t *rec)
{
    const char *schema = json_string_value(json_object_get(rec, "schema"));
    const char *kind = json_string_value(json_object_get(rec, "kind"));

    if (!json_is_object(rec)) {
        return "not a JSON object";
    }
    if (schema == NULL || strncmp(schema, "kvferry-record/", 15) != 0) {
        return "no schema 'kvferry-record/N'";
    }
    if (kind == NULL ||
        (strcmp(kind, "bench") != 0 && strcmp(kind, "drill") != 0)) {
        return "kind is neither 'bench' nor 'drill'";
    }
    if (json_string_value(json_object_get(rec, "name")) == NULL) {
        return "no name";
    }
    if (!json_is_object(json_object_get(rec, "results"))) {
        return "no results object";
    }
    return NULL;
}

int kvf_cmd_report(int argc, char **argv)
{
    const char *dir, *out = NULL, *title = NULL;
    char outbuf[4096], path[4096], err[512], stamp[32];
    json_t *data, *records, *skipped;
    size_t i, n = 0;
    char **names;
    time_t now;
    int argi, rc;
    const kvf_opt_t opts[] = {
        {"output", 'o', KVF_OPT_STR, &out, "FILE",
         "page to write ('-' = stdout)", "DIR/report.html"},
        {"title", 0, KVF_OPT_STR, &title, "TEXT", "page title",
         "kvferry records: DIR"},
        {0},
    };
    const kvf_cmd_spec_t spec = {
        "kvferry report DIR [options]",
        "One HTML page with charts of the records (*.json) in DIR.", opts};

    rc = kvf_opts_parse(&spec, argc, argv, &argi);
    if (rc >= 0) {
        return rc;
    }
    if (argi + 1 != argc) {
        return kvf_opts_error(&spec, "one DIR of records expected");
    }
    rc = KVF_CLI_OK;
    dir = argv[argi];
    if (out == NULL) {
        snprintf(outbuf, sizeof(outbuf), "%s/report.html", dir);
        out = outbuf;
    }
    names = kvf_report_list(dir, &n);
    if (names == NULL) {
        return KVF_CLI_FAIL;
    }
    data = json_object();
    records = json_array();
    skipped = json_array();
    for (i = 0; i < n; i++) {
        const char *why;
        json_t *rec;

        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        rec = kvf_calc_json_load(path, err, sizeof(err));
        why = rec != NULL ? kvf_report_why_not(rec) : err;
        if (why != NULL) {
            fprintf(stderr, "kvferry report: skipping %s: %s\n", names[i], why);
            json_array_append_new(
                skipped, json_pack("{s:s, s:s}", "file", names[i], "why", why));
        } else {
            json_array_append_new(records, json_pack("{s:s, s:O}", "file",
                                                     names[i], "record", rec));
        }
        json_decref(rec);
    }
    now = time(NULL);
    strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    snprintf(path, sizeof(path), "kvferry records: %s", dir);
    json_object_set_new(data, "title", json_string(title ? title : path));
    json_object_set_new(data, "dir", json_string(dir));
    json_object_set_new(data, "generated", json_string(stamp));
    json_object_set_new(data, "records", records);
    json_object_set_new(data, "skipped", skipped);
    if (json_array_size(records) == 0) {
        fprintf(stderr, "kvferry report: no records in %s\n", dir);
        rc = KVF_CLI_FAIL;
    } else if (kvf_calc_page_write(out, kvf_asset_report_html, data) != 0) {
        rc = KVF_CLI_FAIL;
    } else if (strcmp(out, "-") != 0) {
        fprintf(stderr, "kvferry report: %zu record%s -> %s\n",
                json_array_size(records),
                json_array_size(records) == 1 ? "" : "s", out);
    }
    json_decref(data);
    for (i = 0; i < n; i++) {
        free(names[i]);
    }
    free(names);
    return rc;
}
