/*
 * A small seeded pseudo-random generator (splitmix64) for benchmarks,
 * tests and fault injection, so that a run reproduces from its seed.
 */
#ifndef KVF_CORE_RNG_H
#define KVF_CORE_RNG_H
#if !defined(KVF_INTERNAL) && !defined(KVF_TEST_INTERNALS)
#error "core/rng.h is internal to kvferry: use <kvferry/*.h>"
#endif

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t s;
} kvf_rng_t;

static inline void kvf_rng_seed(kvf_rng_t *r, uint64_t seed)
{
    r->s = seed ? seed : 0x9e3779b97f4a7c15ull;
}

static inline uint64_t kvf_rng_next(kvf_rng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n). */
static inline uint64_t kvf_rng_below(kvf_rng_t *r, uint64_t n)
{
    return n ? kvf_rng_next(r) % n : 0;
}

/* Fills buf with pseudo-random bytes from the generator, 8 per step. */
void kvf_rng_fill(kvf_rng_t *r, void *buf, size_t len);

#endif
