#!/usr/bin/python3
"""Starts and stops real S3-compatible servers on loopback for the tests.

Two servers with one interface:
  S3rverServer  the npm package s3rver (tests/node_modules), quick to start
                but lax: it does not verify SigV4 signatures.
  SwiftServer   OpenStack Swift (Debian packages) with its s3api middleware,
                all in one data directory; verifies SigV4 like AWS.

In Python (run by /usr/bin/python3, which sees boto3 and python3-swift):
    server = SwiftServer(workdir)
    server.start()          # free loopback ports, waits until it answers
    s3 = server.client()    # boto3 S3 client for it
    server.stop()           # also run at interpreter exit

From a shell (the server outlives the command; DIR/server.env records it):
    /usr/bin/python3 tests/harness/servers.py start swift --dir DIR --bucket B
    /usr/bin/python3 tests/harness/servers.py stop --dir DIR

Every server process is started in a session (and process group) of its own,
and stopping kills those process groups and nothing else. Install the
dependencies first with tests/install-deps.sh.
"""
import argparse
import atexit
import contextlib
import functools
import http.client
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import boto3
import botocore.config
import botocore.exceptions

HARNESS_DIR = Path(__file__).resolve().parent
S3RVER_BIN = HARNESS_DIR.parent / 'node_modules' / '.bin' / 's3rver'
SWIFT_LAUNCHER = HARNESS_DIR / 'swift_launcher.py'
SYSTEM_PYTHON = '/usr/bin/python3'  # Debian's, which sees python3-swift
LOOPBACK = '127.0.0.1'
REGION = 'us-east-1'
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
POLL_INTERVAL = 0.1
LOG_TAIL_LINES = 30
ENV_FILE_NAME = 'server.env'


class ServerError(RuntimeError):
    """A server could not be started or stopped."""


def free_ports(count):
    """Returns count distinct TCP ports on 127.0.0.1 that are free now."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in sockets]


def process_identity(pid):
    """Returns (start time, process group id) of the live process pid, from
    /proc/PID/stat (start time in clock ticks since boot), or None if it is
    gone or a zombie."""
    try:
        stat = Path(f'/proc/{pid}/stat').read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces; the fields after it don't.
    fields = stat[stat.rindex(')') + 2:].split()
    state, pgrp, start_time = fields[0], int(fields[2]), int(fields[19])
    if state in ('Z', 'X'):
        return None
    return start_time, pgrp


def signal_group(pgid, signum):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def log_tail(path, lines=LOG_TAIL_LINES):
    """Returns the last lines of a log file, for error messages."""
    try:
        text = Path(path).read_text(errors='replace')
    except FileNotFoundError:
        return f'--- {path}: (missing)'
    tail = '\n'.join(text.splitlines()[-lines:])
    return f'--- {path} (last {lines} lines):\n{tail}'


def check_user_xattrs(directory):
    """Raises ServerError unless directory's filesystem takes user xattrs."""
    probe = Path(directory) / '.xattr-probe'
    probe.touch()
    try:
        os.setxattr(probe, 'user.s3cachefs.probe', b'1')
    except OSError as err:
        df = subprocess.run(['df', '-T', str(directory)],
                            capture_output=True, text=True).stdout
        raise ServerError(
            f'Swift needs user extended attributes, but the filesystem of '
            f'{directory} refuses them ({err}); use a workdir on ext4 or '
            f'xfs.\n{df}') from err
    finally:
        probe.unlink()


class S3Server:
    """What both servers share: processes, readiness, clients, buckets.

    Subclasses set name, access_key and secret_key, and implement
    _launch(), which picks self.port (with free_ports), writes configs into
    workdir and starts the processes with _spawn(); they may override
    _wait_backends().
    """
    name = None
    access_key = None
    secret_key = None
    region = REGION

    def __init__(self, workdir):
        self.workdir = Path(workdir).resolve()
        self.port = None
        self.log_paths = []
        self._processes = []

    @property
    def endpoint(self):
        return f'http://{LOOPBACK}:{self.port}'

    def start(self, timeout=START_TIMEOUT):
        """Starts the server and returns once a signed ListBuckets succeeds.
        On failure, stops what was started and raises ServerError."""
        if self._processes:
            raise ServerError(f'{self.name} is already running')
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_paths = []
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        try:
            self._launch()
            self._wait_backends(deadline)
            self._wait_ready(deadline)
        except BaseException:
            self.stop()
            raise

    def stop(self):
        """Kills the server's process groups and waits for them; idempotent."""
        processes, self._processes = self._processes, []
        atexit.unregister(self.stop)
        # A process that poll() has reaped may have had its pid reused:
        # signal only unreaped ones (a zombie keeps its pid).
        running = [process for process in processes if process.poll() is None]
        for process in running:
            signal_group(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_group(process.pid, signal.SIGKILL)
                process.wait()

    def detach(self):
        """Lets the server outlive this Python process (no stop at exit)."""
        atexit.unregister(self.stop)

    def process_groups(self):
        """Returns (pgid, start time) of each running server process; each
        leads its own process group, so the pgid is also its pid."""
        groups = []
        for process in self._processes:
            identity = process_identity(process.pid)
            if identity is not None:
                groups.append((process.pid, identity[0]))
        return groups

    def client(self, secret_key=None):
        """Returns a boto3 S3 client for this server: path-style, SigV4.
        secret_key replaces the right one (to test signature checks)."""
        return self._make_client(secret_key or self.secret_key,
                                 botocore.config.Config(
                                     retries={'mode': 'standard',
                                              'total_max_attempts': 3},
                                     connect_timeout=5,
                                     read_timeout=60,
                                     max_pool_connections=32))

    def create_bucket(self, name):
        self.client().create_bucket(Bucket=name)

    def delete_bucket_recursive(self, name):
        """Aborts pending multipart uploads, deletes every object, then the
        bucket."""
        s3 = self.client()
        self._abort_multipart_uploads(s3, name)
        self._delete_objects(s3, name, lambda item: True)
        s3.delete_bucket(Bucket=name)

    def release_bucket(self, name, large=1 << 20):
        """What a test leaves when it is done with a bucket: its pending
        multipart uploads aborted and its objects of LARGE bytes or more
        deleted, as they hold the disk. The small objects and the bucket
        stay until the server stops: deleting thousands of keys costs Swift
        about 9 ms of CPU each, a minute of every suite run."""
        s3 = self.client()
        self._abort_multipart_uploads(s3, name)
        self._delete_objects(s3, name, lambda item: item['Size'] >= large)

    def _delete_objects(self, s3, bucket, wanted):
        """Deletes the objects of BUCKET whose listing entry WANTED
        accepts, a page at a time."""
        for page in s3.get_paginator('list_objects_v2').paginate(Bucket=bucket):
            keys = [{'Key': item['Key']} for item in page.get('Contents', [])
                    if wanted(item)]
            if keys:
                response = s3.delete_objects(
                    Bucket=bucket, Delete={'Objects': keys, 'Quiet': True})
                if response.get('Errors'):
                    raise ServerError(
                        f'{self.name}: could not delete from {bucket}: '
                        f'{response["Errors"][:5]}')

    @staticmethod
    def _abort_multipart_uploads(s3, bucket):
        try:
            pages = list(s3.get_paginator('list_multipart_uploads')
                         .paginate(Bucket=bucket))
        except botocore.exceptions.ClientError as err:
            if err.response['Error']['Code'] == 'NotImplemented':
                return  # s3rver: no multipart listing, nothing to abort
            raise
        for page in pages:
            for upload in page.get('Uploads', []):
                s3.abort_multipart_upload(Bucket=bucket, Key=upload['Key'],
                                          UploadId=upload['UploadId'])

    def _make_client(self, secret_key, config):
        # proxies={} keeps any http_proxy in the environment from routing
        # loopback traffic elsewhere.
        config = botocore.config.Config(
            signature_version='s3v4', s3={'addressing_style': 'path'},
            proxies={}).merge(config)
        return boto3.session.Session().client(
            's3', endpoint_url=self.endpoint, region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=secret_key, config=config)

    def _launch(self):
        raise NotImplementedError

    def _wait_backends(self, deadline):
        """Waits for processes behind the S3 endpoint; none by default."""

    def _spawn(self, argv, log_name, env=None):
        """Starts argv in a new session, output to workdir/logs/LOG_NAME."""
        log_dir = self.workdir / 'logs'
        log_dir.mkdir(exist_ok=True)
        log_path = log_dir / f'{log_name}.log'
        self.log_paths.append(log_path)
        with open(log_path, 'ab') as log:
            self._processes.append(subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env=env, start_new_session=True))

    def _wait_until(self, ready, deadline, what):
        """Polls ready() until it returns true; fails fast if a server
        process exits, and at the deadline."""
        last_error = None
        while True:
            for process in self._processes:
                if process.poll() is not None:
                    self._fail(f'{process.args[0]} exited with status '
                               f'{process.returncode} while waiting for '
                               f'{what}')
            try:
                if ready():
                    return
            except Exception as err:  # not up yet: remember why
                last_error = err
            if time.monotonic() >= deadline:
                self._fail(f'timed out waiting for {what} '
                           f'(last error: {last_error!r})')
            time.sleep(POLL_INTERVAL)

    def _wait_ready(self, deadline):
        probe = self._make_client(self.secret_key, botocore.config.Config(
            retries={'total_max_attempts': 1}, connect_timeout=1,
            read_timeout=5))

        def list_buckets_ok():
            response = probe.list_buckets()
            return response['ResponseMetadata']['HTTPStatusCode'] == 200

        self._wait_until(list_buckets_ok, deadline,
                         f'a signed ListBuckets at {self.endpoint}')

    def _fail(self, reason):
        logs = '\n'.join(log_tail(path) for path in self.log_paths)
        raise ServerError(f'{self.name} failed to start: {reason}\n{logs}')


class S3rverServer(S3Server):
    """s3rver from tests/node_modules. Does not verify SigV4 signatures."""
    name = 's3rver'
    access_key = 'S3RVER'
    secret_key = 'S3RVER'

    def _launch(self):
        if not S3RVER_BIN.exists():
            raise ServerError(f'{S3RVER_BIN} is missing: run '
                              f'tests/install-deps.sh')
        [self.port] = free_ports(1)
        data_dir = self.workdir / 'data'
        data_dir.mkdir(exist_ok=True)
        # s3rver encrypts ListObjectsV2 continuation tokens with DES, which
        # OpenSSL 3 (Node >= 17) only offers through its legacy provider:
        # without it every paginated V2 listing fails with HTTP 500.
        node_options = os.environ.get('NODE_OPTIONS', '')
        env = dict(os.environ, NODE_OPTIONS=f'{node_options} '
                   f'--openssl-legacy-provider'.strip())
        self._spawn([str(S3RVER_BIN), '-d', str(data_dir), '-a', LOOPBACK,
                     '-p', str(self.port), '--silent'], 's3rver', env)


SWIFT_CONF = """\
[swift-hash]
swift_hash_path_prefix = s3cachefs-tests
swift_hash_path_suffix = s3cachefs-tests

[storage-policy:0]
name = Policy-0
default = yes

[swift-constraints]
# S3 allows 2 KB of user metadata; above Swift's defaults s3api answers 500.
max_meta_value_length = 2048
max_meta_overall_size = 4096
"""

SWIFT_BACKEND_CONF = """\
[DEFAULT]
bind_ip = 127.0.0.1
bind_port = {port}
workers = 0
swift_dir = {swift_dir}
devices = {devices}
mount_check = false
disable_fallocate = true
log_name = {kind}-server

[pipeline:main]
pipeline = {kind}-server

[app:{kind}-server]
use = egg:swift#{kind}
{app_options}"""

SWIFT_BACKEND_APP_OPTIONS = {
    'account': '',
    'container': '',
    # With the default of 1 s a slow container server makes the listing
    # update asynchronous, and no object-updater runs here to catch up.
    'object': 'container_update_timeout = 30\n',
}

SWIFT_PROXY_CONF = """\
[DEFAULT]
bind_ip = 127.0.0.1
bind_port = {port}
workers = 0
swift_dir = {swift_dir}
log_name = proxy-server

[pipeline:main]
pipeline = catch_errors gatekeeper healthcheck proxy-logging cache listing_formats bulk tempurl s3api tempauth copy slo dlo versioned_writes symlink proxy-logging proxy-server

[app:proxy-server]
use = egg:swift#proxy
account_autocreate = true

[filter:catch_errors]
use = egg:swift#catch_errors

[filter:gatekeeper]
use = egg:swift#gatekeeper

[filter:healthcheck]
use = egg:swift#healthcheck

[filter:proxy-logging]
use = egg:swift#proxy_logging

[filter:cache]
use = egg:swift#memcache
memcache_servers = 127.0.0.1:{memcached_port}

[filter:listing_formats]
use = egg:swift#listing_formats

[filter:bulk]
use = egg:swift#bulk

[filter:tempurl]
use = egg:swift#tempurl

[filter:s3api]
use = egg:swift#s3api
location = us-east-1
max_upload_part_num = 10000
min_segment_size = 5242880
# DeleteObjects deletes 2 keys at a time by default: slow bucket cleanup.
multi_delete_concurrency = 16

[filter:tempauth]
use = egg:swift#tempauth
user_{account}_{user} = {secret} .admin

[filter:copy]
use = egg:swift#copy

[filter:slo]
use = egg:swift#slo

[filter:dlo]
use = egg:swift#dlo

[filter:versioned_writes]
use = egg:swift#versioned_writes

[filter:symlink]
use = egg:swift#symlink
"""


class SwiftServer(S3Server):
    """Swift account, container, object and proxy (s3api + tempauth)
    servers plus memcached, on one device directory under workdir."""
    name = 'swift'
    account = 'test'
    user = 'tester'
    access_key = f'{account}:{user}'
    secret_key = 'testing'
    part_power = 8

    def __init__(self, workdir):
        super().__init__(workdir)
        self._memcached_port = None
        self._backend_ports = {}

    def _launch(self):
        etc_dir = self.workdir / 'etc'
        devices_dir = self.workdir / 'data'
        etc_dir.mkdir(exist_ok=True)
        (devices_dir / 'd1').mkdir(parents=True, exist_ok=True)
        check_user_xattrs(devices_dir / 'd1')

        self.port, self._memcached_port, *backend_ports = free_ports(5)
        self._backend_ports = dict(zip(('account', 'container', 'object'),
                                       backend_ports))
        (etc_dir / 'swift.conf').write_text(SWIFT_CONF)
        self._build_rings(etc_dir)
        for kind, port in self._backend_ports.items():
            (etc_dir / f'{kind}-server.conf').write_text(
                SWIFT_BACKEND_CONF.format(
                    kind=kind, port=port, swift_dir=etc_dir,
                    devices=devices_dir,
                    app_options=SWIFT_BACKEND_APP_OPTIONS[kind]))
        (etc_dir / 'proxy-server.conf').write_text(SWIFT_PROXY_CONF.format(
            port=self.port, swift_dir=etc_dir,
            memcached_port=self._memcached_port, account=self.account,
            user=self.user, secret=self.secret_key))

        memcached = ['memcached', '-l', LOOPBACK,
                     '-p', str(self._memcached_port), '-U', '0', '-m', '64']
        if os.geteuid() == 0:
            memcached += ['-u', 'nobody']  # memcached refuses to run as root
        self._spawn(memcached, 'memcached')
        env = dict(os.environ, EVENTLET_NO_GREENDNS='yes')
        for kind in [*self._backend_ports, 'proxy']:
            self._spawn([SYSTEM_PYTHON, str(SWIFT_LAUNCHER), str(etc_dir),
                         str(etc_dir / f'{kind}-server.conf'),
                         f'{kind}-server'], f'{kind}-server', env)

    def _build_rings(self, etc_dir):
        # Imported here so that s3rver-only users need no python3-swift;
        # its import chain warns about deprecations of no concern here.
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', DeprecationWarning)
            from swift.common.ring import RingBuilder
        for kind, port in self._backend_ports.items():
            builder = RingBuilder(self.part_power, 1, 1)
            builder.add_dev({'id': 0, 'region': 1, 'zone': 1,
                             'ip': LOOPBACK, 'port': port, 'device': 'd1',
                             'weight': 100})
            builder.rebalance()
            builder.get_ring().save(str(etc_dir / f'{kind}.ring.gz'))

    def _wait_backends(self, deadline):
        # The proxy error-limits a backend that failed it ten times in a
        # minute, so let it see them only once they answer HTTP.
        def accepts_connections(port):
            with socket.create_connection((LOOPBACK, port), timeout=1):
                return True

        def answers_http(port):
            connection = http.client.HTTPConnection(LOOPBACK, port, timeout=5)
            try:
                connection.request('HEAD', '/')
                connection.getresponse()
                return True
            finally:
                connection.close()

        self._wait_until(
            functools.partial(accepts_connections, self._memcached_port),
            deadline, 'memcached')
        for kind, port in self._backend_ports.items():
            self._wait_until(functools.partial(answers_http, port), deadline,
                             f'the {kind} server on port {port}')


SERVER_KINDS = {'s3rver': S3rverServer, 'swift': SwiftServer}


def write_env_file(server, bucket):
    """Writes workdir/server.env (shell-sourcable) and returns its text."""
    groups = server.process_groups()
    values = {
        'S3_SERVER': server.name,
        'S3_ENDPOINT': server.endpoint,
        'S3_ACCESS_KEY': server.access_key,
        'S3_SECRET_KEY': server.secret_key,
        'S3_REGION': server.region,
        'S3_BUCKET': bucket or '',
        # Each server process leads its own process group: pgid == pid.
        'S3_SERVER_PGIDS': ' '.join(str(pgid) for pgid, _ in groups),
        'S3_SERVER_START_TIMES': ' '.join(str(t) for _, t in groups),
    }
    text = ''.join(f'{key}={shlex.quote(value)}\n'
                   for key, value in values.items())
    (server.workdir / ENV_FILE_NAME).write_text(text)
    return text


def read_env_file(path):
    values = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition('=')
        values[key] = ' '.join(shlex.split(value))
    return values


def stop_recorded(workdir):
    """Stops the server recorded in workdir/server.env by the start command.
    Signals a process group only while its leader is still the process that
    was recorded (same pid, start time and group), so a reused pid is never
    hit. Returns False if nothing was recorded."""
    env_path = Path(workdir) / ENV_FILE_NAME
    if not env_path.exists():
        return False
    values = read_env_file(env_path)
    recorded = list(zip(map(int, values['S3_SERVER_PGIDS'].split()),
                        map(int, values['S3_SERVER_START_TIMES'].split())))

    def still_ours(pgid, start_time):
        return process_identity(pgid) == (start_time, pgid)

    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pgid, start_time in recorded:
            if still_ours(pgid, start_time):
                signal_group(pgid, signum)
        deadline = time.monotonic() + STOP_TIMEOUT
        while (any(still_ours(*group) for group in recorded)
               and time.monotonic() < deadline):
            time.sleep(POLL_INTERVAL)
    survivors = [pgid for pgid, start_time in recorded
                 if still_ours(pgid, start_time)]
    if survivors:
        raise ServerError(f'processes {survivors} survived SIGKILL')
    env_path.unlink()
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(
        description='Start or stop an S3 test server on loopback.')
    commands = parser.add_subparsers(dest='command', required=True)
    start = commands.add_parser(
        'start', help='start a server that outlives this command')
    start.add_argument('kind', choices=sorted(SERVER_KINDS))
    start.add_argument('--dir', required=True, type=Path,
                       help='work directory: configs, data, logs, server.env')
    start.add_argument('--bucket', help='create this bucket once ready')
    stop = commands.add_parser('stop', help='stop the server started in DIR')
    stop.add_argument('--dir', required=True, type=Path)
    args = parser.parse_args(argv)

    if args.command == 'stop':
        if not stop_recorded(args.dir):
            print(f'no server recorded in {args.dir / ENV_FILE_NAME}',
                  file=sys.stderr)
        return 0

    if (args.dir / ENV_FILE_NAME).exists():
        parser.error(f'{args.dir / ENV_FILE_NAME} exists: stop that server '
                     f'first')
    server = SERVER_KINDS[args.kind](args.dir)
    server.start()
    try:
        if args.bucket:
            server.create_bucket(args.bucket)
        sys.stdout.write(write_env_file(server, args.bucket))
    except BaseException:
        server.stop()
        raise
    server.detach()
    return 0


if __name__ == '__main__':
    sys.exit(main())
