/*
 * Shareable host memory (shm_mem.h): memfd-backed allocations and the
 * process-wide table the shm transport consults before handing an
 * allocation's fd to a peer.
 *
 * Each allocation is a memfd of its own, sealed against shrinking and
 * growing (a peer holding the fd cannot truncate it under us: that would
 * turn our accesses into SIGBUS), mapped MAP_SHARED. Huge pages: a
 * MFD_HUGETLB memfd when the system has reserved hugetlb pages (mmap
 * fails cleanly otherwise), else normal shmem pages with MADV_HUGEPAGE,
 * which the kernel honours when transparent_hugepage/shmem_enabled is
 * "advise" or "always". When memfd_create is refused (seccomp), the
 * allocation is private anonymous memory: fully usable, not shareable by
 * fd; the shm transport then serves it through target-side copies.
 *
 * The table is a sorted array under a mutex; ids are never reused, and
 * an epoch counter is bumped at every release and every deregistration
 * of host memory, so peers learn that some mapping of theirs may have
 * died. Each allocation records its page unit (hugetlb or base pages):
 * peers map only the pages of a registered range, at that granularity.
 */
#include "mem/shm_mem.h"
#include "core/alloc.h"
#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define KVF_SHM_HUGE (2ull << 20)

typedef struct kvf_shm_alloc {
    uint64_t id;
    void *base;
    size_t len;   /* mapped */
    size_t asked; /* requested */
    size_t unit;  /* page size of the memfd: mappings start and end on it */
    int fd;       /* -1: private fallback, not shareable */
} kvf_shm_alloc_t;

static pthread_mutex_t kvf_shm_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static kvf_shm_alloc_t *kvf_shm_allocs; /* sorted by base */
static size_t kvf_shm_nallocs, kvf_shm_allocs_cap;
static uint64_t kvf_shm_next_id;
static uint64_t kvf_shm_epoch;

static size_t kvf_shm_round(size_t len, size_t unit)
{
    return (len + unit - 1) / unit * unit;
}

/* A sealed memfd of len bytes mapped shared, or -1. */
static int kvf_shm_memfd_map(size_t len, unsigned flags, void **base_p)
{
    void *p;
    int fd;

    fd = memfd_create("kvferry", MFD_CLOEXEC | MFD_ALLOW_SEALING | flags);
    if (fd < 0) {
        return -1;
    }
    if (ftruncate(fd, (off_t)len) != 0) {
        goto err_close;
    }
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        goto err_close;
    }
    /* peers refuse a memfd that could shrink (shm_trust.c): no seals, no
     * sharing */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
        0) {
        kvf_warn("memfd seals refused: %m; not shareable");
        munmap(p, len);
        goto err_close;
    }
    *base_p = p;
    return fd;

err_close:
    close(fd);
    return -1;
}

static kvf_status_t kvf_shm_table_add(const kvf_shm_alloc_t *a)
{
    kvf_shm_alloc_t *grown;
    size_t pos;

    if (kvf_shm_nallocs == kvf_shm_allocs_cap) {
        size_t cap = kvf_shm_allocs_cap ? kvf_shm_allocs_cap * 2 : 16;

        grown = kvf_realloc(kvf_shm_allocs, cap * sizeof(*grown));
        if (grown == NULL) {
            return KVF_ERR_NO_MEMORY;
        }
        kvf_shm_allocs = grown;
        kvf_shm_allocs_cap = cap;
    }
    for (pos = kvf_shm_nallocs; pos > 0; pos--) {
        if (kvf_shm_allocs[pos - 1].base < a->base) {
            break;
        }
        kvf_shm_allocs[pos] = kvf_shm_allocs[pos - 1];
    }
    kvf_shm_allocs[pos] = *a;
    kvf_shm_nallocs++;
    return KVF_OK;
}

kvf_status_t kvf_shm_mem_alloc(size_t len, void **ptr_p)
{
    long page = sysconf(_SC_PAGESIZE);
    kvf_shm_alloc_t a = {.fd = -1, .asked = len};
    kvf_status_t status;

    if (len == 0 || ptr_p == NULL || len > (SIZE_MAX >> 1)) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (len >= KVF_SHM_HUGE) {
        a.len = kvf_shm_round(len, KVF_SHM_HUGE);
        a.fd = kvf_shm_memfd_map(a.len, MFD_HUGETLB, &a.base);
        a.unit = KVF_SHM_HUGE;
    }
    if (a.fd < 0) {
        a.unit = (size_t)(page > 0 ? page : 4096);
        a.len = kvf_shm_round(len, a.unit);
        a.fd = kvf_shm_memfd_map(a.len, 0, &a.base);
        if (a.fd >= 0) {
            madvise(a.base, a.len, MADV_HUGEPAGE);
        }
    }
    if (a.fd < 0) {
        kvf_warn("memfd for %zu bytes refused (%m): private memory, not "
                 "shareable by fd",
                 len);
        a.base = mmap(NULL, a.len, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (a.base == MAP_FAILED) {
            kvf_error("cannot map %zu bytes: %m", a.len);
            return KVF_ERR_NO_MEMORY;
        }
        madvise(a.base, a.len, MADV_HUGEPAGE);
    }
    pthread_mutex_lock(&kvf_shm_mem_lock);
    a.id = ++kvf_shm_next_id;
    status = kvf_shm_table_add(&a);
    pthread_mutex_unlock(&kvf_shm_mem_lock);
    if (status != KVF_OK) {
        munmap(a.base, a.len);
        if (a.fd >= 0) {
            close(a.fd);
        }
        return status;
    }
    kvf_debug("shm alloc %lu: %p+%zu (fd %d)", (unsigned long)a.id, a.base,
              a.len, a.fd);
    *ptr_p = a.base;
    return KVF_OK;
}

kvf_status_t kvf_shm_mem_free(void *ptr)
{
    kvf_shm_alloc_t a;
    size_t i;

    pthread_mutex_lock(&kvf_shm_mem_lock);
    for (i = 0; i < kvf_shm_nallocs; i++) {
        if (kvf_shm_allocs[i].base == ptr) {
            break;
        }
    }
    if (i == kvf_shm_nallocs) {
        pthread_mutex_unlock(&kvf_shm_mem_lock);
        return KVF_ERR_NOT_FOUND;
    }
    a = kvf_shm_allocs[i];
    memmove(kvf_shm_allocs + i, kvf_shm_allocs + i + 1,
            (kvf_shm_nallocs - i - 1) * sizeof(*kvf_shm_allocs));
    kvf_shm_nallocs--;
    if (kvf_shm_nallocs == 0) {
        kvf_free(kvf_shm_allocs);
        kvf_shm_allocs = NULL;
        kvf_shm_allocs_cap = 0;
    }
    __atomic_add_fetch(&kvf_shm_epoch, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&kvf_shm_mem_lock);
    munmap(a.base, a.len);
    if (a.fd >= 0) {
        close(a.fd);
    }
    kvf_debug("shm free %lu: %p+%zu", (unsigned long)a.id, a.base, a.len);
    return KVF_OK;
}

/* Index of the allocation whose range holds addr, or -1. Lock held. */
static long kvf_shm_find_locked(uint64_t addr)
{
    size_t lo = 0, hi = kvf_shm_nallocs, mid;
    const kvf_shm_alloc_t *a;

    while (lo < hi) {
        mid = lo + (hi - lo) / 2;
        if ((uint64_t)(uintptr_t)kvf_shm_allocs[mid].base <= addr) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (lo == 0) {
        return -1;
    }
    a = &kvf_shm_allocs[lo - 1];
    if (addr - (uint64_t)(uintptr_t)a->base >= a->len) {
        return -1;
    }
    return (long)(lo - 1);
}

int kvf_shm_mem_find(uint64_t addr, uint64_t len, kvf_shm_alloc_info_t *info_p)
{
    const kvf_shm_alloc_t *a;
    uint64_t off;
    long i;
    int rc = -1;

    pthread_mutex_lock(&kvf_shm_mem_lock);
    i = kvf_shm_find_locked(addr);
    if (i >= 0) {
        a = &kvf_shm_allocs[i];
        off = addr - (uint64_t)(uintptr_t)a->base;
        if (a->fd >= 0 && len <= a->len - off) {
            info_p->id = a->id;
            info_p->base = (uint64_t)(uintptr_t)a->base;
            info_p->len = a->len;
            info_p->asked = a->asked;
            info_p->unit = a->unit;
            rc = 0;
        }
    }
    pthread_mutex_unlock(&kvf_shm_mem_lock);
    return rc;
}

int kvf_shm_mem_dup_fd(uint64_t id, kvf_shm_alloc_info_t *info_p)
{
    size_t i;
    int fd = -1;

    pthread_mutex_lock(&kvf_shm_mem_lock);
    for (i = 0; i < kvf_shm_nallocs; i++) {
        if (kvf_shm_allocs[i].id == id && kvf_shm_allocs[i].fd >= 0) {
            fd = fcntl(kvf_shm_allocs[i].fd, F_DUPFD_CLOEXEC, 0);
            if (fd < 0) {
                kvf_error("dup of memfd %d: %m", kvf_shm_allocs[i].fd);
                break;
            }
            info_p->id = id;
            info_p->base = (uint64_t)(uintptr_t)kvf_shm_allocs[i].base;
            info_p->len = kvf_shm_allocs[i].len;
            info_p->asked = kvf_shm_allocs[i].asked;
            info_p->unit = kvf_shm_allocs[i].unit;
            break;
        }
    }
    pthread_mutex_unlock(&kvf_shm_mem_lock);
    return fd;
}

int kvf_shm_mem_alive(uint64_t id)
{
    size_t i;
    int alive = 0;

    pthread_mutex_lock(&kvf_shm_mem_lock);
    for (i = 0; i < kvf_shm_nallocs && !alive; i++) {
        alive = (kvf_shm_allocs[i].id == id);
    }
    pthread_mutex_unlock(&kvf_shm_mem_lock);
    return alive;
}

void kvf_shm_mem_dereg(uint64_t addr, uint64_t len)
{
    (void)addr;
    (void)len;
    /* peers compare epochs at their next lease and then ask which of
     * their mappings are gone (SYNC): a deregistered range is one */
    __atomic_add_fetch(&kvf_shm_epoch, 1, __ATOMIC_RELEASE);
}

uint64_t kvf_shm_mem_epoch(void)
{
    return __atomic_load_n(&kvf_shm_epoch, __ATOMIC_ACQUIRE);
}

void kvf_shm_mem_stats(long *count_p, uint64_t *bytes_p)
{
    uint64_t bytes = 0;
    size_t i;

    pthread_mutex_lock(&kvf_shm_mem_lock);
    for (i = 0; i < kvf_shm_nallocs; i++) {
        bytes += kvf_shm_allocs[i].len;
    }
    if (count_p != NULL) {
        *count_p = (long)kvf_shm_nallocs;
    }
    pthread_mutex_unlock(&kvf_shm_mem_lock);
    if (bytes_p != NULL) {
        *bytes_p = bytes;
    }
}
