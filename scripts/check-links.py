#!/usr/bin/env python3
"""Link check for README.md and every Markdown file under docs/: each
link must resolve to a file (or folder) inside the repository, and a
#fragment to a heading of the Markdown file it names.

Checked:
  - Markdown links and images, [text](target) and [name]: target
  - paths in backticks that start with docs/ (records named in the text);
    a * in them is a glob that must match at least one file
  - any target or backticked path that starts with ../ or / (outside the
    repository) and any http(s):// link (the docs stay inside the
    repository; --allow-external accepts web links)

Usage: scripts/check-links.py [--root DIR] [--allow-external]
Exit status: 0 every link resolves, 1 otherwise (one line per broken link:
file:line: target: reason). Python 3 standard library only.
"""
import argparse
import glob
import os
import re
import sys

LINK_RE = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_RE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
TICK_RE = re.compile(r"`([^`\s]+)`")
HEADING_RE = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE_RE = re.compile(r"^\s{0,3}(```|~~~)")


def markdown_files(root):
    out = []
    readme = os.path.join(root, "README.md")
    if os.path.isfile(readme):
        out.append(readme)
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "docs")):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".md"):
                out.append(os.path.join(dirpath, name))
    return out


def slug(text):
    """GitHub's anchor for a heading."""
    text = re.sub(r"`|\*|_(?=\w)|(?<=\w)_", "", text.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found = set()
        seen = {}
        fenced = False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if FENCE_RE.match(line):
                    fenced = not fenced
                    continue
                m = None if fenced else HEADING_RE.match(line)
                if m:
                    s = slug(m.group(2))
                    n = seen.get(s, 0)
                    seen[s] = n + 1
                    found.add(s if n == 0 else "%s-%d" % (s, n))
        cache[path] = found
    return cache[path]


def inside(root, path):
    root = os.path.realpath(root)
    path = os.path.realpath(path)
    return path == root or path.startswith(root + os.sep)


def check_target(root, md, target, allow_external, from_root):
    """None when target resolves, else the reason it does not."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
        if target.startswith(("http://", "https://")) and allow_external:
            return None
        return "points outside the repository"
    path, _, frag = target.partition("#")
    if not path:
        path_abs = md
    else:
        if path.startswith("/"):
            return "absolute path"
        base = root if from_root else os.path.dirname(md)
        path_abs = os.path.normpath(os.path.join(base, path))
    if not inside(root, path_abs):
        return "points outside the repository"
    if "*" in path:
        return None if glob.glob(path_abs) else "no file matches"
    if not os.path.exists(path_abs):
        return "no such file"
    if frag and path_abs.endswith(".md") and os.path.isfile(path_abs):
        if frag.lower() not in anchors(path_abs):
            return "no heading #%s" % frag
    return None


def check_file(root, md, allow_external):
    broken = []
    fenced = False
    with open(md, encoding="utf-8") as f:
        lines = f.readlines()
    for lineno, line in enumerate(lines, 1):
        if FENCE_RE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        targets = [(t, False) for t in LINK_RE.findall(line)]
        m = REF_RE.match(line)
        if m:
            targets.append((m.group(1), False))
        # text outside links: backticked paths
        bare = LINK_RE.sub("", line)
        for t in TICK_RE.findall(bare):
            t = t.rstrip(".,;:")
            if t.startswith("docs/"):
                targets.append((t, True))
            elif t.startswith("../") or t.startswith("/work") or \
                    t.startswith("/home"):
                targets.append((t, False))
        for t, from_root in targets:
            why = check_target(root, md, t, allow_external, from_root)
            if why:
                broken.append("%s:%d: %s: %s" %
                              (os.path.relpath(md, root), lineno, t, why))
    return broken


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--allow-external", action="store_true",
                    help="accept http(s) links")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    files = markdown_files(root)
    broken = []
    for md in files:
        broken.extend(check_file(root, md, args.allow_external))
    for line in broken:
        print(line)
    print("check-links: %d file(s), %d broken link(s)" %
          (len(files), len(broken)))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
