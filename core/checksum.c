/*
 * Checksums through libxxhash: XXH3 64-bit, by its run-time dispatched
 * entry (AVX2 or AVX-512 when the CPU has them; the library's plain entry
 * is built for baseline SSE2 and was measured a third slower).
 */
#include "core/checksum.h"

#define XXH_DISPATCH_DISABLE_REPLACE 1 /* name both entries explicitly */
#include <xxh_x86dispatch.h>
#include <xxhash.h>

uint64_t kvf_hash64(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed_dispatch(data, len, seed);
}

uint64_t kvf_hash64_generic(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(data, len, seed);
}

uint64_t kvf_checksum(const void *data, size_t length)
{
    return XXH3_64bits_withSeed_dispatch(data, length, 0);
}
