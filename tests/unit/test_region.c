/*
 * Unit test: region registration and lookup (bounds at both ends,
 * overflow, overlap refused, deregistration), segment descriptor encoding
 * and decoding (CUDA IPC handles of GPU regions included), truncated,
 * corrupted and inconsistent descriptors refused, and that nothing leaks
 * (tracked allocator back to its baseline).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/rng.h"
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
    unsigned char *bad, v0;

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
    v0 = w.buf[0];
    w.buf[0] = 99;
    assert_int_equal(kvf_seg_desc_decode(w.buf, w.len, &d), KVF_ERR_VERSION);
    kvf_seg_desc_release(&d);
    w.buf[0] = v0;
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

/* Little-endian u32 at p. */
static void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* A GPU region's IPC handle travels in the descriptor; every way of
 * getting the IPC section wrong is refused. The region is registered as
 * host memory (no GPU needed) and presented as exported GPU memory. */
static void test_descriptor_ipc(void **state)
{
    static char a[8192], b[16384];
    unsigned char *buf, *ent;
    kvf_region_h ra, rb;
    kvf_seg_desc_t d;
    kvf_engine_h e;
    size_t cut, n, i;
    kvf_wr_t w;

    (void)state;
    e = new_engine();
    assert_int_equal(kvf_engine_reg(e, a, sizeof(a), KVF_MEM_HOST, 0, &ra),
                     KVF_OK);
    assert_int_equal(kvf_engine_reg(e, b, sizeof(b), KVF_MEM_HOST, 0, &rb),
                     KVF_OK);
    rb->type = KVF_MEM_CUDA;
    rb->device = 1;
    rb->ipc = 1;
    rb->ipc_off = 4096;
    for (i = 0; i < KVF_DESC_IPC_HANDLE; i++) {
        rb->ipc_handle[i] = (unsigned char)(i * 7 + 1);
    }
    kvf_wr_init(&w);
    assert_int_equal(kvf_seg_desc_encode(e, &w), KVF_OK);
    assert_int_equal(kvf_seg_desc_decode(w.buf, w.len, &d), KVF_OK);
    assert_int_equal(d.nregions, 2);
    for (i = 0; i < 2; i++) {
        if (d.regions[i].addr == (uint64_t)(uintptr_t)b) {
            assert_int_equal(d.regions[i].ipc, 1);
            assert_int_equal(d.regions[i].type, KVF_MEM_CUDA);
            assert_int_equal(d.regions[i].device, 1);
            assert_true(d.regions[i].ipc_off == 4096);
            assert_memory_equal(d.regions[i].ipc_handle, rb->ipc_handle,
                                KVF_DESC_IPC_HANDLE);
        } else {
            assert_int_equal(d.regions[i].ipc, 0);
        }
    }
    kvf_seg_desc_release(&d);
    /* every truncation, and a trailing byte, are refused */
    for (cut = 0; cut < w.len; cut++) {
        assert_int_not_equal(kvf_seg_desc_decode(w.buf, cut, &d), KVF_OK);
        kvf_seg_desc_release(&d);
    }
    n = w.len;
    buf = malloc(n + 1);
    memcpy(buf, w.buf, n);
    buf[n] = 0;
    assert_int_equal(kvf_seg_desc_decode(buf, n + 1, &d), KVF_ERR_PROTOCOL);
    kvf_seg_desc_release(&d);
    /* the IPC section is the last 4 + 76 bytes: count, then one entry */
    ent = buf + n - (4 + 8 + KVF_DESC_IPC_HANDLE);
    put32(ent - 4, 2); /* more entries than present */
    assert_int_equal(kvf_seg_desc_decode(buf, n, &d), KVF_ERR_PROTOCOL);
    kvf_seg_desc_release(&d);
    put32(ent - 4, 0); /* fewer */
    assert_int_equal(kvf_seg_desc_decode(buf, n, &d), KVF_ERR_PROTOCOL);
    kvf_seg_desc_release(&d);
    put32(ent - 4, 0xffffffffu); /* absurd */
    assert_int_equal(kvf_seg_desc_decode(buf, n, &d), KVF_ERR_PROTOCOL);
    kvf_seg_desc_release(&d);
    put32(ent - 4, 1);
    put32(ent, 2); /* region index out of range */
    assert_int_equal(kvf_seg_desc_decode(buf, n, &d), KVF_ERR_PROTOCOL);
    kvf_seg_desc_release(&d);
    put32(ent, 0xffffffffu);
    assert_int_equal(kvf_seg_desc_decode(buf, n, &d), KVF_ERR_PROTOCOL);
    kvf_seg_desc_release(&d);
    /* the index of the host region (a is below b or above it) */
    put32(ent, (uintptr_t)a < (uintptr_t)b ? 0 : 1);
    assert_int_equal(kvf_seg_desc_decode(buf, n, &d), KVF_ERR_PROTOCOL);
    kvf_seg_desc_release(&d);
    put32(ent, (uintptr_t)a < (uintptr_t)b ? 1 : 0);
    assert_int_equal(kvf_seg_desc_decode(buf, n, &d), KVF_OK);
    kvf_seg_desc_release(&d);
    free(buf);
    kvf_wr_free(&w);
    /* two entries for one region */
    ra->type = KVF_MEM_CUDA;
    ra->ipc = 1;
    kvf_wr_init(&w);
    assert_int_equal(kvf_seg_desc_encode(e, &w), KVF_OK);
    assert_int_equal(kvf_seg_desc_decode(w.buf, w.len, &d), KVF_OK);
    assert_true(d.regions[0].ipc && d.regions[1].ipc);
    kvf_seg_desc_release(&d);
    ent = w.buf + w.len - (4 + 8 + KVF_DESC_IPC_HANDLE);
    put32(ent, (uint32_t)(ent[-76] | ent[-75] << 8)); /* = the first's */
    assert_int_equal(kvf_seg_desc_decode(w.buf, w.len, &d), KVF_ERR_PROTOCOL);
    kvf_seg_desc_release(&d);
    kvf_wr_free(&w);
    ra->type = rb->type = KVF_MEM_HOST;
    ra->ipc = rb->ipc = 0;
    assert_int_equal(kvf_engine_dereg(e, ra), KVF_OK);
    assert_int_equal(kvf_engine_dereg(e, rb), KVF_OK);
    kvf_engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup_bounds),
        cmocka_unit_test(test_large_registration_is_fast),
        cmocka_unit_test(test_descriptor),
        cmocka_unit_test(test_descriptor_ipc),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
