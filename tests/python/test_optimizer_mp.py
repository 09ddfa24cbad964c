"""``multi_precision=True`` with float16 weights, as MXNet 1.9.1 runs it: a float32 master
copy per weight (``create_state_multi_precision``), SGD / NAG / LARS / LAMB through MXNet's
mixed-precision kernels (multi_mp_sgd(_mom)_update, mp_sgd(_mom)_update,
mp_nag_mom_update, preloaded_multi_mp_sgd(_mom)_update, multi_mp_lamb_update,
mp_lamb_update_phase1/2) and every other optimizer through MXNet's generic path (update the
master copy from the gradient cast to float32, cast it into the weight).

Before, mxkv refused float16 weights with multi_precision=True (MXKVUsageError from the
push).  Each case is compared bit for bit with MXNet: 20-step trajectories through a
store's optimizer (dense and row_sparse gradients, with and without aggregation), the
optimizer's updater called directly (weights, master copies and states after every step),
and states saved and loaded (by mxkv; MXNet's files read by mxkv:
test_optimizer_states_mxnet.py)."""
import warnings

import numpy as np
import pytest

from conftest import assert_same_bits
import test_optimizers
import test_optimizer_rsp

CASES = [
    ('sgd', {}),
    ('sgd', {'learning_rate': 0.1, 'wd': 0.01}),
    ('sgd', {'momentum': 0.9, 'learning_rate': 0.05, 'wd': 1e-4, 'rescale_grad': 0.125}),
    ('sgd', {'momentum': 0.9, 'clip_gradient': 0.3, 'learning_rate': 0.7}),
    ('sgd', {'clip_gradient': 0.2, 'learning_rate': 5.692038748222122e-3, 'wd': 3e-5}),
    ('sgd', {'momentum': 0.8, 'lr_scheduler': 'cosine'}),
    ('nag', {}),
    ('nag', {'momentum': 0.9, 'learning_rate': 0.05, 'wd': 1e-3}),
    ('nag', {'momentum': 0.7, 'clip_gradient': 0.25, 'rescale_grad': 0.5}),
    ('adam', {}),
    ('adam', {'learning_rate': 0.01, 'wd': 0.001, 'clip_gradient': 0.1}),
    ('adagrad', {'learning_rate': 0.1, 'wd': 0.01}),
    ('rmsprop', {}),
    ('rmsprop', {'centered': True, 'clip_weights': 0.9}),
    ('adadelta', {}),
    ('signum', {}),
    ('signum', {'momentum': 0.0, 'wd': 0.1}),
    ('ftrl', {}),
    ('ftml', {}),
    ('adamax', {}),
    ('nadam', {}),
    ('dcasgd', {'lamda': 0.5}),
    ('lamb', {}),
    ('lamb', {'learning_rate': 0.01, 'wd': 0.01, 'beta1': 0.8, 'clip_gradient': 0.3,
              'rescale_grad': 0.7}),
    ('lamb', {'bias_correction': False, 'lower_bound': 0.5, 'upper_bound': 1.2,
              'epsilon': 1e-5}),
    ('lars', {}),
    ('lars', {'momentum': 0.9, 'learning_rate': 0.1, 'wd': 0.01, 'eta': 0.01}),
    ('lars', {'momentum': 0.9, 'clip_gradient': 0.3, 'rescale_grad': 0.5, 'eps': 1e-3,
              'learning_rate': 0.1}),
    ('lbsgd', {'momentum': 0.9, 'learning_rate': 0.1, 'batch_scale': 2, 'warmup_epochs': 1,
               'updates_per_epoch': 4}),
    ('ccsgd', {'momentum': 0.9, 'learning_rate': 0.05}),
    ('test', {}),
]


def _ids(cases):
    return ['%s-%d' % (name, i) for i, (name, _) in enumerate(cases)]


def _mp(kwargs):
    return dict(kwargs, multi_precision=True)


@pytest.mark.parametrize('case', range(len(CASES)), ids=_ids(CASES))
def test_trajectory_float16_multi_precision(both, case):
    """20 steps of two float16 keys through KVStore.set_optimizer"""
    mxnet, mxkv = both
    name, kwargs = CASES[case]
    expected = test_optimizers.trajectory(mxnet, name, _mp(kwargs), dtype='float16')
    got = test_optimizers.trajectory(mxkv, name, _mp(kwargs), dtype='float16')
    assert_same_bits(expected, got, name)
    assert not np.array_equal(got[-1][0], got[0][0])


@pytest.mark.parametrize('name,kwargs', [('sgd', {'momentum': 0.9, 'wd': 0.01}),
                                         ('adam', {}), ('lamb', {'wd': 0.01}),
                                         ('lars', {'momentum': 0.9, 'eta': 0.01})])
def test_trajectory_str_keys_multi_device(both, name, kwargs):
    mxnet, mxkv = both
    assert_same_bits(
        test_optimizers.trajectory(mxnet, name, _mp(kwargs), 'str', 'float16', n_dev=3),
        test_optimizers.trajectory(mxkv, name, _mp(kwargs), 'str', 'float16', n_dev=3), name)


@pytest.mark.parametrize('size', ['0', '1'])
@pytest.mark.parametrize('name,kwargs', [('sgd', {'wd': 0.01, 'learning_rate': 0.3}),
                                         ('sgd', {'momentum': 0.9, 'clip_gradient': 0.5}),
                                         ('nag', {'momentum': 0.9}),
                                         ('lamb', {'wd': 0.01}),
                                         ('lamb', {'clip_gradient': 0.3, 'lower_bound': 0.5,
                                                   'bias_correction': False})])
def test_trajectory_without_aggregation(both, monkeypatch, size, name, kwargs):
    """MXNET_OPTIMIZER_AGGREGATION_SIZE 0 or 1: one index at a time (SGD still takes
    multi_mp_sgd_update for dense arrays; LAMB takes mp_lamb_update_phase1/2, whose phase 2
    leaves the master copy as it was, as in MXNet 1.9.1)"""
    monkeypatch.setenv('MXNET_OPTIMIZER_AGGREGATION_SIZE', size)
    mxnet, mxkv = both
    assert_same_bits(test_optimizers.trajectory(mxnet, name, _mp(kwargs), dtype='float16'),
                     test_optimizers.trajectory(mxkv, name, _mp(kwargs), dtype='float16'),
                     name)


RSP_CASES = [
    ('sgd', {'learning_rate': 0.1, 'wd': 0.01}),
    ('sgd', {'momentum': 0.9, 'learning_rate': 0.1, 'clip_gradient': 0.3}),
    ('nag', {'momentum': 0.9, 'learning_rate': 0.1}),
    ('adam', {'learning_rate': 0.05}),
    ('lamb', {'wd': 0.01}),
    ('lars', {'momentum': 0.9, 'learning_rate': 0.1, 'eta': 0.1, 'wd': 0.01}),
    ('rmsprop', {}),
]


@pytest.mark.parametrize('case', range(len(RSP_CASES)), ids=_ids(RSP_CASES))
def test_row_sparse_gradients_float16_multi_precision(both, case):
    """row_sparse gradients for dense float16 weights: the mp kernels are dense (MXNet's
    storage fallback densifies the gradient); the generic path updates the master copy
    from the row_sparse gradient cast to float32"""
    mxnet, mxkv = both
    name, kwargs = RSP_CASES[case]
    expected = test_optimizer_rsp.trajectory(mxnet, name, _mp(kwargs), 'float16', 1)
    got = test_optimizer_rsp.trajectory(mxkv, name, _mp(kwargs), 'float16', 1)
    assert_same_bits(expected, got, name)


@pytest.mark.parametrize('case', range(len(RSP_CASES)), ids=_ids(RSP_CASES))
def test_row_sparse_weights_float16_multi_precision(both, case):
    """row_sparse float16 weights (every row stored) and gradients: row_sparse float32
    master copies (and lazy states), the mp kernels through MXNet's storage fallback"""
    mxnet, mxkv = both
    name, kwargs = RSP_CASES[case]
    expected = test_optimizer_rsp.trajectory(mxnet, name, _mp(kwargs), 'float16', 1,
                                             'row_sparse')
    got = test_optimizer_rsp.trajectory(mxkv, name, _mp(kwargs), 'float16', 1, 'row_sparse')
    assert_same_bits(expected, got, name)


def _parts(value):
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        return [_parts(v) for v in value]
    return [str(np.dtype(value.dtype)), value.asnumpy()]


def direct_updates(mx, name, kwargs, steps=20, listed=True):
    """an Updater called directly with both indices at once (listed) or one at a time:
    the weights and every state (master copies, momenta...) after each step"""
    kwargs = dict(kwargs)
    if 'lr_scheduler' in kwargs:
        kwargs['lr_scheduler'] = test_optimizers._sched(mx, kwargs['lr_scheduler'])
    rng = np.random.RandomState(5)
    upd = mx.optimizer.get_updater(mx.optimizer.create(name, **_mp(kwargs)))
    ws = [mx.nd.array(rng.randn(4, 3).astype('float16'), dtype='float16'),
          mx.nd.array(rng.randn(7).astype('float16'), dtype='float16')]
    out = []
    for _ in range(steps):
        gs = [mx.nd.array(rng.randn(*w.shape).astype('float16'), dtype='float16') for w in ws]
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            if listed:
                upd([0, 1], gs, ws)
            else:
                for i, (g, w) in enumerate(zip(gs, ws)):
                    upd(i, g, w)
        out.append([_parts(ws), _parts([upd.states[0], upd.states[1]])])
    return out


@pytest.mark.parametrize('listed', [True, False])
@pytest.mark.parametrize('case', range(len(CASES)), ids=_ids(CASES))
def test_updater_called_directly(both, case, listed):
    mxnet, mxkv = both
    name, kwargs = CASES[case]
    assert_same_bits(direct_updates(mxnet, name, kwargs, listed=listed),
                     direct_updates(mxkv, name, kwargs, listed=listed), name)


def optimizer_called_directly(mx, name, kwargs):
    """create_state_multi_precision + update_multi_precision on one index"""
    kwargs = dict(kwargs)
    if 'lr_scheduler' in kwargs:
        kwargs['lr_scheduler'] = test_optimizers._sched(mx, kwargs['lr_scheduler'])
    opt = mx.optimizer.create(name, **_mp(kwargs))
    rng = np.random.RandomState(9)
    w = mx.nd.array(rng.randn(5, 2).astype('float16'), dtype='float16')
    state = opt.create_state_multi_precision(3, w)
    out = [_parts(state)]
    for _ in range(20):
        g = mx.nd.array(rng.randn(5, 2).astype('float16'), dtype='float16')
        opt.update_multi_precision(3, w, g, state)
        out.append([_parts(w), _parts(state)])
    return out


@pytest.mark.parametrize('case', range(len(CASES)), ids=_ids(CASES))
def test_optimizer_called_directly(both, case):
    mxnet, mxkv = both
    name, kwargs = CASES[case]
    assert_same_bits(optimizer_called_directly(mxnet, name, kwargs),
                     optimizer_called_directly(mxkv, name, kwargs), name)


def test_float32_weights_ignore_multi_precision(both):
    """multi_precision with float32 weights: the plain path and states, as MXNet"""
    mxnet, mxkv = both
    for name, kwargs in [('sgd', {'momentum': 0.9}), ('nag', {'momentum': 0.9}),
                         ('adam', {}), ('lamb', {})]:
        assert_same_bits(test_optimizers.trajectory(mxnet, name, _mp(kwargs)),
                         test_optimizers.trajectory(mxkv, name, _mp(kwargs)), name)


def save_load_mp(mx, tmp_path, name, kwargs, dump):
    """float16 weights with multi_precision: states saved after 5 steps and loaded into a
    fresh store, which then continues as the original"""
    rng = np.random.RandomState(3)
    shape = (4, 3)

    def arr(a):
        return mx.nd.array(a.astype('float16'), dtype='float16')
    kv = mx.kv.create()
    kv.init([0, 1], [arr(rng.randn(*shape)), arr(rng.randn(*shape))])
    kv.set_optimizer(mx.optimizer.create(name, **_mp(kwargs)))
    for _ in range(5):
        kv.push([0, 1], [arr(rng.randn(*shape)), arr(rng.randn(*shape))])
    fname = str(tmp_path / ('%s_%s_mp.states' % (mx.__name__, name)))
    kv.save_optimizer_states(fname, dump_optimizer=dump)
    weights = [mx.nd.zeros(shape, dtype='float16') for _ in range(2)]
    kv.pull([0, 1], out=weights)
    kv2 = mx.kv.create()
    kv2.init([0, 1], weights)
    kv2.set_optimizer(mx.optimizer.create(name, **_mp(kwargs)))
    kv2.load_optimizer_states(fname)
    grads = [[rng.randn(*shape), rng.randn(*shape)] for _ in range(5)]
    res = []
    for store in (kv, kv2):
        for g in grads:
            store.push([0, 1], [arr(x) for x in g])
        outs = [mx.nd.zeros(shape, dtype='float16') for _ in range(2)]
        store.pull([0, 1], out=outs)
        res.append([o.asnumpy() for o in outs])
    return res


@pytest.mark.parametrize('dump', [False, True])
@pytest.mark.parametrize('name,kwargs', [('sgd', {'momentum': 0.9}), ('sgd', {}),
                                         ('nag', {'momentum': 0.5}), ('adam', {}),
                                         ('lamb', {}), ('lars', {'momentum': 0.9}),
                                         ('rmsprop', {'centered': True})])
def test_save_load_optimizer_states(both, tmp_path, name, kwargs, dump):
    mxnet, mxkv = both
    ours = save_load_mp(mxkv, tmp_path, name, kwargs, dump)
    if dump:  # with the optimizer (its update counts) saved too, resuming is exact
        assert_same_bits(ours[0], ours[1], 'resumed vs original')
    assert_same_bits(save_load_mp(mxnet, tmp_path, name, kwargs, dump), ours, name)


def test_updater_states_roundtrip(mxkv):
    """get_states / set_states keep the master copies (float32) and the momenta"""
    opt = mxkv.optimizer.SGD(momentum=0.9, multi_precision=True)
    upd = mxkv.optimizer.get_updater(opt)
    w = mxkv.nd.array([1.5, -2.25, 3.0009765625], dtype='float16')
    upd(1, mxkv.nd.array([0.1, 0.2, 0.3], dtype='float16'), w)
    blob = upd.get_states(dump_optimizer=True)
    upd2 = mxkv.optimizer.get_updater(mxkv.optimizer.SGD())
    upd2.set_states(blob)
    assert upd2.optimizer.multi_precision is True
    mom, master = upd2.states[1]
    assert master.dtype == np.float32 and mom.dtype == np.float32
    assert_same_bits([mom.asnumpy(), master.asnumpy()],
                     [upd.states[1][0].asnumpy(), upd.states[1][1].asnumpy()])
