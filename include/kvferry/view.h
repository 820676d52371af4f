/*
 * kvferry views: a peer's memory read (or written) in place. Where the
 * transport to a peer maps the peer's registered memory into this process
 * (shm, same host), a range of it can be used where it lies instead of
 * copied: the peer grants the ranges under a lease, checked against its
 * registered regions as a copy would be, and the views (addresses in this
 * process) stay valid until the lease is closed or runs out. Over a
 * transport without views (tcp) the open says KVF_ERR_UNSUPPORTED and the
 * caller copies instead. The store's views (kvferry/store.h) are built on
 * these.
 */
#ifndef KVFERRY_VIEW_H
#define KVFERRY_VIEW_H

#include <kvferry/engine.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One range's view: where it lies here, in which mapping. */
typedef struct kvf_view {
    const void *ptr;      /* the range here; NULL unless status is KVF_OK */
    const void *map_base; /* the whole mapping holding it (NULL: none) */
    uint64_t map_len;
    kvf_status_t status;
} kvf_view_t;

typedef struct kvf_view_lease *kvf_view_lease_h;

/* Opens a lease of type (KVF_OP_READ: read views, KVF_OP_WRITE: write
 * views) over count ranges [remote[i], remote[i] + lens[i]) of peer:
 * views[i] per range, *until_ms_p when the lease ends (CLOCK_MONOTONIC
 * milliseconds), *lease_p to close. KVF_ERR_UNSUPPORTED: the transport to
 * the peer has no views. The peer must stay open until the close. */
KVF_API kvf_status_t kvf_peer_view_open(kvf_peer_h peer, kvf_op_type_t type,
                                        size_t count, const uint64_t *remote,
                                        const uint64_t *lens,
                                        kvf_view_t *views,
                                        uint64_t *until_ms_p,
                                        kvf_view_lease_h *lease_p);
/* Ends the lease: KVF_OK when it held until now (every access through
 * its views reached the peer's registered memory), else why not
 * (KVF_ERR_TIMEOUT: held past its time; KVF_ERR_CONN_RESET: revoked, or
 * the peer is gone). A write lease's stores are ordered before its end. */
KVF_API kvf_status_t kvf_peer_view_close(kvf_peer_h peer,
                                         kvf_view_lease_h lease);

/* Called just before a mapping that views lay in is unmapped (no view
 * into it is held any more), from the thread that unmaps it; it must not
 * call into kvferry. One per process: a later call replaces it, NULL
 * removes it. */
typedef void (*kvf_view_unmap_fn)(void *arg, const void *base, uint64_t len);
KVF_API void kvf_view_unmap_hook(kvf_view_unmap_fn fn, void *arg);

#ifdef __cplusplus
}
#endif

#endif
