/*
 * GPU test (label gpu): GPU regions reached over tcp on 127.0.0.1. A
 * target engine serves a GPU pool and a host pool; an initiator engine in
 * the same process registers its own GPU pool and host pool, and moves
 * random blocks every way (local GPU <-> remote GPU, local host <->
 * remote GPU, local GPU <-> remote host), 8 KiB ones and odd sizes at
 * unaligned addresses, batches large enough to cycle every staging slot.
 * A host-side model of all four pools is updated with each batch and
 * compared byte for byte with the pools afterwards; remote checksums of
 * GPU ranges are compared with the model; out-of-range GPU addresses are
 * refused while the target keeps serving; the link test runs into GPU
 * memory; nothing leaks. Exits 77 without a GPU.
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

enum { L_GPU, L_HOST, R_GPU, R_HOST, NPOOLS };

typedef struct {
    kvf_engine_h tgt, ini;
    kvf_region_h reg[NPOOLS];
    kvf_peer_h peer;
    char *base[NPOOLS];
    unsigned char *model[NPOOLS];
    kvf_rng_t rng;
    long blocks0, bytes0;
} fixture_t;

static int is_gpu(int p)
{
    return p == L_GPU || p == R_GPU;
}

/* The engine pool p belongs to. */
static kvf_engine_h engine_of(const fixture_t *f, int p)
{
    return (p == L_GPU || p == L_HOST) ? f->ini : f->tgt;
}

static int setup(void **state)
{
    kvf_engine_params_t p = {0};
    fixture_t *f = calloc(1, sizeof(*f));
    int i, rdev = kvf_cuda_device_count() > 1 ? 1 : 0;

    kvf_alloc_stats(&f->blocks0, &f->bytes0);
    p.field_mask = KVF_ENGINE_PARAM_LISTEN | KVF_ENGINE_PARAM_TRANSPORTS |
                   KVF_ENGINE_PARAM_TIMEOUT;
    p.listen = "127.0.0.1:0";
    p.transports = "tcp";
    p.timeout_ms = TIMEOUT;
    assert_int_equal(kvf_engine_create(&p, &f->tgt), KVF_OK);
    memset(&p, 0, sizeof(p));
    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_CONNS |
                   KVF_ENGINE_PARAM_TIMEOUT | KVF_ENGINE_PARAM_TRANSPORTS;
    p.no_listen = 1;
    p.conns = 3;
    p.timeout_ms = TIMEOUT;
    p.transports = "tcp";
    assert_int_equal(kvf_engine_create(&p, &f->ini), KVF_OK);
    kvf_rng_seed(&f->rng, 1234);
    for (i = 0; i < NPOOLS; i++) {
        pool_model_open(engine_of(f, i), is_gpu(i), i == R_GPU ? rdev : 0, POOL,
                        &f->rng, &f->base[i], &f->model[i], &f->reg[i]);
    }
    assert_int_equal(
        kvf_peer_open(f->ini, kvf_engine_segment_name(f->tgt), &f->peer),
        KVF_OK);
    assert_string_equal(kvf_peer_transport(f->peer), "tcp");
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
        pool_model_close(engine_of(f, i), is_gpu(i), f->base[i], f->model[i],
                         f->reg[i]);
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
 * One batch of n blocks between local pool lp and remote pool rp, type
 * op. mode 0: 8 KiB aligned; 1: odd sizes at unaligned offsets. Blocks
 * take distinct slots on each side so they never overlap.
 */
static void batch(fixture_t *f, kvf_op_type_t op, int lp, int rp, size_t n,
                  int mode)
{
    uint64_t slot = POOL / n, i, *ls = pool_model_shuffled(&f->rng, n);
    uint64_t *rs = pool_model_shuffled(&f->rng, n);
    kvf_op_t *ops = calloc(n, sizeof(*ops));
    uint64_t rbase = (uint64_t)(uintptr_t)f->base[rp];

    for (i = 0; i < n; i++) {
        uint64_t len = 8192, lo = ls[i] * slot, ro = rs[i] * slot;

        if (mode == 1 || slot < 8192) {
            len = 1 + kvf_rng_below(&f->rng, slot / 2);
            lo += kvf_rng_below(&f->rng, slot - len);
            ro += kvf_rng_below(&f->rng, slot - len);
        }
        ops[i].type = op;
        ops[i].local = f->base[lp] + lo;
        ops[i].peer = f->peer;
        ops[i].remote = rbase + ro;
        ops[i].length = len;
        if (op == KVF_OP_READ) {
            memcpy(f->model[lp] + lo, f->model[rp] + ro, len);
        } else {
            memcpy(f->model[rp] + ro, f->model[lp] + lo, len);
        }
    }
    assert_int_equal(kvf_transfer_sync(f->ini, ops, n, TIMEOUT), KVF_OK);
    check_pool(f, lp);
    check_pool(f, rp);
    /* the target's checksums of remote ranges agree with the model */
    pool_model_check_sums(f->peer, ops, n, f->model[rp], rbase);
    free(ls);
    free(rs);
    free(ops);
}

static void test_gpu_to_gpu(void **state)
{
    fixture_t *f = *state;

    batch(f, KVF_OP_READ, L_GPU, R_GPU, 2048, 0); /* 16 MiB: every slot */
    batch(f, KVF_OP_WRITE, L_GPU, R_GPU, 2048, 0);
    batch(f, KVF_OP_READ, L_GPU, R_GPU, 1500, 1);
    batch(f, KVF_OP_WRITE, L_GPU, R_GPU, 1500, 1);
    batch(f, KVF_OP_WRITE, L_GPU, R_GPU, 3, 1); /* blocks of MiBs */
    batch(f, KVF_OP_READ, L_GPU, R_GPU, 3, 1);
}

static void test_host_and_gpu(void **state)
{
    fixture_t *f = *state;

    batch(f, KVF_OP_WRITE, L_HOST, R_GPU, 1000, 0);
    batch(f, KVF_OP_READ, L_HOST, R_GPU, 1000, 1);
    batch(f, KVF_OP_WRITE, L_GPU, R_HOST, 1000, 1);
    batch(f, KVF_OP_READ, L_GPU, R_HOST, 1000, 0);
    batch(f, KVF_OP_READ, L_HOST, R_HOST, 500, 1);
}

/* Out-of-range GPU addresses are refused; the target keeps serving. */
static void test_out_of_range(void **state)
{
    fixture_t *f = *state;
    uint64_t rbase = (uint64_t)(uintptr_t)f->base[R_GPU];
    kvf_op_t ops[3];
    kvf_batch_h b;
    size_t bytes;

    memset(ops, 0, sizeof(ops));
    ops[0] = (kvf_op_t){KVF_OP_WRITE, f->base[L_GPU], f->peer,
                        rbase + POOL - 100, 200};
    ops[1] = (kvf_op_t){KVF_OP_READ, f->base[L_GPU], f->peer, rbase + POOL, 1};
    ops[2] = (kvf_op_t){KVF_OP_READ, f->base[L_GPU] + 8192, f->peer,
                        rbase - 4096, 4096};
    assert_int_equal(kvf_batch_submit(f->ini, ops, 3, &b), KVF_OK);
    assert_int_not_equal(kvf_batch_wait(b, TIMEOUT), KVF_OK);
    assert_int_equal(kvf_batch_op_status(b, 0, &bytes), KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(kvf_batch_op_status(b, 1, &bytes), KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(kvf_batch_op_status(b, 2, &bytes), KVF_ERR_OUT_OF_BOUNDS);
    kvf_batch_destroy(b);
    check_pool(f, R_GPU);
    check_pool(f, L_GPU);
    batch(f, KVF_OP_WRITE, L_GPU, R_GPU, 64, 1);
}

/* The raw link test reads and writes GPU memory on the target. */
static void test_link_into_gpu(void **state)
{
    fixture_t *f = *state;
    uint64_t rbase = (uint64_t)(uintptr_t)f->base[R_GPU];
    double secs = 0;

    assert_int_equal(kvf_peer_link_test(f->peer, KVF_OP_WRITE, f->base[L_HOST],
                                        rbase, 8u << 20, &secs),
                     KVF_OK);
    assert_true(secs > 0);
    memcpy(f->model[R_GPU], f->model[L_HOST], 8u << 20);
    check_pool(f, R_GPU);
    assert_int_equal(kvf_peer_link_test(f->peer, KVF_OP_READ,
                                        f->base[L_HOST] + (8u << 20),
                                        rbase + (4u << 20), 8u << 20, &secs),
                     KVF_OK);
    memcpy(f->model[L_HOST] + (8u << 20), f->model[R_GPU] + (4u << 20),
           8u << 20);
    check_pool(f, L_HOST);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_to_gpu),
        cmocka_unit_test(test_host_and_gpu),
        cmocka_unit_test(test_out_of_range),
        cmocka_unit_test(test_link_into_gpu),
    };

    if (kvf_cuda_device_count() == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    return cmocka_run_group_tests(tests, setup, teardown);
}
