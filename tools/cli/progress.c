/*
 * Progress lines and the busy-machine note (progress.h).
 */
#include "tools/cli/progress.h"

#include "core/time.h"

#include <stdarg.h>
#include <string.h>
#include <unistd.h>

int kvf_progress_quiet;
/* the progress begun last, for kvf_progress_clear(NULL) */
static kvf_progress_t *kvf_progress_last;

/* Samples /proc/loadavg (1-minute) and /proc/stat (steal, all ticks). */
static void kvf_progress_sample(kvf_progress_t *p, int first)
{
    unsigned long long v[10] = {0}, all = 0;
    double load = 0;
    FILE *f;
    int i;

    f = fopen("/proc/loadavg", "r");
    if (f != NULL) {
        if (fscanf(f, "%lf", &load) == 1 && load > p->load_max) {
            p->load_max = load;
        }
        fclose(f);
    }
    f = fopen("/proc/stat", "r");
    if (f == NULL) {
        return;
    }
    if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1],
               &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) == 8) {
        for (i = 0; i < 8; i++) {
            all += v[i];
        }
        if (first) {
            p->steal0 = v[7];
            p->all0 = all;
        }
        p->steal1 = v[7];
        p->all1 = all;
    }
    fclose(f);
}

void kvf_progress_begin(kvf_progress_t *p, const char *cmd, unsigned nsteps,
                        double total)
{
    memset(p, 0, sizeof(*p));
    p->cmd = cmd;
    p->nsteps = nsteps;
    p->total = total;
    p->tty = isatty(STDERR_FILENO);
    p->ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (p->ncpu < 1) {
        p->ncpu = 1;
    }
    kvf_progress_sample(p, 1);
    kvf_progress_last = p;
}

void kvf_progress_clear(kvf_progress_t *p)
{
    if (p == NULL) {
        p = kvf_progress_last;
    }
    if (p != NULL && p->shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        p->shown = 0;
    }
}

/* Prints one progress line: the status line on a tty, else a line. */
static void kvf_progress_show(kvf_progress_t *p, const char *what, int counted)
{
    char left[48] = "", count[32] = "";
    double sec;

    if (kvf_progress_quiet) {
        return;
    }
    if (p->done > 0 && p->total > p->done) {
        sec = (double)(kvf_time_ns() - p->t0_ns) / 1e9 * (p->total - p->done) /
              p->done;
        if (sec >= 90) {
            snprintf(left, sizeof(left), ", about %.0f min left", sec / 60);
        } else {
            snprintf(left, sizeof(left), ", about %.0f s left", sec + 0.5);
        }
    }
    if (p->nsteps > 0 && counted) {
        snprintf(count, sizeof(count), " [%u/%u]", p->step, p->nsteps);
    }
    if (p->tty) {
        fprintf(stderr, "\r\033[Kkvferry %s%s: %s%s", p->cmd, count, what,
                left);
        p->shown = 1;
    } else {
        fprintf(stderr, "kvferry %s%s: %s%s\n", p->cmd, count, what, left);
    }
    fflush(stderr);
}

void kvf_progress_step(kvf_progress_t *p, const char *fmt, ...)
{
    char what[200];
    va_list ap;

    kvf_progress_sample(p, 0);
    p->step++;
    if (p->t0_ns == 0) {
        p->t0_ns = kvf_time_ns();
    }
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    kvf_progress_show(p, what, 1);
}

void kvf_progress_note(kvf_progress_t *p, const char *fmt, ...)
{
    char what[200];
    va_list ap;

    kvf_progress_sample(p, 0);
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    kvf_progress_show(p, what, 0);
}

void kvf_progress_done(kvf_progress_t *p, double weight)
{
    p->done += weight;
}

kvf_busy_t kvf_progress_end(kvf_progress_t *p)
{
    kvf_busy_t b = {0};
    unsigned long long all;

    kvf_progress_clear(p);
    kvf_progress_sample(p, 0);
    if (kvf_progress_last == p) {
        kvf_progress_last = NULL;
    }
    all = p->all1 - p->all0;
    b.load = p->load_max;
    b.ncpu = p->ncpu;
    b.steal_pct =
        all > 0 ? 100.0 * (double)(p->steal1 - p->steal0) / (double)all : 0;
    b.busy = b.load > (double)b.ncpu || b.steal_pct > 5.0;
    return b;
}

void kvf_busy_note(const kvf_busy_t *b, FILE *out)
{
    if (b->busy) {
        fflush(stdout);
        fprintf(out,
                "note: the machine was busy during this run (load average "
                "%.1f on %d cores, steal %.1f %%) \xe2\x80\x94 figures may "
                "be low\n",
                b->load, b->ncpu, b->steal_pct);
        fflush(out);
    }
}
