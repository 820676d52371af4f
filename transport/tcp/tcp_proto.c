/*
 * tcp transport helpers shared by both sides: scratch buffers, sending
 * and receiving frame headers, and the HELLO exchange used by the p2p
 * metadata backend to fetch a segment descriptor.
 */
#include "transport/tcp/tcp.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/log.h"
#include "core/time.h"

#include <string.h>
#include <unistd.h>

kvf_status_t kvf_tcp_scratch_meta(kvf_tcp_scratch_t *s, size_t len)
{
    unsigned char *p;

    if (len <= s->meta_cap) {
        return KVF_OK;
    }
    p = kvf_realloc(s->meta, len);
    if (p == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    s->meta = p;
    s->meta_cap = len;
    return KVF_OK;
}

kvf_status_t kvf_tcp_scratch_iov(kvf_tcp_scratch_t *s, size_t n)
{
    struct iovec *p;

    if (n <= s->iov_cap) {
        return KVF_OK;
    }
    p = kvf_realloc(s->iov, n * sizeof(*p));
    if (p == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    s->iov = p;
    s->iov_cap = n;
    return KVF_OK;
}

void kvf_tcp_scratch_free(kvf_tcp_scratch_t *s)
{
    kvf_free(s->meta);
    kvf_free(s->iov);
    memset(s, 0, sizeof(*s));
}

kvf_status_t kvf_tcp_send_hdr(int fd, uint8_t type, uint64_t id,
                              kvf_status_t status, uint32_t count,
                              uint64_t data_len, uint64_t deadline_ms)
{
    unsigned char buf[KVF_WIRE_HDR_LEN];
    kvf_frame_hdr_t h;

    kvf_tcp_hdr_init(&h, type, id, status, count, data_len);
    kvf_frame_pack(&h, buf);
    return kvf_sock_send_all(fd, buf, sizeof(buf), deadline_ms);
}

kvf_status_t kvf_tcp_send_desc(int fd, uint64_t id, const void *desc,
                               uint32_t len, uint64_t deadline_ms)
{
    unsigned char buf[KVF_WIRE_HDR_LEN];
    kvf_frame_hdr_t h;
    kvf_status_t status;

    kvf_tcp_hdr_init(&h, KVF_TCP_DESC, id, KVF_OK, 0, 0);
    h.meta_len = len;
    kvf_frame_pack(&h, buf);
    status = kvf_sock_send_all(fd, buf, sizeof(buf), deadline_ms);
    if (status == KVF_OK) {
        status = kvf_sock_send_all(fd, desc, len, deadline_ms);
    }
    return status;
}

kvf_status_t kvf_tcp_recv_hdr(int fd, kvf_frame_hdr_t *hdr,
                              uint64_t deadline_ms)
{
    unsigned char buf[KVF_WIRE_HDR_LEN];
    kvf_status_t status;

    status = kvf_sock_recv_all(fd, buf, sizeof(buf), deadline_ms);
    if (status == KVF_OK) {
        status = kvf_frame_unpack(buf, hdr);
    }
    if (status == KVF_OK) {
        status = kvf_tcp_hdr_check(hdr);
    }
    return status;
}

kvf_status_t kvf_tcp_fetch_descriptor(const char *address, int timeout_ms,
                                      void **desc_p, size_t *len_p)
{
    uint64_t deadline = kvf_time_ms() + (uint64_t)timeout_ms;
    char host[KVF_HOST_MAX];
    kvf_frame_hdr_t hdr;
    kvf_status_t status;
    uint16_t port;
    void *desc;
    int fd;

    status = kvf_sock_parse_addr(address, host, sizeof(host), &port);
    if (status != KVF_OK) {
        return status;
    }
    /* authentication first: nothing is told before the peer proved the
     * secret */
    status = kvf_auth_connect(host, port, timeout_ms, "tcp", &fd);
    if (status == KVF_ERR_AUTH) {
        return status;
    }
    if (status != KVF_OK) {
        kvf_error("cannot reach segment %s within %d ms", KVF_LOG_KEY(address),
                  timeout_ms);
        return KVF_ERR_PEER_UNREACHABLE;
    }
    status = kvf_tcp_send_hdr(fd, KVF_TCP_HELLO, 0, KVF_OK, 0, 0, deadline);
    if (status == KVF_OK) {
        status = kvf_tcp_recv_hdr(fd, &hdr, deadline);
    }
    if (status != KVF_OK) {
        kvf_error("hello to %s failed: %s", address, kvf_status_str(status));
        goto out_close;
    }
    if (hdr.type != KVF_TCP_DESC || hdr.data_len != 0 || hdr.meta_len == 0) {
        kvf_error("peer %s answered hello with message type %u", address,
                  hdr.type);
        status = KVF_ERR_PROTOCOL;
        goto out_close;
    }
    desc = kvf_malloc(hdr.meta_len);
    if (desc == NULL) {
        status = KVF_ERR_NO_MEMORY;
        goto out_close;
    }
    status = kvf_sock_recv_all(fd, desc, hdr.meta_len, deadline);
    if (status != KVF_OK) {
        kvf_free(desc);
        goto out_close;
    }
    *desc_p = desc;
    *len_p = hdr.meta_len;
out_close:
    close(fd);
    return status;
}
