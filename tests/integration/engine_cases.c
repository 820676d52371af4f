/*
 * The engine cases shared by the tcp and ucx integration tests (see
 * engine_cases.h): random blocks, write and read back, odd sizes,
 * refused out-of-bounds accesses, threads submitting at once.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <kvferry/perf.h>

#include "engine_cases.h"

#include "core/checksum.h"

void fixture_open(fixture_t *f, const char *transport)
{
    f->local = malloc(POOL);
    f->expect = malloc(POOL);
    kvf_test_pool_bytes(f->expect, POOL, SEED);
    kvf_test_pool_bytes(f->local, POOL, 99);
    assert_int_equal(
        kvf_engine_reg(f->e, f->local, POOL, KVF_MEM_HOST, 0, &f->r), KVF_OK);
    assert_int_equal(kvf_peer_open(f->e, f->t.segment, &f->peer), KVF_OK);
    assert_string_equal(kvf_peer_transport(f->peer), transport);
}

void fixture_close(fixture_t *f, int check_fds)
{
    long blocks, bytes;

    if (f->peer != NULL) {
        kvf_peer_close(f->peer);
    }
    assert_int_equal(kvf_engine_dereg(f->e, f->r), KVF_OK);
    kvf_engine_destroy(f->e);
    kvf_alloc_stats(&blocks, &bytes);
    assert_int_equal(blocks, f->blocks0);
    assert_int_equal(bytes, f->bytes0);
    if (check_fds) {
        assert_int_equal(kvf_test_fd_count(), f->fds0 + 0);
    }
    if (f->t.pid > 0) {
        assert_int_equal(kvf_test_target_stop(&f->t), 0);
    }
    free(f->local);
    free(f->expect);
    free(f);
}

void run_ops(fixture_t *f, kvf_op_t *ops, size_t n)
{
    kvf_batch_h b;
    size_t i, bytes;

    assert_int_equal(kvf_batch_submit(f->e, ops, n, &b), KVF_OK);
    assert_int_equal(kvf_batch_wait(b, TIMEOUT), KVF_OK);
    for (i = 0; i < n; i++) {
        assert_int_equal(kvf_batch_op_status(b, i, &bytes), KVF_OK);
        assert_int_equal(bytes, ops[i].length);
    }
    kvf_batch_destroy(b);
}

void test_read_random_blocks(void **state)
{
    fixture_t *f = *state;
    const uint32_t bs = 8192, n = 2048, slots = POOL / bs;
    kvf_op_t *ops = calloc(n, sizeof(*ops));
    uint32_t *lp, *rp, i;
    kvf_rng_t rng;

    kvf_rng_seed(&rng, 1);
    lp = kvf_test_pick(&rng, slots, n);
    rp = kvf_test_pick(&rng, slots, n);
    for (i = 0; i < n; i++) {
        ops[i] = (kvf_op_t){KVF_OP_READ, f->local + (size_t)lp[i] * bs, f->peer,
                            f->t.pool_addr + (uint64_t)rp[i] * bs, bs};
    }
    run_ops(f, ops, n);
    for (i = 0; i < n; i++) {
        assert_memory_equal(f->local + (size_t)lp[i] * bs,
                            f->expect + (size_t)rp[i] * bs, bs);
    }
    free(lp);
    free(rp);
    free(ops);
}

void test_write_then_read_back(void **state)
{
    fixture_t *f = *state;
    const uint32_t bs = 8192, n = 1024, slots = POOL / bs;
    kvf_op_t *ops = calloc(n, sizeof(*ops));
    uint64_t *rem = calloc(n, sizeof(*rem)), *sums = calloc(n, 8);
    size_t *lens = calloc(n, sizeof(*lens));
    unsigned char *back = malloc((size_t)n * bs);
    uint32_t *lp, *rp, i;
    kvf_rng_t rng;

    kvf_rng_seed(&rng, 2);
    kvf_rng_fill(&rng, f->local, POOL / 2);
    lp = kvf_test_pick(&rng, slots / 2, n);
    rp = kvf_test_pick(&rng, slots, n);
    for (i = 0; i < n; i++) {
        ops[i] = (kvf_op_t){KVF_OP_WRITE, f->local + (size_t)lp[i] * bs,
                            f->peer, f->t.pool_addr + (uint64_t)rp[i] * bs, bs};
        rem[i] = ops[i].remote;
        lens[i] = bs;
    }
    run_ops(f, ops, n);
    /* remote checksums match the local blocks */
    assert_int_equal(kvf_peer_checksum(f->peer, rem, lens, n, sums), KVF_OK);
    for (i = 0; i < n; i++) {
        assert_true(sums[i] == kvf_checksum(f->local + (size_t)lp[i] * bs, bs));
        memcpy(f->expect + (size_t)rp[i] * bs, f->local + (size_t)lp[i] * bs,
               bs);
    }
    /* and read back byte for byte into the upper half */
    for (i = 0; i < n; i++) {
        ops[i].type = KVF_OP_READ;
        ops[i].local = f->local + POOL / 2 + (size_t)i * bs;
    }
    run_ops(f, ops, n);
    for (i = 0; i < n; i++) {
        assert_memory_equal(f->local + POOL / 2 + (size_t)i * bs,
                            f->expect + (size_t)rp[i] * bs, bs);
    }
    free(back);
    free(lp);
    free(rp);
    free(ops);
    free(rem);
    free(sums);
    free(lens);
}

void test_odd_sizes_unaligned(void **state)
{
    fixture_t *f = *state;
    const uint32_t n = 600;
    kvf_op_t ops[600];
    uint64_t roff = 3, loff = 1;
    kvf_rng_t rng;
    uint32_t i;

    kvf_rng_seed(&rng, 3);
    for (i = 0; i < n; i++) {
        size_t len = 1 + kvf_rng_below(&rng, 20000);

        ops[i] = (kvf_op_t){KVF_OP_READ, f->local + loff, f->peer,
                            f->t.pool_addr + roff, len};
        loff += len + kvf_rng_below(&rng, 3);
        roff += len + 1 + kvf_rng_below(&rng, 5);
    }
    assert_true(roff < POOL && loff < POOL);
    run_ops(f, ops, n);
    for (i = 0; i < n; i++) {
        assert_memory_equal(ops[i].local,
                            f->expect + (ops[i].remote - f->t.pool_addr),
                            ops[i].length);
    }
}

void test_out_of_bounds(void **state)
{
    fixture_t *f = *state;
    kvf_op_t ops[5];
    kvf_batch_h b;
    size_t bytes;
    static char unreg[64];

    memset(f->local, 0x5a, 4 * 8192);
    ops[0] = (kvf_op_t){KVF_OP_READ, f->local, f->peer, f->t.pool_addr, 8192};
    /* past the end of the pool */
    ops[1] = (kvf_op_t){KVF_OP_READ, f->local + 8192, f->peer,
                        f->t.pool_addr + POOL - 100, 8192};
    /* an address the target never registered */
    ops[2] = (kvf_op_t){KVF_OP_WRITE, f->local + 16384, f->peer, 4096, 8192};
    ops[3] = (kvf_op_t){KVF_OP_READ, f->local + 24576, f->peer,
                        f->t.pool_addr + 8192, 8192};
    /* local memory that is not registered */
    ops[4] = (kvf_op_t){KVF_OP_READ, unreg, f->peer, f->t.pool_addr, 64};
    assert_int_equal(kvf_batch_submit(f->e, ops, 5, &b), KVF_OK);
    assert_int_equal(kvf_batch_wait(b, TIMEOUT), KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(kvf_batch_op_status(b, 0, &bytes), KVF_OK);
    assert_int_equal(bytes, 8192);
    assert_int_equal(kvf_batch_op_status(b, 1, &bytes), KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(bytes, 0);
    assert_int_equal(kvf_batch_op_status(b, 2, &bytes), KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(kvf_batch_op_status(b, 3, &bytes), KVF_OK);
    assert_int_equal(kvf_batch_op_status(b, 4, &bytes), KVF_ERR_NOT_REGISTERED);
    kvf_batch_destroy(b);
    assert_memory_equal(f->local, f->expect, 8192);
    assert_memory_equal(f->local + 24576, f->expect + 8192, 8192);
    /* the refused READ wrote nothing locally */
    assert_int_equal(f->local[8192], 0x5a);
    assert_int_equal(f->local[8192 + 8191], 0x5a);
    /* and the target keeps serving */
    ops[0].local = f->local + 8192;
    run_ops(f, ops, 1);
    assert_memory_equal(f->local + 8192, f->expect, 8192);
}

/* One operation; its status, and *bytes_p. */
static kvf_status_t one_op(fixture_t *f, kvf_op_type_t type, size_t loff,
                           uint64_t remote, size_t len, size_t *bytes_p)
{
    kvf_op_t op = {type, f->local + loff, f->peer, remote, len};
    kvf_status_t st;
    kvf_batch_h b;

    assert_int_equal(kvf_batch_submit(f->e, &op, 1, &b), KVF_OK);
    kvf_batch_wait(b, TIMEOUT);
    st = kvf_batch_op_status(b, 0, bytes_p);
    kvf_batch_destroy(b);
    return st;
}

void test_edge_bounds(void **state)
{
    fixture_t *f = *state;
    const uint64_t end = f->t.pool_addr + POOL;
    size_t bytes;

    /* ending exactly at the end of the pool: served */
    memset(f->local, 0x5a, 3 * 4096);
    assert_int_equal(one_op(f, KVF_OP_READ, 0, end - 4096, 4096, &bytes),
                     KVF_OK);
    assert_int_equal(bytes, 4096);
    assert_memory_equal(f->local, f->expect + POOL - 4096, 4096);
    /* ending one byte past it: refused, nothing read */
    assert_int_equal(one_op(f, KVF_OP_READ, 4096, end - 4095, 4096, &bytes),
                     KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(bytes, 0);
    assert_int_equal(f->local[4096], 0x5a);
    assert_int_equal(f->local[2 * 4096 - 1], 0x5a);
    /* one byte at the end, and one byte before the start */
    assert_int_equal(one_op(f, KVF_OP_READ, 4096, end, 1, &bytes),
                     KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(
        one_op(f, KVF_OP_READ, 4096, f->t.pool_addr - 1, 4096, &bytes),
        KVF_ERR_OUT_OF_BOUNDS);
    /* a WRITE one byte past: refused, the pool unchanged */
    memset(f->local + 2 * 4096, 0xee, 4096);
    assert_int_equal(
        one_op(f, KVF_OP_WRITE, 2 * 4096, end - 4095, 4096, &bytes),
        KVF_ERR_OUT_OF_BOUNDS);
    assert_int_equal(one_op(f, KVF_OP_READ, 0, end - 4096, 4096, &bytes),
                     KVF_OK);
    assert_memory_equal(f->local, f->expect + POOL - 4096, 4096);
    /* a WRITE ending exactly at the end: served (the same bytes back) */
    memcpy(f->local + 2 * 4096, f->expect + POOL - 4096, 4096);
    assert_int_equal(
        one_op(f, KVF_OP_WRITE, 2 * 4096, end - 4096, 4096, &bytes), KVF_OK);
    assert_int_equal(bytes, 4096);
}

typedef struct {
    fixture_t *f;
    int id;
    int ok;
} thread_arg_t;

static void *submit_thread(void *p)
{
    thread_arg_t *a = p;
    fixture_t *f = a->f;
    kvf_op_t ops[256];
    kvf_rng_t rng;
    int round, i;
    size_t off = (size_t)a->id * (POOL / 8);

    kvf_rng_seed(&rng, 100 + (uint64_t)a->id);
    a->ok = 1;
    for (round = 0; round < 10; round++) {
        for (i = 0; i < 256; i++) {
            uint64_t r = kvf_rng_below(&rng, POOL / 4096) * 4096;

            ops[i] = (kvf_op_t){KVF_OP_READ, f->local + off + (size_t)i * 4096,
                                f->peer, f->t.pool_addr + r, 4096};
        }
        if (kvf_transfer_sync(f->e, ops, 256, TIMEOUT) != KVF_OK) {
            a->ok = 0;
            return NULL;
        }
        for (i = 0; i < 256; i++) {
            if (memcmp(ops[i].local,
                       f->expect + (ops[i].remote - f->t.pool_addr),
                       4096) != 0) {
                a->ok = 0;
            }
        }
    }
    return NULL;
}

void test_threads(void **state)
{
    fixture_t *f = *state;
    pthread_t th[6];
    thread_arg_t args[6];
    int i;

    for (i = 0; i < 6; i++) {
        args[i] = (thread_arg_t){f, i, 0};
        pthread_create(&th[i], NULL, submit_thread, &args[i]);
    }
    for (i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        assert_true(args[i].ok);
    }
}
