#!/bin/sh
# pjdfstest.sh [-o OPTIONS] [--no-s3fs] [--logs DIR] [SUBSET...]
#
# POSIX conformance of s3cachefs next to Debian's s3fs: runs pjdfstest
# subsets (default: open unlink rename mkdir rmdir symlink chmod chown
# truncate ftruncate utimensat) with prove on a real mount of each, both
# against one OpenStack Swift s3api server on loopback (a bucket each),
# and prints ok/planned per subset side by side. Swift, because s3rver
# dies on pjdfstest's 255-byte names (see HACKING.md, "POSIX").
#
#   -o OPTIONS   more s3cachefs mount options (such as writeback)
#   --no-s3fs    s3cachefs only
#   --logs DIR   keep prove's verbose output there (FS-SUBSET.tap) and the
#                daemons' logs; by default a temporary directory, removed
#
# Needs root (pjdfstest changes owners; both mounts use allow_other, as
# its assertions run as other users), and what tests/install-deps.sh
# installs. S3CACHEFS_BIN is the daemon (default: build/src/s3cachefs, or
# src/s3cachefs, of this tree); the suites are built by
# build-peer-suites.sh into S3CACHEFS_PEER_BUILD (default
# build/peer-suites). Everything it starts is stopped on exit, also on
# failure or ^C. The default subsets take about half an hour per file
# system on a busy 2-core machine (rename alone 10-20 minutes).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
srcdir=$(cd "$here/../.." && pwd)
python=/usr/bin/python3
subsets_default="open unlink rename mkdir rmdir symlink chmod chown truncate ftruncate utimensat"
options=""
with_s3fs=true
logs=""
while [ $# -gt 0 ]; do
    case $1 in
    -o) options=",$2"; shift 2 ;;
    --no-s3fs) with_s3fs=false; shift ;;
    --logs) logs=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -eu/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "pjdfstest.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
    esac
done
subsets=${*:-$subsets_default}

if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
    echo "pjdfstest.sh: needs root and /dev/fuse" >&2
    exit 77
fi
bin=${S3CACHEFS_BIN:-}
if [ -z "$bin" ]; then
    for candidate in "$srcdir/build/src/s3cachefs" "$srcdir/src/s3cachefs"; do
        if [ -x "$candidate" ]; then bin=$candidate; break; fi
    done
fi
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "pjdfstest.sh: no s3cachefs binary (build it, or set S3CACHEFS_BIN)" >&2
    exit 1
fi
for tool in prove s3fs fusermount3 flock; do
    command -v $tool >/dev/null || { echo "pjdfstest.sh: $tool is missing (tests/install-deps.sh)" >&2; exit 1; }
done
peer_build=${S3CACHEFS_PEER_BUILD:-$srcdir/build/peer-suites}
pjdfstest=$("$here/build-peer-suites.sh" "$peer_build" | head -n 1)
tests_dir=$(dirname "$pjdfstest")/tests

work=$(mktemp -d "${TMPDIR:-/tmp}/s3cachefs-pjdfstest.XXXXXX")
[ -n "$logs" ] || logs=$work/logs
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
daemon_pids=""

is_mounted() {  # is_mounted DIR: listed in /proc/mounts
    awk -v d="$1" '$2 == d { found = 1 } END { exit !found }' /proc/mounts
}

wait_mounted() {  # wait_mounted DIR PID: until mounted; fails if PID died
    i=0
    while ! is_mounted "$1"; do
        if ! kill -0 "$2" 2>/dev/null || [ $i -ge 300 ]; then
            echo "pjdfstest.sh: the mount on $1 did not come up" >&2
            return 1
        fi
        i=$((i + 1)); sleep 0.1
    done
}

cleanup() {
    status=$?
    trap - EXIT INT TERM
    cd /
    for dir in "$work/s3cachefs" "$work/s3fs"; do
        i=0
        while is_mounted "$dir" && [ $i -lt 100 ]; do
            fusermount3 -u "$dir" 2>/dev/null || sleep 0.2
            i=$((i + 1))
        done
        if is_mounted "$dir"; then fusermount3 -uz "$dir" || true; fi
    done
    for pid in $daemon_pids; do
        wait "$pid" 2>/dev/null || true
    done
    if [ -e "$work/swift/server.env" ]; then
        "$python" "$srcdir/tests/harness/servers.py" stop --dir "$work/swift" || status=1
    fi
    if grep -q " $work/" /proc/mounts; then
        echo "pjdfstest.sh: mounts left under $work" >&2
        status=1
    else
        case $logs in "$work"/*) ;; *) cp -r "$work/swift/"*.log "$logs/" 2>/dev/null || true ;; esac
        rm -rf "$work"
    fi
    exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "starting Swift..." >&2
"$python" "$srcdir/tests/harness/servers.py" start swift --dir "$work/swift" \
    --bucket pjd-s3cachefs >/dev/null
. "$work/swift/server.env"
"$python" - "$S3_ENDPOINT" "$S3_ACCESS_KEY" "$S3_SECRET_KEY" pjd-s3fs <<'EOF'
import sys
import boto3
endpoint, access, secret, bucket = sys.argv[1:]
boto3.client('s3', endpoint_url=endpoint, aws_access_key_id=access,
             aws_secret_access_key=secret, region_name='us-east-1').create_bucket(Bucket=bucket)
EOF

mkdir -p "$work/s3cachefs" "$work/home"
env -u AWS_PROFILE HOME="$work/home" AWS_ACCESS_KEY_ID="$S3_ACCESS_KEY" \
    AWS_SECRET_ACCESS_KEY="$S3_SECRET_KEY" \
    "$bin" -f pjd-s3cachefs "$work/s3cachefs" \
    -o "endpoint=$S3_ENDPOINT,cache=$work/cache,allow_other$options" \
    >"$logs/s3cachefs.log" 2>&1 </dev/null &
daemon_pids="$!"
wait_mounted "$work/s3cachefs" "$!"
filesystems=s3cachefs
if $with_s3fs; then
    mkdir -p "$work/s3fs"
    printf '%s:%s:%s\n' pjd-s3fs "$S3_ACCESS_KEY" "$S3_SECRET_KEY" >"$work/s3fs.passwd"
    chmod 600 "$work/s3fs.passwd"
    env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY s3fs pjd-s3fs "$work/s3fs" -f \
        -o "url=$S3_ENDPOINT,use_path_request_style,passwd_file=$work/s3fs.passwd" \
        -o endpoint=us-east-1,allow_other,stat_cache_expire=1,enable_noobj_cache \
        >"$logs/s3fs.log" 2>&1 </dev/null &
    daemon_pids="$daemon_pids $!"
    wait_mounted "$work/s3fs" "$!"
    filesystems="s3cachefs s3fs"
fi

# count FS SUBSET: "ok planned" from prove's verbose output
count() {
    awk '/^1\.\.[0-9]+/ { sub(/^1\.\./, ""); planned += $1 }
         /^ok [0-9]+/ { ok++ }
         END { printf "%d %d\n", ok, planned }' "$logs/$1-$2.tap"
}

results=$work/results
: >"$results"
for subset in $subsets; do
    if [ ! -d "$tests_dir/$subset" ]; then
        echo "pjdfstest.sh: no subset '$subset' in $tests_dir" >&2
        exit 2
    fi
    for fs in $filesystems; do
        dir=$work/$fs/$subset
        mkdir "$dir"
        start=$(date +%s)
        (cd "$dir" && prove -v --merge -r "$tests_dir/$subset") \
            >"$logs/$fs-$subset.tap" 2>&1 || true
        seconds=$(( $(date +%s) - start ))
        set -- $(count "$fs" "$subset")
        echo "$subset $fs $1 $2 $seconds" >>"$results"
        echo "$subset: $fs $1/$2 (${seconds}s)" >&2
    done
done

echo
if $with_s3fs; then
    printf '%-10s %18s %18s\n' subset s3cachefs s3fs
else
    printf '%-10s %18s\n' subset s3cachefs
fi
awk -v both="$with_s3fs" '
    { ok[$1, $2] = $3; planned[$1, $2] = $4; if (!($1 in seen)) { seen[$1] = 1; order[n++] = $1 } }
    END {
        for (i = 0; i < n; i++) {
            s = order[i]
            line = sprintf("%-10s %18s", s, ok[s, "s3cachefs"] "/" planned[s, "s3cachefs"])
            if (both == "true")
                line = line sprintf(" %18s", ok[s, "s3fs"] "/" planned[s, "s3fs"])
            print line
        }
    }' "$results"
