#!/usr/bin/env bash
# kvferry's main job: installs dependencies, builds, and runs the
# connector benchmark kvferry was built to win: from an 8 GB registered
# memory pool, pick random, non-overlapping 8 KiB blocks (the size of an
# LLM's KV-cache blocks) and move 16 MB, 64 MB, 256 MB and 1 GB of them per
# transfer to a second process over loopback, WRITE then READ, verifying
# every moved block by checksum on both sides. It runs twice: first over
# tcp (with the raw link ceiling of the same bytes measured before each
# size), then with the default transport choice (same host: shared
# memory), with the same batches over tcp interleaved in that run (--vs
# tcp: shm's ratio to tcp). It ends with a summary of the verdicts on the
# two claims: tcp moves the blocks at >= 80 % of the link at every size,
# shm at >= 3x tcp; and on the ceilings themselves: no row above 105 % of
# its link (docs/performance.md, "Ceilings").
#
#   scripts/main-job.sh [--no-setup] [BENCH OPTIONS...]
#
# --no-setup skips scripts/setup.sh (the build must exist). Other
# arguments go to both `kvferry bench blocks` runs (e.g. --pool 2G on a
# small machine, --quiet). KVFERRY names the binary (default
# build/kvferry). Exit status: 0 once measured, whatever the verdicts
# (with --strict: 1 when a claim is missed).
set -euo pipefail
cd "$(dirname "$0")/.."

setup=1
args=()
for arg in "$@"; do
  case "$arg" in
    --no-setup) setup=0 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$arg") ;;
  esac
done
if [ "$setup" = 1 ]; then ./scripts/setup.sh; fi
bin=${KVFERRY:-./build/kvferry}

out=$(mktemp -d /tmp/kvferry-main-job-XXXXXX)
trap 'rm -rf "$out"' EXIT
rc=0
echo "== 1 of 2: random 8 KiB blocks over tcp, against the link ceiling"
"$bin" bench blocks --op both --verify --transport tcp ${args[@]+"${args[@]}"} |
  tee "$out/tcp" || rc=$?
echo
echo "== 2 of 2: random 8 KiB blocks over shared memory, against tcp"
"$bin" bench blocks --op both --verify --vs tcp ${args[@]+"${args[@]}"} |
  tee "$out/shm" || rc=$?

# The verdict line of rule $2 in file $1: "PASS  rule: detail" -> words.
verdict() {
  local line
  line=$(grep -E "^(PASS|BELOW|ABOVE|UNMEASURED) +$2[:]" "$1" 2>/dev/null |
    head -1)
  if [ -z "$line" ]; then
    echo "NOT RUN|the run did not reach its verdicts"
  else
    echo "$line" | sed -E 's/^([A-Z]+) +[^:]*: /\1|/'
  fi
}
line() { # STATUS|DETAIL CLAIM
  printf '  %-6s %s: %s\n' "${1%%|*}" "$2" "${1#*|}"
}
echo
echo "== Summary: what kvferry claims, as measured on this machine"
line "$(verdict "$out/tcp" 'link_pct>=80')" \
  "tcp moves random blocks at >= 80 % of the link at every size"
line "$(verdict "$out/shm" 'vs_ratio>=3')" \
  "shm moves them at >= 3x tcp at every size"
line "$(verdict "$out/tcp" 'link_pct<=105')" \
  "the tcp link ceiling bounds every row (<= 105 %)"
line "$(verdict "$out/shm" 'link_pct<=105')" \
  "the shm link ceiling bounds every row (<= 105 %)"
v1=$(verdict "$out/tcp" 'wrong_blocks==0')
v2=$(verdict "$out/shm" 'wrong_blocks==0')
if [ "${v1%%|*}" = PASS ] && [ "${v2%%|*}" = PASS ]; then
  line "PASS|0 wrong in both runs" "every moved block verified by checksum"
else
  line "$v1" "every moved block verified by checksum (tcp run)"
  line "$v2" "every moved block verified by checksum (shm run)"
fi
grep -h '^note: the machine was busy' "$out/tcp" "$out/shm" | head -1 |
  sed 's/^/  /' || true
exit "$rc"
