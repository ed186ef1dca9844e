#!/bin/sh
# Runs the integration tests (tests/integration/*.py) with Debian's python3
# and pytest. They mount for real, so they need root and /dev/fuse; without
# them this reports SKIP (exit 77) to the automake test driver.
set -eu
srcdir=${S3CACHEFS_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
    echo "integration tests need root and /dev/fuse: skipped"
    exit 77
fi
if ! /usr/bin/python3 -c 'import pytest, boto3' 2>/dev/null; then
    echo "python3-pytest and python3-boto3 are missing: run tests/install-deps.sh"
    exit 1
fi
basetemp=$(mktemp -d "${TMPDIR:-/tmp}/s3cachefs-integration.XXXXXX")
status=0
(cd "$srcdir/tests/integration" &&
    /usr/bin/python3 -m pytest -q -p no:cacheprovider -rs --durations=15 \
        --basetemp="$basetemp/pytest" ${PYTEST_ARGS:-} .) || status=$?
# Never delete through a mount that a crashed test left behind.
if grep -q " $basetemp/" /proc/mounts; then
    echo "mounts left under $basetemp:" >&2
    grep " $basetemp/" /proc/mounts >&2
    status=1
else
    rm -rf "$basetemp"
fi
exit $status
