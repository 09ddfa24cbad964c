"""Optimizers for ``KVStore.set_optimizer`` (the ``mxnet.optimizer`` API).

The update rules are evaluated in numpy on the arrays' own buffers, with the
element type of the weight and *the same operation order as MXNet 1.9.1's C++
kernels* (``src/operator/optimizer_op-inl.h``), and with every hyper-parameter
turned into the constant MXNet's kernel sees (see :mod:`mxkv._numerics`).  For
float32 and float64 weights the results are bit-identical to MXNet's.

row_sparse gradients and weights take MXNet's paths too: its row_sparse kernels (lazy
or standard updates of sgd_update, sgd_mom_update, adam_update; _sparse_adagrad_update)
and, for the other operators, its storage fallback (see ``_StandIns``); csr weights its
storage fallback.  ``multi_precision=True`` keeps float32 master copies of float16
weights and runs MXNet's mp_* kernels (SGD, NAG, LARS, LAMB) or its generic path.
"""
import functools
import io
import logging
import math
import operator
import os
import pickle
import struct
import tempfile
import warnings

import numpy as np

from ..base import py_str, MXKVUsageError, MXNetError
from ..ndarray import NDArray, zeros, clip, sqrt, square, maximum, multiply
from ..ndarray import abs as nd_abs
from ..random import normal
from .._numerics import dmlc_float, dmlc_double, strtof, c_pow, numpy1_sum, np1_scalar_op

# numpy 1.x's promotion of a numpy scalar with a Python number (MXNet's Python runs on it)
_mul = functools.partial(np1_scalar_op, operator.mul)
_sub = functools.partial(np1_scalar_op, operator.sub)
_div = functools.partial(np1_scalar_op, operator.truediv)
_pow = functools.partial(np1_scalar_op, operator.pow)

__all__ = ['Optimizer', 'SGD', 'NAG', 'Adam', 'AdaGrad', 'RMSProp', 'AdaDelta', 'Signum',
           'Ftrl', 'Adamax', 'Nadam', 'FTML', 'DCASGD', 'SGLD', 'LAMB', 'LARS', 'LBSGD',
           'ccSGD', 'Test', 'Updater', 'create', 'get_updater', 'register']


# --- kernel helpers -------------------------------------------------------------
class _K(object):
    """Constants of one kernel launch, as the kernel's DType (static_cast<DType>(float))."""
    def __init__(self, dtype, **params):
        self.dt = np.dtype(dtype)
        for name, value in params.items():
            setattr(self, name, self.c(value))

    def c(self, value):
        """a float parameter of the op, as DType"""
        return self.dt.type(dmlc_float(value))

    def lit(self, value):
        """a literal in the kernel (1.f, 0) as DType"""
        return self.dt.type(value)


def _clip_map(x, bound):
    """mshadow_op::clip::Map(x, bound)"""
    return np.where(x > bound, bound, np.where(x < -bound, -bound, x))


def _sign(x, dt):
    """(x > 0) - (x < 0) as DType"""
    return (x > 0).astype(dt) - (x < 0).astype(dt)


def _views(weight, grad, *states):
    w = weight._arith_view(write=True)
    g = grad._arith_view()
    return (w, g) + tuple(s._arith_view(write=True) for s in states)


def _check_dense(*arrays, **kwargs):
    """dense arrays, all of the first one's dtype (MXNet's type inference, ElemwiseType,
    rejects mixes: its text names the operator input, `positions` when `arrays` are not
    the operator's first inputs in order)"""
    for arr in arrays:
        if arr.stype != 'default':
            raise MXKVUsageError('mxkv optimizers support dense arrays only (got %s)' % arr.stype)
    positions = kwargs.get('positions') or range(len(arrays))
    dtypes = [np.dtype(arr.dtype) for arr in arrays]
    for pos, dt in list(zip(positions, dtypes))[1:]:
        if dt != dtypes[0]:
            raise _type_error(pos, dtypes[0], dt)


def _type_error(pos, expected, got):
    """MXNet's ElemwiseType failure for operator input `pos`"""
    return MXNetError('Check failed: assign(&dattr, vec.at(i)): Incompatible attr in node  at '
                      '%d-th input: expected %s, got %s' % (pos, np.dtype(expected).name,
                                                            np.dtype(got).name))


def _kernel_error(text):
    """an MXNetError of a kernel that MXNet's engine fails after the operator's Python call
    returned: an Updater goes on with its other weights, as MXNet's Python does, and
    raises it at the end"""
    err = MXNetError(text)
    err.mxkv_engine_failure = True
    return err


def _check_real(weight):
    """MSHADOW_REAL_TYPE_SWITCH of MXNet's optimizer kernels (sgd_update, adam_update,
    multi_sgd_*, lamb_update_phase1, ...): an integer weight fails before the kernel
    writes anything, with mshadow's text (uint8/int8 without the comma)"""
    name = np.dtype(weight.dtype).name
    if name in ('uint8', 'int8'):
        raise _kernel_error('This operation only support floating point types not %s' % name)
    if name in ('int32', 'int64', 'bool'):
        raise _kernel_error('This operation only support floating point types, not %s' % name)


def _errstate():
    return np.errstate(all='ignore')


# --- what MXNet's Python checks before its operators run ---------------------------------
# A state of another layout (e.g. loaded by Updater.set_states from an optimizer with the
# other multi_precision setting: a (float32 master copy, state) tuple where an array is
# expected, or the other way round) fails in MXNet in its Python: an update method's
# `assert(isinstance(weight, NDArray))`, the unpacking of the state, or the assertions of
# its generated operator functions (python/mxnet/ndarray/register.py) on every NDArray
# argument, made before the operator runs.  mxkv makes the same checks at the same points.
def _assert_ndarrays(*arrays):
    """the `assert(isinstance(weight, NDArray))` (and grad) opening MXNet's update methods"""
    for arr in arrays:
        if not isinstance(arr, NDArray):
            raise MXKVUsageError('an optimizer updates NDArrays (got %s)' % type(arr).__name__)


def _op_args(*named):
    """the check of an operator with named NDArray arguments (sgd_mom_update(weight, grad,
    mom), adam_update(..., mean, var) ...): `named` = (name, value) pairs in the operator's
    order; None is an argument left out"""
    for name, value in named:
        if value is not None and not isinstance(value, NDArray):
            raise MXKVUsageError('Argument %s must have NDArray type, but got %s'
                                 % (name, str(value)))


def _flatten_list(nested):
    return [item for sublist in nested for item in sublist]


def _op_positional(values):
    """the check of an operator taking a list of arrays (multi_sgd_mom_update(*arrays),
    _multi_lamb_update ...)"""
    for value in values:
        if not isinstance(value, NDArray):
            raise MXKVUsageError('Positional arguments must have NDArray type, but got %s'
                                 % str(value))


# C++ names of dtypes in MXNet's TBlob type check messages
_CTYPE_NAMES = {'float32': 'float', 'float64': 'double', 'float16': 'half',
                'uint8': 'unsigned char', 'int8': 'signed char', 'int32': 'int',
                'int64': 'long long', 'bool': 'bool'}


def _check_store_sparse_write(weight, value):
    """``weight[:] += value`` (or -=) of the optimizers computed with NDArray operations
    (SGLD, Adamax, Nadam, DCASGD, Test), for a row_sparse or csr weight a store keeps on
    cpu_pinned, as MXNet 1.9.1 runs it: (weight + value).copyto(weight), where the sum is
    on cpu(0) (MXNet's operations put their results there whatever the inputs' context),
    so a dense sum is copied across contexts into sparse storage, which fails its data
    type check for every dtype but float32 (the weight keeps its value; MXNet reports it
    at the next wait, mxkv here).  A sparse `value` gives a sparse sum, which copies."""
    if weight.stype == 'default' or value.stype != 'default' or \
            weight.context.device_type != 'cpu_pinned':
        return
    name = np.dtype(value.dtype).name
    if name != 'float32':
        raise MXNetError('Check failed: mshadow::DataType<DType>::kFlag == type_flag_: '
                         'TBlob.get_with_shape: data type do not match specified type.'
                         'Expected: float v.s. given %s (MXNet 1.9.1 copies the dense %s '
                         'result into the %s weight on cpu_pinned across contexts, which '
                         'only float32 passes)' % (_CTYPE_NAMES.get(name, name), name,
                                                   weight.stype))


def _multi_sgd_args(weights, grads, states, multi_precision, use_momentum):
    """the arrays MXNet's SGD and LARS give their multi_(mp_)sgd(_mom)_update and
    preloaded_* operators, built as MXNet builds them (its TypeError / IndexError for
    states of another layout) and checked as its operator functions check them"""
    if not multi_precision:
        if not use_momentum:
            return
        args = _flatten_list(zip(weights, grads, states))
    elif use_momentum:
        args = _flatten_list(zip(weights, grads, *zip(*states)))
    else:
        args = _flatten_list(zip(weights, grads, list(zip(*states))[1]))
    _op_positional(args)


def _check_fused_attrs(groups, uniform_groups=()):
    """The shape and type inference of one of MXNet's fused multi-tensor operators
    (multi_sgd_*, preloaded_multi_sgd_*, multi_lamb_update and their mp_ forms), which
    fails before the operator writes any of its arrays; mxkv updates one weight at a
    time, so it checks them all first.  `groups`: per weight, its operator inputs in
    order, each (array, dtype it must have: None for the weight's); every input of a
    weight has the weight's shape.  `uniform_groups`: lists of arrays of one
    multi_sum_sq (LARS's norms), which requires one dtype."""
    if groups is None:   # (states of another layout: the operator's own checks fail)
        return
    for arrays in uniform_groups:
        for i, arr in enumerate(arrays):
            if np.dtype(arr.dtype) != np.dtype(arrays[0].dtype):
                raise MXNetError("Check failed: (*in_type)[i] == dtype : This layer requires "
                                 "uniform type. Expected '%s' v.s. given '%s' at 'array_%d'"
                                 % (np.dtype(arrays[0].dtype).name,
                                    np.dtype(arr.dtype).name, i))
    flat = [(k, arr, dtype) for k, arrays in enumerate(groups) for arr, dtype in arrays]
    for pos, (k, arr, _) in enumerate(flat):      # shapes first, as MXNet infers them
        weight = groups[k][0][0]
        if tuple(arr.shape) != tuple(weight.shape):
            raise MXNetError('Check failed: assign(&dattr, vec.at(i)): Incompatible attr in '
                             'node  at %d-th input: expected [%s], got [%s] (fused update '
                             'of %d weights: nothing written)'
                             % (pos, ','.join(map(str, weight.shape)),
                                ','.join(map(str, arr.shape)), len(groups)))
    for pos, (k, arr, dtype) in enumerate(flat):
        want = np.dtype(groups[k][0][0].dtype if dtype is None else dtype)
        if np.dtype(arr.dtype) != want:
            raise MXNetError('Check failed: assign(&dattr, vec.at(i)): Incompatible attr in '
                             'node  at %d-th input: expected %s, got %s (fused update of %d '
                             'weights: nothing written)'
                             % (pos, want.name, np.dtype(arr.dtype).name, len(groups)))


def _sgd_fused_groups(weights, grads, states, multi_precision, use_momentum):
    """the inputs of each weight of multi_(mp_)sgd(_mom)_update, for _check_fused_attrs
    (None for states of another layout, which the operator refuses by their number)"""
    groups = []
    for weight, grad, state in zip(weights, grads, states):
        arrays = [(weight, None), (grad, None)]
        if multi_precision:
            if not (isinstance(state, (tuple, list)) and len(state) == 2 and
                    all(isinstance(x, NDArray) for x in state[int(not use_momentum):])):
                return None
            if use_momentum:
                arrays.append((state[0], np.float32))
            arrays.append((state[1], np.float32))
        elif use_momentum:
            if not isinstance(state, NDArray):
                return None
            arrays.append((state, None))
        groups.append(arrays)
    return groups


# --- row_sparse gradients for dense weights -----------------------------------------
# MXNet's update operators take a row_sparse gradient three ways: sgd_update,
# sgd_mom_update and adam_update have row_sparse kernels, "lazy" (only the gradient's
# rows of the weight and states change) or "standard" (every row, missing gradient
# rows read as zero); _sparse_adagrad_update (AdaGrad) is lazy and has no weight decay;
# every other operator (nag_mom_update, signum_update, rmsprop_update ...) runs its
# dense kernel on a densified gradient (MXNet's "storage fallback").
def _rsp_rows(weight, grad, *states):
    """(row indices, rows) of a row_sparse `grad` for a dense `weight`, None if `grad` is
    dense"""
    if grad.stype == 'default':
        return None
    if grad.stype != 'row_sparse' or weight.stype != 'default':
        raise MXKVUsageError('mxkv optimizers update dense weights from dense or row_sparse '
                             'gradients (got a %s weight and a %s gradient)'
                             % (weight.stype, grad.stype))
    _check_dense(weight, *states, positions=[0] + list(range(2, 2 + len(states))))
    if np.dtype(grad.dtype) != np.dtype(weight.dtype):
        raise MXNetError('Incompatible attr: the gradient has dtype %s, expected %s (the '
                         'weight\'s dtype)' % (np.dtype(grad.dtype).name,
                                               np.dtype(weight.dtype).name))
    if grad.shape != weight.shape:
        raise MXNetError('Incompatible attr: the gradient has shape %s, the weight %s'
                         % (grad.shape, weight.shape))
    data, idx = grad._parts()
    if idx.size and (idx.min() < 0 or idx.max() >= weight.shape[0]):
        raise MXNetError('row_sparse gradient of shape %s has row indices outside [0, %d)'
                         % (grad.shape, weight.shape[0]))
    return idx, data


def _fallback_grad(weight, grad):
    """the gradient a dense-only kernel sees: a row_sparse one densified (MXNet's storage
    fallback)"""
    if grad.stype == 'row_sparse' and weight.stype == 'default':
        return grad.tostype('default')
    return grad


def _sgd_update_rsp(weight, grad, rows, lr, wd, rescale_grad, clip_gradient, lazy):
    """sgd_update with a row_sparse gradient (SGDUpdateDnsRspImpl)"""
    idx, g = rows
    k = _K(weight.dtype, lr=lr, wd=wd, rescale=rescale_grad, clip=clip_gradient)
    w = weight._arith_view(write=True)
    one = k.lit(1.0)
    wd_k = k.wd
    with _errstate():
        if not lazy:
            # standard update: every row *= DType(1 - lr * wd), computed in float as the
            # operator's float parameters, then the rows of the gradient with wd = 0
            f32 = np.float32
            w[...] = w * k.dt.type(f32(1) - f32(dmlc_float(lr)) * f32(dmlc_float(wd)))
            wd_k = k.lit(0)
        if not idx.size:
            return
        rows_w = w[idx]
        if k.clip >= 0:
            w[idx] = (one - k.lr * wd_k) * rows_w - k.lr * _clip_map(k.rescale * g, k.clip)
        else:
            w[idx] = (one - k.lr * wd_k) * rows_w - (k.lr * k.rescale) * g


def _sgd_mom_update_rsp(weight, grad, mom, rows, lr, wd, momentum, rescale_grad,
                        clip_gradient, lazy):
    """sgd_mom_update with a row_sparse gradient: lazy (SGDMomDnsRspDnsKernel) or standard
    (SGDMomStdDnsRspDnsKernel: the dense formula with zero for missing rows)"""
    if not lazy:
        _sgd_mom_update(weight, grad.tostype('default'), mom, lr, wd, momentum, rescale_grad,
                        clip_gradient)
        return
    idx, g = rows
    if not idx.size:
        return
    k = _K(weight.dtype, lr=lr, wd=wd, m=momentum, rescale=rescale_grad, clip=clip_gradient)
    w = weight._arith_view(write=True)
    s = mom._arith_view(write=True)
    rows_w, rows_s = w[idx], s[idx]
    with _errstate():
        rate = k.lr * k.wd
        if k.clip >= 0:
            rows_s = k.m * rows_s - rate * rows_w - k.lr * _clip_map(k.rescale * g, k.clip)
        else:
            rows_s = k.m * rows_s - rate * rows_w - k.lr * k.rescale * g
        s[idx] = rows_s
        w[idx] = rows_w + rows_s


def _adam_update_rsp(weight, grad, mean, var, rows, lr, wd, beta1, beta2, epsilon,
                     rescale_grad, clip_gradient, lazy):
    """adam_update with a row_sparse gradient: lazy (AdamDnsRspDnsKernel) or standard
    (AdamStdDnsRspDnsKernel), each with its own operation order"""
    idx, g = rows
    k = _K(weight.dtype, lr=lr, wd=wd, b1=beta1, b2=beta2, eps=epsilon, rescale=rescale_grad,
           clip=clip_gradient)
    w, m, v = (a._arith_view(write=True) for a in (weight, mean, var))
    one = k.lit(1.0)
    with _errstate():
        if lazy:
            if not idx.size:
                return
            rows_w, rows_m, rows_v = w[idx], m[idx], v[idx]
            gr = g * k.rescale + rows_w * k.wd
            if k.clip >= 0:
                gr = _clip_map(gr, k.clip)
                rows_m = k.b1 * rows_m + (one - k.b1) * gr
                rows_v = k.b2 * rows_v + (one - k.b2) * (gr * gr)
            else:
                rows_m = k.b1 * rows_m + (one - k.b1) * gr
                rows_v = k.b2 * rows_v + (one - k.b2) * gr * gr
            m[idx], v[idx] = rows_m, rows_v
            w[idx] = rows_w - k.lr * rows_m / (np.sqrt(rows_v) + k.eps)
            return
        gr = w * k.wd
        if idx.size:
            gr[idx] = g * k.rescale + w[idx] * k.wd
        if k.clip >= 0:
            gr = _clip_map(gr, k.clip)
        m[...] = k.b1 * m + (one - k.b1) * gr
        v[...] = k.b2 * v + (one - k.b2) * (gr * gr)
        w[...] = w - k.lr * m / (np.sqrt(v) + k.eps)


def _sparse_adagrad_update(weight, grad, history, rows, lr, wd, epsilon, rescale_grad,
                           clip_gradient):
    """_sparse_adagrad_update (AdagradDnsRspDnsKernel): the gradient's rows only, no
    weight decay (MXNet has no kernel for wd != 0)"""
    if dmlc_float(wd) != 0:
        raise MXNetError('AdaGrad with a row_sparse gradient needs wd = 0: MXNet 1.9.1\'s '
                         '_sparse_adagrad_update has no weight decay (got wd=%s)' % (wd,))
    idx, g = rows
    if not idx.size:
        return
    k = _K(weight.dtype, lr=lr, eps=epsilon, rescale=rescale_grad, clip=clip_gradient)
    w = weight._arith_view(write=True)
    h = history._arith_view(write=True)
    with _errstate():
        gr = g * k.rescale
        if k.clip >= 0:
            gr = _clip_map(gr, k.clip)
        rows_h = h[idx] + gr * gr
        h[idx] = rows_h
        w[idx] = w[idx] - gr / np.sqrt(rows_h + k.eps) * k.lr


class _StandIns(object):
    """Dense stand-ins for a row_sparse or csr weight and its sparse states, written back
    after the update (``with _StandIns(weight, state, kernel) as (w, st): ...``).

    ``kernel=True``: one of MXNet's row_sparse kernels runs (a row_sparse gradient for
    sgd_update, sgd_mom_update, adam_update, _sparse_adagrad_update): the weight must
    store every row (MXNet's CheckAllRowsPresent), row_sparse states are filled with
    zero rows first, and all rows are written back.  ``kernel=False``: MXNet's storage
    fallback (a dense kernel on dense copies): the results are cast back to row_sparse,
    keeping the rows with a non-zero element.  A csr weight always takes the fallback (MXNet
    has no update kernel for csr): the results are cast back to csr, keeping the elements
    != 0 (NaN too, not -0.0); callers densify its row_sparse gradients first
    (``_csr_weight_grad``), ``kernel=True`` is refused for it.  Dense weights and states
    pass through."""

    def __init__(self, weight, state, kernel, func='update'):
        self.weight, self.state, self.kernel, self.func = weight, state, kernel, func
        self.pairs = []

    def _stand_in(self, arr):
        if isinstance(arr, (tuple, list)):
            res = [self._stand_in(a) for a in arr]
            return tuple(res) if isinstance(arr, tuple) else res
        if isinstance(arr, NDArray) and arr.stype in ('row_sparse', 'csr'):
            dense = arr.tostype('default')
            if dense.context != arr.context:
                # tostype (cast_storage) gives cpu(k) for cpu_pinned(k); MXNet's storage
                # fallback keeps its dense copies on the weight's context
                dense, moved = dense.as_in_context(arr.context), dense
                moved.close()
            self.pairs.append((arr, dense))
            return dense
        return arr

    def __enter__(self):
        weight = self.weight
        if weight.stype == 'default':
            return weight, self.state
        if weight.stype not in ('row_sparse', 'csr'):
            raise MXKVUsageError('mxkv optimizers update dense, row_sparse or csr weights '
                                 '(got %s)' % weight.stype)
        if weight.stype == 'csr' and self.kernel:
            raise MXKVUsageError('%s of a csr weight with a row_sparse gradient is not '
                                 'supported by mxkv (MXNet 1.9.1 runs its storage fallback)'
                                 % self.func)
        if self.kernel:
            _, idx = weight._parts()
            if idx.shape[0] != weight.shape[0]:
                raise MXNetError('%s for RowSparse weights is only implemented for RowSparse '
                                 'weights with all rows containing non-zeros. Expects '
                                 'weights.data.shape[0] (%d) == weights.shape[0] (%d).'
                                 % (self.func, idx.shape[0], weight.shape[0]))
        return self._stand_in(weight), self._stand_in(self.state)

    def __exit__(self, exc_type, exc, trace):
        if exc_type is None:
            for arr, dense in self.pairs:
                if self.kernel:  # written in place: every row stays stored
                    values = dense.asnumpy()
                    arr._assign_parts(values, np.arange(values.shape[0], dtype=np.int64))
                else:            # cast_storage of the fallback's dense result
                    dense.copyto(arr)
        for _, dense in self.pairs:
            dense.close()
        return False


def _is_rsp(arr):
    return isinstance(arr, NDArray) and arr.stype == 'row_sparse'


def _csr_weight_grad(weight, grad):
    """the gradient an update kernel sees for a csr weight: MXNet has no kernel for csr
    weights, its storage fallback densifies a row_sparse gradient too"""
    if isinstance(weight, NDArray) and weight.stype == 'csr' and _is_rsp(grad):
        return grad.tostype('default')
    return grad


def _sgd_update(weight, grad, lr, wd, rescale_grad, clip_gradient, lazy_update=True):
    """sgd_update: out = (1 - lr*wd)*w - lr*clip(rescale*g) | - (lr*rescale)*g"""
    rows = _rsp_rows(weight, grad)
    if rows is not None:
        _check_real(weight)
        _sgd_update_rsp(weight, grad, rows, lr, wd, rescale_grad, clip_gradient, lazy_update)
        return
    _check_dense(weight, grad)
    _check_real(weight)
    k = _K(weight.dtype, lr=lr, wd=wd, rescale=rescale_grad, clip=clip_gradient)
    w, g = _views(weight, grad)
    one = k.lit(1.0)
    with _errstate():
        if k.clip >= 0:
            new = (one - k.lr * k.wd) * w - k.lr * _clip_map(k.rescale * g, k.clip)
        else:
            new = (one - k.lr * k.wd) * w - (k.lr * k.rescale) * g
        w[...] = new


def _sgd_mom_update(weight, grad, mom, lr, wd, momentum, rescale_grad, clip_gradient,
                    lazy_update=True):
    """sgd_mom_update: mom = m*mom - lr*wd*w - lr*rescale*g; out = w + mom"""
    rows = _rsp_rows(weight, grad, mom)
    if rows is not None:
        _check_real(weight)
        _sgd_mom_update_rsp(weight, grad, mom, rows, lr, wd, momentum, rescale_grad,
                            clip_gradient, lazy_update)
        return
    _check_dense(weight, grad, mom)
    _check_real(weight)
    k = _K(weight.dtype, lr=lr, wd=wd, m=momentum, rescale=rescale_grad, clip=clip_gradient)
    w, g, s = _views(weight, grad, mom)
    with _errstate():
        if k.clip >= 0:
            s[...] = k.m * s - k.lr * k.wd * w - k.lr * _clip_map(k.rescale * g, k.clip)
        else:
            s[...] = k.m * s - k.lr * k.wd * w - k.lr * k.rescale * g
        w[...] = w + s


def _multi_sgd_update(weight, grad, mom, lr, wd, momentum, rescale_grad, clip_gradient):
    """multi_sgd_update / multi_sgd_mom_update for one weight: lrs and wds are Tuple<float>
    (strtof), the other parameters dmlc floats; mom=None means no momentum state."""
    _check_dense(weight, grad)
    _check_real(weight)
    dt = np.dtype(weight.dtype)
    t_lr = dt.type(strtof(lr))
    t_wd = dt.type(strtof(wd))
    k = _K(dt, m=momentum, rescale=rescale_grad, clip=clip_gradient)
    if mom is None:
        w, g = _views(weight, grad)
        s = np.zeros_like(w)
    else:
        _check_dense(mom)
        w, g, s = _views(weight, grad, mom)
    with _errstate():
        if k.clip >= 0:
            new_mom = k.m * s - t_lr * t_wd * w - t_lr * _clip_map(k.rescale * g, k.clip)
        else:
            new_mom = k.m * s - t_lr * t_wd * w - t_lr * k.rescale * g
        if mom is not None:
            s[...] = new_mom
        w[...] = w + new_mom


def _nag_mom_update(weight, grad, mom, lr, wd, momentum, rescale_grad, clip_gradient,
                    out_is_weight=True):
    """nag_mom_update (NAGMomKernel); `out_is_weight` False: the kernel's output is another
    array than its weight input (MXNet's storage fallback for a row_sparse weight)"""
    grad = _fallback_grad(weight, grad)
    _check_dense(weight, grad, mom)
    _check_real(weight)
    k = _K(weight.dtype, lr=lr, wd=wd, m=momentum, rescale=rescale_grad, clip=clip_gradient)
    w, g, s = _views(weight, grad, mom)
    one = k.lit(1)
    with _errstate():
        s[...] = k.m * s
        rg = _clip_map(k.rescale * g, k.clip) if k.clip >= 0 else k.rescale * g
        w_in = w if out_is_weight else w.copy()
        w[...] = w - s + (k.m + one) * (s - k.lr * (rg + k.wd * w))
        # MXNet writes the output first: when it is the weight (out=weight), the
        # momentum's weight decay term sees the *updated* weight
        s[...] = s - k.lr * (rg + k.wd * w_in)


def _adam_update(weight, grad, mean, var, lr, wd, beta1, beta2, epsilon, rescale_grad,
                 clip_gradient, lazy_update=True):
    """adam_update (AdamUpdateKernel)"""
    rows = _rsp_rows(weight, grad, mean, var)
    if rows is not None:
        _check_real(weight)
        _adam_update_rsp(weight, grad, mean, var, rows, lr, wd, beta1, beta2, epsilon,
                         rescale_grad, clip_gradient, lazy_update)
        return
    _check_dense(weight, grad, mean, var)
    _check_real(weight)
    k = _K(weight.dtype, lr=lr, wd=wd, b1=beta1, b2=beta2, eps=epsilon, rescale=rescale_grad,
           clip=clip_gradient)
    w, g, m, v = _views(weight, grad, mean, var)
    one = k.lit(1.0)
    with _errstate():
        gr = g * k.rescale + w * k.wd
        if k.clip >= 0:
            gr = _clip_map(gr, k.clip)
        m[...] = k.b1 * m + (one - k.b1) * gr
        v[...] = k.b2 * v + (one - k.b2) * gr * gr
        w[...] = w - k.lr * m / (np.sqrt(v) + k.eps)


def _rmsprop_update(weight, grad, n, lr, wd, gamma1, epsilon, rescale_grad, clip_gradient,
                    clip_weights):
    """rmsprop_update (RMSPropUpdateKernel)"""
    grad = _fallback_grad(weight, grad)
    _check_dense(weight, grad, n)
    k = _K(weight.dtype, lr=lr, wd=wd, g1=gamma1, eps=epsilon, rescale=rescale_grad,
           clip=clip_gradient, cw=clip_weights)
    w, g, sn = _views(weight, grad, n)
    one = k.lit(1.0)
    with _errstate():
        gr = k.rescale * g + k.wd * w
        if k.clip >= 0:
            gr = _clip_map(gr, k.clip)
        sn[...] = (one - k.g1) * (gr * gr) + k.g1 * sn
        new = w - k.lr * (gr / np.sqrt(sn + k.eps))
        if k.cw >= 0:
            new = _clip_map(new, k.cw)
        w[...] = new


def _rmspropalex_update(weight, grad, n, gst, delta, lr, wd, gamma1, gamma2, epsilon,
                        rescale_grad, clip_gradient, clip_weights):
    """rmspropalex_update (RMSPropAlexUpdateKernel)"""
    grad = _fallback_grad(weight, grad)
    _check_dense(weight, grad, n, gst, delta)
    k = _K(weight.dtype, lr=lr, wd=wd, g1=gamma1, g2=gamma2, eps=epsilon,
           rescale=rescale_grad, clip=clip_gradient, cw=clip_weights)
    w, g, sn, sg, d = _views(weight, grad, n, gst, delta)
    one = k.lit(1.0)
    with _errstate():
        gr = k.rescale * g + k.wd * w
        if k.clip >= 0:
            gr = _clip_map(gr, k.clip)
        sn[...] = (one - k.g1) * gr * gr + k.g1 * sn
        sg[...] = (one - k.g1) * gr + k.g1 * sg
        d[...] = k.g2 * d - (k.lr * gr / np.sqrt(sn - sg * sg + k.eps))
        new = w + d
        if k.cw >= 0:
            new = _clip_map(new, k.cw)
        w[...] = new


def _signsgd_update(weight, grad, lr, wd, rescale_grad, clip_gradient):
    """signsgd_update (clip_gradient and rescale_grad have no effect)"""
    grad = _fallback_grad(weight, grad)
    _check_dense(weight, grad)
    _check_real(weight)
    k = _K(weight.dtype, lr=lr, wd=wd, rescale=rescale_grad, clip=clip_gradient)
    w, g = _views(weight, grad)
    one = k.lit(1.0)
    with _errstate():
        w[...] = (one - k.lr * k.wd) * w - k.lr * _sign(g, k.dt)


def _signum_update(weight, grad, mom, lr, wd, momentum, rescale_grad, clip_gradient, wd_lh):
    """signum_update (SignumKernel)"""
    grad = _fallback_grad(weight, grad)
    _check_dense(weight, grad, mom)
    _check_real(weight)
    k = _K(weight.dtype, lr=lr, wd=wd, m=momentum, rescale=rescale_grad, clip=clip_gradient,
           wd_lh=wd_lh)
    w, g, s = _views(weight, grad, mom)
    one = k.lit(1)
    with _errstate():
        if k.clip >= 0:
            s[...] = k.m * s - (one - k.m) * k.wd * w \
                - (one - k.m) * _clip_map(k.rescale * g, k.clip)
        else:
            s[...] = k.m * s - (one - k.m) * k.wd * w - (one - k.m) * k.rescale * g
        w[...] = (one - k.lr * k.wd_lh) * w + k.lr * _sign(s, k.dt)



def _ftrl_rows(k, w, g, z, n):
    """FtrlUpdateKernel / FtrlDnsRspDnsKernel on arrays of rows: (new weight, z, n)"""
    dt = k.dt.type
    gr = g * k.rescale
    if k.clip >= 0:
        gr = _clip_map(gr, k.clip)
    sq = gr * gr
    z = z + (gr - (np.sqrt(n + sq) - np.sqrt(n)) * w / k.lr)
    n = n + sq
    out = (_sign(z, dt) * k.lamda1 - z) / ((k.beta + np.sqrt(n)) / k.lr + k.wd) \
        * (np.abs(z) > k.lamda1).astype(dt)
    return out, z, n


def _ftrl_update(weight, grad, z, n, lr, wd, lamda1, beta, rescale_grad, clip_gradient,
                 lazy_rows=None):
    """ftrl_update: dense (FtrlUpdateKernel), or with `lazy_rows` (the row_sparse kernel
    for a row_sparse weight, gradient and states) on the gradient's rows only"""
    if lazy_rows is None and np.dtype(grad.dtype) != np.dtype(weight.dtype):
        raise _type_error(1, weight.dtype, grad.dtype)   # (input 1 is inferred first)
    _check_dense(weight, z, n, positions=(0, 2, 3))
    k = _K(weight.dtype, lr=lr, wd=wd, lamda1=lamda1, beta=beta, rescale=rescale_grad,
           clip=clip_gradient)
    with _errstate():
        if lazy_rows is not None:
            idx, g = lazy_rows
            if not idx.size:
                return
            w, sz, sn = (a._arith_view(write=True) for a in (weight, z, n))
            w[idx], sz[idx], sn[idx] = _ftrl_rows(k, w[idx], g, sz[idx], sn[idx])
            return
        grad = _fallback_grad(weight, grad)
        _check_dense(weight, grad, z, n)
        w, g, sz, sn = _views(weight, grad, z, n)
        w[...], sz[...], sn[...] = _ftrl_rows(k, w, g, sz, sn)


def _ftml_update(weight, grad, d, v, z, lr, wd, beta1, beta2, epsilon, t, rescale_grad,
                 clip_grad):
    """ftml_update (FTMLKernel; epsilon is a double parameter, t an int)"""
    grad = _fallback_grad(weight, grad)
    _check_dense(weight, grad, d, v, z)
    _check_real(weight)
    k = _K(weight.dtype, lr=lr, wd=wd, b1=beta1, b2=beta2, rescale=rescale_grad,
           clip=clip_grad)
    dt = k.dt.type
    eps = dt(dmlc_double(epsilon))
    t = dt(int(t))
    one = k.lit(1)
    w, g, sd, sv, sz = _views(weight, grad, d, v, z)
    with _errstate():
        gr = k.rescale * g + k.wd * w
        if k.clip >= 0:
            gr = _clip_map(gr, k.clip)
        sv[...] = k.b2 * sv + (one - k.b2) * (gr * gr)
        # power::Map is the C library's powf / pow (numpy's power is not, from numpy 1.24)
        d_t = (one - c_pow(k.b1, t)) / k.lr * (np.sqrt(sv / (one - c_pow(k.b2, t))) + eps)
        sz[...] = k.b1 * sz + (one - k.b1) * gr - (d_t - k.b1 * sd) * w
        sd[...] = d_t
        w[...] = -sz / d_t



def _sum_sq(values):
    """CalcSumSq (multi_sum_sq on cpu): a float sum, element after element, of the squares
    computed in the array's dtype"""
    flat = np.ascontiguousarray(values).reshape(-1)
    if not flat.size:
        return np.float32(0)
    with _errstate():
        squares = flat * flat
    if flat.dtype == np.float64:   # float += double: each step rounded back to float
        total = np.float32(0)
        for sq in squares.tolist():
            total = np.float32(float(total) + sq)
        return total
    with _errstate():
        return np.cumsum(squares.astype(np.float32), dtype=np.float32)[-1]


def _multi_lamb_update(weight, grad, mean, var, lr, wd, step, beta1, beta2, epsilon,
                       rescale_grad, clip_gradient, bias_correction, lower_bound,
                       upper_bound, weight32=None):
    """multi_lamb_update for one tensor (MultiLAMBKernelStep1, the float sums of squares of
    the weight and of the float temp_g, MultiLAMBKernelStep2); lrs and wds are
    Tuple<float> (strtof), the other parameters dmlc floats.  With `weight32`:
    multi_mp_lamb_update (MPDType float: the float32 arithmetic on the master copy, whose
    result is rounded into the float16 weight; r1 still sums the float16 weight's
    squares)"""
    f32 = np.float32
    if weight32 is not None:
        w16, g, w, m, v = _mp_arrays(weight, grad, weight32, mean, var)
        k = _K(f32, b1=beta1, b2=beta2, eps=epsilon, clip=clip_gradient)
    else:
        grad = _fallback_grad(weight, grad)
        _check_dense(weight, grad, mean, var)
        _check_real(weight)
        k = _K(weight.dtype, b1=beta1, b2=beta2, eps=epsilon, clip=clip_gradient)
        w, g, m, v = _views(weight, grad, mean, var)
        w16 = w
    dt = k.dt.type
    half = k.dt == np.float16
    # half_t op float (and op double) is computed in float and rounded to half_t
    rescale = f32(dmlc_float(rescale_grad)) if half else dt(f32(dmlc_float(rescale_grad)))
    lr_t, wd_t = dt(strtof(lr)), dt(strtof(wd))
    lower, upper = f32(dmlc_float(lower_bound)), f32(dmlc_float(upper_bound))
    one = k.lit(1.0)
    with _errstate():
        r1_sum = _sum_sq(w16)
        sg = (g.astype(f32) * rescale).astype(k.dt) if half else g * rescale
        if k.clip >= 0:
            sg = _clip_map(sg, k.clip)
        m[...] = k.b1 * m + (one - k.b1) * sg
        v[...] = k.b2 * v + (one - k.b2) * sg * sg
        if bias_correction:
            t = dt(int(step))
            # power::Map: the C library's powf / pow, as in _ftml_update
            mean_hat = m / (one - c_pow(k.b1, t))
            var_hat = v / (one - c_pow(k.b2, t))
        else:
            mean_hat, var_hat = m, v
        # the kernel's unqualified sqrt is ::sqrt(double): from there on the float32
        # kernel computes in double until g is stored in the float temp_g
        d = np.float64
        if half:   # sqrt(double) + half_t: in float, rounded to half_t; the rest half_t
            denom = (np.sqrt(var_hat.astype(f32)) + f32(k.eps)).astype(k.dt)
            upd = mean_hat / denom + wd_t * w
        else:
            upd = mean_hat.astype(d) / (np.sqrt(var_hat.astype(d)) + d(k.eps)) \
                + (wd_t * w).astype(d)
        temp_g = upd.astype(f32)
        r1 = np.sqrt(r1_sum)
        r2 = np.sqrt(_sum_sq(temp_g))
        if lower >= 0:
            r1 = max(r1, lower)
        if upper >= 0:
            r1 = min(r1, upper)
        ratio = dt(1.0) if (r1 == 0 or r2 == 0) else dt(f32(r1 / r2))
        lr_adjusted = lr_t * ratio
        if half:
            w[...] = w - (lr_adjusted.astype(f32) * temp_g).astype(k.dt)
        elif weight32 is not None:
            _mp_step(w16, w, w - lr_adjusted * temp_g)
        else:
            w[...] = w - lr_adjusted * temp_g.astype(k.dt)



def _nrm2(values, dtype=np.float32):
    """NDArray.norm() (ord 2) of a float32 or float64 array on cpu: mshadow_op::nrm2's
    scaled sum of squares in the array's dtype, element after element
    (seq_reduce_compute), then scale * sqrt(sum).  Finite arrays run a segment at a
    time: between two elements that raise the running maximum, the sum is a sequential
    cumsum of (|x| / scale)**2."""
    dt = np.dtype(dtype).type
    flat = np.ascontiguousarray(values, dtype=dt).reshape(-1)
    with _errstate():
        mags = np.abs(flat[flat != 0])
    if not mags.size:
        return dt(0)
    if dt is np.float16 or not np.isfinite(mags).all():
        # (numpy accumulates float16 sums in float)
        return _nrm2_loop(flat, dt)
    one = dt(1)
    running = np.maximum.accumulate(mags)
    # elements that raise the scale (strictly above every earlier one)
    raises = np.flatnonzero(np.concatenate(([True], mags[1:] > running[:-1])))
    total, scale = dt(0), dt(0)
    with _errstate():
        for n, start in enumerate(raises):
            ratio = scale / mags[start]
            total = one + total * ratio * ratio
            scale = mags[start]
            stop = raises[n + 1] if n + 1 < raises.size else mags.size
            if stop > start + 1:
                terms = mags[start + 1:stop] / scale
                terms = terms * terms
                total = np.cumsum(np.concatenate(([total], terms)), dtype=dt)[-1]
        return dt(scale * np.sqrt(total))


def _nrm2_loop(values, dtype):
    """_nrm2, element after element (for arrays holding NaN or infinity)"""
    f32 = np.dtype(dtype).type
    total, scale = f32(0), f32(0)
    one = f32(1)
    with _errstate():
        for src in np.ascontiguousarray(values, dtype=f32).reshape(-1):
            if src != 0:
                mag = abs(src)
                if scale < mag:
                    ratio = scale / mag
                    total = one + total * ratio * ratio
                    scale = mag
                else:
                    ratio = mag / scale
                    total = total + ratio * ratio
        if f32 is np.float16:
            # math::sqrt(half_t) is sqrtf: a float, and half_t * float is rounded once
            return f32(np.float32(scale) * np.sqrt(np.float32(total)))
        return f32(scale * np.sqrt(total))


def _preloaded_multi_sgd(weight, grad, mom, lr, wd, momentum, rescale_grad, clip_gradient):
    """preloaded_multi_sgd_update / preloaded_multi_sgd_mom_update for one weight: lr and
    wd are float32 array elements (float arithmetic, mixed with the weight's dtype as C++
    promotes it), the other parameters dmlc floats; mom=None: no momentum state"""
    _check_dense(weight, grad)
    _check_real(weight)
    dt = np.dtype(weight.dtype)
    f32 = np.float32
    k = _K(dt, m=momentum, rescale=rescale_grad, clip=clip_gradient)
    lr, wd = f32(lr), f32(wd)
    if mom is None:
        w, g = _views(weight, grad)
        s = np.zeros_like(w)
    else:
        _check_dense(mom)
        w, g, s = _views(weight, grad, mom)
    lr_d = lr.astype(dt)   # float op double promotes to double; float op float stays
    with _errstate():
        if dt == np.float16:   # half_t op float: computed in float, rounded to half_t
            h = k.dt.type
            decay = ((lr * wd) * w.astype(f32)).astype(h)
            if k.clip >= 0:
                step = (lr * _clip_map(k.rescale * g, k.clip).astype(f32)).astype(h)
            else:
                step = h(lr * f32(k.rescale)) * g
            new_mom = k.m * s - decay - step
        elif k.clip >= 0:
            new_mom = k.m * s - (lr * wd).astype(dt) * w \
                - lr_d * _clip_map(k.rescale * g, k.clip)
        else:
            new_mom = k.m * s - (lr * wd).astype(dt) * w - lr_d * k.rescale * g
        if mom is not None:
            s[...] = new_mom
        w[...] = w + new_mom



# --- multi_precision: float16 weights with float32 master copies ------------------------
# MXNet 1.9.1's mp_* kernels (optimizer_op-inl.h, preloaded_multi_sgd-inl.h,
# contrib/multi_lamb.cc) compute in float from the float32 master copy (weight32) and the
# gradient's float16 values as float, write the master copy (and float32 momentum) and
# store (DType)w, the float result rounded to float16, into the weight.
def _mp_arrays(weight, grad, weight32, *states):
    """numpy views (weight, grad as float32 values, weight32, states) for an mp kernel; a
    row_sparse gradient is densified (the mp kernels are dense only: MXNet's storage
    fallback)"""
    grad = _fallback_grad(weight, grad)
    _check_dense(weight, grad)
    _check_real(weight)
    for arr in (weight32,) + tuple(s for s in states if s is not None):
        if arr.stype != 'default':
            raise MXKVUsageError('mxkv optimizers support dense arrays only (got %s)'
                                 % arr.stype)
        if np.dtype(arr.dtype) != np.float32:
            raise MXNetError('Incompatible attr: the master copy and states of a '
                             'multi-precision update are float32 (got %s)'
                             % np.dtype(arr.dtype).name)
    w = weight._arith_view(write=True)
    g = grad._arith_view().astype(np.float32)
    w32 = weight32._arith_view(write=True)
    return (w, g, w32) + tuple(None if s is None else s._arith_view(write=True)
                               for s in states)


def _mp_step(w, w32, new_w32):
    """weight32 = w; out = (DType)w"""
    w32[...] = new_w32
    w[...] = new_w32.astype(w.dtype)


def _mp_sgd_update(weight, grad, weight32, mom, lr, wd, momentum, rescale_grad,
                   clip_gradient):
    """mp_sgd_update (MP_SGDKernel, mom=None) / mp_sgd_mom_update (MP_SGDMomKernel):
    float parameters, float arithmetic"""
    f32 = np.float32
    w, g, w32, s = _mp_arrays(weight, grad, weight32, mom)
    lr, wd, m = f32(dmlc_float(lr)), f32(dmlc_float(wd)), f32(dmlc_float(momentum))
    rescale, clip_g = f32(dmlc_float(rescale_grad)), f32(dmlc_float(clip_gradient))
    with _errstate():
        if s is None:
            if clip_g >= 0:
                new = (f32(1) - lr * wd) * w32 - lr * _clip_map(rescale * g, clip_g)
            else:
                new = (f32(1) - lr * wd) * w32 - (lr * rescale) * g
        else:
            if clip_g >= 0:
                s[...] = m * s - lr * wd * w32 - lr * _clip_map(rescale * g, clip_g)
            else:
                s[...] = m * s - lr * wd * w32 - lr * rescale * g
            new = w32 + s
        _mp_step(w, w32, new)


def _mp_multi_sgd(weight, grad, weight32, mom, lr, wd, momentum, rescale_grad,
                  clip_gradient, preloaded=False):
    """multi_mp_sgd_update / multi_mp_sgd_mom_update (MultiSGDKernel with MPDType float:
    lrs and wds are Tuple<float>, strtof) or, with `preloaded`, their preloaded_* forms
    (PreloadedMultiSGDKernel: lr and wd are float32 array elements) for one weight"""
    f32 = np.float32
    w, g, w32, s = _mp_arrays(weight, grad, weight32, mom)
    if preloaded:
        lr, wd = f32(lr), f32(wd)
    else:
        lr, wd = f32(strtof(lr)), f32(strtof(wd))
    m = f32(dmlc_float(momentum))
    rescale, clip_g = f32(dmlc_float(rescale_grad)), f32(dmlc_float(clip_gradient))
    with _errstate():
        # without momentum the kernel's mom starts at 0: a scalar, not an array of zeros
        prev = s if s is not None else f32(0)
        if clip_g >= 0:
            new_mom = m * prev - lr * wd * w32 - lr * _clip_map(rescale * g, clip_g)
        else:
            new_mom = m * prev - lr * wd * w32 - lr * rescale * g
        if s is not None:
            s[...] = new_mom
        _mp_step(w, w32, w32 + new_mom)


def _mp_nag_mom_update(weight, grad, weight32, mom, lr, wd, momentum, rescale_grad,
                       clip_gradient):
    """mp_nag_mom_update (MP_NAGMomKernel): the new weight first, then the momentum's
    weight decay with the new weight"""
    f32 = np.float32
    w, g, w32, s = _mp_arrays(weight, grad, weight32, mom)
    lr, wd, m = f32(dmlc_float(lr)), f32(dmlc_float(wd)), f32(dmlc_float(momentum))
    rescale, clip_g = f32(dmlc_float(rescale_grad)), f32(dmlc_float(clip_gradient))
    with _errstate():
        rg = _clip_map(rescale * g, clip_g) if clip_g >= 0 else rescale * g
        s[...] = m * s
        new = w32 - s + (m + f32(1)) * (s - lr * (rg + wd * w32))
        s[...] = s - lr * (rg + wd * new)
        _mp_step(w, w32, new)


def _mp_lamb_update_phases(weight, grad, mean, var, weight32, lr, wd, t, beta1, beta2,
                           epsilon, rescale_grad, clip_gradient, bias_correction,
                           lower_bound, upper_bound):
    """mp_lamb_update_phase1 (MPLambUpdatePhaseOneKernel), r1 = weight32.norm(),
    r2 = g.norm(), mp_lamb_update_phase2 (MPLambUpdatePhaseTwoKernel).  As in MXNet
    1.9.1, phase 2 writes the float16 weight from weight32 - lr * g and leaves the
    master copy as it was."""
    f32 = np.float32
    w, g16, w32, m, v = _mp_arrays(weight, grad, weight32, mean, var)
    g16 = g16.astype(np.float16)
    rescale, clip_g = f32(dmlc_float(rescale_grad)), f32(dmlc_float(clip_gradient))
    b1, b2 = f32(dmlc_float(beta1)), f32(dmlc_float(beta2))
    eps, wd = f32(dmlc_float(epsilon)), f32(dmlc_float(wd))
    t = int(t)
    # std::pow(float, int) is computed in double
    b1_t = f32(math.pow(float(b1), t))
    b2_t = f32(math.pow(float(b2), t))
    one = f32(1)
    with _errstate():
        # half_t * float: computed in float, rounded to half_t (then kept as float)
        gr = (g16.astype(f32) * rescale).astype(np.float16).astype(f32)
        if clip_g >= 0:
            gr = _clip_map(gr, clip_g)
        m[...] = b1 * m + (one - b1) * gr
        v[...] = b2 * v + (one - b2) * gr * gr
        if bias_correction:
            # mean / (1. - beta1_t): a double literal, so double arithmetic
            mean_hat = (m.astype(np.float64) / (1.0 - np.float64(b1_t))).astype(f32)
            var_hat = v / (one - b2_t)
            upd = mean_hat / (np.sqrt(var_hat) + eps) + wd * w32
        else:
            upd = m / (np.sqrt(v) + eps) + wd * w32
        r1 = _nrm2(w32, f32)
        r2 = _nrm2(upd, f32)
        lower, upper = f32(dmlc_float(lower_bound)), f32(dmlc_float(upper_bound))
        if lower >= 0:
            r1 = max(r1, lower)
        if upper >= 0:
            r1 = min(r1, upper)
        lr_t = f32(dmlc_float(lr))
        if not (r1 == 0 or r2 == 0):
            lr_t = lr_t * r1 / r2
        w[...] = (w32 - lr_t * upd).astype(np.float16)


def _sparse_norm(arr):
    """NDArray.norm() of a row_sparse or csr array (L2NormComputeSparseImpl): the BLAS dot
    of its stored values with themselves (sdot / ddot), then sqrt.  The dot is summed in
    the order of the OpenBLAS in MXNet 1.9.1's wheel on this CPU (ndarray/_blas.py:
    libmxkv's MXKVBlasDot), not by numpy's BLAS, whose order depends on its version."""
    if arr.dtype == np.float16:
        raise MXNetError('Not implmented! (MXNet 1.9.1 has no float16 kernel for the norm '
                         'of a %s array: its dot engine refuses half_t)' % arr.stype)
    from ..ndarray._blas import blas_dot
    with arr.data as data_nd:
        flat = np.ascontiguousarray(data_nd.asnumpy()).reshape(-1)
    with _errstate():
        return np.sqrt(blas_dot(flat)) if flat.size else flat.dtype.type(0)


def _lamb_update_phases(weight, grad, mean, var, lr, wd, t, beta1, beta2, epsilon,
                        rescale_grad, clip_gradient, bias_correction, lower_bound,
                        upper_bound, weight_norm=None):
    """lamb_update_phase1 (LambUpdatePhaseOneKernel), r1 = weight.norm(), r2 = g.norm(),
    lamb_update_phase2 (LambUpdatePhaseTwoKernel): MXNet's LAMB for one index
    (`weight_norm`: r1 of a sparse weight, computed from its stored values).  float16
    weights: every operation in half_t (computed in float, rounded to half), the norms
    too (mshadow's nrm2 reducer accumulates in the array's dtype)."""
    grad = _fallback_grad(weight, grad)
    _check_dense(weight, grad, mean, var)
    _check_real(weight)
    k = _K(weight.dtype, b1=beta1, b2=beta2, eps=epsilon, wd=wd, rescale=rescale_grad,
           clip=clip_gradient, lr=lr, lower=lower_bound, upper=upper_bound)
    dt = k.dt.type
    f32 = np.float32
    half = k.dt == np.float16
    t = int(t)
    # std::pow(float, int) is computed in double; a half_t made from it goes through float
    b1_t = math.pow(float(f32(dmlc_float(beta1))), t)
    b2_t = math.pow(float(f32(dmlc_float(beta2))), t)
    b1_t, b2_t = (dt(f32(b1_t)), dt(f32(b2_t))) if half else (dt(b1_t), dt(b2_t))
    one_f = dt(f32(1))
    w, g, m, v = _views(weight, grad, mean, var)
    with _errstate():
        gr = g * k.rescale
        if k.clip >= 0:
            gr = _clip_map(gr, k.clip)
        m[...] = k.b1 * m + (one_f - k.b1) * gr
        v[...] = k.b2 * v + (one_f - k.b2) * gr * gr
        if bias_correction:
            if half:   # 1. - beta1_t: half_t op double, computed in float, a half_t
                mean_hat = m / dt(f32(1) - f32(b1_t))
            else:      # mean / (1. - beta1_t): a double literal, so double arithmetic
                mean_hat = (m.astype(np.float64) / (1.0 - np.float64(b1_t))).astype(k.dt)
            var_hat = v / (dt(1) - b2_t)
            upd = mean_hat / (np.sqrt(var_hat) + k.eps) + k.wd * w
        else:
            upd = m / (np.sqrt(v) + k.eps) + k.wd * w
        r1 = _nrm2(w, k.dt) if weight_norm is None else dt(weight_norm)
        r2 = _nrm2(upd, k.dt)
        if k.lower >= 0:
            r1 = max(r1, k.lower)
        if k.upper >= 0:
            r1 = min(r1, k.upper)
        lr_t = k.lr * dt(1) if (r1 == 0 or r2 == 0) else k.lr * r1 / r2
        w[...] = w - lr_t * upd


# --- optimizers -------------------------------------------------------------------
class Optimizer(object):
    """Base class: learning rate (or lr_scheduler), weight decay, rescale_grad,
    clip_gradient, per-index lr/wd multipliers and update counting, as in MXNet."""
    opt_registry = {}

    def __init__(self, rescale_grad=1., param_idx2name=None, wd=0., clip_gradient=None,
                 learning_rate=None, lr_scheduler=None, sym=None, begin_num_update=0,
                 multi_precision=False, param_dict=None):
        self.rescale_grad = rescale_grad
        self.lr_scheduler = lr_scheduler
        if self.lr_scheduler is None and learning_rate is None:
            learning_rate = 0.01
        self.lr = learning_rate
        if self.lr_scheduler is not None and learning_rate is not None:
            if self.lr_scheduler.base_lr != learning_rate:
                print(UserWarning('learning rate from ``lr_scheduler`` has been '
                                  'overwritten by ``learning_rate`` in optimizer.'))
                self.lr_scheduler.base_lr = learning_rate
        self.wd = wd
        self.lr_mult = {}
        self.wd_mult = {}
        self.begin_num_update = begin_num_update
        self.num_update = begin_num_update
        self._all_index_update_counts = {0: {}}
        self._index_update_count = self._all_index_update_counts[0]
        self.clip_gradient = clip_gradient
        self.multi_precision = multi_precision
        self.aggregate_num = 0
        if param_idx2name is None:
            param_idx2name = {}
        if not isinstance(param_idx2name, dict):
            raise MXKVUsageError('param_idx2name should be a dict of param indexes to names.')
        self.idx2name = param_idx2name.copy()
        if sym is not None:
            raise MXKVUsageError('mxkv has no Symbol; use set_lr_mult/set_wd_mult')
        self.sym_info = ()
        self.param_dict = param_dict if param_dict else {}
        self.allow_np_array = False
        self.set_lr_mult({})
        self.set_wd_mult({})

    @staticmethod
    def register(klass):
        """Register an optimizer class under its lower-cased name."""
        if not isinstance(klass, type):
            raise MXKVUsageError('register expects a class')
        name = klass.__name__.lower()
        if name in Optimizer.opt_registry:
            warnings.warn('WARNING: New optimizer %s.%s is overriding existing optimizer %s.%s'
                          % (klass.__module__, klass.__name__,
                             Optimizer.opt_registry[name].__module__,
                             Optimizer.opt_registry[name].__name__))
        Optimizer.opt_registry[name] = klass
        return klass

    @staticmethod
    def create_optimizer(name, **kwargs):
        """Instantiate a registered optimizer by (case-insensitive) name."""
        if name.lower() in Optimizer.opt_registry:
            return Optimizer.opt_registry[name.lower()](**kwargs)
        raise ValueError('Cannot find optimizer %s' % name)

    @property
    def learning_rate(self):
        """current learning rate"""
        if self.lr_scheduler is not None:
            return self.lr_scheduler(self.num_update)
        return self.lr

    def create_state(self, index, weight):
        """Auxiliary state for a weight (None if the optimizer has none)."""

    def _use_multi_precision(self, weight):
        """multi_precision and a float16 weight (the first of a list)"""
        if isinstance(weight, (list, tuple)):
            weight = weight[0]
        return bool(self.multi_precision) and weight.dtype == np.float16

    def _warn_float16(self, weight, name='optimizer'):
        if weight.dtype == np.float16 and not self.multi_precision:
            warnings.warn('Accumulating with float16 in optimizer can lead to poor accuracy or '
                          'slow convergence. Consider using multi_precision=True option of the '
                          '%s' % name)

    def create_state_multi_precision(self, index, weight):
        """create_state; with multi_precision, for a float16 weight: (float32 master
        copy, create_state of the master copy), as MXNet"""
        if self._use_multi_precision(weight):
            weight_master_copy = weight.astype(np.float32)
            return (weight_master_copy,) + (self.create_state(index, weight_master_copy),)
        self._warn_float16(weight)
        return self.create_state(index, weight)

    def _mp_master_first_state(self, index, weight, name):
        """create_state_multi_precision of SGD, NAG and LARS: (create_state of the float32
        master copy, master copy)"""
        if self._use_multi_precision(weight):
            weight_master_copy = weight.astype(np.float32)
            return (self.create_state(index, weight_master_copy), weight_master_copy)
        self._warn_float16(weight, name)
        return self.create_state(index, weight)

    def update(self, index, weight, grad, state):
        """Update `weight` in place from `grad` and `state`."""
        raise NotImplementedError()

    def update_multi_precision(self, index, weight, grad, state):
        """update; with multi_precision, for a float16 weight, MXNet's generic path:
        update the float32 master copy (state[0]) from the gradient cast to float32, then
        cast the master copy into the weight"""
        if self._use_multi_precision(weight):
            weight_master_copy, original_state = state[0], state[1]
            # (not closed after: LBSGD keeps the gradient it was given)
            grad32 = grad.astype(np.float32)
            self.update(index, weight_master_copy, grad32, original_state)
            _cast_into(weight_master_copy, weight)
        else:
            self.update(index, weight, grad, state)

    def set_learning_rate(self, lr):
        """Set the learning rate (not allowed with an lr_scheduler)."""
        if self.lr_scheduler is not None:
            raise UserWarning('LRScheduler of the optimizer has already been defined. Note that '
                              'set_learning_rate can mutate the value of the learning rate of '
                              'the optimizer only when the LRScheduler of the optimizer is '
                              'undefined.')
        self.lr = lr

    def set_lr_scale(self, args_lrscale):  # pylint: disable=unused-argument
        """[DEPRECATED]"""
        raise DeprecationWarning

    def set_lr_mult(self, args_lr_mult):
        """Per-parameter (index or name) learning-rate multipliers."""
        self.lr_mult = {}
        self.lr_mult.update(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        """Per-parameter weight-decay multipliers (names not ending in _weight/_gamma get 0)."""
        self.wd_mult = {}
        for name in self.idx2name.values():
            if not (name.endswith('_weight') or name.endswith('_gamma')):
                self.wd_mult[name] = 0.0
        self.wd_mult.update(args_wd_mult)

    def _set_current_context(self, device_id):
        if device_id not in self._all_index_update_counts:
            self._all_index_update_counts[device_id] = {}
        self._index_update_count = self._all_index_update_counts[device_id]

    def _update_count(self, index):
        for idx in (index if isinstance(index, (list, tuple)) else [index]):
            if idx not in self._index_update_count:
                self._index_update_count[idx] = self.begin_num_update
            self._index_update_count[idx] += 1
            self.num_update = max(self._index_update_count[idx], self.num_update)

    def _get_lrs(self, indices):
        lr = self.lr_scheduler(self.num_update) if self.lr_scheduler is not None else self.lr
        lrs = [lr for _ in indices]
        for i, index in enumerate(indices):
            if index in self.param_dict:
                lrs[i] = _mul(lrs[i], self.param_dict[index].lr_mult)
            elif index in self.lr_mult:
                lrs[i] = _mul(lrs[i], self.lr_mult[index])
            elif index in self.idx2name:
                lrs[i] = _mul(lrs[i], self.lr_mult.get(self.idx2name[index], 1.0))
        return lrs

    def _get_lr(self, index):
        return self._get_lrs([index])[0]

    def _get_wds(self, indices):
        wds = [self.wd for _ in indices]
        for i, index in enumerate(indices):
            if index in self.param_dict:
                wds[i] = _mul(wds[i], self.param_dict[index].wd_mult)
            elif index in self.wd_mult:
                wds[i] = _mul(wds[i], self.wd_mult[index])
            elif index in self.idx2name:
                wds[i] = _mul(wds[i], self.wd_mult.get(self.idx2name[index], 1.0))
        return wds

    def _get_wd(self, index):
        return self._get_wds([index])[0]

    def _clip_param(self):
        """clip_gradient as the operator sees it: only passed when truthy, else -1."""
        return self.clip_gradient if self.clip_gradient else -1.0

    def __getstate__(self):
        ret = self.__dict__.copy()
        del ret['param_dict']
        return ret

    def __setstate__(self, state):
        self.__dict__ = state
        self.param_dict = {}


register = Optimizer.register  # pylint: disable=invalid-name
create = Optimizer.create_optimizer  # pylint: disable=invalid-name


def _sgd_step(weight, grad, state, lr, wd, momentum, rescale_grad, clip_g, lazy_update):
    """One index's sgd_update (no state) or sgd_mom_update: the per-index path of SGD
    and LARS (MXNet's unaggregated SGD kernels)."""
    _op_args(('mom', state))
    func = 'SGDMomUpdate' if state is not None else 'SGDUpdate'
    grad = _csr_weight_grad(weight, grad)
    with _StandIns(weight, state, _is_rsp(grad), func) as (w, st):
        if st is not None:
            _sgd_mom_update(w, grad, st, lr, wd, momentum, rescale_grad, clip_g, lazy_update)
        else:
            _sgd_update(w, grad, lr, wd, rescale_grad, clip_g, lazy_update)


def _mp_sgd_step(weight, grad, state, lr, wd, momentum, rescale_grad, clip_g, aggregate,
                 use_momentum, preloaded=False):
    """One weight's multi-precision SGD step (SGD, LARS): the aggregated kernel
    (multi_mp_sgd(_mom)_update, or preloaded_multi_mp_sgd(_mom)_update) for dense
    arrays, else mp_sgd_update / mp_sgd_mom_update (dense kernels: a row_sparse weight
    or gradient takes MXNet's storage fallback); state = (momentum or None, weight32)
    (aggregated: checked by the caller, _multi_sgd_args)"""
    mom, weight32 = state[0], state[1]
    if aggregate:
        _mp_multi_sgd(weight, grad, weight32, mom if use_momentum else None, lr, wd,
                      momentum, rescale_grad, clip_g, preloaded=preloaded)
        return
    _op_args(('mom', mom), ('weight32', weight32))
    with _StandIns(weight, (mom, weight32), False) as (w, (st_mom, st_w32)):
        _mp_sgd_update(w, grad, st_w32, st_mom, lr, wd, momentum, rescale_grad, clip_g)


def _cast_into(src, dst):
    """cast(src, dtype=dst.dtype, out=dst): the float32 master copy rounded into the
    float16 weight"""
    if src.stype == 'default' and dst.stype == 'default':
        dst._arith_view(write=True)[...] = src._arith_view().astype(dst._np_dtype)
        return
    with src.astype(dst.dtype) as tmp:
        tmp.copyto(dst)


class _KernelUpdates(Optimizer):
    """An optimizer that runs MXNet's multi-precision kernels itself (SGD, LAMB, LARS):
    update and update_multi_precision are its _update_impl, the latter with
    multi_precision for float16 weights when asked (not the generic master-copy path)."""
    def update(self, index, weight, grad, state):
        self._update_impl(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        self._update_impl(index, weight, grad, state,
                          multi_precision=self._use_multi_precision(weight))


@register
class SGD(_KernelUpdates):
    """SGD with momentum and weight decay::

        rescaled_grad = lr * (rescale_grad * clip(grad, clip_gradient) + wd * weight)
        state = momentum * state + rescaled_grad
        weight = weight - state

    Dense updates use MXNet's aggregated kernel (multi_sgd_update) unless
    ``MXNET_OPTIMIZER_AGGREGATION_SIZE=0``, exactly like MXNet.
    """
    def __init__(self, momentum=0.0, lazy_update=True, **kwargs):
        super(SGD, self).__init__(**kwargs)
        self.momentum = momentum
        self.lazy_update = lazy_update
        self.aggregate_num = int(os.getenv('MXNET_OPTIMIZER_AGGREGATION_SIZE', '4'))

    def create_state_multi_precision(self, index, weight):
        return self._mp_master_first_state(index, weight, 'SGD optimizer')

    def create_state(self, index, weight):
        if self.momentum != 0.0:
            stype = weight.stype if self.lazy_update else 'default'
            return zeros(weight.shape, weight.context, dtype=weight.dtype, stype=stype)
        return None

    def _update_impl(self, indices, weights, grads, states, multi_precision=False):
        if not isinstance(indices, (tuple, list)):
            indices, weights, grads, states = [indices], [weights], [grads], [states]
        aggregate = True
        for weight, grad in zip(weights, grads):
            if not (isinstance(weight, NDArray) and isinstance(grad, NDArray)):
                raise MXKVUsageError('SGD.update expects NDArrays')
            aggregate = aggregate and weight.stype == 'default' and grad.stype == 'default'
        self._update_count(indices)
        lrs = self._get_lrs(indices)
        wds = self._get_wds(indices)
        momentum = self.momentum if self.momentum > 0 else 0.0
        clip_g = self._clip_param()
        if aggregate:   # one multi_* operator for all: checked before any update
            _multi_sgd_args(weights, grads, states, multi_precision, self.momentum > 0)
            _check_fused_attrs(_sgd_fused_groups(weights, grads, states, multi_precision,
                                                 self.momentum > 0))
        for weight, grad, state, lr, wd in zip(weights, grads, states, lrs, wds):
            if multi_precision:   # state: (float32 momentum or None, float32 master copy)
                _mp_sgd_step(weight, grad, state, lr, wd, momentum, self.rescale_grad,
                             clip_g, aggregate, self.momentum > 0)
                continue
            if aggregate:
                _multi_sgd_update(weight, grad, state if self.momentum > 0 else None, lr, wd,
                                  momentum, self.rescale_grad, clip_g)
                continue
            _sgd_step(weight, grad, state, lr, wd, momentum, self.rescale_grad, clip_g,
                      self.lazy_update)


@register
class Signum(Optimizer):
    """Signum (sign of momentum) / signSGD (momentum 0)."""
    def __init__(self, learning_rate=0.01, momentum=0.9, wd_lh=0.0, **kwargs):
        super(Signum, self).__init__(learning_rate=learning_rate, **kwargs)
        self.momentum = momentum
        self.wd_lh = wd_lh

    def create_state(self, index, weight):
        if self.momentum != 0.0:
            return zeros(weight.shape, weight.context, dtype=weight.dtype, stype=weight.stype)
        return None

    def update(self, index, weight, grad, state):
        _assert_ndarrays(weight, grad)
        self._update_count(index)
        lr = self._get_lr(index)
        wd = self._get_wd(index)
        momentum = self.momentum if self.momentum > 0 else 0.0
        wd_lh = self.wd_lh if self.wd_lh else 0.0
        _op_args(('mom', state))
        with _StandIns(weight, state, False) as (w, st):  # no row_sparse kernel: fallback
            if st is not None:
                _signum_update(w, grad, st, lr, wd, momentum, self.rescale_grad,
                               self._clip_param(), wd_lh)
            else:
                _signsgd_update(w, grad, lr, wd, self.rescale_grad, self._clip_param())


@register
class NAG(Optimizer):
    """Nesterov accelerated gradient."""
    def __init__(self, momentum=0.0, **kwargs):
        super(NAG, self).__init__(**kwargs)
        self.momentum = momentum

    def create_state_multi_precision(self, index, weight):
        return self._mp_master_first_state(index, weight, 'NAG optimizer')

    def create_state(self, index, weight):
        if self.momentum != 0.0:
            return zeros(weight.shape, weight.context, dtype=weight.dtype)
        return None

    def update_multi_precision(self, index, weight, grad, state):
        if not (self._use_multi_precision(weight) and isinstance(state, (tuple, list))):
            self.update(index, weight, grad, state)
            return
        # mp_nag_mom_update / mp_sgd_update (dense kernels: sparse arrays take MXNet's
        # storage fallback); state = (float32 momentum or None, float32 master copy)
        _assert_ndarrays(weight, grad)
        self._update_count(index)
        lr = self._get_lr(index)
        wd = self._get_wd(index)
        momentum = self.momentum if self.momentum > 0 else 0.0
        _op_args(('mom', state[0]), ('weight32', state[1]))
        with _StandIns(weight, (state[0], state[1]), False) as (w, (mom, weight32)):
            if mom is not None:
                _mp_nag_mom_update(w, grad, weight32, mom, lr, wd, momentum,
                                   self.rescale_grad, self._clip_param())
            else:
                _mp_sgd_update(w, grad, weight32, None, lr, wd, 0.0, self.rescale_grad,
                               self._clip_param())

    def update(self, index, weight, grad, state):
        _assert_ndarrays(weight, grad)
        self._update_count(index)
        lr = self._get_lr(index)
        wd = self._get_wd(index)
        if state is not None:
            _op_args(('mom', state))
            with _StandIns(weight, state, False) as (w, st):  # nag_mom_update: fallback
                _nag_mom_update(w, grad, st, lr, wd,
                                self.momentum if self.momentum > 0 else 0.0,
                                self.rescale_grad, self._clip_param(),
                                out_is_weight=w is weight)
        else:
            grad = _csr_weight_grad(weight, grad)
            with _StandIns(weight, None, _is_rsp(grad), 'SGDUpdate') as (w, _):
                _sgd_update(w, grad, lr, wd, self.rescale_grad, self._clip_param())


@register
class Adam(Optimizer):
    """Adam; the bias correction is folded into the learning rate as in MXNet."""
    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 lazy_update=True, **kwargs):
        super(Adam, self).__init__(learning_rate=learning_rate, **kwargs)
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.lazy_update = lazy_update

    def create_state(self, index, weight):
        stype = weight.stype if self.lazy_update else 'default'
        return (zeros(weight.shape, weight.context, dtype=weight.dtype, stype=stype),  # mean
                zeros(weight.shape, weight.context, dtype=weight.dtype, stype=stype))  # var

    def update(self, index, weight, grad, state):
        _assert_ndarrays(weight, grad)
        self._update_count(index)
        lr = self._get_lr(index)
        wd = self._get_wd(index)
        t = self._index_update_count[index]
        coef1 = _sub(1., _pow(self.beta1, t))
        coef2 = _sub(1., _pow(self.beta2, t))
        lr = _mul(lr, math.sqrt(coef2) / coef1)
        mean, var = state
        _op_args(('mean', mean), ('var', var))
        grad = _csr_weight_grad(weight, grad)
        with _StandIns(weight, (mean, var), _is_rsp(grad), 'AdamUpdate') as (w, (mean, var)):
            _adam_update(w, grad, mean, var, lr, wd, self.beta1, self.beta2, self.epsilon,
                         self.rescale_grad, self._clip_param(), self.lazy_update)


@register
class AdaGrad(Optimizer):
    """AdaGrad (computed with elementwise NDArray operations, as MXNet does)."""
    def __init__(self, eps=1e-7, **kwargs):
        super(AdaGrad, self).__init__(**kwargs)
        self.float_stable_eps = eps

    def create_state(self, index, weight):
        return zeros(weight.shape, weight.context, stype=weight.stype)  # history

    def update(self, index, weight, grad, state):
        _assert_ndarrays(weight, grad)
        self._update_count(index)
        lr = self._get_lr(index)
        wd = self._get_wd(index)
        if _is_rsp(grad):
            _op_args(('history', state))   # sparse.adagrad_update(weight, grad, history)
            if weight.stype == 'csr':
                raise MXNetError('AdaGrad with a row_sparse gradient for a csr weight: '
                                 'MXNet 1.9.1 has no _sparse_adagrad_update kernel for it')
            if dmlc_float(wd) != 0 or state.stype != weight.stype:
                raise MXNetError('AdaGrad with a row_sparse gradient needs wd = 0 and a '
                                 'history of the weight\'s storage type: MXNet 1.9.1 has no '
                                 '_sparse_adagrad_update kernel otherwise (wd=%s, weight %s, '
                                 'history %s)' % (wd, weight.stype, state.stype))
            with _StandIns(weight, state, True, 'AdagradUpdate') as (w, history):
                rows = _rsp_rows(w, grad, history)
                _sparse_adagrad_update(w, grad, history, rows, lr, wd,
                                       self.float_stable_eps, self.rescale_grad,
                                       self._clip_param())
            return
        if weight.stype == 'default' and getattr(state, 'stype', None) == 'default':
            if np.dtype(grad.dtype) != np.dtype(state.dtype):   # history[:] += square(grad)
                raise _type_error(1, state.dtype, grad.dtype)
        history = state   # (not an NDArray: `history[:] += ...` raises MXNet's TypeError)
        grad = grad * self.rescale_grad
        if self.clip_gradient is not None:
            grad = clip(grad, -self.clip_gradient, self.clip_gradient)
        history[:] += square(grad)
        div = grad / sqrt(history + self.float_stable_eps)
        if isinstance(weight, NDArray) and np.dtype(weight.dtype) != np.dtype(div.dtype):
            raise _type_error(1, div.dtype, weight.dtype)   # div + weight * wd (history written)
        weight[:] += (div + weight * wd) * -lr


@register
class RMSProp(Optimizer):
    """RMSProp (Tieleman & Hinton), or Graves' centered version with centered=True."""
    def __init__(self, learning_rate=0.001, gamma1=0.9, gamma2=0.9, epsilon=1e-8,
                 centered=False, clip_weights=None, **kwargs):
        super(RMSProp, self).__init__(learning_rate=learning_rate, **kwargs)
        self.gamma1 = gamma1
        self.gamma2 = gamma2
        self.centered = centered
        self.epsilon = epsilon
        self.clip_weights = clip_weights

    def create_state(self, index, weight):
        stype = weight.stype
        if self.centered:
            return (zeros(weight.shape, weight.context, stype=stype),   # n
                    zeros(weight.shape, weight.context, stype=stype),   # g
                    zeros(weight.shape, weight.context, stype=stype))   # delta
        return (zeros(weight.shape, weight.context, stype=stype),)      # n

    def update(self, index, weight, grad, state):
        _assert_ndarrays(weight, grad)
        self._update_count(index)
        lr = self._get_lr(index)
        wd = self._get_wd(index)
        clip_w = self.clip_weights if self.clip_weights else -1.0
        with _StandIns(weight, state, False) as (w, st):  # no row_sparse kernel: fallback
            if not self.centered:
                (n,) = st
                _rmsprop_update(w, grad, n, lr, wd, self.gamma1, self.epsilon,
                                self.rescale_grad, self._clip_param(), clip_w)
            else:
                n, g, delta = st
                _rmspropalex_update(w, grad, n, g, delta, lr, wd, self.gamma1, self.gamma2,
                                    self.epsilon, self.rescale_grad, self._clip_param(),
                                    clip_w)


@register
class AdaDelta(Optimizer):
    """AdaDelta (elementwise NDArray operations, as MXNet does; note that like MXNet it
    rescales the gradient array in place)."""
    def __init__(self, rho=0.90, epsilon=1e-5, **kwargs):
        super(AdaDelta, self).__init__(**kwargs)
        self.rho = rho
        self.epsilon = epsilon

    def create_state(self, index, weight):
        return (zeros(weight.shape, weight.context),   # accumulated g
                zeros(weight.shape, weight.context))   # accumulated delta

    def update(self, index, weight, grad, state):
        _assert_ndarrays(weight, grad)
        wd = self._get_wd(index)
        self._update_count(index)
        grad *= self.rescale_grad
        if self.clip_gradient is not None:
            grad = clip(grad, -self.clip_gradient, self.clip_gradient)
        acc_g, acc_delta = state
        acc_g[:] *= self.rho
        if isinstance(acc_g, NDArray) and np.dtype(acc_g.dtype) != np.dtype(grad.dtype):
            raise _type_error(1, acc_g.dtype, grad.dtype)   # acc_g[:] += ... * grad * grad
        acc_g[:] += (1. - self.rho) * grad * grad
        current_delta = sqrt(acc_delta + self.epsilon) / sqrt(acc_g + self.epsilon) * grad
        acc_delta[:] *= self.rho
        acc_delta[:] += (1. - self.rho) * current_delta * current_delta
        if isinstance(weight, NDArray) and np.dtype(weight.dtype) != np.dtype(current_delta.dtype):
            raise _type_error(1, current_delta.dtype, weight.dtype)  # (states written, as MXNet)
        weight[:] -= current_delta + wd * weight


@register
class Ftrl(Optimizer):
    """FTRL-Proximal (McMahan et al., *Ad Click Prediction: a View from the Trenches*)::

        rescaled_grad = clip(grad * rescale_grad, clip_gradient)
        z += rescaled_grad - (sqrt(n + rescaled_grad**2) - sqrt(n)) * weight / learning_rate
        n += rescaled_grad**2
        w = (sign(z) * lamda1 - z) / ((beta + sqrt(n)) / learning_rate + wd) * (abs(z) > lamda1)

    MXNet's ftrl_update kernel; with a row_sparse weight, gradient and states (z and n take
    the weight's storage type) only the gradient's rows are updated.  z and n are float32
    whatever the weight's dtype, as in MXNet (other weight dtypes are refused)."""
    def __init__(self, lamda1=0.01, learning_rate=0.1, beta=1, **kwargs):
        super(Ftrl, self).__init__(**kwargs)
        self.lamda1 = lamda1
        self.beta = beta
        self.lr = learning_rate

    def create_state(self, index, weight):
        return (zeros(weight.shape, weight.context, stype=weight.stype),  # z
                zeros(weight.shape, weight.context, stype=weight.stype))  # n

    def update(self, index, weight, grad, state):
        _assert_ndarrays(weight, grad)
        self._update_count(index)
        wd = self._get_wd(index)
        lr = self._get_lr(index)
        z, n = state
        _op_args(('z', z), ('n', n))
        # MXNet's row_sparse kernel needs every input row_sparse; anything else is its
        # storage fallback (the dense kernel on dense copies)
        kernel = _is_rsp(weight) and _is_rsp(grad) and _is_rsp(z) and _is_rsp(n)
        if _is_rsp(weight) and (z.stype != weight.stype or n.stype != weight.stype):
            raise MXNetError('Inconsistent storage type detected between z.stype = %s, '
                             'n.stype = %s and weight.stype = %s'
                             % (z.stype, n.stype, weight.stype))
        with _StandIns(weight, state, kernel, 'FtrlUpdate') as (w, (sz, sn)):
            rows = _rsp_rows(w, grad, sz, sn) if kernel else None
            _ftrl_update(w, grad, sz, sn, lr, wd, self.lamda1, self.beta, self.rescale_grad,
                         self._clip_param(), lazy_rows=rows)


@register
class FTML(Optimizer):
    """FTML, *Follow the Moving Leader in Deep Learning* (Zheng & Kwok)::

        rescaled_grad = clip(grad * rescale_grad + wd * weight, clip_gradient)
        v = beta2 * v + (1 - beta2) * square(rescaled_grad)
        d_t = (1 - power(beta1, t)) / lr * (square_root(v / (1 - power(beta2, t))) + epsilon)
        z = beta1 * z + (1 - beta1) * rescaled_grad - (d_t - beta1 * d_(t-1)) * weight
        weight = - z / d_t

    MXNet's ftml_update kernel (dense only: row_sparse inputs take its storage fallback)."""
    def __init__(self, beta1=0.6, beta2=0.999, epsilon=1e-8, **kwargs):
        super(FTML, self).__init__(**kwargs)
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon

    def create_state(self, index, weight):
        return (zeros(weight.shape, weight.context, dtype=weight.dtype),  # d_0
                zeros(weight.shape, weight.context, dtype=weight.dtype),  # v_0
                zeros(weight.shape, weight.context, dtype=weight.dtype))  # z_0

    def update(self, index, weight, grad, state):
        _assert_ndarrays(weight, grad)
        self._update_count(index)
        lr = self._get_lr(index)
        wd = self._get_wd(index)
        t = self._index_update_count[index]
        with _StandIns(weight, state, False) as (w, (d, v, z)):
            _ftml_update(w, grad, d, v, z, lr, wd, self.beta1, self.beta2, self.epsilon, t,
                         self.rescale_grad, self._clip_param())


@register
class Adamax(Optimizer):
    """AdaMax (Kingma & Ba, section 7), with NDArray operations as MXNet::

        grad = clip(grad * rescale_grad + wd * weight, clip_gradient)
        m = beta1 * m + (1 - beta1) * grad
        u = maximum(beta2 * u, abs(grad))
        weight -= lr / (1 - beta1**t) * m / u
    """
    def __init__(self, learning_rate=0.002, beta1=0.9, beta2=0.999, **kwargs):
        super(Adamax, self).__init__(learning_rate=learning_rate, **kwargs)
        self.beta1 = beta1
        self.beta2 = beta2

    def create_state(self, index, weight):
        return (zeros(weight.shape, weight.context, dtype=weight.dtype),  # mean
                zeros(weight.shape, weight.context, dtype=weight.dtype))  # variance

    def update(self, index, weight, grad, state):
        _assert_ndarrays(weight, grad)
        self._update_count(index)
        lr = self._get_lr(index)
        wd = self._get_wd(index)
        t = self._index_update_count[index]
        lr = _div(lr, _sub(1., _pow(self.beta1, t)))
        grad = grad * self.rescale_grad + wd * weight
        if self.clip_gradient is not None:
            grad = clip(grad, -self.clip_gradient, self.clip_gradient)
        m_t, u_t = state
        m_t[:] *= self.beta1
        m_t[:] += _sub(1., self.beta1) * grad
        u_t[:] = maximum(self.beta2 * u_t, nd_abs(grad))
        step = lr * m_t / u_t
        _check_store_sparse_write(weight, step)
        weight[:] -= step


@register
class Nadam(Optimizer):
    """Nesterov Adam (Dozat), with NDArray operations as MXNet; the momentum schedule
    (``m_schedule``) is one value for the optimizer, shared by all weights, as there."""
    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 schedule_decay=0.004, **kwargs):
        super(Nadam, self).__init__(learning_rate=learning_rate, **kwargs)
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.schedule_decay = schedule_decay
        self.m_schedule = 1.

    def create_state(self, index, weight):
        return (zeros(weight.shape, weight.context, dtype=weight.dtype),  # mean
                zeros(weight.shape, weight.context, dtype=weight.dtype))  # variance

    def update(self, index, weight, grad, state):
        _assert_ndarrays(weight, grad)
        self._update_count(index)
        lr = self._get_lr(index)
        wd = self._get_wd(index)
        t = self._index_update_count[index]
        grad = grad * self.rescale_grad + wd * weight
        if self.clip_gradient is not None:
            grad = clip(grad, -self.clip_gradient, self.clip_gradient)
        # warming momentum schedule
        momentum_t = _mul(self.beta1, 1. - 0.5 * (pow(0.96, t * self.schedule_decay)))
        momentum_t_1 = _mul(self.beta1, 1. - 0.5 * (pow(0.96, (t + 1) * self.schedule_decay)))
        self.m_schedule = self.m_schedule * momentum_t
        m_schedule_next = self.m_schedule * momentum_t_1
        m_t, v_t = state
        m_t[:] *= self.beta1
        m_t[:] += _sub(1., self.beta1) * grad
        v_t[:] *= self.beta2
        v_t[:] += _sub(1., self.beta2) * grad * grad
        grad_prime = grad / (1. - self.m_schedule)
        m_t_prime = m_t / (1. - m_schedule_next)
        v_t_prime = v_t / _sub(1., _pow(self.beta2, t))
        m_t_bar = (1. - momentum_t) * grad_prime + momentum_t_1 * m_t_prime
        step = lr * m_t_bar / (sqrt(v_t_prime) + self.epsilon)
        _check_store_sparse_write(weight, step)
        weight[:] -= step


@register
class DCASGD(Optimizer):
    """Delay-compensated asynchronous SGD (Zheng et al.), NDArray operations as MXNet.

    As in MXNet 1.9.1, ``momentum != 0`` fails at the first update (its ``if mom:`` takes
    the truth value of the momentum array: ambiguous for more than one element, and a
    zero one-element momentum then fails ``assert self.momentum == 0.0``)."""
    def __init__(self, momentum=0.0, lamda=0.04, **kwargs):
        super(DCASGD, self).__init__(**kwargs)
        self.momentum = momentum
        self.weight_previous = {}
        self.lamda = lamda

    def create_state(self, index, weight):
        if self.momentum == 0.0:
            return (None, weight.copy())  # previous weight
        return (zeros(weight.shape, weight.context, dtype=weight.dtype),  # momentum
                weight.copy())  # previous weight

    def update(self, index, weight, grad, state):
        _assert_ndarrays(weight, grad)
        self._update_count(index)
        lr = self._get_lr(index)
        wd = self._get_wd(index)
        grad = grad * self.rescale_grad
        if self.clip_gradient is not None:
            grad = clip(grad, -self.clip_gradient, self.clip_gradient)
        mom, previous_weight = state
        if mom:
            mom[:] *= self.momentum
            mom[:] += -lr * (grad + wd * weight + self.lamda
                             * grad * grad * (weight - previous_weight))
        else:
            if self.momentum != 0.0:
                raise AssertionError('DCASGD: a momentum state that is all zeros with '
                                     'momentum=%r (MXNet 1.9.1 fails the same assert)'
                                     % (self.momentum,))
            mom = -lr * (grad + wd * weight + self.lamda
                         * grad * grad * (weight - previous_weight))
        previous_weight[:] = weight
        _check_store_sparse_write(weight, mom)
        weight[:] += mom


@register
class SGLD(Optimizer):
    """Stochastic Gradient Langevin Dynamics::

        weight += -lr/2 * (clip(grad * rescale_grad, clip_gradient) + wd * weight)
        weight += normal(0, sqrt(lr))

    MXNet's bits: the deterministic step is MXNet's arithmetic and the noise comes from
    :func:`mxkv.random.normal`, which draws MXNet's numbers on CPU contexts (seeded by
    ``mxkv.random.seed``, or as an unseeded MXNet process)."""
    def __init__(self, **kwargs):  # pylint: disable=useless-super-delegation
        super(SGLD, self).__init__(**kwargs)

    def create_state(self, index, weight):
        return None

    def update(self, index, weight, grad, state):
        _assert_ndarrays(weight, grad)
        self._update_count(index)
        lr = self._get_lr(index)
        wd = self._get_wd(index)
        failed = None
        try:
            grad = grad * self.rescale_grad
            if self.clip_gradient is not None:
                grad = clip(grad, -self.clip_gradient, self.clip_gradient)
            step = - lr/2 * (grad + wd * weight)
            _check_store_sparse_write(weight, step)
            weight[:] += step
        except MXNetError as exc:
            if isinstance(exc, MXKVUsageError) or getattr(exc, 'mxkv_inference_failure',
                                                          False):
                # (a type or shape inference failure, e.g. a weight and gradient of two
                # dtypes: MXNet raises it from the operator call, before the noise)
                raise
            # an operator's failure (MXNet reports it at the next wait, mxkv now): the
            # noise is drawn all the same, as MXNet's random operator does not wait on it
            failed = exc
        noise = normal(0, math.sqrt(lr), shape=weight.shape, dtype=weight.dtype,
                       ctx=weight.context)
        if failed is not None:
            raise failed
        _check_store_sparse_write(weight, noise)
        weight[:] += noise


@register
class LAMB(_KernelUpdates):
    """LAMB (You et al., *Large Batch Optimization for Deep Learning*): Adam-style moments,
    the step scaled by ||weight|| / ||update|| per tensor (``lower_bound``/``upper_bound``
    clamp ||weight||).  MXNet's multi_lamb_update kernel, which its Updater uses for lists
    of indices (``MXNET_OPTIMIZER_AGGREGATION_SIZE`` >= 2, the default 45), for float32,
    float64 and float16 weights; one index at a time, lamb_update_phase1/2 and the norms
    between them (float32, float64 and float16).  row_sparse and csr arrays take the
    storage fallback; with multi_precision, float16 weights take MXNet's mp kernels."""
    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-6,
                 lower_bound=None, upper_bound=None, bias_correction=True, **kwargs):
        super(LAMB, self).__init__(learning_rate=learning_rate, **kwargs)
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.lower_bound = lower_bound
        self.upper_bound = upper_bound
        self.bias_correction = bias_correction
        self.aggregate_num = max(1, min(45, int(os.getenv('MXNET_OPTIMIZER_AGGREGATION_SIZE',
                                                          '45'))))

    def create_state(self, index, weight):
        stype = weight.stype
        dtype = weight.dtype
        return (zeros(weight.shape, weight.context, dtype=dtype, stype=stype),
                zeros(weight.shape, weight.context, dtype=dtype, stype=stype))

    def _update_impl(self, index, weight, grad, state, multi_precision=False):
        """state: (mean, var), or with multi_precision (float32 master copy, (mean,
        var)), all float32 then"""
        lower = self.lower_bound if self.lower_bound else -1.0
        upper = self.upper_bound if self.upper_bound else -1.0
        if self.aggregate_num <= 1 or not isinstance(index, (tuple, list)):
            if isinstance(index, (tuple, list)):
                if len(index) != self.aggregate_num:
                    raise AssertionError('LAMB: %d indices with aggregate_num %d'
                                         % (len(index), self.aggregate_num))
                index, weight, grad, state = index[0], weight[0], grad[0], state[0]
            _assert_ndarrays(weight, grad)
            self._update_count(index)
            lr = self._get_lr(index)
            wd = self._get_wd(index)
            t = self._index_update_count[index]
            if multi_precision:
                mean, var = state[1]
                weight32 = state[0]
                _op_args(('mean', mean), ('var', var), ('weight32', weight32))
                # mp_lamb_update_phase1/2, r1 = weight32.norm() (dense kernels: sparse
                # arrays take MXNet's storage fallback)
                with _StandIns(weight, (weight32, (mean, var)), False) as \
                        (w, (weight32, (mean, var))):
                    _mp_lamb_update_phases(w, grad, mean, var, weight32, lr, wd, t,
                                           self.beta1, self.beta2, self.epsilon,
                                           self.rescale_grad, self._clip_param(),
                                           self.bias_correction, lower, upper)
                return
            mean, var = state
            _op_args(('mean', mean), ('var', var))
            state = (mean, var)
            if weight.stype != 'default' and weight.dtype == np.float16:
                # MXNet runs phase 1 (mean and var written), then weight.norm() fails
                # (no float16 kernel for a sparse norm): the weight stays as it was
                with _StandIns(weight.copy(), state, False) as (w, (mean, var)):
                    _lamb_update_phases(w, grad, mean, var, lr, wd, t, self.beta1,
                                        self.beta2, self.epsilon, self.rescale_grad,
                                        self._clip_param(), self.bias_correction, lower,
                                        upper, weight_norm=0)
                _sparse_norm(weight)
            # r1 = weight.norm(): a sparse weight's norm is taken from its stored values
            r1 = _sparse_norm(weight) if weight.stype != 'default' else None
            with _StandIns(weight, state, False) as (w, (mean, var)):
                _lamb_update_phases(w, grad, mean, var, lr, wd, t, self.beta1, self.beta2,
                                    self.epsilon, self.rescale_grad, self._clip_param(),
                                    self.bias_correction, lower, upper, weight_norm=r1)
            return
        for i, w_i, g_i in zip(index, weight, grad):
            _assert_ndarrays(w_i, g_i)
            self._update_count(i)
        steps = [self._index_update_count[i] for i in index]
        lrs = [self._get_lr(i) for i in index]
        wds = [self._get_wd(i) for i in index]
        for sidx in range(0, len(weight), self.aggregate_num):
            eidx = min(sidx + self.aggregate_num, len(weight))
            chunk = state[sidx:eidx]
            # the states as MXNet's multi_(mp_)lamb_update gets them from its Python
            if multi_precision:
                temp = list(zip(*list(zip(*chunk))[1]))
                means, variances = temp[0], temp[1]
                weights32 = list(zip(*chunk))[0]
                columns = (weight[sidx:eidx], grad[sidx:eidx], means, variances, weights32)
            else:
                means, variances = list(zip(*chunk))
                weights32 = [None] * (eidx - sidx)
                columns = (weight[sidx:eidx], grad[sidx:eidx], means, variances)
            args = _flatten_list(zip(*columns))
            _op_positional(args)
            if len(args) != len(columns) * (eidx - sidx):
                raise MXNetError('Check failed: num_inputs == infered_num_inputs (%d vs. %d)'
                                 ' : Operator _multi_%slamb_update expects %d inputs, but '
                                 'got %d instead.' % (len(args), len(columns) * (eidx - sidx),
                                                      'mp_' if multi_precision else '',
                                                      len(columns) * (eidx - sidx),
                                                      len(args)))
            mp32 = np.float32 if multi_precision else None
            _check_fused_attrs([[(w_i, None), (g_i, None), (mean, mp32), (var, mp32)]
                                + ([(w32, np.float32)] if multi_precision else [])
                                for w_i, g_i, mean, var, w32 in zip(
                                    weight[sidx:eidx], grad[sidx:eidx], means, variances,
                                    weights32)])
            for k, (w_i, g_i, mean, var, weight32) in enumerate(zip(
                    weight[sidx:eidx], grad[sidx:eidx], means, variances, weights32)):
                step, lr, wd = steps[sidx + k], lrs[sidx + k], wds[sidx + k]
                with _StandIns(w_i, (weight32, (mean, var)), False) as \
                        (w, (weight32, (mean, var))):
                    _multi_lamb_update(w, g_i, mean, var, lr, wd, step, self.beta1,
                                       self.beta2, self.epsilon, self.rescale_grad,
                                       self._clip_param(), self.bias_correction, lower,
                                       upper, weight32=weight32)


@register
class LARS(_KernelUpdates):
    """LARS (You et al., *Large Batch Training of Convolutional Networks*): SGD with
    momentum whose learning rate is scaled per layer by
    ``eta * ||w|| / (||g|| + wd * ||w|| + eps)`` (not for names ending in gamma, beta or
    bias).  Dense weights and gradients take MXNet's aggregated path (multi_sum_sq,
    multi_lars, preloaded_multi_sgd(_mom)_update); row_sparse ones its per-weight path
    (NDArray.norm, sgd_update / sgd_mom_update)."""
    def __init__(self, momentum=0.0, lazy_update=True, eta=0.001, eps=0,
                 momentum_correction=True, **kwargs):
        super(LARS, self).__init__(**kwargs)
        self.momentum = momentum
        self.momentum_correction = momentum_correction
        self.lazy_update = lazy_update
        self.aggregate_num = int(os.getenv('MXNET_OPTIMIZER_AGGREGATION_SIZE', '4'))
        self.eta = eta
        self.eps = eps
        self.skip = 0
        self.last_lr = None
        self.cur_lr = None

    def _get_lrs(self, indices):
        if self.cur_lr is not None:
            self.last_lr = self.cur_lr
        lr = self.lr_scheduler(self.num_update) if self.lr_scheduler is not None else self.lr
        if self.cur_lr is None:
            self.last_lr = lr
        self.cur_lr = lr
        lrs = [lr for _ in indices]
        for i, index in enumerate(indices):
            if index in self.param_dict:
                lrs[i] = _mul(lrs[i], self.param_dict[index].lr_mult)
            elif index in self.lr_mult:
                lrs[i] = _mul(lrs[i], self.lr_mult[index])
            elif index in self.idx2name:
                lrs[i] = _mul(lrs[i], self.lr_mult.get(self.idx2name[index], 1.0))
        return lrs

    def set_wd_mult(self, args_wd_mult):
        """Per-parameter weight-decay multipliers (names not ending in _weight get 0)."""
        self.wd_mult = {}
        for name in self.idx2name.values():
            if not name.endswith('_weight'):
                self.wd_mult[name] = 0.0
        self.wd_mult.update(args_wd_mult)

    def create_state_multi_precision(self, index, weight):
        return self._mp_master_first_state(index, weight, 'SGD optimizer')

    def create_state(self, index, weight):
        if self.momentum != 0.0:
            stype = weight.stype if self.lazy_update else 'default'
            return zeros(weight.shape, weight.context, dtype=weight.dtype, stype=stype)
        return None

    def _l2norm(self, v, rescale=False):
        v = v.astype('float32')
        if rescale:
            v *= self.rescale_grad
        if v.stype in ('row_sparse', 'csr'):
            return _sparse_norm(v)
        return _nrm2(v.asnumpy())

    def _aggregated_chunks(self, indices):
        """MXNet's dense path: the positions in `indices`, LARS ones first, in slices
        [s:s + aggregate_num], one preloaded_multi_(mp_)sgd(_mom)_update each; an empty
        slice (any aggregate_num <= 0 comes to one) is the last (the operator raises)"""
        order = [p for p, i in enumerate(indices) if not self._no_lars(i)] + \
            [p for p, i in enumerate(indices) if self._no_lars(i)]
        sidx = 0
        while sidx < len(order):
            chunk = order[sidx:sidx + self.aggregate_num]
            yield chunk
            if not chunk:
                return
            sidx += len(chunk)

    def _no_lars(self, index):
        name = self.idx2name[index] if index in self.idx2name else str(index)
        return name.endswith('gamma') or name.endswith('beta') or name.endswith('bias')

    def _get_lars(self, i, weight, g, lr, wd):
        if self._no_lars(i):
            return lr
        w_norm = self._l2norm(weight)
        g_norm = self._l2norm(g, rescale=True)
        if w_norm > 0.0 and g_norm > 0.0:
            # MXNet's numpy 1.x computes a float32 scalar op a Python float in double;
            # numpy 2 (NEP 50) would keep float32: the doubles are spelled out
            w_norm, g_norm = float(w_norm), float(g_norm)
            lars = np.float64(self.eta * w_norm / (g_norm + wd * w_norm + self.eps))
        else:
            lars = 1.0
        return lars * lr

    def _update_impl(self, indices, weights, grads, states, multi_precision=False):
        if not isinstance(indices, (tuple, list)):
            indices, weights, grads, states = [indices], [weights], [grads], [states]
        aggregate = True
        for weight, grad in zip(weights, grads):
            if not (isinstance(weight, NDArray) and isinstance(grad, NDArray)):
                raise MXKVUsageError('LARS.update expects NDArrays')
            aggregate = aggregate and weight.stype == 'default' and grad.stype == 'default'
        self._update_count(indices)
        lrs = self._get_lrs(indices)
        wds = self._get_wds(indices)
        momentum = 0.0
        if self.momentum > 0:
            momentum = (self.momentum * (self.cur_lr / self.last_lr)) \
                if (self.momentum_correction and self.last_lr != 0) else self.momentum
        clip_g = self._clip_param()
        if aggregate:
            # multi_sum_sq of the LARS weights and of their gradients (each one dtype),
            # then one preloaded_multi_* operator per chunk, each checked before it writes
            lars_pos = [p for p, i in enumerate(indices) if not self._no_lars(i)]
            if lars_pos:
                _check_fused_attrs([], ([weights[p] for p in lars_pos],
                                        [grads[p] for p in lars_pos]))
            for chunk in self._aggregated_chunks(indices):
                _multi_sgd_args([weights[p] for p in chunk], [grads[p] for p in chunk],
                                [states[p] for p in chunk], multi_precision,
                                self.momentum > 0)
                _check_fused_attrs(_sgd_fused_groups(
                    [weights[p] for p in chunk], [grads[p] for p in chunk],
                    [states[p] for p in chunk], multi_precision, self.momentum > 0))
                if not chunk:
                    raise MXNetError(
                        'Check failed: dim_size_is_known(*it): Shape dim size cannot be a '
                        'negative value -1 (as in MXNet 1.9.1: with MXNET_OPTIMIZER_'
                        'AGGREGATION_SIZE=%d, LARS calls preloaded_multi_sgd%s_update on no '
                        'arrays for its dense weights)'
                        % (self.aggregate_num, '_mom' if self.momentum > 0 else ''))
                self._aggregated_update(chunk, indices, weights, grads, states, lrs, wds,
                                        momentum, clip_g, multi_precision)
            return
        lrs = [self._get_lars(i, w, g, lr, wd)
               for (i, w, g, lr, wd) in zip(indices, weights, grads, lrs, wds)]
        for weight, grad, state, lr, wd in zip(weights, grads, states, lrs, wds):
            if multi_precision:
                _mp_sgd_step(weight, grad, state, lr, wd, momentum, self.rescale_grad,
                             clip_g, False, self.momentum > 0)
                continue
            _sgd_step(weight, grad, state, lr, wd, momentum, self.rescale_grad, clip_g,
                      self.lazy_update)

    def _aggregated_update(self, chunk, indices, weights, grads, states, lrs, wds,
                           momentum, clip_g, multi_precision):
        """one preloaded_multi_(mp_)sgd(_mom)_update: the positions `chunk` of the lists"""
        f32 = np.float32
        for pos in chunk:
            index, weight, grad, state, lr, wd = (indices[pos], weights[pos], grads[pos],
                                                  states[pos], lrs[pos], wds[pos])
            lr32, wd32 = f32(lr), f32(wd)
            if not self._no_lars(index):
                # multi_sum_sq of the weight and the raw gradient, then MultiLARSKernel
                _check_dense(weight, grad)
                w_sum = _sum_sq(weight._arith_view())
                g_sum = _sum_sq(grad._arith_view())
                eta = f32(dmlc_float(self.eta))
                eps = f32(dmlc_float(self.eps))
                rescale = f32(dmlc_float(self.rescale_grad))
                with _errstate():
                    w_norm = np.sqrt(w_sum)
                    if w_norm > 0. and g_sum > 0.:
                        lr32 = lr32 * eta * w_norm / (np.sqrt(g_sum) * rescale
                                                      + wd32 * w_norm + eps)
            if multi_precision:
                _mp_sgd_step(weight, grad, state, lr32, wd32, momentum,
                             self.rescale_grad, clip_g, True, self.momentum > 0,
                             preloaded=True)
                continue
            _preloaded_multi_sgd(weight, grad, state if self.momentum > 0 else None,
                                 lr32, wd32, momentum, self.rescale_grad, clip_g)


@register
class LBSGD(Optimizer):
    """Large-batch SGD (MXNet's LBSGD): gradients are accumulated per index over
    ``batch_scale`` updates, then one sgd_update / sgd_mom_update step is made with the
    learning rate scaled by a warm-up multiplier (``warmup_strategy`` 'linear', 'power2',
    'sqrt') or by LARS ('lars'); the updates in between are sgd_update with lr = 0.  As in
    MXNet, the accumulated gradient holds the gradient arrays the updater was given."""
    def __init__(self, momentum=0.0, multi_precision=False, warmup_strategy='linear',
                 warmup_epochs=5, batch_scale=1, updates_per_epoch=32, begin_epoch=0,
                 num_epochs=60, **kwargs):
        super(LBSGD, self).__init__(**kwargs)
        # MXNet logs through the root logger (logging.info), which configures logging
        # (basicConfig) as a side effect when nothing has; a module logger does not
        log = logging.getLogger(__name__)
        log.info('Running Large-Batch SGD Algorithm')
        log.info('(Batch_scale=%f, warmup_epochs=%d, warmup_strategy=%s, updates_per_epoch=%d)',
                 batch_scale, warmup_epochs, warmup_strategy, updates_per_epoch)
        self.momentum = momentum
        self.multi_precision = multi_precision
        self.warmup_strategy = warmup_strategy
        self.warmup_epochs = warmup_epochs
        self.batch_scale = batch_scale
        self.updates_per_epoch = updates_per_epoch
        self.init_updates = begin_epoch * updates_per_epoch
        self.num_epochs = num_epochs
        self.lbmult = 1
        self.cumgrads = {}
        self.adaptive = False
        self.admult = 1

    def create_state(self, index, weight):
        if self.momentum != 0.0:
            return zeros(weight.shape, weight.context, dtype=weight.dtype, stype=weight.stype)
        return None

    def _get_lbmult(self, nup):
        nwup = self.warmup_epochs * self.updates_per_epoch
        strategy = self.warmup_strategy
        maxmult = float(self.batch_scale)
        if nup >= nwup:
            mult = maxmult
        elif nwup <= 1:
            mult = 1.0
        else:
            if strategy == 'linear':
                mult = 1.0 + (maxmult - 1) * nup / nwup
            elif strategy == 'power2':
                mult = 1.0 + (maxmult-1) * (nup*nup)/(nwup*nwup)
            elif strategy == 'sqrt':
                mult = 1.0 + (maxmult - 1) * math.sqrt(float(nup) / nwup)
            else:
                mult = 1.0
        return mult

    def _get_lars(self, weight, g, wd):
        # float32 / float16 sums, then double arithmetic as numpy 1.x (MXNet's) promotes
        # them with Python floats (numpy 2 would keep their dtype: NEP 50)
        weight2 = float(self._l2norm(weight))
        grad2 = float(self._l2norm(g))
        lars = math.sqrt(weight2 / (grad2 + wd * weight2 + 1e-18))
        if lars < 0.01:
            lars = 0.01
        elif lars > 100:
            lars = 100
        return lars

    def _l2norm(self, v):
        # MXNet: multiply(v, v).asnumpy().sum(), the sum of its numpy 1.x
        return numpy1_sum(multiply(v, v).asnumpy())

    def _reset_cum_gradient(self, index):
        self.cumgrads[index]['cum_grad'] = 0

    def _get_cum_gradient(self, index):
        if index in self.cumgrads:
            return self.cumgrads[index]
        return {}

    def _put_cum_gradient(self, index, cgrad):
        self.cumgrads[index] = cgrad

    def _cumulate_gradient(self, grad, index):
        cgrad = self._get_cum_gradient(index)
        if cgrad and cgrad['num_cums'] > 0:
            cum_grad = cgrad['cum_grad'] + grad
            num_cums = cgrad['num_cums'] + 1
        else:
            cum_grad = grad
            num_cums = self.init_updates + 1
        cgrad = {'cum_grad': cum_grad, 'num_cums': num_cums}
        self._put_cum_gradient(index, cgrad)
        return cgrad

    def update(self, index, weight, grad, state):
        _assert_ndarrays(weight, grad)
        lr = self._get_lr(index)
        wd = self._get_wd(index)
        self._update_count(index)
        cgrad = self._cumulate_gradient(grad, index)
        if (cgrad['num_cums'] % self.batch_scale) == 0:
            grad = cgrad['cum_grad'] / self.batch_scale
            if self.warmup_strategy == 'lars':
                lbmult = self._get_lars(weight, grad, wd)
            else:
                lbmult = self._get_lbmult(cgrad['num_cums'])
            lr = _mul(lr, lbmult)
            momentum = self.momentum if self.momentum > 0 else 0.0
            clip_g = self._clip_param()
            if isinstance(state, (list, tuple)):
                self._mp_step(weight, grad, state, lr, wd, momentum, clip_g)
                self._reset_cum_gradient(index)
                return
            _op_args(('mom', state))
            func = 'SGDMomUpdate' if state is not None else 'SGDUpdate'
            grad = _csr_weight_grad(weight, grad)
            with _StandIns(weight, state, _is_rsp(grad), func) as (w, st):
                if st is not None:
                    _sgd_mom_update(w, grad, st, lr, wd, momentum, self.rescale_grad, clip_g)
                else:
                    _sgd_update(w, grad, lr, wd, self.rescale_grad, clip_g)
            self._reset_cum_gradient(index)
        else:
            grad = _csr_weight_grad(weight, grad)
            with _StandIns(weight, None, _is_rsp(grad), 'SGDUpdate') as (w, _):
                _sgd_update(w, grad, 0.0, wd, 1.0, -1.0)

    def _mp_step(self, weight, grad, state, lr, wd, momentum, clip_g):
        """MXNet's LBSGD.update takes any tuple state for (momentum or None, float32
        master copy): mp_sgd_mom_update / mp_sgd_update (dense kernels: sparse arrays take
        the storage fallback).  Its own multi-precision states never come here (they are
        the base class's (master copy, momentum), whose update gets the momentum alone),
        but states loaded from another optimizer may."""
        mom, weight32 = state[0], state[1]
        _op_args(('mom', mom), ('weight32', weight32))
        if weight32 is None:   # the operator function leaves None out
            name, expected = ('mp_sgd_mom_update', 4) if mom is not None else \
                ('mp_sgd_update', 3)
            raise MXNetError('Check failed: num_inputs == infered_num_inputs (%d vs. %d) : '
                             'Operator %s expects %d inputs, but got %d instead.'
                             % (expected - 1, expected, name, expected, expected - 1))
        with _StandIns(weight, (mom, weight32), False) as (w, (st_mom, st_w32)):
            _mp_sgd_update(w, grad, st_w32, st_mom, lr, wd, momentum, self.rescale_grad,
                           clip_g)


@register
class ccSGD(SGD):  # pylint: disable=invalid-name
    """[DEPRECATED] Same as `SGD` (MXNet keeps it for backward compatibility)."""
    def __init__(self, *args, **kwargs):  # pylint: disable=useless-super-delegation
        super(ccSGD, self).__init__(*args, **kwargs)


@register
class Test(Optimizer):
    """weight += rescale_grad * grad; state = weight (for tests)."""
    def create_state(self, index, weight):
        return zeros(weight.shape, weight.context)

    def update(self, index, weight, grad, state):
        step = grad * self.rescale_grad
        _check_store_sparse_write(weight, step)
        weight[:] += step
        state[:] = weight


class Updater(object):
    """The callable a KVStore calls: ``updater(key, grad, weight)``; keeps per-key states."""
    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.states = {}
        self.states_synced = {}
        self.aggregate_updates = optimizer.aggregate_num > 0

    def __call__(self, index, grad, weight):
        if not isinstance(index, (list, tuple)):
            indices, grads, weights = [index], [grad], [weight]
        else:
            indices, grads, weights = list(index), list(grad), list(weight)
        if weights:
            self.optimizer._set_current_context(weights[0].context.device_id)
        for i, idx in enumerate(indices):
            if isinstance(idx, bytes):  # str keys arrive as bytes from the C callback
                indices[i] = idx = py_str(idx)
            if idx not in self.states:
                self.states[idx] = self.optimizer.create_state_multi_precision(idx, weights[i])
                self.states_synced[idx] = True
            elif not self.states_synced[idx]:
                self.states[idx] = self.sync_state_context(self.states[idx], weights[i].context)
                self.states_synced[idx] = True
        failed = []   # kernels MXNet's engine fails after the loop went on (raised last)
        if self.aggregate_updates:
            by_type = {}
            for i, w, g in zip(indices, weights, grads):
                by_type.setdefault(w.dtype, []).append((i, w, g))
            step = self.optimizer.aggregate_num
            for group in by_type.values():
                idxs, ws, gs = zip(*group)
                for start in range(0, len(idxs), step):
                    try:
                        self.optimizer.update_multi_precision(
                            list(idxs[start:start + step]), list(ws[start:start + step]),
                            list(gs[start:start + step]),
                            [self.states[j] for j in idxs[start:start + step]])
                    except MXNetError as err:
                        if not getattr(err, 'mxkv_engine_failure', False):
                            raise
                        failed.append(err)
        else:
            for i, w, g in zip(indices, weights, grads):
                try:
                    self.optimizer.update_multi_precision(i, w, g, self.states[i])
                except MXNetError as err:
                    if not getattr(err, 'mxkv_engine_failure', False):
                        raise
                    failed.append(err)
        if failed:
            raise failed[0]

    def sync_state_context(self, state, context):
        """Move states onto `context` (after loading them)."""
        if isinstance(state, NDArray):
            return state.as_in_context(context)
        if isinstance(state, (tuple, list)):
            synced = [self.sync_state_context(i, context) for i in state]
            return tuple(synced) if isinstance(state, tuple) else synced
        return state

    def set_states(self, states):
        """Restore what get_states returned (by mxkv, or by MXNet 1.9.1: see
        :func:`_load_states`)."""
        states = _load_states(states)
        if isinstance(states, tuple) and len(states) == 2:
            self.states, self.optimizer = states
            # updates grouped as the loaded optimizer allows (MXNet keeps the setting of
            # the optimizer the updater was made for: SGD's 4 with a loaded Adam makes
            # every update fail)
            self.aggregate_updates = self.optimizer.aggregate_num > 0
        else:
            self.states = states
        self.states_synced = dict.fromkeys(self.states.keys(), False)

    def get_states(self, dump_optimizer=False):
        """Pickled states (and optimizer, if asked)."""
        return pickle.dumps((self.states, self.optimizer) if dump_optimizer else self.states)


# --- optimizer-state files written by MXNet 1.9.1 --------------------------------------
# MXNet's Updater.get_states is pickle.dumps(states) (or (states, optimizer)), like ours,
# but its classes are mxnet.*: a plain pickle.loads imports mxnet (or fails without it) and
# gives MXNet NDArrays and optimizers, which mxkv's updater cannot use. The loader maps
# MXNet's classes onto mxkv's instead and never imports mxnet:
#  * mxnet.ndarray.ndarray.NDArray, pickled as NDArray(None) + BUILD {'handle':
#    bytearray(MXNDArraySaveRawBytes)} (RowSparseNDArray and CSRNDArray of
#    mxnet.ndarray.sparse likewise): the raw bytes are MXNet's one-array serialisation,
#    which is also each array's record in a .params file, so they are read by the
#    library's own .params loader (MXNDArrayLoad: every field checked, -1 + an error for a
#    bad one);
#  * mxnet.optimizer.optimizer.<built-in optimizer> and mxnet.lr_scheduler.<scheduler>:
#    mxkv's class of the same name (the same attributes, checked);
#  * any other mxnet.* name is refused, naming it.
_PARAMS_MAGIC = 0x112   # kMXAPINDArrayListMagic
_MXNET_ARRAY_CLASSES = (('mxnet.ndarray.ndarray', 'NDArray'),
                        ('mxnet.ndarray.sparse', 'RowSparseNDArray'),
                        ('mxnet.ndarray.sparse', 'CSRNDArray'))


class _MXNetNDArrayPickle(object):
    """What an MXNet NDArray unpickles to here, until the library reads its bytes."""
    __slots__ = ('raw',)

    def __init__(self, handle=None):
        if handle is not None:
            raise MXKVUsageError('optimizer states from MXNet: NDArray(%r) in the pickle; '
                                 'MXNet writes NDArray(None)' % (type(handle).__name__,))
        self.raw = None

    def __setstate__(self, state):
        if not (isinstance(state, dict) and set(state) == {'handle'}
                and isinstance(state['handle'], (bytes, bytearray))):
            raise MXKVUsageError('optimizer states from MXNet: an NDArray whose state is not '
                                 "{'handle': bytearray}")
        self.raw = bytes(state['handle'])


class _StatesUnpickler(pickle.Unpickler):
    """pickle.Unpickler with MXNet's classes mapped onto mxkv's (never imports mxnet)."""

    def __init__(self, data):
        super(_StatesUnpickler, self).__init__(io.BytesIO(data))
        self.mapped = []    # MXNet optimizer / scheduler instances' classes, for the check

    def find_class(self, module, name):
        if module == 'mxnet' or module.startswith('mxnet.'):
            from .. import _optimizer_pickle
            from .. import lr_scheduler
            if (module, name) in _MXNET_ARRAY_CLASSES:
                return _MXNetNDArrayPickle
            if module == 'mxnet.optimizer.optimizer' and name in _optimizer_pickle.OPTIMIZERS:
                klass = globals()[name]
            elif module == 'mxnet.lr_scheduler' and name in _optimizer_pickle.LR_SCHEDULERS:
                klass = getattr(lr_scheduler, name)
            else:
                raise MXKVUsageError(
                    'load_optimizer_states: the file was written by MXNet and holds a %s.%s, '
                    'which mxkv has no counterpart for (mxkv reads MXNet NDArrays, the '
                    'built-in optimizers %s and the lr schedulers %s)'
                    % (module, name, ', '.join(_optimizer_pickle.OPTIMIZERS),
                       ', '.join(_optimizer_pickle.LR_SCHEDULERS)))
            self.mapped.append(klass)
            return klass
        return super(_StatesUnpickler, self).find_class(module, name)


def _mxnet_arrays(raws):
    """MXNet's one-array serialisations -> mxkv NDArrays (one .params file, one load)"""
    from ..ndarray import utils as nd_utils
    blob = b''.join([struct.pack('<QQQ', _PARAMS_MAGIC, 0, len(raws))] + raws
                    + [struct.pack('<Q', 0)])
    fd, path = tempfile.mkstemp(prefix='mxkv-states-', suffix='.params')
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(blob)
        try:
            arrays = nd_utils.load(path)
        except MXNetError as err:
            raise MXKVUsageError('load_optimizer_states: an MXNet NDArray in the file could '
                                 'not be read: %s' % err) from None
    finally:
        os.unlink(path)
    if len(arrays) != len(raws):
        raise MXKVUsageError('load_optimizer_states: %d of %d MXNet NDArrays read'
                             % (len(arrays), len(raws)))
    return arrays


def _replace_mxnet_arrays(obj):
    """obj with every _MXNetNDArrayPickle (in dicts, lists and tuples) read into an
    mxkv NDArray"""
    found = []

    def collect(o):
        if isinstance(o, _MXNetNDArrayPickle):
            if o.raw is None:
                raise MXKVUsageError('load_optimizer_states: an MXNet NDArray without data')
            found.append(o)
        elif isinstance(o, dict):
            for v in o.values():
                collect(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                collect(v)
        elif isinstance(o, Optimizer):   # LBSGD's cumgrads hold arrays
            collect(o.__dict__)
    collect(obj)
    if not found:
        return obj
    arrays = dict(zip(map(id, found), _mxnet_arrays([o.raw for o in found])))

    def rebuild(o):
        if isinstance(o, _MXNetNDArrayPickle):
            return arrays[id(o)]
        if isinstance(o, dict):
            return {k: rebuild(v) for k, v in o.items()}
        if isinstance(o, list):
            return [rebuild(v) for v in o]
        if isinstance(o, tuple):
            return tuple(rebuild(v) for v in o)
        if isinstance(o, Optimizer):
            o.__dict__.update(rebuild(o.__dict__))
        return o
    return rebuild(obj)


def _load_states(data):
    """Updater states as get_states wrote them, by mxkv or by MXNet 1.9.1."""
    unpickler = _StatesUnpickler(data)
    states = unpickler.load()
    if unpickler.mapped:
        from .. import _optimizer_pickle
        tables = _optimizer_pickle._Tables.get()  # pylint: disable=protected-access
        opts = [states[1]] if isinstance(states, tuple) and len(states) == 2 else []
        for opt in opts + [getattr(o, 'lr_scheduler', None) for o in opts]:
            if type(opt) in tables.attrs:
                have = set(vars(opt)) - {'param_dict'}
                want = tables.attrs[type(opt)]
                if have != want:
                    raise MXKVUsageError(
                        'load_optimizer_states: MXNet\'s %s in the file has attributes %s '
                        'that mxkv\'s lacks and lacks %s'
                        % (type(opt).__name__, sorted(have - want) or 'none',
                           sorted(want - have) or 'none'))
    return _replace_mxnet_arrays(states)


def get_updater(optimizer):
    """The KVStore updater that applies `optimizer`."""
    return Updater(optimizer)
