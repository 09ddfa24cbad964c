"""Regression tests for what the KVStore scenario fuzz (kv_fuzz.py, test_kv_fuzz.py) found
in the Python frontend (bindings/python/mxkv/kvstore): each case runs through MXNet 1.9.1
and mxkv; where MXNet raises, mxkv must raise an exception a caller catching MXNet's class
catches too (mxkv's usage errors stay MXKVUsageError, i.e. MXNetError and AssertionError,
as well).
"""
import os

import pytest


def _outcome(mx, fn):
    try:
        fn(mx)
        return None
    except Exception as exc:  # pylint: disable=broad-except
        return exc


def _same_class(both, fn):
    mxnet, mxkv = both
    want = _outcome(mxnet, fn)
    got = _outcome(mxkv, fn)
    assert want is not None, 'MXNet accepted the call'
    assert isinstance(got, type(want)), 'MXNet raised %s (%s), mxkv %r' % (
        type(want).__name__, want, got)
    assert isinstance(got, mxkv.base.MXKVUsageError), got
    return got


def _store(mx, kind='local'):
    kv = mx.kv.create(kind)
    kv.init(3, mx.nd.ones((4,)))
    return kv


# MXNet's _ctype_key_value iterates a single key's value: an object that is neither an
# NDArray nor iterable raises TypeError there.
@pytest.mark.parametrize('value', [None, 5, 2.5])
@pytest.mark.parametrize('op', ['push', 'pull', 'pushpull', 'pushpull_out', 'init',
                                'broadcast'])
def test_value_that_is_not_iterable_raises_type_error(both, op, value):
    def call(mx):
        kv = _store(mx)
        if op == 'push':
            kv.push(3, value)
        elif op == 'pull':
            kv.pull(3, out=value)
        elif op == 'pushpull':
            kv.pushpull(3, value)
        elif op == 'pushpull_out' and value is not None:
            kv.pushpull(3, mx.nd.ones((4,)), out=value)
        elif op == 'pushpull_out':
            kv.pushpull([3], [mx.nd.ones((4,))], out=[value])
        elif op == 'init':
            kv.init(4, value)
        else:
            kv.broadcast(5, value, out=mx.nd.ones((4,)))
    _same_class(both, call)


# A list of keys with values that have no len(): MXNet's assert len(keys) == len(vals)
# raises TypeError.
@pytest.mark.parametrize('value', [None, 5])
def test_key_list_with_values_without_len_raises_type_error(both, value):
    _same_class(both, lambda mx: _store(mx).push([3], value))


# Keys outside C int: MXNet packs them with array('i', ...), which raises OverflowError.
@pytest.mark.parametrize('key', [2 ** 31, -2 ** 31 - 1, 2 ** 40, [3, 2 ** 40]])
def test_key_outside_c_int_raises_overflow_error(both, key):
    def call(mx):
        kv = _store(mx)
        vals = [mx.nd.ones((4,)) for _ in key] if isinstance(key, list) else mx.nd.ones((4,))
        kv.push(key, vals)
    _same_class(both, call)


# Gradient-compression parameters whose names are not str: MXNet's c_str(name) calls
# name.encode (AttributeError); mxkv passed str(name) to the library, so {1: 2} was taken.
@pytest.mark.parametrize('params', [{'type': '2bit', 1: 2}, {b'type': '2bit'},
                                    {'type': '2bit', ('threshold',): 0.5}])
def test_compression_parameter_names_must_be_str(both, params):
    _same_class(both, lambda mx: _store(mx, 'device').set_gradient_compression(params))


# load_optimizer_states with an updater that has no set_states (a Python function): MXNet
# evaluates self._updater.set_states before it opens the file, so the error is the
# AttributeError even when the file does not exist; mxkv opened the file first.
def test_load_optimizer_states_of_a_function_updater(both, tmp_path):
    mxnet, mxkv = both
    missing = os.path.join(str(tmp_path), 'missing.states')
    present = os.path.join(str(tmp_path), 'present.states')
    with open(present, 'wb') as f:
        f.write(b'junk')

    def call(mx, fname):
        kv = _store(mx)
        kv._set_updater(lambda key, recv, local: None)  # pylint: disable=protected-access
        kv.load_optimizer_states(fname)
    for fname in (missing, present):
        want = _outcome(mxnet, lambda mx: call(mx, fname))
        got = _outcome(mxkv, lambda mx: call(mx, fname))
        assert type(want) is AttributeError, want
        assert type(got) is AttributeError, got
        assert str(got) == str(want)


# priority goes through ctypes.c_int in MXNet: a str or None raises TypeError (mxkv took
# int('1'); floats stay accepted, README deviation 23).
@pytest.mark.parametrize('priority', ['1', None, b'2'])
@pytest.mark.parametrize('op', ['push', 'pull', 'pushpull', 'broadcast', 'row_sparse_pull',
                                'push_list'])
def test_priority_that_is_not_a_number_raises_type_error(both, op, priority):
    def call(mx):
        kv = _store(mx)
        v = mx.nd.ones((4,))
        if op == 'push':
            kv.push(3, v, priority=priority)
        elif op == 'push_list':
            kv.push([3, 3], [v, v], priority=priority)
        elif op == 'pull':
            kv.pull(3, out=v, priority=priority)
        elif op == 'pushpull':
            kv.pushpull(3, v, priority=priority)
        elif op == 'broadcast':
            kv.broadcast(8, v, out=mx.nd.zeros((4,)), priority=priority)
        else:
            kv.init(9, mx.nd.sparse.zeros('row_sparse', (4, 2)))
            kv.row_sparse_pull(9, out=mx.nd.sparse.zeros('row_sparse', (4, 2)),
                               row_ids=mx.nd.array([1]), priority=priority)
    _same_class(both, call)


# MXNet iterates a key's values and takes their len(): any sized iterable of NDArrays (a
# set, a dict's keys) is a list of values there; an iterator (no len) raises TypeError.
def _pushed(mx, values_of):
    kv = _store(mx)
    kv.init(4, mx.nd.zeros((4,)))
    kv.push(*values_of(mx))
    outs = [mx.nd.zeros((4,)), mx.nd.zeros((4,))]
    kv.pull([3, 4], out=outs)
    return [o.asnumpy().tolist() for o in outs]


@pytest.mark.parametrize('case', ['set', 'dict', 'nested_dict'])
def test_sized_iterables_of_ndarrays_are_values(both, case):
    mxnet, mxkv = both

    def values_of(mx):
        a, b = mx.nd.ones((4,)) * 2, mx.nd.ones((4,)) * 5
        if case == 'set':
            return 3, {a, b}
        if case == 'dict':
            return 3, {a: 'x', b: 'y'}
        return [3, 4], [{a: 1}, {b: 2}]
    assert _pushed(mxnet, values_of) == _pushed(mxkv, values_of)


@pytest.mark.parametrize('case', ['iterator', 'list_iterator', 'dict_of_keys'])
def test_values_without_len_or_of_wrong_kind_raise_type_error(both, case):
    def call(mx):
        kv = _store(mx)
        kv.init(4, mx.nd.zeros((4,)))
        v = mx.nd.ones((4,))
        if case == 'iterator':
            kv.push(3, iter([v]))
        elif case == 'list_iterator':
            kv.push([3], iter([v]))
        else:
            kv.push([3, 4], {3: v, 4: v})   # zips the keys 3 and 4 as values
    _same_class(both, call)


# TestStore ('teststore'): MXNet's pushpull reads value[0].context first, also for a
# single NDArray (a row_sparse one raises there), and writes back into every item of a
# tuple of values (mxkv skipped the former and raised TypeError on the latter).
def _teststore_pushpull(mx, case):
    kv = mx.kv.create('teststore')
    a, b = mx.nd.array([1.5, -2.0]), mx.nd.array([0.25, 4.0])
    if case == 'row_sparse':
        rsp = mx.nd.array([[1.0, 2.0], [0.0, 0.0]]).tostype('row_sparse')
        kv.pushpull(3, rsp, out=mx.nd.sparse.zeros('row_sparse', (2, 2)))
    elif case == 'row_sparse_no_out':
        kv.pushpull(3, mx.nd.array([[1.0, 2.0], [0.0, 0.0]]).tostype('row_sparse'))
    elif case == 'tuple':
        kv.pushpull(3, (a, b))
    elif case == 'tuple_out':
        o = [mx.nd.zeros((2,)), mx.nd.zeros((2,))]
        kv.pushpull(3, (a, b), out=o)
        return [x.asnumpy().tolist() for x in o]
    return [a.asnumpy().tolist(), b.asnumpy().tolist()]


@pytest.mark.parametrize('case', ['row_sparse', 'row_sparse_no_out'])
def test_teststore_pushpull_of_a_row_sparse_value(both, case):
    mxnet, mxkv = both
    want = _outcome(mxnet, lambda mx: _teststore_pushpull(mx, case))
    got = _outcome(mxkv, lambda mx: _teststore_pushpull(mx, case))
    assert want is not None and got is not None
    assert isinstance(got, type(want)) and str(got) == str(want)


@pytest.mark.parametrize('case', ['tuple', 'tuple_out'])
def test_teststore_pushpull_of_a_tuple(both, case):
    mxnet, mxkv = both
    assert _teststore_pushpull(mxnet, case) == _teststore_pushpull(mxkv, case)


# An empty list among the keys: MXNet's _ctype_key_value gives a list of no keys the key
# type None and asserts each item's type equals the first non-None one so far, so
# [[], k] is k ('inconsistent types' never fires: None is replaced by k's type) while
# [k, []] and [[k], [[]]] raise AssertionError ('inconsistent types of keys detected.').
# mxkv took an empty list as int keys: [[], 'a'] raised 'mixed int and str keys' in a
# string-key store, [3, []] was accepted.
@pytest.mark.parametrize('case', ['lead_str', 'lead_int', 'lead_nested', 'trail_str',
                                  'trail_int', 'trail_nested', 'trail_deep'])
def test_an_empty_list_among_the_keys(both, case):
    def call(mx):
        kv = mx.kv.create('local')
        k = 'a' if case.endswith('_str') else 3
        v = mx.nd.ones((2,))
        kv.init(k, v)
        keys, vals = {
            'lead_str': ([[], k], [[], v * 2]),
            'lead_int': ([[], k], [[], v * 2]),
            'lead_nested': ([[[]], [k]], [[[]], [v * 2]]),
            'trail_str': ([k, []], [v * 2, []]),
            'trail_int': ([k, []], [v * 2, []]),
            'trail_nested': ([[k], [[]]], [[v * 2], [[]]]),
            'trail_deep': ([k, [[], []]], [v * 2, [[], []]]),
        }[case]
        kv.push(keys, vals)
        out = [mx.nd.zeros((2,))]
        kv.pull([[], k], out=[[], out])
        return out[0].asnumpy().tolist()
    mxnet, mxkv = both
    want = _outcome(mxnet, call)
    if case.startswith('lead'):
        assert want is None
        assert call(mxnet) == call(mxkv) == [2.0, 2.0]
    else:
        assert type(want) is AssertionError, want
        _same_class(both, call)


# A list holding a sparse NDArray assigned to a dense one: MXNet's _prepare_value_nd calls
# array(value) under a bare except and raises TypeError for whatever fails there; numpy's
# conversion of a RowSparseNDArray/CSRNDArray indexes it with ints, which raises a plain
# Exception, and mxkv let that through (also from TestStore.broadcast of several keys,
# which assigns the list of values to every output; found by the scenario fuzz).  A list
# holding a CSRNDArray is left out: numpy's conversion of it does not end, in MXNet or
# in mxkv (it took 8 GB before it was stopped).
@pytest.mark.parametrize('case', ['rsp_in_list', 'teststore_broadcast'])
def test_a_list_with_a_sparse_array_assigned_raises_type_error(both, case):
    def call(mx):
        d = [[1.5, 0.0], [0.0, 2.0]]
        if case == 'teststore_broadcast':
            kv = mx.kv.create('teststore')
            kv.broadcast([1, 2], [mx.nd.array(d).tostype('row_sparse'), mx.nd.array(d)],
                         out=[[], mx.nd.zeros((2, 2))])
            return
        mx.nd.zeros((2, 2))[:] = [mx.nd.array(d).tostype('row_sparse'), mx.nd.array(d)]
    mxnet, mxkv = both
    want = _outcome(mxnet, call)
    got = _outcome(mxkv, call)
    assert type(want) is TypeError, want
    assert isinstance(got, TypeError), repr(got)


ITERATE_CSR = r'''
import json
import numpy as np
import mxkv as mx
c = mx.nd.array([[1, 0, 3], [0, 2, 0]]).tostype('csr')
res = {'rows': [[r.shape, r.stype, r.asnumpy().tolist()] for r in c]}
a = mx.nd.zeros((1, 2, 3))
try:
    a[:] = [c]
    res['setitem'] = 'taken'
except Exception as e:
    res['setitem'] = type(e).__name__
res['asarray_ends'] = np.asarray([c], dtype=object).shape[0]
print(json.dumps(res))
'''


def test_iterating_a_csr_array_ends():
    """MXNet 1.9.1's CSRNDArray gives an empty slice for an int past its last row (never
    IndexError), so iterating one never ends: `dense[:] = [csr]` (found by kv_fuzz's
    teststore broadcasts) and `np.asarray([csr])` ran until memory ran out, in MXNet and
    in mxkv. mxkv iterates the rows; the child must finish within its timeout"""
    import json
    import subprocess
    import sys
    from conftest import BINDINGS
    proc = subprocess.run([sys.executable, '-c', ITERATE_CSR],
                          env=dict(os.environ, PYTHONPATH=BINDINGS), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got['rows'] == [[[1, 3], 'csr', [[1.0, 0.0, 3.0]]], [[1, 3], 'csr', [[0.0, 2.0, 0.0]]]]
    assert got['setitem'] == 'TypeError'
    assert got['asarray_ends'] == 1
