"""A cache directory belongs to one endpoint and bucket.

The identity of a cache (endpoint, bucket, prefix) is recorded in it when
it is made. A mount of another identity on a cache that holds uploads not
yet in their bucket is refused with one sentence naming both; without
pending uploads, the cache is emptied for its new owner (one log line):
what it held of another endpoint or bucket is never served, and no
recovery ever uploads into another bucket than the one a file was closed
on. Checked with boto3 against the bucket.
"""
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import (BINARY, check_sanitizer_log, daemon_env, is_fuse_mount,
                      new_bucket_name, read_stats, wait_for)
from writehelp import (HOLD_ALL, KiB, bucket_keys, kill_9, object_bytes,
                       payload, sha, wait_stat, write_file)


@pytest.fixture
def other_bucket(server):
    """A second fresh bucket on the same server."""
    name = new_bucket_name('o')
    server.create_bucket(name)
    yield name
    server.release_bucket(name)


def mount_refused(server, home, mountpoint, bucket, cache, endpoint=None,
                  options=()):
    """Runs s3cachefs in the foreground, expecting it to refuse before it
    mounts; returns (exit status, standard error). A mount that happens
    anyway is undone and fails the test."""
    mountpoint.mkdir(exist_ok=True)
    opts = ['endpoint=' + (endpoint or server.endpoint), f'cache={cache}',
            *options]
    errors = mountpoint.parent / f'{mountpoint.name}.stderr'
    with open(errors, 'wb') as sink:
        process = subprocess.Popen([BINARY, '-f', bucket, str(mountpoint),
                                    '-o', ','.join(opts)],
                                   env=daemon_env(server, home), stdout=sink,
                                   stderr=sink, stdin=subprocess.DEVNULL)
    wait_for(lambda: is_fuse_mount(mountpoint) or process.poll() is not None,
             60, 'the mount to be refused')
    if process.poll() is None:
        subprocess.run(['fusermount3', '-u', str(mountpoint)])
        process.wait(timeout=60)
        pytest.fail('the mount succeeded although the cache holds uploads '
                    f'for another bucket:\n{errors.read_text()}')
    text = errors.read_text(errors='replace')
    check_sanitizer_log(text)
    return process.returncode, text


def test_pending_uploads_keep_the_cache_for_their_bucket(
        server, s3, bucket, other_bucket, proxy, mount, tmp_path, home):
    """-o writeback on bucket A, a file closed while the server refuses
    every PUT, kill -9. A mount of bucket B on the same cache directory is
    refused with one sentence naming both buckets and the way out, and so
    is one of bucket A at another endpoint (the server itself rather than
    the proxy); B gets nothing. The next mount of A at its endpoint uploads
    the file into A."""
    cache = tmp_path / 'cache'
    mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint,
                cache=cache)
    data = payload('pending-a', 300 * KiB + 5)
    proxy.inject('denied', HOLD_ALL, 'PUT')
    write_file(mnt.path / 'ckpt.bin', data)
    wait_stat(mnt, 'upload_failures', lambda v: v >= 1)
    kill_9(mnt)
    proxy.clear_faults()
    assert bucket_keys(s3, bucket) == []

    refusals = [(other_bucket, proxy.endpoint), (bucket, server.endpoint)]
    for name, endpoint in refusals:
        status, errors = mount_refused(server, home, tmp_path / 'b', name,
                                       cache, endpoint=endpoint)
        assert status == 1, errors
        lines = [line for line in errors.splitlines() if line.strip()]
        assert len(lines) == 1, errors
        sentence = lines[0]
        for word in (f"bucket '{bucket}' at {proxy.endpoint}",
                     f"bucket '{name}' at {endpoint}", 'until its unmount',
                     's3cachefs pending', '-o cache='):
            assert word in sentence, sentence
    assert bucket_keys(s3, other_bucket) == []
    assert bucket_keys(s3, bucket) == []

    again = mount(bucket, options=['writeback'], endpoint=proxy.endpoint,
                  cache=cache, name='again')
    wait_stat(again, 'uploads_pending', lambda v: v == 0, timeout=60)
    assert object_bytes(s3, bucket, 'ckpt.bin') == data
    assert bucket_keys(s3, other_bucket) == []


def test_another_bucket_empties_the_cache(server, s3, bucket, other_bucket,
                                          mount, tmp_path):
    """Without pending uploads, a mount of another bucket on the same cache
    directory empties it (one log line naming both) and reads its own
    bytes; the first bucket's file is fetched again afterwards."""
    cache = tmp_path / 'cache'
    first, second = payload('first', 200 * KiB), payload('second', 200 * KiB)
    s3.put_object(Bucket=bucket, Key='f.bin', Body=first)
    s3.put_object(Bucket=other_bucket, Key='f.bin', Body=second)
    mnt = mount(bucket, cache=cache)
    assert sha((mnt.path / 'f.bin').read_bytes()) == sha(first)
    mnt.unmount()

    other = mount(other_bucket, cache=cache, name='other')
    assert sha((other.path / 'f.bin').read_bytes()) == sha(second)
    emptied = [line for line in other.log().splitlines()
               if 'emptied' in line or 'emptying' in line]
    assert len(emptied) == 1, other.log()
    assert bucket in emptied[0] and other_bucket in emptied[0], emptied[0]
    other.unmount()

    back = mount(bucket, cache=cache, name='back')
    before = read_stats(back.path)['bytes_from_bucket']
    assert sha((back.path / 'f.bin').read_bytes()) == sha(first)
    assert read_stats(back.path)['bytes_from_bucket'] - before >= len(first)


def test_one_bucket_name_at_two_endpoints_shares_nothing(
        server, s3, bucket, proxy, mount, tmp_path):
    """One bucket name at two endpoints (here the server and a proxy in
    front of it, two URLs), -o trust=/ at both: what the cache stored of
    the tree and the blocks at the first endpoint is not served for the
    second. The bucket changes between the mounts; the second endpoint's
    mount shows the change."""
    cache = tmp_path / 'cache'
    old, new = payload('old', 150 * KiB), payload('new', 170 * KiB)
    s3.put_object(Bucket=bucket, Key='data/model.bin', Body=old)
    first = mount(bucket, options=['trust=/'], cache=cache)
    assert sha((first.path / 'data' / 'model.bin').read_bytes()) == sha(old)
    first.unmount()

    s3.put_object(Bucket=bucket, Key='data/model.bin', Body=new)
    s3.put_object(Bucket=bucket, Key='data/added.bin', Body=b'added')
    second = mount(bucket, options=['trust=/'], cache=cache,
                   endpoint=proxy.endpoint, name='second')
    assert sorted(p.name for p in (second.path / 'data').iterdir()) == \
        ['added.bin', 'model.bin']
    assert sha((second.path / 'data' / 'model.bin').read_bytes()) == sha(new)


def default_cache_dirs(endpoint, bucket):
    """The default cache directory of BUCKET at ENDPOINT (root's), and the
    one per bucket that versions before it used."""
    scheme, host = endpoint.split('://', 1)
    name = host if scheme == 'https' else f'{scheme}:{host}'
    base = Path('/var/cache/s3cachefs')
    return base / f'{bucket}@{name}', base / bucket


def test_default_cache_directory_is_per_endpoint(server, s3, bucket, proxy,
                                                 mount, tmp_path):
    """Without -o cache=, one bucket at two endpoints gets two cache
    directories, named by bucket and endpoint."""
    mine, _ = default_cache_dirs(server.endpoint, bucket)
    behind_proxy, _ = default_cache_dirs(proxy.endpoint, bucket)
    s3.put_object(Bucket=bucket, Key='f', Body=b'bytes')
    try:
        for endpoint, name, where in ((server.endpoint, 'direct', mine),
                                      (proxy.endpoint, 'proxied', behind_proxy)):
            mnt = mount(bucket, endpoint=endpoint, name=name, start=False)
            mnt.options = [o for o in mnt.options if not o.startswith('cache=')]
            mnt.start()
            assert (mnt.path / 'f').read_bytes() == b'bytes'
            mnt.unmount()
            assert (where / 'identity').is_file(), where
            assert f'bucket {bucket}\n' in (where / 'identity').read_text()
    finally:
        shutil.rmtree(mine, ignore_errors=True)
        shutil.rmtree(behind_proxy, ignore_errors=True)


def test_cache_directory_of_an_older_version_is_kept(server, s3, bucket, proxy,
                                                     mount, tmp_path):
    """A cache in the default directory of older versions (one per bucket,
    no identity recorded) that holds a pending upload: a mount without
    -o cache= uses it, records its identity and uploads the file."""
    mine, legacy = default_cache_dirs(proxy.endpoint, bucket)
    data = payload('legacy', 120 * KiB)
    try:
        mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint,
                    cache=legacy)
        proxy.inject('denied', HOLD_ALL, 'PUT')
        write_file(mnt.path / 'old.bin', data)
        wait_stat(mnt, 'upload_failures', lambda v: v >= 1)
        kill_9(mnt)
        proxy.clear_faults()
        (legacy / 'identity').unlink()      # as an older version left it

        again = mount(bucket, options=['writeback'], endpoint=proxy.endpoint,
                      name='again', start=False)
        again.options = [o for o in again.options if not o.startswith('cache=')]
        again.start()
        wait_stat(again, 'uploads_pending', lambda v: v == 0, timeout=60)
        assert object_bytes(s3, bucket, 'old.bin') == data
        again.unmount()
        assert (legacy / 'identity').is_file()
        assert not mine.exists()
    finally:
        shutil.rmtree(mine, ignore_errors=True)
        shutil.rmtree(legacy, ignore_errors=True)
