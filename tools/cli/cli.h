/*
 * Shared pieces of the kvferry command: the subcommand table, size and
 * duration parsing, pool allocation for benchmarks, exit codes. Each
 * subcommand lives in its own file and is listed in commands.c; options
 * are declared in tables (opts.h).
 */
#ifndef KVF_TOOLS_CLI_H
#define KVF_TOOLS_CLI_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/cli/cli.h is private to tools/"
#endif

#include <kvferry/config.h> /* kvf_parse_size, kvf_parse_ms */
#include <kvferry/kvferry.h>

#include <stddef.h>
#include <stdint.h>

typedef struct kvf_cli_cmd {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the command name */
    const char *help;
} kvf_cli_cmd_t;

/* Subcommands, one file each (listed in commands.c). */
int kvf_cmd_target(int argc, char **argv);
int kvf_cmd_config(int argc, char **argv);
int kvf_cmd_version(int argc, char **argv);
int kvf_cmd_master(int argc, char **argv);
int kvf_cmd_node(int argc, char **argv);
int kvf_cmd_resp(int argc, char **argv);
int kvf_cmd_put(int argc, char **argv);
int kvf_cmd_get(int argc, char **argv);
int kvf_cmd_rm(int argc, char **argv);
int kvf_cmd_exists(int argc, char **argv);
int kvf_cmd_ls(int argc, char **argv);
int kvf_cmd_bench_store(int argc, char **argv);
int kvf_cmd_bench_load(int argc, char **argv);
int kvf_cmd_bench_blocks(int argc, char **argv);
int kvf_cmd_bench_link(int argc, char **argv);
int kvf_cmd_bench_env(int argc, char **argv);
int kvf_cmd_bench_te(int argc, char **argv);
int kvf_cmd_bench_h2d(int argc, char **argv);
/* `bench blocks --device gpu` (gpu.c), called by blocks.c */
int kvf_cmd_bench_blocks_gpu(int argc, char **argv);
int kvf_cmd_calc(int argc, char **argv);
int kvf_cmd_report(int argc, char **argv);
int kvf_cmd_drill(int argc, char **argv);

/* Top-level commands and `bench` subcommands (commands.c). */
extern const kvf_cli_cmd_t kvf_cli_commands[];
extern const kvf_cli_cmd_t kvf_cli_bench_commands[];

/* Path of this executable (for spawning helper processes). */
extern const char *kvf_cli_self;

/* Dispatches argv[1] among cmds; prints the list on unknown. */
int kvf_cli_dispatch(const kvf_cli_cmd_t *cmds, const char *what, int argc,
                     char **argv);

/* Allocates a benchmark pool: anonymous mmap, transparent huge pages
 * asked for, every page touched (filled from seed) so page faults stay
 * out of the measurements. NULL on failure (message printed). */
void *kvf_cli_pool_alloc(size_t len, uint64_t seed);
/* Non-zero: pools are private anonymous memory with huge pages (set by
 * commands whose transport is forced to tcp); zero: shareable memfd. */
extern int kvf_cli_pool_private;
void kvf_cli_pool_free(void *pool, size_t len);

/* A daemon (target, master, node) stops on signal sig: SIGTERM is its
 * parent's or a service manager's orderly stop and prints nothing; SIGINT
 * (a user's Ctrl-C) one quiet line. */
void kvf_cli_stopped(const char *daemon, int sig);

/* Refuses, before anything is allocated, `count` pools of `bytes` each
 * that do not fit the machine: the memory available (MemAvailable of
 * /proc/meminfo) or a configured limit (the address-space limit of
 * `ulimit -v` / `prlimit --as`, the cgroup's memory.max). Prints one line
 * naming the option, the figures and the fix; returns 0 when it fits. */
int kvf_cli_check_memory(const char *cmd, const char *option, uint64_t bytes,
                         unsigned count);
/* Refuses a listen address (option, e.g. "--listen") that another process
 * already holds, before the library tries it: one line with the fix.
 * Port 0 and unparsable addresses pass (the library reports those). */
int kvf_cli_check_listen(const char *cmd, const char *option, const char *addr);
/* The message of a failed store call by cmd ("put") against master. */
void kvf_cli_store_error(const char *cmd, const char *key, kvf_status_t s,
                         const char *master);

/* Exit codes of the command. */
#define KVF_CLI_OK    0
#define KVF_CLI_FAIL  1
#define KVF_CLI_USAGE 2
#define KVF_CLI_SKIP  77

#endif
