#!/usr/bin/python3
"""What one node costs reading a large file from the shared cache tier,
against reading it from the origin: seconds, the daemon's CPU and the
serving server's CPU.

Starts two s3rvers on loopback (tests/harness/servers.py), the origin and
the tier, with no proxy between (this measures CPU, not latency), and puts
one file of --size-mib with boto3. Each run, on fresh caches:

  tier     node 0 reads the file (from the origin: it fills the tier),
           waits until its tier writes are done and unmounts; node 1
           mounts with a cache of its own and reads the file, timed: all
           from the tier
  origin   a node without a tier reads the file, timed: all from the
           origin

The kernel's caches are dropped before each timed read (`dd bs=1M`). CPU
is user + system time of the daemon and of the server's process tree
over the timed read.

    /usr/bin/python3 tests/bench/tier_bench.py [--bin build-plain/src/s3cachefs]
        [--runs 3] [--size-mib 1024]

Needs root and /dev/fuse. Prints one line per run and the medians; the
figures go in tests/bench/RESULTS.md.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_util import Mount, drop_caches, wait_for

SRCDIR = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(SRCDIR / 'tests' / 'harness'))
import servers  # noqa: E402

MiB = 1 << 20
BUCKET, TIER_BUCKET, KEY = 'origin', 'tier', 'big.bin'


def cpu_seconds(pid):
    """User + system seconds of PID and its descendants, 0 once gone."""
    try:
        with open(f'/proc/{pid}/stat') as stat:
            fields = stat.read().rsplit(')', 1)[1].split()
        children = Path(f'/proc/{pid}/task/{pid}/children').read_text().split()
    except OSError:
        return 0.0
    own = (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')
    return own + sum(cpu_seconds(int(child)) for child in children)


def mount(binary, origin, workdir, tier=None):
    """A node: s3cachefs on ORIGIN with a cache of its own; TIER: None,
    or the shared cache's (server, bucket)."""
    options = [f'endpoint={origin.endpoint}', 'cache_size=4G']
    if tier is not None:
        # (both s3rvers take the same keys: the default profile serves)
        options += [f'shared_cache={tier[1]}',
                    f'shared_cache_endpoint={tier[0].endpoint}']
    return Mount(binary, origin, BUCKET, workdir, options)


def read_file(path, size):
    done = subprocess.run(['dd', f'if={path}', 'of=/dev/null', 'bs=1M'],
                          capture_output=True, text=True)
    if done.returncode != 0 or f'{size} bytes' not in done.stderr:
        sys.exit(f'tier_bench: reading {path}: {done.stderr.strip()}')


def server_cpu_seconds(server):
    """CPU seconds of SERVER's processes (s3rver: one) and their children."""
    return sum(cpu_seconds(pid) for pid, _ in server.process_groups())


def timed_read(mount, server, size):
    """Seconds, daemon CPU s and SERVER's CPU s of one cold read of the
    file through MOUNT."""
    drop_caches()
    daemon, served = cpu_seconds(mount.process.pid), server_cpu_seconds(server)
    started = time.monotonic()
    read_file(mount.path / KEY, size)
    seconds = time.monotonic() - started
    return (seconds, cpu_seconds(mount.process.pid) - daemon,
            server_cpu_seconds(server) - served)


def one_run(args, origin, tier, size, run):
    result = {}
    with tempfile.TemporaryDirectory(prefix='tier-bench.', dir=args.workdir) as tmp:
        tmp = Path(tmp)
        tier_bucket = f'{TIER_BUCKET}{run}'   # empty: a bucket per run
        tier.create_bucket(tier_bucket)
        (tmp / 'n0').mkdir()
        first = mount(args.bin, origin, tmp / 'n0', (tier, tier_bucket))
        try:
            read_file(first.path / KEY, size)
            wait_for(lambda: first.stats().get('tier_queued_bytes', 0) == 0,
                     300, 'the writes to the tier')
        finally:
            first.unmount()
        (tmp / 'n1').mkdir()
        follower = mount(args.bin, origin, tmp / 'n1', (tier, tier_bucket))
        try:
            result['tier'] = timed_read(follower, tier, size)
            stats = follower.stats()
        finally:
            follower.unmount()
        if stats['bytes_from_bucket'] != 0 or stats['tier_hit_blocks'] * MiB < size:
            sys.exit(f'tier_bench: the follower read {stats["bytes_from_bucket"]} '
                     f'bytes from the origin, {stats["tier_hit_blocks"]} blocks '
                     f'from the tier')
        (tmp / 'n2').mkdir()
        plain = mount(args.bin, origin, tmp / 'n2')
        try:
            result['origin'] = timed_read(plain, origin, size)
        finally:
            plain.unmount()
    for source in ('tier', 'origin'):
        seconds, daemon, served = result[source]
        print(f'run {run}: from the {source:6}: {seconds:5.2f} s '
              f'({size / MiB / seconds:4.0f} MiB/s), daemon CPU {daemon:4.2f} s, '
              f'server CPU {served:4.2f} s', flush=True)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--bin', default=str(SRCDIR / 'build-plain' / 'src' / 's3cachefs'))
    parser.add_argument('--runs', type=int, default=3)
    parser.add_argument('--size-mib', type=int, default=1024)
    parser.add_argument('--workdir', default=None)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit('tier_bench: needs root (FUSE mounts, drop_caches)')
    size = args.size_mib * MiB
    with tempfile.TemporaryDirectory(prefix='tier-bench-servers.',
                                     dir=args.workdir) as workdir:
        origin = servers.S3rverServer(Path(workdir) / 'origin')
        tier = servers.S3rverServer(Path(workdir) / 'tier')
        for server in (origin, tier):
            server.workdir.mkdir()
        try:
            origin.start()
            tier.start()
            origin.create_bucket(BUCKET)
            origin.client().put_object(Bucket=BUCKET, Key=KEY,
                                       Body=os.urandom(MiB) * args.size_mib)
            results = [one_run(args, origin, tier, size, run + 1)
                       for run in range(args.runs)]
        finally:
            tier.stop()
            origin.stop()
    print(f'medians of {args.runs}, {args.size_mib} MiB, per GiB:')
    for source in ('tier', 'origin'):
        seconds, daemon, served = (statistics.median(r[source][i] for r in results)
                                   for i in range(3))
        gib = size / (1 << 30)
        print(f'  from the {source:6}: {seconds:5.2f} s, daemon CPU '
              f'{daemon / gib:4.2f} s/GiB, server CPU {served / gib:4.2f} s/GiB')


if __name__ == '__main__':
    main()
