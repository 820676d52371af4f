#!/usr/bin/env bash
# CTest test of the C packaging: installs the build tree into a temporary
# prefix (cmake --install), builds examples/c/hello_store.c with cc and
# `pkg-config --cflags --libs kvferry` against that prefix only, starts
# the installed `kvferry master` and `kvferry node`, and runs the example
# against them.
#
#   examples/c/test-install.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d /tmp/kvf_install.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log"
pc=$(dirname "$(find "$tmp/prefix" -name kvferry.pc | head -n1)")
export PKG_CONFIG_PATH=$pc
libdir=$(pkg-config --variable=libdir kvferry)
for f in "$tmp/prefix/bin/kvferry" "$libdir/libkvferry.so" \
  "$libdir/libkvferry.a" "$(pkg-config --variable=includedir kvferry)/kvferry/store.h"; do
  [ -e "$f" ] || { echo "not installed: $f" >&2; exit 1; }
done
# KVF_EXAMPLE_CFLAGS: extra flags (the sanitizers of a sanitizer build)
# shellcheck disable=SC2046,SC2086
cc -std=c11 -Wall -Wextra -Werror ${KVF_EXAMPLE_CFLAGS:-} "$src/hello_store.c" \
  $(pkg-config --cflags --libs kvferry) -Wl,-rpath,"$libdir" \
  -o "$tmp/hello_store"

# ready_line FILE PATTERN: waits (10 s at most) for a line of the daemon
wait_line() {
  local i
  for i in $(seq 1 200); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "no '$2' line in $1:" >&2
  cat "$1" >&2
  return 1
}
kvf=$tmp/prefix/bin/kvferry
"$kvf" master --listen 127.0.0.1:0 --http off >"$tmp/master.out" 2>&1 &
pids+=($!)
wait_line "$tmp/master.out" '^master='
master=$(sed -n 's/^master=\([^ ]*\).*/\1/p' "$tmp/master.out")
"$kvf" node --master "$master" --pool 16M >"$tmp/node.out" 2>&1 &
pids+=($!)
wait_line "$tmp/node.out" '^node='
"$tmp/hello_store" "$master"
