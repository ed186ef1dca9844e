"""Credentials that refresh: keys that expire a few seconds after they are
handed out, replaced without a remount, from each source the AWS CLI knows
besides static keys (src/credsource.h):

- a credential_process script that counts its runs;
- an EC2 instance metadata server (IMDSv2) and a container credentials
  server, both small Python HTTP servers on 127.0.0.1 speaking the
  documented protocols, which refuse requests without their token;
- a source that hands out a key the server refuses: the request is signed
  again with the next keys and succeeds;
- a credential_process that fails: the mount fails, clearly, with no
  secret in what it prints.

Bytes are checked with boto3 (the independent client). The real metadata
addresses are never reached: the daemon is pointed at 127.0.0.1 through
the documented variables, and AWS_EC2_METADATA_DISABLED=true is set
wherever instance metadata is not what is tested.
"""
import datetime
import json
import os
import secrets
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import (BINARY, check_sanitizer_log, daemon_env,
                      is_fuse_mount, wait_for)

LIFETIME = 6        # seconds the keys handed out are valid
EXERCISE = 16       # seconds of reads and writes: two or three lifetimes
FRESH = ['attr_ttl=0.2', 'dir_ttl=0.2']   # see what boto3 wrote soon


def iso_in(seconds):
    when = datetime.datetime.now(datetime.timezone.utc) + \
        datetime.timedelta(seconds=seconds)
    return when.strftime('%Y-%m-%dT%H:%M:%SZ')


def no_static_keys(extra=None):
    """Environment for a mount whose keys come from a source: no keys in
    the environment, no instance metadata unless asked for."""
    env = {'AWS_ACCESS_KEY_ID': '', 'AWS_SECRET_ACCESS_KEY': '',
           'AWS_EC2_METADATA_DISABLED': 'true'}
    env.update(extra or {})
    return env


def write_process(home, tmp_path, body):
    """~/.aws/config with a credential_process running SCRIPT (a Python
    program with BODY); returns the file counting its runs."""
    counter = tmp_path / 'runs'
    script = tmp_path / 'get creds.py'   # a space: quoted in the config
    script.write_text('import datetime, json, os, sys\n'
                      f'COUNTER = {str(counter)!r}\n'
                      'with open(COUNTER, "a") as f:\n'
                      '    f.write("run\\n")\n'
                      'with open(COUNTER) as f:\n'
                      '    RUN = len(f.readlines())\n'
                      'def iso_in(seconds):\n'
                      '    when = datetime.datetime.now(datetime.timezone.utc)'
                      ' + datetime.timedelta(seconds=seconds)\n'
                      '    return when.strftime("%Y-%m-%dT%H:%M:%SZ")\n'
                      + body)
    aws = home / '.aws'
    aws.mkdir(exist_ok=True)
    (aws / 'config').write_text(
        '[default]\nregion = us-east-1\n'
        f'credential_process = /usr/bin/python3 "{script}" --profile default\n')
    return counter


def runs(counter):
    try:
        return len(counter.read_text().splitlines())
    except FileNotFoundError:
        return 0


def bucket_bytes(s3, bucket, key, expected):
    """KEY's bytes in the bucket. s3rver answers a PUT before its store
    has written the body (its filesystem store resolves on the stream's
    'finish', not the file's: node_modules/s3rver/lib/stores/
    filesystem.js), so a GET right after may read a short file there:
    read again for up to 5 s while it is shorter than EXPECTED, never
    past a body of another length or other bytes."""
    deadline = time.monotonic() + 5
    while True:
        got = s3.get_object(Bucket=bucket, Key=key)['Body'].read()
        if len(got) >= len(expected) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def exercise(mnt, s3, bucket, seconds=EXERCISE):
    """Writes through the mount and reads through it what boto3 wrote,
    for SECONDS; checks every byte with boto3 / through the mount.
    Returns the number of rounds."""
    deadline = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < deadline:
        data = secrets.token_bytes(4096 + rounds)
        name = f'w{rounds}.bin'
        with open(mnt.path / name, 'wb') as f:
            f.write(data)
        got = bucket_bytes(s3, bucket, name, data)
        assert got == data, f'round {rounds}: the bucket has other bytes'
        other = secrets.token_bytes(3000 + rounds)
        s3.put_object(Bucket=bucket, Key=f'r{rounds}.bin', Body=other)
        # (a listing of the mount may be dir_ttl old: the name shows then)
        wait_for(lambda: os.path.exists(mnt.path / f'r{rounds}.bin'), 10,
                 f'r{rounds}.bin through the mount')
        assert (mnt.path / f'r{rounds}.bin').read_bytes() == other
        rounds += 1
        time.sleep(0.7)
    return rounds


KEYS_JSON = '''
print(json.dumps({{"Version": 1, "AccessKeyId": {access!r},
                  "SecretAccessKey": {secret!r},
                  "SessionToken": "session-%d" % RUN,
                  "Expiration": iso_in({lifetime})}}))
'''


def test_credential_process_refreshes(server, s3, bucket, mount, home,
                                      tmp_path):
    """Keys expiring every few seconds: the mount reads and writes across
    several expirations, and the process was run again for each."""
    counter = write_process(home, tmp_path, KEYS_JSON.format(
        access=server.access_key, secret=server.secret_key,
        lifetime=LIFETIME))
    mnt = mount(bucket, options=FRESH, env=no_static_keys())
    assert runs(counter) == 1
    started = time.monotonic()
    rounds = exercise(mnt, s3, bucket)
    elapsed = time.monotonic() - started
    assert rounds >= 5
    # due after two thirds of each 6 s lifetime: a run every ~4 s of use
    assert runs(counter) >= 1 + int(elapsed // LIFETIME), mnt.log()
    assert server.secret_key not in mnt.log()
    mnt.unmount()


def test_credential_process_fails(server, bucket, home, tmp_path):
    """A credential_process that exits non-zero: the mount fails at once
    with one line naming the profile, and no secret."""
    write_process(home, tmp_path,
                  'print(json.dumps({"Version": 1, "AccessKeyId": "AKIA1",'
                  ' "SecretAccessKey": "S3CR3T-OF-THE-FAILING-PROCESS"}))\n'
                  'print("the token broker is down", file=sys.stderr)\n'
                  'sys.exit(4)\n')
    mountpoint = tmp_path / 'mnt'
    mountpoint.mkdir()
    done = subprocess.run(
        [BINARY, '-f', bucket, str(mountpoint), '-o',
         f'endpoint={server.endpoint},cache={tmp_path / "cache"}'],
        env=daemon_env(server, home, no_static_keys()), capture_output=True,
        text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert not is_fuse_mount(mountpoint)
    check_sanitizer_log(done.stderr)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "credential_process of profile 'default'" in lines[0]
    assert 'exited with status 4' in lines[0]
    assert 'the token broker is down' in lines[0]
    assert 'S3CR3T-OF-THE-FAILING-PROCESS' not in done.stderr + done.stdout
    assert server.secret_key not in done.stderr


def test_rejected_key_is_replaced(server, s3, bucket, mount, home, tmp_path):
    """The second run hands out an access key the server does not know
    (valid for an hour): the first request signed with it gets 403, the
    keys are replaced at once (third run) and the request, signed again,
    succeeds."""
    counter = write_process(home, tmp_path, f'''
good = RUN != 2
print(json.dumps({{"Version": 1,
                  "AccessKeyId": {server.access_key!r} if good else "NOBODY:nokey",
                  "SecretAccessKey": {server.secret_key!r},
                  "SessionToken": "session-%d" % RUN,
                  "Expiration": iso_in({LIFETIME} if RUN == 1 else 3600)}}))
''')
    mnt = mount(bucket, options=FRESH, env=no_static_keys())
    data = secrets.token_bytes(10000)
    s3.put_object(Bucket=bucket, Key='before.bin', Body=data)
    assert (mnt.path / 'before.bin').read_bytes() == data
    assert runs(counter) == 1
    time.sleep(LIFETIME * 2 / 3 + 0.5)      # the first keys are due
    later = secrets.token_bytes(20000)
    s3.put_object(Bucket=bucket, Key='after.bin', Body=later)
    wait_for(lambda: os.path.exists(mnt.path / 'after.bin'), 10,
             'after.bin through the mount')
    assert (mnt.path / 'after.bin').read_bytes() == later
    with open(mnt.path / 'written.bin', 'wb') as f:
        f.write(later)
    assert s3.get_object(Bucket=bucket, Key='written.bin')['Body'].read() == later
    assert runs(counter) == 3, mnt.log()
    assert 'the server rejected the keys' in mnt.log()
    mnt.unmount()


class MetadataServer:
    """IMDSv2 or the container protocol on 127.0.0.1, handing out the
    server's keys with a short expiration; counts what it was asked."""

    def __init__(self, server, kind, auth_token=None):
        self.kind = kind
        self.keys = (server.access_key, server.secret_key)
        self.auth_token = auth_token
        self.tokens = set()
        self.counts = {'token': 0, 'role': 0, 'creds': 0, 'refused': 0}
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self, status, body, ctype='text/plain'):
                data = body.encode()
                self.send_response(status)
                self.send_header('Content-Type', ctype)
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self):
                status, body = owner.put(self.path, self.headers)
                self.answer(status, body)

            def do_GET(self):
                status, body = owner.get(self.path, self.headers)
                self.answer(status, body, 'application/json'
                            if body.startswith('{') else 'text/plain')

        self.httpd = ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def count(self, what):
        with self.lock:
            self.counts[what] += 1

    def keys_json(self, token_name):
        with self.lock:
            n = self.counts['creds']
        return json.dumps({'Code': 'Success', 'Type': 'AWS-HMAC',
                           'AccessKeyId': self.keys[0],
                           'SecretAccessKey': self.keys[1],
                           token_name: f'session-{n}',
                           'Expiration': iso_in(LIFETIME)})

    def put(self, path, headers):
        if self.kind != 'imds' or path != '/latest/api/token':
            return 404, 'not found'
        if not headers.get('X-aws-ec2-metadata-token-ttl-seconds'):
            return 400, 'missing ttl'
        token = secrets.token_hex(16)
        with self.lock:
            self.tokens.add(token)
        self.count('token')
        return 200, token

    def get(self, path, headers):
        if self.kind == 'container':
            if headers.get('Authorization') != self.auth_token:
                self.count('refused')
                return 401, 'bad authorization'
            if path != '/creds':
                return 404, 'not found'
            self.count('creds')
            return 200, self.keys_json('Token')
        with self.lock:
            valid = headers.get('X-aws-ec2-metadata-token') in self.tokens
        if not valid:
            self.count('refused')
            return 401, 'Unauthorized'
        base = '/latest/meta-data/iam/security-credentials/'
        if path == base:
            self.count('role')
            return 200, 'test-role'
        if path == base + 'test-role':
            self.count('creds')
            return 200, self.keys_json('Token')
        return 404, 'not found'


def test_instance_metadata_refreshes(server, s3, bucket, mount, tmp_path):
    """IMDSv2: a session token first, then the role and its keys with the
    token; fetched again as the keys expire; never a GET without it."""
    with MetadataServer(server, 'imds') as imds:
        env = no_static_keys({
            'AWS_EC2_METADATA_DISABLED': '',
            'AWS_EC2_METADATA_SERVICE_ENDPOINT': f'http://127.0.0.1:{imds.port}/'})
        mnt = mount(bucket, options=FRESH, env=env)
        assert imds.counts['creds'] == 1
        started = time.monotonic()
        exercise(mnt, s3, bucket)
        elapsed = time.monotonic() - started
        counts = dict(imds.counts)
        mnt.unmount()
    assert counts['creds'] >= 1 + int(elapsed // LIFETIME), counts
    assert counts['token'] == counts['creds'], counts
    assert counts['role'] == counts['creds'], counts
    assert counts['refused'] == 0, counts


def test_instance_metadata_refuses_without_token(server, tmp_path):
    """The local IMDS really refuses a GET without the token (so the test
    above can fail)."""
    import urllib.error
    import urllib.request
    with MetadataServer(server, 'imds') as imds:
        url = (f'http://127.0.0.1:{imds.port}'
               '/latest/meta-data/iam/security-credentials/')
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=5)
        assert refused.value.code == 401


def test_container_credentials_refresh(server, s3, bucket, mount, tmp_path):
    """Container credentials from a full URI on loopback, with the
    authorization token read from its file at each fetch: the token
    changes between fetches and is still accepted."""
    token_file = tmp_path / 'auth-token'
    token_file.write_text('first-token\n')
    with MetadataServer(server, 'container', auth_token='first-token') as ecs:
        env = no_static_keys({
            'AWS_CONTAINER_CREDENTIALS_FULL_URI': f'http://127.0.0.1:{ecs.port}/creds',
            'AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE': str(token_file),
            'AWS_CONTAINER_AUTHORIZATION_TOKEN': 'not-this-one'})
        mnt = mount(bucket, options=FRESH, env=env)
        assert ecs.counts['creds'] == 1
        # a rotated token: the file first, then the server
        token_file.write_text('second-token')
        ecs.auth_token = 'second-token'
        started = time.monotonic()
        exercise(mnt, s3, bucket)
        elapsed = time.monotonic() - started
        counts = dict(ecs.counts)
        mnt.unmount()
    assert counts['creds'] >= 1 + int(elapsed // LIFETIME), counts
    assert counts['refused'] == 0, counts


def test_container_wrong_authorization(server, bucket, home, tmp_path):
    """A token the container server refuses: the mount fails, naming the
    URI and the status, without the token."""
    with MetadataServer(server, 'container', auth_token='right') as ecs:
        env = no_static_keys({
            'AWS_CONTAINER_CREDENTIALS_FULL_URI': f'http://127.0.0.1:{ecs.port}/creds',
            'AWS_CONTAINER_AUTHORIZATION_TOKEN': 'wrong-token-value'})
        mountpoint = tmp_path / 'mnt'
        mountpoint.mkdir()
        done = subprocess.run(
            [BINARY, '-f', bucket, str(mountpoint), '-o',
             f'endpoint={server.endpoint},cache={tmp_path / "cache"}'],
            env=daemon_env(server, home, env), capture_output=True, text=True,
            timeout=60, stdin=subprocess.DEVNULL)
        refused = ecs.counts['refused']
    assert not is_fuse_mount(mountpoint)
    check_sanitizer_log(done.stderr)
    assert done.returncode != 0
    assert f'container credentials at http://127.0.0.1:{ecs.port}/creds' in done.stderr
    assert 'HTTP 401' in done.stderr
    assert 'wrong-token-value' not in done.stderr
    assert refused == 1   # a refused token is not sent again
