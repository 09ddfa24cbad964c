"""Differential: ``nd.load`` of hand-made .params files in every format MXNet 1.9.1 reads.

MXNet 1.9.1 still loads the formats of before sparse arrays (``NDArray::LegacyLoad``):
V1 (magic 0xF993FAC8, no storage type, int64 dims) and V0 (no magic: the first word is
the ndim, the dims are uint32). It refuses V3 (saved with np shape semantics) while those
are off, storage type -1 and ndim -1 (it fails reading those), and cuts a name at a NUL
byte. Each file below is loaded by real MXNet and by mxkv: the same arrays (storage type,
dtype, shape, bytes, device) and names, or both refuse it, or both hold a none array.
"""
import struct

import numpy as np
import pytest

HDR = lambda n: struct.pack('<QQQ', 0x112, 0, n)  # noqa: E731
NONAMES = struct.pack('<Q', 0)


def names(*ns):
    return struct.pack('<Q', len(ns)) + b''.join(struct.pack('<Q', len(n)) + n for n in ns)


def shp64(dims):
    return struct.pack('<i', len(dims)) + b''.join(struct.pack('<q', d) for d in dims)


def tail(data, ctx, dt):
    return struct.pack('<ii', *ctx) + struct.pack('<i', dt) + data


def v1(dims, data, ctx=(1, 0), dt=0):
    return struct.pack('<I', 0xF993FAC8) + shp64(dims) + tail(data, ctx, dt)


def v0(dims, data, ctx=(1, 0), dt=0):
    return (struct.pack('<I', len(dims)) + b''.join(struct.pack('<I', d) for d in dims)
            + tail(data, ctx, dt))


def v2(dims, data, ctx=(1, 0), dt=0):
    return struct.pack('<Ii', 0xF993FAC9, 0) + shp64(dims) + tail(data, ctx, dt)


def v3(dims, data, ctx=(1, 0), dt=0):
    return struct.pack('<Ii', 0xF993FACA, 0) + shp64(dims) + tail(data, ctx, dt)


F16 = struct.pack('<3e', 1.5, -2.25, 65504)
FILES = {
    # V1: every dtype MXNet 1.9.1 creates, contexts it ignores (gpu: loaded on cpu)
    'v1_f32': HDR(1) + v1([2, 2], struct.pack('<4f', 1, 2, 3, 4)) + NONAMES,
    'v1_f64': HDR(1) + v1([2], struct.pack('<2d', 0.1, -1e300), dt=1) + NONAMES,
    'v1_f16_gpu': HDR(1) + v1([3], F16, ctx=(2, 1), dt=2) + NONAMES,
    'v1_u8_3d': HDR(1) + v1([1, 2, 3], bytes(range(250, 256)), dt=3) + NONAMES,
    'v1_i32': HDR(1) + v1([2], struct.pack('<2i', -7, 2**31 - 1), dt=4) + NONAMES,
    'v1_i8': HDR(1) + v1([3], struct.pack('<3b', -128, 0, 127), dt=5) + NONAMES,
    'v1_i64': HDR(1) + v1([2, 1], struct.pack('<2q', -5, 1 << 40), dt=6) + NONAMES,
    'v1_scalar': HDR(1) + v1([], struct.pack('<f', 3.5)) + NONAMES,
    'v1_empty': HDR(1) + v1([0, 3], b'') + NONAMES,
    'v1_unknown_dim': HDR(1) + v1([-1, 2], b'') + NONAMES,  # none; the rest misread as names
    'v1_ndim_neg1': HDR(1) + struct.pack('<Ii', 0xF993FAC8, -1) + NONAMES,
    'v1_dim_neg2': HDR(1) + v1([-2, 2], b'') + NONAMES,
    'v1_bad_dtype': HDR(1) + v1([1], b'\0' * 8, dt=99) + NONAMES,
    'v1_short': HDR(1) + v1([4], struct.pack('<3f', 1, 2, 3)),
    # V0
    'v0_f32': HDR(1) + v0([2, 2], struct.pack('<4f', 5, 6, 7, 8)) + NONAMES,
    'v0_i32_5d': HDR(1) + v0([1, 2, 1, 1, 2], struct.pack('<4i', 1, -2, 3, -4), dt=4) + NONAMES,
    'v0_scalar': HDR(1) + v0([], struct.pack('<f', 4.5)) + NONAMES,
    'v0_empty': HDR(1) + v0([3, 0], b'') + NONAMES,
    'v0_big_dim': HDR(1) + v0([0xFFFFFFFF], b'') + NONAMES,
    'v0_ndim_too_big': HDR(1) + struct.pack('<I', 100000) + b'\0' * 64 + NONAMES,
    'v0_ndim_negative': HDR(1) + struct.pack('<I', 0xDEADBEEF) + b'\0' * 64 + NONAMES,
    'v0_ndim_min': HDR(1) + struct.pack('<I', 0x80000000) + NONAMES,
    # all three formats in one file, named
    'mixed_named': HDR(3) + v1([2], struct.pack('<2f', 1, 2)) + v0([1], struct.pack('<f', 9))
    + v2([2], struct.pack('<2f', -1, 0.5)) + names(b'arg:v1', b'arg:v0', b'aux:v2'),
    # V2 corners
    'v2_none': HDR(1) + struct.pack('<Iii', 0xF993FAC9, 0, 0) + NONAMES,
    'v2_ndim_neg1': HDR(1) + struct.pack('<Iii', 0xF993FAC9, 0, -1) + NONAMES,
    'v2_stype_neg1': HDR(1) + struct.pack('<Iii', 0xF993FAC9, -1, 0) + NONAMES,
    'v2_stype_neg1_ndim_neg1': HDR(1) + struct.pack('<Iii', 0xF993FAC9, -1, -1) + NONAMES,
    'v2_stype_3': HDR(1) + struct.pack('<Iii', 0xF993FAC9, 3, 0) + NONAMES,
    'v2_rsp_none': HDR(1) + struct.pack('<Ii', 0xF993FAC9, 1) + shp64([]) + shp64([]) + NONAMES,
    'v2_rsp_ndim_neg1': HDR(1) + struct.pack('<Iii', 0xF993FAC9, 1, -1) + NONAMES,
    'v2_dim_neg1': HDR(1) + v2([-1], b'') + NONAMES,
    # V3: refused with np shape semantics off (mxkv has none)
    'v3_dense': HDR(1) + v3([2], struct.pack('<2f', 1, 2)) + NONAMES,
    'v3_scalar': HDR(1) + v3([], struct.pack('<f', 7)) + NONAMES,
    # names holding NUL bytes end there
    'name_nul': HDR(1) + v2([2], struct.pack('<2f', 1, 2)) + names(b'arg:w\0x'),
    'names_nul': HDR(2) + v2([1], struct.pack('<f', 1)) + v2([1], struct.pack('<f', 2))
    + names(b'\0ab', b'c\0'),
}


def describe(mx, path, frombuffer=False):
    """What nd.load (or nd.load_frombuffer of the file's bytes) gives: ('error',), or the
    names and each array's storage type, dtype, shape and raw bytes (None for a none
    array)."""
    try:
        if frombuffer:
            with open(path, 'rb') as f:
                got = mx.nd.load_frombuffer(f.read())
        else:
            got = mx.nd.load(path)
    except Exception as e:  # noqa: BLE001 - both libraries' errors
        if 'unknown storage type: -1' in str(e):
            # MXNet's Python wraps no none array (its C API loads them)
            return ('holds a none array',)
        return ('error', type(e).__name__)
    items = sorted(got.items()) if isinstance(got, dict) else list(enumerate(got))
    if any(a.stype == 'undefined' for _, a in items):
        return ('holds a none array',)

    def one(a):
        if a.stype != 'default':
            return (a.stype, str(a.shape))
        try:
            shape = a.shape
        except Exception:  # noqa: BLE001 - a none array
            return None
        if shape is None or a.handle is None:
            return None
        arr = a.asnumpy()
        return (a.stype, np.dtype(arr.dtype).str, tuple(shape), np.ascontiguousarray(arr).tobytes(),
                a.context.device_type)
    return [(k, one(a)) for k, a in items]


@pytest.mark.parametrize('name', sorted(FILES))
def test_load_like_mxnet(both, tmp_path, name):
    mxnet, mxkv = both
    path = str(tmp_path / (name + '.params'))
    with open(path, 'wb') as f:
        f.write(FILES[name])
    want, got = describe(mxnet, path), describe(mxkv, path)
    if want[0] == 'error':
        assert got[0] == 'error', '%s: MXNet refuses it, mxkv loaded %r' % (name, got)
    else:
        assert got == want, name


def test_refusals_say_why(mxkv, tmp_path):
    want = {
        'v3_dense': 'ndarray was saved in np shape semantics, must be loaded in the same semantics',
        'v2_stype_neg1': 'Invalid NDArray file format: unknown storage type -1',
        'v2_ndim_neg1': 'Invalid NDArray file format: ndim -1',
        'v1_ndim_neg1': 'Invalid NDArray file format: ndim -1',
        'v0_ndim_negative': 'array magic 0xdeadbeef is no known version, and as the ndim of a '
                            'V0 array it is negative (-559038737)',
        'v1_short': 'Invalid NDArray file format: array of shape [4] needs 16 bytes, the file '
                    'holds 12 more',
    }
    for name, text in want.items():
        path = str(tmp_path / (name + '.params'))
        with open(path, 'wb') as f:
            f.write(FILES[name])
        with pytest.raises(mxkv.base.MXNetError, match=text.replace('[', r'\[').replace(']', r'\]')
                           .replace('(', r'\(').replace(')', r'\)')):
            mxkv.nd.load(path)


@pytest.mark.parametrize('name', sorted(FILES))
def test_load_frombuffer_like_mxnet(both, tmp_path, name):
    """nd.load_frombuffer (mxkv had none) loads what nd.load loads"""
    mxnet, mxkv = both
    path = str(tmp_path / (name + '.params'))
    with open(path, 'wb') as f:
        f.write(FILES[name])
    want = describe(mxnet, path, frombuffer=True)
    got = describe(mxkv, path, frombuffer=True)
    if want[0] == 'error':
        assert got[0] == 'error', '%s: MXNet refuses it, mxkv loaded %r' % (name, got)
    else:
        assert got == want == describe(mxnet, path), name


@pytest.mark.parametrize('buf', [b'', b'garbage', 'abc', bytearray(b'abc'), memoryview(b'a'),
                                 None])
def test_load_frombuffer_refusals(both, buf):
    def outcome(mx):
        try:
            mx.nd.load_frombuffer(buf)
        except Exception as e:  # noqa: BLE001 - both libraries' errors
            return 'MXNetError' if 'MXNetError' in [c.__name__ for c in type(e).__mro__] \
                else type(e).__name__
        return 'loaded'
    mxnet, mxkv = both
    assert outcome(mxkv) == outcome(mxnet) != 'loaded'


def test_load_frombuffer_of_saved_arrays(both, tmp_path):
    """a named dict with sparse arrays, saved by MXNet, through its bytes"""
    mxnet, mxkv = both
    path = str(tmp_path / 'a.params')
    dense = np.array([[0, 1.5], [0, 0], [-2, 0]], np.float32)
    mxnet.nd.save(path, {'w': mxnet.nd.array(dense), 'r': mxnet.nd.array(dense).tostype(
        'row_sparse'), 'c': mxnet.nd.array(dense).tostype('csr')})
    with open(path, 'rb') as f:
        data = f.read()
    want, got = mxnet.nd.load_frombuffer(data), mxkv.nd.load_frombuffer(data)
    assert sorted(got) == sorted(want) == ['c', 'r', 'w']
    for k in want:
        assert (got[k].stype, got[k].asnumpy().tobytes()) == \
            (want[k].stype, want[k].asnumpy().tobytes()), k


def test_load_frombuffer_reads_the_bytes_in_place(both, monkeypatch):
    """nd.load_frombuffer hands the bytes to MXNDArrayLoadFromBuffer, as MXNet's does (libmxkv
    had no such function: the bytes were copied into an in-memory file and loaded from there,
    7 times MXNet's time for a ResNet-50's 100 MB), and reads len(buf) % 2**32 of them"""
    mxnet, mxkv = both
    assert hasattr(mxkv.base._LIB, 'MXNDArrayLoadFromBuffer')

    def no_memfd(*args):
        raise AssertionError('load_frombuffer went through a memfd')
    monkeypatch.setattr(mxkv.ndarray.utils.os, 'memfd_create', no_memfd)
    vals = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5
    data = HDR(2) + v2([3, 4], vals.tobytes()) + v2([4], b'\x01\x02\x03\x04', dt=3) \
        + names(b'arg:w', b'aux:b')
    want, got = mxnet.nd.load_frombuffer(data), mxkv.nd.load_frombuffer(data)
    assert sorted(got) == sorted(want) == ['arg:w', 'aux:b']
    for k in want:
        assert (got[k].dtype, got[k].shape, got[k].asnumpy().tobytes()) == \
            (want[k].dtype, want[k].shape, want[k].asnumpy().tobytes()), k
    for cut in (data[:-1], data[:40]):
        with pytest.raises(mxkv.base.MXNetError):
            mxkv.nd.load_frombuffer(cut)


@pytest.mark.parametrize('frombuffer', [False, True])
@pytest.mark.parametrize('named', [False, True])
def test_load_asks_the_storage_types_in_one_call(both, tmp_path, monkeypatch, named,
                                                 frombuffer):
    """nd.load / load_frombuffer learn every loaded array's storage type in one call
    (MXKVNDArrayGetStorageTypes) instead of one MXNDArrayGetStorageType per array (most of
    the time of loading 10,000 small arrays); the arrays are MXNet's: dense, row_sparse and
    csr ones, saved by MXNet, as a list and named"""
    mxnet, mxkv = both
    dense = np.array([[0, 1.5], [0, 0], [-2, 0]], np.float32)
    arrays = []
    for i in range(40):
        a = mxnet.nd.array(dense + i)
        arrays.append(a if i % 3 == 0 else a.tostype('row_sparse' if i % 3 == 1 else 'csr'))
    path = str(tmp_path / 'a.params')
    mxnet.nd.save(path, {'p%02d' % i: a for i, a in enumerate(arrays)} if named else arrays)
    with open(path, 'rb') as f:
        data = f.read()
    lib = mxkv.base._LIB
    calls = []
    single = lib.MXNDArrayGetStorageType

    def counted(*args):
        calls.append(args)
        return single(*args)
    monkeypatch.setattr(lib, 'MXNDArrayGetStorageType', counted)

    def load(mx):
        return mx.nd.load_frombuffer(data) if frombuffer else mx.nd.load(path)
    got = load(mxkv)
    assert calls == []
    monkeypatch.undo()
    want = load(mxnet)
    if named:
        assert sorted(got) == sorted(want)
        got, want = [got[k] for k in sorted(got)], [want[k] for k in sorted(want)]
    assert [(type(a).__name__, a.stype, a.asnumpy().tobytes()) for a in got] == \
        [(type(a).__name__, a.stype, a.asnumpy().tobytes()) for a in want]


def test_storage_types_call_refuses_what_it_cannot_read(mxkv):
    """MXKVNDArrayGetStorageTypes: the codes MXNDArrayGetStorageType gives, or -1 with
    nothing written for a freed handle or NULL where handles are announced"""
    import ctypes
    lib = mxkv.base._LIB
    a, b = mxkv.nd.zeros((2,)), mxkv.nd.sparse.zeros('csr', (2, 2))
    c = mxkv.nd.sparse.zeros('row_sparse', (2, 2))
    handles = (ctypes.c_void_p * 3)(a.handle.value, b.handle.value, c.handle.value)
    out = (ctypes.c_int * 3)(7, 7, 7)
    assert lib.MXKVNDArrayGetStorageTypes(3, handles, out) == 0
    assert list(out) == [0, 2, 1]
    b.close()
    out = (ctypes.c_int * 3)(7, 7, 7)
    assert lib.MXKVNDArrayGetStorageTypes(3, handles, out) == -1
    assert 'handles[1]' in mxkv.base.py_str(lib.MXGetLastError())
    assert list(out) == [7, 7, 7]
    assert lib.MXKVNDArrayGetStorageTypes(1, None, out) == -1
    assert lib.MXKVNDArrayGetStorageTypes(1, handles, None) == -1
    assert lib.MXKVNDArrayGetStorageTypes(0, None, None) == 0
