/*
 * Public calls of kvferry/perf.h that are not the engine's own data path:
 * the transports built in and the GPU copy the load bench uses. Thin
 * wrappers, so programs need no private header.
 */
#include <kvferry/engine_perf.h>

#include "mem/mem.h"
#include "transport/transport.h"

size_t kvf_transport_names(const char **names, size_t max)
{
    size_t i;

    for (i = 0; kvf_transports[i] != NULL; i++) {
        if (names != NULL && i < max) {
            names[i] = kvf_transports[i]->name;
        }
    }
    return i;
}

int kvf_gpu_count(void)
{
    return kvf_mem_gpu_count();
}

kvf_status_t kvf_gpu_copy(void *dst, const void *src, size_t len)
{
    const kvf_mem_ops_t *ops = kvf_mem_ops(KVF_MEM_CUDA);

    /* cudaMemcpy with the direction inferred from the addresses */
    return ops != NULL && ops->copy != NULL ? ops->copy(dst, src, len)
                                            : KVF_ERR_UNAVAILABLE;
}
