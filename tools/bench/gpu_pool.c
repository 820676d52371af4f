/*
 * GPU benches, shared pieces: pools of any memory kind (pageable, pinned,
 * GPU) filled with seeded random bytes and a unique tag per 4 KiB page so
 * a misplaced block cannot pass a checksum comparison; random block
 * picking; GPU descriptions for tables, JSON and records; the resident
 * copy kernel's counters.
 */
#include "tools/bench/gpu.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define KVF_GPU_FILL_CHUNK (64ull << 20)
#define KVF_GPU_HUGE       (2ull << 20)

/* Pinned pools from transparent huge pages + cudaHostRegister. */
static int kvf_gpu_pool_thp;

void kvf_gpu_pool_use_thp(int on)
{
    kvf_gpu_pool_thp = on;
}

/* ---- pools ------------------------------------------------------------ */

/* Fills a host staging chunk for pool offset `at`: random bytes, with a
 * tag (seed, offset) in the first word of every 4 KiB so that no two
 * pages of a pool are equal. */
static void kvf_gpu_fill_chunk(char *dst, const char *rnd, uint64_t len,
                               uint64_t at, uint64_t seed)
{
    uint64_t o, tag;

    memcpy(dst, rnd, len);
    for (o = 0; o + 8 <= len; o += 4096) {
        tag = (seed << 40) ^ (at + o);
        memcpy(dst + o, &tag, 8);
    }
}

int kvf_gpu_pool_alloc(kvf_gpu_pool_t *p, kvf_mem_type_t type, int device,
                       uint64_t len, uint64_t seed)
{
    uint64_t at, piece,
        chunk = len < KVF_GPU_FILL_CHUNK ? len : KVF_GPU_FILL_CHUNK;
    kvf_status_t status = KVF_OK;
    char *rnd = NULL, *tmp = NULL;
    kvf_rng_t rng;

    memset(p, 0, sizeof(*p));
    p->mem.type = type;
    p->mem.device = device;
    p->mem.len = len;
    if (type == KVF_MEM_HOST || (type == KVF_MEM_PINNED && kvf_gpu_pool_thp)) {
        /* 2 MiB aligned so every page can be a huge page */
        char *m = mmap(NULL, len + KVF_GPU_HUGE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

        if (m == MAP_FAILED) {
            perror("kvferry: mmap pool");
            return -1;
        }
        p->map_base = m;
        m += (KVF_GPU_HUGE - ((uintptr_t)m & (KVF_GPU_HUGE - 1))) &
             (KVF_GPU_HUGE - 1);
        madvise(m, len, MADV_HUGEPAGE);
        p->mem.base = m;
        p->mapped = 1;
    } else {
        status = kvf_gpu_alloc(type, device, len, &p->mem.base);
        if (status != KVF_OK) {
            fprintf(stderr,
                    "kvferry: cannot allocate a %s pool of %lu "
                    "bytes: %s\n",
                    type == KVF_MEM_CUDA ? "GPU" : "pinned", (unsigned long)len,
                    kvf_status_str(status));
            return -1;
        }
    }
    rnd = malloc(chunk);
    tmp = (type == KVF_MEM_CUDA) ? malloc(chunk) : NULL;
    if (rnd == NULL || (type == KVF_MEM_CUDA && tmp == NULL)) {
        free(rnd);
        free(tmp);
        kvf_gpu_pool_free(p);
        return -1;
    }
    kvf_rng_seed(&rng, seed);
    kvf_rng_fill(&rng, rnd, chunk);
    for (at = 0; at < len && status == KVF_OK; at += piece) {
        piece = (len - at < chunk) ? len - at : chunk;
        if (type == KVF_MEM_CUDA) {
            kvf_gpu_fill_chunk(tmp, rnd, piece, at, seed);
            status = kvf_gpu_copy((char *)p->mem.base + at, tmp, piece);
        } else {
            kvf_gpu_fill_chunk((char *)p->mem.base + at, rnd, piece, at, seed);
        }
    }
    free(rnd);
    free(tmp);
    if (status == KVF_OK && p->mapped && type == KVF_MEM_PINNED) {
        status = kvf_gpu_host_register(p->mem.base, len);
        p->mapped = (status == KVF_OK) ? 2 : 1;
    }
    if (status != KVF_OK) {
        fprintf(stderr, "kvferry: filling the pool: %s\n",
                kvf_status_str(status));
        kvf_gpu_pool_free(p);
        return -1;
    }
    return 0;
}

void kvf_gpu_pool_free(kvf_gpu_pool_t *p)
{
    if (p->mem.base == NULL) {
        return;
    }
    if (p->mapped) {
        if (p->mapped == 2) {
            kvf_gpu_host_unregister(p->mem.base);
        }
        munmap(p->map_base, p->mem.len + KVF_GPU_HUGE);
    } else {
        kvf_gpu_free(p->mem.type, p->mem.base);
    }
    memset(p, 0, sizeof(*p));
}

void kvf_gpu_pick(uint32_t *perm, uint64_t nslots, uint64_t n, kvf_rng_t *rng)
{
    uint64_t i, j;
    uint32_t t;

    for (i = 0; i < n; i++) {
        j = i + kvf_rng_below(rng, nslots - i);
        t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

void kvf_gpu_describe(int gpu, char *buf, size_t len)
{
    kvf_gpu_info_t in;

    if (kvf_gpu_info(gpu, &in) != KVF_OK) {
        snprintf(buf, len, "GPU %d (unknown)", gpu);
        return;
    }
    snprintf(buf, len, "GPU %d (%s, PCI %s, NUMA node %d, PCIe Gen%d x%d)", gpu,
             in.name, in.pci_bus_id, in.numa_node, in.pcie_gen, in.pcie_width);
}

void kvf_gpu_json_info(kvf_json_t *j, const char *key, int gpu)
{
    kvf_gpu_info_t in;

    kvf_json_obj(j, key);
    kvf_json_int(j, "index", gpu);
    if (kvf_gpu_info(gpu, &in) == KVF_OK) {
        kvf_json_str(j, "name", in.name);
        kvf_json_str(j, "pci_bus_id", in.pci_bus_id);
        kvf_json_int(j, "numa_node", in.numa_node);
        kvf_json_int(j, "pcie_gen", in.pcie_gen);
        kvf_json_int(j, "pcie_width", in.pcie_width);
        kvf_json_int(j, "sm_count", in.sm_count);
        kvf_json_int(j, "mem_bytes", (long long)in.mem_bytes);
        kvf_json_int(j, "driver_version", in.driver_version);
        kvf_json_int(j, "runtime_version", in.runtime_version);
    }
    kvf_json_end_obj(j);
}

void kvf_gpu_print_resident(const kvf_gpu_copier_t *cp)
{
    kvf_gpu_copier_stats_t s;

    kvf_gpu_copier_stats(cp, &s);
    if (s.resident_batches + s.resident_starts + s.fallbacks > 0) {
        printf("resident copy kernel: %lu batches, %lu launches, %lu "
               "batches launched instead\n",
               (unsigned long)s.resident_batches,
               (unsigned long)s.resident_starts, (unsigned long)s.fallbacks);
    }
}
