/*
 * `kvferry bench h2d`: seed 003 §3.1. Copies 1 GiB contiguous between
 * host memory and one GPU, host->GPU (H2D) and GPU->host (D2H), with
 * pinned (page-locked) and with pageable host memory: a few warm-up
 * copies, then timed ones (each on the copy context's stream, waited
 * for). Prints the GPU (index, model, PCI address, NUMA node, PCIe link),
 * the NUMA node the host buffers landed on and the CPU the thread runs
 * on, then GiB/s (total bytes / total time, as the seed computes it) and
 * per-copy P50/P99. The estimate is the commonly measured pinned figure
 * of the link's PCIe generation (Gen4 ~25 GB/s, Gen5 ~50 GB/s, seed 003).
 */
#include "tools/bench/gpu.h"
#include "tools/cli/opts.h"
#include "tools/bench/env.h"
#include "tools/record/record.h"

#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tools/cli/clock.h"

#define KVF_MPOL_F_NODE 1
#define KVF_MPOL_F_ADDR 2

typedef struct kvf_h2d_row {
    int pinned;
    int h2d;
    double gib_s; /* total bytes / total time */
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
        t0 = kvf_clock_ns();
        st = kvf_gpu_base_contig(cp, src, 0, dst, 0, o->size, 60000);
        if (i >= o->warmup) {
            lat[i - o->warmup] = (double)(kvf_clock_ns() - t0) / 1e6;
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
    row->p99_ms = kvf_bench_quantile(lat, o->iters, 0.99);
    free(lat);
    return 0;
}

static void kvf_h2d_json_write(FILE *f, const kvf_h2d_opts_t *o,
                               const kvf_h2d_row_t *rows, unsigned n,
                               const int nodes[2], int cpu, int cpu_node)
{
    kvf_json_t j;
    unsigned i;

    kvf_json_begin(&j, f);
    kvf_json_obj(&j, NULL);
    kvf_json_str(&j, "bench", "h2d");
    kvf_gpu_json_info(&j, "gpu", o->gpu);
    kvf_json_int(&j, "size_bytes", (long long)o->size);
    kvf_json_int(&j, "iters", o->iters);
    kvf_json_int(&j, "warmup", o->warmup);
    kvf_json_int(&j, "pinned_buffer_numa_node", nodes[0]);
    kvf_json_int(&j, "pageable_buffer_numa_node", nodes[1]);
    kvf_json_int(&j, "cpu", cpu);
    kvf_json_int(&j, "cpu_numa_node", cpu_node);
    kvf_json_arr(&j, "rows");
    for (i = 0; i < n; i++) {
        kvf_json_obj(&j, NULL);
        kvf_json_str(&j, "memory", rows[i].pinned ? "pinned" : "pageable");
        kvf_json_str(&j, "direction", rows[i].h2d ? "H2D" : "D2H");
        kvf_json_num(&j, "gib_s", rows[i].gib_s);
        kvf_json_num(&j, "gb_s", rows[i].gib_s * (1u << 30) / 1e9);
        kvf_json_num(&j, "lat_ms_p50", rows[i].p50_ms);
        kvf_json_num(&j, "lat_ms_p99", rows[i].p99_ms);
        kvf_json_end_obj(&j);
    }
    kvf_json_end_arr(&j);
    kvf_json_end_obj(&j);
    fputc('\n', f);
}

static int kvf_h2d_record(const kvf_h2d_opts_t *o, const kvf_h2d_row_t *rows,
                          unsigned n, const int nodes[2], int cpu, int cpu_node)
{
    kvf_gpu_info_t in;
    double est, worst = 1e30, pin_min = 1e30, page_max = 0;
    char name[96], text[512], *raw = NULL;
    size_t rawlen = 0;
    kvf_record_t *rec;
    unsigned i;
    FILE *mf;
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
    kvf_record_config_num(rec, "cpu", cpu);
    kvf_record_config_num(rec, "cpu NUMA node", cpu_node);
    for (i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "%s %s (copy latency ms)",
                 rows[i].pinned ? "pinned" : "pageable",
                 rows[i].h2d ? "H2D" : "D2H");
        kvf_record_figure(rec, name, rows[i].gib_s * (1u << 30) / 1e9, "GB/s",
                          rows[i].p50_ms, rows[i].p99_ms);
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
    mf = open_memstream(&raw, &rawlen);
    if (mf != NULL) {
        kvf_h2d_json_write(mf, o, rows, n, nodes, cpu, cpu_node);
        fclose(mf);
        kvf_record_raw(rec, raw);
    }
    free(raw);
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
    kvf_cli_fmt_size(o.size, sz, sizeof(sz));
    printf("# %s\n", desc);
    printf("bench h2d: %s contiguous, %u warm-up + %u timed copies per "
           "case; thread on CPU %u (NUMA node %u)\n",
           sz, o.warmup, o.iters, cpu, cpu_node);
    printf("%-9s %-4s %9s %9s %9s %9s %6s\n", "memory", "dir", "GiB/s", "GB/s",
           "p50 ms", "p99 ms", "node");
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
            printf("%-9s %-4s %9.2f %9.2f %9.3f %9.3f %6d\n",
                   pinned ? "pinned" : "pageable", h2d ? "H2D" : "D2H",
                   r->gib_s, r->gib_s * (1u << 30) / 1e9, r->p50_ms, r->p99_ms,
                   nodes[pinned ? 0 : 1]);
            fflush(stdout);
            n++;
        }
        kvf_gpu_pool_free(&host);
    }
    busy = kvf_progress_end(&prog);
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
            kvf_h2d_json_write(f, &o, rows, n, nodes, (int)cpu, (int)cpu_node);
            kvf_json_file_close(f);
        }
    }
    if (o.record != NULL && n == 4 &&
        kvf_h2d_record(&o, rows, n, nodes, (int)cpu, (int)cpu_node) != 0) {
        bad = 1;
    }
    kvf_gpu_pool_free(&dev);
    kvf_gpu_copier_destroy(cp);
    return bad ? KVF_CLI_FAIL : KVF_CLI_OK;
}
