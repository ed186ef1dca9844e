"""Durability of writes: when close(), fsync() and unmount return, the data
is in the bucket; nothing closed is lost to a signal, a kill -9, a 403 or a
full cache disk.

The network is slowed or stopped at will by tests/harness/s3proxy.py
between the mount and the server: a "hold" fault keeps PUTs (single PUTs
and multipart parts) waiting until the test releases them, so "not
uploaded yet" is a fact, not a race; a "denied" fault answers 403
AccessDenied. What is in the bucket is checked with boto3, straight to the
server.
"""
import errno
import os
import signal
import subprocess
import threading
import time

import boto3
import botocore.config
import botocore.exceptions
import pytest

from conftest import BINARY, is_fuse_mount, read_stats, wait_for
from writehelp import (HANG_TIMEOUT, HOLD_ALL, KiB, MiB, MULTIPART_SIZE,
                       assert_multipart, assert_objects, bucket_keys,
                       fsync_path, head, kill_9, object_bytes, payload, proxy,
                       run_within, sha, small_tmpfs, start_in_thread,
                       wait_stat, wait_stopped, write_file)

RELEASE_AFTER = 1.5   # seconds a hold lasts once the daemon is told to stop

__all__ = ['proxy']   # the fixture, imported for pytest


def write_all(mnt, files):
    """Writes and closes every file of FILES (name -> bytes) under MNT;
    returns the seconds each close took. Fails the test on a hang."""
    def run():
        seconds = []
        for name, data in files.items():
            fd = os.open(mnt.path / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                         0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view[:8 * MiB]):]
            finally:
                started = time.monotonic()
                os.close(fd)
                seconds.append(time.monotonic() - started)
        return seconds
    outcome, _ = run_within(HANG_TIMEOUT, run)
    if isinstance(outcome, Exception):
        pytest.fail(f'writing the files failed: {outcome!r}\n{mnt.log()[-3000:]}')
    return outcome


def held_files(prefix, count, big=False):
    files = {f'{prefix}-{i}.bin': payload(f'{prefix}{i}', 100 * KiB * i + 17 * i)
             for i in range(count)}
    if big:
        files[f'{prefix}-big.bin'] = payload(f'{prefix}big', MULTIPART_SIZE)
    return files


# ------------------------------------------------------------ the harness

def test_proxy_hold_and_denied(server, bucket, proxy):
    """The proxy's two write faults, through boto3: a held PUT reaches the
    server only once released; a denied PUT gets 403 AccessDenied."""
    client = proxied_client(server, proxy)
    direct = server.client()
    proxy.inject('denied', 1, 'PUT')
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        client.put_object(Bucket=bucket, Key='denied', Body=b'no')
    assert raised.value.response['Error']['Code'] == 'AccessDenied'
    assert raised.value.response['ResponseMetadata']['HTTPStatusCode'] == 403
    assert head(direct, bucket, 'denied') is None

    proxy.inject('hold', HOLD_ALL, 'PUT')
    putting = start_in_thread(
        lambda: client.put_object(Bucket=bucket, Key='held', Body=b'held'))
    wait_for(lambda: proxy.holding == 1, 10, 'the PUT to be held')
    time.sleep(0.3)
    assert not putting.done() and head(direct, bucket, 'held') is None
    proxy.release()
    putting.result(timeout=HANG_TIMEOUT)
    assert object_bytes(direct, bucket, 'held') == b'held'
    assert proxy.holding == 0 and not +proxy.pending_faults()


def proxied_client(server, proxy):
    """boto3 through the proxy, without retries."""
    return boto3.session.Session().client(
        's3', endpoint_url=proxy.endpoint, region_name=server.region,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        config=botocore.config.Config(signature_version='s3v4',
                                      s3={'addressing_style': 'path'},
                                      proxies={},
                                      retries={'total_max_attempts': 1}))


# ------------------------------------------------------------ default mode

def test_default_close_means_in_the_bucket(server, s3, bucket, mount):
    """Default mode: right after close() returns, boto3 finds the object
    with every byte (no polling), multipart above 16 MiB included."""
    mnt = mount(bucket)
    files = {'empty': b'', 'one': b'1', 'small.bin': payload('small', 100 * KiB + 3),
             'big.bin': payload('big', MULTIPART_SIZE)}
    for name, data in files.items():
        write_file(mnt.path / name, data)
        answer = head(s3, bucket, name)
        assert answer is not None, f'{name} not in the bucket after close()'
        assert answer['ContentLength'] == len(data), name
        assert sha(object_bytes(s3, bucket, name)) == sha(data), name
    stats = read_stats(mnt.path)
    assert_multipart(server, s3, bucket, 'big.bin', stats)
    assert stats['bytes_written'] == sum(len(d) for d in files.values())
    assert stats['uploads_pending'] == 0
    assert stats['uploads_completed'] >= len(files)
    assert stats['upload_failures'] == 0


def test_default_close_waits_for_the_upload(server, s3, bucket, proxy, mount):
    """Default mode: while the PUT is held at the proxy, close() does not
    return; once released, it returns and the object is there."""
    mnt = mount(bucket, endpoint=proxy.endpoint)
    data = payload('waits', 300 * KiB + 1)
    proxy.inject('hold', HOLD_ALL, 'PUT')
    try:
        fd = os.open(mnt.path / 'waits.bin', os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                     0o644)
        written, _ = run_within(HANG_TIMEOUT, os.write, fd, data)
        assert written == len(data), written
        closing = start_in_thread(os.close, fd)
        wait_for(lambda: proxy.holding >= 1, 10, 'the PUT at the proxy')
        time.sleep(0.5)
        assert not closing.done(), 'close() returned before the upload ended'
        assert head(s3, bucket, 'waits.bin') is None
        proxy.release()
        assert closing.result(timeout=HANG_TIMEOUT) is None
        assert object_bytes(s3, bucket, 'waits.bin') == data
    finally:
        proxy.release()


# ------------------------------------------------------------- writeback

def test_writeback_close_returns_fsync_waits(server, s3, bucket, proxy, mount):
    """-o writeback: close() of several files returns while their uploads
    are held (uploads_pending counts them); fsync() of one returns only once
    that one is in the bucket."""
    mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint)
    files = held_files('wb', 4)
    proxy.inject('hold', HOLD_ALL, 'PUT')
    try:
        closes = write_all(mnt, files)
        assert max(closes) < 5, closes
        assert read_stats(mnt.path)['uploads_pending'] == len(files)
        wait_for(lambda: proxy.holding >= 1, 10,
                 'the background uploads to reach the proxy')
        assert all(head(s3, bucket, name) is None for name in files)

        target = 'wb-1.bin'
        syncing = start_in_thread(fsync_path, mnt.path / target)
        time.sleep(1.0)
        assert not syncing.done(), 'fsync() returned while the upload was held'
        assert head(s3, bucket, target) is None
        proxy.release()
        assert syncing.result(timeout=HANG_TIMEOUT) is None
        answer = head(s3, bucket, target)  # right after fsync: no polling
        assert answer is not None and answer['ContentLength'] == len(files[target])
        assert object_bytes(s3, bucket, target) == files[target]
    finally:
        proxy.release()
    wait_stat(mnt, 'uploads_pending', lambda v: v == 0)
    assert_objects(s3, bucket, files)
    stats = read_stats(mnt.path)
    assert stats['uploads_completed'] >= len(files)
    assert stats['upload_failures'] == 0
    assert stats['bytes_written'] == sum(len(d) for d in files.values())


def test_unmount_waits_for_pending_uploads(server, s3, bucket, proxy, mount):
    """-o writeback, uploads held: fusermount3 -u returns, the daemon does
    not exit before the uploads could finish, and everything is in the
    bucket once it has exited (status 0)."""
    mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint)
    files = held_files('um', 8, big=True)
    proxy.inject('hold', HOLD_ALL, 'PUT')
    try:
        write_all(mnt, files)
        assert read_stats(mnt.path)['uploads_pending'] == len(files)
        wait_for(lambda: proxy.holding >= 1, 10, 'uploads at the proxy')
        timer = threading.Timer(RELEASE_AFTER, proxy.release)
        started = time.monotonic()
        timer.start()
        mnt.unmount()   # fusermount3 -u, then waits for the daemon; asserts exit 0
        elapsed = time.monotonic() - started
    finally:
        proxy.release()
    assert elapsed >= RELEASE_AFTER - 0.05, \
        f'the daemon exited {elapsed:.2f}s after unmount, before its uploads could end'
    assert_objects(s3, bucket, files)
    assert bucket_keys(s3, bucket) == sorted(files)


def test_unmount_command_waits_for_the_uploads(server, s3, bucket, proxy,
                                               mount):
    """`s3cachefs --unmount MNT`, uploads held: it returns only once the
    daemon has exited, that is after the uploads, and everything is in the
    bucket by then (a node may be torn down as soon as it returns)."""
    mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint)
    files = held_files('cmd', 4, big=True)
    proxy.inject('hold', HOLD_ALL, 'PUT')
    try:
        write_all(mnt, files)
        wait_for(lambda: proxy.holding >= 1, 10, 'uploads at the proxy')
        timer = threading.Timer(RELEASE_AFTER, proxy.release)
        started = time.monotonic()
        timer.start()
        done = subprocess.run([BINARY, '--unmount', str(mnt.path)],
                              capture_output=True, text=True,
                              timeout=HANG_TIMEOUT)
        elapsed = time.monotonic() - started
    finally:
        proxy.release()
    assert done.returncode == 0, done.stderr
    assert elapsed >= RELEASE_AFTER - 0.05, \
        f'--unmount returned {elapsed:.2f}s in, before the uploads could end'
    # the daemon is gone, the mount too, and every file is in the bucket
    assert mnt.process.poll() == 0, mnt.log()[-2000:]
    assert not is_fuse_mount(mnt.path)
    mnt.process = None
    assert_objects(s3, bucket, files)


def test_unmount_command_says_what_was_left(server, s3, bucket, proxy, mount):
    """`s3cachefs --unmount MNT` exits 1 with a sentence when the daemon
    could not upload everything (every PUT refused until it gave up), as
    the daemon's own exit status does, which only its parent can read.
    (Before: it exited 0, and `s3cachefs --unmount /data && poweroff`
    powered off with files left.) A daemon killed while it drains leaves
    no report: that is status 1 too."""
    mnt = mount(bucket, options=['writeback', 'request_timeout=2'],
                endpoint=proxy.endpoint)
    proxy.inject('denied', HOLD_ALL, 'PUT')
    write_file(mnt.path / 'refused', payload('refused', 10 * KiB))
    done = subprocess.run([BINARY, '--unmount', str(mnt.path)],
                          capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert done.returncode == 1, done.stderr
    assert '1 file of' in done.stderr and 'could not be uploaded' in \
        done.stderr, done.stderr
    assert mnt.process.wait(timeout=HANG_TIMEOUT) == 1
    mnt.process = None
    proxy.clear_faults()

    again = mount(bucket, options=['writeback'], endpoint=proxy.endpoint,
                  cache=mnt.cache_dir, name='again')
    wait_for(lambda: head(s3, bucket, 'refused') is not None, HANG_TIMEOUT,
             'the upload by the next mount')
    proxy.inject('hold', HOLD_ALL, 'PUT')
    write_file(again.path / 'held', payload('held', 10 * KiB))
    wait_for(lambda: proxy.holding >= 1, 10, 'the upload at the proxy')
    unmounting = subprocess.Popen([BINARY, '--unmount', str(again.path)],
                                  stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: not is_fuse_mount(again.path), 10, 'the unmount')
        again.process.kill()
        _, stderr = unmounting.communicate(timeout=HANG_TIMEOUT)
    finally:
        proxy.drop_held()   # the held PUT is reset, never forwarded
        if unmounting.poll() is None:
            unmounting.kill()
    again.process.wait(timeout=HANG_TIMEOUT)
    again.process = None
    assert unmounting.returncode == 1
    assert 'ended without saying' in stderr, stderr

    clean = mount(bucket, endpoint=proxy.endpoint, cache=mnt.cache_dir,
                  name='clean')
    wait_for(lambda: head(s3, bucket, 'held') is not None, HANG_TIMEOUT,
             'the upload by the third mount')
    done = subprocess.run([BINARY, '--unmount', str(clean.path)],
                          capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert done.returncode == 0, done.stderr
    clean.process.wait(timeout=HANG_TIMEOUT)
    clean.process = None


def test_unmount_command_refuses_other_mounts(tmp_path):
    """--unmount only unmounts s3cachefs mounts: anything else is left
    alone, with a sentence and status 1."""
    done = subprocess.run([BINARY, '--unmount', str(tmp_path)],
                          capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert done.returncode == 1
    assert 'not an s3cachefs mount' in done.stderr
    done = subprocess.run([BINARY, '--unmount'], capture_output=True,
                          text=True, timeout=HANG_TIMEOUT)
    assert done.returncode == 1 and 'usage' in done.stderr


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT],
                         ids=['SIGTERM', 'SIGINT'])
def test_signal_waits_for_pending_uploads(server, s3, bucket, proxy, mount, signum):
    """-o writeback, uploads held: SIGTERM/SIGINT makes the daemon unmount,
    finish every upload, and exit 0."""
    mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint)
    files = held_files('sig', 5)
    proxy.inject('hold', HOLD_ALL, 'PUT')
    try:
        write_all(mnt, files)
        assert read_stats(mnt.path)['uploads_pending'] == len(files)
        wait_for(lambda: proxy.holding >= 1, 10, 'uploads at the proxy')
        timer = threading.Timer(RELEASE_AFTER, proxy.release)
        started = time.monotonic()
        timer.start()
        mnt.kill(signum)
        code = wait_stopped(mnt)
        elapsed = time.monotonic() - started
    finally:
        proxy.release()
    assert code == 0, f'exit status {code}'
    assert elapsed >= RELEASE_AFTER - 0.05, \
        f'the daemon exited {elapsed:.2f}s after the signal, before its uploads could end'
    assert_objects(s3, bucket, files)


def test_kill_9_then_remount_uploads_everything(server, s3, bucket, proxy, mount,
                                                tmp_path):
    """-o writeback, files closed but their PUTs held (never released):
    kill -9. A new mount on the same cache directory, straight to the
    server, uploads every file intact (a multipart one too)."""
    cache = tmp_path / 'cache'
    mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint, cache=cache)
    files = held_files('k9', 6, big=True)
    proxy.inject('hold', HOLD_ALL, 'PUT')
    try:
        write_all(mnt, files)
        assert read_stats(mnt.path)['uploads_pending'] == len(files)
        wait_for(lambda: proxy.holding >= 1, 10, 'uploads at the proxy')
        kill_9(mnt)
    finally:
        proxy.drop_held()
    # The held requests are never forwarded: the proxy reset them. Nothing
    # reached the bucket.
    assert bucket_keys(s3, bucket) == []

    again = mount(bucket, options=['writeback'], endpoint=proxy.endpoint,
                  cache=cache, name='again')
    wait_stat(again, 'uploads_pending', lambda v: v == 0, timeout=60)
    assert_objects(s3, bucket, files)
    assert bucket_keys(s3, bucket) == sorted(files)
    assert_multipart(server, s3, bucket, 'k9-big.bin', read_stats(again.path))
    for name, data in files.items():
        assert sha((again.path / name).read_bytes()) == sha(data), name
    assert read_stats(again.path)['upload_failures'] == 0


# --------------------------------------------------------------- failures

def test_permanent_failure_keeps_the_data(server, s3, bucket, proxy, mount):
    """403 AccessDenied to every PUT: close() fails with EACCES (or EIO),
    upload_failures counts it, the log names the key, nothing partial is in
    the bucket, the data stays readable; once PUTs are allowed again,
    fsync() on a new descriptor uploads it intact."""
    mnt = mount(bucket, endpoint=proxy.endpoint)
    name = 'denied-file.bin'
    data = payload('denied', 700 * KiB + 9)
    proxy.inject('denied', HOLD_ALL, 'PUT')

    def write_then_close():
        fd = os.open(mnt.path / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            assert os.write(fd, data) == len(data)
        except BaseException:
            os.close(fd)
            raise
        try:
            os.close(fd)
        except OSError as error:
            return error
        return None
    outcome, _ = run_within(60, write_then_close)
    assert isinstance(outcome, OSError), \
        f'close() gave {outcome!r} although every PUT was refused'
    assert outcome.errno in (errno.EACCES, errno.EIO), outcome
    assert proxy.faults_injected['denied'] >= 1
    assert head(s3, bucket, name) is None
    assert bucket_keys(s3, bucket) == []
    stats = read_stats(mnt.path)
    assert stats['upload_failures'] >= 1, stats
    assert stats['uploads_pending'] >= 1, stats
    assert name in mnt.log(), 'the log does not name the key that failed'
    assert sha((mnt.path / name).read_bytes()) == sha(data)

    proxy.clear_faults()
    outcome, _ = run_within(60, fsync_path, mnt.path / name)
    assert outcome is None, f'fsync() after the fault: {outcome!r}\n{mnt.log()[-2000:]}'
    assert object_bytes(s3, bucket, name) == data
    wait_stat(mnt, 'uploads_pending', lambda v: v == 0)
    assert bucket_keys(s3, bucket) == [name]


@pytest.mark.parametrize('mode', ['default', 'writeback'])
def test_full_cache_disk_gives_enospc(server, s3, bucket, mount, tmp_path, mode):
    """The cache directory on a 48 MiB tmpfs: files closed first reach the
    bucket intact; a 64 MiB file cannot fit and its writer gets ENOSPC
    (from write or close); the daemon keeps serving reads and writes."""
    options = ['writeback'] if mode == 'writeback' else []
    with small_tmpfs(tmp_path / 'small-cache') as cache:
        mnt = mount(bucket, options=options, cache=cache / 'c', name='full')
        try:
            first = {f'first-{i}.bin': payload(f'first{i}', 4 * MiB + i)
                     for i in range(3)}
            write_all(mnt, first)

            def write_huge():
                chunk = payload('huge', 4 * MiB)
                fd = os.open(mnt.path / 'huge.bin',
                             os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                failure = None
                try:
                    for _ in range(16):
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(fd, view):]
                except OSError as error:
                    failure = ('write', error)
                finally:
                    try:
                        os.close(fd)
                    except OSError as error:
                        failure = failure or ('close', error)
                return failure
            failure, _ = run_within(120, write_huge)
            assert failure is not None, '64 MiB fitted into a 48 MiB cache disk'
            assert not isinstance(failure, Exception), failure
            stage, error = failure
            assert error.errno == errno.ENOSPC, f'{stage}: {error!r}'
            assert mnt.process.poll() is None, 'the daemon died'

            os.unlink(mnt.path / 'huge.bin')
            for name, data in first.items():
                assert sha((mnt.path / name).read_bytes()) == sha(data), name
            after = {'after.bin': payload('after', 2 * MiB + 1)}
            write_all(mnt, after)
            fsync_path(mnt.path / 'after.bin')
            wait_stat(mnt, 'uploads_pending', lambda v: v == 0)
            assert_objects(s3, bucket, {**first, **after})
            assert bucket_keys(s3, bucket) == sorted([*first, *after])
        finally:
            mnt.unmount()


def test_unlink_while_uploading_removes_the_object(server, s3, bucket, proxy,
                                                   mount):
    """-o writeback: a file removed while its upload is held at the proxy
    does not come back once the upload is let through."""
    mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint)
    proxy.inject('hold', HOLD_ALL, 'PUT')
    try:
        write_file(mnt.path / 'gone.bin', payload('gone', 200 * KiB))
        wait_for(lambda: proxy.holding >= 1, 10, 'the upload at the proxy')
        removing = start_in_thread(os.unlink, mnt.path / 'gone.bin')
        time.sleep(0.3)
        proxy.release()
        assert removing.result(timeout=HANG_TIMEOUT) is None
    finally:
        proxy.release()
    wait_stat(mnt, 'uploads_pending', lambda v: v == 0)
    assert head(s3, bucket, 'gone.bin') is None
    assert not (mnt.path / 'gone.bin').exists()


def assert_no_second(proxy, match, seconds=2):
    """For SECONDS, the proxy has seen one request MATCH (the one held)
    and no other: nothing that should wait for it began."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen = proxy.records(lambda r: match(r.method, r.path, r.query))
        assert len(seen) == 1, seen
        time.sleep(0.05)


@pytest.mark.parametrize('mode', ['default', 'writeback'])
def test_rename_of_a_file_being_written_keeps_its_saved_version(
        server, s3, bucket, mount, tmp_path, mode):
    """A file in the bucket, open and appended to (not closed), renamed
    (logrotate's `mv app.log app.log.1`), then kill -9: the new name holds
    the last saved version, the one the bucket had (found by a review: the
    rename deleted it, and the new bytes were saved nowhere yet)."""
    saved = payload('saved-log', 300 * KiB + 5)
    s3.put_object(Bucket=bucket, Key='app.log', Body=saved)
    cache = tmp_path / 'cache'
    options = ['writeback'] if mode == 'writeback' else []
    mnt = mount(bucket, options=options, cache=cache)
    fd = os.open(mnt.path / 'app.log', os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b'a line not closed yet\n')
        os.rename(mnt.path / 'app.log', mnt.path / 'app.log.1')
        assert head(s3, bucket, 'app.log') is None
        kill_9(mnt)
    finally:
        try:
            os.close(fd)
        except OSError as error:  # the daemon is gone
            assert error.errno == errno.ENOTCONN
    assert object_bytes(s3, bucket, 'app.log.1') == saved
    again = mount(bucket, options=options, cache=cache, name='again')
    wait_stat(again, 'uploads_pending', lambda v: v == 0)
    assert (again.path / 'app.log.1').read_bytes() == saved
    assert not (again.path / 'app.log').exists()


def test_directory_rename_lets_no_old_object_over_a_new_upload(
        server, s3, bucket, proxy, mount):
    """-o writeback: d/f rewritten and closed (its upload queued), then
    `mv d e`. The move copies the old d/f object to e/f; the new data's
    upload to e/f waits for the move, so the old object never lands over
    it (found by a review: with the copy delayed, it did)."""
    s3.put_object(Bucket=bucket, Key='d/f', Body=b'old bytes')
    s3.put_object(Bucket=bucket, Key='d/g', Body=b'g')
    mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint)
    new = payload('renamed-dir-file', 100 * KiB)
    write_file(mnt.path / 'd' / 'f', new)

    def put_of_e_f(method, path, query):
        return method == 'PUT' and path.endswith('/e/f')
    proxy.inject('hold', 1, put_of_e_f)  # the first: the move's copy
    try:
        moving = start_in_thread(os.rename, mnt.path / 'd', mnt.path / 'e')
        wait_for(lambda: proxy.holding == 1, 10, 'the copy of d/f held')
        # an upload of the new data landing now would be overwritten by
        # the copy: none may begin while the move is under way
        assert_no_second(proxy, put_of_e_f)
    finally:
        proxy.release()
    assert moving.result(timeout=HANG_TIMEOUT) is None
    wait_stat(mnt, 'uploads_pending', lambda v: v == 0)
    assert object_bytes(s3, bucket, 'e/f') == new
    assert head(s3, bucket, 'd/f') is None
    assert (mnt.path / 'e' / 'f').read_bytes() == new


def test_rename_of_a_file_being_written_lets_no_old_object_over_its_upload(
        server, s3, bucket, proxy, mount):
    """A file open on two descriptors and written, renamed: the rename
    moves the old object to the new name, and a close of the other
    descriptor (which uploads the file) waits for that, so the old bytes
    never land over the new ones (found by a review of the fix above)."""
    old = payload('old-log', 200 * KiB)
    s3.put_object(Bucket=bucket, Key='app.log', Body=old)
    mnt = mount(bucket, endpoint=proxy.endpoint)
    first = os.open(mnt.path / 'app.log', os.O_WRONLY | os.O_APPEND)
    second = os.open(mnt.path / 'app.log', os.O_WRONLY | os.O_APPEND)
    closing = None
    try:
        os.write(first, b'a new line\n')

        def put_of_new_name(method, path, query):
            return method == 'PUT' and path.endswith('/app.log.1')
        proxy.inject('hold', 1, put_of_new_name)  # the first: the copy
        try:
            moving = start_in_thread(os.rename, mnt.path / 'app.log',
                                     mnt.path / 'app.log.1')
            wait_for(lambda: proxy.holding == 1, 10, 'the copy held')
            closing = start_in_thread(os.close, second)  # uploads the file
            assert_no_second(proxy, put_of_new_name)
        finally:
            proxy.release()
        assert moving.result(timeout=HANG_TIMEOUT) is None
        assert closing.result(timeout=HANG_TIMEOUT) is None
    finally:
        if closing is None:
            os.close(second)
        else:
            closing.exception(timeout=HANG_TIMEOUT)
        os.close(first)
    assert object_bytes(s3, bucket, 'app.log.1') == old + b'a new line\n'
    assert head(s3, bucket, 'app.log') is None


def test_file_opened_during_a_directory_rename_goes_to_the_new_name(
        server, s3, bucket, proxy, mount):
    """A file opened for writing under a directory while a rename moves
    that directory waits for the move, and is uploaded under the new
    name, not the old one (found by a review: it kept the old key, and
    its upload after the move brought the old directory back)."""
    s3.put_object(Bucket=bucket, Key='d/f', Body=b'saved\n')
    s3.put_object(Bucket=bucket, Key='d/g', Body=b'g')
    mnt = mount(bucket, endpoint=proxy.endpoint)
    assert (mnt.path / 'd' / 'f').read_bytes() == b'saved\n'
    moved = threading.Event()

    def append():
        fd = os.open(mnt.path / 'd' / 'f', os.O_WRONLY | os.O_APPEND)
        try:
            moved.wait(HANG_TIMEOUT)  # written and closed after the move
            os.write(fd, b'appended\n')
        finally:
            os.close(fd)

    def copy_to_e(method, path, query):
        return method == 'PUT' and '/e/' in path
    proxy.inject('hold', 1, copy_to_e)  # the move's first copy
    try:
        moving = start_in_thread(os.rename, mnt.path / 'd', mnt.path / 'e')
        wait_for(lambda: proxy.holding == 1, 10, 'the move held')
        appending = start_in_thread(append)
        # (its open waits for the move; before, it went through at once)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and not appending.done():
            time.sleep(0.05)
    finally:
        proxy.release()
        try:
            assert moving.result(timeout=HANG_TIMEOUT) is None
        finally:
            moved.set()
    assert appending.result(timeout=HANG_TIMEOUT) is None
    assert object_bytes(s3, bucket, 'e/f') == b'saved\nappended\n'
    assert [key for key in bucket_keys(s3, bucket) if key.startswith('d/')] == []
