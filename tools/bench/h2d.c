/*
 * `kvferry bench h2d`: seed 003 §3.1. Copies 1 GiB contiguous between
 * host memory and one GPU, host->GPU (H2D) and GPU->host (D2H), with
 * pinned (page-locked) and with pageable host memory: a few warm-up
 * copies, then timed ones (each on the copy context's stream, waited
 * for). Prints the GPU (index, model, PCI address, NUMA node, PCIe link),
 * the NUMA node the host buffers landed on and the CPU the thread runs
 * on, then GiB/s (total bytes / total time, as the seed computes it) and
 * per-copy P50/P99, and the best copy's GiB/s: what the GPU rows' and
 * the load path's ceilings are (docs/performance.md, "Ceilings"). The
 * estimate is the commonly measured pinned figure of the link's PCIe
 * generation (Gen4 ~25 GB/s, Gen5 ~50 GB/s, seed 003): a public figure
 * to compare with, not a ceiling.
 */
#include "tools/bench/gpu.h"
#include "tools/cli/opts.h"
#include "tools/bench/env.h"
#include "tools/bench/out.h"
#include "tools/record/record.h"

#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/time.h"

#define KVF_MPOL_F_NODE 1
#define KVF_MPOL_F_ADDR 2

typedef struct kvf_h2d_row {
    int pinned;
    int h2d;
    double gib_s; /* total bytes / total time */
    double best_gib_s; /* the fastest copy: the ceiling other rows use */
    double p50_ms;
    double p99_ms;
} kvf_h2d_row_t;

typedef struct kvf_h2d_opts {
    int gpu;
    uint64_t size;
    unsigned iters;
    unsigned warmup;
    const char *json;
    const char *record;
    const char *hypothesis;
    kvf_expect_t *expect; /* --expect rules (plus the defaults) */
    int strict;           /* a missed rule fails the command */
} kvf_h2d_opts_t;

static int kvf_h2d_parse(int argc, char **argv, kvf_h2d_opts_t *o)
{
    int rc;
    const kvf_opt_t opts[] = {
        {"gpu", 0, KVF_OPT_INT, &o->gpu, "N", "GPU", "0", .min = 0, .max = 63},
        {"size", 0, KVF_OPT_SIZE, &o->size, "SIZE", "bytes per copy", "1G"},
        {"iters", 0, KVF_OPT_UINT, &o->iters, "N", "timed copies per case",
         "10", .min = 1, .max = 1000},
        {"warmup", 0, KVF_OPT_UINT, &o->warmup, "N", "untimed copies first",
         "3", .min = 0, .max = 100},
        {"json", 0, KVF_OPT_STR, &o->json, "FILE",
         "write results as JSON ('-' = stdout)"},
        {"record", 0, KVF_OPT_STR, &o->record, "DIR",
         "write a record (Markdown + JSON) into DIR"},
        {"hypothesis", 0, KVF_OPT_STR, &o->hypothesis, "TEXT",
         "the record's hypothesis"},
        {"expect", 0, KVF_OPT_FN, &o->expect, "RULE",
         "a claim to check (repeatable); figures: pinned_pct (pinned\n"
         "GB/s as % of the PCIe generation's common figure),\n"
         "pageable_over_pinned (fastest pageable over slowest pinned)",
         "pinned_pct>=90, pageable_over_pinned<1", .fn = kvf_bench_expect_opt},
        {"strict", 0, KVF_OPT_FLAG, &o->strict, NULL,
         "exit 1 when a claim is missed (default: exit 0 once measured)"},
        {0},
    };
    const kvf_cmd_spec_t spec = {
        "kvferry bench h2d [options]",
        "Host-to-GPU and GPU-to-host copies of SIZE contiguous bytes, from\n"
        "pinned and from pageable host memory (needs a GPU).",
        opts, .progress = 1};

    memset(o, 0, sizeof(*o));
    o->size = 1ull << 30;
    o->iters = 10;
    o->warmup = 3;
    rc = kvf_opts_parse(&spec, argc, argv, NULL);
    if (rc >= 0) {
        return rc == KVF_CLI_OK ? -1 : rc;
    }
    if (o->size == 0) {
        fprintf(stderr, "kvferry: --size must be > 0\n");
        return KVF_CLI_USAGE;
    }
    return 0;
}

/* NUMA node of the page holding addr, -1 when not known. */
static int kvf_h2d_node_of(void *addr)
{
    int node = -1;

    if (syscall(SYS_get_mempolicy, &node, NULL, 0UL, addr,
                KVF_MPOL_F_NODE | KVF_MPOL_F_ADDR) != 0) {
        return -1;
    }
    return node;
}

/* One case: warm-up, then timed copies; fills row. */
static int kvf_h2d_case(const kvf_h2d_opts_t *o, kvf_gpu_copier_t *cp,
                        const kvf_gpu_pool_t *host, const kvf_gpu_pool_t *dev,
                        int h2d, kvf_h2d_row_t *row)
{
    const kvf_gpu_mem_t *src = h2d ? &host->mem : &dev->mem;
    const kvf_gpu_mem_t *dst = h2d ? &dev->mem : &host->mem;
    double *lat = calloc(o->iters, sizeof(double)), total = 0;
    kvf_status_t st = KVF_OK;
    unsigned i;
    uint64_t t0;

    if (lat == NULL) {
        return -1;
    }
    for (i = 0; i < o->warmup + o->iters && st == KVF_OK; i++) {
        t0 = kvf_time_ns();
        st = kvf_gpu_base_contig(cp, src, 0, dst, 0, o->size, 60000);
        if (i >= o->warmup) {
            lat[i - o->warmup] = (double)(kvf_time_ns() - t0) / 1e6;
            total += lat[i - o->warmup];
        }
    }
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry: copy: %s\n", kvf_status_str(st));
        free(lat);
        return -1;
    }
    row->pinned = host->mem.type == KVF_MEM_PINNED;
    row->h2d = h2d;
    row->gib_s = (double)o->size * o->iters / (1u << 30) / (total / 1e3);
    row->p50_ms = kvf_bench_quantile(lat, o->iters, 0.5);
    row->best_gib_s = (double)o->size / (1u << 30) / (lat[0] / 1e3);
    row->p99_ms = kvf_bench_quantile(lat, o->iters, 0.99);
    free(lat);
    return 0;
}

/* The columns of a row, declared once for the text table, the JSON rows
 * and the record. */
static const kvf_out_col_t kvf_h2d_cols[] = {
    {"memory", "memory", NULL, "%-9s", .kind = KVF_OUT_STR, .width = -9},
    {"direction", "dir", NULL, "%-4s", .kind = KVF_OUT_STR, .width = -4},
    {"gib_s", "GiB/s", "GiB/s", "%9.2f", .width = 9},
    {"gb_s", "GB/s", "GB/s", "%9.2f", .width = 9, .fig = "(copy latency ms)",
     .p50 = "lat_ms_p50", .p99 = "lat_ms_p99"},
    {"lat_ms_p50", "p50 ms", "ms", "%9.3f", .width = 9},
    {"lat_ms_p99", "p99 ms", "ms", "%9.3f", .width = 9},
    {"best_gib_s", "best GiB/s", "GiB/s", "%10.2f", .width = 10},
    {"node", "node", NULL, "%6lld", .kind = KVF_OUT_INT, .width = 6,
     .nojson = 1},
};

/* Where the run's buffers and thread were: the JSON members before
 * "rows". */
typedef struct kvf_h2d_where {
    const kvf_h2d_opts_t *o;
    const int *nodes;
    int cpu, cpu_node;
} kvf_h2d_where_t;

static void kvf_h2d_table_row(kvf_out_table_t *t, const kvf_h2d_row_t *r,
                              int node)
{
    char label[32];

    snprintf(label, sizeof(label), "%s %s", r->pinned ? "pinned" : "pageable",
             r->h2d ? "H2D" : "D2H");
    kvf_out_row(t, label, NULL);
    kvf_out_str(t, "memory", r->pinned ? "pinned" : "pageable");
    kvf_out_str(t, "direction", r->h2d ? "H2D" : "D2H");
    kvf_out_num(t, "gib_s", r->gib_s);
    kvf_out_num(t, "gb_s", r->gib_s * (1u << 30) / 1e9);
    kvf_out_num(t, "lat_ms_p50", r->p50_ms);
    kvf_out_num(t, "lat_ms_p99", r->p99_ms);
    kvf_out_num(t, "best_gib_s", r->best_gib_s);
    kvf_out_num(t, "node", node);
}

static void kvf_h2d_json_head(kvf_json_t *j, void *ctx)
{
    const kvf_h2d_where_t *w = ctx;

    kvf_json_str(j, "bench", "h2d");
    kvf_gpu_json_info(j, "gpu", w->o->gpu);
    kvf_json_int(j, "size_bytes", (long long)w->o->size);
    kvf_json_int(j, "iters", w->o->iters);
    kvf_json_int(j, "warmup", w->o->warmup);
    kvf_json_int(j, "pinned_buffer_numa_node", w->nodes[0]);
    kvf_json_int(j, "pageable_buffer_numa_node", w->nodes[1]);
    kvf_json_int(j, "cpu", w->cpu);
    kvf_json_int(j, "cpu_numa_node", w->cpu_node);
}

static int kvf_h2d_record(const kvf_h2d_opts_t *o, const kvf_h2d_row_t *rows,
                          unsigned n, const kvf_out_table_t *t,
                          kvf_h2d_where_t *w)
{
    const int *nodes = w->nodes;
    kvf_gpu_info_t in;
    double est, worst = 1e30, pin_min = 1e30, page_max = 0;
    char text[512];
    kvf_record_t *rec;
    unsigned i;
    int bad;

    rec = kvf_record_new("bench", "bench h2d",
                         "pinned host memory copies 1 GiB H2D and D2H near "
                         "the common figure of the link's PCIe generation "
                         "(Gen5 ~50 GB/s, Gen4 ~25 GB/s), and pageable "
                         "memory is clearly slower (seed 003 3.1)");
    if (rec == NULL) {
        return -1;
    }
    kvf_record_hypothesis(rec, o->hypothesis);
    kvf_gpu_describe(o->gpu, text, sizeof(text));
    kvf_record_config(rec, "gpu", text);
    kvf_record_config_num(rec, "size_bytes", (double)o->size);
    kvf_record_config_num(rec, "iters", o->iters);
    kvf_record_config_num(rec, "warmup", o->warmup);
    kvf_record_config_num(rec, "pinned buffer NUMA node", nodes[0]);
    kvf_record_config_num(rec, "pageable buffer NUMA node", nodes[1]);
    kvf_record_config_num(rec, "cpu", w->cpu);
    kvf_record_config_num(rec, "cpu NUMA node", w->cpu_node);
    kvf_out_record_figures(t, rec);
    for (i = 0; i < n; i++) {
        if (rows[i].pinned) {
            pin_min = fmin(pin_min, rows[i].gib_s * (1u << 30) / 1e9);
        } else {
            page_max = fmax(page_max, rows[i].gib_s * (1u << 30) / 1e9);
        }
    }
    if (kvf_gpu_info(o->gpu, &in) != KVF_OK) {
        in.pcie_gen = 0;
    }
    est = in.pcie_gen >= 5   ? 50.0
          : in.pcie_gen == 4 ? 25.0
          : in.pcie_gen == 3 ? 12.0
                             : 50.0;
    snprintf(text, sizeof(text),
             "commonly measured pinned copy over PCIe Gen%d x16 (seed 003 "
             "3.1: Gen4 ~25 GB/s, Gen5 ~50 GB/s)%s",
             in.pcie_gen ? in.pcie_gen : 5,
             in.pcie_gen ? "" : "; generation not detected, Gen5 assumed");
    kvf_record_estimate(rec, est, "GB/s", text);
    worst = pin_min / est;
    snprintf(text, sizeof(text),
             "the slower pinned direction reaches %.0f %% of the common "
             "figure; pageable memory peaks at %.1f GB/s (the driver "
             "stages it through its own pinned buffers)",
             100.0 * worst, page_max);
    kvf_record_gap(rec, worst, text);
    snprintf(text, sizeof(text), "pinned %s; pageable %s",
             worst >= 0.9 ? ">= 90 % of the common figure both ways"
                          : "below 90 % of the common figure",
             page_max < pin_min ? "slower than pinned" : "not slower");
    kvf_record_conclude(
        rec, worst >= 0.9 && page_max < pin_min ? "holds" : "does not hold",
        text);
    kvf_record_not_verified(rec, "bytes are not compared (bandwidth only)");
    kvf_record_not_verified(rec, "one GPU at a time; several GPUs sharing "
                                 "a PCIe switch or a socket are not "
                                 "measured together");
    {
        char *raw = NULL;
        size_t rawlen = 0;
        FILE *mf = open_memstream(&raw, &rawlen);

        if (mf != NULL) {
            kvf_out_json_doc(t, mf, kvf_h2d_json_head, w);
            fputc('\n', mf);
            fclose(mf);
            kvf_record_raw(rec, raw);
        }
        free(raw);
    }
    bad = kvf_env_record_write(rec, o->record) != 0;
    kvf_record_free(rec);
    return bad ? -1 : 0;
}

/* The claims' figures of the rows (the record's conclusion as rules). */
static void kvf_h2d_expect(const kvf_h2d_opts_t *o, const kvf_h2d_row_t *rows,
                           unsigned n)
{
    kvf_gpu_info_t in;
    double est, pin_min = INFINITY, page_max = 0, gb;
    unsigned i;

    if (kvf_gpu_info(o->gpu, &in) != KVF_OK) {
        in.pcie_gen = 0;
    }
    est = in.pcie_gen == 4 ? 25.0 : in.pcie_gen == 3 ? 12.0 : 50.0;
    for (i = 0; i < n; i++) {
        gb = rows[i].gib_s * (1u << 30) / 1e9;
        if (rows[i].pinned) {
            kvf_expect_figure(o->expect, "pinned_pct", 100.0 * gb / est,
                              rows[i].h2d ? "pinned H2D" : "pinned D2H");
            pin_min = fmin(pin_min, gb);
        } else {
            page_max = fmax(page_max, gb);
        }
    }
    if (n == 4 && pin_min > 0) {
        kvf_expect_figure(o->expect, "pageable_over_pinned", page_max / pin_min,
                          "fastest pageable");
    }
}

int kvf_cmd_bench_h2d(int argc, char **argv)
{
    kvf_h2d_row_t rows[4];
    kvf_gpu_pool_t host, dev;
    kvf_gpu_copier_t *cp = NULL;
    kvf_h2d_opts_t o;
    char desc[320], sz[32];
    int rc, pinned, h2d, bad = 0, nodes[2] = {-1, -1};
    unsigned cpu = 0, cpu_node = 0, n = 0;
    kvf_status_t st;
    kvf_progress_t prog;
    kvf_busy_t busy;
    kvf_out_table_t t;
    kvf_h2d_where_t where;

    rc = kvf_h2d_parse(argc, argv, &o);
    if (rc != 0 || kvf_bench_expect(&o.expect) == NULL) {
        kvf_expect_free(o.expect);
        return rc < 0 ? KVF_CLI_OK : rc != 0 ? rc : KVF_CLI_FAIL;
    }
    if (kvf_gpu_count() == 0) {
        printf("kvferry: bench h2d: %s: skipped\n",
               kvf_gpu_built() ? "no GPU on this machine"
                               : "built without CUDA");
        kvf_expect_free(o.expect);
        printf("UNMEASURED (no GPU)\n");
        return KVF_CLI_SKIP;
    }
    if (o.gpu >= kvf_gpu_count()) {
        fprintf(stderr,
                "kvferry bench h2d: --gpu %d: this machine has %d GPU(s) "
                "\xe2\x80\x94 pick one of 0..%d\n",
                o.gpu, kvf_gpu_count(), kvf_gpu_count() - 1);
        kvf_expect_free(o.expect);
        return KVF_CLI_USAGE;
    }
    st = kvf_gpu_copier_create(o.gpu, &cp);
    if (st != KVF_OK ||
        kvf_gpu_pool_alloc(&dev, KVF_MEM_CUDA, o.gpu, o.size, 3) != 0) {
        fprintf(stderr, "kvferry: GPU %d: %s\n", o.gpu, kvf_status_str(st));
        kvf_gpu_copier_destroy(cp);
        kvf_expect_free(o.expect);
        return KVF_CLI_FAIL;
    }
    if (syscall(SYS_getcpu, &cpu, &cpu_node, NULL) != 0) {
        cpu = cpu_node = 0;
    }
    kvf_gpu_describe(o.gpu, desc, sizeof(desc));
    kvf_fmt_size(o.size, sz, sizeof(sz));
    printf("# %s\n", desc);
    printf("bench h2d: %s contiguous, %u warm-up + %u timed copies per "
           "case; thread on CPU %u (NUMA node %u)\n",
           sz, o.warmup, o.iters, cpu, cpu_node);
    kvf_out_init(&t, kvf_h2d_cols,
                 sizeof(kvf_h2d_cols) / sizeof(kvf_h2d_cols[0]));
    t.aligned = 1;
    kvf_out_text_header(&t, stdout);
    fflush(stdout);
    kvf_progress_begin(&prog, "bench h2d", 4, 4);
    for (pinned = 1; pinned >= 0 && !bad; pinned--) {
        if (kvf_gpu_pool_alloc(&host, pinned ? KVF_MEM_PINNED : KVF_MEM_HOST,
                               o.gpu, o.size, 4) != 0) {
            bad = 1;
            break;
        }
        nodes[pinned ? 0 : 1] = kvf_h2d_node_of(host.mem.base);
        for (h2d = 1; h2d >= 0; h2d--) {
            kvf_h2d_row_t *r = &rows[n];

            kvf_progress_step(&prog, "%s %s copies of %s",
                              pinned ? "pinned" : "pageable",
                              h2d ? "H2D" : "D2H", sz);
            rc = kvf_h2d_case(&o, cp, &host, &dev, h2d, r);
            kvf_progress_done(&prog, 1);
            kvf_progress_clear(&prog);
            if (rc != 0) {
                bad = 1;
                break;
            }
            kvf_h2d_table_row(&t, r, nodes[pinned ? 0 : 1]);
            kvf_out_text_row(&t, t.nrows - 1, stdout);
            n++;
        }
        kvf_gpu_pool_free(&host);
    }
    busy = kvf_progress_end(&prog);
    where.o = &o;
    where.nodes = nodes;
    where.cpu = (int)cpu;
    where.cpu_node = (int)cpu_node;
    kvf_h2d_expect(&o, rows, n);
    {
        static const char *const defaults[] = {"pinned_pct>=90",
                                               "pageable_over_pinned<1", NULL};

        bad |= kvf_bench_finish(&o.expect, defaults,
                                o.json && !strcmp(o.json, "-"), &busy) > 0 &&
               o.strict;
    }
    if (o.json != NULL && n > 0) {
        FILE *f = kvf_json_file_open(o.json);

        if (f != NULL) {
            kvf_out_json_doc(&t, f, kvf_h2d_json_head, &where);
            fputc('\n', f);
            kvf_json_file_close(f);
        }
    }
    if (o.record != NULL && n == 4 &&
        kvf_h2d_record(&o, rows, n, &t, &where) != 0) {
        bad = 1;
    }
    kvf_out_free(&t);
    kvf_gpu_pool_free(&dev);
    kvf_gpu_copier_destroy(cp);
    return bad ? KVF_CLI_FAIL : KVF_CLI_OK;
}
