/*
 * UCX's tcp transport against a process that holds no secret and runs
 * as another local user:
 * - with ucx_tcp=1 (the opt-in), such a process, which never runs the
 *   side channel's handshake, builds a UCP worker address for the
 *   target's UCX tcp listener (its own address with the target's port,
 *   which /proc/net/tcp shows every user) and reads 4 KiB of the
 *   target's registered pool through UCX's software RMA, byte for byte:
 *   UCX's tcp transport checks no key and no secret. That is why
 *   - by default a target refuses to start its ucx transport where UCX
 *     would use tcp (loopback included), with one line naming ucx_tcp,
 *     and nothing of it listens.
 * The stranger is this binary run again as `test_hostile_ucx stranger
 * PORTS ADDR SEED` (a fresh process, uid 4242, no secret in its
 * environment). Skipped (77) without UCX or when not root.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

#include <kvferry/kvferry.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef KVF_TEST_HAVE_UCX
#include <ucp/api/ucp.h>
#endif

#define POOL      (1u << 20)
#define SEED      31
#define READ_LEN  4096
#define OTHER_UID 4242

#ifdef KVF_TEST_HAVE_UCX

static double now_s(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int g_done;
static ucs_status_t g_st;

static void get_done(void *req, ucs_status_t st, void *arg)
{
    (void)req;
    (void)arg;
    g_done = 1;
    g_st = st;
}

static void ep_failed(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    (void)arg;
    (void)ep;
    (void)st;
}

/* One try: a worker address like w's own, naming port instead (its last
 * two bytes, network order) and another worker id (bytes 1..8), then a
 * GET of len bytes at raddr with a key of the stranger's own memory.
 * 0 when the bytes came. */
static int stranger_get(ucp_context_h ctx, ucp_worker_h w, unsigned port,
                        uint64_t raddr, void *buf, size_t len)
{
    ucp_mem_map_params_t mp = {0};
    ucp_request_param_t rp = {0};
    ucp_ep_params_t ep = {0};
    unsigned char *addr;
    ucp_address_t *mine;
    ucp_rkey_h rkey;
    size_t n, rlen;
    ucp_mem_h mh;
    void *rbuf, *req;
    ucp_ep_h e;
    double t0;
    int i;

    if (ucp_worker_get_address(w, &mine, &n) != UCS_OK || n < 12) {
        return -1;
    }
    addr = malloc(n);
    memcpy(addr, mine, n);
    ucp_worker_release_address(w, mine);
    for (i = 1; i < 9; i++) {
        addr[i] ^= 0x5a;
    }
    addr[n - 2] = (unsigned char)(port >> 8);
    addr[n - 1] = (unsigned char)port;
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = (ucp_address_t *)addr;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = ep_failed;
    if (ucp_ep_create(w, &ep, &e) != UCS_OK) {
        free(addr);
        return -1;
    }
    mp.field_mask =
        UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = buf;
    mp.length = len;
    if (ucp_mem_map(ctx, &mp, &mh) != UCS_OK ||
        ucp_rkey_pack(ctx, mh, &rbuf, &rlen) != UCS_OK ||
        ucp_ep_rkey_unpack(e, rbuf, &rkey) != UCS_OK) {
        free(addr);
        return -1;
    }
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
    rp.cb.send = get_done;
    g_done = 0;
    req = ucp_get_nbx(e, buf, len, raddr, rkey, &rp);
    if (UCS_PTR_IS_ERR(req)) {
        free(addr);
        return -1;
    }
    g_done |= req == NULL;
    g_st = req == NULL ? UCS_OK : g_st;
    t0 = now_s();
    while (!g_done && now_s() - t0 < 5) {
        ucp_worker_progress(w);
    }
    free(addr);
    return g_done && g_st == UCS_OK ? 0 : -1;
}

/* The stranger: another uid, no secret, only UCX. Exit 0: it read the
 * pool's bytes; 1: it read other bytes; 2: it read nothing. */
static int stranger_main(char **argv)
{
    unsigned char want[READ_LEN], *got = calloc(1, READ_LEN);
    uint64_t raddr = strtoull(argv[3], NULL, 0);
    ucp_params_t p = {0};
    ucp_worker_params_t wp = {0};
    ucp_config_t *cfg;
    ucp_context_h ctx;
    ucp_worker_h w;
    char *ports = argv[2], *tok, *save;

    if (setgid(OTHER_UID) != 0 || setuid(OTHER_UID) != 0) {
        return 3;
    }
    unsetenv("KVF_SECRET_FILE");
    setenv("UCX_TLS", "tcp", 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TCP_MAX_CONN_RETRIES", "3", 1);
    kvf_test_pool_bytes(want, sizeof(want), strtoull(argv[4], NULL, 0));
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK ||
        ucp_init(&p, cfg, &ctx) != UCS_OK ||
        ucp_worker_create(ctx, &wp, &w) != UCS_OK) {
        return 4;
    }
    for (tok = strtok_r(ports, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        if (stranger_get(ctx, w, (unsigned)atoi(tok), raddr, got, READ_LEN) ==
            0) {
            printf("stranger (uid %d): port %s: read %d bytes of the pool\n",
                   (int)getuid(), tok, READ_LEN);
            return memcmp(got, want, READ_LEN) == 0 ? 0 : 1;
        }
    }
    return 2;
}

/* The ports pid listens on, as "p1,p2,..." (the test, as root, lists
 * its fds; a stranger would go through /proc/net/tcp, which shows
 * every listening socket and its owner's uid to everyone). */
static void listen_ports(pid_t pid, char *out, size_t len)
{
    char path[64], link[64], line[512];
    unsigned long ino, want;
    unsigned port, st;
    struct dirent *d;
    size_t n = 0;
    FILE *f;
    DIR *dir;

    out[0] = '\0';
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    dir = opendir(path);
    assert_non_null(dir);
    while ((d = readdir(dir)) != NULL) {
        snprintf(path, sizeof(path), "/proc/%d/fd/%.16s", (int)pid, d->d_name);
        memset(link, 0, sizeof(link));
        if (readlink(path, link, sizeof(link) - 1) <= 0 ||
            sscanf(link, "socket:[%lu]", &want) != 1) {
            continue;
        }
        f = fopen("/proc/net/tcp", "r");
        while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
            if (sscanf(line,
                       " %*d: %*x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x "
                       "%*u %*u %lu",
                       &port, &st, &ino) == 3 &&
                ino == want && st == 0x0a && n + 8 < len) {
                n += (size_t)snprintf(out + n, len - n, "%s%u", n ? "," : "",
                                      port);
            }
        }
        if (f != NULL) {
            fclose(f);
        }
    }
    closedir(dir);
}

/* Runs the stranger against t; its exit status. */
static int run_stranger(const kvf_test_target_t *t)
{
    char ports[256], addr[32], seed[16], self[256];
    ssize_t n;
    pid_t pid;
    int st;

    listen_ports(t->pid, ports, sizeof(ports));
    print_message("target %d listens on %s\n", (int)t->pid, ports);
    snprintf(addr, sizeof(addr), "0x%lx", (unsigned long)t->pool_addr);
    snprintf(seed, sizeof(seed), "%d", SEED);
    n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    assert_true(n > 0);
    self[n] = '\0';
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl(self, self, "stranger", ports, addr, seed, (char *)NULL);
        _exit(5);
    }
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 6;
}

/* The opt-in: a stranger reads the registered pool. */
static void test_stranger_reads_with_opt_in(void **state)
{
    kvf_test_target_t t;
    int rc;

    (void)state;
    setenv("KVF_UCX_TCP", "1", 1);
    assert_int_equal(
        kvf_test_target_start(&t, POOL, SEED, "--transports", "ucx"), 0);
    unsetenv("KVF_UCX_TCP");
    rc = run_stranger(&t);
    print_message("stranger's exit: %d (0: it read the pool byte for byte)\n",
                  rc);
    assert_int_equal(rc, 0);
    kvf_test_target_stop(&t);
}

/* The default: the target's ucx transport does not start over UCX's
 * tcp (the target serves its other transports), so a ucx initiator
 * finds no way in and the stranger reads nothing. */
static void test_refused_by_default(void **state)
{
    kvf_engine_params_t p = {0};
    kvf_test_target_t t;
    kvf_peer_h peer;
    kvf_engine_h e;

    (void)state;
    unsetenv("KVF_UCX_TCP");
    assert_int_equal(
        kvf_test_target_start(&t, POOL, SEED, "--transports", "ucx"), 0);
    setenv("KVF_UCX_TCP", "1", 1); /* the initiator's own ucx may start */
    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_TRANSPORTS |
                   KVF_ENGINE_PARAM_TIMEOUT;
    p.no_listen = 1;
    p.transports = "ucx";
    p.timeout_ms = 2000;
    assert_int_equal(kvf_engine_create(&p, &e), KVF_OK);
    unsetenv("KVF_UCX_TCP");
    assert_int_not_equal(kvf_peer_open(e, t.segment, &peer), KVF_OK);
    kvf_engine_destroy(e);
    assert_int_equal(run_stranger(&t), 2);
    kvf_test_target_stop(&t);
}

#endif

int main(int argc, char **argv)
{
#ifndef KVF_TEST_HAVE_UCX
    (void)argc;
    (void)argv;
    return 77; /* built without UCX */
#else
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_by_default),
        cmocka_unit_test(test_stranger_reads_with_opt_in),
    };

    if (argc == 5 && strcmp(argv[1], "stranger") == 0) {
        int rc = stranger_main(argv);

        fflush(stdout);
        _exit(rc); /* no exit handlers: its UCX context is left as it is */
    }
    if (geteuid() != 0) {
        fprintf(stderr, "not root: cannot run the stranger as another uid\n");
        return 77;
    }
    setenv("UCX_TLS", "tcp,self", 1);
    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
