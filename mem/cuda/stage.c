/*
 * mem/cuda: socket I/O of GPU memory through pinned staging slots, for
 * transports (tcp today) whose target or initiator memory is on a GPU.
 *
 * An I/O vector is walked in runs: bytes outside registered GPU regions
 * go to the socket directly; GPU bytes are mapped onto a ring of pinned
 * slots (cuda_stage_slots x cuda_stage_bytes, 4 x 1 MiB by default).
 *
 * Receive (readv): socket bytes for GPU runs land in the current slot;
 * when it fills (or the device changes) everything received so far is
 * read, the slot's scatter kernel is launched (one launch for all its
 * blocks) and the next slot is taken, so the GPU copies slot k while the
 * socket fills slot k+1. At the end all slots are waited for: when the
 * call returns, the bytes are in GPU memory.
 *
 * Send (writev): a producer fills slots with gather launches as far as
 * free slots allow; the consumer waits for the slot at the head of the
 * queue and sends its bytes (with the host pieces around them), freeing
 * it for the producer. Up to all slots but one are being gathered while
 * one is being sent.
 *
 * Every slot is filled whole: the first gather of a send and the last
 * scatter of a receive cannot overlap the socket, but smaller slots at
 * the ends saved no more than their extra launches cost
 * (docs/decisions/mem-gpu-copy.md).
 */
#include "mem/cuda/kern.h"
#include "core/alloc.h"
#include "core/config.h"
#include "core/checksum.h"
#include "core/log.h"
#include "core/sock.h"
#include "core/time.h"

#include <string.h>

#define KVF_STAGE_IOV_BATCH 512
#define KVF_STAGE_SLOTS_MAX 16

extern const kvf_config_table_t kvf_cuda_config;

typedef struct kvf_stage_piece {
    char *p;
    uint64_t len;
    int slot; /* -1: host memory */
} kvf_stage_piece_t;

struct kvf_mem_stage {
    unsigned nslots;
    kvf_cuda_slot_t slot[KVF_STAGE_SLOTS_MAX];
    int slot_dev[KVF_STAGE_SLOTS_MAX];
    int posted[KVF_STAGE_SLOTS_MAX];
    unsigned pieces[KVF_STAGE_SLOTS_MAX]; /* writev: unsent pieces */
    cudaStream_t stream[KVF_CUDA_DEV_MAX];
    unsigned *err;
    struct iovec *iov;
    size_t iov_cap;
    kvf_stage_piece_t *q;
    size_t q_cap;
};

void kvf_cuda_stage_free(kvf_cuda_stage_t *st)
{
    unsigned i;
    int d;

    if (st == NULL) {
        return;
    }
    for (i = 0; i < st->nslots; i++) {
        kvf_cuda_slot_wait(&st->slot[i], kvf_time_ms() + 10000);
        kvf_cuda_slot_fini(&st->slot[i]);
    }
    for (d = 0; d < KVF_CUDA_DEV_MAX; d++) {
        if (st->stream[d] != NULL) {
            cudaSetDevice(d);
            cudaStreamDestroy(st->stream[d]);
        }
    }
    if (st->err != NULL) {
        cudaFreeHost(st->err);
    }
    kvf_free(st->iov);
    kvf_free(st->q);
    kvf_free(st);
}

static kvf_status_t kvf_stage_get(kvf_cuda_stage_t **stage_p,
                                  kvf_cuda_stage_t **st_p)
{
    uint64_t bytes = 1u << 20, nslots = 4;
    kvf_cuda_stage_t *st = *stage_p;
    kvf_status_t status;
    unsigned i;

    if (st != NULL) {
        *st_p = st;
        return KVF_OK;
    }
    if (kvf_cuda_device_count() == 0) {
        return KVF_ERR_UNAVAILABLE;
    }
    if (kvf_config_u64(&kvf_cuda_config, "cuda_stage_bytes", &bytes) !=
            KVF_OK ||
        bytes < 65536) {
        bytes = 1u << 20;
    }
    if (kvf_config_u64(&kvf_cuda_config, "cuda_stage_slots", &nslots) !=
            KVF_OK ||
        nslots < 2 || nslots > KVF_STAGE_SLOTS_MAX) {
        nslots = 4;
    }
    st = kvf_calloc(1, sizeof(*st));
    if (st == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    status = KVF_CUDA_CHECK(cudaHostAlloc(
        (void **)&st->err, 64, cudaHostAllocPortable | cudaHostAllocMapped));
    for (i = 0; i < nslots && status == KVF_OK; i++) {
        status = kvf_cuda_slot_init(&st->slot[i], bytes,
                                    (unsigned)(bytes / 512) + 16);
        st->nslots = i + 1;
        st->slot_dev[i] = -1;
    }
    if (status != KVF_OK) {
        kvf_cuda_stage_free(st);
        return status;
    }
    *(volatile unsigned *)st->err = 0;
    *stage_p = st;
    *st_p = st;
    return KVF_OK;
}

static kvf_status_t kvf_stage_stream(kvf_cuda_stage_t *st, int dev,
                                     cudaStream_t *s_p)
{
    kvf_status_t status = kvf_cuda_use(dev);

    if (status == KVF_OK && st->stream[dev] == NULL) {
        status = KVF_CUDA_CHECK(
            cudaStreamCreateWithFlags(&st->stream[dev], cudaStreamNonBlocking));
    }
    *s_p = st->stream[dev];
    return status;
}

static kvf_status_t kvf_stage_post(kvf_cuda_stage_t *st, unsigned k, int to_gpu)
{
    kvf_status_t status;
    cudaStream_t s;

    if (st->slot[k].nblks == 0 || st->posted[k]) {
        return KVF_OK;
    }
    status = kvf_stage_stream(st, st->slot_dev[k], &s);
    if (status == KVF_OK) {
        status = kvf_cuda_slot_post(&st->slot[k], st->slot_dev[k], s, to_gpu,
                                    st->err);
    }
    if (status == KVF_OK) {
        st->posted[k] = 1;
    }
    return status;
}

/* Waits for slot k's copy and makes it empty. */
static kvf_status_t kvf_stage_reset(kvf_cuda_stage_t *st, unsigned k,
                                    uint64_t deadline)
{
    kvf_status_t status = kvf_cuda_slot_wait(&st->slot[k], deadline);

    if (status == KVF_OK) {
        st->slot[k].used = 0;
        st->slot[k].nblks = 0;
        st->slot_dev[k] = -1;
        st->posted[k] = 0;
        st->pieces[k] = 0;
    }
    return status;
}

static kvf_status_t kvf_stage_iov_room(kvf_cuda_stage_t *st, size_t n)
{
    struct iovec *p;

    if (n <= st->iov_cap) {
        return KVF_OK;
    }
    p = kvf_realloc(st->iov, n * sizeof(*p));
    if (p == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    st->iov = p;
    st->iov_cap = n;
    return KVF_OK;
}

/* Does any byte of the vector lie in a registered GPU region? */
static int kvf_stage_any_gpu(const struct iovec *iov, size_t n)
{
    uint64_t addr, left, run;
    size_t i, off;

    if (!kvf_cuda_have_gpu_regions()) {
        return 0;
    }
    for (i = 0; i < n; i++) {
        for (off = 0; off < iov[i].iov_len; off += run) {
            addr = (uint64_t)(uintptr_t)iov[i].iov_base + off;
            if (kvf_cuda_region_lookup(addr, NULL, &left) == KVF_MEM_CUDA) {
                return 1;
            }
            run = iov[i].iov_len - off;
            if (left < run) {
                run = left;
            }
        }
    }
    return 0;
}

static kvf_status_t kvf_stage_check_err(kvf_cuda_stage_t *st)
{
    if (*(volatile unsigned *)st->err != 0) {
        *(volatile unsigned *)st->err = 0;
        return KVF_ERR_INTERNAL;
    }
    return KVF_OK;
}

/* Takes the connection's stage (created on first need), every slot
 * empty, room for a batch of iovecs. *st_p stays NULL when there is no
 * stage. */
static kvf_status_t kvf_stage_begin(kvf_cuda_stage_t **stage_p,
                                    kvf_cuda_stage_t **st_p,
                                    uint64_t deadline_ms)
{
    kvf_cuda_stage_t *st = NULL;
    kvf_status_t status;
    unsigned j;

    *st_p = NULL;
    status = kvf_stage_get(stage_p, &st);
    if (status != KVF_OK) {
        return status;
    }
    *st_p = st;
    for (j = 0; j < st->nslots && status == KVF_OK; j++) {
        status = kvf_stage_reset(st, j, deadline_ms);
    }
    if (status == KVF_OK) {
        status = kvf_stage_iov_room(st, KVF_STAGE_IOV_BATCH);
    }
    return status;
}

/* Waits for every slot and empties it; the first error of status and
 * those waits. */
static kvf_status_t kvf_stage_end(kvf_cuda_stage_t *st, kvf_status_t status,
                                  uint64_t deadline_ms)
{
    kvf_status_t w;
    unsigned j;

    for (j = 0; j < st->nslots; j++) {
        w = kvf_stage_reset(st, j, deadline_ms);
        if (status == KVF_OK) {
            status = w;
        }
    }
    return status;
}

/* A receive in progress: the slot being filled, the iovecs waiting for
 * the socket. */
typedef struct kvf_stage_rd {
    kvf_cuda_stage_t *st;
    int fd;
    unsigned k;
    size_t m;
    uint64_t deadline;
} kvf_stage_rd_t;

/* Slot k is full: everything pending is received (the slot's bytes must
 * all be in before its launch), its scatter launched, the next taken. */
static kvf_status_t kvf_stage_rd_next(kvf_stage_rd_t *r)
{
    kvf_status_t status;

    status = kvf_sock_readv_all(r->fd, r->st->iov, r->m, r->deadline);
    r->m = 0;
    if (status == KVF_OK) {
        status = kvf_stage_post(r->st, r->k, 1);
    }
    r->k = (r->k + 1) % r->st->nslots;
    if (status == KVF_OK) {
        status = kvf_stage_reset(r->st, r->k, r->deadline);
    }
    return status;
}

/* Maps GPU bytes at addr (at most *run_p, left to the region's end) onto
 * slot k; *run_p becomes the bytes mapped, 0 when the slot was full and
 * the next one taken instead. */
static kvf_status_t kvf_stage_rd_gpu(kvf_stage_rd_t *r, uint64_t addr, int dev,
                                     uint64_t left, uint64_t *run_p)
{
    kvf_cuda_stage_t *st = r->st;
    kvf_cuda_slot_t *s = &st->slot[r->k];
    uint64_t run = *run_p, piece;

    if (s->nblks > 0 && (st->slot_dev[r->k] != dev || s->used >= s->cap ||
                         s->nblks == s->blks_cap)) {
        *run_p = 0;
        return kvf_stage_rd_next(r);
    }
    piece = s->cap - s->used;
    run = (run < left) ? run : left;
    run = (run < piece) ? run : piece;
    st->iov[r->m].iov_base = s->buf + s->used;
    st->iov[r->m].iov_len = run;
    r->m++;
    s->blks[s->nblks].src_off = s->used;
    s->blks[s->nblks].dst_off = addr;
    s->blks[s->nblks].len = run;
    s->nblks++;
    s->used += run;
    st->slot_dev[r->k] = dev;
    *run_p = run;
    return KVF_OK;
}

kvf_status_t kvf_cuda_readv(kvf_cuda_stage_t **stage_p, int fd,
                            struct iovec *iov, size_t iovcnt,
                            uint64_t deadline_ms)
{
    uint64_t addr, left, run;
    kvf_cuda_stage_t *st;
    kvf_status_t status;
    kvf_stage_rd_t r;
    size_t i, off;
    int dev;

    if (!kvf_stage_any_gpu(iov, iovcnt)) {
        return kvf_sock_readv_all(fd, iov, iovcnt, deadline_ms);
    }
    status = kvf_stage_begin(stage_p, &st, deadline_ms);
    if (st == NULL) {
        return status;
    }
    memset(&r, 0, sizeof(r));
    r.st = st;
    r.fd = fd;
    r.deadline = deadline_ms;
    for (i = 0; i < iovcnt && status == KVF_OK; i++) {
        for (off = 0; off < iov[i].iov_len && status == KVF_OK; off += run) {
            addr = (uint64_t)(uintptr_t)iov[i].iov_base + off;
            run = iov[i].iov_len - off;
            if (kvf_cuda_region_lookup(addr, &dev, &left) == KVF_MEM_CUDA) {
                status = kvf_stage_rd_gpu(&r, addr, dev, left, &run);
                if (run == 0) {
                    continue;
                }
            } else {
                run = (left < run) ? left : run;
                st->iov[r.m].iov_base = (void *)(uintptr_t)addr;
                st->iov[r.m].iov_len = run;
                r.m++;
            }
            if (r.m == KVF_STAGE_IOV_BATCH) {
                status = kvf_sock_readv_all(fd, st->iov, r.m, deadline_ms);
                r.m = 0;
            }
        }
    }
    if (status == KVF_OK && r.m > 0) {
        status = kvf_sock_readv_all(fd, st->iov, r.m, deadline_ms);
    }
    if (status == KVF_OK) {
        status = kvf_stage_post(st, r.k, 1);
    }
    status = kvf_stage_end(st, status, deadline_ms);
    if (status == KVF_OK) {
        status = kvf_stage_check_err(st);
    }
    return status;
}

static kvf_status_t kvf_stage_push(kvf_cuda_stage_t *st, size_t *qn, char *p,
                                   uint64_t len, int slot)
{
    kvf_stage_piece_t *q;

    if (*qn == st->q_cap) {
        size_t cap = st->q_cap ? st->q_cap * 2 : 256;

        q = kvf_realloc(st->q, cap * sizeof(*q));
        if (q == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        st->q = q;
        st->q_cap = cap;
    }
    st->q[*qn].p = p;
    st->q[*qn].len = len;
    st->q[*qn].slot = slot;
    (*qn)++;
    if (slot >= 0) {
        st->pieces[slot]++;
    }
    return KVF_OK;
}

/* A send in progress: the slot being filled, the queue of pieces to
 * send (host ranges and slot bytes, in order). */
typedef struct kvf_stage_wr {
    kvf_cuda_stage_t *st;
    int fd;
    unsigned k;
    size_t qh, qn;
    uint64_t deadline;
} kvf_stage_wr_t;

/* Maps GPU bytes at addr (at most *run_p, left to the region's end) onto
 * slot k and queues them; *run_p becomes the bytes mapped, 0 when slot k
 * was full and its gather launched instead. KVF_INPROGRESS: slot k's
 * bytes are not sent yet, nothing more can be produced now. */
static kvf_status_t kvf_stage_wr_gpu(kvf_stage_wr_t *w, uint64_t addr, int dev,
                                     uint64_t left, uint64_t *run_p)
{
    kvf_cuda_stage_t *st = w->st;
    kvf_cuda_slot_t *s = &st->slot[w->k];
    uint64_t run = *run_p, piece;
    kvf_status_t status;

    *run_p = 0;
    if (st->posted[w->k]) {
        return KVF_INPROGRESS;
    }
    if (s->nblks > 0 && (st->slot_dev[w->k] != dev || s->used >= s->cap ||
                         s->nblks == s->blks_cap)) {
        status = kvf_stage_post(st, w->k, 0);
        w->k = (w->k + 1) % st->nslots;
        return status;
    }
    piece = s->cap - s->used;
    run = (run < left) ? run : left;
    run = (run < piece) ? run : piece;
    s->blks[s->nblks].src_off = addr;
    s->blks[s->nblks].dst_off = s->used;
    s->blks[s->nblks].len = run;
    s->nblks++;
    status = kvf_stage_push(st, &w->qn, s->buf + s->used, run, (int)w->k);
    s->used += run;
    st->slot_dev[w->k] = dev;
    *run_p = run;
    return status;
}

/* Produce: maps the input from (*i, *off) onto free slots, launching
 * gathers, until the input ends or no slot is free; the last partial
 * slot is launched once the input ends. */
static kvf_status_t kvf_stage_wr_produce(kvf_stage_wr_t *w,
                                         const struct iovec *iov, size_t iovcnt,
                                         size_t *i, size_t *off)
{
    kvf_cuda_stage_t *st = w->st;
    kvf_status_t status = KVF_OK;
    uint64_t addr, left, run;
    int dev;

    while (*i < iovcnt && status == KVF_OK) {
        if (*off == iov[*i].iov_len) {
            (*i)++;
            *off = 0;
            continue;
        }
        addr = (uint64_t)(uintptr_t)iov[*i].iov_base + *off;
        run = iov[*i].iov_len - *off;
        if (kvf_cuda_region_lookup(addr, &dev, &left) != KVF_MEM_CUDA) {
            run = (run < left) ? run : left;
            status =
                kvf_stage_push(st, &w->qn, (char *)(uintptr_t)addr, run, -1);
        } else {
            status = kvf_stage_wr_gpu(w, addr, dev, left, &run);
        }
        *off += run;
    }
    if (status == KVF_INPROGRESS) {
        return KVF_OK;
    }
    if (status == KVF_OK && *i == iovcnt && !st->posted[w->k] &&
        st->slot[w->k].nblks > 0) {
        status = kvf_stage_post(st, w->k, 0);
        w->k = (w->k + 1) % st->nslots;
    }
    return status;
}

/* Consume: sends the head slot's bytes and the host bytes around them,
 * then frees the slots whose pieces are all sent. */
static kvf_status_t kvf_stage_wr_consume(kvf_stage_wr_t *w)
{
    kvf_cuda_stage_t *st = w->st;
    kvf_status_t status = KVF_OK;
    size_t e, m;
    int cur = -1, sl;

    for (e = w->qh, m = 0; e < w->qn && m < KVF_STAGE_IOV_BATCH; e++, m++) {
        sl = st->q[e].slot;
        if (sl >= 0 && cur >= 0 && sl != cur) {
            break;
        }
        if (sl >= 0 && cur < 0) {
            cur = sl;
            status = kvf_cuda_slot_wait(&st->slot[cur], w->deadline);
            if (status != KVF_OK) {
                break;
            }
        }
        st->iov[m].iov_base = st->q[e].p;
        st->iov[m].iov_len = st->q[e].len;
    }
    if (status == KVF_OK) {
        status = kvf_stage_check_err(st);
    }
    if (status == KVF_OK) {
        status = kvf_sock_writev_all(w->fd, st->iov, m, w->deadline);
    }
    for (; w->qh < e && status == KVF_OK; w->qh++) {
        sl = st->q[w->qh].slot;
        if (sl >= 0 && --st->pieces[sl] == 0) {
            status = kvf_stage_reset(st, (unsigned)sl, w->deadline);
        }
    }
    if (w->qh == w->qn) {
        w->qh = w->qn = 0;
    }
    return status;
}

kvf_status_t kvf_cuda_writev(kvf_cuda_stage_t **stage_p, int fd,
                             struct iovec *iov, size_t iovcnt,
                             uint64_t deadline_ms)
{
    size_t i = 0, off = 0;
    kvf_cuda_stage_t *st;
    kvf_status_t status;
    kvf_stage_wr_t w;

    if (!kvf_stage_any_gpu(iov, iovcnt)) {
        return kvf_sock_writev_all(fd, iov, iovcnt, deadline_ms);
    }
    status = kvf_stage_begin(stage_p, &st, deadline_ms);
    if (st == NULL) {
        return status;
    }
    memset(&w, 0, sizeof(w));
    w.st = st;
    w.fd = fd;
    w.deadline = deadline_ms;
    while (status == KVF_OK) {
        status = kvf_stage_wr_produce(&w, iov, iovcnt, &i, &off);
        if (status != KVF_OK || w.qh == w.qn) {
            break;
        }
        status = kvf_stage_wr_consume(&w);
    }
    return kvf_stage_end(st, status, deadline_ms);
}

kvf_status_t kvf_cuda_hash(kvf_cuda_stage_t **stage_p, uint64_t addr,
                           uint64_t len, uint64_t *hash_p, uint64_t deadline_ms)
{
    kvf_cuda_stage_t *st;
    kvf_status_t status;
    uint64_t left, done, piece;
    kvf_cuda_slot_t *s;
    char *buf;
    int dev;

    if (kvf_cuda_region_lookup(addr, &dev, &left) != KVF_MEM_CUDA ||
        left < len) {
        return KVF_ERR_OUT_OF_BOUNDS;
    }
    status = kvf_stage_get(stage_p, &st);
    if (status == KVF_OK) {
        status = kvf_stage_reset(st, 0, deadline_ms);
    }
    if (status != KVF_OK) {
        return status;
    }
    buf = kvf_malloc(len + 1);
    if (buf == NULL) {
        return KVF_ERR_NO_MEMORY;
    }
    s = &st->slot[0];
    for (done = 0; done < len && status == KVF_OK; done += piece) {
        piece = len - done;
        if (piece > s->cap) {
            piece = s->cap;
        }
        s->blks[0].src_off = addr + done;
        s->blks[0].dst_off = 0;
        s->blks[0].len = piece;
        s->nblks = 1;
        s->used = piece;
        st->slot_dev[0] = dev;
        status = kvf_stage_post(st, 0, 0);
        if (status == KVF_OK) {
            status = kvf_cuda_slot_wait(s, deadline_ms);
        }
        if (status == KVF_OK) {
            memcpy(buf + done, s->buf, piece);
            status = kvf_stage_reset(st, 0, deadline_ms);
        }
    }
    if (status == KVF_OK) {
        status = kvf_stage_check_err(st);
    }
    if (status == KVF_OK) {
        *hash_p = kvf_hash64(buf, len, 0);
    }
    kvf_free(buf);
    return status;
}
