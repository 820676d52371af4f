/*
 * etcd client, the calls: put, range (one key or a prefix), delete,
 * the create-if-absent and delete-if-mine transactions, and leases
 * (grant, keepalive, revoke). Each builds the gateway's JSON request,
 * makes one kvf_etcd_call and reads the reply with bounds on every
 * field (a missing or malformed field is KVF_ERR_PROTOCOL).
 */
#include "coord/etcd_int.h"
#include "core/alloc.h"
#include "core/log.h"

#include <string.h>

static kvf_status_t kvf_etcd_key_req(const char *key, json_t **req_p)
{
    json_t *req, *k;

    if (key == NULL || key[0] == '\0' || strlen(key) > 4096) {
        return KVF_ERR_INVALID_PARAM;
    }
    req = json_object();
    k = kvf_etcd_b64(key, strlen(key));
    if (req == NULL || k == NULL || json_object_set_new(req, "key", k) != 0) {
        json_decref(req);
        return KVF_ERR_NO_MEMORY;
    }
    *req_p = req;
    return KVF_OK;
}

/* Adds "name": base64(buf) to obj. */
static kvf_status_t kvf_etcd_set_b64(json_t *obj, const char *name,
                                     const void *buf, size_t len)
{
    json_t *v;

    if (len > KVF_ETCD_VAL_MAX) {
        kvf_error("etcd value of %zu bytes is over the limit of %u", len,
                  KVF_ETCD_VAL_MAX);
        return KVF_ERR_MSG_TOO_LARGE;
    }
    v = kvf_etcd_b64(buf, len);
    if (v == NULL || json_object_set_new(obj, name, v) != 0) {
        return KVF_ERR_NO_MEMORY;
    }
    return KVF_OK;
}

static kvf_status_t kvf_etcd_set_i64(json_t *obj, const char *name, int64_t v)
{
    char buf[24];

    snprintf(buf, sizeof(buf), "%lld", (long long)v);
    return json_object_set_new(obj, name, json_string(buf)) == 0
               ? KVF_OK
               : KVF_ERR_NO_MEMORY;
}

static kvf_status_t kvf_etcd_put_req(const char *key, const void *val,
                                     size_t len, int64_t lease, json_t **req_p)
{
    kvf_status_t st;
    json_t *req;

    st = kvf_etcd_key_req(key, &req);
    if (st != KVF_OK) {
        return st;
    }
    st = kvf_etcd_set_b64(req, "value", val, len);
    if (st == KVF_OK && lease != 0) {
        st = kvf_etcd_set_i64(req, "lease", lease);
    }
    if (st != KVF_OK) {
        json_decref(req);
        return st;
    }
    *req_p = req;
    return KVF_OK;
}

static int64_t kvf_etcd_rev(const json_t *rep)
{
    return kvf_etcd_i64(json_object_get(rep, "header"), "revision");
}

kvf_status_t kvf_etcd_put(kvf_etcd_t *e, const char *key, const void *val,
                          size_t len, int64_t lease, int64_t *rev_p)
{
    json_t *req, *rep;
    kvf_status_t st;

    st = kvf_etcd_put_req(key, val, len, lease, &req);
    if (st != KVF_OK) {
        return st;
    }
    st = kvf_etcd_call(e, "kv/put", req, &rep);
    json_decref(req);
    if (st != KVF_OK) {
        return st;
    }
    if (rev_p != NULL) {
        *rev_p = kvf_etcd_rev(rep);
    }
    json_decref(rep);
    return KVF_OK;
}

void kvf_etcd_kvs_free(kvf_etcd_kv_t *kvs, size_t n)
{
    size_t i;

    if (kvs == NULL) {
        return;
    }
    for (i = 0; i < n; i++) {
        kvf_free(kvs[i].key);
        kvf_free(kvs[i].val);
    }
    kvf_free(kvs);
}

static kvf_status_t kvf_etcd_kv_dec(const json_t *j, kvf_etcd_kv_t *kv)
{
    size_t klen;
    kvf_status_t st;

    if (!json_is_object(j)) {
        return KVF_ERR_PROTOCOL;
    }
    st = kvf_etcd_unb64(json_object_get(j, "key"), (unsigned char **)&kv->key,
                        &klen);
    if (st != KVF_OK) {
        return st;
    }
    if (json_object_get(j, "value") == NULL) {
        kv->val = kvf_calloc(1, 1);
        kv->len = 0;
        st = (kv->val == NULL) ? KVF_ERR_NO_MEMORY : KVF_OK;
    } else {
        st = kvf_etcd_unb64(json_object_get(j, "value"), &kv->val, &kv->len);
    }
    kv->create_rev = kvf_etcd_i64(j, "create_revision");
    kv->mod_rev = kvf_etcd_i64(j, "mod_revision");
    kv->lease = kvf_etcd_i64(j, "lease");
    return st;
}

/* The "kvs" array of a range reply, decoded. */
static kvf_status_t kvf_etcd_kvs_dec(const json_t *rep, kvf_etcd_kv_t **kvs_p,
                                     size_t *n_p)
{
    const json_t *arr = json_object_get(rep, "kvs");
    kvf_etcd_kv_t *kvs;
    kvf_status_t st;
    size_t i, n;

    n = json_is_array(arr) ? json_array_size(arr) : 0;
    if (arr != NULL && !json_is_array(arr)) {
        return KVF_ERR_PROTOCOL;
    }
    kvs = kvf_calloc(n ? n : 1, sizeof(*kvs));
    if (kvs == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    for (i = 0; i < n; i++) {
        st = kvf_etcd_kv_dec(json_array_get(arr, i), &kvs[i]);
        if (st != KVF_OK) {
            kvf_etcd_kvs_free(kvs, i + 1);
            return st;
        }
    }
    *kvs_p = kvs;
    *n_p = n;
    return KVF_OK;
}

static kvf_status_t kvf_etcd_range(kvf_etcd_t *e, json_t *req,
                                   kvf_etcd_kv_t **kvs_p, size_t *n_p)
{
    kvf_status_t st;
    json_t *rep;

    st = kvf_etcd_call(e, "kv/range", req, &rep);
    if (st != KVF_OK) {
        return st;
    }
    st = kvf_etcd_kvs_dec(rep, kvs_p, n_p);
    json_decref(rep);
    return st;
}

kvf_status_t kvf_etcd_get(kvf_etcd_t *e, const char *key, kvf_etcd_kv_t **kv_p)
{
    kvf_etcd_kv_t *kvs;
    kvf_status_t st;
    json_t *req;
    size_t n;

    st = kvf_etcd_key_req(key, &req);
    if (st != KVF_OK) {
        return st;
    }
    st = kvf_etcd_range(e, req, &kvs, &n);
    json_decref(req);
    if (st != KVF_OK) {
        return st;
    }
    if (n != 1 || strcmp(kvs[0].key, key) != 0) {
        kvf_etcd_kvs_free(kvs, n);
        return KVF_ERR_NOT_FOUND;
    }
    *kv_p = kvs;
    return KVF_OK;
}

kvf_status_t kvf_etcd_range_prefix(kvf_etcd_t *e, const char *prefix,
                                   unsigned limit, kvf_etcd_kv_t **kvs_p,
                                   size_t *n_p)
{
    size_t plen = prefix ? strlen(prefix) : 0;
    char end[4097];
    kvf_status_t st;
    json_t *req;

    if (plen == 0 || plen >= sizeof(end) ||
        (unsigned char)prefix[plen - 1] == 0xff) {
        return KVF_ERR_INVALID_PARAM;
    }
    memcpy(end, prefix, plen);
    end[plen - 1]++;
    st = kvf_etcd_key_req(prefix, &req);
    if (st == KVF_OK) {
        st = kvf_etcd_set_b64(req, "range_end", end, plen);
    }
    if (st == KVF_OK && limit > 0) {
        st = kvf_etcd_set_i64(req, "limit", limit);
    }
    if (st == KVF_OK) {
        st = kvf_etcd_range(e, req, kvs_p, n_p);
    }
    json_decref(req);
    return st;
}

kvf_status_t kvf_etcd_delete(kvf_etcd_t *e, const char *key, int64_t *deleted_p)
{
    json_t *req, *rep;
    kvf_status_t st;

    st = kvf_etcd_key_req(key, &req);
    if (st != KVF_OK) {
        return st;
    }
    st = kvf_etcd_call(e, "kv/deleterange", req, &rep);
    json_decref(req);
    if (st != KVF_OK) {
        return st;
    }
    if (deleted_p != NULL) {
        *deleted_p = kvf_etcd_i64(rep, "deleted");
    }
    json_decref(rep);
    return KVF_OK;
}

/* {"key": K, "target": target, "result": "EQUAL", field: v} */
static json_t *kvf_etcd_cmp(const char *key, const char *target,
                            const char *field, int64_t v)
{
    char buf[24];

    snprintf(buf, sizeof(buf), "%lld", (long long)v);
    return json_pack("{s:o, s:s, s:s, s:s}", "key",
                     kvf_etcd_b64(key, strlen(key)), "target", target, "result",
                     "EQUAL", field, buf);
}

/* A transaction: if cmp then success_op else a range of key. */
static kvf_status_t kvf_etcd_txn(kvf_etcd_t *e, const char *key, json_t *cmp,
                                 const char *op, json_t *op_body,
                                 json_t **rep_p)
{
    json_t *req, *rk;
    kvf_status_t st;

    st = kvf_etcd_key_req(key, &rk);
    if (st != KVF_OK || cmp == NULL || op_body == NULL) {
        json_decref(cmp);
        json_decref(op_body);
        json_decref(rk);
        return st != KVF_OK ? st : KVF_ERR_NO_MEMORY;
    }
    req = json_pack("{s:[o], s:[{s:o}], s:[{s:o}]}", "compare", cmp, "success",
                    op, op_body, "failure", "request_range", rk);
    if (req == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    st = kvf_etcd_call(e, "kv/txn", req, rep_p);
    json_decref(req);
    return st;
}

static int kvf_etcd_succeeded(const json_t *rep)
{
    return json_is_true(json_object_get(rep, "succeeded"));
}

/* The kvs of the failure branch's range (the key as it is). */
static kvf_status_t kvf_etcd_txn_cur(const json_t *rep, kvf_etcd_kv_t **kvs_p,
                                     size_t *n_p)
{
    const json_t *r = json_array_get(json_object_get(rep, "responses"), 0);

    r = json_object_get(r, "response_range");
    if (!json_is_object(r)) {
        return KVF_ERR_PROTOCOL;
    }
    return kvf_etcd_kvs_dec(r, kvs_p, n_p);
}

static kvf_status_t kvf_etcd_create_lost(const json_t *rep, int64_t *rev_p,
                                         kvf_etcd_kv_t **cur_p)
{
    kvf_etcd_kv_t *kvs;
    kvf_status_t st;
    size_t n;

    st = kvf_etcd_txn_cur(rep, &kvs, &n);
    if (st != KVF_OK) {
        return st;
    }
    if (rev_p != NULL) {
        *rev_p = n > 0 ? kvs[0].create_rev : 0;
    }
    if (cur_p != NULL && n > 0) {
        *cur_p = kvs; /* the first entry; the rest (none) freed with it */
        return KVF_OK;
    }
    if (cur_p != NULL) {
        *cur_p = NULL;
    }
    kvf_etcd_kvs_free(kvs, n);
    return KVF_OK;
}

kvf_status_t kvf_etcd_create(kvf_etcd_t *e, const char *key, const void *val,
                             size_t len, int64_t lease, int *created_p,
                             int64_t *rev_p, kvf_etcd_kv_t **cur_p)
{
    json_t *put, *rep;
    kvf_status_t st;

    st = kvf_etcd_put_req(key, val, len, lease, &put);
    if (st != KVF_OK) {
        return st;
    }
    st = kvf_etcd_txn(e, key, kvf_etcd_cmp(key, "CREATE", "create_revision", 0),
                      "request_put", put, &rep);
    if (st != KVF_OK) {
        return st;
    }
    *created_p = kvf_etcd_succeeded(rep);
    if (*created_p) {
        if (rev_p != NULL) {
            *rev_p = kvf_etcd_rev(rep);
        }
        if (cur_p != NULL) {
            *cur_p = NULL;
        }
    } else {
        st = kvf_etcd_create_lost(rep, rev_p, cur_p);
    }
    json_decref(rep);
    return st;
}

kvf_status_t kvf_etcd_delete_if(kvf_etcd_t *e, const char *key,
                                int64_t create_rev, int *deleted_p)
{
    json_t *del, *rep;
    kvf_status_t st;

    st = kvf_etcd_key_req(key, &del);
    if (st != KVF_OK) {
        return st;
    }
    st = kvf_etcd_txn(
        e, key, kvf_etcd_cmp(key, "CREATE", "create_revision", create_rev),
        "request_delete_range", del, &rep);
    if (st != KVF_OK) {
        return st;
    }
    *deleted_p = kvf_etcd_succeeded(rep);
    json_decref(rep);
    return KVF_OK;
}

kvf_status_t kvf_etcd_lease_grant(kvf_etcd_t *e, unsigned ttl_s,
                                  int64_t *lease_p)
{
    json_t *req, *rep;
    kvf_status_t st;

    req = json_pack("{s:I}", "TTL", (json_int_t)(ttl_s ? ttl_s : 1));
    if (req == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    st = kvf_etcd_call(e, "lease/grant", req, &rep);
    json_decref(req);
    if (st != KVF_OK) {
        return st;
    }
    *lease_p = kvf_etcd_i64(rep, "ID");
    json_decref(rep);
    if (*lease_p == 0) {
        kvf_error("etcd lease grant: the reply names no lease");
        return KVF_ERR_PROTOCOL;
    }
    return KVF_OK;
}

static json_t *kvf_etcd_id_req(int64_t lease)
{
    char buf[24];

    snprintf(buf, sizeof(buf), "%lld", (long long)lease);
    return json_pack("{s:s}", "ID", buf);
}

kvf_status_t kvf_etcd_lease_keepalive(kvf_etcd_t *e, int64_t lease,
                                      int64_t *ttl_p)
{
    json_t *req, *rep;
    kvf_status_t st;
    int64_t ttl;

    req = kvf_etcd_id_req(lease);
    if (req == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    st = kvf_etcd_call(e, "lease/keepalive", req, &rep);
    json_decref(req);
    if (st != KVF_OK) {
        return st;
    }
    /* a stream reply: {"result": {..., "TTL": "n"}}; no TTL = expired */
    ttl = kvf_etcd_i64(json_object_get(rep, "result"), "TTL");
    json_decref(rep);
    if (ttl <= 0) {
        return KVF_ERR_NOT_FOUND;
    }
    if (ttl_p != NULL) {
        *ttl_p = ttl;
    }
    return KVF_OK;
}

kvf_status_t kvf_etcd_lease_revoke(kvf_etcd_t *e, int64_t lease)
{
    json_t *req, *rep;
    kvf_status_t st;

    req = kvf_etcd_id_req(lease);
    if (req == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    st = kvf_etcd_call(e, "lease/revoke", req, &rep);
    json_decref(req);
    if (st == KVF_OK) {
        json_decref(rep);
    }
    return st;
}
