/*
 * A small etcd v3 client over etcd's JSON gateway (HTTP POST of JSON to
 * /v3/...; keys and values travel base64-encoded), built on libcurl and
 * jansson: no Go, no gRPC. It is what kvferry's cluster features stand
 * on: the engine's `etcd` metadata backend (segment descriptors under
 * leases) and the master's leader election.
 *
 * Every call has a deadline (the handle's timeout_ms, the whole call,
 * all endpoints together): an unreachable, stopped or silent etcd turns
 * into KVF_ERR_TIMEOUT / KVF_ERR_CONNECT / KVF_ERR_UNAVAILABLE within it,
 * never a hang. With several endpoints a call that fails on one
 * (connect, timeout, 5xx, garbage, not an etcd gateway) moves on to the
 * next, and the handle keeps the one that answered. Put and the
 * create-if-absent transaction may then run twice; both are safe to
 * repeat (the transaction reports the existing value, which the caller
 * compares with its own).
 *
 * A handle is safe to share between threads (one request at a time:
 * calls that must not wait behind others, such as lease keepalives,
 * use their own handle).
 */
#ifndef KVF_COORD_ETCD_H
#define KVF_COORD_ETCD_H
#if !defined(KVF_LAYER_COORD) && !defined(KVF_LAYER_ENGINE) && \
    !defined(KVF_LAYER_STORE) && !defined(KVF_TEST_INTERNALS)
#error "coord/etcd.h: the etcd client of coord/, for the engine and the store"
#endif

#include <kvferry/status.h>

#include "core/config.h"

#include <stddef.h>
#include <stdint.h>

#define KVF_ETCD_EP_MAX  8
#define KVF_ETCD_VAL_MAX (1u << 20) /* largest value read or written */

typedef struct kvf_etcd kvf_etcd_t;

/* The `etcd` config table: etcd_prefix, etcd_lease_ms. */
extern const kvf_config_table_t kvf_etcd_config;

/* One key-value pair of a range reply (key NUL-terminated; val has len
 * bytes and a NUL after them). */
typedef struct kvf_etcd_kv {
    char *key;
    unsigned char *val;
    size_t len;
    int64_t create_rev;
    int64_t mod_rev;
    int64_t lease;
} kvf_etcd_kv_t;

/* Parses "host:port[,host:port...]" (an "etcd://" or "http://" prefix
 * is accepted) and opens a handle; no request is sent. timeout_ms bounds
 * every call. KVF_ERR_INVALID_PARAM names the bad endpoint. */
kvf_status_t kvf_etcd_open(const char *endpoints, unsigned timeout_ms,
                           kvf_etcd_t **etcd_p);
void kvf_etcd_close(kvf_etcd_t *etcd);

/* The endpoint that answered last ("host:port"). */
const char *kvf_etcd_endpoint(const kvf_etcd_t *etcd);

/* HTTP requests this process has sent to etcd, all handles together
 * (tests prove the data path sends none). */
uint64_t kvf_etcd_requests(void);

/* Writes key = val (bound to lease unless 0); *rev_p (may be NULL) gets
 * the store's revision after the write. */
kvf_status_t kvf_etcd_put(kvf_etcd_t *etcd, const char *key, const void *val,
                          size_t len, int64_t lease, int64_t *rev_p);

/* Reads one key: *kv_p (owned: kvf_etcd_kvs_free(kv, 1)) or
 * KVF_ERR_NOT_FOUND. */
kvf_status_t kvf_etcd_get(kvf_etcd_t *etcd, const char *key,
                          kvf_etcd_kv_t **kv_p);

/* Reads every key that starts with prefix (at most limit, 0 = all);
 * *kvs_p is owned by the caller (kvf_etcd_kvs_free). */
kvf_status_t kvf_etcd_range_prefix(kvf_etcd_t *etcd, const char *prefix,
                                   unsigned limit, kvf_etcd_kv_t **kvs_p,
                                   size_t *n_p);
void kvf_etcd_kvs_free(kvf_etcd_kv_t *kvs, size_t n);

/* Deletes key; *deleted_p (may be NULL) gets how many keys went. */
kvf_status_t kvf_etcd_delete(kvf_etcd_t *etcd, const char *key,
                             int64_t *deleted_p);

/* Creates key = val bound to lease only if the key does not exist (one
 * transaction). *created_p: 1 created (*rev_p: its revision), 0 it
 * existed (*cur_p, may be NULL: the existing pair, owned by the caller;
 * *rev_p: its create revision). */
kvf_status_t kvf_etcd_create(kvf_etcd_t *etcd, const char *key, const void *val,
                             size_t len, int64_t lease, int *created_p,
                             int64_t *rev_p, kvf_etcd_kv_t **cur_p);

/* Deletes key only while its create revision is create_rev (a leader
 * resigning deletes its own key, never a successor's). */
kvf_status_t kvf_etcd_delete_if(kvf_etcd_t *etcd, const char *key,
                                int64_t create_rev, int *deleted_p);

/* Leases: grant one of ttl_s seconds; keep it alive once (*ttl_p: the
 * seconds it has left; KVF_ERR_NOT_FOUND when it has expired); revoke it
 * (its keys go at once). */
kvf_status_t kvf_etcd_lease_grant(kvf_etcd_t *etcd, unsigned ttl_s,
                                  int64_t *lease_p);
kvf_status_t kvf_etcd_lease_keepalive(kvf_etcd_t *etcd, int64_t lease,
                                      int64_t *ttl_p);
kvf_status_t kvf_etcd_lease_revoke(kvf_etcd_t *etcd, int64_t lease);

#endif
