/*
 * GPU test (label gpu): the store with GPU buffers. A master and two
 * nodes run as processes on 127.0.0.1; a client registers GPU memory
 * and puts values from it and gets them into other GPU memory
 * (KVF_STORE_DEVICE_MEM: the node computes the checksums), over the
 * default transport choice and with transports forced to tcp, odd sizes
 * and unaligned offsets included, two replicas; every value read back
 * to the host and compared byte for byte with what was put, and the
 * checksum the master holds compared with the host's; a GPU buffer too
 * small for a value is refused. Exits 77 without a GPU.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "../integration/test_store_harness.h"
#include "core/checksum.h"
#include "core/rng.h"
#include "mem/cuda/cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPU_BUF (4u << 20)

static void run_store(const char *transports)
{
    static const size_t sizes[] = {4096, 65536 + 7, 1u << 20, 3000001};
    kvf_store_params_t p = {0};
    unsigned char *host, *back;
    kvs_proc_t m, n1, n2;
    kvf_region_h reg;
    kvf_store_h st;
    void *gpu = NULL;
    kvf_store_info_t info;
    kvf_store_put_opts_t po = {.replicas = 2, .flags = KVF_STORE_DEVICE_MEM};
    char key[64];
    size_t got, i;
    kvf_rng_t rng;

    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_node(&n1, m.addr, "64M", NULL), 0);
    assert_int_equal(kvs_node(&n2, m.addr, "64M", NULL), 0);
    p.field_mask = KVF_STORE_PARAM_MASTER | KVF_STORE_PARAM_TIMEOUT |
                   (transports ? KVF_STORE_PARAM_TRANSPORTS : 0);
    p.master = m.addr;
    p.timeout_ms = 10000;
    p.transports = transports;
    assert_int_equal(kvf_store_connect(&p, &st), KVF_OK);
    assert_int_equal(kvf_mem_alloc(GPU_BUF, KVF_MEM_CUDA, 0, &gpu), KVF_OK);
    assert_int_equal(kvf_engine_reg(kvf_store_engine(st), gpu, GPU_BUF,
                                    KVF_MEM_CUDA, 0, &reg),
                     KVF_OK);
    host = malloc(GPU_BUF);
    back = malloc(GPU_BUF);
    assert_non_null(host);
    assert_non_null(back);
    kvf_rng_seed(&rng, 99);
    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t len = sizes[i], off = (i * 13) % 64; /* unaligned in GPU */
        unsigned char *g = (unsigned char *)gpu + off;

        kvf_rng_fill(&rng, host, len);
        assert_int_equal(kvf_cuda_memcpy(g, host, len), KVF_OK);
        snprintf(key, sizeof(key), "gpu/%s/%zu",
                 transports ? transports : "auto", i);
        assert_int_equal(kvf_store_put(st, key, g, len, &po), KVF_OK);
        assert_int_equal(kvf_store_query(st, key, &info), KVF_OK);
        assert_int_equal(info.size, len);
        assert_int_equal(info.replicas, 2);
        assert_true(info.checksum == kvf_checksum(host, len));
        /* into another place of GPU memory, then back to the host */
        assert_int_equal(kvf_cuda_memset(gpu, 0, GPU_BUF), KVF_OK);
        got = 0;
        assert_int_equal(kvf_store_get(st, key, (unsigned char *)gpu + 64 + off,
                                       GPU_BUF - 64 - off, &got,
                                       KVF_STORE_DEVICE_MEM),
                         KVF_OK);
        assert_int_equal(got, len);
        assert_int_equal(
            kvf_cuda_memcpy(back, (unsigned char *)gpu + 64 + off, len),
            KVF_OK);
        assert_memory_equal(back, host, len);
    }
    /* a get too small for the value says so */
    assert_int_equal(
        kvf_store_get(st, key, gpu, 16, &got, KVF_STORE_DEVICE_MEM),
        KVF_ERR_NO_RESOURCE);
    assert_int_equal(kvf_engine_dereg(kvf_store_engine(st), reg), KVF_OK);
    kvf_mem_free(gpu);
    free(host);
    free(back);
    kvf_store_disconnect(st);
    kvs_stop(&n1, 0);
    kvs_stop(&n2, 0);
    kvs_stop(&m, 0);
}

static void test_gpu_store_default(void **state)
{
    (void)state;
    run_store(NULL);
}

static void test_gpu_store_tcp(void **state)
{
    (void)state;
    run_store("tcp");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_store_default),
        cmocka_unit_test(test_gpu_store_tcp),
    };

    kvs_bin();
    if (kvf_cuda_device_count() == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
