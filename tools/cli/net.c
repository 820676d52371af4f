/*
 * Small TCP helpers of the commands: the Redis comparison's ports and the
 * drills' HTTP probes of the master. Errors are returned, not printed;
 * callers say what they were doing.
 */
#include "tools/cli/net.h"
#include "tools/cli/clock.h"
#include <kvferry/auth.h>

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

kvf_status_t kvf_net_parse_addr(const char *addr, char *host, size_t hostlen,
                                uint16_t *port_p)
{
    const char *colon;
    char *end;
    unsigned long port;
    size_t n;

    if (addr == NULL || (colon = strrchr(addr, ':')) == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    n = (size_t)(colon - addr);
    if (n == 0 || n >= hostlen) {
        return KVF_ERR_INVALID_PARAM;
    }
    errno = 0;
    port = strtoul(colon + 1, &end, 10);
    if (errno != 0 || *end != '\0' || end == colon + 1 || port > 65535) {
        return KVF_ERR_INVALID_PARAM;
    }
    memcpy(host, addr, n);
    host[n] = '\0';
    *port_p = (uint16_t)port;
    return KVF_OK;
}

static kvf_status_t kvf_net_resolve(const char *host, uint16_t port,
                                    struct sockaddr_in *sin)
{
    struct addrinfo hints = {.ai_family = AF_INET}, *res = NULL;

    if (getaddrinfo(host, NULL, &hints, &res) != 0 || res == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    memcpy(sin, res->ai_addr, sizeof(*sin));
    sin->sin_port = htons(port);
    freeaddrinfo(res);
    return KVF_OK;
}

kvf_status_t kvf_net_listen(const char *host, uint16_t port, int backlog,
                            int *fd_p, uint16_t *port_p)
{
    struct sockaddr_in sin;
    socklen_t slen = sizeof(sin);
    int fd, one = 1;

    if (kvf_net_resolve(host, port, &sin) != KVF_OK) {
        return KVF_ERR_INVALID_PARAM;
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return KVF_ERR_IO;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 ||
        listen(fd, backlog) < 0 ||
        getsockname(fd, (struct sockaddr *)&sin, &slen) < 0) {
        close(fd);
        return KVF_ERR_IO;
    }
    *port_p = ntohs(sin.sin_port);
    *fd_p = fd;
    return KVF_OK;
}

kvf_status_t kvf_net_connect(const char *host, uint16_t port, int timeout_ms,
                             int *fd_p)
{
    struct sockaddr_in sin;
    int fd, flags, err = 0, one = 1;
    socklen_t elen = sizeof(err);

    if (kvf_net_resolve(host, port, &sin) != KVF_OK) {
        return KVF_ERR_INVALID_PARAM;
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return KVF_ERR_IO;
    }
    flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 &&
        (errno != EINPROGRESS ||
         kvf_net_wait(fd, POLLOUT, kvf_clock_ms() + (uint64_t)timeout_ms) !=
             KVF_OK ||
         getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0 || err != 0)) {
        close(fd);
        return KVF_ERR_CONNECT;
    }
    fcntl(fd, F_SETFL, flags);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *fd_p = fd;
    return KVF_OK;
}

kvf_status_t kvf_net_wait(int fd, short events, uint64_t deadline_ms)
{
    struct pollfd pfd = {.fd = fd, .events = events};
    int ret;

    for (;;) {
        ret = poll(&pfd, 1, kvf_clock_left_ms(deadline_ms));
        if (ret > 0) {
            return (pfd.revents & events) != 0 ? KVF_OK : KVF_ERR_CONN_RESET;
        }
        if (ret == 0) {
            return KVF_ERR_TIMEOUT;
        }
        if (errno != EINTR) {
            return KVF_ERR_IO;
        }
    }
}

kvf_status_t kvf_net_send_all(int fd, const void *buf, size_t len,
                              uint64_t deadline_ms)
{
    const char *p = buf;
    ssize_t n;

    while (len > 0) {
        n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            kvf_status_t st = kvf_net_wait(fd, POLLOUT, deadline_ms);

            if (st != KVF_OK) {
                return st;
            }
        } else {
            return KVF_ERR_IO;
        }
    }
    return KVF_OK;
}

kvf_status_t kvf_net_http_get(const char *addr, const char *path, char *buf,
                              size_t len, int timeout_ms)
{
    char host[KVF_NET_HOST_MAX], req[512], tok[KVF_HTTP_TOKEN_LEN + 1], *body;
    uint64_t deadline = kvf_clock_ms() + (uint64_t)timeout_ms;
    size_t got = 0;
    kvf_status_t st;
    uint16_t port;
    ssize_t r;
    int fd, n = 0;

    st = kvf_net_parse_addr(addr, host, sizeof(host), &port);
    if (st == KVF_OK) {
        /* /metrics and /status want the secret's token ("" when off) */
        tok[0] = '\0';
        kvf_auth_http_token(host, tok, sizeof(tok));
        n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\n%s%s%s\r\n", path,
                     tok[0] ? "Authorization: Bearer " : "", tok,
                     tok[0] ? "\r\n" : "");
        st = kvf_net_connect(host, port, timeout_ms, &fd);
    }
    if (st != KVF_OK) {
        return st;
    }
    st = kvf_net_send_all(fd, req, (size_t)n, deadline);
    while (st == KVF_OK && got + 1 < len &&
           kvf_net_wait(fd, POLLIN, deadline) == KVF_OK) {
        r = read(fd, buf + got, len - 1 - got);
        if (r <= 0) {
            break;
        }
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    body = strstr(buf, "\r\n\r\n");
    if (st != KVF_OK || body == NULL || strncmp(buf, "HTTP/1.", 7) != 0 ||
        strncmp(buf + 8, " 200", 4) != 0) {
        return st != KVF_OK ? st : KVF_ERR_PROTOCOL;
    }
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return KVF_OK;
}
