"""Unit tests of the end-to-end harness's parts that need no torch: the
trace generator, chunk keys with the layout fingerprint, statistics,
records (validated against docs/record.schema.json when jsonschema is
there) and the break-even policy against kvferry calc's formula."""

import json
import math
import os
import subprocess

import pytest

from kvferry.e2e import policy, record, stats
from kvferry.e2e.trace import make_trace, parse_len
from kvferry.kv import KVLayout, chunk_keys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_trace_is_deterministic():
    a = make_trace(50, 2.0, 0.5, [1024, 2048], pool_size=3, seed=7, vocab=1000)
    b = make_trace(50, 2.0, 0.5, [1024, 2048], pool_size=3, seed=7, vocab=1000)
    assert a == b
    assert a.requests[3].tokens(7) == b.requests[3].tokens(7)
    c = make_trace(50, 2.0, 0.5, [1024, 2048], pool_size=3, seed=8, vocab=1000)
    assert [r.arrival_s for r in a.requests] != [r.arrival_s for r in c.requests]


@pytest.mark.parametrize("sharing", [0.0, 0.5, 0.9])
def test_trace_rates(sharing):
    t = make_trace(4000, 5.0, sharing, [1024, 4096, 32768], pool_size=4, seed=1, vocab=100)
    n = len(t.requests)
    shared = sum(r.shared for r in t.requests) / n
    assert abs(shared - sharing) < 0.03
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(t.requests, t.requests[1:])]
    assert all(g >= 0 for g in gaps)
    assert abs(sum(gaps) / len(gaps) - 1 / 5.0) < 0.02
    assert {r.prefix_len for r in t.requests} <= {1024, 4096, 32768}
    assert all(r.suffix_len == 256 and r.out_tokens == 32 for r in t.requests)


def test_trace_shared_prefixes_repeat_and_private_ones_do_not():
    t = make_trace(40, 0.0, 0.5, [512], pool_size=2, seed=3, vocab=50000)
    assert all(r.arrival_s == 0.0 for r in t.requests)
    sh = [r for r in t.requests if r.shared]
    pv = [r for r in t.requests if not r.shared]
    same = [r for r in sh if r.prefix_id == sh[0].prefix_id]
    assert len(same) >= 2
    assert same[0].prefix_tokens(3) == same[1].prefix_tokens(3)
    assert same[0].suffix_tokens() != same[1].suffix_tokens()
    assert pv[0].prefix_tokens(3) != pv[1].prefix_tokens(3)
    assert len(t.requests[0].tokens(3)) == 512 + 256


def test_trace_pool_lens_and_bad_input():
    t = make_trace(10, 1.0, 1.0, [1024], pool_size=2, seed=0, pool_lens=[2048, 8192])
    assert {r.prefix_len for r in t.requests} <= {2048, 8192}
    assert parse_len("32K") == 32768 and parse_len("2048") == 2048 and parse_len("1.5K") == 1536
    with pytest.raises(ValueError):
        make_trace(1, 1.0, 1.5, [1024])


def test_chunk_keys_follow_prefix_and_fingerprint():
    lay = KVLayout.vllm("m", "bfloat16", 32, 16, 256, 8, 128)
    other = KVLayout.vllm("m", "float16", 32, 16, 256, 8, 128)
    toks = list(range(1000))
    k = chunk_keys(toks, 256, lay.fingerprint())
    assert len(k) == 3  # full chunks only
    assert chunk_keys(toks[:512] + [7] * 300, 256, lay.fingerprint())[:2] == k[:2]
    assert chunk_keys(toks, 256, lay.fingerprint())[2] == k[2]
    changed = toks[:]
    changed[10] = 99999
    assert chunk_keys(changed, 256, lay.fingerprint())[0] != k[0]
    assert chunk_keys(toks, 256, other.fingerprint())[0] != k[0]
    # the number of blocks of the pool does not change a key
    same = KVLayout.vllm("m", "bfloat16", 32, 99, 256, 8, 128)
    assert same.fingerprint() == lay.fingerprint()


def test_percentiles_and_summary():
    assert stats.percentile([], 50) is None
    xs = list(range(1, 101))
    assert stats.percentile(xs, 50) == 50 and stats.percentile(xs, 99) == 99
    assert stats.percentile(xs, 100) == 100 and stats.percentile([3.0], 99) == 3.0
    s = [stats.Served(i, 1024, 1280, float(i), float(i) + 0.1, float(i) + 0.2 + 0.1 * (i == 3),
                      float(i) + 1.0, [0.01] * 31, 1024 if i % 2 else 0,
                      1024 if i % 2 else 0, "load" if i % 2 else "miss",
                      4096 if i % 2 else 0, list(range(32))) for i in range(4)]
    out = stats.summary(s, slo_s=0.25)
    assert out["requests"] == 4
    assert math.isclose(out["ttft_p50_s"], 0.2)
    assert math.isclose(out["ttft_p99_s"], 0.3)
    assert out["tokens_not_computed"] == 2048 and out["bytes_remote"] == 8192
    assert math.isclose(out["slo_met_fraction"], 0.75)
    assert math.isclose(out["makespan_s"], 4.0)
    assert math.isclose(out["throughput_tok_s"], 32.0)
    assert math.isclose(out["goodput_req_s"], 0.75)
    assert stats.cdf([3.0, 1.0]) == [[1.0, 0.5], [3.0, 1.0]]


LLAMA8B = policy.Shape(layers=32, kv_heads=8, head_dim=128, q_heads=32, params_active=8.03e9)


def test_policy_formula_matches_calc():
    # kvferry calc's llama3-8b: 128 KiB of KV per token in BF16
    assert LLAMA8B.kv_bytes_per_token() == 131072
    t = 32768
    b = 131072 * t
    assert math.isclose(policy.load_s(LLAMA8B, t, 46, 50, 0.005, 0.005),
                        0.01 + b / 46e9 + b / 50e9)
    assert math.isclose(policy.load_s(LLAMA8B, t, 46, 50, overlap=True), b / 46e9)
    f = 2 * 8.03e9 * t + 32 * t * t * 32 * 256
    assert math.isclose(policy.recompute_s(LLAMA8B, t, 1e15), f / 1e15)


def test_policy_decides_by_measured_link():
    fast = policy.Policy("calc", LLAMA8B, h2d_gbs=50, flops_per_s=400e12, link_gbs=20)
    assert fast.load(32768)
    slow = policy.Policy("calc", LLAMA8B, h2d_gbs=50, flops_per_s=400e12, link_gbs=20)
    for _ in range(10):
        slow.observe_link(1 << 30, 1.0)  # the link drops to ~1 GB/s
    assert slow.link_gbs < 1.2
    assert not slow.load(32768)
    assert policy.Policy("always", LLAMA8B, 1, 1, 0.001).load(256)
    assert not policy.Policy("never", LLAMA8B, 50, 1, 50).load(65536)
    assert not fast.load(0)
    with pytest.raises(ValueError):
        policy.Policy("maybe", LLAMA8B, 1, 1)


def test_breakeven_is_where_load_starts_winning():
    be = policy.breakeven_tokens(LLAMA8B, 20, 50, 400e12, query_s=0.01)
    assert be is not None
    def load(t):
        return policy.load_s(LLAMA8B, t, 20, 50, 0.01)
    def rc(t):
        return policy.recompute_s(LLAMA8B, t, 400e12)
    assert load(be) < rc(be) and load(be - 1) >= rc(be - 1)
    # a link so slow that the linear costs never cross below the quadratic
    # term within the range: no break-even
    assert policy.breakeven_tokens(LLAMA8B, 0.001, 50, 400e12, max_tokens=1 << 16) is None


def _record():
    f = record.figure
    return record.make("bench e2e local share90 overlap", "loading is faster",
                       {"requests": 4, "sharing": 0.9, "model": "tiny", "flag": True},
                       [f("TTFT", 0.1, "s", 0.1, 0.3), f("bytes read remotely", 123, "bytes")],
                       [record.series("TTFT CDF", "TTFT (s)", "fraction", [[0.1, 0.5], [0.3, 1.0]])],
                       "holds", "why", ["nothing"],
                       {"value": 0.05, "unit": "s", "source": "calc"},
                       {"ratio": 2.0, "explanation": "verify"}, env={"host": "h"})


def test_record_content_and_files(tmp_path):
    rec = _record()
    assert rec["schema"] == "kvferry-record/1" and rec["kind"] == "bench"
    assert rec["configuration"]["flag"] == "True"
    with pytest.raises(ValueError):
        record.make("x", "h", {}, [], [], "maybe", "", [])
    j, md = record.write(rec, str(tmp_path), {"raw": [1, 2]})
    j2, _ = record.write(_record(), str(tmp_path))
    assert j != j2 and os.path.basename(j).endswith("-bench-e2e-local-share90-overlap.json")
    data = json.load(open(j))
    assert data["results"]["raw_data"].endswith(".data.json")
    assert json.load(open(os.path.join(str(tmp_path), data["results"]["raw_data"]))) == {"raw": [1, 2]}
    text = open(md).read()
    for h in ("- **Experiment:**", "- **Date / executor:**", "## Environment", "## Hypothesis",
              "## Configuration", "## Results", "### Key figures",
              "| Figure | Value | Unit | P50 | P99 |", "## Gap to the estimate", "## Conclusion",
              "## Not verified", "### Series: TTFT CDF"):
        assert h in text
    assert record._num(float("nan")) is None


def test_record_validates_against_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.load(open(os.path.join(ROOT, "docs", "record.schema.json")))
    rec = _record()
    rec["environment"] = record.environment()
    try:
        jsonschema.validate(rec, schema)
    except jsonschema.ValidationError as e:
        if "environment" in list(e.absolute_path)[:1]:
            pytest.skip("no kvferry bench env here: %s" % e.message)
        raise


def test_cli_without_torch_says_so():
    try:
        import torch  # noqa: F401
        pytest.skip("torch is installed")
    except ImportError:
        pass
    from kvferry.e2e.cli import main
    assert main(["--model", "tiny"]) == 77


def test_kvferry_command_forwards_bench_e2e():
    from kvferry._lib import binary_path
    import sys
    env = dict(os.environ, KVFERRY_PYTHON=sys.executable)
    r = subprocess.run([binary_path(), "bench", "e2e", "--help"], capture_output=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    assert b"--prefix-lens" in r.stdout


def test_closing_table():
    from kvferry.e2e.cli import table
    s = {"config": "local share90 overlap", "cache": "local", "ttft_p50_s": 0.1,
         "ttft_p99_s": 0.2, "service_ttft_p50_s": 0.05, "service_ttft_p99_s": 0.07,
         "tokens_not_computed": 32768, "bytes_remote": 0, "speedup_by_prefix": {"32768": 12.5}}
    t = table([s, None, {"config": "check local", "ok": True}])
    lines = t.strip().split("\n")
    assert len(lines) == 3
    assert "| local share90 overlap | 0.100 / 0.200 | 0.050 / 0.070 | 32768 | 0 | 32768: 12.5x |" \
        == lines[2]
