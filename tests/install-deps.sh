#!/bin/bash
# Installs everything s3cachefs needs to build and to run its tests on
# Debian 12, as root: build tools and libraries, the test clients, OpenStack
# Swift (run by tests/harness/servers.py, never as Debian's own services),
# Node.js if absent, clang's libFuzzer for the fuzz run, debhelper and
# lintian for the package build, and the pinned
# s3rver from tests/package-lock.json.
# Idempotent: a rerun on an installed machine touches neither apt nor npm.
set -euo pipefail

tests_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

build_packages=(
    autoconf automake pkg-config make gcc
    libfuse3-dev fuse3 libcurl4-openssl-dev libssl-dev
    liblmdb-dev lmdb-utils libexpat1-dev libcmocka-dev libxxhash-dev
    libmicrohttpd-dev libsystemd-dev libjson-c-dev
)
test_packages=(
    python3 python3-pytest python3-boto3 rclone curl attr s3fs awscli
    fio python3-filelock tar perl
    python3-xxhash   # test_shared_cache.py checks the tier's frames
    # test_clients.py, the tools users run on the mount: torch 1.13 and
    # numpy bring about 166 packages (153 MB to download, 630 MB
    # installed; the time it takes is in HACKING.md, "Testing")
    python3-torch python3-numpy
    systemd   # systemd-analyze, for tests/systemd (no running systemd needed)
    prometheus   # promtool and a real scrape of -o metrics (test_metrics.py)
)
# clang's libFuzzer and sanitizers: only for tests/fuzz/run.sh
fuzz_packages=(clang libclang-rt-14-dev)
# the Debian package's build and check (tests/package/build-deb.sh);
# debhelper brings dpkg-dev and dh-autoreconf, debian/control's
# Build-Depends are among build_packages
package_packages=(debhelper lintian)
swift_packages=(
    python3-swift swift swift-proxy swift-account swift-container
    swift-object memcached
)
packages=("${build_packages[@]}" "${test_packages[@]}" "${fuzz_packages[@]}"
          "${package_packages[@]}" "${swift_packages[@]}")
if ! command -v npm >/dev/null 2>&1; then
    packages+=(nodejs npm)
fi

# Prints the packages that are not fully installed.
missing_packages() {
    local pkg status
    for pkg in "$@"; do
        status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null) \
            || status=absent
        if [ "$status" != installed ]; then
            echo "$pkg"
        fi
    done
}

policy_rc=/usr/sbin/policy-rc.d
created_policy_rc=false
remove_policy_rc() {
    if [ "$created_policy_rc" = true ]; then
        rm -f "$policy_rc"
    fi
}
trap remove_policy_rc EXIT

mapfile -t missing < <(missing_packages "${packages[@]}")
if [ "${#missing[@]}" -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    # Keep Debian's swift and memcached services from starting: the harness
    # runs its own instances on free loopback ports.
    if [ ! -e "$policy_rc" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy_rc"
        chmod 755 "$policy_rc"
        created_policy_rc=true
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    remove_policy_rc
    created_policy_rc=false
fi

# npm ci wipes and reinstalls node_modules: skip it when the tree was
# installed from this very lockfile (its checksum is kept in a stamp file).
lock_sum=$(sha256sum <"$tests_dir/package-lock.json")
stamp="$tests_dir/node_modules/.install-deps-lock.sha256"
if [ "$(cat "$stamp" 2>/dev/null)" != "$lock_sum" ]; then
    echo "install-deps: npm ci in $tests_dir"
    (cd "$tests_dir" && npm ci --no-audit --no-fund --loglevel=error)
    echo "$lock_sum" >"$stamp"
fi
