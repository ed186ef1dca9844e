#!/usr/bin/python3
"""Time per read of READERS readers at once, cold: without a shared cache
tier, with a tier whose PUTs stall (its GETs answer), and with a tier
that stalls everything. The promise it measures (README, man page
SHARED CACHE): a slow or failing tier costs a read at most one
request's deadline, then is skipped, for every reader at once.

Two s3rvers on loopback (origin, tier), the tier behind s3proxy. Each
run: a fresh mount and cache, a warm-up read (the lease mode probed,
the tier answering), then the fault, then READERS threads each reading
its own 4 MiB file at once. Prints each run's times and the median.

    /usr/bin/python3 tests/bench/tier_stall_bench.py BINARY [RUNS] [READERS]
"""
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(SRC / 'tests' / 'harness'))
sys.path.insert(0, str(SRC / 'tests' / 'bench'))
import servers  # noqa: E402
import s3proxy  # noqa: E402
from bench_util import Mount, wait_for  # noqa: E402

MiB = 1 << 20
BIN = sys.argv[1]
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
READERS = int(sys.argv[3]) if len(sys.argv) > 3 else 4


def timed_reads(path, keys):
    start = threading.Barrier(len(keys))
    seconds = {}

    def read(key):
        start.wait()
        began = time.monotonic()
        with open(path / key, 'rb') as f:
            while f.read(MiB):
                pass
        seconds[key] = time.monotonic() - began
    threads = [threading.Thread(target=read, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return list(seconds.values())


def one(origin, tier, run, case, tmp):
    keys = [f'{case}{run}-{i}.bin' for i in range(READERS)]
    s3 = origin.client()
    for key in keys + [f'warm-{case}{run}']:
        s3.put_object(Bucket='origin', Key=key, Body=os.urandom(4 * MiB))
    work = tmp / f'{case}{run}'
    work.mkdir()
    options = [f'endpoint={origin.endpoint}']
    proxy = None
    if case != 'none':
        proxy = s3proxy.S3Proxy(tier.endpoint)
        proxy.start()
        tier.create_bucket(f'tier{case}{run}')
        options += [f'shared_cache=tier{case}{run}',
                    f'shared_cache_endpoint={proxy.endpoint}']
    node = Mount(BIN, origin, 'origin', work, options)
    try:
        with open(node.path / f'warm-{case}{run}', 'rb') as f:
            f.read()
        if proxy is not None:
            wait_for(lambda: node.stats().get('tier_queued_bytes', 0) == 0, 60,
                     'tier writes')
            proxy.inject('stall', 100000, seconds=120,
                         match='PUT' if case == 'put' else None)
        return timed_reads(node.path, keys)
    finally:
        if proxy is not None:
            proxy.stop()
        node.unmount()


def main():
    with tempfile.TemporaryDirectory(prefix='tier-stall.') as tmp:
        tmp = Path(tmp)
        origin = servers.S3rverServer(tmp / 'origin')
        tier = servers.S3rverServer(tmp / 'tier')
        for server in (origin, tier):
            server.workdir.mkdir()
        try:
            origin.start()
            tier.start()
            origin.create_bucket('origin')
            for case in ('none', 'put', 'all'):
                times = []
                for run in range(RUNS):
                    got = one(origin, tier, run, case, tmp)
                    print(f'{case:4} run {run}: ' +
                          ' '.join(f'{t:.2f}' for t in sorted(got)), flush=True)
                    times += got
                print(f'{case:4}: median {statistics.median(times):.2f} s, '
                      f'max {max(times):.2f} s per read ({len(times)} reads)',
                      flush=True)
        finally:
            tier.stop()
            origin.stop()


main()
