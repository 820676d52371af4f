/*
 * Private to the kvferry command: the detected environment (seed 003 §1)
 * that env.c and env_dev.c fill and env_cmd.c prints
 * (text table, JSON, Markdown). Records get it as data through
 * kvf_env_record_write().
 */
#ifndef KVF_TOOLS_BENCH_ENV_H
#define KVF_TOOLS_BENCH_ENV_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/bench/env.h is private to tools/"
#endif

#include "tools/cli/cli.h"
#include "tools/record/record.h"

#include <stddef.h>
#include <stdint.h>

#define KVF_ENV_MAX_NUMA 16
#define KVF_ENV_MAX_GPU  16
#define KVF_ENV_MAX_NIC  32
#define KVF_ENV_MAX_RDMA 8
#define KVF_ENV_MAX_PORT 4

typedef struct kvf_env_numa {
    int id;
    char cpus[64];
    uint64_t mem_bytes;
} kvf_env_numa_t;

typedef struct kvf_env_gpu {
    char pci[32];    /* "0000:17:00.0" */
    char vendor[16]; /* "nvidia", "amd", "intel" or "0x...." */
    char device_id[8];
    char model[96];     /* from nvidia-smi, else "PCI <vendor>:<device>" */
    char driver[32];    /* driver version (nvidia-smi) or kernel module */
    uint64_t mem_bytes; /* 0 = unknown */
    int gen_cur, width_cur, gen_max, width_max; /* 0 = unknown */
    int numa;                                   /* -1 = none / unknown */
    int nvlinks;       /* active NVLink links, -1 = unknown */
    double nvlink_gbs; /* sum of their speeds, GB/s per direction */
} kvf_env_gpu_t;

typedef struct kvf_env_nic {
    char name[32];
    char state[16];  /* operstate */
    char driver[32]; /* kernel module; "" for virtual */
    long speed_mbps; /* -1 = not reported */
    int mtu;
    int numa;
    int is_virtual;
} kvf_env_nic_t;

typedef struct kvf_env_rdma_port {
    int port;
    char state[32];
    char rate[64];
    char link_layer[32];
} kvf_env_rdma_port_t;

typedef struct kvf_env_rdma {
    char name[32];
    char fw[64];
    char node_type[32];
    int nports;
    kvf_env_rdma_port_t port[KVF_ENV_MAX_PORT];
} kvf_env_rdma_t;

typedef struct kvf_env {
    char host[128], os[128], kernel[128], kernel_build[160], arch[32];
    char product[96], container[32];
    int hypervisor;
    char cpu_model[128], governor[32];
    int logical, usable, cores, sockets;
    double cgroup_cpus; /* 0 = no limit */
    int nnuma;
    kvf_env_numa_t numa[KVF_ENV_MAX_NUMA];
    uint64_t mem_total, mem_avail, cgroup_mem, hugepage_size, hugepages;
    char thp[16];
    char thp_shmem[16]; /* shmem_enabled: huge pages of shm pools */
    double load[3];     /* /proc/loadavg: 1, 5, 15 minutes */
    int nvidia_smi;     /* nvidia-smi ran */
    char cuda[16];      /* CUDA version the driver supports */
    int ngpu;
    kvf_env_gpu_t gpu[KVF_ENV_MAX_GPU];
    int nnic;
    kvf_env_nic_t nic[KVF_ENV_MAX_NIC];
    int nrdma;
    kvf_env_rdma_t rdma[KVF_ENV_MAX_RDMA];
} kvf_env_t;

/* Detects once per process and returns the result. */
const kvf_env_t *kvf_env_get(void);
void kvf_env_detect_all(kvf_env_t *e);
/* GPUs, NICs and RDMA devices (env_dev.c). */
void kvf_env_devices(kvf_env_t *e);

/* Small helpers shared by the detection files. */
int kvf_env_read(const char *path, char *buf, size_t len);
int kvf_env_run(char *const argv[], char *out, size_t len, int timeout_ms);
long kvf_env_read_long(const char *path, long dflt);
/* Copies src into dst[len], truncating. */
void kvf_env_copy(char *dst, size_t len, const char *src);
/* Sorted names in dir (not starting with '.'), at most max; returns the
 * count. Free with kvf_env_dir_free. */
int kvf_env_dir(const char *dir, char **names, int max);
void kvf_env_dir_free(char **names, int n);

/* Calls row(item, value, arg) for each line of the table. */
void kvf_env_rows(const kvf_env_t *e,
                  void (*row)(const char *item, const char *value, void *arg),
                  void *arg);

/* The "environment" object of records and `bench env --json`, written
 * with j under key (NULL at the top level or in an array). */
void kvf_env_json(kvf_json_t *j, const char *key);
/* The same as Markdown table rows "| item | value |". */
void kvf_env_markdown(FILE *f);

/* The device's O_DIRECT ceilings for a disk tier (env_disk.c). */
#define KVF_ENV_DISK_BLOCK (1u << 20)
#define KVF_ENV_DISK_QD    16u

typedef struct kvf_env_disk {
    char dir[256];
    char path[300];
    char dev[300];       /* the file system's device and mount point */
    uint64_t file_bytes; /* the test file */
    double read_gbs;     /* random reads, 10^9 bytes/s */
    double write_gbs;    /* sequential writes */
    int uring;           /* through io_uring (else pread/pwrite) */
    char err[320];       /* "" when measured */
} kvf_env_disk_t;

/* Writes a file of `bytes` in dir, then reads it back at random, with
 * O_DIRECT (the file is removed). 0, or -1 with d->err. */
int kvf_env_disk_measure(const char *dir, uint64_t bytes, kvf_env_disk_t *d);
/* The result in words, for tables and records. */
void kvf_env_disk_text(const kvf_env_disk_t *d, char *out, size_t cap);

/* Gives rec the detected environment (kvf_record_environment) and writes
 * it to dir (kvf_record_write). Returns 0 on success. */
int kvf_env_record_write(kvf_record_t *rec, const char *dir);

#endif
