/*
 * Helpers every command shares: the path of this executable (to spawn
 * helper processes), size and duration parsing and formatting, and
 * benchmark pools (filled from a seed, pages touched up front).
 */
#include "tools/cli/cli.h"

#include <kvferry/config.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <unistd.h>

#include "core/rng.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>

const char *kvf_cli_self = "kvferry";

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

void kvf_cli_stopped(const char *daemon, int sig)
{
    if (sig == SIGINT) {
        fprintf(stderr, "kvferry %s: stopped\n", daemon);
    }
}

/* MemAvailable of /proc/meminfo in bytes, or 0 when unknown. */
static uint64_t kvf_cli_mem_available(void)
{
    unsigned long long kb = 0;
    char line[256];
    FILE *f = fopen("/proc/meminfo", "r");

    if (f == NULL) {
        return 0;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "MemAvailable: %llu", &kb) == 1) {
            break;
        }
    }
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* The cgroup (v2) memory.max of this process, or 0 when none. */
static uint64_t kvf_cli_cgroup_max(void)
{
    unsigned long long v = 0;
    char line[512], path[600];
    FILE *f = fopen("/proc/self/cgroup", "r");

    if (f == NULL) {
        return 0;
    }
    path[0] = '\0';
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "0::", 3) == 0) {
            line[strcspn(line, "\n")] = '\0';
            snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.max",
                     line + 3);
        }
    }
    fclose(f);
    if (path[0] == '\0' || (f = fopen(path, "r")) == NULL) {
        return 0;
    }
    if (fscanf(f, "%llu", &v) != 1) {
        v = 0; /* "max" */
    }
    fclose(f);
    return (uint64_t)v;
}

int kvf_cli_check_memory(const char *cmd, const char *option, uint64_t bytes,
                         unsigned count)
{
    uint64_t need = bytes * count, avail = kvf_cli_mem_available();
    uint64_t cg = kvf_cli_cgroup_max();
    char n[32], a[32], what[64] = "";
    struct rlimit rl;

    kvf_fmt_size(need, n, sizeof(n));
    if (count > 1) {
        char one[32];

        kvf_fmt_size(bytes, one, sizeof(one));
        snprintf(what, sizeof(what), " (%u pools of %s)", count, one);
    }
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        need >= (uint64_t)rl.rlim_cur) {
        kvf_fmt_size((uint64_t)rl.rlim_cur, a, sizeof(a));
        fprintf(stderr,
                "kvferry %s: %s %s%s exceeds this process's address-space "
                "limit of %s (ulimit -v) \xe2\x80\x94 pick a smaller %s or "
                "raise the limit\n",
                cmd, option, n, what, a, option);
        return -1;
    }
    if (cg > 0 && need >= cg) {
        kvf_fmt_size(cg, a, sizeof(a));
        fprintf(stderr,
                "kvferry %s: %s %s%s exceeds the memory limit of this "
                "cgroup, %s (memory.max) \xe2\x80\x94 pick a smaller %s\n",
                cmd, option, n, what, a, option);
        return -1;
    }
    if (avail > 0 && need > avail) {
        kvf_fmt_size(avail, a, sizeof(a));
        fprintf(stderr,
                "kvferry %s: %s %s%s does not fit this machine: %s of memory "
                "available (MemAvailable in /proc/meminfo) \xe2\x80\x94 "
                "pick a smaller %s\n",
                cmd, option, n, what, a, option);
        return -1;
    }
    return 0;
}

/* A listener on a non-loopback address opens this process's memory or
 * metadata to the network: without a cluster secret it is refused (the
 * library refuses it too; this says what to do). */
static int kvf_cli_refuse_open_bind(const char *cmd, const char *addr,
                                    const struct sockaddr_in *sin)
{
    const char *file = kvf_config_get("secret_file");
    const char *insecure = kvf_config_get("insecure");

    if ((ntohl(sin->sin_addr.s_addr) >> 24) == 127 ||
        (file != NULL && file[0] != '\0') ||
        (insecure != NULL && strcmp(insecure, "1") == 0)) {
        return 0;
    }
    fprintf(stderr,
            "kvferry %s: refusing to listen on %s without a cluster secret "
            "\xe2\x80\x94 create one ('head -c 32 /dev/urandom > secret; "
            "chmod 600 secret'), copy it to every host and pass "
            "--secret-file secret (docs/security.md), or --insecure on a "
            "network you trust\n",
            cmd, addr);
    return -1;
}

int kvf_cli_check_listen(const char *cmd, const char *option, const char *addr)
{
    struct sockaddr_in sin = {0};
    struct addrinfo hints = {0}, *ai = NULL;
    char host[256];
    const char *colon = addr != NULL ? strrchr(addr, ':') : NULL;
    long port;
    int fd, one = 1, rc = 0, err;

    if (colon == NULL || (size_t)(colon - addr) >= sizeof(host)) {
        return 0;
    }
    port = strtol(colon + 1, NULL, 10);
    if (port < 0 || port > 65535) {
        return 0;
    }
    snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
    hints.ai_family = AF_INET;
    if (getaddrinfo(host[0] ? host : "0.0.0.0", NULL, &hints, &ai) != 0 ||
        ai == NULL) {
        return 0;
    }
    sin = *(struct sockaddr_in *)ai->ai_addr;
    freeaddrinfo(ai);
    if (kvf_cli_refuse_open_bind(cmd, addr, &sin) != 0) {
        return KVF_CLI_USAGE;
    }
    if (port == 0) {
        return 0; /* any free port */
    }
    sin.sin_port = htons((uint16_t)port);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return 0;
    }
    /* as the library binds: SO_REUSEADDR, so only a listener conflicts */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
        char why[128];

        err = errno;
        snprintf(why, sizeof(why), "%s", strerror(err));
        why[0] = (char)tolower((unsigned char)why[0]);
        fprintf(stderr,
                "kvferry %s: cannot listen on %s: %s \xe2\x80\x94 %s %s "
                "HOST:PORT%s\n",
                cmd, addr, why,
                err == EADDRINUSE ? "pick another with"
                                  : "pick an address of this machine with",
                option,
                err == EADDRINUSE ? " or stop the process using it" : "");
        rc = -1;
    }
    close(fd);
    return rc;
}

void kvf_cli_store_error(const char *cmd, const char *key, kvf_status_t s,
                         const char *master)
{
    const char *dash = "\xe2\x80\x94";

    switch (s) {
    case KVF_ERR_UNAVAILABLE:
        fprintf(stderr,
                "kvferry: %s: no storage node is registered with master %s "
                "%s start one with 'kvferry node --master %s'\n",
                cmd, master, dash, master);
        break;
    case KVF_ERR_CONNECT:
    case KVF_ERR_TIMEOUT:
        fprintf(stderr,
                "kvferry: %s: cannot reach the store master at %s (%s) %s "
                "start one with 'kvferry master --listen %s', or name a "
                "running one with --master HOST:PORT\n",
                cmd, master,
                s == KVF_ERR_CONNECT ? "connection refused" : "timed out", dash,
                master);
        break;
    case KVF_ERR_PEER_UNREACHABLE:
    case KVF_ERR_PEER_CLOSED:
        fprintf(stderr,
                "kvferry: %s %s: the storage node holding it does not answer "
                "%s restart it ('kvferry node --master %s'); the master "
                "drops a silent node after its --node-ttl\n",
                cmd, key, dash, master);
        break;
    case KVF_ERR_NO_KEY:
        fprintf(stderr,
                "kvferry: %s %s: no such key in the store at %s %s "
                "'kvferry ls --master %s' lists the keys\n",
                cmd, key, master, dash, master);
        break;
    case KVF_ERR_NO_SPACE:
        fprintf(stderr,
                "kvferry: %s %s: the store is full %s remove keys "
                "('kvferry rm') or add a node ('kvferry node --master %s')\n",
                cmd, key, dash, master);
        break;
    case KVF_ERR_MSG_TOO_LARGE:
        fprintf(stderr,
                "kvferry: %s %s: the object is larger than every node's pool "
                "%s start a node with a larger --pool\n",
                cmd, key, dash);
        break;
    default:
        fprintf(stderr, "kvferry: %s %s: %s (%s)\n", cmd, key,
                kvf_status_str(s), kvf_status_name(s));
        break;
    }
}
