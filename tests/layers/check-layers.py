#!/usr/bin/python3
"""Checks that the layers of the program use only the layers below them.

The layers are the folders of src/, in the order of the table that
HACKING.md holds between the lines `<!-- layers -->` and
`<!-- /layers -->` (one row per folder, lowest first:
| `folder` | what it holds | the folders it may use |, that last cell a
list of folders below it, or "every layer above"). That table is the one
place the order is written: this reads it, and HACKING shows it. Fails
(exit 1, one line per fault) when

  - a folder of src/ is not in the table, or the table names one that is
    not there, or a source file is outside every folder;
  - a file includes a header of a folder above its own in the table, or
    of one its row does not let it use, or one that is not a header of a
    folder of src/;
  - a module (a .c file) calls a symbol defined in a folder above its
    own, or in one its row does not let it use (read from the objects
    with nm), or modules call each other in a cycle (strongly connected
    components of more than one module).

    tests/layers/check-layers.py [--dot] SRCDIR BUILD/libs3cachefs.a [OBJECT ...]
    tests/layers/check-layers.py --self-test

With --dot, prints the module graph in Graphviz form instead.
"""
import collections
import os
import re
import subprocess
import sys
import tempfile

TABLE_START = '<!-- layers -->'
TABLE_END = '<!-- /layers -->'
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
ROW = re.compile(r'^\|\s*`([a-z0-9_]+)`\s*\|')


def layer_table(hacking):
    """The folders of the table in HACKING, lowest first, and what each may
    use: {folder: the folders of its last cell ("every layer above": all
    of those before it)}; words that are no folder (libc, LMDB) are not
    layers of src/ and are skipped."""
    rows, inside = [], False
    with open(hacking, encoding='utf-8') as text:
        for line in text:
            if line.strip() == TABLE_START:
                inside = True
            elif line.strip() == TABLE_END:
                break
            elif inside:
                row = ROW.match(line)
                if row:
                    cells = [c.strip() for c in line.strip().strip('|').split('|')]
                    rows.append((row.group(1), cells[-1]))
    order = [folder for folder, _ in rows]
    uses = {}
    for i, (folder, cell) in enumerate(rows):
        if 'every layer above' in cell:
            uses[folder] = set(order[:i])
        else:
            words = {w.strip('` ') for w in cell.split(',')}
            uses[folder] = {w for w in words if w in order}
    return order, uses


def source_files(srcdir):
    """{relative path under src/: folder or None} for every .c and .h."""
    files, top = {}, os.path.join(srcdir, 'src')
    for root, _, names in os.walk(top):
        for name in names:
            if name.endswith(('.c', '.h')):
                relative = os.path.relpath(os.path.join(root, name), top)
                parts = relative.split(os.sep)
                files[relative] = parts[0] if len(parts) == 2 else None
    return files


def check_tree(order, files, faults):
    folders = {folder for folder in files.values() if folder is not None}
    for path, folder in sorted(files.items()):
        if folder is None and path != 'config.h':
            faults.append(f'src/{path}: outside every folder of the table')
    for folder in sorted(folders - set(order)):
        faults.append(f'src/{folder}/: a folder the table of HACKING.md lacks')
    for folder in order:
        if folder not in folders:
            faults.append(f'the table of HACKING.md names {folder}, not in src/')


def check_table(order, uses, faults):
    """What a folder may use is below it."""
    for i, folder in enumerate(order):
        for used in sorted(uses[folder]):
            if order.index(used) >= i:
                faults.append(f'the table of HACKING.md lets {folder} use '
                              f'{used}, which is not below it')


def may_use(uses, folder, target):
    return target == folder or target in uses.get(folder, set())


def check_includes(srcdir, order, uses, files, faults):
    rank = {folder: i for i, folder in enumerate(order)}
    for path, folder in sorted(files.items()):
        if folder not in rank:
            continue
        with open(os.path.join(srcdir, 'src', path), encoding='utf-8',
                  errors='replace') as text:
            for number, line in enumerate(text, 1):
                include = INCLUDE.match(line)
                if include is None or include.group(1) == 'config.h':
                    continue
                target = include.group(1)
                parts = target.split('/')
                where = f'src/{path}:{number}'
                if len(parts) != 2 or target not in files:
                    faults.append(f'{where}: includes "{target}", which is not '
                                  'a header of a folder of src/')
                elif rank.get(parts[0], -1) > rank[folder]:
                    faults.append(f'{where}: includes "{target}": {parts[0]} '
                                  f'is above {folder} in the layers')
                elif not may_use(uses, folder, parts[0]):
                    faults.append(f'{where}: includes "{target}": the table '
                                  f'does not let {folder} use {parts[0]}')


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


def check_calls(order, uses, files, edges, faults):
    rank = {folder: i for i, folder in enumerate(order)}
    folder_of = {os.path.basename(path)[:-2]: folder
                 for path, folder in files.items() if path.endswith('.c')}
    for module in sorted(edges):
        for target in sorted(edges[module]):
            ours, theirs = folder_of.get(module), folder_of.get(target)
            if ours in rank and theirs in rank and rank[theirs] > rank[ours]:
                faults.append(f'{module} ({ours}) calls {target} ({theirs}), '
                              'a layer above it')
            elif ours in rank and theirs in rank and \
                    not may_use(uses, ours, theirs):
                faults.append(f'{module} ({ours}) calls {target} ({theirs}): '
                              f'the table does not let {ours} use {theirs}')
    for component in cycles(edges):
        pairs = [f'{a} -> {b}' for a in component for b in sorted(edges[a])
                 if b in component]
        faults.append('cycle among ' + ', '.join(component) + ': ' +
                      '; '.join(pairs))


def check(srcdir, objects, dot=False):
    """The faults found, as lines (and the summary line)."""
    faults = []
    order, uses = layer_table(os.path.join(srcdir, 'HACKING.md'))
    if not order:
        return [f'{srcdir}/HACKING.md has no table between {TABLE_START} '
                f'and {TABLE_END}'], ''
    files = source_files(srcdir)
    check_table(order, uses, faults)
    check_tree(order, files, faults)
    check_includes(srcdir, order, uses, files, faults)
    edges = {}
    if objects:
        defined, used = read_symbols(objects)
        edges = graph_of(defined, used)
        if dot:
            lines = ['digraph modules {']
            lines += [f'    "{m}" -> "{t}";' for m in sorted(edges)
                      for t in sorted(edges[m])]
            return [], '\n'.join(lines + ['}'])
        check_calls(order, uses, files, edges, faults)
    summary = (f'{len(order)} layers, {len(files)} files, {len(edges)} modules, '
               f'{sum(len(t) for t in edges.values())} calls between them: '
               'every include and call goes down')
    return faults, summary


def self_test():
    """A tree whose lower layer includes from a higher one must fail, and
    the same tree without that include must pass."""
    with tempfile.TemporaryDirectory(prefix='check-layers.') as top:
        for folder in ('low', 'high'):
            os.makedirs(os.path.join(top, 'src', folder))
        with open(os.path.join(top, 'HACKING.md'), 'w') as text:
            text.write(f'{TABLE_START}\n| `low` | below | libc |\n'
                       f'| `high` | above | low |\n{TABLE_END}\n')
        files = {'low/a.h': '', 'high/b.h': '#include "low/a.h"\n',
                 'low/a.c': '#include "config.h"\n#include "high/b.h"\n'}
        for path, body in files.items():
            with open(os.path.join(top, 'src', path), 'w') as source:
                source.write(body)
        faults, _ = check(top, [])
        if len(faults) != 1 or 'high is above low' not in faults[0]:
            print(f'self-test: an upward include gave {faults}')
            return 1
        with open(os.path.join(top, 'src', 'low', 'a.c'), 'w') as source:
            source.write('#include "low/a.h"\n')
        with open(os.path.join(top, 'src', 'stray.c'), 'w') as source:
            source.write('')
        faults, _ = check(top, [])
        if len(faults) != 1 or 'outside every folder' not in faults[0]:
            print(f'self-test: a file outside the folders gave {faults}')
            return 1
        os.remove(os.path.join(top, 'src', 'stray.c'))
        faults, _ = check(top, [])
        if faults:
            print(f'self-test: a good tree gave {faults}')
            return 1
    return 0


def main(argv):
    if argv[1:] == ['--self-test']:
        return self_test()
    dot = '--dot' in argv
    args = [a for a in argv[1:] if a != '--dot']
    if not args:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    faults, summary = check(args[0], args[1:], dot)
    for fault in faults:
        print(fault)
    if faults:
        return 1
    print(summary)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
