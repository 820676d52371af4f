/*
 * Public calls of kvferry/perf.h that are not the engine's own data path:
 * the transports built in and the GPU copy the load bench uses. Thin
 * wrappers, so programs need no private header.
 */
#include <kvferry/perf.h>

#include "transport/cuda/cuda.h"
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
    return kvf_cuda_device_count();
}

kvf_status_t kvf_gpu_copy(void *dst, const void *src, size_t len)
{
    return kvf_cuda_memcpy(dst, src, len);
}
