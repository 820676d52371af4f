/*
 * Store client: the pools' mappings ahead of views (kvf_store_view_maps).
 * A caller that registers the mappings views lie in elsewhere (a GPU's
 * cudaHostRegister, about a second per few GiB) wants that done before
 * the first transfer, not during it. So:
 *
 *   nodes   one NODES round trip: every node's segment and pool
 *   map     per node, a READ view lease over its whole pool, closed at
 *           once: the shm transport maps the pool's window (the pages
 *           of the registered range, MAP within the lease) and keeps the
 *           mapping after the lease, for every later lease of that
 *           window; a node reached over tcp has none and is skipped
 *   tell    fn(arg, base, len) per mapping
 *
 * The mapping stays while the window stands: until the node deregisters
 * its pool or goes away (the ep's SYNC or drop unmaps it, telling the
 * process's unmap hook first) or the store disconnects.
 */
#include "store/client/client_int.h"
#include <kvferry/view.h>
#include "core/alloc.h"
#include "core/log.h"

#include <string.h>

/* The master's nodes: *ents_p (kvf_free) and their count. */
static kvf_status_t kvf_vmaps_nodes(kvf_store_h st, kvf_sm_node_ent_t **ents_p,
                                    size_t *n_p)
{
    kvf_sm_node_ent_t *ents = NULL;
    kvf_status_t status;
    kvf_sconn_t *c;
    kvf_wr_t w;
    kvf_rd_t r;
    uint32_t i, n;

    kvf_wr_init(&w);
    status = kvf__srpc(st, KVF_SP_NODES, 0, &w, &c);
    kvf_wr_free(&w);
    if (status != KVF_OK) {
        return status;
    }
    n = c->f.hdr.count;
    if (n > 0 && (ents = kvf_calloc(n, sizeof(*ents))) == NULL) {
        kvf__srelease(st, c);
        return KVF_ERR_NO_MEMORY;
    }
    kvf_rd_init(&r, c->f.body, c->f.hdr.meta_len);
    for (i = 0; i < n; i++) {
        kvf_sm_node_ent_dec(&r, &ents[i]);
    }
    status = kvf_sm_rep_end(&r, n, n);
    kvf__srelease(st, c);
    if (status != KVF_OK) {
        kvf_free(ents);
        return status;
    }
    *ents_p = ents;
    *n_p = n;
    return KVF_OK;
}

/* Maps node e's pool (a view lease over all of it, closed at once);
 * *v the mapping. KVF_ERR_UNSUPPORTED: not reached over shm. */
static kvf_status_t kvf_vmaps_node(kvf_store_h st, const kvf_sm_node_ent_t *e,
                                   kvf_view_t *v)
{
    kvf_view_lease_h tl = NULL;
    uint64_t until = 0;
    kvf_status_t status;
    kvf_speer_t *sp;

    if (e->pool_len == 0) {
        return KVF_ERR_UNSUPPORTED;
    }
    status = kvf__speer_ref(st, e->segment, &sp);
    if (status != KVF_OK) {
        return status;
    }
    status = kvf_peer_view_open(sp->peer, KVF_OP_READ, 1, &e->pool_addr,
                                &e->pool_len, v, &until, &tl);
    if (status == KVF_OK) {
        (void)kvf_peer_view_close(sp->peer, tl);
    }
    kvf__speer_unref(st, sp, kvf__speer_error(status));
    return (status == KVF_OK) ? v->status : status;
}

kvf_status_t kvf_store_view_maps(kvf_store_h st, kvf_store_unmap_fn fn,
                                 void *arg)
{
    kvf_sm_node_ent_t *ents = NULL;
    kvf_status_t status;
    kvf_view_t v;
    size_t i, n = 0;

    if (st == NULL || fn == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_vmaps_nodes(st, &ents, &n);
    if (status != KVF_OK) {
        return status;
    }
    for (i = 0; i < n; i++) {
        memset(&v, 0, sizeof(v));
        status = kvf_vmaps_node(st, &ents[i], &v);
        if (status == KVF_OK && v.map_base != NULL) {
            fn(arg, v.map_base, v.map_len);
        } else if (status != KVF_ERR_UNSUPPORTED) {
            kvf_log_rl(KVF_LOG_WARN, "store view maps: node %s not mapped: %s",
                       KVF_LOG_KEY(ents[i].segment), kvf_status_str(status));
        }
    }
    kvf_free(ents);
    return KVF_OK;
}
