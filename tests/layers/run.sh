#!/bin/sh
# make check: the modules of the program call each other without cycles
# (tests/layers/check-layers.py over libs3cachefs.a and the objects the
# daemon adds to it: the S3 client, main, unmount, the stats, sync and
# pending commands, warm, refresh, the shared cache and its prune
# command).
# Needs nm (binutils) and Debian's python3.
set -eu
srcdir=${S3CACHEFS_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
builddir=${S3CACHEFS_BUILDDIR:-$(pwd)}
if [ ! -f "$builddir/libs3cachefs.a" ]; then
    echo "no $builddir/libs3cachefs.a: build first" >&2
    exit 99
fi
objects=
for name in s3 s3_client credentials credsource main unmount stats_cmd \
        stats_report stats_text prices sync_cmd warm_cmd warm_report cmd_mount \
        refresh_cmd cmd_args shared_cache shared_cache_cmd; do
    for object in "$builddir"/src/*/"$name.o"; do
        [ -f "$object" ] && objects="$objects $object"
    done
done
# shellcheck disable=SC2086 # (the object paths have no spaces)
exec /usr/bin/python3 "$srcdir/tests/layers/check-layers.py" \
    "$builddir/libs3cachefs.a" $objects
