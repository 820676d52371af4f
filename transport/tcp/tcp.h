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

/* Per-thread growable scratch: metadata and iovec arrays. */
typedef struct kvf_tcp_scratch {
    unsigned char *meta;
    size_t meta_cap;
    struct iovec *iov;
    size_t iov_cap;
} kvf_tcp_scratch_t;

kvf_status_t kvf_tcp_scratch_meta(kvf_tcp_scratch_t *s, size_t len);
kvf_status_t kvf_tcp_scratch_iov(kvf_tcp_scratch_t *s, size_t n);
void kvf_tcp_scratch_free(kvf_tcp_scratch_t *s);

/* Sends a frame header of type with count metadata elements (sent
 * next by the caller) and data_len bytes of payload. */
kvf_status_t kvf_tcp_send_hdr(int fd, uint8_t type, uint64_t id,
                              kvf_status_t status, uint32_t count,
                              uint64_t data_len, uint64_t deadline_ms);
/* Sends DESC carrying the segment descriptor desc (borrowed). */
kvf_status_t kvf_tcp_send_desc(int fd, uint64_t id, const void *desc,
                               uint32_t len, uint64_t deadline_ms);
/* Receives a frame header and checks it against the schema. */
kvf_status_t kvf_tcp_recv_hdr(int fd, kvf_frame_hdr_t *hdr,
                              uint64_t deadline_ms);
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
