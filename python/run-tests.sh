#!/usr/bin/env bash
# Tests of the Python package: creates a virtual environment in
# build-py/venv (ignored by git), installs pytest, numpy and redis-py
# there (the RESP door's client tests take a current one: Debian's is
# 4.3), and the package in one of three ways, then runs pytest on
# python/tests against real master/node/target processes:
#
#   python/run-tests.sh [PYTEST_ARGS...]
#       pip installs the package from the repository (building the wheel
#       through scikit-build-core, incrementally in build-py/wheel)
#   python/run-tests.sh --wheel FILE [PYTEST_ARGS...]
#       installs that wheel (python/build-wheel.sh's portable one)
#   python/run-tests.sh --from-build DIR [PYTEST_ARGS...]
#       no wheel: the package from python/, the library and command of
#       the CMake build DIR (KVFERRY_LIB, KVFERRY_BIN), in its own venv
#       (build-py/venv-src); what `scripts/test.sh` runs, fast
#
# The last line is pytest's summary; the exit status is pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=$root/build-py/venv
py=${PYTHON:-python3}
mode=source wheel="" from=""
case "${1:-}" in
  --wheel) mode=wheel wheel=$(realpath "$2"); shift 2 ;;
  --from-build) mode=build from=$(realpath "$2"); shift 2; venv=$root/build-py/venv-src ;;
esac

if [ ! -x "$venv/bin/python" ]; then
  echo "python tests: creating $venv"
  "$py" -m venv "$venv"
fi
pip() { "$venv/bin/python" -m pip -q --disable-pip-version-check "$@"; }
case $mode in
  source)
    echo "python tests: installing pytest, numpy, scikit-build-core, redis"
    pip install pytest numpy 'scikit-build-core>=0.10' 'redis>=5'
    echo "python tests: building and installing the kvferry wheel"
    # no build isolation: scikit-build-core from the venv, and a build
    # folder kept between runs so a rebuild is incremental
    pip install --no-build-isolation --force-reinstall --no-deps \
      -C build-dir="$root/build-py/wheel" ./python ;;
  wheel)
    echo "python tests: installing pytest, numpy and $(basename "$wheel")"
    pip install pytest numpy 'redis>=5'
    pip install --force-reinstall --no-deps "$wheel" ;;
  build)
    echo "python tests: installing pytest, numpy; kvferry from python/ and $from"
    pip install pytest numpy 'redis>=5'
    pip uninstall -y kvferry >/dev/null 2>&1 || true
    export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
    export KVFERRY_LIB=$from/libkvferry.so KVFERRY_BIN=$from/kvferry ;;
esac
# run from outside the source tree: the installed package, not python/
cd "$root/build-py"
# exit code 5 (no tests collected) must not pass silently: the suite has
# tests, so collecting none is an error here as well
set +e
"$venv/bin/python" -m pytest -p no:cacheprovider -q -rs \
  --rootdir "$root/python" "$root/python/tests" "$@"
rc=$?
set -e
[ "$rc" -eq 5 ] && rc=1
exit "$rc"
