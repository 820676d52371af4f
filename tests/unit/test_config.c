/*
 * Unit test: size and duration parsing, the size format, the resolution
 * order default < file < environment, the key groups and public lookup,
 * and the warning for unknown KVF_* environment variables.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kvferry/config.h>
#include <kvferry/kvferry.h>

#include "core/config.h"
#include "store/proto/proto.h"
#include "transport/fault/fault.h"

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
    {"test_alpha", "11", "first", KVF_CONFIG_USER},
    {"test_beta", "22", "second", KVF_CONFIG_TUNING},
    {"test_gamma", "33", "third", KVF_CONFIG_DEBUG},
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
    unsetenv("KVF_TEST_GAMMA");
    unsetenv("KVF_CONFIG");
    unlink(path);
}

static void test_edit_distance(void **state)
{
    (void)state;
    assert_int_equal(kvf_edit_distance("", ""), 0);
    assert_int_equal(kvf_edit_distance("transports", "transports"), 0);
    assert_int_equal(kvf_edit_distance("transport", "transports"), 1);
    assert_int_equal(kvf_edit_distance("lease_read", "lease_reads"), 1);
    assert_int_equal(kvf_edit_distance("kitten", "sitting"), 3);
    assert_int_equal(kvf_edit_distance("abc", ""), 3);
}

static int key_count[4];
static int key_bad;

static void count_key(const kvf_config_key_t *k, void *arg)
{
    (void)arg;
    if (k->group < KVF_CONFIG_USER || k->group > KVF_CONFIG_DEBUG ||
        k->help == NULL || k->help[0] == '\0' || k->defval == NULL) {
        key_bad++;
        return;
    }
    key_count[k->group]++;
}

/* Every key of the library has a group, a help text and a default, and
 * the public lookup resolves a key by name alone. */
static void test_public_keys(void **state)
{
    (void)state;
    assert_non_null(kvf_version()); /* links the engine's table */
    assert_non_null(kvf_store_config.component);
    assert_non_null(kvf_fault_config.component);
    kvf_config_keys(count_key, NULL);
    assert_int_equal(key_bad, 0);
    assert_true(key_count[KVF_CONFIG_USER] >= 5);
    assert_true(key_count[KVF_CONFIG_USER] <= 21); /* few: docs/decisions */
    assert_true(key_count[KVF_CONFIG_TUNING] > 0);
    assert_true(key_count[KVF_CONFIG_DEBUG] > 0);
    assert_string_equal(kvf_config_get("transports"), "auto");
    setenv("KVF_TRANSPORTS", "tcp", 1);
    assert_string_equal(kvf_config_get("transports"), "tcp");
    unsetenv("KVF_TRANSPORTS");
    assert_string_equal(kvf_config_get("log_level"), "warn");
    assert_null(kvf_config_get("no_such_key"));
}

/* Runs `kvferry version` with env (one "NAME=value") and returns what it
 * wrote to stderr. */
static void run_cli_env(const char *env, char *err, size_t cap)
{
    char cmd[1024];
    const char *bin = getenv("KVF_BIN");
    FILE *p;
    size_t n;

    assert_non_null(bin);
    snprintf(cmd, sizeof(cmd), "env %s %s version 2>&1 >/dev/null", env, bin);
    p = popen(cmd, "r");
    assert_non_null(p);
    n = fread(err, 1, cap - 1, p);
    err[n] = '\0';
    pclose(p);
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;

    while ((hay = strstr(hay, needle)) != NULL) {
        n++;
        hay += strlen(needle);
    }
    return n;
}

/* An unknown KVF_ variable is named once, with the nearest key; known
 * keys and the harness's own variables are not. */
static void test_unknown_env(void **state)
{
    char err[4096];

    (void)state;
    run_cli_env("KVF_TRANSPORT=tcp", err, sizeof(err));
    assert_int_equal(count_of(err, "KVF_TRANSPORT is not a kvferry key"), 1);
    assert_non_null(strstr(err, "did you mean KVF_TRANSPORTS?"));
    run_cli_env("KVF_LEASE_READ=1 KVF_LOG_LEVEL=warn", err, sizeof(err));
    assert_non_null(strstr(err, "did you mean KVF_LEASE_READS?"));
    run_cli_env(
        "KVF_TRANSPORTS=tcp KVF_SHM_WARM_MS=0 KVF_BIN=x KVF_GPU_SUM=auto", err,
        sizeof(err));
    assert_null(strstr(err, "not a kvferry key"));
    run_cli_env("KVF_FOO=1 KVF_LOG_LEVEL=error", err, sizeof(err));
    assert_null(strstr(err, "KVF_FOO")); /* the level applies */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_ms),
        cmocka_unit_test(test_fmt),
        cmocka_unit_test(test_resolution),
        cmocka_unit_test(test_edit_distance),
        cmocka_unit_test(test_public_keys),
        cmocka_unit_test(test_unknown_env),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
