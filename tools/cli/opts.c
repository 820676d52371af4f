/*
 * The declarative option tables of the kvferry commands (opts.h): argv is
 * parsed with getopt_long built from the table, each value checked by its
 * kind, and --help printed from the same table.
 */
#include "tools/cli/opts.h"
#include "tools/cli/progress.h"
#include "tools/cli/cli.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVF_OPTS_MAX          64
#define KVF_OPTS_COL          24 /* help text starts here */
#define KVF_OPTS_HELP_VAL     1000
#define KVF_OPTS_QUIET_VAL    999
#define KVF_OPTS_LOG_VAL      998
#define KVF_OPTS_SECRET_VAL   997
#define KVF_OPTS_INSECURE_VAL 996
#define KVF_OPTS_METADATA_VAL 995

int kvf_opts_error(const kvf_cmd_spec_t *spec, const char *fmt, ...)
{
    const char *u = spec->usage;
    size_t n = 0, w;
    va_list ap;

    /* the command is the usage's leading words of lower-case letters */
    while (u[n] != '\0') {
        w = strspn(u + n, "abcdefghijklmnopqrstuvwxyz-");
        if (w == 0 || (u[n + w] != ' ' && u[n + w] != '\0')) {
            break;
        }
        n += w + (u[n + w] == ' ');
    }
    while (n > 0 && u[n - 1] == ' ') {
        n--;
    }
    fprintf(stderr, "%.*s: ", (int)n, u);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see --help)\n");
    return KVF_CLI_USAGE;
}

static int kvf_opt_takes_value(const kvf_opt_t *o)
{
    if (o->kind == KVF_OPT_FN) {
        return !(o->flags & KVF_OPT_NOVALUE);
    }
    return o->kind != KVF_OPT_FLAG && o->kind != KVF_OPT_CLEAR;
}

/* "  --name ARG" or "  -x, --name ARG" into buf. */
static void kvf_opt_head(const kvf_opt_t *o, char *buf, size_t len)
{
    const char *arg = o->arg;

    if (arg == NULL && o->kind == KVF_OPT_CHOICE) {
        arg = o->choices;
    }
    if (o->flags & KVF_OPT_OPTVALUE) {
        snprintf(buf, len, "  --%s[=%s]", o->name, arg ? arg : "VALUE");
    } else if (o->letter) {
        snprintf(buf, len, "  -%c, --%s%s%s", o->letter, o->name,
                 kvf_opt_takes_value(o) ? " " : "",
                 kvf_opt_takes_value(o) ? (arg ? arg : "VALUE") : "");
    } else {
        snprintf(buf, len, "  --%s%s%s", o->name,
                 kvf_opt_takes_value(o) ? " " : "",
                 kvf_opt_takes_value(o) ? (arg ? arg : "VALUE") : "");
    }
}

static void kvf_opt_print(FILE *f, const kvf_opt_t *o)
{
    char head[128];
    const char *h = o->help ? o->help : "", *nl;
    int col;

    kvf_opt_head(o, head, sizeof(head));
    fputs(head, f);
    col = (int)strlen(head);
    do {
        nl = strchr(h, '\n');
        if (col >= KVF_OPTS_COL) {
            fprintf(f, "\n%*s", KVF_OPTS_COL, "");
        } else {
            fprintf(f, "%*s", KVF_OPTS_COL - col, "");
        }
        col = KVF_OPTS_COL + 1; /* next lines start on their own */
        fprintf(f, "%.*s", nl ? (int)(nl - h) : (int)strlen(h), h);
        h = nl ? nl + 1 : NULL;
    } while (h != NULL);
    if (o->flags & KVF_OPT_REQUIRED) {
        fputs(" (required)", f);
    } else if (o->defval != NULL) {
        fprintf(f, " (default %s)", o->defval);
    }
    fputc('\n', f);
}

void kvf_opts_help(const kvf_cmd_spec_t *spec, void *fp)
{
    FILE *f = fp;
    const kvf_opt_t *o;

    fprintf(f, "usage: %s\n", spec->usage);
    if (spec->about != NULL) {
        fprintf(f, "%s\n", spec->about);
    }
    if (spec->opts != NULL && spec->opts[0].name != NULL &&
        !(spec->opts[0].flags & KVF_OPT_HEADING)) {
        fprintf(f, "options:\n");
        for (o = spec->opts; o->name != NULL; o++) {
            if (o->flags & KVF_OPT_HEADING) {
                fprintf(f, "%s\n", o->help);
            } else if (!(o->flags & KVF_OPT_HIDDEN)) {
                kvf_opt_print(f, o);
            }
        }
    }
    if (spec->progress) {
        fprintf(f, "      --quiet%*s%s\n", KVF_OPTS_COL - 13, "",
                "no progress lines on stderr");
    }
    fprintf(f, "      --log FILE%*s%s\n", KVF_OPTS_COL - 16, "",
            "append log lines to FILE (config `log_file`)");
    fprintf(f, "      --secret-file FILE\n%*s%s\n", KVF_OPTS_COL, "",
            "the cluster secret (config `secret_file`; docs/security.md)");
    fprintf(f, "      --insecure%*s%s\n", KVF_OPTS_COL - 16, "",
            "no authentication, allow non-loopback binds without a secret");
    fprintf(f, "      --metadata URI%*s%s\n", KVF_OPTS_COL - 20, "",
            "p2p (default) or etcd://host:port[,host:port] (`metadata`)");
    fprintf(f, "  -h, --help%*s%s\n", KVF_OPTS_COL - 12, "", "print this help");
    if (spec->epilog != NULL) {
        fprintf(f, "%s\n", spec->epilog);
    }
}

static int kvf_opt_number(const kvf_cmd_spec_t *spec, const kvf_opt_t *o,
                          const char *v, double *out)
{
    char *end;
    double d;

    errno = 0;
    d = strtod(v, &end);
    if (errno != 0 || end == v || *end != '\0' || !isfinite(d) ||
        (o->kind != KVF_OPT_DOUBLE && d != floor(d))) {
        return kvf_opts_error(spec, "--%s: '%s' is not a number", o->name, v);
    }
    if (o->max > o->min && (d < o->min || d > o->max)) {
        return kvf_opts_error(spec, "--%s: '%s' is not in %.15g..%.15g",
                              o->name, v, o->min, o->max);
    }
    *out = d;
    return 0;
}

static int kvf_opt_choice(const kvf_cmd_spec_t *spec, const kvf_opt_t *o,
                          const char *v)
{
    const char *c = o->choices;
    size_t n = strlen(v), len;
    int i;

    for (i = 0; c != NULL && *c != '\0'; i++) {
        len = strcspn(c, "|");
        if (len == n && strncmp(c, v, n) == 0) {
            *(int *)o->dest = (int)o->min + i;
            return 0;
        }
        c += len + (c[len] == '|');
    }
    return kvf_opts_error(spec, "--%s: '%s' is not one of %s", o->name, v,
                          o->choices);
}

static int kvf_opt_sizes(const kvf_cmd_spec_t *spec, const kvf_opt_t *o,
                         const char *v)
{
    const kvf_opt_sizes_t *d = o->dest;
    char tok[64];
    unsigned n = 0;
    size_t len;
    uint64_t u;

    for (;;) {
        len = strcspn(v, ",");
        snprintf(tok, sizeof(tok), "%.*s", (int)len, v);
        if (len >= sizeof(tok) || kvf_parse_size(tok, &u) != KVF_OK || u == 0) {
            return kvf_opts_error(spec,
                                  "--%s: '%s' is not a size > 0 (8K, "
                                  "16M, 8G)",
                                  o->name, tok);
        }
        if (n == d->max) {
            return kvf_opts_error(spec, "--%s: at most %u sizes", o->name,
                                  d->max);
        }
        d->v[n++] = u;
        if (v[len] == '\0') {
            break;
        }
        v += len + 1;
    }
    *d->n = n;
    return 0;
}

/* Stores value v of option o; 0, or the exit code after an error. */
static int kvf_opt_set(const kvf_cmd_spec_t *spec, const kvf_opt_t *o,
                       const char *v)
{
    uint64_t u;
    double d = 0;

    switch (o->kind) {
    case KVF_OPT_FLAG:
        *(int *)o->dest = 1;
        return 0;
    case KVF_OPT_CLEAR:
        *(int *)o->dest = 0;
        return 0;
    case KVF_OPT_STR:
        *(const char **)o->dest = v;
        return 0;
    case KVF_OPT_CHOICE:
        return kvf_opt_choice(spec, o, v);
    case KVF_OPT_FN:
        return o->fn(o, v) == 0 ? 0 : KVF_CLI_USAGE;
    case KVF_OPT_SIZES:
        return kvf_opt_sizes(spec, o, v);
    case KVF_OPT_SIZE:
        if (kvf_parse_size(v, &u) != KVF_OK) {
            return kvf_opts_error(
                spec, "--%s: '%s' is not a size (8K, 16M, 8G)", o->name, v);
        }
        *(uint64_t *)o->dest = u;
        return 0;
    case KVF_OPT_MS:
    case KVF_OPT_MS64:
        if (kvf_parse_ms(v, &u) != KVF_OK ||
            (o->kind == KVF_OPT_MS && u > 0xffffffffull)) {
            return kvf_opts_error(spec,
                                  "--%s: '%s' is not a duration "
                                  "(500ms, 3s, 2m)",
                                  o->name, v);
        }
        if (o->kind == KVF_OPT_MS) {
            *(unsigned *)o->dest = (unsigned)u;
        } else {
            *(uint64_t *)o->dest = u;
        }
        return 0;
    default:
        break;
    }
    if (kvf_opt_number(spec, o, v, &d) != 0) {
        return KVF_CLI_USAGE;
    }
    if (o->kind == KVF_OPT_INT) {
        *(int *)o->dest = (int)d;
    } else if (o->kind == KVF_OPT_UINT) {
        *(unsigned *)o->dest = (unsigned)d;
    } else if (o->kind == KVF_OPT_U64) {
        *(uint64_t *)o->dest = (uint64_t)d;
    } else {
        *(double *)o->dest = d;
    }
    return 0;
}

/* Builds getopt_long's tables from spec; returns the number of options. */
static int kvf_opts_build(const kvf_cmd_spec_t *spec, struct option *lo,
                          char *shorts, size_t slen)
{
    size_t s = 0;
    int i, k = 0;

    if (spec->in_order) {
        shorts[s++] = '+';
    }
    shorts[s++] = ':';
    shorts[s++] = 'h';
    for (i = 0; spec->opts != NULL && spec->opts[i].name != NULL; i++) {
        const kvf_opt_t *o = &spec->opts[i];

        if (k + 2 >= KVF_OPTS_MAX) {
            break;
        }
        if (o->flags & KVF_OPT_HEADING) {
            continue;
        }
        lo[k].name = o->name;
        lo[k].has_arg = (o->flags & KVF_OPT_OPTVALUE) ? optional_argument
                        : kvf_opt_takes_value(o)      ? required_argument
                                                      : no_argument;
        lo[k].flag = NULL;
        lo[k].val = KVF_OPTS_HELP_VAL + 1 + i;
        k++;
        if (o->letter && s + 3 < slen) {
            shorts[s++] = o->letter;
            if (kvf_opt_takes_value(o)) {
                shorts[s++] = ':';
            }
        }
    }
    shorts[s] = '\0';
    lo[k] = (struct option){"help", no_argument, NULL, 'h'};
    /* --quiet: every command accepts it (progress.h) */
    lo[k + 1] = (struct option){"quiet", no_argument, NULL, KVF_OPTS_QUIET_VAL};
    lo[k + 2] =
        (struct option){"log", required_argument, NULL, KVF_OPTS_LOG_VAL};
    lo[k + 3] = (struct option){"secret-file", required_argument, NULL,
                                KVF_OPTS_SECRET_VAL};
    lo[k + 4] =
        (struct option){"insecure", no_argument, NULL, KVF_OPTS_INSECURE_VAL};
    lo[k + 5] = (struct option){"metadata", required_argument, NULL,
                                KVF_OPTS_METADATA_VAL};
    lo[k + 6] = (struct option){NULL, 0, NULL, 0};
    return i;
}

/* The table index of what getopt_long returned, or -1. */
static int kvf_opts_index(const kvf_cmd_spec_t *spec, int n, int c)
{
    int i;

    if (c > KVF_OPTS_HELP_VAL && c <= KVF_OPTS_HELP_VAL + n) {
        return c - KVF_OPTS_HELP_VAL - 1;
    }
    for (i = 0; i < n; i++) {
        if (spec->opts[i].letter == c) {
            return i;
        }
    }
    return -1;
}

static int kvf_opts_required(const kvf_cmd_spec_t *spec, const char *given)
{
    int i;

    for (i = 0; spec->opts != NULL && spec->opts[i].name != NULL; i++) {
        if ((spec->opts[i].flags & KVF_OPT_REQUIRED) && !given[i]) {
            return kvf_opts_error(spec, "--%s is required", spec->opts[i].name);
        }
    }
    return -1;
}

int kvf_opts_parse(const kvf_cmd_spec_t *spec, int argc, char **argv,
                   int *argi_p)
{
    struct option lo[KVF_OPTS_MAX + 7];
    char shorts[3 * KVF_OPTS_MAX + 4], given[KVF_OPTS_MAX] = {0};
    int n, c, i, rc;

    n = kvf_opts_build(spec, lo, shorts, sizeof(shorts));
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, shorts, lo, NULL)) != -1) {
        if (c == 'h') {
            kvf_opts_help(spec, stdout);
            return KVF_CLI_OK;
        }
        if (c == KVF_OPTS_QUIET_VAL) {
            kvf_progress_quiet = 1;
            continue;
        }
        if (c == KVF_OPTS_LOG_VAL) {
            /* the key log_file, inherited by the processes it starts */
            setenv("KVF_LOG_FILE", optarg, 1);
            fprintf(stderr, "kvferry: log lines go to %s\n", optarg);
            continue;
        }
        if (c == KVF_OPTS_METADATA_VAL) {
            /* the key metadata, inherited by the processes it starts */
            setenv("KVF_METADATA", optarg, 1);
            continue;
        }
        if (c == KVF_OPTS_SECRET_VAL || c == KVF_OPTS_INSECURE_VAL) {
            /* the keys secret_file and insecure, inherited by the
             * processes the command starts */
            setenv(c == KVF_OPTS_SECRET_VAL ? "KVF_SECRET_FILE"
                                            : "KVF_INSECURE",
                   c == KVF_OPTS_SECRET_VAL ? optarg : "1", 1);
            continue;
        }
        if (c == ':') {
            return kvf_opts_error(spec, "%s needs a value", argv[optind - 1]);
        }
        i = kvf_opts_index(spec, n, c);
        if (c == '?' || i < 0) {
            if (optopt != 0 && optopt < KVF_OPTS_HELP_VAL) {
                return kvf_opts_error(spec, "unknown option '-%c'", optopt);
            }
            return kvf_opts_error(spec, "unknown option '%s'",
                                  argv[optind - 1]);
        }
        rc = kvf_opt_set(spec, &spec->opts[i],
                         kvf_opt_takes_value(&spec->opts[i]) ||
                                 (spec->opts[i].flags & KVF_OPT_OPTVALUE)
                             ? optarg
                             : NULL);
        if (rc != 0) {
            return rc;
        }
        given[i] = 1;
        if (spec->opts[i].seen != NULL) {
            *spec->opts[i].seen = 1;
        }
    }
    if (argi_p != NULL) {
        *argi_p = optind;
    } else if (optind < argc) {
        return kvf_opts_error(spec, "unexpected argument '%s'", argv[optind]);
    }
    return kvf_opts_required(spec, given);
}
