#!/usr/bin/env bash
# Integration test of `kvferry calc --html`: the page opens in headless
# Chromium (no server), takes its inputs from the prefilled flags and from
# the URL query string, and its JavaScript model gives the same numbers as
# `kvferry calc --json` (within 1e-9); the chart is drawn with the
# break-even point marked; a screenshot is taken (calc.png in
# $KVF_TEST_OUT). Exit 77 (skip) when chromium is not installed.
set -euo pipefail

BIN=${KVF_BIN:?KVF_BIN must name the kvferry binary}
CHROMIUM=${KVF_CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
if [ -z "$CHROMIUM" ]; then
  echo "SKIP: chromium not installed: this test renders the page in headless" \
    "Chromium; scripts/test.sh installs it (scripts/setup.sh --with-browser)"
  exit 77
fi
command -v python3 >/dev/null || { echo "SKIP: python3 missing"; exit 77; }

tmp=$(mktemp -d /tmp/kvf_calc_html.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
out=${KVF_TEST_OUT:-$tmp}
mkdir -p "$out"
n=0

# browse URL ARGS...: runs headless Chromium with a fresh profile.
browse() {
  n=$((n + 1))
  timeout 90 "$CHROMIUM" --headless --no-sandbox --disable-gpu \
    --no-first-run --disable-dev-shm-usage --disable-extensions \
    --user-data-dir="$tmp/profile-$n" "$@" 2>"$tmp/chromium-$n.log"
}

# check NAME "CALC FLAGS" "QUERY": the page written with FLAGS and opened
# with ?QUERY must show what `kvferry calc FLAGS+QUERY-as-flags --json`
# prints.
check() {
  local name=$1 flags=$2 query=$3 qflags=$4
  # shellcheck disable=SC2086
  "$BIN" calc $flags --html "$tmp/$name.html" 2>/dev/null
  # shellcheck disable=SC2086
  "$BIN" calc $flags $qflags --json >"$tmp/$name.json"
  if grep -Eiq '<script[^>]+src=|<link |@import|fetch\(|XMLHttpRequest' \
      "$tmp/$name.html"; then
    echo "FAIL $name: the page loads something from outside"
    exit 1
  fi
  browse --dump-dom "file://$tmp/$name.html${query:+?$query}" \
    >"$tmp/$name.dom" || { echo "FAIL $name: chromium"; \
    cat "$tmp/chromium-$n.log"; exit 1; }
  python3 - "$tmp/$name.dom" "$tmp/$name.json" "$name" <<'EOF'
import json, re, sys
dom = open(sys.argv[1], encoding='utf-8').read()
want = json.load(open(sys.argv[2]))['results']
name = sys.argv[3]
got = dict(re.findall(r'id="out-([a-z0-9_]+)" data-value="([^"]*)"', dom))
keys = ['kv_bytes_per_token', 'prefix_bytes', 'net_s', 'h2d_s', 'fixed_s',
        'load_s', 'recompute_flops', 'recompute_s', 'speedup', 'verdict',
        'breakeven_tokens']
bad = []
for k in keys:
    if k not in got:
        bad.append('%s missing from the page' % k)
        continue
    w, g = want[k], got[k]
    if k == 'verdict':
        ok = g == w
    elif w is None:
        ok = g == 'null'
    else:
        ok = g != 'null' and abs(float(g) - w) <= 1e-9 * max(abs(w), 1e-12)
    if not ok:
        bad.append('%s: page %s, kvferry calc %s' % (k, g, w))
# the chart: an SVG with both curves and, when there is one, the
# break-even mark at the computed length
if 'id="chart-svg"' not in dom or dom.count('class="kvf-series"') != 2:
    bad.append('chart with two series missing')
be = want['breakeven_tokens']
m = re.search(r'id="chart-breakeven"[^>]*data-x="([^"]*)"', dom)
if be is not None and be > 0:
    if not m or abs(float(m.group(1)) - be) > 1e-9 * be:
        bad.append('break-even mark missing or misplaced')
if bad:
    print('FAIL %s:\n  ' % name + '\n  '.join(bad))
    sys.exit(1)
print('ok %s: verdict %s, load %.4g s, recompute %.4g s, break-even %s'
      % (name, want['verdict'], want['load_s'], want['recompute_s'],
         'none' if be is None else '%.0f tokens' % be))
EOF
}

# seed 003 §2.4's worked example (the defaults)
check example "" "" ""
# the 1K case with larger fixed overheads, inputs from the URL query
check short "--model llama3-70b" "tokens=1024&query_ms=30&sync_ms=10" \
  "--tokens 1024 --query-ms 30 --sync-ms 10"
# MLA, attention term, overlap, one NIC per GPU, TFLOPS from a reference
check mla "--model deepseek-v3 --attention --overlap --links 8 --gpu-ref gpu.h20.bf16" "" ""
# a preset and deployment picked in the URL
check url "" "model=qwen2.5-72b&gpus=4&util=0.4&overlap=1" \
  "--model qwen2.5-72b --gpus 4 --util 0.4 --overlap"
# no break-even: a slow link
check slow "--link-gbs 0.5 --tokens 4096" "" ""
grep -q '"breakeven_tokens": null' "$tmp/slow.json" || {
  echo "FAIL slow: expected no break-even"; exit 1; }

# the page shows where each input came from
grep -q 'reference gpu.h20.bf16 (vendor spec' "$tmp/mla.dom" || {
  echo "FAIL mla: source of TFLOPS not shown"; exit 1; }
grep -q 'URL query' "$tmp/url.dom" || {
  echo "FAIL url: source 'URL query' not shown"; exit 1; }

# screenshot of the worked example at 1K tokens
browse --window-size=1280,1500 --screenshot="$out/calc.png" \
  "file://$tmp/example.html?tokens=1024" >/dev/null
python3 - "$out/calc.png" <<'EOF'
import struct, sys
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG'
w, h = struct.unpack('>II', data[16:24])
assert (w, h) == (1280, 1500), (w, h)
assert len(data) > 30000, 'suspiciously small screenshot: %d bytes' % len(data)
print('ok screenshot %s (%dx%d, %d bytes)' % (sys.argv[1], w, h, len(data)))
EOF
echo "PASS"
