/*
 * The commands' monotonic clock (CLOCK_MONOTONIC): nanoseconds and
 * milliseconds for timing phases, and the time left until a deadline.
 */
#ifndef KVF_TOOLS_CLOCK_H
#define KVF_TOOLS_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t kvf_clock_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t kvf_clock_ms(void)
{
    return kvf_clock_ns() / 1000000ull;
}

/* Milliseconds left until deadline_ms (0 when passed), for poll(). */
static inline int kvf_clock_left_ms(uint64_t deadline_ms)
{
    uint64_t now = kvf_clock_ms();

    if (now >= deadline_ms) {
        return 0;
    }
    return (deadline_ms - now > 0x7fffffffull) ? 0x7fffffff
                                               : (int)(deadline_ms - now);
}

#endif
