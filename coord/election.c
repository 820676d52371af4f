/*
 * Leader election over etcd (election.h): one thread per candidate.
 * The value a candidate writes carries a MAC under the cluster secret
 * (core/auth kvf_auth_record_mac: "VALUE mac=HEX"), and a lookup refuses
 * a value without a valid one, so someone who can write to etcd but
 * holds no secret cannot point clients elsewhere.
 * Standby: look at the key; when it is gone, take a lease and race for
 * it with a create-if-absent transaction. Leader: keep the lease alive
 * every eighth of it and check the key is still its own; the proof of
 * leadership (valid_until) moves to half a lease after each acknowledged
 * keepalive's send time. Readers compare it with the clock themselves,
 * so a leader whose thread is stuck or whose etcd is gone stops being
 * leader on time without the thread's help.
 */
#include "coord/election.h"
#include "coord/etcd.h"
#include "core/alloc.h"
#include "core/auth.h"
#include "core/log.h"
#include "core/sock.h"
#include "core/time.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define KVF_ELECT_MAC_SEP   " mac="
#define KVF_ELECT_VALUE_MAX 512

struct kvf_elect {
    char key[512];
    char value[640]; /* the value and its MAC */
    unsigned lease_ms;
    unsigned poll_ms;
    int one_term;
    kvf_etcd_t *etcd;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stop;
    int64_t lease;           /* the thread's */
    uint64_t valid_until_ms; /* atomic: leader until then; 0 = standby */
    uint64_t epoch;          /* atomic */
    unsigned terms;
    unsigned stepdowns;
};

int kvf_elect_is_leader(kvf_elect_t *el, uint64_t *epoch_p)
{
    uint64_t until = __atomic_load_n(&el->valid_until_ms, __ATOMIC_ACQUIRE);

    if (until == 0 || kvf_time_ms() >= until) {
        return 0;
    }
    if (epoch_p != NULL) {
        *epoch_p = __atomic_load_n(&el->epoch, __ATOMIC_ACQUIRE);
    }
    return 1;
}

unsigned kvf_elect_terms(kvf_elect_t *el)
{
    return __atomic_load_n(&el->terms, __ATOMIC_RELAXED);
}

unsigned kvf_elect_stepdowns(kvf_elect_t *el)
{
    return __atomic_load_n(&el->stepdowns, __ATOMIC_RELAXED);
}

/* Sleeps ms unless stopped; returns stop. */
static int kvf_elect_wait(kvf_elect_t *el, unsigned ms)
{
    struct timespec ts;
    int stop;

    pthread_mutex_lock(&el->lock);
    if (!el->stop) {
        kvf_time_abs_after(&ts, (int)ms);
        pthread_cond_timedwait(&el->cond, &el->lock, &ts);
    }
    stop = el->stop;
    pthread_mutex_unlock(&el->lock);
    return stop;
}

/* Standby: one look at the key, and a race for it when it is free. */
static void kvf_elect_campaign(kvf_elect_t *el)
{
    kvf_etcd_kv_t *kv;
    uint64_t t0;
    int64_t rev = 0;
    int created = 0;
    kvf_status_t st;

    st = kvf_etcd_get(el->etcd, el->key, &kv);
    if (st == KVF_OK) {
        kvf_etcd_kvs_free(kv, 1);
        return; /* a leader exists */
    }
    if (st != KVF_ERR_NOT_FOUND) {
        return; /* etcd unreachable: logged by the client */
    }
    t0 = kvf_time_ms();
    st =
        kvf_etcd_lease_grant(el->etcd, (el->lease_ms + 999) / 1000, &el->lease);
    if (st != KVF_OK) {
        return;
    }
    st = kvf_etcd_create(el->etcd, el->key, el->value, strlen(el->value),
                         el->lease, &created, &rev, NULL);
    if (st != KVF_OK || !created) {
        kvf_etcd_lease_revoke(el->etcd, el->lease);
        el->lease = 0;
        return;
    }
    __atomic_store_n(&el->epoch, (uint64_t)rev, __ATOMIC_RELEASE);
    __atomic_store_n(&el->valid_until_ms, t0 + el->lease_ms / 2,
                     __ATOMIC_RELEASE);
    __atomic_add_fetch(&el->terms, 1, __ATOMIC_RELAXED);
    kvf_info("leader of %s: epoch %ld (lease %u ms)", el->key, (long)rev,
             el->lease_ms);
}

static void kvf_elect_step_down(kvf_elect_t *el, const char *why)
{
    __atomic_store_n(&el->valid_until_ms, 0, __ATOMIC_RELEASE);
    __atomic_add_fetch(&el->stepdowns, 1, __ATOMIC_RELAXED);
    kvf_warn("stepping down as leader of %s (epoch %lu): %s", el->key,
             (unsigned long)__atomic_load_n(&el->epoch, __ATOMIC_RELAXED), why);
    el->lease = 0;
}

/* Leader: one keepalive and a check that the key is still ours. */
static void kvf_elect_hold(kvf_elect_t *el)
{
    uint64_t t0 = kvf_time_ms(), epoch;
    kvf_etcd_kv_t *kv;
    kvf_status_t st;

    epoch = __atomic_load_n(&el->epoch, __ATOMIC_RELAXED);
    st = kvf_etcd_lease_keepalive(el->etcd, el->lease, NULL);
    if (st == KVF_OK) {
        st = kvf_etcd_get(el->etcd, el->key, &kv);
        if (st == KVF_OK && (uint64_t)kv->create_rev != epoch) {
            st = KVF_ERR_STALE;
        }
        if (st == KVF_OK) {
            kvf_etcd_kvs_free(kv, 1);
        }
    }
    if (st == KVF_OK) {
        __atomic_store_n(&el->valid_until_ms, t0 + el->lease_ms / 2,
                         __ATOMIC_RELEASE);
    } else if (st == KVF_ERR_NOT_FOUND || st == KVF_ERR_STALE) {
        kvf_elect_step_down(el, st == KVF_ERR_STALE
                                    ? "the key is no longer ours"
                                    : "the lease expired");
    } else if (!kvf_elect_is_leader(el, NULL)) {
        kvf_elect_step_down(el, "no keepalive acknowledged for half a lease");
    }
}

static void *kvf_elect_main(void *arg)
{
    kvf_elect_t *el = arg;
    int stop = 0;

    while (!stop) {
        if (el->lease == 0 && el->one_term && el->terms > 0) {
            /* its term is over: no more campaigns */
        } else if (el->lease == 0) {
            kvf_elect_campaign(el);
        } else {
            kvf_elect_hold(el);
        }
        stop =
            kvf_elect_wait(el, el->lease != 0 ? el->lease_ms / 8 : el->poll_ms);
    }
    return NULL;
}

/* The host of the first etcd endpoint: it decides the secret of the
 * records (core/auth kvf_auth_prepare), as for any address dialled. */
static void kvf_elect_etcd_host(const char *endpoints, char *host, size_t len)
{
    char first[KVF_HOST_MAX + 16];
    const char *p = endpoints;
    uint16_t port;
    size_t n;

    if (strncmp(p, "etcd://", 7) == 0 || strncmp(p, "http://", 7) == 0) {
        p += 7;
    }
    n = strcspn(p, ",");
    n = n < sizeof(first) - 1 ? n : sizeof(first) - 1;
    memcpy(first, p, n);
    first[n] = '\0';
    if (kvf_sock_parse_addr(first, host, len, &port) != KVF_OK) {
        snprintf(host, len, "%.*s", (int)(len - 1), first);
    }
}

/* out = value, and its MAC for key when authentication is on. */
static kvf_status_t kvf_elect_seal(const char *endpoints, const char *key,
                                   const char *value, char *out, size_t len)
{
    unsigned char mac[KVF_AUTH_MAC_LEN];
    char host[KVF_HOST_MAX];
    kvf_status_t st;
    size_t n, i;
    int on = 0;

    kvf_elect_etcd_host(endpoints, host, sizeof(host));
    st = kvf_auth_record_mac(host, key, value, strlen(value), mac, &on);
    if (st != KVF_OK) {
        return st;
    }
    n = (size_t)snprintf(out, len, "%s", value);
    if (on) {
        n += (size_t)snprintf(out + n, len - n, KVF_ELECT_MAC_SEP);
        for (i = 0; i < sizeof(mac) && n + 2 < len; i++) {
            n += (size_t)snprintf(out + n, len - n, "%02x", mac[i]);
        }
    }
    return KVF_OK;
}

/* Splits a value read at key into its value (NUL-terminated in place)
 * and checks its MAC. */
static kvf_status_t kvf_elect_open(const char *endpoints, const char *key,
                                   char *val)
{
    unsigned char mac[KVF_AUTH_MAC_LEN];
    char host[KVF_HOST_MAX], *sep = strstr(val, KVF_ELECT_MAC_SEP);
    const char *hex;
    unsigned b;
    size_t i;

    kvf_elect_etcd_host(endpoints, host, sizeof(host));
    if (sep != NULL) {
        *sep = '\0';
        hex = sep + strlen(KVF_ELECT_MAC_SEP);
        for (i = 0; i < sizeof(mac); i++) {
            if (sscanf(hex + 2 * i, "%2x", &b) != 1) {
                sep = NULL;
                break;
            }
            mac[i] = (unsigned char)b;
        }
        if (sep != NULL && strlen(hex) != 2 * sizeof(mac)) {
            sep = NULL;
        }
    }
    return kvf_auth_record_check(host, key, val, strlen(val),
                                 sep != NULL ? mac : NULL);
}

kvf_status_t kvf_elect_start(const kvf_elect_opts_t *o, kvf_elect_t **el_p)
{
    kvf_elect_t *el;
    kvf_status_t st;

    if (o == NULL || o->endpoints == NULL || o->key == NULL ||
        o->value == NULL || o->lease_ms < 1000 ||
        strlen(o->key) >= sizeof(el->key) ||
        strlen(o->value) >= KVF_ELECT_VALUE_MAX) {
        kvf_error("election: bad options (lease at least 1000 ms)");
        return KVF_ERR_INVALID_PARAM;
    }
    el = kvf_calloc(1, sizeof(*el));
    if (el == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    snprintf(el->key, sizeof(el->key), "%s", o->key);
    st = kvf_elect_seal(o->endpoints, o->key, o->value, el->value,
                        sizeof(el->value));
    if (st != KVF_OK) {
        kvf_free(el);
        return st;
    }
    el->lease_ms = o->lease_ms;
    el->poll_ms = o->poll_ms ? o->poll_ms : o->lease_ms / 5;
    el->one_term = o->one_term;
    /* a call may take a quarter of the lease: a leader still gets two
     * tries before its half lease runs out */
    st = kvf_etcd_open(o->endpoints, o->lease_ms / 4, &el->etcd);
    if (st != KVF_OK) {
        kvf_free(el);
        return st;
    }
    pthread_mutex_init(&el->lock, NULL);
    kvf_cond_init(&el->cond);
    if (pthread_create(&el->thread, NULL, kvf_elect_main, el) != 0) {
        kvf_etcd_close(el->etcd);
        pthread_cond_destroy(&el->cond);
        pthread_mutex_destroy(&el->lock);
        kvf_free(el);
        return KVF_ERR_NO_RESOURCE;
    }
    *el_p = el;
    return KVF_OK;
}

void kvf_elect_stop(kvf_elect_t *el)
{
    if (el == NULL) {
        return;
    }
    pthread_mutex_lock(&el->lock);
    el->stop = 1;
    pthread_cond_broadcast(&el->cond);
    pthread_mutex_unlock(&el->lock);
    pthread_join(el->thread, NULL);
    __atomic_store_n(&el->valid_until_ms, 0, __ATOMIC_RELEASE);
    if (el->lease != 0) {
        kvf_etcd_lease_revoke(el->etcd, el->lease); /* resign */
    }
    kvf_etcd_close(el->etcd);
    pthread_cond_destroy(&el->cond);
    pthread_mutex_destroy(&el->lock);
    kvf_free(el);
}

kvf_status_t kvf_elect_lookup(const char *endpoints, unsigned timeout_ms,
                              const char *key, char *value, size_t len,
                              uint64_t *epoch_p)
{
    char buf[KVF_ELECT_VALUE_MAX + 128];
    kvf_etcd_kv_t *kv;
    kvf_etcd_t *e;
    kvf_status_t st;

    st = kvf_etcd_open(endpoints, timeout_ms, &e);
    if (st != KVF_OK) {
        return st;
    }
    st = kvf_etcd_get(e, key, &kv);
    kvf_etcd_close(e);
    if (st != KVF_OK) {
        return st;
    }
    if (kv->len == 0 || kv->len >= sizeof(buf) ||
        memchr(kv->val, '\0', kv->len) != NULL) {
        kvf_etcd_kvs_free(kv, 1);
        kvf_error("etcd key %s does not hold a leader address", key);
        return KVF_ERR_PROTOCOL;
    }
    memcpy(buf, kv->val, kv->len);
    buf[kv->len] = '\0';
    *epoch_p = (uint64_t)kv->create_rev;
    kvf_etcd_kvs_free(kv, 1);
    st = kvf_elect_open(endpoints, key, buf);
    if (st == KVF_OK && strlen(buf) >= len) {
        kvf_error("etcd key %s: a leader address of %zu bytes", key,
                  strlen(buf));
        st = KVF_ERR_PROTOCOL;
    }
    if (st == KVF_OK) {
        memcpy(value, buf, strlen(buf) + 1);
    }
    return st;
}
