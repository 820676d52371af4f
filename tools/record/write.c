/*
 * Records (seed 003 §5), writing side: kvf_record_write() turns a record
 * into files in DIR:
 *
 *   <UTC yyyymmddThhmmssZ>-<slug of name>.json   (docs/record.schema.json)
 *   <UTC yyyymmddThhmmssZ>-<slug of name>.md     (the §5 template)
 *   <same base>.data.json                        (raw data, when given)
 *
 * The JSON file is created with O_EXCL; a name already taken gets "-2",
 * "-3", ... so two runs in the same second never overwrite each other.
 */
#include "tools/record/record.h"
#include "tools/record/record_int.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Numbers for Markdown: integers as such, others with 4 digits, "–" for
 * not applicable. */
static const char *kvf_rec_fmt(char *buf, size_t len, double v)
{
    if (!isfinite(v)) {
        snprintf(buf, len, "–");
    } else if ((v == floor(v) || fabs(v) >= 1e4) && fabs(v) < 1e15) {
        snprintf(buf, len, "%.0f", v);
    } else {
        snprintf(buf, len, "%.4g", v);
    }
    return buf;
}

/* A Markdown table cell: '|' escaped, line breaks as spaces. */
static void kvf_md_cell(FILE *f, const char *s)
{
    fputs("| ", f);
    for (; s != NULL && *s != '\0'; s++) {
        if (*s == '|') {
            fputs("\\|", f);
        } else if (*s == '\n' || *s == '\r') {
            fputc(' ', f);
        } else {
            fputc(*s, f);
        }
    }
    fputc(' ', f);
}

static void kvf_rec_executor(char *buf, size_t len)
{
    char host[256] = "localhost";
    const char *user = NULL;
    struct passwd pw, *res = NULL;
    char pwbuf[1024];

    if (getpwuid_r(geteuid(), &pw, pwbuf, sizeof(pwbuf), &res) == 0 &&
        res != NULL) {
        user = res->pw_name;
    }
    if (user == NULL) {
        user = getenv("USER");
    }
    if (gethostname(host, sizeof(host) - 1) != 0) {
        snprintf(host, sizeof(host), "localhost");
    }
    host[sizeof(host) - 1] = '\0';
    if (user != NULL) {
        snprintf(buf, len, "%s@%s", user, host);
    } else {
        snprintf(buf, len, "uid%u@%s", (unsigned)geteuid(), host);
    }
}

/* "bench blocks" -> "bench-blocks": lowercase letters and digits, runs of
 * anything else become one '-'. */
static void kvf_rec_slug(const char *name, char *buf, size_t len)
{
    size_t n = 0;
    int dash = 0;

    for (; *name != '\0' && n + 2 < len && n < 60; name++) {
        char c = *name;

        if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
            buf[n++] = c;
            dash = 0;
        } else if (c >= 'A' && c <= 'Z') {
            buf[n++] = (char)(c - 'A' + 'a');
            dash = 0;
        } else if (!dash && n > 0) {
            buf[n++] = '-';
            dash = 1;
        }
    }
    while (n > 0 && buf[n - 1] == '-') {
        n--;
    }
    if (n == 0) {
        buf[n++] = 'r';
    }
    buf[n] = '\0';
}

/* mkdir -p. */
static int kvf_rec_mkdirs(const char *dir)
{
    char path[4096];
    size_t i, n = strlen(dir);

    if (n == 0 || n >= sizeof(path)) {
        return -1;
    }
    memcpy(path, dir, n + 1);
    for (i = 1; i <= n; i++) {
        if (path[i] == '/' || path[i] == '\0') {
            char c = path[i];

            path[i] = '\0';
            if (mkdir(path, 0755) != 0 && errno != EEXIST) {
                return -1;
            }
            path[i] = c;
        }
    }
    return 0;
}

/* Integral values as integers (byte counts keep every digit), others with
 * the writer's 6 significant digits. */
static void kvf_rec_json_number(kvf_json_t *j, const char *key, double v)
{
    if (isfinite(v) && v == floor(v) && fabs(v) < 9e15) {
        kvf_json_int(j, key, (long long)v);
    } else {
        kvf_json_num(j, key, v);
    }
}

static void kvf_rec_json_kvs(kvf_json_t *j, const kvf_rec_vec_t *v)
{
    const kvf_rec_kv_t *kv = v->items;
    size_t i;

    for (i = 0; i < v->n; i++) {
        if (kv[i].text != NULL) {
            kvf_json_str(j, kv[i].key, kv[i].text);
        } else {
            kvf_rec_json_number(j, kv[i].key, kv[i].num);
        }
    }
}

static const kvf_rec_kv_t *kvf_rec_kv_get(const kvf_rec_vec_t *v,
                                          const char *key)
{
    const kvf_rec_kv_t *kv = v->items;
    size_t i;

    for (i = 0; i < v->n; i++) {
        if (strcmp(kv[i].key, key) == 0) {
            return &kv[i];
        }
    }
    return NULL;
}

static const char *const kvf_drill_texts[] = {"expected", "injected",
                                              "observed", "recovery", NULL};
static const char *const kvf_drill_nums[] = {
    "wrong_bytes", "max_wait_ms", "timeout_ms", "time_to_recover_ms", NULL};

static int kvf_rec_known(const char *const *list, const char *key)
{
    for (; *list != NULL; list++) {
        if (strcmp(*list, key) == 0) {
            return 1;
        }
    }
    return 0;
}

static void kvf_rec_json_drill(kvf_json_t *j, const kvf_record_t *rec)
{
    const kvf_rec_kv_t *kv;
    size_t i;

    kvf_json_obj(j, "drill");
    for (i = 0; kvf_drill_texts[i] != NULL; i++) {
        kv = kvf_rec_kv_get(&rec->drill_text, kvf_drill_texts[i]);
        kvf_json_str(j, kvf_drill_texts[i], kv ? kv->text : NULL);
    }
    for (i = 0; kvf_drill_nums[i] != NULL; i++) {
        kv = kvf_rec_kv_get(&rec->drill_num, kvf_drill_nums[i]);
        kvf_rec_json_number(j, kvf_drill_nums[i], kv ? kv->num : NAN);
    }
    kv = rec->drill_text.items;
    for (i = 0; i < rec->drill_text.n; i++) {
        if (!kvf_rec_known(kvf_drill_texts, kv[i].key)) {
            kvf_json_str(j, kv[i].key, kv[i].text);
        }
    }
    kv = rec->drill_num.items;
    for (i = 0; i < rec->drill_num.n; i++) {
        if (!kvf_rec_known(kvf_drill_nums, kv[i].key)) {
            kvf_rec_json_number(j, kv[i].key, kv[i].num);
        }
    }
    kvf_json_obj(j, "errors_by_status");
    kv = rec->drill_errors.items;
    for (i = 0; i < rec->drill_errors.n; i++) {
        kvf_json_int(j, kv[i].key, (long long)kv[i].num);
    }
    kvf_json_end_obj(j);
    kvf_json_obj(j, "resources");
    for (i = 0; i < rec->drill_res.n; i++) {
        const kvf_rec_resource_t *r =
            (const kvf_rec_resource_t *)rec->drill_res.items + i;

        kvf_json_obj(j, r->name);
        kvf_rec_json_number(j, "baseline", r->baseline);
        kvf_rec_json_number(j, "after", r->after);
        kvf_json_end_obj(j);
    }
    kvf_json_end_obj(j);
    kvf_json_end_obj(j);
}

static int kvf_rec_is_drill(const kvf_record_t *rec)
{
    return strcmp(rec->kind, "drill") == 0 || rec->drill_text.n > 0 ||
           rec->drill_num.n > 0 || rec->drill_errors.n > 0 ||
           rec->drill_res.n > 0;
}

static void kvf_rec_json(FILE *f, const kvf_record_t *rec, const char *date,
                         const char *executor, const char *raw_name)
{
    kvf_json_t j;
    size_t i, k;

    kvf_json_begin(&j, f);
    kvf_json_obj(&j, NULL);
    kvf_json_str(&j, "schema", KVF_REC_SCHEMA);
    kvf_json_str(&j, "kind", rec->kind);
    kvf_json_str(&j, "name", rec->name);
    kvf_json_str(&j, "date", date);
    kvf_json_str(&j, "executor", executor);
    kvf_json_raw(&j, "environment", rec->env_json);
    kvf_json_str(&j, "hypothesis", rec->hypothesis);
    kvf_json_obj(&j, "configuration");
    kvf_rec_json_kvs(&j, &rec->config);
    kvf_json_end_obj(&j);

    kvf_json_obj(&j, "results");
    kvf_json_str(&j, "raw_data", raw_name);
    kvf_json_arr(&j, "key_figures");
    for (i = 0; i < rec->figures.n; i++) {
        const kvf_rec_figure_t *fg =
            (const kvf_rec_figure_t *)rec->figures.items + i;

        kvf_json_obj(&j, NULL);
        kvf_json_str(&j, "name", fg->name);
        kvf_rec_json_number(&j, "value", fg->value);
        kvf_json_str(&j, "unit", fg->unit);
        kvf_json_num(&j, "p50", fg->p50);
        kvf_json_num(&j, "p99", fg->p99);
        kvf_json_end_obj(&j);
    }
    kvf_json_end_arr(&j);
    kvf_json_arr(&j, "series");
    for (i = 0; i < rec->series.n; i++) {
        const kvf_rec_series_t *s =
            (const kvf_rec_series_t *)rec->series.items + i;

        kvf_json_obj(&j, NULL);
        kvf_json_str(&j, "name", s->name);
        kvf_json_str(&j, "x_label", s->x_label);
        kvf_json_str(&j, "y_label", s->y_label);
        kvf_json_arr(&j, "points");
        for (k = 0; k < s->npoints; k++) {
            kvf_json_arr(&j, NULL);
            kvf_rec_json_number(&j, NULL, s->xy[2 * k]);
            kvf_json_num(&j, NULL, s->xy[2 * k + 1]);
            kvf_json_end_arr(&j);
        }
        kvf_json_end_arr(&j);
        kvf_json_end_obj(&j);
    }
    kvf_json_end_arr(&j);
    kvf_json_end_obj(&j);

    if (rec->has_estimate) {
        kvf_json_obj(&j, "estimate");
        kvf_json_num(&j, "value", rec->est_value);
        kvf_json_str(&j, "unit", rec->est_unit);
        kvf_json_str(&j, "source", rec->est_source);
        kvf_json_end_obj(&j);
    } else {
        kvf_json_str(&j, "estimate", NULL);
    }
    if (rec->has_gap) {
        kvf_json_obj(&j, "gap");
        kvf_json_num(&j, "ratio", rec->gap_ratio);
        kvf_json_str(&j, "explanation", rec->gap_text);
        kvf_json_end_obj(&j);
    } else {
        kvf_json_str(&j, "gap", NULL);
    }
    kvf_json_str(&j, "conclusion", rec->conclusion);
    kvf_json_str(&j, "conclusion_text", rec->conclusion_text);
    kvf_json_arr(&j, "not_verified");
    for (i = 0; i < rec->not_verified.n; i++) {
        kvf_json_str(&j, NULL, ((char **)rec->not_verified.items)[i]);
    }
    kvf_json_end_arr(&j);
    if (kvf_rec_is_drill(rec)) {
        kvf_rec_json_drill(&j, rec);
    }
    kvf_json_end_obj(&j);
}

static void kvf_rec_md_drill(FILE *f, const kvf_record_t *rec)
{
    const kvf_rec_kv_t *kv;
    char a[48], b[48];
    size_t i;

    fprintf(f, "## Drill: expected → injected → observed → recovery\n\n");
    kv = rec->drill_text.items;
    for (i = 0; i < rec->drill_text.n; i++) {
        fprintf(f, "- **%s:** %s\n", kv[i].key, kv[i].text);
    }
    kv = rec->drill_num.items;
    for (i = 0; i < rec->drill_num.n; i++) {
        fprintf(f, "- **%s:** %s\n", kv[i].key,
                kvf_rec_fmt(a, sizeof(a), kv[i].num));
    }
    if (rec->drill_errors.n > 0) {
        fprintf(f, "\nErrors seen by clients:\n\n| Status | Count |\n"
                   "|---|---:|\n");
        kv = rec->drill_errors.items;
        for (i = 0; i < rec->drill_errors.n; i++) {
            fprintf(f, "| %s | %s |\n", kv[i].key,
                    kvf_rec_fmt(a, sizeof(a), kv[i].num));
        }
    }
    if (rec->drill_res.n > 0) {
        fprintf(f, "\nResources:\n\n| Resource | Baseline | After |\n"
                   "|---|---:|---:|\n");
        for (i = 0; i < rec->drill_res.n; i++) {
            const kvf_rec_resource_t *r =
                (const kvf_rec_resource_t *)rec->drill_res.items + i;

            fprintf(f, "| %s | %s | %s |\n", r->name,
                    kvf_rec_fmt(a, sizeof(a), r->baseline),
                    kvf_rec_fmt(b, sizeof(b), r->after));
        }
    }
    fputc('\n', f);
}

static void kvf_rec_md_results(FILE *f, const kvf_record_t *rec,
                               const char *raw_name)
{
    char a[48], b[48], c[48];
    size_t i, k;

    fprintf(f, "## Results\n\nRaw data: %s%s%s\n\n", raw_name ? "`" : "",
            raw_name ? raw_name : "none kept", raw_name ? "`" : "");
    fprintf(f, "### Key figures\n\n| Figure | Value | Unit | P50 | P99 |\n"
               "|---|---:|---|---:|---:|\n");
    for (i = 0; i < rec->figures.n; i++) {
        const kvf_rec_figure_t *fg =
            (const kvf_rec_figure_t *)rec->figures.items + i;

        kvf_md_cell(f, fg->name);
        fprintf(f, "| %s ", kvf_rec_fmt(a, sizeof(a), fg->value));
        kvf_md_cell(f, fg->unit);
        fprintf(f, "| %s | %s |\n", kvf_rec_fmt(b, sizeof(b), fg->p50),
                kvf_rec_fmt(c, sizeof(c), fg->p99));
    }
    for (i = 0; i < rec->series.n; i++) {
        const kvf_rec_series_t *s =
            (const kvf_rec_series_t *)rec->series.items + i;

        fprintf(f, "\n### Series: %s\n\n", s->name);
        kvf_md_cell(f, s->x_label);
        kvf_md_cell(f, s->y_label);
        fprintf(f, "|\n|---:|---:|\n");
        for (k = 0; k < s->npoints; k++) {
            fprintf(f, "| %s | %s |\n", kvf_rec_fmt(a, sizeof(a), s->xy[2 * k]),
                    kvf_rec_fmt(b, sizeof(b), s->xy[2 * k + 1]));
        }
    }
    fputc('\n', f);
}

static void kvf_rec_md(FILE *f, const kvf_record_t *rec, const char *date,
                       const char *executor, const char *raw_name)
{
    const kvf_rec_kv_t *kv = rec->config.items;
    char a[48];
    size_t i;

    fprintf(f, "# %s\n\n", rec->name);
    fprintf(f, "- **Experiment:** %s (%s, record %s)\n", rec->name, rec->kind,
            KVF_REC_SCHEMA);
    fprintf(f, "- **Date / executor:** %s / %s\n\n", date, executor);
    fprintf(f, "## Environment\n\n| Item | Value |\n|---|---|\n");
    fputs(rec->env_md, f);
    fprintf(f, "\n## Hypothesis\n\n%s\n\n",
            rec->hypothesis[0] ? rec->hypothesis : "(none given)");
    fprintf(f, "## Configuration\n\n| Key | Value |\n|---|---|\n");
    for (i = 0; i < rec->config.n; i++) {
        kvf_md_cell(f, kv[i].key);
        kvf_md_cell(f, kv[i].text ? kv[i].text
                                  : kvf_rec_fmt(a, sizeof(a), kv[i].num));
        fprintf(f, "|\n");
    }
    fputc('\n', f);
    kvf_rec_md_results(f, rec, raw_name);
    fprintf(f, "## Gap to the estimate\n\n");
    if (rec->has_estimate) {
        fprintf(f, "- Estimate: %s %s (%s)\n",
                kvf_rec_fmt(a, sizeof(a), rec->est_value), rec->est_unit,
                rec->est_source);
    } else {
        fprintf(f, "- Estimate: none\n");
    }
    if (rec->has_gap) {
        fprintf(f, "- Measured / estimate: %.3f — %s\n", rec->gap_ratio,
                rec->gap_text);
    }
    fprintf(f, "\n## Conclusion\n\n**%s** — %s\n\n", rec->conclusion,
            rec->conclusion_text);
    if (kvf_rec_is_drill(rec)) {
        kvf_rec_md_drill(f, rec);
    }
    fprintf(f, "## Not verified, and next steps\n\n");
    if (rec->not_verified.n == 0) {
        fprintf(f, "- (nothing listed)\n");
    }
    for (i = 0; i < rec->not_verified.n; i++) {
        fprintf(f, "- %s\n", ((char **)rec->not_verified.items)[i]);
    }
}

/* Opens path for writing; excl: fail with EEXIST if it exists. */
static FILE *kvf_rec_open(const char *path, int excl)
{
    int fd = open(
        path, O_WRONLY | O_CREAT | O_CLOEXEC | (excl ? O_EXCL : O_TRUNC), 0644);
    FILE *f;

    if (fd < 0) {
        return NULL;
    }
    f = fdopen(fd, "w");
    if (f == NULL) {
        close(fd);
    }
    return f;
}

static int kvf_rec_close(FILE *f, const char *path)
{
    int bad = ferror(f);

    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "kvferry: record: writing %s failed: %s\n", path,
                strerror(errno));
        return -1;
    }
    return 0;
}

/* Non-zero when text is one JSON object. */
static int kvf_rec_env_ok(const char *text)
{
    json_t *v = json_loads(text, 0, NULL);
    int ok = json_is_object(v);

    json_decref(v);
    return ok;
}

int kvf_record_write(kvf_record_t *rec, const char *dir)
{
    char date[32], stamp[32], slug[64], executor[512];
    char base[4096], path[8448], raw_name[4200];
    const char *raw = NULL;
    struct tm tm;
    time_t now = time(NULL);
    FILE *f = NULL;
    int k, rc = 0;

    if (rec == NULL || dir == NULL) {
        return -1;
    }
    if (rec->oom) {
        fprintf(stderr, "kvferry: record: out of memory while building\n");
        return -1;
    }
    if (rec->env_json == NULL) {
        fprintf(stderr, "kvferry: record: no environment given\n");
        return -1;
    }
    if (!kvf_rec_env_ok(rec->env_json)) {
        fprintf(stderr, "kvferry: record: the environment is not a JSON "
                        "object\n");
        return -1;
    }
    if (rec->conclusion == NULL) {
        fprintf(stderr, "kvferry: record: no conclusion given; writing "
                        "'holds under conditions'\n");
        kvf_record_conclude(rec, "holds under conditions",
                            "the command drew no conclusion of its own; "
                            "read the key figures");
    }
    if (kvf_rec_mkdirs(dir) != 0) {
        fprintf(stderr, "kvferry: record: cannot create %s: %s\n", dir,
                strerror(errno));
        return -1;
    }
    gmtime_r(&now, &tm);
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", &tm);
    strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
    kvf_rec_slug(rec->name, slug, sizeof(slug));
    kvf_rec_executor(executor, sizeof(executor));
    for (k = 1; k <= 100 && f == NULL; k++) {
        if (k == 1) {
            snprintf(base, sizeof(base), "%s-%s", stamp, slug);
        } else {
            snprintf(base, sizeof(base), "%s-%s-%d", stamp, slug, k);
        }
        snprintf(path, sizeof(path), "%s/%s.json", dir, base);
        f = kvf_rec_open(path, 1);
        if (f == NULL && errno != EEXIST) {
            break;
        }
    }
    if (f == NULL) {
        fprintf(stderr, "kvferry: record: cannot create %s: %s\n", path,
                strerror(errno));
        return -1;
    }
    if (rec->raw != NULL) {
        snprintf(raw_name, sizeof(raw_name), "%s.data.json", base);
        raw = raw_name;
    }
    kvf_rec_json(f, rec, date, executor, raw);
    rc |= kvf_rec_close(f, path);
    fprintf(stderr, "record: %s\n", path);

    snprintf(path, sizeof(path), "%s/%s.md", dir, base);
    f = kvf_rec_open(path, 0);
    if (f == NULL) {
        fprintf(stderr, "kvferry: record: cannot create %s: %s\n", path,
                strerror(errno));
        return -1;
    }
    kvf_rec_md(f, rec, date, executor, raw);
    rc |= kvf_rec_close(f, path);
    fprintf(stderr, "record: %s\n", path);

    if (raw != NULL) {
        snprintf(path, sizeof(path), "%s/%s", dir, raw);
        f = kvf_rec_open(path, 0);
        if (f == NULL) {
            fprintf(stderr, "kvferry: record: cannot create %s: %s\n", path,
                    strerror(errno));
            return -1;
        }
        fputs(rec->raw, f);
        rc |= kvf_rec_close(f, path);
        fprintf(stderr, "record: %s\n", path);
    }
    return rc;
}
