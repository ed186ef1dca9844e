#!/bin/sh
# Soak run of the crash torture: thousands of crash points against both
# servers in both modes, then power cuts, one run after the other (the
# machine has 2 cores), and the figures at the end: per run its rounds,
# crash points, operations, reads checked, failures by class, time and
# crash points per minute, and the failing seeds (replay one with
# torture.py --seed S --mode M --server X --rounds 1).
#
#   tests/torture/soak.sh                      # 2000 crash points per run
#   SOAK_POINTS=500 SOAK_SERVERS=s3rver tests/torture/soak.sh
#
# SOAK_POINTS (2000): crash points per server and mode; SOAK_BUDGET
# (seconds, 3600): the most one run may take; SOAK_POWERLOSS_POINTS (200,
# s3rver, writeback; 0: none); SOAK_SERVERS (s3rver,swift); SOAK_SEED
# (random); SOAK_LATENCY (0.04 s per request at the proxy); S3CACHEFS_BIN
# (build/src/s3cachefs). Logs go to SOAK_DIR (a new directory under
# /tmp), which is kept. Exit status 1 if any run found a failure.
set -u
srcdir=$(cd "$(dirname "$0")/../.." && pwd)
binary=${S3CACHEFS_BIN:-$srcdir/build/src/s3cachefs}
points=${SOAK_POINTS:-2000}
budget=${SOAK_BUDGET:-3600}
powerloss=${SOAK_POWERLOSS_POINTS:-200}
latency=${SOAK_LATENCY:-0.04}
seed=${SOAK_SEED:-$(od -An -N3 -tu4 /dev/urandom | tr -d ' ')}
logs=${SOAK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/s3cachefs-soak.XXXXXX")}
mkdir -p "$logs"
status=0

run() {  # run NAME ARGS...: one torture.py run, its output in NAME.log
    name=$1
    shift
    echo "=== $name (seed $seed) $(date -u +%H:%M:%S)"
    /usr/bin/python3 "$srcdir/tests/torture/torture.py" --binary "$binary" \
        --seed "$seed" --rounds 1000000 --budget "$budget" \
        --latency "$latency" "$@" >"$logs/$name.log" 2>&1 || status=1
    grep -E '^(torture:|time:|failing seeds:)' "$logs/$name.log"
    seed=$((seed + 1000000))
}

for server in $(echo "${SOAK_SERVERS:-s3rver,swift}" | tr ',' ' '); do
    for mode in default writeback; do
        run "$server-$mode" --server "$server" --mode "$mode" \
            --crash-points "$points"
    done
done
if [ "$powerloss" -gt 0 ]; then
    run power-loss --server s3rver --mode writeback --power-loss --no-big \
        --crash-points "$powerloss"
fi

echo "=== summary (logs in $logs)"
for log in "$logs"/*.log; do
    printf '%-20s %s\n' "$(basename "$log" .log)" \
        "$(grep '^torture:' "$log" | sed 's/^torture: //')"
done
echo "=== failures by class (at most 6 reported per round)"
cat "$logs"/*.log | grep -v '^  replay:' |
    sed -n 's/^  \([a-z-]*\): .*/\1/p' | sort | uniq -c | sort -rn
exit $status
