/*
 * Progress of long-running commands and the busy-machine note.
 *
 * A command announces each size or phase it measures; on a terminal
 * (stderr a tty) one status line is rewritten in place, otherwise each
 * step is one plain line on stderr. Each line says what is measured and,
 * once a weighted step is done, an estimate of the time left. `--quiet`
 * (kvf_progress_quiet) silences them.
 *
 * The same object samples the load average (/proc/loadavg) and the CPU
 * steal time (/proc/stat) at every step, so the command can say at its end
 * that the machine was busy and its figures may be low:
 *
 *   note: the machine was busy during this run (load average 3.1 on
 *   2 cores, steal 0.0 %) — figures may be low
 */
#ifndef KVF_TOOLS_PROGRESS_H
#define KVF_TOOLS_PROGRESS_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/cli/progress.h is private to tools/"
#endif

#include <stdint.h>
#include <stdio.h>

/* Set by --quiet: no progress lines. */
extern int kvf_progress_quiet;

typedef struct kvf_progress {
    const char *cmd;    /* "bench blocks" */
    double total, done; /* weights of the measured steps */
    uint64_t t0_ns;     /* first weighted step */
    int tty, shown;     /* a status line is on the terminal */
    unsigned step, nsteps;
    /* busy sampling */
    double load_max;
    unsigned long long steal0, all0, steal1, all1;
    int ncpu;
} kvf_progress_t;

/* Starts: nsteps steps (0: unknown) whose weights sum to total. */
void kvf_progress_begin(kvf_progress_t *p, const char *cmd, unsigned nsteps,
                        double total);
/* A step begins: what it measures, printf-style. */
void kvf_progress_step(kvf_progress_t *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A phase that is not a counted step (setting up, waiting). */
void kvf_progress_note(kvf_progress_t *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The current step is done; weight adds to the work done. */
void kvf_progress_done(kvf_progress_t *p, double weight);
/* Erases the status line (before printing a row on stdout); NULL: that of
 * the progress begun last. */
void kvf_progress_clear(kvf_progress_t *p);

/* Busy figures of the run so far. */
typedef struct kvf_busy {
    int busy; /* load above the core count, or steal above 5 % */
    double load;
    int ncpu;
    double steal_pct;
} kvf_busy_t;

/* Ends: erases the status line, takes a last sample and returns the
 * busy figures of the run. */
kvf_busy_t kvf_progress_end(kvf_progress_t *p);
/* Prints the busy note on out when b says the machine was busy. */
void kvf_busy_note(const kvf_busy_t *b, FILE *out);

#endif
