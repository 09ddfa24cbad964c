"""``KVStore.load_optimizer_states`` of a file written by real MXNet 1.9.1.

MXNet's ``save_optimizer_states`` pickles its updater's states (and with
``dump_optimizer=True`` the optimizer) with its own classes (``mxnet.ndarray.ndarray.NDArray``
as ``NDArray(None)`` + ``{'handle': bytearray(MXNDArraySaveRawBytes)}``,
``mxnet.optimizer.optimizer.SGD``...). mxkv loaded it with a plain ``pickle.loads``: that
imported mxnet (where installed) and put MXNet NDArrays into mxkv's updater, whose next
update failed ('NDArray' object has no attribute '_arith_view'; review probe
p19_statex.py). The loader now maps MXNet's classes onto mxkv's without importing mxnet:
the arrays are read by the library's .params reader, the optimizers and schedulers are
mxkv's of the same name. The training continued from MXNet's file then gives MXNet's
weights bit for bit; an MXNet class mxkv has no counterpart for is refused, naming it.
"""
import ast
import json
import os
import subprocess
import sys

import pytest

from conftest import BINDINGS, REPO

REF_PYTHON = os.path.join(REPO, '.venv', 'bin', 'python')

# run by MXNet (save, then continue from its own file) and by mxkv (continue from MXNet's
# file); argv: lib, mode (save / resume), case, file
SCRIPT = r'''
import json, sys
import numpy as np
lib, mode, case, fname = sys.argv[1:5]
if lib == 'mxnet':
    import mxnet as mx
else:
    import mxkv as mx
nd = mx.nd
KEYS = ['w', 'b'] if case.endswith('str') else [0, 1]
SHAPES = [(3, 4), (4,)]


def opt():
    if case.startswith('sgd'):
        return mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.01)
    if case.startswith('adam'):
        return mx.optimizer.Adam(learning_rate=0.05, lr_scheduler=mx.lr_scheduler.FactorScheduler(
            step=2, factor=0.5, base_lr=0.05), beta1=0.8)
    return mx.optimizer.RMSProp(learning_rate=0.02, centered=True)


def grads(seed):
    rng = np.random.RandomState(seed)
    return [nd.array(rng.randn(*s).astype('float32')) for s in SHAPES]


kv = mx.kv.create('local')
rng = np.random.RandomState(0)
kv.init(KEYS, [nd.array(rng.randn(*s).astype('float32')) for s in SHAPES])
kv.set_optimizer(opt() if mode == 'save' or case.endswith('nodump') else mx.optimizer.SGD())
if mode == 'save':
    for step in range(3):
        kv.push(KEYS, grads(step))
    kv.save_optimizer_states(fname, dump_optimizer=not case.endswith('nodump'))
else:
    kv.load_optimizer_states(fname)
# both: set the weights MXNet had when it saved, then two more steps
outs = [nd.zeros(s) for s in SHAPES]
if mode == 'save':
    kv.pull(KEYS, out=outs)
    np.save(fname + '.w.npy', np.concatenate([o.asnumpy().ravel() for o in outs]))
else:
    flat = np.load(fname + '.w.npy')
    kv2 = kv
    kv2_vals, i = [], 0
    for s in SHAPES:
        n = int(np.prod(s))
        kv2_vals.append(nd.array(flat[i:i + n].reshape(s)))
        i += n
    kv = mx.kv.create('local')
    kv.init(KEYS, kv2_vals)
    kv._set_updater(kv2._updater)
for step in range(3, 5):
    kv.push(KEYS, grads(step))
kv.pull(KEYS, out=outs)
print(json.dumps({'weights': [o.asnumpy().ravel().tolist() for o in outs],
                  'bits': [o.asnumpy().view('uint32').ravel().tolist() for o in outs],
                  'mxnet imported': 'mxnet' in sys.modules}))
'''

CASES = ['sgd-int', 'sgd-str-nodump', 'adam-int', 'rmsprop-str']


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(('PYTHON', 'DMLC_'))}
    env['PYTHONPATH'] = BINDINGS
    env.setdefault('MXKV_LIBRARY_PATH', os.path.join(REPO, 'target', 'release', 'libmxkv.so'))
    return env


def _run(python, lib, mode, case, fname, tmp_path):
    proc = subprocess.run([python, '-c', SCRIPT, lib, mode, case, fname], cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=120, env=_env())
    return proc


@pytest.fixture(scope='module')
def ref():
    if not os.path.exists(REF_PYTHON):
        pytest.skip('no reference venv')
    proc = subprocess.run([REF_PYTHON, '-c', 'import mxnet'], capture_output=True, timeout=120)
    if proc.returncode != 0:
        pytest.skip('mxnet is not installed in the reference venv')
    return REF_PYTHON


@pytest.mark.parametrize('case', CASES)
def test_continuing_from_mxnets_states_file_gives_mxnets_weights(ref, tmp_path, case):
    fname = str(tmp_path / 'states')
    saved = _run(ref, 'mxnet', 'save', case, fname, tmp_path)
    assert saved.returncode == 0, saved.stderr[-3000:]
    theirs = json.loads(saved.stdout.strip().splitlines()[-1])
    ours = _run(sys.executable, 'mxkv', 'resume', case, fname, tmp_path)
    assert ours.returncode == 0, ours.stderr[-3000:]
    ours = json.loads(ours.stdout.strip().splitlines()[-1])
    assert ours['bits'] == theirs['bits'], (ours['weights'], theirs['weights'])
    assert ours['mxnet imported'] is False


def test_an_mxnet_class_without_a_counterpart_is_refused(ref, mxkv, tmp_path):
    code = ('import pickle, sys, mxnet as mx\n'
            'opt = mx.optimizer.Adam(learning_rate=0.1,\n'
            '                        lr_scheduler=mx.lr_scheduler.LRScheduler())\n'
            "kv = mx.kv.create('local')\n"
            "kv.init(0, mx.nd.ones((3,)))\n"
            'kv.set_optimizer(opt)\n'
            "kv.push(0, mx.nd.ones((3,)))\n"
            "kv.save_optimizer_states(sys.argv[1], dump_optimizer=True)\n"
            "kv.save_optimizer_states(sys.argv[1] + '.nodump')\n")
    fname = str(tmp_path / 'adam')
    proc = subprocess.run([ref, '-c', code, fname], capture_output=True, text=True,
                          timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    kv = mxkv.kv.create('local')
    kv.init(0, mxkv.nd.ones((3,)))
    kv.set_optimizer(mxkv.optimizer.SGD())
    # (the base class LRScheduler: every built-in optimizer has a counterpart now)
    with pytest.raises(mxkv.base.MXNetError, match=r'written by MXNet and holds a '
                       r'mxnet\.lr_scheduler\.LRScheduler, which mxkv has no counterpart'):
        kv.load_optimizer_states(fname)
    # an array record with a broken magic number: the library's reader refuses it
    data = open(fname + '.nodump', 'rb').read()
    assert data.count(b'\xc9\xfa\x93\xf9') == 2    # Adam's two states of key 0
    bad = str(tmp_path / 'bad')
    with open(bad, 'wb') as f:
        f.write(data.replace(b'\xc9\xfa\x93\xf9', b'\0\0\0\0', 1))
    with pytest.raises(mxkv.base.MXNetError, match='an MXNet NDArray in the file could not '
                       'be read'):
        kv.load_optimizer_states(bad)
    # the undamaged one loads (Adam's states, used by nothing here)
    kv.load_optimizer_states(fname + '.nodump')
    assert sorted(kv._updater.states) == [0]
    assert all(isinstance(a, mxkv.nd.NDArray) for a in kv._updater.states[0])


# row_sparse weights (lazy SGD: MXNet keeps row_sparse momentum states, pickled as
# mxnet.ndarray.sparse.RowSparseNDArray) and float16 weights with multi_precision (MXNet
# keeps a float32 master copy per key: (momentum, master copy) for SGD and NAG, (master
# copy, states) for the others)
SPARSE_MP = r'''
import json, sys
import numpy as np
lib, mode, case, fname = sys.argv[1:5]
if lib == 'mxnet':
    import mxnet as mx
else:
    import mxkv as mx
nd = mx.nd
KEYS = [0, 1]
SHAPES = [(6, 4), (5, 3)]
dt = 'float16' if case.startswith('mp') else 'float32'


def val(a):
    x = nd.array(a.astype(dt), dtype=dt)
    return x.tostype('row_sparse') if case == 'rsp' else x


def grads(seed):
    rng = np.random.RandomState(seed)
    out = []
    for s in SHAPES:
        g = rng.randn(*s).astype(dt)
        if case == 'rsp':
            g[::2] = 0          # rows 0, 2, 4 absent
        out.append(val(g))
    return out


def pulled(kv):
    outs = [val(np.zeros(s)) for s in SHAPES]
    for k, o in zip(KEYS, outs):
        if case == 'rsp':
            kv.row_sparse_pull(k, out=o, row_ids=nd.arange(0, o.shape[0], dtype='int64'))
        else:
            kv.pull(k, out=o)
    return np.concatenate([o.asnumpy().ravel() for o in outs])


kv = mx.kv.create('local')
rng = np.random.RandomState(0)
kv.init(KEYS, [val(rng.randn(*s)) for s in SHAPES])
if mode == 'save':
    if case == 'mp-nag':
        kv.set_optimizer(mx.optimizer.NAG(learning_rate=0.1, momentum=0.9, wd=0.01,
                                          multi_precision=True))
    elif case == 'mp-adam':
        kv.set_optimizer(mx.optimizer.Adam(learning_rate=0.05, multi_precision=True))
    elif case == 'mp-lamb':
        kv.set_optimizer(mx.optimizer.LAMB(learning_rate=0.05, wd=0.01, multi_precision=True))
    else:
        kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.01,
                                          multi_precision=case == 'mp'))
    for step in range(3):
        kv.push(KEYS, grads(step))
    kv.save_optimizer_states(fname, dump_optimizer=True)
    np.save(fname + '.w.npy', pulled(kv))
else:
    kv.set_optimizer(mx.optimizer.SGD())
    kv.load_optimizer_states(fname)
    flat, vals, i = np.load(fname + '.w.npy'), [], 0
    for s in SHAPES:
        vals.append(val(flat[i:i + int(np.prod(s))].reshape(s)))
        i += int(np.prod(s))
    kv2, kv = kv, mx.kv.create('local')
    kv.init(KEYS, vals)
    kv._set_updater(kv2._updater)
try:
    for step in range(3, 5):
        kv.push(KEYS, grads(step))
except Exception as err:
    print(json.dumps({'error': '%s: %s' % (type(err).__name__, err)}))
    raise SystemExit(0)
w = pulled(kv)
print(json.dumps({'bits': w.view('uint%d' % (w.itemsize * 8)).tolist()}))
'''


def _run_sparse_mp(python, lib, mode, case, fname, tmp_path):
    proc = subprocess.run([python, '-c', SPARSE_MP, lib, mode, case, fname],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=120,
                          env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_row_sparse_states_from_mxnet_continue_as_in_mxnet(ref, tmp_path):
    """refused before ('holds a mxnet.ndarray.sparse.RowSparseNDArray, which mxkv has no
    counterpart for'); the library's .params reader reads its raw record as a row_sparse
    array"""
    fname = str(tmp_path / 'rsp')
    theirs = _run_sparse_mp(ref, 'mxnet', 'save', 'rsp', fname, tmp_path)
    ours = _run_sparse_mp(sys.executable, 'mxkv', 'resume', 'rsp', fname, tmp_path)
    assert 'error' not in ours, ours
    assert ours['bits'] == theirs['bits']


@pytest.mark.parametrize('case', ['mp', 'mp-nag', 'mp-adam', 'mp-lamb'])
def test_multi_precision_states_from_mxnet_continue_as_in_mxnet(ref, tmp_path, case):
    """MXNet's float32 master copies and float32 states (and its optimizer, with
    multi_precision=True) loaded by mxkv: the training continues with MXNet's float16
    weights bit for bit (mxkv refused multi_precision before: MXKVUsageError)"""
    fname = str(tmp_path / case)
    theirs = _run_sparse_mp(ref, 'mxnet', 'save', case, fname, tmp_path)
    assert 'bits' in theirs, theirs
    ours = _run_sparse_mp(sys.executable, 'mxkv', 'resume', case, fname, tmp_path)
    assert ours == theirs
