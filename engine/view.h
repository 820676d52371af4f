/*
 * Transfer engine: views of a peer's memory. Where the peer's transport
 * maps the peer's registered memory into this process (shm), a range of
 * it can be read in place instead of copied: the peer grants the ranges
 * under a lease, and the views (addresses in this process) stay valid
 * until the lease is closed or runs out. For the store's "get view"
 * (store/client/view.c) and "put view" (store/client/put_view.c: the
 * ranges written in place); transport/transport.h (ep_view_open) has
 * the semantics.
 */
#ifndef KVF_ENGINE_VIEW_H
#define KVF_ENGINE_VIEW_H

#include <kvferry/engine.h>

#include "transport/transport.h"

/* Opens a view lease of type (KVF_OP_READ: read views, KVF_OP_WRITE:
 * write views) on peer over count ranges (see ep_view_open): views[i]
 * per range, *until_ms_p the lease's end (kvf_time_ms clock), *lease_p
 * to close. KVF_ERR_UNSUPPORTED when the peer's transport has no views
 * (tcp, a wrapped ep). */
kvf_status_t kvf_peer_view_open(kvf_peer_h peer, kvf_op_type_t type,
                                size_t count, const uint64_t *remote,
                                const uint64_t *lens, kvf_tl_view_t *views,
                                uint64_t *until_ms_p,
                                kvf_tl_vlease_t **lease_p);
/* Ends a lease of kvf_peer_view_open on the same peer: KVF_OK when it
 * held until now. The peer must stay open until then. */
kvf_status_t kvf_peer_view_close(kvf_peer_h peer, kvf_tl_vlease_t *lease);

#endif
