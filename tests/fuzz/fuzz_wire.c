/*
 * libFuzzer target: core/wire.c's frame header and bounds-checked
 * reader. The input is read as a sequence of typed fields (the kind of
 * each chosen by the input's own bytes) and every value read is written
 * back with the writer: whatever the reader accepted must re-encode to
 * the very bytes it consumed, and no read may pass the end.
 */
#include "core/log.h"
#include "core/wire.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* One field of kind k read from r and written to w; 0 when r failed. */
static int kvf_fuzz_field(kvf_rd_t *r, kvf_wr_t *w, uint8_t k)
{
    char str[40];
    const void *p;
    size_t n;

    switch (k % 6) {
    case 0:
        kvf_wr_u8(w, kvf_rd_u8(r));
        break;
    case 1:
        kvf_wr_u16(w, kvf_rd_u16(r));
        break;
    case 2:
        kvf_wr_u32(w, kvf_rd_u32(r));
        break;
    case 3:
        kvf_wr_u64(w, kvf_rd_u64(r));
        break;
    case 4:
        n = k >> 3;
        p = kvf_rd_bytes(r, n);
        if (p != NULL) {
            kvf_wr_bytes(w, p, n);
        }
        break;
    default:
        kvf_rd_str(r, str, sizeof(str));
        if (kvf_rd_status(r) == KVF_OK) {
            kvf_wr_str(w, str);
        }
        break;
    }
    return kvf_rd_status(r) == KVF_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    unsigned char fixed[64], hb[KVF_WIRE_HDR_LEN];
    kvf_frame_hdr_t h;
    size_t i, off;
    kvf_wr_t w, fw;
    kvf_rd_t r;

    kvf_log_set_level((kvf_log_level_t)-1);
    if (size >= KVF_WIRE_HDR_LEN && kvf_frame_unpack(data, &h) == KVF_OK) {
        kvf_frame_pack(&h, hb);
        if (memcmp(hb, data, KVF_WIRE_HDR_LEN) != 0) {
            abort(); /* unpack then pack must give the same bytes */
        }
    }
    kvf_rd_init(&r, data, size);
    kvf_wr_init(&w);
    kvf_wr_init_fixed(&fw, fixed, sizeof(fixed));
    for (i = 0; i < size && kvf_fuzz_field(&r, &w, data[i]); i++) {
    }
    off = size - kvf_rd_left(&r);
    if (kvf_rd_status(&r) == KVF_OK &&
        (kvf_wr_status(&w) != KVF_OK || w.len != off ||
         (off > 0 && memcmp(w.buf, data, off) != 0))) {
        abort(); /* what was read must re-encode to the bytes consumed */
    }
    if (kvf_rd_left(&r) > size ||
        (kvf_rd_end(&r) == KVF_OK) !=
            (off == size && kvf_rd_status(&r) == KVF_OK)) {
        abort();
    }
    kvf_wr_bytes(&fw, data, size);
    if ((kvf_wr_status(&fw) == KVF_OK) != (size <= sizeof(fixed))) {
        abort(); /* a fixed writer fails exactly when the buffer is full */
    }
    kvf_wr_free(&fw);
    kvf_wr_free(&w);
    return 0;
}
