/*
 * Memory the engine can share: kvf_mem_alloc / kvf_mem_free, the public
 * front of the memory layer's per-type allocators (mem/mem.h).
 */
#include "engine/engine_int.h"
#include "core/log.h"

kvf_status_t kvf_mem_alloc(size_t len, kvf_mem_type_t type, int device,
                           void **ptr_p)
{
    return kvf_mem_type_alloc(type, len, device, ptr_p);
}

void kvf_mem_free(void *ptr)
{
    if (ptr == NULL) {
        return;
    }
    if (kvf_mem_type_free(ptr) == KVF_ERR_NOT_FOUND) {
        kvf_warn("kvf_mem_free(%p): not memory from kvf_mem_alloc, ignored",
                 ptr);
    }
}
