/*
 * What the two sources of libkvferry_pyops.so share: the region a batch
 * lands in, the int and Region readers of pyops.c, the sliced block
 * submit that pyops_buf.c calls, and the arguments that stay from call
 * to call. Each source includes Python.h first, under its own limited
 * API version.
 */
#ifndef KVF_PYOPS_INT_H
#define KVF_PYOPS_INT_H

#include <stdint.h>

#define PYOPS_WORDS 5 /* kvf_op_t: type, local, peer, remote, length */

#define PYOPS_EXPORT __attribute__((visibility("default")))

/* The last region seen: most batches use one region for every op. */
struct pyops_region {
    PyObject *obj; /* borrowed (the ops list holds it) */
    uint64_t addr;
    uint64_t nbytes;
};

struct pyops_ctx {
    PyObject *region_cls;
    unsigned type;
    struct pyops_region reg;
    PyObject *last_len; /* borrowed: the last length object read */
    uint64_t len;       /* its value */
};

/* What stays from one call to the next for one peer and thread (a ctypes
 * Structure of the package, rebuilt when its op array grows): the
 * arguments of kvf_pyops_submit_call and kvf_pyops_blocks_buffers but
 * the batch's own. */
struct pyops_call {
    PyObject *region_cls;
    void *engine;
    uint64_t peer;
    Py_ssize_t first; /* operations in the first slice */
    uint64_t *out;    /* the op array, cap operations */
    Py_ssize_t cap;
    void **batches; /* maxb batch handles */
    Py_ssize_t maxb;
    uint64_t *res; /* total length, batches, submit status */
};

/* An int in [0, 2**64) into *v; -1 (an exception set) for anything else. */
int pyops_u64(PyObject *o, uint64_t *v);

/* Reads a Region's address and size into c->reg; -1 (an exception may be
 * set) when it is not exactly c->region_cls, is closed, or is read-only
 * while the batch reads into it. */
int pyops_region_load(struct pyops_ctx *c, PyObject *reg);

PYOPS_EXPORT Py_ssize_t kvf_pyops_blocks_submit(
    const uint64_t *offs, const uint64_t *addrs, const uint64_t *lens,
    uint64_t len, Py_ssize_t n, uint64_t base, uint64_t nbytes, unsigned type,
    uint64_t peer, void *engine, Py_ssize_t first, uint64_t *out,
    Py_ssize_t cap, void **batches, Py_ssize_t maxb, uint64_t *res);

#endif
