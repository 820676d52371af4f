/*
 * libkvferry_pyops.so: the Python package's converter from a list of
 * (local, remote, length) operations to the kvf_op_t array that
 * kvf_batch_submit takes, in one call (Peer.read and Peer.write).
 *
 * CPython reading thousands of tuples and their ints one by one costs
 * more per operation than the engine takes to move a small block over
 * shm; here exact tuples, lists and ints are read from their memory (at
 * offsets probed at load, the stable-ABI calls where the probe fails)
 * with the objects of operations ahead prefetched, and a list of reads
 * is submitted in slices as it converts (kvf_pyops_submit_call), so the
 * engine moves the first slice while the next converts. Built against
 * the limited API of CPython 3.8 and not linked against libpython: the
 * symbols resolve in the interpreter that loads it with ctypes.PyDLL
 * (which keeps the GIL and passes py_object arguments), so one build
 * serves every CPython 3 with a GIL and the wheel stays py3-none.
 *
 * Block batches given as numpy arrays (Peer.read_blocks and write_blocks)
 * come as plain uint64 memory, no Python objects:
 * kvf_pyops_blocks_submit checks every block against the region first
 * (as the Python path does; nothing is submitted when one is outside),
 * then builds and submits them in the same slices as a list;
 * kvf_pyops_blocks builds the whole array (inline batches). Their
 * common form comes in one call through the buffer protocol
 * (pyops_buf.c).
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

#include "pyops_int.h"

PYOPS_EXPORT Py_ssize_t kvf_pyops_pack(PyObject *ops, PyObject *region_cls,
                                       unsigned type, uint64_t peer,
                                       uint64_t *out, Py_ssize_t cap,
                                       uint64_t *total_p);

/*
 * Direct reads. The limited API reads a tuple's item, a list's item and
 * an int's value through a call each, most of the converter's time. For
 * exact tuples, lists and ints, the converter reads the objects' memory
 * instead, at offsets kvf_pyops_init finds by probing objects it makes
 * and checks against the API calls; where a layout differs from what the
 * probe expects (a CPython to come), it keeps the calls.
 */
static struct {
    int tuple_off; /* offset of a tuple's first item; 0: use the API */
    int list_ok;   /* a list's item array follows its PyVarObject */
    int long_mode; /* ints: 1 signed digit count in ob_size, 2 in a tag;
                      0: use the API */
} pyops_fast;

#define PYOPS_DIGIT_BITS 30
#define PYOPS_DIGIT_MASK ((1u << PYOPS_DIGIT_BITS) - 1)

struct pyops_list {
    PyVarObject head;
    PyObject **items;
};

/* Item i of an exact tuple or any tuple subclass; NULL out of range. */
static PyObject *pyops_titem(PyObject *t, Py_ssize_t i)
{
    if (pyops_fast.tuple_off && Py_TYPE(t) == &PyTuple_Type) {
        if (i >= Py_SIZE(t))
            return NULL;
        return ((PyObject **)((char *)t + pyops_fast.tuple_off))[i];
    }
    return PyTuple_GetItem(t, i);
}

static Py_ssize_t pyops_tsize(PyObject *t)
{
    if (pyops_fast.tuple_off && Py_TYPE(t) == &PyTuple_Type)
        return Py_SIZE(t);
    return PyTuple_Check(t) ? PyTuple_Size(t) : -1;
}

static PyObject *pyops_litem(PyObject *l, Py_ssize_t i)
{
    if (pyops_fast.list_ok && Py_TYPE(l) == &PyList_Type) {
        if (i >= Py_SIZE(l))
            return NULL;
        return ((struct pyops_list *)l)->items[i];
    }
    return PyList_GetItem(l, i);
}

/* An exact int's value from its digits: 1 when it is in [0, 2**64), 0
 * when the API must read it (negative, too large, or no direct reads). */
static int pyops_long_read(PyObject *o, uint64_t *v)
{
    const uint32_t *d = (const uint32_t *)((const char *)o + 24);
    Py_ssize_t nd;

    if (pyops_fast.long_mode == 2) { /* tag: digits << 3 | sign (1 zero) */
        uintptr_t tag = *(const uintptr_t *)((const char *)o + 16);

        if ((tag & 3) == 1) {
            *v = 0;
            return 1;
        }
        if ((tag & 3) != 0)
            return 0;
        nd = (Py_ssize_t)(tag >> 3);
    } else if (pyops_fast.long_mode == 1) {
        nd = Py_SIZE(o);
    } else {
        return 0;
    }
    switch (nd) {
    case 0:
        *v = 0;
        return 1;
    case 1:
        *v = d[0];
        return 1;
    case 2:
        *v = d[0] | (uint64_t)d[1] << PYOPS_DIGIT_BITS;
        return 1;
    case 3:
        if (d[2] >> (64 - 2 * PYOPS_DIGIT_BITS))
            return 0;
        *v = d[0] | (uint64_t)d[1] << PYOPS_DIGIT_BITS |
             (uint64_t)d[2] << (2 * PYOPS_DIGIT_BITS);
        return 1;
    default:
        return 0;
    }
}

/* An int in [0, 2**64) (int subclasses such as bool included, as the
 * Python path takes them); -1 for anything else. PyLong_AsUnsignedLong
 * (64 bits here) reads the digits directly, where some CPythons'
 * PyLong_AsUnsignedLongLong goes through a byte-array conversion. */
int pyops_u64(PyObject *o, uint64_t *v)
{
    unsigned long x;

    if (Py_TYPE(o) == &PyLong_Type && pyops_long_read(o, v))
        return 0;
    x = PyLong_AsUnsignedLong(o);
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

/* Reads a Region's address and size once (pyops_int.h). */
int pyops_region_load(struct pyops_ctx *c, PyObject *reg)
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

    if (pyops_tsize(local) != 2)
        return -1;
    reg = pyops_titem(local, 0);
    if (reg == NULL || pyops_u64(pyops_titem(local, 1), &off) != 0)
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
    PyObject *o = pyops_titem(t, i);

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

    if (op == NULL || pyops_tsize(op) != 3)
        return -1;
    local = pyops_titem(op, 0);
    if (pyops_u64(pyops_titem(op, 1), &w[3]) != 0 ||
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

/* Item i of an exact tuple of n items, else NULL (for prefetches). */
static PyObject *pyops_peek(PyObject *t, Py_ssize_t n, Py_ssize_t i)
{
    if (t == NULL || Py_TYPE(t) != &PyTuple_Type || Py_SIZE(t) != n)
        return NULL;
    return ((PyObject **)((char *)t + pyops_fast.tuple_off))[i];
}

/*
 * Prefetches for operation i of a list the objects the converter reads
 * next, in stages: the operation PYOPS_AHEAD ahead, the local and remote
 * of the one half as far, the offset of the one a quarter as far. After
 * a batch has moved megabytes, the list's objects are out of the caches
 * and each operation is a chain of three dependent misses (operation,
 * local pair, offset); staged, the misses of several operations overlap.
 */
#define PYOPS_AHEAD 32

/* gcc drops __builtin_prefetch here, an asm it keeps */
#if defined(__x86_64__)
#define PYOPS_PREFETCH(p)                                                      \
    __asm__ volatile("prefetcht0 %0" ::"m"(*(const char *)(p)))
#else
#define PYOPS_PREFETCH(p) __builtin_prefetch(p)
#endif

static inline void pyops_prefetch(PyObject *const *items, Py_ssize_t i,
                                  Py_ssize_t n)
{
    PyObject *op, *o;

    if (i + PYOPS_AHEAD < n)
        PYOPS_PREFETCH(items[i + PYOPS_AHEAD]);
    if (i + PYOPS_AHEAD / 2 < n) {
        op = items[i + PYOPS_AHEAD / 2];
        if ((o = pyops_peek(op, 3, 0)) != NULL)
            PYOPS_PREFETCH(o);
        if ((o = pyops_peek(op, 3, 1)) != NULL)
            PYOPS_PREFETCH(o);
    }
    if (i + PYOPS_AHEAD / 4 < n) {
        op = items[i + PYOPS_AHEAD / 4];
        if ((o = pyops_peek(pyops_peek(op, 3, 0), 2, 1)) != NULL)
            PYOPS_PREFETCH(o);
    }
}

/* Operations [i0, i1) of ops into out (five words each); adds their
 * lengths to *total. -1 to decline, with no exception set. */
static int pyops_range(struct pyops_ctx *c, PyObject *ops, int is_list,
                       Py_ssize_t i0, Py_ssize_t i1, uint64_t peer,
                       uint64_t *out, uint64_t *total)
{
    Py_ssize_t i;

    /* an exact list, read directly (its size holds: the GIL is held) */
    PyObject *const *items = is_list && pyops_fast.list_ok &&
                                     Py_TYPE(ops) == &PyList_Type &&
                                     i1 <= Py_SIZE(ops)
                                 ? ((struct pyops_list *)ops)->items
                                 : NULL;

    for (i = i0; i < i1; i++) {
        uint64_t *w = out + i * PYOPS_WORDS;
        PyObject *op = items != NULL ? items[i]
                       : is_list     ? pyops_litem(ops, i)
                                     : pyops_titem(ops, i);

        if (items != NULL)
            pyops_prefetch(items, i, i1);

        if (pyops_one(c, op, w) != 0 || *total + w[4] < *total) {
            PyErr_Clear();
            return -1;
        }
        w[0] = c->type;
        w[2] = peer;
        *total += w[4];
    }
    return 0;
}

/* The number of operations of ops, a list or tuple, or -1. */
static Py_ssize_t pyops_len(PyObject *ops, int *is_list)
{
    *is_list = PyList_Check(ops);
    if (*is_list)
        return PyList_Size(ops);
    return PyTuple_Check(ops) ? PyTuple_Size(ops) : -1;
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
    uint64_t total = 0;
    int is_list;
    Py_ssize_t n = pyops_len(ops, &is_list);

    if (n <= 0 || n > cap ||
        pyops_range(&c, ops, is_list, 0, n, peer, out, &total) != 0)
        return -1;
    *total_p = total;
    return n;
}

/* A block batch given as arrays: block i moves lens[i] bytes (len for
 * every block when lens is NULL) between base + offs[i], in a region of
 * nbytes at base, and addrs[i]. */
struct pyops_blocks {
    const uint64_t *offs, *addrs, *lens;
    uint64_t len, base, nbytes, peer;
    unsigned type;
};

/* 0 when every one of the n blocks lies inside the region and their
 * total fits in 64 bits (in *total_p); -1 otherwise. */
static int pyops_blocks_check(const struct pyops_blocks *b, Py_ssize_t n,
                              uint64_t *total_p)
{
    uint64_t total = 0, ln;
    Py_ssize_t i;

    for (i = 0; i < n; i++) {
        ln = b->lens != NULL ? b->lens[i] : b->len;
        if (b->offs[i] > b->nbytes || ln > b->nbytes - b->offs[i] ||
            total + ln < total)
            return -1;
        total += ln;
    }
    *total_p = total;
    return 0;
}

/* Blocks [i0, i1) into out (checked before by pyops_blocks_check). */
static void pyops_blocks_fill(const struct pyops_blocks *b, Py_ssize_t i0,
                              Py_ssize_t i1, uint64_t *out)
{
    Py_ssize_t i;

    for (i = i0; i < i1; i++) {
        uint64_t *w = out + i * PYOPS_WORDS;

        w[0] = b->type;
        w[1] = b->base + b->offs[i];
        w[2] = b->peer;
        w[3] = b->addrs[i];
        w[4] = b->lens != NULL ? b->lens[i] : b->len;
    }
}

/*
 * The op array of n blocks given as arrays (struct pyops_blocks) into
 * out (cap operations). Returns n with the total in *total_p, -1 when a
 * block lies outside the region or the total overflows (the caller
 * raises), -2 when n does not fit out or is not positive.
 */
PYOPS_EXPORT Py_ssize_t kvf_pyops_blocks(
    const uint64_t *offs, const uint64_t *addrs, const uint64_t *lens,
    uint64_t len, Py_ssize_t n, uint64_t base, uint64_t nbytes, unsigned type,
    uint64_t peer, uint64_t *out, Py_ssize_t cap, uint64_t *total_p);

Py_ssize_t kvf_pyops_blocks(const uint64_t *offs, const uint64_t *addrs,
                            const uint64_t *lens, uint64_t len, Py_ssize_t n,
                            uint64_t base, uint64_t nbytes, unsigned type,
                            uint64_t peer, uint64_t *out, Py_ssize_t cap,
                            uint64_t *total_p)
{
    struct pyops_blocks b = {offs, addrs, lens, len, base, nbytes, peer, type};

    if (n <= 0 || n > cap)
        return -2;
    if (pyops_blocks_check(&b, n, total_p) != 0)
        return -1;
    pyops_blocks_fill(&b, 0, n, out);
    return n;
}

/* The library's batch calls, set once by kvf_pyops_init. */
typedef int (*pyops_submit_fn)(void *engine, const void *ops, size_t count,
                               unsigned flags, void **batch_p);
typedef void (*pyops_batch_fn)(void *batch);

static pyops_submit_fn pyops_submit_ex;
static pyops_batch_fn pyops_cancel, pyops_destroy;

PYOPS_EXPORT int kvf_pyops_init(void *submit_ex, void *cancel, void *destroy);
PYOPS_EXPORT Py_ssize_t kvf_pyops_submit_call(PyObject *ops, unsigned type,
                                              const struct pyops_call *call);

/* 1 when mode reads every probe int as the API does and declines the
 * negative and the too large one. */
static int pyops_probe_longs(int mode)
{
    static const uint64_t vals[] = {0,
                                    1,
                                    5,
                                    PYOPS_DIGIT_MASK,
                                    PYOPS_DIGIT_MASK + 1ull,
                                    (1ull << 31) + 7,
                                    (1ull << 60) - 1,
                                    1ull << 60,
                                    (1ull << 63) + 12345,
                                    UINT64_MAX};
    PyObject *o, *one, *big;
    size_t i;
    uint64_t v;
    int ok = 1, took;

    pyops_fast.long_mode = mode;
    for (i = 0; ok && i < sizeof(vals) / sizeof(vals[0]); i++) {
        o = PyLong_FromUnsignedLongLong(vals[i]);
        if (o == NULL)
            return 0;
        ok = Py_TYPE(o) == &PyLong_Type && pyops_long_read(o, &v) &&
             v == vals[i] && PyLong_AsUnsignedLong(o) == vals[i];
        if (ok) { /* 2**64 is too large */
            one = PyLong_FromLong(1);
            big = one != NULL ? PyNumber_Add(o, one) : NULL;
            ok = big != NULL &&
                 (vals[i] != UINT64_MAX || !pyops_long_read(big, &v));
            Py_XDECREF(big);
            Py_XDECREF(one);
        }
        Py_XDECREF(o);
    }
    o = PyLong_FromLong(-5);
    took = o != NULL && pyops_long_read(o, &v);
    Py_XDECREF(o);
    pyops_fast.long_mode = 0;
    return ok && !took;
}

/* 1 when a tuple's items lie at off, a list's where pyops_list says. */
static int pyops_probe_seq(PyObject *t, PyObject *l, int off)
{
    Py_ssize_t i;

    pyops_fast.tuple_off = off;
    pyops_fast.list_ok = 1;
    for (i = 0; i < 3; i++) {
        if (pyops_titem(t, i) != PyTuple_GetItem(t, i) ||
            pyops_litem(l, i) != PyList_GetItem(l, i) ||
            PyTuple_GetItem(t, i) == NULL)
            break;
    }
    pyops_fast.tuple_off = 0;
    pyops_fast.list_ok = 0;
    return i == 3;
}

/* Finds the layouts pyops_fast reads directly (GIL held). */
static void pyops_probe(void)
{
    PyObject *t = PyTuple_New(4), *l = PyList_New(4), *o;
    int off = 0, mode = 0, k;
    Py_ssize_t i;

    for (i = 0; t != NULL && l != NULL && i < 4; i++) {
        o = PyLong_FromLong(1000 + (long)i); /* distinct objects */
        if (o == NULL)
            break;
        Py_INCREF(o);
        PyTuple_SetItem(t, i, o); /* each steals one reference */
        PyList_SetItem(l, i, o);
    }
    if (t != NULL && l != NULL && i == 4) {
        for (k = 24; off == 0 && k <= 32; k += 8)
            off = pyops_probe_seq(t, l, k) ? k : 0;
        for (k = 1; mode == 0 && k <= 2; k++)
            mode = pyops_probe_longs(k) ? k : 0;
    }
    Py_XDECREF(t);
    Py_XDECREF(l);
    PyErr_Clear();
    pyops_fast.tuple_off = off;
    pyops_fast.list_ok = off != 0;
    pyops_fast.long_mode = mode;
}

/* submit_ex, cancel and destroy: kvf_batch_submit_ex, kvf_batch_cancel
 * and kvf_batch_destroy of the libkvferry.so the package loaded. Also
 * probes the objects' layouts for direct reads; returns what it found:
 * 1 tuples and lists, 2 ints, 3 both, 0 neither (the API then). Called
 * once, with the GIL (ctypes.PyDLL). */
int kvf_pyops_init(void *submit_ex, void *cancel, void *destroy)
{
    pyops_submit_ex = (pyops_submit_fn)submit_ex;
    pyops_cancel = (pyops_batch_fn)cancel;
    pyops_destroy = (pyops_batch_fn)destroy;
    pyops_probe();
    return (pyops_fast.tuple_off ? 1 : 0) | (pyops_fast.long_mode ? 2 : 0);
}

/* Ends the nb batches already submitted (cancel, then destroy, which
 * waits for what had started), without the GIL. */
static void pyops_undo(void **batches, Py_ssize_t nb)
{
    PyThreadState *ts = PyEval_SaveThread();
    Py_ssize_t i;

    for (i = 0; i < nb; i++)
        pyops_cancel(batches[i]);
    for (i = 0; i < nb; i++)
        pyops_destroy(batches[i]);
    PyEval_RestoreThread(ts);
}

/* One slice, out[i0, i1), submitted without the GIL; its status. */
static int pyops_post(void *engine, const uint64_t *out, Py_ssize_t i0,
                      Py_ssize_t i1, void **batch_p)
{
    PyThreadState *ts = PyEval_SaveThread();
    int st = pyops_submit_ex(engine, out + i0 * PYOPS_WORDS, (size_t)(i1 - i0),
                             0, batch_p);

    PyEval_RestoreThread(ts);
    return st;
}

/* What a sliced submit converts: a list of operations (ctx, ops) or
 * block arrays (blocks). */
struct pyops_src {
    struct pyops_ctx *ctx;
    PyObject *ops;
    int is_list;
    uint64_t peer;
    uint64_t total; /* the list's lengths so far */
    const struct pyops_blocks *blocks;
};

/* Operations [i0, i1) of src into out; -1 to decline. */
static int pyops_src_fill(struct pyops_src *src, Py_ssize_t i0, Py_ssize_t i1,
                          uint64_t *out)
{
    if (src->blocks != NULL) {
        pyops_blocks_fill(src->blocks, i0, i1, out);
        return 0;
    }
    /* other threads ran since the last slice went out: what the borrowed
     * cache points at may be gone */
    src->ctx->reg.obj = NULL;
    src->ctx->last_len = NULL;
    return pyops_range(src->ctx, src->ops, src->is_list, i0, i1, src->peer, out,
                       &src->total);
}

/*
 * Submits the n operations of src in slices, each as soon as it is
 * converted, so the engine moves the first while the next converts:
 * first operations, then four times more each slice, at most maxb slices
 * (the last takes the rest). Returns n with res[1] the number of batches
 * (their handles in batches); 0 when a submit failed (res[2] its status);
 * -1 when src declined. On 0 and -1 no batch is left: those submitted
 * are canceled and destroyed.
 */
static Py_ssize_t pyops_sliced(struct pyops_src *src, Py_ssize_t n,
                               void *engine, Py_ssize_t first, uint64_t *out,
                               void **batches, Py_ssize_t maxb, uint64_t *res)
{
    Py_ssize_t i0 = 0, step, nb = 0;
    int st;

    for (step = first > 0 ? first : n; i0 < n; step *= 4) {
        Py_ssize_t i1 = (nb == maxb - 1 || step >= n - i0) ? n : i0 + step;

        if (pyops_src_fill(src, i0, i1, out) != 0) {
            pyops_undo(batches, nb);
            return -1;
        }
        st = pyops_post(engine, out, i0, i1, &batches[nb]);
        if (st != 0) {
            pyops_undo(batches, nb);
            res[2] = (uint64_t)(int64_t)st;
            return 0;
        }
        nb++;
        i0 = i1;
    }
    res[1] = (uint64_t)nb;
    return n;
}

/*
 * Converts ops as kvf_pyops_pack does and submits them in slices as
 * pyops_sliced does, with the engine, peer, op array and outputs of
 * *call. Returns the number of operations, with call->res[0] their total
 * length and res[1] the number of batches (their handles in
 * call->batches); 0 when a submit failed (res[2] its status); -2 with no
 * exception set when the Python path must convert ops instead; -3 when
 * call->out has no room for them (the package grows it and calls again).
 * On 0, -2 and -3 no batch is left.
 */
Py_ssize_t kvf_pyops_submit_call(PyObject *ops, unsigned type,
                                 const struct pyops_call *call)
{
    struct pyops_ctx c = {.region_cls = call->region_cls, .type = type};
    struct pyops_src src = {.ctx = &c, .ops = ops, .peer = call->peer};
    Py_ssize_t n = pyops_len(ops, &src.is_list);

    if (pyops_submit_ex == NULL || n <= 0 || call->maxb <= 0)
        return -2;
    if (n > call->cap)
        return -3;
    n = pyops_sliced(&src, n, call->engine, call->first, call->out,
                     call->batches, call->maxb, call->res);
    call->res[0] = src.total;
    return n < 0 ? -2 : n;
}

/*
 * Submits n blocks given as arrays (kvf_pyops_blocks) in slices as
 * kvf_pyops_submit_call does, into out (cap operations), every block checked
 * first: nothing is submitted when one lies outside the region. Returns n
 * (res[0] the total length, res[1] the batches), 0 when a submit failed
 * (res[2] its status), -1 for a block outside the region, -2 when it
 * cannot (n does not fit out, no library calls): the caller submits the
 * whole array then.
 */
Py_ssize_t kvf_pyops_blocks_submit(const uint64_t *offs, const uint64_t *addrs,
                                   const uint64_t *lens, uint64_t len,
                                   Py_ssize_t n, uint64_t base, uint64_t nbytes,
                                   unsigned type, uint64_t peer, void *engine,
                                   Py_ssize_t first, uint64_t *out,
                                   Py_ssize_t cap, void **batches,
                                   Py_ssize_t maxb, uint64_t *res)
{
    struct pyops_blocks b = {offs, addrs, lens, len, base, nbytes, peer, type};
    struct pyops_src src = {.blocks = &b};

    if (pyops_submit_ex == NULL || n <= 0 || n > cap || maxb <= 0)
        return -2;
    if (pyops_blocks_check(&b, n, &res[0]) != 0)
        return -1;
    return pyops_sliced(&src, n, engine, first, out, batches, maxb, res);
}
