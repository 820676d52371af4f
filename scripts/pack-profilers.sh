#!/usr/bin/env bash
# Packs Debian 12's perf and strace with the shared libraries they load
# (all but glibc's) into one archive, for a machine that has neither (the
# GPU host: tests/gpu/device_run.sh authprof unpacks it there and runs
# both with LD_LIBRARY_PATH set to the unpacked folder). Installs
# linux-perf and strace here when missing.
#
#   scripts/pack-profilers.sh [OUT.tar.xz]   (default .dev/prof/tools.tar.xz)
set -euo pipefail
out=$(realpath -m "${1:-.dev/prof/tools.tar.xz}")
for pkg in linux-perf strace; do
  dpkg -s "$pkg" >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y --no-install-recommends "$pkg"; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/tools"
cp /usr/bin/perf /usr/bin/strace "$tmp/tools/"
"$(dirname "$0")/copy-libs.sh" --keep-cxx --keep-openssl "$tmp/tools" \
  /usr/bin/perf /usr/bin/strace
mkdir -p "$(dirname "$out")"
tar -cJf "$out" -C "$tmp" tools
ls -la "$out"
