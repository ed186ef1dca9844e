#!/usr/bin/python3
"""A counting, fault-injecting HTTP proxy for S3 tests, standard library only.

S3Proxy listens on 127.0.0.1 (a free port) and forwards every request to
one upstream S3 server, byte for byte: method, target, headers (the Host
header included) and body go on unchanged, so a SigV4 signature the client
made for the proxy's host:port is what the upstream server checks. Point
the client at S3Proxy.endpoint as if it were the server.

It also works as a forward proxy (http_proxy=http://127.0.0.1:PORT): a
request line with an absolute URI ("GET http://127.0.0.1:9000/b/k
HTTP/1.1") goes to that host:port in origin form, but only when the host
is a loopback address; anything else is refused with 403 and never
contacted. CONNECT is refused (501).

    with S3Proxy(server.endpoint) as proxy:        # or tls=(cert, key)
        ... client uses proxy.endpoint ...
        proxy.inject('slowdown', 3, match='GET')   # next 3 object GETs
        proxy.counts['GET'], proxy.bytes_to_client, proxy.records()

Request kinds (PROXY.counts, Record.kind, inject's match):
    GET     GET of an object (with or without Range)
    LIST    GET on a bucket with list-type in the query
    HEAD, PUT, DELETE, POST
    OTHER   anything else (ListBuckets, GET bucket?location, ...)
counts also has 'GET_RANGE': the object GETs that carried a Range header
(a subset of 'GET'), and 'COPY': the PUTs that carried x-amz-copy-source
(server-side copies, a subset of 'PUT'). bytes_from_client counts the
request bodies received (PUT and POST payloads, as sent on the wire).

Faults (inject(kind, count, match=None, seconds=2.0, chunk=1024)), applied
in the order they were injected to the next COUNT requests that match:
    slowdown  503 with an S3 <Error><Code>SlowDown</Code> document
    internal  500 with an S3 <Error><Code>InternalError</Code> document
    denied    403 with an S3 <Error><Code>AccessDenied</Code> document
    nosuchupload  404 with an S3 <Error><Code>NoSuchUpload</Code> document
              (what AWS answers a retried CompleteMultipartUpload)
    error200  200 with an S3 <Error><Code>InternalError</Code> document, not
              forwarded (as S3 may answer a copy or a complete that failed
              after its 200 went out)
    reset     the client connection is closed with SO_LINGER 0 (an RST),
              no answer, nothing forwarded
    lost      forwarded, the server's whole answer read, then the client
              connection is reset instead of relaying it: the server did
              the work, the answer is lost
    swallow   204 No Content, nothing forwarded: a server that says it did
              the work and did not (a DELETE that leaves the key)
    stall     the request waits SECONDS (default 2) before it is forwarded
    hold      the request waits until release() is called, then goes on
              (forwarded); if the proxy stops first, or drop_held() is
              called, its connection is reset and it is never forwarded.
              PROXY.holding is the number of requests waiting now.
    truncated_xml  forwarded; the answer's body cut to its first half, sent
              as a complete answer (Content-Length of the half)
    malformed_xml  forwarded; the answer's body made not well-formed XML
              ("<" doubled before its last end tag), Content-Length fixed
    short_body  forwarded; the answer's headers as sent (Content-Length of
              the whole body), half of the body, then the connection closes
    wrong_range  the Range header is moved one byte on before forwarding:
              the server sends other bytes than asked for, and its
              Content-Range says which (only requests with a Range match)
    ignore_if_match  If-Match is removed before forwarding, as by a server
              that ignores it (only requests with If-Match match)
    trickle   forwarded; the whole answer (status line, headers, body)
              relayed CHUNK bytes every SECONDS
    repeat_token  forwarded; the listing says it is truncated and that its
              NextContinuationToken is the continuation-token the request
              carried (only LIST requests with one match): a listing that
              never ends
    idle_close  only a request that arrives on a connection idle for
              SECONDS or more since its last answer matches: the request is
              read, then the connection is closed (FIN) unanswered, as by a
              server whose keep-alive timeout fired as the request came
              (a fresh connection's first request never matches)
    long_upload_id  forwarded; the UploadId of a CreateMultipartUpload
              answer is made CHUNK bytes long (default 1024) with '+', '/'
              and '=' (3 bytes each once URL-encoded); later requests that
              name it get the server's own id back before they are
              forwarded. Their signature then no longer matches: only for
              servers that do not check signatures (s3rver).
The request body is always read before a fault is applied. MATCH is a
kind string as above ('GET_RANGE' too), or a callable taking
(method, path, query) and returning a bool; None matches every request.
PROXY.faults_injected counts the faults applied, by kind.

The server down (down(seconds, refuse=True)): for SECONDS the proxy stops
listening, so connections are refused (refuse=False: it keeps listening
and resets every request instead, counted as 'down_reset'), and every open
client connection is cut at once; then it listens again on the same port.
It returns at once; up() ends it early. faults_injected['down'] counts the
outages.

Latency (S3Proxy(upstream, latency=SECONDS)) delays every request by a
constant SECONDS before it is forwarded (or faulted), as a remote server
would. The wait happens in the handler thread of that request's
connection, so requests on parallel connections wait at the same time,
as they would on a real network.

make_certificates(directory) writes a throwaway CA and a server certificate
for 127.0.0.1 and localhost, for tls=.
"""
import collections
import contextlib
import http.client
import http.server
import ipaddress
import re
import shutil
import socket
import socketserver
import ssl
import struct
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path

LOOPBACK = '127.0.0.1'
FAULT_KINDS = ('slowdown', 'internal', 'reset', 'stall', 'denied', 'hold',
               'nosuchupload', 'error200', 'lost', 'truncated_xml',
               'malformed_xml', 'short_body', 'wrong_range',
               'ignore_if_match', 'trickle', 'repeat_token', 'idle_close',
               'long_upload_id', 'swallow')
# faults that forward the request and then change the answer on its way back
ANSWER_FAULTS = ('lost', 'truncated_xml', 'malformed_xml', 'short_body',
                 'trickle', 'repeat_token', 'long_upload_id')
REQUEST_KINDS = ('GET', 'GET_RANGE', 'LIST', 'HEAD', 'PUT', 'DELETE', 'POST',
                 'OTHER')  # inject() matches these; counts also has 'COPY'
UPSTREAM_TIMEOUT = 60.0
BLOCK = 64 * 1024
MAX_HEADER_LINE = 65536

ERROR_DOCUMENTS = {
    'slowdown': (503, 'Slow Down', 'SlowDown', 'Please reduce your request rate.'),
    'internal': (500, 'Internal Server Error', 'InternalError',
                 'We encountered an internal error. Please try again.'),
    'denied': (403, 'Forbidden', 'AccessDenied', 'Access Denied'),
    'nosuchupload': (404, 'Not Found', 'NoSuchUpload',
                     'The specified multipart upload does not exist.'),
    'error200': (200, 'OK', 'InternalError',
                 'We encountered an internal error. Please try again.'),
}

# (method, path, query, kind, ranged, status, body_bytes, fault, absolute)
Record = collections.namedtuple(
    'Record', 'method path query kind ranged status body_bytes fault absolute')
# A fault as applied to one request; gate: the release() event of a hold.
_Taken = collections.namedtuple('_Taken', 'kind seconds gate chunk')
# What a fault may look at besides the request's kind: its headers, its
# query and how long its connection had been idle (None: its first request).
_Request = collections.namedtuple('_Request', 'method path query kind ranged '
                                              'headers idle_for')


class ProxyError(RuntimeError):
    """The proxy could not be started or was misused."""


def classify(method, path, query, ranged=False):
    """The request kind of a path-style S3 request (see the module doc)."""
    parts = path.lstrip('/').split('/', 1)
    bucket = parts[0]
    key = parts[1] if len(parts) > 1 else ''
    params = urllib.parse.parse_qs(query, keep_blank_values=True)
    if method == 'GET':
        if bucket and key:
            return 'GET'
        if bucket and 'list-type' in params:
            return 'LIST'
        return 'OTHER'
    if method in ('HEAD', 'PUT', 'DELETE', 'POST'):
        return method
    return 'OTHER'


def is_loopback_host(host):
    if host == 'localhost':
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Fault:
    def __init__(self, kind, count, match, seconds, chunk):
        self.kind = kind
        self.remaining = count
        self.match = match
        self.seconds = seconds
        self.chunk = chunk

    def matches(self, request):
        if not self._applies(request):
            return False
        if self.match is None:
            return True
        if callable(self.match):
            return bool(self.match(request.method, request.path,
                                   request.query))
        if self.match == 'GET_RANGE':
            return request.kind == 'GET' and request.ranged
        return self.match == request.kind

    def _applies(self, request):
        """Faults that need something of the request to make sense."""
        if self.kind == 'wrong_range':
            return request.ranged
        if self.kind == 'ignore_if_match':
            return request.headers.get('If-Match') is not None
        if self.kind == 'repeat_token':
            return request.kind == 'LIST' and bool(_query_value(
                request.query, 'continuation-token'))
        if self.kind == 'idle_close':
            return (request.idle_for is not None
                    and request.idle_for >= self.seconds)
        return True


def _query_value(query, name):
    values = urllib.parse.parse_qs(query, keep_blank_values=True).get(name)
    return values[0] if values else None


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    server_version = 's3proxy'
    # Answers go out in several writes (headers, then body blocks). With
    # Nagle's algorithm a short body waits for the client's delayed ACK of
    # the headers, up to 40 ms more per request: far more than a simulated
    # latency, and only for some answers.
    disable_nagle_algorithm = True

    # The proxy object is reached through the server.
    @property
    def proxy(self):
        return self.server.proxy

    def setup(self):
        self.proxy._track(self.request, True)
        context = self.server.ssl_context
        if context is not None:
            raw = self.request
            raw.settimeout(10)
            try:
                self.request = context.wrap_socket(raw, server_side=True)
            except (ssl.SSLError, OSError) as error:
                # A client that rejects the certificate ends up here.
                self.proxy._note_tls_failure(error)
                raise _Abandon() from error
            finally:
                self.proxy._track(raw, False)
            self.request.settimeout(None)
            self.proxy._track(self.request, True)
        super().setup()

    def handle(self):
        try:
            super().handle()
        except Exception:  # noqa: BLE001 - the connection just ends
            if self.proxy.verbose:
                raise

    def finish(self):
        with contextlib.suppress(OSError):
            super().finish()
        self.proxy._track(self.request, False)
        if isinstance(self.request, ssl.SSLSocket):
            # socketserver closes the accepted socket, not this wrapper
            with contextlib.suppress(OSError):
                self.request.close()

    def log_message(self, format, *args):  # noqa: A002 - quiet by default
        if self.proxy.verbose:
            super().log_message(format, *args)

    # Every method goes through one place. (Expect: 100-continue is
    # answered here by BaseHTTPRequestHandler, and forwarded as well.)
    def __getattr__(self, name):
        if name.startswith('do_'):
            return self._proxy_request
        raise AttributeError(name)

    def _proxy_request(self):
        method = self.command
        target = self.path
        absolute = False
        upstream = self.proxy.upstream
        # how long this connection waited for this request (None: its first)
        last_answer = getattr(self, '_last_answer', None)
        idle_for = None if last_answer is None else \
            time.monotonic() - last_answer
        try:
            self._proxy_one(method, target, absolute, upstream, idle_for)
        finally:
            self._last_answer = time.monotonic()

    def _proxy_one(self, method, target, absolute, upstream, idle_for):
        proxy = self.proxy
        if method == 'CONNECT':
            self._read_body()
            self._answer_plain(501, 'CONNECT is not supported by this proxy')
            return
        if not target.startswith('/'):
            split = urllib.parse.urlsplit(target)
            host = split.hostname or ''
            if split.scheme != 'http' or not is_loopback_host(host):
                self._read_body()
                proxy._count_refused()
                self._answer_plain(403, f'refusing to forward to {target!r}: '
                                        f'only http:// on loopback')
                return
            absolute = True
            upstream = (host, split.port or 80)
            target = split.path or '/'
            if split.query:
                target += '?' + split.query
        path, _, query = target.partition('?')
        path = urllib.parse.unquote(path)
        ranged = self.headers.get('Range') is not None
        kind = classify(method, path, query, ranged)
        body = self._read_body()
        if proxy._resetting_while_down():
            self._reset()
            return
        proxy._add_request(kind, self.headers, len(body))
        if proxy.latency and proxy._stopping.wait(proxy.latency):
            self._reset()
            return
        request = _Request(method, path, query, kind, ranged, self.headers,
                           idle_for)
        fault = proxy._take_fault(request)
        index = proxy._record(Record(method, path, query, kind, ranged, None, 0,
                                     fault.kind if fault else None, absolute))
        if fault is not None and fault.kind == 'reset':
            self._reset()
            return
        if fault is not None and fault.kind == 'idle_close':
            self._close_unanswered()
            return
        if fault is not None and fault.kind == 'stall':
            if proxy._stopping.wait(fault.seconds):
                self._reset()
                return
        if fault is not None and fault.kind == 'hold':
            if not proxy._wait_release(fault.gate):
                self._reset()
                return
        if fault is not None and fault.kind in ERROR_DOCUMENTS:
            self._answer_error(fault.kind, path, index)
            return
        if fault is not None and fault.kind == 'swallow':
            self._answer_empty(204, index)
            return
        headers = list(self.headers.items())
        if fault is not None and fault.kind == 'wrong_range':
            headers = [(name, _shift_range(value) if name.lower() == 'range'
                        else value) for name, value in headers]
        if fault is not None and fault.kind == 'ignore_if_match':
            headers = [(name, value) for name, value in headers
                       if name.lower() != 'if-match']
        answer_fault = fault if fault and fault.kind in ANSWER_FAULTS else None
        target = proxy._short_upload_ids(target)
        self._forward(upstream, method, target, headers, body, index, absolute,
                      answer_fault, query)

    def _read_body(self):
        """The request body, raw (chunked framing kept), or b''."""
        encoding = self.headers.get('Transfer-Encoding', '')
        if 'chunked' in encoding.lower():
            raw = bytearray()
            while True:
                line = self.rfile.readline(MAX_HEADER_LINE)
                raw += line
                size = int(line.split(b';', 1)[0].strip() or b'0', 16)
                if size == 0:
                    while True:  # trailers, then an empty line
                        trailer = self.rfile.readline(MAX_HEADER_LINE)
                        raw += trailer
                        if trailer in (b'\r\n', b'\n', b''):
                            return bytes(raw)
                raw += self._read_exact(size + 2)
        length = self.headers.get('Content-Length')
        if length is None:
            return b''
        return self._read_exact(int(length))

    def _read_exact(self, size):
        data = self.rfile.read(size)
        if len(data) != size:
            raise ConnectionError('the client closed mid-body')
        return data

    def _reset(self):
        """Close the client connection with an RST, answering nothing."""
        sock = self.request
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                            struct.pack('ii', 1, 0))
        self.close_connection = True
        self.proxy._track(sock, False)
        # makefile() objects keep the socket open past close(): detach the
        # descriptor and close that, so the RST goes out now.
        with contextlib.suppress(OSError):
            fd = sock.detach()
            if fd >= 0:
                socket.close(fd)

    def _close_unanswered(self):
        """Close the client connection (a FIN), answering nothing."""
        sock = self.request
        self.close_connection = True
        self.proxy._track(sock, False)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            fd = sock.detach()
            if fd >= 0:
                socket.close(fd)

    def _answer_empty(self, status, index):
        self.proxy._finish_record(index, status, 0)
        self.send_response_only(status)
        self.send_header('Content-Length', '0')
        self.end_headers()

    def _answer_plain(self, status, text, index=None):
        body = (text + '\n').encode()
        if index is not None:
            self.proxy._finish_record(index, status, len(body))
        self.proxy._add_bytes(len(body))
        self.send_response_only(status)
        self.send_header('Content-Type', 'text/plain')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _answer_error(self, fault_kind, path, index):
        status, reason, code, message = ERROR_DOCUMENTS[fault_kind]
        request_id = f'{self.proxy._next_id():016X}'
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}'
                f'</Code><Message>{message}</Message><Resource>'
                f'{_xml_escape(path)}</Resource><RequestId>{request_id}'
                f'</RequestId></Error>').encode()
        if self.command == 'HEAD':
            body = b''
        # Counters first: a client that has its answer sees them updated.
        self.proxy._finish_record(index, status, len(body))
        self.proxy._add_bytes(len(body))
        self.send_response_only(status, reason)
        self.send_header('Content-Type', 'application/xml')
        self.send_header('x-amz-request-id', request_id)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _forward(self, upstream, method, target, headers, body, index,
                 absolute, answer_fault=None, query=''):
        connection = http.client.HTTPConnection(*upstream,
                                                timeout=UPSTREAM_TIMEOUT)
        try:
            try:
                connection.putrequest(method, target, skip_host=True,
                                      skip_accept_encoding=True)
                for name, value in headers:
                    if absolute and name.lower().startswith('proxy-'):
                        continue  # addressed to this proxy, not the server
                    connection.putheader(name, value)
                connection.endheaders()
                if body:
                    connection.send(body)
                response = connection.getresponse()
            except (OSError, http.client.HTTPException) as error:
                self._answer_plain(502, f'upstream {upstream}: {error}', index)
                return
            if answer_fault is not None:
                self._fault_response(method, response, index, answer_fault,
                                     query)
            else:
                self._relay_response(method, response, index)
        finally:
            connection.close()

    def _fault_response(self, method, response, index, fault, query):
        """Reads the server's whole answer, then hands it on as FAULT says
        (see the module doc)."""
        proxy = self.proxy
        has_body = (method != 'HEAD' and response.status not in (204, 304)
                    and not 100 <= response.status < 200)
        data = response.read() if has_body else b''
        proxy._finish_record(index, response.status, 0)
        if fault.kind == 'lost':
            self._reset()
            return
        kept = [(name, value) for name, value in response.getheaders()
                if name.lower() not in ('content-length', 'transfer-encoding',
                                        'connection')]
        declared = len(data)
        if has_body and fault.kind == 'truncated_xml':
            data = data[:len(data) // 2]
            declared = len(data)
        elif has_body and fault.kind == 'malformed_xml':
            end_tag = data.rfind(b'</')
            data = (data[:end_tag] + b'<' + data[end_tag:] if end_tag >= 0
                    else data + b'<')
            declared = len(data)
        elif has_body and fault.kind == 'repeat_token':
            token = _xml_escape(_query_value(query, 'continuation-token'))
            element = (b'<NextContinuationToken>' + token.encode() +
                       b'</NextContinuationToken>')
            data = re.sub(rb'<NextContinuationToken>[^<]*'
                          rb'</NextContinuationToken>', b'', data)
            # (a last page says it is the last: make it say more follows)
            data = re.sub(rb'<IsTruncated>[^<]*</IsTruncated>',
                          b'<IsTruncated>true</IsTruncated>' + element, data,
                          count=1)
            declared = len(data)
        elif has_body and fault.kind == 'short_body':
            data = data[:len(data) // 2]
        elif has_body and fault.kind == 'long_upload_id':
            match = re.search(rb'<UploadId>([^<]+)</UploadId>', data)
            if match is not None:
                real = match.group(1).decode()
                padding = ('+/=' * fault.chunk)[:max(0, fault.chunk -
                                                     len(real) - 1)]
                long_id = f'{real}~{padding}'
                proxy._note_long_upload_id(long_id, real)
                data = data.replace(match.group(0), b'<UploadId>' +
                                    _xml_escape(long_id).encode() +
                                    b'</UploadId>')
            declared = len(data)
        head = [f'HTTP/1.1 {response.status} {response.reason}\r\n'.encode()]
        for name, value in kept:
            head.append(f'{name}: {value}\r\n'.encode('latin-1'))
        if has_body or method == 'HEAD':
            length = response.getheader('Content-Length') \
                if not has_body else str(declared)
            if length is not None:
                head.append(f'Content-Length: {length}\r\n'.encode())
        head.append(b'\r\n')
        answer = b''.join(head) + data
        proxy._finish_record(index, response.status, len(data))
        proxy._add_bytes(len(data))
        if fault.kind == 'trickle':
            for at in range(0, len(answer), max(1, fault.chunk)):
                self.wfile.write(answer[at:at + max(1, fault.chunk)])
                if at + fault.chunk < len(answer) and \
                        proxy._stopping.wait(fault.seconds):
                    self._reset()
                    return
        else:
            self.wfile.write(answer)
        if fault.kind == 'short_body':
            self._close_unanswered()

    def _relay_response(self, method, response, index):
        """Copies RESPONSE to the client. The record is updated before the
        bytes go out, so a client that got them sees them counted."""
        proxy = self.proxy
        proxy._finish_record(index, response.status, 0)
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            self.send_header(name, value)
        has_body = (method != 'HEAD' and response.status not in (204, 304)
                    and not 100 <= response.status < 200)
        until_close = (has_body and not response.chunked
                       and response.length is None)
        if until_close:
            self.close_connection = True
        self.end_headers()
        sent = 0
        if not has_body:
            return
        while True:
            block = response.read1(BLOCK) if response.chunked else \
                response.read(BLOCK)
            if not block:
                break
            sent += len(block)
            proxy._finish_record(index, response.status, sent)
            proxy._add_bytes(len(block))
            if response.chunked:
                self.wfile.write(b'%x\r\n%s\r\n' % (len(block), block))
            else:
                self.wfile.write(block)
        if response.chunked:
            self.wfile.write(b'0\r\n\r\n')
        elif response.length:  # the upstream body was cut short
            self.close_connection = True


class _Abandon(Exception):
    """The connection is given up before any request (TLS failure)."""


def _shift_range(value):
    """'bytes=A-B' -> 'bytes=A+1-B+1' (other bytes than asked for)."""
    match = re.fullmatch(r'bytes=(\d+)-(\d*)', value.strip())
    if match is None:
        return value
    first = int(match.group(1)) + 1
    last = f'{int(match.group(2)) + 1}' if match.group(2) else ''
    return f'bytes={first}-{last}'


def _xml_escape(text):
    return (text.replace('&', '&amp;').replace('<', '&lt;')
            .replace('>', '&gt;'))


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        if self.proxy.verbose:
            super().handle_error(request, client_address)


class S3Proxy:
    """A reverse (and loopback-only forward) proxy in front of one S3
    server; see the module documentation."""

    def __init__(self, upstream_endpoint, tls=None, verbose=False,
                 latency=0.0):
        split = urllib.parse.urlsplit(upstream_endpoint)
        if split.scheme != 'http' or not split.hostname:
            raise ProxyError(f'upstream must be http://HOST:PORT, not '
                             f'{upstream_endpoint!r}')
        if not is_loopback_host(split.hostname):
            raise ProxyError(f'upstream {split.hostname} is not loopback')
        self.upstream = (split.hostname, split.port or 80)
        self.upstream_endpoint = upstream_endpoint
        if latency < 0:
            raise ProxyError(f'latency must not be negative, not {latency}')
        self.tls = tls
        self.verbose = verbose
        self.latency = latency
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = None
        self._thread = None
        self._sockets = set()
        self._faults = []
        self._gate = threading.Event()
        self._holding = 0
        self._ids = 0
        self._port = None
        self._down_timer = None
        self._reset_until = 0.0
        self._long_ids = {}
        self.reset_counters()

    # ------------------------------------------------------------ life
    @property
    def port(self):
        if self._port is None:
            raise ProxyError('the proxy is not running')
        return self._port

    @property
    def endpoint(self):
        scheme = 'https' if self.tls else 'http'
        return f'{scheme}://{LOOPBACK}:{self.port}'

    @property
    def url(self):
        """The proxy as an http_proxy value."""
        return self.endpoint

    def start(self):
        """Listens (the port is bound and accepting when this returns) and
        serves from a background thread."""
        if self._server is not None or self._port is not None:
            raise ProxyError('the proxy is already running')
        self._stopping.clear()
        self._listen(0)
        return self

    def _listen(self, port):
        server = _Server((LOOPBACK, port), _Handler)
        server.proxy = self
        server.ssl_context = None
        if self.tls:
            certfile, keyfile = self.tls
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certfile, keyfile)
            server.ssl_context = context
        self._server = server
        self._port = server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever,
                                        kwargs={'poll_interval': 0.05},
                                        name=f's3proxy-{self._port}',
                                        daemon=True)
        self._thread.start()

    def _stop_listening(self):
        """Closes the listening socket and cuts every client connection."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            self._thread.join()
        self._cut_connections()

    def stop(self):
        """Stops listening, wakes stalled requests and cuts every open
        client connection; idempotent."""
        if self._port is None:
            return
        self._stopping.set()
        with self._lock:
            timer, self._down_timer = self._down_timer, None
        if timer is not None:
            timer.cancel()
        self._stop_listening()
        self._port = None

    def down(self, seconds, refuse=True):
        """The server is down for SECONDS (see the module doc); returns at
        once."""
        if self._port is None:
            raise ProxyError('the proxy is not running')
        with self._lock:
            self.faults_injected['down'] += 1
            if not refuse:
                self._reset_until = time.monotonic() + seconds
        if refuse:
            with self._lock:
                if self._down_timer is not None:
                    raise ProxyError('the proxy is down already')
                self._down_timer = threading.Timer(seconds, self.up)
                self._down_timer.daemon = True
            self._stop_listening()
            self._down_timer.start()
        else:
            self._cut_connections()

    def up(self):
        """Ends an outage begun by down() now; harmless when there is none."""
        with self._lock:
            timer, self._down_timer = self._down_timer, None
            self._reset_until = 0.0
        if timer is not None:
            timer.cancel()
        if self._port is not None and self._server is None and \
                not self._stopping.is_set():
            self._listen(self._port)

    @property
    def is_down(self):
        with self._lock:
            return (self._down_timer is not None
                    or time.monotonic() < self._reset_until)

    def _cut_connections(self):
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -------------------------------------------------------- counters
    def reset_counters(self):
        with self._lock:
            self._records = []
            self.counts = collections.Counter()
            self.faults_injected = collections.Counter()
            self.bytes_to_client = 0
            self.bytes_from_client = 0
            self.refused = 0
            self.tls_failures = []

    @property
    def requests(self):
        """(method, path, query) of each request seen, in order."""
        with self._lock:
            return [record[:3] for record in self._records]

    def records(self, predicate=None):
        """Records of the requests seen (see Record), optionally filtered."""
        with self._lock:
            records = list(self._records)
        return [r for r in records if predicate is None or predicate(r)]

    def body_bytes(self, predicate=None):
        """Response body bytes sent for the requests PREDICATE accepts."""
        return sum(r.body_bytes for r in self.records(predicate))

    # ---------------------------------------------------------- faults
    def inject(self, kind, count, match=None, seconds=2.0, chunk=1024):
        """Applies fault KIND to the next COUNT requests matching MATCH.
        SECONDS: a stall's wait, a trickle's pause between CHUNK bytes, the
        idle time idle_close needs."""
        if kind not in FAULT_KINDS:
            raise ProxyError(f'unknown fault {kind!r}: one of {FAULT_KINDS}')
        if isinstance(match, str) and match not in REQUEST_KINDS:
            raise ProxyError(f'unknown request kind {match!r}: one of '
                             f'{REQUEST_KINDS}')
        if count < 1:
            raise ProxyError('count must be at least 1')
        if chunk < 1 or seconds < 0:
            raise ProxyError('chunk must be at least 1, seconds not negative')
        with self._lock:
            self._faults.append(_Fault(kind, count, match, seconds, chunk))

    def pending_faults(self):
        """Faults not applied yet, as a Counter by kind."""
        with self._lock:
            pending = collections.Counter()
            for fault in self._faults:
                pending[fault.kind] += fault.remaining
            return pending

    def clear_faults(self):
        """Drops the faults not applied yet (held requests stay held)."""
        with self._lock:
            self._faults = []

    def release(self):
        """Lets every held request go on to the server and drops the hold
        faults not applied yet; other faults stay."""
        with self._lock:
            self._faults = [f for f in self._faults if f.kind != 'hold']
            gate, self._gate = self._gate, threading.Event()
        gate.set()

    def drop_held(self):
        """Resets every held request (never forwarded, as stop() does) and
        drops the hold faults not applied yet, but keeps serving: a mount
        killed while its requests were held, then mounted again through
        the same endpoint, finds nothing of them in the bucket."""
        with self._lock:
            self._faults = [f for f in self._faults if f.kind != 'hold']
            gate, self._gate = self._gate, threading.Event()
            gate.dropped = True
        gate.set()

    @property
    def holding(self):
        """How many requests are waiting at a hold now."""
        with self._lock:
            return self._holding

    # ------------------------------------------------ handler interface
    def _take_fault(self, request):
        with self._lock:
            for fault in self._faults:
                if fault.matches(request):
                    fault.remaining -= 1
                    if fault.remaining == 0:
                        self._faults.remove(fault)
                    self.faults_injected[fault.kind] += 1
                    return _Taken(fault.kind, fault.seconds, self._gate,
                                  fault.chunk)
        return None

    def _note_long_upload_id(self, long_id, real):
        with self._lock:
            self._long_ids[long_id] = real

    def _short_upload_ids(self, target):
        """TARGET with an uploadId made long by long_upload_id put back."""
        path, mark, query = target.partition('?')
        with self._lock:
            if not mark or not self._long_ids:
                return target
            pieces = []
            for piece in query.split('&'):
                name, equals, value = piece.partition('=')
                real = self._long_ids.get(urllib.parse.unquote(value))
                if name == 'uploadId' and equals and real is not None:
                    piece = 'uploadId=' + urllib.parse.quote(real, safe='')
                pieces.append(piece)
        return path + '?' + '&'.join(pieces)

    def _resetting_while_down(self):
        """True (and counted) when a request comes while down(refuse=False)."""
        with self._lock:
            if time.monotonic() >= self._reset_until:
                return False
            self.faults_injected['down_reset'] += 1
            return True

    def _wait_release(self, gate):
        """Waits for GATE (release()); False if the proxy stops first."""
        with self._lock:
            self._holding += 1
        try:
            while not gate.wait(0.05):
                if self._stopping.is_set():
                    return False
            dropped = getattr(gate, 'dropped', False)
            return not dropped and not self._stopping.is_set()
        finally:
            with self._lock:
                self._holding -= 1

    def _record(self, record):
        with self._lock:
            self._records.append(record)
            self.counts[record.kind] += 1
            if record.kind == 'GET' and record.ranged:
                self.counts['GET_RANGE'] += 1
            return len(self._records) - 1

    def _add_request(self, kind, headers, body_bytes):
        with self._lock:
            self.bytes_from_client += body_bytes
            if kind == 'PUT' and headers.get('x-amz-copy-source') is not None:
                self.counts['COPY'] += 1

    def _finish_record(self, index, status, body_bytes):
        with self._lock:
            if index < len(self._records):
                self._records[index] = self._records[index]._replace(
                    status=status, body_bytes=body_bytes)

    def _add_bytes(self, count):
        with self._lock:
            self.bytes_to_client += count

    def _count_refused(self):
        with self._lock:
            self.refused += 1

    def _note_tls_failure(self, error):
        with self._lock:
            self.tls_failures.append(str(error))

    def _next_id(self):
        with self._lock:
            self._ids += 1
            return self._ids

    def _track(self, sock, add):
        with self._lock:
            if add:
                self._sockets.add(sock)
            else:
                self._sockets.discard(sock)


def make_certificates(directory, days=2):
    """Writes a throwaway CA (ca.pem) and a server certificate for
    127.0.0.1/localhost signed by it (server.pem, server.key) into
    DIRECTORY; returns (ca, cert, key) paths. Uses the openssl command."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    openssl = shutil.which('openssl')
    if openssl is None:
        raise ProxyError('the openssl command is needed for certificates')
    ca_key, ca = directory / 'ca.key', directory / 'ca.pem'
    key, csr, cert = (directory / 'server.key', directory / 'server.csr',
                      directory / 'server.pem')
    extensions = directory / 'server.ext'
    extensions.write_text(
        'basicConstraints = critical, CA:FALSE\n'
        'keyUsage = critical, digitalSignature, keyEncipherment\n'
        'extendedKeyUsage = serverAuth\n'
        'subjectAltName = IP:127.0.0.1, DNS:localhost\n')

    def run(*args):
        done = subprocess.run([openssl, *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise ProxyError(f'openssl {args[0]} failed: {done.stderr}')

    run('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', str(ca_key),
        '-out', str(ca), '-days', str(days), '-subj',
        '/CN=s3cachefs throwaway test CA',
        '-addext', 'basicConstraints=critical,CA:TRUE',
        '-addext', 'keyUsage=critical,keyCertSign,cRLSign')
    run('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', str(key),
        '-out', str(csr), '-subj', '/CN=127.0.0.1')
    run('x509', '-req', '-in', str(csr), '-CA', str(ca), '-CAkey', str(ca_key),
        '-CAcreateserial', '-out', str(cert), '-days', str(days),
        '-extfile', str(extensions))
    for secret in (ca_key, key):
        secret.chmod(0o600)
    return ca, cert, key


if __name__ == '__main__':  # a manual smoke run: proxy an endpoint
    import sys
    with S3Proxy(sys.argv[1], verbose=True) as running:
        print(running.endpoint, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
