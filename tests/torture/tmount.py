"""Mounts for the crash torture (torture.py): one s3cachefs daemon in the
foreground, killed with SIGKILL or unmounted with `s3cachefs --unmount`,
and, for the power-loss test, a cache directory on ext4 on a loop device
whose backing file lives on tmpfs.

Nothing here uses pytest: torture.py runs from a shell as well. Errors
are TortureError with a sentence saying what went wrong.
"""
import contextlib
import fcntl
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

MOUNT_TIMEOUT = 30.0
UNMOUNT_TIMEOUT = 180.0     # --unmount waits for every upload
SANITIZER_MARKERS = ('ERROR: AddressSanitizer', 'ERROR: LeakSanitizer',
                     'runtime error:', 'SUMMARY: UndefinedBehaviorSanitizer')


class TortureError(RuntimeError):
    """The test machinery (not the daemon under test) failed."""


def is_fuse_mount(path):
    """True when /proc/mounts lists PATH as a FUSE mount."""
    target = os.path.realpath(path)
    with open('/proc/mounts') as mounts:
        for line in mounts:
            fields = line.split()
            if (len(fields) > 2 and fields[1] == target
                    and fields[2].startswith('fuse')):
                return True
    return False


def is_mounted(path):
    """True when /proc/mounts lists PATH as a mount point of any kind."""
    target = os.path.realpath(path)
    with open('/proc/mounts') as mounts:
        return any(line.split()[1] == target for line in mounts
                   if len(line.split()) > 1)


def wait_until(predicate, timeout, interval=0.01):
    """Polls PREDICATE until it is true (returns True) or TIMEOUT passes
    (returns False)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def lazy_unmount(path):
    """Detaches a FUSE mount whose daemon is dead (or a busy one)."""
    if is_fuse_mount(path):
        subprocess.run(['fusermount3', '-uz', str(path)],
                       capture_output=True)
    wait_until(lambda: not is_fuse_mount(path), 10)


class Daemon:
    """One s3cachefs process (-f) serving MOUNTPOINT with CACHE_DIR."""

    def __init__(self, binary, server, endpoint, bucket, mountpoint,
                 cache_dir, log_path, home, writeback):
        self.binary = binary
        self.mountpoint = Path(mountpoint)
        self.log_path = Path(log_path)
        options = [f'endpoint={endpoint}', f'cache={cache_dir}']
        if writeback:
            options.append('writeback')
        # S3CACHEFS_TORTURE_DEBUG=1: the daemon's debug log (and libfuse's
        # trace of every request) in its log file, for a replay
        debug = ['-d'] if os.environ.get('S3CACHEFS_TORTURE_DEBUG') else []
        self.argv = [binary, '-f', *debug, bucket, str(self.mountpoint),
                     '-o', ','.join(options)]
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith('AWS_')}
        self.env.update(HOME=str(home), AWS_ACCESS_KEY_ID=server.access_key,
                        AWS_SECRET_ACCESS_KEY=server.secret_key)
        self.process = None
        self.log_offset = 0

    def spawn(self):
        """Starts the daemon; returns at once (see wait_mounted)."""
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        lazy_unmount(self.mountpoint)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, 'ab') as log:
            self.log_offset = log.tell()
            self.process = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)

    def wait_mounted(self, timeout=MOUNT_TIMEOUT):
        """Waits for the mount; TortureError if the daemon exits first or
        it takes longer than TIMEOUT."""
        up = wait_until(lambda: is_fuse_mount(self.mountpoint)
                        or self.process.poll() is not None, timeout)
        if self.process.poll() is not None:
            raise TortureError(f's3cachefs exited with '
                               f'{self.process.returncode} before mounting:'
                               f'\n{self.log_tail()}')
        if not up:
            self.kill()
            raise TortureError(f'no mount on {self.mountpoint} after '
                               f'{timeout}s:\n{self.log_tail()}')

    def start(self):
        self.spawn()
        self.wait_mounted()
        return self

    @property
    def pid(self):
        return self.process.pid

    def alive(self):
        return self.process is not None and self.process.poll() is None

    def kill(self):
        """SIGKILL, wait for the process, clear the dead mount point."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.process = None
        lazy_unmount(self.mountpoint)

    def unmount(self, timeout=UNMOUNT_TIMEOUT):
        """`s3cachefs --unmount MNT` (which waits for the uploads), then
        the daemon's exit. Returns (exit status or None on a timeout,
        seconds taken, what --unmount printed)."""
        started = time.monotonic()
        try:
            done = subprocess.run([self.binary, '--unmount',
                                   str(self.mountpoint)],
                                  capture_output=True, text=True,
                                  timeout=timeout)
            said = (done.stdout + done.stderr).strip()
        except subprocess.TimeoutExpired:
            said = f'--unmount did not return within {timeout}s'
        try:
            code = self.process.wait(
                timeout=max(1.0, timeout - (time.monotonic() - started)))
            self.process = None
        except subprocess.TimeoutExpired:
            code = None
            self.kill()
        lazy_unmount(self.mountpoint)
        return code, time.monotonic() - started, said

    def log_text(self):
        try:
            return self.log_path.read_text(errors='replace')
        except FileNotFoundError:
            return ''

    def log_tail(self, chars=3000):
        return self.log_text()[-chars:]

    def sanitizer_report(self):
        """The sanitizer report in this daemon's log, or None."""
        text = self.log_text()
        for marker in SANITIZER_MARKERS:
            at = text.find(marker)
            if at >= 0:
                return text[max(0, at - 200):at + 3000]
        return None


# ----------------------------------------------------------- power loss

SYSCTLS = {'vm/dirty_writeback_centisecs': '0',       # no periodic flusher
           'vm/dirty_expire_centisecs': '8640000'}    # dirty data never old
SYSCTL_SAVED = Path('/tmp/s3cachefs-torture-sysctl.saved')
SYSCTL_LOCK = Path('/tmp/s3cachefs-torture-sysctl.lock')
EXT4_OPTIONS = 'commit=86400'                         # no timed jbd2 commit


def _sysctl_path(name):
    return Path('/proc/sys') / name


def _restore_saved(saved_file):
    for line in saved_file.read_text().splitlines()[1:]:
        name, _, value = line.partition(' ')
        _sysctl_path(name).write_text(value + '\n')
    saved_file.unlink()


@contextlib.contextmanager
def writeback_off():
    """Background writeback off for the duration (see SYSCTLS), restored
    afterwards whatever happens. The old values are kept in SYSCTL_SAVED
    too, so that a run killed by SIGKILL is undone by the next one; a
    lock keeps two power-loss runs from stacking their changes."""
    SYSCTL_LOCK.touch()
    with open(SYSCTL_LOCK) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if SYSCTL_SAVED.exists():   # left by a run that was killed
            _restore_saved(SYSCTL_SAVED)
        old = {name: _sysctl_path(name).read_text().strip()
               for name in SYSCTLS}
        SYSCTL_SAVED.write_text(f'{os.getpid()}\n' + ''.join(
            f'{name} {value}\n' for name, value in old.items()))
        previous = {sig: signal.getsignal(sig)
                    for sig in (signal.SIGTERM, signal.SIGHUP)}

        def stop(signum, frame):
            raise SystemExit(128 + signum)
        for sig in previous:
            signal.signal(sig, stop)
        try:
            for name, value in SYSCTLS.items():
                _sysctl_path(name).write_text(value + '\n')
            yield old
        finally:
            _restore_saved(SYSCTL_SAVED)
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class LoopDisk:
    """An ext4 filesystem on a loop device whose backing file IMAGE lives
    on tmpfs: what reaches IMAGE is what reached the "disk". copy() of
    IMAGE while nothing is being written is the disk after a power cut."""

    def __init__(self, image, mountpoint, size_mb=256):
        self.image = Path(image)
        self.mountpoint = Path(mountpoint)
        self.size_mb = size_mb
        self.device = None

    def create(self):
        with open(self.image, 'wb') as image:
            image.truncate(self.size_mb << 20)
        subprocess.run(['mkfs.ext4', '-q', '-F', '-E',
                        'lazy_itable_init=0,lazy_journal_init=0',
                        str(self.image)], check=True, capture_output=True)
        return self.attach()

    def attach(self):
        """Loop device on IMAGE, ext4 mounted (the journal is replayed)."""
        self.device = subprocess.run(
            ['losetup', '-f', '--show', str(self.image)], check=True,
            capture_output=True, text=True).stdout.strip()
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(['mount', '-t', 'ext4', '-o', EXT4_OPTIONS,
                               self.device, str(self.mountpoint)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            self.detach()
            raise TortureError(f'cannot mount {self.image}: {done.stderr}')
        return self

    def sync(self):
        """syncfs of the filesystem: what is there now is on the disk."""
        subprocess.run(['sync', '-f', str(self.mountpoint)], check=True)

    def copy(self, target):
        """Copies IMAGE to TARGET (holes kept): the disk as a power cut
        would leave it, page cache lost."""
        subprocess.run(['cp', '--sparse=always', str(self.image),
                        str(target)], check=True)

    def detach(self):
        """Unmounts (lazily if busy) and frees the loop device."""
        if is_mounted(self.mountpoint):
            if subprocess.run(['umount', str(self.mountpoint)],
                              capture_output=True).returncode != 0:
                subprocess.run(['umount', '-l', str(self.mountpoint)],
                               capture_output=True)
        if self.device is not None:
            subprocess.run(['losetup', '-d', self.device],
                           capture_output=True)
            self.device = None


def check_power_cut(directory, tries=3):
    """The premise of the power-loss test, checked where it runs: on a
    LoopDisk, a file written and fsynced survives a copy of the backing
    file, and one written without fsync does not. Raises TortureError
    if that does not hold TRIES times over (a `sync` elsewhere on the
    machine can flush the second file once in a while)."""
    directory = Path(directory)
    data = os.urandom(1 << 20)
    found = None
    for _ in range(tries):
        disk = LoopDisk(directory / 'probe.img', directory / 'probe',
                        size_mb=64).create()
        try:
            for name, synced in (('synced', True), ('unsynced', False)):
                with open(disk.mountpoint / name, 'wb') as file:
                    file.write(data)
                    if synced:
                        file.flush()
                        os.fsync(file.fileno())
            disk.copy(directory / 'probe.cut')
            disk.detach()
            os.replace(directory / 'probe.cut', disk.image)
            disk.attach()
            found = [(disk.mountpoint / name).exists()
                     and (disk.mountpoint / name).read_bytes() == data
                     for name in ('synced', 'unsynced')]
        finally:
            disk.detach()
            disk.image.unlink(missing_ok=True)
        if found == [True, False]:
            return
    raise TortureError(f'a power cut on a loop device does not behave here '
                       f'(fsynced file kept, unsynced file lost: {found})')


def new_boot(cache_dir):
    """Rewrites CACHE_DIR/state (see src/cache_dir.c: "BOOT_ID clean|open")
    with another boot id, as the first mount after a power cut sees it.
    Returns what the file said, or None if there was none."""
    state = Path(cache_dir) / 'state'
    try:
        text = state.read_text()
    except FileNotFoundError:
        return None
    boot, _, rest = text.partition(' ')
    state.write_text(f'{uuid.uuid4()} {rest}')
    return text.strip()


@contextlib.contextmanager
def tmpfs(directory, size):
    """A tmpfs of SIZE on DIRECTORY for the duration."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs',
                    str(directory)], check=True)
    try:
        yield directory
    finally:
        if subprocess.run(['umount', str(directory)],
                          capture_output=True).returncode != 0:
            subprocess.run(['umount', '-l', str(directory)])
