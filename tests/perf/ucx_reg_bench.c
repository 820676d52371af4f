/*
 * How long UCX takes to map (register) a large host range for remote
 * access, what the ucx transport does on a region's first remote key
 * request: ucp_mem_map + ucp_rkey_pack, then ucp_mem_unmap, for an
 * untouched and a touched anonymous mapping. The transports come from
 * UCX_TLS as in the transport (context features RMA + WAKEUP).
 *
 *   cc -O2 tests/perf/ucx_reg_bench.c -o /tmp/ucx_reg $(pkg-config
 *   --cflags --libs ucx) && UCX_TLS=tcp,self /tmp/ucx_reg 8G
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucp/api/ucp.h>

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void map_once(ucp_context_h ctx, void *p, size_t len, const char *what)
{
    ucp_mem_map_params_t mp = {0};
    double t0, t1, t2, t3;
    void *rkey;
    size_t rlen;
    ucp_mem_h memh;
    ucs_status_t s;

    mp.field_mask =
        UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = p;
    mp.length = len;
    t0 = now_s();
    s = ucp_mem_map(ctx, &mp, &memh);
    t1 = now_s();
    if (s != UCS_OK) {
        printf("%s: ucp_mem_map failed: %s\n", what, ucs_status_string(s));
        return;
    }
    ucp_rkey_pack(ctx, memh, &rkey, &rlen);
    t2 = now_s();
    ucp_rkey_buffer_release(rkey);
    ucp_mem_unmap(ctx, memh);
    t3 = now_s();
    printf("%s: %.2f GiB map %.3f ms, rkey pack %.3f ms (%zu bytes), "
           "unmap %.3f ms\n",
           what, (double)len / (1 << 30), (t1 - t0) * 1e3, (t2 - t1) * 1e3,
           rlen, (t3 - t2) * 1e3);
}

int main(int argc, char **argv)
{
    size_t len = (argc > 1 ? strtoull(argv[1], NULL, 10) : 8) << 30;
    ucp_params_t p = {0};
    ucp_config_t *config;
    ucp_context_h ctx;
    void *mem;

    ucp_config_read(NULL, NULL, &config);
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    if (ucp_init(&p, config, &ctx) != UCS_OK) {
        return 1;
    }
    ucp_config_release(config);
    mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
               -1, 0);
    if (mem == MAP_FAILED) {
        return 1;
    }
    map_once(ctx, mem, len, "untouched");
    memset(mem, 1, len);
    map_once(ctx, mem, len, "touched");
    munmap(mem, len);
    ucp_cleanup(ctx);
    return 0;
}
