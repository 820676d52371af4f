#!/usr/bin/env python3
"""Layering check: reads every #include of the C and CUDA sources and
fails when one breaks the layer rules of docs/design.md.

Rules (one line per violation: file, included header, rule):

  above      a file includes a header of a layer above its own; the order
             is core < mem < transport < coord < engine < store <
             tools (tests/
             may include anything; public headers in include/kvferry/
             belong to the layer named in PUBLIC below)
  sibling    transport/X/ includes a header of transport/Y/ (the shared
             headers directly in transport/ are allowed)
  private    tools/ includes a library header other than include/kvferry/
             and core/ (the tools link core as their internal library)
  internal   a file outside transport/ includes a header inside one
             transport's folder (transport/X/...): other layers reach
             transports through transport/transport.h and
             transport/hook.h; and a private header (*_int.h) is included
             from outside its folder

Include cycles are reported as warnings: a "unit" is a source file with
its header (x.c and x.h are one unit), and two units that reach each
other through includes form a cycle. --strict-cycles makes them fail.

Usage: scripts/check-layers.py [--root DIR] [--strict-cycles] [--quiet]
Exit status: 0 clean, 1 violations (or cycles with --strict-cycles).
Python 3 standard library only.
"""
import argparse
import os
import re
import sys

LAYERS = ["core", "mem", "transport", "coord", "engine", "store", "tools"]
RANK = {name: i for i, name in enumerate(LAYERS)}

# Public headers and the layer each belongs to; any other public header
# belongs to the store layer unless its first lines say
# "kvferry-layer: NAME".
PUBLIC = {
    "status.h": "core",
    "types.h": "core",
    "config.h": "core",
    "auth.h": "core",
    "engine_perf.h": "engine",
    "engine.h": "engine",
    "kvferry.h": "engine",
    "store.h": "store",
    "perf.h": "store",
    "view.h": "engine",
}

SOURCE_DIRS = ["core", "mem", "transport", "coord", "engine", "store", "tools",
               "include", "tests"]
SOURCE_EXT = (".c", ".h", ".cu", ".cuh")
# "..." includes, and <kvferry/...> (the public headers)
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<(kvferry/[^>]+)>)')
LAYER_TAG_RE = re.compile(r"kvferry-layer:\s*([a-z]+)")


def source_files(root):
    """Every C/CUDA file under the source folders, relative to root."""
    out = []
    for top in SOURCE_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.endswith(SOURCE_EXT):
                    full = os.path.join(dirpath, name)
                    out.append(os.path.relpath(full, root).replace(os.sep, "/"))
    return out


def resolve(root, src, inc, angle):
    """Path of an included header relative to root, or None (system or
    generated header). Search order follows the build: the including
    file's folder, then the tree root, include/ and tests/."""
    bases = [] if angle else [os.path.dirname(src)]
    bases += ["", "include", "tests"]
    for base in bases:
        cand = os.path.normpath(os.path.join(base, inc)).replace(os.sep, "/")
        if not cand.startswith("..") and os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def public_layer(root, path):
    name = os.path.basename(path)
    try:
        with open(os.path.join(root, path), encoding="utf-8",
                  errors="replace") as f:
            head = f.read(2000)
        m = LAYER_TAG_RE.search(head)
        if m and m.group(1) in RANK:
            return m.group(1)
    except OSError:
        pass
    return PUBLIC.get(name, "store")


def layer_of(root, path):
    """Layer name of a file, "tests", or None (outside the layers)."""
    top = path.split("/", 1)[0]
    if top == "include" and path.startswith("include/kvferry/"):
        return public_layer(root, path)
    if top in RANK or top == "tests":
        return top
    return None


def transport_folder(path):
    """X for transport/X/..., else None."""
    parts = path.split("/")
    if len(parts) >= 3 and parts[0] == "transport":
        return parts[1]
    return None


def check_edge(root, src, hdr):
    """The rules an include src -> hdr breaks, as (rule, text) pairs."""
    out = []
    ls, lh = layer_of(root, src), layer_of(root, hdr)
    if ls is None or ls == "tests":
        return out
    if lh in RANK and RANK[lh] > RANK[ls]:
        out.append(("above", "%s (%s) may not include %s (%s)" %
                    (ls, src, lh, hdr)))
    ts, th = transport_folder(src), transport_folder(hdr)
    if ts and th and ts != th:
        out.append(("sibling", "transport/%s/ may not include transport/%s/"
                    % (ts, th)))
    parts = hdr.split("/")
    if (len(parts) >= 3 and parts[0] == "transport" and
            src.split("/", 1)[0] != "transport" and ls != "tools"):
        out.append(("internal", "transport/%s/ is internal to transport/"
                    % parts[1]))
    elif (hdr.endswith("_int.h") and ls != "tools" and
          not src.startswith(os.path.dirname(hdr) + "/")):
        out.append(("internal", "%s is private to %s/" %
                    (os.path.basename(hdr), os.path.dirname(hdr))))
    if ls == "tools" and not (hdr.startswith("include/kvferry/") or
                              hdr.startswith("tools/") or
                              hdr.startswith("core/")):
        out.append(("private", "tools/ may include only include/kvferry/, "
                    "core/ (its interface) and tools/ headers"))
    return out


def unit(path):
    return os.path.splitext(path)[0]


def cycles(graph):
    """Strongly connected components of more than one unit (Tarjan,
    iterative)."""
    index, low, onstack, stack, comps = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        onstack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    onstack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in onstack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    onstack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))
    return sorted(comps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--strict-cycles", action="store_true",
                    help="fail on include cycles too")
    ap.add_argument("--quiet", action="store_true",
                    help="print only the summary line")
    args = ap.parse_args()
    root = os.path.abspath(args.root)

    violations = []
    graph = {}
    for src in source_files(root):
        with open(os.path.join(root, src), encoding="utf-8",
                  errors="replace") as f:
            lines = f.readlines()
        for lineno, line in enumerate(lines, 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            inc = m.group(1) or m.group(2)
            hdr = resolve(root, src, inc, m.group(2) is not None)
            if hdr is None:
                continue
            if unit(hdr) != unit(src):
                graph.setdefault(unit(src), set()).add(unit(hdr))
            for rule, text in check_edge(root, src, hdr):
                violations.append((src, lineno, hdr, rule, text))

    counts = {}
    for src, lineno, hdr, rule, text in violations:
        counts[rule] = counts.get(rule, 0) + 1
        if not args.quiet:
            print("%s:%d: includes %s: [%s] %s" % (src, lineno, hdr, rule, text))
    comps = [c for c in cycles(graph)
             if not all(u.startswith("tests/") for u in c)]
    for comp in comps:
        if not args.quiet:
            print("%s: include cycle: %s" %
                  ("error" if args.strict_cycles else "warning",
                   " <-> ".join(comp)))
    summary = ", ".join("%s %d" % (r, counts[r]) for r in sorted(counts))
    print("check-layers: %d violation(s)%s, %d include cycle(s)" %
          (len(violations), " (" + summary + ")" if summary else "",
           len(comps)))
    if violations or (args.strict_cycles and comps):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
