#!/usr/bin/env bash
# Tests of the Python package: creates a virtual environment in
# build-py/venv (ignored by git), pip installs the package from the
# repository (building the wheel through scikit-build-core, incrementally
# in build-py/wheel) plus pytest, numpy and redis-py (the RESP door's
# client tests take a current one: Debian's is 4.3), and runs pytest on
# python/tests against real master/node/target processes. Extra
# arguments go to pytest (e.g. -k store). The last line is pytest's
# summary; the exit status is pytest's.
#
#   python/run-tests.sh [PYTEST_ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=$root/build-py/venv
py=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  echo "python tests: creating $venv"
  "$py" -m venv "$venv"
fi
pip() { "$venv/bin/python" -m pip -q --disable-pip-version-check "$@"; }
echo "python tests: installing pytest, numpy, scikit-build-core, redis"
pip install pytest numpy 'scikit-build-core>=0.10' 'redis>=5'
echo "python tests: building and installing the kvferry wheel"
# no build isolation: scikit-build-core from the venv, and a build
# folder kept between runs so a rebuild is incremental
pip install --no-build-isolation --force-reinstall --no-deps \
  -C build-dir="$root/build-py/wheel" ./python
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
