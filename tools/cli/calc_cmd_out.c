/*
 * `kvferry calc` output: the fixed-column table (inputs with their
 * sources, results, a sweep over prefix lengths), the JSON of --json, and
 * the data the interactive page (--html) is prefilled with.
 */
#include "tools/cli/calc_cmd.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

const kvf_calc_in_desc_t kvf_calc_in_desc[KVF_IN_COUNT] = {
    {"tokens", "prefix tokens", "tokens"},
    {"gpus", "GPUs", "GPUs"},
    {"tflops", "TFLOPS per GPU", "TFLOPS"},
    {"util", "utilisation", "fraction"},
    {"link_gbs", "link bandwidth", "GB/s"},
    {"links", "links", "links"},
    {"h2d_gbs", "H2D per GPU", "GB/s"},
    {"query_ms", "query overhead", "ms"},
    {"sync_ms", "sync overhead", "ms"},
    {"overlap", "network/H2D overlap", "bool"},
    {"attention", "attention FLOPs", "bool"},
};

void kvf_calc_list(const kvf_calc_state_t *st)
{
    const kvf_calc_model_t *p;
    size_t i, n;

    p = kvf_calc_presets(&n);
    printf("presets:\n");
    for (i = 0; i < n; i++) {
        printf("  %-14s %6.1f KiB/token  %s\n", p[i].name,
               kvf_calc_kv_bytes_per_token(&p[i]) / 1024, p[i].about);
    }
    printf("\nreference figures (%s):\n", st->refs.origin);
    printf("  %-26s %9s %-7s %-24s %s\n", "id", "value", "unit", "kind",
           "what");
    for (i = 0; i < st->refs.n; i++) {
        const kvf_calc_ref_t *r = &st->refs.items[i];

        printf("  %-26s %9g %-7s %-24s %s\n", r->id, r->value, r->unit, r->kind,
               r->what);
    }
}

double kvf_calc_in_value(const kvf_calc_inputs_t *in, int i)
{
    switch (i) {
    case KVF_IN_TOKENS:
        return in->tokens;
    case KVF_IN_GPUS:
        return in->gpus;
    case KVF_IN_TFLOPS:
        return in->tflops;
    case KVF_IN_UTIL:
        return in->util;
    case KVF_IN_LINK:
        return in->link_gbs;
    case KVF_IN_LINKS:
        return in->links;
    case KVF_IN_H2D:
        return in->h2d_gbs;
    case KVF_IN_QUERY:
        return in->query_s * 1e3;
    case KVF_IN_SYNC:
        return in->sync_s * 1e3;
    case KVF_IN_OVERLAP:
        return in->overlap;
    default:
        return in->attention;
    }
}

static json_t *kvf_calc_model_json(const kvf_calc_model_t *m,
                                   const char *source)
{
    json_t *o = json_pack(
        "{s:s, s:i, s:i, s:i, s:f, s:f, s:f, s:i, s:i, s:i, s:i, s:i}", "name",
        m->name, "layers", (json_int_t)m->layers, "kv_heads",
        (json_int_t)m->kv_heads, "head_dim", (json_int_t)m->head_dim, "bytes",
        m->bytes, "params_total", m->params_total, "params_active",
        m->params_active, "q_heads", (json_int_t)m->q_heads, "qk_dim",
        (json_int_t)m->qk_dim, "v_dim", (json_int_t)m->v_dim, "mla_rank",
        (json_int_t)m->mla_rank, "mla_rope", (json_int_t)m->mla_rope);

    if (o != NULL && source != NULL) {
        json_object_set_new(o, "source", json_string(source));
    }
    if (o != NULL && m->about != NULL) {
        json_object_set_new(o, "about", json_string(m->about));
    }
    return o;
}

/* The whole calculation as JSON; also the page's data. */
json_t *kvf_calc_json(const kvf_calc_state_t *st, const kvf_calc_result_t *r)
{
    json_t *root = json_object(), *ins = json_object(), *res;
    int i;

    json_object_set_new(root, "schema", json_string("kvferry-calc/1"));
    json_object_set_new(root, "model",
                        kvf_calc_model_json(&st->model, st->model_src));
    for (i = 0; i < KVF_IN_COUNT; i++) {
        json_t *v = (i == KVF_IN_OVERLAP || i == KVF_IN_ATTN)
                        ? json_boolean(kvf_calc_in_value(&st->in, i) != 0)
                        : json_real(kvf_calc_in_value(&st->in, i));

        json_object_set_new(ins, kvf_calc_in_desc[i].key,
                            json_pack("{s:o, s:s, s:s}", "value", v, "unit",
                                      kvf_calc_in_desc[i].unit, "source",
                                      st->src[i]));
    }
    json_object_set_new(root, "inputs", ins);
    res = json_pack(
        "{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:s}", "kv_bytes_per_token",
        r->kv_bytes_per_token, "prefix_bytes", r->prefix_bytes, "net_s",
        r->net_s, "h2d_s", r->h2d_s, "fixed_s", r->fixed_s, "load_s", r->load_s,
        "recompute_flops", r->recompute_flops, "recompute_s", r->recompute_s,
        "verdict", r->load_wins ? "load" : "recompute");
    json_object_set_new(res, "speedup",
                        isfinite(r->speedup) ? json_real(r->speedup)
                                             : json_null());
    json_object_set_new(res, "breakeven_tokens",
                        r->has_breakeven ? json_real(r->breakeven_tokens)
                                         : json_null());
    json_object_set_new(root, "results", res);
    json_object_set(root, "used", st->used);
    return root;
}

/* "10.00 GiB (10.74 GB)" */
static const char *kvf_calc_bytes(char *buf, size_t len, double b)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = b;
    int u = 0;

    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (b >= 1e9) {
        snprintf(buf, len, "%.2f %s (%.2f GB)", v, units[u], b / 1e9);
    } else if (b >= 1e6) {
        snprintf(buf, len, "%.2f %s (%.1f MB)", v, units[u], b / 1e6);
    } else {
        snprintf(buf, len, "%.2f %s (%.0f B)", v, units[u], b);
    }
    return buf;
}

static const char *kvf_calc_secs(char *buf, size_t len, double s)
{
    if (s >= 1) {
        snprintf(buf, len, "%.3f s", s);
    } else if (s >= 1e-3) {
        snprintf(buf, len, "%.2f ms", s * 1e3);
    } else {
        snprintf(buf, len, "%.1f us", s * 1e6);
    }
    return buf;
}

void kvf_calc_print(const kvf_calc_state_t *st, const kvf_calc_result_t *r)
{
    const kvf_calc_model_t *m = &st->model;
    char a[64], b[64];
    double n;
    int i;

    printf("kvferry calc: load the KV cache of a prefix, or recompute it?\n\n");
    if (m->mla_rank > 0) {
        printf("model   %s: %u layers x MLA (%u + %u) x %g B, %.4gB params "
               "per token\n",
               m->name, m->layers, m->mla_rank, m->mla_rope, m->bytes,
               m->params_active / 1e9);
    } else {
        printf("model   %s: %u layers x %u KV heads x %u dims x %g B, %.4gB "
               "params per token\n",
               m->name, m->layers, m->kv_heads, m->head_dim, m->bytes,
               m->params_active / 1e9);
    }
    printf("        source: %s\n\n", st->model_src);
    printf("%-20s %12s %-8s %s\n", "input", "value", "unit", "source");
    for (i = 0; i < KVF_IN_COUNT; i++) {
        double v = kvf_calc_in_value(&st->in, i);

        if (i == KVF_IN_OVERLAP || i == KVF_IN_ATTN) {
            printf("%-20s %12s %-8s %s\n", kvf_calc_in_desc[i].label,
                   v != 0 ? "yes" : "no", "", st->src[i]);
        } else {
            printf("%-20s %12.6g %-8s %s\n", kvf_calc_in_desc[i].label, v,
                   kvf_calc_in_desc[i].unit, st->src[i]);
        }
    }
    printf("\n%-28s %s\n", "result", "value");
    printf("%-28s %s\n", "KV per token",
           kvf_calc_bytes(a, sizeof(a), r->kv_bytes_per_token));
    printf("%-28s %s\n", "KV of the prefix",
           kvf_calc_bytes(a, sizeof(a), r->prefix_bytes));
    snprintf(b, sizeof(b), "network, serial (%u link%s)", st->in.links,
             st->in.links == 1 ? "" : "s");
    printf("%-28s %s\n", b, kvf_calc_secs(a, sizeof(a), r->net_s));
    snprintf(b, sizeof(b), "H2D, parallel (%u GPU%s)", st->in.gpus,
             st->in.gpus == 1 ? "" : "s");
    printf("%-28s %s\n", b, kvf_calc_secs(a, sizeof(a), r->h2d_s));
    printf("%-28s %s\n", "fixed (query + sync)",
           kvf_calc_secs(a, sizeof(a), r->fixed_s));
    printf("%-28s %s (%s)\n", "load", kvf_calc_secs(a, sizeof(a), r->load_s),
           st->in.overlap ? "fixed + max(network, H2D)"
                          : "fixed + network + H2D");
    printf("%-28s %.3g FLOP\n", "recompute work", r->recompute_flops);
    printf("%-28s %s\n", "recompute",
           kvf_calc_secs(a, sizeof(a), r->recompute_s));
    if (r->load_wins) {
        printf("%-28s load: %.2fx faster than recompute (saves %s)\n",
               "verdict", r->speedup,
               kvf_calc_secs(a, sizeof(a), r->recompute_s - r->load_s));
    } else {
        printf("%-28s recompute: loading takes %.2fx as long (%s more)\n",
               "verdict", r->load_s / r->recompute_s,
               kvf_calc_secs(a, sizeof(a), r->load_s - r->recompute_s));
    }
    if (r->has_breakeven) {
        printf("%-28s %.0f tokens (loading wins above it)\n",
               "break-even prefix", ceil(r->breakeven_tokens));
    } else {
        printf("%-28s none: each token loads slower than it recomputes\n",
               "break-even prefix");
    }
    printf("\n%10s %12s %12s %8s  %s\n", "tokens", "load", "recompute", "ratio",
           "faster");
    for (n = 256; n <= 131072 * 2; n *= 2) {
        double l = kvf_calc_load_s(m, &st->in, n);
        double c = kvf_calc_recompute_s(m, &st->in, n);

        printf("%10.0f %12s %12s %8.2f  %s\n", n,
               kvf_calc_secs(a, sizeof(a), l), kvf_calc_secs(b, sizeof(b), c),
               c / l, l < c ? "load" : "recompute");
    }
    if (json_array_size(st->used) == 0) {
        printf("\nAll figures are public estimates (seed 003 §2.4); replace "
               "them with measured ones: --from-record FILE.\n");
    }
}

json_t *kvf_calc_page_data(const kvf_calc_state_t *st,
                           const kvf_calc_result_t *r)
{
    json_t *root = kvf_calc_json(st, r), *presets = json_array();
    json_t *refs = json_array();
    const kvf_calc_model_t *p;
    size_t i, n;

    p = kvf_calc_presets(&n);
    for (i = 0; i < n; i++) {
        json_array_append_new(presets, kvf_calc_model_json(&p[i], NULL));
    }
    for (i = 0; i < st->refs.n; i++) {
        const kvf_calc_ref_t *f = &st->refs.items[i];

        json_array_append_new(
            refs,
            json_pack("{s:s, s:s, s:f, s:s, s:s, s:s, s:s}", "id", f->id,
                      "what", f->what, "value", f->value, "unit", f->unit,
                      "kind", f->kind, "use", f->use, "source", f->source));
    }
    json_object_set_new(root, "presets", presets);
    json_object_set_new(root, "references", refs);
    json_object_set_new(root, "references_origin",
                        json_string(st->refs.origin));
    return root;
}

int kvf_calc_dump(json_t *j, const char *path)
{
    int rc;

    if (strcmp(path, "-") == 0) {
        rc = json_dumpf(j, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
        fputc('\n', stdout);
    } else {
        rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    }
    if (rc != 0) {
        fprintf(stderr, "kvferry calc: cannot write JSON to %s\n", path);
        return KVF_CLI_FAIL;
    }
    return KVF_CLI_OK;
}
