/*
 * `kvferry bench store --working-set W`: a working set larger than the
 * memory pools, read at random, with and without a disk tier, in one run.
 *
 *   ceiling  the device's own O_DIRECT read and write rates in --disk-dir
 *            (env_disk.c: 1 MiB requests, 16 in flight; then random reads
 *            of the working set's objects as the tier makes them, pieces
 *            of at most 1 MiB, 16 in flight: the read ceiling compared
 *            with), measured first;
 *   for each of "memory only" and "memory + disk tier":
 *     spawn  a master and one node (--pool; with the tier, --disk in
 *            --disk-dir, sized for the working set and a quarter more);
 *     fill   objects of --min-size..--max-size (log-uniform, fixed seed:
 *            the same objects both times) until W bytes are stored; with
 *            the tier the filling keeps pace with the tier's writes (a
 *            client faster than the disk sees the coldest objects not
 *            copied yet evicted for good; that is not what is measured);
 *     read   --clients threads get keys drawn uniformly from the working
 *            set for --duration: a hit's bytes are hashed again here and
 *            compared with the hash of the bytes put (the client has
 *            checked them against the master's checksum already; this is
 *            the independent count of wrong bytes), a miss is
 *            KVF_ERR_NO_KEY; any other result is an error.
 * Rows: hit rate, get P50/P99 (hits and misses together), gets/s and GB/s
 * of bytes returned; with the tier also the bytes the master loaded from
 * disk per second (tier_read_bytes_total over the phase) against the
 * read ceiling.
 */
#include "tools/bench/store.h"
#include "tools/bench/env.h"
#include "tools/bench/out.h"
#include "tools/cli/opts.h"
#include "tools/record/record.h"

#include <kvferry/engine.h>
#include <kvferry/store.h>

#include "core/time.h"
#include "tools/cli/net.h"
#include "core/rng.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct kvf_ws_opts {
    const char *ws_text; /* "3x" or a size */
    uint64_t ws;
    uint64_t pool;
    const char *dir;
    uint64_t min_size, max_size;
    unsigned clients;
    uint64_t duration_ms;
    uint64_t seed;
    int json;
    const char *record;
    const char *hypothesis;
} kvf_ws_opts_t;

/* The objects of the working set: their sizes (the bytes of object i
 * come from a generator seeded by i). */
typedef struct kvf_ws_set {
    uint64_t *size;
    uint64_t *sum; /* kvf_checksum of each object's bytes, as put */
    unsigned n;
    uint64_t bytes;
} kvf_ws_set_t;

typedef struct kvf_ws_result {
    const char *mode;
    long gets, hits, misses, errors, wrong;
    double seconds, p50_us, p99_us, gets_s, gb_s;
    double disk_gb_s;     /* bytes loaded from disk per second */
    long evicted, loaded; /* evictions_total, tier_reads_total (phase) */
    unsigned objects;     /* filled */
} kvf_ws_result_t;

typedef struct kvf_ws_ctx {
    kvf_store_h st;
    const kvf_ws_set_t *set;
    const kvf_ws_opts_t *o;
    uint64_t deadline_ns;
    pthread_barrier_t barrier;
} kvf_ws_ctx_t;

typedef struct kvf_ws_thread {
    kvf_ws_ctx_t *c;
    pthread_t tid;
    unsigned id;
    unsigned char *buf;
    kvf_region_h reg;
    double *lat;
    size_t nlat, cap;
    long hits, misses, errors, wrong;
    uint64_t bytes;
    kvf_status_t first_error;
} kvf_ws_thread_t;

static void kvf_ws_key(char *key, size_t cap, unsigned i)
{
    snprintf(key, cap, "ws/%08u", i);
}

static void kvf_ws_fill_bytes(unsigned char *buf, uint64_t len, unsigned i,
                              uint64_t seed)
{
    kvf_rng_t r;

    kvf_rng_seed(&r, seed * 0x100000001b3ull + i);
    kvf_rng_fill(&r, buf, len);
}

/* Sizes log-uniform in [min, max] until ws bytes. */
static int kvf_ws_plan(const kvf_ws_opts_t *o, kvf_ws_set_t *s)
{
    double lmin = log((double)o->min_size), lmax = log((double)o->max_size);
    unsigned cap = 1024;
    kvf_rng_t r;
    uint64_t sz;

    memset(s, 0, sizeof(*s));
    s->size = malloc(cap * sizeof(*s->size));
    kvf_rng_seed(&r, o->seed);
    while (s->size != NULL && s->bytes < o->ws) {
        if (s->n == cap) {
            cap *= 2;
            s->size = realloc(s->size, cap * sizeof(*s->size));
            if (s->size == NULL) {
                break;
            }
        }
        sz = (uint64_t)exp(lmin + (lmax - lmin) *
                                      (double)(kvf_rng_next(&r) >> 11) /
                                      9007199254740992.0);
        sz = (sz + 4095) & ~4095ull;
        s->size[s->n++] = sz;
        s->bytes += sz;
    }
    s->sum = s->size != NULL ? calloc(s->n, sizeof(*s->sum)) : NULL;
    return s->sum != NULL ? 0 : -1;
}

/* A value of the master's /metrics (kvferry_store_NAME), or -1. */
static long kvf_ws_metric(const char *http, const char *name)
{
    static char body[1 << 16];
    char pat[96];
    const char *p;

    if (kvf_net_http_get(http, "/metrics", body, sizeof(body), 2000) !=
        KVF_OK) {
        return -1;
    }
    snprintf(pat, sizeof(pat), "\nkvferry_store_%s ", name);
    p = strstr(body, pat);
    return p != NULL ? atol(p + strlen(pat)) : -1;
}

/* Puts the working set; with the tier, every 8 objects wait (10 s at
 * most) until the tier has copied what was put. */
static int kvf_ws_fill(kvf_store_h st, kvf_ws_set_t *s, const kvf_ws_opts_t *o,
                       const char *http, int tier, unsigned char *buf)
{
    uint64_t deadline;
    kvf_status_t rc;
    char key[64];
    unsigned i;

    for (i = 0; i < s->n; i++) {
        kvf_ws_key(key, sizeof(key), i);
        kvf_ws_fill_bytes(buf, s->size[i], i, o->seed);
        s->sum[i] = kvf_checksum(buf, s->size[i]);
        rc = kvf_store_put(st, key, buf, s->size[i], NULL);
        if (rc != KVF_OK) {
            fprintf(stderr, "kvferry bench store: put %s: %s\n", key,
                    kvf_status_str(rc));
            return -1;
        }
        if (!tier || (i % 8 != 7 && i + 1 != s->n)) {
            continue;
        }
        deadline = kvf_time_ms() + 10000;
        while (kvf_ws_metric(http, "tier_writes_total") < (long)i + 1 &&
               kvf_time_ms() < deadline) {
            usleep(2000);
        }
    }
    return 0;
}

static void *kvf_ws_thread_main(void *arg)
{
    kvf_ws_thread_t *t = arg;
    kvf_ws_ctx_t *c = t->c;
    kvf_rng_t r;
    kvf_status_t s;
    uint64_t t0;
    char key[64];
    size_t got;
    unsigned i;
    double *nl;

    kvf_rng_seed(&r, c->o->seed * 31 + t->id + 1);
    pthread_barrier_wait(&c->barrier);
    while (kvf_time_ns() < c->deadline_ns) {
        i = (unsigned)kvf_rng_below(&r, c->set->n);
        kvf_ws_key(key, sizeof(key), i);
        t0 = kvf_time_ns();
        s = kvf_store_get(c->st, key, t->buf, c->set->size[i], &got, 0);
        if (t->nlat == t->cap) {
            t->cap = t->cap ? t->cap * 2 : 4096;
            nl = realloc(t->lat, t->cap * sizeof(*nl));
            if (nl == NULL) {
                break;
            }
            t->lat = nl;
        }
        t->lat[t->nlat++] = (double)(kvf_time_ns() - t0) / 1e3;
        if (s == KVF_ERR_NO_KEY) {
            t->misses++;
            continue;
        }
        if (s != KVF_OK) {
            t->first_error = t->errors++ ? t->first_error : s;
            continue;
        }
        if (got != c->set->size[i] ||
            kvf_checksum(t->buf, got) != c->set->sum[i]) {
            t->wrong++;
            continue;
        }
        t->hits++;
        t->bytes += got;
    }
    return NULL;
}

static int kvf_ws_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

/* Merges the threads' latencies and counts into r. */
static void kvf_ws_collect(kvf_ws_thread_t *th, unsigned n, double secs,
                           kvf_ws_result_t *r)
{
    size_t total = 0, k = 0;
    uint64_t bytes = 0;
    double *all;
    unsigned i;

    for (i = 0; i < n; i++) {
        total += th[i].nlat;
    }
    all = malloc((total ? total : 1) * sizeof(*all));
    for (i = 0; i < n; i++) {
        if (all != NULL) {
            memcpy(all + k, th[i].lat, th[i].nlat * sizeof(*all));
        }
        k += th[i].nlat;
        r->hits += th[i].hits;
        r->misses += th[i].misses;
        r->errors += th[i].errors;
        r->wrong += th[i].wrong;
        bytes += th[i].bytes;
        if (th[i].errors > 0) {
            fprintf(stderr, "kvferry bench store: %ld get(s) failed: %s\n",
                    th[i].errors, kvf_status_str(th[i].first_error));
        }
    }
    r->gets = (long)total;
    r->seconds = secs;
    r->gets_s = secs > 0 ? (double)total / secs : 0;
    r->gb_s = secs > 0 ? (double)bytes / secs / 1e9 : 0;
    if (all != NULL && total > 0) {
        qsort(all, total, sizeof(*all), kvf_ws_cmp);
        r->p50_us = all[(size_t)(0.5 * (double)(total - 1))];
        r->p99_us = all[(size_t)(0.99 * (double)(total - 1))];
    }
    free(all);
}

/* The read phase on st; its result in r. */
static int kvf_ws_read(kvf_store_h st, const kvf_ws_set_t *set,
                       const kvf_ws_opts_t *o, const char *http,
                       kvf_ws_result_t *r)
{
    uint64_t maxsz = o->max_size, t0;
    kvf_ws_thread_t *th = calloc(o->clients, sizeof(*th));
    long ev0 = kvf_ws_metric(http, "evictions_total");
    long rd0 = kvf_ws_metric(http, "tier_reads_total");
    long rb0 = kvf_ws_metric(http, "tier_read_bytes_total");
    kvf_ws_ctx_t c = {.st = st, .set = set, .o = o};
    unsigned i, n = 0;

    if (th == NULL) {
        return -1;
    }
    pthread_barrier_init(&c.barrier, NULL, o->clients + 1);
    for (i = 0; i < o->clients; i++) {
        th[i].c = &c;
        th[i].id = i;
        th[i].buf = aligned_alloc(4096, maxsz);
        if (th[i].buf == NULL ||
            kvf_engine_reg(kvf_store_engine(st), th[i].buf, maxsz, KVF_MEM_HOST,
                           0, &th[i].reg) != KVF_OK) {
            break;
        }
    }
    for (n = 0; n < i; n++) {
        pthread_create(&th[n].tid, NULL, kvf_ws_thread_main, &th[n]);
    }
    c.deadline_ns = kvf_time_ns() + o->duration_ms * 1000000ull;
    t0 = kvf_time_ns();
    pthread_barrier_wait(&c.barrier);
    for (i = 0; i < n; i++) {
        pthread_join(th[i].tid, NULL);
    }
    kvf_ws_collect(th, n, (double)(kvf_time_ns() - t0) / 1e9, r);
    r->evicted = kvf_ws_metric(http, "evictions_total") - ev0;
    r->loaded = kvf_ws_metric(http, "tier_reads_total") - rd0;
    r->disk_gb_s =
        (double)(kvf_ws_metric(http, "tier_read_bytes_total") - rb0) /
        r->seconds / 1e9;
    for (i = 0; i < o->clients; i++) {
        if (th[i].reg != NULL) {
            kvf_engine_dereg(kvf_store_engine(st), th[i].reg);
        }
        free(th[i].buf);
        free(th[i].lat);
    }
    pthread_barrier_destroy(&c.barrier);
    free(th);
    return n == o->clients ? 0 : -1;
}

/* One configuration: spawn, fill, read, stop. */
static int kvf_ws_mode(const kvf_ws_opts_t *o, kvf_ws_set_t *set, int tier,
                       kvf_ws_result_t *r)
{
    char dsize[32], tdir[320], cmd[400];
    const char *extra[] = {"--disk", tdir, "--disk-size", dsize, NULL};
    kvf_store_params_t sp = {0};
    kvf_bs_cluster_t cl;
    unsigned char *buf;
    kvf_region_h reg = NULL;
    kvf_store_h st = NULL;
    int rc = -1;

    snprintf(tdir, sizeof(tdir), "%s/kvferry-ws-tier-%d", o->dir,
             (int)getpid());
    snprintf(dsize, sizeof(dsize), "%lu",
             (unsigned long)((set->bytes + set->bytes / 4 + (64u << 20)) &
                             ~4095ull));
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tdir);
    if (system(cmd) != 0 ||
        kvf_bs_cluster_start_args(&cl, 1, o->pool, tier ? extra : NULL) != 0) {
        return -1;
    }
    r->mode = tier ? "memory + disk tier" : "memory only";
    sp.field_mask = KVF_STORE_PARAM_MASTER;
    sp.master = cl.master;
    buf = aligned_alloc(4096, o->max_size);
    if (buf != NULL && kvf_store_connect(&sp, &st) == KVF_OK &&
        kvf_engine_reg(kvf_store_engine(st), buf, o->max_size, KVF_MEM_HOST, 0,
                       &reg) == KVF_OK &&
        kvf_ws_fill(st, set, o, cl.http, tier, buf) == 0) {
        r->objects = set->n;
        rc = kvf_ws_read(st, set, o, cl.http, r);
    }
    if (reg != NULL) {
        kvf_engine_dereg(kvf_store_engine(st), reg);
    }
    if (st != NULL) {
        kvf_store_disconnect(st);
    }
    free(buf);
    kvf_bs_cluster_stop(&cl);
    if (system(cmd) != 0) {
        fprintf(stderr, "kvferry bench store: cannot remove %s\n", tdir);
    }
    return rc;
}

static void kvf_ws_print(const kvf_ws_result_t *r, const kvf_env_disk_t *d)
{
    double hit = r->gets ? (double)r->hits / (double)r->gets : 0;

    printf("%-20s %9ld %7.1f%% %10.0f %10.0f %9.0f %8.3f", r->mode, r->gets,
           100.0 * hit, r->p50_us, r->p99_us, r->gets_s, r->gb_s);
    double ceil = kvf_env_disk_read_ceiling(d);

    if (r->loaded > 0) {
        printf(" %8.3f %5.0f%%", r->disk_gb_s,
               ceil > 0 ? 100.0 * r->disk_gb_s / ceil : 0);
    } else {
        printf(" %8s %6s", "-", "-");
    }
    printf(" %8ld %6ld\n", r->evicted, r->errors + r->wrong);
}

static void kvf_ws_json(const kvf_ws_opts_t *o, const kvf_ws_set_t *set,
                        const kvf_env_disk_t *d, const kvf_ws_result_t *r)
{
    int i;

    printf("{\"working_set\":%lu,\"pool\":%lu,\"objects\":%u,"
           "\"disk_read_gbs\":%.4f,\"disk_read_mix_gbs\":%.4f,"
           "\"disk_write_gbs\":%.4f,\"modes\":[",
           (unsigned long)set->bytes, (unsigned long)o->pool, set->n,
           d->read_gbs, d->read_mix_gbs, d->write_gbs);
    for (i = 0; i < 2; i++) {
        printf("%s{\"mode\":\"%s\",\"gets\":%ld,\"hits\":%ld,\"misses\":%ld,"
               "\"errors\":%ld,\"wrong\":%ld,\"p50_us\":%.1f,\"p99_us\":%.1f,"
               "\"gets_s\":%.1f,\"gb_s\":%.4f,\"disk_gb_s\":%.4f,"
               "\"loaded\":%ld,\"evicted\":%ld}",
               i ? "," : "", r[i].mode, r[i].gets, r[i].hits, r[i].misses,
               r[i].errors, r[i].wrong, r[i].p50_us, r[i].p99_us, r[i].gets_s,
               r[i].gb_s, r[i].disk_gb_s, r[i].loaded, r[i].evicted);
    }
    printf("]}\n");
}

/* The record (seed 003 §5) of the run. */
static int kvf_ws_record(const kvf_ws_opts_t *o, const kvf_ws_set_t *set,
                         const kvf_env_disk_t *d, const kvf_ws_result_t *r)
{
    double hit = r[1].gets ? (double)r[1].hits / (double)r[1].gets : 0;
    double ceil = kvf_env_disk_read_ceiling(d);
    double ratio = ceil > 0 ? r[1].disk_gb_s / ceil : 0;
    int ok = hit >= 0.95 && ratio >= 0.8 && r[0].wrong + r[1].wrong == 0;
    kvf_record_t *rec = kvf_record_new(
        "bench", "bench store --working-set",
        "with a disk tier, a working set 3x the memory pools is served at a "
        "hit rate >= 95 %, and gets served from disk reach >= 80 % of the "
        "device's O_DIRECT read ceiling (random reads of the working set's "
        "objects, 16 in flight) measured in the same run");
    char text[1024];
    int rc;

    if (rec == NULL) {
        return -1;
    }
    kvf_record_hypothesis(rec, o->hypothesis);
    kvf_env_disk_text(d, text, sizeof(text));
    kvf_record_config(rec, "disk ceiling", text);
    snprintf(text, sizeof(text),
             "working set %lu bytes in %u objects of %lu..%lu bytes "
             "(log-uniform), one node of %lu bytes, %u clients, %lu ms of "
             "uniform random gets per mode",
             (unsigned long)set->bytes, set->n, (unsigned long)o->min_size,
             (unsigned long)o->max_size, (unsigned long)o->pool, o->clients,
             (unsigned long)o->duration_ms);
    kvf_record_config(rec, "workload", text);
    for (int i = 0; i < 2; i++) {
        char name[96];

        snprintf(name, sizeof(name), "%s hit rate", r[i].mode);
        kvf_record_figure(
            rec, name,
            r[i].gets ? 100.0 * (double)r[i].hits / (double)r[i].gets : 0, "%",
            NAN, NAN);
        snprintf(name, sizeof(name), "%s get", r[i].mode);
        kvf_record_figure(rec, name, r[i].gets_s, "gets/s", r[i].p50_us,
                          r[i].p99_us);
    }
    kvf_record_figure(rec, "disk-served gets", r[1].disk_gb_s, "GB/s", NAN,
                      NAN);
    kvf_record_figure(rec, "disk O_DIRECT read ceiling (the objects' sizes)",
                      ceil, "GB/s", NAN, NAN);
    kvf_record_figure(rec, "disk O_DIRECT read, 1 MiB requests", d->read_gbs,
                      "GB/s", NAN, NAN);
    kvf_record_figure(rec, "wrong bytes", (double)(r[0].wrong + r[1].wrong),
                      "gets", NAN, NAN);
    snprintf(text, sizeof(text),
             "hit rate %.1f %% with the tier (%.1f %% without); disk-served "
             "gets at %.0f %% of the read ceiling",
             100.0 * hit,
             r[0].gets ? 100.0 * (double)r[0].hits / (double)r[0].gets : 0,
             100.0 * ratio);
    kvf_record_conclude(rec, ok ? "holds" : "does not hold", text);
    kvf_record_not_verified(rec, "one node on one host; the ceiling is this "
                                 "file system's, with the page cache "
                                 "bypassed");
    rc = kvf_env_record_write(rec, o->record);
    kvf_record_free(rec);
    return rc;
}

/* --disk-dir: made when missing (one level), else it must be a
 * directory; said before any mode runs. */
static int kvf_ws_dir(const char *dir)
{
    struct stat sb;

    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "kvferry bench store: --disk-dir %s: %s\n", dir,
                strerror(errno));
        return -1;
    }
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "kvferry bench store: --disk-dir %s: not a directory\n",
                dir);
        return -1;
    }
    return 0;
}

static int kvf_ws_parse(kvf_ws_opts_t *o)
{
    char *end;
    double f;

    if (o->min_size == 0 || o->max_size < o->min_size || o->clients == 0) {
        fprintf(stderr, "kvferry bench store: --min-size <= --max-size, "
                        "--clients >= 1\n");
        return -1;
    }
    f = strtod(o->ws_text, &end);
    if (end != o->ws_text && strcmp(end, "x") == 0 && f > 0) {
        o->ws = (uint64_t)(f * (double)o->pool);
        return 0;
    }
    if (kvf_parse_size(o->ws_text, &o->ws) != KVF_OK || o->ws == 0) {
        fprintf(stderr, "kvferry bench store: --working-set: a size or a "
                        "multiple of --pool (3x)\n");
        return -1;
    }
    return 0;
}

int kvf_cmd_bench_store_ws(int argc, char **argv)
{
    kvf_ws_opts_t o = {.ws_text = "3x",
                       .pool = 256ull << 20,
                       .dir = "/var/tmp",
                       .min_size = 64 << 10,
                       .max_size = 4 << 20,
                       .clients = 8,
                       .duration_ms = 10000,
                       .seed = 1};
    const kvf_opt_t opts[] = {
        {"working-set", 0, KVF_OPT_STR, &o.ws_text, "SIZE|Nx",
         "bytes of objects to read at random (Nx: N times --pool)", "3x"},
        {"pool", 0, KVF_OPT_SIZE, &o.pool, "SIZE", "the node's memory pool",
         "256M"},
        {"disk-dir", 0, KVF_OPT_STR, &o.dir, "DIR",
         "where the disk tier (and the ceiling's test file) go", "/var/tmp"},
        {"min-size", 0, KVF_OPT_SIZE, &o.min_size, "SIZE", "smallest object",
         "64K"},
        {"max-size", 0, KVF_OPT_SIZE, &o.max_size, "SIZE", "largest object",
         "4M"},
        {"clients", 0, KVF_OPT_UINT, &o.clients, "N", "reading threads", "8",
         .min = 1, .max = 256},
        {"duration", 0, KVF_OPT_MS64, &o.duration_ms, "DUR",
         "of the read phase, per mode", "10s"},
        {"seed", 0, KVF_OPT_U64, &o.seed, "N", "objects and order", "1"},
        {"json", 0, KVF_OPT_FLAG, &o.json, NULL, "print results as JSON"},
        {"record", 0, KVF_OPT_STR, &o.record, "DIR",
         "write a record (Markdown + JSON) into DIR"},
        {"hypothesis", 0, KVF_OPT_STR, &o.hypothesis, "TEXT",
         "the record's hypothesis"},
        {0},
    };
    const kvf_cmd_spec_t spec = {
        "kvferry bench store --working-set W [options]",
        "A working set larger than the memory pool, read at random, without\n"
        "and with a disk tier, beside the disk's O_DIRECT ceilings measured\n"
        "in the same run: hit rate, get P50/P99, gets/s, GB/s.",
        opts};
    kvf_ws_result_t r[2];
    kvf_env_disk_t d;
    kvf_ws_set_t set;
    char text[1024];
    int rc, i;

    rc = kvf_opts_parse(&spec, argc, argv, NULL);
    if (rc >= 0) {
        return rc;
    }
    if (kvf_ws_parse(&o) != 0 || kvf_ws_dir(o.dir) != 0 ||
        kvf_ws_plan(&o, &set) != 0) {
        return KVF_CLI_FAIL;
    }
    memset(r, 0, sizeof(r));
    kvf_env_disk_measure(o.dir, 1ull << 30, set.size, set.n, &d);
    kvf_env_disk_text(&d, text, sizeof(text));
    if (!o.json) {
        printf("# bench store --working-set: %u objects, %.1f MiB, over a "
               "pool of %.0f MiB (%.2fx)\n# disk: %s\n",
               set.n, (double)set.bytes / (1 << 20), (double)o.pool / (1 << 20),
               (double)set.bytes / (double)o.pool, text);
        printf("%-20s %9s %8s %10s %10s %9s %8s %8s %6s %8s %6s\n", "mode",
               "gets", "hit", "p50_us", "p99_us", "gets/s", "GB/s", "disk_GB/s",
               "ceil", "evicted", "errors");
    }
    for (i = 0; i < 2; i++) {
        if (kvf_ws_mode(&o, &set, i, &r[i]) != 0) {
            fprintf(stderr, "kvferry bench store: the %s run failed\n",
                    i ? "tier" : "memory-only");
            rc = KVF_CLI_FAIL;
            break;
        }
        if (!o.json) {
            kvf_ws_print(&r[i], &d);
            fflush(stdout);
        }
    }
    if (rc < 0 && o.json) {
        kvf_ws_json(&o, &set, &d, r);
    }
    if (rc < 0 && o.record != NULL && kvf_ws_record(&o, &set, &d, r) != 0) {
        rc = KVF_CLI_FAIL;
    }
    free(set.size);
    free(set.sum);
    return rc < 0 ? KVF_CLI_OK : rc;
}
