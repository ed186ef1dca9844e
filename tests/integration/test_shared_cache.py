"""-o shared_cache: a second bucket that the nodes of a cluster share, so
that each byte leaves the origin once per cluster.

The origin is the session's server; the tier runs on a server of the
other kind, started here (s3rver's run: a Swift tier; Swift's run: an
s3rver tier), so both directions are covered. Mounts with their own cache
directories stand for nodes. The origin is reached through a counting
proxy: bytes from the origin are what the proxy relayed, checked against
the daemon's counters; what landed in the tier is checked with boto3.
"""
import hashlib
import os
import random
import socket
import subprocess
import threading
import time

import pytest
import xxhash

import servers
import s3proxy
from conftest import read_stats, wait_for, BINARY, new_bucket_name

KiB = 1024
MiB = 1024 * KiB
BLOCK = MiB
TIER_PREFIX = 'cluster-a/'
RNG = random.Random(1313)


@pytest.fixture(scope='module')
def tier_server(server, tmp_path_factory):
    """A server of the other kind, for the tier."""
    kind = servers.SwiftServer if server.name == 's3rver' else servers.S3rverServer
    instance = kind(tmp_path_factory.mktemp('tier-server'))
    instance.start()
    yield instance
    instance.stop()


@pytest.fixture
def tier_bucket(tier_server):
    name = new_bucket_name('tier')
    tier_server.create_bucket(name)
    yield name
    tier_server.delete_bucket_recursive(name)


@pytest.fixture
def origin(server):
    with s3proxy.S3Proxy(server.endpoint) as running:
        yield running


def tier_profile(home, tier_server):
    """~/.aws/credentials with the tier's keys as profile 'tier' (the
    origin's come from the environment)."""
    aws = home / '.aws'
    aws.mkdir(exist_ok=True)
    credentials = aws / 'credentials'
    credentials.write_text(f'[tier]\naws_access_key_id = {tier_server.access_key}\n'
                           f'aws_secret_access_key = {tier_server.secret_key}\n')
    credentials.chmod(0o600)


def shared_options(tier_server, tier_bucket, endpoint=None):
    return [f'shared_cache={tier_bucket}:{TIER_PREFIX}',
            f'shared_cache_endpoint={endpoint or tier_server.endpoint}',
            'shared_cache_profile=tier']


def put_files(s3, bucket):
    files = {
        'models/weights.bin': RNG.randbytes(5 * MiB + 4321),
        'models/config.json': RNG.randbytes(900),
        'data/part-0.bin': RNG.randbytes(2 * MiB),
    }
    for key, body in files.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    return files


def blocks_of(files):
    return sum((len(body) + BLOCK - 1) // BLOCK for body in files.values())


def sha(data):
    return hashlib.sha256(data).hexdigest()


def origin_bytes(proxy, bucket):
    return sum(r.body_bytes for r in proxy.records(
        lambda r: r.kind == 'GET' and r.path.startswith(f'/{bucket}/')))


def read_all(mnt, files):
    for key, body in files.items():
        assert sha((mnt.path / key).read_bytes()) == sha(body), key


def tier_settled(mnt):
    """The counters once nothing waits to be written to the tier."""
    def settled():
        stats = read_stats(mnt.path)
        return stats if stats['tier_queued_bytes'] == 0 else None
    return wait_for(settled, 30, 'the writes to the shared cache')


def tier_keys(tier_server, tier_bucket):
    s3 = tier_server.client()
    keys = []
    for page in s3.get_paginator('list_objects_v2').paginate(
            Bucket=tier_bucket, Prefix=TIER_PREFIX):
        keys += [item['Key'] for item in page.get('Contents', [])]
    return keys


def tier_blocks(tier_server, tier_bucket):
    """The keys of the blocks in the tier (not the leases)."""
    return [k for k in tier_keys(tier_server, tier_bucket) if '/lease-' not in k]


def test_second_node_reads_from_the_shared_cache(server, s3, bucket, mount, home,
                                                 origin, tier_server,
                                                 tier_bucket):
    """Node A reads from the origin and fills the tier; nodes B and C,
    with caches of their own, read every byte from the tier: nothing from
    the origin, the same bytes."""
    files = put_files(s3, bucket)
    total = sum(len(body) for body in files.values())
    tier_profile(home, tier_server)
    options = shared_options(tier_server, tier_bucket)

    a = mount(bucket, options=options, endpoint=origin.endpoint, name='a')
    read_all(a, files)
    stats = tier_settled(a)
    assert origin_bytes(origin, bucket) == total
    assert stats['bytes_from_bucket'] == total
    assert stats['tier_written_blocks'] == blocks_of(files)
    assert stats['bytes_to_tier'] == total
    assert stats['tier_hit_blocks'] == 0
    keys = tier_blocks(tier_server, tier_bucket)
    assert len(keys) == blocks_of(files)
    assert all(k.startswith(TIER_PREFIX + 's3cachefs-tier/v2/') for k in keys)
    # the frame the man page gives, checked with an XXH3 of its own: the
    # last block of the weights (4321 bytes) under a 64-byte header
    tail = files['models/weights.bin'][5 * MiB:]
    [last] = [k for k in keys if k.endswith(f'/{BLOCK}-5')]
    frame = tier_server.client().get_object(Bucket=tier_bucket,
                                            Key=last)['Body'].read()
    assert frame[:16] == b'S3CFSTB2' + len(tail).to_bytes(4, 'little') + bytes(4)
    assert frame[48:64] == xxhash.xxh3_128_digest(tail)
    assert frame[64:] == tail

    for name in ('b', 'c'):
        origin.reset_counters()
        node = mount(bucket, options=options, endpoint=origin.endpoint, name=name)
        read_all(node, files)
        assert origin_bytes(origin, bucket) == 0, name
        stats = tier_settled(node)
        assert stats['bytes_from_tier'] == total
        assert stats['tier_hit_blocks'] == blocks_of(files)
        assert stats['bytes_from_bucket'] == 0
        assert stats['tier_written_blocks'] == 0
        assert stats['tier_bad_blocks'] == 0 and stats['tier_errors'] == 0


def test_nodes_reading_at_once_fetch_once(server, s3, bucket, mount, home,
                                         origin, tier_server, tier_bucket):
    """Three nodes that read the same file at the same moment: neither
    server has conditional writes, so leases are written and read back;
    the origin sends the file about once (at most 1.25 times), not three
    times, and every node reads the same bytes."""
    size = 48 * MiB
    body = RNG.randbytes(size)
    s3.put_object(Bucket=bucket, Key='weights.bin', Body=body)
    tier_profile(home, tier_server)
    options = shared_options(tier_server, tier_bucket)
    nodes = [mount(bucket, options=options, endpoint=origin.endpoint, name=n)
             for n in ('a', 'b', 'c')]
    origin.reset_counters()
    start = threading.Barrier(len(nodes))
    digests = {}

    def read(node):
        start.wait()
        digests[node.path] = sha((node.path / 'weights.bin').read_bytes())

    threads = [threading.Thread(target=read, args=(n,)) for n in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert list(digests.values()) == [sha(body)] * len(nodes)
    fetched = origin_bytes(origin, bucket)
    stats = [read_stats(n.path) for n in nodes]
    # A tier request past its deadline while the tier answered others is
    # counted (tier_errors), not a skip, and costs at most the group of
    # blocks it was about (8): a failed read fetches its block alone, a
    # lease that ran out without its blocks is claimed by the node that
    # waited on it (CI saw 1.29x for one error, when each waiting node
    # fetched the rest of its run). One with no answer since (an
    # overloaded single-threaded s3rver as the tier, under load) skips the
    # tier on that node for 10 s, which then reads from the origin: the
    # file still does not come three times.
    skipped = sum(s['tier_skipped_blocks'] for s in stats) > 0
    errors = sum(s['tier_errors'] for s in stats)
    bound = (len(nodes) * size - 1 if skipped
             else size * 5 // 4 + errors * 8 * BLOCK)
    assert size <= fetched <= bound, (fetched / size, [
        {k: v for k, v in s.items() if k.startswith('tier_') and
         'requests' not in k or k == 'bytes_from_bucket'} for s in stats])
    assert sum(s['bytes_from_bucket'] for s in stats) == fetched
    assert all(s['tier_lease_mode'] == 2 for s in stats)
    assert sum(s['tier_leases'] for s in stats) >= size // (8 * BLOCK)
    assert sum(s['tier_lease_waits_met'] for s in stats) > 0
    assert sum(s['bytes_from_tier'] for s in stats) >= 3 * size - fetched


def test_unmount_writes_what_waits(server, s3, bucket, mount, home, origin,
                                   tier_server, tier_bucket):
    """A node unmounted right after its reads still writes the blocks that
    waited for the tier (within a bound): the next node finds them all."""
    files = put_files(s3, bucket)
    tier_profile(home, tier_server)
    options = shared_options(tier_server, tier_bucket)
    a = mount(bucket, options=options, endpoint=origin.endpoint, name='a')
    read_all(a, files)
    a.unmount()
    blocks = tier_blocks(tier_server, tier_bucket)
    assert len(blocks) == blocks_of(files)
    origin.reset_counters()
    b = mount(bucket, options=options, endpoint=origin.endpoint, name='b')
    read_all(b, files)
    assert origin_bytes(origin, bucket) == 0


def test_damaged_block_in_the_shared_cache(server, s3, bucket, mount, home,
                                           origin, tier_server, tier_bucket):
    """A block changed in the tier (by anyone) is not served: it is read
    from the origin, counted, and the file reads right."""
    files = {'w.bin': RNG.randbytes(4 * MiB)}
    s3.put_object(Bucket=bucket, Key='w.bin', Body=files['w.bin'])
    tier_profile(home, tier_server)
    options = shared_options(tier_server, tier_bucket)
    a = mount(bucket, options=options, endpoint=origin.endpoint, name='a')
    read_all(a, files)
    tier_settled(a)

    tier_s3 = tier_server.client()
    keys = sorted(tier_blocks(tier_server, tier_bucket))
    assert len(keys) == 4
    damaged = next(k for k in keys if k.endswith('-2'))
    body = bytearray(tier_s3.get_object(Bucket=tier_bucket, Key=damaged)['Body'].read())
    body[64 + 1000] ^= 0xff
    tier_s3.put_object(Bucket=tier_bucket, Key=damaged, Body=bytes(body))

    origin.reset_counters()
    b = mount(bucket, options=options, endpoint=origin.endpoint, name='b')
    read_all(b, files)
    stats = read_stats(b.path)
    assert stats['tier_bad_blocks'] == 1
    assert stats['tier_hit_blocks'] >= 2
    assert BLOCK <= origin_bytes(origin, bucket) <= 2 * BLOCK
    assert stats['bytes_from_bucket'] == origin_bytes(origin, bucket)


def closed_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def test_shared_cache_down_never_fails_a_read(server, s3, bucket, mount, home,
                                              origin, tier_server, tier_bucket):
    """A tier nobody answers at: the mount starts (with a warning), reads
    come from the origin, the tier is skipped after one failure."""
    files = put_files(s3, bucket)
    total = sum(len(body) for body in files.values())
    tier_profile(home, tier_server)
    down = f'http://127.0.0.1:{closed_port()}'
    node = mount(bucket, options=shared_options(tier_server, tier_bucket, down),
                 endpoint=origin.endpoint)
    assert 'cannot be reached now' in node.log()
    read_all(node, files)
    stats = read_stats(node.path)
    assert origin_bytes(origin, bucket) == total
    assert stats['tier_errors'] >= 1 and stats['tier_skipping'] == 1
    assert stats['tier_hit_blocks'] == 0 and stats['tier_written_blocks'] == 0


def test_slow_shared_cache_is_skipped(server, s3, bucket, mount, home,
                                      origin, tier_server, tier_bucket):
    """A tier that holds a read past its deadline (5 s and the bytes at
    8 MiB/s) is left alone: the read goes to the origin, the file reads
    right, nothing more is asked of the tier."""
    files = {'w.bin': RNG.randbytes(3 * MiB)}
    s3.put_object(Bucket=bucket, Key='w.bin', Body=files['w.bin'])
    tier_profile(home, tier_server)
    with s3proxy.S3Proxy(tier_server.endpoint) as tier_proxy:
        tier_proxy.inject('stall', 1, match='GET', seconds=20)
        node = mount(bucket, endpoint=origin.endpoint,
                     options=shared_options(tier_server, tier_bucket,
                                            tier_proxy.endpoint))
        tier_proxy.reset_counters()
        read_all(node, files)
        stats = read_stats(node.path)
        assert stats['tier_errors'] == 1 and stats['tier_skipping'] == 1
        assert stats['bytes_from_bucket'] == len(files['w.bin'])
        assert tier_proxy.counts['GET'] == 1
        assert tier_proxy.counts['PUT'] == 0


# A tier request's deadline (tier_setup.h: 5 s, and the bytes at
# 8 MiB/s: a block's frame). A read may pay one, then the tier is skipped.
DEADLINE = 5.0 + (BLOCK + 64) / (8 * MiB)
READERS = 4


def timed_reads(mnt, files):
    """Each file read by a thread of its own, all at the same moment: the
    seconds each read took, and the SHA-256 of what it read."""
    start = threading.Barrier(len(files))
    seconds, digests = {}, {}

    def read(key):
        start.wait()
        began = time.monotonic()
        digests[key] = sha((mnt.path / key).read_bytes())
        seconds[key] = time.monotonic() - began

    threads = [threading.Thread(target=read, args=(k,)) for k in files]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return seconds, digests


@pytest.mark.parametrize('stalled', ['PUT', 'all'])
def test_stalled_shared_cache_costs_a_read_one_deadline(
        server, s3, bucket, mount, home, origin, tier_server, tier_bucket,
        stalled):
    """A tier that stalls its writes while its reads answer, or stalls
    every request: readers that miss at the same moment each wait at most
    one request's deadline, all at once (not one after another), then
    the tier is skipped and the bytes come from the origin, each once."""
    files = {f'r{i}.bin': RNG.randbytes(4 * MiB) for i in range(READERS)}
    warm = {'warm.bin': RNG.randbytes(BLOCK)}
    for key, body in {**files, **warm}.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    tier_profile(home, tier_server)
    with s3proxy.S3Proxy(tier_server.endpoint) as tier_proxy:
        node = mount(bucket, endpoint=origin.endpoint,
                     options=shared_options(tier_server, tier_bucket,
                                            tier_proxy.endpoint))
        read_all(node, warm)        # the lease mode known, the tier answering
        assert tier_settled(node)['tier_written_blocks'] == 1
        tier_proxy.reset_counters()
        tier_proxy.inject('stall', 10000, seconds=60,
                          match='PUT' if stalled == 'PUT' else None)
        seconds, digests = timed_reads(node, files)
        assert digests == {key: sha(body) for key, body in files.items()}
        stats = read_stats(node.path)
        assert stats['tier_skipping'] == 1
        assert max(seconds.values()) < DEADLINE + 2.5, seconds
        assert stats['bytes_from_bucket'] == sum(
            len(body) for body in {**files, **warm}.values())
        # each reader sent what it waited for at once, then nothing more:
        # a lease write (or a block read, when everything stalls) apiece
        # and at most one of its read-ahead's
        leases = tier_proxy.records(
            lambda r: r.kind == 'PUT' and '/lease-' in r.path)
        reads = tier_proxy.records(
            lambda r: r.kind == 'GET' and '/lease-' not in r.path)
        if stalled == 'PUT':
            assert 1 <= len(leases) <= 2 * READERS, len(leases)
        else:
            assert len(leases) == 0
            assert 1 <= len(reads) <= 2 * READERS, len(reads)


def test_shared_cache_refused_fails_the_mount(server, bucket, home, tmp_path,
                                              tier_server):
    """A tier bucket that does not exist, or that refuses the keys, is a
    mistake in the options: the mount fails, saying which."""
    tier_profile(home, tier_server)
    env = {k: v for k, v in os.environ.items() if not k.startswith('AWS_')}
    env.update(HOME=str(home), AWS_ACCESS_KEY_ID=server.access_key,
               AWS_SECRET_ACCESS_KEY=server.secret_key)
    mnt = tmp_path / 'mnt'
    mnt.mkdir()
    done = subprocess.run(
        [BINARY, '-f', bucket, str(mnt), '-o',
         f'endpoint={server.endpoint},cache={tmp_path / "cache"},'
         f'shared_cache=no-such-tier-bucket,'
         f'shared_cache_endpoint={tier_server.endpoint},'
         'shared_cache_profile=tier'],
        env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "shared cache: bucket 'no-such-tier-bucket'" in done.stderr
    assert tier_server.secret_key not in done.stderr

    done = subprocess.run(
        [BINARY, '-f', bucket, str(mnt), '-o',
         f'endpoint={server.endpoint},cache={tmp_path / "cache"},'
         f'shared_cache={bucket}'],
        env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert 'would show inside the mount' in done.stderr


def prune(tier_server, tier_bucket, home, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith('AWS_')}
    env['HOME'] = str(home)
    return subprocess.run(
        [BINARY, 'shared-cache', 'prune', f'{tier_bucket}:{TIER_PREFIX}',
         '--endpoint', tier_server.endpoint, '--profile', 'tier', *args],
        env=env, capture_output=True, text=True, timeout=120)


def test_prune_by_age_and_size(server, s3, bucket, mount, home, origin,
                               tier_server, tier_bucket):
    """`shared-cache prune` deletes whole versions, oldest first past a
    size, nothing with --dry-run or an age not reached, never an object
    that is not a block; nodes then read from the origin again."""
    files = put_files(s3, bucket)
    total = sum(len(body) for body in files.values())
    tier_profile(home, tier_server)
    options = shared_options(tier_server, tier_bucket)
    a = mount(bucket, options=options, endpoint=origin.endpoint, name='a')
    read_all(a, files)
    tier_settled(a)
    tier_s3 = tier_server.client()
    stranger = TIER_PREFIX + 's3cachefs-tier/v2/notes.txt'
    tier_s3.put_object(Bucket=tier_bucket, Key=stranger, Body=b'kept')
    before = set(tier_keys(tier_server, tier_bucket))
    leases = len(before) - len(tier_blocks(tier_server, tier_bucket))
    assert leases >= 3           # (a file's lease goes with its blocks)
    objects = blocks_of(files) + leases
    assert len(before) == objects + 1

    done = prune(tier_server, tier_bucket, home, '--older-than', '1d')
    assert done.returncode == 0, done.stderr
    assert 'pruning 0 versions' in done.stdout
    assert f'3 versions, {objects} blocks' in done.stdout
    done = prune(tier_server, tier_bucket, home, '--max-size', '1', '--dry-run')
    assert done.returncode == 0, done.stderr
    assert 'would prune 3 versions' in done.stdout
    assert set(tier_keys(tier_server, tier_bucket)) == before

    done = prune(tier_server, tier_bucket, home, '--max-size', '1')
    assert done.returncode == 0, done.stderr
    assert f'deleted {objects} blocks' in done.stdout
    assert tier_keys(tier_server, tier_bucket) == [stranger]

    origin.reset_counters()
    b = mount(bucket, options=options, endpoint=origin.endpoint, name='b')
    read_all(b, files)
    assert origin_bytes(origin, bucket) == total

    done = prune(tier_server, tier_bucket, home)
    assert done.returncode == 2 and '--older-than' in done.stderr
    done = prune(tier_server, tier_bucket, home, '--older-than', 'soon')
    assert done.returncode == 2 and "'soon'" in done.stderr
