"""-o listing_memory bounds what directory listings take in the
daemon. Past it the listings used least recently are let go, and the next
use of such a directory reads it again; what the kernel is shown never
changes.

DIRS directories of KEYS objects each (larger than 4095 bytes, so that a
readdirplus sends no HEAD of them) take about 1.2 times the smallest
budget, 1M; each is listed in turn, then the first again, and a file of it
is read by name. The counters of the mount say what was kept and dropped.
"""
import concurrent.futures
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'bench'))
import swift_seed  # noqa: E402
from conftest import read_stats  # noqa: E402

DIRS = 5
KEYS = 1000              # a listing of them is charged about 260 KB
SIZE = 4200              # > PATH_MAX - 1: listed as regular files, no HEAD
BUDGET = 1 << 20         # listing_memory=1M, the smallest

# (another run's drop_caches would make the kernel forget the directories,
# and the daemon their listings, with no budget involved)
pytestmark = pytest.mark.usefixtures('inodes_kept')


def key(directory, index):
    return f'd{directory}/f{index:04d}.bin'


def put_keys(server, s3, bucket):
    names = [key(d, i) for d in range(DIRS) for i in range(KEYS)]
    if server.name == 'swift':
        # (5000 objects through Swift's API take minutes: bench/swift_seed.py)
        swift_seed.seed(server.workdir, bucket, names, SIZE)
        return
    body = b'k' * SIZE
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda name: s3.put_object(Bucket=bucket, Key=name,
                                                 Body=body), names))


def test_listings_beyond_listing_memory_are_let_go(server, s3, bucket, mount):
    put_keys(server, s3, bucket)
    mnt = mount(bucket, options=['listing_memory=1M'])
    expected = sorted(f'f{i:04d}.bin' for i in range(KEYS))

    for directory in range(DIRS):
        assert sorted(os.listdir(mnt.path / f'd{directory}')) == expected
        stats = read_stats(mnt.path)
        assert stats['listing_bytes'] <= BUDGET
    assert stats['listings_dropped'] >= 1
    assert stats['listing_bytes'] > BUDGET // 2   # (most of it kept)

    # the first directory's listing went: listed again, the same
    dropped = stats['listings_dropped']
    assert sorted(os.listdir(mnt.path / 'd0')) == expected
    with open(mnt.path / key(0, 7), 'rb') as file:
        assert file.read() == b'k' * SIZE
    stats = read_stats(mnt.path)
    assert stats['listing_bytes'] <= BUDGET
    assert stats['listings_dropped'] > dropped
