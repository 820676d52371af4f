/*
 * Unit test: frame headers and the bounds-checked reader/writer. Round
 * trips, then malformed input: bad magic, unknown version, oversized
 * lengths, truncated bodies, strings that do not fit; random garbage
 * never crashes and never reads past the buffer (run under ASan in CI).
 * Frame and payload tags equal AES-256-GCM's (OpenSSL's EVP cipher,
 * the header and metadata as additional data) across batches of
 * counter blocks, out-of-order sequence numbers and interleaved
 * payload tags. Checksums leave the vector registers' upper halves
 * clear (core/checksum.c says why). The seeded fill lays down the
 * generator's outputs in order and leaves it where they end.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "core/alloc.h"
#include "core/checksum.h"
#include "core/rng.h"
#include "core/wire.h"

#include <openssl/evp.h>

static void test_frame_roundtrip(void **state)
{
    unsigned char buf[KVF_WIRE_HDR_LEN];
    kvf_frame_hdr_t h = {KVF_WIRE_MAGIC,        KVF_WIRE_VERSION, 7,   3, 48, 3,
                         0x1122334455667788ull, 1ull << 33,       -41, 0};
    kvf_frame_hdr_t out;

    (void)state;
    kvf_frame_pack(&h, buf);
    assert_int_equal(kvf_frame_unpack(buf, &out), KVF_OK);
    assert_int_equal(out.type, 7);
    assert_int_equal(out.flags, 3);
    assert_int_equal(out.meta_len, 48);
    assert_int_equal(out.count, 3);
    assert_true(out.id == 0x1122334455667788ull);
    assert_true(out.data_len == (1ull << 33));
    assert_int_equal(out.status, -41);
    /* little endian on the wire: magic bytes spell KVFR */
    assert_memory_equal(buf, "KVFR", 4);
}

static void test_frame_malformed(void **state)
{
    unsigned char buf[KVF_WIRE_HDR_LEN];
    kvf_frame_hdr_t h = {
        KVF_WIRE_MAGIC, KVF_WIRE_VERSION, 1, 0, 0, 0, 0, 0, 0, 0};
    kvf_frame_hdr_t out = {0};

    (void)state;
    kvf_frame_pack(&h, buf);
    buf[0] ^= 0xff;
    assert_int_equal(kvf_frame_unpack(buf, &out), KVF_ERR_PROTOCOL);
    kvf_frame_pack(&h, buf);
    buf[4] = 9;
    assert_int_equal(kvf_frame_unpack(buf, &out), KVF_ERR_VERSION);
    h.meta_len = KVF_WIRE_META_MAX + 1;
    kvf_frame_pack(&h, buf);
    assert_int_equal(kvf_frame_unpack(buf, &out), KVF_ERR_MSG_TOO_LARGE);
    h.meta_len = 0;
    h.data_len = KVF_WIRE_DATA_MAX + 1;
    kvf_frame_pack(&h, buf);
    assert_int_equal(kvf_frame_unpack(buf, &out), KVF_ERR_MSG_TOO_LARGE);
    /* output untouched on failure */
    assert_int_equal(out.type, 0);
}

static void test_rd_wr(void **state)
{
    char s[16];
    kvf_wr_t w;
    kvf_rd_t r;

    (void)state;
    kvf_wr_init(&w);
    kvf_wr_u8(&w, 0xab);
    kvf_wr_u16(&w, 0xbeef);
    kvf_wr_u32(&w, 0xdeadbeef);
    kvf_wr_u64(&w, 0x0102030405060708ull);
    kvf_wr_str(&w, "segment");
    assert_int_equal(kvf_wr_status(&w), KVF_OK);
    kvf_rd_init(&r, w.buf, w.len);
    assert_int_equal(kvf_rd_u8(&r), 0xab);
    assert_int_equal(kvf_rd_u16(&r), 0xbeef);
    assert_true(kvf_rd_u32(&r) == 0xdeadbeef);
    assert_true(kvf_rd_u64(&r) == 0x0102030405060708ull);
    kvf_rd_str(&r, s, sizeof(s));
    assert_string_equal(s, "segment");
    assert_int_equal(kvf_rd_status(&r), KVF_OK);
    assert_int_equal(kvf_rd_left(&r), 0);
    /* reading past the end latches an error and returns zeros */
    assert_int_equal(kvf_rd_u32(&r), 0);
    assert_int_equal(kvf_rd_status(&r), KVF_ERR_PROTOCOL);
    /* truncated string */
    kvf_rd_init(&r, w.buf, w.len - 2);
    kvf_rd_u8(&r);
    kvf_rd_u16(&r);
    kvf_rd_u32(&r);
    kvf_rd_u64(&r);
    kvf_rd_str(&r, s, sizeof(s));
    assert_int_equal(kvf_rd_status(&r), KVF_ERR_PROTOCOL);
    assert_string_equal(s, "");
    /* string longer than the output buffer */
    kvf_rd_init(&r, w.buf + 15, w.len - 15);
    kvf_rd_str(&r, s, 4);
    assert_int_equal(kvf_rd_status(&r), KVF_ERR_PROTOCOL);
    kvf_wr_free(&w);
}

static void test_rd_garbage(void **state)
{
    unsigned char buf[64];
    char s[32];
    kvf_rng_t rng;
    kvf_rd_t r;
    int i, k;

    (void)state;
    kvf_rng_seed(&rng, 42);
    for (i = 0; i < 10000; i++) {
        size_t n = kvf_rng_below(&rng, sizeof(buf) + 1);

        kvf_rng_fill(&rng, buf, sizeof(buf));
        kvf_rd_init(&r, buf, n);
        for (k = 0; k < 8; k++) {
            switch (kvf_rng_below(&rng, 4)) {
            case 0:
                kvf_rd_u64(&r);
                break;
            case 1:
                kvf_rd_str(&r, s, sizeof(s));
                break;
            case 2:
                kvf_rd_bytes(&r, kvf_rng_below(&rng, 100));
                break;
            default:
                kvf_rd_u16(&r);
                break;
            }
        }
        assert_true(r.off <= n);
    }
}

/* kvf_rng_fill: each 8 bytes are the next output, least significant
 * byte first, a short tail the low bytes of one more; the generator is
 * left after them, as if kvf_rng_next had made them one by one. */
static void test_rng_fill_sequence(void **state)
{
    unsigned char buf[8 * 5 + 3];
    kvf_rng_t fill, step;
    uint64_t v;
    size_t i, b;

    (void)state;
    kvf_rng_seed(&fill, 99);
    kvf_rng_seed(&step, 99);
    kvf_rng_fill(&fill, buf, sizeof(buf));
    for (i = 0; i < sizeof(buf); i += 8) {
        v = kvf_rng_next(&step);
        for (b = 0; b < 8 && i + b < sizeof(buf); b++) {
            assert_int_equal(buf[i + b], (unsigned char)(v >> (8 * b)));
        }
    }
    assert_true(kvf_rng_next(&fill) == kvf_rng_next(&step));
}

static void test_hash(void **state)
{
    unsigned char a[4096], b[4096];
    kvf_rng_t rng;
    size_t n;

    (void)state;
    kvf_rng_seed(&rng, 7);
    kvf_rng_fill(&rng, a, sizeof(a));
    memcpy(b, a, sizeof(a));
    for (n = 0; n <= 100; n++) {
        assert_true(kvf_hash64(a, n, 0) == kvf_hash64(b, n, 0));
    }
    assert_true(kvf_hash64(a, sizeof(a), 0) == kvf_hash64(b, sizeof(b), 0));
    /* one flipped bit anywhere changes the sum */
    for (n = 0; n < sizeof(a); n += 97) {
        b[n] ^= 0x10;
        assert_true(kvf_hash64(a, sizeof(a), 0) != kvf_hash64(b, sizeof(b), 0));
        b[n] ^= 0x10;
    }
}

/* 1 when this CPU tells which parts of the vector state are in use
 * (XGETBV with ECX = 1) and libxxhash's wide paths run there (AVX2). */
static int vec_state_known(void)
{
#if defined(__x86_64__)
    unsigned a, b, c, d;

    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || __get_cpuid_max(0, NULL) < 0xd) {
        return 0;
    }
    __cpuid_count(0xd, 1, a, b, c, d);
    (void)b;
    (void)c;
    (void)d;
    return (a & 4u) != 0;
#else
    return 0;
#endif
}

/* The upper halves of the vector registers (YMM and ZMM, components 2
 * and 6 of XINUSE) that make legacy-SSE code wait on a merge. */
static uint64_t vec_upper_in_use(void)
{
#if defined(__x86_64__)
    unsigned lo, hi;

    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
    return (((uint64_t)hi << 32) | lo) & ((1u << 2) | (1u << 6));
#else
    return 0;
#endif
}

/* Every checksum entry returns with the vector registers' upper halves
 * cleared, whatever path libxxhash took: left in use, the thread's
 * legacy-SSE code (frame tags among it) runs several times slower. */
static void test_hash_leaves_vectors_clean(void **state)
{
    static unsigned char a[1u << 20], b[1u << 20];
    uint64_t h[4], dirty[4];

    (void)state;
    if (!vec_state_known()) {
        skip();
    }
    memset(a, 0x5a, sizeof(a));
    h[0] = kvf_hash64(a, 4096, 0);
    dirty[0] = vec_upper_in_use();
    h[1] = kvf_checksum(a, 65536);
    dirty[1] = vec_upper_in_use();
    h[2] = kvf_copy_checksum(b, a, 4096);
    dirty[2] = vec_upper_in_use();
    h[3] = kvf_copy_checksum(b, a, sizeof(a)); /* piece by piece */
    dirty[3] = vec_upper_in_use();
    assert_true(h[0] == kvf_hash64_generic(a, 4096, 0));
    assert_true(h[1] == kvf_hash64_generic(a, 65536, 0));
    assert_true(h[2] == h[0]);
    assert_true(h[3] == kvf_hash64_generic(a, sizeof(a), 0));
    assert_int_equal(dirty[0], 0);
    assert_int_equal(dirty[1], 0);
    assert_int_equal(dirty[2], 0);
    assert_int_equal(dirty[3], 0);
}

/* The wide path (>= 256 bytes): SIMD and portable code agree at every
 * length and alignment and for other seeds; every single-bit flip of a
 * 64 KiB value, in any stripe, word and bit, changes the sum; the length
 * counts (a value and its prefix differ); the same stripes or 8 KiB
 * blocks in another order change it. */
static void test_hash_wide(void **state)
{
    static unsigned char a[65536 + 64], b[65536 + 64];
    uint64_t h0, seed;
    kvf_rng_t rng;
    size_t n, off, bit;
    int i;

    (void)state;
    kvf_rng_seed(&rng, 11);
    kvf_rng_fill(&rng, a, sizeof(a));
    for (n = 0; n <= 4096; n += (n < 600 ? 1 : 37)) {
        for (off = 0; off < 8; off += 3) {
            seed = kvf_rng_next(&rng);
            assert_true(kvf_hash64(a + off, n, seed) ==
                        kvf_hash64_generic(a + off, n, seed));
        }
    }
    assert_true(kvf_hash64(a, 65536, 0) == kvf_hash64_generic(a, 65536, 0));
    memcpy(b, a, sizeof(a));
    h0 = kvf_hash64(a, 65536, 0);
    assert_true(h0 != kvf_hash64(a, 65535, 0));
    assert_true(h0 != kvf_hash64(a, 65536, 1));
    for (i = 0; i < 3000; i++) {
        bit = (size_t)kvf_rng_below(&rng, 65536 * 8);
        b[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        assert_true(kvf_hash64(b, 65536, 0) != h0);
        b[bit / 8] ^= (unsigned char)(1u << (bit % 8));
    }
    assert_true(kvf_hash64(b, 65536, 0) == h0);
    /* a word swapped with its neighbour (same words, other places) */
    memcpy(b, a + 8, 8);
    memcpy(b + 8, a, 8);
    assert_true(kvf_hash64(b, 65536, 0) != h0);
    /* whole stripes and whole 8 KiB blocks in another order: the same
     * bytes at other places change the sum (an earlier sum added the
     * stripes' products in any order and missed these) */
    for (i = 0; i < 200; i++) {
        size_t s1 = (size_t)kvf_rng_below(&rng, 1024) * 64,
               s2 = (size_t)kvf_rng_below(&rng, 1024) * 64;

        if (s1 == s2 || memcmp(a + s1, a + s2, 64) == 0) {
            continue;
        }
        memcpy(b, a, 65536);
        memcpy(b + s1, a + s2, 64);
        memcpy(b + s2, a + s1, 64);
        assert_true(kvf_hash64(b, 65536, 0) != h0);
        assert_true(kvf_hash64_generic(b, 65536, 0) != h0);
    }
    for (n = 0; n < 8; n++) {
        memcpy(b, a, 65536);
        memcpy(b + n * 8192, a + ((n + 3) % 8) * 8192, 8192);
        memcpy(b + ((n + 3) % 8) * 8192, a + n * 8192, 8192);
        assert_true(kvf_hash64(b, 65536, 0) != h0);
    }
    memcpy(b, a, 65536);
    assert_true(kvf_hash64(b, 65536, 0) == h0);
}

/* A writer over a fixed buffer fails by itself when the buffer is full;
 * kvf_rd_end refuses short and long input. */
static void test_wr_fixed_rd_end(void **state)
{
    unsigned char buf[12];
    kvf_wr_t w;
    kvf_rd_t r;

    (void)state;
    kvf_wr_init_fixed(&w, buf, sizeof(buf));
    kvf_wr_u64(&w, 0x0102030405060708ull);
    kvf_wr_u32(&w, 0x0a0b0c0d);
    assert_int_equal(kvf_wr_status(&w), KVF_OK);
    assert_int_equal(w.len, 12);
    kvf_wr_u8(&w, 1); /* one past the end */
    assert_int_equal(kvf_wr_status(&w), KVF_ERR_MSG_TOO_LARGE);
    assert_int_equal(w.len, 12);
    kvf_wr_free(&w); /* never frees the caller's buffer */
    assert_int_equal(buf[0], 0x08);

    kvf_rd_init(&r, buf, sizeof(buf));
    assert_true(kvf_rd_u64(&r) == 0x0102030405060708ull);
    assert_int_equal(kvf_rd_end(&r), KVF_ERR_PROTOCOL); /* 4 bytes left */
    assert_int_equal(kvf_rd_u32(&r), 0x0a0b0c0d);
    assert_int_equal(kvf_rd_end(&r), KVF_OK);
    assert_int_equal(kvf_rd_u8(&r), 0); /* short: latches */
    assert_int_equal(kvf_rd_end(&r), KVF_ERR_PROTOCOL);
}

/* Largest metadata the tag tests feed: past two groups of eight GHASH
 * blocks. */
#define META_MAX 2100

/* AES-256-GCM's tag under key over aad, nonce (dom, seq) little-endian:
 * the reference a frame or payload tag must equal. */
static void gcm_ref(const unsigned char *key, uint32_t dom, uint64_t seq,
                    const unsigned char *aad, size_t len, unsigned char *tag)
{
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    unsigned char iv[12];
    int i, outl;

    for (i = 0; i < 4; i++) {
        iv[i] = (unsigned char)(dom >> (8 * i));
    }
    for (i = 0; i < 8; i++) {
        iv[4 + i] = (unsigned char)(seq >> (8 * i));
    }
    assert_non_null(c);
    assert_int_equal(EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, iv),
                     1);
    assert_int_equal(EVP_EncryptUpdate(c, NULL, &outl, aad, (int)len), 1);
    assert_int_equal(EVP_EncryptFinal_ex(c, NULL, &outl), 1);
    assert_int_equal(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, tag), 1);
    EVP_CIPHER_CTX_free(c);
}

/* A frame's tag by reference: GCM's tag over the header and len bytes
 * of metadata, zero-padded to whole 16-byte blocks. */
static void frame_ref(const unsigned char *key, uint64_t seq,
                      const unsigned char *frame, size_t len,
                      unsigned char *tag)
{
    unsigned char padded[KVF_WIRE_HDR_LEN + META_MAX + 16] = {0};
    size_t all = KVF_WIRE_HDR_LEN + len;

    memcpy(padded, frame, all);
    gcm_ref(key, 0x4d52464bu, seq, padded, (all + 15) / 16 * 16, tag);
}

static void wire_mac_equals_gcm(void)
{
    static const size_t lens[] = {0, 1, 24, 216, 217, 600};
    unsigned char k1[KVF_WIRE_KEY_LEN], k2[KVF_WIRE_KEY_LEN];
    unsigned char buf[KVF_WIRE_HDR_LEN + 600], tag[16], want[16];
    kvf_wire_mac_t a, b;
    kvf_wire_pmac_t p;
    uint64_t i;
    size_t len;

    memset(k1, 0x11, sizeof(k1));
    memset(k2, 0x22, sizeof(k2));
    for (i = 0; i < sizeof(buf); i++) {
        buf[i] = (unsigned char)(i * 7 + 3);
    }
    assert_int_equal(kvf_wire_mac_init(&a, k1, k2), KVF_OK);
    assert_int_equal(kvf_wire_mac_init(&b, k2, k1), KVF_OK);
    for (i = 0; i < 140; i++) { /* past several batches */
        len = lens[i % 6];
        buf[0] = (unsigned char)i;
        kvf_wire_mac_seal(&a, buf, buf + KVF_WIRE_HDR_LEN, len, tag);
        frame_ref(k1, i, buf, len, want);
        assert_memory_equal(tag, want, 16);
        assert_int_equal(kvf_wire_mac_check(&b, buf, buf + KVF_WIRE_HDR_LEN,
                                            len, tag, "test"),
                         KVF_OK);
        if (i % 5 == 2) { /* a payload tag between frame tags */
            kvf_wire_pmac_begin(&a, 1, &p);
            kvf_wire_pmac_update(&p, buf, 100);
            kvf_wire_pmac_update(&p, buf + 100, 33);
            assert_int_equal(kvf_wire_pmac_end(&p, 0, tag), KVF_OK);
            gcm_ref(k1, 0x4459504bu, i, buf, 133, want);
            assert_memory_equal(tag, want, 16);
        }
    }
    /* a number out of order (a fresh batch), then back */
    a.tx_seq = 1000;
    kvf_wire_mac_seal(&a, buf, NULL, 0, tag);
    frame_ref(k1, 1000, buf, 0, want);
    assert_memory_equal(tag, want, 16);
    a.tx_seq = 3;
    kvf_wire_mac_seal(&a, buf, buf + KVF_WIRE_HDR_LEN, 24, tag);
    frame_ref(k1, 3, buf, 24, want);
    assert_memory_equal(tag, want, 16);
    /* one byte changed: refused */
    kvf_wire_mac_seal(&a, buf, buf + KVF_WIRE_HDR_LEN, 24, tag);
    b.rx_seq = 4;
    buf[KVF_WIRE_HDR_LEN + 5] ^= 1;
    assert_int_equal(
        kvf_wire_mac_check(&b, buf, buf + KVF_WIRE_HDR_LEN, 24, tag, "test"),
        KVF_ERR_AUTH);
    kvf_wire_mac_free(&a);
    kvf_wire_mac_free(&b);
}

/* Both ways of computing a frame tag (core/ghash.c where the CPU has
 * it, OpenSSL's GCM) equal the reference. */
static void test_wire_mac_equals_gcm(void **state)
{
    (void)state;
    wire_mac_equals_gcm();
    kvf_wire_mac_openssl_only(1);
    wire_mac_equals_gcm();
    kvf_wire_mac_openssl_only(0);
}

/* Random keys, sequence numbers and frames of 0 to META_MAX bytes of
 * metadata (every count of GHASH blocks in a group, several groups):
 * each tag equals the reference, and the receiver accepts it. */
static void test_wire_mac_random(void **state)
{
    unsigned char k1[KVF_WIRE_KEY_LEN], k2[KVF_WIRE_KEY_LEN];
    unsigned char buf[KVF_WIRE_HDR_LEN + META_MAX], tag[16], want[16];
    kvf_rng_t rng;
    kvf_wire_mac_t a, b;
    size_t i, len;
    int round;

    (void)state;
    kvf_rng_seed(&rng, 37);
    for (round = 0; round < 40; round++) {
        kvf_rng_fill(&rng, k1, sizeof(k1));
        kvf_rng_fill(&rng, k2, sizeof(k2));
        assert_int_equal(kvf_wire_mac_init(&a, k1, k2), KVF_OK);
        assert_int_equal(kvf_wire_mac_init(&b, k2, k1), KVF_OK);
        a.tx_seq = b.rx_seq = kvf_rng_next(&rng) >> 2;
        for (i = 0; i < 25; i++) {
            len = (size_t)kvf_rng_below(&rng, META_MAX + 1);
            kvf_rng_fill(&rng, buf, KVF_WIRE_HDR_LEN + len);
            frame_ref(k1, a.tx_seq, buf, len, want);
            kvf_wire_mac_seal(&a, buf, buf + KVF_WIRE_HDR_LEN, len, tag);
            assert_memory_equal(tag, want, 16);
            assert_int_equal(kvf_wire_mac_check(&b, buf, buf + KVF_WIRE_HDR_LEN,
                                                len, tag, "test"),
                             KVF_OK);
        }
        kvf_wire_mac_free(&a);
        kvf_wire_mac_free(&b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frame_roundtrip),
        cmocka_unit_test(test_frame_malformed),
        cmocka_unit_test(test_rd_wr),
        cmocka_unit_test(test_rd_garbage),
        cmocka_unit_test(test_wr_fixed_rd_end),
        cmocka_unit_test(test_rng_fill_sequence),
        cmocka_unit_test(test_hash),
        cmocka_unit_test(test_hash_wide),
        cmocka_unit_test(test_hash_leaves_vectors_clean),
        cmocka_unit_test(test_wire_mac_equals_gcm),
        cmocka_unit_test(test_wire_mac_random),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
