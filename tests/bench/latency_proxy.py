#!/usr/bin/python3
"""Runs the counting proxy of tests/harness/s3proxy.py with a constant
per-request latency, in a process of its own, for tests/bench/bench.py.

The proxy relays every byte the file systems fetch; in the benchmark's own
process it would compete for the interpreter lock with the readers being
timed, so it gets a process (and a lock) to itself.

    latency_proxy.py UPSTREAM_ENDPOINT --latency SECONDS

prints one JSON line {"endpoint": "http://127.0.0.1:PORT"} once it listens,
then answers commands read from standard input, one per line, with one JSON
line each:
    reset     zeroes the counters; answers {}
    counters  answers {"counts": {KIND: N, ...}, "bytes": BYTES,
              "bytes_sent": BYTES}: the requests by kind, the response
              body bytes sent to clients and the request body bytes
              clients sent (as they came, chunked framing included), since
              the last reset
    requests  answers {"requests": [[METHOD, PATH, QUERY, STATUS], ...]}:
              every request since the last reset, in order
The kinds are s3proxy.py's, with one change: a ListObjects version 1
request (a GET on the bucket with listing parameters only, as s3fs and
rclone send them) counts as LIST, not OTHER. Three more count subsets of
PUT and POST:
    PUT_PART  UploadPart with a body (a PUT with partNumber, no copy source)
    COPY      a PUT with x-amz-copy-source (CopyObject or UploadPartCopy)
    MPU       CreateMultipartUpload (a POST with ?uploads)
It stops when its standard input closes, so it never outlives its parent.
"""
import argparse
import collections
import json
import sys
import threading
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'harness'))
import s3proxy  # noqa: E402

LIST_V1_PARAMETERS = {'prefix', 'delimiter', 'marker', 'max-keys',
                      'encoding-type'}


class UploadCounter:
    """What clients sent: request body bytes and the write kinds that
    s3proxy does not tell apart (they need the headers)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self):
        with self._lock:
            self.bytes_sent = 0
            self.counts = collections.Counter()

    def note(self, method, target, headers, body_bytes):
        query = urllib.parse.urlsplit(target).query
        parameters = urllib.parse.parse_qs(query, keep_blank_values=True)
        kinds = []
        if method == 'PUT' and headers.get('x-amz-copy-source') is not None:
            kinds.append('COPY')
        elif method == 'PUT' and 'partNumber' in parameters:
            kinds.append('PUT_PART')
        elif method == 'POST' and 'uploads' in parameters:
            kinds.append('MPU')
        with self._lock:
            self.bytes_sent += body_bytes
            for kind in kinds:
                self.counts[kind] += 1

    def snapshot(self):
        with self._lock:
            return self.bytes_sent, dict(self.counts)


UPLOADS = UploadCounter()
_read_body = s3proxy._Handler._read_body


def _counting_read_body(handler):
    """s3proxy's _read_body, noting what the client sent."""
    body = _read_body(handler)
    UPLOADS.note(handler.command, handler.path, handler.headers, len(body))
    return body


s3proxy._Handler._read_body = _counting_read_body


def request_kind(record):
    """s3proxy's kind of RECORD, but LIST for a ListObjects (version 1)."""
    if record.kind == 'OTHER' and record.method == 'GET':
        bucket, _, key = record.path.lstrip('/').partition('/')
        parameters = urllib.parse.parse_qs(record.query,
                                           keep_blank_values=True)
        if bucket and not key and set(parameters) <= LIST_V1_PARAMETERS:
            return 'LIST'
    return record.kind


def counters(proxy):
    counts = collections.Counter()
    for record in proxy.records():
        counts[request_kind(record)] += 1
        if record.kind == 'GET' and record.ranged:
            counts['GET_RANGE'] += 1
    bytes_sent, upload_counts = UPLOADS.snapshot()
    counts.update(upload_counts)
    return {'counts': dict(counts), 'bytes': proxy.bytes_to_client,
            'bytes_sent': bytes_sent}


def answer(value):
    sys.stdout.write(json.dumps(value) + '\n')
    sys.stdout.flush()


def serve(proxy):
    for line in sys.stdin:
        command = line.strip()
        if command == 'reset':
            proxy.reset_counters()
            UPLOADS.reset()
            answer({})
        elif command == 'counters':
            answer(counters(proxy))
        elif command == 'requests':
            answer({'requests': [[r.method, r.path, r.query, r.status]
                                 for r in proxy.records()]})
        else:
            answer({'error': f'unknown command {command!r}'})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('upstream', help='http://127.0.0.1:PORT of the server')
    parser.add_argument('--latency', type=float, default=0.020,
                        help='seconds added to every request (default 0.020)')
    args = parser.parse_args()
    with s3proxy.S3Proxy(args.upstream, latency=args.latency) as proxy:
        answer({'endpoint': proxy.endpoint})
        serve(proxy)


if __name__ == '__main__':
    main()
