#!/usr/bin/python3
"""Read and write benchmark: s3cachefs against s3fs and rclone mount, with
the bucket 20 ms away, and the limits of this machine.

    /usr/bin/python3 tests/bench/bench.py [--quick] [--server s3rver|swift]
        [--size-mib 1024] [--small-files 2000] [--hf-mib 500]
        [--tar-files 2000] [--runs 3] [--only ROW,...]
        [--tools s3cachefs,s3cachefs-wb,s3fs,rclone] [--s3cachefs-bin PATH]
        [--s3cachefs-opts OPTS] [--json out.json]

As root, it installs what it lacks (tests/bench/install-deps.sh), starts an
S3 server on loopback (tests/harness/servers.py), uploads one large random
file and many 64 KiB files for the read rows, and puts
tests/bench/latency_proxy.py in front of the server: every request waits
20 ms there, as if the bucket were remote. Each file system mounts the
bucket through that proxy; each row (see ROWS, WRITE_ROWS and
tests/bench/README.md) is run --runs times and the median is reported,
with the requests the proxy saw, the bytes it received and sent, and the
daemon's peak RSS and CPU time during the row. A write row is timed until
its data is in the bucket (see Bench.timed_write).

Everything it starts is stopped, everything it mounts is unmounted and its
temporary directory removed, on success, error, Ctrl-C or SIGTERM.
"""
import argparse
import atexit
import collections
import concurrent.futures
import fcntl
import hashlib
import io
import json
import os
import random
import re
import resource
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import boto3.s3.transfer
import botocore.config

BENCH_DIR = Path(__file__).resolve().parent
SRCDIR = BENCH_DIR.parents[1]
sys.path.insert(0, str(SRCDIR / 'tests' / 'harness'))
import servers  # noqa: E402
import swift_seed  # noqa: E402

SYSTEM_PYTHON = '/usr/bin/python3'
MiB = 1 << 20
GiB = 1 << 30
BUCKET = 'bench'
BIG_KEY = 'big.bin'
SMALL_DIR = 'small'
SMALL_SIZE = 64 * 1024
LATENCY = 0.020               # seconds the proxy adds to every request
SMALL_READERS = 8
RAW_GET_PARALLEL = 16         # as many as s3cachefs's default connections
RAW_GET_RANGE = 8 * MiB
FIO_RUNTIME = 10
FIO_JOBS = 4
LONG_ROW_SECONDS = 30.0       # default of --long-row
READ_BLOCK = MiB
SINGLE_PUT_LIMIT = 5 << 30    # S3's largest single PUT; above it, multipart
UPLOAD_THREADS = 16
MOUNT_TIMEOUT = 60.0
UNMOUNT_TIMEOUT = 30.0
LOG_TAIL_LINES = 20
S3CACHEFS_CACHE_OPTS = 'cache={cache_dir},cache_size=4G'
# s3cachefs-wb is s3cachefs with -o writeback; it runs the write rows only.
TOOLS = ('s3cachefs', 's3cachefs-wb', 's3cachefs-trust', 's3cachefs-nohead',
         's3fs', 'rclone')
# The s3cachefs tools, each a variant of its options.
S3CACHEFS_TOOLS = {'s3cachefs', 's3cachefs-wb', 's3cachefs-trust',
                   's3cachefs-nohead'}
READ_TOOLS = ('s3cachefs', 's3fs', 'rclone')
# The cluster rows: nodes are mounts with caches of their own; s3cachefs
# shares TIER_BUCKET on a second server of the same kind (-o
# shared_cache), reached without the proxy (a tier is near the nodes), so
# the proxy's bytes are the origin's alone.
CLUSTER_NODES = 4
TIER_BUCKET = 'bench-tier'
CLUSTER_ROWS = {'cluster_seq', 'cluster_par'}
WRITE_TOOLS = ('s3cachefs', 's3cachefs-wb', 's3fs', 'rclone')
# s3cachefs-trust is s3cachefs with -o trust=KEYS_DIR, s3cachefs-nohead
# with -o no_headers=KEYS_DIR: the keys rows only
KEYS_TOOLS = ('s3cachefs', 's3cachefs-trust', 's3cachefs-nohead', 's3fs',
              'rclone')
KEYS_DIR = 'keys'             # the keys rows' directory of --keys objects
KEYS_DEFAULT = 10000
KEY_SIZE = 16                 # bytes of each of its objects (--key-bytes)
KEYS_UPLOADS = 8              # PUT processes at a time (not on Swift)
KEYS_PER_PUTTER = 1000        # keys per task of those processes
KEY_OPS = ('ls', 'lsl', 'find', 'du', 'open')
KEYS_OPENED = 1000            # files the open rows read by name
KEYS_OPEN_SEED = 13           # of the random choice of those files
KEY_PHASES = ('cold', 'warm', 'remount')
PEERS = ('s3fs', 'rclone')
QUICK = {'size_mib': 256, 'small_files': 500, 'runs': 1, 'hf_mib': 128,
         'tar_files': 300}
DEFAULTS = {'size_mib': 1024, 'small_files': 2000, 'runs': 3, 'hf_mib': 500,
            'tar_files': 2000}
# Write rows.
WRITE_PREFIX = 'w'            # each write row writes under w/ROW/TOOL-RUN/
WRITE_BLOCK = 8 * MiB         # the size of each write() of a large file
WRITE_SEED = 4                # of the deterministic data written
SMALL_WRITERS = 8
BUCKET_POLL = 0.2             # seconds between bucket listings (rclone)
STATS_POLL = 0.05             # seconds between counter reads (writeback)
RAW_MPU_PART = 16 * MiB
RAW_MPU_PARALLEL = 16
TAR_LARGE_EVERY = 50          # one dataset file in 50 is 1-3 MiB
TAR_MTIME = 1700000000
RCLONE_RENAME_WRITE_BACK = '1s'
RENAMING_ROWS = {'hf_cache'}
HF_REPO = 'models--bench--model'
HF_FILENAME = 'model.safetensors'
HF_ETAG = hashlib.sha256(b'bench blob').hexdigest()
HF_REVISION = hashlib.sha1(b'bench revision').hexdigest()
HF_UUID = hashlib.md5(b'bench download').hexdigest()
PROXY_VARIABLES = ('http_proxy', 'https_proxy', 'all_proxy', 'no_proxy')
# Where a built s3cachefs is looked for: an in-tree build, then the plain
# build of tests/run-all.sh.
DEFAULT_BINARIES = (SRCDIR / 'src' / 's3cachefs',
                    SRCDIR / 'build-plain' / 'src' / 's3cachefs')

# metric: 'seconds' (lower is better) or 'iops' (higher is better).
# limit: the limit row a file system's speed is compared with, if any.
Row = collections.namedtuple('Row', 'name title metric limit')
ROWS = (
    Row('cold', 'cold sequential read', 'seconds', 'raw_get'),
    Row('mmap', 'cold mmap load, 64 KiB pieces in random order', 'seconds',
        'raw_get'),
    Row('reread', 're-read, page cache dropped', 'seconds', 'bindfs'),
    Row('fio', 'fio 4 KiB random reads', 'iops', None),
    Row('remount', 're-read after remount', 'seconds', 'bindfs'),
    Row('small_cold', f'small files, {SMALL_READERS} readers, cold',
        'seconds', None),
    Row('small_warm', f'small files, {SMALL_READERS} readers, warm',
        'seconds', None),
    Row('ls_cold', 'ls -l of small/, cold', 'seconds', None),
    Row('ls_warm', 'ls -l of small/, warm', 'seconds', None),
    Row('cluster_seq', f'{CLUSTER_NODES} nodes read the large file one '
        'after another', 'seconds', None),
    Row('cluster_par', f'{CLUSTER_NODES} nodes read the large file at once',
        'seconds', None),
)
WRITE_ROWS = (
    Row('write_big', 'write large file + fsync', 'seconds', 'raw_mpu'),
    Row('write_small', f'write 64 KiB files, {SMALL_WRITERS} writers',
        'seconds', None),
    Row('untar', 'untar dataset', 'seconds', None),
    Row('hf_cache', 'Hugging Face cache download', 'seconds', None),
)
LIMIT_ROWS = (
    Row('raw_get', f'limit: {RAW_GET_PARALLEL} parallel ranged GETs (curl)',
        'seconds', None),
    Row('bindfs', 'limit: FUSE ceiling (bindfs, local file)', 'seconds',
        None),
    Row('raw_mpu', f'limit: multipart upload, {RAW_MPU_PARALLEL} parallel '
        f'parts (curl)', 'seconds', None),
)
KEY_OP_TITLES = {'ls': 'ls', 'lsl': 'ls -l', 'find': 'find', 'du': 'du -s',
                 'open': f'open and read {KEYS_OPENED} by name'}
KEY_PHASE_TITLES = {'cold': 'cold', 'warm': 'warm',
                    'remount': 'after remount'}
# Not in the default --only: ask for them by name (or --only keys).
KEYS_ROWS = tuple(
    Row(f'keys_{op}_{phase}',
        f'{KEY_OP_TITLES[op]} of {{keys}} keys, {KEY_PHASE_TITLES[phase]}',
        'seconds', None)
    for op in KEY_OPS for phase in KEY_PHASES)
KEYS_ROWS += (Row('keys_refresh', 's3cachefs refresh of {keys} keys',
                  'seconds', None),)
KEYS_ROW_NAMES = tuple(row.name for row in KEYS_ROWS)
ALL_ROWS = ROWS + WRITE_ROWS + LIMIT_ROWS + KEYS_ROWS
ROWS_BY_NAME = {row.name: row for row in ALL_ROWS}
WRITE_ROW_NAMES = tuple(row.name for row in WRITE_ROWS)
BIG_FILE_ROWS = {'cold', 'reread', 'fio', 'remount'}
# Rows whose daemon CPU is also reported per GiB read (report_cpu()).
CPU_ROWS = ('cold', 'reread')
MMAP_TENSOR = 64 << 10      # the mmap row's tensors: the file in 64 KiB pieces
SMALL_FILE_ROWS = {'small_cold', 'small_warm', 'ls_cold', 'ls_warm'}


def key_name(index, count, dirs):
    """The key of the keys rows' object INDEX of COUNT: KEYS_DIR/fNNNNNNN,
    or with DIRS directories KEYS_DIR/dNNNN/fNNNNNNN (swift_seed.py)."""
    return f'{KEYS_DIR}/{swift_seed.key_name(index, count, dirs)}'


def put_keys(endpoint, region, access_key, secret_key, names, size):
    """PUT the keys NAMES (SIZE bytes each) with a client of its own
    (a process of a pool: boto3 in threads is bound by one interpreter
    lock)."""
    s3 = boto3.session.Session().client(
        's3', endpoint_url=endpoint, region_name=region,
        aws_access_key_id=access_key, aws_secret_access_key=secret_key,
        config=botocore.config.Config(signature_version='s3v4',
                                      s3={'addressing_style': 'path'},
                                      proxies={}))
    body = b'k' * size
    for name in names:
        s3.put_object(Bucket=BUCKET, Key=name, Body=body)


def run_counting(argv, expected_lines):
    """Runs a listing command; its lines of output must be EXPECTED_LINES
    (None: not checked)."""
    done = subprocess.run(argv, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise BenchError(f'{" ".join(argv)}: exit {done.returncode}: '
                         f'{done.stderr.strip()[:300]}')
    lines = done.stdout.count('\n')
    if expected_lines is not None and lines != expected_lines:
        raise BenchError(f'{" ".join(argv)}: {lines} lines, expected '
                         f'{expected_lines}')


def key_op(op, directory, count, dirs, size):
    """The workload of a keys row: ls, ls -l, find or du -s on DIRECTORY
    of COUNT files (in DIRS directories, or none: ls and ls -l then go
    down with -R), output to a pipe (ls does not stat); or open: read
    KEYS_OPENED of its files (chosen at random, the same every time) by
    name, each SIZE bytes long."""
    # the directories swift_seed.key_name() fills: COUNT / DIRS rounded up
    # in each, so there may be fewer than DIRS
    made = -(-count // -(-count // dirs)) if dirs else 0
    recursive = ['-R'] if dirs else []
    if op == 'ls':
        # (-R: "DIR:" first, and a blank line and "DIR:" before each
        # subdirectory's names)
        run_counting(['ls', '-1', *recursive, str(directory)],
                     count + (1 + made * 3 if dirs else 0))
    elif op == 'lsl':
        # ("total" per directory)
        run_counting(['ls', '-l', *recursive, str(directory)],
                     count + 1 + (1 + made * 4 if dirs else 0))
    elif op == 'find':
        run_counting(['find', str(directory)], count + 1 + made)
    elif op == 'du':
        run_counting(['du', '-s', str(directory)], 1)
    else:
        chosen = random.Random(KEYS_OPEN_SEED).sample(
            range(count), min(KEYS_OPENED, count))
        for index in chosen:
            path = directory.parent / key_name(index, count, dirs)
            with open(path, 'rb') as file:
                got = len(file.read())
            if got != size:
                raise BenchError(f'{path}: {got} bytes, expected {size}')


def allocated_mib(path):
    """Disk space PATH (a file or a tree) takes, in MiB (st_blocks)."""
    path = Path(path)
    if not path.exists():
        return 0.0
    if path.is_file():
        return path.stat().st_blocks * 512 / MiB
    total = 0
    for root, dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total / MiB


class BenchError(RuntimeError):
    """The benchmark cannot go on."""


# ------------------------------------------------------------ cleanup

class Cleanup:
    """Undo actions, run last in, first out, exactly once each: at the end
    of main(), or at interpreter exit if main() never got there."""

    def __init__(self):
        self._actions = []

    def push(self, action):
        self._actions.append(action)

    def discard(self, action):
        if action in self._actions:
            self._actions.remove(action)

    def run(self):
        if not self._actions:
            return
        # A second Ctrl-C must not cut the cleanup short.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            while self._actions:
                action = self._actions.pop()
                try:
                    action()
                except Exception as error:  # noqa: BLE001 - undo the rest
                    print(f'bench: cleanup: {error}', file=sys.stderr)
        finally:
            signal.signal(signal.SIGINT, previous)


def exit_on_signal(signum, frame):
    """SIGTERM and SIGHUP unwind like Ctrl-C, through every finally."""
    print(f'\nbench: {signal.Signals(signum).name}, cleaning up',
          file=sys.stderr)
    raise SystemExit(128 + signum)


# ------------------------------------------------------ small helpers

def drop_caches():
    os.sync()
    Path('/proc/sys/vm/drop_caches').write_text('3\n')


def fuse_mount_points():
    with open('/proc/mounts') as mounts:
        fields = [line.split() for line in mounts]
    return {f[1] for f in fields if len(f) > 2 and f[2].startswith('fuse')}


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f'timed out after {timeout:.0f} s waiting for '
                             f'{what}')
        time.sleep(0.05)


def log_tail(path):
    try:
        lines = Path(path).read_text(errors='replace').splitlines()
    except FileNotFoundError:
        return ''
    return '\n'.join(lines[-LOG_TAIL_LINES:])


def first_line(argv):
    """The first line a command prints (a version), or '?'."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return '?'
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if lines else '?'


def daemon_environment(home):
    """The environment of a daemon: no AWS settings or proxies inherited
    (rclone must not see AWS_CA_BUNDLE, nobody may route loopback traffic
    through a proxy), and a HOME of its own."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(('AWS_', 'RCLONE_'))
           and name.lower() not in PROXY_VARIABLES}
    env['HOME'] = str(home)
    return env


def write_private(path, text):
    path.write_text(text)
    path.chmod(0o600)


class DaemonStats:
    """Peak RSS and CPU time of one process over a row, from /proc."""

    def __init__(self, pid):
        self.pid = pid
        self._cpu_at_start = None

    def cpu_seconds(self):
        stat = Path(f'/proc/{self.pid}/stat').read_text()
        fields = stat[stat.rindex(')') + 2:].split()
        utime, stime = int(fields[11]), int(fields[12])
        return (utime + stime) / os.sysconf('SC_CLK_TCK')

    def peak_rss_mib(self):
        for line in Path(f'/proc/{self.pid}/status').read_text().splitlines():
            if line.startswith('VmHWM:'):
                return int(line.split()[1]) / 1024
        raise BenchError(f'no VmHWM in /proc/{self.pid}/status')

    def begin(self):
        # Writing 5 to clear_refs resets VmHWM to the current RSS.
        Path(f'/proc/{self.pid}/clear_refs').write_text('5\n')
        self._cpu_at_start = self.cpu_seconds()

    def end(self):
        return {'peak_rss_mib': self.peak_rss_mib(),
                'cpu_seconds': self.cpu_seconds() - self._cpu_at_start}


def children_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def curl_config_value(value):
    return '"' + value.replace('\\', '\\\\').replace('"', '\\"') + '"'


# ------------------------------------------------------------- proxy

class LatencyProxy:
    """tests/bench/latency_proxy.py in a process of its own."""

    def __init__(self, upstream, latency):
        self.upstream = upstream
        self.latency = latency
        self.endpoint = None
        self._process = None

    def start(self):
        self._process = subprocess.Popen(
            [SYSTEM_PYTHON, str(BENCH_DIR / 'latency_proxy.py'),
             self.upstream, '--latency', str(self.latency)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            start_new_session=True)
        self.endpoint = self._ask(None)['endpoint']

    def _ask(self, command):
        if command is not None:
            self._process.stdin.write(command + '\n')
            self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise BenchError(f'the latency proxy exited '
                             f'({self._process.poll()})')
        answer = json.loads(line)
        if 'error' in answer:
            raise BenchError(f'latency proxy: {answer["error"]}')
        return answer

    def reset(self):
        self._ask('reset')

    def counters(self):
        return self._ask('counters')

    def requests(self):
        """[method, path, query, status] of every request since the last
        reset."""
        return self._ask('requests')['requests']

    def stop(self):
        process, self._process = self._process, None
        if process is None:
            return
        process.stdin.close()  # it stops at the end of its input
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()


# ------------------------------------------------------------ mounts

class Mount:
    """One FUSE daemon, run in the foreground in a session of its own (so a
    Ctrl-C reaches the benchmark, which unmounts, and not the daemon)."""

    def __init__(self, tool, argv, env, path, log_path, cleanup):
        self.tool = tool
        self.argv = argv
        self.env = env
        self.path = Path(path)
        self.log_path = log_path
        self.cleanup = cleanup
        self.process = None

    @property
    def pid(self):
        return self.process.pid

    def start(self):
        self.path.mkdir(parents=True, exist_ok=True)
        if str(self.path) in fuse_mount_points():
            raise BenchError(f'{self.path} is already mounted')
        with open(self.log_path, 'ab') as log:
            self.process = subprocess.Popen(
                self.argv, env=self.env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.cleanup.push(self.stop)
        wait_until(lambda: str(self.path) in fuse_mount_points()
                   or self.process.poll() is not None,
                   MOUNT_TIMEOUT, f'{self.tool} to mount {self.path}')
        if self.process.poll() is not None:
            code = self.process.returncode
            self.stop()
            raise BenchError(f'{self.tool} exited with status {code}:\n'
                             f'{log_tail(self.log_path)}')
        return self

    def stop(self):
        """fusermount3 -u (retried while busy), then -uz, then waits for
        the daemon (killing it if it lingers)."""
        self.cleanup.discard(self.stop)
        if self.process is None:
            return
        deadline = time.monotonic() + UNMOUNT_TIMEOUT
        while (str(self.path) in fuse_mount_points()
               and time.monotonic() < deadline):
            done = subprocess.run(['fusermount3', '-u', str(self.path)],
                                  capture_output=True)
            if done.returncode != 0:
                time.sleep(0.2)
        if str(self.path) in fuse_mount_points():
            subprocess.run(['fusermount3', '-uz', str(self.path)],
                           capture_output=True)
        try:
            self.process.wait(timeout=UNMOUNT_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


class FileSystem:
    """How one file system is mounted: command(mountpoint, cache_dir)
    returns its argv; env is its environment. completion says how a write
    row learns that the data is in the bucket: 'close' (when the writer's
    last close or fsync returns), 'stats' (s3cachefs's uploads_pending
    counter drops to 0) or 'poll' (the bucket is listed until it has it)."""
    name = None
    completion = 'close'

    def __init__(self, env):
        self.env = env

    def command(self, mountpoint, cache_dir, row=None):
        """The argv of a mount for ROW (None: a read row)."""
        raise NotImplementedError


class S3cachefs(FileSystem):
    name = 's3cachefs'

    def __init__(self, env, binary, endpoint, server, options,
                 writeback=False, tier_server=None, trust=None,
                 no_headers=None):
        super().__init__(dict(env, AWS_ACCESS_KEY_ID=server.access_key,
                              AWS_SECRET_ACCESS_KEY=server.secret_key))
        self.binary = binary
        self.endpoint = endpoint
        self.options = options
        self.writeback = writeback
        self.tier_endpoint = tier_server.endpoint if tier_server else None
        self.trust = trust
        self.no_headers = no_headers
        if writeback:
            self.name = 's3cachefs-wb'
            self.completion = 'stats'
        if trust:
            self.name = 's3cachefs-trust'
        if no_headers:
            self.name = 's3cachefs-nohead'

    def command(self, mountpoint, cache_dir, row=None):
        options = [f'endpoint={self.endpoint}']
        if self.options:
            options.append(self.options.format(cache_dir=cache_dir))
        if self.writeback:
            options.append('writeback')
        if row in CLUSTER_ROWS:
            options += [f'shared_cache={TIER_BUCKET}',
                        f'shared_cache_endpoint={self.tier_endpoint}']
        if self.trust:
            options.append(f'trust={self.trust}')
        if self.no_headers:
            options.append(f'no_headers={self.no_headers}')
        return [self.binary, '-f', BUCKET, str(mountpoint),
                '-o', ','.join(options)]


class S3fs(FileSystem):
    name = 's3fs'

    def __init__(self, env, endpoint, server, passwd_file, options):
        super().__init__(env)
        # BUCKET:ACCESS:SECRET: s3fs splits at the first and the last
        # colon, so an access key with a colon (Swift's test:tester) works.
        write_private(passwd_file, f'{BUCKET}:{server.access_key}:'
                                   f'{server.secret_key}\n')
        self.endpoint = endpoint
        self.passwd_file = passwd_file
        self.options = options

    def command(self, mountpoint, cache_dir, row=None):
        options = [f'url={self.endpoint}', 'use_path_request_style',
                   f'passwd_file={self.passwd_file}',
                   f'use_cache={cache_dir}']
        if self.options:
            options.append(self.options)
        return ['s3fs', BUCKET, str(mountpoint), '-f',
                '-o', ','.join(options)]


class Rclone(FileSystem):
    """rclone mount with a full VFS cache. It uploads a file
    --vfs-write-back after its last close (5 s by default): 0s starts the
    upload at once, and write rows poll the bucket until it is there. But
    rclone 1.60 loses a file renamed while its upload runs (the upload
    fails, "corrupted on transfer", and the new name never reaches the
    bucket), so rows that rename just-closed files get
    RCLONE_RENAME_WRITE_BACK: the renames happen before any upload starts,
    as with the default."""
    name = 'rclone'
    completion = 'poll'

    def __init__(self, env, endpoint, server, config_file, flags):
        super().__init__(env)
        write_private(config_file, (
            f'[bench]\ntype = s3\nprovider = Other\n'
            f'access_key_id = {server.access_key}\n'
            f'secret_access_key = {server.secret_key}\n'
            f'endpoint = {endpoint}\nregion = {server.region}\n'
            f'force_path_style = true\n'))
        self.config_file = config_file
        self.flags = flags

    def command(self, mountpoint, cache_dir, row=None):
        return ['rclone', 'mount', f'bench:{BUCKET}', str(mountpoint),
                '--config', str(self.config_file),
                '--vfs-cache-mode', 'full', '--cache-dir', str(cache_dir),
                '--vfs-write-back', RCLONE_RENAME_WRITE_BACK
                if row in RENAMING_ROWS else '0s', *self.flags]


class Bindfs(FileSystem):
    """A FUSE passthrough of a local directory: the FUSE ceiling."""
    name = 'bindfs'

    def __init__(self, env, source):
        super().__init__(env)
        self.source = source

    def command(self, mountpoint, cache_dir, row=None):
        return ['bindfs', '-f', str(self.source), str(mountpoint)]


# ---------------------------------------------------------- workloads

def read_sequential(path, expected_size):
    """Reads PATH start to end in 1 MiB reads; checks its size."""
    view = memoryview(bytearray(READ_BLOCK))
    total = 0
    with open(path, 'rb', buffering=0) as file:
        while True:
            count = file.readinto(view)
            if not count:
                break
            total += count
    if total != expected_size:
        raise BenchError(f'read {total} bytes of {path}, expected '
                         f'{expected_size}')


def mmap_load(path, expected_size):
    """What a safetensors-style loader does: map PATH and copy its tensors
    out (MMAP_TENSOR bytes each) in a random order, fixed by a seed so
    every tool and run sees the same order."""
    import mmap
    import random
    order = list(range(0, expected_size, MMAP_TENSOR))
    random.Random(20261202).shuffle(order)
    total = 0
    with open(path, 'rb') as file:
        with mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ) as mapped:
            if len(mapped) != expected_size:
                raise BenchError(f'{path} maps {len(mapped)} bytes, expected '
                                 f'{expected_size}')
            for start in order:
                total += len(mapped[start:start + MMAP_TENSOR])
    if total != expected_size:
        raise BenchError(f'mapped {total} bytes of {path}, expected '
                         f'{expected_size}')


def read_whole_file(path):
    with open(path, 'rb') as file:
        return len(file.read())


def read_files_parallel(paths, expected_size):
    """Reads every file whole, SMALL_READERS at a time; checks sizes."""
    with concurrent.futures.ThreadPoolExecutor(SMALL_READERS) as pool:
        sizes = list(pool.map(read_whole_file, paths))
    wrong = [str(p) for p, size in zip(paths, sizes) if size != expected_size]
    if wrong:
        raise BenchError(f'{len(wrong)} small files were not '
                         f'{expected_size} bytes, such as {wrong[0]}')


def list_long(directory, expected_count):
    """What ls -l does: every entry of DIRECTORY and its lstat()."""
    count = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            entry.stat(follow_symlinks=False)
            count += 1
    if count != expected_count:
        raise BenchError(f'{directory} listed {count} entries, expected '
                         f'{expected_count}')


def run_fio(path, size):
    """fio 4 KiB random reads on PATH; returns IOPS and MiB/s."""
    argv = ['fio', '--name=r', f'--filename={path}', '--rw=randread',
            '--bs=4k', f'--size={size}', f'--runtime={FIO_RUNTIME}',
            '--time_based', '--ioengine=psync', f'--numjobs={FIO_JOBS}',
            '--group_reporting', '--readonly', '--output-format=json']
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0 or '{' not in done.stdout:
        raise BenchError(f'fio failed ({done.returncode}): '
                         f'{done.stderr.strip() or done.stdout.strip()}')
    report = json.loads(done.stdout[done.stdout.index('{'):])
    read = report['jobs'][0]['read']
    return {'iops': read['iops'], 'mib_per_s': read['bw_bytes'] / MiB}


# ----------------------------------------------------- write workloads

class Pattern:
    """Deterministic data: block I is one fixed random block (seeded with
    SEED) whose first 16 bytes are I and SEED, so every block differs."""

    def __init__(self, seed, block_size):
        self.seed = seed
        self.base = random.Random(seed).randbytes(block_size)

    def block(self, index, size=None):
        size = len(self.base) if size is None else size
        return (struct.pack('<QQ', index, self.seed) + self.base[16:])[:size]

    def stream(self, total):
        """The blocks of a TOTAL-byte stream (the last one may be short)."""
        index = 0
        while index * len(self.base) < total:
            yield self.block(index, min(len(self.base),
                                        total - index * len(self.base)))
            index += 1


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_file(path, blocks, flags=os.O_TRUNC, do_fsync=False):
    """Creates PATH (O_WRONLY | O_CREAT | FLAGS, mode 0644), writes BLOCKS
    one write() each, fsyncs if asked, closes: an error from any of them
    (close included) is raised."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o644)
    try:
        for data in blocks:
            write_all(fd, data)
        if do_fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)


def write_small_files(directory, pattern, count):
    """COUNT files f00000.bin... of one pattern block each, SMALL_WRITERS
    at a time; returns {name: size}."""
    def write_one(index):
        write_file(directory / small_write_name(index),
                   [pattern.block(index)])
    with concurrent.futures.ThreadPoolExecutor(SMALL_WRITERS) as pool:
        list(pool.map(write_one, range(count)))
    return {small_write_name(index): len(pattern.base)
            for index in range(count)}


def small_write_name(index):
    return f'f{index:05d}.bin'


def make_dataset(path, files):
    """A deterministic tar of FILES files in nested directories (part/group/
    sub/, ten files each), most 2-80 KiB, one in TAR_LARGE_EVERY 1-3 MiB;
    returns {member path: size} of its files."""
    rng = random.Random(WRITE_SEED)
    sizes = {}
    made_dirs = set()

    def info(name, kind, size=0):
        member = tarfile.TarInfo(name)
        member.type = kind
        member.size = size
        member.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
        member.mtime = TAR_MTIME
        member.uname = member.gname = 'root'
        return member
    with tarfile.open(path, 'w', format=tarfile.GNU_FORMAT) as tar:
        for index in range(files):
            leaf = index // 10
            directory = (f'dataset/part{leaf // 50}/group{leaf // 5 % 10}/'
                         f'sub{leaf % 5}')
            parts = directory.split('/')
            for depth in range(1, len(parts) + 1):
                name = '/'.join(parts[:depth])
                if name not in made_dirs:
                    made_dirs.add(name)
                    tar.addfile(info(name, tarfile.DIRTYPE))
            if index % TAR_LARGE_EVERY == TAR_LARGE_EVERY - 1:
                size = rng.randint(1 * MiB, 3 * MiB)
            else:
                size = rng.randint(2 << 10, 80 << 10)
            name = f'{directory}/item{index:05d}.dat'
            tar.addfile(info(name, tarfile.REGTYPE, size),
                        io.BytesIO(rng.randbytes(size)))
            sizes[name] = size
    return sizes


def untar(archive, directory):
    """GNU tar -x into DIRECTORY, as a user would (no chown: --no-same-owner;
    modes and mtimes from the archive)."""
    done = subprocess.run(['tar', '-x', '--no-same-owner', '-f',
                           str(archive), '-C', str(directory)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise BenchError(f'tar exited with status {done.returncode}: '
                         f'{done.stderr.strip()[-500:]}')


def hf_move(source, target, notes):
    """shutil.move as huggingface_hub calls it: a rename, or where that
    fails, a copy through the mount and an unlink (noted)."""
    try:
        os.rename(source, target)
    except OSError as error:
        notes.append(f'rename {source.name}: {os.strerror(error.errno)}; '
                     f'copied and unlinked instead, as shutil.move does')
        shutil.copyfile(source, target)
        os.unlink(source)


def hf_cache_download(root, pattern, size):
    """What huggingface_hub's hf_hub_download does to put one file of SIZE
    bytes into a cache at ROOT: take .locks/REPO/ETAG.lock with flock,
    append the data to blobs/ETAG.UUID.incomplete, then _chmod_and_move
    (touch, stat and unlink a tmp_UUID file for its mode, chmod the blob to
    it, a failure only noted, and shutil.move it to blobs/ETAG), make
    snapshots/REV/FILE a relative symlink to it (where symlinks fail, move
    the blob there instead, as huggingface_hub does), write refs/main to a
    temporary name and rename it, unlock. Returns ({key under ROOT: size},
    notes)."""
    repo = root / HF_REPO
    locks = root / '.locks' / HF_REPO
    snapshot = repo / 'snapshots' / HF_REVISION
    for directory in (locks, repo / 'blobs', snapshot, repo / 'refs'):
        directory.mkdir(parents=True, exist_ok=True)
    notes = []
    lock_path = locks / f'{HF_ETAG}.lock'
    lock = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        blob = repo / 'blobs' / HF_ETAG
        incomplete = repo / 'blobs' / f'{HF_ETAG}.{HF_UUID}.incomplete'
        write_file(incomplete, pattern.stream(size), flags=os.O_APPEND)
        probe = repo / f'tmp_{HF_UUID}'
        try:
            probe.touch()
            os.chmod(incomplete, probe.stat().st_mode & 0o7777)
        except OSError as error:
            notes.append(f'chmod of the blob: {os.strerror(error.errno)} '
                         f'(huggingface_hub goes on)')
        finally:
            probe.unlink(missing_ok=True)
        hf_move(incomplete, blob, notes)
        pointer = snapshot / HF_FILENAME
        target = os.path.relpath(blob, pointer.parent)
        expected = {lock_path: 0, blob: size, pointer: len(target)}
        try:
            os.symlink(target, pointer)
        except OSError as error:
            notes.append(f'symlink: {os.strerror(error.errno)}; the blob was '
                         f'moved to the snapshot instead, as huggingface_hub '
                         f'does without symlinks')
            hf_move(blob, pointer, notes)
            del expected[blob]
            expected[pointer] = size
        temporary = repo / 'refs' / f'main.{HF_UUID}.tmp'
        write_file(temporary, [HF_REVISION.encode()])
        os.replace(temporary, repo / 'refs' / 'main')
        expected[repo / 'refs' / 'main'] = len(HF_REVISION)
        fcntl.flock(lock, fcntl.LOCK_UN)
    finally:
        os.close(lock)
    return ({str(path.relative_to(root)): size
             for path, size in expected.items()}, notes)


def run_with_watchdog(action, timeout, on_timeout):
    """ACTION() in a thread; if it is not done within TIMEOUT seconds,
    on_timeout() (which kills the daemon, so that blocked system calls
    return) and BenchError."""
    outcome = {}

    def target():
        try:
            outcome['value'] = action()
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            outcome['error'] = error
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        on_timeout()
        thread.join(30)
        raise BenchError(f'the writes did not finish within {timeout:.0f} s; '
                         f'the daemon was killed (then the writer got: '
                         f'{outcome.get("error", "nothing yet")})')
    if 'error' in outcome:
        raise outcome['error']
    return outcome['value']


def write_timeout(payload, files):
    """Seconds a write row may take before it counts as hung."""
    return 60 + payload / MiB / 4 + files * 1.0


def describe_difference(found, expected):
    """What the bucket listing FOUND lacks or has too much, or ''."""
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    wrong = sorted(key for key in set(found) & set(expected)
                   if found[key] != expected[key])
    parts = []
    if missing:
        parts.append(f'{len(missing)} missing (such as {missing[0]})')
    if wrong:
        parts.append(f'{len(wrong)} of the wrong size (such as {wrong[0]}: '
                     f'{found[wrong[0]]} bytes, not {expected[wrong[0]]})')
    if extra:
        parts.append(f'{len(extra)} unexpected (such as {extra[0]})')
    return '; '.join(parts)


def read_stats(mountpoint):
    """s3cachefs's counters (the user.s3cachefs.stats attribute)."""
    text = os.getxattr(mountpoint, 'user.s3cachefs.stats').decode()
    return {name: float(value) if '.' in value else int(value)
            for name, value in (line.split() for line in text.splitlines())}


# ------------------------------------------------------------- bench

class Bench:
    """The data, the servers, the file systems, and the samples."""

    def __init__(self, args, cleanup):
        self.args = args
        self.cleanup = cleanup
        self.size = args.size_mib * MiB
        self.rows = set(args.only)
        self.workdir = Path(tempfile.mkdtemp(prefix='s3cachefs-bench.'))
        cleanup.push(self._remove_workdir)
        self.home = self.workdir / 'home'
        self.home.mkdir()
        self.local_dir = self.workdir / 'local'
        self.server = None
        self.tier_server = None  # the cluster rows' shared cache
        self.proxy = None
        self.file_systems = {}
        self.bindfs = None
        self.netrc = self.workdir / 'netrc'
        self.samples = []
        self.run_index = 0
        self.long_rows = set()  # (row, tool) not to run again
        self._cache_dirs = 0
        self.s3cachefs_options = None
        self.versions = {}
        self.failures = []      # {'row', 'tool', 'run', 'error'}
        self.s3 = None          # boto3, straight to the server
        self.write_pattern = Pattern(WRITE_SEED, WRITE_BLOCK)
        self.small_pattern = Pattern(WRITE_SEED + 1, SMALL_SIZE)
        self.dataset = None     # the tar of the untar row
        self.dataset_sizes = {}
        self.mpu_parts = []     # local part files of the raw_mpu row

    # ------------------------------------------------------ set-up
    def setup(self):
        args = self.args
        server_kind = servers.SERVER_KINDS[args.server]
        self.server = server_kind(self.workdir / 'server')
        print(f'bench: starting {args.server} in {self.workdir}', flush=True)
        self.server.start()
        self.cleanup.push(self.server.stop)
        self.server.create_bucket(BUCKET)
        self.s3 = self.server.client()
        if self.rows & CLUSTER_ROWS:
            self.tier_server = server_kind(self.workdir / 'tier-server')
            self.tier_server.start()
            self.cleanup.push(self.tier_server.stop)
            self.tier_server.create_bucket(TIER_BUCKET)
        self._upload()
        self._prepare_writes()
        self.proxy = LatencyProxy(self.server.endpoint, LATENCY)
        self.cleanup.push(self.proxy.stop)
        self.proxy.start()
        write_private(self.netrc, f'machine 127.0.0.1 login '
                                  f'{self.server.access_key} password '
                                  f'{self.server.secret_key}\n')
        self._make_file_systems()
        self.versions = {
            'kernel': os.uname().release,
            's3fs': first_line(['s3fs', '--version']),
            'rclone': first_line(['rclone', 'version']),
            'bindfs': first_line(['bindfs', '--version']),
            'fio': first_line(['fio', '--version']),
            'curl': first_line(['curl', '--version']),
        }
        if S3CACHEFS_TOOLS & set(self.file_systems):
            self.versions['s3cachefs'] = first_line(
                [self.args.s3cachefs_bin, '--version'])

    def _upload(self):
        """The large file (also kept locally for bindfs) and the small ones,
        straight to the server, not through the proxy; each only if a row
        reads it."""
        self.local_dir.mkdir()
        need_big = self.rows & (BIG_FILE_ROWS | CLUSTER_ROWS |
                                {'mmap', 'raw_get', 'bindfs'})
        need_small = self.rows & SMALL_FILE_ROWS
        if self.rows & set(KEYS_ROW_NAMES):
            self._put_keys()
        if not (need_big or need_small):
            return
        big = self.local_dir / BIG_KEY
        print(f'bench: uploading {self.args.size_mib if need_big else 0} MiB '
              f'and {self.args.small_files if need_small else 0} x '
              f'{SMALL_SIZE // 1024} KiB', flush=True)
        s3 = self.s3
        if need_big:
            with open(big, 'wb') as file:
                for _ in range(self.args.size_mib):
                    file.write(os.urandom(MiB))
            s3.upload_file(str(big), BUCKET, BIG_KEY,
                           Config=boto3.s3.transfer.TransferConfig(
                               multipart_threshold=SINGLE_PUT_LIMIT,
                               multipart_chunksize=64 * MiB,
                               max_concurrency=4))

        def put_small(index):
            s3.put_object(Bucket=BUCKET, Key=self.small_key(index),
                          Body=os.urandom(SMALL_SIZE))
        if need_small:
            with concurrent.futures.ThreadPoolExecutor(UPLOAD_THREADS) as \
                    pool:
                list(pool.map(put_small, range(self.args.small_files)))

    def _put_keys(self):
        """The --keys objects of the keys rows, straight to the server: on
        Swift written into its storage by Swift's own code
        (swift_seed.py: about 1300 a second here, against 250 through
        the API), elsewhere PUT by KEYS_UPLOADS processes."""
        count, dirs = self.args.keys, self.args.key_dirs
        names = [key_name(index, count, dirs) for index in range(count)]
        started = time.monotonic()
        if self.args.server == 'swift':
            swift_seed.seed(self.server.workdir, BUCKET, names,
                            self.args.key_bytes)
        else:
            server = self.server
            with concurrent.futures.ProcessPoolExecutor(KEYS_UPLOADS) as pool:
                list(pool.map(put_keys, *zip(*[
                    (server.endpoint, server.region, server.access_key,
                     server.secret_key, names[first:first + KEYS_PER_PUTTER],
                     self.args.key_bytes)
                    for first in range(0, count, KEYS_PER_PUTTER)])))
        print(f'bench: {count} keys of {self.args.key_bytes} bytes under '
              f'{KEYS_DIR}/'
              f'{f" in {dirs} directories" if dirs else ""} in '
              f'{time.monotonic() - started:.0f} s', flush=True)

    def _prepare_writes(self):
        """The dataset tar for untar and the part files for raw_mpu (the
        data write_big writes), on local disk, if those rows are wanted."""
        if 'untar' in self.rows:
            self.dataset = self.workdir / 'dataset.tar'
            self.dataset_sizes = make_dataset(self.dataset,
                                              self.args.tar_files)
            print(f'bench: dataset of {len(self.dataset_sizes)} files, '
                  f'{sum(self.dataset_sizes.values()) / MiB:.0f} MiB, '
                  f'tar {self.dataset.stat().st_size / MiB:.0f} MiB',
                  flush=True)
        if 'raw_mpu' in self.rows:
            parts_dir = self.workdir / 'mpu-parts'
            parts_dir.mkdir()
            part = None
            for data in self.write_pattern.stream(self.size):
                if part is None or part.tell() + len(data) > RAW_MPU_PART:
                    if part:
                        part.close()
                    path = parts_dir / f'part{len(self.mpu_parts) + 1:05d}'
                    self.mpu_parts.append(path)
                    part = open(path, 'wb')
                part.write(data)
            part.close()

    @staticmethod
    def small_key(index):
        return f'{SMALL_DIR}/f{index:05d}.bin'

    def _make_file_systems(self):
        args = self.args
        env = daemon_environment(self.home)
        endpoint = self.proxy.endpoint
        made = {}
        if S3CACHEFS_TOOLS & set(args.tools):
            binary = args.s3cachefs_bin
            help_text = subprocess.run([binary, '--help'], capture_output=True,
                                       text=True)
            has_cache = re.search(r'\bcache=',
                                  help_text.stdout + help_text.stderr)
            if args.s3cachefs_opts is not None:
                self.s3cachefs_options = args.s3cachefs_opts
            else:
                self.s3cachefs_options = S3CACHEFS_CACHE_OPTS if has_cache \
                    else ''
        if 's3cachefs' in args.tools:
            made['s3cachefs'] = S3cachefs(env, args.s3cachefs_bin, endpoint,
                                          self.server, self.s3cachefs_options,
                                          tier_server=self.tier_server)
        if 's3cachefs-wb' in args.tools:
            made['s3cachefs-wb'] = S3cachefs(
                env, args.s3cachefs_bin, endpoint, self.server,
                self.s3cachefs_options or '', writeback=True)
        if 's3cachefs-trust' in args.tools:
            made['s3cachefs-trust'] = S3cachefs(
                env, args.s3cachefs_bin, endpoint, self.server,
                self.s3cachefs_options, trust=KEYS_DIR)
        if 's3cachefs-nohead' in args.tools:
            made['s3cachefs-nohead'] = S3cachefs(
                env, args.s3cachefs_bin, endpoint, self.server,
                self.s3cachefs_options, no_headers=KEYS_DIR)
        if 's3fs' in args.tools:
            made['s3fs'] = S3fs(env, endpoint, self.server,
                                self.workdir / 's3fs.passwd', args.s3fs_opts)
        if 'rclone' in args.tools:
            made['rclone'] = Rclone(env, endpoint, self.server,
                                    self.workdir / 'rclone.conf',
                                    args.rclone_flags.split())
        self.file_systems = made
        self.bindfs = Bindfs(env, self.local_dir)

    def _remove_workdir(self):
        left = [p for p in fuse_mount_points()
                if p.startswith(str(self.workdir) + '/')]
        if left:
            print(f'bench: not removing {self.workdir}: still mounted: '
                  f'{", ".join(left)}', file=sys.stderr)
            return
        shutil.rmtree(self.workdir, ignore_errors=True)

    # ----------------------------------------------------- mounting
    def new_cache_dir(self, name):
        self._cache_dirs += 1
        path = self.workdir / 'cache' / f'{name}-{self._cache_dirs}'
        path.mkdir(parents=True)
        return path

    def mount(self, file_system, cache_dir, row=None):
        mountpoint = self.workdir / 'mnt' / file_system.name
        log = self.workdir / f'{file_system.name}.log'
        return Mount(file_system.name,
                     file_system.command(mountpoint, cache_dir, row),
                     file_system.env, mountpoint, log, self.cleanup).start()

    # --------------------------------------------------- measuring
    def measure(self, row, tool, action, pid=None, payload=None,
                disk=None):
        """Runs ACTION as row ROW of TOOL and records a sample: wall
        seconds, the dict ACTION may return, the proxy's counters and,
        with PID, the daemon's peak RSS and CPU time over the row. PAYLOAD
        is the bytes the row reads, for a MiB/s figure. ACTION's dict may
        set 'seconds' (the row's own timing), 'mib_written' (the payload of
        a write row) and 'notes' (a list of remarks)."""
        self.proxy.reset()
        stats = DaemonStats(pid) if pid is not None else None
        if stats:
            stats.begin()
        children_cpu = children_cpu_seconds()
        started = time.monotonic()
        result = action() or {}
        sample = {'row': row, 'tool': tool, 'run': self.run_index + 1,
                  'seconds': time.monotonic() - started, **result}
        seconds = sample['seconds']
        payload_mib = sample.get('mib_written') or \
            (payload / MiB if payload else None)
        if payload_mib:
            sample['mib_per_s'] = payload_mib / seconds
        if stats:
            sample.update(stats.end())
        elif row in ('raw_get', 'raw_mpu'):  # curl's CPU time
            sample['cpu_seconds'] = children_cpu_seconds() - children_cpu
        if payload and 'cpu_seconds' in sample and row in (*CPU_ROWS, 'bindfs'):
            sample['cpu_s_per_gib'] = sample['cpu_seconds'] / (payload / GiB)
        counters = self.proxy.counters()
        sample['requests'] = counters['counts']
        sample['mib_fetched'] = counters['bytes'] / MiB
        sample['mib_sent'] = counters.get('bytes_sent', 0) / MiB
        if disk is not None:
            sample['disk_mib'] = allocated_mib(disk)
        self.samples.append(sample)
        if self.args.request_log:
            with open(self.args.request_log, 'a') as log:
                log.write(f'# run {self.run_index + 1} {tool} {row}\n')
                for method, path, query, status in self.proxy.requests():
                    log.write(f'{method} {path}{"?" if query else ""}'
                              f'{query} {status}\n')
        if self.run_index == 0 and 0 < self.args.long_row < seconds:
            self.long_rows.add((row, tool))
        extra = ''
        if 'disk_mib' in sample:
            extra = (f' RSS {sample.get("peak_rss_mib", 0):.0f} MiB, '
                     f'disk {sample["disk_mib"]:.1f} MiB')
        if row in WRITE_ROW_NAMES or row == 'raw_mpu':
            extra = f' sent {sample["mib_sent"]:.1f} MiB'
            if 'wait_seconds' in sample:
                extra += (f', {sample["wait_seconds"]:.2f} s of it waiting '
                          f'for the bucket')
        print(f'  run {self.run_index + 1}: {tool:12} {row:11} '
              f'{format_result(ROWS_BY_NAME[row], sample):28} '
              f'{format_requests(sample["requests"])}{extra}', flush=True)
        for note in sample.get('notes', ()):
            print(f'    note: {note}', flush=True)

    def wanted(self, row, tool):
        """Whether ROW of TOOL is to be measured in this run: it was asked
        for, and its first run was not a long one (see --long-row)."""
        return row in self.rows and (row, tool) not in self.long_rows

    def step(self, row, tool, action, pid=None, payload=None, disk=None):
        """Measures ROW if it is wanted; otherwise just runs ACTION (it
        prepares a later row)."""
        if self.wanted(row, tool):
            self.measure(row, tool, action, pid, payload, disk)
        else:
            action()

    # ----------------------------------------------------------- rows
    def run(self):
        tools = list(self.file_systems)
        for run_index in range(self.args.runs):
            self.run_index = run_index
            print(f'bench: run {self.run_index + 1} of {self.args.runs}',
                  flush=True)
            self.limit_rows()
            # Rotate the order so no tool always runs first or last.
            shift = self.run_index % len(tools) if tools else 0
            for name in tools[shift:] + tools[:shift]:
                file_system = self.file_systems[name]
                if name in READ_TOOLS:
                    self.big_file_rows(file_system)
                    self.cluster_rows(file_system)
                    self.mmap_row(file_system)
                    self.small_file_rows(file_system)
                    self.listing_rows(file_system)
                if name in KEYS_TOOLS:
                    for op in KEY_OPS:
                        self.keys_rows(file_system, op)
                if name in WRITE_TOOLS:
                    for row in WRITE_ROW_NAMES:
                        self.write_row(row, file_system)

    def limit_rows(self):
        if self.wanted('raw_get', 'curl'):
            drop_caches()
            self.measure('raw_get', 'curl', self.raw_parallel_get,
                         payload=self.size)
        if self.wanted('bindfs', 'bindfs'):
            mount = self.mount(self.bindfs, None)
            try:
                drop_caches()
                self.measure('bindfs', 'bindfs', lambda: read_sequential(
                    mount.path / BIG_KEY, self.size), mount.pid, self.size)
            finally:
                mount.stop()
        if self.wanted('raw_mpu', 'curl'):
            prefix = self.write_prefix('raw_mpu', 'curl')
            try:
                self.measure('raw_mpu', 'curl', lambda:
                             self.raw_multipart_upload(f'{prefix}/big.bin'))
            except BenchError as error:
                self.fail('raw_mpu', 'curl', error)
            finally:
                self.delete_prefix(prefix)

    def curl_s3(self):
        """The curl options of a signed S3 request through the proxy."""
        return ['curl', '--silent', '--show-error', '--noproxy', '*',
                '--netrc-file', str(self.netrc),
                '--aws-sigv4', f'aws:amz:{self.server.region}:s3',
                '-H', 'x-amz-content-sha256: UNSIGNED-PAYLOAD']

    def raw_multipart_upload(self, key):
        """The data of write_big as a multipart upload through the proxy,
        with curl: CreateMultipartUpload, then parts of RAW_MPU_PART bytes
        from local files (in the page cache), RAW_MPU_PARALLEL at a time by
        one curl process (--parallel), then CompleteMultipartUpload. Query
        strings are written sorted and with '=' (this curl signs them as
        they are)."""
        url = f'{self.proxy.endpoint}/{BUCKET}/{urllib.parse.quote(key)}'
        started = time.monotonic()
        done = subprocess.run([*self.curl_s3(), '-X', 'POST',
                               f'{url}?uploads='],
                              capture_output=True, text=True)
        match = re.search(r'<UploadId>([^<]+)</UploadId>', done.stdout)
        if done.returncode != 0 or not match:
            raise BenchError(f'CreateMultipartUpload failed '
                             f'({done.returncode}): {done.stdout[-300:]} '
                             f'{done.stderr.strip()[-300:]}')
        upload_id = urllib.parse.quote(match.group(1), safe='-_.~')
        blocks = []
        for number, path in enumerate(self.mpu_parts, 1):
            blocks.append(''.join(
                f'{name} = {curl_config_value(value)}\n' for name, value in (
                    ('url', f'{url}?partNumber={number}&uploadId={upload_id}'),
                    ('upload-file', str(path)), ('output', '/dev/null'),
                    ('noproxy', '*'), ('netrc-file', str(self.netrc)),
                    ('aws-sigv4', f'aws:amz:{self.server.region}:s3'),
                    ('header', 'x-amz-content-sha256: UNSIGNED-PAYLOAD'),
                    ('header', 'Expect:'),
                    ('write-out',
                     f'{number} %{{http_code}} %header{{etag}}\\n'))))
        config = self.workdir / 'curl-parts.conf'
        config.write_text('next\n'.join(blocks))
        created = time.monotonic()
        done = subprocess.run(
            ['curl', '--silent', '--show-error', '--parallel',
             '--parallel-max', str(RAW_MPU_PARALLEL), '--config', str(config)],
            capture_output=True, text=True)
        etags = {}
        for line in done.stdout.splitlines():
            number, status, *etag = line.split(maxsplit=2)
            if status == '200' and etag:
                etags[int(number)] = etag[0].strip()
        if done.returncode != 0 or len(etags) != len(self.mpu_parts):
            raise BenchError(f'UploadPart: {len(etags)} of '
                             f'{len(self.mpu_parts)} parts uploaded '
                             f'(status {done.returncode}): '
                             f'{done.stdout[-300:]} '
                             f'{done.stderr.strip()[-300:]}')
        uploaded = time.monotonic()
        body = self.workdir / 'complete.xml'
        body.write_text('<CompleteMultipartUpload>' + ''.join(
            f'<Part><PartNumber>{number}</PartNumber><ETag>{etag}</ETag>'
            f'</Part>' for number, etag in sorted(etags.items()))
            + '</CompleteMultipartUpload>')
        done = subprocess.run(
            [*self.curl_s3(), '-X', 'POST', '-H',
             'Content-Type: application/xml', '--data-binary', f'@{body}',
             '--write-out', '\n%{http_code}', f'{url}?uploadId={upload_id}'],
            capture_output=True, text=True)
        if (done.returncode != 0 or not done.stdout.endswith('\n200')
                or '<Error>' in done.stdout):
            raise BenchError(f'CompleteMultipartUpload failed '
                             f'({done.returncode}): {done.stdout[-300:]} '
                             f'{done.stderr.strip()[-300:]}')
        completed = time.monotonic()
        size = self.s3.head_object(Bucket=BUCKET, Key=key)['ContentLength']
        if size != self.size:
            raise BenchError(f'the multipart upload made {size} bytes, not '
                             f'{self.size}')
        return {'seconds': completed - started,
                'mib_written': self.size / MiB,
                'notes': [f'create {created - started:.2f} s, parts '
                          f'{uploaded - created:.2f} s, complete '
                          f'{completed - uploaded:.2f} s']}

    def raw_parallel_get(self):
        """The large object in RAW_GET_RANGE ranges, RAW_GET_PARALLEL at a
        time, through the proxy, by one curl process (--parallel): no file
        system, no process start per range. Credentials come from a netrc
        file, since curl --user would split Swift's test:tester at its
        colon; s3rver and Swift both want x-amz-content-sha256."""
        url = f'{self.proxy.endpoint}/{BUCKET}/{BIG_KEY}'
        transfer = {
            'url': url, 'output': '/dev/null', 'noproxy': '*',
            'netrc-file': str(self.netrc),
            'aws-sigv4': f'aws:amz:{self.server.region}:s3',
            'header': 'x-amz-content-sha256: UNSIGNED-PAYLOAD',
            'write-out': '%{http_code} %{size_download}\\n',
        }
        blocks = []
        for start in range(0, self.size, RAW_GET_RANGE):
            end = min(start + RAW_GET_RANGE, self.size) - 1
            options = dict(transfer, range=f'{start}-{end}')
            blocks.append(''.join(f'{name} = {curl_config_value(value)}\n'
                                  for name, value in options.items()))
        config = self.workdir / 'curl-ranges.conf'
        config.write_text('next\n'.join(blocks))
        done = subprocess.run(
            ['curl', '--silent', '--show-error', '--fail', '--parallel',
             '--parallel-max', str(RAW_GET_PARALLEL), '--config', str(config)],
            capture_output=True, text=True)
        answers = [line.split() for line in done.stdout.splitlines()]
        fetched = sum(int(size) for status, size in answers
                      if status == '206')
        if done.returncode != 0 or fetched != self.size:
            raise BenchError(f'curl fetched {fetched} of {self.size} bytes '
                             f'(status {done.returncode}): '
                             f'{done.stderr.strip()[-500:]}')

    def big_file_rows(self, file_system):
        """cold, reread, fio and remount on one cache directory."""
        name = file_system.name
        if not any(self.wanted(row, name) for row in BIG_FILE_ROWS):
            return
        cache_dir = self.new_cache_dir(name)
        mount = self.mount(file_system, cache_dir)
        path = mount.path / BIG_KEY

        def read():
            read_sequential(path, self.size)
        try:
            drop_caches()
            self.step('cold', name, read, mount.pid, self.size)
            if self.wanted('reread', name):
                drop_caches()
                self.measure('reread', name, read, mount.pid, self.size)
            if self.wanted('fio', name):
                drop_caches()
                self.measure('fio', name, lambda: run_fio(path, self.size),
                             mount.pid)
            if self.wanted('remount', name):
                mount.stop()
                mount = self.mount(file_system, cache_dir)
                drop_caches()
                self.measure('remount', name, read, mount.pid, self.size)
        finally:
            mount.stop()
            shutil.rmtree(cache_dir)

    def cluster_rows(self, file_system):
        """CLUSTER_NODES mounts, each with a cache of its own, read the
        large file one after another (cluster_seq) and all at once
        (cluster_par), the shared cache emptied first. The proxy's bytes
        are what the cluster took from the bucket."""
        name = file_system.name
        for row in ('cluster_seq', 'cluster_par'):
            if self.wanted(row, name):
                self.empty_tier()
                self.measure(row, name, lambda row=row:
                             self.cluster_read(file_system, row))

    def empty_tier(self):
        if self.tier_server is None:
            return
        s3 = self.tier_server.client()
        listed = s3.get_paginator('list_objects_v2').paginate(
            Bucket=TIER_BUCKET)
        for page in listed:
            for item in page.get('Contents', []):
                s3.delete_object(Bucket=TIER_BUCKET, Key=item['Key'])

    def cluster_read(self, file_system, row):
        mounts, caches = [], []
        notes = []
        try:
            for node in range(CLUSTER_NODES):
                caches.append(self.new_cache_dir(f'{file_system.name}-n{node}'))
                path = self.workdir / 'mnt' / f'{file_system.name}-n{node}'
                mounts.append(Mount(
                    file_system.name,
                    file_system.command(path, caches[-1], row),
                    file_system.env, path,
                    self.workdir / f'{file_system.name}-n{node}.log',
                    self.cleanup).start())
            drop_caches()
            started = time.monotonic()
            if row == 'cluster_seq':
                seconds = 0.0
                for mount in mounts:
                    began = time.monotonic()
                    read_sequential(mount.path / BIG_KEY, self.size)
                    seconds += time.monotonic() - began
                    if file_system.name.startswith('s3cachefs'):
                        # the next node starts once this one's blocks are
                        # in the tier (nodes come minutes apart): not
                        # counted in the row's time
                        waited = time.monotonic()
                        wait_until(lambda: read_stats(mount.path)
                                   .get('tier_queued_bytes', 0) == 0,
                                   120, 'the writes to the shared cache')
                        notes.append(f'waited {time.monotonic() - waited:.1f} s '
                                     f'for the shared cache writes')
            else:
                with concurrent.futures.ThreadPoolExecutor(len(mounts)) as pool:
                    list(pool.map(lambda mount: read_sequential(
                        mount.path / BIG_KEY, self.size), mounts))
                seconds = time.monotonic() - started
            if file_system.name.startswith('s3cachefs'):
                stats = [read_stats(m.path) for m in mounts]
                tier = sum(s.get('bytes_from_tier', 0) for s in stats)
                notes.append(f'{tier / MiB:.0f} MiB from the shared cache')
                for node, s in enumerate(stats):
                    notes.append(
                        f'node {node}: {s.get("bytes_from_bucket", 0) / MiB:.0f} '
                        f'MiB from the bucket, '
                        f'{s.get("bytes_from_tier", 0) / MiB:.0f} from the '
                        f'shared cache; leases {s.get("tier_leases", 0)}, '
                        f'waits {s.get("tier_lease_waits", 0)} '
                        f'(met {s.get("tier_lease_waits_met", 0)}), '
                        f'errors {s.get("tier_errors", 0)}, '
                        f'bad {s.get("tier_bad_blocks", 0)}, '
                        f'dropped {s.get("tier_dropped_blocks", 0)}')
            return {'seconds': seconds, 'notes': notes}
        finally:
            for mount in mounts:
                mount.stop()
            for cache in caches:
                shutil.rmtree(cache, ignore_errors=True)

    def mmap_row(self, file_system):
        """The big file mapped and loaded in random order, on a cache of
        its own (cold)."""
        name = file_system.name
        if not self.wanted('mmap', name):
            return
        cache_dir = self.new_cache_dir(name)
        mount = self.mount(file_system, cache_dir)
        path = mount.path / BIG_KEY
        try:
            drop_caches()
            self.measure('mmap', name, lambda: mmap_load(path, self.size),
                         mount.pid, self.size)
        finally:
            mount.stop()
            shutil.rmtree(cache_dir)

    def small_file_rows(self, file_system):
        name = file_system.name
        if not (self.wanted('small_cold', name)
                or self.wanted('small_warm', name)):
            return
        cache_dir = self.new_cache_dir(name)
        mount = self.mount(file_system, cache_dir)
        paths = [mount.path / self.small_key(index)
                 for index in range(self.args.small_files)]
        payload = len(paths) * SMALL_SIZE

        def read():
            read_files_parallel(paths, SMALL_SIZE)
        try:
            drop_caches()
            self.step('small_cold', name, read, mount.pid, payload)
            if self.wanted('small_warm', name):
                drop_caches()
                self.measure('small_warm', name, read, mount.pid, payload)
        finally:
            mount.stop()
            shutil.rmtree(cache_dir)

    def listing_rows(self, file_system):
        name = file_system.name
        if not (self.wanted('ls_cold', name) or self.wanted('ls_warm', name)):
            return
        cache_dir = self.new_cache_dir(name)
        mount = self.mount(file_system, cache_dir)

        def list_small():
            list_long(mount.path / SMALL_DIR, self.args.small_files)
        try:
            self.step('ls_cold', name, list_small, mount.pid)
            if self.wanted('ls_warm', name):
                self.measure('ls_warm', name, list_small, mount.pid)
        finally:
            mount.stop()
            shutil.rmtree(cache_dir)


    def keys_rows(self, file_system, op):
        """The keys rows of OP: a fresh mount on an empty cache directory
        runs OP on the directory of --keys objects (cold, caches dropped),
        then again at once (warm), then after a remount on the same cache
        directory (caches dropped). Each sample has the daemon's peak RSS
        and the disk its cache directory takes (s3cachefs: the index of
        listings and attributes; no data is read)."""
        name = file_system.name
        rows = [f'keys_{op}_{phase}' for phase in KEY_PHASES]
        if not any(self.wanted(row, name) for row in rows):
            return
        cache_dir = self.new_cache_dir(name)
        mount = self.mount(file_system, cache_dir)
        count = self.args.keys

        def action():
            key_op(op, mount.path / KEYS_DIR, count, self.args.key_dirs,
                   self.args.key_bytes)
        try:
            drop_caches()
            self.step(rows[0], name, action, mount.pid, disk=cache_dir)
            if self.wanted(rows[1], name):
                self.measure(rows[1], name, action, mount.pid,
                             disk=cache_dir)
            if self.wanted(rows[2], name):
                mount.stop()
                mount = self.mount(file_system, cache_dir)
                drop_caches()
                self.measure(rows[2], name, action, mount.pid,
                             disk=cache_dir)
            if op == 'lsl' and name == 's3cachefs-trust' and \
                    self.wanted('keys_refresh', name):
                # what the trusted listings and attributes cost to forget
                self.measure('keys_refresh', name, lambda: run_counting(
                    [self.args.s3cachefs_bin, 'refresh',
                     str(mount.path / KEYS_DIR)], 1), mount.pid,
                    disk=cache_dir)
        except (BenchError, OSError, subprocess.SubprocessError) as error:
            self.fail(rows[0], name, error)
        finally:
            mount.stop()
            shutil.rmtree(cache_dir, ignore_errors=True)

    # ----------------------------------------------------- write rows
    def write_prefix(self, row, tool):
        return f'{WRITE_PREFIX}/{row}/{tool}-{self.run_index + 1}'

    def fail(self, row, tool, error):
        """Records that ROW of TOOL failed in this run, and goes on."""
        message = str(error) or type(error).__name__
        if isinstance(error, OSError) and error.filename:
            message = (f'{error.strerror or error} (errno '
                       f'{error.errno}): {error.filename}')
            if error.filename2:
                message += f' -> {error.filename2}'
        self.failures.append({'row': row, 'tool': tool,
                              'run': self.run_index + 1, 'error': message})
        print(f'  run {self.run_index + 1}: {tool:12} {row:11} FAILED: '
              f'{message}', flush=True)

    def bucket_files(self, prefix):
        """{key below PREFIX/: size} of the objects under PREFIX, directory
        markers (keys ending in /) left out; straight to the server."""
        found = {}
        pages = self.s3.get_paginator('list_objects_v2').paginate(
            Bucket=BUCKET, Prefix=prefix + '/')
        for page in pages:
            for item in page.get('Contents', []):
                if not item['Key'].endswith('/'):
                    found[item['Key'][len(prefix) + 1:]] = item['Size']
        return found

    def delete_prefix(self, prefix):
        """Deletes every object under PREFIX/ (so that the bucket does not
        grow from row to row: s3rver lists in time linear in its size)."""
        try:
            pages = self.s3.get_paginator('list_objects_v2').paginate(
                Bucket=BUCKET, Prefix=prefix + '/')
            for page in pages:
                keys = [{'Key': item['Key']}
                        for item in page.get('Contents', [])]
                if keys:
                    self.s3.delete_objects(Bucket=BUCKET, Delete={
                        'Objects': keys, 'Quiet': True})
        except Exception as error:  # noqa: BLE001 - a leftover, not fatal
            print(f'bench: could not delete {prefix}/: {error}',
                  file=sys.stderr)

    def write_workload(self, row, directory):
        """(workload, payload bytes, files) of ROW writing into DIRECTORY;
        workload() returns ({key below DIRECTORY: size}, notes)."""
        if row == 'write_big':
            def workload():
                write_file(directory / 'big.bin',
                           self.write_pattern.stream(self.size),
                           do_fsync=True)
                return {'big.bin': self.size}, []
            return workload, self.size, 1
        if row == 'write_small':
            count = self.args.small_files
            return (lambda: (write_small_files(directory, self.small_pattern,
                                               count), []),
                    count * SMALL_SIZE, count)
        if row == 'untar':
            def workload():
                untar(self.dataset, directory)
                return dict(self.dataset_sizes), []
            return (workload, sum(self.dataset_sizes.values()),
                    len(self.dataset_sizes))
        if row == 'hf_cache':
            size = self.args.hf_mib * MiB
            return (lambda: hf_cache_download(directory, self.write_pattern,
                                              size), size, 4)
        raise ValueError(row)

    def write_row(self, row, file_system):
        """One write row of one file system: a fresh mount on an empty
        cache directory, ROW's writes under a prefix of their own (made
        before the timing starts), timed until the data is in the bucket;
        then unmount and delete the prefix. A failure is recorded and the
        benchmark goes on."""
        name = file_system.name
        if not self.wanted(row, name):
            return
        prefix = self.write_prefix(row, name)
        cache_dir = self.new_cache_dir(name)
        mount = None
        try:
            mount = self.mount(file_system, cache_dir, row)
            directory = mount.path / prefix
            directory.mkdir(parents=True)
            workload, payload, files = self.write_workload(row, directory)
            drop_caches()
            self.measure(row, name, lambda: self.timed_write(
                file_system, mount, prefix, workload,
                write_timeout(payload, files)), mount.pid)
        except (BenchError, OSError, subprocess.SubprocessError) as error:
            self.fail(row, name, error)
        finally:
            if mount is not None:
                mount.stop()
            shutil.rmtree(cache_dir, ignore_errors=True)
            self.delete_prefix(prefix)

    def timed_write(self, file_system, mount, prefix, workload, timeout):
        """Runs WORKLOAD and waits until what it wrote is in the bucket:
        - 'close' file systems (s3cachefs, s3fs): done when the workload's
          last close returns; the bucket is listed once after that, and if
          it lacks anything, that is noted and the listing repeated every
          BUCKET_POLL seconds until it has everything;
        - 'stats' (s3cachefs -o writeback): done when uploads_pending is 0
          (read every STATS_POLL seconds); then one listing must agree;
        - 'poll' (rclone): the bucket is listed every BUCKET_POLL seconds;
          done when a listing returns with every object at its size and
          nothing else (temporary names gone).
        Listings go straight to the server, not through the proxy."""
        started = time.monotonic()
        stats_before = self.try_stats(mount)
        expected, notes = run_with_watchdog(workload, timeout,
                                            mount.process.kill)
        written = time.monotonic()
        deadline = written + timeout
        done = written
        if file_system.completion == 'stats':
            while True:
                stats = read_stats(mount.path)
                if 'uploads_pending' not in stats:
                    raise BenchError('no uploads_pending in '
                                     'user.s3cachefs.stats')
                failures = stats.get('upload_failures', 0) - \
                    (stats_before or {}).get('upload_failures', 0)
                if failures:
                    raise BenchError(f'upload_failures went up by {failures}')
                if stats['uploads_pending'] == 0:
                    break
                if time.monotonic() > deadline:
                    raise BenchError(f'uploads_pending still '
                                     f'{stats["uploads_pending"]} after '
                                     f'{deadline - written:.0f} s')
                time.sleep(STATS_POLL)
            done = time.monotonic()
            difference = describe_difference(self.bucket_files(prefix),
                                             expected)
            if difference:
                raise BenchError(f'uploads_pending is 0 but the bucket has '
                                 f'{difference}')
        else:
            late = False
            while True:
                difference = describe_difference(self.bucket_files(prefix),
                                                 expected)
                if not difference:
                    break
                if not late and file_system.completion == 'close':
                    notes.append(f'not all in the bucket when close '
                                 f'returned: {difference}')
                late = True
                if time.monotonic() > deadline:
                    raise BenchError(f'after {deadline - written:.0f} s the '
                                     f'bucket still has {difference}')
                time.sleep(BUCKET_POLL)
            if file_system.completion == 'poll' or late:
                done = time.monotonic()
        result = {'seconds': done - started, 'wait_seconds': done - written,
                  'mib_written': sum(expected.values()) / MiB,
                  'notes': notes}
        stats_after = self.try_stats(mount)
        if stats_before and stats_after:
            result['s3cachefs_counters'] = {
                name: stats_after[name] - stats_before.get(name, 0)
                for name in ('bytes_written', 'bytes_to_bucket',
                             'uploads_completed', 'upload_failures')
                if name in stats_after}
        return result

    @staticmethod
    def try_stats(mount):
        """s3cachefs's counters, or None (another file system)."""
        if not mount.tool.startswith('s3cachefs'):
            return None
        try:
            return read_stats(mount.path)
        except OSError:
            return None


# ------------------------------------------------------------ report

MEDIAN_FIELDS = ('disk_mib', 'seconds', 'iops', 'mib_per_s', 'mib_fetched',
                 'mib_sent', 'mib_written', 'wait_seconds', 'peak_rss_mib',
                 'cpu_seconds', 'cpu_s_per_gib')
# Targets of the write path.
TARGET_BIG_VS_LIMIT = 1.3     # write_big: at most 1.3x the raw multipart time
TARGET_SMALL_VS_S3FS = 2.0    # write_small, default mode: 2x s3fs's speed
TARGET_SMALL_WB_VS_RCLONE = 1.0  # write_small, writeback: rclone's speed
TARGET_SENT_SLACK = 1.01      # sent / written, for request bodies like XML


def medians(samples):
    """{(row, tool): median sample} over the runs of each row and tool."""
    grouped = collections.defaultdict(list)
    for sample in samples:
        grouped[sample['row'], sample['tool']].append(sample)
    result = {}
    for key, group in grouped.items():
        median = {'row': key[0], 'tool': key[1], 'runs': len(group)}
        for field in MEDIAN_FIELDS:
            values = [s[field] for s in group if field in s]
            if values:
                median[field] = statistics.median(values)
        kinds = sorted({kind for s in group for kind in s['requests']})
        median['requests'] = {kind: statistics.median(
            s['requests'].get(kind, 0) for s in group) for kind in kinds}
        result[key] = median
    return result


def speed_ratio(row, sample, reference):
    """How fast SAMPLE is against REFERENCE (both medians of ROW's metric):
    above 1 is faster, below 1 slower."""
    if sample is None or reference is None:
        return None
    if row.metric == 'iops':
        return sample['iops'] / reference['iops']
    return reference['seconds'] / sample['seconds']


def add_ratios(table):
    """Sets vs_peer (against the best of s3fs and rclone in that row) and
    vs_limit (against the row's limit) on every median of TABLE."""
    for (row_name, tool), median in table.items():
        row = ROWS_BY_NAME[row_name]
        peers = [table[row_name, peer] for peer in PEERS
                 if (row_name, peer) in table]
        best = None
        if peers:
            pick = max if row.metric == 'iops' else min
            best = pick(peers, key=lambda m: m[row.metric])
        median['vs_peer'] = speed_ratio(row, median, best)
        limit = table.get((row.limit, limit_tool(row.limit))) \
            if row.limit else None
        median['vs_limit'] = speed_ratio(row, median, limit)


def limit_tool(limit_row):
    return 'bindfs' if limit_row == 'bindfs' else 'curl'


def format_result(row, sample):
    if row.metric == 'iops':
        return f'{sample["iops"]:,.0f} IOPS, {sample["mib_per_s"]:.1f} MiB/s'
    seconds = sample['seconds']
    text = f'{seconds:.2f} s' if seconds >= 0.1 else f'{seconds:.2g} s'
    if 'mib_per_s' in sample:
        text += f', {sample["mib_per_s"]:.0f} MiB/s'
    return text


# The subsets of a kind that latency_proxy.py counts, shown in brackets.
REQUEST_SUBSETS = {'GET': (('GET_RANGE', 'ranged'),),
                   'PUT': (('PUT_PART', 'part'), ('COPY', 'copy')),
                   'POST': (('MPU', 'mpu'),)}


def format_requests(counts):
    """'GET 256 (256 ranged) HEAD 1 LIST 2 PUT 64 (63 part)': requests by
    kind, with subsets in brackets (mpu: multipart uploads created)."""
    parts = []
    for kind in ('GET', 'HEAD', 'LIST', 'PUT', 'POST', 'DELETE', 'OTHER'):
        count = counts.get(kind, 0)
        if not count:
            continue
        text = f'{kind} {count:g}'
        subsets = [f'{counts[subset]:g} {label}'
                   for subset, label in REQUEST_SUBSETS.get(kind, ())
                   if counts.get(subset)]
        if subsets:
            text += f' ({", ".join(subsets)})'
        parts.append(text)
    return ' '.join(parts) or '-'


def format_number(value, spec):
    return '-' if value is None else format(value, spec)


def format_table(header, lines, left=(0, 1, 6)):
    widths = [max(len(str(cell)) for cell in column)
              for column in zip(header, *lines)]
    rendered = []
    for line in (header, *lines):
        rendered.append('  '.join(
            str(cell).ljust(width) if index in left
            else str(cell).rjust(width)
            for index, (cell, width) in enumerate(zip(line, widths))).rstrip())
    rendered.insert(1, '-' * len(rendered[0]))
    return '\n'.join(rendered)


def report(table, tool_order, failures=(), samples=(), keys=None):
    header = ('row', 'tool', 'runs', 'median', 'vs peer', 'vs limit',
              'requests', 'MiB fetched', 'MiB sent', 'RSS MiB', 'CPU s',
              'disk MiB')
    failed = collections.Counter((f['row'], f['tool']) for f in failures)
    lines = []
    for row in ROWS + WRITE_ROWS + LIMIT_ROWS + KEYS_ROWS:
        title = row.title.format(keys=keys) if row in KEYS_ROWS else row.title
        for tool in (*tool_order, 'curl', 'bindfs'):
            median = table.get((row.name, tool))
            failed_runs = failed.get((row.name, tool), 0)
            if median is None and failed_runs:
                lines.append((title, tool, f'0 ({failed_runs} failed)',
                              'FAILED', *['-'] * 8))
            if median is None:
                continue
            runs = str(median['runs'])
            if failed_runs:
                runs += f' ({failed_runs} failed)'
            lines.append((
                title, tool, runs, format_result(row, median),
                format_number(median.get('vs_peer'), '.2f'),
                format_number(median.get('vs_limit'), '.2f'),
                format_requests(median['requests']),
                format_number(median.get('mib_fetched'), '.1f'),
                format_number(median.get('mib_sent'), '.1f'),
                format_number(median.get('peak_rss_mib'), '.0f'),
                format_number(median.get('cpu_seconds'), '.2f'),
                format_number(median.get('disk_mib'), '.1f')))
    print(format_table(header, lines))
    print('vs peer: speed against the best of s3fs and rclone in the row; '
          'vs limit: speed against the limit row (above 1 is faster); '
          'write rows are timed until the data is in the bucket; '
          'disk MiB (keys rows): what the cache directory takes '
          '(s3cachefs: its index)')

    print('\nlimits:')
    for row in LIMIT_ROWS:
        median = table.get((row.name, limit_tool(row.name)))
        if median:
            print(f'  {row.title.removeprefix("limit: ")}: '
                  f'{format_result(row, median)}')
    report_cpu(table, tool_order)
    checks = (('cold', 'cold read vs raw GET limit'),
              ('reread', 're-read vs FUSE ceiling'),
              ('remount', 'remount re-read vs FUSE ceiling'),
              ('write_big', 'large write + fsync vs raw multipart'))
    for tool in tool_order:
        ratios = [f'{label} {table[row, tool]["vs_limit"]:.2f}'
                  for row, label in checks
                  if (row, tool) in table
                  and table[row, tool]['vs_limit'] is not None]
        if ratios:
            print(f'  {tool}: ' + '; '.join(ratios))
    report_targets(table, tool_order)
    noted = [sample for sample in samples if sample.get('notes')]
    if noted:
        print('\nnotes:')
        for sample in noted:
            for note in sample['notes']:
                print(f'  run {sample["run"]}: {sample["tool"]} '
                      f'{sample["row"]}: {note}')
    if failures:
        print('\nfailures:')
        for failure in failures:
            print(f'  run {failure["run"]}: {failure["tool"]} '
                  f'{failure["row"]}: {failure["error"]}')


def report_cpu(table, tool_order):
    """Daemon CPU seconds (user + system, all threads) per GiB read: the
    cold sequential read and the re-read with the page cache dropped
    (warm: from the tool's own cache), beside bindfs's read of the local
    copy (a FUSE daemon that only passes bytes: it has no cold read, so
    its one figure shows in both columns, and the cold verdict leaves it
    out)."""
    lines = []
    for tool in (*tool_order, 'bindfs'):
        cells = []
        for row in (('bindfs',) * 2 if tool == 'bindfs' else CPU_ROWS):
            median = table.get((row, tool))
            cells.append(format_number(median and median.get('cpu_s_per_gib'),
                                       '.2f'))
        if any(cell != '-' for cell in cells):
            lines.append((tool, *cells))
    if not lines:
        return
    print('\ndaemon CPU s per GiB read (user + system, medians):')
    print(format_table(('tool', 'cold', 'warm'), lines, left=(0,)))
    mine = table.get(('cold', 's3cachefs')), table.get(('reread', 's3cachefs'))
    for label, median, row in (('cold', mine[0], 'cold'),
                               ('warm', mine[1], 'reread')):
        others = [table[row, t]['cpu_s_per_gib'] for t in PEERS
                  if (row, t) in table and 'cpu_s_per_gib' in table[row, t]]
        # bindfs reads a local file: a floor for a read from a cache,
        # not for one that fetches
        if row == 'reread' and ('bindfs', 'bindfs') in table:
            others.append(table['bindfs', 'bindfs'].get('cpu_s_per_gib'))
        others = [value for value in others if value is not None]
        if median is None or 'cpu_s_per_gib' not in median or not others:
            continue
        print(f'  s3cachefs {label}: {median["cpu_s_per_gib"]:.2f} CPU s/GiB, '
              f'below every peer ({min(others):.2f}'
              f'{", bindfs included" if row == "reread" else ""}): '
              f'{verdict(median["cpu_s_per_gib"] < min(others))}')


def verdict(met):
    return 'met' if met else 'MISSED'


def report_targets(table, tool_order):
    """The write path's targets next to the figures."""
    if not any(row in WRITE_ROW_NAMES for row, _ in table):
        return
    print('\nwrite targets:')
    limit = table.get(('raw_mpu', 'curl'))
    print(f'  large file + fsync within {TARGET_BIG_VS_LIMIT:.1f}x the time '
          f'of the raw multipart upload'
          + (f' ({limit["seconds"]:.2f} s):' if limit else
             ' (limit not measured):'))
    for tool in ('s3cachefs', 's3cachefs-wb'):
        median = table.get(('write_big', tool))
        if tool not in tool_order:
            continue
        if median is None or limit is None:
            print(f'    {tool}: not measured')
            continue
        times = median['seconds'] / limit['seconds']
        print(f'    {tool}: {median["seconds"]:.2f} s = {times:.2f}x: '
              f'{verdict(times <= TARGET_BIG_VS_LIMIT)}')
    print('  64 KiB files:')
    for tool, peer, target, mode in (
            ('s3cachefs', 's3fs', TARGET_SMALL_VS_S3FS, 'default mode'),
            ('s3cachefs-wb', 'rclone', TARGET_SMALL_WB_VS_RCLONE,
             '-o writeback')):
        if tool not in tool_order:
            continue
        mine = table.get(('write_small', tool))
        theirs = table.get(('write_small', peer))
        text = f'    {mode}, at least {target:.0f}x the speed of {peer}: '
        if mine is None or theirs is None:
            print(text + 'not measured')
            continue
        speed = theirs['seconds'] / mine['seconds']
        print(text + f'{tool} {mine["seconds"]:.2f} s vs '
              f'{theirs["seconds"]:.2f} s = {speed:.2f}x: '
              f'{verdict(speed >= target)}')
    print(f'  data sent = data written (MiB sent / MiB written, at most '
          f'{TARGET_SENT_SLACK:.2f}):')
    for tool in ('s3cachefs', 's3cachefs-wb'):
        if tool not in tool_order:
            continue
        ratios = []
        for row in WRITE_ROW_NAMES:
            median = table.get((row, tool))
            if median and median.get('mib_written'):
                ratios.append((row, median['mib_sent']
                               / median['mib_written']))
        if not ratios:
            print(f'    {tool}: not measured')
            continue
        print(f'    {tool}: ' + ', '.join(f'{row} {ratio:.3f}'
                                          for row, ratio in ratios)
              + f': {verdict(all(r <= TARGET_SENT_SLACK for _, r in ratios))}')


# -------------------------------------------------------------- main

def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Read and write benchmark of s3cachefs against s3fs '
                    'and rclone through a proxy adding 20 ms to every '
                    'request; see tests/bench/README.md.')
    parser.add_argument('--server', choices=sorted(servers.SERVER_KINDS),
                        default='s3rver')
    parser.add_argument('--size-mib', type=int, metavar='MIB',
                        help='size of the large file, read and written '
                             '(default 1024; --quick: 256)')
    parser.add_argument('--small-files', type=int, metavar='N',
                        help='number of 64 KiB files, read and written '
                             '(default 2000; --quick: 500)')
    parser.add_argument('--hf-mib', type=int, metavar='MIB',
                        help='size of the Hugging Face blob (default 500; '
                             '--quick: 128)')
    parser.add_argument('--tar-files', type=int, metavar='N',
                        help='files in the untar dataset (default 2000, '
                             'some 160 MiB; --quick: 300)')
    parser.add_argument('--runs', type=int, metavar='N',
                        help='runs of each row; the median is reported '
                             '(default 3; --quick: 1)')
    parser.add_argument('--quick', action='store_true',
                        help='a smoke run: 256 MiB, 500 small files, a '
                             '128 MiB blob, 300 files in the dataset, 1 run')
    row_names = [row.name for row in ALL_ROWS]
    default_rows = [name for name in row_names if name not in KEYS_ROW_NAMES]
    parser.add_argument('--only', default=','.join(default_rows),
                        metavar='ROW,...',
                        help=f'rows to measure, from {",".join(row_names)} '
                             f'("keys": all keys_ rows, which only run when '
                             f'named)')
    parser.add_argument('--keys', type=int, default=KEYS_DEFAULT,
                        metavar='N',
                        help=f'objects in the directory of the keys rows '
                             f'(default {KEYS_DEFAULT})')
    parser.add_argument('--key-dirs', type=int, default=0, metavar='N',
                        help='spread the keys over N directories of keys/ '
                             '(a tree: keys/dNNNN/fNNNNNNN; default 0, '
                             'all in keys/)')
    parser.add_argument('--key-bytes', type=int, default=KEY_SIZE,
                        metavar='BYTES',
                        help=f'bytes of each of those objects (default '
                             f'{KEY_SIZE}; s3cachefs answers a cold walk '
                             f'of objects of 4096 bytes or more without a '
                             f'HEAD, smaller ones may be symbolic links)')
    parser.add_argument('--tools', default=','.join(TOOLS),
                        metavar='TOOL,...',
                        help='file systems to compare, from '
                             f'{",".join(TOOLS)}')
    parser.add_argument('--s3cachefs-bin', metavar='PATH',
                        help='the s3cachefs binary (default: src/s3cachefs '
                             'or build-plain/src/s3cachefs, whichever exists)')
    parser.add_argument('--s3cachefs-opts', metavar='OPTS',
                        help='extra -o options for s3cachefs; {cache_dir} '
                             'stands for the cache directory of the run '
                             f'(default: {S3CACHEFS_CACHE_OPTS} when '
                             's3cachefs --help mentions cache=, else none)')
    parser.add_argument('--s3fs-opts', default='', metavar='OPTS',
                        help='extra -o options for s3fs')
    parser.add_argument('--rclone-flags', default='', metavar='FLAGS',
                        help='extra flags for rclone mount, space-separated')
    parser.add_argument('--long-row', type=float, default=LONG_ROW_SECONDS,
                        metavar='SECONDS',
                        help='a row whose first run takes longer than this '
                             'many seconds is not run again: so long a '
                             'measurement already averages out the noise '
                             f'(default {LONG_ROW_SECONDS:.0f}; 0 repeats '
                             'every row)')
    parser.add_argument('--no-install', action='store_true',
                        help='do not run tests/bench/install-deps.sh')
    parser.add_argument('--request-log', type=Path, metavar='FILE',
                        help='append every request the proxy saw during '
                             'each row to this file (method, path, query, '
                             'status)')
    parser.add_argument('--json', type=Path, metavar='FILE',
                        help='write the configuration, every sample and '
                             'the medians to this file')
    args = parser.parse_args(argv)
    for name, default in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, QUICK[name] if args.quick else default)
    if min(args.size_mib, args.small_files, args.runs, args.hf_mib,
           args.tar_files) < 1:
        parser.error('--size-mib, --small-files, --hf-mib, --tar-files and '
                     '--runs must be positive')
    args.only = [name for item in args.only.split(',')
                 for name in (KEYS_ROW_NAMES if item == 'keys' else (item,))]
    if args.keys < 1:
        parser.error('--keys must be positive')
    if args.key_bytes < 0:
        parser.error('--key-bytes must not be negative')
    if not 0 <= args.key_dirs <= args.keys:
        parser.error('--key-dirs must be from 0 to --keys')
    args.tools = args.tools.split(',')
    unknown = [n for n in args.only if n not in row_names] + \
        [n for n in args.tools if n not in TOOLS]
    if unknown:
        parser.error(f'unknown row or tool: {", ".join(unknown)}')
    if args.s3cachefs_bin is None:
        built = [path for path in DEFAULT_BINARIES if os.access(path, os.X_OK)]
        args.s3cachefs_bin = str(built[0] if built else DEFAULT_BINARIES[0])
    if (S3CACHEFS_TOOLS & set(args.tools)
            and not os.access(args.s3cachefs_bin, os.X_OK)):
        parser.error(f'{args.s3cachefs_bin} is not an executable: build '
                     f's3cachefs or pass --s3cachefs-bin')
    args.s3cachefs_bin = str(Path(args.s3cachefs_bin).resolve())
    return args


def write_json(path, args, bench, table):
    document = {
        'config': {
            'server': args.server, 'size_mib': args.size_mib,
            'small_files': args.small_files, 'small_file_kib':
            SMALL_SIZE // 1024, 'runs': args.runs, 'rows': args.only,
            'tools': args.tools, 'latency_seconds': LATENCY,
            'long_row_seconds': args.long_row,
            'small_readers': SMALL_READERS,
            'raw_get': {'parallel': RAW_GET_PARALLEL,
                        'range_mib': RAW_GET_RANGE // MiB},
            'fio': {'runtime_seconds': FIO_RUNTIME, 'jobs': FIO_JOBS},
            'writes': {'block_mib': WRITE_BLOCK // MiB,
                       'small_writers': SMALL_WRITERS,
                       'hf_mib': args.hf_mib, 'tar_files': args.tar_files,
                       'bucket_poll_seconds': BUCKET_POLL,
                       'stats_poll_seconds': STATS_POLL},
            'raw_mpu': {'parallel': RAW_MPU_PARALLEL,
                        'part_mib': RAW_MPU_PART // MiB},
            'keys': args.keys, 'key_dirs': args.key_dirs,
            'key_bytes': args.key_bytes,
            's3cachefs_bin': args.s3cachefs_bin,
            's3cachefs_options': bench.s3cachefs_options,
            's3fs_options': args.s3fs_opts,
            'rclone_flags': args.rclone_flags,
        },
        'versions': bench.versions,
        'samples': bench.samples,
        'failures': bench.failures,
        'medians': list(table.values()),
    }
    path.write_text(json.dumps(document, indent=2) + '\n')


def main(argv=None):
    args = parse_args(argv)
    if os.geteuid() != 0:
        print('bench: run as root (FUSE mounts, drop_caches, apt-get)',
              file=sys.stderr)
        return 2
    if not args.no_install:
        subprocess.run([str(BENCH_DIR / 'install-deps.sh')], check=True)
    cleanup = Cleanup()
    atexit.register(cleanup.run)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, exit_on_signal)
    try:
        bench = Bench(args, cleanup)
        bench.setup()
        print(f'bench: {args.server}, {args.size_mib} MiB file, '
              f'{args.small_files} x 64 KiB, {args.hf_mib} MiB blob, '
              f'{args.tar_files} files to untar, {args.runs} run(s), '
              f'{LATENCY * 1000:.0f} ms per request; s3cachefs options: '
              f'{bench.s3cachefs_options or "(none)"}', flush=True)
        for tool, version in bench.versions.items():
            print(f'  {tool}: {version}')
        bench.run()
        table = medians(bench.samples)
        add_ratios(table)
        print()
        report(table, [t for t in TOOLS if t in args.tools], bench.failures,
               bench.samples, args.keys)
        if args.json:
            write_json(args.json, args, bench, table)
            print(f'\nbench: wrote {args.json}')
    except KeyboardInterrupt:
        print('\nbench: interrupted, cleaning up', file=sys.stderr)
        return 130
    except (BenchError, servers.ServerError) as error:
        print(f'bench: {error}', file=sys.stderr)
        return 1
    finally:
        cleanup.run()
    return 0


if __name__ == '__main__':
    sys.exit(main())
