"""Locating and loading ``libmxkv.so`` and declaring the C prototypes.

The library exports MXNet 1.9.1's C API (``include/mxnet/c_api.h``) for the
KVStore and the NDArray functions a frontend needs.  Every function this
package calls is declared below with ``argtypes``/``restype``; nothing is
called through an undeclared ctypes attribute.

Search order for the shared library:

1. ``MXKV_LIBRARY_PATH`` (a file, or a directory holding ``libmxkv.so``); when
   it is set, nothing else is tried;
2. ``libmxkv.so`` inside this package (the wheel that ``pip install
   bindings/python`` builds ships it there);
3. ``target/release/libmxkv.so`` in this package's folder or any folder above
   it (a source checkout: ``bindings/python/mxkv`` -> repository root).

When none is found, the error says how to get one for the way the package was
installed: ``cargo build --release`` in a source checkout, reinstalling the
platform wheel otherwise.

Because the API is MXNet's, ``MXKV_LIBRARY_PATH`` may also point at a real
``libmxnet.so``; that is how the differential tests validate this binding.
"""
import ctypes
import os
import sys

__all__ = ['find_library', 'installation', 'load', 'raw_function', 'PROTOTYPES', 'UPDATER',
           'STR_UPDATER', 'SERVER_CONTROLLER', 'LIBRARY_NAMES']

LIBRARY_NAMES = ('libmxkv.so', 'libmxkv.dylib', 'mxkv.dll')

# --- C types ---------------------------------------------------------------
_h = ctypes.c_void_p                      # NDArrayHandle / KVStoreHandle
_u32 = ctypes.c_uint32                    # mx_uint
_i32 = ctypes.c_int
_P = ctypes.POINTER
_hp = _P(ctypes.c_void_p)                 # NDArrayHandle* / KVStoreHandle*
_sp = _P(ctypes.c_char_p)                 # const char**

# typedef void (MXKVStoreUpdater)(int key, NDArrayHandle recv, NDArrayHandle local, void *handle);
UPDATER = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
# typedef void (MXKVStoreStrUpdater)(const char* key, NDArrayHandle recv, NDArrayHandle local, void *handle);
STR_UPDATER = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_void_p)
# typedef void (MXKVStoreServerController)(int head, const char *body, void *controller_handle);
SERVER_CONTROLLER = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)

# name -> (restype, [argtypes]).  Signatures follow MXNet 1.9.1's c_api.h.
# Two deliberate, ABI-identical relaxations so that MXNet's own unmodified
# frontends (which pass ``mx_uint(...)`` objects) keep working:
#   * MXKVStoreSendCommmandToServers' ``int cmd_id`` is declared c_uint32;
#   * nothing else: every other type is exactly the header's.
PROTOTYPES = {
    # --- errors, version, shutdown
    'MXGetLastError': (ctypes.c_char_p, []),
    'MXGetVersion': (_i32, [_P(ctypes.c_int)]),
    'MXNotifyShutdown': (_i32, []),
    # --- KVStore
    'MXKVStoreCreate': (_i32, [ctypes.c_char_p, _hp]),
    'MXKVStoreSetGradientCompression': (_i32, [_h, _u32, _sp, _sp]),
    'MXKVStoreFree': (_i32, [_h]),
    'MXKVStoreInit': (_i32, [_h, _u32, _P(ctypes.c_int), _hp]),
    'MXKVStoreInitEx': (_i32, [_h, _u32, _sp, _hp]),
    'MXKVStorePush': (_i32, [_h, _u32, _P(ctypes.c_int), _hp, _i32]),
    'MXKVStorePushEx': (_i32, [_h, _u32, _sp, _hp, _i32]),
    'MXKVStorePull': (_i32, [_h, _u32, _P(ctypes.c_int), _hp, _i32]),
    'MXKVStorePullEx': (_i32, [_h, _u32, _sp, _hp, _i32]),
    'MXKVStorePullWithSparse': (_i32, [_h, _u32, _P(ctypes.c_int), _hp, _i32, ctypes.c_bool]),
    'MXKVStorePullWithSparseEx': (_i32, [_h, _u32, _sp, _hp, _i32, ctypes.c_bool]),
    'MXKVStorePullRowSparse': (_i32, [_h, _u32, _P(ctypes.c_int), _hp, _hp, _i32]),
    'MXKVStorePullRowSparseEx': (_i32, [_h, _u32, _sp, _hp, _hp, _i32]),
    'MXKVStoreBroadcast': (_i32, [_h, _u32, _P(ctypes.c_int), _u32, _P(ctypes.c_int),
                                  _hp, _hp, _i32]),
    'MXKVStoreBroadcastEx': (_i32, [_h, _u32, _sp, _u32, _sp, _hp, _hp, _i32]),
    'MXKVStorePushPull': (_i32, [_h, _u32, _P(ctypes.c_int), _u32, _P(ctypes.c_int),
                                 _hp, _hp, _i32]),
    'MXKVStorePushPullEx': (_i32, [_h, _u32, _sp, _u32, _sp, _hp, _hp, _i32]),
    'MXKVStoreSetUpdater': (_i32, [_h, UPDATER, ctypes.c_void_p]),
    'MXKVStoreSetUpdaterEx': (_i32, [_h, UPDATER, STR_UPDATER, ctypes.c_void_p]),
    'MXKVStoreGetType': (_i32, [_h, _sp]),
    'MXKVStoreGetRank': (_i32, [_h, _P(ctypes.c_int)]),
    'MXKVStoreGetGroupSize': (_i32, [_h, _P(ctypes.c_int)]),
    'MXKVStoreIsWorkerNode': (_i32, [_P(ctypes.c_int)]),
    'MXKVStoreIsServerNode': (_i32, [_P(ctypes.c_int)]),
    'MXKVStoreIsSchedulerNode': (_i32, [_P(ctypes.c_int)]),
    'MXKVStoreBarrier': (_i32, [_h]),
    'MXKVStoreSetBarrierBeforeExit': (_i32, [_h, _i32]),
    'MXKVStoreRunServer': (_i32, [_h, SERVER_CONTROLLER, ctypes.c_void_p]),
    'MXKVStoreSendCommmandToServers': (_i32, [_h, _u32, ctypes.c_char_p]),
    'MXKVStoreGetNumDeadNode': (_i32, [_h, _i32, _P(ctypes.c_int), _i32]),
    'MXInitPSEnv': (_i32, [_u32, _sp, _sp]),
    # --- NDArray
    'MXNDArrayCreateNone': (_i32, [_hp]),
    'MXNDArrayCreate': (_i32, [_P(_u32), _u32, _i32, _i32, _i32, _hp]),
    'MXNDArrayCreateEx': (_i32, [_P(_u32), _u32, _i32, _i32, _i32, _i32, _hp]),
    'MXNDArrayCreateEx64': (_i32, [_P(ctypes.c_int64), _i32, _i32, _i32, _i32, _i32, _hp]),
    'MXNDArrayCreateSparseEx': (_i32, [_i32, _P(_u32), _u32, _i32, _i32, _i32, _i32, _u32,
                                       _P(ctypes.c_int), _P(_u32), _P(_u32), _hp]),
    'MXNDArraySyncCopyFromCPU': (_i32, [_h, ctypes.c_void_p, ctypes.c_size_t]),
    'MXNDArraySyncCopyToCPU': (_i32, [_h, ctypes.c_void_p, ctypes.c_size_t]),
    'MXNDArraySyncCopyFromNDArray': (_i32, [_h, _h, _i32]),
    'MXNDArrayGetShape': (_i32, [_h, _P(_u32), _P(_P(_u32))]),
    'MXNDArrayGetShapeEx': (_i32, [_h, _P(ctypes.c_int), _P(_P(ctypes.c_int))]),
    'MXNDArrayGetShapeEx64': (_i32, [_h, _P(ctypes.c_int), _P(_P(ctypes.c_int64))]),
    'MXNDArrayGetDType': (_i32, [_h, _P(ctypes.c_int)]),
    'MXNDArrayGetContext': (_i32, [_h, _P(ctypes.c_int), _P(ctypes.c_int)]),
    'MXNDArrayGetStorageType': (_i32, [_h, _P(ctypes.c_int)]),
    'MXNDArrayGetData': (_i32, [_h, _P(ctypes.c_void_p)]),
    'MXNDArrayWaitToRead': (_i32, [_h]),
    'MXNDArrayWaitToWrite': (_i32, [_h]),
    'MXNDArrayWaitAll': (_i32, []),
    'MXNDArrayCreateSparseEx64': (_i32, [_i32, _P(ctypes.c_int64), _i32, _i32, _i32, _i32,
                                         _i32, _u32, _P(ctypes.c_int), _P(ctypes.c_int),
                                         _P(ctypes.c_int64), _hp]),
    'MXNDArrayGetAuxType': (_i32, [_h, _u32, _P(ctypes.c_int)]),
    'MXNDArrayGetAuxType64': (_i32, [_h, ctypes.c_int64, _P(ctypes.c_int)]),
    'MXNDArrayGetAuxNDArray': (_i32, [_h, _u32, _hp]),
    'MXNDArrayGetAuxNDArray64': (_i32, [_h, ctypes.c_int64, _hp]),
    'MXNDArrayGetDataNDArray': (_i32, [_h, _hp]),
    'MXNDArraySyncCheckFormat': (_i32, [_h, ctypes.c_bool]),
    'MXNDArraySave': (_i32, [ctypes.c_char_p, _u32, _hp, _sp]),
    'MXNDArrayLoad': (_i32, [ctypes.c_char_p, _P(_u32), _P(_hp), _P(_u32), _P(_sp)]),
    'MXNDArrayLoadFromBuffer': (_i32, [ctypes.c_void_p, ctypes.c_size_t, _P(_u32), _P(_hp),
                                       _P(_u32), _P(_sp)]),
    'MXNDArrayFree': (_i32, [_h]),
    # --- libmxkv only, not MXNet's C API: MXNet's Kahan sums compiled (ndarray/_reduce.py)
    'MXKVKahanSumColumns': (_i32, [_i32, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64,
                                   ctypes.c_void_p]),
    # MXNet's CPU random engines and draws compiled, with the C library's log
    # (ndarray/random.py)
    'MXKVMTSeed': (_i32, [_u32, _P(_u32), _P(ctypes.c_int64), ctypes.c_uint64]),
    'MXKVMTDraw': (_i32, [_i32, _i32, _P(_u32), _P(ctypes.c_int64), ctypes.c_uint64,
                          ctypes.c_uint64, ctypes.c_void_p]),
    # every loaded array's storage type in one call (ndarray/utils.py)
    'MXKVNDArrayGetStorageTypes': (_i32, [_u32, _P(ctypes.c_void_p), _P(ctypes.c_int)]),
    # MXNet's OpenBLAS dot order compiled (ndarray/_blas.py)
    'MXKVBlasDot': (_i32, [_i32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, _i32,
                           ctypes.c_void_p]),
    'MXKVBlasCoreName': (_i32, [_P(ctypes.c_char_p)]),
    # --- only in a real libmxnet.so (MXKV_LIBRARY_PATH validation runs): its _copyto
    # operator writes a row_sparse array of another size into an existing one
    'NNGetOpHandle': (_i32, [ctypes.c_char_p, _hp]),
    'MXImperativeInvoke': (_i32, [_h, _i32, _hp, _P(ctypes.c_int), _P(_hp), _i32, _sp, _sp]),
}

# functions whose absence means "this is not a KVStore C API library"
_REQUIRED = ('MXGetLastError', 'MXGetVersion', 'MXKVStoreCreate', 'MXNDArrayCreateEx',
             'MXNDArrayGetData', 'MXNDArrayFree')


def _candidates():
    """Yield (path, origin) pairs in search order."""
    env = os.environ.get('MXKV_LIBRARY_PATH')
    if env:
        if os.path.isdir(env):
            for name in LIBRARY_NAMES:
                yield os.path.join(env, name), 'MXKV_LIBRARY_PATH'
        else:
            yield env, 'MXKV_LIBRARY_PATH'
        return  # an explicit choice is never silently replaced by another library
    here = os.path.dirname(os.path.abspath(__file__))
    for name in LIBRARY_NAMES:
        yield os.path.join(here, name), 'package'
    d = here
    while True:
        for name in LIBRARY_NAMES:
            yield os.path.join(d, 'target', 'release', name), 'build folder'
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent


def installation(package_dir=None):
    """How this package was installed: ``('installed', None)`` for a package that pip
    put into a site-packages folder (from a wheel), ``('checkout', root)`` for the
    ``bindings/python/mxkv`` folder of a libmxkv source checkout (also what an
    editable install uses), ``('copy', None)`` for anything else."""
    d = package_dir or os.path.dirname(os.path.abspath(__file__))
    parent = os.path.dirname(d)
    try:
        siblings = os.listdir(parent)
    except OSError:
        siblings = []
    if os.path.basename(parent) in ('site-packages', 'dist-packages') or any(
            n.lower().startswith('mxkv-') and n.endswith('.dist-info') for n in siblings):
        return 'installed', None
    while True:
        try:
            with open(os.path.join(d, 'Cargo.toml')) as fin:
                if 'name = "mxkv"' in fin.read():
                    return 'checkout', d
        except OSError:
            pass
        if os.path.dirname(d) == d:
            return 'copy', None
        d = os.path.dirname(d)


def _how_to_get_one(package_dir):
    """What to do about a missing library, for the way this package was installed."""
    kind, root = installation(package_dir)
    if kind == 'checkout':
        return ('mxkv is used from the source checkout %s: build the library there with '
                '`cargo build --release` (or `make build`), which makes %s; or set '
                'MXKV_LIBRARY_PATH to a libmxkv.so.'
                % (root, os.path.join(root, 'target', 'release', LIBRARY_NAMES[0])))
    what = ('This installed mxkv package (%s)' if kind == 'installed'
            else 'This copy of the mxkv package (%s)') % package_dir
    return ('%s has no %s inside it: it was not installed from the platform wheel '
            '(mxkv-<version>-py3-none-<platform>.whl) that ships the library, or the file '
            'was removed. Reinstall mxkv from that wheel (`pip install --force-reinstall '
            '<wheel>`; `pip install <libmxkv clone>/bindings/python` builds one and installs '
            'it), or set MXKV_LIBRARY_PATH to a libmxkv.so.' % (what, LIBRARY_NAMES[0]))


def find_library():
    """Return the path of the library that :func:`load` would open."""
    tried = []
    for path, origin in _candidates():
        if os.path.isfile(path):
            return os.path.realpath(path)
        tried.append('%s (%s)' % (path, origin))
    looked = 'Looked at:\n  ' + '\n  '.join(tried)
    env = os.environ.get('MXKV_LIBRARY_PATH')
    if env:
        raise OSError('libmxkv.so not found: MXKV_LIBRARY_PATH=%s names no library file '
                      '(set it to libmxkv.so, or to a folder holding it, or unset it to '
                      'use the library that comes with the package). %s' % (env, looked))
    here = os.path.dirname(os.path.abspath(__file__))
    raise OSError('libmxkv.so not found. %s %s' % (_how_to_get_one(here), looked))


def declare(lib):
    """Set argtypes/restype on every function in PROTOTYPES that `lib` exports."""
    missing = []
    for name, (restype, argtypes) in PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = restype
        fn.argtypes = argtypes
    return missing


def raw_function(lib, name):
    """A second function object for `name` *without* argtypes (restype int), or None.

    Only for hot paths whose every argument already has the header's C type:
    c_void_p handles, c_bool, ctypes arrays or ``byref`` for pointers, and Python
    ints for int / mx_uint values that fit in a C int (ctypes passes an int as a
    C int).  ctypes then skips the per-argument ``from_param`` conversions of
    the declared function, which cost more than the C call itself.  The declared
    function (``getattr(lib, name)``) stays the one everything else uses.
    """
    if name in getattr(lib, '_mxkv_missing', ()):
        return None
    try:
        fn = lib._FuncPtr((name, lib))
    except AttributeError:
        return None
    fn.restype = ctypes.c_int
    return fn


def load(path=None):
    """Open the library (RTLD_LOCAL, so it never interposes on another MXNet) and declare it."""
    path = path or find_library()
    try:
        lib = ctypes.CDLL(path, ctypes.RTLD_LOCAL)
    except OSError as err:
        raise OSError('cannot load %s: %s' % (path, err))
    missing = declare(lib)
    absent = [n for n in _REQUIRED if n in missing]
    if absent:
        raise OSError('%s does not export %s: it is not a build of libmxkv with MXNet\'s C API '
                      '(an unfinished build?). Set MXKV_LIBRARY_PATH to a complete library.'
                      % (path, ', '.join(absent)))
    lib._mxkv_path = path
    lib._mxkv_missing = tuple(missing)
    # libmxkv (not a real libmxnet.so) is synchronous: every call has finished
    # when it returns, and its MXNDArrayWait* functions only validate the handle.
    try:
        getattr(lib, 'mxkv_live_handles')
        lib._mxkv_synchronous = True
    except AttributeError:
        lib._mxkv_synchronous = False
    return lib


if __name__ == '__main__':  # pragma: no cover - a tiny diagnostic
    p = find_library()
    lib = load(p)
    v = ctypes.c_int()
    lib.MXGetVersion(ctypes.byref(v))
    sys.stdout.write('%s version %d, missing: %s\n' % (p, v.value, list(lib._mxkv_missing) or 'none'))
