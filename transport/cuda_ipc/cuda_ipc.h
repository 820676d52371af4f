/*
 * cuda_ipc transport, private: the wrapper ep that moves a same-host
 * peer's GPU regions with this process's GPUs (cuda_ipc.c) and the hook
 * that lays it over a peer's ep (hook.c).
 */
#ifndef KVF_TRANSPORT_CUDA_IPC_H
#define KVF_TRANSPORT_CUDA_IPC_H
#if !defined(KVF_LAYER_TRANSPORT) && !defined(KVF_TEST_INTERNALS)
#error "transport/cuda_ipc/cuda_ipc.h is private to transport/"
#endif

#include "transport/hook.h"

/* A GPU region of a same-host peer, from its segment descriptor. */
typedef struct kvf_cuda_remote {
    uint64_t addr; /* the peer's address of the region */
    uint64_t len;
    int device;       /* the peer's GPU ordinal (a hint for this process) */
    uint64_t ipc_off; /* addr's offset in the exported allocation */
    unsigned char handle[KVF_MEM_IPC_HANDLE];
} kvf_cuda_remote_t;

/* Wraps a peer's ep (*ops_p, *ep_p; on success replaced by the wrapper,
 * transport name "cuda", which owns and closes the inner ep): segments
 * whose remote range lies in one of these regions and whose local memory
 * is registered GPU or pinned memory are moved by this process's GPUs
 * through the peer's mapped allocation (batched copy kernels, NVLink
 * between GPUs); a remote range that starts in such a region and runs
 * past its end fails with KVF_ERR_OUT_OF_BOUNDS; everything else, and
 * checksums, go to the inner ep. same_process: the peer is this process
 * (its addresses are used directly, no IPC mapping). Without a GPU:
 * KVF_ERR_UNAVAILABLE and nothing changes. */
kvf_status_t kvf_cuda_ep_wrap(const kvf_cuda_remote_t *regions, size_t n,
                              int same_process, unsigned timeout_ms,
                              const kvf_transport_ops_t **ops_p,
                              kvf_tl_ep_t **ep_p);

extern const kvf_tl_hook_t kvf_cuda_ipc_hook;

#endif
