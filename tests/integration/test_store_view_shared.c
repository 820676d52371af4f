/*
 * Integration test of shared views (kvf_store_view_get_flags with
 * KVF_STORE_VIEW_SHARED, store/client/view.c): a real master and nodes
 * on 127.0.0.1, the client reaching them over shm.
 * - many calls over objects on two nodes, shared and plain ones mixed:
 *   every view byte for byte, inside its mapping, every release KVF_OK;
 *   objects put after a node's lease was opened are viewed through it;
 * - a node lease shorter than the calls (its timeout_ms 1.5 s): the
 *   shared lease is renewed before it ends, a view held across the
 *   renewal keeps its bytes and its release says it held, and the
 *   views' left time never exceeds the node's lease;
 * - a node stopped while its shared lease is open (none held by a
 *   caller): the stop is bounded, and the handle goes on (the key is
 *   then an error or still its bytes); disconnect closes the lease.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_store_harness.h"
#include "core/time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KiB 1024
#define MiB (1024 * 1024)

static const size_t sizes[] = {1, 4 * KiB, 64 * KiB + 3, 1 * MiB, 2 * MiB + 5};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define NKEYS  (2 * NSIZES)

static void put_seeded(kvs_client_t *c, const char *key, size_t len,
                       uint64_t seed)
{
    kvs_fill(c->buf, len, seed);
    assert_int_equal(kvf_store_put(c->st, key, c->buf, len, NULL), KVF_OK);
}

static void check_view(const kvf_store_view_t *v, size_t len, uint64_t seed,
                       unsigned char *tmp)
{
    const unsigned char *p = v->ptr, *base = v->map_base;

    assert_int_equal(v->status, KVF_OK);
    assert_int_equal(v->len, len);
    assert_non_null(p);
    assert_true(p >= base && p + len <= base + v->map_len);
    kvs_fill(tmp, len, seed);
    assert_memory_equal(p, tmp, len);
    assert_true(v->checksum == kvf_checksum(p, len));
}

static void name_keys(char (*names)[32], const char **keys, const char *pfx)
{
    size_t i;

    for (i = 0; i < NKEYS; i++) {
        snprintf(names[i], 32, "%s/%zu", pfx, i);
        keys[i] = names[i];
    }
}

static void test_shared_bytes(void **state)
{
    kvf_store_view_t v[NKEYS], first[NKEYS];
    const char *keys[NKEYS];
    char names[NKEYS][32];
    kvf_store_view_lease_h lease;
    unsigned char *tmp = malloc(4 * MiB);
    kvs_proc_t m, n1, n2;
    kvs_client_t c;
    size_t i, r;

    (void)state;
    assert_non_null(tmp);
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_node(&n1, m.addr, "32M", NULL), 0);
    assert_int_equal(kvs_node(&n2, m.addr, "32M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 4 * MiB), 0);
    name_keys(names, keys, "sh");
    for (i = 0; i < NKEYS; i++) {
        put_seeded(&c, keys[i], sizes[i % NSIZES], 100 + i);
    }
    for (r = 0; r < 60; r++) {
        unsigned flags = (r % 3 == 2) ? 0 : KVF_STORE_VIEW_SHARED;

        assert_int_equal(
            kvf_store_view_get_flags(c.st, NKEYS, keys, flags, v, &lease),
            KVF_OK);
        for (i = 0; i < NKEYS; i++) {
            check_view(&v[i], sizes[i % NSIZES], 100 + (r >= 30 ? 200 : 0) + i,
                       tmp);
            if (r == 0 || r == 30) { /* after r 29, another node maybe */
                first[i] = v[i];
            } else {
                /* one mapping per node pool, call after call */
                assert_ptr_equal(v[i].map_base, first[i].map_base);
            }
        }
        assert_true(kvf_store_view_left_ms(lease) > 0);
        assert_int_equal(kvf_store_view_release(lease), KVF_OK);
        if (r == 29) { /* new objects in the pools, under the same lease */
            for (i = 0; i < NKEYS; i++) {
                assert_int_equal(kvf_store_remove(c.st, keys[i]), KVF_OK);
                put_seeded(&c, keys[i], sizes[i % NSIZES], 300 + i);
            }
        }
    }
    /* a missing key among shared views */
    keys[0] = "sh/none";
    assert_int_equal(kvf_store_view_get_flags(c.st, 2, keys,
                                              KVF_STORE_VIEW_SHARED, v, &lease),
                     KVF_OK);
    assert_int_equal(v[0].status, KVF_ERR_NO_KEY);
    check_view(&v[1], sizes[1], 301, tmp);
    assert_int_equal(kvf_store_view_release(lease), KVF_OK);
    kvs_client_close(&c); /* closes the shared leases */
    kvs_stop(&n1, 0);
    kvs_stop(&n2, 0);
    kvs_stop(&m, 0);
    free(tmp);
}

static void test_shared_renew(void **state)
{
    kvf_store_view_t held, v;
    const char *key = "rn/a";
    kvf_store_view_lease_h hlease, lease;
    unsigned char *tmp = malloc(MiB);
    uint64_t t0;
    kvs_proc_t m, n1;
    kvs_client_t c;
    unsigned left;
    int calls = 0;

    (void)state;
    assert_non_null(tmp);
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    /* the node's leases: 1.5 s */
    setenv("KVF_STORE_TIMEOUT_MS", "1500", 1);
    assert_int_equal(kvs_node(&n1, m.addr, "32M", NULL), 0);
    unsetenv("KVF_STORE_TIMEOUT_MS");
    assert_int_equal(kvs_client_open(&c, m.addr, MiB), 0);
    put_seeded(&c, key, MiB, 7);

    assert_int_equal(kvf_store_view_get_flags(
                         c.st, 1, &key, KVF_STORE_VIEW_SHARED, &held, &hlease),
                     KVF_OK);
    check_view(&held, MiB, 7, tmp);
    t0 = kvf_time_ms();
    left = kvf_store_view_left_ms(hlease);
    assert_true(left > 0 && left <= 1500); /* the node's lease bounds it */
    /* calls go on past the point where the lease is renewed */
    while (kvf_time_ms() - t0 < 1100) {
        assert_int_equal(kvf_store_view_get_flags(
                             c.st, 1, &key, KVF_STORE_VIEW_SHARED, &v, &lease),
                         KVF_OK);
        check_view(&v, MiB, 7, tmp);
        assert_true(kvf_store_view_left_ms(lease) > 0);
        assert_int_equal(kvf_store_view_release(lease), KVF_OK);
        calls++;
        kvs_sleep_ms(20);
    }
    assert_true(calls > 10);
    /* the first view kept its bytes across the renewal and held */
    check_view(&held, MiB, 7, tmp);
    if (kvf_store_view_left_ms(hlease) > 0) {
        assert_int_equal(kvf_store_view_release(hlease), KVF_OK);
    } else { /* a loaded machine: past its time, and said so */
        assert_int_equal(kvf_store_view_release(hlease), KVF_ERR_TIMEOUT);
    }
    kvs_client_close(&c);
    kvs_stop(&n1, 0);
    kvs_stop(&m, 0);
    free(tmp);
}

static void test_shared_node_stop(void **state)
{
    const char *key = "ns/a";
    kvf_store_view_lease_h lease;
    unsigned char *tmp = malloc(64 * KiB);
    kvf_store_view_t v;
    kvs_proc_t m, n1;
    kvs_client_t c;
    kvf_status_t st;
    uint64_t t0;

    (void)state;
    assert_non_null(tmp);
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_node(&n1, m.addr, "32M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 64 * KiB), 0);
    put_seeded(&c, key, 64 * KiB, 9);
    assert_int_equal(kvf_store_view_get_flags(
                         c.st, 1, &key, KVF_STORE_VIEW_SHARED, &v, &lease),
                     KVF_OK);
    check_view(&v, 64 * KiB, 9, tmp);
    assert_int_equal(kvf_store_view_release(lease), KVF_OK);
    /* the shared lease is still open: the stop waits lease_break_ms at
     * most, then breaks it */
    t0 = kvf_time_ms();
    kvs_stop(&n1, 0);
    assert_true(kvf_time_ms() - t0 < 5000);
    /* the handle goes on: an error, or the bytes (checked) */
    st = kvf_store_view_get_flags(c.st, 1, &key, KVF_STORE_VIEW_SHARED, &v,
                                  &lease);
    if (st == KVF_OK) {
        if (v.status == KVF_OK) {
            check_view(&v, 64 * KiB, 9, tmp);
        }
        (void)kvf_store_view_release(lease);
    }
    kvs_client_close(&c);
    kvs_stop(&m, 0);
    free(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_bytes),
        cmocka_unit_test(test_shared_renew),
        cmocka_unit_test(test_shared_node_stop),
    };

    kvs_bin();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
