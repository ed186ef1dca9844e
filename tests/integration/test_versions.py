"""Versions of one file: a read after close() returns what was closed, the
bucket ends with the last version whatever older uploads do, a crash never
lets a version that was not closed (or an older one) replace the one that
was promised, and a failed upload heals by itself.

Each test makes its race a fact with the proxy (tests/harness/s3proxy.py):
an upload held at the proxy is "under way" for as long as the test wants.
What is in the bucket is checked with boto3, straight to the server.
"""
import errno
import os
import random
import subprocess
import time

import pytest

import s3proxy

from conftest import BINARY, read_stats, wait_for
from writehelp import (HANG_TIMEOUT, HOLD_ALL, KiB, MiB, bucket_keys, head,
                       kill_9, object_bytes, payload, proxy, run_within, sha,
                       start_in_thread, wait_stat, write_file)

__all__ = ['proxy']   # the fixture, imported for pytest


def put_to(key):
    """inject() matcher: object PUTs (not copies: those carry a header the
    matcher cannot see, so tests keep copies away) to KEY."""
    def match(method, path, query):
        return method == 'PUT' and path.endswith('/' + key)
    return match


def unmount_command(mnt):
    """`s3cachefs --unmount`: returns once every upload is done."""
    done = subprocess.run([BINARY, '--unmount', str(mnt.path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + mnt.log()[-3000:]
    mnt.process.wait(timeout=HANG_TIMEOUT)
    mnt.process = None


def rewrite_and_read(path, data):
    write_file(path, data)
    with open(path, 'rb') as reading:
        return reading.read()


# ------------------------------------------------------ reads after close

@pytest.mark.parametrize('mode', ['default', 'writeback'])
def test_read_after_close_while_an_older_version_uploads(server, s3, bucket,
                                                        proxy, mount, mode):
    """A 1 MiB version's upload is held at the proxy; the file is opened
    with O_TRUNC, 10 bytes are written and closed: a read returns those 10
    bytes, and neither the writes nor (with -o writeback) close() waited
    for the held upload. After the upload is let through, the bucket ends
    with the 10 bytes. (Before: the file's staged data was detached once
    the old upload ended, the rewrite went to a copy nobody read, and the
    read returned the 1 MiB version; 20-25 of 300 reads in a loop.)"""
    options = ['writeback'] if mode == 'writeback' else []
    mnt = mount(bucket, options=options, endpoint=proxy.endpoint)
    path = mnt.path / 'ckpt.bin'
    old, new = payload('v1', MiB), b'0123456789'
    proxy.inject('hold', HOLD_ALL, 'PUT')
    try:
        if mode == 'writeback':
            write_file(path, old)
        else:
            # default mode: the closing thread uploads; the rewrite comes
            # from another descriptor while that upload is held
            closing = start_in_thread(write_file, path, old)
        wait_for(lambda: proxy.holding >= 1, 10, 'the upload at the proxy')
        rewriting = start_in_thread(rewrite_and_read, path, new)
        if mode == 'writeback':
            try:
                got = rewriting.result(timeout=10)
            except TimeoutError:
                pytest.fail('the rewrite waited for the held upload of the '
                            'older version')
            assert got == new, f'read {len(got)} bytes after writing 10'
            assert sha(path.read_bytes()) == sha(new)
        else:
            time.sleep(1)
            # the default mode's close uploads, and waits: let both go
            proxy.release()
            closing.result(timeout=HANG_TIMEOUT)
            got = rewriting.result(timeout=HANG_TIMEOUT)
            assert got == new, f'read {len(got)} bytes after writing 10'
    finally:
        proxy.release()
    unmount_command(mnt)
    assert object_bytes(s3, bucket, 'ckpt.bin') == new


def test_rewrites_in_a_loop_read_back_what_was_closed(server, s3, bucket,
                                                      mount):
    """-o writeback, 40 ms per request at the proxy: three names written
    and read back in turn, 60 times, sizes 0 B to 3 MiB. Every read is the
    version just closed; after `--unmount`, each name holds its last."""
    with s3proxy.S3Proxy(server.endpoint, latency=0.04) as slow:
        mnt = mount(bucket, options=['writeback'], endpoint=slow.endpoint)
        rng = random.Random(7)
        last = {}
        wrong = []
        for i in range(60):
            name = f'f{i % 3}'
            size = rng.choice([0, 10, 4 * KiB, 300 * KiB, MiB, 3 * MiB])
            data = payload(f'loop{i}', size)
            got = rewrite_and_read(mnt.path / name, data)
            last[name] = data
            if got != data:
                wrong.append((i, name, size, len(got)))
        assert not wrong, f'reads returned another version: {wrong}'
        unmount_command(mnt)
    for name, data in last.items():
        assert sha(object_bytes(s3, bucket, name)) == sha(data), name


# ------------------------------------------------------ crashes

@pytest.mark.parametrize('change', ['truncate', 'overwrite', 'append'])
def test_crash_uploads_what_was_closed(server, s3, bucket, proxy, mount,
                                       tmp_path, change):
    """-o writeback: a file closed (journaled; its uploads refused), reopened
    and changed without a close (O_TRUNC and a few bytes, the same size
    rewritten in place, or appended to), then kill -9: the next mount
    uploads exactly the bytes that were closed. (Before: it uploaded the
    staging file as it was, bytes nobody had closed; a rewrite of the same
    size silently.)"""
    cache = tmp_path / 'cache'
    mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint,
                cache=cache)
    path = mnt.path / 'model.bin'
    closed = payload('closed', 200 * KiB + 3)
    proxy.inject('denied', HOLD_ALL, 'PUT')
    fd = -1
    try:
        write_file(path, closed)
        if change == 'truncate':
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
            os.write(fd, b'not closed')
        elif change == 'overwrite':
            fd = os.open(path, os.O_WRONLY)
            os.write(fd, payload('other', len(closed)))
        else:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            os.write(fd, b'appended, not closed')
        kill_9(mnt)
    finally:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError as error:
                assert error.errno == errno.ENOTCONN
        proxy.clear_faults()
    assert head(s3, bucket, 'model.bin') is None
    again = mount(bucket, options=['writeback'], endpoint=proxy.endpoint,
                  cache=cache, name='again')
    assert (again.path / 'model.bin').read_bytes() == closed
    unmount_command(again)
    assert sha(object_bytes(s3, bucket, 'model.bin')) == sha(closed)


@pytest.mark.parametrize('moment', ['copy', 'delete'])
def test_crash_during_a_rename_over_a_pending_file(server, s3, bucket, proxy,
                                                  mount, tmp_path, moment):
    """-o writeback: b closed (journaled, not uploaded: another descriptor
    keeps it open for writing), then a (in the bucket) renamed over b, and
    kill -9 while the rename's server-side copy is held at the proxy, or
    once the DELETE of a has been done by the server and its answer lost
    (its retries reset).
    The next mount leaves the whole state as before the rename (a with its
    bytes, b with its promise) or as after it (no a, b with a's bytes).
    (Before: b's journal entry was dropped before the copy, and b was
    gone; then the DELETE of a went before b's promise was dropped, and a
    crash in between uploaded b's promise over the copy: a was lost.)"""
    cache = tmp_path / 'cache'
    mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint,
                cache=cache)
    a_data, b_data = payload('a', 100 * KiB), payload('b', 150 * KiB)
    write_file(mnt.path / 'a', a_data)
    fsync_fd = os.open(mnt.path / 'a', os.O_RDONLY)
    os.fsync(fsync_fd)
    os.close(fsync_fd)
    assert object_bytes(s3, bucket, 'a') == a_data
    keeper = os.open(mnt.path / 'b', os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        write_file(mnt.path / 'b', b_data)
        time.sleep(0.5)   # past the settle: b stays unsent while open
        assert head(s3, bucket, 'b') is None
        if moment == 'copy':
            proxy.inject('hold', HOLD_ALL, put_to('b'))
        else:
            # done by the server, its answer lost, and every retry reset
            proxy.inject('lost', 1, delete_of('a'))
            proxy.inject('reset', HOLD_ALL, delete_of('a'))
        renaming = start_in_thread(os.rename, mnt.path / 'a', mnt.path / 'b')
        if moment == 'copy':
            wait_for(lambda: proxy.holding >= 1, 10, 'the copy to b at the proxy')
        else:
            wait_for(lambda: proxy.faults_injected['lost'] >= 1, 10,
                     'the DELETE of a, its answer lost')
            try:
                renaming.result(timeout=HANG_TIMEOUT)
            except OSError:
                pass    # (a rename that says it failed may still be done)
        kill_9(mnt)
        if moment == 'copy':
            with pytest.raises(OSError):
                renaming.result(timeout=HANG_TIMEOUT)
    finally:
        try:
            os.close(keeper)
        except OSError as error:
            assert error.errno == errno.ENOTCONN
        proxy.drop_held()   # what is held is reset, never forwarded
        proxy.clear_faults()
    again = mount(bucket, options=['writeback'], endpoint=proxy.endpoint,
                  cache=cache, name='again')
    unmount_command(again)
    state = {key: sha(object_bytes(s3, bucket, key))
             for key in bucket_keys(s3, bucket)}
    before = {'a': sha(a_data), 'b': sha(b_data)}
    after = {'b': sha(a_data)}
    assert state in (before, after), \
        f'the bucket is {state}: neither {before} (before the rename) ' \
        f'nor {after} (after it)'


def puts_under(prefix):
    """inject() matcher: every PUT (copies included) of a key under
    PREFIX."""
    def match(method, path, query):
        return method == 'PUT' and f'/{prefix}' in path
    return match


@pytest.mark.parametrize('mode', ['default', 'writeback'])
def test_checkpoint_replaced_while_its_directory_is_renamed(
        server, s3, bucket, proxy, mount, mode):
    """`mv ckpt ckpt.old` (held at the proxy while it copies) while the
    trainer does os.replace(ckpt/last.tmp, ckpt/last): the kernel sends
    both (the directory's rename locks only the root). The new checkpoint
    ends in ckpt.old/last, or the replace fails cleanly; no key comes back
    under ckpt/. (Before: the file's rename used the keys it took before
    the directory moved, and put ckpt/last back.)"""
    options = ['writeback'] if mode == 'writeback' else []
    mnt = mount(bucket, options=options, endpoint=proxy.endpoint)
    old, new = payload('old', 60 * KiB), payload('new', 80 * KiB)
    (mnt.path / 'ckpt').mkdir()
    write_file(mnt.path / 'ckpt' / 'last', old)
    write_file(mnt.path / 'ckpt' / 'last.tmp', new)
    if mode == 'writeback':
        wait_stat(mnt, 'uploads_pending', lambda v: v == 0)
    proxy.inject('hold', HOLD_ALL, puts_under('ckpt.old/'))
    try:
        moving = start_in_thread(os.rename, mnt.path / 'ckpt',
                                 mnt.path / 'ckpt.old')
        wait_for(lambda: proxy.holding >= 1, 10, 'the move of ckpt at the proxy')
        replacing = start_in_thread(os.replace, mnt.path / 'ckpt' / 'last.tmp',
                                    mnt.path / 'ckpt' / 'last')
        # (nothing outside the daemon tells when the replace reached it;
        # it does within this, and is then held or waiting)
        time.sleep(0.5)
    finally:
        proxy.release()
    moving.result(timeout=HANG_TIMEOUT)
    try:
        replacing.result(timeout=HANG_TIMEOUT)
        replaced = True
    except OSError:
        replaced = False
    unmount_command(mnt)
    keys = bucket_keys(s3, bucket)
    assert not [key for key in keys if key.startswith('ckpt/')], keys
    if replaced:
        assert sorted(keys) == ['ckpt.old/', 'ckpt.old/last'], keys
        assert object_bytes(s3, bucket, 'ckpt.old/last') == new
    else:
        assert sorted(keys) == ['ckpt.old/', 'ckpt.old/last',
                                'ckpt.old/last.tmp'], keys


def delete_of(key):
    """inject() matcher: the DELETE of KEY."""
    def match(method, path, query):
        return method == 'DELETE' and path.endswith('/' + key)
    return match


@pytest.mark.parametrize('change', ['unlink', 'rename', 'rename_dir'])
def test_crash_while_an_older_version_is_deleted(server, s3, bucket, proxy,
                                                 mount, tmp_path, change):
    """-o writeback: d/f is in the bucket (v1), then closed again (v2,
    journaled, not uploaded: another descriptor keeps it open for writing).
    `rm d/f`, `mv d/f d/g` or `mv d e`, and kill -9 while the DELETE of d/f
    is held at the proxy. The next mount may leave d/f as it was before
    the change (v2) or gone, never v1: a promise leaves its key only after
    the older object under it. (Before: the journal entry was dropped, or
    moved to the new name, before the DELETE, and d/f came back as v1;
    found by the crash torture, seed 7901116.)"""
    cache = tmp_path / 'cache'
    mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint,
                cache=cache)
    (mnt.path / 'd').mkdir()
    v1, v2 = payload('v1', 30 * KiB), payload('v2', 50 * KiB + 1)
    write_file(mnt.path / 'd' / 'f', v1)
    fsync_fd = os.open(mnt.path / 'd' / 'f', os.O_RDONLY)
    os.fsync(fsync_fd)
    os.close(fsync_fd)
    assert object_bytes(s3, bucket, 'd/f') == v1
    keeper = os.open(mnt.path / 'd' / 'f', os.O_WRONLY)
    try:
        write_file(mnt.path / 'd' / 'f', v2)
        time.sleep(0.5)   # past the settle: v2 stays unsent while open
        assert object_bytes(s3, bucket, 'd/f') == v1
        proxy.inject('hold', HOLD_ALL, delete_of('d/f'))
        if change == 'unlink':
            changing = start_in_thread(os.unlink, mnt.path / 'd' / 'f')
        elif change == 'rename':
            changing = start_in_thread(os.rename, mnt.path / 'd' / 'f',
                                       mnt.path / 'd' / 'g')
        else:
            changing = start_in_thread(os.rename, mnt.path / 'd',
                                       mnt.path / 'e')
        wait_for(lambda: proxy.holding >= 1, 10, 'the DELETE of d/f')
        kill_9(mnt)
        with pytest.raises(OSError):
            changing.result(timeout=HANG_TIMEOUT)
    finally:
        try:
            os.close(keeper)
        except OSError as error:
            assert error.errno == errno.ENOTCONN
        proxy.drop_held()   # the held DELETE is reset, never forwarded
    again = mount(bucket, options=['writeback'], endpoint=proxy.endpoint,
                  cache=cache, name='again')
    shown = sha((again.path / 'd' / 'f').read_bytes()) \
        if (again.path / 'd' / 'f').exists() else None
    unmount_command(again)
    assert shown != sha(v1), 'the mount showed the older version of d/f'
    left = head(s3, bucket, 'd/f')
    if left is not None:
        assert sha(object_bytes(s3, bucket, 'd/f')) == sha(v2), \
            'd/f ended with an older version than its last close'
    for other in ('d/g', 'e/f'):
        if head(s3, bucket, other) is not None:
            assert sha(object_bytes(s3, bucket, other)) == sha(v2), other


def test_crash_during_a_directory_rename_shows_the_new_name(
        server, s3, bucket, proxy, mount, tmp_path):
    """-o writeback: d/f closed (journaled, not uploaded: another descriptor
    keeps it open for writing), `mv d e`, kill -9 while the move's copy of
    the marker d/ is held. The next mount's recovery uploads f as e/f; while
    that upload is held at a second proxy, `ls` shows e, and e/f reads the
    closed bytes. (Before: e had no key in the bucket yet, and the mount
    showed neither until the upload was done; found by the crash torture,
    seed 7901116.)"""
    cache = tmp_path / 'cache'
    mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint,
                cache=cache)
    (mnt.path / 'd').mkdir()
    closed = payload('closed', 70 * KiB)
    keeper = os.open(mnt.path / 'd' / 'f', os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        write_file(mnt.path / 'd' / 'f', closed)
        time.sleep(0.5)   # past the settle: f stays unsent while open
        proxy.inject('hold', HOLD_ALL, put_to('e/'))
        renaming = start_in_thread(os.rename, mnt.path / 'd', mnt.path / 'e')
        wait_for(lambda: proxy.holding >= 1, 10, 'the copy of the marker')
        kill_9(mnt)
        with pytest.raises(OSError):
            renaming.result(timeout=HANG_TIMEOUT)
    finally:
        try:
            os.close(keeper)
        except OSError as error:
            assert error.errno == errno.ENOTCONN
        proxy.drop_held()
    assert head(s3, bucket, 'e/f') is None and head(s3, bucket, 'd/f') is None
    proxy.inject('hold', HOLD_ALL, put_to('e/f'))
    again = mount(bucket, options=['writeback'], endpoint=proxy.endpoint,
                  cache=cache, name='again')
    wait_for(lambda: proxy.holding >= 1, 10, 'the upload of e/f')
    assert 'e' in os.listdir(again.path)
    assert sha((again.path / 'e' / 'f').read_bytes()) == sha(closed)
    proxy.release()
    unmount_command(again)
    assert sha(object_bytes(s3, bucket, 'e/f')) == sha(closed)


# ------------------------------------------------------ failures heal

@pytest.mark.parametrize('mode', ['default', 'writeback'])
def test_failed_upload_is_retried_in_the_background(server, s3, bucket, proxy,
                                                    mount, mode):
    """Every PUT refused (403) three times, then allowed: the file reaches
    the bucket by itself, with no fsync, close or unmount to push it, and
    the counters say it was retried. (Before: only fsync, the unmount or
    the next mount tried again.)"""
    options = ['writeback'] if mode == 'writeback' else []
    mnt = mount(bucket, options=options, endpoint=proxy.endpoint)
    data = payload('retried', 50 * KiB)
    proxy.inject('denied', 3, 'PUT')
    outcome, _ = run_within(HANG_TIMEOUT, write_file, mnt.path / 'r.bin', data)
    if mode == 'writeback':
        assert outcome is None, outcome
    else:
        assert isinstance(outcome, OSError) and outcome.errno == errno.EACCES, \
            outcome
    wait_for(lambda: head(s3, bucket, 'r.bin') is not None, 30,
             'the background retry to upload the file')
    assert object_bytes(s3, bucket, 'r.bin') == data
    stats = read_stats(mnt.path)
    assert stats['upload_retries'] >= 1, stats
    assert stats['upload_failures'] >= 1, stats
    wait_stat(mnt, 'uploads_pending', lambda v: v == 0)
    assert 'tried again' in mnt.log()
    assert bucket_keys(s3, bucket) == ['r.bin']


# ------------------------------------------------------ copies

@pytest.mark.parametrize('change', ['chmod', 'rename', 'dirmove'])
def test_copy_keeps_no_old_blocks_for_a_new_version(server, s3, bucket, proxy,
                                                    mount, tmp_path, change):
    """An object read through the mount (its blocks cached), then chmod'ed,
    renamed, or moved with its directory through the mount, while another
    client replaces it with other bytes of the same size: the server-side
    copy is held at the proxy until the object is replaced. After a
    remount, a read returns the bucket's bytes. (Before: the copy was
    unconditional and the cached blocks were relabelled as the copy's
    version: the old bytes came back, across remounts, and nothing was
    fetched.)"""
    key = 'd/w.bin' if change == 'dirmove' else 'w.bin'
    old, new = payload('old', 4 * MiB), payload('new', 4 * MiB)
    s3.put_object(Bucket=bucket, Key=key, Body=old)
    cache = tmp_path / 'cache'
    options = ['attr_ttl=60', 'dir_ttl=60']
    mnt = mount(bucket, options=options, endpoint=proxy.endpoint, cache=cache)
    assert sha((mnt.path / key).read_bytes()) == sha(old)
    if change == 'chmod':
        name = key
        operation = (os.chmod, mnt.path / key, 0o600)
    elif change == 'rename':
        name = 'moved.bin'
        operation = (os.rename, mnt.path / key, mnt.path / name)
    else:
        name = 'e/w.bin'
        operation = (os.rename, mnt.path / 'd', mnt.path / 'e')
    proxy.inject('hold', 1, put_to(name))
    try:
        changing = start_in_thread(*operation)
        wait_for(lambda: proxy.holding >= 1, 10, 'the copy at the proxy')
        s3.put_object(Bucket=bucket, Key=key, Body=new)
    finally:
        proxy.release()
    assert changing.result(timeout=HANG_TIMEOUT) is None
    unmount_command(mnt)
    assert sha(object_bytes(s3, bucket, name)) == sha(new)
    again = mount(bucket, options=options, cache=cache, name='again')
    assert sha((again.path / name).read_bytes()) == sha(new), \
        'the old version\'s cached blocks were served for the new one'


# ------------------------------------------------------ a journal that fails

@pytest.mark.parametrize('journal', ['back', 'gone'])
def test_unmount_keeps_what_the_journal_refused(server, s3, bucket, proxy,
                                                mount, tmp_path, journal):
    """-o writeback, the journal on a tmpfs the test fills, every PUT
    refused: close() fails (the journal cannot take the file), and so does
    every upload. The unmount tries the journal again: with room again
    ('back') the file is journaled; with the journal still full ('gone',
    then the tmpfs and the journal on it gone for good) its promise is kept
    beside its staging file. Either way the next mount uploads it. (Before:
    the unmount logged that the file stayed in the journal, and the next
    mount's sweep deleted its staging file.)"""
    cache = tmp_path / 'cache'
    journal_dir = cache / 'journal'
    journal_dir.mkdir(parents=True)
    subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=1m', 'tmpfs',
                    str(journal_dir)], check=True)
    try:
        mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint,
                    cache=cache)
        # the FUSE mount shows up before the daemon opens its journal: a
        # request answered says it has (filled first, the journal cannot
        # be opened and the daemon does not start)
        os.stat(mnt.path)
        proxy.inject('denied', HOLD_ALL, 'PUT')
        filler = journal_dir / 'filler'
        with open(filler, 'wb', buffering=0) as fill:
            try:
                while True:
                    fill.write(b'\0' * 4096)
            except OSError as error:
                assert error.errno == errno.ENOSPC
        data = payload('refused', 30 * KiB)
        outcome, _ = run_within(HANG_TIMEOUT, write_file, mnt.path / 'j.bin',
                                data)
        assert isinstance(outcome, OSError), \
            f'close() gave {outcome!r} with the journal full'
        if journal == 'back':
            filler.unlink()
        done = subprocess.run([BINARY, '--unmount', str(mnt.path)],
                              capture_output=True, text=True, timeout=120)
        code = mnt.process.wait(timeout=HANG_TIMEOUT)
        mnt.process = None
        assert code == 1, f'the daemon exited {code}:\n{mnt.log()[-3000:]}'
        assert 'its data is lost' not in mnt.log(), mnt.log()[-3000:]
        proxy.clear_faults()
        assert head(s3, bucket, 'j.bin') is None
        if journal == 'gone':
            subprocess.run(['umount', str(journal_dir)], check=True)
            assert not (journal_dir / 'data.mdb').exists()
        again = mount(bucket, options=['writeback'], endpoint=proxy.endpoint,
                      cache=cache, name='again')
        unmount_command(again)
        assert object_bytes(s3, bucket, 'j.bin') == data
    finally:
        proxy.clear_faults()
        if journal_dir.is_mount():
            subprocess.run(['umount', '-l', str(journal_dir)])


# ------------------------------------------------------ renamed over

@pytest.mark.parametrize('then', ['unlink', 'rename_away', 'unsaved'])
def test_a_replaced_object_does_not_come_back(server, s3, bucket, proxy,
                                              mount, tmp_path, then):
    """-o writeback, b in the bucket. A file renamed over b before its own
    upload leaves b's object under the key until that upload replaces it.
    Unlinked, or renamed away, before its upload: b's old object goes too
    (before: it stayed in the bucket for good, and b came back). A file
    never closed (saved nowhere) renamed over b, then kill -9: b's name
    holds nothing (before: b's old bytes). A descriptor open for writing
    keeps tmp's upload from starting before the renames (0.2 s after its
    close, which a loaded machine can take between two calls: its PUT was
    then held at the proxy, the rename waited for it, and it landed after
    the rename had deleted tmp)."""
    old = payload('old-b', 40 * KiB)
    s3.put_object(Bucket=bucket, Key='b', Body=old)
    cache = tmp_path / 'cache'
    mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint,
                cache=cache)
    assert (mnt.path / 'b').read_bytes() == old
    new = payload('new', 20 * KiB)
    proxy.inject('hold', HOLD_ALL, 'PUT')
    fd = os.open(mnt.path / 'tmp', os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        if then == 'unsaved':
            os.write(fd, new)
            os.rename(mnt.path / 'tmp', mnt.path / 'b')
            kill_9(mnt)
        else:
            write_file(mnt.path / 'tmp', new)  # closed: journaled
            os.rename(mnt.path / 'tmp', mnt.path / 'b')
            if then == 'unlink':
                os.unlink(mnt.path / 'b')
            else:
                os.rename(mnt.path / 'b', mnt.path / 'c')
            assert proxy.holding == 0, 'tmp was uploaded before the renames'
    finally:
        try:
            os.close(fd)
        except OSError as error:
            assert error.errno == errno.ENOTCONN
        proxy.release()
    if then != 'unsaved':
        unmount_command(mnt)
    expected = {'rename_away': ['c']}.get(then, [])
    assert bucket_keys(s3, bucket) == expected, \
        'the replaced file\'s object came back'
    if then == 'rename_away':
        assert object_bytes(s3, bucket, 'c') == new


def test_a_file_renamed_over_while_it_uploads_does_not_come_back(
        server, s3, bucket, proxy, mount):
    """-o writeback: b closed, its upload held at the proxy; tmp closed and
    renamed over b (the rename waits for b's upload), then b renamed to c.
    After the unmount, the bucket has c with tmp's bytes and no b. (Before:
    the rename over b read b's key as holding nothing before the upload it
    waited for landed, and b's old bytes stayed under the key for good;
    found by the crash torture, seed 3082705.)"""
    mnt = mount(bucket, options=['writeback'], endpoint=proxy.endpoint)
    old, new = payload('old-b', 30 * KiB), payload('tmp', 20 * KiB)
    proxy.inject('hold', 1, put_to('b'))
    # tmp stays unsent while a descriptor keeps it open for writing
    keeper = os.open(mnt.path / 'tmp', os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        write_file(mnt.path / 'tmp', new)
        write_file(mnt.path / 'b', old)
        wait_for(lambda: proxy.holding >= 1, 10, "b's upload at the proxy")
        renaming = start_in_thread(os.rename, mnt.path / 'tmp',
                                   mnt.path / 'b')
        time.sleep(0.3)   # the rename waits for the held upload
        assert not renaming.done()
        proxy.release()
        renaming.result(timeout=HANG_TIMEOUT)
        os.rename(mnt.path / 'b', mnt.path / 'c')
    finally:
        os.close(keeper)
    assert (mnt.path / 'c').read_bytes() == new
    unmount_command(mnt)
    assert bucket_keys(s3, bucket) == ['c'], 'b came back'
    assert object_bytes(s3, bucket, 'c') == new


@pytest.mark.parametrize('mode', ['default', 'writeback'])
def test_an_open_file_renamed_over_reads_and_writes_on(server, s3, bucket,
                                                       mount, mode):
    """b (3 MiB, in the bucket) open for reading and writing, a renamed
    over it: the descriptor still reads b's bytes and writes into them, as
    after an unlink. (Before, in the default mode, a write that needed
    b's bytes fetched them from the key, which now held a's object: EIO.)"""
    old = payload('old-b', 3 * MiB)
    s3.put_object(Bucket=bucket, Key='b', Body=old)
    s3.put_object(Bucket=bucket, Key='a', Body=b'a is smaller')
    options = ['writeback'] if mode == 'writeback' else []
    mnt = mount(bucket, options=options)
    fd = os.open(mnt.path / 'b', os.O_RDWR)
    try:
        os.rename(mnt.path / 'a', mnt.path / 'b')
        assert os.pwrite(fd, b'patch', MiB + 10) == 5
        expected = old[:MiB + 10] + b'patch' + old[MiB + 15:]
        assert sha(os.pread(fd, len(old) + 1, 0)) == sha(expected)
    finally:
        os.close(fd)
    assert (mnt.path / 'b').read_bytes() == b'a is smaller'
    unmount_command(mnt)
    assert bucket_keys(s3, bucket) == ['b']
    assert object_bytes(s3, bucket, 'b') == b'a is smaller'
