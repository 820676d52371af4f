/*
 * Unit test of the master's pool allocator (store/master/pool_alloc.c):
 * blocks never overlap and stay inside the pool, used bytes add up, a
 * freed block merges with its free neighbours (freeing everything leaves
 * one block of the whole pool), small requests take small holes and leave
 * large ones intact (good fit), exhaustion is a NULL not a crash, and a
 * long random alloc/free run keeps every invariant and leaks nothing;
 * a block taken at a given offset (a leader's rebuild) is exactly there,
 * and a range not wholly free is refused.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <kvferry/kvferry.h>

#include "core/rng.h"
#include "store/master/pool_alloc.h"

#include <stdlib.h>
#include <string.h>

#define KiB 1024ull
#define MiB (1024ull * 1024)

/* Walks the address list: contiguous cover of [0, len), sums match. */
static void check_invariants(const kvf_pool_alloc_t *pa)
{
    const kvf_pa_block_t *b, *prev = NULL;
    uint64_t off = 0, used = 0;
    size_t nb = 0, nf = 0;

    for (b = pa->head; b != NULL; prev = b, b = b->anext) {
        assert_ptr_equal(b->aprev, prev);
        assert_int_equal(b->off, off);
        assert_true(b->size > 0 && b->size % KVF_PA_GRANULE == 0);
        if (prev != NULL) {
            /* two free neighbours would mean a missed merge */
            assert_false(prev->free && b->free);
        }
        off += b->size;
        used += b->free ? 0 : b->size;
        nf += b->free != 0;
        nb++;
    }
    assert_int_equal(off, pa->len);
    assert_int_equal(used, pa->used);
    assert_int_equal(nb, pa->nblocks);
    assert_int_equal(nf, pa->nfree);
}

static void test_basic_and_coalesce(void **state)
{
    kvf_pool_alloc_t pa;
    kvf_pa_block_t *a, *b, *c;

    (void)state;
    assert_int_equal(kvf_pa_init(&pa, 10 * MiB + 13), KVF_OK);
    assert_int_equal(pa.len, 10 * MiB);
    a = kvf_pa_alloc(&pa, 1);
    b = kvf_pa_alloc(&pa, 100000);
    c = kvf_pa_alloc(&pa, 0);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_int_equal(a->size, KVF_PA_GRANULE);
    assert_true(b->size >= 100000 && b->size < 100000 + KVF_PA_GRANULE);
    assert_int_equal(c->size, KVF_PA_GRANULE);
    check_invariants(&pa);
    assert_null(kvf_pa_alloc(&pa, 11 * MiB));
    kvf_pa_free(&pa, b);
    check_invariants(&pa);
    kvf_pa_free(&pa, a);
    check_invariants(&pa);
    kvf_pa_free(&pa, c);
    check_invariants(&pa);
    assert_int_equal(pa.nblocks, 1);
    assert_int_equal(pa.used, 0);
    assert_int_equal(kvf_pa_largest_free(&pa), 10 * MiB);
    /* the whole pool in one block, then nothing */
    a = kvf_pa_alloc(&pa, 10 * MiB);
    assert_non_null(a);
    assert_null(kvf_pa_alloc(&pa, 1));
    kvf_pa_free(&pa, a);
    kvf_pa_fini(&pa);
}

static void test_good_fit(void **state)
{
    kvf_pa_block_t *blk[8], *x;
    kvf_pool_alloc_t pa;
    uint64_t big;
    int i;

    (void)state;
    assert_int_equal(kvf_pa_init(&pa, 8 * MiB), KVF_OK);
    /* holes of 64 KiB and 1 MiB, separated by live blocks */
    blk[0] = kvf_pa_alloc(&pa, 64 * KiB);
    blk[1] = kvf_pa_alloc(&pa, 4 * KiB);
    blk[2] = kvf_pa_alloc(&pa, 1 * MiB);
    blk[3] = kvf_pa_alloc(&pa, 4 * KiB);
    for (i = 0; i < 4; i++) {
        assert_non_null(blk[i]);
    }
    kvf_pa_free(&pa, blk[0]);
    kvf_pa_free(&pa, blk[2]);
    check_invariants(&pa);
    big = kvf_pa_largest_free(&pa);
    /* 60 KiB goes into the 64 KiB hole, not the 1 MiB one or the tail */
    x = kvf_pa_alloc(&pa, 60 * KiB);
    assert_non_null(x);
    assert_int_equal(x->off, 0);
    assert_int_equal(kvf_pa_largest_free(&pa), big);
    /* 1000 KiB goes into the 1 MiB hole */
    blk[4] = kvf_pa_alloc(&pa, 1000 * KiB);
    assert_non_null(blk[4]);
    assert_int_equal(blk[4]->off, blk[1]->off + blk[1]->size);
    check_invariants(&pa);
    kvf_pa_fini(&pa);
}

static void test_alloc_at(void **state)
{
    kvf_pool_alloc_t pa;
    kvf_pa_block_t *a, *b, *c, *f;

    (void)state;
    assert_int_equal(kvf_pa_init(&pa, 1 * MiB), KVF_OK);
    a = kvf_pa_alloc_at(&pa, NULL, 4 * KiB, 100);
    assert_non_null(a);
    assert_int_equal(a->off, 4 * KiB);
    assert_int_equal(a->size, 128);
    check_invariants(&pa);
    b = kvf_pa_alloc_at(&pa, a, 64 * KiB, 8 * KiB);
    assert_non_null(b);
    assert_int_equal(b->off, 64 * KiB);
    check_invariants(&pa);
    /* overlapping a live block, unaligned, past the end: refused */
    assert_null(kvf_pa_alloc_at(&pa, NULL, 4 * KiB + 64, 64));
    assert_null(kvf_pa_alloc_at(&pa, NULL, 60 * KiB, 8 * KiB));
    assert_null(kvf_pa_alloc_at(&pa, NULL, 100, 64));
    assert_null(kvf_pa_alloc_at(&pa, NULL, 1 * MiB - 64, 128));
    assert_null(kvf_pa_alloc_at(&pa, NULL, UINT64_MAX - 63, 128));
    /* the very start, adjacent to nothing; the very end */
    c = kvf_pa_alloc_at(&pa, NULL, 0, 64);
    assert_non_null(c);
    f = kvf_pa_alloc_at(&pa, b, 1 * MiB - 64, 64);
    assert_non_null(f);
    assert_int_equal(pa.used, 128 + 8 * KiB + 64 + 64);
    check_invariants(&pa);
    /* the rebuilt blocks free and merge like any other */
    kvf_pa_free(&pa, a);
    kvf_pa_free(&pa, b);
    kvf_pa_free(&pa, c);
    kvf_pa_free(&pa, f);
    check_invariants(&pa);
    assert_int_equal(pa.nblocks, 1);
    assert_int_equal(pa.used, 0);
    kvf_pa_fini(&pa);
}

static void test_random_run(void **state)
{
    enum { SLOTS = 512, STEPS = 200000 };
    kvf_pa_block_t *live[SLOTS] = {NULL};
    long blocks0, bytes0, blocks1, bytes1;
    uint64_t sizes[] = {64, 4 * KiB, 8 * KiB, 64 * KiB, 100 * KiB, MiB};
    kvf_pool_alloc_t pa;
    kvf_rng_t rng;
    size_t fails = 0;
    int i, k;

    (void)state;
    kvf_alloc_stats(&blocks0, &bytes0);
    kvf_rng_seed(&rng, 5);
    assert_int_equal(kvf_pa_init(&pa, 64 * MiB), KVF_OK);
    for (i = 0; i < STEPS; i++) {
        k = (int)kvf_rng_below(&rng, SLOTS);
        if (live[k] != NULL) {
            kvf_pa_free(&pa, live[k]);
            live[k] = NULL;
        } else {
            uint64_t sz =
                sizes[kvf_rng_below(&rng, 6)] + kvf_rng_below(&rng, 4096);

            live[k] = kvf_pa_alloc(&pa, sz);
            if (live[k] == NULL) {
                fails++;
                /* refused only when no free block is large enough */
                assert_true(kvf_pa_largest_free(&pa) < sz);
            } else {
                assert_true(live[k]->size >= sz);
                assert_true(live[k]->off + live[k]->size <= pa.len);
            }
        }
        if (i % 10000 == 0) {
            check_invariants(&pa);
        }
    }
    check_invariants(&pa);
    for (k = 0; k < SLOTS; k++) {
        kvf_pa_free(&pa, live[k]);
    }
    check_invariants(&pa);
    assert_int_equal(pa.nblocks, 1);
    kvf_pa_fini(&pa);
    kvf_alloc_stats(&blocks1, &bytes1);
    assert_int_equal(blocks1, blocks0);
    assert_int_equal(bytes1, bytes0);
    (void)fails;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic_and_coalesce),
        cmocka_unit_test(test_good_fit),
        cmocka_unit_test(test_random_run),
        cmocka_unit_test(test_alloc_at),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
