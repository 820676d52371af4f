/*
 * Frame header packing and the bounds-checked reader/writer.
 */
#include "core/wire.h"
#include "core/alloc.h"

#include <endian.h>
#include <string.h>

/* The n low bytes of v, least significant first, as the wire wants
 * them: one store on a little-endian host instead of a byte loop. */
static inline void kvf_put_le(unsigned char *p, uint64_t v, int n)
{
    uint64_t le = htole64(v);

    memcpy(p, &le, (size_t)n);
}

static inline uint64_t kvf_get_le(const unsigned char *p, int n)
{
    uint64_t le = 0;

    memcpy(&le, p, (size_t)n);
    return le64toh(le);
}

void kvf_frame_pack(const kvf_frame_hdr_t *hdr,
                    unsigned char out[KVF_WIRE_HDR_LEN])
{
    kvf_put_le(out + 0, hdr->magic, 4);
    out[4] = hdr->version;
    out[5] = hdr->type;
    kvf_put_le(out + 6, hdr->flags, 2);
    kvf_put_le(out + 8, hdr->meta_len, 4);
    kvf_put_le(out + 12, hdr->count, 4);
    kvf_put_le(out + 16, hdr->id, 8);
    kvf_put_le(out + 24, hdr->data_len, 8);
    kvf_put_le(out + 32, (uint32_t)hdr->status, 4);
    kvf_put_le(out + 36, hdr->reserved, 4);
}

kvf_status_t kvf_frame_unpack(const unsigned char in[KVF_WIRE_HDR_LEN],
                              kvf_frame_hdr_t *hdr_p)
{
    kvf_frame_hdr_t h;

    h.magic = (uint32_t)kvf_get_le(in + 0, 4);
    h.version = in[4];
    h.type = in[5];
    h.flags = (uint16_t)kvf_get_le(in + 6, 2);
    h.meta_len = (uint32_t)kvf_get_le(in + 8, 4);
    h.count = (uint32_t)kvf_get_le(in + 12, 4);
    h.id = kvf_get_le(in + 16, 8);
    h.data_len = kvf_get_le(in + 24, 8);
    h.status = (int32_t)(uint32_t)kvf_get_le(in + 32, 4);
    h.reserved = (uint32_t)kvf_get_le(in + 36, 4);
    if (h.magic != KVF_WIRE_MAGIC) {
        return KVF_ERR_PROTOCOL;
    }
    if (h.version != KVF_WIRE_VERSION) {
        return KVF_ERR_VERSION;
    }
    if (h.meta_len > KVF_WIRE_META_MAX || h.data_len > KVF_WIRE_DATA_MAX) {
        return KVF_ERR_MSG_TOO_LARGE;
    }
    *hdr_p = h;
    return KVF_OK;
}

void kvf_wr_init(kvf_wr_t *w)
{
    memset(w, 0, sizeof(*w));
}

void kvf_wr_init_fixed(kvf_wr_t *w, void *buf, size_t cap)
{
    memset(w, 0, sizeof(*w));
    w->buf = buf;
    w->cap = cap;
    w->fixed = 1;
}

void kvf_wr_free(kvf_wr_t *w)
{
    if (!w->fixed) {
        kvf_free(w->buf);
    }
    memset(w, 0, sizeof(*w));
}

static unsigned char *kvf_wr_reserve(kvf_wr_t *w, size_t n)
{
    size_t cap;
    unsigned char *nb;

    if (w->failed) {
        return NULL;
    }
    if (n == 0) {
        return w->buf; /* nothing to reserve; NULL before any growth */
    }
    if (n > w->cap - w->len && w->fixed) {
        w->failed = 1;
        return NULL;
    }
    if (w->len + n > w->cap) {
        cap = w->cap ? w->cap : 256;
        while (cap < w->len + n) {
            cap *= 2;
        }
        nb = kvf_realloc(w->buf, cap);
        if (nb == NULL) {
            w->failed = 1;
            return NULL;
        }
        w->buf = nb;
        w->cap = cap;
    }
    w->len += n;
    return w->buf + w->len - n;
}

static void kvf_wr_le(kvf_wr_t *w, uint64_t v, int n)
{
    unsigned char *p = kvf_wr_reserve(w, (size_t)n);

    if (p != NULL) {
        kvf_put_le(p, v, n);
    }
}

void kvf_wr_u8(kvf_wr_t *w, uint8_t v)
{
    kvf_wr_le(w, v, 1);
}

void kvf_wr_u16(kvf_wr_t *w, uint16_t v)
{
    kvf_wr_le(w, v, 2);
}

void kvf_wr_u32(kvf_wr_t *w, uint32_t v)
{
    kvf_wr_le(w, v, 4);
}

void kvf_wr_u64(kvf_wr_t *w, uint64_t v)
{
    kvf_wr_le(w, v, 8);
}

void kvf_wr_bytes(kvf_wr_t *w, const void *p, size_t n)
{
    unsigned char *d = kvf_wr_reserve(w, n);

    if (d != NULL && n > 0) {
        memcpy(d, p, n);
    }
}

void kvf_wr_str(kvf_wr_t *w, const char *s)
{
    size_t n = strlen(s);

    if (n > 0xffff) {
        w->failed = 1;
        return;
    }
    kvf_wr_u16(w, (uint16_t)n);
    kvf_wr_bytes(w, s, n);
}

kvf_status_t kvf_wr_status(const kvf_wr_t *w)
{
    if (!w->failed) {
        return KVF_OK;
    }
    return w->fixed ? KVF_ERR_MSG_TOO_LARGE : KVF_ERR_NO_MEMORY;
}

void kvf_rd_init(kvf_rd_t *r, const void *buf, size_t len)
{
    r->buf = buf;
    r->len = len;
    r->off = 0;
    r->failed = 0;
}

/* What a read of 0 bytes returns over an empty buffer given as NULL. */
static const unsigned char kvf_rd_empty[1];

const void *kvf_rd_bytes(kvf_rd_t *r, size_t n)
{
    const void *p;

    if (r->failed || n > r->len - r->off) {
        r->failed = 1;
        return NULL;
    }
    if (r->buf == NULL) {
        return kvf_rd_empty; /* len is 0, so n is 0 */
    }
    p = r->buf + r->off;
    r->off += n;
    return p;
}

static uint64_t kvf_rd_le(kvf_rd_t *r, int n)
{
    const unsigned char *p = kvf_rd_bytes(r, (size_t)n);

    return (p != NULL) ? kvf_get_le(p, n) : 0;
}

uint8_t kvf_rd_u8(kvf_rd_t *r)
{
    return (uint8_t)kvf_rd_le(r, 1);
}

uint16_t kvf_rd_u16(kvf_rd_t *r)
{
    return (uint16_t)kvf_rd_le(r, 2);
}

uint32_t kvf_rd_u32(kvf_rd_t *r)
{
    return (uint32_t)kvf_rd_le(r, 4);
}

uint64_t kvf_rd_u64(kvf_rd_t *r)
{
    return kvf_rd_le(r, 8);
}

void kvf_rd_str(kvf_rd_t *r, char *out, size_t outlen)
{
    uint16_t n = kvf_rd_u16(r);
    const char *p = kvf_rd_bytes(r, n);

    if (p == NULL || (size_t)n >= outlen || memchr(p, '\0', n) != NULL) {
        r->failed = 1;
        if (outlen > 0) {
            out[0] = '\0';
        }
        return;
    }
    memcpy(out, p, n);
    out[n] = '\0';
}

size_t kvf_rd_left(const kvf_rd_t *r)
{
    return r->failed ? 0 : r->len - r->off;
}

kvf_status_t kvf_rd_status(const kvf_rd_t *r)
{
    return r->failed ? KVF_ERR_PROTOCOL : KVF_OK;
}

kvf_status_t kvf_rd_end(const kvf_rd_t *r)
{
    return (r->failed || r->off != r->len) ? KVF_ERR_PROTOCOL : KVF_OK;
}
