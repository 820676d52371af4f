/*
 * Logging: kvf_error/warn/info/debug/trace with a level set by
 * KVF_LOG_LEVEL (error, warn, info, debug, trace). Messages go to stderr,
 * one line each, prefixed with time, pid and level. kvf_log_rl() is the
 * rate-limited form for the data path.
 */
#ifndef KVF_CORE_LOG_H
#define KVF_CORE_LOG_H

#include <stdarg.h>

typedef enum {
    KVF_LOG_ERROR = 0,
    KVF_LOG_WARN = 1,
    KVF_LOG_INFO = 2,
    KVF_LOG_DEBUG = 3,
    KVF_LOG_TRACE = 4
} kvf_log_level_t;

extern int kvf_log_level_cur;

void kvf_log_init(void);
void kvf_log_set_level(kvf_log_level_t level);
void kvf_log_emit(kvf_log_level_t level, const char *file, int line,
                  const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int kvf_log_rl_allow(unsigned *counter_p, long *window_p);

#define kvf_log(_lvl, ...)                                                     \
    do {                                                                       \
        if ((int)(_lvl) <= kvf_log_level_cur) {                                \
            kvf_log_emit(_lvl, __FILE__, __LINE__, __VA_ARGS__);               \
        }                                                                      \
    } while (0)

#define kvf_error(...) kvf_log(KVF_LOG_ERROR, __VA_ARGS__)
#define kvf_warn(...)  kvf_log(KVF_LOG_WARN, __VA_ARGS__)
#define kvf_info(...)  kvf_log(KVF_LOG_INFO, __VA_ARGS__)
#define kvf_debug(...) kvf_log(KVF_LOG_DEBUG, __VA_ARGS__)
#define kvf_trace(...) kvf_log(KVF_LOG_TRACE, __VA_ARGS__)

/* At most 10 messages per second from one call site. */
#define kvf_log_rl(_lvl, ...)                                                  \
    do {                                                                       \
        static unsigned _kvf_rl_n;                                             \
        static long _kvf_rl_w;                                                 \
        if ((int)(_lvl) <= kvf_log_level_cur &&                                \
            kvf_log_rl_allow(&_kvf_rl_n, &_kvf_rl_w)) {                        \
            kvf_log_emit(_lvl, __FILE__, __LINE__, __VA_ARGS__);               \
        }                                                                      \
    } while (0)

#endif
