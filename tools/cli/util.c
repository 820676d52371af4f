/*
 * Helpers every command shares: the path of this executable (to spawn
 * helper processes), size and duration parsing and formatting, and
 * benchmark pools (filled from a seed, pages touched up front).
 */
#include "tools/cli/cli.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "tools/cli/rng.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>

const char *kvf_cli_self = "kvferry";

kvf_status_t kvf_cli_parse_size(const char *text, uint64_t *bytes_p)
{
    static const struct {
        char ch;
        uint64_t mult;
    } units[] = {{'K', 1ull << 10},
                 {'M', 1ull << 20},
                 {'G', 1ull << 30},
                 {'T', 1ull << 40}};
    uint64_t mult = 1;
    char *end;
    double v;
    size_t i;

    if (text == NULL || *text == '\0') {
        return KVF_ERR_INVALID_PARAM;
    }
    errno = 0;
    v = strtod(text, &end);
    if (errno != 0 || end == text || v < 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    while (*end == ' ') {
        end++;
    }
    for (i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (toupper((unsigned char)*end) == units[i].ch) {
            mult = units[i].mult;
            end++;
            break;
        }
    }
    if (strcasecmp(end, "") != 0 && strcasecmp(end, "B") != 0 &&
        strcasecmp(end, "iB") != 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (v * (double)mult > 1.8e19) {
        return KVF_ERR_INVALID_PARAM;
    }
    *bytes_p = (uint64_t)(v * (double)mult + 0.5);
    return KVF_OK;
}

kvf_status_t kvf_cli_parse_ms(const char *text, uint64_t *ms_p)
{
    char *end;
    double v;

    if (text == NULL || *text == '\0') {
        return KVF_ERR_INVALID_PARAM;
    }
    errno = 0;
    v = strtod(text, &end);
    if (errno != 0 || end == text || v < 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (*end == '\0' || strcmp(end, "ms") == 0) {
        *ms_p = (uint64_t)v;
    } else if (strcmp(end, "s") == 0) {
        *ms_p = (uint64_t)(v * 1000.0);
    } else if (strcmp(end, "m") == 0 || strcmp(end, "min") == 0) {
        *ms_p = (uint64_t)(v * 60000.0);
    } else {
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

void kvf_cli_fmt_size(uint64_t bytes, char *out, size_t outlen)
{
    static const char *units[] = {"B", "KB", "MB", "GB", "TB"};
    double v = (double)bytes;
    int u = 0;

    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(out, outlen, "%.1f %s", v, units[u]);
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
    kvf_prng_t rng;
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
    kvf_prng_seed(&rng, seed);
    kvf_prng_fill(&rng, p, len);
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

void kvf_cli_stopped(const char *daemon, int sig)
{
    if (sig == SIGINT) {
        fprintf(stderr, "kvferry %s: stopped\n", daemon);
    }
}
