/*
 * Private to coord/: the etcd handle and the one request function the
 * key-value and lease calls (etcd_kv.c) build on.
 */
#ifndef KVF_COORD_ETCD_INT_H
#define KVF_COORD_ETCD_INT_H
#if !defined(KVF_LAYER_COORD) && !defined(KVF_LAYER_ENGINE) && \
    !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "coord/etcd_int.h: the etcd client of coord/, for the engine and the store"
#endif

#include "coord/etcd.h"
#include "core/sock.h"

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>

#define KVF_ETCD_REPLY_MAX (8u << 20) /* a larger reply is refused */

struct kvf_etcd {
    pthread_mutex_t lock;
    CURL *curl;
    unsigned nep;
    unsigned cur; /* the endpoint tried first */
    unsigned timeout_ms;
    int tls;            /* https with a client certificate (etcd_tls_dir) */
    char user[128];     /* etcd user (etcd_tls_dir/user), "" for none */
    char password[256]; /* its password (etcd_tls_dir/password) */
    char token[512];    /* "Authorization: TOKEN" once authenticated */
    struct curl_slist *hdrs;
    char ep[KVF_ETCD_EP_MAX][KVF_HOST_MAX + 8];
    char errbuf[CURL_ERROR_SIZE];
    char *reply;
    size_t reply_len;
    size_t reply_cap;
    int reply_over;
};

/* POSTs req (borrowed) to /v3/<path> and returns the parsed reply object
 * in *rep_p (owned: json_decref). An etcd error reply becomes its status
 * (code 5 KVF_ERR_NOT_FOUND, ...), logged with etcd's message. */
kvf_status_t kvf_etcd_call(kvf_etcd_t *e, const char *path, json_t *req,
                           json_t **rep_p);

/* base64 of len bytes as a new json string (NULL: no memory). */
json_t *kvf_etcd_b64(const void *buf, size_t len);
/* Decodes a base64 json string into a new buffer with a NUL after its
 * *len_p bytes; KVF_ERR_PROTOCOL when it is not base64. */
kvf_status_t kvf_etcd_unb64(const json_t *s, unsigned char **buf_p,
                            size_t *len_p);
/* An int64 field that etcd writes as a string (absent = 0). */
int64_t kvf_etcd_i64(const json_t *obj, const char *name);

#endif
