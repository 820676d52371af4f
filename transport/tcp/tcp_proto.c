/*
 * tcp transport helpers shared by both sides: scratch buffers, sending
 * and receiving frames with their tags (core/wire.h), payload tags, and
 * the HELLO exchange used by the p2p metadata backend to fetch a
 * segment descriptor.
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

kvf_status_t kvf_tcp_scratch_pmac(kvf_tcp_scratch_t *s, const struct iovec *iov,
                                  size_t n)
{
    struct iovec *p;

    if (n > s->pmac_cap) {
        p = kvf_realloc(s->pmac, n * sizeof(*p));
        if (p == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        s->pmac = p;
        s->pmac_cap = n;
    }
    memcpy(s->pmac, iov, n * sizeof(*iov));
    return KVF_OK;
}

void kvf_tcp_scratch_free(kvf_tcp_scratch_t *s)
{
    kvf_free(s->meta);
    kvf_free(s->iov);
    kvf_free(s->pmac);
    memset(s, 0, sizeof(*s));
}

size_t kvf_tcp_seal(kvf_wire_mac_t *mac, const kvf_frame_hdr_t *h,
                    const void *meta, unsigned char hdr[KVF_WIRE_HDR_LEN],
                    unsigned char tag[KVF_WIRE_TAG_LEN])
{
    kvf_frame_pack(h, hdr);
    if (!kvf_wire_mac_on(mac)) {
        return 0;
    }
    kvf_wire_mac_seal(mac, hdr, meta, h->meta_len, tag);
    return KVF_WIRE_TAG_LEN;
}

kvf_status_t kvf_tcp_send_frame(int fd, kvf_wire_mac_t *mac, uint8_t type,
                                uint64_t id, kvf_status_t status,
                                uint32_t count, const void *meta,
                                uint32_t meta_len, uint64_t data_len,
                                uint64_t deadline_ms)
{
    unsigned char hdr[KVF_WIRE_HDR_LEN], tag[KVF_WIRE_TAG_LEN];
    struct iovec iov[3];
    kvf_frame_hdr_t h;

    kvf_tcp_hdr_init(&h, type, id, status, count, data_len);
    h.meta_len = meta_len;
    iov[2].iov_len = kvf_tcp_seal(mac, &h, meta, hdr, tag);
    iov[2].iov_base = tag;
    iov[0].iov_base = hdr;
    iov[0].iov_len = sizeof(hdr);
    iov[1].iov_base = (void *)meta;
    iov[1].iov_len = meta_len;
    return kvf_sock_writev_all(fd, iov, 3, deadline_ms);
}

kvf_status_t kvf_tcp_recv_hdr(int fd, kvf_frame_hdr_t *hdr,
                              uint64_t deadline_ms)
{
    unsigned char buf[KVF_WIRE_HDR_LEN];

    return kvf_tcp_recv_hdr_rest(fd, buf, 0, hdr, deadline_ms);
}

kvf_status_t kvf_tcp_recv_hdr_rest(int fd, unsigned char buf[KVF_WIRE_HDR_LEN],
                                   size_t got, kvf_frame_hdr_t *hdr,
                                   uint64_t deadline_ms)
{
    kvf_status_t status = KVF_OK;

    if (got < KVF_WIRE_HDR_LEN) {
        status = kvf_sock_recv_all(fd, buf + got, KVF_WIRE_HDR_LEN - got,
                                   deadline_ms);
    }
    if (status == KVF_OK) {
        status = kvf_frame_unpack(buf, hdr);
    }
    if (status == KVF_OK) {
        status = kvf_tcp_hdr_check(hdr);
    }
    return status;
}

kvf_status_t kvf_tcp_recv_meta(int fd, kvf_wire_mac_t *mac,
                               const kvf_frame_hdr_t *h, void *meta,
                               uint64_t deadline_ms, const char *where)
{
    unsigned char tag[KVF_WIRE_TAG_LEN];
    struct iovec iov[2] = {{meta, h->meta_len}, {tag, sizeof(tag)}};
    kvf_status_t status;

    if (!kvf_wire_mac_on(mac)) {
        return h->meta_len > 0
                   ? kvf_sock_recv_all(fd, meta, h->meta_len, deadline_ms)
                   : KVF_OK;
    }
    status = kvf_sock_readv_all(fd, iov, 2, deadline_ms);
    if (status == KVF_OK) {
        status = kvf_wire_mac_check_hdr(mac, h, meta, h->meta_len, tag, where);
    }
    return status;
}

void kvf_tcp_ptag(kvf_wire_mac_t *mac, int tx, const struct iovec *iov,
                  size_t n, unsigned char tag[KVF_WIRE_TAG_LEN])
{
    kvf_wire_pmac_t p;
    size_t i;

    kvf_wire_pmac_begin(mac, tx, &p);
    for (i = 0; i < n; i++) {
        kvf_wire_pmac_update(&p, iov[i].iov_base, iov[i].iov_len);
    }
    kvf_wire_pmac_end(&p, 0, tag);
}

kvf_status_t kvf_tcp_recv_ptag(int fd, kvf_wire_mac_t *mac,
                               const struct iovec *iov, size_t n,
                               uint64_t deadline_ms, const char *where)
{
    unsigned char got[KVF_WIRE_TAG_LEN];
    kvf_wire_pmac_t p;
    kvf_status_t status;
    size_t i;

    status = kvf_sock_recv_all(fd, got, sizeof(got), deadline_ms);
    if (status != KVF_OK) {
        return status;
    }
    kvf_wire_pmac_begin(mac, 0, &p);
    for (i = 0; i < n; i++) {
        kvf_wire_pmac_update(&p, iov[i].iov_base, iov[i].iov_len);
    }
    if (kvf_wire_pmac_end(&p, 1, got) != KVF_OK) {
        kvf_log_rl(KVF_LOG_WARN,
                   "%s: a payload's tag does not match the session key (bytes "
                   "altered in flight): closing the connection",
                   where);
        return KVF_ERR_AUTH;
    }
    return KVF_OK;
}

/* One HELLO / DESC exchange on an authenticated connection. */
static kvf_status_t kvf_tcp_hello(int fd, kvf_wire_mac_t *mac,
                                  const char *address, uint64_t deadline,
                                  void **desc_p, size_t *len_p)
{
    kvf_frame_hdr_t hdr;
    kvf_status_t status;
    void *desc;

    status = kvf_tcp_send_frame(fd, mac, KVF_TCP_HELLO, 0, KVF_OK, 0, NULL, 0,
                                0, deadline);
    if (status == KVF_OK) {
        status = kvf_tcp_recv_hdr(fd, &hdr, deadline);
    }
    if (status != KVF_OK) {
        kvf_error("hello to %s failed: %s", address, kvf_status_str(status));
        return status;
    }
    if (hdr.type != KVF_TCP_DESC || hdr.data_len != 0 || hdr.meta_len == 0) {
        kvf_error("peer %s answered hello with message type %u", address,
                  hdr.type);
        return KVF_ERR_PROTOCOL;
    }
    desc = kvf_malloc(hdr.meta_len);
    if (desc == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status = kvf_tcp_recv_meta(fd, mac, &hdr, desc, deadline, address);
    if (status != KVF_OK) {
        kvf_free(desc);
        return status;
    }
    *desc_p = desc;
    *len_p = hdr.meta_len;
    return KVF_OK;
}

kvf_status_t kvf_tcp_fetch_descriptor(const char *address, int timeout_ms,
                                      void **desc_p, size_t *len_p)
{
    uint64_t deadline = kvf_time_ms() + (uint64_t)timeout_ms;
    char host[KVF_HOST_MAX];
    kvf_wire_mac_t mac;
    kvf_status_t status;
    uint16_t port;
    int fd;

    status = kvf_sock_parse_addr(address, host, sizeof(host), &port);
    if (status != KVF_OK) {
        return status;
    }
    /* authentication first: nothing is told before the peer proved the
     * secret */
    status = kvf_auth_connect(host, port, timeout_ms, "tcp", &fd, &mac);
    if (status == KVF_ERR_AUTH) {
        return status;
    }
    if (status != KVF_OK) {
        kvf_error("cannot reach segment %s within %d ms", KVF_LOG_KEY(address),
                  timeout_ms);
        return KVF_ERR_PEER_UNREACHABLE;
    }
    status = kvf_tcp_hello(fd, &mac, address, deadline, desc_p, len_p);
    kvf_wire_mac_free(&mac);
    close(fd);
    return status;
}
