/*
 * What the frame tags of authenticated connections cost (core/wire.h,
 * core/wire_mac.c): sealing and checking one frame (the 40-byte header
 * plus a body of the sizes the protocols send: one tcp entry, a store
 * RPC body, a 1 MiB request's 128 entries, 2048 entries), and the
 * payload tag (auth_payload_mac) over 8 KiB, 1 MiB and 16 MiB, beside
 * memcpy and the per-block checksum (kvf_hash64) of the same bytes.
 * Rounds interleave the cells so machine noise falls on all of them;
 * each cell is the median of the rounds. The "cold" cell seals and
 * checks a 64-byte body right after reading 8 MiB elsewhere, as a
 * server's tag is computed after the kernel's work for the frame has
 * pushed the keys out of the core's own caches: the median of single
 * timed pairs. The "after XXH3" cells seal and check a 16-byte body
 * after one call of libxxhash's XXH3 over 4 KiB, straight and through
 * kvf_hash64 (core/checksum.c: the library leaves the vector registers'
 * upper halves in use, and kvf_hash64 clears them).
 * Usage: wire_mac_bench [rounds (default 7)]
 */
#include "core/checksum.h"
#include "core/wire.h"

#define XXH_DISPATCH_DISABLE_REPLACE 1
#include <xxh_x86dispatch.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ROUNDS_MAX  64
#define COLD_PAIRS  2000
#define SWEEP_BYTES ((size_t)8 << 20)

static double now_s(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ns per seal + check of a frame with a body of len bytes. */
static double frame_ns(kvf_wire_mac_t *tx, kvf_wire_mac_t *rx,
                       const unsigned char *body, size_t len)
{
    unsigned char hdr[KVF_WIRE_HDR_LEN] = {'K', 'V', 'F', 'R', 1};
    unsigned char tag[KVF_WIRE_TAG_LEN];
    long i, n = len > 4096 ? 20000 : 200000;
    double t = now_s();

    for (i = 0; i < n; i++) {
        hdr[16] = (unsigned char)i;
        kvf_wire_mac_seal(tx, hdr, body, len, tag);
        if (kvf_wire_mac_check(rx, hdr, body, len, tag, "bench") != KVF_OK) {
            abort();
        }
    }
    return (now_s() - t) / (double)n * 1e9;
}

/* ns per seal + check of a 64-byte body with the keys and code pushed
 * out of the core's L1 and L2 by a sweep over sweep (sweep_len bytes)
 * before each pair: the median of n single timings. */
static double frame_cold_ns(kvf_wire_mac_t *tx, kvf_wire_mac_t *rx,
                            const unsigned char *body,
                            const unsigned char *sweep, size_t sweep_len)
{
    unsigned char hdr[KVF_WIRE_HDR_LEN] = {'K', 'V', 'F', 'R', 1};
    unsigned char tag[KVF_WIRE_TAG_LEN];
    static double one[COLD_PAIRS];
    volatile unsigned char sink = 0;
    double t;
    size_t j;
    int i;

    for (i = 0; i < COLD_PAIRS; i++) {
        for (j = 0; j < sweep_len; j += 64) {
            sink ^= sweep[j];
        }
        hdr[16] = (unsigned char)i;
        t = now_s();
        kvf_wire_mac_seal(tx, hdr, body, 64, tag);
        if (kvf_wire_mac_check(rx, hdr, body, 64, tag, "bench") != KVF_OK) {
            abort();
        }
        one[i] = (now_s() - t) * 1e9;
    }
    (void)sink;
    return median(one, COLD_PAIRS);
}

/* ns per seal + check of a 16-byte body, each pair after one hash of
 * 4 KiB at src: libxxhash's XXH3 straight (via_kvf 0) or kvf_hash64. */
static double frame_after_hash_ns(kvf_wire_mac_t *tx, kvf_wire_mac_t *rx,
                                  const unsigned char *body,
                                  const unsigned char *src, int via_kvf)
{
    unsigned char hdr[KVF_WIRE_HDR_LEN] = {'K', 'V', 'F', 'R', 1};
    unsigned char tag[KVF_WIRE_TAG_LEN];
    volatile uint64_t sink = 0;
    long i, n = 20000;
    double spent = 0, t;

    for (i = 0; i < n; i++) {
        sink ^= via_kvf ? kvf_hash64(src, 4096, 0)
                        : XXH3_64bits_withSeed_dispatch(src, 4096, 0);
        hdr[16] = (unsigned char)i;
        t = now_s();
        kvf_wire_mac_seal(tx, hdr, body, 16, tag);
        if (kvf_wire_mac_check(rx, hdr, body, 16, tag, "bench") != KVF_OK) {
            abort();
        }
        spent += now_s() - t;
    }
    (void)sink;
    return spent / (double)n * 1e9;
}

/* GB/s of fn over len bytes: 0 payload tag, 1 memcpy, 2 checksum. */
static double bulk_gbs(int fn, kvf_wire_mac_t *tx, unsigned char *src,
                       unsigned char *dst, size_t len)
{
    unsigned char tag[KVF_WIRE_TAG_LEN];
    size_t total = 0, want = (size_t)256 << 20;
    volatile uint64_t sink = 0;
    kvf_wire_pmac_t p;
    double t = now_s();

    while (total < want) {
        if (fn == 0) {
            kvf_wire_pmac_begin(tx, 1, &p);
            kvf_wire_pmac_update(&p, src, len);
            kvf_wire_pmac_end(&p, 0, tag);
            tx->tx_seq++;
        } else if (fn == 1) {
            memcpy(dst, src, len);
        } else {
            sink ^= kvf_hash64(src, len, 0);
        }
        total += len;
    }
    (void)sink;
    return (double)total / (now_s() - t) / 1e9;
}

int main(int argc, char **argv)
{
    static const size_t bodies[] = {16, 64, 2048, 32768};
    static const size_t bulks[] = {8192, 1u << 20, 16u << 20};
    static const char *const bulk_names[] = {"payload tag", "memcpy",
                                             "checksum"};
    double fr[4][ROUNDS_MAX], cold[ROUNDS_MAX], xx[2][ROUNDS_MAX],
        bk[3][3][ROUNDS_MAX];
    unsigned char k1[KVF_WIRE_KEY_LEN], k2[KVF_WIRE_KEY_LEN];
    int rounds = argc > 1 ? atoi(argv[1]) : 7, r, i, j;
    unsigned char *src, *dst, *body, *sweep;
    kvf_wire_mac_t a, b, c; /* c: payload tags only */

    rounds = rounds < 1 ? 1 : rounds > ROUNDS_MAX ? ROUNDS_MAX : rounds;
    memset(k1, 1, sizeof(k1));
    memset(k2, 2, sizeof(k2));
    if (kvf_wire_mac_init(&a, k1, k2) != KVF_OK ||
        kvf_wire_mac_init(&b, k2, k1) != KVF_OK ||
        kvf_wire_mac_init(&c, k1, k2) != KVF_OK) {
        return 1;
    }
    src = malloc(16u << 20);
    dst = malloc(16u << 20);
    body = calloc(1, 32768);
    sweep = malloc(SWEEP_BYTES);
    memset(sweep, 0x3c, SWEEP_BYTES);
    memset(src, 0x5a, 16u << 20);
    for (r = 0; r < rounds; r++) {
        for (i = 0; i < 4; i++) {
            fr[i][r] = frame_ns(&a, &b, body, bodies[i]);
        }
        cold[r] = frame_cold_ns(&a, &b, body, sweep, SWEEP_BYTES);
        xx[0][r] = frame_after_hash_ns(&a, &b, body, src, 0);
        xx[1][r] = frame_after_hash_ns(&a, &b, body, src, 1);
        for (j = 0; j < 3; j++) {
            for (i = 0; i < 3; i++) {
                bk[j][i][r] = bulk_gbs(j, &c, src, dst, bulks[i]);
            }
        }
    }
    printf("frame tag, seal + check (ns), median of %d rounds\n", rounds);
    printf("| body bytes | ns |\n|---:|---:|\n");
    for (i = 0; i < 4; i++) {
        printf("| %zu | %.0f |\n", bodies[i], median(fr[i], rounds));
    }
    printf("| 64, cold | %.0f |\n", median(cold, rounds));
    printf("| 16, after libxxhash's XXH3 of 4 KiB | %.0f |\n",
           median(xx[0], rounds));
    printf("| 16, after kvf_hash64 of 4 KiB | %.0f |\n", median(xx[1], rounds));
    printf(
        "\nbulk (GB/s)\n| | 8 KiB | 1 MiB | 16 MiB |\n|---|---:|---:|---:|\n");
    for (j = 0; j < 3; j++) {
        printf("| %s | %.2f | %.2f | %.2f |\n", bulk_names[j],
               median(bk[j][0], rounds), median(bk[j][1], rounds),
               median(bk[j][2], rounds));
    }
    kvf_wire_mac_free(&a);
    kvf_wire_mac_free(&b);
    kvf_wire_mac_free(&c);
    free(src);
    free(dst);
    free(body);
    free(sweep);
    return 0;
}
