"""mxkv-launch: start a distributed KVStore job (scheduler, servers, workers) on this machine.

    mxkv-launch -n 2 -s 1 python train.py --kv-store dist_sync

The flags and the environment every node gets are those of MXNet 1.9.1's
``tools/launch.py`` in local mode (``--launcher local``, which runs
dmlc-core's ``tracker/dmlc_tracker/local.py``): one scheduler with
``DMLC_ROLE=scheduler`` and ``DMLC_PS_ROOT_URI``/``DMLC_PS_ROOT_PORT``,
``DMLC_NUM_WORKER``/``DMLC_NUM_SERVER`` on every node, servers and workers
with ``DMLC_ROLE``, ``DMLC_TASK_ID`` (workers 0..W-1, servers W..W+S-1) and
``DMLC_JOB_CLUSTER=local``. Every node runs the same COMMAND, as in MXNet:
importing ``mxnet`` (or ``mxkv``) with ``DMLC_ROLE=server`` or ``scheduler``
runs that role and exits, so only workers get to the rest of the script.

What differs from MXNet's launcher, on purpose:

* Everything binds to 127.0.0.1 (``DMLC_PS_ROOT_URI`` and ``DMLC_NODE_HOST``)
  on ports that were free when the launcher started; the scheduler's port is
  chosen at run time (``--port`` fixes it). Each server and worker also gets
  ``PORT``, ps-lite's variable for a node's own port: the ports are handed
  out in ascending order, and ps-lite ranks the nodes of one host by port, so
  ``[worker 1]`` is the node whose ``kv.rank`` is 1 (``--no-pin-ports``
  leaves the ports to the nodes; an inherited ``PORT`` is then removed).
* COMMAND is run as an argument vector, not joined into a bash command line
  (arguments with spaces stay whole); write ``sh -c '...'`` to get a shell.
  As in dmlc-core, a first word without ``/`` naming a file in the current
  directory is run as ``./WORD``.
* Each output line is prefixed with the node's role and rank (``[worker 0]``,
  ``[server 1]``, ``[scheduler]``); stderr stays stderr. stdin is
  ``/dev/null`` and ``PYTHONUNBUFFERED=1`` is set unless already set, so
  Python nodes' lines show up as they are printed.
* The first node that exits non-zero ends the job: every other node is
  stopped (SIGTERM to its process group, SIGKILL after ``--grace`` seconds)
  and the launcher exits with that node's code (128+N for a node killed by
  signal N). Ctrl-C / SIGTERM / SIGHUP stop everything the same way (exit
  130 / 143 / 129; a second signal kills at once), as does ``--timeout``
  (exit 124, like timeout(1)). When every worker has exited 0, the scheduler
  and servers have ``--shutdown-timeout`` seconds to exit by themselves
  (else they are stopped and the exit status is 1). Each node runs in its own
  process group and is ended by its process id, never by name; processes a
  node leaves behind in its group are killed when the job ends. Exit 0 means
  every node exited 0. If the launcher itself dies without stopping the job
  (SIGKILL, a crash), every node gets SIGKILL from the kernel on Linux (a
  parent-death signal), and a small watchdog process the launcher started
  (``python -I -S -c ...``, in its own session) sends SIGTERM, then SIGKILL
  after ``--grace`` seconds, to the nodes' process groups.
  If the launcher's own output goes away (a closed pipe), the nodes' lines
  are dropped and the job goes on. If the launcher runs out of file
  descriptors (it holds two pipes per node) or processes while starting the
  job, it says so in one line, with the open-file limit, stops the nodes it
  has started and exits 1.
* ``--dry-run`` prints, for each node, the variables the launcher would set
  (one block per node of shell-quoted ``K=V`` lines, one line each: values
  with control characters use bash's ``$'...'``; ``set -a; . file`` exports
  them) and starts nothing: that is the contract another launcher
  (ssh, mpi, a cluster manager) has to reproduce. Only ``--launcher local``
  runs anything.
* ``--env K=V`` (also MXNet's ``K:V``, or a bare ``K`` to pass the launcher's
  own value) sets a variable on every node; ``--env-server`` and
  ``--env-worker`` only on servers / workers. They may override
  ``DMLC_PS_ROOT_*``, ``DMLC_NODE_HOST`` and the like, not ``DMLC_ROLE``,
  ``DMLC_NUM_*`` or ``DMLC_TASK_ID`` (use ``-n``/``-s``).

Launcher options come before COMMAND (or end them with ``--``); everything
from the first word that is not an option on belongs to COMMAND.

This module needs only the Python standard library (3.8+) and POSIX; it can
also be run as a script from a checkout (``python bindings/python/mxkv_launch.py ...``);
``mxkv/launch.py`` only re-exports it (``python -m mxkv.launch`` where ``mxkv`` imports).
"""
import argparse
import errno
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

__all__ = ['main', 'build_nodes', 'Node']

PROG = 'mxkv-launch'
HOST = '127.0.0.1'
# variables the launcher owns; --env may not change them
RESERVED = ('DMLC_ROLE', 'DMLC_NUM_WORKER', 'DMLC_NUM_SERVER', 'DMLC_TASK_ID')
MXNET_LAUNCHERS = ('local', 'ssh', 'mpi', 'sge', 'yarn')
_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')
# exit codes besides a node's own
EXIT_USAGE = 2
EXIT_TIMEOUT = 124
EXIT_STRAGGLER = 1          # scheduler/servers did not exit after the workers
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
EXIT_NO_RESOURCES = 1       # out of file descriptors (or processes) starting the job
GIVE_UP_AFTER_KILL = 10.0   # seconds to wait for a node after SIGKILL (stuck in the kernel)
PR_SET_PDEATHSIG = 1        # <linux/prctl.h>


class UsageError(Exception):
    """A command line the launcher refuses (exit 2)."""


_OUT_OF = {errno.EMFILE: 'too many open files', errno.ENFILE: 'too many open files in the '
           'system', errno.EAGAIN: 'out of processes or memory', errno.ENOMEM: 'out of memory'}


def _no_resources(err, nnodes):
    """The one-line text for an OSError that is the system's limit (None for others)."""
    text = _OUT_OF.get(getattr(err, 'errno', None))
    if text is None:
        return None
    if err.errno in (errno.EMFILE, errno.ENFILE):
        try:
            import resource
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            limit = 'unlimited' if soft == resource.RLIM_INFINITY else str(soft)
        except (ImportError, OSError, ValueError):
            limit = 'unknown'
        text += (' (the open-file limit, ulimit -n, is %s; the launcher needs about %d for '
                 '%d nodes: two pipes per node)' % (limit, 2 * nnodes + 16, nnodes))
    return text


class Node(object):
    """One process of the job: its role, rank and the variables the launcher sets."""

    def __init__(self, role, rank, env):
        self.role = role
        self.rank = rank
        self.env = env
        self.proc = None
        self.returncode = None
        self.readers = []

    @property
    def label(self):
        return self.role if self.role == 'scheduler' else '%s %d' % (self.role, self.rank)

    def __repr__(self):
        return '<Node %s>' % self.label


# --- command line --------------------------------------------------------------------------

def _parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Launch a distributed KVStore job on this machine (127.0.0.1): one "
                    "scheduler, S servers and W workers, each running COMMAND with the "
                    "environment of MXNet's tools/launch.py (local mode).",
        epilog="Exit status: the first non-zero exit code of a node (128+N if killed by "
               "signal N), 124 after --timeout, 130/143/129 after SIGINT/SIGTERM/SIGHUP, "
               "2 for a bad command line, 0 when every node exited 0.")
    p.add_argument('-n', '--num-workers', type=int, required=True, metavar='W',
                   help='number of worker nodes')
    p.add_argument('-s', '--num-servers', type=int, metavar='S',
                   help='number of server nodes (default: W, as in MXNet)')
    p.add_argument('--launcher', default='local', metavar='{local}',
                   help="only 'local' starts nodes; for ssh, mpi, sge or yarn print the "
                        "environment with --dry-run and start the nodes with that tool")
    p.add_argument('-H', '--hostfile', help='(MXNet ssh/mpi launchers; refused here)')
    p.add_argument('--env', action='append', default=[], metavar='K=V',
                   help='set K=V on every node (also K:V; a bare K passes this '
                        "process's value); repeatable")
    p.add_argument('--env-server', action='append', default=[], metavar='K=V',
                   help='like --env, servers only')
    p.add_argument('--env-worker', action='append', default=[], metavar='K=V',
                   help='like --env, workers only')
    p.add_argument('--p3', action='store_true',
                   help='P3 distributed training: DMLC_PS_VAN_TYPE=p3 DMLC_PS_WATER_MARK=10')
    p.add_argument('--port', type=int, metavar='PORT',
                   help="the scheduler's port (default: a free port chosen now)")
    p.add_argument('--no-pin-ports', dest='pin_ports', action='store_false',
                   help="do not give servers and workers a PORT; ranks then follow the "
                        "random ports the nodes pick")
    p.add_argument('--dry-run', action='store_true',
                   help="print each node's environment as K=V lines and exit")
    p.add_argument('--timeout', type=float, metavar='SECONDS',
                   help='stop every node after this long and exit 124')
    p.add_argument('--grace', type=float, default=5.0, metavar='SECONDS',
                   help='time between SIGTERM and SIGKILL when stopping nodes (default 5)')
    p.add_argument('--shutdown-timeout', type=float, default=60.0, metavar='SECONDS',
                   help='how long the scheduler and servers may take to exit once every '
                        'worker has exited 0 (default 60; 0: no limit)')
    p.add_argument('-v', '--verbose', action='store_true',
                   help="report each node's process id and exit status on stderr")
    p.add_argument('command', nargs=argparse.REMAINDER, metavar='COMMAND',
                   help='the program every node runs, with its arguments')
    return p


def _parse_assignment(text, what):
    """'K=V', 'K:V' or 'K' -> (K, V); a bare K takes this process's value."""
    m = _NAME.match(text)
    if m is None:
        raise UsageError('%s %r: expected NAME=VALUE' % (what, text))
    name, rest = m.group(0), text[m.end():]
    if rest == '':
        if name not in os.environ:
            raise UsageError('%s %s: no value given and %s is not set here' % (what, name, name))
        return name, os.environ[name]
    if rest[0] not in '=:':
        raise UsageError('%s %r: expected NAME=VALUE' % (what, text))
    return name, rest[1:]


def _parse_envs(values, what):
    out = {}
    for text in values:
        name, value = _parse_assignment(text, what)
        if name in RESERVED:
            raise UsageError('%s %s: the launcher sets %s (use -n/-s for the counts)'
                             % (what, name, name))
        if '\0' in value:
            raise UsageError('%s %s: value contains a NUL byte' % (what, name))
        out[name] = value
    return out


def parse_args(argv):
    args = _parser().parse_args(argv)
    command = list(args.command)
    if command and command[0] == '--':
        command = command[1:]
    args.command = command
    if args.num_workers < 1:
        raise UsageError('-n must be at least 1 (got %d)' % args.num_workers)
    if args.num_servers is None:
        args.num_servers = args.num_workers
    if args.num_servers < 1:
        raise UsageError('-s must be at least 1 (got %d): the KVStore needs a server; '
                         "MXNet's launcher would start a rabit tracker instead"
                         % args.num_servers)
    if args.launcher not in MXNET_LAUNCHERS:
        raise UsageError('--launcher %r: not a launcher of MXNet (%s)'
                         % (args.launcher, ', '.join(MXNET_LAUNCHERS)))
    if args.launcher != 'local' and not args.dry_run:
        raise UsageError('--launcher %s: only local is supported; use --dry-run to print each '
                         "node's environment and start the nodes with %s"
                         % (args.launcher, args.launcher))
    if args.hostfile is not None:
        raise UsageError('-H/--hostfile: nodes on other hosts need the ssh or mpi launcher; '
                         "use --dry-run to print each node's environment")
    if args.port is not None and not 0 < args.port < 65536:
        raise UsageError('--port %d: not a TCP port' % args.port)
    for name in ('timeout', 'grace', 'shutdown_timeout'):
        value = getattr(args, name)
        if value is not None and (value != value or value < 0
                                  or (name == 'timeout' and value == 0)):
            raise UsageError('--%s %s: must be a positive number of seconds'
                             % (name.replace('_', '-'), value))
    if not args.command and not args.dry_run:
        raise UsageError('no COMMAND given')
    args.env_all = _parse_envs(args.env, '--env')
    args.env_server_only = _parse_envs(args.env_server, '--env-server')
    args.env_worker_only = _parse_envs(args.env_worker, '--env-worker')
    return args


# --- the nodes ----------------------------------------------------------------------------

def free_ports(count, host=HOST):
    """count distinct TCP ports that are free on host now (bound together, then released)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def build_nodes(num_workers, num_servers, root_port, node_ports=None, env_all=None,
                env_server=None, env_worker=None, p3=False):
    """The job's nodes in start order (scheduler, servers, workers), each with the
    variables the launcher sets for it."""
    common = {
        'DMLC_PS_ROOT_URI': HOST,
        'DMLC_PS_ROOT_PORT': str(root_port),
        'DMLC_NUM_WORKER': str(num_workers),
        'DMLC_NUM_SERVER': str(num_servers),
        'DMLC_NODE_HOST': HOST,
    }
    if p3:
        common.update({'DMLC_PS_VAN_TYPE': 'p3', 'DMLC_PS_WATER_MARK': '10'})
    env_all = env_all or {}
    sched = dict(common, DMLC_ROLE='scheduler')
    sched.update(env_all)
    nodes = [Node('scheduler', 0, sched)]
    if node_ports is not None:
        assert len(node_ports) == num_servers + num_workers
        ports = sorted(node_ports)
        server_ports, worker_ports = ports[:num_servers], ports[num_servers:]
    for role, count, first_task, extra in (('server', num_servers, num_workers, env_server),
                                           ('worker', num_workers, 0, env_worker)):
        for rank in range(count):
            env = dict(common, DMLC_ROLE=role, DMLC_TASK_ID=str(first_task + rank),
                       DMLC_JOB_CLUSTER='local')
            if node_ports is not None:
                env['PORT'] = str((server_ports if role == 'server' else worker_ports)[rank])
            env.update(env_all)
            env.update(extra or {})
            nodes.append(Node(role, rank, env))
    return nodes


def shell_quote(value):
    """One-line shell quoting: shlex.quote, or bash's $'...' when value has control characters."""
    if not any(ord(c) < 32 or ord(c) == 127 for c in value):
        return shlex.quote(value)
    out = []
    for c in value:
        if c in '\\\'':
            out.append('\\' + c)
        elif c == '\n':
            out.append('\\n')
        elif c == '\t':
            out.append('\\t')
        elif ord(c) < 32 or ord(c) == 127:
            out.append('\\x%02x' % ord(c))
        else:
            out.append(c)
    return "$'" + ''.join(out) + "'"


def format_dry_run(nodes, command):
    blocks = []
    cmd = ' '.join(shlex.quote(c) for c in command) if command else '(no command)'
    for node in nodes:
        lines = ['# %s: %s' % (node.label, cmd)]
        lines += ['%s=%s' % (k, shell_quote(v)) for k, v in sorted(node.env.items())]
        blocks.append('\n'.join(lines) + '\n')
    return '\n'.join(blocks)


# --- running ------------------------------------------------------------------------------

class _Output(object):
    """Writes whole prefixed lines onto the launcher's stdout/stderr, one lock per stream.

    The launcher's own messages go through a queue and a writer thread, so that the main
    loop (deadlines, signals, teardown) never waits for a reader of our output that has
    stopped reading."""

    def __init__(self):
        self.locks = (threading.Lock(), threading.Lock())
        self.messages = queue.SimpleQueue()
        self.writer = threading.Thread(target=self._write_messages, name='launcher messages',
                                       daemon=True)
        self.writer.start()

    def write(self, data, err=False):
        stream = sys.stderr if err else sys.stdout
        if stream is None:
            return            # started with that descriptor closed: drop the lines
        with self.locks[err]:
            try:
                buf = getattr(stream, 'buffer', None)
                if buf is not None:
                    buf.write(data)
                    buf.flush()
                else:
                    stream.write(data.decode('utf-8', 'replace'))
                    stream.flush()
            except (OSError, ValueError):
                pass          # our stdout went away (closed pipe): keep draining the nodes

    def _write_messages(self):
        while True:
            text = self.messages.get()
            if text is None:
                return
            self.write(('[%s] %s\n' % (PROG, text)).encode('utf-8', 'replace'), err=True)

    def say(self, text):
        self.messages.put(text)

    def close(self, timeout):
        self.messages.put(None)
        self.writer.join(timeout)
        if sys.stdout is None:
            return
        try:
            sys.stdout.flush()
        except (OSError, ValueError):   # a closed pipe: no complaint at interpreter exit
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)
            except (OSError, ValueError):
                pass


def _pump(pipe, prefix, out, err):
    try:
        for line in iter(pipe.readline, b''):
            if not line.endswith(b'\n'):
                line += b'\n'
            out.write(prefix + line, err)
    except (OSError, ValueError):
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _exit_code(returncode):
    return 128 - returncode if returncode < 0 else returncode


def _signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return 'signal %d' % signum


def _group_members(pgid):
    """Process ids of the live (not zombie) processes in process group pgid."""
    try:
        entries = os.listdir('/proc')
    except OSError:
        entries = None
    if entries is None or not os.path.exists('/proc/self/stat'):
        try:                       # no procfs: any member, zombies included
            os.killpg(pgid, 0)
            return [pgid]
        except ProcessLookupError:
            return []
        except PermissionError:
            return [pgid]
    members = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open('/proc/%s/stat' % entry, 'rb') as f:
                stat = f.read()
        except OSError:
            continue               # gone meanwhile
        fields = stat[stat.rfind(b')') + 2:].split()
        # fields: state ppid pgrp ...
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in (b'Z', b'X'):
            members.append(int(entry))
    return members


def _killpg(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _parent_death_preexec(sig=signal.SIGKILL):
    """On Linux, a preexec_fn that makes the kernel send `sig` to the child when the
    thread that forked it (the one running the job) ends, the launcher being killed
    included; None elsewhere or when prctl cannot be found.

    Everything is looked up before the fork: between fork and exec the child only calls
    prctl and getppid. If the launcher died before prctl took effect, the child was
    already given to another parent and exits at once instead of running its command."""
    if not sys.platform.startswith('linux'):
        return None
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                      ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent, signum, getppid, exit_now = os.getpid(), int(sig), os.getppid, os._exit

    def preexec():
        if prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0 and getppid() != parent:
            exit_now(128 + signum)      # the launcher is already gone

    return preexec


# The watchdog: reads "+PGID" (a node's group), "-PGID" (that group is gone) and "done"
# lines from the launcher on stdin. At end of file without "done" (the launcher died), it
# stops the groups left: SIGTERM, then SIGKILL after GRACE seconds (argv[1]).
_WATCHDOG = r'''
import os, signal, sys, time
grace = float(sys.argv[1])
groups, done, buf = set(), False, b''
while True:
    chunk = os.read(0, 4096)
    if not chunk:
        break
    *lines, buf = (buf + chunk).split(b'\n')
    for line in lines:
        if line == b'done':
            done = True
        elif line[:1] == b'+':
            groups.add(int(line[1:]))
        elif line[:1] == b'-':
            groups.discard(int(line[1:]))

def signal_all(sig):
    for g in sorted(groups):
        try:
            os.killpg(g, sig)
        except OSError:
            groups.discard(g)

if not done:
    signal_all(signal.SIGTERM)
    end = time.monotonic() + grace
    while groups and time.monotonic() < end:
        time.sleep(0.05)
        signal_all(0)
    signal_all(signal.SIGKILL)
'''


class _Watchdog(object):
    """Stops the nodes' process groups if the launcher dies without doing it (best effort:
    without it, a launcher that cannot start Python jobs still works)."""

    def __init__(self, grace):
        self.proc = self.fd = None
        if not sys.executable:
            return
        try:
            r, w = os.pipe()
        except OSError:           # out of descriptors: no watchdog (starting will say why)
            return
        try:
            self.proc = subprocess.Popen(
                [sys.executable, '-I', '-S', '-c', _WATCHDOG, repr(float(grace))], stdin=r,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                close_fds=True)
        except OSError:
            os.close(w)
            return
        finally:
            os.close(r)
        self.fd = w

    def _send(self, text):
        if self.fd is not None:
            try:
                os.write(self.fd, text.encode())
            except OSError:       # the watchdog is gone: nothing to tell
                pass

    def add(self, pgid):
        self._send('+%d\n' % pgid)

    def forget(self, pgid):
        self._send('-%d\n' % pgid)

    def close(self, done):
        """done: the job has ended and every group was taken care of; else (the launcher
        is failing) the watchdog stops whatever is left."""
        if done:
            self._send('done\n')
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if done and self.proc is not None:
            try:
                self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                pass


def _resolve(command):
    # dmlc-core's local launcher runs a bare name that is a file here as ./name
    if '/' not in command[0] and os.path.isfile(command[0]):
        return ['./' + command[0]] + command[1:]
    return list(command)


def _join_all(threads, timeout):
    end = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))


class Job(object):
    def __init__(self, nodes, command, args, out):
        self.nodes = nodes
        self.command = _resolve(command)
        self.args = args
        self.out = out
        self.events = queue.SimpleQueue()   # put() is safe from signal handlers
        self.result = None                  # exit code decided so far
        self.stopping = False
        self.kill_at = None
        self.killed = False
        self.give_up_at = None
        self.preexec = _parent_death_preexec()
        self.watchdog = None

    # -- events
    def _on_signal(self, signum, _frame):
        self.events.put(('signal', signum))

    def _wait(self, node):
        node.proc.wait()
        _join_all(node.readers, 1.0)   # its output first, unless something else holds a pipe
        self.events.put(('exit', node))

    # -- start
    def _env(self, node):
        env = dict(os.environ)
        if not self.args.pin_ports and 'PORT' not in node.env:
            env.pop('PORT', None)
        env.setdefault('PYTHONUNBUFFERED', '1')
        env.update(node.env)
        return env

    def _start(self, node):
        # every node is forked by the thread of run(), which outlives them all: the
        # parent-death signal (self.preexec) is tied to that thread
        node.proc = subprocess.Popen(
            self.command, env=self._env(node), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            close_fds=True, preexec_fn=self.preexec)
        if self.watchdog is not None:
            self.watchdog.add(node.proc.pid)
        prefix = ('[%s] ' % node.label).encode()
        unread = [(node.proc.stdout, False), (node.proc.stderr, True)]
        try:
            while unread:
                pipe, err = unread[0]
                t = threading.Thread(target=_pump, args=(pipe, prefix, self.out, err),
                                     name='%s output' % node.label, daemon=True)
                t.start()
                node.readers.append(t)
                unread.pop(0)
            threading.Thread(target=self._wait, args=(node,), name='%s wait' % node.label,
                             daemon=True).start()
        except RuntimeError:
            # "can't start new thread": the node runs, but nothing would read its output or
            # report its exit (the job would wait for it until giving up): end it now
            self._abandon(node, [pipe for pipe, _ in unread])
            raise
        if self.args.verbose:
            self.out.say('started %s: pid %d' % (node.label, node.proc.pid))

    def _abandon(self, node, unread):
        """Kill a node that was started without its threads, and reap it."""
        _killpg(node.proc.pid, signal.SIGKILL)
        for pipe in unread:
            pipe.close()
        try:
            node.proc.wait(GIVE_UP_AFTER_KILL)
        except subprocess.TimeoutExpired:
            pass                   # stuck in the kernel: counted as killed all the same
        node.returncode = node.proc.returncode if node.proc.returncode is not None \
            else -signal.SIGKILL
        if self.watchdog is not None and not _group_members(node.proc.pid):
            self.watchdog.forget(node.proc.pid)

    # -- stop
    def _running(self):
        return [n for n in self.nodes if n.proc is not None and n.returncode is None]

    def _stop(self, result, why):
        if self.result is None:
            self.result = result
        if self.stopping:
            return
        self.stopping = True
        running = self._running()
        if running:
            self.out.say('%s; stopping %s' % (why, ', '.join(n.label for n in running)))
        else:
            self.out.say(why)
        for n in running:
            _killpg(n.proc.pid, signal.SIGTERM)
        self.kill_at = time.monotonic() + self.args.grace

    def _kill_all(self):
        if not self.killed:
            self.give_up_at = time.monotonic() + GIVE_UP_AFTER_KILL
        self.killed = True
        for n in self.nodes:
            if n.proc is not None:
                _killpg(n.proc.pid, signal.SIGKILL)

    # -- main loop
    def run(self):
        old = {}
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                old[s] = signal.signal(s, self._on_signal)
        self.watchdog = _Watchdog(self.args.grace)
        done = False
        try:
            result = self._run()
            done = True
            return result
        finally:
            self.watchdog.close(done)
            for s, h in old.items():
                signal.signal(s, h)

    def _run(self):
        args = self.args
        start = time.monotonic()
        deadline = start + args.timeout if args.timeout else None
        for node in self.nodes:
            try:
                self._start(node)
            except OSError as e:
                short = _no_resources(e, len(self.nodes))
                if short is not None:
                    self._stop(EXIT_NO_RESOURCES, 'cannot start %s: %s' % (node.label, short))
                else:
                    code = (EXIT_NOT_FOUND if isinstance(e, FileNotFoundError)
                            else EXIT_NOT_EXECUTABLE)
                    self._stop(code, 'cannot start %s: %s' % (node.label, e))
                break
            except RuntimeError as e:      # "can't start new thread" (its readers)
                self._stop(EXIT_NO_RESOURCES, 'cannot start %s: %s' % (node.label, e))
                break
        workers = [n for n in self.nodes if n.role == 'worker']
        linger_until = None
        while self._running():
            now = time.monotonic()
            limits = [now + 0.5]
            for t in (deadline, linger_until, self.kill_at, self.give_up_at):
                if t is not None:
                    limits.append(t)
            try:
                kind, what = self.events.get(timeout=max(0.0, min(limits) - now))
            except queue.Empty:
                kind, what = None, None
            now = time.monotonic()
            if kind == 'exit':
                node = what
                node.returncode = node.proc.returncode
                if self.watchdog is not None and not _group_members(node.proc.pid):
                    self.watchdog.forget(node.proc.pid)
                code = _exit_code(node.returncode)
                if args.verbose or (code != 0 and not self.stopping):
                    how = ('killed by %s' % _signal_name(-node.returncode)
                           if node.returncode < 0 else 'exit code %d' % code)
                    self.out.say('%s (pid %d) ended: %s' % (node.label, node.proc.pid, how))
                if code != 0 and not self.stopping:
                    self._stop(code, '%s failed' % node.label)
                elif (node.role == 'worker' and linger_until is None and not self.stopping
                      and all(w.returncode == 0 for w in workers)):
                    if args.shutdown_timeout:
                        linger_until = now + args.shutdown_timeout
            elif kind == 'signal':
                if self.stopping and not self.killed:
                    self.out.say('%s again: killing every node now' % _signal_name(what))
                    self._kill_all()
                self._stop(128 + what, 'received %s' % _signal_name(what))
            if deadline is not None and now >= deadline and not self.stopping:
                self._stop(EXIT_TIMEOUT, 'timeout: %g s elapsed' % args.timeout)
            if (linger_until is not None and now >= linger_until and not self.stopping
                    and self._running()):
                self._stop(EXIT_STRAGGLER, 'every worker exited 0 but %s did not exit within '
                           '%g s' % (', '.join(n.label for n in self._running()),
                                     args.shutdown_timeout))
            if self.kill_at is not None and now >= self.kill_at and not self.killed:
                left = [n for n in self.nodes
                        if n.proc is not None and _group_members(n.proc.pid)]
                if left:
                    self.out.say('processes of %s still running %g s after SIGTERM: SIGKILL'
                                 % (', '.join(n.label for n in left), args.grace))
                self._kill_all()
            if self.give_up_at is not None and now >= self.give_up_at and self._running():
                stuck = self._running()
                self.out.say('%s did not end %g s after SIGKILL (pid %s); giving up on them'
                             % (', '.join(n.label for n in stuck), GIVE_UP_AFTER_KILL,
                                ', '.join(str(n.proc.pid) for n in stuck)))
                break
        # every node's leader has exited (or would not die): end whatever is left in their
        # process groups
        left = [n for n in self.nodes if n.proc is not None and _group_members(n.proc.pid)]
        if left:
            if not self.stopping:
                self.out.say('processes left behind by %s: killing them'
                             % ', '.join(n.label for n in left))
            for n in left:
                _killpg(n.proc.pid, signal.SIGKILL)
            end = time.monotonic() + 5.0
            while (any(_group_members(n.proc.pid) for n in left)
                   and time.monotonic() < end):
                time.sleep(0.02)   # SIGKILL is sent; wait (bounded) until they are gone
        _join_all([t for n in self.nodes for t in n.readers], 5.0)
        return self.result if self.result is not None else 0


def main(argv=None):
    """Console entry point ``mxkv-launch``; returns the exit status."""
    if argv is None:
        argv = sys.argv[1:]
    if os.name != 'posix':
        sys.stderr.write('%s: error: needs a POSIX system (process groups)\n' % PROG)
        return EXIT_USAGE
    try:
        args = parse_args(argv)
    except UsageError as e:
        sys.stderr.write('%s: error: %s\n' % (PROG, e))
        return EXIT_USAGE
    nnodes = args.num_servers + args.num_workers
    try:
        ports = free_ports(1 + (nnodes if args.pin_ports else 0))
    except OSError as e:
        why = _no_resources(e, nnodes + 1) or e
        sys.stderr.write('%s: error: cannot choose free ports: %s\n' % (PROG, why))
        return EXIT_NO_RESOURCES
    root_port = args.port if args.port else ports[0]
    ports = [p for p in ports if p != root_port][:nnodes]
    nodes = build_nodes(args.num_workers, args.num_servers, root_port,
                        node_ports=ports if args.pin_ports else None,
                        env_all=args.env_all, env_server=args.env_server_only,
                        env_worker=args.env_worker_only, p3=args.p3)
    if args.dry_run:
        sys.stdout.write(format_dry_run(nodes, args.command))
        sys.stdout.flush()
        return 0
    out = _Output()
    try:
        return Job(nodes, args.command, args, out).run()
    finally:
        out.close(5.0)


if __name__ == '__main__':
    sys.exit(main())
