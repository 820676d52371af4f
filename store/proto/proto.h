/*
 * Store RPC framing: the messages between clients, nodes and the master,
 * framed with core/wire.h (magic, version, type, lengths). A request's
 * body is its metadata (meta_len bytes, `count` entries); a reply has the
 * request's type | KVF_SP_REPLY, the request's id, and a status. The store
 * RPC never carries payload: data moves through the engine, so a frame
 * with data_len != 0 is refused. On an authenticated connection every
 * frame ends with its tag (core/wire.h: header | body | tag), checked
 * before the frame is used; `mac` (may be NULL: no tags) is the
 * connection's. What each body holds, and its codec, is
 * store/proto/msg.h.
 */
#ifndef KVF_STORE_PROTO_H
#define KVF_STORE_PROTO_H
#if !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "store/proto/proto.h is private to store/: use <kvferry/store.h>"
#endif

#include <kvferry/store.h>

#include "core/config.h"
#include "core/wire.h"

enum kvf_sp_msg {
    KVF_SP_NODE_REG = 0x41,
    KVF_SP_HEARTBEAT = 0x42,
    KVF_SP_PUT_START = 0x43,
    KVF_SP_PUT_END = 0x44,
    KVF_SP_GET = 0x45,
    KVF_SP_REMOVE = 0x46,
    KVF_SP_EXISTS = 0x47,
    KVF_SP_LIST = 0x48,
    KVF_SP_COMMIT = 0x49,
    /* node inventory (inv.h): leader -> node on the leader's own
     * connection (INV_ADD, INV_DEL), node -> new leader after it
     * registers (INV_REPORT, in pages); count x kvf_sm_inv_ent_t */
    KVF_SP_INV_ADD = 0x4a,
    KVF_SP_INV_DEL = 0x4b,
    KVF_SP_INV_REPORT = 0x4c,
    /* client -> master: the nodes and their pools (view maps) */
    KVF_SP_NODES = 0x4d,
    /* a node's disk tier (store/node/tier.h): master -> node, on a
     * connection of its own to the node's inventory server;
     * count x kvf_sm_tier_op_t */
    KVF_SP_TIER_OP = 0x4e,
    KVF_SP_MSG_LAST = 0x4e,
    KVF_SP_ERROR = 0x7f /* reply to a frame that could not be served */
};

#define KVF_SP_REPLY       0x80
#define KVF_SP_TRUNCATED   0x1
#define KVF_SP_BODY_MAX    (4u << 20) /* = KVF_WIRE_META_MAX */
#define KVF_STORE_RESV_MAX (4u << 20) /* largest reservation (COMMIT) */

/* The `store` config table (master, nodes and clients share it). */
extern const kvf_config_table_t kvf_store_config;

/* A received frame: header plus its body in a growable buffer. */
typedef struct kvf_sp_frame {
    kvf_frame_hdr_t hdr;
    unsigned char *body;
    size_t cap;
    int partial; /* kvf_sp_recv got some bytes of the frame */
} kvf_sp_frame_t;

void kvf_sp_frame_free(kvf_sp_frame_t *f);

/* Sends one frame: header + w's bytes (w may be NULL: empty body) +
 * tag. */
kvf_status_t kvf_sp_send(int fd, kvf_wire_mac_t *mac, uint8_t type, uint64_t id,
                         kvf_status_t status, uint32_t count, uint16_t flags,
                         const kvf_wr_t *w, uint64_t deadline_ms);
/* Bytes a frame of h takes on the wire with mac (header, body, tag). */
size_t kvf_sp_frame_len(const kvf_wire_mac_t *mac, const kvf_frame_hdr_t *h);

/* Receives one frame. Checks magic, version, lengths (body at most
 * KVF_SP_BODY_MAX, no payload). first_deadline_ms bounds the wait for
 * the first byte (a server waiting for the next request), deadline_ms the
 * rest. KVF_ERR_PEER_CLOSED: the peer closed before the first byte;
 * f->partial tells a timeout before any byte from one inside a frame. */
kvf_status_t kvf_sp_recv(int fd, kvf_wire_mac_t *mac, kvf_sp_frame_t *f,
                         uint64_t first_deadline_ms, uint64_t deadline_ms);

/* One round trip on a connected fd; the reply must have type|REPLY and
 * the same id. Returns transport errors; the reply's status is in
 * f->hdr.status. */
kvf_status_t kvf_sp_call(int fd, kvf_wire_mac_t *mac, uint8_t type, uint64_t id,
                         uint32_t count, const kvf_wr_t *w, kvf_sp_frame_t *f,
                         uint64_t deadline_ms);
/* The second half of kvf_sp_call, for a caller that sent the request
 * with kvf_sp_send and did other work meanwhile. */
kvf_status_t kvf_sp_call_end(int fd, kvf_wire_mac_t *mac, uint8_t type,
                             uint64_t id, kvf_sp_frame_t *f,
                             uint64_t deadline_ms);

/* Keys: writes a str; reads one into out[KVF_STORE_KEY_MAX + 1] with a
 * per-key verdict (KVF_ERR_KEY_TOO_LARGE, KVF_ERR_INVALID_PARAM for an
 * empty key or one holding NUL) that leaves the reader usable; a
 * truncated body latches the reader's error. */
kvf_status_t kvf_sp_rd_key(kvf_rd_t *r, char *out);

/* Checks a caller's key before it goes on the wire. */
kvf_status_t kvf_sp_key_check(const char *key);

const char *kvf_sp_msg_name(uint8_t type);

/* The master's abstract unix socket. Its name comes from the tcp address
 * (abstract names live per network namespace: only a process in the
 * master's namespace reaches it, where 127.0.0.1:port is that master):
 * "kvferry-master-PORT" for 127.0.0.1/localhost (and, listening, for a
 * wildcard address), "kvferry-master-HOST-PORT" for another loopback
 * address. Returns 1 and the name in buf, or 0 when host is no loopback
 * (nor a wildcard the master listens on) or port is 0. */
int kvf_sp_unix_name(const char *host, uint16_t port, int listening, char *buf,
                     size_t len);
/* 127.0.0.0/8, localhost, ::1 */
int kvf_sp_is_loopback(const char *host);
kvf_status_t kvf_sp_unix_listen(const char *name, int backlog, int *fd_p);
/* Connects at once or fails (no wait: tcp is the fallback); the fd is
 * blocking. */
kvf_status_t kvf_sp_unix_connect(const char *name, int *fd_p);

#endif
