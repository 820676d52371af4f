/*
 * Shared machinery of the `kvferry bench` commands: a session (local
 * engine + pool, a peer reached either at --target or in a target process
 * spawned on loopback) and statistics.
 */
#ifndef KVF_TOOLS_BENCH_H
#define KVF_TOOLS_BENCH_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/bench/bench.h is private to tools/"
#endif

#include "tools/cli/cli.h"
#include "tools/cli/opts.h"
#include "tools/cli/progress.h"
#include "tools/record/expect.h"
#include "tools/record/json.h"

#include <kvferry/perf.h>

#include <stdio.h>
#include <sys/types.h>

typedef struct kvf_bench_session_opts {
    const char *target; /* "HOST:PORT", or NULL to spawn one */
    uint64_t pool;      /* local pool bytes (and spawned target's) */
    unsigned conns;
    unsigned timeout_ms;
    const char *transports; /* NULL = auto */
    const char *vs;         /* a second transport to compare, or NULL */
    uint64_t seed;
} kvf_bench_session_opts_t;

typedef struct kvf_bench_session {
    kvf_engine_h engine;
    kvf_region_h region;
    char *pool;
    uint64_t pool_len;
    kvf_peer_h peer;
    uint64_t remote; /* remote pool address */
    uint64_t remote_len;
    pid_t child; /* spawned target, or 0 */
    char segment[280];
    /* --vs: the same pool and peer through a second engine forced to
     * another transport, so both are measured in the same run */
    kvf_engine_h vs_engine;
    kvf_region_h vs_region;
    kvf_peer_h vs_peer;
} kvf_bench_session_t;

int kvf_bench_session_open(const kvf_bench_session_opts_t *o,
                           kvf_bench_session_t *s);
void kvf_bench_session_close(kvf_bench_session_t *s);

/* Spawns `kvferry target --pool P` on 127.0.0.1 and reads its segment
 * name; the child dies with this process. */
int kvf_bench_spawn_target(uint64_t pool, const char *transports, pid_t *pid_p,
                           char *segment, size_t seglen);

/* --expect RULE, repeatable: adds a rule to *(kvf_expect_t **)opt->dest
 * (created on first use). */
int kvf_bench_expect_opt(const kvf_opt_t *opt, const char *value);
/* The rule set after parsing (created when no --expect was given). */
kvf_expect_t *kvf_bench_expect(kvf_expect_t **e);
/* Adds the bench's default rules (NULL-terminated; those of a claim this
 * run did not measure stay silent), prints one verdict line per rule on
 * stdout (stderr when stdout carries JSON) and frees the set. Returns the
 * number of rules missed. */
int kvf_bench_verdicts(kvf_expect_t **e, const char *const *defaults,
                       int json_on_stdout);

/* The busy figures of a run as JSON fields ("busy", "load_avg", "cores",
 * "steal_pct") of the open object, and as a record's config line. */
void kvf_bench_busy_json(kvf_json_t *j, const kvf_busy_t *b);
void kvf_bench_busy_text(const kvf_busy_t *b, char *out, size_t len);
/* The end of a bench: verdicts (kvf_bench_verdicts), then the busy note
 * on the same stream. Returns the number of rules missed. */
int kvf_bench_finish(kvf_expect_t **e, const char *const *defaults,
                     int json_on_stdout, const kvf_busy_t *b);

/* Sorts in place and returns the q-quantile (0..1). */
double kvf_bench_quantile(double *v, size_t n, double q);

/* One sample of a path's ceiling (docs/performance.md, "Ceilings"): len
 * contiguous bytes at local/remote moved twice, by `bench link`'s raw
 * test (kvf_peer_link_test: the transport's parallelism, no requests)
 * and as one operation through engine and peer (the engine cuts it
 * into requests over the same connections or workers, with no per-block
 * cost); *secs_p is the faster of the two. */
kvf_status_t kvf_bench_ceiling_sample(kvf_engine_h engine, kvf_peer_h peer,
                                      kvf_op_type_t op, char *local,
                                      uint64_t remote, uint64_t len,
                                      unsigned timeout_ms, double *secs_p);

#endif
