/*
 * shm transport: the codec of the messages on its local channel (the
 * handshake, leases and their grants, mappings, staging, sync, sums) and
 * of the probe page. This is the one place that says what each message
 * holds; msg.c encodes and decodes it with core/wire.c only (no I/O), so
 * it can be fuzzed on its own.
 *
 * Frames are core/wire.h headers plus metadata; no payload travels on
 * the socket. File descriptors ride along as SCM_RIGHTS. All integers
 * are little endian.
 *
 *   HELLO       i->t  hello {u32 version, 16-byte nonce, u64 host id}
 *   HELLO_ACK   t->i  hello_ack {u32 pid, u64 epoch}; the probe memfd
 *                     attached, whose first page holds the probe
 *                     {8-byte "KVFSHM1\0", 16-byte nonce, u64 host id}
 *   BEGIN       i->t  flags = op type; count x entry {u64 addr, u64 len},
 *                     count <= KVF_SHM_ENTRIES_MAX. Opens a lease
 *   GRANT       t->i  count = nexc; grant {u64 epoch, u32 left_ms,
 *                     u32 nallocs, u32 nexc}, nallocs x window {u64 id,
 *                     u64 base, u64 len, u64 range}, nexc x exception
 *                     {u32 index, i32 status}; nallocs <=
 *                     KVF_SHM_LEASE_ALLOCS. Entries not listed lie in one
 *                     of the allocations; status KVF_INPROGRESS: moved by
 *                     the target (STAGE), else refused. range: [base,
 *                     base+range) may be used without asking again while
 *                     the lease is open (0: no range grant)
 *   MAP         i->t  u64 id of a granted window
 *   MAP_ACK     t->i  {u64 id, u64 base, u64 len, u64 off}; the memfd of
 *                     the allocation holding it attached, [base, base+len)
 *                     lying at offset off in it (status < 0 and no
 *                     metadata when refused)
 *   STAGE_SETUP i->t  no metadata; the staging memfd attached
 *   STAGE_SETUP_ACK   no metadata
 *   STAGE       i->t  flags = op type; entries, moved by the target
 *                     through the staging buffer, in order
 *   STAGE_ACK   t->i  no metadata; status = the verdict
 *   END         i->t  no metadata: closes the oldest open lease
 *   SYNC        i->t  count x u64 window ids the initiator maps
 *   SYNC_ACK    t->i  u64 epoch, count x u64 ids of those that no longer
 *                     stand (allocation freed, range deregistered)
 *   SUM         i->t  entries
 *   SUM_ACK     t->i  count x u64 checksums (none when status < 0)
 *
 * What the messages mean and when they are sent: shm.h.
 */
#ifndef KVF_SHM_MSG_H
#define KVF_SHM_MSG_H
#if !defined(KVF_LAYER_TRANSPORT) && !defined(KVF_TEST_INTERNALS)
#error "transport/shm/msg.h is private to transport/"
#endif

#include "core/wire.h"

enum kvf_shm_msg {
    KVF_SHM_HELLO = 1,
    KVF_SHM_HELLO_ACK = 2,
    KVF_SHM_BEGIN = 3,
    KVF_SHM_GRANT = 4,
    KVF_SHM_MAP = 5,
    KVF_SHM_MAP_ACK = 6,
    KVF_SHM_STAGE_SETUP = 7,
    KVF_SHM_STAGE_SETUP_ACK = 8,
    KVF_SHM_STAGE = 9,
    KVF_SHM_STAGE_ACK = 10,
    KVF_SHM_END = 11,
    KVF_SHM_SYNC = 13,
    KVF_SHM_SYNC_ACK = 14,
    KVF_SHM_SUM = 15,
    KVF_SHM_SUM_ACK = 16
};

#define KVF_SHM_PROTO        2
#define KVF_SHM_NONCE_LEN    16
#define KVF_SHM_ENTRY_LEN    16    /* entry */
#define KVF_SHM_EXC_LEN      8     /* exception */
#define KVF_SHM_ID_LEN       8     /* id or checksum in a list */
#define KVF_SHM_ENTRIES_MAX  65536 /* per message */
#define KVF_SHM_LEASE_ALLOCS 64    /* allocations one GRANT may list */
#define KVF_SHM_PROBE_MAGIC  "KVFSHM1"
#define KVF_SHM_PROBE_LEN    4096
/* fixed sizes of messages and of the parts of GRANT and SYNC_ACK */
#define KVF_SHM_HELLO_LEN       (4 + KVF_SHM_NONCE_LEN + 8)
#define KVF_SHM_HELLO_ACK_LEN   (4 + 8)
#define KVF_SHM_MAP_LEN         8
#define KVF_SHM_MAP_ACK_LEN     (4 * 8)
#define KVF_SHM_GRANT_HEAD_LEN  (8 + 3 * 4)
#define KVF_SHM_GRANT_ALLOC_LEN (4 * 8)
#define KVF_SHM_SYNC_HEAD_LEN   8
#define KVF_SHM_PROBE_MAGIC_LEN 8

typedef struct kvf_shm_hello {
    uint32_t version;
    unsigned char nonce[KVF_SHM_NONCE_LEN];
    uint64_t host_id;
} kvf_shm_hello_t;

typedef struct kvf_shm_hello_ack {
    uint32_t pid;
    uint64_t epoch;
} kvf_shm_hello_ack_t;

typedef struct kvf_shm_entry {
    uint64_t addr;
    uint64_t len;
} kvf_shm_entry_t;

/* A window of a target allocation (the pages of one registered range
 * inside it): GRANT lists id, base, len and range (off decodes as 0),
 * MAP_ACK id, base, len and off (range decodes as 0). */
typedef struct kvf_shm_alloc {
    uint64_t id;
    uint64_t base;
    uint64_t len;
    uint64_t range;
    uint64_t off; /* of base in the allocation's memfd */
} kvf_shm_alloc_t;

typedef struct kvf_shm_exc {
    uint32_t index;      /* of the entry in BEGIN */
    kvf_status_t status; /* KVF_INPROGRESS or < 0 once decoded */
} kvf_shm_exc_t;

typedef struct kvf_shm_grant {
    uint64_t epoch;
    uint32_t left_ms;
    uint32_t nallocs;
    uint32_t nexc;
    kvf_shm_alloc_t allocs[KVF_SHM_LEASE_ALLOCS];
} kvf_shm_grant_t;

/* Fixed-size messages: the decoders fail (KVF_ERR_PROTOCOL) on any
 * other length. */
void kvf_shm_hello_enc(kvf_wr_t *w, const kvf_shm_hello_t *m);
kvf_status_t kvf_shm_hello_dec(const void *meta, size_t len,
                               kvf_shm_hello_t *m);
void kvf_shm_hello_ack_enc(kvf_wr_t *w, const kvf_shm_hello_ack_t *m);
kvf_status_t kvf_shm_hello_ack_dec(const void *meta, size_t len,
                                   kvf_shm_hello_ack_t *m);
void kvf_shm_map_enc(kvf_wr_t *w, uint64_t id);
kvf_status_t kvf_shm_map_dec(const void *meta, size_t len, uint64_t *id_p);
void kvf_shm_map_ack_enc(kvf_wr_t *w, const kvf_shm_alloc_t *a);
kvf_status_t kvf_shm_map_ack_dec(const void *meta, size_t len,
                                 kvf_shm_alloc_t *a);

/* The probe page (len bytes, at least KVF_SHM_PROBE_LEN to encode). */
void kvf_shm_probe_enc(unsigned char *page, size_t len,
                       const unsigned char nonce[KVF_SHM_NONCE_LEN],
                       uint64_t host_id);
/* KVF_ERR_PROTOCOL when the magic is wrong or the page short. */
kvf_status_t kvf_shm_probe_dec(const unsigned char *page, size_t len,
                               unsigned char nonce[KVF_SHM_NONCE_LEN],
                               uint64_t *host_id_p);

/* Lists: *_open checks h's count against its metadata and points r at
 * the first element; each element is then read with its *_dec, which
 * needs no further checks (the reader fails by itself past the end). */
void kvf_shm_entry_enc(kvf_wr_t *w, uint64_t addr, uint64_t len);
kvf_status_t kvf_shm_entries_open(kvf_rd_t *r, const kvf_frame_hdr_t *h,
                                  const void *meta);
void kvf_shm_entry_dec(kvf_rd_t *r, kvf_shm_entry_t *e);
/* SYNC ids, SYNC_ACK ids (after its epoch) and SUM_ACK checksums. */
void kvf_shm_id_enc(kvf_wr_t *w, uint64_t id);
kvf_status_t kvf_shm_ids_open(kvf_rd_t *r, const kvf_frame_hdr_t *h,
                              const void *meta);
uint64_t kvf_shm_id_dec(kvf_rd_t *r);
void kvf_shm_sync_ack_enc(kvf_wr_t *w, uint64_t epoch, const uint64_t *ids,
                          uint32_t n);
kvf_status_t kvf_shm_sync_ack_open(kvf_rd_t *r, const kvf_frame_hdr_t *h,
                                   const void *meta, uint64_t *epoch_p);

/* GRANT: g->nallocs allocations and g->nexc exceptions from excs. */
void kvf_shm_grant_enc(kvf_wr_t *w, const kvf_shm_grant_t *g,
                       const kvf_shm_exc_t *excs);
/* Decodes the fixed part and the allocations (a range larger than its
 * allocation decodes as 0) and checks the length; r is left at the
 * exceptions, read with kvf_shm_exc_dec. */
kvf_status_t kvf_shm_grant_dec(kvf_rd_t *r, const void *meta, size_t len,
                               kvf_shm_grant_t *g);
/* A status other than KVF_INPROGRESS or an error decodes as
 * KVF_ERR_PROTOCOL. */
void kvf_shm_exc_dec(kvf_rd_t *r, kvf_shm_exc_t *e);

/* Decodes one whole message (header, then its metadata) from buf,
 * every element read. For tests and fuzzing. */
kvf_status_t kvf_shm_msg_decode(const void *buf, size_t len,
                                kvf_frame_hdr_t *hdr_p);

#endif
