/*
 * One declarative option table per command: each option's name, short
 * letter, kind, destination, value name, help and default. The same
 * table parses argv (values checked, unknown options refused in one line)
 * and prints `--help`, so the help and the parser cannot disagree.
 *
 *   static const kvf_opt_t opts[] = {
 *       {"pool", 'p', KVF_OPT_SIZE, &o.pool, "SIZE", "pool to register",
 *        "8G"},
 *       {"verify", 0, KVF_OPT_FLAG, &o.verify, NULL, "check every block"},
 *       {0},
 *   };
 *   static const kvf_cmd_spec_t spec = {"kvferry target [options]",
 *                                      "Serves a pool.", opts};
 *   if ((rc = kvf_opts_parse(&spec, argc, argv, &argi)) >= 0)
 *       return rc;
 */
#ifndef KVF_TOOLS_OPTS_H
#define KVF_TOOLS_OPTS_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/cli/opts.h is private to tools/"
#endif

#include <stdint.h>

typedef struct kvf_opt kvf_opt_t;

typedef enum kvf_opt_kind {
    KVF_OPT_FLAG,   /* no value; int *dest = 1 */
    KVF_OPT_CLEAR,  /* no value; int *dest = 0 (e.g. --no-link) */
    KVF_OPT_INT,    /* int *dest, a number in [min, max] */
    KVF_OPT_UINT,   /* unsigned *dest, a number in [min, max] */
    KVF_OPT_U64,    /* uint64_t *dest, a number in [min, max] */
    KVF_OPT_DOUBLE, /* double *dest, a number in [min, max] when max > min */
    KVF_OPT_SIZE,   /* uint64_t *dest, "8K", "16M", "8G" (binary) */
    KVF_OPT_MS,     /* unsigned *dest, "500ms", "3s", "2m", "100" (ms) */
    KVF_OPT_MS64,   /* uint64_t *dest, the same */
    KVF_OPT_STR,    /* const char **dest, the text as given */
    KVF_OPT_CHOICE, /* int *dest = min + index of the value in choices */
    KVF_OPT_SIZES,  /* kvf_opt_sizes_t *dest, "16M,64M,1G" (each > 0) */
    KVF_OPT_FN,     /* fn(opt, value) parses it (NULL value: no value) */
} kvf_opt_kind_t;

/* Option flags. */
#define KVF_OPT_REQUIRED 0x1u  /* must be given */
#define KVF_OPT_HIDDEN   0x2u  /* accepted, not listed (tests' knobs) */
#define KVF_OPT_NOVALUE  0x4u  /* KVF_OPT_FN: takes no value */
#define KVF_OPT_OPTVALUE 0x8u  /* KVF_OPT_FN: "--name" or "--name=VALUE" */
#define KVF_OPT_HEADING  0x10u /* not an option: help is a heading line */

struct kvf_opt {
    const char *name; /* long name without "--" */
    char letter;      /* short option, or 0 */
    kvf_opt_kind_t kind;
    void *dest;
    const char *arg;     /* value name in the help ("SIZE"); NULL: none */
    const char *help;    /* may span lines with '\n' */
    const char *defval;  /* shown as "(default ...)", or NULL */
    const char *choices; /* KVF_OPT_CHOICE: "write|read|both" */
    double min, max;     /* number range (both 0: any) */
    unsigned flags;      /* KVF_OPT_REQUIRED, ... */
    int *seen;           /* set to 1 when the option is given, or NULL */
    /* KVF_OPT_FN: returns 0, or non-zero after printing why not */
    int (*fn)(const kvf_opt_t *opt, const char *value);
};

/* Destination of KVF_OPT_SIZES: a list replaces the default one. */
typedef struct kvf_opt_sizes {
    uint64_t *v;
    unsigned *n;
    unsigned max;
} kvf_opt_sizes_t;

typedef struct kvf_cmd_spec {
    const char *usage; /* "kvferry bench te [options]" */
    const char *about; /* text before the options, or NULL */
    const kvf_opt_t *opts;
    const char *epilog; /* text after the options, or NULL */
    int in_order;       /* options stop at the first positional argument */
    int progress;       /* lists --quiet (accepted by every command) */
} kvf_cmd_spec_t;

/* Parses argv[1..] against spec. Returns -1 to go on (*argi_p, when not
 * NULL, is the index of the first positional argument), or the exit code
 * the command should return: 0 after --help printed the help (stdout),
 * 2 after a one-line error on stderr. */
int kvf_opts_parse(const kvf_cmd_spec_t *spec, int argc, char **argv,
                   int *argi_p);

/* Prints spec's help on f. */
void kvf_opts_help(const kvf_cmd_spec_t *spec, void *f);

/* A one-line usage error of command cmd ("kvferry bench te"); returns 2. */
int kvf_opts_error(const kvf_cmd_spec_t *spec, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
