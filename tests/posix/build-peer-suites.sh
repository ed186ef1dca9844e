#!/bin/sh
# build-peer-suites.sh OUTDIR: builds the third-party POSIX suites
# (pjdfstest and xfstests' fsx) into OUTDIR, once: a second call, or one
# made while another builds (the two pytest processes of run.sh), finds
# them built and returns at once. Rebuilt when a source file is newer
# than the last build.
#
# The suites are third-party code under their own licences (pjdfstest:
# BSD, tests/peer-suites/pjdfstest/COPYING; fsx: GPL-2.0,
# tests/peer-suites/fsx/LICENSE-GPL-2.0), carried in tests/peer-suites
# for the tests only: never linked into s3cachefs, never installed.
# S3CACHEFS_PEER_SUITES names another copy (the directory with build.sh,
# pjdfstest/ and fsx/). Exits 77 (skip) when there is none.
#
# Prints the two programs: OUTDIR/pjdfstest/pjdfstest and OUTDIR/fsx.
set -eu
out=${1:?usage: build-peer-suites.sh OUTDIR}
srcdir=$(cd "$(dirname "$0")/../.." && pwd)
suites=${S3CACHEFS_PEER_SUITES:-$srcdir/tests/peer-suites}
if [ ! -x "$suites/build.sh" ]; then
    echo "build-peer-suites: no $suites/build.sh (set S3CACHEFS_PEER_SUITES)" >&2
    exit 77
fi
suites=$(cd "$suites" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
stamp=$out/.built

# one build at a time; whoever comes second finds it done
exec 9>"$out/.lock"
flock 9
if [ ! -e "$stamp" ] || [ ! -x "$out/fsx" ] || [ ! -x "$out/pjdfstest/pjdfstest" ] ||
   [ -n "$(find "$suites" -newer "$stamp" -print -quit)" ]; then
    rm -f "$stamp"
    log=$out/build.log
    if ! "$suites/build.sh" "$out" >"$log" 2>&1; then
        echo "build-peer-suites: $suites/build.sh failed:" >&2
        tail -n 30 "$log" >&2
        exit 1
    fi
    touch "$stamp"
fi
echo "$out/pjdfstest/pjdfstest"
echo "$out/fsx"
