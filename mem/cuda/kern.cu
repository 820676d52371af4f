/*
 * Copy kernels: one launch moves many scattered blocks. Each block's
 * descriptor {src_off, dst_off, len} is checked against the two sides'
 * lengths (a refused block is not copied and sets the error word, a
 * plain store to mapped host memory: no atomics over PCIe).
 *
 * warp: a warp per block, grid-stride over the blocks. When source and
 *   destination have the same alignment modulo 16, the block moves in
 *   16-byte vectors (byte head and tail); else 8-, 4- or 1-byte words.
 *   Eight independent loads per lane are in flight before the first
 *   store, which keeps enough requests outstanding to cover PCIe and
 *   NVLink latency with a few warps per SM. The next descriptor is
 *   loaded while the current block moves.
 * bulk: Hopper's bulk copy engine (cp.async.bulk, sm_90): one lane per
 *   CTA streams 16-byte-aligned blocks global -> shared -> global through
 *   a ring of shared-memory stages, loads running a few stages ahead of
 *   stores (mbarrier completion, bulk groups); the warp copies the
 *   blocks that are not 16-byte aligned itself first.
 *
 * sum: the warp kernel that also computes each block's kvf_checksum()
 *   (XXH3-64) while it moves it, from the vectors it already holds in
 *   registers (xxh3.h says how the hash splits over the lanes); only the
 *   last partial KiB of a block is read a second time, from the side in
 *   GPU memory. The same kernel without stores checksums blocks in place.
 *
 * Built for sm_90 only (CMAKE_CUDA_ARCHITECTURES 90).
 */
#include "mem/cuda/kern.h"
#include "mem/cuda/xxh3.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define KVF_FULL_MASK        0xffffffffu
#define KVF_WARP_CTA         256 /* threads per CTA of the warp kernel */
#define KVF_WARP_UNROLL      8
#define KVF_BULK_STAGES      5
#define KVF_BULK_AHEAD       3
#define KVF_BULK_STAGE       8192u
#define KVF_BULK_CTAS_PER_SM 4

struct kvf_desc {
    uint64_t so, doff, len;
};

__device__ __forceinline__ kvf_desc kvf_load_desc(const kvf_cuda_blk_t *blks,
                                                  unsigned b, unsigned n,
                                                  unsigned lane)
{
    kvf_desc d;
    uint64_t v = 0;

    if (b < n && lane < 3) {
        v = ((const uint64_t *)(blks + b))[lane];
    }
    d.so = __shfl_sync(KVF_FULL_MASK, v, 0);
    d.doff = __shfl_sync(KVF_FULL_MASK, v, 1);
    d.len = __shfl_sync(KVF_FULL_MASK, v, 2);
    return d;
}

__device__ __forceinline__ bool kvf_desc_ok(const kvf_desc &d, uint64_t sl,
                                            uint64_t dl)
{
    return d.so <= sl && d.len <= sl - d.so && d.doff <= dl &&
           d.len <= dl - d.doff;
}

/* Copies len bytes with words of type T (W bytes); dst is brought to a
 * W-byte boundary first, src has the same alignment modulo W. */
template <typename T, int W, int U>
__device__ __forceinline__ void kvf_copy_words(const char *__restrict__ s,
                                               char *__restrict__ d,
                                               uint64_t len, unsigned lane)
{
    uint64_t head = (W - ((uintptr_t)d & (W - 1))) & (W - 1);
    uint64_t nv, i, done, tail;
    const T *vs;
    T *vd;

    if (head > len) {
        head = len;
    }
    if (lane < head) {
        d[lane] = s[lane];
    }
    s += head;
    d += head;
    len -= head;
    nv = len / W;
    vs = (const T *)s;
    vd = (T *)d;
    i = lane;
    for (; i + (U - 1) * 32 < nv; i += U * 32) {
        T v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            v[u] = __ldcs(vs + i + u * 32);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            __stcs(vd + i + u * 32, v[u]);
        }
    }
    for (; i < nv; i += 32) {
        __stcs(vd + i, __ldcs(vs + i));
    }
    done = nv * W;
    tail = len - done;
    if (lane < tail) {
        d[done + lane] = s[done + lane];
    }
}

__device__ __forceinline__ void kvf_copy_bytes(const char *__restrict__ s,
                                               char *__restrict__ d,
                                               uint64_t len, unsigned lane)
{
    uint64_t i = lane;

    for (; i + 96 < len; i += 128) {
        char a = s[i], b = s[i + 32], c = s[i + 64], e = s[i + 96];

        d[i] = a;
        d[i + 32] = b;
        d[i + 64] = c;
        d[i + 96] = e;
    }
    for (; i < len; i += 32) {
        d[i] = s[i];
    }
}

template <int U>
__device__ __forceinline__ void kvf_copy_block(const char *s, char *d,
                                               uint64_t len, unsigned lane)
{
    uintptr_t mis = (uintptr_t)s ^ (uintptr_t)d;

    if ((mis & 15) == 0) {
        kvf_copy_words<uint4, 16, U>(s, d, len, lane);
    } else if ((mis & 7) == 0) {
        kvf_copy_words<uint2, 8, 4>(s, d, len, lane);
    } else if ((mis & 3) == 0) {
        kvf_copy_words<unsigned, 4, 4>(s, d, len, lane);
    } else {
        kvf_copy_bytes(s, d, len, lane);
    }
}

/* Completion signal: after every thread's writes are fenced at system
 * scope, the last CTA to finish resets the counter and publishes seq in
 * the mapped host word the host polls. */
__device__ __forceinline__ void kvf_signal_done(unsigned *ctr, unsigned *flag,
                                                unsigned seq)
{
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
        if (atomicAdd(ctr, 1u) == gridDim.x - 1) {
            *(volatile unsigned *)ctr = 0;
            __threadfence_system();
            *(volatile unsigned *)flag = seq;
        }
    }
}

/* Work item i is part (i & (2^pshift - 1)) of block i >> pshift: with
 * few blocks (small batches) several warps share a block, so that every
 * warp the GPU holds has bytes in flight from the start. A part is a
 * 16-byte multiple at the same offset on both sides (alignment kept).
 * This warp handles items warp, warp + nwarps, ... */
template <int U>
__device__ __forceinline__ void
kvf_copy_items(const kvf_cuda_blk_t *__restrict__ blks, unsigned n, uint64_t sb,
               uint64_t sl, uint64_t db, uint64_t dl, unsigned *err,
               unsigned pshift, unsigned warp, unsigned nwarps, unsigned lane)
{
    unsigned items = n << pshift, pmask = (1u << pshift) - 1u;
    unsigned b;
    kvf_desc cur, next;

    cur = kvf_load_desc(blks, warp >> pshift, n, lane);
    for (b = warp; b < items; b += nwarps) {
        next = kvf_load_desc(blks, (b + nwarps) >> pshift, n, lane);
        if (!kvf_desc_ok(cur, sl, dl)) {
            if (lane == 0) {
                *(volatile unsigned *)err = 1u; /* mapped host word */
            }
        } else if (cur.len > 0) {
            uint64_t start = 0, len = cur.len;

            if (pshift != 0) {
                uint64_t chunk = (((cur.len + pmask) >> pshift) + 15) & ~15ull;

                start = (uint64_t)(b & pmask) * chunk;
                start = start < cur.len ? start : cur.len;
                len = cur.len - start < chunk ? cur.len - start : chunk;
            }
            if (len > 0) {
                kvf_copy_block<U>(
                    (const char *)(uintptr_t)(sb + cur.so + start),
                    (char *)(uintptr_t)(db + cur.doff + start), len, lane);
            }
        }
        cur = next;
    }
}

template <int U>
__global__ void __launch_bounds__(KVF_WARP_CTA)
    kvf_copy_warp_kernel(const kvf_cuda_blk_t *__restrict__ blks, unsigned n,
                         uint64_t sb, uint64_t sl, uint64_t db, uint64_t dl,
                         unsigned *err, unsigned *ctr, unsigned *flag,
                         unsigned seq, unsigned pshift)
{
    unsigned lane = threadIdx.x & 31;
    unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    unsigned nwarps = (gridDim.x * blockDim.x) >> 5;

    kvf_copy_items<U>(blks, n, sb, sl, db, dl, err, pshift, warp, nwarps, lane);
    if (flag != NULL) {
        kvf_signal_done(ctr, flag, seq);
    }
}

/* ---- resident copy kernel --------------------------------------------- */

__device__ __forceinline__ uint64_t kvf_gtime(void)
{
    uint64_t t;

    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ uint64_t kvf_ld_acq_sys(const uint64_t *p)
{
    uint64_t v;

    asm volatile("ld.acquire.sys.global.u64 %0, [%1];"
                 : "=l"(v)
                 : "l"(p)
                 : "memory");
    return v;
}

__device__ __forceinline__ uint64_t kvf_ld_rlx_sys(const uint64_t *p)
{
    uint64_t v;

    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];"
                 : "=l"(v)
                 : "l"(p)
                 : "memory");
    return v;
}

__device__ __forceinline__ unsigned kvf_ld_acq_gpu(const unsigned *p)
{
    unsigned v;

    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                 : "=r"(v)
                 : "l"(p)
                 : "memory");
    return v;
}

__device__ __forceinline__ void kvf_st_rel_gpu(unsigned *p, unsigned v)
{
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v)
                 : "memory");
}

struct kvf_res_job {
    uint64_t blks, sb, sl, db, dl;
    unsigned n, pshift, seq;
};

/* CTA 0, thread 0: waits for the host's next job (one PCIe read per
 * poll: the job word carries the sequence number, n and pshift; the
 * addresses are read too only when the host marks them fresh, else the
 * copy kept in device memory is used), publishes it to the other CTAs
 * through device memory. 0: leave (stop bit, or idle past idle_ns). */
__device__ int kvf_res_take_host(kvf_cuda_res_host_t *h, kvf_cuda_res_dev_t *dv,
                                 kvf_res_job &j, unsigned seen, unsigned epoch,
                                 uint64_t idle_ns)
{
    uint64_t t0 = kvf_gtime();

    for (;;) {
        uint64_t w = kvf_ld_acq_sys(&h->job);
        unsigned seq = (unsigned)w;

        if (seq != seen) {
            j.seq = seq;
            j.n = (unsigned)(w >> KVF_RES_N_SHIFT) & KVF_RES_N_MAX;
            j.pshift = (unsigned)(w >> KVF_RES_P_SHIFT) & 3u;
            if ((w >> KVF_RES_FRESH_BIT) & 1u) {
                j.blks = kvf_ld_rlx_sys(&h->blks);
                j.sb = kvf_ld_rlx_sys(&h->src_base);
                j.sl = kvf_ld_rlx_sys(&h->src_len);
                j.db = kvf_ld_rlx_sys(&h->dst_base);
                j.dl = kvf_ld_rlx_sys(&h->dst_len);
                dv->blks = j.blks;
                dv->src_base = j.sb;
                dv->src_len = j.sl;
                dv->dst_base = j.db;
                dv->dst_len = j.dl;
            } else {
                volatile kvf_cuda_res_dev_t *v = dv;

                j.blks = v->blks;
                j.sb = v->src_base;
                j.sl = v->src_len;
                j.db = v->dst_base;
                j.dl = v->dst_len;
            }
            dv->n = j.n;
            dv->pshift = j.pshift;
            kvf_st_rel_gpu(&dv->gen, seq);
            return 1;
        }
        if (((w >> KVF_RES_STOP_BIT) & 1u) || kvf_gtime() - t0 > idle_ns) {
            kvf_st_rel_gpu(&dv->quit, epoch);
            return 0;
        }
    }
}

/* Other CTAs, thread 0: wait for CTA 0's next job in device memory. The
 * bound (twice CTA 0's idle time plus 10 ms) is a safety net only: CTA 0
 * leaves first and says so through dv->quit. */
__device__ int kvf_res_take_dev(kvf_cuda_res_dev_t *dv, kvf_res_job &j,
                                unsigned seen, unsigned epoch, uint64_t idle_ns)
{
    uint64_t t0 = kvf_gtime();

    for (;;) {
        unsigned g = kvf_ld_acq_gpu(&dv->gen);

        if (g != seen) {
            volatile kvf_cuda_res_dev_t *v = dv;

            j.seq = g;
            j.n = v->n;
            j.pshift = v->pshift;
            j.blks = v->blks;
            j.sb = v->src_base;
            j.sl = v->src_len;
            j.db = v->dst_base;
            j.dl = v->dst_len;
            return 1;
        }
        if (*(volatile unsigned *)&dv->quit == epoch ||
            kvf_gtime() - t0 > 2 * idle_ns + 10000000ull) {
            return 0;
        }
        __nanosleep(32);
    }
}

/* A copy kernel that stays on the GPU between batches (launched
 * cooperatively, so every CTA is resident): no launch per batch. The
 * host writes a job into pinned memory; CTA 0 picks it up and hands it
 * to the others; every CTA moves its items exactly as the warp kernel
 * does (same bounds checks) and the last one to finish publishes the
 * job's sequence number in h->done. Leaves when the host sets the stop
 * bit or after idle_ns without a job. */
template <int U>
__global__ void __launch_bounds__(KVF_WARP_CTA)
    kvf_res_kernel(kvf_cuda_res_host_t *h, kvf_cuda_res_dev_t *dv,
                   unsigned *err, unsigned seen, unsigned epoch,
                   uint64_t idle_ns)
{
    __shared__ kvf_res_job job;
    __shared__ int go;
    unsigned lane = threadIdx.x & 31;
    unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    unsigned nwarps = (gridDim.x * blockDim.x) >> 5;

    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *(volatile unsigned *)&h->alive = epoch;
    }
    for (;;) {
        if (threadIdx.x == 0) {
            go = blockIdx.x == 0
                     ? kvf_res_take_host(h, dv, job, seen, epoch, idle_ns)
                     : kvf_res_take_dev(dv, job, seen, epoch, idle_ns);
        }
        __syncthreads();
        if (!go) {
            break;
        }
        seen = job.seq;
        kvf_copy_items<U>((const kvf_cuda_blk_t *)(uintptr_t)job.blks, job.n,
                          job.sb, job.sl, job.db, job.dl, err, job.pshift, warp,
                          nwarps, lane);
        kvf_signal_done(&dv->ctr, (unsigned *)&h->done, seen);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        __threadfence_system();
        *(volatile unsigned *)&h->exited = epoch;
    }
}

/* ---- bulk copy engine (sm_90) ---------------------------------------- */

__device__ __forceinline__ uint32_t kvf_smem(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ bool kvf_bulk_ok(const kvf_desc &d, uint64_t sb,
                                            uint64_t db)
{
    return ((sb + d.so) & 15) == 0 && ((db + d.doff) & 15) == 0 &&
           (d.len & 15) == 0 && d.len > 0;
}

/* Walks this CTA's bulk-copyable pieces: blocks blockIdx.x + k*gridDim.x
 * that are aligned and in bounds, cut into stage-sized pieces. */
struct kvf_piece_it {
    unsigned b;
    uint64_t off;
    uint64_t src, dst, len; /* current piece */
    bool valid;
};

__device__ __forceinline__ void
kvf_piece_next(kvf_piece_it &it, const kvf_cuda_blk_t *blks, unsigned n,
               uint64_t sb, uint64_t sl, uint64_t db, uint64_t dl, bool advance)
{
    for (;;) {
        if (it.b >= n) {
            it.valid = false;
            return;
        }
        kvf_desc d;
        d.so = blks[it.b].src_off;
        d.doff = blks[it.b].dst_off;
        d.len = blks[it.b].len;
        if (advance) {
            it.off += KVF_BULK_STAGE;
            advance = false;
        }
        if (kvf_desc_ok(d, sl, dl) && kvf_bulk_ok(d, sb, db) &&
            it.off < d.len) {
            uint64_t left = d.len - it.off;

            it.src = sb + d.so + it.off;
            it.dst = db + d.doff + it.off;
            it.len = left < KVF_BULK_STAGE ? left : KVF_BULK_STAGE;
            it.valid = true;
            return;
        }
        it.b += gridDim.x;
        it.off = 0;
    }
}

__global__ void __launch_bounds__(32)
    kvf_copy_bulk_kernel(const kvf_cuda_blk_t *__restrict__ blks, unsigned n,
                         uint64_t sb, uint64_t sl, uint64_t db, uint64_t dl,
                         unsigned *err)
{
    __shared__ __align__(
        128) unsigned char stage[KVF_BULK_STAGES][KVF_BULK_STAGE];
    __shared__ __align__(8) uint64_t bar[KVF_BULK_STAGES];
    unsigned lane = threadIdx.x;
    unsigned b, issued = 0, stored = 0, phase = 0;
    kvf_piece_it ld, st;
    int s;

    /* pass 1: the warp copies blocks the bulk engine cannot take */
    for (b = blockIdx.x; b < n; b += gridDim.x) {
        kvf_desc d = kvf_load_desc(blks, b, n, lane);

        if (!kvf_desc_ok(d, sl, dl)) {
            if (lane == 0) {
                *(volatile unsigned *)err = 1u; /* mapped host word */
            }
        } else if (d.len > 0 && !kvf_bulk_ok(d, sb, db)) {
            kvf_copy_block<4>((const char *)(uintptr_t)(sb + d.so),
                              (char *)(uintptr_t)(db + d.doff), d.len, lane);
        }
    }
    if (lane != 0) {
        return;
    }
    /* pass 2: lane 0 drives the bulk copies */
    for (s = 0; s < KVF_BULK_STAGES; s++) {
        asm volatile(
            "mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(kvf_smem(&bar[s]))
            : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    ld.b = st.b = blockIdx.x;
    ld.off = st.off = 0;
    kvf_piece_next(ld, blks, n, sb, sl, db, dl, false);
    kvf_piece_next(st, blks, n, sb, sl, db, dl, false);
    for (;;) {
        while (ld.valid && issued - stored < KVF_BULK_AHEAD) {
            s = (int)(issued % KVF_BULK_STAGES);
            if (issued >= KVF_BULK_STAGES) {
                /* the store that last read stage s is done reading */
                asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(
                                 KVF_BULK_STAGES - KVF_BULK_AHEAD)
                             : "memory");
            }
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], "
                         "%1;" ::"r"(kvf_smem(&bar[s])),
                         "r"((uint32_t)ld.len)
                         : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::"
                         "complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                             kvf_smem(stage[s])),
                         "l"(ld.src), "r"((uint32_t)ld.len),
                         "r"(kvf_smem(&bar[s]))
                         : "memory");
            issued++;
            kvf_piece_next(ld, blks, n, sb, sl, db, dl, true);
        }
        if (stored == issued) {
            break;
        }
        s = (int)(stored % KVF_BULK_STAGES);
        {
            uint32_t done = 0, parity = (phase >> s) & 1u;

            while (!done) {
                asm volatile("{\n\t.reg .pred p;\n\t"
                             "mbarrier.try_wait.parity.shared::cta.b64 p, "
                             "[%1], %2;\n\t"
                             "selp.u32 %0, 1, 0, p;\n\t}"
                             : "=r"(done)
                             : "r"(kvf_smem(&bar[s])), "r"(parity)
                             : "memory");
            }
            phase ^= 1u << s;
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], "
                     "%2;" ::"l"(st.dst),
                     "r"(kvf_smem(stage[s])), "r"((uint32_t)st.len)
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        stored++;
        kvf_piece_next(st, blks, n, sb, sl, db, dl, true);
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

/* ---- checksumming copies --------------------------------------------- */

__constant__ uint8_t kvf_xxh_sec_dev[192] = KVF_XXH_SECRET_BYTES;

__device__ __forceinline__ uint64_t kvf_lo64(uint4 v)
{
    return (uint64_t)v.x | (uint64_t)v.y << 32;
}

__device__ __forceinline__ uint64_t kvf_hi64(uint4 v)
{
    return (uint64_t)v.z | (uint64_t)v.w << 32;
}

__device__ __forceinline__ uint64_t kvf_ld64(const uint8_t *p)
{
    if (((uintptr_t)p & 7) == 0) {
        return *(const uint64_t *)p;
    }
    return kvf_xxh_r64(p);
}

/* Sums each pair's terms over the 8 lanes that share it. */
__device__ __forceinline__ void kvf_xxh_reduce(uint64_t &c0, uint64_t &c1)
{
#pragma unroll
    for (int m = 4; m < 32; m <<= 1) {
        c0 += __shfl_xor_sync(KVF_FULL_MASK, c0, m);
        c1 += __shfl_xor_sync(KVF_FULL_MASK, c1, m);
    }
}

/* One KiB: this lane's vectors (at lane and lane + 32 of the KiB). */
__device__ __forceinline__ void kvf_xxh_kib(const kvf_xxh_keys_t &k, uint4 va,
                                            uint4 vb, uint64_t &a0,
                                            uint64_t &a1)
{
    uint64_t c0 = 0, c1 = 0;

    kvf_xxh_pair(kvf_lo64(va), kvf_hi64(va), k.ka0, k.ka1, &c0, &c1);
    kvf_xxh_pair(kvf_lo64(vb), kvf_hi64(vb), k.kb0, k.kb1, &c0, &c1);
    kvf_xxh_reduce(c0, c1);
    a0 = kvf_xxh_scramble(a0 + c0, k.ks0);
    a1 = kvf_xxh_scramble(a1 + c1, k.ks1);
}

/* The last partial KiB and XXH3's final stripe, read from p (the block's
 * start), then the merge: every lane returns the block's value. */
__device__ uint64_t kvf_xxh_tail(const uint8_t *p, uint64_t len,
                                 const kvf_xxh_keys_t &k, uint64_t a0,
                                 uint64_t a1, unsigned lane)
{
    uint64_t c0 = 0, c1 = 0, t;
    unsigned ns = kvf_xxh_last_stripes(len), r = lane >> 2;
    const uint8_t *q =
        p + kvf_xxh_full_kibs(len) * KVF_XXH_KIB + 16 * (lane & 3u);

    if (r < ns) {
        kvf_xxh_pair(kvf_ld64(q + 64 * r), kvf_ld64(q + 64 * r + 8), k.ka0,
                     k.ka1, &c0, &c1);
    }
    if (r + 8 < ns) {
        kvf_xxh_pair(kvf_ld64(q + 64 * (r + 8)), kvf_ld64(q + 64 * (r + 8) + 8),
                     k.kb0, k.kb1, &c0, &c1);
    }
    if (r == 0) {
        q = p + len - 64 + 16 * lane;
        kvf_xxh_pair(kvf_ld64(q), kvf_ld64(q + 8), k.kl0, k.kl1, &c0, &c1);
    }
    kvf_xxh_reduce(c0, c1);
    t = kvf_xxh_merge_term(&k, a0 + c0, a1 + c1);
    t += __shfl_xor_sync(KVF_FULL_MASK, t, 1);
    t += __shfl_xor_sync(KVF_FULL_MASK, t, 2);
    return kvf_xxh_finish(len, t);
}

__device__ __forceinline__ uint4 kvf_ld16(const uint8_t *p, bool aligned)
{
    uint4 v;

    if (aligned) {
        return *(const uint4 *)p;
    }
    v.x = kvf_xxh_r32(p);
    v.y = kvf_xxh_r32(p + 4);
    v.z = kvf_xxh_r32(p + 8);
    v.w = kvf_xxh_r32(p + 12);
    return v;
}

/* kvf_checksum() of [p, p + len) by the warp, reading only. */
__device__ uint64_t kvf_xxh_warp(const uint8_t *p, uint64_t len,
                                 const kvf_xxh_keys_t &k, unsigned lane)
{
    uint64_t a0, a1, nfull, kb = 0, h = 0;
    bool al = ((uintptr_t)p & 15) == 0;

    if (len <= KVF_XXH_SHORT) {
        if (lane == 0) {
            h = kvf_xxh_short(p, len, kvf_xxh_sec_dev);
        }
        return __shfl_sync(KVF_FULL_MASK, h, 0);
    }
    a0 = kvf_xxh_init(2 * (lane & 3u));
    a1 = kvf_xxh_init(2 * (lane & 3u) + 1);
    nfull = kvf_xxh_full_kibs(len);
    for (; al && kb + 4 <= nfull; kb += 4) {
        const uint4 *v = (const uint4 *)(p + kb * KVF_XXH_KIB) + lane;
        uint4 x[8];

#pragma unroll
        for (int u = 0; u < 8; u++) {
            x[u] = v[u * 32];
        }
#pragma unroll
        for (int q = 0; q < 4; q++) {
            kvf_xxh_kib(k, x[2 * q], x[2 * q + 1], a0, a1);
        }
    }
    for (; kb < nfull; kb++) {
        const uint8_t *v = p + kb * KVF_XXH_KIB + 16 * lane;

        kvf_xxh_kib(k, kvf_ld16(v, al), kvf_ld16(v + 512, al), a0, a1);
    }
    return kvf_xxh_tail(p, len, k, a0, a1, lane);
}

/* Copies a block of more than 240 bytes whose both sides are 16-byte
 * aligned, checksumming the full KiBs from the registers that carry
 * them; the rest is copied, then read back from tp (the block on the
 * side in GPU memory) for the tail. */
__device__ uint64_t kvf_copy_sum_aligned(const char *s, char *d, uint64_t len,
                                         const kvf_xxh_keys_t &k, bool tail_dst,
                                         unsigned lane)
{
    const uint4 *vs = (const uint4 *)s;
    uint4 *vd = (uint4 *)d;
    uint64_t a0 = kvf_xxh_init(2 * (lane & 3u));
    uint64_t a1 = kvf_xxh_init(2 * (lane & 3u) + 1);
    uint64_t nfull = kvf_xxh_full_kibs(len), kb = 0, at;

    for (; kb + 4 <= nfull; kb += 4) {
        uint64_t base = kb * (KVF_XXH_KIB / 16) + lane;
        uint4 x[8];

#pragma unroll
        for (int u = 0; u < 8; u++) {
            x[u] = __ldcs(vs + base + u * 32);
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            __stcs(vd + base + u * 32, x[u]);
        }
#pragma unroll
        for (int q = 0; q < 4; q++) {
            kvf_xxh_kib(k, x[2 * q], x[2 * q + 1], a0, a1);
        }
    }
    for (; kb < nfull; kb++) {
        uint64_t base = kb * (KVF_XXH_KIB / 16) + lane;
        uint4 xa = __ldcs(vs + base), xb = __ldcs(vs + base + 32);

        __stcs(vd + base, xa);
        __stcs(vd + base + 32, xb);
        kvf_xxh_kib(k, xa, xb, a0, a1);
    }
    at = nfull * KVF_XXH_KIB;
    kvf_copy_block<4>(s + at, d + at, len - at, lane);
    __syncwarp();
    return kvf_xxh_tail((const uint8_t *)(tail_dst ? d : s), len, k, a0, a1,
                        lane);
}

/* One block: copied (store) and checksummed, or only checksummed. */
__device__ uint64_t kvf_copy_sum_block(const char *s, char *d, uint64_t len,
                                       const kvf_xxh_keys_t &k, bool store,
                                       bool tail_dst, unsigned lane)
{
    if (!store) {
        return kvf_xxh_warp((const uint8_t *)s, len, k, lane);
    }
    if ((((uintptr_t)s | (uintptr_t)d) & 15) == 0 && len > KVF_XXH_SHORT) {
        return kvf_copy_sum_aligned(s, d, len, k, tail_dst, lane);
    }
    kvf_copy_block<4>(s, d, len, lane);
    __syncwarp();
    return kvf_xxh_warp((const uint8_t *)(tail_dst ? d : s), len, k, lane);
}

/* A warp per block (blocks are never shared or split: the hash runs
 * through a block in order); sums[b] receives block b's checksum, 0 for
 * a refused block. */
template <bool STORE>
__global__ void __launch_bounds__(KVF_WARP_CTA)
    kvf_sum_warp_kernel(const kvf_cuda_blk_t *__restrict__ blks, unsigned n,
                        uint64_t sb, uint64_t sl, uint64_t db, uint64_t dl,
                        unsigned *err, uint64_t *sums, int tail_dst)
{
    unsigned lane = threadIdx.x & 31;
    unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    unsigned nwarps = (gridDim.x * blockDim.x) >> 5;
    kvf_xxh_keys_t k;
    kvf_desc cur, next;
    unsigned b;

    kvf_xxh_lane_keys(&k, lane, kvf_xxh_sec_dev);
    cur = kvf_load_desc(blks, warp, n, lane);
    for (b = warp; b < n; b += nwarps) {
        uint64_t h = 0;

        next = kvf_load_desc(blks, b + nwarps, n, lane);
        if (!kvf_desc_ok(cur, sl, dl)) {
            if (lane == 0) {
                *(volatile unsigned *)err = 1u; /* mapped host word */
            }
        } else {
            h = kvf_copy_sum_block((const char *)(uintptr_t)(sb + cur.so),
                                   (char *)(uintptr_t)(db + cur.doff), cur.len,
                                   k, STORE, tail_dst != 0, lane);
        }
        if (lane == 0) {
            sums[b] = h;
        }
        cur = next;
    }
}

/* ---- launchers -------------------------------------------------------- */

/* Grid size (CTAs per SM) and unrolling of the copy kernels: fixed
 * (more or fewer CTAs, unroll 4 or 8, changed nothing measured on the
 * H200: docs/gpu.md); the warps per block are a key. */
static int kvf_warp_ctas_per_sm = 4;
static int kvf_bulk_ctas_per_sm = KVF_BULK_CTAS_PER_SM;
static int kvf_warp_unroll = KVF_WARP_UNROLL;
static int kvf_warp_parts = 0; /* warps per block: 0 auto, 1, 2 or 4 */
static int kvf_sum_fit = 0;    /* CTAs of the checksumming kernel per SM */

extern "C" void kvf_cuda_kern_parts(int warps_per_block)
{
    if (warps_per_block == 0 || warps_per_block == 1 || warps_per_block == 2 ||
        warps_per_block == 4) {
        kvf_warp_parts = warps_per_block;
    }
}

extern "C" unsigned kvf_cuda_kern_pshift(size_t n, unsigned warps)
{
    unsigned pshift = 0;

    /* auto: up to 4 warps per block while the GPU holds them all */
    if (kvf_warp_parts == 0) {
        while (pshift < 2 && ((uint64_t)n << (pshift + 1)) <= warps) {
            pshift++;
        }
    } else {
        pshift = kvf_warp_parts == 4 ? 2 : kvf_warp_parts == 2 ? 1 : 0;
    }
    return pshift;
}

extern "C" int kvf_cuda_kern_res_fit(void)
{
    int nb = 0;

    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &nb, kvf_res_kernel<KVF_WARP_UNROLL>, KVF_WARP_CTA, 0) !=
        cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return nb;
}

extern "C" int kvf_cuda_kern_res_launch(kvf_cuda_res_host_t *h,
                                        kvf_cuda_res_dev_t *dv, unsigned *err,
                                        unsigned seen, unsigned epoch,
                                        uint64_t idle_ns, unsigned grid,
                                        cudaStream_t stream)
{
    void *args[] = {&h, &dv, &err, &seen, &epoch, &idle_ns};
    const void *fn = kvf_warp_unroll == 4
                         ? (const void *)kvf_res_kernel<4>
                         : (const void *)kvf_res_kernel<KVF_WARP_UNROLL>;

    return (int)cudaLaunchCooperativeKernel(fn, dim3(grid), dim3(KVF_WARP_CTA),
                                            args, 0, stream);
}

extern "C" int kvf_cuda_kern_launch(kvf_cuda_kernel_t kernel,
                                    const kvf_cuda_launch_t *l, int sm_count,
                                    cudaStream_t stream)
{
    unsigned grid;

    if (l->n == 0) {
        return (int)cudaSuccess;
    }
    if (sm_count <= 0) {
        sm_count = 1;
    }
    if (kernel == KVF_CUDA_KERNEL_BULK && l->flag == NULL) {
        grid = l->n;
        if (grid > (unsigned)(sm_count * kvf_bulk_ctas_per_sm)) {
            grid = (unsigned)(sm_count * kvf_bulk_ctas_per_sm);
        }
        kvf_copy_bulk_kernel<<<grid, 32, 0, stream>>>(
            l->blks, l->n, l->src_base, l->src_len, l->dst_base, l->dst_len,
            l->err);
    } else {
        unsigned per_cta = KVF_WARP_CTA / 32, pshift, items;
        unsigned resident =
            (unsigned)(sm_count * kvf_warp_ctas_per_sm) * per_cta;

        pshift = kvf_cuda_kern_pshift(l->n, resident);
        items = l->n << pshift;
        grid = (items + per_cta - 1) / per_cta;
        if (grid > (unsigned)(sm_count * kvf_warp_ctas_per_sm)) {
            grid = (unsigned)(sm_count * kvf_warp_ctas_per_sm);
        }
        if (kvf_warp_unroll == 4) {
            kvf_copy_warp_kernel<4><<<grid, KVF_WARP_CTA, 0, stream>>>(
                l->blks, l->n, l->src_base, l->src_len, l->dst_base, l->dst_len,
                l->err, l->ctr, l->flag, l->seq, pshift);
        } else {
            kvf_copy_warp_kernel<8><<<grid, KVF_WARP_CTA, 0, stream>>>(
                l->blks, l->n, l->src_base, l->src_len, l->dst_base, l->dst_len,
                l->err, l->ctr, l->flag, l->seq, pshift);
        }
    }
    return (int)cudaGetLastError();
}

extern "C" int kvf_cuda_kern_sum_launch(const kvf_cuda_launch_t *l,
                                        uint64_t *sums, int store, int tail_dst,
                                        int sm_count, cudaStream_t stream)
{
    unsigned per_cta = KVF_WARP_CTA / 32, grid;
    int ctas;

    if (l->n == 0) {
        return (int)cudaSuccess;
    }
    if (sm_count <= 0) {
        sm_count = 1;
    }
    /* the checksumming kernel holds more registers than the plain one:
     * no more CTAs than the SMs hold at once, or the grid-stride share
     * of the CTAs that wait would run after the others (a tail) */
    if (kvf_sum_fit == 0) {
        int a = 0, b = 0;

        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &a, kvf_sum_warp_kernel<true>, KVF_WARP_CTA, 0) !=
                cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &b, kvf_sum_warp_kernel<false>, KVF_WARP_CTA, 0) !=
                cudaSuccess) {
            cudaGetLastError();
            a = b = 1;
        }
        a = a < b ? a : b;
        kvf_sum_fit = a < 1 ? 1 : a;
    }
    ctas =
        kvf_sum_fit < kvf_warp_ctas_per_sm ? kvf_sum_fit : kvf_warp_ctas_per_sm;
    grid = (l->n + per_cta - 1) / per_cta;
    if (grid > (unsigned)(sm_count * ctas)) {
        grid = (unsigned)(sm_count * ctas);
    }
    if (store) {
        kvf_sum_warp_kernel<true><<<grid, KVF_WARP_CTA, 0, stream>>>(
            l->blks, l->n, l->src_base, l->src_len, l->dst_base, l->dst_len,
            l->err, sums, tail_dst);
    } else {
        kvf_sum_warp_kernel<false><<<grid, KVF_WARP_CTA, 0, stream>>>(
            l->blks, l->n, l->src_base, l->src_len, l->dst_base, l->dst_len,
            l->err, sums, tail_dst);
    }
    return (int)cudaGetLastError();
}

extern "C" int kvf_cuda_kern_regs(kvf_cuda_kernel_t kernel)
{
    cudaFuncAttributes a;
    cudaError_t e;

    if (kernel == KVF_CUDA_KERNEL_BULK) {
        e = cudaFuncGetAttributes(&a, kvf_copy_bulk_kernel);
    } else {
        e = cudaFuncGetAttributes(&a, kvf_copy_warp_kernel<8>);
    }
    return (e == cudaSuccess) ? a.numRegs : -1;
}
