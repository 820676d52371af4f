/*
 * Unit test of the break-even model (tools/calc/calc.c) and its data
 * (tools/calc/calc_data.c): seed 003 §2.4's worked example figure by
 * figure, the 1K-token case where the gain shrinks or turns negative, the
 * closed-form break-even against the definition, MLA (DeepSeek-V3), input
 * checks, the embedded reference figures (every one labelled by kind),
 * and reading the best throughput figure of a record.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/calc/calc.h"
#include "tools/calc/calc_data.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static void assert_near(double got, double want, double tol)
{
    if (!(fabs(got - want) <= tol)) {
        fail_msg("got %.9g, want %.9g +- %.3g", got, want, tol);
    }
}

static void assert_rel(double got, double want, double rel)
{
    assert_near(got, want, fabs(want) * rel);
}

/* Seed 003 §2.4 uses 70e9 parameters for "LLaMA3-70B class". */
static kvf_calc_model_t seed_model(void)
{
    kvf_calc_model_t m = *kvf_calc_preset("llama3-70b");

    m.params_active = 70e9;
    return m;
}

static void test_worked_example(void **state)
{
    kvf_calc_model_t m = seed_model();
    kvf_calc_inputs_t in;
    kvf_calc_result_t r;

    (void)state;
    kvf_calc_inputs_default(&in);
    assert_int_equal(kvf_calc_run(&m, &in, &r), KVF_OK);
    /* 2 x 80 x 8 x 128 x 2 = 320 KiB per token */
    assert_true(r.kv_bytes_per_token == 320.0 * 1024);
    /* 320 KiB x 32,768 = 10 GiB (about 10.7 GB) */
    assert_true(r.prefix_bytes == 10.0 * GIB);
    assert_near(r.prefix_bytes / 1e9, 10.7, 0.05);
    /* one 400G NIC at 46 GB/s: 10.7 / 46 = 0.23 s */
    assert_near(r.net_s, 0.23, 0.005);
    /* 8 GPUs each receive about 1.34 GB over H2D at 50 GB/s: 0.03 s */
    assert_near(r.prefix_bytes / in.gpus / 1e9, 1.34, 0.005);
    assert_near(r.h2d_s, 0.03, 0.004);
    /* plus query and sync: about 0.3 s in all */
    assert_near(r.fixed_s, 0.010, 1e-12);
    assert_near(r.load_s, 0.3, 0.05);
    /* 2 x 70e9 x 32,768 = 4.6e15 FLOP at 8 x 989 TFLOPS x 50 % =
     * 4.0e15 FLOP/s: 1.2 s */
    assert_near(r.recompute_flops, 4.6e15, 0.05e15);
    assert_near(in.gpus * in.tflops * 1e12 * in.util, 4.0e15, 0.05e15);
    assert_near(r.recompute_s, 1.2, 0.05);
    /* loading is clearly faster */
    assert_true(r.load_wins);
    assert_true(r.speedup > 4);
    assert_true(r.has_breakeven);
    assert_true(r.breakeven_tokens < 1024);
}

static void test_preset_matches_example(void **state)
{
    kvf_calc_inputs_t in;
    kvf_calc_result_t r;

    (void)state;
    kvf_calc_inputs_default(&in);
    assert_int_equal(kvf_calc_run(kvf_calc_preset("LLaMA3-70B"), &in, &r),
                     KVF_OK);
    assert_near(r.recompute_s, 1.2, 0.05); /* 70.6e9 params: 1.17 s */
    assert_near(r.net_s, 0.23, 0.005);
}

/* 1K tokens: KV about 0.3 GiB, recompute tens of ms; fixed overheads
 * take a large share, the gain shrinks, and with larger overheads it
 * turns negative. */
static void test_short_prefix(void **state)
{
    kvf_calc_model_t m = seed_model();
    kvf_calc_inputs_t in;
    kvf_calc_result_t r32k, r1k, r1k_slow;

    (void)state;
    kvf_calc_inputs_default(&in);
    assert_int_equal(kvf_calc_run(&m, &in, &r32k), KVF_OK);
    in.tokens = 1024;
    assert_int_equal(kvf_calc_run(&m, &in, &r1k), KVF_OK);
    assert_near(r1k.prefix_bytes / GIB, 0.3, 0.02);
    assert_true(r1k.recompute_s > 0.010 && r1k.recompute_s < 0.100);
    assert_true(r1k.fixed_s / r1k.load_s > 0.5); /* overheads dominate */
    assert_true(r1k.speedup < r32k.speedup / 2); /* the gain shrinks */
    in.query_s = 0.030;
    in.sync_s = 0.010;
    assert_int_equal(kvf_calc_run(&m, &in, &r1k_slow), KVF_OK);
    assert_false(r1k_slow.load_wins); /* ... and turns negative */
    assert_true(r1k_slow.speedup < 1);
    assert_true(r1k_slow.breakeven_tokens > 1024);
}

/* The closed form against the definition: load(n*) == recompute(n*), and
 * loading wins just above, loses just below. */
static void check_breakeven(const kvf_calc_model_t *m,
                            const kvf_calc_inputs_t *in)
{
    kvf_calc_result_t r;
    double n, l, c;

    assert_int_equal(kvf_calc_run(m, in, &r), KVF_OK);
    assert_true(r.has_breakeven);
    n = r.breakeven_tokens;
    l = kvf_calc_load_s(m, in, n);
    c = kvf_calc_recompute_s(m, in, n);
    assert_rel(l, c, 1e-9);
    assert_true(kvf_calc_load_s(m, in, n * 1.01 + 1) <
                kvf_calc_recompute_s(m, in, n * 1.01 + 1));
    if (n > 2) {
        assert_true(kvf_calc_load_s(m, in, n * 0.99 - 1) >
                    kvf_calc_recompute_s(m, in, n * 0.99 - 1));
    }
}

static void test_breakeven(void **state)
{
    kvf_calc_model_t m = seed_model();
    kvf_calc_inputs_t in;
    kvf_calc_result_t r;

    (void)state;
    kvf_calc_inputs_default(&in);
    check_breakeven(&m, &in);
    in.overlap = 1;
    check_breakeven(&m, &in);
    in.attention = 1;
    check_breakeven(&m, &in);
    /* a link so slow each token loads slower than it recomputes: no
     * break-even without the attention term ... */
    kvf_calc_inputs_default(&in);
    in.link_gbs = 0.5;
    assert_int_equal(kvf_calc_run(&m, &in, &r), KVF_OK);
    assert_false(r.has_breakeven);
    assert_false(r.load_wins);
    /* ... but the quadratic attention term wins in the end */
    in.attention = 1;
    check_breakeven(&m, &in);
    assert_int_equal(kvf_calc_run(&m, &in, &r), KVF_OK);
    assert_true(r.breakeven_tokens > 32768);
    /* no fixed overhead and a fast link: loading always wins */
    kvf_calc_inputs_default(&in);
    in.query_s = in.sync_s = 0;
    assert_int_equal(kvf_calc_run(&m, &in, &r), KVF_OK);
    assert_true(r.has_breakeven);
    assert_near(r.breakeven_tokens, 0, 1e-9);
}

static void test_overlap_and_links(void **state)
{
    kvf_calc_model_t m = seed_model();
    kvf_calc_inputs_t in;
    kvf_calc_result_t a, b;

    (void)state;
    kvf_calc_inputs_default(&in);
    assert_int_equal(kvf_calc_run(&m, &in, &a), KVF_OK);
    assert_rel(a.load_s, a.fixed_s + a.net_s + a.h2d_s, 1e-12);
    in.overlap = 1;
    assert_int_equal(kvf_calc_run(&m, &in, &b), KVF_OK);
    assert_rel(b.load_s, b.fixed_s + fmax(b.net_s, b.h2d_s), 1e-12);
    in.links = 8; /* one NIC per GPU */
    assert_int_equal(kvf_calc_run(&m, &in, &b), KVF_OK);
    assert_rel(b.net_s, a.net_s / 8, 1e-12);
}

static void test_attention_term(void **state)
{
    kvf_calc_model_t m = seed_model();
    kvf_calc_inputs_t in;
    kvf_calc_result_t a, b;
    double attn;

    (void)state;
    kvf_calc_inputs_default(&in);
    assert_int_equal(kvf_calc_run(&m, &in, &a), KVF_OK);
    in.attention = 1;
    assert_int_equal(kvf_calc_run(&m, &in, &b), KVF_OK);
    /* causal: layers x n^2 x heads x (qk + v) = 80 x 32768^2 x 64 x 256 */
    attn = 80.0 * 32768.0 * 32768.0 * 64 * 256;
    assert_rel(b.recompute_flops - a.recompute_flops, attn, 1e-9);
    assert_rel(b.recompute_s - a.recompute_s,
               attn / (in.gpus * in.tflops * 1e12 * in.util), 1e-9);
}

static void test_mla(void **state)
{
    const kvf_calc_model_t *m = kvf_calc_preset("deepseek-v3");
    kvf_calc_inputs_t in;
    kvf_calc_result_t r;

    (void)state;
    assert_non_null(m);
    assert_int_equal(m->layers, 61);
    assert_int_equal(m->mla_rank, 512);
    assert_int_equal(m->mla_rope, 64);
    /* 61 layers x (512 + 64) x 2 bytes */
    assert_true(kvf_calc_kv_bytes_per_token(m) == 61.0 * 576 * 2);
    kvf_calc_inputs_default(&in);
    assert_int_equal(kvf_calc_run(m, &in, &r), KVF_OK);
    /* recompute uses the 37B active parameters, not 671B */
    assert_rel(r.recompute_flops, 2.0 * 37e9 * 32768, 1e-12);
    in.attention = 1;
    assert_int_equal(kvf_calc_run(m, &in, &r), KVF_OK);
    assert_rel(r.recompute_flops,
               2.0 * 37e9 * 32768 + 61.0 * 32768 * 32768 * 128 * (192 + 128),
               1e-12);
}

static void test_presets(void **state)
{
    const kvf_calc_model_t *p;
    kvf_calc_inputs_t in;
    const char *why = NULL;
    size_t i, k, n;

    (void)state;
    kvf_calc_inputs_default(&in);
    in.attention = 1;
    p = kvf_calc_presets(&n);
    assert_true(n >= 5);
    for (i = 0; i < n; i++) {
        assert_int_equal(kvf_calc_check(&p[i], &in, &why), KVF_OK);
        assert_true(p[i].params_active <= p[i].params_total);
        assert_ptr_equal(kvf_calc_preset(p[i].name), &p[i]);
        for (k = 0; k < i; k++) {
            assert_string_not_equal(p[i].name, p[k].name);
        }
    }
    assert_true(kvf_calc_kv_bytes_per_token(kvf_calc_preset("llama3-8b")) ==
                128 * 1024);
    assert_true(kvf_calc_kv_bytes_per_token(kvf_calc_preset("qwen2.5-72b")) ==
                320 * 1024);
    assert_null(kvf_calc_preset("no-such-model"));
    assert_null(kvf_calc_preset(NULL));
}

static void test_check(void **state)
{
    kvf_calc_model_t m = seed_model();
    kvf_calc_inputs_t in;
    kvf_calc_result_t r;
    const char *why = NULL;

    (void)state;
#define BAD(stmt)                                                              \
    do {                                                                       \
        kvf_calc_inputs_default(&in);                                          \
        m = seed_model();                                                      \
        stmt;                                                                  \
        why = NULL;                                                            \
        assert_int_equal(kvf_calc_check(&m, &in, &why),                        \
                         KVF_ERR_INVALID_PARAM);                               \
        assert_non_null(why);                                                  \
        assert_int_equal(kvf_calc_run(&m, &in, &r), KVF_ERR_INVALID_PARAM);    \
    } while (0)
    BAD(in.util = 0);
    BAD(in.util = 1.5);
    BAD(in.gpus = 0);
    BAD(in.tokens = NAN);
    BAD(in.tokens = -1);
    BAD(in.link_gbs = 0);
    BAD(in.links = 0);
    BAD(in.h2d_gbs = INFINITY);
    BAD(in.query_s = -0.001);
    BAD(in.tflops = 0);
    BAD(m.layers = 0);
    BAD(m.kv_heads = 0);
    BAD(m.bytes = 0);
    BAD(m.params_active = 0);
    BAD((in.attention = 1, m.q_heads = 0));
#undef BAD
    kvf_calc_inputs_default(&in);
    m = seed_model();
    in.tokens = 0; /* an empty prefix is fine: nothing to load or compute */
    assert_int_equal(kvf_calc_run(&m, &in, &r), KVF_OK);
    assert_true(r.recompute_s == 0);
    assert_false(r.load_wins);
}

static void test_reference_builtin(void **state)
{
    kvf_calc_refs_t refs;
    const kvf_calc_ref_t *r;
    char err[256] = "";
    int kinds[3] = {0, 0, 0};
    size_t i;

    (void)state;
    assert_int_equal(kvf_calc_refs_load(NULL, &refs, err, sizeof(err)), KVF_OK);
    assert_true(refs.n >= 20);
    for (i = 0; i < refs.n; i++) {
        r = &refs.items[i];
        assert_true(kvf_calc_ref_kind_valid(r->kind));
        kinds[0] += strcmp(r->kind, KVF_REF_KIND_SPEC) == 0;
        kinds[1] += strcmp(r->kind, KVF_REF_KIND_MEASURED) == 0;
        kinds[2] += strcmp(r->kind, KVF_REF_KIND_PROJECT) == 0;
        assert_true(strlen(r->source) > 0);
        if (strcmp(r->use, "tflops") == 0) {
            assert_string_equal(r->unit, "TFLOPS");
        } else if (r->use[0] != '\0') {
            double gbs;

            assert_true(kvf_calc_unit_gbs(r->unit, r->value, &gbs));
        }
    }
    assert_true(kinds[0] > 0 && kinds[1] > 0 && kinds[2] > 0);
    /* the figures of the worked example are there, with their kinds */
    r = kvf_calc_refs_find(&refs, "gpu.h100-sxm.bf16");
    assert_non_null(r);
    assert_true(r->value == 989);
    assert_string_equal(r->kind, KVF_REF_KIND_SPEC);
    r = kvf_calc_refs_find(&refs, "nic.400g.rdma");
    assert_non_null(r);
    assert_true(r->value == 46);
    assert_string_equal(r->kind, KVF_REF_KIND_MEASURED);
    r = kvf_calc_refs_find(&refs, "pcie.gen5x16.h2d");
    assert_non_null(r);
    assert_true(r->value == 50);
    r = kvf_calc_refs_find(&refs, "mooncake.te.8x400g");
    assert_non_null(r);
    assert_true(r->value == 190);
    assert_string_equal(r->kind, KVF_REF_KIND_PROJECT);
    assert_null(kvf_calc_refs_find(&refs, "no.such.figure"));
    kvf_calc_refs_free(&refs);
}

/* The embedded copy is the one in the source tree. */
static void test_reference_file(void **state)
{
    const char *src = getenv("KVF_SRC");
    kvf_calc_refs_t a, b;
    char path[1024], err[256];
    size_t i;

    (void)state;
    if (src == NULL) {
        skip();
    }
    snprintf(path, sizeof(path), "%s/data/reference.json", src);
    assert_int_equal(kvf_calc_refs_load(path, &a, err, sizeof(err)), KVF_OK);
    assert_int_equal(kvf_calc_refs_load(NULL, &b, err, sizeof(err)), KVF_OK);
    assert_int_equal(a.n, b.n);
    for (i = 0; i < a.n; i++) {
        assert_string_equal(a.items[i].id, b.items[i].id);
        assert_true(a.items[i].value == b.items[i].value);
    }
    kvf_calc_refs_free(&a);
    kvf_calc_refs_free(&b);
    assert_int_equal(
        kvf_calc_refs_load("/nonexistent/ref.json", &a, err, sizeof(err)),
        KVF_ERR_IO);
}

static void test_reference_rejects(void **state)
{
    kvf_calc_refs_t refs;
    char err[256];

    (void)state;
#define FIG(k, extra)                                                          \
    "{\"id\":\"a\",\"what\":\"w\",\"value\":1,\"unit\":\"GB/s\","              \
    "\"kind\":\"" k "\",\"source\":\"s\"" extra "}"
    assert_int_equal(
        kvf_calc_refs_parse("{\"figures\":[" FIG("vendor spec", "") "]}", "t",
                            &refs, err, sizeof(err)),
        KVF_OK);
    kvf_calc_refs_free(&refs);
    assert_int_equal(
        kvf_calc_refs_parse("{\"figures\":[" FIG("rumour", "") "]}", "t", &refs,
                            err, sizeof(err)),
        KVF_ERR_INVALID_PARAM);
    assert_non_null(strstr(err, "kind"));
    assert_int_equal(
        kvf_calc_refs_parse("{\"figures\":[" FIG("vendor spec", "") "," FIG(
                                "vendor spec", "") "]}",
                            "t", &refs, err, sizeof(err)),
        KVF_ERR_INVALID_PARAM);
    assert_non_null(strstr(err, "twice"));
    assert_int_equal(
        kvf_calc_refs_parse(
            "{\"figures\":[" FIG("vendor spec", ",\"use\":\"magic\"") "]}", "t",
            &refs, err, sizeof(err)),
        KVF_ERR_INVALID_PARAM);
    assert_int_equal(kvf_calc_refs_parse("{\"figures\":[{\"id\":\"x\"}]}", "t",
                                         &refs, err, sizeof(err)),
                     KVF_ERR_INVALID_PARAM);
    assert_int_equal(
        kvf_calc_refs_parse("{\"figures\":[]}", "t", &refs, err, sizeof(err)),
        KVF_ERR_INVALID_PARAM);
    assert_int_equal(
        kvf_calc_refs_parse("{\"figures\":[", "t", &refs, err, sizeof(err)),
        KVF_ERR_INVALID_PARAM);
#undef FIG
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_record_read(void **state)
{
    char dir[] = "/tmp/kvf_test_calc_XXXXXX", path[256], err[256];
    kvf_calc_measured_t m;

    (void)state;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/link.json", dir);
    write_file(path,
               "{\"schema\":\"kvferry-record/1\",\"kind\":\"bench\","
               "\"name\":\"bench link\",\"date\":\"2026-11-30T10:00:00Z\","
               "\"results\":{\"key_figures\":["
               "{\"name\":\"latency\",\"value\":12,\"unit\":\"us\",\"p50\":11,"
               "\"p99\":30},"
               "{\"name\":\"tcp 4 conns\",\"value\":2.5,\"unit\":\"GiB/s\","
               "\"p50\":null,\"p99\":null},"
               "{\"name\":\"tcp 1 conn\",\"value\":2.1,\"unit\":\"GB/s\","
               "\"p50\":null,\"p99\":null}]}}");
    assert_int_equal(kvf_calc_record_read(path, NULL, &m, err, sizeof(err)),
                     KVF_OK);
    assert_string_equal(m.role, "link");
    assert_string_equal(m.figure, "tcp 4 conns");
    assert_rel(m.gbs, 2.5 * 1.073741824, 1e-12);
    assert_string_equal(m.record, "bench link");
    unlink(path);

    snprintf(path, sizeof(path), "%s/h2d.json", dir);
    write_file(
        path, "{\"schema\":\"kvferry-record/1\",\"kind\":\"bench\","
              "\"name\":\"bench h2d\",\"results\":{\"key_figures\":["
              "{\"name\":\"d2h pinned\",\"value\":57,\"unit\":\"GB/s\"},"
              "{\"name\":\"h2d pinned\",\"value\":55.3,\"unit\":\"GB/s\"},"
              "{\"name\":\"h2d pageable\",\"value\":6.8,\"unit\":\"GB/s\"}]}}");
    assert_int_equal(kvf_calc_record_read(path, NULL, &m, err, sizeof(err)),
                     KVF_OK);
    assert_string_equal(m.role, "h2d");
    assert_string_equal(m.figure, "h2d pinned");
    assert_true(m.gbs == 55.3);
    /* forced to link: the best of all figures */
    assert_int_equal(kvf_calc_record_read(path, "link", &m, err, sizeof(err)),
                     KVF_OK);
    assert_true(m.gbs == 57);
    unlink(path);

    snprintf(path, sizeof(path), "%s/bad.json", dir);
    write_file(path, "{\"kind\":\"bench\",\"results\":{}}");
    assert_int_equal(kvf_calc_record_read(path, NULL, &m, err, sizeof(err)),
                     KVF_ERR_INVALID_PARAM);
    write_file(
        path,
        "{\"schema\":\"kvferry-record/1\",\"name\":\"x\",\"results\":"
        "{\"key_figures\":[{\"name\":\"lat\",\"value\":1,\"unit\":\"ms\"}]}}");
    assert_int_equal(kvf_calc_record_read(path, NULL, &m, err, sizeof(err)),
                     KVF_ERR_NOT_FOUND);
    write_file(path, "not json");
    assert_int_equal(kvf_calc_record_read(path, NULL, &m, err, sizeof(err)),
                     KVF_ERR_INVALID_PARAM);
    unlink(path);
    assert_int_equal(kvf_calc_record_read(path, NULL, &m, err, sizeof(err)),
                     KVF_ERR_INVALID_PARAM);
    rmdir(dir);
}

static void test_units(void **state)
{
    double g = 0;

    (void)state;
    assert_true(kvf_calc_unit_gbs("GB/s", 46, &g) && g == 46);
    assert_true(kvf_calc_unit_gbs("Gb/s", 400, &g) && g == 50);
    assert_true(kvf_calc_unit_gbs("MB/s", 1500, &g) && g == 1.5);
    assert_true(kvf_calc_unit_gbs("TB/s", 3.35, &g) && fabs(g - 3350) < 1e-9);
    assert_false(kvf_calc_unit_gbs("ms", 1, &g));
    assert_false(kvf_calc_unit_gbs(NULL, 1, &g));
    assert_false(kvf_calc_unit_gbs("GB/s", NAN, &g));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worked_example),
        cmocka_unit_test(test_preset_matches_example),
        cmocka_unit_test(test_short_prefix),
        cmocka_unit_test(test_breakeven),
        cmocka_unit_test(test_overlap_and_links),
        cmocka_unit_test(test_attention_term),
        cmocka_unit_test(test_mla),
        cmocka_unit_test(test_presets),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_reference_builtin),
        cmocka_unit_test(test_reference_file),
        cmocka_unit_test(test_reference_rejects),
        cmocka_unit_test(test_record_read),
        cmocka_unit_test(test_units),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
