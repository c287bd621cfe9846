#!/usr/bin/env python3
"""The include rules of DESIGN.md's layout, checked on the source tree (no build needed).

Reads every quoted #include in daemon/, client/ and kernels/ (.c .h .cu .cuh), resolves it as
the compiler does (the including file's folder first, then the include roots below) and fails,
naming the files, on:
  - an include cycle between modules (x.c, x.h, x.cu and x.cuh in one folder are one module);
  - an upward include between the daemon's layers: core < obs < state < wire < serve (main.c
    above them all);
  - kernels/ or proto/ including daemon/ or client/, or daemon/ and client/ including each
    other;
  - a quoted include that resolves to no file (generated *.pb-c.h headers excepted).

usage: check_includes.py [ROOT]   (ROOT: the repository, default: this script's parent's parent)
"""
from __future__ import annotations

import os
import re
import sys
from collections import defaultdict

SCANNED = ("daemon", "client", "kernels")
EXTS = (".c", ".h", ".cu", ".cuh")
# where a quoted include is looked up after the including file's folder (the build's -I/-iquote)
ROOTS = ("daemon", "kernels/include", "kernels/common", "kernels/cuda", "client/include", "client",
         "proto")
DAEMON_LAYERS = ("daemon/core", "daemon/obs", "daemon/state", "daemon/wire", "daemon/serve")
GENERATED = re.compile(r"\.pb-c\.h$")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def source_files(root: str) -> list[str]:
    files = []
    for top in SCANNED:
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            files += [os.path.relpath(os.path.join(dirpath, n), root).replace(os.sep, "/")
                      for n in names if n.endswith(EXTS)]
    return sorted(files)


def resolve(root: str, src: str, inc: str) -> str | None:
    for base in (os.path.dirname(src),) + ROOTS:
        cand = os.path.normpath(os.path.join(base, inc)).replace(os.sep, "/")
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def module(path: str) -> str:
    return os.path.splitext(path)[0]


def top(path: str) -> str:
    return path.split("/", 1)[0]


def layer(path: str) -> int | None:
    """Rank of a daemon file: its layer's index, len(DAEMON_LAYERS) for daemon/main.c."""
    for i, prefix in enumerate(DAEMON_LAYERS):
        if path.startswith(prefix + "/"):
            return i
    return len(DAEMON_LAYERS) if top(path) == "daemon" else None


def file_problems(src: str, dst: str) -> list[str]:
    """What is wrong with src including dst, apart from cycles."""
    problems = []
    a, b = top(src), top(dst)
    if a in ("kernels", "proto") and b in ("daemon", "client"):
        problems.append(f"down: {src} ({a}/ is below everything) includes {dst}")
    if {a, b} == {"daemon", "client"}:
        problems.append(f"across: {src} includes {dst} (daemon/ and client/ are apart)")
    ra, rb = layer(src), layer(dst)
    if ra is not None and rb is not None and rb > ra:
        problems.append(f"up: {src} ({DAEMON_LAYERS[ra]}) includes {dst} "
                        f"({DAEMON_LAYERS[rb] if rb < len(DAEMON_LAYERS) else 'daemon/main.c'})")
    return problems


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    nodes = set(edges) | {t for ts in edges.values() for t in ts}
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def main(argv: list[str]) -> int:
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = source_files(root)
    edges: dict[str, set[str]] = defaultdict(set)
    problems: list[str] = []
    nedges = 0
    for src in files:
        with open(os.path.join(root, src), errors="replace") as f:
            text = f.read()
        for inc in INCLUDE.findall(text):
            dst = resolve(root, src, inc)
            if dst is None:
                if not GENERATED.search(inc):
                    problems.append(f"unresolved: {src} includes \"{inc}\"")
                continue
            problems += file_problems(src, dst)
            if module(dst) != module(src):
                edges[module(src)].add(module(dst))
                nedges += 1
    for comp in cycles(edges):
        ring = " -> ".join(comp + [comp[0]])
        detail = "; ".join(f"{a} includes {', '.join(sorted(edges[a] & set(comp)))}"
                           for a in comp)
        problems.append(f"cycle: {ring} ({detail})")
    for p in problems:
        print(p)
    print(f"check_includes: {len(files)} files, {nedges} includes, "
          f"{sum(p.startswith('cycle') for p in problems)} cycles, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
