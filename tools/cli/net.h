/*
 * Small TCP helpers of the commands (IPv4, host names resolved): connect
 * within a timeout, listen on a free port, send everything, wait for an
 * event until a deadline (kvf_clock_ms() time).
 */
#ifndef KVF_TOOLS_NET_H
#define KVF_TOOLS_NET_H

#include <kvferry/status.h>

#include <stddef.h>
#include <stdint.h>

#define KVF_NET_HOST_MAX 256

/* Splits "host:port" (port may be 0). */
kvf_status_t kvf_net_parse_addr(const char *addr, char *host, size_t hostlen,
                                uint16_t *port_p);
/* Listens on host:port (port 0 = ephemeral); returns the fd and the port. */
kvf_status_t kvf_net_listen(const char *host, uint16_t port, int backlog,
                            int *fd_p, uint16_t *port_p);
/* Connects within timeout_ms; the fd is blocking, TCP_NODELAY. */
kvf_status_t kvf_net_connect(const char *host, uint16_t port, int timeout_ms,
                             int *fd_p);
/* Waits until fd has one of events (POLLIN, POLLOUT) or the deadline. */
kvf_status_t kvf_net_wait(int fd, short events, uint64_t deadline_ms);
kvf_status_t kvf_net_send_all(int fd, const void *buf, size_t len,
                              uint64_t deadline_ms);

/* GET path from the HTTP server at addr ("HOST:PORT") within timeout_ms;
 * the body of a 200 reply, NUL-terminated, in buf. */
kvf_status_t kvf_net_http_get(const char *addr, const char *path, char *buf,
                              size_t len, int timeout_ms);

#endif
