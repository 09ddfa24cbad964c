"""``mx.random.seed`` and the samplers of ``mx.nd.random`` / ``mx.nd.random_*`` (issue 9,
section 5).

The differential checks here compare shapes, dtypes, contexts, returned objects, which
calls fail and how; the rest checks that mxkv is reproducible under a seed and samples the
right distribution.  That the numbers themselves are MXNet's (CPU contexts) is
test_random_mxnet_bits.py.
"""
import numpy as np
import pytest

from conftest import assert_same_bits


def run_both(both, scenario, *args):
    mxnet, mxkv = both
    expected = scenario(mxnet, *args)
    got = scenario(mxkv, *args)
    assert_same_bits(expected, got, '%s%r' % (scenario.__name__, args))
    return got


def _outcome(mx, fn):
    """(shape, dtype, ctx, class) of fn()'s array, or the kind of error it raised (MXNet
    checks parameters asynchronously: its error comes at the read)"""
    try:
        res = fn()
        res.asnumpy()
    except AssertionError:
        return 'AssertionError'
    except mx.base.MXNetError:
        return 'MXNetError'
    except ValueError:
        return 'ValueError'
    return (res.shape, np.dtype(res.dtype).name, str(res.context), type(res).__name__)


CALLS = {
    'uniform()': lambda mx: mx.nd.random.uniform(),
    'uniform(shape)': lambda mx: mx.nd.random.uniform(shape=(2, 3)),
    'uniform(int shape)': lambda mx: mx.nd.random.uniform(shape=4),
    'uniform(pos)': lambda mx: mx.nd.random.uniform(-1, 1, (3,)),
    'uniform(f64)': lambda mx: mx.nd.random.uniform(shape=(2,), dtype='float64'),
    'uniform(f16)': lambda mx: mx.nd.random.uniform(shape=(2,), dtype=np.float16),
    'uniform(int32)': lambda mx: mx.nd.random.uniform(shape=(2,), dtype='int32'),
    'uniform(ctx)': lambda mx: mx.nd.random.uniform(shape=(2,), ctx=mx.cpu(3)),
    'uniform(low>high)': lambda mx: mx.nd.random.uniform(2, 1, shape=(2,)),
    'uniform(low=high)': lambda mx: mx.nd.random.uniform(2, 2, shape=(2,)),
    'uniform(nan)': lambda mx: mx.nd.random.uniform(float('nan'), 1, shape=(2,)),
    'uniform(nd)': lambda mx: mx.nd.random.uniform(mx.nd.array([0, 10]), mx.nd.array([1, 11]),
                                                  shape=(3, 2)),
    'uniform(nd, no shape)': lambda mx: mx.nd.random.uniform(mx.nd.array([0, 10]),
                                                             mx.nd.array([1, 11])),
    'uniform(nd f64)': lambda mx: mx.nd.random.uniform(mx.nd.array([0], dtype='float64'),
                                                       mx.nd.array([1], dtype='float64')),
    'uniform(nd, number)': lambda mx: mx.nd.random.uniform(mx.nd.array([0, 10]), 1),
    'uniform(out)': lambda mx: mx.nd.random.uniform(out=mx.nd.zeros((2, 2), dtype='float64')),
    'uniform(out, bad shape)': lambda mx: mx.nd.random.uniform(shape=(3,),
                                                               out=mx.nd.zeros((2,))),
    'normal()': lambda mx: mx.nd.random.normal(),
    'normal(kw)': lambda mx: mx.nd.random.normal(loc=1, scale=2, shape=(2, 2)),
    'normal(f16)': lambda mx: mx.nd.random.normal(shape=(5,), dtype='float16'),
    'normal(scale 0)': lambda mx: mx.nd.random.normal(0, 0, shape=(2,)),
    'normal(scale<0)': lambda mx: mx.nd.random.normal(0, -1, shape=(2,)),
    'normal(nd)': lambda mx: mx.nd.random.normal(mx.nd.array([[0, 1]]), mx.nd.array([[1, 2]]),
                                                 shape=2),
    'randn': lambda mx: mx.nd.random.randn(2, 3),
    'randn(kw)': lambda mx: mx.nd.random.randn(4, loc=1, scale=3, dtype='float64'),
    'randint': lambda mx: mx.nd.random.randint(0, 10, shape=(5,)),
    'randint(int64)': lambda mx: mx.nd.random.randint(-3, 3, shape=(2,), dtype='int64'),
    'mx.random.uniform': lambda mx: mx.random.uniform(shape=(2,)),
    'mx.random.normal': lambda mx: mx.random.normal(shape=(2,)),
    'nd.random_uniform': lambda mx: mx.nd.random_uniform(low=0, high=1, shape=(2, 2)),
    'nd.random_uniform(pos)': lambda mx: mx.nd.random_uniform(5, 6, (3,)),
    'nd.random_uniform()': lambda mx: mx.nd.random_uniform(),
    'nd.random_uniform(out)': lambda mx: mx.nd.random_uniform(out=mx.nd.zeros((3,))),
    'nd.random_normal': lambda mx: mx.nd.random_normal(loc=0, scale=1, shape=(3,),
                                                       dtype='float64'),
    'nd.random_normal(ctx)': lambda mx: mx.nd.random_normal(shape=(3,), ctx=mx.cpu(1)),
    'nd.random_normal()': lambda mx: mx.nd.random_normal(),
    'nd.uniform': lambda mx: mx.nd.uniform(shape=(1, 2)),
    'nd.normal': lambda mx: mx.nd.normal(shape=(2,)),
}


def call_outcome(mx, name):
    return _outcome(mx, lambda: CALLS[name](mx))


@pytest.mark.parametrize('name', sorted(CALLS))
def test_signatures_match_mxnet(both, name):
    run_both(both, call_outcome, name)


def out_is_returned(mx):
    out = mx.nd.zeros((4,))
    res = [mx.nd.random.uniform(out=out) is out, mx.nd.random.normal(out=out) is out,
           mx.nd.random_uniform(out=out) is out, mx.nd.random_normal(out=out) is out]
    return res + [bool((out.asnumpy() != 0).any())]


def test_out_is_returned_like_mxnet(both):
    assert run_both(both, out_is_returned) == [True] * 5


def seed_checks(mx):
    res = []
    for bad in (1.5, '3', None):
        try:
            mx.random.seed(bad)
            res.append('accepted')
        except ValueError:
            res.append('ValueError')
    for ok in (0, -3, 2 ** 40, np.int64(7)):
        mx.random.seed(ok)
        res.append('ok')
    mx.random.seed(3, ctx=mx.cpu(1))
    return res


def test_seed_arguments_like_mxnet(both):
    run_both(both, seed_checks)


def reproducible(mx):
    """what MXNet guarantees about seeds, as equalities"""
    def draw(ctx=None):
        return mx.nd.random.uniform(shape=(6,), ctx=ctx).asnumpy()

    mx.random.seed(42)
    a = draw()
    b = draw()
    mx.random.seed(42)
    a2 = draw()
    mx.random.seed(42, ctx=mx.cpu(0))
    a3 = draw()
    mx.random.seed(42 + 2 ** 32)  # a C int: the same seed
    a4 = draw()
    mx.random.seed(42)
    a5 = draw(mx.cpu(1))          # all CPU contexts share one generator
    mx.random.seed(43)
    c = draw()
    return [bool((a == a2).all()), bool((a == a3).all()), bool((a == a4).all()),
            bool((a == a5).all()), bool((a != b).any()), bool((a != c).any())]


def test_seed_reproducibility_like_mxnet(both):
    assert run_both(both, reproducible) == [True] * 6


# --- mxkv alone: the distributions ------------------------------------------------------
def test_seeded_streams_repeat_for_every_sampler(mxkv):
    mx = mxkv

    def draws():
        return [mx.nd.random.uniform(-2, 3, shape=(5,)).asnumpy(),
                mx.nd.random.normal(1, 2, shape=(5,), dtype='float64').asnumpy(),
                mx.nd.random_uniform(shape=(2, 2)).asnumpy(),
                mx.nd.random_normal(shape=(3,)).asnumpy(),
                mx.nd.random.randn(4).asnumpy(),
                mx.nd.random.randint(0, 1000, shape=(6,)).asnumpy(),
                mx.random.uniform(mx.nd.array([0, 5]), mx.nd.array([1, 6]), shape=3).asnumpy()]

    mx.random.seed(1234)
    first = draws()
    mx.random.seed(1234)
    assert_same_bits(first, draws(), 'seeded draws')
    mx.random.seed(1235)
    other = draws()
    assert all((x != y).any() for x, y in zip(first, other))


def test_uniform_and_normal_sample_their_distributions(mxkv):
    mx = mxkv
    mx.random.seed(7)
    u = mx.nd.random.uniform(-1, 3, shape=(20000,)).asnumpy()
    # (<= high: as in MXNet, a float32 draw can round up to 1, i.e. to high)
    assert u.dtype == np.float32 and u.min() >= -1 and u.max() <= 3
    assert abs(u.mean() - 1) < 0.05 and abs(u.std() - 4 / np.sqrt(12)) < 0.05
    n = mx.nd.random.normal(2, 0.5, shape=(20000,), dtype='float64').asnumpy()
    assert n.dtype == np.float64
    assert abs(n.mean() - 2) < 0.02 and abs(n.std() - 0.5) < 0.02
    h = mx.nd.random.uniform(0, 1, shape=(50000,), dtype='float16').asnumpy()
    # as in MXNet, a draw above 1 - 2**-12 rounds to high in float16
    assert h.dtype == np.float16 and h.min() >= 0 and h.max() <= 1
    r = mx.nd.random.randint(-3, 3, shape=(5000,)).asnumpy()
    assert r.dtype == np.int32 and set(r.tolist()) == set(range(-3, 3))


def test_per_element_parameters(mxkv):
    mx = mxkv
    mx.random.seed(11)
    low = mx.nd.array([0, 10, -5])
    high = mx.nd.array([1, 11, -4])
    s = mx.nd.random.uniform(low, high, shape=(1000,)).asnumpy()
    assert s.shape == (3, 1000)
    for i, (lo, hi) in enumerate([(0, 1), (10, 11), (-5, -4)]):
        assert s[i].min() >= lo and s[i].max() <= hi
    n = mx.nd.random.normal(mx.nd.array([100, -100]), mx.nd.array([1, 1]),
                            shape=(2000,)).asnumpy()
    assert abs(n[0].mean() - 100) < 0.2 and abs(n[1].mean() + 100) < 0.2


def test_updater_with_random_noise_runs_in_the_store(mxkv):
    """tutorials add random noise to gradients in an updater"""
    mx = mxkv
    mx.random.seed(3)
    kv = mx.kv.create('local')
    kv.init(0, mx.nd.zeros((2, 2)))

    def upd(key, grad, weight):
        weight += grad + mx.nd.random.normal(0, 1e-3, shape=grad.shape)

    kv._set_updater(upd)
    kv.push(0, mx.nd.ones((2, 2)))
    out = mx.nd.zeros((2, 2))
    kv.pull(0, out=out)
    assert np.abs(out.asnumpy() - 1).max() < 0.01 and (out.asnumpy() != 1).any()
