"""Mounting and unmounting: the errors users meet at mount time, daemon
mode, signals, and /etc/fstab-style mounts through mount.fuse3.

Each mount-time error must exit non-zero before anything is mounted, with
one sentence on stderr that names the problem and holds no secret.
"""
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import (BINARY, daemon_env, is_fuse_mount, wait_for,
                      check_sanitizer_log)


def run_mount(server, home, mountpoint, bucket, options=(), env=None,
              endpoint=None, timeout=60):
    """Runs s3cachefs in the foreground, expecting it to fail at once."""
    mountpoint.mkdir(exist_ok=True)
    opts = ['endpoint=' + (endpoint or server.endpoint),
            f'cache={mountpoint.parent / "cache"}', *options]
    done = subprocess.run([BINARY, '-f', bucket, str(mountpoint), '-o', ','.join(opts)],
                          env=daemon_env(server, home, env), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if is_fuse_mount(mountpoint):
        subprocess.run(['fusermount3', '-u', str(mountpoint)])
        pytest.fail('the mount succeeded although it should not')
    check_sanitizer_log(done.stderr)
    return done


def assert_one_clear_line(done, *words, secret=None):
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    if secret:
        assert secret not in done.stderr


def test_missing_bucket(server, home, tmp_path):
    done = run_mount(server, home, tmp_path / 'mnt', 'no-such-bucket-here')
    assert_one_clear_line(done, "bucket 'no-such-bucket-here' does not exist",
                          secret=server.secret_key)


def test_wrong_secret(server, home, tmp_path, bucket):
    if server.name == 's3rver':
        pytest.skip('s3rver does not verify signatures')
    wrong = 'not-the-secret-' + 'x' * 8
    done = run_mount(server, home, tmp_path / 'mnt', bucket,
                     env={'AWS_SECRET_ACCESS_KEY': wrong})
    assert_one_clear_line(done, 'refused access', 'signature', secret=wrong)


def test_unknown_access_key(server, home, tmp_path, bucket):
    done = run_mount(server, home, tmp_path / 'mnt', bucket,
                     env={'AWS_ACCESS_KEY_ID': 'NOBODY:nobody'})
    assert_one_clear_line(done, 'refused access', secret=server.secret_key)


def test_unreachable_endpoint(server, home, tmp_path, bucket):
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(('127.0.0.1', 0))
        port = probe.getsockname()[1]
    done = run_mount(server, home, tmp_path / 'mnt', bucket,
                     endpoint=f'http://127.0.0.1:{port}', options=['retries=1'])
    assert_one_clear_line(done, 'cannot connect', f'127.0.0.1:{port}')


@pytest.mark.parametrize('option, words', [
    ('attr_ttl=soon', ["attr_ttl=soon"]),
    ('file_mode=0999', ['file_mode=0999']),
    ('connections=0', ['connections=0']),
    ('read_ahead=lots', ['read_ahead=lots']),
    ('no_such_option=1', ['no_such_option']),
    ('endpoint=ftp://127.0.0.1:1', ['invalid endpoint URL']),
])
def test_bad_option(server, home, tmp_path, bucket, option, words):
    done = run_mount(server, home, tmp_path / 'mnt', bucket, options=[option])
    assert done.returncode != 0
    assert all(word in done.stderr for word in words), done.stderr


def test_secret_on_command_line_refused(server, home, tmp_path, bucket):
    done = run_mount(server, home, tmp_path / 'mnt', bucket,
                     options=['secret_key=' + server.secret_key])
    assert_one_clear_line(done, 'never taken from the command line',
                          secret=server.secret_key)


def test_credentials_file(server, home, tmp_path, bucket):
    creds = tmp_path / 'creds'
    creds.write_text(f'[default]\naws_access_key_id = {server.access_key}\n'
                     f'aws_secret_access_key = {server.secret_key}\n')
    creds.chmod(0o644)
    env = {'AWS_ACCESS_KEY_ID': '', 'AWS_SECRET_ACCESS_KEY': ''}
    done = run_mount(server, home, tmp_path / 'mnt', bucket, env=env,
                     options=[f'credentials_file={creds}'])
    assert_one_clear_line(done, str(creds), '0644', secret=server.secret_key)

    creds.chmod(0o600)
    mountpoint = tmp_path / 'mnt'
    proc = subprocess.Popen([BINARY, '-f', bucket, str(mountpoint), '-o',
                             f'endpoint={server.endpoint},credentials_file={creds},'
                             f'cache={tmp_path / "cache"}'],
                            env=daemon_env(server, home, env),
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: is_fuse_mount(mountpoint) or proc.poll() is not None,
                 30, 'the mount')
        assert is_fuse_mount(mountpoint), proc.stderr.read()
        assert os.listdir(mountpoint) == []
    finally:
        subprocess.run(['fusermount3', '-u', str(mountpoint)])
        proc.wait(timeout=30)
    assert proc.returncode == 0


def test_help_and_version():
    for flag in ('--help', '-h'):
        done = subprocess.run([BINARY, flag], capture_output=True, text=True)
        assert done.returncode == 0
        assert 'BUCKET[:PREFIX] MOUNTPOINT' in done.stdout
        assert 'endpoint=URL' in done.stdout
    done = subprocess.run([BINARY, '--version'], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith('s3cachefs ')
    done = subprocess.run([BINARY], capture_output=True, text=True)
    assert done.returncode != 0 and 'usage' in done.stderr


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_signal_unmounts(server, bucket, mount, signum):
    mnt = mount(bucket)
    mnt.kill(signum)
    mnt.process.wait(timeout=30)
    assert mnt.process.returncode == 0, mnt.log()
    assert not is_fuse_mount(mnt.path)
    check_sanitizer_log(mnt.log())
    mnt.process = None


def blocked_signals(pid, tid):
    """The signal numbers thread TID of PID blocks (its SigBlk mask)."""
    status = Path(f'/proc/{pid}/task/{tid}/status').read_text()
    [mask] = [line.split()[1] for line in status.splitlines()
              if line.startswith('SigBlk:')]
    bits = int(mask, 16)
    return {number for number in range(1, 65) if bits >> (number - 1) & 1}


def test_only_the_loop_thread_takes_stop_signals(s3, bucket, mount):
    """SIGINT, SIGTERM, SIGHUP and SIGQUIT reach the main thread, the one
    waiting in libfuse's loop: every other thread blocks them. (One of
    ours that took a SIGINT set libfuse's "exited" where nothing woke the
    loop: test_signal_unmounts hung once in CI.)"""
    s3.put_object(Bucket=bucket, Key='d/one.bin', Body=os.urandom(3 << 20))
    mnt = mount(bucket)
    # threads of every kind at work: lookups, a listing, a read ahead
    assert len((mnt.path / 'd' / 'one.bin').read_bytes()) == 3 << 20
    assert os.listdir(mnt.path / 'd') == ['one.bin']
    pid = mnt.process.pid
    stops = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}
    threads = os.listdir(f'/proc/{pid}/task')
    assert len(threads) > 4
    assert not stops & blocked_signals(pid, pid)
    for tid in threads:
        if int(tid) != pid:
            assert stops <= blocked_signals(pid, tid), tid


def test_daemon_mode(server, bucket, s3, home, tmp_path):
    """Without -f the command returns once mounted; the daemon serves."""
    s3.put_object(Bucket=bucket, Key='daemon.txt', Body=b'from the daemon')
    mountpoint = tmp_path / 'mnt'
    mountpoint.mkdir()
    done = subprocess.run([BINARY, bucket, str(mountpoint), '-o',
                           f'endpoint={server.endpoint},cache={tmp_path / "cache"}'],
                          env=daemon_env(server, home), capture_output=True,
                          text=True, timeout=60)
    try:
        assert done.returncode == 0, done.stderr
        assert is_fuse_mount(mountpoint)
        assert (mountpoint / 'daemon.txt').read_bytes() == b'from the daemon'
    finally:
        subprocess.run(['fusermount3', '-u', str(mountpoint)])
    wait_for(lambda: not is_fuse_mount(mountpoint), 30, 'the unmount')


def test_fstab_style_mount(server, bucket, s3, home, tmp_path):
    """The way /etc/fstab mounts it: mount(8) runs mount.fuse3, which runs
    `s3cachefs BUCKET MNT -o OPTIONS` from PATH. At boot the environment is
    minimal, so credentials come from a file, as here."""
    s3.put_object(Bucket=bucket, Key='fstab.txt', Body=b'fstab works')
    mountpoint = tmp_path / 'mnt'
    mountpoint.mkdir()
    bindir = tmp_path / 'bin'
    bindir.mkdir()
    (bindir / 's3cachefs').symlink_to(BINARY)
    creds = tmp_path / 'credentials'
    creds.write_text(f'[default]\naws_access_key_id = {server.access_key}\n'
                     f'aws_secret_access_key = {server.secret_key}\n')
    creds.chmod(0o600)
    env = {'PATH': f'{bindir}:/usr/sbin:/usr/bin:/sbin:/bin', 'HOME': str(home)}
    options = (f'ro,nodev,nosuid,_netdev,nofail,allow_other,'
               f'endpoint={server.endpoint},credentials_file={creds},'
               f'cache={tmp_path / "cache"}')
    done = subprocess.run(['/sbin/mount.fuse3', bucket, str(mountpoint), '-t',
                           'fuse.s3cachefs', '-o', options],
                          env=env, capture_output=True, text=True, timeout=60)
    try:
        assert done.returncode == 0, done.stderr
        assert is_fuse_mount(mountpoint)
        assert (mountpoint / 'fstab.txt').read_bytes() == b'fstab works'
        with open('/proc/mounts') as mounts:
            line = next(l for l in mounts if str(mountpoint) in l)
        assert line.split()[:3] == [bucket, str(mountpoint), 'fuse.s3cachefs']
        assert 'allow_other' in line and 'ro' in line.split()[3].split(',')
    finally:
        subprocess.run(['umount', str(mountpoint)])
    wait_for(lambda: not is_fuse_mount(mountpoint), 30, 'the unmount')


def test_relative_mountpoint_unmounts_on_signal(server, bucket, home, tmp_path):
    """The daemon runs in /, so it must hold the mount point as an absolute
    path to unmount it when a signal arrives."""
    (tmp_path / 'rel').mkdir()
    proc = subprocess.Popen([BINARY, '-f', bucket, 'rel', '-o',
                             f'endpoint={server.endpoint},cache=cache'], cwd=tmp_path,
                            env=daemon_env(server, home), stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for(lambda: is_fuse_mount(tmp_path / 'rel') or proc.poll() is not None,
                 30, 'the mount')
        assert is_fuse_mount(tmp_path / 'rel')
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert proc.returncode == 0
        assert not is_fuse_mount(tmp_path / 'rel')
    finally:
        if is_fuse_mount(tmp_path / 'rel'):
            subprocess.run(['fusermount3', '-uz', str(tmp_path / 'rel')])
        if proc.poll() is None:
            proc.kill()
            proc.wait()
