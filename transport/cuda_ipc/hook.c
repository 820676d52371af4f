/*
 * cuda_ipc transport: its hook and its registry entry. A peer on this
 * host whose descriptor carries CUDA IPC handles gets the wrapper of
 * cuda_ipc.c over its ep: its GPU regions are reached by this process's
 * GPUs directly, everything else through the ep. "cuda" in the engine's
 * transports list (or "auto") enables it. A failure leaves the ep as it
 * was (GPU regions then go through it). Built with and without CUDA;
 * without it the hook never wraps.
 */
#include "transport/cuda_ipc/cuda_ipc.h"
#include "core/alloc.h"
#include "core/log.h"

#include <string.h>

static size_t kvf_cuda_ipc_collect(const kvf_tl_peer_info_t *peer,
                                   kvf_cuda_remote_t *rem)
{
    size_t i, n = 0;

    for (i = 0; i < peer->nregions; i++) {
        const kvf_mem_region_t *r = &peer->regions[i];

        if (!r->ipc) {
            continue;
        }
        if (rem != NULL) {
            rem[n].addr = r->addr;
            rem[n].len = r->len;
            rem[n].device = r->device;
            rem[n].ipc_off = r->ipc_off;
            memcpy(rem[n].handle, r->ipc_handle, KVF_MEM_IPC_HANDLE);
        }
        n++;
    }
    return n;
}

static kvf_status_t kvf_cuda_ipc_hook_wrap(const kvf_tl_peer_info_t *peer,
                                           int listed,
                                           const kvf_transport_ops_t **ops_p,
                                           kvf_tl_ep_t **ep_p)
{
    kvf_cuda_remote_t *rem;
    kvf_status_t status;
    size_t n;

    if (!listed || !peer->same_host) {
        return KVF_OK;
    }
    /* regions first: a peer with none (a node's host pool) must not
     * start CUDA in this process, which takes 0.1-0.2 s on a GPU host */
    n = kvf_cuda_ipc_collect(peer, NULL);
    if (n == 0 || kvf_mem_gpu_count() == 0) {
        return KVF_OK;
    }
    rem = kvf_calloc(n, sizeof(*rem));
    if (rem == NULL) {
        return KVF_OK;
    }
    kvf_cuda_ipc_collect(peer, rem);
#ifdef KVF_HAVE_CUDA
    status = kvf_cuda_ep_wrap(rem, n, peer->same_process, peer->cfg->timeout_ms,
                              ops_p, ep_p);
#else
    (void)ep_p;
    status = KVF_ERR_UNAVAILABLE;
#endif
    kvf_free(rem);
    if (status == KVF_OK) {
        kvf_info("peer %s: %zu GPU region(s) through cuda ipc", peer->name, n);
    } else {
        kvf_warn("peer %s: cuda ipc unavailable (%s), GPU regions through %s",
                 peer->name, kvf_status_str(status), (*ops_p)->name);
    }
    return KVF_OK;
}

const kvf_tl_hook_t kvf_cuda_ipc_hook = {
    .name = "cuda",
    .wrap = kvf_cuda_ipc_hook_wrap,
};

/* The registry's entry for "cuda" (a name transports lists may use): it
 * has no iface of its own, so it is never opened as one; its hook wraps
 * a same-host peer's ep instead. */
static int kvf_cuda_tl_available(void)
{
    return 0;
}

const kvf_transport_ops_t kvf_cuda_ops = {
    .name = "cuda",
    .available = kvf_cuda_tl_available,
};
