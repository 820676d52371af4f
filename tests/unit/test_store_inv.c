/*
 * Unit test of the node inventory (store/proto/inv.c): entries stay in
 * offset order and never overlap; one outside the pool, of size 0 or
 * with a bad key is refused; a node refuses an entry or a removal from a
 * leader older than the newest it has seen (fencing); a newer leader's
 * entry replaces the overlapping older ones on a node; a leader reading
 * a report keeps the newest epoch of overlapping entries and the first
 * of equal ones; pages cover every entry once.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <kvferry/kvferry.h>

#include "store/proto/inv.h"

#include <stdio.h>
#include <string.h>

#define E1 ((1ull << 63) | 10)
#define E2 ((1ull << 63) | 20)

static void check_sorted(const kvf_inv_t *inv)
{
    size_t i;

    for (i = 0; i + 1 < inv->n; i++) {
        assert_true(inv->ent[i].off + inv->ent[i].size <= inv->ent[i + 1].off);
    }
}

static void test_bounds(void **state)
{
    kvf_inv_t inv;
    char longkey[KVF_STORE_KEY_MAX + 2];

    (void)state;
    kvf_inv_init(&inv, 4096);
    memset(longkey, 'k', sizeof(longkey) - 1);
    longkey[sizeof(longkey) - 1] = '\0';
    assert_int_equal(
        kvf_inv_put(&inv, KVF_INV_RECORD, "a", 4000, 97, 1, E1, 1, 0),
        KVF_ERR_INVALID_PARAM);
    assert_int_equal(
        kvf_inv_put(&inv, KVF_INV_RECORD, "a", 4097, 1, 1, E1, 1, 0),
        KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_inv_put(&inv, KVF_INV_RECORD, "a", 64, UINT64_MAX - 10,
                                 1, E1, 1, 0),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_inv_put(&inv, KVF_INV_RECORD, "a", 0, 0, 1, E1, 1, 0),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_inv_put(&inv, KVF_INV_RECORD, "", 0, 64, 1, E1, 1, 0),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(
        kvf_inv_put(&inv, KVF_INV_RECORD, longkey, 0, 64, 1, E1, 1, 0),
        KVF_ERR_INVALID_PARAM);
    assert_int_equal(
        kvf_inv_put(&inv, KVF_INV_RECORD, "a", 4000, 96, 1, E1, 1, 0), KVF_OK);
    assert_int_equal(inv.n, 1);
    kvf_inv_fini(&inv);
}

static void test_fencing(void **state)
{
    kvf_inv_t inv;

    (void)state;
    kvf_inv_init(&inv, 1 << 20);
    assert_int_equal(kvf_inv_put(&inv, KVF_INV_RECORD, "a", 0, 64, 1, E2, 1, 0),
                     KVF_OK);
    /* a deposed leader: refused, nothing changed */
    assert_int_equal(
        kvf_inv_put(&inv, KVF_INV_RECORD, "b", 128, 64, 2, E1, 1, 0),
        KVF_ERR_STALE);
    assert_int_equal(kvf_inv_del(&inv, "a", 0, E1), KVF_ERR_STALE);
    assert_int_equal(kvf_inv_fence(&inv, E1), KVF_ERR_STALE);
    assert_int_equal(inv.n, 1);
    assert_int_equal(kvf_inv_fence(&inv, E2), KVF_OK);
    assert_int_equal(kvf_inv_del(&inv, "b", 0, E2), KVF_ERR_NOT_FOUND);
    assert_int_equal(kvf_inv_del(&inv, "a", 64, E2), KVF_ERR_NOT_FOUND);
    assert_int_equal(kvf_inv_del(&inv, "a", 0, E2), KVF_OK);
    assert_int_equal(inv.n, 0);
    kvf_inv_fini(&inv);
}

static void test_record_overlap(void **state)
{
    kvf_inv_t inv;

    (void)state;
    kvf_inv_init(&inv, 1 << 20);
    assert_int_equal(
        kvf_inv_put(&inv, KVF_INV_RECORD, "a", 0, 100, 1, E1, 1, 0), KVF_OK);
    assert_int_equal(
        kvf_inv_put(&inv, KVF_INV_RECORD, "b", 128, 64, 2, E1, 1, 0), KVF_OK);
    assert_int_equal(
        kvf_inv_put(&inv, KVF_INV_RECORD, "c", 256, 64, 3, E1, 1, 0), KVF_OK);
    /* the space of a and b reused (their removal never arrived) */
    assert_int_equal(
        kvf_inv_put(&inv, KVF_INV_RECORD, "d", 64, 128, 4, E2, 1, 0), KVF_OK);
    assert_int_equal(inv.n, 2);
    assert_string_equal(inv.ent[0].key, "d");
    assert_string_equal(inv.ent[1].key, "c");
    assert_int_equal(inv.dropped, 2);
    check_sorted(&inv);
    /* touching is not overlapping */
    assert_int_equal(
        kvf_inv_put(&inv, KVF_INV_RECORD, "e", 192, 64, 5, E2, 1, 0), KVF_OK);
    assert_int_equal(inv.n, 3);
    check_sorted(&inv);
    kvf_inv_fini(&inv);
}

static void test_report_overlap(void **state)
{
    kvf_inv_t inv;

    (void)state;
    kvf_inv_init(&inv, 1 << 20);
    assert_int_equal(
        kvf_inv_put(&inv, KVF_INV_REPORT, "a", 0, 128, 1, E2, 1, 0), KVF_OK);
    /* older, or as old, over a newer one: refused */
    assert_int_equal(
        kvf_inv_put(&inv, KVF_INV_REPORT, "b", 64, 128, 2, E1, 1, 0),
        KVF_ERR_EXISTS);
    assert_int_equal(
        kvf_inv_put(&inv, KVF_INV_REPORT, "b", 64, 128, 2, E2, 1, 0),
        KVF_ERR_EXISTS);
    assert_int_equal(
        kvf_inv_put(&inv, KVF_INV_REPORT, "c", 512, 64, 3, E1, 1, 0), KVF_OK);
    /* newer over older: the older goes */
    assert_int_equal(
        kvf_inv_put(&inv, KVF_INV_REPORT, "d", 500, 64, 4, E2, 1, 0), KVF_OK);
    assert_int_equal(inv.n, 2);
    assert_string_equal(inv.ent[1].key, "d");
    /* a report is not fenced */
    assert_int_equal(
        kvf_inv_put(&inv, KVF_INV_REPORT, "e", 4096, 64, 5, E1, 1, 0), KVF_OK);
    /* same epoch, a later commit: it replaces the earlier */
    assert_int_equal(kvf_inv_put(&inv, KVF_INV_REPORT, "f", 0, 64, 6, E2, 2, 0),
                     KVF_OK);
    assert_int_equal(inv.n, 3);
    assert_string_equal(inv.ent[0].key, "f");
    check_sorted(&inv);
    kvf_inv_fini(&inv);
}

static void test_many_and_pages(void **state)
{
    kvf_inv_t inv;
    char key[32];
    size_t i, seen = 0, page = 7;
    uint64_t from = 0;

    (void)state;
    kvf_inv_init(&inv, 1 << 30);
    /* descending offsets: every insertion at the front */
    for (i = 1000; i-- > 0;) {
        snprintf(key, sizeof(key), "k%zu", i);
        assert_int_equal(
            kvf_inv_put(&inv, KVF_INV_RECORD, key, i * 4096, 4000, i, E1, 1, 0),
            KVF_OK);
    }
    assert_int_equal(inv.n, 1000);
    check_sorted(&inv);
    for (;;) {
        i = kvf_inv_seek(&inv, from);
        if (i == inv.n) {
            break;
        }
        for (; i < inv.n && page > 0; i++, page--, seen++) {
            assert_int_equal(inv.ent[i].off, seen * 4096);
            from = inv.ent[i].off + 1;
        }
        page = 7;
    }
    assert_int_equal(seen, 1000);
    kvf_inv_fini(&inv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_fencing),
        cmocka_unit_test(test_record_overlap),
        cmocka_unit_test(test_report_overlap),
        cmocka_unit_test(test_many_and_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
