#!/usr/bin/env bash
# Integration test of the `kvferry calc` command line (no browser): the
# defaults reproduce seed 003 §2.4's worked example in the table and in
# --json; inputs from reference figures (--ref, --gpu-ref, --link-ref,
# --h2d-ref) and from measured records (--from-record) land in the right
# input and name their source; bad inputs exit 2 with a message; --list
# shows presets and every reference figure with its kind.
set -euo pipefail

BIN=${KVF_BIN:?KVF_BIN must name the kvferry binary}
SRC=${KVF_SRC:?KVF_SRC must name the source tree}
command -v python3 >/dev/null || { echo "SKIP: python3 missing"; exit 77; }
tmp=$(mktemp -d /tmp/kvf_calc_cli.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*"; exit 1; }

# The worked example, as a table.
"$BIN" calc >"$tmp/table.txt"
for want in "320.00 KiB" "10.00 GiB (10.74 GB)" "network, serial (1 link)" \
            "233.42 ms" "26.84 ms" "1.170 s" "verdict" "load: 4.33x faster" \
            "break-even prefix"; do
  grep -qF "$want" "$tmp/table.txt" || fail "table lacks '$want'"
done

# jq-like checks on --json with python.
json() { # json "FLAGS" 'python expression over d' [message]
  local flags=$1 expr=$2
  # shellcheck disable=SC2086
  "$BIN" calc $flags --json >"$tmp/out.json" || fail "calc $flags failed"
  python3 -c "
import json, sys
d = json.load(open('$tmp/out.json'))
r, i, m = d['results'], d['inputs'], d['model']
ok = $expr
if not ok:
    print(json.dumps(d, indent=1)[:3000])
    sys.exit(1)
" || fail "calc $flags: $expr"
}

json "" "r['kv_bytes_per_token'] == 327680 and r['prefix_bytes'] == 10 * 2**30 and abs(r['net_s'] - 0.2334) < 1e-3 and abs(r['h2d_s'] - 0.0268) < 1e-3 and abs(r['recompute_s'] - 1.17) < 0.01 and r['verdict'] == 'load'"
json "--tokens 1K --query-ms 30 --sync-ms 10" "r['verdict'] == 'recompute' and r['breakeven_tokens'] > 1024 and i['tokens']['source'] == 'flag --tokens' and i['query_ms']['source'] == 'flag --query-ms'"
json "--model deepseek-v3" "r['kv_bytes_per_token'] == 61 * 576 * 2 and m['mla_rank'] == 512 and m['params_active'] == 37e9"
json "--model llama3-8b --kv-heads 4" "r['kv_bytes_per_token'] == 2 * 32 * 4 * 128 * 2 and '--kv-heads' in m['source']"
json "--util 40%" "abs(i['util']['value'] - 0.4) < 1e-12"
json "--params 70B" "m['params_active'] == 70e9 and abs(r['recompute_s'] - 1.16) < 0.01"

# Reference figures: each lands in its input, with kind and source.
json "--gpu-ref gpu.h20.bf16 --link-ref mooncake.te.8x400g --h2d-ref pcie.gen4x16.h2d" \
  "i['tflops']['value'] == 148 and 'vendor spec' in i['tflops']['source'] and i['link_gbs']['value'] == 190 and 'project published result' in i['link_gbs']['source'] and i['h2d_gbs']['value'] == 25 and 'commonly measured range' in i['h2d_gbs']['source'] and len(d['used']) == 3"
json "--ref nic.200g.line --ref gpu.a100-sxm.bf16" \
  "i['link_gbs']['value'] == 25 and i['tflops']['value'] == 312"
# a flag beats a reference, whatever the order
json "--link-gbs 10 --link-ref nic.400g.rdma" \
  "i['link_gbs']['value'] == 10 and i['link_gbs']['source'] == 'flag --link-gbs'"

# Measured records: the best GB/s figure, converted, with its source.
link=$(ls "$SRC"/tests/fixtures/records/*-bench-link.json | head -1)
best=$(python3 -c "
import json
f = json.load(open('$link'))['results']['key_figures']
conv = {'GB/s': 1, 'GiB/s': 1.073741824, 'Gbps': 0.125}
print(max(k['value'] * conv[k['unit']] for k in f if k['unit'] in conv))")
json "--from-record $link" \
  "abs(i['link_gbs']['value'] - $best) < 1e-9 * $best and i['link_gbs']['source'].startswith('record ') and d['used'][0]['type'] == 'record'"
json "--from-record h2d=$link" \
  "abs(i['h2d_gbs']['value'] - $best) < 1e-9 * $best and i['link_gbs']['value'] == 46"
"$BIN" calc --from-record "$link" | grep -q "record $link" ||
  fail "table does not name the record"

# Bad inputs: exit 2 and say why.
bad() { # bad "FLAGS" "expected message"
  local rc=0
  # shellcheck disable=SC2086
  "$BIN" calc $1 >/dev/null 2>"$tmp/err" || rc=$?
  [ "$rc" -eq 2 ] || fail "calc $1: exit $rc, want 2"
  grep -q "$2" "$tmp/err" || fail "calc $1: message lacks '$2': $(cat "$tmp/err")"
}
bad "--util 0" "util"
bad "--util 150%" "utilisation"
bad "--gpus 0" "gpus"
bad "--tokens lots" "not a number"
bad "--model gpt-9" "no preset"
bad "--ref no.such.figure" "no reference figure"
bad "--gpu-ref nic.400g.line" "cannot"
bad "--link-ref lat.tcp.small" "cannot"
bad "--from-record /nonexistent.json" "nonexistent"
bad "--from-record $SRC/data/reference.json" "not a kvferry record"
rc=0
"$BIN" calc --ref-file /nonexistent.json >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "reference figures" "$tmp/err" ||
  fail "--ref-file of a missing file: exit $rc, $(cat "$tmp/err")"

# --list: presets and every figure, with its kind.
"$BIN" calc --list >"$tmp/list.txt"
for want in llama3-70b deepseek-v3 qwen2.5-72b "vendor spec" \
            "commonly measured range" "project published result"; do
  grep -q "$want" "$tmp/list.txt" || fail "--list lacks '$want'"
done
n=$(python3 -c "import json; print(len(json.load(open('$SRC/data/reference.json'))['figures']))")
[ "$(sed -n '/^reference figures/,$p' "$tmp/list.txt" |
     grep -cE '^  [a-z0-9]+\.[^ ]+ ')" -eq "$n" ] ||
  fail "--list does not show all $n figures"
echo "PASS"
