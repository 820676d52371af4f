/*
 * GPU test (label gpu): local GPU memory moved over the ucx transport on
 * 127.0.0.1 (UCX_TLS=tcp,self), through the lanes' pinned buffers. A
 * target engine serves a host pool; an initiator engine registers a GPU
 * pool and a host pool and moves random blocks both ways, 8 KiB ones,
 * odd sizes at unaligned addresses and blocks of MiBs, in batches large
 * enough to need several buffers at once, GPU and host blocks in one
 * batch. A host-side model of the three pools is compared byte for byte
 * with them after every batch, and the target's checksums with the
 * model. Out-of-range remote addresses are refused with their status and
 * change nothing; a GPU region of the target is refused (ucx serves host
 * memory only); nothing leaks. Exits 77 without a GPU or without UCX.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvferry/kvferry.h>
#include <kvferry/perf.h>

#include "core/checksum.h"
#include "core/rng.h"
#include "mem/cuda/cuda.h"
#include "tests/gpu/pool_model.h"

#define POOL    (24u << 20)
#define TIMEOUT 20000

enum { L_GPU, L_HOST, R_HOST, NPOOLS };

typedef struct {
    kvf_engine_h tgt, ini;
    kvf_region_h reg[NPOOLS];
    kvf_peer_h peer;
    char *base[NPOOLS];
    unsigned char *model[NPOOLS];
    kvf_rng_t rng;
    long blocks0, bytes0;
} fixture_t;

static kvf_status_t engines(fixture_t *f)
{
    kvf_engine_params_t p = {0};
    kvf_status_t status;

    p.field_mask = KVF_ENGINE_PARAM_LISTEN | KVF_ENGINE_PARAM_TRANSPORTS |
                   KVF_ENGINE_PARAM_TIMEOUT;
    p.listen = "127.0.0.1:0";
    p.transports = "ucx";
    p.timeout_ms = TIMEOUT;
    status = kvf_engine_create(&p, &f->tgt);
    if (status != KVF_OK) {
        return status;
    }
    memset(&p, 0, sizeof(p));
    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_TIMEOUT |
                   KVF_ENGINE_PARAM_TRANSPORTS;
    p.no_listen = 1;
    p.timeout_ms = TIMEOUT;
    p.transports = "ucx";
    return kvf_engine_create(&p, &f->ini);
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    int i;

    kvf_alloc_stats(&f->blocks0, &f->bytes0);
    assert_int_equal(engines(f), KVF_OK);
    kvf_rng_seed(&f->rng, 4321);
    for (i = 0; i < NPOOLS; i++) {
        pool_model_open(i == R_HOST ? f->tgt : f->ini, i == L_GPU, 0, POOL,
                        &f->rng, &f->base[i], &f->model[i], &f->reg[i]);
    }
    assert_int_equal(
        kvf_peer_open(f->ini, kvf_engine_segment_name(f->tgt), &f->peer),
        KVF_OK);
    assert_string_equal(kvf_peer_transport(f->peer), "ucx");
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    long blocks, bytes;
    int i;

    kvf_peer_close(f->peer);
    for (i = 0; i < NPOOLS; i++) {
        pool_model_close(i == R_HOST ? f->tgt : f->ini, i == L_GPU, f->base[i],
                         f->model[i], f->reg[i]);
    }
    kvf_engine_destroy(f->ini);
    kvf_engine_destroy(f->tgt);
    kvf_alloc_stats(&blocks, &bytes);
    assert_int_equal(blocks, f->blocks0);
    assert_int_equal(bytes, f->bytes0);
    free(f);
    return 0;
}

/* Pool p equals its model. */
static void check_pool(fixture_t *f, int p)
{
    pool_model_check(f->base[p], f->model[p], POOL, p);
}

/*
 * One batch of n blocks of type op against the target's pool, from the
 * GPU pool (from the host pool for every `host_every`-th block when it
 * is not 0). mode 0: 8 KiB aligned; 1: odd sizes at unaligned offsets.
 * Blocks take distinct slots on each side, so they never overlap.
 */
static void batch(fixture_t *f, kvf_op_type_t op, size_t n, int mode,
                  size_t host_every)
{
    uint64_t slot = POOL / n, i, *ls = pool_model_shuffled(&f->rng, n);
    uint64_t *rs = pool_model_shuffled(&f->rng, n);
    uint64_t rbase = (uint64_t)(uintptr_t)f->base[R_HOST];
    kvf_op_t *ops = calloc(n, sizeof(*ops));

    for (i = 0; i < n; i++) {
        int lp = (host_every != 0 && i % host_every == 0) ? L_HOST : L_GPU;
        uint64_t len = 8192, lo = ls[i] * slot, ro = rs[i] * slot;

        if (mode == 1 || slot < 8192) {
            len = 1 + kvf_rng_below(&f->rng, slot / 2);
            lo += kvf_rng_below(&f->rng, slot - len);
            ro += kvf_rng_below(&f->rng, slot - len);
        }
        ops[i] = (kvf_op_t){op, f->base[lp] + lo, f->peer, rbase + ro, len};
        if (op == KVF_OP_READ) {
            memcpy(f->model[lp] + lo, f->model[R_HOST] + ro, len);
        } else {
            memcpy(f->model[R_HOST] + ro, f->model[lp] + lo, len);
        }
    }
    assert_int_equal(kvf_transfer_sync(f->ini, ops, n, TIMEOUT), KVF_OK);
    for (i = 0; i < NPOOLS; i++) {
        check_pool(f, (int)i);
    }
    pool_model_check_sums(f->peer, ops, n, f->model[R_HOST], rbase);
    free(ls);
    free(rs);
    free(ops);
}

static void test_gpu_blocks(void **state)
{
    fixture_t *f = *state;

    batch(f, KVF_OP_WRITE, 2048, 0, 0); /* 16 MiB: many buffers at once */
    batch(f, KVF_OP_READ, 2048, 0, 0);
    batch(f, KVF_OP_READ, 1500, 1, 0);
    batch(f, KVF_OP_WRITE, 1500, 1, 0);
    batch(f, KVF_OP_WRITE, 3, 1, 0); /* blocks of MiBs */
    batch(f, KVF_OP_READ, 3, 1, 0);
}

static void test_gpu_and_host_blocks(void **state)
{
    fixture_t *f = *state;

    batch(f, KVF_OP_WRITE, 1000, 1, 3);
    batch(f, KVF_OP_READ, 1000, 0, 3);
}

/* Out-of-range remote addresses are refused; nothing changes; the peer
 * keeps working. */
static void test_out_of_range(void **state)
{
    fixture_t *f = *state;
    uint64_t rbase = (uint64_t)(uintptr_t)f->base[R_HOST];
    kvf_op_t ops[2];
    kvf_batch_h b;
    size_t bytes;

    ops[0] = (kvf_op_t){KVF_OP_WRITE, f->base[L_GPU], f->peer,
                        rbase + POOL - 100, 200};
    ops[1] = (kvf_op_t){KVF_OP_READ, f->base[L_GPU] + 8192, f->peer,
                        rbase - 4096, 4096};
    assert_int_equal(kvf_batch_submit(f->ini, ops, 2, &b), KVF_OK);
    assert_int_equal(kvf_batch_wait(b, TIMEOUT), KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(kvf_batch_op_status(b, 0, &bytes), KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(kvf_batch_op_status(b, 1, &bytes), KVF_ERR_OUT_OF_BOUNDS);
    kvf_batch_destroy(b);
    check_pool(f, R_HOST);
    check_pool(f, L_GPU);
    batch(f, KVF_OP_WRITE, 64, 1, 0);
}

/* A GPU region of the target is not served over ucx. */
static void test_remote_gpu_refused(void **state)
{
    fixture_t *f = *state;
    kvf_region_h reg;
    kvf_op_t op;
    char *gpu;

    assert_int_equal(
        kvf_cuda_mem_alloc(KVF_MEM_CUDA, 0, 1u << 20, (void **)&gpu), KVF_OK);
    assert_int_equal(
        kvf_engine_reg(f->tgt, gpu, 1u << 20, KVF_MEM_CUDA, 0, &reg), KVF_OK);
    op = (kvf_op_t){KVF_OP_READ, f->base[L_HOST], f->peer,
                    (uint64_t)(uintptr_t)gpu, 8192};
    assert_int_equal(kvf_transfer_sync(f->ini, &op, 1, TIMEOUT),
                     KVF_ERR_UNSUPPORTED);
    assert_int_equal(kvf_engine_dereg(f->tgt, reg), KVF_OK);
    kvf_cuda_mem_free(KVF_MEM_CUDA, gpu);
    batch(f, KVF_OP_READ, 64, 0, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_blocks),
        cmocka_unit_test(test_gpu_and_host_blocks),
        cmocka_unit_test(test_out_of_range),
        cmocka_unit_test(test_remote_gpu_refused),
    };
    fixture_t probe = {0};

    if (kvf_cuda_device_count() == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    if (engines(&probe) != KVF_OK) {
        printf("no ucx transport: skipped\n");
        if (probe.tgt != NULL) {
            kvf_engine_destroy(probe.tgt);
        }
        return 77;
    }
    kvf_engine_destroy(probe.ini);
    kvf_engine_destroy(probe.tgt);
    return cmocka_run_group_tests(tests, setup, teardown);
}
