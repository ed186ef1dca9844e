#!/usr/bin/python3
"""How long `s3cachefs sync MNT` takes with a given amount pending.

Starts s3rver on loopback (tests/harness/servers.py; no proxy, no added
latency), mounts s3cachefs with -o writeback, and for each shape (FILES x
SIZE, 1 GiB in all by default) makes the data pending without any upload
begun: each file is opened twice, written through one descriptor and that
one closed (a close journals it, but its upload waits for the last
descriptor: writeback mode), so the daemon holds every byte promised and
nothing sent. Then `s3cachefs sync MNT` is timed, and every object is
checked in the bucket with boto3 (size). For comparison, the same bytes
uploaded by boto3 straight to the server (16 MiB parts, 16 at a time) in
the largest shape.

    /usr/bin/python3 tests/bench/sync_bench.py [--bin build/src/s3cachefs]
        [--shapes 1x1024,8x128,256x4] [--runs 3] [--no-baseline]

Needs root and /dev/fuse (a FUSE mount). Prints one line per run and the
medians; the figures go in tests/bench/RESULTS.md.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_util import Mount

SRCDIR = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(SRCDIR / 'tests' / 'harness'))
import servers  # noqa: E402

import boto3.s3.transfer  # noqa: E402

MiB = 1 << 20
CHUNK = 8 * MiB


def make_pending(mnt, count, size, data):
    """COUNT files of SIZE bytes promised and not uploaded (see the top);
    returns the descriptors still open, and the seconds writing took."""
    started = time.monotonic()
    kept = []
    for i in range(count):
        path = mnt.path / f'f{i:05d}.bin'
        writer = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        kept.append(os.open(path, os.O_WRONLY))  # (a writer: keeps the upload waiting)
        view = memoryview(data)[:size]
        while view:
            view = view[os.write(writer, view[:CHUNK]):]
        os.close(writer)   # journaled; the upload waits for the last close
    return kept, time.monotonic() - started


def run_shape(args, server, binary, count, size_mib, data, run):
    size = size_mib * MiB
    bucket = f'sync-bench-{count}x{size_mib}-{run}-{os.getpid()}'
    server.create_bucket(bucket)
    with tempfile.TemporaryDirectory(prefix='sync-bench.', dir=args.workdir) as tmp:
        mnt = Mount(binary, server, bucket, Path(tmp),
                    [f'endpoint={server.endpoint}', 'writeback'])
        kept = []
        try:
            kept, write_seconds = make_pending(mnt, count, size, data)
            pending = subprocess.run([binary, 'pending', '--json', str(mnt.path)],
                                     capture_output=True, text=True, check=True)
            waiting = pending.stdout.count('"state": "waiting"')
            started = time.monotonic()
            done = subprocess.run([binary, 'sync', '--json', str(mnt.path)],
                                  capture_output=True, text=True)
            seconds = time.monotonic() - started
            if done.returncode != 0:
                sys.exit(f'sync_bench: sync failed: {done.stderr}')
            s3 = server.client()
            listed = {item['Key']: item['Size'] for page in
                      s3.get_paginator('list_objects_v2').paginate(Bucket=bucket)
                      for item in page.get('Contents', [])}
            if len(listed) != count or any(v != size for v in listed.values()):
                sys.exit(f'sync_bench: the bucket has {len(listed)} objects, '
                         f'not {count} of {size} bytes')
        finally:
            for fd in kept:
                os.close(fd)
            mnt.unmount(timeout=600)
    server.delete_bucket_recursive(bucket)
    total = count * size
    print(f'{count:5d} x {size_mib:5d} MiB  pending {waiting:5d} files  '
          f'written in {write_seconds:6.2f} s  sync {seconds:6.2f} s  '
          f'{total / MiB / seconds:7.1f} MiB/s', flush=True)
    return seconds


def baseline(server, size_mib, data):
    """The bytes of one SIZE_MIB object uploaded by boto3, 16 MiB parts 16
    at a time: seconds."""
    s3 = server.client()
    bucket = f'sync-bench-raw-{os.getpid()}'
    server.create_bucket(bucket)
    config = boto3.s3.transfer.TransferConfig(
        multipart_threshold=16 * MiB, multipart_chunksize=16 * MiB,
        max_concurrency=16)
    started = time.monotonic()
    s3.upload_fileobj(_Reader(data[:size_mib * MiB]), bucket, 'raw.bin',
                      Config=config)
    seconds = time.monotonic() - started
    server.delete_bucket_recursive(bucket)
    return seconds


class _Reader:
    """A file object over bytes (boto3 reads parts with read(n))."""

    def __init__(self, data):
        self.view = memoryview(data)
        self.at = 0

    def read(self, n=-1):
        end = len(self.view) if n < 0 else min(len(self.view), self.at + n)
        piece = bytes(self.view[self.at:end])
        self.at = end
        return piece


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--bin', default=str(SRCDIR / 'build' / 'src' / 's3cachefs'))
    parser.add_argument('--shapes', default='1x1024,8x128,256x4',
                        help='FILESxMIB,...: files of MIB each per run')
    parser.add_argument('--runs', type=int, default=3)
    parser.add_argument('--no-baseline', action='store_true')
    parser.add_argument('--workdir', default=None,
                        help='where the server data, caches and mounts go')
    args = parser.parse_args()
    shapes = [tuple(int(n) for n in shape.split('x')) for shape in
              args.shapes.split(',')]
    largest = max(size for _, size in shapes)
    data = os.urandom(largest * MiB)
    with tempfile.TemporaryDirectory(prefix='sync-bench-server.',
                                     dir=args.workdir) as server_dir:
        server = servers.S3rverServer(Path(server_dir))
        server.start()
        try:
            medians = {}
            for count, size_mib in shapes:
                runs = [run_shape(args, server, args.bin, count, size_mib, data, r)
                        for r in range(args.runs)]
                medians[(count, size_mib)] = statistics.median(runs)
            raw = None
            if not args.no_baseline:
                raw = statistics.median(baseline(server, largest, data)
                                        for _ in range(args.runs))
        finally:
            server.stop()
    print('\nmedians (s3rver on loopback, no proxy):')
    for (count, size_mib), seconds in medians.items():
        print(f'  sync of {count} x {size_mib} MiB pending: {seconds:.2f} s '
              f'({count * size_mib / seconds:.0f} MiB/s)')
    if raw is not None:
        print(f'  boto3, one {largest} MiB object, 16 MiB parts x 16: '
              f'{raw:.2f} s ({largest / raw:.0f} MiB/s)')


if __name__ == '__main__':
    main()
