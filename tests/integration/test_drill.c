/*
 * Integration test of `kvferry drill`: a drill passes on a healthy
 * engine, and its checks can fail: with KVF_DRILL_SELFTEST=wrong the
 * traffic workers flip one byte of a read after the fault, which the
 * drill must report as wrong bytes (exit 1); with KVF_DRILL_SELFTEST=leak
 * they keep the old peer's connections open, which the resource check
 * must report. Also: the record is written as JSON and Markdown, unknown
 * drills are a usage error, `list` names every drill.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs `kvferry drill ARGS` with KVF_DRILL_SELFTEST=selftest (NULL =
 * unset); returns the exit status and the output in out. */
static int run_drill(const char *selftest, const char *const *args, char *out,
                     size_t outlen)
{
    const char *bin = getenv("KVF_BIN");
    const char *argv[16];
    size_t n = 0, got = 0;
    int fds[2], st;
    ssize_t r;
    pid_t pid;

    assert_non_null(bin);
    argv[n++] = bin;
    argv[n++] = "drill";
    while (*args != NULL && n < 15) {
        argv[n++] = *args++;
    }
    argv[n] = NULL;
    assert_int_equal(pipe(fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        if (selftest != NULL) {
            setenv("KVF_DRILL_SELFTEST", selftest, 1);
        } else {
            unsetenv("KVF_DRILL_SELFTEST");
        }
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    while ((r = read(fds[0], out + got, outlen - 1 - got)) > 0) {
        got += (size_t)r;
        if (got + 1 >= outlen) {
            /* keep the tail: the verdict lines come last */
            memmove(out, out + outlen / 2, got - outlen / 2);
            got -= outlen / 2;
        }
    }
    out[got] = '\0';
    close(fds[0]);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int count_files(const char *dir, const char *suffix)
{
    struct dirent *de;
    DIR *d = opendir(dir);
    size_t sl = strlen(suffix);
    int n = 0;

    if (d == NULL) {
        return 0;
    }
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);

        if (l > sl && strcmp(de->d_name + l - sl, suffix) == 0 &&
            strstr(de->d_name, ".data.") == NULL) {
            n++;
        }
    }
    closedir(d);
    return n;
}

static void test_list_and_usage(void **state)
{
    static char out[1 << 16];

    (void)state;
    assert_int_equal(
        run_drill(NULL, (const char *[]){"list", NULL}, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "target-kill"));
    assert_non_null(strstr(out, "partition"));
    assert_non_null(strstr(out, "corruption"));
    assert_int_equal(run_drill(NULL, (const char *[]){"no-such-drill", NULL},
                               out, sizeof(out)),
                     2);
}

static void test_passes_and_records(void **state)
{
    static char out[1 << 16];
    char dir[] = "/tmp/kvf-test-drill-XXXXXX";

    (void)state;
    assert_non_null(mkdtemp(dir));
    assert_int_equal(run_drill(NULL,
                               (const char *[]){"target-kill", "--phase", "400",
                                                "--record", dir, NULL},
                               out, sizeof(out)),
                     0);
    assert_non_null(strstr(out, "target-kill      PASS"));
    assert_int_equal(count_files(dir, ".json"), 1);
    assert_int_equal(count_files(dir, ".md"), 1);
}

static void test_wrong_bytes_are_caught(void **state)
{
    static char out[1 << 16];

    (void)state;
    assert_int_equal(
        run_drill("wrong",
                  (const char *[]){"engine-faults", "--phase", "400", NULL},
                  out, sizeof(out)),
        1);
    assert_non_null(strstr(out, "engine-faults    FAIL"));
    assert_non_null(strstr(out, "wrong bytes handed back"));
}

static void test_leaks_are_caught(void **state)
{
    static char out[1 << 16];

    (void)state;
    assert_int_equal(
        run_drill("leak",
                  (const char *[]){"engine-faults", "--phase", "400", NULL},
                  out, sizeof(out)),
        1);
    assert_non_null(strstr(out, "clients fds"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_and_usage),
        cmocka_unit_test(test_passes_and_records),
        cmocka_unit_test(test_wrong_bytes_are_caught),
        cmocka_unit_test(test_leaks_are_caught),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
