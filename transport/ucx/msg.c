/*
 * ucx transport, side channel codec (see msg.h): bounds and schema of
 * every message, so that a garbled or hostile frame is refused with a
 * clear status before any field reaches UCX.
 */
#include "transport/ucx/msg.h"
#include "core/log.h"

kvf_status_t kvf_ucx_hdr_check(const kvf_frame_hdr_t *h)
{
    size_t want;

    switch (h->type) {
    case KVF_UCX_HELLO:
        want = 0;
        break;
    case KVF_UCX_RKEY:
        want = KVF_UCX_RANGE_LEN;
        break;
    case KVF_UCX_HELLO_RESP:
        if (h->status != KVF_OK) {
            return h->meta_len == 0 ? KVF_OK : KVF_ERR_PROTOCOL;
        }
        return kvf_ucx_addr_check(h->meta_len);
    case KVF_UCX_RKEY_RESP:
        if (h->status != KVF_OK) {
            return h->meta_len == 0 ? KVF_OK : KVF_ERR_PROTOCOL;
        }
        return (h->meta_len >= KVF_UCX_RANGE_LEN + 4 &&
                h->meta_len <= KVF_UCX_RANGE_LEN + 4 + KVF_UCX_RKEY_MAX)
                   ? KVF_OK
                   : KVF_ERR_PROTOCOL;
    case KVF_UCX_SUM:
        if (h->count == 0 || h->count > KVF_UCX_SUM_MAX) {
            return KVF_ERR_PROTOCOL;
        }
        want = (size_t)h->count * KVF_UCX_RANGE_LEN;
        break;
    case KVF_UCX_SUM_RESP:
        if (h->status != KVF_OK) {
            return h->meta_len == 0 ? KVF_OK : KVF_ERR_PROTOCOL;
        }
        if (h->count == 0 || h->count > KVF_UCX_SUM_MAX) {
            return KVF_ERR_PROTOCOL;
        }
        want = (size_t)h->count * 8;
        break;
    default:
        return KVF_ERR_PROTOCOL;
    }
    return (h->meta_len == want && h->data_len == 0) ? KVF_OK
                                                     : KVF_ERR_PROTOCOL;
}

void kvf_ucx_range_enc(kvf_wr_t *w, uint64_t addr, uint64_t len)
{
    kvf_wr_u64(w, addr);
    kvf_wr_u64(w, len);
}

kvf_status_t kvf_ucx_range_dec(kvf_rd_t *r, uint64_t *addr_p, uint64_t *len_p)
{
    uint64_t addr = kvf_rd_u64(r), len = kvf_rd_u64(r);

    if (kvf_rd_status(r) != KVF_OK) {
        return KVF_ERR_PROTOCOL;
    }
    if (len == 0 || addr + len < addr) {
        return KVF_ERR_PROTOCOL;
    }
    *addr_p = addr;
    *len_p = len;
    return KVF_OK;
}

void kvf_ucx_rkey_enc(kvf_wr_t *w, uint64_t base, uint64_t len,
                      const void *rkey, uint32_t rkey_len)
{
    kvf_ucx_range_enc(w, base, len);
    kvf_wr_u32(w, rkey_len);
    kvf_wr_bytes(w, rkey, rkey_len);
}

kvf_status_t kvf_ucx_rkey_dec(const void *buf, size_t n, uint64_t addr,
                              uint64_t len, kvf_ucx_rkey_msg_t *m_p)
{
    kvf_ucx_rkey_msg_t m;
    kvf_rd_t r;

    kvf_rd_init(&r, buf, n);
    if (kvf_ucx_range_dec(&r, &m.base, &m.len) != KVF_OK) {
        kvf_error("ucx: remote key reply with a bad region");
        return KVF_ERR_PROTOCOL;
    }
    m.rkey_len = kvf_rd_u32(&r);
    if (kvf_rd_status(&r) != KVF_OK || m.rkey_len == 0 ||
        m.rkey_len > KVF_UCX_RKEY_MAX) {
        kvf_error("ucx: remote key of %u bytes (1..%u)", m.rkey_len,
                  KVF_UCX_RKEY_MAX);
        return KVF_ERR_PROTOCOL;
    }
    m.rkey = kvf_rd_bytes(&r, m.rkey_len);
    if (m.rkey == NULL || kvf_rd_end(&r) != KVF_OK) {
        kvf_error("ucx: remote key reply of %zu bytes, malformed", n);
        return KVF_ERR_PROTOCOL;
    }
    if (addr < m.base || addr - m.base > m.len ||
        len > m.len - (addr - m.base)) {
        kvf_error("ucx: remote key for 0x%lx+%lu does not hold 0x%lx+%lu",
                  (unsigned long)m.base, (unsigned long)m.len,
                  (unsigned long)addr, (unsigned long)len);
        return KVF_ERR_PROTOCOL;
    }
    *m_p = m;
    return KVF_OK;
}

kvf_status_t kvf_ucx_addr_check(size_t len)
{
    if (len == 0 || len > KVF_UCX_ADDR_MAX) {
        kvf_error("ucx: worker address of %zu bytes (1..%u)", len,
                  KVF_UCX_ADDR_MAX);
        return KVF_ERR_PROTOCOL;
    }
    return KVF_OK;
}
