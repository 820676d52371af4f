/*
 * GHASH with PCLMULQDQ (core/ghash.h). Why not a library's: OpenSSL
 * exposes GHASH only inside its GCM calls, whose fixed work per tag
 * (setting the nonce, feeding, finishing) is several times the hash
 * itself on a frame of tens of bytes, and a store operation of 4 KiB
 * seals and checks about ten such tags. tests/unit/test_wire.c checks
 * the tags computed with it against OpenSSL's AES-256-GCM.
 *
 * The field's bit order is reflected: blocks are byte-reversed on load,
 * multiplied as 128-bit polynomials (four carry-less products), the
 * 256-bit product shifted left by one bit and reduced modulo
 * x^128 + x^7 + x^2 + x + 1 (the method of Intel's white paper on
 * carry-less multiplication and GCM). Shifting and reducing are linear,
 * so a group of up to eight blocks is multiplied by H^8 .. H^1, summed,
 * and reduced once. Compiled for AVX (VEX encoding): legacy SSE code
 * beside AVX code that left the upper register halves in use is slowed
 * on some CPUs.
 */
#include "core/ghash.h"

#include <endian.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define KVF_GHASH_TARGET __attribute__((target("avx,pclmul")))

int kvf_ghash_available(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("avx");
}

/* A sum of 256-bit products, not reduced yet: lo, hi and the middle
 * terms (shifted in once per group). */
typedef struct kvf_ghash_wide {
    __m128i lo, mid, hi;
} kvf_ghash_wide_t;

KVF_GHASH_TARGET static inline __m128i kvf_ghash_rev(__m128i x)
{
    const __m128i rev =
        _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);

    return _mm_shuffle_epi8(x, rev);
}

KVF_GHASH_TARGET static inline __m128i kvf_ghash_load(const unsigned char *p)
{
    return kvf_ghash_rev(_mm_loadu_si128((const __m128i *)p));
}

/* w += a * b, carry-less, unreduced. */
KVF_GHASH_TARGET static inline void kvf_ghash_mul_add(kvf_ghash_wide_t *w,
                                                      __m128i a, __m128i b)
{
    w->lo = _mm_xor_si128(w->lo, _mm_clmulepi64_si128(a, b, 0x00));
    w->hi = _mm_xor_si128(w->hi, _mm_clmulepi64_si128(a, b, 0x11));
    w->mid = _mm_xor_si128(w->mid, _mm_clmulepi64_si128(a, b, 0x10));
    w->mid = _mm_xor_si128(w->mid, _mm_clmulepi64_si128(a, b, 0x01));
}

/* The 256-bit w shifted left by one bit (the reflected order's extra
 * factor x), reduced modulo the field polynomial. */
KVF_GHASH_TARGET static inline __m128i kvf_ghash_reduce(kvf_ghash_wide_t w)
{
    __m128i lo = _mm_xor_si128(w.lo, _mm_slli_si128(w.mid, 8));
    __m128i hi = _mm_xor_si128(w.hi, _mm_srli_si128(w.mid, 8));
    __m128i lo_c = _mm_srli_epi32(lo, 31), hi_c = _mm_srli_epi32(hi, 31);
    __m128i a, b;

    /* the shift: each 32-bit lane's top bit into the next lane */
    lo = _mm_slli_epi32(lo, 1);
    hi = _mm_slli_epi32(hi, 1);
    hi = _mm_or_si128(hi, _mm_srli_si128(lo_c, 12));
    hi = _mm_or_si128(hi, _mm_slli_si128(hi_c, 4));
    lo = _mm_or_si128(lo, _mm_slli_si128(lo_c, 4));
    /* the reduction, first phase: multiples of x^127, x^126, x^121 */
    a = _mm_xor_si128(_mm_slli_epi32(lo, 31), _mm_slli_epi32(lo, 30));
    a = _mm_xor_si128(a, _mm_slli_epi32(lo, 25));
    b = _mm_srli_si128(a, 4);
    lo = _mm_xor_si128(lo, _mm_slli_si128(a, 12));
    /* second phase: the shifted copies folded into the high half */
    a = _mm_xor_si128(_mm_srli_epi32(lo, 1), _mm_srli_epi32(lo, 2));
    a = _mm_xor_si128(a, _mm_srli_epi32(lo, 7));
    a = _mm_xor_si128(a, b);
    lo = _mm_xor_si128(lo, a);
    return _mm_xor_si128(hi, lo);
}

KVF_GHASH_TARGET void kvf_ghash_init(kvf_ghash_key_t *k,
                                     const unsigned char h[16])
{
    __m128i h1 = kvf_ghash_load(h), p = h1;
    int i;

    _mm_store_si128((__m128i *)k->hpow[0], h1);
    for (i = 1; i < KVF_GHASH_POWERS; i++) {
        kvf_ghash_wide_t w = {_mm_setzero_si128(), _mm_setzero_si128(),
                              _mm_setzero_si128()};

        kvf_ghash_mul_add(&w, p, h1);
        p = kvf_ghash_reduce(w);
        _mm_store_si128((__m128i *)k->hpow[i], p);
    }
}

/* y folded with the n (1 .. 8) blocks at p: (y ^ X1) H^n ^ ... ^ Xn H. */
KVF_GHASH_TARGET static inline __m128i kvf_ghash_group(const kvf_ghash_key_t *k,
                                                       __m128i y,
                                                       const unsigned char *p,
                                                       size_t n)
{
    kvf_ghash_wide_t w = {_mm_setzero_si128(), _mm_setzero_si128(),
                          _mm_setzero_si128()};
    const unsigned char *h = k->hpow[n - 1];
    size_t j;

    kvf_ghash_mul_add(&w, _mm_xor_si128(kvf_ghash_load(p), y),
                      _mm_load_si128((const __m128i *)h));
    for (j = 1; j < n; j++) {
        h -= 16;
        kvf_ghash_mul_add(&w, kvf_ghash_load(p + 16 * j),
                          _mm_load_si128((const __m128i *)h));
    }
    return kvf_ghash_reduce(w);
}

KVF_GHASH_TARGET void kvf_ghash_blocks(const kvf_ghash_key_t *k, kvf_ghash_t *g,
                                       const unsigned char *p, size_t nblocks)
{
    __m128i y = _mm_load_si128((const __m128i *)g->y);

    while (nblocks > 0) {
        size_t n = nblocks < KVF_GHASH_POWERS ? nblocks : KVF_GHASH_POWERS;

        y = kvf_ghash_group(k, y, p, n);
        p += 16 * n;
        nblocks -= n;
    }
    _mm_store_si128((__m128i *)g->y, y);
}

KVF_GHASH_TARGET void kvf_ghash_tag(const kvf_ghash_t *g,
                                    const unsigned char ek0[16],
                                    unsigned char tag[16])
{
    __m128i y = kvf_ghash_rev(_mm_load_si128((const __m128i *)g->y));

    y = _mm_xor_si128(y, _mm_loadu_si128((const __m128i *)ek0));
    _mm_storeu_si128((__m128i *)tag, y);
}

#else /* no carry-less multiply here: core/wire_mac.c uses OpenSSL's */

int kvf_ghash_available(void)
{
    return 0;
}

void kvf_ghash_init(kvf_ghash_key_t *k, const unsigned char h[16])
{
    (void)h;
    memset(k, 0, sizeof(*k));
}

void kvf_ghash_blocks(const kvf_ghash_key_t *k, kvf_ghash_t *g,
                      const unsigned char *p, size_t nblocks)
{
    (void)k;
    (void)g;
    (void)p;
    (void)nblocks;
}

void kvf_ghash_tag(const kvf_ghash_t *g, const unsigned char ek0[16],
                   unsigned char tag[16])
{
    (void)g;
    (void)ek0;
    memset(tag, 0, 16);
}
#endif

void kvf_ghash_length_block(uint64_t aad_bytes, unsigned char b[16])
{
    uint64_t bits = htobe64(aad_bytes * 8);

    memcpy(b, &bits, 8);
    memset(b + 8, 0, 8); /* no ciphertext */
}
