"""Helpers shared by the write-path tests (test_durability.py,
test_interop.py, test_hf.py): files written with plain os calls (so every
errno of write and close is seen), objects read back with boto3 (the
independent client), counters waited for instead of slept on, the daemon
stopped by a signal or killed, a small tmpfs, and s3fs mounts.
"""
import concurrent.futures
import contextlib
import hashlib
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import botocore.exceptions
import pytest

import s3proxy
from conftest import check_sanitizer_log, is_fuse_mount, read_stats, wait_for

KiB = 1 << 10
MiB = 1 << 20
MULTIPART_SIZE = 17 * MiB + 4321   # above the 16 MiB single-PUT limit
HANG_TIMEOUT = 30.0                # a call taking longer is a hang
HOLD_ALL = 10 ** 6                 # "every matching request" for inject()


def sha(data):
    return hashlib.sha256(data).hexdigest()


def payload(seed, size):
    """SIZE deterministic pseudo-random bytes."""
    return random.Random(seed).randbytes(size)


@pytest.fixture
def proxy(server):
    """A counting, fault-injecting proxy in front of the session's server;
    held requests are released at the end only if the test says so."""
    with s3proxy.S3Proxy(server.endpoint) as running:
        yield running


def write_file(path, data, mode=0o644, flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
    """Writes DATA with os.open/os.write/os.close; errors of close() raise."""
    fd = os.open(path, flags, mode)
    try:
        view = memoryview(data)
        while view:
            done = os.write(fd, view[:8 * MiB])
            view = view[done:]
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    os.close(fd)


def fsync_path(path, flags=os.O_RDWR):
    """Opens PATH, fsyncs that new descriptor and closes it."""
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def head(s3, bucket, key):
    """The HeadObject answer, or None for a missing object."""
    try:
        return s3.head_object(Bucket=bucket, Key=key)
    except botocore.exceptions.ClientError as error:
        if error.response['Error']['Code'] in ('404', 'NoSuchKey', 'NotFound'):
            return None
        raise


def object_bytes(s3, bucket, key):
    return s3.get_object(Bucket=bucket, Key=key)['Body'].read()


def bucket_keys(s3, bucket, prefix=''):
    keys = []
    for page in s3.get_paginator('list_objects_v2').paginate(Bucket=bucket,
                                                             Prefix=prefix):
        keys += [item['Key'] for item in page.get('Contents', [])]
    return sorted(keys)


def assert_objects(s3, bucket, expected):
    """Every KEY -> BYTES of EXPECTED is in the bucket, byte for byte."""
    for key, data in expected.items():
        answer = head(s3, bucket, key)
        assert answer is not None, f'{key} is not in the bucket'
        assert answer['ContentLength'] == len(data), key
        got = object_bytes(s3, bucket, key)
        assert sha(got) == sha(data), f'{key}: wrong bytes'


def assert_multipart(server, s3, bucket, key, stats):
    """KEY went up as a multipart upload: the daemon counted the requests
    of one (create, two parts at least, complete); on Swift the ETag also
    has the "-N" of a multipart object (s3rver gives a plain MD5)."""
    assert stats['requests_multipart'] >= 4, stats
    if server.name == 'swift':
        etag = head(s3, bucket, key)['ETag'].strip('"')
        assert '-' in etag and etag.rsplit('-', 1)[1].isdigit(), etag


def stat_value(mnt, name):
    return read_stats(mnt.path)[name]


def wait_stat(mnt, name, predicate, timeout=HANG_TIMEOUT, what=None):
    """Polls counter NAME of MNT until PREDICATE(value); returns the value."""
    seen = []

    def check():
        value = stat_value(mnt, name)
        seen[:] = [value]
        return predicate(value)
    try:
        wait_for(check, timeout, what or f'{name} (last {seen})', interval=0.05)
    except BaseException:
        print(mnt.log()[-3000:])
        raise
    return seen[0]


def run_within(timeout, function, *args):
    """Runs FUNCTION in a thread: (result or raised exception, seconds), or
    pytest.fail when it does not return within TIMEOUT (a hang)."""
    started = time.monotonic()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(function, *args)
    try:
        # (not future.result(timeout): since Python 3.11 its TimeoutError is
        # the OSError of ETIMEDOUT too, which FUNCTION may raise itself)
        done, _ = concurrent.futures.wait([future], timeout=timeout)
        if not done:
            pytest.fail(f'{getattr(function, "__name__", function)} did not '
                        f'return within {timeout}s')
        error = future.exception()
        outcome = error if isinstance(error, Exception) else future.result()
    finally:
        pool.shutdown(wait=False)
    return outcome, time.monotonic() - started


def start_in_thread(function, *args):
    """Starts FUNCTION in a thread; returns its future (exceptions kept)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(function, *args)
    pool.shutdown(wait=False)
    return future


def put_kind(method, path, query):
    """inject() matcher: object PUTs (single PUTs and multipart parts)."""
    return method == 'PUT'


def wait_stopped(mnt, timeout=HANG_TIMEOUT):
    """Waits for the daemon of MNT to exit by itself; returns its status
    and detaches it from the fixture (which then has nothing to unmount)."""
    try:
        code = mnt.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        mnt.process.kill()
        mnt.process.wait()
        mnt.process = None
        subprocess.run(['fusermount3', '-uz', str(mnt.path)])
        pytest.fail(f's3cachefs did not exit within {timeout}s:\n{mnt.log()[-4000:]}')
    mnt.process = None
    if is_fuse_mount(mnt.path):
        subprocess.run(['fusermount3', '-uz', str(mnt.path)])
        pytest.fail(f'the mount outlived its daemon (exit {code})')
    check_sanitizer_log(mnt.log())
    return code


def kill_9(mnt):
    """kill -9 the daemon, then clear the dead mount point."""
    mnt.kill(signal.SIGKILL)
    mnt.process.wait(timeout=HANG_TIMEOUT)
    mnt.process = None
    subprocess.run(['fusermount3', '-uz', str(mnt.path)])
    wait_for(lambda: not is_fuse_mount(mnt.path), HANG_TIMEOUT,
             'the dead mount to go')


@contextlib.contextmanager
def small_tmpfs(directory, size='48m'):
    """A tmpfs of SIZE mounted on DIRECTORY for the duration; unmounted
    (lazily if still busy) whatever happens."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs',
                    str(directory)], check=True)
    try:
        yield directory
    finally:
        if subprocess.run(['umount', str(directory)]).returncode != 0:
            subprocess.run(['umount', '-l', str(directory)])


# ------------------------------------------------------------------ s3fs

class S3fs:
    """s3fs-fuse (Debian) in the foreground on MOUNTPOINT, for interop."""

    def __init__(self, server, bucket, mountpoint, workdir):
        self.path = Path(mountpoint)
        self.path.mkdir(parents=True, exist_ok=True)
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self.passwd = workdir / 's3fs.passwd'
        # BUCKET:ACCESS:SECRET: Swift's access key has a colon in it.
        self.passwd.write_text(f'{bucket}:{server.access_key}:{server.secret_key}\n')
        self.passwd.chmod(0o600)
        self.log_path = workdir / 's3fs.log'
        options = [f'url={server.endpoint}', 'use_path_request_style',
                   f'passwd_file={self.passwd}', 'endpoint=us-east-1',
                   'stat_cache_expire=1', 'enable_noobj_cache']
        self.argv = ['s3fs', bucket, str(self.path), '-f', '-o', ','.join(options)]
        env = {k: v for k, v in os.environ.items() if not k.startswith('AWS_')
               and k.lower() not in ('http_proxy', 'https_proxy', 'all_proxy')}
        with open(self.log_path, 'ab') as log:
            self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT,
                                            env=env)

        def up():
            return is_fuse_mount(self.path) or self.process.poll() is not None
        wait_for(up, HANG_TIMEOUT, f's3fs on {self.path}')
        if self.process.poll() is not None:
            pytest.fail(f's3fs exited with {self.process.returncode}:\n{self.log()}')

    def log(self):
        return self.log_path.read_text(errors='replace')

    def unmount(self):
        if self.process is None:
            return
        deadline = time.monotonic() + HANG_TIMEOUT
        while is_fuse_mount(self.path) and time.monotonic() < deadline:
            if subprocess.run(['fusermount3', '-u', str(self.path)],
                              capture_output=True).returncode != 0:
                time.sleep(0.1)
        if is_fuse_mount(self.path):
            subprocess.run(['fusermount3', '-uz', str(self.path)])
        try:
            self.process.wait(timeout=HANG_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


@pytest.fixture
def s3fs_mount(server, tmp_path):
    """Factory: s3fs_mount(bucket, name='s3fs') -> a running S3fs, always
    unmounted at the end."""
    made = []

    def make(bucket, name='s3fs'):
        mounted = S3fs(server, bucket, tmp_path / name, tmp_path / f'{name}-work')
        made.append(mounted)
        return mounted
    yield make
    for mounted in made:
        mounted.unmount()
