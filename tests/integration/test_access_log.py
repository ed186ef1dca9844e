"""-o access_log=FILE: the paths a job opened, for the next node's warm.

A mount lists each version opened for reading once, as a path through the
mount point, in the order of first opens: read twice, one line; replaced
by another client and read again, a second line; a file written through
the mount is listed once read back from the bucket, and files only looked
up (ls -l) are not listed. A mount of
BUCKET:PREFIX lists paths without the prefix. The file is appended to,
never truncated, and one that is inside the mount point, or in a missing
directory, fails the mount with a sentence and exit status 1.
"""
import os
import subprocess

from conftest import BINARY, daemon_env, is_fuse_mount


def lines_of(path):
    return path.read_text().splitlines() if path.exists() else []


def test_each_version_read_is_listed_once(s3, bucket, mount, tmp_path):
    listing = tmp_path / 'opened.list'
    bodies = {'a.bin': os.urandom(3000), 'dir/b.bin': os.urandom(1 << 20),
              'dir/sub/c.txt': b'c', 'unread.bin': b'u'}
    for key, body in bodies.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    mnt = mount(bucket, options=[f'access_log={listing}', 'attr_ttl=0', 'dir_ttl=0'])
    root = mnt.path

    assert (root / 'dir/b.bin').read_bytes() == bodies['dir/b.bin']
    assert (root / 'a.bin').read_bytes() == bodies['a.bin']
    assert (root / 'dir/b.bin').read_bytes() == bodies['dir/b.bin']
    assert (root / 'dir/sub/c.txt').read_bytes() == b'c'
    os.listdir(root)
    os.stat(root / 'unread.bin')                 # looked up, not opened
    (root / 'written.bin').write_bytes(b'w' * 100)
    assert (root / 'written.bin').read_bytes() == b'w' * 100
    s3.put_object(Bucket=bucket, Key='a.bin', Body=b'new a')
    assert (root / 'a.bin').read_bytes() == b'new a'

    # written.bin, read back once in the bucket, is a version read too (a
    # checkpoint the next run resumes from)
    expected = [f'{root}/dir/b.bin', f'{root}/a.bin', f'{root}/dir/sub/c.txt',
                f'{root}/written.bin', f'{root}/a.bin']
    # each line is appended as its file is opened: no unmount needed
    assert lines_of(listing) == expected
    mnt.unmount()

    # the next mount appends
    again = mount(bucket, options=[f'access_log={listing}'], name='again')
    assert (again.path / 'dir/sub/c.txt').read_bytes() == b'c'
    assert lines_of(listing) == expected + [f'{again.path}/dir/sub/c.txt']


def test_prefix_mount_lists_paths_without_it(s3, bucket, mount, tmp_path):
    listing = tmp_path / 'opened.list'
    s3.put_object(Bucket=bucket, Key='models/m1/w.bin', Body=b'weights')
    mnt = mount(f'{bucket}:models', options=[f'access_log={listing}'])
    assert (mnt.path / 'm1/w.bin').read_bytes() == b'weights'
    assert lines_of(listing) == [f'{mnt.path}/m1/w.bin']


def test_bad_files_refused_before_mounting(server, bucket, home, tmp_path):
    mountpoint = tmp_path / 'mnt'
    mountpoint.mkdir()
    for path, says in ((mountpoint / 'opened.list', 'outside the mount point'),
                       (tmp_path / 'missing' / 'x', 'No such file or directory')):
        done = subprocess.run(
            [BINARY, '-f', bucket, str(mountpoint), '-o',
             f'endpoint={server.endpoint},cache={tmp_path / "cache"},'
             f'access_log={path}'],
            env=daemon_env(server, home), capture_output=True, text=True,
            timeout=60)
        assert done.returncode == 1
        assert says in done.stderr and 'access_log=' in done.stderr, done.stderr
        assert not is_fuse_mount(mountpoint)
        assert not path.exists()
