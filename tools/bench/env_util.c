/*
 * Small helpers of the environment detection (env.c, env_dev.c): read a
 * small file, run a command with a deadline, list a directory sorted.
 */
#include "tools/bench/env.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/time.h"

extern char **environ;
/* Reads a small file into buf with the trailing newline removed.
 * Returns 0, or -1 when it cannot be read. */
int kvf_env_read(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n;

    buf[0] = '\0';
    if (fd < 0) {
        return -1;
    }
    n = read(fd, buf, len - 1);
    close(fd);
    if (n < 0) {
        buf[0] = '\0';
        return -1;
    }
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) {
        buf[--n] = '\0';
    }
    return 0;
}

long kvf_env_read_long(const char *path, long dflt)
{
    char buf[64], *end;
    long v;

    if (kvf_env_read(path, buf, sizeof(buf)) != 0 || buf[0] == '\0') {
        return dflt;
    }
    errno = 0;
    v = strtol(buf, &end, 0);
    return (errno != 0 || end == buf) ? dflt : v;
}

/* Runs argv (looked up in PATH) with stdout captured into out, stderr
 * discarded, killed after timeout_ms. Returns the exit status, or -1 if
 * it could not run or ran past the deadline. */
int kvf_env_run(char *const argv[], char *out, size_t len, int timeout_ms)
{
    posix_spawn_file_actions_t fa;
    uint64_t deadline = kvf_time_ns() + (uint64_t)timeout_ms * 1000000ull;
    size_t used = 0;
    int fds[2], st = 0, rc = -1, timed_out = 0;
    pid_t pid;

    out[0] = '\0';
    if (pipe2(fds, O_CLOEXEC) != 0) {
        return -1;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY,
                                     0);
    if (posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ) != 0) {
        posix_spawn_file_actions_destroy(&fa);
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    for (;;) {
        struct pollfd p = {.fd = fds[0], .events = POLLIN};
        uint64_t now = kvf_time_ns();
        char sink[4096];
        ssize_t n;

        if (now >= deadline) {
            timed_out = 1;
            break;
        }
        if (poll(&p, 1, (int)((deadline - now) / 1000000ull) + 1) <= 0) {
            continue; /* the deadline check above ends the loop */
        }
        if (used + 1 < len) {
            n = read(fds[0], out + used, len - 1 - used);
        } else {
            n = read(fds[0], sink, sizeof(sink)); /* drop the excess */
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            break;
        }
        if (used + 1 < len) {
            used += (size_t)n;
            out[used] = '\0';
        }
    }
    close(fds[0]);
    if (timed_out) {
        kill(pid, SIGKILL);
    }
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (!timed_out && WIFEXITED(st)) {
        rc = WEXITSTATUS(st);
    }
    return rc;
}

void kvf_env_copy(char *dst, size_t len, const char *src)
{
    size_t n = strlen(src);

    if (n >= len) {
        n = len - 1;
    }
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static int kvf_env_namecmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int kvf_env_dir(const char *dir, char **names, int max)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;

    if (d == NULL) {
        return 0;
    }
    while ((de = readdir(d)) != NULL && n < max) {
        if (de->d_name[0] != '.' && (names[n] = strdup(de->d_name))) {
            n++;
        }
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof(char *), kvf_env_namecmp);
    return n;
}

void kvf_env_dir_free(char **names, int n)
{
    while (n-- > 0) {
        free(names[n]);
    }
}
