/*
 * `kvferry bench load` (seed 003 §3.4): the load path of one object,
 * broken down per object size into its stages: query (the master lookup
 * that grants the read lease), remote read (the engine moving the bytes
 * from the node), checksum verification, and H2D (the copy of the object
 * from its pinned host buffer into GPU memory, cudaMemcpy, the first copy
 * of each size read back and compared; not measured on a machine without
 * a GPU, or with --gpu -1). Each
 * stage's P50/P99 and share of the total are printed, and the remote read
 * is compared with an estimate taken in the same run: the time of the
 * same bytes at the raw link bandwidth to a node (kvf_peer_link_test,
 * plain streams). Without --master a master and --nodes nodes are spawned.
 */
#include "tools/bench/store.h"
#include "tools/cli/opts.h"
#include "tools/bench/env.h"
#include "tools/bench/out.h"
#include "tools/record/record.h"

#include <kvferry/config.h>
#include <kvferry/gpu.h>
#include <kvferry/store.h>

#include "core/time.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct kvf_bl_row {
    uint64_t size;
    long gets, errors;
    double q50, q99, r50, r99, v50, v99, h50, h99, t50, t99; /* us */
    double link_us; /* size / raw link bandwidth (same run) */
    double read_share, query_share, verify_share, h2d_share;
} kvf_bl_row_t;

/* The GPU the H2D stage copies to; -1: no H2D stage. */
static int kvf_bl_gpu = -1;

/* The raw link bandwidth (bytes per microsecond) to a node: one object
 * of len bytes is put, then kvf_peer_link_test reads its range with plain
 * streams 5 times; the best run counts. 0 when it cannot be measured. */
static double kvf_bl_link_bw(kvf_store_h st, uint64_t len)
{
    kvf_store_info_t info;
    kvf_region_h reg;
    kvf_peer_h peer;
    double secs, best = 0;
    unsigned char *buf;
    char key[64];
    int k;

    buf = kvf_cli_pool_alloc(len, 9);
    if (buf == NULL) {
        return 0;
    }
    snprintf(key, sizeof(key), "bl/%d/link", (int)getpid());
    if (kvf_engine_reg(kvf_store_engine(st), buf, len, KVF_MEM_HOST, 0, &reg) ==
        KVF_OK) {
        if (kvf_store_put(st, key, buf, len, NULL) == KVF_OK &&
            kvf_store_query(st, key, &info) == KVF_OK &&
            kvf_peer_open(kvf_store_engine(st), info.segment[0], &peer) ==
                KVF_OK) {
            for (k = 0; k < 5; k++) {
                if (kvf_peer_link_test(peer, KVF_OP_READ, buf, info.addr[0],
                                       len, &secs) == KVF_OK &&
                    secs > 0 && (double)len / (secs * 1e6) > best) {
                    best = (double)len / (secs * 1e6);
                }
            }
            kvf_peer_close(peer);
        }
        kvf_engine_dereg(kvf_store_engine(st), reg);
    }
    kvf_cli_pool_free(buf, len);
    return best;
}

/* The host buffer a get lands in: pinned when the H2D stage runs (as a
 * serving engine's staging buffer is), else plain pool memory. */
static unsigned char *kvf_bl_buf_alloc(uint64_t size)
{
    void *p = NULL;

    if (kvf_bl_gpu < 0) {
        return kvf_cli_pool_alloc(size, size);
    }
    return kvf_mem_alloc(size, KVF_MEM_PINNED, 0, &p) == KVF_OK ? p : NULL;
}

static void kvf_bl_buf_free(unsigned char *buf, uint64_t size)
{
    if (kvf_bl_gpu < 0) {
        kvf_cli_pool_free(buf, size);
    } else {
        kvf_mem_free(buf);
    }
}

/* The H2D stage of one get: the object into GPU memory; the first copy
 * of a size is read back and compared. Returns microseconds, or -1. */
static double kvf_bl_h2d(void *dev, unsigned char *buf, uint64_t size,
                         int check)
{
    unsigned char *back;
    uint64_t t0 = kvf_time_ns();
    double us;

    if (kvf_gpu_copy(dev, buf, size) != KVF_OK) {
        return -1;
    }
    us = (double)(kvf_time_ns() - t0) / 1e3;
    if (check) {
        back = malloc(size);
        if (back == NULL || kvf_gpu_copy(back, dev, size) != KVF_OK ||
            memcmp(back, buf, size) != 0) {
            fprintf(stderr, "kvferry bench load: H2D copy of %lu B differs\n",
                    (unsigned long)size);
            us = -1;
        }
        free(back);
    }
    return us;
}

static int kvf_bl_size(kvf_store_h st, uint64_t size, unsigned count,
                       unsigned iters, kvf_bl_row_t *row)
{
    double *q, *r, *v, *h, *t, hus;
    kvf_store_timing_t tm;
    kvf_region_h reg;
    void *dev = NULL;
    unsigned char *buf;
    char key[96];
    unsigned i, n = 0;
    kvf_status_t s;
    uint64_t t0;
    size_t got;

    memset(row, 0, sizeof(*row));
    row->size = size;
    buf = kvf_bl_buf_alloc(size);
    if (buf == NULL) {
        return -1;
    }
    if ((kvf_bl_gpu >= 0 &&
         kvf_mem_alloc(size, KVF_MEM_CUDA, kvf_bl_gpu, &dev) != KVF_OK) ||
        kvf_engine_reg(kvf_store_engine(st), buf, size,
                       kvf_bl_gpu >= 0 ? KVF_MEM_PINNED : KVF_MEM_HOST, 0,
                       &reg) != KVF_OK) {
        if (dev != NULL) {
            kvf_mem_free(dev);
        }
        kvf_bl_buf_free(buf, size);
        return -1;
    }
    h = calloc(iters, sizeof(double));
    q = calloc(iters, sizeof(double));
    r = calloc(iters, sizeof(double));
    v = calloc(iters, sizeof(double));
    t = calloc(iters, sizeof(double));
    for (i = 0; i < count; i++) {
        snprintf(key, sizeof(key), "bl/%d/%lu/%u", (int)getpid(),
                 (unsigned long)size, i);
        buf[0] = (unsigned char)i;
        s = kvf_store_put(st, key, buf, size, NULL);
        if (s != KVF_OK && s != KVF_ERR_EXISTS) {
            fprintf(stderr, "kvferry bench load: put %s: %s\n", key,
                    kvf_status_name(s));
            count = i;
            break;
        }
    }
    for (i = 0; i < iters && count > 0 && q && r && v && h && t; i++) {
        snprintf(key, sizeof(key), "bl/%d/%lu/%u", (int)getpid(),
                 (unsigned long)size, i % count);
        t0 = kvf_time_ns();
        s = kvf_store_get(st, key, buf, size, &got, 0);
        if (s != KVF_OK) {
            row->errors++;
            continue;
        }
        kvf_store_last_timing(&tm);
        hus = (dev != NULL) ? kvf_bl_h2d(dev, buf, size, n == 0) : 0;
        if (hus < 0) {
            row->errors++;
            continue;
        }
        t[n] = (double)(kvf_time_ns() - t0) / 1e3;
        h[n] = hus;
        q[n] = (double)tm.query_ns / 1e3;
        r[n] = (double)tm.read_ns / 1e3;
        v[n] = (double)tm.verify_ns / 1e3;
        n++;
    }
    row->gets = n;
    if (n > 0) {
        double qm = 0, rm = 0, vm = 0, hm = 0, tmn = 0;

        for (i = 0; i < n; i++) {
            qm += q[i];
            rm += r[i];
            vm += v[i];
            hm += h[i];
            tmn += t[i];
        }
        row->h2d_share = hm / tmn;
        row->h50 = dev != NULL ? kvf_bench_quantile(h, n, 0.5) : NAN;
        row->h99 = dev != NULL ? kvf_bench_quantile(h, n, 0.99) : NAN;
        row->query_share = qm / tmn;
        row->read_share = rm / tmn;
        row->verify_share = vm / tmn;
        row->q50 = kvf_bench_quantile(q, n, 0.5);
        row->q99 = kvf_bench_quantile(q, n, 0.99);
        row->r50 = kvf_bench_quantile(r, n, 0.5);
        row->r99 = kvf_bench_quantile(r, n, 0.99);
        row->v50 = kvf_bench_quantile(v, n, 0.5);
        row->v99 = kvf_bench_quantile(v, n, 0.99);
        row->t50 = kvf_bench_quantile(t, n, 0.5);
        row->t99 = kvf_bench_quantile(t, n, 0.99);
    }
    free(q);
    free(r);
    free(v);
    free(t);
    free(h);
    kvf_engine_dereg(kvf_store_engine(st), reg);
    if (dev != NULL) {
        kvf_mem_free(dev);
    }
    kvf_bl_buf_free(buf, size);
    return 0;
}

/* The columns of a row, declared once for the text table, the JSON rows
 * and the record; the H2D figures join the record when a GPU took part. */
static kvf_out_col_t kvf_bl_cols[] = {
    {"size", NULL, "bytes", "%lld", .kind = KVF_OUT_INT},
    {"size_text", "size", NULL, "%9s", .kind = KVF_OUT_STR, .width = 9,
     .nojson = 1},
    {"gets", "gets", NULL, "%6lld", .kind = KVF_OUT_INT, .width = 6},
    {"errors", NULL, NULL, "%lld", .kind = KVF_OUT_INT},
    {"query_p50_us", "query50", "us", "%9.1f", .width = 9, .fig = "query (us)",
     .p50 = "query_p50_us", .p99 = "query_p99_us"},
    {"query_p99_us", "query99", "us", "%9.1f", .width = 9},
    {"read_p50_us", "read50", "us", "%9.1f", .width = 9,
     .fig = "remote read (us)", .p50 = "read_p50_us", .p99 = "read_p99_us"},
    {"read_p99_us", "read99", "us", "%9.1f", .width = 9},
    {"verify_p50_us", "verif50", "us", "%9.1f", .width = 9,
     .fig = "verify (us)", .p50 = "verify_p50_us", .p99 = "verify_p99_us"},
    {"verify_p99_us", "verif99", "us", "%9.1f", .width = 9},
    {"h2d_p50_us", "h2d50", "us", "%9.1f", .width = 9, .p50 = "h2d_p50_us",
     .p99 = "h2d_p99_us"},
    {"h2d_p99_us", "h2d99", "us", "%9.1f", .width = 9},
    {"h2d_share", "h_shr", "share", "%6.2f", .width = 6},
    {"total_p50_us", "total50", "us", "%9.1f", .width = 9,
     .fig = "load total (us)", .p50 = "total_p50_us", .p99 = "total_p99_us"},
    {"total_p99_us", "total99", "us", "%9.1f", .width = 9},
    {"query_share", "q_shr", "share", "%6.2f", .width = 6,
     .series = "query share of the load"},
    {"read_share", "r_shr", "share", "%6.2f", .width = 6,
     .series = "remote read share of the load"},
    {"verify_share", NULL, "share", "%.2f"},
    {"link_estimate_us", "link_us", "us", "%9.1f", .width = 9},
    {"read_over_link", "r/link", "ratio", "%6.2f", .width = 6, .nojson = 1},
};

static const char *const kvf_bl_text_keys[] = {
    "size_text",      "gets",        "query_p50_us",  "query_p99_us",
    "read_p50_us",    "read_p99_us", "verify_p50_us", "verify_p99_us",
    "h2d_p50_us",     "h2d_p99_us",  "total_p50_us",  "total_p99_us",
    "query_share",    "read_share",  "h2d_share",     "link_estimate_us",
    "read_over_link", NULL};

static void kvf_bl_table_init(kvf_out_table_t *t)
{
    unsigned n = sizeof(kvf_bl_cols) / sizeof(kvf_bl_cols[0]), c;

    for (c = 0; c < n; c++) {
        if (strcmp(kvf_bl_cols[c].key, "h2d_p50_us") == 0) {
            kvf_bl_cols[c].fig = kvf_bl_gpu >= 0 ? "H2D (us)" : NULL;
        } else if (strcmp(kvf_bl_cols[c].key, "h2d_share") == 0) {
            kvf_bl_cols[c].series =
                kvf_bl_gpu >= 0 ? "H2D share of the load" : NULL;
        }
    }
    kvf_out_init(t, kvf_bl_cols, n);
    t->aligned = 1;
    t->text_keys = kvf_bl_text_keys;
    t->x_key = "size";
    t->x_label = "object bytes";
}

static void kvf_bl_table_row(kvf_out_table_t *t, const kvf_bl_row_t *r)
{
    char sz[32];

    kvf_fmt_size(r->size, sz, sizeof(sz));
    kvf_out_row(t, sz, NULL);
    kvf_out_num(t, "size", (double)r->size);
    kvf_out_str(t, "size_text", sz);
    kvf_out_num(t, "gets", (double)r->gets);
    kvf_out_num(t, "errors", (double)r->errors);
    kvf_out_num(t, "query_p50_us", r->q50);
    kvf_out_num(t, "query_p99_us", r->q99);
    kvf_out_num(t, "read_p50_us", r->r50);
    kvf_out_num(t, "read_p99_us", r->r99);
    kvf_out_num(t, "verify_p50_us", r->v50);
    kvf_out_num(t, "verify_p99_us", r->v99);
    kvf_out_num(t, "h2d_p50_us", r->h50);
    kvf_out_num(t, "h2d_p99_us", r->h99);
    kvf_out_num(t, "h2d_share", r->h2d_share);
    kvf_out_num(t, "total_p50_us", r->t50);
    kvf_out_num(t, "total_p99_us", r->t99);
    kvf_out_num(t, "query_share", r->query_share);
    kvf_out_num(t, "read_share", r->read_share);
    kvf_out_num(t, "verify_share", r->verify_share);
    kvf_out_num(t, "link_estimate_us", r->link_us);
    kvf_out_num(t, "read_over_link",
                r->link_us > 0 ? r->r50 / r->link_us : NAN);
}

/* The run's configuration: the members before "rows". */
static void kvf_bl_json_head(kvf_json_t *j, void *ctx)
{
    (void)ctx;
    kvf_json_str(j, "bench", "load");
    kvf_json_str(j, "transports", kvf_config_get("transports"));
    if (kvf_bl_gpu >= 0) {
        kvf_json_int(j, "h2d_gpu", kvf_bl_gpu);
    } else {
        kvf_json_str(j, "h2d", "not measured (no GPU in this run)");
    }
}

static int kvf_bl_record(const char *dir, const char *hyp,
                         const kvf_bl_row_t *rows, unsigned n,
                         const kvf_out_table_t *t)
{
    char text[512], sz[32];
    double worst = 0;
    kvf_record_t *rec;
    unsigned i;
    int rc;

    rec = kvf_record_new("bench", "bench load",
                         "the remote read dominates the load path for "
                         "objects of 1 MiB and more, and takes at most 2x "
                         "the raw link time of the same bytes");
    if (rec == NULL) {
        return -1;
    }
    kvf_record_hypothesis(rec, hyp);
    kvf_record_config(rec, "transports", kvf_config_get("transports"));
    if (kvf_bl_gpu >= 0) {
        snprintf(text, sizeof(text),
                 "measured: cudaMemcpy of each object from its pinned host "
                 "buffer to GPU %d (the first copy per size read back and "
                 "compared)",
                 kvf_bl_gpu);
        kvf_record_config(rec, "h2d", text);
    } else {
        kvf_record_config(rec, "h2d", "not measured: no GPU in this run");
    }
    for (i = 0; i < n; i++) {
        if (rows[i].link_us > 0 && rows[i].r50 / rows[i].link_us > worst &&
            rows[i].size >= (1u << 20)) {
            worst = rows[i].r50 / rows[i].link_us;
        }
    }
    if (n > 0 && rows[n - 1].link_us > 0) {
        kvf_fmt_size(rows[n - 1].size, sz, sizeof(sz));
        snprintf(text, sizeof(text),
                 "time of %s at the raw link bandwidth "
                 "to a node (kvf_peer_link_test, plain streams, best of 5, "
                 "same run)",
                 sz);
        kvf_record_estimate(rec, rows[n - 1].link_us, "us", text);
    }
    snprintf(text, sizeof(text),
             "worst remote read P50 / link time at >= 1 MiB: %.2f", worst);
    kvf_record_gap(rec, worst, text);
    kvf_record_conclude(rec,
                        worst > 0 && worst <= 2.0 ? "holds"
                        : worst > 0               ? "does not hold"
                                                  : "holds under conditions",
                        text);
    if (kvf_bl_gpu < 0) {
        kvf_record_not_verified(rec, "H2D: no GPU in this run");
    }
    kvf_out_record(t, rec, kvf_bl_json_head, NULL);
    rc = kvf_env_record_write(rec, dir);
    kvf_record_free(rec);
    return rc;
}

int kvf_cmd_bench_load(int argc, char **argv)
{
    uint64_t sizes[16] = {8 << 10, 64 << 10, 1 << 20, 8 << 20, 64 << 20};
    unsigned nsizes = 5, nodes = 2, count = 8, iters = 200, i, nrows = 0;
    const char *master = NULL, *record = NULL, *hyp = NULL;
    kvf_store_params_t sp = {0};
    kvf_bs_cluster_t cl = {0};
    kvf_bl_row_t rows[16];
    uint64_t pool = 1ull << 30, link_len;
    char used[32];
    double link_bw;
    char sz[32];
    kvf_store_h st;
    kvf_status_t s;
    int json = 0, rc, gpu = 0, strict = 0;
    kvf_expect_t *expect = NULL;
    kvf_progress_t prog;
    kvf_out_table_t t;
    kvf_busy_t busy;
    kvf_opt_sizes_t size_list = {sizes, &nsizes, 16};
    const kvf_opt_t opts[] = {
        {"master", 0, KVF_OPT_STR, &master, "HOST:PORT",
         "a running store master", "spawn a master and --nodes nodes"},
        {"nodes", 0, KVF_OPT_UINT, &nodes, "N", "nodes to spawn", "2", .min = 1,
         .max = KVF_BS_NODES_MAX},
        {"pool", 0, KVF_OPT_SIZE, &pool, "SIZE", "pool of each spawned node",
         "1G"},
        {"sizes", 0, KVF_OPT_SIZES, &size_list, "LIST", "object sizes",
         "8K,64K,1M,8M,64M"},
        {"count", 0, KVF_OPT_UINT, &count, "N", "objects put per size", "8",
         .min = 1, .max = 4096},
        {"iters", 0, KVF_OPT_UINT, &iters, "N", "gets timed per size", "200",
         .min = 1, .max = 1000000},
        {"gpu", 0, KVF_OPT_INT, &gpu, "N",
         "H2D into GPU N after each get (-1 = none)", "0 when a GPU is present",
         .min = -1, .max = 64},
        {"json", 0, KVF_OPT_FLAG, &json, NULL, "print results as JSON"},
        {"record", 0, KVF_OPT_STR, &record, "DIR",
         "write a record (Markdown + JSON) into DIR"},
        {"hypothesis", 0, KVF_OPT_STR, &hyp, "TEXT", "the record's hypothesis"},
        {"expect", 0, KVF_OPT_FN, &expect, "RULE",
         "a claim to check (repeatable); figures: read_over_link (remote\n"
         "read P50 over the link time, sizes >= 1 MiB), errors",
         "read_over_link<=2, errors==0", .fn = kvf_bench_expect_opt},
        {"strict", 0, KVF_OPT_FLAG, &strict, NULL,
         "exit 1 when a claim is missed (default: exit 0 once measured)"},
        {0},
    };
    const kvf_cmd_spec_t spec = {
        "kvferry bench load [options]",
        "The store's load path: per size, COUNT objects put, then ITERS\n"
        "gets timed by stage (master query, remote read, verify, H2D).",
        opts, .progress = 1};

    rc = kvf_opts_parse(&spec, argc, argv, NULL);
    if (rc >= 0 || kvf_bench_expect(&expect) == NULL) {
        kvf_expect_free(expect);
        return rc >= 0 ? rc : KVF_CLI_FAIL;
    }
    rc = KVF_CLI_OK;
    kvf_progress_begin(&prog, "bench load", nsizes, nsizes);
    if (master == NULL) {
        kvf_fmt_size(pool, sz, sizeof(sz));
        kvf_progress_note(&prog, "starting a master and %u node(s) of %s",
                          nodes, sz);
        if (kvf_bs_cluster_start(&cl, nodes, pool) != 0) {
            kvf_progress_end(&prog);
            kvf_expect_free(expect);
            return KVF_CLI_FAIL;
        }
        master = cl.master;
    }
    sp.field_mask = KVF_STORE_PARAM_MASTER;
    sp.master = master;
    kvf_bl_gpu = (gpu >= 0 && gpu < kvf_gpu_count()) ? gpu : -1;
    kvf_bl_table_init(&t);
    s = kvf_store_connect(&sp, &st);
    if (s != KVF_OK) {
        fprintf(stderr, "kvferry bench load: %s\n", kvf_status_str(s));
        kvf_bs_cluster_stop(&cl);
        kvf_progress_end(&prog);
        kvf_expect_free(expect);
        return KVF_CLI_FAIL;
    }
    kvf_progress_clear(&prog);
    if (!json) {
        printf("# bench load: master %s, transports %s, %u gets per size; "
               "H2D: %s\n",
               master, kvf_config_get("transports"), iters,
               kvf_bl_gpu >= 0 ? "into GPU memory (pinned host buffers)"
                               : "not measured (no GPU)");
    }
    for (i = 0, link_len = 0; i < nsizes; i++) {
        link_len = sizes[i] > link_len ? sizes[i] : link_len;
    }
    link_len = link_len > (64u << 20) ? (64u << 20) : link_len;
    link_len = link_len > (uint64_t)nodes * pool / 4
                   ? (uint64_t)nodes * pool / 4
                   : link_len;
    link_bw = kvf_bl_link_bw(st, link_len);
    kvf_bs_transport_used(st, used, sizeof(used));
    if (!json) {
        printf("# transport to the nodes: %s\n", used);
        printf("# raw link: %.2f GB/s (kvf_peer_link_test, %lu B reads, "
               "best of 5)\n",
               link_bw / 1e3, (unsigned long)link_len);
        kvf_out_text_header(&t, stdout);
    }
    for (i = 0; i < nsizes; i++) {
        if (sizes[i] * count > (uint64_t)nodes * pool / 2) {
            count = (unsigned)((uint64_t)nodes * pool / 2 / sizes[i]);
            count = count ? count : 1;
        }
        kvf_fmt_size(sizes[i], sz, sizeof(sz));
        kvf_progress_step(&prog, "%u objects of %s put, %u gets timed", count,
                          sz, iters);
        if (kvf_bl_size(st, sizes[i], count, iters, &rows[nrows]) != 0) {
            kvf_progress_done(&prog, 1);
            rc = KVF_CLI_FAIL;
            continue;
        }
        kvf_progress_done(&prog, 1);
        kvf_progress_clear(&prog);
        rows[nrows].link_us = link_bw > 0 ? (double)sizes[i] / link_bw : 0;
        kvf_bl_table_row(&t, &rows[nrows]);
        if (!json) {
            kvf_out_text_row(&t, t.nrows - 1, stdout);
        }
        if (rows[nrows].errors > 0) {
            rc = KVF_CLI_FAIL;
        }
        kvf_fmt_size(sizes[i], sz, sizeof(sz));
        if (sizes[i] >= (1u << 20) && rows[nrows].link_us > 0) {
            kvf_expect_figure(expect, "read_over_link",
                              rows[nrows].r50 / rows[nrows].link_us, sz);
        }
        kvf_expect_figure(expect, "errors", (double)rows[nrows].errors, sz);
        nrows++;
    }
    busy = kvf_progress_end(&prog);
    kvf_store_disconnect(st);
    kvf_bs_cluster_stop(&cl);
    if (json) {
        kvf_out_json_doc(&t, stdout, kvf_bl_json_head, NULL);
    }
    if (record != NULL && kvf_bl_record(record, hyp, rows, nrows, &t) != 0) {
        rc = KVF_CLI_FAIL;
    }
    kvf_out_free(&t);
    {
        static const char *const defaults[] = {"read_over_link<=2", "errors==0",
                                               NULL};

        if (kvf_bench_finish(&expect, defaults, json, &busy) > 0 && strict) {
            rc = KVF_CLI_FAIL;
        }
    }
    return rc;
}
