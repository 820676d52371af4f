#!/usr/bin/env bash
# Copies the shared libraries that FILEs load into DEST, for a machine
# that has none of this machine's packages (the GPU host): all but the C
# runtime (glibc's parts, which must stay the host's own: two glibcs do
# not load together), and by default neither the C++ runtime nor OpenSSL,
# which every such machine has. Used by scripts/pack-ab.sh,
# scripts/pack-profilers.sh and tests/gpu/stage-binaries.sh.
#
#   scripts/copy-libs.sh [--keep-cxx] [--keep-openssl] DEST FILE...
set -euo pipefail
skip='libc|libm|libpthread|libdl|librt|ld-linux[^/]*'
cxx='|libstdc\+\+|libgcc_s' ssl='|libcrypto|libssl'
while [ $# -gt 0 ]; do
  case "$1" in
  --keep-cxx) cxx= ;;
  --keep-openssl) ssl= ;;
  *) break ;;
  esac
  shift
done
[ $# -ge 2 ] || { sed -n 2,9p "$0"; exit 2; }
dest=$1
shift
mkdir -p "$dest"
ldd "$@" | awk '/=> \//{print $3}' | sort -u |
  grep -Ev "/($skip$cxx$ssl)\.so" |
  while read -r lib; do cp -L "$lib" "$dest/"; done
