#!/usr/bin/env bash
# Installs a serving engine at the version kvferry's integration modules
# were written against into its own virtual environment, with the
# kvferry package, and runs python/tests/test_integrations.py and
# test_kv.py there (and test_vllm_connector.py for vllm), so that each
# module is loaded through the engine's own plugin mechanism and driven
# against its real abstract classes.
#
#   python/integrations/install.sh ENGINE...     # vllm, lmcache, sglang, all
#   KVF_ENGINE_VENVS=DIR (default build-py/engines): where the venvs go
#   KVF_ENGINE_NO_TEST=1: install only
#
# Heavy: each engine pulls torch (with its CUDA libraries, GBs) and
# more; not part of python/run-tests.sh. The pins are below.
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
    *) echo "unknown engine: $1 (vllm, lmcache, sglang, all)" >&2; return 2 ;;
  esac
}

install_one() {
  local name=$1 spec venv
  spec=$(pin "$name")
  venv=$base/$name
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  local pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
  echo "integrations: installing $spec into $venv"
  "${pip[@]}" install "$spec" pytest numpy 'scikit-build-core>=0.10'
  echo "integrations: installing kvferry into $venv"
  "${pip[@]}" install --no-build-isolation --force-reinstall --no-deps \
    -C build-dir="$root/build-py/wheel-engines" ./python
  if [ "${KVF_ENGINE_NO_TEST:-0}" != 1 ]; then
    echo "integrations: testing kvferry with $spec"
    local tests=("$root/python/tests/test_integrations.py" "$root/python/tests/test_kv.py")
    if [ "$name" = vllm ]; then
      tests+=("$root/python/tests/test_vllm_connector.py")
    fi
    (cd "$root/build-py" && "$venv/bin/python" -m pytest -p no:cacheprovider -q -rs \
      --rootdir "$root/python" "${tests[@]}")
  fi
}

[ $# -gt 0 ] || { sed -n '2,15p' "$0"; exit 2; }
engines=()
for e in "$@"; do
  if [ "$e" = all ]; then engines+=(vllm lmcache sglang); else engines+=("$e"); fi
done
rc=0
for e in "${engines[@]}"; do
  install_one "$e" || rc=1
done
exit "$rc"
