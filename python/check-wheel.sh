#!/usr/bin/env bash
# Checks a portable wheel (python/build-wheel.sh) as a user would get it:
# its tag is py3-none-manylinux_*_x86_64; every shared object in it finds
# each library it links either inside the wheel or among the few a
# manylinux system always has (glibc's, libgcc_s, libstdc++, zlib: the
# manylinux policy's list), so it
# needs none of the libraries kvferry builds against (jansson, xxhash,
# libmicrohttpd, libcurl, hiredis, OpenSSL); then, installed into a
# fresh virtual environment without an index, `import kvferry`, the
# bundled command, an engine moving blocks between two engines and a
# store put/get against a master and a node it starts all work.
#
#   python/check-wheel.sh WHEEL
#
# Prints one line per check and the wheel's size; exits 1 on the first
# failure. Runs on any Linux with python3 and its venv module (tests/
# docs: a Debian 12 without those libraries, docs/python.md).
set -euo pipefail
wheel=$(realpath "$1")
py=${PYTHON:-python3}
name=$(basename "$wheel")

fail() { echo "check-wheel: $*" >&2; exit 1; }

[[ $name =~ -py3-none-manylinux_[0-9]+_[0-9]+_x86_64\.whl$ ]] ||
  fail "tag: $name is not a py3-none-manylinux_*_x86_64 wheel"
echo "check-wheel: tag ok ($name, $(( $(stat -c %s "$wheel") / 1024 )) KiB)"

tmp=$(mktemp -d /tmp/kvf_check_wheel.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
"$py" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip -q --disable-pip-version-check install \
  --no-index --no-deps "$wheel" || fail "pip install of $name failed"
pkg=$("$tmp/venv/bin/python" -c \
  'import os, sysconfig; print(os.path.join(sysconfig.get_paths()["purelib"], "kvferry"))')

# What a manylinux system provides (the manylinux policy's libraries);
# everything else must resolve inside the installed wheel.
system='^(linux-vdso\.so\.1|/lib64/ld-linux-x86-64\.so\.2|ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libdl\.so\.2|librt\.so\.1|libpthread\.so\.0|libresolv\.so\.2|libutil\.so\.1|libnsl\.so\.1|libanl\.so\.1|libmvec\.so\.1|libatomic\.so\.1|libgcc_s\.so\.1|libstdc\+\+\.so\.6|libz\.so\.1|libexpat\.so\.1)$'
n=0
while IFS= read -r so; do
  n=$((n + 1))
  while read -r dep _ path _; do
    [ -n "$dep" ] && [ "$dep" != statically ] || continue
    if [[ $dep =~ $system ]]; then
      continue
    fi
    [ "$path" != "not" ] || fail "$so: $dep not found"
    case $(realpath "$path") in
      "$(realpath "$pkg")"/*|"$(realpath "$pkg")".libs/*) ;;
      *) fail "$so loads $dep from $path, outside the wheel" ;;
    esac
  done < <(ldd "$so" | sed 's/^[[:space:]]*//')
done < <(find "$pkg" "$pkg.libs" -name '*.so*' -type f 2>/dev/null; echo "$pkg/bin/kvferry")
echo "check-wheel: links ok ($n shared objects and the command: nothing outside the wheel but the manylinux policy's system libraries)"

cd "$tmp"
"$tmp/venv/bin/python" -m kvferry version || fail "the bundled command does not run"
"$tmp/venv/bin/python" - <<'PY' || fail "import, engine or store failed"
import os
import kvferry
from kvferry.procs import Master, Node

assert kvferry.library_path().startswith(os.path.dirname(kvferry.__file__))
# an engine: blocks written into another engine's registered memory, read back
src = bytearray(os.urandom(16 * 8192))
with kvferry.Engine() as tgt, kvferry.Engine(no_listen=True) as ini:
    dst = bytearray(len(src))
    r = tgt.register(dst)
    l = ini.register(src)
    with ini.open(tgt.segment_name) as p:
        ops = [(l.addr + i * 8192, r.addr + (15 - i) * 8192, 8192) for i in range(16)]
        assert p.write(ops).result(10) == len(src)
    assert all(dst[(15 - i) * 8192:(16 - i) * 8192] == src[i * 8192:(i + 1) * 8192]
               for i in range(16))
    l.deregister()
    r.deregister()
# the store: a master and a node, a put and a checksum-verified get
with Master() as m, Node(m.address, pool="64M"):
    with kvferry.Store.connect(m.address) as st:
        st.put("layer0/blk42", bytes(src[:8192]))
        assert st.get_bytes("layer0/blk42") == bytes(src[:8192])
print("check-wheel: import, engine and store ok (kvferry %s)" % kvferry.version())
PY
