#!/usr/bin/python3
"""Read benchmark: s3cachefs against s3fs and rclone mount, with the bucket
20 ms away, and the two limits of this machine.

    /usr/bin/python3 tests/bench/bench.py [--quick] [--server s3rver|swift]
        [--size-mib 1024] [--small-files 2000] [--runs 3] [--only ROW,...]
        [--tools s3cachefs,s3fs,rclone] [--s3cachefs-bin PATH]
        [--s3cachefs-opts OPTS] [--json out.json]

As root, it installs what it lacks (tests/bench/install-deps.sh), starts an
S3 server on loopback (tests/harness/servers.py), uploads one large random
file and many 64 KiB files, and puts tests/bench/latency_proxy.py in front
of the server: every request waits 20 ms there, as if the bucket were
remote. Each file system mounts the bucket through that proxy; each row
(see ROWS and tests/bench/README.md) is run --runs times and the median is
reported, with the requests the proxy saw, the bytes it sent, and the
daemon's peak RSS and CPU time during the row.

Everything it starts is stopped, everything it mounts is unmounted and its
temporary directory removed, on success, error, Ctrl-C or SIGTERM.
"""
import argparse
import atexit
import collections
import concurrent.futures
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3.s3.transfer

BENCH_DIR = Path(__file__).resolve().parent
SRCDIR = BENCH_DIR.parents[1]
sys.path.insert(0, str(SRCDIR / 'tests' / 'harness'))
import servers  # noqa: E402

SYSTEM_PYTHON = '/usr/bin/python3'
MiB = 1 << 20
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
TOOLS = ('s3cachefs', 's3fs', 'rclone')
PEERS = ('s3fs', 'rclone')
QUICK = {'size_mib': 256, 'small_files': 500, 'runs': 1}
DEFAULTS = {'size_mib': 1024, 'small_files': 2000, 'runs': 3}
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
    Row('reread', 're-read, page cache dropped', 'seconds', 'bindfs'),
    Row('fio', 'fio 4 KiB random reads', 'iops', None),
    Row('remount', 're-read after remount', 'seconds', 'bindfs'),
    Row('small_cold', f'small files, {SMALL_READERS} readers, cold',
        'seconds', None),
    Row('small_warm', f'small files, {SMALL_READERS} readers, warm',
        'seconds', None),
    Row('ls_cold', 'ls -l of small/, cold', 'seconds', None),
    Row('ls_warm', 'ls -l of small/, warm', 'seconds', None),
)
LIMIT_ROWS = (
    Row('raw_get', f'limit: {RAW_GET_PARALLEL} parallel ranged GETs (curl)',
        'seconds', None),
    Row('bindfs', 'limit: FUSE ceiling (bindfs, local file)', 'seconds',
        None),
)
ROWS_BY_NAME = {row.name: row for row in ROWS + LIMIT_ROWS}
BIG_FILE_ROWS = {'cold', 'reread', 'fio', 'remount'}


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
    returns its argv; env is its environment."""
    name = None

    def __init__(self, env):
        self.env = env

    def command(self, mountpoint, cache_dir):
        raise NotImplementedError


class S3cachefs(FileSystem):
    name = 's3cachefs'

    def __init__(self, env, binary, endpoint, server, options):
        super().__init__(dict(env, AWS_ACCESS_KEY_ID=server.access_key,
                              AWS_SECRET_ACCESS_KEY=server.secret_key))
        self.binary = binary
        self.endpoint = endpoint
        self.options = options

    def command(self, mountpoint, cache_dir):
        options = [f'endpoint={self.endpoint}']
        if self.options:
            options.append(self.options.format(cache_dir=cache_dir))
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

    def command(self, mountpoint, cache_dir):
        options = [f'url={self.endpoint}', 'use_path_request_style',
                   f'passwd_file={self.passwd_file}',
                   f'use_cache={cache_dir}']
        if self.options:
            options.append(self.options)
        return ['s3fs', BUCKET, str(mountpoint), '-f',
                '-o', ','.join(options)]


class Rclone(FileSystem):
    name = 'rclone'

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

    def command(self, mountpoint, cache_dir):
        return ['rclone', 'mount', f'bench:{BUCKET}', str(mountpoint),
                '--config', str(self.config_file),
                '--vfs-cache-mode', 'full', '--cache-dir', str(cache_dir),
                *self.flags]


class Bindfs(FileSystem):
    """A FUSE passthrough of a local directory: the FUSE ceiling."""
    name = 'bindfs'

    def __init__(self, env, source):
        super().__init__(env)
        self.source = source

    def command(self, mountpoint, cache_dir):
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

    # ------------------------------------------------------ set-up
    def setup(self):
        args = self.args
        server_kind = servers.SERVER_KINDS[args.server]
        self.server = server_kind(self.workdir / 'server')
        print(f'bench: starting {args.server} in {self.workdir}', flush=True)
        self.server.start()
        self.cleanup.push(self.server.stop)
        self.server.create_bucket(BUCKET)
        self._upload()
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
        if 's3cachefs' in self.file_systems:
            self.versions['s3cachefs'] = first_line(
                [self.file_systems['s3cachefs'].binary, '--version'])

    def _upload(self):
        """The large file (also kept locally for bindfs) and the small ones,
        straight to the server, not through the proxy."""
        self.local_dir.mkdir()
        big = self.local_dir / BIG_KEY
        print(f'bench: uploading {self.args.size_mib} MiB and '
              f'{self.args.small_files} x {SMALL_SIZE // 1024} KiB',
              flush=True)
        with open(big, 'wb') as file:
            for _ in range(self.args.size_mib):
                file.write(os.urandom(MiB))
        s3 = self.server.client()
        s3.upload_file(str(big), BUCKET, BIG_KEY,
                       Config=boto3.s3.transfer.TransferConfig(
                           multipart_threshold=SINGLE_PUT_LIMIT,
                           multipart_chunksize=64 * MiB, max_concurrency=4))

        def put_small(index):
            s3.put_object(Bucket=BUCKET, Key=self.small_key(index),
                          Body=os.urandom(SMALL_SIZE))
        with concurrent.futures.ThreadPoolExecutor(UPLOAD_THREADS) as pool:
            list(pool.map(put_small, range(self.args.small_files)))

    @staticmethod
    def small_key(index):
        return f'{SMALL_DIR}/f{index:05d}.bin'

    def _make_file_systems(self):
        args = self.args
        env = daemon_environment(self.home)
        endpoint = self.proxy.endpoint
        made = {}
        if 's3cachefs' in args.tools:
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
            made['s3cachefs'] = S3cachefs(env, binary, endpoint, self.server,
                                          self.s3cachefs_options)
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

    def mount(self, file_system, cache_dir):
        mountpoint = self.workdir / 'mnt' / file_system.name
        log = self.workdir / f'{file_system.name}.log'
        return Mount(file_system.name,
                     file_system.command(mountpoint, cache_dir),
                     file_system.env, mountpoint, log, self.cleanup).start()

    # --------------------------------------------------- measuring
    def measure(self, row, tool, action, pid=None, payload=None):
        """Runs ACTION as row ROW of TOOL and records a sample: wall
        seconds, the dict ACTION may return, the proxy's counters and,
        with PID, the daemon's peak RSS and CPU time over the row. PAYLOAD
        is the bytes the row reads, for a MiB/s figure."""
        self.proxy.reset()
        stats = DaemonStats(pid) if pid is not None else None
        if stats:
            stats.begin()
        children_cpu = children_cpu_seconds()
        started = time.monotonic()
        result = action() or {}
        seconds = time.monotonic() - started
        sample = {'row': row, 'tool': tool, 'run': self.run_index + 1,
                  'seconds': seconds, **result}
        if payload:
            sample['mib_per_s'] = payload / MiB / seconds
        if stats:
            sample.update(stats.end())
        elif row == 'raw_get':  # curl's CPU time
            sample['cpu_seconds'] = children_cpu_seconds() - children_cpu
        counters = self.proxy.counters()
        sample['requests'] = counters['counts']
        sample['mib_fetched'] = counters['bytes'] / MiB
        self.samples.append(sample)
        if self.run_index == 0 and 0 < self.args.long_row < seconds:
            self.long_rows.add((row, tool))
        print(f'  run {self.run_index + 1}: {tool:9} {row:10} '
              f'{format_result(ROWS_BY_NAME[row], sample):28} '
              f'{format_requests(sample["requests"])}', flush=True)

    def wanted(self, row, tool):
        """Whether ROW of TOOL is to be measured in this run: it was asked
        for, and its first run was not a long one (see --long-row)."""
        return row in self.rows and (row, tool) not in self.long_rows

    def step(self, row, tool, action, pid=None, payload=None):
        """Measures ROW if it is wanted; otherwise just runs ACTION (it
        prepares a later row)."""
        if self.wanted(row, tool):
            self.measure(row, tool, action, pid, payload)
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
                self.big_file_rows(file_system)
                self.small_file_rows(file_system)
                self.listing_rows(file_system)

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


# ------------------------------------------------------------ report

MEDIAN_FIELDS = ('seconds', 'iops', 'mib_per_s', 'mib_fetched',
                 'peak_rss_mib', 'cpu_seconds')


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
    return 'curl' if limit_row == 'raw_get' else 'bindfs'


def format_result(row, sample):
    if row.metric == 'iops':
        return f'{sample["iops"]:,.0f} IOPS, {sample["mib_per_s"]:.1f} MiB/s'
    seconds = sample['seconds']
    text = f'{seconds:.2f} s' if seconds >= 0.1 else f'{seconds:.2g} s'
    if 'mib_per_s' in sample:
        text += f', {sample["mib_per_s"]:.0f} MiB/s'
    return text


def format_requests(counts):
    """'GET 256 (256 ranged) HEAD 1 LIST 2': requests by kind."""
    parts = []
    for kind in ('GET', 'HEAD', 'LIST', 'PUT', 'POST', 'DELETE', 'OTHER'):
        count = counts.get(kind, 0)
        if not count:
            continue
        text = f'{kind} {count:g}'
        ranged = counts.get('GET_RANGE', 0) if kind == 'GET' else 0
        if ranged:
            text += f' ({ranged:g} ranged)'
        parts.append(text)
    return ' '.join(parts) or '-'


def format_number(value, spec):
    return '-' if value is None else format(value, spec)


def format_table(header, lines):
    widths = [max(len(str(cell)) for cell in column)
              for column in zip(header, *lines)]
    rendered = []
    for line in (header, *lines):
        rendered.append('  '.join(
            str(cell).ljust(width) if index in (0, 1, 6)
            else str(cell).rjust(width)
            for index, (cell, width) in enumerate(zip(line, widths))).rstrip())
    rendered.insert(1, '-' * len(rendered[0]))
    return '\n'.join(rendered)


def report(table, tool_order):
    header = ('row', 'tool', 'runs', 'median', 'vs peer', 'vs limit',
              'requests', 'MiB fetched', 'RSS MiB', 'CPU s')
    lines = []
    for row in ROWS + LIMIT_ROWS:
        for tool in (*tool_order, 'curl', 'bindfs'):
            median = table.get((row.name, tool))
            if median is None:
                continue
            lines.append((
                row.title, tool, median['runs'], format_result(row, median),
                format_number(median.get('vs_peer'), '.2f'),
                format_number(median.get('vs_limit'), '.2f'),
                format_requests(median['requests']),
                format_number(median.get('mib_fetched'), '.1f'),
                format_number(median.get('peak_rss_mib'), '.0f'),
                format_number(median.get('cpu_seconds'), '.2f')))
    print(format_table(header, lines))
    print('vs peer: speed against the best of s3fs and rclone in the row; '
          'vs limit: speed against the limit row (above 1 is faster)')

    print('\nlimits:')
    for row in LIMIT_ROWS:
        median = table.get((row.name, limit_tool(row.name)))
        if median:
            print(f'  {row.title.removeprefix("limit: ")}: '
                  f'{format_result(row, median)}')
    checks = (('cold', 'cold read vs raw GET limit'),
              ('reread', 're-read vs FUSE ceiling'),
              ('remount', 'remount re-read vs FUSE ceiling'))
    for tool in tool_order:
        ratios = [f'{label} {table[row, tool]["vs_limit"]:.2f}'
                  for row, label in checks
                  if (row, tool) in table
                  and table[row, tool]['vs_limit'] is not None]
        if ratios:
            print(f'  {tool}: ' + '; '.join(ratios))


# -------------------------------------------------------------- main

def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Read benchmark of s3cachefs against s3fs and rclone '
                    'through a proxy adding 20 ms to every request; see '
                    'tests/bench/README.md.')
    parser.add_argument('--server', choices=sorted(servers.SERVER_KINDS),
                        default='s3rver')
    parser.add_argument('--size-mib', type=int, metavar='MIB',
                        help='size of the large file (default 1024; '
                             '--quick: 256)')
    parser.add_argument('--small-files', type=int, metavar='N',
                        help='number of 64 KiB files (default 2000; '
                             '--quick: 500)')
    parser.add_argument('--runs', type=int, metavar='N',
                        help='runs of each row; the median is reported '
                             '(default 3; --quick: 1)')
    parser.add_argument('--quick', action='store_true',
                        help='a smoke run: 256 MiB, 500 small files, 1 run')
    row_names = [row.name for row in ROWS + LIMIT_ROWS]
    parser.add_argument('--only', default=','.join(row_names),
                        metavar='ROW,...',
                        help=f'rows to measure, from {",".join(row_names)}')
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
    parser.add_argument('--json', type=Path, metavar='FILE',
                        help='write the configuration, every sample and '
                             'the medians to this file')
    args = parser.parse_args(argv)
    for name, default in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, QUICK[name] if args.quick else default)
    if args.size_mib < 1 or args.small_files < 1 or args.runs < 1:
        parser.error('--size-mib, --small-files and --runs must be positive')
    args.only = args.only.split(',')
    args.tools = args.tools.split(',')
    unknown = [n for n in args.only if n not in row_names] + \
        [n for n in args.tools if n not in TOOLS]
    if unknown:
        parser.error(f'unknown row or tool: {", ".join(unknown)}')
    if args.s3cachefs_bin is None:
        built = [path for path in DEFAULT_BINARIES if os.access(path, os.X_OK)]
        args.s3cachefs_bin = str(built[0] if built else DEFAULT_BINARIES[0])
    if 's3cachefs' in args.tools and not os.access(args.s3cachefs_bin,
                                                   os.X_OK):
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
            's3cachefs_bin': args.s3cachefs_bin,
            's3cachefs_options': bench.s3cachefs_options,
            's3fs_options': args.s3fs_opts,
            'rclone_flags': args.rclone_flags,
        },
        'versions': bench.versions,
        'samples': bench.samples,
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
              f'{args.small_files} x 64 KiB, {args.runs} run(s), '
              f'{LATENCY * 1000:.0f} ms per request; s3cachefs options: '
              f'{bench.s3cachefs_options or "(none)"}', flush=True)
        for tool, version in bench.versions.items():
            print(f'  {tool}: {version}')
        bench.run()
        table = medians(bench.samples)
        add_ratios(table)
        print()
        report(table, [t for t in TOOLS if t in args.tools])
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
