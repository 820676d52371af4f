#!/usr/bin/env bash
# Runs the GPU tests and benchmarks on a GPU machine in one go, so that a
# lease is used once: optional build there (stage "build"), then the
# stages given. Binaries come from $KVF_GPU_BIN (default .dev/gpu: a
# kvferry and the test binaries built on a machine with nvcc, plus the
# shared libraries they need), logs and records go under $OUT (records
# packed into $OUT/records.tgz after every step, so a run cut short still
# returns what it measured).
#
#   tests/gpu/device_run.sh env test local net final
#   tests/gpu/device_run.sh sum      # checksumming kernels, kv GPU path
#   tests/gpu/device_run.sh abbin    # two host builds A/B'd (scripts/pack-ab.sh)
#   tests/gpu/device_run.sh authcost # one build with and without authentication
#   tests/gpu/device_run.sh authprof # the same under perf and strace
#   tests/gpu/device_run.sh abprof   # two host builds under perf (pack-ab.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
D="${KVF_GPU_BIN:-.dev/gpu}"
OUT="${OUT:-/tmp/kvf-gpu-out}"
R="$OUT/rec"
mkdir -p "$R"
export LD_LIBRARY_PATH="$PWD/$D:${LD_LIBRARY_PATH:-}"
export KVF_BIN="$PWD/$D/kvferry" KVF_SRC="$PWD"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B="$KVF_BIN"
pack() { tar czf "$OUT/records.tgz" -C "$OUT" rec 2>/dev/null; }
# a step runs in the background and is waited for, so that a TERM sent to
# this script (an outer timeout) reaches the step too instead of leaving
# it running beside whatever comes next
child=
trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; exit 143' TERM INT
step() { # step SECONDS NAME CMD...
  local t="$1" n="$2"; shift 2
  echo "=== $n: $*"
  local s=$(date +%s%N)
  timeout "$t" "$@" <&0 &
  child=$!
  wait "$child"
  local rc=$?
  child=
  echo "=== $n rc=$rc ($(( ($(date +%s%N) - s) / 1000000 )) ms)"
  pack
  return 0
}
blk() { step 120 "$1" "$B" bench blocks --device gpu "${@:2}"; }
# ab_unpack DIR: scripts/pack-ab.sh's archive ($AB_DIR/ab.tar.xz, default
# .dev/ab) into DIR, emptied first; fails unless both builds are there
ab_unpack() {
  rm -rf "$1" && mkdir -p "$1"
  step 60 ab-unpack tar -xJf "${AB_DIR:-.dev/ab}/ab.tar.xz" -C "$1"
  if [ ! -x "$1/before/kvferry-run" ] || [ ! -x "$1/after/kvferry-run" ]; then
    echo "=== no before/ and after/ in ${AB_DIR:-.dev/ab}/ab.tar.xz"
    return 1
  fi
}
# blke VAR=VALUE NAME ARGS...: the same with one setting in the environment
blke() { step 120 "$2" env "$1" "$B" bench blocks --device gpu "${@:3}"; }

for stage in "$@"; do
  case "$stage" in
  build)
    step 400 build bash -c "cmake -S . -B build-dev -G Ninja -DKVF_WERROR=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null && ninja -C build-dev kvferry \
      kvferry_static"
    ;;
  env)
    nvidia-smi; nvidia-smi topo -m; nvidia-smi nvlink -s 2>&1 | head -40
    nproc; free -g; uname -a
    step 60 bench-env "$B" bench env --record "$R"
    "$B" bench env > "$OUT/bench-env.txt" 2>&1
    ;;
  test)
    for t in test_gpu_absent test_gpu_api test_gpu_copy test_gpu_tcp \
      test_gpu_ipc test_gpu_ipc_engine test_gpu_store; do
      step 240 "$t" "$D/$t"
    done
    step 300 test_gpu_bench tests/gpu/test_gpu_bench.sh
    ;;
  local)
    step 120 h2d "$B" bench h2d --record "$R" --json "$R/h2d.json"
    for p in h2d d2h d2d p2p; do
      for k in warp bulk hybrid; do
        [ "$p" = d2d ] && [ "$k" = hybrid ] && continue
        blk "$p-$k" --path "$p" --kernel "$k" --verify --each-iters 2 \
          --json "$R/$p-$k.json"
      done
    done
    blk p2p-pull --path p2p --on-dst --kernel warp --verify --each-iters 1 \
      --json "$R/p2p-pull.json"
    blk h2d-pageable --path h2d --pageable --verify --each-iters 0 \
      --json "$R/h2d-pageable.json"
    blk d2h-pageable --path d2h --pageable --verify --each-iters 0 \
      --json "$R/d2h-pageable.json"
    ;;
  ucx)
    # local GPU memory over the ucx transport (UCX's tcp on loopback),
    # through the lanes' pinned buffers: the test, then seed 000's
    # workload from a GPU pool to a host pool, verified
    step 240 test_gpu_ucx env UCX_TLS=tcp,self KVF_UCX_TCP=1 "$D/test_gpu_ucx"
    step 200 ucx-gpu env UCX_TLS=tcp,self KVF_UCX_TCP=1 "$B" bench blocks --device gpu \
      --transport ucx,tcp --pool 2G --op both --verify --record "$R" \
      --json "$R/ucx-gpu.json"
    ;;
  net)
    blk tcp --pool 4G --op both --verify --record "$R" --json "$R/tcp.json"
    ;;
  ipc)
    # the same-host cuda path (CUDA IPC): target on GPU 1 (NVLink), then
    # on GPU 0 with the initiator; the local p2p path for comparison
    step 240 test_gpu_ipc_engine "$D/test_gpu_ipc_engine"
    blk cuda-p2p --transport cuda --pool 4G --op both --verify --record "$R" \
      --json "$R/cuda-p2p.json"
    blk cuda-same --transport cuda --peer-gpu 0 --pool 4G --op both \
      --verify --json "$R/cuda-same.json"
    blk p2p --path p2p --verify --each-iters 0 --json "$R/p2p.json"
    ;;
  diag)
    # what limits the SM paths: access order, huge-page host memory,
    # grid size and unrolling; and the staging slots of the tcp path
    for p in h2d d2h; do
      blk "$p-auto" --path "$p" --each-iters 1 --json "$R/$p-auto.json"
      blk "$p-seq" --path "$p" --sequential --each-iters 0 \
        --json "$R/$p-seq.json"
      blk "$p-thp" --path "$p" --host-alloc thp --verify --each-iters 0 \
        --json "$R/$p-thp.json"
      blke KVF_CUDA_UNROLL=4 "$p-u4" --path "$p" --each-iters 0 \
        --json "$R/$p-u4.json"
      blke KVF_CUDA_CTAS_PER_SM=2 "$p-c2" --path "$p" --each-iters 0 \
        --json "$R/$p-c2.json"
    done
    blk p2p-auto --path p2p --verify --each-iters 1 --json "$R/p2p-auto.json"
    blke KVF_CUDA_CTAS_PER_SM=2 p2p-c2 --path p2p --each-iters 0 \
      --json "$R/p2p-c2.json"
    blk p2p-seq --path p2p --sequential --each-iters 0 \
      --json "$R/p2p-seq.json"
    blk d2d-auto --path d2d --verify --each-iters 1 --json "$R/d2d-auto.json"
    blk tcp --pool 4G --op both --verify --json "$R/tcp.json"
    step 120 tcp-1m env KVF_CUDA_STAGE_BYTES=1M KVF_CUDA_STAGE_SLOTS=4 \
      "$B" bench blocks --device gpu --pool 4G --op both --no-host \
      --json "$R/tcp-1m.json"
    ;;
  ab)
    # A/B in one run: cuda with 1 MiB and 2 MiB engine chunks, tcp
    # staging for comparison
    blk tcp --transport tcp --pool 4G --op both --verify \
      --json "$R/tcp.json"
    blke KVF_CHUNK_BYTES=2M cuda-2m --transport cuda --pool 4G --op both \
      --verify --json "$R/cuda-2m.json"
    blk cuda-1m --transport cuda --pool 4G --op both --verify \
      --json "$R/cuda-1m.json"
    ;;
  tcpfinal)
    blk tcp --transport tcp --pool 4G --op both --iters 9 --verify \
      --record "$R"
    ;;
  cudafinal)
    step 60 bench-env "$B" bench env --record "$R"
    step 240 test_gpu_ipc_engine "$D/test_gpu_ipc_engine"
    blk cuda --transport cuda --pool 4G --op both --iters 9 --verify \
      --record "$R"
    blk cuda-same --transport cuda --peer-gpu 0 --pool 4G --op both \
      --iters 9 --verify --record "$R"
    ;;
  p2pab)
    # GPU->GPU A/B in one lease: block list read over PCIe (mapped) or
    # kept in GPU memory; two rounds; the copy tests first
    step 240 test_gpu_copy "$D/test_gpu_copy"
    for round in 1 2; do
      a="--path p2p --pool 2G --iters 9 --each-iters 0"
      blk "p2p-base-$round" $a --json "$R/p2p-base-$round.json"
      blk "p2p-gpulist-$round" $a --blocks-on gpu \
        --json "$R/p2p-gpulist-$round.json"
    done
    blk p2p-verify --path p2p --pool 2G --verify --each-iters 0 \
      --json "$R/p2p-verify.json"
    ;;
  wpbab)
    # warps per block (cuda_warps_per_block: 1 = one warp per block, the
    # old kernel; 0 = auto; 2; 4), with the block list on the host or the
    # GPU; copy tests with forced sharing first; two rounds
    step 240 test_gpu_copy-wpb4 env KVF_CUDA_WARPS_PER_BLOCK=4 \
      "$D/test_gpu_copy"
    step 240 test_gpu_copy-wpb1 env KVF_CUDA_WARPS_PER_BLOCK=1 \
      "$D/test_gpu_copy"
    a="--pool 2G --iters 9 --each-iters 0"
    for round in 1 2; do
      for w in 1 0 2 4; do
        blke KVF_CUDA_WARPS_PER_BLOCK=$w "p2p-wpb$w-$round" --path p2p $a \
          --json "$R/p2p-wpb$w-$round.json"
      done
      for w in 1 0; do
        blke KVF_CUDA_WARPS_PER_BLOCK=$w "p2p-wpb$w-gpulist-$round" \
          --path p2p $a --blocks-on gpu \
          --json "$R/p2p-wpb$w-gpulist-$round.json"
      done
    done
    for p in h2d d2d; do
      for w in 1 0; do
        blke KVF_CUDA_WARPS_PER_BLOCK=$w "$p-wpb$w" --path $p $a \
          --json "$R/$p-wpb$w.json"
      done
    done
    ;;
  resab)
    # resident copy kernel (cuda_resident) against one launch per batch,
    # GPU->GPU with the records' 8 GiB pools, two rounds: CTAs per SM of
    # the resident grid, list on the GPU, kernels on the destination
    # (pull); h2d and d2d with it on and off; copy tests under it first
    step 240 test_gpu_copy-res-on env KVF_CUDA_RESIDENT=on "$D/test_gpu_copy"
    step 240 test_gpu_copy-res-off env KVF_CUDA_RESIDENT=off \
      "$D/test_gpu_copy"
    a="--path p2p --iters 9 --each-iters 0"
    for round in 1 2; do
      v=""
      [ "$round" = 1 ] && v="--verify"
      blke KVF_CUDA_RESIDENT=off "p2p-launch-$round" $a \
        --json "$R/p2p-launch-$round.json"
      blke KVF_CUDA_RESIDENT=p2p "p2p-res2-$round" $a $v \
        --json "$R/p2p-res2-$round.json"
      for c in 1 3; do
        step 120 "p2p-res$c-$round" env KVF_CUDA_RESIDENT=p2p \
          KVF_CUDA_RESIDENT_CTAS=$c "$B" bench blocks --device gpu $a \
          --json "$R/p2p-res$c-$round.json"
      done
      blke KVF_CUDA_RESIDENT=p2p "p2p-res2-gpulist-$round" $a --blocks-on gpu \
        $v --json "$R/p2p-res2-gpulist-$round.json"
      blke KVF_CUDA_RESIDENT=off "p2p-launch-gpulist-$round" $a \
        --blocks-on gpu --json "$R/p2p-launch-gpulist-$round.json"
      blke KVF_CUDA_RESIDENT=p2p "p2p-res2-pull-$round" $a --on-dst $v \
        --json "$R/p2p-res2-pull-$round.json"
      blke KVF_CUDA_RESIDENT=off "p2p-launch-pull-$round" $a --on-dst \
        --json "$R/p2p-launch-pull-$round.json"
    done
    for p in h2d d2d; do
      for m in off on; do
        blke KVF_CUDA_RESIDENT=$m "$p-res$m" --path $p --iters 9 \
          --each-iters 0 --verify --json "$R/$p-res$m.json"
      done
    done
    ;;
  resfinal)
    # the resident kernel's A/B again on the final code: launch per batch
    # vs resident (the default), GPU->GPU, two rounds; h2d and d2d with
    # it off (the default) and on
    a="--path p2p --iters 9 --each-iters 0"
    for round in 3 4; do
      blke KVF_CUDA_RESIDENT=off "p2p-launch-$round" $a \
        --json "$R/p2p-launch-$round.json"
      blk "p2p-res2-$round" $a --json "$R/p2p-res2-$round.json"
    done
    for p in h2d d2d; do
      for m in off on; do
        blke KVF_CUDA_RESIDENT=$m "$p-res$m-2" --path $p --iters 9 \
          --each-iters 0 --json "$R/$p-res$m-2.json"
      done
    done
    ;;
  descab)
    # two builds of kvferry A/B'd in one lease: $D/kvferry-s3a ("old")
    # against $B ("new"), three rounds interleaved: GPU->GPU resident
    # (default) and launched, H2D, d2d. s3 run 3: old = the committed
    # code, new = the next descriptor shared after the block's copy
    # (no gain, reverted; docs/gpu.md)
    O="$D/kvferry-s3a"
    a="--iters 9 --each-iters 0"
    for round in 1 2 3; do
      for v in old new; do
        bin="$B"
        [ "$v" = old ] && bin="$O"
        step 120 "p2p-$v-$round" "$bin" bench blocks --device gpu \
          --path p2p $a --json "$R/p2p-$v-$round.json"
        step 120 "p2p-launch-$v-$round" env KVF_CUDA_RESIDENT=off "$bin" \
          bench blocks --device gpu --path p2p $a \
          --json "$R/p2p-launch-$v-$round.json"
        if [ "$round" != 3 ]; then
          for p in h2d d2d; do
            step 120 "$p-$v-$round" "$bin" bench blocks --device gpu \
              --path $p $a --json "$R/$p-$v-$round.json"
          done
        fi
      done
    done
    ;;
  abtable)
    # shares of contiguous of every JSON under $R, one line each
    python3 - "$R" <<'PY'
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    try:
        d = json.load(open(f))
        rows = d["rows"]
        sh = " / ".join("%.1f" % (100 * r["share_of_contiguous"]) for r in rows)
        gb = " / ".join("%.0f" % r["gib_s"] for r in rows)
        print("%-34s %-28s %s GiB/s" % (os.path.basename(f)[:34], sh, gb))
    except Exception:
        pass
PY
    ;;
  localfinal)
    # records of the local paths with the defaults (no tcp/cuda transports)
    step 120 h2d "$B" bench h2d --record "$R"
    for p in h2d d2h d2d; do
      blk "$p" --path "$p" --verify --record "$R"
    done
    ;;
  p2pfinal)
    # GPU->GPU records with the defaults: three runs, host-resident block
    # list (the default) and a GPU-resident one
    step 60 bench-env "$B" bench env --record "$R"
    for round in 1 2 3; do
      blk "p2p-$round" --path p2p --verify --record "$R"
    done
    blk p2p-gpulist --path p2p --blocks-on gpu --verify --each-iters 0 \
      --record "$R"
    ;;
  store)
    step 240 test_gpu_store "$D/test_gpu_store"
    ;;
  sum)
    # checksums computed by the copy kernels (GPU vs host, bit for bit),
    # kvferry.kv's GPU path (torch CUDA caches) and its benches: a 4K
    # request's save/load against the pinned ceiling, with and without a
    # store, and a verified 32K prefix load against the H2D ceiling and
    # kvferry calc. Needs .dev/gpu from tests/gpu/stage-binaries.sh (the
    # Python package finds libkvferry.so there through KVFERRY_LIB).
    export KVFERRY_LIB="$PWD/$D/libkvferry.so" KVFERRY_BIN="$B"
    export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
    step 60 bench-env "$B" bench env --record "$R"
    step 60 test_gpu_xxh3 "$D/test_gpu_xxh3"
    step 120 test_gpu_sum "$D/test_gpu_sum"
    step 240 test_gpu_api "$D/test_gpu_api"
    step 120 kv-gpu-tests python3 python/tests/test_kv_gpu.py
    blk h2d-verify --path h2d --verify --each-iters 0 --json "$R/h2d-verify.json"
    step 120 bench-kv python3 -m kvferry.bench_gpu kv --store --record "$R" \
      --json "$R/bench-kv.json"
    step 150 bench-prefix python3 -m kvferry.bench_gpu prefix --record "$R" \
      --json "$R/bench-prefix.json"
    # the 32K prefix through a store on this host (master + node): saved
    # over shm, loaded over shm and over tcp (forced), read and verifying
    # scatter overlapped; then the host half alone (no GPU involved)
    step 150 bench-remote python3 -m kvferry.bench_gpu remote --iters 5 \
      --record "$R" --json "$R/bench-remote.json"
    step 60 bench-store-cpu python3 -m kvferry.bench_gpu store-cpu --iters 5 \
      --record "$R" --json "$R/bench-store-cpu.json"
    ;;
  ceilings)
    # docs/performance.md "Ceilings" on this host: the main job's rows
    # (tcp, then shm with tcp interleaved) and the engine's curve, each a
    # share of a ceiling measured in the same run with the same
    # parallelism; the GPU rows against the copy engines' contiguous copy
    step 400 main-job bash -c "KVFERRY='$B' scripts/main-job.sh --no-setup \
      --pool 4G | tee '$OUT/main-job.txt'"
    step 200 te "$B" bench te --rounds 3 --record "$R" --json "$R/te.json"
    blk h2d-ceil --path h2d --verify --record "$R" --json "$R/h2d-ceil.json"
    blk d2h-ceil --path d2h --verify --record "$R" --json "$R/d2h-ceil.json"
    ;;
  wheel)
    # the portable wheel alone (python/build-wheel.sh, carried as
    # $WHEEL_DIR/*.whl): installed into a folder of its own with no
    # package index, then the GPU tests of kvferry.kv with nothing else of
    # kvferry's (no .dev/gpu, no LD_LIBRARY_PATH, no python/ on the path)
    w=$(ls "${WHEEL_DIR:-.dev/wheel}"/kvferry-*manylinux*.whl | head -1)
    site=/tmp/kvf-wheel-site
    rm -rf "$site"
    step 120 wheel-install python3 -m pip install -q --no-index --no-deps \
      --target "$site" "$w"
    step 400 wheel-gpu-tests env -u LD_LIBRARY_PATH -u KVFERRY_LIB -u KVFERRY_BIN \
      -u KVF_BIN PYTHONPATH="$site" bash -c "cd /tmp && python3 -c \
      'import kvferry, kvferry.kv_gpu as g; print(kvferry.__file__, g.gpu_count())' && \
      python3 -m pytest -q -rs -p no:cacheprovider --rootdir '$PWD/python' \
      '$PWD/python/tests/test_kv_gpu.py' '$PWD/python/tests/test_gpu.py' \
      '$PWD/python/tests/test_kv.py' '$PWD/python/tests/test_kv_chunks.py' \
      2>&1 | tee '$OUT/wheel-gpu-tests.txt' | tail -25"
    ;;
  abbin)
    # two builds of the kvferry command A/B'd on this host's CPUs, no GPU:
    # $AB_DIR/ab.tar.xz (default .dev/ab; made by scripts/pack-ab.sh)
    # holds before/ and after/, each a release kvferry (no CUDA) with the
    # Debian libraries it loads and a kvferry-run that puts them on
    # LD_LIBRARY_PATH (the A/B runs both from one process).
    # scripts/ab-binaries.py, AB_ROUNDS interleaved rounds (default 9: one
    # round took 34 s on the 2-core VM, so about 5 min), the workloads of
    # docs/security.md "Measured cost" (tcp and the default transport, the
    # store with tcp forced: no etcd, no redis; AB_ONLY, AB_ROUNDS and
    # AB_BLOCKS_ITERS override); runs and table in $OUT/ab and
    # $OUT/ab.tgz, the table printed.
    s=/tmp/kvf-ab
    mkdir -p "$OUT/ab"
    ab_unpack "$s" || continue
    cat "$s/before/COMMIT" "$s/after/COMMIT" 2>/dev/null | tee "$OUT/ab/commits.txt"
    nproc; uptime
    step 560 ab-binaries env -u LD_LIBRARY_PATH -u KVF_BIN \
      AB_ONLY="${AB_ONLY:-blocks-tcp,blocks-default,store,store-small}" \
      bash -c "set -o pipefail; python3 scripts/ab-binaries.py '$s/before/kvferry-run' \
      '$s/after/kvferry-run' '${AB_ROUNDS:-9}' '$OUT/ab' 2>&1 |
      tee '$OUT/ab/log.txt'"
    # one file for the call to bring back (its count of files is limited)
    tar czf "$OUT/ab.tgz" -C "$OUT" ab
    ;;
  authcost)
    # what authentication alone costs on this host's CPUs: the carried
    # kvferry with and without KVF_INSECURE=1 (scripts/bench-auth-cost.sh,
    # AB_ROUNDS interleaved rounds, default 6: about a minute each on the
    # 2-core VM; AB_ONLY default blocks-tcp,store,store-small); runs and
    # table in $OUT/authcost and $OUT/authcost.tgz, the table printed.
    step 570 authcost env AB_ONLY="${AB_ONLY:-blocks-tcp,store,store-small}" \
      scripts/bench-auth-cost.sh "$B" "${AB_ROUNDS:-6}" "$OUT/authcost"
    tar czf "$OUT/authcost.tgz" -C "$OUT" authcost
    ;;
  authprof)
    # where authentication's CPU goes on this host: the carried kvferry
    # with and without KVF_INSECURE=1, two rounds alternating, each a
    # 4 KiB store run (2 clients, tcp, 3 s phases, 64 MiB pools) under
    # perf stat, then perf record (reports by library and by symbol),
    # then once per mode strace -c. perf and strace come from
    # $PROF_TOOLS (scripts/pack-profilers.sh; default
    # .dev/prof/tools.tar.xz); everything in $OUT/prof and prof.tgz.
    p=/tmp/kvf-prof-tools
    rm -rf "$p" && mkdir -p "$p" "$OUT/prof"
    if ! tar -xJf "${PROF_TOOLS:-.dev/prof/tools.tar.xz}" -C "$p"; then
      echo "=== authprof: no ${PROF_TOOLS:-.dev/prof/tools.tar.xz}"
      continue
    fi
    pf="env LD_LIBRARY_PATH=$p/tools:$LD_LIBRARY_PATH $p/tools/perf"
    args="bench store --sizes 4K --clients 2 --duration 3s --pool 64M --quiet"
    for rd in 1 2; do
      for m in auth insecure; do
        e=KVF_INSECURE=0; [ "$m" = insecure ] && e=KVF_INSECURE=1
        o="$OUT/prof/$m.$rd"
        step 60 "stat-$m-$rd" env "$e" KVF_TRANSPORTS=tcp $pf stat \
          -e task-clock,context-switches,cpu-migrations -x, -o "$o.stat" \
          -- "$B" $args >"$o.bench-stat" 2>&1
        step 90 "record-$m-$rd" env "$e" KVF_TRANSPORTS=tcp $pf record \
          -F 4999 -g -o "$p/perf.data" -- "$B" $args >"$o.bench-record" 2>&1
        $pf report -i "$p/perf.data" --no-children --sort comm,dso -g none \
          --stdio >"$o.by-dso" 2>/dev/null
        $pf report -i "$p/perf.data" --no-children --sort dso,sym -g none \
          --percent-limit 0.2 --stdio >"$o.by-sym" 2>/dev/null
        [ "$rd" = 1 ] && step 90 "strace-$m" env "$e" KVF_TRANSPORTS=tcp \
          LD_LIBRARY_PATH="$p/tools:$LD_LIBRARY_PATH" "$p/tools/strace" -f -c \
          -o "$o.strace" -- "$B" $args >"$o.bench-strace" 2>&1
        grep -h '^kvferry' "$o.bench-stat"
      done
    done
    tar czf "$OUT/prof.tgz" -C "$OUT" prof
    ;;
  abprof)
    # where two builds' CPU goes on this host (scripts/pack-ab.sh's
    # archive, as abbin): PROF_ARGS (default: bench blocks over the
    # default transport, verified, 20 iterations) run by each build, two
    # rounds alternating, under perf stat and then perf record (report
    # by process, library and symbol); the host's huge-page settings and
    # CPU beside them. perf from $PROF_TOOLS as authprof; everything in
    # $OUT/abprof and abprof.tgz.
    s=/tmp/kvf-ab p=/tmp/kvf-prof-tools
    rm -rf "$p" && mkdir -p "$p" "$OUT/abprof"
    ab_unpack "$s" || continue
    if ! tar -xJf "${PROF_TOOLS:-.dev/prof/tools.tar.xz}" -C "$p"; then
      echo "=== abprof: no ${PROF_TOOLS:-.dev/prof/tools.tar.xz}"
      continue
    fi
    o="$OUT/abprof"
    grep -m1 'model\s*:' /proc/cpuinfo >"$o/host.txt"
    cat /sys/kernel/mm/transparent_hugepage/enabled \
      /sys/kernel/mm/transparent_hugepage/shmem_enabled >>"$o/host.txt"
    pf="env LD_LIBRARY_PATH=$p/tools $p/tools/perf"
    args=${PROF_ARGS:-"bench blocks --op both --verify --pool 1G --sizes 16M,64M,256M --iters 20 --no-link"}
    for rd in 1 2; do
      for b in before after; do
        [ "$rd" = 2 ] && b=$([ "$b" = before ] && echo after || echo before)
        step 90 "stat-$b-$rd" $pf stat -e task-clock,page-faults,context-switches,cpu-migrations \
          -x, -o "$o/$b.$rd.stat" -- "$s/$b/kvferry-run" $args >"$o/$b.$rd.out" 2>&1
        step 120 "record-$b-$rd" $pf record -F 1999 -o "$p/perf.data" \
          -- "$s/$b/kvferry-run" $args >"$o/$b.$rd.record-out" 2>&1
        $pf report -i "$p/perf.data" --no-children --sort comm,dso,sym \
          --percent-limit 0.3 --stdio >"$o/$b.$rd.by-sym" 2>/dev/null
        grep -h 'BW=' "$o/$b.$rd.out"
        cat "$o/$b.$rd.stat"
      done
    done
    tar czf "$OUT/abprof.tgz" -C "$OUT" abprof
    ;;
  quick)
    for t in test_gpu_copy test_gpu_tcp test_gpu_ipc test_gpu_ipc_engine; do
      step 240 "$t" "$D/$t"
    done
    ;;
  final)
    step 60 bench-env "$B" bench env --record "$R"
    step 120 h2d "$B" bench h2d --record "$R"
    for p in h2d d2h d2d p2p; do
      blk "$p" --path "$p" --verify --record "$R"
    done
    blk h2d-pageable --path h2d --pageable --verify --each-iters 0 \
      --json "$R/h2d-pageable.json"
    blk d2h-pageable --path d2h --pageable --verify --each-iters 0 \
      --json "$R/d2h-pageable.json"
    blk tcp --transport tcp --pool 4G --op both --iters 9 --verify \
      --record "$R"
    blk cuda --transport cuda --pool 4G --op both --iters 9 --verify \
      --record "$R"
    blk cuda-same --transport cuda --peer-gpu 0 --pool 4G --op both \
      --iters 9 --verify --record "$R"
    ;;
  *)
    echo "unknown stage $stage"
    ;;
  esac
done
pack
ls -la "$OUT"
