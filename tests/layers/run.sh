#!/bin/sh
# make check: the layers of src/ (its folders, in the order of the table
# in HACKING.md) include and call only the layers below them, and the
# modules call each other without cycles (tests/layers/check-layers.py
# over the sources and every object of src/: the library's, and those
# the daemon adds to it, the S3 client and the commands among them). The
# checker's own test runs first. tests/layers/check-names.py checks that
# the files and functions comments and docs name are where they say.
# Needs nm (binutils) and Debian's python3.
set -eu
srcdir=${S3CACHEFS_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
builddir=${S3CACHEFS_BUILDDIR:-$(pwd)}
if [ ! -f "$builddir/libs3cachefs.a" ]; then
    echo "no $builddir/libs3cachefs.a: build first" >&2
    exit 99
fi
# every object of src/: the library's, and those the daemon adds to it
objects=
for object in "$builddir"/src/*/*.o; do
    [ -f "$object" ] && objects="$objects $object"
done
# what comments and docs name is where they say (in a git checkout)
if git -C "$srcdir" rev-parse --git-dir >/dev/null 2>&1; then
    /usr/bin/python3 "$srcdir/tests/layers/check-names.py" --self-test
    /usr/bin/python3 "$srcdir/tests/layers/check-names.py" "$srcdir"
fi
/usr/bin/python3 "$srcdir/tests/layers/check-layers.py" --self-test
# shellcheck disable=SC2086 # (the object paths have no spaces)
exec /usr/bin/python3 "$srcdir/tests/layers/check-layers.py" "$srcdir" \
    "$builddir/libs3cachefs.a" $objects
