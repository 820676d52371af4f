/*
 * Private to `kvferry bench te` (te.c runs the curve and writes its
 * record): options, one row per block size, and the verdict against the
 * claim that small blocks keep up.
 */
#ifndef KVF_TOOLS_BENCH_TE_H
#define KVF_TOOLS_BENCH_TE_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/bench/te.h is private to tools/"
#endif

#include "tools/bench/bench.h"
#include "tools/bench/out.h"

#define KVF_TE_BLOCKS_MAX  32
#define KVF_TE_THREADS_MAX 64
#define KVF_TE_ROUNDS_MAX  15
#define KVF_TE_CHECK_BLOCK (64ull << 10) /* 64 KiB blocks ... */
#define KVF_TE_TARGET      0.9           /* ... at >= 90 % of the largest */

typedef struct kvf_te_opts {
    kvf_bench_session_opts_t s;
    uint64_t blocks[KVF_TE_BLOCKS_MAX];
    unsigned nblocks;
    unsigned batch;
    unsigned threads;
    uint64_t duration_ms;
    unsigned min_batches;
    unsigned rounds; /* the curve this many times; median round per size */
    int no_inline;   /* submit without KVF_BATCH_INLINE */
    int link;        /* measure the link ceiling (default on) */
    kvf_op_type_t op;
    const char *json;
    const char *record;
    const char *hypothesis;
    kvf_expect_t *expect; /* --expect rules (plus the defaults) */
    int strict;           /* a missed rule fails the command */
    kvf_busy_t busy;      /* how busy the machine was during the run */
} kvf_te_opts_t;

typedef struct kvf_te_row {
    uint64_t block;
    uint64_t batches;
    uint64_t bytes;
    double seconds;
    double gb_s; /* 10^9 bytes per second */
    double gbps;
    double ops_s;                  /* block operations per second */
    double lat_p50_ms, lat_p99_ms; /* per batch */
} kvf_te_row_t;

/* The link ceiling of a run: samples taken before each block size of
 * each round; the ceiling is the best. */
typedef struct kvf_te_link {
    uint64_t bytes; /* per sample */
    unsigned copies; /* link tests at once (shm: one per thread) */
    double best_s;   /* fastest sample, 0 before any */
    unsigned n;      /* samples taken */
} kvf_te_link_t;

typedef struct kvf_te_verdict {
    uint64_t ref_block; /* largest block measured: the estimate */
    double ref_gb_s;
    uint64_t check_block; /* 64 KiB, or the smallest block above it */
    double ratio;         /* check / ref; -1 when not measured */
    const char *conclusion;
} kvf_te_verdict_t;

void kvf_te_judge(const kvf_te_row_t *rows, unsigned nrows,
                  kvf_te_verdict_t *v);
/* Writes the record of a run (the rows of table t) into o->record; 0 on
 * success. */
int kvf_te_record(const kvf_te_opts_t *o, const char *transport,
                  const kvf_out_table_t *t, const kvf_te_verdict_t *v);

#endif
