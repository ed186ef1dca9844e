#!/usr/bin/env bash
# A demo of s3cachefs on a fresh Debian 12 machine, as root: installs what
# it needs, builds s3cachefs, starts a local S3 server (s3rver on
# 127.0.0.1) with a bucket holding a few sample files, and mounts that
# bucket read-only at /mnt/s3cachefs-demo.
#   contrib/demo.sh          set everything up and mount
#   contrib/demo.sh stop     unmount and stop the local server
set -euo pipefail

srcdir=$(cd "$(dirname "$0")/.." && pwd)
state=/var/tmp/s3cachefs-demo
mountpoint=/mnt/s3cachefs-demo
bucket=demo
build="$srcdir/build-plain"

stop_demo() {
    if grep -q " $mountpoint fuse" /proc/mounts; then
        fusermount3 -u "$mountpoint"
    fi
    if [ -f "$state/server/server.env" ]; then
        /usr/bin/python3 "$srcdir/tests/harness/servers.py" stop --dir "$state/server"
        rm -f "$state/server/server.env"
    fi
}

if [ "${1:-}" = stop ]; then
    stop_demo
    echo "demo stopped"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "demo.sh: run as root (it installs packages and mounts)" >&2
    exit 1
fi

echo "== installing dependencies"
"$srcdir/tests/install-deps.sh"

echo "== building"
cd "$srcdir"
if [ ! -x configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt Makefile.in ]; then
    autoreconf -fi >/dev/null
fi
mkdir -p "$build"
if [ ! -f "$build/Makefile" ]; then
    (cd "$build" && "$srcdir/configure" -q)
fi
make -C "$build" -j"$(nproc)" >/dev/null

echo "== starting a local S3 server with bucket '$bucket'"
stop_demo
rm -rf "$state/server"   # a fresh bucket every time
mkdir -p "$state/server"
/usr/bin/python3 "$srcdir/tests/harness/servers.py" start s3rver \
    --dir "$state/server" --bucket "$bucket" >/dev/null
# shellcheck disable=SC1091
. "$state/server/server.env"
/usr/bin/python3 - "$S3_ENDPOINT" "$S3_ACCESS_KEY" "$S3_SECRET_KEY" "$bucket" <<'PY'
import os, sys, boto3
endpoint, key, secret, bucket = sys.argv[1:]
s3 = boto3.client('s3', endpoint_url=endpoint, aws_access_key_id=key,
                  aws_secret_access_key=secret, region_name='us-east-1')
# directory markers, as s3fs and s3cachefs write them (s3rver's listings
# would otherwise miss directories nested two levels down)
for marker in ('models/', 'models/tiny/', 'datasets/', 'datasets/shards/'):
    s3.put_object(Bucket=bucket, Key=marker, Body=b'',
                  ContentType='application/x-directory')
s3.put_object(Bucket=bucket, Key='README.txt',
              Body=b'Hello from a bucket, served by s3cachefs.\n')
s3.put_object(Bucket=bucket, Key='models/tiny/config.json',
              Body=b'{"hidden_size": 64, "layers": 2}\n')
s3.put_object(Bucket=bucket, Key='models/tiny/weights.bin', Body=os.urandom(32 << 20))
for i in range(20):
    s3.put_object(Bucket=bucket, Key=f'datasets/shards/shard-{i:03d}.txt',
                  Body=f'sample shard {i}\n'.encode() * 1000)
s3.put_object(Bucket=bucket, Key='latest', Body=b'models/tiny',
              Metadata={'mode': str(0o120777)})  # an s3fs-style symlink
PY

echo "== mounting s3://$bucket at $mountpoint"
mkdir -p "$mountpoint"
AWS_ACCESS_KEY_ID=$S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$S3_SECRET_KEY \
    "$build/src/s3cachefs" "$bucket" "$mountpoint" -o "endpoint=$S3_ENDPOINT"

cat <<MSG

s3cachefs is serving bucket '$bucket' (a local s3rver at $S3_ENDPOINT)
at $mountpoint. Try:

  ls -l $mountpoint $mountpoint/models/tiny
  cat $mountpoint/README.txt
  sha256sum $mountpoint/models/tiny/weights.bin
  ls -l $mountpoint/latest/          # an s3fs-style symlink
  getfattr -n user.s3cachefs.stats --only-values $mountpoint   # the counters:
                                     # read a file twice, see bytes_from_cache

Mount your own bucket (credentials from the environment or ~/.aws):

  $build/src/s3cachefs my-bucket /data [-o endpoint=https://...]

Stop the demo (unmount, stop the server):  $srcdir/contrib/demo.sh stop
Run the test suite:                        $srcdir/tests/run-all.sh
MSG
