/*
 * XXH3 64-bit compiled inline for AVX2 (this file only is built with
 * -mavx2), so checksum_bench can show what a host with AVX2 but without
 * AVX-512 gets from the dispatched entry.
 */
#define XXH_INLINE_ALL
#define XXH_VECTOR 2 /* XXH_AVX2 */
#include <xxhash.h>

#include "tests/perf/hash_prev.h"

uint64_t kvf_xxh3_avx2(const void *data, size_t len)
{
    return XXH3_64bits(data, len);
}
