/*
 * The transports compiled into this build, in default preference order
 * (the engine takes the first one both sides have), and the hooks laid
 * over every ep the engine opens; the process's unmap hook for views.
 */
#include "transport/hook.h"

#include <pthread.h>
#include <string.h>

extern const kvf_transport_ops_t kvf_cuda_ops;
extern const kvf_transport_ops_t kvf_shm_ops;
extern const kvf_transport_ops_t kvf_tcp_ops;
extern const kvf_transport_ops_t kvf_ucx_ops;
extern const kvf_tl_hook_t kvf_fault_hook;
extern const kvf_tl_hook_t kvf_cuda_ipc_hook;

const kvf_transport_ops_t *const kvf_transports[] = {
    &kvf_cuda_ops, /* no iface: its hook wraps a same-host peer's ep */
    &kvf_shm_ops,  /* same host only: its ep_open fails elsewhere */
    &kvf_ucx_ops,  /* under auto only where UCX has an RDMA device */
    &kvf_tcp_ops,  NULL,
};

/* Innermost first: fault injection sees every request the inner ep
 * would, the GPU path sits outside it. */
const kvf_tl_hook_t *const kvf_tl_hooks[] = {
    &kvf_fault_hook,
    &kvf_cuda_ipc_hook,
    NULL,
};

kvf_tl_counters_t kvf_tl_counters;

const kvf_transport_ops_t *kvf_transport_find(const char *name)
{
    size_t i;

    for (i = 0; kvf_transports[i] != NULL; i++) {
        if (strcmp(kvf_transports[i]->name, name) == 0) {
            return kvf_transports[i];
        }
    }
    return NULL;
}

const kvf_tl_hook_t *kvf_tl_hook_find(const char *name)
{
    size_t i;

    for (i = 0; kvf_tl_hooks[i] != NULL; i++) {
        if (strcmp(kvf_tl_hooks[i]->name, name) == 0) {
            return kvf_tl_hooks[i];
        }
    }
    return NULL;
}

void kvf_tl_req_fail(kvf_tl_req_t *req, kvf_status_t status)
{
    size_t i;

    req->status = status;
    KVF_TL_COUNT(errors, 1);
    if (req->seg_status != NULL) {
        for (i = 0; i < req->nsegs; i++) {
            req->seg_status[i] = status;
        }
    }
    req->complete(req);
}

/* The unmap hook (kvf_tl_unmap_hook): set and read under a lock, called
 * outside it. */
static pthread_mutex_t kvf_tl_unmap_lock = PTHREAD_MUTEX_INITIALIZER;
static kvf_tl_unmap_fn kvf_tl_unmap_cb;
static void *kvf_tl_unmap_arg;

void kvf_tl_unmap_hook(kvf_tl_unmap_fn fn, void *arg)
{
    pthread_mutex_lock(&kvf_tl_unmap_lock);
    kvf_tl_unmap_cb = fn;
    kvf_tl_unmap_arg = arg;
    pthread_mutex_unlock(&kvf_tl_unmap_lock);
}

void kvf_tl_unmap_notify(const void *base, uint64_t len)
{
    kvf_tl_unmap_fn fn;
    void *arg;

    pthread_mutex_lock(&kvf_tl_unmap_lock);
    fn = kvf_tl_unmap_cb;
    arg = kvf_tl_unmap_arg;
    pthread_mutex_unlock(&kvf_tl_unmap_lock);
    if (fn != NULL) {
        fn(arg, base, len);
    }
}
