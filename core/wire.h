/*
 * Wire framing shared by every kvferry protocol (engine data path, p2p
 * metadata, store RPC): a fixed 40-byte little-endian frame header
 * (magic, version, type, flags, lengths, id, status) and bounds-checked
 * readers/writers for frame bodies. Parsing never reads past the buffer;
 * every failure is a status, never a crash.
 *
 * On an authenticated connection every frame also carries a tag: the
 * frame is header | metadata | tag | payload, the tag a MAC under the
 * connection's session key (core/auth.c derives it in the handshake)
 * over a per-direction sequence number, the header and the metadata
 * (core/wire_mac.c). A frame is acted on only after its tag checked, so
 * a party without the session key (a relay, an on-path attacker) can
 * neither inject, alter, replay, reorder nor drop a control message
 * unnoticed. Payload bytes are covered only when the connection asked
 * for it (kvf_wire_mac_t.payload; the tag then follows the payload).
 */
#ifndef KVF_CORE_WIRE_H
#define KVF_CORE_WIRE_H
#if !defined(KVF_INTERNAL) && !defined(KVF_TEST_INTERNALS)
#error "core/wire.h is internal to kvferry: use <kvferry/*.h>"
#endif

#include <kvferry/status.h>

#include <stddef.h>
#include <stdint.h>

#define KVF_WIRE_MAGIC    0x5246564bu /* "KVFR" */
#define KVF_WIRE_VERSION  1
#define KVF_WIRE_HDR_LEN  40
#define KVF_WIRE_META_MAX (4u << 20)   /* 4 MiB of metadata */
#define KVF_WIRE_DATA_MAX (1ull << 40) /* 1 TiB of payload */

typedef struct kvf_frame_hdr {
    uint32_t magic;
    uint8_t version;
    uint8_t type;
    uint16_t flags;
    uint32_t meta_len; /* bytes of metadata following the header */
    uint32_t count;    /* number of entries in the metadata */
    uint64_t id;       /* request id, echoed in the reply */
    uint64_t data_len; /* payload bytes following the metadata */
    int32_t status;    /* kvf_status_t in replies */
    uint32_t reserved;
} kvf_frame_hdr_t;

void kvf_frame_pack(const kvf_frame_hdr_t *hdr,
                    unsigned char out[KVF_WIRE_HDR_LEN]);

/* Validates magic, version and lengths; KVF_ERR_PROTOCOL on garbage,
 * KVF_ERR_VERSION on an unknown version, KVF_ERR_MSG_TOO_LARGE on
 * lengths above the limits. */
kvf_status_t kvf_frame_unpack(const unsigned char in[KVF_WIRE_HDR_LEN],
                              kvf_frame_hdr_t *hdr_p);

/* Bytes of a frame tag. */
#define KVF_WIRE_TAG_LEN 16
/* Bytes of a session key of one direction. */
#define KVF_WIRE_KEY_LEN 32

/* A connection's frame MAC state: one key and sequence number per
 * direction. All zero (tx NULL) means off: frames carry no tag. The
 * sending side is used by one thread at a time, the receiving side by
 * one thread at a time. */
typedef struct kvf_wire_mac {
    void *tx; /* key state for what this side sends */
    void *rx; /* key state for what this side receives */
    uint64_t tx_seq;
    uint64_t rx_seq;
    int payload; /* payload bytes are covered too (a second tag) */
} kvf_wire_mac_t;

/* Sets m up with the two keys (copied); m is off before. */
kvf_status_t kvf_wire_mac_init(kvf_wire_mac_t *m,
                               const unsigned char tx_key[KVF_WIRE_KEY_LEN],
                               const unsigned char rx_key[KVF_WIRE_KEY_LEN]);
/* Wipes the keys; m is off after. NULL or off: nothing. */
void kvf_wire_mac_free(kvf_wire_mac_t *m);
/* 1 when frames on m carry tags (m may be NULL). */
static inline int kvf_wire_mac_on(const kvf_wire_mac_t *m)
{
    return m != NULL && m->tx != NULL;
}
/* The tag of the next frame sent: over tx_seq, hdr and meta (len bytes,
 * may be NULL when 0); advances tx_seq. */
void kvf_wire_mac_seal(kvf_wire_mac_t *m,
                       const unsigned char hdr[KVF_WIRE_HDR_LEN],
                       const void *meta, size_t len,
                       unsigned char tag[KVF_WIRE_TAG_LEN]);
/* Checks the tag of the next frame received; advances rx_seq either way
 * (a connection whose tag failed is closed). KVF_ERR_AUTH on a wrong
 * tag, with one rate-limited line naming where. */
kvf_status_t kvf_wire_mac_check(kvf_wire_mac_t *m,
                                const unsigned char hdr[KVF_WIRE_HDR_LEN],
                                const void *meta, size_t len,
                                const unsigned char tag[KVF_WIRE_TAG_LEN],
                                const char *where);
/* The same with the header given unpacked (packed again: the encoding
 * is one to one). */
kvf_status_t kvf_wire_mac_check_hdr(kvf_wire_mac_t *m, const kvf_frame_hdr_t *h,
                                    const void *meta, size_t len,
                                    const unsigned char tag[KVF_WIRE_TAG_LEN],
                                    const char *where);

/* Frame tags of keys set up from now on go through OpenSSL's GCM alone
 * (on = 1) instead of core/ghash.c: for tests that compare the two. */
void kvf_wire_mac_openssl_only(int on);

/* Payload tags (m->payload): a running MAC over the payload of the
 * frame just sealed (tx = 1) or just checked (tx = 0), under the same
 * key and sequence number in another domain, fed in pieces, ended with
 * the tag that follows the payload. Uses m's key state of that
 * direction until it ends. */
typedef struct kvf_wire_pmac {
    void *ctx;
} kvf_wire_pmac_t;

void kvf_wire_pmac_begin(kvf_wire_mac_t *m, int tx, kvf_wire_pmac_t *p);
void kvf_wire_pmac_update(kvf_wire_pmac_t *p, const void *buf, size_t len);
/* Ends p: the tag into tag (sender), or compared with tag (receiver,
 * check = 1: KVF_ERR_AUTH when it differs). */
kvf_status_t kvf_wire_pmac_end(kvf_wire_pmac_t *p, int check,
                               unsigned char tag[KVF_WIRE_TAG_LEN]);

/* Little-endian writer, growable (kvf_wr_init) or over a caller's
 * buffer of fixed size (kvf_wr_init_fixed). The first failure latches:
 * allocation failure reports KVF_ERR_NO_MEMORY, a full fixed buffer
 * KVF_ERR_MSG_TOO_LARGE, and later writes do nothing. */
typedef struct kvf_wr {
    unsigned char *buf;
    size_t len;
    size_t cap;
    int failed;
    int fixed; /* buf is the caller's: never grown, never freed */
} kvf_wr_t;

void kvf_wr_init(kvf_wr_t *w);
/* Writes into buf (borrowed, cap bytes). */
void kvf_wr_init_fixed(kvf_wr_t *w, void *buf, size_t cap);
void kvf_wr_free(kvf_wr_t *w);
void kvf_wr_u8(kvf_wr_t *w, uint8_t v);
void kvf_wr_u16(kvf_wr_t *w, uint16_t v);
void kvf_wr_u32(kvf_wr_t *w, uint32_t v);
void kvf_wr_u64(kvf_wr_t *w, uint64_t v);
void kvf_wr_bytes(kvf_wr_t *w, const void *p, size_t n);
/* u16 length + bytes */
void kvf_wr_str(kvf_wr_t *w, const char *s);
kvf_status_t kvf_wr_status(const kvf_wr_t *w);

/* Bounds-checked reader over a borrowed buffer. The first failure
 * latches; later reads return zeros and kvf_rd_status() says
 * KVF_ERR_PROTOCOL. */
typedef struct kvf_rd {
    const unsigned char *buf;
    size_t len;
    size_t off;
    int failed;
} kvf_rd_t;

void kvf_rd_init(kvf_rd_t *r, const void *buf, size_t len);
uint8_t kvf_rd_u8(kvf_rd_t *r);
uint16_t kvf_rd_u16(kvf_rd_t *r);
uint32_t kvf_rd_u32(kvf_rd_t *r);
uint64_t kvf_rd_u64(kvf_rd_t *r);
const void *kvf_rd_bytes(kvf_rd_t *r, size_t n);
/* Copies a u16-length string into out (NUL-terminated); fails if it does
 * not fit or holds a NUL. */
void kvf_rd_str(kvf_rd_t *r, char *out, size_t outlen);
size_t kvf_rd_left(const kvf_rd_t *r);
kvf_status_t kvf_rd_status(const kvf_rd_t *r);
/* KVF_OK when every read succeeded and the whole buffer was consumed;
 * else KVF_ERR_PROTOCOL (short input or trailing bytes). */
kvf_status_t kvf_rd_end(const kvf_rd_t *r);

#endif
