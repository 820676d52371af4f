#!/usr/bin/env bash
# Installs kvferry's build and test dependencies on Debian 12 and builds it
# (release build in build/, ASan+UBSan build in build-asan/ with --asan).
# Safe to run again: packages already present are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake ninja-build pkg-config libcmocka-dev
      python3 python3-jsonschema iproute2 nftables redis-server redis-tools
      pciutils libjansson-dev chromium)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# the record tests validate JSON with the jsonschema module: make sure the
# python3 on PATH has it (a pyenv python does not see Debian's package)
if ! python3 -c 'import jsonschema' >/dev/null 2>&1; then
  python3 -m pip install -q jsonschema
fi

# shm pools are shmem (memfd): they get transparent huge pages only when
# shmem_enabled allows it (Debian's default is never). "advise" gives them
# to memory that asks with madvise, as kvferry's pools do, and to nothing
# else. Random 8 KiB blocks over gigabytes then miss the TLB half as often
# (docs/shm.md). KVF_NO_HOST_TUNING=1 leaves the setting alone.
thp_shmem=/sys/kernel/mm/transparent_hugepage/shmem_enabled
if [ -z "${KVF_NO_HOST_TUNING:-}" ] && [ -f "$thp_shmem" ] &&
  grep -q '\[never\]' "$thp_shmem"; then
  as_root=""
  [ "$(id -u)" -eq 0 ] || as_root="sudo -n"
  if echo advise | $as_root tee "$thp_shmem" >/dev/null 2>&1; then
    echo "setup: $thp_shmem set to advise (huge pages for shm pools)"
  else
    echo "setup: cannot set $thp_shmem (shm pools use 4 KiB pages)" >&2
  fi
fi

werror=OFF
[ "${CI:-}" = "true" ] && werror=ON
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVF_WERROR="$werror" >/dev/null
ninja -C build
if [ "${1:-}" = "--asan" ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    -DKVF_SANITIZE=ON -DKVF_WERROR="$werror" >/dev/null
  ninja -C build-asan
fi
