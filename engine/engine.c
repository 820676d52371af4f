/*
 * Engine lifetime: parameters resolved from the config table and the
 * caller's params, one iface per enabled transport (the tcp iface's
 * address names the segment), the metadata backend, and the hooks that
 * let transports check remote accesses against the registered regions.
 */
#include "engine/engine_int.h"
#include "core/alloc.h"
#include "core/config.h"
#include "core/log.h"

#include <stdio.h>
#include <string.h>

static const kvf_config_entry_t kvf_engine_config_entries[] = {
    {"listen", "127.0.0.1:0",
     "host:port the engine serves its segment on (another host's address "
     "for peers on other machines)",
     KVF_CONFIG_USER},
    {"conns", "4", "connections per peer", KVF_CONFIG_TUNING},
    {"timeout_ms", "5000",
     "longest wait for a peer before an error (raise on slow links)",
     KVF_CONFIG_USER},
    {"transports", "auto",
     "transports in preference order (tcp, shm, cuda, ucx), or auto (e.g. "
     "tcp to measure the network path on one host)",
     KVF_CONFIG_USER},
    {"metadata", "p2p",
     "where peers' segment descriptors are found: p2p (embedded: asked of "
     "the peer) or etcd://host:port[,host:port] (published under leases)",
     KVF_CONFIG_USER},
    {"chunk_bytes", "1M", "largest single wire request", KVF_CONFIG_TUNING},
};

KVF_CONFIG_TABLE(kvf_engine_config, "engine", kvf_engine_config_entries)

const char *kvf_version(void)
{
    return KVF_VERSION_STRING;
}

static kvf_status_t kvf_engine_access(void *arg, uint64_t addr, uint64_t len,
                                      kvf_tl_mem_t *mem_p)
{
    kvf_engine_h engine = arg;
    struct kvf_region *r = kvf_region_find(engine, addr, len);

    if (r == NULL) {
        return KVF_ERR_OUT_OF_BOUNDS;
    }
    mem_p->type = r->type;
    mem_p->device = r->device;
    mem_p->base = r->addr;
    mem_p->len = r->len;
    return KVF_OK;
}

static void kvf_engine_acquire(void *arg)
{
    pthread_rwlock_rdlock(&((kvf_engine_h)arg)->regions_lock);
}

static void kvf_engine_release(void *arg)
{
    pthread_rwlock_unlock(&((kvf_engine_h)arg)->regions_lock);
}

static int kvf_engine_writer_waiting(void *arg)
{
    return __atomic_load_n(&((kvf_engine_h)arg)->regions_writers,
                           __ATOMIC_RELAXED) > 0;
}

static kvf_status_t kvf_engine_describe(void *arg, kvf_wr_t *out)
{
    return kvf_seg_desc_encode(arg, out);
}

static kvf_status_t kvf_engine_resolve_params(kvf_engine_h e,
                                              const kvf_engine_params_t *p)
{
    uint64_t m = p ? p->field_mask : 0, v;
    kvf_status_t status;

    snprintf(e->listen, sizeof(e->listen), "%s",
             (m & KVF_ENGINE_PARAM_LISTEN) && p->listen
                 ? p->listen
                 : kvf_config_str(&kvf_engine_config, "listen"));
    snprintf(e->transports, sizeof(e->transports), "%s",
             (m & KVF_ENGINE_PARAM_TRANSPORTS) && p->transports
                 ? p->transports
                 : kvf_config_str(&kvf_engine_config, "transports"));
    snprintf(e->metadata, sizeof(e->metadata), "%s",
             (m & KVF_ENGINE_PARAM_METADATA) && p->metadata
                 ? p->metadata
                 : kvf_config_str(&kvf_engine_config, "metadata"));
    status = kvf_config_u64(&kvf_engine_config, "conns", &v);
    if (status != KVF_OK) {
        return status;
    }
    e->cfg.conns = (m & KVF_ENGINE_PARAM_CONNS) ? p->conns : (unsigned)v;
    status = kvf_config_u64(&kvf_engine_config, "timeout_ms", &v);
    if (status != KVF_OK) {
        return status;
    }
    e->cfg.timeout_ms =
        (m & KVF_ENGINE_PARAM_TIMEOUT) ? p->timeout_ms : (unsigned)v;
    status = kvf_config_u64(&kvf_engine_config, "chunk_bytes", &v);
    if (status != KVF_OK) {
        return status;
    }
    e->cfg.chunk_bytes =
        (m & KVF_ENGINE_PARAM_CHUNK) ? p->chunk_bytes : (size_t)v;
    e->cfg.no_listen = (m & KVF_ENGINE_PARAM_NO_LISTEN) ? p->no_listen : 0;
    e->cfg.ucx_workers =
        (m & KVF_ENGINE_PARAM_UCX_WORKERS) ? p->ucx_workers : 0;
    e->cfg.listen = e->listen;
    if (e->cfg.conns == 0 || e->cfg.conns > 64 || e->cfg.timeout_ms == 0 ||
        e->cfg.chunk_bytes < 4096) {
        kvf_error("bad engine parameters: conns %u (1..64), timeout %u ms, "
                  "chunk %zu bytes (>= 4096)",
                  e->cfg.conns, e->cfg.timeout_ms, e->cfg.chunk_bytes);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

/* Is transport `name` enabled by the preference list? tcp is always
 * enabled under "auto"; others must be available. */
static int kvf_engine_tl_enabled(kvf_engine_h e, const char *name)
{
    char list[128], *tok, *save;

    if (strcmp(e->transports, "auto") == 0) {
        return 1;
    }
    snprintf(list, sizeof(list), "%s", e->transports);
    for (tok = strtok_r(list, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        if (strcmp(tok, name) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Every name of a transports list must be a transport of this build: a
 * typo would otherwise leave the engine with tcp alone, silently. */
static kvf_status_t kvf_engine_check_transports(kvf_engine_h e)
{
    char list[128], names[128], *tok, *save;
    size_t i, n = 0;

    if (strcmp(e->transports, "auto") == 0) {
        return KVF_OK;
    }
    snprintf(list, sizeof(list), "%s", e->transports);
    for (tok = strtok_r(list, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        if (kvf_transport_find(tok) != NULL) {
            continue;
        }
        names[0] = '\0';
        for (i = 0; kvf_transports[i] != NULL && n < sizeof(names); i++) {
            n += (size_t)snprintf(names + n, sizeof(names) - n, "%s%s",
                                  i ? ", " : "", kvf_transports[i]->name);
        }
        kvf_error("transports: unknown transport '%s' (this build has %s; "
                  "or auto)",
                  tok, names);
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

static kvf_status_t kvf_engine_open_transports(kvf_engine_h e)
{
    kvf_tl_target_t target = {
        .arg = e,
        .access = kvf_engine_access,
        .acquire = kvf_engine_acquire,
        .release = kvf_engine_release,
        .writer_waiting = kvf_engine_writer_waiting,
        .describe = kvf_engine_describe,
    };
    const kvf_transport_ops_t *ops;
    kvf_status_t status;
    size_t i;

    for (i = 0; kvf_transports[i] != NULL && e->ntl < KVF_ENGINE_TL_MAX; i++) {
        ops = kvf_transports[i];
        /* tcp always opens: it carries the p2p handshake */
        if (strcmp(ops->name, "tcp") != 0 &&
            (!kvf_engine_tl_enabled(e, ops->name) || !ops->available())) {
            continue;
        }
        if (strcmp(e->transports, "auto") == 0 && ops->auto_select != NULL &&
            !ops->auto_select()) {
            continue;
        }
        status = ops->iface_open(&e->cfg, &target, &e->tl[e->ntl].iface);
        if (status != KVF_OK) {
            if (strcmp(ops->name, "tcp") == 0) {
                return status;
            }
            kvf_warn("transport %s unavailable: %s", ops->name,
                     kvf_status_str(status));
            continue;
        }
        e->tl[e->ntl].ops = ops;
        e->ntl++;
    }
    return KVF_OK;
}

kvf_status_t kvf_engine_create(const kvf_engine_params_t *params,
                               kvf_engine_h *engine_p)
{
    kvf_engine_h e;
    kvf_status_t status;
    const char *addr;
    unsigned i;

    kvf_log_init();
    if (engine_p == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    e = kvf_calloc(1, sizeof(*e));
    if (e == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    pthread_rwlock_init(&e->regions_lock, NULL);
    pthread_mutex_init(&e->peers_lock, NULL);
    status = kvf_engine_resolve_params(e, params);
    if (status != KVF_OK) {
        goto err_free;
    }
    status = kvf_meta_open(e->metadata, e->cfg.timeout_ms, &e->meta);
    if (status != KVF_OK) {
        goto err_free;
    }
    status = kvf_engine_check_transports(e);
    if (status != KVF_OK) {
        goto err_transports;
    }
    status = kvf_engine_open_transports(e);
    if (status != KVF_OK) {
        goto err_transports;
    }
    /* the segment is named by the tcp iface (p2p metadata reaches it);
     * tcp always opens, whichever transport comes first */
    for (i = 0; i + 1 < e->ntl && strcmp(e->tl[i].ops->name, "tcp") != 0; i++) {
    }
    addr = e->tl[i].ops->iface_address(e->tl[i].iface);
    snprintf(e->name, sizeof(e->name), "%s", addr ? addr : "");
    status = kvf_meta_sync(e);
    if (status != KVF_OK) {
        goto err_transports;
    }
    kvf_info("engine segment '%s', %u transport(s), %u conns, timeout %u ms",
             e->name, e->ntl, e->cfg.conns, e->cfg.timeout_ms);
    *engine_p = e;
    return KVF_OK;

err_transports:
    while (e->ntl > 0) {
        e->ntl--;
        e->tl[e->ntl].ops->iface_close(e->tl[e->ntl].iface);
    }
    e->meta->ops->close(e->meta);
err_free:
    pthread_mutex_destroy(&e->peers_lock);
    pthread_rwlock_destroy(&e->regions_lock);
    kvf_free(e);
    return status;
}

void kvf_engine_destroy(kvf_engine_h e)
{
    size_t i;

    if (e == NULL) {
        return;
    }
    while (e->peers != NULL) {
        kvf_warn("closing peer %s left open at engine destroy", e->peers->name);
        kvf_peer_close(e->peers);
    }
    while (e->ntl > 0) {
        e->ntl--;
        e->tl[e->ntl].ops->iface_close(e->tl[e->ntl].iface);
    }
    e->meta->ops->close(e->meta);
    if (e->nregions > 0) {
        kvf_warn("%zu region(s) still registered at engine destroy",
                 e->nregions);
    }
    for (i = 0; i < e->nregions; i++) {
        kvf_mem_region_del(e->regions[i]->addr, e->regions[i]->len,
                           e->regions[i]->type);
        kvf_free(e->regions[i]);
    }
    kvf_free(e->regions);
    pthread_mutex_destroy(&e->peers_lock);
    pthread_rwlock_destroy(&e->regions_lock);
    kvf_free(e);
}

const char *kvf_engine_segment_name(kvf_engine_h engine)
{
    return engine->name;
}

const char *kvf_engine_transports(kvf_engine_h engine)
{
    return engine->transports;
}
