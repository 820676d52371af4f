/*
 * Claims as data: a bench states what it expects as rules over named
 * figures ("tcp.link_pct>=80", "te.small_pct>=90"), feeds every figure it
 * measured, and prints one verdict line per rule:
 *
 *   PASS  tcp.link_pct>=80: all 4 (lowest 85.2 at write 16.0 MB)
 *   BELOW tcp.link_pct>=80: 77.1 at write 16.0 MB (1 of 4)
 *
 * A rule holds when every figure of its name meets it. Rules come from
 * the bench's defaults and from --expect; --strict turns a missed rule
 * into a non-zero exit for scripts.
 */
#ifndef KVF_TOOLS_EXPECT_H
#define KVF_TOOLS_EXPECT_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/record/expect.h is private to tools/"
#endif

#include <stdio.h>

typedef struct kvf_expect kvf_expect_t;

kvf_expect_t *kvf_expect_new(void);
void kvf_expect_free(kvf_expect_t *e);

/* Adds a rule "NAME OP VALUE" (OP: >=, <=, >, <, ==). given: from the
 * user (reported even when nothing measured it) rather than a default
 * (skipped then). Returns 0, or -1 with a message on stderr. */
int kvf_expect_rule(kvf_expect_t *e, const char *text, int given);

/* A measured figure; where says which row it came from ("write 16 MB"). */
void kvf_expect_figure(kvf_expect_t *e, const char *name, double value,
                       const char *where);

/* Prints the verdict lines on f; returns how many rules were missed
 * (BELOW a lower bound, ABOVE an upper bound, or given but not
 * measured). */
int kvf_expect_report(const kvf_expect_t *e, FILE *f);

#endif
