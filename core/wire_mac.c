/*
 * Frame tags of authenticated connections (core/wire.h): GMAC, that is
 * AES-256-GCM over additional data only, through OpenSSL. Each
 * direction has its own key (derived per connection in the handshake)
 * and its own sequence number, which is the GCM nonce: never reused
 * under one key, so every tag is fresh. The nonce's first four bytes
 * say what is tagged (a frame's header and metadata, or its payload),
 * so a payload tag never passes for a frame tag. GMAC is chosen for
 * speed on both sizes it meets: a control frame (tens of bytes: about
 * one AES block and two carry-less multiplications) and, when payloads
 * are covered, megabytes (several GB/s with AES-NI and PCLMULQDQ).
 */
#include "core/wire.h"
#include "core/log.h"

#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#define KVF_WIRE_DOM_FRAME   0x4d52464bu /* "KFRM" */
#define KVF_WIRE_DOM_PAYLOAD 0x4459504bu /* "KPYD" */

static EVP_CIPHER_CTX *kvf_wire_mac_ctx(const unsigned char *key)
{
    static const unsigned char iv0[12];
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();

    if (c != NULL &&
        EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, iv0) != 1) {
        EVP_CIPHER_CTX_free(c);
        c = NULL;
    }
    return c;
}

kvf_status_t kvf_wire_mac_init(kvf_wire_mac_t *m,
                               const unsigned char tx_key[KVF_WIRE_KEY_LEN],
                               const unsigned char rx_key[KVF_WIRE_KEY_LEN])
{
    memset(m, 0, sizeof(*m));
    m->tx = kvf_wire_mac_ctx(tx_key);
    m->rx = kvf_wire_mac_ctx(rx_key);
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
    EVP_CIPHER_CTX_free(m->tx); /* wipes the key schedule */
    EVP_CIPHER_CTX_free(m->rx);
    memset(m, 0, sizeof(*m));
}

/* Starts a tag in domain dom with sequence number seq on ctx. */
static void kvf_wire_mac_start(EVP_CIPHER_CTX *ctx, uint32_t dom, uint64_t seq)
{
    unsigned char iv[12];
    int i;

    for (i = 0; i < 4; i++) {
        iv[i] = (unsigned char)(dom >> (8 * i));
    }
    for (i = 0; i < 8; i++) {
        iv[4 + i] = (unsigned char)(seq >> (8 * i));
    }
    EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, iv);
}

static void kvf_wire_mac_feed(EVP_CIPHER_CTX *ctx, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    int outl;
    size_t n;

    while (len > 0) { /* EVP takes an int */
        n = len < (1u << 30) ? len : (1u << 30);
        EVP_EncryptUpdate(ctx, NULL, &outl, p, (int)n);
        p += n;
        len -= n;
    }
}

static void kvf_wire_mac_finish(EVP_CIPHER_CTX *ctx,
                                unsigned char tag[KVF_WIRE_TAG_LEN])
{
    unsigned char none[16];
    int outl;

    EVP_EncryptFinal_ex(ctx, none, &outl);
    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, KVF_WIRE_TAG_LEN, tag);
}

static void kvf_wire_mac_frame(EVP_CIPHER_CTX *ctx, uint64_t seq,
                               const unsigned char *hdr, const void *meta,
                               size_t len, unsigned char tag[KVF_WIRE_TAG_LEN])
{
    kvf_wire_mac_start(ctx, KVF_WIRE_DOM_FRAME, seq);
    kvf_wire_mac_feed(ctx, hdr, KVF_WIRE_HDR_LEN);
    if (len > 0) {
        kvf_wire_mac_feed(ctx, meta, len);
    }
    kvf_wire_mac_finish(ctx, tag);
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

kvf_status_t kvf_wire_mac_check_hdr(kvf_wire_mac_t *m,
                                    const kvf_frame_hdr_t *h, const void *meta,
                                    size_t len,
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
