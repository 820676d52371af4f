/*
 * The environment table (seed 003 §1), detected rather than typed: CPU,
 * cores, NUMA nodes, memory, kernel, GPUs (model, driver, CUDA, PCIe
 * generation and width, NUMA affinity, NVLink), NICs and their speeds,
 * RDMA devices, and kvferry's version and build options.
 *
 * Sources: /proc (cpuinfo, meminfo), /sys (cpu topology, NUMA nodes,
 * cgroup limits, PCI devices of class 0x0300/0x0302, net, infiniband) and
 * nvidia-smi when it exists (spawned with a deadline, killed past it).
 * Detection runs once per process; records and `kvferry bench env` (in
 * env_cmd.c) print the same data as JSON, a text table or Markdown.
 */
#include "tools/bench/env.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static kvf_env_t kvf_env;
static int kvf_env_done;

/* Trims leading and trailing blanks in place. */
static char *kvf_env_trim(char *s)
{
    char *e;

    while (isspace((unsigned char)*s)) {
        s++;
    }
    e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) {
        *--e = '\0';
    }
    return s;
}

/* ---- CPU, NUMA, memory, kernel ---------------------------------------- */

static void kvf_env_cpu(kvf_env_t *e)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512], path[128], buf[64];
    static int pkg_core[4096][2];
    int n = 0, i, k, npairs = 0, nsock = 0, sockets[256];
    cpu_set_t set;

    if (f != NULL) {
        while (fgets(line, sizeof(line), f) != NULL) {
            char *colon = strchr(line, ':');

            if (colon == NULL) {
                continue;
            }
            *colon = '\0';
            if (e->cpu_model[0] == '\0' &&
                (strcmp(kvf_env_trim(line), "model name") == 0 ||
                 strcmp(line, "Model") == 0 || strcmp(line, "Hardware") == 0)) {
                kvf_env_copy(e->cpu_model, sizeof(e->cpu_model),
                             kvf_env_trim(colon + 1));
            } else if (strcmp(kvf_env_trim(line), "flags") == 0 &&
                       strstr(colon + 1, " hypervisor") != NULL) {
                e->hypervisor = 1;
            }
        }
        fclose(f);
    }
    e->logical = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        e->usable = CPU_COUNT(&set);
    }
    /* Physical cores: distinct (package, core) pairs of online CPUs. */
    for (n = 0; n < 4096; n++) {
        long pkg, core;

        snprintf(path, sizeof(path),
                 "/sys/devices/system/cpu/cpu%d/topology/core_id", n);
        core = kvf_env_read_long(path, -1);
        if (core < 0) {
            if (access(path, F_OK) != 0 && n >= e->logical) {
                break;
            }
            continue;
        }
        snprintf(path, sizeof(path),
                 "/sys/devices/system/cpu/cpu%d/topology/"
                 "physical_package_id",
                 n);
        pkg = kvf_env_read_long(path, 0);
        for (i = 0; i < npairs; i++) {
            if (pkg_core[i][0] == pkg && pkg_core[i][1] == core) {
                break;
            }
        }
        if (i == npairs) {
            pkg_core[npairs][0] = (int)pkg;
            pkg_core[npairs][1] = (int)core;
            npairs++;
        }
        for (k = 0; k < nsock && sockets[k] != pkg; k++) {
        }
        if (k == nsock && nsock < 256) {
            sockets[nsock++] = (int)pkg;
        }
    }
    e->cores = npairs > 0 ? npairs : e->logical;
    e->sockets = nsock > 0 ? nsock : 1;
    kvf_env_read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor",
                 e->governor, sizeof(e->governor));
    if (kvf_env_read("/sys/fs/cgroup/cpu.max", buf, sizeof(buf)) == 0) {
        double quota, period;

        if (sscanf(buf, "%lf %lf", &quota, &period) == 2 && period > 0) {
            e->cgroup_cpus = quota / period;
        }
    }
}

static void kvf_env_numa(kvf_env_t *e)
{
    char *names[256], path[320], line[256];
    int n = kvf_env_dir("/sys/devices/system/node", names, 256);
    int i;

    for (i = 0; i < n; i++) {
        kvf_env_numa_t *nd;
        FILE *f;

        if (strncmp(names[i], "node", 4) != 0 ||
            !isdigit((unsigned char)names[i][4]) ||
            e->nnuma >= KVF_ENV_MAX_NUMA) {
            continue;
        }
        nd = &e->numa[e->nnuma++];
        nd->id = atoi(names[i] + 4);
        snprintf(path, sizeof(path), "/sys/devices/system/node/%s/cpulist",
                 names[i]);
        kvf_env_read(path, nd->cpus, sizeof(nd->cpus));
        snprintf(path, sizeof(path), "/sys/devices/system/node/%s/meminfo",
                 names[i]);
        f = fopen(path, "r");
        while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
            char *p = strstr(line, "MemTotal:");
            unsigned long long kb;

            if (p != NULL && sscanf(p + 9, "%llu", &kb) == 1) {
                nd->mem_bytes = kb * 1024ull;
            }
        }
        if (f != NULL) {
            fclose(f);
        }
    }
    kvf_env_dir_free(names, n);
}

/* The [selected] word of a transparent_hugepage setting, or "". */
static void kvf_env_thp(const char *path, char *out, size_t outlen)
{
    char buf[256], *l, *r;

    out[0] = '\0';
    if (kvf_env_read(path, buf, sizeof(buf)) != 0) {
        return;
    }
    l = strchr(buf, '[');
    r = l ? strchr(l, ']') : NULL;
    if (l != NULL && r != NULL) {
        *r = '\0';
        kvf_env_copy(out, outlen, l + 1);
    }
}
static void kvf_env_memory(kvf_env_t *e)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256], buf[64];
    unsigned long long kb;

    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "MemTotal: %llu", &kb) == 1) {
            e->mem_total = kb * 1024ull;
        } else if (sscanf(line, "MemAvailable: %llu", &kb) == 1) {
            e->mem_avail = kb * 1024ull;
        } else if (sscanf(line, "Hugepagesize: %llu", &kb) == 1) {
            e->hugepage_size = kb * 1024ull;
        } else if (sscanf(line, "HugePages_Total: %llu", &kb) == 1) {
            e->hugepages = kb;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    if (kvf_env_read("/proc/loadavg", buf, sizeof(buf)) == 0) {
        sscanf(buf, "%lf %lf %lf", &e->load[0], &e->load[1], &e->load[2]);
    }
    if (kvf_env_read("/sys/fs/cgroup/memory.max", buf, sizeof(buf)) == 0 &&
        isdigit((unsigned char)buf[0])) {
        e->cgroup_mem = strtoull(buf, NULL, 10);
    }
    kvf_env_thp("/sys/kernel/mm/transparent_hugepage/enabled", e->thp,
                sizeof(e->thp));
    /* shm pools are shmem: their huge pages follow this one */
    kvf_env_thp("/sys/kernel/mm/transparent_hugepage/shmem_enabled",
                e->thp_shmem, sizeof(e->thp_shmem));
}

static void kvf_env_system(kvf_env_t *e)
{
    struct utsname u;
    FILE *f;
    char line[256];

    if (uname(&u) == 0) {
        kvf_env_copy(e->kernel, sizeof(e->kernel), u.release);
        kvf_env_copy(e->kernel_build, sizeof(e->kernel_build), u.version);
        kvf_env_copy(e->arch, sizeof(e->arch), u.machine);
    }
    if (gethostname(e->host, sizeof(e->host) - 1) != 0) {
        kvf_env_copy(e->host, sizeof(e->host), "unknown");
    }
    f = fopen("/etc/os-release", "r");
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "PRETTY_NAME=", 12) == 0) {
            char *v = kvf_env_trim(line + 12);
            size_t n = strlen(v);

            if (n >= 2 && v[0] == '"' && v[n - 1] == '"') {
                v[n - 1] = '\0';
                v++;
            }
            kvf_env_copy(e->os, sizeof(e->os), v);
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    kvf_env_read("/sys/class/dmi/id/product_name", e->product,
                 sizeof(e->product));
    if (access("/.dockerenv", F_OK) == 0) {
        kvf_env_copy(e->container, sizeof(e->container), "docker");
    } else if (access("/run/.containerenv", F_OK) == 0) {
        kvf_env_copy(e->container, sizeof(e->container), "podman");
    } else {
        char cg[1024];

        kvf_env_read("/proc/1/cgroup", cg, sizeof(cg));
        if (strstr(cg, "kubepods") != NULL) {
            kvf_env_copy(e->container, sizeof(e->container), "kubernetes");
        } else if (strstr(cg, "docker") != NULL) {
            kvf_env_copy(e->container, sizeof(e->container), "docker");
        } else if (strstr(cg, "lxc") != NULL) {
            kvf_env_copy(e->container, sizeof(e->container), "lxc");
        }
    }
}

void kvf_env_detect_all(kvf_env_t *e)
{
    memset(e, 0, sizeof(*e));
    kvf_env_cpu(e);
    kvf_env_numa(e);
    kvf_env_memory(e);
    kvf_env_system(e);
    kvf_env_devices(e);
}

const kvf_env_t *kvf_env_get(void)
{
    if (!kvf_env_done) {
        kvf_env_detect_all(&kvf_env);
        kvf_env_done = 1;
    }
    return &kvf_env;
}
