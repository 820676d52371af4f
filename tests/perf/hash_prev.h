/*
 * For checksum_bench only: the library's previous 64-bit checksum hash,
 * and XXH3 built for AVX2.
 */
#ifndef KVF_TESTS_PERF_HASH_PREV_H
#define KVF_TESTS_PERF_HASH_PREV_H

#include <stddef.h>
#include <stdint.h>

uint64_t kvf_hash64_prev(const void *data, size_t len, uint64_t seed);
/* XXH3 64-bit, the AVX2 code path (xxh3_avx2.c). */
uint64_t kvf_xxh3_avx2(const void *data, size_t len);

#endif
