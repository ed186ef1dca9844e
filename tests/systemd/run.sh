#!/bin/sh
# make check: the systemd units of contrib/systemd (check-units.py:
# systemd-analyze verify of each, their command lines against the built
# program, and, as root with s3rver installed, the unit's start, stop and
# crashes run for real). Needs Debian's python3; SKIP without
# systemd-analyze.
set -eu
srcdir=${S3CACHEFS_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${S3CACHEFS_BIN:-$(pwd)/src/s3cachefs}
if [ ! -x "$bin" ]; then
    echo "no $bin: build first" >&2
    exit 99
fi
exec /usr/bin/python3 "$srcdir/tests/systemd/check-units.py" \
    --bin "$bin" --srcdir "$srcdir"
