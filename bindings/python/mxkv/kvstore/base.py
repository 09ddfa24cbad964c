"""KVStore creation, the KVStoreBase registry, and key/value argument marshalling."""
import ctypes
import numbers
import warnings

from ..base import (_LIB, check_call, c_str, string_types, KVStoreHandle, MXKVUsageError)
from ..ndarray import NDArray
from ..profiler import set_kvstore_handle

__all__ = ['create', 'KVStoreBase']

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


# Usage errors where MXNet 1.9.1's frontend raises a builtin exception other than
# AssertionError: mxkv's are of that class too, so `except TypeError` etc. still catch them.
class MXKVUsageTypeError(MXKVUsageError, TypeError):
    """A value that is neither an NDArray nor a list of them (MXNet: TypeError)."""


class MXKVUsageOverflowError(MXKVUsageError, OverflowError):
    """An int key outside C int (MXNet: OverflowError from array('i'))."""


class MXKVUsageAttributeError(MXKVUsageError, AttributeError):
    """A gradient-compression parameter name that is not a str (MXNet: AttributeError
    from name.encode)."""


def _key_repr(keys):
    return repr(keys if not isinstance(keys, tuple) else list(keys))


def _flatten(keys, vals, op):
    """Pair every key with every value it applies to.

    Accepts what MXNet accepts: a key and an NDArray; a key and a list of NDArrays
    (one key, many devices); lists of those.  Returns (flat_keys, flat_vals, use_str):
    use_str is None for a list of no keys (at any depth), as MXNet's _ctype_key_value
    has it; a list's items must have the type of the first item whose type is not None
    (so [[], k] is k, and [k, []] fails as MXNet's assertion 'inconsistent types of keys
    detected').
    """
    if isinstance(keys, (tuple, list)):
        if not isinstance(vals, (tuple, list)):
            # MXNet asserts len(keys) == len(vals) (TypeError when vals has no len()), then
            # zips them; an NDArray would be cut into temporary rows whose handles are
            # freed before the call (MXNet crashes or reads garbage): refused
            if isinstance(vals, NDArray) or not (hasattr(vals, '__len__')
                                                 and hasattr(vals, '__iter__')):
                cls = MXKVUsageError if hasattr(vals, '__len__') else MXKVUsageTypeError
                raise cls('KVStore.%s: keys %s is a list but the values are a %s'
                          % (op, _key_repr(keys), type(vals).__name__))
            vals = list(vals)
        if len(keys) != len(vals):
            raise MXKVUsageError('KVStore.%s: %d keys %s but %d values/outputs'
                                 % (op, len(keys), _key_repr(keys), len(vals)))
        flat_k, flat_v, use_str = [], [], None
        for key, val in zip(keys, vals):
            k_i, v_i, s_i = _flatten(key, val, op)
            if use_str is not None and s_i is None:
                raise MXKVUsageError('KVStore.%s: inconsistent types of keys detected in %s: '
                                     'an empty list of keys after %s keys (MXNet 1.9.1 '
                                     'refuses it; an empty list before the keys is taken)'
                                     % (op, _key_repr(keys), 'str' if use_str else 'int'))
            if use_str is not None and s_i != use_str:
                raise MXKVUsageError('KVStore.%s: mixed int and str keys in one call %s; a '
                                     'store uses either int or str keys'
                                     % (op, _key_repr(keys)))
            if use_str is None:
                use_str = s_i
            flat_k += k_i
            flat_v += v_i
        return flat_k, flat_v, use_str
    if isinstance(keys, string_types):
        use_str = True
    elif isinstance(keys, numbers.Integral):
        # bool is an int: MXNet takes True and False as the keys 1 and 0
        keys = int(keys)
        if not _INT32_MIN <= keys <= _INT32_MAX:
            raise MXKVUsageOverflowError('KVStore.%s: key %d does not fit in a C int'
                                         % (op, keys))
        use_str = False
    else:
        raise MXKVUsageError('KVStore.%s: key %r has unexpected type %s (int or str expected)'
                             % (op, keys, type(keys).__name__))
    if isinstance(vals, NDArray):
        vals = [vals]
    elif isinstance(vals, (list, tuple)) or (hasattr(vals, '__iter__')
                                             and hasattr(vals, '__len__')):
        # MXNet iterates any sized iterable (a set, a dict's keys) as a list of values
        vals = list(vals)
    else:
        # MXNet iterates the value, then takes its len(): TypeError when it has neither
        raise MXKVUsageTypeError('KVStore.%s: value for key %r must be an NDArray or a list '
                                 'of NDArrays, not %s' % (op, keys, type(vals).__name__))
    for val in vals:
        if not isinstance(val, NDArray):
            raise MXKVUsageError('KVStore.%s: value for key %r must be an NDArray, not %s'
                                 % (op, keys, type(val).__name__))
        if val.handle is None:
            raise MXKVUsageError('KVStore.%s: the NDArray given for key %r is closed'
                                 % (op, keys))
    return [keys] * len(vals), vals, use_str


def _c_keys(flat_keys, use_str):
    if use_str:
        arr = (ctypes.c_char_p * len(flat_keys))()
        arr[:] = [k.encode('utf-8') for k in flat_keys]
        return arr
    return (ctypes.c_int * len(flat_keys))(*flat_keys)


def _c_vals(flat_vals):
    arr = (ctypes.c_void_p * len(flat_vals))()
    arr[:] = [v.handle.value for v in flat_vals]
    return arr


def _ctype_key_value(keys, vals, op='call'):
    """(c_keys, c_vals, use_str_keys, flat_keys) for a key/value argument pair."""
    flat_k, flat_v, use_str = _flatten(keys, vals, op)
    use_str = bool(use_str)   # no keys at all: the int entry points, as MXNet
    return _c_keys(flat_k, use_str), _c_vals(flat_v), use_str, flat_k


def _ctype_dict(param_dict):
    """c arrays of the keys and str() of the values of a dict"""
    if not isinstance(param_dict, dict):
        raise MXKVUsageError('unexpected type for param_dict: ' + str(type(param_dict)))
    for k in param_dict:
        if not isinstance(k, string_types):
            raise MXKVUsageAttributeError('parameter names must be str, not %s (%r)'
                                          % (type(k).__name__, k))
    keys = (ctypes.c_char_p * len(param_dict))()
    keys[:] = [k.encode('utf-8') for k in param_dict.keys()]
    vals = (ctypes.c_char_p * len(param_dict))()
    vals[:] = [str(v).encode('utf-8') for v in param_dict.values()]
    return keys, vals


class KVStoreBase(object):
    """Interface of a key-value store for data-parallel training (as mxnet.kvstore.KVStoreBase).
    Subclasses registered with :meth:`register` can be created by name."""
    OPTIMIZER = 'optimizer'
    kv_registry = {}

    def broadcast(self, key, value, out, priority=0):
        """Broadcast `value` from rank 0 into `out`."""
        raise NotImplementedError()

    def pushpull(self, key, value, out=None, priority=0):
        """Push then pull (allreduce)."""
        raise NotImplementedError()

    def set_optimizer(self, optimizer):
        """Register an optimizer."""
        raise NotImplementedError()

    def is_capable(self, capability):
        """Whether the store supports `capability`."""
        raise NotImplementedError()

    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Save optimizer states."""
        raise NotImplementedError()

    def load_optimizer_states(self, fname):
        """Load optimizer states."""
        raise NotImplementedError()

    @property
    def type(self):
        """store type string"""
        raise NotImplementedError()

    @property
    def rank(self):
        """rank of this worker"""
        raise NotImplementedError()

    @property
    def num_workers(self):
        """number of workers"""
        raise NotImplementedError()

    @staticmethod
    def register(klass):
        """Register a KVStoreBase subclass under its lower-cased class name."""
        if not isinstance(klass, type):
            raise MXKVUsageError('register expects a class')
        name = klass.__name__.lower()
        if name in KVStoreBase.kv_registry:
            warnings.warn('WARNING: New kvstore %s.%s is overriding existing kvstore %s.%s'
                          % (klass.__module__, klass.__name__,
                             KVStoreBase.kv_registry[name].__module__,
                             KVStoreBase.kv_registry[name].__name__))
        KVStoreBase.kv_registry[name] = klass
        return klass


@KVStoreBase.register
class TestStore(KVStoreBase):
    """The pure-Python store MXNet 1.9.1 registers for its tests (``create('teststore')``).

    It keeps nothing: ``broadcast`` copies the value into the outputs, ``pushpull`` sums
    the values (on the first value's context) into the outputs, or back into the values
    when no output is given.  It cannot run an optimizer: ``is_capable('optimizer')``
    is False and the optimizer methods raise NotImplementedError.
    """

    def broadcast(self, key, value, out, priority=0):
        """Copy `value` into `out` (an NDArray or a list of them)."""
        for dst in (out if isinstance(out, list) else [out]):
            dst[:] = value

    def pushpull(self, key, value, out=None, priority=0):
        """Sum the values of a list (one NDArray alone is its own sum) into `out`, or into
        every value when `out` is None; a single NDArray without `out` is left as it is.

        As MXNet's, it starts with ``value[0].context`` even for a single NDArray (so a
        row_sparse one, or one of shape () or (0, ...), raises what indexing it raises), and
        writes back into every item of a tuple or list of values."""
        ctx = value[0].context
        if isinstance(value, NDArray):
            if out is not None:
                for dst in (out if isinstance(out, list) else [out]):
                    dst[:] = value
        else:
            # sum() starts from 0, as MXNet's TestStore does: 0 + v turns -0.0 into 0.0
            total = sum([val.as_in_context(ctx) for val in value])
            for dst in (value if out is None else out if isinstance(out, list) else [out]):
                dst[:] = total

    @staticmethod
    def is_capable(capability):
        """Only 'optimizer' is known, and this store has no optimizer support."""
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return False
        raise ValueError('Unknown capability: {}'.format(capability))

    @property
    def type(self):
        """'teststore'"""
        return 'teststore'

    @property
    def rank(self):
        """always 0"""
        return 0

    @property
    def num_workers(self):
        """always 1"""
        return 1

    def set_optimizer(self, optimizer):
        """Not supported: raises NotImplementedError."""
        raise NotImplementedError()

    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Not supported: raises NotImplementedError."""
        raise NotImplementedError()

    def load_optimizer_states(self, fname):
        """Not supported: raises NotImplementedError."""
        raise NotImplementedError()


def create(name='local'):
    """Create a KVStore: a store registered with :meth:`KVStoreBase.register` under
    `name` (lower case; MXNet's ``teststore`` is one), else the library's store
    ('local', 'device', ...; 'dist*' stores need a parameter-server cluster)."""
    if not isinstance(name, string_types):
        raise TypeError('name must be a string')
    name = name.lower()
    if name in KVStoreBase.kv_registry:
        return KVStoreBase.kv_registry[name]()
    handle = KVStoreHandle()
    check_call(_LIB.MXKVStoreCreate(c_str(name), ctypes.byref(handle)))
    from .kvstore import KVStore
    kv = KVStore(handle)
    set_kvstore_handle(kv.handle)
    return kv
