#!/usr/bin/env bash
# Integration test of `kvferry report DIR`: the fixture records
# (tests/fixtures/records: real bench te / blocks / link runs and two
# drills, valid per docs/record.schema.json) become one page that headless
# Chromium renders without a server; its DOM must hold every recorded
# number: each series point as a chart marker, each P50/P99 as a bar, each
# drill's wrong bytes, longest wait, timeout and recovery, every key
# figure. Raw data files are skipped silently, non-records are listed as
# skipped. A screenshot is taken (report.png in $KVF_TEST_OUT).
# Exit 77 (skip) when chromium is not installed.
set -euo pipefail

BIN=${KVF_BIN:?KVF_BIN must name the kvferry binary}
SRC=${KVF_SRC:?KVF_SRC must name the source tree}
FIX=$SRC/tests/fixtures/records
CHROMIUM=${KVF_CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
command -v python3 >/dev/null || { echo "SKIP: python3 missing"; exit 77; }

tmp=$(mktemp -d /tmp/kvf_report.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
out=${KVF_TEST_OUT:-$tmp}
mkdir -p "$out"

# The fixtures follow the schema (when python3-jsonschema is there).
python3 - "$SRC/docs/record.schema.json" "$FIX" <<'EOF'
import glob, json, os, sys
try:
    import jsonschema
except ImportError:
    print('note: python3-jsonschema missing, fixtures not validated')
    sys.exit(0)
schema = json.load(open(sys.argv[1]))
v = jsonschema.Draft202012Validator(schema)
n = 0
for f in sorted(glob.glob(os.path.join(sys.argv[2], '*.json'))):
    if f.endswith('.data.json'):
        continue
    v.validate(json.load(open(f)))
    n += 1
print('ok %d fixture records valid per docs/record.schema.json' % n)
EOF

# Command-line behaviour that needs no browser.
mkdir "$tmp/empty"
if "$BIN" report "$tmp/empty" 2>/dev/null; then
  echo "FAIL: a folder without records must fail"; exit 1
fi
if "$BIN" report "$tmp/no-such-dir" 2>/dev/null; then
  echo "FAIL: a missing folder must fail"; exit 1
fi
"$BIN" report "$FIX" -o - 2>/dev/null | grep -q 'kvferry-record' || {
  echo "FAIL: -o - must write the page to stdout"; exit 1; }

# The folder of the test: fixtures, a raw data file, a non-record.
mkdir "$tmp/records"
cp "$FIX"/*.json "$tmp/records/"
echo '{"hello": "not a record"}' >"$tmp/records/notes.json"
"$BIN" report "$tmp/records" -o "$tmp/report.html" --title "fixture records" \
  2>"$tmp/report.log"
grep -q 'skipping notes.json' "$tmp/report.log" || {
  echo "FAIL: notes.json not reported as skipped"; cat "$tmp/report.log"
  exit 1; }
if grep -Eiq '<script[^>]+src=|<link |@import|fetch\(|XMLHttpRequest' \
    "$tmp/report.html"; then
  echo "FAIL: the page loads something from outside"; exit 1
fi

if [ -z "$CHROMIUM" ]; then
  echo "SKIP: chromium not installed: this test renders the page in headless" \
    "Chromium; scripts/test.sh installs it (scripts/setup.sh --with-browser)"
  exit 77
fi
browse() {
  local name=$1
  shift
  timeout 90 "$CHROMIUM" --headless --no-sandbox --disable-gpu \
    --no-first-run --disable-dev-shm-usage --disable-extensions \
    --user-data-dir="$tmp/profile-$name" "$@" 2>"$tmp/chromium-$name.log"
}
browse dom --dump-dom "file://$tmp/report.html" >"$tmp/report.dom" || {
  echo "FAIL: chromium"; cat "$tmp/chromium-dom.log"; exit 1; }

python3 - "$tmp/report.dom" "$FIX" <<'EOF'
import glob, json, os, sys
from html.parser import HTMLParser

class Elements(HTMLParser):
    def __init__(self):
        super().__init__()
        self.els = []
    def handle_starttag(self, tag, attrs):
        self.els.append((tag, dict(attrs)))
    handle_startendtag = handle_starttag

dom = open(sys.argv[1], encoding='utf-8').read()
p = Elements()
p.feed(dom)
els = p.els
files = sorted(f for f in os.listdir(sys.argv[2])
               if f.endswith('.json') and not f.endswith('.data.json'))
recs = [json.load(open(os.path.join(sys.argv[2], f))) for f in files]
bad = []

def close(a, b):
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-300)

def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None

markers = [(num(a.get('data-x')), num(a.get('data-y')))
           for t, a in els if t == 'circle' and 'data-y' in a]
bars = [(a.get('data-category', ''), a.get('data-group'),
         num(a.get('data-value'))) for t, a in els
        if t == 'rect' and 'data-value' in a]
cells = [num(a.get('data-value')) for t, a in els
         if t == 'td' and 'data-value' in a]

if 'fixture records' not in dom:
    bad.append('title missing')
groups = set()
for i, (f, r) in enumerate(zip(files, recs), 1):
    label = '#%d %s' % (i, r['name'])
    if not any(a.get('id') == 'record-%d' % i for t, a in els):
        bad.append('%s: no overview row' % f)
    for s in r['results']['series']:
        groups.add((s['x_label'], s['y_label']))
        for x, y in s['points']:
            if not any(mx is not None and close(mx, x) and close(my, y)
                       for mx, my in markers):
                bad.append('%s: point (%s, %s) of %s not charted'
                           % (f, x, y, s['name']))
    for k in r['results']['key_figures']:
        if k['value'] is not None and not any(
                c is not None and close(c, k['value']) for c in cells):
            bad.append('%s: figure %s = %s not in the table'
                       % (f, k['name'], k['value']))
        for g in ('p50', 'p99'):
            if k[g] is None:
                continue
            cat = '%s: %s' % (label, k['name'])
            if not any(c == cat and grp == g.upper() and close(v, k[g])
                       for c, grp, v in bars):
                bad.append('%s: %s %s = %s has no bar' % (f, k['name'], g,
                                                          k[g]))
    d = r.get('drill')
    if r['kind'] == 'drill':
        row = 'drill-%d' % i
        tds = []
        inrow = False
        for t, a in els:
            if t == 'tr':
                inrow = a.get('id') == row
            elif inrow and t == 'td' and 'data-value' in a:
                tds.append((a.get('class', ''), a['data-value']))
        got = {c.split()[-1]: v for c, v in tds}
        for key, cls in (('wrong_bytes', 'wrong-bytes'),
                         ('max_wait_ms', 'max-wait'),
                         ('timeout_ms', 'timeout')):
            if cls not in got or not close(float(got[cls]), d[key]):
                bad.append('%s: %s %s shown as %s' % (f, key, d[key],
                                                      got.get(cls)))
        rec = d['time_to_recover_ms']
        shown = got.get('recovered')
        if (rec is None and shown != 'null') or \
           (rec is not None and (shown is None or not close(float(shown), rec))):
            bad.append('%s: recovery %s shown as %s' % (f, rec, shown))
        for grp, key in (('longest wait (ms)', 'max_wait_ms'),
                         ('timeout (ms)', 'timeout_ms')):
            if not any(c == label and g == grp and close(v, d[key])
                       for c, g, v in bars):
                bad.append('%s: no %s bar of %s' % (f, grp, d[key]))
        for name, v in d['resources'].items():
            if ('%s: ' % name) not in dom:
                bad.append('%s: resource %s not shown' % (f, name))

charts = [a.get('id') for t, a in els
          if t == 'svg' and (a.get('id') or '').startswith('series-')]
if len(charts) != len(groups):
    bad.append('%d series charts for %d quantities' % (len(charts),
                                                        len(groups)))
for want in ('block bytes', 'transfer bytes'):
    if not any(x == want for x, y in groups):
        bad.append('fixtures lack a series over %s' % want)
if 'notes.json' not in dom or 'no schema' not in dom:
    bad.append('skipped file not listed')
if '.data.json</td>' in dom:
    bad.append('a raw data file was listed')
if bad:
    print('FAIL:\n  ' + '\n  '.join(bad))
    sys.exit(1)
print('ok %d records: %d markers, %d bars, %d series charts checked'
      % (len(recs), len(markers), len(bars), len(charts)))
EOF

browse shot --window-size=1400,4400 --screenshot="$out/report.png" \
  "file://$tmp/report.html" >/dev/null
python3 - "$out/report.png" <<'EOF'
import struct, sys
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG'
w, h = struct.unpack('>II', data[16:24])
assert (w, h) == (1400, 4400), (w, h)
assert len(data) > 50000, 'suspiciously small screenshot: %d bytes' % len(data)
print('ok screenshot %s (%dx%d, %d bytes)' % (sys.argv[1], w, h, len(data)))
EOF
echo "PASS"
