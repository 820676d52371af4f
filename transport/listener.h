/*
 * A target's listener, shared by the transports that serve peers over
 * tcp connections (the tcp target, the ucx side channel): a listening
 * socket, an accept thread, and one thread per accepted connection
 * under the target limits. A connection still in the authentication
 * exchange counts in a budget of its own (conns_unauth_max in all,
 * conns_unauth_per_addr from one host; past the first the oldest such
 * connection is dropped, past the second the new one is refused) and
 * must finish the exchange within auth_timeout_ms; only then does it
 * take one of the conns_max slots. So connections without the secret
 * never take the slots of authenticated ones, and cannot keep a real
 * client from authenticating. conns_per_addr bounds all connections
 * from one host. A refusal is logged, rate-limited. Finished connection
 * threads are joined as the accept loop turns; stop shuts every
 * connection down and joins them all. What a connection does
 * (authentication first, then its protocol) is the transport's serve
 * function.
 */
#ifndef KVF_TL_LISTENER_H
#define KVF_TL_LISTENER_H
#if !defined(KVF_LAYER_TRANSPORT) && !defined(KVF_TEST_INTERNALS)
#error "transport/listener.h is private to transport/"
#endif

#include "transport/limits.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>

typedef struct kvf_tl_listener kvf_tl_listener_t;

/* One accepted connection. The serve function reads fd, peer and arg;
 * the rest is the listener's. */
typedef struct kvf_tl_conn {
    kvf_tl_listener_t *listener;
    int fd;
    struct sockaddr_storage peer;
    void *arg; /* kvf_tl_listener_params_t.arg */
    pthread_t thread;
    int done;       /* atomic: serve returned */
    int authed;     /* past the exchange (listener lock) */
    int evicted;    /* dropped to make room (listener lock) */
    uint64_t since; /* ms: accepted */
    struct kvf_tl_conn *next;
} kvf_tl_conn_t;

typedef struct kvf_tl_listener_params {
    const char *name; /* in log lines: "tcp", "ucx" */
    const char *host; /* address to bind (kvf_auth_check_bind applies) */
    uint16_t port;    /* 0: any */
    kvf_tl_limits_t lim;
    /* Optional: socket options of an accepted connection. */
    void (*setup)(int fd);
    /* The connection's thread: returns when the connection should end;
     * the listener then shuts the socket down and closes it. */
    void (*serve)(kvf_tl_conn_t *c);
    void *arg;
} kvf_tl_listener_params_t;

/* Binds, listens and starts the accept thread; *port_p: the port bound. */
kvf_status_t kvf_tl_listener_start(const kvf_tl_listener_params_t *p,
                                   kvf_tl_listener_t **l_p, uint16_t *port_p);
/* Stops accepting, shuts every connection down, joins every thread. */
void kvf_tl_listener_stop(kvf_tl_listener_t *l);
/* The deadline (ms) of c's authentication exchange. */
uint64_t kvf_tl_conn_auth_deadline(const kvf_tl_conn_t *c);
/* The serve function calls this once c has authenticated: c moves from
 * the unauthenticated budget to the conns_max slots. KVF_ERR_BUSY (the
 * caller ends the connection) when they are all taken. */
kvf_status_t kvf_tl_conn_authed(kvf_tl_conn_t *c);
/* 1 once stop has begun: a serve function ends its work early. */
int kvf_tl_listener_stopping(const kvf_tl_listener_t *l);

#endif
