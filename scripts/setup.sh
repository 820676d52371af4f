#!/usr/bin/env bash
# Installs kvferry's build and test dependencies on Debian 12 and builds it
# (release build in build/, ASan+UBSan build in build-asan/ with --asan).
# Safe to run again: packages already present are skipped, nothing is
# upgraded. Prints one line per step; --verbose shows the apt and build
# output in full (a failing step always shows its last lines).
#
#   scripts/setup.sh [--asan] [--with-browser] [--verbose]
#
# --with-browser also installs chromium, which only the two HTML page
# tests use (scripts/test.sh passes it; the main job does not).
set -euo pipefail
cd "$(dirname "$0")/.."

asan=0 browser=0 verbose=0
for arg in "$@"; do
  case "$arg" in
    --asan) asan=1 ;;
    --with-browser) browser=1 ;;
    --verbose) verbose=1 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown option '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

# build: compiler, CMake, Ninja; libraries: cmocka (unit tests), jansson
# (JSON), xxHash (checksums), hiredis (bench store's Redis client),
# libmicrohttpd (the master's HTTP endpoint); clang-14 + its runtime
# (libFuzzer targets); tests: python3 + jsonschema (record checks),
# python3-venv (python/run-tests.sh's virtual environment), python3-dev
# (CPython's headers: the package's compiled op-list converter),
# iproute2 + nftables (network fault drills), curl (scripts/hosts.sh and
# its test read the master's HTTP endpoint), redis (bench store
# --vs-redis; redis-py: test_resp), pciutils (bench env's PCIe table),
# libcurl + etcd-server/etcd-client (the etcd client in coord/, and the
# real etcd its tests and the HA drills start)
# libucx-dev + ucx-utils (the ucx transport; ucx_info, ucx_perftest)
# liburing-dev (a store node's disk tier: O_DIRECT through io_uring)
pkgs=(build-essential cmake ninja-build pkg-config libcmocka-dev
      libjansson-dev libxxhash-dev libhiredis-dev libmicrohttpd-dev libssl-dev
      libcurl4-openssl-dev etcd-server etcd-client
      clang-14 libclang-rt-14-dev
      python3 python3-pip python3-venv python3-dev python3-jsonschema python3-redis
      iproute2 nftables curl
      redis-server redis-tools pciutils libucx-dev ucx-utils liburing-dev)
[ "$browser" -eq 1 ] && pkgs+=(chromium)

log=$(mktemp /tmp/kvf_setup.XXXXXX)
trap 'rm -f "$log"' EXIT

# step TEXT CMD...: runs CMD, one line "setup: TEXT ... ok (Ns)"; the
# full output with --verbose, its last 40 lines when it fails.
step() {
  local text=$1 t0=$SECONDS rc=0
  shift
  if [ "$verbose" -eq 1 ]; then
    echo "setup: $text"
    "$@" || rc=$?
  else
    printf 'setup: %s ... ' "$text"
    "$@" >"$log" 2>&1 || rc=$?
  fi
  if [ "$rc" -ne 0 ]; then
    [ "$verbose" -eq 1 ] || { echo "FAILED"; tail -n 40 "$log"; }
    echo "setup: $text failed (exit $rc); rerun with --verbose" >&2
    exit "$rc"
  fi
  [ "$verbose" -eq 1 ] || echo "ok ($((SECONDS - t0)) s)"
}

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  step "apt-get update" $SUDO apt-get update -q
  # --no-upgrade: packages already installed stay at their version
  step "installing ${#missing[@]} package(s) with their dependencies: ${missing[*]}" \
    $SUDO env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-upgrade "${missing[@]}"
else
  echo "setup: ${#pkgs[@]} Debian packages present"
fi

# Python modules the tests import: make sure the python3 on PATH has them
# (a pyenv python does not see Debian's packages; lizard is on PyPI only,
# and Debian's own python3 takes pip packages only with
# --break-system-packages)
pip_install() {
  python3 -m pip install -q "$@" ||
    python3 -m pip install -q --break-system-packages "$@"
}
pymods=()
python3 -c 'import jsonschema' >/dev/null 2>&1 || pymods+=(jsonschema)
python3 -c 'import lizard' >/dev/null 2>&1 || pymods+=(lizard)
if [ "${#pymods[@]}" -gt 0 ]; then
  step "pip install ${pymods[*]}" pip_install "${pymods[@]}"
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
build() {
  cmake -S . -B "$1" -G Ninja "${@:2}" -DKVF_WERROR="$werror" &&
    ninja -C "$1"
}
step "release build (build/)" build build -DCMAKE_BUILD_TYPE=RelWithDebInfo
if [ "$asan" -eq 1 ]; then
  step "ASan+UBSan build (build-asan/)" build build-asan \
    -DCMAKE_BUILD_TYPE=Debug -DKVF_SANITIZE=ON
fi
