/*
 * Integration test helpers (see test_util.h).
 */
#include "test_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/auth.h"
#include "core/rng.h"
#include "core/sock.h"
#include "core/time.h"

#define KVF_TEST_MACS 8192

static char kvf_test_secret_path[256];
static kvf_wire_mac_t kvf_test_macs[KVF_TEST_MACS];

kvf_wire_mac_t *kvf_test_mac(int fd)
{
    return fd >= 0 && fd < KVF_TEST_MACS ? &kvf_test_macs[fd] : NULL;
}

int kvf_test_connect(const char *host, uint16_t port, int timeout_ms,
                     const char *proto, int *fd_p)
{
    kvf_wire_mac_t mac, *slot;
    kvf_status_t st;
    int fd;

    st = kvf_auth_connect(host, port, timeout_ms, proto, &fd, &mac);
    if (st != KVF_OK) {
        return st;
    }
    slot = kvf_test_mac(fd);
    if (slot == NULL) {
        kvf_wire_mac_free(&mac);
        close(fd);
        return KVF_ERR_NO_RESOURCE;
    }
    kvf_wire_mac_free(slot);
    *slot = mac;
    *fd_p = fd;
    return KVF_OK;
}
int kvf_test_auth_client(int fd, const char *host, const char *addr)
{
    kvf_wire_mac_t *slot = kvf_test_mac(fd);

    if (slot == NULL) {
        return KVF_ERR_NO_RESOURCE;
    }
    kvf_wire_mac_free(slot);
    return kvf_auth_client(fd, host, "store", addr, kvf_time_ms() + 5000, slot);
}

int kvf_test_connect_from(const char *src, const char *addr)
{
    char host[KVF_HOST_MAX];
    struct sockaddr_in sa = {0}, me = {0};
    uint16_t port;
    int fd;

    if (kvf_sock_parse_addr(addr, host, sizeof(host), &port) != KVF_OK) {
        return -1;
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    me.sin_family = AF_INET;
    inet_pton(AF_INET, src, &me.sin_addr);
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    inet_pton(AF_INET, host, &sa.sin_addr);
    if (fd < 0 || bind(fd, (struct sockaddr *)&me, sizeof(me)) != 0 ||
        connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    return fd;
}

int kvf_test_auth_from(const char *src, const char *addr)
{
    char host[KVF_HOST_MAX];
    uint16_t port;
    int fd = kvf_test_connect_from(src, addr);

    if (fd >= 0 &&
        (kvf_sock_parse_addr(addr, host, sizeof(host), &port) != KVF_OK ||
         kvf_test_auth_client(fd, host, addr) != KVF_OK)) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static pid_t kvf_test_secret_owner;

int kvf_test_secret_new(char *out, size_t outlen)
{
    unsigned char key[32];
    FILE *f;
    int fd, ok;

    f = fopen("/dev/urandom", "rb");
    ok = f != NULL && fread(key, 1, sizeof(key), f) == sizeof(key);
    if (f != NULL) {
        fclose(f);
    }
    snprintf(out, outlen, "/tmp/kvf-test-secret-XXXXXX");
    fd = ok ? mkstemp(out) : -1; /* mode 0600 */
    if (fd < 0) {
        return -1;
    }
    ok = write(fd, key, sizeof(key)) == (ssize_t)sizeof(key);
    close(fd);
    return ok ? 0 : -1;
}

static void kvf_test_secret_remove(void)
{
    if (getpid() == kvf_test_secret_owner) { /* not in forked children */
        unlink(kvf_test_secret_path);
    }
}

/* A secret of this test binary's own, inherited by what it starts. */
__attribute__((constructor)) static void kvf_test_secret_setup(void)
{
    if (getenv("KVF_SECRET_FILE") != NULL ||
        kvf_test_secret_new(kvf_test_secret_path,
                            sizeof(kvf_test_secret_path)) != 0) {
        return;
    }
    kvf_test_secret_owner = getpid();
    setenv("KVF_SECRET_FILE", kvf_test_secret_path, 1);
    atexit(kvf_test_secret_remove);
}

int kvf_test_target_start(kvf_test_target_t *t, uint64_t pool_len,
                          uint64_t seed, const char *extra1, const char *extra2)
{
    const char *bin = getenv("KVF_BIN");
    char pool[32], seeds[32], line[512];
    char *argv[12];
    int fds[2], n = 0;
    FILE *f;

    if (bin == NULL) {
        fprintf(stderr, "KVF_BIN is not set\n");
        return -1;
    }
    snprintf(pool, sizeof(pool), "%lu", (unsigned long)pool_len);
    snprintf(seeds, sizeof(seeds), "%lu", (unsigned long)seed);
    argv[n++] = (char *)bin;
    argv[n++] = "target";
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--pool";
    argv[n++] = pool;
    argv[n++] = "--seed";
    argv[n++] = seeds;
    if (extra1 != NULL) {
        argv[n++] = (char *)extra1;
    }
    if (extra2 != NULL) {
        argv[n++] = (char *)extra2;
    }
    argv[n] = NULL;
    if (pipe(fds) < 0) {
        return -1;
    }
    t->pid = fork();
    if (t->pid < 0) {
        return -1;
    }
    if (t->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execv(bin, argv);
        _exit(127);
    }
    close(fds[1]);
    f = fdopen(fds[0], "r");
    if (f == NULL || fgets(line, sizeof(line), f) == NULL ||
        sscanf(line, "segment=%127s pool=0x%lx+%lu", t->segment,
               (unsigned long *)&t->pool_addr,
               (unsigned long *)&t->pool_len) != 3) {
        fprintf(stderr, "target did not start\n");
        if (f != NULL) {
            fclose(f);
        }
        kill(t->pid, SIGKILL);
        waitpid(t->pid, NULL, 0);
        return -1;
    }
    fclose(f);
    return 0;
}

int kvf_test_target_stop(kvf_test_target_t *t)
{
    int status = 0, i;

    if (t->pid <= 0) {
        return -1;
    }
    kill(t->pid, SIGTERM);
    for (i = 0; i < 500; i++) {
        if (waitpid(t->pid, &status, WNOHANG) == t->pid) {
            t->pid = 0;
            return status;
        }
        usleep(10000);
    }
    kill(t->pid, SIGKILL);
    waitpid(t->pid, &status, 0);
    t->pid = 0;
    return status;
}

void kvf_test_pool_bytes(void *buf, size_t len, uint64_t seed)
{
    kvf_rng_t rng;

    kvf_rng_seed(&rng, seed);
    kvf_rng_fill(&rng, buf, len);
}

/* n distinct random block indices among nslots. */
uint32_t *kvf_test_pick(kvf_rng_t *rng, uint32_t nslots, uint32_t n)
{
    uint32_t *perm = malloc(nslots * sizeof(*perm)), i, j, t;

    for (i = 0; i < nslots; i++) {
        perm[i] = i;
    }
    for (i = 0; i < n; i++) {
        j = i + (uint32_t)kvf_rng_below(rng, nslots - i);
        t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    return perm;
}

int kvf_test_fd_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    if (d == NULL) {
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] != '.') {
            n++;
        }
    }
    closedir(d);
    return n - 1; /* the directory's own fd */
}
