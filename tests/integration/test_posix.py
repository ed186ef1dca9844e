"""Third-party POSIX suites on a real mount: xfstests' fsx and pjdfstest.

The suites are third-party code carried in tests/peer-suites under their
own licences (tests/posix/build-peer-suites.sh builds them once per build
directory, the first test that needs them waiting for the build).

fsx does random reads, writes, truncates and mmap reads and writes on one
file and checks every byte it reads against its own model of the file.
Each mode (default, -o writeback) runs it four times, one seed each,
10,000 operations: with and without close and reopen (-c: fsx closes,
drops the kernel's caches and opens again, so reads come from the daemon
and closes upload), and with and without mmap (-R -W turn mapped reads
and writes off), on files of up to 3 MiB (see FSX_RUNS). A failure prints
fsx's own log. After each run the object in the bucket (boto3) must be
byte for byte what the mount reads. About 95 s per server for the eight
runs (s3rver and Swift at once, 2 cores).

The times and errnos pjdfstest found wrong are checked in a few calls on
both servers (test_times_follow_posix, test_keys_longer_than_s3_allows),
and so are names no listing carries back: a create of one fails with
EILSEQ, a key of one put by another client is left out of `ls` with one
log line (test_names_no_listing_carries_are_refused,
test_keys_no_listing_carries_are_left_out).

pjdfstest runs a few subsets on Swift only (s3rver dies on its 255-byte
names) with allow_other, its assertions running as other users; each
subset must pass at least the number of assertions it passes today, so a
regression fails the test (tests/posix/pjdfstest.sh runs every subset
side by side with s3fs).
"""
import errno
import fcntl
import os
import re
import stat
import subprocess
import time
from pathlib import Path

import botocore.exceptions
import pytest

from conftest import BINARY, KERNEL_CACHES_LOCK, SRCDIR, kernel_caches_kept
from writehelp import fsync_path, object_bytes, sha, write_file

BUILD_SCRIPT = SRCDIR / 'tests' / 'posix' / 'build-peer-suites.sh'
FSX_OPS = 10000
FSX_TIMEOUT = 300
# seed, close and reopen one operation in CLOSE_EVERY (None: never), mmap,
# largest file size. 3 MiB is three cache blocks and three 1 MiB granules
# of an edit (what a reopened file is); the mmap runs keep to 640 KiB:
# each mapped write's msync is an fsync, which uploads the whole file.
FSX_RUNS = [
    (11, None, True, 640 << 10),
    (12, 100, True, 640 << 10),
    (13, 100, False, 3 << 20),
    (14, None, False, 3 << 20),
]
PJDFSTEST_TIMEOUT = 600


@pytest.fixture(scope='session')
def peer_suites():
    """(pjdfstest, fsx): the programs, built once into the build directory
    (beside the daemon under test)."""
    out = os.environ.get('S3CACHEFS_PEER_BUILD') or \
        str(Path(BINARY).resolve().parents[1] / 'peer-suites')
    done = subprocess.run([str(BUILD_SCRIPT), out], capture_output=True, text=True)
    if done.returncode == 77:
        pytest.skip(done.stderr.strip())
    assert done.returncode == 0, done.stderr
    pjdfstest, fsx = done.stdout.split()
    return Path(pjdfstest), Path(fsx)


def fsx_argv(fsx, path, logdir, seed, close_every, mmap, size):
    argv = [str(fsx), '-q', '-N', str(FSX_OPS), '-l', str(size),
            '-S', str(seed), '-P', str(logdir)]
    if close_every is not None:
        argv += ['-c', str(close_every)]
    if not mmap:
        argv += ['-R', '-W']
    return argv + [str(path)]


def run_fsx(argv, logdir, path, close_every):
    """Runs fsx; fails with its output and its own log when it fails. fsx
    drops the kernel's caches at each close and reopen: meanwhile no test
    of the other server may rely on them (conftest.kernel_caches_kept)."""
    with open(KERNEL_CACHES_LOCK, 'a') as lock:
        if close_every is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            done = subprocess.run(argv, capture_output=True, text=True,
                                  timeout=FSX_TIMEOUT)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if done.returncode != 0 or 'operations completed A-OK' not in done.stdout:
        log = Path(logdir) / (Path(path).name + '.fsxlog')
        good = Path(logdir) / (Path(path).name + '.fsxgood')
        text = log.read_text(errors='replace') if log.exists() else '(no log)'
        pytest.fail(f'{" ".join(argv)} exited with {done.returncode}\n'
                    f'--- output:\n{done.stdout[-6000:]}{done.stderr[-2000:]}\n'
                    f'--- {log} (the bytes fsx expected: {good}):\n'
                    f'{text[-6000:]}')


@pytest.mark.parametrize('mode', ['default', 'writeback'])
def test_fsx(server, bucket, mount, s3, peer_suites, tmp_path, mode):
    _, fsx = peer_suites
    mnt = mount(bucket, options=['writeback'] if mode == 'writeback' else [])
    logdir = tmp_path / 'fsx'
    logdir.mkdir()
    for seed, close_every, mmap, size in FSX_RUNS:
        name = f'fsx-{seed}.dat'
        path = mnt.path / name
        started = time.monotonic()
        run_fsx(fsx_argv(fsx, path, logdir, seed, close_every, mmap, size),
                logdir, path, close_every)
        print(f'fsx seed {seed} ({mode}, close/open '
              f'{close_every or "never"}, mmap {"on" if mmap else "off"}, '
              f'{size} bytes): '
              f'{time.monotonic() - started:.1f}s')
        fsync_path(path)   # writeback: in the bucket now
        data = path.read_bytes()
        assert os.stat(path).st_size == len(data)
        assert sha(object_bytes(s3, bucket, name)) == sha(data), \
            f'{name}: the bucket does not hold what the mount reads'


# ------------------------------------------------------------ times, errnos
# What pjdfstest found, checked on both servers in a few calls each.

def test_times_follow_posix(server, bucket, mount, s3):
    mnt = mount(bucket)
    root = mnt.path
    os.mkdir(root / 'd')
    before = os.stat(root / 'd')
    # an entry made or removed: the directory's mtime and ctime move
    write_file(root / 'd' / 'f', b'data')
    made = os.stat(root / 'd')
    assert made.st_mtime_ns > before.st_mtime_ns
    assert made.st_ctime_ns > before.st_ctime_ns
    # chmod: the ctime moves, the mtime stays
    old = os.stat(root / 'd' / 'f')
    os.chmod(root / 'd' / 'f', 0o600)
    changed = os.stat(root / 'd' / 'f')
    assert changed.st_ctime_ns > old.st_ctime_ns
    assert changed.st_mtime_ns == old.st_mtime_ns
    # utimensat sets the access time apart from the mtime, kept in the bucket
    os.utime(root / 'd' / 'f', ns=(1500000000 * 10 ** 9, 1600000000 * 10 ** 9))
    assert os.stat(root / 'd' / 'f').st_atime == 1500000000
    assert os.stat(root / 'd' / 'f').st_mtime == 1600000000
    meta = s3.head_object(Bucket=bucket, Key='d/f')['Metadata']
    assert meta['atime'] == '1500000000' and meta['mtime'] == '1600000000', meta
    assert int(meta['ctime']) > 1600000000, meta
    # open(O_TRUNC) of an existing file is a change of it
    old = os.stat(root / 'd' / 'f')
    os.close(os.open(root / 'd' / 'f', os.O_WRONLY | os.O_TRUNC))
    truncated = os.stat(root / 'd' / 'f')
    assert truncated.st_mtime_ns > old.st_mtime_ns and truncated.st_size == 0
    # rename: the file's ctime moves
    os.utime(root / 'd' / 'f', ns=(1500000000 * 10 ** 9, 1600000000 * 10 ** 9))
    old = os.stat(root / 'd' / 'f')
    os.rename(root / 'd' / 'f', root / 'd' / 'g')
    assert os.stat(root / 'd' / 'g').st_ctime_ns > old.st_ctime_ns
    # a descriptor open on a removed file: no links left
    fd = os.open(root / 'd' / 'g', os.O_RDONLY)
    try:
        os.unlink(root / 'd' / 'g')
        assert os.fstat(fd).st_nlink == 0
    finally:
        os.close(fd)
    mnt.unmount()
    again = mount(bucket, name='again')
    # what the bucket keeps: the atime set above, on the renamed copy gone
    # with it; a new file's times are its mtime
    write_file(again.path / 'h', b'x')
    os.utime(again.path / 'h', (1400000000, 1450000000))
    again.unmount()
    third = mount(bucket, name='third')
    info = os.stat(third.path / 'h')
    assert (info.st_atime, info.st_mtime) == (1400000000, 1450000000)


@pytest.mark.parametrize('mode', ['default', 'writeback'])
def test_atime_of_a_file_being_written_is_kept(server, s3, bucket, mount,
                                               mode):
    """utimensat on a file open for writing (staged): the access time goes
    to the bucket with the upload, and a new mount shows it. (Before: a
    staged file's metadata had no access time, and it was lost.)"""
    options = ['writeback'] if mode == 'writeback' else []
    mnt = mount(bucket, options=options)
    path = mnt.path / 'f'
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b'data')
        os.utime(path, (1400000000, 1450000000))
        assert os.stat(path).st_atime == 1400000000
    finally:
        os.close(fd)
    fsync_path(path)
    meta = s3.head_object(Bucket=bucket, Key='f')['Metadata']
    assert meta.get('atime') == '1400000000', meta
    assert meta.get('mtime') == '1450000000', meta
    mnt.unmount()
    again = mount(bucket, name='again')
    info = os.stat(again.path / 'f')
    assert (info.st_atime, info.st_mtime) == (1400000000, 1450000000)


def test_keys_longer_than_s3_allows(server, bucket, mount):
    mnt = mount(bucket)
    path = mnt.path
    for _ in range(6):   # 6 x 201 bytes: past S3's 1024-byte keys (and
        path = path / ('d' * 200)   # short of s3rver's component limit)
        try:
            os.mkdir(path)
        except OSError as error:
            assert error.errno == errno.ENAMETOOLONG, error
            break
    else:
        pytest.fail('a directory whose key is over 1024 bytes was made')


# Names no listing carries back unchanged (HACKING.md, "Names"): XML 1.0
# has no control characters but tab and newline, and reads a raw CR as
# LF; S3 keys are UTF-8. s3rver sends keys raw whatever encoding-type
# asks, stores a key that is not UTF-8 as its %-escapes ("bad%FFname"),
# Swift refuses one (400 InvalidURI).
REFUSED_NAMES = [b'ctl\x01name', b'esc\x1b[0m', b'cr\rx', b'bad\xffname',
                 b'\xc0\xaf', b'\xef\xbf\xbf']


def test_names_no_listing_carries_are_refused(server, bucket, mount, s3):
    """Before: each call made the name (s3rver kept 'bad\\xffname' as
    'bad%FFname'; Swift answered 400), so a listing failed or showed
    another name."""
    s3.put_object(Bucket=bucket, Key='src', Body=b'source')
    mnt = mount(bucket)
    root = bytes(mnt.path)
    calls = {
        'create': lambda p: os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)),
        'mkdir': os.mkdir,
        'symlink': lambda p: os.symlink(b'target', p),
        'mknod': lambda p: os.mknod(p, 0o644 | stat.S_IFIFO),
        'link': lambda p: os.link(root + b'/src', p),
        'rename': lambda p: os.rename(root + b'/src', p),
    }
    for name in REFUSED_NAMES:
        for call, make in calls.items():
            with pytest.raises(OSError) as refused:
                make(root + b'/' + name)
            assert refused.value.errno == errno.EILSEQ, (call, name, refused.value)
    keys = [o['Key'] for o in s3.list_objects_v2(Bucket=bucket).get('Contents', [])]
    assert keys == ['src'], keys
    assert sorted(os.listdir(root)) == [b'src']
    assert (mnt.path / 'src').read_bytes() == b'source'
    # names a listing carries are made as ever
    for name in [b'tab\there', b'del\x7f', 'caf\u00e9 \U0001F600'.encode()]:
        with open(root + b'/' + name, 'wb') as made:
            made.write(name)
        assert object_bytes(s3, bucket, name.decode()) == name


def test_keys_no_listing_carries_are_left_out(server, bucket, mount, s3):
    """Keys another client put with control characters or a CR: `ls` and
    listdir show the other names, each such key is logged once however
    often the directory is listed, the bucket mounts even when such a key
    is its first, and a rename of the directory moves them as they are.
    Before: s3rver's page (keys raw in the XML) was refused as broken
    XML, retried and failed with EIO; Swift showed them, and the mount
    failed (500) when the first key of the bucket held one."""
    hidden = ['d/ctl\x01name', 'd/cr\rx', 'd/sub\x1f/inner']
    try:
        for key in ['top', 'd/ok', *hidden, 'd/tab\there', 'd/z']:
            s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
        mnt = mount(bucket, options=['dir_ttl=0'])
        for _ in range(3):
            listed = subprocess.run(['ls', '-1', str(mnt.path / 'd')],
                                    capture_output=True, timeout=60)
            assert listed.returncode == 0, (listed.stderr, mnt.log()[-3000:])
            assert listed.stdout == b'ok\ntab\there\nz\n', listed.stdout
            assert sorted(os.listdir(mnt.path / 'd')) == ['ok', 'tab\there', 'z']
        assert sorted(os.listdir(mnt.path)) == ['d', 'top']
        log = mnt.log().splitlines()
        for shown in ['d/ctl\\x01name', 'd/cr\\x0dx', 'd/sub\\x1f/']:
            lines = [line for line in log if f"key '{shown}' is not shown" in line]
            assert len(lines) == 1, (shown, lines, log[-20:])

        # (boto3 cannot list s3rver's bucket now: its XML parser refuses the
        # raw control characters too; every key is asked for by name)
        os.rename(mnt.path / 'd', mnt.path / 'e')
        for key in ['d/ok', *hidden, 'd/tab\there', 'd/z']:
            assert object_bytes(s3, bucket, 'e/' + key[2:]) == key.encode()
            with pytest.raises(botocore.exceptions.ClientError) as gone:
                s3.head_object(Bucket=bucket, Key=key)
            assert gone.value.response['Error']['Code'] in ('404', 'NoSuchKey')
        assert sorted(os.listdir(mnt.path / 'e')) == ['ok', 'tab\there', 'z']

        # the mount's first request lists the bucket's first key
        mnt.unmount()
        s3.put_object(Bucket=bucket, Key='\x01first', Body=b'first')
        again = mount(bucket, name='again')
        assert sorted(os.listdir(again.path)) == ['e', 'top']
        lines = [line for line in again.log().splitlines()
                 if "key '\\x01first' is not shown" in line]
        assert len(lines) == 1, again.log()[-2000:]
    finally:
        # boto3, and with it the harness's clean-up, cannot list s3rver's
        # bucket while such a key is there (its XML parser refuses them)
        for key in [*hidden, *('e/' + key[2:] for key in hidden), '\x01first']:
            s3.delete_object(Bucket=bucket, Key=key)


# ------------------------------------------------------------------ pjdfstest

# subset -> (assertions that must pass, planned): what passes today on
# Swift (HACKING.md, "POSIX", says what the rest are). A new failure
# fails the test; when more pass, raise the number here. mkdir makes
# every file type (mknod) and checks the parent's times, utimensat the
# times kept in the bucket, ftruncate truncates of staged files.
PJDFSTEST_MINIMUM = {
    'ftruncate': (85, 89),    # 4: paths longer than S3's 1024-byte keys
    'mkdir': (116, 118),      # 2: the same
    'utimensat': (122, 122),
}


def pjdfstest_counts(tap):
    """(ok, planned, failures) of prove's verbose output."""
    planned = sum(int(m) for m in re.findall(r'^1\.\.(\d+)', tap, re.M))
    ok = len(re.findall(r'^ok \d+', tap, re.M))
    failures = re.findall(r'^not ok \d+.*$', tap, re.M)
    return ok, planned, failures


@pytest.mark.parametrize('subset', sorted(PJDFSTEST_MINIMUM))
def test_pjdfstest(server, bucket, mount, peer_suites, subset):
    if server.name != 'swift':
        pytest.skip('s3rver dies on pjdfstest\'s 255-byte names (HACKING.md)')
    pjdfstest, _ = peer_suites
    mnt = mount(bucket, options=['allow_other'])
    workdir = mnt.path / subset
    workdir.mkdir()
    # inode numbers are the daemon's while the kernel holds the inode:
    # another test's drop_caches would renumber what pjdfstest compares
    with kernel_caches_kept():
        done = subprocess.run(['prove', '-v', '--merge', '-r',
                               str(pjdfstest.parent / 'tests' / subset)],
                              cwd=workdir, capture_output=True, text=True,
                              timeout=PJDFSTEST_TIMEOUT)
    ok, planned, failures = pjdfstest_counts(done.stdout)
    minimum, expected_planned = PJDFSTEST_MINIMUM[subset]
    print(f'pjdfstest {subset}: {ok}/{planned}')
    assert planned == expected_planned, done.stdout[-4000:]
    assert ok >= minimum, \
        f'{subset}: {ok} of {planned} passed, at least {minimum} expected:\n' + \
        '\n'.join(failures[:60])
