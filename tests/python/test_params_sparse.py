"""Differential: sparse arrays (row_sparse, csr) through .params files, MXNet 1.9.1 <-> mxkv.

Each case is built the same way in both libraries (MXNDArrayCreateSparseEx, then
MXNDArraySyncCopyFromNDArray of the data and of each aux array, as MXNet's Python
constructors do): empty ones (no stored value, no rows), all-zero values, one row,
non-square, 1-d and 3-d row_sparse, float16/float64/uint8/int32/int64 values, and
arrays of a few MiB.
  * MXNet saves, mxkv loads (from the file and through a pipe): the same storage type,
    shape, dtype, data and aux arrays (dtype, shape, bytes) and dense values;
  * mxkv saves, MXNet loads: the same;
  * mxkv's file is byte for byte the one MXNet writes.
MXNet's ``NDArray::Save`` (src/ndarray/ndarray.cc, 1.9.1) writes a sparse array's storage
shape before it waits for the array: an array whose data is still being computed (a
``csr_matrix`` from a dense numpy array, saved at once) is written with a storage shape of
[0], and ``NDArray::Load`` then takes the storage shape from the aux shapes (the sparse
constructor does so for every storage shape of no elements; the first dim of any other is
set to the stored count). mxkv loads those files too.
"""
import ctypes
import os
import struct
import threading

import numpy as np
import pytest

STYPE = {'row_sparse': 1, 'csr': 2}
DT = {np.dtype(k): v for k, v in [('float32', 0), ('float64', 1), ('float16', 2), ('uint8', 3),
                                   ('int32', 4), ('int8', 5), ('int64', 6)]}
I64 = np.int64


def csr(shape, dtype, data, indptr, indices):
    return ('csr', shape, np.dtype(dtype), np.array(data, dtype=dtype),
            [np.array(indptr, dtype=I64), np.array(indices, dtype=I64)])


def rsp(shape, dtype, data, indices):
    rows = (len(indices),) + tuple(shape[1:])
    return ('row_sparse', shape, np.dtype(dtype), np.array(data, dtype=dtype).reshape(rows),
            [np.array(indices, dtype=I64)])


CASES = {
    'csr_eye_f32': csr((2, 2), 'float32', [1, 1], [0, 1, 2], [0, 1]),
    'csr_nonsquare_f64': csr((3, 5), 'float64', [1.5, -2, 3e300], [0, 2, 2, 3], [1, 4, 0]),
    'csr_1row_f16': csr((1, 4), 'float16', [0.5, -65504], [0, 2], [0, 3]),
    'csr_u8': csr((2, 3), 'uint8', [255, 7], [0, 1, 2], [2, 0]),
    'csr_i32': csr((2, 3), 'int32', [-7, 2 ** 31 - 1], [0, 1, 2], [2, 0]),
    'csr_i64': csr((4, 2), 'int64', [1 << 40, -5, 3], [0, 0, 1, 3, 3], [1, 0, 1]),
    'csr_zero_values': csr((2, 2), 'float32', [0, 0], [0, 1, 2], [1, 0]),
    'csr_nnz0': csr((3, 4), 'float32', [], [0, 0, 0, 0], []),
    'csr_no_rows': csr((0, 3), 'float32', [], [0], []),
    'rsp_f32': rsp((4, 2), 'float32', [1, 2, 3, 4], [0, 3]),
    'rsp_1d_f64': rsp((5,), 'float64', [2.5, -1], [1, 4]),
    'rsp_3d_f16': rsp((3, 2, 2), 'float16', [1, 2, 3, 4], [2]),
    'rsp_1row_u8': rsp((1, 3), 'uint8', [1, 2, 3], [0]),
    'rsp_i32': rsp((3, 2), 'int32', [-1, 2, 2 ** 31 - 1, -2 ** 31], [0, 2]),
    'rsp_i64': rsp((6, 1), 'int64', [1 << 50, -3], [1, 5]),
    'rsp_all_rows': rsp((3, 2), 'float32', [1, 2, 3, 4, 5, 6], [0, 1, 2]),
    'rsp_zero_values': rsp((3, 2), 'float32', [0, 0, 0, 0], [0, 2]),
    'rsp_nnz0': rsp((3, 2), 'float32', [], []),
    'rsp_no_rows': rsp((0, 2), 'float32', [], []),
    # beyond 1 MiB: read from a pipe through chunks, whose edges fall inside the
    # data and across its end into the aux arrays
    'rsp_big_f64': rsp((140005, 3), 'float64', np.arange(210000) - 7.25,
                       np.arange(70000) * 2 + 1),
    'csr_big_f32': csr((1000, 1000), 'float32', np.arange(200000) * 0.5,
                       np.arange(1001) * 200, np.tile(np.arange(0, 1000, 5), 1000)),
}


def make(m, case):
    """`case` built in library `m` through its C API."""
    stype, shape, dtype, data, aux = case
    shp = (ctypes.c_uint32 * len(shape))(*shape)
    aux_types = (ctypes.c_int * len(aux))(*[DT[a.dtype] for a in aux])
    aux_ndims = (ctypes.c_uint32 * len(aux))(*[a.ndim for a in aux])
    aux_shapes = (ctypes.c_uint32 * len(aux))(*[a.shape[0] for a in aux])
    h = ctypes.c_void_p()
    m.base.check_call(m.base._LIB.MXNDArrayCreateSparseEx(
        STYPE[stype], shp, len(shape), 1, 0, 0, DT[dtype], len(aux), aux_types, aux_ndims,
        aux_shapes, ctypes.byref(h)))
    cls = m.nd.sparse.CSRNDArray if stype == 'csr' else m.nd.sparse.RowSparseNDArray
    arr = cls(h)
    for i, part in [(-1, data)] + list(enumerate(aux)):
        src = m.nd.array(part, dtype=part.dtype)
        m.base.check_call(m.base._LIB.MXNDArraySyncCopyFromNDArray(
            arr.handle, src.handle, ctypes.c_int(i)))
    arr.wait_to_read()
    return arr


def raw(a):
    n = a.asnumpy()
    return (np.dtype(n.dtype).str, n.shape, np.ascontiguousarray(n).tobytes())


def parts(a):
    """A sparse array's data and aux arrays (dtype, shape, bytes)."""
    aux = [a.indices] if a.stype == 'row_sparse' else [a.indptr, a.indices]
    return [raw(a.data)] + [raw(x) for x in aux]


def describe(a):
    """Everything a loaded sparse array holds."""
    return (a.stype, tuple(a.shape), np.dtype(a.dtype).str, parts(a),
            [np.dtype(t).str for t in a._aux_types],
            # (MXNet cannot densify an array of no rows: its shape reads as unknown)
            raw(a) if a.shape[0] else None)


def describe_file(m, path):
    got = m.nd.load(path)
    assert isinstance(got, dict)
    return {k: describe(v) for k, v in got.items()}


def save(m, path, arrays):
    m.nd.save(path, arrays)
    with open(path, 'rb') as f:
        return f.read()


def through_pipe(mxkv, data):
    """mxkv's load of `data` read from a pipe (a file of no length)."""
    r, w = os.pipe()

    def feed():
        try:
            with os.fdopen(w, 'wb') as f:
                f.write(data)
        except BrokenPipeError:
            pass  # the load stopped reading (it refused the file)
    t = threading.Thread(target=feed, daemon=True)
    t.start()
    try:
        return mxkv.nd.load('/proc/self/fd/%d' % r)
    finally:
        os.close(r)
        t.join(10)


@pytest.mark.parametrize('name', sorted(CASES))
def test_mxnet_saves_mxkv_loads(both, tmp_path, name):
    mxnet, mxkv = both
    path = str(tmp_path / 'a.params')
    data = save(mxnet, path, {name: make(mxnet, CASES[name])})
    want = describe_file(mxnet, path)
    assert describe_file(mxkv, path) == want
    assert {k: describe(v) for k, v in through_pipe(mxkv, data).items()} == want


@pytest.mark.parametrize('name', sorted(CASES))
def test_mxkv_saves_mxnet_loads_same_bytes(both, tmp_path, name):
    mxnet, mxkv = both
    mine, theirs = str(tmp_path / 'mxkv.params'), str(tmp_path / 'mxnet.params')
    got = save(mxkv, mine, {name: make(mxkv, CASES[name])})
    want = save(mxnet, theirs, {name: make(mxnet, CASES[name])})
    assert describe_file(mxnet, mine) == describe_file(mxnet, theirs)
    assert describe_file(mxkv, mine) == describe_file(mxnet, theirs)
    assert got == want


def test_all_cases_in_one_file(both, tmp_path):
    mxnet, mxkv = both
    mine, theirs = str(tmp_path / 'mxkv.params'), str(tmp_path / 'mxnet.params')
    got = save(mxkv, mine, {k: make(mxkv, c) for k, c in CASES.items()})
    want = save(mxnet, theirs, {k: make(mxnet, c) for k, c in CASES.items()})
    assert got == want
    assert describe_file(mxkv, theirs) == describe_file(mxnet, theirs)
    assert describe_file(mxnet, mine) == describe_file(mxnet, theirs)


@pytest.mark.parametrize('stype', ['csr', 'row_sparse'])
@pytest.mark.parametrize('dtype', ['float32', 'float16', 'int64'])
def test_sparse_zeros(both, tmp_path, stype, dtype):
    mxnet, mxkv = both
    mine, theirs = str(tmp_path / 'mxkv.params'), str(tmp_path / 'mxnet.params')
    got = save(mxkv, mine, {'z': mxkv.nd.sparse.zeros(stype, (3, 2), dtype=dtype)})
    want = save(mxnet, theirs, {'z': mxnet.nd.sparse.zeros(stype, (3, 2), dtype=dtype)})
    assert describe_file(mxkv, theirs) == describe_file(mxnet, theirs)
    assert describe_file(mxnet, mine) == describe_file(mxnet, theirs)
    assert got == want


def python_constructors(mx):
    """MXNet's Python constructors, saved without waiting (as a user does)."""
    dense = np.array([[0, 1.5, 0], [0, 0, 0], [-2, 0, 3]], dtype='float32')
    return {
        'csr_of_dense': mx.nd.sparse.csr_matrix(np.eye(2, dtype='float32')),
        'csr_of_dense_f64': mx.nd.sparse.csr_matrix(dense.astype('float64')),
        'csr_of_parts': mx.nd.sparse.csr_matrix(([1.5, -2, 3], [1, 0, 2], [0, 1, 1, 3]),
                                                shape=(3, 3)),
        'csr_tostype': mx.nd.array(dense).tostype('csr'),
        'rsp_of_dense': mx.nd.sparse.row_sparse_array(dense),
        'rsp_of_parts': mx.nd.sparse.row_sparse_array(([[1, 2], [3, 4]], [1, 3]), shape=(5, 2)),
        'rsp_tostype': mx.nd.array(dense).tostype('row_sparse'),
    }


def test_mxnet_python_constructors_saved_at_once(both, tmp_path):
    """The issue's repro: whatever storage shape MXNet writes for an array it has not
    finished computing, mxkv loads what MXNet loads."""
    mxnet, mxkv = both
    for name, arr in python_constructors(mxnet).items():
        path = str(tmp_path / (name + '.params'))
        data = save(mxnet, path, {name: arr})
        want = describe_file(mxnet, path)
        assert describe_file(mxkv, path) == want, name
        assert {k: describe(v) for k, v in through_pipe(mxkv, data).items()} == want, name


def sshape_at(data):
    """Offset of the storage shape of a file's only array, and the length of that field."""
    ndim, = struct.unpack_from('<i', data, 32)
    return 32, 4 + 8 * ndim


def with_sshape(data, dims):
    at, n = sshape_at(data)
    field = struct.pack('<i', len(dims)) + b''.join(struct.pack('<q', d) for d in dims)
    return data[:at] + field + data[at + n:]


@pytest.mark.parametrize('name,dims', [
    ('csr_eye_f32', [0]), ('csr_nonsquare_f64', [0]), ('csr_nonsquare_f64', [3, 0]),
    ('csr_nnz0', [0]), ('rsp_f32', [0]), ('rsp_f32', [0, 2]), ('rsp_f32', [7, 0]),
    ('rsp_3d_f16', [0]), ('rsp_1d_f64', [0]), ('rsp_nnz0', [0]),
    # with elements: all but the first dim must agree
    ('csr_eye_f32', [1]), ('csr_eye_f32', [3]), ('csr_nonsquare_f64', [9]),
    ('rsp_f32', [1, 2]), ('rsp_f32', [7, 2]), ('rsp_3d_f16', [5, 2, 2]), ('rsp_1d_f64', [9]),
])
def test_storage_shape_comes_from_the_aux_shapes(both, tmp_path, name, dims):
    """NDArray::Load hands the storage shape to the sparse constructor, which replaces a
    storage shape of no elements by the one the aux shapes give (ndarray.cc: 'if
    (storage_shape.Size() == 0 ...)'); allocating the aux arrays then sets the first dim
    of any storage shape to the stored count (Chunk::set_aux_shape). An array whose
    stored count an operation was changing is saved with the old one: MXNet loads it."""
    mxnet, mxkv = both
    path = str(tmp_path / 'a.params')
    data = with_sshape(save(mxnet, path, {name: make(mxnet, CASES[name])}), dims)
    with open(path, 'wb') as f:
        f.write(data)
    want = describe_file(mxnet, path)
    assert want == {name: describe(make(mxnet, CASES[name]))}
    assert describe_file(mxkv, path) == want
    assert {k: describe(v) for k, v in through_pipe(mxkv, data).items()} == want


@pytest.mark.parametrize('name,dims', [
    ('csr_eye_f32', []), ('csr_eye_f32', [2, 1]), ('csr_eye_f32', [-3]),
    ('rsp_f32', [2]), ('rsp_f32', [2, 5]), ('rsp_f32', [-1, 2]), ('rsp_f32', [0, -1]),
    ('rsp_3d_f16', [1, 2, 3]), ('rsp_big_f64', [70000, 4]),
])
def test_storage_shape_that_disagrees_is_refused(mxkv, tmp_path, name, dims):
    """A storage shape that disagrees with the aux shapes beyond its first dim makes MXNet
    read the data with the one and the aux arrays with the others (the rest of the file is
    misread: here it fails, or a csr gets 2-d data), and a negative dim makes it fail:
    mxkv refuses them."""
    path = str(tmp_path / 'a.params')
    data = with_sshape(save(mxkv, path, {name: make(mxkv, CASES[name])}), dims)
    with open(path, 'wb') as f:
        f.write(data)
    with pytest.raises(mxkv.base.MXNetError, match='Invalid NDArray file format'):
        mxkv.nd.load(path)
    with pytest.raises(mxkv.base.MXNetError, match='Invalid NDArray file format'):
        through_pipe(mxkv, data)


def mxnet_int32_aux(mx, stype):
    """A sparse array with int32 aux arrays: MXNet's C API makes them (its Python refuses)."""
    if stype == 'csr':
        case = ('csr', (2, 3), np.dtype('float32'), np.array([1, 2], 'float32'),
                [np.array([0, 1, 2], 'int32'), np.array([2, 0], 'int32')])
    else:
        case = ('row_sparse', (4, 2), np.dtype('float32'), np.array([[1, 2], [3, 4]], 'float32'),
                [np.array([0, 3], 'int32')])
    return make(mx, case)


@pytest.mark.parametrize('stype', ['csr', 'row_sparse'])
def test_int32_aux_arrays_are_refused_clearly(both, tmp_path, stype):
    mxnet, mxkv = both
    path = str(tmp_path / 'a.params')
    arr = mxnet_int32_aux(mxnet, stype)
    assert [np.dtype(t) for t in arr._aux_types] == [np.dtype('int32')] * len(arr._aux_types)
    save(mxnet, path, [arr])
    # (MXNet loads them, but cannot densify them: 'Unknown type enum 4')
    assert parts(mxnet.nd.load(path)[0]) == parts(arr)
    with pytest.raises(mxkv.base.MXNetError, match=r'array 0 is a %s array with int32 \(type 4\) '
                       r'aux arrays: libmxkv holds sparse arrays with int64 \(type 6\) aux '
                       r'arrays only' % stype):
        mxkv.nd.load(path)


# Sparse arrays MXNet 1.9.1 saves and loads though they are no valid csr/row_sparse
# array: NDArray::Save checks nothing (no CheckFormat), and NDArray::Load reads the aux
# arrays with the shapes the file gives. A csr made with MXNDArrayCreateSparseEx and never
# filled has an empty indptr (so has one loaded from its file); MXNet's C API also takes an
# indptr of any length, and row indices in any order.
DEGENERATE = {
    'csr_indptr_empty': csr((3, 4), 'float32', [], [], []),
    'csr_indptr_empty_2_values': csr((3, 4), 'float32', [1, 2], [], [0, 1]),
    'csr_indptr_short': csr((3, 4), 'float32', [], [0, 0], []),
    'csr_indptr_long': csr((3, 4), 'float64', [], [0, 0, 0, 0, 0, 0], []),
    'csr_indptr_short_2_values': csr((3, 4), 'float16', [1, 2], [0, 2], [0, 1]),
    'csr_no_rows_indptr_empty': csr((0, 4), 'float32', [], [], []),
    'csr_indptr_garbage': csr((3, 4), 'int32', [1, 2], [0, 5, -1, 2], [0, 9]),
    'rsp_indices_unsorted_out_of_range': rsp((4, 2), 'float32', [1, 2, 3, 4, 5, 6], [3, -1, 7]),
    'csr_indptr_long_2_values': csr((3, 4), 'float32', [1, 2], [0, 1, 2, 2, 7], [3, 0]),
}


@pytest.mark.parametrize('name', sorted(DEGENERATE))
def test_degenerate_sparse_arrays_resave_as_mxnet(both, tmp_path, name):
    """mxkv's save of what it loaded from MXNet's file is that file, byte for byte (mxkv
    refused to save a csr whose indptr does not hold rows + 1 offsets)"""
    mxnet, mxkv = both
    theirs, mine = str(tmp_path / 'mxnet.params'), str(tmp_path / 'mxkv.params')
    want = save(mxnet, theirs, {name: make(mxnet, DEGENERATE[name])})
    loaded = mxkv.nd.load(theirs)
    assert {k: parts(v) for k, v in loaded.items()} == \
        {k: parts(v) for k, v in mxnet.nd.load(theirs).items()}
    assert save(mxkv, mine, loaded) == want
    # and MXNet's own round trip gives the same file again
    assert save(mxnet, str(tmp_path / 'again.params'), mxnet.nd.load(theirs)) == want


def test_csr_values_and_indices_of_other_lengths_are_not_saved(mxkv, tmp_path):
    """a csr whose data and column indices differ in length would be read back with the
    indices' length (MXNet's Load): refused, nothing written"""
    arr = make(mxkv, csr((3, 4), 'float32', [1, 2], [0, 1, 2, 2], [0, 1]))
    three = mxkv.nd.array(np.array([1, 2, 3], np.float32))
    mxkv.base.check_call(mxkv.base._LIB.MXNDArraySyncCopyFromNDArray(
        arr.handle, three.handle, ctypes.c_int(-1)))
    path = tmp_path / 'a.params'
    with pytest.raises(mxkv.base.MXNetError, match='2 indices for 3 values'):
        mxkv.nd.save(str(path), [arr])
    assert not path.exists()


DENSIFIED = ['csr_indptr_empty', 'csr_indptr_long', 'csr_indptr_short', 'csr_indptr_long_2_values']
MXNET_DIES_DENSIFYING = ['csr_indptr_empty_2_values', 'csr_indptr_short_2_values',
                         'csr_indptr_garbage', 'rsp_indices_unsorted_out_of_range']


@pytest.mark.parametrize('name', DENSIFIED)
def test_degenerate_sparse_arrays_densify_as_mxnet(both, tmp_path, name):
    """MXNet's cast_storage reads no part of a csr of no stored value, and the first
    rows + 1 offsets of a longer indptr"""
    mxnet, mxkv = both
    path = str(tmp_path / 'a.params')
    save(mxnet, path, [make(mxnet, DEGENERATE[name])])
    assert raw(mxkv.nd.load(path)[0]) == raw(mxnet.nd.load(path)[0])


@pytest.mark.parametrize('name', MXNET_DIES_DENSIFYING)
def test_degenerate_sparse_arrays_mxnet_dies_densifying_are_refused(both, tmp_path, name):
    """stored values with an indptr shorter than rows + 1 (mxkv gave zeros for an empty
    one), offsets or row indices outside the parts: MXNet reads outside its buffers and
    dies (checked in a subprocess); mxkv raises"""
    import subprocess
    import sys
    mxnet, mxkv = both
    path = str(tmp_path / 'a.params')
    save(mxnet, path, [make(mxnet, DEGENERATE[name])])
    code = 'import mxnet as mx\nmx.nd.load(%r)[0].asnumpy()\n' % path
    died = subprocess.run([sys.executable, '-c', code], capture_output=True, timeout=120)
    assert died.returncode < 0, (died.returncode, died.stderr[-300:])
    with pytest.raises(mxkv.base.MXNetError):
        mxkv.nd.load(path)[0].asnumpy()
