/*
 * GPU test (label gpu): batched copies of scattered blocks on every local
 * path: pinned host -> GPU, GPU -> pinned host, within one GPU, GPU ->
 * GPU (when two are present, kernels on either side), and pageable host
 * memory staged both ways; with each kernel variant (warp, bulk, and
 * hybrid: kernel plus copy engines). Blocks are random:
 * 8 KiB aligned ones, odd sizes at unaligned offsets (every alignment
 * class), and blocks larger than the split size. Every block is checked
 * by checksum against its source, bytes around the blocks must be
 * untouched, out-of-range blocks are refused (and not written) while the
 * others are copied, GPU ranges past their allocation are refused at
 * registration, and nothing leaks. Exits 77 without a GPU.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kvferry/kvferry.h>

#include "core/checksum.h"
#include "core/rng.h"
#include "mem/cuda/cuda.h"

#define POOL    (32u << 20)
#define NBLK    3000
#define TIMEOUT 20000

typedef struct {
    kvf_cuda_mem_t src, dst;
    kvf_cuda_blk_t *blks;
    size_t n;
} job_t;

static int pool_new(kvf_cuda_mem_t *m, kvf_mem_type_t type, int dev,
                    uint64_t seed)
{
    kvf_rng_t rng;
    char *tmp;

    memset(m, 0, sizeof(*m));
    m->type = type;
    m->device = dev;
    m->len = POOL;
    if (type == KVF_MEM_HOST) {
        m->base = malloc(POOL);
        assert_non_null(m->base);
    } else {
        assert_int_equal(kvf_cuda_mem_alloc(type, dev, POOL, &m->base), KVF_OK);
    }
    tmp = malloc(POOL);
    assert_non_null(tmp);
    kvf_rng_seed(&rng, seed);
    kvf_rng_fill(&rng, tmp, POOL);
    assert_int_equal(kvf_cuda_memcpy(m->base, tmp, POOL), KVF_OK);
    free(tmp);
    return 0;
}

static void pool_free(kvf_cuda_mem_t *m)
{
    if (m->type == KVF_MEM_HOST) {
        free(m->base);
    } else {
        kvf_cuda_mem_free(m->type, m->base);
    }
}

/* A copy of a pool's bytes on the host. */
static unsigned char *snapshot(const kvf_cuda_mem_t *m)
{
    unsigned char *h = malloc(m->len);

    assert_non_null(h);
    assert_int_equal(kvf_cuda_memcpy(h, m->base, m->len), KVF_OK);
    return h;
}

/*
 * Random non-overlapping blocks: the pool is cut in n slots of
 * POOL/n bytes; each block takes a random slot on each side, a random
 * length and offset inside it. Kinds: aligned 8 KiB, odd length at odd
 * offsets (every src/dst alignment difference), larger than the split.
 */
static void make_blocks(job_t *j, size_t n, kvf_rng_t *rng)
{
    uint64_t slot = POOL / n, i, *sp, *dp, k, t;

    sp = malloc(n * sizeof(*sp));
    dp = malloc(n * sizeof(*dp));
    for (i = 0; i < n; i++) {
        sp[i] = dp[i] = i;
    }
    for (i = n - 1; i > 0; i--) {
        k = kvf_rng_below(rng, i + 1);
        t = sp[i], sp[i] = sp[k], sp[k] = t;
        k = kvf_rng_below(rng, i + 1);
        t = dp[i], dp[i] = dp[k], dp[k] = t;
    }
    j->blks = calloc(n, sizeof(*j->blks));
    j->n = n;
    for (i = 0; i < n; i++) {
        kvf_cuda_blk_t *b = &j->blks[i];
        unsigned kind = n <= 4 ? 3 : (unsigned)(i % 4);

        if (kind == 0 && slot >= 8192) {
            b->len = 8192;
            b->src_off = sp[i] * slot;
            b->dst_off = dp[i] * slot;
        } else if (kind == 3 && slot > 16) {
            /* long, unaligned by the same amount on both sides */
            b->len = slot - 16 - kvf_rng_below(rng, 8);
            b->src_off = sp[i] * slot + 5;
            b->dst_off = dp[i] * slot + 5;
        } else {
            b->len = 1 + kvf_rng_below(rng, slot / 2);
            b->src_off = sp[i] * slot + kvf_rng_below(rng, slot - b->len);
            b->dst_off = dp[i] * slot + kvf_rng_below(rng, slot - b->len);
        }
    }
    free(sp);
    free(dp);
}

/* Every block equal to its source, every byte outside blocks unchanged. */
static void check_copy(const job_t *j, const unsigned char *src_before,
                       const unsigned char *dst_before,
                       const unsigned char *dst_after)
{
    unsigned char *mask = calloc(POOL, 1);
    size_t i, bad = 0;

    for (i = 0; i < j->n; i++) {
        const kvf_cuda_blk_t *b = &j->blks[i];

        if (kvf_checksum(src_before + b->src_off, b->len) !=
            kvf_checksum(dst_after + b->dst_off, b->len)) {
            bad++;
        }
        memset(mask + b->dst_off, 1, b->len);
    }
    assert_int_equal(bad, 0);
    for (i = 0; i < POOL; i++) {
        if (!mask[i] && dst_after[i] != dst_before[i]) {
            bad++;
        }
    }
    assert_int_equal(bad, 0);
    free(mask);
}

static void run_path(kvf_mem_type_t st, int sdev, kvf_mem_type_t dt, int ddev,
                     int run_dev, kvf_cuda_kernel_t kern, size_t n,
                     uint64_t seed)
{
    unsigned char *sb, *db, *da;
    kvf_cuda_copy_t *cp;
    kvf_rng_t rng;
    job_t j;

    memset(&j, 0, sizeof(j));
    pool_new(&j.src, st, sdev, seed);
    pool_new(&j.dst, dt, ddev, seed + 1);
    kvf_rng_seed(&rng, seed + 2);
    make_blocks(&j, n, &rng);
    sb = snapshot(&j.src);
    db = snapshot(&j.dst);
    assert_int_equal(kvf_cuda_copy_create(run_dev, &cp), KVF_OK);
    kvf_cuda_copy_set_kernel(cp, kern);
    if (seed % 4 == 2 && st != KVF_MEM_HOST && dt != KVF_MEM_HOST) {
        /* the block list in GPU memory (a block table kept on the GPU) */
        kvf_cuda_blk_t *gb;

        assert_int_equal(kvf_cuda_mem_alloc(KVF_MEM_CUDA, run_dev,
                                            j.n * sizeof(*gb), (void **)&gb),
                         KVF_OK);
        assert_int_equal(kvf_cuda_memcpy(gb, j.blks, j.n * sizeof(*gb)),
                         KVF_OK);
        assert_int_equal(
            kvf_cuda_copy_blocks_dev(cp, &j.src, &j.dst, gb, j.n, TIMEOUT),
            KVF_OK);
        kvf_cuda_mem_free(KVF_MEM_CUDA, gb);
    } else if (seed & 1) {
        /* the block list in pinned memory is read in place */
        kvf_cuda_blk_t *pb;

        assert_int_equal(kvf_cuda_mem_alloc(KVF_MEM_PINNED, 0,
                                            j.n * sizeof(*pb), (void **)&pb),
                         KVF_OK);
        memcpy(pb, j.blks, j.n * sizeof(*pb));
        assert_int_equal(
            kvf_cuda_copy_blocks(cp, &j.src, &j.dst, pb, j.n, TIMEOUT), KVF_OK);
        kvf_cuda_mem_free(KVF_MEM_PINNED, pb);
    } else {
        assert_int_equal(
            kvf_cuda_copy_blocks(cp, &j.src, &j.dst, j.blks, j.n, TIMEOUT),
            KVF_OK);
    }
    da = snapshot(&j.dst);
    check_copy(&j, sb, db, da);
    /* checksums computed through the module agree with the host's */
    {
        uint64_t offs[8], lens[8], sums[8];
        size_t i, m = j.n < 8 ? j.n : 8;

        for (i = 0; i < m; i++) {
            offs[i] = j.blks[i].dst_off;
            lens[i] = j.blks[i].len;
        }
        assert_int_equal(
            kvf_cuda_checksum_blocks(cp, &j.dst, offs, lens, m, sums, TIMEOUT),
            KVF_OK);
        for (i = 0; i < m; i++) {
            assert_true(sums[i] == kvf_checksum(da + offs[i], lens[i]));
        }
    }
    kvf_cuda_copy_destroy(cp);
    free(sb);
    free(db);
    free(da);
    free(j.blks);
    pool_free(&j.src);
    pool_free(&j.dst);
}

static const kvf_cuda_kernel_t kernels[] = {
    KVF_CUDA_KERNEL_WARP, KVF_CUDA_KERNEL_BULK, KVF_CUDA_KERNEL_HYBRID};
#define NK 3

static void test_h2d(void **state)
{
    unsigned k;

    (void)state;
    for (k = 0; k < NK; k++) {
        run_path(KVF_MEM_PINNED, 0, KVF_MEM_CUDA, 0, 0, kernels[k], NBLK,
                 10 + k);
        run_path(KVF_MEM_PINNED, 0, KVF_MEM_CUDA, 0, 0, kernels[k], 37, 20 + k);
    }
}

static void test_d2h(void **state)
{
    unsigned k;

    (void)state;
    for (k = 0; k < NK; k++) {
        run_path(KVF_MEM_CUDA, 0, KVF_MEM_PINNED, 0, 0, kernels[k], NBLK,
                 30 + k);
    }
}

static void test_d2d(void **state)
{
    unsigned k;

    (void)state;
    for (k = 0; k < NK; k++) {
        run_path(KVF_MEM_CUDA, 0, KVF_MEM_CUDA, 0, 0, kernels[k], NBLK, 40 + k);
    }
}

static void test_p2p(void **state)
{
    unsigned k;

    (void)state;
    if (kvf_cuda_device_count() < 2 || !kvf_cuda_peer_enable(0, 1) ||
        !kvf_cuda_peer_enable(1, 0)) {
        skip();
    }
    for (k = 0; k < NK; k++) {
        run_path(KVF_MEM_CUDA, 0, KVF_MEM_CUDA, 1, 0, kernels[k], NBLK,
                 50 + k); /* push */
        run_path(KVF_MEM_CUDA, 0, KVF_MEM_CUDA, 1, 1, kernels[k], NBLK,
                 60 + k); /* pull */
    }
}

static void test_pageable(void **state)
{
    (void)state;
    run_path(KVF_MEM_HOST, 0, KVF_MEM_CUDA, 0, 0, KVF_CUDA_KERNEL_AUTO, NBLK,
             70);
    run_path(KVF_MEM_CUDA, 0, KVF_MEM_HOST, 0, 0, KVF_CUDA_KERNEL_AUTO, NBLK,
             71);
    /* a few blocks larger than one staging slot (8 MiB) */
    run_path(KVF_MEM_HOST, 0, KVF_MEM_CUDA, 0, 0, KVF_CUDA_KERNEL_AUTO, 3, 72);
    run_path(KVF_MEM_CUDA, 0, KVF_MEM_HOST, 0, 0, KVF_CUDA_KERNEL_AUTO, 3, 73);
}

/* Out-of-range blocks are refused and not written; the rest are copied. */
static void test_out_of_range(void **state)
{
    kvf_cuda_blk_t blks[4];
    kvf_cuda_copy_t *cp;
    unsigned char *before, *after;
    kvf_cuda_mem_t src, dst;
    int p, k;

    (void)state;
    for (p = 0; p < 3; p++) {
        kvf_mem_type_t st = p == 1 ? KVF_MEM_HOST : KVF_MEM_CUDA;
        kvf_mem_type_t dt = p == 2 ? KVF_MEM_PINNED : KVF_MEM_CUDA;

        for (k = 0; k < NK; k++) {
            pool_new(&src, st, 0, 80);
            pool_new(&dst, dt, 0, 81);
            before = snapshot(&dst);
            blks[0] = (kvf_cuda_blk_t){0, 0, 4096};
            blks[1] = (kvf_cuda_blk_t){POOL - 100, 8192, 101};    /* src */
            blks[2] = (kvf_cuda_blk_t){8192, POOL - 10, 11};      /* dst */
            blks[3] = (kvf_cuda_blk_t){16384, UINT64_MAX - 2, 8}; /* wrap */
            assert_int_equal(kvf_cuda_copy_create(0, &cp), KVF_OK);
            kvf_cuda_copy_set_kernel(cp, kernels[k]);
            assert_int_equal(
                kvf_cuda_copy_blocks(cp, &src, &dst, blks, 4, TIMEOUT),
                KVF_ERR_OUT_OF_BOUNDS);
            after = snapshot(&dst);
            /* block 0 copied, the refused ones left the bytes alone */
            {
                unsigned char *sb = snapshot(&src);

                assert_memory_equal(after, sb, 4096);
                free(sb);
            }
            assert_memory_equal(after + 4096, before + 4096, POOL - 4096);
            kvf_cuda_copy_destroy(cp);
            free(before);
            free(after);
            pool_free(&src);
            pool_free(&dst);
        }
    }
}

/* A block list in GPU memory: bounds still checked by the kernels; a
 * list in host memory or a pageable side is refused. */
static void test_dev_list(void **state)
{
    kvf_cuda_blk_t blks[3], *gb;
    kvf_cuda_copy_t *cp;
    kvf_cuda_mem_t src, dst, host;
    unsigned char *sb, *after;

    (void)state;
    pool_new(&src, KVF_MEM_CUDA, 0, 90);
    pool_new(&dst, KVF_MEM_CUDA, 0, 91);
    pool_new(&host, KVF_MEM_HOST, 0, 92);
    blks[0] = (kvf_cuda_blk_t){0, 0, 4096};
    blks[1] = (kvf_cuda_blk_t){POOL - 100, 8192, 101};
    blks[2] = (kvf_cuda_blk_t){8192, POOL - 10, 11};
    assert_int_equal(kvf_cuda_copy_create(0, &cp), KVF_OK);
    assert_int_equal(
        kvf_cuda_mem_alloc(KVF_MEM_CUDA, 0, sizeof(blks), (void **)&gb),
        KVF_OK);
    assert_int_equal(kvf_cuda_memcpy(gb, blks, sizeof(blks)), KVF_OK);
    assert_int_equal(kvf_cuda_copy_blocks_dev(cp, &src, &dst, gb, 3, TIMEOUT),
                     KVF_ERR_OUT_OF_BOUNDS);
    sb = snapshot(&src);
    after = snapshot(&dst);
    assert_memory_equal(after, sb, 4096);
    assert_int_equal(kvf_cuda_copy_blocks_dev(cp, &src, &dst, blks, 1, TIMEOUT),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_cuda_copy_blocks_dev(cp, &host, &dst, gb, 1, TIMEOUT),
                     KVF_ERR_INVALID_PARAM);
    kvf_cuda_mem_free(KVF_MEM_CUDA, gb);
    kvf_cuda_copy_destroy(cp);
    free(sb);
    free(after);
    pool_free(&src);
    pool_free(&dst);
    pool_free(&host);
}

static void res_stats(kvf_cuda_copy_t *cp, uint64_t *jobs, uint64_t *launches)
{
    uint64_t fallbacks;

    kvf_cuda_copy_res_stats(cp, jobs, launches, &fallbacks);
    assert_int_equal(fallbacks, 0);
}

/* The resident copy kernel (cuda_resident = on: every in-place batch of
 * the warp kernel): every path with odd sizes at unaligned offsets, the
 * list in pinned or GPU memory; out-of-range blocks refused (the rest
 * copied) and the next batch unaffected; an instance that idled out is
 * started again; park; batches really went through it (counters). */
static void test_resident(void **state)
{
    int p2p = kvf_cuda_device_count() > 1 && kvf_cuda_peer_enable(0, 1) &&
              kvf_cuda_peer_enable(1, 0);
    unsigned char *before, *after, *sb;
    uint64_t jobs, launches, j0, l0;
    kvf_cuda_mem_t src, dst;
    kvf_cuda_copy_t *cp;
    kvf_cuda_blk_t *pb;
    int i;

    (void)state;
    setenv("KVF_CUDA_RESIDENT", "on", 1);
    setenv("KVF_CUDA_RESIDENT_IDLE_US", "1000", 1);
    /* odd seeds: list in pinned memory, read in place; 2 mod 4: on GPU */
    run_path(KVF_MEM_PINNED, 0, KVF_MEM_CUDA, 0, 0, KVF_CUDA_KERNEL_WARP, NBLK,
             101);
    run_path(KVF_MEM_PINNED, 0, KVF_MEM_CUDA, 0, 0, KVF_CUDA_KERNEL_WARP, 37,
             103);
    run_path(KVF_MEM_CUDA, 0, KVF_MEM_CUDA, 0, 0, KVF_CUDA_KERNEL_WARP, NBLK,
             105);
    run_path(KVF_MEM_CUDA, 0, KVF_MEM_CUDA, 0, 0, KVF_CUDA_KERNEL_WARP, NBLK,
             106);
    run_path(KVF_MEM_CUDA, 0, KVF_MEM_PINNED, 0, 0, KVF_CUDA_KERNEL_WARP, NBLK,
             107);
    if (p2p) {
        run_path(KVF_MEM_CUDA, 0, KVF_MEM_CUDA, 1, 0, KVF_CUDA_KERNEL_AUTO,
                 NBLK, 109); /* push */
        run_path(KVF_MEM_CUDA, 0, KVF_MEM_CUDA, 1, 0, KVF_CUDA_KERNEL_AUTO,
                 NBLK, 110); /* push, list on the GPU */
        run_path(KVF_MEM_CUDA, 0, KVF_MEM_CUDA, 1, 1, KVF_CUDA_KERNEL_AUTO,
                 NBLK, 111); /* pull */
        run_path(KVF_MEM_CUDA, 0, KVF_MEM_CUDA, 1, 0, KVF_CUDA_KERNEL_AUTO, 3,
                 113); /* a few long unaligned blocks */
    }
    pool_new(&src, KVF_MEM_CUDA, 0, 120);
    pool_new(&dst, KVF_MEM_CUDA, p2p ? 1 : 0, 121);
    assert_int_equal(
        kvf_cuda_mem_alloc(KVF_MEM_PINNED, 0, 4 * sizeof(*pb), (void **)&pb),
        KVF_OK);
    assert_int_equal(kvf_cuda_copy_create(0, &cp), KVF_OK);
    before = snapshot(&dst);
    pb[0] = (kvf_cuda_blk_t){0, 0, 4096};
    pb[1] = (kvf_cuda_blk_t){POOL - 100, 8192, 101};    /* src */
    pb[2] = (kvf_cuda_blk_t){8192, POOL - 10, 11};      /* dst */
    pb[3] = (kvf_cuda_blk_t){16384, UINT64_MAX - 2, 8}; /* wrap */
    assert_int_equal(kvf_cuda_copy_blocks(cp, &src, &dst, pb, 4, TIMEOUT),
                     KVF_ERR_OUT_OF_BOUNDS);
    res_stats(cp, &jobs, &launches);
    assert_int_equal(jobs, 1);
    assert_int_equal(launches, 1);
    after = snapshot(&dst);
    sb = snapshot(&src);
    assert_memory_equal(after, sb, 4096);
    assert_memory_equal(after + 4096, before + 4096, POOL - 4096);
    /* the next batch is fine; odd length, unaligned, both sides */
    pb[0] = (kvf_cuda_blk_t){12345, 54321, 7777};
    assert_int_equal(kvf_cuda_copy_blocks(cp, &src, &dst, pb, 1, TIMEOUT),
                     KVF_OK);
    free(after);
    after = snapshot(&dst);
    assert_memory_equal(after + 54321, sb + 12345, 7777);
    /* idle past cuda_resident_idle_us: it left, the next batch starts it */
    res_stats(cp, &j0, &l0);
    usleep(30000);
    assert_int_equal(kvf_cuda_copy_blocks(cp, &src, &dst, pb, 1, TIMEOUT),
                     KVF_OK);
    res_stats(cp, &jobs, &launches);
    assert_int_equal(jobs, j0 + 1);
    assert_int_equal(launches, l0 + 1);
    /* back to back: one instance takes them all */
    kvf_cuda_copy_park(cp);
    setenv("KVF_CUDA_RESIDENT_IDLE_US", "500000", 1);
    res_stats(cp, &j0, &l0);
    for (i = 0; i < 50; i++) {
        pb[0] = (kvf_cuda_blk_t){(uint64_t)i * 8192 + 3, (uint64_t)i * 8192 + 7,
                                 8000 + (uint64_t)i};
        assert_int_equal(kvf_cuda_copy_blocks(cp, &src, &dst, pb, 1, TIMEOUT),
                         KVF_OK);
    }
    res_stats(cp, &jobs, &launches);
    assert_int_equal(jobs, j0 + 50);
    assert_int_equal(launches, l0 + 1);
    free(after);
    after = snapshot(&dst);
    for (i = 0; i < 50; i++) {
        assert_memory_equal(after + i * 8192 + 7, sb + i * 8192 + 3, 8000 + i);
    }
    /* parked: the next batch starts a new instance */
    kvf_cuda_copy_park(cp);
    assert_int_equal(kvf_cuda_copy_blocks(cp, &src, &dst, pb, 1, TIMEOUT),
                     KVF_OK);
    res_stats(cp, &jobs, &launches);
    assert_int_equal(launches, l0 + 2);
    kvf_cuda_copy_destroy(cp);
    unsetenv("KVF_CUDA_RESIDENT");
    unsetenv("KVF_CUDA_RESIDENT_IDLE_US");
    kvf_cuda_mem_free(KVF_MEM_PINNED, pb);
    free(before);
    free(after);
    free(sb);
    pool_free(&src);
    pool_free(&dst);
}

/* Registration checks GPU ranges against their allocation. */
static void test_register_bounds(void **state)
{
    kvf_engine_params_t p = {0};
    kvf_region_h r;
    kvf_engine_h e;
    char *g, *h, host[4096];

    (void)state;
    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN;
    p.no_listen = 1;
    assert_int_equal(kvf_engine_create(&p, &e), KVF_OK);
    assert_int_equal(kvf_cuda_mem_alloc(KVF_MEM_CUDA, 0, 1 << 20, (void **)&g),
                     KVF_OK);
    assert_int_equal(
        kvf_cuda_mem_alloc(KVF_MEM_PINNED, 0, 1 << 20, (void **)&h), KVF_OK);
    /* past the end of the allocation */
    assert_int_equal(kvf_engine_reg(e, g + 4096, 1 << 20, KVF_MEM_CUDA, 0, &r),
                     KVF_ERR_OUT_OF_BOUNDS);
    /* host memory claimed to be GPU memory */
    assert_int_equal(kvf_engine_reg(e, host, sizeof(host), KVF_MEM_CUDA, 0, &r),
                     KVF_ERR_OUT_OF_BOUNDS);
    /* pageable memory claimed to be pinned */
    assert_int_equal(
        kvf_engine_reg(e, host, sizeof(host), KVF_MEM_PINNED, 0, &r),
        KVF_ERR_INVALID_PARAM);
    /* no such GPU */
    assert_int_equal(kvf_engine_reg(e, g, 4096, KVF_MEM_CUDA, 63, &r),
                     KVF_ERR_INVALID_PARAM);
    if (kvf_cuda_device_count() > 1) {
        assert_int_equal(kvf_engine_reg(e, g, 4096, KVF_MEM_CUDA, 1, &r),
                         KVF_ERR_OUT_OF_BOUNDS);
    }
    /* exactly the allocation, and a piece of it, are fine */
    assert_int_equal(kvf_engine_reg(e, g, 1 << 20, KVF_MEM_CUDA, 0, &r),
                     KVF_OK);
    assert_int_equal(
        kvf_cuda_region_lookup((uint64_t)(uintptr_t)g + 5, NULL, NULL),
        KVF_MEM_CUDA);
    assert_int_equal(kvf_engine_dereg(e, r), KVF_OK);
    assert_int_equal(
        kvf_cuda_region_lookup((uint64_t)(uintptr_t)g + 5, NULL, NULL),
        KVF_MEM_HOST);
    assert_int_equal(kvf_engine_reg(e, h + 100, 1000, KVF_MEM_PINNED, 0, &r),
                     KVF_OK);
    assert_int_equal(kvf_engine_dereg(e, r), KVF_OK);
    kvf_engine_destroy(e);
    kvf_cuda_mem_free(KVF_MEM_CUDA, g);
    kvf_cuda_mem_free(KVF_MEM_PINNED, h);
}

/* kvf_mem_alloc's GPU types: usable memory that registers, freed by
 * kvf_mem_free, nothing leaked. */
static void test_mem_alloc(void **state)
{
    kvf_engine_params_t p = {0};
    kvf_region_h rp, rc;
    kvf_engine_h e;
    char *pin, *gpu, h[4096];

    (void)state;
    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN;
    p.no_listen = 1;
    assert_int_equal(kvf_engine_create(&p, &e), KVF_OK);
    assert_int_equal(kvf_mem_alloc(8u << 20, KVF_MEM_PINNED, 0, (void **)&pin),
                     KVF_OK);
    assert_int_equal(kvf_mem_alloc(8u << 20, KVF_MEM_CUDA, 0, (void **)&gpu),
                     KVF_OK);
    assert_int_equal(kvf_engine_reg(e, pin, 8u << 20, KVF_MEM_PINNED, 0, &rp),
                     KVF_OK);
    assert_int_equal(kvf_engine_reg(e, gpu, 8u << 20, KVF_MEM_CUDA, 0, &rc),
                     KVF_OK);
    memset(pin, 0x3c, 8u << 20);
    assert_int_equal(kvf_cuda_memcpy(gpu + 4096, pin, 4096), KVF_OK);
    assert_int_equal(kvf_cuda_memcpy(h, gpu + 4096, 4096), KVF_OK);
    assert_memory_equal(h, pin, 4096);
    assert_int_equal(kvf_engine_dereg(e, rp), KVF_OK);
    assert_int_equal(kvf_engine_dereg(e, rc), KVF_OK);
    kvf_engine_destroy(e);
    kvf_mem_free(pin);
    kvf_mem_free(gpu);
    assert_int_equal(kvf_cuda_mem_track_release(gpu, KVF_MEM_CUDA),
                     KVF_ERR_NOT_FOUND);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_h2d),
        cmocka_unit_test(test_d2h),
        cmocka_unit_test(test_d2d),
        cmocka_unit_test(test_p2p),
        cmocka_unit_test(test_pageable),
        cmocka_unit_test(test_out_of_range),
        cmocka_unit_test(test_dev_list),
        cmocka_unit_test(test_resident),
        cmocka_unit_test(test_register_bounds),
        cmocka_unit_test(test_mem_alloc),
    };
    long b0, y0, b1, y1;
    int rc;

    if (kvf_cuda_device_count() == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    kvf_alloc_stats(&b0, &y0);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    kvf_alloc_stats(&b1, &y1);
    if (rc == 0 && (b1 != b0 || y1 != y0)) {
        fprintf(stderr, "leak: %ld blocks, %ld bytes\n", b1 - b0, y1 - y0);
        return 1;
    }
    return rc;
}
