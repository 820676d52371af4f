#!/usr/bin/env python3
"""The call graph of a folder of C files, by file: which files call which,
the call cycles between files, and the walk of one entry function.

Each .c file under the folder is compiled with gcc -fcallgraph-info (the
graph GCC itself builds; no object is kept), the functions are mapped to
the file that defines them, and each call between two files of the folder
is an edge. Calls through function pointers (ops tables) are not edges:
that is how a layer calls up without depending on what is above.

  scripts/call-graph.py [--root DIR] [--folder store] [--walk kvf_store_put]
                        [--cflags '...']

Prints the file cycles (strongly connected components of more than one
file), their count, and for --walk the files the entry function reaches in
depth-first order with the number of steps back: calls into a file that
is already on the call stack (a walk that goes down only has none).
Exit status 0; 1 when a file does not compile.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

EDGE = re.compile(r'edge: \{ sourcename: "([^"]+)" targetname: "([^"]+)"')


def compile_all(root, folder, cflags, tmp):
    files = []
    for d, _, names in os.walk(os.path.join(root, folder)):
        for n in sorted(names):
            if n.endswith(".c"):
                files.append(os.path.relpath(os.path.join(d, n), root))
    for i, f in enumerate(files):
        out = os.path.join(tmp, "%d.o" % i)
        cmd = ["gcc", "-std=gnu11", "-D_GNU_SOURCE", "-I" + root,
               "-I" + os.path.join(root, "include"), "-c", f, "-o", out,
               "-fcallgraph-info"] + cflags
        r = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write("%s does not compile:\n%s" % (f, r.stderr[-2000:]))
            sys.exit(1)
    return files


def read_graph(tmp, files):
    """Functions by title (a static one's title names its file) -> the
    file defining them, and every call (caller title, file, callee
    title)."""
    defined = {}
    calls = []
    for i, f in enumerate(files):
        with open(os.path.join(tmp, "%d.ci" % i), encoding="utf-8") as ci:
            text = ci.read()
        for m in re.finditer(r'node: \{ title: "([^"]+)" label: "[^"]*"'
                             r'( shape : ellipse)?', text):
            if not m.group(2):
                defined.setdefault(m.group(1), f)
        for src, dst in EDGE.findall(text):
            calls.append((src, f, dst))
    return defined, calls


def sccs(graph):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def walk(entry, defined, fcalls):
    """Depth-first over functions from entry: the files in first-visit
    order, and the steps back: calls from one file into another that is
    already on the call stack below it (a lower layer calling up)."""
    seen, order, back = set(), [], [0]

    def go(fn, stack):
        f = defined.get(fn)
        if f is None or fn in seen:
            return
        seen.add(fn)
        if stack and f != stack[-1] and f in stack:
            back[0] += 1
        if f not in order:
            order.append(f)
        for callee in sorted(fcalls.get(fn, ())):
            go(callee, stack + [f])

    go(entry, [])
    return order, back[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--folder", default="store")
    ap.add_argument("--walk", default="kvf_store_put")
    ap.add_argument("--cflags", default="")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    with tempfile.TemporaryDirectory() as tmp:
        files = compile_all(root, a.folder, a.cflags.split(), tmp)
        defined, calls = read_graph(tmp, files)
    graph, fcalls = {}, {}
    for caller, f, callee in calls:
        fcalls.setdefault(caller, set()).add(callee)
        g = defined.get(callee)
        if g is not None and g != f:
            graph.setdefault(f, set()).add(g)
    cyc = sccs(graph)
    for c in cyc:
        print("cycle: " + " <-> ".join(c))
    print("call cycles between files of %s/: %d (%d files in them)"
          % (a.folder, len(cyc), sum(len(c) for c in cyc)))
    if a.walk:
        files_w, back = walk(a.walk, defined, fcalls)
        print("walk of %s: %d files, %d steps back (calls into a file "
              "already on the stack)" % (a.walk, len(files_w), back))
        for f in files_w:
            print("  " + f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
