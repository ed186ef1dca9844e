"""The block cache: each byte fetched once, across remounts and crashes;
never a wrong byte; bounded.

Requests are counted by a proxy between the mount and the server
(tests/harness/s3proxy.py), so "no data fetched" means the server saw no
GET for the object, not that the daemon says so.
"""
import concurrent.futures
import hashlib
import mmap
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import (BINARY, daemon_env, drop_caches, is_fuse_mount,
                      kernel_caches_kept, read_stats, wait_for)

MiB = 1 << 20
RNG = random.Random(3)


def sha(data):
    return hashlib.sha256(data).hexdigest()



def object_gets(proxy, bucket, key):
    path = f'/{bucket}/{key}'
    return proxy.records(lambda r: r.kind == 'GET' and r.path == path)


def fetched_bytes(proxy, bucket, key):
    return sum(r.body_bytes for r in object_gets(proxy, bucket, key))


def data_files(cache_dir):
    return [p for p in (Path(cache_dir) / 'data').glob('*/*') if p.is_file()]


def test_read_once_then_from_cache(server, s3, bucket, mount, proxy, tmp_path):
    """Cold read fetches every byte once; re-reads, a remount and a second
    mount of the same cache fetch nothing."""
    body = RNG.randbytes(12 * MiB + 777)
    s3.put_object(Bucket=bucket, Key='data.bin', Body=body)
    cache = tmp_path / 'cache'
    mnt = mount(bucket, endpoint=proxy.endpoint, cache=cache)
    assert sha((mnt.path / 'data.bin').read_bytes()) == sha(body)
    assert fetched_bytes(proxy, bucket, 'data.bin') == len(body)

    proxy.reset_counters()
    drop_caches()
    assert sha((mnt.path / 'data.bin').read_bytes()) == sha(body)
    assert object_gets(proxy, bucket, 'data.bin') == []
    stats = read_stats(mnt.path)
    assert stats['bytes_from_bucket'] == len(body)
    assert stats['cache_used_bytes'] >= len(body)
    # the index's pages in use: within its file, which holds them all
    index_file = (cache / 'index' / 'data.mdb').stat().st_size
    assert 0 < stats['cache_index_bytes'] <= index_file, (stats, index_file)
    mnt.unmount()

    again = mount(bucket, endpoint=proxy.endpoint, cache=cache, name='again')
    proxy.reset_counters()
    assert sha((again.path / 'data.bin').read_bytes()) == sha(body)
    assert object_gets(proxy, bucket, 'data.bin') == []
    stats = read_stats(again.path)
    assert stats['bytes_from_bucket'] == 0
    assert stats['bytes_from_cache'] == len(body)
    assert stats['cache_hit_ratio'] == 1.0


def test_kill_9_then_remount(server, s3, bucket, mount, proxy, tmp_path):
    """What was cached before a kill -9 is served by the next mount."""
    body = RNG.randbytes(5 * MiB)
    s3.put_object(Bucket=bucket, Key='survivor.bin', Body=body)
    cache = tmp_path / 'cache'
    mnt = mount(bucket, endpoint=proxy.endpoint, cache=cache)
    assert (mnt.path / 'survivor.bin').read_bytes() == body
    mnt.kill(signal.SIGKILL)
    mnt.process.wait(timeout=30)
    mnt.process = None
    subprocess.run(['fusermount3', '-uz', str(mnt.path)])
    wait_for(lambda: not is_fuse_mount(mnt.path), 30, 'the dead mount to go')

    again = mount(bucket, endpoint=proxy.endpoint, cache=cache, name='again')
    proxy.reset_counters()
    assert (again.path / 'survivor.bin').read_bytes() == body
    assert object_gets(proxy, bucket, 'survivor.bin') == []


def test_new_etag_is_never_served_old_blocks(server, s3, bucket, mount, proxy,
                                             tmp_path):
    old = RNG.randbytes(3 * MiB)
    new = RNG.randbytes(3 * MiB)  # same size: only the ETag tells them apart
    s3.put_object(Bucket=bucket, Key='model.bin', Body=old)
    mnt = mount(bucket, endpoint=proxy.endpoint, cache=tmp_path / 'cache',
                options=['attr_ttl=0.2', 'dir_ttl=0.2'])
    assert (mnt.path / 'model.bin').read_bytes() == old
    s3.put_object(Bucket=bucket, Key='model.bin', Body=new)
    proxy.reset_counters()
    wait_for(lambda: (mnt.path / 'model.bin').read_bytes() == new, 10,
             'the new version')
    assert fetched_bytes(proxy, bucket, 'model.bin') >= len(new)
    # and the old version's blocks are gone from the cache
    wait_for(lambda: read_stats(mnt.path)['cache_used_bytes'] <= len(new) + MiB,
             10, 'the old blocks to be dropped')


def corrupt(path, offset):
    with open(path, 'r+b') as data:
        data.seek(offset)
        byte = data.read(1)
        data.seek(offset)
        data.write(bytes([byte[0] ^ 0xff]))


@pytest.mark.parametrize('damage', ['flip', 'truncate', 'delete'])
def test_damaged_cache_never_serves_wrong_bytes(server, s3, bucket, mount, proxy,
                                                tmp_path, damage):
    body = RNG.randbytes(4 * MiB)
    s3.put_object(Bucket=bucket, Key='precious.bin', Body=body)
    cache = tmp_path / 'cache'
    mnt = mount(bucket, endpoint=proxy.endpoint, cache=cache)
    assert (mnt.path / 'precious.bin').read_bytes() == body
    mnt.unmount()
    [data_file] = data_files(cache)
    if damage == 'flip':
        corrupt(data_file, 2 * MiB + 12345)  # inside block 2
    elif damage == 'truncate':
        os.truncate(data_file, 3 * MiB + 5)  # block 3 cut short
    else:
        data_file.unlink()

    again = mount(bucket, endpoint=proxy.endpoint, cache=cache, name='again')
    proxy.reset_counters()
    assert sha((again.path / 'precious.bin').read_bytes()) == sha(body)
    refetched = fetched_bytes(proxy, bucket, 'precious.bin')
    expected = {'flip': MiB, 'truncate': MiB, 'delete': len(body)}[damage]
    assert refetched == expected
    assert 'is damaged' in again.log()
    assert read_stats(again.path)['cache_corrupt_blocks'] >= 1


def mount_options(path):
    """The super options of the FUSE mount at PATH (/proc/self/mountinfo)."""
    for line in Path('/proc/self/mountinfo').read_text().splitlines():
        fields = line.split()
        if fields[4] == str(path):
            return fields[-1].split(',')
    raise AssertionError(f'{path} is not mounted')


def test_spliced_reads_are_verified_while_mounted(server, s3, bucket, mount,
                                                  proxy, tmp_path):
    """Reads answered by splice from the cache's files (fuse_ops.c) give
    the object's bytes, in large reads and in single pages; a block
    damaged on disk while mounted is found by the next read from disk,
    fetched again (exactly that block) and never passed on."""
    body = RNG.randbytes(6 * MiB + 4321)
    s3.put_object(Bucket=bucket, Key='spliced.bin', Body=body)
    cache = tmp_path / 'cache'
    mnt = mount(bucket, endpoint=proxy.endpoint, cache=cache)
    max_read = [o for o in mount_options(mnt.path) if o.startswith('max_read=')]
    assert max_read and 128 << 10 <= int(max_read[0].split('=')[1]) <= MiB
    path = mnt.path / 'spliced.bin'
    assert sha(path.read_bytes()) == sha(body)
    drop_caches()
    assert sha(path.read_bytes()) == sha(body)

    # single pages (no read-ahead): libfuse copies replies under 2 pages
    drop_caches()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for offset in (0, 4096 * 3 + 17, 2 * MiB - 5, len(body) - 100):
            assert os.pread(fd, 100, offset) == body[offset:offset + 100]
    finally:
        os.close(fd)

    [data_file] = data_files(cache)
    corrupt(data_file, 4 * MiB + 777)       # inside block 4
    drop_caches()
    proxy.reset_counters()
    assert sha(path.read_bytes()) == sha(body)
    assert fetched_bytes(proxy, bucket, 'spliced.bin') == MiB
    assert 'is damaged' in mnt.log()
    assert read_stats(mnt.path)['cache_corrupt_blocks'] >= 1
    # and from then on from the cache again
    drop_caches()
    proxy.reset_counters()
    assert sha(path.read_bytes()) == sha(body)
    assert object_gets(proxy, bucket, 'spliced.bin') == []
    mnt.unmount()

    # a max_read of the user's is the mount's (init asks for the same)
    small = mount(bucket, options=['max_read=131072'], endpoint=proxy.endpoint,
                  cache=cache, name='small')
    assert 'max_read=131072' in mount_options(small.path)
    drop_caches()
    assert sha((small.path / 'spliced.bin').read_bytes()) == sha(body)


def test_cache_stays_bounded(server, s3, bucket, mount, proxy, tmp_path):
    """Reading three times the cache's size: it works, and the cache never
    holds more than its size plus a block or two."""
    limit = 16 * MiB
    body = RNG.randbytes(3 * limit)
    s3.put_object(Bucket=bucket, Key='large.bin', Body=body)
    cache = tmp_path / 'cache'
    mnt = mount(bucket, endpoint=proxy.endpoint, cache=cache,
                options=[f'cache_size={limit}'])
    digest = hashlib.sha256()
    peak = 0
    with open(mnt.path / 'large.bin', 'rb') as f:
        while chunk := f.read(MiB):
            digest.update(chunk)
            on_disk = sum(p.stat().st_blocks * 512 for p in data_files(cache))
            peak = max(peak, on_disk, read_stats(mnt.path)['cache_used_bytes'])
    assert digest.hexdigest() == sha(body)
    assert peak <= limit + 2 * MiB, peak
    assert read_stats(mnt.path)['cache_evicted_blocks'] > 0


def test_second_mount_on_the_same_cache_is_refused(server, bucket, mount,
                                                    tmp_path, home):
    cache = tmp_path / 'cache'
    mount(bucket, cache=cache)
    other = tmp_path / 'other'
    other.mkdir()
    done = subprocess.run([BINARY, '-f', bucket, str(other), '-o',
                           f'endpoint={server.endpoint},cache={cache}'],
                          env=daemon_env(server, home), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert 'in use by another s3cachefs mount' in done.stderr, done.stderr
    assert not is_fuse_mount(other)


def test_mmap_of_a_cached_file(server, s3, bucket, mount, proxy, tmp_path):
    body = RNG.randbytes(6 * MiB + 99)
    s3.put_object(Bucket=bucket, Key='weights.safetensors', Body=body)
    cache = tmp_path / 'cache'
    mnt = mount(bucket, endpoint=proxy.endpoint, cache=cache)
    (mnt.path / 'weights.safetensors').read_bytes()
    mnt.unmount()
    again = mount(bucket, endpoint=proxy.endpoint, cache=cache, name='again')
    proxy.reset_counters()
    with open(again.path / 'weights.safetensors', 'rb') as f:
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
            for offset in random.Random(5).sample(range(len(body) - 4096), 50):
                assert view[offset:offset + 4096] == body[offset:offset + 4096]
            assert sha(view[:]) == sha(body)
    assert object_gets(proxy, bucket, 'weights.safetensors') == []


def test_concurrent_readers_share_requests(server, s3, bucket, mount, proxy):
    """Eight readers of one cold file: every byte crosses the network once."""
    body = RNG.randbytes(8 * MiB)
    s3.put_object(Bucket=bucket, Key='shared.bin', Body=body)
    mnt = mount(bucket, endpoint=proxy.endpoint)
    proxy.reset_counters()
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: (mnt.path / 'shared.bin').read_bytes(),
                                range(8)))
    assert all(r == body for r in results)
    assert fetched_bytes(proxy, bucket, 'shared.bin') == len(body)


def test_page_cache_kept_while_etag_unchanged(server, s3, bucket, mount):
    """A second open of an unchanged object is served by the kernel's page
    cache: the filesystem sees no read at all. A new version is read anew."""
    body = RNG.randbytes(2 * MiB)
    s3.put_object(Bucket=bucket, Key='kept.bin', Body=body)
    mnt = mount(bucket, options=['attr_ttl=0.2', 'dir_ttl=0.2'])
    with kernel_caches_kept():
        assert (mnt.path / 'kept.bin').read_bytes() == body
        assert (mnt.path / 'kept.bin').read_bytes() == body  # now keep_cache
        read_before = read_stats(mnt.path)['bytes_read']
        assert (mnt.path / 'kept.bin').read_bytes() == body
        assert read_stats(mnt.path)['bytes_read'] == read_before
    changed = RNG.randbytes(2 * MiB)
    s3.put_object(Bucket=bucket, Key='kept.bin', Body=changed)
    wait_for(lambda: (mnt.path / 'kept.bin').read_bytes() == changed, 10,
             'the new version')


def test_reading_an_open_file_asks_for_no_attributes(server, s3, bucket,
                                                     mount, proxy):
    """Reads of an open file do not wait for its attributes, however long
    it is read: no HEAD (nor LIST) while it is open, although attr_ttl
    passes between reads (libfuse's default auto_inval_data made the
    kernel check them before a read once they expired)."""
    body = RNG.randbytes(4 * MiB)
    s3.put_object(Bucket=bucket, Key='long.bin', Body=body)
    mnt = mount(bucket, endpoint=proxy.endpoint, options=['attr_ttl=0.1'])
    chunks = []
    with open(mnt.path / 'long.bin', 'rb') as reader:
        proxy.reset_counters()
        for _ in range(8):
            since = time.monotonic()
            wait_for(lambda: time.monotonic() - since > 0.15, 5, 'attr_ttl to pass')
            chunks.append(reader.read(MiB // 2))
        asked = proxy.counts['HEAD'] + proxy.counts['LIST']
    assert b''.join(chunks) == body
    assert asked == 0, proxy.counts


def test_a_scan_does_not_flush_hot_data(server, s3, bucket, mount, proxy,
                                        tmp_path):
    """Model weights read every run survive one pass over a dataset three
    times the cache's size."""
    limit = 16 * MiB
    weights = RNG.randbytes(4 * MiB)
    dataset = RNG.randbytes(3 * limit)
    s3.put_object(Bucket=bucket, Key='weights.bin', Body=weights)
    s3.put_object(Bucket=bucket, Key='dataset.bin', Body=dataset)
    cache = tmp_path / 'cache'
    mnt = mount(bucket, endpoint=proxy.endpoint, cache=cache,
                options=[f'cache_size={limit}'])
    assert (mnt.path / 'weights.bin').read_bytes() == weights  # fetched
    drop_caches()
    assert (mnt.path / 'weights.bin').read_bytes() == weights  # read again
    wait_for(lambda: read_stats(mnt.path)['cache_protected_bytes'] >= len(weights),
             10, 'the weights to count as re-used')
    digest = hashlib.sha256()
    with open(mnt.path / 'dataset.bin', 'rb') as f:
        while chunk := f.read(MiB):
            digest.update(chunk)
    assert digest.hexdigest() == sha(dataset)
    mnt.unmount()

    again = mount(bucket, endpoint=proxy.endpoint, cache=cache, name='again',
                  options=[f'cache_size={limit}'])
    proxy.reset_counters()
    assert (again.path / 'weights.bin').read_bytes() == weights
    assert object_gets(proxy, bucket, 'weights.bin') == []
    assert object_gets(proxy, bucket, 'dataset.bin') == []



@pytest.fixture
def huge_cache(tmp_path):
    """A directory on a tmpfs mounted with huge=always (its files' pages
    are large folios, as on XFS or ext4 since Linux 6.16), unmounted at the
    end (lazily if still busy): ask for it before `mount`, so that it goes
    after the mounts. Skips the test when the kernel refuses such a
    mount."""
    directory = tmp_path / 'huge'
    directory.mkdir()
    done = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=64m,huge=always',
                           'tmpfs', str(directory)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f'no tmpfs with huge=always here: {done.stderr.strip()}')
    yield directory
    if subprocess.run(['umount', str(directory)]).returncode != 0:
        subprocess.run(['umount', '-l', str(directory)])


SMALL_BLOCK = 64 * 1024


@pytest.mark.parametrize('drop', ['evicted', 'squeezed'])
def test_read_waiting_for_a_block_keeps_the_one_it_holds(
        server, s3, bucket, huge_cache, mount, proxy, drop):
    """A read of the end of a cached block and the start of a missing one,
    the cache directory on a tmpfs with huge=always: the cached block's
    pages are in the reply's pipe while the missing block is fetched.
    `evicted`: the file is evicted (`warm --evict`) while the GET of the
    missing block is held at the proxy; `squeezed`: the cache is full and
    the cached block, which this open file fetched, is the least recently
    used, so the missing block's fill makes room. Either way the reply
    carries the file's bytes, the kernel keeps no zeros for them, and
    every later read of the file gives its bytes."""
    body = RNG.randbytes(32 * SMALL_BLOCK)
    other = RNG.randbytes(15 * SMALL_BLOCK)
    s3.put_object(Bucket=bucket, Key='f.bin', Body=body)
    s3.put_object(Bucket=bucket, Key='g.bin', Body=other)
    # 16 blocks of room, no read-ahead of our own
    mnt = mount(bucket, endpoint=proxy.endpoint, cache=huge_cache,
                options=[f'block_size={SMALL_BLOCK}', 'cache_size=1M',
                         'read_ahead=0', 'cache_min_free=0',
                         'attr_ttl=600', 'dir_ttl=600'])
    at, size = SMALL_BLOCK + SMALL_BLOCK // 2, SMALL_BLOCK
    fd = os.open(mnt.path / 'f.bin', os.O_RDONLY)
    try:
        # exactly the pages asked for: no read-ahead by the kernel
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        assert os.pread(fd, SMALL_BLOCK, SMALL_BLOCK) == \
            body[SMALL_BLOCK:2 * SMALL_BLOCK]               # block 1 cached
        if drop == 'squeezed':
            assert (mnt.path / 'g.bin').read_bytes() == other  # the cache full
            assert read_stats(mnt.path)['cache_used_bytes'] == 16 * SMALL_BLOCK
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        gets = len(object_gets(proxy, bucket, 'f.bin'))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            if drop == 'evicted':
                proxy.inject('hold', 1, 'GET')
            read = pool.submit(os.pread, fd, size, at)
            if drop == 'evicted':
                try:
                    wait_for(lambda: proxy.holding == 1 or read.done(), 30,
                             'the GET of block 2')
                    done = subprocess.run([BINARY, 'warm', '--evict',
                                           str(mnt.path / 'f.bin')],
                                          capture_output=True, text=True,
                                          timeout=60)
                    assert done.returncode == 0, done.stderr
                finally:
                    proxy.release()
            got = read.result(timeout=60)
        assert len(object_gets(proxy, bucket, 'f.bin')) == gets + 1
        zeros = sum(1 for a, b in zip(got, body[at:at + size]) if a != b and a == 0)
        assert got == body[at:at + size], \
            f"{zeros} bytes of the reply are zeros, not the file's"
        # what the kernel kept of that reply, read again from its cache
        assert os.pread(fd, size, at) == body[at:at + size]
    finally:
        os.close(fd)
    drop_caches()
    assert sha((mnt.path / 'f.bin').read_bytes()) == sha(body)
    if drop == 'squeezed':
        assert read_stats(mnt.path)['cache_evicted_blocks'] > 0
