/*
 * The break-even model (see calc.h for the formulas): model presets, input
 * checks, load and recompute time, and the closed-form break-even prefix
 * length. tools/calc/calc.html mirrors these functions in JavaScript; keep
 * the two in step (tests/integration/test_calc_html.sh compares them).
 */
#include "tools/calc/calc.h"

#include <math.h>
#include <string.h>
#include <strings.h>

/*
 * Shapes from each model's public config.json (num_hidden_layers,
 * num_key_value_heads, head_dim or hidden_size / num_attention_heads;
 * DeepSeek-V3: kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim,
 * v_head_dim) and parameter counts from the model cards.
 */
static const kvf_calc_model_t kvf_calc_preset_table[] = {
    {"llama3-8b", 32, 8, 128, 2, 8.03e9, 8.03e9, 32, 0, 0, 0, 0,
     "Meta-Llama-3-8B config.json: 32 layers, 8 KV heads, head_dim 128"},
    {"llama3-70b", 80, 8, 128, 2, 70.6e9, 70.6e9, 64, 0, 0, 0, 0,
     "Meta-Llama-3-70B config.json: 80 layers, 8 KV heads, head_dim 128"},
    {"llama3.1-405b", 126, 8, 128, 2, 405.9e9, 405.9e9, 128, 0, 0, 0, 0,
     "Llama-3.1-405B config.json: 126 layers, 8 KV heads, head_dim 128"},
    {"qwen2.5-7b", 28, 4, 128, 2, 7.62e9, 7.62e9, 28, 0, 0, 0, 0,
     "Qwen2.5-7B config.json: 28 layers, 4 KV heads, 3584/28 = 128"},
    {"qwen2.5-72b", 80, 8, 128, 2, 72.7e9, 72.7e9, 64, 0, 0, 0, 0,
     "Qwen2.5-72B config.json: 80 layers, 8 KV heads, 8192/64 = 128"},
    {"mixtral-8x7b", 32, 8, 128, 2, 46.7e9, 12.9e9, 32, 0, 0, 0, 0,
     "Mixtral-8x7B config.json: 32 layers, 8 KV heads, 128; 12.9B active"},
    {"deepseek-v3", 61, 0, 128, 2, 671e9, 37e9, 128, 192, 128, 512, 64,
     "DeepSeek-V3 config.json: 61 layers, MLA kv_lora_rank 512 + "
     "qk_rope_head_dim 64 cached per layer; 37B of 671B active"},
};

#define KVF_CALC_NPRESETS                                                      \
    (sizeof(kvf_calc_preset_table) / sizeof(kvf_calc_preset_table[0]))

const kvf_calc_model_t *kvf_calc_presets(size_t *count_p)
{
    *count_p = KVF_CALC_NPRESETS;
    return kvf_calc_preset_table;
}

const kvf_calc_model_t *kvf_calc_preset(const char *name)
{
    size_t i;

    if (name == NULL) {
        return NULL;
    }
    for (i = 0; i < KVF_CALC_NPRESETS; i++) {
        if (strcasecmp(kvf_calc_preset_table[i].name, name) == 0) {
            return &kvf_calc_preset_table[i];
        }
    }
    return NULL;
}

void kvf_calc_inputs_default(kvf_calc_inputs_t *in)
{
    memset(in, 0, sizeof(*in));
    in->tokens = 32768;
    in->gpus = 8;
    in->tflops = 989;
    in->util = 0.5;
    in->link_gbs = 46;
    in->links = 1;
    in->h2d_gbs = 50;
    in->query_s = 0.005;
    in->sync_s = 0.005;
}

static int kvf_calc_pos(double v)
{
    return isfinite(v) && v > 0;
}

static int kvf_calc_nonneg(double v)
{
    return isfinite(v) && v >= 0;
}

kvf_status_t kvf_calc_check(const kvf_calc_model_t *m,
                            const kvf_calc_inputs_t *in, const char **why_p)
{
    const char *why = NULL;

    if (m->layers == 0 || m->layers > 10000) {
        why = "layers must be 1..10000";
    } else if (m->mla_rank == 0 && (m->kv_heads == 0 || m->head_dim == 0)) {
        why = "kv heads and head dim must be positive (or give an MLA rank)";
    } else if (m->kv_heads > 100000 || m->head_dim > 100000 ||
               m->mla_rank > 1000000 || m->mla_rope > 1000000) {
        why = "model dimensions out of range";
    } else if (!kvf_calc_pos(m->bytes) || m->bytes > 64) {
        why = "bytes per element must be in (0, 64]";
    } else if (!kvf_calc_pos(m->params_active)) {
        why = "parameter count must be positive";
    } else if (!kvf_calc_nonneg(in->tokens) || in->tokens > 1e12) {
        why = "tokens must be in 0..1e12";
    } else if (in->gpus == 0 || in->gpus > 1000000) {
        why = "gpus must be 1..1000000";
    } else if (!kvf_calc_pos(in->tflops)) {
        why = "TFLOPS per GPU must be positive";
    } else if (!kvf_calc_pos(in->util) || in->util > 1) {
        why = "utilisation must be in (0, 1]";
    } else if (!kvf_calc_pos(in->link_gbs) || in->links == 0 ||
               in->links > 100000) {
        why = "link bandwidth must be positive and links 1..100000";
    } else if (!kvf_calc_pos(in->h2d_gbs)) {
        why = "H2D bandwidth must be positive";
    } else if (!kvf_calc_nonneg(in->query_s) || !kvf_calc_nonneg(in->sync_s)) {
        why = "overheads must be zero or positive";
    } else if (in->attention && m->q_heads == 0) {
        why = "the attention term needs the number of attention heads";
    }
    if (why != NULL) {
        if (why_p != NULL) {
            *why_p = why;
        }
        return KVF_ERR_INVALID_PARAM;
    }
    return KVF_OK;
}

double kvf_calc_kv_bytes_per_token(const kvf_calc_model_t *m)
{
    if (m->mla_rank > 0) {
        return (double)m->layers * ((double)m->mla_rank + m->mla_rope) *
               m->bytes;
    }
    return 2.0 * m->layers * m->kv_heads * m->head_dim * m->bytes;
}

/* Load time = fixed + per_token x tokens. */
static double kvf_calc_load_per_token(const kvf_calc_model_t *m,
                                      const kvf_calc_inputs_t *in)
{
    double kv = kvf_calc_kv_bytes_per_token(m);
    double net = kv / (in->links * in->link_gbs * 1e9);
    double h2d = kv / (in->gpus * in->h2d_gbs * 1e9);

    if (in->overlap) {
        return net > h2d ? net : h2d;
    }
    return net + h2d;
}

double kvf_calc_load_s(const kvf_calc_model_t *m, const kvf_calc_inputs_t *in,
                       double tokens)
{
    return in->query_s + in->sync_s + kvf_calc_load_per_token(m, in) * tokens;
}

/* Recompute time = lin x tokens + quad x tokens^2. */
static void kvf_calc_recompute_coef(const kvf_calc_model_t *m,
                                    const kvf_calc_inputs_t *in, double *lin,
                                    double *quad)
{
    double rate = in->gpus * in->tflops * 1e12 * in->util;
    double qk = m->qk_dim ? m->qk_dim : m->head_dim;
    double v = m->v_dim ? m->v_dim : m->head_dim;

    *lin = 2.0 * m->params_active / rate;
    *quad = 0;
    if (in->attention) {
        *quad = (double)m->layers * m->q_heads * (qk + v) / rate;
    }
}

double kvf_calc_recompute_s(const kvf_calc_model_t *m,
                            const kvf_calc_inputs_t *in, double tokens)
{
    double lin, quad;

    kvf_calc_recompute_coef(m, in, &lin, &quad);
    return lin * tokens + quad * tokens * tokens;
}

/*
 * Loading wins where fixed + a n < c n + d n^2, i.e. g(n) = d n^2 +
 * (c - a) n - fixed > 0. The break-even is g's non-negative root; the
 * form 2F / (b + sqrt(b^2 + 4dF)) avoids cancellation when b = c - a > 0.
 */
static int kvf_calc_breakeven(double fixed, double a, double c, double d,
                              double *n_p)
{
    double b = c - a;
    double disc;

    if (d <= 0) {
        if (b <= 0) {
            return 0; /* each token loads slower than it recomputes */
        }
        *n_p = fixed / b;
        return 1;
    }
    disc = sqrt(b * b + 4.0 * d * fixed);
    if (b > 0) {
        *n_p = 2.0 * fixed / (b + disc);
    } else {
        *n_p = (disc - b) / (2.0 * d);
    }
    return 1;
}

kvf_status_t kvf_calc_run(const kvf_calc_model_t *m,
                          const kvf_calc_inputs_t *in, kvf_calc_result_t *res_p)
{
    kvf_calc_result_t r;
    double lin, quad;
    kvf_status_t status;

    status = kvf_calc_check(m, in, NULL);
    if (status != KVF_OK) {
        return status;
    }
    memset(&r, 0, sizeof(r));
    r.kv_bytes_per_token = kvf_calc_kv_bytes_per_token(m);
    r.prefix_bytes = r.kv_bytes_per_token * in->tokens;
    r.net_s = r.prefix_bytes / (in->links * in->link_gbs * 1e9);
    r.h2d_s = r.prefix_bytes / in->gpus / (in->h2d_gbs * 1e9);
    r.fixed_s = in->query_s + in->sync_s;
    r.load_s = kvf_calc_load_s(m, in, in->tokens);
    kvf_calc_recompute_coef(m, in, &lin, &quad);
    r.recompute_s = kvf_calc_recompute_s(m, in, in->tokens);
    r.recompute_flops = 2.0 * m->params_active * in->tokens;
    if (quad > 0) {
        r.recompute_flops += quad * in->gpus * in->tflops * 1e12 * in->util *
                             in->tokens * in->tokens;
    }
    r.speedup = r.load_s > 0 ? r.recompute_s / r.load_s : INFINITY;
    r.load_wins = r.load_s < r.recompute_s;
    r.has_breakeven =
        kvf_calc_breakeven(r.fixed_s, kvf_calc_load_per_token(m, in), lin, quad,
                           &r.breakeven_tokens);
    *res_p = r;
    return KVF_OK;
}
