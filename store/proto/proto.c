/*
 * Store RPC framing: send a header and body in one writev, receive and
 * validate a frame into a growable buffer, a request/reply round trip,
 * and bounds-checked key reading with a per-key verdict.
 */
#include "store/proto/proto.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/sock.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

static const kvf_config_entry_t kvf_store_config_entries[] = {
    {"master", "127.0.0.1:17800",
     "store master RPC address (master: listen; nodes, clients: connect)",
     KVF_CONFIG_USER},
    {"master_http", "auto",
     "store master HTTP address (/metrics, /status); auto: the master's "
     "host and RPC port + 1; off: none",
     KVF_CONFIG_USER},
    {"lease_ms", "2000",
     "read lease a get grants (ms): an object being read is not evicted "
     "or removed for this long",
     KVF_CONFIG_TUNING},
    {"put_timeout_ms", "10000", "a put not committed by then is undone",
     KVF_CONFIG_TUNING},
    {"node_ttl_ms", "3000", "a node silent this long is dropped",
     KVF_CONFIG_TUNING},
    {"heartbeat_ms", "500", "node heartbeat interval", KVF_CONFIG_TUNING},
    {"high_watermark_pct", "90",
     "evict when used space passes this % (lower it to keep headroom)",
     KVF_CONFIG_TUNING},
    {"low_watermark_pct", "80", "... down to this %", KVF_CONFIG_TUNING},
    {"replicas", "1",
     "default replica count of a put (more: objects survive a node loss)",
     KVF_CONFIG_USER},
    {"store_timeout_ms", "5000",
     "bound on any store wait (raise on slow links)", KVF_CONFIG_USER},
    {"master_loops", "0",
     "master connection event loops (threads); 0 = one per 8 CPUs, 1 to 4",
     KVF_CONFIG_TUNING},
    {"put_reserve", "1",
     "1: a client's single puts keep space reserved for the next one "
     "(one master round trip per put instead of two)",
     KVF_CONFIG_DEBUG},
    {"loc_cache", "16384",
     "entries of a client's location cache (a power of two; 0 = off): a "
     "single-key get reads a key's last known location while the master "
     "answers, and keeps the bytes only if the master names that location "
     "and the checksum matches",
     KVF_CONFIG_TUNING},
    {"lease_reads", "0",
     "1: a client's get of a key it got within the read lease it was "
     "granted reads the cached location without asking the master (the "
     "bytes are checked against the master's checksum); another client's "
     "remove is then seen when that lease ends (lease_ms). For keys whose "
     "value never changes, such as KV blocks named by their tokens' hash",
     KVF_CONFIG_USER},
    {"node_conns", "8",
     "connections per node of a client's own engine (0 = the engine's "
     "`conns`), at most 64: threads sharing a handle each find an idle one",
     KVF_CONFIG_TUNING},
    {"node_chunk", "0",
     "largest wire request of a client's own engine to a node; 0 = auto: "
     "256K on a host of 8 or more CPUs (large objects move on several "
     "connections at once), else the engine's `chunk_bytes`",
     KVF_CONFIG_TUNING},
    {"client_max_pending", "65536",
     "master: pending puts and reservations one client may hold (a client: "
     "every connection from one tcp address, or of one local uid over the "
     "unix socket; more are refused with KVF_ERR_QUOTA)",
     KVF_CONFIG_TUNING},
    {"client_max_reserved_pct", "50",
     "master: bytes one client may hold in pending puts and reservations, "
     "% of the store's capacity (1 to 100)",
     KVF_CONFIG_TUNING},
    {"pending_max", "262144",
     "master: pending puts and reservations of all clients together (more "
     "are refused with KVF_ERR_QUOTA)",
     KVF_CONFIG_TUNING},
    {"client_max_leased_pct", "50",
     "master: bytes one client may keep under read leases, % of the store's "
     "capacity (1 to 100); a get past it is served without a lease (its "
     "object stays evictable, the client's checksum still guards the read)",
     KVF_CONFIG_TUNING},
    {"client_max_leases", "262144",
     "master: read leases one client may hold at once (past it, gets are "
     "served without a lease)",
     KVF_CONFIG_TUNING},
    {"max_put_share_pct", "25",
     "master: the largest single put, % of the largest node pool (1 to 100; "
     "larger ones are refused with KVF_ERR_QUOTA, nothing evicted)",
     KVF_CONFIG_TUNING},
    {"master_idle_ms", "120000",
     "master: a client connection idle this long is closed (clients "
     "reconnect on their next call)",
     KVF_CONFIG_TUNING},
    {"conn_max_per_peer", "1024",
     "master: connections from one tcp address, or one local uid over the "
     "unix socket",
     KVF_CONFIG_TUNING},
    {"conn_max_tcp", "4096", "master: tcp connections in all",
     KVF_CONFIG_TUNING},
    {"conn_max_unix", "4096", "master: unix socket connections in all",
     KVF_CONFIG_TUNING},
    {"reg_workers", "16",
     "master: worker threads for the requests that wait on a node: "
     "registrations (checked over the network; more in flight wait in a "
     "bounded queue, past it they are refused busy), an elected leader's "
     "commits and removes, gets of objects on a disk tier",
     KVF_CONFIG_TUNING},
    {"tier_write_max", "256M",
     "master: bytes of a node's objects being copied to its disk tier at "
     "once (at most a quarter of its pool); past it, new objects are copied when "
     "they reach the cold end of the pool",
     KVF_CONFIG_TUNING},
    {"tier_promote", "1",
     "master: 1: an object loaded from a disk tier goes to the hot end of "
     "the pool's LRU order; 0: to its cold end (read through, first to "
     "leave again)",
     KVF_CONFIG_TUNING},
    {"master_unix", "1",
     "1: a master on a loopback address is reached over its abstract unix "
     "socket when the client's engine may use a same-host transport "
     "(tcp on any failure); 0: always tcp",
     KVF_CONFIG_DEBUG},
};

KVF_CONFIG_TABLE(kvf_store_config, "store", kvf_store_config_entries)

void kvf_sp_frame_free(kvf_sp_frame_t *f)
{
    kvf_free(f->body);
    f->body = NULL;
    f->cap = 0;
}

size_t kvf_sp_frame_len(const kvf_wire_mac_t *mac, const kvf_frame_hdr_t *h)
{
    return KVF_WIRE_HDR_LEN + (size_t)h->meta_len +
           (kvf_wire_mac_on(mac) ? KVF_WIRE_TAG_LEN : 0);
}

kvf_status_t kvf_sp_send(int fd, kvf_wire_mac_t *mac, uint8_t type, uint64_t id,
                         kvf_status_t status, uint32_t count, uint16_t flags,
                         const kvf_wr_t *w, uint64_t deadline_ms)
{
    unsigned char hdr[KVF_WIRE_HDR_LEN], tag[KVF_WIRE_TAG_LEN];
    kvf_frame_hdr_t h = {0};
    struct iovec iov[3];
    size_t n = (w != NULL) ? w->len : 0;

    if (w != NULL && kvf_wr_status(w) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    if (n > KVF_SP_BODY_MAX) {
        kvf_error("store %s message of %zu bytes exceeds %u",
                  kvf_sp_msg_name(type), n, KVF_SP_BODY_MAX);
        return KVF_ERR_MSG_TOO_LARGE;
    }
    h.magic = KVF_WIRE_MAGIC;
    h.version = KVF_WIRE_VERSION;
    h.type = type;
    h.flags = flags;
    h.meta_len = (uint32_t)n;
    h.count = count;
    h.id = id;
    h.status = status;
    kvf_frame_pack(&h, hdr);
    iov[0].iov_base = hdr;
    iov[0].iov_len = sizeof(hdr);
    iov[1].iov_base = (n > 0) ? w->buf : NULL;
    iov[1].iov_len = n;
    iov[2].iov_base = tag;
    iov[2].iov_len = 0;
    if (kvf_wire_mac_on(mac)) {
        kvf_wire_mac_seal(mac, hdr, iov[1].iov_base, n, tag);
        iov[2].iov_len = sizeof(tag);
    }
    return kvf_sock_writev_all(fd, iov, 3, deadline_ms);
}

/* Makes room for the body and the tag of f (f->hdr unpacked). */
static kvf_status_t kvf_sp_body_room(kvf_sp_frame_t *f, size_t need)
{
    unsigned char *nb;

    if (need <= f->cap) {
        return KVF_OK;
    }
    nb = kvf_realloc(f->body, need);
    if (nb == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    f->body = nb;
    f->cap = need;
    return KVF_OK;
}

/* Checks the tag that follows the body of f in f->body. */
static kvf_status_t kvf_sp_check_tag(kvf_wire_mac_t *mac, kvf_sp_frame_t *f)
{
    if (!kvf_wire_mac_on(mac)) {
        return KVF_OK;
    }
    return kvf_wire_mac_check_hdr(mac, &f->hdr, f->body, f->hdr.meta_len,
                                  f->body + f->hdr.meta_len, "store rpc");
}

/* Reads the header in as few calls as possible; KVF_ERR_PEER_CLOSED when
 * the peer closed before its first byte (a clean end between frames). */
static kvf_status_t kvf_sp_recv_hdr(int fd, kvf_sp_frame_t *f,
                                    unsigned char *hdr,
                                    uint64_t first_deadline_ms,
                                    uint64_t deadline_ms)
{
    kvf_status_t status;
    size_t got = 0;
    ssize_t n;

    while (got < KVF_WIRE_HDR_LEN) {
        n = recv(fd, hdr + got, KVF_WIRE_HDR_LEN - got, MSG_DONTWAIT);
        if (n > 0) {
            got += (size_t)n;
            f->partial = 1;
            continue;
        }
        if (n == 0) {
            return got == 0 ? KVF_ERR_PEER_CLOSED : KVF_ERR_CONN_RESET;
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            return errno == ECONNRESET ? KVF_ERR_CONN_RESET : KVF_ERR_IO;
        }
        status = kvf_sock_wait(fd, POLLIN,
                               got == 0 ? first_deadline_ms : deadline_ms);
        if (status != KVF_OK) {
            return status;
        }
    }
    return KVF_OK;
}

kvf_status_t kvf_sp_recv(int fd, kvf_wire_mac_t *mac, kvf_sp_frame_t *f,
                         uint64_t first_deadline_ms, uint64_t deadline_ms)
{
    unsigned char hdr[KVF_WIRE_HDR_LEN];
    kvf_status_t status;
    size_t rest;

    f->partial = 0;
    status = kvf_sp_recv_hdr(fd, f, hdr, first_deadline_ms, deadline_ms);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_frame_unpack(hdr, &f->hdr);
    if (status != KVF_OK) {
        return status;
    }
    if (f->hdr.data_len != 0 || f->hdr.meta_len > KVF_SP_BODY_MAX) {
        return KVF_ERR_MSG_TOO_LARGE;
    }
    rest = kvf_sp_frame_len(mac, &f->hdr) - KVF_WIRE_HDR_LEN;
    status = kvf_sp_body_room(f, rest);
    if (status == KVF_OK && rest > 0) {
        status = kvf_sock_recv_all(fd, f->body, rest, deadline_ms);
    }
    return status == KVF_OK ? kvf_sp_check_tag(mac, f) : status;
}

/* Receives a reply: reads header and body together with one vectored
 * recv, waiting only if nothing is there yet (a reply is the only thing
 * the peer sends, so nothing past it can arrive), and the rest of a
 * large body after. */
static kvf_status_t kvf_sp_recv_reply(int fd, kvf_wire_mac_t *mac,
                                      kvf_sp_frame_t *f, uint64_t deadline_ms)
{
    unsigned char hdr[KVF_WIRE_HDR_LEN];
    struct iovec iov[2];
    struct msghdr msg;
    kvf_status_t status;
    size_t got = 0, body, rest;
    ssize_t n;

    if (kvf_sp_body_room(f, 4096) != KVF_OK) {
        return KVF_ERR_NO_MEMORY;
    }
    while (got < KVF_WIRE_HDR_LEN) {
        iov[0].iov_base = hdr + got;
        iov[0].iov_len = KVF_WIRE_HDR_LEN - got;
        iov[1].iov_base = f->body;
        iov[1].iov_len = f->cap;
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = iov;
        msg.msg_iovlen = 2;
        n = recvmsg(fd, &msg, MSG_DONTWAIT);
        if (n == 0) {
            return KVF_ERR_CONN_RESET;
        }
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                return errno == ECONNRESET ? KVF_ERR_CONN_RESET : KVF_ERR_IO;
            }
            /* not there yet: wait (a reply often is, when the caller did
             * other work while it was on its way) */
            status = kvf_sock_wait(fd, POLLIN, deadline_ms);
            if (status != KVF_OK) {
                return status;
            }
            continue;
        }
        got += (size_t)n;
    }
    body = got - KVF_WIRE_HDR_LEN;
    status = kvf_frame_unpack(hdr, &f->hdr);
    if (status != KVF_OK) {
        return status;
    }
    rest = kvf_sp_frame_len(mac, &f->hdr) - KVF_WIRE_HDR_LEN;
    if (f->hdr.data_len != 0 || f->hdr.meta_len > KVF_SP_BODY_MAX ||
        body > rest) {
        return KVF_ERR_PROTOCOL;
    }
    status = kvf_sp_body_room(f, rest);
    if (status == KVF_OK && body < rest) {
        status =
            kvf_sock_recv_all(fd, f->body + body, rest - body, deadline_ms);
    }
    return status == KVF_OK ? kvf_sp_check_tag(mac, f) : status;
}

kvf_status_t kvf_sp_call(int fd, kvf_wire_mac_t *mac, uint8_t type, uint64_t id,
                         uint32_t count, const kvf_wr_t *w, kvf_sp_frame_t *f,
                         uint64_t deadline_ms)
{
    kvf_status_t status;

    status = kvf_sp_send(fd, mac, type, id, KVF_OK, count, 0, w, deadline_ms);
    if (status != KVF_OK) {
        return status;
    }
    return kvf_sp_call_end(fd, mac, type, id, f, deadline_ms);
}

kvf_status_t kvf_sp_call_end(int fd, kvf_wire_mac_t *mac, uint8_t type,
                             uint64_t id, kvf_sp_frame_t *f,
                             uint64_t deadline_ms)
{
    kvf_status_t status;

    status = kvf_sp_recv_reply(fd, mac, f, deadline_ms);
    if (status != KVF_OK) {
        return status;
    }
    if (f->hdr.type == (KVF_SP_ERROR | KVF_SP_REPLY) &&
        f->hdr.status != KVF_OK) {
        return (kvf_status_t)f->hdr.status;
    }
    if (f->hdr.type != (type | KVF_SP_REPLY) || f->hdr.id != id) {
        kvf_error("store reply of type 0x%x id %lu to a %s request id %lu",
                  f->hdr.type, (unsigned long)f->hdr.id, kvf_sp_msg_name(type),
                  (unsigned long)id);
        return KVF_ERR_PROTOCOL;
    }
    return KVF_OK;
}

kvf_status_t kvf_sp_rd_key(kvf_rd_t *r, char *out)
{
    uint16_t n = kvf_rd_u16(r);
    const char *p = kvf_rd_bytes(r, n);

    out[0] = '\0';
    if (p == NULL) {
        return KVF_ERR_PROTOCOL;
    }
    if (n > KVF_STORE_KEY_MAX) {
        return KVF_ERR_KEY_TOO_LARGE;
    }
    if (n == 0 || memchr(p, '\0', n) != NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    memcpy(out, p, n);
    out[n] = '\0';
    return KVF_OK;
}

kvf_status_t kvf_sp_key_check(const char *key)
{
    size_t n;

    if (key == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    n = strnlen(key, KVF_STORE_KEY_MAX + 1);
    if (n == 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (n > KVF_STORE_KEY_MAX) {
        return KVF_ERR_KEY_TOO_LARGE;
    }
    return KVF_OK;
}

const char *kvf_sp_msg_name(uint8_t type)
{
    switch (type & (uint8_t)~KVF_SP_REPLY) {
    case KVF_SP_NODE_REG:
        return "node-register";
    case KVF_SP_HEARTBEAT:
        return "heartbeat";
    case KVF_SP_PUT_START:
        return "put-start";
    case KVF_SP_PUT_END:
        return "put-end";
    case KVF_SP_GET:
        return "get";
    case KVF_SP_REMOVE:
        return "remove";
    case KVF_SP_EXISTS:
        return "exists";
    case KVF_SP_LIST:
        return "list";
    case KVF_SP_COMMIT:
        return "commit";
    case KVF_SP_INV_ADD:
        return "inv_add";
    case KVF_SP_INV_DEL:
        return "inv_del";
    case KVF_SP_INV_REPORT:
        return "inv_report";
    case KVF_SP_NODES:
        return "nodes";
    case KVF_SP_TIER_OP:
        return "tier_op";
    case KVF_SP_ERROR:
        return "error";
    default:
        return "unknown";
    }
}

/* ---- the master's abstract unix socket (same host, same namespace) ---- */

static int kvf_sp_is_wildcard(const char *host)
{
    return host[0] == '\0' || strcmp(host, "0.0.0.0") == 0 ||
           strcmp(host, "::") == 0 || strcmp(host, "*") == 0;
}

int kvf_sp_is_loopback(const char *host)
{
    return strncmp(host, "127.", 4) == 0 || strcmp(host, "localhost") == 0 ||
           strcmp(host, "::1") == 0 || strcmp(host, "[::1]") == 0;
}

int kvf_sp_unix_name(const char *host, uint16_t port, int listening, char *buf,
                     size_t len)
{
    int n;

    if (port == 0) {
        return 0;
    }
    if (strcmp(host, "127.0.0.1") == 0 || strcmp(host, "localhost") == 0 ||
        (listening && kvf_sp_is_wildcard(host))) {
        n = snprintf(buf, len, "kvferry-master-%u", port);
    } else if (kvf_sp_is_loopback(host)) {
        /* another loopback address may have another master on that port */
        n = snprintf(buf, len, "kvferry-master-%s-%u", host, port);
    } else {
        return 0;
    }
    return n > 0 && (size_t)n < len;
}

static socklen_t kvf_sp_unix_addr(const char *name, struct sockaddr_un *sa)
{
    size_t n = strlen(name);

    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    if (n > sizeof(sa->sun_path) - 1) {
        n = sizeof(sa->sun_path) - 1;
    }
    memcpy(sa->sun_path + 1, name, n); /* sun_path[0] = 0: abstract */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

kvf_status_t kvf_sp_unix_listen(const char *name, int backlog, int *fd_p)
{
    struct sockaddr_un sa;
    socklen_t sl = kvf_sp_unix_addr(name, &sa);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0) {
        return KVF_ERR_NO_RESOURCE;
    }
    if (bind(fd, (struct sockaddr *)&sa, sl) != 0 || listen(fd, backlog) != 0) {
        /* taken: maybe by another user's process posing as this master;
         * clients check who listens (kvf_sp_unix_connect) and go to tcp */
        kvf_error("store master cannot listen on unix @%s: %m; serving tcp "
                  "only (same-host clients will not use a socket this "
                  "master does not own)",
                  name);
        close(fd);
        return KVF_ERR_IO;
    }
    *fd_p = fd;
    return KVF_OK;
}

/* The abstract name is open to anyone who binds it first: only a
 * listener of this user or root is taken for the master. 0 when it is. */
static int kvf_sp_unix_owner_ok(int fd, const char *name)
{
    struct ucred cr;
    socklen_t cl = sizeof(cr);
    char esc[KVF_LOG_KEY_MAX];

    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0) {
        return -1;
    }
    if (cr.uid == getuid() || cr.uid == 0) {
        return 0;
    }
    kvf_log_rl(KVF_LOG_ERROR,
               "unix socket @%s is held by uid %u (pid %d), not this user "
               "or root: not used, the master is reached over tcp",
               kvf_log_key(esc, sizeof(esc), name), (unsigned)cr.uid,
               (int)cr.pid);
    return -1;
}

kvf_status_t kvf_sp_unix_connect(const char *name, int *fd_p)
{
    struct sockaddr_un sa;
    socklen_t sl = kvf_sp_unix_addr(name, &sa);
    int fd, rc, flags;

    /* non-blocking: a full backlog (a frozen master) fails at once
     * (EAGAIN) and the caller goes to tcp, whose connect has a deadline */
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        return KVF_ERR_NO_RESOURCE;
    }
    do {
        rc = connect(fd, (struct sockaddr *)&sa, sl);
    } while (rc != 0 && errno == EINTR);
    flags = rc == 0 ? fcntl(fd, F_GETFL) : -1;
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0 ||
        kvf_sp_unix_owner_ok(fd, name) != 0) {
        close(fd);
        return KVF_ERR_CONNECT;
    }
    *fd_p = fd;
    return KVF_OK;
}
