/*
 * Cluster authentication (see core/auth.h): the secret file and the
 * automatic loopback secret (files opened without following links,
 * owner and mode checked), the tokens and record MACs derived from the
 * secret, over OpenSSL's HMAC-SHA256, HKDF, RAND_bytes and
 * CRYPTO_memcmp. The exchange itself is core/handshake.c.
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

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
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
    {"auth_names", "",
     "numeric host:port addresses (comma-separated) under which clients "
     "reach this process besides its own socket address, e.g. a NAT's "
     "public address: the handshake refuses a client that reached any "
     "other address (a relay)",
     KVF_CONFIG_USER},
    {"auth_payload_mac", "0",
     "1: tcp connections this process opens or serves also tag every "
     "payload byte with the session key (a relay cannot alter data in "
     "flight; costs a pass over the bytes on each side); either side "
     "asking turns it on for the connection",
     KVF_CONFIG_USER},
};

KVF_CONFIG_TABLE(kvf_auth_config, "auth", kvf_auth_config_entries)

static pthread_mutex_t kvf_auth_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char kvf_auth_secret[KVF_AUTH_SECRET_MAX];
static size_t kvf_auth_secret_len; /* 0: not loaded */

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

kvf_status_t kvf_auth_read_private_at(int dfd, const char *name,
                                      const char *shown, void *buf, size_t min,
                                      size_t max, size_t *len_p)
{
    struct stat sb;
    ssize_t n;
    int fd;

    fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
    if (fd < 0) {
        kvf_error("%s: cannot open: %m%s", shown,
                  errno == ELOOP ? " (a symbolic link: refused; name the "
                                   "file itself)"
                                 : "");
        return KVF_ERR_AUTH;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid() ||
        (sb.st_mode & 077) != 0 || (size_t)sb.st_size < min ||
        (size_t)sb.st_size > max) {
        kvf_error("%s: mode %04o, owner uid %u, %ld bytes: refused (it must "
                  "be a regular file of %zu to %zu bytes owned by uid %u "
                  "with no group or other permission: chown %u %s; chmod "
                  "600 %s)",
                  shown, (unsigned)(sb.st_mode & 07777), (unsigned)sb.st_uid,
                  (long)sb.st_size, min, max, (unsigned)geteuid(),
                  (unsigned)geteuid(), shown, shown);
        close(fd);
        return KVF_ERR_AUTH;
    }
    n = read(fd, buf, (size_t)sb.st_size);
    close(fd);
    if (n != sb.st_size) {
        kvf_error("%s: short read", shown);
        return KVF_ERR_AUTH;
    }
    *len_p = (size_t)n;
    return KVF_OK;
}

kvf_status_t kvf_auth_read_private(const char *path, void *buf, size_t min,
                                   size_t max, size_t *len_p)
{
    return kvf_auth_read_private_at(AT_FDCWD, path, path, buf, min, max, len_p);
}

/* Reads a secret file after checking owner, mode and size. */
static kvf_status_t kvf_auth_read_file(int dfd, const char *name,
                                       const char *shown)
{
    size_t n;
    kvf_status_t st;

    if (faccessat(dfd, name, F_OK, AT_SYMLINK_NOFOLLOW) != 0 &&
        errno == ENOENT) {
        kvf_error("secret file %s: does not exist (create it: head -c 32 "
                  "/dev/urandom > %s; chmod 600 %s)",
                  shown, shown, shown);
        return KVF_ERR_AUTH;
    }
    st = kvf_auth_read_private_at(dfd, name, shown, kvf_auth_secret,
                                  KVF_AUTH_SECRET_MIN, KVF_AUTH_SECRET_MAX, &n);
    if (st == KVF_OK) {
        kvf_auth_secret_len = n;
    }
    return st;
}

/* Opens $HOME/.kvferry (created 0700 when missing) and checks that it is
 * a directory of this user that nobody else may write into: otherwise
 * whoever can could replace or delete the secret, or make this process
 * write where a link points. Returns its fd, or -1 (logged). */
static int kvf_auth_secret_dir(const char *dir)
{
    struct stat sb;
    int dfd;

    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        kvf_error("cannot create %s: %m", dir);
        return -1;
    }
    dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) {
        kvf_error("cannot open %s: %m%s", dir,
                  errno == ELOOP || errno == ENOTDIR
                      ? " (a symbolic link or not a directory: refused)"
                      : "");
        return -1;
    }
    if (fstat(dfd, &sb) != 0 || sb.st_uid != geteuid() ||
        (sb.st_mode & 022) != 0) {
        kvf_error("%s: owner uid %u, mode %04o: refused for the automatic "
                  "secret (it must belong to uid %u and not be writable by "
                  "group or others: remove it, or chown %u %s; chmod 700 "
                  "%s; or set secret_file)",
                  dir, (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 07777),
                  (unsigned)geteuid(), (unsigned)geteuid(), dir, dir);
        close(dfd);
        return -1;
    }
    return dfd;
}

/* Writes a new secret into dfd/secret unless it exists: a temporary file
 * created exclusively (never following a link) and linked into place,
 * so concurrent starts of several processes agree on one secret. */
static kvf_status_t kvf_auth_secret_create(int dfd, const char *dir)
{
    unsigned char key[KVF_AUTH_SECRET_MIN];
    uint32_t salt = 0;
    char tmp[64];
    int fd, ok;

    if (faccessat(dfd, "secret", F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
        return KVF_OK;
    }
    if (RAND_bytes(key, sizeof(key)) != 1 ||
        RAND_bytes((unsigned char *)&salt, sizeof(salt)) != 1) {
        kvf_error("no random bytes for the secret");
        return KVF_ERR_AUTH;
    }
    snprintf(tmp, sizeof(tmp), "secret.%d.%08x.tmp", (int)getpid(), salt);
    fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                0600);
    if (fd < 0) {
        kvf_error("cannot create the secret %s/%s: %m", dir, tmp);
        OPENSSL_cleanse(key, sizeof(key));
        return KVF_ERR_AUTH;
    }
    ok = write(fd, key, sizeof(key)) == (ssize_t)sizeof(key) && fsync(fd) == 0;
    close(fd);
    OPENSSL_cleanse(key, sizeof(key));
    if (!ok || (linkat(dfd, tmp, dfd, "secret", 0) != 0 && errno != EEXIST)) {
        kvf_error("cannot create the secret %s/secret: %m", dir);
        unlinkat(dfd, tmp, 0);
        return KVF_ERR_AUTH;
    }
    unlinkat(dfd, tmp, 0);
    kvf_info("created the cluster secret %s/secret", dir);
    return KVF_OK;
}

/* The automatic loopback secret: $HOME/.kvferry/secret, created once
 * (0600, in a 0700 directory), then read with the usual checks. */
static kvf_status_t kvf_auth_auto_secret(void)
{
    const char *home = kvf_config_home();
    char dir[4096], shown[4200];
    kvf_status_t st;
    int dfd;

    if (home == NULL || home[0] == '\0') {
        kvf_error("no secret_file set and no $HOME for the automatic secret: "
                  "set secret_file (KVF_SECRET_FILE)");
        return KVF_ERR_AUTH;
    }
    snprintf(dir, sizeof(dir), "%s/.kvferry", home);
    dfd = kvf_auth_secret_dir(dir);
    if (dfd < 0) {
        return KVF_ERR_AUTH;
    }
    snprintf(shown, sizeof(shown), "%s/secret", dir);
    st = kvf_auth_secret_create(dfd, dir);
    if (st == KVF_OK) {
        st = kvf_auth_read_file(dfd, "secret", shown);
    }
    close(dfd);
    return st;
}

kvf_status_t kvf_auth_prepare(const char *host, int *on_p)
{
    const char *file = kvf_config_str(&kvf_auth_config, "secret_file");
    kvf_status_t status = KVF_OK;

    pthread_mutex_lock(&kvf_auth_lock);
    if (kvf_auth_secret_len > 0) {
        goto out;
    }
    if (file != NULL && file[0] != '\0') {
        status = kvf_auth_read_file(AT_FDCWD, file, file);
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
        status = kvf_auth_auto_secret();
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

void kvf_auth_hmac(const void *in, size_t len,
                   unsigned char out[KVF_AUTH_MAC_LEN])
{
    unsigned int outlen = KVF_AUTH_MAC_LEN;

    HMAC(EVP_sha256(), kvf_auth_secret, (int)kvf_auth_secret_len, in, len, out,
         &outlen);
}

kvf_status_t kvf_auth_hkdf(const void *salt, size_t saltlen, const void *info,
                           size_t infolen, unsigned char *out, size_t outlen)
{
    EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
    EVP_KDF_CTX *kctx = kdf != NULL ? EVP_KDF_CTX_new(kdf) : NULL;
    OSSL_PARAM params[5];
    int ok;

    params[0] = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST,
                                                 (char *)"SHA256", 0);
    params[1] = OSSL_PARAM_construct_octet_string(
        OSSL_KDF_PARAM_KEY, kvf_auth_secret, kvf_auth_secret_len);
    params[2] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT,
                                                  (void *)salt, saltlen);
    params[3] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO,
                                                  (void *)info, infolen);
    params[4] = OSSL_PARAM_construct_end();
    ok = kctx != NULL && EVP_KDF_derive(kctx, out, outlen, params) == 1;
    EVP_KDF_CTX_free(kctx);
    EVP_KDF_free(kdf);
    return ok ? KVF_OK : KVF_ERR_INTERNAL;
}

/* HMAC-SHA256 under the record key (itself HMAC(secret, label)) over
 * the etcd key name, a zero byte and the value. */
static kvf_status_t kvf_auth_record_hmac(const char *key, const void *val,
                                         size_t len,
                                         unsigned char out[KVF_AUTH_MAC_LEN])
{
    static const char label[] = "kvferry-etcd-v1";
    unsigned char rk[KVF_AUTH_MAC_LEN];
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *h = mac != NULL ? EVP_MAC_CTX_new(mac) : NULL;
    OSSL_PARAM params[2];
    size_t outlen = 0;
    int ok;

    params[0] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST,
                                                 (char *)"SHA256", 0);
    params[1] = OSSL_PARAM_construct_end();
    kvf_auth_hmac(label, sizeof(label) - 1, rk);
    ok = h != NULL && EVP_MAC_init(h, rk, sizeof(rk), params) == 1 &&
         EVP_MAC_update(h, (const unsigned char *)key, strlen(key) + 1) == 1 &&
         EVP_MAC_update(h, val, len) == 1 &&
         EVP_MAC_final(h, out, &outlen, KVF_AUTH_MAC_LEN) == 1 &&
         outlen == KVF_AUTH_MAC_LEN;
    EVP_MAC_CTX_free(h);
    EVP_MAC_free(mac);
    OPENSSL_cleanse(rk, sizeof(rk));
    return ok ? KVF_OK : KVF_ERR_INTERNAL;
}

kvf_status_t kvf_auth_record_mac(const char *host, const char *key,
                                 const void *val, size_t len,
                                 unsigned char out[KVF_AUTH_MAC_LEN], int *on_p)
{
    kvf_status_t st;
    int on = 0;

    st = kvf_auth_prepare(host, &on);
    if (st != KVF_OK) {
        return st;
    }
    *on_p = on;
    return on ? kvf_auth_record_hmac(key, val, len, out) : KVF_OK;
}

kvf_status_t kvf_auth_record_check(const char *host, const char *key,
                                   const void *val, size_t len,
                                   const unsigned char mac[KVF_AUTH_MAC_LEN])
{
    unsigned char want[KVF_AUTH_MAC_LEN];
    kvf_status_t st;
    int on = 0;

    st = kvf_auth_record_mac(host, key, val, len, want, &on);
    if (st != KVF_OK || !on) {
        return st;
    }
    if (mac == NULL || CRYPTO_memcmp(want, mac, sizeof(want)) != 0) {
        kvf_error("etcd key %s: %s: refused (written by someone without the "
                  "cluster secret, or copied from another key)",
                  KVF_LOG_KEY(key),
                  mac == NULL ? "no MAC" : "the MAC does not match");
        return KVF_ERR_AUTH;
    }
    return KVF_OK;
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
