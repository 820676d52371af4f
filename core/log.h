/*
 * Logging: kvf_error/warn/info/debug/trace with a level set by
 * KVF_LOG_LEVEL (error, warn, info, debug, trace). Messages go to stderr,
 * one line each, prefixed with time, pid and level. kvf_log_rl() is the
 * rate-limited form for the data path and anything a peer can repeat.
 * Control characters in a message are written as '?', so no argument
 * can start a line of its own; kvf_log_key() escapes a key or any string
 * a peer supplied (\xNN) so it is logged readably and unambiguously.
 */
#ifndef KVF_CORE_LOG_H
#define KVF_CORE_LOG_H
#if !defined(KVF_INTERNAL) && !defined(KVF_TEST_INTERNALS)
#error "core/log.h is internal to kvferry: use <kvferry/*.h>"
#endif

#include <stdarg.h>
#include <stddef.h>

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
/* The level named ("warn", ...; any case), or -1. */
int kvf_log_level_parse(const char *name);
/* Lines go to the file at path (appended) from now on, unless they go to
 * a file already; NULL or "": stderr stays. */
void kvf_log_to_file(const char *path);
void kvf_log_emit(kvf_log_level_t level, const char *file, int line,
                  const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* As kvf_log_emit, the line ending "(N similar suppressed)" when n > 0. */
void kvf_log_emit_rl(kvf_log_level_t level, const char *file, int line,
                     unsigned n, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* 1 when a rate-limited call site may log now (once per second), with
 * *suppressed_p the calls it dropped since its last line. */
int kvf_log_rl_allow(unsigned *counter_p, long *window_p,
                     unsigned *suppressed_p);

/* Room for an escaped key in a message (longer ones end in "..."). */
#define KVF_LOG_KEY_MAX 160
/* Writes s into buf (cap bytes) with every byte outside printable ASCII,
 * and '\\' and '\'', as \xNN; returns buf. */
const char *kvf_log_key(char *buf, size_t cap, const char *s);
/* kvf_log_key into a buffer of the enclosing statement, for a log
 * argument: kvf_warn("get '%s' failed", KVF_LOG_KEY(key)). */
#define KVF_LOG_KEY(_s)                                                        \
    kvf_log_key((char[KVF_LOG_KEY_MAX]){0}, KVF_LOG_KEY_MAX, (_s))

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

/* At most one line per second from one call site; the next line says
 * how many were dropped in between. */
#define kvf_log_rl(_lvl, ...)                                                  \
    do {                                                                       \
        static unsigned _kvf_rl_n;                                             \
        static long _kvf_rl_w;                                                 \
        unsigned _kvf_rl_s;                                                    \
        if ((int)(_lvl) <= kvf_log_level_cur &&                                \
            kvf_log_rl_allow(&_kvf_rl_n, &_kvf_rl_w, &_kvf_rl_s)) {            \
            kvf_log_emit_rl(_lvl, __FILE__, __LINE__, _kvf_rl_s, __VA_ARGS__); \
        }                                                                      \
    } while (0)

#endif
