"""Error classes a library message may name (``ValueError: ...`` -> mxkv.error.ValueError).
Each is an MXNetError and also the matching Python builtin, as in ``mxnet.error``."""
import builtins

from .base import MXNetError, register_error

__all__ = ['MXNetError', 'InternalError', 'ValueError', 'TypeError', 'IndexError',
           'AttributeError', 'NotImplementedError']


def _make(name, builtin):
    cls = type(name, (MXNetError, builtin) if builtin is not MXNetError else (MXNetError,),
               {'__doc__': '%s raised by the library' % name, '__module__': __name__})
    return register_error(name, cls)


InternalError = _make('InternalError', MXNetError)
ValueError = _make('ValueError', builtins.ValueError)  # pylint: disable=redefined-builtin
TypeError = _make('TypeError', builtins.TypeError)  # pylint: disable=redefined-builtin
IndexError = _make('IndexError', builtins.IndexError)  # pylint: disable=redefined-builtin
AttributeError = _make('AttributeError', builtins.AttributeError)  # pylint: disable=redefined-builtin
NotImplementedError = _make('NotImplementedError', builtins.NotImplementedError)  # pylint: disable=redefined-builtin
