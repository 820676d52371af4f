#!/usr/bin/env bash
# Code checks, run by scripts/test.sh: the layering rules
# (scripts/check-layers.py), the size and complexity limit of library
# functions (lizard: at most 100 lines and cyclomatic complexity 25 in
# core/ mem/ transport/ coord/ engine/ store/), the links of README.md and
# docs/ (scripts/check-links.py), and docs/config.md against `kvferry
# config --markdown` of the build in build/ (KVFERRY names another
# command; without one the check fails and says so), and that
# docs/results stays compact (one Markdown file per cited docs section,
# at most 1.2 MB in all: per-run records stay out of the tree). Runs every check,
# prints a line per check, and exits 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."

fail=0
run() {
  local name=$1
  shift
  if "$@"; then
    echo "check-code: $name: ok"
  else
    echo "check-code: $name: FAILED"
    fail=1
  fi
}

lizard_check() {
  local dirs=() d
  for d in core mem transport coord engine store; do
    [ -d "$d" ] && dirs+=("$d")
  done
  if python3 -c 'import lizard' >/dev/null 2>&1; then
    # -w prints only the functions over a limit: any output is a failure
    local out
    out=$(python3 -m lizard -l c -C 25 -L 100 -w "${dirs[@]}")
    [ -z "$out" ] && return 0
    printf '%s\n' "$out"
    echo "lizard: $(printf '%s\n' "$out" | grep -c 'warning:') function(s) over 100 lines or complexity 25"
    return 1
  fi
  echo "lizard: python module missing (scripts/setup.sh installs it)"
  return 1
}

# docs/config.md is generated from the config tables: it must match them
config_doc() {
  local bin=${KVFERRY:-build/kvferry}
  if [ ! -x "$bin" ]; then
    echo "config-doc: no $bin to generate docs/config.md with (build first)"
    return 1
  fi
  if ! "$bin" config --markdown | diff -u docs/config.md - >/tmp/kvf_config_doc.$$; then
    head -n 40 /tmp/kvf_config_doc.$$
    rm -f /tmp/kvf_config_doc.$$
    echo "config-doc: docs/config.md is out of date: $bin config --markdown > docs/config.md"
    return 1
  fi
  rm -f /tmp/kvf_config_doc.$$
}

# docs/results: compact files only (docs/records.md)
results_size() {
  local bytes others
  bytes=$(du -sb docs/results | cut -f1)
  others=$(find docs/results -type f ! -name '*.md' | head -5)
  if [ -n "$others" ] || [ -n "$(find docs/results -mindepth 1 -type d)" ]; then
    echo "results-size: docs/results holds more than compact Markdown files:"
    printf '  %s\n' $others
    return 1
  fi
  if [ "$bytes" -gt 1258291 ]; then
    echo "results-size: docs/results is $bytes bytes (at most 1.2 MB: keep the rows a doc cites, not per-run files)"
    return 1
  fi
}

run layers python3 scripts/check-layers.py
run lizard lizard_check
run links python3 scripts/check-links.py
run config-doc config_doc
run results-size results_size
exit "$fail"
