/*
 * GHASH, the universal hash under GCM (NIST SP 800-38D, section 6.4),
 * with the x86-64 carry-less multiply (PCLMULQDQ): what a frame tag of
 * tens of bytes costs is then a few multiplications, not the fixed work
 * of OpenSSL's GCM calls around them (core/wire_mac.c says when each is
 * used). Blocks are folded eight at a time against precomputed powers
 * of H, with one reduction per group. Only the hash is here: the AES
 * block that masks it comes from OpenSSL.
 */
#ifndef KVF_CORE_GHASH_H
#define KVF_CORE_GHASH_H
#if !defined(KVF_INTERNAL) && !defined(KVF_TEST_INTERNALS)
#error "core/ghash.h is internal to kvferry: use <kvferry/*.h>"
#endif

#include <stddef.h>
#include <stdint.h>

#define KVF_GHASH_POWERS 8

/* H^1 .. H^8, in the byte order the multiplication works in. */
typedef struct kvf_ghash_key {
    _Alignas(16) unsigned char hpow[KVF_GHASH_POWERS][16];
} kvf_ghash_key_t;

/* The running hash (zero at the start), in the same byte order. */
typedef struct kvf_ghash {
    _Alignas(16) unsigned char y[16];
} kvf_ghash_t;

/* 1 when this CPU has the instructions (PCLMULQDQ, AVX); the other
 * calls are made only then. */
int kvf_ghash_available(void);

/* k from the hash key h = AES_K(0^128). */
void kvf_ghash_init(kvf_ghash_key_t *k, const unsigned char h[16]);

/* Folds nblocks whole 16-byte blocks at p into g. */
void kvf_ghash_blocks(const kvf_ghash_key_t *k, kvf_ghash_t *g,
                      const unsigned char *p, size_t nblocks);

/* GCM's length block: aad_bytes of additional data, no ciphertext. It
 * is the last block a GMAC folds. */
void kvf_ghash_length_block(uint64_t aad_bytes, unsigned char b[16]);

/* A GMAC's tag: the hash g (length block folded) xor ek0, AES_K of the
 * first counter block. */
void kvf_ghash_tag(const kvf_ghash_t *g, const unsigned char ek0[16],
                   unsigned char tag[16]);

#endif
