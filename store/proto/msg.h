/*
 * Store RPC messages: what every body holds, as typed structs, and their
 * schemas (declared once in msg.c; schema.h: one table-driven codec for
 * all). Frames (header, send, receive) are proto.h's. Decoders never read
 * past the body: a short or malformed body latches the reader's error
 * (kvf_rd_status), and kvf_sm_req_check() refuses a request body that is
 * not exactly `count` entries of its type.
 *
 * Little-endian; str = u16 length + bytes, no NUL; status = i32
 * (kvf_status_t); reps = u8 n, n x {str segment, u64 addr}.
 *
 *   message    request body                     reply body
 *   NODE_REG   kvf_sm_node_reg_t                kvf_sm_node_reg_rep_t
 *              str segment, u64 uid,            u64 master_epoch,
 *              u64 pool_addr, u64 pool_len,     u64 node_gen,
 *              16 bytes instance (a body
 *              without it is the older format,
 *              which the master refuses),
 *              str inv_addr (optional: where
 *              the node's inventory listens),
 *              u64 disk_len (optional: the
 *              bytes of its disk tier, served
 *              at inv_addr)
 *                                               u32 heartbeat_ms,
 *                                               u32 ttl_ms
 *   HEARTBEAT  kvf_sm_heartbeat_t               empty (frame status
 *              u64 uid, u64 node_gen,           KVF_ERR_STALE: register
 *              u64 master_epoch                 again)
 *   PUT_START  count x kvf_sm_req_t             count x kvf_sm_obj_t
 *              str key, u64 size,               status, u64 put_id, reps
 *              u8 replicas, u8 flags
 *   PUT_END    count x kvf_sm_req_t             count x status
 *              str key, u64 put_id,
 *              u64 checksum, u8 mask
 *   GET        count x kvf_sm_req_t: str key    count x kvf_sm_obj_t
 *                                               status, u64 size,
 *                                               u64 checksum,
 *                                               u32 lease_ms, reps
 *   REMOVE,    count x kvf_sm_req_t: str key    count x status
 *   EXISTS
 *   COMMIT     count x kvf_sm_req_t             count x kvf_sm_obj_t
 *              str key, u64 put_id, u64 size,   status,
 *              u64 checksum, u8 mask,           u32 put_timeout_ms,
 *              u8 flags, u64 next_size,         u64 next_id (put_id),
 *              u8 next_replicas                 reps
 *   LIST       kvf_sm_list_t                    count x kvf_sm_list_ent_t
 *              str prefix, u32 max              str key, u64 size,
 *                                               u8 committed, u8 nrep
 *   INV_ADD,   count x kvf_sm_inv_ent_t         count x status
 *   INV_DEL    str key, u64 off, u64 size,
 *              u64 checksum, u64 epoch, u64 seq,
 *              u8 flags (KVF_STORE_PIN; in an
 *              INV_ADD, KVF_SM_INV_FORGET:
 *              the entry is deleted, as by
 *              INV_DEL; applied in order)
 *   NODES      empty (count 0)                  count x kvf_sm_node_ent_t
 *                                               str segment, u64 pool_addr,
 *                                               u64 pool_len
 *   INV_REPORT u64 uid, u64 node_gen, then      empty
 *              count x kvf_sm_inv_ent_t (a
 *              page; count 0: the report ends;
 *              an entry flagged KVF_SM_INV_DISK
 *              lies in the node's disk tier, off
 *              in its file)
 *   TIER_OP    count x kvf_sm_tier_op_t         count x status
 *              u8 op, str key, u64 pool_off,
 *              u64 disk_off, u64 size,
 *              u64 checksum, u64 seq, u8 flags
 *
 * Fixed part of an entry after its key (bytes): PUT_START 10, PUT_END
 * 17, COMMIT 35, GET/REMOVE/EXISTS 0. A PUT_END or COMMIT mask of 0
 * aborts; mask bit k: replica k was written. COMMIT's put_id names a
 * pending put (as PUT_END) or a reservation, which becomes the object
 * `key` (size must be the reserved size); on success with next_size >
 * 0 the reply carries a reservation of next_size bytes (next_id, 0 =
 * none; at most KVF_STORE_RESV_MAX) for the client's next put,
 * reclaimed at the put timeout unless committed. LIST's reply flags
 * carry KVF_SP_TRUNCATED when cut short.
 */
#ifndef KVF_STORE_MSG_H
#define KVF_STORE_MSG_H
#if !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "store/proto/msg.h is private to store/: use <kvferry/store.h>"
#endif

#include "store/proto/proto.h"
#include "store/proto/schema.h"

/* One entry of a keyed request (PUT_START, PUT_END, COMMIT, GET,
 * REMOVE, EXISTS); each type uses the fields its schema names. */
typedef struct kvf_sm_req {
    const char *key;         /* encode: the caller's; decode: keybuf */
    kvf_status_t key_status; /* decode: the key's verdict (kvf_sp_rd_key) */
    uint64_t size;
    uint64_t put_id;
    uint64_t checksum;
    uint64_t next_size;
    uint8_t replicas;
    uint8_t flags; /* KVF_STORE_PIN */
    uint8_t mask;
    uint8_t next_replicas;
    char keybuf[KVF_STORE_KEY_MAX + 1];
} kvf_sm_req_t;

/* One entry of a GET, PUT_START or COMMIT reply: what the master says of
 * one object and where its replicas (or a reservation's) are. */
typedef struct kvf_sm_obj {
    kvf_status_t status;
    uint64_t put_id;         /* PUT_START: the put; COMMIT: next_id */
    uint64_t size;           /* GET */
    uint64_t checksum;       /* GET */
    uint32_t lease_ms;       /* GET: the read lease granted */
    uint32_t put_timeout_ms; /* COMMIT */
    unsigned nrep;
    char seg[KVF_STORE_REPLICA_MAX][KVF_STORE_SEG_MAX];
    uint64_t addr[KVF_STORE_REPLICA_MAX];
} kvf_sm_obj_t;

#define KVF_SM_INSTANCE_LEN 16
#define KVF_SM_INV_ADDR_MAX 128

/* master_epoch of a leader elected through etcd: this bit set, its
 * term's etcd revision below; nodes refuse one older than the newest
 * they have seen. A single master's epoch has the bit clear. */
#define KVF_SM_HA_EPOCH (1ull << 63)

typedef struct kvf_sm_node_reg {
    char segment[KVF_STORE_SEG_MAX];
    uint64_t uid;
    uint64_t pool_addr;
    uint64_t pool_len;
    /* random, drawn by the node process at start: a re-registration of
     * a live segment is accepted only from the same instance */
    unsigned char instance[KVF_SM_INSTANCE_LEN];
    int has_instance; /* decoded: 0 for the older format */
    /* host:port of the node's inventory server ("" = none) */
    char inv_addr[KVF_SM_INV_ADDR_MAX];
    uint64_t disk_len; /* bytes of its disk tier (0 = none) */
} kvf_sm_node_reg_t;

typedef struct kvf_sm_node_reg_rep {
    uint64_t master_epoch;
    uint64_t node_gen;
    uint32_t heartbeat_ms;
    uint32_t ttl_ms;
} kvf_sm_node_reg_rep_t;

typedef struct kvf_sm_heartbeat {
    uint64_t uid;
    uint64_t node_gen;
    uint64_t master_epoch;
} kvf_sm_heartbeat_t;

typedef struct kvf_sm_list {
    char prefix[KVF_STORE_KEY_MAX + 1];
    uint32_t max; /* 0 = no limit */
} kvf_sm_list_t;

typedef struct kvf_sm_list_ent {
    const char *key; /* encode: the caller's; decode: keybuf */
    uint64_t size;
    uint8_t committed;
    uint8_t nrep;
    char keybuf[KVF_STORE_KEY_MAX + 1];
} kvf_sm_list_ent_t;

/* One node of a NODES reply: its segment and the pool it registered. */
typedef struct kvf_sm_node_ent {
    char segment[KVF_STORE_SEG_MAX];
    uint64_t pool_addr;
    uint64_t pool_len;
} kvf_sm_node_ent_t;

#define KVF_SM_NODE_ENT_FIXED (2 + 8 + 8)

/* One inventory entry (inv.h): an object's key, its place in the
 * node's pool (offset from the pool's base), size, checksum, the epoch
 * of the leader that committed it and that leader's sequence number of
 * the commit (later commits of a key have larger ones). */
typedef struct kvf_sm_inv_ent {
    const char *key; /* encode: the caller's; decode: keybuf */
    uint64_t off;
    uint64_t size;
    uint64_t checksum;
    uint64_t epoch;
    uint64_t seq;
    uint8_t flags; /* KVF_STORE_PIN, KVF_SM_INV_FORGET */
    char keybuf[KVF_STORE_KEY_MAX + 1];
} kvf_sm_inv_ent_t;

/* The head of an INV_REPORT page. */
typedef struct kvf_sm_inv_head {
    uint64_t uid;
    uint64_t node_gen;
} kvf_sm_inv_head_t;

/* A status alone (the reply entry of PUT_END, REMOVE, EXISTS, INV_*,
 * TIER_OP). */
typedef struct kvf_sm_status {
    kvf_status_t status;
} kvf_sm_status_t;

/* An INV_ADD entry with this flag is a delete (as INV_DEL's): a leader
 * sends its adds and deletes in one frame, in the order it made them. */
#define KVF_SM_INV_FORGET 0x80

/* An inventory entry (INV_REPORT) of an object in the node's disk tier:
 * off is its place in the tier's file. */
#define KVF_SM_INV_DISK 0x40

/* One operation on a node's disk tier (store/node/tier.h). */
enum { KVF_TIER_WRITE = 1, KVF_TIER_READ = 2, KVF_TIER_DROP = 3 };

typedef struct kvf_sm_tier_op {
    uint8_t op; /* KVF_TIER_* */
    const char *key; /* encode: the caller's; decode: keybuf */
    uint64_t pool_off; /* WRITE, READ: the object's place in the pool */
    uint64_t disk_off; /* its place in the tier's file (4 KiB aligned) */
    uint64_t size;
    uint64_t checksum;
    uint64_t seq;  /* the master's commit number (newer wins) */
    uint8_t flags; /* KVF_STORE_PIN */
    kvf_status_t status; /* the node's answer (not on the wire here) */
    char keybuf[KVF_STORE_KEY_MAX + 1];
} kvf_sm_tier_op_t;

/* Bytes a TIER_OP entry takes besides its key. */
#define KVF_SM_TIER_OP_FIXED (1 + 2 + 5 * 8 + 1)

/* Bytes an inventory entry takes besides its key. */
#define KVF_SM_INV_ENT_FIXED (2 + 5 * 8 + 1)

/* Bytes a LIST reply entry takes besides its key. */
#define KVF_SM_LIST_ENT_FIXED (2 + 8 + 1 + 1)

/* The schemas (schema.h, msg.c): one codec reads and writes them all. */
extern const kvf_sm_schema_t kvf_sm_s_key, kvf_sm_s_put_start,
    kvf_sm_s_put_end, kvf_sm_s_commit, kvf_sm_s_put_start_rep,
    kvf_sm_s_get_rep, kvf_sm_s_commit_rep, kvf_sm_s_node_reg,
    kvf_sm_s_node_reg_rep, kvf_sm_s_heartbeat, kvf_sm_s_list,
    kvf_sm_s_list_ent, kvf_sm_s_node_ent, kvf_sm_s_inv_ent,
    kvf_sm_s_inv_head, kvf_sm_s_tier_op, kvf_sm_s_status;

/* Keyed requests: one entry each (GET, REMOVE, EXISTS: the key alone). */
#define kvf_sm_put_start_enc(w, q) kvf_sm_enc((w), &kvf_sm_s_put_start, (q))
#define kvf_sm_put_start_dec(r, q) kvf_sm_dec((r), &kvf_sm_s_put_start, (q))
#define kvf_sm_put_end_enc(w, q)   kvf_sm_enc((w), &kvf_sm_s_put_end, (q))
#define kvf_sm_put_end_dec(r, q)   kvf_sm_dec((r), &kvf_sm_s_put_end, (q))
#define kvf_sm_commit_enc(w, q)    kvf_sm_enc((w), &kvf_sm_s_commit, (q))
#define kvf_sm_commit_dec(r, q)    kvf_sm_dec((r), &kvf_sm_s_commit, (q))
#define kvf_sm_key_dec(r, q)       kvf_sm_dec((r), &kvf_sm_s_key, (q))
void kvf_sm_key_enc(kvf_wr_t *w, const char *key);
/* Any keyed request's entry, by message type; KVF_ERR_PROTOCOL for a
 * type without keyed entries. */
kvf_status_t kvf_sm_req_dec(kvf_rd_t *r, uint8_t type, kvf_sm_req_t *q);

/* Keyed replies: one entry each. A GET entry naming no replica is
 * turned into KVF_ERR_NOT_FOUND. */
void kvf_sm_status_enc(kvf_wr_t *w, kvf_status_t status);
kvf_status_t kvf_sm_status_dec(kvf_rd_t *r);
#define kvf_sm_put_start_rep_enc(w, o)                                         \
    kvf_sm_enc((w), &kvf_sm_s_put_start_rep, (o))
#define kvf_sm_put_start_rep_dec(r, o)                                         \
    kvf_sm_dec((r), &kvf_sm_s_put_start_rep, (o))
#define kvf_sm_get_rep_enc(w, o)    kvf_sm_enc((w), &kvf_sm_s_get_rep, (o))
#define kvf_sm_get_rep_dec(r, o)    kvf_sm_dec((r), &kvf_sm_s_get_rep, (o))
#define kvf_sm_commit_rep_enc(w, o) kvf_sm_enc((w), &kvf_sm_s_commit_rep, (o))
#define kvf_sm_commit_rep_dec(r, o) kvf_sm_dec((r), &kvf_sm_s_commit_rep, (o))

/* Whole-body messages, and the entries of the other bodies. */
#define kvf_sm_node_reg_enc(w, m) kvf_sm_enc((w), &kvf_sm_s_node_reg, (m))
#define kvf_sm_node_reg_dec(r, m) kvf_sm_dec((r), &kvf_sm_s_node_reg, (m))
#define kvf_sm_node_reg_rep_enc(w, m)                                          \
    kvf_sm_enc((w), &kvf_sm_s_node_reg_rep, (m))
#define kvf_sm_node_reg_rep_dec(r, m)                                          \
    kvf_sm_dec((r), &kvf_sm_s_node_reg_rep, (m))
#define kvf_sm_heartbeat_enc(w, m) kvf_sm_enc((w), &kvf_sm_s_heartbeat, (m))
#define kvf_sm_heartbeat_dec(r, m) kvf_sm_dec((r), &kvf_sm_s_heartbeat, (m))
#define kvf_sm_list_enc(w, m)      kvf_sm_enc((w), &kvf_sm_s_list, (m))
#define kvf_sm_list_dec(r, m)      kvf_sm_dec((r), &kvf_sm_s_list, (m))
#define kvf_sm_list_ent_enc(w, e)  kvf_sm_enc((w), &kvf_sm_s_list_ent, (e))
#define kvf_sm_list_ent_dec(r, e)  kvf_sm_dec((r), &kvf_sm_s_list_ent, (e))
#define kvf_sm_node_ent_enc(w, e)  kvf_sm_enc((w), &kvf_sm_s_node_ent, (e))
#define kvf_sm_node_ent_dec(r, e)  kvf_sm_dec((r), &kvf_sm_s_node_ent, (e))
#define kvf_sm_inv_ent_enc(w, e)   kvf_sm_enc((w), &kvf_sm_s_inv_ent, (e))
#define kvf_sm_inv_ent_dec(r, e)   kvf_sm_dec((r), &kvf_sm_s_inv_ent, (e))
#define kvf_sm_inv_head_enc(w, h)  kvf_sm_enc((w), &kvf_sm_s_inv_head, (h))
#define kvf_sm_inv_head_dec(r, h)  kvf_sm_dec((r), &kvf_sm_s_inv_head, (h))
#define kvf_sm_tier_op_enc(w, o)   kvf_sm_enc((w), &kvf_sm_s_tier_op, (o))
#define kvf_sm_tier_op_dec(r, o)   kvf_sm_dec((r), &kvf_sm_s_tier_op, (o))

/* An INV_* body: exactly `count` entries (INV_ADD, INV_DEL: 1 to
 * KVF_STORE_BATCH_MAX; INV_REPORT: 0 to KVF_STORE_BATCH_MAX after its
 * head), each key 1..KVF_STORE_KEY_MAX bytes; KVF_ERR_PROTOCOL otherwise
 * (another type included). */
kvf_status_t kvf_sm_inv_check(uint8_t type, uint32_t count, const void *body,
                              size_t len);
/* A TIER_OP body: exactly `count` (1 to KVF_STORE_BATCH_MAX) entries of a
 * known op, each key 1..KVF_STORE_KEY_MAX bytes; KVF_ERR_PROTOCOL
 * otherwise. */
kvf_status_t kvf_sm_tier_check(uint32_t count, const void *body, size_t len);

/* Checks a request body against its type's schema: `count` (at most
 * KVF_STORE_BATCH_MAX) keyed entries, or one whole-body message, and not
 * a byte more. KVF_ERR_PROTOCOL if it does not parse (an unknown type
 * included). Per-key verdicts (a key too long) are not errors here. */
kvf_status_t kvf_sm_req_check(uint8_t type, uint32_t count, const void *body,
                              size_t len);

/* The end of a reply body read with r: KVF_ERR_PROTOCOL if it did not
 * parse or holds a count other than the `want` entries asked for. */
kvf_status_t kvf_sm_rep_end(const kvf_rd_t *r, uint32_t count, uint32_t want);

#endif
