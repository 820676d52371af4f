/*
 * Frame tags of authenticated connections (core/wire.h): GMAC, that is
 * AES-256-GCM over additional data only. Each direction has its own key
 * (derived per connection in the handshake) and its own sequence
 * number, which is the GCM nonce: never reused under one key, so every
 * tag is fresh. The nonce's first four bytes say what is tagged (a
 * frame's header and metadata, or its payload), so a payload tag never
 * passes for a frame tag. GMAC is chosen for speed on both sizes it
 * meets: a control frame (tens of bytes: one AES block and a few
 * carry-less multiplications) and, when payloads are covered, megabytes
 * (GHASH with PCLMULQDQ).
 *
 * Where the time goes decides who computes what
 * (tests/perf/wire_mac_bench.c): a small frame's GHASH (most frames:
 * requests and replies of tens of bytes) is core/ghash.c's, a few
 * carry-less multiplications with one reduction, where OpenSSL's GCM
 * calls around the same work cost several times more; large frames and
 * payloads go through OpenSSL's GCM mode functions (CRYPTO_gcm128_*),
 * whose GHASH is faster over many blocks. The AES blocks are OpenSSL's
 * (EVP): frame nonces follow each other, so the counter blocks of the
 * next KVF_WIRE_EK_BATCH frame tags are encrypted in one EVP call and
 * served from there, paying the call's fixed cost once per batch. The
 * header and metadata are tagged zero-padded to whole 16-byte blocks
 * (the header's meta_len keeps that unambiguous).
 */
#include "core/wire.h"
#include "core/alloc.h"
#include "core/ghash.h"
#include "core/log.h"

#include <endian.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/modes.h>

#define KVF_WIRE_DOM_FRAME   0x4d52464bu /* "KFRM" */
#define KVF_WIRE_DOM_PAYLOAD 0x4459504bu /* "KPYD" */
/* Frame tags whose counter blocks are encrypted together. */
#define KVF_WIRE_EK_BATCH 32
/* Metadata up to this size is tagged through core/ghash.c. */
#define KVF_WIRE_SMALL_META 216

/* One direction's key: AES-256 (ECB) under OpenSSL's GCM, the powers
 * of H for core/ghash.c, and the encrypted counter blocks of the next
 * frame tags (ek_in[i] -> ek_out[i], the ones from ek_next on not used
 * yet). */
typedef struct kvf_wire_key {
    kvf_ghash_key_t ghash;
    int own_ghash; /* frame tags through core/ghash.c */
    GCM128_CONTEXT *gcm;
    EVP_CIPHER_CTX *aes;
    unsigned char ek_in[KVF_WIRE_EK_BATCH][16];
    unsigned char ek_out[KVF_WIRE_EK_BATCH][16];
    uint64_t ek_seq; /* the sequence number of ek_in[0] */
    int ek_next;
    int ek_count;
} kvf_wire_key_t;

/* GCM's first counter block for a tag in domain dom, sequence seq: the
 * 12-byte nonce (dom, then seq, little-endian) and the counter 1. */
static void kvf_wire_counter(uint32_t dom, uint64_t seq, unsigned char b[16])
{
    static const unsigned char one[4] = {0, 0, 0, 1};
    uint32_t d = htole32(dom);
    uint64_t s = htole64(seq);

    memcpy(b, &d, 4);
    memcpy(b + 4, &s, 8);
    memcpy(b + 12, one, 4);
}

/* The sequence number of a frame tag's counter block; -1 for any other
 * block (GCM's H, a payload tag's counter). */
static int64_t kvf_wire_frame_seq(const unsigned char in[16])
{
    unsigned char want[16];
    uint64_t seq;

    memcpy(&seq, in + 4, 8);
    seq = le64toh(seq);
    kvf_wire_counter(KVF_WIRE_DOM_FRAME, seq, want);
    return memcmp(want, in, 16) == 0 && seq < INT64_MAX ? (int64_t)seq : -1;
}

/* The block function GCM calls: a frame tag's counter block from the
 * batch, encrypting the next batch (from this one on) when it is not
 * there; anything else directly. */
static void kvf_wire_block(const unsigned char in[16], unsigned char out[16],
                           const void *key)
{
    kvf_wire_key_t *k = (kvf_wire_key_t *)(uintptr_t)key;
    int64_t seq;
    int i, outl;

    if (k->ek_next < k->ek_count && memcmp(k->ek_in[k->ek_next], in, 16) == 0) {
        memcpy(out, k->ek_out[k->ek_next++], 16);
        return;
    }
    seq = kvf_wire_frame_seq(in);
    if (seq < 0 || INT64_MAX - seq < KVF_WIRE_EK_BATCH) {
        EVP_EncryptUpdate(k->aes, out, &outl, in, 16);
        return;
    }
    for (i = 0; i < KVF_WIRE_EK_BATCH; i++) {
        kvf_wire_counter(KVF_WIRE_DOM_FRAME, (uint64_t)seq + (uint64_t)i,
                         k->ek_in[i]);
    }
    EVP_EncryptUpdate(k->aes, k->ek_out[0], &outl, k->ek_in[0],
                      (int)sizeof(k->ek_in));
    memcpy(out, k->ek_out[0], 16);
    k->ek_seq = (uint64_t)seq;
    k->ek_next = 1;
    k->ek_count = KVF_WIRE_EK_BATCH;
}

/* AES_K of frame tag seq's first counter block: the next one of the
 * batch when seq follows on (the usual case, told by the number alone),
 * else through the block function. */
static void kvf_wire_frame_ek0(kvf_wire_key_t *k, uint64_t seq,
                               unsigned char out[16])
{
    unsigned char ctr[16];

    if (k->ek_next < k->ek_count && seq == k->ek_seq + (uint64_t)k->ek_next) {
        memcpy(out, k->ek_out[k->ek_next++], 16);
        return;
    }
    kvf_wire_counter(KVF_WIRE_DOM_FRAME, seq, ctr);
    kvf_wire_block(ctr, out, k);
}

static void kvf_wire_key_free(kvf_wire_key_t *k)
{
    if (k == NULL) {
        return;
    }
    if (k->gcm != NULL) {
        CRYPTO_gcm128_release(k->gcm); /* wipes H and its tables */
    }
    EVP_CIPHER_CTX_free(k->aes); /* wipes the key schedule */
    OPENSSL_cleanse(k, sizeof(*k));
    kvf_free(k);
}

static int kvf_wire_openssl_only;

void kvf_wire_mac_openssl_only(int on)
{
    kvf_wire_openssl_only = on;
}

/* Prepares core/ghash.c's powers of H = AES_K(0^128) where the CPU has
 * its instructions (and tests did not ask for OpenSSL's path). */
static kvf_status_t kvf_wire_own_ghash(kvf_wire_key_t *k)
{
    static const unsigned char zeros[16];
    unsigned char h[16];
    int outl;

    if (kvf_wire_openssl_only || !kvf_ghash_available()) {
        return KVF_OK;
    }
    if (EVP_EncryptUpdate(k->aes, h, &outl, zeros, 16) != 1) {
        return KVF_ERR_NO_MEMORY;
    }
    kvf_ghash_init(&k->ghash, h);
    OPENSSL_cleanse(h, sizeof(h));
    k->own_ghash = 1;
    return KVF_OK;
}

static kvf_wire_key_t *kvf_wire_key_new(const unsigned char *key)
{
    kvf_wire_key_t *k = kvf_calloc(1, sizeof(*k));

    if (k == NULL) {
        return NULL;
    }
    k->aes = EVP_CIPHER_CTX_new();
    if (k->aes == NULL ||
        EVP_EncryptInit_ex(k->aes, EVP_aes_256_ecb(), NULL, key, NULL) != 1 ||
        EVP_CIPHER_CTX_set_padding(k->aes, 0) != 1 ||
        (k->gcm = CRYPTO_gcm128_new(k, kvf_wire_block)) == NULL ||
        kvf_wire_own_ghash(k) != KVF_OK) {
        kvf_wire_key_free(k);
        return NULL;
    }
    return k;
}

kvf_status_t kvf_wire_mac_init(kvf_wire_mac_t *m,
                               const unsigned char tx_key[KVF_WIRE_KEY_LEN],
                               const unsigned char rx_key[KVF_WIRE_KEY_LEN])
{
    memset(m, 0, sizeof(*m));
    m->tx = kvf_wire_key_new(tx_key);
    m->rx = kvf_wire_key_new(rx_key);
    if (m->tx == NULL || m->rx == NULL) {
        kvf_wire_mac_free(m);
        return KVF_ERR_NO_MEMORY;
    }
    return KVF_OK;
}

void kvf_wire_mac_free(kvf_wire_mac_t *m)
{
    if (m == NULL) {
        return;
    }
    kvf_wire_key_free(m->tx);
    kvf_wire_key_free(m->rx);
    memset(m, 0, sizeof(*m));
}

/* Starts a tag in domain dom with sequence number seq under k. */
static void kvf_wire_mac_start(kvf_wire_key_t *k, uint32_t dom, uint64_t seq)
{
    unsigned char iv[16];

    kvf_wire_counter(dom, seq, iv);
    CRYPTO_gcm128_setiv(k->gcm, iv, 12);
}

static void kvf_wire_mac_feed(kvf_wire_key_t *k, const void *buf, size_t len)
{
    CRYPTO_gcm128_aad(k->gcm, buf, len);
}

static void kvf_wire_mac_finish(kvf_wire_key_t *k,
                                unsigned char tag[KVF_WIRE_TAG_LEN])
{
    CRYPTO_gcm128_tag(k->gcm, tag, KVF_WIRE_TAG_LEN);
}

/* A frame's tag by OpenSSL's GCM: GMAC over its header and metadata,
 * zero-padded to whole GCM blocks. */
static void kvf_wire_mac_frame_openssl(kvf_wire_key_t *k, uint64_t seq,
                                       const unsigned char *hdr,
                                       const void *meta, size_t len,
                                       unsigned char tag[KVF_WIRE_TAG_LEN])
{
    static const unsigned char zeros[16];
    size_t pad = (16 - (KVF_WIRE_HDR_LEN + len) % 16) % 16;

    kvf_wire_mac_start(k, KVF_WIRE_DOM_FRAME, seq);
    kvf_wire_mac_feed(k, hdr, KVF_WIRE_HDR_LEN);
    if (len > 0) {
        kvf_wire_mac_feed(k, meta, len);
    }
    if (pad > 0) {
        kvf_wire_mac_feed(k, zeros, pad);
    }
    kvf_wire_mac_finish(k, tag);
}

/* A frame's tag: GMAC over its header and metadata, zero-padded to
 * whole GCM blocks (the header's meta_len keeps that unambiguous). A
 * small frame (most: requests, replies) goes through core/ghash.c where
 * the CPU allows, copied into one buffer with GCM's length block after
 * it; a large one through OpenSSL's GCM, faster over many blocks. */
static void kvf_wire_mac_frame(kvf_wire_key_t *k, uint64_t seq,
                               const unsigned char *hdr, const void *meta,
                               size_t len, unsigned char tag[KVF_WIRE_TAG_LEN])
{
    _Alignas(16) unsigned char one[KVF_WIRE_HDR_LEN + KVF_WIRE_SMALL_META + 32];
    unsigned char ek0[16];
    size_t padded = (KVF_WIRE_HDR_LEN + len + 15) / 16 * 16;
    kvf_ghash_t g = {{0}};

    if (!k->own_ghash || len > KVF_WIRE_SMALL_META) {
        kvf_wire_mac_frame_openssl(k, seq, hdr, meta, len, tag);
        return;
    }
    memset(one + padded - 16, 0, 16); /* the padding, copied over */
    memcpy(one, hdr, KVF_WIRE_HDR_LEN);
    if (len > 0) {
        memcpy(one + KVF_WIRE_HDR_LEN, meta, len);
    }
    kvf_ghash_length_block(padded, one + padded);
    kvf_wire_frame_ek0(k, seq, ek0);
    kvf_ghash_blocks(&k->ghash, &g, one, padded / 16 + 1);
    kvf_ghash_tag(&g, ek0, tag);
}

void kvf_wire_mac_seal(kvf_wire_mac_t *m,
                       const unsigned char hdr[KVF_WIRE_HDR_LEN],
                       const void *meta, size_t len,
                       unsigned char tag[KVF_WIRE_TAG_LEN])
{
    kvf_wire_mac_frame(m->tx, m->tx_seq++, hdr, meta, len, tag);
}

kvf_status_t kvf_wire_mac_check(kvf_wire_mac_t *m,
                                const unsigned char hdr[KVF_WIRE_HDR_LEN],
                                const void *meta, size_t len,
                                const unsigned char tag[KVF_WIRE_TAG_LEN],
                                const char *where)
{
    unsigned char want[KVF_WIRE_TAG_LEN];

    kvf_wire_mac_frame(m->rx, m->rx_seq++, hdr, meta, len, want);
    if (CRYPTO_memcmp(want, tag, sizeof(want)) != 0) {
        kvf_log_rl(KVF_LOG_WARN,
                   "%s: a frame's tag does not match the connection's "
                   "session key (altered, injected or replayed by someone "
                   "in the middle): closing the connection",
                   where ? where : "connection");
        return KVF_ERR_AUTH;
    }
    return KVF_OK;
}

kvf_status_t kvf_wire_mac_check_hdr(kvf_wire_mac_t *m, const kvf_frame_hdr_t *h,
                                    const void *meta, size_t len,
                                    const unsigned char tag[KVF_WIRE_TAG_LEN],
                                    const char *where)
{
    unsigned char hdr[KVF_WIRE_HDR_LEN];

    kvf_frame_pack(h, hdr);
    return kvf_wire_mac_check(m, hdr, meta, len, tag, where);
}

void kvf_wire_pmac_begin(kvf_wire_mac_t *m, int tx, kvf_wire_pmac_t *p)
{
    p->ctx = tx ? m->tx : m->rx;
    kvf_wire_mac_start(p->ctx, KVF_WIRE_DOM_PAYLOAD,
                       (tx ? m->tx_seq : m->rx_seq) - 1);
}

void kvf_wire_pmac_update(kvf_wire_pmac_t *p, const void *buf, size_t len)
{
    kvf_wire_mac_feed(p->ctx, buf, len);
}

kvf_status_t kvf_wire_pmac_end(kvf_wire_pmac_t *p, int check,
                               unsigned char tag[KVF_WIRE_TAG_LEN])
{
    unsigned char got[KVF_WIRE_TAG_LEN];

    kvf_wire_mac_finish(p->ctx, got);
    p->ctx = NULL;
    if (!check) {
        memcpy(tag, got, sizeof(got));
        return KVF_OK;
    }
    return CRYPTO_memcmp(got, tag, sizeof(got)) == 0 ? KVF_OK : KVF_ERR_AUTH;
}
