/*
 * kvferry: entry point of the command. Dispatches to the subcommands
 * listed in commands.c (target, bench ..., config, version, ...).
 */
#include "tools/kvferry/cli.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/config.h"
#include "core/log.h"
#include "core/hash.h"

const char *kvf_cli_self = "kvferry";

static void kvf_cli_usage(const kvf_cli_cmd_t *cmds, const char *what)
{
    size_t i;

    fprintf(stderr, "usage: %s <command> [options]\n\ncommands:\n", what);
    for (i = 0; cmds[i].name != NULL; i++) {
        fprintf(stderr, "  %-12s %s\n", cmds[i].name, cmds[i].help);
    }
    fprintf(stderr, "\n'%s <command> --help' describes a command.\n", what);
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
    fprintf(stderr, "%s: unknown command '%s'\n\n", what, argv[1]);
    kvf_cli_usage(cmds, what);
    return KVF_CLI_USAGE;
}

uint64_t kvf_cli_size(const char *flag, const char *text)
{
    uint64_t v;

    if (kvf_parse_size(text, &v) != KVF_OK) {
        fprintf(stderr, "kvferry: %s: '%s' is not a size (e.g. 8K, 16M, 8G)\n",
                flag, text);
        exit(KVF_CLI_USAGE);
    }
    return v;
}

uint64_t kvf_cli_ms(const char *flag, const char *text)
{
    uint64_t v;

    if (kvf_parse_ms(text, &v) != KVF_OK) {
        fprintf(stderr, "kvferry: %s: '%s' is not a duration (500ms, 3s)\n",
                flag, text);
        exit(KVF_CLI_USAGE);
    }
    return v;
}

long kvf_cli_long(const char *flag, const char *text, long min, long max)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(text, &end, 10);
    if (errno != 0 || *end != '\0' || end == text || v < min || v > max) {
        fprintf(stderr, "kvferry: %s: '%s' is not a number in %ld..%ld\n", flag,
                text, min, max);
        exit(KVF_CLI_USAGE);
    }
    return v;
}

/*
 * Pools come from kvf_mem_alloc (memfd-backed shared memory), so a
 * same-host peer reaches them over shm with one memcpy per block. When a
 * command knows only sockets will touch the pool (tcp forced), it asks
 * for private anonymous memory instead: transparent huge pages apply to
 * it (shmem often has them off), which saves the kernel a TLB miss per
 * scattered block.
 */
int kvf_cli_pool_private;

#define KVF_CLI_ANON_MAX 64
static struct {
    void *p;
    size_t len;
} kvf_cli_anon[KVF_CLI_ANON_MAX];
static pthread_mutex_t kvf_cli_anon_lock = PTHREAD_MUTEX_INITIALIZER;

static void *kvf_cli_anon_alloc(size_t len)
{
    void *p;
    int i;

    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
             0);
    if (p == MAP_FAILED) {
        return NULL;
    }
    madvise(p, len, MADV_HUGEPAGE);
    pthread_mutex_lock(&kvf_cli_anon_lock);
    for (i = 0; i < KVF_CLI_ANON_MAX; i++) {
        if (kvf_cli_anon[i].p == NULL) {
            kvf_cli_anon[i].p = p;
            kvf_cli_anon[i].len = len;
            break;
        }
    }
    pthread_mutex_unlock(&kvf_cli_anon_lock);
    if (i == KVF_CLI_ANON_MAX) {
        munmap(p, len);
        return NULL;
    }
    return p;
}

void *kvf_cli_pool_alloc(size_t len, uint64_t seed)
{
    kvf_status_t status = KVF_OK;
    kvf_rng_t rng;
    void *p;

    if (kvf_cli_pool_private) {
        p = kvf_cli_anon_alloc(len);
        if (p == NULL) {
            status = KVF_ERR_NO_MEMORY;
        }
    } else {
        status = kvf_mem_alloc(len, KVF_MEM_HOST, 0, &p);
    }
    if (status != KVF_OK) {
        fprintf(stderr, "kvferry: cannot allocate a pool of %zu bytes: %s\n",
                len, kvf_status_str(status));
        return NULL;
    }
    kvf_rng_seed(&rng, seed);
    kvf_rng_fill(&rng, p, len);
    return p;
}

void kvf_cli_pool_free(void *pool, size_t len)
{
    int i;

    if (pool == NULL) {
        return;
    }
    pthread_mutex_lock(&kvf_cli_anon_lock);
    for (i = 0; i < KVF_CLI_ANON_MAX; i++) {
        if (kvf_cli_anon[i].p == pool) {
            kvf_cli_anon[i].p = NULL;
            pthread_mutex_unlock(&kvf_cli_anon_lock);
            munmap(pool, len);
            return;
        }
    }
    pthread_mutex_unlock(&kvf_cli_anon_lock);
    kvf_mem_free(pool);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    kvf_cli_self = argv[0];
    kvf_log_init();
    kvf_cli_config_init();
    if (kvf_config_check_file() > 0) {
        return KVF_CLI_USAGE;
    }
    return kvf_cli_dispatch(kvf_cli_commands, "kvferry", argc, argv);
}
