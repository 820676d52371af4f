/*
 * The commands' seeded generator (splitmix64): pools, keys and injected
 * faults are reproducible from --seed, and a target spawned with the same
 * seed fills its pool with the same bytes, so a bench can verify data it
 * never moved back.
 */
#ifndef KVF_TOOLS_RNG_H
#define KVF_TOOLS_RNG_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uint64_t s;
} kvf_prng_t;

static inline void kvf_prng_seed(kvf_prng_t *r, uint64_t seed)
{
    r->s = seed ? seed : 0x9e3779b97f4a7c15ull;
}

static inline uint64_t kvf_prng_next(kvf_prng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t kvf_prng_below(kvf_prng_t *r, uint64_t n)
{
    return n ? kvf_prng_next(r) % n : 0;
}

/* Fills buf with the generator's output, 8 bytes per step. */
static inline void kvf_prng_fill(kvf_prng_t *r, void *buf, size_t len)
{
    unsigned char *p = buf;
    uint64_t v;

    while (len >= 8) {
        v = kvf_prng_next(r);
        memcpy(p, &v, 8);
        p += 8;
        len -= 8;
    }
    if (len > 0) {
        v = kvf_prng_next(r);
        memcpy(p, &v, len);
    }
}

#endif
