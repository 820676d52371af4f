/*
 * `kvferry bench link`: the raw ceiling of the path to a target: the
 * bytes moved contiguously with the parallelism of the transport (tcp:
 * one stream per connection; shm: one copying thread per worker; ucx:
 * cut over its workers), between the same two processes `bench blocks`
 * uses, no block handling. The ceiling is the best iteration; the
 * median is printed beside it (docs/performance.md, "Ceilings").
 */
#include "tools/bench/bench.h"
#include "tools/cli/opts.h"
#include "tools/bench/env.h"
#include "tools/bench/out.h"
#include "tools/record/record.h"

#include "core/rng.h"
#include <math.h>
#include <string.h>

/* The run's one row, declared once for the text line and the record. */
static const kvf_out_col_t kvf_link_cols[] = {
    {"transport", "transport", NULL, "%s", .kind = KVF_OUT_STR},
    {"conns", "conns", NULL, "%lld", .kind = KVF_OUT_INT},
    {"op", "op", NULL, "%s", .kind = KVF_OUT_STR},
    {"size_bytes", "size", "bytes", "%lld", .kind = KVF_OUT_INT},
    {"lat_ms_p50", "lat", "ms", "%8.3f"},
    {"lat_ms_p99", "lat p99", "ms", "%8.3f"},
    {"gib_s", "BW", "GiB/s", "%7.2f", .fig = "(iteration ms)",
     .p50 = "lat_ms_p50", .p99 = "lat_ms_p99"},
    {"gib_s_p50", "median BW", "GiB/s", "%7.2f"},
    {"gbps", "BW", "Gbps", "%6.2f", .fig = ""},
    {"lat_ms_min", "min lat", "ms", "%8.3f"},
};

/* The published line: "link transport=... | lat=... | BW=...". */
static void kvf_link_row_fmt(const kvf_out_table_t *t, unsigned i, FILE *f,
                             void *ctx)
{
    char sstr[32];

    (void)ctx;
    kvf_fmt_size((uint64_t)kvf_out_get(t, i, "size_bytes"), sstr, sizeof(sstr));
    fprintf(f,
            "link transport=%s conns=%u op=%s size=%s | lat=%8.3f ms | "
            "BW=%7.2f GB/s (%6.2f Gbps) best | median %7.2f GB/s | "
            "min lat=%8.3f ms",
            kvf_out_cell(t, i, "transport")->str,
            (unsigned)kvf_out_get(t, i, "conns"), kvf_out_cell(t, i, "op")->str,
            sstr, kvf_out_get(t, i, "lat_ms_p50"), kvf_out_get(t, i, "gib_s"),
            kvf_out_get(t, i, "gbps"), kvf_out_get(t, i, "gib_s_p50"),
            kvf_out_get(t, i, "lat_ms_min"));
}

/* Fills the table with the run's row; secs is sorted by the quantiles. */
static void kvf_link_table(kvf_out_table_t *t, const kvf_bench_session_t *s,
                           unsigned conns, kvf_op_type_t op, uint64_t size,
                           double *secs, unsigned iters)
{
    const char *ops = op == KVF_OP_WRITE ? "write" : "read";
    double p50 = kvf_bench_quantile(secs, iters, 0.5);
    double p99 = kvf_bench_quantile(secs, iters, 0.99);
    char label[64], sstr[32];

    kvf_out_init(t, kvf_link_cols,
                 sizeof(kvf_link_cols) / sizeof(kvf_link_cols[0]));
    t->row_fmt = kvf_link_row_fmt;
    kvf_fmt_size(size, sstr, sizeof(sstr));
    snprintf(label, sizeof(label), "link %s %s", ops, sstr);
    kvf_out_row(t, label, "link");
    kvf_out_str(t, "transport", kvf_peer_transport(s->peer));
    kvf_out_num(t, "conns", conns);
    kvf_out_str(t, "op", ops);
    kvf_out_num(t, "size_bytes", (double)size);
    kvf_out_num(t, "lat_ms_p50", p50 * 1e3);
    kvf_out_num(t, "lat_ms_p99", p99 * 1e3);
    /* the ceiling is the best iteration; the median beside it */
    kvf_out_num(t, "gib_s", (double)size / secs[0] / (1u << 30));
    kvf_out_num(t, "gib_s_p50", (double)size / p50 / (1u << 30));
    kvf_out_num(t, "gbps", (double)size * 8 / secs[0] / 1e9);
    kvf_out_num(t, "lat_ms_min", secs[0] * 1e3);
}

/* The record (seed 003 §5): the median iteration against the best one
 * of the same run; the hypothesis is that the ceiling is stable (P99
 * iteration time within 10 % of P50). secs is sorted. */
static int kvf_link_record(const char *dir, const char *hypothesis,
                           const kvf_bench_session_opts_t *so,
                           const kvf_bench_session_t *s, kvf_op_type_t op,
                           uint64_t size, double *secs, unsigned iters,
                           const kvf_out_table_t *t)
{
    double p50 = kvf_bench_quantile(secs, iters, 0.5);
    double p99 = kvf_bench_quantile(secs, iters, 0.99);
    double gib = (double)size / p50 / (1u << 30);
    double best = (double)size / secs[0] / (1u << 30);
    const char *ops = op == KVF_OP_WRITE ? "write" : "read";
    char text[256], sstr[32];
    kvf_record_t *rec;
    int stable = p99 <= 1.1 * p50, rc;

    rec = kvf_record_new("bench", "bench link",
                         "the raw ceiling of the path is stable: the P99 "
                         "iteration takes at most 10 % longer than P50");
    if (rec == NULL) {
        return KVF_CLI_FAIL;
    }
    kvf_record_hypothesis(rec, hypothesis);
    kvf_fmt_size(size, sstr, sizeof(sstr));
    kvf_record_config(rec, "transport", kvf_peer_transport(s->peer));
    kvf_record_config(rec, "op", ops);
    kvf_record_config_num(rec, "size_bytes", (double)size);
    kvf_record_config_num(rec, "iters", iters);
    kvf_record_config_num(rec, "conns", so->conns);
    if (strcmp(kvf_peer_transport(s->peer), "ucx") == 0) {
        /* the contiguous bytes are cut over this many workers */
        kvf_record_config(rec, "ucx_workers", kvf_config_get("ucx_workers"));
    }
    kvf_record_config_num(rec, "pool_bytes", (double)so->pool);
    kvf_record_config(rec, "target",
                      so->target ? so->target : "spawned on 127.0.0.1");
    kvf_out_record_figures(t, rec);
    snprintf(text, sizeof(text),
             "the fastest of the %u iterations of this "
             "run",
             iters);
    kvf_record_estimate(rec, best, "GiB/s", text);
    kvf_record_gap(rec, best > 0 ? gib / best : 0,
                   "median over best iteration: run-to-run noise of the "
                   "machine (other processes, scheduling, page cache)");
    snprintf(text, sizeof(text),
             "P99 iteration %.3f ms vs P50 %.3f ms "
             "(%+.1f %%)",
             p99 * 1e3, p50 * 1e3, 100.0 * (p99 / p50 - 1.0));
    kvf_record_conclude(rec, stable ? "holds" : "does not hold", text);
    kvf_record_not_verified(rec, "bytes are not verified by the link test");
    kvf_record_not_verified(rec, "one size only; `bench blocks` measures "
                                 "the link at each transfer size");
    rc = kvf_env_record_write(rec, dir) == 0 ? KVF_CLI_OK : KVF_CLI_FAIL;
    kvf_record_free(rec);
    return rc;
}

int kvf_cmd_bench_link(int argc, char **argv)
{
    kvf_bench_session_opts_t so = {
        .pool = 2ull << 30, .conns = 4, .timeout_ms = 10000, .seed = 1};
    uint64_t size = 1ull << 30;
    kvf_op_type_t op = KVF_OP_WRITE;
    unsigned iters = 5, i;
    double secs[64], med;
    kvf_bench_session_t s;
    kvf_status_t status = KVF_OK;
    const char *record = NULL, *hypothesis = NULL;
    char sstr[32], pstr[32], where[64];
    kvf_rng_t rng;
    int op_i = KVF_OP_WRITE, rc, strict = 0, missed;
    kvf_expect_t *expect = NULL;
    kvf_progress_t prog;
    kvf_busy_t busy;
    kvf_out_table_t t;
    const kvf_opt_t opts[] = {
        {"target", 0, KVF_OPT_STR, &so.target, "HOST:PORT",
         "a running `kvferry target`", "spawn one on 127.0.0.1"},
        {"pool", 0, KVF_OPT_SIZE, &so.pool, "SIZE", "pool on each side", "2G"},
        {"size", 0, KVF_OPT_SIZE, &size, "SIZE", "bytes per stream test", "1G"},
        {"op", 0, KVF_OPT_CHOICE, &op_i, NULL, "direction", "write",
         "read|write"},
        {"iters", 0, KVF_OPT_UINT, &iters, "N", "tests, the median kept", "5",
         .min = 1, .max = 64},
        {"conns", 0, KVF_OPT_UINT, &so.conns, "N", "connections", "4", .min = 1,
         .max = 64},
        {"transport", 0, KVF_OPT_STR, &so.transports, "NAME",
         "force a transport", "auto"},
        {"record", 0, KVF_OPT_STR, &record, "DIR",
         "write a record (Markdown + JSON) into DIR"},
        {"hypothesis", 0, KVF_OPT_STR, &hypothesis, "TEXT",
         "the record's hypothesis"},
        {"expect", 0, KVF_OPT_FN, &expect, "RULE",
         "a claim to check (repeatable); figures: gib_s, p99_over_p50\n"
         "(the slowest iteration's time over the median's)",
         "p99_over_p50<=1.1", .fn = kvf_bench_expect_opt},
        {"strict", 0, KVF_OPT_FLAG, &strict, NULL,
         "exit 1 when a claim is missed (default: exit 0 once measured)"},
        {0},
    };
    const kvf_cmd_spec_t spec = {
        "kvferry bench link [options]",
        "Raw ceiling of the path to the target: SIZE contiguous bytes moved\n"
        "with the transport's parallelism (tcp: a stream per connection;\n"
        "shm: a copying thread per worker), no block handling; the best\n"
        "iteration is the ceiling, the median is printed beside it. The\n"
        "path is a spawned target on 127.0.0.1 unless --target names a\n"
        "running one.",
        opts, .progress = 1};

    rc = kvf_opts_parse(&spec, argc, argv, NULL);
    if (rc >= 0) {
        kvf_expect_free(expect);
        return rc;
    }
    rc = KVF_CLI_OK;
    op = (kvf_op_type_t)op_i;
    if (size > so.pool) {
        size = so.pool;
    }
    kvf_fmt_size(size, sstr, sizeof(sstr));
    kvf_fmt_size(so.pool, pstr, sizeof(pstr));
    kvf_progress_begin(&prog, "bench link", iters, iters);
    kvf_progress_note(&prog, "preparing two %s pools (random bytes)%s", pstr,
                      so.target != NULL ? "" : " and a target process");
    if (kvf_bench_session_open(&so, &s) != 0) {
        kvf_progress_end(&prog);
        kvf_expect_free(expect);
        return KVF_CLI_FAIL;
    }
    if (size > s.remote_len) {
        size = s.remote_len;
    }
    kvf_rng_seed(&rng, 4242);
    for (i = 0; i < iters && status == KVF_OK; i++) {
        /* a fresh random stretch of each pool every time, so a small
         * size is not served from the CPU caches */
        uint64_t loff =
            kvf_rng_below(&rng, (s.pool_len - size) / 4096 + 1) * 4096;
        uint64_t roff =
            kvf_rng_below(&rng, (s.remote_len - size) / 4096 + 1) * 4096;

        kvf_progress_step(&prog, "%s %s streams over %s",
                          op == KVF_OP_WRITE ? "write" : "read", sstr,
                          kvf_peer_transport(s.peer));
        status = kvf_peer_link_test(s.peer, op, s.pool + loff, s.remote + roff,
                                    size, &secs[i]);
        kvf_progress_done(&prog, 1);
    }
    busy = kvf_progress_end(&prog);
    if (status != KVF_OK) {
        fprintf(stderr, "kvferry: link test: %s\n", kvf_status_str(status));
        kvf_bench_session_close(&s);
        kvf_expect_free(expect);
        return KVF_CLI_FAIL;
    }
    med = kvf_bench_quantile(secs, iters, 0.5);
    kvf_link_table(&t, &s, so.conns, op, size, secs, iters);
    kvf_out_text(&t, stdout);
    if (record != NULL) {
        rc = kvf_link_record(record, hypothesis, &so, &s, op, size, secs, iters,
                             &t);
    }
    kvf_out_free(&t);
    if (kvf_bench_expect(&expect) != NULL) {
        static const char *const defaults[] = {"p99_over_p50<=1.1", NULL};

        snprintf(where, sizeof(where), "%s %s",
                 op == KVF_OP_WRITE ? "write" : "read", sstr);
        kvf_expect_figure(expect, "gib_s", (double)size / secs[0] / (1u << 30),
                          where);
        kvf_expect_figure(expect, "p99_over_p50",
                          kvf_bench_quantile(secs, iters, 0.99) / med, where);
        missed = kvf_bench_finish(&expect, defaults, 0, &busy);
        if (strict && missed > 0) {
            rc = KVF_CLI_FAIL;
        }
    }
    kvf_bench_session_close(&s);
    return rc;
}
