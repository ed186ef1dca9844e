"""What the scripts of tests/bench (sync_bench.py, warm_bench.py,
tier_bench.py) share: an s3cachefs mount of their own, waits with a
deadline, the kernel's caches dropped. Errors end the script with its
name and the reason (sys.exit)."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PROGRAM = Path(sys.argv[0]).stem


def is_mounted(path):
    with open('/proc/self/mountinfo') as mounts:
        return any(line.split()[4] == str(path) for line in mounts)


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            sys.exit(f'{PROGRAM}: timed out waiting for {what}')
        time.sleep(0.05)


def drop_caches():
    subprocess.run(['sync'], check=True)
    with open('/proc/sys/vm/drop_caches', 'w') as control:
        control.write('3\n')


class Mount:
    """s3cachefs -f BUCKET on WORKDIR/mnt with the cache WORKDIR/cache
    and -o OPTIONS (a list; endpoint= among them), the keys of SERVER in
    its environment and WORKDIR as its HOME; its output in
    WORKDIR/daemon.log."""

    def __init__(self, binary, server, bucket, workdir, options):
        self.binary = binary
        self.path = workdir / 'mnt'
        self.path.mkdir()
        self.log_path = workdir / 'daemon.log'
        self.log = open(self.log_path, 'ab')
        env = {k: v for k, v in os.environ.items() if not k.startswith('AWS_')}
        env.update(AWS_ACCESS_KEY_ID=server.access_key,
                   AWS_SECRET_ACCESS_KEY=server.secret_key, HOME=str(workdir))
        options = [f'cache={workdir / "cache"}'] + list(options)
        self.process = subprocess.Popen(
            [binary, '-f', bucket, str(self.path), '-o', ','.join(options)],
            env=env, stdout=self.log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
        wait_for(lambda: is_mounted(self.path) or self.process.poll() is not None,
                 30, 'the mount')
        if self.process.poll() is not None:
            sys.exit(f'{PROGRAM}: s3cachefs exited with '
                     f'{self.process.returncode} (see {self.log_path})')

    def stats(self):
        """`s3cachefs stats --json` of the mount."""
        done = subprocess.run([self.binary, 'stats', '--json', str(self.path)],
                              capture_output=True, text=True, check=True)
        return json.loads(done.stdout)

    def unmount(self, timeout=300):
        subprocess.run([self.binary, '--unmount', str(self.path)], check=True,
                       timeout=timeout)
        self.process.wait(timeout=60)
        self.log.close()
