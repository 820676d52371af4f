/*
 * shm transport: encoding and decoding of its messages (the schema is in
 * msg.h), over core/wire.c's writer and reader.
 */
#include "transport/shm/msg.h"

#include <string.h>

void kvf_shm_hello_enc(kvf_wr_t *w, const kvf_shm_hello_t *m)
{
    kvf_wr_u32(w, m->version);
    kvf_wr_bytes(w, m->nonce, KVF_SHM_NONCE_LEN);
    kvf_wr_u64(w, m->host_id);
}

kvf_status_t kvf_shm_hello_dec(const void *meta, size_t len, kvf_shm_hello_t *m)
{
    const void *nonce;
    kvf_rd_t r;

    kvf_rd_init(&r, meta, len);
    m->version = kvf_rd_u32(&r);
    nonce = kvf_rd_bytes(&r, KVF_SHM_NONCE_LEN);
    m->host_id = kvf_rd_u64(&r);
    if (nonce != NULL) {
        memcpy(m->nonce, nonce, KVF_SHM_NONCE_LEN);
    }
    return kvf_rd_end(&r);
}

void kvf_shm_hello_ack_enc(kvf_wr_t *w, const kvf_shm_hello_ack_t *m)
{
    kvf_wr_u32(w, m->pid);
    kvf_wr_u64(w, m->epoch);
}

kvf_status_t kvf_shm_hello_ack_dec(const void *meta, size_t len,
                                   kvf_shm_hello_ack_t *m)
{
    kvf_rd_t r;

    kvf_rd_init(&r, meta, len);
    m->pid = kvf_rd_u32(&r);
    m->epoch = kvf_rd_u64(&r);
    return kvf_rd_end(&r);
}

void kvf_shm_map_enc(kvf_wr_t *w, uint64_t id)
{
    kvf_wr_u64(w, id);
}

kvf_status_t kvf_shm_map_dec(const void *meta, size_t len, uint64_t *id_p)
{
    kvf_rd_t r;

    kvf_rd_init(&r, meta, len);
    *id_p = kvf_rd_u64(&r);
    return kvf_rd_end(&r);
}

void kvf_shm_map_ack_enc(kvf_wr_t *w, const kvf_shm_alloc_t *a)
{
    kvf_wr_u64(w, a->id);
    kvf_wr_u64(w, a->base);
    kvf_wr_u64(w, a->len);
    kvf_wr_u64(w, a->off);
}

kvf_status_t kvf_shm_map_ack_dec(const void *meta, size_t len,
                                 kvf_shm_alloc_t *a)
{
    kvf_rd_t r;

    kvf_rd_init(&r, meta, len);
    a->id = kvf_rd_u64(&r);
    a->base = kvf_rd_u64(&r);
    a->len = kvf_rd_u64(&r);
    a->off = kvf_rd_u64(&r);
    a->range = 0;
    return kvf_rd_end(&r);
}

void kvf_shm_probe_enc(unsigned char *page, size_t len,
                       const unsigned char nonce[KVF_SHM_NONCE_LEN],
                       uint64_t host_id)
{
    kvf_wr_t w;

    memset(page, 0, len);
    kvf_wr_init_fixed(&w, page, len);
    kvf_wr_bytes(&w, KVF_SHM_PROBE_MAGIC, KVF_SHM_PROBE_MAGIC_LEN);
    kvf_wr_bytes(&w, nonce, KVF_SHM_NONCE_LEN);
    kvf_wr_u64(&w, host_id);
}

kvf_status_t kvf_shm_probe_dec(const unsigned char *page, size_t len,
                               unsigned char nonce[KVF_SHM_NONCE_LEN],
                               uint64_t *host_id_p)
{
    const void *magic, *n;
    kvf_rd_t r;

    kvf_rd_init(&r, page, len);
    magic = kvf_rd_bytes(&r, KVF_SHM_PROBE_MAGIC_LEN);
    n = kvf_rd_bytes(&r, KVF_SHM_NONCE_LEN);
    *host_id_p = kvf_rd_u64(&r);
    if (kvf_rd_status(&r) != KVF_OK ||
        memcmp(magic, KVF_SHM_PROBE_MAGIC, KVF_SHM_PROBE_MAGIC_LEN) != 0) {
        return KVF_ERR_PROTOCOL;
    }
    memcpy(nonce, n, KVF_SHM_NONCE_LEN);
    return KVF_OK;
}

/* A list of h->count elements of elem bytes after head bytes. */
static kvf_status_t kvf_shm_list_open(kvf_rd_t *r, const kvf_frame_hdr_t *h,
                                      const void *meta, size_t head,
                                      size_t elem, uint32_t max)
{
    kvf_rd_init(r, meta, h->meta_len);
    if (h->count > max || head + (uint64_t)h->count * elem != h->meta_len) {
        r->failed = 1;
        return KVF_ERR_PROTOCOL;
    }
    return KVF_OK;
}

void kvf_shm_entry_enc(kvf_wr_t *w, uint64_t addr, uint64_t len)
{
    kvf_wr_u64(w, addr);
    kvf_wr_u64(w, len);
}

kvf_status_t kvf_shm_entries_open(kvf_rd_t *r, const kvf_frame_hdr_t *h,
                                  const void *meta)
{
    return kvf_shm_list_open(r, h, meta, 0, KVF_SHM_ENTRY_LEN,
                             KVF_SHM_ENTRIES_MAX);
}

void kvf_shm_entry_dec(kvf_rd_t *r, kvf_shm_entry_t *e)
{
    e->addr = kvf_rd_u64(r);
    e->len = kvf_rd_u64(r);
}

void kvf_shm_id_enc(kvf_wr_t *w, uint64_t id)
{
    kvf_wr_u64(w, id);
}

kvf_status_t kvf_shm_ids_open(kvf_rd_t *r, const kvf_frame_hdr_t *h,
                              const void *meta)
{
    return kvf_shm_list_open(r, h, meta, 0, KVF_SHM_ID_LEN, UINT32_MAX);
}

uint64_t kvf_shm_id_dec(kvf_rd_t *r)
{
    return kvf_rd_u64(r);
}

void kvf_shm_sync_ack_enc(kvf_wr_t *w, uint64_t epoch, const uint64_t *ids,
                          uint32_t n)
{
    uint32_t i;

    kvf_wr_u64(w, epoch);
    for (i = 0; i < n; i++) {
        kvf_wr_u64(w, ids[i]);
    }
}

kvf_status_t kvf_shm_sync_ack_open(kvf_rd_t *r, const kvf_frame_hdr_t *h,
                                   const void *meta, uint64_t *epoch_p)
{
    kvf_status_t st;

    st = kvf_shm_list_open(r, h, meta, KVF_SHM_SYNC_HEAD_LEN, KVF_SHM_ID_LEN,
                           UINT32_MAX);
    *epoch_p = kvf_rd_u64(r);
    return st;
}

void kvf_shm_grant_enc(kvf_wr_t *w, const kvf_shm_grant_t *g,
                       const kvf_shm_exc_t *excs)
{
    uint32_t i;

    kvf_wr_u64(w, g->epoch);
    kvf_wr_u32(w, g->left_ms);
    kvf_wr_u32(w, g->nallocs);
    kvf_wr_u32(w, g->nexc);
    for (i = 0; i < g->nallocs && i < KVF_SHM_LEASE_ALLOCS; i++) {
        kvf_wr_u64(w, g->allocs[i].id);
        kvf_wr_u64(w, g->allocs[i].base);
        kvf_wr_u64(w, g->allocs[i].len);
        kvf_wr_u64(w, g->allocs[i].range);
    }
    for (i = 0; i < g->nexc; i++) {
        kvf_wr_u32(w, excs[i].index);
        kvf_wr_u32(w, (uint32_t)(int32_t)excs[i].status);
    }
}

kvf_status_t kvf_shm_grant_dec(kvf_rd_t *r, const void *meta, size_t len,
                               kvf_shm_grant_t *g)
{
    kvf_shm_alloc_t *a;
    uint32_t k;

    kvf_rd_init(r, meta, len);
    g->epoch = kvf_rd_u64(r);
    g->left_ms = kvf_rd_u32(r);
    g->nallocs = kvf_rd_u32(r);
    g->nexc = kvf_rd_u32(r);
    if (kvf_rd_status(r) != KVF_OK || g->nallocs > KVF_SHM_LEASE_ALLOCS ||
        len != KVF_SHM_GRANT_HEAD_LEN +
                   (uint64_t)g->nallocs * KVF_SHM_GRANT_ALLOC_LEN +
                   (uint64_t)g->nexc * KVF_SHM_EXC_LEN) {
        r->failed = 1;
        g->nallocs = 0;
        g->nexc = 0;
        return KVF_ERR_PROTOCOL;
    }
    for (k = 0; k < g->nallocs; k++) {
        a = &g->allocs[k];
        a->id = kvf_rd_u64(r);
        a->base = kvf_rd_u64(r);
        a->len = kvf_rd_u64(r);
        a->range = kvf_rd_u64(r);
        a->off = 0;
        if (a->range > a->len) {
            a->range = 0;
        }
    }
    return kvf_rd_status(r);
}

void kvf_shm_exc_dec(kvf_rd_t *r, kvf_shm_exc_t *e)
{
    e->index = kvf_rd_u32(r);
    e->status = (kvf_status_t)(int32_t)kvf_rd_u32(r);
    if (e->status != KVF_INPROGRESS && e->status >= KVF_OK) {
        e->status = KVF_ERR_PROTOCOL;
    }
}

/* Reads every element of a list message. */
static kvf_status_t kvf_shm_list_decode(const kvf_frame_hdr_t *h,
                                        const void *meta)
{
    kvf_shm_entry_t e;
    uint64_t epoch;
    kvf_status_t st;
    kvf_rd_t r;
    uint32_t i;

    switch (h->type) {
    case KVF_SHM_BEGIN:
    case KVF_SHM_STAGE:
    case KVF_SHM_SUM:
        st = kvf_shm_entries_open(&r, h, meta);
        for (i = 0; st == KVF_OK && i < h->count; i++) {
            kvf_shm_entry_dec(&r, &e);
        }
        break;
    case KVF_SHM_SYNC_ACK:
        st = kvf_shm_sync_ack_open(&r, h, meta, &epoch);
        for (i = 0; st == KVF_OK && i < h->count; i++) {
            (void)kvf_shm_id_dec(&r);
        }
        break;
    default: /* SYNC, SUM_ACK */
        st = kvf_shm_ids_open(&r, h, meta);
        for (i = 0; st == KVF_OK && i < h->count; i++) {
            (void)kvf_shm_id_dec(&r);
        }
        break;
    }
    return st == KVF_OK ? kvf_rd_end(&r) : st;
}

/* Decodes the metadata of a message of type h->type. */
static kvf_status_t kvf_shm_meta_decode(const kvf_frame_hdr_t *h,
                                        const void *meta)
{
    union {
        kvf_shm_hello_t hello;
        kvf_shm_hello_ack_t ack;
        kvf_shm_alloc_t alloc;
        kvf_shm_grant_t grant;
        uint64_t id;
    } m;
    kvf_shm_exc_t e;
    kvf_rd_t r;
    uint32_t i;

    switch (h->type) {
    case KVF_SHM_HELLO:
        return kvf_shm_hello_dec(meta, h->meta_len, &m.hello);
    case KVF_SHM_HELLO_ACK:
        return kvf_shm_hello_ack_dec(meta, h->meta_len, &m.ack);
    case KVF_SHM_MAP:
        return kvf_shm_map_dec(meta, h->meta_len, &m.id);
    case KVF_SHM_MAP_ACK:
        return kvf_shm_map_ack_dec(meta, h->meta_len, &m.alloc);
    case KVF_SHM_GRANT:
        if (kvf_shm_grant_dec(&r, meta, h->meta_len, &m.grant) != KVF_OK) {
            return KVF_ERR_PROTOCOL;
        }
        for (i = 0; i < m.grant.nexc; i++) {
            kvf_shm_exc_dec(&r, &e);
        }
        return kvf_rd_end(&r);
    case KVF_SHM_BEGIN:
    case KVF_SHM_STAGE:
    case KVF_SHM_SUM:
    case KVF_SHM_SYNC:
    case KVF_SHM_SYNC_ACK:
    case KVF_SHM_SUM_ACK:
        return kvf_shm_list_decode(h, meta);
    case KVF_SHM_STAGE_SETUP:
    case KVF_SHM_STAGE_SETUP_ACK:
    case KVF_SHM_STAGE_ACK:
    case KVF_SHM_END:
        return h->meta_len == 0 ? KVF_OK : KVF_ERR_PROTOCOL;
    default:
        return KVF_ERR_PROTOCOL;
    }
}

kvf_status_t kvf_shm_msg_decode(const void *buf, size_t len,
                                kvf_frame_hdr_t *hdr_p)
{
    kvf_frame_hdr_t h;
    kvf_status_t st;
    const void *p;
    kvf_rd_t r;

    kvf_rd_init(&r, buf, len);
    p = kvf_rd_bytes(&r, KVF_WIRE_HDR_LEN);
    if (p == NULL) {
        return KVF_ERR_PROTOCOL;
    }
    st = kvf_frame_unpack(p, &h);
    if (st != KVF_OK) {
        return st;
    }
    p = kvf_rd_bytes(&r, h.meta_len);
    if (p == NULL || kvf_rd_end(&r) != KVF_OK || h.data_len != 0) {
        return KVF_ERR_PROTOCOL;
    }
    st = kvf_shm_meta_decode(&h, p);
    if (st == KVF_OK) {
        *hdr_p = h;
    }
    return st;
}
