/*
 * The engine cases that every transport must pass, shared by the tcp
 * (test_engine) and ucx (test_ucx) integration tests: each test's setup
 * fills a fixture_t (a target child serving a pool seeded with SEED, an
 * engine with POOL bytes registered at local, a peer), and these cases
 * READ and WRITE through it and verify byte for byte.
 */
#ifndef KVF_TEST_ENGINE_CASES_H
#define KVF_TEST_ENGINE_CASES_H

#include <stddef.h>
#include <stdint.h>

#include <kvferry/kvferry.h>

#include "core/rng.h"
#include "test_util.h"

#define POOL    (64u << 20)
#define SEED    11
#define TIMEOUT 10000

typedef struct {
    kvf_test_target_t t;
    kvf_engine_h e;
    kvf_region_h r;
    unsigned char *local;
    unsigned char *expect; /* the target pool's bytes as we know them */
    kvf_peer_h peer;
    long blocks0, bytes0;
    int fds0;
} fixture_t;

/* After the test's setup started f->t and created f->e: allocates and
 * registers local, fills expect with the pool's bytes, opens the peer
 * and asserts that it uses transport. */
void fixture_open(fixture_t *f, const char *transport);
/* Closes the peer (unless NULL) and the engine, asserts that every
 * allocation (and, with check_fds, every file descriptor) came back,
 * stops the target (unless gone, pid 0) and frees f. */
void fixture_close(fixture_t *f, int check_fds);
/* Submits n operations and asserts that each moved all its bytes. */
void run_ops(fixture_t *f, kvf_op_t *ops, size_t n);

/* Random 8 KiB blocks READ from the pool. */
void test_read_random_blocks(void **state);
/* Random blocks WRITTEN, checked by remote checksums, then read back. */
void test_write_then_read_back(void **state);
/* Odd lengths at unaligned addresses on both sides. */
void test_odd_sizes_unaligned(void **state);
/* Out-of-bounds and unregistered addresses are refused per operation and
 * the target keeps serving. */
void test_out_of_bounds(void **state);
/* Operations ending exactly at the pool's end are served; ending one
 * byte past it, starting at its end or one byte before its start, they
 * are refused and move no byte (both directions). */
void test_edge_bounds(void **state);
/* Six threads submitting at once. */
void test_threads(void **state);

#endif
