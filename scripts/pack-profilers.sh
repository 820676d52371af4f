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
# glibc's own libraries stay the host's: mixing two glibcs does not load
for bin in /usr/bin/perf /usr/bin/strace; do
  ldd "$bin" | awk '/=>/ {print $3}'
done | sort -u |
  grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$tmp/tools/"; done
mkdir -p "$(dirname "$out")"
tar -cJf "$out" -C "$tmp" tools
ls -la "$out"
