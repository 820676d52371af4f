/*
 * Logging implementation: a level from the config key log_level
 * (KVF_LOG_LEVEL), stderr or the file of the key log_file, one
 * formatted line per message written with a single write(2) so lines from
 * several threads and processes do not interleave.
 */
#include "core/log.h"
#include "core/config.h"

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

void kvf_log_init(void)
{
    const char *v = kvf_config_override(&kvf_core_config, "log_level");
    const char *file = kvf_config_override(&kvf_core_config, "log_file");
    int i, fd;

    if (file != NULL && file[0] != '\0' && kvf_log_fd == STDERR_FILENO) {
        fd = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) {
            kvf_log_fd = fd;
        }
    }

    if (v == NULL) {
        return;
    }
    for (i = 0; i <= KVF_LOG_TRACE; i++) {
        if (strcasecmp(v, kvf_log_names[i]) == 0) {
            kvf_log_level_cur = i;
            return;
        }
    }
}

void kvf_log_set_level(kvf_log_level_t level)
{
    kvf_log_level_cur = (int)level;
}

void kvf_log_emit(kvf_log_level_t level, const char *file, int line,
                  const char *fmt, ...)
{
    char buf[1024];
    struct timespec ts;
    const char *base = strrchr(file, '/');
    int saved_errno = errno;
    va_list ap;
    int n, m;

    clock_gettime(CLOCK_REALTIME, &ts);
    n = snprintf(buf, sizeof(buf), "[%ld.%06ld] %d %-5s %s:%d ",
                 (long)ts.tv_sec, ts.tv_nsec / 1000, (int)getpid(),
                 kvf_log_names[level], base ? base + 1 : file, line);
    if (n < 0 || (size_t)n >= sizeof(buf)) {
        n = 0;
    }
    va_start(ap, fmt);
    errno = saved_errno;
    m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0) {
        m = 0;
    }
    n += m;
    if ((size_t)n > sizeof(buf) - 2) {
        n = (int)sizeof(buf) - 2;
    }
    buf[n++] = '\n';
    if (write(kvf_log_fd, buf, (size_t)n) < 0) {
        /* nothing sensible to do */
    }
    errno = saved_errno;
}

int kvf_log_rl_allow(unsigned *counter_p, long *window_p)
{
    long now = (long)time(NULL);

    if (now != __atomic_load_n(window_p, __ATOMIC_RELAXED)) {
        __atomic_store_n(window_p, now, __ATOMIC_RELAXED);
        __atomic_store_n(counter_p, 0, __ATOMIC_RELAXED);
    }
    return __atomic_fetch_add(counter_p, 1, __ATOMIC_RELAXED) < 10;
}
