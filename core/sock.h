/*
 * Socket helpers: "host:port" parsing, listening and connecting with a
 * timeout, and send/recv/writev/readv loops that never wait past a
 * deadline (poll(2) before every blocking step).
 */
#ifndef KVF_CORE_SOCK_H
#define KVF_CORE_SOCK_H
#if !defined(KVF_INTERNAL) && !defined(KVF_TEST_INTERNALS)
#error "core/sock.h is internal to kvferry: use <kvferry/*.h>"
#endif

#include <kvferry/status.h>

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#define KVF_HOST_MAX 256

/* Splits "host:port" (port may be 0). */
kvf_status_t kvf_sock_parse_addr(const char *addr, char *host, size_t hostlen,
                                 uint16_t *port_p);

/* Listens on host:port (port 0 = ephemeral); returns the fd and the port. */
kvf_status_t kvf_sock_listen(const char *host, uint16_t port, int backlog,
                             int *fd_p, uint16_t *port_p);

/* Connects to host:port within timeout_ms; the fd is blocking, NODELAY. */
kvf_status_t kvf_sock_connect(const char *host, uint16_t port, int timeout_ms,
                              int *fd_p);

/* Waits until fd is readable (POLLIN) or writable, bounded by deadline. */
kvf_status_t kvf_sock_wait(int fd, short events, uint64_t deadline_ms);

kvf_status_t kvf_sock_send_all(int fd, const void *buf, size_t len,
                               uint64_t deadline_ms);
kvf_status_t kvf_sock_recv_all(int fd, void *buf, size_t len,
                               uint64_t deadline_ms);

/* Sends/receives a whole iovec array (modified in place), in pieces of at
 * most IOV_MAX entries. */
kvf_status_t kvf_sock_writev_all(int fd, struct iovec *iov, size_t iovcnt,
                                 uint64_t deadline_ms);
kvf_status_t kvf_sock_readv_all(int fd, struct iovec *iov, size_t iovcnt,
                                uint64_t deadline_ms);

/* One blocking recvmsg on a blocking fd that waits at most wait_ms (>
 * 0) for data: where a reply or request is about to come, this is one
 * system call instead of a poll and a read. The wait is the socket's
 * SO_RCVTIMEO (a little shorter: the kernel's tick rounds it up), set
 * only when it differs from *timeo_ms (the value last set on this fd,
 * 0 for none; updated); a wait of a few milliseconds is a poll, whose
 * timer is exact. Returns recvmsg's result: bytes, 0 at the peer's
 * close, -1 with errno (EAGAIN: no data within the wait; call again
 * with what is left). */
ssize_t kvf_sock_recvmsg_wait(int fd, struct msghdr *msg, int wait_ms,
                              int *timeo_ms);

/* Reads and throws away len bytes. */
kvf_status_t kvf_sock_drain(int fd, uint64_t len, uint64_t deadline_ms);

void kvf_sock_set_bufs(int fd, int bytes);

#endif
