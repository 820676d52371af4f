"""The end-to-end harness on CPU with a tiny model (2 layers, small
hidden size): every configuration against real master/node processes
(the remote ones with 1 and 2 layer groups),
greedy outputs identical across configurations, the deterministic check
(bitwise first-token logits, corrupted chunks refused) and records that
``kvferry report`` reads. Skipped where torch or transformers is absent."""

import glob
import json
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvferry.e2e.cli import main  # noqa: E402

CACHES = "none,local,remote-shm,remote-tcp,gpu"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("e2e")
    out = str(d / "summary.json")
    rc = main(["--model", "tiny", "--device", "cpu", "--caches", CACHES, "--sharing", "0.9",
               "--prefix-lens", "256,512", "--pool-size", "1", "--requests", "3", "--rate", "0",
               "--sequential", "local", "--check", "2", "--throttle-gbs", "0.3",
               "--layer-groups", "1,2",
               "--host-pool", "64M", "--node-pool", "64M", "--record", str(d / "rec"),
               "--json", out])
    return rc, json.load(open(out)), str(d / "rec")


def test_runs_every_configuration(run):
    rc, data, _ = run
    assert rc == 0
    configs = [s["config"] for s in data["summaries"] if "cache" in s]
    for c in CACHES.split(","):
        assert any(x.startswith(c + " ") for x in configs), c
    assert any("remote-tcp-throttled" in x and "policy-calc" in x for x in configs)
    # each remote configuration once per layer group count
    for g in ("groups1", "groups2"):
        assert any(x.startswith("remote-shm ") and g in x.split() for x in configs), g
    for s in data["summaries"]:
        if s.get("cache") in ("local", "remote-shm", "remote-tcp", "gpu") and s["policy"] == "always":
            assert s["tokens_not_computed"] > 0, s["config"]
        if s.get("cache", "").startswith("remote") and s["policy"] == "always":
            assert s["bytes_remote"] > 0, s["config"]
        if s.get("cache") == "none":
            assert s["tokens_not_computed"] == 0


def test_greedy_outputs_identical_across_configurations(run):
    _, _, rec = run
    outs = {}
    for f in glob.glob(os.path.join(rec, "*.data.json")):
        raw = json.load(open(f))
        if "requests" not in raw:
            continue
        for r in raw["requests"]:
            outs.setdefault(r["rid"], set()).add(tuple(r["output"]))
    assert outs
    for rid, o in outs.items():
        assert len(o) == 1, "request %d: outputs differ across configurations" % rid


def test_check_bitwise_and_corruption(run):
    _, data, _ = run
    checks = [s for s in data["summaries"] if s.get("config", "").startswith("check ")]
    assert len(checks) == 4
    for c in checks:
        assert c["ok"], c
        assert c["checked"] > 0 and c["bitwise_equal"] == c["checked"]
        assert c["single_shot_within_tol"] == c["single_shot_checked"] > 0
        if c["config"] != "check gpu":
            assert c["corrupt_injected"] > 0
            assert c["corrupt_caught"] == c["corrupt_injected"]
        assert c["corrupt_accepted"] == 0 and c["corrupt_output_changed"] == 0


def test_records_are_readable_by_report(run):
    _, _, rec = run
    recs = [json.load(open(f)) for f in glob.glob(os.path.join(rec, "*.json"))
            if not f.endswith(".data.json")]
    assert any(r["name"].startswith("bench e2e check") for r in recs)
    names = {s["name"] for r in recs for s in r["results"]["series"]}
    assert {"TTFT CDF", "TTFT over prefix"} <= names
    from kvferry._lib import binary_path
    html = os.path.join(rec, "report.html")
    r = subprocess.run([binary_path(), "report", rec, "-o", html], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    assert "bench e2e" in open(html).read()
