/*
 * The commands' HTTP GET of the master's endpoint (core/sock.h below it).
 * Errors are returned, not printed; callers say what they were doing.
 */
#include "tools/cli/net.h"
#include "core/sock.h"
#include "core/time.h"

#include <kvferry/auth.h>

#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

kvf_status_t kvf_net_http_get(const char *addr, const char *path, char *buf,
                              size_t len, int timeout_ms)
{
    char host[KVF_HOST_MAX], req[512], tok[KVF_HTTP_TOKEN_LEN + 1], *body;
    uint64_t deadline = kvf_time_ms() + (uint64_t)timeout_ms;
    size_t got = 0;
    kvf_status_t st;
    uint16_t port;
    ssize_t r;
    int fd, n = 0;

    st = kvf_sock_parse_addr(addr, host, sizeof(host), &port);
    if (st == KVF_OK) {
        /* /metrics and /status want the secret's token ("" when off) */
        tok[0] = '\0';
        kvf_auth_http_token(host, tok, sizeof(tok));
        n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\n%s%s%s\r\n", path,
                     tok[0] ? "Authorization: Bearer " : "", tok,
                     tok[0] ? "\r\n" : "");
        st = kvf_sock_connect(host, port, timeout_ms, &fd);
    }
    if (st != KVF_OK) {
        return st;
    }
    st = kvf_sock_send_all(fd, req, (size_t)n, deadline);
    while (st == KVF_OK && got + 1 < len &&
           kvf_sock_wait(fd, POLLIN, deadline) == KVF_OK) {
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
