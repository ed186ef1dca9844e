#!/bin/sh
# Runs the integration tests (tests/integration/*.py) with Debian's python3
# and pytest. They mount for real, so they need root and /dev/fuse; without
# them this reports SKIP (exit 77) to the automake test driver.
#
# Each server of S3CACHEFS_SERVERS (default: s3rver,swift) gets its own
# pytest process, and they run at the same time: the tests spend most of
# their time waiting for a server, a mount or the network, so two runs
# share the machine well. S3CACHEFS_SERIAL=1 runs them one after the other.
set -eu
srcdir=${S3CACHEFS_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
    echo "integration tests need root and /dev/fuse: skipped"
    exit 77
fi
if ! /usr/bin/python3 -c 'import pytest, boto3, filelock, numpy, torch, xxhash' 2>/dev/null; then
    echo "python3-pytest, -boto3, -filelock, -numpy, -torch or -xxhash is missing: run tests/install-deps.sh"
    exit 1
fi
basetemp=$(mktemp -d "${TMPDIR:-/tmp}/s3cachefs-integration.XXXXXX")
servers=$(echo "${S3CACHEFS_SERVERS:-s3rver,swift}" | tr ',' ' ')

run_one() {  # run_one SERVER: the tests against one server
    cd "$srcdir/tests/integration" &&
        S3CACHEFS_SERVERS=$1 /usr/bin/python3 -m pytest -q -p no:cacheprovider \
            -rs --durations=10 --basetemp="$basetemp/pytest-$1" \
            ${PYTEST_ARGS:-} .
}

status=0
if [ "${S3CACHEFS_SERIAL:-0}" = 1 ]; then
    for server in $servers; do
        echo "=== integration tests against $server"
        (run_one "$server") || status=1
    done
else
    pids=
    for server in $servers; do
        (run_one "$server" >"$basetemp/$server.out" 2>&1;
         echo $? >"$basetemp/$server.status") &
        pids="$pids $!"
    done
    for pid in $pids; do
        wait "$pid" || true
    done
    for server in $servers; do
        echo "=== integration tests against $server"
        cat "$basetemp/$server.out"
        [ "$(cat "$basetemp/$server.status" 2>/dev/null)" = 0 ] || status=1
    done
fi
# Never delete through a mount that a crashed test left behind.
if grep -q " $basetemp/" /proc/mounts; then
    echo "mounts left under $basetemp:" >&2
    grep " $basetemp/" /proc/mounts >&2
    status=1
else
    rm -rf "$basetemp"
fi
exit $status
