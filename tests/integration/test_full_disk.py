"""A cache directory, or its journal, on a file system that fills up: the
writer gets ENOSPC and the log says which directory is full, once; the
daemon never dies of it (no SIGBUS, no crash report); `--unmount` ends
as documented and every file closed before the disk filled is in the
bucket.

Two file systems, made and removed by each test: a 1 MiB tmpfs (tmpfs
gives a page on first touch, and has none left when full) and a 4 MiB
ext4 image on a loop device (made with -m 0: no blocks kept for root,
who the tests run as). What is in the bucket is checked with boto3.
"""
import contextlib
import errno
import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import BINARY, is_fuse_mount
from writehelp import (HANG_TIMEOUT, KiB, MiB, bucket_keys, object_bytes,
                       payload, run_within, sha, small_tmpfs, write_file)

FILE_SIZE = 64 * KiB
MAX_FILES = 400          # 25 MiB: far more than either file system holds
CRASH_MARKERS = ('fatal:', 'SIGBUS', 'SIGSEGV', 'AddressSanitizer')
FULL_LINE = re.compile(r'^s3cachefs: \w+: .*?(/\S+) is full\b', re.MULTILINE)


@contextlib.contextmanager
def small_ext4(directory, size='4m'):
    """An ext4 file system of SIZE on a loop device, mounted on DIRECTORY
    for the duration; unmounted (lazily if still busy) and its image
    removed whatever happens. Skips the test without loop devices."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    image = directory.parent / f'{directory.name}.img'
    if not Path('/dev/loop-control').exists():
        pytest.skip('no loop devices here (/dev/loop-control is missing)')
    with open(image, 'wb') as backing:
        backing.truncate(int(size.rstrip('m')) * MiB)
    try:
        subprocess.run(['mkfs.ext4', '-q', '-F', '-m', '0', str(image)],
                       check=True, capture_output=True)
        done = subprocess.run(['mount', '-o', 'loop', str(image),
                               str(directory)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f'cannot mount an ext4 image on a loop device here: '
                        f'{done.stderr.strip()}')
        try:
            yield directory
        finally:
            if subprocess.run(['umount', str(directory)]).returncode != 0:
                subprocess.run(['umount', '-l', str(directory)])
    finally:
        image.unlink()


def small_fs(kind, directory):
    return (small_tmpfs(directory, '1m') if kind == 'tmpfs'
            else small_ext4(directory))


def fill_up(directory):
    """Writes DIRECTORY/filler until its file system is full."""
    with open(Path(directory) / 'filler', 'wb', buffering=0) as filler:
        with contextlib.suppress(OSError):
            while True:
                filler.write(b'\0' * 4096)


def wait_serving(mnt):
    """Returns once the daemon answers (the FUSE mount shows up before the
    daemon has opened its cache and journal)."""
    outcome, _ = run_within(HANG_TIMEOUT, os.stat, mnt.path)
    assert not isinstance(outcome, Exception), \
        f'the mount does not answer: {outcome!r}\n{mnt.log()[-3000:]}'


def write_until_full(mnt):
    """Writes and closes FILE_SIZE files until one fails: (the files
    closed, name -> bytes; the failure: name, stage ('open', 'write' or
    'close': the first call that failed) and OSError)."""
    closed = {}
    for i in range(MAX_FILES):
        name = f'f{i:03d}.bin'
        data = payload(name, FILE_SIZE)
        stage = 'open'
        try:
            fd = os.open(mnt.path / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                         0o644)
        except OSError as error:
            return closed, (name, stage, error)
        failure = None
        try:
            stage = 'write'
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            stage = 'close'
        except OSError as error:
            failure = error
        try:
            os.close(fd)
        except OSError as error:
            failure = failure or error
        if failure is not None:
            return closed, (name, stage, failure)
        closed[name] = data
    return closed, None


def assert_no_crash(log):
    for marker in CRASH_MARKERS:
        assert marker not in log, f'{marker!r} in the daemon log:\n{log[-4000:]}'


def rewrite(path, data, flags=os.O_WRONLY | os.O_TRUNC, chunk=32 * KiB):
    """Writes DATA over the file PATH from byte 0, CHUNK bytes a write,
    stopping at the first write that fails, then closes it: (bytes the
    writes that returned took, the errno of the write that failed or 0,
    the errno of close() or 0)."""
    fd = os.open(path, flags)
    done, write_errno, close_errno = 0, 0, 0
    try:
        while done < len(data):
            done += os.write(fd, data[done:done + chunk])
    except OSError as error:
        write_errno = error.errno
    try:
        os.close(fd)
    except OSError as error:
        close_errno = error.errno
    return done, write_errno, close_errno


def unmount_and_wait(mnt):
    """`s3cachefs --unmount`: (its exit status and stderr, the daemon's
    exit status, the daemon's log)."""
    done = subprocess.run([BINARY, '--unmount', str(mnt.path)],
                          capture_output=True, text=True, timeout=120)
    code = mnt.process.wait(timeout=HANG_TIMEOUT)
    mnt.process = None
    return done.returncode, done.stderr, code, mnt.log()


@pytest.mark.parametrize('min_free', ['default', '0'])
@pytest.mark.parametrize('kind', ['tmpfs', 'ext4'])
def test_writes_until_the_cache_disk_is_full(server, s3, bucket, mount,
                                             tmp_path, kind, min_free):
    """-o writeback, the whole cache directory (index, journal, staging,
    data) on the small file system: 64 KiB files are written and closed
    until one fails. It fails with ENOSPC, some closed before it (before:
    on the 1 MiB tmpfs the first write failed already, each write asking
    for 8 MiB of room), the mount still answers and its daemon lives, the
    log names the full directory once, and every file closed is in the
    bucket byte for byte. The file whose write failed is not uploaded
    short: `--unmount` exits 1 and the log names it (a close that failed
    after whole writes: it goes up whole, exit 0). With cache_min_free=0
    the disk fills up to its last block, so the staging files, the
    journal and the index meet it themselves."""
    options = ['writeback']
    if min_free != 'default':
        options.append(f'cache_min_free={min_free}')
    with small_fs(kind, tmp_path / 'small') as small:
        cache = small / 'cache'
        mnt = mount(bucket, options=options, cache=cache)
        wait_serving(mnt)
        outcome, _ = run_within(120, write_until_full, mnt)
        assert not isinstance(outcome, Exception), outcome
        closed, failure = outcome
        assert failure is not None, \
            f'{MAX_FILES} files of {FILE_SIZE} bytes fitted in a small {kind}'
        name, stage, error = failure
        assert error.errno == errno.ENOSPC, \
            f'{name}: {stage}: {error!r}\n{mnt.log()[-3000:]}'
        assert len(closed) >= 2, \
            f'only {len(closed)} file(s) closed before {stage} of {name} ' \
            f'failed: {error!r}\n{mnt.log()[-3000:]}'
        assert mnt.process.poll() is None, f'the daemon died:\n{mnt.log()[-4000:]}'
        assert set(closed) <= set(os.listdir(mnt.path))
        log = mnt.log()
        assert_no_crash(log)
        full = FULL_LINE.findall(log)   # the directories said to be full
        assert full, f'no log line says a directory is full:\n{log[-3000:]}'
        assert all(path.startswith(str(cache)) for path in full), full
        assert len(full) == len(set(full)), f'said more than once: {full}'

        status, stderr, code, log = unmount_and_wait(mnt)
        assert_no_crash(log)
        keys = bucket_keys(s3, bucket)
        for key, data in closed.items():
            assert key in keys, f'{key} (closed) is not in the bucket'
            assert sha(object_bytes(s3, bucket, key)) == sha(data), key
        if stage == 'write':
            assert name not in keys, \
                f'{name}, whose write failed, is in the bucket ' \
                f'({len(object_bytes(s3, bucket, name))} bytes)'
            assert status == 1 and code == 1, \
                f'--unmount {status} ({stderr}), daemon {code}:\n{log[-4000:]}'
            assert f"'{name}' is not uploaded: a write to it failed" in log, \
                log[-3000:]
        else:
            assert status == 0 and code == 0, \
                f'--unmount {status} ({stderr}), daemon {code}:\n{log[-4000:]}'
            assert name not in keys or \
                sha(object_bytes(s3, bucket, name)) == sha(payload(name, FILE_SIZE)), \
                f'{name}, whose {stage} failed, is in the bucket short'


@pytest.mark.parametrize('kind', ['tmpfs', 'ext4'])
def test_a_journal_on_a_full_disk_at_mount(server, s3, bucket, mount,
                                           tmp_path, kind):
    """The journal directory (CACHE/journal) on a file system full before
    the mount: the daemon does not start, and says why in one sentence
    naming the directory, instead of dying of SIGBUS in mdb_env_open
    (LMDB extends its lock file with a hole and writes it through a
    mapping). With room again the next mount journals and uploads."""
    cache = tmp_path / 'cache'
    with small_fs(kind, cache / 'journal') as journal:
        fill_up(journal)
        mnt = mount(bucket, options=['writeback'], cache=cache, start=False)
        mnt.path.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run(mnt.argv(), env=mnt.env, capture_output=True,
                                  text=True, timeout=HANG_TIMEOUT)
        finally:
            if is_fuse_mount(mnt.path):
                subprocess.run(['fusermount3', '-uz', str(mnt.path)])
        output = done.stdout + done.stderr
        assert_no_crash(output)
        assert done.returncode == 1, f'exit {done.returncode}:\n{output}'
        assert re.search(rf'cannot start: .*{re.escape(str(journal))}.*is full',
                         output), output
        (journal / 'filler').unlink()
        again = mount(bucket, options=['writeback'], cache=cache, name='again')
        data = payload('after', 100 * KiB)
        write_file(again.path / 'after.bin', data)
        done = subprocess.run([BINARY, '--unmount', str(again.path)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr + again.log()[-3000:]
        again.process.wait(timeout=HANG_TIMEOUT)
        again.process = None
        assert_no_crash(again.log())
        assert object_bytes(s3, bucket, 'after.bin') == data


@pytest.mark.parametrize('room', ['none', 'some', 'again'])
@pytest.mark.parametrize('kind', ['tmpfs', 'ext4'])
def test_a_rewrite_that_fails_never_replaces_the_object(server, s3, bucket,
                                                        mount, tmp_path,
                                                        kind, room):
    """-o writeback, cache_min_free=0: ckpt.bin is in the bucket with OLD
    bytes; the cache disk is filled (room 'none': to its last block;
    'some': all but the size of the new bytes, part of which the index
    and journal take), then ckpt.bin is rewritten (O_TRUNC) with NEW
    bytes: a write or the close fails with ENOSPC. `--unmount` then
    leaves the bucket with OLD (exit status 1, the log naming the file
    and the write that failed) or exactly NEW (exit status 0), never
    anything else. Room 'again': the filler is removed after the failure
    and the file written again over the same descriptor's bytes (reopened
    without O_TRUNC): closed without error, it goes up as NEW exactly.
    Before: the bucket got the part written (0 or 96 KiB of 128 KiB)
    with exit status 0 when the close had returned 0."""
    old = payload('old', 128 * KiB)
    new = payload('new', 128 * KiB)
    s3.put_object(Bucket=bucket, Key='ckpt.bin', Body=old)
    with small_fs(kind, tmp_path / 'small') as small:
        cache = small / 'cache'
        mnt = mount(bucket, options=['writeback', 'cache_min_free=0'],
                    cache=cache)
        wait_serving(mnt)
        assert os.stat(mnt.path / 'ckpt.bin').st_size == len(old)
        fill_up(small)
        filler = small / 'filler'
        if room != 'none':
            os.truncate(filler, max(0, filler.stat().st_size - len(new)))
        outcome, _ = run_within(HANG_TIMEOUT, rewrite, mnt.path / 'ckpt.bin', new)
        assert not isinstance(outcome, Exception), outcome
        written, write_errno, close_errno = outcome
        assert errno.ENOSPC in (write_errno, close_errno), \
            f'wrote {written} bytes, write errno {write_errno}, close errno ' \
            f'{close_errno} on a full {kind}\n{mnt.log()[-3000:]}'
        assert write_errno in (0, errno.ENOSPC), outcome
        assert mnt.process.poll() is None, f'the daemon died:\n{mnt.log()[-4000:]}'
        if room == 'again':
            filler.unlink()
            outcome, _ = run_within(HANG_TIMEOUT, rewrite, mnt.path / 'ckpt.bin',
                                    new, os.O_WRONLY)
            assert outcome == (len(new), 0, 0), \
                f'{outcome!r} with room again\n{mnt.log()[-3000:]}'

        status, stderr, code, log = unmount_and_wait(mnt)
        assert_no_crash(log)
        landed = object_bytes(s3, bucket, 'ckpt.bin')
        assert sha(landed) in (sha(old), sha(new)), \
            f'the bucket has {len(landed)} bytes of ckpt.bin, neither the ' \
            f'old ({len(old)}) nor the new ({len(new)}) after {outcome!r}; ' \
            f'--unmount exit {status}, daemon exit {code}\n{log[-3000:]}'
        if room == 'again':
            assert landed == new, 'the whole rewrite did not go up'
        if landed == new:
            assert status == 0 and code == 0, \
                f'--unmount {status} ({stderr}), daemon {code}\n{log[-3000:]}'
        else:
            assert status == 1 and code == 1, \
                f'--unmount {status} ({stderr}), daemon {code}: the bucket ' \
                f'kept the old bytes\n{log[-3000:]}'
            assert re.search(r"'ckpt\.bin' is not uploaded: a write to it "
                             r"failed \(No space left on device\)", log), \
                log[-3000:]
