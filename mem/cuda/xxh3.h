/*
 * XXH3-64 (seed 0, default secret) in pieces that a warp can share, for
 * the copy kernels that checksum blocks while they move them, and for
 * the host test that checks the decomposition against libxxhash. The
 * value is exactly kvf_checksum()'s (XXH3_64bits_withSeed(p, len, 0)).
 *
 * How the long form (more than 240 bytes) splits over a warp: XXH3 keeps
 * 8 64-bit accumulators; each 1 KiB of input (16 stripes of 64 bytes)
 * adds to them, then they are scrambled. Within a KiB the additions
 * commute, so lane L of a warp takes the two 16-byte vectors at L and
 * L + 32 (stripes L/4 and L/4 + 8, words 2g and 2g+1 with g = L % 4),
 * adds their terms to accumulators 2g and 2g+1, and the 8 lanes of the
 * same g sum their terms with three shuffles; every lane then holds its
 * pair of accumulators and scrambles them itself. The last partial KiB
 * and XXH3's final stripe are added the same way (no scramble), and the
 * four pairs are merged by four lanes. Inputs of 240 bytes or less take
 * XXH3's short forms, computed by one lane.
 *
 * Everything here is plain integer arithmetic usable from C (host) and
 * CUDA (host and device); the warp-level parts live in kern.cu.
 */
#ifndef KVF_MEM_CUDA_XXH3_H
#define KVF_MEM_CUDA_XXH3_H
#if !defined(KVF_LAYER_MEM) && !defined(KVF_MEM_GPU_IFACE) && \
    !defined(KVF_TEST_INTERNALS)
#error "mem/cuda/xxh3.h is private to mem/ (transports: mem/gpu.h)"
#endif

#include <stdint.h>

#ifdef __CUDACC__
#define KVF_XXH_FN __host__ __device__ __forceinline__ static
#else
#define KVF_XXH_FN static inline
#endif

#define KVF_XXH_P32_1 0x9E3779B1u
#define KVF_XXH_P32_2 0x85EBCA77u
#define KVF_XXH_P32_3 0xC2B2AE3Du
#define KVF_XXH_P64_1 0x9E3779B185EBCA87ull
#define KVF_XXH_P64_2 0xC2B2AE3D27D4EB4Full
#define KVF_XXH_P64_3 0x165667B19E3779F9ull
#define KVF_XXH_P64_4 0x85EBCA77C2B2AE63ull
#define KVF_XXH_P64_5 0x27D4EB2F165667C5ull

#define KVF_XXH_KIB      1024u /* bytes between two scrambles */
#define KVF_XXH_SHORT    240u  /* longer inputs take the long form */
#define KVF_XXH_SCRAMBLE 128u  /* secret offset of the scramble keys */
#define KVF_XXH_LASTACC  121u  /* secret offset of the final stripe */
#define KVF_XXH_MERGE    11u   /* secret offset of the merge keys */

/* XXH3's default secret (192 bytes). */
#define KVF_XXH_SECRET_BYTES                                                   \
    {                                                                          \
        0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81,      \
            0x2c, 0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90,  \
            0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb,  \
            0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d,  \
            0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24,  \
            0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28,  \
            0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b,  \
            0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e,  \
            0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76,  \
            0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b,  \
            0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8,  \
            0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83,  \
            0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63,  \
            0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16,  \
            0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d,  \
            0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,  \
            0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb,  \
            0xca, 0xbb, 0x4b, 0x40, 0x7e                                       \
    }

/* Little-endian reads at any alignment. */
KVF_XXH_FN uint32_t kvf_xxh_r32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

KVF_XXH_FN uint64_t kvf_xxh_r64(const uint8_t *p)
{
    return (uint64_t)kvf_xxh_r32(p) | (uint64_t)kvf_xxh_r32(p + 4) << 32;
}

KVF_XXH_FN uint64_t kvf_xxh_fold(uint64_t a, uint64_t b)
{
#ifdef __CUDA_ARCH__
    return (a * b) ^ __umul64hi(a, b);
#else
    unsigned __int128 p = (unsigned __int128)a * b;

    return (uint64_t)p ^ (uint64_t)(p >> 64);
#endif
}

KVF_XXH_FN uint64_t kvf_xxh_avalanche(uint64_t h)
{
    h ^= h >> 37;
    h *= 0x165667919E3779F9ull;
    return h ^ (h >> 32);
}

KVF_XXH_FN uint64_t kvf_xxh64_avalanche(uint64_t h)
{
    h ^= h >> 33;
    h *= KVF_XXH_P64_2;
    h ^= h >> 29;
    h *= KVF_XXH_P64_3;
    return h ^ (h >> 32);
}

KVF_XXH_FN uint64_t kvf_xxh_mix16(const uint8_t *in, const uint8_t *sec)
{
    return kvf_xxh_fold(kvf_xxh_r64(in) ^ kvf_xxh_r64(sec),
                        kvf_xxh_r64(in + 8) ^ kvf_xxh_r64(sec + 8));
}

/* 0 to 16 bytes. */
KVF_XXH_FN uint64_t kvf_xxh_upto16(const uint8_t *in, uint64_t len,
                                   const uint8_t *sec)
{
    if (len > 8) {
        uint64_t lo =
            kvf_xxh_r64(in) ^ (kvf_xxh_r64(sec + 24) ^ kvf_xxh_r64(sec + 32));
        uint64_t hi = kvf_xxh_r64(in + len - 8) ^
                      (kvf_xxh_r64(sec + 40) ^ kvf_xxh_r64(sec + 48));
        uint64_t sw = 0;
        int i;

        for (i = 0; i < 8; i++) { /* byte swap of lo */
            sw |= ((lo >> (8 * i)) & 0xff) << (56 - 8 * i);
        }
        return kvf_xxh_avalanche(len + sw + hi + kvf_xxh_fold(lo, hi));
    }
    if (len >= 4) {
        uint64_t in64 = (uint64_t)kvf_xxh_r32(in + len - 4) +
                        ((uint64_t)kvf_xxh_r32(in) << 32);
        uint64_t h = in64 ^ (kvf_xxh_r64(sec + 8) ^ kvf_xxh_r64(sec + 16));

        h ^= ((h << 49) | (h >> 15)) ^ ((h << 24) | (h >> 40));
        h *= 0x9FB21C651E98DF25ull;
        h ^= (h >> 35) + len;
        h *= 0x9FB21C651E98DF25ull;
        return h ^ (h >> 28);
    }
    if (len > 0) {
        uint32_t c = ((uint32_t)in[0] << 16) | ((uint32_t)in[len >> 1] << 24) |
                     (uint32_t)in[len - 1] | ((uint32_t)len << 8);

        return kvf_xxh64_avalanche(
            (uint64_t)c ^ (uint64_t)(kvf_xxh_r32(sec) ^ kvf_xxh_r32(sec + 4)));
    }
    return kvf_xxh64_avalanche(kvf_xxh_r64(sec + 56) ^ kvf_xxh_r64(sec + 64));
}

/* Up to 240 bytes: XXH3's short and mid-size forms. */
KVF_XXH_FN uint64_t kvf_xxh_short(const uint8_t *in, uint64_t len,
                                  const uint8_t *sec)
{
    uint64_t acc = len * KVF_XXH_P64_1;
    unsigned i, rounds;

    if (len <= 16) {
        return kvf_xxh_upto16(in, len, sec);
    }
    if (len <= 128) {
        if (len > 32) {
            if (len > 64) {
                if (len > 96) {
                    acc += kvf_xxh_mix16(in + 48, sec + 96);
                    acc += kvf_xxh_mix16(in + len - 64, sec + 112);
                }
                acc += kvf_xxh_mix16(in + 32, sec + 64);
                acc += kvf_xxh_mix16(in + len - 48, sec + 80);
            }
            acc += kvf_xxh_mix16(in + 16, sec + 32);
            acc += kvf_xxh_mix16(in + len - 32, sec + 48);
        }
        acc += kvf_xxh_mix16(in, sec);
        acc += kvf_xxh_mix16(in + len - 16, sec + 16);
        return kvf_xxh_avalanche(acc);
    }
    rounds = (unsigned)len / 16;
    for (i = 0; i < 8; i++) {
        acc += kvf_xxh_mix16(in + 16 * i, sec + 16 * i);
    }
    acc = kvf_xxh_avalanche(acc);
    for (i = 8; i < rounds; i++) {
        acc += kvf_xxh_mix16(in + 16 * i, sec + 16 * (i - 8) + 3);
    }
    acc += kvf_xxh_mix16(in + len - 16, sec + 136 - 17);
    return kvf_xxh_avalanche(acc);
}

/* ---- the long form, by lane ------------------------------------------ */

/* Initial value of accumulator j (0..7). */
KVF_XXH_FN uint64_t kvf_xxh_init(unsigned j)
{
    switch (j) {
    case 0:
        return KVF_XXH_P32_3;
    case 1:
        return KVF_XXH_P64_1;
    case 2:
        return KVF_XXH_P64_2;
    case 3:
        return KVF_XXH_P64_3;
    case 4:
        return KVF_XXH_P64_4;
    case 5:
        return KVF_XXH_P32_2;
    case 6:
        return KVF_XXH_P64_5;
    default:
        return KVF_XXH_P32_1;
    }
}

/* The terms that words j = 2g and j + 1 of one stripe (d0, d1) add to
 * accumulators j and j + 1, with the stripe's keys k0, k1. */
KVF_XXH_FN void kvf_xxh_pair(uint64_t d0, uint64_t d1, uint64_t k0, uint64_t k1,
                             uint64_t *a0, uint64_t *a1)
{
    uint64_t x0 = d0 ^ k0, x1 = d1 ^ k1;

    *a0 += d1 + (x0 & 0xffffffffull) * (x0 >> 32);
    *a1 += d0 + (x1 & 0xffffffffull) * (x1 >> 32);
}

KVF_XXH_FN uint64_t kvf_xxh_scramble(uint64_t a, uint64_t key)
{
    a ^= a >> 47;
    a ^= key;
    return a * KVF_XXH_P32_1;
}

/* The keys a lane needs for a whole block: lane L (row r = L / 4, pair g
 * = L % 4) reads stripes r and r + 8 of each KiB (ka*, kb*), scrambles
 * its pair (ks*), adds XXH3's final stripe when r == 0 (kl*) and merges
 * its pair (km*). */
typedef struct kvf_xxh_keys {
    uint64_t ka0, ka1, kb0, kb1, ks0, ks1, kl0, kl1, km0, km1;
} kvf_xxh_keys_t;

KVF_XXH_FN void kvf_xxh_lane_keys(kvf_xxh_keys_t *k, unsigned lane,
                                  const uint8_t *sec)
{
    unsigned r = lane >> 2, g = lane & 3u;

    k->ka0 = kvf_xxh_r64(sec + 8 * (r + 2 * g));
    k->ka1 = kvf_xxh_r64(sec + 8 * (r + 2 * g + 1));
    k->kb0 = kvf_xxh_r64(sec + 8 * (r + 8 + 2 * g));
    k->kb1 = kvf_xxh_r64(sec + 8 * (r + 8 + 2 * g + 1));
    k->ks0 = kvf_xxh_r64(sec + KVF_XXH_SCRAMBLE + 16 * g);
    k->ks1 = kvf_xxh_r64(sec + KVF_XXH_SCRAMBLE + 16 * g + 8);
    k->kl0 = kvf_xxh_r64(sec + KVF_XXH_LASTACC + 16 * g);
    k->kl1 = kvf_xxh_r64(sec + KVF_XXH_LASTACC + 16 * g + 8);
    k->km0 = kvf_xxh_r64(sec + KVF_XXH_MERGE + 16 * g);
    k->km1 = kvf_xxh_r64(sec + KVF_XXH_MERGE + 16 * g + 8);
}

/* Full KiBs (scrambled after each) of a long input of len bytes. */
KVF_XXH_FN uint64_t kvf_xxh_full_kibs(uint64_t len)
{
    return (len - 1) / KVF_XXH_KIB;
}

/* Stripes of the last, partial KiB (before the final stripe). */
KVF_XXH_FN unsigned kvf_xxh_last_stripes(uint64_t len)
{
    return (unsigned)(((len - 1) % KVF_XXH_KIB) / 64);
}

/* Lane's merge term (its pair, once every KiB and stripe is in). */
KVF_XXH_FN uint64_t kvf_xxh_merge_term(const kvf_xxh_keys_t *k, uint64_t a0,
                                       uint64_t a1)
{
    return kvf_xxh_fold(a0 ^ k->km0, a1 ^ k->km1);
}

/* The value from the four merge terms' sum. */
KVF_XXH_FN uint64_t kvf_xxh_finish(uint64_t len, uint64_t terms)
{
    return kvf_xxh_avalanche(len * KVF_XXH_P64_1 + terms);
}

#endif
