/*
 * Integration test of the store's fast put and get paths, with real
 * processes on 127.0.0.1:
 * - reservations (COMMIT): a client's single puts keep space reserved
 *   for the next put of the same size and then put with one master round
 *   trip; every value is read back byte for byte; a put refused for its
 *   key keeps the reservation; reserved space is not in used_bytes; a
 *   disconnect hands reservations back at once; a reservation whose
 *   client vanished is reclaimed at the put timeout and its late commit
 *   refused; under pressure (high watermark) no reservation is made;
 *   a dead node's reservations go with it;
 * - bad COMMIT input (truncated body, unknown id, wrong size, oversized
 *   key, oversized reservation) gets a clear status and the master keeps
 *   serving;
 * - the engine's inline path: threads moving small batches on their own
 *   thread (kvf_transfer_sync) while others post large batches to the
 *   same peer's workers, every byte checked; an inline request the target
 *   partly refuses keeps per-operation results and the good bytes;
 *   resources back to baseline.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <kvferry/perf.h>

#include "test_store_harness.h"
#include "test_util.h"
#include "store/proto/proto.h"
#include "core/sock.h"
#include "core/time.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB (1024 * 1024)

static kvf_status_t raw_call(int fd, uint8_t type, uint32_t count, kvf_wr_t *w,
                             kvf_sp_frame_t *f)
{
    return kvf_sp_call(fd, kvf_test_mac(fd), type, 7, count, w, f,
                       kvf_time_ms() + 2000);
}

static void wr_commit(kvf_wr_t *w, const char *key, uint64_t id, uint64_t size,
                      uint64_t sum, unsigned mask, uint64_t next_size)
{
    kvf_wr_str(w, key);
    kvf_wr_u64(w, id);
    kvf_wr_u64(w, size);
    kvf_wr_u64(w, sum);
    kvf_wr_u8(w, (uint8_t)mask);
    kvf_wr_u8(w, 0);
    kvf_wr_u64(w, next_size);
    kvf_wr_u8(w, 1);
}

/* One COMMIT entry on fd; returns the key's status, *next_p the new
 * reservation id (0 = none). */
static kvf_status_t raw_commit(int fd, const char *key, uint64_t id,
                               uint64_t size, unsigned mask, uint64_t next_size,
                               uint64_t *next_p)
{
    kvf_sp_frame_t f = {0};
    kvf_status_t st;
    kvf_wr_t w;
    kvf_rd_t r;

    kvf_wr_init(&w);
    wr_commit(&w, key, id, size, 77, mask, next_size);
    assert_int_equal(raw_call(fd, KVF_SP_COMMIT, 1, &w, &f), KVF_OK);
    assert_int_equal(f.hdr.count, 1);
    kvf_rd_init(&r, f.body, f.hdr.meta_len);
    st = (kvf_status_t)(int32_t)kvf_rd_u32(&r);
    assert_true(kvf_rd_u32(&r) > 0); /* the put timeout */
    *next_p = kvf_rd_u64(&r);
    assert_int_equal(kvf_rd_status(&r), KVF_OK);
    kvf_wr_free(&w);
    kvf_sp_frame_free(&f);
    return st;
}

/* PUT_START of key on fd; returns its put id. */
static uint64_t raw_put_start(int fd, const char *key, size_t len)
{
    kvf_sp_frame_t f = {0};
    uint64_t put_id;
    kvf_wr_t w;
    kvf_rd_t r;

    kvf_wr_init(&w);
    kvf_wr_str(&w, key);
    kvf_wr_u64(&w, len);
    kvf_wr_u8(&w, 1);
    kvf_wr_u8(&w, 0);
    assert_int_equal(raw_call(fd, KVF_SP_PUT_START, 1, &w, &f), KVF_OK);
    kvf_rd_init(&r, f.body, f.hdr.meta_len);
    assert_int_equal((int32_t)kvf_rd_u32(&r), KVF_OK);
    put_id = kvf_rd_u64(&r);
    kvf_wr_free(&w);
    kvf_sp_frame_free(&f);
    return put_id;
}

static void put_get_check(kvs_client_t *c, const char *key, size_t len,
                          uint64_t seed)
{
    size_t got = 0;

    kvs_fill(c->buf, len, seed);
    assert_int_equal(kvf_store_put(c->st, key, c->buf, len, NULL), KVF_OK);
    memset(c->buf, 0, len);
    assert_int_equal(kvf_store_get(c->st, key, c->buf, len, &got, 0), KVF_OK);
    assert_int_equal(got, len);
    kvs_fill(c->buf + len, len, seed);
    assert_memory_equal(c->buf, c->buf + len, len);
}

static void test_reservation_puts(void **state)
{
    kvs_proc_t m, n;
    kvs_client_t c;
    char key[32];
    long puts;
    int i;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_node(&n, m.addr, "16M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 2 * MiB), 0);
    /* the first put reserves space for the next one of its size */
    put_get_check(&c, "r/0", MiB, 0);
    assert_int_equal(kvs_metric(m.http, "reservations"), 1);
    assert_int_equal(kvs_metric(m.http, "reserved_bytes"), MiB);
    assert_int_equal(kvs_metric(m.http, "used_bytes"), MiB);
    /* the next ones write into it and commit with one round trip */
    for (i = 1; i < 6; i++) {
        snprintf(key, sizeof(key), "r/%d", i);
        put_get_check(&c, key, MiB, (uint64_t)i);
    }
    assert_int_equal(kvs_metric(m.http, "puts_total"), 6);
    assert_int_equal(kvs_metric(m.http, "reservations"), 1);
    assert_int_equal(kvs_metric(m.http, "used_bytes"), 6 * MiB);
    assert_int_equal(kvs_metric(m.http, "pending_puts"), 0);
    /* refused for its key: the object is intact, the reservation stays */
    kvs_fill(c.buf, MiB, 99);
    assert_int_equal(kvf_store_put(c.st, "r/3", c.buf, MiB, NULL),
                     KVF_ERR_EXISTS);
    assert_int_equal(kvs_metric(m.http, "reservations"), 1);
    put_get_check(&c, "r/3b", MiB, 3);
    {
        size_t got;

        assert_int_equal(kvf_store_get(c.st, "r/3", c.buf, MiB, &got, 0),
                         KVF_OK);
        kvs_fill(c.buf + MiB, MiB, 3);
        assert_memory_equal(c.buf, c.buf + MiB, MiB);
    }
    /* another size on the one connection: put the usual way, the
     * connection keeps its reservation and gets no second one (a
     * handle's connections stay as many as its concurrent calls) */
    put_get_check(&c, "small", 4096, 5);
    puts = kvs_metric(m.http, "puts_total");
    assert_int_equal(puts, 8);
    assert_int_equal(kvs_metric(m.http, "reservations"), 1);
    assert_int_equal(kvs_metric(m.http, "reserved_bytes"), MiB);
    put_get_check(&c, "r/6", MiB, 6);
    assert_int_equal(kvs_metric(m.http, "reservations"), 1);
    /* puts of many sizes open no connection per reservation */
    {
        int fds = kvf_test_fd_count(), k;

        for (k = 0; k < 20; k++) {
            snprintf(key, sizeof(key), "sz/%d", k);
            put_get_check(&c, key, 4096 * (size_t)(k + 2), (uint64_t)k);
        }
        assert_int_equal(kvf_test_fd_count(), fds);
        assert_true(kvs_metric(m.http, "reservations") <= 1);
    }
    /* a disconnect hands them back at once */
    kvs_client_close(&c);
    assert_int_equal(kvs_metric(m.http, "reservations"), 0);
    assert_int_equal(kvs_metric(m.http, "reserved_bytes"), 0);
    /* 8 objects of 1 MiB, 4 KiB, and 20 of 8..84 KiB (4 KiB x 230) */
    assert_int_equal(kvs_metric(m.http, "used_bytes"),
                     8 * MiB + 4096 + 230 * 4096);
    assert_int_equal(kvs_metric(m.http, "reclaimed_total"), 0);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

static void test_reservation_zombie(void **state)
{
    static const char *const mopt[] = {"--put-timeout", "500ms", NULL};
    kvs_proc_t m, n;
    kvs_client_t c;
    uint64_t id, next, unused;
    int fd;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, mopt), 0);
    assert_int_equal(kvs_node(&n, m.addr, "16M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, MiB), 0);
    /* a client commits, takes a reservation, and vanishes */
    fd = kvs_raw_connect(m.addr);
    assert_true(fd >= 0);
    id = raw_put_start(fd, "z/0", MiB);
    assert_int_equal(raw_commit(fd, "z/0", id, MiB, 1, MiB, &next), KVF_OK);
    assert_true(next != 0);
    close(fd);
    assert_int_equal(kvs_metric(m.http, "reservations"), 1);
    assert_int_equal(kvs_metric(m.http, "reserved_bytes"), MiB);
    /* reclaimed at the put timeout */
    assert_true(kvs_metric_wait(m.http, "reservations", 0, 3000));
    assert_int_equal(kvs_metric(m.http, "reserved_bytes"), 0);
    assert_int_equal(kvs_metric(m.http, "used_bytes"), MiB);
    /* a late commit of it is refused and commits nothing */
    fd = kvs_raw_connect(m.addr);
    assert_true(fd >= 0);
    assert_int_equal(raw_commit(fd, "z/late", next, MiB, 1, 0, &unused),
                     KVF_ERR_STALE);
    assert_int_equal(unused, 0);
    close(fd);
    assert_int_equal(kvf_store_exists(c.st, "z/late"), KVF_ERR_NO_KEY);
    assert_int_equal(kvs_metric(m.http, "puts_total"), 1);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

static void test_commit_bad_input(void **state)
{
    char big[KVF_STORE_KEY_MAX + 8];
    kvf_sp_frame_t f = {0};
    kvs_proc_t m, n;
    kvs_client_t c;
    uint64_t id, next, next2;
    kvf_wr_t w;
    int fd;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_node(&n, m.addr, "16M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, MiB), 0);
    fd = kvs_raw_connect(m.addr);
    assert_true(fd >= 0);
    /* a truncated body: refused as a whole, the connection goes on */
    kvf_wr_init(&w);
    kvf_wr_str(&w, "t");
    kvf_wr_u64(&w, 1);
    assert_int_equal(raw_call(fd, KVF_SP_COMMIT, 1, &w, &f), KVF_OK);
    assert_int_equal(f.hdr.status, KVF_ERR_PROTOCOL);
    kvf_wr_free(&w);
    /* an id nobody holds */
    assert_int_equal(raw_commit(fd, "t", 12345, 64, 1, 0, &next),
                     KVF_ERR_STALE);
    /* a reservation committed with another size: refused, it stays */
    id = raw_put_start(fd, "b/0", 8192);
    assert_int_equal(raw_commit(fd, "b/0", id, 8192, 1, 8192, &next), KVF_OK);
    assert_true(next != 0);
    assert_int_equal(raw_commit(fd, "b/1", next, 4096, 1, 0, &next2),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvs_metric(m.http, "reservations"), 1);
    /* an oversized key: refused per key, the reservation stays */
    memset(big, 'k', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(raw_commit(fd, big, next, 8192, 1, 0, &next2),
                     KVF_ERR_KEY_TOO_LARGE);
    /* an existing key: refused, the reservation stays */
    assert_int_equal(raw_commit(fd, "b/0", next, 8192, 1, 0, &next2),
                     KVF_ERR_EXISTS);
    /* a reservation larger than allowed is not made */
    assert_int_equal(raw_commit(fd, "b/1", next, 8192, 1,
                                (uint64_t)KVF_STORE_RESV_MAX + 1, &next2),
                     KVF_OK);
    assert_int_equal(next2, 0);
    assert_int_equal(kvs_metric(m.http, "reservations"), 0);
    assert_int_equal(kvs_metric(m.http, "used_bytes"), 16384);
    /* mask 0 aborts a reservation */
    id = raw_put_start(fd, "b/2", 4096);
    assert_int_equal(raw_commit(fd, "b/2", id, 4096, 1, 4096, &next), KVF_OK);
    assert_int_equal(raw_commit(fd, "-", next, 4096, 0, 4096, &next2), KVF_OK);
    assert_int_equal(next2, 0);
    assert_int_equal(kvs_metric(m.http, "reservations"), 0);
    assert_int_equal(kvs_metric(m.http, "aborted_total"), 1);
    close(fd);
    kvf_sp_frame_free(&f);
    /* the master keeps serving */
    put_get_check(&c, "after", 4096, 1);
    assert_true(kvs_metric(m.http, "errors_total") >= 1);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

static void test_reservation_pressure(void **state)
{
    static const char *const mopt[] = {"--high-watermark",
                                       "50",
                                       "--low-watermark",
                                       "25",
                                       "--lease",
                                       "1ms",
                                       NULL};
    kvs_proc_t m, n;
    kvs_client_t c;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, mopt), 0);
    assert_int_equal(kvs_node(&n, m.addr, "8M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 2 * MiB), 0);
    put_get_check(&c, "p/0", MiB, 0);
    put_get_check(&c, "p/1", MiB, 1);
    put_get_check(&c, "p/2", MiB, 2);
    /* 3 MiB of 8 held by objects + 1 reserved: at the high watermark */
    assert_int_equal(kvs_metric(m.http, "reservations"), 1);
    put_get_check(&c, "p/3", MiB, 3);
    /* a reservation now would pass the high watermark: none is made,
     * and none caused an eviction */
    assert_int_equal(kvs_metric(m.http, "reservations"), 0);
    assert_int_equal(kvs_metric(m.http, "evictions_total"), 0);
    assert_int_equal(kvs_metric(m.http, "used_bytes"), 4 * MiB);
    /* eviction as without reservations: 62.5 % -> down to 25 % */
    kvs_sleep_ms(10);
    put_get_check(&c, "p/4", MiB, 4);
    assert_int_equal(kvs_metric(m.http, "evictions_total"), 3);
    assert_int_equal(kvs_metric(m.http, "used_bytes"), 2 * MiB);
    kvs_client_close(&c);
    kvs_stop(&n, 0);
    kvs_stop(&m, 0);
}

static void test_reservation_node_dies(void **state)
{
    static const char *const mopt[] = {"--node-ttl", "600ms", "--heartbeat",
                                       "100ms", NULL};
    kvs_proc_t m, n1, n2;
    kvs_client_t c;

    (void)state;
    assert_int_equal(kvs_master(&m, 0, mopt), 0);
    assert_int_equal(kvs_node(&n1, m.addr, "16M", NULL), 0);
    assert_int_equal(kvs_client_open(&c, m.addr, 2 * MiB), 0);
    put_get_check(&c, "d/0", MiB, 0);
    assert_int_equal(kvs_metric(m.http, "reservations"), 1);
    assert_int_equal(kvs_node(&n2, m.addr, "16M", NULL), 0);
    kvs_stop(&n1, SIGKILL);
    /* after the TTL the node, its object and its reservation are gone */
    assert_true(kvs_metric_wait(m.http, "nodes", 1, 5000));
    assert_int_equal(kvs_metric(m.http, "reservations"), 0);
    assert_int_equal(kvs_metric(m.http, "reserved_bytes"), 0);
    /* the client's stale reservation is refused; it puts the usual way */
    put_get_check(&c, "d/1", MiB, 1);
    assert_int_equal(kvs_metric(m.http, "puts_total"), 2);
    kvs_client_close(&c);
    kvs_stop(&n2, 0);
    kvs_stop(&m, 0);
}

/* ---- engine: inline requests next to posted batches -------------------- */

#define EPOOL   (16u << 20)
#define ESEED   31
#define ROUNDS  40
#define NTHREAD 4

typedef struct {
    kvf_engine_h e;
    kvf_peer_h peer;
    kvf_test_target_t *t;
    unsigned char *local;
    const unsigned char *expect;
    int id;
    int ok;
} eth_t;

static void *eth_main(void *arg)
{
    eth_t *a = arg;
    size_t stripe = EPOOL / NTHREAD, off = (size_t)a->id * stripe;
    kvf_op_t ops[64];
    kvf_batch_h b;
    int round, i;

    a->ok = 1;
    for (round = 0; round < ROUNDS && a->ok; round++) {
        /* odd threads: one small op on this thread (inline); even: 64
         * ops of 16 KiB, two requests for the peer's workers */
        size_t n = (a->id & 1) ? 1 : 64, bs = (a->id & 1) ? 65536 : 16384;
        uint64_t r = ((uint64_t)round * 7919 + (uint64_t)a->id * 104729) %
                     (EPOOL / bs - n);

        memset(a->local + off, 0, n * bs);
        for (i = 0; i < (int)n; i++) {
            ops[i] = (kvf_op_t){KVF_OP_READ, a->local + off + (size_t)i * bs,
                                a->peer, a->t->pool_addr + (r + i) * bs, bs};
        }
        if (a->id & 1) {
            a->ok = kvf_transfer_sync(a->e, ops, n, 5000) == KVF_OK;
        } else {
            a->ok = kvf_batch_submit(a->e, ops, n, &b) == KVF_OK &&
                    kvf_batch_wait(b, 5000) == KVF_OK;
            kvf_batch_destroy(b);
        }
        if (a->ok && memcmp(a->local + off, a->expect + r * bs, n * bs) != 0) {
            a->ok = 0;
        }
    }
    return NULL;
}

static void test_engine_inline_mixed(void **state)
{
    kvf_engine_params_t p = {0};
    kvf_engine_stats_t s0, s1;
    kvf_test_target_t t;
    unsigned char *local = malloc(EPOOL), *expect = malloc(EPOOL);
    pthread_t th[NTHREAD];
    eth_t a[NTHREAD];
    kvf_engine_h e;
    kvf_region_h reg;
    kvf_peer_h peer;
    long blocks0, bytes0, blocks, bytes;
    int i;

    (void)state;
    kvf_alloc_stats(&blocks0, &bytes0);
    assert_int_equal(kvf_test_target_start(&t, EPOOL, ESEED, NULL, NULL), 0);
    kvf_test_pool_bytes(expect, EPOOL, ESEED);
    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_CONNS |
                   KVF_ENGINE_PARAM_TIMEOUT | KVF_ENGINE_PARAM_TRANSPORTS;
    p.no_listen = 1;
    p.conns = 2;
    p.timeout_ms = 3000;
    p.transports = "tcp";
    assert_int_equal(kvf_engine_create(&p, &e), KVF_OK);
    assert_int_equal(kvf_engine_reg(e, local, EPOOL, KVF_MEM_HOST, 0, &reg),
                     KVF_OK);
    assert_int_equal(kvf_peer_open(e, t.segment, &peer), KVF_OK);
    kvf_engine_stats(e, &s0);
    for (i = 0; i < NTHREAD; i++) {
        a[i] = (eth_t){e, peer, &t, local, expect, i, 0};
        pthread_create(&th[i], NULL, eth_main, &a[i]);
    }
    for (i = 0; i < NTHREAD; i++) {
        pthread_join(th[i], NULL);
        assert_true(a[i].ok);
    }
    kvf_engine_stats(e, &s1);
    assert_int_equal(s1.errors, s0.errors);
    /* an inline request the target partly refuses: per-op results, the
     * good bytes right, and the connection goes on serving */
    {
        kvf_op_t ops[3];
        kvf_batch_h b;

        memset(local, 0, 3 * 65536);
        ops[0] = (kvf_op_t){KVF_OP_READ, local, peer, t.pool_addr, 65536};
        ops[1] = (kvf_op_t){KVF_OP_READ, local + 65536, peer,
                            t.pool_addr + EPOOL + 4096, 65536};
        ops[2] = (kvf_op_t){KVF_OP_READ, local + 2 * 65536, peer,
                            t.pool_addr + 3 * 65536, 65536};
        assert_int_equal(kvf_batch_submit_ex(e, ops, 3, KVF_BATCH_INLINE, &b),
                         KVF_OK);
        assert_int_equal(kvf_batch_wait(b, 5000), KVF_ERR_OUT_OF_BOUNDS);
        assert_int_equal(kvf_batch_op_status(b, 0, NULL), KVF_OK);
        assert_int_equal(kvf_batch_op_status(b, 1, NULL),
                         KVF_ERR_OUT_OF_BOUNDS);
        assert_int_equal(kvf_batch_op_status(b, 2, NULL), KVF_OK);
        kvf_batch_destroy(b);
        assert_memory_equal(local, expect, 65536);
        assert_memory_equal(local + 2 * 65536, expect + 3 * 65536, 65536);
        assert_int_equal(kvf_transfer_sync(e, &ops[2], 1, 5000), KVF_OK);
        /* and a refused write */
        ops[1].type = KVF_OP_WRITE;
        assert_int_equal(
            kvf_batch_submit_ex(e, &ops[1], 1, KVF_BATCH_INLINE, &b), KVF_OK);
        assert_int_equal(kvf_batch_wait(b, 5000), KVF_ERR_OUT_OF_BOUNDS);
        kvf_batch_destroy(b);
        assert_int_equal(kvf_transfer_sync(e, ops, 1, 5000), KVF_OK);
        assert_memory_equal(local, expect, 65536);
    }
    kvf_peer_close(peer);
    assert_int_equal(kvf_engine_dereg(e, reg), KVF_OK);
    kvf_engine_destroy(e);
    kvf_alloc_stats(&blocks, &bytes);
    assert_int_equal(blocks, blocks0);
    assert_int_equal(kvf_test_target_stop(&t), 0);
    free(local);
    free(expect);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reservation_puts),
        cmocka_unit_test(test_reservation_zombie),
        cmocka_unit_test(test_commit_bad_input),
        cmocka_unit_test(test_reservation_pressure),
        cmocka_unit_test(test_reservation_node_dies),
        cmocka_unit_test(test_engine_inline_mixed),
    };

    kvs_bin();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
