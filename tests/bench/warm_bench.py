#!/usr/bin/python3
"""`s3cachefs warm` of a tree against a cold `cat` of the same tree, and
what `warm --check` costs in requests.

Starts s3rver on loopback (tests/harness/servers.py) and puts a tree with
boto3 (1 GiB by default: 8 files of 96 MiB and 256 of 1 MiB under nested
directories). The mount reaches the server through the counting proxy of
latency_proxy.py (its own process), with no added latency and with 20 ms
per request (--latencies). For each latency and run, each measure on a
fresh cache and a fresh mount, the kernel's caches dropped first:

  warm          `s3cachefs warm MNT/tree` (default --jobs 4)
  cat           `find MNT/tree -type f -exec cat {} +` (one reader)
  cat -P4       `find ... | xargs -P4 -n16 cat` (four readers, as warm's jobs)
  check-after   `s3cachefs warm --check MNT/tree` right after the warm
                (attributes within attr_ttl): requests at the proxy
  check-later   the same after attr_ttl and dir_ttl passed (the walk's
                lstat()s revalidate): requests at the proxy
  read-after    every file read after the warm: GETs at the proxy (0)

    /usr/bin/python3 tests/bench/warm_bench.py [--bin build-plain/src/s3cachefs]
        [--runs 3] [--latencies 0,0.020] [--big 8x96] [--small 256x1]

Needs root and /dev/fuse. Prints one line per run and the medians; the
figures go in tests/bench/RESULTS.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_util import Mount, drop_caches

SRCDIR = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(SRCDIR / 'tests' / 'harness'))
import servers  # noqa: E402

MiB = 1 << 20


class Proxy:
    """latency_proxy.py in a process of its own."""

    def __init__(self, upstream, latency):
        self.process = subprocess.Popen(
            [sys.executable, str(SRCDIR / 'tests/bench/latency_proxy.py'),
             upstream, '--latency', str(latency)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.endpoint = json.loads(self.process.stdout.readline())['endpoint']

    def ask(self, command):
        self.process.stdin.write(command + '\n')
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def counts(self):
        return {k: v for k, v in self.ask('counters')['counts'].items() if v}

    def stop(self):
        self.process.stdin.close()
        self.process.wait(timeout=30)


def put_tree(server, bucket, big, small):
    s3 = server.client()
    data = os.urandom(max(big[1], small[1]) * MiB)
    files = {}
    for i in range(big[0]):
        files[f'tree/models/m{i // 4}/w{i}.bin'] = big[1] * MiB
    for i in range(small[0]):
        files[f'tree/data/d{i // 64}/s{i:04d}.bin'] = small[1] * MiB
    # directory markers: s3rver's listings miss common prefixes two
    # levels down (tests/harness: s3-servers notes)
    markers = {'tree/'}
    for key in files:
        parts = key.split('/')[:-1]
        markers.update('/'.join(parts[:n]) + '/' for n in range(1, len(parts) + 1))
    for marker in sorted(markers):
        s3.put_object(Bucket=bucket, Key=marker, Body=b'',
                      ContentType='application/x-directory')
    for key, size in files.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data[:size])
    return files


def timed(argv, **kwargs):
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f'warm_bench: {argv[:3]} failed: {done.stderr}')
    return seconds, done


def one_run(args, server, proxy, bucket, total, files, run, latency):
    result = {}
    for measure in ('warm', 'cat', 'cat -P4'):
        with tempfile.TemporaryDirectory(prefix='warm-bench.', dir=args.workdir) as tmp:
            mnt = Mount(args.bin, server, bucket, Path(tmp),
                        [f'endpoint={proxy.endpoint}', 'cache_size=4G'])
            tree = mnt.path / 'tree'
            try:
                drop_caches()
                proxy.ask('reset')
                if measure == 'warm':
                    seconds, done = timed([args.bin, 'warm', str(tree)])
                    result['warm_summary'] = done.stdout.strip()
                    if not done.stdout.startswith(f'warm: {files} files'):
                        sys.exit(f'warm_bench: {done.stdout}')
                elif measure == 'cat':
                    seconds, _ = timed(f'find {tree} -type f -exec cat {{}} + '
                                       '> /dev/null', shell=True)
                else:
                    seconds, _ = timed(f'find {tree} -type f -print0 | xargs -0 '
                                       '-P4 -n16 cat > /dev/null', shell=True)
                result[measure] = seconds
                result[measure + '_requests'] = proxy.counts()
                if measure == 'warm':
                    proxy.ask('reset')
                    _, check = timed([args.bin, 'warm', '--check', '--json', str(tree)])
                    report = json.loads(check.stdout)
                    if report['cached'] != total:
                        sys.exit(f'warm_bench: --check says {report["cached"]} '
                                 f'of {total} cached')
                    result['check_after'] = proxy.counts()
                    time.sleep(2.5)   # past attr_ttl and dir_ttl (1 s)
                    proxy.ask('reset')
                    timed([args.bin, 'warm', '--check', str(tree)])
                    result['check_later'] = proxy.counts()
                    drop_caches()
                    proxy.ask('reset')
                    timed(f'find {tree} -type f -exec cat {{}} + > /dev/null',
                          shell=True)
                    result['read_after'] = proxy.counts()
            finally:
                mnt.unmount()
    print(f'latency {latency * 1000:3.0f} ms run {run}: warm {result["warm"]:6.2f} s '
          f'({total / MiB / result["warm"]:6.1f} MiB/s), cat {result["cat"]:6.2f} s, '
          f'cat -P4 {result["cat -P4"]:6.2f} s; requests: warm '
          f'{result["warm_requests"]}, cat {result["cat_requests"]}, check right '
          f'after {result["check_after"]}, check later {result["check_later"]}, '
          f'read after warm {result["read_after"]}', flush=True)
    print(f'  {result["warm_summary"]}', flush=True)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--bin', default=str(SRCDIR / 'build-plain' / 'src' / 's3cachefs'))
    parser.add_argument('--runs', type=int, default=3)
    parser.add_argument('--latencies', default='0,0.020')
    parser.add_argument('--big', default='8x96', help='FILESxMIB of large files')
    parser.add_argument('--small', default='256x1', help='FILESxMIB of small files')
    parser.add_argument('--workdir', default=None)
    args = parser.parse_args()
    big = tuple(int(n) for n in args.big.split('x'))
    small = tuple(int(n) for n in args.small.split('x'))
    with tempfile.TemporaryDirectory(prefix='warm-bench-server.',
                                     dir=args.workdir) as server_dir:
        server = servers.S3rverServer(Path(server_dir))
        server.start()
        try:
            bucket = f'warm-bench-{os.getpid()}'
            server.create_bucket(bucket)
            files = put_tree(server, bucket, big, small)
            total = sum(files.values())
            print(f'tree: {len(files)} files, {total / MiB:.0f} MiB', flush=True)
            for latency in (float(x) for x in args.latencies.split(',')):
                proxy = Proxy(server.endpoint, latency)
                try:
                    runs = [one_run(args, server, proxy, bucket, total, len(files), r, latency)
                            for r in range(args.runs)]
                finally:
                    proxy.stop()
                print(f'medians at {latency * 1000:.0f} ms:')
                for measure in ('warm', 'cat', 'cat -P4'):
                    seconds = statistics.median(r[measure] for r in runs)
                    print(f'  {measure:8s} {seconds:6.2f} s  '
                          f'{total / MiB / seconds:6.1f} MiB/s', flush=True)
        finally:
            server.stop()


if __name__ == '__main__':
    main()
