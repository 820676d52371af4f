/*
 * kvferry: KV-cache transfer engine and cache store. One header to
 * include; see engine.h (transfer engine) and status.h (status codes).
 */
#ifndef KVFERRY_KVFERRY_H
#define KVFERRY_KVFERRY_H

#include <kvferry/status.h>
#include <kvferry/engine.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVF_VERSION_STRING "0.1.0"

KVF_API const char *kvf_version(void);

/* Live tracked allocations of the library (blocks and bytes), for tests
 * that assert nothing leaked. */
KVF_API void kvf_alloc_stats(long *blocks_p, long *bytes_p);

#ifdef __cplusplus
}
#endif

#endif
