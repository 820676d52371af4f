/*
 * The 64-bit hash the library used for checksums before XXH3, kept so that
 * checksum_bench can measure the two side by side (docs/decisions/
 * config-checksum.md).
 *
 * kvf_hash64: below KVF_HASH_WIDE bytes, four independent multiply-rotate
 * lanes over 32-byte stripes; from it on, eight accumulators over 64-byte
 * stripes, each adding the 32x32-bit product of its word's halves (the
 * word mixed with a constant) and its neighbour's word, which AVX2 does
 * four lanes at a time (two 64-bit multiplies per 8 bytes capped the
 * narrow path; `kvferry bench load` shows the verify stage of a 64 KiB get
 * in docs/store.md). Both end in the same merge and avalanche; the portable and
 * the AVX2 accumulation give the same value.
 * Any change of one word changes the accumulator of its product and the
 * one it is added to. Each stripe's words are also mixed with its
 * position ((stripe + 1) x KVF_STEP) before the product, so that the sum
 * depends on where each stripe is: without it the sum of products was
 * the same for any order of the stripes, and a value with two of its
 * 8 KiB blocks swapped kept its checksum.
 */
#include "tests/perf/hash_prev.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define KVF_HASH_WIDE   256 /* bytes: the wide path from here on */
#define KVF_HASH_STRIPE 64

#define KVF_P1   0x9e3779b185ebca87ull
#define KVF_P2   0xc2b2ae3d27d4eb4full
#define KVF_P3   0x165667b19e3779f9ull
#define KVF_P4   0x85ebca77c2b2ae63ull
#define KVF_P5   0x27d4eb2f165667c5ull
#define KVF_STEP 0x9fb21c651e98df25ull /* odd: stripe positions differ */

static inline uint64_t kvf_rotl(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

static inline uint64_t kvf_rd64(const unsigned char *p)
{
    uint64_t v;

    memcpy(&v, p, sizeof(v));
    return v;
}

static inline uint64_t kvf_lane(uint64_t acc, uint64_t v)
{
    acc += v * KVF_P2;
    acc = kvf_rotl(acc, 31);
    return acc * KVF_P1;
}

static inline uint64_t kvf_merge(uint64_t h, uint64_t lane)
{
    h ^= kvf_lane(0, lane);
    return h * KVF_P1 + KVF_P4;
}

static const uint64_t kvf_hash_key[8] = {
    0xbe4ba423396cfeb8ull, 0x1cad21f72c81017cull, 0xdb979083e96dd4deull,
    0x1f67b3b7a4a44072ull, 0x78e5c0cc4ee679cbull, 0x2172ffcc7dd05a82ull,
    0x8e2443f7744608b8ull, 0x4c263a81e69035e0ull,
};

/* Accumulates the whole stripes of [p, p + n) into acc[8]; the portable
 * form of what kvf_hash_wide_avx2 does. */
static void kvf_hash_wide_generic(uint64_t acc[8], const unsigned char *p,
                                  size_t n)
{
    uint64_t d0, d1, d2, d3, d4, d5, d6, d7, pos = 0;
    size_t off;

#define KVF_HASH_PROD(d, i)                                                    \
    (((d ^ kvf_hash_key[i] ^ pos) & 0xffffffffull) *                           \
     ((d ^ kvf_hash_key[i] ^ pos) >> 32))
    for (off = 0; off + KVF_HASH_STRIPE <= n; off += KVF_HASH_STRIPE) {
        pos += KVF_STEP;
        d0 = kvf_rd64(p + off);
        d1 = kvf_rd64(p + off + 8);
        d2 = kvf_rd64(p + off + 16);
        d3 = kvf_rd64(p + off + 24);
        d4 = kvf_rd64(p + off + 32);
        d5 = kvf_rd64(p + off + 40);
        d6 = kvf_rd64(p + off + 48);
        d7 = kvf_rd64(p + off + 56);
        acc[0] += KVF_HASH_PROD(d0, 0) + d1;
        acc[1] += KVF_HASH_PROD(d1, 1) + d0;
        acc[2] += KVF_HASH_PROD(d2, 2) + d3;
        acc[3] += KVF_HASH_PROD(d3, 3) + d2;
        acc[4] += KVF_HASH_PROD(d4, 4) + d5;
        acc[5] += KVF_HASH_PROD(d5, 5) + d4;
        acc[6] += KVF_HASH_PROD(d6, 6) + d7;
        acc[7] += KVF_HASH_PROD(d7, 7) + d6;
    }
#undef KVF_HASH_PROD
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static void
kvf_hash_wide_avx2(uint64_t acc[8], const unsigned char *p, size_t n)
{
    __m256i a0 = _mm256_loadu_si256((const __m256i *)acc);
    __m256i a1 = _mm256_loadu_si256((const __m256i *)(acc + 4));
    const __m256i k0 = _mm256_loadu_si256((const __m256i *)kvf_hash_key);
    const __m256i k1 = _mm256_loadu_si256((const __m256i *)(kvf_hash_key + 4));
    const __m256i step = _mm256_set1_epi64x((long long)KVF_STEP);
    __m256i pos = _mm256_setzero_si256();
    size_t off;

    for (off = 0; off + KVF_HASH_STRIPE <= n; off += KVF_HASH_STRIPE) {
        __m256i d0 = _mm256_loadu_si256((const __m256i *)(p + off));
        __m256i d1 = _mm256_loadu_si256((const __m256i *)(p + off + 32));
        __m256i x0, x1;

        pos = _mm256_add_epi64(pos, step);
        x0 = _mm256_xor_si256(_mm256_xor_si256(d0, k0), pos);
        x1 = _mm256_xor_si256(_mm256_xor_si256(d1, k1), pos);

        /* low half times high half of each 64-bit lane */
        a0 = _mm256_add_epi64(a0,
                              _mm256_mul_epu32(x0, _mm256_srli_epi64(x0, 32)));
        a1 = _mm256_add_epi64(a1,
                              _mm256_mul_epu32(x1, _mm256_srli_epi64(x1, 32)));
        /* plus the neighbour's word: lanes 0<->1, 2<->3 */
        a0 = _mm256_add_epi64(a0, _mm256_shuffle_epi32(d0, 0x4e));
        a1 = _mm256_add_epi64(a1, _mm256_shuffle_epi32(d1, 0x4e));
    }
    _mm256_storeu_si256((__m256i *)acc, a0);
    _mm256_storeu_si256((__m256i *)(acc + 4), a1);
}
#endif

static void kvf_hash_wide(uint64_t acc[8], const unsigned char *p, size_t n,
                          int generic)
{
#if defined(__x86_64__)
    static int avx2 = -1;

    if (__atomic_load_n(&avx2, __ATOMIC_RELAXED) < 0) {
        __builtin_cpu_init();
        __atomic_store_n(&avx2, __builtin_cpu_supports("avx2") ? 1 : 0,
                         __ATOMIC_RELAXED);
    }
    if (avx2 && !generic) {
        kvf_hash_wide_avx2(acc, p, n);
        return;
    }
#endif
    (void)generic;
    kvf_hash_wide_generic(acc, p, n);
}

static uint64_t kvf_hash64_impl(const void *data, size_t len, uint64_t seed,
                                int generic)
{
    const unsigned char *p = data, *end = p + len;
    uint64_t h, a, b, c, d, tail, acc[8];
    size_t i, whole;

    if (len >= KVF_HASH_WIDE) {
        for (i = 0; i < 8; i++) {
            acc[i] = seed ^ kvf_hash_key[7 - i];
        }
        whole = len / KVF_HASH_STRIPE * KVF_HASH_STRIPE;
        kvf_hash_wide(acc, p, whole, generic);
        p += whole;
        h = seed + KVF_P5;
        for (i = 0; i < 8; i++) {
            h = kvf_merge(h, acc[i]);
        }
    } else if (len >= 32) {
        a = seed + KVF_P1 + KVF_P2;
        b = seed + KVF_P2;
        c = seed;
        d = seed - KVF_P1;
        while (p + 32 <= end) {
            a = kvf_lane(a, kvf_rd64(p));
            b = kvf_lane(b, kvf_rd64(p + 8));
            c = kvf_lane(c, kvf_rd64(p + 16));
            d = kvf_lane(d, kvf_rd64(p + 24));
            p += 32;
        }
        h = kvf_rotl(a, 1) + kvf_rotl(b, 7) + kvf_rotl(c, 12) + kvf_rotl(d, 18);
        h = kvf_merge(h, a);
        h = kvf_merge(h, b);
        h = kvf_merge(h, c);
        h = kvf_merge(h, d);
    } else {
        h = seed + KVF_P5;
    }
    h += (uint64_t)len;
    while (p + 8 <= end) {
        h ^= kvf_lane(0, kvf_rd64(p));
        h = kvf_rotl(h, 27) * KVF_P1 + KVF_P4;
        p += 8;
    }
    if (p < end) {
        tail = 0;
        memcpy(&tail, p, (size_t)(end - p));
        h ^= tail * KVF_P5;
        h = kvf_rotl(h, 11) * KVF_P1;
    }
    h ^= h >> 33;
    h *= KVF_P2;
    h ^= h >> 29;
    h *= KVF_P3;
    h ^= h >> 32;
    return h;
}

uint64_t kvf_hash64_prev(const void *data, size_t len, uint64_t seed)
{
    return kvf_hash64_impl(data, len, seed, 0);
}
