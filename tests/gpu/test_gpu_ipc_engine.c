/*
 * GPU test (label gpu): the same-host cuda path through the engine API,
 * two real processes. The test starts itself again as a child (a fresh
 * process, so no CUDA state crosses a fork) that serves a GPU pool and a
 * host pool through an engine; the parent opens it as a peer, which must
 * come up as transport "cuda" (the GPU pool's IPC handle came in the
 * segment descriptor), and moves random blocks both ways between its own
 * GPU pool or pinned pool and the child's GPU pool: 8 KiB blocks, odd
 * sizes at unaligned addresses, batches that also touch the child's host
 * pool (those go through shm or tcp). A model of every pool is kept on
 * the host; afterwards the local pools are compared byte for byte and
 * the child's pools by checksums the child computes. A remote range
 * running past the GPU pool is refused with KVF_ERR_OUT_OF_BOUNDS (also
 * one ending a single byte past it, while one ending exactly at its end
 * is served), one outside every region is refused by the child, and the
 * peer keeps
 * working. Scenarios: child on GPU 1 (NVLink, when two GPUs exist;
 * transports auto), and child on GPU 0 with the parent on GPU 0
 * (transports cuda: tcp underneath). Nothing leaks. Exits 77 without a
 * GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kvferry/kvferry.h>
#include <kvferry/perf.h>

#include "core/checksum.h"
#include "core/rng.h"
#include "mem/cuda/cuda.h"

#define GPOOL   (32u << 20)
#define HPOOL   (4u << 20)
#define SLOT    (16u << 10)
#define NBLK    512
#define ROUNDS  8
#define TIMEOUT 20000

#define CHECK(c)                                                               \
    do {                                                                       \
        if (!(c)) {                                                            \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__,   \
                    #c);                                                       \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

static void fill(unsigned char *p, size_t n, uint64_t seed)
{
    kvf_rng_t rng;

    kvf_rng_seed(&rng, seed);
    kvf_rng_fill(&rng, p, n);
}

/* Child: serve a GPU pool (seed 11) and a host pool (seed 12) until the
 * parent closes stdin. */
static int child(int dev, const char *transports)
{
    kvf_engine_params_t p = {0};
    unsigned char *h = malloc(GPOOL), *host = malloc(HPOOL);
    kvf_region_h rg, rh;
    kvf_engine_h e;
    char line[16];
    void *g;

    if (h == NULL || host == NULL ||
        kvf_cuda_mem_alloc(KVF_MEM_CUDA, dev, GPOOL, &g) != KVF_OK) {
        return 2;
    }
    fill(h, GPOOL, 11);
    fill(host, HPOOL, 12);
    p.field_mask = KVF_ENGINE_PARAM_LISTEN | KVF_ENGINE_PARAM_TRANSPORTS |
                   KVF_ENGINE_PARAM_TIMEOUT;
    p.listen = "127.0.0.1:0";
    p.transports = transports;
    p.timeout_ms = TIMEOUT;
    if (kvf_cuda_memcpy(g, h, GPOOL) != KVF_OK ||
        kvf_engine_create(&p, &e) != KVF_OK ||
        kvf_engine_reg(e, g, GPOOL, KVF_MEM_CUDA, dev, &rg) != KVF_OK ||
        kvf_engine_reg(e, host, HPOOL, KVF_MEM_HOST, 0, &rh) != KVF_OK) {
        return 3;
    }
    printf("segment=%s\n", kvf_engine_segment_name(e));
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin) != NULL) {
    }
    kvf_engine_dereg(e, rg);
    kvf_engine_dereg(e, rh);
    kvf_engine_destroy(e);
    kvf_cuda_mem_free(KVF_MEM_CUDA, g);
    free(h);
    free(host);
    return 0;
}

enum { L_GPU, L_PIN, R_GPU, R_HOST, NPOOLS };

typedef struct {
    char *base[NPOOLS]; /* remote: the child's addresses */
    uint64_t len[NPOOLS];
    unsigned char *model[NPOOLS];
    kvf_engine_h e;
    kvf_peer_h peer;
    kvf_cuda_copy_t *cp;
} scen_t;

/* Distinct random slots. */
static void pick(kvf_rng_t *rng, uint32_t *out, unsigned n, uint32_t slots)
{
    unsigned i, k;

    for (i = 0; i < n; i++) {
    again:
        out[i] = (uint32_t)kvf_rng_below(rng, slots);
        for (k = 0; k < i; k++) {
            if (out[k] == out[i]) {
                goto again;
            }
        }
    }
}

/* The child's pools against the model, by checksums of 1 MiB pieces. */
static int check_remote(scen_t *s, int pool)
{
    enum { PIECE = 1u << 20 };
    size_t n = s->len[pool] / PIECE, i, lens[64] = {0};
    uint64_t rem[64] = {0}, sums[64];
    int bad = 0;

    CHECK(n <= 64);
    for (i = 0; i < n; i++) {
        rem[i] = (uint64_t)(uintptr_t)s->base[pool] + i * PIECE;
        lens[i] = PIECE;
    }
    CHECK(kvf_peer_checksum(s->peer, rem, lens, n, sums) == KVF_OK);
    for (i = 0; i < n; i++) {
        if (sums[i] != kvf_checksum(s->model[pool] + i * PIECE, PIECE)) {
            fprintf(stderr, "remote pool %d: MiB %zu differs\n", pool, i);
            bad = 1;
        }
    }
    return bad;
}

static int run(int ldev, int cdev, const char *transports, const char *self)
{
    int to_child[2], from_child[2], status, bad = 0, round, i;
    kvf_engine_params_t p = {0};
    kvf_region_h reg[2];
    char line[400], *seg, *nl;
    uint32_t ls[NBLK], rs[NBLK];
    kvf_op_t ops[NBLK + 2];
    long blocks0, bytes0, blocks1, bytes1;
    unsigned char *tmp;
    kvf_mem_type_t type;
    kvf_batch_h b;
    kvf_rng_t rng;
    scen_t s;
    uint64_t addr;
    size_t len, k;
    pid_t pid;
    FILE *in;

    memset(&s, 0, sizeof(s));
    printf("scenario: parent GPU %d, child GPU %d, transports %s\n", ldev, cdev,
           transports);
    fflush(stdout);
    CHECK(pipe(to_child) == 0 && pipe(from_child) == 0);
    pid = fork();
    if (pid == 0) {
        char dev[8];

        snprintf(dev, sizeof(dev), "%d", cdev);
        dup2(to_child[0], 0);
        dup2(from_child[1], 1);
        close(to_child[1]);
        close(from_child[0]);
        execl(self, self, "child", dev, transports, (char *)NULL);
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    in = fdopen(from_child[0], "r");
    CHECK(in != NULL);
    if (fgets(line, sizeof(line), in) == NULL ||
        (seg = strstr(line, "segment=")) == NULL) {
        waitpid(pid, &status, 0);
        fprintf(stderr, "child did not start (status %d)\n", status);
        return 1;
    }
    seg += strlen("segment=");
    nl = strchr(seg, '\n');
    if (nl != NULL) {
        *nl = '\0';
    }
    kvf_alloc_stats(&blocks0, &bytes0);
    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_CONNS |
                   KVF_ENGINE_PARAM_TIMEOUT | KVF_ENGINE_PARAM_TRANSPORTS;
    p.no_listen = 1;
    p.conns = 2;
    p.timeout_ms = TIMEOUT;
    p.transports = transports;
    CHECK(kvf_engine_create(&p, &s.e) == KVF_OK);
    s.len[L_GPU] = s.len[L_PIN] = s.len[R_GPU] = GPOOL;
    s.len[R_HOST] = HPOOL;
    for (i = 0; i < NPOOLS; i++) {
        s.model[i] = malloc(s.len[i]);
        CHECK(s.model[i] != NULL);
    }
    fill(s.model[L_GPU], GPOOL, 21);
    fill(s.model[L_PIN], GPOOL, 22);
    fill(s.model[R_GPU], GPOOL, 11);
    fill(s.model[R_HOST], HPOOL, 12);
    CHECK(kvf_cuda_mem_alloc(KVF_MEM_CUDA, ldev, GPOOL,
                             (void **)&s.base[L_GPU]) == KVF_OK);
    CHECK(kvf_cuda_mem_alloc(KVF_MEM_PINNED, ldev, GPOOL,
                             (void **)&s.base[L_PIN]) == KVF_OK);
    CHECK(kvf_cuda_memcpy(s.base[L_GPU], s.model[L_GPU], GPOOL) == KVF_OK);
    memcpy(s.base[L_PIN], s.model[L_PIN], GPOOL);
    CHECK(kvf_engine_reg(s.e, s.base[L_GPU], GPOOL, KVF_MEM_CUDA, ldev,
                         &reg[0]) == KVF_OK);
    CHECK(kvf_engine_reg(s.e, s.base[L_PIN], GPOOL, KVF_MEM_PINNED, ldev,
                         &reg[1]) == KVF_OK);
    CHECK(kvf_cuda_copy_create(ldev, &s.cp) == KVF_OK);
    CHECK(kvf_peer_open(s.e, seg, &s.peer) == KVF_OK);
    printf("peer transport: %s\n", kvf_peer_transport(s.peer));
    CHECK(strcmp(kvf_peer_transport(s.peer), "cuda") == 0);
    for (k = 0; kvf_peer_region(s.peer, k, &addr, &len, &type) == KVF_OK; k++) {
        if (type == KVF_MEM_CUDA && len == GPOOL) {
            s.base[R_GPU] = (char *)(uintptr_t)addr;
        } else if (type == KVF_MEM_HOST && len == HPOOL) {
            s.base[R_HOST] = (char *)(uintptr_t)addr;
        }
    }
    CHECK(s.base[R_GPU] != NULL && s.base[R_HOST] != NULL);

    kvf_rng_seed(&rng, 77 + (uint64_t)cdev);
    for (round = 0; round < ROUNDS; round++) {
        kvf_op_type_t op = (round & 1) ? KVF_OP_READ : KVF_OP_WRITE;
        int lp = (round & 2) ? L_PIN : L_GPU;
        /* every 4th batch also touches the child's host pool */
        unsigned nhost = (round % 4 == 3) ? NBLK / 8 : 0;
        uint32_t hs[NBLK / 8];

        pick(&rng, ls, NBLK, GPOOL / SLOT);
        pick(&rng, rs, NBLK, GPOOL / SLOT);
        pick(&rng, hs, nhost, HPOOL / SLOT);
        for (k = 0; k < NBLK; k++) {
            /* 8 KiB blocks, and every 8th odd-sized at odd offsets */
            uint64_t lo = (uint64_t)ls[k] * SLOT, ro = (uint64_t)rs[k] * SLOT;
            uint64_t n = 8192;
            int rp = R_GPU;

            if (k % 8 == 5) {
                lo += 3;
                ro += 5 + k % 11;
                n = 1 + kvf_rng_below(&rng, SLOT - 16);
            }
            if (k < nhost) {
                rp = R_HOST;
                ro = (uint64_t)hs[k] * SLOT + (k % 8 == 5 ? 5 : 0);
            }
            ops[k].type = op;
            ops[k].local = s.base[lp] + lo;
            ops[k].peer = s.peer;
            ops[k].remote = (uint64_t)(uintptr_t)s.base[rp] + ro;
            ops[k].length = n;
            if (op == KVF_OP_WRITE) {
                memcpy(s.model[rp] + ro, s.model[lp] + lo, n);
            } else {
                memcpy(s.model[lp] + lo, s.model[rp] + ro, n);
            }
        }
        if (kvf_transfer_sync(s.e, ops, NBLK, TIMEOUT) != KVF_OK) {
            fprintf(stderr, "round %d: batch failed\n", round);
            bad = 1;
        }
    }
    /* refusals: past the end of the GPU pool, and outside every region;
     * a good op in the same batch still moves */
    ops[0].type = KVF_OP_WRITE;
    ops[0].local = s.base[L_GPU];
    ops[0].peer = s.peer;
    ops[0].remote = (uint64_t)(uintptr_t)s.base[R_GPU] + GPOOL - 4096;
    ops[0].length = 8192;
    ops[1] = ops[0];
    ops[1].remote = (uint64_t)(uintptr_t)s.base[R_GPU] + 2ull * GPOOL + 8192;
    ops[2] = ops[0];
    ops[2].local = s.base[L_GPU] + 65536;
    ops[2].remote = (uint64_t)(uintptr_t)s.base[R_GPU];
    ops[2].length = 4096;
    memcpy(s.model[R_GPU], s.model[L_GPU] + 65536, 4096);
    /* ending exactly at the GPU pool's end: served; one byte past it:
     * refused */
    ops[3] = ops[2];
    ops[3].local = s.base[L_GPU] + 131072;
    ops[3].remote = (uint64_t)(uintptr_t)s.base[R_GPU] + GPOOL - 4096;
    memcpy(s.model[R_GPU] + GPOOL - 4096, s.model[L_GPU] + 131072, 4096);
    ops[4] = ops[3];
    ops[4].remote += 1;
    CHECK(kvf_batch_submit(s.e, ops, 5, &b) == KVF_OK);
    CHECK(kvf_batch_wait(b, TIMEOUT) != KVF_OK);
    printf("past the GPU pool's end: %s\n",
           kvf_status_str(kvf_batch_op_status(b, 0, NULL)));
    printf("outside every region: %s\n",
           kvf_status_str(kvf_batch_op_status(b, 1, NULL)));
    CHECK(kvf_batch_op_status(b, 0, NULL) == KVF_ERR_OUT_OF_BOUNDS);
    CHECK(kvf_batch_op_status(b, 1, NULL) != KVF_OK);
    CHECK(kvf_batch_op_status(b, 2, NULL) == KVF_OK);
    CHECK(kvf_batch_op_status(b, 3, NULL) == KVF_OK);
    CHECK(kvf_batch_op_status(b, 4, NULL) == KVF_ERR_OUT_OF_BOUNDS);
    kvf_batch_destroy(b);

    /* local pools byte for byte, remote pools by checksums */
    tmp = malloc(GPOOL);
    CHECK(tmp != NULL);
    CHECK(kvf_cuda_memcpy(tmp, s.base[L_GPU], GPOOL) == KVF_OK);
    if (memcmp(tmp, s.model[L_GPU], GPOOL) != 0) {
        fprintf(stderr, "local GPU pool differs from the model\n");
        bad = 1;
    }
    if (memcmp(s.base[L_PIN], s.model[L_PIN], GPOOL) != 0) {
        fprintf(stderr, "local pinned pool differs from the model\n");
        bad = 1;
    }
    free(tmp);
    bad |= check_remote(&s, R_GPU);
    bad |= check_remote(&s, R_HOST);

    kvf_peer_close(s.peer);
    kvf_engine_dereg(s.e, reg[0]);
    kvf_engine_dereg(s.e, reg[1]);
    kvf_engine_destroy(s.e);
    kvf_cuda_copy_destroy(s.cp);
    kvf_alloc_stats(&blocks1, &bytes1);
    if (blocks1 != blocks0 || bytes1 != bytes0) {
        fprintf(stderr, "leak: %ld blocks, %ld bytes\n", blocks1 - blocks0,
                bytes1 - bytes0);
        bad = 1;
    }
    kvf_cuda_mem_free(KVF_MEM_CUDA, s.base[L_GPU]);
    kvf_cuda_mem_free(KVF_MEM_PINNED, s.base[L_PIN]);
    for (i = 0; i < NPOOLS; i++) {
        free(s.model[i]);
    }
    fclose(in);
    close(to_child[1]);
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "child failed (status %d)\n", status);
        bad = 1;
    }
    printf("scenario %s\n", bad ? "FAILED" : "ok");
    return bad;
}

int main(int argc, char **argv)
{
    int ndev, bad = 0, st;
    pid_t pid;

    if (argc > 3 && strcmp(argv[1], "child") == 0) {
        return child(atoi(argv[2]), argv[3]);
    }
    /* count GPUs in a throwaway child, so this process forks children
     * before it touches CUDA */
    pid = fork();
    if (pid == 0) {
        _exit(kvf_cuda_device_count() > 9 ? 9 : kvf_cuda_device_count());
    }
    waitpid(pid, &st, 0);
    ndev = WIFEXITED(st) ? WEXITSTATUS(st) : 0;
    if (ndev == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    if (ndev > 1) {
        bad |= run(0, 1, "auto", "/proc/self/exe");
    }
    bad |= run(0, 0, "cuda", "/proc/self/exe");
    printf("%s\n", bad ? "FAILED" : "ok");
    return bad;
}
