/*
 * `kvferry master` and `kvferry node`: the store's daemons. Each prints
 * one line saying where it serves ("master=HOST:PORT http=HOST:PORT",
 * "node=SEGMENT pool=ADDR+LEN") so scripts and tests can find it, then
 * runs until SIGINT or SIGTERM.
 */
#include "tools/cli/cli.h"

#include <kvferry/server.h>
#include <kvferry/store.h>

#include <getopt.h>
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

static void kvf_master_usage(void)
{
    fprintf(
        stderr,
        "usage: kvferry master [--listen HOST:PORT] [--http HOST:PORT|off]\n"
        "                      [--lease DUR] [--put-timeout DUR]\n"
        "                      [--node-ttl DUR] [--heartbeat DUR]\n"
        "                      [--high-watermark PCT] [--low-watermark PCT]\n"
        "                      [--replicas N] [--loops N]\n"
        "  --listen          RPC address (default: config `master`, "
        "127.0.0.1:17800)\n"
        "  --http            /metrics and /status (default 127.0.0.1:17801)\n"
        "  --lease           read lease of a get (default 2s)\n"
        "  --put-timeout     a put not committed by then is undone "
        "(default 10s)\n"
        "  --node-ttl        a node silent this long is dropped "
        "(default 3s)\n"
        "  --heartbeat       interval asked of nodes (default 500ms)\n"
        "  --high-watermark  evict above this %% used (default 90)\n"
        "  --low-watermark   ... down to this %% (default 80)\n"
        "  --replicas        default replicas per object (default 1)\n"
        "  --loops           connection event loops (threads); 0 = one per "
        "8 CPUs, 1 to 4 (default: config `master_loops`, 0)\n");
}

int kvf_cmd_master(int argc, char **argv)
{
    static const struct option opts[] = {
        {"listen", required_argument, NULL, 'l'},
        {"http", required_argument, NULL, 'H'},
        {"lease", required_argument, NULL, 'L'},
        {"put-timeout", required_argument, NULL, 'P'},
        {"node-ttl", required_argument, NULL, 'T'},
        {"heartbeat", required_argument, NULL, 'B'},
        {"high-watermark", required_argument, NULL, 'W'},
        {"low-watermark", required_argument, NULL, 'w'},
        {"replicas", required_argument, NULL, 'r'},
        {"loops", required_argument, NULL, 'O'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    kvf_server_master_params_t o;
    kvf_master_h m;
    kvf_status_t st;
    sigset_t set;
    int c, sig;

    st = kvf_server_master_defaults(&o);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry master: config: %s\n", kvf_status_str(st));
        return KVF_CLI_FAIL;
    }
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'l':
            o.listen = optarg;
            break;
        case 'H':
            o.http = strcmp(optarg, "off") == 0 ? NULL : optarg;
            break;
        case 'L':
            o.lease_ms = kvf_cli_ms("--lease", optarg);
            break;
        case 'P':
            o.put_timeout_ms = kvf_cli_ms("--put-timeout", optarg);
            break;
        case 'T':
            o.node_ttl_ms = kvf_cli_ms("--node-ttl", optarg);
            break;
        case 'B':
            o.heartbeat_ms = kvf_cli_ms("--heartbeat", optarg);
            break;
        case 'W':
            o.high_watermark =
                (double)kvf_cli_long("--high-watermark", optarg, 1, 100) / 100;
            break;
        case 'w':
            o.low_watermark =
                (double)kvf_cli_long("--low-watermark", optarg, 0, 100) / 100;
            break;
        case 'r':
            o.replicas = (unsigned)kvf_cli_long("--replicas", optarg, 1,
                                                KVF_STORE_REPLICA_MAX);
            break;
        case 'O':
            o.loops = (unsigned)kvf_cli_long("--loops", optarg, 0,
                                             KVF_SERVER_LOOPS_MAX);
            break;
        case 'h':
            kvf_master_usage();
            return KVF_CLI_OK;
        default:
            kvf_master_usage();
            return KVF_CLI_USAGE;
        }
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
    fprintf(stderr, "kvferry master: signal %d, stopping\n", sig);
    kvf_server_master_stop(m);
    return KVF_CLI_OK;
}

static void kvf_node_usage(void)
{
    fprintf(stderr,
            "usage: kvferry node --pool SIZE [--master HOST:PORT]\n"
            "                    [--listen HOST:PORT] [--transports LIST]\n"
            "                    [--anon] [--lazy]\n"
            "  --pool        memory the node contributes (e.g. 4G)\n"
            "  --master      the master (default: config `master`, "
            "127.0.0.1:17800)\n"
            "  --listen      engine address (default 127.0.0.1:0)\n"
            "  --transports  engine transports (default auto)\n"
            "  --anon        private anonymous pool with huge pages (default:\n"
            "                shareable memory, which same-host clients reach\n"
            "                through the shm transport without copies)\n"
            "  --lazy        do not fault the pool in at start\n"
            "  --claim SIZE  (tests) tell the master a different pool size\n");
}

int kvf_cmd_node(int argc, char **argv)
{
    static const struct option opts[] = {
        {"pool", required_argument, NULL, 'p'},
        {"master", required_argument, NULL, 'm'},
        {"listen", required_argument, NULL, 'l'},
        {"transports", required_argument, NULL, 't'},
        {"claim", required_argument, NULL, 'C'},
        {"anon", no_argument, NULL, 'A'},
        {"lazy", no_argument, NULL, 'z'},
        {"timeout", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    kvf_server_node_params_t o;
    kvf_node_h n;
    kvf_status_t st;
    sigset_t set;
    int c, sig;

    st = kvf_server_node_defaults(&o);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry node: config: %s\n", kvf_status_str(st));
        return KVF_CLI_FAIL;
    }
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'p':
            o.pool = kvf_cli_size("--pool", optarg);
            break;
        case 'm':
            o.master = optarg;
            break;
        case 'l':
            o.listen = optarg;
            break;
        case 't':
            o.transports = optarg;
            break;
        case 'C':
            o.claim = kvf_cli_size("--claim", optarg);
            break;
        case 'A':
            o.anon = 1;
            break;
        case 'z':
            o.lazy = 1;
            break;
        case 'o':
            o.timeout_ms = (unsigned)kvf_cli_ms("--timeout", optarg);
            break;
        case 'h':
            kvf_node_usage();
            return KVF_CLI_OK;
        default:
            kvf_node_usage();
            return KVF_CLI_USAGE;
        }
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
    fprintf(stderr, "kvferry node: signal %d, stopping\n", sig);
    kvf_server_node_stop(n);
    return KVF_CLI_OK;
}
