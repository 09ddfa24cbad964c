"""Learning-rate schedules (the ``mxnet.lr_scheduler`` API).  Each computes the
rate with the same arithmetic as MXNet 1.9.1, so optimizers get bit-identical
learning rates: in Python floats, or, given numpy scalars (a base_lr of np.float32 ...),
with numpy 1.x's promotion, which MXNet's Python runs on (a numpy scalar with a Python
number computes in float64; numpy 2 would keep float32: NEP 50), whatever numpy is
installed."""
import functools
import logging
import operator
from math import cos, pi

from ._numerics import np1_scalar_op
from .base import MXKVUsageError

_add = functools.partial(np1_scalar_op, operator.add)
_sub = functools.partial(np1_scalar_op, operator.sub)
_mul = functools.partial(np1_scalar_op, operator.mul)
_div = functools.partial(np1_scalar_op, operator.truediv)
_pow = functools.partial(np1_scalar_op, operator.pow)
_lt = functools.partial(np1_scalar_op, operator.lt)
_gt = functools.partial(np1_scalar_op, operator.gt)

__all__ = ['LRScheduler', 'FactorScheduler', 'MultiFactorScheduler', 'PolyScheduler',
           'CosineScheduler']


class LRScheduler(object):
    """Base class: ``scheduler(num_update) -> learning rate``, with optional warmup."""
    def __init__(self, base_lr=0.01, warmup_steps=0, warmup_begin_lr=0, warmup_mode='linear'):
        self.base_lr = base_lr
        if not isinstance(warmup_steps, int):
            raise MXKVUsageError('warmup_steps must be an int')  # (MXNet: an assert)
        self.warmup_steps = warmup_steps
        self.warmup_final_lr = base_lr
        self.warmup_begin_lr = warmup_begin_lr
        if _gt(self.warmup_begin_lr, self.warmup_final_lr):
            raise ValueError('Base lr has to be higher than warmup_begin_lr')
        if self.warmup_steps < 0:
            raise ValueError('Warmup steps has to be positive or 0')
        if warmup_mode not in ('linear', 'constant'):
            raise ValueError('Supports only linear and constant modes of warmup')
        self.warmup_mode = warmup_mode

    def get_warmup_lr(self, num_update):
        """rate during the warmup steps"""
        if self.warmup_mode == 'linear':
            step = _div(_mul(_sub(self.warmup_final_lr, self.warmup_begin_lr),
                             float(num_update)), float(self.warmup_steps))
            return _add(self.warmup_begin_lr, step)
        return self.warmup_begin_lr

    def __call__(self, num_update):
        raise NotImplementedError('must override this')


class FactorScheduler(LRScheduler):
    """Multiply the rate by `factor` every `step` updates (not below stop_factor_lr)."""
    def __init__(self, step, factor=1, stop_factor_lr=1e-8, base_lr=0.01,
                 warmup_steps=0, warmup_begin_lr=0, warmup_mode='linear'):
        super(FactorScheduler, self).__init__(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
        if step < 1:
            raise ValueError('Schedule step must be greater or equal than 1 round')
        if _gt(factor, 1.0):
            raise ValueError('Factor must be no more than 1 to make lr reduce')
        self.step = step
        self.factor = factor
        self.stop_factor_lr = stop_factor_lr
        self.count = 0

    def __call__(self, num_update):
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        while num_update > self.count + self.step:
            self.count += self.step
            self.base_lr = _mul(self.base_lr, self.factor)
            if _lt(self.base_lr, self.stop_factor_lr):
                self.base_lr = self.stop_factor_lr
                logging.info('Update[%d]: now learning rate arrived at %0.5e, will not '
                             'change in the future', num_update, self.base_lr)
            else:
                logging.info('Update[%d]: Change learning rate to %0.5e', num_update,
                             self.base_lr)
        return self.base_lr


class MultiFactorScheduler(LRScheduler):
    """Multiply the rate by `factor` after each step in the increasing list `step`."""
    def __init__(self, step, factor=1, base_lr=0.01, warmup_steps=0, warmup_begin_lr=0,
                 warmup_mode='linear'):
        super(MultiFactorScheduler, self).__init__(base_lr, warmup_steps, warmup_begin_lr,
                                                   warmup_mode)
        if not (isinstance(step, list) and step):
            raise MXKVUsageError('step must be a non-empty list')  # (MXNet: an assert)
        for i, one in enumerate(step):
            if i and step[i] <= step[i - 1]:
                raise ValueError('Schedule step must be an increasing integer list')
            if one < 1:
                raise ValueError('Schedule step must be greater or equal than 1 round')
        if _gt(factor, 1.0):
            raise ValueError('Factor must be no more than 1 to make lr reduce')
        self.step = step
        self.cur_step_ind = 0
        self.factor = factor
        self.count = 0

    def __call__(self, num_update):
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        while self.cur_step_ind < len(self.step):
            if num_update <= self.step[self.cur_step_ind]:
                return self.base_lr
            self.count = self.step[self.cur_step_ind]
            self.cur_step_ind += 1
            self.base_lr = _mul(self.base_lr, self.factor)
            logging.info('Update[%d]: Change learning rate to %0.5e', num_update, self.base_lr)
        return self.base_lr


class PolyScheduler(LRScheduler):
    """final_lr + (base_lr - final_lr) * (1 - nup/max_nup) ** pwr"""
    def __init__(self, max_update, base_lr=0.01, pwr=2, final_lr=0,
                 warmup_steps=0, warmup_begin_lr=0, warmup_mode='linear'):
        super(PolyScheduler, self).__init__(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
        if not isinstance(max_update, int):
            raise MXKVUsageError('max_update must be an int')  # (MXNet: an assert)
        if max_update < 1:
            raise ValueError('maximum number of updates must be strictly positive')
        self.power = pwr
        self.base_lr_orig = self.base_lr
        self.max_update = max_update
        self.final_lr = final_lr
        self.max_steps = self.max_update - self.warmup_steps

    def __call__(self, num_update):
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        if num_update <= self.max_update:
            frac = float(num_update - self.warmup_steps) / float(self.max_steps)
            self.base_lr = _add(self.final_lr, _mul(_sub(self.base_lr_orig, self.final_lr),
                                                    _pow(1 - frac, self.power)))
        return self.base_lr


class CosineScheduler(LRScheduler):
    """final_lr + (base_lr - final_lr) * (1 + cos(pi * nup / max_nup)) / 2"""
    def __init__(self, max_update, base_lr=0.01, final_lr=0,
                 warmup_steps=0, warmup_begin_lr=0, warmup_mode='linear'):
        super(CosineScheduler, self).__init__(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
        if not isinstance(max_update, int):
            raise MXKVUsageError('max_update must be an int')  # (MXNet: an assert)
        if max_update < 1:
            raise ValueError('maximum number of updates must be strictly positive')
        self.base_lr_orig = base_lr
        self.max_update = max_update
        self.final_lr = final_lr
        self.max_steps = self.max_update - self.warmup_steps

    def __call__(self, num_update):
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        if num_update <= self.max_update:
            self.base_lr = _add(self.final_lr, _div(
                _mul(_sub(self.base_lr_orig, self.final_lr),
                     1 + cos(pi * (num_update - self.warmup_steps) / self.max_steps)), 2))
        return self.base_lr
