"""`s3cachefs warm PATH... [--from FILE|-] [--check] [--evict] [--pin]`
against a real mount.

Requests are counted by a proxy between the mount and the server
(tests/harness/s3proxy.py): "reading fetches nothing more" means the server
saw no GET, and "--check costs nothing" means it saw no request at all
while the command ran. Data goes in with boto3, straight to the server.
"""
import hashlib
import json
import os
import random
import signal
import subprocess
import time

from conftest import BINARY, drop_caches, kernel_caches_kept, read_stats, wait_for

KiB = 1 << 10
MiB = 1 << 20
RNG = random.Random(12)
TIMEOUT = 120
# Block size of the mounts here: files larger than a block and smaller.
BLOCK = 256 * KiB
# Long TTLs: nothing is revalidated or relisted behind a test's back, so
# the requests counted are the command's.
STEADY = ['attr_ttl=600', 'dir_ttl=600', f'block_size={BLOCK}']



def sha(data):
    return hashlib.sha256(data).hexdigest()


def command(*args, stdin=subprocess.DEVNULL, cwd=None, input=None):
    """`s3cachefs ARGS...`: the finished process (text output)."""
    if input is not None:
        stdin = None
    return subprocess.run([BINARY, *map(str, args)], capture_output=True,
                          text=True, stdin=stdin, cwd=cwd, input=input,
                          timeout=TIMEOUT)


def warm_json(*args, **kwargs):
    done = command('warm', '--json', *args, **kwargs)
    return done, json.loads(done.stdout) if done.stdout else None


def object_gets(proxy, bucket, key=None):
    prefix = f'/{bucket}/' + (key or '')
    return proxy.records(lambda r: r.kind == 'GET' and (
        r.path == prefix if key else r.path.startswith(prefix)))


def fetched(proxy, bucket, key=None):
    return sum(r.body_bytes for r in object_gets(proxy, bucket, key))


def put_tree(s3, bucket):
    """A tree: files larger than a block and smaller, nested directories
    (each with a marker object: s3rver misses deep common prefixes)."""
    files = {
        'data/big.bin': RNG.randbytes(3 * MiB + 12345),
        'data/small.txt': RNG.randbytes(1000),
        'data/one-block.bin': RNG.randbytes(BLOCK),
        'data/sub/mid.bin': RNG.randbytes(BLOCK + 1),
        'data/sub/deeper/leaf.bin': RNG.randbytes(700 * KiB),
        'data/sub/deeper/empty.bin': b'',
        'other/outside.bin': RNG.randbytes(2 * BLOCK),
    }
    for marker in ('data/', 'data/sub/', 'data/sub/deeper/', 'other/'):
        s3.put_object(Bucket=bucket, Key=marker, Body=b'',
                      ContentType='application/x-directory')
    for key, body in files.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    return files


def ls_lR(top):
    """What `ls -lR TOP` asks: every listing and every file's attributes."""
    for directory, _, names in os.walk(top):
        for name in names:
            os.lstat(os.path.join(directory, name))


def in_tree(files, top='data/'):
    return {k: v for k, v in files.items() if k.startswith(top)}


def test_warm_tree_then_reads_fetch_nothing(server, s3, bucket, mount, proxy):
    """warm of a directory fetches every byte of every file under it once
    (no more: each block once), nothing outside it; reading all of it
    afterwards sends no GET and gives the bucket's bytes; a second warm
    fetches nothing and says so; --check before says 0%, after 100%, and
    sends no request at all."""
    files = put_tree(s3, bucket)
    tree = in_tree(files)
    mnt = mount(bucket, endpoint=proxy.endpoint, options=STEADY)
    # no other test drops the kernel's caches meanwhile: its inodes,
    # and the daemon's listings with them, stay (see conftest.py)
    with kernel_caches_kept():
        ls_lR(mnt.path / 'data')    # attributes known, as after an `ls -lR`

        proxy.reset_counters()
        before, report = warm_json('--check', mnt.path / 'data')
        assert before.returncode == 0, before.stderr
        assert proxy.requests == [], proxy.requests
        assert report['files'] == len(tree)
        assert report['bytes'] == sum(map(len, tree.values()))
        assert report['cached'] == 0
        assert all(p['cached'] == 0 for p in report['paths'])

        proxy.reset_counters()
        done = command('warm', mnt.path / 'data')
        assert done.returncode == 0, done.stderr
        total = sum(map(len, tree.values()))
        # the summary line: files, bytes fetched, already cached, seconds, rate
        assert done.stdout.startswith(f'warm: {len(tree)} files, '), done.stdout
        assert 'fetched' in done.stdout and 'already cached' in done.stdout
        assert '0 failed' in done.stdout
        for key, body in tree.items():
            assert fetched(proxy, bucket, key) == len(body), key
        assert fetched(proxy, bucket) == total
        assert fetched(proxy, bucket, 'other/outside.bin') == 0

        proxy.reset_counters()
        after, report = warm_json('--check', mnt.path / 'data')
        assert after.returncode == 0, after.stderr
        assert proxy.requests == [], proxy.requests
        assert report['cached'] == total
        assert all(p['cached'] == p['size'] for p in report['paths'])
        text = command('warm', '--check', mnt.path / 'data')
        assert f'check: {len(tree)} files' in text.stdout and '(100%)' in text.stdout
        assert proxy.requests == [], proxy.requests

    proxy.reset_counters()
    again, report = warm_json(mnt.path / 'data')
    assert again.returncode == 0, again.stderr
    assert report['fetched'] == 0 and report['before'] == total
    assert object_gets(proxy, bucket) == []

    drop_caches()
    proxy.reset_counters()
    for key, body in tree.items():
        assert sha((mnt.path / key).read_bytes()) == sha(body), key
    assert object_gets(proxy, bucket) == [], proxy.requests
    stats = read_stats(mnt.path)
    assert stats['bytes_from_bucket'] == total


def test_warm_from_list_file_and_stdin(server, s3, bucket, mount, proxy,
                                       tmp_path):
    """--from FILE (paths relative to the current directory and absolute,
    blank lines and comments) and --from - (stdin) warm exactly the files
    listed; a symbolic link listed warms its target."""
    files = put_tree(s3, bucket)
    mnt = mount(bucket, endpoint=proxy.endpoint, options=STEADY)
    listing = tmp_path / 'list.txt'
    listing.write_text('# what the last job opened\n\n'
                       'data/big.bin\n'
                       f'  {mnt.path}/data/sub/mid.bin  \n')
    proxy.reset_counters()
    done = command('warm', '--from', listing, cwd=mnt.path)
    assert done.returncode == 0, done.stderr
    assert fetched(proxy, bucket, 'data/big.bin') == len(files['data/big.bin'])
    assert fetched(proxy, bucket, 'data/sub/mid.bin') == len(files['data/sub/mid.bin'])
    assert fetched(proxy, bucket) == len(files['data/big.bin']) + \
        len(files['data/sub/mid.bin'])

    # a symbolic link named is followed (a Hugging Face snapshot's files
    # are links to blobs)
    os.symlink('sub/deeper/leaf.bin', mnt.path / 'data/alias.bin')
    proxy.reset_counters()
    done = command('warm', '--from', '-', cwd=mnt.path / 'data',
                   input='small.txt\n#sub/deeper/leaf.bin\nalias.bin\n')
    assert done.returncode == 0, done.stderr
    assert fetched(proxy, bucket) == len(files['data/small.txt']) + \
        len(files['data/sub/deeper/leaf.bin'])
    assert done.stdout.startswith('warm: 2 files, ')


def test_evict_then_read_refetches_the_evicted_bytes(server, s3, bucket, mount,
                                                     proxy):
    """--evict of a file frees its bytes (reported), --check says 0%
    afterwards, and reading it fetches exactly its bytes again; the other
    files stay cached."""
    files = put_tree(s3, bucket)
    tree = in_tree(files)
    mnt = mount(bucket, endpoint=proxy.endpoint, options=STEADY)
    # no other test drops the kernel's caches meanwhile: its inodes,
    # and the daemon's listings with them, stay (see conftest.py)
    with kernel_caches_kept():
        assert command('warm', mnt.path / 'data').returncode == 0
        done, report = warm_json('--evict', mnt.path / 'data/big.bin',
                                 mnt.path / 'data/sub')
        assert done.returncode == 0, done.stderr
        evicted = ['data/big.bin', 'data/sub/mid.bin', 'data/sub/deeper/leaf.bin',
                   'data/sub/deeper/empty.bin']
        assert report['freed'] == sum(len(files[k]) for k in evicted)
        text = command('warm', '--evict', mnt.path / 'data/small.txt')
        assert text.returncode == 0
        assert text.stdout.startswith('evict: 1 file, ')
        assert 'freed' in text.stdout

        proxy.reset_counters()
        _, report = warm_json('--check', mnt.path / 'data/big.bin')
        assert report['cached'] == 0
        assert proxy.requests == []

    drop_caches()
    proxy.reset_counters()
    for key, body in tree.items():
        assert (mnt.path / key).read_bytes() == body, key
    evicted.append('data/small.txt')
    for key in tree:
        expect = len(files[key]) if key in evicted else 0
        assert fetched(proxy, bucket, key) == expect, key


def test_errors_name_the_path_and_the_others_go_on(server, s3, bucket, mount,
                                                   proxy, tmp_path):
    """A missing path, a path outside any s3cachefs mount and a directory's
    symlink are each reported with their path; the files named with them
    are still warmed; the exit status is 1. Bad usage exits 2."""
    files = put_tree(s3, bucket)
    mnt = mount(bucket, endpoint=proxy.endpoint, options=STEADY)
    outside = tmp_path / 'outside.txt'
    outside.write_text('local')
    proxy.reset_counters()
    done = command('warm', mnt.path / 'data/nope.bin', outside,
                   mnt.path / 'data/small.txt', '/proc/version')
    assert done.returncode == 1
    assert f'{mnt.path}/data/nope.bin: not found' in done.stderr
    assert f'{outside}: not inside an s3cachefs mount' in done.stderr
    assert '/proc/version: not inside an s3cachefs mount' in done.stderr
    assert fetched(proxy, bucket, 'data/small.txt') == len(files['data/small.txt'])
    assert '2 failed' in done.stdout or '3 failed' in done.stdout

    for bad in (['--bogus', mnt.path], ['--check', '--evict', mnt.path],
                ['--jobs', '0', mnt.path], ['--from'], []):
        done = command('warm', *bad)
        assert done.returncode == 2, (bad, done.stderr)
        assert 'usage: s3cachefs warm' in done.stderr, bad
    done = command('warm', '--from', tmp_path / 'no-such-list')
    assert done.returncode == 1
    assert 'no-such-list' in done.stderr
    assert command('warm', '--help').returncode == 0
    assert 'warm PATH...' in command('--help').stdout + command('--help').stderr


def test_sigint_during_a_held_warm_leaves_a_mount_that_reads_right(
        server, s3, bucket, mount, proxy):
    """SIGINT while the GETs of a large file's warm are held at the proxy:
    the command exits 1 at once with a summary saying "interrupted" (it
    does not wait for the held GETs), and once they are released the
    file reads back with the bucket's bytes (partly cached blocks are
    whole blocks only); a warm afterwards completes it."""
    body = RNG.randbytes(24 * MiB + 3)
    s3.put_object(Bucket=bucket, Key='large.bin', Body=body)
    mnt = mount(bucket, endpoint=proxy.endpoint, options=STEADY)
    os.stat(mnt.path / 'large.bin')
    proxy.inject('hold', 1000, 'GET')
    warming = subprocess.Popen([BINARY, 'warm', str(mnt.path / 'large.bin')],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        wait_for(lambda: proxy.holding >= 1, 20, 'GETs held at the proxy')
        time.sleep(0.3)
        started = time.monotonic()
        warming.send_signal(signal.SIGINT)
        out, err = warming.communicate(timeout=20)
        assert time.monotonic() - started < 5, 'the command waited for the GETs'
    finally:
        proxy.release()
        if warming.poll() is None:
            warming.kill()
    assert warming.returncode == 1, err
    assert 'interrupted' in out, out
    assert 'stopped by signal' in err
    drop_caches()
    assert sha((mnt.path / 'large.bin').read_bytes()) == sha(body)
    done, report = warm_json(mnt.path / 'large.bin')
    assert done.returncode == 0, done.stderr
    assert report['cached'] == len(body)


def test_bucket_named_warm_still_mounts(server, s3, tmp_path, mount):
    """`s3cachefs warm MNT -o ...` where MNT is not inside an s3cachefs
    mount is the mount of a bucket named "warm"."""
    try:
        server.create_bucket('warm')
    except Exception:   # (left by an earlier run)
        pass
    s3.put_object(Bucket='warm', Key='hello.txt', Body=b'hi')
    mnt = mount('warm')
    assert (mnt.path / 'hello.txt').read_bytes() == b'hi'


def test_pin_survives_cache_pressure_and_a_remount(server, s3, bucket, mount,
                                                   proxy, tmp_path):
    """With cache_size=8M (pins may take 4 MiB): a pinned 3 MiB file stays
    whole while 24 MiB of other files are read through the cache (an
    unpinned file warmed the same way is evicted), also after a remount
    on the same cache; reading it sends no GET. Pinning a second file past
    the share fails for that file (exit 1, nothing fetched for it);
    --unpin gives the room back."""
    weights = RNG.randbytes(3 * MiB + 5)
    control = RNG.randbytes(MiB)
    s3.put_object(Bucket=bucket, Key='weights.bin', Body=weights)
    s3.put_object(Bucket=bucket, Key='control.bin', Body=control)
    s3.put_object(Bucket=bucket, Key='more.bin', Body=RNG.randbytes(2 * MiB))
    for i in range(12):
        s3.put_object(Bucket=bucket, Key=f'dataset/{i}.bin',
                      Body=RNG.randbytes(2 * MiB))
    cache = tmp_path / 'cache'
    options = [*STEADY, 'cache_size=8M']

    def pressure(mnt):
        for i in range(12):
            (mnt.path / f'dataset/{i}.bin').read_bytes()

    def check(mnt, name):
        done, report = warm_json('--check', mnt.path / name)
        assert done.returncode == 0, done.stderr
        return report['paths'][0]

    mnt = mount(bucket, endpoint=proxy.endpoint, options=options, cache=cache)
    done = command('warm', '--pin', mnt.path / 'weights.bin')
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith('pin: 1 file pinned, ')
    assert 'pinned now: 3.0 MiB of 4.0 MiB allowed' in done.stdout
    # (accounted as the cache accounts blocks: rounded up to 4 KiB)
    assert read_stats(mnt.path)['cache_pinned_bytes'] == -(-len(weights) // 4096) * 4096
    assert command('warm', mnt.path / 'control.bin').returncode == 0
    assert check(mnt, 'weights.bin')['pinned'] is True

    proxy.reset_counters()
    done, report = warm_json('--pin', mnt.path / 'more.bin')
    assert done.returncode == 1
    assert 'does not fit in the share of the cache pinned files may take' in done.stderr
    assert report['paths'][0]['status'] == 'full'
    assert fetched(proxy, bucket, 'more.bin') == 0

    pressure(mnt)
    assert check(mnt, 'weights.bin')['cached'] == len(weights)
    assert check(mnt, 'control.bin')['cached'] < len(control)
    drop_caches()
    proxy.reset_counters()
    assert sha((mnt.path / 'weights.bin').read_bytes()) == sha(weights)
    assert fetched(proxy, bucket, 'weights.bin') == 0
    mnt.unmount()

    again = mount(bucket, endpoint=proxy.endpoint, options=options, cache=cache,
                  name='again')
    os.listdir(again.path / 'dataset')
    entry = check(again, 'weights.bin')
    assert entry['pinned'] is True and entry['cached'] == len(weights)
    pressure(again)
    proxy.reset_counters()
    assert sha((again.path / 'weights.bin').read_bytes()) == sha(weights)
    assert fetched(proxy, bucket, 'weights.bin') == 0

    done = command('warm', '--unpin', again.path / 'weights.bin')
    assert done.returncode == 0, done.stderr
    assert 'pinned now: 0 B of 4.0 MiB allowed' in done.stdout
    assert check(again, 'weights.bin')['pinned'] is False
    done = command('warm', '--pin', again.path / 'more.bin')
    assert done.returncode == 0, done.stderr
