/*
 * tcp transport, private: the structures shared by the server side
 * (tcp_server.c), the initiator side (tcp_ep.c) and the frame helpers
 * (tcp_proto.c). The messages and their codec are in msg.h.
 */
#ifndef KVF_TCP_H
#define KVF_TCP_H
#if !defined(KVF_LAYER_TRANSPORT) && !defined(KVF_TEST_INTERNALS)
#error "transport/tcp/tcp.h is private to transport/"
#endif

#include "transport/transport.h"
#include "transport/limits.h"
#include "transport/tcp/msg.h"
#include "core/sock.h"

#include <pthread.h>
#include <sys/uio.h>

#define KVF_TCP_SOCKBUF (4 << 20)
#define KVF_TCP_WINDOW  4

/* Per-thread growable scratch: metadata and iovec arrays (pmac: a copy
 * of a payload's iovecs, for its tag once the bytes are in). */
typedef struct kvf_tcp_scratch {
    unsigned char *meta;
    size_t meta_cap;
    struct iovec *iov;
    size_t iov_cap;
    struct iovec *pmac;
    size_t pmac_cap;
} kvf_tcp_scratch_t;

kvf_status_t kvf_tcp_scratch_meta(kvf_tcp_scratch_t *s, size_t len);
kvf_status_t kvf_tcp_scratch_iov(kvf_tcp_scratch_t *s, size_t n);
/* Copies iov[0..n) into s->pmac. */
kvf_status_t kvf_tcp_scratch_pmac(kvf_tcp_scratch_t *s, const struct iovec *iov,
                                  size_t n);
void kvf_tcp_scratch_free(kvf_tcp_scratch_t *s);

/*
 * Frames on an authenticated connection (core/wire.h): header |
 * metadata | tag | payload, and with payload tags (mac->payload) a
 * second tag after a payload that is not empty. mac may be NULL or off
 * (no tags).
 */
/* Packs h into hdr and, when mac is on, seals it with meta (h->meta_len
 * bytes) into tag; returns the tag's length (0 when off). */
size_t kvf_tcp_seal(kvf_wire_mac_t *mac, const kvf_frame_hdr_t *h,
                    const void *meta, unsigned char hdr[KVF_WIRE_HDR_LEN],
                    unsigned char tag[KVF_WIRE_TAG_LEN]);
/* Sends header, meta (meta_len bytes, may be NULL) and tag of a frame
 * of type with count metadata elements and data_len bytes of payload
 * (sent next by the caller). */
kvf_status_t kvf_tcp_send_frame(int fd, kvf_wire_mac_t *mac, uint8_t type,
                                uint64_t id, kvf_status_t status,
                                uint32_t count, const void *meta,
                                uint32_t meta_len, uint64_t data_len,
                                uint64_t deadline_ms);
/* Receives a frame header and checks it against the schema. */
kvf_status_t kvf_tcp_recv_hdr(int fd, kvf_frame_hdr_t *hdr,
                              uint64_t deadline_ms);
/* The same when the first got bytes of the header are already in buf. */
kvf_status_t kvf_tcp_recv_hdr_rest(int fd, unsigned char buf[KVF_WIRE_HDR_LEN],
                                   size_t got, kvf_frame_hdr_t *hdr,
                                   uint64_t deadline_ms);
/* Receives the metadata of the frame h (into meta, h->meta_len bytes)
 * and its tag, and checks the tag: KVF_ERR_AUTH when it does not match
 * (logged with where). */
kvf_status_t kvf_tcp_recv_meta(int fd, kvf_wire_mac_t *mac,
                               const kvf_frame_hdr_t *h, void *meta,
                               uint64_t deadline_ms, const char *where);
/* Payload tags: the tag over the host memory iov[0..n) (in the payload's
 * order), of the frame just sealed (tx = 1) or checked (tx = 0). */
void kvf_tcp_ptag(kvf_wire_mac_t *mac, int tx, const struct iovec *iov,
                  size_t n, unsigned char tag[KVF_WIRE_TAG_LEN]);
/* Receives the payload tag after bytes that landed in iov[0..n) and
 * checks it: KVF_ERR_AUTH (logged with where) when it does not match. */
kvf_status_t kvf_tcp_recv_ptag(int fd, kvf_wire_mac_t *mac,
                               const struct iovec *iov, size_t n,
                               uint64_t deadline_ms, const char *where);
/* p2p metadata (ops fetch_descriptor): HELLO to the tcp iface at address,
 * returns the segment descriptor it serves (caller kvf_free()s it). */
kvf_status_t kvf_tcp_fetch_descriptor(const char *address, int timeout_ms,
                                      void **desc_p, size_t *len_p);

typedef struct kvf_tcp_server kvf_tcp_server_t;
typedef struct kvf_tcp_cconn kvf_tcp_cconn_t;

struct kvf_tl_ep {
    kvf_tl_iface_t *iface;
    char host[KVF_HOST_MAX];
    uint16_t port;
    char where[KVF_HOST_MAX + 16]; /* "tcp host:port", for log lines */
    unsigned nconns;
    kvf_tcp_cconn_t *conns;
    unsigned rr; /* rotates the first connection tried by post */
};

struct kvf_tl_iface {
    kvf_tl_config_t cfg;
    kvf_tl_target_t target;
    kvf_tcp_server_t *server; /* NULL when no_listen */
    char address[KVF_HOST_MAX + 8];
};

kvf_status_t kvf_tcp_server_start(kvf_tl_iface_t *iface);
void kvf_tcp_server_stop(kvf_tl_iface_t *iface);

kvf_status_t kvf_tcp_ep_open(kvf_tl_iface_t *iface, const char *address,
                             kvf_tl_ep_t **ep_p);
void kvf_tcp_ep_close(kvf_tl_ep_t *ep);
kvf_status_t kvf_tcp_ep_post(kvf_tl_ep_t *ep, kvf_tl_req_t *req);
kvf_status_t kvf_tcp_ep_post_inline(kvf_tl_ep_t *ep, kvf_tl_req_t *req);
kvf_status_t kvf_tcp_ep_checksum(kvf_tl_ep_t *ep, const uint64_t *remote,
                                 const size_t *lengths, size_t count,
                                 uint64_t *sums);
kvf_status_t kvf_tcp_ep_link_test(kvf_tl_ep_t *ep, kvf_op_type_t type,
                                  void *local, uint64_t remote, size_t length,
                                  double *seconds_p);

#endif
