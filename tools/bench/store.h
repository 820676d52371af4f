/*
 * Shared pieces of `kvferry bench store` and `kvferry bench load`: a store
 * cluster (a master and nodes spawned on 127.0.0.1 as child processes, or
 * an existing master), result rows, and the Redis comparison
 * (store_redis.c: redis-server and redis-benchmark run with the
 * same value size and concurrency in the same run).
 */
#ifndef KVF_TOOLS_BENCH_STORE_H
#define KVF_TOOLS_BENCH_STORE_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/bench/store.h is private to tools/"
#endif

#include "tools/bench/bench.h"

#include <kvferry/store.h>

#include <sys/types.h>

#define KVF_BS_NODES_MAX 8
#define KVF_BS_ROWS_MAX  512

typedef struct kvf_bs_cluster {
    char master[128];
    char http[128];
    pid_t pids[1 + KVF_BS_NODES_MAX];
    unsigned nprocs;
    unsigned nodes;
    uint64_t pool;
} kvf_bs_cluster_t;

/* Spawns `kvferry master` and `nodes` x `kvferry node --pool pool` on
 * 127.0.0.1 (they die with this process). Returns 0 on success. */
int kvf_bs_cluster_start(kvf_bs_cluster_t *c, unsigned nodes, uint64_t pool);
/* The same, each node with the extra arguments (NULL-terminated, at most
 * 8; NULL: none). */
int kvf_bs_cluster_start_args(kvf_bs_cluster_t *c, unsigned nodes,
                              uint64_t pool, const char *const *extra);
/* `bench store --working-set` (store_ws.c). */
int kvf_cmd_bench_store_ws(int argc, char **argv);
void kvf_bs_cluster_stop(kvf_bs_cluster_t *c);

/* One measured row: an operation at one size and concurrency. */
typedef struct kvf_bs_row {
    char op[16];     /* put, get, get-hit, get-miss, SET, GET ... */
    char system[16]; /* kvferry or redis */
    uint64_t size;
    unsigned clients;
    unsigned rep; /* repetition (--repeat) */
    long ops;
    long errors;
    double seconds;        /* wall time */
    double start_s, end_s; /* the phase's start and end, Unix time (runs
                              of several processes line up by them) */
    double ops_s;
    double gb_s; /* 10^9 bytes/s of values */
    double p50_us, p99_us, p999_us;
    /* CPU time (user + system) per operation of every process of the
     * system under test: kvferry = this process (client threads) plus
     * the spawned master and nodes; redis = redis-server plus
     * redis-benchmark. -1: not measured (an external --master). */
    double cpu_us_op;
} kvf_bs_row_t;

/* Options of `bench store`. */
typedef struct kvf_bs_opts {
    const char *master;
    unsigned nodes;
    uint64_t pool;
    uint64_t sizes[16];
    unsigned nsizes;
    unsigned clients[16];
    unsigned nclients;
    uint64_t duration_ms;
    uint64_t start_at_ms; /* Unix time of the first measured phase; 0 = now */
    const char *lat_out;  /* appends every measured call's latency here */
    double hit_ratio;
    unsigned replicas;
    uint64_t mem_budget;
    int vs_redis;
    unsigned repeat;
    char used[32]; /* transport the engine picked to the nodes */
    int json;
    const char *record;
    const char *hypothesis;
    kvf_expect_t *expect; /* --expect rules; the ratios are fed to it */
    int strict;           /* a missed rule fails the command */
    const char *http;     /* --master's HTTP endpoint (/status) */
    char cluster[256];    /* the cluster measured, in words */
    kvf_busy_t busy;      /* how busy the machine was during the run */
} kvf_bs_opts_t;

/* Pairs each Redis row with the kvferry row of the same size, clients and
 * operation (SET-put, GET-get), prints the ratios, and writes the record
 * when o->record is set. Returns 0 unless writing the record failed. */
int kvf_bs_compare_and_record(const kvf_bs_opts_t *o, kvf_bs_row_t *rows,
                              unsigned nrows);

/* The transport the client's engine picks to reach a node ("tcp", ...). */
void kvf_bs_transport_used(kvf_store_h st, char *out, size_t cap);

/* Writes the rows (and the options) as one JSON object. */
void kvf_bs_json_rows(FILE *f, const kvf_bs_opts_t *o, const kvf_bs_row_t *rows,
                      unsigned n);

/* CPU seconds (user + system) process pid has used so far
 * (/proc/PID/stat); -1 if unreadable. */
double kvf_bs_proc_cpu_s(pid_t pid);

/* Runs redis-server (own port, loopback, no persistence) and
 * redis-benchmark -t set, then -t get, -d size -c clients over keys
 * distinct keys (-r; 0 = one key); each test runs for about seconds (a
 * probe gives its rate; 0 = requests requests); fills two rows (SET,
 * GET), with the CPU both processes used per request. Returns 0, or -1
 * (message printed) when Redis is not installed or fails. */
int kvf_bs_redis(uint64_t size, unsigned clients, unsigned keys, long requests,
                 double seconds, kvf_bs_row_t *set_row, kvf_bs_row_t *get_row);
/* The same plus, when thr_rows is given, kvf_bs_resp's two rows into
 * thr_rows[0..1] (same server, after redis-benchmark); *nthr_p = rows
 * filled there (0 or 2). */
int kvf_bs_redis_both(uint64_t size, unsigned clients, unsigned keys,
                      long requests, double seconds, kvf_bs_row_t *set_row,
                      kvf_bs_row_t *get_row, kvf_bs_row_t *thr_rows,
                      unsigned *nthr_p);

/* The per-call Redis client (store_redis.c) against the
 * redis-server on port (process srv): clients threads, SET then GET of
 * keys_per_thread keys each, seconds per phase, each call timed to the
 * last byte of its reply; fills two rows (system "redis-thr"). Returns 0,
 * or -1 (message printed). */
int kvf_bs_resp(unsigned port, pid_t srv, uint64_t size, unsigned clients,
                unsigned keys_per_thread, double seconds, kvf_bs_row_t *set_row,
                kvf_bs_row_t *get_row);

/* Keys each client thread reads back in the get phases: a third of the
 * store's capacity, at most 64. */
unsigned kvf_bs_keys_per_thread(uint64_t capacity, uint64_t size,
                                unsigned clients);

#endif
