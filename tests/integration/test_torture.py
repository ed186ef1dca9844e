"""The crash torture (tests/torture/torture.py) as part of the suite: random
workloads, kill -9 at random moments, the next mount's recovery, and every
read and every key of the bucket checked against a model of what close(),
fsync() and rename promised. Any violation fails the test with the seed
and the line that replays it.

S3CACHEFS_TORTURE_POINTS (default 100) is the number of crash points on
s3rver, S3CACHEFS_TORTURE_POINTS_SWIFT (default a fifth of it) on Swift,
shared by the two modes and the two mixes of operations (PROFILES: the
mixed workload, and --ops rename_heavy, mostly renames over pending
files and directory renames during a rename inside, each checked
jointly); S3CACHEFS_TORTURE_BUDGET (seconds, default 240) bounds each
server's run, shared the same way; S3CACHEFS_TORTURE_SEED fixes the
first seed (random otherwise, and printed). The power-loss test
(S3CACHEFS_POWERLOSS_POINTS, default 6, s3rver only) cuts the power of
a cache on a loop device instead.
"""
import os
import random
import sys
from pathlib import Path

import pytest

from conftest import BINARY

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'torture'))
import torture  # noqa: E402

MODES = ('default', 'writeback')
# torture.py --ops: the share of the crash points and of the budget each
# mix of operations gets, and its arguments (the rename-heavy ops are
# long: short workloads, more of them per mount, keep the crash points
# coming)
PROFILES = {'mixed': (0.6, []),
            'rename_heavy': (0.4, ['--ops-per-round', '6',
                                   '--second-phase', '0.8'])}


def points(server_name):
    total = int(os.environ.get('S3CACHEFS_TORTURE_POINTS', '100'))
    if server_name == 'swift':
        total = int(os.environ.get('S3CACHEFS_TORTURE_POINTS_SWIFT',
                                   str(max(1, total // 5))))
    return total


def first_seed():
    seed = os.environ.get('S3CACHEFS_TORTURE_SEED')
    return int(seed) if seed else random.randrange(1, 10 ** 7)


def run_torture(server, tmp_path, mode, crash_points, budget, extra=()):
    seed = first_seed()
    options = torture.parse([
        '--mode', mode, '--seed', str(seed), '--rounds', '100000',
        '--crash-points', str(crash_points), '--budget', str(budget),
        '--binary', BINARY, '--workdir', str(tmp_path / 'torture'),
        *extra])
    print(f'torture seed {seed}, mode {mode}, {crash_points} crash points '
          f'wanted, budget {budget:g}s')
    summary = torture.run(server, options)
    assert summary.crash_points > 0, summary.line()
    assert not summary.failed_rounds, (
        f'{summary.line()}\nfailing seeds (seed/mode): {summary.seeds()}\n'
        + '\n'.join(replay for _, _, _, replay in summary.failed_rounds[:5]))


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('ops', list(PROFILES))
def test_crash_torture(server, tmp_path, ops, mode):
    """Half of the server's crash points in each mode, split between the
    mixes of operations as PROFILES says."""
    budget = float(os.environ.get('S3CACHEFS_TORTURE_BUDGET', '240'))
    share, extra = PROFILES[ops]
    share /= len(MODES)
    wanted = max(1, round(points(server.name) * share))
    run_torture(server, tmp_path, mode, wanted, budget * share,
                ['--ops', ops, *extra])


def test_power_loss(server, tmp_path):
    """Writeback mode, the cache on ext4 on a loop device over tmpfs with
    background writeback off: at the kill, the disk is copied (what was
    never fsynced is lost) and the copy, with a new boot id in its
    state file, is the next mount's cache."""
    if server.name != 's3rver':
        pytest.skip('the power-loss test runs on s3rver only')
    if not Path('/dev/loop-control').exists():
        pytest.skip('no loop devices here')
    wanted = int(os.environ.get('S3CACHEFS_POWERLOSS_POINTS', '6'))
    run_torture(server, tmp_path, 'writeback', wanted, 90,
                ['--power-loss', '--no-big'])
