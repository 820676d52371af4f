/*
 * libkvferry_pyops.so: the Python package's converter from a list of
 * (local, remote, length) operations to the kvf_op_t array that
 * kvf_batch_submit takes, in one call (Peer.read and Peer.write).
 *
 * CPython reading thousands of tuples and their ints one by one costs
 * more per operation than the engine takes to move a small block over
 * shm; here each item is a few stable-ABI calls. Built against the
 * limited API of CPython 3.8 and not linked against libpython: the
 * symbols resolve in the interpreter that loads it with ctypes.PyDLL
 * (which keeps the GIL and passes py_object arguments), so one build
 * serves every CPython 3 with a GIL and the wheel stays py3-none.
 *
 * The converter only accepts what the pure-Python path accepts with the
 * same result: each operation a tuple of three; local an address (of
 * type int itself) or a (region, offset) tuple whose region is exactly
 * the package's Region class, open, large enough, and writable for a
 * read; remote and length ints in [0, 2**64). Anything else (and an
 * empty list) makes it decline with -1 and no exception set: the caller
 * then runs the Python path, which accepts or raises its own errors, so
 * both paths give the same operations and the same exceptions.
 */
#define Py_LIMITED_API 0x03080000
#include <Python.h>

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

PYOPS_EXPORT Py_ssize_t kvf_pyops_pack(PyObject *ops, PyObject *region_cls,
                                       unsigned type, uint64_t peer,
                                       uint64_t *out, Py_ssize_t cap,
                                       uint64_t *total_p);

/* An int in [0, 2**64) (int subclasses such as bool included, as the
 * Python path takes them); -1 for anything else. PyLong_AsUnsignedLong
 * (64 bits here) reads the digits directly, where some CPythons'
 * PyLong_AsUnsignedLongLong goes through a byte-array conversion. */
static int pyops_u64(PyObject *o, uint64_t *v)
{
    unsigned long x = PyLong_AsUnsignedLong(o);

    if (x == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    *v = x;
    return 0;
}

_Static_assert(sizeof(unsigned long) == sizeof(uint64_t),
               "PyLong_AsUnsignedLong must cover 64-bit addresses");

static int pyops_attr_u64(PyObject *o, const char *name, uint64_t *v)
{
    PyObject *a = PyObject_GetAttrString(o, name);
    int rc;

    if (a == NULL)
        return -1;
    rc = pyops_u64(a, v);
    Py_DECREF(a);
    return rc;
}

/* Reads a Region's address and size once; -1 when it is not exactly a
 * Region, is closed, or is read-only while the batch reads into it. */
static int pyops_region_load(struct pyops_ctx *c, PyObject *reg)
{
    PyObject *a;
    int bad;

    if ((PyObject *)Py_TYPE(reg) != c->region_cls)
        return -1;
    a = PyObject_GetAttrString(reg, "_h");
    if (a == NULL)
        return -1;
    bad = a == Py_None;
    Py_DECREF(a);
    if (bad)
        return -1;
    if (c->type == 0) { /* KVF_OP_READ writes into the region */
        a = PyObject_GetAttrString(reg, "readonly");
        if (a == NULL)
            return -1;
        bad = PyObject_IsTrue(a) != 0;
        Py_DECREF(a);
        if (bad)
            return -1;
    }
    if (pyops_attr_u64(reg, "addr", &c->reg.addr) != 0 ||
        pyops_attr_u64(reg, "nbytes", &c->reg.nbytes) != 0)
        return -1;
    c->reg.obj = reg;
    return 0;
}

/* The local address of (region, offset) for length bytes, checked
 * against the region as Region.span does. */
static int pyops_local_region(struct pyops_ctx *c, PyObject *local,
                              uint64_t length, uint64_t *addr)
{
    PyObject *reg;
    uint64_t off;

    if (PyTuple_Size(local) != 2)
        return -1;
    reg = PyTuple_GetItem(local, 0);
    if (reg == NULL || pyops_u64(PyTuple_GetItem(local, 1), &off) != 0)
        return -1;
    if (reg != c->reg.obj && pyops_region_load(c, reg) != 0)
        return -1;
    if (off > c->reg.nbytes || length > c->reg.nbytes - off)
        return -1;
    *addr = c->reg.addr + off;
    return 0;
}

/* An int item of a tuple; the value of the last one read is kept, as
 * most batches repeat one length object in every operation. */
static int pyops_item_u64(PyObject *t, Py_ssize_t i, PyObject **last,
                          uint64_t *v)
{
    PyObject *o = PyTuple_GetItem(t, i);

    if (o == *last && o != NULL)
        return 0;
    if (pyops_u64(o, v) != 0)
        return -1;
    *last = o;
    return 0;
}

/* One operation into its five words; -1 to decline. */
static int pyops_one(struct pyops_ctx *c, PyObject *op, uint64_t *w)
{
    PyObject *local;

    if (op == NULL || PyTuple_Size(op) != 3)
        return -1;
    local = PyTuple_GetItem(op, 0);
    if (pyops_u64(PyTuple_GetItem(op, 1), &w[3]) != 0 ||
        pyops_item_u64(op, 2, &c->last_len, &c->len) != 0)
        return -1;
    w[4] = c->len;
    /* an address is an int itself (the Python path takes no bool) */
    if (Py_TYPE(local) == &PyLong_Type)
        return pyops_u64(local, &w[1]);
    if (Py_TYPE(local) == &PyTuple_Type || PyTuple_Check(local))
        return pyops_local_region(c, local, w[4], &w[1]);
    return -1;
}

/*
 * Fills out (cap operations of five words) from ops, a list or tuple of
 * operations; type is KVF_OP_READ (0) or KVF_OP_WRITE, peer the peer
 * handle, region_cls the Region class (borrowed). Returns the number of
 * operations and their total length in *total_p, or -1 with no
 * exception set when the Python path must convert ops instead.
 */
Py_ssize_t kvf_pyops_pack(PyObject *ops, PyObject *region_cls, unsigned type,
                          uint64_t peer, uint64_t *out, Py_ssize_t cap,
                          uint64_t *total_p)
{
    struct pyops_ctx c = {.region_cls = region_cls, .type = type};
    int is_list = PyList_Check(ops);
    Py_ssize_t n, i;
    uint64_t total = 0;

    if (!is_list && !PyTuple_Check(ops))
        return -1;
    n = is_list ? PyList_Size(ops) : PyTuple_Size(ops);
    if (n <= 0 || n > cap)
        return -1;
    for (i = 0; i < n; i++) {
        uint64_t *w = out + i * PYOPS_WORDS;
        PyObject *op =
            is_list ? PyList_GetItem(ops, i) : PyTuple_GetItem(ops, i);

        if (pyops_one(&c, op, w) != 0 || total + w[4] < total) {
            PyErr_Clear();
            return -1;
        }
        w[0] = type;
        w[2] = peer;
        total += w[4];
    }
    *total_p = total;
    return n;
}
