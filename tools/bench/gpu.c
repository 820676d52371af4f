/*
 * `kvferry bench blocks --device gpu`: seed 000's workload with GPU
 * memory. Two modes:
 *
 *  --path h2d|d2h|d2d|p2p  moves random, non-overlapping blocks (default
 *      8 KiB) between two pools of one host: pinned (or, --pageable,
 *      pageable) host -> GPU, GPU -> host, GPU -> same GPU, GPU -> other
 *      GPU over NVLink. For each transfer size it prints the batched
 *      copy (kvferry's kernels), and in the same run the contiguous copy
 *      of the same bytes on the same path (one cudaMemcpyAsync, or
 *      cudaMemcpyPeerAsync) and one cudaMemcpyAsync per block.
 *  (no --path)  GPU pools on both sides of a transport (tcp by default;
 *      --transport LIST), after the same run with host pools for
 *      comparison (gpu_net.c).
 *
 * blocks.c hands `--device gpu` over to kvf_cmd_bench_blocks_gpu.
 */
#include "tools/bench/gpu.h"
#include "tools/cli/opts.h"
#include "tools/bench/env.h"
#include "tools/bench/out.h"
#include "tools/record/record.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/time.h"

typedef struct kvf_gpu_row {
    uint64_t size;
    uint64_t wrs;
    double lat_ms; /* batched copy, median */
    double lat_p99_ms;
    double gib_s;
    double contig_gib_s;
    double each_gib_s;
    double batchapi_gib_s; /* one cudaMemcpyBatchAsync */
    long mismatches;       /* -1 not verified */
} kvf_gpu_row_t;

/* --host-alloc: pinned pools from cudaHostAlloc or huge pages. */
static int kvf_gpu_set_host_alloc(const kvf_opt_t *opt, const char *v)
{
    (void)opt;
    if (strcmp(v, "thp") != 0 && strcmp(v, "cuda") != 0) {
        fprintf(stderr, "kvferry bench blocks: --host-alloc: cuda or thp\n");
        return -1;
    }
    kvf_gpu_pool_use_thp(strcmp(v, "thp") == 0);
    return 0;
}

static int kvf_gpu_parse(int argc, char **argv, kvf_gpu_opts_t *o)
{
    int rc;
    kvf_opt_sizes_t sizes = {o->sizes, &o->nsizes, KVF_GPU_SIZES_MAX};
    int device = 0, path = -1, kernel = KVF_GPU_KERNEL_AUTO;
    const kvf_opt_t opts[] = {
        {"device", 0, KVF_OPT_CHOICE, &device, NULL,
         "GPU pools (kvferry bench blocks --help for host pools)", NULL, "gpu",
         .flags = KVF_OPT_REQUIRED},
        {"path", 0, KVF_OPT_CHOICE, &path, NULL, "local path within this host",
         "GPU pools over transports", "h2d|d2h|d2d|p2p"},
        {"gpu", 0, KVF_OPT_INT, &o->gpu, "N", "GPU of the initiator / source",
         "0", .min = 0, .max = 63},
        {"peer-gpu", 0, KVF_OPT_INT, &o->peer_gpu, "N",
         "p2p destination, or the target's GPU", "the next GPU, else the same",
         .min = 0, .max = 63},
        {"on-dst", 0, KVF_OPT_FLAG, &o->on_dst, NULL,
         "p2p: run the copy kernels on the destination"},
        {"pageable", 0, KVF_OPT_FLAG, &o->pageable, NULL,
         "h2d/d2h: pageable host pool (staged)"},
        {"host-alloc", 0, KVF_OPT_FN, NULL, "cuda|thp",
         "pinned pools from cudaHostAlloc, or huge pages +\n"
         "cudaHostRegister",
         "cuda", .fn = kvf_gpu_set_host_alloc},
        {"sequential", 0, KVF_OPT_FLAG, &o->sequential, NULL,
         "blocks in pool order, not random (diagnostic)"},
        {"blocks-on", 0, KVF_OPT_CHOICE, &o->blocks_on_gpu, NULL,
         "local paths: the block list in pinned host memory, or in GPU\n"
         "memory (uploaded before the timed copy, as a block table kept\n"
         "on the GPU)",
         "host", "host|gpu"},
        {"pool", 0, KVF_OPT_SIZE, &o->pool, "SIZE", "pool on each side", "8G"},
        {"block", 0, KVF_OPT_SIZE, &o->block, "SIZE", "block size", "8K"},
        {"sizes", 0, KVF_OPT_SIZES, &sizes, "LIST", "transfer sizes",
         "16M,64M,256M,1G"},
        {"iters", 0, KVF_OPT_UINT, &o->iters, "N",
         "iterations per size, median kept", "5", .min = 1, .max = 1000},
        {"each-iters", 0, KVF_OPT_UINT, &o->each_iters, "N",
         "iterations of the per-block baseline", "3", .min = 0, .max = 100},
        {"kernel", 0, KVF_OPT_CHOICE, &kernel, NULL, "copy kernel",
         "config `cuda_kernel`", "auto|warp|bulk|hybrid"},
        {"op", 0, KVF_OPT_CHOICE, &o->ops, NULL, "transports mode", "write",
         "write|read|both", .min = 1},
        {"conns", 0, KVF_OPT_UINT, &o->conns, "N", "connections", "4", .min = 1,
         .max = 64},
        {"transport", 0, KVF_OPT_STR, &o->transports, "LIST",
         "transports to run over (cuda: same-host GPU pools through\n"
         "CUDA IPC, against the contiguous copy of the same path)",
         "cuda,tcp"},
        {"no-host", 0, KVF_OPT_CLEAR, &o->host_baseline, NULL,
         "transports: skip the host-pool baseline"},
        {"timeout", 0, KVF_OPT_MS, &o->timeout_ms, "MS", "per-wait bound",
         "20000"},
        {"verify", 0, KVF_OPT_FLAG, &o->verify, NULL,
         "compare checksums of every moved block"},
        {"seed", 0, KVF_OPT_U64, &o->seed, "N", "seed of the pools' bytes", "1",
         .min = 0, .max = (double)(1ull << 62)},
        {"json", 0, KVF_OPT_STR, &o->json, "FILE",
         "write results as JSON ('-' = stdout)"},
        {"record", 0, KVF_OPT_STR, &o->record, "DIR",
         "write a record (Markdown + JSON) into DIR"},
        {"hypothesis", 0, KVF_OPT_STR, &o->hypothesis, "TEXT",
         "the record's hypothesis"},
        {"expect", 0, KVF_OPT_FN, &o->expect, "RULE",
         "a claim to check (repeatable); figures: link_pct (share of\n"
         "the contiguous copy, %; local paths and cuda), per_block_x,\n"
         "host_pct (GPU pools over host pools, %), wrong_blocks",
         "link_pct>=90, per_block_x>=10 (not p2p), host_pct>=80, "
         "wrong_blocks==0",
         .fn = kvf_bench_expect_opt},
        {"strict", 0, KVF_OPT_FLAG, &o->strict, NULL,
         "exit 1 when a claim is missed (default: exit 0 once measured)"},
        {"serve", 0, KVF_OPT_STR, &o->serve_mem, "host|gpu",
         "(internal) serve a GPU or host pool as the spawned target",
         .flags = KVF_OPT_HIDDEN, .seen = &o->serve},
        {0},
    };
    const kvf_cmd_spec_t spec = {
        "kvferry bench blocks --device gpu [options]",
        "Random blocks of GPU pools: over transports to a target whose\n"
        "pool is GPU memory, or a local path (--path) within this host.",
        opts, .progress = 1};

    memset(o, 0, sizeof(*o));
    o->peer_gpu = -1;
    o->pool = 8ull << 30;
    o->block = 8192;
    o->sizes[0] = 16ull << 20;
    o->sizes[1] = 64ull << 20;
    o->sizes[2] = 256ull << 20;
    o->sizes[3] = 1ull << 30;
    o->nsizes = 4;
    o->iters = 5;
    o->each_iters = 3;
    o->ops = 1;
    o->conns = 4;
    o->timeout_ms = 20000;
    o->transports = "cuda,tcp";
    o->host_baseline = 1;
    o->kernel = KVF_GPU_KERNEL_AUTO;
    o->seed = 1;
    rc = kvf_opts_parse(&spec, argc, argv, NULL);
    if (rc >= 0) {
        return rc == KVF_CLI_OK ? -1 : rc;
    }
    static const char *const paths[] = {"h2d", "d2h", "d2d", "p2p"};

    o->path = path >= 0 ? paths[path] : NULL;
    o->kernel = (kvf_gpu_kernel_t)kernel;
    (void)device;
    if (o->block == 0 || o->block > o->pool || o->nsizes == 0) {
        fprintf(stderr, "kvferry: block must be in 1..pool, sizes given\n");
        return KVF_CLI_USAGE;
    }
    return 0;
}

/* ---- local paths ------------------------------------------------------ */

typedef struct kvf_gpu_local {
    const kvf_gpu_opts_t *o;
    kvf_gpu_pool_t src, dst;
    int run_gpu;
    kvf_gpu_copier_t *cp;
    uint32_t *sperm, *dperm;
    kvf_gpu_block_t *blks;
    kvf_gpu_block_t *dblks; /* --blocks-on gpu: the list in GPU memory */
    kvf_rng_t rng;
} kvf_gpu_local_t;

static double kvf_gpu_ms_since(uint64_t t0)
{
    return (double)(kvf_time_ns() - t0) / 1e6;
}

/* Fresh random blocks for one iteration of n blocks. */
static void kvf_gpu_fill_blks(kvf_gpu_local_t *l, uint64_t n)
{
    uint64_t b = l->o->block, i;

    if (!l->o->sequential) {
        kvf_gpu_pick(l->sperm, l->src.mem.len / b, n, &l->rng);
        kvf_gpu_pick(l->dperm, l->dst.mem.len / b, n, &l->rng);
    }
    for (i = 0; i < n; i++) {
        l->blks[i].src_off = (uint64_t)l->sperm[i] * b;
        l->blks[i].dst_off = (uint64_t)l->dperm[i] * b;
        l->blks[i].len = b;
    }
}

/* Compares checksums of the blocks on both sides; -2 on error. */
static long kvf_gpu_verify(kvf_gpu_local_t *l, uint64_t n)
{
    uint64_t *so = malloc(n * 8), *dof = malloc(n * 8), *len = malloc(n * 8);
    uint64_t *s1 = malloc(n * 8), *s2 = malloc(n * 8), i;
    long bad = -2;

    if (so && dof && len && s1 && s2) {
        for (i = 0; i < n; i++) {
            so[i] = l->blks[i].src_off;
            dof[i] = l->blks[i].dst_off;
            len[i] = l->blks[i].len;
        }
        if (kvf_gpu_checksum_blocks(l->cp, &l->src.mem, so, len, n, s1,
                                    (int)l->o->timeout_ms) == KVF_OK &&
            kvf_gpu_checksum_blocks(l->cp, &l->dst.mem, dof, len, n, s2,
                                    (int)l->o->timeout_ms) == KVF_OK) {
            bad = 0;
            for (i = 0; i < n; i++) {
                bad += (s1[i] != s2[i]);
            }
        }
    }
    free(so);
    free(dof);
    free(len);
    free(s1);
    free(s2);
    return bad;
}

static int kvf_gpu_local_size(kvf_gpu_local_t *l, uint64_t size,
                              kvf_gpu_row_t *row)
{
    const kvf_gpu_opts_t *o = l->o;
    uint64_t n = size / o->block, t0;
    unsigned it, total = o->iters + 1, k = 0;
    double *lat = calloc(total + o->each_iters + 1, sizeof(double));
    kvf_status_t st = KVF_OK;

    if (lat == NULL || n == 0 || n > l->src.mem.len / o->block ||
        n > l->dst.mem.len / o->block) {
        fprintf(stderr, "kvferry: size %lu does not fit the pools\n",
                (unsigned long)size);
        free(lat);
        return -1;
    }
    memset(row, 0, sizeof(*row));
    row->size = size;
    row->wrs = n;
    /* batched copies: the first iteration warms up and is not kept */
    for (it = 0; it < total && st == KVF_OK; it++) {
        kvf_gpu_fill_blks(l, n);
        if (l->dblks != NULL) {
            /* a block table kept on the GPU: not part of the copy */
            st = kvf_gpu_copy(l->dblks, l->blks, n * sizeof(*l->blks));
            if (st != KVF_OK) {
                break;
            }
        }
        t0 = kvf_time_ns();
        st = l->dblks != NULL
                 ? kvf_gpu_copy_blocks(l->cp, &l->src.mem, &l->dst.mem,
                                       l->dblks, n, KVF_GPU_BLOCKS_ON_GPU,
                                       (int)o->timeout_ms)
                 : kvf_gpu_copy_blocks(l->cp, &l->src.mem, &l->dst.mem, l->blks,
                                       n, 0, (int)o->timeout_ms);
        if (it > 0) {
            lat[k++] = kvf_gpu_ms_since(t0);
        }
    }
    /* the resident copy kernel (cuda_resident) leaves the GPU before the
     * baselines are timed: they run on an idle GPU */
    kvf_gpu_copier_park(l->cp);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry: batched copy of %lu blocks: %s\n",
                (unsigned long)n, kvf_status_str(st));
        free(lat);
        return -1;
    }
    row->mismatches = o->verify ? kvf_gpu_verify(l, n) : -1;
    row->lat_p99_ms = kvf_bench_quantile(lat, k, 0.99);
    row->lat_ms = kvf_bench_quantile(lat, k, 0.5);
    row->gib_s = (double)(n * o->block) / (row->lat_ms / 1e3) / (1u << 30);
    /* contiguous copy of the same bytes on the same path */
    for (it = 0, k = 0; it < total && st == KVF_OK; it++) {
        t0 = kvf_time_ns();
        st = kvf_gpu_base_contig(l->cp, &l->src.mem, 0, &l->dst.mem, 0,
                                 n * o->block, (int)o->timeout_ms);
        if (it > 0) {
            lat[k++] = kvf_gpu_ms_since(t0);
        }
    }
    if (st == KVF_OK) {
        /* the ceiling is the best sample (docs/performance.md) */
        row->contig_gib_s = (double)(n * o->block) /
                            (kvf_bench_quantile(lat, k, 0.0) / 1e3) /
                            (1u << 30);
    }
    /* one cudaMemcpyAsync per block */
    for (it = 0, k = 0; it < o->each_iters && st == KVF_OK; it++) {
        kvf_gpu_fill_blks(l, n);
        t0 = kvf_time_ns();
        st = kvf_gpu_base_each(l->cp, &l->src.mem, &l->dst.mem, l->blks, n,
                               (int)o->timeout_ms * 4);
        lat[k++] = kvf_gpu_ms_since(t0);
    }
    if (st == KVF_OK && k > 0) {
        row->each_gib_s = (double)(n * o->block) /
                          (kvf_bench_quantile(lat, k, 0.5) / 1e3) / (1u << 30);
    }
    /* one cudaMemcpyBatchAsync of all blocks (pinned/device sides) */
    for (it = 0, k = 0; it < o->each_iters && st == KVF_OK && !o->pageable;
         it++) {
        kvf_gpu_fill_blks(l, n);
        t0 = kvf_time_ns();
        st = kvf_gpu_base_batchapi(l->cp, &l->src.mem, &l->dst.mem, l->blks, n,
                                   (int)o->timeout_ms * 4);
        lat[k++] = kvf_gpu_ms_since(t0);
    }
    if (st == KVF_OK && k > 0) {
        row->batchapi_gib_s = (double)(n * o->block) /
                              (kvf_bench_quantile(lat, k, 0.5) / 1e3) /
                              (1u << 30);
    }
    free(lat);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry: baseline copies: %s\n", kvf_status_str(st));
        return -1;
    }
    return 0;
}

/* The columns of a local-path row, declared once for the text line, the
 * JSON rows and the record (figure names fixed at run time: they carry
 * the path). */
#define KVF_GPU_NCOLS 14

typedef struct kvf_gpu_out {
    kvf_out_col_t cols[KVF_GPU_NCOLS];
    kvf_out_table_t t;
    const kvf_gpu_local_t *l;
    char bstr[32];
} kvf_gpu_out_t;

/* Seed 000's row format with the contiguous copy as the reference. */
static void kvf_gpu_row_fmt(const kvf_out_table_t *t, unsigned i, FILE *f,
                            void *ctx)
{
    const kvf_gpu_out_t *go = ctx;
    double gib = kvf_out_get(t, i, "gib_s");
    double each = kvf_out_get(t, i, "per_block_gib_s");
    double wrong = kvf_out_get(t, i, "mismatches");
    char sstr[32];

    kvf_fmt_size((uint64_t)kvf_out_get(t, i, "size_bytes"), sstr, sizeof(sstr));
    fprintf(f,
            "size=%8s | WRs=%7lu (block=%s) | lat=%8.3f ms | "
            "BW=%7.2f GB/s (%7.2f Gbps) | %3.0f%% of contiguous",
            sstr, (unsigned long)kvf_out_get(t, i, "wrs"), go->bstr,
            kvf_out_get(t, i, "lat_ms_p50"), gib, gib * (1u << 30) * 8 / 1e9,
            100.0 * kvf_out_get(t, i, "share_of_contiguous"));
    if (each > 0) {
        fprintf(f, " | %5.1fx per-block", gib / each);
    }
    if (wrong >= 0) {
        fprintf(f, " | verify %s", wrong ? "FAILED" : "ok");
    } else if (wrong == -2) {
        fprintf(f, " | verify FAILED");
    }
}

static void kvf_gpu_out_init(kvf_gpu_out_t *go, const kvf_gpu_local_t *l)
{
    const kvf_gpu_opts_t *o = l->o;
    const kvf_out_col_t cols[KVF_GPU_NCOLS] = {
        {"size_bytes", "size", "bytes", "%lld", .kind = KVF_OUT_INT},
        {"wrs", "WRs", NULL, "%lld", .kind = KVF_OUT_INT},
        {"lat_ms_p50", "lat", "ms", "%8.3f"},
        {"lat_ms_p99", "lat p99", "ms", "%8.3f"},
        {"gib_s", "BW", "GiB/s", "%7.2f", .fig = "batched (batch latency ms)",
         .p50 = "lat_ms_p50", .p99 = "lat_ms_p99",
         .series = "batched GiB/s over transfer size"},
        {"contiguous_gib_s", "contiguous", "GiB/s", "%7.2f",
         .fig = "contiguous", .series = "contiguous GiB/s over transfer size"},
        /* the per-block figures join the record where they were measured
         * (the *_fig columns, set only then) */
        {"per_block_gib_s", "per-block", "GiB/s", "%7.2f",
         .series = "per-block GiB/s over transfer size"},
        {"batch_api_gib_s", "batch API", "GiB/s", "%7.2f"},
        {"share_of_contiguous", "share", "ratio", "%4.2f",
         .fig = "share of contiguous"},
        {"times_per_block", "per-block x", "ratio", "%5.1f"},
        {"mismatches", "wrong", "blocks", "%lld", .kind = KVF_OUT_INT,
         .fig = o->verify ? "blocks failing verify" : NULL},
        {"per_block_fig", NULL, "GiB/s", NULL, .nojson = 1,
         .fig = "one cudaMemcpyAsync per block"},
        {"times_fig", NULL, "ratio", NULL, .nojson = 1,
         .fig = "times per-block"},
        {"batch_api_fig", NULL, "GiB/s", NULL, .nojson = 1,
         .fig = "one cudaMemcpyBatchAsync"},
    };

    memset(go, 0, sizeof(*go));
    go->l = l;
    memcpy(go->cols, cols, sizeof(cols));
    kvf_fmt_size(o->block, go->bstr, sizeof(go->bstr));
    kvf_out_init(&go->t, go->cols, KVF_GPU_NCOLS);
    go->t.x_key = "size_bytes";
    go->t.x_label = "transfer bytes";
    go->t.row_fmt = kvf_gpu_row_fmt;
    go->t.row_ctx = go;
}

static void kvf_gpu_out_row(kvf_gpu_out_t *go, const kvf_gpu_row_t *r)
{
    kvf_out_table_t *t = &go->t;
    char label[64], sz[32];

    kvf_fmt_size(r->size, sz, sizeof(sz));
    snprintf(label, sizeof(label), "%s %s", go->l->o->path, sz);
    kvf_out_row(t, label, NULL);
    kvf_out_num(t, "size_bytes", (double)r->size);
    kvf_out_num(t, "wrs", (double)r->wrs);
    kvf_out_num(t, "lat_ms_p50", r->lat_ms);
    kvf_out_num(t, "lat_ms_p99", r->lat_p99_ms);
    kvf_out_num(t, "gib_s", r->gib_s);
    kvf_out_num(t, "contiguous_gib_s", r->contig_gib_s);
    kvf_out_num(t, "per_block_gib_s", r->each_gib_s);
    kvf_out_num(t, "batch_api_gib_s", r->batchapi_gib_s);
    kvf_out_num(t, "share_of_contiguous",
                r->contig_gib_s > 0 ? r->gib_s / r->contig_gib_s : 0);
    kvf_out_num(t, "times_per_block",
                r->each_gib_s > 0 ? r->gib_s / r->each_gib_s : 0);
    kvf_out_num(t, "mismatches", (double)r->mismatches);
    if (r->each_gib_s > 0) {
        kvf_out_num(t, "per_block_fig", r->each_gib_s);
        kvf_out_num(t, "times_fig", r->gib_s / r->each_gib_s);
        kvf_out_num(t, "batch_api_fig", r->batchapi_gib_s);
    }
}

/* The run's configuration: the members before "rows". */
static void kvf_gpu_local_json_head(kvf_json_t *j, void *ctx)
{
    const kvf_gpu_local_t *l = ((const kvf_gpu_out_t *)ctx)->l;
    const kvf_gpu_opts_t *o = l->o;

    kvf_json_str(j, "bench", "blocks");
    kvf_json_str(j, "connector", "kvferry");
    kvf_json_str(j, "device", "gpu");
    kvf_json_str(j, "path", o->path);
    kvf_json_str(j, "host_memory", o->pageable ? "pageable" : "pinned");
    kvf_json_str(j, "kernel", kvf_gpu_kernel_name(o->kernel));
    kvf_json_str(j, "resident", kvf_gpu_resident_name());
    kvf_json_int(j, "kernel_gpu", l->run_gpu);
    kvf_json_str(j, "block_list", o->blocks_on_gpu ? "gpu" : "pinned host");
    kvf_gpu_json_info(j, "gpu", o->gpu);
    if (strcmp(o->path, "p2p") == 0) {
        kvf_gpu_json_info(j, "peer_gpu", o->peer_gpu);
    }
    kvf_json_int(j, "block_bytes", (long long)o->block);
    kvf_json_int(j, "pool_bytes", (long long)o->pool);
    kvf_json_int(j, "iters", o->iters);
    kvf_json_int(j, "each_iters", o->each_iters);
}

/* Seed 003 §5 record: each size's figures, the contiguous copy of the
 * same run as the estimate, the claim as the conclusion. */
static int kvf_gpu_local_record(const kvf_gpu_out_t *go,
                                const kvf_gpu_row_t *rows, unsigned nrows,
                                int bad)
{
    const kvf_gpu_local_t *l = go->l;
    const kvf_gpu_opts_t *o = l->o;
    int p2p = strcmp(o->path, "p2p") == 0, share_ok = 1, each_ok = 1;
    const kvf_gpu_row_t *worst = NULL;
    char name[128], text[768], sz[32], hyp[256];
    kvf_record_t *rec;
    unsigned i;

    snprintf(hyp, sizeof(hyp),
             "random %s blocks %s move at >= 90 %% of the contiguous copy "
             "of the same path in the same run%s, 16 MB to 1 GB",
             "8 KiB", o->path,
             p2p ? "" : ", and >= 10x one cudaMemcpyAsync per block");
    snprintf(name, sizeof(name), "bench blocks gpu %s%s%s", o->path,
             o->pageable ? " pageable" : "",
             o->blocks_on_gpu ? " gpu-list" : "");
    rec = kvf_record_new("bench", name, hyp);
    if (rec == NULL) {
        return -1;
    }
    kvf_record_hypothesis(rec, o->hypothesis);
    kvf_record_config(rec, "path", o->path);
    kvf_record_config(rec, "host memory", o->pageable ? "pageable" : "pinned");
    kvf_record_config(rec, "block list",
                      o->blocks_on_gpu ? "GPU memory" : "pinned host memory");
    kvf_record_config(rec, "kernel", kvf_gpu_kernel_name(o->kernel));
    kvf_record_config(rec, "resident kernel (cuda_resident)",
                      kvf_gpu_resident_name());
    kvf_gpu_describe(o->gpu, text, sizeof(text));
    kvf_record_config(rec, "gpu", text);
    if (p2p) {
        kvf_gpu_describe(o->peer_gpu, text, sizeof(text));
        kvf_record_config(rec, "peer gpu", text);
        kvf_record_config_num(rec, "kernels on gpu", l->run_gpu);
    }
    kvf_record_config_num(rec, "block_bytes", (double)o->block);
    kvf_record_config_num(rec, "pool_bytes", (double)o->pool);
    kvf_record_config_num(rec, "iters", o->iters);
    kvf_record_config_num(rec, "per-block iters", o->each_iters);
    kvf_record_config(rec, "verify", o->verify ? "yes" : "no");
    for (i = 0; i < nrows; i++) {
        const kvf_gpu_row_t *r = &rows[i];
        double share = r->contig_gib_s > 0 ? r->gib_s / r->contig_gib_s : 0;
        double times = r->each_gib_s > 0 ? r->gib_s / r->each_gib_s : 0;

        if (r->each_gib_s > 0) {
            each_ok &= p2p || times >= 10.0;
        } else {
            each_ok &= p2p;
        }
        share_ok &= share >= 0.9;
        if (worst == NULL || share < worst->gib_s / (worst->contig_gib_s > 0
                                                         ? worst->contig_gib_s
                                                         : 1e-9)) {
            worst = r;
        }
    }
    if (worst != NULL) {
        kvf_fmt_size(worst->size, sz, sizeof(sz));
        snprintf(text, sizeof(text),
                 "contiguous copy of the same bytes on the same path in "
                 "this run (%s; %s), at the size with the lowest share",
                 p2p ? "cudaMemcpyPeerAsync" : "cudaMemcpyAsync", sz);
        kvf_record_estimate(rec, worst->contig_gib_s, "GiB/s", text);
        snprintf(text, sizeof(text),
                 "worst size reaches %.1f %% of the contiguous copy: each "
                 "block costs a descriptor and partial-line traffic at its "
                 "ends, and launches are split so the host prepares the "
                 "next while the GPU copies",
                 100.0 * worst->gib_s /
                     (worst->contig_gib_s > 0 ? worst->contig_gib_s : 1e-9));
        kvf_record_gap(rec,
                       worst->gib_s / (worst->contig_gib_s > 0
                                           ? worst->contig_gib_s
                                           : 1e-9),
                       text);
    }
    snprintf(text, sizeof(text), "%s%s%s",
             share_ok ? "every size >= 90 % of contiguous"
                      : "some size below 90 % of contiguous",
             p2p       ? ""
             : each_ok ? "; every size >= 10x per-block"
                       : "; some size below 10x per-block",
             bad ? "; the run had errors or verify failures" : "");
    kvf_record_conclude(
        rec, (share_ok && each_ok && !bad) ? "holds" : "does not hold", text);
    if (!o->verify) {
        kvf_record_not_verified(rec, "bytes not verified (run with "
                                     "--verify)");
    }
    kvf_record_not_verified(rec, "one host, one process; no transport");
    {
        char *raw = NULL;
        size_t rawlen = 0;
        FILE *mf;

        kvf_out_record_figures(&go->t, rec);
        mf = open_memstream(&raw, &rawlen);
        if (mf != NULL) {
            kvf_out_json_doc(&go->t, mf, kvf_gpu_local_json_head, (void *)go);
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

static int kvf_gpu_local_setup(kvf_gpu_local_t *l, kvf_gpu_opts_t *o)
{
    int ngpu = kvf_gpu_count(), sg = o->gpu, dg = o->gpu;
    kvf_mem_type_t host = o->pageable ? KVF_MEM_HOST : KVF_MEM_PINNED;
    kvf_mem_type_t st = KVF_MEM_CUDA, dt = KVF_MEM_CUDA;
    kvf_status_t status;
    uint64_t nslots, i;

    if (o->gpu >= ngpu) {
        fprintf(stderr, "kvferry: GPU %d of %d\n", o->gpu, ngpu);
        return KVF_CLI_USAGE;
    }
    if (o->blocks_on_gpu && o->pageable) {
        fprintf(stderr, "kvferry: --blocks-on gpu needs pinned host pools\n");
        return KVF_CLI_USAGE;
    }
    if (strcmp(o->path, "h2d") == 0) {
        st = host;
    } else if (strcmp(o->path, "d2h") == 0) {
        dt = host;
    } else if (strcmp(o->path, "p2p") == 0) {
        if (o->peer_gpu < 0) {
            o->peer_gpu = (o->gpu + 1) % ngpu;
        }
        if (ngpu < 2 || o->peer_gpu == o->gpu || o->peer_gpu >= ngpu) {
            printf("kvferry: --path p2p needs two GPUs (this host has %d): "
                   "skipped\n",
                   ngpu);
            return KVF_CLI_SKIP;
        }
        dg = o->peer_gpu;
    }
    l->run_gpu = (strcmp(o->path, "p2p") == 0 && o->on_dst) ? dg : sg;
    if (kvf_gpu_pool_alloc(&l->src, st, sg, o->pool, o->seed) != 0 ||
        kvf_gpu_pool_alloc(&l->dst, dt, dg, o->pool, o->seed + 1) != 0) {
        return KVF_CLI_FAIL;
    }
    status = kvf_gpu_copier_create(l->run_gpu, &l->cp);
    if (status != KVF_OK) {
        fprintf(stderr, "kvferry: copy context: %s\n", kvf_status_str(status));
        return KVF_CLI_FAIL;
    }
    kvf_gpu_copier_set_kernel(l->cp, o->kernel);
    nslots = o->pool / o->block;
    l->sperm = malloc(nslots * sizeof(uint32_t));
    l->dperm = malloc(nslots * sizeof(uint32_t));
    /* the block list in pinned memory: the kernels read it in place */
    if (kvf_gpu_alloc(KVF_MEM_PINNED, 0, nslots * sizeof(kvf_gpu_block_t),
                      (void **)&l->blks) != KVF_OK) {
        l->blks = NULL;
    }
    if (o->blocks_on_gpu && kvf_gpu_alloc(KVF_MEM_CUDA, l->run_gpu,
                                          nslots * sizeof(kvf_gpu_block_t),
                                          (void **)&l->dblks) != KVF_OK) {
        fprintf(stderr, "kvferry: no GPU memory for the block list\n");
        return KVF_CLI_FAIL;
    }
    if (l->sperm == NULL || l->dperm == NULL || l->blks == NULL ||
        nslots > UINT32_MAX) {
        fprintf(stderr, "kvferry: too many blocks in the pool\n");
        return KVF_CLI_FAIL;
    }
    for (i = 0; i < nslots; i++) {
        l->sperm[i] = l->dperm[i] = (uint32_t)i;
    }
    kvf_rng_seed(&l->rng, o->seed * 7919);
    return 0;
}

static void kvf_gpu_local_free(kvf_gpu_local_t *l)
{
    kvf_gpu_copier_destroy(l->cp);
    kvf_gpu_pool_free(&l->src);
    kvf_gpu_pool_free(&l->dst);
    free(l->sperm);
    free(l->dperm);
    kvf_gpu_free(KVF_MEM_PINNED, l->blks);
    if (l->dblks != NULL) {
        kvf_gpu_free(KVF_MEM_CUDA, l->dblks);
    }
}

/* A local-path row's figures for the --expect rules: the share of the
 * contiguous copy, the gain over one copy per block (not claimed for
 * p2p), wrong blocks. */
static void kvf_gpu_local_expect(const kvf_gpu_opts_t *o,
                                 const kvf_gpu_row_t *r)
{
    char where[64], sz[32];

    kvf_fmt_size(r->size, sz, sizeof(sz));
    snprintf(where, sizeof(where), "%s %s", o->path, sz);
    if (r->contig_gib_s > 0) {
        kvf_expect_figure(o->expect, "link_pct",
                          100.0 * r->gib_s / r->contig_gib_s, where);
    }
    if (r->each_gib_s > 0 && strcmp(o->path, "p2p") != 0) {
        kvf_expect_figure(o->expect, "per_block_x", r->gib_s / r->each_gib_s,
                          where);
    }
    if (r->mismatches >= 0) {
        kvf_expect_figure(o->expect, "wrong_blocks", (double)r->mismatches,
                          where);
    }
}

static void kvf_gpu_local_header(const kvf_gpu_opts_t *o,
                                 const kvf_gpu_local_t *l)
{
    char bstr[32], pstr[32], desc[320];

    kvf_fmt_size(o->block, bstr, sizeof(bstr));
    kvf_fmt_size(o->pool, pstr, sizeof(pstr));
    kvf_gpu_describe(o->gpu, desc, sizeof(desc));
    printf("# %s\n", desc);
    if (strcmp(o->path, "p2p") == 0) {
        kvf_gpu_describe(o->peer_gpu, desc, sizeof(desc));
        printf("# peer %s, kernels on GPU %d\n", desc, l->run_gpu);
    }
    printf("connector=kvferry role=client device=gpu path=%s block=%s "
           "pool=%s host=%s kernel=%s resident=%s%s%s\n",
           o->path, bstr, pstr, o->pageable ? "pageable" : "pinned",
           kvf_gpu_kernel_name(o->kernel), kvf_gpu_resident_name(),
           o->sequential ? " order=sequential" : "",
           o->blocks_on_gpu ? " block_list=gpu" : "");
    printf("------------------------------------------------------------"
           "------------\n");
    fflush(stdout);
}

static int kvf_gpu_bench_local(kvf_gpu_opts_t *o)
{
    static const char *const defaults[] = {"link_pct>=90", "per_block_x>=10",
                                           "wrong_blocks==0", NULL};
    kvf_gpu_row_t rows[KVF_GPU_SIZES_MAX];
    char sstr[32], pstr[32];
    kvf_gpu_local_t l;
    kvf_gpu_out_t go;
    kvf_progress_t prog;
    kvf_busy_t busy;
    unsigned k, nrows = 0;
    int rc, bad = 0, json_out = o->json && !strcmp(o->json, "-");

    memset(&l, 0, sizeof(l));
    l.o = o;
    kvf_fmt_size(o->pool, pstr, sizeof(pstr));
    kvf_progress_begin(&prog, "bench blocks --device gpu", o->nsizes,
                       o->nsizes);
    kvf_progress_note(&prog, "preparing the %s pools of path %s", pstr,
                      o->path);
    rc = kvf_gpu_local_setup(&l, o);
    if (rc != 0) {
        kvf_progress_end(&prog);
        kvf_gpu_local_free(&l);
        kvf_expect_free(o->expect);
        return rc;
    }
    kvf_progress_clear(&prog);
    kvf_gpu_local_header(o, &l);
    kvf_gpu_out_init(&go, &l);
    for (k = 0; k < o->nsizes; k++) {
        kvf_gpu_row_t *r = &rows[nrows];

        kvf_fmt_size(o->sizes[k], sstr, sizeof(sstr));
        kvf_progress_step(&prog, "%s %s of %s blocks", o->path, sstr, go.bstr);
        rc = kvf_gpu_local_size(&l, o->sizes[k], r);
        kvf_progress_clear(&prog);
        if (rc != 0) {
            bad = 1;
            break;
        }
        kvf_progress_done(&prog, 1);
        kvf_gpu_out_row(&go, r);
        kvf_out_text_row(&go.t, go.t.nrows - 1, stdout);
        bad |= (r->mismatches != 0 && r->mismatches != -1);
        kvf_gpu_local_expect(o, r);
        nrows++;
    }
    busy = kvf_progress_end(&prog);
    printf("------------------------------------------------------------"
           "------------\n");
    for (k = 0; k < nrows; k++) {
        kvf_fmt_size(rows[k].size, sstr, sizeof(sstr));
        printf("size=%8s | contiguous %s: BW=%7.2f GB/s | one "
               "cudaMemcpyAsync per block: BW=%7.2f GB/s | "
               "cudaMemcpyBatchAsync: BW=%7.2f GB/s\n",
               sstr,
               strcmp(o->path, "p2p") == 0 ? "cudaMemcpyPeerAsync"
                                           : "cudaMemcpyAsync",
               rows[k].contig_gib_s, rows[k].each_gib_s,
               rows[k].batchapi_gib_s);
    }
    kvf_gpu_print_resident(l.cp);
    if (kvf_bench_finish(&o->expect, defaults, json_out, &busy) > 0 &&
        o->strict) {
        bad = 1;
    }
    if (o->json != NULL) {
        FILE *f = kvf_json_file_open(o->json);

        if (f != NULL) {
            kvf_out_json_doc(&go.t, f, kvf_gpu_local_json_head, &go);
            fputc('\n', f);
            kvf_json_file_close(f);
        }
    }
    if (o->record != NULL && nrows > 0 &&
        kvf_gpu_local_record(&go, rows, nrows, bad) != 0) {
        bad = 1;
    }
    kvf_out_free(&go.t);
    kvf_gpu_local_free(&l);
    return bad ? KVF_CLI_FAIL : KVF_CLI_OK;
}

int kvf_cmd_bench_blocks_gpu(int argc, char **argv)
{
    kvf_gpu_opts_t o;
    int rc;

    rc = kvf_gpu_parse(argc, argv, &o);
    if (rc != 0) {
        kvf_expect_free(o.expect);
        return rc < 0 ? KVF_CLI_OK : rc;
    }
    if (o.serve) {
        /* the spawned target measures nothing */
        kvf_expect_free(o.expect);
        o.expect = NULL;
    } else if (kvf_bench_expect(&o.expect) == NULL) {
        return KVF_CLI_FAIL;
    }
    if (!kvf_gpu_built()) {
        printf("kvferry: built without CUDA: --device gpu skipped\n");
        kvf_expect_free(o.expect);
        return KVF_CLI_SKIP;
    }
    if (kvf_gpu_count() == 0) {
        printf("kvferry: no GPU on this machine: --device gpu skipped\n");
        kvf_expect_free(o.expect);
        return KVF_CLI_SKIP;
    }
    if (o.serve) {
        return kvf_gpu_serve(&o);
    }
    if (o.path != NULL) {
        return kvf_gpu_bench_local(&o);
    }
    return kvf_gpu_bench_net(&o);
}
