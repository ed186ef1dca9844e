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
  (the kept-alive one closed by the server) failed the upload with EIO;
- a trickled answer held a thread (and the drain) far past any sensible
  time; XML cut short or garbled failed at once; a PUT answered 200
  without an ETag counted as done;
- upload ids longer than 1 KiB (the journal keeps 2 KiB) were refused;
- a CompleteMultipartUpload whose answer was lost failed the close() of
  an object that was in the bucket;
- a listing that repeated its continuation token never ended.

The faults injected are counted per kind and printed at the end of the
module.
"""
import collections
import concurrent.futures
import errno
import os
import subprocess
import time

import pytest

import s3proxy
from conftest import BINARY, check_sanitizer_log, is_fuse_mount, wait_for
from writehelp import (KiB, MiB, MULTIPART_SIZE, HOLD_ALL, assert_objects,
                       bucket_keys, fsync_path, head, object_bytes, payload,
                       put_kind, run_within, sha, write_file)

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


# -------------------------------------------- 9: the complete's answer lost

@pytest.mark.parametrize('mode', ['default', 'writeback'])
@pytest.mark.parametrize('answer', ['nosuchupload', 'server'])
def test_lost_complete_answer(server, s3, bucket, proxy, mount, mode, answer):
    """CompleteMultipartUpload done by the server, its answer lost: the
    retry gets NoSuchUpload (as on AWS; 'nosuchupload') or what this server
    answers itself ('server': s3rver 500 InternalError, Swift the result
    again). The daemon checks the object with a HEAD (size, and the ETag
    of these parts or the MD5 of the bytes) and the upload succeeds.
    Before: close() (or fsync) failed although the object was there."""
    options = ['writeback'] if mode == 'writeback' else []
    mnt = via_proxy(mount, proxy, bucket, *options)
    data = payload(f'lost-{mode}-{answer}', MULTIPART_SIZE)
    proxy.inject('lost', 1, complete_post)
    if answer == 'nosuchupload':
        proxy.inject('nosuchupload', 1, complete_post)
    path = mnt.path / 'big.bin'

    def write_and_sync():
        write_file(path, data)
        if mode == 'writeback':
            fsync_path(path)
    outcome, _ = run_within(BOUND * 2, write_and_sync)
    assert outcome is None, f'{outcome!r}\n{mnt.log()[-3000:]}'
    expected = {'lost': 1, **({'nosuchupload': 1}
                              if answer == 'nosuchupload' else {})}
    assert proxy.faults_injected == expected
    # (Swift answers a retried complete with its result: nothing to check)
    checked = answer == 'nosuchupload' or server.name != 'swift'
    assert checked == ('the object in the bucket is this upload' in mnt.log())
    assert_objects(s3, bucket, {'big.bin': data})
    assert unmount_and_drain(mnt) == 0


# ----------------------------------------------------- 10: deadlines

def test_trickled_read_ends_at_its_deadline(server, s3, bucket, proxy, mount):
    """A GET answered at 1.1 KB/s (above curl's 1 KiB/s low-speed floor):
    each GET fails once its deadline (request_timeout + 256 KiB at 64 KiB/s,
    6 s here) has passed, its retries inside it, instead of taking the 4
    minutes the server would like; the read fails after the kernel's two
    tries (its read-ahead, then the page itself), and once the fault is
    gone the file reads whole. Before: nothing bounded it."""
    deadline = TIMEOUT + 4
    data = payload('trickle', 256 * KiB)
    s3.put_object(Bucket=bucket, Key='slow.bin', Body=data)
    mnt = via_proxy(mount, proxy, bucket, f'request_timeout={TIMEOUT}')
    proxy.inject('trickle', HOLD_ALL, object_get(bucket, 'slow.bin'),
                 seconds=1.0, chunk=1100)
    outcome, seconds = run_within(4 * deadline, read_file,
                                  mnt.path / 'slow.bin')
    assert expect_bytes_or_error(outcome, data) in ('ETIMEDOUT', 'EIO')
    gets = proxy.records(lambda r: r.kind == 'GET')
    assert deadline - 1 <= seconds <= len(gets) * deadline + 2, \
        (seconds, len(gets))
    assert len(gets) <= 3, gets
    assert f'its deadline ({deadline}.0 s) has passed' in mnt.log()
    proxy.clear_faults()
    outcome, _ = run_within(BOUND, read_file, mnt.path / 'slow.bin')
    assert expect_bytes_or_error(outcome, data) == 'bytes'
    print(f'{server.name}: the trickled read failed after {seconds:.1f}s, '
          f'{len(gets)} GETs')


def test_trickled_listing_ends_at_its_deadline(server, s3, bucket, proxy,
                                               mount):
    """A LIST answered at 20 bytes/s (below curl's floor, which takes 30 s
    to notice, per attempt): each LIST ends at its deadline (2 + 4 s), and
    `ls` fails within a few of them."""
    deadline = TIMEOUT + 4
    for index in range(5):
        s3.put_object(Bucket=bucket, Key=f'dir/f{index}', Body=b'x')
    mnt = via_proxy(mount, proxy, bucket, f'request_timeout={TIMEOUT}')
    proxy.inject('trickle', HOLD_ALL, 'LIST', seconds=0.5, chunk=10)
    outcome, seconds = run_within(4 * deadline, os.listdir, mnt.path / 'dir')
    assert isinstance(outcome, OSError) and outcome.errno in NETWORK_ERRORS, \
        outcome
    lists = proxy.records(lambda r: r.kind == 'LIST')
    assert seconds <= len(lists) * deadline + 2, (seconds, len(lists))
    proxy.clear_faults()
    outcome, _ = run_within(BOUND, os.listdir, mnt.path / 'dir')
    assert sorted(outcome) == [f'f{i}' for i in range(5)]
    print(f'{server.name}: the trickled listing failed after {seconds:.1f}s, '
          f'{len(lists)} LISTs')


def test_trickled_upload_does_not_hold_the_drain(server, s3, bucket, proxy,
                                                 mount):
    """-o writeback, every PUT answered 2 bytes a second: `s3cachefs
    --unmount` returns within the uploads' deadlines (exit 1: the file
    stays in the journal), and the next mount, the fault gone, uploads it.
    Before: each attempt lasted until curl's 30 s low-speed limit, four
    attempts: the drain held the unmount for two minutes."""
    mnt = via_proxy(mount, proxy, bucket, 'writeback',
                    f'request_timeout={TIMEOUT}')
    data = payload('drain', 100 * KiB)
    proxy.inject('trickle', HOLD_ALL, put_kind, seconds=0.5, chunk=1)
    outcome, _ = run_within(BOUND, write_file, mnt.path / 'held.bin', data)
    assert outcome is None, outcome
    started = time.monotonic()
    code = unmount_and_drain(mnt, timeout=25)
    seconds = time.monotonic() - started
    # (the PUTs reached the server, only their answers trickled)
    assert code == 1 and seconds < 20, (code, seconds)
    assert 'held.bin' in mnt.log()
    proxy.clear_faults()
    # the next mount on the same cache directory: recovery uploads it
    again = mount(bucket, options=[RETRIES], endpoint=proxy.endpoint,
                  cache=mnt.cache_dir, name='again')
    wait_for(lambda: head(s3, bucket, 'held.bin') is not None, BOUND,
             'the recovered upload')
    assert_objects(s3, bucket, {'held.bin': data})
    assert unmount_and_drain(again) == 0


# ------------------------------------------- 10: listings that never end

def test_repeated_continuation_token_ends_the_listing(server, s3, bucket,
                                                      proxy, mount):
    """A listing of 1001 keys (two pages) whose second page names its own
    continuation token as the next: `ls` fails with EIO and one log line
    instead of listing page two forever (growing the listing in memory);
    without the fault it lists all 1001."""
    keys = [f'many/{index:05d}' for index in range(1001)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda key: s3.put_object(Bucket=bucket, Key=key,
                                                Body=b'.'), keys))
    mnt = via_proxy(mount, proxy, bucket)
    proxy.inject('repeat_token', 1, 'LIST')
    outcome, seconds = run_within(BOUND, os.listdir, mnt.path / 'many')
    assert isinstance(outcome, OSError) and outcome.errno == errno.EIO, \
        f'{outcome!r}\n{mnt.log()[-2000:]}'
    assert proxy.faults_injected == {'repeat_token': 1}
    lines = [line for line in mnt.log().splitlines()
             if 'continuation token' in line]
    assert len(lines) == 1, lines
    listing, _ = run_within(BOUND, os.listdir, mnt.path / 'many')
    assert len(listing) == 1001
    print(f'{server.name}: the repeated token ended the listing in '
          f'{seconds:.2f}s')


def test_directory_rename_ends_when_deletes_do_nothing(server, s3, bucket,
                                                       proxy, mount):
    """A directory rename whose DELETEs the server acknowledges (204)
    without doing them: the move lists the same keys again after deleting
    them, and stops with EIO and one log line instead of copying and
    deleting them forever; every key is still under its old name, and
    under the new one too (copies come before deletes)."""
    keys = [f'd/{index}' for index in range(3)]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    mnt = via_proxy(mount, proxy, bucket)
    proxy.inject('swallow', HOLD_ALL, 'DELETE')
    outcome, seconds = run_within(BOUND, os.rename, mnt.path / 'd',
                                  mnt.path / 'e')
    proxy.clear_faults()
    assert isinstance(outcome, OSError) and outcome.errno == errno.EIO, \
        f'{outcome!r}\n{mnt.log()[-2000:]}'
    assert 'still listed after its delete' in mnt.log()
    assert proxy.faults_injected['swallow'] == len(keys)
    for key in keys:
        assert object_bytes(s3, bucket, key) == key.encode()
        assert object_bytes(s3, bucket, 'e/' + key[2:]) == key.encode()
    print(f'{server.name}: the rename stopped in {seconds:.2f}s')


# --------------------------------------------------- 13c: long upload ids

def test_upload_id_of_two_kilobytes(server, s3, bucket, proxy, mount):
    """A multipart upload whose id is 2048 bytes (the journal's limit),
    of characters a URL encodes as 3 bytes each: parts, complete and the
    journal take it. Before: the 1 KiB query buffers refused it (EINVAL),
    and close() failed."""
    if server.name == 'swift':
        pytest.skip('the proxy rewrites the id in signed queries: only '
                    's3rver, which does not check signatures, accepts that')
    mnt = via_proxy(mount, proxy, bucket)
    proxy.inject('long_upload_id', HOLD_ALL, is_post_with('uploads'),
                 chunk=2048)
    data = payload('long-id', MULTIPART_SIZE)
    outcome, _ = run_within(BOUND * 2, write_file, mnt.path / 'big.bin', data)
    assert outcome is None, f'{outcome!r}\n{mnt.log()[-3000:]}'
    assert proxy.faults_injected['long_upload_id'] >= 1
    parts = proxy.records(lambda r: is_part(r.method, r.path, r.query))
    assert parts and all(len(r.query) > 5000 for r in parts)
    assert_objects(s3, bucket, {'big.bin': data})


# ------------------------------------------------ every fault, reads

READ_FAULTS = [  # (fault, count, must the read succeed: None, it may)
    ('slowdown', 3, True), ('internal', 3, True), ('reset', 2, True),
    ('lost', 2, True), ('short_body', 2, True),
    # refused by the daemon (EIO for that GET); the kernel may read again
    ('error200', 1, None), ('wrong_range', 1, None),
]


@pytest.mark.parametrize('fault,count,succeeds', READ_FAULTS,
                         ids=[f[0] for f in READ_FAULTS])
def test_read_under_fault(server, s3, bucket, proxy, mount, fault, count,
                          succeeds):
    """A cold read of a 1.5 MiB file (two blocks) with COUNT faults on its
    GETs: the bucket's bytes (after retries) or EIO, never other bytes;
    the same read after the fault gives the bytes."""
    data = payload(f'read-{fault}', 3 * MiB // 2)
    s3.put_object(Bucket=bucket, Key='r.bin', Body=data)
    mnt = via_proxy(mount, proxy, bucket)
    proxy.inject(fault, count, object_get(bucket, 'r.bin'))
    outcome, _ = run_within(BOUND, read_file, mnt.path / 'r.bin')
    got = expect_bytes_or_error(outcome, data)
    assert succeeds is None or (got == 'bytes') == succeeds, \
        (got, mnt.log()[-2000:])
    assert proxy.faults_injected[fault] >= 1
    proxy.clear_faults()
    outcome, _ = run_within(BOUND, read_file, mnt.path / 'r.bin')
    assert expect_bytes_or_error(outcome, data) == 'bytes'


def test_read_with_if_match_ignored(server, s3, bucket, proxy, mount):
    """The object is replaced while open, and the server ignores If-Match:
    the GET brings the new version, which the daemon refuses by its ETag
    (ESTALE), never mixing it into what the open file reads."""
    old = payload('old', 16 * MiB)
    s3.put_object(Bucket=bucket, Key='v.bin', Body=old)
    mnt = via_proxy(mount, proxy, bucket)
    fd = os.open(mnt.path / 'v.bin', os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == old[:4096]
        s3.put_object(Bucket=bucket, Key='v.bin', Body=payload('new', 16 * MiB))
        proxy.inject('ignore_if_match', HOLD_ALL, object_get(bucket, 'v.bin'))
        offset = 15 * MiB + 123
        outcome, _ = run_within(BOUND, os.pread, fd, 4096, offset)
    finally:
        os.close(fd)
    if not isinstance(outcome, OSError):
        assert outcome == old[offset:offset + 4096]
    else:
        assert outcome.errno in (errno.ESTALE, errno.EIO), outcome
    assert proxy.faults_injected['ignore_if_match'] >= 1


LIST_FAULTS = ['truncated_xml', 'malformed_xml', 'short_body', 'lost',
               'reset', 'error200']


@pytest.mark.parametrize('fault', LIST_FAULTS)
def test_listing_under_fault(server, s3, bucket, proxy, mount, fault):
    """A LIST answered with FAULT: retried, and `ls` shows every name."""
    names = [f'n{index}' for index in range(5)]
    for name in names:
        s3.put_object(Bucket=bucket, Key=f'dir/{name}', Body=b'x')
    mnt = via_proxy(mount, proxy, bucket)
    proxy.inject(fault, 1, 'LIST')
    outcome, _ = run_within(BOUND, os.listdir, mnt.path / 'dir')
    assert not isinstance(outcome, Exception), \
        f'{outcome!r}\n{mnt.log()[-2000:]}'
    assert sorted(outcome) == names
    assert proxy.faults_injected == {fault: 1}


# ------------------------------------------------ every fault, writes

def is_create(method, path, query):
    return method == 'POST' and 'uploads' in query and 'uploadId=' not in query


WRITE_FAULTS = [  # (id, fault, count, matcher, size)
    ('put-lost', 'lost', 1, put_kind, 300 * KiB),
    ('put-reset', 'reset', 2, put_kind, 300 * KiB),
    ('put-error200', 'error200', 1, put_kind, 300 * KiB),
    ('create-lost', 'lost', 1, is_create, MULTIPART_SIZE),
    ('part-lost', 'lost', 2, is_part, MULTIPART_SIZE),
    ('complete-error200', 'error200', 1, complete_post, MULTIPART_SIZE),
    ('complete-truncated', 'truncated_xml', 1, complete_post, MULTIPART_SIZE),
    ('complete-malformed', 'malformed_xml', 1, complete_post, MULTIPART_SIZE),
]


@pytest.mark.parametrize('fault,count,match,size',
                         [w[1:] for w in WRITE_FAULTS],
                         ids=[w[0] for w in WRITE_FAULTS])
def test_write_under_fault(server, s3, bucket, proxy, mount, fault, count,
                           match, size):
    """A file written and closed with FAULT on its upload's requests: the
    close succeeds, or fails with an error and keeps the data; after the
    fault, `s3cachefs --unmount` (which waits for the uploads) leaves the
    object in the bucket, byte for byte."""
    mnt = via_proxy(mount, proxy, bucket)
    data = payload(f'write-{fault}-{size}', size)
    proxy.inject(fault, count, match)
    outcome, _ = run_within(BOUND * 2, write_file, mnt.path / 'w.bin', data)
    if outcome is not None:
        assert isinstance(outcome, OSError) and \
            outcome.errno in NETWORK_ERRORS, outcome
    assert proxy.faults_injected[fault] >= 1
    proxy.clear_faults()
    assert unmount_and_drain(mnt) == 0, mnt.log()[-3000:]
    assert_objects(s3, bucket, {'w.bin': data})
    print(f'{server.name} {fault}: close() '
          f'{"succeeded" if outcome is None else outcome}')


# ------------------------------------------------ the server down for 30 s

DOWN = 30.0


def test_server_down_for_30_seconds(server, s3, bucket, proxy, mount):
    """The server is gone for 30 s (connections refused, open ones cut): a
    cold read fails promptly with an error, a close in the default mode
    fails and keeps the data, a writeback close returns at once; when the
    server is back, the read gives the bytes and `s3cachefs --unmount`
    uploads both files."""
    cold = payload('cold', 2 * MiB)
    s3.put_object(Bucket=bucket, Key='cold.bin', Body=cold)
    # listings trusted for a minute: lookups and creates need no request
    fresh = ('dir_ttl=60', 'attr_ttl=60')
    plain = via_proxy(mount, proxy, bucket, *fresh, name='plain')
    writeback = via_proxy(mount, proxy, bucket, 'writeback', *fresh,
                          name='wb')
    files = {'plain.bin': payload('plain', 500 * KiB),
             'wb.bin': payload('wb', 700 * KiB)}
    for mnt in (plain, writeback):
        assert os.listdir(mnt.path) == ['cold.bin']
    proxy.down(DOWN)
    started = time.monotonic()
    outcome, seconds = run_within(BOUND, read_file, plain.path / 'cold.bin')
    assert expect_bytes_or_error(outcome, cold) != 'bytes'
    assert seconds < 10, seconds
    outcome, _ = run_within(BOUND, write_file, plain.path / 'plain.bin',
                            files['plain.bin'])
    assert isinstance(outcome, OSError) and outcome.errno in NETWORK_ERRORS, \
        outcome
    outcome, seconds = run_within(BOUND, write_file, writeback.path / 'wb.bin',
                                  files['wb.bin'])
    assert outcome is None and seconds < 5, (outcome, seconds)
    assert proxy.is_down and time.monotonic() - started < DOWN
    wait_for(lambda: not proxy.is_down, DOWN + 10, 'the server to come back')
    outcome, _ = run_within(BOUND, read_file, plain.path / 'cold.bin')
    assert expect_bytes_or_error(outcome, cold) == 'bytes'
    assert unmount_and_drain(plain) == 0, plain.log()[-3000:]
    assert unmount_and_drain(writeback) == 0, writeback.log()[-3000:]
    assert_objects(s3, bucket, files)
    assert proxy.faults_injected['down'] == 1
