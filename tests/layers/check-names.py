#!/usr/bin/python3
"""Checks that what comments and docs name is where they say it is.

Over the files git tracks in src/, tests/ (but the peer suites, which are
others' code), contrib/, man/, HACKING.md and README.md:

  - a file name (`cache_dir.c`, `src/fs/fs.h`, `conftest.py`) outside an
    #include line must be a file of the tree (a path, that path; a bare
    name, some file of that name), but for the few outside names below;
  - "NAME() in FILE.c", "FILE.c's NAME()" and "NAME() (FILE.c)" must name
    a function (or a macro) that FILE defines, even with a line break in
    the phrase;
  - any other "NAME()" with an underscore and the prefix of one of the
    tree's own functions (fs_, cache_, writer_...) must name a function
    or macro some file defines (C, Python or shell): a function renamed
    leaves such names behind.

A file moved or a function moved to another file leaves such comments
wrong; this fails make check on them (exit 1, one line each).

    tests/layers/check-names.py SRCDIR
    tests/layers/check-names.py --self-test
"""
import os
import re
import subprocess
import sys
import tempfile

# names that are not the tree's and that its texts speak of: outside
# headers (cmocka's, LMDB's), the generated config.h, and examples
OUTSIDE = {'cmocka.h', 'config.h', 'lmdb.h', 'train.py', 'script.sh', 'creds.py'}
# functions of others whose prefix the tree's own functions share (a
# Python parameter, pathlib's, libfuse's, LMDB's...)
OUTSIDE_FUNCTIONS = ('on_timeout', 'is_dir', 'is_mount', 'read_bytes', 'list_buckets')
OUTSIDE_PREFIXES = ('fuse_', 'mdb_', 'curl_', 'pthread_', 'xml_', 'evp_',
                    'mhd_', 'cmocka_', 'assert_', 'posix_', 'atomic_', 'sched_')
CALLED = re.compile(r'(?<![\w.>])([a-z][a-z0-9]*_[a-z0-9_]+)\(\)')
SCANNED = ('src/', 'tests/', 'contrib/', 'man/', 'doc/', 'HACKING.md', 'README.md')
SKIPPED = ('tests/peer-suites/', 'tests/layers/check-layers.py',
           'tests/layers/check-names.py', 'tests/fuzz/corpus/')
FILE_NAME = re.compile(r'(?<![\w/.<-])((?:[\w.-]+/)*[a-z0-9_]+\.(?:c|h|py|sh))\b')
INCLUDE = re.compile(r'\s*#\s*include')
FUNCTION_IN = [
    (re.compile(r'`?([a-z_][a-z0-9_]*)\(\)`?,? (?:in|from|of) `?([a-z0-9_]+\.[ch])\b'), 1, 2),
    (re.compile(r'`?([a-z0-9_]+\.[ch])`?\'s `?([a-z_][a-z0-9_]*)\(\)'), 2, 1),
    (re.compile(r'`?([a-z_][a-z0-9_]*)\(\)`? \(`?([a-z0-9_]+\.[ch])`?\)'), 1, 2),
]


def tracked(srcdir):
    out = subprocess.run(['git', '-C', srcdir, 'ls-files'], capture_output=True,
                         text=True, check=True).stdout
    return out.split()


def defines(text, name):
    return re.search(r'(^|\n)[A-Za-z][\w \t*]*\b%s\s*\(' % re.escape(name),
                     text) is not None or \
        re.search(r'#\s*define\s+%s\b' % re.escape(name), text) is not None


def defined_names(srcdir, files):
    """Every function and macro the tree defines: C, Python, shell."""
    found = set()
    for path in files:
        if path.startswith(SKIPPED) or not path.endswith(('.c', '.h', '.py', '.sh')):
            continue
        with open(os.path.join(srcdir, path), encoding='utf-8',
                  errors='replace') as text:
            body = text.read()
        if path.endswith(('.c', '.h')):
            found |= set(re.findall(r'(?:^|\n)[A-Za-z][\w \t*]*?\b([a-z_][a-z0-9_]*)\s*\(', body))
            found |= set(re.findall(r'#\s*define\s+([a-z_][a-z0-9_]*)', body))
        elif path.endswith('.py'):
            found |= set(re.findall(r'\bdef\s+([a-z_][a-z0-9_]*)', body))
        else:
            found |= set(re.findall(r'(?m)^\s*([a-z_][a-z0-9_]*)\s*\(\)\s*\{', body))
    return found


def joined(lines, number):
    """Line NUMBER (1-based) and the next, as one line of prose: the
    comment or list markers of the next one dropped."""
    if number >= len(lines):
        return lines[number - 1]
    rest = re.sub(r'^\s*(?:\*|//|#|-|>)?\s*', '', lines[number])
    return lines[number - 1].rstrip() + ' ' + rest


def check(srcdir):
    """The faults of the texts of SRCDIR (a git checkout), one line each,
    and how many texts were read."""
    files = tracked(srcdir)
    paths, names = set(files), {os.path.basename(f) for f in files}
    sources = {os.path.basename(f): f for f in files if f.startswith('src/')}
    texts = {}
    defined = defined_names(srcdir, files)
    prefixes = {name.split('_')[0] for name in defined if '_' in name.strip('_')}
    faults = {}  # (in the order found, each once)
    scanned = 0
    for path in files:
        if not path.startswith(SCANNED) or path.startswith(SKIPPED):
            continue
        try:
            with open(os.path.join(srcdir, path), encoding='utf-8') as text:
                lines = text.read().split('\n')
        except (UnicodeDecodeError, IsADirectoryError):
            continue
        scanned += 1
        for number, line in enumerate(lines, 1):
            if INCLUDE.match(line):
                continue
            where = f'{path}:{number}'
            for match in FILE_NAME.finditer(line):
                name = match.group(1)
                base = os.path.basename(name)
                known = (name in paths or f'src/{name}' in paths or
                         base in names) if '/' in name else base in names
                if not known and base not in OUTSIDE:
                    faults[f'{where}: names {name}, which is not a file of '
                           'the tree'] = True
            for match in CALLED.finditer(line):
                name = match.group(1)
                if (name not in defined and name.split('_')[0] in prefixes and
                        name not in OUTSIDE_FUNCTIONS and
                        not name.startswith(OUTSIDE_PREFIXES)):
                    faults[f'{where}: names {name}(), which no file of the '
                           'tree defines'] = True
            prose = joined(lines, number)
            for pattern, name_group, file_group in FUNCTION_IN:
                for match in pattern.finditer(prose):
                    if match.start() >= len(line):
                        continue  # (the next line's own)
                    name, base = match.group(name_group), match.group(file_group)
                    if base not in sources:
                        continue
                    if base not in texts:
                        with open(os.path.join(srcdir, sources[base]),
                                  encoding='utf-8', errors='replace') as text:
                            texts[base] = text.read()
                    if not defines(texts[base], name):
                        faults[f'{where}: says {name}() is in {base}, which '
                               'does not define it'] = True
    return list(faults), scanned


SELF_TEST_TREE = {
    'src/a/one.c': 'int one_open(void)\n{\n    return 0;\n}\n'
                   'int one_close(void)\n{\n    return 0;\n}\n',
    'src/a/two.c': '/* two.c - calls one_open() in one.c, then\n'
                   ' * one_close() in\n'
                   ' * one.c; one_gone() (one.c) is not there, nor is\n'
                   ' * one_shut() in\n'
                   ' * one.c, nor three.c, nor one_lost(). */\n',
    'README.md': 'See `src/a/one.c` and one_open(); not old.c, not one_was().\n',
}
SELF_TEST_FAULTS = [
    'README.md:1: names old.c, which is not a file of the tree',
    'README.md:1: names one_was(), which no file of the tree defines',
    'src/a/two.c:3: names one_gone(), which no file of the tree defines',
    'src/a/two.c:3: says one_gone() is in one.c, which does not define it',
    'src/a/two.c:4: names one_shut(), which no file of the tree defines',
    'src/a/two.c:4: says one_shut() is in one.c, which does not define it',
    'src/a/two.c:5: names three.c, which is not a file of the tree',
    'src/a/two.c:5: names one_lost(), which no file of the tree defines',
]


def self_test():
    """The checker on a small tree of known faults: exactly those."""
    with tempfile.TemporaryDirectory() as tree:
        for path, body in SELF_TEST_TREE.items():
            os.makedirs(os.path.join(tree, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(tree, path), 'w', encoding='utf-8') as out:
                out.write(body)
        subprocess.run(['git', '-C', tree, 'init', '-q'], check=True)
        subprocess.run(['git', '-C', tree, 'add', '.'], check=True)
        faults, _ = check(tree)
    if sorted(faults) != sorted(SELF_TEST_FAULTS):
        print('check-names.py self-test: found', *faults, 'expected',
              *SELF_TEST_FAULTS, sep='\n  ')
        return 1
    print(f'check-names.py self-test: the {len(faults)} planted faults found')
    return 0


def main(argv):
    if argv[1:] == ['--self-test']:
        return self_test()
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    faults, scanned = check(argv[1])
    for fault in faults:
        print(fault)
    if faults:
        return 1
    print(f'{scanned} texts: every file and function they name is where '
          'they say')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
