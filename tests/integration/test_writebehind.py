"""Write-behind: in the default mode, a large file written from its start
is uploaded while it is written (multipart parts go up before close), and
close() is left with only the last parts and the completion.

What is checked, at the counting proxy and with boto3 straight to the
server: parts reach the server before close(); no byte is sent twice by a
sequential writer; a writer that goes back over parts already sent
(patches, truncates) still gets exactly its bytes in the bucket; metadata
changed while the file is written (fchmod, futimens) is the object's;
rename and unlink of a file being written; and kill -9 in the middle
leaves no multipart upload behind once the cache is mounted again.
"""
import contextlib
import os
import stat
import urllib.parse

import pytest

from conftest import read_stats, wait_for
from writehelp import (HANG_TIMEOUT, KiB, MiB, bucket_keys, head, kill_9,
                       object_bytes, payload, proxy, sha)

__all__ = ['proxy']   # the fixture, imported for pytest

CHUNK = 1 * MiB


def part_puts(proxy, key=None):
    """Part numbers of the UploadPart requests the proxy saw (for KEY)."""
    numbers = []
    for record in proxy.records():
        if record.method != 'PUT' or 'uploadId=' not in record.query:
            continue
        if key is not None and not record.path.endswith('/' + key):
            continue
        query = urllib.parse.parse_qs(record.query)
        numbers.append(int(query['partNumber'][0]))
    return numbers


@contextlib.contextmanager
def new_file(mnt, name, access=os.O_WRONLY):
    """NAME under MNT, created or truncated, open for the block; its close()
    (where the upload is finished) raises on failure."""
    fd = os.open(mnt.path / name, access | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        yield fd
    finally:
        os.close(fd)


def write_chunks(fd, data, offset=0):
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view[:CHUNK], offset)
        view = view[done:]
        offset += done


def wait_parts(proxy, count, key=None):
    wait_for(lambda: len(part_puts(proxy, key)) >= count, HANG_TIMEOUT,
             f'{count} parts at the proxy before close')


def multipart_uploads(s3, bucket):
    """Multipart uploads the server still holds (None where it cannot list
    them)."""
    try:
        answer = s3.list_multipart_uploads(Bucket=bucket)
    except Exception:  # s3rver: not implemented
        return None
    return [upload['Key'] for upload in answer.get('Uploads', [])]


def test_parts_go_up_while_the_file_is_written(server, s3, bucket, proxy,
                                                mount):
    mnt = mount(bucket, endpoint=proxy.endpoint)
    data = payload('wb-seq', 72 * MiB + 12345)
    proxy.reset_counters()
    with new_file(mnt, 'ckpt.bin') as fd:
        write_chunks(fd, data[:64 * MiB])
        # nothing closed, nothing fsynced: the parts go up on their own
        wait_parts(proxy, 4, 'ckpt.bin')
        before_close = len(part_puts(proxy))
        write_chunks(fd, data[64 * MiB:], 64 * MiB)
    assert sha(object_bytes(s3, bucket, 'ckpt.bin')) == sha(data)
    numbers = part_puts(proxy, 'ckpt.bin')
    assert before_close >= 4
    # each part once: a sequential writer sends every byte once
    assert sorted(numbers) == list(range(1, 11)), numbers
    assert len(data) <= proxy.bytes_from_client < len(data) + 64 * KiB
    stats = read_stats(mnt.path)
    assert stats['uploads_pending'] == 0
    # the metadata of s3fs, but the mtime is the object's own time, and
    # the mount shows that time as every other client would
    answer = head(s3, bucket, 'ckpt.bin')
    assert answer['Metadata'].get('mode') == str(stat.S_IFREG | 0o644)
    assert 'mtime' not in answer['Metadata']
    assert int(os.stat(mnt.path / 'ckpt.bin').st_mtime) == \
        int(answer['LastModified'].timestamp())
    # and reading it back fetches nothing
    proxy.reset_counters()
    assert sha((mnt.path / 'ckpt.bin').read_bytes()) == sha(data)
    assert proxy.counts['GET'] == 0


def test_writer_going_back_over_sent_parts(s3, bucket, proxy, mount):
    """Patches over parts already sent, a truncate into them and growth
    again: the object is exactly the file, whatever was sent before."""
    mnt = mount(bucket, endpoint=proxy.endpoint)
    model = bytearray(payload('wb-back', 64 * MiB))
    proxy.reset_counters()
    with new_file(mnt, 'patched.bin', os.O_RDWR) as fd:
        write_chunks(fd, model)
        wait_parts(proxy, 3, 'patched.bin')
        patch = payload('patch', 4000)
        os.pwrite(fd, patch, 100)                  # into part 1, sent
        model[100:4100] = patch
        os.pwrite(fd, patch, 20 * MiB - 2000)       # across parts 3 and 4
        model[20 * MiB - 2000:20 * MiB + 2000] = patch
        os.ftruncate(fd, 30 * MiB + 3)              # into part 4
        del model[30 * MiB + 3:]
        tail = payload('tail', 20 * MiB)
        write_chunks(fd, tail, len(model))
        model += tail
        assert os.pread(fd, 4000, 100) == patch
    assert sha(object_bytes(s3, bucket, 'patched.bin')) == sha(bytes(model))
    numbers = part_puts(proxy, 'patched.bin')
    assert numbers.count(1) == 2, numbers       # sent, then sent again
    assert proxy.bytes_from_client < 2 * len(model)


def test_zip_style_patches_send_nothing_twice(s3, bucket, proxy, mount):
    """Python's zipfile writes each member, then goes back to fill in its
    header: parts are held back behind such a writer, so no byte goes up
    twice."""
    mnt = mount(bucket, endpoint=proxy.endpoint)
    proxy.reset_counters()
    members = [payload(f'member{i}', 5 * MiB + i * 777) for i in range(10)]
    model = bytearray()
    with new_file(mnt, 'archive.bin', os.O_RDWR) as fd:
        for member in members:
            header = len(model)
            write_chunks(fd, b'\0' * 64, header)         # header, blank
            write_chunks(fd, member, header + 64)
            model += b'\0' * 64 + member
            patched = sha(member)[:64].encode()
            os.pwrite(fd, patched, header)                # filled in
            model[header:header + 64] = patched
    assert sha(object_bytes(s3, bucket, 'archive.bin')) == sha(bytes(model))
    assert len(model) <= proxy.bytes_from_client < len(model) + 64 * KiB
    numbers = part_puts(proxy, 'archive.bin')
    assert len(numbers) == len(set(numbers)), numbers


def test_metadata_changed_while_written(s3, bucket, proxy, mount):
    mnt = mount(bucket, endpoint=proxy.endpoint)
    data = payload('wb-meta', 40 * MiB)
    with new_file(mnt, 'meta.bin') as fd:
        write_chunks(fd, data)
        wait_parts(proxy, 1, 'meta.bin')
        os.fchmod(fd, 0o600)
        os.utime(fd, ns=(1_600_000_000_123_000_000, 1_600_000_000_123_000_000))
    answer = head(s3, bucket, 'meta.bin')
    assert answer['ContentLength'] == len(data)
    assert answer['Metadata'].get('mode') == str(stat.S_IFREG | 0o600)
    assert answer['Metadata'].get('mtime', '').startswith('1600000000')
    assert sha(object_bytes(s3, bucket, 'meta.bin')) == sha(data)
    st = os.stat(mnt.path / 'meta.bin')
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert int(st.st_mtime) == 1_600_000_000


@pytest.mark.parametrize('before', ['new', 'saved'])
def test_rename_while_written(s3, bucket, proxy, mount, before):
    """Renamed while open with parts sent: the write-behind upload is given
    up (its bytes were never closed), the new name holds what was saved
    before (nothing for a new file) until the close, then everything
    written; only the new name is left. (Before: the upload was finished
    under the old name and moved, so bytes never closed replaced the
    saved version; found by the crash torture, seed 2069084.)"""
    saved = payload('wb-saved', 1 * MiB)
    if before == 'saved':
        s3.put_object(Bucket=bucket, Key='tmp.bin', Body=saved)
    mnt = mount(bucket, endpoint=proxy.endpoint)
    first, more = payload('wb-ren1', 40 * MiB), payload('wb-ren2', 3 * MiB)
    with new_file(mnt, 'tmp.bin') as fd:
        write_chunks(fd, first)
        wait_parts(proxy, 1, 'tmp.bin')
        os.rename(mnt.path / 'tmp.bin', mnt.path / 'final.bin')
        if before == 'saved':
            assert bucket_keys(s3, bucket) == ['final.bin']
            assert sha(object_bytes(s3, bucket, 'final.bin')) == sha(saved)
        else:
            assert bucket_keys(s3, bucket) == []
        write_chunks(fd, more, len(first))
    assert bucket_keys(s3, bucket) == ['final.bin']
    assert sha(object_bytes(s3, bucket, 'final.bin')) == sha(first + more)
    assert os.listdir(mnt.path) == ['final.bin']


def test_unlink_while_written(server, s3, bucket, proxy, mount):
    mnt = mount(bucket, endpoint=proxy.endpoint)
    with new_file(mnt, 'gone.bin') as fd:
        write_chunks(fd, payload('wb-gone', 40 * MiB))
        wait_parts(proxy, 1, 'gone.bin')
        os.unlink(mnt.path / 'gone.bin')
    assert bucket_keys(s3, bucket) == []
    assert read_stats(mnt.path)['uploads_pending'] == 0
    # the upload was aborted (s3rver cannot abort; Swift can)
    aborts = [r for r in proxy.records()
              if r.method == 'DELETE' and 'uploadId=' in r.query]
    assert len(aborts) == 1
    # counted (and priced) as the DELETE it is: every DELETE the server got
    stats = read_stats(mnt.path)
    assert stats['requests_delete'] == proxy.counts['DELETE'] >= 1
    assert stats['requests_multipart'] == len(
        [r for r in proxy.records() if r.method != 'DELETE' and
         ('uploadId=' in r.query or 'uploads=' in r.query)])
    if server.name == 'swift':
        assert multipart_uploads(s3, bucket) == []


def test_kill_9_while_written_leaves_no_upload(server, s3, bucket, proxy,
                                               mount, tmp_path):
    """kill -9 with a write-behind upload under way: nothing was closed,
    so nothing is uploaded; the next mount on the cache aborts the
    multipart upload (its id was journaled) and removes the staged data."""
    cache = tmp_path / 'cache'
    mnt = mount(bucket, endpoint=proxy.endpoint, cache=cache)
    fd = os.open(mnt.path / 'cut.bin', os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                 0o644)
    try:
        write_chunks(fd, payload('wb-cut', 40 * MiB))
        wait_parts(proxy, 1, 'cut.bin')
        kill_9(mnt)
    finally:
        try:
            os.close(fd)
        except OSError:
            pass  # the mount is gone
    proxy.reset_counters()
    again = mount(bucket, endpoint=proxy.endpoint, cache=cache, name='again')
    wait_for(lambda: any(r.method == 'DELETE' and 'uploadId=' in r.query
                         for r in proxy.records()), HANG_TIMEOUT,
             'the abort of the unfinished upload')
    wait_for(lambda: os.listdir(cache / 'staging') == [], HANG_TIMEOUT,
             'the staged data of the file never closed to go')
    assert bucket_keys(s3, bucket) == []
    assert os.listdir(again.path) == []
    if server.name == 'swift':
        assert multipart_uploads(s3, bucket) == []


@pytest.mark.parametrize('size', [16 * MiB + 1, 18 * MiB, 24 * MiB, 32 * MiB])
def test_small_multipart_files(s3, bucket, proxy, mount, size):
    """Just past the multipart threshold, and sizes on part boundaries:
    write-behind may start but has little or nothing to send early; the
    object is right either way."""
    mnt = mount(bucket, endpoint=proxy.endpoint)
    data = payload(f'wb-small{size}', size)
    with new_file(mnt, 'edge.bin') as fd:
        write_chunks(fd, data)
    assert sha(object_bytes(s3, bucket, 'edge.bin')) == sha(data)
    assert len(data) <= proxy.bytes_from_client < len(data) + 64 * KiB


def test_truncated_below_the_threshold(s3, bucket, proxy, mount):
    """Parts sent, then the file cut to a single PUT's size: the multipart
    upload is dropped and the object is the short file."""
    mnt = mount(bucket, endpoint=proxy.endpoint)
    data = payload('wb-cut-short', 48 * MiB)
    with new_file(mnt, 'short.bin') as fd:
        write_chunks(fd, data)
        wait_parts(proxy, 1, 'short.bin')
        os.ftruncate(fd, 5 * MiB + 7)
    assert sha(object_bytes(s3, bucket, 'short.bin')) == sha(data[:5 * MiB + 7])
    assert os.stat(mnt.path / 'short.bin').st_size == 5 * MiB + 7


def test_part_refused_in_the_background(s3, bucket, proxy, mount):
    """A part that fails while the file is written (403 here, which is not
    retried) is sent again at close: the object is whole."""
    mnt = mount(bucket, endpoint=proxy.endpoint)
    data = payload('wb-refused', 56 * MiB + 3)
    proxy.reset_counters()
    with new_file(mnt, 'refused.bin') as fd:
        write_chunks(fd, data[:8 * MiB])
        proxy.inject('denied', 1, lambda method, path, query:
                     method == 'PUT' and 'uploadId=' in query)
        write_chunks(fd, data[8 * MiB:], 8 * MiB)
        wait_for(lambda: proxy.faults_injected['denied'] == 1, HANG_TIMEOUT,
                 'a part refused while the file is written')
    assert sha(object_bytes(s3, bucket, 'refused.bin')) == sha(data)
    assert read_stats(mnt.path)['uploads_pending'] == 0


def test_upload_aborted_behind_its_back(server, s3, bucket, proxy, mount):
    """A lifecycle rule (here: another client) aborts the multipart upload
    while the file is written: close() still puts the whole file in the
    bucket, with a new upload."""
    if server.name != 'swift':
        pytest.skip('s3rver cannot abort multipart uploads')
    mnt = mount(bucket, endpoint=proxy.endpoint)
    data = payload('wb-aborted', 48 * MiB)
    with new_file(mnt, 'aborted.bin') as fd:
        write_chunks(fd, data[:32 * MiB])
        wait_parts(proxy, 1, 'aborted.bin')
        for upload in s3.list_multipart_uploads(Bucket=bucket)['Uploads']:
            s3.abort_multipart_upload(Bucket=bucket, Key=upload['Key'],
                                      UploadId=upload['UploadId'])
        write_chunks(fd, data[32 * MiB:], 32 * MiB)
    assert sha(object_bytes(s3, bucket, 'aborted.bin')) == sha(data)
    assert multipart_uploads(s3, bucket) == []
