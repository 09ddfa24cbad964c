"""``mxkv._optimizer_pickle.loads``: what each attribute of a loaded optimizer may hold.

A body made only of allowed opcodes and classes could still put a tuple nested 400000 deep,
or a DAG of 64 levels of shared tuples (t_k = (t_{k-1}, t_{k-1}), a few hundred bytes), where
MXNet's optimizer holds a parameter name (``idx2name`` values). The server hashes that value
on its first update of the key (``Optimizer._get_lrs``): CPython's tuple hash has no depth
check (SIGSEGV) and does not cache (2^64 steps). ``loads`` now requires every attribute to
hold what MXNet 1.9.1's class holds there (names str, multipliers numbers, counters ints,
other attributes scalars, ``sym_info`` () or (attribute dict, argument names)) and refuses
anything else with the attribute's path; MXNet-made pickles, with a Symbol's ``sym_info``
too, still load.

The refused bodies run in a child process: before the fix its ``_get_lrs`` crashed or spun.
"""
import os
import subprocess
import sys

import pytest

from conftest import BINDINGS, REPO
from test_dist import launch

REF_PYTHON = os.path.join(REPO, '.venv', 'bin', 'python')

BODIES = r'''
import sys
from mxkv import _optimizer_pickle as op
import mxkv as mx


def with_idx2name_value(text):
    """SGD's pickle whose idx2name[3] is the protocol-0 text `text`"""
    opt = mx.optimizer.SGD(learning_rate=0.1)
    opt.idx2name = {3: 'PLACEHOLDER'}
    body = op.dumps(opt)
    assert b'VPLACEHOLDER\n' in body
    return body.replace(b'VPLACEHOLDER\n', text)


def nested(depth=400000):
    return with_idx2name_value(b'(' * depth + b')' + b't' * depth)


def dag(levels=64):
    # EMPTY_TUPLE, then `levels` times: POP it (it stays in memo 9999), (t, t) of it; ASCII
    return with_idx2name_value(b')p9999\n' + b'0(g9999\ng9999\ntp9999\n' * levels)
'''

CHILD = BODIES + r'''
import signal
body = {'nested': nested, 'dag': dag}[sys.argv[1]]()
try:
    opt = op.loads(body)
except op.RefusedPickleError as err:
    print('REFUSED %s | %s' % (err.global_name, err))
    sys.exit(0)
print('ACCEPTED', flush=True)
signal.alarm(10)
opt._get_lrs([3])
print('HASHED')
'''


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(('PYTHON', 'DMLC_'))}
    env['PYTHONPATH'] = BINDINGS
    env.setdefault('MXKV_LIBRARY_PATH', os.path.join(REPO, 'target', 'release', 'libmxkv.so'))
    return env


@pytest.mark.parametrize('shape', ['nested', 'dag'])
def test_an_idx2name_value_that_is_not_a_name_is_refused(tmp_path, shape):
    proc = subprocess.run([sys.executable, '-c', CHILD, shape], cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert proc.stdout.startswith(
        "REFUSED builtins.tuple | optimizer pickle refused: SGD.idx2name[3] is a "
        "builtins.tuple; MXNet's optimizer holds a str (a parameter name) there"), proc.stdout


def test_attribute_shapes(mxkv):
    import pickle
    from mxkv import _optimizer_pickle as op

    def body(**state):
        opt = mxkv.optimizer.SGD()
        opt.__dict__.update(state)
        return pickle.dumps(opt, 2)
    refused = [
        (dict(idx2name={0: 7}), 'builtins.int', 'SGD.idx2name[0]'),
        (dict(idx2name=[('a', 'b')]), 'builtins.list', 'SGD.idx2name is'),
        (dict(lr_mult={'w': 'x'}), 'builtins.str', "SGD.lr_mult['w']"),
        (dict(lr_mult={'w': (1.0,)}), 'builtins.tuple', "SGD.lr_mult['w']"),
        (dict(wd=(0.1, 0.2)), 'builtins.tuple', 'SGD.wd is'),
        (dict(lr=[0.1]), 'builtins.list', 'SGD.lr is'),
        (dict(_index_update_count={0: 1.5}), 'builtins.float', 'SGD._index_update_count[0]'),
        (dict(_all_index_update_counts={0: []}), 'builtins.list',
         'SGD._all_index_update_counts[0]'),
        (dict(sym_info=({}, [], [])), 'builtins.tuple', 'SGD.sym_info'),
        (dict(sym_info=({'w': {'k': 1}}, ['w'])), 'builtins.int', "SGD.sym_info[0]['w']['k']"),
        (dict(sym_info=({}, [('w',)])), 'builtins.tuple', 'SGD.sym_info[1][0]'),
    ]
    for state, name, where in refused:
        with pytest.raises(op.RefusedPickleError) as err:
            op.loads(body(**state))
        assert err.value.global_name == name, (state, str(err.value))
        assert where in str(err.value), (state, str(err.value))
    # a scheduler's list attribute holds numbers, its others scalars
    opt = mxkv.optimizer.SGD(lr_scheduler=mxkv.lr_scheduler.MultiFactorScheduler(step=[2, 4]))
    opt.lr_scheduler.step = [2, (4,)]
    with pytest.raises(op.RefusedPickleError, match=r'MultiFactorScheduler\.step\[1\] is a '
                       r'builtins\.tuple'):
        op.loads(pickle.dumps(opt, 0))
    opt.lr_scheduler.step = [2, 4]
    opt.lr_scheduler.factor = {'a': 1}
    with pytest.raises(op.RefusedPickleError, match=r'MultiFactorScheduler\.factor is a '
                       r'builtins\.dict'):
        op.loads(pickle.dumps(opt, 0))
    # accepted: what MXNet's optimizers hold, shared dicts walked once
    inner = {'__lr_mult__': '2.0'}
    attrs = {'p%d' % i: inner for i in range(3000)}
    good = op.loads(body(idx2name={0: 'w', 1: 'b'}, lr_mult={'w': 2, 0: 0.5},
                         sym_info=(attrs, ['p%d' % i for i in range(3000)]),
                         _index_update_count={0: 3, 'w': True}))
    assert good.idx2name == {0: 'w', 1: 'b'} and good.lr_mult == {'w': 2, 0: 0.5}
    assert good.sym_info[0]['p0'] is good.sym_info[0]['p2999']
    assert good._get_lrs([0, 1, 'w']) == [0.005, 0.01, 0.02]


def test_an_mxnet_optimizer_built_on_a_symbol_loads(mxkv, tmp_path):
    """Module's optimizer: sym_info = (attr_dict, list_arguments), idx2name int -> name"""
    if not os.path.exists(REF_PYTHON):
        pytest.skip('no reference venv')
    code = ('import pickle, sys, mxnet as mx\n'
            "w = mx.sym.Variable('fc1_weight', lr_mult=2.0, wd_mult=0.5)\n"
            "net = mx.sym.FullyConnected(mx.sym.Variable('data'), weight=w, num_hidden=2, "
            "name='fc1')\n"
            "opt = mx.optimizer.SGD(sym=net, param_idx2name={0: 'fc1_weight', 1: 'fc1_bias'},"
            ' learning_rate=0.1, momentum=0.9)\n'
            'sys.stdout.buffer.write(pickle.dumps(opt, 0))\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(('PYTHON', 'MXKV_'))}
    proc = subprocess.run([REF_PYTHON, '-c', code], capture_output=True, timeout=120, env=env,
                          cwd=str(tmp_path))
    if proc.returncode != 0 and b'No module named' in proc.stderr:
        pytest.skip('mxnet is not installed in the reference venv')
    assert proc.returncode == 0, proc.stderr[-2000:]
    from mxkv import _optimizer_pickle as op
    opt = op.loads(proc.stdout)
    assert type(opt) is mxkv.optimizer.SGD and opt.momentum == 0.9
    attrs, names = opt.sym_info
    assert attrs['fc1_weight']['__lr_mult__'] == '2.0' and 'data' in names
    assert opt.lr_mult == {'fc1_weight': 2.0}
    assert opt._get_lrs([0, 1]) == [0.2, 0.1]


CLUSTER_WORKER = BODIES + r'''
import os
kv = mx.kv.create('dist_sync')
for name in ('nested', 'dag'):
    body = {'nested': nested, 'dag': dag}[name]().decode('ascii')
    kv._send_command_to_servers(0, body)     # what our dumps would never send
kv.init(3, mx.nd.ones((4,)))
kv.push(3, mx.nd.ones((4,)) * 2)
out = mx.nd.zeros((4,))
kv.pull(3, out=out)
print('pulled %s' % out.asnumpy().tolist(), flush=True)
'''


def test_a_server_refuses_them_and_keeps_serving(tmp_path):
    script = tmp_path / 'worker.py'
    script.write_text(CLUSTER_WORKER)
    code, out = launch(str(script), 1, 1, timeout=60, node_timeout=30)
    assert code == 0, out
    # no optimizer installed: the sync round assigns the pushed value
    assert '[worker 0] pulled [2.0, 2.0, 2.0, 2.0]' in out, out
    refusals = [line for line in out.splitlines() if line.startswith('[server 0]')
                and 'SGD.idx2name[3] is a builtins.tuple' in line]
    assert len(refusals) == 2, out
