/*
 * Unit test: the tcp transport's message codec (transport/tcp/msg.c).
 * Every message round-trips encode -> decode with its fields intact and
 * the schema's rules hold; every truncated or padded message, a
 * mismatched count or payload and an unknown type are refused.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "transport/tcp/msg.h"

/* header + metadata of one message in buf; returns its length */
static size_t kvf_t_frame(unsigned char *buf, uint8_t type, uint32_t count,
                          uint64_t data_len, const kvf_wr_t *meta)
{
    kvf_frame_hdr_t h;

    kvf_tcp_hdr_init(&h, type, 99, KVF_OK, count, data_len);
    if (meta != NULL && type == KVF_TCP_DESC) {
        h.meta_len = (uint32_t)meta->len;
    }
    kvf_frame_pack(&h, buf);
    if (meta != NULL && meta->len > 0) {
        memcpy(buf + KVF_WIRE_HDR_LEN, meta->buf, meta->len);
    }
    return KVF_WIRE_HDR_LEN + (meta ? meta->len : 0);
}

/* Every strict prefix of buf[0..len) and one byte more are refused. */
static void kvf_t_refuse_resized(const unsigned char *buf, size_t len)
{
    unsigned char big[1024];
    kvf_frame_hdr_t h;
    size_t n;

    for (n = 0; n < len; n++) {
        assert_int_not_equal(kvf_tcp_msg_decode(buf, n, &h), KVF_OK);
    }
    memcpy(big, buf, len);
    big[len] = 0;
    assert_int_not_equal(kvf_tcp_msg_decode(big, len + 1, &h), KVF_OK);
}

static void test_entries_roundtrip(void **state)
{
    static const uint8_t types[] = {KVF_TCP_WRITE, KVF_TCP_READ, KVF_TCP_SUM};
    unsigned char buf[512];
    kvf_tcp_entry_t e;
    kvf_frame_hdr_t h;
    size_t len, t;
    kvf_wr_t w;
    kvf_rd_t r;

    (void)state;
    for (t = 0; t < sizeof(types); t++) {
        kvf_wr_init(&w);
        kvf_tcp_entry_enc(&w, 0x7f0000001000ull, 8192);
        kvf_tcp_entry_enc(&w, 0xffffffffffff0000ull, 1);
        len = kvf_t_frame(buf, types[t], 2,
                          types[t] == KVF_TCP_WRITE ? 8193 : 0, &w);
        assert_int_equal(len, KVF_WIRE_HDR_LEN + 2 * KVF_TCP_ENTRY_LEN);
        assert_int_equal(kvf_tcp_msg_decode(buf, len, &h), KVF_OK);
        assert_int_equal(h.type, types[t]);
        assert_int_equal(h.count, 2);
        assert_int_equal(h.id, 99);
        kvf_rd_init(&r, buf + KVF_WIRE_HDR_LEN, h.meta_len);
        kvf_tcp_entry_dec(&r, &e);
        assert_true(e.addr == 0x7f0000001000ull && e.len == 8192);
        kvf_tcp_entry_dec(&r, &e);
        assert_true(e.addr == 0xffffffffffff0000ull && e.len == 1);
        assert_int_equal(kvf_rd_end(&r), KVF_OK);
        kvf_t_refuse_resized(buf, len);
        kvf_wr_free(&w);
    }
}

static void test_replies_roundtrip(void **state)
{
    unsigned char buf[512];
    kvf_tcp_refusal_t f;
    kvf_frame_hdr_t h;
    size_t len;
    kvf_wr_t w;
    kvf_rd_t r;

    (void)state;
    kvf_wr_init(&w);
    kvf_tcp_refusal_enc(&w, 3, KVF_ERR_OUT_OF_BOUNDS);
    kvf_tcp_refusal_enc(&w, 7, KVF_OK); /* not an error: decodes as one */
    len = kvf_t_frame(buf, KVF_TCP_READ_RESP, 2, 4096, &w);
    assert_int_equal(kvf_tcp_msg_decode(buf, len, &h), KVF_OK);
    assert_true(h.data_len == 4096);
    kvf_rd_init(&r, buf + KVF_WIRE_HDR_LEN, h.meta_len);
    kvf_tcp_refusal_dec(&r, &f);
    assert_int_equal(f.index, 3);
    assert_int_equal(f.status, KVF_ERR_OUT_OF_BOUNDS);
    kvf_tcp_refusal_dec(&r, &f);
    assert_int_equal(f.index, 7);
    assert_int_equal(f.status, KVF_ERR_PROTOCOL);
    kvf_t_refuse_resized(buf, len);
    len = kvf_t_frame(buf, KVF_TCP_WRITE_ACK, 2, 0, &w);
    assert_int_equal(kvf_tcp_msg_decode(buf, len, &h), KVF_OK);
    kvf_t_refuse_resized(buf, len);

    w.len = 0;
    kvf_tcp_sum_enc(&w, 0x1122334455667788ull);
    len = kvf_t_frame(buf, KVF_TCP_SUM_RESP, 1, 0, &w);
    assert_int_equal(kvf_tcp_msg_decode(buf, len, &h), KVF_OK);
    kvf_rd_init(&r, buf + KVF_WIRE_HDR_LEN, h.meta_len);
    assert_true(kvf_tcp_sum_dec(&r) == 0x1122334455667788ull);
    kvf_t_refuse_resized(buf, len);

    w.len = 0;
    kvf_wr_bytes(&w, "desc", 4);
    len = kvf_t_frame(buf, KVF_TCP_DESC, 0, 0, &w);
    assert_int_equal(kvf_tcp_msg_decode(buf, len, &h), KVF_OK);
    assert_int_equal(h.meta_len, 4);
    kvf_wr_free(&w);
}

static void test_header_only(void **state)
{
    static const uint8_t types[] = {KVF_TCP_HELLO, KVF_TCP_LINK_RESP,
                                    KVF_TCP_ERROR};
    unsigned char buf[64];
    kvf_frame_hdr_t h;
    size_t t, len;

    (void)state;
    for (t = 0; t < sizeof(types); t++) {
        len = kvf_t_frame(buf, types[t], 0, 0, NULL);
        assert_int_equal(kvf_tcp_msg_decode(buf, len, &h), KVF_OK);
        assert_int_equal(h.type, types[t]);
        assert_int_equal(h.meta_len, 0);
        kvf_t_refuse_resized(buf, len);
    }
}

/* The schema's rules, one broken at a time. */
static void test_schema_rules(void **state)
{
    kvf_frame_hdr_t h;
    unsigned char meta[2 * KVF_TCP_ENTRY_LEN];
    kvf_wr_t w;

    (void)state;
    kvf_tcp_hdr_init(&h, 12, 1, KVF_OK, 0, 0); /* unknown type */
    assert_int_equal(kvf_tcp_hdr_check(&h), KVF_ERR_PROTOCOL);
    kvf_tcp_hdr_init(&h, KVF_TCP_HELLO, 1, KVF_OK, 0, 1); /* payload */
    assert_int_equal(kvf_tcp_hdr_check(&h), KVF_ERR_PROTOCOL);
    kvf_tcp_hdr_init(&h, KVF_TCP_READ, 1, KVF_OK, 2, 0);
    assert_int_equal(kvf_tcp_hdr_check(&h), KVF_OK);
    h.meta_len -= 1; /* count and metadata disagree */
    assert_int_equal(kvf_tcp_hdr_check(&h), KVF_ERR_PROTOCOL);
    kvf_tcp_hdr_init(&h, KVF_TCP_LINK_READ, 1, KVF_OK, 2, 0); /* not one */
    assert_int_equal(kvf_tcp_hdr_check(&h), KVF_ERR_PROTOCOL);
    kvf_tcp_hdr_init(&h, KVF_TCP_DESC, 1, KVF_OK, 1, 0); /* count */
    assert_int_equal(kvf_tcp_hdr_check(&h), KVF_ERR_PROTOCOL);

    kvf_wr_init_fixed(&w, meta, sizeof(meta));
    kvf_tcp_entry_enc(&w, 4096, 100);
    kvf_tcp_entry_enc(&w, 8192, 28);
    kvf_tcp_hdr_init(&h, KVF_TCP_WRITE, 1, KVF_OK, 2, 128);
    assert_int_equal(kvf_tcp_entries_check(&h, meta), KVF_OK);
    h.data_len = 127; /* payload and entries disagree */
    assert_int_equal(kvf_tcp_entries_check(&h, meta), KVF_ERR_PROTOCOL);
    w.len = 0;
    kvf_tcp_entry_enc(&w, 0, UINT64_MAX); /* above KVF_WIRE_DATA_MAX */
    kvf_tcp_entry_enc(&w, 0, 1);
    kvf_tcp_hdr_init(&h, KVF_TCP_READ, 1, KVF_OK, 2, 0);
    assert_int_equal(kvf_tcp_entries_check(&h, meta), KVF_ERR_PROTOCOL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_entries_roundtrip),
        cmocka_unit_test(test_replies_roundtrip),
        cmocka_unit_test(test_header_only),
        cmocka_unit_test(test_schema_rules),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
