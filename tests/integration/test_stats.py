"""s3cachefs stats: the table, --json, --watch and --prices against real
mounts on both servers, and the command's errors.

What the command reports is checked against what was done: a cold read
of a known object is that many bytes from the bucket, the same read after
a remount that many from the cache; the requests by kind equal what a
proxy between the mount and the server counted; costs are computed again
here with Decimal, exactly, for the presets and for a price file; the
savings use the -o block_size the mount was given (the daemon's
cache_block_size_bytes counter). --watch runs under a pipe (not a terminal) and ends with
status 0 on SIGINT and on SIGTERM.

With -o shared_cache, a second node that read everything from the tier
shows it in the table and the JSON object, and --tier-prices prices the
tier's requests and bytes (computed again here) and what it saved at the
bucket's prices.

A bucket may be called "stats": `s3cachefs stats MNT -o ...` still mounts
it when MNT is not an s3cachefs mount.
"""
import decimal
import json
import math
import os
import re
import signal
import subprocess
import threading
import time
from decimal import Decimal

from conftest import BINARY, daemon_env, is_fuse_mount, read_stats, wait_for
# (the tier's server and bucket, shared with the tier's own tests)
from test_shared_cache import (shared_options, tier_bucket,  # noqa: F401
                               tier_profile, tier_server, tier_settled)

MiB = 1 << 20
BLOCK = 256 << 10           # -o block_size of the mounts here
STATS_TIMEOUT = 30
COUNTERS = {                # price item -> the counter it prices
    'get': 'requests_get', 'head': 'requests_head', 'list': 'requests_list',
    'put': 'requests_put', 'delete': 'requests_delete', 'copy': 'requests_copy',
    'multipart': 'requests_multipart', 'egress': 'bytes_from_bucket',
    'ingress': 'bytes_to_bucket',
}
PRICE_FILE = """\
# a price file with every item, odd prices and units
name Test provider, eu
currency EUR
get 1.5 per 1000
head 0.25 per 100
list 7 per 1
put 0.000001 per 1
delete 2 per 1000000
copy free
multipart 0.5 per 10
egress 0.333 per GiB   # binary
ingress 0.01 per TB
"""


TIER_COUNTERS = {           # price item -> the tier's counter it prices
    item: 'tier_' + counter if counter.startswith('requests_') else counter
    for item, counter in COUNTERS.items()}
TIER_COUNTERS.update(egress='bytes_from_tier', ingress='bytes_to_tier')
TIER_PRICE_FILE = """\
name A bucket near the cluster
get 0.0001 per 1000
head 0.0001 per 1000
list 0.001 per 1000
put 0.001 per 1000
egress 0.01 per GB
ingress 0.002 per GiB
"""


def run_stats(*args, timeout=STATS_TIMEOUT):
    return subprocess.run([BINARY, 'stats', *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def stats_json(mountpoint, *args):
    done = run_stats(mountpoint, '--json', *args)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ''
    # money and ratios as Decimal: the amounts are checked exactly
    return json.loads(done.stdout, parse_float=Decimal)


def half_up(value):
    return value.quantize(Decimal('1e-9'), rounding=decimal.ROUND_HALF_UP)


def check_cost(report, block_size):
    """The cost object of REPORT, computed again from its own counters."""
    cost = report['cost']
    with decimal.localcontext() as context:
        context.prec = 60
        total = Decimal(0)
        for item, counter in COUNTERS.items():
            line = cost['items'][item]
            assert line['quantity'] == report[counter], item
            assert line['unit'] == ('bytes' if item in ('egress', 'ingress')
                                    else 'requests')
            price = Decimal(line['price'])
            expected = half_up(line['quantity'] * price / line['per'])
            assert line['amount'] == expected, (item, line)
            total += expected
        assert cost['total'] == total
        saved = cost['saved']
        assert saved['block_size'] == block_size
        assert saved['block_size_from'] == 'counters'
        from_cache = report['bytes_from_cache']
        assert saved['egress']['quantity'] == from_cache
        assert saved['egress']['amount'] == half_up(
            from_cache * Decimal(cost['items']['egress']['price']) /
            cost['items']['egress']['per'])
        gets = math.ceil(from_cache / block_size)
        assert saved['get']['quantity'] == gets
        assert saved['get']['amount'] == half_up(
            gets * Decimal(cost['items']['get']['price']) /
            cost['items']['get']['per'])
        assert saved['total'] == saved['egress']['amount'] + saved['get']['amount']
    assert cost['estimate'] is True
    return cost


def check_tier_cost(report, block_size, key='tier_cost', prefix=''):
    """The shared cache's cost object KEY of REPORT, computed again from
    its counters (PREFIX + name): the tier's prices for its traffic, the
    bucket's ("cost") for what it saved."""
    cost, bucket = report[key], report['cost']
    with decimal.localcontext() as context:
        context.prec = 60
        total = Decimal(0)
        for item, counter in TIER_COUNTERS.items():
            line = cost['items'][item]
            assert line['quantity'] == report[prefix + counter], item
            expected = half_up(line['quantity'] * Decimal(line['price']) /
                               line['per'])
            assert line['amount'] == expected, (item, line)
            total += expected
        assert cost['total'] == total
        saved = cost['saved']
        assert saved['currency'] == bucket['currency']
        assert saved['prices'] == bucket['prices']
        from_tier = report[prefix + 'bytes_from_tier']
        egress, get = bucket['items']['egress'], bucket['items']['get']
        assert saved['egress']['quantity'] == from_tier
        assert saved['egress']['amount'] == half_up(
            from_tier * Decimal(egress['price']) / egress['per'])
        gets = math.ceil(from_tier / block_size)
        assert saved['get']['quantity'] == gets
        assert saved['get']['amount'] == half_up(
            gets * Decimal(get['price']) / get['per'])
        assert saved['total'] == saved['egress']['amount'] + saved['get']['amount']
        assert saved['net'] == saved['total'] - cost['total']
    assert cost['estimate'] is True
    return cost


def table_money(table, section):
    """The 'total' amount of SECTION ('cost since mount' or 'saved by the
    cache') in the table, as a Decimal."""
    text = table.split(section, 1)[1]
    match = re.search(r'^  total +([\d,]+\.\d{6}) ([A-Z]{3})$', text, re.M)
    assert match, table
    return Decimal(match.group(1).replace(',', '')), match.group(2)



def test_counters_match_what_was_done(s3, bucket, mount, proxy, tmp_path):
    body = os.urandom(3 * MiB + 4321)
    s3.put_object(Bucket=bucket, Key='data.bin', Body=body)
    mnt = mount(bucket, options=['block_size=256K'], endpoint=proxy.endpoint)
    assert (mnt.path / 'data.bin').read_bytes() == body
    written = os.urandom(MiB + 99)
    with open(mnt.path / 'out.bin', 'wb') as out:
        out.write(written)
    assert s3.get_object(Bucket=bucket, Key='out.bin')['Body'].read() == written

    report = stats_json(mnt.path)
    assert report['mountpoint'] == str(mnt.path)
    assert report['source'] == bucket
    assert report['pid'] == mnt.process.pid
    assert report['bytes_from_bucket'] == len(body)
    assert report['bytes_from_cache'] == 0
    assert report['bytes_written'] == len(written)
    assert report['bytes_to_bucket'] == len(written)
    assert report['uploads_completed'] == 1
    assert report['uploads_pending'] == 0
    # requests by kind: what the server was sent, counted at the wire
    assert report['requests_get'] == proxy.counts['GET'] >= 1
    assert report['requests_head'] == proxy.counts['HEAD']
    assert report['requests_list'] == proxy.counts['LIST'] >= 1
    assert report['requests_put'] == proxy.counts['PUT'] == 1
    assert report['requests_delete'] == proxy.counts['DELETE'] == 0
    assert report['requests_multipart'] == proxy.counts['POST'] == 0
    assert report['retries'] == report['failures'] == 0
    # every counter of the attribute, under its own name, as a number
    counters = read_stats(mnt.path)
    assert {k: v for k, v in report.items() if k in counters} == counters
    assert set(report) == set(counters) | {'mountpoint', 'source', 'pid'}
    assert report['lifetime_bytes_from_bucket'] == len(body)

    done = run_stats(mnt.path)
    assert done.returncode == 0, done.stderr
    table = done.stdout
    assert table.startswith(f's3cachefs {mnt.path}: {bucket}, daemon pid '
                            f'{mnt.process.pid}\n')
    for group in ('reads', 'cache', 'requests', 'writes', 'errors'):
        assert f'\n{group}\n' in table
    # a new cache: since it was created is since mount, in the second column
    assert re.search(r'^  from the bucket +3\.0 MiB +3\.0 MiB$', table, re.M), table
    assert re.search(r'^  written by programs +1\.0 MiB +1\.0 MiB$', table, re.M), table
    gets = f'{report["requests_get"]:,}'
    assert re.search(rf'^  GET +{gets} +{gets}$', table, re.M), table
    assert re.search(r'^  uploads completed +1 +1$', table, re.M), table
    assert re.search(r'^  uploads pending +0$', table, re.M), table
    assert 'cost since mount' not in table


def test_cost_at_presets_and_from_a_file(s3, bucket, mount, tmp_path):
    body = os.urandom(2 * MiB + 777)
    s3.put_object(Bucket=bucket, Key='data.bin', Body=body)
    cache = tmp_path / 'cache'
    mnt = mount(bucket, options=['block_size=256K'], cache=cache)
    assert (mnt.path / 'data.bin').read_bytes() == body
    cold = stats_json(mnt.path, '--prices=aws')
    assert cold['bytes_from_bucket'] == len(body)
    cost = check_cost(cold, BLOCK)
    assert cost['currency'] == 'USD'
    assert cost['prices'] == 'aws'
    assert cost['prices_read_on'] == '2026-12-02'
    assert cost['items']['egress']['price'] == Decimal('0.09')
    assert cost['items']['egress']['per'] == 10**9
    mnt.unmount()

    # the same bytes again, from the cache of a new mount
    again = mount(bucket, options=['block_size=256K'], cache=cache, name='again')
    assert (again.path / 'data.bin').read_bytes() == body
    for preset in ('aws', 'r2', 'b2', 'gcs'):
        report = stats_json(again.path, f'--prices={preset}')
        assert report['bytes_from_cache'] == len(body)
        assert report['bytes_from_bucket'] == 0
        cost = check_cost(report, BLOCK)
        assert cost['prices'] == preset
        assert cost['saved']['get']['quantity'] == math.ceil(len(body) / BLOCK) == 9

    prices = tmp_path / 'test.prices'
    prices.write_text(PRICE_FILE)
    report = stats_json(again.path, f'--prices={prices}')
    cost = check_cost(report, BLOCK)
    assert cost['currency'] == 'EUR'
    assert cost['prices'] == 'test.prices'
    assert cost['prices_title'] == 'Test provider, eu'
    assert 'prices_read_on' not in cost
    assert cost['items']['copy']['price'] == 0
    assert cost['items']['egress']['per'] == 1 << 30
    assert cost['items']['ingress']['per'] == 10**12
    assert cost['saved']['total'] > 0

    # the table: the same totals, rounded half up to 6 places
    done = run_stats(again.path, f'--prices={prices}')
    assert done.returncode == 0, done.stderr
    spent, currency = table_money(done.stdout, '\ncost since mount\n')
    saved, _ = table_money(done.stdout, '\nsaved by the cache since mount\n')
    assert currency == 'EUR'
    # (counters may have moved between the two runs: compare with a run
    # whose counters are its own)
    report = stats_json(again.path, f'--prices={prices}')
    six = Decimal('1e-6')
    assert saved == report['cost']['saved']['total'].quantize(
        six, rounding=decimal.ROUND_HALF_UP)
    assert abs(spent - report['cost']['total']) < Decimal('0.01')
    assert 'prices test.prices: Test provider, eu\n' in done.stdout
    assert ('one GET per block of\n  256 KiB (block_size, given in the '
            "daemon's counters)") in done.stdout


def test_shared_cache_counted_and_priced(s3, bucket, mount, home, tier_server,
                                        tier_bucket, tmp_path):
    """Node A reads from the bucket and fills the tier; node B reads it all
    from the tier. B's table and JSON say so, and --tier-prices prices
    the tier's traffic and what it saved."""
    body = os.urandom(3 * MiB + 321)
    blocks = math.ceil(len(body) / BLOCK)
    s3.put_object(Bucket=bucket, Key='data.bin', Body=body)
    tier_profile(home, tier_server)
    options = [*shared_options(tier_server, tier_bucket), 'block_size=256K']
    prices = tmp_path / 'tier.prices'
    prices.write_text(TIER_PRICE_FILE)

    a = mount(bucket, options=options, name='a')
    assert (a.path / 'data.bin').read_bytes() == body
    tier_settled(a)
    report = stats_json(a.path, '--prices=aws', f'--tier-prices={prices}')
    assert report['bytes_to_tier'] == len(body)
    assert report['tier_written_blocks'] == blocks
    cost = check_tier_cost(report, BLOCK)
    assert cost['items']['ingress']['quantity'] == len(body)
    assert cost['items']['ingress']['amount'] > 0
    a.unmount()

    b = mount(bucket, options=options, name='b')
    assert (b.path / 'data.bin').read_bytes() == body
    tier_settled(b)
    report = stats_json(b.path, '--prices=aws', f'--tier-prices={prices}')
    assert report['bytes_from_tier'] == len(body)
    assert report['tier_hit_blocks'] == blocks
    assert report['bytes_from_bucket'] == 0
    check_cost(report, BLOCK)
    cost = check_tier_cost(report, BLOCK)
    assert cost['prices'] == 'tier.prices'
    assert cost['prices_title'] == 'A bucket near the cluster'
    assert cost['saved']['get']['quantity'] == blocks
    assert cost['saved']['net'] > 0
    # since the cache was created: B's cache is new, so the same
    check_tier_cost(report, BLOCK, 'lifetime_tier_cost', 'lifetime_')
    assert report['lifetime_tier_cost']['saved']['egress']['quantity'] == len(body)

    done = run_stats(b.path, '--prices=aws', f'--tier-prices={prices}')
    assert done.returncode == 0, done.stderr
    table = done.stdout
    for part in ('\n  from the shared cache ', '\nshared cache\n  blocks read from it ',
                 '\nshared cache requests\n  GET ',
                 '\nshared cache cost since mount\n  prices tier.prices: A bucket '
                 'near the cluster\n',
                 '\nsaved by the shared cache since mount\n',
                 '\n  net, less the shared cache\'s cost '):
        assert part in table, (part, table)
    saved, currency = table_money(table, '\nsaved by the shared cache since mount\n')
    assert currency == 'USD'
    assert saved == report['tier_cost']['saved']['total'].quantize(
        Decimal('1e-6'), rounding=decimal.ROUND_HALF_UP)
    assert 'not priced' not in table

    # the bucket priced and the tier not: said, once
    done = run_stats(b.path, '--prices=aws')
    assert done.returncode == 0, done.stderr
    assert done.stdout.count('shared cache: not priced') == 1
    assert 'shared cache cost' not in done.stdout
    assert 'tier_cost' not in stats_json(b.path, '--prices=aws')

    # --tier-prices on a mount without a tier
    plain = mount(bucket, name='plain')
    done = run_stats(plain.path, '--prices=aws', f'--tier-prices={prices}')
    assert (done.returncode, done.stdout) == (1, ''), done
    assert done.stderr == (f's3cachefs: {plain.path}: the mount has no shared '
                           'cache (-o shared_cache): nothing for --tier-prices '
                           'to price\n')


class LineReader:
    """The lines a process writes to its stdout, as they come."""

    def __init__(self, process):
        self.lines = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, args=(process,),
                                       daemon=True)
        self.thread.start()

    def _read(self, process):
        for line in process.stdout:
            with self.lock:
                self.lines.append(line.rstrip('\n'))

    def count(self):
        with self.lock:
            return len(self.lines)


def test_watch(s3, bucket, mount):
    s3.put_object(Bucket=bucket, Key='later.bin', Body=os.urandom(2 * MiB))
    mnt = mount(bucket)
    watcher = subprocess.Popen([BINARY, 'stats', str(mnt.path), '--watch=0.2',
                                '--prices=aws'], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        reader = LineReader(watcher)
        wait_for(lambda: reader.count() >= 4, 10, 'two lines of --watch')
        assert (mnt.path / 'later.bin').stat().st_size == 2 * MiB
        (mnt.path / 'later.bin').read_bytes()   # traffic while it watches
        lines_then = reader.count()
        wait_for(lambda: reader.count() >= lines_then + 3, 10, 'more lines')
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=5) == 0
        reader.thread.join(timeout=5)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert watcher.stderr.read() == ''
    header, columns, *rows = reader.lines
    assert 'MiB/s' in header and 'requests/s' in header and 'cost' in header
    assert columns.split() == ['cache', 'bucket', 'GET', 'HEAD', 'LIST', 'PUT',
                               'DELETE', 'COPY', 'MPU', 'MiB/s', 'pending',
                               'USD/h']
    assert len(rows) >= 5
    for row in rows:
        fields = row.split()
        assert len(fields) == 12, row
        assert all(re.fullmatch(r'\d+(\.\d+)?', field) for field in fields), row
    # the 2 MiB read shows as bytes from the bucket and GETs, in some line
    assert any(float(row.split()[1]) > 0 and float(row.split()[2]) > 0
               for row in rows), rows

    # one JSON object a line; SIGTERM ends it as well
    watcher = subprocess.Popen([BINARY, 'stats', str(mnt.path), '--watch=0.2',
                                '--json'], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        reader = LineReader(watcher)
        wait_for(lambda: reader.count() >= 3, 10, 'three lines of --watch --json')
        watcher.send_signal(signal.SIGTERM)
        assert watcher.wait(timeout=5) == 0
        reader.thread.join(timeout=5)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    objects = [json.loads(line) for line in reader.lines]
    assert len(objects) >= 3
    times = [o['time'] for o in objects]
    assert times == sorted(times) and times[-1] - times[0] >= 0.3
    assert all(o['mountpoint'] == str(mnt.path) and o['bytes_from_bucket'] >= 2 * MiB
               for o in objects)


def test_daemon_not_answering(bucket, mount):
    mnt = mount(bucket)
    mnt.process.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        done = run_stats(mnt.path)
        took = time.monotonic() - started
    finally:
        mnt.process.send_signal(signal.SIGCONT)
    assert done.returncode == 1
    assert done.stderr == (f's3cachefs: {mnt.path}: its daemon does not answer '
                           '(waited 5 seconds): it is stopped or stuck; its log '
                           'may say why\n')
    assert 4.5 < took < 15
    assert run_stats(mnt.path).returncode == 0   # answering again


def test_a_bucket_named_stats_still_mounts(server, tmp_path, home):
    """`s3cachefs stats MNT -o ...` is the mount of the bucket "stats" when
    MNT is not an s3cachefs mount; once it is one, `s3cachefs stats MNT`
    reports on it."""
    mnt = tmp_path / 'mnt'
    mnt.mkdir()
    env = daemon_env(server, home)
    options = f'endpoint={server.endpoint},cache={tmp_path / "cache"}'
    done = subprocess.run([BINARY, 'stats', str(mnt), '-o', options], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"bucket 'stats' does not exist at {server.endpoint}" in done.stderr
    assert (f"(this was the mount of a bucket named 'stats': {mnt} is not an "
            "s3cachefs mount for 's3cachefs stats' to report on)") in done.stderr

    server.create_bucket('stats')
    try:
        done = subprocess.run([BINARY, 'stats', str(mnt), '-o', options],
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert is_fuse_mount(mnt)
        (mnt / 'hello').write_bytes(b'hello')
        # now MNT is an s3cachefs mount: the same words report on it
        done = run_stats(mnt)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f's3cachefs {mnt}: stats, daemon pid ')
        assert stats_json(mnt)['bytes_written'] == 5
    finally:
        if is_fuse_mount(mnt):
            subprocess.run([BINARY, '--unmount', str(mnt)], timeout=60)
        if is_fuse_mount(mnt):
            subprocess.run(['fusermount3', '-uz', str(mnt)])
        server.release_bucket('stats')
    assert not is_fuse_mount(mnt)


def test_errors(tmp_path):
    plain = tmp_path / 'plain'
    plain.mkdir()

    def fails(status, message, *args):
        done = run_stats(*args)
        assert (done.returncode, done.stderr) == (status, message), done
        assert done.stdout == ''

    fails(1, f's3cachefs: {plain} is not a mount point\n', plain, '--json')
    fails(1, f's3cachefs: {tmp_path}/none: No such file or directory\n',
          tmp_path / 'none', '--json')
    fails(1, 's3cachefs: /proc is not an s3cachefs mount (it is a proc mount '
          'of proc)\n', '/proc', '--json')
    tmpfs = tmp_path / 'tmpfs'
    tmpfs.mkdir()
    subprocess.run(['mount', '-t', 'tmpfs', 'stats-test', str(tmpfs)], check=True)
    try:
        fails(1, f's3cachefs: {tmpfs} is not an s3cachefs mount (it is a tmpfs '
              'mount of stats-test)\n', tmpfs, '--prices=aws')
    finally:
        subprocess.run(['umount', str(tmpfs)], check=True)

    bad = tmp_path / 'bad.prices'
    bad.write_text('# prices\nget 0.0004 per 1000\nput 0.005 per thousand\n')
    fails(1, f"s3cachefs: price file {bad}:3: 'put': expected a number of "
          "requests from 1 to 1000000000000 after 'per' (digits only, such as "
          "1000), got 'thousand'\n", plain, f'--prices={bad}')
    bad.write_text('get 0.0004 per 1000\nget 0.0005 per 1000\n')
    fails(1, f"s3cachefs: price file {bad}:2: 'get' is given twice (first on "
          "line 1)\n", plain, '--prices', bad)
    fails(1, f's3cachefs: price file {tmp_path}/missing: No such file or '
          'directory\n', plain, f'--prices={tmp_path}/missing')

    usage = ('usage: s3cachefs stats MOUNTPOINT [--json] [--watch[=SECONDS]] '
             '[--prices=NAME|FILE] [--tier-prices=NAME|FILE] (see --help)\n')
    fails(2, 's3cachefs stats: --prices=azure: not a preset (aws, r2, b2, gcs) '
          'nor a file\n', plain, '--prices=azure')
    # (with one of its own options: alone, '--frob' would be a mount's)
    fails(2, 's3cachefs stats: --tier-prices=azure: not a preset (aws, r2, b2, '
          'gcs) nor a file\n', plain, '--prices=aws', '--tier-prices=azure')
    fails(2, 's3cachefs stats: --tier-prices needs --prices too: what the '
          "shared cache saved is priced at the bucket's prices\n" + usage,
          plain, '--tier-prices=aws')
    fails(2, 's3cachefs stats: --tier-prices needs a preset (aws, r2, b2, gcs) '
          'or a file\n' + usage, plain, '--prices=aws', '--tier-prices=')
    fails(1, f"s3cachefs: price file {bad}:2: 'get' is given twice (first on "
          "line 1)\n", plain, '--prices=aws', '--tier-prices', bad)
    fails(2, "s3cachefs stats: unknown option '--frob'\n" + usage, plain,
          '--json', '--frob')
    fails(2, 's3cachefs stats: no mount point\n' + usage, '--json')
    fails(2, 's3cachefs stats: no mount point\n' + usage)
    fails(2, 's3cachefs stats: --watch=0: expected seconds from 0.05 to 86400, '
          'such as 1 or 0.5\n' + usage, plain, '--watch=0')
    fails(2, f"s3cachefs stats: one mount point only ('{plain}', then '/proc')\n"
          + usage, plain, '/proc', '--json')
    done = run_stats('--help')
    assert done.returncode == 0 and done.stderr == ''
    assert done.stdout.startswith('usage: s3cachefs stats MOUNTPOINT')


def test_counters_since_the_cache_was_created(s3, bucket, mount, tmp_path):
    """lifetime_* sum the mounts of one cache directory; a new cache
    directory starts from zero; the table shows them in a second column."""
    first, second = os.urandom(2 * MiB + 1), os.urandom(MiB + 2)
    s3.put_object(Bucket=bucket, Key='first.bin', Body=first)
    s3.put_object(Bucket=bucket, Key='second.bin', Body=second)
    cache = tmp_path / 'cache'
    started = int(time.time())
    mnt = mount(bucket, cache=cache)
    assert (mnt.path / 'first.bin').read_bytes() == first
    (mnt.path / 'out.bin').write_bytes(b'o' * 1000)
    report = stats_json(mnt.path)
    assert report['lifetime_bytes_from_bucket'] == report['bytes_from_bucket'] == len(first)
    since = report['lifetime_since']
    assert started - 1 <= since <= time.time()
    mnt.unmount()

    again = mount(bucket, cache=cache, name='again')
    assert (again.path / 'second.bin').read_bytes() == second
    assert (again.path / 'first.bin').read_bytes() == first   # from the cache
    report = stats_json(again.path)
    assert report['bytes_from_bucket'] == len(second)
    assert report['lifetime_bytes_from_bucket'] == len(first) + len(second)
    assert report['lifetime_bytes_from_cache'] == report['bytes_from_cache'] == len(first)
    assert report['lifetime_bytes_written'] == 1000
    assert report['lifetime_uploads_completed'] == 1
    assert report['lifetime_requests_put'] == 1 and report['requests_put'] == 0
    assert report['lifetime_since'] == since
    assert 'lifetime_cache_used_bytes' not in report
    done = run_stats(again.path, '--prices=aws')
    assert done.returncode == 0, done.stderr
    day = time.strftime('%Y-%m-%d', time.gmtime(since))
    assert re.search(rf'^ +this mount +since {day}$', done.stdout, re.M), done.stdout
    assert re.search(r'^  from the bucket +1\.0 MiB +3\.0 MiB$', done.stdout, re.M), done.stdout
    assert f'\ncost since {day}\n' in done.stdout
    assert 'lifetime_' not in done.stdout
    again.unmount()

    other = mount(bucket, cache=tmp_path / 'other-cache', name='other')
    assert (other.path / 'second.bin').read_bytes() == second
    report = stats_json(other.path)
    assert report['lifetime_bytes_from_bucket'] == len(second)
