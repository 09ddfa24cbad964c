"""Numpy scalars in the optimizer a real MXNet 1.9.1 worker sends.

``SGD(learning_rate=np.float32(0.5))`` on a dist store: MXNet pickles the numpy scalar as
``numpy.core.multiarray.scalar(numpy.dtype('f4', False, True), _codecs.encode(<bytes as
latin-1 text>, 'latin1'))`` and a real MXNet server loads it. Our server refused the
whole optimizer (a global it did not know) and went on without one: the worker's round
assigned the gradient sum instead of applying SGD (review probe p20_mixed_numpy_lr.py:
1.0 pulled where MXNet's server gives 0.5). ``loads`` now takes numpy bool, int and float
scalars (protocols 0 to 5) as the same numpy scalars, calling nothing by name, and still
refuses any other dtype, a wrong byte count, or another codec; a refusal is written to the
server's stderr, whatever logging does, saying that no optimizer was installed.
"""
import ast
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from test_dist import launch

REF_PYTHON = os.path.join(REPO, '.venv', 'bin', 'python')

MAKE = r'''
import pickle, sys
import numpy as np
import mxnet as mx
sched = mx.lr_scheduler.MultiFactorScheduler(step=[np.int64(2), 4], factor=np.float32(0.5),
                                             base_lr=np.float64(0.25))
opt = mx.optimizer.SGD(learning_rate=np.float32(0.5), momentum=np.float64(0.875),
                       wd=np.float16(0.125), rescale_grad=np.float32(0.25),
                       clip_gradient=np.int32(3), lazy_update=np.bool_(False),
                       param_idx2name={np.int64(0): 'w', 1: 'b'},
                       begin_num_update=np.uint8(2))
opt.set_lr_mult({'w': np.float32(2.0)})
opt2 = mx.optimizer.Adam(learning_rate=0.1, lr_scheduler=sched, beta1=np.float32(0.75))
bodies = [(name, proto, pickle.dumps(o, proto)) for name, o in (('sgd', opt), ('adam', opt2))
          for proto in range(6)]
%(typed)sstate = {'sgd': {k: typed(v) for k, v in vars(opt).items()
                 if k in ('lr', 'momentum', 'wd', 'rescale_grad', 'clip_gradient',
                          'lazy_update', 'begin_num_update')},
         'adam': {k: typed(v) for k, v in vars(opt2).items() if k == 'beta1'}}
state['sgd']['lr_mult'] = typed(opt.lr_mult['w'])
state['sgd']['idx2name keys'] = sorted(typed(k) for k in opt.idx2name)
state['adam']['sched'] = {k: typed(v) for k, v in vars(sched).items()
                          if k in ('factor', 'base_lr')}
state['adam']['step'] = [typed(v) for v in sched.step]
print(repr((bodies, state)))
'''
# a value's exact type and bits, named alike under numpy 1.23 (MXNet's) and numpy 2 (whose
# scalar reprs are np.float32(0.5) and whose np.bool_ is named 'bool')
TYPED = r'''
def typed(v):
    name = type(v).__name__
    if isinstance(v, np.generic):
        name = {'bool': 'bool_', 'longdouble': 'float128'}.get(name, name)
        return (type(v).__module__, name, v.tobytes().hex())
    return (type(v).__module__, name, repr(v))
'''
MAKE = MAKE % {'typed': TYPED}
exec(TYPED)  # pylint: disable=exec-used


@pytest.fixture(scope='module')
def mxnet_made():
    if not os.path.exists(REF_PYTHON):
        pytest.skip('no reference venv')
    env = {k: v for k, v in os.environ.items() if not k.startswith(('PYTHON', 'MXKV_'))}
    proc = subprocess.run([REF_PYTHON, '-c', MAKE], capture_output=True, text=True,
                          timeout=120, env=env)
    if proc.returncode != 0 and 'No module named' in proc.stderr:
        pytest.skip('mxnet is not installed in the reference venv')
    assert proc.returncode == 0, proc.stderr[-3000:]
    return ast.literal_eval(proc.stdout.strip().splitlines()[-1])


def _typed(v):
    return typed(v)  # pylint: disable=undefined-variable


def test_mxnet_pickles_with_numpy_scalars_load_as_the_same_scalars(mxkv, mxnet_made):
    from mxkv import _optimizer_pickle as op
    bodies, state = mxnet_made
    for name, proto, body in bodies:
        opt = op.loads(body)
        if name == 'sgd':
            assert type(opt) is mxkv.optimizer.SGD
            got = {k: _typed(getattr(opt, k)) for k in state['sgd'] if hasattr(opt, k)}
            got['lr_mult'] = _typed(opt.lr_mult['w'])
            got['idx2name keys'] = sorted(_typed(k) for k in opt.idx2name)
            assert got == state['sgd'], (proto, got)
            assert opt._get_lrs([0, 1]) == [1.0, 0.5]
        else:
            sched = opt.lr_scheduler
            assert type(sched) is mxkv.lr_scheduler.MultiFactorScheduler
            assert {'beta1': _typed(opt.beta1)} == {'beta1': state['adam']['beta1']}, proto
            assert {k: _typed(getattr(sched, k)) for k in ('factor', 'base_lr')} \
                == state['adam']['sched'], proto
            assert [_typed(v) for v in sched.step] == state['adam']['step'], proto


def _scalar_body(dtype_args, data, codec='latin1', state=(3, '<', None, None, None, -1, -1, 0)):
    """a protocol-0 SGD pickle whose lr is numpy.core.multiarray.scalar(dtype, data)"""
    import mxkv
    from mxkv import _optimizer_pickle as op
    body = op.dumps(mxkv.optimizer.SGD(learning_rate=0.125))
    scalar = (b'cnumpy.core.multiarray\nscalar\n(cnumpy\ndtype\n('
              + b''.join(b'V%s\n' % a.encode() if isinstance(a, str) else b'I%d\n' % a
                         for a in dtype_args)
              + b'tR(' + b''.join(b'N' if v is None else b'V%s\n' % v.encode()
                                  if isinstance(v, str) else b'I%d\n' % v for v in state)
              + b'tbc_codecs\nencode\n(V' + data.decode('latin1').encode('raw-unicode-escape')
              + b'\nV%s\ntRtR' % codec.encode())
    assert body.count(b'F0.125\n') == 1
    return body.replace(b'F0.125\n', scalar)


def test_the_numpy_scalar_forms_accepted_and_refused(mxkv):
    from mxkv import _optimizer_pickle as op
    good = op.loads(_scalar_body(['f4', 0, 1], np.float32(0.375).tobytes()))
    assert type(good.lr) is np.float32 and good.lr == 0.375
    big = op.loads(_scalar_body(['i8', 0, 1], np.array([7], '>i8').tobytes(),
                                state=(3, '>', None, None, None, -1, -1, 0)))
    assert type(big.lr) is np.int64 and big.lr == 7
    # numpy.str_ (UTF-32, NUL-padded) loads as the equal str, either byte order
    for order in '<>':
        text = op.loads(_scalar_body(['U3', 0, 1], np.array(['\u4e2dx'], order + 'U3').tobytes(),
                                     state=(3, order, None, None, None, 12, 4, 8)))
        assert type(text.lr) is str and text.lr == '\u4e2dx', order
    refused = [
        (_scalar_body(['c8', 0, 1], np.complex64(1).tobytes()), "dtype 'c8'"),
        (_scalar_body(['O', 0, 1], b'\0' * 8), "dtype 'O'"),
        (_scalar_body(['S1', 0, 1], b'a'), "dtype 'S1'"),
        (_scalar_body(['U1', 0, 1], b'\xff\xff\xff\x7f'), 'not UTF-32 text'),
        (_scalar_body(['U1', 0, 1], b'\0\xd8\0\0'), 'not UTF-32 text'),   # a surrogate
        (_scalar_body(['U2', 0, 1], b'a\0\0\0'), '4 bytes for a U2 string'),
        (_scalar_body(['U0', 0, 1], b''), "dtype 'U0'"),
        (_scalar_body(['f4', 0, 1], b'\0' * 8), '8 bytes for a float32 scalar of 4'),
        (_scalar_body(['f4', 1, 1], b'\0' * 4), 'numpy.dtype(code, False, True)'),
        (_scalar_body(['f4', 0, 1], b'\0' * 4, codec='rot13'), "_codecs.encode(text, "),
        (_scalar_body(['f4', 0, 1], b'\0' * 4, state=(3, '<', 'x', None, None, -1, -1, 0)),
         'not that of a scalar dtype'),
    ]
    for body, text in refused:
        with pytest.raises(op.RefusedPickleError) as err:
            op.loads(body)
        assert text in str(err.value), str(err.value)
    # a numpy array is not a scalar: its reconstructor is refused by name
    arr = pickle.dumps(np.zeros(3, np.float32), 0)
    sgd = op.dumps(mxkv.optimizer.SGD(learning_rate=0.125))
    with pytest.raises(op.RefusedPickleError) as err:
        op.loads(sgd.replace(b'F0.125\n', arr[:-1]))
    # (the module as this numpy writes it: numpy._core.multiarray under numpy 2)
    module = arr.split(b'\n', 1)[0][1:].decode()
    assert module in ('numpy.core.multiarray', 'numpy._core.multiarray'), arr
    assert err.value.global_name == module + '._reconstruct'
    # a scalar of an allowed type is still refused where MXNet holds a name
    opt = mxkv.optimizer.SGD()
    opt.idx2name = {0: np.float32(1)}
    with pytest.raises(op.RefusedPickleError, match=r'SGD\.idx2name\[0\] is a numpy\.float32'):
        op.loads(pickle.dumps(opt, 2))


WORKER = r'''
import os
if os.environ.get('DMLC_ROLE') != 'worker':
    import mxkv                      # our scheduler and server
    raise SystemExit(0)
import importlib.util
if importlib.util.find_spec('mxnet') is None and 'T_REEXEC' not in os.environ:
    # this interpreter (numpy 2, say) has no MXNet: the worker is the reference venv's
    ref = os.environ['T_REF_PYTHON']
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    env['T_REEXEC'] = '1'
    os.execve(ref, [ref, __file__], env)
import numpy as np
import mxnet as mx                   # a real MXNet 1.9.1 worker
kv = mx.kv.create('dist_sync')
lr = {'f32': np.float32(0.5), 'c64': np.complex64(0.5)}[os.environ['T_LR']]
kv.set_optimizer(mx.optimizer.SGD(learning_rate=lr))
kv.init(3, mx.nd.ones((4,)))
kv.push(3, mx.nd.ones((4,)))
out = mx.nd.zeros((4,))
kv.pull(3, out=out)
print('pulled %s' % out.asnumpy().tolist(), flush=True)
'''


@pytest.mark.parametrize('lr, pulled', [('f32', 0.5), ('c64', 1.0)])
def test_a_real_mxnet_worker_with_a_numpy_lr_on_our_server(tmp_path, mxnet_made, lr, pulled):
    """the worker runs the reference venv's MXNet 1.9.1 (numpy 1.23.5), our scheduler and
    server this interpreter (numpy 2 in a numpy-2 run: it used to run the worker here too,
    which failed on 'No module named mxnet')"""
    script = tmp_path / 'worker.py'
    script.write_text(WORKER)
    code, out = launch(str(script), 1, 1, {'T_LR': lr, 'PYTHONWARNINGS': 'ignore',
                                           'T_REF_PYTHON': REF_PYTHON},
                       timeout=60, node_timeout=30)
    assert code == 0, out
    # SGD applied: 1 - 0.5 * 1; refused: the sum of the pushes is assigned
    assert '[worker 0] pulled %s' % ([pulled] * 4) in out, out
    refusals = [line for line in out.splitlines() if line.startswith('[server 0] mxkv server 0 '
                                                                     'refused the optimizer')]
    if lr == 'f32':
        assert not refusals, out
    else:
        assert len(refusals) == 1, out
        assert "dtype 'c8' is not a bool, int, float or str" in refusals[0] \
            and 'No optimizer was installed from it' in refusals[0], out


MXKV_WORKER = r"""
import os
import numpy as np
import mxkv as mx
kv = mx.kv.create('dist_sync')
if os.environ.get('DMLC_ROLE') == 'worker':
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=np.float32(0.1),
                                      rescale_grad=np.float64(0.5)))
    kv.init(3, mx.nd.ones((4,)))
    kv.push(3, mx.nd.ones((4,)) * 4)
    out = mx.nd.zeros((4,))
    kv.pull(3, out=out)
    print('pulled %s' % out.asnumpy().tolist(), flush=True)
"""


def test_an_mxkv_worker_sends_numpy_hyper_parameters(tmp_path, mxkv):
    """np.float32(0.1) has bytes >= 0x80 (MXNet's own worker fails in py_str on them):
    ours sends them escaped, and our server applies SGD with lr 0.1 and rescale 0.5"""
    script = tmp_path / 'worker.py'
    script.write_text(MXKV_WORKER)
    code, out = launch(str(script), 1, 1, timeout=60, node_timeout=30)
    assert code == 0, out
    want = float(np.float32(1) - np.float32(0.1) * np.float32(2))
    assert '[worker 0] pulled %s' % ([want] * 4) in out, out
    assert 'refused' not in out, out
