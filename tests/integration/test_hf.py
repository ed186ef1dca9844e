"""The Hugging Face hub cache, op by op, on the mount (HF_HOME=MNT/hf).

What huggingface_hub's hf_hub_download does to its cache, done with the
same system calls but without the library (which is not in Debian):

  - a symlink-support probe: mkdtemp in the cache, touch, relative
    symlink, rmtree;
  - per file, under a python3-filelock FileLock (fcntl.flock) on
    hub/.locks/models--org--name/<etag>.lock:
      the blob written to blobs/<etag>.<uuid>.incomplete through two
      opens ("wb" with the first half, then "ab" with the rest, as a
      resumed download does), chmod 0644, os.replace to blobs/<etag>,
      a relative symlink snapshots/<rev>/<path> -> ../../blobs/<etag>
      (../../../../blobs/<etag> for a nested path);
  - refs/main written under a temporary name and os.replace'd.

Then unmount, remount on a new cache directory (so every byte comes from
the bucket) and read the snapshot through its symlinks. Both modes:
default and -o writeback.
"""
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import filelock
import pytest

from writehelp import (KiB, MULTIPART_SIZE, bucket_keys, head, object_bytes,
                       payload, sha)

REPO = 'models--org--name'
REVISION = hashlib.sha1(b'the commit').hexdigest()
LOCK_TIMEOUT = 10

# A second process trying the lock: exit 3 on Timeout, 0 once it has it.
TRY_LOCK = """
import sys, filelock
lock = filelock.FileLock(sys.argv[1], timeout=float(sys.argv[2]))
try:
    lock.acquire()
except filelock.Timeout:
    sys.exit(3)
lock.release()
"""


def git_blob_id(data):
    return hashlib.sha1(b'blob %d\0' % len(data) + data).hexdigest()


def snapshot_files():
    """path in the snapshot -> (etag, bytes): an LFS file (etag = sha256),
    and git files (etag = the git blob id), one of them nested."""
    weights = payload('weights', MULTIPART_SIZE)
    config = b'{"model_type": "test", "hidden_size": 64}\n'
    nested = payload('nested', 3 * KiB + 5)
    return {
        'model.safetensors': (hashlib.sha256(weights).hexdigest(), weights),
        'config.json': (git_blob_id(config), config),
        'sub/dir/file.json': (git_blob_id(nested), nested),
    }


def try_lock(lock_path, timeout, hf_home):
    done = subprocess.run([sys.executable, '-c', TRY_LOCK, str(lock_path),
                           str(timeout)], env=dict(os.environ, HF_HOME=str(hf_home)),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 3), done.stderr
    return done.returncode


def symlinks_supported(cache_dir):
    """huggingface_hub's are_symlinks_supported(), its own ops."""
    tmpdir = tempfile.mkdtemp(dir=cache_dir)
    try:
        src = Path(tmpdir) / 'dummy_file_src'
        src.touch()
        dst = Path(tmpdir) / 'dummy_file_dst'
        os.symlink(os.path.relpath(src, start=os.path.dirname(dst)), dst)
        return os.path.islink(dst)
    finally:
        shutil.rmtree(tmpdir)


def download(hub, path, etag, data, check_lock_held=None):
    """One file of hf_hub_download, into the cache at HUB."""
    storage = hub / REPO
    lock_path = hub / '.locks' / REPO / f'{etag}.lock'
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    blob_path = storage / 'blobs' / etag
    pointer_path = storage / 'snapshots' / REVISION / path
    with filelock.FileLock(str(lock_path), timeout=LOCK_TIMEOUT):
        if check_lock_held:
            check_lock_held(lock_path)
        blob_path.parent.mkdir(parents=True, exist_ok=True)
        pointer_path.parent.mkdir(parents=True, exist_ok=True)
        incomplete = blob_path.with_name(f'{etag}.{uuid.uuid4().hex}.incomplete')
        half = len(data) // 2
        with open(incomplete, 'wb') as f:
            f.write(data[:half])
        with open(incomplete, 'ab') as f:   # the resumed download
            assert f.tell() == half
            f.write(data[half:])
        os.chmod(incomplete, 0o644)
        os.replace(incomplete, blob_path)
        try:
            os.remove(pointer_path)
        except OSError:
            pass
        target = os.path.relpath(blob_path, os.path.dirname(pointer_path))
        os.symlink(target, pointer_path)
    return target


def write_ref(hub, revision):
    refs = hub / REPO / 'refs'
    refs.mkdir(parents=True, exist_ok=True)
    temporary = refs / f'main.{uuid.uuid4().hex}.tmp'
    temporary.write_text(revision)
    os.replace(temporary, refs / 'main')


def check_snapshot(hub, files, targets):
    """The snapshot as a reader sees it, through the symlinks."""
    storage = hub / REPO
    snapshot = storage / 'snapshots' / REVISION
    for path, (etag, data) in files.items():
        pointer = snapshot / path
        assert os.path.islink(pointer), path
        assert os.readlink(pointer) == targets[path], path
        assert sha(pointer.read_bytes()) == sha(data), path
        blob = storage / 'blobs' / etag
        mode = os.stat(blob).st_mode
        assert stat.S_ISREG(mode) and stat.S_IMODE(mode) == 0o644, oct(mode)
    assert sorted(os.listdir(storage / 'blobs')) == \
        sorted(etag for etag, _ in files.values())
    assert (storage / 'refs' / 'main').read_text() == REVISION
    assert os.listdir(storage / 'refs') == ['main']
    assert sorted(os.listdir(hub / '.locks' / REPO)) == \
        sorted(f'{etag}.lock' for etag, _ in files.values())


@pytest.mark.parametrize('mode', ['default', 'writeback'])
def test_hf_hub_cache_sequence(server, s3, bucket, mount, mode):
    options = ['writeback'] if mode == 'writeback' else []
    mnt = mount(bucket, options=options)
    hf_home = mnt.path / 'hf'
    hub = hf_home / 'hub'
    hub.mkdir(parents=True)
    assert symlinks_supported(hub)
    assert os.listdir(hub) == []

    files = snapshot_files()
    held = []

    def second_process_is_refused(lock_path):
        held.append(try_lock(lock_path, 0.1, hf_home))

    targets = {}
    for index, (path, (etag, data)) in enumerate(files.items()):
        check = second_process_is_refused if index == 0 else None
        targets[path] = download(hub, path, etag, data, check)
    assert held == [3], 'a second process took the lock while it was held'
    first_lock = hub / '.locks' / REPO / f'{files["model.safetensors"][0]}.lock'
    assert try_lock(first_lock, 5, hf_home) == 0, 'the released lock stays taken'
    assert targets['model.safetensors'] == f'../../blobs/{files["model.safetensors"][0]}'
    assert targets['sub/dir/file.json'] == f'../../../../blobs/{files["sub/dir/file.json"][0]}'
    write_ref(hub, REVISION)
    check_snapshot(hub, files, targets)
    mnt.unmount()

    # What the bucket holds, read with boto3.
    prefix = f'hf/hub/{REPO}/'
    keys = bucket_keys(s3, bucket, 'hf/')
    assert not [k for k in keys if 'incomplete' in k or '.tmp' in k], keys
    assert not [k for k in keys if k.startswith('hf/hub/tmp')], keys
    for path, (etag, data) in files.items():
        assert sha(object_bytes(s3, bucket, f'{prefix}blobs/{etag}')) == sha(data)
        link = head(s3, bucket, f'{prefix}snapshots/{REVISION}/{path}')
        assert link is not None, path
        assert stat.S_ISLNK(int(link['Metadata']['mode'])), link['Metadata']
        assert object_bytes(s3, bucket, f'{prefix}snapshots/{REVISION}/{path}') == \
            targets[path].encode()
    assert object_bytes(s3, bucket, f'{prefix}refs/main') == REVISION.encode()

    # A new mount on a new cache directory: every byte from the bucket.
    again = mount(bucket, options=options, name='again')
    check_snapshot(again.path / 'hf' / 'hub', files, targets)
    assert sorted(os.listdir(again.path / 'hf' / 'hub')) == ['.locks', REPO]
