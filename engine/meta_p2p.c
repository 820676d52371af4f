/*
 * The embedded `p2p` metadata backend: nothing is published anywhere; a
 * peer's descriptor is fetched from the peer itself: the segment name is
 * the address of its first transport that serves descriptors
 * (fetch_descriptor: tcp, whose iface answers HELLO with it). No extra
 * process is needed.
 */
#include "engine/meta.h"
#include "core/alloc.h"
#include "core/log.h"
#include "transport/transport.h"

#include <string.h>

static void kvf_p2p_close(kvf_meta_t *meta)
{
    kvf_free(meta);
}

static kvf_status_t kvf_p2p_resolve(kvf_meta_t *meta, const char *name,
                                    int timeout_ms, void **desc_p,
                                    size_t *len_p)
{
    size_t i;

    (void)meta;
    for (i = 0; kvf_transports[i] != NULL; i++) {
        if (kvf_transports[i]->fetch_descriptor != NULL) {
            return kvf_transports[i]->fetch_descriptor(name, timeout_ms, desc_p,
                                                       len_p);
        }
    }
    kvf_error("no transport of this build serves segment descriptors");
    return KVF_ERR_UNSUPPORTED;
}

static const kvf_meta_ops_t kvf_p2p_ops = {
    .name = "p2p",
    .close = kvf_p2p_close,
    .publish = NULL, /* the target serves its descriptor itself */
    .resolve = kvf_p2p_resolve,
};

kvf_status_t kvf_meta_p2p_open(const char *uri, unsigned timeout_ms,
                               kvf_meta_t **meta_p)
{
    kvf_meta_t *meta;

    (void)uri;
    (void)timeout_ms;
    meta = kvf_calloc(1, sizeof(*meta));
    if (meta == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    meta->ops = &kvf_p2p_ops;
    *meta_p = meta;
    return KVF_OK;
}
