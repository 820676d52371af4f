/*
 * Tracked allocation: every library allocation goes through kvf_malloc /
 * kvf_calloc / kvf_free so tests can assert that nothing leaked
 * (kvf_alloc_outstanding() returns to its baseline). Never aborts: callers
 * turn NULL into KVF_ERR_NO_MEMORY.
 */
#ifndef KVF_CORE_ALLOC_H
#define KVF_CORE_ALLOC_H
#if !defined(KVF_INTERNAL) && !defined(KVF_TEST_INTERNALS)
#error "core/alloc.h is internal to kvferry: use <kvferry/*.h>"
#endif

#include <kvferry/status.h>

#include <stddef.h>

void *kvf_malloc(size_t size);
void *kvf_calloc(size_t n, size_t size);
void *kvf_realloc(void *ptr, size_t size);
char *kvf_strdup(const char *s);
void kvf_free(void *ptr);

/* Live tracked blocks and bytes (public in kvferry.h). */
KVF_API void kvf_alloc_stats(long *blocks_p, long *bytes_p);

#endif
