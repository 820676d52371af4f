/*
 * The authentication exchange (core/auth.h): its message codec, the
 * endpoint binding (what name the client reached, what names a server
 * answers to), the transcript MACs, the session keys, and the blocking
 * client and server and the non-blocking server step over them.
 *
 * What binds the exchange to the connection, against a relay (a party
 * without the secret that accepts a client's connection and opens its
 * own to the real server, forwarding the messages both ways): the
 * client hashes the address its socket is connected to (the relay's)
 * into HELLO; the server accepts only a hash of the address its
 * accepted socket was reached at (its own) or of a configured
 * `auth_names` entry, and refuses the rest before it sends any MAC.
 * The hash is in both MACs and the session key, so rewriting it breaks
 * the exchange. The session keys come from HKDF over the secret, both
 * nonces and the transcript, so even a relay that got the four messages
 * through holds no key for the frames after them.
 */
#include "core/auth.h"
#include "core/log.h"
#include "core/sock.h"
#include "core/time.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#define KVF_AUTH_NAMES_MAX 16

/* KVF_AUTH_MAGIC as it arrives on the wire */
static const unsigned char kvf_auth_magic_le[4] = {'K', 'V', 'F', 'A'};

void kvf_auth_msg_enc(const kvf_auth_msg_t *m,
                      unsigned char out[KVF_AUTH_MSG_LEN])
{
    kvf_wr_t w;

    kvf_wr_init_fixed(&w, out, KVF_AUTH_MSG_LEN);
    kvf_wr_u32(&w, KVF_AUTH_MAGIC);
    kvf_wr_u8(&w, KVF_AUTH_VERSION);
    kvf_wr_u8(&w, m->type);
    kvf_wr_u16(&w, m->flags);
    kvf_wr_bytes(&w, m->nonce, KVF_AUTH_NONCE_LEN);
    kvf_wr_bytes(&w, m->mac, KVF_AUTH_MAC_LEN);
}

kvf_status_t kvf_auth_msg_dec(const void *in, size_t len, kvf_auth_msg_t *m_p)
{
    kvf_auth_msg_t m = {0};
    uint32_t magic;
    uint8_t version;
    kvf_rd_t r;

    if (len != KVF_AUTH_MSG_LEN) {
        return KVF_ERR_PROTOCOL;
    }
    kvf_rd_init(&r, in, len);
    magic = kvf_rd_u32(&r);
    version = kvf_rd_u8(&r);
    m.type = kvf_rd_u8(&r);
    m.flags = kvf_rd_u16(&r);
    memcpy(m.nonce, kvf_rd_bytes(&r, KVF_AUTH_NONCE_LEN), KVF_AUTH_NONCE_LEN);
    memcpy(m.mac, kvf_rd_bytes(&r, KVF_AUTH_MAC_LEN), KVF_AUTH_MAC_LEN);
    if (kvf_rd_end(&r) != KVF_OK || magic != KVF_AUTH_MAGIC) {
        return KVF_ERR_PROTOCOL;
    }
    if (version != KVF_AUTH_VERSION) {
        return KVF_ERR_VERSION;
    }
    if (m.type < KVF_AUTH_HELLO || m.type > KVF_AUTH_RESULT) {
        return KVF_ERR_PROTOCOL;
    }
    *m_p = m;
    return KVF_OK;
}

/* ---- endpoint names ---- */

/* H(name) of an address: SHA-256 over a label, the family and the
 * address in a canonical binary form (IPv4-mapped IPv6 as IPv4). */
static int kvf_auth_name_hash(const struct sockaddr *sa, socklen_t len,
                              unsigned char out[KVF_AUTH_MAC_LEN])
{
    static const char label[] = "kvferry-name-v2";
    unsigned char in[sizeof(label) + 2 + sizeof(struct sockaddr_un)];
    size_t n = sizeof(label);
    unsigned int outlen = 0;

    memcpy(in, label, sizeof(label));
    if (sa->sa_family == AF_INET6 &&
        IN6_IS_ADDR_V4MAPPED(&((const struct sockaddr_in6 *)sa)->sin6_addr)) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;

        in[n++] = '4';
        memcpy(in + n, s6->sin6_addr.s6_addr + 12, 4);
        memcpy(in + n + 4, &s6->sin6_port, 2);
        n += 6;
    } else if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;

        in[n++] = '4';
        memcpy(in + n, &s4->sin_addr, 4);
        memcpy(in + n + 4, &s4->sin_port, 2);
        n += 6;
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;

        in[n++] = '6';
        memcpy(in + n, &s6->sin6_addr, 16);
        memcpy(in + n + 16, &s6->sin6_port, 2);
        n += 18;
    } else if (sa->sa_family == AF_UNIX &&
               len >= offsetof(struct sockaddr_un, sun_path)) {
        /* an unnamed socket (a socketpair's) hashes its empty name */
        size_t plen = len - offsetof(struct sockaddr_un, sun_path);

        in[n++] = 'u';
        memcpy(in + n, ((const struct sockaddr_un *)sa)->sun_path, plen);
        n += plen;
    } else {
        return -1;
    }
    return EVP_Digest(in, n, out, &outlen, EVP_sha256(), NULL) == 1 ? 0 : -1;
}

int kvf_auth_sock_name(int fd, int peer, unsigned char out[KVF_AUTH_MAC_LEN])
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int rc;

    memset(&ss, 0, sizeof(ss));
    rc = peer ? getpeername(fd, (struct sockaddr *)&ss, &len)
              : getsockname(fd, (struct sockaddr *)&ss, &len);
    return rc == 0 ? kvf_auth_name_hash((struct sockaddr *)&ss, len, out) : -1;
}

/* H(name) of one numeric "host:port" of auth_names (n bytes at s). */
static int kvf_auth_conf_name(const char *s, size_t n,
                              unsigned char out[KVF_AUTH_MAC_LEN])
{
    char addr[KVF_HOST_MAX + 16], host[KVF_HOST_MAX];
    struct sockaddr_in6 s6 = {.sin6_family = AF_INET6};
    struct sockaddr_in s4 = {.sin_family = AF_INET};
    uint16_t port;

    if (n == 0 || n >= sizeof(addr)) {
        return -1;
    }
    memcpy(addr, s, n);
    addr[n] = '\0';
    if (kvf_sock_parse_addr(addr, host, sizeof(host), &port) != KVF_OK) {
        return -1;
    }
    if (inet_pton(AF_INET, host, &s4.sin_addr) == 1) {
        s4.sin_port = htons(port);
        return kvf_auth_name_hash((struct sockaddr *)&s4, sizeof(s4), out);
    }
    if (inet_pton(AF_INET6, host, &s6.sin6_addr) == 1) {
        s6.sin6_port = htons(port);
        return kvf_auth_name_hash((struct sockaddr *)&s6, sizeof(s6), out);
    }
    return -1;
}

/* Whether h names this server: the address the accepted socket fd was
 * reached at, or an entry of auth_names. */
static int kvf_auth_name_ok(int fd, const unsigned char h[KVF_AUTH_MAC_LEN])
{
    const char *list = kvf_config_str(&kvf_auth_config, "auth_names");
    unsigned char mine[KVF_AUTH_MAC_LEN];
    const char *p = list, *end;
    int i;

    if (kvf_auth_sock_name(fd, 0, mine) == 0 &&
        memcmp(mine, h, sizeof(mine)) == 0) {
        return 1;
    }
    for (i = 0; p != NULL && *p != '\0' && i < KVF_AUTH_NAMES_MAX; i++) {
        end = strchr(p, ',');
        if (kvf_auth_conf_name(p, end ? (size_t)(end - p) : strlen(p), mine) ==
                0 &&
            memcmp(mine, h, sizeof(mine)) == 0) {
            return 1;
        }
        p = end ? end + 1 : NULL;
    }
    return 0;
}

/* ---- transcript, MACs, session keys ---- */

typedef struct kvf_auth_ts {
    const char *proto;
    const unsigned char *nc, *ns, *name;
    uint16_t hflags; /* HELLO's */
    uint16_t cflags; /* CHALLENGE's */
} kvf_auth_ts_t;

/* label 0 proto 0 role 0 nc ns H(name) hflags cflags (flags LE) */
static size_t kvf_auth_ts_bytes(const kvf_auth_ts_t *t, const char *label,
                                const char *role, unsigned char *out)
{
    size_t n = 0, l;

    l = strlen(label) + 1;
    memcpy(out + n, label, l);
    n += l;
    l = strnlen(t->proto, 31);
    memcpy(out + n, t->proto, l);
    out[n + l] = 0;
    n += l + 1;
    l = strlen(role) + 1;
    memcpy(out + n, role, l);
    n += l;
    memcpy(out + n, t->nc, KVF_AUTH_NONCE_LEN);
    n += KVF_AUTH_NONCE_LEN;
    memcpy(out + n, t->ns, KVF_AUTH_NONCE_LEN);
    n += KVF_AUTH_NONCE_LEN;
    memcpy(out + n, t->name, KVF_AUTH_MAC_LEN);
    n += KVF_AUTH_MAC_LEN;
    out[n++] = (unsigned char)t->hflags;
    out[n++] = (unsigned char)(t->hflags >> 8);
    out[n++] = (unsigned char)t->cflags;
    out[n++] = (unsigned char)(t->cflags >> 8);
    return n;
}

/* The MAC of role ("server" or "client") over the transcript. */
static void kvf_auth_ts_mac(const kvf_auth_ts_t *t, const char *role,
                            unsigned char out[KVF_AUTH_MAC_LEN])
{
    unsigned char in[256];

    kvf_auth_hmac(in, kvf_auth_ts_bytes(t, "kvferry-auth-v2", role, in), out);
}

/* The connection's frame tag keys: HKDF(secret, nc | ns, transcript and
 * direction), one key per direction. */
static kvf_status_t kvf_auth_ts_session(const kvf_auth_ts_t *t, int server,
                                        kvf_wire_mac_t *m)
{
    unsigned char info[256], salt[2 * KVF_AUTH_NONCE_LEN];
    unsigned char c2s[KVF_WIRE_KEY_LEN], s2c[KVF_WIRE_KEY_LEN];
    kvf_status_t st;
    size_t n;

    memcpy(salt, t->nc, KVF_AUTH_NONCE_LEN);
    memcpy(salt + KVF_AUTH_NONCE_LEN, t->ns, KVF_AUTH_NONCE_LEN);
    n = kvf_auth_ts_bytes(t, "kvferry-session-v2", "c2s", info);
    st = kvf_auth_hkdf(salt, sizeof(salt), info, n, c2s, sizeof(c2s));
    if (st == KVF_OK) {
        n = kvf_auth_ts_bytes(t, "kvferry-session-v2", "s2c", info);
        st = kvf_auth_hkdf(salt, sizeof(salt), info, n, s2c, sizeof(s2c));
    }
    if (st == KVF_OK) {
        st = server ? kvf_wire_mac_init(m, s2c, c2s)
                    : kvf_wire_mac_init(m, c2s, s2c);
    }
    OPENSSL_cleanse(c2s, sizeof(c2s));
    OPENSSL_cleanse(s2c, sizeof(s2c));
    if (st == KVF_OK) {
        m->payload = strcmp(t->proto, "tcp") == 0 &&
                     ((t->hflags | t->cflags) & KVF_AUTH_F_PAYLOAD) != 0;
    }
    return st;
}

/* This process asks for payload tags (auth_payload_mac). */
static int kvf_auth_payload_wanted(void)
{
    const char *v = kvf_config_str(&kvf_auth_config, "auth_payload_mac");

    return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

/* ---- blocking client ---- */

static kvf_status_t kvf_auth_send(int fd, const kvf_auth_msg_t *m,
                                  uint64_t deadline_ms)
{
    unsigned char buf[KVF_AUTH_MSG_LEN];

    kvf_auth_msg_enc(m, buf);
    return kvf_sock_send_all(fd, buf, sizeof(buf), deadline_ms);
}

static kvf_status_t kvf_auth_recv(int fd, int type, kvf_auth_msg_t *m,
                                  uint64_t deadline_ms)
{
    unsigned char buf[KVF_AUTH_MSG_LEN];
    kvf_status_t status;

    status = kvf_sock_recv_all(fd, buf, sizeof(buf), deadline_ms);
    if (status == KVF_OK) {
        status = kvf_auth_msg_dec(buf, sizeof(buf), m);
    }
    if (status == KVF_OK && m->type != type) {
        status = KVF_ERR_PROTOCOL;
    }
    return status;
}

/* HELLO out, CHALLENGE in and checked; fills t. KVF_ERR_AUTH (logged)
 * when the server does not prove the secret: no PROOF is sent then. */
static kvf_status_t kvf_auth_client_hello(int fd, const char *peer,
                                          uint64_t deadline_ms,
                                          kvf_auth_msg_t *hello,
                                          kvf_auth_msg_t *chal,
                                          kvf_auth_ts_t *t)
{
    kvf_status_t status;

    hello->type = KVF_AUTH_HELLO;
    hello->flags = kvf_auth_payload_wanted() ? KVF_AUTH_F_PAYLOAD : 0;
    if (RAND_bytes(hello->nonce, KVF_AUTH_NONCE_LEN) != 1 ||
        kvf_auth_sock_name(fd, 1, hello->mac) != 0) {
        kvf_error("authentication with %s: no random bytes or no peer "
                  "address: %m",
                  peer);
        return KVF_ERR_INTERNAL;
    }
    status = kvf_auth_send(fd, hello, deadline_ms);
    if (status == KVF_OK) {
        status = kvf_auth_recv(fd, KVF_AUTH_CHALLENGE, chal, deadline_ms);
    }
    if (status != KVF_OK) {
        kvf_error("authentication with %s failed: %s (does it run with "
                  "another secret or insecure=1?)",
                  peer, kvf_status_str(status));
        return status == KVF_ERR_PROTOCOL ? KVF_ERR_AUTH : status;
    }
    if (chal->flags & KVF_AUTH_F_NAME) {
        kvf_error("authentication with %s failed: the server there was "
                  "reached under another address than its own (a relay in "
                  "between, or NAT: list the address clients dial in its "
                  "auth_names)",
                  peer);
        return KVF_ERR_AUTH;
    }
    *t = (kvf_auth_ts_t){NULL,       hello->nonce, chal->nonce,
                         hello->mac, hello->flags, chal->flags};
    return KVF_OK;
}

static kvf_status_t kvf_auth_client_run(int fd, const char *proto,
                                        const char *peer, uint64_t deadline_ms,
                                        kvf_wire_mac_t *mac_p)
{
    unsigned char mac[KVF_AUTH_MAC_LEN];
    kvf_auth_msg_t hello = {0}, chal, proof = {0}, res;
    kvf_status_t status;
    kvf_auth_ts_t t;

    status = kvf_auth_client_hello(fd, peer, deadline_ms, &hello, &chal, &t);
    if (status != KVF_OK) {
        return status;
    }
    t.proto = proto;
    kvf_auth_ts_mac(&t, "server", mac);
    if (CRYPTO_memcmp(mac, chal.mac, sizeof(mac)) != 0) {
        kvf_error("authentication with %s failed: it does not hold the "
                  "cluster secret",
                  peer);
        return KVF_ERR_AUTH;
    }
    proof.type = KVF_AUTH_PROOF;
    kvf_auth_ts_mac(&t, "client", proof.mac);
    status = kvf_auth_send(fd, &proof, deadline_ms);
    if (status == KVF_OK) {
        status = kvf_auth_recv(fd, KVF_AUTH_RESULT, &res, deadline_ms);
    }
    if (status == KVF_OK && !(res.flags & KVF_AUTH_F_ACCEPTED)) {
        status = KVF_ERR_AUTH;
    }
    if (status != KVF_OK) {
        kvf_error("authentication with %s failed: %s", peer,
                  status == KVF_ERR_AUTH ? "it refused our secret"
                                         : kvf_status_str(status));
        return status;
    }
    return mac_p != NULL ? kvf_auth_ts_session(&t, 0, mac_p) : KVF_OK;
}

kvf_status_t kvf_auth_client(int fd, const char *host, const char *proto,
                             const char *peer, uint64_t deadline_ms,
                             kvf_wire_mac_t *mac_p)
{
    kvf_status_t status;
    int on = 0;

    if (mac_p != NULL) {
        memset(mac_p, 0, sizeof(*mac_p));
    }
    status = kvf_auth_prepare(host, &on);
    if (status != KVF_OK || !on) {
        return status;
    }
    return kvf_auth_client_run(fd, proto, peer, deadline_ms, mac_p);
}

kvf_status_t kvf_auth_connect(const char *host, uint16_t port, int timeout_ms,
                              const char *proto, int *fd_p,
                              kvf_wire_mac_t *mac_p)
{
    uint64_t deadline = kvf_time_ms() + (uint64_t)timeout_ms;
    kvf_status_t status;
    char peer[KVF_HOST_MAX + 16];
    int fd, on = 0;

    if (mac_p != NULL) {
        memset(mac_p, 0, sizeof(*mac_p));
    }
    status = kvf_auth_prepare(host, &on);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_sock_connect(host, port, timeout_ms, &fd);
    if (status != KVF_OK) {
        return status;
    }
    if (on) {
        snprintf(peer, sizeof(peer), "%s %s:%u", proto, host, port);
        status = kvf_auth_client_run(fd, proto, peer, deadline, mac_p);
        if (status != KVF_OK) {
            close(fd);
            return status;
        }
    }
    *fd_p = fd;
    return KVF_OK;
}

/* ---- server ---- */

kvf_status_t kvf_auth_server(int fd, const char *host, const char *proto,
                             const char *peer, uint64_t deadline_ms,
                             kvf_wire_mac_t *mac_p)
{
    kvf_auth_srv_t a;
    kvf_status_t status;
    uint32_t events;

    if (mac_p != NULL) {
        memset(mac_p, 0, sizeof(*mac_p));
    }
    status = kvf_auth_srv_init(&a, host, proto);
    while (status == KVF_OK) {
        status = kvf_auth_srv_step(&a, fd, peer, &events);
        if (status != KVF_INPROGRESS) {
            break;
        }
        status = kvf_sock_wait(fd, (short)events, deadline_ms);
        if (status != KVF_OK) {
            kvf_log_rl(KVF_LOG_WARN, "%s: peer %s: authentication: %s", proto,
                       peer, kvf_status_str(status));
        }
    }
    if (status == KVF_OK && mac_p != NULL) {
        status = kvf_auth_srv_mac(&a, mac_p);
    }
    OPENSSL_cleanse(&a, sizeof(a));
    return status;
}

kvf_status_t kvf_auth_srv_init(kvf_auth_srv_t *a, const char *host,
                               const char *proto)
{
    memset(a, 0, sizeof(*a));
    a->proto = proto;
    a->payload = kvf_auth_payload_wanted();
    return kvf_auth_prepare(host, &a->on);
}

enum {
    KVF_AUTH_S_HELLO = 0, /* reading HELLO */
    KVF_AUTH_S_CHAL,      /* sending CHALLENGE */
    KVF_AUTH_S_PROOF,     /* reading PROOF */
    KVF_AUTH_S_RESULT,    /* sending RESULT (accepted) */
    KVF_AUTH_S_DONE
};

/* Moves a->buf in or out; KVF_OK when whole, KVF_INPROGRESS, or error. */
static kvf_status_t kvf_auth_srv_io(kvf_auth_srv_t *a, int fd, int out)
{
    ssize_t n;

    while (a->off < KVF_AUTH_MSG_LEN) {
        n = out ? send(fd, a->buf + a->off, KVF_AUTH_MSG_LEN - a->off,
                       MSG_NOSIGNAL | MSG_DONTWAIT)
                : recv(fd, a->buf + a->off, KVF_AUTH_MSG_LEN - a->off,
                       MSG_DONTWAIT);
        if (n > 0) {
            a->off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return KVF_INPROGRESS;
        } else {
            return KVF_ERR_CONN_RESET;
        }
    }
    a->off = 0;
    return KVF_OK;
}

/* Best effort: one last message, then the caller closes. */
static void kvf_auth_srv_last(kvf_auth_srv_t *a, int fd,
                              const kvf_auth_msg_t *m)
{
    kvf_auth_msg_enc(m, a->buf);
    (void)!send(fd, a->buf, sizeof(a->buf), MSG_NOSIGNAL | MSG_DONTWAIT);
}

static kvf_auth_ts_t kvf_auth_srv_ts(const kvf_auth_srv_t *a)
{
    uint16_t cflags = a->payload ? KVF_AUTH_F_PAYLOAD : 0;

    return (kvf_auth_ts_t){a->proto, a->nc, a->ns, a->name, a->hflags, cflags};
}

/* HELLO arrived: checks the name the client reached, queues the
 * CHALLENGE. KVF_ERR_PEER_UNREACHABLE: the name is not this server's. */
static kvf_status_t kvf_auth_srv_hello(kvf_auth_srv_t *a, int fd,
                                       const kvf_auth_msg_t *m)
{
    kvf_auth_msg_t out = {0};
    kvf_auth_ts_t t;

    memcpy(a->nc, m->nonce, sizeof(a->nc));
    memcpy(a->name, m->mac, sizeof(a->name));
    a->hflags = m->flags;
    out.type = KVF_AUTH_CHALLENGE;
    if (!kvf_auth_name_ok(fd, a->name)) {
        out.flags = KVF_AUTH_F_NAME;
        kvf_auth_srv_last(a, fd, &out);
        return KVF_ERR_PEER_UNREACHABLE;
    }
    if (RAND_bytes(a->ns, sizeof(a->ns)) != 1) {
        return KVF_ERR_INTERNAL;
    }
    out.flags = a->payload ? KVF_AUTH_F_PAYLOAD : 0;
    memcpy(out.nonce, a->ns, sizeof(a->ns));
    t = kvf_auth_srv_ts(a);
    kvf_auth_ts_mac(&t, "server", out.mac);
    kvf_auth_msg_enc(&out, a->buf);
    a->state = KVF_AUTH_S_CHAL;
    return KVF_OK;
}

/* A whole message arrived in a->buf: checks it and queues the answer. */
static kvf_status_t kvf_auth_srv_got(kvf_auth_srv_t *a, int fd)
{
    unsigned char mac[KVF_AUTH_MAC_LEN];
    kvf_auth_msg_t m, out = {0};
    kvf_status_t status;
    kvf_auth_ts_t t;
    int want = a->state == KVF_AUTH_S_HELLO ? KVF_AUTH_HELLO : KVF_AUTH_PROOF;

    status = kvf_auth_msg_dec(a->buf, sizeof(a->buf), &m);
    if (status != KVF_OK || m.type != want) {
        return KVF_ERR_PROTOCOL;
    }
    if (a->state == KVF_AUTH_S_HELLO) {
        return kvf_auth_srv_hello(a, fd, &m);
    }
    t = kvf_auth_srv_ts(a);
    kvf_auth_ts_mac(&t, "client", mac);
    out.type = KVF_AUTH_RESULT;
    if (CRYPTO_memcmp(mac, m.mac, sizeof(mac)) != 0) {
        kvf_auth_srv_last(a, fd, &out); /* tell the client, then close */
        return KVF_ERR_AUTH;
    }
    out.flags = KVF_AUTH_F_ACCEPTED;
    kvf_auth_msg_enc(&out, a->buf);
    a->state = KVF_AUTH_S_RESULT;
    return KVF_OK;
}

static const char *kvf_auth_why(kvf_status_t status)
{
    switch (status) {
    case KVF_ERR_AUTH:
        return "wrong secret";
    case KVF_ERR_PEER_UNREACHABLE:
        return "the client reached another address than this server's "
               "(relayed, or NAT: see auth_names)";
    case KVF_ERR_PROTOCOL:
    case KVF_ERR_VERSION:
        return "not an authentication message";
    default:
        return kvf_status_str(status);
    }
}

kvf_status_t kvf_auth_srv_step(kvf_auth_srv_t *a, int fd, const char *peer,
                               uint32_t *events_p)
{
    kvf_status_t status = KVF_OK;
    int out;

    if (!a->on) {
        return KVF_OK;
    }
    while (a->state != KVF_AUTH_S_DONE && status == KVF_OK) {
        out = a->state == KVF_AUTH_S_CHAL || a->state == KVF_AUTH_S_RESULT;
        status = kvf_auth_srv_io(a, fd, out);
        if (status == KVF_INPROGRESS && !out && a->off >= 4 &&
            memcmp(a->buf, kvf_auth_magic_le, 4) != 0) {
            status = KVF_ERR_PROTOCOL; /* not the exchange: close now */
        }
        if (status != KVF_OK) {
            break;
        }
        if (out) {
            a->state = a->state == KVF_AUTH_S_CHAL ? KVF_AUTH_S_PROOF
                                                   : KVF_AUTH_S_DONE;
        } else {
            status = kvf_auth_srv_got(a, fd);
        }
    }
    if (status == KVF_INPROGRESS) {
        out = a->state == KVF_AUTH_S_CHAL || a->state == KVF_AUTH_S_RESULT;
        *events_p = out ? POLLOUT : POLLIN;
    } else if (status != KVF_OK) {
        /* a peer that closed before sending a byte only probed the port
         * (a reachability check): not worth a warning */
        int probe = status == KVF_ERR_CONN_RESET &&
                    a->state == KVF_AUTH_S_HELLO && a->off == 0;

        kvf_log_rl(probe ? KVF_LOG_DEBUG : KVF_LOG_WARN,
                   "%s: closing a connection from %s: authentication "
                   "failed (%s)",
                   a->proto, peer ? peer : "?", kvf_auth_why(status));
        status = status == KVF_ERR_CONN_RESET ? status : KVF_ERR_AUTH;
    }
    return status;
}

kvf_status_t kvf_auth_srv_mac(const kvf_auth_srv_t *a, kvf_wire_mac_t *mac_p)
{
    kvf_auth_ts_t t;

    memset(mac_p, 0, sizeof(*mac_p));
    if (!a->on) {
        return KVF_OK;
    }
    if (a->state != KVF_AUTH_S_DONE) {
        return KVF_ERR_INTERNAL;
    }
    t = kvf_auth_srv_ts(a);
    return kvf_auth_ts_session(&t, 1, mac_p);
}
