/*
 * kvf_hash64: four independent multiply-rotate lanes over 32-byte stripes,
 * merged and finished with an avalanche step; fast enough to checksum
 * blocks at memory speed. kvf_rng_fill writes 8 bytes per step.
 */
#include "core/hash.h"

#include <string.h>

#define KVF_P1 0x9e3779b185ebca87ull
#define KVF_P2 0xc2b2ae3d27d4eb4full
#define KVF_P3 0x165667b19e3779f9ull
#define KVF_P4 0x85ebca77c2b2ae63ull
#define KVF_P5 0x27d4eb2f165667c5ull

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

uint64_t kvf_hash64(const void *data, size_t len, uint64_t seed)
{
    const unsigned char *p = data, *end = p + len;
    uint64_t h, a, b, c, d, tail;

    if (len >= 32) {
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

void kvf_rng_fill(kvf_rng_t *r, void *buf, size_t len)
{
    unsigned char *p = buf;
    uint64_t v;

    while (len >= 8) {
        v = kvf_rng_next(r);
        memcpy(p, &v, 8);
        p += 8;
        len -= 8;
    }
    if (len > 0) {
        v = kvf_rng_next(r);
        memcpy(p, &v, len);
    }
}
