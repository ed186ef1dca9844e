"""Self-test of the fault-injecting proxy (s3proxy.py): each fault does
what its module documentation says, seen from a plain HTTP client, with a
real s3rver upstream (it answers unsigned requests, so raw http.client
requests show exactly what went over the wire), or, where what the server
received is the point, an upstream that echoes the request's headers.

Run with Debian's python:
    /usr/bin/python3 -m pytest -q tests/harness/test_s3proxy_selftest.py
"""
import http.client
import http.server
import json
import socket
import threading
import sys
import time
import urllib.parse
import uuid
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import s3proxy  # noqa: E402
import servers  # noqa: E402

BODY = bytes(range(256)) * 16   # 4 KiB, every byte value


@pytest.fixture(scope='module')
def server(tmp_path_factory):
    instance = servers.S3rverServer(tmp_path_factory.mktemp('s3rver'))
    instance.start()
    yield instance
    instance.stop()


@pytest.fixture
def bucket(server):
    name = f'proxytest-{uuid.uuid4().hex[:12]}'
    server.create_bucket(name)
    s3 = server.client()
    s3.put_object(Bucket=name, Key='obj', Body=BODY)
    for index in range(3):
        s3.put_object(Bucket=name, Key=f'many/{index}', Body=b'x')
    yield name
    server.delete_bucket_recursive(name)


@pytest.fixture
def proxy(server):
    with s3proxy.S3Proxy(server.endpoint) as running:
        yield running


def connect(proxy):
    return http.client.HTTPConnection('127.0.0.1', proxy.port, timeout=10)


def request(proxy, method, target, headers=None, body=None, connection=None):
    """(status, headers, body) of one request; a new connection unless
    CONNECTION is given."""
    own = connection is None
    connection = connection or connect(proxy)
    try:
        connection.request(method, target, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        if own:
            connection.close()


def request_or_error(proxy, method, target, body=None):
    """request(), or the OSError of a connection the proxy reset."""
    try:
        return request(proxy, method, target, body=body)
    except OSError as error:
        return error


def error_code(body):
    return ElementTree.fromstring(body).findtext('Code')


def listing_token(body):
    """(by local name: s3rver's namespace is not AWS's)"""
    for element in ElementTree.fromstring(body):
        if element.tag.rsplit('}', 1)[-1] == 'NextContinuationToken':
            return element.text
    return None


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers 200 with the request's headers as a JSON object."""
    protocol_version = 'HTTP/1.1'

    def do_GET(self):  # noqa: N802 - http.server's naming
        body = json.dumps(dict(self.headers.items())).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # noqa: A002 - quiet
        pass


@pytest.fixture
def echo_proxy():
    """A proxy in front of _Echo."""
    upstream = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _Echo)
    thread = threading.Thread(target=upstream.serve_forever, daemon=True)
    thread.start()
    try:
        with s3proxy.S3Proxy(f'http://127.0.0.1:{upstream.server_address[1]}'
                             ) as running:
            yield running
    finally:
        upstream.shutdown()
        upstream.server_close()


def test_error_documents(proxy, bucket):
    """nosuchupload is a 404 NoSuchUpload; error200 a 200 whose body is an
    InternalError document; neither reaches the server."""
    proxy.inject('nosuchupload', 1)
    proxy.inject('error200', 1)
    status, _, body = request(proxy, 'GET', f'/{bucket}/obj')
    assert (status, error_code(body)) == (404, 'NoSuchUpload')
    status, headers, body = request(proxy, 'GET', f'/{bucket}/obj')
    assert (status, error_code(body)) == (200, 'InternalError')
    assert 'ETag' not in headers
    assert proxy.faults_injected == {'nosuchupload': 1, 'error200': 1}


def test_drop_held(server, proxy, bucket):
    """drop_held() resets the held requests, never forwarded, and the proxy
    goes on serving: the next request goes through."""
    proxy.inject('hold', 10, 'PUT')
    done = []
    putting = threading.Thread(target=lambda: done.append(
        request_or_error(proxy, 'PUT', f'/{bucket}/held', body=b'held')))
    putting.start()
    deadline = time.monotonic() + 10
    while proxy.holding < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.holding == 1
    proxy.drop_held()
    putting.join(10)
    assert done and isinstance(done[0], OSError), done
    assert proxy.holding == 0 and not +proxy.pending_faults()
    status, _, _ = request(proxy, 'PUT', f'/{bucket}/after', body=b'after')
    assert status == 200
    status, _, _ = request(proxy, 'GET', f'/{bucket}/held')
    assert status == 404


def test_lost_answer(server, proxy, bucket):
    """lost: the server does the work, the client gets a reset."""
    proxy.inject('lost', 1, 'PUT')
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        request(proxy, 'PUT', f'/{bucket}/lost', body=b'it is there')
    s3 = server.client()
    assert s3.get_object(Bucket=bucket, Key='lost')['Body'].read() == \
        b'it is there'
    assert [r.status for r in proxy.records()] == [200]


def test_swallow(server, proxy, bucket):
    """swallow: a 204 for a DELETE that never reaches the server."""
    proxy.inject('swallow', 1, 'DELETE')
    status, _, body = request(proxy, 'DELETE', f'/{bucket}/obj')
    assert (status, body) == (204, b'')
    s3 = server.client()
    assert s3.get_object(Bucket=bucket, Key='obj')['Body'].read() == BODY
    assert proxy.faults_injected == {'swallow': 1}


def test_truncated_and_malformed_xml(proxy, bucket):
    """The listing comes as a complete HTTP answer whose XML is cut in half
    or not well-formed."""
    target = f'/{bucket}?list-type=2&prefix=many/'
    _, _, whole = request(proxy, 'GET', target)
    proxy.inject('truncated_xml', 1, 'LIST')
    status, headers, body = request(proxy, 'GET', target)
    assert status == 200 and body == whole[:len(whole) // 2]
    assert int(headers['Content-Length']) == len(body)
    proxy.inject('malformed_xml', 1, 'LIST')
    status, _, body = request(proxy, 'GET', target)
    assert status == 200 and len(body) == len(whole) + 1
    with pytest.raises(ElementTree.ParseError):
        ElementTree.fromstring(body)
    ElementTree.fromstring(whole)  # (the original is well-formed)


def test_short_body(proxy, bucket):
    """Half the body, then the connection closes: an incomplete read."""
    proxy.inject('short_body', 1, 'GET')
    connection = connect(proxy)
    try:
        connection.request('GET', f'/{bucket}/obj')
        response = connection.getresponse()
        assert response.getheader('Content-Length') == str(len(BODY))
        with pytest.raises(http.client.IncompleteRead) as caught:
            response.read()
        assert caught.value.partial == BODY[:len(BODY) // 2]
    finally:
        connection.close()


def test_wrong_range(proxy, bucket):
    """Other bytes than asked for, and a Content-Range that says so."""
    proxy.inject('wrong_range', 1)
    status, _, body = request(proxy, 'GET', f'/{bucket}/obj')  # no Range
    assert status == 200 and body == BODY
    status, headers, body = request(proxy, 'GET', f'/{bucket}/obj',
                                    {'Range': 'bytes=10-19'})
    assert status == 206 and body == BODY[11:21]
    assert headers['Content-Range'] == f'bytes 11-20/{len(BODY)}'
    assert proxy.faults_injected == {'wrong_range': 1}


def test_ignore_if_match(echo_proxy):
    """If-Match is taken off before the server sees the request (only a
    request that has one matches)."""
    match = {'If-Match': '"0123"', 'Range': 'bytes=0-1'}
    echo_proxy.inject('ignore_if_match', 1)
    _, _, seen = request(echo_proxy, 'GET', '/b/k', {'Range': 'bytes=0-1'})
    assert json.loads(seen)['Range'] == 'bytes=0-1'
    assert echo_proxy.pending_faults() == {'ignore_if_match': 1}
    _, _, seen = request(echo_proxy, 'GET', '/b/k', match)
    seen = json.loads(seen)
    assert 'If-Match' not in seen and seen['Range'] == 'bytes=0-1'
    _, _, seen = request(echo_proxy, 'GET', '/b/k', match)
    assert json.loads(seen)['If-Match'] == '"0123"'  # (one request only)


def test_trickle(proxy, bucket):
    """The whole answer comes CHUNK bytes every SECONDS, unchanged."""
    proxy.inject('trickle', 1, 'GET', seconds=0.05, chunk=512)
    started = time.monotonic()
    status, _, body = request(proxy, 'GET', f'/{bucket}/obj')
    seconds = time.monotonic() - started
    assert status == 200 and body == BODY
    # the headers and 4 KiB of body: at least 8 pauses of 0.05 s
    assert seconds >= 8 * 0.05, seconds


def test_repeat_token(proxy, bucket):
    """A page asked for with a token names that token as the next one; the
    first page (no token) is left alone."""
    first = f'/{bucket}?list-type=2&max-keys=2&prefix=many/'
    proxy.inject('repeat_token', 1, 'LIST')
    _, _, body = request(proxy, 'GET', first)
    token = listing_token(body)
    assert token and proxy.pending_faults() == {'repeat_token': 1}
    quoted = urllib.parse.quote(token, safe='')
    # (the third and last page of the three keys says it is not the last)
    _, _, body = request(proxy, 'GET', f'{first}&continuation-token={quoted}')
    assert listing_token(body) == token
    assert b'<IsTruncated>true</IsTruncated>' in body
    assert proxy.faults_injected == {'repeat_token': 1}


def test_idle_close(proxy, bucket):
    """Only a request on a connection idle for SECONDS is hit: read, then
    the connection closes unanswered; a fresh connection is not."""
    proxy.inject('idle_close', 1, seconds=0.3)
    connection = connect(proxy)
    try:
        assert request(proxy, 'GET', f'/{bucket}/obj',
                       connection=connection)[0] == 200
        # quick reuse and fresh connections do not match
        assert request(proxy, 'GET', f'/{bucket}/obj',
                       connection=connection)[0] == 200
        assert request(proxy, 'GET', f'/{bucket}/obj')[0] == 200
        assert proxy.pending_faults() == {'idle_close': 1}
        time.sleep(0.4)  # the idle time is the fault's condition
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            request(proxy, 'PUT', f'/{bucket}/after-idle', body=b'x',
                    connection=connection)
    finally:
        connection.close()
    assert proxy.faults_injected == {'idle_close': 1}
    assert proxy.records()[-1].fault == 'idle_close'
    assert proxy.records()[-1].status is None  # never forwarded


def test_down_refuses_then_comes_back(proxy, bucket):
    """down(): connections are refused (an open one is cut), then the
    proxy listens again on the same port."""
    port = proxy.port
    connection = connect(proxy)
    try:
        assert request(proxy, 'GET', f'/{bucket}/obj',
                       connection=connection)[0] == 200
        proxy.down(1.0)
        assert proxy.is_down
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(('127.0.0.1', port), timeout=5).close()
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            request(proxy, 'GET', f'/{bucket}/obj', connection=connection)
    finally:
        connection.close()
    deadline = time.monotonic() + 10
    while proxy.is_down and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not proxy.is_down and proxy.port == port
    assert request(proxy, 'GET', f'/{bucket}/obj')[0] == 200
    assert proxy.faults_injected == {'down': 1}


def test_down_resets(proxy, bucket):
    """down(refuse=False): it listens, and resets every request a while."""
    proxy.down(0.5, refuse=False)
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        request(proxy, 'GET', f'/{bucket}/obj')
    time.sleep(0.6)  # the outage's length is what is tested
    assert request(proxy, 'GET', f'/{bucket}/obj')[0] == 200
    assert proxy.faults_injected['down'] == 1
    assert proxy.faults_injected['down_reset'] >= 1


def test_long_upload_id(server, proxy, bucket):
    """The client sees a CHUNK-byte upload id; the server gets its own back
    in every later request, and the upload completes."""
    proxy.inject('long_upload_id', 1, 'POST', chunk=2048)
    status, _, body = request(proxy, 'POST', f'/{bucket}/big?uploads=')
    assert status == 200
    long_id = next(element.text for element in ElementTree.fromstring(body)
                   if element.tag.endswith('UploadId'))
    assert len(long_id) == 2048 and '+/=' in long_id
    quoted = urllib.parse.quote(long_id, safe='')
    assert len(quoted) > 5000
    status, headers, _ = request(
        proxy, 'PUT', f'/{bucket}/big?partNumber=1&uploadId={quoted}',
        body=b'part one')
    assert status == 200
    complete = (f'<CompleteMultipartUpload><Part><PartNumber>1</PartNumber>'
                f'<ETag>{headers["ETag"]}</ETag></Part>'
                f'</CompleteMultipartUpload>').encode()
    status, _, _ = request(proxy, 'POST', f'/{bucket}/big?uploadId={quoted}',
                           body=complete)
    assert status == 200
    assert server.client().get_object(Bucket=bucket, Key='big')['Body'].read() \
        == b'part one'
