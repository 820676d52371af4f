#!/usr/bin/env bash
# On the GPU machine: the vLLM connector's benchmarks of
# docs/integrations.md in stages, each printing a short summary and
# packing its records into $OUT/<stage>.tgz (what a call brings back).
#
#   python/integrations/vllm_gpu_session.sh STAGE...
#
# STAGE:
#   binaries DIR   unpack DIR/gpu.tar.xz (a slim .dev/gpu) into .dev/gpu
#   vllm DIR       put vLLM's parts together (vllm_gpu_run.sh unpack DIR)
#   pytest         the GPU tests of kv_chunks and the connector
#   serve:VARIANT  serve_vllm.py's fresh-process runs (vllm_gpu_run.sh
#                  serve; 4p5b, 4p5b-b32, 4p5b-kv2, ...)
#   tiers          A / B / A again, per configuration (bench_vllm.py tiers)
#   load[:ARGS]    the OpenAI server under load (bench_vllm.py load; ARGS:
#                  extra options, commas for spaces, "+" for the commas of a
#                  list: load:--rate,5,--configs,none+offload+kvferry)
#   e2e            kvferry bench e2e at 32K (tests/gpu/e2e_run.sh test main32)
#
# Before: python/integrations/vllm_gpu_pack.sh and tests/gpu/stage-binaries.sh
# here, carried in calls of at most 64 MiB (docs/integrations.md says how).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kvf-vllm-out}
mkdir -p "$OUT"
run=python/integrations/vllm_gpu_run.sh

pack() { tar czf "$OUT/$1.tgz" -C "$OUT" "$1" 2>/dev/null; }

summary_serve() {
  python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("ok:", d["ok"], d["problems"])
for k, v in d["summary"].items():
    print("  %-36s %.4g" % (k, v))
for k, v in d["runs"].items():
    print("  %-9s generate %.3f s  cached %s  flush %.3f s" % (
        k, v["generate_s"], v["num_cached_tokens"], v.get("flush_s", 0.0)))
PY
}

while [ $# -gt 0 ]; do
  stage=$1
  shift
  t0=$(date +%s)
  echo "=== $stage"
  case "$stage" in
    binaries) mkdir -p .dev/gpu && tar -xJf "$1/gpu.tar.xz" -C .dev/gpu && ls .dev/gpu | wc -l; shift ;;
    vllm) $run unpack "$1"; shift ;;
    pytest) $run pytest "$OUT/pytest"; pack pytest ;;
    serve:*)
      v=${stage#serve:}
      $run serve "$v" "$OUT/serve-$v"
      f="$OUT/serve-$v/serve-vllm-gpu-$v.json"
      if [ -s "$f" ]; then summary_serve "$f"; else tail -30 "$OUT/serve-$v/serve-vllm-gpu-$v.log"; fi
      pack "serve-$v" ;;
    tiers)
      $run tiers "$OUT/tiers"
      python3 -c "import json;d=json.load(open('$OUT/tiers/bench-vllm-tiers.json'));[print(' ',c,json.dumps({k:v for k,v in r.items() if k!='connector'})) for c,r in d['configs'].items()]"
      pack tiers ;;
    load*)
      extra=${stage#load}; extra=${extra#:}
      extra=${extra//,/ }
      # shellcheck disable=SC2086
      $run load "$OUT/load" ${extra//+/,}
      pack load ;;
    e2e)
      OUT="$OUT/e2e" tests/gpu/e2e_run.sh test main32 2>&1 | tail -30
      pack e2e ;;
    *) echo "vllm-gpu-session: unknown stage $stage" >&2; exit 2 ;;
  esac
  echo "=== $stage done in $(( $(date +%s) - t0 )) s"
done
