/*
 * Cluster authentication (see core/auth.h): the secret file, the automatic
 * loopback secret, the exchange's codec, and its blocking and
 * non-blocking forms over OpenSSL's HMAC-SHA256, RAND_bytes and
 * CRYPTO_memcmp.
 */
#include "core/auth.h"
#include "core/log.h"
#include "core/sock.h"
#include "core/time.h"
#include "core/wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

static const kvf_config_entry_t kvf_auth_config_entries[] = {
    {"secret_file", "",
     "file holding the cluster secret (at least 32 bytes, mode 0600, owned "
     "by this user); empty: $HOME/.kvferry/secret, created when every "
     "address is loopback",
     KVF_CONFIG_USER},
    {"insecure", "0",
     "1: allow binding a non-loopback address without a secret; with no "
     "secret_file, connections are not authenticated",
     KVF_CONFIG_USER},
};

KVF_CONFIG_TABLE(kvf_auth_config, "auth", kvf_auth_config_entries)

/* KVF_AUTH_MAGIC as it arrives on the wire */
static const unsigned char kvf_auth_magic_le[4] = {'K', 'V', 'F', 'A'};

static pthread_mutex_t kvf_auth_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char kvf_auth_secret[KVF_AUTH_SECRET_MAX];
static size_t kvf_auth_secret_len; /* 0: not loaded */

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

int kvf_auth_is_loopback(const char *host)
{
    struct in6_addr a6;
    struct in_addr a4;

    if (host == NULL || strcmp(host, "localhost") == 0) {
        return 1;
    }
    if (inet_pton(AF_INET, host, &a4) == 1) {
        return (ntohl(a4.s_addr) >> 24) == 127;
    }
    return inet_pton(AF_INET6, host, &a6) == 1 &&
           memcmp(&a6, &in6addr_loopback, sizeof(a6)) == 0;
}

static int kvf_auth_insecure(void)
{
    const char *v = kvf_config_str(&kvf_auth_config, "insecure");

    return v != NULL && strcmp(v, "0") != 0 && v[0] != '\0';
}

/* Reads a secret file after checking owner, mode and size. */
static kvf_status_t kvf_auth_read_file(const char *path)
{
    struct stat sb;
    ssize_t n;
    int fd;

    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        kvf_error("secret file %s: cannot open: %m (create it: head -c 32 "
                  "/dev/urandom > %s; chmod 600 %s)",
                  path, path, path);
        return KVF_ERR_AUTH;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid() ||
        (sb.st_mode & 077) != 0 || sb.st_size < KVF_AUTH_SECRET_MIN ||
        sb.st_size > KVF_AUTH_SECRET_MAX) {
        kvf_error("secret file %s: mode %04o, owner %u, %ld bytes: refused "
                  "(it must be a regular file of %d to %d bytes owned by uid "
                  "%u with mode 0600: chmod 600 %s)",
                  path, (unsigned)(sb.st_mode & 07777), (unsigned)sb.st_uid,
                  (long)sb.st_size, KVF_AUTH_SECRET_MIN, KVF_AUTH_SECRET_MAX,
                  (unsigned)geteuid(), path);
        close(fd);
        return KVF_ERR_AUTH;
    }
    n = read(fd, kvf_auth_secret, (size_t)sb.st_size);
    close(fd);
    if (n != sb.st_size) {
        kvf_error("secret file %s: short read", path);
        return KVF_ERR_AUTH;
    }
    kvf_auth_secret_len = (size_t)n;
    return KVF_OK;
}

/* Creates $HOME/.kvferry/secret (0600, in a 0700 directory) unless it
 * exists; a temporary file linked into place makes concurrent starts of
 * several processes agree on one secret. */
static kvf_status_t kvf_auth_auto_secret(char *path, size_t pathlen)
{
    unsigned char key[KVF_AUTH_SECRET_MIN];
    const char *home = kvf_config_home();
    char tmp[4200];
    int fd, ok;

    if (home == NULL || home[0] == '\0') {
        kvf_error("no secret_file set and no $HOME for the automatic secret: "
                  "set secret_file (KVF_SECRET_FILE)");
        return KVF_ERR_AUTH;
    }
    snprintf(path, pathlen, "%s/.kvferry", home);
    if (mkdir(path, 0700) != 0 && errno != EEXIST) {
        kvf_error("cannot create %s: %m", path);
        return KVF_ERR_AUTH;
    }
    snprintf(path, pathlen, "%s/.kvferry/secret", home);
    if (access(path, F_OK) == 0) {
        return KVF_OK;
    }
    snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || RAND_bytes(key, sizeof(key)) != 1) {
        kvf_error("cannot create the secret %s: %m", tmp);
        if (fd >= 0) {
            close(fd);
        }
        return KVF_ERR_AUTH;
    }
    ok = write(fd, key, sizeof(key)) == (ssize_t)sizeof(key) && fsync(fd) == 0;
    close(fd);
    OPENSSL_cleanse(key, sizeof(key));
    if (!ok || (link(tmp, path) != 0 && errno != EEXIST)) {
        kvf_error("cannot create the secret %s: %m", path);
        unlink(tmp);
        return KVF_ERR_AUTH;
    }
    unlink(tmp);
    kvf_info("created the cluster secret %s", path);
    return KVF_OK;
}

kvf_status_t kvf_auth_prepare(const char *host, int *on_p)
{
    const char *file = kvf_config_str(&kvf_auth_config, "secret_file");
    kvf_status_t status = KVF_OK;
    char path[4096];

    pthread_mutex_lock(&kvf_auth_lock);
    if (kvf_auth_secret_len > 0) {
        goto out;
    }
    if (file != NULL && file[0] != '\0') {
        status = kvf_auth_read_file(file);
    } else if (kvf_auth_insecure()) {
        pthread_mutex_unlock(&kvf_auth_lock);
        *on_p = 0;
        return KVF_OK;
    } else if (!kvf_auth_is_loopback(host)) {
        kvf_error("no cluster secret for non-loopback address %s: set "
                  "secret_file (KVF_SECRET_FILE) or insecure=1",
                  host ? host : "(local)");
        status = KVF_ERR_AUTH;
    } else {
        status = kvf_auth_auto_secret(path, sizeof(path));
        if (status == KVF_OK) {
            status = kvf_auth_read_file(path);
        }
    }
out:
    pthread_mutex_unlock(&kvf_auth_lock);
    if (status == KVF_OK) {
        *on_p = 1;
    }
    return status;
}

kvf_status_t kvf_auth_check_bind(const char *host)
{
    const char *file = kvf_config_str(&kvf_auth_config, "secret_file");
    int on;

    if (!kvf_auth_is_loopback(host) && (file == NULL || file[0] == '\0')) {
        if (!kvf_auth_insecure()) {
            kvf_error("refusing to listen on non-loopback address '%s' "
                      "without a cluster secret: set secret_file "
                      "(KVF_SECRET_FILE) or insecure=1 (KVF_INSECURE=1)",
                      host);
            return KVF_ERR_AUTH;
        }
        kvf_warn("listening on '%s' with insecure=1 and no secret: anyone "
                 "who reaches it can read and write its memory",
                 host);
    }
    return kvf_auth_prepare(host, &on);
}

void kvf_auth_peer_name(int fd, char *out, size_t outlen)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    char ip[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;

    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0) {
        snprintf(out, outlen, "?");
    } else if (ss.ss_family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)&ss;

        inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof(ip));
        port = ntohs(sin->sin_port);
        snprintf(out, outlen, "%s:%u", ip, port);
    } else if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;

        inet_ntop(AF_INET6, &sin6->sin6_addr, ip, sizeof(ip));
        port = ntohs(sin6->sin6_port);
        snprintf(out, outlen, "[%s]:%u", ip, port);
    } else {
        snprintf(out, outlen, "local");
    }
}

int kvf_auth_bearer_ok(const char *got, const char *want)
{
    size_t n = strlen(want);

    return got != NULL && strlen(got) == n && CRYPTO_memcmp(got, want, n) == 0;
}

kvf_status_t kvf_auth_random(void *buf, size_t len)
{
    return RAND_bytes(buf, (int)len) == 1 ? KVF_OK : KVF_ERR_INTERNAL;
}

void kvf_auth_reset(void)
{
    pthread_mutex_lock(&kvf_auth_lock);
    OPENSSL_cleanse(kvf_auth_secret, sizeof(kvf_auth_secret));
    kvf_auth_secret_len = 0;
    pthread_mutex_unlock(&kvf_auth_lock);
}

/* MAC over "kvferry-auth-v1", proto, role and both nonces. */
static void kvf_auth_mac(const char *proto, const char *role,
                         const unsigned char *nc, const unsigned char *ns,
                         unsigned char out[KVF_AUTH_MAC_LEN])
{
    unsigned char in[256];
    unsigned int outlen = KVF_AUTH_MAC_LEN;
    size_t n = 0, l;

    l = strlen("kvferry-auth-v1") + 1;
    memcpy(in + n, "kvferry-auth-v1", l);
    n += l;
    l = strnlen(proto, 32) + 1;
    memcpy(in + n, proto, l - 1);
    in[n + l - 1] = 0;
    n += l;
    l = strlen(role) + 1;
    memcpy(in + n, role, l);
    n += l;
    memcpy(in + n, nc, KVF_AUTH_NONCE_LEN);
    n += KVF_AUTH_NONCE_LEN;
    memcpy(in + n, ns, KVF_AUTH_NONCE_LEN);
    n += KVF_AUTH_NONCE_LEN;
    HMAC(EVP_sha256(), kvf_auth_secret, (int)kvf_auth_secret_len, in, n, out,
         &outlen);
}

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

static kvf_status_t kvf_auth_client_run(int fd, const char *proto,
                                        const char *peer, uint64_t deadline_ms)
{
    unsigned char mac[KVF_AUTH_MAC_LEN];
    kvf_auth_msg_t hello = {0}, chal, proof = {0}, res;
    kvf_status_t status;

    hello.type = KVF_AUTH_HELLO;
    if (RAND_bytes(hello.nonce, KVF_AUTH_NONCE_LEN) != 1) {
        return KVF_ERR_INTERNAL;
    }
    status = kvf_auth_send(fd, &hello, deadline_ms);
    if (status == KVF_OK) {
        status = kvf_auth_recv(fd, KVF_AUTH_CHALLENGE, &chal, deadline_ms);
    }
    if (status != KVF_OK) {
        kvf_error("authentication with %s failed: %s (does it run with "
                  "another secret or insecure=1?)",
                  peer, kvf_status_str(status));
        return status == KVF_ERR_PROTOCOL ? KVF_ERR_AUTH : status;
    }
    kvf_auth_mac(proto, "server", hello.nonce, chal.nonce, mac);
    if (CRYPTO_memcmp(mac, chal.mac, sizeof(mac)) != 0) {
        kvf_error("authentication with %s failed: it does not hold the "
                  "cluster secret",
                  peer);
        return KVF_ERR_AUTH;
    }
    proof.type = KVF_AUTH_PROOF;
    kvf_auth_mac(proto, "client", hello.nonce, chal.nonce, proof.mac);
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
    }
    return status;
}

kvf_status_t kvf_auth_client(int fd, const char *host, const char *proto,
                             const char *peer, uint64_t deadline_ms)
{
    kvf_status_t status;
    int on = 0;

    status = kvf_auth_prepare(host, &on);
    if (status != KVF_OK || !on) {
        return status;
    }
    return kvf_auth_client_run(fd, proto, peer, deadline_ms);
}

kvf_status_t kvf_auth_server(int fd, const char *host, const char *proto,
                             const char *peer, uint64_t deadline_ms)
{
    kvf_auth_srv_t a;
    kvf_status_t status;
    uint32_t events;

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
    return status;
}

kvf_status_t kvf_auth_connect(const char *host, uint16_t port, int timeout_ms,
                              const char *proto, int *fd_p)
{
    uint64_t deadline = kvf_time_ms() + (uint64_t)timeout_ms;
    kvf_status_t status;
    char peer[KVF_HOST_MAX + 16];
    int fd, on = 0;

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
        status = kvf_auth_client_run(fd, proto, peer, deadline);
        if (status != KVF_OK) {
            close(fd);
            return status;
        }
    }
    *fd_p = fd;
    return KVF_OK;
}

kvf_status_t kvf_auth_srv_init(kvf_auth_srv_t *a, const char *host,
                               const char *proto)
{
    memset(a, 0, sizeof(*a));
    a->proto = proto;
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

/* A whole message arrived in a->buf: checks it and queues the answer. */
static kvf_status_t kvf_auth_srv_got(kvf_auth_srv_t *a, int fd)
{
    unsigned char mac[KVF_AUTH_MAC_LEN];
    kvf_auth_msg_t m, out = {0};
    kvf_status_t status;
    int want = a->state == KVF_AUTH_S_HELLO ? KVF_AUTH_HELLO : KVF_AUTH_PROOF;

    status = kvf_auth_msg_dec(a->buf, sizeof(a->buf), &m);
    if (status != KVF_OK || m.type != want) {
        return KVF_ERR_PROTOCOL;
    }
    if (a->state == KVF_AUTH_S_HELLO) {
        memcpy(a->nc, m.nonce, sizeof(a->nc));
        if (RAND_bytes(a->ns, sizeof(a->ns)) != 1) {
            return KVF_ERR_INTERNAL;
        }
        out.type = KVF_AUTH_CHALLENGE;
        memcpy(out.nonce, a->ns, sizeof(a->ns));
        kvf_auth_mac(a->proto, "server", a->nc, a->ns, out.mac);
        a->state = KVF_AUTH_S_CHAL;
    } else {
        kvf_auth_mac(a->proto, "client", a->nc, a->ns, mac);
        out.type = KVF_AUTH_RESULT;
        if (CRYPTO_memcmp(mac, m.mac, sizeof(mac)) != 0) {
            /* best effort: tell the client, then close */
            kvf_auth_msg_enc(&out, a->buf);
            (void)!send(fd, a->buf, sizeof(a->buf),
                        MSG_NOSIGNAL | MSG_DONTWAIT);
            return KVF_ERR_AUTH;
        }
        out.flags = KVF_AUTH_F_ACCEPTED;
        a->state = KVF_AUTH_S_RESULT;
    }
    kvf_auth_msg_enc(&out, a->buf);
    a->off = 0;
    return KVF_OK;
}

static const char *kvf_auth_why(kvf_status_t status)
{
    switch (status) {
    case KVF_ERR_AUTH:
        return "wrong secret";
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

kvf_status_t kvf_auth_token(const char *host, const char *label, char *out,
                            size_t outlen)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char mac[KVF_AUTH_MAC_LEN];
    unsigned int maclen = sizeof(mac);
    kvf_status_t status;
    int on = 0;
    size_t i;

    if (outlen < KVF_AUTH_TOKEN_LEN + 1 || label == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_auth_prepare(host, &on);
    if (status != KVF_OK) {
        return status;
    }
    out[0] = '\0';
    if (!on) {
        return KVF_OK;
    }
    HMAC(EVP_sha256(), kvf_auth_secret, (int)kvf_auth_secret_len,
         (const unsigned char *)label, strlen(label), mac, &maclen);
    for (i = 0; i < sizeof(mac); i++) {
        out[2 * i] = hex[mac[i] >> 4];
        out[2 * i + 1] = hex[mac[i] & 15];
    }
    out[KVF_AUTH_TOKEN_LEN] = '\0';
    OPENSSL_cleanse(mac, sizeof(mac));
    return KVF_OK;
}

kvf_status_t kvf_auth_http_token(const char *host, char *out, size_t outlen)
{
    return kvf_auth_token(host, "kvferry-http-v1", out, outlen);
}
