/*
 * Unit test of the store message codec (store/proto/msg.c): every message
 * encodes to the byte layout of its schema (pinned here byte for byte for
 * a PUT_END entry, by size for the others) and decodes back to the same
 * fields; the master's body check accepts exactly `count` entries and
 * refuses truncated bodies, trailing bytes, too many entries and unknown
 * types; a bad key is a per-key verdict, not a bad body; a reply naming
 * more replicas than exist fails the reader; inventory entries round
 * trip and their check refuses empty, short, long and trailing bodies.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "store/proto/msg.h"

#include <stdio.h>
#include <string.h>

static void test_put_end_bytes(void **state)
{
    static const unsigned char want[] = {
        3,    0,    'a',  '/',  'b',                           /* str key */
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,        /* put_id */
        0xef, 0xbe, 0xfe, 0xca, 0xce, 0xfa, 0xed, 0xfe, 0x03}; /* sum, mask */
    kvf_sm_req_t q = {0}, d;
    kvf_wr_t w;
    kvf_rd_t r;

    (void)state;
    q.key = "a/b";
    q.put_id = 0x0807060504030201ull;
    q.checksum = 0xfeedfacecafebeefull;
    q.mask = 3;
    kvf_wr_init(&w);
    kvf_sm_put_end_enc(&w, &q);
    assert_int_equal(w.len, sizeof(want));
    assert_memory_equal(w.buf, want, sizeof(want));
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_put_end_dec(&r, &d);
    assert_int_equal(kvf_rd_status(&r), KVF_OK);
    assert_int_equal(kvf_rd_left(&r), 0);
    assert_int_equal(d.key_status, KVF_OK);
    assert_string_equal(d.key, "a/b");
    assert_int_equal(d.put_id, q.put_id);
    assert_int_equal(d.checksum, q.checksum);
    assert_int_equal(d.mask, 3);
    assert_int_equal(kvf_sm_req_check(KVF_SP_PUT_END, 1, w.buf, w.len), KVF_OK);
    kvf_wr_free(&w);
}

static void test_requests_round_trip(void **state)
{
    kvf_sm_req_t q = {0}, d;
    kvf_wr_t w;
    kvf_rd_t r;

    (void)state;
    q.key = "key";
    q.size = 65536;
    q.replicas = 2;
    q.flags = KVF_STORE_PIN;
    q.put_id = 77;
    q.checksum = 99;
    q.mask = 1;
    q.next_size = 4096;
    q.next_replicas = 2;
    kvf_wr_init(&w);
    kvf_sm_put_start_enc(&w, &q);
    assert_int_equal(w.len, 2 + 3 + 10);
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_put_start_dec(&r, &d);
    assert_int_equal(kvf_rd_left(&r), 0);
    assert_int_equal(d.size, 65536);
    assert_int_equal(d.replicas, 2);
    assert_int_equal(d.flags, KVF_STORE_PIN);
    w.len = 0;
    kvf_sm_commit_enc(&w, &q);
    assert_int_equal(w.len, 2 + 3 + 35);
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_commit_dec(&r, &d);
    assert_int_equal(kvf_rd_status(&r), KVF_OK);
    assert_int_equal(kvf_rd_left(&r), 0);
    assert_int_equal(d.put_id, 77);
    assert_int_equal(d.size, 65536);
    assert_int_equal(d.checksum, 99);
    assert_int_equal(d.mask, 1);
    assert_int_equal(d.flags, KVF_STORE_PIN);
    assert_int_equal(d.next_size, 4096);
    assert_int_equal(d.next_replicas, 2);
    w.len = 0;
    kvf_sm_key_enc(&w, "key");
    assert_int_equal(w.len, 2 + 3);
    kvf_wr_free(&w);
}

static void fill_obj(kvf_sm_obj_t *o)
{
    memset(o, 0, sizeof(*o));
    o->status = KVF_OK;
    o->put_id = 5;
    o->size = 8192;
    o->checksum = 0x1234;
    o->lease_ms = 2000;
    o->put_timeout_ms = 10000;
    o->nrep = 2;
    strcpy(o->seg[0], "tcp://127.0.0.1:1");
    strcpy(o->seg[1], "tcp://127.0.0.1:22");
    o->addr[0] = 0x1000;
    o->addr[1] = 0x2000;
}

static void check_reps(const kvf_sm_obj_t *d)
{
    assert_int_equal(d->nrep, 2);
    assert_string_equal(d->seg[0], "tcp://127.0.0.1:1");
    assert_string_equal(d->seg[1], "tcp://127.0.0.1:22");
    assert_int_equal(d->addr[0], 0x1000);
    assert_int_equal(d->addr[1], 0x2000);
}

static void test_replies_round_trip(void **state)
{
    size_t reps = 1 + (2 + 17 + 8) + (2 + 18 + 8);
    kvf_sm_obj_t o, d;
    kvf_wr_t w;
    kvf_rd_t r;

    (void)state;
    fill_obj(&o);
    kvf_wr_init(&w);
    kvf_sm_get_rep_enc(&w, &o);
    assert_int_equal(w.len, 4 + 8 + 8 + 4 + reps);
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_get_rep_dec(&r, &d);
    assert_int_equal(kvf_sm_rep_end(&r, 1, 1), KVF_OK);
    assert_int_equal(kvf_sm_rep_end(&r, 2, 1), KVF_ERR_PROTOCOL);
    assert_int_equal(d.size, 8192);
    assert_int_equal(d.checksum, 0x1234);
    assert_int_equal(d.lease_ms, 2000);
    check_reps(&d);
    w.len = 0;
    kvf_sm_put_start_rep_enc(&w, &o);
    assert_int_equal(w.len, 4 + 8 + reps);
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_put_start_rep_dec(&r, &d);
    assert_int_equal(d.put_id, 5);
    check_reps(&d);
    w.len = 0;
    kvf_sm_commit_rep_enc(&w, &o);
    assert_int_equal(w.len, 4 + 4 + 8 + reps);
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_commit_rep_dec(&r, &d);
    assert_int_equal(d.put_timeout_ms, 10000);
    assert_int_equal(d.put_id, 5);
    check_reps(&d);
    /* a found object with no replica is not found */
    o.nrep = 0;
    w.len = 0;
    kvf_sm_get_rep_enc(&w, &o);
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_get_rep_dec(&r, &d);
    assert_int_equal(d.status, KVF_ERR_NOT_FOUND);
    /* more replicas than exist: the reader fails */
    w.len = 0;
    kvf_sm_status_enc(&w, KVF_OK);
    kvf_wr_u64(&w, 0);
    kvf_wr_u8(&w, KVF_STORE_REPLICA_MAX + 1);
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_put_start_rep_dec(&r, &d);
    assert_int_equal(kvf_rd_status(&r), KVF_ERR_PROTOCOL);
    assert_int_equal(d.nrep, 0);
    kvf_wr_free(&w);
}

static void test_whole_bodies(void **state)
{
    kvf_sm_node_reg_t reg = {
        "tcp://10.0.0.1:5", 1, 0x7f00, 1 << 20, {7}, 1, "", 0};
    kvf_sm_node_reg_t reg2;
    kvf_sm_node_reg_rep_t rr = {9, 3, 500, 3000}, rr2;
    kvf_sm_heartbeat_t hb = {1, 3, 9}, hb2;
    kvf_sm_list_t l = {"p/", 10}, l2;
    kvf_sm_list_ent_t e = {0}, e2;
    kvf_sm_node_ent_t n = {0}, n2;
    kvf_wr_t w;
    kvf_rd_t r;

    (void)state;
    kvf_wr_init(&w);
    kvf_sm_node_reg_enc(&w, &reg);
    assert_int_equal(w.len, 2 + strlen(reg.segment) + 24 + 16);
    assert_int_equal(kvf_sm_req_check(KVF_SP_NODE_REG, 0, w.buf, w.len),
                     KVF_OK);
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_node_reg_dec(&r, &reg2);
    assert_string_equal(reg2.segment, reg.segment);
    assert_int_equal(reg2.pool_len, 1 << 20);
    assert_int_equal(reg2.has_instance, 1);
    assert_int_equal(reg2.disk_len, 0);
    /* a node with a disk tier: inventory address (maybe empty), disk_len */
    w.len = 0;
    reg.disk_len = 1ull << 34;
    kvf_sm_node_reg_enc(&w, &reg);
    assert_int_equal(w.len, 2 + strlen(reg.segment) + 24 + 16 + 2 + 8);
    assert_int_equal(kvf_sm_req_check(KVF_SP_NODE_REG, 0, w.buf, w.len),
                     KVF_OK);
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_node_reg_dec(&r, &reg2);
    assert_int_equal(reg2.disk_len, 1ull << 34);
    assert_string_equal(reg2.inv_addr, "");
    w.len = 0;
    kvf_sm_node_reg_rep_enc(&w, &rr);
    assert_int_equal(w.len, 24);
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_node_reg_rep_dec(&r, &rr2);
    assert_int_equal(rr2.ttl_ms, 3000);
    w.len = 0;
    kvf_sm_heartbeat_enc(&w, &hb);
    assert_int_equal(w.len, 24);
    assert_int_equal(kvf_sm_req_check(KVF_SP_HEARTBEAT, 0, w.buf, w.len - 1),
                     KVF_ERR_PROTOCOL);
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_heartbeat_dec(&r, &hb2);
    assert_int_equal(hb2.master_epoch, 9);
    w.len = 0;
    kvf_sm_list_enc(&w, &l);
    assert_int_equal(w.len, 2 + 2 + 4);
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_list_dec(&r, &l2);
    assert_string_equal(l2.prefix, "p/");
    assert_int_equal(l2.max, 10);
    w.len = 0;
    e.key = "p/x";
    e.size = 42;
    e.committed = 1;
    e.nrep = 2;
    kvf_sm_list_ent_enc(&w, &e);
    assert_int_equal(w.len, 3 + KVF_SM_LIST_ENT_FIXED);
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_list_ent_dec(&r, &e2);
    assert_string_equal(e2.key, "p/x");
    assert_int_equal(e2.size, 42);
    assert_int_equal(e2.nrep, 2);
    /* NODES: an empty request, node entries in the reply */
    assert_int_equal(kvf_sm_req_check(KVF_SP_NODES, 0, NULL, 0), KVF_OK);
    assert_int_equal(kvf_sm_req_check(KVF_SP_NODES, 0, w.buf, 1),
                     KVF_ERR_PROTOCOL);
    w.len = 0;
    snprintf(n.segment, sizeof(n.segment), "127.0.0.1:7000");
    n.pool_addr = 0x7f0000001000ull;
    n.pool_len = 12ull << 30;
    kvf_sm_node_ent_enc(&w, &n);
    assert_int_equal(w.len, strlen(n.segment) + KVF_SM_NODE_ENT_FIXED);
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_node_ent_dec(&r, &n2);
    assert_int_equal(kvf_sm_rep_end(&r, 1, 1), KVF_OK);
    assert_string_equal(n2.segment, n.segment);
    assert_true(n2.pool_addr == n.pool_addr && n2.pool_len == n.pool_len);
    kvf_rd_init(&r, w.buf, w.len - 1); /* cut short */
    kvf_sm_node_ent_dec(&r, &n2);
    assert_int_equal(kvf_sm_rep_end(&r, 1, 1), KVF_ERR_PROTOCOL);
    kvf_wr_free(&w);
}

static void test_tier_op(void **state)
{
    kvf_sm_tier_op_t o = {0}, o2;
    kvf_wr_t w;
    kvf_rd_t r;

    (void)state;
    o.op = KVF_TIER_READ;
    o.key = "blk/1";
    o.pool_off = 640;
    o.disk_off = 8192;
    o.size = 5000;
    o.checksum = 0x1234;
    o.seq = 7;
    o.flags = KVF_STORE_PIN;
    kvf_wr_init(&w);
    kvf_sm_tier_op_enc(&w, &o);
    assert_int_equal(w.len, 5 + KVF_SM_TIER_OP_FIXED);
    assert_int_equal(kvf_sm_req_check(KVF_SP_TIER_OP, 1, w.buf, w.len), KVF_OK);
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_tier_op_dec(&r, &o2);
    assert_int_equal(kvf_rd_end(&r), KVF_OK);
    assert_string_equal(o2.key, "blk/1");
    assert_int_equal(o2.op, KVF_TIER_READ);
    assert_int_equal(o2.pool_off, 640);
    assert_int_equal(o2.disk_off, 8192);
    assert_int_equal(o2.size, 5000);
    assert_int_equal(o2.checksum, 0x1234);
    assert_int_equal(o2.seq, 7);
    assert_int_equal(o2.flags, KVF_STORE_PIN);
    /* a count that disagrees, a trailing byte, an unknown op */
    assert_int_equal(kvf_sm_req_check(KVF_SP_TIER_OP, 2, w.buf, w.len),
                     KVF_ERR_PROTOCOL);
    assert_int_equal(kvf_sm_req_check(KVF_SP_TIER_OP, 1, w.buf, w.len - 1),
                     KVF_ERR_PROTOCOL);
    w.buf[0] = 9;
    assert_int_equal(kvf_sm_req_check(KVF_SP_TIER_OP, 1, w.buf, w.len),
                     KVF_ERR_PROTOCOL);
    kvf_wr_free(&w);
}

static void test_check(void **state)
{
    static char big[KVF_STORE_KEY_MAX + 2];
    kvf_sm_req_t d;
    kvf_wr_t w;
    kvf_rd_t r;

    (void)state;
    kvf_wr_init(&w);
    kvf_sm_key_enc(&w, "a");
    kvf_sm_key_enc(&w, "b");
    assert_int_equal(kvf_sm_req_check(KVF_SP_GET, 2, w.buf, w.len), KVF_OK);
    assert_int_equal(kvf_sm_req_check(KVF_SP_REMOVE, 2, w.buf, w.len), KVF_OK);
    assert_int_equal(kvf_sm_req_check(KVF_SP_GET, 1, w.buf, w.len),
                     KVF_ERR_PROTOCOL); /* trailing bytes */
    assert_int_equal(kvf_sm_req_check(KVF_SP_GET, 3, w.buf, w.len),
                     KVF_ERR_PROTOCOL); /* truncated */
    assert_int_equal(kvf_sm_req_check(KVF_SP_PUT_END, 2, w.buf, w.len),
                     KVF_ERR_PROTOCOL); /* another type's shape */
    assert_int_equal(kvf_sm_req_check(0x55, 0, NULL, 0), KVF_ERR_PROTOCOL);
    assert_int_equal(kvf_sm_req_check(KVF_SP_GET, 0, NULL, 0), KVF_OK);
    assert_int_equal(
        kvf_sm_req_check(KVF_SP_GET, KVF_STORE_BATCH_MAX + 1, w.buf, w.len),
        KVF_ERR_PROTOCOL);
    /* a key too long or empty: a verdict for that key, not a bad body */
    memset(big, 'k', KVF_STORE_KEY_MAX + 1);
    w.len = 0;
    kvf_sm_key_enc(&w, big);
    kvf_sm_key_enc(&w, "");
    assert_int_equal(kvf_sm_req_check(KVF_SP_EXISTS, 2, w.buf, w.len), KVF_OK);
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_key_dec(&r, &d);
    assert_int_equal(d.key_status, KVF_ERR_KEY_TOO_LARGE);
    kvf_sm_key_dec(&r, &d);
    assert_int_equal(d.key_status, KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_rd_status(&r), KVF_OK);
    kvf_wr_free(&w);
}

static void test_inventory(void **state)
{
    kvf_sm_inv_ent_t e = {.key = "obj/1",
                          .off = 4096,
                          .size = 1000,
                          .checksum = 0x1122334455667788ull,
                          .epoch = (1ull << 63) | 42,
                          .seq = 9,
                          .flags = 1};
    kvf_sm_inv_ent_t d;
    kvf_wr_t w;
    kvf_rd_t r;

    (void)state;
    kvf_wr_init(&w);
    kvf_sm_inv_ent_enc(&w, &e);
    assert_int_equal(w.len, KVF_SM_INV_ENT_FIXED + 5);
    kvf_sm_inv_ent_enc(&w, &e);
    kvf_rd_init(&r, w.buf, w.len);
    kvf_sm_inv_ent_dec(&r, &d);
    assert_int_equal(kvf_rd_status(&r), KVF_OK);
    assert_string_equal(d.key, "obj/1");
    assert_int_equal(d.off, e.off);
    assert_int_equal(d.size, e.size);
    assert_int_equal(d.checksum, e.checksum);
    assert_int_equal(d.epoch, e.epoch);
    assert_int_equal(d.seq, e.seq);
    assert_int_equal(d.flags, e.flags);
    assert_int_equal(kvf_sm_inv_check(KVF_SP_INV_ADD, 2, w.buf, w.len), KVF_OK);
    assert_int_equal(kvf_sm_inv_check(KVF_SP_INV_ADD, 1, w.buf, w.len),
                     KVF_ERR_PROTOCOL);
    assert_int_equal(kvf_sm_inv_check(KVF_SP_INV_ADD, 3, w.buf, w.len),
                     KVF_ERR_PROTOCOL);
    assert_int_equal(kvf_sm_inv_check(KVF_SP_INV_ADD, 0, w.buf, 0),
                     KVF_ERR_PROTOCOL);
    assert_int_equal(kvf_sm_inv_check(KVF_SP_INV_ADD, 2, w.buf, w.len - 1),
                     KVF_ERR_PROTOCOL);
    assert_int_equal(
        kvf_sm_inv_check(KVF_SP_INV_ADD, KVF_STORE_BATCH_MAX + 1, w.buf, w.len),
        KVF_ERR_PROTOCOL);
    assert_int_equal(kvf_sm_inv_check(KVF_SP_GET, 2, w.buf, w.len),
                     KVF_ERR_PROTOCOL);
    assert_int_equal(kvf_sm_req_check(KVF_SP_INV_DEL, 2, w.buf, w.len), KVF_OK);
    /* a report: uid and node_gen first; count 0 ends it */
    assert_int_equal(kvf_sm_inv_check(KVF_SP_INV_REPORT, 0, w.buf, 16), KVF_OK);
    assert_int_equal(kvf_sm_inv_check(KVF_SP_INV_REPORT, 0, w.buf, 15),
                     KVF_ERR_PROTOCOL);
    assert_int_equal(kvf_sm_inv_check(KVF_SP_INV_DEL, 0, w.buf, 0),
                     KVF_ERR_PROTOCOL);
    kvf_wr_free(&w);
    e.key = "";
    kvf_wr_init(&w);
    kvf_sm_inv_ent_enc(&w, &e);
    assert_int_equal(kvf_sm_inv_check(KVF_SP_INV_ADD, 1, w.buf, w.len),
                     KVF_ERR_PROTOCOL);
    kvf_wr_free(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_end_bytes),
        cmocka_unit_test(test_requests_round_trip),
        cmocka_unit_test(test_replies_round_trip),
        cmocka_unit_test(test_whole_bodies),
        cmocka_unit_test(test_tier_op),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_inventory),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
