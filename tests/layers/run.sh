#!/bin/sh
# make check: the modules of the core library call each other without
# cycles (tests/layers/check-layers.py over libs3cachefs.a). Needs nm
# (binutils) and Debian's python3.
set -eu
srcdir=${S3CACHEFS_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
builddir=${S3CACHEFS_BUILDDIR:-$(pwd)}
if [ ! -f "$builddir/libs3cachefs.a" ]; then
    echo "no $builddir/libs3cachefs.a: build first" >&2
    exit 99
fi
exec /usr/bin/python3 "$srcdir/tests/layers/check-layers.py" "$builddir/libs3cachefs.a"
