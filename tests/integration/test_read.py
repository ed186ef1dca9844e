"""Read-only mount: every byte, every name, every directory, as the bucket
has them.

A tree is uploaded with boto3 (an independent client), then read back
through a real s3cachefs mount and compared byte for byte (sha256), name by
name and directory by directory; random ranges of a large file with pread
and through mmap; s3fs metadata headers and symlinks; a directory of more
than 1000 keys (several LIST pages).
"""
import concurrent.futures
import errno
import hashlib
import mmap
import os
import random
import stat

import pytest

from conftest import new_bucket_name, wait_for

CHUNK = 4 << 20  # the reader's chunk: test around its boundaries
RNG = random.Random(20261130)


def blob(size):
    return RNG.randbytes(size)


# key -> body; keys ending in '/' are directory markers.
TREE = {
    'hello.txt': b'hello, world\n',
    'empty.bin': b'',
    'sizes/one': b'x',
    'sizes/4095': blob(4095),
    'sizes/chunk-minus-one': blob(CHUNK - 1),
    'sizes/chunk-plus-one': blob(CHUNK + 1),
    'big/large.bin': blob(3 * CHUNK + 12345),
    'names/with space.txt': b'space',
    'names/plus+sign': b'plus',
    'names/per%cent': b'percent',
    'names/hash#tag': b'hash',
    'names/ünïcödé-日本語.txt': 'unicode'.encode(),
    "names/quote's & amp;": b'quote',
    'names/~tilde=eq,comma': b'tilde',
    'emptydir/': b'',
    # nested with markers at every level (s3rver needs them to list)
    'nested/': b'',
    'nested/a/': b'',
    'nested/a/b/': b'',
    'nested/a/b/c/': b'',
    'nested/a/b/c/leaf.txt': b'deep leaf',
    # a key that is both a file and a prefix: the directory wins
    'clash': b'hidden file',
    'clash/inside.txt': b'inside',
}
FILES = {k: v for k, v in TREE.items() if not k.endswith('/') and k != 'clash'}
S3FS_MODE_FILE = 0o100600
S3FS_MODE_LINK = 0o120777


def sha(data):
    return hashlib.sha256(data).hexdigest()


def put_all(s3, bucket, objects, metadata=None):
    def put(item):
        key, body = item
        extra = {'Metadata': metadata[key]} if metadata and key in metadata else {}
        s3.put_object(Bucket=bucket, Key=key, Body=body, **extra)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(put, objects.items()))


@pytest.fixture(scope='module')
def tree_bucket(server, s3):
    """One bucket holding TREE, plus s3fs-style metadata objects."""
    name = new_bucket_name('tree')
    server.create_bucket(name)
    put_all(s3, name, TREE)
    put_all(s3, name, {'meta/owned': b'owned by 1234', 'meta/link': b'owned',
                       'meta/abs-link': b'/etc/hostname'},
            metadata={'meta/owned': {'mode': str(S3FS_MODE_FILE), 'uid': '1234',
                                     'gid': '5678', 'mtime': '1600000000'},
                      'meta/link': {'mode': str(S3FS_MODE_LINK)},
                      'meta/abs-link': {'mode': str(S3FS_MODE_LINK)}})
    yield name
    server.release_bucket(name)


def walk_files(root):
    """Relative paths of every non-directory under root."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            found.add(os.path.relpath(os.path.join(dirpath, name), root))
    return found


def test_tree_matches_bucket(tree_bucket, mount):
    mnt = mount(tree_bucket)
    files = walk_files(mnt.path)
    expected = set(FILES) | {'meta/owned', 'meta/link', 'meta/abs-link'}
    assert files == expected
    for key, body in FILES.items():
        data = (mnt.path / key).read_bytes()
        assert len(data) == len(body), key
        assert sha(data) == sha(body), key
        assert os.stat(mnt.path / key).st_size == len(body), key


def test_directories(tree_bucket, mount):
    mnt = mount(tree_bucket)
    root = sorted(os.listdir(mnt.path))
    assert root == sorted(['hello.txt', 'empty.bin', 'sizes', 'big', 'names',
                           'emptydir', 'nested', 'clash', 'meta'])
    assert os.listdir(mnt.path / 'emptydir') == []
    assert stat.S_ISDIR(os.stat(mnt.path / 'emptydir').st_mode)
    # the directory wins over the object of the same name
    assert stat.S_ISDIR(os.stat(mnt.path / 'clash').st_mode)
    assert os.listdir(mnt.path / 'clash') == ['inside.txt']
    assert os.listdir(mnt.path / 'nested' / 'a' / 'b' / 'c') == ['leaf.txt']
    # lookups without a listing first (fresh mount, straight to the leaf)
    mnt2 = mount(tree_bucket, name='mnt2')
    assert (mnt2.path / 'nested/a/b/c/leaf.txt').read_bytes() == b'deep leaf'
    assert not (mnt2.path / 'nested/a/nope').exists()
    with pytest.raises(NotADirectoryError):
        os.listdir(mnt2.path / 'hello.txt')


def test_random_ranges(tree_bucket, mount):
    mnt = mount(tree_bucket)
    body = FILES['big/large.bin']
    fd = os.open(mnt.path / 'big/large.bin', os.O_RDONLY)
    try:
        rng = random.Random(7)
        for _ in range(60):
            offset = rng.randrange(0, len(body))
            length = rng.choice([1, 17, 4096, 65536, 300000, CHUNK + 3])
            assert os.pread(fd, length, offset) == body[offset:offset + length]
        # across a chunk boundary, and at and past the end
        assert os.pread(fd, 100, CHUNK - 50) == body[CHUNK - 50:CHUNK + 50]
        assert os.pread(fd, 100, len(body) - 10) == body[-10:]
        assert os.pread(fd, 100, len(body)) == b''
    finally:
        os.close(fd)


def test_mmap(tree_bucket, mount):
    mnt = mount(tree_bucket)
    body = FILES['big/large.bin']
    with open(mnt.path / 'big/large.bin', 'rb') as f:
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
            assert view[CHUNK * 2:CHUNK * 2 + 10] == body[CHUNK * 2:CHUNK * 2 + 10]
            assert view[-5:] == body[-5:]
            assert sha(view[:]) == sha(body)


def test_parallel_readers(tree_bucket, mount):
    mnt = mount(tree_bucket)
    keys = sorted(FILES) * 3

    def check(key):
        return sha((mnt.path / key).read_bytes()) == sha(FILES[key])
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert all(pool.map(check, keys))


def test_s3fs_metadata_and_symlinks(tree_bucket, mount):
    mnt = mount(tree_bucket)
    owned = os.stat(mnt.path / 'meta/owned')
    assert stat.S_IMODE(owned.st_mode) == 0o600
    assert (owned.st_uid, owned.st_gid) == (1234, 5678)
    assert int(owned.st_mtime) == 1600000000
    link = mnt.path / 'meta/link'
    assert stat.S_ISLNK(os.lstat(link).st_mode)
    assert os.readlink(link) == 'owned'
    assert link.read_bytes() == b'owned by 1234'
    assert os.readlink(mnt.path / 'meta/abs-link') == '/etc/hostname'
    # files without headers get the mount-wide defaults
    plain = os.stat(mnt.path / 'hello.txt')
    assert stat.S_IMODE(plain.st_mode) == 0o644
    assert stat.S_ISREG(plain.st_mode)


def test_mount_wide_attributes(tree_bucket, mount):
    mnt = mount(tree_bucket, options=['uid=4321', 'gid=8765', 'file_mode=0440',
                                      'dir_mode=0750'])
    plain = os.stat(mnt.path / 'hello.txt')
    assert stat.S_IMODE(plain.st_mode) == 0o440
    assert (plain.st_uid, plain.st_gid) == (4321, 8765)
    directory = os.stat(mnt.path / 'sizes')
    assert stat.S_IMODE(directory.st_mode) == 0o750
    # uid=/gid= override the s3fs headers too; a header mode still counts
    owned = os.stat(mnt.path / 'meta/owned')
    assert (owned.st_uid, owned.st_gid) == (4321, 8765)
    assert stat.S_IMODE(owned.st_mode) == 0o600


def test_read_only(tree_bucket, mount, s3):
    """-o ro: every change fails with EROFS and nothing reaches the bucket."""
    mnt = mount(tree_bucket, ['ro'])
    before = sorted(o['Key'] for o in s3.list_objects_v2(Bucket=tree_bucket).get('Contents', []))
    for action in (lambda: open(mnt.path / 'new.txt', 'w'),
                   lambda: open(mnt.path / 'hello.txt', 'r+b'),
                   lambda: os.mkdir(mnt.path / 'newdir'),
                   lambda: os.unlink(mnt.path / 'hello.txt')):
        with pytest.raises(OSError) as caught:
            action()
        assert caught.value.errno == errno.EROFS
    assert (mnt.path / 'hello.txt').read_bytes() == TREE['hello.txt']
    after = sorted(o['Key'] for o in s3.list_objects_v2(Bucket=tree_bucket).get('Contents', []))
    assert after == before


def test_statfs(tree_bucket, mount):
    mnt = mount(tree_bucket)
    info = os.statvfs(mnt.path)
    assert info.f_namemax == 255
    assert info.f_bavail > 0


def test_prefix_mount(tree_bucket, mount):
    mnt = mount(tree_bucket + ':names/')
    assert sorted(os.listdir(mnt.path)) == sorted(
        k[len('names/'):] for k in FILES if k.startswith('names/'))
    assert (mnt.path / 'plus+sign').read_bytes() == b'plus'


def test_pagination(server, s3, bucket, mount):
    """More keys than one LIST page (1000) in one directory."""
    objects = {f'many/file-{i:05d}': f'{i}'.encode() for i in range(1100)}
    put_all(s3, bucket, objects)
    mnt = mount(bucket)
    names = os.listdir(mnt.path / 'many')
    assert sorted(names) == sorted(k[len('many/'):] for k in objects)
    assert (mnt.path / 'many/file-01099').read_bytes() == b'1099'
    # ls -l: every entry has attributes
    sizes = {e.name: e.stat().st_size for e in os.scandir(mnt.path / 'many')}
    assert sizes['file-00007'] == 1 and sizes['file-01000'] == 4


def test_unusable_keys_are_skipped(server, s3, bucket, mount):
    """Keys that cannot be names are left out; the rest still lists."""
    if server.name == 's3rver':
        pytest.skip('s3rver stores objects as files: it refuses or '
                    'normalises keys that cannot be file names')
    s3.put_object(Bucket=bucket, Key='odd/ok.txt', Body=b'ok')
    for key in ['odd//empty-component', 'odd/dot/./x', 'odd/' + 'n' * 300]:
        s3.put_object(Bucket=bucket, Key=key, Body=b'bad')
    mnt = mount(bucket)
    listing = os.listdir(mnt.path / 'odd')
    assert 'ok.txt' in listing
    assert all(len(name.encode()) <= 255 and name not in ('', '.', '..')
               for name in listing)
    assert (mnt.path / 'odd/ok.txt').read_bytes() == b'ok'
    for _ in range(2):  # relisting logs nothing new
        for dirpath, _, _ in os.walk(mnt.path / 'odd'):
            pass
    skipped = [line for line in mnt.log().splitlines() if 'is not shown' in line]
    assert skipped, 'no log line for the skipped keys'
    assert len(set(skipped)) == len(skipped), skipped  # once per key


def test_implicit_nested_directories(server, s3, bucket, mount):
    """Directories that exist only as key prefixes, several levels deep."""
    if server.name == 's3rver':
        pytest.skip('s3rver misses common prefixes two levels down')
    s3.put_object(Bucket=bucket, Key='x/y/z/deep.txt', Body=b'deep')
    mnt = mount(bucket)
    assert os.listdir(mnt.path) == ['x']
    assert os.listdir(mnt.path / 'x') == ['y']
    assert os.listdir(mnt.path / 'x/y/z') == ['deep.txt']
    assert (mnt.path / 'x/y/z/deep.txt').read_bytes() == b'deep'


def test_close_to_open_sees_new_version(server, s3, bucket, mount):
    """An object replaced on the server is read anew once the TTL passed."""
    s3.put_object(Bucket=bucket, Key='changing.txt', Body=b'version one')
    mnt = mount(bucket, options=['attr_ttl=0.2', 'dir_ttl=0.2'])
    assert (mnt.path / 'changing.txt').read_bytes() == b'version one'
    s3.put_object(Bucket=bucket, Key='changing.txt', Body=b'second version, longer')
    wait_for(lambda: (mnt.path / 'changing.txt').read_bytes() ==
             b'second version, longer', 10, 'the new version')
    s3.delete_object(Bucket=bucket, Key='changing.txt')
    wait_for(lambda: not (mnt.path / 'changing.txt').exists(), 10,
             'the deletion to show')


def test_sequential_reads_ahead_one_mib(tree_bucket, mount):
    """The kernel reads ahead on a FUSE mount no further than its bdi's
    read_ahead_kb (128 KiB unless changed), whatever the daemon asks for:
    the daemon raises it to 1 MiB, so sequential reads come in 1 MiB
    requests (a third faster re-reads from the cache)."""
    mnt = mount(tree_bucket)
    device = os.stat(mnt.path).st_dev
    setting = f'/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb'
    if os.geteuid() != 0:
        pytest.skip('only root may raise a bdi read-ahead')
    with open(setting) as text:
        assert int(text.read()) == 1024
