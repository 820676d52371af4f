/*
 * Fault drills (seed 003 §4), shared machinery. A drill states what it
 * expects, injects a fault, observes, recovers and concludes; the point
 * is that a failure never yields wrong output, resources come back, and
 * the service degrades as designed.
 *
 * Shape of every drill: the drill process (the conductor) starts the
 * services it needs as child processes (`kvferry target`, `master`,
 * `node`), forks traffic workers that run real clients and count into a
 * block of shared memory (calls, errors by status, longest wait, wrong
 * bytes, latency histograms per phase), moves the phase from baseline to
 * fault to recovery while injecting and healing, asks the workers to
 * pause for resource snapshots, checks the expectations, and writes a
 * record (record.h). Every child and every network namespace is
 * registered for cleanup, which runs at exit and on SIGINT/SIGTERM/
 * SIGHUP, also when a drill fails half-way.
 */
#ifndef KVF_TOOLS_DRILL_H
#define KVF_TOOLS_DRILL_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/drill/drill.h is private to tools/"
#endif

#include "tools/cli/cli.h"
#include "tools/cli/progress.h"
#include "tools/record/record.h"

#include <stdint.h>
#include <sys/types.h>

enum {
    KVF_DRILL_BASE = 0,
    KVF_DRILL_FAULT = 1,
    KVF_DRILL_RECOVER = 2,
    KVF_DRILL_PHASES = 3
};

#define KVF_DRILL_HIST  160 /* latency buckets: 4 per power of two, us */
#define KVF_DRILL_CODES 101 /* errors by -status */
#define KVF_DRILL_ADDR  280

typedef struct kvf_drill_phase {
    uint64_t calls_ok, calls_err, misses; /* misses: clean "not there" */
    uint64_t bytes_ok;
    uint64_t first_ok_ms, last_ok_ms; /* monotonic, 0 = none */
    uint64_t first_err_ms;
    uint64_t hist[KVF_DRILL_HIST]; /* latency of every call */
} kvf_drill_phase_t;

/* Resource snapshot of one process. */
typedef struct kvf_drill_res {
    double objects;     /* store objects (master), NAN when n/a */
    double alloc_bytes; /* kvf_alloc_stats bytes (in-process) */
    double conns;       /* sockets open */
    double fds;         /* /proc/PID/fd entries */
    double rss_kb;      /* VmRSS less RssShmem (shared memory mapped) */
} kvf_drill_res_t;

/* Shared between the conductor and one worker (MAP_SHARED). Flags and
 * counters are accessed with __atomic builtins on both sides. */
typedef struct kvf_drill_shared {
    int stop;   /* conductor -> worker: finish */
    int pause;  /* conductor -> worker: quiesce, snapshot, wait */
    int paused; /* worker -> conductor: snapshot taken */
    int ready;  /* worker -> conductor: set up and running */
    int gen;    /* conductor bumps when `addr` changes */
    int phase;  /* conductor: KVF_DRILL_BASE/FAULT/RECOVER */
    int failed; /* worker -> conductor: gave up (note says why) */
    int index;  /* worker number */
    int nworkers;
    int fresh;                 /* with gen: the service restarted empty */
    int gen_seen;              /* worker -> conductor: gen it has switched to */
    char addr[KVF_DRILL_ADDR]; /* service the worker talks to */
    char fault[128];           /* KVF_FAULT for the worker's next peer open */
    int epoch;          /* store drills: bumped when the master restarts */
    int in_put;         /* store worker: a put is in progress */
    int gone;           /* killed on purpose by the drill */
    unsigned keys_now;  /* store worker: key space in use (0 = its own) */
    int tcp_only;       /* worker in a namespace: the network path only */
    char transport[16]; /* worker -> conductor: transport of its peer */
    uint64_t pool_addr, pool_len; /* target's pool (engine drills) */
    uint64_t get_hits, get_misses, get_errs; /* store gets, for hit rates */
    /* dtype-swap: another dtype's object returned, by phase */
    uint64_t cross_ph[KVF_DRILL_PHASES];
    uint64_t wrong_bytes;         /* bytes handed back that were not right */
    uint64_t wrong_calls;
    uint64_t checked_bytes; /* bytes verified */
    uint64_t max_wait_us;   /* longest call */
    uint64_t errs[KVF_DRILL_CODES];
    kvf_drill_phase_t ph[KVF_DRILL_PHASES];
    kvf_drill_res_t res; /* at the last pause */
    char note[256];
} kvf_drill_shared_t;

typedef struct kvf_drill kvf_drill_t;
typedef int (*kvf_drill_worker_fn)(kvf_drill_t *d, kvf_drill_shared_t *sh,
                                   void *arg);

#define KVF_DRILL_WORKERS_MAX 8

struct kvf_drill {
    const char *name;
    char title[64];
    kvf_record_t *rec;
    /* options */
    unsigned timeout_ms; /* engine / store timeout given to clients */
    unsigned call_ms;    /* how long a client call may wait */
    unsigned phase_ms;   /* length of each phase */
    uint64_t seed;
    const char *hypothesis;
    /* workers */
    kvf_drill_shared_t *sh[KVF_DRILL_WORKERS_MAX];
    pid_t wpid[KVF_DRILL_WORKERS_MAX];
    unsigned nworkers;
    /* timeline */
    uint64_t t_start_ms;
    double phase_secs[KVF_DRILL_PHASES]; /* for throughput figures */
    /* verdict and summary */
    int failed;
    int skipped;
    char why[2048];
    double time_to_recover_ms;
    uint64_t wrong_bytes;
    double max_wait_ms, wait_bound_ms;
    uint64_t ok_calls[KVF_DRILL_PHASES], err_calls[KVF_DRILL_PHASES];
    double tput[KVF_DRILL_PHASES];
    char logdir[512];
    /* the hit rate sampled while the conductor sleeps (hits.c), or NULL */
    struct kvf_drill_hits *hits;
};

/* Pause of a traffic worker after a failed call. */
#define KVF_DRILL_BACKOFF_US 5000

/* Scheduling slack allowed over a wait bound (2-core machines). */
#define KVF_DRILL_SLACK_MS 250

/* --- conductor ------------------------------------------------------------ */

/* Marks the drill failed (the expectation did not hold) with a reason. */
void kvf_drill_fail(kvf_drill_t *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Checks cond; when false, fails the drill with the message. */
int kvf_drill_check(kvf_drill_t *d, int cond, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The drill's expectation: the record's "expected" and, unless
 * --hypothesis replaced it, its hypothesis. */
void kvf_drill_expect(kvf_drill_t *d, const char *text);
/* What was injected: the record's "injected", also logged. */
void kvf_drill_injected(kvf_drill_t *d, const char *text);
/* The drill cannot run here (not root, tool missing): exit 77. */
void kvf_drill_skip(kvf_drill_t *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void kvf_drill_log(kvf_drill_t *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Sleeps ms while watching that workers are alive (and sampling their
 * hit rate, when d->hits is set). */
void kvf_drill_sleep(kvf_drill_t *d, unsigned ms);
/* hits.c: takes a window of d->hits when one is due. */
void kvf_drill_hits_tick(kvf_drill_t *d);
void kvf_drill_phase(kvf_drill_t *d, int phase);
/* Waits until every worker completed a call after `since_ms` in the
 * current phase; returns ms from since_ms to the last of those first
 * successes, or -1 after max_ms. */
double kvf_drill_wait_recovered(kvf_drill_t *d, uint64_t since_ms,
                                unsigned max_ms);

/* Ms from t0 to the first error in phase of the slowest worker; -1 when
 * a worker saw none. */
double kvf_drill_first_error_after(kvf_drill_t *d, int phase, uint64_t t0);
/* Bytes moved with success by all workers in phase so far. */
uint64_t kvf_drill_bytes(kvf_drill_t *d, int phase);

/* Forks a worker (optionally inside network namespace netns) that runs
 * fn until sh->stop. Returns its index or -1. */
int kvf_drill_worker(kvf_drill_t *d, const char *netns, kvf_drill_worker_fn fn,
                     void *arg, const char *addr);
/* Waits until all workers are ready (or fail / max_ms). */
int kvf_drill_workers_ready(kvf_drill_t *d, unsigned max_ms);
/* Pauses all workers, collecting their resource snapshots (sum into
 * res_p when not NULL), and resumes them when resume is set. */
int kvf_drill_workers_pause(kvf_drill_t *d, kvf_drill_res_t *res_p, int resume);
/* SIGKILLs worker i on purpose (a client dying is the fault); the
 * other helpers skip it from then on. */
void kvf_drill_worker_kill(kvf_drill_t *d, unsigned i);
/* Resources of worker i at the last pause. */
const kvf_drill_res_t *kvf_drill_worker_res(kvf_drill_t *d, unsigned i);
/* Stops and reaps all workers. */
void kvf_drill_workers_stop(kvf_drill_t *d);
/* Points every worker at a new address (NULL = same) and, when fault is
 * not NULL, a new KVF_FAULT spec; fresh: the service restarted empty.
 * Waits (bounded) until every worker has switched. */
int kvf_drill_workers_retarget(kvf_drill_t *d, const char *addr,
                               const char *fault, int fresh);

/* Adds the traffic results (wrong bytes, longest wait, errors by status,
 * per-phase calls, throughput and latency) to the record and checks the
 * universal expectations: no wrong bytes, no call longer than its bound,
 * traffic in baseline and recovery. */
void kvf_drill_traffic_report(kvf_drill_t *d, uint64_t wait_bound_ms);
/* Records baseline vs after resources and checks them within slack. */
void kvf_drill_resources(kvf_drill_t *d, const char *who,
                         const kvf_drill_res_t *base,
                         const kvf_drill_res_t *after);

/* --- worker side ---------------------------------------------------------- */

/* Call bookkeeping: a call of `us` microseconds ended with status st
 * (KVF_ERR_NO_KEY etc. counted as misses when `miss` is set). */
void kvf_drill_count(kvf_drill_shared_t *sh, kvf_status_t st, uint64_t us,
                     uint64_t bytes, int miss);
void kvf_drill_wrong(kvf_drill_shared_t *sh, uint64_t bytes);
/* Middle of latency bucket idx, in microseconds. */
double kvf_drill_bucket_us(unsigned idx);
/* Honors pause/stop; returns non-zero when the worker must stop. Call
 * between two calls, with nothing in flight. objects may be NAN. */
int kvf_drill_worker_poll(kvf_drill_shared_t *sh);

/* --- processes ------------------------------------------------------------ */

/* Spawns `kvferry ARGS...` (NULL-terminated) as a child inside netns
 * (NULL = this namespace), stderr to the drill's log dir, and returns
 * its first stdout line in line (within 20 s). Registered for cleanup. */
pid_t kvf_drill_spawn(kvf_drill_t *d, const char *netns, const char *tag,
                      char *line, size_t linelen, const char *const *args);
/* Sends sig to a child and reaps it (SIGKILL after 5 s for SIGTERM). */
void kvf_drill_kill(pid_t pid, int sig);
/* Value of "key=" in a line like "segment=H:P pool=0x..+N". */
int kvf_drill_field(const char *line, const char *key, char *out,
                    size_t outlen);
/* Resource snapshot of a process from /proc (objects = NAN). */
void kvf_drill_proc_res(pid_t pid, kvf_drill_res_t *res);

/* fork(2) for drills: the child gets its own process group, dies with
 * the conductor, default signal handlers, and enters netns (NULL = stay
 * here). The parent registers it for cleanup. */
pid_t kvf_drill_fork(const char *netns);
/* Sends this process's stderr to LOGDIR/<drill>-<tag>.log. */
void kvf_drill_log_to(kvf_drill_t *d, const char *tag);
/* Forgets a child the caller has reaped itself. */
void kvf_drill_untrack_pid(pid_t pid);
/* Kills every registered child and removes every namespace now. */
void kvf_drill_reap_all(void);

/* Runs a command (argv[0] looked up in PATH) inside netns (NULL = here),
 * waits at most 10 s; returns its exit status or -1. Output to the log. */
int kvf_drill_run(kvf_drill_t *d, const char *netns, const char *const *argv);
int kvf_drill_have(const char *tool);

/* --- network namespaces --------------------------------------------------- */

typedef struct kvf_drill_net {
    char ns[2][32]; /* client side [0], service side [1] */
    char ifname[2][16];
    char ip[2][20]; /* 10.x.y.1 / .2 in a private /30 */
} kvf_drill_net_t;

/* Creates two namespaces joined by a veth pair with addresses of one
 * private /30, both links up (loopback too). Registered for cleanup. */
int kvf_drill_net_up(kvf_drill_t *d, kvf_drill_net_t *n);
void kvf_drill_net_down(kvf_drill_net_t *n);

/* --- engine traffic (engine.c) -------------------------------------- */

/* Starts `kvferry target` (pool 16 MiB, seed d->seed + 2) in netns,
 * listening on listen; its segment name goes to segment. */
pid_t kvf_drill_start_target(kvf_drill_t *d, const char *netns,
                             const char *listen, char *segment, size_t seglen);
/* Starts n blocks workers (verified random 8 KiB READ/WRITE batches, one
 * slice of the pool each) against segment and waits until they run. */
int kvf_drill_blocks_workers(kvf_drill_t *d, const char *netns,
                             const char *segment, unsigned n);

/* --- the drills ----------------------------------------------------------- */

typedef struct kvf_drill_def {
    const char *name;
    int (*run)(kvf_drill_t *d);
    int needs_root;
    int needs_store;
    const char *help;
} kvf_drill_def_t;

int kvf_drill_target_kill(kvf_drill_t *d);
int kvf_drill_engine_faults(kvf_drill_t *d);
int kvf_drill_partition(kvf_drill_t *d);
int kvf_drill_slow_link(kvf_drill_t *d);

#endif
