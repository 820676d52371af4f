/*
 * `kvferry master` and `kvferry node`: the store's daemons. Each prints
 * one line saying where it serves ("master=HOST:PORT http=HOST:PORT",
 * "node=SEGMENT pool=ADDR+LEN") so scripts and tests can find it, then
 * runs until SIGINT or SIGTERM.
 */
#include "tools/cli/cli.h"
#include "tools/cli/opts.h"

#include <kvferry/server.h>
#include <kvferry/store.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Blocks SIGINT/SIGTERM for every thread; returns the set to wait on. */
static void kvf_store_block_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, set, NULL);
}

static int kvf_store_wait_signal(sigset_t *set)
{
    struct timespec ts = {.tv_sec = 1};
    int sig;

    do {
        sig = sigtimedwait(set, NULL, &ts);
    } while (sig < 0);
    return sig;
}

/* --http off: no HTTP endpoint. */
static const char **kvf_master_http_dest;

static int kvf_master_set_http(const kvf_opt_t *opt, const char *v)
{
    (void)opt;
    *kvf_master_http_dest = strcmp(v, "off") == 0 ? NULL : v;
    return 0;
}

int kvf_cmd_master(int argc, char **argv)
{
    kvf_server_master_params_t o;
    unsigned pct_hi = 90, pct_lo = 80;
    int hi_given = 0, lo_given = 0, rc, sig;
    const kvf_opt_t opts[] = {
        {"listen", 0, KVF_OPT_STR, &o.listen, "HOST:PORT", "RPC address",
         "config `master`, 127.0.0.1:17800"},
        {"http", 0, KVF_OPT_FN, NULL, "HOST:PORT|auto|off",
         "/metrics and /status", "auto: the --listen host and port + 1",
         .fn = kvf_master_set_http},
        {"lease", 0, KVF_OPT_MS64, &o.lease_ms, "DUR", "read lease of a get",
         "2s"},
        {"put-timeout", 0, KVF_OPT_MS64, &o.put_timeout_ms, "DUR",
         "a put not committed by then is undone", "10s"},
        {"node-ttl", 0, KVF_OPT_MS64, &o.node_ttl_ms, "DUR",
         "a node silent this long is dropped", "3s"},
        {"heartbeat", 0, KVF_OPT_MS64, &o.heartbeat_ms, "DUR",
         "interval asked of nodes", "500ms"},
        {"high-watermark", 0, KVF_OPT_UINT, &pct_hi, "PCT",
         "evict above this % used", "90", .min = 1, .max = 100,
         .seen = &hi_given},
        {"low-watermark", 0, KVF_OPT_UINT, &pct_lo, "PCT",
         "... down to this % used", "80", .min = 0, .max = 100,
         .seen = &lo_given},
        {"replicas", 0, KVF_OPT_UINT, &o.replicas, "N",
         "default replicas per object", "1", .min = 1,
         .max = KVF_STORE_REPLICA_MAX},
        {"loops", 0, KVF_OPT_UINT, &o.loops, "N",
         "connection event loops (threads); 0 = one per 8 CPUs, 1 to 4",
         "config `master_loops`, 0", .min = 0, .max = KVF_SERVER_LOOPS_MAX},
        {0},
    };
    const kvf_cmd_spec_t spec = {
        "kvferry master [options]",
        "The store's master: metadata, leases and eviction. Prints\n"
        "\"master=HOST:PORT http=HOST:PORT\", then serves until SIGINT or "
        "SIGTERM.",
        opts};
    kvf_master_h m;
    kvf_status_t st;
    sigset_t set;

    st = kvf_server_master_defaults(&o);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry master: config: %s\n", kvf_status_str(st));
        return KVF_CLI_FAIL;
    }
    pct_hi = (unsigned)(o.high_watermark * 100 + 0.5);
    pct_lo = (unsigned)(o.low_watermark * 100 + 0.5);
    kvf_master_http_dest = &o.http;
    rc = kvf_opts_parse(&spec, argc, argv, NULL);
    if (rc >= 0) {
        return rc;
    }
    if (hi_given) {
        o.high_watermark = (double)pct_hi / 100;
    }
    if (lo_given) {
        o.low_watermark = (double)pct_lo / 100;
    }
    if (kvf_cli_check_listen("master", "--listen", o.listen) != 0 ||
        kvf_cli_check_listen("master", "--http", o.http) != 0) {
        return KVF_CLI_FAIL;
    }
    kvf_store_block_signals(&set);
    st = kvf_server_master_start(&o, &m);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry master: %s\n", kvf_status_str(st));
        return KVF_CLI_FAIL;
    }
    printf("master=%s http=%s\n", kvf_server_master_address(m),
           kvf_server_master_http(m)[0] ? kvf_server_master_http(m) : "off");
    fflush(stdout);
    sig = kvf_store_wait_signal(&set);
    kvf_cli_stopped("master", sig);
    kvf_server_master_stop(m);
    return KVF_CLI_OK;
}

int kvf_cmd_node(int argc, char **argv)
{
    kvf_server_node_params_t o;
    const kvf_opt_t opts[] = {
        {"pool", 0, KVF_OPT_SIZE, &o.pool, "SIZE",
         "memory the node contributes", "1G"},
        {"master", 0, KVF_OPT_STR, &o.master, "HOST:PORT", "the master",
         "config `master`, 127.0.0.1:17800"},
        {"listen", 0, KVF_OPT_STR, &o.listen, "HOST:PORT", "engine address",
         "127.0.0.1:0"},
        {"transports", 0, KVF_OPT_STR, &o.transports, "LIST",
         "engine transports", "auto"},
        {"anon", 0, KVF_OPT_FLAG, &o.anon, NULL,
         "private anonymous pool with huge pages (default: shareable\n"
         "memory, which same-host clients reach through the shm\n"
         "transport without copies)"},
        {"lazy", 0, KVF_OPT_FLAG, &o.lazy, NULL,
         "do not fault the pool in at start"},
        {"disk", 0, KVF_OPT_STR, &o.disk, "DIR",
         "a disk tier in DIR: objects evicted from the pool stay there\n"
         "(O_DIRECT; a node restarted on DIR offers them again)",
         "none"},
        {"disk-size", 0, KVF_OPT_SIZE, &o.disk_size, "SIZE",
         "bytes of the disk tier", "4x --pool"},
        {"timeout", 0, KVF_OPT_MS, &o.timeout_ms, "DUR", "bound on every wait",
         "config `store_timeout_ms`"},
        {"claim", 0, KVF_OPT_SIZE, &o.claim, "SIZE",
         "(tests) tell the master a different pool size", NULL,
         .flags = KVF_OPT_HIDDEN},
        {0},
    };
    const kvf_cmd_spec_t spec = {
        "kvferry node [options]",
        "A storage node: contributes a memory pool (and, with --disk, a\n"
        "disk tier) to the master's store.\n"
        "Prints \"node=SEGMENT pool=ADDR+LEN master=HOST:PORT\", then serves\n"
        "until SIGINT or SIGTERM.",
        opts};
    kvf_node_h n;
    kvf_status_t st;
    sigset_t set;
    int rc, sig;

    st = kvf_server_node_defaults(&o);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry node: config: %s\n", kvf_status_str(st));
        return KVF_CLI_FAIL;
    }
    rc = kvf_opts_parse(&spec, argc, argv, NULL);
    if (rc >= 0) {
        return rc;
    }
    if (kvf_cli_check_listen("node", "--listen", o.listen) != 0 ||
        kvf_cli_check_memory("node", "--pool", o.pool, 1) != 0) {
        return KVF_CLI_FAIL;
    }
    if (o.disk != NULL && o.disk_size == 0) {
        o.disk_size = 4 * o.pool;
    }
    kvf_store_block_signals(&set);
    st = kvf_server_node_start(&o, &n);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry node: %s (%s)\n", kvf_status_str(st),
                kvf_status_name(st));
        return KVF_CLI_FAIL;
    }
    printf("node=%s pool=0x%lx+%lu master=%s\n", kvf_server_node_segment(n),
           (unsigned long)(uintptr_t)kvf_server_node_pool(n),
           (unsigned long)o.pool, o.master);
    fflush(stdout);
    sig = kvf_store_wait_signal(&set);
    kvf_cli_stopped("node", sig);
    kvf_server_node_stop(n);
    return KVF_CLI_OK;
}
