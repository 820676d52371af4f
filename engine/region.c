/*
 * Registered regions: a sorted array of non-overlapping ranges under a
 * read-write lock. Registration only records the range (no page is
 * touched), so 8 GB registers in microseconds. Remote accesses hold the
 * read lock from check to the end of their I/O, so deregistration waits
 * for them.
 */
#include "engine/engine_int.h"
#include "core/alloc.h"
#include "core/log.h"

#include <string.h>

struct kvf_region *kvf_region_find(kvf_engine_h engine, uint64_t addr,
                                   uint64_t len)
{
    size_t lo = 0, hi = engine->nregions, mid;
    struct kvf_region *r;

    /* last region whose start <= addr */
    while (lo < hi) {
        mid = lo + (hi - lo) / 2;
        if (engine->regions[mid]->addr <= addr) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (lo == 0) {
        return NULL;
    }
    r = engine->regions[lo - 1];
    if (addr - r->addr > r->len || len > r->len - (addr - r->addr)) {
        return NULL;
    }
    return r;
}

kvf_status_t kvf_engine_reg(kvf_engine_h engine, void *addr, size_t length,
                            kvf_mem_type_t type, int device,
                            kvf_region_h *region_p)
{
    uint64_t a = (uint64_t)(uintptr_t)addr;
    struct kvf_region *r, **grown;
    kvf_status_t status;
    size_t pos;

    if (engine == NULL || addr == NULL || length == 0 || region_p == NULL ||
        a + length < a || type > KVF_MEM_CUDA) {
        kvf_error("bad region %p+%zu type %d", addr, length, (int)type);
        return KVF_ERR_INVALID_PARAM;
    }
    /* GPU ranges are checked against their allocation there */
    status = kvf_mem_region_add(a, length, type, device);
    if (status != KVF_OK) {
        return status;
    }
    r = kvf_calloc(1, sizeof(*r));
    if (r == NULL) {
        kvf_mem_region_del(a, length, type);
        return KVF_ERR_NO_MEMORY;
    }
    r->addr = a;
    r->len = length;
    r->type = type;
    r->device = device;
    /* same-host peers map GPU regions through CUDA IPC (cuda_ipc) */
    kvf_mem_region_export(r);
    __atomic_add_fetch(&engine->regions_writers, 1, __ATOMIC_RELAXED);
    pthread_rwlock_wrlock(&engine->regions_lock);
    __atomic_sub_fetch(&engine->regions_writers, 1, __ATOMIC_RELAXED);
    for (pos = 0; pos < engine->nregions; pos++) {
        if (engine->regions[pos]->addr >= a) {
            break;
        }
    }
    if ((pos > 0 &&
         engine->regions[pos - 1]->addr + engine->regions[pos - 1]->len > a) ||
        (pos < engine->nregions && a + length > engine->regions[pos]->addr)) {
        kvf_error("region %p+%zu overlaps a registered region", addr, length);
        status = KVF_ERR_EXISTS;
        goto err_unlock;
    }
    if (engine->nregions == engine->regions_cap) {
        size_t cap = engine->regions_cap ? engine->regions_cap * 2 : 16;

        grown = kvf_realloc(engine->regions, cap * sizeof(*grown));
        if (grown == NULL) {
            status = KVF_ERR_NO_MEMORY;
            goto err_unlock;
        }
        engine->regions = grown;
        engine->regions_cap = cap;
    }
    memmove(engine->regions + pos + 1, engine->regions + pos,
            (engine->nregions - pos) * sizeof(*engine->regions));
    engine->regions[pos] = r;
    engine->nregions++;
    pthread_rwlock_unlock(&engine->regions_lock);
    kvf_debug("registered %p+%zu type %d", addr, length, (int)type);
    kvf_meta_sync(engine); /* a failure is retried by the backend */
    *region_p = r;
    return KVF_OK;

err_unlock:
    pthread_rwlock_unlock(&engine->regions_lock);
    kvf_mem_region_del(a, length, type);
    kvf_free(r);
    return status;
}

/* Transports that mapped the range for peers (ucx) drop the mapping. */
static void kvf_region_unmap(kvf_engine_h engine, struct kvf_region *r)
{
    unsigned i;

    for (i = 0; i < engine->ntl; i++) {
        if (engine->tl[i].ops->mem_dereg != NULL) {
            engine->tl[i].ops->mem_dereg(engine->tl[i].iface, r->addr, r->len);
        }
    }
}

kvf_status_t kvf_engine_dereg(kvf_engine_h engine, kvf_region_h region)
{
    size_t i;

    if (engine == NULL || region == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    __atomic_add_fetch(&engine->regions_writers, 1, __ATOMIC_RELAXED);
    pthread_rwlock_wrlock(&engine->regions_lock);
    __atomic_sub_fetch(&engine->regions_writers, 1, __ATOMIC_RELAXED);
    for (i = 0; i < engine->nregions; i++) {
        if (engine->regions[i] == region) {
            memmove(engine->regions + i, engine->regions + i + 1,
                    (engine->nregions - i - 1) * sizeof(*engine->regions));
            engine->nregions--;
            pthread_rwlock_unlock(&engine->regions_lock);
            kvf_region_unmap(engine, region);
            kvf_mem_region_del(region->addr, region->len, region->type);
            kvf_free(region);
            kvf_meta_sync(engine);
            return KVF_OK;
        }
    }
    pthread_rwlock_unlock(&engine->regions_lock);
    kvf_error("deregistering an unknown region %p", (void *)region);
    return KVF_ERR_NOT_REGISTERED;
}
