/*
 * `kvferry bench te`: the transfer engine's throughput curve (seed 003
 * §3.3, in the spirit of Mooncake's transfer_engine_bench). For each block
 * size (4 KiB .. 64 MiB, doubling) every thread submits its own batches of
 * `batch` blocks to the same peer, waits for each, and submits the next,
 * for --duration (and at least --min-batches per thread). Printed per
 * block size: GB/s (10^9 bytes/s), Gbps, block operations/s and the batch
 * latency P50/P99.
 *
 * Memory: each thread owns an equal slice of the local pool and of the
 * remote pool; batch k of a thread uses the blocks that follow batch k-1
 * in its slice (wrapping), so the bytes moved walk through the pools and
 * small blocks do not sit in the CPU cache.
 *
 * --rounds N runs the whole curve N times, one size after the other in
 * every round, and keeps per size the round of median GB/s: on a shared
 * machine, load that drifts during the run then hits every size alike
 * instead of whichever ran at the wrong moment.
 *
 * Claim: at 64 KiB blocks at least 90 % of the 64 MiB
 * throughput. The largest block measured is the estimate a record compares
 * with (its record, below).
 *
 * The link ceiling (docs/performance.md, "Ceilings"): before each block
 * size of each round, `bench link`'s contiguous move of 256 MiB (at most
 * half the pool) on the same peer with the transport's parallelism (tcp:
 * the same connections; shm: a copying thread per worker, and as many
 * such copies at once as te has threads, since a submitting thread may
 * copy its own batch besides the workers), and the same bytes as one
 * operation through the engine; a sample is the faster, the best sample
 * the raw ceiling. Each size also runs, right after its row in every
 * round, its own workload with each batch moved as one contiguous
 * operation (the same threads, the same bytes in flight: on loopback
 * the bytes in flight decide how much the copies hit the caches); the
 * size's ceiling is the better of its best such round and the raw one.
 * Each row is printed as a share of its ceiling, and a row above 105 %
 * is reported as a ceiling that did not bound it.
 */
#include "tools/bench/te.h"
#include "tools/cli/opts.h"
#include "tools/bench/env.h"
#include "tools/bench/out.h"
#include "tools/record/record.h"

#include "core/time.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

static int kvf_te_add_block(kvf_te_opts_t *o, uint64_t b)
{
    if (b == 0 || o->nblocks >= KVF_TE_BLOCKS_MAX) {
        fprintf(stderr, "kvferry: at most %d block sizes, each > 0\n",
                KVF_TE_BLOCKS_MAX);
        return -1;
    }
    o->blocks[o->nblocks++] = b;
    return 0;
}

static int kvf_te_parse(int argc, char **argv, kvf_te_opts_t *o)
{
    uint64_t bmin = 4096, bmax = 64ull << 20, b;
    int rc, listed = 0, op_i = KVF_OP_WRITE;
    kvf_opt_sizes_t list = {o->blocks, &o->nblocks, KVF_TE_BLOCKS_MAX};
    const kvf_opt_t opts[] = {
        {"target", 0, KVF_OPT_STR, &o->s.target, "HOST:PORT",
         "a running `kvferry target`", "spawn one on 127.0.0.1"},
        {"pool", 0, KVF_OPT_SIZE, &o->s.pool, "SIZE", "pool on each side",
         "1G"},
        {"block-sizes", 0, KVF_OPT_SIZES, &list, "LIST", "block sizes",
         "4K..64M doubling", .seen = &listed},
        {"block-min", 0, KVF_OPT_SIZE, &bmin, "SIZE",
         "smallest block of the doubling", "4K"},
        {"block-max", 0, KVF_OPT_SIZE, &bmax, "SIZE",
         "largest block of the doubling", "64M"},
        {"batch", 0, KVF_OPT_UINT, &o->batch, "N", "blocks per batch", "32",
         .min = 1, .max = 65536},
        {"threads", 0, KVF_OPT_UINT, &o->threads, "N",
         "threads submitting concurrently", "2", .min = 1,
         .max = KVF_TE_THREADS_MAX},
        {"duration", 0, KVF_OPT_MS64, &o->duration_ms, "TIME", "per block size",
         "1s"},
        {"min-batches", 0, KVF_OPT_UINT, &o->min_batches, "N",
         "per thread and block size", "3", .min = 1, .max = 1000000},
        {"rounds", 0, KVF_OPT_UINT, &o->rounds, "N",
         "run the curve N times, sizes interleaved; each size keeps\n"
         "its median round",
         "1", .min = 1, .max = KVF_TE_ROUNDS_MAX},
        {"no-link", 0, KVF_OPT_CLEAR, &o->link, NULL,
         "skip the link ceiling"},
        {"no-inline", 0, KVF_OPT_FLAG, &o->no_inline, NULL,
         "never move a request on the submitting thread (default:\n"
         "KVF_BATCH_INLINE, as each thread waits for its batch at once)"},
        {"op", 0, KVF_OPT_CHOICE, &op_i, NULL, "direction", "write",
         "read|write"},
        {"conns", 0, KVF_OPT_UINT, &o->s.conns, "N", "connections", "4",
         .min = 1, .max = 64},
        {"timeout", 0, KVF_OPT_MS, &o->s.timeout_ms, "MS",
         "bound on each batch wait", "30s"},
        {"transport", 0, KVF_OPT_STR, &o->s.transports, "NAME",
         "force a transport", "auto"},
        {"json", 0, KVF_OPT_STR, &o->json, "FILE",
         "results as JSON ('-' = stdout)"},
        {"record", 0, KVF_OPT_STR, &o->record, "DIR",
         "write a record (Markdown + JSON) into DIR"},
        {"hypothesis", 0, KVF_OPT_STR, &o->hypothesis, "TEXT",
         "the record's hypothesis"},
        {"expect", 0, KVF_OPT_FN, &o->expect, "RULE",
         "a claim to check, e.g. small_pct>=90 (repeatable); figures:\n"
         "[TRANSPORT.]gb_s per block size, small_pct (64 KiB blocks as %\n"
         "of the largest block's GB/s)",
         "small_pct>=90", .fn = kvf_bench_expect_opt},
        {"strict", 0, KVF_OPT_FLAG, &o->strict, NULL,
         "exit 1 when a claim is missed (default: exit 0 once measured)"},
        {0},
    };
    const kvf_cmd_spec_t spec = {
        "kvferry bench te [options]",
        "The transfer engine's throughput curve over block size: every\n"
        "thread submits batches of random blocks and waits for each.",
        opts, .progress = 1};

    memset(o, 0, sizeof(*o));
    o->s.pool = 1ull << 30;
    o->s.conns = 4;
    o->s.timeout_ms = 30000;
    o->s.seed = 1;
    o->batch = 32;
    o->threads = 2;
    o->duration_ms = 1000;
    o->min_batches = 3;
    o->rounds = 1;
    o->link = 1;
    o->op = KVF_OP_WRITE;
    rc = kvf_opts_parse(&spec, argc, argv, NULL);
    if (rc >= 0) {
        return rc == KVF_CLI_OK ? -1 : rc;
    }
    o->op = (kvf_op_type_t)op_i;
    if (!listed) {
        if (bmin == 0 || bmax < bmin) {
            fprintf(stderr, "kvferry: need 0 < --block-min <= --block-max\n");
            return KVF_CLI_USAGE;
        }
        for (b = bmin; b <= bmax; b *= 2) {
            if (kvf_te_add_block(o, b) != 0) {
                return KVF_CLI_USAGE;
            }
        }
    }
    if (o->nblocks == 0) {
        fprintf(stderr, "kvferry: no block sizes\n");
        return KVF_CLI_USAGE;
    }
    return 0;
}

typedef struct kvf_te_thread {
    const kvf_te_opts_t *o;
    kvf_bench_session_t *s;
    pthread_t tid;
    uint64_t block;
    char *local;     /* this thread's slice of the local pool */
    uint64_t remote; /* and of the remote pool */
    uint64_t lslots, rslots;
    uint64_t start_ns, deadline_ns, end_ns;
    uint64_t batches, bytes;
    double *lat_ms; /* batch latencies, up to lat_cap kept */
    size_t nlat, lat_cap;
    kvf_op_t *ops;
    int contig; /* the ceiling's run: each batch as one contiguous op */
    kvf_status_t status;
} kvf_te_thread_t;

/* One batch: blocks k*batch .. of the slices (wrapping), submit, wait. */
static kvf_status_t kvf_te_batch(kvf_te_thread_t *t, uint64_t k, double *ms_p)
{
    const kvf_te_opts_t *o = t->o;
    kvf_batch_h batch;
    kvf_status_t status;
    uint64_t i, t0, nops = o->batch;

    if (t->contig) {
        /* the same bytes in flight as one operation: batch consecutive
         * blocks of the slice, never wrapping */
        uint64_t span = t->lslots < t->rslots ? t->lslots : t->rslots;
        uint64_t b0 = span > o->batch ? (k * o->batch) % (span - o->batch + 1)
                                      : 0;

        t->ops[0].type = o->op;
        t->ops[0].local = t->local + b0 * t->block;
        t->ops[0].peer = t->s->peer;
        t->ops[0].remote = t->remote + b0 * t->block;
        t->ops[0].length = t->block * (span < o->batch ? span : o->batch);
        nops = 1;
    }
    for (i = 0; i < o->batch && !t->contig; i++) {
        uint64_t n = k * o->batch + i;

        t->ops[i].type = o->op;
        t->ops[i].local = t->local + (n % t->lslots) * t->block;
        t->ops[i].peer = t->s->peer;
        t->ops[i].remote = t->remote + (n % t->rslots) * t->block;
        t->ops[i].length = t->block;
    }
    t0 = kvf_time_ns();
    status = kvf_batch_submit_ex(t->s->engine, t->ops, nops,
                                 o->no_inline ? 0 : KVF_BATCH_INLINE, &batch);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_batch_wait(batch, (int)o->s.timeout_ms);
    *ms_p = (double)(kvf_time_ns() - t0) / 1e6;
    kvf_batch_destroy(batch);
    return status;
}

static void *kvf_te_thread_main(void *arg)
{
    kvf_te_thread_t *t = arg;
    uint64_t k;
    double ms;

    for (k = 0;; k++) {
        if (k >= t->o->min_batches && kvf_time_ns() >= t->deadline_ns) {
            break;
        }
        t->status = kvf_te_batch(t, k, &ms);
        if (t->status != KVF_OK) {
            break;
        }
        t->batches++;
        t->bytes += (uint64_t)t->o->batch * t->block;
        if (t->nlat < t->lat_cap) {
            t->lat_ms[t->nlat++] = ms;
        }
    }
    t->end_ns = kvf_time_ns();
    return NULL;
}

/* Runs one block size with all threads; fills row. */
static int kvf_te_run_block(const kvf_te_opts_t *o, kvf_bench_session_t *s,
                            uint64_t block, int contig, kvf_te_row_t *row)
{
    kvf_te_thread_t th[KVF_TE_THREADS_MAX];
    uint64_t lslice = s->pool_len / o->threads;
    uint64_t rslice = s->remote_len / o->threads;
    uint64_t start, end = 0, bytes = 0, batches = 0;
    size_t cap = 1u << 20, nlat = 0;
    double *all, ms;
    kvf_status_t status = KVF_OK;
    unsigned i, started = 0;
    int rc = 0;

    if (lslice < block || rslice < block) {
        fprintf(stderr,
                "kvferry: block %lu does not fit a pool slice of "
                "%lu bytes (%u threads)\n",
                (unsigned long)block,
                (unsigned long)(lslice < rslice ? lslice : rslice), o->threads);
        return -1;
    }
    memset(th, 0, sizeof(th));
    for (i = 0; i < o->threads; i++) {
        kvf_te_thread_t *t = &th[i];

        t->o = o;
        t->s = s;
        t->block = block;
        t->contig = contig;
        t->local = s->pool + i * lslice;
        t->remote = s->remote + i * rslice;
        t->lslots = lslice / block;
        t->rslots = rslice / block;
        t->lat_cap = cap / o->threads;
        t->lat_ms = malloc(t->lat_cap * sizeof(double));
        t->ops = calloc(o->batch, sizeof(kvf_op_t));
        if (t->lat_ms == NULL || t->ops == NULL) {
            fprintf(stderr, "kvferry: out of memory\n");
            rc = -1;
        }
    }
    /* warm-up: one batch of this size (connections, page tables) */
    if (rc == 0) {
        status = kvf_te_batch(&th[0], 0, &ms);
        if (status != KVF_OK) {
            fprintf(stderr, "kvferry: warm-up batch: %s\n",
                    kvf_status_str(status));
            rc = -1;
        }
    }
    start = kvf_time_ns();
    for (i = 0; i < o->threads && rc == 0; i++) {
        th[i].start_ns = start;
        th[i].deadline_ns = start + o->duration_ms * 1000000ull;
        if (pthread_create(&th[i].tid, NULL, kvf_te_thread_main, &th[i]) != 0) {
            fprintf(stderr, "kvferry: cannot start a thread\n");
            rc = -1;
            break;
        }
        started++;
    }
    for (i = 0; i < started; i++) {
        pthread_join(th[i].tid, NULL);
        if (th[i].status != KVF_OK && status == KVF_OK) {
            status = th[i].status;
        }
        if (th[i].end_ns > end) {
            end = th[i].end_ns;
        }
        bytes += th[i].bytes;
        batches += th[i].batches;
        nlat += th[i].nlat;
    }
    if (rc == 0 && status != KVF_OK) {
        fprintf(stderr, "kvferry: batch of %u x %lu bytes failed: %s\n",
                o->batch, (unsigned long)block, kvf_status_str(status));
        rc = -1;
    }
    all = (rc == 0) ? malloc((nlat ? nlat : 1) * sizeof(double)) : NULL;
    if (rc == 0 && all != NULL && end > start && batches > 0) {
        double secs = (double)(end - start) / 1e9;

        nlat = 0;
        for (i = 0; i < o->threads; i++) {
            memcpy(all + nlat, th[i].lat_ms, th[i].nlat * sizeof(double));
            nlat += th[i].nlat;
        }
        memset(row, 0, sizeof(*row));
        row->block = block;
        row->batches = batches;
        row->bytes = bytes;
        row->seconds = secs;
        row->gb_s = (double)bytes / secs / 1e9;
        row->gbps = (double)bytes * 8 / secs / 1e9;
        row->ops_s = (double)batches * o->batch / secs;
        row->lat_p99_ms = kvf_bench_quantile(all, nlat, 0.99);
        row->lat_p50_ms = kvf_bench_quantile(all, nlat, 0.5);
    } else if (rc == 0) {
        rc = -1;
    }
    free(all);
    for (i = 0; i < o->threads; i++) {
        free(th[i].lat_ms);
        free(th[i].ops);
    }
    return rc;
}

/* One link test of the ceiling's samples: a contiguous piece of each
 * pool, at a fresh random place (so it does not find its bytes in the
 * CPU caches). */
typedef struct kvf_te_link_job {
    kvf_bench_session_t *s;
    kvf_op_type_t op;
    char *local;
    uint64_t remote, len;
    double secs;
    kvf_status_t st;
} kvf_te_link_job_t;

static void *kvf_te_link_main(void *arg)
{
    kvf_te_link_job_t *j = arg;

    j->st = kvf_peer_link_test(j->s->peer, j->op, j->local, j->remote, j->len,
                               &j->secs);
    return NULL;
}

/* Takes one sample of the ceiling: l->copies link tests at once over
 * disjoint pieces, timed from the first start to the last end. */
static kvf_status_t kvf_te_link_sample(const kvf_te_opts_t *o,
                                       kvf_bench_session_t *s,
                                       kvf_te_link_t *l, uint64_t *seed)
{
    kvf_te_link_job_t jobs[KVF_TE_THREADS_MAX];
    pthread_t tid[KVF_TE_THREADS_MAX];
    uint64_t per = (l->bytes / l->copies) & ~(uint64_t)4095, t0, span;
    uint64_t lmax = s->pool_len - l->bytes, rmax = s->remote_len - l->bytes;
    uint64_t loff, roff;
    kvf_status_t st = KVF_OK;
    unsigned i, started = 0;
    double secs;

    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    loff = ((*seed >> 20) % (lmax / 4096 + 1)) * 4096;
    roff = ((*seed >> 8) % (rmax / 4096 + 1)) * 4096;
    span = per * l->copies;
    t0 = kvf_time_ns();
    for (i = 0; i < l->copies; i++) {
        jobs[i] = (kvf_te_link_job_t){s, o->op, s->pool + loff + i * per,
                                      s->remote + roff + i * per, per, 0,
                                      KVF_OK};
        if (l->copies == 1) {
            kvf_te_link_main(&jobs[i]);
        } else if (pthread_create(&tid[i], NULL, kvf_te_link_main, &jobs[i]) !=
                   0) {
            st = KVF_ERR_NO_RESOURCE;
            break;
        }
        started++;
    }
    for (i = 0; i < started && l->copies > 1; i++) {
        pthread_join(tid[i], NULL);
    }
    secs = (double)(kvf_time_ns() - t0) / 1e9;
    if (l->copies == 1) {
        secs = jobs[0].secs; /* the copy alone, as `bench link` times it */
    }
    for (i = 0; i < started && st == KVF_OK; i++) {
        st = jobs[i].st;
    }
    if (st == KVF_OK) { /* and the whole span as one engine operation */
        double eng = 0;
        kvf_op_t one = {o->op, s->pool + loff, s->peer, s->remote + roff, span};
        kvf_batch_h b;

        t0 = kvf_time_ns();
        st = kvf_batch_submit(s->engine, &one, 1, &b);
        if (st == KVF_OK) {
            st = kvf_batch_wait(b, (int)o->s.timeout_ms);
            eng = (double)(kvf_time_ns() - t0) / 1e9;
            kvf_batch_destroy(b);
        }
        secs = (st == KVF_OK && eng < secs) ? eng : secs;
    }
    if (st == KVF_OK && secs > 0) {
        secs *= (double)l->bytes / (double)span;
        l->best_s = (l->n == 0 || secs < l->best_s) ? secs : l->best_s;
        l->n++;
    }
    return st;
}

/* The ceiling's set-up for this run: 256 MiB a sample (at most half a
 * pool); shm copies on each te thread at once (see the top comment). */
static void kvf_te_link_init(const kvf_te_opts_t *o, kvf_bench_session_t *s,
                             kvf_te_link_t *l)
{
    uint64_t half = (s->pool_len < s->remote_len ? s->pool_len
                                                 : s->remote_len) / 2;

    memset(l, 0, sizeof(*l));
    l->bytes = half < (256ull << 20) ? half & ~(uint64_t)4095 : 256ull << 20;
    l->copies = strcmp(kvf_peer_transport(s->peer), "shm") == 0 ? o->threads
                                                                 : 1;
    if (l->bytes / l->copies < 4096) {
        l->copies = 1;
    }
}

/* The ceiling in GB/s (10^9 bytes/s, as te's rows), 0 when unmeasured. */
static double kvf_te_link_gb_s(const kvf_te_link_t *l)
{
    return l->n > 0 && l->best_s > 0 ? (double)l->bytes / l->best_s / 1e9 : 0;
}

/* The columns of a row, declared once for the text table, the JSON rows
 * and the record. */
static const kvf_out_col_t kvf_te_cols[] = {
    {"block_bytes", NULL, "bytes", "%lld", .kind = KVF_OUT_INT},
    {"block", "block", NULL, "%9s", .kind = KVF_OUT_STR, .width = 9,
     .nojson = 1},
    {"batch", "batch", NULL, "%6lld", .kind = KVF_OUT_INT, .width = 6},
    {"threads", "threads", NULL, "%7lld", .kind = KVF_OUT_INT, .width = 7},
    {"batches", NULL, NULL, "%lld", .kind = KVF_OUT_INT},
    {"bytes", NULL, "bytes", "%lld", .kind = KVF_OUT_INT},
    {"seconds", NULL, "s", "%.3f"},
    {"gb_s", "GB/s", "GB/s", "%9.3f", .width = 9,
     .fig = "blocks (batch latency ms)", .p50 = "lat_ms_p50",
     .p99 = "lat_ms_p99", .series = "GB/s over block size"},
    {"gbps", "Gbps", "Gbps", "%9.2f", .width = 9},
    {"ops_s", "ops/s", "block operations/s", "%11.0f", .width = 11,
     .series = "ops/s over block size"},
    {"lat_ms_p50", "lat P50 ms", "ms", "%12.3f", .width = 12},
    {"lat_ms_p99", "lat P99 ms", "ms", "%12.3f", .width = 12},
    {"ratio_to_largest", NULL, "ratio", "%.3f"},
    {"link_pct", "% link", "% of the link ceiling", "%6.1f", .width = 6},
};

typedef struct kvf_te_ctx {
    const kvf_te_opts_t *o;
    const char *transport;
    const kvf_te_verdict_t *v;
} kvf_te_ctx_t;

static void kvf_te_table_init(kvf_out_table_t *t)
{
    kvf_out_init(t, kvf_te_cols, sizeof(kvf_te_cols) / sizeof(kvf_te_cols[0]));
    t->aligned = 1;
    t->x_key = "block_bytes";
    t->x_label = "block bytes";
}

/* Adds a measured row (ratio_to_largest follows once all are known). */
static void kvf_te_table_row(kvf_out_table_t *t, const kvf_te_opts_t *o,
                             const kvf_te_row_t *r)
{
    const char *op = o->op == KVF_OP_WRITE ? "write" : "read";
    char bstr[32], label[64];

    kvf_fmt_size(r->block, bstr, sizeof(bstr));
    snprintf(label, sizeof(label), "%s %s", op, bstr);
    kvf_out_row(t, label, op);
    kvf_out_num(t, "block_bytes", (double)r->block);
    kvf_out_str(t, "block", bstr);
    kvf_out_num(t, "batch", o->batch);
    kvf_out_num(t, "threads", o->threads);
    kvf_out_num(t, "batches", (double)r->batches);
    kvf_out_num(t, "bytes", (double)r->bytes);
    kvf_out_num(t, "seconds", r->seconds);
    kvf_out_num(t, "gb_s", r->gb_s);
    kvf_out_num(t, "gbps", r->gbps);
    kvf_out_num(t, "ops_s", r->ops_s);
    kvf_out_num(t, "lat_ms_p50", r->lat_p50_ms);
    kvf_out_num(t, "lat_ms_p99", r->lat_p99_ms);
}

/* The run's configuration: the members before "rows". */
static void kvf_te_json_head(kvf_json_t *j, void *ctx)
{
    const kvf_te_ctx_t *c = ctx;
    const kvf_te_opts_t *o = c->o;

    kvf_json_str(j, "bench", "te");
    kvf_json_str(j, "transport", c->transport);
    kvf_json_str(j, "op", o->op == KVF_OP_WRITE ? "write" : "read");
    kvf_json_int(j, "batch", o->batch);
    kvf_json_int(j, "threads", o->threads);
    kvf_json_int(j, "duration_ms", (long long)o->duration_ms);
    kvf_json_int(j, "min_batches", o->min_batches);
    kvf_json_int(j, "rounds", o->rounds);
    kvf_bench_busy_json(j, &o->busy);
    kvf_json_bool(j, "inline", !o->no_inline);
    kvf_json_int(j, "conns", o->s.conns);
    kvf_json_int(j, "pool_bytes", (long long)o->s.pool);
}

/* The claim's check: the member after "rows". */
static void kvf_te_json_tail(kvf_json_t *j, void *ctx)
{
    const kvf_te_verdict_t *v = ((const kvf_te_ctx_t *)ctx)->v;

    kvf_json_obj(j, "target");
    kvf_json_int(j, "check_block_bytes", (long long)v->check_block);
    kvf_json_int(j, "ref_block_bytes", (long long)v->ref_block);
    kvf_json_num(j, "ratio", v->ratio);
    kvf_json_num(j, "required", KVF_TE_TARGET);
    kvf_json_str(j, "verdict", v->conclusion);
    kvf_json_end_obj(j);
}

/* The claim's check: the row of 64 KiB (or the smallest block >= 64 KiB)
 * against the largest block measured. */
void kvf_te_judge(const kvf_te_row_t *rows, unsigned nrows, kvf_te_verdict_t *v)
{
    const kvf_te_row_t *ref = NULL, *chk = NULL;
    unsigned i;

    memset(v, 0, sizeof(*v));
    for (i = 0; i < nrows; i++) {
        if (ref == NULL || rows[i].block > ref->block) {
            ref = &rows[i];
        }
        if (rows[i].block >= KVF_TE_CHECK_BLOCK &&
            (chk == NULL || rows[i].block < chk->block)) {
            chk = &rows[i];
        }
    }
    v->conclusion = "does not hold";
    if (ref == NULL) {
        return;
    }
    v->ref_block = ref->block;
    v->ref_gb_s = ref->gb_s;
    if (chk == NULL || chk == ref) {
        v->conclusion = "holds under conditions";
        v->ratio = -1;
        return;
    }
    v->check_block = chk->block;
    v->ratio = ref->gb_s > 0 ? chk->gb_s / ref->gb_s : 0;
    if (v->ratio >= KVF_TE_TARGET) {
        v->conclusion =
            chk->block == KVF_TE_CHECK_BLOCK && ref->block >= (64ull << 20)
                ? "holds"
                : "holds under conditions";
    }
}

static int kvf_te_cmp_gb_s(const void *a, const void *b)
{
    double x = ((const kvf_te_row_t *)a)->gb_s;
    double y = ((const kvf_te_row_t *)b)->gb_s;

    return (x > y) - (x < y);
}

int kvf_cmd_bench_te(int argc, char **argv)
{
    static kvf_te_row_t runs[KVF_TE_BLOCKS_MAX][KVF_TE_ROUNDS_MAX];
    kvf_te_row_t rows[KVF_TE_BLOCKS_MAX] = {{0}};
    kvf_te_link_t link;
    kvf_te_row_t cr;
    double ceil_gb_s[KVF_TE_BLOCKS_MAX] = {0};
    uint64_t seed = 4242;
    double link_gb_s;
    unsigned round;
    kvf_te_opts_t o;
    kvf_te_verdict_t v;
    kvf_bench_session_t s;
    const char *transport;
    char bstr[32], pstr[32], name[96];
    unsigned k, nrows = 0;
    int rc, bad = 0;
    kvf_progress_t prog;
    kvf_out_table_t t;
    kvf_te_ctx_t ctx;

    rc = kvf_te_parse(argc, argv, &o);
    if (rc != 0) {
        kvf_expect_free(o.expect);
        return rc < 0 ? KVF_CLI_OK : rc;
    }
    kvf_fmt_size(o.s.pool, pstr, sizeof(pstr));
    kvf_progress_begin(&prog, "bench te", o.rounds * o.nblocks,
                       o.rounds * o.nblocks);
    kvf_progress_note(&prog, "preparing two %s pools (random bytes)%s", pstr,
                      o.s.target != NULL ? "" : " and a target process");
    if (kvf_bench_expect(&o.expect) == NULL ||
        kvf_bench_session_open(&o.s, &s) != 0) {
        kvf_progress_end(&prog);
        kvf_expect_free(o.expect);
        return KVF_CLI_FAIL;
    }
    transport = kvf_peer_transport(s.peer);
    kvf_te_link_init(&o, &s, &link);
    kvf_progress_clear(&prog);
    printf("bench=te transport=%s op=%s batch=%u threads=%u duration=%lums "
           "conns=%u pool=%s\n",
           transport, o.op == KVF_OP_WRITE ? "write" : "read", o.batch,
           o.threads, (unsigned long)o.duration_ms, o.s.conns, pstr);
    kvf_te_table_init(&t);
    kvf_out_text_header(&t, stdout);
    for (round = 0; round < o.rounds && !bad; round++) {
        for (k = 0; k < o.nblocks; k++) {
            kvf_fmt_size(o.blocks[k], bstr, sizeof(bstr));
            kvf_progress_step(&prog, "%s%s blocks for %lu ms over %s",
                              o.op == KVF_OP_WRITE ? "write " : "read ", bstr,
                              (unsigned long)o.duration_ms, transport);
            if (o.link && kvf_te_link_sample(&o, &s, &link, &seed) != KVF_OK) {
                fprintf(stderr, "kvferry: link test failed\n");
                bad = 1;
                break;
            }
            if (kvf_te_run_block(&o, &s, o.blocks[k], 0, &runs[k][round]) !=
                    0 ||
                (o.link && kvf_te_run_block(&o, &s, o.blocks[k], 1, &cr) != 0)) {
                bad = 1;
                break;
            }
            if (o.link && cr.gb_s > ceil_gb_s[k]) {
                ceil_gb_s[k] = cr.gb_s;
            }
            kvf_progress_done(&prog, 1);
            if (o.rounds > 1) {
                kvf_progress_clear(&prog);
                fprintf(stderr, "round %u: %s %.3f GB/s\n", round + 1, bstr,
                        runs[k][round].gb_s);
            }
        }
    }
    o.busy = kvf_progress_end(&prog);
    link_gb_s = kvf_te_link_gb_s(&link);
    for (k = 0; k < o.nblocks && !bad; k++) {
        kvf_te_row_t *r = &rows[nrows];

        qsort(runs[k], o.rounds, sizeof(kvf_te_row_t), kvf_te_cmp_gb_s);
        *r = runs[k][o.rounds / 2];
        kvf_fmt_size(r->block, bstr, sizeof(bstr));
        kvf_te_table_row(&t, &o, r);
        if (link_gb_s > 0) {
            /* this size's ceiling: the raw link, or its own batches as
             * contiguous operations, whichever moved more */
            double c = ceil_gb_s[k] > link_gb_s ? ceil_gb_s[k] : link_gb_s;

            kvf_out_set(&t, t.nrows - 1, "link_pct", 100.0 * r->gb_s / c);
            kvf_expect_figure(o.expect, "link_pct", 100.0 * r->gb_s / c, bstr);
        }
        kvf_out_text_row(&t, t.nrows - 1, stdout);
        kvf_expect_figure(o.expect, "gb_s", r->gb_s, bstr);
        snprintf(name, sizeof(name), "%s.gb_s", transport);
        kvf_expect_figure(o.expect, name, r->gb_s, bstr);
        nrows++;
    }
    kvf_te_judge(rows, nrows, &v);
    for (k = 0; k < nrows; k++) {
        kvf_out_set(&t, k, "ratio_to_largest",
                    v.ref_gb_s > 0 ? rows[k].gb_s / v.ref_gb_s : 0);
    }
    if (link_gb_s > 0) {
        kvf_fmt_size(link.bytes, bstr, sizeof(bstr));
        printf("%% link = share of the size's ceiling: the better of its own "
               "batches moved as contiguous operations (same threads, same "
               "bytes in flight, best round) and the raw link = %.3f GB/s, "
               "the best of %u contiguous moves of %s interleaved with the "
               "sizes (%s)\n",
               link_gb_s, link.n, bstr,
               link.copies > 1 ? "shm: one copying thread per worker, on "
                                 "each te thread at once"
               : strcmp(transport, "tcp") == 0
                   ? "tcp: one stream per connection, the same connections"
                   : "the transport's own parallelism");
    }
    if (v.ratio >= 0 && v.check_block > 0) {
        char cstr[32];

        kvf_fmt_size(v.check_block, cstr, sizeof(cstr));
        kvf_fmt_size(v.ref_block, bstr, sizeof(bstr));
        snprintf(name, sizeof(name), "%s vs %s", cstr, bstr);
        kvf_expect_figure(o.expect, "small_pct", 100.0 * v.ratio, name);
    }
    {
        static const char *const defaults[] = {"small_pct>=90",
                                               "link_pct<=105", NULL};

        bad |= kvf_bench_finish(&o.expect, defaults,
                                o.json && !strcmp(o.json, "-"), &o.busy) > 0 &&
               o.strict;
    }
    ctx.o = &o;
    ctx.transport = transport;
    ctx.v = &v;
    t.json_tail = kvf_te_json_tail;
    if (o.json != NULL) {
        FILE *f = kvf_json_file_open(o.json);

        if (f == NULL) {
            bad = 1;
        } else {
            kvf_out_json_doc(&t, f, kvf_te_json_head, &ctx);
            kvf_json_file_close(f);
        }
    }
    if (o.record != NULL && nrows > 0 &&
        kvf_te_record(&o, transport, &t, &v) != 0) {
        bad = 1;
    }
    kvf_out_free(&t);
    kvf_bench_session_close(&s);
    return bad ? KVF_CLI_FAIL : KVF_CLI_OK;
}

/*
 * The record of `kvferry bench te --record DIR` (seed 003 §5): key
 * figures per block size (GB/s with the batch latency P50/P99), the curve
 * GB/s over block size, the estimate (throughput of the largest block,
 * measured in the same run), the gap at 64 KiB and the conclusion against
 * the claim (64 KiB blocks >= 90 % of the 64 MiB throughput).
 */

int kvf_te_record(const kvf_te_opts_t *o, const char *transport,
                  const kvf_out_table_t *t, const kvf_te_verdict_t *v)
{
    char name[96], text[512], bstr[32], cstr[32];
    const char *op = o->op == KVF_OP_WRITE ? "write" : "read";
    kvf_te_ctx_t ctx = {o, transport, v};
    kvf_record_t *rec;
    int rc;

    snprintf(name, sizeof(name), "bench te (%s, %s)", transport, op);
    rec = kvf_record_new(
        "bench", name,
        "small blocks do not collapse: at 64 KiB blocks the engine moves at "
        "least 90 % of what it moves at 64 MiB blocks");
    if (rec == NULL) {
        return -1;
    }
    kvf_record_hypothesis(rec, o->hypothesis);
    kvf_record_config(rec, "transport", transport);
    kvf_record_config(rec, "op", op);
    kvf_record_config_num(rec, "batch", o->batch);
    kvf_record_config_num(rec, "threads", o->threads);
    kvf_record_config_num(rec, "duration_ms", (double)o->duration_ms);
    kvf_record_config_num(rec, "min_batches", o->min_batches);
    kvf_record_config_num(rec, "rounds", o->rounds);
    kvf_record_config(rec, "inline",
                      o->no_inline ? "no"
                                   : "KVF_BATCH_INLINE (one request "
                                     "of each batch may move on the "
                                     "submitting thread)");
    kvf_record_config_num(rec, "conns", o->s.conns);
    kvf_record_config_num(rec, "pool_bytes", (double)o->s.pool);
    kvf_record_config(rec, "target",
                      o->s.target ? o->s.target : "spawned on 127.0.0.1");
    kvf_bench_busy_text(&o->busy, text, sizeof(text));
    kvf_record_config(rec, "machine", text);
    kvf_record_config(rec, "workload",
                      "each thread submits its own batches of consecutive "
                      "blocks of its pool slice (wrapping) and waits for "
                      "each; GB/s = 10^9 bytes/s over the wall time of all "
                      "threads");
    kvf_fmt_size(v->ref_block, bstr, sizeof(bstr));
    snprintf(text, sizeof(text),
             "throughput at %s blocks, measured in the same run "
             "(transport %s)",
             bstr, transport);
    kvf_record_estimate(rec, v->ref_gb_s, "GB/s", text);
    if (v->ratio >= 0 && v->check_block > 0) {
        kvf_fmt_size(v->check_block, cstr, sizeof(cstr));
        snprintf(text, sizeof(text),
                 "%s blocks reach %.1f %% of the %s throughput%s", cstr,
                 100.0 * v->ratio, bstr,
                 v->ratio < 1.0
                     ? "; the rest is per-block and per-batch cost "
                       "(request headers, completions, wake-ups) that "
                       "large blocks amortize"
                     : "; large blocks gain nothing over them here");
        kvf_record_gap(rec, v->ratio, text);
        snprintf(text, sizeof(text),
                 "%s blocks at %.1f %% of %s blocks (>= %.0f %% required)%s",
                 cstr, 100.0 * v->ratio, bstr, 100.0 * KVF_TE_TARGET,
                 strcmp(v->conclusion, "holds under conditions") == 0
                     ? "; the curve did not span 64 KiB .. 64 MiB"
                     : "");
    } else {
        snprintf(text, sizeof(text),
                 "no block size >= 64 KiB below the largest (%s) was "
                 "measured, so the target could not be checked",
                 bstr);
    }
    kvf_record_conclude(rec, v->conclusion, text);
    kvf_record_not_verified(rec, "bytes are not verified by `bench te` "
                                 "(`bench blocks --verify` checks them)");
    kvf_record_not_verified(rec, "one peer on the same host; a remote "
                                 "peer adds the NIC and the network");
    kvf_record_not_verified(rec, "other transports: run again with "
                                 "--transport NAME");
    kvf_out_record(t, rec, kvf_te_json_head, &ctx);
    rc = kvf_env_record_write(rec, o->record);
    kvf_record_free(rec);
    return rc;
}
