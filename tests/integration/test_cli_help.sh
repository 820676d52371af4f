#!/bin/sh
# Every command's --help against its parser: walks the command lists of
# `kvferry --help` and `kvferry bench --help`, prints each command's help,
# and gives every option the help lists a sample value (by its value name)
# followed by --help, which must succeed: the option is accepted and its
# value parsed. An unknown option must fail with exit 2 and one line.
set -u
BIN=${KVF_BIN:?KVF_BIN must name the kvferry binary}
OUT=$(mktemp -d /tmp/kvf-cli-help-XXXXXX)
trap 'rm -rf "$OUT"' EXIT
fail=0
checked=0

# Sample value of an option from its name and value name.
sample() {
    case "$1:$2" in
    *:SIZE) echo 1M ;;
    *:N | *:PCT | *:X) echo 1 ;;
    *:MS | *:DUR | *:TIME) echo 100ms ;;
    *:R) echo 0.5 ;;
    *:RULE) echo 'x>=1' ;;
    *:HOST:PORT) echo 127.0.0.1:1 ;;
    *:HOST:PORT\|off) echo off ;;
    sizes:LIST | block-sizes:LIST) echo 8K,1M ;;
    clients:LIST) echo 1,2 ;;
    *:LIST | *:NAME) echo tcp ;;
    *:[a-z]*) echo "${2%%|*}" ;; # choices: the first
    *) echo x ;;
    esac
}

commands() {
    "$BIN" "$@" --help 2>&1 | sed -n 's/^  \([a-z][a-z0-9-]*\)  .*/\1/p'
}

# kvferry ARGS --help, then each listed option alone with a sample value.
check_command() {
    base="$*"
    if ! "$BIN" "$@" --help > "$OUT/help" 2> "$OUT/err"; then
        echo "FAIL: kvferry $base --help exits non-zero"
        fail=1
        return
    fi
    if ! grep -q '^usage: ' "$OUT/help"; then
        echo "FAIL: kvferry $base --help prints no usage line"
        fail=1
    fi
    # option lines: "  --name", "  -x, --name", with " VALUE" or "[=VALUE]"
    sed -n 's/^  \(-[a-zA-Z], \)\{0,1\}--\([a-z0-9-]*\)\(\[=[^]]*\]\)\{0,1\}\( [^ ]*\)\{0,1\}.*/\2 \3\4/p' \
        "$OUT/help" > "$OUT/opts"
    while read -r name meta; do
        [ "$name" = help ] && continue
        case "$meta" in
        "") arg="--$name" val="" ;;
        \[=*) arg="--$name=x" val="" ;;
        *) arg="--$name" val=$(sample "$name" "$meta") ;;
        esac
        # shellcheck disable=SC2086 # base: words without blanks
        if ! "$BIN" $base "$arg" ${val:+"$val"} --help > /dev/null \
            2> "$OUT/err"; then
            echo "FAIL: kvferry $base $arg $val --help: $(cat "$OUT/err")"
            fail=1
        fi
        checked=$((checked + 1))
    done < "$OUT/opts"
}

walk() {
    check_command "$@"
    "$BIN" "$@" --no-such-option > /dev/null 2> "$OUT/err"
    rc=$?
    if [ $rc -ne 2 ] || [ "$(wc -l < "$OUT/err")" -ne 1 ] ||
        ! grep -q "unknown option '--no-such-option'" "$OUT/err"; then
        echo "FAIL: kvferry $* --no-such-option: exit $rc, stderr:"
        cat "$OUT/err"
        fail=1
    fi
}

for c in $(commands); do
    if [ "$c" = bench ]; then
        for b in $(commands bench); do
            # e2e runs the Python package's parser (python3 -m kvferry):
            # python/tests/test_e2e_units.py checks its forwarding
            [ "$b" = e2e ] && continue
            walk bench "$b"
        done
        walk bench blocks --device gpu
    else
        walk "$c"
    fi
done
# bench store --working-set's --disk-dir: a file is refused (exit 1, one
# line) before any mode runs; a missing directory is made
: > "$OUT/afile"
"$BIN" bench store --working-set 3x --disk-dir "$OUT/afile" > /dev/null 2> "$OUT/err"
rc=$?
if [ $rc -ne 1 ] || ! grep -q "disk-dir .*not a directory" "$OUT/err"; then
    echo "FAIL: bench store --disk-dir FILE: exit $rc"
    cat "$OUT/err"
    fail=1
fi
if ! "$BIN" bench store --working-set 2x --pool 4M --min-size 64K --max-size 256K \
    --clients 1 --duration 200ms --disk-dir "$OUT/new" > "$OUT/ws" 2>&1 ||
    ! grep -q "^memory + disk tier .* 0$" "$OUT/ws"; then
    echo "FAIL: bench store --disk-dir NEW did not run into a new directory"
    cat "$OUT/ws"
    fail=1
fi
echo "checked $checked options"
[ "$checked" -gt 100 ] || { echo "FAIL: too few options found"; fail=1; }
exit $fail
