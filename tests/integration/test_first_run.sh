#!/bin/sh
# What a new user sees: the main job with small pools (progress lines,
# verdict lines, the summary, no alarming line when the spawned target
# stops), --quiet, and the one-line errors a user can cause: a port in
# use, a master with no node, a master not running, a pool larger than
# the machine or its limit (refused before any allocation), an unknown
# KVF_* environment key, an unknown command; --log FILE.
set -u
BIN=${KVF_BIN:?KVF_BIN must name the kvferry binary}
SRC=${KVF_SRC:?KVF_SRC must name the source tree}
OUT=$(mktemp -d /tmp/kvf-first-run-XXXXXX)
pids=""
cleanup() {
    for p in $pids; do
        kill "$p" 2> /dev/null
    done
    rm -rf "$OUT"
}
trap cleanup EXIT
fail=0

bad() {
    echo "FAIL: $*"
    fail=1
}
# has FILE TEXT: FILE holds the fixed string TEXT
has() {
    grep -qF -- "$2" "$1" || bad "$1 lacks '$2':" "$(cat "$1")"
}
hasnt() {
    if grep -qF -- "$2" "$1"; then
        bad "$1 holds '$2':" "$(cat "$1")"
    fi
}
# waitline FILE: the first line of FILE once written (5 s at most)
waitline() {
    i=0
    while [ ! -s "$1" ] && [ $i -lt 50 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    head -1 "$1"
}

# --- the main job, small ------------------------------------------------
KVFERRY=$BIN timeout 240 "$SRC/scripts/main-job.sh" --no-setup --pool 128M \
    --sizes 8M,16M --iters 1 > "$OUT/job" 2> "$OUT/job.err"
rc=$?
[ $rc -eq 0 ] || bad "main job exits $rc: $(tail -5 "$OUT/job.err")"
has "$OUT/job" "== Summary"
grep -Eq '^  (PASS|BELOW) +tcp moves random blocks at >= 80 % of the link' \
    "$OUT/job" || bad "no tcp verdict in the summary: $(cat "$OUT/job")"
grep -Eq '^  (PASS|BELOW) +shm moves them at >= 3x tcp' "$OUT/job" ||
    bad "no shm verdict in the summary: $(cat "$OUT/job")"
grep -Eq '^  PASS +every moved block verified' "$OUT/job" ||
    bad "verify not PASS: $(cat "$OUT/job")"
grep -Eq '^(PASS|BELOW) +link_pct>=80: ' "$OUT/job" ||
    bad "no verdict line of the tcp run"
hasnt "$OUT/job" "Done."
# progress on stderr, plain lines (not a terminal), one per size
has "$OUT/job.err" "kvferry bench blocks: preparing two 128.0 MB pools"
has "$OUT/job.err" "kvferry bench blocks [1/4]: write 8.0 MB of 8.0 KB blocks"
has "$OUT/job.err" "kvferry bench blocks [4/4]: read 16.0 MB"
# the spawned targets stop quietly
cat "$OUT/job" "$OUT/job.err" > "$OUT/all"
hasnt "$OUT/all" "signal 15"
hasnt "$OUT/all" "stopping"

# --quiet: the same rows and verdicts, no progress lines
timeout 120 "$BIN" bench blocks --pool 64M --sizes 8M --iters 1 --verify --quiet \
    > "$OUT/q" 2> "$OUT/q.err" || bad "bench blocks --quiet fails"
has "$OUT/q" "wrong_blocks==0"
hasnt "$OUT/q.err" "kvferry bench blocks"

# --- a port already in use ----------------------------------------------
"$BIN" target --listen 127.0.0.1:0 --pool 1M > "$OUT/t1" 2> "$OUT/t1.err" &
pids="$pids $!"
t1=$!
seg=$(waitline "$OUT/t1" | sed -n 's/^segment=\([^ ]*\).*/\1/p')
[ -n "$seg" ] || bad "the first target did not start"
timeout 30 "$BIN" target --listen "$seg" --pool 1M > /dev/null 2> "$OUT/t2.err"
rc=$?
[ $rc -eq 1 ] || bad "target on a busy port exits $rc"
has "$OUT/t2.err" "kvferry target: cannot listen on $seg: address already in use — pick another with --listen HOST:PORT or stop the process using it"
[ "$(wc -l < "$OUT/t2.err")" -eq 1 ] || bad "more than one line: $(cat "$OUT/t2.err")"
kill "$t1"
wait "$t1" 2> /dev/null
[ ! -s "$OUT/t1.err" ] || bad "a target stopped by SIGTERM prints: $(cat "$OUT/t1.err")"

# --- a master without nodes, a master not running -------------------------
"$BIN" master --listen 127.0.0.1:0 --http off > "$OUT/m" 2> "$OUT/m.err" &
pids="$pids $!"
m1=$!
master=$(waitline "$OUT/m" | sed -n 's/^master=\([^ ]*\).*/\1/p')
[ -n "$master" ] || bad "the master did not start"
echo hello > "$OUT/value"
timeout 30 "$BIN" put --master "$master" key "$OUT/value" 2> "$OUT/put.err"
rc=$?
[ $rc -eq 1 ] || bad "put without nodes exits $rc"
has "$OUT/put.err" "kvferry: put: no storage node is registered with master $master — start one with 'kvferry node --master $master'"
kill "$m1"
wait "$m1" 2> /dev/null
[ ! -s "$OUT/m.err" ] || bad "a master stopped by SIGTERM prints: $(cat "$OUT/m.err")"
timeout 30 "$BIN" get --master "$master" key 2> "$OUT/get.err" > /dev/null
rc=$?
[ $rc -eq 1 ] || bad "get from a stopped master exits $rc"
has "$OUT/get.err" "kvferry: get: cannot reach the store master at $master (connection refused) — start one with 'kvferry master --listen $master'"
[ "$(wc -l < "$OUT/get.err")" -eq 1 ] || bad "more than one line: $(cat "$OUT/get.err")"

# --- pools that do not fit: refused before any allocation ------------------
# beyond the address-space limit: a pool touched would fail differently
# (a sanitizer build cannot start under such a limit: that check skips)
if prlimit --as=$((768 << 20)) "$BIN" version > /dev/null 2>&1; then
    prlimit --as=$((768 << 20)) "$BIN" node --pool 2G --master 127.0.0.1:1 \
        > /dev/null 2> "$OUT/as.err"
    rc=$?
    [ $rc -eq 1 ] || bad "node over the limit exits $rc"
    has "$OUT/as.err" "kvferry node: --pool 2.0 GB exceeds this process's address-space limit of 768.0 MB (ulimit -v) — pick a smaller --pool or raise the limit"
else
    echo "note: $BIN does not start under prlimit --as (sanitizer build)"
fi
# beyond the machine's memory: refused at once, the pool never touched
python3 - "$BIN" "$OUT/mem.err" << 'EOF' || bad "oversize pool: see above"
import resource, subprocess, sys, time
t0 = time.monotonic()
p = subprocess.run([sys.argv[1], "target", "--pool", "100000G"],
                   capture_output=True, text=True, timeout=30)
dt = time.monotonic() - t0
rss_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
open(sys.argv[2], "w").write(p.stderr)
ok = (p.returncode == 1 and dt < 5 and rss_kb < 200 * 1024 and
      "does not fit this machine" in p.stderr and "MemAvailable" in p.stderr)
if not ok:
    print("FAIL: target --pool 100000G: exit %d in %.1f s, max RSS %d KiB: %s"
          % (p.returncode, dt, rss_kb, p.stderr))
sys.exit(0 if ok else 1)
EOF
has "$OUT/mem.err" "kvferry target: --pool 97.7 TB does not fit this machine"

# --- sizes, commands and keys a user mistypes -----------------------------
"$BIN" node --pool 12Q > /dev/null 2> "$OUT/size.err"
[ $? -eq 2 ] || bad "a bad size is not a usage error"
has "$OUT/size.err" "--pool: '12Q' is not a size (8K, 16M, 8G)"
"$BIN" bnch > /dev/null 2> "$OUT/cmd.err"
[ $? -eq 2 ] || bad "an unknown command is not a usage error"
has "$OUT/cmd.err" "kvferry: unknown command 'bnch' — did you mean 'bench'?"
"$BIN" bench lnik > /dev/null 2> "$OUT/bcmd.err"
has "$OUT/bcmd.err" "did you mean 'link'?"
KVF_CONNZ=4 "$BIN" version > /dev/null 2> "$OUT/env.err"
has "$OUT/env.err" "KVF_CONNZ is not a kvferry key and is ignored; did you mean KVF_CONNS?"

# --- --log FILE: the library's lines go there, the output names it ---------
KVF_LOG_LEVEL=info "$BIN" target --listen 127.0.0.1:0 --pool 1M \
    --log "$OUT/target.log" > "$OUT/t3" 2> "$OUT/t3.err" &
pids="$pids $!"
t3=$!
waitline "$OUT/t3" > /dev/null
kill "$t3"
wait "$t3" 2> /dev/null
has "$OUT/t3.err" "kvferry: log lines go to $OUT/target.log"
has "$OUT/target.log" "engine segment"
hasnt "$OUT/t3.err" "engine segment"

[ $fail -eq 0 ] && echo "first run: all checks held"
exit $fail
