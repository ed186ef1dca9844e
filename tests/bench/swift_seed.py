#!/usr/bin/python3
"""Puts many small objects into a running test Swift (servers.py) by
writing its storage with Swift's own code, for benchmarks of large
listings.

Through the API Swift makes about 250 objects a second here (bulk
extract-archive, bench.py's keys rows): a million would take over an
hour. This writes each object with Swift's DiskFile (the object
server's storage code, fsync skipped) and its listing rows with
ContainerBroker.merge_items (the container server's, a transaction per
batch), in this process: some thousands a second. The servers then
serve them as any other object: listings from the container database,
GET and HEAD from the object files. The account's object count is not
updated (nothing here reads it).

    /usr/bin/python3 tests/bench/swift_seed.py SERVER_DIR BUCKET COUNT BYTES
        [--dirs N]

SERVER_DIR is the --dir of `servers.py start swift`, BUCKET a bucket
it holds. Keys (key_name()): fNNNNNNN, or with --dirs N,
dNNNN/fNNNNNNN: COUNT in all, the first COUNT/N (rounded up) in the
first directory, and so on. Each object is BYTES bytes of b'k'. Prints
the seconds taken. bench.py's keys rows call seed() with names of
their own.
"""
import argparse
import hashlib
import os
import sys
import time
import warnings
from pathlib import Path

ACCOUNT = 'AUTH_test'           # servers.SwiftServer's tempauth account
DEVICE = 'd1'
BATCH = 10000                   # listing rows per container transaction


def key_name(index, count, dirs):
    """The name of object INDEX of COUNT spread over DIRS directories
    (0: none)."""
    if not dirs:
        return f'f{index:07d}'
    per_dir = -(-count // dirs)
    return f'd{index // per_dir:04d}/f{index:07d}'


def seed(server_dir, bucket, names, size):
    """Objects NAMES of SIZE bytes each in BUCKET of the Swift started in
    SERVER_DIR; returns the seconds taken. FileNotFoundError if BUCKET is
    not there."""
    etc_dir, devices = server_dir / 'etc', server_dir / 'data'
    from swift.common import utils
    utils.set_swift_dir(str(etc_dir))  # before the policies are read
    from swift.common.ring import Ring
    from swift.common.storage_policy import POLICIES
    from swift.common.utils import hash_path, storage_directory
    from swift.container.backend import ContainerBroker
    from swift.obj import diskfile

    # The data is for a benchmark, made again at will: no fsync per object.
    diskfile.fsync = diskfile.fsync_dir = lambda *args: None
    diskfile.drop_buffer_cache = lambda *args: None

    policy = POLICIES[0]
    conf = {'devices': str(devices), 'mount_check': 'false',
            'disable_fallocate': 'true'}
    manager = diskfile.DiskFileRouter(conf, utils.get_logger(conf))[policy]
    object_ring = Ring(str(etc_dir), ring_name='object')
    container_part = Ring(str(etc_dir), ring_name='container').get_part(
        ACCOUNT, bucket)
    container_hash = hash_path(ACCOUNT, bucket)
    db_path = (devices / DEVICE /
               storage_directory('containers', container_part, container_hash)
               / f'{container_hash}.db')
    if not db_path.exists():
        raise FileNotFoundError(f'no bucket {bucket} in {server_dir}')
    broker = ContainerBroker(str(db_path), account=ACCOUNT, container=bucket)

    body = b'k' * size
    etag = hashlib.md5(body).hexdigest()
    started = time.monotonic()
    with warnings.catch_warnings():
        # (Swift's code warns of deprecations of no concern here, per call)
        warnings.simplefilter('ignore', DeprecationWarning)
        write_objects(manager, object_ring, broker, policy, bucket, names,
                      body, etag)
    return time.monotonic() - started


def write_objects(manager, object_ring, broker, policy, bucket, names, body,
                  etag):
    """The objects NAMES with BODY, and their listing rows."""
    from swift.common.utils import Timestamp
    size = len(body)
    rows = []
    for index, name in enumerate(names):
        stamp = Timestamp(time.time())
        part = object_ring.get_part(ACCOUNT, bucket, name)
        disk_file = manager.get_diskfile(DEVICE, part, ACCOUNT, bucket, name,
                                         policy=policy)
        with disk_file.create(size=size) as writer:
            writer.write(body)
            writer.put({'X-Timestamp': stamp.internal, 'ETag': etag,
                        'Content-Length': str(size),
                        'Content-Type': 'application/octet-stream'})
            writer.commit(stamp)
        rows.append({'name': name, 'created_at': stamp.internal,
                     'size': size, 'content_type': 'application/octet-stream',
                     'etag': etag, 'deleted': 0,
                     'storage_policy_index': int(policy)})
        if len(rows) == BATCH or index == len(names) - 1:
            broker.merge_items(rows)
            rows = []


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('server_dir', type=Path)
    parser.add_argument('bucket')
    parser.add_argument('count', type=int)
    parser.add_argument('size', type=int)
    parser.add_argument('--dirs', type=int, default=0)
    args = parser.parse_args()
    if args.count < 1 or args.size < 0 or not 0 <= args.dirs <= args.count:
        sys.exit('swift_seed: COUNT must be positive, BYTES not negative, '
                 '--dirs from 0 to COUNT')
    try:
        seconds = seed(args.server_dir, args.bucket,
                       [key_name(index, args.count, args.dirs)
                        for index in range(args.count)], args.size)
    except FileNotFoundError as error:
        sys.exit(f'swift_seed: {error}')
    print(f'swift_seed: {args.count} objects of {args.size} bytes in '
          f'{seconds:.0f} s')


if __name__ == '__main__':
    main()
