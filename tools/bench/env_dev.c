/*
 * Device part of the environment table: GPUs, NICs and RDMA devices.
 *
 * GPUs are the PCI functions of class 0x0300 (VGA) or 0x0302 (3D) under
 * /sys/bus/pci/devices; sysfs gives the PCIe link (current and maximum
 * speed and width) and the NUMA node. When nvidia-smi exists it adds the
 * model, driver and CUDA versions, memory and NVLink links; it runs with a
 * deadline so a hung driver cannot hang the command. NICs come from
 * /sys/class/net (speed as the driver reports it, -1 when it does not),
 * RDMA devices from /sys/class/infiniband.
 */
#include "tools/bench/env.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KVF_ENV_SMI_MS 10000

/* "16.0 GT/s PCIe" -> 4. */
static int kvf_env_pcie_gen(const char *speed)
{
    double gts = atof(speed);

    if (gts >= 60) {
        return 6;
    }
    if (gts >= 30) {
        return 5;
    }
    if (gts >= 15) {
        return 4;
    }
    if (gts >= 7) {
        return 3;
    }
    if (gts >= 4) {
        return 2;
    }
    return gts > 0 ? 1 : 0;
}

/* Basename of the symlink at path, or "". */
static void kvf_env_link_name(const char *path, char *buf, size_t len)
{
    char target[512];
    ssize_t n = readlink(path, target, sizeof(target) - 1);
    const char *slash;

    buf[0] = '\0';
    if (n <= 0) {
        return;
    }
    target[n] = '\0';
    slash = strrchr(target, '/');
    kvf_env_copy(buf, len, slash ? slash + 1 : target);
}

static void kvf_env_pci_gpus(kvf_env_t *e)
{
    static char *names[4096];
    char path[512], buf[128];
    int n = kvf_env_dir("/sys/bus/pci/devices", names, 4096), i;

    for (i = 0; i < n && e->ngpu < KVF_ENV_MAX_GPU; i++) {
        const char *dev = names[i];
        kvf_env_gpu_t *g;
        long vendor;

        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/class", dev);
        if (kvf_env_read(path, buf, sizeof(buf)) != 0 ||
            (strncmp(buf, "0x0300", 6) != 0 &&
             strncmp(buf, "0x0302", 6) != 0)) {
            continue;
        }
        g = &e->gpu[e->ngpu++];
        kvf_env_copy(g->pci, sizeof(g->pci), dev);
        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/vendor", dev);
        vendor = kvf_env_read_long(path, 0);
        kvf_env_copy(g->vendor, sizeof(g->vendor),
                     vendor == 0x10de   ? "nvidia"
                     : vendor == 0x1002 ? "amd"
                     : vendor == 0x8086 ? "intel"
                                        : "other");
        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/device", dev);
        kvf_env_read(path, buf, sizeof(buf));
        kvf_env_copy(g->device_id, sizeof(g->device_id),
                     strncmp(buf, "0x", 2) == 0 ? buf + 2 : buf);
        snprintf(g->model, sizeof(g->model), "PCI %04lx:%.6s", vendor,
                 buf + (strncmp(buf, "0x", 2) == 0 ? 2 : 0));
        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/driver", dev);
        kvf_env_link_name(path, g->driver, sizeof(g->driver));
        snprintf(path, sizeof(path),
                 "/sys/bus/pci/devices/%s/current_link_speed", dev);
        kvf_env_read(path, buf, sizeof(buf));
        g->gen_cur = kvf_env_pcie_gen(buf);
        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/max_link_speed",
                 dev);
        kvf_env_read(path, buf, sizeof(buf));
        g->gen_max = kvf_env_pcie_gen(buf);
        snprintf(path, sizeof(path),
                 "/sys/bus/pci/devices/%s/current_link_width", dev);
        g->width_cur = (int)kvf_env_read_long(path, 0);
        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/max_link_width",
                 dev);
        g->width_max = (int)kvf_env_read_long(path, 0);
        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", dev);
        g->numa = (int)kvf_env_read_long(path, -1);
        g->nvlinks = -1;
    }
    kvf_env_dir_free(names, n);
}

/* The sysfs GPU with this nvidia-smi bus id ("00000000:17:00.0"), or a
 * new entry when sysfs did not list it. */
static kvf_env_gpu_t *kvf_env_gpu_by_bus(kvf_env_t *e, const char *bus)
{
    size_t bl = strlen(bus);
    int i;

    for (i = 0; i < e->ngpu; i++) {
        size_t pl = strlen(e->gpu[i].pci);

        if (bl >= 12 && pl >= 12 &&
            strcasecmp(bus + bl - 12, e->gpu[i].pci + pl - 12) == 0) {
            return &e->gpu[i];
        }
    }
    if (e->ngpu == KVF_ENV_MAX_GPU) {
        return NULL;
    }
    memset(&e->gpu[e->ngpu], 0, sizeof(e->gpu[0]));
    kvf_env_copy(e->gpu[e->ngpu].pci, sizeof(e->gpu[0].pci), bus);
    snprintf(e->gpu[e->ngpu].vendor, sizeof(e->gpu[0].vendor), "nvidia");
    e->gpu[e->ngpu].numa = -1;
    e->gpu[e->ngpu].nvlinks = -1;
    return &e->gpu[e->ngpu++];
}

static void kvf_env_nvidia_smi(kvf_env_t *e)
{
    static char out[65536];
    char *query[] = {"nvidia-smi",
                     "--query-gpu=index,pci.bus_id,name,driver_version,"
                     "memory.total",
                     "--format=csv,noheader,nounits", NULL};
    char *plain[] = {"nvidia-smi", NULL};
    char *nvlink[] = {"nvidia-smi", "nvlink", "--status", NULL};
    kvf_env_gpu_t *by_index[KVF_ENV_MAX_GPU] = {NULL};
    kvf_env_gpu_t *cur = NULL;
    char *line, *save = NULL, *p;

    if (kvf_env_run(query, out, sizeof(out), KVF_ENV_SMI_MS) != 0) {
        return;
    }
    e->nvidia_smi = 1;
    for (line = strtok_r(out, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        char *f[5], *s2 = NULL;
        int k = 0, idx;
        kvf_env_gpu_t *g;

        for (p = strtok_r(line, ",", &s2); p != NULL && k < 5;
             p = strtok_r(NULL, ",", &s2)) {
            while (isspace((unsigned char)*p)) {
                p++;
            }
            f[k++] = p;
        }
        if (k < 5 || (g = kvf_env_gpu_by_bus(e, f[1])) == NULL) {
            continue;
        }
        idx = atoi(f[0]);
        if (idx >= 0 && idx < KVF_ENV_MAX_GPU) {
            by_index[idx] = g;
        }
        kvf_env_copy(g->model, sizeof(g->model), f[2]);
        kvf_env_copy(g->driver, sizeof(g->driver), f[3]);
        g->mem_bytes = strtoull(f[4], NULL, 10) << 20;
        g->nvlinks = 0;
    }
    if (kvf_env_run(plain, out, sizeof(out), KVF_ENV_SMI_MS) == 0 &&
        (p = strstr(out, "CUDA Version:")) != NULL) {
        sscanf(p + 13, " %15[0-9.]", e->cuda);
    }
    if (kvf_env_run(nvlink, out, sizeof(out), KVF_ENV_SMI_MS) != 0) {
        return;
    }
    for (line = strtok_r(out, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        int idx, link;
        double gbs;

        if (sscanf(line, "GPU %d:", &idx) == 1) {
            cur = (idx >= 0 && idx < KVF_ENV_MAX_GPU) ? by_index[idx] : NULL;
        } else if (cur != NULL &&
                   sscanf(line, " Link %d: %lf GB/s", &link, &gbs) == 2) {
            cur->nvlinks++;
            cur->nvlink_gbs += gbs;
        }
    }
}

static void kvf_env_nics(kvf_env_t *e)
{
    char *names[256], path[512];
    int n = kvf_env_dir("/sys/class/net", names, 256), i;

    for (i = 0; i < n && e->nnic < KVF_ENV_MAX_NIC; i++) {
        kvf_env_nic_t *c = &e->nic[e->nnic++];

        kvf_env_copy(c->name, sizeof(c->name), names[i]);
        snprintf(path, sizeof(path), "/sys/class/net/%s/operstate", names[i]);
        kvf_env_read(path, c->state, sizeof(c->state));
        snprintf(path, sizeof(path), "/sys/class/net/%s/mtu", names[i]);
        c->mtu = (int)kvf_env_read_long(path, 0);
        snprintf(path, sizeof(path), "/sys/class/net/%s/speed", names[i]);
        c->speed_mbps = kvf_env_read_long(path, -1);
        if (c->speed_mbps <= 0) {
            c->speed_mbps = -1;
        }
        snprintf(path, sizeof(path), "/sys/class/net/%s/device", names[i]);
        c->is_virtual = access(path, F_OK) != 0;
        snprintf(path, sizeof(path), "/sys/class/net/%s/device/driver",
                 names[i]);
        kvf_env_link_name(path, c->driver, sizeof(c->driver));
        snprintf(path, sizeof(path), "/sys/class/net/%s/device/numa_node",
                 names[i]);
        c->numa = (int)kvf_env_read_long(path, -1);
    }
    kvf_env_dir_free(names, n);
}

static void kvf_env_rdma_devs(kvf_env_t *e)
{
    char *names[64], *ports[16], path[512], buf[64];
    int n = kvf_env_dir("/sys/class/infiniband", names, 64), i, k, np;

    for (i = 0; i < n && e->nrdma < KVF_ENV_MAX_RDMA; i++) {
        kvf_env_rdma_t *r = &e->rdma[e->nrdma++];

        kvf_env_copy(r->name, sizeof(r->name), names[i]);
        snprintf(path, sizeof(path), "/sys/class/infiniband/%s/fw_ver",
                 names[i]);
        kvf_env_read(path, r->fw, sizeof(r->fw));
        snprintf(path, sizeof(path), "/sys/class/infiniband/%s/node_type",
                 names[i]);
        kvf_env_read(path, r->node_type, sizeof(r->node_type));
        snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports",
                 names[i]);
        np = kvf_env_dir(path, ports, 16);
        for (k = 0; k < np && r->nports < KVF_ENV_MAX_PORT; k++) {
            kvf_env_rdma_port_t *p = &r->port[r->nports++];
            const char *base = "/sys/class/infiniband";
            char *colon;

            p->port = atoi(ports[k]);
            snprintf(path, sizeof(path), "%s/%s/ports/%s/state", base, names[i],
                     ports[k]);
            kvf_env_read(path, buf, sizeof(buf));
            colon = strchr(buf, ':'); /* "4: ACTIVE" */
            kvf_env_copy(p->state, sizeof(p->state), colon ? colon + 2 : buf);
            snprintf(path, sizeof(path), "%s/%s/ports/%s/rate", base, names[i],
                     ports[k]);
            kvf_env_read(path, p->rate, sizeof(p->rate));
            snprintf(path, sizeof(path), "%s/%s/ports/%s/link_layer", base,
                     names[i], ports[k]);
            kvf_env_read(path, p->link_layer, sizeof(p->link_layer));
        }
        kvf_env_dir_free(ports, np);
    }
    kvf_env_dir_free(names, n);
}

void kvf_env_devices(kvf_env_t *e)
{
    kvf_env_pci_gpus(e);
    kvf_env_nvidia_smi(e);
    kvf_env_nics(e);
    kvf_env_rdma_devs(e);
}
