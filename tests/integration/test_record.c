/*
 * Records (seed 003 §5) and `kvferry bench env`: runs the real commands
 * ($KVF_BIN bench env / blocks / link / te / store --vs-redis with
 * --record into a fresh
 * directory) and validates every JSON record against docs/record.schema.json
 * with tests/integration/check_record.py (python3-jsonschema), which also
 * checks the Markdown twin's template headings and the raw data file. A
 * negative check proves the validation can fail: broken copies of a valid
 * record (a required field removed, a bad conclusion, ...) must be
 * rejected. In-process tests drive the record API directly: a drill record
 * with every drill field, counts that add up, a record without a
 * conclusion, two records of the same name in one second, and no tracked
 * allocation left behind.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <kvferry/kvferry.h>

#include "tools/record/record.h"

static char dir[64];
static const char *bin, *src;

/* Runs a shell command; returns its exit status (-1 if it died). */
static int run(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    int st;

    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    fprintf(stderr, "+ %s\n", cmd);
    st = system(cmd);
    if (st == -1 || !WIFEXITED(st)) {
        return -1;
    }
    return WEXITSTATUS(st);
}

static size_t count(const char *sub, const char *pattern)
{
    char pat[256];
    glob_t g;
    size_t n;

    snprintf(pat, sizeof(pat), "%s/%s/%s", dir, sub, pattern);
    if (glob(pat, 0, NULL, &g) != 0) {
        return 0;
    }
    n = g.gl_pathc;
    globfree(&g);
    return n;
}

/* Validates every record in dir/sub; skips the test when python3's
 * jsonschema is missing. */
static void validate(const char *sub)
{
    int rc = run("python3 '%s/tests/integration/check_record.py' "
                 "'%s/docs/record.schema.json' %s/%s/*.json",
                 src, src, dir, sub);

    if (rc == 77) {
        skip();
    }
    assert_int_equal(rc, 0);
}

/* The text of the first file (in name order, so the oldest record) matching
 * dir/sub/pattern: two writes of one record may straddle a second and
 * then both names match. */
static char *slurp(const char *sub, const char *pattern)
{
    char pat[256], *text;
    glob_t g;
    FILE *f;
    long n;

    snprintf(pat, sizeof(pat), "%s/%s/%s", dir, sub, pattern);
    assert_int_equal(glob(pat, 0, NULL, &g), 0);
    assert_true(g.gl_pathc >= 1);
    f = fopen(g.gl_pathv[0], "r");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    rewind(f);
    text = calloc(1, (size_t)n + 1);
    assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    globfree(&g);
    return text;
}

static void test_env_json(void **state)
{
    int rc;

    (void)state;
    assert_int_equal(run("'%s' bench env > %s/env.txt", bin, dir), 0);
    assert_int_equal(run("grep -q '^kvferry ' %s/env.txt && "
                         "grep -q '^cpu ' %s/env.txt && "
                         "grep -q '^memory ' %s/env.txt",
                         dir, dir, dir),
                     0);
    assert_int_equal(run("'%s' bench env --json > %s/env.json", bin, dir), 0);
    rc = run("python3 '%s/tests/integration/check_record.py' --env "
             "'%s/docs/record.schema.json' %s/env.json",
             src, src, dir);
    if (rc == 77) {
        skip();
    }
    assert_int_equal(rc, 0);
}

static void test_env_record(void **state)
{
    (void)state;
    assert_int_equal(run("'%s' bench env --record %s/env --hypothesis "
                         "'detected, not typed' > /dev/null",
                         bin, dir),
                     0);
    assert_int_equal(count("env", "*-bench-env.json"), 1);
    assert_int_equal(count("env", "*-bench-env.md"), 1);
    validate("env");
}

static void test_blocks_record(void **state)
{
    char *json;

    (void)state;
    assert_int_equal(run("'%s' bench blocks --pool 256M --sizes 1M,4M "
                         "--iters 2 --op both --verify --record %s/blocks "
                         "> /dev/null",
                         bin, dir),
                     0);
    assert_int_equal(count("blocks", "*-bench-blocks.json"), 1);
    assert_int_equal(count("blocks", "*-bench-blocks.md"), 1);
    assert_int_equal(count("blocks", "*-bench-blocks.data.json"), 1);
    validate("blocks");
    json = slurp("blocks", "*-bench-blocks.json");
    /* both ops, both sizes, verified, the link ceiling as the estimate */
    assert_non_null(strstr(json, "\"write 1.0 MB (batch latency ms)\""));
    assert_non_null(strstr(json, "\"read 4.0 MB (batch latency ms)\""));
    assert_non_null(strstr(json, "\"read 4.0 MB blocks failing verify\""));
    assert_non_null(strstr(json, "\"source\": \"bench link:"));
    assert_null(strstr(json, "bytes not verified"));
    free(json);
}

/* --vs tcp: the same batches through a second engine forced to tcp, the
 * ratio in the record, the comparison's hypothesis (>= 3x the other) */
static void test_blocks_vs_record(void **state)
{
    char *json;

    (void)state;
    assert_int_equal(run("'%s' bench blocks --pool 128M --sizes 2M "
                         "--iters 2 --op read --verify --vs tcp "
                         "--record %s/blocksvs > /dev/null",
                         bin, dir),
                     0);
    assert_int_equal(count("blocksvs", "*-bench-blocks.json"), 1);
    validate("blocksvs");
    json = slurp("blocksvs", "*-bench-blocks.json");
    assert_non_null(strstr(json, "\"read 2.0 MB ratio to tcp\""));
    assert_non_null(strstr(json, "at >= 3x tcp on the same host"));
    assert_non_null(strstr(json, "\"read 2.0 MB blocks failing verify\""));
    free(json);
    /* a transport the target cannot be reached over: a clear failure */
    assert_int_not_equal(run("'%s' bench blocks --pool 64M --sizes 1M "
                             "--iters 1 --vs nosuch > /dev/null 2>&1",
                             bin),
                         0);
}

static void test_link_record(void **state)
{
    (void)state;
    assert_int_equal(run("'%s' bench link --pool 64M --size 32M --iters 3 "
                         "--record %s/link > /dev/null",
                         bin, dir),
                     0);
    assert_int_equal(count("link", "*-bench-link.json"), 1);
    validate("link");
}

static void test_te_record(void **state)
{
    char *json;

    (void)state;
    assert_int_equal(run("'%s' bench te --pool 64M --block-sizes 16K,64K,1M "
                         "--batch 4 --threads 2 --duration 100ms "
                         "--min-batches 2 --rounds 3 --json %s/te-out.json "
                         "--record %s/te --hypothesis 'tiny curve' "
                         "> %s/te.txt 2> %s/te.err",
                         bin, dir, dir, dir, dir),
                     0);
    /* three rounds of three sizes, one median row per size */
    assert_int_equal(
        run("grep -c '^round [123]: ' %s/te.err | grep -q '^9$'", dir), 0);
    assert_int_equal(run("grep -q 'lat P99 ms' %s/te.txt && "
                         "grep -c '^ *[0-9.]* [KM]B ' %s/te.txt | "
                         "grep -q '^3$'",
                         dir, dir),
                     0);
    assert_int_equal(count("te", "*-bench-te-tcp-write.json"), 1);
    assert_int_equal(count("te", "*-bench-te-tcp-write.data.json"), 1);
    validate("te");
    json = slurp("te", "*-bench-te-tcp-write.json");
    assert_non_null(strstr(json, "\"hypothesis\": \"tiny curve\""));
    assert_non_null(strstr(json, "\"write GB/s over block size\""));
    assert_non_null(strstr(json, "\"x_label\": \"block bytes\""));
    assert_non_null(strstr(json, "\"rounds\""));
    free(json);
}

/* bench store against Redis (when installed): redis-benchmark's rows and
 * the per-call client's (bench_store_resp.c), each with operations and
 * no errors (its GETs check the bytes), the ratio lines, and a valid
 * record listing the store knobs and the per-call ratios. */
static void test_store_vs_redis_record(void **state)
{
    char *json;

    (void)state;
    if (run("command -v redis-server >/dev/null && "
            "command -v redis-benchmark >/dev/null") != 0) {
        skip();
    }
    assert_int_equal(run("KVF_TRANSPORTS=tcp '%s' bench store --sizes 64K "
                         "--clients 2 --hit-ratio 1 --pool 64M "
                         "--duration 300ms --vs-redis --record %s/store "
                         "> %s/store.txt 2> %s/store.err",
                         bin, dir, dir, dir),
                     0);
    /* system op size unit clients ops ops/s GB/s p50 p99 p999 errors cpu */
    assert_int_equal(run("awk '$1 == \"redis-thr\" && $7 > 0 && $12 == 0' "
                         "%s/store.txt | wc -l | grep -q '^2$'",
                         dir),
                     0);
    assert_int_equal(run("awk '$1 == \"redis\" && $7 > 0' %s/store.txt | "
                         "wc -l | grep -q '^2$'",
                         dir),
                     0);
    assert_int_equal(run("grep -q 'get / per-call Redis GET, 64.0 KB x 2 "
                         "clients' %s/store.txt && grep -q 'median of 1: "
                         "get vs redis GET' %s/store.txt",
                         dir, dir),
                     0);
    validate("store");
    json = slurp("store", "*-bench-store-*-tcp.json");
    assert_non_null(strstr(json, "\"store_lease_reads\""));
    assert_non_null(strstr(json, "\"store_node_conns\""));
    assert_non_null(strstr(json, "per-call Redis GET"));
    free(json);
}

/* The schema must reject broken records, or the checks above prove
 * nothing. */
static void test_broken_records_fail(void **state)
{
    int rc;

    (void)state;
    if (count("blocks", "*-bench-blocks.json") != 1) {
        assert_int_equal(run("'%s' bench blocks --pool 64M --sizes 1M "
                             "--iters 1 --record %s/blocks > /dev/null",
                             bin, dir),
                         0);
    }
    rc = run("python3 '%s/tests/integration/check_record.py' --negative "
             "'%s/docs/record.schema.json' %s/blocks/*-bench-blocks.json",
             src, src, dir);
    if (rc == 77) {
        skip();
    }
    assert_int_equal(rc, 0);
    /* and a record with its conclusion removed fails the plain check */
    assert_int_equal(run("mkdir -p %s/broken && for f in "
                         "%s/blocks/*-bench-blocks.json; do "
                         "grep -v '\"conclusion\":' \"$f\" > "
                         "%s/broken/x.json; done && cp %s/blocks/*.md "
                         "%s/broken/x.md",
                         dir, dir, dir, dir, dir),
                     0);
    assert_int_equal(run("python3 '%s/tests/integration/check_record.py' "
                         "'%s/docs/record.schema.json' %s/broken/x.json "
                         "2>/dev/null",
                         src, src, dir),
                     1);
}

/* Records take the environment as data: the one `bench env --json`
 * detects, with a Markdown row of its own. */
static void give_env(kvf_record_t *rec)
{
    char *json;

    assert_int_equal(run("'%s' bench env --json > %s/env-data.json", bin, dir),
                     0);
    json = slurp(".", "env-data.json");
    kvf_record_environment(rec, json, "| host | (test) |\n");
    free(json);
}

static void test_drill_api(void **state)
{
    long blocks0, bytes0, blocks1, bytes1;
    kvf_record_t *rec;
    char *json;

    (void)state;
    kvf_alloc_stats(&blocks0, &bytes0);
    rec = kvf_record_new("drill", "Drill: target | killed", "default");
    assert_non_null(rec);
    kvf_record_hypothesis(rec, "no wrong bytes; \"errors\" within timeout");
    kvf_record_config(rec, "clients", "4");
    kvf_record_config(rec, "pipe|key", "4 | 5"); /* escaped in tables */
    kvf_record_config_num(rec, "timeout_ms", 2000);
    kvf_record_config_num(rec, "timeout_ms", 3000); /* replaces */
    kvf_record_figure(rec, "recovery", 812.5, "ms", NAN, NAN);
    kvf_record_point(rec, "GB/s over time", "s", "GB/s", 0, 1.5);
    kvf_record_point(rec, "GB/s over time", "ignored", "ignored", 1, 0);
    kvf_record_estimate(rec, 3000, "ms", "the engine timeout");
    kvf_record_gap(rec, 812.5 / 3000, "recovered before the timeout");
    kvf_record_conclude(rec, "maybe", "not a conclusion: ignored");
    kvf_record_conclude(rec, "holds", "no wrong bytes, bounded waits");
    kvf_record_not_verified(rec, "a remote host");
    kvf_record_drill_text(rec, "expected", "errors, no wrong bytes");
    kvf_record_drill_text(rec, "injected", "SIGKILL of the target");
    kvf_record_drill_text(rec, "observed", "KVF_ERR_PEER_UNREACHABLE");
    kvf_record_drill_text(rec, "recovery", "restart, reopen");
    kvf_record_drill_num(rec, "wrong_bytes", 0);
    kvf_record_drill_num(rec, "max_wait_ms", 2990);
    kvf_record_drill_num(rec, "timeout_ms", 3000);
    kvf_record_drill_num(rec, "time_to_recover_ms", 812.5);
    kvf_record_drill_error(rec, "KVF_ERR_TIMEOUT", 2);
    kvf_record_drill_error(rec, "KVF_ERR_TIMEOUT", 1); /* adds up */
    kvf_record_drill_error(rec, "KVF_ERR_PEER_UNREACHABLE", 5);
    kvf_record_drill_resource(rec, "fds", 12, 12);
    kvf_record_drill_resource(rec, "alloc_bytes", 1024, 1024);
    kvf_record_raw(rec, "{\"samples\": [1, 2, 3]}\n");
    give_env(rec);
    assert_int_equal(kvf_record_write(rec, dir), 0);
    /* the same name in the same second gets its own files */
    assert_int_equal(kvf_record_write(rec, dir), 0);
    kvf_record_free(rec);
    kvf_alloc_stats(&blocks1, &bytes1);
    assert_int_equal(blocks1, blocks0);
    assert_int_equal(bytes1, bytes0);

    assert_int_equal(run("mkdir -p %s/drill && mv %s/*-drill-target-killed* "
                         "%s/drill/",
                         dir, dir, dir),
                     0);
    assert_int_equal(count("drill", "*-drill-target-killed*.md"), 2);
    assert_int_equal(count("drill", "*.data.json"), 2);
    validate("drill");
    json = slurp("drill", "*-drill-target-killed.json");
    assert_non_null(strstr(json, "\"kind\": \"drill\""));
    assert_non_null(strstr(json, "\"KVF_ERR_TIMEOUT\": 3"));
    assert_non_null(strstr(json, "\"time_to_recover_ms\": 812.5"));
    assert_non_null(strstr(json, "\"timeout_ms\": 3000"));
    assert_non_null(strstr(json, "\"conclusion\": \"holds\""));
    assert_non_null(strstr(json, "\"x_label\": \"s\""));
    assert_non_null(strstr(json, "\\\"errors\\\""));
    free(json);
    json = slurp("drill", "*-drill-target-killed.md");
    assert_non_null(strstr(json, "| KVF_ERR_TIMEOUT | 3 |"));
    assert_non_null(strstr(json, "# Drill: target | killed\n"));
    assert_non_null(strstr(json, "| pipe\\|key | 4 \\| 5 |"));
    free(json);
}

static void test_no_conclusion(void **state)
{
    kvf_record_t *rec = kvf_record_new("bench", "bench nothing", "");
    char *json;

    (void)state;
    assert_non_null(rec);
    /* no environment given: refused */
    assert_int_not_equal(kvf_record_write(rec, dir), 0);
    give_env(rec);
    assert_int_equal(kvf_record_write(rec, dir), 0);
    kvf_record_free(rec);
    assert_int_equal(run("mkdir -p %s/none && mv %s/*-bench-nothing* "
                         "%s/none/",
                         dir, dir, dir),
                     0);
    validate("none");
    json = slurp("none", "*-bench-nothing.json");
    assert_non_null(strstr(json, "\"conclusion\": \"holds under conditions\""));
    assert_non_null(strstr(json, "\"estimate\": null"));
    assert_non_null(strstr(json, "\"raw_data\": null"));
    free(json);
    /* an unwritable directory is an error, not a crash */
    rec = kvf_record_new("bench", "x", "");
    give_env(rec);
    assert_int_not_equal(kvf_record_write(rec, "/proc/kvf-no-such/dir"), 0);
    kvf_record_free(rec);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_json),
        cmocka_unit_test(test_env_record),
        cmocka_unit_test(test_blocks_record),
        cmocka_unit_test(test_blocks_vs_record),
        cmocka_unit_test(test_link_record),
        cmocka_unit_test(test_te_record),
        cmocka_unit_test(test_store_vs_redis_record),
        cmocka_unit_test(test_broken_records_fail),
        cmocka_unit_test(test_drill_api),
        cmocka_unit_test(test_no_conclusion),
    };
    int rc;

    bin = getenv("KVF_BIN");
    src = getenv("KVF_SRC");
    if (bin == NULL || src == NULL) {
        fprintf(stderr, "KVF_BIN and KVF_SRC must be set\n");
        return 77;
    }
    snprintf(dir, sizeof(dir), "/tmp/kvf-record-XXXXXX");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (rc == 0) {
        run("rm -rf '%s'", dir);
    } else {
        fprintf(stderr, "records kept in %s\n", dir);
    }
    return rc;
}
