/*
 * Metadata backend choice (by the `metadata` URI) and the publishing of
 * this engine's descriptor for backends that keep descriptors elsewhere
 * than at the target.
 */
#include "engine/engine_int.h"
#include "core/log.h"
#include "core/wire.h"

#include <string.h>

kvf_status_t kvf_meta_open(const char *uri, unsigned timeout_ms,
                           kvf_meta_t **meta_p)
{
    if (uri == NULL || uri[0] == '\0' || strcmp(uri, "p2p") == 0) {
        return kvf_meta_p2p_open(uri, timeout_ms, meta_p);
    }
    if (strncmp(uri, "etcd://", 7) == 0) {
        return kvf_meta_etcd_open(uri, timeout_ms, meta_p);
    }
    kvf_error("metadata backend '%s' is unknown (known: p2p, "
              "etcd://host:port[,host:port])",
              uri);
    return KVF_ERR_INVALID_PARAM;
}

kvf_status_t kvf_meta_sync(struct kvf_engine *e)
{
    kvf_status_t st;
    kvf_wr_t w;

    if (e->meta == NULL || e->meta->ops->publish == NULL || e->name[0] == 0) {
        return KVF_OK;
    }
    kvf_wr_init(&w);
    st = kvf_seg_desc_encode(e, &w);
    if (st == KVF_OK) {
        st = kvf_wr_status(&w);
    }
    if (st == KVF_OK) {
        st = e->meta->ops->publish(e->meta, e->name, w.buf, w.len);
    }
    kvf_wr_free(&w);
    if (st != KVF_OK) {
        kvf_warn("segment %s: publishing its descriptor: %s (retried)", e->name,
                 kvf_status_str(st));
    }
    return st;
}
