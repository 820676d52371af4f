/*
 * Unit test (label unit): one build runs without a GPU. On a machine
 * without one (or a build without CUDA) every GPU feature answers
 * KVF_ERR_UNAVAILABLE: allocation, registration of GPU or pinned
 * regions, copy contexts, IPC; socket I/O falls through to the plain
 * calls; every call of the public GPU API (kvferry/gpu.h) answers
 * KVF_ERR_UNAVAILABLE and crashes on no argument; the GPU benches exit
 * with the skip code. With a GPU present it
 * checks the opposite: the device is described and usable. No leaks.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kvferry/gpu.h>
#include <kvferry/kvferry.h>

#include "core/time.h"
#include "mem/cuda/cuda.h"

static void test_unavailable(void **state)
{
    unsigned char handle[KVF_CUDA_IPC_HANDLE];
    kvf_engine_params_t p = {0};
    kvf_cuda_dev_info_t info;
    kvf_cuda_copy_t *cp = NULL;
    long b0, y0, b1, y1;
    static char buf[8192];
    kvf_region_h r;
    kvf_engine_h e;
    uint64_t off;
    void *ptr = NULL;

    (void)state;
    if (kvf_cuda_device_count() > 0) {
        assert_int_equal(kvf_cuda_device_info(0, &info), KVF_OK);
        assert_true(info.sm_count > 0);
        assert_true(info.mem_bytes > 0);
        skip();
    }
    kvf_alloc_stats(&b0, &y0);
    assert_int_equal(kvf_cuda_device_info(0, &info), KVF_ERR_UNAVAILABLE);
    assert_int_equal(kvf_cuda_mem_alloc(KVF_MEM_CUDA, 0, 4096, &ptr),
                     KVF_ERR_UNAVAILABLE);
    assert_int_equal(kvf_cuda_mem_alloc(KVF_MEM_PINNED, 0, 4096, &ptr),
                     KVF_ERR_UNAVAILABLE);
    assert_null(ptr);
    assert_int_equal(kvf_cuda_copy_create(0, &cp), KVF_ERR_UNAVAILABLE);
    assert_int_equal(kvf_mem_alloc(4096, KVF_MEM_PINNED, 0, &ptr),
                     KVF_ERR_UNAVAILABLE);
    assert_int_equal(kvf_mem_alloc(4096, KVF_MEM_CUDA, 0, &ptr),
                     KVF_ERR_UNAVAILABLE);
    assert_int_equal(kvf_cuda_mem_track_release(buf, KVF_MEM_CUDA),
                     KVF_ERR_NOT_FOUND);
    assert_int_equal(
        kvf_cuda_ipc_export((uint64_t)(uintptr_t)buf, handle, &off),
        KVF_ERR_UNAVAILABLE);
    assert_int_equal(
        kvf_cuda_region_lookup((uint64_t)(uintptr_t)buf, NULL, NULL),
        KVF_MEM_HOST);
    p.field_mask = KVF_ENGINE_PARAM_NO_LISTEN;
    p.no_listen = 1;
    assert_int_equal(kvf_engine_create(&p, &e), KVF_OK);
    assert_int_equal(kvf_engine_reg(e, buf, sizeof(buf), KVF_MEM_CUDA, 0, &r),
                     KVF_ERR_UNAVAILABLE);
    assert_int_equal(kvf_engine_reg(e, buf, sizeof(buf), KVF_MEM_PINNED, 0, &r),
                     KVF_ERR_UNAVAILABLE);
    /* host memory still registers */
    assert_int_equal(kvf_engine_reg(e, buf, sizeof(buf), KVF_MEM_HOST, 0, &r),
                     KVF_OK);
    assert_int_equal(kvf_engine_dereg(e, r), KVF_OK);
    kvf_engine_destroy(e);
    kvf_alloc_stats(&b1, &y1);
    assert_int_equal(b1, b0);
    assert_int_equal(y1, y0);
}

/* Every public GPU call answers KVF_ERR_UNAVAILABLE (or the neutral
 * value) without a GPU, whatever its arguments, NULL included. */
static void test_api_unavailable(void **state)
{
    kvf_gpu_mem_t m = {NULL, 4096, KVF_MEM_CUDA, 0};
    kvf_gpu_block_t b = {0, 0, 64};
    kvf_gpu_copier_stats_t cs;
    kvf_gpu_copier_t *c = (kvf_gpu_copier_t *)&m;
    static char buf[4096];
    uint64_t off = 0, len = 64, sum = 1, tk = 0;
    kvf_gpu_info_t info;
    void *ptr = buf;
    long b0, y0, b1, y1;

    (void)state;
    if (kvf_gpu_count() > 0) {
        assert_int_equal(kvf_gpu_info(0, &info), KVF_OK);
        skip();
    }
    kvf_alloc_stats(&b0, &y0);
    assert_int_equal(kvf_gpu_count(), 0);
    assert_int_equal(kvf_gpu_info(0, &info), KVF_ERR_UNAVAILABLE);
    assert_int_equal(kvf_gpu_info(0, NULL), KVF_ERR_UNAVAILABLE);
    assert_int_equal(kvf_gpu_alloc(KVF_MEM_CUDA, 0, 4096, &ptr),
                     KVF_ERR_UNAVAILABLE);
    assert_null(ptr);
    assert_int_equal(kvf_gpu_alloc(KVF_MEM_PINNED, 0, 4096, NULL),
                     KVF_ERR_UNAVAILABLE);
    kvf_gpu_free(KVF_MEM_CUDA, buf);
    kvf_gpu_free(KVF_MEM_PINNED, NULL);
    assert_int_equal(kvf_gpu_host_register(buf, sizeof(buf)),
                     KVF_ERR_UNAVAILABLE);
    kvf_gpu_host_unregister(buf);
    assert_int_equal(kvf_gpu_copy(buf, buf + 64, 64), KVF_ERR_UNAVAILABLE);
    assert_int_equal(kvf_gpu_copy(NULL, NULL, 64), KVF_ERR_UNAVAILABLE);
    assert_int_equal(kvf_gpu_checksum(buf, 64, &sum), KVF_ERR_UNAVAILABLE);
    assert_int_equal(kvf_gpu_checksum(NULL, 64, NULL), KVF_ERR_UNAVAILABLE);
    assert_int_equal(kvf_gpu_copier_create(0, &c), KVF_ERR_UNAVAILABLE);
    assert_null(c);
    assert_int_equal(kvf_gpu_copier_create(0, NULL), KVF_ERR_UNAVAILABLE);
    kvf_gpu_copier_destroy(NULL);
    kvf_gpu_copier_set_kernel(NULL, KVF_GPU_KERNEL_WARP);
    kvf_gpu_copier_park(NULL);
    assert_int_equal(kvf_gpu_copier_device(NULL), -1);
    memset(&cs, 0xff, sizeof(cs));
    kvf_gpu_copier_stats(NULL, &cs);
    assert_true(cs.resident_batches == 0 && cs.fallbacks == 0);
    kvf_gpu_copier_stats(NULL, NULL);
    /* a pointer that is no copier is never touched without a GPU */
    c = (kvf_gpu_copier_t *)&m;
    assert_int_equal(kvf_gpu_copy_blocks(c, &m, &m, &b, 1, 0, 100),
                     KVF_ERR_UNAVAILABLE);
    assert_int_equal(
        kvf_gpu_copy_blocks(NULL, NULL, NULL, NULL, 5, KVF_GPU_VERIFY, 100),
        KVF_ERR_UNAVAILABLE);
    assert_int_equal(kvf_gpu_checksum_blocks(c, &m, &off, &len, 1, &sum, 100),
                     KVF_ERR_UNAVAILABLE);
    assert_int_equal(
        kvf_gpu_checksum_blocks(NULL, NULL, NULL, NULL, 1, NULL, 100),
        KVF_ERR_UNAVAILABLE);
    assert_int_equal(
        kvf_gpu_copy_blocks_sum(c, &m, &m, &b, 1, 0, NULL, &sum, 100),
        KVF_ERR_UNAVAILABLE);
    assert_int_equal(
        kvf_gpu_copy_blocks_sum(NULL, NULL, NULL, NULL, 3, 0, NULL, NULL, 100),
        KVF_ERR_UNAVAILABLE);
    assert_int_equal(kvf_gpu_copy_post(c, &m, &m, &b, 1, &tk),
                     KVF_ERR_UNAVAILABLE);
    assert_int_equal(kvf_gpu_copy_wait(c, 0, 100), KVF_ERR_UNAVAILABLE);
    /* names need no GPU */
    assert_string_equal(kvf_gpu_kernel_name(KVF_GPU_KERNEL_WARP), "warp");
    assert_int_equal(kvf_gpu_kernel_parse("bulk"), KVF_GPU_KERNEL_BULK);
    assert_int_equal(kvf_gpu_kernel_parse("nope"), -1);
    assert_non_null(kvf_gpu_resident_name());
    kvf_alloc_stats(&b1, &y1);
    assert_int_equal(b1, b0);
    assert_int_equal(y1, y0);
}

/* Socket I/O through the staging entry points is plain socket I/O. */
static void test_socket_passthrough(void **state)
{
    kvf_cuda_stage_t *stage = NULL;
    char out[3000], in[3000];
    struct iovec iov[2];
    int sv[2];

    (void)state;
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    memset(out, 'x', sizeof(out));
    out[17] = 'y';
    iov[0].iov_base = out;
    iov[0].iov_len = 1000;
    iov[1].iov_base = out + 1000;
    iov[1].iov_len = 2000;
    assert_int_equal(
        kvf_cuda_writev(&stage, sv[0], iov, 2, kvf_time_ms() + 2000), KVF_OK);
    iov[0].iov_base = in;
    iov[0].iov_len = 3000;
    assert_int_equal(
        kvf_cuda_readv(&stage, sv[1], iov, 1, kvf_time_ms() + 2000), KVF_OK);
    assert_memory_equal(in, out, sizeof(out));
    assert_null(stage);
    close(sv[0]);
    close(sv[1]);
}

/* The GPU benches exit 77 (skip) without a GPU. */
static void test_bench_skips(void **state)
{
    const char *bin = getenv("KVF_BIN");
    char cmd[1024];
    int rc;

    (void)state;
    if (bin == NULL || kvf_cuda_device_count() > 0) {
        skip();
    }
    snprintf(cmd, sizeof(cmd), "%s bench h2d --size 1M >/dev/null", bin);
    rc = system(cmd);
    assert_true(WIFEXITED(rc));
    assert_int_equal(WEXITSTATUS(rc), 77);
    snprintf(cmd, sizeof(cmd),
             "%s bench blocks --device gpu --path h2d --pool 1M "
             "--sizes 64K >/dev/null",
             bin);
    rc = system(cmd);
    assert_true(WIFEXITED(rc));
    assert_int_equal(WEXITSTATUS(rc), 77);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unavailable),
        cmocka_unit_test(test_api_unavailable),
        cmocka_unit_test(test_socket_passthrough),
        cmocka_unit_test(test_bench_skips),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
