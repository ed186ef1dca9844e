"""A cold walk that never stats (`find`, `ls` to a pipe,
os.walk with DirEntry.is_dir()) costs LISTs, not a HEAD per file.

A readdirplus answers a file whose s3fs headers are not known and that is
too large to be a symbolic link or a special file (more than PATH_MAX - 1
bytes) with its name and type only (an entry with ino 0: the kernel adds
a plain dirent of type DT_REG and keeps no inode). Smaller files may be
links (an s3fs symlink is an object whose x-amz-meta-mode says S_IFLNK)
and are HEADed as before. A stat after such a walk is a lookup, and the
first one in the directory starts HEADs of the entries after it in the
background, so `ls -l` and `du` still see every mode and link right, with
each file HEADed once. A directory's marker is HEADed once per mount, even
when the kernel forgets the directory in between. Requests are counted at
a proxy.
"""
import collections
import os
import stat
import subprocess
import time

import pytest

from conftest import drop_caches, read_stats

LARGE = 150                 # more than a head-ahead job keeps unclaimed (64)
SIZE = 5000                 # > PATH_MAX - 1: a regular file, certainly
OWNED = 0o100600

# (the counts of most tests rely on the daemon's memory of the directory)
kernel_keeps_inodes = pytest.mark.usefixtures('inodes_kept')


def large_name(index):
    return f'f{index:04d}.bin'


def put_dataset(s3, bucket):
    """ds/: LARGE files of SIZE bytes (every third with mode 0600), a
    symbolic link, a small file, a large object whose mode says S_IFLNK (a
    regular file: no link target is that long) and a subdirectory with a
    marker of mode 0700 and one large file."""
    for index in range(LARGE):
        extra = {'Metadata': {'mode': str(OWNED)}} if index % 3 == 0 else {}
        s3.put_object(Bucket=bucket, Key=f'ds/{large_name(index)}',
                      Body=bytes([index % 251]) * SIZE, **extra)
    # (to a file HEADed anyway: os.walk's is_dir() follows links)
    s3.put_object(Bucket=bucket, Key='ds/link', Body=b'small.txt',
                  Metadata={'mode': str(stat.S_IFLNK | 0o777)})
    s3.put_object(Bucket=bucket, Key='ds/small.txt', Body=b'tiny')
    s3.put_object(Bucket=bucket, Key='ds/notlink', Body=b'n' * SIZE,
                  Metadata={'mode': str(stat.S_IFLNK | 0o755)})
    s3.put_object(Bucket=bucket, Key='ds/sub/', Body=b'',
                  ContentType='application/x-directory',
                  Metadata={'mode': str(stat.S_IFDIR | 0o700)})
    s3.put_object(Bucket=bucket, Key='ds/sub/inner.bin', Body=b'i' * SIZE)


LARGE_KEYS = {f'ds/{large_name(i)}' for i in range(LARGE)} | \
    {'ds/notlink', 'ds/sub/inner.bin'}


def heads_by_key(proxy, bucket):
    """{key: HEADs of it} the proxy saw."""
    prefix = f'/{bucket}/'
    return collections.Counter(
        record.path[len(prefix):] for record in proxy.records()
        if record.method == 'HEAD' and record.path.startswith(prefix))


@kernel_keeps_inodes
def test_cold_find_and_walk_send_no_head_for_large_files(server, bucket, s3,
                                                        mount, proxy, tmp_path):
    put_dataset(s3, bucket)
    mnt = mount(bucket, endpoint=proxy.endpoint, cache=tmp_path / 'cache')
    proxy.reset_counters()
    done = subprocess.run(['find', str(mnt.path / 'ds')], capture_output=True,
                          text=True, check=True, timeout=120)
    found = {os.path.relpath(line, mnt.path) for line in done.stdout.splitlines()}
    assert found == {'ds', 'ds/sub'} | LARGE_KEYS | {'ds/link', 'ds/small.txt'}
    heads = heads_by_key(proxy, bucket)
    # the files that may be links, and directories (their markers' modes)
    assert not set(heads) & LARGE_KEYS, heads
    assert set(heads) <= {'ds/', 'ds/link', 'ds/small.txt', 'ds/sub/'}, heads
    assert heads['ds/link'] == 1 and heads['ds/small.txt'] == 1, heads
    assert proxy.counts['GET'] == 0, dict(proxy.counts)
    assert proxy.counts['LIST'] <= 4, dict(proxy.counts)  # ds, sub, lookups

    # os.walk (torchvision's ImageFolder) on a fresh mount and cache: the
    # same, and the types it sees are right
    mnt.unmount()
    again = mount(bucket, endpoint=proxy.endpoint, cache=tmp_path / 'cache2',
                  name='again')
    proxy.reset_counters()
    walked = {}
    for root, dirs, files in os.walk(again.path / 'ds'):
        for name in files:
            walked[os.path.relpath(os.path.join(root, name), again.path)] = 'file'
        for name in dirs:
            walked[os.path.relpath(os.path.join(root, name), again.path)] = 'dir'
    assert walked == dict({key: 'file' for key in LARGE_KEYS},
                          **{'ds/link': 'file', 'ds/small.txt': 'file',
                             'ds/sub': 'dir'})
    with os.scandir(again.path / 'ds') as entries:
        kinds = {entry.name: (entry.is_dir(follow_symlinks=False),
                              entry.is_symlink()) for entry in entries}
    assert kinds['link'] == (False, True)
    assert kinds['notlink'] == (False, False)
    assert kinds['sub'] == (True, False)
    assert kinds[large_name(1)] == (False, False)
    heads = heads_by_key(proxy, bucket)
    assert not set(heads) & LARGE_KEYS, heads


def ls_l(path):
    """`ls -l` of PATH: {name: (mode string, size, target or None)}."""
    done = subprocess.run(['ls', '-l', '--time-style=+%s', str(path)],
                          capture_output=True, text=True, check=True,
                          timeout=300)
    shown = {}
    for line in done.stdout.splitlines()[1:]:          # ("total N")
        fields = line.split(maxsplit=6)
        name, _, target = fields[6].partition(' -> ')
        shown[name] = (fields[0], int(fields[4]), target or None)
    return shown


@kernel_keeps_inodes
@pytest.mark.parametrize('walk_first', [True, False])
def test_ls_l_shows_modes_and_links_and_heads_each_file_once(
        server, bucket, s3, mount, proxy, tmp_path, walk_first):
    put_dataset(s3, bucket)
    mnt = mount(bucket, endpoint=proxy.endpoint, cache=tmp_path / 'cache')
    proxy.reset_counters()
    if walk_first:     # find, then ls -l: the stats are lookups
        subprocess.run(['find', str(mnt.path / 'ds')], capture_output=True,
                       check=True, timeout=120)
    shown = ls_l(mnt.path / 'ds')
    assert len(shown) == LARGE + 4
    for index in range(LARGE):
        mode = '-rw-------' if index % 3 == 0 else '-rw-r--r--'
        assert shown[large_name(index)] == (mode, SIZE, None), index
    assert shown['link'][0] == 'lrwxrwxrwx'
    assert shown['link'][2] == 'small.txt'
    assert shown['notlink'] == ('-rwxr-xr-x', SIZE, None)
    assert shown['small.txt'] == ('-rw-r--r--', 4, None)
    assert shown['sub'][0] == 'drwx------'
    heads = heads_by_key(proxy, bucket)
    # each file of the directory HEADed once, whatever answered it (the
    # lookup itself, or a HEAD it started ahead of the next ones)
    for index in range(LARGE):
        assert heads[f'ds/{large_name(index)}'] == 1, (index, heads)
    assert heads['ds/notlink'] == 1 and heads['ds/link'] == 1, heads
    assert proxy.counts['GET'] <= 1, dict(proxy.counts)   # (the link's target)

    # du needs every size: nothing more to ask
    proxy.reset_counters()
    done = subprocess.run(['du', '-s', '--apparent-size', '-B1',
                           str(mnt.path / 'ds')], capture_output=True,
                          text=True, check=True, timeout=120)
    assert int(done.stdout.split()[0]) >= (LARGE + 2) * SIZE
    assert not set(heads_by_key(proxy, bucket)) & (LARGE_KEYS - {'ds/sub/inner.bin'})
    # and a second ls -l asks nothing of the files
    proxy.reset_counters()
    assert ls_l(mnt.path / 'ds') == shown
    assert not heads_by_key(proxy, bucket), dict(proxy.counts)



@kernel_keeps_inodes
def test_no_headers_walks_cost_lists_only(server, bucket, s3, mount, proxy):
    """-o no_headers=ds: the objects there were written by tools that set
    no s3fs headers, so a listing's attributes are all there is: `ls -l`
    and `du` send no HEAD, of files or of directories. What headers there
    say is not read (a link object shows as the file it is); outside the
    prefix they are."""
    put_dataset(s3, bucket)
    s3.put_object(Bucket=bucket, Key='elsewhere/owned', Body=b'o',
                  Metadata={'mode': str(OWNED)})
    mnt = mount(bucket, options=['no_headers=ds'], endpoint=proxy.endpoint)
    proxy.reset_counters()
    shown = ls_l(mnt.path / 'ds')
    assert len(shown) == LARGE + 4
    for index in range(LARGE):
        assert shown[large_name(index)] == ('-rw-r--r--', SIZE, None), index
    assert shown['link'] == ('-rw-r--r--', len(b'small.txt'), None)
    assert shown['notlink'] == ('-rw-r--r--', SIZE, None)
    assert shown['sub'][0] == 'drwxr-xr-x'
    done = subprocess.run(['du', '-s', '--apparent-size', '-B1',
                           str(mnt.path / 'ds')], capture_output=True,
                          text=True, check=True, timeout=120)
    assert int(done.stdout.split()[0]) >= (LARGE + 2) * SIZE
    assert proxy.counts['HEAD'] == 0, dict(proxy.counts)
    assert proxy.counts['GET'] == 0, dict(proxy.counts)
    # (the root, ds/ and ds/sub/, and again any whose listing passed
    # dir_ttl between the two walks)
    assert proxy.counts['LIST'] <= 6, dict(proxy.counts)

    owned = os.stat(mnt.path / 'elsewhere/owned')
    assert stat.S_IMODE(owned.st_mode) == 0o600
    assert heads_by_key(proxy, bucket)['elsewhere/owned'] == 1


DIRS = 40


def directory_modes(root):
    """{directory: mode} of the directories under ROOT, by `find`: its
    -type test takes the type from readdir, so only directories are
    stat()ed."""
    done = subprocess.run(['find', str(root), '-mindepth', '1', '-type', 'd',
                           '-printf', '%P %m\\n'], capture_output=True,
                          text=True, check=True, timeout=120)
    return dict(line.split() for line in done.stdout.splitlines())


def test_directories_the_kernel_forgot_are_not_asked_again(server, bucket, s3,
                                                           mount, proxy):
    """A directory's marker is HEADed once per mount, not once per inode:
    under memory pressure the kernel forgets directory inodes in the middle
    of a walk, and a `find` of a million keys sent 19,737 HEADs for 1001
    directories when it did."""
    for index in range(DIRS):
        s3.put_object(Bucket=bucket, Key=f'tree/d{index:02d}/', Body=b'',
                      ContentType='application/x-directory',
                      Metadata={'mode': str(stat.S_IFDIR | (0o700 + index % 8))})
        s3.put_object(Bucket=bucket, Key=f'tree/d{index:02d}/f.bin',
                      Body=b'f' * SIZE)
    expected = {f'd{index:02d}': f'{0o700 + index % 8:o}' for index in range(DIRS)}
    mnt = mount(bucket, endpoint=proxy.endpoint)
    proxy.reset_counters()
    assert directory_modes(mnt.path / 'tree') == expected
    heads = heads_by_key(proxy, bucket)
    assert all(heads[f'tree/d{index:02d}/'] == 1 for index in range(DIRS)), heads

    # the kernel forgets the directories, and the daemon with it (a FORGET
    # each). Most of them, not all: a dentry used lately gets a second
    # chance in each pass of drop_caches, which stops when a pass frees
    # little (CI saw one kept: `tree`). Every one forgotten would have
    # been HEADed again before d3efa50.
    inodes = read_stats(mnt.path)['inodes']
    forgotten = 0
    for _ in range(3):
        drop_caches()
        deadline = time.monotonic() + 10
        while forgotten < DIRS // 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            forgotten = inodes - read_stats(mnt.path)['inodes']
        if forgotten >= DIRS // 2:
            break
    assert forgotten >= DIRS // 2, (inodes, forgotten)
    proxy.reset_counters()
    assert directory_modes(mnt.path / 'tree') == expected
    assert not heads_by_key(proxy, bucket), dict(proxy.counts)
