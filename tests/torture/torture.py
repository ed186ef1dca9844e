#!/usr/bin/python3
"""Crash torture for s3cachefs: random workloads from a seed, a model of
what each point promised (kept outside the mount), kill -9 at random
moments, and a check of every read and of the bucket against the model.

    /usr/bin/python3 tests/torture/torture.py --server s3rver --mode both \\
        --rounds 20 --binary build/src/s3cachefs

The promise under test (README, HACKING.md "Durability"): a file whose
close() (or fsync(), or truncate() by path) returned 0 is in the bucket or
will be, after a crash by the next mount on the same cache directory;
reads return the last written bytes, never others.

One round = one seed: a fresh bucket (a few objects put with boto3 first),
a fresh cache directory, a mount, a workload of --ops-per-round operations
on a small name space (6 names in the root and in up to two directories,
plus temporary names) during which a timer kills the daemon with SIGKILL
"after op N + X ms"; then the next mount on the same cache (itself killed
shortly after it starts, sometimes, and mounted again), every file read
back through it, sometimes a second workload on that mount and a second
kill, then `s3cachefs --unmount` (which waits for the uploads) and the
bucket read with boto3. Some rounds end with a clean unmount instead of a
kill. --power-loss replaces the kill with a power cut (see powerloss in
HACKING.md): the cache on ext4 on a loop device, the disk copied at the
kill, the copy mounted as the cache.

The model, per path: `current` (what a read must return now: the bytes
of the file through every descriptor) and `promised` (a set: the bucket
may end with any of them). close/fsync/truncate(path) returning 0 set
promised to current; rename moves both, unlink makes both absent; writes
never change promised. An operation interrupted by the kill (or failing)
is "in flight": promised becomes the union of before and after.

Renames are checked jointly too (HACKING.md "Renames are atomic under
crashes"): one in flight at the kill leaves the paths it touches (source
and target; for a directory every path under both names) as a whole as
they were before it or as they are after it, never a mix of the two
(each path within its own union is not enough: `a` gone and `b` still
holding its old bytes is neither). A Joint holds those states until the
next mount shows one (or the bucket check); `mount-joint`/`bucket-joint`
failures say which states were allowed and what was found. A rename that
fails without a crash is undone (a file: the state before), or, for a
directory, leaves each key under the old name, the new one or both.

Two operations aim at those renames (the kill timer, when it starts in
one of them, is moved to a random moment just after its rename starts):
rename_pending renames a file over one waiting for its upload (writeback:
closed and not sent yet, right after its close or kept from being sent
by a second descriptor open for writing), or a pending one over a file
in the bucket, or pending over pending (default mode: a file in the
bucket, or written and still open, over another); rename_dir_race runs
`mv d e` and os.replace(d/.tmpN, d/x) on two threads at about the same
time, whose inner rename must happen before or after the directory's, or
fail cleanly with ENOENT. `--ops rename_heavy` draws mostly those.
With --rename-faults P the proxy refuses (403, never retried), in that
share of the renames of a file in the bucket over another, the copy (the
rename must fail, and be undone) or the DELETE of the old key (it must be
done; the old key may stay in the bucket until the next mount deletes it).

Round R of a run with --seed S uses seed S+R; a failure prints the line
that replays its round alone.
"""
import argparse
import collections
import concurrent.futures
import contextlib
import errno
import hashlib
import itertools
import os
import random
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / 'harness'))
import servers   # noqa: E402
import s3proxy   # noqa: E402
import tmount    # noqa: E402
from tmount import TortureError  # noqa: E402

KiB = 1 << 10
MiB = 1 << 20
NAMES = ['a', 'b', 'c', 'd', 'e', 'f']
TEMPS = ['.tmp0', '.tmp1']
DIRS = ['d1', 'd2', 'd3']
MAX_DIRS = 2
MAX_FDS = 4
WRITE_CHUNK = 1 * MiB
BIG = 17 * MiB                 # over the 16 MiB single-PUT limit
HANG_SECONDS = 90.0            # one syscall taking longer is a hang
MAX_FAILURES_PER_ROUND = 6
DEFAULT_BINARY = HERE.parents[1] / 'build' / 'src' / 's3cachefs'


def digest(data):
    return hashlib.sha256(data).hexdigest()


def describe(data):
    """'ABSENT' or 'SIZE B sha256 PREFIX'."""
    if data is None:
        return 'absent'
    return f'{len(data)} B sha256 {digest(data)[:12]}'


def first_difference(found, expected):
    """The first offset where FOUND and EXPECTED differ, as text."""
    for at in range(0, min(len(found), len(expected)), 4096):
        if found[at:at + 4096] != expected[at:at + 4096]:
            for offset in range(at, at + 4096):
                if found[offset:offset + 1] != expected[offset:offset + 1]:
                    return f'first differing byte at offset {offset}'
    return (f'same first {min(len(found), len(expected))} bytes, '
            f'size {len(found)} instead of {len(expected)}')


def under(path, directory):
    return path.startswith(directory + '/')


def renamed(state, source, target, is_dir):
    """STATE ({path: set of contents, None for absent}) after
    rename(SOURCE, TARGET): a file's promises go to TARGET, a directory's
    (every path under it) to the same paths under TARGET; the old names
    are absent. Paths not in STATE keep what they had."""
    if is_dir:
        moves = [(p, target + p[len(source):]) for p in state
                 if under(p, source)]
    else:
        moves = [(source, target)]
    after = dict(state)
    for old, _ in moves:
        after[old] = {None}
    for old, new in moves:
        after[new] = set(state.get(old, {None}))
    return after


def outcome_label(renames, combination):
    """'before', 'after', or which of RENAMES are done in COMBINATION."""
    if len(renames) == 1:
        return 'after' if combination[0] else 'before'
    if not any(combination):
        return 'before both'
    if all(combination):
        return 'after both'
    return 'after ' + ' and '.join(
        name for (*_, name), done in zip(renames, combination) if done) + \
        ' only'


def describe_state(state):
    """{path: set of contents} as 'path: A or B, path2: absent'."""
    return '{' + ', '.join(
        f'{path}: ' + ' or '.join(sorted(describe(c) for c in state[path]))
        for path in sorted(state)) + '}'


class Joint:
    """Paths that renames in flight at a kill (or failed) touched: over
    all of them together the bucket holds the state of one of
    ALTERNATIVES [(label, {path: set of contents})], never a mix (each
    path's value in its own set is not enough)."""

    def __init__(self, what, alternatives):
        self.what = what
        self.alternatives = []
        for label, state in alternatives:
            state = {p: set(v) for p, v in state.items()}
            for index, (known, other) in enumerate(self.alternatives):
                if other == state:
                    self.alternatives[index] = (f'{known} = {label}', other)
                    break
            else:
                self.alternatives.append((label, state))
        self.paths = set().union(*(s for _, s in self.alternatives))

    def admits(self, found):
        """True when FOUND ({path: bytes or None}) is one of the states."""
        return any(all(found.get(p) in allowed for p, allowed in s.items())
                   for _, s in self.alternatives)

    def without(self, path):
        """The Joint over the other paths (None when that is no longer a
        joint condition: one path, or one state)."""
        projected = [(label, {p: v for p, v in s.items() if p != path})
                     for label, s in self.alternatives]
        joint = Joint(self.what, projected)
        if len(joint.paths) < 2 or len(joint.alternatives) < 2:
            return None
        return joint

    def explain(self, found, model):
        """What was found against what was allowed, as text: the paths
        whose state tells the alternatives apart, or that hold what none
        of them has (the others hold what every one allows)."""
        telling = sorted(
            p for p in self.paths
            if any(s[p] != self.alternatives[0][1][p]
                   for _, s in self.alternatives)
            or not all(found.get(p) in s[p] for _, s in self.alternatives))
        seen = ', '.join(f'{p}: {describe(found.get(p))} '
                         f'({model.explain(p, found.get(p))})'
                         for p in telling)
        allowed = '; or '.join(
            f'{label} {describe_state({p: s[p] for p in telling})}'
            for label, s in self.alternatives)
        return (f'{self.what}: found, as a whole, {{{seen}}}, which is '
                f'none of the states allowed: {allowed}')


# --ops: which operations a workload draws, with their weights
OPS = {
    'mixed': [('write_whole', 24), ('checkpoint', 9), ('open', 9),
              ('pwrite', 11), ('append', 6), ('ftruncate', 4),
              ('truncate', 3), ('fsync', 4), ('close', 12), ('rename', 9),
              ('rename_dir', 2), ('rename_pending', 2),
              ('rename_dir_race', 1), ('unlink', 5), ('mkdir', 3),
              ('rmdir', 2), ('pause', 4)],
    # renames over (and of) pending files, directory renames during a
    # rename inside: most crash points land in one
    'rename_heavy': [('rename_pending', 30), ('rename_dir_race', 16),
                     ('rename', 6), ('rename_dir', 4), ('checkpoint', 6),
                     ('write_whole', 8), ('open', 3), ('pwrite', 3),
                     ('close', 5), ('unlink', 3), ('mkdir', 3),
                     ('rmdir', 1), ('pause', 2)],
}


class Crashed(Exception):
    """The daemon was killed: the workload stops here."""


# ------------------------------------------------------------------ model

class Inode:
    """A file as the model sees it: its bytes and its name (None once
    unlinked or renamed over)."""
    count = 0

    def __init__(self, path, data=b''):
        Inode.count += 1
        self.number = Inode.count
        self.path = path
        self.data = bytearray(data)


class Handle:
    """One open descriptor of the workload."""

    def __init__(self, number, fd, inode, kind):
        self.number = number      # fdN in the log
        self.fd = fd
        self.inode = inode
        self.kind = kind          # 'rw', 'append', 'trunc', 'new'
        self.pos = 0

    @property
    def label(self):
        return f'fd{self.number}'


class Model:
    """Names, their current bytes, and what the bucket may end with."""

    def __init__(self):
        self.files = {}                  # path -> Inode
        self.dirs = set()
        self.promised = {}               # path -> set of bytes / None
        # what a mount after a crash showed, while nothing changed it since
        self.shown = {}
        self.gone = {}                   # path -> why it is absent
        # every content ever current or promised: digest -> [(path, how)]
        self.seen = collections.defaultdict(list)
        # renames in flight at a kill (or failed): states of several paths
        # together, checked by the next mount and by the bucket check
        self.joints = []
        # old keys a done rename left for the next mount: path -> bytes
        self.left = {}

    def promised_of(self, path):
        return self.promised.get(path, {None})

    def remember(self, path, data, how):
        if data is not None:
            entries = self.seen[digest(data)]
            if (path, how) not in entries:
                entries.append((path, how))

    def promise(self, path, data, in_flight, how):
        data = bytes(data)
        self.remember(path, data, f'promised by {how}')
        self.shown.pop(path, None)
        self.unjoin(path)
        if in_flight:
            self.promised[path] = self.promised_of(path) | {data}
        else:
            self.promised[path] = {data}

    def rename(self, renames, what, joint=True):
        """The promises of RENAMES [(source, target, is_dir, outcomes,
        name)], applied in this order, each one done or not as OUTCOMES
        says ({True}: it returned 0; {False}: it failed and is undone;
        {False, True}: in flight at the kill). Each path they touch (the
        source and the target, and for a directory every path under both
        names) may end with what any combination leaves; and unless JOINT
        is false, all of them together with what one combination leaves,
        never a mix (a Joint, kept until a mount shows a state). Returns
        the Joint or None (one combination: nothing to check jointly)."""
        touched = set()
        known = set(self.paths()) | set(self.promised)
        for source, target, is_dir, _, _ in renames:
            if is_dir:
                touched |= {p for p in known if under(p, source)
                            or under(p, target)}
            else:
                touched |= {source, target}
        before = {p: set(self.promised_of(p)) for p in touched}
        alternatives = []
        for combination in itertools.product(
                *[sorted(outcomes) for _, _, _, outcomes, _ in renames]):
            state = before
            for (source, target, is_dir, _, _), done in zip(renames,
                                                           combination):
                if done:
                    state = renamed(state, source, target, is_dir)
            alternatives.append((outcome_label(renames, combination), state))
        paths = set().union(*(state for _, state in alternatives))
        for _, state in alternatives:
            for path in paths:
                state.setdefault(path, set(self.promised_of(path)))
        for (source, target, is_dir, outcomes, _) in renames:
            if True in outcomes:
                self.note_gone(source, target, is_dir, what)
        for path in paths:
            self.unjoin(path)
            self.shown.pop(path, None)
            self.promised[path] = set().union(
                *(state[path] for _, state in alternatives))
        found = Joint(what, alternatives)
        if not joint or len(found.alternatives) < 2:
            return None
        self.joints.append(found)
        return found

    def rename_failed_dir(self, source, target, what):
        """A directory rename that failed (no crash) is not undone: each
        key under it is under the old name, the new one, or both (a key
        copied, not deleted), and stays so (the next mount does not go
        on with it)."""
        self.note_gone(source, target, True, what)
        for old in sorted(p for p in set(self.paths()) | set(self.promised)
                          if under(p, source)):
            new = target + old[len(source):]
            value, empty = set(self.promised_of(old)), set(
                self.promised_of(new))
            self.unjoin(old)
            self.unjoin(new)
            self.shown.pop(old, None)
            self.shown.pop(new, None)
            self.promised[old] = value | {None}
            self.promised[new] = value | empty
            self.joints.append(Joint(f'{what} ({old})', [
                ('under the old name', {old: value, new: empty}),
                ('under the new name', {old: {None}, new: value}),
                ('under both', {old: value, new: value})]))

    def note_gone(self, source, target, is_dir, how):
        """Why the names a rename emptied are absent (for explain)."""
        if not is_dir:
            self.gone[source] = f'renamed to {target} by {how}'
            if self.promised_of(source) == {None}:
                self.gone[target] = (f'replaced by {source} (never closed) '
                                     f'by {how}')
            return
        for path in list(self.promised):
            if under(path, source):
                self.gone[path] = f'moved with {source} by {how}'

    def leave(self, path, data, how):
        """A rename that is done left its old key PATH with DATA in the
        bucket (its DELETE failed): it may stay until a next mount, whose
        recovery deletes it."""
        self.remember(path, data, how)
        self.promised[path] = self.promised_of(path) | {data}
        self.left[path] = data

    def mounted_again(self):
        """A mount after a crash is serving: the old keys renames left are
        deleted by now."""
        for path, data in self.left.items():
            if self.promised_of(path) == {None, data}:
                self.promised[path] = {None}
        self.left = {}

    def unjoin(self, path):
        """PATH is changed by a later operation: the Joints go on over
        their other paths only (and an old key left there is not the
        model's to know of any more)."""
        self.left.pop(path, None)
        joints = []
        for joint in self.joints:
            if path in joint.paths:
                joint = joint.without(path)
            if joint is not None:
                joints.append(joint)
        self.joints = joints

    def drop(self, path, in_flight, how):
        """The promise of an unlink(path)."""
        self.gone[path] = f'unlinked by {how}'
        self.shown.pop(path, None)
        self.unjoin(path)
        self.promised[path] = (self.promised_of(path) | {None} if in_flight
                               else {None})

    def settle(self, path, data):
        """PATH holds DATA (None: absent) for sure (put there)."""
        self.unjoin(path)
        self.promised[path] = {data}
        self.current(path, data)

    def current(self, path, data):
        """A read showed DATA at PATH: what the next ops start from."""
        if data is None:
            self.files.pop(path, None)
        else:
            self.files[path] = Inode(path, data)

    def paths(self):
        return sorted(set(self.files) | {p for p, v in self.promised.items()
                                         if v != {None}})

    def explain(self, path, data):
        """Where bytes DATA came from, as the model knows it."""
        if data is None:
            return self.gone.get(path, 'absent')
        entries = self.seen.get(digest(data), [])
        if not entries:
            return 'bytes the model never saw'
        mine = [how for where, how in entries if where == path]
        if mine:
            return '; '.join(mine[-3:])
        return '; '.join(f'{how} at {where}' for where, how in entries[-3:])

    def expected(self, path, found, separator):
        """The candidates of PATH, described, and where FOUND first
        differs from the one of its size (or the largest)."""
        candidates = self.promised_of(path)
        text = separator.join(f'{describe(c)} ({self.explain(path, c)})'
                              for c in candidates)
        present = [c for c in candidates if c is not None]
        if found is not None and present:
            closest = min(present, key=lambda c: abs(len(c) - len(found)))
            text += (f'; against {describe(closest)}: '
                     f'{first_difference(found, closest)}')
        return text

    def classify(self, path, found):
        """Failure class of finding FOUND at PATH in the bucket."""
        candidates = self.promised_of(path)
        if found is None:
            return 'lost'
        if candidates == {None}:
            return 'resurrected'
        entries = [how for where, how in self.seen.get(digest(found), [])
                   if where == path]
        if any(how.startswith('promised') for how in entries):
            return 'older'
        if entries:
            return 'unclosed'
        return 'other'


# --------------------------------------------------------------- workload

class Watchdog:
    """Kills the daemon when one step of the workload takes longer than
    HANG_SECONDS (so a hang becomes a failure, not a stuck run)."""

    def __init__(self, on_hang):
        self.on_hang = on_hang
        self.lock = threading.Lock()
        self.armed = None           # (deadline, what)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def arm(self, what, seconds=HANG_SECONDS):
        with self.lock:
            self.armed = (time.monotonic() + seconds, what)

    def disarm(self):
        with self.lock:
            self.armed = None

    def stop(self):
        self.stopping.set()
        self.thread.join()

    def _run(self):
        while not self.stopping.wait(0.5):
            with self.lock:
                armed = self.armed
            if armed is not None and time.monotonic() > armed[0]:
                self.disarm()
                self.on_hang(armed[1])


class Round:
    """One seed: bucket, cache, mounts, workloads, crash points, checks."""

    def __init__(self, env, seed, mode, options):
        self.env = env
        self.seed = seed
        self.mode = mode
        self.options = options
        self.rng = random.Random(seed)
        self.model = Model()
        self.log = []
        self.failures = []
        self.handles = []
        self.handle_count = 0
        self.recent = []               # paths just closed (pending, likely)
        self.op_index = 0
        self.ops_done = 0
        self.reads = 0
        self.crash_points = 0
        self.renames_at_kill = 0       # crash points inside a rename
        self.op_counts = collections.Counter()
        self.checks = 0
        self.kill_op = None
        self.kill_timer = None
        self.kill_aimed = self.kill_deferred = False
        self.kill_lock = threading.Lock()
        self.killed = False
        self.kill_note = None
        self.daemon = None
        self.disk = None
        self.canary = None
        self.dir = env.workdir / f'round-{seed}-{mode}'
        self.mnt = self.dir / 'mnt'
        self.cache = self.dir / 'cache'
        self.bucket = f'tt-{seed % 10**9}-{secrets.token_hex(3)}'
        self.watchdog = None

    # ------------------------------------------------------- bookkeeping

    def note(self, text):
        self.log.append(text)

    def fail(self, kind, text):
        if len(self.failures) < MAX_FAILURES_PER_ROUND:
            self.failures.append((kind, text))
        self.note(f'  !! FAILURE {kind}: {text}')

    def replay_line(self):
        opts = self.options
        line = (f'/usr/bin/python3 tests/torture/torture.py --seed {self.seed}'
                f' --mode {self.mode} --server {self.env.server.name}'
                f' --rounds 1 --ops-per-round {opts.ops_per_round}'
                f' --latency {opts.latency:g}')
        if opts.power_loss:
            line += ' --power-loss'
        if not opts.big:
            line += ' --no-big'
        if opts.ops != 'mixed':
            line += f' --ops {opts.ops}'
        for option, default in (('rename_faults', 0.3),
                                ('second_phase', 0.55),
                                ('clean_ending', 0.15),
                                ('recovery_kill', 0.3)):
            value = getattr(opts, option)
            if value != default:
                line += f' --{option.replace("_", "-")} {value:g}'
        return line

    # ------------------------------------------------------------- mounts

    def new_daemon(self, tag):
        return tmount.Daemon(self.env.binary, self.env.server,
                             self.env.endpoint, self.bucket, self.mnt,
                             self.cache, self.dir / f'daemon-{tag}.log',
                             self.env.home, self.mode == 'writeback')

    def mount(self, tag):
        self.daemon = self.new_daemon(tag).start()
        with self.kill_lock:
            self.killed = False

    def kill_now(self, why):
        """SIGKILL the daemon (at most once per mount). Under kill_lock,
        so that a step that sees `killed` false afterwards returned
        before the kill."""
        with self.kill_lock:
            if self.killed or self.daemon is None or not self.daemon.alive():
                return
            if self.disk is not None:
                self.write_canary()
            self.killed = True
            self.kill_note = why
            os.kill(self.daemon.pid, signal.SIGKILL)

    def on_hang(self, what):
        self.fail('hang', f'{what} took more than {HANG_SECONDS:g}s; '
                          f'daemon log:\n{self.daemon.log_tail(2000)}')
        self.kill_now('hang')

    def drop_handles(self):
        for handle in self.handles:
            with contextlib.suppress(OSError):
                os.close(handle.fd)
        self.handles = []

    def check_daemon_log(self, daemon):
        report = daemon.sanitizer_report()
        if report:
            self.fail('sanitizer', report)

    # ----------------------------------------------------------- steps

    def step(self, what, call, done=None, in_flight=None, failed=None,
             may_fail=False):
        """Runs one system call of the workload. DONE(result) applies its
        effect to the model when it returned before any kill; IN_FLIGHT()
        when the kill may have come during it; FAILED() when it failed
        without a kill (IN_FLIGHT() if FAILED is None), which is a failure
        of the round and kills the daemon, unless MAY_FAIL (a fault was
        injected): then the workload goes on. Raises Crashed when the
        daemon is dead."""
        if self.killed:
            raise Crashed()
        self.watchdog.arm(what)
        error = None
        result = None
        try:
            result = call()
        except OSError as err:
            error = err
        finally:
            self.watchdog.disarm()
        with self.kill_lock:
            killed = self.killed
        if killed:
            if in_flight is not None:
                in_flight()
            self.note(f'    in flight at the kill: {what}'
                      + (f' ({error.strerror})' if error else ''))
            raise Crashed()
        if error is not None and may_fail:
            self.note(f'    failed (a fault was injected): {what} '
                      f'({error.strerror})')
            failed()
            return None
        if error is not None:
            self.fail('errno', f'op {self.op_index}: {what}: '
                               f'{error.strerror} (errno {error.errno})')
            if failed is not None:
                failed()
            elif in_flight is not None:
                in_flight()
            self.kill_now('an error')
            raise Crashed()
        if done is not None:
            done(result)
        return result

    def absolute(self, path):
        return str(self.mnt / path)

    # ------------------------------------------------- choosing things

    # sizes a file is written with: (chance of a multipart one, of a small
    # one, of one up to 256 KiB, end of the rest); 'rename': the files the
    # rename-heavy ops write, mostly small (the renames are what they are
    # for)
    SIZES = {'any': (0.015, 0.3, 0.65, 3 * MiB + 1),
             'rename': (0.005, 0.5, 0.85, 3 * MiB // 2)}

    def sizes(self, kind='any'):
        big, small, medium, end = self.SIZES[kind]
        rng = self.rng
        roll = rng.random()
        if roll < big and self.options.big:
            return BIG + rng.randrange(512 * KiB)
        if roll < small:
            return rng.randrange(0, 4 * KiB)
        if roll < medium:
            return rng.randrange(4 * KiB, 256 * KiB)
        return rng.randrange(256 * KiB, end)

    def write_length(self):
        roll = self.rng.random()
        if roll < 0.4:
            return self.rng.randrange(1, 4 * KiB)
        if roll < 0.85:
            return self.rng.randrange(4 * KiB, 256 * KiB)
        return self.rng.randrange(256 * KiB, 2 * MiB)

    def a_dir(self):
        """'' (the root) or one of the directories that exist."""
        dirs = sorted(self.model.dirs)
        if dirs and self.rng.random() < 0.45:
            return self.rng.choice(dirs)
        return ''

    def join(self, directory, name):
        return f'{directory}/{name}' if directory else name

    def a_name(self, temporary=False):
        return self.join(self.a_dir(),
                         self.rng.choice(TEMPS if temporary else NAMES))

    def a_file(self, prefer_recent=False):
        files = sorted(self.model.files)
        if not files:
            return None
        if prefer_recent:
            recent = [p for p in self.recent if p in self.model.files]
            if recent and self.rng.random() < 0.7:
                return self.rng.choice(recent)
        return self.rng.choice(files)

    def delay_ms(self):
        roll = self.rng.random()
        if roll < 0.5:
            return self.rng.uniform(0, 30)
        if roll < 0.8:
            return self.rng.uniform(30, 300)
        return self.rng.uniform(300, 1500)

    # ------------------------------------------------------------ helpers

    def snapshot(self, inode, how):
        if inode.path is not None:
            self.model.remember(inode.path, bytes(inode.data), how)

    def open_step(self, path, kind):
        """Opens PATH for writing (KIND: new, trunc, rw, append); returns
        the Handle."""
        flags = {'new': os.O_RDWR | os.O_CREAT | os.O_TRUNC,
                 'trunc': os.O_RDWR | os.O_TRUNC,
                 'rw': os.O_RDWR,
                 'append': os.O_WRONLY | os.O_APPEND}[kind]
        self.handle_count += 1
        number = self.handle_count

        def done(fd):
            inode = self.model.files.get(path)
            if inode is None:
                inode = Inode(path)
                self.model.files[path] = inode
            if kind in ('new', 'trunc'):
                inode.data = bytearray()
            handle = Handle(number, fd, inode, kind)
            self.handles.append(handle)
            return handle
        def in_flight():
            if kind in ('new', 'trunc'):
                self.model.remember(path, b'', f'truncated by op '
                                    f'{self.op_index}, in flight, unclosed')
        fd = self.step(f'open {path} {kind} as fd{number}',
                       lambda: os.open(self.absolute(path), flags, 0o644),
                       in_flight=in_flight)
        return done(fd)

    def write_step(self, handle, data, offset=None):
        """write (OFFSET None: at the handle's position, or the end for
        O_APPEND) or pwrite of DATA; short writes go on."""
        view = memoryview(data)
        while view:
            inode = handle.inode
            at = (len(inode.data) if handle.kind == 'append'
                  else handle.pos if offset is None else offset)
            piece = view[:WRITE_CHUNK]
            if offset is None:
                call = (lambda piece=piece: os.write(handle.fd, piece))
            else:
                call = (lambda piece=piece, at=at:
                        os.pwrite(handle.fd, piece, at))
            def in_flight(piece=piece, at=at):
                if inode.path is not None:
                    data = bytearray(inode.data)
                    if at > len(data):
                        data.extend(bytes(at - len(data)))
                    data[at:at + len(piece)] = piece
                    self.model.remember(inode.path, bytes(data),
                                        f'written by op {self.op_index}, '
                                        f'in flight, unclosed')
            count = self.step(f'write {handle.label} {len(piece)} B at {at}',
                              call, in_flight=in_flight)
            if at > len(inode.data):
                inode.data.extend(bytes(at - len(inode.data)))
            inode.data[at:at + count] = piece[:count]
            if offset is None:
                handle.pos = at + count
            else:
                offset += count
            view = view[count:]
        self.snapshot(handle.inode, f'written by op {self.op_index}')

    def close_step(self, handle):
        inode = handle.inode
        self.handles.remove(handle)

        def promise(in_flight):
            if inode.path is not None:
                self.model.promise(inode.path, inode.data, in_flight,
                                   f'close of {handle.label} at op '
                                   f'{self.op_index}')
        self.step(f'close {handle.label} ({inode.path or "unlinked"})',
                  lambda: os.close(handle.fd),
                  done=lambda _: promise(False),
                  in_flight=lambda: promise(True))
        if inode.path is not None:
            self.recent = ([inode.path] + [p for p in self.recent
                                           if p != inode.path])[:3]

    def fsync_step(self, handle):
        inode = handle.inode

        def promise(in_flight):
            if inode.path is not None:
                self.model.promise(inode.path, inode.data, in_flight,
                                   f'fsync of {handle.label} at op '
                                   f'{self.op_index}')
        self.step(f'fsync {handle.label} ({inode.path or "unlinked"})',
                  lambda: os.fsync(handle.fd),
                  done=lambda _: promise(False),
                  in_flight=lambda: promise(True))

    def rename_step(self, source, target, fault=None):
        """rename of a file or a directory. Done, the model moves every
        path under it; in flight at the kill, the paths it touches end,
        as a whole, as before it or as after it; failed, as before it (a
        file) or each key under one name or both (a directory).
        FAULT (a file in the bucket renamed over one): 'copy', the proxy
        refuses the server-side copy (403, never retried): the rename
        fails, and is undone; 'delete', it refuses the DELETE of the old
        key once the copy is there: the rename is done, the old key may
        stay in the bucket until the next mount deletes it."""
        model = self.model
        is_dir = source in model.dirs
        what = (f'{"directory " if is_dir else ""}rename {source} -> '
                f'{target} at op {self.op_index}')
        # the object in the bucket under the old name (an edited file's
        # last closed version)
        old = next(iter(model.promised_of(source)), None)

        def apply(outcome):
            if outcome == 'failed' and is_dir:
                model.rename_failed_dir(source, target, f'{what}, failed')
                return
            outcomes = {'done': {True}, 'in flight': {False, True},
                        'failed': {False}}[outcome]
            joint = model.rename([(source, target, is_dir, outcomes, what)],
                                 f'{what}, {outcome}')
            if joint is not None and outcome == 'in flight':
                self.renames_at_kill += 1
            if outcome == 'done':
                self.move_files(source, target, is_dir)
            if outcome == 'done' and fault == 'delete':
                model.leave(source, old, f'left by {what} (its DELETE '
                                         f'refused) for the next mount')
            if fault is not None:
                self.op_counts[f'rename with its {fault} refused: '
                               f'{outcome}'] += 1
        proxy = self.env.proxy
        if fault is not None:
            bucket_path = f'/{self.bucket}/'
            if fault == 'copy':
                proxy.inject('denied', 1, lambda method, path, query:
                             method == 'PUT' and path == bucket_path + target)
            else:
                proxy.inject('denied', 1, lambda method, path, query:
                             method == 'DELETE'
                             and path == bucket_path + source)
        try:
            self.step(f'rename {source} -> {target}',
                      lambda: os.rename(self.absolute(source),
                                        self.absolute(target)),
                      done=lambda _: apply('done'),
                      in_flight=lambda: apply('in flight'),
                      failed=lambda: apply('failed'),
                      may_fail=fault == 'copy')
        finally:
            if fault is not None:
                proxy.clear_faults()

    def move_files(self, source, target, is_dir):
        """The current files (and open descriptors) after a rename that
        returned 0."""
        model = self.model
        if is_dir:
            moves = [(p, target + p[len(source):]) for p in model.files
                     if under(p, source)]
        else:
            moves = [(source, target)]
        replaced = model.files.pop(target, None)
        if replaced is not None:
            replaced.path = None
        moved = [(old, new, model.files.pop(old)) for old, new in moves
                 if old in model.files]
        for old, new, inode in moved:
            inode.path = new
            model.files[new] = inode
        if is_dir:
            model.dirs.discard(source)
            model.dirs.add(target)
        self.recent = [dict(moves).get(p, p) for p in self.recent]

    # -------------------------------------------------------- operations

    def op_write_whole(self):
        """create/O_TRUNC, write the whole file, close (or keep it open)."""
        path = self.a_name()
        size = self.sizes()
        keep = len(self.handles) < MAX_FDS and self.rng.random() < 0.15
        sync = self.rng.random() < 0.1
        data = self.rng.randbytes(size)
        self.note(f'op {self.op_index}: write {path} {size} B'
                  + (', fsync' if sync else '')
                  + (', kept open' if keep else ''))
        handle = self.open_step(path, 'new')
        self.write_step(handle, data)
        if sync:
            self.fsync_step(handle)
        if not keep:
            self.close_step(handle)
        return path

    def op_checkpoint(self):
        """The checkpoint pattern: write a temporary, close, rename it over
        the file (a pending one, just closed, if there is one)."""
        target = self.a_file(prefer_recent=True)
        if target is None:
            return None
        directory = target.rpartition('/')[0]
        temporary = self.join(directory, self.rng.choice(TEMPS))
        if temporary == target:
            return None
        size = self.sizes()
        data = self.rng.randbytes(size)
        self.note(f'op {self.op_index}: checkpoint {temporary} {size} B, '
                  f'rename over {target}')
        handle = self.open_step(temporary, 'new')
        self.write_step(handle, data)
        self.close_step(handle)
        self.rename_step(temporary, target)
        return target

    def op_open(self):
        if len(self.handles) >= MAX_FDS:
            return None
        open_paths = [h.inode.path for h in self.handles
                      if h.inode.path is not None]
        if open_paths and self.rng.random() < 0.4:
            path = self.rng.choice(open_paths)   # a second descriptor
        else:
            path = self.a_file()
        if path is None:
            return None
        kind = self.rng.choice(['rw', 'rw', 'append', 'trunc'])
        self.note(f'op {self.op_index}: open {path} {kind} '
                  f'as fd{self.handle_count + 1}')
        self.open_step(path, kind)
        self.snapshot(self.model.files[path], f'opened by op {self.op_index}')
        return path

    def a_handle(self, writable_at=False):
        handles = [h for h in self.handles
                   if not writable_at or h.kind != 'append']
        return self.rng.choice(handles) if handles else None

    def op_pwrite(self):
        handle = self.a_handle(writable_at=True)
        if handle is None:
            return None
        size = len(handle.inode.data)
        if self.rng.random() < 0.7:
            offset = self.rng.randrange(0, size + 1)
        else:
            offset = size + self.rng.randrange(1, 1 * MiB)
        data = self.rng.randbytes(self.write_length())
        self.note(f'op {self.op_index}: pwrite {handle.label} '
                  f'({handle.inode.path or "unlinked"}) {len(data)} B at {offset}')
        self.write_step(handle, data, offset)
        return handle.inode.path

    def op_append(self):
        handle = self.a_handle()
        if handle is None:
            return None
        data = self.rng.randbytes(self.write_length())
        self.note(f'op {self.op_index}: write {handle.label} '
                  f'({handle.inode.path or "unlinked"}) {len(data)} B '
                  f'{"appended" if handle.kind == "append" else "at its position"}')
        self.write_step(handle, data)
        return handle.inode.path

    def op_ftruncate(self):
        handle = self.a_handle(writable_at=True)
        if handle is None:
            return None
        inode = handle.inode
        size = self.rng.randrange(0, len(inode.data) + 1 * MiB)
        self.note(f'op {self.op_index}: ftruncate {handle.label} '
                  f'({inode.path or "unlinked"}) to {size}')

        def done(_):
            del inode.data[size:]
            inode.data.extend(bytes(size - len(inode.data)))
            self.snapshot(inode, f'truncated by op {self.op_index}')
        self.step(f'ftruncate {handle.label} {size}',
                  lambda: os.ftruncate(handle.fd, size), done=done)
        return inode.path

    def op_truncate(self):
        """truncate(2) by path: no close() follows, so it is a promise
        too (the daemon uploads or journals it at once)."""
        path = self.a_file()
        if path is None:
            return None
        inode = self.model.files[path]
        size = self.rng.randrange(0, len(inode.data) + 1 * MiB)
        self.note(f'op {self.op_index}: truncate {path} to {size}')
        after = bytearray(inode.data[:size])
        after.extend(bytes(size - len(after)))

        def apply(in_flight):
            if not in_flight:
                inode.data = after
            self.model.promise(path, after, in_flight,
                               f'truncate at op {self.op_index}')
        self.step(f'truncate {path} {size}',
                  lambda: os.truncate(self.absolute(path), size),
                  done=lambda _: apply(False), in_flight=lambda: apply(True))
        return path

    def op_fsync(self):
        handle = self.a_handle()
        if handle is None:
            return None
        self.note(f'op {self.op_index}: fsync {handle.label} '
                  f'({handle.inode.path or "unlinked"})')
        self.fsync_step(handle)
        return handle.inode.path

    def op_close(self):
        handle = self.a_handle()
        if handle is None:
            return None
        self.note(f'op {self.op_index}: close {handle.label} '
                  f'({handle.inode.path or "unlinked"})')
        self.close_step(handle)
        return handle.inode.path

    def op_rename(self):
        source = self.a_file()
        if source is None:
            return None
        roll = self.rng.random()
        if roll < 0.6:
            target = self.a_file(prefer_recent=True)     # over a file
        else:
            target = self.a_name(temporary=roll > 0.85)   # a name
        if target is None or target == source:
            return None
        if target in self.model.dirs:
            return None
        self.note(f'op {self.op_index}: rename {source} -> {target}'
                  + (' (over a file)' if target in self.model.files else ''))
        self.rename_step(source, target)
        return target

    def op_rename_dir(self):
        existing = sorted(self.model.dirs)
        free = [d for d in DIRS if d not in self.model.dirs]
        if not existing or not free:
            return None
        source, target = self.rng.choice(existing), self.rng.choice(free)
        self.note(f'op {self.op_index}: rename directory {source} -> '
                  f'{target}')
        self.rename_step(source, target)
        return None

    # The two rename-heavy operations: their renames are where the kill
    # timer is aimed (aim_kill), and where the joint check looks.

    RENAME_SIDES = {
        # (source, target): weight. pending: closed, its upload not sent
        # yet (right after its close, or a second descriptor open for
        # writing keeps it); edited: in the bucket, then written again
        # and still open (its only saved version is the old object);
        # open: written, never closed (no promise at all)
        'writeback': {('uploaded', 'pending'): 3, ('pending', 'uploaded'): 3,
                      ('pending', 'pending'): 3, ('edited', 'pending'): 1,
                      ('uploaded', 'uploaded'): 1},
        'default': {('uploaded', 'uploaded'): 3, ('edited', 'uploaded'): 2,
                    ('uploaded', 'edited'): 1, ('open', 'uploaded'): 1,
                    ('uploaded', 'open'): 1, ('edited', 'edited'): 1},
    }
    FD_NEEDS = {'uploaded': 0, 'pending': 0, 'edited': 1, 'open': 1}

    def make_side(self, path, kind, keeper):
        """Writes PATH anew and leaves it KIND (see RENAME_SIDES); KEEPER:
        a second descriptor stays open for writing (pending: it is not
        sent while that is open)."""
        data = self.rng.randbytes(self.sizes('rename'))
        handle = self.open_step(path, 'new')
        if keeper:
            self.open_step(path, 'rw')
        self.write_step(handle, data)
        if kind in ('uploaded', 'edited') and self.mode == 'writeback':
            self.fsync_step(handle)      # uploads, in both modes
        if kind == 'open':
            return
        self.close_step(handle)
        if kind == 'edited':
            handle = self.open_step(path, 'rw')
            offset = self.rng.randrange(0, len(data) + 1)
            self.write_step(handle, self.rng.randbytes(
                self.rng.randrange(1, 64 * KiB)), offset)

    def op_rename_pending(self):
        """A rename over a file waiting for its upload, or of one, or
        both (see RENAME_SIDES), in the root or a directory; the kill
        timer, when it runs in this op, is aimed at the rename."""
        directory = self.a_dir()
        source, target = [self.join(directory, name)
                          for name in self.rng.sample(NAMES, 2)]
        table = self.RENAME_SIDES[self.mode]
        sides = self.rng.choices(list(table), list(table.values()))[0]
        free = MAX_FDS - len(self.handles)
        if sum(self.FD_NEEDS[kind] for kind in sides) > free:
            sides = tuple('uploaded' if self.FD_NEEDS[kind] else kind
                          for kind in sides)
        free -= sum(self.FD_NEEDS[kind] for kind in sides)
        keepers = {}
        for path, kind in zip((target, source), sides[::-1]):
            keepers[path] = (kind == 'pending' and free > 0
                             and self.rng.random() < 0.5)
            free -= keepers[path]
        self.defer_kill()
        self.note(f'op {self.op_index}: rename {sides[0]} {source} over '
                  f'{sides[1]} {target}'
                  + ''.join(f', {p} kept open for writing'
                            for p in keepers if keepers[p]))
        # the sides in the bucket first, the pending ones last (the target
        # before the source), so that they are still pending at the rename
        order = sorted(zip((source, target), sides),
                       key=lambda side: (side[1] != 'uploaded',
                                         side[0] == source))
        fault = None
        if (sides[0] in ('uploaded', 'edited') and sides[1] == 'uploaded'
                and self.env.proxy is not None
                and self.rng.random() < self.options.rename_faults):
            fault = self.rng.choice(['copy', 'delete'])
            self.note(f'    the proxy refuses the {fault} of that rename')
        for path, kind in order:
            self.make_side(path, kind, keepers.get(path, False))
        self.aim_kill(f'rename {source} -> {target}', 250)
        self.rename_step(source, target, fault)
        return target

    def op_rename_dir_race(self):
        """mv d e on one thread while another renames a file inside it,
        os.replace(d/.tmpN, d/x), started together (the kernel locks only
        the parent of a rename's names, so both run): the inner rename
        happens before the directory's or after it (under the new name,
        then moved with it), or fails cleanly with ENOENT."""
        free = [d for d in DIRS if d not in self.model.dirs]
        if not free or (not self.model.dirs and len(free) < 2):
            return None
        self.defer_kill()
        if not self.model.dirs:
            directory = self.rng.choice(free)
            self.note(f'op {self.op_index}: mkdir {directory} (for a '
                      f'directory rename during a rename)')
            self.step(f'mkdir {directory}',
                      lambda: os.mkdir(self.absolute(directory)),
                      done=lambda _: self.model.dirs.add(directory))
            free.remove(directory)
        directory = self.rng.choice(sorted(self.model.dirs))
        moved_to = self.rng.choice(free)
        temporary = self.join(directory, self.rng.choice(TEMPS))
        target = self.join(directory, self.rng.choice(NAMES))
        pending = self.mode == 'writeback' and self.rng.random() < 0.7
        self.note(f'op {self.op_index}: rename directory {directory} -> '
                  f'{moved_to} while {temporary} -> {target}'
                  + (' (pending)' if pending else ''))
        if target not in self.model.files or self.rng.random() < 0.3:
            self.make_side(target, 'uploaded', False)
        self.make_side(temporary, 'pending' if pending else 'uploaded',
                       False)
        self.aim_kill(f'rename {directory} -> {moved_to} and {temporary} '
                      f'-> {target}', 400)
        self.rename_race(directory, moved_to, temporary, target)
        return None

    def rename_race(self, directory, moved_to, temporary, target):
        """Runs rename(DIRECTORY, MOVED_TO) and replace(TEMPORARY, TARGET)
        on two threads started together, and applies to the model what
        each outcome allows: jointly, the inner rename before, after or
        never, the directory's done or not."""
        if self.killed:
            raise Crashed()
        calls = [(f'rename {temporary} -> {target}',
                  lambda: os.replace(self.absolute(temporary),
                                     self.absolute(target))),
                 (f'rename {directory} -> {moved_to}',
                  lambda: os.rename(self.absolute(directory),
                                    self.absolute(moved_to)))]
        barrier = threading.Barrier(len(calls))
        results = [None] * len(calls)
        # about the same time: one of them a little later, at times after
        # the other returned
        late = self.rng.randrange(len(calls))
        lags = [0.0] * len(calls)
        lags[late] = self.rng.choice([0, 0, 5, 30, 150, 400]) / 1000
        self.note(f'    {calls[late][0]} {lags[late] * 1000:.0f} ms later')

        def run(index, call):
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=10)
            time.sleep(lags[index])
            error = None
            try:
                call()
            except OSError as err:
                error = err
            with self.kill_lock:
                killed = self.killed
            results[index] = ('in flight' if killed else
                              'failed' if error else 'done', error)
        threads = [threading.Thread(target=run, args=(index, call),
                                    daemon=True)
                   for index, (_, call) in enumerate(calls)]
        self.watchdog.arm(' while '.join(what for what, _ in calls))
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            self.watchdog.disarm()
        outcomes, unexpected = [], False
        for (what, _), (result, error) in zip(calls, results):
            said = f' ({error.strerror})' if error else ''
            if result == 'in flight':
                self.note(f'    in flight at the kill: {what}{said}')
                outcomes.append({False, True})
            elif result == 'done':
                self.note(f'    done: {what}')
                outcomes.append({True})
            elif what.startswith(f'rename {temporary}') and \
                    error.errno == errno.ENOENT:
                self.note(f'    failed cleanly: {what}{said}')
                self.op_counts['rename_dir_race, inner rename ENOENT'] += 1
                outcomes.append({False})
            else:
                self.fail('errno', f'op {self.op_index}: {what}: '
                                   f'{error.strerror} (errno {error.errno})')
                outcomes.append({False, True})
                unexpected = True
        inner, outer = outcomes
        what = (f'rename {directory} -> {moved_to} and {temporary} -> '
                f'{target} at once at op {self.op_index}')
        # a failed directory rename may leave a mix: then only each path's
        # own states are checked
        joint = self.model.rename(
            [(temporary, target, False, inner, f'{temporary} -> {target}'),
             (directory, moved_to, True, outer,
              f'{directory} -> {moved_to}')],
            what, joint=not unexpected)
        killed = any(result == 'in flight' for result, _ in results)
        if joint is not None and killed:
            self.renames_at_kill += 1
        if killed:
            raise Crashed()
        if inner == {True}:
            self.move_files(temporary, target, False)
        if outer == {True}:
            self.move_files(directory, moved_to, True)
        if unexpected:
            self.kill_now('an error')
            raise Crashed()

    def op_unlink(self):
        path = self.a_file(prefer_recent=self.rng.random() < 0.5)
        if path is None:
            return None
        self.note(f'op {self.op_index}: unlink {path}')

        def apply(in_flight):
            self.model.drop(path, in_flight, f'op {self.op_index}')
            if not in_flight:
                self.model.files.pop(path).path = None
        self.step(f'unlink {path}', lambda: os.unlink(self.absolute(path)),
                  done=lambda _: apply(False), in_flight=lambda: apply(True))
        return None

    def op_mkdir(self):
        free = [d for d in DIRS if d not in self.model.dirs]
        if len(self.model.dirs) >= MAX_DIRS or not free:
            return None
        name = self.rng.choice(free)
        self.note(f'op {self.op_index}: mkdir {name}')
        self.step(f'mkdir {name}', lambda: os.mkdir(self.absolute(name)),
                  done=lambda _: self.model.dirs.add(name))
        return None

    def op_rmdir(self):
        empty = [d for d in sorted(self.model.dirs)
                 if not any(p.startswith(d + '/') for p in self.model.files)]
        if not empty:
            return None
        name = self.rng.choice(empty)
        self.note(f'op {self.op_index}: rmdir {name}')
        self.step(f'rmdir {name}', lambda: os.rmdir(self.absolute(name)),
                  done=lambda _: self.model.dirs.discard(name))
        return None

    def op_pause(self):
        seconds = self.rng.uniform(0.05, 0.4)
        self.note(f'op {self.op_index}: pause {seconds * 1000:.0f} ms')
        if self.killed:
            raise Crashed()
        time.sleep(seconds)
        return None

    def one_op(self):
        ops = OPS[self.options.ops]
        names = [name for name, _ in ops]
        weights = [weight for _, weight in ops]
        for _ in range(20):
            name = self.rng.choices(names, weights)[0]
            mark = len(self.log)
            touched = getattr(self, f'op_{name}')()
            if len(self.log) > mark:     # it ran
                self.op_counts[name] += 1
                return touched
        return None

    # ------------------------------------------------------------- reads

    def read_check(self, path):
        """Reads PATH through the mount, whole or a random range, and
        compares with the model's current bytes."""
        inode = self.model.files.get(path)
        if inode is None:
            return
        expected = bytes(inode.data)
        ranged = expected and self.rng.random() < 0.35
        if ranged:
            offset = self.rng.randrange(0, len(expected))
            length = self.rng.randrange(1, 2 * MiB)
            expected = expected[offset:offset + length]
        if self.killed:
            raise Crashed()

        def read():
            fd = os.open(self.absolute(path), os.O_RDONLY)
            try:
                if ranged:
                    return os.pread(fd, length, offset)
                parts = []
                while True:
                    part = os.read(fd, 4 * MiB)
                    if not part:
                        return b''.join(parts)
                    parts.append(part)
            finally:
                os.close(fd)
        what = (f'read {path}' + (f' [{offset}:+{length}]' if ranged else ''))
        self.watchdog.arm(what)
        error = None
        try:
            found = read()
        except OSError as err:
            error = err
        finally:
            self.watchdog.disarm()
        with self.kill_lock:
            if self.killed:
                raise Crashed()
        self.reads += 1
        if error is not None:
            self.fail('errno', f'after op {self.op_index}: {what}: '
                               f'{error.strerror} (errno {error.errno})')
            return
        if found != expected:
            self.fail('read', f'after op {self.op_index}: {what}: found '
                              f'{describe(found)} ({self.model.explain(path, found) if not ranged else "a range"}), '
                              f'expected {describe(expected)}; '
                              f'{first_difference(found, expected)}')

    # --------------------------------------------------------- a workload

    def workload(self, ops, kill_op, kill_ms):
        """Runs OPS operations; the kill timer starts when op KILL_OP
        begins (None: no kill). Returns once the daemon is dead or, with
        no kill, when the operations are done."""
        self.kill_op, self.kill_timer = kill_op, None
        self.kill_aimed = self.kill_deferred = False
        try:
            for _ in range(ops):
                if self.killed:
                    break
                self.op_index += 1
                if self.op_index == kill_op:
                    self.start_kill_timer(kill_ms, f'op {kill_op}')
                touched = self.one_op()
                if self.kill_deferred:      # (the op stopped before it)
                    self.start_kill_timer(kill_ms, f'end of op {kill_op}')
                self.ops_done += 1
                other = self.a_file()
                for path in [touched] + ([other] if other != touched else []):
                    if path is not None and self.rng.random() < 0.6:
                        self.read_check(path)
            if self.kill_timer is not None:
                self.kill_timer.join()
        except Crashed:
            pass
        finally:
            if self.kill_timer is not None:
                self.kill_timer.cancel()
            self.kill_op = self.kill_timer = None

    def defer_kill(self):
        """Called by a rename-heavy op as it starts: in the op the kill
        timer started at, most of the time, the timer is stopped, to be
        started again by aim_kill() at the rename the op prepares for
        (else the time the preparation takes decides where it lands)."""
        if (self.kill_timer is None or self.op_index != self.kill_op
                or self.kill_aimed):
            return
        self.kill_aimed = True
        if self.rng.random() < 0.2:
            return
        self.kill_timer.cancel()
        self.kill_timer.join()
        if self.killed:
            raise Crashed()
        self.kill_timer = None
        self.kill_deferred = True

    def aim_kill(self, what, window_ms):
        """The kill timer that defer_kill() stopped starts again, to go
        off a random time (up to WINDOW_MS, or up to 15 ms) after WHAT
        begins."""
        if not self.kill_deferred:
            return
        delay = self.rng.uniform(0, 15 if self.rng.random() < 0.35
                                 else window_ms)
        self.start_kill_timer(delay, what)

    def start_kill_timer(self, delay_ms, what):
        self.kill_deferred = False
        self.note(f'-- kill timer: {what} + {delay_ms:.1f} ms')
        self.kill_timer = threading.Timer(delay_ms / 1000, self.kill_now,
                                          (f'{what} + {delay_ms:.1f} ms',))
        self.kill_timer.start()

    # ------------------------------------------------------------- checks

    def walk_mount(self, when):
        """{path: bytes} of every file under the mount, the set of
        directories (read with fresh descriptors), and the paths that
        could not be read (each a failure)."""
        files, dirs, unread = {}, set(), set()

        def refused(err):
            self.fail('errno', f'listing the mount {when}: {err}')
        for root, subdirs, names in os.walk(self.mnt, onerror=refused):
            relative = os.path.relpath(root, self.mnt)
            prefix = '' if relative == '.' else relative + '/'
            dirs.update(prefix + d for d in subdirs)
            for name in names:
                try:
                    with open(os.path.join(root, name), 'rb') as file:
                        files[prefix + name] = file.read()
                except OSError as err:
                    unread.add(prefix + name)
                    self.fail('errno', f'reading back {prefix + name} '
                                       f'{when} (it is listed): {err}')
        return files, dirs, unread

    def check_mount(self, when):
        """Every file through the mount is an acceptable state (and then
        the only one); nothing absent in the model shows."""
        self.watchdog.arm(f'reading back every file {when}')
        try:
            files, dirs, unread = self.walk_mount(when)
        finally:
            self.watchdog.disarm()
        if self.killed:
            return False
        self.checks += 1
        self.model.mounted_again()
        self.check_joints(files, unread, 'mount-joint', when)
        for path in sorted(set(self.model.paths()) | set(files)):
            if path in unread:
                continue
            found = files.get(path)
            candidates = self.model.promised_of(path)
            self.reads += found is not None
            if found not in candidates:
                self.fail(f'mount-{self.model.classify(path, found)}',
                          f'{when}: {path} reads as {describe(found)} '
                          f'({self.model.explain(path, found)}); '
                          f'acceptable: '
                          + self.model.expected(path, found, ', '))
                self.model.promised[path] = candidates | {found}
                self.model.current(path, found)
            else:
                self.model.current(path, found)
                self.model.shown[path] = found
                self.model.remember(path, found, f'promised: shown by the '
                                    f'mount {when}')
        self.model.dirs = {d for d in dirs if '/' not in d}
        return True

    def check_joints(self, found, unread, kind, when):
        """Each Joint of the model against FOUND ({path: bytes}, absent
        paths missing; UNREAD: paths that could not be read, already
        failures): the paths it covers hold one of its states together.
        What a mount (or the bucket) showed then settles them: the Joints
        go (each path's own checks and `shown` go on)."""
        for joint in self.model.joints:
            if joint.paths & unread:
                continue
            if not joint.admits(found):
                self.fail(kind, f'{when}: {joint.explain(found, self.model)}')
        self.model.joints = []

    def check_bucket(self):
        """The bucket against the model: each key its last promised bytes
        (or a state an op in flight allowed); nothing absent in the model
        there. Directory markers are not checked."""
        s3 = self.env.s3
        found = {}
        for page in s3.get_paginator('list_objects_v2').paginate(
                Bucket=self.bucket):
            for item in page.get('Contents', []):
                if not item['Key'].endswith('/'):
                    found[item['Key']] = None
        for key in found:
            found[key] = s3.get_object(Bucket=self.bucket,
                                       Key=key)['Body'].read()
        self.checks += 1
        model = self.model
        self.check_joints(found, set(), 'bucket-joint', 'in the bucket')
        for path, data in model.left.items():
            if found.get(path, b'') == data:
                self.op_counts['old key left by a rename, in the bucket '
                               'at the end'] += 1
        for path in sorted(set(model.paths()) | set(found)):
            data = found.get(path)
            candidates = model.promised_of(path)
            shown = model.shown.get(path, data)
            if data not in candidates:
                self.fail(f'bucket-{model.classify(path, data)}',
                          f'bucket key {path}: {describe(data)} '
                          f'({model.explain(path, data)}); expected '
                          + model.expected(path, data, ' or '))
            elif shown != data:
                self.fail('stale-after-crash',
                          f'bucket key {path}: {describe(data)} '
                          f'({model.explain(path, data)}), but the mount '
                          f'after the crash showed {describe(shown)} '
                          f'({model.explain(path, shown)}) and nothing '
                          f'changed it since')

    # ----------------------------------------------------- crash points

    def crash(self):
        """After the kill: the dead mount cleared, the cache as a power
        cut leaves it when --power-loss."""
        daemon = self.daemon
        daemon.process.wait()
        self.drop_handles()
        daemon.kill()
        self.check_daemon_log(daemon)
        self.crash_points += 1
        if self.disk is not None:
            self.power_cut()

    def remount(self):
        """The next mount on the same cache; sometimes killed shortly
        after it starts (during its recovery), then mounted again."""
        tag = f'{self.crash_points}'
        if self.rng.random() < self.options.recovery_kill:
            delay = self.rng.uniform(0, 800)
            self.note(f'-- remount, killed {delay:.0f} ms after it starts')
            self.daemon = self.new_daemon(f'{tag}-recovery')
            with self.kill_lock:
                self.killed = False
            self.daemon.spawn()
            time.sleep(delay / 1000)
            self.kill_now(f'recovery + {delay:.0f} ms')
            code = self.daemon.process.wait()
            if code != -signal.SIGKILL:
                self.fail('mount', f'the remounted daemon exited with '
                                   f'{code} by itself:\n'
                                   f'{self.daemon.log_tail(2000)}')
            self.crash()
        self.note('-- remount')
        self.mount(tag)

    def write_canary(self):
        """Power loss: bytes written (not fsynced) to the cache's disk
        just before the cut; the copy must not hold them, or something
        flushed the page cache and the point proved less."""
        self.canary = self.disk.mountpoint / 'canary'
        with open(self.canary, 'wb') as file:
            file.write(b'c' * 65536)

    def power_cut(self):
        disk = self.disk
        copy = disk.image.with_suffix('.cut')
        disk.copy(copy)
        disk.detach()
        os.replace(copy, disk.image)
        disk.attach()
        canary = disk.mountpoint / 'canary'
        if canary.exists():
            if b'c' in canary.read_bytes():
                self.env.leaks += 1
                self.note('-- power cut: the canary reached the disk '
                          '(something flushed the page cache)')
            canary.unlink()
        state = tmount.new_boot(self.cache)
        self.note(f'-- power cut: disk copied, state was {state!r}')

    # --------------------------------------------------------------- run

    def seed_bucket(self):
        """A few objects put with boto3 before the first mount."""
        for _ in range(self.rng.randrange(0, 4)):
            path = self.join(self.rng.choice(['', '', 'd1']),
                             self.rng.choice(NAMES))
            data = self.rng.randbytes(self.rng.choice(
                [0, 1000, 200 * KiB, 1 * MiB + 77]))
            self.env.s3.put_object(Bucket=self.bucket, Key=path, Body=data)
            self.model.settle(path, data)
            self.model.remember(path, data,
                                'promised: put by boto3 before the mount')
            if '/' in path:
                # with its marker, as s3fs or a mkdir would leave it (a
                # directory that is only a prefix vanishes with its last
                # key, which is not what this test is about)
                directory = path.split('/')[0]
                self.env.s3.put_object(Bucket=self.bucket,
                                       Key=directory + '/', Body=b'')
                self.model.dirs.add(directory)
            self.note(f'bucket: {path} {describe(data)}')

    def run(self):
        options = self.options
        self.dir.mkdir(parents=True)
        with self.env.timed('setup'):
            self.env.server.create_bucket(self.bucket)
        self.watchdog = Watchdog(self.on_hang)
        self.note(f'round seed {self.seed}, mode {self.mode}, bucket '
                  f'{self.bucket}')
        try:
            with contextlib.ExitStack() as stack:
                if options.power_loss:
                    self.disk = tmount.LoopDisk(self.env.disk_dir / 'disk.img',
                                                self.dir / 'disk').create()
                    stack.callback(self.disk.detach)
                    self.cache = self.disk.mountpoint / 'cache'
                with self.env.timed('setup'):
                    self.seed_bucket()
                with self.env.timed('mount'):
                    self.mount('0')
                stack.callback(self.cleanup)
                if self.disk is not None:
                    self.disk.sync()     # the cache existed long before
                self.run_phases()
        except TortureError as err:
            self.fail('mount', str(err))
        finally:
            self.watchdog.stop()
            self.drop_handles()

    def run_phases(self):
        options = self.options
        phases = 1
        while phases < 3 and self.rng.random() < options.second_phase:
            phases += 1
        for phase in range(phases):
            last = phase == phases - 1
            clean = last and self.rng.random() < options.clean_ending
            ops = options.ops_per_round
            with self.env.timed('workload'):
                if clean:
                    self.workload(ops, None, 0)
                else:
                    self.workload(ops, self.rng.randrange(1, ops + 1) +
                                  self.op_index, self.delay_ms())
            if clean:
                self.note('-- closing every descriptor, clean unmount')
                try:
                    for handle in list(self.handles):
                        self.close_step(handle)
                except Crashed:
                    pass
            elif not self.killed:
                self.kill_now('end of the workload')
            if not self.killed and not self.daemon.alive():
                self.fail('daemon-died', f'the daemon exited with '
                          f'{self.daemon.process.returncode} by itself:\n'
                          f'{self.daemon.log_tail(2000)}')
                self.killed = True
            if self.killed:
                with self.env.timed('crash and remount'):
                    self.crash()
                    self.remount()
                with self.env.timed('reading back'):
                    checked = self.check_mount(f'after the remount at op '
                                               f'{self.op_index}')
                if not checked:
                    raise TortureError('reading back hung; the daemon was killed')
        self.note('-- s3cachefs --unmount')
        self.unmount_and_check()

    def unmount_and_check(self):
        daemon, self.daemon = self.daemon, None
        self.drop_handles()
        with self.env.timed('unmount'):
            code, seconds, said = daemon.unmount()
        self.check_daemon_log(daemon)
        if code != 0:
            self.fail('unmount', f's3cachefs --unmount: exit {code} after '
                                 f'{seconds:.1f}s ({said}); daemon log:\n'
                                 f'{daemon.log_tail(2000)}')
        with self.env.timed('bucket check'):
            self.check_bucket()

    def cleanup(self):
        if self.daemon is not None:
            self.daemon.kill()
            self.daemon = None
        tmount.lazy_unmount(self.mnt)


# ----------------------------------------------------------- the whole run

class Env:
    """What rounds share: the server, the proxy, a boto3 client."""

    def __init__(self, server, binary, workdir, latency):
        self.server = server
        self.binary = str(binary)
        self.workdir = Path(workdir)
        self.home = self.workdir / 'home'
        self.home.mkdir(parents=True, exist_ok=True)
        self.s3 = server.client()
        self.proxy = None
        self.endpoint = server.endpoint
        if latency > 0:
            self.proxy = s3proxy.S3Proxy(server.endpoint, latency=latency)
            self.proxy.start()
            self.endpoint = self.proxy.endpoint
        self.disk_dir = None
        self.leaks = 0
        self.seconds = collections.Counter()   # where the time goes

    @contextlib.contextmanager
    def timed(self, what):
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[what] += time.monotonic() - started

    def close(self):
        if self.proxy is not None:
            self.proxy.stop()


class Summary:
    def __init__(self):
        self.rounds = 0
        self.crash_points = 0
        self.renames_at_kill = 0
        self.op_counts = collections.Counter()
        self.checks = 0
        self.ops = 0
        self.reads = 0
        self.failed_rounds = []          # (seed, mode, failures, replay)
        self.classes = collections.Counter()
        self.started = time.monotonic()
        self.leaks = 0

    @property
    def failures(self):
        return sum(len(f) for _, _, f, _ in self.failed_rounds)

    def add(self, done):
        self.rounds += 1
        self.crash_points += done.crash_points
        self.renames_at_kill += done.renames_at_kill
        self.op_counts.update(done.op_counts)
        self.checks += done.checks
        self.ops += done.ops_done
        self.reads += done.reads
        if done.failures:
            self.failed_rounds.append((done.seed, done.mode, done.failures,
                                       done.replay_line()))
            for kind in {kind for kind, _ in done.failures}:
                self.classes[kind] += 1

    def line(self):
        seconds = time.monotonic() - self.started
        rate = self.crash_points / seconds * 60 if seconds else 0
        classes = ', '.join(f'{kind} in {count} rounds'
                            for kind, count in sorted(self.classes.items()))
        text = (f'torture: {self.rounds} rounds, {self.crash_points} crash '
                f'points ({self.renames_at_kill} inside a rename), '
                f'{self.ops} operations, {self.reads} reads checked, '
                f'{self.failures} failures in {len(self.failed_rounds)} '
                f'rounds ({classes or "none"}); {seconds:.0f} s, '
                f'{rate:.1f} crash points/min')
        if self.leaks:
            text += f'; page cache flushed before {self.leaks} power cuts'
        return text

    def seeds(self):
        return ' '.join(f'{seed}/{mode}'
                        for seed, mode, _, _ in self.failed_rounds)


def report(done, out):
    print(f'\n=== FAILED round seed {done.seed} mode {done.mode} server '
          f'{done.env.server.name}', file=out)
    for kind, text in done.failures:
        print(f'  {kind}: {text}', file=out)
    print(f'  replay: {done.replay_line()}', file=out)
    print('  op log:', file=out)
    for line in done.log:
        print(f'    {line}', file=out)
    out.flush()


def run(server, options, out=sys.stdout):
    """Runs the rounds against SERVER (started); returns the Summary."""
    summary = Summary()
    workdir = Path(options.workdir or tempfile.mkdtemp(
        prefix='s3cachefs-torture.'))
    env = Env(server, options.binary, workdir, options.latency)
    modes = (['default', 'writeback'] if options.mode == 'both'
             else [options.mode])
    deadline = summary.started + options.budget if options.budget else None
    cleaner = concurrent.futures.ThreadPoolExecutor(1)
    try:
        with contextlib.ExitStack() as stack:
            stack.callback(cleaner.shutdown)
            if options.power_loss:
                env.disk_dir = stack.enter_context(tmount.tmpfs(
                    workdir / 'disks', '1g'))
                stack.enter_context(tmount.writeback_off())
                tmount.check_power_cut(env.disk_dir)
            for number in range(options.rounds):
                if deadline and time.monotonic() > deadline:
                    break
                if (options.crash_points
                        and summary.crash_points >= options.crash_points):
                    break
                seed = options.seed + number
                mode = modes[number % len(modes)]
                done = Round(env, seed, mode, options)
                with env.timed('round'):
                    done.run()
                summary.add(done)
                if done.failures:
                    report(done, out)
                elif options.verbose:
                    print(f'round {seed} {mode}: ok, {done.crash_points} '
                          f'crash points', file=out, flush=True)
                if not options.keep:
                    # while the next round runs (Swift takes ~9 ms a key)
                    cleaner.submit(server.delete_bucket_recursive,
                                   done.bucket)
                    if not tmount.is_mounted(done.mnt):
                        shutil.rmtree(done.dir, ignore_errors=True)
    finally:
        summary.leaks = env.leaks
        env.close()
        if not options.keep and not any(
                line.split()[1].startswith(str(workdir) + '/')
                for line in open('/proc/mounts')):
            shutil.rmtree(workdir, ignore_errors=True)
        elif options.keep:
            print(f'work directory kept: {workdir}', file=out)
    print(summary.line(), file=out)
    print('operations: ' + ', '.join(f'{name} {count}' for name, count
                                     in summary.op_counts.most_common()),
          file=out)
    print('time: ' + ', '.join(f'{what} {seconds:.0f} s' for what, seconds
                               in env.seconds.most_common()), file=out)
    if summary.failed_rounds:
        print(f'failing seeds: {summary.seeds()}', file=out)
    out.flush()
    return summary


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--server', choices=sorted(servers.SERVER_KINDS),
                        default='s3rver')
    parser.add_argument('--mode', choices=['default', 'writeback', 'both'],
                        default='both')
    parser.add_argument('--seed', type=int,
                        default=int.from_bytes(os.urandom(3), 'big'))
    parser.add_argument('--rounds', type=int, default=10)
    parser.add_argument('--ops-per-round', type=int, default=12)
    parser.add_argument('--ops', choices=sorted(OPS), default='mixed',
                        help='the operations drawn and their weights '
                        '(rename_heavy: mostly renames over pending files '
                        'and directory renames during a rename)')
    parser.add_argument('--rename-faults', type=float, default=0.3,
                        help='chance that the proxy refuses the copy or '
                        'the delete of a rename of a file in the bucket '
                        'over one (in the rename-heavy ops; 0: never)')
    parser.add_argument('--crash-points', type=int, default=0,
                        help='stop once this many crash points are done')
    parser.add_argument('--binary', default=os.environ.get(
        'S3CACHEFS_BIN', str(DEFAULT_BINARY)))
    parser.add_argument('--budget', type=float, default=0,
                        help='seconds; no round starts after that')
    parser.add_argument('--latency', type=float, default=0.04,
                        help='seconds the proxy adds per request (0: none)')
    parser.add_argument('--power-loss', action='store_true',
                        help='power cuts (loop device) instead of kill -9')
    parser.add_argument('--no-big', dest='big', action='store_false',
                        help='no multipart (17 MiB) files')
    parser.add_argument('--recovery-kill', type=float, default=0.3,
                        help='chance that a remount is killed as it starts')
    parser.add_argument('--second-phase', type=float, default=0.55,
                        help='chance of another workload after a recovery '
                        '(at most 3 in a round)')
    parser.add_argument('--clean-ending', type=float, default=0.15,
                        help='chance that a round ends with a clean unmount')
    parser.add_argument('--keep', action='store_true',
                        help='leave the work directory and buckets')
    parser.add_argument('--workdir', help='work directory (default: a new '
                        'one under $TMPDIR)')
    parser.add_argument('--verbose', '-v', action='store_true')
    return parser.parse_args(argv)


def main(argv=None):
    options = parse(argv)
    if os.geteuid() != 0:
        print('torture.py mounts FUSE file systems: run it as root',
              file=sys.stderr)
        return 2
    if not Path(options.binary).exists():
        print(f'no s3cachefs at {options.binary} (--binary)', file=sys.stderr)
        return 2
    server_dir = Path(tempfile.mkdtemp(prefix='s3cachefs-torture-server.'))
    server = servers.SERVER_KINDS[options.server](server_dir)
    print(f'torture.py: server {options.server}, mode {options.mode}, seed '
          f'{options.seed}, {options.rounds} rounds of '
          f'{options.ops_per_round} ops, latency {options.latency:g}s'
          + (', power loss' if options.power_loss else ''), flush=True)
    server.start()
    try:
        summary = run(server, options)
    finally:
        server.stop()
        if not options.keep:
            shutil.rmtree(server_dir, ignore_errors=True)
    return 1 if summary.failed_rounds else 0


if __name__ == '__main__':
    sys.exit(main())
