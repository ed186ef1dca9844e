"""Editing objects already in the bucket: only what is needed is fetched.

Opening an existing object for writing fetches nothing up front; the bytes
of the old object are fetched a granule (1 MiB) at a time when read or
partly overwritten, and on upload the parts never written are copied
server-side (UploadPartCopy). s3rver cannot copy parts: there the unchanged
parts are fetched and sent instead, and only the bytes are checked.
"""
import hashlib
import os

from conftest import read_stats

MiB = 1 << 20


def pattern(size, seed):
    """Deterministic bytes that differ at every offset of interest."""
    block = hashlib.sha256(seed.encode()).digest() * (MiB // 32)
    return (block * (size // MiB + 1))[:size]


def test_small_write_into_a_large_object(server, s3, bucket, mount):
    size = 40 * MiB
    data = pattern(size, 'large')
    s3.put_object(Bucket=bucket, Key='model.bin', Body=data)
    mnt = mount(bucket)
    with open(mnt.path / 'model.bin', 'r+b') as edited:
        edited.seek(20 * MiB + 5)
        edited.write(b'patched!')
    stats = read_stats(mnt.path)
    expected = data[:20 * MiB + 5] + b'patched!' + data[20 * MiB + 13:]
    stored = s3.get_object(Bucket=bucket, Key='model.bin')['Body'].read()
    assert hashlib.sha256(stored).digest() == hashlib.sha256(expected).digest()
    assert (mnt.path / 'model.bin').read_bytes() == expected
    if server.name != 's3rver':
        # the part around the write goes up, the others are copied
        # server-side; what was fetched is that part at most
        assert stats['bytes_to_bucket'] <= 9 * MiB, stats
        assert stats['bytes_from_bucket'] <= 9 * MiB, stats
        assert stats['requests_copy'] + stats['requests_multipart'] >= 5, stats


def test_append_to_an_object(server, s3, bucket, mount):
    size = 24 * MiB + 12345
    data = pattern(size, 'log')
    s3.put_object(Bucket=bucket, Key='log.txt', Body=data)
    mnt = mount(bucket)
    with open(mnt.path / 'log.txt', 'ab') as log:
        log.write(b'one more line\n')
    stats = read_stats(mnt.path)
    stored = s3.get_object(Bucket=bucket, Key='log.txt')['Body'].read()
    assert stored == data + b'one more line\n'
    if server.name != 's3rver':
        # the last granule was fetched (the append shares it), not the rest
        assert stats['bytes_from_bucket'] <= 2 * MiB, stats
        assert stats['bytes_to_bucket'] <= 9 * MiB, stats


def test_truncate_then_grow_reads_zeros(server, s3, bucket, mount):
    data = pattern(3 * MiB + 77, 'shrink')
    s3.put_object(Bucket=bucket, Key='f.bin', Body=data)
    mnt = mount(bucket)
    with open(mnt.path / 'f.bin', 'r+b') as edited:
        edited.truncate(MiB + 10)
        edited.truncate(2 * MiB)
        edited.seek(0)
        got = edited.read()
    expected = data[:MiB + 10] + bytes(2 * MiB - (MiB + 10))
    assert got == expected
    stored = s3.get_object(Bucket=bucket, Key='f.bin')['Body'].read()
    assert stored == expected


def test_edit_then_rename_keeps_every_byte(server, s3, bucket, mount):
    """A file open for writing whose old object moves away (rename) is
    fetched whole first: nothing is lost with the old name."""
    data = pattern(20 * MiB + 3, 'moved')
    s3.put_object(Bucket=bucket, Key='a.bin', Body=data)
    mnt = mount(bucket)
    fd = os.open(mnt.path / 'a.bin', os.O_RDWR)
    try:
        os.pwrite(fd, b'head', 0)
        os.rename(mnt.path / 'a.bin', mnt.path / 'b.bin')
        os.pwrite(fd, b'tail', 20 * MiB)
    finally:
        os.close(fd)
    expected = b'head' + data[4:20 * MiB] + b'tail' + data[20 * MiB + 4:]
    keys = [o['Key'] for o in s3.list_objects_v2(Bucket=bucket).get('Contents', [])]
    assert keys == ['b.bin']
    stored = s3.get_object(Bucket=bucket, Key='b.bin')['Body'].read()
    assert hashlib.sha256(stored).digest() == hashlib.sha256(expected).digest()


def test_grown_edit_uploaded_twice_keeps_every_write(server, s3, bucket, mount):
    """An edit that grows past its object, is fsynced, then written again
    where it grew: the second upload carries that write (nothing past the
    first object is copied from the first upload)."""
    data = pattern(10 * MiB, 'grown')
    s3.put_object(Bucket=bucket, Key='g.bin', Body=data)
    mnt = mount(bucket)
    with open(mnt.path / 'g.bin', 'r+b') as edited:
        edited.seek(0, os.SEEK_END)
        edited.write(pattern(30 * MiB, 'more'))
        edited.flush()
        os.fsync(edited.fileno())
        edited.seek(20 * MiB)
        edited.write(b'second write')
    expected = bytearray(data + pattern(30 * MiB, 'more'))
    expected[20 * MiB:20 * MiB + 12] = b'second write'
    stored = s3.get_object(Bucket=bucket, Key='g.bin')['Body'].read()
    assert hashlib.sha256(stored).digest() == hashlib.sha256(expected).digest()


def test_chmod_of_an_open_edit_then_write(server, s3, bucket, mount):
    """fchmod on a file open for writing (its object not fetched) and a
    write afterwards: both reach the bucket, no byte is lost."""
    data = pattern(3 * MiB + 5, 'chmod')
    s3.put_object(Bucket=bucket, Key='c.bin', Body=data)
    mnt = mount(bucket)
    fd = os.open(mnt.path / 'c.bin', os.O_RDWR)
    try:
        os.fchmod(fd, 0o600)
        os.pwrite(fd, b'written after chmod', MiB + 7)
    finally:
        os.close(fd)
    expected = data[:MiB + 7] + b'written after chmod' + data[MiB + 26:]
    answer = s3.get_object(Bucket=bucket, Key='c.bin')
    assert answer['Body'].read() == expected
    assert int(answer['Metadata']['mode']) & 0o777 == 0o600
