/*
 * Transport hooks: wrappers laid over any transport's ep once it is open
 * (libfabric's hook providers) -- fault injection for drills and tests,
 * the same-host GPU path over CUDA IPC. The engine applies every
 * registered hook in order (kvf_tl_hooks_apply) and names none; each
 * hook decides from the peer and the configuration whether it wraps.
 */
#ifndef KVF_TRANSPORT_HOOK_H
#define KVF_TRANSPORT_HOOK_H
#if !defined(KVF_LAYER_TRANSPORT) && !defined(KVF_LAYER_ENGINE) && \
    !defined(KVF_TEST_INTERNALS)
#error "transport/hook.h is transport/'s interface, for the engine"
#endif

#include "transport/transport.h"

/* What a hook may know about the peer whose ep it is offered. */
typedef struct kvf_tl_peer_info {
    const char *name;                /* the peer's segment name (logs) */
    const kvf_tl_config_t *cfg;      /* the engine's transport settings */
    kvf_tl_iface_t *iface;           /* the inner ep's iface and address */
    const char *address;             /* (to reopen it) */
    int same_host;                   /* the peer runs on this host */
    int same_process;                /* the peer is this process */
    const kvf_mem_region_t *regions; /* from the peer's descriptor */
    size_t nregions;
} kvf_tl_peer_info_t;

typedef struct kvf_tl_hook {
    const char *name;
    /* Wraps *ops_p / *ep_p (the wrapper then owns the inner ep) or leaves
     * them as they are, returning KVF_OK either way. listed: the engine's
     * transports list names this hook or is "auto". Any other return:
     * the hook has closed the inner ep and the peer's open fails on this
     * transport. */
    kvf_status_t (*wrap)(const kvf_tl_peer_info_t *peer, int listed,
                         const kvf_transport_ops_t **ops_p, kvf_tl_ep_t **ep_p);
} kvf_tl_hook_t;

/* Registered hooks, NULL-terminated, innermost first. */
extern const kvf_tl_hook_t *const kvf_tl_hooks[];

const kvf_tl_hook_t *kvf_tl_hook_find(const char *name);

#endif
