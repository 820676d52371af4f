/*
 * Socket helpers. Every blocking step polls first with the time left until
 * the caller's deadline, so a silent peer becomes KVF_ERR_TIMEOUT and a
 * closed one KVF_ERR_CONN_RESET; nothing waits forever.
 */
#include "core/sock.h"
#include "core/log.h"
#include "core/time.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

/* SO_RCVTIMEO runs on the kernel's tick (up to 10 ms late): a bounded
 * read asks for this much less, and the last few milliseconds of a wait
 * go through poll. */
#define KVF_SOCK_TIMEO_SLACK_MS 10

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

kvf_status_t kvf_sock_parse_addr(const char *addr, char *host, size_t hostlen,
                                 uint16_t *port_p)
{
    const char *colon;
    char *end;
    unsigned long port;
    size_t n;

    if (addr == NULL || (colon = strrchr(addr, ':')) == NULL) {
        kvf_error("address '%s' is not host:port", addr ? addr : "(null)");
        return KVF_ERR_INVALID_PARAM;
    }
    n = (size_t)(colon - addr);
    if (n == 0 || n >= hostlen) {
        kvf_error("address '%s' has an empty or too long host", addr);
        return KVF_ERR_INVALID_PARAM;
    }
    errno = 0;
    port = strtoul(colon + 1, &end, 10);
    if (errno != 0 || *end != '\0' || end == colon + 1 || port > 65535) {
        kvf_error("address '%s' has a bad port", addr);
        return KVF_ERR_INVALID_PARAM;
    }
    memcpy(host, addr, n);
    host[n] = '\0';
    *port_p = (uint16_t)port;
    return KVF_OK;
}

static kvf_status_t kvf_sock_resolve(const char *host, uint16_t port,
                                     struct sockaddr_in *sin)
{
    struct addrinfo hints, *res = NULL;
    int ret;

    memset(sin, 0, sizeof(*sin));
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port);
    if (strcmp(host, "*") == 0 || strcmp(host, "0.0.0.0") == 0) {
        sin->sin_addr.s_addr = htonl(INADDR_ANY);
        return KVF_OK;
    }
    if (inet_pton(AF_INET, host, &sin->sin_addr) == 1) {
        return KVF_OK;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    ret = getaddrinfo(host, NULL, &hints, &res);
    if (ret != 0 || res == NULL) {
        kvf_error("cannot resolve host '%s': %s", host, gai_strerror(ret));
        return KVF_ERR_PEER_UNREACHABLE;
    }
    sin->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return KVF_OK;
}

kvf_status_t kvf_sock_listen(const char *host, uint16_t port, int backlog,
                             int *fd_p, uint16_t *port_p)
{
    struct sockaddr_in sin;
    socklen_t slen = sizeof(sin);
    kvf_status_t status;
    int fd, one = 1;

    status = kvf_sock_resolve(host, port, &sin);
    if (status != KVF_OK) {
        return status;
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        kvf_error("socket() failed: %m");
        return KVF_ERR_IO;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
        kvf_error("bind(%s:%u) failed: %m", host, port);
        status = KVF_ERR_IO;
        goto err_close;
    }
    if (listen(fd, backlog) < 0) {
        kvf_error("listen(%s:%u) failed: %m", host, port);
        status = KVF_ERR_IO;
        goto err_close;
    }
    if (getsockname(fd, (struct sockaddr *)&sin, &slen) < 0) {
        kvf_error("getsockname failed: %m");
        status = KVF_ERR_IO;
        goto err_close;
    }
    *port_p = ntohs(sin.sin_port);
    *fd_p = fd;
    return KVF_OK;

err_close:
    close(fd);
    return status;
}

kvf_status_t kvf_sock_connect(const char *host, uint16_t port, int timeout_ms,
                              int *fd_p)
{
    struct sockaddr_in sin;
    kvf_status_t status;
    int fd, flags, err = 0, one = 1;
    socklen_t elen = sizeof(err);

    status = kvf_sock_resolve(host, port, &sin);
    if (status != KVF_OK) {
        return status;
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        kvf_error("socket() failed: %m");
        return KVF_ERR_IO;
    }
    flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
        if (errno != EINPROGRESS) {
            kvf_debug("connect(%s:%u) failed: %m", host, port);
            status = KVF_ERR_CONNECT;
            goto err_close;
        }
        status =
            kvf_sock_wait(fd, POLLOUT, kvf_time_ms() + (uint64_t)timeout_ms);
        if (status != KVF_OK) {
            kvf_debug("connect(%s:%u) timed out after %d ms", host, port,
                      timeout_ms);
            status = KVF_ERR_CONNECT;
            goto err_close;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0 || err != 0) {
            errno = err;
            kvf_debug("connect(%s:%u) failed: %m", host, port);
            status = KVF_ERR_CONNECT;
            goto err_close;
        }
    }
    fcntl(fd, F_SETFL, flags);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *fd_p = fd;
    return KVF_OK;

err_close:
    close(fd);
    return status;
}

void kvf_sock_set_bufs(int fd, int bytes)
{
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

kvf_status_t kvf_sock_wait(int fd, short events, uint64_t deadline_ms)
{
    struct pollfd pfd = {.fd = fd, .events = events};
    int ret;

    for (;;) {
        ret = poll(&pfd, 1, kvf_time_left_ms(deadline_ms));
        if (ret > 0) {
            if ((pfd.revents & events) != 0) {
                return KVF_OK;
            }
            return KVF_ERR_CONN_RESET;
        }
        if (ret == 0) {
            return KVF_ERR_TIMEOUT;
        }
        if (errno != EINTR) {
            return KVF_ERR_IO;
        }
    }
}

static kvf_status_t kvf_sock_errno_status(ssize_t ret)
{
    if (ret == 0) {
        return KVF_ERR_CONN_RESET;
    }
    if (errno == ECONNRESET || errno == EPIPE) {
        return KVF_ERR_CONN_RESET;
    }
    return KVF_ERR_IO;
}

kvf_status_t kvf_sock_send_all(int fd, const void *buf, size_t len,
                               uint64_t deadline_ms)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};

    return kvf_sock_writev_all(fd, &iov, 1, deadline_ms);
}

kvf_status_t kvf_sock_recv_all(int fd, void *buf, size_t len,
                               uint64_t deadline_ms)
{
    struct iovec iov = {.iov_base = buf, .iov_len = len};

    return kvf_sock_readv_all(fd, &iov, 1, deadline_ms);
}

/* Advances an iovec array by n bytes; returns the new start index. */
static size_t kvf_iov_advance(struct iovec *iov, size_t cnt, size_t idx,
                              size_t n)
{
    while (n > 0 && idx < cnt) {
        if (n >= iov[idx].iov_len) {
            n -= iov[idx].iov_len;
            iov[idx].iov_len = 0;
            idx++;
        } else {
            iov[idx].iov_base = (char *)iov[idx].iov_base + n;
            iov[idx].iov_len -= n;
            n = 0;
        }
    }
    while (idx < cnt && iov[idx].iov_len == 0) {
        idx++;
    }
    return idx;
}

kvf_status_t kvf_sock_writev_all(int fd, struct iovec *iov, size_t iovcnt,
                                 uint64_t deadline_ms)
{
    struct msghdr msg;
    size_t idx = kvf_iov_advance(iov, iovcnt, 0, 0);
    kvf_status_t status;
    ssize_t ret;

    while (idx < iovcnt) {
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = iov + idx;
        msg.msg_iovlen = (iovcnt - idx > IOV_MAX) ? IOV_MAX : iovcnt - idx;
        ret = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (ret > 0) {
            idx = kvf_iov_advance(iov, iovcnt, idx, (size_t)ret);
            continue;
        }
        if (ret < 0 && (errno == EAGAIN || errno == EINTR)) {
            status = kvf_sock_wait(fd, POLLOUT, deadline_ms);
            if (status != KVF_OK) {
                return status;
            }
            continue;
        }
        return kvf_sock_errno_status(ret);
    }
    return KVF_OK;
}

kvf_status_t kvf_sock_readv_all(int fd, struct iovec *iov, size_t iovcnt,
                                uint64_t deadline_ms)
{
    struct msghdr msg;
    size_t idx = kvf_iov_advance(iov, iovcnt, 0, 0);
    kvf_status_t status;
    ssize_t ret;

    while (idx < iovcnt) {
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = iov + idx;
        msg.msg_iovlen = (iovcnt - idx > IOV_MAX) ? IOV_MAX : iovcnt - idx;
        ret = recvmsg(fd, &msg, MSG_DONTWAIT);
        if (ret > 0) {
            idx = kvf_iov_advance(iov, iovcnt, idx, (size_t)ret);
            continue;
        }
        if (ret < 0 && (errno == EAGAIN || errno == EINTR)) {
            status = kvf_sock_wait(fd, POLLIN, deadline_ms);
            if (status != KVF_OK) {
                return status;
            }
            continue;
        }
        return kvf_sock_errno_status(ret);
    }
    return KVF_OK;
}

ssize_t kvf_sock_recvmsg_wait(int fd, struct msghdr *msg, int wait_ms,
                              int *timeo_ms)
{
    int ms = wait_ms - KVF_SOCK_TIMEO_SLACK_MS;
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    struct pollfd pfd = {.fd = fd, .events = POLLIN};

    if (wait_ms <= 2 * KVF_SOCK_TIMEO_SLACK_MS) {
        /* the end of a wait: poll's timer is exact */
        if (poll(&pfd, 1, wait_ms) == 0) {
            errno = EAGAIN;
            return -1;
        }
        return recvmsg(fd, msg, MSG_DONTWAIT);
    }
    if (ms != *timeo_ms) {
        if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) {
            return -1;
        }
        *timeo_ms = ms;
    }
    return recvmsg(fd, msg, 0);
}

kvf_status_t kvf_sock_drain(int fd, uint64_t len, uint64_t deadline_ms)
{
    char buf[16384];
    kvf_status_t status;
    size_t n;

    while (len > 0) {
        n = (len > sizeof(buf)) ? sizeof(buf) : (size_t)len;
        status = kvf_sock_recv_all(fd, buf, n, deadline_ms);
        if (status != KVF_OK) {
            return status;
        }
        len -= n;
    }
    return KVF_OK;
}
