/*
 * Unit test: size and duration parsing, seed 000's size format, and the
 * resolution order default < file < environment.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/config.h"

static void test_sizes(void **state)
{
    uint64_t v;

    (void)state;
    assert_int_equal(kvf_parse_size("4096", &v), KVF_OK);
    assert_true(v == 4096);
    assert_int_equal(kvf_parse_size("8K", &v), KVF_OK);
    assert_true(v == 8192);
    assert_int_equal(kvf_parse_size("8KiB", &v), KVF_OK);
    assert_true(v == 8192);
    assert_int_equal(kvf_parse_size("16MB", &v), KVF_OK);
    assert_true(v == (16ull << 20));
    assert_int_equal(kvf_parse_size("8G", &v), KVF_OK);
    assert_true(v == (8ull << 30));
    assert_int_equal(kvf_parse_size("1.5G", &v), KVF_OK);
    assert_true(v == (3ull << 29));
    assert_int_equal(kvf_parse_size("", &v), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_parse_size("8X", &v), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_parse_size("-1", &v), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_parse_size("G", &v), KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_parse_size("8Gx", &v), KVF_ERR_INVALID_PARAM);
}

static void test_ms(void **state)
{
    uint64_t v;

    (void)state;
    assert_int_equal(kvf_parse_ms("250", &v), KVF_OK);
    assert_true(v == 250);
    assert_int_equal(kvf_parse_ms("3s", &v), KVF_OK);
    assert_true(v == 3000);
    assert_int_equal(kvf_parse_ms("500ms", &v), KVF_OK);
    assert_true(v == 500);
    assert_int_equal(kvf_parse_ms("2m", &v), KVF_OK);
    assert_true(v == 120000);
    assert_int_equal(kvf_parse_ms("3h", &v), KVF_ERR_INVALID_PARAM);
}

static void test_fmt(void **state)
{
    char s[32];

    (void)state;
    kvf_fmt_size(8192, s, sizeof(s));
    assert_string_equal(s, "8.0 KB");
    kvf_fmt_size(16ull << 20, s, sizeof(s));
    assert_string_equal(s, "16.0 MB");
    kvf_fmt_size(1ull << 30, s, sizeof(s));
    assert_string_equal(s, "1.0 GB");
    kvf_fmt_size(8ull << 30, s, sizeof(s));
    assert_string_equal(s, "8.0 GB");
}

static const kvf_config_entry_t entries[] = {
    {"test_alpha", "11", "first"},
    {"test_beta", "22", "second"},
    {"test_gamma", "33", "third"},
};
static const kvf_config_table_t table = {"test", entries, 3};

static void test_resolution(void **state)
{
    char path[] = "/tmp/kvf-config-XXXXXX";
    uint64_t v;
    FILE *f;
    int fd;

    (void)state;
    fd = mkstemp(path);
    assert_true(fd >= 0);
    f = fdopen(fd, "w");
    fprintf(f, "# comment\ntest_beta = 200\ntest_gamma = 300\n"
               "test_unknown = 5\n");
    fclose(f);
    setenv("KVF_CONFIG", path, 1);
    setenv("KVF_TEST_GAMMA", "3000", 1);
    assert_int_equal(kvf_config_u64(&table, "test_alpha", &v), KVF_OK);
    assert_true(v == 11); /* default */
    assert_int_equal(kvf_config_u64(&table, "test_beta", &v), KVF_OK);
    assert_true(v == 200); /* file */
    assert_int_equal(kvf_config_u64(&table, "test_gamma", &v), KVF_OK);
    assert_true(v == 3000); /* environment beats file */
    assert_int_equal(kvf_config_u64(&table, "test_nope", &v),
                     KVF_ERR_INVALID_PARAM);
    /* a key no registered table knows is reported */
    assert_int_equal(kvf_config_check_file(), 1);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_ms),
        cmocka_unit_test(test_fmt),
        cmocka_unit_test(test_resolution),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
