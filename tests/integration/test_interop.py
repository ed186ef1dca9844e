"""Interoperability with s3fs-fuse (Debian's s3fs): a tree written through
one filesystem reads back the same through the other.

The tree: files with modes 0600 and 0755, nested directories, an empty
directory, a relative symlink and a file whose mtime was set with
os.utime. Checked on the other side: bytes (sha256), file type and
permission bits, mtime to the second, the symlink's target (and the file
behind it), the empty directory, and each directory's listing.

Special files (a FIFO, a socket, a character and a block device) made by
either one show their type and mode in the other, by lstat and in a
listing; s3cachefs keeps device numbers, s3fs does not.
"""
import os
import socket
import stat
from pathlib import Path

from writehelp import KiB, MiB, payload, s3fs_mount, sha, write_file

__all__ = ['s3fs_mount']   # the fixture, imported for pytest

MTIME = 1600000000          # 2020-09-13, a whole second
DEEP_TARGET = 'a/b/c/deep.bin'


def tree_spec(tag):
    """files: relative path -> (bytes, permission bits)."""
    return {
        'private.txt': (f'only the owner ({tag})\n'.encode(), 0o600),
        'script.sh': (f'#!/bin/sh\necho {tag}\n'.encode(), 0o755),
        'dated.txt': (f'dated ({tag})\n'.encode(), 0o644),
        DEEP_TARGET: (payload(f'deep{tag}', MiB + 3 * KiB + 1), 0o644),
        'a/mid.txt': (b'in the middle\n', 0o640),
    }


def write_tree(root, tag):
    """Writes the tree under ROOT with ordinary calls; returns its spec."""
    files = tree_spec(tag)
    os.makedirs(root / 'a' / 'b' / 'c')
    os.mkdir(root / 'emptydir')
    for path, (data, mode) in files.items():
        write_file(root / path, data, mode)
        os.chmod(root / path, mode)
    os.symlink(DEEP_TARGET, root / 'link')
    os.utime(root / 'dated.txt', (MTIME, MTIME))
    return files


def check_tree(root, files):
    """ROOT holds what write_tree wrote: bytes, modes, mtime, symlink,
    empty directory, listings."""
    for path, (data, mode) in files.items():
        info = os.lstat(root / path)
        assert stat.S_ISREG(info.st_mode), f'{path}: {oct(info.st_mode)}'
        assert stat.S_IMODE(info.st_mode) == mode, \
            f'{path}: mode {oct(info.st_mode)}, expected {oct(mode)}'
        assert info.st_size == len(data), path
        assert sha((root / path).read_bytes()) == sha(data), path
    assert int(os.stat(root / 'dated.txt').st_mtime) == MTIME, \
        os.stat(root / 'dated.txt').st_mtime
    assert os.path.islink(root / 'link')
    assert os.readlink(root / 'link') == DEEP_TARGET
    assert (root / 'link').read_bytes() == files[DEEP_TARGET][0]
    assert os.path.isdir(root / 'emptydir') and os.listdir(root / 'emptydir') == []
    for directory in ('a', 'a/b', 'a/b/c'):
        assert stat.S_ISDIR(os.lstat(root / directory).st_mode), directory
    assert sorted(os.listdir(root)) == sorted(
        ['private.txt', 'script.sh', 'dated.txt', 'a', 'emptydir', 'link'])
    assert sorted(os.listdir(root / 'a')) == ['b', 'mid.txt']
    assert sorted(os.listdir(root / 'a' / 'b' / 'c')) == ['deep.bin']


def test_s3cachefs_tree_reads_back_in_s3fs(server, bucket, mount, s3fs_mount):
    mnt = mount(bucket)
    root = mnt.path / 'from-s3cachefs'
    os.mkdir(root)
    files = write_tree(root, 's3cachefs')
    check_tree(root, files)   # as s3cachefs itself sees it
    mnt.unmount()

    other = s3fs_mount(bucket)
    check_tree(Path(other.path) / 'from-s3cachefs', files)


def test_s3fs_tree_reads_back_in_s3cachefs(server, bucket, mount, s3fs_mount):
    other = s3fs_mount(bucket)
    root = other.path / 'from-s3fs'
    os.mkdir(root)
    files = write_tree(root, 's3fs')
    other.unmount()   # s3fs has uploaded everything when it exits

    mnt = mount(bucket)
    check_tree(mnt.path / 'from-s3fs', files)


# ------------------------------------------------------------ special files
# A FIFO, a socket and device nodes are empty objects whose x-amz-meta-mode
# carries the file type, as s3fs writes them; s3cachefs adds the device
# number in x-amz-meta-rdev, which s3fs does not keep (it shows 0, 0).

SPECIALS = {   # name -> (file type, permission bits, device number)
    'fifo': (stat.S_IFIFO, 0o640, 0),
    'sock': (stat.S_IFSOCK, 0o755, 0),
    'chr': (stat.S_IFCHR, 0o600, os.makedev(1, 3)),
    'blk': (stat.S_IFBLK, 0o660, os.makedev(7, 0)),
}


def make_specials(root):
    for name, (kind, mode, device) in SPECIALS.items():
        path = root / name
        if kind == stat.S_IFSOCK:
            with socket.socket(socket.AF_UNIX) as listener:
                listener.bind(str(path))
        else:
            os.mknod(path, kind | 0o600, device)
        os.chmod(path, mode)


def check_specials(root, with_devices):
    """ROOT holds SPECIALS: by lstat, and by a listing's own types."""
    for name, (kind, mode, device) in SPECIALS.items():
        info = os.lstat(root / name)
        assert stat.S_IFMT(info.st_mode) == kind, f'{name}: {oct(info.st_mode)}'
        assert stat.S_IMODE(info.st_mode) == mode, f'{name}: {oct(info.st_mode)}'
        assert info.st_size == 0, name
        if with_devices:
            assert info.st_rdev == device, f'{name}: {info.st_rdev:#x}'
    with os.scandir(root) as entries:
        listed = {entry.name: entry for entry in entries}
    assert sorted(listed) == sorted(SPECIALS)
    assert listed['fifo'].is_file() is False and listed['sock'].is_dir() is False
    for name, (kind, _, _) in SPECIALS.items():
        assert stat.S_IFMT(listed[name].stat(follow_symlinks=False).st_mode) == kind


def test_special_files_in_both_directions(server, bucket, s3, mount, s3fs_mount):
    other = s3fs_mount(bucket)
    make_specials(Path(other.path))
    other.unmount()

    mnt = mount(bucket)
    check_specials(mnt.path, with_devices=False)   # s3fs keeps no numbers
    os.mkdir(mnt.path / 'here')
    make_specials(mnt.path / 'here')
    check_specials(mnt.path / 'here', with_devices=True)
    mnt.unmount()
    for name, (kind, mode, device) in SPECIALS.items():
        meta = s3.head_object(Bucket=bucket, Key=f'here/{name}')['Metadata']
        assert int(meta['mode']) == kind | mode, (name, meta)
        if kind in (stat.S_IFCHR, stat.S_IFBLK):
            assert int(meta['rdev']) == device, (name, meta)

    again = mount(bucket, name='again')   # a new cache: the bucket says it all
    check_specials(again.path / 'here', with_devices=True)
    again.unmount()
    other = s3fs_mount(bucket, name='s3fs-again')
    check_specials(Path(other.path) / 'here', with_devices=False)
