/*
 * `kvferry drill NAME|all|list`: runs fault drills (seed 003 §4) and
 * writes one record per drill (--record DIR, default a fresh temporary
 * directory, printed). Exit status: 0 every expectation held, 1 one did
 * not, 77 skipped (a single drill that needs root or the store), 2 usage.
 *
 * This file holds the drill table and the command (one drill or all, the
 * record of each, the summary line); drill.c holds the conductor's
 * messages and verdict, worker.c runs the traffic workers, report.c turns
 * their counters into the record, sys.c handles processes and namespaces.
 */
#include "tools/bench/env.h"
#include "tools/cli/opts.h"
#include "tools/drill/drill.h"
#include "tools/drill/store.h"
#include "tools/drill/soak.h"

#include <kvferry/config.h>
#include <limits.h>
#include <fcntl.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/time.h"

static const kvf_drill_def_t kvf_drills[] = {
    {"target-kill", kvf_drill_target_kill, 0, 0,
     "engine target SIGKILLed mid-batch: operations fail within the "
     "timeout, a new target serves again"},
    {"engine-faults", kvf_drill_engine_faults, 0, 0,
     "fault wrapper drops, delays and resets requests: bounded waits, no "
     "wrong bytes, clean service after"},
    {"node-kill", kvf_drill_node_kill, 0, 1,
     "a storage node SIGKILLed under gets and puts: other replica served, "
     "node dropped within its TTL, no object lost"},
    {"client-kill", kvf_drill_client_kill, 0, 1,
     "a client SIGKILLed mid-put: the master reclaims its allocation, "
     "nothing else disturbed"},
    {"master-restart", kvf_drill_master_restart, 0, 1,
     "the master killed and restarted: nodes re-register, clients "
     "reconnect, nothing served from a stale location"},
    {"master-failover", kvf_drill_master_failover, 0, 1,
     "two masters over etcd, the leader SIGKILLed: the standby leads, "
     "node and clients follow, no wrong bytes, the hit rate back to 90 % "
     "of its level within 10 s"},
    {"warm-restart", kvf_drill_warm_restart, 0, 1,
     "a node with a disk tier SIGKILLed and restarted on its directory: "
     ">= 90 % of its objects served again, no wrong bytes"},
    {"disk-corrupt", kvf_drill_disk_corrupt, 0, 1,
     "bytes flipped in a disk tier's file: misses, never wrong data"},
    {"disk-full", kvf_drill_disk_full, 1, 1,
     "a disk tier's file system filled: the tier turns off with one line, "
     "the pool serves on, no wrong bytes"},
    {"dtype-swap", kvf_drill_dtype_swap, 0, 1,
     "bf16 and fp8 clients over one store: with fingerprinted keys they "
     "never share a hit"},
    {"master-partition", kvf_drill_master_partition, 0, 1,
     "the leader cut from etcd (not from nodes): steps down in half a "
     "lease, accepts no write after, the other leads"},
    {"etcd-leader-stop", kvf_drill_etcd_leader_stop, 0, 1,
     "etcd SIGSTOPped under traffic: the leader steps down in half a "
     "lease, no call hangs, the standby leads after"},
    {"etcd-down", kvf_drill_etcd_down, 0, 1,
     "etcd stopped and started again: bounded waits, a leader again "
     "after"},
    {"corruption", kvf_drill_corruption, 0, 1,
     "bytes flipped in node pools: checksum catches them, the other "
     "replica serves, never bad bytes"},
    {"cache-clear", kvf_drill_cache_clear, 0, 1,
     "every object removed under read-through traffic: clean misses, "
     "refill to the same objects and bytes"},
    {"capacity-pressure", kvf_drill_capacity_pressure, 0, 1,
     "20x the capacity put: eviction keeps puts succeeding under the "
     "watermark, pinned objects survive"},
    {"partition", kvf_drill_store_partition, 1, 1,
     "store clients and the node (+master) in two namespaces, the veth cut "
     "(nft drop) and healed: traffic resumes, nothing lost"},
    {"slow-link", kvf_drill_store_slow_link, 1, 1,
     "the store's veth throttled with tc tbf: throughput degrades, waits "
     "stay bounded, no wrong bytes"},
    {"engine-partition", kvf_drill_partition, 1, 0,
     "engine initiators and a target in two namespaces, the veth cut and "
     "healed: the engine reconnects"},
    {"engine-slow-link", kvf_drill_slow_link, 1, 0,
     "the engine target's veth throttled with tc tbf: bounded waits, no "
     "wrong bytes"},
    {"soak", kvf_drill_soak, 0, 1,
     "mixed load for --duration with node and client kills and a hostile "
     "client: no wrong bytes, memory and fds flat (not in 'all')"},
    {NULL, NULL, 0, 0, NULL},
};

/* --- the command ---------------------------------------------------------- */

/* The drills and the exit codes, after the options in --help. */
static const char *kvf_drill_epilog(void)
{
    static char text[4096];
    size_t i, n;

    n = (size_t)snprintf(text, sizeof(text), "drills:\n");
    for (i = 0; kvf_drills[i].name != NULL && n < sizeof(text); i++) {
        n += (size_t)snprintf(
            text + n, sizeof(text) - n, "  %-18s %s%s\n", kvf_drills[i].name,
            kvf_drills[i].needs_root ? "[root] " : "", kvf_drills[i].help);
    }
    if (n < sizeof(text)) {
        snprintf(text + n, sizeof(text) - n,
                 "exit: 0 held, 1 an expectation failed, 77 skipped");
    }
    return text;
}

typedef struct kvf_drill_opts {
    const char *record;
    unsigned phase_ms, timeout_ms;
    uint64_t seed;
    const char *hypothesis;
} kvf_drill_opts_t;

/* Runs one drill; returns 0 held, 1 failed, 77 skipped. */
static int kvf_drill_run_one(const kvf_drill_def_t *def,
                             const kvf_drill_opts_t *o, const char *dir)
{
    kvf_drill_t d;
    const char *verdict;
    int rc;

    memset(&d, 0, sizeof(d));
    d.name = def->name;
    d.timeout_ms = o->timeout_ms;
    d.call_ms = o->timeout_ms * 2;
    d.phase_ms = o->phase_ms;
    d.seed = o->seed;
    d.hypothesis = o->hypothesis;
    d.t_start_ms = kvf_time_ms();
    d.time_to_recover_ms = NAN;
    snprintf(d.logdir, sizeof(d.logdir), "%s/logs", dir);
    mkdir(d.logdir, 0755);
    if (def->needs_root && geteuid() != 0) {
        printf("%-16s SKIP  needs root (network namespaces, nft, tc)\n",
               def->name);
        return KVF_CLI_SKIP;
    }
    snprintf(d.title, sizeof(d.title), "drill %s", def->name);
    d.rec = kvf_record_new("drill", d.title, def->help);
    if (d.rec == NULL) {
        return KVF_CLI_FAIL;
    }
    kvf_record_hypothesis(d.rec, o->hypothesis);
    kvf_drill_log(&d, "start");
    rc = def->run(&d);
    kvf_drill_workers_stop(&d);
    kvf_drill_reap_all();
    if (d.skipped) {
        printf("%-16s SKIP  %s\n", def->name, d.why);
        kvf_record_free(d.rec);
        return KVF_CLI_SKIP;
    }
    if (rc != 0 && !d.failed) {
        kvf_drill_fail(&d, "the drill could not run to its end");
    }
    if (d.rec != NULL) {
        verdict = d.failed ? "does not hold" : "holds";
        kvf_record_conclude(d.rec, verdict,
                            d.failed ? d.why
                                     : "every expectation held: no wrong "
                                       "bytes, bounded waits, service back, "
                                       "resources back to the baseline");
        kvf_record_config_num(d.rec, "client timeout_ms", d.timeout_ms);
        kvf_record_config_num(d.rec, "engine call wait_ms", d.call_ms);
        kvf_record_config_num(d.rec, "phase_ms", d.phase_ms);
        kvf_record_config_num(d.rec, "seed", (double)d.seed);
        kvf_record_config(d.rec, "logs", d.logdir);
        if (kvf_env_record_write(d.rec, dir) != 0) {
            kvf_drill_fail(&d, "cannot write the record in %s", dir);
        }
        kvf_record_free(d.rec);
    }
    printf("%-16s %-5s wrong_bytes=%lu max_wait=%.0fms bound=%.0fms "
           "recover=%.0fms calls ok/err base %lu/%lu fault %lu/%lu "
           "recovery %lu/%lu%s%s\n",
           def->name, d.failed ? "FAIL" : "PASS", (unsigned long)d.wrong_bytes,
           d.max_wait_ms, d.wait_bound_ms, d.time_to_recover_ms,
           (unsigned long)d.ok_calls[0], (unsigned long)d.err_calls[0],
           (unsigned long)d.ok_calls[1], (unsigned long)d.err_calls[1],
           (unsigned long)d.ok_calls[2], (unsigned long)d.err_calls[2],
           d.failed ? "\n    " : "", d.failed ? d.why : "");
    fflush(stdout);
    return d.failed ? KVF_CLI_FAIL : KVF_CLI_OK;
}

/* The network drills' hosts bind addresses of their own namespaces, which
 * the library refuses without a cluster secret: with none configured,
 * the drills' processes share one written for this run, 0600, in the
 * records folder (it names no other cluster). */
static int kvf_drill_secret(const char *dir)
{
    const char *file = kvf_config_get("secret_file");
    unsigned char key[32];
    char path[PATH_MAX];
    int fd, ok;

    if (file != NULL && file[0] != '\0') {
        return 0;
    }
    snprintf(path, sizeof(path), "%s/drill-secret", dir);
    fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ok = fd >= 0 && read(fd, key, sizeof(key)) == (ssize_t)sizeof(key);
    if (fd >= 0) {
        close(fd);
    }
    unlink(path);
    fd = ok ? open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600) : -1;
    ok = fd >= 0 && write(fd, key, sizeof(key)) == (ssize_t)sizeof(key);
    if (fd >= 0) {
        close(fd);
    }
    if (!ok) {
        fprintf(stderr,
                "kvferry drill: cannot write a cluster secret in %s: %s "
                "\xe2\x80\x94 pass --secret-file FILE\n",
                dir, strerror(errno));
        return -1;
    }
    setenv("KVF_SECRET_FILE", path, 1);
    return 0;
}

int kvf_cmd_drill(int argc, char **argv)
{
    kvf_drill_opts_t o = {NULL, 1500, 1000, 1, NULL};
    char tmp[] = "/tmp/kvferry-drill-XXXXXX";
    const char *what, *dir;
    int argi, rc, worst = KVF_CLI_OK, ran = 0, skipped = 0, nfailed = 0;
    size_t i, k, n;
    char failed[512] = "";
    kvf_progress_t prog;
    kvf_busy_t busy;
    const kvf_opt_t opts[] = {
        {"record", 'r', KVF_OPT_STR, &o.record, "DIR", "write records there",
         "a new temp dir"},
        {"phase", 'p', KVF_OPT_MS, &o.phase_ms, "MS",
         "length of the baseline and recovery phases (at least 200)", "1500"},
        {"timeout", 't', KVF_OPT_MS, &o.timeout_ms, "MS",
         "engine / store timeout of the clients (at least 100)", "1000"},
        {"seed", 's', KVF_OPT_U64, &o.seed, "N",
         "seed of pools, keys and injected faults", "1", .min = 0,
         .max = (double)(1ull << 62)},
        {"duration", 'D', KVF_OPT_MS, &kvf_drill_soak_ms, "MS",
         "length of the soak drill (at least 10s)", "60s"},
        {"hypothesis", 'H', KVF_OPT_STR, &o.hypothesis, "TEXT",
         "replaces the drill's stated expectation"},
        {0},
    };
    const kvf_cmd_spec_t spec = {
        "kvferry drill NAME|all|list [options]",
        "Fault drills: each injects a fault under traffic and checks what\n"
        "the clients saw, bounded waits and recovery; one record per drill.",
        opts, kvf_drill_epilog(), .progress = 1};

    rc = kvf_opts_parse(&spec, argc, argv, &argi);
    if (rc >= 0) {
        return rc;
    }
    if (argi != argc - 1) {
        return kvf_opts_error(&spec,
                              "one drill NAME, 'all' or 'list' expected");
    }
    if (o.timeout_ms < 100 || o.phase_ms < 200) {
        return kvf_opts_error(&spec, "--timeout below 100 ms or --phase below "
                                     "200 ms");
    }
    what = argv[argi];
    if (strcmp(what, "list") == 0) {
        for (i = 0; kvf_drills[i].name != NULL; i++) {
            printf("%-18s %s%s\n", kvf_drills[i].name,
                   kvf_drills[i].needs_root ? "[root] " : "",
                   kvf_drills[i].help);
        }
        return KVF_CLI_OK;
    }
    for (i = 0; kvf_drills[i].name != NULL; i++) {
        if (strcmp(what, "all") == 0 || strcmp(what, kvf_drills[i].name) == 0) {
            break;
        }
    }
    if (kvf_drills[i].name == NULL) {
        return kvf_opts_error(&spec, "unknown drill '%s'", what);
    }
    dir = o.record;
    if (dir == NULL) {
        dir = mkdtemp(tmp);
        if (dir == NULL) {
            fprintf(stderr, "kvferry drill: mkdtemp: %s\n", strerror(errno));
            return KVF_CLI_FAIL;
        }
    } else if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        fprintf(stderr, "kvferry drill: %s: %s\n", dir, strerror(errno));
        return KVF_CLI_FAIL;
    }
    printf("kvferry drill: records in %s\n", dir);
    fflush(stdout);
    if (kvf_drill_secret(dir) != 0) {
        return KVF_CLI_FAIL;
    }
    kvf_progress_begin(&prog, "drill", 0, 0);
    for (k = i; kvf_drills[k].name != NULL; k++) {
        if ((strcmp(what, "all") == 0 && kvf_drills[k].run != kvf_drill_soak) ||
            strcmp(what, kvf_drills[k].name) == 0) {
            prog.nsteps++;
        }
    }
    prog.total = prog.nsteps;
    for (; kvf_drills[i].name != NULL; i++) {
        if (strcmp(what, "all") != 0 && strcmp(what, kvf_drills[i].name) != 0) {
            continue;
        }
        if (strcmp(what, "all") == 0 && kvf_drills[i].run == kvf_drill_soak) {
            continue; /* long: run by name */
        }
        kvf_progress_step(&prog, "%s", kvf_drills[i].name);
        rc = kvf_drill_run_one(&kvf_drills[i], &o, dir);
        kvf_progress_done(&prog, 1);
        ran++;
        skipped += (rc == KVF_CLI_SKIP);
        if (rc == KVF_CLI_FAIL) {
            worst = KVF_CLI_FAIL;
            n = strlen(failed);
            snprintf(failed + n, sizeof(failed) - n, "%s%s", n ? ", " : "",
                     kvf_drills[i].name);
            nfailed++;
        }
    }
    busy = kvf_progress_end(&prog);
    if (strcmp(what, "all") == 0) {
        if (nfailed > 0) {
            printf("FAIL  %d of %d drills failed: %s", nfailed, ran - skipped,
                   failed);
        } else {
            printf("PASS  all %d drills held", ran - skipped);
        }
        if (skipped > 0) {
            printf(" (%d skipped: they need root)", skipped);
        }
        printf("\n");
    }
    kvf_busy_note(&busy, stdout);
    if (strcmp(what, "all") != 0 && skipped == ran) {
        return KVF_CLI_SKIP;
    }
    return worst;
}
