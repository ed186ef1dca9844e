#!/usr/bin/env bash
# Fuzz the parsers: tests/fuzz/run.sh [-j JOBS] [SECONDS [TARGET...]]
#
# Builds the libFuzzer targets (./configure --enable-fuzzers
# --enable-debug with CC=clang, or $CLANG: ASan+UBSan, assertions on) in
# a build directory of their own, $S3CACHEFS_FUZZ_BUILD or
# SRCDIR/build-fuzz, then runs each TARGET (all by default: s3xml options
# awsconfig journal) for SECONDS (default 30) on a copy of its corpus,
# tests/fuzz/corpus/TARGET, with its dictionary when it has one; -j runs
# that many targets at a time (default 1). The corpus in the tree is never
# written: fold new inputs into it by hand (HACKING.md, "Fuzzing").
#
# Any crash, leak, timeout (an input taking over 5 s), excess memory or
# sanitizer report fails the run: the target's log is printed and the
# input that did it is kept in BUILD/fuzz-findings/TARGET/. Prints one
# line per target (executions, coverage) and exits 0 when all are clean,
# 1 when one is not, 77 when this machine cannot build libFuzzer targets
# (no clang, or no libclang-rt-14-dev: tests/install-deps.sh installs
# them).
set -euo pipefail

srcdir=$(cd "$(dirname "$0")/../.." && pwd)
build=${S3CACHEFS_FUZZ_BUILD:-$srcdir/build-fuzz}
jobs=1
if [ "${1:-}" = -j ]; then
    jobs=${2:?usage: $0 [-j JOBS] [SECONDS [TARGET...]]}
    shift 2
fi
seconds=${1:-30}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(s3xml options awsconfig journal)
case $seconds in
''|*[!0-9]*) echo "usage: $0 [-j JOBS] [SECONDS [TARGET...]]" >&2; exit 2 ;;
esac

# What each target needs beyond the defaults: inputs up to 4096 bytes,
# except XML bodies, whose texts must be able to pass the 4096-byte cap.
max_len() {
    case $1 in
    s3xml) echo 16384 ;;
    *) echo 4096 ;;
    esac
}

clang=${CLANG:-clang}
if ! command -v "$clang" >/dev/null 2>&1; then
    echo "fuzz: skipped: no $clang on this machine (tests/install-deps.sh installs clang and libclang-rt-14-dev)"
    exit 77
fi

cd "$srcdir"
if [ ! -x configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt Makefile.in ]; then
    autoreconf -fi
fi
mkdir -p "$build"
if [ ! -f "$build/Makefile" ] || ! grep -q -- '--enable-fuzzers' "$build/config.status"; then
    if ! (cd "$build" && CC=$clang "$srcdir/configure" -q --enable-fuzzers \
              --enable-debug >"$build/configure.out" 2>&1); then
        if grep -q -- '--enable-fuzzers needs' "$build/configure.out"; then
            echo "fuzz: skipped: $(grep -o -- '--enable-fuzzers needs.*' "$build/configure.out")"
            exit 77
        fi
        cat "$build/configure.out" >&2
        exit 1
    fi
fi
programs=()
for target in "${targets[@]}"; do
    [ -d "$srcdir/tests/fuzz/corpus/$target" ] || { echo "fuzz: no target '$target'" >&2; exit 2; }
    programs+=("tests/fuzz/fuzz_$target")
done
make -C "$build" -j"$(nproc)" "${programs[@]}" >/dev/null

work=$(mktemp -d /tmp/s3cachefs-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
findings=$build/fuzz-findings
mkdir -p "$findings"

# run_target NAME: fuzz it; its log in $work/NAME.log, its status in
# $work/NAME.status (0 clean, else libFuzzer's exit code or 99 for a
# sanitizer report that did not stop the run).
run_target() {
    local name=$1 corpus=$work/$1-corpus dict=() status=0
    local log=$work/$1.log
    cp -r "$srcdir/tests/fuzz/corpus/$name" "$corpus"
    [ -f "$srcdir/tests/fuzz/$name.dict" ] && dict=(-dict="$srcdir/tests/fuzz/$name.dict")
    mkdir -p "$findings/$name"
    # A 32 MB quarantine (256 by default) still outlasts any one input's
    # frees; with the default, fuzz_options' peak RSS grew to 1 GB in 12
    # minutes (7.7 M runs) and a long run would end in a false OOM.
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1:quarantine_size_mb=32} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
        "$build/tests/fuzz/fuzz_$name" "${dict[@]}" \
            -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 \
            -max_len="$(max_len "$name")" -print_final_stats=1 \
            -artifact_prefix="$findings/$name/" "$corpus" \
            >"$log" 2>&1 || status=$?
    if [ "$status" -eq 0 ] &&
        grep -qE '^==[0-9]+==ERROR|runtime error:|^SUMMARY: ' "$log"; then
        status=99
    fi
    echo "$status" >"$work/$name.status"
}

running=0
for target in "${targets[@]}"; do
    run_target "$target" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait -n || true
        running=$((running - 1))
    fi
done
wait

failed=0
for target in "${targets[@]}"; do
    log=$work/$target.log
    status=$(cat "$work/$target.status" 2>/dev/null || echo 98)
    # "#123456 DONE cov: 310 ft: 1203 corp: 140/50Kb ... exec/s: 8000 ..."
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    if [ "$status" -eq 0 ]; then
        echo "fuzz_$target: clean, ${runs:-?} runs in ${seconds} s;" \
             "$(echo "$done_line" | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [^ ]+|exec/s: [0-9]+' | tr '\n' ' ')"
    else
        failed=$((failed + 1))
        echo "fuzz_$target: FAILED (status $status); the input is in $findings/$target/"
        echo "--- fuzz_$target log (last 80 lines)"
        tail -n 80 "$log"
    fi
done
[ "$failed" -eq 0 ] || exit 1
