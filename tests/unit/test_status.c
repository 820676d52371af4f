/*
 * Unit test: every status code has a distinct name and a description;
 * unknown codes are reported as such; codes sit in their ranges.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include <kvferry/kvferry.h>

static void test_known_codes(void **state)
{
    (void)state;
    assert_string_equal(kvf_status_name(KVF_OK), "KVF_OK");
    assert_string_equal(kvf_status_str(KVF_OK), "success");
    assert_string_equal(kvf_status_name(KVF_ERR_TIMEOUT), "KVF_ERR_TIMEOUT");
    assert_string_equal(kvf_status_str(KVF_ERR_OUT_OF_BOUNDS),
                        "address outside registered memory");
    assert_string_equal(kvf_status_str(KVF_ERR_CHECKSUM), "checksum mismatch");
}

static void test_unknown_code(void **state)
{
    (void)state;
    assert_string_equal(kvf_status_str((kvf_status_t)-99), "unknown status");
    assert_string_equal(kvf_status_name((kvf_status_t)12345),
                        "KVF_ERR_UNKNOWN");
}

static void test_names_distinct(void **state)
{
    const char *seen[256];
    int n = 0, code, i;

    (void)state;
    for (code = 1; code >= KVF_ERR_LAST; code--) {
        const char *name = kvf_status_name((kvf_status_t)code);

        if (strcmp(name, "KVF_ERR_UNKNOWN") == 0) {
            continue;
        }
        assert_true(strlen(kvf_status_str((kvf_status_t)code)) > 0);
        for (i = 0; i < n; i++) {
            assert_string_not_equal(seen[i], name);
        }
        seen[n++] = name;
    }
    assert_true(n >= 25);
    /* ranges: link -20..-39, peer -40..-59, data integrity -80..-99 */
    assert_true(KVF_ERR_CONN_RESET <= -20 && KVF_ERR_CONN_RESET > -40);
    assert_true(KVF_ERR_OUT_OF_BOUNDS <= -40 && KVF_ERR_OUT_OF_BOUNDS > -60);
    assert_true(KVF_ERR_CHECKSUM <= -80 && KVF_ERR_CHECKSUM > -100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_codes),
        cmocka_unit_test(test_unknown_code),
        cmocka_unit_test(test_names_distinct),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
