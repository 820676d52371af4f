/*
 * libFuzzer target: the tcp transport's message codec
 * (transport/tcp/msg.c). The input is one message as it arrives: a frame
 * header, then its metadata. Whatever decodes must satisfy the schema
 * and re-encode to the same bytes (header and entry lists).
 */
#include "transport/tcp/msg.h"
#include "core/log.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Entry lists decode and re-encode to the same bytes. */
static void kvf_fuzz_entries(const kvf_frame_hdr_t *h, const uint8_t *meta)
{
    kvf_tcp_entry_t e;
    uint64_t sum = 0;
    kvf_wr_t w;
    kvf_rd_t r;
    uint32_t i;

    kvf_rd_init(&r, meta, h->meta_len);
    kvf_wr_init(&w);
    for (i = 0; i < h->count; i++) {
        kvf_tcp_entry_dec(&r, &e);
        kvf_tcp_entry_enc(&w, e.addr, e.len);
        sum += e.len;
    }
    if (kvf_rd_end(&r) != KVF_OK || w.len != h->meta_len ||
        (w.len > 0 && memcmp(w.buf, meta, w.len) != 0)) {
        abort();
    }
    if ((h->type == KVF_TCP_WRITE || h->type == KVF_TCP_LINK_WRITE) &&
        sum != h->data_len) {
        abort(); /* accepted a payload that does not match its entries */
    }
    kvf_wr_free(&w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    unsigned char hb[KVF_WIRE_HDR_LEN];
    kvf_frame_hdr_t h;

    kvf_log_set_level((kvf_log_level_t)-1);
    if (kvf_tcp_msg_decode(data, size, &h) != KVF_OK) {
        return 0;
    }
    if (kvf_tcp_hdr_check(&h) != KVF_OK ||
        size != KVF_WIRE_HDR_LEN + (size_t)h.meta_len) {
        abort();
    }
    kvf_frame_pack(&h, hb);
    if (memcmp(hb, data, sizeof(hb)) != 0) {
        abort();
    }
    if (kvf_tcp_elem_len(h.type) == KVF_TCP_ENTRY_LEN) {
        kvf_fuzz_entries(&h, data + KVF_WIRE_HDR_LEN);
    }
    return 0;
}
