/*
 * Helpers every command shares: the path of this executable (to spawn
 * helper processes), option value parsing that exits with a message, and
 * benchmark pools (filled from a seed, pages touched up front).
 */
#include "tools/cli/cli.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "core/config.h"
#include "core/hash.h"

const char *kvf_cli_self = "kvferry";

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
