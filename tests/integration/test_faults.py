"""The S3 client under faults: a real mount behind tests/harness/s3proxy.py,
which breaks answers in the ways servers and networks do (see its module
documentation for each fault), against both servers.

What must hold, whatever the fault:
- reads return the bucket's bytes (sha256 against boto3's) or an error
  (EIO, or the network errno the man page lists), never other bytes;
- writes lose nothing: once the fault is gone, the object is in the bucket
  byte for byte (after `s3cachefs --unmount`, which waits for the uploads,
  where close() failed or the mode is writeback);
- nothing hangs past its deadline: every call is bounded by run_within.

Defects fixed with these tests (each failed before its fix):
- keys with "." / ".." segments: curl removed dot segments from the path
  it sent while SigV4 signed the raw path, so a directory rename read,
  copied and deleted other keys than it listed, or never ended;
- bodies could not be rewound: curl resending a PUT on a fresh connection
  (the kept-alive one closed by the server) failed the upload with EIO.

The faults injected are counted per kind and printed at the end of the
module.
"""
import collections
import errno
import os
import subprocess
import time

import pytest

import s3proxy
from conftest import BINARY, check_sanitizer_log, is_fuse_mount
from writehelp import (KiB, assert_objects, bucket_keys, object_bytes, payload,
                       put_kind, run_within, sha)

# what a failed read or close may say: EIO, or the network errnos the man
# page lists for network and server failures
NETWORK_ERRORS = {errno.EIO, errno.ETIMEDOUT, errno.ECONNREFUSED,
                  errno.ECONNRESET, errno.EHOSTUNREACH}
BOUND = 30.0            # no single call takes longer, faults or not
RETRIES = 'retries=3'   # backoff pauses of at most 0.1 + 0.2 + 0.4 s
TIMEOUT = 2             # request_timeout of the deadline tests, seconds
FAULTS_SEEN = collections.Counter()


class CountingProxy(s3proxy.S3Proxy):
    """An S3Proxy whose faults add up in FAULTS_SEEN, resets or not."""

    def reset_counters(self):
        FAULTS_SEEN.update(getattr(self, 'faults_injected', {}))
        super().reset_counters()


@pytest.fixture
def proxy(server):
    with CountingProxy(server.endpoint) as running:
        yield running
        running.reset_counters()


@pytest.fixture(scope='module', autouse=True)
def report_faults(request):
    yield
    plugins = request.config.pluginmanager
    reporter = plugins.getplugin('terminalreporter')
    capture = plugins.getplugin('capturemanager')
    text = ', '.join(f'{kind} {count}'
                     for kind, count in sorted(FAULTS_SEEN.items()))
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f'\ntest_faults: faults injected: '
                                f'{text or "none"}')


def via_proxy(mount, proxy, bucket, *options, name='mnt'):
    return mount(bucket, options=[RETRIES, *options], endpoint=proxy.endpoint,
                 name=name)


def is_post_with(part):
    """inject() matcher: POSTs whose query has PART (uploads=, uploadId=)."""
    return lambda method, path, query: method == 'POST' and part in query


def is_part(method, path, query):
    return method == 'PUT' and 'partNumber=' in query


def complete_post(method, path, query):
    """inject() matcher: CompleteMultipartUpload."""
    return method == 'POST' and 'uploadId=' in query


def object_get(bucket, key):
    path = f'/{bucket}/{key}'
    return lambda method, got_path, query: method == 'GET' and got_path == path


def read_file(path):
    with open(path, 'rb') as f:
        return f.read()


def unmount_and_drain(mnt, timeout=BOUND):
    """`s3cachefs --unmount`, which returns once the daemon has uploaded
    what it could and exited; returns the daemon's exit status."""
    outcome, _ = run_within(timeout + 5, subprocess.run,
                            [BINARY, '--unmount', str(mnt.path)])
    assert not isinstance(outcome, Exception), outcome
    code = mnt.process.wait(timeout=timeout)
    mnt.process = None
    assert not is_fuse_mount(mnt.path)
    check_sanitizer_log(mnt.log())
    return code


def expect_bytes_or_error(outcome, data, allowed=NETWORK_ERRORS):
    """A read's OUTCOME is DATA exactly, or an OSError with an errno in
    ALLOWED; returns 'bytes' or the errno's name."""
    if isinstance(outcome, OSError):
        assert outcome.errno in allowed, outcome
        return errno.errorcode[outcome.errno]
    assert not isinstance(outcome, Exception), repr(outcome)
    assert len(outcome) == len(data) and sha(outcome) == sha(data), \
        'the read returned other bytes than the bucket holds'
    return 'bytes'


# ------------------------------------------------- 7: keys as they are

ODD_KEYS = ['d/./x', 'd/../x', 'd//x', 'd/x/', 'd/.', 'd/..']


def entry_of(rest):
    """What a delimiter listing of d/ shows for key d/REST: the object
    REST, or the common prefix FIRST/."""
    first, slash, _ = rest.partition('/')
    return first + slash


@pytest.mark.parametrize('signing', ['signed', 'no_sign'])
def test_keys_with_dot_segments_are_moved_exactly(server, s3, bucket, proxy,
                                                   mount, signing):
    """Keys with "." and ".." segments, "//" and a name with a trailing "/"
    (made with boto3, which sends them as they are): `ls d` shows the names
    that can be names, each other key is logged once, and `mv d e` moves
    every key under d/ to the same key under e/, touching no other key (a
    sentinel "x" at the root stays). Before: curl sent "/b/d/../x" as
    "/b/x": on s3rver the move copied and deleted other keys and never
    ended (signed or not), on Swift the signature no longer matched."""
    if signing == 'no_sign' and server.name == 'swift':
        pytest.skip('Swift answers unsigned requests with HTML error pages')
    for key in ODD_KEYS:
        try:
            s3.put_object(Bucket=bucket, Key=key, Body=f'odd {key}'.encode())
        except Exception:  # noqa: BLE001 - s3rver cannot store some
            pass
    s3.put_object(Bucket=bucket, Key='d/ok', Body=b'an ordinary file')
    s3.put_object(Bucket=bucket, Key='d/sub/in', Body=b'nested')
    s3.put_object(Bucket=bucket, Key='x', Body=b'root sentinel')
    # what the server really holds (s3rver stores keys as files: it keeps
    # 'd/.' and 'd/..' but turns 'd/./x' into 'd/x' and refuses 'd//x')
    before = {key: object_bytes(s3, bucket, key) for key in bucket_keys(s3, bucket)}
    under_d = {key: data for key, data in before.items() if key.startswith('d/')}
    odd = [key for key in under_d
           if entry_of(key[2:]).rstrip('/') in ('', '.', '..')]
    assert odd, f'the server kept no odd key: {sorted(before)}'

    options = ['no_sign'] if signing == 'no_sign' else []
    mnt = via_proxy(mount, proxy, bucket, *options)
    names = {entry_of(key[2:]).rstrip('/') for key in under_d}
    shown = sorted(n for n in names if n not in ('', '.', '..'))
    listing, _ = run_within(BOUND, os.listdir, mnt.path / 'd')
    assert sorted(listing) == shown
    skipped = {'d/' + entry_of(key[2:]) for key in odd}
    log = mnt.log().splitlines()
    for entry in skipped:
        lines = [line for line in log if f"key '{entry}' is not shown" in line]
        assert len(lines) == 1, (entry, lines)

    proxy.reset_counters()
    outcome, seconds = run_within(BOUND, os.rename, mnt.path / 'd',
                                  mnt.path / 'e')
    assert outcome is None, f'{outcome!r}\n{mnt.log()[-3000:]}'
    after = bucket_keys(s3, bucket)
    moved = {'e/' + key[2:]: data for key, data in under_d.items()}
    assert after == sorted({*moved, 'e/', 'x'}), after
    assert_objects(s3, bucket, {**moved, 'x': b'root sentinel'})
    # no request touched a key the move did not list or make
    allowed = {f'/{bucket}/{key}' for key in [*under_d, *moved, 'e/']}
    touched = {r.path for r in proxy.records()
               if r.method in ('PUT', 'DELETE', 'POST')}
    assert touched <= allowed, sorted(touched - allowed)
    listing, _ = run_within(BOUND, os.listdir, mnt.path / 'e')
    assert sorted(listing) == shown
    print(f'{server.name}: moved {len(under_d)} keys ({len(odd)} odd) in '
          f'{seconds:.2f}s')


# ----------------------------------------- 8: a kept-alive connection closed

IDLE = 0.3   # seconds a connection must idle before idle_close hits it


@pytest.mark.parametrize('what', ['file', 'symlink'])
def test_upload_resent_after_the_server_closed_its_connection(
        server, s3, bucket, proxy, mount, what):
    """The PUT of a file (a body read from the staging file) or a symlink
    (a body in memory) arrives on a kept-alive connection that the server
    closes as the request comes: its keep-alive timeout fired after 0.3 s
    idle (the file, closed 0.6 s after its last use), or it closes every
    connection once the next request comes (the symlink, whose PUT follows
    the lookup that create-like calls always send). curl sends the PUT
    again on a fresh connection, rewinding the body, and the upload
    succeeds. Before: curl could not rewind (no seek callback), and the
    upload failed with EIO."""
    mnt = via_proxy(mount, proxy, bucket)
    path = mnt.path / what
    data = payload(what, 300 * KiB)
    if what == 'file':
        proxy.inject('idle_close', 1, put_kind, seconds=IDLE)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data)
        time.sleep(2 * IDLE)  # the connection's idle time is the fault
        outcome, _ = run_within(BOUND, os.close, fd)
        expected = data
    else:
        proxy.inject('idle_close', 1, put_kind, seconds=0)
        target = 'a-target/' + 't' * 200
        outcome, _ = run_within(BOUND, os.symlink, target, path)
        expected = target.encode()
    assert outcome is None, f'{outcome!r}\n{mnt.log()[-3000:]}'
    assert proxy.faults_injected == {'idle_close': 1}, \
        [(r.method, r.path, r.query) for r in proxy.records()]
    puts = proxy.records(lambda r: r.method == 'PUT')
    assert [r.fault for r in puts] == ['idle_close', None], puts
    assert object_bytes(s3, bucket, what) == expected
