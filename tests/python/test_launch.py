"""mxkv-launch (bindings/python/mxkv_launch.py): environment contract, output, exit codes,
teardown, and a real MXNet 1.9.1 cluster started with it.

Every launcher run is a subprocess bounded by a timeout; nodes bind 127.0.0.1 only. Nodes
of the teardown tests record their pid (and a grandchild's) in "ready" files, and every
process of a run carries a unique tag in its environment, so the tests check by pid, and by
scanning /proc, that nothing is left once the launcher has returned.
"""
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid

import pytest

from conftest import BINDINGS, REPO

LAUNCH = os.path.join(BINDINGS, 'mxkv_launch.py')
PY = sys.executable            # any Python 3.8+ runs the launcher and the dummy nodes

pytestmark = pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc')

# A dummy node. T_MODE=print: print what it got and exit with T_EXIT_<role><task> (an
# integer, or "kill" to SIGKILL itself). T_MODE=hang: start a grandchild (which ignores
# SIGTERM when T_STUBBORN is set), write T_DIR/ready.<role><task>, then run for 60 s;
# the node named by T_FAIL instead waits for T_NREADY ready files and exits 3.
NODE = r'''
import json, os, signal, subprocess, sys, time
role = os.environ['DMLC_ROLE']
task = os.environ.get('DMLC_TASK_ID', '')
name = role + task
env = os.environ.get

def starttime(pid):
    with open('/proc/%d/stat' % pid) as f:
        s = f.read()
    return s[s.rfind(')') + 2:].split()[19]

if env('T_MODE', 'print') == 'print':
    print('role=%s task=%s port=%s root=%s:%s nw=%s ns=%s host=%s cluster=%s inherited=%s'
          % (role, task or None, env('PORT'), env('DMLC_PS_ROOT_URI'), env('DMLC_PS_ROOT_PORT'),
             env('DMLC_NUM_WORKER'), env('DMLC_NUM_SERVER'), env('DMLC_NODE_HOST'),
             env('DMLC_JOB_CLUSTER'), env('T_INHERITED')))
    sys.stderr.write('stderr of %s\n' % name)
    sys.stdout.write('no newline from %s' % name)
    sys.stdout.flush()
    code = env('T_EXIT_' + name, '0')
    if code == 'kill':
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(code))

d = env('T_DIR')
if name == env('T_FAIL'):
    end = time.monotonic() + 30
    while len([f for f in os.listdir(d) if f.startswith('ready.')]) < int(env('T_NREADY')):
        if time.monotonic() > end:
            sys.exit(99)
        time.sleep(0.02)
    print('failing now', flush=True)
    sys.exit(3)
kid_code = ('import signal, sys, time\n'
            + ('signal.signal(signal.SIGTERM, signal.SIG_IGN)\n' if env('T_STUBBORN') else '')
            + 'print("up", flush=True)\ntime.sleep(60)\n')
kid = subprocess.Popen([sys.executable, '-c', kid_code], stdout=subprocess.PIPE)
assert kid.stdout.readline() == b'up\n'
info = {'pid': os.getpid(), 'start': starttime(os.getpid()),
        'kid': kid.pid, 'kidstart': starttime(kid.pid)}
with open(os.path.join(d, 'tmp.' + name), 'w') as f:
    json.dump(info, f)
os.replace(os.path.join(d, 'tmp.' + name), os.path.join(d, 'ready.' + name))
print('ready', flush=True)
time.sleep(60)
'''


# --- helpers ------------------------------------------------------------------------------

def run_launcher(args, timeout=60, env=None, cwd=None):
    return subprocess.run([PY, LAUNCH] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout, env=env, cwd=cwd)


def dry_run(args, env=None):
    r = run_launcher(['--dry-run'] + args, timeout=30, env=env)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode()


def parse_blocks(text):
    """dry-run output -> [(label, {K: V})], values unquoted as a shell would."""
    blocks = []
    for chunk in text.strip('\n').split('\n\n'):
        lines = chunk.split('\n')
        assert lines[0].startswith('# ')
        label = lines[0][2:].split(':', 1)[0]
        env = {}
        for line in lines[1:]:
            k, v = line.split('=', 1)
            if v.startswith("$'"):
                env[k] = v            # bash's quoting: checked through bash
            else:
                (env[k],) = shlex.split(v)
        blocks.append((label, env))
    return blocks


def alive(pid, start):
    """pid still names the process that recorded start and it has not exited."""
    try:
        with open('/proc/%d/stat' % pid) as f:
            s = f.read()
    except OSError:
        return False
    fields = s[s.rfind(')') + 2:].split()
    return fields[19] == start and fields[0] not in ('Z', 'X')


def gone(pid):
    """No live process has this pid (a zombie waiting for its parent counts as gone)."""
    try:
        with open('/proc/%d/stat' % pid) as f:
            s = f.read()
    except OSError:
        return True
    return s[s.rfind(')') + 2:].split()[0] in ('Z', 'X')


def tagged(tag):
    """Live processes whose environment carries T_TAG=tag."""
    needle = ('T_TAG=%s\0' % tag).encode()
    found = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open('/proc/%s/environ' % entry, 'rb') as f:
                if needle not in f.read():
                    continue
            with open('/proc/%s/stat' % entry) as f:
                s = f.read()
        except OSError:
            continue
        if s[s.rfind(')') + 2:].split()[0] not in ('Z', 'X'):
            found.append(int(entry))
    return found


def kill_tagged(tag):
    """Clean-up for a broken launcher: SIGKILL, by pid, whatever carries the tag."""
    for pid in tagged(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError('timed out after %g s waiting for %s' % (timeout, what))
        time.sleep(0.05)


def ready_infos(d):
    infos = {}
    for f in os.listdir(d):
        if f.startswith('ready.'):
            with open(os.path.join(d, f)) as fh:
                infos[f[len('ready.'):]] = json.load(fh)
    return infos


def assert_all_gone(infos, tag):
    assert infos
    for name, i in infos.items():
        assert not alive(i['pid'], i['start']), '%s (pid %d) is still running' % (name, i['pid'])
        assert not alive(i['kid'], i['kidstart']), \
            "%s's child (pid %d) is still running" % (name, i['kid'])
    assert tagged(tag) == []


def kill_leftovers(infos, tag):
    kill_tagged(tag)
    for i in infos.values():
        for pid, start in ((i['pid'], i['start']), (i['kid'], i['kidstart'])):
            if alive(pid, start):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def node(tmp_path):
    path = tmp_path / 'node.py'
    path.write_text(NODE)
    return str(path)


def names(nw, ns):
    return (['scheduler'] + ['server%d' % (nw + i) for i in range(ns)]
            + ['worker%d' % i for i in range(nw)])


# --- dry run: the environment contract ----------------------------------------------------

def test_dry_run_roles_counts_ports_and_env():
    out = dry_run(['-n', '3', '-s', '2', '--env', 'FOO=bar', '--env', 'SPACED=a b\'"$c',
                   '--env', 'COLON:x=y', '--env-worker', 'OMP_NUM_THREADS:3',
                   '--env-server', 'SRV=1', 'python3', 'train.py', '--lr', '0.1'])
    blocks = parse_blocks(out)
    assert [b[0] for b in blocks] == ['scheduler', 'server 0', 'server 1',
                                     'worker 0', 'worker 1', 'worker 2']
    assert out.splitlines()[0] == '# scheduler: python3 train.py --lr 0.1'
    root_ports = {env['DMLC_PS_ROOT_PORT'] for _, env in blocks}
    assert len(root_ports) == 1
    root_port = int(root_ports.pop())
    assert 0 < root_port < 65536
    for label, env in blocks:
        role = label.split()[0]
        assert env['DMLC_ROLE'] == role
        assert env['DMLC_PS_ROOT_URI'] == '127.0.0.1'
        assert env['DMLC_NODE_HOST'] == '127.0.0.1'
        assert env['DMLC_NUM_WORKER'] == '3' and env['DMLC_NUM_SERVER'] == '2'
        assert env['FOO'] == 'bar' and env['SPACED'] == 'a b\'"$c' and env['COLON'] == 'x=y'
        assert ('OMP_NUM_THREADS' in env) == (role == 'worker')
        assert ('SRV' in env) == (role == 'server')
        if role == 'scheduler':
            assert 'DMLC_TASK_ID' not in env and 'PORT' not in env
        else:
            assert env['DMLC_JOB_CLUSTER'] == 'local'
    # dmlc-core's local launcher: workers are tasks 0..W-1, servers W..W+S-1
    assert [env.get('DMLC_TASK_ID') for _, env in blocks] == [None, '3', '4', '0', '1', '2']
    # each server/worker has its own port, ascending with its rank within its role
    ports = [int(env['PORT']) for _, env in blocks[1:]]
    assert len(set(ports + [root_port])) == 6
    assert ports[:2] == sorted(ports[:2]) and ports[2:] == sorted(ports[2:])


def test_dry_run_is_shell_exportable(tmp_path):
    value = 'a b\'"$HOME `x` \\ \n\n\t\x01\x7f1 end\\'
    out = dry_run(['-n', '1', '-s', '1', '--env', 'WEIRD=' + value, 'x'])
    for i, (label, env) in enumerate(parse_blocks(out)):
        f = tmp_path / ('b%d.sh' % i)
        f.write_text(out.strip('\n').split('\n\n')[i] + '\n')
        r = subprocess.run(['bash', '-c', 'set -a; . "$1"; env -0', 'sh', str(f)],
                           stdout=subprocess.PIPE, timeout=30, env={'PATH': os.defpath})
        got = dict(kv.split('=', 1) for kv in r.stdout.decode().split('\0') if '=' in kv)
        assert got['WEIRD'] == value
        assert env['WEIRD'].startswith("$'")      # one line in the output
        for k, v in env.items():
            if k != 'WEIRD':
                assert got[k] == v, (label, k)


def test_dry_run_defaults_and_options():
    blocks = parse_blocks(dry_run(['-n', '2', 'cmd']))
    # -s defaults to -n, as in MXNet's launcher
    assert [b[0] for b in blocks] == ['scheduler', 'server 0', 'server 1', 'worker 0', 'worker 1']
    blocks = parse_blocks(dry_run(['-n', '1', '-s', '1', '--port', '23456', '--no-pin-ports',
                                   '--p3', '--launcher', 'ssh', 'cmd']))
    for _, env in blocks:
        assert env['DMLC_PS_ROOT_PORT'] == '23456'
        assert 'PORT' not in env
        assert env['DMLC_PS_VAN_TYPE'] == 'p3' and env['DMLC_PS_WATER_MARK'] == '10'
    # --env may move the scheduler address, bare names pass the launcher's value
    blocks = parse_blocks(dry_run(['-n', '1', '-s', '1', '--env', 'DMLC_PS_ROOT_PORT=9999',
                                   '--env', 'PASSME', 'cmd'],
                                  env=dict(os.environ, PASSME='from launcher')))
    assert all(env['DMLC_PS_ROOT_PORT'] == '9999' and env['PASSME'] == 'from launcher'
               for _, env in blocks)


def test_the_launcher_leaves_the_nodes_malloc_settings_alone():
    """no GLIBC_TUNABLES (or any other malloc setting) of the launcher's own: libmxkv keeps
    its big blocks itself (src/capi/bigalloc.rs), and MXNet's tools/launch.py sets none;
    the launcher's own GLIBC_TUNABLES reaches the nodes by inheritance, unchanged"""
    env = dict(os.environ, GLIBC_TUNABLES='glibc.malloc.arena_max=2')
    blocks = parse_blocks(dry_run(['-n', '1', '-s', '1', 'cmd'], env=env))
    assert len(blocks) == 3
    for _, e in blocks:
        assert not any(k.startswith(('GLIBC_', 'MALLOC_')) for k in e), e


def test_entry_point_main_in_process(capsys):
    from mxkv import launch
    assert launch.main(['-n', '1', '-s', '1', '--dry-run', '--', 'cmd', '-n', '5']) == 0
    blocks = parse_blocks(capsys.readouterr().out)
    assert len(blocks) == 3
    assert blocks[0][1]['DMLC_NUM_WORKER'] == '1'   # the command's own -n is the command's


@pytest.mark.parametrize('args, message', [
    (['-n', '1', '--env', 'DMLC_ROLE=server', 'x'], 'DMLC_ROLE'),
    (['-n', '1', '--env-worker', 'DMLC_NUM_WORKER=3', 'x'], 'DMLC_NUM_WORKER'),
    (['-n', '1', '--env', 'NOT_SET_ANYWHERE_42', 'x'], 'not set'),
    (['-n', '1', '--env', '1X=2', 'x'], 'NAME=VALUE'),
    (['-n', '1', '--launcher', 'ssh', 'x'], '--dry-run'),
    (['-n', '1', '--launcher', 'k8s', 'x'], 'not a launcher'),
    (['-n', '1', '-H', 'hosts', 'x'], 'hostfile'),
    (['-n', '1', '-s', '0', 'x'], '-s must be at least 1'),
    (['-n', '0', 'x'], '-n must be at least 1'),
    (['-n', '1', '--timeout', '0', 'x'], '--timeout'),
    (['-n', '1'], 'no COMMAND'),
])
def test_usage_errors(args, message):
    r = run_launcher(args, timeout=30)
    assert r.returncode == 2
    assert message in r.stderr.decode()
    assert r.stdout == b''


# --- running nodes: prefixes and exit codes -----------------------------------------------

def test_prefixes_environment_and_success(node):
    env = dict(os.environ, T_INHERITED='yes')
    r = run_launcher(['-n', '2', '-s', '2', PY, node], env=env)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode().splitlines()
    err = r.stderr.decode().splitlines()
    labels = {'scheduler': 'scheduler', 'server2': 'server 0', 'server3': 'server 1',
              'worker0': 'worker 0', 'worker1': 'worker 1'}
    assert len(out) == 10
    ports = {}
    roots = set()
    for name, label in labels.items():
        lines = [line for line in out if line.startswith('[%s] role=' % label)]
        assert len(lines) == 1, (label, out)
        fields = dict(f.split('=', 1) for f in lines[0].split('] ', 1)[1].split())
        role = label.split()[0]
        assert fields['role'] == role
        assert fields['task'] == (name[len(role):] or 'None')
        assert fields['nw'] == '2' and fields['ns'] == '2'
        assert fields['host'] == '127.0.0.1' and fields['inherited'] == 'yes'
        assert fields['cluster'] == ('None' if role == 'scheduler' else 'local')
        roots.add(fields['root'])
        ports[label] = fields['port']
        # a last line without newline still comes out whole, with its prefix
        assert '[%s] no newline from %s' % (label, name) in out
        assert '[%s] stderr of %s' % (label, name) in err
    assert len(roots) == 1 and roots.pop().startswith('127.0.0.1:')
    assert ports['scheduler'] == 'None'
    assert int(ports['worker 0']) < int(ports['worker 1'])
    assert int(ports['server 0']) < int(ports['server 1'])


def test_inherited_port_removed_without_pinning(node):
    r = run_launcher(['-n', '1', '-s', '1', '--no-pin-ports', PY, node],
                     env=dict(os.environ, PORT='4242'))
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().count('port=None') == 3


@pytest.mark.parametrize('who, code, expect', [
    ('server2', '7', 7),            # -n 2: server 0 is task 2
    ('worker1', '1', 1),
    ('scheduler', '5', 5),
    ('worker0', 'kill', 128 + 9),   # killed by a signal: 128+N, as a shell reports it
])
def test_exit_code_of_failing_node(node, who, code, expect):
    r = run_launcher(['-n', '2', '-s', '1', '--env', 'T_EXIT_%s=%s' % (who, code), PY, node])
    assert r.returncode == expect, r.stderr.decode()
    label = {'server2': 'server 0', 'worker1': 'worker 1', 'scheduler': 'scheduler',
             'worker0': 'worker 0'}[who]
    assert '[mxkv-launch] %s failed' % label in r.stderr.decode()


def test_command_not_found():
    r = run_launcher(['-n', '1', '-s', '1', 'no-such-program-mxkv-42'])
    assert r.returncode == 127
    assert 'cannot start scheduler' in r.stderr.decode()


def test_bare_name_in_current_directory_runs_as_dot_slash(tmp_path):
    script = tmp_path / 'job.sh'
    script.write_text('#!/bin/sh\necho "ran $DMLC_ROLE"\n')
    script.chmod(0o755)
    r = run_launcher(['-n', '1', '-s', '1', 'job.sh'], cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr.decode()
    assert sorted(r.stdout.decode().splitlines()) == [
        '[scheduler] ran scheduler', '[server 0] ran server', '[worker 0] ran worker']


# --- teardown ----------------------------------------------------------------------------

def _hang_args(tmp_path, tag, extra=()):
    return ['--grace', '1', '--env', 'T_MODE=hang', '--env', 'T_DIR=%s' % tmp_path,
            '--env', 'T_TAG=%s' % tag] + list(extra)


@pytest.mark.parametrize('stubborn', [False, True])
def test_failing_node_stops_the_others(node, tmp_path, stubborn):
    tag = uuid.uuid4().hex
    extra = ['--env', 'T_FAIL=worker1', '--env', 'T_NREADY=4']
    if stubborn:
        extra += ['--env', 'T_STUBBORN=1']
    start = time.monotonic()
    try:
        r = run_launcher(['-n', '2', '-s', '2'] + _hang_args(tmp_path, tag, extra)
                         + [PY, node], timeout=60)
        took = time.monotonic() - start
        infos = ready_infos(str(tmp_path))
        assert r.returncode == 3, r.stderr.decode()
        err = r.stderr.decode()
        assert '[mxkv-launch] worker 1 failed' in err
        assert '[worker 1] failing now' in r.stdout.decode()
        assert sorted(infos) == ['scheduler', 'server2', 'server3', 'worker0']
        assert took < 30      # the others would have run 60 s
        # the stubborn grandchildren ignore SIGTERM: only SIGKILL after --grace ends them
        assert ('SIGKILL' in err) == stubborn
        assert_all_gone(infos, tag)
    finally:
        kill_leftovers(ready_infos(str(tmp_path)), tag)


@pytest.mark.parametrize('sig, code', [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_launcher_tears_down(node, tmp_path, sig, code):
    tag = uuid.uuid4().hex
    proc = subprocess.Popen([PY, LAUNCH, '-n', '2', '-s', '1']
                            + _hang_args(tmp_path, tag, ['--env', 'T_STUBBORN=1'])
                            + [PY, node], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        wait_for(lambda: len(ready_infos(str(tmp_path))) == 4, 30, 'every node to be ready')
        infos = ready_infos(str(tmp_path))
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == code, err.decode()
        assert '[mxkv-launch] received %s' % signal.Signals(sig).name in err.decode()
        assert out.decode().count('] ready') == 4
        assert_all_gone(infos, tag)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        kill_leftovers(ready_infos(str(tmp_path)), tag)


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='parent-death signal: Linux')
def test_sigkill_to_launcher_ends_every_node(node, tmp_path):
    # the launcher cannot clean up after SIGKILL: the kernel's parent-death signal and the
    # launcher's watchdog must
    tag = uuid.uuid4().hex
    proc = subprocess.Popen([PY, LAUNCH, '-n', '2', '-s', '2']
                            + _hang_args(tmp_path, tag, ['--env', 'T_STUBBORN=1'])
                            + [PY, node], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: len(ready_infos(str(tmp_path))) == 5, 30, 'every node to be ready')
        infos = ready_infos(str(tmp_path))
        assert sorted(infos) == names(2, 2)
        proc.kill()
        proc.wait(10)
        # each node (checked by pid and start time) ends, although nobody stops it
        def left():
            return ([n for n, i in sorted(infos.items()) if alive(i['pid'], i['start'])],
                    [n for n, i in sorted(infos.items()) if alive(i['kid'], i['kidstart'])],
                    tagged(tag))
        # each node ends at once (parent-death signal); the children they started, which
        # ignore SIGTERM, when the launcher's watchdog sends SIGKILL after --grace (1 s)
        end = time.monotonic() + 20
        while left() != ([], [], []) and time.monotonic() < end:
            time.sleep(0.05)
        assert left() == ([], [], []), 'nodes, their children, tagged processes still ' \
            'running 20 s after the launcher was SIGKILLed'
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        kill_leftovers(ready_infos(str(tmp_path)), tag)


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='parent-death signal: Linux')
def test_nodes_get_sigkill_as_parent_death_signal():
    import mxkv_launch
    code = ('import ctypes\nv = ctypes.c_int(-1)\n'
            'assert ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0) == 0\nprint(v.value)')
    r = subprocess.run([PY, '-c', code], stdout=subprocess.PIPE, timeout=30,
                       preexec_fn=mxkv_launch._parent_death_preexec())
    assert r.returncode == 0 and int(r.stdout) == signal.SIGKILL   # PR_GET_PDEATHSIG


ORPHAN = r'''
import os, sys, time
sys.path.insert(0, sys.argv[1])
import mxkv_launch
preexec = mxkv_launch._parent_death_preexec()
parent = os.getpid()
pid = os.fork()
if pid == 0:
    # a node whose launcher dies between fork and prctl: wait to be reparented, then run
    # the launcher's preexec_fn as the fork would have
    end = time.monotonic() + 20
    while os.getppid() == parent and time.monotonic() < end:
        time.sleep(0.01)
    open(os.path.join(sys.argv[2], 'orphaned'), 'w').close()
    preexec()
    open(os.path.join(sys.argv[2], 'ran the command'), 'w').close()
    os._exit(0)
print(pid, flush=True)
'''


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='parent-death signal: Linux')
def test_node_whose_launcher_died_before_prctl_does_not_run(tmp_path):
    r = subprocess.run([PY, '-c', ORPHAN, BINDINGS, str(tmp_path)], stdout=subprocess.PIPE,
                       timeout=30)
    assert r.returncode == 0
    pid = int(r.stdout)
    try:
        wait_for(lambda: gone(pid), 30, 'the orphaned child to end')
        assert sorted(os.listdir(str(tmp_path))) == ['orphaned']
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_timeout_kills_everything(node, tmp_path):
    tag = uuid.uuid4().hex
    try:
        start = time.monotonic()
        r = run_launcher(['-n', '1', '-s', '1', '--timeout', '8']
                         + _hang_args(tmp_path, tag) + [PY, node], timeout=60)
        took = time.monotonic() - start
        assert r.returncode == 124, r.stderr.decode()
        assert 'timeout' in r.stderr.decode()
        assert 8 <= took < 30
        infos = ready_infos(str(tmp_path))
        assert sorted(infos) == ['scheduler', 'server1', 'worker0']
        assert_all_gone(infos, tag)
    finally:
        kill_leftovers(ready_infos(str(tmp_path)), tag)


def test_timeout_holds_when_nobody_reads_the_output(tmp_path):
    # the launcher's stdout is a pipe nobody reads, the nodes write without end: the
    # reader threads block, the deadline must not
    script = tmp_path / 'spam.py'
    script.write_text('import sys\nwhile True:\n    sys.stdout.write("x" * 999 + "\\n")\n')
    tag = uuid.uuid4().hex
    proc = subprocess.Popen([PY, LAUNCH, '-n', '1', '-s', '1', '--timeout', '3', '--grace', '1',
                             '--env', 'T_TAG=' + tag, PY, str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        start = time.monotonic()
        proc.wait(40)
        assert proc.returncode == 124
        assert time.monotonic() - start < 30
        assert b'timeout: 3 s elapsed' in proc.stderr.read()
        assert tagged(tag) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()
        kill_tagged(tag)


def test_servers_that_outlive_the_workers_are_stopped(tmp_path):
    # workers succeed at once, the scheduler and server never leave by themselves
    script = tmp_path / 'node.sh'
    script.write_text('#!/bin/sh\n[ "$DMLC_ROLE" = worker ] && exit 0\nexec sleep 60\n')
    script.chmod(0o755)
    tag = uuid.uuid4().hex
    try:
        r = run_launcher(['-n', '2', '-s', '1', '--shutdown-timeout', '1', '--grace', '1',
                          '--env', 'T_TAG=' + tag, str(script)], timeout=60)
        assert r.returncode == 1, r.stderr.decode()
        assert 'every worker exited 0 but scheduler, server 0 did not exit within 1 s' \
            in r.stderr.decode()
        assert tagged(tag) == []
    finally:
        kill_tagged(tag)


def test_left_behind_processes_are_killed(tmp_path):
    # the node exits 0 but leaves a background child in its process group
    script = tmp_path / 'node.sh'
    script.write_text('#!/bin/sh\nsleep 60 >/dev/null 2>&1 &\necho "bg $!"\n')
    script.chmod(0o755)
    tag = uuid.uuid4().hex
    try:
        r = run_launcher(['-n', '1', '-s', '1', '--env', 'T_TAG=' + tag, str(script)],
                         timeout=60)
        assert r.returncode == 0, r.stderr.decode()
        assert 'processes left behind by' in r.stderr.decode()
        assert r.stdout.decode().count('] bg ') == 3
        assert tagged(tag) == []
    finally:
        kill_tagged(tag)


# --- a real MXNet 1.9.1 cluster ----------------------------------------------------------

WORKER = r'''
import os, sys
import numpy as np
import mxnet as mx          # with DMLC_ROLE=server/scheduler this runs the role and exits

if os.environ.get('T_FAIL_TASK') == os.environ['DMLC_TASK_ID']:
    print('giving up before the store', flush=True)
    sys.exit(3)
kv = mx.kv.create('dist_sync')
r, n = kv.rank, kv.num_workers
kv.init(3, mx.nd.ones((2, 3)))
kv.init(7, mx.nd.arange(15))        # split over the servers when the bound is below 15
kv.push(3, mx.nd.ones((2, 3)) * (r + 1))
kv.push(7, mx.nd.arange(15) * (r + 1))
a, b = mx.nd.zeros((2, 3)), mx.nd.zeros(15)
kv.pull(3, out=a)
kv.pull(7, out=b)
s = n * (n + 1) // 2
ok = (np.array_equal(a.asnumpy(), np.full((2, 3), s, np.float32))
      and np.array_equal(b.asnumpy(), np.arange(15, dtype=np.float32) * s))
print('rank %d of %d sum %s %s' % (r, n, a.asnumpy().ravel().tolist(), 'OK' if ok else 'BAD'),
      flush=True)
sys.exit(0 if ok else 1)
'''


@pytest.fixture(scope='module')
def mxnet_python():
    """An interpreter that has MXNet 1.9.1: the repository's venv, else this one."""
    for candidate in (os.path.join(REPO, '.venv', 'bin', 'python'), sys.executable):
        if os.path.exists(candidate):
            r = subprocess.run([candidate, '-c', 'import mxnet; print(mxnet.__version__)'],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=120)
            if r.returncode == 0 and r.stdout.strip() == b'1.9.1':
                return candidate
    pytest.skip('no Python with mxnet 1.9.1 (make venv-ref)')


def _started_pids(err):
    pids = {}
    for line in err.splitlines():
        if line.startswith('[mxkv-launch] started '):
            label, pid = line[len('[mxkv-launch] started '):].split(': pid ')
            pids[label] = int(pid)
    return pids


@pytest.mark.parametrize('servers, bound', [(1, None), (2, 10)])
def test_real_mxnet_cluster(tmp_path, mxnet_python, servers, bound):
    script = tmp_path / 'worker.py'
    script.write_text(WORKER)
    tag = uuid.uuid4().hex
    args = ['-v', '-n', '2', '-s', str(servers), '--timeout', '100', '--grace', '2',
            '--env', 'T_TAG=' + tag]
    if bound:
        args += ['--env-worker', 'MXNET_KVSTORE_BIGARRAY_BOUND=%d' % bound]
    else:
        args += ['--env', 'PS_VERBOSE=1']
    try:
        r = run_launcher(args + [mxnet_python, str(script)], timeout=150, cwd=str(tmp_path))
        out, err = r.stdout.decode(), r.stderr.decode()
        assert r.returncode == 0, out + err
        # pinned ports: the launcher's worker i is ps-lite's rank i
        for rank in range(2):
            line = '[worker %d] rank %d of 2 sum [3.0, 3.0, 3.0, 3.0, 3.0, 3.0] OK' % (rank, rank)
            assert line in out.splitlines(), out + err
        if not bound:
            # ps-lite's own log lines (stderr) carry their node's prefix too
            for label, role in (('scheduler', 'scheduler'), ('server 0', 'server'),
                                ('worker 0', 'worker'), ('worker 1', 'worker')):
                assert any(line.startswith('[%s] ' % label)
                           and 'Bind to role=%s, ' % role in line and 'ip=127.0.0.1' in line
                           for line in err.splitlines()), (label, err)
        pids = _started_pids(err)
        assert sorted(pids) == sorted(['scheduler', 'worker 0', 'worker 1']
                                      + ['server %d' % i for i in range(servers)])
        for label in pids:
            assert '[mxkv-launch] %s (pid %d) ended: exit code 0' % (label, pids[label]) in err
            assert gone(pids[label]), label
        assert tagged(tag) == []
    finally:
        kill_tagged(tag)


def test_real_mxnet_cluster_worker_failure_does_not_hang(tmp_path, mxnet_python):
    # worker 1 quits before creating the store: real ps-lite would wait for it forever
    script = tmp_path / 'worker.py'
    script.write_text(WORKER)
    tag = uuid.uuid4().hex
    try:
        start = time.monotonic()
        r = run_launcher(['-v', '-n', '2', '-s', '1', '--timeout', '100', '--grace', '2',
                          '--env', 'T_TAG=' + tag, '--env', 'T_FAIL_TASK=1',
                          mxnet_python, str(script)], timeout=150, cwd=str(tmp_path))
        out, err = r.stdout.decode(), r.stderr.decode()
        assert r.returncode == 3, out + err
        assert time.monotonic() - start < 90
        assert '[worker 1] giving up before the store' in out
        assert '[mxkv-launch] worker 1 failed' in err
        assert tagged(tag) == []
    finally:
        kill_tagged(tag)
