"""MXNet 1.9.1's optimizer operators as NDArray functions (``mx.nd.sgd_update``,
``sgd_mom_update``, ``mp_sgd_update``, ``mp_sgd_mom_update``, ``nag_mom_update``,
``mp_nag_mom_update``, ``adam_update``, ``rmsprop_update``, ``rmspropalex_update``,
``ftrl_update``, ``ftml_update``, ``signsgd_update``, ``signum_update``; the
row_sparse-capable ones also in ``mx.nd.sparse``), for custom updaters such as
``kv._set_updater(lambda k, g, w: mx.nd.sgd_update(w, g, lr=0.1, out=w))``.

The arithmetic is the optimizers' (``mxkv.optimizer.optimizer``'s kernels, the same
functions the built-in optimizers run); this module is the operator interface around
them, as MXNet's generated functions and its operators behave:

* positional arguments: the operator's arrays, then its parameters in MXNet's order;
  ``out`` and ``name`` by keyword; an array argument that is not an NDArray is an
  AssertionError, an unknown keyword, a missing required parameter (``lr``, ``t``) or
  one that does not parse an MXNetError;
* every input must have the weight's shape and (mp_*: weight32 and the momentum
  float32) dtype, and ``out`` the weight's shape and dtype (MXNetError, "Incompatible
  attr"); states (mom, mean, var, n, ...) are updated in place;
* ``out=weight`` updates the weight in place; without ``out`` the result is a new
  array (on cpu(k) for a weight on cpu_pinned(k)) and the weight is left as it was;
  another ``out`` receives the result (copied into its storage type);
* a row_sparse gradient takes MXNet's row_sparse kernels where it has them (sgd_update,
  sgd_mom_update, adam_update: lazy_update; ftrl_update when weight, gradient, z and n
  are all row_sparse), which only update in place: another ``out`` is an MXNetError
  (kWriteInplace); the other operators densify it (storage fallback).  A row_sparse
  weight with a dense gradient takes the fallback too: a dense result.
"""
import numpy as np

from ..base import MXNetError
from .._numerics import dmlc_float, dmlc_double
from .ndarray import NDArray, _op_context, _dtype_name, _result_into

_REQUIRED = object()

# MXNet's defaults are float parameters: float32 values (0.9 is 0.899999976); ftml's
# epsilon is a double whose default is the float32 1e-8 widened
_F32_EPS = float(np.float32(1e-8))


def _parse(op, name, kind, value):
    """check `value` as MXNet's parameter parser does (MXNetError), return it as given"""
    if value is _REQUIRED:
        raise MXNetError('Required parameter %s of %s is not presented, in operator %s'
                         '(name="")' % (name, kind, op))
    try:
        if kind == 'float':
            dmlc_float(value, name)
        elif kind == 'double':
            dmlc_double(value, name)
        elif kind == 'int':
            return int(str(value))
        elif kind == 'boolean':
            text = str(value).strip().lower()
            if text not in ('true', 'false', '1', '0'):
                raise ValueError(text)
            return text in ('true', '1')
    except (ValueError, TypeError, OverflowError, MXNetError):
        raise MXNetError("Invalid Parameter format for %s expect %s but value='%s', in "
                         "operator %s" % (name, kind, value, op))
    return value


def _shape_text(shape):
    return '[%s]' % ','.join(str(d) for d in shape)


def _check_attrs(op, arrays, out, f32_inputs):
    """MXNet's shape, then type inference of the operator: each input of the weight's
    shape and dtype (the positions in `f32_inputs` float32), `out` too"""
    weight = arrays[0]
    for pos, arr in enumerate(arrays):
        if arr.shape != weight.shape:
            raise MXNetError('Check failed: assign(&dattr, vec.at(i)): Incompatible attr in '
                             'node  at %d-th input: expected %s, got %s (%s)'
                             % (pos, _shape_text(weight.shape), _shape_text(arr.shape), op))
    if out is not None and out.shape != weight.shape:
        raise MXNetError('Check failed: assign(&dattr, vec.at(i)): Incompatible attr in node  '
                         'at 0-th output: expected %s, got %s (%s)'
                         % (_shape_text(weight.shape), _shape_text(out.shape), op))
    for pos, arr in enumerate(arrays):
        want = 'float32' if pos in f32_inputs else _dtype_name(weight.dtype)
        if _dtype_name(arr.dtype) != want:
            raise MXNetError('Check failed: assign(&dattr, vec.at(i)): Incompatible attr in '
                             'node  at %d-th input: expected %s, got %s (%s)'
                             % (pos, want, _dtype_name(arr.dtype), op))
    if out is not None and _dtype_name(out.dtype) != _dtype_name(weight.dtype):
        raise MXNetError('Check failed: assign(&dattr, vec.at(i)): Incompatible attr in node  '
                         'at 0-th output: expected %s, got %s (%s)'
                         % (_dtype_name(weight.dtype), _dtype_name(out.dtype), op))


def _is_rsp(arr):
    return isinstance(arr, NDArray) and arr.stype == 'row_sparse'


def _same(a, b):
    return a is b or (a is not None and b is not None and a.handle is not None
                      and b.handle is not None and a.handle.value == b.handle.value)


def _make(op, arrays, params, run, sparse_kernel=None, f32_inputs=()):
    """the function `op`: `arrays` its NDArray inputs (weight and grad first), `params`
    its (name, kind, default) parameters in MXNet's order; run(kernels, w, grad, states,
    values, out_is_weight, sparse) calls the kernel on the weight `w` (updated in place;
    `sparse`: MXNet's row_sparse kernel runs);
    sparse_kernel(weight, grad, states) tells whether MXNet runs a row_sparse kernel
    (which needs out=weight)"""
    names = list(arrays) + [p[0] for p in params]
    known = {p[0]: p for p in params}

    def fn(*args, **kwargs):
        from ..optimizer import optimizer as kernels
        if len(args) > len(names):
            raise TypeError('%s() takes at most %d positional arguments (%d given)'
                            % (op, len(names), len(args)))
        given = dict(zip(names, args))
        out = kwargs.pop('out', None)
        kwargs.pop('name', None)
        for key, value in kwargs.items():
            if key in given:
                raise TypeError('%s() got multiple values for argument %r' % (op, key))
            given[key] = value
        inputs = []
        for name in arrays:   # (the generated function's asserts)
            value = given.pop(name, None)
            if value is not None and not isinstance(value, NDArray):
                raise AssertionError('Argument %s must have NDArray type, but got %s'
                                     % (name, value))
            inputs.append(value)
        if out is not None and not isinstance(out, NDArray):
            raise TypeError('out must be an NDArray, got %s' % type(out).__name__)
        unknown = sorted(k for k in given if k not in known)
        if unknown:
            raise MXNetError('Cannot find argument \'%s\', Possible Arguments: %s, in '
                             'operator %s' % (unknown[0], ', '.join(known), op))
        values = {name: _parse(op, name, kind, given.get(name, default))
                  for name, kind, default in params}
        if any(arr is None for arr in inputs):
            raise MXNetError('Check failed: num_inputs == infered_num_inputs (%d vs. %d) : '
                             'Operator %s expects %d inputs'
                             % (sum(arr is not None for arr in inputs), len(arrays), op,
                                len(arrays)))
        _check_attrs(op, inputs, out, f32_inputs)
        weight, grad, states = inputs[0], inputs[1], inputs[2:]
        # MXNet's row_sparse kernels: a row_sparse gradient with a dense weight and dense
        # states, or with row_sparse weight and states, the output of the weight's storage
        # type (out=None: inferred so); anything else is the storage fallback
        kernel = bool(sparse_kernel and sparse_kernel(weight, grad, states)
                      and (out is None or out.stype == weight.stype))
        if not kernel and _is_rsp(grad):
            grad = grad.tostype('default')   # (the fallback's dense copy)
        if kernel and weight.stype == 'row_sparse' and 'lazy_update' in values and \
                any(st.stype == 'default' for st in states):
            # a row_sparse weight with dense states: MXNet's standard update kernels
            # (SGDMomStdUpdateRspRspDnsImpl, AdamStdUpdateRspRspDnsImpl) whatever lazy_update
            values = dict(values, lazy_update=False)
        if out is not None and _same(out, weight):
            func = op if not kernel else {'sgd_update': 'SGDUpdate',
                                          'sgd_mom_update': 'SGDMomUpdate',
                                          'adam_update': 'AdamUpdate',
                                          'ftrl_update': 'FtrlUpdate'}.get(op, op)
            grad = kernels._csr_weight_grad(weight, grad)
            if weight._is_sparse:
                with kernels._StandIns(weight, tuple(states), kernel, func) as (w, st):
                    run(kernels, w, grad, list(st), values, w is weight, kernel)
            else:
                with _DenseStates(states) as dense_states:
                    run(kernels, weight, grad, dense_states, values, True, kernel)
            return weight
        if kernel:
            if weight.stype == 'row_sparse':   # (MXNet checks the weight's rows first)
                with kernels._StandIns(weight, None, True, op):
                    pass
            raise MXNetError('Check failed: req == kWriteInplace (1 vs. 2) : kWriteInplace '
                             'is expected for sparse %s (out must be the weight)' % op)
        # the storage fallback (or MXNet's dense kernel): the result into a new dense
        # array, then into `out`; sparse states are updated as dense copies, cast back
        ctx = _op_context(weight.context)
        res = _dense_copy(weight, ctx)
        with _DenseStates(states) as dense_states:
            run(kernels, res, grad, dense_states, values, False, False)
        return _result_into(res, out)
    fn.__name__ = op
    fn.__doc__ = ('MXNet\'s %s operator: %s(%s, out=None, name=None) (see '
                  'mxkv.ndarray._update_ops)' % (op, op, ', '.join(names)))
    return fn


def _dense_copy(arr, ctx):
    """a dense copy of `arr` on `ctx`"""
    if not arr._is_sparse:
        return arr.copyto(ctx)
    res = arr.tostype('default')
    if res.context != ctx:
        res, moved = res.copyto(ctx), res
        moved.close()
    return res


class _DenseStates(object):
    """the storage fallback's dense copies of sparse states, cast back to their storage
    type after the kernel (``with _DenseStates(states) as dense_states: ...``)"""

    def __init__(self, states):
        self.states = states
        self.dense = []

    def __enter__(self):
        self.dense = [_dense_copy(st, st.context) if st._is_sparse else st
                      for st in self.states]
        return list(self.dense)

    def __exit__(self, exc_type, exc, trace):
        try:
            if exc_type is None:
                for st, dense in zip(self.states, self.dense):
                    if dense is not st:
                        dense.copyto(st)
        finally:
            for st, dense in zip(self.states, self.dense):
                if dense is not st:
                    dense.close()
        return False


def _rsp_grad(weight, grad, states):
    """sgd_update, sgd_mom_update, adam_update: (dense, row_sparse, dense...) or
    (row_sparse, row_sparse, ...) inputs"""
    if not _is_rsp(grad):
        return False
    if weight.stype == 'default':
        return all(st.stype == 'default' for st in states)
    return _is_rsp(weight)   # (dense states: MXNet's *StdUpdateRspRspDns kernels)


def _ftrl_kernel(weight, grad, states):
    return _is_rsp(weight) and _is_rsp(grad) and all(_is_rsp(s) for s in states)


_LR = ('lr', 'float', _REQUIRED)
_WD = ('wd', 'float', 0.0)
_RESCALE = ('rescale_grad', 'float', 1.0)
_CLIP = ('clip_gradient', 'float', -1.0)
_LAZY = ('lazy_update', 'boolean', True)
_MOMENTUM = ('momentum', 'float', 0.0)

sgd_update = _make(
    'sgd_update', ['weight', 'grad'], [_LR, _WD, _RESCALE, _CLIP, _LAZY],
    lambda k, w, g, st, v, *_: k._sgd_update(w, g, v['lr'], v['wd'], v['rescale_grad'],
                                            v['clip_gradient'], v['lazy_update']),
    sparse_kernel=_rsp_grad)

sgd_mom_update = _make(
    'sgd_mom_update', ['weight', 'grad', 'mom'], [_LR, _MOMENTUM, _WD, _RESCALE, _CLIP, _LAZY],
    lambda k, w, g, st, v, *_: k._sgd_mom_update(w, g, st[0], v['lr'], v['wd'], v['momentum'],
                                                v['rescale_grad'], v['clip_gradient'],
                                                v['lazy_update']),
    sparse_kernel=_rsp_grad)

mp_sgd_update = _make(
    'mp_sgd_update', ['weight', 'grad', 'weight32'], [_LR, _WD, _RESCALE, _CLIP, _LAZY],
    lambda k, w, g, st, v, *_: k._mp_sgd_update(w, g, st[0], None, v['lr'], v['wd'], 0.0,
                                               v['rescale_grad'], v['clip_gradient']),
    f32_inputs=(2,))

mp_sgd_mom_update = _make(
    'mp_sgd_mom_update', ['weight', 'grad', 'mom', 'weight32'],
    [_LR, _MOMENTUM, _WD, _RESCALE, _CLIP, _LAZY],
    lambda k, w, g, st, v, *_: k._mp_sgd_update(w, g, st[1], st[0], v['lr'], v['wd'],
                                               v['momentum'], v['rescale_grad'],
                                               v['clip_gradient']),
    f32_inputs=(2, 3))

nag_mom_update = _make(
    'nag_mom_update', ['weight', 'grad', 'mom'], [_LR, _MOMENTUM, _WD, _RESCALE, _CLIP],
    lambda k, w, g, st, v, in_place, _: k._nag_mom_update(
        w, g, st[0], v['lr'], v['wd'], v['momentum'], v['rescale_grad'], v['clip_gradient'],
        out_is_weight=in_place))

mp_nag_mom_update = _make(
    'mp_nag_mom_update', ['weight', 'grad', 'mom', 'weight32'],
    [_LR, _MOMENTUM, _WD, _RESCALE, _CLIP],
    lambda k, w, g, st, v, *_: k._mp_nag_mom_update(w, g, st[1], st[0], v['lr'], v['wd'],
                                                   v['momentum'], v['rescale_grad'],
                                                   v['clip_gradient']),
    f32_inputs=(2, 3))

adam_update = _make(
    'adam_update', ['weight', 'grad', 'mean', 'var'],
    [_LR, ('beta1', 'float', 0.9), ('beta2', 'float', 0.999), ('epsilon', 'float', 1e-8),
     _WD, _RESCALE, _CLIP, _LAZY],
    lambda k, w, g, st, v, *_: k._adam_update(w, g, st[0], st[1], v['lr'], v['wd'],
                                             v['beta1'], v['beta2'], v['epsilon'],
                                             v['rescale_grad'], v['clip_gradient'],
                                             v['lazy_update']),
    sparse_kernel=_rsp_grad)

rmsprop_update = _make(
    'rmsprop_update', ['weight', 'grad', 'n'],
    [_LR, ('gamma1', 'float', 0.95), ('epsilon', 'float', 1e-8), _WD, _RESCALE, _CLIP,
     ('clip_weights', 'float', -1.0)],
    lambda k, w, g, st, v, *_: k._rmsprop_update(w, g, st[0], v['lr'], v['wd'], v['gamma1'],
                                                v['epsilon'], v['rescale_grad'],
                                                v['clip_gradient'], v['clip_weights']))

rmspropalex_update = _make(
    'rmspropalex_update', ['weight', 'grad', 'n', 'g', 'delta'],
    [_LR, ('gamma1', 'float', 0.95), ('gamma2', 'float', 0.9), ('epsilon', 'float', 1e-8),
     _WD, _RESCALE, _CLIP, ('clip_weights', 'float', -1.0)],
    lambda k, w, g, st, v, *_: k._rmspropalex_update(
        w, g, st[0], st[1], st[2], v['lr'], v['wd'], v['gamma1'], v['gamma2'], v['epsilon'],
        v['rescale_grad'], v['clip_gradient'], v['clip_weights']))


def _ftrl_run(k, w, g, st, v, _, kernel):
    # the row_sparse kernel when weight, gradient and states are all row_sparse (then
    # _StandIns gave dense stand-ins of the weight and states, `g` is still row_sparse)
    rows = k._rsp_rows(w, g, *st) if kernel else None
    k._ftrl_update(w, g, st[0], st[1], v['lr'], v['wd'], v['lamda1'], v['beta'],
                   v['rescale_grad'], v['clip_gradient'], lazy_rows=rows)


ftrl_update = _make(
    'ftrl_update', ['weight', 'grad', 'z', 'n'],
    [_LR, ('lamda1', 'float', 0.01), ('beta', 'float', 1.0), _WD, _RESCALE, _CLIP],
    _ftrl_run, sparse_kernel=_ftrl_kernel)

ftml_update = _make(
    'ftml_update', ['weight', 'grad', 'd', 'v', 'z'],
    [_LR, ('beta1', 'float', 0.6), ('beta2', 'float', 0.999), ('epsilon', 'double', _F32_EPS),
     ('t', 'int', _REQUIRED), _WD, _RESCALE, ('clip_grad', 'float', -1.0)],
    lambda k, w, g, st, v, *_: k._ftml_update(w, g, st[0], st[1], st[2], v['lr'], v['wd'],
                                             v['beta1'], v['beta2'], v['epsilon'], v['t'],
                                             v['rescale_grad'], v['clip_grad']))

signsgd_update = _make(
    'signsgd_update', ['weight', 'grad'], [_LR, _WD, _RESCALE, _CLIP],
    lambda k, w, g, st, v, *_: k._signsgd_update(w, g, v['lr'], v['wd'], v['rescale_grad'],
                                                v['clip_gradient']))

signum_update = _make(
    'signum_update', ['weight', 'grad', 'mom'],
    [_LR, _MOMENTUM, _WD, _RESCALE, _CLIP, ('wd_lh', 'float', 0.0)],
    lambda k, w, g, st, v, *_: k._signum_update(w, g, st[0], v['lr'], v['wd'], v['momentum'],
                                               v['rescale_grad'], v['clip_gradient'],
                                               v['wd_lh']))

__all__ = ['sgd_update', 'sgd_mom_update', 'mp_sgd_update', 'mp_sgd_mom_update',
           'nag_mom_update', 'mp_nag_mom_update', 'adam_update', 'rmsprop_update',
           'rmspropalex_update', 'ftrl_update', 'ftml_update', 'signsgd_update',
           'signum_update']
# (mx.nd.sparse has the operators with row_sparse kernels under the same names)
SPARSE = ['sgd_update', 'sgd_mom_update', 'adam_update', 'ftrl_update']
