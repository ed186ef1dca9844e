"""-o trust=DIR[:DIR...]: a dataset that never changes is listed once, ever.

Through a counting proxy: a first `find -ls` of a trusted tree costs its
LISTs and HEADs once; a second costs nothing, however long after; a
remount on the same cache and a `find -ls` cost no request at all (the
listings and attributes stored in the cache index are served); outside
the trusted directories every TTL applies as before. A change by another
client under a trusted directory is not seen until a mount without the
option; bad values are refused before mounting. `s3cachefs refresh PATH`
makes the mount forget what it trusts under PATH: the next walk lists and
asks again, once, and what it learns is trusted again, across a remount.
"""
import os
import subprocess
import time

import pytest

from conftest import BINARY, daemon_env, drop_caches, is_fuse_mount

TREE = {f'data/set{d}/part{p}/file{f}.bin': os.urandom(100 + 7 * f)
        for d in range(2) for p in range(3) for f in range(4)}
# directory markers: s3rver's listings miss prefixes two levels deep
MARKERS = ['data/'] + [f'data/set{d}/' for d in range(2)] + \
    [f'data/set{d}/part{p}/' for d in range(2) for p in range(3)]


def put_tree(s3, bucket):
    for key in MARKERS:
        s3.put_object(Bucket=bucket, Key=key, Body=b'')
    for key, body in TREE.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)



def find_ls(root):
    """What `find -ls` shows of ROOT: one sorted line per entry, with its
    size and mode (times left out). Run from ROOT: the walk looks up no
    name above it (the name of a trusted directory in an untrusted parent
    is that parent's to say)."""
    # (the shell changes directory, not subprocess's cwd=: its child may
    # be a vfork() that stops this process, and the proxy in it, while the
    # chdir waits for the daemon)
    done = subprocess.run(['sh', '-c', 'cd "$1" && exec find . -printf "%P %s %M\\n"',
                           'find-ls', str(root)],
                          capture_output=True, text=True, check=True, timeout=60)
    return sorted(done.stdout.splitlines())


def requests(proxy):
    return sum(proxy.counts[kind] for kind in ('GET', 'HEAD', 'LIST', 'PUT',
                                               'DELETE', 'POST', 'OTHER'))


def asked_inside(proxy, top='data'):
    """The requests about what is inside TOP: all but the root's lookup of
    the name TOP itself (a one-key LIST of TOP/, the HEAD of its marker),
    which is the untrusted root's to answer."""
    return [(r.method, r.path, r.query) for r in proxy.records()
            if not ('max-keys=1&' in r.query + '&' and
                    r.query.endswith(f'prefix={top}%2F')) and
            not (r.method == 'HEAD' and r.path.endswith(f'/{top}/'))]


def test_listed_once_ever(s3, bucket, mount, proxy, tmp_path):
    put_tree(s3, bucket)
    s3.put_object(Bucket=bucket, Key='scratch/x', Body=b'x')
    cache = tmp_path / 'cache'
    # attributes and listings outside the trust are kept for no time
    options = ['trust=data', 'attr_ttl=0', 'dir_ttl=0']
    mnt = mount(bucket, options=options, endpoint=proxy.endpoint, cache=cache)
    first = find_ls(mnt.path / 'data')
    assert len(first) == 1 + 2 + 6 + 24   # (the top itself)
    assert requests(proxy) > 0
    proxy.reset_counters()
    assert find_ls(mnt.path / 'data') == first
    assert asked_inside(proxy) == []
    # outside: asked again
    os.listdir(mnt.path / 'scratch')
    assert proxy.counts['LIST'] >= 1

    # another client changes the trusted tree: not seen
    s3.put_object(Bucket=bucket, Key='data/set0/part0/late.bin', Body=b'late')
    proxy.reset_counters()
    time.sleep(0.1)
    assert find_ls(mnt.path / 'data') == first
    assert asked_inside(proxy) == []
    mnt.unmount()

    # a remount on the same cache: nothing asked for the trusted tree
    again = mount(bucket, options=options, endpoint=proxy.endpoint,
                  cache=cache, name='again')
    os.stat(again.path / 'data')      # (the root is not trusted: its lookup)
    proxy.reset_counters()
    assert find_ls(again.path / 'data') == first
    assert asked_inside(proxy) == []
    assert (again.path / 'data/set1/part2/file3.bin').read_bytes() == \
        TREE['data/set1/part2/file3.bin']
    again.unmount()

    # without the option the change is there
    plain = mount(bucket, endpoint=proxy.endpoint, cache=cache, name='plain')
    assert (plain.path / 'data/set0/part0/late.bin').read_bytes() == b'late'


def test_whole_mount_trusted_remount_costs_nothing(s3, bucket, mount, proxy,
                                                  tmp_path):
    put_tree(s3, bucket)
    cache = tmp_path / 'cache'
    mnt = mount(bucket, options=['trust=/'], endpoint=proxy.endpoint, cache=cache)
    first = find_ls(mnt.path)
    mnt.unmount()
    again = mount(bucket, options=['trust=/'], endpoint=proxy.endpoint,
                  cache=cache, name='again')
    proxy.reset_counters()
    assert find_ls(again.path) == first
    # (the mount's own bucket check is before the reset)
    assert requests(proxy) == 0, dict(proxy.counts)

    # a name missing from the root, then put by another client: seen once
    # the root is refreshed (the kernel kept no negative entry of it for
    # the year a trusted listing lasts)
    late = again.path / 'late.bin'
    assert not late.exists()
    s3.put_object(Bucket=bucket, Key='late.bin', Body=b'late')
    assert not late.exists()
    done = refresh(again.path)
    assert done.returncode == 0, done.stderr
    assert late.read_bytes() == b'late'


def refresh(*paths):
    return subprocess.run([BINARY, 'refresh', *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


def test_refresh_lists_again(s3, bucket, mount, proxy, tmp_path):
    put_tree(s3, bucket)
    cache = tmp_path / 'cache'
    # dir_ttl above the test's length: a negative entry the kernel kept
    # that long would hide the new file after the refresh
    options = ['trust=data', 'dir_ttl=600']
    mnt = mount(bucket, options=options, endpoint=proxy.endpoint, cache=cache)
    changed = mnt.path / 'data/set1/part2/file3.bin'
    late = mnt.path / 'data/set0/part0/late.bin'
    first = find_ls(mnt.path / 'data')
    assert changed.read_bytes() == TREE['data/set1/part2/file3.bin']
    assert not late.exists()
    s3.put_object(Bucket=bucket, Key='data/set0/part0/late.bin', Body=b'late')
    s3.put_object(Bucket=bucket, Key='data/set1/part2/file3.bin', Body=b'changed')
    proxy.reset_counters()
    assert find_ls(mnt.path / 'data') == first
    assert not late.exists()
    assert asked_inside(proxy) == []

    done = refresh(mnt.path / 'data')
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f'{mnt.path / "data"}: forgot '), done.stdout
    assert asked_inside(proxy) == []      # the refresh itself asks nothing
    # by name first (no readdir to replace a negative entry the kernel kept)
    assert late.read_bytes() == b'late'
    now = find_ls(mnt.path / 'data')
    assert now == sorted(
        [line for line in first if not line.startswith('set1/part2/file3.bin ')]
        + ['set0/part0/late.bin 4 -rw-r--r--', 'set1/part2/file3.bin 7 -rw-r--r--'])
    assert changed.read_bytes() == b'changed'
    assert proxy.counts['LIST'] > 0
    proxy.reset_counters()
    assert find_ls(mnt.path / 'data') == now      # trusted again
    assert asked_inside(proxy) == []
    mnt.unmount()

    again = mount(bucket, options=options, endpoint=proxy.endpoint,
                  cache=cache, name='again')
    os.stat(again.path / 'data')
    proxy.reset_counters()
    assert find_ls(again.path / 'data') == now
    assert asked_inside(proxy) == []

    # one file: asked about again
    s3.put_object(Bucket=bucket, Key='data/set0/part1/file0.bin', Body=b'12345')
    one = again.path / 'data/set0/part1/file0.bin'
    # the kernel forgets its entries (as under memory pressure, or another
    # run's drop_caches: CI saw 5 here): the stored listing still answers
    drop_caches()
    assert one.stat().st_size == 100
    done = refresh(one)
    assert done.returncode == 0, done.stderr
    assert one.stat().st_size == 5
    assert one.read_bytes() == b'12345'


def test_refresh_usage(mount, bucket, tmp_path):
    mnt = mount(bucket)
    assert refresh().returncode == 2
    assert refresh(mnt.path, '--bogus').returncode == 2
    assert refresh('--help').returncode == 0
    done = refresh(mnt.path / 'missing', mnt.path)
    assert done.returncode == 1
    assert 'missing' in done.stderr
    assert done.stdout.startswith(f'{mnt.path}: forgot '), done.stdout
    outside = tmp_path / 'outside'
    outside.mkdir()
    done = refresh(mnt.path, outside)
    assert done.returncode == 1
    assert 'not inside an s3cachefs mount' in done.stderr


@pytest.mark.parametrize('value', ['', 'a::b', ':a', 'a/../b', 'a/./b'])
def test_bad_values_refused(server, bucket, home, tmp_path, value):
    mountpoint = tmp_path / 'mnt'
    mountpoint.mkdir()
    done = subprocess.run(
        [BINARY, '-f', bucket, str(mountpoint), '-o',
         f'endpoint={server.endpoint},cache={tmp_path / "cache"},trust={value}'],
        env=daemon_env(server, home), capture_output=True, text=True,
        timeout=60)
    assert done.returncode == 1
    assert f"option 'trust={value}'" in done.stderr, done.stderr
    assert not is_fuse_mount(mountpoint)
