"""Metadata costs: attributes and listings are cached (in memory and in
the cache's index), so `ls -l` after a remount, revalidation after the
TTL, and opens in a listed directory cost LIST requests, not a HEAD per
file. Requests are counted at a proxy.
"""
import concurrent.futures
import os
import time

import pytest

from conftest import read_stats, wait_for

FILES = 1100  # two LIST pages

# (these tests count on the daemon's memory of directories)
pytestmark = pytest.mark.usefixtures('inodes_kept')


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
    server.release_bucket(name)


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


def test_lookups_in_one_directory_run_in_parallel(server, bucket, s3, mount, proxy):
    """Eight threads looking up eight names of one directory: the kernel
    sends the eight lookups together (FUSE_PARALLEL_DIROPS, which libfuse
    3.14 drops from its INIT reply unless s3cachefs puts it back), so eight
    requests are at the server at once rather than one after another."""
    names = [f'f{i}' for i in range(8)]
    for name in names:
        s3.put_object(Bucket=bucket, Key=f'd/{name}', Body=b'x')
    mnt = mount(bucket, endpoint=proxy.endpoint,
                options=['dir_ttl=30', 'attr_ttl=30'])
    assert (mnt.path / 'd').is_dir()
    proxy.inject('hold', len(names))
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        stats = [pool.submit(os.stat, mnt.path / 'd' / name) for name in names]
        try:
            wait_for(lambda: proxy.holding == len(names), 10,
                     f'{len(names)} lookups at the server at once '
                     f'(holding {proxy.holding})')
        finally:
            proxy.release()
        assert all(done.result().st_size == 1 for done in stats)


SMALL_FILES = 40


def put_small_files(s3, bucket, count=SMALL_FILES):
    """count files of a few KiB in small/; every fifth has an s3fs mode."""
    contents = {}
    for i in range(count):
        body = os.urandom(1000 + 97 * i)
        extra = {'Metadata': {'mode': str(0o100600)}} if i % 5 == 0 else {}
        s3.put_object(Bucket=bucket, Key=f'small/f{i:03d}', Body=body, **extra)
        contents[f'f{i:03d}'] = body
    return contents


def test_lookups_then_reads_fetch_small_files_in_one_get(server, bucket, s3,
                                                          mount, proxy):
    """A data loader opens and reads files by name: once most files looked
    up in a directory are then read, a lookup GETs a small file whole (the
    GET has the s3fs headers too) instead of HEADing it, so each file costs
    one request; every byte is still fetched once."""
    contents = put_small_files(s3, bucket)
    mnt = mount(bucket, endpoint=proxy.endpoint)
    proxy.reset_counters()
    for name, body in sorted(contents.items()):
        path = mnt.path / 'small' / name
        with open(path, 'rb') as file:
            assert file.read() == body
        mode = path.stat().st_mode & 0o777
        assert mode == (0o600 if int(name[1:]) % 5 == 0 else 0o644), name
    counts = proxy.counts
    assert counts['GET'] == SMALL_FILES, counts
    # HEADs only until the pattern shows (8 lookups), and of the directory
    assert counts['HEAD'] <= 12, counts
    fetched = proxy.body_bytes(lambda record: record.kind == 'GET')
    assert fetched == sum(map(len, contents.values()))
    stats = read_stats(mnt.path)
    # data fetched by a lookup and read once is not a cache hit
    assert stats['bytes_from_cache'] == 0, stats


def test_lookups_without_reads_fetch_no_data(server, bucket, s3, mount, proxy):
    """stat() of every file (find, rsync's comparison) reads nothing: the
    lookups HEAD the files and fetch no data."""
    contents = put_small_files(s3, bucket)
    mnt = mount(bucket, endpoint=proxy.endpoint)
    proxy.reset_counters()
    for name, body in sorted(contents.items()):
        assert (mnt.path / 'small' / name).stat().st_size == len(body)
    assert proxy.counts['GET'] == 0, proxy.counts
    assert proxy.counts['HEAD'] >= SMALL_FILES, proxy.counts



def relisting_of(directory):
    """A request matcher: the LIST of DIRECTORY (with a delimiter)."""
    prefix = 'prefix=' + directory.replace('/', '%2F')
    return lambda method, path, query: 'delimiter' in query and prefix in query


def test_ls_within_the_stale_window_does_not_wait_for_a_list(server, bucket, s3,
                                                            mount, proxy):
    """Past dir_ttl but within 10 x dir_ttl, a directory's last listing is
    shown at once, and a new one is fetched in the background for the
    next listing (stale-while-revalidate)."""
    s3.put_object(Bucket=bucket, Key='d/old', Body=b'o')
    mnt = mount(bucket, endpoint=proxy.endpoint, options=['dir_ttl=2'])
    assert os.listdir(mnt.path / 'd') == ['old']
    listed = time.monotonic()
    s3.put_object(Bucket=bucket, Key='d/new', Body=b'n')  # another node
    wait_for(lambda: time.monotonic() - listed > 2.2, 5, 'dir_ttl to pass')
    proxy.inject('hold', 1, relisting_of('d/'))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            shown = pool.submit(os.listdir, mnt.path / 'd').result(timeout=10)
            assert shown == ['old']  # the last listing, while the LIST waits
            wait_for(lambda: proxy.holding == 1, 10, 'the background LIST')
        finally:
            proxy.release()
    wait_for(lambda: sorted(os.listdir(mnt.path / 'd')) == ['new', 'old'], 10,
             'the new listing to be shown')
    # one LIST in the background; the listings shown since cost none
    assert len(proxy.records(lambda r: relisting_of('d/')(r.method, r.path,
                                                          r.query))) <= 2


def test_background_listing_racing_a_rename(server, bucket, s3, mount, proxy):
    """A background relisting of d/ that a rename of d overlaps is not kept
    as the listing of the renamed directory: it lists again under the new
    name (found by a review: `ls d; mv d e` then showed e empty)."""
    s3.put_object(Bucket=bucket, Key='d/a', Body=b'a')
    s3.put_object(Bucket=bucket, Key='d/b', Body=b'b')
    mnt = mount(bucket, endpoint=proxy.endpoint, options=['dir_ttl=2'])
    assert sorted(os.listdir(mnt.path / 'd')) == ['a', 'b']
    listed = time.monotonic()
    wait_for(lambda: time.monotonic() - listed > 2.2, 5, 'dir_ttl to pass')
    proxy.inject('hold', 1, relisting_of('d/'))
    try:
        assert sorted(os.listdir(mnt.path / 'd')) == ['a', 'b']  # stale
        wait_for(lambda: proxy.holding == 1, 10, 'the background LIST')
        os.rename(mnt.path / 'd', mnt.path / 'e')
    finally:
        proxy.release()
    wait_for(lambda: proxy.records(lambda r: relisting_of('e/')(r.method, r.path,
                                                                r.query)),
             10, 'the relisting under the new name')
    assert (mnt.path / 'e' / 'a').read_bytes() == b'a'
    assert sorted(os.listdir(mnt.path / 'e')) == ['a', 'b']
    assert not (mnt.path / 'd').exists()


def test_listing_during_a_rename_lists_once(server, bucket, s3, mount, proxy):
    """A directory listed while a rename moves it is listed once, not
    again and again for as long as the move lasts (found by a review)."""
    for name in ('d/sub/x', 'd/sub/y', 'd/z'):
        s3.put_object(Bucket=bucket, Key=name, Body=b'1')
    mnt = mount(bucket, endpoint=proxy.endpoint)
    assert (mnt.path / 'd' / 'sub').is_dir()
    proxy.inject('hold', 1, 'PUT')  # (copies are PUTs)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        moving = pool.submit(os.rename, mnt.path / 'd', mnt.path / 'e')
        try:
            wait_for(lambda: proxy.holding == 1, 10, 'the rename under way')
            proxy.reset_counters()
            assert sorted(os.listdir(mnt.path / 'd' / 'sub')) == ['x', 'y']
            lists = proxy.records(lambda r: relisting_of('d/sub/')(
                r.method, r.path, r.query))
            assert len(lists) == 1, lists
        finally:
            proxy.release()
        moving.result(timeout=60)
    assert sorted(os.listdir(mnt.path / 'e' / 'sub')) == ['x', 'y']
    assert not (mnt.path / 'd').exists()


def test_removed_directory_lists_nothing(server, bucket, mount, proxy):
    """Opening a directory removed meanwhile (a shell's working
    directory) asks the bucket nothing: its key is gone (it listed the
    bucket's root three times)."""
    mnt = mount(bucket, endpoint=proxy.endpoint, options=['dir_ttl=0'])
    os.mkdir(mnt.path / 'gone')
    fd = os.open(mnt.path / 'gone', os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rmdir(mnt.path / 'gone')
        proxy.reset_counters()
        again = os.open(f'/proc/self/fd/{fd}', os.O_RDONLY | os.O_DIRECTORY)
        os.close(again)
        assert proxy.counts['LIST'] == 0, proxy.counts
    finally:
        os.close(fd)


def test_background_listings_leave_connections_to_callers(server, bucket, s3,
                                                         mount, proxy):
    """At most two background relistings run at a time, on threads of
    their own: with three connections and four relistings held at the
    proxy, `ls -l` of another directory (a LIST and HEADs) still answers
    (found by a review: they shared the pool of HEADs and read-ahead)."""
    for d in range(4):
        s3.put_object(Bucket=bucket, Key=f's{d}/x', Body=b'x')
    for i in range(3):
        s3.put_object(Bucket=bucket, Key=f'd2/f{i}', Body=b'y')
    mnt = mount(bucket, endpoint=proxy.endpoint,
                options=['dir_ttl=2', 'connections=3'])
    for d in range(4):
        assert os.listdir(mnt.path / f's{d}') == ['x']
    listed = time.monotonic()
    wait_for(lambda: time.monotonic() - listed > 2.2, 5, 'dir_ttl to pass')
    proxy.inject('hold', 4, lambda method, path, query: 'delimiter' in query
                 and 'prefix=s' in query)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            for d in range(4):  # stale listings; four relistings queued
                assert os.listdir(mnt.path / f's{d}') == ['x']
            wait_for(lambda: proxy.holding == 2, 10, 'two background LISTs')
            listing = pool.submit(ls_l, mnt.path / 'd2').result(timeout=10)
            assert sorted(listing) == ['f0', 'f1', 'f2']
            assert proxy.holding == 2
        finally:
            proxy.release()


def test_ls_past_the_stale_window_waits_for_a_list(server, bucket, s3, mount,
                                                   proxy):
    """A listing older than 10 x dir_ttl is never shown: opendir lists the
    directory again first."""
    s3.put_object(Bucket=bucket, Key='d/old', Body=b'o')
    mnt = mount(bucket, endpoint=proxy.endpoint, options=['dir_ttl=0.2'])
    assert os.listdir(mnt.path / 'd') == ['old']
    listed = time.monotonic()
    s3.put_object(Bucket=bucket, Key='d/new', Body=b'n')
    s3.delete_object(Bucket=bucket, Key='d/old')
    wait_for(lambda: time.monotonic() - listed > 2.2, 5, '10 x dir_ttl to pass')
    assert os.listdir(mnt.path / 'd') == ['new']


def test_lookups_that_ask_anyway_use_the_last_listing(server, bucket, s3, mount,
                                                      proxy):
    """Past dir_ttl, a lookup of a file the last listing has, whose headers
    it must ask the bucket for anyway, does not list the directory again
    (for up to 10 x dir_ttl): its own request confirms the file."""
    for i in range(12):
        s3.put_object(Bucket=bucket, Key=f'd/f{i:02d}', Body=b'x' * i)
    mnt = mount(bucket, endpoint=proxy.endpoint)
    for i in range(9):  # eight probes, then the directory is listed
        assert (mnt.path / 'd' / f'f{i:02d}').stat().st_size == i
    listed = time.monotonic()
    wait_for(lambda: time.monotonic() - listed > 1.2, 5, 'dir_ttl to pass')
    proxy.reset_counters()
    for i in range(9, 12):
        assert (mnt.path / 'd' / f'f{i:02d}').stat().st_size == i
    assert not proxy.records(lambda r: relisting_of('d/')(r.method, r.path, r.query))
    assert proxy.counts['HEAD'] + proxy.counts['GET'] >= 3, proxy.counts
    assert not (mnt.path / 'd' / 'absent').exists()  # that needs a listing
    assert proxy.records(lambda r: relisting_of('d/')(r.method, r.path, r.query))


def test_lookups_do_not_wait_for_a_relisting(server, bucket, s3, mount, proxy):
    """While one thread lists a directory again, a lookup of a file the
    last listing has, whose headers it must ask the bucket for anyway,
    asks at once rather than waiting for the LIST."""
    for i in range(12):
        s3.put_object(Bucket=bucket, Key=f'd/f{i:02d}', Body=b'x' * i)
    mnt = mount(bucket, endpoint=proxy.endpoint, options=['dir_ttl=0.2'])
    for i in range(9):  # eight probes, then the directory is listed
        assert (mnt.path / 'd' / f'f{i:02d}').stat().st_size == i
    listed = time.monotonic()
    wait_for(lambda: time.monotonic() - listed > 2.5, 5, '10 x dir_ttl to pass')
    proxy.inject('hold', 1, relisting_of('d/'))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        relisting = pool.submit(os.stat, mnt.path / 'd' / 'f09')
        try:
            wait_for(lambda: proxy.holding == 1, 10, 'the LIST at the proxy')
            started = time.monotonic()
            assert (mnt.path / 'd' / 'f10').stat().st_size == 10
            assert proxy.holding == 1  # answered while the LIST waits
            assert time.monotonic() - started < 5
        finally:
            proxy.release()
        assert relisting.result().st_size == 9
