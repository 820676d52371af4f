/*
 * libFuzzer target: the ucx transport's side channel codec
 * (transport/ucx/msg.c), which bounds what a target hands an initiator
 * before UCX sees it. The input is one message as it arrives: a frame
 * header, then its metadata. A header that passes the schema check is
 * followed into its body: a remote key reply must hold the asked range
 * and re-encode to the same bytes; ranges never wrap.
 */
#include "transport/ucx/msg.h"
#include "core/log.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void kvf_fuzz_rkey(const uint8_t *meta, size_t n)
{
    kvf_ucx_rkey_msg_t m;
    uint64_t addr, len;
    kvf_wr_t w;
    kvf_rd_t r;

    /* ask for the range the reply names (first 16 bytes), then a byte */
    kvf_rd_init(&r, meta, n);
    if (kvf_ucx_range_dec(&r, &addr, &len) != KVF_OK) {
        return;
    }
    if (kvf_ucx_rkey_dec(meta, n, addr, len, &m) != KVF_OK) {
        return;
    }
    if (m.rkey_len == 0 || m.rkey_len > KVF_UCX_RKEY_MAX ||
        m.base + m.len < m.base) {
        abort();
    }
    kvf_wr_init(&w);
    kvf_ucx_rkey_enc(&w, m.base, m.len, m.rkey, m.rkey_len);
    if (w.len != n || memcmp(w.buf, meta, n) != 0) {
        abort();
    }
    kvf_wr_free(&w);
    (void)kvf_ucx_rkey_dec(meta, n, addr + len / 2, len, &m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvf_frame_hdr_t h;
    uint64_t addr, len;
    kvf_rd_t r;
    uint32_t i;

    kvf_log_set_level((kvf_log_level_t)-1);
    if (size < KVF_WIRE_HDR_LEN || kvf_frame_unpack(data, &h) != KVF_OK ||
        kvf_ucx_hdr_check(&h) != KVF_OK) {
        return 0;
    }
    data += KVF_WIRE_HDR_LEN;
    size -= KVF_WIRE_HDR_LEN;
    if (h.meta_len > size) {
        return 0; /* truncated: the socket read would wait */
    }
    kvf_rd_init(&r, data, h.meta_len);
    switch (h.type) {
    case KVF_UCX_RKEY_RESP:
        if (h.status == KVF_OK) {
            kvf_fuzz_rkey(data, h.meta_len);
        }
        break;
    case KVF_UCX_RKEY:
    case KVF_UCX_SUM:
        for (i = 0; i < (h.type == KVF_UCX_SUM ? h.count : 1); i++) {
            if (kvf_ucx_range_dec(&r, &addr, &len) == KVF_OK &&
                (len == 0 || addr + len < addr)) {
                abort();
            }
        }
        break;
    case KVF_UCX_HELLO_RESP:
        if (h.status == KVF_OK && kvf_ucx_addr_check(h.meta_len) != KVF_OK) {
            abort();
        }
        break;
    default:
        break;
    }
    return 0;
}
