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
    counters  answers {"counts": {KIND: N, ...}, "bytes": BYTES}, the
              requests by kind and the response body bytes sent to
              clients since the last reset
The kinds are s3proxy.py's, with one change: a ListObjects version 1
request (a GET on the bucket with listing parameters only, as s3fs and
rclone send them) counts as LIST, not OTHER.
It stops when its standard input closes, so it never outlives its parent.
"""
import argparse
import collections
import json
import sys
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'harness'))
import s3proxy  # noqa: E402

LIST_V1_PARAMETERS = {'prefix', 'delimiter', 'marker', 'max-keys',
                      'encoding-type'}


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
    return {'counts': dict(counts), 'bytes': proxy.bytes_to_client}


def answer(value):
    sys.stdout.write(json.dumps(value) + '\n')
    sys.stdout.flush()


def serve(proxy):
    for line in sys.stdin:
        command = line.strip()
        if command == 'reset':
            proxy.reset_counters()
            answer({})
        elif command == 'counters':
            answer(counters(proxy))
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
