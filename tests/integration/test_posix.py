"""POSIX behaviour that pjdfstest checks, in a few calls on both servers:
the times of files and directories, and errnos of what S3 cannot keep.
"""
import errno
import os

import pytest

from writehelp import write_file


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
