/*
 * etcd client, the transport half: endpoints, one libcurl easy handle
 * per kvf_etcd_t (its connection is kept alive, so a request on
 * loopback costs a fraction of a millisecond), the deadline of each
 * call spread over the endpoints, and the mapping of every failure
 * (connect, timeout, HTTP status, a reply that is not JSON, an etcd
 * error object) to a status with one clear log line. base64 and int64
 * helpers for etcd_kv.c.
 *
 * With etcd_tls_dir set, every request goes over https with a client
 * certificate (ca.crt verifies etcd, client.crt and client.key prove
 * this process): etcd with --client-cert-auth then refuses anyone
 * without a certificate of the cluster's CA. When the folder also holds
 * user and password (a 0600 file of this user), the client logs in to
 * etcd's authentication (POST auth/authenticate; the JSON gateway does
 * not take the certificate's name as the user) and sends the token with
 * every request, logging in again when etcd says it expired
 * (docs/ha.md shows the set-up).
 */
#include "coord/etcd_int.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/config.h"
#include "core/log.h"
#include "core/time.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const kvf_config_entry_t kvf_etcd_config_entries[] = {
    {"etcd_prefix", "/kvferry/",
     "etcd key prefix of this cluster (segment descriptors, the master "
     "leader); clusters sharing one etcd use distinct prefixes",
     KVF_CONFIG_TUNING},
    {"etcd_lease_ms", "2000",
     "etcd lease of a published segment descriptor: a dead target's "
     "descriptor goes this long after its last keepalive",
     KVF_CONFIG_TUNING},
    {"etcd_tls_dir", "",
     "folder with ca.crt, client.crt and client.key: talk to etcd over "
     "https with this client certificate (etcd's --client-cert-auth); "
     "with files user and password (0600) there too, log in to etcd's "
     "authentication as that user; empty: plain http",
     KVF_CONFIG_USER},
};

KVF_CONFIG_TABLE(kvf_etcd_config, "etcd", kvf_etcd_config_entries)

static pthread_once_t kvf_etcd_once = PTHREAD_ONCE_INIT;
static uint64_t kvf_etcd_nreq;

static void kvf_etcd_global_init(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

uint64_t kvf_etcd_requests(void)
{
    return __atomic_load_n(&kvf_etcd_nreq, __ATOMIC_RELAXED);
}

static kvf_status_t kvf_etcd_parse_eps(kvf_etcd_t *e, const char *spec)
{
    const char *p = spec, *end;
    char host[KVF_HOST_MAX];
    uint16_t port;
    size_t n;

    if (strncmp(p, "etcd://", 7) == 0) {
        p += 7;
    } else if (strncmp(p, "http://", 7) == 0) {
        p += 7;
    }
    while (*p != '\0') {
        end = strchr(p, ',');
        n = end ? (size_t)(end - p) : strlen(p);
        if (n == 0 || n >= sizeof(e->ep[0]) || e->nep == KVF_ETCD_EP_MAX) {
            kvf_error("etcd endpoints '%s': empty, too long or more than %d",
                      spec, KVF_ETCD_EP_MAX);
            return KVF_ERR_INVALID_PARAM;
        }
        memcpy(e->ep[e->nep], p, n);
        e->ep[e->nep][n] = '\0';
        if (kvf_sock_parse_addr(e->ep[e->nep], host, sizeof(host), &port) !=
                KVF_OK ||
            port == 0) {
            kvf_error("etcd endpoint '%s' is not host:port", e->ep[e->nep]);
            return KVF_ERR_INVALID_PARAM;
        }
        e->nep++;
        p += n + (end != NULL);
    }
    if (e->nep == 0) {
        kvf_error("etcd endpoints '%s': none given", spec);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

static size_t kvf_etcd_write_cb(char *data, size_t sz, size_t nm, void *arg)
{
    kvf_etcd_t *e = arg;
    size_t n = sz * nm, cap;
    char *p;

    if (e->reply_len + n + 1 > KVF_ETCD_REPLY_MAX) {
        e->reply_over = 1;
        return 0;
    }
    if (e->reply_len + n + 1 > e->reply_cap) {
        cap = e->reply_cap ? e->reply_cap : 4096;
        while (cap < e->reply_len + n + 1) {
            cap *= 2;
        }
        p = kvf_realloc(e->reply, cap);
        if (p == NULL) {
            return 0;
        }
        e->reply = p;
        e->reply_cap = cap;
    }
    memcpy(e->reply + e->reply_len, data, n);
    e->reply_len += n;
    e->reply[e->reply_len] = '\0';
    return n;
}

/* A line of a small file (user name), without its newline. */
static kvf_status_t kvf_etcd_read_line(const char *path, char *out, size_t len)
{
    FILE *f = fopen(path, "r");
    int ok = f != NULL && fgets(out, (int)len, f) != NULL;

    if (f != NULL) {
        fclose(f);
    }
    out[ok ? strcspn(out, "\r\n") : 0] = '\0';
    return ok && out[0] != '\0' ? KVF_OK : KVF_ERR_INVALID_PARAM;
}

/* The etcd user and password of dir (none when there is no password
 * file; the password file must be private to this user). */
static kvf_status_t kvf_etcd_creds(kvf_etcd_t *e, const char *dir)
{
    char path[PATH_MAX];
    size_t n = 0;

    snprintf(path, sizeof(path), "%s/password", dir);
    if (access(path, F_OK) != 0) {
        return KVF_OK;
    }
    if (kvf_auth_read_private(path, e->password, 1, sizeof(e->password) - 1,
                              &n) != KVF_OK) {
        return KVF_ERR_INVALID_PARAM;
    }
    e->password[n] = '\0';
    e->password[strcspn(e->password, "\r\n")] = '\0';
    snprintf(path, sizeof(path), "%s/user", dir);
    if (kvf_etcd_read_line(path, e->user, sizeof(e->user)) != KVF_OK) {
        kvf_error("etcd_tls_dir: %s names no etcd user", path);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

/* https with the client certificate of etcd_tls_dir, or plain http. */
static kvf_status_t kvf_etcd_tls(kvf_etcd_t *e)
{
    static const char *const names[3] = {"ca.crt", "client.crt", "client.key"};
    static const CURLoption opts[3] = {CURLOPT_CAINFO, CURLOPT_SSLCERT,
                                       CURLOPT_SSLKEY};
    const char *dir = kvf_config_str(&kvf_etcd_config, "etcd_tls_dir");
    char path[PATH_MAX];
    int i;

    e->tls = dir != NULL && dir[0] != '\0';
    curl_easy_setopt(e->curl, CURLOPT_PROTOCOLS_STR, e->tls ? "https" : "http");
    for (i = 0; e->tls && i < 3; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        if (access(path, R_OK) != 0) {
            kvf_error("etcd_tls_dir: cannot read %s: %m", path);
            return KVF_ERR_INVALID_PARAM;
        }
        curl_easy_setopt(e->curl, opts[i], path); /* libcurl copies it */
    }
    return e->tls ? kvf_etcd_creds(e, dir) : KVF_OK;
}

kvf_status_t kvf_etcd_open(const char *endpoints, unsigned timeout_ms,
                           kvf_etcd_t **etcd_p)
{
    kvf_status_t st;
    kvf_etcd_t *e;

    if (endpoints == NULL || etcd_p == NULL || timeout_ms == 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    pthread_once(&kvf_etcd_once, kvf_etcd_global_init);
    e = kvf_calloc(1, sizeof(*e));
    if (e == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    e->timeout_ms = timeout_ms;
    st = kvf_etcd_parse_eps(e, endpoints);
    if (st != KVF_OK) {
        kvf_free(e);
        return st;
    }
    e->curl = curl_easy_init();
    if (e->curl == NULL) {
        kvf_free(e);
        return KVF_ERR_NO_MEMORY;
    }
    curl_easy_setopt(e->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e->curl, CURLOPT_ERRORBUFFER, e->errbuf);
    curl_easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, kvf_etcd_write_cb);
    curl_easy_setopt(e->curl, CURLOPT_WRITEDATA, e);
    curl_easy_setopt(e->curl, CURLOPT_TCP_NODELAY, 1L);
    st = kvf_etcd_tls(e);
    if (st != KVF_OK) {
        curl_easy_cleanup(e->curl);
        kvf_free(e);
        return st;
    }
    pthread_mutex_init(&e->lock, NULL);
    *etcd_p = e;
    return KVF_OK;
}

void kvf_etcd_close(kvf_etcd_t *e)
{
    if (e == NULL) {
        return;
    }
    curl_easy_cleanup(e->curl);
    curl_slist_free_all(e->hdrs);
    pthread_mutex_destroy(&e->lock);
    kvf_free(e->reply);
    OPENSSL_cleanse(e->password, sizeof(e->password));
    OPENSSL_cleanse(e->token, sizeof(e->token));
    kvf_free(e);
}

const char *kvf_etcd_endpoint(const kvf_etcd_t *e)
{
    return e->ep[e->cur];
}

/* etcd's gRPC code in an error reply, as a status. */
static kvf_status_t kvf_etcd_grpc_status(int64_t code)
{
    switch (code) {
    case 3:  /* invalid argument */
    case 9:  /* failed precondition */
    case 11: /* out of range */
        return KVF_ERR_INVALID_PARAM;
    case 4: /* deadline exceeded */
        return KVF_ERR_TIMEOUT;
    case 5: /* not found: a lease */
        return KVF_ERR_NOT_FOUND;
    case 14: /* unavailable: no leader, stopping */
        return KVF_ERR_UNAVAILABLE;
    case 7:  /* permission denied */
    case 16: /* unauthenticated: no token, or it expired */
        return KVF_ERR_AUTH;
    default:
        return KVF_ERR_PROTOCOL;
    }
}

/* Reads one HTTP exchange's result. *retry_p: worth trying the next
 * endpoint (this one is down, slow, or no etcd). */
static kvf_status_t kvf_etcd_reply(kvf_etcd_t *e, const char *url, CURLcode cc,
                                   json_t **rep_p, int *retry_p)
{
    json_t *rep, *msg;
    json_error_t jerr;
    long http = 0;
    kvf_status_t st;

    *retry_p = 1;
    if (cc != CURLE_OK) {
        st = (cc == CURLE_OPERATION_TIMEDOUT) ? KVF_ERR_TIMEOUT
             : (cc == CURLE_COULDNT_CONNECT)  ? KVF_ERR_CONNECT
             : e->reply_over                  ? KVF_ERR_MSG_TOO_LARGE
                                              : KVF_ERR_IO;
        kvf_log_rl(KVF_LOG_WARN, "etcd %s: %s", url,
                   e->errbuf[0] ? e->errbuf : curl_easy_strerror(cc));
        return st;
    }
    curl_easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, &http);
    rep = json_loadb(e->reply ? e->reply : "", e->reply_len, 0, &jerr);
    if (rep == NULL || !json_is_object(rep)) {
        kvf_log_rl(KVF_LOG_WARN,
                   "etcd %s: HTTP %ld, the reply is not an etcd JSON object "
                   "(%zu bytes; is this an etcd v3 endpoint?)",
                   url, http, e->reply_len);
        json_decref(rep);
        return KVF_ERR_PROTOCOL;
    }
    if (http == 200 && json_object_get(rep, "code") == NULL) {
        *rep_p = rep;
        return KVF_OK;
    }
    st = kvf_etcd_grpc_status(kvf_etcd_i64(rep, "code"));
    msg = json_object_get(rep, "message");
    if (json_is_string(msg) &&
        (strstr(json_string_value(msg), "user name is empty") != NULL ||
         strstr(json_string_value(msg), "authentication failed") != NULL)) {
        st = KVF_ERR_AUTH; /* etcd's auth is on: etcd_tls_dir/user, password */
    }
    kvf_log_rl(st == KVF_ERR_AUTH ? KVF_LOG_WARN : KVF_LOG_DEBUG,
               "etcd %s: HTTP %ld: %s", url, http,
               json_is_string(msg) ? json_string_value(msg) : "(no message)");
    *retry_p = (st == KVF_ERR_UNAVAILABLE || st == KVF_ERR_TIMEOUT ||
                st == KVF_ERR_PROTOCOL);
    json_decref(rep);
    return st;
}

static kvf_status_t kvf_etcd_try(kvf_etcd_t *e, unsigned idx, const char *path,
                                 const char *body, uint64_t left_ms,
                                 json_t **rep_p, int *retry_p)
{
    char url[KVF_HOST_MAX + 64];
    CURLcode cc;

    snprintf(url, sizeof(url), "%s://%s/v3/%s", e->tls ? "https" : "http",
             e->ep[idx], path);
    e->reply_len = 0;
    e->reply_over = 0;
    e->errbuf[0] = '\0';
    curl_easy_setopt(e->curl, CURLOPT_URL, url);
    curl_easy_setopt(e->curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e->curl, CURLOPT_HTTPHEADER,
                     strcmp(path, "auth/authenticate") != 0 ? e->hdrs : NULL);
    curl_easy_setopt(e->curl, CURLOPT_TIMEOUT_MS, (long)left_ms);
    curl_easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT_MS, (long)left_ms);
    __atomic_add_fetch(&kvf_etcd_nreq, 1, __ATOMIC_RELAXED);
    cc = curl_easy_perform(e->curl);
    return kvf_etcd_reply(e, url, cc, rep_p, retry_p);
}

/* One request over the endpoints, each tried in turn within the
 * deadline; e->lock held. */
static kvf_status_t kvf_etcd_send(kvf_etcd_t *e, const char *path,
                                  const char *body, uint64_t deadline,
                                  json_t **rep_p)
{
    kvf_status_t st = KVF_ERR_TIMEOUT;
    int retry = 1;
    unsigned i, idx;
    uint64_t now;

    for (i = 0; i < e->nep && retry; i++) {
        now = kvf_time_ms();
        if (now >= deadline) {
            st = KVF_ERR_TIMEOUT;
            break;
        }
        idx = (e->cur + i) % e->nep;
        st = kvf_etcd_try(e, idx, path, body, deadline - now, rep_p, &retry);
        if (st == KVF_OK || !retry) {
            e->cur = idx;
            break;
        }
    }
    if (st != KVF_OK && retry) {
        e->cur = (e->cur + 1) % e->nep; /* start elsewhere next time */
        kvf_log_rl(KVF_LOG_ERROR,
                   "etcd %s: no endpoint answered within %u ms (%u tried, "
                   "last: %s)",
                   path, e->timeout_ms, e->nep, kvf_status_str(st));
    }
    return st;
}

/* Logs in to etcd's authentication (user and password of etcd_tls_dir)
 * and keeps the token for the requests' Authorization header; e->lock
 * held. */
static kvf_status_t kvf_etcd_login(kvf_etcd_t *e, uint64_t deadline)
{
    json_t *req =
        json_pack("{s:s, s:s}", "name", e->user, "password", e->password);
    char *body = req != NULL ? json_dumps(req, JSON_COMPACT) : NULL;
    json_t *rep = NULL, *tok;
    kvf_status_t st;

    json_decref(req);
    if (body == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    st = kvf_etcd_send(e, "auth/authenticate", body, deadline, &rep);
    OPENSSL_cleanse(body, strlen(body));
    free(body);
    tok = st == KVF_OK ? json_object_get(rep, "token") : NULL;
    if (st == KVF_OK && !json_is_string(tok)) {
        st = KVF_ERR_PROTOCOL;
    }
    if (st == KVF_OK) {
        snprintf(e->token, sizeof(e->token), "Authorization: %s",
                 json_string_value(tok));
        curl_slist_free_all(e->hdrs);
        e->hdrs = curl_slist_append(NULL, e->token);
        st = e->hdrs != NULL ? KVF_OK : KVF_ERR_NO_MEMORY;
    } else {
        kvf_log_rl(KVF_LOG_ERROR, "etcd: log-in as user '%s' failed: %s",
                   e->user, kvf_status_str(st));
    }
    json_decref(rep);
    return st;
}

kvf_status_t kvf_etcd_call(kvf_etcd_t *e, const char *path, json_t *req,
                           json_t **rep_p)
{
    uint64_t deadline = kvf_time_ms() + e->timeout_ms;
    kvf_status_t st = KVF_OK;
    char *body;

    body = json_dumps(req, JSON_COMPACT);
    if (body == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pthread_mutex_lock(&e->lock);
    if (e->user[0] != '\0' && e->token[0] == '\0') {
        st = kvf_etcd_login(e, deadline);
    }
    if (st == KVF_OK) {
        st = kvf_etcd_send(e, path, body, deadline, rep_p);
    }
    if (st == KVF_ERR_AUTH && e->user[0] != '\0') {
        e->token[0] = '\0'; /* expired: log in again, once */
        st = kvf_etcd_login(e, deadline);
        if (st == KVF_OK) {
            st = kvf_etcd_send(e, path, body, deadline, rep_p);
        }
    }
    pthread_mutex_unlock(&e->lock);
    free(body);
    return st;
}

json_t *kvf_etcd_b64(const void *buf, size_t len)
{
    size_t cap = 4 * ((len + 2) / 3) + 1;
    unsigned char *out;
    json_t *s;

    if (len > KVF_ETCD_VAL_MAX) {
        return NULL;
    }
    out = kvf_malloc(cap);
    if (out == NULL) {
        return NULL;
    }
    EVP_EncodeBlock(out, buf, (int)len);
    s = json_string((char *)out);
    kvf_free(out);
    return s;
}

kvf_status_t kvf_etcd_unb64(const json_t *s, unsigned char **buf_p,
                            size_t *len_p)
{
    const char *in = json_is_string(s) ? json_string_value(s) : "";
    size_t n = json_is_string(s) ? json_string_length(s) : 0;
    unsigned char *out;
    int got, pad = 0;

    if (n % 4 != 0 || n / 4 * 3 > KVF_ETCD_VAL_MAX) {
        kvf_error("etcd reply holds a value that is not base64 (%zu chars)", n);
        return KVF_ERR_PROTOCOL;
    }
    out = kvf_malloc(n / 4 * 3 + 1);
    if (out == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    got = (n > 0) ? EVP_DecodeBlock(out, (const unsigned char *)in, (int)n) : 0;
    if (got < 0) {
        kvf_free(out);
        kvf_error("etcd reply holds a value that is not base64");
        return KVF_ERR_PROTOCOL;
    }
    pad = (n > 0 && in[n - 1] == '=') + (n > 1 && in[n - 2] == '=');
    *len_p = (size_t)got - (size_t)pad;
    out[*len_p] = '\0';
    *buf_p = out;
    return KVF_OK;
}

int64_t kvf_etcd_i64(const json_t *obj, const char *name)
{
    const json_t *v = json_object_get(obj, name);

    if (json_is_integer(v)) {
        return (int64_t)json_integer_value(v);
    }
    if (json_is_string(v)) {
        return strtoll(json_string_value(v), NULL, 10);
    }
    return 0;
}
