/*
 * Integration test of the master's HTTP endpoint, with a real master
 * process on 127.0.0.1:
 * - 20 connections that are open but send nothing do not delay /status
 *   or /metrics from another client (each answered within a second);
 * - a client that sends half a request and stalls does not either;
 * - after the idle ones are closed, /status still answers, with the same
 *   body shape (starts with {"epoch":, ends with "node_list":[]}).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_store_harness.h"
#include "core/sock.h"
#include "core/time.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define IDLE 20

static void test_idle_connections(void **state)
{
    static char buf[65536];
    int idle[IDLE + 1], i, code;
    kvs_proc_t m;
    uint64_t t0, dt;

    (void)state;
    kvs_bin();
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    assert_int_equal(kvs_http(m.http, "/status", buf, sizeof(buf)), 200);
    for (i = 0; i < IDLE; i++) {
        idle[i] = kvs_plain_connect(m.http);
        assert_true(idle[i] >= 0);
    }
    idle[IDLE] = kvs_plain_connect(m.http); /* half a request, then nothing */
    assert_true(idle[IDLE] >= 0);
    assert_true(write(idle[IDLE], "GET /sta", 8) == 8);
    kvs_sleep_ms(100); /* all accepted and waiting */
    t0 = kvf_time_ms();
    code = kvs_http(m.http, "/status", buf, sizeof(buf));
    dt = kvf_time_ms() - t0;
    assert_int_equal(code, 200);
    assert_true(dt < 1000);
    assert_non_null(strstr(buf, "\"node_list\":[]"));
    t0 = kvf_time_ms();
    assert_int_equal(kvs_http(m.http, "/metrics", buf, sizeof(buf)), 200);
    assert_true(kvf_time_ms() - t0 < 1000);
    assert_non_null(strstr(buf, "kvferry_store_nodes 0"));
    for (i = 0; i <= IDLE; i++) {
        close(idle[i]);
    }
    assert_int_equal(kvs_http(m.http, "/status", buf, sizeof(buf)), 200);
    assert_true(strncmp(buf, "{\"epoch\":", 9) == 0);
    assert_int_equal(kvs_http(m.http, "/nope", buf, sizeof(buf)), 404);
    assert_string_equal(buf, "try /metrics or /status\n");
    kvs_stop(&m, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idle_connections),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
