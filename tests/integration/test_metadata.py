"""Metadata costs: attributes and listings are cached (in memory and in
the cache's index), so `ls -l` after a remount, revalidation after the
TTL, and opens in a listed directory cost LIST requests, not a HEAD per
file. Requests are counted at a proxy.
"""
import concurrent.futures
import os
import time

import pytest

import s3proxy
from conftest import wait_for

FILES = 1100  # two LIST pages


@pytest.fixture
def proxy(server):
    with s3proxy.S3Proxy(server.endpoint) as running:
        yield running


@pytest.fixture(scope='module')
def wide_bucket(server, s3):
    """A directory of FILES small objects (with s3fs mode headers on some,
    so HEADs are needed to know them)."""
    name = f'wide-{os.getpid()}'
    server.create_bucket(name)

    def put(i):
        extra = {'Metadata': {'mode': str(0o100600)}} if i % 10 == 0 else {}
        s3.put_object(Bucket=name, Key=f'dir/f{i:05d}', Body=b'x' * (i % 7), **extra)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(put, range(FILES)))
    yield name
    server.delete_bucket_recursive(name)


def ls_l(path):
    """What `ls -l` does: list, then stat every entry."""
    return {entry.name: entry.stat(follow_symlinks=False) for entry in os.scandir(path)}


def test_ls_after_remount_costs_lists_not_heads(server, wide_bucket, mount,
                                               proxy, tmp_path):
    cache = tmp_path / 'cache'
    mnt = mount(wide_bucket, endpoint=proxy.endpoint, cache=cache)
    first = ls_l(mnt.path / 'dir')
    assert len(first) == FILES
    assert first['f00010'].st_mode & 0o777 == 0o600
    assert proxy.counts['HEAD'] > 0  # cold: the s3fs headers are unknown
    mnt.unmount()

    # past dir_ttl (1 s by default), so the listing must be revalidated
    listed = time.monotonic()
    wait_for(lambda: time.monotonic() - listed > 1.2, 5, 'dir_ttl to pass')
    again = mount(wide_bucket, endpoint=proxy.endpoint, cache=cache, name='again')
    proxy.reset_counters()
    second = ls_l(again.path / 'dir')
    assert len(second) == FILES
    assert second['f00010'].st_mode & 0o777 == 0o600
    assert second['f00003'].st_size == 3
    # no HEAD per file; one for the directory's own marker (its mode and
    # owner, read once per mount)
    assert proxy.counts['HEAD'] <= 1, proxy.counts
    assert proxy.counts['LIST'] <= 4, proxy.counts  # 2 pages (+ lookups of dir)


def test_revalidation_is_one_list_per_1000_keys(server, wide_bucket, mount, proxy):
    mnt = mount(wide_bucket, endpoint=proxy.endpoint,
                options=['attr_ttl=0.3', 'dir_ttl=3'])
    ls_l(mnt.path / 'dir')
    started = time.monotonic()
    wait_for(lambda: time.monotonic() - started > 3.1, 5, 'the TTLs to pass')
    proxy.reset_counters()
    second = ls_l(mnt.path / 'dir')
    assert len(second) == FILES
    # open (close-to-open revalidation) a few hundred files
    for name in sorted(second)[:300]:
        os.close(os.open(mnt.path / 'dir' / name, os.O_RDONLY))
    assert proxy.counts['HEAD'] == 0, proxy.counts
    assert 2 <= proxy.counts['LIST'] <= 6, proxy.counts


def test_negative_lookups_are_cached(server, bucket, s3, mount, proxy):
    s3.put_object(Bucket=bucket, Key='present', Body=b'here')
    mnt = mount(bucket, endpoint=proxy.endpoint, options=['dir_ttl=30'])
    assert not (mnt.path / 'absent').exists()
    proxy.reset_counters()
    for _ in range(20):
        assert not (mnt.path / 'absent').exists()
    assert sum(proxy.counts.values()) == 0, proxy.counts
