/*
 * tcp transport: the codec of its framed protocol. Every message is a
 * core/wire.h frame header, then meta_len bytes of metadata made of
 * `count` elements of one kind, then data_len bytes of payload. This is
 * the one place that says what each message holds; msg.c encodes and
 * decodes it with core/wire.c and nothing else (no I/O), so it can be
 * fuzzed on its own.
 *
 *   type        dir   metadata (count x element)         payload
 *   HELLO       i->t  none                               none
 *   DESC        t->i  the segment descriptor (opaque)    none
 *   WRITE       i->t  entries                            sum of entry len
 *   WRITE_ACK   t->i  refusals                           none
 *   READ        i->t  entries                            none
 *   READ_RESP   t->i  refusals                           the accepted
 *                                                        entries' bytes
 *   SUM         i->t  entries                            none
 *   SUM_RESP    t->i  checksums (none when status < 0)   none
 *   LINK_WRITE  i->t  exactly 1 entry                    its len
 *   LINK_READ   i->t  exactly 1 entry                    none
 *   LINK_RESP   t->i  none                               READ: the range
 *   ERROR       t->i  none; status says why, then close  none
 *
 *   entry     16 bytes  u64 addr, u64 len (target address and length;
 *                       remote-adjacent segments are merged into one)
 *   refusal    8 bytes  u32 index (of the entry), i32 status (< 0)
 *   checksum   8 bytes  u64 kvf_hash64 of the entry's bytes
 *
 * Replies carry the request's id; header status is KVF_OK or, with
 * refusals, KVF_ERR_OUT_OF_BOUNDS. Refused entries' payload is still
 * sent on WRITE (the target drains it) and not sent on READ.
 */
#ifndef KVF_TCP_MSG_H
#define KVF_TCP_MSG_H
#if !defined(KVF_LAYER_TRANSPORT) && !defined(KVF_TEST_INTERNALS)
#error "transport/tcp/msg.h is private to transport/"
#endif

#include "core/wire.h"

enum kvf_tcp_msg {
    KVF_TCP_HELLO = 1,
    KVF_TCP_DESC = 2,
    KVF_TCP_WRITE = 3,
    KVF_TCP_WRITE_ACK = 4,
    KVF_TCP_READ = 5,
    KVF_TCP_READ_RESP = 6,
    KVF_TCP_SUM = 7,
    KVF_TCP_SUM_RESP = 8,
    KVF_TCP_LINK_WRITE = 9,
    KVF_TCP_LINK_READ = 10,
    KVF_TCP_LINK_RESP = 11,
    KVF_TCP_ERROR = 15
};

#define KVF_TCP_ENTRY_LEN  16
#define KVF_TCP_REFUSE_LEN 8
#define KVF_TCP_SUM_LEN    8

typedef struct kvf_tcp_entry {
    uint64_t addr;
    uint64_t len;
} kvf_tcp_entry_t;

typedef struct kvf_tcp_refusal {
    uint32_t index;      /* of the entry in the request */
    kvf_status_t status; /* always < 0 once decoded */
} kvf_tcp_refusal_t;

/* A header of the given type with count elements of metadata (meta_len
 * follows from the schema) and data_len bytes of payload. */
void kvf_tcp_hdr_init(kvf_frame_hdr_t *h, uint8_t type, uint64_t id,
                      kvf_status_t status, uint32_t count, uint64_t data_len);
/* Bytes per metadata element of type (0: none or opaque). */
size_t kvf_tcp_elem_len(uint8_t type);
/* Checks an unpacked header against the schema: known type, meta_len =
 * count x element, the element count rule, no payload where none
 * travels. KVF_ERR_PROTOCOL otherwise. */
kvf_status_t kvf_tcp_hdr_check(const kvf_frame_hdr_t *h);
/* Checks a request's entry list (h checked, meta holds h->meta_len
 * bytes): every len at most KVF_WIRE_DATA_MAX and, where the type
 * carries a payload, the lens sum to data_len. */
kvf_status_t kvf_tcp_entries_check(const kvf_frame_hdr_t *h, const void *meta);

void kvf_tcp_entry_enc(kvf_wr_t *w, uint64_t addr, uint64_t len);
void kvf_tcp_entry_dec(kvf_rd_t *r, kvf_tcp_entry_t *e);
void kvf_tcp_refusal_enc(kvf_wr_t *w, uint32_t index, kvf_status_t status);
/* A status that is not an error decodes as KVF_ERR_PROTOCOL. */
void kvf_tcp_refusal_dec(kvf_rd_t *r, kvf_tcp_refusal_t *f);
void kvf_tcp_sum_enc(kvf_wr_t *w, uint64_t sum);
uint64_t kvf_tcp_sum_dec(kvf_rd_t *r);

/* Decodes one whole message (header, metadata and no payload) from buf:
 * the header checked, every element read, the payload rule checked.
 * For tests and fuzzing; the transport reads its messages piecewise. */
kvf_status_t kvf_tcp_msg_decode(const void *buf, size_t len,
                                kvf_frame_hdr_t *hdr_p);

#endif
