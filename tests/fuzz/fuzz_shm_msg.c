/*
 * libFuzzer target: the shm transport's message codec
 * (transport/shm/msg.c): the handshake, grants, leases, sync and sums,
 * and the probe page. The input is one message as it arrives (a frame
 * header, then its metadata) and is also read as a probe page. A GRANT
 * that decodes is re-encoded and decoded again to the same values.
 */
#include "transport/shm/msg.h"
#include "core/log.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A decoded GRANT survives encode -> decode unchanged. */
static void kvf_fuzz_grant(const uint8_t *meta, size_t len)
{
    kvf_shm_exc_t excs[64];
    kvf_shm_grant_t g, g2;
    kvf_wr_t w;
    kvf_rd_t r;
    uint32_t k;

    if (kvf_shm_grant_dec(&r, meta, len, &g) != KVF_OK || g.nexc > 64) {
        return;
    }
    for (k = 0; k < g.nexc; k++) {
        kvf_shm_exc_dec(&r, &excs[k]);
    }
    if (kvf_rd_end(&r) != KVF_OK) {
        abort();
    }
    kvf_wr_init(&w);
    kvf_shm_grant_enc(&w, &g, excs);
    if (kvf_shm_grant_dec(&r, w.buf, w.len, &g2) != KVF_OK ||
        g2.nallocs != g.nallocs || g2.nexc != g.nexc ||
        memcmp(g2.allocs, g.allocs, g.nallocs * sizeof(g.allocs[0])) != 0) {
        abort();
    }
    kvf_wr_free(&w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    unsigned char nonce[KVF_SHM_NONCE_LEN];
    kvf_frame_hdr_t h;
    uint64_t host_id;

    kvf_log_set_level((kvf_log_level_t)-1);
    (void)kvf_shm_probe_dec(data, size, nonce, &host_id);
    if (kvf_shm_msg_decode(data, size, &h) != KVF_OK) {
        return 0;
    }
    if (size != KVF_WIRE_HDR_LEN + (size_t)h.meta_len) {
        abort();
    }
    if (h.type == KVF_SHM_GRANT) {
        kvf_fuzz_grant(data + KVF_WIRE_HDR_LEN, h.meta_len);
    }
    return 0;
}
