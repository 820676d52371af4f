/*
 * tcp transport: encoding and decoding of its messages (the schema is in
 * msg.h; the table below is its machine-readable form).
 */
#include "transport/tcp/msg.h"

enum {
    KVF_TCP_META_NONE = 0, /* meta_len 0, count 0 */
    KVF_TCP_META_ELEMS,    /* count x elem bytes */
    KVF_TCP_META_ONE,      /* exactly one element */
    KVF_TCP_META_OPAQUE    /* any bytes, count 0 */
};

enum {
    KVF_TCP_DATA_NONE = 0, /* data_len 0 */
    KVF_TCP_DATA_ENTRIES,  /* data_len = sum of the entries' len */
    KVF_TCP_DATA_ANY       /* the receiver checks it against its request */
};

typedef struct kvf_tcp_schema {
    uint8_t known;
    uint8_t meta;
    uint8_t elem_len;
    uint8_t data;
} kvf_tcp_schema_t;

static const kvf_tcp_schema_t kvf_tcp_schema[16] = {
    [KVF_TCP_HELLO] = {1, KVF_TCP_META_NONE, 0, KVF_TCP_DATA_NONE},
    [KVF_TCP_DESC] = {1, KVF_TCP_META_OPAQUE, 0, KVF_TCP_DATA_NONE},
    [KVF_TCP_WRITE] = {1, KVF_TCP_META_ELEMS, KVF_TCP_ENTRY_LEN,
                       KVF_TCP_DATA_ENTRIES},
    [KVF_TCP_WRITE_ACK] = {1, KVF_TCP_META_ELEMS, KVF_TCP_REFUSE_LEN,
                           KVF_TCP_DATA_NONE},
    [KVF_TCP_READ] = {1, KVF_TCP_META_ELEMS, KVF_TCP_ENTRY_LEN,
                      KVF_TCP_DATA_NONE},
    [KVF_TCP_READ_RESP] = {1, KVF_TCP_META_ELEMS, KVF_TCP_REFUSE_LEN,
                           KVF_TCP_DATA_ANY},
    [KVF_TCP_SUM] = {1, KVF_TCP_META_ELEMS, KVF_TCP_ENTRY_LEN,
                     KVF_TCP_DATA_NONE},
    [KVF_TCP_SUM_RESP] = {1, KVF_TCP_META_ELEMS, KVF_TCP_SUM_LEN,
                          KVF_TCP_DATA_NONE},
    [KVF_TCP_LINK_WRITE] = {1, KVF_TCP_META_ONE, KVF_TCP_ENTRY_LEN,
                            KVF_TCP_DATA_ENTRIES},
    [KVF_TCP_LINK_READ] = {1, KVF_TCP_META_ONE, KVF_TCP_ENTRY_LEN,
                           KVF_TCP_DATA_NONE},
    [KVF_TCP_LINK_RESP] = {1, KVF_TCP_META_NONE, 0, KVF_TCP_DATA_ANY},
    [KVF_TCP_ERROR] = {1, KVF_TCP_META_NONE, 0, KVF_TCP_DATA_NONE},
};

static const kvf_tcp_schema_t *kvf_tcp_schema_of(uint8_t type)
{
    if (type >= sizeof(kvf_tcp_schema) / sizeof(kvf_tcp_schema[0]) ||
        !kvf_tcp_schema[type].known) {
        return NULL;
    }
    return &kvf_tcp_schema[type];
}

size_t kvf_tcp_elem_len(uint8_t type)
{
    const kvf_tcp_schema_t *s = kvf_tcp_schema_of(type);

    return s != NULL ? s->elem_len : 0;
}

void kvf_tcp_hdr_init(kvf_frame_hdr_t *h, uint8_t type, uint64_t id,
                      kvf_status_t status, uint32_t count, uint64_t data_len)
{
    *h = (kvf_frame_hdr_t){
        .magic = KVF_WIRE_MAGIC,
        .version = KVF_WIRE_VERSION,
        .type = type,
        .meta_len = count * (uint32_t)kvf_tcp_elem_len(type),
        .count = count,
        .id = id,
        .data_len = data_len,
        .status = status,
    };
}

kvf_status_t kvf_tcp_hdr_check(const kvf_frame_hdr_t *h)
{
    const kvf_tcp_schema_t *s = kvf_tcp_schema_of(h->type);

    if (s == NULL) {
        return KVF_ERR_PROTOCOL;
    }
    switch (s->meta) {
    case KVF_TCP_META_NONE:
        if (h->count != 0 || h->meta_len != 0) {
            return KVF_ERR_PROTOCOL;
        }
        break;
    case KVF_TCP_META_ONE:
    case KVF_TCP_META_ELEMS:
        if ((uint64_t)h->count * s->elem_len != h->meta_len ||
            (s->meta == KVF_TCP_META_ONE && h->count != 1)) {
            return KVF_ERR_PROTOCOL;
        }
        break;
    default: /* opaque */
        if (h->count != 0) {
            return KVF_ERR_PROTOCOL;
        }
        break;
    }
    if (s->data == KVF_TCP_DATA_NONE && h->data_len != 0) {
        return KVF_ERR_PROTOCOL;
    }
    return KVF_OK;
}

kvf_status_t kvf_tcp_entries_check(const kvf_frame_hdr_t *h, const void *meta)
{
    const kvf_tcp_schema_t *s = kvf_tcp_schema_of(h->type);
    kvf_tcp_entry_t e;
    uint64_t sum = 0;
    kvf_rd_t r;
    uint32_t i;

    if (s == NULL || s->elem_len != KVF_TCP_ENTRY_LEN) {
        return KVF_ERR_PROTOCOL;
    }
    kvf_rd_init(&r, meta, h->meta_len);
    for (i = 0; i < h->count; i++) {
        kvf_tcp_entry_dec(&r, &e);
        if (e.len > KVF_WIRE_DATA_MAX || sum + e.len < sum) {
            return KVF_ERR_PROTOCOL;
        }
        sum += e.len;
    }
    if (kvf_rd_end(&r) != KVF_OK) {
        return KVF_ERR_PROTOCOL;
    }
    if (s->data == KVF_TCP_DATA_ENTRIES && sum != h->data_len) {
        return KVF_ERR_PROTOCOL;
    }
    return KVF_OK;
}

void kvf_tcp_entry_enc(kvf_wr_t *w, uint64_t addr, uint64_t len)
{
    kvf_wr_u64(w, addr);
    kvf_wr_u64(w, len);
}

void kvf_tcp_entry_dec(kvf_rd_t *r, kvf_tcp_entry_t *e)
{
    e->addr = kvf_rd_u64(r);
    e->len = kvf_rd_u64(r);
}

void kvf_tcp_refusal_enc(kvf_wr_t *w, uint32_t index, kvf_status_t status)
{
    kvf_wr_u32(w, index);
    kvf_wr_u32(w, (uint32_t)(int32_t)status);
}

void kvf_tcp_refusal_dec(kvf_rd_t *r, kvf_tcp_refusal_t *f)
{
    f->index = kvf_rd_u32(r);
    f->status = (kvf_status_t)(int32_t)kvf_rd_u32(r);
    if (f->status >= KVF_OK) {
        f->status = KVF_ERR_PROTOCOL;
    }
}

void kvf_tcp_sum_enc(kvf_wr_t *w, uint64_t sum)
{
    kvf_wr_u64(w, sum);
}

uint64_t kvf_tcp_sum_dec(kvf_rd_t *r)
{
    return kvf_rd_u64(r);
}

/* Reads every element of a checked header's metadata. */
static kvf_status_t kvf_tcp_meta_decode(const kvf_frame_hdr_t *h,
                                        const void *meta)
{
    kvf_tcp_refusal_t f;
    kvf_rd_t r;
    uint32_t i;

    switch (h->type) {
    case KVF_TCP_WRITE:
    case KVF_TCP_READ:
    case KVF_TCP_SUM:
    case KVF_TCP_LINK_WRITE:
    case KVF_TCP_LINK_READ:
        return kvf_tcp_entries_check(h, meta);
    case KVF_TCP_WRITE_ACK:
    case KVF_TCP_READ_RESP:
        kvf_rd_init(&r, meta, h->meta_len);
        for (i = 0; i < h->count; i++) {
            kvf_tcp_refusal_dec(&r, &f);
        }
        return kvf_rd_end(&r);
    case KVF_TCP_SUM_RESP:
        kvf_rd_init(&r, meta, h->meta_len);
        for (i = 0; i < h->count; i++) {
            (void)kvf_tcp_sum_dec(&r);
        }
        return kvf_rd_end(&r);
    default:
        return KVF_OK;
    }
}

kvf_status_t kvf_tcp_msg_decode(const void *buf, size_t len,
                                kvf_frame_hdr_t *hdr_p)
{
    kvf_frame_hdr_t h;
    kvf_status_t status;
    kvf_rd_t r;
    const void *p;

    kvf_rd_init(&r, buf, len);
    p = kvf_rd_bytes(&r, KVF_WIRE_HDR_LEN);
    if (p == NULL) {
        return KVF_ERR_PROTOCOL;
    }
    status = kvf_frame_unpack(p, &h);
    if (status == KVF_OK) {
        status = kvf_tcp_hdr_check(&h);
    }
    if (status != KVF_OK) {
        return status;
    }
    p = kvf_rd_bytes(&r, h.meta_len);
    if (p == NULL || kvf_rd_end(&r) != KVF_OK) {
        return KVF_ERR_PROTOCOL;
    }
    status = kvf_tcp_meta_decode(&h, p);
    if (status == KVF_OK) {
        *hdr_p = h;
    }
    return status;
}
