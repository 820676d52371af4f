/*
 * Integration test of the fault transport wrapper (transport/fault/):
 * two engines of this process talk over tcp on 127.0.0.1, the
 * initiator's peer wrapped through KVF_FAULT. Each fault mode gives the
 * status it promises within the engine timeout (delay: late but right;
 * drop: KVF_ERR_TIMEOUT at the timeout, the buffer untouched; fail_after:
 * KVF_ERR_IO at once after N; reset_after: KVF_ERR_CONN_RESET for the
 * Nth and for what was in flight, then service again); every operation
 * that succeeds moved the right bytes; a seeded drop pattern repeats
 * exactly in another process; bad specs are refused; nothing leaks.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kvferry/kvferry.h>
#include <kvferry/perf.h>

#include "core/rng.h"
#include "core/time.h"
#include "transport/fault/fault.h"

#define POOL    (4u << 20)
#define BLOCK   8192
#define TIMEOUT 1000 /* engine timeout, ms: 60 ms delays fit on a busy host */

typedef struct fx {
    kvf_engine_h target, init;
    kvf_region_h treg, ireg;
    unsigned char *tpool, *ipool;
    kvf_peer_h peer;
    long blocks0, bytes0;
} fx_t;

static void fx_open(fx_t *x, const char *fault, unsigned chunk)
{
    kvf_engine_params_t p = {0};
    kvf_rng_t rng;

    memset(x, 0, sizeof(*x));
    kvf_alloc_stats(&x->blocks0, &x->bytes0);
    x->tpool = malloc(POOL);
    x->ipool = malloc(POOL);
    assert_non_null(x->tpool);
    assert_non_null(x->ipool);
    kvf_rng_seed(&rng, 5);
    kvf_rng_fill(&rng, x->tpool, POOL);
    memset(x->ipool, 0xAA, POOL);
    p.field_mask = KVF_ENGINE_PARAM_LISTEN | KVF_ENGINE_PARAM_TIMEOUT;
    p.listen = "127.0.0.1:0";
    p.timeout_ms = 3000;
    assert_int_equal(kvf_engine_create(&p, &x->target), KVF_OK);
    assert_int_equal(
        kvf_engine_reg(x->target, x->tpool, POOL, KVF_MEM_HOST, 0, &x->treg),
        KVF_OK);
    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_TIMEOUT |
                   KVF_ENGINE_PARAM_CONNS | KVF_ENGINE_PARAM_CHUNK;
    p.no_listen = 1;
    p.timeout_ms = TIMEOUT;
    p.conns = 2;
    p.chunk_bytes = chunk ? chunk : (1u << 20);
    assert_int_equal(kvf_engine_create(&p, &x->init), KVF_OK);
    assert_int_equal(
        kvf_engine_reg(x->init, x->ipool, POOL, KVF_MEM_HOST, 0, &x->ireg),
        KVF_OK);
    if (fault != NULL) {
        setenv("KVF_FAULT", fault, 1);
    } else {
        unsetenv("KVF_FAULT");
    }
    assert_int_equal(
        kvf_peer_open(x->init, kvf_engine_segment_name(x->target), &x->peer),
        KVF_OK);
    unsetenv("KVF_FAULT");
}

static void fx_close(fx_t *x)
{
    long blocks, bytes;

    kvf_peer_close(x->peer);
    assert_int_equal(kvf_engine_dereg(x->init, x->ireg), KVF_OK);
    assert_int_equal(kvf_engine_dereg(x->target, x->treg), KVF_OK);
    kvf_engine_destroy(x->init);
    kvf_engine_destroy(x->target);
    free(x->tpool);
    free(x->ipool);
    kvf_alloc_stats(&blocks, &bytes);
    assert_int_equal(blocks, x->blocks0);
    assert_int_equal(bytes, x->bytes0);
}

/* One READ of `len` bytes at block i; returns its status and elapsed ms.
 * On success the bytes must equal the target's; on failure the local
 * bytes must be untouched when `untouched` is set. */
static kvf_status_t fx_read(fx_t *x, size_t i, size_t len, int untouched,
                            uint64_t *ms_p)
{
    unsigned char *local = x->ipool + i * BLOCK;
    kvf_op_t op = {KVF_OP_READ, local, x->peer,
                   (uint64_t)(uintptr_t)(x->tpool + i * BLOCK), len};
    kvf_status_t st;
    uint64_t t0;

    memset(local, 0xAA, len);
    t0 = kvf_time_ms();
    st = kvf_transfer_sync(x->init, &op, 1, 5 * TIMEOUT);
    if (ms_p != NULL) {
        *ms_p = kvf_time_ms() - t0;
    }
    if (st == KVF_OK) {
        assert_memory_equal(local, x->tpool + i * BLOCK, len);
    } else if (untouched) {
        size_t k;

        for (k = 0; k < len; k++) {
            assert_int_equal(local[k], 0xAA);
        }
    }
    return st;
}

/* One WRITE of a fresh pattern to block i; checked on the target. */
static kvf_status_t fx_write(fx_t *x, size_t i, uint64_t seed)
{
    unsigned char *local = x->ipool + i * BLOCK;
    kvf_op_t op = {KVF_OP_WRITE, local, x->peer,
                   (uint64_t)(uintptr_t)(x->tpool + i * BLOCK), BLOCK};
    kvf_status_t st;
    kvf_rng_t rng;

    kvf_rng_seed(&rng, seed);
    kvf_rng_fill(&rng, local, BLOCK);
    st = kvf_transfer_sync(x->init, &op, 1, 5 * TIMEOUT);
    if (st == KVF_OK) {
        assert_memory_equal(local, x->tpool + i * BLOCK, BLOCK);
    }
    return st;
}

static void test_parse(void **state)
{
    kvf_fault_spec_t s;
    int active;

    (void)state;
    assert_int_equal(kvf_fault_parse("", &s, &active), KVF_OK);
    assert_int_equal(active, 0);
    assert_int_equal(kvf_fault_parse("off", &s, &active), KVF_OK);
    assert_int_equal(active, 0);
    assert_int_equal(kvf_fault_parse("seed=9,delay_ms=5,jitter_ms=2,"
                                     "drop=0.25,fail_after=100,"
                                     "reset_after=7",
                                     &s, &active),
                     KVF_OK);
    assert_int_equal(active, 1);
    assert_int_equal(s.seed, 9);
    assert_int_equal(s.delay_ms, 5);
    assert_int_equal(s.jitter_ms, 2);
    assert_true(s.drop > 0.249 && s.drop < 0.251);
    assert_int_equal(s.fail_after, 100);
    assert_int_equal(s.reset_after, 7);
    assert_int_equal(kvf_fault_parse("drop=1.5", &s, &active),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_fault_parse("drop=x", &s, &active),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_fault_parse("bogus=1", &s, &active),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_fault_parse("delay_ms=-3", &s, &active),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_fault_parse("seed", &s, &active),
                     KVF_ERR_INVALID_PARAM);
}

static void test_off_is_plain(void **state)
{
    fx_t x;

    (void)state;
    fx_open(&x, NULL, 0);
    /* no wrapper: the transport the engine chose (tcp, shm...) */
    assert_string_not_equal(kvf_peer_transport(x.peer), "fault");
    assert_int_equal(fx_read(&x, 3, BLOCK, 0, NULL), KVF_OK);
    assert_int_equal(fx_write(&x, 4, 11), KVF_OK);
    fx_close(&x);
}

static void test_delay(void **state)
{
    uint64_t ms;
    fx_t x;
    int i;

    (void)state;
    fx_open(&x, "seed=1,delay_ms=60", 0);
    assert_string_equal(kvf_peer_transport(x.peer), "fault");
    for (i = 0; i < 4; i++) {
        assert_int_equal(fx_read(&x, (size_t)i, BLOCK, 0, &ms), KVF_OK);
        assert_true(ms >= 59);
        assert_true(ms < TIMEOUT);
        assert_int_equal(fx_write(&x, (size_t)i + 10, (uint64_t)i), KVF_OK);
    }
    fx_close(&x);
}

static void test_drop_all(void **state)
{
    kvf_fault_stats_t s0, s1;
    uint64_t ms;
    fx_t x;
    int i;

    (void)state;
    kvf_fault_stats(&s0);
    fx_open(&x, "seed=3,drop=1", 0);
    for (i = 0; i < 3; i++) {
        assert_int_equal(fx_read(&x, (size_t)i, BLOCK, 1, &ms),
                         KVF_ERR_TIMEOUT);
        /* fails at the engine timeout, not before, not much after */
        assert_true(ms >= TIMEOUT - 5);
        assert_true(ms <= TIMEOUT + 250);
    }
    kvf_fault_stats(&s1);
    assert_int_equal(s1.dropped - s0.dropped, 3);
    assert_int_equal(s1.passed - s0.passed, 0);
    fx_close(&x);
}

static void test_fail_after(void **state)
{
    uint64_t remote, sum;
    size_t len = BLOCK;
    uint64_t ms;
    fx_t x;
    int i;

    (void)state;
    fx_open(&x, "fail_after=3", 0);
    for (i = 0; i < 3; i++) {
        assert_int_equal(fx_read(&x, (size_t)i, BLOCK, 0, NULL), KVF_OK);
    }
    for (i = 0; i < 5; i++) {
        assert_int_equal(fx_read(&x, (size_t)i + 20, BLOCK, 1, &ms),
                         KVF_ERR_IO);
        assert_true(ms < 100);
        assert_int_equal(fx_write(&x, (size_t)i + 40, 7), KVF_ERR_IO);
    }
    remote = (uint64_t)(uintptr_t)x.tpool;
    assert_int_equal(kvf_peer_checksum(x.peer, &remote, &len, 1, &sum),
                     KVF_ERR_IO);
    fx_close(&x);
}

static void test_reset(void **state)
{
    kvf_status_t st;
    kvf_op_t op;
    size_t i, n_ok = 0;
    fx_t x;

    (void)state;
    /* chunks of 64 KiB: a 1 MiB op is 16 requests in flight at once */
    fx_open(&x, "reset_after=5", 64u << 10);
    for (i = 1; i <= 12; i++) {
        st = fx_read(&x, i, BLOCK, 0, NULL);
        if (i % 5 == 0) {
            assert_int_equal(st, KVF_ERR_CONN_RESET);
        } else {
            assert_int_equal(st, KVF_OK);
        }
    }
    /* requests 13..28: the 15th resets; those in flight fail with it */
    memset(x.ipool, 0xAA, 1u << 20);
    op = (kvf_op_t){KVF_OP_READ, x.ipool, x.peer, (uint64_t)(uintptr_t)x.tpool,
                    1u << 20};
    assert_int_equal(kvf_transfer_sync(x.init, &op, 1, 5 * TIMEOUT),
                     KVF_ERR_CONN_RESET);
    /* service resumes after the reconnect, with the right bytes */
    for (i = 0; i < 8; i++) {
        st = (i % 2) ? fx_write(&x, 200 + i, i)
                     : fx_read(&x, 100 + i, BLOCK, 0, NULL);
        assert_true(st == KVF_OK || st == KVF_ERR_CONN_RESET);
        n_ok += (st == KVF_OK);
    }
    assert_true(n_ok >= 6);
    fx_close(&x);
}

/* Runs 32 reads with drop=0.3 and returns the mask of failures. */
static uint64_t drop_pattern(void)
{
    uint64_t mask = 0;
    kvf_status_t st;
    fx_t x;
    int i;

    fx_open(&x, "seed=7,drop=0.3", 0);
    for (i = 0; i < 32; i++) {
        st = fx_read(&x, (size_t)i, 512, 1, NULL);
        assert_true(st == KVF_OK || st == KVF_ERR_TIMEOUT);
        if (st != KVF_OK) {
            mask |= 1ull << i;
        }
    }
    fx_close(&x);
    return mask;
}

static void test_drop_reproducible(void **state)
{
    uint64_t masks[2];
    int fds[2][2], i, wst;
    pid_t pid[2];

    (void)state;
    /* the first wrapped ep of a fresh process, twice, side by side */
    for (i = 0; i < 2; i++) {
        assert_int_equal(pipe(fds[i]), 0);
        pid[i] = fork();
        assert_true(pid[i] >= 0);
        if (pid[i] == 0) {
            uint64_t m = drop_pattern();

            _exit(write(fds[i][1], &m, sizeof(m)) == sizeof(m) ? 0 : 1);
        }
        close(fds[i][1]);
    }
    for (i = 0; i < 2; i++) {
        assert_int_equal(read(fds[i][0], &masks[i], sizeof(masks[i])),
                         sizeof(masks[i]));
        close(fds[i][0]);
        assert_int_equal(waitpid(pid[i], &wst, 0), pid[i]);
        assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    }
    assert_true(masks[0] == masks[1]);
    /* about 30 % of 32 */
    assert_true(__builtin_popcountll(masks[0]) >= 3);
    assert_true(__builtin_popcountll(masks[0]) <= 18);
}

static void test_bad_spec_refused(void **state)
{
    kvf_engine_params_t p = {0};
    long blocks0, bytes0, blocks1, bytes1;
    kvf_engine_h target, init;
    kvf_peer_h peer;

    (void)state;
    kvf_alloc_stats(&blocks0, &bytes0);
    p.field_mask = KVF_ENGINE_PARAM_LISTEN;
    p.listen = "127.0.0.1:0";
    assert_int_equal(kvf_engine_create(&p, &target), KVF_OK);
    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_TIMEOUT;
    p.no_listen = 1;
    p.timeout_ms = TIMEOUT;
    assert_int_equal(kvf_engine_create(&p, &init), KVF_OK);
    setenv("KVF_FAULT", "drop=2", 1);
    assert_int_equal(
        kvf_peer_open(init, kvf_engine_segment_name(target), &peer),
        KVF_ERR_INVALID_PARAM);
    setenv("KVF_FAULT", "explode=1", 1);
    assert_int_equal(
        kvf_peer_open(init, kvf_engine_segment_name(target), &peer),
        KVF_ERR_INVALID_PARAM);
    unsetenv("KVF_FAULT");
    kvf_engine_destroy(init);
    kvf_engine_destroy(target);
    kvf_alloc_stats(&blocks1, &bytes1);
    assert_int_equal(blocks1, blocks0);
    assert_int_equal(bytes1, bytes0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_off_is_plain),
        cmocka_unit_test(test_delay),
        cmocka_unit_test(test_drop_all),
        cmocka_unit_test(test_fail_after),
        cmocka_unit_test(test_reset),
        cmocka_unit_test(test_drop_reproducible),
        cmocka_unit_test(test_bad_spec_refused),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
