/*
 * Verdicts as data (expect.h): rules parsed from text, figures collected
 * as the bench measures, one line per rule at the end.
 */
#include "tools/record/expect.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KVF_EXPECT_NAME  64
#define KVF_EXPECT_WHERE 64

typedef enum { KVF_GE, KVF_LE, KVF_GT, KVF_LT, KVF_EQ } kvf_expect_op_t;

typedef struct kvf_expect_rule {
    char name[KVF_EXPECT_NAME];
    char text[2 * KVF_EXPECT_NAME];
    kvf_expect_op_t op;
    double value;
    int given;
} kvf_expect_rule_t;

typedef struct kvf_expect_fig {
    char name[KVF_EXPECT_NAME];
    char where[KVF_EXPECT_WHERE];
    double value;
} kvf_expect_fig_t;

struct kvf_expect {
    kvf_expect_rule_t *rules;
    size_t nrules;
    kvf_expect_fig_t *figs;
    size_t nfigs, capfigs;
};

kvf_expect_t *kvf_expect_new(void)
{
    return calloc(1, sizeof(kvf_expect_t));
}

void kvf_expect_free(kvf_expect_t *e)
{
    if (e != NULL) {
        free(e->rules);
        free(e->figs);
        free(e);
    }
}

int kvf_expect_rule(kvf_expect_t *e, const char *text, int given)
{
    static const struct {
        const char *s;
        kvf_expect_op_t op;
    } ops[] = {{">=", KVF_GE},
               {"<=", KVF_LE},
               {"==", KVF_EQ},
               {">", KVF_GT},
               {"<", KVF_LT}};
    kvf_expect_rule_t r = {0}, *nr;
    size_t n = strcspn(text, "<>="), i;
    char *end;

    for (i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        if (strncmp(text + n, ops[i].s, strlen(ops[i].s)) == 0) {
            break;
        }
    }
    if (n == 0 || n >= sizeof(r.name) || i == sizeof(ops) / sizeof(ops[0])) {
        fprintf(stderr,
                "kvferry: --expect '%s': NAME>=VALUE (or <=, >, <, "
                "==) expected\n",
                text);
        return -1;
    }
    memcpy(r.name, text, n);
    r.op = ops[i].op;
    errno = 0;
    r.value = strtod(text + n + strlen(ops[i].s), &end);
    if (errno != 0 || end == text + n + strlen(ops[i].s) || *end != '\0') {
        fprintf(stderr, "kvferry: --expect '%s': the value is not a number\n",
                text);
        return -1;
    }
    snprintf(r.text, sizeof(r.text), "%s", text);
    r.given = given;
    nr = realloc(e->rules, (e->nrules + 1) * sizeof(*nr));
    if (nr == NULL) {
        return -1;
    }
    e->rules = nr;
    e->rules[e->nrules++] = r;
    return 0;
}

void kvf_expect_figure(kvf_expect_t *e, const char *name, double value,
                       const char *where)
{
    kvf_expect_fig_t *f;

    if (e == NULL || !isfinite(value)) {
        return;
    }
    if (e->nfigs == e->capfigs) {
        size_t cap = e->capfigs ? 2 * e->capfigs : 16;

        f = realloc(e->figs, cap * sizeof(*f));
        if (f == NULL) {
            return;
        }
        e->figs = f;
        e->capfigs = cap;
    }
    f = &e->figs[e->nfigs++];
    snprintf(f->name, sizeof(f->name), "%s", name);
    snprintf(f->where, sizeof(f->where), "%s", where ? where : "");
    f->value = value;
}

static int kvf_expect_holds(const kvf_expect_rule_t *r, double v)
{
    switch (r->op) {
    case KVF_GE:
        return v >= r->value;
    case KVF_LE:
        return v <= r->value;
    case KVF_GT:
        return v > r->value;
    case KVF_LT:
        return v < r->value;
    default:
        return v == r->value;
    }
}

/* One rule's line; returns 1 when it is missed. */
static int kvf_expect_line(const kvf_expect_t *e, const kvf_expect_rule_t *r,
                           FILE *out)
{
    const kvf_expect_fig_t *worst = NULL;
    size_t i, n = 0, bad = 0;
    int low = r->op == KVF_GE || r->op == KVF_GT;

    for (i = 0; i < e->nfigs; i++) {
        const kvf_expect_fig_t *f = &e->figs[i];

        if (strcmp(f->name, r->name) != 0) {
            continue;
        }
        n++;
        bad += !kvf_expect_holds(r, f->value);
        if (worst == NULL ||
            (low ? f->value < worst->value : f->value > worst->value)) {
            worst = f;
        }
    }
    if (n == 0) {
        if (r->given) {
            fprintf(out, "UNMEASURED %s: this run has no figure '%s'\n",
                    r->text, r->name);
        }
        return r->given;
    }
    if (bad == 0) {
        fprintf(out, "PASS  %s: all %zu (%s %.4g%s%s)\n", r->text, n,
                low ? "lowest" : "highest", worst->value,
                worst->where[0] ? " at " : "", worst->where);
        return 0;
    }
    fprintf(out, "%s %s: %.4g%s%s (%zu of %zu)\n", low ? "BELOW" : "ABOVE",
            r->text, worst->value,
            worst->where[0] ? " at " : "", worst->where, bad, n);
    return 1;
}

int kvf_expect_report(const kvf_expect_t *e, FILE *f)
{
    size_t i;
    int missed = 0;

    if (e == NULL) {
        return 0;
    }
    for (i = 0; i < e->nrules; i++) {
        missed += kvf_expect_line(e, &e->rules[i], f);
    }
    return missed;
}
