#!/usr/bin/env bash
# Packs two builds of the kvferry command for an A/B on another machine
# (tests/gpu/device_run.sh abbin, scripts/ab-binaries.py): each revision
# is checked out into a worktree, built as the release build is
# (RelWithDebInfo, no CUDA: the A/B moves host memory only), and copied
# with the shared libraries it loads (scripts/copy-libs.sh) and a
# kvferry-run that puts them on LD_LIBRARY_PATH, so both builds run from
# one process.
#
#   scripts/pack-ab.sh BEFORE_REV AFTER_REV [ARCHIVE]
#
# ARCHIVE defaults to .dev/ab/ab.tar.xz: before/ and after/, each with
# kvferry, kvferry-run, its libraries and COMMIT (the revision's hash).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,13p "$0"; exit 2; }
archive="${3:-.dev/ab/ab.tar.xz}"
work=$(mktemp -d /tmp/kvf-pack-ab.XXXXXX)
trap 'git worktree remove --force "$work/src-before" 2>/dev/null || true;
      git worktree remove --force "$work/src-after" 2>/dev/null || true;
      rm -rf "$work"' EXIT

build_one() { # side rev
  local side=$1 rev=$2 src="$work/src-$1" bld="$work/build-$1" d="$work/out/$1"
  git worktree add --detach "$src" "$rev" >/dev/null
  cmake -S "$src" -B "$bld" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DKVF_CUDA=OFF >/dev/null
  ninja -C "$bld" -j"${KVF_JOBS:-2}" kvferry >/dev/null
  mkdir -p "$d"
  strip --strip-debug -o "$d/kvferry" "$bld/kvferry"
  scripts/copy-libs.sh "$d" "$bld/kvferry"
  if [ -e "$bld/libkvferry.so" ]; then
    strip --strip-debug -o "$d/libkvferry.so" "$bld/libkvferry.so"
  fi
  printf '#!/bin/sh\nd=$(dirname "$0")\nLD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/kvferry" "$@"\n' \
    >"$d/kvferry-run"
  chmod +x "$d/kvferry-run"
  git -C "$src" rev-parse HEAD >"$d/COMMIT"
  echo "pack-ab: $side = $(cat "$d/COMMIT")"
}

build_one before "$1"
build_one after "$2"
mkdir -p "$(dirname "$archive")"
tar -cJf "$archive" -C "$work/out" before after
ls -la "$archive"
