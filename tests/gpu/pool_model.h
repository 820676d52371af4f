/*
 * GPU tests: pools checked against a host-side model of their bytes
 * (shared by the tests that move random blocks between GPU and host
 * pools over a transport).
 */
#ifndef KVF_TESTS_GPU_POOL_MODEL_H
#define KVF_TESTS_GPU_POOL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include <kvferry/kvferry.h>

#include "core/rng.h"

/* The len bytes at base (host or GPU memory) equal model; fails the test
 * naming pool `id` and the first byte that differs. */
void pool_model_check(const void *base, const unsigned char *model, size_t len,
                      int id);
/* The target's checksums of the remote ranges of the first (at most 16)
 * of ops equal those of model, the remote pool's model at rbase. */
void pool_model_check_sums(kvf_peer_h peer, const kvf_op_t *ops, size_t n,
                           const unsigned char *model, uint64_t rbase);
/* One pool of len random bytes (from rng) and its model: GPU memory of
 * device dev when gpu, host memory otherwise; registered with e. */
void pool_model_open(kvf_engine_h e, int gpu, int dev, size_t len,
                     kvf_rng_t *rng, char **base_p, unsigned char **model_p,
                     kvf_region_h *reg_p);
/* Deregisters from e and frees what pool_model_open made. */
void pool_model_close(kvf_engine_h e, int gpu, char *base, unsigned char *model,
                      kvf_region_h reg);
/* A random permutation of 0..n-1 (free() it). */
uint64_t *pool_model_shuffled(kvf_rng_t *rng, size_t n);

#endif
