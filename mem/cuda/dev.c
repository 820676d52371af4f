/*
 * mem/cuda: runtime start-up and devices, pinned and device memory,
 * the registry of GPU and pinned regions, CUDA IPC, bounded event waits
 * and error translation.
 *
 * The runtime is linked statically; the first call of any function here
 * asks it for devices (once, thread-safe). No driver or no device simply
 * means zero devices: every GPU feature then answers KVF_ERR_UNAVAILABLE.
 *
 * The registry is a small array of registered ranges under a read-write
 * lock; transports look addresses up there (a binary-search-free linear
 * scan: a process registers a handful of regions). When it holds no GPU
 * range, lookups return at once, so host-only processes pay nothing.
 */
#include "mem/cuda/kern.h"
#include "core/alloc.h"
#include "core/config.h"
#include "core/log.h"
#include "core/time.h"

#include <ctype.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const kvf_config_entry_t kvf_cuda_config_entries[] = {
    {"cuda_kernel", "auto",
     "copy kernel for scattered GPU blocks: auto, warp, bulk, hybrid",
     KVF_CONFIG_TUNING},
    {"cuda_stage_bytes", "1M",
     "pinned staging buffer size for GPU memory reached over sockets",
     KVF_CONFIG_TUNING},
    {"cuda_stage_slots", "4", "staging buffers in flight per connection",
     KVF_CONFIG_TUNING},
    {"cuda_warps_per_block", "0",
     "warps sharing one block in the copy kernel: 1, 2, 4, or 0 (auto: up "
     "to 4 while the batch leaves warps of the GPU idle)",
     KVF_CONFIG_TUNING},
    {"cuda_resident", "p2p",
     "resident copy kernel (no launch per batch): off, on (every batch of "
     "the warp kernel read in place) or p2p (GPU -> other GPU only)",
     KVF_CONFIG_DEBUG},
    {"cuda_resident_ctas", "2",
     "CTAs per multiprocessor of the resident "
     "copy kernel (held while it runs)",
     KVF_CONFIG_DEBUG},
    {"cuda_resident_idle_us", "2000",
     "the resident copy kernel leaves after this long without a batch",
     KVF_CONFIG_DEBUG},
};

KVF_CONFIG_TABLE(kvf_cuda_config, "cuda", kvf_cuda_config_entries)

kvf_cuda_devstate_t kvf_cuda_devs[KVF_CUDA_DEV_MAX];

static pthread_once_t kvf_cuda_once = PTHREAD_ONCE_INIT;
static int kvf_cuda_ndev;
static kvf_cuda_kernel_t kvf_cuda_kernel_cfg;

/* cuMemGetAddressRange through the runtime's driver entry point, so no
 * link-time dependency on libcuda. */
typedef int (*kvf_cu_range_fn)(unsigned long long *base, size_t *size,
                               unsigned long long ptr);
static kvf_cu_range_fn kvf_cu_range;

typedef struct kvf_cuda_reg {
    uint64_t addr;
    uint64_t len;
    kvf_mem_type_t type;
    int device;
    unsigned refs;
} kvf_cuda_reg_t;

static pthread_rwlock_t kvf_cuda_reg_lock = PTHREAD_RWLOCK_INITIALIZER;
static kvf_cuda_reg_t *kvf_cuda_regs;
static size_t kvf_cuda_nregs, kvf_cuda_regs_cap;
static int kvf_cuda_nregs_gpu;        /* read without the lock as a fast path */
static uint64_t kvf_cuda_reg_gen = 1; /* bumped by every change */

/* Per-thread cache of the last lookups (a region, a gap between regions),
 * valid while the registry's generation is unchanged: the data path's
 * lookups take no lock. */
typedef struct kvf_cuda_reg_cache {
    uint64_t gen;
    uint64_t lo, hi;
    kvf_mem_type_t type;
    int device;
} kvf_cuda_reg_cache_t;

static __thread kvf_cuda_reg_cache_t kvf_cuda_reg_tls[2];

kvf_status_t kvf_cuda_status(cudaError_t err, const char *what)
{
    if (err == cudaSuccess) {
        return KVF_OK;
    }
    kvf_log_rl(KVF_LOG_ERROR, "%s failed: %s (%d)", what,
               cudaGetErrorString(err), (int)err);
    switch (err) {
    case cudaErrorMemoryAllocation:
        return KVF_ERR_NO_MEMORY;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidDevice:
        return KVF_ERR_INVALID_PARAM;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        return KVF_ERR_UNAVAILABLE;
    case cudaErrorPeerAccessUnsupported:
    case cudaErrorNotSupported:
        return KVF_ERR_UNSUPPORTED;
    default:
        return KVF_ERR_IO;
    }
}

kvf_cuda_kernel_t kvf_cuda_kernel_parse(const char *name)
{
    if (name == NULL || strcmp(name, "auto") == 0) {
        return KVF_CUDA_KERNEL_AUTO;
    }
    if (strcmp(name, "warp") == 0) {
        return KVF_CUDA_KERNEL_WARP;
    }
    if (strcmp(name, "bulk") == 0) {
        return KVF_CUDA_KERNEL_BULK;
    }
    if (strcmp(name, "hybrid") == 0) {
        return KVF_CUDA_KERNEL_HYBRID;
    }
    return (kvf_cuda_kernel_t)-1;
}

const char *kvf_cuda_kernel_name(kvf_cuda_kernel_t k)
{
    switch (k) {
    case KVF_CUDA_KERNEL_WARP:
        return "warp";
    case KVF_CUDA_KERNEL_BULK:
        return "bulk";
    case KVF_CUDA_KERNEL_HYBRID:
        return "hybrid";
    default:
        return "auto";
    }
}

static void kvf_cuda_init_once(void)
{
    enum cudaDriverEntryPointQueryResult q;
    void *fn = NULL;
    int n = 0, d, v;
    kvf_cuda_kernel_t k;

    kvf_config_register(&kvf_cuda_config);
    k = kvf_cuda_kernel_parse(kvf_config_str(&kvf_cuda_config, "cuda_kernel"));
    if ((int)k < 0) {
        kvf_warn("cuda_kernel: unknown value '%s', using auto",
                 kvf_config_str(&kvf_cuda_config, "cuda_kernel"));
        k = KVF_CUDA_KERNEL_AUTO;
    }
    kvf_cuda_kernel_cfg = k;
    {
        uint64_t wpb = 0;

        kvf_config_u64(&kvf_cuda_config, "cuda_warps_per_block", &wpb);
        if (wpb != 0 && wpb != 1 && wpb != 2 && wpb != 4) {
            kvf_warn("cuda_warps_per_block: %lu not 0, 1, 2 or 4: using 0",
                     (unsigned long)wpb);
            wpb = 0;
        }
        kvf_cuda_kern_parts((int)wpb);
    }
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        kvf_debug("no CUDA device: GPU features unavailable");
        kvf_cuda_ndev = 0;
        return;
    }
    if (n > KVF_CUDA_DEV_MAX) {
        kvf_warn("%d GPUs, using the first %d", n, KVF_CUDA_DEV_MAX);
        n = KVF_CUDA_DEV_MAX;
    }
    for (d = 0; d < n; d++) {
        v = 0;
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, d);
        kvf_cuda_devs[d].sm_count = v;
        v = 0;
        cudaDeviceGetAttribute(&v, cudaDevAttrCanUseHostPointerForRegisteredMem,
                               d);
        kvf_cuda_devs[d].host_ptr_ok = v;
        kvf_cuda_devs[d].peer[d] = 1;
    }
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                         cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess) {
        kvf_cu_range = (kvf_cu_range_fn)fn;
    }
    kvf_cuda_ndev = n;
    kvf_debug("%d CUDA device(s)", n);
}

int kvf_cuda_device_count(void)
{
    pthread_once(&kvf_cuda_once, kvf_cuda_init_once);
    return kvf_cuda_ndev;
}

int kvf_cuda_built(void)
{
    return 1;
}

kvf_cuda_kernel_t kvf_cuda_default_kernel(void)
{
    kvf_cuda_device_count();
    return kvf_cuda_kernel_cfg;
}

kvf_status_t kvf_cuda_use(int device)
{
    if (device < 0 || device >= kvf_cuda_device_count()) {
        return kvf_cuda_device_count() ? KVF_ERR_INVALID_PARAM
                                       : KVF_ERR_UNAVAILABLE;
    }
    return KVF_CUDA_CHECK(cudaSetDevice(device));
}

/* Polls about once a microsecond for the first ~20 ms (copies are short
 * and their waits are on the critical path), then yields, then sleeps. */
kvf_status_t kvf_cuda_event_wait(cudaEvent_t ev, uint64_t deadline_ms)
{
    struct timespec nap = {0, 20000};
    unsigned spins = 0;
    cudaError_t e;
    int p;

    for (;;) {
        e = cudaEventQuery(ev);
        if (e == cudaSuccess) {
            return KVF_OK;
        }
        if (e != cudaErrorNotReady) {
            return kvf_cuda_status(e, "cudaEventQuery");
        }
        if (kvf_time_ms() >= deadline_ms) {
            kvf_log_rl(KVF_LOG_ERROR, "GPU copy still running at deadline");
            return KVF_ERR_TIMEOUT;
        }
        spins++;
        if (spins < 20000) {
            for (p = 0; p < 16; p++) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
            }
        } else if (spins < 40000) {
            sched_yield();
        } else {
            nanosleep(&nap, NULL);
        }
    }
}

int kvf_cuda_peer_enable(int device, int peer)
{
    int can = 0;
    cudaError_t e;

    if (device < 0 || peer < 0 || device >= kvf_cuda_device_count() ||
        peer >= kvf_cuda_device_count()) {
        return 0;
    }
    if (__atomic_load_n(&kvf_cuda_devs[device].peer[peer], __ATOMIC_ACQUIRE)) {
        return kvf_cuda_devs[device].peer[peer] > 0;
    }
    if (cudaDeviceCanAccessPeer(&can, device, peer) != cudaSuccess || !can) {
        __atomic_store_n(&kvf_cuda_devs[device].peer[peer], -1,
                         __ATOMIC_RELEASE);
        return 0;
    }
    cudaSetDevice(device);
    e = cudaDeviceEnablePeerAccess(peer, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
        kvf_cuda_status(e, "cudaDeviceEnablePeerAccess");
        __atomic_store_n(&kvf_cuda_devs[device].peer[peer], -1,
                         __ATOMIC_RELEASE);
        return 0;
    }
    cudaGetLastError();
    __atomic_store_n(&kvf_cuda_devs[device].peer[peer], 1, __ATOMIC_RELEASE);
    return 1;
}

/* Reads one integer (or the leading number of a line) from a sysfs file. */
static double kvf_cuda_sysfs_num(const char *dev, const char *file)
{
    char path[256], buf[64];
    double v = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/%s", dev, file);
    f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    if (fgets(buf, sizeof(buf), f) != NULL) {
        v = strtod(buf, NULL);
    }
    fclose(f);
    return v;
}

kvf_status_t kvf_cuda_device_info(int device, kvf_cuda_dev_info_t *info)
{
    struct cudaDeviceProp prop;
    kvf_status_t status;
    double gts;
    size_t i;
    int v;

    if (info == NULL) {
        return KVF_ERR_INVALID_PARAM;
    }
    memset(info, 0, sizeof(*info));
    status = kvf_cuda_use(device);
    if (status != KVF_OK) {
        return status;
    }
    status = KVF_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    if (status != KVF_OK) {
        return status;
    }
    snprintf(info->name, sizeof(info->name), "%s", prop.name);
    info->cc_major = prop.major;
    info->cc_minor = prop.minor;
    info->sm_count = prop.multiProcessorCount;
    info->mem_bytes = prop.totalGlobalMem;
    if (cudaDeviceGetPCIBusId(info->pci_bus_id, sizeof(info->pci_bus_id),
                              device) != cudaSuccess) {
        info->pci_bus_id[0] = '\0';
    }
    for (i = 0; info->pci_bus_id[i] != '\0'; i++) {
        info->pci_bus_id[i] = (char)tolower((unsigned char)info->pci_bus_id[i]);
    }
    info->numa_node = (int)kvf_cuda_sysfs_num(info->pci_bus_id, "numa_node");
    if (info->numa_node < 0 && cudaDeviceGetAttribute(&v, cudaDevAttrHostNumaId,
                                                      device) == cudaSuccess) {
        info->numa_node = v;
    }
    gts = kvf_cuda_sysfs_num(info->pci_bus_id, "current_link_speed");
    info->pcie_gen = gts >= 63    ? 6
                     : gts >= 31  ? 5
                     : gts >= 15  ? 4
                     : gts >= 7.9 ? 3
                     : gts >= 4.9 ? 2
                     : gts > 0    ? 1
                                  : 0;
    v = (int)kvf_cuda_sysfs_num(info->pci_bus_id, "current_link_width");
    info->pcie_width = v > 0 ? v : 0;
    cudaDriverGetVersion(&info->driver_version);
    cudaRuntimeGetVersion(&info->runtime_version);
    cudaGetLastError();
    return KVF_OK;
}

/* ---- memory ----------------------------------------------------------- */

kvf_status_t kvf_cuda_mem_alloc(kvf_mem_type_t type, int device, size_t len,
                                void **addr_p)
{
    kvf_status_t status;
    void *p = NULL;

    if (addr_p == NULL || len == 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (kvf_cuda_device_count() == 0) {
        return KVF_ERR_UNAVAILABLE;
    }
    if (type == KVF_MEM_PINNED) {
        status = KVF_CUDA_CHECK(cudaHostAlloc(
            &p, len, cudaHostAllocPortable | cudaHostAllocMapped));
    } else if (type == KVF_MEM_CUDA) {
        status = kvf_cuda_use(device);
        if (status == KVF_OK) {
            status = KVF_CUDA_CHECK(cudaMalloc(&p, len));
        }
    } else {
        return KVF_ERR_INVALID_PARAM;
    }
    if (status != KVF_OK) {
        kvf_error("cannot allocate %zu bytes of %s memory%s", len,
                  type == KVF_MEM_PINNED ? "pinned host" : "GPU",
                  type == KVF_MEM_CUDA ? " on that device" : "");
        return status;
    }
    *addr_p = p;
    return KVF_OK;
}

void kvf_cuda_mem_free(kvf_mem_type_t type, void *addr)
{
    struct cudaPointerAttributes a;

    if (addr == NULL || kvf_cuda_device_count() == 0) {
        return;
    }
    if (type == KVF_MEM_PINNED) {
        KVF_CUDA_CHECK(cudaFreeHost(addr));
    } else if (type == KVF_MEM_CUDA) {
        if (cudaPointerGetAttributes(&a, addr) == cudaSuccess &&
            a.type == cudaMemoryTypeDevice) {
            cudaSetDevice(a.device);
        }
        KVF_CUDA_CHECK(cudaFree(addr));
    }
}

kvf_status_t kvf_cuda_memcpy(void *dst, const void *src, size_t len)
{
    if (kvf_cuda_device_count() == 0) {
        return KVF_ERR_UNAVAILABLE;
    }
    return KVF_CUDA_CHECK(cudaMemcpy(dst, src, len, cudaMemcpyDefault));
}

kvf_status_t kvf_cuda_memset(void *dst, int value, size_t len)
{
    struct cudaPointerAttributes a;

    if (kvf_cuda_device_count() == 0) {
        return KVF_ERR_UNAVAILABLE;
    }
    if (cudaPointerGetAttributes(&a, dst) == cudaSuccess &&
        a.type == cudaMemoryTypeDevice) {
        cudaSetDevice(a.device);
        return KVF_CUDA_CHECK(cudaMemset(dst, value, len));
    }
    cudaGetLastError();
    memset(dst, value, len);
    return KVF_OK;
}

/* Pointers handed out (or pinned) for kvf_mem_alloc. */
typedef struct kvf_cuda_owned {
    void *addr;
    int pinned; /* host memory we pinned, else cudaMalloc */
} kvf_cuda_owned_t;

static pthread_mutex_t kvf_cuda_owned_lock = PTHREAD_MUTEX_INITIALIZER;
static kvf_cuda_owned_t *kvf_cuda_owned;
static size_t kvf_cuda_nowned, kvf_cuda_owned_cap;

static kvf_status_t kvf_cuda_own(void *addr, int pinned)
{
    kvf_cuda_owned_t *p;

    pthread_mutex_lock(&kvf_cuda_owned_lock);
    if (kvf_cuda_nowned == kvf_cuda_owned_cap) {
        size_t cap = kvf_cuda_owned_cap ? kvf_cuda_owned_cap * 2 : 8;

        p = kvf_realloc(kvf_cuda_owned, cap * sizeof(*p));
        if (p == NULL) {
            pthread_mutex_unlock(&kvf_cuda_owned_lock);
            return KVF_ERR_NO_MEMORY;
        }
        kvf_cuda_owned = p;
        kvf_cuda_owned_cap = cap;
    }
    kvf_cuda_owned[kvf_cuda_nowned].addr = addr;
    kvf_cuda_owned[kvf_cuda_nowned].pinned = pinned;
    kvf_cuda_nowned++;
    pthread_mutex_unlock(&kvf_cuda_owned_lock);
    return KVF_OK;
}

kvf_status_t kvf_cuda_mem_track_alloc(int device, size_t len, void **addr_p)
{
    kvf_status_t status;
    void *p = NULL;

    status = kvf_cuda_mem_alloc(KVF_MEM_CUDA, device, len, &p);
    if (status == KVF_OK) {
        status = kvf_cuda_own(p, 0);
        if (status != KVF_OK) {
            kvf_cuda_mem_free(KVF_MEM_CUDA, p);
        }
    }
    if (status == KVF_OK) {
        *addr_p = p;
    }
    return status;
}

kvf_status_t kvf_cuda_mem_track_pin(void *addr, size_t len)
{
    kvf_status_t status = kvf_cuda_host_register(addr, len);

    if (status == KVF_OK) {
        status = kvf_cuda_own(addr, 1);
        if (status != KVF_OK) {
            kvf_cuda_host_unregister(addr);
        }
    }
    return status;
}

kvf_status_t kvf_cuda_mem_track_release(void *addr, kvf_mem_type_t type)
{
    kvf_cuda_owned_t o = {NULL, 0};
    int pinned = (type == KVF_MEM_PINNED);
    size_t i;

    pthread_mutex_lock(&kvf_cuda_owned_lock);
    for (i = 0; i < kvf_cuda_nowned; i++) {
        if (kvf_cuda_owned[i].addr == addr &&
            kvf_cuda_owned[i].pinned == pinned) {
            o = kvf_cuda_owned[i];
            kvf_cuda_owned[i] = kvf_cuda_owned[--kvf_cuda_nowned];
            break;
        }
    }
    if (kvf_cuda_nowned == 0) {
        kvf_free(kvf_cuda_owned);
        kvf_cuda_owned = NULL;
        kvf_cuda_owned_cap = 0;
    }
    pthread_mutex_unlock(&kvf_cuda_owned_lock);
    if (o.addr == NULL) {
        return KVF_ERR_NOT_FOUND;
    }
    if (o.pinned) {
        kvf_cuda_host_unregister(addr);
    } else {
        kvf_cuda_mem_free(KVF_MEM_CUDA, addr);
    }
    return KVF_OK;
}

kvf_status_t kvf_cuda_host_register(void *addr, size_t len)
{
    if (addr == NULL || len == 0) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (kvf_cuda_device_count() == 0) {
        return KVF_ERR_UNAVAILABLE;
    }
    return KVF_CUDA_CHECK(cudaHostRegister(
        addr, len, cudaHostRegisterPortable | cudaHostRegisterMapped));
}

void kvf_cuda_host_unregister(void *addr)
{
    if (addr != NULL && kvf_cuda_device_count() > 0) {
        KVF_CUDA_CHECK(cudaHostUnregister(addr));
    }
}

/* ---- registry --------------------------------------------------------- */

/* Checks that [addr, addr+len) lies inside one allocation of device. */
static kvf_status_t kvf_cuda_check_range(uint64_t addr, uint64_t len,
                                         kvf_mem_type_t type, int device)
{
    struct cudaPointerAttributes a, b;
    unsigned long long base = 0;
    size_t size = 0;

    if (cudaPointerGetAttributes(&a, (void *)(uintptr_t)addr) != cudaSuccess ||
        cudaPointerGetAttributes(&b, (void *)(uintptr_t)(addr + len - 1)) !=
            cudaSuccess) {
        cudaGetLastError();
        a.type = b.type = cudaMemoryTypeUnregistered;
    }
    if (type == KVF_MEM_PINNED) {
        if (a.type != cudaMemoryTypeHost || b.type != cudaMemoryTypeHost) {
            kvf_error("region 0x%lx+%lu registered as pinned is not "
                      "page-locked host memory",
                      (unsigned long)addr, (unsigned long)len);
            return KVF_ERR_INVALID_PARAM;
        }
        return KVF_OK;
    }
    if (a.type != cudaMemoryTypeDevice || a.device != device) {
        kvf_error("region 0x%lx+%lu is not memory of GPU %d",
                  (unsigned long)addr, (unsigned long)len, device);
        return KVF_ERR_OUT_OF_BOUNDS;
    }
    if (kvf_cu_range != NULL) {
        if (kvf_cu_range(&base, &size, addr) != 0 || addr < base ||
            addr - base > size || len > size - (addr - base)) {
            kvf_error("region 0x%lx+%lu runs past its GPU allocation "
                      "0x%llx+%zu",
                      (unsigned long)addr, (unsigned long)len, base, size);
            return KVF_ERR_OUT_OF_BOUNDS;
        }
    } else if (b.type != cudaMemoryTypeDevice || b.device != device) {
        kvf_error("region 0x%lx+%lu runs past GPU %d's memory",
                  (unsigned long)addr, (unsigned long)len, device);
        return KVF_ERR_OUT_OF_BOUNDS;
    }
    return KVF_OK;
}

kvf_status_t kvf_cuda_region_add(uint64_t addr, uint64_t len,
                                 kvf_mem_type_t type, int device)
{
    kvf_status_t status;
    kvf_cuda_reg_t *r;
    size_t i;

    if (type != KVF_MEM_CUDA && type != KVF_MEM_PINNED) {
        return KVF_ERR_INVALID_PARAM;
    }
    if (kvf_cuda_device_count() == 0) {
        kvf_error("cannot register %s memory: no GPU",
                  type == KVF_MEM_CUDA ? "GPU" : "pinned");
        return KVF_ERR_UNAVAILABLE;
    }
    if (len == 0 || addr + len < addr ||
        (type == KVF_MEM_CUDA &&
         (device < 0 || device >= kvf_cuda_device_count()))) {
        return KVF_ERR_INVALID_PARAM;
    }
    status = kvf_cuda_check_range(addr, len, type, device);
    if (status != KVF_OK) {
        return status;
    }
    pthread_rwlock_wrlock(&kvf_cuda_reg_lock);
    for (i = 0; i < kvf_cuda_nregs; i++) {
        r = &kvf_cuda_regs[i];
        if (r->addr == addr && r->len == len && r->type == type) {
            r->refs++;
            pthread_rwlock_unlock(&kvf_cuda_reg_lock);
            return KVF_OK;
        }
    }
    if (kvf_cuda_nregs == kvf_cuda_regs_cap) {
        size_t cap = kvf_cuda_regs_cap ? kvf_cuda_regs_cap * 2 : 8;

        r = kvf_realloc(kvf_cuda_regs, cap * sizeof(*r));
        if (r == NULL) {
            pthread_rwlock_unlock(&kvf_cuda_reg_lock);
            return KVF_ERR_NO_MEMORY;
        }
        kvf_cuda_regs = r;
        kvf_cuda_regs_cap = cap;
    }
    r = &kvf_cuda_regs[kvf_cuda_nregs++];
    r->addr = addr;
    r->len = len;
    r->type = type;
    r->device = (type == KVF_MEM_CUDA) ? device : -1;
    r->refs = 1;
    if (type == KVF_MEM_CUDA) {
        __atomic_add_fetch(&kvf_cuda_nregs_gpu, 1, __ATOMIC_RELEASE);
    }
    __atomic_add_fetch(&kvf_cuda_reg_gen, 1, __ATOMIC_RELEASE);
    pthread_rwlock_unlock(&kvf_cuda_reg_lock);
    return KVF_OK;
}

void kvf_cuda_region_del(uint64_t addr, uint64_t len, kvf_mem_type_t type)
{
    size_t i;

    pthread_rwlock_wrlock(&kvf_cuda_reg_lock);
    for (i = 0; i < kvf_cuda_nregs; i++) {
        kvf_cuda_reg_t *r = &kvf_cuda_regs[i];

        if (r->addr != addr || r->len != len || r->type != type) {
            continue;
        }
        if (--r->refs == 0) {
            if (type == KVF_MEM_CUDA) {
                __atomic_sub_fetch(&kvf_cuda_nregs_gpu, 1, __ATOMIC_RELEASE);
            }
            kvf_cuda_regs[i] = kvf_cuda_regs[--kvf_cuda_nregs];
            __atomic_add_fetch(&kvf_cuda_reg_gen, 1, __ATOMIC_RELEASE);
            if (kvf_cuda_nregs == 0) {
                kvf_free(kvf_cuda_regs);
                kvf_cuda_regs = NULL;
                kvf_cuda_regs_cap = 0;
            }
        }
        break;
    }
    pthread_rwlock_unlock(&kvf_cuda_reg_lock);
}

kvf_mem_type_t kvf_cuda_region_lookup(uint64_t addr, int *device_p,
                                      uint64_t *left_p)
{
    kvf_mem_type_t type = KVF_MEM_HOST;
    uint64_t left = UINT64_MAX, lo = 0, gen, end;
    kvf_cuda_reg_cache_t *c;
    int device = -1;
    size_t i;

    gen = __atomic_load_n(&kvf_cuda_reg_gen, __ATOMIC_ACQUIRE);
    for (i = 0; i < 2; i++) {
        c = &kvf_cuda_reg_tls[i];
        if (c->gen == gen && addr >= c->lo && addr < c->hi) {
            type = c->type;
            device = c->device;
            left = (c->hi == UINT64_MAX) ? UINT64_MAX : c->hi - addr;
            goto out;
        }
    }
    if (__atomic_load_n(&kvf_cuda_nregs_gpu, __ATOMIC_ACQUIRE) == 0 &&
        __atomic_load_n(&kvf_cuda_nregs, __ATOMIC_ACQUIRE) == 0) {
        goto out;
    }
    pthread_rwlock_rdlock(&kvf_cuda_reg_lock);
    gen = __atomic_load_n(&kvf_cuda_reg_gen, __ATOMIC_ACQUIRE);
    for (i = 0; i < kvf_cuda_nregs; i++) {
        const kvf_cuda_reg_t *r = &kvf_cuda_regs[i];

        end = r->addr + r->len;
        if (addr >= r->addr && addr - r->addr < r->len) {
            /* GPU ranges win over pinned ones if both hold addr */
            if (type == KVF_MEM_HOST || r->type == KVF_MEM_CUDA) {
                type = r->type;
                device = r->device;
                left = r->len - (addr - r->addr);
                lo = r->addr;
            }
        } else if (r->addr > addr && type == KVF_MEM_HOST &&
                   r->addr - addr < left) {
            left = r->addr - addr;
        } else if (end <= addr && end > lo && type == KVF_MEM_HOST) {
            lo = end; /* the gap holding addr starts after this region */
        }
    }
    pthread_rwlock_unlock(&kvf_cuda_reg_lock);
    c = &kvf_cuda_reg_tls[type == KVF_MEM_HOST ? 1 : 0];
    c->gen = gen;
    c->lo = lo;
    c->hi =
        (left == UINT64_MAX || addr + left < addr) ? UINT64_MAX : addr + left;
    c->type = type;
    c->device = device;
out:
    if (device_p != NULL) {
        *device_p = device;
    }
    if (left_p != NULL) {
        *left_p = left;
    }
    return type;
}

int kvf_cuda_have_gpu_regions(void)
{
    return __atomic_load_n(&kvf_cuda_nregs_gpu, __ATOMIC_ACQUIRE) > 0;
}

/* ---- IPC -------------------------------------------------------------- */

kvf_status_t kvf_cuda_ipc_export(uint64_t addr,
                                 unsigned char handle[KVF_CUDA_IPC_HANDLE],
                                 uint64_t *offset_p)
{
    struct cudaPointerAttributes a;
    cudaIpcMemHandle_t h;
    unsigned long long base = 0;
    size_t size = 0;
    kvf_status_t status;

    if (kvf_cuda_device_count() == 0) {
        return KVF_ERR_UNAVAILABLE;
    }
    if (cudaPointerGetAttributes(&a, (void *)(uintptr_t)addr) != cudaSuccess ||
        a.type != cudaMemoryTypeDevice || kvf_cu_range == NULL ||
        kvf_cu_range(&base, &size, addr) != 0) {
        cudaGetLastError();
        return KVF_ERR_INVALID_PARAM;
    }
    cudaSetDevice(a.device);
    status = KVF_CUDA_CHECK(cudaIpcGetMemHandle(&h, (void *)(uintptr_t)base));
    if (status != KVF_OK) {
        return status;
    }
    memcpy(handle, &h, KVF_CUDA_IPC_HANDLE);
    *offset_p = addr - base;
    return KVF_OK;
}

kvf_status_t kvf_cuda_ipc_open(const unsigned char handle[KVF_CUDA_IPC_HANDLE],
                               int device, void **base_p)
{
    cudaIpcMemHandle_t h;
    kvf_status_t status;
    void *p = NULL;

    status = kvf_cuda_use(device);
    if (status != KVF_OK) {
        return status;
    }
    memcpy(&h, handle, KVF_CUDA_IPC_HANDLE);
    status = KVF_CUDA_CHECK(
        cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
    if (status != KVF_OK) {
        return status;
    }
    *base_p = p;
    return KVF_OK;
}

void kvf_cuda_ipc_close(int device, void *base)
{
    if (base == NULL || kvf_cuda_use(device) != KVF_OK) {
        return;
    }
    KVF_CUDA_CHECK(cudaIpcCloseMemHandle(base));
}
