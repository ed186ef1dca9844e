#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine (as root):
#   1. installs what the build and the tests need (tests/install-deps.sh);
#   2. builds s3cachefs twice, plain and with ASan+UBSan and the
#      invariant checks of debug builds (./configure --enable-sanitizers
#      --enable-debug), each in its own build directory;
#   3. runs `make check` in both at the same time: cmocka unit tests, then
#      the integration tests that mount for real against s3rver and
#      OpenStack Swift s3api (the ASan+UBSan build against s3rver only,
#      with smaller files);
#   4. meanwhile, niced, fuzzes the parsers for a short while
#      (tests/fuzz/run.sh: a clang build of its own, each libFuzzer target
#      $S3CACHEFS_FUZZ_SECONDS, default 15, on a copy of its corpus);
#      skipped, not failed, on a machine without clang's libFuzzer;
#   5. meanwhile too, niced, builds the Debian package from a copy of the
#      tree and runs lintian on it (tests/package/build-deb.sh, in
#      build-deb/; its log lists the .deb's files): a build failure or a
#      lintian error fails the run.
# Prints the logs of failed tests and a closing "N passed, N failed" line.
# Options: --quick (plain build only, no fuzzing, no package),
# --no-install (skip step 1), --no-fuzz (skip step 4), --no-package (skip
# step 5).
set -euo pipefail

srcdir=$(cd "$(dirname "$0")/.." && pwd)
builds=(plain sanitizers)
install=yes
fuzz=yes
package=yes
for arg in "$@"; do
    case $arg in
    --quick) builds=(plain); fuzz=no; package=no ;;
    --no-install) install=no ;;
    --no-fuzz) fuzz=no ;;
    --no-package) package=no ;;
    *) echo "usage: $0 [--quick] [--no-install] [--no-fuzz] [--no-package]" >&2; exit 2 ;;
    esac
done

if [ "$install" = yes ]; then
    "$srcdir/tests/install-deps.sh"
fi

cd "$srcdir"
if [ ! -x configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt Makefile.in ]; then
    autoreconf -fi
fi

passed=0
failed=0
# Build every tree first, then run their checks at the same time: the
# sanitizer run (s3rver only) then overlaps the plain run's Swift half,
# which lasts longest; the tests wait on servers far more than on CPU.
for build in "${builds[@]}"; do
    dir="$srcdir/build-$build"
    flags=()
    [ "$build" = sanitizers ] && flags=(--enable-sanitizers --enable-debug)
    echo "=== $build build in $dir"
    mkdir -p "$dir"
    (cd "$dir" && [ -f Makefile ] || "$srcdir/configure" -q "${flags[@]}")
    make -C "$dir" -j"$(nproc)" >/dev/null
done

check() {  # check BUILD: make check in its tree; output in check.log there
    local build=$1 dir="$srcdir/build-$1"
    # the multi-GiB multipart file is for the plain build; under ASan a
    # 96 MiB one (still multipart) keeps the suite's time in bounds
    local large_mb=2048 untar_files=2000 servers=${S3CACHEFS_SERVERS:-s3rver,swift}
    local torture_points=100
    if [ "$build" = sanitizers ]; then
        # ASan is about our C code, which talks to both servers alike: one
        # server and smaller trees keep the suite's time in bounds
        large_mb=96 untar_files=300 servers=${S3CACHEFS_SERVERS:-s3rver}
        torture_points=20
    fi
    # ASan's leak checker stays on; the integration tests read its reports
    S3CACHEFS_TEST_LARGE_MB=${S3CACHEFS_TEST_LARGE_MB:-$large_mb} \
    S3CACHEFS_TEST_UNTAR_FILES=${S3CACHEFS_TEST_UNTAR_FILES:-$untar_files} \
    S3CACHEFS_TORTURE_POINTS=${S3CACHEFS_TORTURE_POINTS:-$torture_points} \
    S3CACHEFS_SERVERS=$servers \
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
        make -C "$dir" check >"$dir/check.log" 2>&1
}

pids=()
for build in "${builds[@]}"; do
    check "$build" &
    pids+=($!)
done
# The fuzz run is CPU-bound and the checks mostly wait on servers: niced,
# it takes the idle CPU rather than the tests' (its build is its own).
fuzz_log="$srcdir/build-fuzz/run.log"
if [ "$fuzz" = yes ]; then
    mkdir -p "$srcdir/build-fuzz"
    nice -n 10 "$srcdir/tests/fuzz/run.sh" "${S3CACHEFS_FUZZ_SECONDS:-15}" \
        >"$fuzz_log" 2>&1 &
    fuzz_pid=$!
fi
# The package build compiles the tree once more and runs the unit tests:
# niced like the fuzz run, in a copy of its own.
package_log="$srcdir/build-deb/run.log"
if [ "$package" = yes ]; then
    mkdir -p "$srcdir/build-deb"
    nice -n 10 "$srcdir/tests/package/build-deb.sh" "$srcdir/build-deb" \
        >"$package_log" 2>&1 &
    package_pid=$!
fi
for index in "${!builds[@]}"; do
    build=${builds[$index]}
    dir="$srcdir/build-$build"
    status=0
    wait "${pids[$index]}" || status=$?
    echo "=== make check, $build build"
    cat "$dir/check.log"
    # what the automake driver counted
    for trs in "$dir"/tests/unit/*.trs "$dir"/tests/layers/*.trs \
               "$dir"/tests/systemd/*.trs "$dir"/tests/integration/*.trs; do
        [ -f "$trs" ] || continue
        result=$(sed -n 's/^:test-result: //p' "$trs")
        case $result in
        PASS|SKIP) passed=$((passed + 1)) ;;
        *) failed=$((failed + 1))
           echo "--- $build: ${trs%.trs}.log"; cat "${trs%.trs}.log" ;;
        esac
    done
    [ "$status" -eq 0 ] || [ "$failed" -gt 0 ] || failed=$((failed + 1))
done
if [ "$fuzz" = yes ]; then
    status=0
    wait "$fuzz_pid" || status=$?
    echo "=== fuzzing (tests/fuzz/run.sh)"
    cat "$fuzz_log"
    case $status in
    0|77) passed=$((passed + 1)) ;;
    *) failed=$((failed + 1)) ;;
    esac
fi
if [ "$package" = yes ]; then
    status=0
    wait "$package_pid" || status=$?
    echo "=== Debian package (tests/package/build-deb.sh)"
    cat "$package_log"
    case $status in
    0|77) passed=$((passed + 1)) ;;
    *) failed=$((failed + 1)) ;;
    esac
fi
echo "test programs: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
