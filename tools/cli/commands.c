/*
 * The table of kvferry subcommands and their dispatch. Each command is a
 * file of tools/cli, tools/bench or tools/drill; add a line here and its
 * file to tools/CMakeLists.txt.
 */
#include "tools/cli/cli.h"

#include <kvferry/config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void kvf_cli_usage(const kvf_cli_cmd_t *cmds, const char *what)
{
    size_t i;

    fprintf(stderr, "usage: %s <command> [options]\n\ncommands:\n", what);
    for (i = 0; cmds[i].name != NULL; i++) {
        fprintf(stderr, "  %-12s %s\n", cmds[i].name, cmds[i].help);
    }
    fprintf(stderr, "\n'%s <command> --help' describes a command.\n", what);
}

/* Edit distance of a and b (both short). */
static unsigned kvf_cli_distance(const char *a, const char *b)
{
    unsigned row[64], i, j, prev, cur, la = (unsigned)strlen(a);
    unsigned lb = (unsigned)strlen(b);

    if (la >= 64 || lb >= 64) {
        return 64;
    }
    for (j = 0; j <= lb; j++) {
        row[j] = j;
    }
    for (i = 1; i <= la; i++) {
        prev = row[0];
        row[0] = i;
        for (j = 1; j <= lb; j++) {
            cur = row[j];
            row[j] = prev + (a[i - 1] != b[j - 1]);
            if (row[j - 1] + 1 < row[j]) {
                row[j] = row[j - 1] + 1;
            }
            if (cur + 1 < row[j]) {
                row[j] = cur + 1;
            }
            prev = cur;
        }
    }
    return row[lb];
}

/* One line: the unknown command, the nearest one, where the list is. */
static void kvf_cli_unknown(const kvf_cli_cmd_t *cmds, const char *what,
                            const char *name)
{
    unsigned d, best_d = 3;
    const char *best = NULL;
    size_t i;

    for (i = 0; cmds[i].name != NULL; i++) {
        /* a prefix ("st" of "store") is the nearest there is */
        d = strncmp(cmds[i].name, name, strlen(name)) == 0
                ? 0
                : kvf_cli_distance(name, cmds[i].name);
        if (d < best_d) {
            best_d = d;
            best = cmds[i].name;
        }
    }
    if (best != NULL) {
        fprintf(stderr,
                "%s: unknown command '%s' \xe2\x80\x94 did you mean '%s'? "
                "('%s --help' lists the commands)\n",
                what, name, best, what);
    } else {
        fprintf(stderr,
                "%s: unknown command '%s' \xe2\x80\x94 '%s --help' lists the "
                "commands\n",
                what, name, what);
    }
}

int kvf_cli_dispatch(const kvf_cli_cmd_t *cmds, const char *what, int argc,
                     char **argv)
{
    size_t i;

    if (argc < 2 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        kvf_cli_usage(cmds, what);
        return (argc < 2) ? KVF_CLI_USAGE : KVF_CLI_OK;
    }
    for (i = 0; cmds[i].name != NULL; i++) {
        if (strcmp(cmds[i].name, argv[1]) == 0) {
            return cmds[i].run(argc - 1, argv + 1);
        }
    }
    kvf_cli_unknown(cmds, what, argv[1]);
    return KVF_CLI_USAGE;
}

/* `kvferry bench e2e ...` is the Python package's harness (it needs torch
 * and transformers): run `python3 -m kvferry bench e2e ...` in its place.
 * KVFERRY_PYTHON names another interpreter (one whose kvferry package is
 * installed). */
static int kvf_cmd_bench_e2e(int argc, char **argv)
{
    const char *py = kvf_config_var("KVFERRY_PYTHON");
    char **args = calloc((size_t)argc + 5, sizeof(*args));
    int i;

    if (args == NULL) {
        fprintf(stderr, "kvferry bench e2e: out of memory\n");
        return KVF_CLI_FAIL;
    }
    py = (py != NULL && *py != '\0') ? py : "python3";
    args[0] = (char *)py;
    args[1] = "-m";
    args[2] = "kvferry";
    args[3] = "bench";
    args[4] = "e2e";
    for (i = 1; i < argc; i++) {
        args[i + 4] = argv[i];
    }
    fflush(stdout);
    fflush(stderr);
    execvp(py, args);
    fprintf(stderr,
            "kvferry bench e2e: cannot run %s: %m (the harness is the Python "
            "package's: pip install the kvferry wheel, or set "
            "KVFERRY_PYTHON)\n",
            py);
    free(args);
    return 127;
}

static int kvf_cmd_bench(int argc, char **argv)
{
    return kvf_cli_dispatch(kvf_cli_bench_commands, "kvferry bench", argc,
                            argv);
}

const kvf_cli_cmd_t kvf_cli_bench_commands[] = {
    {"blocks", kvf_cmd_bench_blocks,
     "seed 000: random blocks from a registered pool, per transfer size"},
    {"link", kvf_cmd_bench_link,
     "raw ceiling of the path: contiguous streams, same connections"},
    {"store", kvf_cmd_bench_store,
     "store put/get latency and throughput over size x clients (vs Redis)"},
    {"load", kvf_cmd_bench_load,
     "store load path: master query, remote read, H2D, per size"},
    {"te", kvf_cmd_bench_te,
     "seed 003 §3.3: engine throughput curve over block size (4K..64M)"},
    {"env", kvf_cmd_bench_env,
     "seed 003 §1: the environment table, detected (CPU, GPUs, NICs...)"},
    {"h2d", kvf_cmd_bench_h2d,
     "seed 003 §3.1: pinned vs pageable H2D/D2H, 1 GiB contiguous"},
    {"e2e", kvf_cmd_bench_e2e,
     "TTFT with no / local / remote cache, outputs checked (Python)"},
    {NULL, NULL, NULL},
};

const kvf_cli_cmd_t kvf_cli_commands[] = {
    {"target", kvf_cmd_target, "serve a registered pool to initiators"},
    {"bench", kvf_cmd_bench, "measurement suite (kvferry bench --help)"},
    {"master", kvf_cmd_master, "store master: metadata, leases, eviction"},
    {"node", kvf_cmd_node, "store node: contribute a memory pool"},
    {"resp", kvf_cmd_resp, "Redis-protocol (RESP2) door to the store"},
    {"put", kvf_cmd_put, "store a file (or stdin) under a key"},
    {"get", kvf_cmd_get, "fetch a key's bytes to a file (or stdout)"},
    {"rm", kvf_cmd_rm, "remove keys from the store"},
    {"exists", kvf_cmd_exists, "is a key stored? (exit status 0 = yes)"},
    {"ls", kvf_cmd_ls, "list stored keys (by prefix)"},
    {"calc", kvf_cmd_calc,
     "break-even: load a prefix's KV cache or recompute it (seed 003)"},
    {"report", kvf_cmd_report,
     "one HTML page with charts of a folder of "
     "records"},
    {"drill", kvf_cmd_drill, "fault drills (kvferry drill list)"},
    {"config", kvf_cmd_config,
     "list the configuration keys (--all: every one)"},
    {"version", kvf_cmd_version, "print the version and build options"},
    {NULL, NULL, NULL},
};
