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
#include "tools/record/record.h"

#include <kvferry/config.h>
#include <kvferry/gpu.h>
#include <kvferry/store.h>

#include "tools/cli/clock.h"

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
    uint64_t t0 = kvf_clock_ns();
    double us;

    if (kvf_gpu_copy(dev, buf, size) != KVF_OK) {
        return -1;
    }
    us = (double)(kvf_clock_ns() - t0) / 1e3;
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
        t0 = kvf_clock_ns();
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
        t[n] = (double)(kvf_clock_ns() - t0) / 1e3;
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

static void kvf_bl_json(FILE *f, const kvf_bl_row_t *rows, unsigned n)
{
    kvf_json_t j;
    unsigned i;

    kvf_json_begin(&j, f);
    kvf_json_obj(&j, NULL);
    kvf_json_str(&j, "bench", "load");
    kvf_json_str(&j, "transports", kvf_config_get("transports"));
    if (kvf_bl_gpu >= 0) {
        kvf_json_int(&j, "h2d_gpu", kvf_bl_gpu);
    } else {
        kvf_json_str(&j, "h2d", "not measured (no GPU in this run)");
    }
    kvf_json_arr(&j, "rows");
    for (i = 0; i < n; i++) {
        kvf_json_obj(&j, NULL);
        kvf_json_int(&j, "size", (long long)rows[i].size);
        kvf_json_int(&j, "gets", rows[i].gets);
        kvf_json_int(&j, "errors", rows[i].errors);
        kvf_json_num(&j, "query_p50_us", rows[i].q50);
        kvf_json_num(&j, "query_p99_us", rows[i].q99);
        kvf_json_num(&j, "read_p50_us", rows[i].r50);
        kvf_json_num(&j, "read_p99_us", rows[i].r99);
        kvf_json_num(&j, "verify_p50_us", rows[i].v50);
        kvf_json_num(&j, "verify_p99_us", rows[i].v99);
        kvf_json_num(&j, "h2d_p50_us", rows[i].h50);
        kvf_json_num(&j, "h2d_p99_us", rows[i].h99);
        kvf_json_num(&j, "h2d_share", rows[i].h2d_share);
        kvf_json_num(&j, "total_p50_us", rows[i].t50);
        kvf_json_num(&j, "total_p99_us", rows[i].t99);
        kvf_json_num(&j, "query_share", rows[i].query_share);
        kvf_json_num(&j, "read_share", rows[i].read_share);
        kvf_json_num(&j, "verify_share", rows[i].verify_share);
        kvf_json_num(&j, "link_estimate_us", rows[i].link_us);
        kvf_json_end_obj(&j);
    }
    kvf_json_end_arr(&j);
    kvf_json_end_obj(&j);
    fputc('\n', f);
}

static int kvf_bl_record(const char *dir, const char *hyp,
                         const kvf_bl_row_t *rows, unsigned n)
{
    char name[128], text[512], sz[32], *raw = NULL;
    double worst = 0;
    size_t rawlen = 0;
    kvf_record_t *rec;
    unsigned i;
    FILE *mf;
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
        kvf_cli_fmt_size(rows[i].size, sz, sizeof(sz));
        snprintf(name, sizeof(name), "%s query (us)", sz);
        kvf_record_figure(rec, name, rows[i].q50, "us", rows[i].q50,
                          rows[i].q99);
        snprintf(name, sizeof(name), "%s remote read (us)", sz);
        kvf_record_figure(rec, name, rows[i].r50, "us", rows[i].r50,
                          rows[i].r99);
        snprintf(name, sizeof(name), "%s verify (us)", sz);
        kvf_record_figure(rec, name, rows[i].v50, "us", rows[i].v50,
                          rows[i].v99);
        if (kvf_bl_gpu >= 0) {
            snprintf(name, sizeof(name), "%s H2D (us)", sz);
            kvf_record_figure(rec, name, rows[i].h50, "us", rows[i].h50,
                              rows[i].h99);
            kvf_record_point(rec, "H2D share of the load", "object bytes",
                             "share", (double)rows[i].size, rows[i].h2d_share);
        }
        snprintf(name, sizeof(name), "%s load total (us)", sz);
        kvf_record_figure(rec, name, rows[i].t50, "us", rows[i].t50,
                          rows[i].t99);
        kvf_record_point(rec, "remote read share of the load", "object bytes",
                         "share", (double)rows[i].size, rows[i].read_share);
        kvf_record_point(rec, "query share of the load", "object bytes",
                         "share", (double)rows[i].size, rows[i].query_share);
        if (rows[i].link_us > 0 && rows[i].r50 / rows[i].link_us > worst &&
            rows[i].size >= (1u << 20)) {
            worst = rows[i].r50 / rows[i].link_us;
        }
    }
    if (n > 0 && rows[n - 1].link_us > 0) {
        kvf_cli_fmt_size(rows[n - 1].size, sz, sizeof(sz));
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
    mf = open_memstream(&raw, &rawlen);
    if (mf != NULL) {
        kvf_bl_json(mf, rows, n);
        fclose(mf);
        kvf_record_raw(rec, raw);
    }
    free(raw);
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
        kvf_cli_fmt_size(pool, sz, sizeof(sz));
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
        printf("%9s %6s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %6s %6s "
               "%6s %9s %6s\n",
               "size", "gets", "query50", "query99", "read50", "read99",
               "verif50", "verif99", "h2d50", "h2d99", "total50", "total99",
               "q_shr", "r_shr", "h_shr", "link_us", "r/link");
    }
    for (i = 0; i < nsizes; i++) {
        if (sizes[i] * count > (uint64_t)nodes * pool / 2) {
            count = (unsigned)((uint64_t)nodes * pool / 2 / sizes[i]);
            count = count ? count : 1;
        }
        kvf_cli_fmt_size(sizes[i], sz, sizeof(sz));
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
        if (!json) {
            kvf_bl_row_t *r = &rows[nrows];

            kvf_cli_fmt_size(r->size, sz, sizeof(sz));
            printf("%9s %6ld %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f "
                   "%9.1f %9.1f %6.2f %6.2f %6.2f %9.1f %6.2f\n",
                   sz, r->gets, r->q50, r->q99, r->r50, r->r99, r->v50, r->v99,
                   r->h50, r->h99, r->t50, r->t99, r->query_share,
                   r->read_share, r->h2d_share, r->link_us,
                   r->link_us > 0 ? r->r50 / r->link_us : NAN);
            fflush(stdout);
        }
        if (rows[nrows].errors > 0) {
            rc = KVF_CLI_FAIL;
        }
        kvf_cli_fmt_size(sizes[i], sz, sizeof(sz));
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
        kvf_bl_json(stdout, rows, nrows);
    }
    if (record != NULL && kvf_bl_record(record, hyp, rows, nrows) != 0) {
        rc = KVF_CLI_FAIL;
    }
    {
        static const char *const defaults[] = {"read_over_link<=2", "errors==0",
                                               NULL};

        if (kvf_bench_finish(&expect, defaults, json, &busy) > 0 && strict) {
            rc = KVF_CLI_FAIL;
        }
    }
    return rc;
}
