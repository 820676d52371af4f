/*
 * Unit test: region registration and lookup (bounds at both ends,
 * overflow, overlap refused, deregistration), segment descriptor encoding
 * and decoding, truncated and corrupted descriptors refused, and that
 * nothing leaks (tracked allocator back to its baseline).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "engine/engine_int.h"

static kvf_engine_h new_engine(void)
{
    kvf_engine_params_t p = {0};
    kvf_engine_h e;

    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN;
    p.no_listen = 1;
    assert_int_equal(kvf_engine_create(&p, &e), KVF_OK);
    return e;
}

static void test_lookup_bounds(void **state)
{
    static char a[4096], b[100];
    long blocks0, bytes0, blocks1, bytes1;
    kvf_region_h ra, rb, rx;
    kvf_engine_h e;
    uint64_t A = (uint64_t)(uintptr_t)a, B = (uint64_t)(uintptr_t)b;

    (void)state;
    kvf_alloc_stats(&blocks0, &bytes0);
    e = new_engine();
    assert_int_equal(kvf_engine_reg(e, a, sizeof(a), KVF_MEM_HOST, 0, &ra),
                     KVF_OK);
    assert_int_equal(kvf_engine_reg(e, b, sizeof(b), KVF_MEM_HOST, 0, &rb),
                     KVF_OK);
    assert_ptr_equal(kvf_region_find(e, A, 4096), ra);
    assert_ptr_equal(kvf_region_find(e, A + 4095, 1), ra);
    assert_ptr_equal(kvf_region_find(e, A + 4096, 0), ra);
    assert_null(kvf_region_find(e, A + 4095, 2));
    assert_null(kvf_region_find(e, A - 1, 1));
    assert_null(kvf_region_find(e, A + 1, UINT64_MAX));
    assert_ptr_equal(kvf_region_find(e, B + 3, 97), rb);
    assert_null(kvf_region_find(e, B + 3, 98));
    assert_null(kvf_region_find(e, UINT64_MAX - 4, 8));
    /* overlapping registrations are refused */
    assert_int_equal(kvf_engine_reg(e, a + 100, 10, KVF_MEM_HOST, 0, &rx),
                     KVF_ERR_EXISTS);
    assert_int_equal(kvf_engine_reg(e, NULL, 10, KVF_MEM_HOST, 0, &rx),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_engine_reg(e, a, 0, KVF_MEM_HOST, 0, &rx),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_engine_dereg(e, ra), KVF_OK);
    assert_null(kvf_region_find(e, A, 1));
    assert_int_equal(kvf_engine_dereg(e, rb), KVF_OK);
    kvf_engine_destroy(e);
    kvf_alloc_stats(&blocks1, &bytes1);
    assert_int_equal(blocks1, blocks0);
    assert_int_equal(bytes1, bytes0);
}

static void test_large_registration_is_fast(void **state)
{
    /* 8 GiB of address space, never touched: registration records it */
    size_t len = 8ull << 30;
    void *p = (void *)(uintptr_t)0x100000000000ull;
    kvf_region_h r;
    kvf_engine_h e;

    (void)state;
    e = new_engine();
    assert_int_equal(kvf_engine_reg(e, p, len, KVF_MEM_HOST, 0, &r), KVF_OK);
    assert_ptr_equal(
        kvf_region_find(e, (uint64_t)(uintptr_t)p + len - 8192, 8192), r);
    assert_int_equal(kvf_engine_dereg(e, r), KVF_OK);
    kvf_engine_destroy(e);
}

static void test_descriptor(void **state)
{
    static char a[8192];
    kvf_seg_desc_t d;
    kvf_region_h r;
    kvf_engine_h e;
    kvf_rng_t rng;
    kvf_wr_t w;
    size_t cut, i;
    unsigned char *bad;

    (void)state;
    e = new_engine();
    assert_int_equal(kvf_engine_reg(e, a, sizeof(a), KVF_MEM_HOST, 0, &r),
                     KVF_OK);
    kvf_wr_init(&w);
    assert_int_equal(kvf_seg_desc_encode(e, &w), KVF_OK);
    assert_int_equal(kvf_seg_desc_decode(w.buf, w.len, &d), KVF_OK);
    assert_int_equal(d.nregions, 1);
    assert_true(d.regions[0].addr == (uint64_t)(uintptr_t)a);
    assert_true(d.regions[0].len == sizeof(a));
    assert_true(d.host_id == kvf_seg_host_id());
    assert_int_equal(d.ntl, 1);
    assert_string_equal(d.tl[0].name, "tcp");
    kvf_seg_desc_release(&d);
    /* every truncation is refused */
    for (cut = 0; cut < w.len; cut++) {
        assert_int_not_equal(kvf_seg_desc_decode(w.buf, cut, &d), KVF_OK);
        kvf_seg_desc_release(&d);
    }
    /* unknown version */
    w.buf[0] = 99;
    assert_int_equal(kvf_seg_desc_decode(w.buf, w.len, &d), KVF_ERR_VERSION);
    kvf_seg_desc_release(&d);
    w.buf[0] = 1;
    /* random corruption never crashes */
    bad = malloc(w.len);
    kvf_rng_seed(&rng, 3);
    for (i = 0; i < 2000; i++) {
        memcpy(bad, w.buf, w.len);
        bad[kvf_rng_below(&rng, w.len)] = (unsigned char)kvf_rng_next(&rng);
        (void)kvf_seg_desc_decode(bad, w.len, &d);
        kvf_seg_desc_release(&d);
    }
    free(bad);
    kvf_wr_free(&w);
    kvf_engine_dereg(e, r);
    kvf_engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup_bounds),
        cmocka_unit_test(test_large_registration_is_fast),
        cmocka_unit_test(test_descriptor),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
