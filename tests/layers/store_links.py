#!/usr/bin/env python3
"""The store links only the engine's public API: every kvf symbol the
store's objects need from outside store/ must be declared in a public
header (include/kvferry/*.h) or be defined by core/ or coord/ (the
layers below every other). A store file that calls an engine, mem or
transport internal fails here, at link level, even if it declared the
function itself to get past the compiler.

  tests/layers/store_links.py NM SOURCE_DIR 'STORE_OBJS' 'LIB_OBJS'

STORE_OBJS and LIB_OBJS are ;-separated object lists (CMake's
$<TARGET_OBJECTS:...>). Exit status 1 with the offending symbols.
"""
import glob
import os
import re
import subprocess
import sys


def symbols(nm, objs, undefined):
    args = [nm, "-P", "-u" if undefined else "--defined-only", "-g"] + objs
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    found = {}
    obj = None
    for line in out.stdout.splitlines():
        if line.endswith(":") and " " not in line:
            obj = line[:-1]
            continue
        parts = line.split()
        if parts:
            found.setdefault(parts[0], obj)
    return found


def public_names(src):
    names = set()
    for h in glob.glob(os.path.join(src, "include", "kvferry", "*.h")):
        with open(h, encoding="utf-8") as f:
            names |= set(re.findall(r"\b(kvf_\w+)\s*\(", f.read()))
            f.seek(0)
            names |= set(re.findall(r"extern[^;]*\b(kvf_\w+)\s*;", f.read()))
    return names


def main():
    nm, src, store_objs, lib_objs = sys.argv[1:5]
    store = [o for o in store_objs.split(";") if o]
    below = [o for o in lib_objs.split(";")
             if re.search(r"[/\\](core|coord)[/\\]", o)]
    need = symbols(nm, store, True)
    have = set(symbols(nm, store, False)) | set(symbols(nm, below, False))
    public = public_names(src)
    bad = sorted(s for s in need
                 if s.startswith("kvf") and s not in have and s not in public)
    for s in bad:
        print("store reaches a private symbol: %s (from %s)"
              % (s, os.path.basename(need[s] or "?")))
    print("store links: %d kvf symbols from below, %d private reach(es)"
          % (sum(1 for s in need if s.startswith("kvf")), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
