#!/usr/bin/env bash
# Builds the Debian package of debian/ from a copy of the tree and checks
# it with lintian (Debian 12: tests/install-deps.sh installs debhelper,
# lintian and the build dependencies):
#   1. copies the files git knows (tracked, or new and not ignored: no
#      build trees, no node_modules) to OUTDIR/work/s3cachefs-VERSION;
#   2. runs dpkg-buildpackage -us -uc there (source and binary, so that
#      lintian checks debian/ too); the package build runs the cmocka unit
#      tests only (debian/rules), none with DEB_BUILD_OPTIONS=nocheck;
#   3. prints the .deb's control fields and file list, then lintian's
#      tags (errors, warnings, info, pedantic) on the .changes.
# Exits 1 if the build fails or lintian reports an error, 77 (skipped)
# without dpkg-buildpackage or lintian, else 0; prints the time it took.
# Usage: tests/package/build-deb.sh [OUTDIR]   (default: build-deb in the tree)
set -euo pipefail

srcdir=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$srcdir/build-deb}
started=$(date +%s)

for tool in dpkg-buildpackage dh lintian; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "build-deb: no $tool (tests/install-deps.sh installs it): skipped"
        exit 77
    fi
done

version=$(dpkg-parsechangelog -l "$srcdir/debian/changelog" -S Version)
work="$out/work"
tree="$work/s3cachefs-$version"
rm -rf "$work"
mkdir -p "$tree"
if git -C "$srcdir" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$srcdir" &&
     git ls-files -z --cached --others --exclude-standard |
     while IFS= read -r -d '' path; do
         # a tracked file deleted in the work tree is not copied
         case $path in tests/node_modules|tests/node_modules/*) continue ;; esac
         [ -e "$path" ] || [ -L "$path" ] && printf '%s\0' "$path"
     done | tar --null -T - -cf -) | tar -C "$tree" -xf -
else
    tar -C "$srcdir" --exclude='./build*' --exclude=./tests/node_modules \
        --exclude=./autom4te.cache -cf - . | tar -C "$tree" -xf -
fi

echo "=== dpkg-buildpackage -us -uc in $tree"
log="$work/dpkg-buildpackage.log"
if ! (cd "$tree" &&
      DEB_BUILD_OPTIONS="parallel=$(nproc) ${DEB_BUILD_OPTIONS:-}" \
          dpkg-buildpackage -us -uc) >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "build-deb: dpkg-buildpackage failed (whole log: $log)"
    exit 1
fi
# what the package's own test run printed
sed -n '/^# TOTAL/,/^# ERROR/p' "$log"

deb=$(ls "$work"/s3cachefs_"$version"_*.deb)
changes=$(ls "$work"/s3cachefs_"$version"_*.changes)
echo "=== $(basename "$deb")"
dpkg-deb --field "$deb" Package Version Architecture Depends Installed-Size
dpkg-deb --contents "$deb"

echo "=== lintian $(basename "$changes")"
status=0
lintian --display-info --pedantic --fail-on error "$changes" || status=$?
echo "build-deb: built and checked in $(( $(date +%s) - started )) s"
if [ "$status" -ne 0 ]; then
    echo "build-deb: lintian reported errors (status $status)"
    exit 1
fi
