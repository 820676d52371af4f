/*
 * GPU test (label gpu): CUDA IPC between two processes. The test starts
 * itself again as a child (a fresh process, so no CUDA state crosses a
 * fork) that allocates GPU memory, fills it with seeded bytes and exports
 * a handle for an address inside the allocation. The parent maps it
 * (on every GPU it has, so GPU 1 reaches GPU 0's memory over NVLink when
 * two are present), reads scattered blocks with the batched copy kernels
 * and checks them, writes other blocks, and the child checks those.
 * Exits 77 without a GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kvferry/kvferry.h>

#include "core/rng.h"
#include "mem/cuda/cuda.h"

#define LEN    (8u << 20)
#define OFFSET 4096u
#define NB     64

static void fill(unsigned char *h, uint64_t seed)
{
    kvf_rng_t rng;

    kvf_rng_seed(&rng, seed);
    kvf_rng_fill(&rng, h, LEN);
}

/* Child: export, wait for the parent's writes, check them. */
static int child(void)
{
    unsigned char handle[KVF_CUDA_IPC_HANDLE], *h = malloc(LEN);
    unsigned char *g, *want = malloc(LEN);
    uint64_t off = 0;
    char line[16];
    unsigned i;

    if (kvf_cuda_mem_alloc(KVF_MEM_CUDA, 0, LEN, (void **)&g) != KVF_OK) {
        return 2;
    }
    fill(h, 5);
    if (kvf_cuda_memcpy(g, h, LEN) != KVF_OK ||
        kvf_cuda_ipc_export((uint64_t)(uintptr_t)g + OFFSET, handle, &off) !=
            KVF_OK ||
        off != OFFSET) {
        return 3;
    }
    for (i = 0; i < KVF_CUDA_IPC_HANDLE; i++) {
        printf("%02x", handle[i]);
    }
    printf("\n");
    fflush(stdout);
    if (fgets(line, sizeof(line), stdin) == NULL) {
        return 4;
    }
    /* the parent wrote blocks of seed 6 at [LEN/2, LEN) */
    fill(want, 6);
    if (kvf_cuda_memcpy(h, g, LEN) != KVF_OK ||
        memcmp(h + LEN / 2, want + LEN / 2, LEN / 2) != 0) {
        fprintf(stderr, "child: parent's writes not found\n");
        return 5;
    }
    kvf_cuda_mem_free(KVF_MEM_CUDA, g);
    free(h);
    free(want);
    return 0;
}

int main(int argc, char **argv)
{
    unsigned char handle[KVF_CUDA_IPC_HANDLE], *expect, *got, *src;
    int to_child[2], from_child[2], status, dev, ndev, bad = 0;
    char line[2 * KVF_CUDA_IPC_HANDLE + 8];
    kvf_cuda_blk_t blks[NB];
    kvf_cuda_mem_t peer, host;
    kvf_cuda_copy_t *cp;
    unsigned i;
    pid_t pid;
    FILE *in;

    if (argc > 1 && strcmp(argv[1], "child") == 0) {
        return child();
    }
    if (pipe(to_child) != 0 || pipe(from_child) != 0) {
        return 1;
    }
    /* start the child before this process touches CUDA */
    pid = fork();
    if (pid == 0) {
        dup2(to_child[0], 0);
        dup2(from_child[1], 1);
        close(to_child[1]);
        close(from_child[0]);
        execl("/proc/self/exe", argv[0], "child", (char *)NULL);
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    ndev = kvf_cuda_device_count();
    in = fdopen(from_child[0], "r");
    if (in == NULL || fgets(line, sizeof(line), in) == NULL ||
        strlen(line) < 2 * KVF_CUDA_IPC_HANDLE) {
        waitpid(pid, &status, 0);
        if (ndev == 0) {
            printf("no GPU: skipped\n");
            return 77;
        }
        fprintf(stderr, "child gave no handle (status %d)\n", status);
        return 1;
    }
    for (i = 0; i < KVF_CUDA_IPC_HANDLE; i++) {
        unsigned v;

        sscanf(line + 2 * i, "%2x", &v);
        handle[i] = (unsigned char)v;
    }
    expect = malloc(LEN);
    fill(expect, 5);
    src = malloc(LEN);
    fill(src, 6);
    for (dev = 0; dev < ndev && dev < 2; dev++) {
        void *base = NULL;

        if (kvf_cuda_ipc_open(handle, dev, &base) != KVF_OK) {
            fprintf(stderr, "open on GPU %d failed\n", dev);
            bad = 1;
            break;
        }
        peer.base = base;
        peer.len = LEN;
        peer.type = KVF_MEM_CUDA;
        peer.device = 0; /* where the child's memory lives */
        host.type = KVF_MEM_PINNED;
        host.len = LEN;
        host.device = 0;
        if (kvf_cuda_mem_alloc(KVF_MEM_PINNED, 0, LEN, &host.base) != KVF_OK ||
            kvf_cuda_copy_create(dev, &cp) != KVF_OK) {
            bad = 1;
            break;
        }
        /* read scattered blocks of the first half */
        for (i = 0; i < NB; i++) {
            blks[i].src_off = (uint64_t)i * (LEN / 2 / NB) + i;
            blks[i].dst_off = (uint64_t)i * (LEN / 2 / NB);
            blks[i].len = 4096 + i * 7;
        }
        memset(host.base, 0, LEN);
        if (kvf_cuda_copy_blocks(cp, &peer, &host, blks, NB, 10000) != KVF_OK) {
            bad = 1;
        }
        got = host.base;
        for (i = 0; i < NB && !bad; i++) {
            if (memcmp(got + blks[i].dst_off, expect + blks[i].src_off,
                       blks[i].len) != 0) {
                fprintf(stderr, "GPU %d: block %u differs\n", dev, i);
                bad = 1;
            }
        }
        /* write the second half as scattered 64 KiB pieces */
        memcpy(host.base, src, LEN);
        for (i = 0; i < NB; i++) {
            blks[i].src_off = LEN / 2 + (uint64_t)i * (LEN / 2 / NB);
            blks[i].dst_off = blks[i].src_off;
            blks[i].len = LEN / 2 / NB;
        }
        if (kvf_cuda_copy_blocks(cp, &host, &peer, blks, NB, 10000) != KVF_OK) {
            bad = 1;
        }
        kvf_cuda_copy_destroy(cp);
        kvf_cuda_mem_free(KVF_MEM_PINNED, host.base);
        kvf_cuda_ipc_close(dev, base);
    }
    if (write(to_child[1], "go\n", 3) != 3) {
        bad = 1;
    }
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "child failed (status %d)\n", status);
        bad = 1;
    }
    free(expect);
    free(src);
    fclose(in);
    printf("%s\n", bad ? "FAILED" : "ok");
    return bad;
}
