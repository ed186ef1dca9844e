#!/usr/bin/python3
"""Checks that what comments and docs name is where they say it is.

Over the files git tracks in src/, tests/ (but the peer suites, which are
others' code), contrib/, man/, HACKING.md and README.md:

  - a file name (`cache_dir.c`, `src/fs/fs.h`, `conftest.py`) outside an
    #include line must be a file of the tree (a path, that path; a bare
    name, some file of that name), but for the few outside names below;
  - "NAME() in FILE.c", "FILE.c's NAME()" and "NAME() (FILE.c)" must name
    a function (or a macro) that FILE defines.

A file moved or a function moved to another file leaves such comments
wrong; this fails make check on them (exit 1, one line each).

    tests/layers/check-names.py SRCDIR
"""
import os
import re
import subprocess
import sys

# names that are not the tree's and that its texts speak of: outside
# headers (cmocka's, LMDB's), the generated config.h, and examples
OUTSIDE = {'cmocka.h', 'config.h', 'lmdb.h', 'train.py', 'script.sh', 'creds.py'}
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


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    srcdir = argv[1]
    files = tracked(srcdir)
    paths, names = set(files), {os.path.basename(f) for f in files}
    sources = {os.path.basename(f): f for f in files if f.startswith('src/')}
    texts = {}
    faults = []
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
            for match in FILE_NAME.finditer(line):
                name = match.group(1)
                base = os.path.basename(name)
                known = (name in paths or f'src/{name}' in paths or
                         base in names) if '/' in name else base in names
                if not known and base not in OUTSIDE:
                    faults.append(f'{path}:{number}: names {name}, which is '
                                  'not a file of the tree')
            for pattern, name_group, file_group in FUNCTION_IN:
                for match in pattern.finditer(line):
                    name, base = match.group(name_group), match.group(file_group)
                    if base not in sources:
                        continue
                    if base not in texts:
                        with open(os.path.join(srcdir, sources[base]),
                                  encoding='utf-8', errors='replace') as text:
                            texts[base] = text.read()
                    if not defines(texts[base], name):
                        faults.append(f'{path}:{number}: says {name}() is in '
                                      f'{base}, which does not define it')
    for fault in faults:
        print(fault)
    if faults:
        return 1
    print(f'{scanned} texts: every file and function they name is where '
          'they say')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
