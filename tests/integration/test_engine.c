/*
 * Integration test of the transfer engine over tcp with real processes on
 * 127.0.0.1: a `kvferry target` child serves a seeded pool; this process
 * READs and WRITEs random blocks and verifies them byte for byte, then
 * odd sizes and unaligned addresses, splitting and coalescing, refused
 * out-of-bounds accesses (the target keeps serving; operations ending
 * exactly at a region's end or one byte past it, over tcp and over
 * shm), threads submitting
 * at once, cancel, and that engine destroy returns every allocation and
 * file descriptor.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <kvferry/kvferry.h>
#include <kvferry/perf.h>

#include "core/checksum.h"
#include "core/rng.h"

#include "engine_cases.h"

static int setup_on(void **state, const char *transport)
{
    kvf_engine_params_t p = {0};
    fixture_t *f = calloc(1, sizeof(*f));

    kvf_alloc_stats(&f->blocks0, &f->bytes0);
    f->fds0 = kvf_test_fd_count();
    /* the target serves both (ctest sets KVF_TRANSPORTS=tcp) */
    assert_int_equal(
        kvf_test_target_start(&f->t, POOL, SEED, "--transports", "tcp,shm"), 0);
    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_CONNS |
                   KVF_ENGINE_PARAM_TIMEOUT | KVF_ENGINE_PARAM_TRANSPORTS;
    p.no_listen = 1;
    p.conns = 3;
    p.timeout_ms = 3000;
    p.transports = transport;
    assert_int_equal(kvf_engine_create(&p, &f->e), KVF_OK);
    fixture_open(f, transport);
    *state = f;
    return 0;
}

static int setup(void **state)
{
    return setup_on(state, "tcp");
}

/* The same target reached over shared memory (bounds on every path). */
static int setup_shm(void **state)
{
    return setup_on(state, "shm");
}

/* every allocation and file descriptor is returned */
static int teardown(void **state)
{
    fixture_close(*state, 1);
    return 0;
}

static void test_split_and_coalesce(void **state)
{
    fixture_t *f = *state;
    kvf_engine_stats_t s0, s1;
    kvf_op_t ops[512];
    uint32_t i;

    /* one 20 MiB operation is split into many requests */
    kvf_engine_stats(f->e, &s0);
    ops[0] = (kvf_op_t){KVF_OP_READ, f->local, f->peer, f->t.pool_addr + 4096,
                        20u << 20};
    run_ops(f, ops, 1);
    kvf_engine_stats(f->e, &s1);
    assert_true(s1.requests - s0.requests >= 20);
    assert_memory_equal(f->local, f->expect + 4096, 20u << 20);
    /* 512 adjacent 4 KiB operations travel as few wire entries */
    kvf_engine_stats(f->e, &s0);
    for (i = 0; i < 512; i++) {
        ops[i] =
            (kvf_op_t){KVF_OP_READ, f->local + (size_t)i * 4096, f->peer,
                       f->t.pool_addr + (1u << 20) + (uint64_t)i * 4096, 4096};
    }
    run_ops(f, ops, 512);
    kvf_engine_stats(f->e, &s1);
    assert_true(s1.segments - s0.segments == 512);
    assert_true(s1.wire_entries - s0.wire_entries <= 4);
    assert_true(s1.wire_iovs - s0.wire_iovs <= 4);
    assert_memory_equal(f->local, f->expect + (1u << 20), 512 * 4096);
}

static void test_cancel(void **state)
{
    fixture_t *f = *state;
    const size_t n = 4096;
    kvf_op_t *ops = calloc(n, sizeof(*ops));
    kvf_status_t st;
    kvf_batch_h b;
    size_t i, bytes, done = 0, canceled = 0;

    for (i = 0; i < n; i++) {
        ops[i] = (kvf_op_t){KVF_OP_READ, f->local + i * 8192, f->peer,
                            f->t.pool_addr + ((i * 7919) % n) * 8192, 8192};
    }
    assert_int_equal(kvf_batch_submit(f->e, ops, n, &b), KVF_OK);
    kvf_batch_cancel(b);
    st = kvf_batch_wait(b, TIMEOUT);
    assert_true(st == KVF_OK || st == KVF_ERR_CANCELED);
    for (i = 0; i < n; i++) {
        st = kvf_batch_op_status(b, i, &bytes);
        if (st == KVF_OK) {
            assert_int_equal(bytes, 8192);
            assert_memory_equal(ops[i].local,
                                f->expect + (ops[i].remote - f->t.pool_addr),
                                8192);
            done++;
        } else {
            assert_int_equal(st, KVF_ERR_CANCELED);
            canceled++;
        }
    }
    assert_int_equal(done + canceled, n);
    kvf_batch_destroy(b);
    free(ops);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_read_random_blocks, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_write_then_read_back, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_odd_sizes_unaligned, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_split_and_coalesce, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_out_of_bounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_edge_bounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_bounds, setup_shm,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_edge_bounds, setup_shm, teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
