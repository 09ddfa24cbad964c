"""KVStore over libmxkv (the API of ``mxnet.kvstore.KVStore`` 1.9.1)."""
import ctypes
import numbers
import os
import sys
import threading
import traceback
import weakref

from ..base import (_LIB, c_str, check_call, last_error, mx_uint, py_str, KVStoreHandle,
                    MXKVUsageError)
from .._lib import UPDATER, STR_UPDATER, raw_function
from ..ndarray import NDArray, _ndarray_cls
from .. import optimizer as opt
from .. import _optimizer_pickle
from .base import _ctype_key_value, _ctype_dict, KVStoreBase, MXKVUsageTypeError

__all__ = ['KVStore']

_SERVER_COMMANDS = {'kController': 0, 'kSetMultiPrecision': 1, 'kStopServer': 2,
                    'kSyncMode': 3, 'kSetGradientCompression': 4, 'kSetProfilerParams': 5}


def _get_kvstore_server_command_type(command):
    if command not in _SERVER_COMMANDS:
        raise MXKVUsageError('Unknown command type to send to server: %r' % (command,))
    return _SERVER_COMMANDS[command]


# --- the single-key fast path ----------------------------------------------------------
# push/pull/pushpull of one int or str key with one NDArray (the common case, and the
# whole cost of a tiny push+pull) skip the general marshalling: the key's 1-element C
# array is cached, the value is passed as ``byref(ndarray.handle)`` (a pointer to the
# one NDArrayHandle, i.e. a 1-element NDArrayHandle array), and the C function is
# called through a function object without argtypes (see _lib.raw_function): handles
# are c_void_p objects, the bool a c_bool, counts and priority Python ints in C int
# range (ctypes passes them as C int: the same size and bits as mx_uint 1).  Anything
# else (lists, numpy ints, bools, closed objects, out-of-range keys or priorities...)
# takes the general path, which validates and reports errors exactly as before.
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_C_INT1 = ctypes.c_int * 1
_C_STR1 = ctypes.c_char_p * 1
_TRUE, _FALSE = ctypes.c_bool(True), ctypes.c_bool(False)
_byref = ctypes.byref
_KEY_CACHE = {}          # key (int or str) -> (1-element C key array, 0 int / 1 str key)
_KEY_CACHE_MAX = 1 << 14


def _raw(name):
    fn = raw_function(_LIB, name)
    if fn is None:
        def fn(*args):  # not exported: fail as the general path would (AttributeError)
            return getattr(_LIB, name)(*args)
    return fn


_PUSH = (_raw('MXKVStorePush'), _raw('MXKVStorePushEx'))
_PULL = (_raw('MXKVStorePullWithSparse'), _raw('MXKVStorePullWithSparseEx'))
_PUSHPULL = (_raw('MXKVStorePushPull'), _raw('MXKVStorePushPullEx'))


def _one_key(key):
    """(C array holding just `key`, 0 or 1 for str) for an int or str key, or None when
    the key needs the general path (ints outside C int).  The array is never modified
    once built, so concurrent calls may share it."""
    if type(key) is int:
        if not _INT32_MIN <= key <= _INT32_MAX:
            return None
        ent = (_C_INT1(key), 0)
    else:
        ent = (_C_STR1(key.encode('utf-8')), 1)
    if len(_KEY_CACHE) < _KEY_CACHE_MAX:
        _KEY_CACHE[key] = ent
    return ent


class _PerThread(threading.local):
    """One store's per-thread state: the first exception an updater raised on this
    thread during the current call (updaters run on the thread that pushes)."""
    error = None


# Every dist store of this process. A forked child (os.fork, multiprocessing's fork start
# method) shares no node with its parent: the library's sockets and threads in its copy of
# memory are the parent's, and closing them there would tear down the parent's ZeroMQ
# context (the parent then aborts in libzmq). The child forgets those handles at once.
_DIST_STORES = weakref.WeakSet()


def _forget_dist_stores_in_child():
    for kv in list(_DIST_STORES):
        kv._forget_parents_store()  # pylint: disable=protected-access


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_forget_dist_stores_in_child)


def _priority(priority, op):
    """the priority as a C int: an int (MXNet's ctypes.c_int takes ints only; mxkv also
    takes floats and numpy numbers, README deviation 23); a str or None raises TypeError
    as in MXNet"""
    if isinstance(priority, numbers.Real):
        return int(priority)
    raise MXKVUsageTypeError('KVStore.%s: priority must be an int, not %s'
                             % (op, type(priority).__name__))


def _keys_text(keys):
    uniq = []
    for k in keys:
        if k not in uniq:
            uniq.append(k)
    if len(uniq) == 1:
        return 'key %r' % (uniq[0],)
    return 'keys %r' % (uniq,)


def _print_server_updater_error(key, err):
    """A dist server's updater raised: nothing of this process waits for the push it
    served, so print the traceback (MXNet's server prints 'Exception ignored on calling
    ctypes callback function' and the traceback) and go on."""
    try:
        text = ''.join(traceback.format_exception(type(err), err, err.__traceback__))
        sys.stderr.write('mxkv server: the updater raised on key %r; the stored value is '
                         'left as it was:\n%s' % (key, text))
        sys.stderr.flush()
    except Exception:  # pylint: disable=broad-except
        pass   # nothing may cross the C callback


class KVStore(KVStoreBase):
    """A key-value store for synchronising values over devices (``mxkv.kv.create``).

    The store's handle is freed by :meth:`close`, at the end of a ``with``
    block, or on garbage collection.  Keys are ints or strs (one kind per
    store); values are NDArrays, lists of NDArrays (several devices) or lists
    of those for lists of keys, exactly as in MXNet.
    """

    def __init__(self, handle):
        if not isinstance(handle, KVStoreHandle):
            raise MXKVUsageError('KVStore needs a KVStoreHandle')
        self.handle = handle
        self._updater = None
        # Every callback pair ever given to the library, kept as long as this object: a
        # push in flight on another thread keeps calling the updater it took when it
        # started, after _set_updater replaced it or close() freed the store (and holds
        # a reference to this object while it runs).
        self._updater_funcs = []
        self._tls = _PerThread()
        # set (by the thread concerned, before its call returns) once an updater has
        # raised: until then the fast paths skip the per-thread look-up
        self._had_error = False
        self._is_p3 = (os.getenv('DMLC_PS_VAN_TYPE', '') == 'p3')
        self._pid = os.getpid()     # the process whose node this store is
        self._parent_pid = None     # set in a forked child that forgot the store
        kv_type = ctypes.c_char_p()
        self._dist = (_LIB.MXKVStoreGetType(handle, ctypes.byref(kv_type)) != 0
                      or b'dist' in (kv_type.value or b''))
        if self._dist:
            _DIST_STORES.add(self)

    # --- lifetime ----------------------------------------------------------------
    def close(self):
        """Free the store (idempotent).  Arrays pulled from it stay valid.

        In a forked child a dist store created by the parent is only forgotten (its
        node, sockets and threads are the parent's)."""
        hdl, self.handle = getattr(self, 'handle', None), None
        if hdl is not None and hdl.value:
            if os.getpid() != getattr(self, '_pid', None) and getattr(self, '_dist', True):
                self._parent_pid = getattr(self, '_pid', None)
                return
            check_call(_LIB.MXKVStoreFree(hdl))

    def _forget_parents_store(self):
        """In a forked child: drop the parent's dist store without touching it."""
        if self.handle is not None and os.getpid() != self._pid:
            self._parent_pid = self._pid
            self.handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # pylint: disable=broad-except
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _h(self, op, keys=None):
        if self.handle is None:
            what = '' if keys is None else ' (%s)' % _keys_text(keys)
            if self._parent_pid is not None:
                raise MXKVUsageError(
                    'KVStore.%s%s: this dist store belongs to process %d, which forked this '
                    'one (pid %d); a forked child cannot use its parent\'s dist store (create '
                    'the store after the fork, or use the spawn start method)'
                    % (op, what, self._parent_pid, os.getpid()))
            raise MXKVUsageError('KVStore.%s on a closed KVStore%s' % (op, what))
        return self.handle

    def _check(self, ret, op, keys):
        """Raise the library's error, naming the operation and keys; then any exception
        an updater raised on this thread during the call."""
        tls = self._tls
        err, tls.error = tls.error, None
        if ret != 0:
            exc = last_error()
            msg = str(exc)
            raise type(exc)('%s\n  in KVStore.%s (%s)' % (msg, op, _keys_text(keys)))
        if err is not None:
            raise err

    # --- data operations -------------------------------------------------------------
    def init(self, key, value):
        """Initialise one or several keys (each exactly once) with values."""
        ckeys, cvals, use_str, flat = _ctype_key_value(key, value, 'init')
        hdl = self._h('init', flat)
        if use_str:
            ret = _LIB.MXKVStoreInitEx(hdl, len(ckeys), ckeys, cvals)
        else:
            ret = _LIB.MXKVStoreInit(hdl, len(ckeys), ckeys, cvals)
        self._check(ret, 'init', flat)

    def push(self, key, value, priority=0):
        """Push values; several values for one key are summed, then the updater (default:
        assign) combines the sum with the stored value."""
        tk = type(key)
        if ((tk is int or tk is str) and isinstance(value, NDArray) and type(priority) is int
                and _INT32_MIN <= priority <= _INT32_MAX):
            hdl, vh = self.handle, value.handle
            if hdl is not None and vh is not None:
                ent = _KEY_CACHE.get(key) or _one_key(key)
                if ent is not None:
                    ret = _PUSH[ent[1]](hdl, 1, ent[0], _byref(vh), priority)
                    if ret or (self._had_error and self._tls.error is not None):
                        self._check(ret, 'push', [key])
                    return
        ckeys, cvals, use_str, flat = _ctype_key_value(key, value, 'push')
        hdl = self._h('push', flat)
        fn = _LIB.MXKVStorePushEx if use_str else _LIB.MXKVStorePush
        self._check(fn(hdl, len(ckeys), ckeys, cvals, _priority(priority, 'push')), 'push',
                    flat)

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        """Copy the stored values into `out` (one or several arrays per key)."""
        tk = type(key)
        if ((tk is int or tk is str) and isinstance(out, NDArray) and type(priority) is int
                and _INT32_MIN <= priority <= _INT32_MAX):
            hdl, oh = self.handle, out.handle
            if hdl is not None and oh is not None:
                ent = _KEY_CACHE.get(key) or _one_key(key)
                if ent is not None:
                    ret = _PULL[ent[1]](hdl, 1, ent[0], _byref(oh), priority,
                                        _TRUE if ignore_sparse else _FALSE)
                    if ret or (self._had_error and self._tls.error is not None):
                        self._check(ret, 'pull', [key])
                    return
        if out is None:
            raise MXKVUsageError('KVStore.pull: out is required (key %r)' % (key,))
        ckeys, cvals, use_str, flat = _ctype_key_value(key, out, 'pull')
        hdl = self._h('pull', flat)
        fn = _LIB.MXKVStorePullWithSparseEx if use_str else _LIB.MXKVStorePullWithSparse
        self._check(fn(hdl, len(ckeys), ckeys, cvals, _priority(priority, 'pull'),
                       bool(ignore_sparse)),
                    'pull', flat)

    def pushpull(self, key, value, out=None, priority=0):
        """push then pull; without `out` the result is written back into `value`."""
        tk = type(key)
        if ((tk is int or tk is str) and isinstance(value, NDArray) and type(priority) is int
                and _INT32_MIN <= priority <= _INT32_MAX
                and (out is None or isinstance(out, NDArray))):
            hdl, vh = self.handle, value.handle
            oh = vh if out is None else out.handle
            if hdl is not None and vh is not None and oh is not None:
                ent = _KEY_CACHE.get(key) or _one_key(key)
                if ent is not None:
                    ck = ent[0]
                    ret = _PUSHPULL[ent[1]](hdl, 1, ck, 1, ck, _byref(vh), _byref(oh),
                                            priority)
                    if ret or (self._had_error and self._tls.error is not None):
                        self._check(ret, 'pushpull', [key, key])
                    return
        cvkeys, cvals, use_str, flat = _ctype_key_value(key, value, 'pushpull')
        if out is not None:
            cokeys, couts, _, oflat = _ctype_key_value(key, out, 'pushpull')
        else:
            cokeys, couts, oflat = cvkeys, cvals, flat
        hdl = self._h('pushpull', flat)
        fn = _LIB.MXKVStorePushPullEx if use_str else _LIB.MXKVStorePushPull
        self._check(fn(hdl, len(cvkeys), cvkeys, len(cokeys), cokeys, cvals, couts,
                       _priority(priority, 'pushpull')), 'pushpull', flat + oflat)

    def broadcast(self, key, value, out, priority=0):
        """init `key` with `value`, then pull it into `out`."""
        cvkeys, cvals, use_str, flat = _ctype_key_value(key, value, 'broadcast')
        cokeys, couts, _, oflat = _ctype_key_value(key, out, 'broadcast')
        hdl = self._h('broadcast', flat)
        fn = _LIB.MXKVStoreBroadcastEx if use_str else _LIB.MXKVStoreBroadcast
        self._check(fn(hdl, len(cvkeys), cvkeys, len(cokeys), cokeys, cvals, couts,
                       _priority(priority, 'broadcast')), 'broadcast', flat + oflat)

    def row_sparse_pull(self, key, out=None, priority=0, row_ids=None):
        """Pull the rows `row_ids` of row_sparse values into row_sparse `out`."""
        if out is None or row_ids is None:
            raise MXKVUsageError('KVStore.row_sparse_pull: out and row_ids are required '
                                 '(key %r)' % (key,))
        if isinstance(row_ids, NDArray):
            row_ids = [row_ids]
        if not isinstance(row_ids, list):
            raise MXKVUsageError('row_ids should be NDArray or list of NDArray (key %r)' % (key,))
        first_out = out
        single_rowid = False
        if len(row_ids) == 1 and isinstance(out, list):
            single_rowid = True
            first_out = [out[0]]
        ckeys, cvals, use_str, flat = _ctype_key_value(key, first_out, 'row_sparse_pull')
        _, crow_ids, _, _ = _ctype_key_value(key, row_ids, 'row_sparse_pull')
        if len(crow_ids) != len(cvals):
            raise MXKVUsageError("KVStore.row_sparse_pull: the number of row_ids doesn't match "
                                 'the number of values (%s)' % _keys_text(flat))
        hdl = self._h('row_sparse_pull', flat)
        fn = _LIB.MXKVStorePullRowSparseEx if use_str else _LIB.MXKVStorePullRowSparse
        self._check(fn(hdl, len(ckeys), ckeys, cvals, crow_ids,
                       _priority(priority, 'row_sparse_pull')),
                    'row_sparse_pull', flat)
        if single_rowid:
            for out_i in out[1:]:
                out[0].copyto(out_i)

    # --- configuration -------------------------------------------------------------
    def is_capable(self, capability):
        """'optimizer' -> whether set_optimizer works on this store."""
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return not self._is_p3
        raise ValueError('Unknown capability: {}'.format(capability))

    def set_gradient_compression(self, compression_params):
        """2-bit gradient compression ({'type': '2bit', 'threshold': 0.5}); device and dist
        stores only."""
        if ('device' in self.type) or ('dist' in self.type):
            ckeys, cvals = _ctype_dict(compression_params)
            check_call(_LIB.MXKVStoreSetGradientCompression(
                self._h('set_gradient_compression'), len(compression_params), ckeys, cvals))
        else:
            raise MXKVUsageError('Gradient compression is not supported for this type of '
                                 'kvstore')

    def set_optimizer(self, optimizer):
        """Use `optimizer` as the updater (locally; on dist workers it is sent to servers)."""
        is_worker = ctypes.c_int()
        check_call(_LIB.MXKVStoreIsWorkerNode(ctypes.byref(is_worker)))
        if 'dist' in self.type and is_worker.value:
            # MXNet's class names and state, protocol 0: real MXNet servers load it too
            optim_str = py_str(_optimizer_pickle.dumps(optimizer))
            self._send_command_to_servers(_get_kvstore_server_command_type('kController'),
                                          optim_str)
            if optimizer.multi_precision:
                self._send_command_to_servers(
                    _get_kvstore_server_command_type('kSetMultiPrecision'), '')
        else:
            self._set_updater(opt.get_updater(optimizer))

    @property
    def type(self):
        """the store's type string (lower case)"""
        kv_type = ctypes.c_char_p()
        check_call(_LIB.MXKVStoreGetType(self._h('type'), ctypes.byref(kv_type)))
        return py_str(kv_type.value)

    @property
    def rank(self):
        """rank of this worker (0 for local stores)"""
        rank = ctypes.c_int()
        check_call(_LIB.MXKVStoreGetRank(self._h('rank'), ctypes.byref(rank)))
        return rank.value

    @property
    def num_workers(self):
        """number of workers (1 for local stores)"""
        size = ctypes.c_int()
        check_call(_LIB.MXKVStoreGetGroupSize(self._h('num_workers'), ctypes.byref(size)))
        return size.value

    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Write the optimizer's states (and optionally the optimizer) to `fname`."""
        if self._updater is None:
            raise MXKVUsageError('Cannot save states for distributed training')
        with open(fname, 'wb') as fout:
            fout.write(self._updater.get_states(dump_optimizer))

    def load_optimizer_states(self, fname):
        """Read states written by :meth:`save_optimizer_states`."""
        if self._updater is None:
            raise MXKVUsageError('Cannot load states for distributed training')
        # as MXNet: the updater's set_states is looked up before the file is opened (an
        # updater that is a plain function raises AttributeError whatever the file)
        set_states = self._updater.set_states
        with open(fname, 'rb') as fin:
            set_states(fin.read())

    def _set_updater(self, updater):
        """Install ``updater(key, recv, stored)``; it must modify `stored` in place.

        Int-keyed stores pass the int key, str-keyed stores pass the key as bytes
        (as MXNet does).  An exception raised by the updater is re-raised by the
        push/pushpull call that triggered it, on the thread that made that call.  On a
        dist server (the optimizer a worker sent) no call of this process waits for
        it: its traceback is printed on stderr, as MXNet's server prints it, and the
        stored value stays as it was.
        Every updater installed stays referenced until this object is collected (a
        push in flight on another thread may still call a replaced one).
        """
        hdl = self._h('_set_updater')
        self._updater = updater
        selfref = weakref.ref(self)
        is_worker = ctypes.c_int()
        check_call(_LIB.MXKVStoreIsWorkerNode(ctypes.byref(is_worker)))
        on_server = not is_worker.value

        def call(key, recv_handle, local_handle, _):
            recv = _ndarray_cls(ctypes.c_void_p(recv_handle))
            local = _ndarray_cls(ctypes.c_void_p(local_handle))
            store = selfref()
            try:
                updater(key, recv, local)
            except BaseException as err:  # pylint: disable=broad-except
                if on_server:
                    _print_server_updater_error(key, err)
                elif store is not None:
                    tls = store._tls
                    if tls.error is None:
                        tls.error = err
                    store._had_error = True
            # recv/local free their handles when the last reference goes (at once,
            # unless the updater kept them)

        funcs = (UPDATER(call), STR_UPDATER(call))
        self._updater_funcs.append(funcs)   # never dropped: see __init__
        check_call(_LIB.MXKVStoreSetUpdaterEx(hdl, funcs[0], funcs[1], None))

    set_updater = _set_updater  # name used by the tutorial text and MXNet <= 1.0

    def _barrier(self):
        """Global barrier among workers (no-op for local stores)."""
        check_call(_LIB.MXKVStoreBarrier(self._h('_barrier')))

    def _send_command_to_servers(self, head, body):
        """Send (head, body) to all servers (no-op for local stores)."""
        check_call(_LIB.MXKVStoreSendCommmandToServers(self._h('_send_command_to_servers'),
                                                       mx_uint(head), c_str(body)))
