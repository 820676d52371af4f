/*
 * The `etcd` metadata backend ("etcd://host:port[,host:port]"): a target
 * publishes its segment descriptor at <etcd_prefix>seg/<segment name>,
 * bound to a lease of etcd_lease_ms that a thread keeps alive (every
 * third of the lease); a dead target stops the keepalives and etcd drops
 * its descriptor when the lease runs out. When the lease is lost anyway
 * (etcd was away longer than the lease) the thread takes a new one and
 * publishes again. Each publish (engine create, a region change) is
 * synchronous, so an unreachable etcd fails the engine create and a
 * peer told of a new region finds it published; with etcd down a
 * registration waits at most the engine timeout, and the thread retries
 * the publish. A peer resolves a name with one range request; the data
 * path never talks to etcd.
 *
 * The value is an envelope around the descriptor: "KVFS", u32 version,
 * a 32-byte MAC under the cluster secret over the key and the
 * descriptor (core/auth kvf_auth_record_mac; zero when authentication
 * is off), the descriptor. Anything else under the prefix (a key written
 * by another program or by someone without the secret, an older
 * envelope without a MAC, a truncated value, a descriptor moved from
 * another key) is refused with an error naming the key: a forged
 * descriptor could send peers to another address.
 */
#include "engine/engine_int.h"
#include "coord/etcd.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/log.h"
#include "core/sock.h"
#include "core/time.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define KVF_META_MAGIC   0x5346564bu /* "KVFS" little-endian */
#define KVF_META_VERSION 2
#define KVF_META_HDR     (8 + KVF_AUTH_MAC_LEN)

typedef struct kvf_meta_etcd {
    kvf_meta_t base;
    kvf_etcd_t *etcd; /* resolve and publish */
    kvf_etcd_t *ka;   /* the keepalive thread's own */
    char prefix[128];
    char host[KVF_HOST_MAX]; /* etcd's: decides the records' secret */
    unsigned lease_ms;
    pthread_mutex_t lock; /* val, key, gen, dirty, stop */
    pthread_mutex_t io;   /* lease and the etcd calls that use it */
    pthread_cond_t cond;
    pthread_t thread;
    int started;
    int stop;
    int dirty;     /* the last publish has not reached etcd */
    uint64_t gen;  /* publishes so far */
    int64_t lease; /* 0: none yet */
    char key[KVF_SEG_NAME_MAX + 160];
    unsigned char *val; /* the envelope to publish */
    size_t len;
} kvf_meta_etcd_t;

static void kvf_meta_etcd_key(const kvf_meta_etcd_t *m, const char *name,
                              char *buf, size_t len)
{
    snprintf(buf, len, "%sseg/%s", m->prefix, name);
}

/* Puts val under a live lease (m->lease, the thread's after the first
 * publish), taking a new lease when none is held. No lock held: the
 * etcd calls are bounded by the handle's timeout. */
static kvf_status_t kvf_meta_etcd_push(kvf_meta_etcd_t *m, kvf_etcd_t *etcd,
                                       const char *key,
                                       const unsigned char *val, size_t len)
{
    kvf_status_t st;

    if (m->lease == 0) {
        st = kvf_etcd_lease_grant(etcd, (m->lease_ms + 999) / 1000, &m->lease);
        if (st != KVF_OK) {
            return st;
        }
    }
    st = kvf_etcd_put(etcd, key, val, len, m->lease, NULL);
    if (st == KVF_ERR_NOT_FOUND) {
        m->lease = 0; /* the lease expired meanwhile */
    }
    return st;
}

/* One round of the thread, called with m->lock held and returning with
 * it held; the lock is dropped around the etcd calls so that a publish
 * (a region registration) never waits for etcd. */
static void kvf_meta_etcd_tick(kvf_meta_etcd_t *m)
{
    char key[sizeof(m->key)];
    unsigned char *val = NULL;
    kvf_status_t st = KVF_OK;
    uint64_t gen = m->gen;
    size_t len = m->len;
    int lost, pushed;

    if (m->dirty && m->val != NULL && (val = kvf_malloc(len ? len : 1))) {
        memcpy(val, m->val, len);
    }
    memcpy(key, m->key, sizeof(key));
    pthread_mutex_unlock(&m->lock);
    pthread_mutex_lock(&m->io);
    if (m->lease != 0 && val == NULL) {
        st = kvf_etcd_lease_keepalive(m->ka, m->lease, NULL);
        if (st == KVF_ERR_NOT_FOUND) {
            kvf_warn("segment descriptor %s: its etcd lease expired; "
                     "publishing it again",
                     key);
            m->lease = 0;
        }
    }
    pushed = (val != NULL);
    if (pushed) {
        st = kvf_meta_etcd_push(m, m->ka, key, val, len);
        kvf_free(val);
    }
    lost = (m->lease == 0);
    pthread_mutex_unlock(&m->io);
    if (st != KVF_OK) {
        kvf_log_rl(KVF_LOG_WARN, "segment descriptor %s: etcd: %s", key,
                   kvf_status_str(st));
    }
    pthread_mutex_lock(&m->lock);
    if (lost) {
        m->dirty = 1; /* publish again under a new lease */
    } else if (st == KVF_OK && pushed && m->gen == gen) {
        m->dirty = 0;
    }
}

static void *kvf_meta_etcd_main(void *arg)
{
    kvf_meta_etcd_t *m = arg;
    struct timespec ts;

    pthread_mutex_lock(&m->lock);
    while (!m->stop) {
        kvf_time_abs_after(&ts, m->dirty ? 100 : (int)(m->lease_ms / 3));
        pthread_cond_timedwait(&m->cond, &m->lock, &ts);
        if (!m->stop) {
            kvf_meta_etcd_tick(m);
        }
    }
    pthread_mutex_unlock(&m->lock);
    return NULL;
}

static kvf_status_t kvf_meta_etcd_publish(kvf_meta_t *meta, const char *name,
                                          const void *desc, size_t len)
{
    kvf_meta_etcd_t *m = (kvf_meta_etcd_t *)meta;
    unsigned char mac[KVF_AUTH_MAC_LEN] = {0};
    char key[sizeof(m->key)];
    unsigned char *val;
    kvf_status_t st;
    uint64_t gen;
    int on = 0;
    kvf_wr_t w;

    kvf_meta_etcd_key(m, name, key, sizeof(key));
    st = kvf_auth_record_mac(m->host, key, desc, len, mac, &on);
    if (st != KVF_OK) {
        return st;
    }
    kvf_wr_init(&w);
    kvf_wr_u32(&w, KVF_META_MAGIC);
    kvf_wr_u32(&w, KVF_META_VERSION);
    kvf_wr_bytes(&w, mac, sizeof(mac));
    kvf_wr_bytes(&w, desc, len);
    st = kvf_wr_status(&w);
    if (st != KVF_OK) {
        kvf_wr_free(&w);
        return st;
    }
    val = kvf_malloc(w.len); /* m's copy: the thread republishes it */
    if (val == NULL) {
        kvf_wr_free(&w);
        return KVF_ERR_NO_MEMORY;
    }
    memcpy(val, w.buf, w.len);
    pthread_mutex_lock(&m->lock);
    kvf_free(m->val);
    m->val = val;
    m->len = w.len;
    gen = ++m->gen;
    kvf_meta_etcd_key(m, name, m->key, sizeof(m->key));
    memcpy(key, m->key, sizeof(key));
    m->dirty = 1;
    pthread_mutex_unlock(&m->lock);
    /* synchronous, so a peer that learns of a region (a master checking a
     * node's pool) finds it published; bounded by the handle's timeout */
    pthread_mutex_lock(&m->io);
    st = kvf_meta_etcd_push(m, m->etcd, key, w.buf, w.len);
    pthread_mutex_unlock(&m->io);
    kvf_wr_free(&w);
    pthread_mutex_lock(&m->lock);
    /* a newer publish may have reached etcd first: then the thread puts
     * the newest again */
    m->dirty = !(st == KVF_OK && m->gen == gen);
    if (!m->started && st == KVF_OK &&
        pthread_create(&m->thread, NULL, kvf_meta_etcd_main, m) == 0) {
        m->started = 1;
    }
    pthread_cond_broadcast(&m->cond); /* a failure: the thread retries */
    pthread_mutex_unlock(&m->lock);
    return st;
}

/* Checks the envelope of value (len bytes) read at key; on success
 * *off_p is where the descriptor starts. */
static kvf_status_t kvf_meta_etcd_open_envelope(const kvf_meta_etcd_t *m,
                                                const char *key,
                                                const unsigned char *val,
                                                size_t len, size_t *off_p)
{
    const unsigned char *mac;
    uint32_t magic, version;
    kvf_rd_t r;

    kvf_rd_init(&r, val, len);
    magic = kvf_rd_u32(&r);
    version = kvf_rd_u32(&r);
    mac = kvf_rd_bytes(&r, KVF_AUTH_MAC_LEN);
    if (len >= 8 && magic == KVF_META_MAGIC && version != KVF_META_VERSION) {
        kvf_error("etcd key %s: descriptor envelope version %u, this "
                  "build reads %u (an older one carried no MAC: refused)",
                  key, version, KVF_META_VERSION);
        return KVF_ERR_VERSION;
    }
    if (kvf_rd_status(&r) != KVF_OK || magic != KVF_META_MAGIC) {
        kvf_error("etcd key %s (%zu bytes) was not written by kvferry: "
                  "a foreign key under kvferry's prefix, or a wrong "
                  "etcd_prefix",
                  key, len);
        return KVF_ERR_PROTOCOL;
    }
    if (kvf_auth_record_check(m->host, key, val + KVF_META_HDR,
                              len - KVF_META_HDR, mac) != KVF_OK) {
        return KVF_ERR_AUTH;
    }
    *off_p = KVF_META_HDR;
    return KVF_OK;
}

static kvf_status_t kvf_meta_etcd_resolve(kvf_meta_t *meta, const char *name,
                                          int timeout_ms, void **desc_p,
                                          size_t *len_p)
{
    kvf_meta_etcd_t *m = (kvf_meta_etcd_t *)meta;
    char key[sizeof(m->key)];
    kvf_etcd_kv_t *kv;
    kvf_status_t st;
    size_t off;
    void *desc;

    (void)timeout_ms; /* the handle's timeout is the engine's */
    kvf_meta_etcd_key(m, name, key, sizeof(key));
    st = kvf_etcd_get(m->etcd, key, &kv);
    if (st == KVF_ERR_NOT_FOUND) {
        kvf_error("segment '%s' is not published in etcd %s (key %s): no "
                  "such target, or it died and its lease ran out",
                  name, kvf_etcd_endpoint(m->etcd), key);
        return KVF_ERR_PEER_UNREACHABLE;
    }
    if (st != KVF_OK) {
        kvf_error("segment '%s': etcd lookup failed: %s", name,
                  kvf_status_str(st));
        return st;
    }
    st = kvf_meta_etcd_open_envelope(m, key, kv->val, kv->len, &off);
    desc = (st == KVF_OK) ? kvf_malloc(kv->len - off + 1) : NULL;
    if (st == KVF_OK && desc == NULL) {
        st = KVF_ERR_NO_MEMORY;
    }
    if (st == KVF_OK) {
        memcpy(desc, kv->val + off, kv->len - off);
        *desc_p = desc;
        *len_p = kv->len - off;
    }
    kvf_etcd_kvs_free(kv, 1);
    return st;
}

static void kvf_meta_etcd_close(kvf_meta_t *meta)
{
    kvf_meta_etcd_t *m = (kvf_meta_etcd_t *)meta;

    pthread_mutex_lock(&m->lock);
    m->stop = 1;
    pthread_cond_broadcast(&m->cond);
    pthread_mutex_unlock(&m->lock);
    if (m->started) {
        pthread_join(m->thread, NULL);
    }
    if (m->lease != 0) {
        /* the descriptor goes at once rather than after the lease */
        kvf_etcd_lease_revoke(m->etcd, m->lease);
    }
    kvf_etcd_close(m->ka);
    kvf_etcd_close(m->etcd);
    pthread_cond_destroy(&m->cond);
    pthread_mutex_destroy(&m->io);
    pthread_mutex_destroy(&m->lock);
    kvf_free(m->val);
    kvf_free(m);
}

static const kvf_meta_ops_t kvf_meta_etcd_ops = {
    .name = "etcd",
    .close = kvf_meta_etcd_close,
    .publish = kvf_meta_etcd_publish,
    .resolve = kvf_meta_etcd_resolve,
};

kvf_status_t kvf_meta_etcd_open(const char *uri, unsigned timeout_ms,
                                kvf_meta_t **meta_p)
{
    kvf_meta_etcd_t *m;
    kvf_status_t st;
    uint16_t port;
    uint64_t v;

    st = kvf_config_u64(&kvf_etcd_config, "etcd_lease_ms", &v);
    if (st != KVF_OK || v < 500 || v > 3600000) {
        kvf_error("etcd_lease_ms must be 500..3600000");
        return KVF_ERR_INVALID_PARAM;
    }
    m = kvf_calloc(1, sizeof(*m));
    if (m == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    m->base.ops = &kvf_meta_etcd_ops;
    m->lease_ms = (unsigned)v;
    snprintf(m->prefix, sizeof(m->prefix), "%s",
             kvf_config_str(&kvf_etcd_config, "etcd_prefix"));
    /* keepalives must land within the lease whatever the engine's
     * timeout: they get a third of it */
    st = kvf_etcd_open(uri, timeout_ms ? timeout_ms : 5000, &m->etcd);
    if (st == KVF_OK) {
        st = kvf_etcd_open(uri, m->lease_ms / 3, &m->ka);
    }
    if (st == KVF_OK && kvf_sock_parse_addr(kvf_etcd_endpoint(m->etcd), m->host,
                                            sizeof(m->host), &port) != KVF_OK) {
        snprintf(m->host, sizeof(m->host), "%s", kvf_etcd_endpoint(m->etcd));
    }
    if (st != KVF_OK) {
        kvf_etcd_close(m->etcd);
        kvf_free(m);
        return st;
    }
    pthread_mutex_init(&m->lock, NULL);
    pthread_mutex_init(&m->io, NULL);
    kvf_cond_init(&m->cond);
    *meta_p = &m->base;
    return KVF_OK;
}
