/*
 * Logging implementation: a level from the config key log_level
 * (KVF_LOG_LEVEL), stderr or the file of the key log_file, one
 * formatted line per message written with a single write(2) so lines from
 * several threads and processes do not interleave.
 */
#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

int kvf_log_level_cur = KVF_LOG_WARN;
/* where lines go: stderr, or the file of the key log_file */
static int kvf_log_fd = STDERR_FILENO;

static const char *kvf_log_names[] = {"error", "warn", "info", "debug",
                                      "trace"};

int kvf_log_level_parse(const char *name)
{
    int i;

    for (i = 0; name != NULL && i <= KVF_LOG_TRACE; i++) {
        if (strcasecmp(name, kvf_log_names[i]) == 0) {
            return i;
        }
    }
    return -1;
}

void kvf_log_to_file(const char *path)
{
    int fd;

    if (path != NULL && path[0] != '\0' && kvf_log_fd == STDERR_FILENO) {
        fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) {
            kvf_log_fd = fd;
        }
    }
}

void kvf_log_set_level(kvf_log_level_t level)
{
    kvf_log_level_cur = (int)level;
}

static void kvf_log_vemit(kvf_log_level_t level, const char *file, int line,
                          unsigned suppressed, const char *fmt, va_list ap)
{
    char buf[1024];
    struct timespec ts;
    const char *base = strrchr(file, '/');
    int saved_errno = errno;
    int n, m, i;

    clock_gettime(CLOCK_REALTIME, &ts);
    n = snprintf(buf, sizeof(buf), "[%ld.%06ld] %d %-5s %s:%d ",
                 (long)ts.tv_sec, ts.tv_nsec / 1000, (int)getpid(),
                 kvf_log_names[level], base ? base + 1 : file, line);
    if (n < 0 || (size_t)n >= sizeof(buf)) {
        n = 0;
    }
    errno = saved_errno;
    m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
    if (m < 0) {
        m = 0;
    }
    if ((size_t)(n + m) > sizeof(buf) - 2) {
        m = (int)sizeof(buf) - 2 - n;
    }
    for (i = n; i < n + m; i++) { /* one message, one line */
        if ((unsigned char)buf[i] < 0x20 || buf[i] == 0x7f) {
            buf[i] = '?';
        }
    }
    n += m;
    if (suppressed > 0 && (size_t)n < sizeof(buf) - 2) {
        m = snprintf(buf + n, sizeof(buf) - (size_t)n - 1,
                     " (%u similar suppressed)", suppressed);
        n += (m > 0) ? m : 0;
    }
    if ((size_t)n > sizeof(buf) - 2) {
        n = (int)sizeof(buf) - 2;
    }
    buf[n++] = '\n';
    if (write(kvf_log_fd, buf, (size_t)n) < 0) {
        /* nothing sensible to do */
    }
    errno = saved_errno;
}

void kvf_log_emit(kvf_log_level_t level, const char *file, int line,
                  const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    kvf_log_vemit(level, file, line, 0, fmt, ap);
    va_end(ap);
}

void kvf_log_emit_rl(kvf_log_level_t level, const char *file, int line,
                     unsigned n, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    kvf_log_vemit(level, file, line, n, fmt, ap);
    va_end(ap);
}

int kvf_log_rl_allow(unsigned *counter_p, long *window_p,
                     unsigned *suppressed_p)
{
    long now = (long)time(NULL);
    long w = __atomic_load_n(window_p, __ATOMIC_RELAXED);

    if (now != w &&
        __atomic_compare_exchange_n(window_p, &w, now, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED)) {
        /* the first call of a new second logs, with the count dropped */
        *suppressed_p = __atomic_exchange_n(counter_p, 0, __ATOMIC_RELAXED);
        return 1;
    }
    __atomic_add_fetch(counter_p, 1, __ATOMIC_RELAXED);
    return 0;
}

const char *kvf_log_key(char *buf, size_t cap, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    unsigned char c;

    if (cap < 8) {
        if (cap > 0) {
            buf[0] = '\0';
        }
        return buf;
    }
    for (; s != NULL && *s != '\0'; s++) {
        c = (unsigned char)*s;
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
            if (o + 1 >= cap - 3) {
                break;
            }
            buf[o++] = (char)c;
            continue;
        }
        if (o + 4 >= cap - 3) {
            break;
        }
        buf[o++] = '\\';
        buf[o++] = 'x';
        buf[o++] = hex[c >> 4];
        buf[o++] = hex[c & 15];
    }
    if (s != NULL && *s != '\0' && cap >= 4) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o < cap ? o : cap - 1] = '\0';
    return buf;
}
