"""kvferry.config: settings read through the library's tables."""

import os
import subprocess
import sys

import pytest

import kvferry
from kvferry import config


def _in_child(code, **env):
    """Runs code in a fresh interpreter with env added; its stdout."""
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_keys_and_variables_have_defaults():
    assert config.get("transports") == "auto" or "KVF_TRANSPORTS" in os.environ
    assert config.get("gpu_sum") == "auto"
    assert config.get("KVFERRY_PYOPS") == os.environ.get("KVFERRY_PYOPS", "1")
    assert config.get("no_such_key_at_all") is None
    assert config.get("KVF_NO_SUCH_VARIABLE") is None
    assert config.get("no_such_key_at_all", "x") == "x"
    assert kvferry.config_get("gpu_sum") == "auto"


def test_environment_and_file_reach_python(tmp_path):
    code = "from kvferry import config; print(config.get('gpu_sum'), config.get('kv_views'))"
    assert _in_child(code, KVF_GPU_SUM="engines") == "engines 1"
    cfg = tmp_path / "kvf.conf"
    cfg.write_text("kv_views = 0\n")
    assert _in_child(code, KVF_CONFIG=str(cfg)) == "auto 0"


def test_first_slice_is_checked():
    out = subprocess.run([sys.executable, "-c", "import kvferry"],
                         env=dict(os.environ, KVFERRY_FIRST_SLICE="7"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "KVFERRY_FIRST_SLICE" in out.stderr
    code = "import kvferry.engine as e; print(e._FIRST_SLICE)"
    assert _in_child(code, KVFERRY_FIRST_SLICE="64") == "64"


def test_keys_lists_the_tables():
    keys = {k["name"]: k for k in config.keys()}
    assert keys["gpu_sum"]["group"] == "tuning" and keys["gpu_sum"]["default"] == "auto"
    assert keys["drill_rounds"]["group"] == "debug"
    assert "cuda_unroll" not in keys and "ucx_spin_us" not in keys
    with pytest.raises(ValueError, match="KVFERRY_FIRST_SLICE"):
        config.get_int("KVFERRY_FIRST_SLICE", 1000, 2000)
