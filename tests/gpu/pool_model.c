/*
 * GPU tests: pools checked against a host-side model of their bytes
 * (see pool_model.h).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include <kvferry/perf.h>

#include "core/checksum.h"
#include "mem/cuda/cuda.h"
#include "tests/gpu/pool_model.h"

void pool_model_check(const void *base, const unsigned char *model, size_t len,
                      int id)
{
    unsigned char *h = malloc(len);
    size_t i;

    assert_non_null(h);
    assert_int_equal(kvf_cuda_memcpy(h, base, len), KVF_OK);
    if (memcmp(h, model, len) != 0) {
        for (i = 0; i < len && h[i] == model[i]; i++) {
        }
        fail_msg("pool %d differs from its model at byte %zu", id, i);
    }
    free(h);
}

void pool_model_check_sums(kvf_peer_h peer, const kvf_op_t *ops, size_t n,
                           const unsigned char *model, uint64_t rbase)
{
    uint64_t rem[16] = {0}, sums[16] = {0};
    size_t lens[16] = {0}, i, m = n < 16 ? n : 16;

    for (i = 0; i < m; i++) {
        rem[i] = ops[i].remote;
        lens[i] = ops[i].length;
    }
    assert_int_equal(kvf_peer_checksum(peer, rem, lens, m, sums), KVF_OK);
    for (i = 0; i < m; i++) {
        assert_true(sums[i] == kvf_checksum(model + (rem[i] - rbase), lens[i]));
    }
}

uint64_t *pool_model_shuffled(kvf_rng_t *rng, size_t n)
{
    uint64_t *s = malloc(n * sizeof(*s)), i, k, t;

    assert_non_null(s);
    for (i = 0; i < n; i++) {
        s[i] = i;
    }
    for (i = n - 1; i > 0; i--) {
        k = kvf_rng_below(rng, i + 1);
        t = s[i], s[i] = s[k], s[k] = t;
    }
    return s;
}

void pool_model_open(kvf_engine_h e, int gpu, int dev, size_t len,
                     kvf_rng_t *rng, char **base_p, unsigned char **model_p,
                     kvf_region_h *reg_p)
{
    unsigned char *model = malloc(len);
    void *base = NULL;

    assert_non_null(model);
    kvf_rng_fill(rng, model, len);
    if (gpu) {
        assert_int_equal(kvf_cuda_mem_alloc(KVF_MEM_CUDA, dev, len, &base),
                         KVF_OK);
    } else {
        base = malloc(len);
        assert_non_null(base);
    }
    assert_int_equal(kvf_cuda_memcpy(base, model, len), KVF_OK);
    assert_int_equal(kvf_engine_reg(e, base, len,
                                    gpu ? KVF_MEM_CUDA : KVF_MEM_HOST, dev,
                                    reg_p),
                     KVF_OK);
    *base_p = base;
    *model_p = model;
}

void pool_model_close(kvf_engine_h e, int gpu, char *base, unsigned char *model,
                      kvf_region_h reg)
{
    assert_int_equal(kvf_engine_dereg(e, reg), KVF_OK);
    if (gpu) {
        kvf_cuda_mem_free(KVF_MEM_CUDA, base);
    } else {
        free(base);
    }
    free(model);
}
