"""The server and scheduler roles of a distributed KVStore, as in MXNet 1.9.1.

Importing ``mxkv`` in a process whose ``DMLC_ROLE`` is ``server`` or
``scheduler`` runs that role until the cluster shuts down, then exits the
process: every node of a job can run the same command (``mxkv-launch``, and
MXNet's own ``tools/launch.py``, rely on this). Workers (``DMLC_ROLE`` unset or
``worker``) import the package as usual.

The server's controller installs the optimizer a worker sends with
``kv.set_optimizer`` (command 0, ``kController``), the only command it is given:
libmxkv's server handles MXNet's other commands (1-5) itself and refuses any other
head with an error the worker's call raises (MXNet 1.9.1's server hands those to
the controller, whose Python side only prints them). The body is unpickled by
``mxkv._optimizer_pickle.loads``, which accepts only the built-in optimizer and
lr-scheduler classes (named as ``mxkv`` or MXNet 1.9.1 names them) and plain
values (numpy bool, int, float and str scalars included, as MXNet pickles them): any
other pickle is refused with a message naming the class or the attribute, shown
once whatever logging is set up to do (see ``_loud``); nothing in it runs, no
updater is installed from it, and the server keeps serving.
"""
import ctypes
import logging
import os
import sys
import traceback

from ..base import _LIB, check_call
from .._lib import SERVER_CONTROLLER
from .. import _optimizer_pickle

__all__ = ['KVStoreServer']

_LOG = logging.getLogger('mxkv.kvstore_server')


def _on_console(handler):
    """Whether `handler` writes to this process's stdout or stderr (a stream that is one
    of them, or a file descriptor open on the same file as fd 1 or 2)."""
    stream = getattr(handler, 'stream', None)
    if stream is None:
        return False
    if any(stream is s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)):
        return True
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    for console in (1, 2):
        try:
            if fd == console or os.path.sameopenfile(fd, console):
                return True
        except OSError:
            pass
    return False


def _loud(message):
    """Shows `message` once, whatever logging is set up to do (a server's only way to
    report a refused command: the worker's call has already returned). It goes to the
    handlers the 'mxkv.kvstore_server' logger passes an error to; unless one of them
    wrote it to stdout or stderr, it is also written to stderr. (It was written to
    stderr and logged, so that logging to the console showed it twice.)"""
    shown = False
    if _LOG.isEnabledFor(logging.ERROR):
        record = _LOG.makeRecord(_LOG.name, logging.ERROR, __file__, 0, '%s', (message,),
                                 None)
        if _LOG.filter(record):
            logger = _LOG
            while logger is not None:
                for handler in logger.handlers:
                    if record.levelno >= handler.level and handler.handle(record) \
                            and _on_console(handler):
                        shown = True
                logger = logger.parent if logger.propagate else None
    if not shown:
        try:
            sys.stderr.write(message + '\n')
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass


class KVStoreServer(object):
    """Runs a server (or scheduler) node for a ``dist`` store until shutdown."""

    def __init__(self, kvstore):
        self.kvstore = kvstore

    def _on_command(self, cmd_id, body):
        if cmd_id == 0:
            try:
                optimizer = _optimizer_pickle.loads(body)
            except _optimizer_pickle.RefusedPickleError as err:
                _loud('mxkv server %d refused the optimizer a worker sent (set_optimizer, '
                      'kController): %s. No optimizer was installed from it: this server '
                      'keeps its previous updater (without one, pushed values are summed and '
                      'assigned).' % (self.kvstore.rank, err))
                return
            self.kvstore.set_optimizer(optimizer)

    def _controller(self):
        def controller(cmd_id, body, _handle):
            # an exception must not cross the C callback: log it and keep serving
            try:
                self._on_command(cmd_id, body or b'')
            except Exception:  # pylint: disable=broad-except
                _loud('mxkv server %d: the controller failed on command %d:\n%s'
                      % (self.kvstore.rank, cmd_id, traceback.format_exc().rstrip()))
        return SERVER_CONTROLLER(controller)

    def run(self):
        """Serve until the cluster shuts down (returns then)."""
        self._callback = self._controller()   # kept alive while the library may call it
        check_call(_LIB.MXKVStoreRunServer(self.kvstore.handle, self._callback, None))


def _role_is_worker():
    is_worker = ctypes.c_int()
    check_call(_LIB.MXKVStoreIsWorkerNode(ctypes.byref(is_worker)))
    return bool(is_worker.value)


def _init_kvstore_server_module():
    """Run this process's server or scheduler role, then exit, when it is not a worker."""
    if _role_is_worker():
        return
    from .base import create
    kvstore = create('dist')
    KVStoreServer(kvstore).run()
    kvstore.close()
    sys.exit()
