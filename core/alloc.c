/*
 * Tracked allocator: a small header in front of each block records its
 * size; global atomic counters keep the number of live blocks and bytes.
 */
#include "core/alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KVF_ALLOC_HDR 16

static long kvf_alloc_blocks;
static long kvf_alloc_bytes;

static void *kvf_alloc_track(void *raw, size_t size)
{
    if (raw == NULL) {
        return NULL;
    }
    *(size_t *)raw = size;
    __atomic_add_fetch(&kvf_alloc_blocks, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&kvf_alloc_bytes, (long)size, __ATOMIC_RELAXED);
    return (char *)raw + KVF_ALLOC_HDR;
}

void *kvf_malloc(size_t size)
{
    if (size > SIZE_MAX - KVF_ALLOC_HDR) {
        return NULL;
    }
    return kvf_alloc_track(malloc(size + KVF_ALLOC_HDR), size);
}

void *kvf_calloc(size_t n, size_t size)
{
    void *p;

    if (size != 0 && n > (SIZE_MAX - KVF_ALLOC_HDR) / size) {
        return NULL;
    }
    p = kvf_malloc(n * size);
    if (p != NULL) {
        memset(p, 0, n * size);
    }
    return p;
}

void *kvf_realloc(void *ptr, size_t size)
{
    void *raw;
    size_t old;

    if (ptr == NULL) {
        return kvf_malloc(size);
    }
    if (size > SIZE_MAX - KVF_ALLOC_HDR) {
        return NULL;
    }
    raw = (char *)ptr - KVF_ALLOC_HDR;
    old = *(size_t *)raw;
    raw = realloc(raw, size + KVF_ALLOC_HDR);
    if (raw == NULL) {
        return NULL;
    }
    *(size_t *)raw = size;
    __atomic_add_fetch(&kvf_alloc_bytes, (long)size - (long)old,
                       __ATOMIC_RELAXED);
    return (char *)raw + KVF_ALLOC_HDR;
}

char *kvf_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = kvf_malloc(n);

    if (p != NULL) {
        memcpy(p, s, n);
    }
    return p;
}

void kvf_free(void *ptr)
{
    void *raw;

    if (ptr == NULL) {
        return;
    }
    raw = (char *)ptr - KVF_ALLOC_HDR;
    __atomic_sub_fetch(&kvf_alloc_blocks, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&kvf_alloc_bytes, (long)*(size_t *)raw,
                       __ATOMIC_RELAXED);
    free(raw);
}

void kvf_alloc_stats(long *blocks_p, long *bytes_p)
{
    *blocks_p = __atomic_load_n(&kvf_alloc_blocks, __ATOMIC_RELAXED);
    *bytes_p = __atomic_load_n(&kvf_alloc_bytes, __ATOMIC_RELAXED);
}
