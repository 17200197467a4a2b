#!/usr/bin/python3
"""The folder include graph's cycles (tests/layering_test.sh): a folder is
the first two path components (worker/runtime, common/sim), an edge is a
quoted #include of a file in another folder that exists in the tree. Prints
each cycle (a strongly connected component of more than one folder) with
the includes that close it; prints nothing when there is none."""
import os
import re
import sys

root = sys.argv[1]
if not os.path.isdir(os.path.join(root, "common")):
    # An empty answer means "no cycle": never give it for a wrong path.
    print("layering_cycles.py: %s is not a Tandem checkout (no common/)" % root)
    sys.exit(2)
inc = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
def folder(path):
    parts = path.split('/')
    return '/'.join(parts[:2]) if len(parts) > 2 else parts[0]
edges = {}
for top in ("common", "coordinator", "worker", "client", "bench", "proto"):
    for dp, dn, fn in os.walk(os.path.join(root, top)):
        for f in fn:
            if not f.endswith(('.h', '.cc', '.hpp', '.cpp')): continue
            rel = os.path.relpath(os.path.join(dp, f), root)
            src = folder(rel)
            for line in open(os.path.join(dp, f), errors='replace'):
                m = inc.match(line)
                if not m: continue
                tgt = m.group(1)
                if not os.path.exists(os.path.join(root, tgt)): continue
                dst = folder(tgt)
                if dst != src:
                    edges.setdefault(src, {}).setdefault(dst, (rel, tgt))
# Tarjan SCC
index, low, on, stack, sccs, idx = {}, {}, set(), [], [], [0]
def strong(v):
    index[v] = low[v] = idx[0]; idx[0] += 1; stack.append(v); on.add(v)
    for w in edges.get(v, {}):
        if w not in index:
            strong(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: sccs.append(sorted(comp))
sys.setrecursionlimit(10000)
for v in list(edges):
    if v not in index: strong(v)
for comp in sccs:
    print("  cycle among " + ", ".join(comp) + ":")
    for a in comp:
        for b, (f, t) in sorted(edges.get(a, {}).items()):
            if b in comp: print(f"    {f} includes {t}")
