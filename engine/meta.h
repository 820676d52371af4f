/*
 * Metadata backends: where a peer's segment descriptor is found. The
 * embedded default `p2p` asks the target itself (HELLO on its tcp port);
 * a cluster backend (etcd) publishes descriptors under leases. One ops
 * table per backend.
 */
#ifndef KVF_ENGINE_META_H
#define KVF_ENGINE_META_H

#include <kvferry/status.h>

#include <stddef.h>

typedef struct kvf_meta kvf_meta_t;

typedef struct kvf_meta_ops {
    const char *name;
    kvf_status_t (*open)(const char *uri, kvf_meta_t **meta_p);
    void (*close)(kvf_meta_t *meta);
    /* Makes this segment's descriptor findable under its name. */
    kvf_status_t (*publish)(kvf_meta_t *meta, const char *name,
                            const void *desc, size_t len);
    kvf_status_t (*unpublish)(kvf_meta_t *meta, const char *name);
    /* Returns the descriptor (caller kvf_free()s it). */
    kvf_status_t (*resolve)(kvf_meta_t *meta, const char *name, int timeout_ms,
                            void **desc_p, size_t *len_p);
} kvf_meta_ops_t;

struct kvf_meta {
    const kvf_meta_ops_t *ops;
};

/* Opens the backend named by uri: "p2p" or "<backend>://...". */
kvf_status_t kvf_meta_open(const char *uri, kvf_meta_t **meta_p);

#endif
