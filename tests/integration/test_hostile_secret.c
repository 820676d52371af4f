/*
 * The automatic secret and the private files against another local
 * user (the test runs as root and plays the other user with chown to a
 * numeric uid):
 * - $HOME/.kvferry owned by another uid, writable by group or others, or
 *   a symbolic link: a target that would create or read the automatic
 *   secret refuses to start with a line naming the directory, and writes
 *   nothing (a file that a link in it points to is unchanged, no secret
 *   appears);
 * - $HOME/.kvferry/secret a symbolic link (to a good secret file):
 *   refused;
 * - a fresh $HOME: the directory is created 0700 and the secret 0600, 32
 *   bytes, and a second start uses the same secret;
 * - secret_file and resp_password_file owned by another uid, or symbolic
 *   links: refused with a line naming the file.
 * Skipped (77) when not run as root (chown needs it).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_store_harness.h"
#include "test_util.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define OTHER_UID 4242 /* another local user */

static const char *const g_target[] = {"target", "--listen", "127.0.0.1:0",
                                       "--pool", "1M",       NULL};

/* Runs `kvferry ARGS` with HOME=home, no secret file unless secret is
 * given, and the extra environment pair (name, value; may be NULL).
 * Returns 0 when it started (printed its line; then stopped), else its
 * exit status; stderr in err. */
static int run_in(const char *home, const char *const *args, const char *secret,
                  const char *name, const char *value, char *err, size_t cap)
{
    char errf[] = "/tmp/kvf-test-err-XXXXXX", line[512];
    char *argv[16];
    int out[2], fd, st, i = 0, rc = -1;
    struct pollfd pfd;
    ssize_t n;
    pid_t pid;

    fd = mkstemp(errf);
    assert_true(fd >= 0);
    close(fd);
    argv[i++] = (char *)kvs_bin();
    while (*args != NULL) {
        argv[i++] = (char *)*args++;
    }
    argv[i] = NULL;
    assert_int_equal(pipe(out), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        unsetenv("KVF_SECRET_FILE");
        if (secret != NULL) {
            setenv("KVF_SECRET_FILE", secret, 1);
        }
        if (name != NULL) {
            setenv(name, value, 1);
        }
        setenv("HOME", home, 1);
        setenv("KVF_LOG_LEVEL", "warn", 1);
        fd = open(errf, O_WRONLY | O_TRUNC);
        dup2(fd, STDERR_FILENO);
        dup2(out[1], STDOUT_FILENO);
        close(out[0]);
        close(out[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(out[1]);
    pfd = (struct pollfd){.fd = out[0], .events = POLLIN};
    n = poll(&pfd, 1, 5000) > 0 ? read(out[0], line, sizeof(line) - 1) : 0;
    if (n > 0) {
        kill(pid, SIGTERM);
        rc = 0;
    }
    close(out[0]);
    waitpid(pid, &st, 0);
    if (n <= 0) {
        rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    }
    fd = open(errf, O_RDONLY);
    n = fd >= 0 ? read(fd, err, cap - 1) : 0;
    err[n > 0 ? n : 0] = '\0';
    if (fd >= 0) {
        close(fd);
    }
    unlink(errf);
    return rc;
}

static void make_home(char *home, size_t len)
{
    snprintf(home, len, "/tmp/kvf-test-home-XXXXXX");
    assert_non_null(mkdtemp(home));
}

/* Writes a file of n bytes of c, mode 0600; returns its path in buf. */
static void make_file(char *buf, size_t len, const char *tmpl, size_t n, int c)
{
    char data[64];
    int fd;

    snprintf(buf, len, "%s", tmpl);
    fd = mkstemp(buf);
    assert_true(fd >= 0);
    memset(data, c, sizeof(data));
    assert_int_equal(write(fd, data, n), (ssize_t)n);
    close(fd);
    assert_int_equal(chmod(buf, 0600), 0);
}

/* The file at path still holds n bytes of c. */
static void unchanged(const char *path, size_t n, int c)
{
    char data[64] = {0}, want[64];
    int fd = open(path, O_RDONLY);

    assert_true(fd >= 0);
    assert_int_equal(read(fd, data, sizeof(data)), (ssize_t)n);
    close(fd);
    memset(want, c, n);
    assert_memory_equal(data, want, n);
}

static void rm_home(const char *home)
{
    char cmd[512];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", home);
    assert_int_equal(system(cmd), 0);
}

/* $HOME/.kvferry belongs to another user (who made it writable for
 * all and put links in it): refused, nothing written. */
static void test_foreign_dir(void **state)
{
    static char err[8192];
    char home[64], dir[128], victim[64], link[192];
    struct stat sb;
    int i;

    (void)state;
    make_home(home, sizeof(home));
    make_file(victim, sizeof(victim), "/tmp/kvf-test-victim-XXXXXX", 40, 'v');
    snprintf(dir, sizeof(dir), "%s/.kvferry", home);
    assert_int_equal(mkdir(dir, 0777), 0);
    assert_int_equal(chmod(dir, 0777), 0);
    /* links where a creator might write, for pids near ours */
    for (i = 0; i < 64; i++) {
        snprintf(link, sizeof(link), "%s/secret.%d.tmp", dir, getpid() + i);
        assert_int_equal(symlink(victim, link), 0);
    }
    assert_int_equal(chown(dir, OTHER_UID, OTHER_UID), 0);
    assert_true(run_in(home, g_target, NULL, NULL, NULL, err, sizeof(err)) !=
                0);
    print_message("foreign dir: %s", err);
    assert_non_null(strstr(err, ".kvferry: owner uid 4242"));
    unchanged(victim, 40, 'v');
    snprintf(link, sizeof(link), "%s/secret", dir);
    assert_int_equal(lstat(link, &sb), -1);
    /* ours, but writable by others: refused as well */
    assert_int_equal(chown(dir, getuid(), getgid()), 0);
    assert_true(run_in(home, g_target, NULL, NULL, NULL, err, sizeof(err)) !=
                0);
    assert_non_null(strstr(err, "mode 0777"));
    unchanged(victim, 40, 'v');
    assert_int_equal(lstat(link, &sb), -1);
    unlink(victim);
    rm_home(home);
}

/* $HOME/.kvferry a link to another directory, and $HOME/.kvferry/secret
 * a link to a good secret: both refused. */
static void test_links(void **state)
{
    static char err[8192];
    char home[64], dir[128], other[64], good[64], link[192];

    (void)state;
    make_home(home, sizeof(home));
    make_home(other, sizeof(other));
    assert_int_equal(chmod(other, 0700), 0);
    snprintf(dir, sizeof(dir), "%s/.kvferry", home);
    assert_int_equal(symlink(other, dir), 0);
    assert_true(run_in(home, g_target, NULL, NULL, NULL, err, sizeof(err)) !=
                0);
    print_message("linked dir: %s", err);
    assert_non_null(strstr(err, "symbolic link"));
    assert_int_equal(unlink(dir), 0);
    assert_int_equal(mkdir(dir, 0700), 0);
    make_file(good, sizeof(good), "/tmp/kvf-test-good-XXXXXX", 32, 's');
    snprintf(link, sizeof(link), "%s/secret", dir);
    assert_int_equal(symlink(good, link), 0);
    assert_true(run_in(home, g_target, NULL, NULL, NULL, err, sizeof(err)) !=
                0);
    print_message("linked secret: %s", err);
    assert_non_null(strstr(err, "symbolic link"));
    unlink(good);
    rm_home(other);
    rm_home(home);
}

/* A fresh $HOME: created safely, and used again by the next process. */
static void test_fresh_home(void **state)
{
    static char err[8192];
    char home[64], path[192];
    unsigned char a[64], b[64];
    struct stat sb;
    int fd;

    (void)state;
    make_home(home, sizeof(home));
    assert_int_equal(run_in(home, g_target, NULL, NULL, NULL, err, sizeof(err)),
                     0);
    snprintf(path, sizeof(path), "%s/.kvferry", home);
    assert_int_equal(lstat(path, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
    assert_int_equal(sb.st_mode & 07777, 0700);
    snprintf(path, sizeof(path), "%s/.kvferry/secret", home);
    assert_int_equal(lstat(path, &sb), 0);
    assert_true(S_ISREG(sb.st_mode));
    assert_int_equal(sb.st_mode & 07777, 0600);
    assert_int_equal(sb.st_size, 32);
    fd = open(path, O_RDONLY);
    assert_int_equal(read(fd, a, sizeof(a)), 32);
    close(fd);
    assert_int_equal(run_in(home, g_target, NULL, NULL, NULL, err, sizeof(err)),
                     0);
    fd = open(path, O_RDONLY);
    assert_int_equal(read(fd, b, sizeof(b)), 32);
    close(fd);
    assert_memory_equal(a, b, 32);
    rm_home(home);
}

/* secret_file and resp_password_file of another user, or links: each
 * refused with a line naming the file. */
static void test_foreign_files(void **state)
{
    static const char *const resp[] = {"resp",     "--listen",    "127.0.0.1:0",
                                       "--master", "127.0.0.1:1", NULL};
    const char *ok[] = {"resp",     "--listen", "127.0.0.1:0",
                        "--master", NULL,       NULL};
    static char err[8192], saved[256];
    char home[64], sec[64], pw[64], link[192];
    kvs_proc_t m;

    (void)state;
    snprintf(saved, sizeof(saved), "%s", getenv("KVF_SECRET_FILE"));
    make_home(home, sizeof(home));
    make_file(sec, sizeof(sec), "/tmp/kvf-test-sec-XXXXXX", 32, 'k');
    assert_int_equal(chown(sec, OTHER_UID, OTHER_UID), 0);
    assert_true(run_in(home, g_target, sec, NULL, NULL, err, sizeof(err)) != 0);
    assert_non_null(strstr(err, sec));
    assert_non_null(strstr(err, "owner uid 4242"));
    assert_int_equal(chown(sec, getuid(), getgid()), 0);
    snprintf(link, sizeof(link), "%s/link", home);
    assert_int_equal(symlink(sec, link), 0);
    assert_true(run_in(home, g_target, link, NULL, NULL, err, sizeof(err)) !=
                0);
    assert_non_null(strstr(err, "symbolic link"));
    /* the RESP door's password file */
    make_file(pw, sizeof(pw), "/tmp/kvf-test-pw-XXXXXX", 20, 'p');
    assert_int_equal(chown(pw, OTHER_UID, OTHER_UID), 0);
    assert_true(run_in(home, resp, sec, "KVF_RESP_PASSWORD_FILE", pw, err,
                       sizeof(err)) != 0);
    print_message("foreign password file: %s", err);
    assert_non_null(strstr(err, pw));
    assert_non_null(strstr(err, "owner uid 4242"));
    assert_int_equal(chown(pw, getuid(), getgid()), 0);
    assert_int_equal(unlink(link), 0);
    assert_int_equal(symlink(pw, link), 0);
    assert_true(run_in(home, resp, sec, "KVF_RESP_PASSWORD_FILE", link, err,
                       sizeof(err)) != 0);
    assert_non_null(strstr(err, "symbolic link"));
    /* the same files, ours and direct: the door starts (a master of
     * the same secret to reach) */
    setenv("KVF_SECRET_FILE", sec, 1);
    assert_int_equal(kvs_master(&m, 0, NULL), 0);
    setenv("KVF_SECRET_FILE", saved, 1);
    ok[4] = m.addr;
    assert_int_equal(
        run_in(home, ok, sec, "KVF_RESP_PASSWORD_FILE", pw, err, sizeof(err)),
        0);
    kvs_stop(&m, 0);
    unlink(sec);
    unlink(pw);
    rm_home(home);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_foreign_dir),
        cmocka_unit_test(test_links),
        cmocka_unit_test(test_fresh_home),
        cmocka_unit_test(test_foreign_files),
    };

    kvs_bin();
    if (geteuid() != 0) {
        fprintf(stderr, "not root: chown to another uid is not possible\n");
        return 77;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
