#!/usr/bin/python3
"""Checks that the modules of the core call each other without cycles.

Reads the symbols of every object in the core library (nm), draws an edge
from a module to each module defining a symbol it uses, and fails with
the cycles it finds (strongly connected components of more than one
module). With --dot, prints the graph in Graphviz form instead.

    tests/layers/check-layers.py BUILD/libs3cachefs.a [BUILD/src/s3cachefs-s3.o ...]

HACKING.md ("The shape of the program") draws the layers this keeps.
"""
import collections
import os
import subprocess
import sys


def module_of(member):
    """'src_libs3cachefs_a-fs_write.o' or 'fs_write.o' -> 'fs_write'."""
    name = os.path.basename(member)
    if name.endswith('.o'):
        name = name[:-2]
    if '-' in name:
        name = name.split('-', 1)[1]
    return name


def read_symbols(paths):
    defined, used = {}, collections.defaultdict(set)
    for path in paths:
        out = subprocess.run(['nm', '-A', '--defined-only', path],
                             capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            where, _, rest = line.rpartition(':')
            if not rest.strip():
                continue
            kind, symbol = rest.split()[-2:]
            if kind in 'TDBR':   # global text, data, bss, read-only
                defined[symbol] = module_of(where.rsplit(':', 1)[-1])
        out = subprocess.run(['nm', '-A', '--undefined-only', path],
                             capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            where, _, rest = line.rpartition(':')
            symbol = rest.split()[-1]
            used[module_of(where.rsplit(':', 1)[-1])].add(symbol)
    return defined, used


def graph_of(defined, used):
    edges = collections.defaultdict(set)
    for module, symbols in used.items():
        for symbol in symbols:
            target = defined.get(symbol)
            if target is not None and target != module:
                edges[module].add(target)
    return edges


def cycles(edges):
    """Tarjan's strongly connected components of more than one node."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    nodes = set(edges) | {t for ts in edges.values() for t in ts}
    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return found


def main(argv):
    dot = '--dot' in argv
    paths = [a for a in argv[1:] if a != '--dot']
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    defined, used = read_symbols(paths)
    edges = graph_of(defined, used)
    if dot:
        print('digraph modules {')
        for module in sorted(edges):
            for target in sorted(edges[module]):
                print(f'    "{module}" -> "{target}";')
        print('}')
        return 0
    found = cycles(edges)
    for component in found:
        pairs = [f'{a} -> {b}' for a in component for b in sorted(edges[a])
                 if b in component]
        print('cycle among ' + ', '.join(component) + ': ' + '; '.join(pairs))
    if found:
        return 1
    print(f'{len(edges)} modules, {sum(len(t) for t in edges.values())} '
          'calls between them, no cycle')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
