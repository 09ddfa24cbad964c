"""The platform wheel: build it, check it, install it into a fresh venv, run the tutorial.

`pip wheel bindings/python` compiles libmxkv with cargo (setuptools-rust, into
build/wheel-target) and must give a ``py3-none-<platform>`` wheel holding
``mxkv/libmxkv.so`` and every module of the package.  Installed into a fresh
venv (no system site-packages) with the oldest numpy series its metadata allows
(from the pip cache or PyPI: `numpy>=1.23` gives 1.23.5), it
must run ``examples/tutorial.py`` copied to a folder outside the clone, with
no MXKV_LIBRARY_PATH or PYTHONPATH, and print what the reference prints
(real MXNet 1.9.1 when it is installed, else the source checkout's mxkv), and its
``mxkv-launch`` must run a 2-worker, 1-server ``dist_sync`` job on 127.0.0.1.

Slow (a release build of the crate the first time): one test does it all.
Also a script, for ``make wheel`` / ``make wheel-check`` (mk/wheel.mk):

    python tests/python/test_wheel.py build [--out build/wheel]
    python tests/python/test_wheel.py check [--out build/wheel]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
BINDINGS = os.path.join(REPO, 'bindings', 'python')
TUTORIAL = os.path.join(REPO, 'examples', 'tutorial.py')

BUILD_TIMEOUT = 2400   # a cold cargo release build on 2 busy cores
PIP_TIMEOUT = 900      # venv creation and pip installs (numpy from PyPI)
RUN_TIMEOUT = 300      # the tutorial and small probes

# variables that would let the installed package find a library it does not ship
_ENV_DROP = ('MXKV_LIBRARY_PATH', 'PYTHONPATH', 'PYTHONHOME', 'PYTHONSTARTUP',
             'MXKV_TUTORIAL_BACKEND', 'VIRTUAL_ENV')


def _run(cmd, timeout, **kwargs):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=timeout, **kwargs)
    if proc.returncode != 0:
        raise RuntimeError('%s failed (%d):\n%s\n%s' % (' '.join(map(str, cmd)), proc.returncode,
                                                        proc.stdout[-4000:], proc.stderr[-8000:]))
    return proc.stdout


def clean_env():
    env = dict(os.environ)
    for name in _ENV_DROP:
        env.pop(name, None)
    return env


def package_modules():
    """Paths (inside a wheel) of every .py file of the mxkv package in this checkout."""
    out = set()
    root = os.path.join(BINDINGS, 'mxkv')
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x != '__pycache__']
        for f in files:
            if f.endswith('.py'):
                rel = os.path.relpath(os.path.join(d, f), BINDINGS)
                out.add(rel.replace(os.sep, '/'))
    return out


def platform_tag():
    """The wheel platform tag of this machine, e.g. linux_x86_64."""
    return sysconfig.get_platform().replace('-', '_').replace('.', '_')


def build_wheel(out_dir, python=sys.executable):
    """pip-build the wheel into out_dir (old mxkv wheels there are removed); return its path."""
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):
        if f.startswith('mxkv-') and f.endswith('.whl'):
            os.remove(os.path.join(out_dir, f))
    _run([python, '-m', 'pip', 'wheel', '--no-deps', '-w', out_dir, BINDINGS],
         BUILD_TIMEOUT, env=clean_env())
    wheels = [f for f in os.listdir(out_dir) if f.startswith('mxkv-') and f.endswith('.whl')]
    assert len(wheels) == 1, wheels
    return os.path.join(out_dir, wheels[0])


def check_wheel(path, modules):
    """The wheel is py3-none-<this platform> and holds the library and `modules`."""
    name = os.path.basename(path)
    dist, version, python_tag, abi_tag, plat_tag = name[:-len('.whl')].split('-')
    assert (dist, python_tag, abi_tag) == ('mxkv', 'py3', 'none'), name
    assert plat_tag != 'any' and plat_tag == platform_tag(), name
    with zipfile.ZipFile(path) as whl:
        names = set(whl.namelist())
        info = '%s-%s.dist-info/' % (dist, version)
        wheel_meta = whl.read(info + 'WHEEL').decode()
        entry_points = whl.read(info + 'entry_points.txt').decode()
        lib = whl.read('mxkv/libmxkv.so')
    assert 'Root-Is-Purelib: false' in wheel_meta, wheel_meta
    assert 'Tag: py3-none-%s' % plat_tag in wheel_meta, wheel_meta
    assert lib[:4] == b'\x7fELF', 'mxkv/libmxkv.so is not a shared library'
    for symbol in (b'MXKVStoreCreate', b'MXNDArrayCreateEx', b'mxkv_live_handles'):
        assert symbol in lib, 'mxkv/libmxkv.so does not export %s' % symbol.decode()
    missing = sorted(modules - names)
    assert not missing, 'the wheel lacks %s' % missing
    assert 'mxkv-launch = mxkv_launch:main' in entry_points, entry_points


def numpy_floor(wheel):
    """'X.Y' from the wheel's `Requires-Dist: numpy>=X.Y...`: the oldest numpy it allows."""
    with zipfile.ZipFile(wheel) as whl:
        meta = [n for n in whl.namelist() if n.endswith('.dist-info/METADATA')]
        assert len(meta) == 1, meta
        text = whl.read(meta[0]).decode()
    reqs = [line.split(':', 1)[1].strip() for line in text.splitlines()
            if line.startswith('Requires-Dist:')]
    numpy = [r for r in reqs if re.match(r'numpy\b', r)]
    assert len(numpy) == 1, reqs
    floor = re.search(r'>=\s*(\d+)\.(\d+)', numpy[0])
    assert floor, 'the wheel gives numpy no lower bound: %s' % numpy[0]
    return '%s.%s' % floor.groups()


def fresh_venv(venv_dir, wheel):
    """A venv without system site-packages, with the wheel and the oldest numpy series its
    metadata allows (a binary numpy X.Y.* for `numpy>=X.Y`) installed; its python. So the
    checks below hold for the oldest numpy a user may get, and a floor this Python has no
    numpy wheel for fails here."""
    env = clean_env()
    _run([sys.executable, '-m', 'venv', venv_dir], PIP_TIMEOUT, env=env)
    python = os.path.join(venv_dir, 'bin', 'python')
    floor = numpy_floor(wheel)
    try:
        _run([python, '-m', 'pip', 'install', '-q', '--only-binary', 'numpy', wheel,
              'numpy==%s.*' % floor], PIP_TIMEOUT, env=env, cwd=venv_dir)
    except RuntimeError as err:
        raise AssertionError('the wheel allows numpy %s, which does not install as a binary '
                             'wheel for this Python:\n%s' % (floor, err))
    return python


def run_tutorial(python, workdir, env):
    """stdout of examples/tutorial.py copied into workdir and run there."""
    os.makedirs(workdir, exist_ok=True)
    script = os.path.join(workdir, 'tutorial.py')
    shutil.copyfile(TUTORIAL, script)
    return _run([python, script], RUN_TIMEOUT, env=env, cwd=workdir)


def reference_output(workdir):
    """The tutorial's output on real MXNet 1.9.1 if this python has it, else on the
    source checkout's mxkv (the library chosen as for the other suites)."""
    env = dict(os.environ)
    has_mxnet = subprocess.run(
        [sys.executable, '-c', 'import importlib.util as u, sys; '
         'sys.exit(u.find_spec("mxnet") is None)'], timeout=RUN_TIMEOUT, env=env).returncode == 0
    if has_mxnet:
        env['MXKV_TUTORIAL_BACKEND'] = 'mxnet'
    else:
        env['PYTHONPATH'] = BINDINGS + os.pathsep + env.get('PYTHONPATH', '')
    return run_tutorial(sys.executable, workdir, env), 'mxnet' if has_mxnet else 'mxkv (source)'


# every worker pushes rank + 1 into a key initialised to 100 (ones); with 2 workers the
# servers' sum is 3, and each worker prints the value it pulled and the library it used
CLUSTER_JOB = r'''
import mxkv as mx
kv = mx.kv.create('dist_sync')
kv.init(7, mx.nd.ones((2, 3)) * 100)
kv.push(7, mx.nd.ones((2, 3)) * (kv.rank + 1))
out = mx.nd.zeros((2, 3))
kv.pull(7, out=out)
print('rank=%d workers=%d pulled=%s lib=%s' % (kv.rank, kv.num_workers,
      sorted(set(out.asnumpy().ravel().tolist())), mx.base.library_path))
'''


def run_cluster(venv_dir, run_dir, env):
    """`mxkv-launch -n 2 -s 1` of the venv runs CLUSTER_JOB with the venv's python."""
    script = os.path.join(run_dir, 'cluster_job.py')
    with open(script, 'w') as fout:
        fout.write(CLUSTER_JOB)
    python = os.path.join(venv_dir, 'bin', 'python')
    env = dict(env, MXKV_TIMEOUT_S='60')
    out = _run([os.path.join(venv_dir, 'bin', 'mxkv-launch'), '-n', '2', '-s', '1',
                '--timeout', str(RUN_TIMEOUT - 60), python, script],
               RUN_TIMEOUT, env=env, cwd=run_dir)
    lib = _run([python, '-c', 'import mxkv; print(mxkv.base.library_path)'], RUN_TIMEOUT,
               env=env, cwd=run_dir).strip()
    for rank in (0, 1):
        line = '[worker %d] rank=%d workers=2 pulled=[3.0] lib=%s' % (rank, rank, lib)
        assert line in out.splitlines(), 'no %r in:\n%s' % (line, out)


def check_installed(wheel, workdir, log=lambda *a: None):
    """Install `wheel` into a fresh venv under workdir and check it; return the tutorial output."""
    assert not os.path.abspath(workdir).startswith(REPO + os.sep), workdir
    venv_dir = os.path.join(workdir, 'venv')
    python = fresh_venv(venv_dir, wheel)
    log('installed %s into %s' % (os.path.basename(wheel), venv_dir))
    run_dir = os.path.join(workdir, 'run')
    os.makedirs(run_dir, exist_ok=True)
    env = clean_env()

    # the library inside the installed package is the one used, and no other
    probe = ('import mxkv, mxkv._lib as L; print(mxkv.base.library_path); '
             'print(L.installation()[0]); print(mxkv.base.version())')
    path, kind, version = _run([python, '-c', probe], RUN_TIMEOUT, env=env,
                               cwd=run_dir).split()
    site = _run([python, '-c', 'import sysconfig; print(sysconfig.get_paths()["platlib"])'],
                RUN_TIMEOUT, env=env, cwd=run_dir).strip()
    assert path == os.path.realpath(os.path.join(site, 'mxkv', 'libmxkv.so')), path
    assert (kind, version) == ('installed', '10901'), (kind, version)
    assert os.path.isfile(os.path.join(venv_dir, 'bin', 'mxkv-launch'))

    ours = run_tutorial(python, run_dir, env)
    ref, what = reference_output(os.path.join(workdir, 'ref'))
    assert ours.count('update on key:') == 7, ours
    assert ours == ref, 'tutorial output differs from %s:\n%s\n---\n%s' % (what, ours, ref)
    log('tutorial output matches %s' % what)

    # the installed mxkv-launch starts a real cluster (scheduler, 1 server, 2 workers on
    # 127.0.0.1) whose every node runs the installed package's library
    run_cluster(venv_dir, run_dir, env)
    log('mxkv-launch -n 2 -s 1 ran a dist_sync job with the installed package')

    # without its library, the installed package says to reinstall the wheel, not to build
    os.remove(os.path.join(site, 'mxkv', 'libmxkv.so'))
    proc = subprocess.run([python, '-c', 'import mxkv'], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, env=env,
                          cwd=run_dir, timeout=RUN_TIMEOUT)
    assert proc.returncode != 0
    assert 'installed mxkv package' in proc.stderr and 'wheel' in proc.stderr, proc.stderr
    assert 'cargo' not in proc.stderr, proc.stderr
    # the installed mxkv-launch command needs neither numpy nor the library
    launch = subprocess.run([os.path.join(venv_dir, 'bin', 'mxkv-launch'), '--dry-run', '-n', '1',
                             '-s', '1', 'true'], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, env=env, cwd=run_dir, timeout=RUN_TIMEOUT)
    assert launch.returncode == 0, launch.stderr
    assert 'DMLC_ROLE=scheduler' in launch.stdout, launch.stdout
    return ours


def test_wheel_builds_installs_and_runs_the_tutorial():
    work = tempfile.mkdtemp(prefix='mxkv-wheel-')
    try:
        modules = package_modules()
        wheel = build_wheel(os.path.join(work, 'dist'))
        check_wheel(wheel, modules)
        check_installed(wheel, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('action', choices=['build', 'check'],
                        help='build: the wheel into --out; check: build, then install it '
                             'into a fresh venv in a temporary folder and run the tutorial')
    parser.add_argument('--out', default=os.path.join(REPO, 'build', 'wheel'))
    args = parser.parse_args(argv)
    modules = package_modules()
    wheel = build_wheel(os.path.abspath(args.out))
    check_wheel(wheel, modules)
    print('wheel: %s' % os.path.relpath(wheel))
    if args.action == 'check':
        work = tempfile.mkdtemp(prefix='mxkv-wheel-check-')
        try:
            check_installed(wheel, work, log=print)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print('wheel-check: %s installs into a fresh venv and runs the tutorial'
              % os.path.basename(wheel))


if __name__ == '__main__':
    main()
