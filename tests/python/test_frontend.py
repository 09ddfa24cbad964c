"""MXNet's own Python KVStore frontends, loaded unmodified on top of mxkv.

* 1.9.1: ``mxnet/kvstore/base.py`` and ``mxnet/kvstore/kvstore.py`` from the
  installed mxnet==1.9.1 wheel (the venv's site-packages);
* 1.0.0: ``mxnet/kvstore.py`` from the mxnet==1.0.0 wheel, fetched with
  ``pip download --no-deps mxnet==1.0.0`` into $MXKV_CACHE (default <repo>/.cache)
  when it is not there yet.

Each file's bytes are executed as they are, inside a synthetic package whose
``base``, ``ndarray``, ``optimizer`` and ``profiler`` modules are mxkv's (so
``_LIB`` is the library under test).  Every dense docstring example of
``KVStore`` and the tutorial then run through it, and their transcript (what
they print, and which statements raise) must equal real MXNet's.
"""
import glob
import importlib.util
import io
import os
import re
import subprocess
import sys
import types
import zipfile
from contextlib import redirect_stdout

import pytest

from conftest import CACHE, REPO

SEED_TUTORIAL = os.path.join(REPO, 'examples', 'tutorial.py')


# --- loading the frontends ----------------------------------------------------------
def _mxnet_191_sources():
    spec = importlib.util.find_spec('mxnet')
    if spec is None:
        pytest.skip('mxnet==1.9.1 is not installed')
    root = os.path.dirname(spec.origin)
    return {'kvstore/base.py': os.path.join(root, 'kvstore', 'base.py'),
            'kvstore/kvstore.py': os.path.join(root, 'kvstore', 'kvstore.py')}


def _mxnet_100_kvstore_source():
    os.makedirs(CACHE, exist_ok=True)
    wheels = glob.glob(os.path.join(CACHE, 'mxnet-1.0.0-*.whl'))
    if not wheels:
        cmd = [sys.executable, '-m', 'pip', 'download', '--no-deps', '--only-binary=:all:',
               'mxnet==1.0.0', '-d', CACHE]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=600)
        wheels = glob.glob(os.path.join(CACHE, 'mxnet-1.0.0-*.whl'))
        if not wheels:
            pytest.skip('could not download mxnet==1.0.0: %s' % proc.stdout[-500:])
    with zipfile.ZipFile(wheels[0]) as zf:
        return zf.read('mxnet/kvstore.py')


def _exec_module(fullname, source_bytes, filename):
    module = types.ModuleType(fullname)
    module.__file__ = filename
    module.__package__ = fullname.rpartition('.')[0]
    sys.modules[fullname] = module
    exec(compile(source_bytes, filename, 'exec'), module.__dict__)  # pylint: disable=exec-used
    return module


def _package(name, mxkv):
    pkg = types.ModuleType(name)
    pkg.__path__ = []
    sys.modules[name] = pkg
    for sub in ('base', 'ndarray', 'optimizer', 'profiler'):
        mod = getattr(mxkv, sub)
        sys.modules['%s.%s' % (name, sub)] = mod
        setattr(pkg, sub, mod)
    return pkg


def load_frontend_191(mxkv):
    """-> module with create() and KVStore, from 1.9.1's unmodified files"""
    srcs = _mxnet_191_sources()
    pkg = _package('mxkv_fe191', mxkv)
    kvpkg = types.ModuleType('mxkv_fe191.kvstore')
    kvpkg.__path__ = []
    kvpkg.__package__ = 'mxkv_fe191.kvstore'
    sys.modules['mxkv_fe191.kvstore'] = kvpkg
    pkg.kvstore = kvpkg
    with open(srcs['kvstore/base.py'], 'rb') as fin:
        base = _exec_module('mxkv_fe191.kvstore.base', fin.read(), srcs['kvstore/base.py'])
    with open(srcs['kvstore/kvstore.py'], 'rb') as fin:
        kvs = _exec_module('mxkv_fe191.kvstore.kvstore', fin.read(), srcs['kvstore/kvstore.py'])
    kvpkg.base, kvpkg.kvstore = base, kvs
    kvpkg.create, kvpkg.KVStore, kvpkg.KVStoreBase = base.create, kvs.KVStore, base.KVStoreBase
    assert base._LIB is mxkv.base._LIB
    return kvpkg


def load_frontend_100(mxkv):
    src = _mxnet_100_kvstore_source()
    _package('mxkv_fe100', mxkv)
    return _exec_module('mxkv_fe100.kvstore', src, 'mxnet-1.0.0/mxnet/kvstore.py')


def _namespace(nd, kvmod, mxmod):
    """an `mx` for the examples: gpu(i) is cpu(i) (the CPU builds have no GPU)"""
    return types.SimpleNamespace(kv=kvmod, kvstore=kvmod, nd=nd, ndarray=nd, cpu=mxmod.cpu,
                                 gpu=mxmod.cpu, Context=mxmod.Context,
                                 optimizer=mxmod.optimizer, base=mxmod.base)


# --- docstring examples -----------------------------------------------------------------
def docstring_examples(kvstore_cls):
    """The ``>>>`` statements (dense and row_sparse) of every KVStore method docstring, in
    file order, with Python 2 ``print x`` turned into ``print(x)``."""
    methods = [m for m in vars(kvstore_cls).values() if callable(m) or isinstance(m, property)]
    methods.sort(key=lambda m: (m.fget if isinstance(m, property) else m).__code__.co_firstlineno)
    stmts = []
    for meth in methods:
        doc = (meth.fget if isinstance(meth, property) else meth).__doc__ or ''
        cur = None
        for line in doc.split('\n'):
            s = line.strip()
            if s.startswith('>>> '):
                if cur is not None:
                    stmts.append(cur)
                cur = [s[4:]]
            elif s.startswith('...') and cur is not None:
                cur.append(s[4:] if s.startswith('... ') else s[3:])
            else:
                if cur is not None:
                    stmts.append(cur)
                cur = None
        if cur is not None:
            stmts.append(cur)
    out = []
    for lines in stmts:
        text = '\n'.join(re.sub(r'^(\s*)print (.*)$', r'\1print(\2)', ln) for ln in lines)
        if all(not ln.strip() or ln.strip().startswith('#') for ln in text.split('\n')):
            continue  # comment-only lines
        if '@mx.kvstore' in text or 'class MyKVStore' in text:
            continue  # custom KVStoreBase subclasses: not KVStore examples
        out.append(text)
    return out


def run_transcript(statements, mx):
    """exec each statement; the transcript is what it prints plus which ones raise"""
    env = {'mx': mx}
    buf = io.StringIO()
    with redirect_stdout(buf):
        for stmt in statements:
            try:
                code = compile(stmt, '<example>', 'single')
                exec(code, env)  # pylint: disable=exec-used
            except Exception as err:  # pylint: disable=broad-except
                print('!! %s raised %s' % (stmt.split('\n')[0], type(err).__name__))
    return buf.getvalue()


def _real_mxnet_ns():
    import mxnet
    return _namespace(mxnet.nd, mxnet.kv, mxnet)


@pytest.fixture(scope='module')
def fe191(mxkv):
    return load_frontend_191(mxkv)


@pytest.fixture(scope='module')
def fe100(mxkv):
    return load_frontend_100(mxkv)


def test_191_files_are_used_unmodified(fe191):
    srcs = _mxnet_191_sources()
    for rel, path in srcs.items():
        mod = fe191.base if rel.endswith('base.py') else fe191.kvstore
        assert mod.__file__ == path
    assert 'PullWithSparse' in open(srcs['kvstore/kvstore.py']).read()


def test_191_docstring_examples(fe191, mxkv, mxnet):
    stmts = docstring_examples(fe191.KVStore)
    assert len(stmts) > 20
    expected = run_transcript(stmts, _real_mxnet_ns())
    got = run_transcript(stmts, _namespace(mxkv.nd, fe191, mxkv))
    print(got)
    assert got == expected


def _method_examples(kvstore_cls, name):
    return docstring_examples(type('One', (), {name: vars(kvstore_cls)[name]}))


# run in a fresh namespace, so that earlier examples of the file do not interfere (in file
# order, '3' is a dense key by the time row_sparse_pull's examples use it)
_SPARSE_PRELUDE = ["kv = mx.kv.create('local')", 'shape = (2, 3)', 'a = mx.nd.zeros(shape)']


@pytest.mark.parametrize('method', ['init', 'push', 'row_sparse_pull'])
def test_191_row_sparse_examples_in_a_fresh_store(fe191, mxkv, mxnet, method):
    stmts = _method_examples(fe191.KVStore, method)
    assert any('sparse' in st for st in stmts)
    prelude = list(_SPARSE_PRELUDE)
    if method == 'push':  # the keys push's examples expect to exist
        prelude.append("kv.init([str(i) for i in range(3, 10)], [mx.nd.zeros(shape)] * 7)")
    stmts = prelude + stmts
    expected = run_transcript(stmts, _real_mxnet_ns())
    got = run_transcript(stmts, _namespace(mxkv.nd, fe191, mxkv))
    print(got)
    assert got == expected
    assert '!!' not in got
    if method == 'row_sparse_pull':   # the documented results
        assert got.endswith('[[1. 1. 1.]\n [0. 0. 0.]\n [1. 1. 1.]]\n'
                            '[[0. 0. 0.]\n [0. 0. 0.]\n [1. 1. 1.]]\n'
                            '[[1. 1. 1.]\n [1. 1. 1.]\n [0. 0. 0.]]\n')
    else:
        assert got.endswith('\n<RowSparseNDArray 2x3 @cpu(0)>\n')


_COMPRESSION_STATEMENTS = [
    "kv = mx.kv.create('device')",
    "kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})",
    "kv.init(3, mx.nd.zeros((4,)))",
    "a = mx.nd.zeros((4,))",
    "for _ in range(3):\n"
    "    kv.push(3, [mx.nd.array([0.3, 0.6, -0.7, 1.2], ctx=mx.gpu(i)) for i in range(2)])\n"
    "    kv.pull(3, out=a)\n"
    "    print(a.asnumpy())",
    "kv.set_gradient_compression({'type': '2bit', 'threshold': 2})",
    "kv.push(3, mx.nd.array([2.5, 1.9, -2, 0]))",
    "kv.pull(3, out=a)",
    "print(a.asnumpy())",
    "kv.set_gradient_compression({'threshold': 0.5})",
    "kv.set_gradient_compression({'type': 'foo'})",
    "kv.set_gradient_compression({'type': '2bit', 'threshold': 0})",
    "kv.set_gradient_compression({'type': '2bit', 'threshold': 'abc'})",
    "mx.kv.create('local').set_gradient_compression({'type': '2bit'})",
]


def test_191_gradient_compression_through_frontend(fe191, mxkv, mxnet):
    """1.9.1's set_gradient_compression has no docstring example: these statements use it
    through the unmodified frontend (its own Exception for a local store included)"""
    expected = run_transcript(_COMPRESSION_STATEMENTS, _real_mxnet_ns())
    got = run_transcript(_COMPRESSION_STATEMENTS, _namespace(mxkv.nd, fe191, mxkv))
    print(got)
    assert got == expected
    assert got.count('raised MXNetError') == 4 and got.endswith('raised Exception\n')


def test_191_sparse_examples_are_included(fe191):
    stmts = docstring_examples(fe191.KVStore)
    assert sum('row_sparse' in st for st in stmts) >= 8


def test_100_docstring_examples(fe100, mxkv, mxnet):
    stmts = docstring_examples(fe100.KVStore)
    assert len(stmts) > 10
    expected = run_transcript(stmts, _real_mxnet_ns())
    got = run_transcript(stmts, _namespace(mxkv.nd, fe100, mxkv))
    print(got)
    assert got == expected


def _tutorial_statements():
    with open(SEED_TUTORIAL) as fin:
        src = fin.read()
    body = src.split("    import mxkv as mx\n", 1)[1]
    return [body]


def _run_tutorial(mx):
    env = {'mx': mx}
    buf = io.StringIO()
    with redirect_stdout(buf):
        exec(compile(_tutorial_statements()[0], SEED_TUTORIAL, 'exec'), env)  # pylint: disable=exec-used
    return buf.getvalue()


@pytest.mark.parametrize('version', ['1.9.1', '1.0.0'])
def test_tutorial_through_unmodified_frontend(version, mxkv, mxnet, fe191, fe100):
    front = fe191 if version == '1.9.1' else fe100
    expected = _run_tutorial(_real_mxnet_ns())
    got = _run_tutorial(_namespace(mxkv.nd, front, mxkv))
    assert got == expected
    assert 'update on key: 9' in got


def test_100_frontend_calls_pull_not_pullwithsparse(fe100):
    src = _mxnet_100_kvstore_source().decode()
    assert 'MXKVStorePullWithSparse' not in src and 'MXKVStorePull(' in src
