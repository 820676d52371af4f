/*
 * `kvferry calc`: the break-even calculator of seed 003 §2.4. Is loading a
 * prefix's KV cache from elsewhere faster than recomputing its prefill?
 *
 * Inputs come, in rising precedence, from the defaults (the seed's worked
 * example: LLaMA3-70B, 32K tokens, 8 x 989 TFLOPS at 50 %, one 46 GB/s
 * link, 50 GB/s H2D), a model preset (--model), public reference figures
 * (--ref / --gpu-ref / --link-ref / --h2d-ref, data/reference.json),
 * measured records (--from-record) and plain flags; the output names the
 * source of every input. Prints a table (plus a sweep over prefix
 * lengths), --json, or with --html FILE the interactive page
 * (tools/calc/calc.html) prefilled with the same inputs.
 *
 * The model itself is tools/calc/calc.c; output is in calc_cmd_out.c.
 */
#include "tools/cli/calc_cmd.h"
#include "tools/cli/opts.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A number with an optional suffix: binary (K = 1024) for token counts,
 * decimal (K = 1e3, B = G = 1e9) otherwise; "%" divides by 100. */
static double kvf_calc_num(const char *flag, const char *text, int binary,
                           double min, double max)
{
    double v, mul = 1;
    char *end;

    errno = 0;
    v = strtod(text, &end);
    if (end != text && *end != '\0' && end[1] == '\0') {
        switch (*end) {
        case 'k':
        case 'K':
            mul = binary ? 1024.0 : 1e3;
            end++;
            break;
        case 'm':
        case 'M':
            mul = binary ? 1048576.0 : 1e6;
            end++;
            break;
        case 'b':
        case 'B':
        case 'g':
        case 'G':
            mul = 1e9;
            end++;
            break;
        case 't':
        case 'T':
            mul = 1e12;
            end++;
            break;
        case '%':
            mul = 0.01;
            end++;
            break;
        default:
            break;
        }
    }
    v *= mul;
    if (errno != 0 || end == text || *end != '\0' || !isfinite(v) || v < min ||
        v > max) {
        fprintf(stderr, "kvferry calc: %s: '%s' is not a number in %g..%g\n",
                flag, text, min, max);
        exit(KVF_CLI_USAGE);
    }
    return v;
}

static void kvf_calc_set_src(kvf_calc_state_t *st, int i, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void kvf_calc_set_src(kvf_calc_state_t *st, int i, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(st->src[i], sizeof(st->src[i]), fmt, ap);
    va_end(ap);
}

static void kvf_calc_note_model(kvf_calc_state_t *st, const char *flag)
{
    size_t n = strlen(st->model_src);

    snprintf(st->model_src + n, sizeof(st->model_src) - n, "; %s", flag);
}

/* Applies a reference figure to the input named by use. */
static int kvf_calc_apply_ref(kvf_calc_state_t *st, const char *id,
                              const char *use, const char *flag)
{
    const kvf_calc_ref_t *r = kvf_calc_refs_find(&st->refs, id);
    int idx;

    if (r == NULL) {
        fprintf(stderr,
                "kvferry calc: %s: no reference figure '%s' "
                "(kvferry calc --list)\n",
                flag, id);
        return -1;
    }
    if (use == NULL) {
        use = r->use;
    }
    if (strcmp(use, "tflops") == 0 && strcmp(r->unit, "TFLOPS") == 0) {
        st->in.tflops = r->value;
        idx = KVF_IN_TFLOPS;
    } else if ((strcmp(use, "link_gbs") == 0 || strcmp(use, "h2d_gbs") == 0) &&
               kvf_calc_unit_gbs(r->unit, r->value,
                                 strcmp(use, "link_gbs") == 0
                                     ? &st->in.link_gbs
                                     : &st->in.h2d_gbs)) {
        idx = strcmp(use, "link_gbs") == 0 ? KVF_IN_LINK : KVF_IN_H2D;
    } else {
        fprintf(stderr,
                "kvferry calc: %s: figure '%s' (%g %s) cannot "
                "feed %s\n",
                flag, r->id, r->value, r->unit,
                use[0] ? use : "any input (it has no 'use')");
        return -1;
    }
    kvf_calc_set_src(st, idx, "reference %s (%s: %s)", r->id, r->kind,
                     r->source);
    json_array_append_new(st->used,
                          json_pack("{s:s, s:s, s:s, s:f, s:s, s:s, s:s}",
                                    "type", "reference", "id", r->id, "what",
                                    r->what, "value", r->value, "unit", r->unit,
                                    "kind", r->kind, "source", r->source));
    return 0;
}

static int kvf_calc_apply_record(kvf_calc_state_t *st, const char *arg)
{
    const char *role = NULL, *path = arg;
    kvf_calc_measured_t m;
    char err[512];
    int idx;

    if (strncmp(arg, "link=", 5) == 0) {
        role = "link";
        path = arg + 5;
    } else if (strncmp(arg, "h2d=", 4) == 0) {
        role = "h2d";
        path = arg + 4;
    }
    if (kvf_calc_record_read(path, role, &m, err, sizeof(err)) != KVF_OK) {
        fprintf(stderr, "kvferry calc: --from-record: %s\n", err);
        return -1;
    }
    if (strcmp(m.role, "h2d") == 0) {
        st->in.h2d_gbs = m.gbs;
        idx = KVF_IN_H2D;
    } else {
        st->in.link_gbs = m.gbs;
        idx = KVF_IN_LINK;
    }
    kvf_calc_set_src(st, idx, "record %s: '%s' of %s %s", path, m.figure,
                     m.record, m.date);
    json_array_append_new(
        st->used,
        json_pack("{s:s, s:s, s:s, s:s, s:f, s:s, s:s}", "type", "record",
                  "file", path, "record", m.record, "figure", m.figure, "gbs",
                  m.gbs, "input", kvf_calc_in_desc[idx].key, "date", m.date));
    return 0;
}

/* Model fields a flag can override. */
enum {
    KVF_MF_LAYERS,
    KVF_MF_KV_HEADS,
    KVF_MF_HEAD_DIM,
    KVF_MF_BYTES,
    KVF_MF_PARAMS,
    KVF_MF_Q_HEADS,
    KVF_MF_MLA_RANK,
    KVF_MF_MLA_ROPE,
    KVF_MF_COUNT
};

/* Numeric flags: a code, the slot the value goes to (an input, or
 * KVF_CALC_MF + a model field), binary suffixes, range. */
#define KVF_CALC_MF  100
#define KVF_CLI_HELP -1 /* kvf_calc_parse: --help was printed */
static const struct {
    int code;
    const char *flag;
    int slot;
    int binary;
    double min, max;
} kvf_calc_numflags[] = {
    {'L', "--layers", KVF_CALC_MF + KVF_MF_LAYERS, 0, 1, 1e4},
    {'K', "--kv-heads", KVF_CALC_MF + KVF_MF_KV_HEADS, 0, 0, 1e5},
    {'D', "--head-dim", KVF_CALC_MF + KVF_MF_HEAD_DIM, 0, 1, 1e5},
    {'B', "--bytes", KVF_CALC_MF + KVF_MF_BYTES, 0, 0.01, 64},
    {'P', "--params", KVF_CALC_MF + KVF_MF_PARAMS, 0, 1, 1e16},
    {'Q', "--q-heads", KVF_CALC_MF + KVF_MF_Q_HEADS, 0, 1, 1e5},
    {'A', "--mla-rank", KVF_CALC_MF + KVF_MF_MLA_RANK, 0, 0, 1e6},
    {'E', "--mla-rope", KVF_CALC_MF + KVF_MF_MLA_ROPE, 0, 0, 1e6},
    {'t', "--tokens", KVF_IN_TOKENS, 1, 0, 1e12},
    {'g', "--gpus", KVF_IN_GPUS, 0, 1, 1e6},
    {'f', "--tflops", KVF_IN_TFLOPS, 0, 1e-6, 1e9},
    {'u', "--util", KVF_IN_UTIL, 0, 1e-6, 100},
    {'l', "--link-gbs", KVF_IN_LINK, 0, 1e-9, 1e9},
    {'n', "--links", KVF_IN_LINKS, 0, 1, 1e5},
    {'d', "--h2d-gbs", KVF_IN_H2D, 0, 1e-9, 1e9},
    {'q', "--query-ms", KVF_IN_QUERY, 0, 0, 1e9},
    {'s', "--sync-ms", KVF_IN_SYNC, 0, 0, 1e9},
};

/* Flags seen on the command line, applied after presets, refs, records. */
typedef struct kvf_calc_flags {
    const char *model;
    const char *ref_file;
    const char *json; /* "-" = stdout */
    const char *html;
    int list;
    double mf[KVF_MF_COUNT]; /* model overrides; < 0 = not given */
    double in[KVF_IN_COUNT]; /* NAN = not given */
    kvf_calc_op_t ops[KVF_CALC_MAX_OPS];
    int nops;
} kvf_calc_flags_t;

/* The flags being parsed (the option table's callbacks fill them). */
static kvf_calc_flags_t *kvf_calc_fl;

/* A numeric flag (kvf_calc_numflags). */
static int kvf_calc_numopt(const kvf_opt_t *opt, const char *arg)
{
    kvf_calc_flags_t *fl = kvf_calc_fl;
    size_t i;
    double v;
    int c = 0;

    for (i = 0; i < sizeof(kvf_calc_numflags) / sizeof(kvf_calc_numflags[0]);
         i++) {
        if (strcmp(kvf_calc_numflags[i].flag + 2, opt->name) != 0) {
            continue;
        }
        c = kvf_calc_numflags[i].code;
        v = kvf_calc_num(kvf_calc_numflags[i].flag, arg,
                         kvf_calc_numflags[i].binary, kvf_calc_numflags[i].min,
                         kvf_calc_numflags[i].max);
        if (c == 'u' && v > 1 && strchr(arg, '%') == NULL) {
            v /= 100; /* "--util 50" means 50 % */
        }
        if (kvf_calc_numflags[i].slot >= KVF_CALC_MF) {
            fl->mf[kvf_calc_numflags[i].slot - KVF_CALC_MF] = v;
        } else {
            fl->in[kvf_calc_numflags[i].slot] = v;
        }
        return 0;
    }
    return -1;
}

/* --ref, --gpu-ref, --link-ref, --h2d-ref, --from-record, applied in
 * order after presets. */
static int kvf_calc_addop(const kvf_opt_t *opt, const char *arg)
{
    static const struct {
        const char *name;
        int kind;
    } kinds[] = {{"ref", 'r'},
                 {"gpu-ref", 'G'},
                 {"link-ref", 'N'},
                 {"h2d-ref", 'H'},
                 {"from-record", 'R'}};
    kvf_calc_flags_t *fl = kvf_calc_fl;
    size_t i;

    if (fl->nops == KVF_CALC_MAX_OPS) {
        fprintf(stderr, "kvferry calc: at most %d --ref/--from-record\n",
                KVF_CALC_MAX_OPS);
        return -1;
    }
    for (i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        if (strcmp(kinds[i].name, opt->name) == 0) {
            fl->ops[fl->nops].kind = kinds[i].kind;
            fl->ops[fl->nops++].arg = arg;
            return 0;
        }
    }
    return -1;
}

/* --json[=FILE]: stdout without a FILE. */
static int kvf_calc_jsonopt(const kvf_opt_t *opt, const char *arg)
{
    (void)opt;
    kvf_calc_fl->json = arg != NULL ? arg : "-";
    return 0;
}

#define KVF_CALC_NUM(name, arg, help, def)                                     \
    {                                                                          \
        name, 0, KVF_OPT_FN, NULL, arg, help, def, .fn = kvf_calc_numopt       \
    }
#define KVF_CALC_OP(name, arg, help)                                           \
    {                                                                          \
        name, 0, KVF_OPT_FN, NULL, arg, help, .fn = kvf_calc_addop             \
    }

static int kvf_calc_parse(int argc, char **argv, kvf_calc_flags_t *fl)
{
    int i, rc, overlap = 0, attention = 0;
    const kvf_opt_t opts[] = {
        {"", 0, 0, NULL, NULL, "model:", .flags = KVF_OPT_HEADING},
        {"model", 0, KVF_OPT_STR, &fl->model, "NAME",
         "preset (--list shows all)", "llama3-70b"},
        {"preset", 0, KVF_OPT_STR, &fl->model, "NAME", "same as --model",
         .flags = KVF_OPT_HIDDEN},
        KVF_CALC_NUM("layers", "N", "layers", "the preset's"),
        KVF_CALC_NUM("kv-heads", "N", "KV heads", "the preset's"),
        KVF_CALC_NUM("head-dim", "N", "head dimension", "the preset's"),
        KVF_CALC_NUM("bytes", "X", "bytes per element", "the preset's"),
        KVF_CALC_NUM("params", "X", "parameters used per token (70.6e9, 37B)",
                     "the preset's"),
        KVF_CALC_NUM("q-heads", "N", "attention heads (for --attention)",
                     "the preset's"),
        KVF_CALC_NUM("mla-rank", "N", "MLA latent cache rank (DeepSeek-V3)",
                     "the preset's"),
        KVF_CALC_NUM("mla-rope", "N", "MLA rope dimension", "the preset's"),
        {"", 0, 0, NULL, NULL,
         "deployment (defaults: seed 003 §2.4):", .flags = KVF_OPT_HEADING},
        KVF_CALC_NUM("tokens", "N", "prefix length (32K = 32768)", "32K"),
        KVF_CALC_NUM("gpus", "N", "GPUs", "8"),
        KVF_CALC_NUM("tflops", "X", "dense TFLOPS per GPU", "989"),
        KVF_CALC_NUM("util", "X", "utilisation, 0.5 or 50%", "0.5"),
        KVF_CALC_NUM("link-gbs", "X", "one link, GB/s", "46"),
        KVF_CALC_NUM("links", "N", "links used at once", "1"),
        KVF_CALC_NUM("h2d-gbs", "X", "H2D per GPU, GB/s", "50"),
        KVF_CALC_NUM("query-ms", "X", "metadata query overhead", "5"),
        KVF_CALC_NUM("sync-ms", "X", "synchronisation overhead", "5"),
        {"overlap", 0, KVF_OPT_FLAG, &overlap, NULL,
         "network and H2D pipelined"},
        {"attention", 0, KVF_OPT_FLAG, &attention, NULL,
         "add the attention FLOPs to the recompute"},
        {"", 0, 0, NULL, NULL, "inputs from data:", .flags = KVF_OPT_HEADING},
        KVF_CALC_OP("ref", "ID",
                    "a reference figure, applied where its 'use' says"),
        KVF_CALC_OP("gpu-ref", "ID", "TFLOPS from a reference figure"),
        KVF_CALC_OP("link-ref", "ID", "link GB/s from a reference figure"),
        KVF_CALC_OP("h2d-ref", "ID", "H2D GB/s from a reference figure"),
        {"ref-file", 0, KVF_OPT_STR, &fl->ref_file, "FILE", "reference figures",
         "built in"},
        KVF_CALC_OP("from-record", "[link=|h2d=]FILE",
                    "best GB/s figure of a record"),
        {"", 0, 0, NULL, NULL, "output:", .flags = KVF_OPT_HEADING},
        {"json", 0, KVF_OPT_FN, NULL, "FILE", "JSON to stdout (or FILE)",
         .flags = KVF_OPT_OPTVALUE, .fn = kvf_calc_jsonopt},
        {"html", 0, KVF_OPT_STR, &fl->html, "FILE",
         "interactive page, prefilled"},
        {"list", 0, KVF_OPT_FLAG, &fl->list, NULL,
         "presets and reference figures"},
        {0},
    };
    const kvf_cmd_spec_t spec = {
        "kvferry calc [options]",
        "Load a prefix's KV cache, or recompute it? (seed 003 §2.4)", opts};

    memset(fl, 0, sizeof(*fl));
    for (i = 0; i < KVF_MF_COUNT; i++) {
        fl->mf[i] = -1;
    }
    for (i = 0; i < KVF_IN_COUNT; i++) {
        fl->in[i] = NAN;
    }
    kvf_calc_fl = fl;
    rc = kvf_opts_parse(&spec, argc, argv, NULL);
    if (rc >= 0) {
        /* --help: the command stops here with success */
        return rc == KVF_CLI_OK ? KVF_CLI_HELP : rc;
    }
    if (overlap) {
        fl->in[KVF_IN_OVERLAP] = 1;
    }
    if (attention) {
        fl->in[KVF_IN_ATTN] = 1;
    }
    return KVF_CLI_OK;
}

/* Applies the model flags, noting each in the model's source. */
static void kvf_calc_model_flags(kvf_calc_state_t *st,
                                 const kvf_calc_flags_t *fl)
{
    static const char *const names[KVF_MF_COUNT] = {
        "--layers", "--kv-heads", "--head-dim", "--bytes",
        "--params", "--q-heads",  "--mla-rank", "--mla-rope"};
    kvf_calc_model_t *m = &st->model;
    int i;

    for (i = 0; i < KVF_MF_COUNT; i++) {
        double v = fl->mf[i];

        if (v < 0) {
            continue;
        }
        kvf_calc_note_model(st, names[i]);
        switch (i) {
        case KVF_MF_LAYERS:
            m->layers = (unsigned)v;
            break;
        case KVF_MF_KV_HEADS:
            m->kv_heads = (unsigned)v;
            break;
        case KVF_MF_HEAD_DIM:
            m->head_dim = (unsigned)v;
            break;
        case KVF_MF_BYTES:
            m->bytes = v;
            break;
        case KVF_MF_PARAMS:
            m->params_active = m->params_total = v;
            break;
        case KVF_MF_Q_HEADS:
            m->q_heads = (unsigned)v;
            break;
        case KVF_MF_MLA_RANK:
            m->mla_rank = (unsigned)v;
            break;
        default:
            m->mla_rope = (unsigned)v;
            break;
        }
    }
    if (fl->mf[KVF_MF_KV_HEADS] > 0 && fl->mf[KVF_MF_MLA_RANK] < 0) {
        m->mla_rank = 0; /* --kv-heads on an MLA preset: plain GQA */
        m->mla_rope = 0;
    }
}

static int kvf_calc_setup(kvf_calc_state_t *st, const kvf_calc_flags_t *fl)
{
    const kvf_calc_model_t *preset;
    const char *why = NULL;
    char err[512];
    int i;

    preset = kvf_calc_preset(fl->model != NULL ? fl->model : "llama3-70b");
    if (preset == NULL) {
        fprintf(stderr,
                "kvferry calc: --model: no preset '%s' "
                "(kvferry calc --list)\n",
                fl->model);
        return KVF_CLI_USAGE;
    }
    st->model = *preset;
    snprintf(st->model_src, sizeof(st->model_src), "%s %s (%s)",
             fl->model != NULL ? "preset" : "default preset", preset->name,
             preset->about);
    kvf_calc_model_flags(st, fl);

    kvf_calc_inputs_default(&st->in);
    for (i = 0; i < KVF_IN_COUNT; i++) {
        snprintf(st->src[i], sizeof(st->src[i]), "default (seed 003 §2.4)");
    }
    if (kvf_calc_refs_load(fl->ref_file, &st->refs, err, sizeof(err)) !=
        KVF_OK) {
        fprintf(stderr, "kvferry calc: reference figures: %s\n", err);
        return KVF_CLI_FAIL;
    }
    for (i = 0; i < fl->nops; i++) {
        const kvf_calc_op_t *op = &fl->ops[i];
        int rc;

        if (op->kind == 'R') {
            rc = kvf_calc_apply_record(st, op->arg);
        } else {
            rc = kvf_calc_apply_ref(st, op->arg,
                                    op->kind == 'G'   ? "tflops"
                                    : op->kind == 'N' ? "link_gbs"
                                    : op->kind == 'H' ? "h2d_gbs"
                                                      : NULL,
                                    op->kind == 'G'   ? "--gpu-ref"
                                    : op->kind == 'N' ? "--link-ref"
                                    : op->kind == 'H' ? "--h2d-ref"
                                                      : "--ref");
        }
        if (rc != 0) {
            return KVF_CLI_USAGE;
        }
    }
    for (i = 0; i < KVF_IN_COUNT; i++) {
        double v = fl->in[i];

        if (isnan(v)) {
            continue;
        }
        snprintf(st->src[i], sizeof(st->src[i]), "flag --%s",
                 i == KVF_IN_OVERLAP ? "overlap"
                 : i == KVF_IN_ATTN  ? "attention"
                                     : kvf_calc_in_desc[i].key);
        for (char *p = st->src[i]; *p != '\0'; p++) {
            *p = *p == '_' ? '-' : *p; /* link_gbs -> --link-gbs */
        }
        switch (i) {
        case KVF_IN_TOKENS:
            st->in.tokens = v;
            break;
        case KVF_IN_GPUS:
            st->in.gpus = (unsigned)v;
            break;
        case KVF_IN_TFLOPS:
            st->in.tflops = v;
            break;
        case KVF_IN_UTIL:
            st->in.util = v;
            break;
        case KVF_IN_LINK:
            st->in.link_gbs = v;
            break;
        case KVF_IN_LINKS:
            st->in.links = (unsigned)v;
            break;
        case KVF_IN_H2D:
            st->in.h2d_gbs = v;
            break;
        case KVF_IN_QUERY:
            st->in.query_s = v / 1e3;
            break;
        case KVF_IN_SYNC:
            st->in.sync_s = v / 1e3;
            break;
        case KVF_IN_OVERLAP:
            st->in.overlap = 1;
            break;
        default:
            st->in.attention = 1;
            break;
        }
    }
    if (kvf_calc_check(&st->model, &st->in, &why) != KVF_OK) {
        fprintf(stderr, "kvferry calc: %s\n", why);
        return KVF_CLI_USAGE;
    }
    return KVF_CLI_OK;
}

int kvf_cmd_calc(int argc, char **argv)
{
    kvf_calc_state_t st;
    kvf_calc_flags_t fl;
    kvf_calc_result_t res;
    json_t *j;
    int rc;

    rc = kvf_calc_parse(argc, argv, &fl);
    if (rc != KVF_CLI_OK) {
        return rc == KVF_CLI_HELP ? KVF_CLI_OK : rc;
    }
    memset(&st, 0, sizeof(st));
    st.used = json_array();
    if (st.used == NULL) {
        return KVF_CLI_FAIL;
    }
    rc = kvf_calc_setup(&st, &fl);
    if (rc != KVF_CLI_OK) {
        goto out;
    }
    if (fl.list) {
        kvf_calc_list(&st);
        goto out;
    }
    if (kvf_calc_run(&st.model, &st.in, &res) != KVF_OK) {
        rc = KVF_CLI_FAIL;
        goto out;
    }
    if (fl.html != NULL) {
        j = kvf_calc_page_data(&st, &res);
        if (j == NULL ||
            kvf_calc_page_write(fl.html, kvf_asset_calc_html, j) != 0) {
            rc = KVF_CLI_FAIL;
        } else if (strcmp(fl.html, "-") != 0) {
            fprintf(stderr, "kvferry calc: wrote %s\n", fl.html);
        }
        json_decref(j);
    }
    if (rc == KVF_CLI_OK && fl.json != NULL) {
        j = kvf_calc_json(&st, &res);
        rc = j != NULL ? kvf_calc_dump(j, fl.json) : KVF_CLI_FAIL;
        json_decref(j);
    }
    if (rc == KVF_CLI_OK && fl.html == NULL &&
        (fl.json == NULL || strcmp(fl.json, "-") != 0)) {
        kvf_calc_print(&st, &res);
    }
out:
    kvf_calc_refs_free(&st.refs);
    json_decref(st.used);
    return rc;
}
