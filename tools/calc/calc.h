/*
 * The break-even model of seed 003 §2.4: is loading a prefix's KV cache
 * from elsewhere faster than recomputing its prefill?
 *
 *   KV bytes per token   GQA/MHA: 2 x layers x kv_heads x head_dim x bytes
 *                        MLA:     layers x (kv_lora_rank + rope_dim) x bytes
 *   network time         prefix bytes / (links x link GB/s)
 *   H2D time             (prefix bytes / gpus) / H2D GB/s, GPUs in parallel
 *   load time            fixed (query + sync) + network + H2D
 *                        (with overlap: fixed + max(network, H2D))
 *   recompute time       2 x active params x tokens [+ attention FLOPs]
 *                        / (gpus x TFLOPS x utilisation)
 *   attention FLOPs      layers x tokens^2 x q_heads x (qk_dim + v_dim)
 *                        (causal prefill; only with the attention term on)
 *
 * Load time is affine in tokens, recompute time linear (plus a quadratic
 * attention term), so the break-even prefix length has a closed form. The
 * interactive page (tools/calc/calc.html) implements the same formulas in
 * JavaScript; tests compare both.
 *
 * Pure C, no I/O: everything here is unit-tested (tests/unit/test_calc.c).
 */
#ifndef KVF_TOOLS_CALC_H
#define KVF_TOOLS_CALC_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/calc/calc.h is private to tools/"
#endif

#include <kvferry/status.h>

#include <stddef.h>

/* A model's shape. bytes may be fractional (e.g. 0.5 for 4-bit caches). */
typedef struct kvf_calc_model {
    char name[48];
    unsigned layers;
    unsigned kv_heads; /* GQA/MHA key-value heads (unused with MLA) */
    unsigned head_dim;
    double bytes;         /* bytes per cached element (2 = BF16) */
    double params_total;  /* all parameters (informational for MoE) */
    double params_active; /* parameters used per token (MoE: active) */
    unsigned q_heads;     /* attention heads, for the attention term */
    unsigned qk_dim;      /* per-head query/key width (0 = head_dim) */
    unsigned v_dim;       /* per-head value width (0 = head_dim) */
    unsigned mla_rank;    /* MLA kv_lora_rank; 0 = not MLA */
    unsigned mla_rope;    /* MLA qk_rope_head_dim */
    const char *about;    /* where the shape comes from (static) */
} kvf_calc_model_t;

/* Deployment and workload. Bandwidths in GB/s (1e9 bytes/s), compute in
 * TFLOPS (1e12 FLOP/s), overheads in seconds. */
typedef struct kvf_calc_inputs {
    double tokens;   /* prefix length */
    unsigned gpus;   /* GPUs sharing the prefill and receiving the KV */
    double tflops;   /* dense BF16 per GPU */
    double util;     /* achieved fraction of tflops, 0..1 */
    double link_gbs; /* one network link */
    unsigned links;  /* links used at once */
    double h2d_gbs;  /* host-to-device, per GPU */
    double query_s;  /* fixed: metadata query */
    double sync_s;   /* fixed: synchronisation, completion */
    int overlap;     /* network and H2D pipelined */
    int attention;   /* add the attention FLOPs to the recompute */
} kvf_calc_inputs_t;

typedef struct kvf_calc_result {
    double kv_bytes_per_token;
    double prefix_bytes;
    double net_s; /* serial: whole prefix over the links */
    double h2d_s; /* parallel: each GPU's share over its H2D */
    double fixed_s;
    double load_s; /* the load path as configured */
    double recompute_flops;
    double recompute_s;
    double speedup; /* recompute_s / load_s */
    int load_wins;  /* load_s < recompute_s */
    /* Break-even: the shortest prefix (tokens) from which loading is
     * faster; has_breakeven = 0 when loading never wins. */
    int has_breakeven;
    double breakeven_tokens;
} kvf_calc_result_t;

/* Presets: NULL-terminated table of common models (static). */
const kvf_calc_model_t *kvf_calc_presets(size_t *count_p);
/* Finds a preset by name, case-insensitively ("llama3-70b"); NULL if none. */
const kvf_calc_model_t *kvf_calc_preset(const char *name);

/* The seed 003 §2.4 defaults: 32K tokens, 8 GPUs x 989 TFLOPS at 50 %,
 * one 46 GB/s link, 50 GB/s H2D, 5 ms query + 5 ms sync. */
void kvf_calc_inputs_default(kvf_calc_inputs_t *in);

/* Checks a model and inputs; returns KVF_ERR_INVALID_PARAM with why
 * (a static string) in *why_p when something is out of range. */
kvf_status_t kvf_calc_check(const kvf_calc_model_t *m,
                            const kvf_calc_inputs_t *in, const char **why_p);

double kvf_calc_kv_bytes_per_token(const kvf_calc_model_t *m);

/* Load and recompute time for a given prefix length (others from in). */
double kvf_calc_load_s(const kvf_calc_model_t *m, const kvf_calc_inputs_t *in,
                       double tokens);
double kvf_calc_recompute_s(const kvf_calc_model_t *m,
                            const kvf_calc_inputs_t *in, double tokens);

/* Everything at once; res_p set only on success. */
kvf_status_t kvf_calc_run(const kvf_calc_model_t *m,
                          const kvf_calc_inputs_t *in,
                          kvf_calc_result_t *res_p);

#endif
