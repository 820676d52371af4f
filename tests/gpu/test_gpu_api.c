/*
 * GPU test (label gpu, exit 77 without a GPU): the public GPU calls of
 * kvferry/gpu.h, through public headers only. 1000 random 8 KiB blocks
 * go host -> GPU -> host in one batch each way (pinned and pageable host
 * memory, the block list on the host and on the GPU, kernels and copy
 * engines); bytes and checksums (kvf_gpu_checksum, kvf_gpu_checksum_blocks,
 * KVF_GPU_VERIFY) are compared with the host's. Each check prints a PASS
 * or FAIL line; the last line says whether the whole test passed.
 */
#include <kvferry/gpu.h>
#include <kvferry/kvferry.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBLK   1000u
#define BLK    8192u
#define NSLOTS 2048u
#define POOL   ((uint64_t)NSLOTS * BLK)
#define TMO    20000

static int g_fail;

static void check(int ok, const char *what, kvf_status_t st)
{
    printf("%s: %s", ok ? "PASS" : "FAIL", what);
    if (!ok) {
        printf(" (%s)", kvf_status_str(st));
        g_fail = 1;
    }
    printf("\n");
    fflush(stdout);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* n distinct random slots of NSLOTS. */
static void pick(uint32_t *out, unsigned n, uint64_t *s)
{
    static uint32_t perm[NSLOTS];
    unsigned i, j;
    uint32_t t;

    for (i = 0; i < NSLOTS; i++) {
        perm[i] = i;
    }
    for (i = 0; i < n; i++) {
        j = i + (unsigned)(rng_next(s) % (NSLOTS - i));
        t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        out[i] = perm[i];
    }
}

/* Blocks from random slots of one side to random slots of the other. */
static void make_blocks(kvf_gpu_block_t *b, unsigned n, uint64_t *s)
{
    static uint32_t a[NBLK], c[NBLK];
    unsigned i;

    pick(a, n, s);
    pick(c, n, s);
    for (i = 0; i < n; i++) {
        b[i].src_off = (uint64_t)a[i] * BLK;
        b[i].dst_off = (uint64_t)c[i] * BLK;
        b[i].len = BLK;
    }
}

/* Every block's bytes equal on both host sides. */
static int same_bytes(const char *src, const char *dst,
                      const kvf_gpu_block_t *b, unsigned n)
{
    unsigned i;

    for (i = 0; i < n; i++) {
        if (memcmp(src + b[i].src_off, dst + b[i].dst_off, b[i].len) != 0) {
            return 0;
        }
    }
    return 1;
}

/* Block src (host) -> GPU slot mid -> host dst: the composed block list
 * of the round trip, for comparing dst with src. */
static void compose(const kvf_gpu_block_t *up, const kvf_gpu_block_t *down,
                    kvf_gpu_block_t *rt, unsigned n)
{
    unsigned i, j;

    for (i = 0; i < n; i++) {
        rt[i].len = 0;
        for (j = 0; j < n; j++) {
            if (up[j].dst_off == down[i].src_off) {
                rt[i].src_off = up[j].src_off;
                rt[i].dst_off = down[i].dst_off;
                rt[i].len = down[i].len;
                break;
            }
        }
    }
}

/* Checksums of the GPU's blocks (one batch, and one call per block)
 * against the host's. */
static void check_sums(kvf_gpu_copier_t *c, const kvf_gpu_mem_t *gpu,
                       const char *host, const kvf_gpu_block_t *up)
{
    static uint64_t offs[NBLK], lens[NBLK], sums[NBLK];
    kvf_status_t st;
    unsigned i, bad = 0;
    uint64_t one = 0;

    for (i = 0; i < NBLK; i++) {
        offs[i] = up[i].dst_off;
        lens[i] = up[i].len;
    }
    st = kvf_gpu_checksum_blocks(c, gpu, offs, lens, NBLK, sums, TMO);
    for (i = 0; i < NBLK && st == KVF_OK; i++) {
        bad += sums[i] != kvf_checksum(host + up[i].src_off, up[i].len);
    }
    check(st == KVF_OK && bad == 0,
          "kvf_gpu_checksum_blocks of 1000 GPU blocks equals kvf_checksum", st);
    for (i = 0, bad = 0; i < NBLK && st == KVF_OK; i += 37) {
        st = kvf_gpu_checksum((const char *)gpu->base + up[i].dst_off,
                              up[i].len, &one);
        bad += st == KVF_OK &&
               one != kvf_checksum(host + up[i].src_off, up[i].len);
    }
    check(st == KVF_OK && bad == 0,
          "kvf_gpu_checksum of GPU blocks equals kvf_checksum", st);
}

/* One round trip host -> GPU -> host with the given host type. */
static void round_trip(kvf_gpu_copier_t *c, kvf_gpu_mem_t *host_src,
                       kvf_gpu_mem_t *host_dst, kvf_gpu_mem_t *gpu,
                       const char *name, uint64_t *seed)
{
    static kvf_gpu_block_t up[NBLK], down[NBLK], rt[NBLK];
    char what[160];
    kvf_status_t st;

    memset(host_dst->base, 0, POOL);
    make_blocks(up, NBLK, seed);
    st = kvf_gpu_copy_blocks(c, host_src, gpu, up, NBLK, KVF_GPU_VERIFY, TMO);
    snprintf(what, sizeof(what), "%s: 1000 x 8 KiB host -> GPU, verified",
             name);
    check(st == KVF_OK, what, st);
    check_sums(c, gpu, host_src->base, up);
    /* back to the host from the same GPU slots, in another order */
    memcpy(down, up, sizeof(up));
    make_blocks(rt, NBLK, seed);
    for (unsigned i = 0; i < NBLK; i++) {
        down[i].src_off = up[NBLK - 1 - i].dst_off;
        down[i].dst_off = rt[i].dst_off;
    }
    st = kvf_gpu_copy_blocks(c, gpu, host_dst, down, NBLK, 0, TMO);
    snprintf(what, sizeof(what), "%s: 1000 x 8 KiB GPU -> host", name);
    check(st == KVF_OK, what, st);
    compose(up, down, rt, NBLK);
    snprintf(what, sizeof(what), "%s: round trip bytes equal", name);
    check(st == KVF_OK && same_bytes(host_src->base, host_dst->base, rt, NBLK),
          what, st);
}

/* down: each of up's blocks from where it landed back to a fresh random
 * place, rt's (made here). */
static void back_blocks(const kvf_gpu_block_t *up, kvf_gpu_block_t *down,
                        kvf_gpu_block_t *rt, uint64_t *seed)
{
    unsigned i;

    make_blocks(rt, NBLK, seed);
    for (i = 0; i < NBLK; i++) {
        down[i].src_off = up[i].dst_off;
        down[i].dst_off = rt[i].dst_off;
        down[i].len = BLK;
    }
}

/* The block list kept on the GPU, and the copy engines. */
static void other_paths(kvf_gpu_copier_t *c, kvf_gpu_mem_t *pin_src,
                        kvf_gpu_mem_t *pin_dst, kvf_gpu_mem_t *gpu,
                        uint64_t *seed)
{
    static kvf_gpu_block_t up[NBLK], down[NBLK], rt[NBLK];
    kvf_gpu_block_t *dlist = NULL;
    kvf_status_t st;

    memset(pin_dst->base, 0, POOL);
    make_blocks(up, NBLK, seed);
    st = kvf_gpu_copy_blocks(c, pin_src, gpu, up, NBLK, KVF_GPU_COPY_ENGINES,
                             TMO);
    check(st == KVF_OK, "copy engines: 1000 blocks host -> GPU", st);
    back_blocks(up, down, rt, seed);
    st = kvf_gpu_alloc(KVF_MEM_CUDA, kvf_gpu_copier_device(c), sizeof(down),
                       (void **)&dlist);
    if (st == KVF_OK) {
        st = kvf_gpu_copy(dlist, down, sizeof(down));
    }
    if (st == KVF_OK) {
        st = kvf_gpu_copy_blocks(c, gpu, pin_dst, dlist, NBLK,
                                 KVF_GPU_BLOCKS_ON_GPU, TMO);
    }
    check(st == KVF_OK, "block list on the GPU: 1000 blocks GPU -> host", st);
    kvf_gpu_free(KVF_MEM_CUDA, dlist);
    compose(up, down, rt, NBLK);
    check(st == KVF_OK && same_bytes(pin_src->base, pin_dst->base, rt, NBLK),
          "copy engines + GPU block list: round trip bytes equal", st);
}

/* Posted copies: quarters of the blocks posted one after the other
 * (more posts than the copier tells apart), only the last waited for;
 * every block then in place. A post out of bounds moves nothing and gives
 * no ticket; a ticket never given is refused. */
static void posted(kvf_gpu_copier_t *c, kvf_gpu_mem_t *pin_src,
                   kvf_gpu_mem_t *pin_dst, kvf_gpu_mem_t *gpu, uint64_t *seed)
{
    static kvf_gpu_block_t up[NBLK], down[NBLK], rt[NBLK];
    kvf_gpu_block_t oob = {POOL - BLK / 2, 0, BLK};
    uint64_t t = 0, first = 0, last = 0;
    kvf_status_t st = KVF_OK;
    unsigned i, q = NBLK / 20;

    memset(pin_dst->base, 0, POOL);
    make_blocks(up, NBLK, seed);
    for (i = 0; i < 20 && st == KVF_OK; i++) {
        st = kvf_gpu_copy_post(c, pin_src, gpu, up + i * q,
                               i == 19 ? NBLK - 19 * q : q, &t);
        first = i == 0 ? t : first;
    }
    last = t;
    check(st == KVF_OK && last == first + 19, "20 posts, tickets in order", st);
    st = kvf_gpu_copy_wait(c, last, 0);
    check(st == KVF_OK || st == KVF_ERR_TIMEOUT,
          "asked once: done or still running", st);
    st = kvf_gpu_copy_wait(c, last, TMO);
    check(st == KVF_OK, "the last post waited for", st);
    st = kvf_gpu_copy_wait(c, first, TMO);
    check(st == KVF_OK, "the first post's ticket (reused since) still waits",
          st);
    st = kvf_gpu_copy_wait(c, last, 0);
    check(st == KVF_OK, "asked once after the wait: done", st);
    back_blocks(up, down, rt, seed);
    st = kvf_gpu_copy_post(c, gpu, pin_dst, down, NBLK, &t);
    if (st == KVF_OK) {
        st = kvf_gpu_copy_wait(c, t, TMO);
    }
    compose(up, down, rt, NBLK);
    check(st == KVF_OK && same_bytes(pin_src->base, pin_dst->base, rt, NBLK),
          "posted copies: round trip bytes equal", st);
    t = 12345;
    st = kvf_gpu_copy_post(c, pin_src, gpu, &oob, 1, &t);
    check(st == KVF_ERR_OUT_OF_BOUNDS && t == 12345,
          "a post out of bounds answers KVF_ERR_OUT_OF_BOUNDS, no ticket", st);
    st = kvf_gpu_copy_wait(c, last + 1000, TMO);
    check(st == KVF_ERR_INVALID_PARAM,
          "a ticket never given answers KVF_ERR_INVALID_PARAM", st);
    st = kvf_gpu_copy_wait(c, last, -1);
    check(st == KVF_ERR_INVALID_PARAM,
          "a negative timeout answers KVF_ERR_INVALID_PARAM", st);
}

/* Bad input: refused blocks, bad flags; the good blocks still move. */
static void bad_input(kvf_gpu_copier_t *c, kvf_gpu_mem_t *pin_src,
                      kvf_gpu_mem_t *gpu)
{
    kvf_gpu_block_t b[2] = {{0, 0, BLK}, {POOL - BLK / 2, BLK, BLK}};
    kvf_status_t st;

    st = kvf_gpu_copy_blocks(c, pin_src, gpu, b, 2, 0, TMO);
    check(st == KVF_ERR_OUT_OF_BOUNDS,
          "a block past its side answers KVF_ERR_OUT_OF_BOUNDS", st);
    st = kvf_gpu_copy_blocks(c, pin_src, gpu, b, 1, 0x80u, TMO);
    check(st == KVF_ERR_INVALID_PARAM,
          "unknown flags answer KVF_ERR_INVALID_PARAM", st);
    st = kvf_gpu_copy_blocks(NULL, pin_src, gpu, b, 1, 0, TMO);
    check(st == KVF_ERR_INVALID_PARAM,
          "no copier answers KVF_ERR_INVALID_PARAM", st);
}

static void run(int dev)
{
    kvf_gpu_mem_t pin_src = {NULL, POOL, KVF_MEM_PINNED, 0};
    kvf_gpu_mem_t pin_dst = {NULL, POOL, KVF_MEM_PINNED, 0};
    kvf_gpu_mem_t pg_src = {NULL, POOL, KVF_MEM_HOST, -1};
    kvf_gpu_mem_t pg_dst = {NULL, POOL, KVF_MEM_HOST, -1};
    kvf_gpu_mem_t gpu = {NULL, POOL, KVF_MEM_CUDA, dev};
    kvf_gpu_copier_t *c = NULL;
    uint64_t seed = 0x9e3779b97f4a7c15ull, i;
    kvf_status_t st;

    st = kvf_gpu_copier_create(dev, &c);
    check(st == KVF_OK, "kvf_gpu_copier_create", st);
    st = kvf_gpu_alloc(KVF_MEM_PINNED, 0, POOL, &pin_src.base);
    if (st == KVF_OK) {
        st = kvf_gpu_alloc(KVF_MEM_PINNED, 0, POOL, &pin_dst.base);
    }
    if (st == KVF_OK) {
        st = kvf_gpu_alloc(KVF_MEM_CUDA, dev, POOL, &gpu.base);
    }
    pg_src.base = malloc(POOL);
    pg_dst.base = malloc(POOL);
    check(st == KVF_OK && pg_src.base && pg_dst.base,
          "kvf_gpu_alloc pinned and GPU pools", st);
    if (st == KVF_OK && c != NULL && pg_src.base && pg_dst.base) {
        for (i = 0; i < POOL / 8; i++) {
            ((uint64_t *)pin_src.base)[i] = rng_next(&seed);
            ((uint64_t *)pg_src.base)[i] = rng_next(&seed);
        }
        round_trip(c, &pin_src, &pin_dst, &gpu, "pinned", &seed);
        round_trip(c, &pg_src, &pg_dst, &gpu, "pageable", &seed);
        other_paths(c, &pin_src, &pin_dst, &gpu, &seed);
        posted(c, &pin_src, &pin_dst, &gpu, &seed);
        bad_input(c, &pin_src, &gpu);
    }
    kvf_gpu_copier_destroy(c);
    kvf_gpu_free(KVF_MEM_PINNED, pin_src.base);
    kvf_gpu_free(KVF_MEM_PINNED, pin_dst.base);
    kvf_gpu_free(KVF_MEM_CUDA, gpu.base);
    free(pg_src.base);
    free(pg_dst.base);
}

int main(void)
{
    kvf_gpu_info_t info;
    long b0, y0, b1, y1;
    kvf_status_t st;

    if (kvf_gpu_count() == 0) {
        printf("SKIP: test_gpu_api: no GPU (built with CUDA: %s)\n",
               kvf_gpu_built() ? "yes" : "no");
        return 77;
    }
    st = kvf_gpu_info(0, &info);
    check(st == KVF_OK && info.sm_count > 0 && info.mem_bytes > 0,
          "kvf_gpu_info(0)", st);
    if (st == KVF_OK) {
        printf("# GPU 0: %s, %d SMs, PCI %s, NUMA node %d, PCIe Gen%d x%d\n",
               info.name, info.sm_count, info.pci_bus_id, info.numa_node,
               info.pcie_gen, info.pcie_width);
    }
    check(kvf_gpu_kernel_parse(kvf_gpu_kernel_name(KVF_GPU_KERNEL_BULK)) ==
              KVF_GPU_KERNEL_BULK,
          "kernel names parse back", KVF_OK);
    kvf_alloc_stats(&b0, &y0);
    run(0);
    kvf_alloc_stats(&b1, &y1);
    check(b1 == b0 && y1 == y0, "no library allocation left behind", KVF_OK);
    printf("test_gpu_api: %s\n", g_fail ? "FAIL" : "PASS");
    return g_fail ? 1 : 0;
}
