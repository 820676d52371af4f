#!/usr/bin/env bash
# Mooncake's store for bench_vllm.py's `mooncake` configuration (vLLM's
# MooncakeStoreConnector) on the GPU machine, which has no package
# registry: mooncake-transfer-engine-cuda13 0.3.14 (CPython 3.12, CUDA 13
# like the machine's torch 2.11.0+cu130) packed here, installed there.
#
#   python/integrations/mooncake_gpu.sh pack [OUT]          (here; OUT default .dev/mc)
#   python/integrations/mooncake_gpu.sh install DIR [DEST]  (there; DEST default /tmp/kvferry-mooncake)
#   python/integrations/mooncake_gpu.sh check [DEST]        (there: a store round trip)
#   . DEST/env.sh
#
# pack: OUT/mooncake.tar.xz, about 27 MB: site/ (the wheel's package less
# what the store and mooncake_master do not load: the EP and process-group
# collectives, the transfer-engine binding, the bench and client binaries)
# and lib/ (the Debian 12 libraries they load that a bare image may lack:
# libibverbs, libmlx5, libnuma, libcurl and what those load; the debs come
# from apt-get download, their own needs from this machine).
# install: DIR/mooncake.tar.xz (or a wheel DIR/*.whl with DIR/lib/)
# unpacked into DEST; of lib/ only what the machine cannot find is put on
# LD_LIBRARY_PATH (DEST/ld); DEST/env.sh exports PYTHONPATH,
# LD_LIBRARY_PATH, PATH and MOONCAKE_MASTER; then the module is imported
# and mooncake_master asked its version.
# check: mooncake_master on loopback ports, a store with a 256 MiB segment
# over TCP, 64 MiB written from and read back into GPU memory.
set -euo pipefail
cd "$(dirname "$0")/../.."
version=0.3.14
wheel=mooncake-transfer-engine-cuda13==$version
debs="libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200 libnuma1 libcurl4"
dest=/tmp/kvferry-mooncake

die() { echo "mooncake-gpu: $*" >&2; exit 1; }

pack() {
  local out=${1:-.dev/mc} work
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  mkdir -p "$work/wheel" "$work/deb" "$work/root" "$work/pkg/lib" "$out"
  local plat=()
  for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 \
    manylinux_2_27_x86_64 manylinux_2_28_x86_64 manylinux_2_31_x86_64 \
    manylinux_2_34_x86_64 manylinux_2_35_x86_64; do
    plat+=(--platform "$p")
  done
  echo "mooncake-gpu: downloading $wheel and $debs"
  python3 -m pip -q --disable-pip-version-check download --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp "${plat[@]}" -d "$work/wheel" "$wheel"
  # shellcheck disable=SC2086
  (cd "$work/deb" && apt-get download $debs >/dev/null)
  for d in "$work"/deb/*.deb; do dpkg -x "$d" "$work/root"; done
  (cd "$work/pkg" && mkdir site && cd site && unzip -q "$work"/wheel/*.whl)
  local m="$work/pkg/site/mooncake"
  rm -rf "$m/mooncake_client" "$m/transfer_engine_bench" "$m/engine.so" "$m"/_ep.*.so \
    "$m"/libmooncake_pg*.so "$m/libmooncake_ep_device.so" "$m/_pg_jit" "$m/mooncake_ep_jit"
  find "$work/pkg/site" -name __pycache__ -prune -exec rm -rf {} +
  # what the store's module and mooncake_master load outside the C runtime,
  # CUDA's libraries (the machine's driver and torch have them) and the wheel
  local libs="$work/root/usr/lib/x86_64-linux-gnu"
  local objs=("$m"/_store.*.so "$m/mooncake_master")
  if LD_LIBRARY_PATH="$libs" ldd "${objs[@]}" | grep 'not found' | grep -Ev 'libcuda\.so|libcudart\.so'; then
    die "libraries above not found here (apt-get install them, then pack again)"
  fi
  LD_LIBRARY_PATH="$libs" ldd "${objs[@]}" | awk '/=> \//{print $3}' | sort -u |
    grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libresolv|ld-linux[^/]*)\.so' |
    grep -v "$work/pkg/site" | grep -Ev '/libcudart?\.so' |
    while read -r lib; do cp -L "$lib" "$work/pkg/lib/"; done
  rm -f "$out/mooncake.tar.xz"
  tar -C "$work/pkg" -cf - site lib | xz -6 -T0 >"$out/mooncake.tar.xz"
  ls "$work/pkg/lib" | tr '\n' ' '
  echo
  ls -l "$out/mooncake.tar.xz"
}

# sonames that the store's module or mooncake_master cannot find
missing() {
  ldd "$dest"/site/mooncake/_store.*.so "$dest/site/mooncake/mooncake_master" 2>/dev/null |
    awk '/not found/{print $1}' | sort -u
}

install() {
  local src=$1
  if [ -z "$src" ] || [ ! -d "$src" ]; then die "install: no folder '$src'"; fi
  rm -rf "$dest"
  mkdir -p "$dest/site" "$dest/ld"
  if [ -f "$src/mooncake.tar.xz" ]; then
    tar -xJf "$src/mooncake.tar.xz" -C "$dest"
  else
    local whl
    whl=$(ls "$src"/mooncake_transfer_engine*.whl 2>/dev/null | head -1 || true)
    [ -n "$whl" ] || die "install: neither $src/mooncake.tar.xz nor a mooncake wheel in $src"
    python3 -m pip install -q --no-deps --no-index --no-compile --target "$dest/site" "$whl"
    if [ -d "$src/lib" ]; then cp -a "$src/lib" "$dest/lib"; fi
  fi
  mkdir -p "$dest/lib"
  # CUDA's runtime of the machine's torch (the module needs libcudart.so.13)
  local cudart
  cudart=$(timeout 120 python3 -c 'import glob, os, sys
for p in sys.path:
    for f in glob.glob(os.path.join(p, "nvidia", "*", "lib", "libcudart.so.13")):
        print(os.path.dirname(f)); sys.exit()' || true)
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}${cudart:+$cudart:}$dest/ld"
  # the carried libraries the machine lacks, until nothing more is found
  local so new
  for _ in 1 2 3 4 5 6; do
    new=0
    for so in $(missing); do
      if [ -e "$dest/lib/$so" ] && [ ! -e "$dest/ld/$so" ]; then
        ln -s "../lib/$so" "$dest/ld/$so"
        new=1
      fi
    done
    # libmlx5 is libibverbs' provider: both from one rdma-core or neither
    for so in libibverbs.so.1 libmlx5.so.1; do
      if [ -e "$dest/ld/libibverbs.so.1" ] || [ -e "$dest/ld/libmlx5.so.1" ]; then
        if [ -e "$dest/lib/$so" ] && [ ! -e "$dest/ld/$so" ]; then ln -s "../lib/$so" "$dest/ld/$so"; new=1; fi
      fi
    done
    [ "$new" = 1 ] || break
  done
  if [ -n "$(missing)" ]; then
    die "still not found: $(missing | tr '\n' ' ')"
  fi
  cat >"$dest/env.sh" <<EOF
# written by python/integrations/mooncake_gpu.sh install
export PYTHONPATH="\${PYTHONPATH:+\$PYTHONPATH:}$dest/site"
export LD_LIBRARY_PATH="\${LD_LIBRARY_PATH:+\$LD_LIBRARY_PATH:}${cudart:+$cudart:}$dest/ld"
export PATH="$dest/site/mooncake:\$PATH"
export MOONCAKE_MASTER="$dest/site/mooncake/mooncake_master"
EOF
  echo "mooncake-gpu: linked from lib/: $(ls "$dest/ld" | tr '\n' ' ')"
  (
    . "$dest/env.sh"
    timeout 60 "$MOONCAKE_MASTER" --version | head -1
    timeout 300 python3 -c 'import mooncake.store as s; print("mooncake-gpu: import ok,", s.MooncakeDistributedStore)'
  ) || die "install: the check failed"
  du -sh "$dest"
}

check() {
  [ -f "$dest/env.sh" ] || die "check: install first ($dest/env.sh)"
  . "$dest/env.sh"
  timeout 300 python3 - <<'PY'
import os, socket, subprocess, sys, tempfile, time

def ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    out = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return out

rpc, http, met = ports(3)
log = tempfile.NamedTemporaryFile(prefix="mooncake-master-", suffix=".log", delete=False)
m = subprocess.Popen([os.environ["MOONCAKE_MASTER"], "--rpc_address=127.0.0.1",
                      "--rpc_port=%d" % rpc, "--enable_http_metadata_server=true",
                      "--http_metadata_server_host=127.0.0.1",
                      "--http_metadata_server_port=%d" % http, "--metrics_host=127.0.0.1",
                      "--metrics_port=%d" % met, "--enable_metric_reporting=false"],
                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
try:
    end = time.monotonic() + 30
    for p in (rpc, http):
        while True:
            if m.poll() is not None:
                sys.exit("mooncake-gpu: mooncake_master exited: " + open(log.name).read()[-2000:])
            try:
                socket.create_connection(("127.0.0.1", p), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > end:
                    sys.exit("mooncake-gpu: mooncake_master not listening in 30 s")
                time.sleep(0.1)
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    n, k = 64 << 20, 16
    try:  # GPU memory, as vLLM's KV caches; host memory where torch is missing
        import torch
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        a = torch.randint(0, 255, (n,), dtype=torch.uint8, device=dev)
        b = torch.zeros_like(a)
        pa, pb, same = a.data_ptr(), b.data_ptr(), lambda: bool(torch.equal(a, b))
    except ImportError:
        import ctypes
        dev = "host"
        a = ctypes.create_string_buffer(os.urandom(n), n)
        b = ctypes.create_string_buffer(n)
        pa, pb, same = ctypes.addressof(a), ctypes.addressof(b), lambda: a.raw == b.raw
    from mooncake.store import MooncakeDistributedStore
    st = MooncakeDistributedStore()
    rc = st.setup("127.0.0.1", "http://127.0.0.1:%d/metadata" % http, 256 << 20, 64 << 20,
                  "tcp", "", "127.0.0.1:%d" % rpc)
    assert rc == 0, "setup %d" % rc
    for p in (pa, pb):
        assert st.register_buffer(p, n) == 0
    keys = ["k%d" % i for i in range(k)]
    sz = n // k
    t0 = time.perf_counter()
    rcs = st.batch_put_from(keys, [pa + i * sz for i in range(k)], [sz] * k)
    t1 = time.perf_counter()
    got = st.batch_get_into(keys, [pb + i * sz for i in range(k)], [sz] * k)
    t2 = time.perf_counter()
    ok = rcs == [0] * k and got == [sz] * k and same()
    print("mooncake-gpu: %s round trip of 64 MiB: put %.3f s, get %.3f s, %s"
          % (dev, t1 - t0, t2 - t1, "equal" if ok else "NOT equal %s %s" % (rcs, got)))
    st.close()
    sys.exit(0 if ok else 1)
finally:
    m.terminate()
    try:
        m.wait(10)
    except subprocess.TimeoutExpired:
        m.kill()
PY
}

case "${1:-}" in
  pack) pack "${2:-}" ;;
  install) dest=${3:-$dest}; install "${2:-}" ;;
  check) dest=${2:-$dest}; check ;;
  *)
    awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"
    exit 2
    ;;
esac
