"""Sparse NDArrays (``mxnet.nd.sparse``): ``RowSparseNDArray``, ``row_sparse_array``, ``zeros``.

A row_sparse array of logical shape ``(R, d1, ...)`` is held by the library as
two parts: **data**, a dense ``(nnz, d1, ...)`` array of the array's dtype, and
**indices** (aux 0), a dense int64 ``(nnz,)`` array of row numbers.  The parts
are created with ``MXNDArrayCreateSparseEx``, written with
``MXNDArraySyncCopyFromNDArray(dst, part, -1 | 0)`` and read back with
``MXNDArrayGetDataNDArray`` / ``MXNDArrayGetAuxNDArray``, exactly as MXNet's
own Python does.  libmxkv has no operators, so storage conversions
(``tostype``, ``copyto`` across storage types) and the little arithmetic
supported on row_sparse arrays are done in numpy on those parts, with MXNet's
results:

* densify: row ``indices[k]`` of the dense array is ``data[k]``, in storage
  order (a duplicated index: the later row wins); indices outside ``[0, R)``
  raise ``MXNetError`` (MXNet writes outside its buffer);
* dense -> row_sparse (``cast_storage``): the rows with at least one element
  ``!= 0`` (NaN counts, ``-0.0`` does not), in ascending order;
* row_sparse +/-/* row_sparse (``elemwise_add/sub/mul``): a row_sparse
  array over the sorted union of the indices, missing rows read as zeros;
* row_sparse +/- dense of one shape (``elemwise_add/sub``, also
  ``sparse.add/subtract`` with the dense array first): a dense array, the dense
  operand's own values (negated for ``rsp - dense``) where no row is stored;
  row_sparse * dense: a row_sparse array over the stored rows;
* any other operator with a sparse operand (``dense + rsp``, ``dense += rsp``,
  ``rsp / dense``, ``mx.nd.add`` ...): MXNet's storage fallback, i.e. the sparse
  operand densified and a dense result.

CSR arrays can be created (``zeros('csr', shape)``, ``csr_matrix``, a dense
array's ``tostype('csr')``), copied (``copy``, ``astype``, ``copyto``), sliced by
rows, loaded, saved, densified (``tostype('default')``, ``asnumpy``) and summed
(``sum``: over axis 0 or 1 as MXNet's sparse kernel, any other sum as the dense
one).
"""
import ctypes
import operator
import warnings

import numpy as np

from ..base import (_LIB, check_call, NDArrayHandle, MXNetError, MXKVUsageError, integer_types,
                    numeric_types, mx_real_t)
from ..context import Context, current_context
from .ndarray import (NDArray, dtype_np_to_mx, dtype_mx_to_np, _STORAGE_TYPE_STR_TO_ID,
                      _shape_tuple, _check_dims, _need_64bit)
from . import ndarray as _dense

__all__ = ['BaseSparseNDArray', 'RowSparseNDArray', 'CSRNDArray', 'row_sparse_array', 'csr_matrix',
           'retain', 'zeros', 'empty', 'array', 'add', 'subtract', 'multiply', 'divide',
           'zeros_like', 'sgd_update', 'sgd_mom_update', 'adam_update', 'ftrl_update']

_STORAGE_AUX_TYPES = {
    'row_sparse': [np.int64],
    'csr': [np.int64, np.int64],
}


def _new_alloc_handle(stype, shape, ctx, delay_alloc, dtype, aux_types, aux_shapes=None):
    """MXNDArrayCreateSparseEx with MXNet's arguments (int64 aux arrays only)."""
    hdl = NDArrayHandle()
    for aux_t in aux_types:
        if np.dtype(aux_t) != np.dtype('int64'):
            raise NotImplementedError('only int64 is supported for aux types')
    shape, fits32 = _check_dims(_shape_tuple(shape))
    aux_type_ids = [dtype_np_to_mx(aux_t) for aux_t in aux_types]
    aux_shapes = [(0,) for _ in aux_types] if aux_shapes is None else aux_shapes
    aux_shape_lens = [len(s) for s in aux_shapes]
    flat_aux, aux_fit32 = _check_dims([d for s in aux_shapes for d in s], 'aux shape')
    c_aux_types = (ctypes.c_int * len(aux_type_ids))(*aux_type_ids)
    if fits32 and aux_fit32:  # MXNet's mx_uint entry point
        c_shape = (ctypes.c_uint32 * len(shape))(*shape)
        c_aux_ndims = (ctypes.c_uint32 * len(aux_shape_lens))(*aux_shape_lens)
        c_aux_shapes = (ctypes.c_uint32 * max(len(flat_aux), 1))(*flat_aux)
        create = _LIB.MXNDArrayCreateSparseEx
    else:  # a dim >= 2**32: the int64 entry point (never truncate)
        _need_64bit('MXNDArrayCreateSparseEx64', shape)
        c_shape = (ctypes.c_int64 * len(shape))(*shape)
        c_aux_ndims = (ctypes.c_int * len(aux_shape_lens))(*aux_shape_lens)
        c_aux_shapes = (ctypes.c_int64 * max(len(flat_aux), 1))(*flat_aux)
        create = _LIB.MXNDArrayCreateSparseEx64
    check_call(create(
        _STORAGE_TYPE_STR_TO_ID[stype], c_shape, len(shape), ctx.device_typeid, ctx.device_id,
        int(bool(delay_alloc)), dtype_np_to_mx(dtype), len(aux_type_ids), c_aux_types,
        c_aux_ndims, c_aux_shapes, ctypes.byref(hdl)))
    return hdl


def _dtype_mix(first, second):
    """the type inference failure (ElemwiseType) of MXNet's elemwise / broadcast binary
    operators for operands of two dtypes, `first` being the operator's input 0"""
    return _dense._inference_error(
        'Check failed: assign(&dattr, vec.at(i)): Incompatible attr in node  at 1-th input: '
        'expected %s, got %s' % (_dense._dtype_name(first.dtype), _dense._dtype_name(second.dtype)))


def _check_shape(s1, s2):
    """check s1 == s2 if both are not None"""
    if s1 and s2 and tuple(s1) != tuple(s2):
        raise ValueError('Shape mismatch detected. ' + str(s1) + ' v.s. ' + str(s2))


class BaseSparseNDArray(NDArray):
    """Common base of the sparse arrays (no dense buffer, no elementwise views)."""
    __slots__ = []
    _is_sparse = True

    def __repr__(self):
        if self.handle is None:
            return '<%s (closed)>' % self.__class__.__name__
        shape_info = 'x'.join(['%d' % x for x in self.shape])
        return '\n<%s %s @%s>' % (self.__class__.__name__, shape_info, self.context)

    def _view(self, write=False):
        raise MXNetError('%s has no dense buffer; use asnumpy() or tostype(\'default\')'
                         % self.__class__.__name__)

    def _sync_copyfrom(self, source_array):
        raise NotImplementedError()

    def reshape(self, *shape, **kwargs):
        # MXNet raises NotSupportedForSparseNDArray, an MXNetError
        raise MXNetError('Function reshape with arguments (%s) is not supported for '
                         'SparseNDArray and only available in NDArray.'
                         % ', '.join(str(type(s)) for s in shape))

    @property
    def size(self):
        # ambiguous for a sparse array, hence disabled (as in MXNet)
        raise NotImplementedError()

    def __len__(self):
        return self.shape[0]

    def __bool__(self):
        raise ValueError('The truth value of a %s is ambiguous.' % self.__class__.__name__)

    __nonzero__ = __bool__

    # --- parts ---------------------------------------------------------------------
    def _aux_type(self, i):
        """numpy type of aux array `i`"""
        code = ctypes.c_int()
        check_call(_LIB.MXNDArrayGetAuxType(self._h, i, ctypes.byref(code)))
        return dtype_mx_to_np(code.value)

    @property
    def _num_aux(self):
        return len(_STORAGE_AUX_TYPES[self.stype])

    @property
    def _aux_types(self):
        return [self._aux_type(i) for i in range(self._num_aux)]

    def _data(self):
        """A copy of the data part as a dense NDArray (MXNDArrayGetDataNDArray; libmxkv's
        handle shares the storage, MXNet's is a copy: writing into it never changes self)."""
        self.wait_to_read()
        hdl = NDArrayHandle()
        check_call(_LIB.MXNDArrayGetDataNDArray(self._h, ctypes.byref(hdl)))
        with NDArray(hdl) as part:
            return part.copy()

    def _aux_data(self, i):
        """A copy of aux part `i` as a dense NDArray (MXNDArrayGetAuxNDArray)."""
        self.wait_to_read()
        hdl = NDArrayHandle()
        check_call(_LIB.MXNDArrayGetAuxNDArray(self._h, i, ctypes.byref(hdl)))
        with NDArray(hdl) as part:
            return part.copy()

    def check_format(self, full_check=True):
        """MXNDArraySyncCheckFormat: raises MXNetError for an invalid array."""
        check_call(_LIB.MXNDArraySyncCheckFormat(self._h, ctypes.c_bool(full_check)))

    # --- copies ---------------------------------------------------------------------
    def asnumpy(self):
        """A dense numpy copy."""
        return self.tostype('default').asnumpy()

    def astype(self, dtype, copy=True):
        """A copy with elements converted to `dtype` (same storage type)."""
        if not copy and dtype_np_to_mx(dtype) == dtype_np_to_mx(self.dtype):
            return self
        if self.stype == 'row_sparse':
            data, idx = self._parts()
            return _from_parts(_dense._convert(data, self.dtype, dtype_mx_to_np(
                dtype_np_to_mx(dtype))), idx, self.shape, self.context, dtype)
        res = zeros(self.stype, self.shape, ctx=self.context, dtype=dtype)
        self.copyto(res)
        return res

    def copy(self):
        return self.copyto(self.context)

    def __getstate__(self):
        raise MXNetError('pickling a %s is not supported by mxkv' % self.__class__.__name__)

    def __iadd__(self, other):
        raise NotImplementedError()

    def __isub__(self, other):
        raise NotImplementedError()

    def __imul__(self, other):
        raise NotImplementedError()

    def __itruediv__(self, other):
        raise NotImplementedError()

    __idiv__ = __itruediv__


class RowSparseNDArray(BaseSparseNDArray):
    """row_sparse array: ``dense[indices[i], ...] = data[i, ...]``, other rows zero."""
    __slots__ = []

    def __reduce__(self):
        return RowSparseNDArray, (None,), self.__getstate__()

    def __getstate__(self):
        if self.handle is None:
            return {'mxkv': None}
        data, idx = self._parts()
        ctx = self.context
        return {'mxkv': 1, 'stype': 'row_sparse', 'dtype': dtype_np_to_mx(self.dtype),
                'shape': self.shape, 'ctx': (ctx.device_typeid, ctx.device_id),
                'data': data, 'indices': idx}

    def __setstate__(self, state):
        self.writable = True
        if state.get('mxkv') is None:
            self.handle = None
            return
        ctx = Context.from_codes(*state['ctx'])
        if ctx.device_type != 'gpu':  # MXNet's NDArray::Load puts CPU arrays on cpu(0)
            ctx = Context('cpu', 0)
        tmp = _from_parts(state['data'], state['indices'], state['shape'], ctx,
                          dtype_mx_to_np(state['dtype']))
        self.handle, tmp.handle = tmp.handle, None

    @property
    def indices(self):
        """The int64 row indices as a dense NDArray of shape (nnz,)."""
        return self._aux_data(0)

    @indices.setter
    def indices(self, indices):
        raise NotImplementedError()

    @property
    def data(self):
        """The stored rows as a dense NDArray of shape (nnz, d1, ...)."""
        return self._data()

    @data.setter
    def data(self, data):
        raise NotImplementedError()

    def _parts(self):
        """(data, indices) as numpy arrays, data as stored (bfloat16: the uint16 bits)"""
        self.wait_to_read()
        res = []
        for getter, args in ((_LIB.MXNDArrayGetDataNDArray, ()),
                             (_LIB.MXNDArrayGetAuxNDArray, (0,))):
            hdl = NDArrayHandle()
            check_call(getter(self._h, *(args + (ctypes.byref(hdl),))))
            with NDArray(hdl) as part:
                res.append(part.asnumpy().view(part._np_dtype))
        return res[0], res[1]

    def _value_parts(self):
        """(values, indices): the stored rows' values for arithmetic (float32 for
        bfloat16: bf16_t computes in float) and their row numbers"""
        data, idx = self._parts()
        return _stored_values(data, self.dtype), idx

    def _of_values(self, values, idx, ctx=None):
        """a row_sparse array of this shape and dtype holding computed `values` (as
        MXNet's kernels store them: a C cast, bf16_t's truncation) at rows `idx`"""
        raw = _dense._convert(np.asarray(values), np.asarray(values).dtype, self.dtype)
        return row_sparse_array((raw, idx), shape=self.shape, dtype=self.dtype,
                                ctx=_dense._op_context(self.context) if ctx is None else ctx)

    def _fill(self, data_np, idx_np):
        """MXNDArraySyncCopyFromNDArray of the parts (data, then indices, as MXNet does)"""
        data = _dense.array(np.ascontiguousarray(data_np, dtype=self._np_dtype),
                            ctx=self.context, dtype=self.dtype)
        idx = _dense.array(np.ascontiguousarray(idx_np, dtype=np.int64), ctx=self.context,
                           dtype=np.int64)
        try:
            check_call(_LIB.MXNDArraySyncCopyFromNDArray(self._h, data.handle, -1))
            check_call(_LIB.MXNDArraySyncCopyFromNDArray(self._h, idx.handle, 0))
        finally:
            data.close()
            idx.close()

    def _assign_parts(self, data_np, idx_np):
        """Make this array hold `data_np` rows at `idx_np` (nnz may change).

        libmxkv's MXNDArraySyncCopyFromNDArray gives the written part the source's shape.
        MXNet's only writes into storage of the same size, so on a real libmxnet.so a new
        array is built and MXNet's ``_copyto`` operator copies it over."""
        if not self.writable:
            raise MXKVUsageError('trying to write to a readonly RowSparseNDArray')
        if _HAS_OPERATORS:
            tmp = _from_parts(data_np, idx_np, self.shape, self.context, self.dtype)
            try:
                _operator_copyto(tmp, self)
            finally:
                tmp.close()
            return
        self._fill(data_np, idx_np)

    def _dense_numpy(self):
        data, idx = self._parts()
        shape = self.shape
        out = np.zeros(shape, dtype=self._np_dtype)
        if idx.size:
            if idx.min() < 0 or idx.max() >= shape[0]:
                raise MXNetError('row_sparse array of shape %s has row indices outside '
                                 '[0, %d): %s' % (shape, shape[0], idx.tolist()))
            if idx.size == 1 or (np.diff(idx) > 0).all():
                out[idx] = data
            else:
                for k, row in enumerate(idx.tolist()):  # storage order: a later duplicate wins
                    out[row] = data[k]
        return out

    def tostype(self, stype):
        """A copy with storage type `stype` ('default' or 'row_sparse')."""
        if stype == 'csr':
            raise ValueError('cast_storage from row_sparse to csr is not supported')
        if stype == 'default':  # (cast_storage: on cpu(k) for cpu_pinned(k))
            res = _dense.empty(self.shape, ctx=_dense._op_context(self.context),
                               dtype=self.dtype)
            res._sync_copyfrom(self._dense_numpy())
            return res
        if stype == 'row_sparse':
            return self.copyto(_dense._op_context(self.context))
        raise ValueError('unknown storage type %r' % (stype,))

    def copyto(self, other):
        """Copy into `other` (a row_sparse or dense NDArray of the same shape; dtype
        converted) or onto a Context (a new RowSparseNDArray)."""
        if isinstance(other, Context):
            data, idx = self._parts()
            return _from_parts(data, idx, self.shape, other, self.dtype)
        if isinstance(other, NDArray):
            if other.handle is not None and self.handle is not None \
                    and other.handle.value == self.handle.value:
                warnings.warn('You are attempting to copy an array to itself', RuntimeWarning)
                return False
            stype = other.stype
            if other.shape != self.shape:
                raise MXNetError('copyto: shape mismatch, source %s vs destination %s'
                                 % (self.shape, other.shape))
            if stype == 'row_sparse':
                data, idx = self._parts()
                other._assign_parts(_dense._convert(data, self.dtype, other.dtype), idx)
                return other
            if stype == 'default':
                _check_cast_copy(self, other)
                other._sync_copyfrom(_dense._convert(self._dense_numpy(), self.dtype,
                                                     other.dtype))
                return other
            raise TypeError('copyto does not support destination NDArray stype ' + str(stype))
        raise TypeError('copyto does not support type ' + str(type(other)))

    def __getitem__(self, key):
        if isinstance(key, int):
            raise Exception('__getitem__ with int key is not implemented for RowSparseNDArray yet')
        if isinstance(key, slice):
            if key.step is not None or key.start is not None or key.stop is not None:
                raise Exception('RowSparseNDArray only supports [:] for __getitem__')
            return self
        if isinstance(key, tuple):
            raise ValueError('Multi-dimension indexing is not supported')
        raise ValueError('Undefined behaviour for {}'.format(key))

    def __setitem__(self, key, value):
        if not self.writable:
            raise ValueError('Failed to assign to a readonly RowSparseNDArray')
        if not isinstance(key, slice):
            raise TypeError('RowSparseNDArray only supports [:] for assignment')
        if key.step is not None or key.start is not None or key.stop is not None:
            raise ValueError('Assignment with slice for RowSparseNDArray is not implmented yet.')
        if isinstance(value, NDArray):
            if value.handle is None or value.handle.value != self._h.value:
                value.copyto(self)
        elif isinstance(value, numeric_types):
            # MXNet's _set_value(float(value)): a float parameter, cast to the dtype, in
            # every row (a 0 too: all rows stored)
            from .._numerics import dmlc_float
            src = dmlc_float(float(value), 'src')
            if src == 0:  # written with memset: -0.0 gives +0.0
                src = np.float32(0.0)
            val = _dense._convert(np.array(src, dtype=np.float32), np.float32, self.dtype)[()]
            self._assign_parts(np.full(self.shape, val, self._np_dtype),
                               np.arange(self.shape[0], dtype=np.int64))
        elif isinstance(value, (np.ndarray, np.generic)):
            warnings.warn('Assigning non-NDArray object to RowSparseNDArray is not efficient',
                          RuntimeWarning)
            # MXNet's _array(value): a float32 array on the current context, copied in
            with _dense.array(value) as tmp:
                tmp.copyto(self)
        else:
            raise TypeError('type %s not supported' % str(type(value)))

    # --- arithmetic (numpy on the parts; MXNet's sparse results) -------------------
    def _rsp_binary(self, other, ufunc):
        if not isinstance(other, RowSparseNDArray) or other.shape != self.shape:
            return None
        if other.dtype != self.dtype:
            raise _dtype_mix(self, other)
        ldata, lidx = self._value_parts()
        rdata, ridx = other._value_parts()
        idx = np.union1d(lidx, ridx).astype(np.int64)
        # both operands spread over the union of rows, missing rows zero (for sorted,
        # unique indices, which elemwise_add/sub assume; otherwise the first duplicate)
        lhs = np.zeros((len(idx),) + tuple(self.shape[1:]), ldata.dtype)
        rhs = np.zeros_like(lhs)
        lkeep = np.unique(lidx, return_index=True)[1]
        rkeep = np.unique(ridx, return_index=True)[1]
        lhs[np.searchsorted(idx, lidx[lkeep])] = ldata[lkeep]
        rhs[np.searchsorted(idx, ridx[rkeep])] = rdata[rkeep]
        with np.errstate(all='ignore'):
            data = ufunc(lhs, rhs)
        return self._of_values(data, idx)

    def _unary_rsp(self, fn):
        """an elementwise function that keeps 0 at 0 (abs, sqrt, square, sign ...) on the
        stored rows: a row_sparse result over the same rows, as MXNet's FComputeEx"""
        data, idx = self._value_parts()
        out = np.empty_like(data)
        with np.errstate(all='ignore'):
            fn(data, out=out)
        return self._of_values(out, idx)

    def __abs__(self):
        return self._unary_rsp(_dense._ABS)

    def sum(self, *args, **kwargs):
        """MXNet's sum of a row_sparse array: a storage fallback (the dense sum)"""
        dense = self.tostype('default')
        try:
            return dense.sum(*args, **kwargs)
        finally:
            dense.close()

    def _zero_scalar(self, other, ufunc, reverse=False):
        """rsp + 0, 0 + rsp, rsp - 0: MXNet's _plus_scalar / _minus_scalar keep the row_sparse
        storage when the scalar is 0 (None otherwise)"""
        if not isinstance(other, numeric_types) or (reverse and ufunc is np.subtract):
            return None
        from .._numerics import dmlc_double
        if dmlc_double(float(other), 'scalar') != 0:
            return None
        return self._scalar_binary(other, ufunc, reverse)

    def _scalar_binary(self, other, ufunc, reverse=False):
        if not isinstance(other, numeric_types):
            return None
        data, idx = self._value_parts()
        rhs = _stored_values(self._scalar(other), self.dtype)[()]  # DType(scalar)
        with np.errstate(all='ignore'):
            res = ufunc(rhs, data) if reverse else ufunc(data, rhs)
        return self._of_values(res, idx)

    def _dense_binary(self, other, ufunc, reverse=False):
        dense = self.tostype('default')
        try:
            return dense._binary(other, ufunc, reverse=reverse)
        finally:
            dense.close()

    def _elemwise_dense(self, other, op, rsp_first=True):
        """MXNet's elemwise_add/sub/mul of this array and a dense `other` of the same shape
        (None if `other` is not one).  add/sub give a dense array: the rows this array
        does not store are `other`'s (negated for rsp - dense), computed only for stored
        rows otherwise; mul gives a row_sparse array over this array's rows."""
        if not isinstance(other, NDArray) or other._is_sparse or other.shape != self.shape:
            return None
        if other.dtype != self.dtype:
            raise _dtype_mix(self, other) if rsp_first else _dtype_mix(other, self)
        data, idx = self._value_parts()
        rows = self.shape[0]
        if idx.size and (idx.min() < 0 or idx.max() >= rows):
            raise MXNetError('row_sparse array of shape %s has row indices outside [0, %d): %s'
                             % (self.shape, rows, idx.tolist()))
        dense = other._values()
        ctx = _dense._op_context(self.context if rsp_first else other.context)
        # operands in the order MXNet's kernels use (rsp - dense is rsp + (-dense): a NaN
        # in the dense operand comes out with its sign flipped, as in MXNet)
        with np.errstate(all='ignore'):
            if op == 'mul':
                prod = dense[idx] * data if rsp_first else data * dense[idx]
                return self._of_values(prod, idx, ctx)
            if op == 'add':
                res = np.array(dense, copy=True)
                res[idx] = data + dense[idx]
            elif rsp_first:  # rsp - dense = rsp + (-dense); -dense where no row is stored
                res = np.negative(dense)
                res[idx] = data + res[idx]
            else:
                res = np.array(dense, copy=True)
                res[idx] = dense[idx] - data
        return _dense.array(_dense._convert(res, res.dtype, self.dtype), ctx=ctx,
                            dtype=self.dtype)

    def __add__(self, other):
        res = self._zero_scalar(other, np.add)
        if res is None:
            res = self._rsp_binary(other, np.add)
        if res is None:
            res = self._elemwise_dense(other, 'add')
        return res if res is not None else self._dense_binary(other, np.add)

    def __radd__(self, other):
        res = self._zero_scalar(other, np.add, reverse=True)
        return res if res is not None else self._dense_binary(other, np.add, reverse=True)

    def __sub__(self, other):
        res = self._zero_scalar(other, np.subtract)
        if res is None:
            res = self._rsp_binary(other, np.subtract)
        if res is None:
            res = self._elemwise_dense(other, 'sub')
        return res if res is not None else self._dense_binary(other, np.subtract)

    def __rsub__(self, other):
        return self._dense_binary(other, np.subtract, reverse=True)

    def __mul__(self, other):
        res = self._scalar_binary(other, np.multiply)
        if res is None:
            res = self._rsp_binary(other, np.multiply)
        if res is None:
            res = self._elemwise_dense(other, 'mul')
        return res if res is not None else self._dense_binary(other, np.multiply)

    def __rmul__(self, other):
        res = self._scalar_binary(other, np.multiply, reverse=True)
        return res if res is not None else self._dense_binary(other, np.multiply, True)

    def __truediv__(self, other):
        res = self._scalar_binary(other, np.true_divide)
        return res if res is not None else self._dense_binary(other, np.true_divide)

    __div__ = __truediv__

    def __neg__(self):
        return self._scalar_binary(-1.0, np.multiply)  # MXNet: _mul_scalar(x, -1.0)

    def __iadd__(self, other):
        (self + other).copyto(self)
        return self

    def __isub__(self, other):
        (self - other).copyto(self)
        return self

    def __imul__(self, other):
        (self * other).copyto(self)
        return self

    def __itruediv__(self, other):
        (self / other).copyto(self)
        return self

    __idiv__ = __itruediv__


class CSRNDArray(BaseSparseNDArray):
    """csr array (created, passed around, saved, loaded and densified)."""
    __slots__ = []

    # --- pickling (optimizer state checkpoints), mxkv's own encoding as for dense and
    # row_sparse arrays: the parts as stored (bfloat16: the bits), int64 aux arrays
    def __reduce__(self):
        return CSRNDArray, (None,), self.__getstate__()

    def __getstate__(self):
        if self.handle is None:
            return {'mxkv': None}
        data, indptr, indices = self._raw_parts()
        ctx = self.context
        return {'mxkv': 1, 'stype': 'csr', 'dtype': dtype_np_to_mx(self.dtype),
                'shape': self.shape, 'ctx': (ctx.device_typeid, ctx.device_id),
                'data': data, 'indptr': indptr, 'indices': indices}

    def __setstate__(self, state):
        self.writable = True
        if state.get('mxkv') is None:
            self.handle = None
            return
        if state.get('stype') != 'csr':
            raise MXNetError('unpickling a CSRNDArray from the state of a %s array'
                             % (state.get('stype'),))
        ctx = Context.from_codes(*state['ctx'])
        if ctx.device_type != 'gpu':  # MXNet's NDArray::Load puts CPU arrays on cpu(0)
            ctx = Context('cpu', 0)
        tmp = _csr_from_parts(state['data'], state['indptr'], state['indices'],
                              state['shape'], ctx, dtype_mx_to_np(state['dtype']))
        self.handle, tmp.handle = tmp.handle, None

    @property
    def indices(self):
        """column indices (aux 1)"""
        return self._aux_data(1)

    @property
    def indptr(self):
        """row pointers (aux 0)"""
        return self._aux_data(0)

    @property
    def data(self):
        """stored values"""
        return self._data()

    def tostype(self, stype):
        """'csr' (self) or 'default' (a dense copy, as MXNet's cast_storage)"""
        if stype == 'csr':  # cast_storage's result is on cpu(k) for cpu_pinned(k)
            ctx = _dense._op_context(self.context)
            return self if ctx == self.context else self.copyto(ctx)
        if stype == 'row_sparse':  # (MXNet's frontend)
            raise ValueError('cast_storage from csr to row_sparse is not supported')
        if stype == 'default':
            res = _dense.empty(self.shape, ctx=_dense._op_context(self.context),
                               dtype=self.dtype)
            res._sync_copyfrom(self._dense_numpy())
            return res
        raise MXNetError('tostype(%r) of a csr array is not supported by mxkv' % (stype,))

    def _coords(self):
        """(row ids, column indices, values) of the stored elements in storage order (row
        i holds data[indptr[i]:indptr[i + 1]] at the columns indices[indptr[i]:indptr[i +
        1]]); MXNetError for parts that do not describe a csr array of this shape (MXNet
        reads or writes outside its buffers there)"""
        rows, cols = self.shape
        with self.indptr as ptr_nd, self.indices as idx_nd, self.data as data_nd:
            indptr = ptr_nd.asnumpy().astype(np.int64)
            indices = idx_nd.asnumpy().astype(np.int64)
            data = data_nd.asnumpy()
        none = (np.zeros(0, np.int64), np.zeros(0, np.int64), data[:0])
        if indices.size == 0:  # (MXNet: the storage is not initialized, nothing is read)
            return none
        if indptr.size < rows + 1:  # (MXNet reads outside it, and dies)
            raise MXNetError('csr array of shape %s has %d stored values and an indptr of %d '
                             'offsets, not rows + 1' % (self.shape, indices.size, indptr.size))
        indptr = indptr[:rows + 1]  # (MXNet reads these)
        if indptr[-1] == 0:
            return none
        if indptr[0] != 0 or (np.diff(indptr) < 0).any() or \
                indptr[-1] > min(indices.size, data.size) or \
                (indices[:indptr[-1]] < 0).any() or (indices[:indptr[-1]] >= cols).any():
            raise MXNetError('csr array of shape %s has invalid parts (indptr %s, %d indices, '
                             '%d values)' % (self.shape, indptr.tolist()[:8], indices.size,
                                             data.size))
        nnz = int(indptr[-1])
        row_ids = np.repeat(np.arange(rows), np.diff(indptr))
        return row_ids, indices[:nnz], data[:nnz]

    def _dense_numpy(self):
        """the dense values (see _coords; a later duplicate column wins)"""
        out = np.zeros(self.shape, dtype=self._np_dtype)
        row_ids, cols, data = self._coords()
        out[row_ids, cols] = data
        return out

    def __iter__(self):
        """Each row, as a (1, n) CSRNDArray.  MXNet 1.9.1's iteration never ends (an int
        past the last row gives an empty slice, never IndexError), so `list(csr)`,
        `np.asarray([csr])` or `dense[:] = [csr]` ran until memory ran out; here they
        end after the rows."""
        for i in range(self.shape[0]):
            yield self[i]

    def __getitem__(self, key):
        """Rows as MXNet's CSRNDArray.__getitem__ (its slice operator on axis 0): an int
        (-1: the last row) or a slice without a step, as a new CSRNDArray (Python's
        slice bounds; a stop of 0 means the end, as there); ``[:]`` is the array itself."""
        rows = self.shape[0]
        if isinstance(key, int):
            begin = rows - 1 if key == -1 else key
            bounds = slice(begin, begin + 1)
        elif isinstance(key, slice):
            if key.step is not None:
                raise ValueError('CSRNDArray only supports continuous slicing on axis 0')
            if key.start is None and key.stop is None:
                return self
            bounds = slice(key.start if key.start else 0, key.stop if key.stop else rows)
        elif isinstance(key, tuple):
            raise ValueError('Multi-dimension indexing is not supported')
        else:
            raise ValueError('Undefined behaviour for {}'.format(key))
        picked = range(rows)[bounds]
        if bounds.start < -rows and len(picked):
            # MXNet gives these rows with no stored value (its kernel starts at the
            # begin it did not clip)
            raise MXNetError('slice of a csr array of %d rows from %d: MXNet returns wrong '
                             'values there' % (rows, bounds.start))
        data, indptr, indices = self._raw_parts()
        if indptr.size != rows + 1:
            raise MXNetError('slice of a csr array of %d rows with an indptr of %d offsets'
                             % (rows, indptr.size))
        first, last = (picked.start, picked.stop) if len(picked) else (0, 0)
        ptr = indptr[first:last + 1] - indptr[first]
        lo, hi = indptr[first], indptr[last]
        return _csr_from_parts(data[lo:hi], ptr, indices[lo:hi], (len(picked), self.shape[1]),
                               _dense._op_context(self.context), self.dtype)

    def __setitem__(self, key, value):
        """``x[:] = value`` as MXNet's CSRNDArray.__setitem__: an NDArray (or a numpy
        array, through a float32 NDArray) is copied in (a dense one cast to csr: its
        elements != 0); numbers, partial slices and int keys are refused as there."""
        if not self.writable:
            raise ValueError('Failed to assign to a readonly CSRNDArray')
        if isinstance(key, slice):
            if key.step is not None or key.start is not None or key.stop is not None:
                raise ValueError('Assignment with slice for CSRNDArray is not '
                                 'implemented yet.')
            if isinstance(value, NDArray):
                if value.handle is None or value.handle.value != self._h.value:
                    value.copyto(self)
            elif isinstance(value, numeric_types):
                raise ValueError('Assigning numeric types to CSRNDArray is '
                                 'not implemented yet.')
            elif isinstance(value, (np.ndarray, np.generic)):
                warnings.warn('Assigning non-NDArray object to CSRNDArray is not efficient',
                              RuntimeWarning)
                with _dense.array(value) as tmp:   # (MXNet's _array: float32 by default)
                    tmp.copyto(self)
            else:
                raise TypeError('type %s not supported' % str(type(value)))
            return
        if not isinstance(key, (int, tuple)):
            raise AssertionError('CSRNDArray.__setitem__ key %r' % (key,))
        raise Exception('CSRNDArray only supports [:] for assignment')  # pylint: disable=broad-exception-raised

    def _assign_result(self, res, other=None):
        """MXNet's in-place operators of a CSRNDArray: (self op other).copyto(self)"""
        if isinstance(other, CSRNDArray) and not res._is_sparse and \
                res.context != self.context:
            # a dense result of csr op csr (csr / csr, a storage fallback; +, -, * give
            # csr arrays as in MXNet): copy it over first, on one context a dense -> csr
            # copy needs only the same dtype
            res, moved = res.copyto(self.context), res
            moved.close()
        try:
            res.copyto(self)
        finally:
            if res is not self:
                res.close()
        return self

    def __abs__(self):
        return _csr_unary(self, _dense._ABS)

    def __iadd__(self, other):
        return self._assign_result(self + other, other)

    def __isub__(self, other):
        return self._assign_result(self - other, other)

    def __imul__(self, other):
        return self._assign_result(self * other, other)

    def __itruediv__(self, other):
        return self._assign_result(self / other, other)

    __idiv__ = __itruediv__

    def _raw_parts(self):
        """(data, indptr, indices) as numpy arrays, data as stored (bfloat16: bits)"""
        with self.data as data, self.indptr as indptr, self.indices as indices:
            return (data.asnumpy().view(data._np_dtype), indptr.asnumpy(),
                    indices.asnumpy())

    def _copied_parts(self):
        """the parts a copy holds (MXNet's CopyFromToCsrImpl): these parts, or, with no
        column index stored (not storage_initialized), FillZerosCsrImpl's rows + 1 zero
        offsets (an array whose indptr is ``[]``, e.g. abs of an all-zero one, too)"""
        data, indptr, indices = self._raw_parts()
        if indices.size == 0:
            return data[:0], np.zeros(self.shape[0] + 1, np.int64), indices
        return data, indptr, indices

    def copyto(self, other):
        """Copy into `other` (a csr or dense NDArray of the same shape; dtype converted)
        or onto a Context (a new CSRNDArray)."""
        if isinstance(other, Context):
            data, indptr, indices = self._copied_parts()
            return _csr_from_parts(data, indptr, indices, self.shape, other, self.dtype)
        if isinstance(other, NDArray):
            if other.handle is not None and self.handle is not None \
                    and other.handle.value == self.handle.value:
                warnings.warn('You are attempting to copy an array to itself', RuntimeWarning)
                return False
            if other.shape != self.shape:
                raise MXNetError('copyto: shape mismatch, source %s vs destination %s'
                                 % (self.shape, other.shape))
            if other.stype == 'csr':
                data, indptr, indices = self._copied_parts()
                return _assign_csr(other, _dense._convert(data, self.dtype, other.dtype),
                                   indptr, indices)
            if other.stype == 'default':
                _check_cast_copy(self, other)
                other._sync_copyfrom(_dense._convert(self._dense_numpy(), self.dtype,
                                                     other.dtype))
                return other
            raise TypeError('copyto does not support destination NDArray stype ' +
                            str(other.stype))
        raise TypeError('copyto does not support type ' + str(type(other)))

    def sum(self, axis=None, keepdims=False, exclude=False, out=None, name=None):
        """MXNet 1.9.1's sum of a csr array.  Over axis 0 or 1 alone (not keepdims, not
        exclude) its sparse kernel (broadcast_reduce_op.h: SumCsrImpl) gives a dense
        array: each column's (axis 0) or row's (axis 1) stored values, explicit zeros
        included, in storage order, summed with mshadow's Kahan step in the element
        type (where a dense sum also adds the zeros it does not store, which can change
        the compensated sum).  Any other sum is a storage fallback: the dense sum.
        `name` is ignored."""
        # pylint: disable=unused-argument
        from ._reduce import reduce_shape, kahan_sum_runs, _axis_param, _bool_param
        _, shape = reduce_shape(self.shape, axis, keepdims, exclude)
        axes = _axis_param(axis)
        if axes is None or len(axes) != 1 or axes[0] not in (0, 1) or \
                _bool_param(keepdims, 'keepdims') or _bool_param(exclude, 'exclude'):
            dense = self.tostype('default')
            try:
                return dense.sum(axis=axis, keepdims=keepdims, exclude=exclude, out=out)
            finally:
                dense.close()
        if out is None:
            out = _dense.empty(shape, ctx=_dense._op_context(self.context), dtype=self.dtype)
        elif out._is_sparse or out.shape != shape or out.dtype != self.dtype:
            raise MXNetError('sum: out is a %s array of shape %s and dtype %s, the result a '
                             'default one of %s and %s' % (
                                 out.stype, out.shape, np.dtype(out.dtype).name, shape,
                                 np.dtype(self.dtype).name))
        if self.dtype in (np.bool_, bool):
            raise MXNetError('Unknown type enum 7')  # (MXNet's csr sum has no bool kernel)
        kind = 'bfloat16' if self.dtype is _dense.bfloat16 else self._np_dtype.name
        values, lengths = self._stored_runs(axes[0])
        sums = kahan_sum_runs(values, lengths, kind)
        return out._write(lambda o: np.copyto(o, sums))

    def _stored_runs(self, axis):
        """(values, lengths): the stored values in the order SumCsrImpl sums them, each
        row's (axis 1) or each column's (axis 0) one after the other, and how many each
        has.  MXNetError where MXNet reads outside its buffers, or (axis 0) where a row's
        column indices are not ascending without duplicates and within the columns
        (its result then depends on how many threads split the columns)."""
        rows, cols = self.shape
        with self.indptr as ptr_nd, self.indices as idx_nd, self.data as data_nd:
            indptr = ptr_nd.asnumpy()
            indices = idx_nd.asnumpy()
            data = np.array(data_nd._values())
        nnz = indices.size
        if nnz != data.size:  # (MXNet: CHECK_EQ in storage_initialized)
            raise MXNetError('inconsistent storage shape: a csr array of %d column indices '
                             'and %d values' % (nnz, data.size))
        if nnz == 0:  # (the storage is not initialized: MXNet reads no part)
            return data, np.zeros(cols if axis == 0 else rows, np.int64)
        if indptr.size < rows + 1:
            raise MXNetError('sum of a csr array of %d rows with an indptr of %d offsets '
                             '(MXNet reads outside it)' % (rows, indptr.size))
        begin, end = indptr[:rows], indptr[1:rows + 1]
        lengths = np.maximum(end - begin, 0)  # (MXNet's loop runs no step where end < begin)
        if ((lengths > 0) & ((begin < 0) | (end > nnz))).any():
            raise MXNetError('sum of a csr array whose indptr %s points outside its %d '
                             'values (MXNet reads outside them)' % (indptr.tolist()[:8], nnz))
        ascending = (end >= begin).all()
        if axis == 1:
            if ascending:  # the rows' values one after the other
                return data[indptr[0]:indptr[rows]], lengths
            at = np.repeat(begin - np.cumsum(lengths) + lengths, lengths)
            return data[at + np.arange(at.size)], lengths
        if not ascending:
            raise MXNetError('sum over axis 0 of a csr array whose indptr is not '
                             'non-decreasing: %s' % (indptr.tolist()[:8],))
        pos = np.arange(indptr[0], indptr[rows])
        col = indices[pos]
        row_of = np.repeat(np.arange(rows), lengths)
        follows = row_of[1:] == row_of[:-1]
        if (col < 0).any() or (col >= cols).any() or (follows & (col[1:] <= col[:-1])).any():
            raise MXNetError('sum over axis 0 of a csr array whose column indices are not '
                             'ascending without duplicates within [0, %d) in each row (MXNet '
                             'gives a result that depends on its thread count)' % cols)
        order = np.argsort(col, kind='stable')  # each column's values in row order
        return data[pos[order]], np.bincount(col, minlength=cols).astype(np.int64)


# --- conversions used by NDArray ------------------------------------------------------
def _nonzero_rows(dense):
    if dense.ndim == 0:
        raise ValueError('cannot convert a 0-d array to row_sparse')
    if dense.size == 0:  # no elements (zero-width rows too): no row is non-zero
        return np.zeros((0,), np.int64)
    flat = dense.reshape(dense.shape[0], -1)
    return np.flatnonzero((flat != 0).any(axis=1)).astype(np.int64)


def _prod(dims):
    """exact product of Python ints (np.prod wraps at 2**63)"""
    res = 1
    for dim in dims:
        res *= int(dim)
    return res


def _stored_values(raw, dtype):
    """the values of storage values `raw` of NDArray dtype `dtype` (bfloat16: the bits'
    float32 values), for finding the non-zero rows (-0.0 is a zero)"""
    return _dense._bf16_decode(raw) if dtype is _dense.bfloat16 else raw


def _dense_raw(arr):
    """a dense NDArray's storage values (bfloat16: the uint16 bits)"""
    raw = arr.asnumpy()
    return raw.view(np.uint16) if arr.dtype is _dense.bfloat16 else raw


def _dense_to_rsp_into(raw, dst, rows=None):
    """dst holds the rows of `raw` (storage values of dst's dtype) that are not all
    zero (or the given `rows`)"""
    if rows is None:
        rows = _nonzero_rows(_stored_values(raw, dst.dtype))
    dst._assign_parts(raw[rows], rows)
    return dst


def _no_bool_cast(dtype):
    """MXNet 1.9.1's cast_storage has no bool kernel (MSHADOW_TYPE_SWITCH)"""
    if dtype in (np.bool_, bool):
        raise MXNetError('Unknown type enum 7')


def _dense_tostype_rsp(arr):
    """dense NDArray -> new RowSparseNDArray on the same context (cast_storage)."""
    _no_bool_cast(arr.dtype)
    raw = _dense_raw(arr)
    rows = _nonzero_rows(_stored_values(raw, arr.dtype))
    return _from_parts(raw[rows], rows, arr.shape, _dense._op_context(arr.context), arr.dtype)


def _check_cast_copy(src, dst):
    """MXNet 1.9.1's CopyFromToImpl between storage types (dense -> row_sparse/csr,
    row_sparse/csr -> dense): on one context it casts the storage straight into the
    destination (cast_storage: the source's dtype must be the destination's); across
    contexts into a temporary of the destination's storage type and the default dtype,
    float32, which it then copies over, converting it to the destination's dtype.  Both
    casts check their data type (TBlob.get_with_shape) and fail, in MXNet at the next
    wait or read, leaving the destination as it was (another context) or partly
    overwritten (same context).  mxkv raises here and writes nothing."""
    if _prod(src.shape) == 0:  # (MXNet skips copies of no elements)
        return
    sname = 'bfloat16' if src.dtype is _dense.bfloat16 else np.dtype(src._np_dtype).name
    dname = 'bfloat16' if dst.dtype is _dense.bfloat16 else np.dtype(dst._np_dtype).name
    if src.context == dst.context:
        if sname != dname:
            raise MXNetError(
                'copyto from a %s %s array into a %s %s array on the same context (%s), a '
                'dtype change: MXNet 1.9.1 casts the storage into the destination and fails its data '
                'type check (TBlob.get_with_shape: data type do not match), leaving the '
                'destination corrupt; convert the source first (astype)'
                % (src.stype, sname, dst.stype, dname, src.context))
    elif sname != 'float32':
        raise MXNetError(
            'copyto from a %s %s array on %s into a %s array on %s: MXNet 1.9.1 casts the '
            'storage into a float32 temporary on the source\'s context first and fails its '
            'data type check (TBlob.get_with_shape: Expected: float v.s. given %s) for any '
            'source dtype but float32; convert the source first (astype)'
            % (src.stype, sname, src.context, dst.stype, dst.context, sname))


def _dense_copyto_rsp(src, dst):
    """dense NDArray -> existing RowSparseNDArray (shape checked; the dtype converted
    only where MXNet converts it, from float32 across contexts)."""
    if dst.shape != src.shape:
        raise MXNetError('copyto: shape mismatch, source %s vs destination %s'
                         % (src.shape, dst.shape))
    _no_bool_cast(src.dtype)
    _check_cast_copy(src, dst)
    raw = _dense_raw(src)
    # the rows the source stores as row_sparse (MXNet casts the storage first), then
    # the values converted as copyto converts them
    rows = _nonzero_rows(_stored_values(raw, src.dtype))
    return _dense_to_rsp_into(_dense._convert(raw, src.dtype, dst.dtype), dst, rows)


def _dense_tostype_csr(arr):
    """dense NDArray -> new CSRNDArray on the same context (cast_storage): per row, the
    elements != 0 (NaN counts, -0.0 does not) in column order; int64 indptr and indices"""
    if arr.ndim != 2:  # (MXNet's frontend checks this: a ValueError)
        raise ValueError('To convert to a CSR, the NDArray should be 2 Dimensional. Current '
                         'shape is %s' % (arr.shape,))
    _no_bool_cast(arr.dtype)
    data, indptr, indices = _dense_csr_parts(_dense_raw(arr), arr.dtype)
    return _csr_from_parts(data, indptr, indices, arr.shape, _dense._op_context(arr.context),
                           arr.dtype)


def _dense_csr_parts(raw, dtype):
    """cast_storage dense -> csr of storage values `raw`: per row, the elements != 0 (NaN
    counts, -0.0 does not) in column order; (data, int64 indptr, int64 indices)"""
    mask = _stored_values(raw, dtype) != 0
    _, cols = np.nonzero(mask)
    indptr = np.zeros(raw.shape[0] + 1, np.int64)
    np.cumsum(mask.sum(axis=1), out=indptr[1:])
    return raw[mask], indptr, cols.astype(np.int64)


def _assign_csr(dst, data, indptr, indices):
    """dst (a CSRNDArray) now holds these parts (`data` in dst's dtype, as stored)"""
    if _HAS_OPERATORS:  # (real libmxnet.so: parts of other sizes, see rsp)
        tmp = _csr_from_parts(data, indptr, indices, dst.shape, dst.context, dst.dtype)
        try:
            _operator_copyto(tmp, dst)
        finally:
            tmp.close()
        return dst
    return _fill_csr(dst, data, indptr, indices)


def _dense_copyto_csr(src, dst):
    """dense NDArray -> existing CSRNDArray (MXNet's copyto: cast_storage of the source,
    then a copy into dst).  The dtype changes only where MXNet converts it, from float32
    across contexts: the entries the float32 source stores, their values converted (a
    0.5 stored as an int 0 stays stored)."""
    if dst.shape != src.shape:
        raise MXNetError('copyto: shape mismatch, source %s vs destination %s'
                         % (src.shape, dst.shape))
    _no_bool_cast(src.dtype)
    _check_cast_copy(src, dst)
    data, indptr, indices = _dense_csr_parts(_dense_raw(src), src.dtype)
    return _assign_csr(dst, _dense._convert(data, src.dtype, dst.dtype), indptr, indices)


def _csr_dense_add_sub(csr, dns, subtract, csr_first, out=None):
    """elemwise_add / elemwise_sub of a csr and a dense array of the same shape, as
    MXNet's DnsCsrDnsOp computes it (a dense result): the dense operand is copied (negated
    for csr - dense), then each stored element is combined with it in storage order, so
    elements the csr array does not store keep the dense operand's bits (-0.0 too).
    float32 and float64 only (MXNet's MSHADOW_SGL_DBL_TYPE_SWITCH)."""
    if dtype_np_to_mx(csr.dtype) != dtype_np_to_mx(dns.dtype):
        raise _dtype_mix(csr, dns) if csr_first else _dtype_mix(dns, csr)
    if csr._np_dtype not in (np.float32, np.float64):
        raise MXNetError('elemwise add/sub of a csr and a dense array: MXNet 1.9.1 supports '
                         'float32 and float64 only (got %s)' % np.dtype(csr._np_dtype).name)
    row_ids, cols, data = csr._coords()
    values = dns.asnumpy()
    with np.errstate(all='ignore'):
        res = np.negative(values) if (subtract and csr_first) else values.copy()
        if row_ids.size:
            at = (row_ids, cols)
            if subtract and not csr_first:
                np.subtract.at(res, at, data)
            else:
                np.add.at(res, at, data)
    if out is None:
        first = csr if csr_first else dns
        out = _dense.empty(dns.shape, ctx=_dense._op_context(first.context), dtype=dns.dtype)
    out._sync_copyfrom(res)
    return out


def _csr_csr(lhs, rhs, ufunc):
    """elemwise_add / elemwise_sub / elemwise_mul of two csr arrays of one shape, as
    MXNet 1.9.1's CsrCsrOp computes it (a csr result on the first operand's context):
    per row, each operand's stored values are summed into a zeroed row buffer (starting
    from +0, duplicates in storage order), the columns either operand stores are linked
    in order of first appearance (the lhs's, then the rhs's) and visited from the last
    one linked back, and ``op(l, r)`` is stored where it is not == 0 (so -0.0 and 0
    results are dropped, a NaN is kept; the columns of a row come out in that reversed
    order, not sorted).  The same array on both sides is read once.  MXNet allocates
    lhs nnz + rhs nnz values and leaves the tail after indptr[-1] unwritten; mxkv's
    parts hold exactly indptr[-1] of them."""
    if dtype_np_to_mx(lhs.dtype) != dtype_np_to_mx(rhs.dtype):
        raise _dtype_mix(lhs, rhs)
    if lhs.dtype is _dense.bfloat16:
        raise MXNetError('elemwise operators of two csr arrays: bfloat16 is not supported')
    ctx = _dense._op_context(lhs.context)
    nrows, ncols = lhs.shape
    if nrows == 0:  # (MXNet returns before allocating the result)
        return _csr_from_parts(np.zeros(0, lhs._np_dtype), np.zeros(0, np.int64),
                               np.zeros(0, np.int64), lhs.shape, ctx, lhs.dtype)
    with lhs.indptr as ptr_nd:
        if ptr_nd.shape[0] != nrows + 1:  # CHECK_EQ(lhs indptr size, rows + 1)
            raise MXNetError('Check failed: lhs.aux_shape(csr::kIndPtr).Size() == nr_rows + 1'
                             ' (%d vs. %d)' % (ptr_nd.shape[0], nrows + 1))
    same = lhs is rhs or lhs.handle.value == rhs.handle.value
    lrow, lcol, ldata = lhs._coords()
    if same:
        rrow, rcol, rdata = lrow[:0], lcol[:0], ldata[:0]
    else:
        rrow, rcol, rdata = rhs._coords()
    dtype = lhs._np_dtype
    # entries in the order the kernel links them: per row, the lhs's then the rhs's
    rows = np.concatenate([lrow, rrow]).astype(np.int64)
    order = np.argsort(rows, kind='stable')
    keys = (rows * ncols + np.concatenate([lcol, rcol]).astype(np.int64))[order]
    ukeys, first = np.unique(keys, return_index=True)
    # the row buffers: +0 plus each operand's values at the key, in storage order
    lbuf = np.zeros(ukeys.size, dtype)
    rbuf = np.zeros(ukeys.size, dtype)
    with np.errstate(all='ignore'):
        if lrow.size:
            np.add.at(lbuf, np.searchsorted(ukeys, lrow.astype(np.int64) * ncols + lcol),
                      ldata.astype(dtype, copy=False))
        if same:
            rbuf = lbuf
        elif rrow.size:
            np.add.at(rbuf, np.searchsorted(ukeys, rrow.astype(np.int64) * ncols + rcol),
                      rdata.astype(dtype, copy=False))
        res = ufunc(lbuf, rbuf)
    res = np.asarray(res, dtype=dtype)
    # per row, from the last column linked back to the first
    urows = ukeys // ncols
    visit = np.lexsort((-first, urows))
    keep = visit[res[visit] != 0]
    indptr = np.zeros(nrows + 1, np.int64)
    np.cumsum(np.bincount(urows[keep], minlength=nrows), out=indptr[1:])
    return _csr_from_parts(res[keep], indptr, (ukeys % ncols)[keep], lhs.shape, ctx,
                           lhs.dtype)


def _sparse_compare_scalar(arr, scalar, ufunc, reverse):
    """MXNet 1.9.1's _equal_scalar / _not_equal_scalar / _greater_scalar / ... of a
    row_sparse or csr array (BinaryScalarLogicStorageType): when op(0, scalar) == 0,
    computed in double with the scalar parameter, the result has the array's storage
    type and structure (the parts copied, each stored value compared with
    DType(scalar), as _mul_scalar's MapToFCompute); None otherwise (MXNet's storage
    fallback: a dense result)"""
    from .._numerics import dmlc_double
    from .ndarray import _COMPARISONS
    alpha = dmlc_double(float(scalar), 'scalar')
    zero = np.float64(0.0)
    with np.errstate(all='ignore'):
        at_zero = _COMPARISONS[ufunc](alpha, zero) if reverse else \
            _COMPARISONS[ufunc](zero, alpha)
    if at_zero:
        return None
    if isinstance(arr, CSRNDArray):
        return _csr_scalar(arr, scalar, ufunc, reverse)
    data, idx = arr._parts()
    with _dense.array(data, ctx=arr.context, dtype=arr.dtype) as data_nd:
        with data_nd._binary(scalar, ufunc, reverse=reverse) as res:
            values = _dense_raw(res)
    return _from_parts(values, idx, arr.shape, _dense._op_context(arr.context), arr.dtype)


def _csr_scalar(csr, scalar, ufunc, reverse):
    """_mul_scalar / _div_scalar of a csr array, as MXNet: the result keeps the array's
    structure (a stored value that becomes 0 stays stored), each stored value computed
    as the dense operator computes it"""
    data, indptr, indices = csr._raw_parts()
    with _dense.array(data, ctx=csr.context, dtype=csr.dtype) as data_nd:
        with data_nd._binary(scalar, ufunc, reverse=reverse) as res:
            values = _dense_raw(res)
    return _csr_from_parts(values, indptr, indices, csr.shape,
                           _dense._op_context(csr.context), csr.dtype)


def _csr_unary(csr, ufunc, copy_empty=False):
    """abs, sqrt, square, sign of a csr array, as MXNet: a csr array of its structure,
    each stored value computed as the dense operator computes it.  No stored value:
    MXNet's UnaryOp::ComputeEx does nothing, so the result keeps a new array's empty
    parts (indptr too: ``[]``, not rows + 1 zeros); with `copy_empty` (clip's ClipEx,
    which maps straight to the dense kernel) the parts are copied as they are"""
    data, indptr, indices = csr._raw_parts()
    if data.size == 0 and not copy_empty:
        return _csr_from_parts(data[:0], indptr[:0], indices[:0], csr.shape,
                               _dense._op_context(csr.context), csr.dtype)
    with _dense.array(data, ctx=csr.context, dtype=csr.dtype) as data_nd:
        with data_nd._unary(ufunc) as res:
            values = _dense_raw(res)
    return _csr_from_parts(values, indptr, indices, csr.shape,
                           _dense._op_context(csr.context), csr.dtype)


def _csr_dense_mul(csr, dns, divide):
    """elemwise_mul(csr, dense) as MXNet: a csr array of the csr operand's structure,
    each stored value times the dense element at its place (float32 and float64; MXNet
    fails for other dtypes, and for elemwise_div of a csr and a dense array)"""
    if dtype_np_to_mx(csr.dtype) != dtype_np_to_mx(dns.dtype):
        raise _dtype_mix(csr, dns)  # (the csr array is the first input; types come first)
    if divide:
        raise MXNetError('elemwise_div of a csr and a dense array: MXNet 1.9.1 has no '
                         'kernel for it (its storage type inference fails)')
    data, indptr, indices = csr._raw_parts()
    if indices.size == 0:  # not storage_initialized: FillZerosCsrImpl, any dtype
        return _csr_from_parts(data[:0], np.zeros(csr.shape[0] + 1, np.int64), indices,
                               csr.shape, _dense._op_context(csr.context), csr.dtype)
    if csr._np_dtype not in (np.float32, np.float64):
        raise MXNetError('elemwise_mul of a csr and a dense array: MXNet 1.9.1 supports '
                         'float32 and float64 only (got %s)' % np.dtype(csr._np_dtype).name)
    row_ids, cols, data = csr._coords()
    values = dns.asnumpy()
    with np.errstate(all='ignore'):
        prod = data * values[row_ids, cols]
    nnz = prod.size
    return _csr_from_parts(prod, indptr[:csr.shape[0] + 1] if nnz else indptr,
                           indices[:nnz] if nnz else indices, csr.shape,
                           _dense._op_context(csr.context), csr.dtype)


def _csr_from_parts(data, indptr, indices, shape, ctx, dtype):
    """a new CSRNDArray created with its aux shapes, then its parts copied in (MXNet's
    csr_matrix way); `data` as stored (bfloat16: the bits)"""
    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    indices = np.ascontiguousarray(indices, dtype=np.int64)
    res = CSRNDArray(_new_alloc_handle('csr', shape, ctx, False, dtype, [np.int64, np.int64],
                                       [indptr.shape, indices.shape]))
    if indptr.size == 0 and indices.size == 0 and np.asarray(data).size == 0:
        return res   # (a new array's parts, as MXNet's result of a no-op kernel)
    return _fill_csr(res, data, indptr, indices)


def _fill_csr(res, data, indptr, indices):
    """MXNDArraySyncCopyFromNDArray of a csr array's parts (data, indptr, indices)"""
    ctx, dtype = res.context, res.dtype
    np_dtype = np.dtype(np.uint16) if dtype is _dense.bfloat16 else np.dtype(dtype)
    parts = [(-1, _dense.array(np.ascontiguousarray(data, dtype=np_dtype), ctx=ctx,
                               dtype=dtype)),
             (0, _dense.array(np.ascontiguousarray(indptr, dtype=np.int64), ctx=ctx,
                              dtype=np.int64)),
             (1, _dense.array(np.ascontiguousarray(indices, dtype=np.int64), ctx=ctx,
                              dtype=np.int64))]
    try:
        for i, part in parts:
            check_call(_LIB.MXNDArraySyncCopyFromNDArray(res.handle, part.handle, i))
    finally:
        for _, part in parts:
            part.close()
    return res


def csr_matrix(arg1, shape=None, ctx=None, dtype=None):
    """A CSRNDArray from a dense 2-d array-like or NDArray (its non-zero elements), another
    CSRNDArray (a copy), ``(M, N)`` (no stored element) or ``(data, indices, indptr)``, as
    ``mxnet.nd.sparse.csr_matrix`` (the parts are copied in unchecked, as there;
    ``check_format()`` finds bad ones).  ``(data, (row, col))`` (scipy's coo) is not
    supported."""
    if isinstance(arg1, tuple):
        if len(arg1) == 2:
            if isinstance(arg1[1], tuple) and len(arg1[1]) == 2:
                raise MXNetError('csr_matrix((data, (row, col))) needs scipy, which mxkv '
                                 'does not use; give (data, indices, indptr)')
            _check_shape(arg1, shape)
            return empty('csr', arg1, ctx=ctx, dtype=dtype)
        if len(arg1) == 3:
            return _csr_matrix_from_definition(arg1[0], arg1[1], arg1[2], shape, ctx, dtype)
        raise ValueError('Unexpected length of input tuple: ' + str(len(arg1)))
    if isinstance(arg1, CSRNDArray):
        _check_shape(arg1.shape, shape)
        res = arg1.copyto(current_context() if ctx is None else ctx)
        if dtype is None or np.dtype(dtype_mx_to_np(dtype_np_to_mx(dtype))) == \
                np.dtype(dtype_mx_to_np(dtype_np_to_mx(res.dtype))):
            return res
        try:
            return res.astype(dtype)
        finally:
            res.close()
    if isinstance(arg1, RowSparseNDArray):
        raise ValueError('Unexpected input type: RowSparseNDArray')
    dtype = _prepare_default_dtype(arg1, dtype)
    dns = _dense.array(arg1, dtype=dtype)
    if ctx is not None and dns.context != ctx:
        dns = dns.as_in_context(ctx)
    _check_shape(dns.shape, shape)
    return dns.tostype('csr')


def _csr_matrix_from_definition(data, indices, indptr, shape=None, ctx=None, dtype=None):
    """CSRNDArray from its parts, as MXNet's (no sorting, no checks on the values)"""
    ctx = current_context() if ctx is None else ctx
    dtype = _prepare_default_dtype(data, dtype)
    data = _prepare_src_array(data, dtype)
    indptr = _prepare_src_array(indptr, np.int64)
    indices = _prepare_src_array(indices, np.int64)
    if not isinstance(data, NDArray):
        data = _dense.array(data, ctx, dtype)
    if not isinstance(indptr, NDArray):
        indptr = _dense.array(indptr, ctx, np.int64)
    if not isinstance(indices, NDArray):
        indices = _dense.array(indices, ctx, np.int64)
    if shape is None:
        if indices.shape[0] == 0:
            raise ValueError('invalid shape')
        shape = (len(indptr) - 1, int(indices.asnumpy().max()) + 1)
    shape = _shape_tuple(shape)
    if data.ndim != 1 or indptr.ndim != 1 or indices.ndim != 1 or indptr.shape[0] == 0 or \
            len(shape) != 2:
        raise ValueError('invalid shape')
    result = CSRNDArray(_new_alloc_handle('csr', shape, ctx, False, dtype,
                                          [np.int64, np.int64], [indptr.shape, indices.shape]))
    for i, part in ((-1, data), (0, indptr), (1, indices)):
        check_call(_LIB.MXNDArraySyncCopyFromNDArray(result.handle, part.handle, i))
    return result


def retain(data, indices):
    """MXNet's ``sparse.retain``: a row_sparse array of `data`'s shape holding, for each
    of `indices` in the order given (duplicates kept, values cast to int64), that row of
    `data` (zeros where `data` stores no such row)."""
    if not isinstance(data, RowSparseNDArray):
        raise MXNetError('retain: data must be a row_sparse array, not %s'
                         % getattr(data, 'stype', type(data).__name__))
    want = indices.asnumpy() if isinstance(indices, NDArray) else np.asarray(indices)
    with np.errstate(all='ignore'):
        want = np.ascontiguousarray(want.reshape(-1).astype(np.int64))
    rows, have = data._parts()
    at = np.searchsorted(have, want)
    found = at < have.size
    found[found] = have[at[found]] == want[found]
    out = np.zeros((want.size,) + tuple(data.shape[1:]), rows.dtype)
    out[found] = rows[at[found]]
    return _from_parts(out, want, data.shape, _dense._op_context(data.context), data.dtype)


def _from_parts(data, indices, shape, ctx, dtype):
    """a new RowSparseNDArray created with nnz = len(indices) (MXNet's way)"""
    indices = np.ascontiguousarray(indices, dtype=np.int64)
    res = RowSparseNDArray(_new_alloc_handle('row_sparse', shape, ctx, False, dtype,
                                             [np.int64], [indices.shape]))
    if indices.size:
        res._fill(data, indices)
    return res


_HAS_OPERATORS = 'MXImperativeInvoke' not in _LIB._mxkv_missing


def _operator_copyto(src, dst):
    """real libmxnet.so only: ``_copyto(src, out=dst)`` through MXImperativeInvoke"""
    op = ctypes.c_void_p()
    check_call(_LIB.NNGetOpHandle(b'_copyto', ctypes.byref(op)))
    ins = (ctypes.c_void_p * 1)(src.handle.value)
    outs = (ctypes.c_void_p * 1)(dst.handle.value)
    out_ptr = ctypes.cast(outs, ctypes.POINTER(ctypes.c_void_p))
    num_out = ctypes.c_int(1)
    check_call(_LIB.MXImperativeInvoke(op, 1, ins, ctypes.byref(num_out), ctypes.byref(out_ptr),
                                       0, None, None))


# --- creation -------------------------------------------------------------------------
def _prepare_default_dtype(src_array, dtype):
    if dtype is None:
        if isinstance(src_array, (NDArray, np.ndarray)):
            dtype = src_array.dtype
        else:
            dtype = mx_real_t
    return dtype


def _prepare_src_array(source_array, dtype):
    if not isinstance(source_array, (NDArray, np.ndarray)):
        try:
            source_array = np.array(source_array, dtype=dtype)
        except Exception:
            raise TypeError('values must be array like object')
    return source_array


def _row_sparse_ndarray_from_definition(data, indices, shape=None, ctx=None, dtype=None,
                                        indices_type=None):
    """RowSparseNDArray from `data` rows at row numbers `indices` (as MXNet: no sorting,
    no checks on the indices' values; ``check_format()`` finds bad ones)."""
    ctx = current_context() if ctx is None else ctx
    dtype = _prepare_default_dtype(data, dtype)
    indices_type = _STORAGE_AUX_TYPES['row_sparse'][0] if indices_type is None else indices_type
    data = _prepare_src_array(data, dtype)
    indices = _prepare_src_array(indices, indices_type)
    if not isinstance(data, NDArray):
        data = _dense.array(data, ctx, dtype)
    if not isinstance(indices, NDArray):
        indices = _dense.array(indices, ctx, indices_type)
    if shape is None:
        num_indices = indices.shape[0]
        if num_indices == 0:
            raise ValueError('invalid shape')
        dim0 = int(indices.asnumpy()[num_indices - 1]) + 1
        shape = (dim0,) + tuple(data.shape[1:])
    shape = _shape_tuple(shape)
    if data.ndim != len(shape) or indices.ndim != 1 or _prod(shape[1:]) == 0:
        raise ValueError('invalid shape')
    if data.shape[0] != indices.shape[0]:  # MXNet: a size mismatch copying into the parts
        raise MXNetError('row_sparse_array: %d row indices for %d data rows'
                         % (indices.shape[0], data.shape[0]))
    result = RowSparseNDArray(_new_alloc_handle('row_sparse', shape, ctx, False, dtype,
                                                [indices_type], [indices.shape]))
    check_call(_LIB.MXNDArraySyncCopyFromNDArray(result.handle, data.handle, -1))
    check_call(_LIB.MXNDArraySyncCopyFromNDArray(result.handle, indices.handle, 0))
    return result


def row_sparse_array(arg1, shape=None, ctx=None, dtype=None):
    """A RowSparseNDArray from ``(data, indices)``, a dense array-like or NDArray, another
    RowSparseNDArray, or a shape ``(D0, D1, ...)`` (empty), as ``mxnet.nd.sparse``'s."""
    if isinstance(arg1, tuple):
        arg_len = len(arg1)
        if arg_len < 2:
            raise ValueError('Unexpected length of input tuple: ' + str(arg_len))
        if arg_len > 2 or (isinstance(arg1[0], integer_types)
                           and isinstance(arg1[1], integer_types)):
            _check_shape(arg1, shape)
            return empty('row_sparse', arg1, ctx=ctx, dtype=dtype)
        return _row_sparse_ndarray_from_definition(arg1[0], arg1[1], shape=shape, ctx=ctx,
                                                   dtype=dtype)
    if isinstance(arg1, RowSparseNDArray):
        _check_shape(arg1.shape, shape)
        return array(arg1, ctx=ctx, dtype=dtype)
    if isinstance(arg1, CSRNDArray):
        raise ValueError('Unexpected input type: CSRNDArray')
    dtype = _prepare_default_dtype(arg1, dtype)
    dns = _dense.array(arg1, dtype=dtype)
    if ctx is not None and dns.context != ctx:
        dns = dns.as_in_context(ctx)
    _check_shape(dns.shape, shape)
    return dns.tostype('row_sparse')


def zeros(stype, shape, ctx=None, dtype=None, **kwargs):
    """An all-zero array of storage type `stype` ('row_sparse' arrays hold no rows)."""
    if stype == 'default':
        return _dense.zeros(shape, ctx=ctx, dtype=dtype, **kwargs)
    if ctx is None:
        ctx = current_context()
    dtype = mx_real_t if dtype is None else dtype
    if stype not in ('row_sparse', 'csr'):
        raise ValueError('unknown storage type' + str(stype))
    shape = _shape_tuple(shape)
    arr = _dense._ndarray_cls(_new_alloc_handle(stype, shape, ctx, True, dtype,
                                                _STORAGE_AUX_TYPES[stype]))
    if stype == 'csr' and shape[0] < 2 ** 31:
        # as MXNet's zeros operator: indptr of rows + 1 zeros (a valid, savable csr);
        # MXNet 1.9.1 cannot make more rows, and libmxkv leaves such offsets empty
        indptr = _dense.zeros((shape[0] + 1,), ctx=ctx, dtype=_STORAGE_AUX_TYPES['csr'][0])
        check_call(_LIB.MXNDArraySyncCopyFromNDArray(arr.handle, indptr.handle, 0))
    return arr


def empty(stype, shape, ctx=None, dtype=None):
    """A sparse array with no stored elements (same as :func:`zeros`)."""
    if isinstance(shape, int):
        shape = (shape,)
    if stype in ('csr', 'row_sparse'):
        return zeros(stype, shape, ctx=ctx, dtype=dtype)
    raise Exception('unknown stype : ' + str(stype))


def array(source_array, ctx=None, dtype=None):
    """A copy of a sparse array (optionally on another context / with another dtype)."""
    ctx = current_context() if ctx is None else ctx
    if isinstance(source_array, NDArray):
        assert source_array.stype != 'default', \
            'Please use `tostype` to create RowSparseNDArray or CSRNDArray from an NDArray'
        dtype = _prepare_default_dtype(source_array, dtype)
        arr = empty(source_array.stype, source_array.shape, dtype=dtype, ctx=ctx)
        arr[:] = source_array
        return arr
    if isinstance(source_array, (np.ndarray, np.generic)):
        raise ValueError('Please use mx.nd.array to create an NDArray with source_array of type ',
                         type(source_array))
    raise ValueError('Unexpected source_array type: ', type(source_array))


def _elemwise(lhs, rhs, op, pyop):
    """MXNet's sparse.add/subtract/multiply: arrays of one shape go through elemwise_*
    (a dense lhs with a row_sparse rhs included), anything else as `lhs <op> rhs`."""
    if (isinstance(lhs, NDArray) and isinstance(rhs, NDArray) and not lhs._is_sparse
            and isinstance(rhs, RowSparseNDArray) and lhs.shape == rhs.shape):
        return rhs._elemwise_dense(lhs, op, rsp_first=False)
    return pyop(lhs, rhs)


def add(lhs, rhs):
    """lhs + rhs (elemwise_add for one shape: a row_sparse and a dense give a dense array
    whose unstored rows are the dense operand's own values)"""
    return _elemwise(lhs, rhs, 'add', operator.add)


def subtract(lhs, rhs):
    """lhs - rhs (elemwise_sub for one shape)"""
    return _elemwise(lhs, rhs, 'sub', operator.sub)


def multiply(lhs, rhs):
    """lhs * rhs (elemwise_mul for one shape: row_sparse * dense is row_sparse)"""
    return _elemwise(lhs, rhs, 'mul', operator.mul)


def divide(lhs, rhs):
    """lhs / rhs (dense unless dividing a row_sparse array by a scalar)"""
    return lhs / rhs


# MXNet registers zeros_like in mx.nd.sparse too (ones_like is not), and its optimizer
# operators with row_sparse kernels
zeros_like = _dense.zeros_like
# pylint: disable=wrong-import-position
from ._update_ops import sgd_update, sgd_mom_update, adam_update, ftrl_update  # noqa: E402
