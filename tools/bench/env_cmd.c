/*
 * `kvferry bench env`: prints the detected environment (seed 003 §1) as a
 * fixed-column table, as JSON (--json), and writes a record (--record
 * DIR). Also the two views records get as data: kvf_env_json() (the
 * "environment" object of every record) and kvf_env_markdown() (the
 * environment table of its Markdown twin), both from the same detection
 * (env.c, env_dev.c), so every record of a run describes the machine the
 * same way (kvf_env_record_write).
 */
#include "tools/bench/env.h"
#include "tools/cli/opts.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <kvferry/perf.h>

#ifndef KVF_BUILD_TYPE
#define KVF_BUILD_TYPE "unknown"
#endif
#ifndef KVF_BUILD_SANITIZE
#define KVF_BUILD_SANITIZE 0
#endif
#ifndef KVF_BUILD_WERROR
#define KVF_BUILD_WERROR 0
#endif
#ifdef KVF_HAVE_CUDA
#define KVF_BUILD_CUDA 1
#else
#define KVF_BUILD_CUDA 0
#endif

static const char *kvf_env_gib(char *buf, size_t len, uint64_t bytes)
{
    snprintf(buf, len, "%.1f GiB", (double)bytes / (double)(1ull << 30));
    return buf;
}

/* UCX's version and its transports/devices, as `ucx_info` reports them
 * (what the ucx transport may use: UCX_TLS and UCX_NET_DEVICES narrow
 * it); "ucx_info not found" without ucx-utils. */
static void kvf_env_ucx(char *buf, size_t len)
{
    char line[256], tl[64] = "", ver[64] = "";
    size_t n = 0;
    FILE *f;

    snprintf(buf, len, "ucx_info not found");
    f = popen("(ucx_info -v && ucx_info -d) 2>/dev/null", "r");
    if (f == NULL) {
        return;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        if (n == 0 && sscanf(line, "# Version %63s", ver) == 1) {
            n = (size_t)snprintf(buf, len, "%s:", ver);
        } else if (sscanf(line, "# Transport: %63s", tl) == 1) {
            continue;
        } else if (n > 0 && n < len && tl[0] != '\0' &&
                   sscanf(line, "# Device: %63s", line) == 1) {
            n += (size_t)snprintf(buf + n, len - n, " %s/%s", tl, line);
        }
    }
    pclose(f);
}

static void kvf_env_transports(char *buf, size_t len)
{
    const char *names[16];
    size_t i, n = 0, count = kvf_transport_names(names, 16);

    buf[0] = '\0';
    for (i = 0; i < count && i < 16 && n + 1 < len; i++) {
        n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? "," : "", names[i]);
    }
}

static void kvf_env_gpu_text(const kvf_env_t *e, const kvf_env_gpu_t *g,
                             char *buf, size_t len)
{
    char mem[40] = "", gib[32], cuda[32] = "", nvl[64] = "";

    if (g->mem_bytes > 0) {
        snprintf(mem, sizeof(mem), ", %s",
                 kvf_env_gib(gib, sizeof(gib), g->mem_bytes));
    }
    if (e->cuda[0] && strcmp(g->vendor, "nvidia") == 0) {
        snprintf(cuda, sizeof(cuda), ", CUDA %s", e->cuda);
    }
    if (g->nvlinks > 0) {
        snprintf(nvl, sizeof(nvl), "NVLink %d links %.0f GB/s", g->nvlinks,
                 g->nvlink_gbs);
    } else {
        snprintf(nvl, sizeof(nvl), "%s",
                 g->nvlinks == 0 ? "no NVLink" : "NVLink unknown");
    }
    snprintf(buf, len,
             "%s, driver %s%s%s, PCIe Gen%d x%d (max Gen%d x%d), "
             "NUMA %d, %s, %s",
             g->model, g->driver[0] ? g->driver : "none", cuda, mem, g->gen_cur,
             g->width_cur, g->gen_max, g->width_max, g->numa, nvl, g->pci);
}

void kvf_env_rows(const kvf_env_t *e,
                  void (*row)(const char *item, const char *value, void *arg),
                  void *arg)
{
    char v[1024], a[32], b[32], item[64], tr[128];
    size_t n;
    int i, k;

    row("host", e->host, arg);
    snprintf(v, sizeof(v), "%s%s%s%s%s", e->product[0] ? e->product : "",
             e->product[0] ? "; " : "",
             e->hypervisor ? "virtual machine" : "bare metal or unknown",
             e->container[0] ? "; container " : "", e->container);
    row("system", v, arg);
    row("os", e->os[0] ? e->os : "unknown", arg);
    snprintf(v, sizeof(v), "%s (%s)", e->kernel, e->arch);
    row("kernel", v, arg);
    row("cpu", e->cpu_model[0] ? e->cpu_model : "unknown", arg);
    n = (size_t)snprintf(v, sizeof(v),
                         "%d logical, %d physical in %d socket%s, %d usable "
                         "by this process",
                         e->logical, e->cores, e->sockets,
                         e->sockets == 1 ? "" : "s", e->usable);
    if (e->cgroup_cpus > 0 && n < sizeof(v)) {
        snprintf(v + n, sizeof(v) - n, ", cgroup limit %.2g CPUs",
                 e->cgroup_cpus);
    }
    row("cores", v, arg);
    row("cpu governor", e->governor[0] ? e->governor : "not exposed", arg);
    n = (size_t)snprintf(v, sizeof(v), "%d", e->nnuma);
    for (i = 0; i < e->nnuma && n < sizeof(v); i++) {
        n += (size_t)snprintf(v + n, sizeof(v) - n, "%s node%d cpus %s %s",
                              i ? ";" : ":", e->numa[i].id, e->numa[i].cpus,
                              kvf_env_gib(a, sizeof(a), e->numa[i].mem_bytes));
    }
    row("numa nodes", v, arg);
    n = (size_t)snprintf(v, sizeof(v), "%s total, %s available",
                         kvf_env_gib(a, sizeof(a), e->mem_total),
                         kvf_env_gib(b, sizeof(b), e->mem_avail));
    if (e->cgroup_mem > 0 && n < sizeof(v)) {
        n += (size_t)snprintf(v + n, sizeof(v) - n, ", cgroup limit %s",
                              kvf_env_gib(a, sizeof(a), e->cgroup_mem));
    }
    if (n < sizeof(v)) {
        snprintf(v + n, sizeof(v) - n,
                 ", THP %s, shmem THP %s, %llu huge pages of %llu KiB",
                 e->thp[0] ? e->thp : "unknown",
                 e->thp_shmem[0] ? e->thp_shmem : "unknown",
                 (unsigned long long)e->hugepages,
                 (unsigned long long)(e->hugepage_size >> 10));
    }
    row("memory", v, arg);
    snprintf(v, sizeof(v),
             "%.2f %.2f %.2f (1, 5, 15 min, at detection; other work "
             "on the machine skews benches)",
             e->load[0], e->load[1], e->load[2]);
    row("load average", v, arg);
    if (e->ngpu == 0) {
        row("gpus",
            e->nvidia_smi ? "none (nvidia-smi lists none)" : "none found", arg);
    }
    for (i = 0; i < e->ngpu; i++) {
        snprintf(item, sizeof(item), "gpu %d", i);
        kvf_env_gpu_text(e, &e->gpu[i], v, sizeof(v));
        row(item, v, arg);
    }
    for (i = 0; i < e->nnic; i++) {
        const kvf_env_nic_t *c = &e->nic[i];
        char speed[32];

        snprintf(item, sizeof(item), "nic %s", c->name);
        if (c->speed_mbps > 0) {
            snprintf(speed, sizeof(speed), "%ld Mb/s", c->speed_mbps);
        } else {
            snprintf(speed, sizeof(speed), "speed not reported");
        }
        snprintf(v, sizeof(v), "%s, %s, mtu %d, %s%s, NUMA %d",
                 c->state[0] ? c->state : "unknown", speed, c->mtu,
                 c->is_virtual ? "virtual" : "driver ",
                 c->is_virtual ? "" : c->driver, c->numa);
        row(item, v, arg);
    }
    if (e->nrdma == 0) {
        row("rdma", "none", arg);
    }
    for (i = 0; i < e->nrdma; i++) {
        const kvf_env_rdma_t *r = &e->rdma[i];

        snprintf(item, sizeof(item), "rdma %s", r->name);
        n = (size_t)snprintf(v, sizeof(v), "fw %s, %s", r->fw, r->node_type);
        for (k = 0; k < r->nports && n < sizeof(v); k++) {
            n += (size_t)snprintf(v + n, sizeof(v) - n, "; port %d %s %s %s",
                                  r->port[k].port, r->port[k].state,
                                  r->port[k].rate, r->port[k].link_layer);
        }
        row(item, v, arg);
    }
    kvf_env_ucx(v, sizeof(v));
    row("ucx", v, arg);
    kvf_env_transports(tr, sizeof(tr));
    snprintf(v, sizeof(v),
             "%s (%s, %s %s, transports %s, cuda %s, sanitizers %s, "
             "werror %s)",
             kvf_version(), KVF_BUILD_TYPE,
#ifdef __clang__
             "clang",
#else
             "gcc",
#endif
             __VERSION__, tr, KVF_BUILD_CUDA ? "built" : "not built",
             KVF_BUILD_SANITIZE ? "on" : "off",
             KVF_BUILD_WERROR ? "on" : "off");
    row("kvferry", v, arg);
}

static void kvf_env_json_gpu(kvf_json_t *j, const kvf_env_t *e,
                             const kvf_env_gpu_t *g)
{
    kvf_json_obj(j, NULL);
    kvf_json_str(j, "pci", g->pci);
    kvf_json_str(j, "vendor", g->vendor);
    kvf_json_str(j, "model", g->model);
    kvf_json_str(j, "driver", g->driver[0] ? g->driver : NULL);
    kvf_json_str(j, "cuda",
                 e->cuda[0] && !strcmp(g->vendor, "nvidia") ? e->cuda : NULL);
    if (g->mem_bytes > 0) {
        kvf_json_int(j, "memory_bytes", (long long)g->mem_bytes);
    } else {
        kvf_json_str(j, "memory_bytes", NULL);
    }
    kvf_json_int(j, "pcie_gen", g->gen_cur);
    kvf_json_int(j, "pcie_width", g->width_cur);
    kvf_json_int(j, "pcie_gen_max", g->gen_max);
    kvf_json_int(j, "pcie_width_max", g->width_max);
    kvf_json_int(j, "numa_node", g->numa);
    kvf_json_num(j, "nvlink_links", g->nvlinks >= 0 ? g->nvlinks : NAN);
    kvf_json_num(j, "nvlink_gbs", g->nvlinks >= 0 ? g->nvlink_gbs : NAN);
    kvf_json_end_obj(j);
}

void kvf_env_json(kvf_json_t *j, const char *key)
{
    const kvf_env_t *e = kvf_env_get();
    char tr[128];
    int i, k;

    kvf_json_obj(j, key);
    kvf_json_str(j, "host", e->host);
    kvf_json_str(j, "os", e->os);
    kvf_json_str(j, "kernel", e->kernel);
    kvf_json_str(j, "kernel_build", e->kernel_build);
    kvf_json_str(j, "arch", e->arch);
    kvf_json_str(j, "product", e->product);
    kvf_json_bool(j, "virtual_machine", e->hypervisor);
    kvf_json_str(j, "container", e->container[0] ? e->container : NULL);
    kvf_json_obj(j, "cpu");
    kvf_json_str(j, "model", e->cpu_model);
    kvf_json_int(j, "logical", e->logical);
    kvf_json_int(j, "physical_cores", e->cores);
    kvf_json_int(j, "sockets", e->sockets);
    kvf_json_int(j, "usable", e->usable);
    kvf_json_num(j, "cgroup_cpus", e->cgroup_cpus > 0 ? e->cgroup_cpus : NAN);
    kvf_json_str(j, "governor", e->governor[0] ? e->governor : NULL);
    kvf_json_end_obj(j);
    kvf_json_arr(j, "numa_nodes");
    for (i = 0; i < e->nnuma; i++) {
        kvf_json_obj(j, NULL);
        kvf_json_int(j, "node", e->numa[i].id);
        kvf_json_str(j, "cpus", e->numa[i].cpus);
        kvf_json_int(j, "memory_bytes", (long long)e->numa[i].mem_bytes);
        kvf_json_end_obj(j);
    }
    kvf_json_end_arr(j);
    kvf_json_obj(j, "memory");
    kvf_json_int(j, "total_bytes", (long long)e->mem_total);
    kvf_json_int(j, "available_bytes", (long long)e->mem_avail);
    if (e->cgroup_mem > 0) {
        kvf_json_int(j, "cgroup_limit_bytes", (long long)e->cgroup_mem);
    } else {
        kvf_json_str(j, "cgroup_limit_bytes", NULL);
    }
    kvf_json_str(j, "transparent_hugepages", e->thp[0] ? e->thp : NULL);
    kvf_json_str(j, "transparent_hugepages_shmem",
                 e->thp_shmem[0] ? e->thp_shmem : NULL);
    kvf_json_int(j, "hugepages", (long long)e->hugepages);
    kvf_json_int(j, "hugepage_bytes", (long long)e->hugepage_size);
    kvf_json_end_obj(j);
    kvf_json_arr(j, "load_average");
    for (i = 0; i < 3; i++) {
        kvf_json_num(j, NULL, e->load[i]);
    }
    kvf_json_end_arr(j);
    kvf_json_bool(j, "nvidia_smi", e->nvidia_smi);
    kvf_json_arr(j, "gpus");
    for (i = 0; i < e->ngpu; i++) {
        kvf_env_json_gpu(j, e, &e->gpu[i]);
    }
    kvf_json_end_arr(j);
    kvf_json_arr(j, "nics");
    for (i = 0; i < e->nnic; i++) {
        const kvf_env_nic_t *c = &e->nic[i];

        kvf_json_obj(j, NULL);
        kvf_json_str(j, "name", c->name);
        kvf_json_str(j, "state", c->state);
        kvf_json_num(j, "speed_mbps", c->speed_mbps > 0 ? c->speed_mbps : NAN);
        kvf_json_int(j, "mtu", c->mtu);
        kvf_json_bool(j, "virtual", c->is_virtual);
        kvf_json_str(j, "driver", c->driver[0] ? c->driver : NULL);
        kvf_json_int(j, "numa_node", c->numa);
        kvf_json_end_obj(j);
    }
    kvf_json_end_arr(j);
    kvf_json_arr(j, "rdma");
    for (i = 0; i < e->nrdma; i++) {
        const kvf_env_rdma_t *r = &e->rdma[i];

        kvf_json_obj(j, NULL);
        kvf_json_str(j, "name", r->name);
        kvf_json_str(j, "fw", r->fw);
        kvf_json_str(j, "node_type", r->node_type);
        kvf_json_arr(j, "ports");
        for (k = 0; k < r->nports; k++) {
            kvf_json_obj(j, NULL);
            kvf_json_int(j, "port", r->port[k].port);
            kvf_json_str(j, "state", r->port[k].state);
            kvf_json_str(j, "rate", r->port[k].rate);
            kvf_json_str(j, "link_layer", r->port[k].link_layer);
            kvf_json_end_obj(j);
        }
        kvf_json_end_arr(j);
        kvf_json_end_obj(j);
    }
    kvf_json_end_arr(j);
    kvf_json_obj(j, "kvferry");
    kvf_json_str(j, "version", kvf_version());
    kvf_json_str(j, "build_type", KVF_BUILD_TYPE);
    kvf_json_str(j, "compiler", __VERSION__);
    kvf_env_transports(tr, sizeof(tr));
    kvf_json_str(j, "transports", tr);
    kvf_json_bool(j, "cuda", KVF_BUILD_CUDA);
    kvf_json_bool(j, "sanitizers", KVF_BUILD_SANITIZE);
    kvf_json_bool(j, "werror", KVF_BUILD_WERROR);
    kvf_json_end_obj(j);
    kvf_json_end_obj(j);
}

static void kvf_env_md_row(const char *item, const char *value, void *arg)
{
    FILE *f = arg;
    const char *s;

    fprintf(f, "| %s | ", item);
    for (s = value; *s != '\0'; s++) {
        if (*s == '|') {
            fputc('\\', f);
        }
        fputc(*s, f);
    }
    fputs(" |\n", f);
}

void kvf_env_markdown(FILE *f)
{
    kvf_env_rows(kvf_env_get(), kvf_env_md_row, f);
}

int kvf_env_record_write(kvf_record_t *rec, const char *dir)
{
    char *json = NULL, *md = NULL;
    size_t jlen = 0, mlen = 0;
    FILE *jf = open_memstream(&json, &jlen);
    FILE *mf = open_memstream(&md, &mlen);
    int rc = -1;

    if (jf != NULL && mf != NULL) {
        kvf_json_t j;

        kvf_json_begin(&j, jf);
        kvf_env_json(&j, NULL);
        kvf_env_markdown(mf);
    }
    if (jf != NULL) {
        fclose(jf);
    }
    if (mf != NULL) {
        fclose(mf);
    }
    if (json != NULL && md != NULL) {
        kvf_record_environment(rec, json, md);
        rc = kvf_record_write(rec, dir);
    }
    free(json);
    free(md);
    return rc;
}

static void kvf_env_text_row(const char *item, const char *value, void *arg)
{
    (void)arg;
    printf("%-16s %s\n", item, value);
}

/* The disk row: the device's O_DIRECT ceilings in dir (off: none). */
static void kvf_env_disk_row(const char *dir, uint64_t bytes, int json,
                             kvf_record_t *rec)
{
    kvf_env_disk_t d;
    char text[1024];

    if (dir == NULL || strcmp(dir, "off") == 0) {
        return;
    }
    kvf_env_disk_measure(dir, bytes, &d);
    kvf_env_disk_text(&d, text, sizeof(text));
    if (!json) {
        printf("%-16s %s\n", "disk", text);
    }
    if (rec != NULL) {
        kvf_record_config(rec, "disk", text);
        kvf_record_figure(rec, "disk O_DIRECT read", d.read_gbs, "GB/s", NAN,
                          NAN);
        kvf_record_figure(rec, "disk O_DIRECT write", d.write_gbs, "GB/s",
                          NAN, NAN);
    }
}

int kvf_cmd_bench_env(int argc, char **argv)
{
    const char *record = NULL, *hyp = NULL, *disk = "/var/tmp";
    uint64_t disk_size = 256ull << 20;
    const kvf_env_t *e;
    int json = 0, rc;
    const kvf_opt_t opts[] = {
        {"json", 0, KVF_OPT_FLAG, &json, NULL, "print the table as JSON"},
        {"disk", 0, KVF_OPT_STR, &disk, "DIR|off",
         "measure the O_DIRECT read and write ceilings of DIR's device\n"
         "(what a node's --disk tier there can reach)",
         "/var/tmp"},
        {"disk-size", 0, KVF_OPT_SIZE, &disk_size, "SIZE",
         "bytes of the file that measurement writes and reads", "256M"},
        {"record", 0, KVF_OPT_STR, &record, "DIR",
         "write a record (Markdown + JSON) into DIR"},
        {"hypothesis", 0, KVF_OPT_STR, &hyp, "TEXT", "the record's hypothesis"},
        {0},
    };
    const kvf_cmd_spec_t spec = {
        "kvferry bench env [options]",
        "Detects the environment table (CPU, NUMA, memory, kernel, GPUs,\n"
        "NICs, RDMA, kvferry build) from /proc, /sys and nvidia-smi, and\n"
        "measures a disk's O_DIRECT ceilings (--disk).",
        opts};

    rc = kvf_opts_parse(&spec, argc, argv, NULL);
    if (rc >= 0) {
        return rc;
    }
    rc = KVF_CLI_OK;
    e = kvf_env_get();
    if (json) {
        kvf_json_t j;

        kvf_json_begin(&j, stdout);
        kvf_env_json(&j, NULL);
    } else {
        printf("# kvferry bench env: detected, not typed\n");
        kvf_env_rows(e, kvf_env_text_row, NULL);
    }
    if (record == NULL) {
        kvf_env_disk_row(disk, disk_size, json, NULL);
    }
    fflush(stdout);
    if (record != NULL) {
        kvf_record_t *rec = kvf_record_new(
            "bench", "bench env",
            "the environment can be detected from /proc, /sys and "
            "nvidia-smi without typing anything");
        int ok = e->cpu_model[0] && e->logical > 0 && e->mem_total > 0 &&
                 e->kernel[0];

        if (rec == NULL) {
            return KVF_CLI_FAIL;
        }
        kvf_record_hypothesis(rec, hyp);
        kvf_record_config(rec, "sources",
                          "/proc/cpuinfo, /proc/meminfo, /sys/devices/"
                          "system, /sys/bus/pci, /sys/class/net, "
                          "/sys/class/infiniband, nvidia-smi");
        kvf_record_figure(rec, "logical CPUs", e->logical, "CPUs", NAN, NAN);
        kvf_record_figure(rec, "usable CPUs", e->usable, "CPUs", NAN, NAN);
        kvf_record_figure(rec, "NUMA nodes", e->nnuma, "nodes", NAN, NAN);
        kvf_record_figure(rec, "memory", (double)e->mem_total / 1e9, "GB", NAN,
                          NAN);
        kvf_record_figure(rec, "GPUs", e->ngpu, "GPUs", NAN, NAN);
        kvf_record_figure(rec, "NICs", e->nnic, "NICs", NAN, NAN);
        kvf_record_figure(rec, "RDMA devices", e->nrdma, "devices", NAN, NAN);
        kvf_env_disk_row(disk, disk_size, json, rec);
        kvf_record_conclude(rec, ok ? "holds" : "does not hold",
                            ok ? "CPU, cores, memory and kernel were "
                                 "detected; devices as listed"
                               : "some of CPU, cores, memory or kernel "
                                 "could not be read");
        kvf_record_not_verified(rec, "values are as the kernel and driver "
                                     "report them; a NIC's speed inside a "
                                     "VM or container is the virtual "
                                     "device's, not the physical link's");
        kvf_record_not_verified(rec, "the GPU PCIe generation is the "
                                     "current one; idle GPUs often train "
                                     "down, so compare with the maximum");
        if (kvf_env_record_write(rec, record) != 0) {
            rc = KVF_CLI_FAIL;
        }
        kvf_record_free(rec);
    }
    return rc;
}
