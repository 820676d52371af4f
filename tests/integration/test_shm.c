/*
 * Integration test of the shm transport and of transport choice, with
 * real processes on one host: a `kvferry target` child (pool from
 * kvf_mem_alloc), or a forked child engine that also registers plain
 * malloc memory (moved through the staging path) and deregisters / frees
 * on command.
 *
 * Checks: same host -> shm; KVF_TRANSPORTS=tcp, the engine parameter and
 * a target offering only tcp -> tcp; a target whose host identity
 * differs (fake boot id in a mount namespace) -> shm refused, tcp used;
 * random blocks READ and WRITE verified byte for byte and by the target's
 * checksums; out-of-bounds entries refused while the rest of the batch
 * moves and the target keeps serving; deregistration revokes access and
 * a freed allocation is unmapped by the initiator; a killed target turns
 * transfers into errors within the timeout; the populator thread fills
 * the page tables of a target's whole pool after a first copy and is
 * joined when its engine goes; every test returns its allocations, file
 * descriptors and mappings.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kvferry/kvferry.h>
#include <kvferry/perf.h>

#include "core/checksum.h"
#include "core/rng.h"
#include "transport/transport.h"
#include "mem/shm_mem.h"
#include "test_util.h"

#define POOL    (32u << 20)
#define SEED    21
#define TIMEOUT 3000
#define BS      8192

extern const kvf_transport_ops_t kvf_shm_ops;

typedef struct {
    long blocks0, bytes0;
    int fds0;
    int maps0;
} baseline_t;

/* Mappings of kvferry memfds in this process (ours or a target's). */
static int memfd_maps(void)
{
    char line[512];
    FILE *f = fopen("/proc/self/maps", "r");
    int n = 0;

    if (f == NULL) {
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strstr(line, "memfd:kvferry (deleted)") != NULL) {
            n++;
        }
    }
    fclose(f);
    return n;
}

static void baseline_take(baseline_t *b)
{
    kvf_alloc_stats(&b->blocks0, &b->bytes0);
    b->fds0 = kvf_test_fd_count();
    b->maps0 = memfd_maps();
}

static void baseline_check(const baseline_t *b)
{
    long blocks, bytes;

    kvf_alloc_stats(&blocks, &bytes);
    assert_int_equal(blocks, b->blocks0);
    assert_int_equal(bytes, b->bytes0);
    assert_int_equal(kvf_test_fd_count(), b->fds0);
    assert_int_equal(memfd_maps(), b->maps0);
}

static kvf_engine_h initiator(const char *transports)
{
    kvf_engine_params_t p = {0};
    kvf_engine_h e;

    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_CONNS |
                   KVF_ENGINE_PARAM_TIMEOUT;
    p.no_listen = 1;
    p.conns = 2;
    p.timeout_ms = TIMEOUT;
    if (transports != NULL) {
        p.field_mask |= KVF_ENGINE_PARAM_TRANSPORTS;
        p.transports = transports;
    }
    assert_int_equal(kvf_engine_create(&p, &e), KVF_OK);
    return e;
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Frees n pointers. */
static void free_all(int n, ...)
{
    va_list ap;

    va_start(ap, n);
    while (n-- > 0) {
        free(va_arg(ap, void *));
    }
    va_end(ap);
}

/* Submits (with flags), waits, gives each op's status; *done_p: whether
 * the batch was complete when submit returned (moved inline). */
static kvf_status_t run_flags(kvf_engine_h e, kvf_op_t *ops, size_t n,
                              kvf_status_t *st, unsigned flags, int *done_p)
{
    kvf_batch_h b;
    kvf_status_t status;
    size_t i, bytes;

    assert_int_equal(kvf_batch_submit_ex(e, ops, n, flags, &b), KVF_OK);
    if (done_p != NULL) {
        *done_p = kvf_batch_test(b) != KVF_INPROGRESS;
    }
    status = kvf_batch_wait(b, TIMEOUT * 2);
    for (i = 0; st != NULL && i < n; i++) {
        st[i] = kvf_batch_op_status(b, i, &bytes);
        if (st[i] == KVF_OK) {
            assert_int_equal(bytes, ops[i].length);
        }
    }
    kvf_batch_destroy(b);
    return status;
}

static kvf_status_t run(kvf_engine_h e, kvf_op_t *ops, size_t n,
                        kvf_status_t *st)
{
    return run_flags(e, ops, n, st, 0, NULL);
}

/*
 * READ n random blocks of the remote range [raddr, raddr+POOL) whose
 * bytes are `expect`, verify; then WRITE fresh random blocks, verify
 * them with the target's checksums and by reading them back.
 */
static void round_trip(kvf_engine_h e, kvf_peer_h peer, unsigned char *local,
                       uint64_t raddr, unsigned char *expect, uint64_t seed)
{
    const uint32_t n = 1024, slots = POOL / BS;
    kvf_op_t *ops = calloc(n, sizeof(*ops));
    uint64_t *rem = calloc(n, sizeof(*rem)), *sums = calloc(n, sizeof(*sums));
    size_t *lens = calloc(n, sizeof(*lens));
    uint32_t *lp, *rp, i;
    kvf_rng_t rng;

    kvf_rng_seed(&rng, seed);
    lp = kvf_test_pick(&rng, slots, n);
    rp = kvf_test_pick(&rng, slots, n);
    for (i = 0; i < n; i++) {
        ops[i] = (kvf_op_t){KVF_OP_READ, local + (size_t)lp[i] * BS, peer,
                            raddr + (uint64_t)rp[i] * BS, BS};
    }
    assert_int_equal(run(e, ops, n, NULL), KVF_OK);
    for (i = 0; i < n; i++) {
        assert_memory_equal(local + (size_t)lp[i] * BS,
                            expect + (size_t)rp[i] * BS, BS);
    }
    /* WRITE new bytes to other random blocks */
    kvf_rng_fill(&rng, local, POOL);
    free(rp);
    rp = kvf_test_pick(&rng, slots, n);
    for (i = 0; i < n; i++) {
        ops[i].type = KVF_OP_WRITE;
        ops[i].remote = raddr + (uint64_t)rp[i] * BS;
        rem[i] = ops[i].remote;
        lens[i] = BS;
        memcpy(expect + (size_t)rp[i] * BS, local + (size_t)lp[i] * BS, BS);
    }
    assert_int_equal(run(e, ops, n, NULL), KVF_OK);
    assert_int_equal(kvf_peer_checksum(peer, rem, lens, n, sums), KVF_OK);
    for (i = 0; i < n; i++) {
        assert_true(sums[i] == kvf_checksum(local + (size_t)lp[i] * BS, BS));
    }
    /* and back into a cleared buffer: the whole range as the target has it */
    memset(local, 0, POOL);
    for (i = 0; i < n; i++) {
        ops[i] = (kvf_op_t){KVF_OP_READ, local + (size_t)i * BS, peer,
                            raddr + (uint64_t)rp[i] * BS, BS};
    }
    assert_int_equal(run(e, ops, n, NULL), KVF_OK);
    for (i = 0; i < n; i++) {
        assert_memory_equal(local + (size_t)i * BS, expect + (size_t)rp[i] * BS,
                            BS);
    }
    free_all(6, lp, rp, ops, rem, sums, lens);
}

/* ---- a forked child engine: region A from kvf_mem_alloc, region B from
 * malloc; commands on a pipe: 'd' deregister A, 'f' free A, 'q' quit. */

typedef struct {
    pid_t pid;
    int cmd, out;
    char segment[128];
    uint64_t a, b;
} child_t;

static void child_main(int cmd, int out)
{
    kvf_engine_params_t p = {0};
    kvf_region_h ra, rb;
    kvf_engine_h e;
    void *a = NULL;
    unsigned char *b;
    char line[256], c;
    struct pollfd pfd = {.fd = cmd, .events = POLLIN};

    p.field_mask = KVF_ENGINE_PARAM_LISTEN | KVF_ENGINE_PARAM_TIMEOUT;
    p.listen = "127.0.0.1:0";
    p.timeout_ms = TIMEOUT;
    b = malloc(POOL);
    if (kvf_engine_create(&p, &e) != KVF_OK ||
        kvf_mem_alloc(POOL, KVF_MEM_HOST, 0, &a) != KVF_OK || b == NULL) {
        _exit(2);
    }
    kvf_test_pool_bytes(a, POOL, SEED);
    kvf_test_pool_bytes(b, POOL, SEED + 1);
    if (kvf_engine_reg(e, a, POOL, KVF_MEM_HOST, 0, &ra) != KVF_OK ||
        kvf_engine_reg(e, b, POOL, KVF_MEM_HOST, 0, &rb) != KVF_OK) {
        _exit(3);
    }
    snprintf(line, sizeof(line), "segment=%s a=0x%lx b=0x%lx\n",
             kvf_engine_segment_name(e), (unsigned long)(uintptr_t)a,
             (unsigned long)(uintptr_t)b);
    if (write(out, line, strlen(line)) < 0) {
        _exit(4);
    }
    while (poll(&pfd, 1, 60000) > 0 && read(cmd, &c, 1) == 1 && c != 'q') {
        if (c == 'd') {
            kvf_engine_dereg(e, ra);
        } else if (c == 'f') {
            kvf_mem_free(a);
        }
        if (write(out, "k", 1) != 1) {
            break;
        }
    }
    _exit(0);
}

static void child_start(child_t *ch)
{
    int cmd[2], out[2];
    char line[256];
    ssize_t n;

    assert_int_equal(pipe(cmd), 0);
    assert_int_equal(pipe(out), 0);
    ch->pid = fork();
    assert_true(ch->pid >= 0);
    if (ch->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(cmd[1]);
        close(out[0]);
        child_main(cmd[0], out[1]);
    }
    close(cmd[0]);
    close(out[1]);
    ch->cmd = cmd[1];
    ch->out = out[0];
    n = read(ch->out, line, sizeof(line) - 1);
    assert_true(n > 0);
    line[n] = '\0';
    assert_int_equal(sscanf(line, "segment=%127s a=0x%lx b=0x%lx", ch->segment,
                            (unsigned long *)&ch->a, (unsigned long *)&ch->b),
                     3);
}

static void child_cmd(child_t *ch, char c)
{
    char k = 0;

    assert_int_equal(write(ch->cmd, &c, 1), 1);
    assert_int_equal(read(ch->out, &k, 1), 1);
    assert_int_equal(k, 'k');
}

static void child_stop(child_t *ch)
{
    int status = 0;

    assert_int_equal(write(ch->cmd, "q", 1), 1);
    close(ch->cmd);
    close(ch->out);
    assert_int_equal(waitpid(ch->pid, &status, 0), ch->pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* An initiator engine with `local` registered and a peer open over shm
 * to a forked child engine. */
typedef struct {
    child_t ch;
    kvf_engine_h e;
    kvf_region_h r;
    kvf_peer_h peer;
} session_t;

static void session_open(session_t *ss, unsigned char *local)
{
    child_start(&ss->ch);
    ss->e = initiator(NULL);
    assert_int_equal(
        kvf_engine_reg(ss->e, local, POOL, KVF_MEM_HOST, 0, &ss->r), KVF_OK);
    assert_int_equal(kvf_peer_open(ss->e, ss->ch.segment, &ss->peer), KVF_OK);
    assert_string_equal(kvf_peer_transport(ss->peer), "shm");
}

static void session_close(session_t *ss)
{
    kvf_peer_close(ss->peer);
    assert_int_equal(kvf_engine_dereg(ss->e, ss->r), KVF_OK);
    kvf_engine_destroy(ss->e);
    child_stop(&ss->ch);
}

/* ---- tests --------------------------------------------------------------- */

static void test_mem_alloc(void **state)
{
    baseline_t b;
    void *p = NULL;
    long n0, n1;
    uint64_t bytes;

    (void)state;
    baseline_take(&b);
    assert_int_equal(kvf_mem_alloc(0, KVF_MEM_HOST, 0, &p),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_mem_alloc(4096, KVF_MEM_PINNED, 0, &p),
                     KVF_ERR_UNAVAILABLE);
    assert_int_equal(kvf_mem_alloc(4096, KVF_MEM_CUDA, 0, &p),
                     KVF_ERR_UNAVAILABLE);
    kvf_shm_mem_stats(&n0, &bytes);
    assert_int_equal(kvf_mem_alloc(3 << 20, KVF_MEM_HOST, 0, &p), KVF_OK);
    kvf_shm_mem_stats(&n1, &bytes);
    assert_int_equal(n1, n0 + 1);
    assert_true(bytes >= (3u << 20));
    memset(p, 0x5a, 3 << 20);
    assert_true(memfd_maps() > b.maps0);
    kvf_mem_free(p);
    kvf_mem_free(&n0); /* not ours: warns, frees nothing */
    kvf_shm_mem_stats(&n1, &bytes);
    assert_int_equal(n1, n0);
    baseline_check(&b);
}

static void check_choice(const char *target_transports,
                         const char *init_transports, const char *want)
{
    kvf_test_target_t t;
    unsigned char *local = malloc(POOL), *expect = malloc(POOL);
    kvf_engine_h e;
    kvf_peer_h peer;
    kvf_region_h r;
    baseline_t b;

    baseline_take(&b);
    assert_int_equal(
        kvf_test_target_start(&t, POOL, SEED,
                              target_transports ? "--transports" : NULL,
                              target_transports),
        0);
    kvf_test_pool_bytes(expect, POOL, SEED);
    e = initiator(init_transports);
    assert_int_equal(kvf_engine_reg(e, local, POOL, KVF_MEM_HOST, 0, &r),
                     KVF_OK);
    assert_int_equal(kvf_peer_open(e, t.segment, &peer), KVF_OK);
    assert_string_equal(kvf_peer_transport(peer), want);
    round_trip(e, peer, local, t.pool_addr, expect, 5);
    kvf_peer_close(peer);
    assert_int_equal(kvf_engine_dereg(e, r), KVF_OK);
    kvf_engine_destroy(e);
    assert_int_equal(kvf_test_target_stop(&t), 0);
    free(local);
    free(expect);
    baseline_check(&b);
}

static void test_same_host_is_shm(void **state)
{
    (void)state;
    check_choice(NULL, NULL, "shm");
}

static void test_forced_tcp_env(void **state)
{
    kvf_test_target_t t;
    kvf_engine_h e;
    kvf_peer_h peer;

    (void)state;
    /* the target offers shm; the initiator is told tcp through the env */
    assert_int_equal(kvf_test_target_start(&t, POOL, SEED, NULL, NULL), 0);
    setenv("KVF_TRANSPORTS", "tcp", 1);
    e = initiator(NULL);
    unsetenv("KVF_TRANSPORTS");
    assert_int_equal(kvf_peer_open(e, t.segment, &peer), KVF_OK);
    assert_string_equal(kvf_peer_transport(peer), "tcp");
    kvf_peer_close(peer);
    kvf_engine_destroy(e);
    assert_int_equal(kvf_test_target_stop(&t), 0);
}

static void test_forced_tcp_param(void **state)
{
    (void)state;
    check_choice(NULL, "tcp", "tcp");
}

static void test_target_without_shm(void **state)
{
    (void)state;
    check_choice("tcp", NULL, "tcp");
}

static void test_shm_listed_first(void **state)
{
    (void)state;
    check_choice(NULL, "shm,tcp", "shm");
}

/* A transport name this build lacks is refused at engine creation, not
 * silently dropped (which would leave tcp alone) */
static void test_unknown_transport_refused(void **state)
{
    kvf_engine_params_t p = {0};
    kvf_engine_h e = NULL;

    (void)state;
    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_TRANSPORTS;
    p.no_listen = 1;
    p.transports = "shm,tpc";
    assert_int_equal(kvf_engine_create(&p, &e), KVF_ERR_INVALID_PARAM);
    assert_null(e);
    p.transports = "tcp";
    assert_int_equal(kvf_engine_create(&p, &e), KVF_OK);
    kvf_engine_destroy(e);
}

/* A target that sees another boot id (its own mount namespace with a
 * file bound over /proc/sys/kernel/random/boot_id): its host identity
 * differs, shm must be refused and tcp taken. Needs root. */
static void test_other_host_id_falls_back(void **state)
{
    const char *bin = getenv("KVF_BIN");
    char cmd[1024], line[256], seg[128];
    kvf_engine_h e;
    kvf_peer_h peer;
    FILE *f;
    int fds[2];
    pid_t pid;

    (void)state;
    if (geteuid() != 0 || bin == NULL ||
        system("unshare --mount true 2>/dev/null") != 0) {
        skip();
    }
    snprintf(
        cmd, sizeof(cmd),
        "echo 00000000-1111-2222-3333-444444444444 > /tmp/kvf-fake-boot-%d"
        " && exec unshare --mount sh -c 'mount --bind /tmp/kvf-fake-boot-%d"
        " /proc/sys/kernel/random/boot_id && exec %s target --listen "
        "127.0.0.1:0 --pool 8M'",
        (int)getpid(), (int)getpid(), bin);
    assert_int_equal(pipe(fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    f = fdopen(fds[0], "r");
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof(line), f));
    fclose(f);
    assert_int_equal(sscanf(line, "segment=%127s", seg), 1);
    e = initiator(NULL);
    assert_int_equal(kvf_peer_open(e, seg, &peer), KVF_OK);
    assert_string_equal(kvf_peer_transport(peer), "tcp");
    kvf_peer_close(peer);
    kvf_engine_destroy(e);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    snprintf(cmd, sizeof(cmd), "/tmp/kvf-fake-boot-%d", (int)getpid());
    unlink(cmd);
}

static kvf_status_t noop_access(void *arg, uint64_t addr, uint64_t len,
                                kvf_tl_mem_t *mem_p)
{
    (void)arg;
    (void)addr;
    (void)len;
    (void)mem_p;
    return KVF_ERR_OUT_OF_BOUNDS;
}

static void noop_lock(void *arg)
{
    (void)arg;
}

/* ep_open refuses what it cannot prove: malformed addresses, another
 * host identity, a nonce nobody listens on. */
static void test_ep_open_refusals(void **state)
{
    kvf_tl_config_t cfg = {
        .conns = 1, .timeout_ms = 1000, .chunk_bytes = 1 << 20, .no_listen = 1};
    kvf_tl_target_t tgt = {
        .access = noop_access, .acquire = noop_lock, .release = noop_lock};
    kvf_tl_iface_t *iface;
    kvf_tl_ep_t *ep;
    baseline_t b;
    char addr[128];
    const char *own;

    (void)state;
    baseline_take(&b);
    cfg.no_listen = 0;
    assert_int_equal(kvf_shm_ops.iface_open(&cfg, &tgt, &iface), KVF_OK);
    own = kvf_shm_ops.iface_address(iface);
    assert_non_null(own);
    assert_int_equal(strlen(own), 4 + 16 + 1 + 32);
    assert_int_equal(kvf_shm_ops.ep_open(iface, "garbage", &ep),
                     KVF_ERR_INVALID_PARAM);
    /* another host id, same nonce */
    snprintf(addr, sizeof(addr), "%s", own);
    addr[4] = (addr[4] == '0') ? '1' : '0';
    assert_int_equal(kvf_shm_ops.ep_open(iface, addr, &ep),
                     KVF_ERR_UNAVAILABLE);
    /* our host id, a nonce nobody serves */
    snprintf(addr, sizeof(addr), "%s", own);
    addr[30] = (addr[30] == '0') ? '1' : '0';
    assert_int_equal(kvf_shm_ops.ep_open(iface, addr, &ep), KVF_ERR_CONNECT);
    /* the real one: the handshake and the probe pass */
    assert_int_equal(kvf_shm_ops.ep_open(iface, own, &ep), KVF_OK);
    kvf_shm_ops.ep_close(ep);
    kvf_shm_ops.iface_close(iface);
    baseline_check(&b);
}

static void test_out_of_bounds(void **state)
{
    kvf_test_target_t t;
    unsigned char *local = malloc(POOL), *expect = malloc(POOL);
    kvf_status_t st[5];
    kvf_op_t ops[5];
    kvf_engine_h e;
    kvf_peer_h peer;
    kvf_region_h r;
    baseline_t b;
    double secs = 0;

    (void)state;
    baseline_take(&b);
    assert_int_equal(kvf_test_target_start(&t, POOL, SEED, NULL, NULL), 0);
    kvf_test_pool_bytes(expect, POOL, SEED);
    e = initiator(NULL);
    assert_int_equal(kvf_engine_reg(e, local, POOL, KVF_MEM_HOST, 0, &r),
                     KVF_OK);
    assert_int_equal(kvf_peer_open(e, t.segment, &peer), KVF_OK);
    assert_string_equal(kvf_peer_transport(peer), "shm");
    ops[0] = (kvf_op_t){KVF_OP_READ, local, peer, t.pool_addr, BS};
    ops[1] = (kvf_op_t){KVF_OP_READ, local + BS, peer,
                        t.pool_addr + POOL - 4096, BS}; /* straddles end */
    ops[2] = (kvf_op_t){KVF_OP_READ, local + 2 * BS, peer, t.pool_addr - BS,
                        BS}; /* before the pool */
    ops[3] = (kvf_op_t){KVF_OP_READ, local + 3 * BS, peer, 4096, BS};
    ops[4] = (kvf_op_t){KVF_OP_READ, local + 4 * BS, peer,
                        t.pool_addr + POOL - BS, BS};
    assert_int_equal(run(e, ops, 5, st), KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(st[0], KVF_OK);
    assert_int_equal(st[1], KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(st[2], KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(st[3], KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(st[4], KVF_OK);
    assert_memory_equal(local, expect, BS);
    assert_memory_equal(local + 4 * BS, expect + POOL - BS, BS);
    /* the same as WRITEs: refused, nothing written past the pool */
    ops[1].type = ops[2].type = ops[3].type = KVF_OP_WRITE;
    assert_int_equal(run(e, ops + 1, 3, st), KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(st[0], KVF_ERR_OUT_OF_BOUNDS);
    /* a whole-pool link test passes, one byte more is refused */
    assert_int_equal(
        kvf_peer_link_test(peer, KVF_OP_READ, local, t.pool_addr, POOL, &secs),
        KVF_OK);
    assert_true(secs > 0);
    assert_memory_equal(local, expect, POOL);
    assert_int_equal(kvf_peer_link_test(peer, KVF_OP_READ, local,
                                        t.pool_addr + 1, POOL, &secs),
                     KVF_ERR_OUT_OF_BOUNDS);
    /* and the target still serves */
    round_trip(e, peer, local, t.pool_addr, expect, 9);
    kvf_peer_close(peer);
    assert_int_equal(kvf_engine_dereg(e, r), KVF_OK);
    kvf_engine_destroy(e);
    assert_int_equal(kvf_test_target_stop(&t), 0);
    free(local);
    free(expect);
    baseline_check(&b);
}

/* Region B is plain malloc memory: the target moves it itself through
 * the staging buffer. Then A is deregistered (access refused) and freed
 * (the initiator's mapping of it goes away). */
static void test_staged_dereg_free(void **state)
{
    unsigned char *local = malloc(POOL), *expect = malloc(POOL);
    kvf_status_t st[2];
    baseline_t b;
    session_t ss;
    kvf_op_t ops[2];
    int i, maps;

    (void)state;
    baseline_take(&b);
    session_open(&ss, local);
    kvf_test_pool_bytes(expect, POOL, SEED + 1);
    round_trip(ss.e, ss.peer, local, ss.ch.b, expect, 3); /* staged */
    assert_int_equal(memfd_maps(), b.maps0); /* B is never mapped */
    kvf_test_pool_bytes(expect, POOL, SEED);
    round_trip(ss.e, ss.peer, local, ss.ch.a, expect, 4); /* mapped */
    assert_true(memfd_maps() > b.maps0);
    /* a batch spanning both regions */
    ops[0] = (kvf_op_t){KVF_OP_READ, local, ss.peer, ss.ch.a + BS, 3 * BS};
    ops[1] = (kvf_op_t){KVF_OP_READ, local + 3 * BS, ss.peer, ss.ch.b, 3 * BS};
    assert_int_equal(run(ss.e, ops, 2, st), KVF_OK);

    child_cmd(&ss.ch, 'd'); /* deregister A */
    ops[0].type = KVF_OP_WRITE;
    assert_int_equal(run(ss.e, ops, 2, st), KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(st[0], KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(st[1], KVF_OK);
    child_cmd(&ss.ch, 'f'); /* free A: the next transfer learns it */
    assert_int_equal(run(ss.e, ops + 1, 1, st), KVF_OK);
    for (i = 0, maps = -1; i < 50; i++) {
        maps = memfd_maps();
        if (maps == b.maps0) {
            break;
        }
        usleep(100000);
    }
    assert_int_equal(maps, b.maps0);

    session_close(&ss);
    free(local);
    free(expect);
    baseline_check(&b);
}

typedef struct {
    kvf_engine_h e;
    kvf_peer_h peer;
    unsigned char *local;
    uint64_t remote;
    int stop;
    long batches, refused;
    unsigned flags; /* KVF_BATCH_INLINE: one request of each batch inline */
} streamer_t;

/* Back-to-back small batches (they ride on open leases) until stopped. */
static void *streamer_main(void *arg)
{
    streamer_t *s = arg;
    kvf_op_t ops[32];
    kvf_status_t st;
    int i;

    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        for (i = 0; i < 32; i++) {
            ops[i] =
                (kvf_op_t){KVF_OP_WRITE, s->local + (size_t)i * 65536, s->peer,
                           s->remote + (uint64_t)i * 65536, 65536};
        }
        st = run_flags(s->e, ops, 32, NULL, s->flags, NULL);
        if (st == KVF_ERR_OUT_OF_BOUNDS) {
            s->refused++;
        } else if (st != KVF_OK) {
            break;
        }
        s->batches++;
    }
    return NULL;
}

/* Deregistration under a continuous stream of small batches from two
 * threads: it completes within a bound (leases are short, even when
 * later batches ride on them), and the stream is refused after it. */
static void dereg_under_traffic(unsigned flags)
{
    unsigned char *local = malloc(POOL);
    streamer_t s[2];
    pthread_t th[2];
    baseline_t b;
    session_t ss;
    double t0, t1;
    int i;

    baseline_take(&b);
    memset(local, 7, POOL);
    session_open(&ss, local);
    for (i = 0; i < 2; i++) {
        s[i] = (streamer_t){ss.e,
                            ss.peer,
                            local + (size_t)i * (POOL / 2),
                            ss.ch.a + (uint64_t)i * (POOL / 2),
                            0,
                            0,
                            0,
                            flags};
        assert_int_equal(pthread_create(&th[i], NULL, streamer_main, &s[i]), 0);
    }
    usleep(300000);
    t0 = now_s();
    child_cmd(&ss.ch, 'd'); /* deregister A while both stream into it */
    t1 = now_s();
    usleep(200000);
    for (i = 0; i < 2; i++) {
        __atomic_store_n(&s[i].stop, 1, __ATOMIC_RELEASE);
        pthread_join(th[i], NULL);
        assert_true(s[i].batches > 10);
        assert_true(s[i].refused > 0); /* refused after the dereg */
    }
    print_message("dereg under traffic took %.1f ms\n", (t1 - t0) * 1e3);
    assert_true(t1 - t0 < 0.5); /* without the gate: 0.3-1.8 s */
    session_close(&ss);
    free(local);
    baseline_check(&b);
}

static void test_dereg_under_traffic(void **state)
{
    (void)state;
    dereg_under_traffic(0);
}

/* the same while callers copy inside the open lease on their own thread:
 * the deregistration still waits for them and refuses what follows */
static void test_dereg_under_inline_traffic(void **state)
{
    (void)state;
    dereg_under_traffic(KVF_BATCH_INLINE);
}

/*
 * Warm leases (shm_ep.c): a worker that moved requests keeps a lease open
 * while idle for KVF_SHM_WARM_MS (200 ms), renewed every KVF_SHM_RIDE_MS
 * (20 ms), so a one-block inline READ 50 ms after a batch is done on the
 * caller's thread, while one after 500 ms of quiet finds no lease (it is
 * posted). A deregistration while a warm lease is open waits for it
 * (<= one ride) and refuses what follows.
 */
static void test_warm_lease(void **state)
{
    unsigned char *local = malloc(POOL), *expect = malloc(POOL);
    kvf_status_t st[1];
    kvf_op_t ops[1];
    baseline_t b;
    session_t ss;
    int i, done, warm = 0, cold = 0;
    double t0, t1;

    (void)state;
    baseline_take(&b);
    session_open(&ss, local);
    kvf_test_pool_bytes(expect, POOL, SEED);
    for (i = 0; i < 8; i++) {
        ops[0] = (kvf_op_t){KVF_OP_READ, local + (size_t)i * BS, ss.peer,
                            ss.ch.a + (uint64_t)(3 * i) * BS, BS};
        assert_int_equal(run(ss.e, ops, 1, st), KVF_OK); /* a worker's */
        if (i >= 5) {
            usleep(500000); /* past the warm time: the lease ended */
        } else {
            usleep(50000); /* between two renewals */
        }
        ops[0] = (kvf_op_t){KVF_OP_READ, local + (size_t)(i + 16) * BS, ss.peer,
                            ss.ch.a + (uint64_t)(3 * i + 1) * BS, BS};
        assert_int_equal(run_flags(ss.e, ops, 1, st, KVF_BATCH_INLINE, &done),
                         KVF_OK);
        assert_memory_equal(local + (size_t)(i + 16) * BS,
                            expect + (size_t)(3 * i + 1) * BS, BS);
        if (i >= 5) {
            cold += done;
        } else {
            warm += done;
        }
    }
    print_message("warm lease: %d of 5 READs inline 50 ms after a batch, "
                  "%d of 3 after 500 ms\n",
                  warm, cold);
    assert_true(warm >= 3);
    assert_true(cold <= 1);
    /* deregistration while a warm lease is open and idle */
    ops[0] = (kvf_op_t){KVF_OP_WRITE, local, ss.peer, ss.ch.a, BS};
    assert_int_equal(run(ss.e, ops, 1, st), KVF_OK);
    usleep(30000);
    t0 = now_s();
    child_cmd(&ss.ch, 'd');
    t1 = now_s();
    print_message("dereg with a warm lease open took %.1f ms\n",
                  (t1 - t0) * 1e3);
    assert_true(t1 - t0 < 0.2);
    assert_int_equal(run(ss.e, ops, 1, st), KVF_ERR_OUT_OF_BOUNDS);
    session_close(&ss);
    free(local);
    free(expect);
    baseline_check(&b);
}

/*
 * KVF_BATCH_INLINE over shm: once a lease with a range grant is open, a
 * one-request batch is copied by the submitting thread (done when submit
 * returns); bytes verified both ways; a batch of several requests moves
 * one inline and the rest on the workers; memory outside the grants
 * (malloc region, staged by the target) and out-of-bounds ranges go the
 * posted way with their usual results.
 */
static void test_inline(void **state)
{
    unsigned char *local = malloc(POOL), *expect = malloc(POOL);
    const uint32_t slots = POOL / BS;
    uint64_t rem[64], sums[64];
    size_t lens[64];
    kvf_status_t st[2];
    kvf_op_t ops[64];
    kvf_rng_t rng;
    baseline_t b;
    session_t ss;
    int i, k, done, ndone = 0;

    (void)state;
    baseline_take(&b);
    session_open(&ss, local);
    kvf_test_pool_bytes(expect, POOL, SEED);
    kvf_rng_seed(&rng, 77);
    /* READs of one random block each, verified byte for byte */
    for (i = 0; i < 60; i++) {
        uint32_t ls = (uint32_t)kvf_rng_below(&rng, slots);
        uint32_t rs = (uint32_t)kvf_rng_below(&rng, slots);

        ops[0] = (kvf_op_t){KVF_OP_READ, local + (size_t)ls * BS, ss.peer,
                            ss.ch.a + (uint64_t)rs * BS, BS};
        assert_int_equal(run_flags(ss.e, ops, 1, st, KVF_BATCH_INLINE, &done),
                         KVF_OK);
        assert_memory_equal(local + (size_t)ls * BS, expect + (size_t)rs * BS,
                            BS);
        ndone += done;
    }
    print_message("inline: %d of 60 one-block READs done at submit\n", ndone);
    assert_true(ndone >= 30); /* the first opens the lease; posted ones
                                 need a worker and are never done yet */
    /* WRITEs of one block each, checked by the target's checksums */
    kvf_rng_fill(&rng, local, POOL);
    for (i = 0, ndone = 0; i < 64; i++) {
        ops[i] = (kvf_op_t){KVF_OP_WRITE, local + (size_t)i * BS, ss.peer,
                            ss.ch.a + (uint64_t)(2 * i + 1) * BS, BS};
        rem[i] = ops[i].remote;
        lens[i] = BS;
        assert_int_equal(
            run_flags(ss.e, ops + i, 1, st, KVF_BATCH_INLINE, &done), KVF_OK);
        ndone += done;
    }
    assert_true(ndone >= 32);
    assert_int_equal(kvf_peer_checksum(ss.peer, rem, lens, 64, sums), KVF_OK);
    for (i = 0; i < 64; i++) {
        assert_true(sums[i] == kvf_checksum(local + (size_t)i * BS, BS));
    }
    /* several requests (3 x 1 MiB): one inline, two on the workers */
    memset(local, 0, 3u << 20);
    ops[0] =
        (kvf_op_t){KVF_OP_READ, local, ss.peer, ss.ch.a + (4u << 20), 3u << 20};
    assert_int_equal(run_flags(ss.e, ops, 1, st, KVF_BATCH_INLINE, NULL),
                     KVF_OK);
    assert_memory_equal(local, expect + (4u << 20), 3u << 20);
    /* malloc memory of the target (no grant to ride on): staged, correct */
    kvf_test_pool_bytes(expect, POOL, SEED + 1);
    for (k = 0; k < 3; k++) {
        ops[0] = (kvf_op_t){KVF_OP_READ, local, ss.peer,
                            ss.ch.b + (uint64_t)k * BS, BS};
        assert_int_equal(run_flags(ss.e, ops, 1, st, KVF_BATCH_INLINE, NULL),
                         KVF_OK);
        assert_memory_equal(local, expect + (size_t)k * BS, BS);
    }
    /* out of bounds: refused as always, the rest of the batch moves */
    ops[0] = (kvf_op_t){KVF_OP_READ, local, ss.peer, ss.ch.a + POOL - 4096, BS};
    ops[1] = (kvf_op_t){KVF_OP_READ, local + BS, ss.peer, ss.ch.a, BS};
    assert_int_equal(run_flags(ss.e, ops, 2, st, KVF_BATCH_INLINE, NULL),
                     KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(st[0], KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(st[1], KVF_OK);
    session_close(&ss);
    free(local);
    free(expect);
    baseline_check(&b);
}

/*
 * Streamed leases copy two equal blocks at once when both qualify
 * (destinations 32-byte aligned, a multiple of 128 bytes, >= 512): a
 * batch mixing blocks that pair with ones that must not (odd lengths,
 * unaligned ends on either side, unequal neighbours, small ones), each
 * in its own 16 KiB slot at a random place, written and read back both
 * posted and inline, every byte checked.
 */
static void stream_pairs(session_t *ss, unsigned char *local,
                         unsigned char *back, unsigned flags, uint64_t seed)
{
    static const struct {
        size_t len, loff, roff;
    } kinds[] = {
        {8192, 0, 0}, {8192, 0, 0}, {640, 0, 0},  {640, 0, 0},
        {8200, 0, 0}, {8200, 0, 0}, {8192, 0, 8}, {8192, 0, 8},
        {8192, 8, 0}, {8192, 8, 0}, {8192, 0, 0}, {4096, 0, 0},
        {100, 0, 0},  {100, 0, 0},  {1024, 3, 5}, {1024, 0, 0},
    };
    const uint32_t n = 1024, slot = 16384, slots = POOL / slot;
    kvf_op_t *ops = calloc(n, sizeof(*ops));
    uint64_t *rem = calloc(n, sizeof(*rem)), *sums = calloc(n, sizeof(*sums));
    size_t *lens = calloc(n, sizeof(*lens)), k;
    uint32_t *lp, *rp, i;
    kvf_rng_t rng;

    kvf_rng_seed(&rng, seed);
    kvf_rng_fill(&rng, local, POOL);
    lp = kvf_test_pick(&rng, slots, n);
    rp = kvf_test_pick(&rng, slots, n);
    for (i = 0; i < n; i++) {
        k = i % (sizeof(kinds) / sizeof(kinds[0]));
        ops[i] = (kvf_op_t){
            KVF_OP_WRITE, local + (size_t)lp[i] * slot + kinds[k].loff,
            ss->peer, ss->ch.a + (uint64_t)rp[i] * slot + kinds[k].roff,
            kinds[k].len};
        rem[i] = ops[i].remote;
        lens[i] = ops[i].length;
    }
    assert_int_equal(run_flags(ss->e, ops, n, NULL, flags, NULL), KVF_OK);
    assert_int_equal(kvf_peer_checksum(ss->peer, rem, lens, n, sums), KVF_OK);
    for (i = 0; i < n; i++) {
        assert_true(sums[i] == kvf_checksum(ops[i].local, lens[i]));
    }
    /* back into other places of a cleared buffer, same kinds */
    memset(back, 0, POOL);
    free(lp);
    lp = kvf_test_pick(&rng, slots, n);
    for (i = 0; i < n; i++) {
        k = i % (sizeof(kinds) / sizeof(kinds[0]));
        ops[i].type = KVF_OP_READ;
        ops[i].local = back + (size_t)lp[i] * slot + kinds[k].loff;
    }
    assert_int_equal(run_flags(ss->e, ops, n, NULL, flags, NULL), KVF_OK);
    for (i = 0; i < n; i++) {
        assert_true(kvf_checksum(ops[i].local, lens[i]) == sums[i]);
    }
    free_all(6, lp, rp, ops, rem, sums, lens);
}

static void test_stream_pairs(void **state)
{
    unsigned char *local = malloc(POOL), *back = malloc(POOL);
    kvf_region_h rb;
    baseline_t b;
    session_t ss;

    (void)state;
    baseline_take(&b);
    /* requests of up to 4 MiB, so that leases of these mixed blocks reach
     * the streaming size (1 MiB requests of them fall just short) */
    setenv("KVF_CHUNK_BYTES", "4M", 1);
    session_open(&ss, local);
    unsetenv("KVF_CHUNK_BYTES");
    assert_int_equal(kvf_engine_reg(ss.e, back, POOL, KVF_MEM_HOST, 0, &rb),
                     KVF_OK);
    stream_pairs(&ss, local, back, 0, 501);
    stream_pairs(&ss, local, back, KVF_BATCH_INLINE, 502);
    assert_int_equal(kvf_engine_dereg(ss.e, rb), KVF_OK);
    session_close(&ss);
    free(local);
    free(back);
    baseline_check(&b);
}

/*
 * Two threads submitting small inline batches at once (each 32 x 64 KiB,
 * random slots of its own quarter of the pools): while the other's batch
 * is live, each request is offered to the caller's own thread
 * (engine/batch.c, inline_all; the ones the shm transport declines are
 * posted). Every batch written is read back into a cleared area and
 * compared byte for byte; batches done when submit returned are printed.
 */
typedef struct {
    kvf_engine_h e;
    kvf_peer_h peer;
    unsigned char *src, *back; /* 8 MiB each, in the registered pool */
    uint64_t remote;           /* 8 MiB of the target's pool */
    uint64_t seed;
    int batches, done_at_submit, bad;
} inliner_t;

static int inliner_batch(inliner_t *t, kvf_op_t *ops, int *done)
{
    kvf_batch_h b;
    kvf_status_t st;

    if (kvf_batch_submit_ex(t->e, ops, 32, KVF_BATCH_INLINE, &b) != KVF_OK) {
        return -1;
    }
    *done = kvf_batch_test(b) != KVF_INPROGRESS;
    st = kvf_batch_wait(b, TIMEOUT * 2);
    kvf_batch_destroy(b);
    return st == KVF_OK ? 0 : -1;
}

static void *inliner_main(void *arg)
{
    const uint32_t blk = 65536, slots = (8u << 20) / blk;
    inliner_t *t = arg;
    kvf_op_t ops[32];
    uint32_t *lp, *rp, i;
    kvf_rng_t rng;
    int it, done;

    kvf_rng_seed(&rng, t->seed);
    for (it = 0; it < 40 && !t->bad; it++) {
        kvf_rng_fill(&rng, t->src, 8u << 20);
        lp = kvf_test_pick(&rng, slots, 32);
        rp = kvf_test_pick(&rng, slots, 32);
        for (i = 0; i < 32; i++) {
            ops[i] =
                (kvf_op_t){KVF_OP_WRITE, t->src + (size_t)lp[i] * blk, t->peer,
                           t->remote + (uint64_t)rp[i] * blk, blk};
        }
        t->bad |= inliner_batch(t, ops, &done) != 0;
        t->done_at_submit += done;
        memset(t->back, 0, 8u << 20);
        for (i = 0; i < 32; i++) {
            ops[i].type = KVF_OP_READ;
            ops[i].local = t->back + (size_t)i * blk;
        }
        t->bad |= inliner_batch(t, ops, &done) != 0;
        t->done_at_submit += done;
        for (i = 0; i < 32; i++) {
            t->bad |= memcmp(t->back + (size_t)i * blk,
                             t->src + (size_t)lp[i] * blk, blk) != 0;
        }
        t->batches += 2;
        free(lp);
        free(rp);
    }
    return NULL;
}

static void test_concurrent_inline(void **state)
{
    unsigned char *local = malloc(POOL);
    inliner_t t[2];
    pthread_t th[2];
    baseline_t b;
    session_t ss;
    int i;

    (void)state;
    baseline_take(&b);
    session_open(&ss, local);
    for (i = 0; i < 2; i++) {
        t[i] = (inliner_t){.e = ss.e,
                           .peer = ss.peer,
                           .src = local + (size_t)i * (16u << 20),
                           .back = local + (size_t)i * (16u << 20) + (8u << 20),
                           .remote = ss.ch.a + (uint64_t)i * (8u << 20),
                           .seed = 900 + (uint64_t)i};
        assert_int_equal(pthread_create(&th[i], NULL, inliner_main, &t[i]), 0);
    }
    for (i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_false(t[i].bad);
        assert_int_equal(t[i].batches, 80);
        print_message("thread %d: %d of 80 batches done at submit\n", i,
                      t[i].done_at_submit);
    }
    session_close(&ss);
    free(local);
    baseline_check(&b);
}

static void test_dead_target(void **state)
{
    kvf_test_target_t t;
    unsigned char *local = malloc(POOL);
    kvf_engine_h e;
    kvf_peer_h peer;
    kvf_region_h r;
    baseline_t b;
    kvf_op_t op;
    kvf_status_t status;
    double t0, t1;
    int wst;

    (void)state;
    baseline_take(&b);
    assert_int_equal(kvf_test_target_start(&t, POOL, SEED, NULL, NULL), 0);
    e = initiator(NULL);
    assert_int_equal(kvf_engine_reg(e, local, POOL, KVF_MEM_HOST, 0, &r),
                     KVF_OK);
    assert_int_equal(kvf_peer_open(e, t.segment, &peer), KVF_OK);
    assert_string_equal(kvf_peer_transport(peer), "shm");
    op = (kvf_op_t){KVF_OP_WRITE, local, peer, t.pool_addr, POOL};
    assert_int_equal(run(e, &op, 1, NULL), KVF_OK);
    kill(t.pid, SIGKILL);
    waitpid(t.pid, &wst, 0);
    t.pid = 0;
    t0 = now_s();
    status = run(e, &op, 1, NULL);
    t1 = now_s();
    assert_true(status != KVF_OK && status != KVF_ERR_TIMEOUT);
    assert_true(t1 - t0 < TIMEOUT / 1000.0 + 1.0);
    op.type = KVF_OP_READ;
    assert_true(run(e, &op, 1, NULL) != KVF_OK);
    kvf_peer_close(peer);
    assert_int_equal(kvf_engine_dereg(e, r), KVF_OK);
    kvf_engine_destroy(e);
    free(local);
    baseline_check(&b);
}

/* Threads of this process. */
static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *de;
    int n = 0;

    if (d == NULL) {
        return -1;
    }
    while ((de = readdir(d)) != NULL) {
        n += de->d_name[0] != '.';
    }
    closedir(d);
    return n;
}

/* Bytes of this process's page tables over its mapping of a kvferry memfd
 * of len bytes (smaps' Rss, hugetlb pages included); -1: no such mapping. */
static long memfd_mapped(uint64_t len)
{
    unsigned long start, end;
    char line[512], perms[8];
    FILE *f = fopen("/proc/self/smaps", "r");
    long kb, total = -1;
    int in = 0;

    if (f == NULL) {
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "%lx-%lx %7s ", &start, &end, perms) == 3) {
            /* a mapping's first line; its fields follow */
            in = strstr(line, "memfd:kvferry") != NULL && end - start == len;
            total = (in && total < 0) ? 0 : total;
        } else if (in && (sscanf(line, "Rss: %ld kB", &kb) == 1 ||
                          sscanf(line, "Shared_Hugetlb: %ld kB", &kb) == 1 ||
                          sscanf(line, "Private_Hugetlb: %ld kB", &kb) == 1)) {
            total += kb * 1024;
        }
    }
    fclose(f);
    return total;
}

/* An engine with one shm peer on target t that has read block 0. */
static kvf_engine_h populator_engine(kvf_test_target_t *t, unsigned char *local,
                                     const unsigned char *expect,
                                     kvf_peer_h *peer_p, kvf_region_h *r_p)
{
    kvf_engine_h e = initiator(NULL);
    kvf_status_t st[1];
    kvf_op_t op[1];

    assert_int_equal(kvf_engine_reg(e, local, POOL, KVF_MEM_HOST, 0, r_p),
                     KVF_OK);
    assert_int_equal(kvf_peer_open(e, t->segment, peer_p), KVF_OK);
    assert_string_equal(kvf_peer_transport(*peer_p), "shm");
    op[0] = (kvf_op_t){KVF_OP_READ, local, *peer_p, t->pool_addr, BS};
    assert_int_equal(run(e, op, 1, st), KVF_OK);
    assert_memory_equal(local, expect, BS);
    return e;
}

static void populator_close(kvf_engine_h e, kvf_peer_h peer, kvf_region_h r)
{
    kvf_peer_close(peer);
    assert_int_equal(kvf_engine_dereg(e, r), KVF_OK);
    kvf_engine_destroy(e);
}

/* Reads random blocks of the first POOL bytes of the target's pool, one
 * small batch after another, for secs. */
static void populator_busy(kvf_engine_h e, kvf_peer_h peer,
                           unsigned char *local, uint64_t raddr, double secs)
{
    const uint32_t n = 64;
    double t0 = now_s();
    kvf_op_t ops[64];
    uint32_t *rp, i;
    kvf_rng_t rng;

    kvf_rng_seed(&rng, 5);
    while (now_s() - t0 < secs) {
        rp = kvf_test_pick(&rng, POOL / BS, n);
        for (i = 0; i < n; i++) {
            ops[i] = (kvf_op_t){KVF_OP_READ, local + (size_t)i * BS, peer,
                                raddr + (uint64_t)rp[i] * BS, BS};
        }
        assert_int_equal(run(e, ops, n, NULL), KVF_OK);
        free(rp);
    }
}

/*
 * The shm populator: after a peer's first copy maps a target's pool, the
 * ep's thread fills the page tables of the whole mapping in the
 * background once copies pause (this process's Rss over it stays below
 * half the pool while small batches run back to back, then reaches its
 * size); random blocks read meanwhile are right byte for byte; an
 * engine destroyed right after its first copy, the populator mid-way,
 * returns within a second; threads, descriptors, mappings and
 * allocations back to where they were.
 */
static void test_populator(void **state)
{
    const uint64_t pool = 256u << 20;
    unsigned char *local = malloc(POOL), *expect = malloc(pool);
    kvf_test_target_t t;
    kvf_region_h r;
    kvf_peer_h peer;
    kvf_engine_h e;
    baseline_t b;
    double t0, t1;
    long mapped = -1;
    int threads0;

    (void)state;
    baseline_take(&b);
    threads0 = thread_count();
    assert_int_equal(kvf_test_target_start(&t, pool, SEED, NULL, NULL), 0);
    kvf_test_pool_bytes(expect, pool, SEED);

    e = populator_engine(&t, local, expect, &peer, &r);
    t0 = now_s();
    populator_close(e, peer, r);
    t1 = now_s();
    print_message("populator: engine destroyed %.1f ms after its first copy\n",
                  (t1 - t0) * 1e3);
    assert_true(t1 - t0 < 1.0);
    assert_int_equal(thread_count(), threads0);
    assert_int_equal(memfd_mapped(pool), -1);

    /* while copies run the populator keeps off (it slows their faults):
     * 0.3 s of reads within the first POOL bytes leave most of the
     * mapping unfilled */
    e = populator_engine(&t, local, expect, &peer, &r);
    populator_busy(e, peer, local, t.pool_addr, 0.3);
    mapped = memfd_mapped(pool);
    print_message("populator: %ld of %lu bytes mapped after 0.3 s of copies\n",
                  mapped, (unsigned long)pool);
    assert_true(mapped >= 0 && mapped < (long)(pool / 2));
    round_trip(e, peer, local, t.pool_addr, expect, 7);
    t0 = now_s();
    while (now_s() - t0 < 20.0 && (mapped = memfd_mapped(pool)) < (long)pool) {
        usleep(10000);
    }
    print_message("populator: %ld of %lu bytes mapped after %.0f ms\n", mapped,
                  (unsigned long)pool, (now_s() - t0) * 1e3);
    assert_int_equal(mapped, (long)pool);
    populator_close(e, peer, r);
    assert_int_equal(thread_count(), threads0);
    assert_int_equal(kvf_test_target_stop(&t), 0);
    free(local);
    free(expect);
    baseline_check(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mem_alloc),
        cmocka_unit_test(test_same_host_is_shm),
        cmocka_unit_test(test_forced_tcp_env),
        cmocka_unit_test(test_forced_tcp_param),
        cmocka_unit_test(test_target_without_shm),
        cmocka_unit_test(test_shm_listed_first),
        cmocka_unit_test(test_unknown_transport_refused),
        cmocka_unit_test(test_other_host_id_falls_back),
        cmocka_unit_test(test_ep_open_refusals),
        cmocka_unit_test(test_out_of_bounds),
        cmocka_unit_test(test_staged_dereg_free),
        cmocka_unit_test(test_dereg_under_traffic),
        cmocka_unit_test(test_dereg_under_inline_traffic),
        cmocka_unit_test(test_inline),
        cmocka_unit_test(test_warm_lease),
        cmocka_unit_test(test_stream_pairs),
        cmocka_unit_test(test_concurrent_inline),
        cmocka_unit_test(test_dead_target),
        cmocka_unit_test(test_populator),
    };

    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
