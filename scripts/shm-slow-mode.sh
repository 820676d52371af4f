#!/usr/bin/env bash
# Counts how often a 16 MiB shm read batch that follows 256 MiB ones runs
# at one worker's speed (the 2-core slow mode of docs/shm.md, "Not done /
# not verified"): RUNS runs of each of two kvferry commands, alternating,
# each `bench blocks --op read --verify --pool 1G --sizes 256M,16M
# --iters 20 --no-link`; a run is slow when its 16 MiB row is under
# SLOW_GIB (default 12) GiB/s. AFTER_ENV="NAME=VALUE ..." goes into the
# second command's environment only, so one binary given twice measures
# a setting. Prints each run's row, then the counts.
#
#   scripts/shm-slow-mode.sh RUNS BIN_A BIN_B
set -euo pipefail
[ $# -eq 3 ] || { sed -n 2,11p "$0"; exit 2; }
runs=$1 a=$2 b=$3 limit=${SLOW_GIB:-12}
row16() { # CMD...: the 16 MiB row's GiB/s of one run (empty if none)
  "$@" bench blocks --op read --verify --pool 1G --sizes 256M,16M \
    --iters 20 --no-link 2>&1 |
    sed -n 's/^size= *16\.0 MB.*BW= *\([0-9.]*\) GB\/s.*/\1/p'
}
slow_a=0 slow_b=0
for i in $(seq 1 "$runs"); do
  va=$(row16 "$a")
  # shellcheck disable=SC2086 # AFTER_ENV is a list of NAME=VALUE words
  vb=$(row16 env ${AFTER_ENV:-} "$b")
  echo "run $i: A ${va:-none} B ${vb:-none} GiB/s"
  awk -v v="${va:-0}" -v l="$limit" 'BEGIN { exit !(v < l) }' && slow_a=$((slow_a + 1))
  awk -v v="${vb:-0}" -v l="$limit" 'BEGIN { exit !(v < l) }' && slow_b=$((slow_b + 1))
done
echo "slow (16 MiB row under $limit GiB/s): A $slow_a of $runs, B $slow_b of $runs"
