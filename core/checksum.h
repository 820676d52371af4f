/*
 * 64-bit non-cryptographic hash for checksums of blocks and objects (and
 * for hash tables and ids): xxHash's XXH3, which the measurements in
 * docs/decisions/config-checksum.md found faster than the hand-written
 * hash it replaced. kvf_checksum() (public, kvferry/engine.h) is
 * kvf_hash64 with seed 0; every side of a checksum comparison (store
 * put/get, SUM requests, GPU staging) computes that same value.
 */
#ifndef KVF_CORE_CHECKSUM_H
#define KVF_CORE_CHECKSUM_H
#if !defined(KVF_INTERNAL) && !defined(KVF_TEST_INTERNALS)
#error "core/checksum.h is internal to kvferry: use <kvferry/*.h>"
#endif

#include <kvferry/status.h>

#include <stddef.h>
#include <stdint.h>

/* kvf_hash64(data, length, 0): the public checksum, declared for
 * applications in kvferry/engine.h. */
KVF_API uint64_t kvf_checksum(const void *data, size_t length);

/* XXH3 64-bit with a seed, using the widest vector unit of the CPU. */
uint64_t kvf_hash64(const void *data, size_t len, uint64_t seed);
/* The same value computed with the baseline x86-64 code path (tests
 * compare the two). */
uint64_t kvf_hash64_generic(const void *data, size_t len, uint64_t seed);

/* Copies len bytes from src to dst and returns kvf_checksum() of them,
 * hashing each piece right after copying it while it is still in the
 * CPU's cache: one pass over the source instead of a copy and then a
 * second read for the checksum. The buffers must not overlap. */
uint64_t kvf_copy_checksum(void *dst, const void *src, size_t len);

#endif
