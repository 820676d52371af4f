/*
 * Metadata backends: where a peer's segment descriptor is found. The
 * embedded default `p2p` asks the target itself (HELLO on its tcp port);
 * `etcd` publishes each target's descriptor in etcd under a key bound to
 * a lease the target keeps alive, so a dead target's descriptor goes
 * with its lease. One ops table per backend.
 */
#ifndef KVF_ENGINE_META_H
#define KVF_ENGINE_META_H
#if !defined(KVF_LAYER_ENGINE) && !defined(KVF_TEST_INTERNALS)
#error "engine/meta.h is private to engine/: use <kvferry/engine.h>"
#endif

#include <kvferry/status.h>

#include "core/config.h"

#include <stddef.h>

typedef struct kvf_meta kvf_meta_t;
struct kvf_engine;

typedef struct kvf_meta_ops {
    const char *name;
    void (*close)(kvf_meta_t *meta);
    /* Makes this segment's descriptor findable under its name and keeps
     * it so (a copy is kept: a later publish replaces it). NULL: the
     * backend needs no publishing (p2p). */
    kvf_status_t (*publish)(kvf_meta_t *meta, const char *name,
                            const void *desc, size_t len);
    /* Returns the descriptor (caller kvf_free()s it). */
    kvf_status_t (*resolve)(kvf_meta_t *meta, const char *name, int timeout_ms,
                            void **desc_p, size_t *len_p);
} kvf_meta_ops_t;

struct kvf_meta {
    const kvf_meta_ops_t *ops;
};

/* The engine's config table (engine.c): `metadata` and the timeouts. */
extern const kvf_config_table_t kvf_engine_config;

/* Opens the backend named by uri: "p2p" or "etcd://host:port[,...]";
 * timeout_ms bounds each call to a coordinator. */
kvf_status_t kvf_meta_open(const char *uri, unsigned timeout_ms,
                           kvf_meta_t **meta_p);
kvf_status_t kvf_meta_p2p_open(const char *uri, unsigned timeout_ms,
                               kvf_meta_t **meta_p);
kvf_status_t kvf_meta_etcd_open(const char *uri, unsigned timeout_ms,
                                kvf_meta_t **meta_p);

/* Publishes the engine's current descriptor (after create and after each
 * region change) where its backend needs it. A failure is logged and the
 * backend retries it; engine create treats it as fatal (a coordinator
 * unreachable at start is a clear error, not a silent target). */
kvf_status_t kvf_meta_sync(struct kvf_engine *engine);

#endif
