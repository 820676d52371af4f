/*
 * Monotonic time helpers: nanoseconds and milliseconds since an arbitrary
 * origin, deadlines, and the wall-clock date for records.
 */
#ifndef KVF_CORE_TIME_H
#define KVF_CORE_TIME_H
#if !defined(KVF_INTERNAL) && !defined(KVF_TEST_INTERNALS)
#error "core/time.h is internal to kvferry: use <kvferry/*.h>"
#endif

#include <stdint.h>
#include <time.h>

static inline uint64_t kvf_time_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t kvf_time_ms(void)
{
    return kvf_time_ns() / 1000000ull;
}

/* Milliseconds left until deadline_ms (0 when passed). */
static inline int kvf_time_left_ms(uint64_t deadline_ms)
{
    uint64_t now = kvf_time_ms();

    if (now >= deadline_ms) {
        return 0;
    }
    return (deadline_ms - now > 0x7fffffffull) ? 0x7fffffff
                                               : (int)(deadline_ms - now);
}

/* Absolute CLOCK_MONOTONIC timespec timeout_ms from now, for condvars. */
void kvf_time_abs_after(struct timespec *ts, int timeout_ms);

#include <pthread.h>
/* Initialises a condition variable that waits on CLOCK_MONOTONIC. */
int kvf_cond_init(pthread_cond_t *cond);

#endif
