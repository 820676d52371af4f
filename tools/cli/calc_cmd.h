/*
 * `kvferry calc`, shared between its two files: calc_cmd.c (options and
 * where each input comes from) and calc_cmd_out.c (the table, the JSON and
 * the page's data).
 */
#ifndef KVF_TOOLS_CMD_CALC_H
#define KVF_TOOLS_CMD_CALC_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/cli/calc_cmd.h is private to tools/"
#endif

#include "tools/cli/cli.h"
#include "tools/calc/calc.h"
#include "tools/calc/calc_data.h"

#include <jansson.h>

#define KVF_CALC_SRC_LEN 240
#define KVF_CALC_MAX_OPS 32

/* The deployment inputs, in output order. */
enum {
    KVF_IN_TOKENS,
    KVF_IN_GPUS,
    KVF_IN_TFLOPS,
    KVF_IN_UTIL,
    KVF_IN_LINK,
    KVF_IN_LINKS,
    KVF_IN_H2D,
    KVF_IN_QUERY,
    KVF_IN_SYNC,
    KVF_IN_OVERLAP,
    KVF_IN_ATTN,
    KVF_IN_COUNT
};

typedef struct kvf_calc_in_desc {
    const char *key;   /* JSON key and page field */
    const char *label; /* table label */
    const char *unit;
} kvf_calc_in_desc_t;

extern const kvf_calc_in_desc_t kvf_calc_in_desc[KVF_IN_COUNT];

/* A --ref / --from-record option, applied after presets. */
typedef struct kvf_calc_op {
    int kind; /* 'r' any ref, 'G' gpu, 'N' link, 'H' h2d, 'R' record */
    const char *arg;
} kvf_calc_op_t;

typedef struct kvf_calc_state {
    kvf_calc_model_t model;
    char model_src[KVF_CALC_SRC_LEN];
    kvf_calc_inputs_t in;
    char src[KVF_IN_COUNT][KVF_CALC_SRC_LEN];
    kvf_calc_refs_t refs;
    json_t *used; /* references and records used, array */
} kvf_calc_state_t;

/* Output (calc_cmd_out.c). */
double kvf_calc_in_value(const kvf_calc_inputs_t *in, int i);
void kvf_calc_list(const kvf_calc_state_t *st);
json_t *kvf_calc_json(const kvf_calc_state_t *st, const kvf_calc_result_t *r);
json_t *kvf_calc_page_data(const kvf_calc_state_t *st,
                           const kvf_calc_result_t *r);
void kvf_calc_print(const kvf_calc_state_t *st, const kvf_calc_result_t *r);
/* Writes j to path ("-" = stdout), indented; returns a KVF_CLI_ code. */
int kvf_calc_dump(json_t *j, const char *path);

#endif
