/*
 * Store master, the process: options, start/stop, the reaper thread that
 * runs the periodic tick, and the hooks through which the object rules
 * (objects.c) and the inventories (inventory.c) reach the disk tiers
 * (tier.c) without calling up. Connections are served by the event
 * loops (loop.c), requests by the dispatch table (dispatch.c).
 */
#include "store/master/master.h"
#include "store/master/master_int.h"
#include "store/proto/msg.h"
#include "core/auth.h"
#include "core/alloc.h"
#include "core/checksum.h"
#include "core/log.h"
#include "core/time.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The limits of docs/security.md, from the `store` config table. */
static kvf_status_t kvf_master_limits_default(kvf_master_opts_t *o)
{
    static const char *const pct_keys[] = {"client_max_reserved_pct",
                                           "max_put_share_pct",
                                           "client_max_leased_pct"};
    static const char *const cnt_keys[] = {"client_max_pending",
                                           "pending_max", "client_max_leases"};
    const kvf_config_table_t *t = &kvf_store_config;
    uint64_t v[7], c[3];
    kvf_status_t st;
    unsigned i;

    for (i = 0; i < 3; i++) {
        if ((st = kvf_config_u64(t, pct_keys[i], &v[i])) != KVF_OK ||
            (st = kvf_config_u64(t, cnt_keys[i], &c[i])) != KVF_OK) {
            return st;
        }
        if (v[i] == 0 || v[i] > 100) {
            kvf_error("store %s=%lu: 1 to 100", pct_keys[i],
                      (unsigned long)v[i]);
            return KVF_ERR_INVALID_PARAM;
        }
    }
    if ((st = kvf_config_u64(t, "master_idle_ms", &o->idle_timeout_ms)) !=
            KVF_OK ||
        (st = kvf_config_u64(t, "conn_max_per_peer", &v[3])) != KVF_OK ||
        (st = kvf_config_u64(t, "conn_max_tcp", &v[4])) != KVF_OK ||
        (st = kvf_config_u64(t, "conn_max_unix", &v[5])) != KVF_OK ||
        (st = kvf_config_u64(t, "reg_workers", &v[6])) != KVF_OK) {
        return st;
    }
    for (i = 3; i < 7; i++) {
        if (v[i] == 0 || v[i] > 1000000) {
            kvf_error("store connection limits and reg_workers: 1 to 1000000");
            return KVF_ERR_INVALID_PARAM;
        }
    }
    o->client_max_pending = c[0];
    o->pending_max = c[1];
    o->client_max_leases = c[2];
    o->client_max_reserved_pct = (unsigned)v[0];
    o->max_put_share_pct = (unsigned)v[1];
    o->client_max_leased_pct = (unsigned)v[2];
    o->conn_max_per_peer = (unsigned)v[3];
    o->conn_max_tcp = (unsigned)v[4];
    o->conn_max_unix = (unsigned)v[5];
    o->reg_workers = (unsigned)v[6];
    return KVF_OK;
}

kvf_status_t kvf_master_opts_default(kvf_master_opts_t *o)
{
    const kvf_config_table_t *t = &kvf_store_config;
    uint64_t hi, lo, rep, io, loops;
    kvf_status_t st;

    memset(o, 0, sizeof(*o));
    o->listen = kvf_config_str(t, "master");
    o->http = kvf_config_str(t, "master_http");
    if ((st = kvf_config_u64(t, "lease_ms", &o->lease_ms)) != KVF_OK ||
        (st = kvf_config_u64(t, "put_timeout_ms", &o->put_timeout_ms)) !=
            KVF_OK ||
        (st = kvf_config_u64(t, "node_ttl_ms", &o->node_ttl_ms)) != KVF_OK ||
        (st = kvf_config_u64(t, "heartbeat_ms", &o->heartbeat_ms)) != KVF_OK ||
        (st = kvf_config_u64(t, "high_watermark_pct", &hi)) != KVF_OK ||
        (st = kvf_config_u64(t, "low_watermark_pct", &lo)) != KVF_OK ||
        (st = kvf_config_u64(t, "replicas", &rep)) != KVF_OK ||
        (st = kvf_config_u64(t, "store_timeout_ms", &io)) != KVF_OK ||
        (st = kvf_config_u64(t, "master_loops", &loops)) != KVF_OK) {
        return st;
    }
    if (loops > KVF_MASTER_LOOPS_MAX) {
        kvf_error("store master_loops=%lu: at most %u", (unsigned long)loops,
                  KVF_MASTER_LOOPS_MAX);
        return KVF_ERR_INVALID_PARAM;
    }
    o->loops = (unsigned)loops;
    if ((st = kvf_config_u64(t, "tier_write_max", &o->tier_write_max)) !=
            KVF_OK ||
        (st = kvf_config_u64(t, "tier_promote", &loops)) != KVF_OK) {
        return st;
    }
    o->tier_promote = loops != 0;
    st = kvf_master_limits_default(o);
    if (st != KVF_OK) {
        return st;
    }
    o->high_watermark = (double)hi / 100.0;
    o->low_watermark = (double)lo / 100.0;
    o->replicas = (unsigned)rep;
    o->io_timeout_ms = (unsigned)io;
    return KVF_OK;
}

/* The hooks the lower files call up through (master_int.h). */
static const kvf_m_hooks_t kvf_m_hooks = {
    kvf_m_tier_commit, kvf_m_tier_demote, kvf_m_tier_forget,
    kvf_m_tier_uncopied, kvf_m_tier_usable, kvf_m_released,
    kvf_m_tier_answer};

kvf_status_t kvf_m_init(kvf_master_t *m)
{
    m->hooks = kvf_m_hooks;
    m->nbuckets = 1024;
    m->table = kvf_calloc(m->nbuckets, sizeof(*m->table));
    m->npbuckets = 1024;
    m->ptable = kvf_calloc(m->npbuckets, sizeof(*m->ptable));
    if (m->table == NULL || m->ptable == NULL) {
        kvf_free(m->table);
        kvf_free(m->ptable);
        m->table = NULL;
        m->ptable = NULL;
        return KVF_ERR_NO_MEMORY;
    }
    kvf_m_list_init(&m->lru);
    kvf_m_list_init(&m->pending);
    kvf_m_list_init(&m->doomed);
    kvf_m_list_init(&m->dlru);
    if (kvf_m_clients_init(m) != KVF_OK) {
        kvf_free(m->table);
        kvf_free(m->ptable);
        m->table = NULL;
        m->ptable = NULL;
        return KVF_ERR_NO_MEMORY;
    }
    return KVF_OK;
}

void kvf_m_fini(kvf_master_t *m)
{
    kvf_m_clear(m);
    kvf_free(m->table);
    m->table = NULL;
    kvf_free(m->ptable);
    m->ptable = NULL;
    kvf_m_clients_fini(m);
}

static void *kvf_m_reaper_main(void *arg)
{
    kvf_master_t *m = arg;
    struct timespec ts;
    int tick = 100;

    if (m->opts.put_timeout_ms / 4 < (uint64_t)tick) {
        tick = (int)(m->opts.put_timeout_ms / 4) + 1;
    }
    pthread_mutex_lock(&m->lock);
    while (!m->stop) {
        kvf_m_tick(m);
        kvf_time_abs_after(&ts, tick);
        pthread_cond_timedwait(&m->stop_cond, &m->lock, &ts);
    }
    pthread_mutex_unlock(&m->lock);
    return NULL;
}

/* The RPC listeners: tcp at `listen`, and the same framed protocol over
 * an abstract unix socket for clients on this host (no TCP stack on
 * either side); tcp alone if that fails. */
static kvf_status_t kvf_m_listen(kvf_master_t *m, const char *listen)
{
    char host[KVF_HOST_MAX];
    kvf_status_t st;
    uint16_t port;

    st = kvf_sock_parse_addr(listen, host, sizeof(host), &port);
    if (st == KVF_OK) {
        st = kvf_auth_check_bind(host);
    }
    if (st == KVF_OK) {
        st = kvf_sock_listen(host, port, 256, &m->lfd, &port);
    }
    if (st != KVF_OK) {
        kvf_error("master cannot listen on %s", listen);
        return st;
    }
    snprintf(m->address, sizeof(m->address), "%s:%u", host, port);
    if (kvf_sp_unix_name(host, port, 1, m->unix_name, sizeof(m->unix_name)) &&
        kvf_sp_unix_listen(m->unix_name, 256, &m->ufd) != KVF_OK) {
        m->unix_name[0] = '\0';
    }
    /* with etcd: stand for leader at the address just bound */
    st = kvf_m_leader_start(m);
    if (st != KVF_OK) {
        close(m->lfd);
        if (m->ufd >= 0) {
            close(m->ufd);
        }
    }
    return st;
}

/* A single master's epoch: random, the leader bit clear (leader.c sets
 * a leader's); put ids start from it so they differ across restarts. */
static void kvf_m_first_epoch(kvf_master_t *m)
{
    m->epoch = kvf_hash64(&m, sizeof(m), kvf_time_ns() ^ (uint64_t)getpid());
    m->epoch = (m->epoch | 1) & ~KVF_M_HA_EPOCH;
    m->next_put_id = (m->epoch & 0xffffffffull) << 32;
}

/* The connection caps, the inventory channels and the event loops. */
static kvf_status_t kvf_m_serving_start(kvf_master_t *m)
{
    kvf_status_t st = kvf_m_caps_init(m);

    if (st == KVF_OK) {
        st = kvf_m_inv_start(m);
    }
    if (st == KVF_OK) {
        st = kvf_m_loop_start(m);
    }
    if (st != KVF_OK) {
        kvf_m_inv_stop(m);
        kvf_m_caps_fini(m);
    }
    return st;
}

kvf_status_t kvf_master_start(const kvf_master_opts_t *opts,
                              kvf_master_t **master_p)
{
    kvf_engine_params_t ep = {0};
    kvf_master_t *m;
    kvf_status_t st;

    if (opts->high_watermark <= 0 || opts->high_watermark > 1 ||
        opts->low_watermark > opts->high_watermark ||
        opts->replicas > KVF_STORE_REPLICA_MAX || opts->node_ttl_ms == 0 ||
        opts->heartbeat_ms == 0 || opts->io_timeout_ms == 0 ||
        opts->loops > KVF_MASTER_LOOPS_MAX) {
        kvf_error("bad master options: watermarks %.2f/%.2f, replicas %u, "
                  "ttl %lu ms, heartbeat %lu ms, loops %u",
                  opts->low_watermark, opts->high_watermark, opts->replicas,
                  (unsigned long)opts->node_ttl_ms,
                  (unsigned long)opts->heartbeat_ms, opts->loops);
        return KVF_ERR_INVALID_PARAM;
    }
    m = kvf_calloc(1, sizeof(*m));
    if (m == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    m->opts = *opts;
    m->opts.http = NULL;
    m->opts.listen = NULL;
    m->lfd = m->hfd = m->ufd = -1;
    kvf_m_first_epoch(m);
    pthread_mutex_init(&m->lock, NULL);
    kvf_cond_init(&m->stop_cond);
    kvf_cond_init(&m->tier_cond);
    st = kvf_m_init(m);
    if (st != KVF_OK) {
        goto err_free;
    }
    ep.field_mask = KVF_ENGINE_PARAM_NO_LISTEN | KVF_ENGINE_PARAM_TIMEOUT |
                    KVF_ENGINE_PARAM_CONNS | KVF_ENGINE_PARAM_TRANSPORTS;
    ep.no_listen = 1;
    ep.conns = 1;
    ep.transports = "tcp";
    ep.timeout_ms = opts->io_timeout_ms;
    st = kvf_engine_create(&ep, &m->engine);
    if (st != KVF_OK) {
        goto err_meta;
    }
    st = kvf_m_listen(m, opts->listen);
    if (st != KVF_OK) {
        goto err_engine;
    }
    if (opts->http != NULL && opts->http[0] != '\0' &&
        strcmp(opts->http, "off") != 0) {
        st = kvf_m_http_start(m, opts->http);
        if (st != KVF_OK) {
            goto err_leader;
        }
    }
    if (pthread_create(&m->reaper_thread, NULL, kvf_m_reaper_main, m) != 0) {
        st = KVF_ERR_NO_RESOURCE;
        goto err_http;
    }
    st = kvf_m_serving_start(m);
    if (st != KVF_OK) {
        goto err_reaper;
    }
    kvf_info("store master on %s (unix %s%s, http %s), %u loop(s), epoch "
             "%016lx",
             m->address, m->ufd >= 0 ? "@" : "",
             m->ufd >= 0 ? m->unix_name : "off",
             m->have_http ? m->http_address : "off", m->nloops,
             (unsigned long)m->epoch);
    *master_p = m;
    return KVF_OK;

err_reaper:
    pthread_mutex_lock(&m->lock);
    m->stop = 1;
    pthread_cond_broadcast(&m->stop_cond);
    pthread_mutex_unlock(&m->lock);
    pthread_join(m->reaper_thread, NULL);
err_http:
    kvf_m_http_stop(m);
err_leader:
    kvf_m_leader_stop(m);
    close(m->lfd);
    if (m->ufd >= 0) {
        close(m->ufd);
    }
err_engine:
    kvf_engine_destroy(m->engine);
err_meta:
    kvf_m_fini(m);
err_free:
    pthread_cond_destroy(&m->tier_cond);
    pthread_cond_destroy(&m->stop_cond);
    pthread_mutex_destroy(&m->lock);
    kvf_free(m);
    return st;
}

void kvf_master_stop(kvf_master_t *m)
{
    if (m == NULL) {
        return;
    }
    kvf_m_leader_stop(m); /* resign first: a standby takes over */
    pthread_mutex_lock(&m->lock);
    __atomic_store_n(&m->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&m->stop_cond);
    pthread_mutex_unlock(&m->lock);
    pthread_join(m->reaper_thread, NULL);
    kvf_m_loop_stop(m);
    kvf_m_inv_stop(m); /* after the workers: they wait on it */
    kvf_m_caps_fini(m);
    kvf_m_http_stop(m);
    close(m->lfd);
    if (m->ufd >= 0) {
        close(m->ufd);
    }
    kvf_engine_destroy(m->engine);
    pthread_mutex_lock(&m->lock);
    kvf_m_fini(m);
    pthread_mutex_unlock(&m->lock);
    pthread_cond_destroy(&m->tier_cond);
    pthread_cond_destroy(&m->stop_cond);
    pthread_mutex_destroy(&m->lock);
    kvf_free(m);
}

const char *kvf_master_address(const kvf_master_t *m)
{
    return m->address;
}

const char *kvf_master_http_address(const kvf_master_t *m)
{
    return m->have_http ? m->http_address : "";
}
