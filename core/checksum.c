/*
 * Checksums through libxxhash: XXH3 64-bit, by its run-time dispatched
 * entry (AVX2 or AVX-512 when the CPU has them; the library's plain entry
 * is built for baseline SSE2 and was measured a third slower).
 */
#include "core/checksum.h"

#define XXH_DISPATCH_DISABLE_REPLACE 1 /* name both entries explicitly */
#define XXH_STATIC_LINKING_ONLY      1 /* XXH3_state_t on the stack */
#include <xxh_x86dispatch.h>
#include <xxhash.h>

#include <string.h>

/* Piece of a fused copy: small enough to stay in the second-level cache
 * between the copy and the hash. */
#define KVF_COPY_SUM_PIECE (64u << 10)

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

uint64_t kvf_copy_checksum(void *dst, const void *src, size_t len)
{
    XXH3_state_t st;
    size_t at, n;

    if (len <= KVF_COPY_SUM_PIECE) {
        memcpy(dst, src, len);
        return XXH3_64bits_withSeed_dispatch(dst, len, 0);
    }
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    for (at = 0; at < len; at += n) {
        n = len - at < KVF_COPY_SUM_PIECE ? len - at : KVF_COPY_SUM_PIECE;
        memcpy((char *)dst + at, (const char *)src + at, n);
        XXH3_64bits_update_dispatch(&st, (const char *)dst + at, n);
    }
    return XXH3_64bits_digest(&st);
}
