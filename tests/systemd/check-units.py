#!/usr/bin/python3
"""Checks the systemd units of contrib/systemd without a running systemd.

1. `systemd-analyze verify` of each template unit as an instance, in a
   copy whose /usr/bin/s3cachefs is the built binary (verify wants the
   ExecStart binary to exist) and with MANPATH finding man/s3cachefs.1
   (verify runs man for Documentation=). Any line it prints about the unit
   is a failure: unknown keys and bad values are warnings with status 0.
2. The unit's Exec*= command lines, expanded the way systemd expands them
   (specifiers, Environment= then EnvironmentFile=, ${VAR}, $VAR, $$) with
   contrib/systemd/s3cachefs.conf.example as the instance's file, are run
   in systemd's environment and must be accepted by the program: the
   mount stops at the bucket check of an endpoint that refuses
   connections (every option, the credentials file and the mount point
   were accepted); a credentials file of mode 0644 and keys among the
   options are refused with the documented errors; `--unmount` of a
   directory that is no mount gives its documented error; the shell
   snippets do nothing on a directory that is no mount.
2b. The fstab line of man s3cachefs (FSTAB), through systemd's own
   systemd-fstab-generator: the mount unit it makes has the line's What,
   Where, Type and Options, is a remote mount (_netdev: required by and
   before remote-fs.target), has the x-systemd.* settings, and passes
   systemd-analyze verify.
3. As root with /dev/fuse and s3rver (tests/node_modules): the whole life
   of the unit against s3rver on loopback, the commands run in systemd's
   order: start (Type=notify: the daemon's READY=1 on a notification
   socket, as systemd receives it, sent by the main process and only once
   the mount serves), a file written with writeback, stop (STOPPING=1;
   ExecStop returns only once the daemon has exited, and the file is in
   the bucket), and
   twice a crash (SIGKILL): ExecStop fails as it may, then ExecStopPost,
   or on the second crash ExecStartPre of the restart, removes the dead
   mount, and the next start mounts again.

Usage: check-units.py --bin BUILT_S3CACHEFS [--srcdir DIR]
Exit status 0 (passed), 1 (failed) or 77 (skipped: no systemd-analyze).
"""
import argparse
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# systemd's PATH for services (systemd.exec(5), "Environment variables in
# spawned processes")
SYSTEMD_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
INSTALLED_BIN = '/usr/bin/s3cachefs'
COMMAND_TIMEOUT = 60
failures = []


def check(condition, what, detail=''):
    print(('ok     ' if condition else 'FAILED ') + what)
    if not condition:
        if detail:
            print('       ' + detail.rstrip().replace('\n', '\n       '))
        failures.append(what)
    return condition


# ------------------------------------------------------------ unit files

def parse_unit(path):
    """{section: [(key, value), ...]}, keys in order, repeats kept."""
    sections = {}
    current = None
    pending = ''
    for raw in Path(path).read_text().splitlines():
        line = pending + raw.strip()
        pending = ''
        if not line or line[0] in '#;':
            continue
        if line.endswith('\\'):
            pending = line[:-1] + ' '
            continue
        if line.startswith('[') and line.endswith(']'):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, _, value = line.partition('=')
        current.append((key.strip(), value.strip()))
    return sections


def specifiers(text, unit, instance):
    table = {'i': instance, 'I': instance.replace('-', '/'),
             'n': unit, '%': '%'}

    def one(match):
        letter = match.group(1)
        if letter not in table:
            raise ValueError(f'specifier %{letter} not handled by this test')
        return table[letter]
    return re.sub(r'%(.)', one, text)


def read_environment_file(path):
    """EnvironmentFile= syntax: VAR=value lines, # and ; comments, quotes."""
    env = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line[0] in '#;':
            continue
        key, _, value = line.partition('=')
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in '"\'':
            value = value[1:-1]
        env[key.strip()] = value
    return env


def expand_command(line, env):
    """An Exec*= line as systemd runs it: (argv, failure_ignored)."""
    ignore = False
    while line and line[0] in '-@+!:':
        ignore = ignore or line[0] == '-'
        line = line[1:]
    argv = []
    for word in shlex.split(line):
        whole = re.fullmatch(r'\$([A-Za-z_][A-Za-z0-9_]*)', word)
        if whole:   # "$VAR" alone: split at whitespace, zero or more words
            argv.extend(env.get(whole.group(1), '').split())
            continue
        argv.append(re.sub(
            r'\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}',
            lambda m: '$' if m.group(0) == '$$' else env.get(m.group(1), ''),
            word))
    return argv, ignore


class Unit:
    """One instance of a template unit, with its environment file."""

    def __init__(self, template, instance, conf_path, binary):
        self.name = template.name.replace('@.', f'@{instance}.')
        self.instance = instance
        self.sections = parse_unit(template)
        self.binary = binary
        service = self.sections['Service']
        self.env = {'PATH': SYSTEMD_PATH, 'LANG': 'C.UTF-8'}
        env_files = []
        for key, value in service:
            value = specifiers(value, self.name, instance)
            if key == 'Environment':
                for assignment in shlex.split(value):
                    name, _, val = assignment.partition('=')
                    self.env[name] = val
            elif key == 'EnvironmentFile':
                env_files.append(value.lstrip('-'))
        self.env_files = env_files
        # the test's own file in place of /etc/s3cachefs/NAME.conf
        self.env.update(read_environment_file(conf_path))

    def commands(self, key, mainpid=None):
        env = dict(self.env)
        if mainpid is not None:
            env['MAINPID'] = str(mainpid)
        out = []
        for k, value in self.sections['Service']:
            if k == key:
                value = specifiers(value, self.name, self.instance)
                value = value.replace(INSTALLED_BIN, self.binary)
                out.append(expand_command(value, env))
        return out

    def run(self, key, mainpid=None, extra_env=None, timeout=COMMAND_TIMEOUT):
        """Runs every command of KEY; [(argv, ignore, returncode, output)]."""
        results = []
        env = dict(self.env)
        env.update(extra_env or {})
        if mainpid is not None:
            env['MAINPID'] = str(mainpid)
        for argv, ignore in self.commands(key, mainpid):
            proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True,
                                  timeout=timeout, check=False)
            results.append((argv, ignore, proc.returncode, proc.stdout))
        return results

    def start_main(self, log_path, extra_env=None):
        (argv, _), = self.commands('ExecStart')
        env = dict(self.env)
        env.update(extra_env or {})
        log = open(log_path, 'ab')
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log,
                                start_new_session=True)


class NotifySocket:
    """The socket systemd gives a Type=notify service (NOTIFY_SOCKET): a
    datagram socket whose messages carry the sender's credentials, as
    systemd needs them for NotifyAccess=main."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(self.path)
        self.received = []          # (sender pid, {field: value})

    def close(self):
        self.sock.close()
        os.unlink(self.path)

    def receive(self, timeout):
        """One message within TIMEOUT seconds, or None."""
        self.sock.settimeout(timeout)
        try:
            data, ancillary, _, _ = self.sock.recvmsg(
                4096, socket.CMSG_SPACE(12))
        except socket.timeout:
            return None
        pid = None
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid = int.from_bytes(value[0:4], sys.byteorder)
        fields = dict(line.split('=', 1)
                      for line in data.decode().splitlines() if '=' in line)
        self.received.append((pid, fields))
        return pid, fields

    def wait(self, field, proc, timeout):
        """The first message with FIELD (from any sender), or None once
        PROC has exited or TIMEOUT has passed."""
        deadline = time.monotonic() + timeout
        for pid, fields in self.received:
            if field in fields:
                return pid, fields
        while time.monotonic() < deadline:
            got = self.receive(0.2)
            if got is not None and field in got[1]:
                return got
            if got is None and proc.poll() is not None:
                return None
        return None


# ------------------------------------------------------------ checks

def verify(template, instance, binary, srcdir, work):
    """systemd-analyze verify of one instance of TEMPLATE."""
    unit_dir = work / 'verify'
    unit_dir.mkdir(exist_ok=True)
    copy = unit_dir / template.name
    copy.write_text(template.read_text().replace(INSTALLED_BIN, binary))
    man1 = work / 'man' / 'man1'
    man1.mkdir(parents=True, exist_ok=True)
    for page in (srcdir / 'man').glob('*.[1-8]'):
        target = man1.parent / f'man{page.suffix[1:]}' / page.name
        target.parent.mkdir(exist_ok=True)
        if not target.exists():
            target.symlink_to(page)
    name = template.name.replace('@.', f'@{instance}.')
    env = dict(os.environ, MANPATH=str(work / 'man'))
    argv = ['systemd-analyze', 'verify', str(unit_dir / name)]
    if shutil.which('man') is None:   # Documentation= cannot be checked
        print('       (no man: systemd-analyze verify --man=no)')
        argv.insert(2, '--man=no')
    proc = subprocess.run(argv,
                          env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False,
                          timeout=COMMAND_TIMEOUT)
    stem = template.name.split('@')[0]
    ours = [line for line in proc.stdout.splitlines()
            if stem in line or str(unit_dir) in line]
    others = [line for line in proc.stdout.splitlines() if line not in ours]
    for line in others:   # about units of the machine, not ours
        print('       (not about this unit) ' + line)
    check(proc.returncode == 0 and not ours,
          f'systemd-analyze verify {name}: no error, no warning',
          proc.stdout)


def closed_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def write_conf(path, example, **values):
    """The example file with some variables set to VALUES."""
    lines = []
    for line in example.read_text().splitlines():
        key = line.partition('=')[0]
        if key in values or key.lstrip('#') in values:
            key = key.lstrip('#')
            value = values.pop(key)
            if value is None:
                continue
            line = f'{key}={value}'
        lines.append(line)
    lines.extend(f'{k}={v}' for k, v in values.items() if v is not None)
    path.write_text('\n'.join(lines) + '\n')


def write_credentials(path, example, mode=0o600, key='S3RVER', secret='S3RVER'):
    text = example.read_text()
    text = re.sub(r'(?m)^aws_access_key_id = .*$', f'aws_access_key_id = {key}', text)
    text = re.sub(r'(?m)^aws_secret_access_key = .*$',
                  f'aws_secret_access_key = {secret}', text)
    path.write_text(text)
    path.chmod(mode)


def example_options(example, endpoint):
    """OPTIONS of the example file, its endpoint replaced by ENDPOINT."""
    options = read_environment_file(example)['OPTIONS']
    return re.sub(r'endpoint=[^,]*', f'endpoint={endpoint}', options)


def only(results):
    (argv, ignore, code, output), = results
    return argv, ignore, code, output


def commands_without_server(template, binary, srcdir, work):
    example = srcdir / 'contrib' / 'systemd' / 's3cachefs.conf.example'
    cred_example = srcdir / 'contrib' / 'systemd' / 's3cachefs.credentials.example'
    mnt = work / 'offline' / 'mnt'
    cache = work / 'offline' / 'cache'
    cred = work / 'offline' / 'credentials'
    cred.parent.mkdir(parents=True)
    write_credentials(cred, cred_example)
    endpoint = f'http://127.0.0.1:{closed_port()}'
    options = example_options(example, endpoint) + ',retries=0'
    conf = work / 'offline' / 'test.conf'
    write_conf(conf, example, BUCKET='test-bucket:some/prefix',
               MOUNTPOINT=str(mnt), OPTIONS=options, CACHE=str(cache),
               CREDENTIALS=str(cred))
    unit = Unit(template, 'test', conf, binary)

    check(unit.env_files == ['/etc/s3cachefs/test.conf'],
          'EnvironmentFile= is /etc/s3cachefs/INSTANCE.conf', repr(unit.env_files))
    (argv, _), = unit.commands('ExecStart')
    check(argv[0] == binary and '-f' in argv,
          'ExecStart runs s3cachefs in the foreground (-f)', repr(argv))
    (stop_argv, stop_ignore), = unit.commands('ExecStop')
    check(stop_argv == [binary, '--unmount', str(mnt)] and stop_ignore,
          'ExecStop is "-s3cachefs --unmount MOUNTPOINT"', repr(stop_argv))

    proc = subprocess.run([binary, '--help'], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)
    check(proc.returncode == 0 and 'usage: s3cachefs' in proc.stdout,
          's3cachefs --help: status 0 and the usage', proc.stdout[:300])

    argv, _, code, out = only(unit.run('ExecStartPre'))
    check(code == 0 and mnt.is_dir(),
          'ExecStartPre on no mount: status 0, mount point created', out)
    argv, _, code, out = only(unit.run('ExecStart'))
    check(code == 1 and "cannot reach bucket 'test-bucket'" in out,
          'ExecStart with the example options: accepted, stops at the '
          'bucket check of a closed port', f'{argv}\nstatus {code}: {out}')

    conf_empty = work / 'offline' / 'empty-options.conf'
    write_conf(conf_empty, example, BUCKET='test-bucket', MOUNTPOINT=str(mnt),
               OPTIONS=None, CACHE=str(cache), CREDENTIALS=str(cred))
    bare = Unit(template, 'test', conf_empty, binary)
    argv, _, code, out = only(bare.run(
        'ExecStart', extra_env={'AWS_ENDPOINT_URL': endpoint}))
    check(code == 1 and 'cannot reach bucket' in out,
          'ExecStart with no OPTIONS (the trailing comma) is accepted',
          f'{argv}\nstatus {code}: {out}')

    cred.chmod(0o644)
    argv, _, code, out = only(unit.run('ExecStart'))
    check(code == 1 and 'accessible to group or others' in out,
          'ExecStart refuses a credentials file of mode 0644', out)
    cred.chmod(0o600)

    conf_keys = work / 'offline' / 'keys.conf'
    write_conf(conf_keys, example, BUCKET='test-bucket', MOUNTPOINT=str(mnt),
               OPTIONS=options + ',secret_key=x', CACHE=str(cache),
               CREDENTIALS=str(cred))
    argv, _, code, out = only(Unit(template, 'test', conf_keys, binary).run('ExecStart'))
    check(code == 1 and 'never taken from the command line' in out,
          'ExecStart refuses keys among OPTIONS', out)

    argv, ignore, code, out = only(unit.run('ExecStop'))
    check(code == 1 and 'is not an s3cachefs mount' in out,
          'ExecStop on no mount: the documented error, status 1 (ignored: "-")',
          f'status {code}: {out}')

    service = dict(unit.sections['Service'])
    check(service.get('Type') == 'notify' and
          service.get('NotifyAccess') == 'main' and
          'ExecStartPost' not in service,
          'Type=notify, NotifyAccess=main, no ExecStartPost polling',
          str(service))

    argv, _, code, out = only(unit.run('ExecStopPost'))
    check(code == 0 and out == '', 'ExecStopPost on no mount: nothing to do',
          f'status {code}: {out}')


# ------------------------------------------------------------ fstab

FSTAB_GENERATOR = '/lib/systemd/system-generators/systemd-fstab-generator'


def man_fstab_line(srcdir):
    """The example line of man s3cachefs, FSTAB (its first .EX block)."""
    text = (srcdir / 'man' / 's3cachefs.1').read_text()
    section = text.split('\n.SH FSTAB\n', 1)[1]
    example = section.split('\n.EX\n', 1)[1].split('\n.EE\n', 1)[0]
    return example.replace('\\-', '-').strip()


def fstab(srcdir, work):
    """The man page's fstab line, through systemd's own fstab generator:
    the mount unit systemd would make at boot, then verified."""
    if not os.access(FSTAB_GENERATOR, os.X_OK):
        print(f'       (no {FSTAB_GENERATOR}: the fstab line is not checked)')
        return
    line = man_fstab_line(srcdir)
    what, where, kind, options = line.split()[:4]
    out = work / 'fstab'
    out.mkdir()
    table = out / 'fstab'
    table.write_text(line + '\n')
    env = dict(os.environ, SYSTEMD_FSTAB=str(table), SYSTEMD_PROC_CMDLINE='',
               SYSTEMD_IN_INITRD='0')
    units = out / 'units'
    units.mkdir()
    done = subprocess.run([FSTAB_GENERATOR, str(units), str(units), str(units)],
                          env=env, capture_output=True, text=True, timeout=30)
    name = where.strip('/').replace('/', '-') + '.mount'
    unit = units / name
    check(done.returncode == 0 and unit.exists(),
          f'fstab: the generator makes {name} of the man page\'s line',
          done.stdout + done.stderr)
    if not unit.exists():
        return
    sections = parse_unit(unit)
    mount, unit_keys = dict(sections['Mount']), dict(sections['Unit'])
    check(mount.get('What') == what and mount.get('Where') == where and
          mount.get('Type') == kind == 'fuse.s3cachefs' and
          mount.get('Options') == options,
          'fstab: What, Where, Type and Options as written', str(mount))
    # _netdev: a network mount, wanted by remote-fs.target and before it
    check(unit_keys.get('Before') == 'remote-fs.target' and
          (units / 'remote-fs.target.requires' / name).exists(),
          'fstab: _netdev makes it a remote mount, before remote-fs.target',
          str(unit_keys))
    check(unit_keys.get('RequiresMountsFor') == '/nvme' and
          mount.get('TimeoutSec') == '2min',
          'fstab: x-systemd.requires-mounts-for and x-systemd.mount-timeout',
          str(sections))
    done = subprocess.run(['systemd-analyze', 'verify', str(unit)],
                          capture_output=True, text=True, timeout=60)
    check(done.returncode == 0 and done.stdout + done.stderr == '',
          f'fstab: systemd-analyze verify {name}', done.stdout + done.stderr)
    # the options s3cachefs is then given (mount.fuse3 drops the fstab-only
    # ones) are its own: checked by ExecStart above and test_lifecycle.py


# ------------------------------------------------------------ for real

def mounted(path):
    with open('/proc/self/mountinfo') as mountinfo:
        for line in mountinfo:
            fields = line.split()
            if fields[4] == str(path):
                sep = fields.index('-')
                return fields[sep + 1]
    return None


def wait_exit(proc, timeout):
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def life_cycle(template, binary, srcdir, work):
    sys.path.insert(0, str(srcdir / 'tests' / 'harness'))
    import servers  # noqa: E402 (the harness, needs boto3)

    server = servers.S3rverServer(work / 'server')
    server.start()
    procs = []
    sockets = []
    mnt = work / 'live' / 'mnt'
    try:
        s3 = server.client()
        bucket = 'unit-bucket'
        server.create_bucket(bucket)
        example = srcdir / 'contrib' / 'systemd' / 's3cachefs.conf.example'
        cred = work / 'live' / 'credentials'
        cred.parent.mkdir(parents=True)
        write_credentials(cred, srcdir / 'contrib' / 'systemd' /
                          's3cachefs.credentials.example',
                          key=server.access_key, secret=server.secret_key)
        conf = work / 'live' / 'live.conf'
        write_conf(conf, example, BUCKET=bucket, MOUNTPOINT=str(mnt),
                   OPTIONS=example_options(example, server.endpoint),
                   CACHE=str(work / 'live' / 'cache'), CREDENTIALS=str(cred))
        unit = Unit(template, 'live', conf, binary)
        log = work / 'live' / 'daemon.log'
        notify = NotifySocket(work / 'live' / 'notify.sock')
        sockets.append(notify)

        def start(what):
            results = unit.run('ExecStartPre')
            (argv, _, code, out), = results
            check(code == 0, f'{what}: ExecStartPre', out)
            notify.received.clear()
            main = unit.start_main(log, {'NOTIFY_SOCKET': notify.path})
            procs.append(main)
            # systemd counts the start done at READY=1 from the main process
            ready = notify.wait('READY', main, 60)
            pid, fields = ready if ready is not None else (None, {})
            serving = os.statvfs(mnt) if mounted(mnt) else None
            check(ready is not None and pid == main.pid and
                  fields['READY'] == '1' and main.poll() is None and
                  mounted(mnt) == 'fuse.s3cachefs' and serving is not None,
                  f'{what}: READY=1 from the main process once the mount serves',
                  f'{notify.received}\n' + log.read_text()[-2000:])
            check(fields.get('STATUS', '').startswith(
                      f"serving bucket '{bucket}' at {mnt}"),
                  f'{what}: STATUS says what it serves', str(fields))
            return main

        main = start('start')
        data = os.urandom(3 << 20)
        (mnt / 'ckpt.bin').write_bytes(data)   # writeback: close returns at once
        argv, _, code, out = only(unit.run('ExecStop'))
        status = main.poll()
        check(code == 0 and status == 0,
              'stop: ExecStop returns once the daemon has exited (status 0)',
              f'ExecStop status {code}: {out}\ndaemon: {status}\n'
              + log.read_text()[-2000:])
        stopping = notify.wait('STOPPING', main, 5)
        check(stopping is not None and stopping[0] == main.pid,
              'stop: STOPPING=1 from the main process', str(notify.received))
        body = s3.get_object(Bucket=bucket, Key='ckpt.bin')['Body'].read()
        check(body == data, 'stop: the file written with writeback is in the bucket')
        wait_exit(main, 30)
        argv, _, code, out = only(unit.run('ExecStopPost'))
        check(code == 0 and mounted(mnt) is None, 'stop: ExecStopPost, nothing mounted',
              out)

        for round_, cleaner in ((1, 'ExecStopPost'), (2, 'ExecStartPre')):
            main = start(f'crash {round_}')
            check((mnt / 'ckpt.bin').read_bytes() == data,
                  f'crash {round_}: the file reads back through the mount')
            os.kill(main.pid, signal.SIGKILL)
            wait_exit(main, 30)
            check(mounted(mnt) == 'fuse.s3cachefs',
                  f'crash {round_}: SIGKILL leaves a dead mount')
            if cleaner == 'ExecStopPost':
                argv, ignore, code, out = only(unit.run('ExecStop'))
                check(code != 0 and ignore,
                      f'crash {round_}: ExecStop fails (ignored: "-")', out)
                argv, _, code, out = only(unit.run('ExecStopPost'))
                check(code == 0 and mounted(mnt) is None and
                      'dead mount' in out,
                      f'crash {round_}: ExecStopPost removes the dead mount', out)
            else:   # systemd did not get to ExecStopPost: the restart cleans
                argv, _, code, out = only(unit.run('ExecStartPre'))
                check(code == 0 and mounted(mnt) is None and
                      'dead mount' in out,
                      f'crash {round_}: ExecStartPre removes the dead mount', out)

        main = start('after the crashes')
        argv, _, code, out = only(unit.run('ExecStop'))
        check(code == 0 and main.poll() == 0,
              'after the crashes: mounted again on the same cache, and stopped',
              out + log.read_text()[-2000:])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if mounted(mnt):
            subprocess.run(['fusermount3', '-uz', str(mnt)], check=False)
        for notify in sockets:
            notify.close()
        server.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--bin', required=True, help='the built s3cachefs')
    parser.add_argument('--srcdir', default=str(Path(__file__).resolve().parents[2]))
    args = parser.parse_args()
    binary = str(Path(args.bin).resolve())
    srcdir = Path(args.srcdir).resolve()
    if shutil.which('systemd-analyze') is None:
        print('SKIP: no systemd-analyze (Debian package systemd)')
        return 77
    templates = sorted((srcdir / 'contrib' / 'systemd').glob('*@.service'))
    if not check(templates, 'contrib/systemd has template units'):
        return 1
    with tempfile.TemporaryDirectory(prefix='s3cachefs-units-') as tmp:
        work = Path(tmp)
        for template in templates:
            verify(template, 'test', binary, srcdir, work)
            verify(template, 'my-bucket', binary, srcdir, work)
        template = srcdir / 'contrib' / 'systemd' / 's3cachefs@.service'
        commands_without_server(template, binary, srcdir, work)
        fstab(srcdir, work)
        s3rver = srcdir / 'tests' / 'node_modules' / '.bin' / 's3rver'
        fuse = Path('/dev/fuse')
        if os.geteuid() != 0 or not fuse.exists() or not s3rver.exists():
            print('skipped the life cycle against s3rver: needs root, '
                  '/dev/fuse and tests/node_modules (tests/install-deps.sh)')
        else:
            life_cycle(template, binary, srcdir, work)
    print(f'{len(failures)} failed' if failures else 'all passed')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
