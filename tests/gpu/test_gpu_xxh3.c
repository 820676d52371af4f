/*
 * Unit test (label unit, no GPU needed): the warp decomposition of
 * XXH3-64 that the checksumming copy kernels use (mem/cuda/xxh3.h) gives
 * exactly kvf_checksum() for every length class (0, 1-3, 4-8, 9-16,
 * 17-128, 129-240, long with every remainder), at any alignment. The
 * 32 lanes and their shuffles are emulated in the order kern.cu runs
 * them. Also the fused host copy + checksum (kvf_copy_checksum): the
 * destination equals the source and the value equals kvf_checksum().
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "core/checksum.h"
#include "mem/cuda/xxh3.h"

static const uint8_t sec[192] = KVF_XXH_SECRET_BYTES;

/* Lane L's terms for the two vectors of stripes (r, r + 8) at p. */
static void lane_kib(const uint8_t *p, unsigned lane, const kvf_xxh_keys_t *k,
                     uint64_t *c0, uint64_t *c1)
{
    const uint8_t *va = p + 16 * lane, *vb = p + 16 * (lane + 32);

    kvf_xxh_pair(kvf_xxh_r64(va), kvf_xxh_r64(va + 8), k->ka0, k->ka1, c0, c1);
    kvf_xxh_pair(kvf_xxh_r64(vb), kvf_xxh_r64(vb + 8), k->kb0, k->kb1, c0, c1);
}

/* Sum over the 8 lanes of each pair (the kernel's xor shuffles 4, 8, 16
 * give every lane this same value). */
static void reduce(uint64_t c0[32], uint64_t c1[32])
{
    uint64_t s0[4] = {0}, s1[4] = {0};
    unsigned l;

    for (l = 0; l < 32; l++) {
        s0[l & 3] += c0[l];
        s1[l & 3] += c1[l];
    }
    for (l = 0; l < 32; l++) {
        c0[l] = s0[l & 3];
        c1[l] = s1[l & 3];
    }
}

static uint64_t warp_hash(const uint8_t *p, uint64_t len)
{
    kvf_xxh_keys_t k[32];
    uint64_t a0[32], a1[32], c0[32], c1[32], nfull, kb, terms = 0;
    unsigned l, ns;

    if (len <= KVF_XXH_SHORT) {
        return kvf_xxh_short(p, len, sec);
    }
    for (l = 0; l < 32; l++) {
        kvf_xxh_lane_keys(&k[l], l, sec);
        a0[l] = kvf_xxh_init(2 * (l & 3));
        a1[l] = kvf_xxh_init(2 * (l & 3) + 1);
    }
    nfull = kvf_xxh_full_kibs(len);
    for (kb = 0; kb < nfull; kb++) {
        for (l = 0; l < 32; l++) {
            c0[l] = c1[l] = 0;
            lane_kib(p + kb * KVF_XXH_KIB, l, &k[l], &c0[l], &c1[l]);
        }
        reduce(c0, c1);
        for (l = 0; l < 32; l++) {
            a0[l] = kvf_xxh_scramble(a0[l] + c0[l], k[l].ks0);
            a1[l] = kvf_xxh_scramble(a1[l] + c1[l], k[l].ks1);
        }
    }
    ns = kvf_xxh_last_stripes(len);
    for (l = 0; l < 32; l++) {
        const uint8_t *q = p + nfull * KVF_XXH_KIB + 16 * (l & 3);
        unsigned r = l >> 2;

        c0[l] = c1[l] = 0;
        if (r < ns) {
            kvf_xxh_pair(kvf_xxh_r64(q + 64 * r), kvf_xxh_r64(q + 64 * r + 8),
                         k[l].ka0, k[l].ka1, &c0[l], &c1[l]);
        }
        if (r + 8 < ns) {
            q += 64 * (r + 8);
            kvf_xxh_pair(kvf_xxh_r64(q), kvf_xxh_r64(q + 8), k[l].kb0, k[l].kb1,
                         &c0[l], &c1[l]);
        }
        if (r == 0) {
            q = p + len - 64 + 16 * l;
            kvf_xxh_pair(kvf_xxh_r64(q), kvf_xxh_r64(q + 8), k[l].kl0, k[l].kl1,
                         &c0[l], &c1[l]);
        }
    }
    reduce(c0, c1);
    for (l = 0; l < 4; l++) {
        terms += kvf_xxh_merge_term(&k[l], a0[l] + c0[l], a1[l] + c1[l]);
    }
    return kvf_xxh_finish(len, terms);
}

static void test_lengths(void **state)
{
    size_t cap = 70000, len;
    uint8_t *buf = malloc(cap + 16);
    unsigned off;
    size_t i;

    (void)state;
    assert_non_null(buf);
    for (i = 0; i < cap + 16; i++) {
        buf[i] = (uint8_t)(i * 2654435761u >> 13);
    }
    for (off = 0; off < 16; off += 5) {
        for (len = 0; len <= 2200; len++) {
            assert_true(warp_hash(buf + off, len) ==
                        kvf_checksum(buf + off, len));
        }
    }
    {
        static const size_t big[] = {3071, 3072,  3073,  4095,  4096, 4097,
                                     8192, 32768, 32769, 65536, 70000};

        for (i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
            assert_true(warp_hash(buf + 3, big[i]) ==
                        kvf_checksum(buf + 3, big[i]));
            assert_true(warp_hash(buf, big[i]) == kvf_checksum(buf, big[i]));
        }
    }
    free(buf);
}

static void test_copy_checksum(void **state)
{
    static const size_t lens[] = {0,
                                  1,
                                  17,
                                  240,
                                  241,
                                  4096,
                                  65535,
                                  65536,
                                  1 << 20,
                                  (1 << 20) + 7,
                                  (3 << 20) + 123};
    size_t cap = (3 << 20) + 256, i;
    uint8_t *src = malloc(cap), *dst = malloc(cap);

    (void)state;
    assert_non_null(src);
    assert_non_null(dst);
    for (i = 0; i < cap; i++) {
        src[i] = (uint8_t)(i * 40503u >> 7);
    }
    for (i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        memset(dst, 0xee, cap);
        assert_true(kvf_copy_checksum(dst + 1, src + 5, lens[i]) ==
                    kvf_checksum(src + 5, lens[i]));
        assert_memory_equal(dst + 1, src + 5, lens[i]);
        assert_int_equal(dst[1 + lens[i]], 0xee);
    }
    free(src);
    free(dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lengths),
        cmocka_unit_test(test_copy_checksum),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
