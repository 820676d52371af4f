/*
 * The library's previous 64-bit checksum hash, for checksum_bench only.
 */
#ifndef KVF_TESTS_PERF_HASH_PREV_H
#define KVF_TESTS_PERF_HASH_PREV_H

#include <stddef.h>
#include <stdint.h>

uint64_t kvf_hash64_prev(const void *data, size_t len, uint64_t seed);

#endif
