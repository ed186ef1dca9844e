#!/bin/bash
# Installs what tests/bench/bench.py needs on Debian 12, as root: the test
# servers and clients (tests/install-deps.sh), the file systems it compares
# s3cachefs with (s3fs, rclone), bindfs for the FUSE ceiling, fio and curl.
# Idempotent: on an installed machine it touches neither apt nor npm.
set -euo pipefail

bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
"$bench_dir/../install-deps.sh"

packages=(s3fs rclone bindfs fio curl fuse3)
missing=()
for pkg in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null) \
        || status=absent
    if [ "$status" != installed ]; then
        missing+=("$pkg")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "bench install-deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
