"""Audit (session 12) of the local stores: differential checks against MXNet 1.9.1 found
by a randomized differential fuzz, each a case where libmxkv differed."""
import random

import numpy as np
import pytest

from conftest import assert_same_bits


def merge_buffer_placement(mx, seed):
    """The device store places every key's merge buffer on the least-loaded pushing
    device, largest keys first (CommDevice::InitMergeBuffer). MXNet sorts its list of
    keys in place, so after a later init the new keys are sorted together with the list
    as the previous placement left it (libstdc++'s std::sort is not stable beyond 16
    elements): the devices an updater's `recv` lives on show the placement."""
    rng = random.Random(seed)
    kv = mx.kv.create('device')
    seen = []

    def upd(key, recv, local):
        seen.append((key, str(recv.context)))
        local[:] = recv

    kv._set_updater(upd)
    shapes = {}
    nkeys = 0
    for _ in range(4):
        new = list(range(nkeys, nkeys + rng.randint(5, 25)))
        nkeys = new[-1] + 1
        for k in new:
            shapes[k] = (rng.choice([2, 2, 2, 3, 4]),)
        kv.init(new, [mx.nd.zeros(shapes[k]) for k in new])
        # three values per push in every round (MXNet 1.9.1 overruns its copy buffers
        # when a key later gets more values than at its first multi-value push)
        devs = [rng.randint(0, 3) for _ in range(3)]
        for k in rng.sample(range(nkeys), rng.randint(1, nkeys)):
            kv.push(k, [mx.nd.ones(shapes[k], ctx=mx.cpu(d)) for d in devs])
    return seen


@pytest.mark.parametrize('seed', range(6))
def test_device_merge_buffers_after_later_inits(both, seed):
    mxnet, mxkv = both
    assert_same_bits(merge_buffer_placement(mxnet, seed), merge_buffer_placement(mxkv, seed),
                     'seed %d' % seed)


def compressed_single_pushes(mx):
    """With gradient compression, MXNet's device store places the merge buffers even for
    a push of one value (ReduceCompressed calls InitBuffersAndComm first) and hands the
    updater the dequantized value on the merge buffer's device."""
    kv = mx.kv.create('device')
    kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})
    seen = []

    def upd(key, recv, local):
        seen.append((key, str(recv.context), recv.asnumpy()))
        local[:] = recv

    kv.init([0, 1, 2, 3], [mx.nd.zeros((4,)), mx.nd.zeros((3,)), mx.nd.zeros((2,)),
                           mx.nd.zeros((5,))])
    kv._set_updater(upd)
    kv.push(1, mx.nd.ones((3,), ctx=mx.cpu(2)))
    kv.push(0, mx.nd.ones((4,), ctx=mx.cpu(3)) * -2)
    # the placement made by the first push holds for later multi-value pushes
    kv.push(2, [mx.nd.ones((2,), ctx=mx.cpu(0)), mx.nd.ones((2,), ctx=mx.cpu(1))])
    kv.push(3, [mx.nd.ones((5,), ctx=mx.cpu(1)), mx.nd.ones((5,), ctx=mx.cpu(0))])
    out = [mx.nd.zeros((n,)) for n in (4, 3, 2, 5)]
    kv.pull([0, 1, 2, 3], out=out)
    return {'seen': seen, 'stored': [o.asnumpy() for o in out]}


def test_device_compressed_single_push_places_merge_buffers(both):
    mxnet, mxkv = both
    assert_same_bits(compressed_single_pushes(mxnet), compressed_single_pushes(mxkv))


def bool_keys(mx):
    """MXNet's frontend takes any int, bool included (True is key 1, False key 0)."""
    kv = mx.kv.create('local')
    kv.init(True, mx.nd.ones((2,)) * 3)
    kv.init([False, 5], [mx.nd.ones((2,)) * 4, mx.nd.ones((2,))])
    kv.push(1, [mx.nd.ones((2,)), mx.nd.ones((2,))])
    kv.push([True, False], [mx.nd.ones((2,)) * 7, mx.nd.ones((2,)) * 8])
    outs = [mx.nd.zeros((2,)) for _ in range(3)]
    kv.pull([True, 0, 5], out=outs)
    res = [o.asnumpy() for o in outs]
    o = mx.nd.zeros((2,))
    kv.pushpull(False, mx.nd.ones((2,)) * 9, out=o)
    res.append(o.asnumpy())
    return res


def test_bool_keys_are_int_keys(both):
    mxnet, mxkv = both
    assert_same_bits(bool_keys(mxnet), bool_keys(mxkv))


def _pushpull_c(mx, kv, vkeys, vals, okeys, outs):
    """MXKVStorePushPull with keys of its own for the outputs (the Python frontend always
    pulls the keys it pushes)."""
    import ctypes
    ckeys = lambda ks: (ctypes.c_int * len(ks))(*ks)
    handles = lambda arrs: (ctypes.c_void_p * len(arrs))(*[a.handle.value for a in arrs])
    rc = mx.base._LIB.MXKVStorePushPull(kv.handle, len(vkeys), ckeys(vkeys), len(okeys),
                                        ckeys(okeys), handles(vals), handles(outs), 0)
    mx.nd.waitall()
    return rc


def pushpull_outputs_that_alias(mx, kind, nb, case):
    """PushPull is all the pushes, then all the pulls (in ascending key order). Key 1 gets
    one value, key 2 `nb` values.
    'input': the output of key 1 is a value pushed for key 2, which must be summed as it
    was before the call;
    'two-keys': one output for keys 1 and 2 (and one more of another dtype for key 1): it
    ends with key 2's value, pulled last."""
    kv = mx.kv.create(kind)
    kv.init([1, 2], [mx.nd.zeros((3,)), mx.nd.zeros((3,))])
    a = mx.nd.ones((3,))
    bs = [mx.nd.ones((3,)) * (2 + 18 * i) for i in range(nb)]
    if case == 'input':
        for order in ([1] + [2] * nb, [2] * nb + [1]):
            vals = [a if k == 1 else None for k in order]
            it = iter(bs)
            vals = [v if v is not None else next(it) for v in vals]
            rc = _pushpull_c(mx, kv, order, vals, [1], [bs[0]])
            bs[0][:] = 2
            outs = [mx.nd.zeros((3,)), mx.nd.zeros((3,))]
            kv.pull([1, 2], out=outs)
            yield rc, [o.asnumpy() for o in outs]
    else:
        x, y = mx.nd.zeros((3,)), mx.nd.zeros((3,), dtype='float64')
        rc = _pushpull_c(mx, kv, [1] + [2] * nb, [a] + bs, [1, 1, 2], [x, y, x])
        yield rc, [x.asnumpy(), y.asnumpy()]


# (not 'input' with one value of key 2: MXNet would keep the caller's array as the
# stored value, README's deviation 2)
@pytest.mark.parametrize('nb,case', [(2, 'input'), (3, 'input'), (1, 'two-keys'),
                                     (2, 'two-keys')])
@pytest.mark.parametrize('kind', ['local', 'device'])
def test_pushpull_outputs_are_written_after_every_push(both, kind, nb, case):
    mxnet, mxkv = both
    assert_same_bits(list(pushpull_outputs_that_alias(mxnet, kind, nb, case)),
                     list(pushpull_outputs_that_alias(mxkv, kind, nb, case)))


def row_sparse_pull_shared_outputs(mx, kind):
    """row_sparse_pull writes key by key in ascending order, whatever the order of the
    call (MXNet groups the (key, output, row_ids) triples by key): an output given for
    two keys ends with the rows of the larger key."""
    kv = mx.kv.create(kind)

    def rsp(v):
        return mx.nd.sparse.row_sparse_array(
            (np.full((3, 2), v, dtype='float32'), np.arange(3)), shape=(3, 2))

    kv.init([1, 2, 3], [rsp(1.0), rsp(2.0), rsp(3.0)])
    o = mx.nd.sparse.zeros('row_sparse', (3, 2))
    p = mx.nd.sparse.zeros('row_sparse', (3, 2))
    res = []
    kv.row_sparse_pull([2, 1], out=[o, o], row_ids=[mx.nd.array([0]), mx.nd.array([1])])
    res += [o.indices.asnumpy(), o.data.asnumpy()]
    kv.row_sparse_pull([3, 1, 2, 1], out=[p, o, p, o],
                       row_ids=[mx.nd.array([2]), mx.nd.array([1]), mx.nd.array([0]),
                                mx.nd.array([0, 2])])
    res += [o.indices.asnumpy(), o.data.asnumpy(), p.indices.asnumpy(), p.data.asnumpy()]
    return res


@pytest.mark.parametrize('kind', ['local', 'device'])
def test_row_sparse_pull_writes_in_key_order(both, kind):
    mxnet, mxkv = both
    assert_same_bits(row_sparse_pull_shared_outputs(mxnet, kind),
                     row_sparse_pull_shared_outputs(mxkv, kind))


def pull_dense_key_into_csr(mx, kind):
    """pull(..., ignore_sparse=False) of a dense key into a csr output: MXNet casts the
    value (cast_storage dense -> csr)."""
    kv = mx.kv.create(kind)
    kv.init(0, mx.nd.array([[0, 1.5, 0], [0, 0, 0], [2, 0, -3]]))
    out = mx.nd.sparse.zeros('csr', (3, 3))
    kv.pull(0, out=out, ignore_sparse=False)
    return [out.data.asnumpy(), out.indices.asnumpy(), out.indptr.asnumpy()]


@pytest.mark.parametrize('kind', ['local', 'device'])
def test_pull_dense_key_into_csr_output(both, kind):
    mxnet, mxkv = both
    assert_same_bits(pull_dense_key_into_csr(mxnet, kind), pull_dense_key_into_csr(mxkv, kind))


def csr_valued_key(mx, kind):
    """A key initialised with a csr value: MXNet keeps it, pulls it into dense and csr
    outputs, and a dense push replaces it (the stored value becomes dense)."""
    kv = mx.kv.create(kind)
    kv.init(0, mx.nd.array([[0, 1.5, 0], [0, 0, 0], [2, 0, -3]]).tostype('csr'))
    dense, csr = mx.nd.zeros((3, 3)), mx.nd.sparse.zeros('csr', (3, 3))
    kv.pull(0, out=dense, ignore_sparse=False)
    kv.pull(0, out=csr, ignore_sparse=False)
    res = [dense.asnumpy(), csr.data.asnumpy(), csr.indices.asnumpy(), csr.indptr.asnumpy()]
    kv.push(0, mx.nd.ones((3, 3)))
    kv.pull(0, out=dense)
    return res + [dense.asnumpy()]


@pytest.mark.parametrize('kind', ['local', 'device'])
def test_csr_valued_key(both, kind):
    mxnet, mxkv = both
    assert_same_bits(csr_valued_key(mxnet, kind), csr_valued_key(mxkv, kind))


def csr_key_of_no_values(mx, kind, make):
    """A key initialised with a csr holding no values: MXNet's copy into the store
    (CopyFromToCsrImpl: not storage_initialized, so FillZerosCsrImpl) holds rows + 1
    zero offsets, also when the value's indptr is [] (abs of an all-zero csr); pulls
    into csr outputs (also ones holding values) hand those out, dense outputs get
    zeros.  Before, mxkv's store kept the indptr [] and pulled it out."""
    kv = mx.kv.create(kind)
    value = make(mx)
    kv.init(0, value)
    res = [value.indptr.asnumpy()]
    for out in (mx.nd.sparse.zeros('csr', (3, 4)),
                mx.nd.array([[0, 1, 0, 2]] * 3).tostype('csr'), mx.nd.ones((3, 4))):
        kv.pull(0, out=out, ignore_sparse=False)
        res.append(out.asnumpy())
        if out.stype == 'csr':
            res += [out.data.asnumpy(), out.indices.asnumpy(), out.indptr.asnumpy()]
    return res


@pytest.mark.parametrize('make', ['abs_zeros', 'zeros', 'times_zero'])
@pytest.mark.parametrize('kind', ['local', 'device'])
def test_csr_key_of_no_values(both, kind, make):
    mxnet, mxkv = both
    makers = {'abs_zeros': lambda mx: abs(mx.nd.sparse.zeros('csr', (3, 4))),  # indptr []
              'zeros': lambda mx: mx.nd.sparse.zeros('csr', (3, 4)),
              'times_zero': lambda mx: mx.nd.sparse.zeros('csr', (3, 4)) * 0}
    assert_same_bits(csr_key_of_no_values(mxnet, kind, makers[make]),
                     csr_key_of_no_values(mxkv, kind, makers[make]))


CSR_A = [[0, 1.5, 0], [0, 0, 0], [2, 0, -3]]


def _outcome(f):
    """f()'s result, or ('error', the message's first 'Check failed'/'Unexpected' line)."""
    try:
        return f()
    except Exception as e:  # both libraries' MXNetError
        lines = [ln.strip() for ln in str(e).splitlines()]
        key = [ln for ln in lines if 'Check failed' in ln or 'Unexpected storage' in ln]
        return ('error', key[0] if key else lines[0])


def _same_outcome(a, b):
    if isinstance(a, tuple) and a and a[0] == 'error':
        # mxkv's messages are MXNet's text with a prefix (the C API function)
        # and a suffix (the key, an explanation); a 'Check failed: cond: ' may be
        # left out before the explanation
        assert isinstance(b, tuple) and b[0] == 'error', b
        mx_text = a[1].split('MXNetError: ')[-1]
        if mx_text.startswith('Check failed: ') and mx_text not in b[1]:
            mx_text = mx_text.split(': ', 2)[-1]
        assert mx_text in b[1], (a, b)
    else:
        assert_same_bits(a, b)


def csr_key_refusals(mx, kind, case):
    """What MXNet refuses with a csr-valued key or csr values, and that the key
    keeps its value afterwards."""
    kv = mx.kv.create(kind)
    a = mx.nd.array(CSR_A)
    kv.init(0, a.tostype('csr'))
    kv.init(1, a)
    steps = {
        'push_csr_on_csr': lambda: kv.push(0, a.tostype('csr')),
        'push_csr_on_dense': lambda: kv.push(1, a.tostype('csr')),
        'push_two_csr': lambda: kv.push(0, [a.tostype('csr'), a.tostype('csr')]),
        'pushpull_csr_value': lambda: kv.pushpull(1, a.tostype('csr'), out=mx.nd.zeros((3, 3))),
        'row_sparse_pull_csr_key': lambda: kv.row_sparse_pull(
            0, out=mx.nd.sparse.zeros('row_sparse', (3, 3)), row_ids=mx.nd.array([0, 2])),
        'pull_csr_key_into_row_sparse': lambda: kv.pull(
            0, out=mx.nd.sparse.zeros('row_sparse', (3, 3)), ignore_sparse=False),
        'pull_into_csr_of_other_shape': lambda: kv.pull(
            1, out=mx.nd.sparse.zeros('csr', (2, 3)), ignore_sparse=False),
    }
    # MXNet reports a failed copy at the next wait
    res = [_outcome(lambda: (steps[case](), mx.nd.waitall()))]
    for k in (0, 1):
        o = mx.nd.zeros((3, 3))
        kv.pull(k, out=o)
        res.append(o.asnumpy())
    return res


@pytest.mark.parametrize('case', ['push_csr_on_csr', 'push_csr_on_dense', 'push_two_csr',
                                  'pushpull_csr_value', 'row_sparse_pull_csr_key',
                                  'pull_csr_key_into_row_sparse', 'pull_into_csr_of_other_shape'])
@pytest.mark.parametrize('kind', ['local', 'device'])
def test_csr_refusals_as_mxnet(both, kind, case):
    mxnet, mxkv = both
    a, b = csr_key_refusals(mxnet, kind, case), csr_key_refusals(mxkv, kind, case)
    assert a[0][0] == 'error', a  # MXNet refuses each of these
    _same_outcome(a[0], b[0])
    assert_same_bits(a[1:], b[1:], case)


def _csr_parts(o):
    return [o.data.asnumpy(), o.indices.asnumpy(), o.indptr.asnumpy()]


def csr_key_accepted(mx, kind, case):
    """What MXNet does with a csr-valued key or a csr output besides
    test_csr_valued_key's cases."""
    kv = mx.kv.create(kind)
    a = mx.nd.array(CSR_A)
    kv.init(0, a.tostype('csr'))
    kv.init(1, a)
    res = []
    if case == 'push_two_dense':
        kv.push(0, [mx.nd.ones((3, 3)), mx.nd.ones((3, 3), ctx=mx.cpu(1))])
    elif case == 'push_row_sparse':
        kv.push(0, (a * 2).tostype('row_sparse'))
    elif case == 'pushpull_dense':
        o = mx.nd.zeros((3, 3))
        kv.pushpull(0, mx.nd.ones((3, 3)) * 4, out=o)
        res.append(o.asnumpy())
    elif case == 'pushpull_into_csr_output':
        # pushpull's pull ignores sparse outputs: the csr output stays as it was
        o = mx.nd.sparse.zeros('csr', (3, 3))
        kv.pushpull(1, mx.nd.ones((3, 3)), out=o)
        res.append(_csr_parts(o))
    elif case == 'pull_ignored':
        # ignore_sparse=True (the default): a csr output is left as it was
        o = mx.nd.sparse.zeros('csr', (3, 3))
        kv.pull(1, out=o)
        r = mx.nd.sparse.zeros('row_sparse', (3, 3))
        kv.pull(0, out=r)
        res += [_csr_parts(o), r.asnumpy()]
    elif case == 'pull_other_dtypes':
        o64, d16 = mx.nd.sparse.zeros('csr', (3, 3), dtype='float64'), mx.nd.zeros((3, 3),
                                                                                   dtype='float16')
        kv.pull(0, out=o64, ignore_sparse=False)
        kv.pull(0, out=d16)
        c64 = mx.nd.sparse.zeros('csr', (3, 3), dtype='float64')
        kv.pull(1, out=c64, ignore_sparse=False)
        res += [_csr_parts(o64), d16.asnumpy(), _csr_parts(c64)]
    elif case == 'pull_many_outputs':
        outs = [mx.nd.sparse.zeros('csr', (3, 3)), mx.nd.zeros((3, 3)),
                mx.nd.sparse.zeros('csr', (3, 3))]
        kv.pull([0, 0, 1], out=outs, ignore_sparse=False)
        res += [_csr_parts(outs[0]), outs[1].asnumpy(), _csr_parts(outs[2])]
    elif case == 'broadcast_csr':
        d, c = mx.nd.zeros((3, 3)), mx.nd.sparse.zeros('csr', (3, 3))
        kv.broadcast(5, a.tostype('csr'), out=d)
        kv.pull(5, out=c, ignore_sparse=False)
        res += [d.asnumpy(), _csr_parts(c)]
    for k in (0, 1):
        o = mx.nd.zeros((3, 3))
        kv.pull(k, out=o)
        res.append(o.asnumpy())
    return res


@pytest.mark.parametrize('case', ['push_two_dense', 'push_row_sparse', 'pushpull_dense',
                                  'pushpull_into_csr_output', 'pull_ignored',
                                  'pull_other_dtypes', 'pull_many_outputs', 'broadcast_csr'])
@pytest.mark.parametrize('kind', ['local', 'device'])
def test_csr_key_as_mxnet(both, kind, case):
    mxnet, mxkv = both
    assert_same_bits(csr_key_accepted(mxnet, kind, case), csr_key_accepted(mxkv, kind, case),
                     case)


def csr_key_with_updater_or_compression(mx, kind, case):
    """An updater gets a csr key's stored value as a csr array (MXNet hands it
    over as it is); compression quantizes dense pushes, which replace the value."""
    kv = mx.kv.create(kind)
    kv.init(0, mx.nd.array(CSR_A).tostype('csr'))
    seen = []
    if case == 'updater_reads':
        def upd(key, recv, local):
            seen.append([local.stype, local.asnumpy(), recv.stype, recv.asnumpy()])
        kv._set_updater(upd)
        kv.push(0, mx.nd.ones((3, 3)))
    elif case in ('compression_one', 'compression_two'):
        kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})
        n = 1 if case == 'compression_one' else 2
        kv.push(0, [mx.nd.ones((3, 3)) * (i + 1) for i in range(n)])
    o, c = mx.nd.zeros((3, 3)), mx.nd.sparse.zeros('csr', (3, 3))
    kv.pull(0, out=o)
    kv.pull(0, out=c, ignore_sparse=False)
    return seen + [o.asnumpy(), _csr_parts(c)]


@pytest.mark.parametrize('case', ['updater_reads', 'compression_one', 'compression_two'])
@pytest.mark.parametrize('kind', ['local', 'device'])
def test_csr_key_updater_and_compression(both, kind, case):
    mxnet, mxkv = both
    if case.startswith('compression') and kind == 'local':
        pytest.skip('MXNet has no compression on the local store')
    assert_same_bits(csr_key_with_updater_or_compression(mxnet, kind, case),
                     csr_key_with_updater_or_compression(mxkv, kind, case), case)


def _csr_key_with_writer(mx, kind, case):
    kv = mx.kv.create(kind)
    kv.init(0, mx.nd.array(CSR_A).tostype('csr'))
    if case == 'updater_writes':
        def upd(key, recv, local):
            local[:] = local + recv
        kv._set_updater(upd)
    else:
        kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1))
    return kv


def _csr_key_pulled(mx, kv):
    o, c = mx.nd.zeros((3, 3)), mx.nd.sparse.zeros('csr', (3, 3))
    kv.pull(0, out=o)
    kv.pull(0, out=c, ignore_sparse=False)
    return [o.asnumpy(), _csr_parts(c)]


def csr_key_updated(mx, kind, case):
    kv = _csr_key_with_writer(mx, kind, case)
    kv.push(0, mx.nd.ones((3, 3)))
    return _csr_key_pulled(mx, kv)


@pytest.mark.parametrize('case', ['updater_writes', 'sgd'])
@pytest.mark.parametrize('kind', ['local', 'device'])
def test_csr_key_written_by_updater(both, kind, case):
    """The updater writes a csr key's value (local[:] = local + recv: MXNet's dense-csr
    add, then the dense result cast to csr) or an optimizer updates it (SGD: sgd_update's
    storage fallback); failed before mxkv wrote csr arrays in place (NDArray.copyto
    refused a csr destination, the optimizers csr weights)."""
    mxnet, mxkv = both
    assert_same_bits(csr_key_updated(mxnet, kind, case), csr_key_updated(mxkv, kind, case))


def csr_key_after_a_failing_updater(mx, kind, case):
    """An updater that fails on a csr key before writing it: MXNet prints and swallows
    the error, mxkv raises it from the push; in both the key keeps its value."""
    kv = mx.kv.create(kind)
    kv.init(0, mx.nd.array(CSR_A).tostype('csr'))
    if case == 'other_shape':
        def upd(key, recv, local):
            local[:] = mx.nd.ones((2, 3))   # copyto: shape mismatch
    elif case == 'partial_slice':
        def upd(key, recv, local):
            local[0:1] = recv               # csr: only [:] can be assigned
    else:
        def upd(key, recv, local):
            local[:] = 3.0                  # csr: no number can be assigned
    kv._set_updater(upd)
    raised = None
    try:
        kv.push(0, mx.nd.ones((3, 3)))
        mx.nd.waitall()
    except Exception as err:  # pylint: disable=broad-except
        raised = type(err).__name__
    return raised, _csr_key_pulled(mx, kv)


@pytest.mark.parametrize('case', ['other_shape', 'partial_slice', 'number'])
@pytest.mark.parametrize('kind', ['local', 'device'])
def test_csr_key_keeps_its_value_when_the_updater_fails(both, kind, case):
    mxnet, mxkv = both
    raised_mxnet, pulled_mxnet = csr_key_after_a_failing_updater(mxnet, kind, case)
    raised_mxkv, pulled_mxkv = csr_key_after_a_failing_updater(mxkv, kind, case)
    assert raised_mxnet is None and raised_mxkv is not None
    assert_same_bits(pulled_mxnet, pulled_mxkv, case)
    assert_same_bits(pulled_mxkv,
                     [np.array(CSR_A, np.float32),
                      [np.array([1.5, 2, -3], np.float32), np.array([1, 0, 2], np.int64),
                       np.array([0, 1, 1, 3], np.int64)]])
