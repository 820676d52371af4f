/*
 * GPU test (label gpu, exit 77 without a GPU): checksums computed by the
 * copy kernels (kvf_gpu_copy_blocks_sum, kvf_gpu_checksum_blocks on GPU
 * memory, KVF_GPU_VERIFY) equal kvf_checksum() of the same bytes on the
 * host, bit for bit, for every XXH3 length class (0 to 240 bytes, long
 * blocks with every kind of remainder, up to 1 MiB) and alignment (both
 * sides 16-byte aligned, one side not, both odd), host -> GPU and
 * GPU -> host, checksummed by the copy kernel (fused) or by a pass over
 * the GPU side after the copy; the bytes arrive intact; a wrong expected
 * checksum or a corrupted byte is caught (KVF_ERR_CHECKSUM) with the other sums
 * still right; an out-of-bounds block is refused with sum 0. Public headers
 * only. Each check prints a PASS or FAIL line.
 */
#include <kvferry/gpu.h>
#include <kvferry/kvferry.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POOL (24u << 20)
#define MAXB 160u
#define TMO  20000

static int g_fail;

static void check(int ok, const char *what, kvf_status_t st)
{
    printf("%s: %s", ok ? "PASS" : "FAIL", what);
    if (!ok) {
        printf(" (%s)", kvf_status_str(st));
        g_fail = 1;
    }
    printf("\n");
    fflush(stdout);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Blocks of every length class at the given misalignments, laid out one
 * after another on each side (disjoint), in shuffled order. */
static unsigned make_blocks(kvf_gpu_block_t *b, unsigned smis, unsigned dmis,
                            uint64_t *rs)
{
    static const uint64_t lens[] = {
        0,     1,     2,     3,      4,      7,      8,      9,     16,
        17,    31,    64,    100,    128,    129,    200,    240,   241,
        255,   256,   512,   1000,   1023,   1024,   1025,   1087,  1088,
        2048,  3071,  4096,  4097,   8191,   8192,   16384,  32768, 32769,
        32783, 65536, 65549, 100000, 131072, 262144, 1048576};
    unsigned n = sizeof(lens) / sizeof(lens[0]), i, j;
    uint64_t so = smis, dof = dmis;
    kvf_gpu_block_t t;

    for (i = 0; i < n; i++) {
        b[i].src_off = so;
        b[i].dst_off = dof;
        b[i].len = lens[i];
        so += (lens[i] + 64) & ~15ull;
        dof += (lens[i] + 48) & ~15ull;
    }
    for (i = n - 1; i > 0; i--) {
        j = (unsigned)(rng_next(rs) % (i + 1));
        t = b[i];
        b[i] = b[j];
        b[j] = t;
    }
    return n;
}

static int sums_match(const char *host, const kvf_gpu_block_t *b, int use_dst,
                      unsigned n, const uint64_t *sums)
{
    unsigned i;

    for (i = 0; i < n; i++) {
        uint64_t off = use_dst ? b[i].dst_off : b[i].src_off;

        if (sums[i] != kvf_checksum(host + off, b[i].len)) {
            printf("  block %u (len %llu, off %llu): %016llx, host %016llx\n",
                   i, (unsigned long long)b[i].len, (unsigned long long)off,
                   (unsigned long long)sums[i],
                   (unsigned long long)kvf_checksum(host + off, b[i].len));
            return 0;
        }
    }
    return 1;
}

static int bytes_match(const char *a, const char *c, const kvf_gpu_block_t *b,
                       unsigned n)
{
    unsigned i;

    for (i = 0; i < n; i++) {
        if (memcmp(a + b[i].dst_off, c + b[i].dst_off, b[i].len) != 0) {
            return 0;
        }
    }
    return 1;
}

static const char *mode_name(unsigned fl)
{
    return fl == KVF_GPU_SUM_AFTER     ? "after"
           : fl == KVF_GPU_SUM_ENGINES ? "engines"
                                       : "fused";
}

/* Host -> GPU -> host with the checksumming kernel, at one alignment. */
static void round_trip(kvf_gpu_copier_t *c, kvf_gpu_mem_t *pin,
                       kvf_gpu_mem_t *pout, kvf_gpu_mem_t *gpu, unsigned smis,
                       unsigned dmis, unsigned fl, uint64_t *rs)
{
    kvf_gpu_block_t up[MAXB], down[MAXB];
    uint64_t sums[MAXB], offs[MAXB], lens[MAXB];
    char what[160];
    kvf_status_t st;
    unsigned n, i;

    n = make_blocks(up, smis, dmis, rs);
    memset(pout->base, 0, pout->len);
    st = kvf_gpu_copy_blocks_sum(c, pin, gpu, up, n, fl, NULL, sums, TMO);
    snprintf(what, sizeof(what),
             "H2D sums equal kvf_checksum (%s, src +%u, dst +%u)",
             mode_name(fl), smis, dmis);
    check(st == KVF_OK && sums_match(pin->base, up, 0, n, sums), what, st);
    for (i = 0; i < n; i++) {
        down[i].src_off = up[i].dst_off;
        down[i].dst_off = up[i].src_off;
        down[i].len = up[i].len;
        offs[i] = up[i].dst_off;
        lens[i] = up[i].len;
    }
    st = kvf_gpu_checksum_blocks(c, gpu, offs, lens, n, sums, TMO);
    snprintf(what, sizeof(what),
             "kvf_gpu_checksum_blocks on the GPU equals kvf_checksum (+%u)",
             dmis);
    check(st == KVF_OK && sums_match(pin->base, up, 0, n, sums), what, st);
    st = kvf_gpu_copy_blocks_sum(c, gpu, pout, down, n, fl, NULL, sums, TMO);
    snprintf(what, sizeof(what),
             "D2H sums equal kvf_checksum and bytes round-trip (%s, +%u, +%u)",
             mode_name(fl), dmis, smis);
    check(st == KVF_OK && sums_match(pout->base, down, 1, n, sums) &&
              bytes_match(pin->base, pout->base, down, n),
          what, st);
}

static void bad_cases(kvf_gpu_copier_t *c, kvf_gpu_mem_t *pin,
                      kvf_gpu_mem_t *gpu, uint64_t *rs)
{
    kvf_gpu_block_t b[MAXB];
    uint64_t sums[MAXB], exp[MAXB];
    kvf_status_t st;
    unsigned n, i, k;

    n = make_blocks(b, 0, 0, rs);
    for (i = 0; i < n; i++) {
        exp[i] = kvf_checksum((const char *)pin->base + b[i].src_off, b[i].len);
    }
    st = kvf_gpu_copy_blocks_sum(c, pin, gpu, b, n, 0, exp, NULL, TMO);
    check(st == KVF_OK, "expected checksums accepted", st);
    for (k = 0; k < n && b[k].len < 4096; k++) {
    }
    ((unsigned char *)pin->base)[b[k].src_off + b[k].len / 2] ^= 0x40;
    st = kvf_gpu_copy_blocks_sum(c, pin, gpu, b, n, 0, exp, sums, TMO);
    check(st == KVF_ERR_CHECKSUM && sums[k] != exp[k] &&
              sums_match(pin->base, b, 0, n, sums),
          "a corrupted byte is caught, the other sums stay right", st);
    ((unsigned char *)pin->base)[b[k].src_off + b[k].len / 2] ^= 0x40;
    st = kvf_gpu_copy_blocks(c, pin, gpu, b, n, KVF_GPU_VERIFY, TMO);
    check(st == KVF_OK, "KVF_GPU_VERIFY through the checksumming kernel", st);
    b[0].src_off = pin->len - 8;
    b[0].len = 64;
    st = kvf_gpu_copy_blocks_sum(c, pin, gpu, b, n, KVF_GPU_SUM_FUSED, NULL,
                                 sums, TMO);
    check(st == KVF_ERR_OUT_OF_BOUNDS && sums[0] == 0 &&
              sums_match(pin->base, b + 1, 0, n - 1, sums + 1),
          "out-of-bounds block refused with sum 0, the others summed", st);
}

int main(void)
{
    kvf_gpu_mem_t pin = {0}, pout = {0}, gpu = {0};
    kvf_gpu_copier_t *c = NULL;
    uint64_t rs = 0x9e3779b97f4a7c15ull;
    kvf_status_t st;
    size_t i;

    if (kvf_gpu_count() == 0) {
        printf("SKIP: no GPU\n");
        return 77;
    }
    pin.len = pout.len = gpu.len = POOL;
    pin.type = pout.type = KVF_MEM_PINNED;
    gpu.type = KVF_MEM_CUDA;
    st = kvf_gpu_alloc(KVF_MEM_PINNED, 0, POOL, &pin.base);
    if (st == KVF_OK) {
        st = kvf_gpu_alloc(KVF_MEM_PINNED, 0, POOL, &pout.base);
    }
    if (st == KVF_OK) {
        st = kvf_gpu_alloc(KVF_MEM_CUDA, 0, POOL, &gpu.base);
    }
    if (st == KVF_OK) {
        st = kvf_gpu_copier_create(0, &c);
    }
    check(st == KVF_OK, "set up pinned and GPU memory and a copier", st);
    if (st == KVF_OK) {
        for (i = 0; i < POOL / 8; i++) {
            ((uint64_t *)pin.base)[i] = rng_next(&rs);
        }
        static const unsigned modes[] = {KVF_GPU_SUM_FUSED, KVF_GPU_SUM_AFTER,
                                         KVF_GPU_SUM_ENGINES};
        unsigned k, f;

        for (k = 0; k < sizeof(modes) / sizeof(modes[0]); k++) {
            f = modes[k];
            round_trip(c, &pin, &pout, &gpu, 0, 0, f, &rs);
            round_trip(c, &pin, &pout, &gpu, 16, 48, f, &rs);
            round_trip(c, &pin, &pout, &gpu, 3, 0, f, &rs);
            round_trip(c, &pin, &pout, &gpu, 0, 5, f, &rs);
            round_trip(c, &pin, &pout, &gpu, 7, 7, f, &rs);
        }
        bad_cases(c, &pin, &gpu, &rs);
        st =
            kvf_gpu_copy_blocks_sum(c, &pin, &gpu, NULL, 0, 3, NULL, NULL, TMO);
        check(st == KVF_ERR_INVALID_PARAM, "both modes at once refused", st);
        st = kvf_gpu_copy_blocks_sum(c, &pin, &gpu, NULL, 0, 0x8, NULL, NULL,
                                     TMO);
        check(st == KVF_ERR_INVALID_PARAM, "an unknown mode refused", st);
    }
    kvf_gpu_copier_destroy(c);
    kvf_gpu_free(KVF_MEM_CUDA, gpu.base);
    kvf_gpu_free(KVF_MEM_PINNED, pout.base);
    kvf_gpu_free(KVF_MEM_PINNED, pin.base);
    printf("%s\n", g_fail ? "FAIL: test_gpu_sum" : "PASS: test_gpu_sum");
    return g_fail ? 1 : 0;
}
