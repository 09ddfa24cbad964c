"""``mx.random.seed`` + ``mx.nd.random.*`` give MXNet 1.9.1's numbers, bit for bit.

MXNet's CPU sampler: 1024 std::mt19937 engines seeded with seed * 127 + j, an operator's N
outputs split into min(ceil(N / 64), 1024) consecutive chunks, chunk j drawn by engine j
with libstdc++'s distributions (see mxkv/ndarray/random.py).  The sizes below straddle the
split thresholds (64 outputs per engine, 1024 engines: N = 65536), the calls follow each
other after one seed (the engines keep their states from call to call).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import assert_same_bits

SIZES = [1, 63, 64, 65, 129, 1000, 65535, 65536, 65537, 66000, 140001]


def _bits(res):
    return [np.asarray(r) for r in res]


def _check(both, scenario, *args):
    mxnet, mxkv = both
    expected = _bits(scenario(mxnet, *args))
    got = _bits(scenario(mxkv, *args))
    assert [x.dtype for x in got] == [x.dtype for x in expected]
    assert_same_bits(expected, got, '%s%r' % (scenario.__name__, args))


def consecutive_draws(mx, seed, size, dtype):
    mx.random.seed(seed)
    return [mx.nd.random.uniform(-2, 3, shape=(size,), dtype=dtype).asnumpy(),
            mx.nd.random.normal(1.5, 0.7, shape=(size,), dtype=dtype).asnumpy(),
            mx.nd.random.uniform(shape=(size // 3 + 1,), dtype=dtype).asnumpy(),
            mx.nd.random.normal(shape=(size // 7 + 2,), dtype=dtype).asnumpy(),
            mx.nd.random.uniform(shape=(size,), dtype=dtype).asnumpy()]


@pytest.mark.parametrize('dtype', ['float32', 'float64', 'float16'])
@pytest.mark.parametrize('size', SIZES)
def test_uniform_and_normal_are_mxnets(both, size, dtype):
    for seed in (0, 1, 2 ** 31 - 1, -5):
        _check(both, consecutive_draws, seed, size, dtype)


def many_seeds(mx, seeds):
    res = []
    for s in seeds:
        mx.random.seed(s)
        res.append(mx.nd.random.normal(shape=(3, 50)).asnumpy())
        res.append(mx.nd.random.uniform(shape=(7,), dtype='float64').asnumpy())
    return res


def test_many_seeds(both):
    _check(both, many_seeds, list(range(0, 400, 7)) + [2 ** 32 - 1, -2 ** 31, 12345678901])


def randint_draws(mx, seed, dtype, low, high):
    mx.random.seed(seed)
    return [mx.nd.random.randint(low, high, shape=(n,), dtype=dtype).asnumpy()
            for n in (5, 70, 66000)]


@pytest.mark.parametrize('dtype,low,high', [
    ('int32', 0, 10), ('int32', -5, 1000), ('int32', -2 ** 31, 2 ** 31 - 1),
    ('int64', 0, 10), ('int64', 0, 2 ** 40), ('int64', -2 ** 62, 2 ** 62)])
def test_randint_is_mxnets(both, dtype, low, high):
    for seed in (0, 3):
        _check(both, randint_draws, seed, dtype, low, high)


def per_element(mx, pdtype, odtype):
    mx.random.seed(9)
    lo = mx.nd.array([0, 10, -5], dtype=pdtype)
    hi = mx.nd.array([1, 13, -4], dtype=pdtype)
    sc = mx.nd.array([1, 3, 2], dtype=pdtype)
    return [mx.nd.random.uniform(lo, hi, shape=(700,), dtype=odtype).asnumpy(),
            mx.nd.random.normal(lo, sc, shape=(30, 2), dtype=odtype).asnumpy(),
            mx.nd.random.uniform(lo, hi, dtype=odtype).asnumpy(),
            mx.random.normal(lo, sc, shape=40, dtype=odtype).asnumpy()]


@pytest.mark.parametrize('odtype', ['float32', 'float64', 'float16'])
@pytest.mark.parametrize('pdtype', ['float32', 'float64', 'float16', 'int32'])
def test_per_element_parameters_are_mxnets(both, pdtype, odtype):
    _check(both, per_element, pdtype, odtype)


def seeding_and_forms(mx):
    res = []
    mx.random.seed(5, ctx=mx.cpu(2))
    res.append(mx.nd.random.normal(shape=(100,)).asnumpy())
    mx.random.seed(5, ctx=mx.cpu())
    res.append(mx.nd.random.normal(shape=(100,), ctx=mx.cpu(1)).asnumpy())
    mx.random.seed(5)
    mx.random.seed(5)
    res.append(mx.nd.random.uniform(shape=(100,)).asnumpy())
    res.append(mx.random.uniform(shape=(3, 4)).asnumpy())
    res.append(mx.nd.random.randn(2, 3, dtype='float64').asnumpy())
    out = mx.nd.zeros((5, 5), dtype='float64')
    mx.nd.random.normal(out=out)
    res.append(out.asnumpy())
    out = mx.nd.zeros((7,), dtype='float16')
    mx.nd.random_uniform(out=out)
    res.append(out.asnumpy())
    res.append(mx.nd.random_normal(2, 3, shape=(4,)).asnumpy())
    res.append(mx.nd.uniform(1, 2, shape=(2, 2)).asnumpy())
    res.append(mx.nd.normal(shape=(2, 70)).asnumpy())
    mx.random.seed(7, ctx=mx.cpu(0))
    res.append(mx.nd.random.uniform(shape=(1000,), dtype='float16').asnumpy())
    return res


def test_seed_with_ctx_out_and_operator_forms_are_mxnets(both):
    _check(both, seeding_and_forms)


FRESH = r'''
import sys
sys.path.insert(0, %r)
import hashlib
import %s as mx
a = mx.nd.random.normal(shape=(1000,)).asnumpy()
b = mx.nd.random.uniform(shape=(70000,), dtype='float64').asnumpy()
c = mx.nd.random.randint(0, 100, shape=(9,)).asnumpy()
print(hashlib.sha256(a.tobytes() + b.tobytes() + c.tobytes()).hexdigest())
'''


def _fresh(lib, threads, script=FRESH, **env):
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, '..', '..', 'bindings', 'python')
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **env)
    res = subprocess.run([sys.executable, '-c', script % (path, lib)], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    return res.stdout.strip()


def test_fresh_process_and_thread_count(mxnet):
    """an unseeded process draws as one seeded with 0; MXNet's numbers do not depend on the
    number of OpenMP threads"""
    theirs = {_fresh('mxnet', t) for t in (1, 2)}
    assert len(theirs) == 1
    assert _fresh('mxkv', 1) in theirs


COPIES = r'''
import sys
sys.path.insert(0, %r)
import hashlib
import %s as mx
res = [mx.nd.random.uniform(shape=(5,)), mx.nd.random.normal(shape=(70,))]
mx.random.seed(4)
res += [mx.nd.random.uniform(shape=(5,)) for _ in range(4)]
res += [mx.nd.random.normal(shape=(3000,), dtype='float64'), mx.nd.random.randint(0, 9, shape=(80,))]
mx.random.seed(6, ctx=mx.cpu(1))
res += [mx.nd.random.uniform(shape=(65537,)), mx.nd.random.uniform(shape=(5,), ctx=mx.cpu(2))]
print(hashlib.sha256(b''.join(r.asnumpy().tobytes() for r in res)).hexdigest())
'''


@pytest.mark.parametrize('copies', ['1', '2', '3'])
def test_parallel_rand_copies(mxnet, copies):
    """MXNET_CPU_PARALLEL_RAND_COPY copies of the 1024 engines (copy i seeded with
    i * 16 + seed * 127), taken round robin by successive operators from copy 1 on"""
    theirs = _fresh('mxnet', 1, COPIES, MXNET_CPU_PARALLEL_RAND_COPY=copies)
    assert _fresh('mxkv', 1, COPIES, MXNET_CPU_PARALLEL_RAND_COPY=copies) == theirs


def test_engines_are_std_mt19937(mxkv):
    """the vectorised engines against numpy's MT19937 (std::mt19937's init_genrand and
    output), across block boundaries and uneven consumption"""
    from mxkv.ndarray import random as r
    bank = r._MTBank(123)
    ref = [np.random.RandomState(123 + j)._bit_generator for j in range(1024)]
    for m, n, counts in [(1024, 10, [10] * 1024), (5, 1300, [0, 1, 624, 1299, 1300]),
                         (3, 700, [700, 3, 624])]:
        words = bank.peek(m, n)
        for j in range(m):
            expect = ref[j].random_raw(counts[j])
            assert np.array_equal(words[j, :counts[j]], expect.astype(np.uint32))
        bank.consume(counts)
    words = bank.peek(1024, 2000)
    for j in (0, 1, 2, 3, 4, 1023):
        assert np.array_equal(words[j], ref[j].random_raw(2000).astype(np.uint32))


def round_up_to_one(mx):
    """engine 26 of seed 84 outputs a word >= 2**32 - 128 at position 745: float(word)
    / 2**32 rounds to 1.0, which MXNet's libstdc++ returns as it is"""
    mx.random.seed(84)
    n = 1024 * 746  # 746 numbers per engine
    u = mx.nd.random.uniform(shape=(n,)).asnumpy()
    mx.random.seed(84)
    v = mx.nd.random.normal(shape=(n,)).asnumpy()
    return [u, v, u[26 * 746 + 745:26 * 746 + 746]]


def test_float32_uniform_can_be_one_as_in_mxnet(both):
    mxnet, _ = both
    assert round_up_to_one(mxnet)[2][0] == 1.0
    _check(both, round_up_to_one)


def test_draws_are_made_by_the_library_as_by_numpy(mxkv):
    """the engines are seeded and every draw is made by libmxkv (MXKVMTSeed, MXKVMTDraw:
    the same engines, split and arithmetic, the C library's logf/log) with the numbers
    and engine states of the numpy implementation, which the tests above check against
    MXNet: every kind, of many sizes, after draws that leave the engines at uneven
    positions, from banks of seeds near 2**32"""
    from mxkv.ndarray import random as r
    if os.path.basename(os.environ.get('MXKV_LIBRARY_PATH', 'libmxkv')).startswith('libmxnet'):
        pytest.skip('a real libmxnet.so has no MXKVMTSeed / MXKVMTDraw')
    for name in ('MXKVMTSeed', 'MXKVMTDraw'):
        assert r._kernel(name) is not None, 'libmxkv does not export %s' % name
    for base in (77, 2 ** 32 - 5):
        lib_bank, np_bank = r._MTBank(base), r._MTBank(base, compiled=False)
        assert np.array_equal(lib_bank.key, np_bank.key)
        assert np.array_equal(lib_bank.pos, np_bank.pos)
        for ftype in (np.float32, np.float64):
            for n in (1, 63, 65, 1000, 65537, 3, 140001):
                for kind, m in (('uniform', n // 5 + 1), ('randint', n // 11 + 2),
                                ('normal', n), ('uniform', n), ('randint', n)):
                    lib = r._mt_draw(lib_bank, kind, m, ftype)
                    ref = r._mt_draw(np_bank, kind, m, ftype, compiled=False)
                    assert lib.dtype == ref.dtype
                    assert_same_bits(ref, lib, '%s %s n=%d' % (kind, ftype.__name__, m))
                    assert np.array_equal(lib_bank.pos, np_bank.pos)
                    assert np.array_equal(lib_bank.key, np_bank.key)


def test_draw_and_seed_refuse_bad_arguments_untouched(mxkv):
    """MXKVMTDraw / MXKVMTSeed return -1 with a text naming the fault, and write nothing,
    for a bad kind or dtype, a position outside [0, 624], NULL buffers with items
    announced and overlapping buffers"""
    import ctypes
    from mxkv.base import _LIB
    from mxkv.ndarray import random as r
    if os.path.basename(os.environ.get('MXKV_LIBRARY_PATH', 'libmxkv')).startswith('libmxnet'):
        pytest.skip('a real libmxnet.so has no MXKVMTSeed / MXKVMTDraw')
    bank = r._MTBank(5)
    key0, pos0 = bank.key.copy(), bank.pos.copy()
    out = np.full(100, 7, dtype=np.int64)
    keys, pos = r._states(bank)
    u32p, i64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_int64)

    def fails(rc, text):
        assert rc == -1
        err = _LIB.MXGetLastError().decode()
        assert text in err, err
        assert np.array_equal(bank.key, key0) and np.array_equal(bank.pos, pos0)
        assert (out == 7).all()

    draw, seed = _LIB.MXKVMTDraw, _LIB.MXKVMTSeed
    fails(draw(3, 0, keys, pos, 1024, 100, out.ctypes.data), 'kind 3')
    fails(draw(0, 6, keys, pos, 1024, 100, out.ctypes.data), 'dtype 6')
    fails(draw(2, 0, keys, pos, 1024, 100, out.ctypes.data), 'randint words are int64')
    fails(draw(1, 1, keys, pos, 1024, 100, None), 'out is NULL')
    fails(draw(0, 1, u32p(), pos, 1024, 100, out.ctypes.data), 'keys is NULL')
    fails(draw(0, 1, keys, pos, 1024, 2 ** 62, out.ctypes.data), 'beyond memory')
    fails(draw(2, 6, keys, pos, 1024, 100, bank.pos.ctypes.data), 'overlap')
    fails(seed(1, keys, ctypes.cast(keys, i64p), 1024), 'overlap')
    fails(seed(1, keys, i64p(), 1024), 'positions is NULL')
    bank.pos[3] = 625
    pos0 = bank.pos.copy()
    fails(draw(0, 0, keys, pos, 1024, 100, out.ctypes.data), 'outside [0, 624]')
    # nothing drawn, nothing needed
    assert draw(0, 0, u32p(), i64p(), 0, 0, None) == 0
    assert seed(1, u32p(), i64p(), 0) == 0
