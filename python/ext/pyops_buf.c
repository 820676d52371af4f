/*
 * libkvferry_pyops.so, block arrays read through the buffer protocol:
 * Peer.read_blocks and write_blocks hand their two arrays, the length and
 * the region to one call, which takes the arrays' memory with
 * PyObject_GetBuffer, reads the region's attributes, then checks, builds
 * and submits the blocks in slices as kvf_pyops_blocks_submit does. The
 * Python work this replaces (numpy's contiguity and dtype conversions,
 * the arrays' addresses, the region's checks) runs cold right after a
 * batch has moved megabytes, and delayed the first slice by tens of
 * microseconds.
 *
 * Built against the limited API of CPython 3.11, the first with the
 * buffer protocol in it; the package calls it only on 3.11 and later.
 * It takes only the common form: two C-contiguous one-dimensional arrays
 * of unsigned 64-bit ints of one length (numpy uint64, array('Q')), one
 * length as an exact int, exactly a Region. Anything else declines with
 * no exception set and the package's other paths take the batch, which
 * accept or raise as before.
 */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "pyops_int.h"

PYOPS_EXPORT Py_ssize_t kvf_pyops_blocks_buffers(
    PyObject *offs, PyObject *addrs, PyObject *length, PyObject *region,
    unsigned type, const struct pyops_call *call);

/* 1 for a struct format of one native or little-endian unsigned 64-bit
 * int ("L" is numpy's uint64 on LP64, "Q" array's). */
static int pyops_u64_format(const char *f)
{
    if (f[0] == '<' || f[0] == '=')
        return strcmp(f + 1, "Q") == 0;
    if (f[0] == '@')
        f++;
    return strcmp(f, "Q") == 0 || strcmp(f, "L") == 0;
}

_Static_assert(sizeof(unsigned long) == 8, "'L' must be 64 bits");

/* o's memory as a contiguous uint64 vector in *v; -1, no exception set,
 * when o is anything else. */
static int pyops_u64_vector(PyObject *o, Py_buffer *v)
{
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyErr_Clear();
        return -1;
    }
    if (v->ndim == 1 && v->itemsize == 8 && v->format != NULL &&
        pyops_u64_format(v->format))
        return 0;
    PyBuffer_Release(v);
    return -1;
}

/*
 * Blocks offs[i] of region to or from addrs[i], length bytes each, as
 * kvf_pyops_blocks_submit: n submitted (call->res[0] the total length,
 * res[1] the batches), 0 when a submit failed (res[2] its status), -1
 * for a block outside the region, -2 when it declines (another form, a
 * closed or read-only region), -3 when call->out has no room for the
 * blocks (the package grows it and calls again): nothing is left
 * submitted on -1, -2 and -3, and no exception set.
 */
Py_ssize_t kvf_pyops_blocks_buffers(PyObject *offs, PyObject *addrs,
                                    PyObject *length, PyObject *region,
                                    unsigned type,
                                    const struct pyops_call *call)
{
    struct pyops_ctx c = {.region_cls = call->region_cls, .type = type};
    Py_buffer vo, va;
    Py_ssize_t got = -2;
    uint64_t len;

    if (Py_TYPE(length) != &PyLong_Type || pyops_u64(length, &len) != 0 ||
        pyops_region_load(&c, region) != 0) {
        PyErr_Clear();
        return -2;
    }
    if (pyops_u64_vector(offs, &vo) != 0)
        return -2;
    if (pyops_u64_vector(addrs, &va) == 0) {
        Py_ssize_t n = va.len == vo.len ? vo.len / 8 : 0;

        if (n > call->cap)
            got = -3;
        else if (n > 0)
            got = kvf_pyops_blocks_submit(
                vo.buf, va.buf, NULL, len, n, c.reg.addr, c.reg.nbytes, type,
                call->peer, call->engine, call->first, call->out, call->cap,
                call->batches, call->maxb, call->res);
        PyBuffer_Release(&va);
    }
    PyBuffer_Release(&vo);
    return got;
}
