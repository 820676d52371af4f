"""python/integrations/bench_vllm.py's configuration handling, without
vLLM: unknown names and a Mooncake configuration without its parts are
refused before any model is made, Mooncake's settings file says what
vLLM's MooncakeStoreConnector reads, and a master that dies or never
listens ends the wait with a clear error (real processes)."""

import argparse
import json
import os
import stat
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integrations"))

import bench_vllm  # noqa: E402


def _script(tmp_path, name, body):
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def test_unknown_configuration_is_refused():
    with pytest.raises(SystemExit, match="unknown configuration bogus"):
        bench_vllm.check_configs(["offload", "bogus"])
    bench_vllm.check_configs(["none", "offload", "kvferry", "kvferry-local"])


def test_mooncake_without_its_master_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("MOONCAKE_MASTER", raising=False)
    with pytest.raises(SystemExit, match="mooncake_master executable: not on PATH"):
        bench_vllm.check_configs(["mooncake"])
    plain = tmp_path / "plain"
    plain.write_text("not a program")
    monkeypatch.setenv("MOONCAKE_MASTER", str(plain))
    with pytest.raises(SystemExit, match="is not an executable file"):
        bench_vllm.check_configs(["mooncake"])


def test_mooncake_settings_file(tmp_path):
    master = bench_vllm.MooncakeMaster("/bin/true", str(tmp_path / "m.log"))
    args = argparse.Namespace(cpu_bytes=3 << 30)
    env = bench_vllm.mooncake_env(args, master, str(tmp_path))
    with open(env["MOONCAKE_CONFIG_PATH"]) as f:
        cfg = json.load(f)
    assert cfg["protocol"] == "tcp" and cfg["global_segment_size"] == 3 << 30
    assert cfg["master_server_address"] == "127.0.0.1:%d" % master.rpc_port
    assert cfg["metadata_server"] == "http://127.0.0.1:%d/metadata" % master.http_port
    assert env["MOONCAKE_REQUESTER_LOCAL_HOSTNAME"] == "127.0.0.1"
    assert len({master.rpc_port, master.http_port, master.metrics_port}) == 3
    assert bench_vllm.transfer_config("mooncake", args, "") == {
        "kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}


def test_master_that_exits_is_reported(tmp_path):
    binary = _script(tmp_path, "mooncake_master", "echo cannot start >&2; exit 3")
    t0 = time.monotonic()
    with pytest.raises(SystemExit, match=r"(?s)exited \(rc 3\).*cannot start"):
        with bench_vllm.MooncakeMaster(binary, str(tmp_path / "m.log"), timeout=30):
            pass
    assert time.monotonic() - t0 < 10


def test_master_that_never_listens_times_out_and_is_stopped(tmp_path):
    pidfile = tmp_path / "pid"
    binary = _script(tmp_path, "mooncake_master", "echo $$ > %s; exec sleep 60" % pidfile)
    t0 = time.monotonic()
    with pytest.raises(SystemExit, match="not listening on port"):
        with bench_vllm.MooncakeMaster(binary, str(tmp_path / "m.log"), timeout=1):
            pass
    assert time.monotonic() - t0 < 30
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped and reaped
