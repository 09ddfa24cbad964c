"""NDArray: a library-owned array, with arithmetic done in numpy on zero-copy views.

libmxkv exports no operators (no ``MXImperativeInvoke``), so every computation
here runs in numpy directly on the array's buffer (``MXNDArrayGetData``).
Before reading a buffer ``MXNDArrayWaitToRead`` is called and before writing
one ``MXNDArrayWaitToWrite`` (no-ops in libmxkv, required for an asynchronous
engine such as real MXNet's).  Scalars are converted the way MXNet's operators
convert them (string round trip through dmlc's parser, then cast to the
array's dtype), so results are bit-identical to MXNet's float32 kernels.
"""
import ctypes
import math
import operator
import warnings

import numpy as np

from ..base import (_LIB, check_call, NDArrayHandle, MXNetError, MXKVUsageError,
                    numeric_types, integer_types, mx_real_t)
from ..context import Context, current_context
from .._numerics import dmlc_double, dmlc_float

# libmxkv finishes every operation before returning, so its MXNDArrayWait* calls
# have nothing to wait for and are skipped; a real libmxnet.so keeps them.
_SYNCHRONOUS = bool(getattr(_LIB, '_mxkv_synchronous', False))

__all__ = ['NDArray', 'empty', 'zeros', 'ones', 'full', 'array', 'waitall', 'concatenate',
           'bfloat16', '_ndarray_cls', 'clip', 'sqrt', 'square', 'sign', 'abs', 'maximum',
           'minimum', 'cast', 'add', 'subtract', 'multiply', 'divide', 'moveaxis',
           'true_divide', 'modulo', 'power', 'zeros_like', 'ones_like',
           'dtype_np_to_mx', 'dtype_mx_to_np', 'arange']

bfloat16 = np.dtype([('bfloat16', np.uint16)])

_DTYPE_NP_TO_MX = {
    None: -1, np.float32: 0, np.float64: 1, np.float16: 2, np.uint8: 3, np.int32: 4,
    np.int8: 5, np.int64: 6, np.bool_: 7, np.int16: 8, np.uint16: 9, np.uint32: 10,
    np.uint64: 11,
}
_DTYPE_MX_TO_NP = {v: k for k, v in _DTYPE_NP_TO_MX.items()}
_DTYPE_MX_TO_NP[12] = bfloat16


# --- bfloat16 values (MXNet's mshadow::bfloat::bf16_t): a bf16 is the high half of a
# float32; converting to bf16 goes through float (`static_cast<float>(v)`, so float64 and
# integers are rounded to float32 first) and keeps the high 16 bits, truncating (no
# rounding, NaN payloads and all); converting from bf16 widens to that float32 and casts
# it like any float32.  numpy has no bfloat16, so these arrays hold the raw bits (uint16).
def _bf16_decode(bits):
    """uint16 bfloat16 bits -> float32 values"""
    wide = np.asarray(bits, dtype=np.uint16).astype(np.uint32)
    wide <<= np.uint32(16)
    return wide.view(np.float32)


def _bf16_encode(values):
    """numeric values -> uint16 bfloat16 bits, as bf16_t(static_cast<float>(v))"""
    with np.errstate(all='ignore'):
        bits = np.asarray(values).astype(np.float32).view(np.uint32)
    bits >>= np.uint32(16)
    return bits.astype(np.uint16)


def _convert(src, src_dtype, dst_dtype):
    """numpy values `src` of NDArray dtype `src_dtype` as storage values of `dst_dtype`
    (the element conversion of MXNet's copy / cast operators)"""
    if src_dtype is bfloat16:
        src = _bf16_decode(src)
    if dst_dtype is bfloat16:
        return _bf16_encode(src)
    dst = np.dtype(dst_dtype)
    if src.dtype == dst:
        return src
    with np.errstate(all='ignore'):
        return src.astype(dst)


_STORAGE_TYPE_UNDEFINED = -1
_STORAGE_TYPE_DEFAULT = 0
_STORAGE_TYPE_ROW_SPARSE = 1
_STORAGE_TYPE_CSR = 2
_STORAGE_TYPE_STR_TO_ID = {'undefined': -1, 'default': 0, 'row_sparse': 1, 'csr': 2}
_STORAGE_TYPE_ID_TO_STR = {v: k for k, v in _STORAGE_TYPE_STR_TO_ID.items()}


def dtype_np_to_mx(dtype):
    """numpy dtype (or name, or type) -> MXNet type code"""
    if dtype is None:
        return -1
    if isinstance(dtype, str) and dtype == 'bfloat16':
        return 12
    if isinstance(dtype, np.dtype) and dtype == bfloat16:
        return 12
    key = np.dtype(dtype).type  # TypeError for a name numpy does not know, as in MXNet
    if key not in _DTYPE_NP_TO_MX:
        raise UnsupportedDTypeError('unsupported dtype %r' % (dtype,))
    return _DTYPE_NP_TO_MX[key]


class UnsupportedDTypeError(MXNetError, KeyError):
    """A numpy dtype MXNet has no type code for (complex, float128, object ...): MXNet's
    operators raise MXNetError, its nd.empty / nd.array KeyError (a dict lookup)."""


def dtype_mx_to_np(code):
    """MXNet type code -> numpy type (np.float32 ...); bfloat16 -> structured uint16 dtype"""
    try:
        return _DTYPE_MX_TO_NP[code]
    except KeyError:
        raise MXNetError('unknown dtype code %d' % code)


class _BufferRef(object):
    """Exposes a library buffer to numpy and keeps the owning NDArray alive."""
    __slots__ = ('__array_interface__', 'owner')

    def __init__(self, owner, address, shape, typestr):
        self.owner = owner
        self.__array_interface__ = {'data': (address, False), 'shape': tuple(shape),
                                    'typestr': typestr, 'version': 3}


# --- shapes: dims travel as uint32 (MXNet's mx_uint entry points) when they fit, else
# through the 64-bit entry points (MXNDArrayCreateEx64 ...).  MXNet 1.9.1's own frontend
# (built without USE_INT64_TENSOR_SIZE) raises OverflowError for a dim >= 2**32; a
# library exporting the 64-bit functions (libmxkv does) gets such shapes whole.  No dim
# is ever truncated to 32 bits.
_UINT32_MAX = (1 << 32) - 1
_INT64_MAX = (1 << 63) - 1


def _dim(value):
    """one dimension as a Python int: ints and numpy ints only (MXNet refuses floats and
    bools; int() would truncate 2.7 to 2)"""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError('a shape dimension must be an integer, not %r' % (value,))
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError('a shape dimension must be an integer, not %s %r'
                        % (type(value).__name__, value))


def _check_dims(shape, what='shape'):
    """`shape` (ints) as a tuple of Python ints in [0, 2**63); True if all fit in uint32."""
    shape = tuple(_dim(s) for s in shape)
    for dim in shape:
        if dim < 0:
            raise MXKVUsageError('negative dimension in %s %s' % (what, shape))
        if dim > _INT64_MAX:
            raise OverflowError('dimension %d in %s %s does not fit in 64 bits'
                                % (dim, what, shape))
    return shape, all(dim <= _UINT32_MAX for dim in shape)


def _need_64bit(name, shape):
    """Raise unless the library exports the 64-bit entry point `name`."""
    if name in _LIB._mxkv_missing:
        raise OverflowError('shape %s has a dimension >= 2**32 and %s does not export %s '
                            '(MXNet needs a USE_INT64_TENSOR_SIZE build for such shapes)'
                            % (shape, _LIB._mxkv_path, name))


_HAS_SHAPE64 = 'MXNDArrayGetShapeEx64' not in _LIB._mxkv_missing


def _result_into(res, out):
    """an operator's result: `res` itself, or with `out` given, `res` copied into `out`
    (in out's storage type; MXNet's errors for another shape or dtype) and freed"""
    if out is None:
        return res
    try:
        res.copyto(out)
    finally:
        res.close()
    return out


def _op_context(ctx):
    """the context of an operator's result given its first input's: MXNet 1.9.1's
    imperative GetContext does not propagate cpu_pinned / cpu_shared, the operator runs
    (and allocates its outputs) on the plain device of that id: cpu_pinned(k) -> cpu(k).
    Copies (copy, copyto, as_in_context, astype) and views keep the context."""
    if ctx.device_type in ('cpu_pinned', 'cpu_shared'):
        return Context('cpu', ctx.device_id)
    return ctx


def _basic_view(key, shape):
    """whether MXNet 1.9.1's basic indexing with `key` (ints, slices, None, Ellipsis)
    gives a view (a contiguous flat slice: _basic_indexing_slice_is_contiguous) rather
    than the result of its slice operator; advanced keys (arrays) never do"""
    parts = key if isinstance(key, tuple) else (key,)
    if any(not (k is None or k is Ellipsis or isinstance(k, (slice, numeric_types)))
           or isinstance(k, (bool, np.bool_)) for k in parts):
        return False
    parts = [k for k in parts if k is not None]
    if Ellipsis in parts:
        at = parts.index(Ellipsis)
        parts[at:at + 1] = [slice(None)] * (len(shape) - len(parts) + 1)
    parts += [slice(None)] * (len(shape) - len(parts))
    slc = []
    for k, dim in zip(parts, shape):
        if isinstance(k, slice):
            slc.append(k)
        else:
            k = int(k) % dim if dim else 0
            slc.append(slice(k, k + 1))
    lens = [len(range(*k.indices(dim))) for k, dim in zip(slc, shape)]
    if int(np.prod(lens)) in (0, 1):
        return True
    subset = False
    for k, dim, num in zip(reversed(slc), reversed(shape), reversed(lens)):
        step = k.indices(dim)[2]
        if num == 0:
            return True
        if num > 1 and (step > 1 or step < 0):
            return False
        if subset:
            if num > 1:
                return False
        elif num < dim:
            subset = True
    return True


def _new_alloc_handle(shape, ctx, delay_alloc, dtype):
    hdl = NDArrayHandle()
    shape, fits32 = _check_dims(shape)
    if fits32:
        arr = (ctypes.c_uint32 * len(shape))(*shape)
        check_call(_LIB.MXNDArrayCreateEx(arr, len(shape), ctx.device_typeid, ctx.device_id,
                                          int(bool(delay_alloc)), dtype_np_to_mx(dtype),
                                          ctypes.byref(hdl)))
    else:
        _need_64bit('MXNDArrayCreateEx64', shape)
        arr = (ctypes.c_int64 * len(shape))(*shape)
        check_call(_LIB.MXNDArrayCreateEx64(arr, len(shape), ctx.device_typeid, ctx.device_id,
                                            int(bool(delay_alloc)), dtype_np_to_mx(dtype),
                                            ctypes.byref(hdl)))
    return hdl


def _shape_tuple(shape):
    if isinstance(shape, integer_types) and not isinstance(shape, (bool, np.bool_)):
        return (_dim(shape),)
    return tuple(_dim(s) for s in shape)


class _EmptyRegion(object):
    """NDArray._index_key: a write selecting nothing (of `shape`)"""

    def __init__(self, shape):
        self.shape = tuple(shape)

    def check(self, value):
        """MXNet's _prepare_value_nd for an empty target: a number is written nowhere; an
        array must pass NDArray.broadcast_to's check (ValueError), then the operator
        fails on the empty shape (MXNetError) unless the value is empty too"""
        if isinstance(value, numeric_types):
            return
        vshape = value.shape if isinstance(value, NDArray) else np.shape(value)
        if int(np.prod(vshape)) == 0:
            return
        while len(vshape) > len(self.shape) and vshape[0] == 1:
            vshape = vshape[1:]
        if len(vshape) > len(self.shape) or any(
                v not in (1, t) for v, t in zip((1,) * (len(self.shape) - len(vshape))
                                                + tuple(vshape), self.shape)):
            raise ValueError('operands could not be broadcast together with remapped shapes '
                             '[original->remapped]: %s and requested shape %s'
                             % (vshape, self.shape))
        raise MXNetError('cannot broadcast a value of shape %s to the empty region %s'
                         % (vshape, self.shape))


def _expand_key(key, ndim):
    """a key with its Ellipsis (or the missing trailing axes) made slices, None kept"""
    parts = key if isinstance(key, tuple) else (key,)
    given = [k for k in parts if k is not None and k is not Ellipsis]
    fill = [slice(None)] * max(ndim - len(given), 0)
    expanded = []
    for k in parts:
        expanded.extend(fill if k is Ellipsis else [k])
    if not any(k is Ellipsis for k in parts):
        expanded.extend(fill)
    return expanded


def _expand_basic_key(key, ndim):
    """a basic key (ints, slices, None, one Ellipsis) as one int or slice per axis"""
    return [k for k in _expand_key(key, ndim) if k is not None]


# the scalar index types MXNet's legacy indexing takes (mxnet.base.integer_types)
_INDEX_INTS = (int, np.int32, np.int64)


class NDArray(object):
    """An array owned by the library (``NDArrayHandle``).

    The handle is freed by :meth:`close`, by leaving a ``with`` block, or when
    the object is garbage collected, whichever comes first (exactly once).
    """
    __slots__ = ['handle', 'writable', '__weakref__']
    __array_priority__ = 1000.0
    _is_sparse = False  # True for row_sparse / csr arrays (BaseSparseNDArray)

    def __init__(self, handle, writable=True):
        if handle is not None and not isinstance(handle, NDArrayHandle):
            handle = NDArrayHandle(handle)
        self.handle = handle
        self.writable = writable

    # --- lifetime --------------------------------------------------------------
    def close(self):
        """Free the library handle now (idempotent)."""
        hdl, self.handle = getattr(self, 'handle', None), None
        if hdl is not None and hdl.value:
            check_call(_LIB.MXNDArrayFree(hdl))

    def __del__(self):
        try:
            self.close()
        except Exception:  # pylint: disable=broad-except
            pass  # interpreter shutdown or library already gone

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def _h(self):
        if self.handle is None:
            raise MXKVUsageError('NDArray is closed')
        return self.handle

    # --- properties ------------------------------------------------------------
    @property
    def shape(self):
        """tuple of ints (None for an array created without a shape)"""
        ndim = ctypes.c_int()
        if _HAS_SHAPE64:  # int64 dims: MXNDArrayGetShapeEx's int would fail or wrap
            pdata = ctypes.POINTER(ctypes.c_int64)()
            check_call(_LIB.MXNDArrayGetShapeEx64(self._h, ctypes.byref(ndim),
                                                  ctypes.byref(pdata)))
        else:
            pdata = ctypes.POINTER(ctypes.c_int)()
            check_call(_LIB.MXNDArrayGetShapeEx(self._h, ctypes.byref(ndim),
                                                ctypes.byref(pdata)))
        if ndim.value == -1:
            return None
        return tuple(pdata[:ndim.value])

    @property
    def size(self):
        """number of elements"""
        size = 1
        for dim in self.shape or ():
            size *= dim
        return size

    @property
    def ndim(self):
        """number of dimensions"""
        return len(self.shape)

    @property
    def dtype(self):
        """numpy type of the elements (numpy.float32 ...)"""
        code = ctypes.c_int()
        check_call(_LIB.MXNDArrayGetDType(self._h, ctypes.byref(code)))
        return dtype_mx_to_np(code.value)

    @property
    def _np_dtype(self):
        dt = self.dtype
        return np.dtype(np.uint16) if dt is bfloat16 else np.dtype(dt)

    @property
    def context(self):
        """device the array lives on"""
        dev_type, dev_id = ctypes.c_int(), ctypes.c_int()
        check_call(_LIB.MXNDArrayGetContext(self._h, ctypes.byref(dev_type), ctypes.byref(dev_id)))
        return Context.from_codes(dev_type.value, dev_id.value)

    ctx = context

    @property
    def stype(self):
        """'default', 'row_sparse', 'csr' (or 'undefined')"""
        code = ctypes.c_int()
        check_call(_LIB.MXNDArrayGetStorageType(self._h, ctypes.byref(code)))
        return _STORAGE_TYPE_ID_TO_STR[code.value]

    def __len__(self):
        return self.shape[0]

    def __bool__(self):
        num = self.size
        if num == 0:
            return False
        if num == 1:
            return bool(self.asnumpy().reshape(-1)[0])
        raise ValueError('The truth value of an NDArray with multiple elements is ambiguous.')

    __nonzero__ = __bool__

    def __hash__(self):
        return id(self) // 16

    # --- synchronisation & raw access ------------------------------------------
    def wait_to_read(self):
        """Block until pending writes to this array are done."""
        hdl = self.handle
        if _SYNCHRONOUS and hdl is not None and hdl.value:
            return  # libmxkv: nothing is ever pending; the handle is a live one of ours
        check_call(_LIB.MXNDArrayWaitToRead(self._h))

    def wait_to_write(self):
        """Block until pending reads and writes of this array are done."""
        hdl = self.handle
        if _SYNCHRONOUS and hdl is not None and hdl.value:
            return
        check_call(_LIB.MXNDArrayWaitToWrite(self._h))

    def _view(self, write=False):
        """numpy array sharing this array's buffer (dense arrays only)."""
        if self.stype != 'default':
            raise MXNetError('numpy view of a %s array is not supported' % self.stype)
        if write:
            if not self.writable:
                raise MXKVUsageError('trying to write to a readonly NDArray')
            self.wait_to_write()
        else:
            self.wait_to_read()
        shape = self.shape
        dt = self._np_dtype
        if shape is None:
            raise MXNetError('the NDArray has no shape (created by MXNDArrayCreateNone)')
        ptr = ctypes.c_void_p()
        check_call(_LIB.MXNDArrayGetData(self._h, ctypes.byref(ptr)))
        if not ptr.value:
            if int(np.prod(shape, dtype=np.int64)) != 0:
                raise MXNetError('MXNDArrayGetData returned NULL for a non-empty array')
            return np.zeros(shape, dt)
        return np.asarray(_BufferRef(self, ptr.value, shape, dt.str))

    def _arith_view(self, write=False):
        if self.dtype is bfloat16:
            raise MXNetError('arithmetic on bfloat16 arrays is not supported by mxkv '
                             '(no numpy dtype); use astype or asnumpy() for the raw bits')
        return self._view(write)

    def asnumpy(self):
        """A numpy copy of the contents (bfloat16 arrays give the raw uint16 bits)."""
        if self.stype != 'default':
            return self.tostype('default').asnumpy()
        shape = self.shape
        data = np.empty(shape, dtype=self._np_dtype)
        if data.size:
            check_call(_LIB.MXNDArraySyncCopyToCPU(
                self._h, data.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(data.size)))
        else:
            self.wait_to_read()
        if self.dtype is bfloat16:
            return data.view(bfloat16)
        return data

    def asscalar(self):
        """The single element as a numpy scalar."""
        if self.size != 1:
            raise ValueError('The current array is not a scalar')
        if self.ndim == 1:
            return self.asnumpy()[0]
        return self.asnumpy()[()]

    def _sync_copyfrom(self, source_array):
        """Copy a numpy array (or array-like) of the same shape into this array."""
        source_array = np.asarray(source_array, dtype=self._np_dtype, order='C')
        if source_array.shape != self.shape:
            raise ValueError('Shape inconsistent: expected %s vs got %s'
                             % (str(self.shape), str(source_array.shape)))
        if not self.writable:
            raise MXKVUsageError('trying to write to a readonly NDArray')
        if source_array.size:
            check_call(_LIB.MXNDArraySyncCopyFromCPU(
                self._h, source_array.ctypes.data_as(ctypes.c_void_p),
                ctypes.c_size_t(source_array.size)))

    # --- representation ----------------------------------------------------------
    def __repr__(self):
        if self.handle is None:
            return '<%s (closed)>' % self.__class__.__name__
        shape_info = 'x'.join(['%d' % x for x in self.shape])
        return '\n%s\n<%s %s @%s>' % (str(self.asnumpy()), self.__class__.__name__,
                                      shape_info, self.ctx)

    # --- pickling (used by optimizer state checkpoints) ----------------------------
    def __reduce__(self):
        return NDArray, (None,), self.__getstate__()

    def __getstate__(self):
        if self.handle is None:
            return {'mxkv': None}
        data = self.asnumpy()
        ctx = self.context
        return {'mxkv': 1, 'dtype': dtype_np_to_mx(self.dtype), 'shape': self.shape,
                'ctx': (ctx.device_typeid, ctx.device_id),
                'data': np.ascontiguousarray(data).view(np.uint8).tobytes()}

    def __setstate__(self, state):
        self.writable = True
        if state.get('mxkv') is None:
            self.handle = None
            return
        dt = dtype_mx_to_np(state['dtype'])
        ctx = Context.from_codes(*state['ctx'])
        if ctx.device_type != 'gpu':  # MXNet's NDArray::Load puts CPU arrays on cpu(0)
            ctx = Context('cpu', 0)
        self.handle = _new_alloc_handle(state['shape'], ctx, False, dt)
        raw = np.frombuffer(state['data'], dtype=np.uint16 if dt is bfloat16 else dt)
        self._sync_copyfrom(raw.reshape(state['shape']))

    # --- copies ----------------------------------------------------------------------
    def copyto(self, other):
        """Copy into `other` (an NDArray of the same shape; dtype converted) or onto a
        Context (a new array)."""
        if isinstance(other, NDArray):
            if other.handle is not None and self.handle is not None \
                    and other.handle.value == self.handle.value:
                warnings.warn('You are attempting to copy an array to itself', RuntimeWarning)
                return False
            if other.shape != self.shape:
                raise MXNetError('copyto: shape mismatch, source %s vs destination %s'
                                 % (self.shape, other.shape))
            if other.stype == 'row_sparse':
                from .sparse import _dense_copyto_rsp
                return _dense_copyto_rsp(self, other)
            if other.stype == 'csr':
                from .sparse import _dense_copyto_csr
                return _dense_copyto_csr(self, other)
            if other.stype != 'default':
                raise TypeError('copyto does not support destination NDArray stype '
                                + other.stype)
            src = self._view()
            dst = other._view(write=True)
            np.copyto(dst, _convert(src, self.dtype, other.dtype), casting='unsafe')
            return other
        if isinstance(other, Context):
            hret = NDArray(_new_alloc_handle(self.shape, other, True, self.dtype))
            return self.copyto(hret)
        raise TypeError('copyto does not support type ' + str(type(other)))

    def copy(self):
        """A deep copy on the same context."""
        return self.copyto(self.context)

    def as_in_context(self, context):
        """Self if already on `context`, else a copy there."""
        if self.context == context:
            return self
        return self.copyto(context)

    as_in_ctx = as_in_context

    def astype(self, dtype, copy=True):
        """A copy converted to `dtype` (or self if no conversion and copy=False)."""
        if not copy and dtype_np_to_mx(dtype) == dtype_np_to_mx(self.dtype):
            return self  # (not _np_dtype: a bfloat16 array holds uint16 bits)
        res = empty(self.shape, ctx=self.context, dtype=dtype)
        self.copyto(res)
        return res

    def reshape(self, *shape, **kwargs):
        """A reshaped **copy** (libmxkv has no MXNDArrayReshape; MXNet returns a view).

        `shape` takes MXNet's special values (0 copies a dim, -1 infers one, -2 copies
        the rest, -3 merges two dims, -4 splits one in two) and ``reverse=True`` applies
        them from the right, as MXNet's ``MXNDArrayReshape64``."""
        if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
            shape = shape[0]
        elif not shape:
            shape = kwargs.get('shape')
            assert shape, "Shape must be provided."
        if not all(k in ['shape', 'reverse'] for k in kwargs):
            raise TypeError(
                "Got unknown keywords in reshape: {}. "
                "Accepted keyword arguments are 'shape' and 'reverse'.".format(
                    ', '.join([k for k in kwargs if k not in ['shape', 'reverse']])))
        new_shape = _infer_reshape(self.shape, shape, kwargs.get('reverse', False))
        size = self.size
        new_size = 1
        for dim in new_shape:
            new_size *= dim
        if new_size > size:  # NDArray::Reshape
            raise MXNetError('NDArray.Reshape: target shape %s (size %d) is larger than the '
                             'current shape %s (size %d)'
                             % (new_shape, new_size, self.shape, size))
        if new_size != size:  # MXNet's frontend, after the (smaller) view was made
            raise ValueError('Cannot reshape array of size {} into shape {}'.format(
                size, tuple(shape)))
        data = self.asnumpy().reshape(new_shape)
        return array(data, ctx=self.context, dtype=self.dtype)

    def tostype(self, stype):
        """Storage conversion: 'default' (self), 'row_sparse' (a new RowSparseNDArray
        holding the rows with a non-zero element) or 'csr' (a new CSRNDArray of a 2-d
        array's non-zero elements), as MXNet's cast_storage."""
        if stype == self.stype:
            if _op_context(self.context) != self.context:
                # cast_storage runs on cpu(k) and checks its output's dev_type against
                # its input's for a dense -> dense cast (MXNet reports it at the next wait)
                raise MXNetError('Check failed: output.ctx().dev_type == '
                                 'input.ctx().dev_type (1 vs. %d) : cast_storage of a dense '
                                 'array on %s to dense' % (self.context.device_typeid,
                                                           self.context))
            return self
        if stype == 'row_sparse':
            from .sparse import _dense_tostype_rsp
            return _dense_tostype_rsp(self)
        if stype == 'csr':
            from .sparse import _dense_tostype_csr
            return _dense_tostype_csr(self)
        raise ValueError('unknown storage type %r' % (stype,))

    # --- indexing ----------------------------------------------------------------------
    @staticmethod
    def _is_full(key):
        if isinstance(key, slice):
            return key == slice(None)
        if key is Ellipsis:
            return True
        if isinstance(key, tuple):
            if sum(1 for k in key if k is Ellipsis) > 1:
                return False
            return all(NDArray._is_full(k) for k in key) if key else True
        return False

    def _index_key(self, key, setting):
        """`key` as the numpy index that selects what MXNet's legacy NDArray indexing
        selects (ndarray.py of MXNet 1.9.1: __getitem__, __setitem__,
        indexing_key_expand_implicit_axes, _advanced_index_to_array):

        * index arrays (numpy arrays, lists, tuples, ranges, NDArrays inside a tuple key)
          become int32 arrays: bool arrays count as 0 / 1, float ones are truncated;
          a bool NDArray is refused (ValueError: "legacy mode"), an empty or 0-d numpy
          index array too (MXNetError);
        * scalars must be int, numpy.int32 or numpy.int64 (a top-level bool is an int
          for reading and the whole array for writing); floats, other numpy scalars and
          strings raise ValueError;
        * an empty slice: a[2:1] (begin > end) raises MXNetError when reading, as does a
          tuple key selecting nothing along an axis after the first (MXNet reshapes the
          empty flat slice with 0 dims, which copy dims); writing to an empty region
          raises AssertionError."""
        if isinstance(key, bool):
            return Ellipsis if setting else int(key)
        shape = self.shape
        if not setting and isinstance(key, tuple) and len(key) == len(shape) and \
                all(isinstance(k, _INDEX_INTS) for k in key):
            return tuple(int(k) for k in key)
        parts = key if isinstance(key, tuple) else (key,)
        if setting and isinstance(key, tuple):  # a bool becomes a 0-d bool array: no axis
            parts = tuple(k for k in parts if not isinstance(k, bool))
            if not parts:
                return Ellipsis
        if sum(1 for k in parts if k is Ellipsis) > 1:
            raise IndexError('Cannot use more than one ellipsis (`...`) for indexing')
        out = []
        advanced = False
        for part in parts:
            if part is None or part is Ellipsis or isinstance(part, slice) or \
                    isinstance(part, _INDEX_INTS):
                out.append(part)
                continue
            if isinstance(part, NDArray):
                if part.dtype is np.bool_:
                    raise ValueError('Cannot perform boolean indexing in legacy mode. Please '
                                     'activate numpy semantics by calling `npx.set_np()` in '
                                     'the global scope before calling this function.')
                values = part.asnumpy()
                if part.dtype is bfloat16:
                    values = _bf16_decode(values)
            elif isinstance(part, (np.ndarray, list, tuple, range)):
                values = np.asarray(part) if not isinstance(part, range) else \
                    np.arange(part.start, part.stop, part.step)
                if values.ndim == 0 and isinstance(part, np.ndarray):
                    raise MXNetError('a 0-d numpy index array is not supported by MXNet\'s '
                                     'legacy indexing: %r' % (part,))
            else:
                raise ValueError('NDArray does not support slicing with key {} of type {}.'
                                 .format(part, type(part)))
            if values.size == 0:
                raise MXNetError('indexing with an empty index array (%r)' % (part,))
            if values.ndim == 0:
                out.append(int(values))
                continue
            with np.errstate(all='ignore'):
                out.append(values.astype(np.int32))
            advanced = True
        key = tuple(out) if isinstance(key, tuple) or len(out) != 1 else out[0]
        if advanced:
            self._check_advanced_key(key)
            if self.size == 0 and not setting:
                # MXNet's gather_nd: an input with a zero dim has an unknown shape in
                # MXNet 1.9.1's legacy shape semantics, its shape inference fails
                raise MXNetError('advanced indexing of an array of shape %s: gather_nd '
                                 'cannot infer the shape of an input with a zero dim'
                                 % (shape,))
            return key
        if self.size == 0 and (setting or isinstance(key, _INDEX_INTS)):
            # (a[i] is MXNDArrayAt in MXNet: no reshape, an empty (n, 0)[i] is fine)
            return key
        region = self._view()[key]
        if region.size:
            return key
        if setting:
            return self._empty_region_key(key, region.shape)
        if isinstance(key, slice) and key.step in (None, 1) and \
                (key.start is not None or key.stop is not None):
            begin, end, _ = key.indices(shape[0])
            if begin > end:
                raise MXNetError('Invalid slicing range [%d, %d) of an array of shape %s'
                                 % (begin, end, shape))
            return key
        # MXNet slices the flat array [0, 0) and reshapes it to the per-axis lengths, then
        # to the result's shape (int axes dropped, a 1 for each None)
        int_axes = []
        sliced = []
        for axis, (k, dim) in enumerate(zip(_expand_basic_key(key, len(shape)), shape)):
            if isinstance(k, slice):
                sliced.append(len(range(*k.indices(dim))))
            else:
                sliced.append(1)
                int_axes.append(axis)
        for src, dst in [((0,), sliced), (None, None)]:
            if src is None:  # the second reshape: to the result's shape
                final = [d for i, d in enumerate(sliced) if i not in int_axes]
                full_key = _expand_key(key, len(shape))
                steps = np.cumsum([0] + [0 if isinstance(k, _INDEX_INTS) else 1
                                         for k in full_key])
                for ax in [int(steps[i]) for i, k in enumerate(full_key) if k is None]:
                    final.insert(ax, 1)
                src, dst = sliced, final or [1]
            sliced = _infer_reshape(src, dst, False)
            if int(np.prod(sliced, dtype=np.int64)) != 0:  # NDArray::Reshape: larger
                raise MXNetError('reshape of the empty slice to %s: target larger than the '
                                 'source' % (sliced,))
        return key

    def _check_advanced_key(self, key):
        """MXNet's advanced indexing (_get_index_nd): a slice selecting nothing leaves an
        empty index array (MXNetError from gather_nd / scatter_nd), index arrays that do
        not broadcast together raise ValueError"""
        arrays = []
        for k, dim in zip(_expand_basic_key(key, self.ndim), self.shape):
            if isinstance(k, slice) and len(range(*k.indices(dim))) == 0:
                raise MXNetError('advanced indexing with an empty slice %r (axis of length %d)'
                                 % (k, dim))
            if isinstance(k, (np.ndarray, int)):
                arrays.append(np.shape(k))
        try:
            np.broadcast_shapes(*arrays)
        except ValueError:
            raise ValueError('shape mismatch: index arrays of shapes %s cannot be broadcast '
                             'together' % (arrays,))

    def _advanced_new_axes(self, key, result):
        """`result` of numpy advanced indexing without the None entries of `key`, with the
        new axes where MXNet's _new_axes_after_advanced_indexing puts them"""
        full_key = _expand_key(key, self.ndim)
        adv = [i for i, k in enumerate(full_key) if isinstance(k, (np.ndarray, int))]
        adjacent = all(b - a == 1 for a, b in zip(adv, adv[1:]))
        adv_ndim = len(np.broadcast_shapes(*[np.shape(full_key[i]) for i in adv]))
        steps = [adv_ndim if not adjacent else 0] + [0 if i in adv else 1
                                                     for i in range(len(full_key))]
        cum = np.cumsum(steps)
        shape = list(result.shape)
        for ax in [int(cum[i]) for i, k in enumerate(full_key) if k is None]:
            shape.insert(ax, 1)
        return result.reshape(shape)

    def _setitem_0d(self, key, value):
        """a[()] = v / a[:] = v of a 0-d array, with MXNet's checks (a scalar or a
        1-element NDArray or numpy value; MXNet 1.9.1's legacy operators then fail on
        the 0-d shape for a scalar or an NDArray, mxkv writes it)"""
        if not isinstance(key, (tuple, slice)) or (isinstance(key, tuple) and key):
            raise IndexError('scalar tensor can only accept `()` and `:` as index')
        if isinstance(value, numeric_types):
            self._view(write=True)[()] = self._scalar(value, 'value', fill=True)
        elif isinstance(value, NDArray) and value.size == 1:
            src = _convert(value._view(), value.dtype, self.dtype)
            self._view(write=True)[()] = src.reshape(())
        elif isinstance(value, (np.ndarray, np.generic)) and np.size(value) == 1:
            self._sync_copyfrom(np.asarray(value).reshape(()))
        else:
            raise ValueError('setting an array element with a sequence.')

    def _fills(self, key):
        """whether MXNet writes a scalar to `key` with its _full operator (the whole
        array, in order, or an advanced index) rather than _slice_assign_scalar"""
        if key is Ellipsis or self._is_full(key):
            return True
        parts = key if isinstance(key, tuple) else (key,)
        if any(isinstance(k, np.ndarray) for k in parts):
            return True
        for k, dim in zip(_expand_basic_key(key, self.ndim), self.shape):
            if isinstance(k, slice):
                start, stop, step = k.indices(dim)
                if step < 0 or len(range(start, stop, step)) != dim:
                    return False
            elif dim != 1:
                return False
        return True

    def _empty_region_key(self, key, region_shape):
        """A basic key selecting nothing, for writing: MXNet's _get_dim_size asserts that
        each slice runs in its step's direction (a[2:1] = v: AssertionError); an empty
        region then takes a scalar (nothing written) but no array (broadcasting a value
        to an empty shape: ValueError from NDArray.broadcast_to's check, MXNetError from
        the operator when the check passes)."""
        parts = [k for k in (key if isinstance(key, tuple) else (key,))
                 if k is not None and k is not Ellipsis]
        for k, dim in zip(parts, self.shape):
            if isinstance(k, slice):
                start, stop, step = k.indices(dim)
                if stop != start and (start > stop if step > 0 else stop > start):
                    raise AssertionError('slice %r of an axis of length %d runs against its '
                                         'step' % (k, dim))
        return _EmptyRegion(region_shape)

    def __getitem__(self, key):
        if self.ndim == 0:  # MXNet: only a[()] and a[:] (the array itself)
            if (isinstance(key, tuple) and not key) or key == slice(None):
                return self
            if key is Ellipsis or key is None:
                raise ValueError('NDArray does not support slicing with key {} of type {}.'
                                 .format(key, type(key)))
            raise IndexError('too many indices for a 0-d array')
        parts = key if isinstance(key, tuple) else (key,)
        given = sum(1 for k in parts if k is not None and k is not Ellipsis)
        if given > self.ndim and all(isinstance(k, (slice, type(None), type(Ellipsis)))
                                     for k in parts):
            # (MXNet's _get_nd_basic_indexing; other keys fail in numpy's indexing)
            raise IndexError('too many indices (%d) for array with %d dimensions'
                             % (given, self.ndim))
        if self._is_full(key) and (self.size or key == slice(None) or key == ()):
            # MXNet returns the array itself for a[:] and a[()]; other full keys are its
            # basic indexing: a view (self here) of a non-empty array, and for an empty
            # one a flat slice reshaped, which _index_key emulates
            return self
        key = self._index_key(key, setting=False)
        parts = key if isinstance(key, tuple) else (key,)
        if any(k is None for k in parts) and any(isinstance(k, np.ndarray) for k in parts):
            stripped = tuple(k for k in parts if k is not None)
            res = self._advanced_new_axes(key, self._view()[stripped])
        else:
            res = self._view()[key]
        # a view keeps the context, MXNet's slice / advanced indexing operators do not
        ctx = self.context if _basic_view(key, self.shape) else _op_context(self.context)
        return array(np.asarray(res).reshape(res.shape if res.shape else (1,)),
                     ctx=ctx, dtype=self.dtype)

    def __setitem__(self, key, value):
        if not self.writable:
            raise MXKVUsageError('trying to assign to a readonly NDArray')
        if self.ndim == 0:
            self._setitem_0d(key, value)
            return
        if not self._is_full(key):
            key = self._index_key(key, setting=True)
        if isinstance(key, _EmptyRegion):
            key.check(value)
            return
        full = self._is_full(key)
        if isinstance(value, NDArray) and value._is_sparse:
            # MXNet's _prepare_value_nd: array(value) fails for a sparse NDArray
            raise TypeError('%s does not support assignment with non-array-like object %r '
                            'of type %s' % (type(self), value, type(value)))
        if isinstance(value, NDArray):
            if full and value.handle is not None and value.handle.value == self._h.value:
                return
            if full and value.shape == self.shape:
                value.copyto(self)
                return
            src = _convert(value._view(), value.dtype, self.dtype)
            dst = self._view(write=True)
            dst[key] = src
            return
        if isinstance(value, numeric_types):
            scalar = self._scalar(value, 'value', fill=self._fills(key))
            self._view(write=True)[key] = scalar
            return
        try:  # MXNet's _prepare_value_nd: TypeError for whatever array() raises
            value = np.asarray(value, dtype=self._np_dtype)
        except Exception:  # pylint: disable=broad-except
            raise TypeError('%s does not support assignment with non-array-like object %r '
                            'of type %s' % (type(self).__name__, value, type(value)))
        if full:
            if value.shape != self.shape:
                value = np.broadcast_to(value, self.shape)
            self._sync_copyfrom(value)
            return
        self._view(write=True)[key] = value

    # --- arithmetic ----------------------------------------------------------------------
    def _scalar(self, value, name='scalar', fill=False):
        """`value` as this array's element type, the way MXNet's operators see it: the
        frontend sends ``str(float(value))`` to scalar operators (arithmetic, a partial
        slice assignment) and ``str(value)`` to ``_full`` (``fill``: nd.full, writing a
        whole array, the values of an advanced-index write), dmlc parses it as a double
        and the kernel casts it with C's conversion (``DType(value)``: NaN and overflow
        give INT_MIN in an int32, float16 goes through float, bfloat16 keeps the high
        half of the float); ``_full`` writes a 0 with memset (so -0.0 gives +0.0)."""
        if fill:
            dval = dmlc_double(int(value) if isinstance(value, bool) else value, name)
            if dval == 0:
                dval = np.float64(0.0)
        else:
            dval = dmlc_double(float(value), name)
        if self.dtype is bfloat16:
            return _bf16_encode(np.float64(dval))[()]
        dt = self._np_dtype
        if dt == np.float16:
            return np.float16(np.float32(dval))
        with np.errstate(all='ignore'):
            return np.array(dval, dtype=np.float64).astype(dt)[()]

    def _binary(self, other, ufunc, reverse=False, out=None):
        if isinstance(other, numeric_types):
            if self.stype == 'csr' and out is None and (
                    ufunc is np.multiply
                    or (ufunc in (np.true_divide, _c_int_divide) and not reverse)
                    or (ufunc is np.add and other == 0)
                    or (ufunc is np.subtract and not reverse and other == 0)):
                # _mul_scalar / _div_scalar of a csr array (integer division too),
                # _plus_scalar / _minus_scalar of 0 (0 + csr is _plus_scalar as well,
                # MXNet's __radd__ is __add__): a csr array of its structure
                from .sparse import _csr_scalar
                return _csr_scalar(self, other, ufunc, reverse and ufunc is not np.add)
            if self._is_sparse and out is None and ufunc in _COMPARISONS:
                # _equal_scalar, _greater_scalar, ... of a sparse array: its storage type
                # and structure where op(0, scalar) == 0 (in double), else a fallback
                from .sparse import _sparse_compare_scalar
                res = _sparse_compare_scalar(self, other, ufunc, reverse)
                if res is not None:
                    return res
            if self._is_sparse or (out is not None and out._is_sparse):
                return _storage_fallback(self, other, ufunc, reverse, out)
            rhs = self._scalar(other)
            if self.dtype is bfloat16:  # DType(scalar): the truncated bfloat16, as float
                rhs = _bf16_decode(rhs)[()]
            lhs_v = self._values()
            res = empty(self.shape, ctx=_op_context(self.context),
                        dtype=self.dtype) if out is None else out
            if reverse:
                return res._write(lambda o: ufunc(rhs, lhs_v, out=o, casting='unsafe'))
            return res._write(lambda o: ufunc(lhs_v, rhs, out=o, casting='unsafe'))
        if isinstance(other, NDArray):
            a, b = (other, self) if reverse else (self, other)
            if ufunc in (np.add, np.subtract) and a.shape == b.shape \
                    and sorted((a.stype, b.stype)) == ['csr', 'default'] \
                    and (out is None or out.stype == 'default'):
                # elemwise_add / elemwise_sub (MXNet's dense-csr kernel, not a fallback)
                from .sparse import _csr_dense_add_sub
                csr_first = a.stype == 'csr'
                return _csr_dense_add_sub(a if csr_first else b, b if csr_first else a,
                                          ufunc is np.subtract, csr_first, out=out)
            if a.stype == 'csr' and b.stype == 'csr' and a.shape == b.shape \
                    and out is None and ufunc in (np.add, np.subtract, np.multiply):
                # elemwise_add / elemwise_sub / elemwise_mul of two csr arrays: csr
                from .sparse import _csr_csr
                return _csr_csr(a, b, ufunc)
            if a.stype == 'csr' and b.stype == 'default' and a.shape == b.shape \
                    and out is None and ufunc in (np.multiply, np.true_divide):
                # elemwise_mul (csr * dense: a csr array of its structure); elemwise_div
                # has no csr kernel and MXNet fails
                from .sparse import _csr_dense_mul
                return _csr_dense_mul(a, b, ufunc is np.true_divide)
            if self._is_sparse or other._is_sparse or (out is not None and out._is_sparse):
                return _storage_fallback(self, other, ufunc, reverse, out)
            a, b = (other, self) if reverse else (self, other)
            if dtype_np_to_mx(a.dtype) != dtype_np_to_mx(b.dtype):
                # MXNet's broadcast_* operators: ElemwiseType<2, 1> (type inference, in
                # the operator call: nothing runs, nothing is written)
                raise _inference_error(
                    'Check failed: assign(&dattr, vec.at(i)): Incompatible attr in node  at '
                    '1-th input: expected %s, got %s' % (_dtype_name(a.dtype),
                                                         _dtype_name(b.dtype)))
            try:
                shape = np.broadcast_shapes(a.shape, b.shape)
            except ValueError:
                raise _inference_error('operands could not be broadcast together: %s vs %s'
                                       % (a.shape, b.shape))
            if out is None:  # on the first operand's context, as MXNet's GetContext
                res = empty(shape, ctx=_op_context(a.context), dtype=self.dtype)
            else:
                if out.shape != shape:
                    raise MXNetError('in-place operation: shape %s does not match %s'
                                     % (out.shape, shape))
                res = out
            a_v, b_v = a._values(), b._values()
            return res._write(lambda o: ufunc(a_v, b_v, out=o, casting='unsafe'))
        # MXNet's _ufunc_helper: only NDArrays and numbers (a numpy array too is refused)
        raise TypeError('type %s not supported' % str(type(other)))

    def _divide_ufunc(self, reverse=False):
        """the division of this array's dtype; `reverse`: number / array (MXNet's
        _rdiv_scalar, float arithmetic for integers too)"""
        if self.dtype is bfloat16 or self._np_dtype.kind in 'fc':
            return np.true_divide
        return _c_int_rdivide if reverse else _c_int_divide

    def _values(self):
        """the values for arithmetic: a numpy view of the buffer (float32 values of a
        bfloat16 array: MXNet's bf16_t computes in float)"""
        if self.dtype is bfloat16:
            return _bf16_decode(self._view())
        return self._arith_view()

    def _write(self, compute):
        """compute(out) writes the result into this array's buffer (a bfloat16 array:
        into float32, kept as bf16_t keeps it: the high half); returns self"""
        if self.dtype is bfloat16:
            tmp = np.zeros(self.shape, np.float32)
            with np.errstate(all='ignore'):
                compute(tmp)
            self._view(write=True)[...] = _bf16_encode(tmp)
            return self
        out_v = self._arith_view(write=True)
        with np.errstate(all='ignore'):
            compute(out_v)
        return self

    def __add__(self, other):
        return self._binary(other, np.add)

    def __radd__(self, other):
        return self._binary(other, np.add, reverse=True)

    def __iadd__(self, other):
        return self._binary(other, np.add, out=self)

    def __sub__(self, other):
        return self._binary(other, np.subtract)

    def __rsub__(self, other):
        return self._binary(other, np.subtract, reverse=True)

    def __isub__(self, other):
        return self._binary(other, np.subtract, out=self)

    def __mul__(self, other):
        return self._binary(other, np.multiply)

    def __rmul__(self, other):
        return self._binary(other, np.multiply, reverse=True)

    def __imul__(self, other):
        return self._binary(other, np.multiply, out=self)

    def __truediv__(self, other):
        return self._binary(other, self._divide_ufunc())

    def __rtruediv__(self, other):
        return self._binary(other, self._divide_ufunc(reverse=True), reverse=True)

    def __itruediv__(self, other):
        return self._binary(other, self._divide_ufunc(), out=self)

    __div__, __rdiv__, __idiv__ = __truediv__, __rtruediv__, __itruediv__

    def __pow__(self, other):
        return self._binary(other, _mx_power)

    def __rpow__(self, other):
        return self._binary(other, _mx_power, reverse=True)

    def __ipow__(self, other):
        return self._binary(other, _mx_power, out=self)

    def __mod__(self, other):
        return self._binary(other, _mx_mod)

    def __rmod__(self, other):
        return self._binary(other, _mx_mod, reverse=True)

    def __imod__(self, other):
        return self._binary(other, _mx_mod, out=self)

    def __neg__(self):
        # MXNet's -x is _mul_scalar(x, -1.0): a NaN keeps its sign (x86's mulss passes the
        # NaN operand on), an unsigned integer wraps (DType(-1.0) is the all-ones value)
        return self._binary(-1.0, np.multiply)

    def __abs__(self):
        return self._unary(_ABS)

    def _unary(self, ufunc, out=None):
        """ufunc(values, out=...) into `out` or a new array of this shape and dtype"""
        res = empty(self.shape, ctx=_op_context(self.context),
                    dtype=self.dtype) if out is None else out
        values = self._values()
        return res._write(lambda o: ufunc(values, out=o))

    # comparisons are elementwise, as in MXNet: an array of the operands' dtype holding
    # 1 where the comparison holds, else 0 (a number is first cast to the dtype; None,
    # strings, lists and numpy arrays raise TypeError)
    def __eq__(self, other):
        return self._binary(other, _EQUAL)

    def __ne__(self, other):
        return self._binary(other, _NOT_EQUAL)

    def __lt__(self, other):
        return self._binary(other, _LESS)

    def __le__(self, other):
        return self._binary(other, _LESS_EQUAL)

    def __gt__(self, other):
        return self._binary(other, _GREATER)

    def __ge__(self, other):
        return self._binary(other, _GREATER_EQUAL)

    def sum(self, axis=None, keepdims=False, exclude=False, out=None, name=None):
        """MXNet's sum over `axis` (all axes by default; with `exclude` over the others),
        the reduced axes dropped unless `keepdims`: each output element is summed in
        row-major order of the reduced axes with Kahan compensation, every step in the
        element type (an integer sum wraps), as MXNet 1.9.1's CPU kernel
        (see ndarray/_reduce.py).  `name` is ignored."""
        # pylint: disable=unused-argument
        from ._reduce import reduce_shape, sum_values
        reduced, shape = reduce_shape(self.shape, axis, keepdims, exclude)
        if out is None:
            out = empty(shape, ctx=_op_context(self.context), dtype=self.dtype)
        elif out.shape != shape or out.dtype != self.dtype:
            raise MXNetError('sum: out has shape %s and dtype %s, the result %s and %s'
                             % (out.shape, np.dtype(out.dtype).name, shape,
                                np.dtype(self.dtype).name))
        kind = 'bfloat16' if self.dtype is bfloat16 else self._np_dtype.name
        sums = sum_values(self._values(), reduced, kind).reshape(shape)
        return out._write(lambda o: np.copyto(o, sums))

    # the operator methods MXNet's NDArray has for the functions this module offers
    def abs(self, *args, **kwargs):
        """mx.nd.abs(self)"""
        return abs(self, *args, **kwargs)

    def sqrt(self, *args, **kwargs):
        """mx.nd.sqrt(self)"""
        return sqrt(self, *args, **kwargs)

    def square(self, *args, **kwargs):
        """mx.nd.square(self)"""
        return square(self, *args, **kwargs)

    def sign(self, *args, **kwargs):
        """mx.nd.sign(self)"""
        return sign(self, *args, **kwargs)

    def clip(self, *args, **kwargs):
        """mx.nd.clip(self, a_min, a_max)"""
        return clip(self, *args, **kwargs)

    def zeros_like(self, *args, **kwargs):
        """mx.nd.zeros_like(self)"""
        return zeros_like(self, *args, **kwargs)

    def ones_like(self, *args, **kwargs):
        """mx.nd.ones_like(self)"""
        return ones_like(self, *args, **kwargs)

    @property
    def T(self):  # pylint: disable=invalid-name
        """transposed copy"""
        return array(self.asnumpy().T, ctx=_op_context(self.context), dtype=self.dtype)


def _dtype_name(dtype):
    """MXNet's name of a dtype in its messages (float32, int64, bfloat16 ...)"""
    return 'bfloat16' if dtype is bfloat16 else np.dtype(dtype).name


def _inference_error(text):
    """an MXNetError of an operator's shape or type inference: MXNet raises it from the
    operator call itself (not at a later wait, as a kernel's failure), before any output
    is allocated or anything else of that call runs"""
    err = MXNetError(text)
    err.mxkv_inference_failure = True
    return err


def _c_div(num, den):
    """integer division truncating toward zero (C's /)"""
    quot = num // den
    if quot < 0 and quot * den != num:
        quot += 1
    return quot


def _infer_reshape(dshape, shape, reverse):
    """MXNet's InferReshapeShape (src/operator/tensor/matrix_op-inl.h): the shape that
    `shape` (with the special values 0, -1, -2, -3, -4) gives for an array of `dshape`.
    As there, the inferred size goes to the result dim at the -1's position in `shape`,
    which is another dim than the -1's own after a -2 or -4 (the size then does not
    match: the caller raises ValueError as MXNet's frontend does).
    Raises MXNetError where MXNet's checks fail, and where MXNet divides by zero (a -1 to
    infer next to a zero dim, or -4 splitting with a zero factor: SIGFPE in MXNet)."""
    params = []
    for dim in shape:
        if isinstance(dim, float) or isinstance(dim, np.floating):
            raise TypeError('reshape: shape values must be integers, not %r' % (dim,))
        params.append(operator.index(dim))
    src = list(dshape)
    if reverse:
        src.reverse()
        params.reverse()

    def fail(why):
        raise MXNetError('reshape %s of an array of shape %s%s: %s'
                         % (tuple(shape), tuple(dshape), ' (reverse)' if reverse else '', why))

    out, src_idx, inf_idx, i = [], 0, -1, 0
    while i < len(params):
        dim = params[i]
        if dim == 0:
            if src_idx >= len(src):
                fail('0 at position %d has no source dim to copy' % i)
            out.append(src[src_idx])
            src_idx += 1
        elif dim == -1:
            if inf_idx >= 0:
                fail('One and only one dim can be inferred')
            inf_idx = i  # MXNet keeps the position in `shape`, not in the result
            out.append(1)
            src_idx += 1
        elif dim == -2:
            out.extend(src[src_idx:])
            src_idx = max(src_idx, len(src))
        elif dim == -3:
            if src_idx + 1 >= len(src):
                fail('-3 needs two source dims to merge')
            out.append(src[src_idx] * src[src_idx + 1])
            src_idx += 2
        elif dim == -4:
            if i + 2 >= len(params) or src_idx >= len(src):
                fail('-4 needs two dims to split a source dim into')
            whole, d1, d2 = src[src_idx], params[i + 1], params[i + 2]
            src_idx += 1
            i += 2
            if d1 == -1 and d2 == -1:
                fail('Split dims cannot both be -1.')
            if (d1 == -1 and d2 == 0) or (d2 == -1 and d1 == 0):
                fail('split of dim %d by zero' % whole)
            if d1 == -1:
                d1 = _c_div(whole, d2)
            if d2 == -1:
                d2 = _c_div(whole, d1)
            if d1 * d2 != whole:
                fail('Split dims %d, %d do not divide original dim %d' % (d1, d2, whole))
            out.extend((d1, d2))
        else:
            out.append(dim)
            src_idx += 1
        i += 1
    if any(d < 0 for d in out):
        fail('Shape dim size cannot be a negative value: %s' % (tuple(out),))
    if inf_idx >= 0:
        rest = 1
        for d in out:
            rest *= d
        if rest == 0:
            fail('cannot infer the -1 dim next to a zero dim (MXNet divides by zero)')
        size = 1
        for d in dshape:
            size *= d
        if inf_idx < len(out):  # (past the end, after -2s or a -4, MXNet's write to its
            out[inf_idx] = size // rest  # vector lands outside the result: the -1 stays 1)
    if reverse:
        out.reverse()
    return tuple(out)


def _storage_fallback(lhs, rhs, ufunc, reverse, out):
    """A binary operator with a sparse operand, as MXNet's broadcast_* operators run it:
    "storage type fallback" to temporary dense copies, a dense result (written into `out`
    if given: a sparse `out` gets the dense result's non-zero rows, as a copyto)."""
    temps = []

    def dense(arr):
        if not isinstance(arr, NDArray) or not arr._is_sparse:
            return arr
        tmp = arr.tostype('default')
        temps.append(tmp)
        return tmp

    try:
        dense_out = None if out is None or out._is_sparse else out
        res = dense(lhs)._binary(dense(rhs), ufunc, reverse=reverse, out=dense_out)
        if out is not None and out._is_sparse:
            if res.shape != out.shape:
                raise MXNetError('in-place operation: shape %s does not match %s'
                                 % (out.shape, res.shape))
            if res.context != out.context:
                # (cpu for a cpu_pinned `out`) the operator casts into `out` itself: a
                # copy on one context, not one across contexts (that goes through float32)
                res, moved = res.copyto(out.context), res
                moved.close()
            res.copyto(out)
            res.close()
            return out
        return res
    finally:
        for tmp in temps:
            tmp.close()


def _mx_power(a, b, out=None, casting='unsafe'):
    """MXNet's power kernel: pow in double for float64, otherwise powf on the operands
    as float32 (math::pow), the result cast to the output type (2 ** -1 is 0 in an int32
    array, an overflow INT_MIN)"""
    a, b = np.asarray(a), np.asarray(b)
    if out.dtype == np.float64:
        res = np.power(a.astype(np.float64), b.astype(np.float64))
    else:
        res = np.power(a.astype(np.float32), b.astype(np.float32))
    np.copyto(out, res, casting=casting)
    return out


def _mx_mod(a, b, out=None, casting='unsafe'):
    """MXNet's mod kernel (mshadow_op::mod): the sign of the divisor, as Python's %,
    computed with fmod in double; x % 0 is 0"""
    a = np.asarray(a).astype(np.float64)
    b = np.asarray(b).astype(np.float64)
    if out.dtype.kind == 'u':
        res = np.where(b == 0, 0.0, np.fmod(a, np.where(b == 0, 1.0, b)))
    else:
        neg_a = a < 0
        fm = np.fmod(np.where(neg_a, -a, a), np.where(b < 0, -b, b))
        # b < 0: a < 0 -> -fmod(-a, -b); else fmod(a, -b) + (that != 0 ? b : 0)
        # b > 0: a < 0 -> -fmod(-a, b) + (fmod(-a, b) != 0 ? b : 0); else fmod(a, b)
        # (NaN compares false: the last case)
        adjust = np.where(fm != 0, b, 0.0)
        res = np.where(b < 0, np.where(neg_a, -fm, fm + adjust),
                       np.where(neg_a, -fm + adjust, fm))
        res = np.where(b == 0, 0.0, res)
    # which NaN comes out, as MXNet's x86 build gives it: fmod passes a NaN operand on
    # (a's first) and makes the negative default NaN from an infinite dividend; the
    # a < 0, b < 0 branch negates it afterwards, and so does the a < 0, b >= 0 branch
    # for float16 (computed as -fmod + b there, as b - fmod for float32 / float64)
    neg_nan = np.where(np.isnan(a), np.signbit(a),
                       np.where(np.isnan(b), np.signbit(b), True))
    flip = (a < 0) & (b < 0)
    if out.dtype == np.float16:
        flip |= (a < 0) & ~(b < 0)
    neg_nan = neg_nan ^ flip
    res = np.where(np.isnan(res), np.where(neg_nan, -np.float64('nan'), np.float64('nan')),
                   res)
    if out.dtype == np.float16:
        res = res.astype(np.float32)
    np.copyto(out, res, casting=casting)
    return out


def _comparison(np_fn):
    def compare(a, b, out=None, casting='unsafe'):
        np.copyto(out, np_fn(a, b), casting=casting)
        return out
    return compare


_EQUAL, _NOT_EQUAL = _comparison(np.equal), _comparison(np.not_equal)
_LESS, _LESS_EQUAL = _comparison(np.less), _comparison(np.less_equal)
_GREATER, _GREATER_EQUAL = _comparison(np.greater), _comparison(np.greater_equal)
_COMPARISONS = {_EQUAL: np.equal, _NOT_EQUAL: np.not_equal, _LESS: np.less,
                _LESS_EQUAL: np.less_equal, _GREATER: np.greater,
                _GREATER_EQUAL: np.greater_equal}


def _extremum(compare, nan_passes):
    """MXNet's maximum / minimum kernels (mshadow_op.h): IsNan(a) ? a : (compare(a, b) ? a
    : b), so of equal values (0.0 and -0.0) b comes out, and a NaN b too; IsNan of a
    bf16_t is false (`nan_passes` off)"""
    def extremum(a, b, out=None, casting='unsafe'):
        a, b = np.asarray(a), np.asarray(b)
        take_a = compare(a, b)
        if nan_passes:
            take_a |= np.isnan(a)
        np.copyto(out, np.where(take_a, a, b), casting=casting)
        return out
    return extremum


_MAXIMUM, _MINIMUM = _extremum(np.greater, True), _extremum(np.less, True)
_BF16_MAXIMUM, _BF16_MINIMUM = _extremum(np.greater, False), _extremum(np.less, False)


def _array_first(fn):
    """`fn` for number-first calls: MXNet's _maximum_scalar / _minimum_scalar take the
    array's element as a and the number as b whichever comes first"""
    def swapped(a, b, out=None, casting='unsafe'):
        return fn(b, a, out=out, casting=casting)
    return swapped


def _mx_sign(x, out=None):
    """MXNet's sign: -1, 1, else 0 (NaN and -0.0 give 0)"""
    np.copyto(out, (x > 0).astype(np.int8) - (x < 0).astype(np.int8), casting='unsafe')
    return out


def _math(ufunc, integers_in_double):
    """MXNet's math:: functions (src/operator/math_functions-inl.h): double for float64,
    float for float32 / float16 / bfloat16, and for integers double where
    `integers_in_double` (the math.h wrappers: sqrt, fabs) else float (sqr); the result
    cast back with C's conversion (NaN and overflow give INT_MIN in an int32)"""
    def fn(x, out=None):
        x = np.asarray(x)
        wide = np.float64 if out.dtype == np.float64 or (
            integers_in_double and x.dtype.kind in 'iub') else np.float32
        np.copyto(out, ufunc(x.astype(wide)), casting='unsafe')
        return out
    return fn


_ABS = _math(np.absolute, True)


def _clip_kernel(lo, hi):
    """MXNet's clip kernel (matrix_op-inl.h): data > a_max ? a_max : data < a_min ? a_min
    : data, the bounds floats: integer and float16 data compare as float, the bound
    written is DType(bound)"""
    def kernel(x, out=None):
        x = np.asarray(x)
        wide = x.astype(np.float64 if x.dtype == np.float64 else np.float32)
        with np.errstate(all='ignore'):
            lo_t, hi_t = np.array([lo, hi], np.float32).astype(out.dtype)
        np.copyto(out, np.where(wide > hi, hi_t, np.where(wide < lo, lo_t, x)),
                  casting='unsafe')
        return out
    return kernel


def _c_int_divide(a, b, out=None, casting='unsafe'):
    """Integer division truncating toward zero (C's a / b, exact for 64-bit values).
    MXNetError where MXNet 1.9.1 dies of SIGFPE: a division by zero (a number divisor is
    DType(number) first: 0.5, NaN or 1e10 make 0 in an 8-bit type), and INT_MIN / -1 in
    int32 and int64 (8- and 16-bit values are divided as int: no overflow)."""
    a, b = np.asarray(a), np.asarray(b)
    if (b == 0).any():
        raise MXNetError('integer division by zero (MXNet 1.9.1 dies of SIGFPE there)')
    if a.dtype in (np.int32, np.int64) and \
            ((a == np.iinfo(a.dtype).min) & (b == -1)).any():
        raise MXNetError('integer division overflow: %d / -1 in %s (MXNet 1.9.1 dies of '
                         'SIGFPE there)' % (np.iinfo(a.dtype).min, a.dtype.name))
    with np.errstate(all='ignore'):
        den = np.where(b == 0, 1, b).astype(b.dtype)
        quot = np.floor_divide(a, den)
        # floor to truncation: one up where the division was inexact and the signs differ
        quot += ((quot * den != a) & ((a < 0) != (den < 0))).astype(quot.dtype)
        np.copyto(out, np.where(b == 0, 0, quot), casting=casting)
    return out


def _c_int_rdivide(a, b, out=None, casting='unsafe'):
    """number / integer array as MXNet's _rdiv_scalar computes it (mshadow_op::rdiv,
    math::id(b) / math::id(a)): in float32 (a 64-bit integer too), converted back with
    C's cast (a division by zero gives INT_MIN in int32 / int64, 0 in 8-bit types)"""
    with np.errstate(all='ignore'):
        np.copyto(out, np.true_divide(np.asarray(a).astype(np.float32),
                                      np.asarray(b).astype(np.float32)), casting=casting)
    return out


def _ndarray_cls(handle, writable=True, stype=None):
    """Wrap a handle the caller owns in the matching NDArray class."""
    if stype is None:
        code = ctypes.c_int()
        check_call(_LIB.MXNDArrayGetStorageType(handle, ctypes.byref(code)))
        stype = code.value
    if isinstance(stype, str):
        stype = _STORAGE_TYPE_STR_TO_ID[stype]
    if stype == _STORAGE_TYPE_ROW_SPARSE:
        from .sparse import RowSparseNDArray
        return RowSparseNDArray(handle, writable=writable)
    if stype == _STORAGE_TYPE_CSR:
        from .sparse import CSRNDArray
        return CSRNDArray(handle, writable=writable)
    return NDArray(handle, writable=writable)


# --- creation --------------------------------------------------------------------------
def empty(shape, ctx=None, dtype=None, stype=None):
    """An uninitialised array (float32 by default) on `ctx` (default: current context)."""
    if stype not in (None, 'default'):
        from . import sparse
        return sparse.zeros(stype, shape, ctx=ctx, dtype=dtype)
    ctx = current_context() if ctx is None else ctx
    dtype = mx_real_t if dtype is None else dtype
    shape = _shape_tuple(shape)
    if any(dim < 0 for dim in shape):  # MXNet's frontend: ctypes refuses it as mx_uint
        raise OverflowError('negative dimension in shape %s' % (shape,))
    return NDArray(_new_alloc_handle(shape, ctx, False, dtype))


class ShapeParameterError(MXNetError, TypeError):
    """A shape MXNet's _zeros / _ones operators refuse: MXNetError there; a TypeError too
    (a float or bool dim is a type error for every other mxkv entry point)."""


def _operator_shape(shape, operator_name):
    """`shape` as MXNet's _zeros / _ones operators take it: a bad dim (a float, a bool, a
    negative number, a string) is an MXNetError there ("Invalid Parameter format")"""
    try:
        shape = _shape_tuple(shape)
    except (TypeError, ValueError) as exc:
        raise ShapeParameterError("Invalid Parameter format for shape expect Shape(tuple) but "
                                  "value='%s', in operator %s (%s)" % (shape, operator_name, exc))
    if any(dim < 0 for dim in shape):
        raise MXNetError('Invalid shape %s in operator %s: negative dimension'
                         % (shape, operator_name))
    return shape


def full(shape, val, ctx=None, dtype=mx_real_t, out=None):
    """An array filled with `val`."""
    out = empty(shape, ctx, dtype) if out is None else out
    out[:] = val
    return out


def zeros(shape, ctx=None, dtype=None, stype=None, **kwargs):  # pylint: disable=unused-argument
    """An array of zeros."""
    if stype in (None, 'default'):
        shape = _operator_shape(shape, '_zeros')
    arr = empty(shape, ctx, dtype, stype)
    # libmxkv's MXNDArrayCreate gives zeros already; not taking a view of the
    # buffer (MXNDArrayGetData) also leaves it free to be sent and received
    # without copies (see NDArray::share in the library).
    if arr.stype == 'default' and not _SYNCHRONOUS:
        arr._view(write=True)[...] = 0
    return arr


def ones(shape, ctx=None, dtype=None, **kwargs):  # pylint: disable=unused-argument
    """An array of ones."""
    arr = empty(_operator_shape(shape, '_ones'), ctx, dtype)
    arr._view(write=True)[...] = arr._scalar(1)
    return arr


def array(source_array, ctx=None, dtype=None):
    """An array from an NDArray, numpy array or nested lists.
    The dtype defaults to the source's for an NDArray and to float32 otherwise (as in MXNet)."""
    if isinstance(source_array, NDArray) and source_array.stype != 'default':
        from . import sparse
        return sparse.array(source_array, ctx=ctx, dtype=dtype)
    if isinstance(source_array, NDArray):
        dtype = source_array.dtype if dtype is None else dtype
        res = empty(source_array.shape, ctx, dtype)  # (None: the current context)
        source_array.copyto(res)
        return res
    dtype = mx_real_t if dtype is None else dtype
    if not isinstance(source_array, np.ndarray):
        try:
            source_array = np.array(source_array, dtype=dtype)
        except Exception:
            raise TypeError('source_array must be array like object')
    # a 0-d source gives a 0-d array (MXNet fills a (1,) array and reshapes it to ())
    res = empty(source_array.shape, ctx, dtype)
    res._sync_copyfrom(np.asarray(source_array, dtype=res._np_dtype))
    return res


def _fill_like(op_name, one):
    """mx.nd.zeros_like / ones_like: MXNet's operators of that name (legacy shape
    semantics: an input of a zero dim, or 0-d, fails shape inference), the result of the
    input's shape and dtype on its operator context (cpu(k) for cpu_pinned(k));
    zeros_like keeps the storage type (a row_sparse array without rows, a csr array
    without entries), ones_like of a sparse array gives a dense one (the storage
    fallback).  ``out`` must have the input's shape and dtype; it is written as a copy
    of the result into its own storage type (ones into a row_sparse `out`: every row)."""
    def fn(data=None, out=None, name=None, **kwargs):  # pylint: disable=unused-argument
        if not isinstance(data, NDArray):
            raise AssertionError('Argument data must have NDArray type, but got %s' % (data,))
        shape = data.shape
        if not shape or 0 in shape:
            raise MXNetError('Operator %s inferring shapes failed. input shapes: %s (an '
                             'unknown shape in MXNet 1.9.1\'s legacy shape semantics)'
                             % (op_name, list(shape)))
        if out is not None:
            if out.shape != shape:
                raise MXNetError('Check failed: assign(&dattr, vec.at(i)): Incompatible attr '
                                 'in node  at 0-th output: expected %s, got %s'
                                 % (list(shape), list(out.shape)))
            if dtype_np_to_mx(out.dtype) != dtype_np_to_mx(data.dtype):
                raise MXNetError('Check failed: assign(&dattr, vec.at(i)): Incompatible attr '
                                 'in node  at 0-th output: expected %s, got %s'
                                 % (np.dtype(data._np_dtype).name, np.dtype(out._np_dtype).name))
        ctx = _op_context(data.context)
        stype = data.stype if out is None else out.stype
        if one:
            res = ones(shape, ctx=ctx, dtype=data.dtype)
        elif stype == 'default':
            res = zeros(shape, ctx=ctx, dtype=data.dtype)
        else:
            from . import sparse
            res = sparse.zeros(stype, shape, ctx=ctx, dtype=data.dtype)
        return _result_into(res, out)
    fn.__name__ = op_name
    fn.__doc__ = ('Return an array of %ss with the same shape, type and (for zeros_like) '
                  'storage type as the input array (MXNet\'s %s operator).'
                  % ('one' if one else 'zero', op_name))
    return fn


zeros_like = _fill_like('zeros_like', False)
ones_like = _fill_like('ones_like', True)


def waitall():
    """Wait until all pending work of the library is done."""
    if _SYNCHRONOUS:
        return  # libmxkv's MXNDArrayWaitAll is `return 0`
    check_call(_LIB.MXNDArrayWaitAll())


def concatenate(arrays, axis=0, always_copy=True):
    """Join arrays along `axis` (a copy), with MXNet's checks (a non-empty list of
    NDArrays of one dtype whose other dims agree: AssertionError otherwise)."""
    assert isinstance(arrays, list)
    assert len(arrays) > 0
    assert isinstance(arrays[0], NDArray)
    if not always_copy and len(arrays) == 1:
        return arrays[0]
    first = arrays[0].shape
    for arr in arrays[1:]:
        assert first[0:axis] == arr.shape[0:axis]
        assert first[axis + 1:] == arr.shape[axis + 1:]
        assert arrays[0].dtype == arr.dtype
    data = np.concatenate([a.asnumpy() for a in arrays], axis=axis)
    return array(data, ctx=arrays[0].context, dtype=arrays[0].dtype)


def arange(start, stop=None, step=1.0, repeat=1, infer_range=None, ctx=None,
           dtype=mx_real_t):
    """Evenly spaced values in [start, stop), each `repeat` times (MXNet's ``_arange``:
    the length is ceil((stop - start) / step) * repeat in double precision, element i is
    DType(start) + DType(i // repeat) * DType(step))."""
    if stop is None:
        start, stop = 0, start
    if infer_range:
        raise MXNetError('arange: infer_range needs a symbol; give stop')
    lo, hi, inc = (dmlc_double(start, 'start'), dmlc_double(stop, 'stop'),
                   dmlc_double(step, 'step'))
    repeat = int(repeat)
    if inc == 0:
        raise MXNetError('Range does not support step=0, received %s' % step)
    if repeat <= 0:
        raise MXNetError('Range only supports repeat > 0, received %d' % repeat)
    if not (lo < hi if inc > 0 else lo > hi):
        raise MXNetError('Invalid range (start, stop, step) = (%s,%s,%s)' % (start, stop, step))
    size = int(math.ceil((hi - lo) / inc)) * repeat
    dt = np.dtype(dtype_mx_to_np(dtype_np_to_mx(dtype)))
    if dt == np.bool_:  # (the _arange operator's dtype parameter has no bool)
        raise MXNetError("Invalid Input: 'bool', valid values are: {'bfloat16', 'float16', "
                         "'float32', 'float64', 'int32', 'int64', 'int8', 'uint8'}")
    if dt == np.float16:
        # MXNet 1.9.1's float16 kernel takes start and step as C ints (truncated toward
        # zero; out of range: x86's INT_MIN) and rounds each int64 element to half:
        # arange(0, 3, 0.5) is six zeros, arange(1.7, 4, 1.5) is [1, 2]
        def c_int(value):
            return int(value) if -2.0 ** 31 < value < 2.0 ** 31 else -2 ** 31
        index = np.arange(size, dtype=np.int64) // repeat
        with np.errstate(all='ignore'):
            values = (c_int(lo) + index * c_int(inc)).astype(np.float32).astype(dt)
        return array(values, ctx=ctx, dtype=dt)
    if dt.kind in 'fc':
        first, incr = dt.type(lo), dt.type(inc)
    else:  # MXNet casts through a signed 64-bit index for unsigned types
        first, incr = (np.int64(lo).astype(dt), np.int64(inc).astype(dt))
    with np.errstate(all='ignore'):
        values = first + (np.arange(size, dtype=np.int64) // repeat).astype(dt) * incr
    return array(values.astype(dt, copy=False), ctx=ctx, dtype=dt)


def moveaxis(tensor, source, destination):
    """np.moveaxis as a copy"""
    return array(np.moveaxis(tensor.asnumpy(), source, destination),
                 ctx=_op_context(tensor.context),
                 dtype=tensor.dtype)


# --- elementwise functions used by optimizers (MXNet operator semantics) ---------------
def _unary_fn(ufunc):
    def fn(data, out=None, **kwargs):  # pylint: disable=unused-argument
        if out is None and data.stype == 'row_sparse':  # 0 stays 0: on the stored rows
            return data._unary_rsp(ufunc)
        if out is None and data.stype == 'csr':   # 0 stays 0: on the stored values
            from .sparse import _csr_unary
            return _csr_unary(data, ufunc)
        return data._unary(ufunc, out)
    return fn


sqrt = _unary_fn(_math(np.sqrt, True))
square = _unary_fn(_math(np.square, False))
abs = _unary_fn(_ABS)  # pylint: disable=redefined-builtin
sign = _unary_fn(_mx_sign)


def clip(data, a_min, a_max, out=None):
    """clip(x, a_min, a_max); the bounds are float32 operator parameters (as in MXNet);
    a row_sparse array stays row_sparse where a_min <= 0 <= a_max."""
    lo, hi = dmlc_float(a_min, 'a_min'), dmlc_float(a_max, 'a_max')
    kernel = _clip_kernel(lo, hi)
    if out is None and data.stype == 'row_sparse' and lo <= 0 <= hi:
        return data._unary_rsp(kernel)
    if out is None and data.stype == 'csr':
        if lo <= 0 <= hi:  # MXNet's ClipEx: a csr array of its structure
            from .sparse import _csr_unary
            return _csr_unary(data, kernel, copy_empty=True)
        # (MXNet's storage type inference fails: no dense fallback for a csr input)
        raise MXNetError('Operator not implemented: clip of a csr array with a_min %r, '
                         'a_max %r (MXNet keeps csr only for a_min <= 0 <= a_max)'
                         % (float(lo), float(hi)))
    return data._unary(kernel, out)


def cast(data, dtype, out=None):
    """Element type conversion: MXNet's Cast operator, a dense result (a sparse `data`
    through its storage fallback) on cpu(k) for cpu_pinned(k) (``astype`` keeps both)."""
    if out is None:
        src = data.tostype('default') if data._is_sparse else data
        try:
            out = empty(data.shape, ctx=_op_context(data.context), dtype=dtype)
            src.copyto(out)
        finally:
            if src is not data:
                src.close()
        return out
    data.copyto(out)
    return out


def _extremum_of(arr, reverse, kernel, bf16_kernel):
    fn = bf16_kernel if arr.dtype is bfloat16 else kernel
    return _array_first(fn) if reverse else fn


def _binary_fn(ufunc, scalar_fn, name, doc, by_dtype=False):
    """mx.nd.<name>(lhs, rhs) as MXNet's _ufunc_helper runs it: an NDArray operand gives
    the elementwise result (`ufunc`, or with `by_dtype` ufunc(array, reverse) choosing one
    by the array's dtype and whether the number comes first), two numbers `scalar_fn`;
    no ``out`` argument (MXNet's functions have none)."""
    def pick(arr, reverse):
        return ufunc(arr, reverse) if by_dtype else ufunc

    def fn(lhs, rhs):
        if isinstance(lhs, NDArray):
            return lhs._binary(rhs, pick(lhs, False))
        if isinstance(rhs, NDArray):
            return rhs._binary(lhs, pick(rhs, True), reverse=True)
        if isinstance(lhs, numeric_types) and isinstance(rhs, numeric_types):
            return scalar_fn(lhs, rhs)
        raise TypeError('type %s not supported' % str(type(rhs)))
    fn.__name__ = name
    fn.__doc__ = doc
    return fn


add = _binary_fn(np.add, operator.add, 'add', 'lhs + rhs, elementwise with broadcasting')
subtract = _binary_fn(np.subtract, operator.sub, 'subtract', 'lhs - rhs')
multiply = _binary_fn(np.multiply, operator.mul, 'multiply', 'lhs * rhs')
divide = _binary_fn(lambda arr, reverse: arr._divide_ufunc(reverse), operator.truediv,
                    'divide', 'lhs / rhs', by_dtype=True)
true_divide = divide
modulo = _binary_fn(_mx_mod, operator.mod, 'modulo', 'lhs % rhs (MXNet\'s mod)')
power = _binary_fn(_mx_power, operator.pow, 'power', 'base ** exp (MXNet\'s power)')
maximum = _binary_fn(lambda arr, reverse: _extremum_of(arr, reverse, _MAXIMUM, _BF16_MAXIMUM),
                     lambda x, y: x if x > y else y, 'maximum', 'elementwise maximum',
                     by_dtype=True)
minimum = _binary_fn(lambda arr, reverse: _extremum_of(arr, reverse, _MINIMUM, _BF16_MINIMUM),
                     lambda x, y: x if x < y else y, 'minimum', 'elementwise minimum',
                     by_dtype=True)
