"""Fixtures for the integration tests: real S3 servers, real FUSE mounts.

Every test runs once per server (s3rver and OpenStack Swift s3api, started
on loopback by tests/harness/servers.py; S3CACHEFS_SERVERS=s3rver limits
the set). Data goes into the bucket through boto3, an independent client,
and comes back through a real s3cachefs mount. Mounts are always unmounted,
even when a test fails, and a sanitizer report in the daemon's log fails
the test that produced it.
"""
import contextlib
import fcntl
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRCDIR = Path(os.environ.get('S3CACHEFS_SRCDIR',
                             Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(SRCDIR / 'tests' / 'harness'))
import s3proxy  # noqa: E402
import servers  # noqa: E402

BINARY = os.environ.get('S3CACHEFS_BIN', str(SRCDIR / 'src' / 's3cachefs'))
SERVER_KINDS = {'s3rver': servers.S3rverServer, 'swift': servers.SwiftServer}
# A shell starts background jobs with SIGINT ignored (run.sh runs one
# pytest per server that way), and an ignored signal stays ignored across
# exec: every daemon started here would ignore SIGINT. Catching it here
# instead makes it the default again in every child.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SELECTED = [k for k in os.environ.get('S3CACHEFS_SERVERS', 's3rver,swift').split(',') if k]
MOUNT_TIMEOUT = 30.0
UNMOUNT_TIMEOUT = 30.0
SANITIZER_MARKERS = ('ERROR: AddressSanitizer', 'ERROR: LeakSanitizer',
                     'runtime error:', 'SUMMARY: UndefinedBehaviorSanitizer')


def wait_for(predicate, timeout, what, interval=0.02):
    """Polls predicate until it is true; fails the test after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f'timed out after {timeout}s waiting for {what}')
        time.sleep(interval)


def is_fuse_mount(path):
    """True when /proc/mounts lists path as a FUSE mount."""
    target = os.path.realpath(path)
    with open('/proc/mounts') as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 2 and fields[1] == target and fields[2].startswith('fuse'):
                return True
    return False


def daemon_env(server, home, extra=None):
    """The environment for s3cachefs: the server's credentials and nothing
    inherited that could change how they are resolved."""
    env = {k: v for k, v in os.environ.items() if not k.startswith('AWS_')}
    env.update(HOME=str(home), AWS_ACCESS_KEY_ID=server.access_key,
               AWS_SECRET_ACCESS_KEY=server.secret_key)
    env.update(extra or {})
    return env


def check_sanitizer_log(text):
    for marker in SANITIZER_MARKERS:
        if marker in text:
            pytest.fail(f'sanitizer report in the daemon log:\n{text[-4000:]}')


class Mount:
    """One s3cachefs process in the foreground (-f) and its mount point."""

    def __init__(self, server, bucket, mountpoint, log_path, home,
                 options=(), env=None):
        self.server = server
        self.bucket = bucket
        self.path = Path(mountpoint)
        self.log_path = Path(log_path)
        self.options = ['endpoint=' + server.endpoint, *options]
        self.env = daemon_env(server, home, env)
        self.process = None

    def argv(self):
        return [BINARY, '-f', self.bucket, str(self.path), '-o', ','.join(self.options)]

    def start(self):
        self.path.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, 'ab')
        self.process = subprocess.Popen(self.argv(), env=self.env, stdout=log,
                                        stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
        log.close()

        def mounted_or_exited():
            return is_fuse_mount(self.path) or self.process.poll() is not None
        wait_for(mounted_or_exited, MOUNT_TIMEOUT, f'the mount on {self.path}')
        if self.process.poll() is not None:
            pytest.fail(f's3cachefs exited with {self.process.returncode}:\n{self.log()}')
        return self

    def log(self):
        try:
            return self.log_path.read_text(errors='replace')
        except FileNotFoundError:
            return ''

    def unmount(self, timeout=UNMOUNT_TIMEOUT):
        """fusermount3 -u (retried while busy), then wait for the daemon
        (up to TIMEOUT seconds: a daemon uploads what is pending before it
        exits)."""
        if self.process is None:
            return
        deadline = time.monotonic() + UNMOUNT_TIMEOUT
        while is_fuse_mount(self.path) and time.monotonic() < deadline:
            done = subprocess.run(['fusermount3', '-u', str(self.path)],
                                  capture_output=True)
            if done.returncode != 0:
                time.sleep(0.1)
        if is_fuse_mount(self.path):
            subprocess.run(['fusermount3', '-uz', str(self.path)])
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f's3cachefs did not exit after unmount:\n{self.log()}')
        code = self.process.returncode
        self.process = None
        check_sanitizer_log(self.log())
        assert code == 0, f's3cachefs exited with {code}:\n{self.log()}'

    def kill(self, signum=signal.SIGTERM):
        self.process.send_signal(signum)


@pytest.fixture(scope='session', params=SELECTED)
def server(request, tmp_path_factory):
    """A running S3 server of each kind, shared by the whole session."""
    kind = request.param
    instance = SERVER_KINDS[kind](tmp_path_factory.mktemp(f'server-{kind}'))
    instance.start()
    yield instance
    instance.stop()


@pytest.fixture(scope='session')
def s3(server):
    """A boto3 client for the server: the independent client."""
    return server.client()


def new_bucket_name(prefix='t'):
    return f'{prefix}-{secrets.token_hex(6)}'


@pytest.fixture
def bucket(server, s3):
    """A fresh empty bucket, released afterwards (its large objects and
    pending uploads deleted; see S3Server.release_bucket)."""
    name = new_bucket_name()
    server.create_bucket(name)
    yield name
    server.release_bucket(name)


@pytest.fixture
def home(tmp_path):
    """An empty HOME, so no ~/.aws of the machine changes the outcome."""
    path = tmp_path / 'home'
    path.mkdir()
    return path


@pytest.fixture
def mount(server, tmp_path, home):
    """Factory: mount(bucket, options=(...)) -> a started Mount. Every mount
    made is unmounted at the end of the test, failing or not."""
    made = []

    def make(bucket_name, options=(), env=None, start=True, name='mnt',
             cache=None, endpoint=None):
        """cache: the cache directory (default: one per mount point);
        endpoint: another way to the server (a proxy)."""
        cache_dir = cache or tmp_path / f'cache-{name}'
        options = [f'cache={cache_dir}', *options]
        mnt = Mount(server, bucket_name, tmp_path / name,
                    tmp_path / f'{name}-{len(made)}.log', home, options, env)
        if endpoint is not None:
            mnt.options[0] = 'endpoint=' + endpoint
        mnt.cache_dir = Path(cache_dir)
        made.append(mnt)
        return mnt.start() if start else mnt
    yield make
    failures = []
    for mnt in made:
        try:
            mnt.unmount()
        except BaseException as error:  # keep unmounting the others
            failures.append(error)
    if failures:
        raise failures[0]


@pytest.fixture
def proxy(server):
    """A plain-HTTP proxy (s3proxy) in front of the session's server: a
    test mounts through proxy.endpoint to see and count the requests."""
    with s3proxy.S3Proxy(server.endpoint) as running:
        yield running


# run.sh runs one pytest process per server at the same time. drop_caches()
# empties the kernel's page cache and its dentry and inode caches, for
# every mount: the kernel then forgets inodes of the other run's mounts
# too, and the daemon with them (a directory's listing, its lookup
# pattern). A test that relies on those caches holds this lock shared, and
# drop_caches() takes it exclusive, so the other run cannot empty them in
# the middle of such a test.
KERNEL_CACHES_LOCK = '/tmp/s3cachefs-tests-page-cache.lock'


@contextlib.contextmanager
def kernel_caches_kept():
    """While inside, no test process drops the kernel's caches."""
    with open(KERNEL_CACHES_LOCK, 'a') as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
def inodes_kept():
    """kernel_caches_kept() for a whole test, for tests that count on the
    daemon's memory of directories (listings, lookup patterns): the other
    server's run must not make the kernel forget their inodes while they
    run. A module of such tests names it in its pytestmark."""
    with kernel_caches_kept():
        yield


def drop_caches():
    """Empty the kernel's page cache (and dentries and inodes), so reads
    and lookups reach the filesystem."""
    subprocess.run(['sync'], check=True)
    with open(KERNEL_CACHES_LOCK, 'a') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open('/proc/sys/vm/drop_caches', 'w') as control:
            control.write('3\n')


def read_stats(mountpoint):
    """The counters of a mount (the user.s3cachefs.stats attribute)."""
    text = os.getxattr(mountpoint, 'user.s3cachefs.stats').decode()
    return {name: float(value) if '.' in value else int(value)
            for name, value in (line.split() for line in text.splitlines())}
