/*
 * Unit test: the shm transport's message codec (transport/shm/msg.c).
 * Every message and the probe page round-trip encode -> decode with
 * their fields intact; every truncated or padded message, a count that
 * disagrees with the metadata and a GRANT listing too many allocations
 * are refused.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "transport/shm/msg.h"

/* header + metadata of one message in buf; returns its length */
static size_t kvf_t_frame(unsigned char *buf, uint8_t type, uint32_t count,
                          const kvf_wr_t *w)
{
    kvf_frame_hdr_t h = {
        .magic = KVF_WIRE_MAGIC,
        .version = KVF_WIRE_VERSION,
        .type = type,
        .meta_len = (uint32_t)w->len,
        .count = count,
    };

    kvf_frame_pack(&h, buf);
    if (w->len > 0) {
        memcpy(buf + KVF_WIRE_HDR_LEN, w->buf, w->len);
    }
    return KVF_WIRE_HDR_LEN + w->len;
}

/* The message decodes whole; every other length of it is refused, also
 * with the header's meta_len made to match (truncated metadata). */
static void kvf_t_decodes_exactly(const unsigned char *buf, size_t len)
{
    unsigned char cut[4096];
    kvf_frame_hdr_t h;
    size_t n;

    assert_int_equal(kvf_shm_msg_decode(buf, len, &h), KVF_OK);
    for (n = 0; n < len; n++) {
        assert_int_not_equal(kvf_shm_msg_decode(buf, n, &h), KVF_OK);
    }
    memcpy(cut, buf, len);
    cut[len] = 0;
    assert_int_not_equal(kvf_shm_msg_decode(cut, len + 1, &h), KVF_OK);
    for (n = KVF_WIRE_HDR_LEN; n < len; n++) { /* meta_len = what is left */
        kvf_frame_unpack(buf, &h);
        h.meta_len = (uint32_t)(n - KVF_WIRE_HDR_LEN);
        kvf_frame_pack(&h, cut);
        assert_int_not_equal(kvf_shm_msg_decode(cut, n, &h), KVF_OK);
    }
}

static void test_handshake(void **state)
{
    kvf_shm_hello_t hello = {KVF_SHM_PROTO, {0}, 0x1122334455667788ull}, h2;
    kvf_shm_hello_ack_t ack = {4242, 17}, a2;
    unsigned char buf[256], page[KVF_SHM_PROBE_LEN];
    unsigned char nonce[KVF_SHM_NONCE_LEN];
    uint64_t host_id;
    size_t len;
    kvf_wr_t w;

    (void)state;
    memcpy(hello.nonce, "0123456789abcdef", KVF_SHM_NONCE_LEN);
    kvf_wr_init(&w);
    kvf_shm_hello_enc(&w, &hello);
    assert_int_equal(w.len, KVF_SHM_HELLO_LEN);
    assert_int_equal(kvf_shm_hello_dec(w.buf, w.len, &h2), KVF_OK);
    assert_int_equal(h2.version, KVF_SHM_PROTO);
    assert_memory_equal(h2.nonce, hello.nonce, KVF_SHM_NONCE_LEN);
    assert_true(h2.host_id == hello.host_id);
    len = kvf_t_frame(buf, KVF_SHM_HELLO, 0, &w);
    kvf_t_decodes_exactly(buf, len);

    w.len = 0;
    kvf_shm_hello_ack_enc(&w, &ack);
    assert_int_equal(kvf_shm_hello_ack_dec(w.buf, w.len, &a2), KVF_OK);
    assert_int_equal(a2.pid, 4242);
    assert_true(a2.epoch == 17);
    assert_int_not_equal(kvf_shm_hello_ack_dec(w.buf, w.len - 1, &a2), KVF_OK);
    len = kvf_t_frame(buf, KVF_SHM_HELLO_ACK, 0, &w);
    kvf_t_decodes_exactly(buf, len);
    kvf_wr_free(&w);

    kvf_shm_probe_enc(page, sizeof(page), hello.nonce, hello.host_id);
    assert_memory_equal(page, "KVFSHM1", 8);
    assert_int_equal(kvf_shm_probe_dec(page, sizeof(page), nonce, &host_id),
                     KVF_OK);
    assert_memory_equal(nonce, hello.nonce, KVF_SHM_NONCE_LEN);
    assert_true(host_id == hello.host_id);
    assert_int_not_equal(kvf_shm_probe_dec(page, 31, nonce, &host_id), KVF_OK);
    page[0] = 'X';
    assert_int_not_equal(kvf_shm_probe_dec(page, sizeof(page), nonce, &host_id),
                         KVF_OK);
}

static void test_entries_and_lists(void **state)
{
    static const uint8_t etypes[] = {KVF_SHM_BEGIN, KVF_SHM_STAGE, KVF_SHM_SUM};
    uint64_t ids[3] = {5, 6, 7}, epoch;
    unsigned char buf[512];
    kvf_frame_hdr_t h;
    kvf_shm_entry_t e;
    size_t len, t;
    kvf_wr_t w;
    kvf_rd_t r;

    (void)state;
    kvf_wr_init(&w);
    kvf_shm_entry_enc(&w, 0x7f0000001000ull, 8192);
    kvf_shm_entry_enc(&w, 0x7f0000004000ull, 4096);
    for (t = 0; t < sizeof(etypes); t++) {
        len = kvf_t_frame(buf, etypes[t], 2, &w);
        kvf_t_decodes_exactly(buf, len);
        kvf_frame_unpack(buf, &h);
        assert_int_equal(kvf_shm_entries_open(&r, &h, buf + 40), KVF_OK);
        kvf_shm_entry_dec(&r, &e);
        assert_true(e.addr == 0x7f0000001000ull && e.len == 8192);
        kvf_shm_entry_dec(&r, &e);
        assert_true(e.addr == 0x7f0000004000ull && e.len == 4096);
        assert_int_equal(kvf_rd_end(&r), KVF_OK);
        h.count = 3; /* count and metadata disagree */
        assert_int_not_equal(kvf_shm_entries_open(&r, &h, buf + 40), KVF_OK);
    }

    w.len = 0;
    kvf_shm_id_enc(&w, 5);
    kvf_shm_id_enc(&w, 6);
    kvf_shm_id_enc(&w, 7);
    len = kvf_t_frame(buf, KVF_SHM_SYNC, 3, &w);
    kvf_t_decodes_exactly(buf, len);
    len = kvf_t_frame(buf, KVF_SHM_SUM_ACK, 3, &w);
    kvf_t_decodes_exactly(buf, len);
    kvf_frame_unpack(buf, &h);
    assert_int_equal(kvf_shm_ids_open(&r, &h, buf + 40), KVF_OK);
    assert_true(kvf_shm_id_dec(&r) == 5 && kvf_shm_id_dec(&r) == 6 &&
                kvf_shm_id_dec(&r) == 7);

    w.len = 0;
    kvf_shm_sync_ack_enc(&w, 99, ids, 3);
    len = kvf_t_frame(buf, KVF_SHM_SYNC_ACK, 3, &w);
    kvf_t_decodes_exactly(buf, len);
    kvf_frame_unpack(buf, &h);
    assert_int_equal(kvf_shm_sync_ack_open(&r, &h, buf + 40, &epoch), KVF_OK);
    assert_true(epoch == 99);
    assert_true(kvf_shm_id_dec(&r) == 5 && kvf_shm_id_dec(&r) == 6 &&
                kvf_shm_id_dec(&r) == 7);
    assert_int_equal(kvf_rd_end(&r), KVF_OK);
    kvf_wr_free(&w);
}

static void test_grant_map(void **state)
{
    kvf_shm_exc_t excs[3] = {
        {0, KVF_INPROGRESS}, {2, KVF_ERR_OUT_OF_BOUNDS}, {4, 5}};
    kvf_shm_grant_t g = {.epoch = 8, .left_ms = 4500, .nallocs = 2, .nexc = 3};
    kvf_shm_grant_t g2;
    kvf_shm_alloc_t a;
    unsigned char buf[4096];
    kvf_shm_exc_t e;
    uint64_t id;
    size_t len;
    kvf_wr_t w;
    kvf_rd_t r;

    (void)state;
    g.allocs[0] = (kvf_shm_alloc_t){11, 0x7f0000000000ull, 1 << 30, 1 << 20, 0};
    g.allocs[1] = (kvf_shm_alloc_t){12, 0x7f8000000000ull, 4096, 8192, 0};
    kvf_wr_init(&w);
    kvf_shm_grant_enc(&w, &g, excs);
    assert_int_equal(w.len, KVF_SHM_GRANT_HEAD_LEN +
                                2 * KVF_SHM_GRANT_ALLOC_LEN +
                                3 * KVF_SHM_EXC_LEN);
    len = kvf_t_frame(buf, KVF_SHM_GRANT, 3, &w);
    kvf_t_decodes_exactly(buf, len);
    assert_int_equal(kvf_shm_grant_dec(&r, w.buf, w.len, &g2), KVF_OK);
    assert_true(g2.epoch == 8);
    assert_int_equal(g2.left_ms, 4500);
    assert_int_equal(g2.nallocs, 2);
    assert_int_equal(g2.nexc, 3);
    assert_true(g2.allocs[0].id == 11 && g2.allocs[0].range == 1 << 20);
    assert_true(g2.allocs[1].id == 12 && g2.allocs[1].len == 4096);
    assert_true(g2.allocs[1].range == 0); /* larger than the allocation */
    kvf_shm_exc_dec(&r, &e);
    assert_true(e.index == 0 && e.status == KVF_INPROGRESS);
    kvf_shm_exc_dec(&r, &e);
    assert_true(e.index == 2 && e.status == KVF_ERR_OUT_OF_BOUNDS);
    kvf_shm_exc_dec(&r, &e);
    assert_true(e.index == 4 && e.status == KVF_ERR_PROTOCOL);
    assert_int_equal(kvf_rd_end(&r), KVF_OK);
    /* more allocations than a lease may list */
    g.nallocs = KVF_SHM_LEASE_ALLOCS + 1;
    w.len = 0;
    kvf_shm_grant_enc(&w, &g, excs);
    kvf_wr_u64(&w, 0); /* the 65th, which grant_enc does not write */
    kvf_wr_u64(&w, 0);
    kvf_wr_u64(&w, 0);
    kvf_wr_u64(&w, 0);
    assert_int_not_equal(kvf_shm_grant_dec(&r, w.buf, w.len, &g2), KVF_OK);

    w.len = 0;
    kvf_shm_map_enc(&w, 11);
    assert_int_equal(kvf_shm_map_dec(w.buf, w.len, &id), KVF_OK);
    assert_true(id == 11);
    len = kvf_t_frame(buf, KVF_SHM_MAP, 0, &w);
    kvf_t_decodes_exactly(buf, len);
    w.len = 0;
    g.allocs[0].off = 1 << 21;
    kvf_shm_map_ack_enc(&w, &g.allocs[0]);
    assert_int_equal(w.len, KVF_SHM_MAP_ACK_LEN);
    assert_int_equal(kvf_shm_map_ack_dec(w.buf, w.len, &a), KVF_OK);
    assert_true(a.id == 11 && a.base == 0x7f0000000000ull && a.len == 1 << 30 &&
                a.range == 0 && a.off == 1 << 21);
    len = kvf_t_frame(buf, KVF_SHM_MAP_ACK, 0, &w);
    kvf_t_decodes_exactly(buf, len);
    w.len = 0;
    len = kvf_t_frame(buf, KVF_SHM_END, 0, &w);
    kvf_t_decodes_exactly(buf, len);
    kvf_wr_free(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handshake),
        cmocka_unit_test(test_entries_and_lists),
        cmocka_unit_test(test_grant_map),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
