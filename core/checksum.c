/*
 * Checksums through libxxhash: XXH3 64-bit, by its run-time dispatched
 * entry (AVX2 or AVX-512 when the CPU has them; the library's plain entry
 * is built for baseline SSE2 and was measured a third slower).
 *
 * Debian's libxxhash returns from its wide paths (inputs over 240
 * bytes) with the upper halves of the vector registers still in use.
 * Until something clears them, every legacy-SSE instruction the thread
 * runs (most of this library's vector code, built for baseline x86-64)
 * waits on a merge with those halves: a frame tag (core/wire_mac.c)
 * took ten times as long after a 4 KiB checksum
 * (tests/perf/wire_mac_bench.c, the cell after the checksum cell). So
 * each entry here clears them (VZEROUPPER) before it returns.
 */
#include "core/checksum.h"

#define XXH_DISPATCH_DISABLE_REPLACE 1 /* name both entries explicitly */
#define XXH_STATIC_LINKING_ONLY      1 /* XXH3_state_t on the stack */
#include <xxh_x86dispatch.h>
#include <xxhash.h>

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx"))) static void kvf_vec_upper_clear(void)
{
    _mm256_zeroupper();
}

/* Clears the vector registers' upper halves where the CPU has them. */
static inline void kvf_vec_settle(void)
{
    if (__builtin_cpu_supports("avx")) {
        kvf_vec_upper_clear();
    }
}
#else
static inline void kvf_vec_settle(void)
{
}
#endif

/* Piece of a fused copy: small enough to stay in the second-level cache
 * between the copy and the hash. */
#define KVF_COPY_SUM_PIECE (64u << 10)

uint64_t kvf_hash64(const void *data, size_t len, uint64_t seed)
{
    uint64_t h = XXH3_64bits_withSeed_dispatch(data, len, seed);

    kvf_vec_settle();
    return h;
}

uint64_t kvf_hash64_generic(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(data, len, seed);
}

uint64_t kvf_checksum(const void *data, size_t length)
{
    return kvf_hash64(data, length, 0);
}

uint64_t kvf_copy_checksum(void *dst, const void *src, size_t len)
{
    XXH3_state_t st;
    uint64_t h;
    size_t at, n;

    if (len <= KVF_COPY_SUM_PIECE) {
        memcpy(dst, src, len);
        return kvf_hash64(dst, len, 0);
    }
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    for (at = 0; at < len; at += n) {
        n = len - at < KVF_COPY_SUM_PIECE ? len - at : KVF_COPY_SUM_PIECE;
        memcpy((char *)dst + at, (const char *)src + at, n);
        XXH3_64bits_update_dispatch(&st, (const char *)dst + at, n);
    }
    h = XXH3_64bits_digest(&st);
    kvf_vec_settle();
    return h;
}
