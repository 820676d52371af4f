/*
 * Checksum throughput: the library's previous hash (hash_prev.c) against
 * xxHash's XXH3 (libxxhash: the plain entry, compiled for the baseline
 * x86-64 ISA, and the _dispatch entry, which picks AVX2 / AVX-512 at run
 * time, the one kvf_checksum uses; and XXH3's AVX2 path built inline, what
 * a host without AVX-512 gets) on the
 * same random bytes at 8 KiB, 64 KiB, 1 MiB and 64 MiB. Rounds interleave
 * the candidates (the order rotates each round) so that machine noise
 * falls on all of them; each cell is the median of the rounds, in GiB/s.
 * Usage: checksum_bench [rounds (default 7)] [MiB hashed per cell (256)]
 */
#include "tests/perf/hash_prev.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define XXH_DISPATCH_DISABLE_REPLACE 1 /* keep both entries apart */
#include <xxh_x86dispatch.h>
#include <xxhash.h>

#define NSIZES     4
#define NIMPLS     4
#define ROUNDS_MAX 64

typedef uint64_t (*kvf_bench_fn)(const void *p, size_t n);

static uint64_t h_prev(const void *p, size_t n)
{
    return kvf_hash64_prev(p, n, 0);
}

static uint64_t h_xxh3(const void *p, size_t n)
{
    return XXH3_64bits(p, n);
}

static uint64_t h_xxh3_dispatch(const void *p, size_t n)
{
    return XXH3_64bits_dispatch(p, n);
}

static uint64_t h_xxh3_avx2(const void *p, size_t n)
{
    return kvf_xxh3_avx2(p, n);
}

static const struct {
    const char *name;
    kvf_bench_fn fn;
} impls[NIMPLS] = {
    {"previous kvf_hash64", h_prev},
    {"XXH3_64bits", h_xxh3},
    {"XXH3_64bits_dispatch", h_xxh3_dispatch},
    {"XXH3 AVX2 (inline)", h_xxh3_avx2},
};

static const size_t sizes[NSIZES] = {8u << 10, 64u << 10, 1u << 20, 64u << 20};

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* Hashes consecutive `size` pieces of buf (of buflen bytes) until `total`
 * bytes are done; returns GiB/s. */
static double run_cell(kvf_bench_fn fn, const unsigned char *buf, size_t buflen,
                       size_t size, size_t total)
{
    volatile uint64_t sink = 0;
    size_t done = 0, off = 0;
    double t0 = now_s(), dt;

    while (done < total) {
        sink ^= fn(buf + off, size);
        off = (off + size + size > buflen) ? 0 : off + size;
        done += size;
    }
    dt = now_s() - t0;
    (void)sink;
    return (double)done / dt / (double)(1u << 30);
}

int main(int argc, char **argv)
{
    static double gbs[NSIZES][NIMPLS][ROUNDS_MAX];
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    size_t total = (size_t)(argc > 2 ? atoi(argv[2]) : 256) << 20;
    size_t buflen = 256u << 20, i;
    unsigned char *buf = malloc(buflen);
    int r, s, k, j;

    if (buf == NULL || rounds < 1 || rounds > ROUNDS_MAX) {
        fprintf(stderr, "usage: checksum_bench [rounds 1..64] [MiB]\n");
        return 2;
    }
    for (i = 0; i < buflen; i += 8) { /* splitmix64 bytes */
        uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull;

        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        memcpy(buf + i, &z, 8);
    }
    for (r = 0; r < rounds; r++) {
        for (s = 0; s < NSIZES; s++) {
            for (j = 0; j < NIMPLS; j++) {
                k = (j + r) % NIMPLS;
                gbs[s][k][r] = run_cell(impls[k].fn, buf, buflen, sizes[s],
                                        total > sizes[s] ? total : sizes[s]);
            }
        }
    }
    printf("# GiB/s, median of %d interleaved rounds, %zu MiB per cell\n",
           rounds, total >> 20);
    printf("%-22s %10s %10s %10s %10s\n", "impl", "8KiB", "64KiB", "1MiB",
           "64MiB");
    for (k = 0; k < NIMPLS; k++) {
        printf("%-22s", impls[k].name);
        for (s = 0; s < NSIZES; s++) {
            qsort(gbs[s][k], (size_t)rounds, sizeof(double), cmp_double);
            printf(" %10.2f", gbs[s][k][rounds / 2]);
        }
        printf("\n");
    }
    free(buf);
    return 0;
}
