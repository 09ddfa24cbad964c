"""The optimizer pickle a dist worker sends to the servers, and the server's restricted loader.

MXNet 1.9.1's ``KVStore.set_optimizer`` on a ``dist*`` store, on a worker, sends
``py_str(pickle.dumps(optimizer, 0))`` with the command head ``kController`` (0); the
server's controller (``kvstore_server.py``, ``_controller``) receives the body as bytes
(a ctypes ``c_char_p``) and runs ``pickle.loads(body)``, then installs the result with
``set_optimizer``.  This module is both ends of that exchange for mxkv:

``dumps(optimizer) -> bytes``
    The body our worker sends: a protocol-0 pickle naming the classes as MXNet 1.9.1
    does (``mxnet.optimizer.optimizer.SGD``, ``mxnet.lr_scheduler.FactorScheduler``...)
    with the state MXNet's classes have (``Optimizer.__getstate__``: ``__dict__`` minus
    ``param_dict``), so a real MXNet server loads it into the same optimizer with the
    same hyper-parameters.  It is pure ASCII without NUL bytes (non-ASCII characters in
    strings are written as ``\\uXXXX`` escapes, which protocol 0 reads back), so it
    survives ``py_str``/``c_str`` and the C string of ``MXKVStoreSendCommmandToServers``.
    Only mxkv's built-in optimizer and lr-scheduler classes, holding plain values
    (``None``, ``bool``, ``int``, ``float``, ``str``, ``tuple``, ``list``, ``dict``, numpy
    bool, int and float scalars, and ``numpy.str_``, written as the equal ``str``), can be
    sent; anything else raises :class:`UnsendableOptimizerError` on the worker, naming the
    attribute and its type (what the server would refuse is refused before sending).  A
    numpy bool, int or float scalar is written as MXNet's pickle writes it
    (``numpy.core.multiarray.scalar(numpy.dtype(code, False, True), _codecs.encode(its
    bytes as latin-1 text, 'latin1'))``), the text escaped like every other string:
    MXNet's own worker fails in ``py_str`` (``UnicodeDecodeError``) when a byte of the
    value is 0x80 or more (``np.float32(0.1)``), ours sends ``\\u00cd``, which any
    server, MXNet's included, reads back into the same scalar.

``loads(body) -> Optimizer``
    The server side: a restricted unpickler.  It accepts only the built-in optimizer
    and lr-scheduler classes, named as mxkv names them (``mxkv.optimizer.optimizer.SGD``,
    ``mxkv.lr_scheduler.PolyScheduler``) or as MXNet 1.9.1 does, maps them to mxkv's
    classes, and plain values.  Every other global is refused with
    :class:`RefusedPickleError` naming it as ``module.name``.  What a pickle of these
    classes needs besides (probed with ``pickletools.dis`` on MXNet 1.9.1's own pickles,
    protocols 0 to 5) is ``copyreg._reconstructor(cls, object, None)`` (protocols 0 and 1,
    as ``copy_reg``/``__builtin__``), or the ``NEWOBJ`` opcode (protocols 2 to 5),
    followed by ``BUILD`` with the state dict.  A hyper-parameter a user gave as a numpy
    scalar (``SGD(learning_rate=np.float32(0.5))``) is pickled by MXNet as
    ``numpy.core.multiarray.scalar(numpy.dtype(code, False, True), raw bytes)`` (the bytes
    through ``_codecs.encode(text, 'latin1')`` up to protocol 2): these three are accepted
    for bool, int and float dtypes, which give the same numpy scalar, and for ``U<n>``
    (a ``numpy.str_``, e.g. names taken from a numpy array: UTF-32 text), which gives the
    equal ``str``.  Nothing found by name is ever called: the reconstructor and ``object``
    are placeholders, classes are only instantiated with ``object.__new__`` (no
    ``__init__``), ``BUILD`` applies a dict of str keys to an
    instance created here (the optimizers' own ``__setstate__``, a plain ``__dict__``
    update for schedulers) and to nothing else, ``APPEND``/``SETITEM``/``ADDITEMS`` only
    fill real lists, dicts and sets, dict keys and set elements must be scalars (hashing a
    deeply nested tuple crashes CPython: a plain ``pickle.loads``, MXNet's server, dies on
    such a body), and the opcodes that call or look up things
    (``INST``, ``OBJ``, ``EXT1/2/4``, persistent ids, out-of-band buffers) are refused;
    any opcode not known to be harmless is refused.
    The loaded object is then checked: the top object is an optimizer, an lr scheduler
    appears only as its ``lr_scheduler``, every instance has exactly the attributes mxkv's
    class has (missing or extra ones are refused), and each attribute holds what MXNet
    1.9.1's class holds there: ``idx2name`` maps to str names, ``lr_mult``/``wd_mult`` to
    numbers, the update counters to ints, ``sym_info`` is ``()`` or (attribute dict of str,
    list of str argument names), a scheduler's ``step`` list holds numbers, and every other
    attribute is a scalar (``None``, ``bool``, ``int``, ``float``, ``str``, a numpy
    scalar).  Nothing the server later hashes or compares can be a container, so neither
    a tuple nested 400000 deep (hashing it overflows the C stack) nor a DAG of shared
    tuples (2^64 steps to hash) gets through; the error names the attribute's path
    (``SGD.idx2name[3] is a builtins.tuple; ...``).
    Bodies longer than ``max_bytes`` (default :data:`MAX_BODY_BYTES`, 4 MiB) are refused
    before they are parsed, and parsing stops after ``max_opcodes`` opcodes (default
    :data:`MAX_OPCODES`, 10^6), which bounds the memory a hostile body can make the server
    allocate (about 100 bytes per opcode).

:class:`RefusedPickleError` is a subclass of both :class:`pickle.UnpicklingError` and
:class:`mxkv.base.MXNetError`; ``err.global_name`` is the refused global's ``module.name``
as the pickle writes it (protocols 0-2 write Python 2 names, e.g. ``__builtin__.eval``,
``commands.Popen``; the message adds the Python 3 name), or for a refused structure the
class of the object concerned (``mxkv.optimizer.optimizer.SGD`` for a wrong attribute set,
``builtins.set`` for a set value), or ``None`` (size, opcode count, malformed body).
"""
import _compat_pickle
import codecs
import copyreg
import io
import pickle
import re
import struct
import sys

import numpy as np

from .base import MXNetError

__all__ = ['dumps', 'loads', 'RefusedPickleError', 'UnsendableOptimizerError',
           'MAX_BODY_BYTES', 'MAX_OPCODES', 'OPTIMIZERS', 'LR_SCHEDULERS', 'accepted_globals']

#: the largest body :func:`loads` parses (bytes); an optimizer's pickle is a few KB, 0.5 MB
#: (65000 opcodes) with the ``idx2name``, wd and lr multipliers of 10^4 parameters
MAX_BODY_BYTES = 4 << 20
#: the most opcodes :func:`loads` runs (each can create an object of ~100 bytes from one
#: byte of input: this bounds the memory and time a hostile body costs, ~100 MB and ~2 s)
MAX_OPCODES = 1000000

#: built-in optimizers a server accepts (class names in mxkv.optimizer.optimizer and
#: MXNet 1.9.1's mxnet.optimizer.optimizer)
OPTIMIZERS = ('SGD', 'NAG', 'Adam', 'AdaGrad', 'RMSProp', 'AdaDelta', 'Signum', 'Ftrl',
              'FTML', 'Adamax', 'Nadam', 'DCASGD', 'SGLD', 'LAMB', 'LARS',
              'LBSGD', 'ccSGD', 'Test')
#: lr schedulers a server accepts (mxkv.lr_scheduler, mxnet.lr_scheduler)
LR_SCHEDULERS = ('FactorScheduler', 'MultiFactorScheduler', 'PolyScheduler',
                 'CosineScheduler')

_MX_OPT_MODULE = 'mxnet.optimizer.optimizer'
_MX_LRS_MODULE = 'mxnet.lr_scheduler'
_PLAIN = (type(None), bool, int, float, str, tuple, list, dict)
_BUILTIN_FUNCTION = type(codecs.encode)


class RefusedPickleError(pickle.UnpicklingError, MXNetError):
    """A body :func:`loads` refuses; ``global_name`` is the refused ``module.name``
    (``None`` if it was refused for its size, an opcode or its structure)."""
    def __init__(self, message, global_name=None):
        super(RefusedPickleError, self).__init__(message)
        self.global_name = global_name


class UnsendableOptimizerError(pickle.PicklingError, MXNetError):
    """An optimizer :func:`dumps` cannot send to dist servers (not a built-in class, or
    holding a value that is not plain)."""


def _type_name(obj):
    t = obj if isinstance(obj, type) else type(obj)
    return '%s.%s' % (t.__module__, t.__qualname__)


class _Tables(object):
    """The class tables, built on first use (mxkv.optimizer imports the library)."""
    _done = None

    @classmethod
    def get(cls):
        if cls._done is None:
            from .optimizer import optimizer as opt_mod
            from . import lr_scheduler as lrs_mod
            self = cls()
            self.optimizers = {getattr(opt_mod, n): n for n in OPTIMIZERS}
            self.schedulers = {getattr(lrs_mod, n): n for n in LR_SCHEDULERS}
            # class -> (module, name) MXNet 1.9.1 writes
            self.mx_name = {}
            # accepted (module, name) -> class
            self.by_name = {}
            for klass, name in self.optimizers.items():
                self.mx_name[klass] = (_MX_OPT_MODULE, name)
                self.by_name[(_MX_OPT_MODULE, name)] = klass
                self.by_name[(klass.__module__, klass.__qualname__)] = klass
            for klass, name in self.schedulers.items():
                self.mx_name[klass] = (_MX_LRS_MODULE, name)
                self.by_name[(_MX_LRS_MODULE, name)] = klass
                self.by_name[(klass.__module__, klass.__qualname__)] = klass
            self.defaults = {klass: _state_of(_default_instance(klass))
                             for klass in self.mx_name}
            self.attrs = {klass: frozenset(state) for klass, state in self.defaults.items()}
            self.np_scalars = _np_scalar_types()
            # what a numpy scalar's pickle calls -> the (module, name) dumps writes for it
            # (numpy.core.multiarray, as MXNet's numpy 1.x has it, whatever numpy runs here)
            self.np_globals = {np.float32(0).__reduce__()[0]: ('numpy.core.multiarray',
                                                               'scalar'),
                               np.dtype: ('numpy', 'dtype'),
                               codecs.encode: ('_codecs', 'encode')}
            cls._done = self
        return cls._done


def _default_instance(klass):
    required = {'FactorScheduler': {'step': 1}, 'MultiFactorScheduler': {'step': [1]},
                'PolyScheduler': {'max_update': 1}, 'CosineScheduler': {'max_update': 1}}
    return klass(**required.get(klass.__name__, {}))


def _state_of(obj):
    """what pickle saves for obj (copyreg._reduce_ex): __getstate__() or __dict__"""
    getstate = getattr(type(obj), '__getstate__', None)
    if getstate is not None and getstate is not getattr(object, '__getstate__', None):
        return getstate(obj)
    return obj.__dict__


def accepted_globals():
    """Every ``module.name`` :func:`loads` resolves, sorted."""
    t = _Tables.get()
    names = ['%s.%s' % key for key in t.by_name]
    names += ['%s.%s' % key for key in _FIXED_GLOBALS]
    return sorted(names)


# --- worker side ------------------------------------------------------------------------
def _check_sendable(optimizer, tables):
    """Walk the optimizer's state as pickle will; raise naming the first value our
    servers would refuse."""
    if type(optimizer) not in tables.optimizers:
        raise UnsendableOptimizerError(
            'cannot send optimizer %s to dist servers: only the built-in optimizers of '
            'mxkv.optimizer (%s; not subclasses, nor another library\'s classes) can be '
            'sent (a server, mxkv\'s or MXNet 1.9.1\'s, loads them as its own class of the '
            'same name)' % (_type_name(optimizer), ', '.join(OPTIMIZERS)))
    seen = set()
    todo = [(optimizer, type(optimizer).__name__)]
    while todo:
        obj, path = todo.pop()
        t = type(obj)
        if t in tables.schedulers and path != type(optimizer).__name__ + '.lr_scheduler':
            raise UnsendableOptimizerError(
                'cannot send optimizer: %s is a %s; an lr scheduler can only be the '
                "optimizer's lr_scheduler" % (path, _type_name(obj)))
        if t in tables.optimizers and path != type(optimizer).__name__:
            raise UnsendableOptimizerError(
                'cannot send optimizer: %s is an optimizer (%s) inside the optimizer'
                % (path, _type_name(obj)))
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, np.generic) and (_np_code(obj) is not None
                                            or isinstance(obj, str)):
            continue     # a numpy bool/int/float scalar, or a numpy.str_ (sent as a str)
        if t in tables.mx_name:
            state = _state_of(obj)
            todo.extend((v, '%s.%s' % (path, k)) for k, v in state.items())
        elif t in (tuple, list):
            todo.extend((v, '%s[%d]' % (path, i)) for i, v in enumerate(obj))
        elif t is dict:
            for k, v in obj.items():
                todo.append((k, '%s key %r' % (path, k)))
                todo.append((v, '%s[%r]' % (path, k)))
        elif t not in _PLAIN:
            raise UnsendableOptimizerError(
                'cannot send optimizer: %s is a %s; dist servers accept only None, bool, int, '
                'float, str, tuple, list and dict values, numpy scalars of dtype %s and '
                'numpy.str_' % (path, _type_name(obj), ', '.join(_NP_CODES)))


class _MXNetPickler(pickle._Pickler):  # pylint: disable=protected-access
    """Protocol 0 as MXNet 1.9.1 writes it, with mxkv's classes under MXNet's names and
    every string in ASCII."""

    def __init__(self, file, tables):
        super(_MXNetPickler, self).__init__(file, protocol=0, fix_imports=True)
        self._tables = tables

    def reducer_override(self, obj):
        t = type(obj)
        if t in self._tables.mx_name:
            # what copyreg._reduce_ex(obj, 0) returns for these classes
            return copyreg._reconstructor, (t, object, None), _state_of(obj)
        if _np_code(obj) is not None:
            # numpy's own reduce, as pickle.dumps(obj, 0) uses it: scalar(dtype, bytes), and
            # dtype(code, False, True) + its state; the bytes (the one bytes object a sendable
            # optimizer holds) become _codecs.encode(text, 'latin1') in pickle's save_bytes
            return obj.__reduce__()
        if t in _PLAIN or t is bytes or t is np.str_ or isinstance(obj, type) \
                or obj is copyreg._reconstructor \
                or (t is _BUILTIN_FUNCTION and obj in self._tables.np_globals):
            return NotImplemented
        raise UnsendableOptimizerError('cannot pickle a %s for dist servers' % _type_name(obj))

    def save_global(self, obj, name=None):
        fixed = self._tables.mx_name.get(obj) or self._tables.np_globals.get(obj)
        if fixed is not None:
            module, qualname = fixed
            self.write(pickle.GLOBAL + module.encode('ascii') + b'\n'
                       + qualname.encode('ascii') + b'\n')
            self.memoize(obj)
        elif obj is copyreg._reconstructor or obj is object:
            super(_MXNetPickler, self).save_global(obj, name)
        else:
            raise UnsendableOptimizerError('cannot pickle %s for dist servers'
                                           % _type_name(obj))

    def save_str(self, obj):
        # pickle.py's protocol-0 str, with the latin-1 range escaped too (raw-unicode-escape
        # writes U+0080..U+00FF as single bytes, which are not UTF-8); memoizes obj itself,
        # as the C pickler does
        text = obj.replace('\\', '\\u005c').replace('\0', '\\u0000').replace('\n', '\\u000a')
        text = text.replace('\r', '\\u000d').replace('\x1a', '\\u001a')
        raw = text.encode('raw-unicode-escape')
        if max(raw, default=0) > 0x7f:
            raw = b''.join(b'\\u%04x' % c if c > 0x7f else bytes((c,)) for c in raw)
        self.write(pickle.UNICODE + raw + b'\n')
        self.memoize(obj)

    dispatch = dict(pickle._Pickler.dispatch)  # pylint: disable=protected-access
    dispatch[str] = save_str
    dispatch[np.str_] = save_str    # as the equal str (MXNet writes a numpy scalar of UTF-32)


def dumps(optimizer):
    """The ``kController`` body a dist worker sends for ``set_optimizer(optimizer)``:
    ASCII bytes (``py_str`` of them is what MXNet's frontend passes on)."""
    tables = _Tables.get()
    _check_sendable(optimizer, tables)
    buf = io.BytesIO()
    _MXNetPickler(buf, tables).dump(optimizer)
    body = buf.getvalue()
    try:
        loads(body)
    except RefusedPickleError as err:  # what our own servers would refuse, refused here
        raise UnsendableOptimizerError('cannot send optimizer %s to dist servers: %s'
                                       % (_type_name(optimizer), err)) from err
    return body


# --- server side ------------------------------------------------------------------------
class _Placeholder(object):
    """What find_class returns: never the real object, never callable."""
    __slots__ = ('name', 'klass')

    def __init__(self, name, klass=None):
        self.name = name
        self.klass = klass

    def __repr__(self):
        return self.name


_RECONSTRUCTOR = _Placeholder('copyreg._reconstructor')
_OBJECT = _Placeholder('builtins.object')
# a numpy scalar as pickle writes it (MXNet's worker sends one for SGD(learning_rate=
# np.float32(0.5))): numpy.core.multiarray.scalar(numpy.dtype('f4', False, True) + BUILD
# (3, '<', ...), _codecs.encode('<raw bytes as latin-1 text>', 'latin1')) under protocols 0
# to 2, the bytes as a BINBYTES opcode from protocol 3. None of the three is called: the
# dtype code must be a plain bool, int or float code or U<n>, the bytes exactly its size.
_NP_SCALAR = _Placeholder('numpy.core.multiarray.scalar')
_NP_DTYPE = _Placeholder('numpy.dtype')
_CODECS_ENCODE = _Placeholder('_codecs.encode')
_FIXED_GLOBALS = {('copyreg', '_reconstructor'): _RECONSTRUCTOR,
                  ('copy_reg', '_reconstructor'): _RECONSTRUCTOR,
                  ('builtins', 'object'): _OBJECT,
                  ('__builtin__', 'object'): _OBJECT,
                  ('numpy.core.multiarray', 'scalar'): _NP_SCALAR,
                  ('numpy._core.multiarray', 'scalar'): _NP_SCALAR,
                  ('numpy', 'dtype'): _NP_DTYPE,
                  ('_codecs', 'encode'): _CODECS_ENCODE}
#: numpy scalar dtypes a server accepts (what numpy.dtype(code).str gives, without the
#: byte order)
_NP_CODES = ('b1', 'i1', 'i2', 'i4', 'i8', 'u1', 'u2', 'u4', 'u8', 'f2', 'f4', 'f8')
#: and numpy.str_ (names taken from a numpy array): U<characters>, UTF-32, loaded as the
#: equal str
_NP_STR_CODE = re.compile(r'U[1-9][0-9]{0,6}')


class _DTypeSpec(object):
    """numpy.dtype(code, False, True) as the unpickler sees it, before its BUILD (which
    sets the byte order)."""
    __slots__ = ('code', 'order')

    def __init__(self, code):
        self.code = code
        self.order = '='

    def dtype(self):
        order = {'<': '<', '>': '>', '|': '=', '=': '='}[self.order]
        return np.dtype(self.code).newbyteorder(order)


def _np_scalar_types():
    return frozenset(np.dtype(c).type for c in _NP_CODES)


def _np_code(obj):
    """the code (one of _NP_CODES) of a numpy scalar (or dtype) a server accepts, else
    None"""
    if isinstance(obj, np.generic):
        obj = obj.dtype
    elif not isinstance(obj, np.dtype):
        return None
    code = obj.str[1:]
    return code if code in _NP_CODES else None


def _what(obj):
    if isinstance(obj, _Placeholder):
        return obj.name
    if isinstance(obj, _DTypeSpec):
        return 'numpy.dtype'
    return _type_name(obj)


_KEY_TYPES = (type(None), bool, int, float, str)
_NUMBER_TYPES = frozenset((bool, int, float))


def _is_scalar(value):
    t = type(value)
    return t in _KEY_TYPES or t in _Tables.get().np_scalars


def _key(key):
    """a dict key or set element: a scalar (hashing a deeply nested tuple recurses in C
    without a depth check and crashes the process; MXNet's states key by int or str)"""
    if not _is_scalar(key):
        raise RefusedPickleError('optimizer pickle refused: a %s as a dict key or set element'
                                 % _what(key), _what(key))
    return key


def _refuse_opcode(name, detail):
    def load(self):  # pylint: disable=unused-argument
        raise RefusedPickleError('optimizer pickle refused: opcode %s (%s) is not allowed'
                                 % (name, detail))
    return load


class _RestrictedUnpickler(pickle._Unpickler):  # pylint: disable=protected-access
    """pickle's pure-Python unpickler with every opcode that calls something replaced."""

    def __init__(self, file, tables, max_ops):
        super(_RestrictedUnpickler, self).__init__(file, fix_imports=False, encoding='ASCII')
        self._tables = tables
        self._max_ops = self._ops_left = max_ops
        self._created = {}   # id -> instance created by NEWOBJ / the reconstructor
        self._built = set()  # ids BUILD has set up

    def find_class(self, module, name):
        key = (module, name)
        full = '%s.%s' % key
        if key in _FIXED_GLOBALS:
            return _FIXED_GLOBALS[key]
        klass = self._tables.by_name.get(key)
        if klass is None:
            py3 = _compat_pickle.NAME_MAPPING.get(
                key, (_compat_pickle.IMPORT_MAPPING.get(module, module), name))
            alias = ' (Python 3: %s.%s)' % py3 if py3 != key else ''
            raise RefusedPickleError(
                'optimizer pickle refused: global %s%s is not allowed (a server accepts only '
                'the built-in optimizers %s and lr schedulers %s, as mxnet.* or mxkv.* '
                'classes, holding plain values)'
                % (full, alias, ', '.join(OPTIMIZERS), ', '.join(LR_SCHEDULERS)), full)
        return _Placeholder(full, klass)

    def _new(self, cls, what):
        if not (isinstance(cls, _Placeholder) and cls.klass is not None):
            raise RefusedPickleError('optimizer pickle refused: %s of %s' % (what, _what(cls)),
                                     _what(cls))
        obj = object.__new__(cls.klass)
        self._created[id(obj)] = obj
        return obj

    def load_reduce(self):
        stack = self.stack
        args = stack.pop()
        func = stack[-1]
        if func is _NP_DTYPE or func is _NP_SCALAR or func is _CODECS_ENCODE:
            stack[-1] = self._numpy(func, args)
            return
        if func is not _RECONSTRUCTOR:
            raise RefusedPickleError('optimizer pickle refused: call of %s' % _what(func),
                                     _what(func))
        if not (type(args) is tuple and len(args) == 3 and args[1] is _OBJECT
                and args[2] is None):
            detail = ', '.join(_what(a) for a in args) if type(args) is tuple else _what(args)
            raise RefusedPickleError(
                'optimizer pickle refused: copyreg._reconstructor(%s); only '
                '(class, builtins.object, None) is allowed' % detail,
                _what(args[0]) if type(args) is tuple and args else None)
        stack[-1] = self._new(args[0], 'copyreg._reconstructor')

    def _numpy(self, func, args):
        """numpy.dtype(code, False, True), _codecs.encode(text, 'latin1') or
        numpy.core.multiarray.scalar(dtype, data), as a numpy scalar's pickle has them;
        nothing is called by name"""
        def refuse(detail):
            raise RefusedPickleError('optimizer pickle refused: %s(%s): %s'
                                     % (func.name, ', '.join(_what(a) for a in args)
                                        if type(args) is tuple else _what(args), detail),
                                     func.name)
        if type(args) is not tuple:
            refuse('arguments are not a tuple')
        if func is _NP_DTYPE:
            if not (len(args) == 3 and type(args[0]) is str and args[1] in (0, False)
                    and args[2] in (1, True)):
                refuse("only numpy.dtype(code, False, True) is allowed")
            code = args[0].lstrip('<>|=')
            if code not in _NP_CODES and not _NP_STR_CODE.fullmatch(code):
                refuse('dtype %r is not a bool, int, float or str scalar type (allowed: %s, '
                       'U<n>)' % (args[0], ', '.join(_NP_CODES)))
            spec = _DTypeSpec(code)
            self._created[id(spec)] = spec
            return spec
        if func is _CODECS_ENCODE:
            if not (len(args) == 2 and type(args[0]) is str and args[1] in ('latin1',
                                                                             'latin-1')):
                refuse("only _codecs.encode(text, 'latin1') is allowed")
            try:
                return args[0].encode('latin1')
            except UnicodeEncodeError:
                refuse('text outside latin-1')
        if not (len(args) == 2 and type(args[0]) is _DTypeSpec
                and self._created.get(id(args[0])) is args[0] and type(args[1]) is bytes):
            refuse('only numpy.core.multiarray.scalar(dtype, bytes) is allowed')
        spec, data = args
        if spec.code[0] == 'U':
            # what numpy.str_ holds: UTF-32 code units, NUL-padded at the end
            if len(data) != 4 * int(spec.code[1:]):
                refuse('%d bytes for a %s string' % (len(data), spec.code))
            big = spec.order == '>' or (spec.order in '=|' and sys.byteorder == 'big')
            try:
                return data.decode('utf-32-be' if big else 'utf-32-le').rstrip('\0')
            except UnicodeDecodeError as err:
                refuse('not UTF-32 text (%s)' % err.reason)
        dtype = spec.dtype()
        if len(data) != dtype.itemsize:
            refuse('%d bytes for a %s scalar of %d' % (len(data), dtype.name, dtype.itemsize))
        return np.frombuffer(data, dtype=dtype)[0]   # a numpy scalar, native order

    def load_newobj(self):
        args = self.stack.pop()
        cls = self.stack.pop()
        if args != ():
            raise RefusedPickleError('optimizer pickle refused: NEWOBJ of %s with arguments'
                                     % _what(cls), _what(cls))
        self.append(self._new(cls, 'NEWOBJ'))

    def load_newobj_ex(self):
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        if args != () or type(kwargs) is not dict or kwargs:
            raise RefusedPickleError('optimizer pickle refused: NEWOBJ_EX of %s with '
                                     'arguments' % _what(cls), _what(cls))
        self.append(self._new(cls, 'NEWOBJ_EX'))

    def load_build(self):
        state = self.stack.pop()
        inst = self.stack[-1]
        if self._created.get(id(inst)) is not inst:
            raise RefusedPickleError('optimizer pickle refused: BUILD on a %s' % _what(inst),
                                     _what(inst))
        if id(inst) in self._built:
            raise RefusedPickleError('optimizer pickle refused: second BUILD on a %s'
                                     % _what(inst), _what(inst))
        if type(inst) is _DTypeSpec:
            # numpy's dtype state: (version, byte order, subarray, names, fields, elsize,
            # alignment, flags[, metadata]); for a scalar dtype only the byte order counts
            if not (type(state) is tuple and len(state) in (8, 9) and state[0] in (3, 4)
                    and state[1] in ('<', '>', '|', '=')
                    and state[2] is None and state[3] is None and state[4] is None
                    and all(type(v) is int for v in state[5:8])
                    and (len(state) == 8 or state[8] is None)):
                raise RefusedPickleError('optimizer pickle refused: numpy.dtype state %s is '
                                         'not that of a scalar dtype' % _what(state),
                                         'numpy.dtype')
            self._built.add(id(inst))
            inst.order = state[1]
            return
        if type(state) is not dict or any(type(k) is not str for k in state):
            raise RefusedPickleError('optimizer pickle refused: the state of a %s must be a '
                                     'dict with str keys, not a %s' % (_what(inst), _what(state)),
                                     _what(inst))
        self._built.add(id(inst))
        if type(inst) in self._tables.optimizers:
            type(inst).__setstate__(inst, state)   # mxkv's Optimizer.__setstate__
        else:
            inst.__dict__.update(state)

    def _target(self, want, opname):
        target = self.stack[-1] if self.stack else None
        if type(target) is not want:
            raise RefusedPickleError('optimizer pickle refused: %s on a %s'
                                     % (opname, _what(target)), _what(target))
        return target

    def load_append(self):
        value = self.stack.pop()
        self._target(list, 'APPEND').append(value)

    def load_appends(self):
        items = self.pop_mark()
        self._target(list, 'APPENDS').extend(items)

    def load_dict(self):
        items = self.pop_mark()
        self.append({_key(items[i]): items[i + 1] for i in range(0, len(items), 2)})

    def load_setitem(self):
        value = self.stack.pop()
        key = self.stack.pop()
        self._target(dict, 'SETITEM')[_key(key)] = value

    def load_setitems(self):
        items = self.pop_mark()
        target = self._target(dict, 'SETITEMS')
        for i in range(0, len(items), 2):
            target[_key(items[i])] = items[i + 1]

    def load_additems(self):
        items = self.pop_mark()
        self._target(set, 'ADDITEMS').update(_key(k) for k in items)

    def load_frozenset(self):
        items = self.pop_mark()
        self.append(frozenset(_key(k) for k in items))

    def load_inst(self):
        module = self.readline()[:-1].decode('utf-8')
        name = self.readline()[:-1].decode('utf-8')
        klass = self.find_class(module, name)   # refuses every global but ours
        raise RefusedPickleError('optimizer pickle refused: INST of %s (calls it)'
                                 % _what(klass), _what(klass))

    def load_obj(self):
        args = self.pop_mark()
        klass = args[0] if args else None
        raise RefusedPickleError('optimizer pickle refused: OBJ of %s (calls it)'
                                 % _what(klass), _what(klass))

    def _load_ext(self, code):
        key = copyreg._inverted_registry.get(code)  # pylint: disable=protected-access
        name = '%s.%s' % key if key else None
        raise RefusedPickleError('optimizer pickle refused: extension code %d (%s) is not '
                                 'allowed' % (code, name or 'unregistered'), name)

    def load_ext1(self):
        self._load_ext(self.read(1)[0])

    def load_ext2(self):
        self._load_ext(struct.unpack('<H', self.read(2))[0])

    def load_ext4(self):
        self._load_ext(struct.unpack('<i', self.read(4))[0])

    def persistent_load(self, pid):
        raise RefusedPickleError('optimizer pickle refused: persistent ids are not allowed')

    # opcode whitelist: everything not listed here is refused
    _ALLOWED = ('MARK STOP POP POP_MARK DUP FLOAT INT BININT BININT1 LONG BININT2 NONE '
                'STRING BINSTRING SHORT_BINSTRING UNICODE BINUNICODE DICT EMPTY_DICT GET '
                'BINGET LONG_BINGET LIST EMPTY_LIST PUT BINPUT LONG_BINPUT TUPLE EMPTY_TUPLE '
                'BINFLOAT TRUE FALSE PROTO TUPLE1 TUPLE2 TUPLE3 NEWTRUE NEWFALSE LONG1 LONG4 '
                'BINBYTES SHORT_BINBYTES SHORT_BINUNICODE BINUNICODE8 BINBYTES8 EMPTY_SET '
                'MEMOIZE FRAME BYTEARRAY8 GLOBAL STACK_GLOBAL').split()
    dispatch = {}
    for _op in _ALLOWED:
        _code = getattr(pickle, _op)[0]
        dispatch[_code] = pickle._Unpickler.dispatch[_code]  # pylint: disable=protected-access
    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.NEWOBJ[0]] = load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex
    dispatch[pickle.BUILD[0]] = load_build
    dispatch[pickle.APPEND[0]] = load_append
    dispatch[pickle.APPENDS[0]] = load_appends
    dispatch[pickle.SETITEM[0]] = load_setitem
    dispatch[pickle.SETITEMS[0]] = load_setitems
    dispatch[pickle.ADDITEMS[0]] = load_additems
    dispatch[pickle.DICT[0]] = load_dict
    dispatch[pickle.FROZENSET[0]] = load_frozenset
    dispatch[pickle.INST[0]] = load_inst
    dispatch[pickle.OBJ[0]] = load_obj
    dispatch[pickle.EXT1[0]] = load_ext1
    dispatch[pickle.EXT2[0]] = load_ext2
    dispatch[pickle.EXT4[0]] = load_ext4
    for _op, _why in (('PERSID', 'persistent id'),
                      ('BINPERSID', 'persistent id'), ('NEXT_BUFFER', 'out-of-band buffer'),
                      ('READONLY_BUFFER', 'out-of-band buffer')):
        dispatch[getattr(pickle, _op)[0]] = _refuse_opcode(_op, _why)
    del _op, _why, _code


def _counted(load):
    def counted(self):
        self._ops_left -= 1
        if self._ops_left < 0:
            raise RefusedPickleError('optimizer pickle refused: more than %d opcodes'
                                     % self._max_ops)
        load(self)
    return counted


class _Dispatch(dict):
    def __missing__(self, code):
        def load(self):  # pylint: disable=unused-argument
            raise RefusedPickleError('optimizer pickle refused: opcode %r is not allowed'
                                     % bytes((code,)))
        return load


_RestrictedUnpickler.dispatch = _Dispatch(
    (code, _counted(load)) for code, load in _RestrictedUnpickler.dispatch.items())


# What each attribute of MXNet 1.9.1's optimizers and lr schedulers holds (optimizer.py,
# lr_scheduler.py), as the loaded graph must have it: names are str, multipliers and
# counters numbers, everything else a scalar (a numpy scalar included). Nothing deeper can
# get through: a value the server later hashes or compares (Optimizer._get_lrs hashes
# idx2name[index]) is a scalar, so a tuple nested 400000 deep (hashing it overflows the C
# stack) or a DAG of shared tuples (2^64 steps to hash) is refused here.
_STR, _NUMBER, _INT, _SCALAR = 'a str', 'a number', 'an int', 'a scalar'
_OPT_SPECS = {
    'idx2name': ('dict', _STR),
    'lr_mult': ('dict', _NUMBER),
    'wd_mult': ('dict', _NUMBER),
    '_index_update_count': ('dict', _INT),
    '_all_index_update_counts': ('dict', ('dict', _INT)),
    # () or (symbol.attr_dict(), symbol.list_arguments())
    'sym_info': ('sym_info',),
    'param_dict': ('empty',),   # never pickled; Optimizer.__setstate__ sets {}
    'weight_previous': ('empty',),   # DCASGD's, never filled by MXNet 1.9.1
    'cumgrads': ('empty',),   # LBSGD's accumulated gradients (NDArrays): none when sent
}
_WANT = {_STR: 'a str (a parameter name)', _NUMBER: 'a number', _INT: 'an int',
         _SCALAR: 'None, a bool, int, float, str or numpy scalar'}


def _short(key):
    text = repr(key)
    return text if len(text) <= 60 else text[:57] + '...'


def _check_value(value, spec, where, tables, seen):
    """value against spec; containers are walked once per (object, spec)"""
    todo = [(value, spec, where)]
    while todo:
        value, spec, where = todo.pop()
        t = type(value)
        if spec in _WANT:
            if spec is _STR:
                ok = t is str
            elif spec is _NUMBER:
                ok = t in _NUMBER_TYPES or t in tables.np_scalars
            elif spec is _INT:
                ok = t is int or t is bool or (t in tables.np_scalars
                                               and value.dtype.kind in 'biu')
            else:
                ok = t in _KEY_TYPES or t in tables.np_scalars
            if not ok:
                raise RefusedPickleError(
                    'optimizer pickle refused: %s is a %s; MXNet\'s optimizer holds %s there'
                    % (where, _what(value), _WANT[spec]), _what(value))
            continue
        if (id(value), spec) in seen:
            continue
        seen.add((id(value), spec))
        kind = spec[0]
        if kind == 'empty':
            if not (t is dict and not value):
                raise RefusedPickleError('optimizer pickle refused: %s is a %s, not {}'
                                         % (where, _what(value)), _what(value))
        elif kind == 'dict':
            if t is not dict:
                raise RefusedPickleError(
                    'optimizer pickle refused: %s is a %s; MXNet\'s optimizer holds a dict '
                    'there' % (where, _what(value)), _what(value))
            for k, v in value.items():
                todo.append((k, _SCALAR, '%s key %s' % (where, _short(k))))
                todo.append((v, spec[1], '%s[%s]' % (where, _short(k))))
        elif kind == 'seq':
            if t is not list and t is not tuple:
                raise RefusedPickleError(
                    'optimizer pickle refused: %s is a %s; MXNet holds a list there'
                    % (where, _what(value)), _what(value))
            todo.extend((v, spec[1], '%s[%d]' % (where, i)) for i, v in enumerate(value))
        elif kind == 'sym_info':
            if (t is not list and t is not tuple) or len(value) not in (0, 2):
                raise RefusedPickleError(
                    'optimizer pickle refused: %s is a %s; MXNet\'s optimizer holds () or '
                    '(attribute dict, argument names) there' % (where, _what(value)),
                    _what(value))
            if value:
                todo.append((value[0], ('dict', ('dict', _STR)), where + '[0]'))
                todo.append((value[1], ('seq', _STR), where + '[1]'))


def _check_loaded(top, tables):
    """The loaded graph: an optimizer on top, an lr scheduler only as its lr_scheduler,
    exactly mxkv's attributes, each holding what MXNet's class holds there."""
    if type(top) not in tables.optimizers:
        raise RefusedPickleError('optimizer pickle refused: it holds a %s, not an optimizer'
                                 % _what(top), _what(top))
    seen = set()
    for obj in (top, top.__dict__.get('lr_scheduler')):
        if obj is None:
            continue
        t = type(obj)
        name = t.__name__
        state = obj.__dict__
        have, want = set(state), tables.attrs[t] | {'param_dict'}
        if have - want or want - have - {'param_dict'}:
            raise RefusedPickleError(
                'optimizer pickle refused: %s state has unexpected attributes %s and '
                'lacks %s' % (_what(obj), sorted(have - want) or 'none',
                              sorted(want - have - {'param_dict'}) or 'none'), _what(obj))
        defaults = tables.defaults[t]
        for key, value in state.items():
            where = '%s.%s' % (name, key)
            if key == 'lr_scheduler' and t in tables.optimizers:
                if value is not None and type(value) not in tables.schedulers:
                    raise RefusedPickleError(
                        'optimizer pickle refused: lr_scheduler is a %s' % _what(value),
                        _what(value))
                continue
            if t in tables.optimizers and key in _OPT_SPECS:
                spec = _OPT_SPECS[key]
            elif type(defaults.get(key)) in (list, tuple):
                spec = ('seq', _NUMBER)      # MultiFactorScheduler.step
            else:
                spec = _SCALAR
            _check_value(value, spec, where, tables, seen)


def loads(body, max_bytes=MAX_BODY_BYTES, max_opcodes=MAX_OPCODES):
    """The optimizer in a ``kController`` body (bytes, or str as MXNet's frontend passes
    it), as an mxkv optimizer; raises :class:`RefusedPickleError` for anything else."""
    if isinstance(body, str):
        try:
            body = body.encode('utf-8')
        except UnicodeEncodeError as err:
            raise RefusedPickleError('optimizer pickle refused: %s' % err) from None
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise RefusedPickleError('optimizer pickle refused: body is a %s, not bytes'
                                 % _type_name(body))
    body = bytes(body)
    if len(body) > max_bytes:
        raise RefusedPickleError('optimizer pickle refused: %d bytes, more than the limit of '
                                 '%d' % (len(body), max_bytes))
    tables = _Tables.get()
    unpickler = _RestrictedUnpickler(io.BytesIO(body), tables, max_opcodes)
    try:
        top = unpickler.load()
        _check_loaded(top, tables)
    except RefusedPickleError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
            AttributeError, UnicodeDecodeError, struct.error, OverflowError,
            MemoryError, RecursionError) as err:
        raise RefusedPickleError('optimizer pickle refused: malformed pickle (%s: %s)'
                                 % (type(err).__name__, err)) from None
    return top
