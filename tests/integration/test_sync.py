"""`s3cachefs sync MNT` and `s3cachefs pending MNT [--drop PATH]` against
a real mount (writeback mode: close() journals and returns, the uploads go
in the background).

The proxy of tests/harness/s3proxy.py holds PUTs (single PUTs and the
parts of multipart uploads) until the test releases them, so "not in the
bucket yet" is a fact while `sync` waits; or it answers them 403
AccessDenied. What is in the bucket is checked with boto3, straight to
the server, as soon as the command returns: no polling.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import BINARY, daemon_env, read_stats, wait_for
from writehelp import (HANG_TIMEOUT, HOLD_ALL, KiB, MULTIPART_SIZE,
                       assert_multipart, assert_objects, bucket_keys, head,
                       object_bytes, payload, proxy, write_file)

__all__ = ['proxy']   # the fixture, imported for pytest

HELD_FOR = 1.0        # seconds a sync must still be waiting while held


def command(*args, stdin=subprocess.DEVNULL, timeout=HANG_TIMEOUT):
    """`s3cachefs ARGS...`: the finished process (text output)."""
    return subprocess.run([BINARY, *map(str, args)], capture_output=True,
                          text=True, stdin=stdin, timeout=timeout)


def start_command(*args):
    return subprocess.Popen([BINARY, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)


def pending_json(mnt):
    done = command('pending', '--json', mnt.path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def write_files(mnt, files):
    for name, data in files.items():
        (mnt.path / name).parent.mkdir(parents=True, exist_ok=True)
        write_file(mnt.path / name, data)


def test_sync_waits_for_held_uploads(server, s3, bucket, proxy, mount):
    """Files closed in writeback mode (one multipart) while every PUT is
    held: `s3cachefs sync` does not return while they are held (nothing
    is in the bucket), returns 0 once they are released with every object
    in the bucket byte for byte, and names each file with the summary.
    Afterwards `pending` lists nothing."""
    mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint)
    files = {f'small-{i}.bin': payload(f'sync{i}', 100 * KiB * i + 7)
             for i in range(1, 4)}
    files['dir/big.bin'] = payload('syncbig', MULTIPART_SIZE)
    (mnt.path / 'dir').mkdir()   # (its marker is a PUT: before the hold)
    proxy.inject('hold', HOLD_ALL, 'PUT')
    syncing = None
    try:
        write_files(mnt, files)
        syncing = start_command('sync', mnt.path)
        wait_for(lambda: proxy.holding >= 1, 10, 'uploads at the proxy')
        time.sleep(HELD_FOR)
        assert syncing.poll() is None, 'sync returned while uploads were held'
        assert all(head(s3, bucket, name) is None for name in files)
        proxy.release()
        out, err = syncing.communicate(timeout=HANG_TIMEOUT)
    finally:
        proxy.release()
        if syncing is not None and syncing.poll() is None:
            syncing.kill()
    assert syncing.returncode == 0, err
    assert_objects(s3, bucket, files)   # right away: sync said so
    assert_multipart(server, s3, bucket, 'dir/big.bin', read_stats(mnt.path))
    for name in files:
        assert f'  {name}' in out, out
    size = sum(len(data) for data in files.values())
    assert f'synced {len(files)} files' in out and f'({size} bytes)' in out, out
    report = pending_json(mnt)
    assert report['count'] == 0 and report['files'] == [], report
    assert read_stats(mnt.path)['uploads_pending'] == 0


def test_sync_timeout_and_signal(server, s3, bucket, proxy, mount):
    """While the uploads are held, `sync --timeout 1` returns after about
    a second with status 1, naming what is not in the bucket yet; a sync
    sent SIGTERM does the same at once (the daemon answers the FUSE
    interrupt). The uploads go on: released, they land."""
    mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint)
    files = {f'held-{i}.bin': payload(f'held{i}', 50 * KiB + i) for i in range(3)}
    proxy.inject('hold', HOLD_ALL, 'PUT')
    try:
        write_files(mnt, files)
        started = time.monotonic()
        done = command('sync', '--timeout', '1', mnt.path)
        elapsed = time.monotonic() - started
        assert done.returncode == 1, done.stderr
        assert 0.9 <= elapsed < 10, elapsed
        assert 'timed out after 1 s' in done.stdout, done.stdout
        for name in files:
            assert name in done.stdout and 'not in the bucket yet' in done.stdout

        syncing = start_command('sync', '--json', mnt.path)
        wait_for(lambda: proxy.holding >= 1, 10, 'uploads at the proxy')
        time.sleep(0.5)
        syncing.send_signal(signal.SIGTERM)
        out, err = syncing.communicate(timeout=10)
        assert syncing.returncode == 1, err
        report = json.loads(out)
        assert report['stopped'] == 'stopped by SIGTERM', report
        assert report['waiting'] == len(files), report
        assert {f['path'] for f in report['files']} == set(files)
        assert all(f['state'] == 'waiting' for f in report['files'])
    finally:
        proxy.release()
    done = command('sync', mnt.path)
    assert done.returncode == 0, done.stderr
    assert_objects(s3, bucket, files)


# Holds files open for writing in a process of its own: a descriptor the
# test process held would be closed in every child it starts (close on
# exec), and each such close is a FLUSH, that is a close() to the mount.
WRITER = """
import os, sys
ckpt = os.open(sys.argv[1], os.O_WRONLY)
fresh = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT, 0o644)
data = sys.stdin.buffer.read(int(sys.argv[3]))
os.pwrite(ckpt, data, 0)
os.write(fresh, b'not closed yet\\n')
print('ready', flush=True)
sys.stdin.readline()
os.close(ckpt)
os.close(fresh)
"""


def test_sync_of_a_file_open_for_writing(server, s3, bucket, mount):
    """A file closed once and opened again for writing: sync uploads what
    its close promised, not the bytes written since; a file never closed
    is named "not closed" and not waited for. Closing them uploads the
    rest."""
    mnt = mount(bucket, options=['writeback'])
    v1, v2 = payload('open1', 200 * KiB), payload('open2', 300 * KiB)
    write_file(mnt.path / 'ckpt.bin', v1)
    writer = subprocess.Popen(
        [sys.executable, '-c', WRITER, str(mnt.path / 'ckpt.bin'),
         str(mnt.path / 'fresh.log'), str(len(v2))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        writer.stdin.write(v2)
        writer.stdin.flush()
        assert writer.stdout.readline() == b'ready\n'
        done = command('sync', '--json', mnt.path)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        states = {f['path']: (f['state'], f['size']) for f in report['files']}
        # (uploaded before the reopen, if its settle ended first: then it
        # is the bytes not closed that the sync names)
        assert states['ckpt.bin'] in (('uploaded', len(v1)),
                                      ('not-closed', len(v2))), report
        assert states['fresh.log'] == ('not-closed', 15), report
        assert object_bytes(s3, bucket, 'ckpt.bin') == v1
        assert head(s3, bucket, 'fresh.log') is None
        writer.stdin.write(b'\n')
        writer.stdin.close()
        assert writer.wait(timeout=HANG_TIMEOUT) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    done = command('sync', mnt.path)
    assert done.returncode == 0, done.stderr
    assert object_bytes(s3, bucket, 'ckpt.bin') == v2
    assert object_bytes(s3, bucket, 'fresh.log') == b'not closed yet\n'


def test_pending_lists_directory_markers(server, s3, bucket, proxy, mount):
    """-o writeback: the markers of two new directories, their PUTs held
    at the proxy, are listed by `pending` as directory markers (no size,
    no staging file), apart from the files; `--drop` of one is refused
    (no data to drop); released and synced, the list is empty and the
    bucket has both markers. (Before: not listed, though the stats
    counted them in uploads_pending.)"""
    mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint)
    proxy.inject('hold', HOLD_ALL, 'PUT')
    try:
        os.mkdir(mnt.path / 'd1')
        os.mkdir(mnt.path / 'd2')
        wait_for(lambda: proxy.holding >= 1, 10, 'a marker at the proxy')
        done = command('pending', mnt.path)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        for name in ('d1/', 'd2/'):
            line = next(line for line in lines if f'  {name}' in line)
            assert '(directory marker)' in line, done.stdout
        assert '2 directory markers waiting to be sent' in done.stdout, \
            done.stdout
        report = pending_json(mnt)
        assert report['count'] == 0 and report['markers'] == 2, report
        assert sorted(f['path'] for f in report['files']) == ['d1/', 'd2/']
        assert all(f['kind'] == 'directory' and f['staging_id'] is None and
                   f['size'] == 0 for f in report['files']), report
        done = command('pending', mnt.path, '--drop', 'd1/', '--yes')
        assert done.returncode == 1 and 'no data to drop' in done.stderr, \
            done.stderr
    finally:
        proxy.release()
    done = command('sync', mnt.path)
    assert done.returncode == 0, done.stderr
    assert pending_json(mnt)['markers'] == 0
    assert bucket_keys(s3, bucket) == ['d1/', 'd2/']


def test_refused_upload_reported_then_dropped(server, s3, bucket, proxy, mount):
    """Every PUT refused (403) with a short request_timeout: `sync` exits
    1 naming the file and "Permission denied"; `pending` lists it failed
    with that error and its retries; `pending --drop` refuses without
    --yes off a terminal, then drops it: the daemon logs path, size and
    staging id, the file leaves the mount, nothing is left pending, the
    unmount has nothing left to upload, and the next mount on the same
    cache does not upload it."""
    mnt = mount(bucket, options=['writeback', 'request_timeout=2'],
                endpoint=proxy.endpoint)
    proxy.inject('denied', HOLD_ALL, 'PUT')
    data = payload('refused', 12 * KiB + 5)
    write_file(mnt.path / 'refused.bin', data)
    write_file(mnt.path / 'kept.txt', b'kept')   # refused too, uploaded later

    done = command('sync', mnt.path)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert 'refused.bin' in done.stderr and 'Permission denied' in done.stderr
    assert 'stays journaled' in done.stderr, done.stderr
    assert '2 failed' in done.stdout, done.stdout

    done = command('pending', mnt.path)
    assert done.returncode == 0, done.stderr
    assert 'failed' in done.stdout and 'refused.bin' in done.stdout
    assert 'last error: Permission denied' in done.stdout, done.stdout
    report = pending_json(mnt)
    entry = next(f for f in report['files'] if f['path'] == 'refused.bin')
    assert entry['state'] in ('failed', 'uploading'), entry
    assert entry['size'] == len(data) and entry['promised_size'] == len(data)
    assert entry['retries'] >= 1 and entry['open_for_writing'] is False
    assert entry['age_seconds'] is not None and entry['age_seconds'] >= 0
    if entry['state'] == 'failed':
        assert entry['last_error'] == 'Permission denied' and entry['errno'] == 13
    staging_id = entry['staging_id']

    done = command('pending', mnt.path, '--drop', 'refused.bin')
    assert done.returncode == 2 and '--yes' in done.stderr, done.stderr
    assert (mnt.path / 'refused.bin').exists()

    def drop():
        done = command('pending', mnt.path, '--drop',
                       mnt.path / 'refused.bin', '--yes')
        # (EBUSY while a retry is under way: again, as its message says)
        return done if 'being uploaded right now' not in done.stderr else None
    done = wait_for(drop, 20, 'the drop')
    assert done.returncode == 0, done.stderr
    assert 'dropped refused.bin' in done.stdout, done.stdout
    log = mnt.log()
    assert "gave up 'refused.bin'" in log and f'({len(data)} bytes, staging ' \
        f'file {staging_id})' in log, log[-2000:]
    wait_for(lambda: not (mnt.path / 'refused.bin').exists(), 10,
             'the dropped file to leave the mount')
    assert 'refused.bin' not in os.listdir(mnt.path)
    report = pending_json(mnt)
    assert [f['path'] for f in report['files']] == ['kept.txt'], report
    done = command('pending', mnt.path, '--drop', 'refused.bin', '--yes')
    assert done.returncode == 1 and 'nothing pending' in done.stderr

    proxy.clear_faults()
    done = command('sync', mnt.path)
    assert done.returncode == 0, done.stderr
    mnt.unmount()   # asserts exit 0: nothing left to upload
    again = mount(bucket, options=['writeback'], cache=mnt.cache_dir,
                  name='again')
    assert read_stats(again.path)['uploads_pending'] == 0
    done = command('sync', again.path)
    assert done.returncode == 0 and 'synced 0 files' in done.stdout, done.stdout
    assert bucket_keys(s3, bucket) == ['kept.txt']
    assert not (again.path / 'refused.bin').exists()


def test_usage_errors_and_a_bucket_named_sync(server, s3, mount, home,
                                              tmp_path):
    """--help (0), bad usage (2), not an s3cachefs mount (1); a bucket
    named "sync" still mounts the way mount.fuse3 runs it (`s3cachefs sync
    MNT -o ...`), after which `s3cachefs sync MNT` is the command; when
    such a mount fails, a line says what it was taken for."""
    for name in ('sync', 'pending'):
        done = command(name, '--help')
        assert done.returncode == 0 and f'usage: s3cachefs {name}' in done.stdout
    for args in (['sync'], ['sync', '--json'], ['sync', '--timeout', 'x', tmp_path],
                 ['pending', tmp_path, '--drop'], ['pending', '--yes', tmp_path],
                 ['sync', '--drop', 'x', tmp_path]):
        done = command(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert 'usage: s3cachefs' in done.stderr, done.stderr
    done = command('sync', '--json', tmp_path)
    assert done.returncode == 1
    assert 'is not an s3cachefs mount' in done.stderr, done.stderr
    done = command('pending', '--json', '/proc')
    assert done.returncode == 1 and 'a proc mount' in done.stderr, done.stderr

    if 'sync' not in [b['Name'] for b in s3.list_buckets()['Buckets']]:
        server.create_bucket('sync')
    mnt = mount('sync', start=False, name='bucket-sync')
    mnt.argv = lambda: [BINARY, 'sync', str(mnt.path), '-f', '-o',
                        ','.join(mnt.options)]
    mnt.start()
    assert 'this was the mount' not in mnt.log(), mnt.log()
    write_file(mnt.path / 'in-sync.txt', b'hello')
    done = command('sync', mnt.path)
    assert done.returncode == 0 and 'synced 0 files' in done.stdout, done.stdout
    assert head(s3, 'sync', 'in-sync.txt') is not None
    done = command('pending', mnt.path)
    assert done.returncode == 0 and 'nothing pending' in done.stdout
    s3.delete_object(Bucket='sync', Key='in-sync.txt')

    # not a mount point: the mount of the bucket "sync" (refused here)
    target = tmp_path / 'not-mounted'
    target.mkdir()
    done = subprocess.run(
        [BINARY, 'sync', str(target), '-o',
         f'endpoint=http://127.0.0.1:9,retries=0,'
         f'cache={tmp_path / "cache-refused"}'],
        capture_output=True, text=True, timeout=HANG_TIMEOUT,
        env=daemon_env(server, home), stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stderr
    assert ("(this was the mount of a bucket named 'sync': "
            f"{target} is not an s3cachefs mount") in done.stderr, done.stderr
