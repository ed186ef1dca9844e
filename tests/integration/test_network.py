"""The network between s3cachefs and the server: retries, failures, request
counts, HTTPS and proxies from the environment.

Requests go through tests/harness/s3proxy.py, a proxy on loopback that
counts what passes and injects faults (503 SlowDown, 500 InternalError,
connection resets, stalls). The daemon is pointed at the proxy as if it
were the server (endpoint=http://127.0.0.1:PROXYPORT; the signature covers
that Host, which the proxy forwards unchanged), or, for the environment
proxy test, at the server with http_proxy naming the proxy.
"""
import concurrent.futures
import errno
import hashlib
import os
import random
import subprocess
import time

import botocore.config
import boto3
import pytest

from conftest import BINARY, daemon_env, is_fuse_mount, wait_for, check_sanitizer_log
import s3proxy

MiB = 1 << 20
BLOCK = MiB  # the default block_size
CHUNK = 4 * MiB          # a few blocks
HANG_TIMEOUT = 30.0      # a read that takes longer than this is a hang
PROXY_ENV = ('http_proxy', 'HTTP_PROXY', 'https_proxy', 'HTTPS_PROXY',
             'all_proxy', 'ALL_PROXY', 'no_proxy', 'NO_PROXY')
RNG = random.Random(20261130)


def sha(data):
    return hashlib.sha256(data).hexdigest()



@pytest.fixture
def via(mount):
    """Factory: via(endpoint, bucket, options=(), env=None, unset=(),
    name='mnt') -> a mount whose endpoint= is ENDPOINT, with the names in
    UNSET removed from its environment and no proxy variables inherited.
    Unmounted by the conftest mount fixture."""
    def make(endpoint, bucket_name, options=(), env=None, unset=(), name='mnt'):
        mnt = mount(bucket_name, options=options, env=env, start=False,
                    name=name)
        endpoint_at = next(i for i, o in enumerate(mnt.options) if o.startswith('endpoint='))
        mnt.options[endpoint_at] = 'endpoint=' + endpoint
        for variable in (*PROXY_ENV, *unset):
            if env is None or variable not in env:
                mnt.env.pop(variable, None)
        return mnt.start()
    return make


def object_get(bucket, key):
    """Predicate for inject(): GETs of BUCKET/KEY (not listings)."""
    path = f'/{bucket}/{key}'
    return lambda method, got_path, query: method == 'GET' and got_path == path


def gets_of(proxy, bucket, key):
    path = f'/{bucket}/{key}'
    return proxy.records(lambda r: r.kind == 'GET' and r.path == path)


def within(timeout, function, *args):
    """Runs FUNCTION in a thread; fails the test if it does not return in
    TIMEOUT seconds (a hang). Returns (result or exception, seconds)."""
    started = time.monotonic()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(function, *args)
    try:
        try:
            outcome = future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            pytest.fail(f'{function.__name__} did not return within {timeout}s')
        except Exception as error:  # noqa: BLE001 - the caller judges it
            outcome = error
    finally:
        pool.shutdown(wait=False)
    return outcome, time.monotonic() - started


def read_file(path):
    with open(path, 'rb') as f:
        return f.read()


# ---------------------------------------------------------------- the proxy

def test_proxy_passes_boto3_requests(server, bucket, proxy):
    """The proxy forwards every request kind unchanged: boto3 through it
    (signing the proxy's host:port, which Swift checks) puts, heads, gets
    a range, lists and deletes; the proxy counts each kind."""
    client = boto3.session.Session().client(
        's3', endpoint_url=proxy.endpoint, region_name=server.region,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        config=botocore.config.Config(signature_version='s3v4',
                                      s3={'addressing_style': 'path'},
                                      proxies={},
                                      retries={'total_max_attempts': 1}))
    body = RNG.randbytes(300000)
    client.put_object(Bucket=bucket, Key='p/one.bin', Body=body)
    assert client.head_object(Bucket=bucket, Key='p/one.bin')['ContentLength'] == len(body)
    part = client.get_object(Bucket=bucket, Key='p/one.bin', Range='bytes=1000-1999')
    assert part['Body'].read() == body[1000:2000]
    assert client.get_object(Bucket=bucket, Key='p/one.bin')['Body'].read() == body
    listed = client.list_objects_v2(Bucket=bucket, Prefix='p/')
    assert [item['Key'] for item in listed['Contents']] == ['p/one.bin']
    client.delete_objects(Bucket=bucket, Delete={'Objects': [{'Key': 'p/one.bin'}]})
    client.put_object(Bucket=bucket, Key='p/two', Body=b'2')
    client.delete_object(Bucket=bucket, Key='p/two')
    counts = proxy.counts
    assert (counts['PUT'], counts['HEAD'], counts['GET'], counts['GET_RANGE'],
            counts['LIST'], counts['POST'], counts['DELETE']) == (2, 1, 2, 1, 1, 1, 1)
    assert proxy.body_bytes(lambda r: r.kind == 'GET') == len(body) + 1000
    assert all(200 <= r.status < 300 for r in proxy.records()), proxy.records()


def test_proxy_refuses_non_loopback_targets():
    """As a forward proxy it only ever connects to loopback addresses."""
    import http.client
    with s3proxy.S3Proxy('http://127.0.0.1:9') as running:
        for target in ('http://192.0.2.1/bucket/key', 'http://example.com/',
                       'https://127.0.0.1:1/'):
            connection = http.client.HTTPConnection('127.0.0.1', running.port,
                                                    timeout=10)
            try:
                connection.request('GET', target)
                response = connection.getresponse()
                assert response.status == 403, target
                response.read()
            finally:
                connection.close()
        assert running.refused == 3
        assert running.records() == []


# ------------------------------------------------------------------ retries

def test_transient_faults_are_retried(server, s3, bucket, proxy, via):
    """3 SlowDown, 2 InternalError and 2 connection resets on the GETs of
    one object: the read still returns every byte, after retries."""
    key = 'flaky.bin'
    body = RNG.randbytes(CHUNK + 2 * MiB)  # two chunks: a GET each
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    mnt = via(proxy.endpoint, bucket, options=['retries=10'])
    proxy.reset_counters()
    match = object_get(bucket, key)
    proxy.inject('slowdown', 3, match)
    proxy.inject('internal', 2, match)
    proxy.inject('reset', 2, match)

    data, seconds = within(HANG_TIMEOUT, read_file, mnt.path / key)
    assert not isinstance(data, Exception), f'{data!r}\n{mnt.log()}'
    assert len(data) == len(body) and sha(data) == sha(body)
    assert proxy.faults_injected == {'slowdown': 3, 'internal': 2, 'reset': 2}
    assert not proxy.pending_faults()
    gets = gets_of(proxy, bucket, key)
    faulted = [r for r in gets if r.fault]
    answered = [r for r in gets if not r.fault]
    assert len(faulted) == 7
    assert sorted(r.status for r in faulted if r.status) == [500, 500, 503, 503, 503]
    # every fault cost one more request; the good answers hold the file once
    assert len(gets) >= 2 + 7
    assert all(r.status == 206 for r in answered), answered
    assert sum(r.body_bytes for r in answered) == len(body)
    print(f'{server.name}: read through 7 faults in {seconds:.2f}s, '
          f'{len(gets)} GETs')


def test_listing_fault_is_retried(server, s3, bucket, proxy, via):
    """SlowDown on the mount-time bucket check and on the LIST behind
    os.listdir: both retried, the listing is complete."""
    names = {f'dir/file-{i}': str(i).encode() for i in range(5)}
    for key, value in names.items():
        s3.put_object(Bucket=bucket, Key=key, Body=value)
    proxy.inject('internal', 1, 'LIST')
    mnt = via(proxy.endpoint, bucket, options=['retries=10'])
    assert proxy.faults_injected == {'internal': 1}
    assert [r.status for r in proxy.records()] == [500, 200]
    proxy.reset_counters()
    proxy.inject('slowdown', 2, 'LIST')
    listing, _ = within(HANG_TIMEOUT, os.listdir, mnt.path / 'dir')
    assert not isinstance(listing, Exception), f'{listing!r}\n{mnt.log()}'
    assert sorted(listing) == sorted(k.split('/')[1] for k in names)
    assert proxy.faults_injected == {'slowdown': 2}
    lists = proxy.records(lambda r: r.kind == 'LIST')
    assert [r.status for r in lists[:2]] == [503, 503]
    assert lists[-1].status == 200 and len(lists) >= 3


def test_permanent_failure_is_an_error_not_a_hang(server, s3, bucket, proxy, via):
    """More failures than -o retries: the read fails with EIO promptly,
    after exactly retries+1 attempts per request; other files and, once the
    server recovers, the same file are served."""
    s3.put_object(Bucket=bucket, Key='bad.bin', Body=b'b' * 100000)
    s3.put_object(Bucket=bucket, Key='good.txt', Body=b'still served')
    mnt = via(proxy.endpoint, bucket, options=['retries=2'])
    proxy.reset_counters()
    proxy.inject('internal', 10, object_get(bucket, 'bad.bin'))

    outcome, seconds = within(HANG_TIMEOUT, read_file, mnt.path / 'bad.bin')
    assert isinstance(outcome, OSError), f'read returned {outcome!r}'
    assert outcome.errno == errno.EIO, outcome
    assert seconds < 10, f'the failure took {seconds:.1f}s'
    gets = gets_of(proxy, bucket, 'bad.bin')
    assert gets and all(r.status == 500 for r in gets)
    # retries=2: every failed read cost 3 attempts, never more
    assert len(gets) % 3 == 0, [r.status for r in gets]

    good, _ = within(HANG_TIMEOUT, read_file, mnt.path / 'good.txt')
    assert good == b'still served'
    proxy.clear_faults()
    again, _ = within(HANG_TIMEOUT, read_file, mnt.path / 'bad.bin')
    assert again == b'b' * 100000, again
    assert mnt.process.poll() is None


def test_stalled_request_completes(server, s3, bucket, proxy, via):
    """A request held for a second is slow, not failed."""
    s3.put_object(Bucket=bucket, Key='slow.txt', Body=b'patience')
    mnt = via(proxy.endpoint, bucket)
    proxy.inject('stall', 1, object_get(bucket, 'slow.txt'), seconds=1.0)
    data, seconds = within(HANG_TIMEOUT, read_file, mnt.path / 'slow.txt')
    assert data == b'patience'
    assert seconds >= 1.0
    assert proxy.faults_injected == {'stall': 1}


# ----------------------------------------------------------------- counting

def test_request_counts(server, s3, bucket, proxy, via):
    """A sequential read fetches each byte once in a few chunk-sized GETs;
    a 4 KiB random read on a cold mount fetches little."""
    key = 'ten.bin'
    body = RNG.randbytes(10 * MiB)
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    mnt = via(proxy.endpoint, bucket)
    proxy.reset_counters()
    digest = hashlib.sha256()
    with open(mnt.path / key, 'rb') as f:
        while block := f.read(MiB):
            digest.update(block)
    assert digest.hexdigest() == sha(body)
    gets = gets_of(proxy, bucket, key)
    assert sum(r.body_bytes for r in gets) == len(body), \
        [(r.status, r.body_bytes) for r in gets]
    assert len(gets) <= 10 and all(r.ranged for r in gets)
    print(f'{server.name}: sequential 10 MiB read in {len(gets)} GETs')

    # a second mount with its own (empty) page cache and block cache: a
    # random read fetches the one cache block it touches, nothing more
    cold = via(proxy.endpoint, bucket, name='cold')
    proxy.reset_counters()
    offset = RNG.randrange(CHUNK, len(body) - CHUNK) | 123
    fd = os.open(cold.path / key, os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, offset) == body[offset:offset + 4096]
    finally:
        os.close(fd)
    fetched = proxy.body_bytes(lambda r: r.kind == 'GET' and r.path == f'/{bucket}/{key}')
    assert fetched == BLOCK, fetched
    print(f'{server.name}: 4 KiB pread fetched {fetched} bytes')


# -------------------------------------------------------------------- HTTPS

def run_failing_mount(server, home, mountpoint, bucket, endpoint, env=None,
                      options=()):
    """Runs s3cachefs in the foreground, expecting it to exit at once."""
    mountpoint.mkdir(exist_ok=True)
    opts = ','.join(['endpoint=' + endpoint,
                     f'cache={mountpoint.parent / "cache"}', *options])
    full_env = daemon_env(server, home, env)
    for variable in PROXY_ENV:
        full_env.pop(variable, None)
    done = subprocess.run([BINARY, '-f', bucket, str(mountpoint), '-o', opts],
                          env=full_env, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    if is_fuse_mount(mountpoint):
        subprocess.run(['fusermount3', '-u', str(mountpoint)])
        pytest.fail('the mount succeeded although it should not')
    check_sanitizer_log(done.stderr)
    return done


def test_https_verifies_the_certificate(server, s3, bucket, via, home, tmp_path):
    """endpoint=https://: an unknown CA is refused at mount time with one
    line that names the certificate; with AWS_CA_BUNDLE it mounts."""
    ca, cert, key = s3proxy.make_certificates(tmp_path / 'certs')
    s3.put_object(Bucket=bucket, Key='secure.txt', Body=b'over TLS')
    with s3proxy.S3Proxy(server.endpoint, tls=(cert, key)) as tls_proxy:
        assert tls_proxy.endpoint.startswith('https://127.0.0.1:')
        done = run_failing_mount(server, home, tmp_path / 'refused', bucket,
                                 tls_proxy.endpoint, options=['retries=1'])
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode != 0
        assert len(lines) == 1, done.stderr
        assert 'certificate' in lines[0], lines[0]
        assert server.secret_key not in done.stderr
        wait_for(lambda: tls_proxy.tls_failures, 10,
                 'the proxy to see the rejected handshake')
        assert tls_proxy.records() == []

        mnt = via(tls_proxy.endpoint, bucket, env={'AWS_CA_BUNDLE': str(ca)})
        data, _ = within(HANG_TIMEOUT, read_file, mnt.path / 'secure.txt')
        assert data == b'over TLS'
        assert gets_of(tls_proxy, bucket, 'secure.txt')
        assert tls_proxy.counts['LIST'] >= 1


def test_certificate_error_does_not_blame_credentials(server, bucket, home,
                                                      tmp_path):
    _, cert, key = s3proxy.make_certificates(tmp_path / 'certs')
    with s3proxy.S3Proxy(server.endpoint, tls=(cert, key)) as tls_proxy:
        done = run_failing_mount(server, home, tmp_path / 'refused', bucket,
                                 tls_proxy.endpoint)
    assert done.returncode != 0 and 'certificate' in done.stderr
    assert 'refused access' not in done.stderr, done.stderr
    assert 'credentials' not in done.stderr, done.stderr


# ------------------------------------------------------- environment proxy

def test_http_proxy_environment_is_honoured(server, s3, bucket, proxy, via):
    """With http_proxy set, libcurl sends every request to the proxy in
    absolute form; the proxy forwards them to the (loopback) server."""
    body = RNG.randbytes(100000)
    s3.put_object(Bucket=bucket, Key='proxied.bin', Body=body)
    mnt = via(server.endpoint, bucket,
              env={'http_proxy': proxy.url, 'HTTP_PROXY': proxy.url})
    assert not {'no_proxy', 'NO_PROXY'} & set(mnt.env)
    data, _ = within(HANG_TIMEOUT, read_file, mnt.path / 'proxied.bin')
    assert data == body
    records = proxy.records()
    assert records and all(r.absolute for r in records), records
    assert any(r.kind == 'LIST' for r in records)  # the mount-time check
    gets = gets_of(proxy, bucket, 'proxied.bin')
    assert sum(r.body_bytes for r in gets) == len(body)
