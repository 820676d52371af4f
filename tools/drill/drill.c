/*
 * The conductor's messages and verdict of a fault drill: log lines with
 * the time since the drill began, failures and skips with their reason
 * (kept for the record), and the stated expectation and injected fault.
 * Drills call these; they call nothing back.
 */
#include "tools/drill/drill.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/time.h"

/* --- conductor messages and verdict --------------------------------------- */

/* Appends a reason to d->why and logs it. */
static void kvf_drill_vappend(kvf_drill_t *d, const char *tag, const char *fmt,
                              va_list ap)
{
    size_t n = strlen(d->why);
    char msg[768];

    vsnprintf(msg, sizeof(msg), fmt, ap);
    snprintf(d->why + n, sizeof(d->why) - n, "%s%s", n > 0 ? "; " : "", msg);
    if (tag != NULL) {
        kvf_drill_log(d, "%s: %s", tag, msg);
    }
}

void kvf_drill_log(kvf_drill_t *d, const char *fmt, ...)
{
    va_list ap;

    /* the drill's phases are its progress lines */
    if (kvf_progress_quiet) {
        return;
    }
    kvf_progress_clear(NULL);
    fprintf(stderr, "[drill %s %6.1fs] ", d->name,
            (double)(kvf_time_ms() - d->t_start_ms) / 1000.0);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void kvf_drill_fail(kvf_drill_t *d, const char *fmt, ...)
{
    va_list ap;

    d->failed = 1;
    va_start(ap, fmt);
    kvf_drill_vappend(d, "EXPECTATION FAILED", fmt, ap);
    va_end(ap);
}

int kvf_drill_check(kvf_drill_t *d, int cond, const char *fmt, ...)
{
    va_list ap;

    if (cond) {
        return 1;
    }
    d->failed = 1;
    va_start(ap, fmt);
    kvf_drill_vappend(d, "EXPECTATION FAILED", fmt, ap);
    va_end(ap);
    return 0;
}

void kvf_drill_expect(kvf_drill_t *d, const char *text)
{
    kvf_record_drill_text(d->rec, "expected", text);
    if (d->hypothesis == NULL) {
        kvf_record_hypothesis(d->rec, text);
    }
}

void kvf_drill_injected(kvf_drill_t *d, const char *text)
{
    kvf_record_drill_text(d->rec, "injected", text);
    kvf_drill_log(d, "injected: %s", text);
}

void kvf_drill_skip(kvf_drill_t *d, const char *fmt, ...)
{
    va_list ap;

    d->skipped = 1;
    va_start(ap, fmt);
    kvf_drill_vappend(d, NULL, fmt, ap);
    va_end(ap);
}
