"""``mxkv._optimizer_pickle``: the optimizer a dist worker sends to the servers.

* our ``dumps`` -> a real MXNet 1.9.1 server (a separate process running MXNet's own
  ``KVStoreServer._controller``, mxkv not importable there) -> the same class and
  hyper-parameters as the same optimizer built natively in MXNet, and MXNet's updater
  with it computes the same weights as mxkv's updater with ours;
* a real MXNet worker's body (``KVStore.set_optimizer`` on a dist store, in a separate
  process) -> our ``loads`` -> the mxkv class with the same hyper-parameters, and an mxkv
  updater with it computes what MXNet's updater computes, bit for bit;
* malicious pickles (protocols 0 to 5) are refused with an error naming the global, and
  a marker file shows nothing ran; ``test_malicious_payloads_are_live`` shows that each
  of them does run under a plain ``pickle.loads``.
"""
import ast
import builtins
import collections
import copyreg
import io
import os
import pickle
import pickletools
import shlex
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, assert_same_bits

REF_PYTHON = os.path.join(REPO, '.venv', 'bin', 'python')
TIMEOUT = 300
STEPS = 6

# Shared by this process (mxkv) and the reference processes (MXNet 1.9.1).
COMMON = r'''
import numpy as np

SHAPE = (3, 5)
KEYS = [0, 1]


def val(v):
    """a spec value: ('np', 'float32', 0.5) is np.float32(0.5) (specs cross processes as
    literals)"""
    if isinstance(v, tuple) and len(v) == 3 and v[0] == 'np':
        return getattr(np, v[1])(v[2])
    return v


def vals(d):
    return {val(k): val(v) for k, v in d.items()}


def make_opt(mx, spec):
    """the optimizer `spec` describes, built with library `mx` (and used for
    spec['pre_steps'] rounds, so that its counters and scheduler have moved)"""
    kwargs = vals(spec.get('kwargs', {}))
    if 'param_idx2name' in kwargs:
        kwargs['param_idx2name'] = vals(kwargs['param_idx2name'])
    if spec.get('sched'):
        name, skw = spec['sched']
        kwargs['lr_scheduler'] = getattr(mx.lr_scheduler, name)(**vals(skw))
    opt = mx.optimizer.create(spec['name'], **kwargs)
    if 'lr_mult' in spec:
        opt.set_lr_mult(vals(spec['lr_mult']))
    if 'wd_mult' in spec:
        opt.set_wd_mult(vals(spec['wd_mult']))
    if spec.get('pre_steps'):
        kv = mx.kv.create('local')
        kv.set_optimizer(opt)
        run_steps(mx, kv, 99, spec['pre_steps'])
    return opt


def run_steps(mx, kv, seed, steps):
    """weights of KEYS after each of `steps` push + pull rounds on a local store whose
    updater is already set"""
    rng = np.random.RandomState(seed)
    kv.init(KEYS, [mx.nd.array((rng.randn(*SHAPE) * 0.5).astype('float32')) for _ in KEYS])
    out = []
    for _ in range(steps):
        kv.push(KEYS, [mx.nd.array(rng.randn(*SHAPE).astype('float32')) for _ in KEYS])
        res = [mx.nd.zeros(SHAPE) for _ in KEYS]
        kv.pull(KEYS, out=res)
        out.append(np.stack([r.asnumpy() for r in res]))
    return np.stack(out)


# numpy 2 renamed these scalar types (np.bool_.__name__ is 'bool'...): a numpy-2 process
# and MXNet's (numpy 1.23) tag the same type alike
NP1_NAMES = {'bool': 'bool_', 'longdouble': 'float128', 'clongdouble': 'complex256'}


def plain(obj):
    """obj as nested literals, every scalar tagged with its exact type, objects as
    ('obj', class path, their __dict__)"""
    t = type(obj)
    if t in (bool, int, float, str, type(None)):
        return (t.__name__, obj)
    if isinstance(obj, str):       # numpy.str_: equal to the str, the same hash
        return ('str', str(obj))
    if isinstance(obj, np.generic):
        return ('numpy.' + NP1_NAMES.get(t.__name__, t.__name__), obj.tobytes())
    if t in (list, tuple):
        return (t.__name__, [plain(v) for v in obj])
    if t is dict:
        return ('dict', sorted((repr(plain(k)), plain(v)) for k, v in obj.items()))
    return ('obj', '%s.%s' % (t.__module__, t.__qualname__), plain(vars(obj)))


def shared_counts(opt):
    return opt._index_update_count is opt._all_index_update_counts[0]
'''
exec(COMMON)  # pylint: disable=exec-used

# MXNet's server: its own controller (kvstore_server.py) on a store, fed the body as
# MXNet's frontend passes it (py_str on the worker, c_str across the C API).
SERVE = COMMON + r'''
import ast, sys
sys.modules['mxkv'] = None          # a real MXNet server: mxkv cannot be imported
import mxnet as mx
from mxnet.kvstore.kvstore_server import KVStoreServer
results = {}
for case, body_file, spec in ast.literal_eval(open(sys.argv[1]).read()):
    try:
        body = open(body_file, 'rb').read()
        received = mx.base.c_str(mx.base.py_str(body)).value
        kv = mx.kv.create('local')
        KVStoreServer(kv)._controller()(0, received, None)
        opt = kv._updater.optimizer
        results[case] = {'intact': received == body, 'loaded': plain(opt),
                         'native': plain(make_opt(mx, spec)),
                         'shared_counts': shared_counts(opt)}
        np.save(body_file + '.npy', run_steps(mx, kv, 7, %(steps)d))
    except Exception as exc:
        results[case] = {'error': '%%s: %%s' %% (type(exc).__name__, exc)}
print(repr(results))
''' % {'steps': STEPS}

# MXNet's worker: KVStore.set_optimizer on a dist store sends what we capture here
# (the bytes that cross MXKVStoreSendCommmandToServers); then the same optimizer keeps
# training on a local store, for reference.
SEND = COMMON + r'''
import ast, sys
import mxnet as mx

class DistWorkerStore(mx.kvstore.KVStore):
    def __init__(self):  # no handle: only set_optimizer's dist branch runs
        self.sent = []
    type = property(lambda self: 'dist_sync')
    def _send_command_to_servers(self, head, body):
        self.sent.append((head, mx.base.c_str(body).value))
    def __del__(self):
        pass

results = {}
for case, out_file, spec in ast.literal_eval(open(sys.argv[1]).read()):
    opt = make_opt(mx, spec)
    store = DistWorkerStore()
    store.set_optimizer(opt)
    (head, body), = store.sent
    open(out_file, 'wb').write(body)
    results[case] = {'head': head, 'native': plain(opt)}
    kv = mx.kv.create('local')
    kv.set_optimizer(opt)
    np.save(out_file + '.npy', run_steps(mx, kv, 7, %(steps)d))
print(repr(results))
''' % {'steps': STEPS}

IDX2NAME = {0: 'fc1_weight', 1: 'fc1_bias'}
CASES = {
    'sgd-momentum-mults': {'name': 'sgd', 'kwargs': {
        'momentum': 0.9, 'learning_rate': 0.05, 'wd': 1e-4, 'rescale_grad': 0.125,
        'clip_gradient': 0.3, 'param_idx2name': IDX2NAME},
        'lr_mult': {'fc1_weight': 0.5}, 'wd_mult': {'fc1_weight': 3.0}},
    'sgd-factor': {'name': 'sgd', 'kwargs': {'wd': 0.01},
                   'sched': ('FactorScheduler', {'step': 2, 'factor': 0.7, 'base_lr': 0.1,
                                                 'stop_factor_lr': 0.02})},
    'sgd-cosine-resumed': {'name': 'sgd', 'kwargs': {'momentum': 0.8, 'begin_num_update': 2},
                           'sched': ('CosineScheduler', {
                               'max_update': 17, 'base_lr': 0.2, 'final_lr': 0.01,
                               'warmup_steps': 3, 'warmup_begin_lr': 0.001}),
                           'pre_steps': 4},
    'nag': {'name': 'nag', 'kwargs': {'momentum': 0.7, 'clip_gradient': 0.25,
                                      'rescale_grad': 0.5, 'wd': 1e-3}},
    'adam-multifactor': {'name': 'adam', 'kwargs': {'wd': 0.001, 'beta1': 0.8, 'beta2': 0.99,
                                                    'epsilon': 1e-6},
                         'sched': ('MultiFactorScheduler', {'step': [2, 4], 'factor': 0.5,
                                                            'base_lr': 0.01}),
                         'pre_steps': 3},
    'adagrad': {'name': 'adagrad', 'kwargs': {'learning_rate': 0.1, 'wd': 0.01, 'eps': 1e-6,
                                              'rescale_grad': 0.3, 'clip_gradient': 0.2}},
    'rmsprop': {'name': 'rmsprop', 'kwargs': {'learning_rate': 0.01, 'gamma1': 0.95,
                                              'wd': 0.001, 'clip_weights': 0.5}},
    'rmsprop-centered-poly': {'name': 'rmsprop', 'kwargs': {
        'centered': True, 'gamma2': 0.8, 'clip_gradient': 0.3, 'clip_weights': 0.9},
        'sched': ('PolyScheduler', {'max_update': 15, 'base_lr': 0.02, 'pwr': 2,
                                    'final_lr': 0.001})},
    'adadelta': {'name': 'adadelta', 'kwargs': {'rho': 0.8, 'epsilon': 1e-6, 'wd': 0.01,
                                                'rescale_grad': 0.7, 'clip_gradient': 0.15}},
    'signum': {'name': 'signum', 'kwargs': {'momentum': 0.8, 'wd_lh': 0.01,
                                            'clip_gradient': 0.5, 'rescale_grad': 0.9,
                                            'learning_rate': 0.02}},
    'signsgd': {'name': 'signum', 'kwargs': {'momentum': 0.0, 'wd': 0.1}},
    'test': {'name': 'test', 'kwargs': {'rescale_grad': 0.5}},
    # the optimizers added after the first eight (SGLD aside: its noise is not MXNet's)
    'ftrl': {'name': 'ftrl', 'kwargs': {'lamda1': 0.001, 'learning_rate': 0.3, 'wd': 0.01,
                                        'beta': 0.5, 'clip_gradient': 0.4}},
    'ftml-cosine': {'name': 'ftml', 'kwargs': {'beta1': 0.5, 'epsilon': 1e-6},
                    'sched': ('CosineScheduler', {'max_update': 17, 'base_lr': 0.05,
                                                  'final_lr': 0.01}),
                    'pre_steps': 2},
    'adamax': {'name': 'adamax', 'kwargs': {'wd': 0.01, 'clip_gradient': 0.3,
                                            'beta1': 0.8}},
    'nadam-resumed': {'name': 'nadam', 'kwargs': {'schedule_decay': 0.01,
                                                  'rescale_grad': 0.5},
                      'pre_steps': 3},
    'dcasgd': {'name': 'dcasgd', 'kwargs': {'lamda': 0.1, 'wd': 0.01, 'learning_rate': 0.1}},
    'lamb': {'name': 'lamb', 'kwargs': {'wd': 0.01, 'lower_bound': 0.5, 'upper_bound': 1.2},
             'pre_steps': 2},
    'lars-factor': {'name': 'lars', 'kwargs': {'momentum': 0.9, 'eta': 0.01, 'wd': 0.01},
                    'sched': ('FactorScheduler', {'step': 2, 'factor': 0.7, 'base_lr': 0.1}),
                    'pre_steps': 3},
    'lbsgd': {'name': 'lbsgd', 'kwargs': {'momentum': 0.9, 'batch_scale': 2,
                                          'warmup_strategy': 'power2', 'warmup_epochs': 1,
                                          'updates_per_epoch': 4}},
    'ccsgd': {'name': 'ccsgd', 'kwargs': {'momentum': 0.9, 'wd': 1e-3}},
    # names outside ASCII: MXNet's own worker cannot send these (its py_str fails on the
    # latin-1 byte protocol 0 writes for U+00E9), ours escapes them
    'sgd-unicode-names': {'name': 'sgd', 'kwargs': {
        'param_idx2name': {0: 'poids_\u00e9_weight', 1: '\u03b2\\n_bias\n'}, 'wd': 0.5},
        'wd_mult': {'poids_\u00e9_weight': 0.25}},
    # numpy scalars as hyper-parameters, multipliers and parameter indices; MXNet pickles
    # each as numpy.core.multiarray.scalar(numpy.dtype(code, False, True), its bytes as
    # latin-1 text). Here every byte is ASCII (0x00 becomes \u0000), so MXNet's worker
    # sends it too, and ours must be the same bytes
    'sgd-numpy-ascii': {'name': 'sgd', 'kwargs': {
        'learning_rate': ('np', 'float32', 0.5), 'momentum': ('np', 'float16', 0.125),
        'rescale_grad': ('np', 'float64', 2.0), 'clip_gradient': ('np', 'int64', 3),
        'lazy_update': ('np', 'bool_', False),
        'param_idx2name': {('np', 'int64', 0): 'fc1_weight', 1: 'fc1_bias'}},
        'lr_mult': {'fc1_weight': ('np', 'float32', 2.0)}},
    # ... and bytes >= 0x80 (np.float32(0.1) is cd cc cc 3d): MXNet's worker fails on
    # them (UnicodeDecodeError in py_str), ours escapes them as \u00cd, which a real
    # MXNet server reads back into the same scalar
    'sgd-numpy-latin1': {'name': 'sgd', 'kwargs': {
        'learning_rate': ('np', 'float32', 0.1), 'wd': ('np', 'float64', 0.001),
        'momentum': ('np', 'float32', 0.9)},
        'sched': ('FactorScheduler', {'step': ('np', 'int32', 2),
                                      'factor': ('np', 'float32', 0.7)})},
    # parameter names as numpy.str_ (names taken from a numpy array): MXNet pickles them
    # as numpy scalars of dtype U<n> (UTF-32 bytes: U+4E2D is 2d 4e 00 00, which MXNet's
    # py_str lets through), ours as the equal str
    'sgd-numpy-names': {'name': 'sgd', 'kwargs': {
        'learning_rate': 0.1, 'momentum': 0.5,
        'param_idx2name': {0: ('np', 'str_', 'fc1_weight'), 1: ('np', 'str_', 'fc1_b\u4e2d')}},
        'lr_mult': {('np', 'str_', 'fc1_weight'): 0.5},
        'wd_mult': {('np', 'str_', 'fc1_b\u4e2d'): 2.0}},
}
# MXNet's worker cannot pickle the non-ASCII cases (see above)
MXNET_SENDABLE = [c for c in CASES if c not in ('sgd-unicode-names', 'sgd-numpy-latin1')]


def _mx_path(path):
    """mxkv's class path as MXNet 1.9.1 names the class"""
    assert path.startswith(('mxkv.optimizer.optimizer.', 'mxkv.lr_scheduler.')), path
    return 'mxnet.' + path[len('mxkv.'):]


def _as_mxnet(tree):
    """plain() of an mxkv object, with MXNet's class paths"""
    if isinstance(tree, tuple) and tree and tree[0] == 'obj':
        return ('obj', _mx_path(tree[1]), _as_mxnet(tree[2]))
    if isinstance(tree, tuple):
        return tuple(_as_mxnet(v) for v in tree)
    if isinstance(tree, list):
        return [_as_mxnet(v) for v in tree]
    return tree


def _run_ref(script, arg, cwd):
    """run `script` with the reference interpreter (MXNet 1.9.1), isolated from this
    checkout; returns the literal it prints"""
    proc = subprocess.run([REF_PYTHON, '-I', '-c', script, arg], cwd=str(cwd),
                          capture_output=True, text=True, timeout=TIMEOUT,
                          env=_clean_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    return ast.literal_eval(proc.stdout.strip().splitlines()[-1])


def _clean_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(('PYTHON', 'MXKV_', 'DMLC_', 'PS_'))}
    # (MXNET_OPTIMIZER_AGGREGATION_SIZE as here, or unset as here: SGD and LARS default to
    # 4 and LAMB to 45 in both libraries)
    return env


@pytest.fixture(scope='module')
def ref_python():
    if not os.path.exists(REF_PYTHON):
        pytest.skip('no reference venv (make venv-ref)')
    proc = subprocess.run([REF_PYTHON, '-I', '-c', 'import mxnet'], capture_output=True,
                          timeout=TIMEOUT, env=_clean_env())
    if proc.returncode != 0:
        pytest.skip('mxnet 1.9.1 is not installed in the reference venv')
    return REF_PYTHON


@pytest.fixture(scope='module')
def op(mxkv):
    from mxkv import _optimizer_pickle
    return _optimizer_pickle


def _mxkv_steps(mxkv, opt):
    kv = mxkv.kv.create('local')
    kv.set_optimizer(opt)
    return run_steps(mxkv, kv, 7, STEPS)


# --- mxkv worker -> real MXNet server --------------------------------------------------
@pytest.fixture(scope='module')
def served(tmp_path_factory, ref_python, mxkv, op):
    """every case: our dumps, loaded by MXNet's server controller in one reference process"""
    work = tmp_path_factory.mktemp('served')
    jobs, bodies, trajectories, expected = [], {}, {}, {}
    for case, spec in CASES.items():
        opt = make_opt(mxkv, spec)
        expected[case] = plain(opt)
        try:
            body = op.dumps(opt)
        except op.UnsendableOptimizerError as err:   # that case fails, not the others
            bodies[case] = err
            continue
        assert expected[case] == plain(opt), 'dumps changed the optimizer'
        bodies[case] = body
        # the optimizer a server must end up with continues exactly like ours
        trajectories[case] = _mxkv_steps(mxkv, pickle.loads(pickle.dumps(opt)))
        path = str(work / (case + '.body'))
        with open(path, 'wb') as f:
            f.write(body)
        jobs.append((case, path, spec))
    with open(str(work / 'jobs'), 'w') as f:
        f.write(repr(jobs))
    results = _run_ref(SERVE, str(work / 'jobs'), work)
    for case, path, _ in jobs:
        if 'error' not in results[case]:
            results[case]['trajectory'] = np.load(path + '.npy')
    for case, body in bodies.items():
        if isinstance(body, Exception):
            results[case] = {'error': 'our dumps: %s' % body}
    return results, bodies, trajectories, expected


@pytest.mark.parametrize('case', list(CASES))
def test_dumps_loads_on_real_mxnet_server(served, case):
    results, bodies, trajectories, expected = served
    res = results[case]
    body = bodies[case]
    assert 'error' not in res, res.get('error')
    assert res['intact'], 'py_str/c_str changed the body on its way to the server'
    assert body.isascii() and b'\0' not in body
    # the class MXNet's server unpickled, and every attribute with its exact type
    top = res['loaded']
    assert top[0] == 'obj' and top[1] == 'mxnet.optimizer.optimizer.' + \
        {'sgd': 'SGD', 'nag': 'NAG', 'adam': 'Adam', 'adagrad': 'AdaGrad', 'rmsprop': 'RMSProp',
         'adadelta': 'AdaDelta', 'signum': 'Signum', 'test': 'Test', 'ftrl': 'Ftrl',
         'ftml': 'FTML', 'adamax': 'Adamax', 'nadam': 'Nadam', 'dcasgd': 'DCASGD',
         'lamb': 'LAMB', 'lars': 'LARS', 'lbsgd': 'LBSGD',
         'ccsgd': 'ccSGD'}[CASES[case]['name']]
    assert top == _as_mxnet(expected[case])
    # ... which is what MXNet itself builds from the same arguments
    assert top == res['native']
    assert res['shared_counts']
    # the same numbers: MXNet's updater with the loaded optimizer vs ours
    assert_same_bits(res['trajectory'], trajectories[case], case)


def test_dumps_is_mxnet_pickle_byte_for_byte(mxnet, mxkv, op):
    """stronger than needed: for these classes our body is byte-identical to
    pickle.dumps(the same MXNet optimizer, 0) (numpy.str_ names aside: ours are str)"""
    for case in MXNET_SENDABLE:
        if case == 'sgd-numpy-names':
            continue
        spec = dict(CASES[case], pre_steps=0)
        theirs = pickle.dumps(make_opt(mxnet, spec), 0)
        assert op.dumps(make_opt(mxkv, spec)) == theirs, case


def test_dumps_covers_every_builtin_class(mxnet, mxkv, op):
    """the tables name every built-in mxkv optimizer and lr scheduler, and each exists in
    MXNet 1.9.1 under the name dumps writes"""
    from mxkv.optimizer import optimizer as opt_mod
    builtin = {k.__name__ for k in opt_mod.Optimizer.opt_registry.values()
               if k.__module__ == opt_mod.__name__}
    assert set(op.OPTIMIZERS) == builtin
    scheds = {n for n, k in vars(mxkv.lr_scheduler).items() if isinstance(k, type)
              and issubclass(k, mxkv.lr_scheduler.LRScheduler)
              and k is not mxkv.lr_scheduler.LRScheduler}
    assert set(op.LR_SCHEDULERS) == scheds
    for name in op.OPTIMIZERS:
        klass = getattr(mxnet.optimizer.optimizer, name)
        assert klass.__module__ == 'mxnet.optimizer.optimizer'
        assert op.dumps(getattr(mxkv.optimizer, name)()).count(
            b'cmxnet.optimizer.optimizer\n%s\n' % name.encode()) == 1
    for name in op.LR_SCHEDULERS:
        assert getattr(mxnet.lr_scheduler, name).__module__ == 'mxnet.lr_scheduler'
    names = op.accepted_globals()
    assert 'mxnet.optimizer.optimizer.SGD' in names and 'mxkv.lr_scheduler.PolyScheduler' \
        in names and len(names) == 2 * (len(op.OPTIMIZERS) + len(op.LR_SCHEDULERS)) + 8
    # the reconstructor and object (Python 2 and 3 names), a numpy scalar's three globals
    assert {'copy_reg._reconstructor', 'builtins.object', 'numpy.core.multiarray.scalar',
            'numpy._core.multiarray.scalar', 'numpy.dtype', '_codecs.encode'} <= set(names)


def test_dumps_refuses_what_servers_refuse(mxkv, op):
    class MySGD(mxkv.optimizer.SGD):
        pass
    with pytest.raises(op.UnsendableOptimizerError, match='MySGD'):
        op.dumps(MySGD())
    # numpy bool, int and float scalars and numpy.str_ are sent (see 'sgd-numpy-*'); other
    # numpy values are not, as our servers refuse them
    # (the message names the type as the running numpy does: float128 / longdouble in 2.x)
    for value, name in ((np.complex64(1), 'complex64'),
                        (np.longdouble(0.5), type(np.longdouble(0.5)).__name__),
                        (np.bytes_(b'x'), 'bytes_'), (np.float32([0.5]), 'ndarray'),
                        (np.datetime64(1, 's'), 'datetime64')):
        with pytest.raises(op.UnsendableOptimizerError, match=r'SGD\.lr is a numpy\.%s' % name):
            op.dumps(mxkv.optimizer.SGD(learning_rate=value))
    opt = mxkv.optimizer.SGD()
    opt.set_lr_mult({np.complex64(1): 0.5})
    with pytest.raises(op.UnsendableOptimizerError, match=r'SGD\.lr_mult key .*complex64'):
        op.dumps(opt)
    opt = mxkv.optimizer.Adam()
    opt.set_lr_mult({'w': mxkv.lr_scheduler.FactorScheduler(step=2)})
    with pytest.raises(op.UnsendableOptimizerError, match='FactorScheduler'):
        op.dumps(opt)
    opt = mxkv.optimizer.NAG()
    opt.lr_scheduler = mxkv.optimizer.SGD()
    with pytest.raises(op.UnsendableOptimizerError, match='optimizer'):
        op.dumps(opt)
    with pytest.raises(op.UnsendableOptimizerError, match='builtins.dict'):
        op.dumps({'lr': 0.1})
    assert isinstance(op.UnsendableOptimizerError('x'), (pickle.PicklingError,
                                                         mxkv.base.MXNetError))


def test_dumps_of_an_mxnet_optimizer_object_says_what_can_be_sent(mxnet, op):
    """an MXNet optimizer object handed to mxkv's dist store: the refusal said 'mxkv or
    MXNet 1.9.1 classes' could be sent, and refused the MXNet class"""
    with pytest.raises(op.UnsendableOptimizerError) as err:
        op.dumps(mxnet.optimizer.SGD())
    text = str(err.value)
    assert text.startswith('cannot send optimizer mxnet.optimizer.optimizer.SGD to dist '
                           'servers: only the built-in optimizers of mxkv.optimizer '), text
    assert "nor another library's classes" in text and 'mxkv or MXNet' not in text, text


# --- real MXNet worker -> mxkv server --------------------------------------------------
@pytest.fixture(scope='module')
def sent(tmp_path_factory, ref_python):
    """every case: the body MXNet's worker sends, captured in one reference process"""
    work = tmp_path_factory.mktemp('sent')
    jobs = [(case, str(work / (case + '.body')), CASES[case]) for case in MXNET_SENDABLE]
    with open(str(work / 'jobs'), 'w') as f:
        f.write(repr(jobs))
    results = _run_ref(SEND, str(work / 'jobs'), work)
    for case, path, _ in jobs:
        with open(path, 'rb') as f:
            results[case]['body'] = f.read()
        results[case]['trajectory'] = np.load(path + '.npy')
    return results


@pytest.mark.parametrize('case', MXNET_SENDABLE)
def test_real_mxnet_pickle_loads_into_mxkv(sent, mxkv, op, case):
    res = sent[case]
    assert res['head'] == 0  # kController
    body = res['body']
    assert b'cmxnet.optimizer.optimizer\n' in body  # MXNet's names, not ours
    opt = op.loads(body)
    assert type(opt) is type(mxkv.optimizer.create(CASES[case]['name']))
    assert _as_mxnet(plain(opt)) == res['native']
    assert shared_counts(opt)
    assert_same_bits(res['trajectory'], _mxkv_steps(mxkv, opt), case)


def test_loads_accepts_every_protocol_and_mxkv_names(mxnet, mxkv, op):
    for case in ('sgd-factor', 'rmsprop-centered-poly', 'adam-multifactor'):
        spec = dict(CASES[case], pre_steps=0)
        want = plain(make_opt(mxkv, spec))
        for proto in range(pickle.HIGHEST_PROTOCOL + 1):
            for lib in (mxnet, mxkv):
                got = op.loads(pickle.dumps(make_opt(lib, spec), proto))
                assert plain(got) == want, (case, proto, lib.__name__)
    # the body as MXNet's frontend passes it (a str) is accepted too
    body = op.dumps(mxkv.optimizer.SGD(momentum=0.5))
    assert op.loads(body.decode()).momentum == 0.5


# --- malicious pickles -------------------------------------------------------------------
class _Reduce(object):
    """pickles as func(*args)"""
    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _touch_cmd(marker):
    return 'touch %s' % shlex.quote(str(marker))


def _py2(module, proto):
    """the module name protocols 0-2 write for a Python 3 module (fix_imports)"""
    return {'builtins': '__builtin__', 'subprocess': 'commands'}[module] if proto < 3 \
        else module


def _p_os_system(marker, proto, mx):
    return pickle.dumps(_Reduce(os.system, (_touch_cmd(marker),)), proto), \
        '%s.system' % os.system.__module__


def _p_eval(marker, proto, mx):
    src = "open(%r, 'w').close()" % str(marker)
    return pickle.dumps(_Reduce(builtins.eval, (src,)), proto), _py2('builtins', proto) + '.eval'


def _p_exec(marker, proto, mx):
    src = "open(%r, 'w').close()" % str(marker)
    return pickle.dumps(_Reduce(builtins.exec, (src,)), proto), _py2('builtins', proto) + '.exec'


def _p_getattr_import(marker, proto, mx):
    # getattr(__import__('os'), 'system')(cmd): a REDUCE whose callable is itself the
    # result of a REDUCE
    getsys = _Reduce(builtins.getattr, (_Reduce(builtins.__import__, ('os',)), 'system'))
    buf = io.BytesIO()
    pk = pickle._Pickler(buf, proto)  # pylint: disable=protected-access
    if proto >= 2:
        buf.write(pickle.PROTO + bytes((proto,)))
    pk.save(getsys)
    pk.save((_touch_cmd(marker),))
    buf.write(pickle.REDUCE + pickle.STOP)
    return buf.getvalue(), _py2('builtins', proto) + '.getattr'


def _p_popen(marker, proto, mx):
    return pickle.dumps(_Reduce(subprocess.Popen, (['touch', str(marker)],)), proto), \
        _py2('subprocess', proto) + '.Popen'


def _p_nested_mxkv_sgd(marker, proto, mx):
    import mxkv
    opt = mxkv.optimizer.SGD(momentum=0.9)
    opt.lr_mult = {'fc_weight': _Reduce(os.system, (_touch_cmd(marker),))}
    return pickle.dumps(opt, proto), '%s.system' % os.system.__module__


def _p_nested_mxnet_sgd(marker, proto, mx):
    opt = mx.optimizer.SGD(momentum=0.9)
    opt.idx2name = {0: _Reduce(os.system, (_touch_cmd(marker),))}
    return pickle.dumps(opt, proto), '%s.system' % os.system.__module__


def _p_scheduler_state(marker, proto, mx):
    sched = mx.lr_scheduler.FactorScheduler(step=2)
    sched.count = _Reduce(subprocess.Popen, (['touch', str(marker)],))
    return pickle.dumps(mx.optimizer.Adam(lr_scheduler=sched), proto), \
        _py2('subprocess', proto) + '.Popen'


def _p_reconstructor_popen(marker, proto, mx):
    # copyreg._reconstructor(Popen, Popen, args) runs Popen.__init__(obj, args)
    payload = _Reduce(copyreg._reconstructor,
                      (subprocess.Popen, subprocess.Popen, ['touch', str(marker)]))
    return pickle.dumps(payload, proto), _py2('subprocess', proto) + '.Popen'


def _p_reconstructor_foreign(marker, proto, mx):
    payload = _Reduce(copyreg._reconstructor, (collections.OrderedDict, object, None))
    return pickle.dumps(payload, proto), 'collections.OrderedDict'


def _stack_global(module, name):
    def s(text):
        raw = text.encode('utf-8')
        return pickle.SHORT_BINUNICODE + bytes((len(raw),)) + raw
    return s(module) + s(name) + pickle.STACK_GLOBAL


def _global(module, name, proto):
    if proto >= 4:
        return _stack_global(module, name)
    return pickle.GLOBAL + ('%s\n%s\n' % (module, name)).encode('utf-8')


def _call_str(func_bytes, arg, proto):
    head = pickle.PROTO + bytes((proto,)) if proto >= 2 else b''
    raw = arg.encode('utf-8')
    return head + func_bytes + pickle.MARK + pickle.BINUNICODE + struct.pack('<I', len(raw)) \
        + raw + pickle.TUPLE + pickle.REDUCE + pickle.STOP


def _p_attr_os_system(marker, proto, mx):
    # dotted names resolve through the module's own imports in protocol 4+:
    # mxnet.optimizer.optimizer imports os, so 'os.system' reaches os.system
    return _call_str(_global('mxnet.optimizer.optimizer', 'os.system', proto),
                     _touch_cmd(marker), proto), 'mxnet.optimizer.optimizer.os.system'


def _p_attr_optimizer_dict(marker, proto, mx):
    return _call_str(_global('mxnet.optimizer.optimizer', 'Optimizer.__dict__', proto),
                     'x', proto), 'mxnet.optimizer.optimizer.Optimizer.__dict__'


def _p_attr_mxkv_globals(marker, proto, mx):
    return _call_str(_global('mxkv.optimizer.optimizer', 'SGD.__init__.__globals__', proto),
                     'x', proto), 'mxkv.optimizer.optimizer.SGD.__init__.__globals__'


def _p_inst(marker, proto, mx):
    # protocol 0's INST calls the class with the marked arguments
    return pickle.MARK + pickle.UNICODE + _touch_cmd(marker).encode() + b'\n' + pickle.INST \
        + b'os\nsystem\n' + pickle.STOP, 'os.system'


PAYLOADS = {
    'os.system': _p_os_system,
    'builtins.eval': _p_eval,
    'builtins.exec': _p_exec,
    'getattr(__import__)': _p_getattr_import,
    'subprocess.Popen': _p_popen,
    'nested-in-mxkv-SGD': _p_nested_mxkv_sgd,
    'nested-in-mxnet-SGD': _p_nested_mxnet_sgd,
    'nested-in-lr-scheduler': _p_scheduler_state,
    'reconstructor-Popen': _p_reconstructor_popen,
    'reconstructor-foreign': _p_reconstructor_foreign,
    'attr-os.system': _p_attr_os_system,
    'attr-Optimizer.__dict__': _p_attr_optimizer_dict,
    'attr-__globals__': _p_attr_mxkv_globals,
}
# which of them run code under a plain pickle.loads (the others are refused lookups of
# harmless or nonexistent attributes, or need a protocol's dotted-name lookup)
LIVE = {name: range(6) for name in PAYLOADS
        if name not in ('reconstructor-foreign', 'attr-Optimizer.__dict__',
                        'attr-__globals__', 'attr-os.system')}
LIVE['attr-os.system'] = range(4, 6)


@pytest.mark.parametrize('proto', range(6))
@pytest.mark.parametrize('name', list(PAYLOADS))
def test_malicious_pickle_refused(mxnet, mxkv, op, tmp_path, name, proto):
    marker = tmp_path / 'marker'
    body, global_name = PAYLOADS[name](marker, proto, mxnet)
    with pytest.raises(op.RefusedPickleError) as err:
        op.loads(body)
    assert err.value.global_name == global_name
    assert global_name in str(err.value)
    assert isinstance(err.value, pickle.UnpicklingError)
    assert isinstance(err.value, mxkv.base.MXNetError)
    assert not marker.exists()


def test_inst_refused(mxkv, op, tmp_path):
    marker = tmp_path / 'marker'
    body, global_name = _p_inst(marker, 0, None)
    with pytest.raises(op.RefusedPickleError, match='os.system') as err:
        op.loads(body)
    assert err.value.global_name == global_name
    assert not marker.exists()


CONTROL = r'''
import ast, sys, os
for path in ast.literal_eval(open(sys.argv[1]).read()):
    try:
        obj = __import__('pickle').loads(open(path, 'rb').read())
        for o in (obj, getattr(obj, '__dict__', {}).get('lr_scheduler')):
            if hasattr(o, 'wait'):
                o.wait(60)
    except Exception as exc:  # a payload may fail after it ran; what counts is the marker
        print(path, type(exc).__name__, exc, file=sys.stderr)
print('[]')
'''


def test_malicious_payloads_are_live(mxnet, tmp_path):
    """control: a plain pickle.loads (what MXNet's server runs) does run every payload
    the refusal tests feed to loads, so their markers are meaningful"""
    paths, markers = [], []
    for name, protos in sorted(LIVE.items()):
        for proto in protos:
            marker = tmp_path / ('live %s-%d.marker' % (name, proto))
            body, _ = PAYLOADS[name](marker, proto, mxnet)
            path = str(tmp_path / ('%s-%d.pickle' % (name, proto)))
            with open(path, 'wb') as f:
                f.write(body)
            paths.append(path)
            markers.append(marker)
    marker = tmp_path / 'inst.marker'
    path = str(tmp_path / 'inst.pickle')
    with open(path, 'wb') as f:
        f.write(_p_inst(marker, 0, None)[0])
    paths.append(path)
    markers.append(marker)
    with open(str(tmp_path / 'jobs'), 'w') as f:
        f.write(repr(paths))
    env = _clean_env()
    env['PYTHONPATH'] = os.path.join(REPO, 'bindings', 'python')  # for mxkv's names
    proc = subprocess.run([sys.executable, '-c', CONTROL, str(tmp_path / 'jobs')],
                          cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=TIMEOUT, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    missing = [str(m) for m in markers if not m.exists()]
    assert not missing, (missing, proc.stderr[-4000:])


# --- structure refused -------------------------------------------------------------------
def _sgd_state_pickle(mxkv, **extra):
    opt = mxkv.optimizer.SGD()
    opt.__dict__.update(extra)
    return pickle.dumps(opt, 4)  # sets and bytes as opcodes, not as globals


def test_refused_structures(mxkv, op, tmp_path):
    cases = [
        # not an optimizer on top
        (pickle.dumps({'lr': 0.1}, 0), 'builtins.dict'),
        (pickle.dumps(mxkv.lr_scheduler.FactorScheduler(step=2), 0),
         'mxkv.lr_scheduler.FactorScheduler'),
        # unexpected / missing attributes: an instance attribute would shadow a method
        (_sgd_state_pickle(mxkv, update=1.0), 'mxkv.optimizer.optimizer.SGD'),
        (pickle.dumps(_without(mxkv.optimizer.Adam(), 'beta1'), 0),
         'mxkv.optimizer.optimizer.Adam'),
        # values that are not plain
        (_sgd_state_pickle(mxkv, lr_mult={'a': {1, 2}}), 'builtins.set'),
        (_sgd_state_pickle(mxkv, idx2name={0: b'w'}), 'builtins.bytes'),
        (_sgd_state_pickle(mxkv, lr_scheduler=mxkv.optimizer.NAG()),
         'mxkv.optimizer.optimizer.NAG'),
        (_sgd_state_pickle(mxkv, lr_mult={'w': mxkv.lr_scheduler.PolyScheduler(max_update=3)}),
         'mxkv.lr_scheduler.PolyScheduler'),
    ]
    # a whitelisted class called with arguments (REDUCE / NEWOBJ args / reconstructor base)
    cases.append((pickle.dumps(_Reduce(mxkv.optimizer.SGD, (0.9,)), 0),
                  'mxkv.optimizer.optimizer.SGD'))
    cases.append((pickle.dumps(_Reduce(copyreg._reconstructor,
                                       (mxkv.optimizer.SGD, mxkv.optimizer.SGD, 0.9)), 0),
                  'mxkv.optimizer.optimizer.SGD'))
    cases.append((b'\x80\x02cmxkv.optimizer.optimizer\nSGD\n(G?\xec\xcc\xcc\xcc\xcc\xcc\xcdt\x81.',
                  'mxkv.optimizer.optimizer.SGD'))
    # BUILD on something that is not an instance created here
    cases.append((b'(dp0\n(dVupdate\nI1\nsb.', 'builtins.dict'))
    # the state dict BUILD applies must have str keys
    body = op.dumps(mxkv.optimizer.SGD())
    head = body[:body.index(b'\n', body.index(b'\nRp') + 1) + 1]   # ... SGD object created
    cases.append((head + b'(dI1\nI2\nsb.', 'mxkv.optimizer.optimizer.SGD'))
    for body, name in cases:
        with pytest.raises(op.RefusedPickleError) as err:
            op.loads(body)
        assert err.value.global_name == name, (body, str(err.value))
        assert name in str(err.value)


def _without(opt, attr):
    del opt.__dict__[attr]
    return opt


def test_refused_opcodes_and_tricks(mxkv, op, tmp_path):
    sgd = op.dumps(mxkv.optimizer.SGD())
    # a scheduler whose attribute 'append' is another (callable) scheduler, then APPEND
    # onto it: pickle would call sched2(value)
    trick = (b'ccopy_reg\n_reconstructor\n(cmxnet.lr_scheduler\nFactorScheduler\n'
             b'c__builtin__\nobject\nNtRp0\n(dVappend\ng0\nsbI5\na.')
    with pytest.raises(op.RefusedPickleError,
                       match='APPEND on a mxkv.lr_scheduler.FactorScheduler'):
        op.loads(trick)
    # extension codes, persistent ids, out-of-band buffers
    copyreg.add_extension('posix', 'system', 240)
    try:
        body = pickle.dumps(_Reduce(os.system, ('true',)), 2)
        assert pickle.EXT1 + bytes((240,)) in body
        with pytest.raises(op.RefusedPickleError, match='posix.system') as err:
            op.loads(body)
        assert err.value.global_name == 'posix.system'
    finally:
        copyreg.remove_extension('posix', 'system', 240)
    with pytest.raises(op.RefusedPickleError, match='extension code 240'):
        op.loads(body)
    with pytest.raises(op.RefusedPickleError, match='persistent'):
        op.loads(b'Pos.system\n.')
    with pytest.raises(op.RefusedPickleError, match='out-of-band'):
        op.loads(pickle.PROTO + b'\x05' + pickle.NEXT_BUFFER + pickle.STOP)
    with pytest.raises(op.RefusedPickleError, match='not allowed'):
        op.loads(b'\xfe.')
    # OBJ calls the class: refused with its name, even for an allowed class
    with pytest.raises(op.RefusedPickleError, match=r'OBJ of mxnet\.optimizer\.optimizer\.SGD'):
        op.loads(b'(cmxnet.optimizer.optimizer\nSGD\nF0.9\no.')
    # truncated and garbage bodies
    for body in (sgd[:-7], sgd[:40], b'', b'\x80\x05garbage', b'I99999999999999999999' * 300):
        with pytest.raises(op.RefusedPickleError, match='refused'):
            op.loads(body)
    with pytest.raises(op.RefusedPickleError, match='not bytes'):
        op.loads(12)


def test_size_limit(mxkv, op, tmp_path):
    marker = tmp_path / 'marker'
    body = op.dumps(mxkv.optimizer.SGD())
    assert op.loads(body, max_bytes=len(body)).lr == 0.01
    with pytest.raises(op.RefusedPickleError, match='%d bytes' % len(body)):
        op.loads(body, max_bytes=len(body) - 1)
    evil = pickle.dumps(_Reduce(os.system, (_touch_cmd(marker),)), 0)
    evil = evil + b' ' * (op.MAX_BODY_BYTES + 1 - len(evil))
    with pytest.raises(op.RefusedPickleError, match='more than the limit'):
        op.loads(evil)
    assert not marker.exists()


def test_opcode_limit(mxkv, op):
    """one byte per empty list: a body within the size limit could make the server build
    millions of objects; loads stops at max_opcodes"""
    body = op.dumps(mxkv.optimizer.SGD(momentum=0.25))
    ops = len(list(pickletools.genops(body)))
    assert op.loads(body, max_opcodes=ops).momentum == 0.25
    with pytest.raises(op.RefusedPickleError, match='more than %d opcodes' % (ops - 1)):
        op.loads(body, max_opcodes=ops - 1)
    bomb = b'\x80\x02' + b']' * (op.MAX_BODY_BYTES - 3) + b'.'
    with pytest.raises(op.RefusedPickleError, match='more than %d opcodes' % op.MAX_OPCODES):
        op.loads(bomb)


def test_shared_structure_is_not_walked_exponentially(mxkv, op):
    """2**200 paths through 200 shared lists: refused at once (lr_mult holds numbers); and
    an accepted sym_info whose 2000 names share one attribute dict of 2000 entries is
    checked once per object, not once per path"""
    nested = []
    for _ in range(200):
        nested = [nested, nested]
    opt = mxkv.optimizer.SGD()
    opt.lr_mult = {'deep': nested}
    body = pickle.dumps(opt, 2)
    assert len(body) < 10000
    inner = {'k%d' % i: 'v' for i in range(2000)}
    opt = mxkv.optimizer.SGD()
    opt.sym_info = ({'p%d' % i: inner for i in range(2000)}, ['p%d' % i for i in range(2000)])
    shared = pickle.dumps(opt, 2)

    def alarm(*_):
        raise TimeoutError('loads walked the shared structure path by path')
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(30)
    try:
        with pytest.raises(op.RefusedPickleError, match=r"SGD\.lr_mult\['deep'\] is a "
                           r'builtins\.list') as err:
            op.loads(body)
        got = op.loads(shared)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert err.value.global_name == 'builtins.list'
    assert got.sym_info[0]['p0'] is got.sym_info[0]['p1999']


DEEP_KEY = r'''
import pickle, sys
depth = 900000  # within loads' default opcode limit
tuple_key = pickle.NONE + pickle.TUPLE1 * depth
bodies = {
    # a dict, a frozenset and a set whose key is a tuple nested 900000 deep
    'setitem': b'\x80\x02' + pickle.EMPTY_DICT + tuple_key + pickle.NONE + pickle.SETITEM
               + pickle.STOP,
    'dict': b'\x80\x02' + pickle.MARK + tuple_key + pickle.NONE + pickle.DICT + pickle.STOP,
    'frozenset': b'\x80\x04' + pickle.MARK + tuple_key + pickle.FROZENSET + pickle.STOP,
    'additems': b'\x80\x04' + pickle.EMPTY_SET + pickle.MARK + tuple_key + pickle.ADDITEMS
                + pickle.STOP,
}
body = bodies[sys.argv[2]]
if sys.argv[1] == 'plain':
    pickle.loads(body)
else:
    from mxkv import _optimizer_pickle as op
    try:
        op.loads(body)
    except op.RefusedPickleError as err:
        print(err.global_name)
'''


@pytest.mark.parametrize('how', ['setitem', 'dict', 'frozenset', 'additems'])
def test_deeply_nested_key_refused_not_crashing(ref_python, tmp_path, how):
    """hashing a tuple nested 900000 deep overflows the C stack: a plain pickle.loads (what
    MXNet's server runs) dies of SIGSEGV; loads refuses the key before hashing it"""
    env = _clean_env()
    env['PYTHONPATH'] = os.path.join(REPO, 'bindings', 'python')
    runs = {}
    for mode in ('plain', 'ours'):
        runs[mode] = subprocess.run([sys.executable, '-c', DEEP_KEY, mode, how],
                                    cwd=str(tmp_path), capture_output=True, text=True,
                                    timeout=TIMEOUT, env=env)
    assert runs['plain'].returncode == -signal.SIGSEGV, runs['plain']
    assert runs['ours'].returncode == 0, runs['ours'].stderr[-3000:]
    assert runs['ours'].stdout.split() == ['builtins.tuple']


def test_disassembly_of_mxnet_pickles_needs_only_these_globals(mxnet, op):
    """what MXNet 1.9.1's own pickles of the built-in classes contain (protocols 0 to 5):
    the classes, copyreg._reconstructor and object (protocols 0, 1), nothing else"""
    seen = set()
    for case in MXNET_SENDABLE:
        spec = dict(CASES[case], pre_steps=0)
        for proto in range(6):
            ops = list(pickletools.genops(pickle.dumps(make_opt(mxnet, spec), proto)))
            strings = []
            for code, arg, _ in ops:
                if code.name == 'GLOBAL':
                    seen.add(arg.replace(' ', '.'))
                elif code.name == 'STACK_GLOBAL':
                    seen.add('%s.%s' % tuple(strings[-2:]))
                elif isinstance(arg, str) and code.name != 'MEMOIZE':
                    strings.append(arg)
                assert code.name not in ('INST', 'OBJ', 'EXT1', 'EXT2', 'EXT4', 'PERSID',
                                         'BINPERSID', 'NEXT_BUFFER'), code.name
    assert seen <= set(op.accepted_globals())
    assert {'copy_reg._reconstructor', '__builtin__.object',
            'mxnet.optimizer.optimizer.SGD', 'mxnet.lr_scheduler.CosineScheduler'} <= seen
