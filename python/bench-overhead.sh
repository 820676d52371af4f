#!/usr/bin/env bash
# Python overhead against the C API on one batch of 4096 random 8 KiB
# blocks (32 MiB), over shm and tcp: `python -m kvferry.bench blocks`
# (in one process, interleaved round by round: the C API through
# kvf_batch_submit, the list-of-tuples form with the compiled op-list
# converter, the same list converted in pure Python, and numpy arrays),
# ROUNDS rounds, each transport REPEAT times in alternation; then
# `kvferry bench blocks` (the C command) on the same batch for reference.
# Everything goes to OUT/ (one .txt per run, env.txt, summary.txt).
#
# The package, first found of: WHEEL=path/to/kvferry-*.whl (unpacked
# into OUT/pkg, nothing installed); KVFERRY_LIB (and KVFERRY_BIN) set,
# with the source tree's python/ (libkvferry_pyops.so is looked for
# next to KVFERRY_LIB); build/ of a CMake build of this tree; an
# installed kvferry. numpy makes the array form numpy (array.array
# without it).
#
#   python/bench-overhead.sh OUT [ROUNDS] [REPEAT]
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${1:?usage: python/bench-overhead.sh OUT [ROUNDS] [REPEAT]}
rounds=${2:-60}
repeat=${3:-3}
py=${PYTHON:-python3}
mkdir -p "$out"
out=$(cd "$out" && pwd)

if [ -n "${WHEEL:-}" ]; then
  rm -rf "$out/pkg" && mkdir -p "$out/pkg"
  # unzip keeps the command's execute bit (python's zipfile does not)
  unzip -q "$WHEEL" -d "$out/pkg" || exit 1
  export PYTHONPATH="$out/pkg${PYTHONPATH:+:$PYTHONPATH}"
elif [ -n "${KVFERRY_LIB:-}" ]; then
  export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
elif [ -e build/libkvferry.so ]; then
  export KVFERRY_LIB="$root/build/libkvferry.so" KVFERRY_BIN="$root/build/kvferry"
  export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
fi
bin=$("$py" -c 'from kvferry import _lib; print(_lib.binary_path())') || exit 1

{
  date -u
  uname -a
  echo "cpus: $(nproc), load: $(cut -d' ' -f1-3 /proc/loadavg)"
  grep -m1 'model name' /proc/cpuinfo
  "$py" -c 'import sys, kvferry; from kvferry import _lib
print("python", sys.version.split()[0], "kvferry", kvferry.__file__)
print("libkvferry", _lib.library_path())
print("op-list converter", _lib.pyops_path() if _lib.pyops() else "none (pure Python)",
      "direct reads %d, slices %s" % (_lib.pyops_direct, _lib.pyops_submit() is not None))
try:
    import numpy; print("numpy", numpy.__version__)
except ImportError:
    print("numpy: none (array.array form)")'
  echo "command $bin"
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

for i in $(seq 1 "$repeat"); do
  for t in shm tcp; do
    echo "=== python bench, $t, run $i" | tee -a "$out/summary.txt"
    "$py" -m kvferry.bench blocks --transport "$t" --rounds "$rounds" \
      --calls 50000 > "$out/py-$t-$i.txt" 2>&1
    echo "rc=$?" >> "$out/py-$t-$i.txt"
    sed -n '3,11p' "$out/py-$t-$i.txt" | tee -a "$out/summary.txt"
  done
done
for t in shm tcp; do
  echo "=== kvferry bench blocks, $t" | tee -a "$out/summary.txt"
  "$bin" bench blocks --op read --sizes 32M --block 8K --pool 1G \
    --transport "$t" --no-link --iters 32 --quiet > "$out/c-$t.txt" 2>&1
  grep -E 'size=|note:' "$out/c-$t.txt" | tee -a "$out/summary.txt"
done
