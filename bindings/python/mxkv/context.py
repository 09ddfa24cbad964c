"""Device contexts: ``mxkv.cpu(i)``, ``mxkv.gpu(i)``, ``mxkv.Context`` (as in ``mxnet.context``)."""
import threading

__all__ = ['Context', 'cpu', 'gpu', 'cpu_pinned', 'current_context']


class Context(object):
    """A device: ``Context('cpu', 0)``, ``Context(other_context)``.

    Usable as ``with mxkv.cpu(1): ...`` to change the default context of array
    creation functions.
    """
    devtype2str = {1: 'cpu', 2: 'gpu', 3: 'cpu_pinned', 5: 'cpu_shared'}
    devstr2type = {'cpu': 1, 'gpu': 2, 'cpu_pinned': 3, 'cpu_shared': 5}
    _state = threading.local()

    def __init__(self, device_type, device_id=0):
        if isinstance(device_type, Context):
            self.device_typeid = device_type.device_typeid
            self.device_id = device_type.device_id
        else:
            if device_type not in Context.devstr2type:
                raise ValueError('unknown device type %r (one of %s)'
                                 % (device_type, sorted(Context.devstr2type)))
            self.device_typeid = Context.devstr2type[device_type]
            self.device_id = int(device_id)
        self._old_ctx = None

    @property
    def device_type(self):
        """'cpu', 'gpu', 'cpu_pinned' or 'cpu_shared'"""
        return Context.devtype2str[self.device_typeid]

    def __hash__(self):
        return hash((self.device_typeid, self.device_id))

    def __eq__(self, other):
        return (isinstance(other, Context) and self.device_typeid == other.device_typeid
                and self.device_id == other.device_id)

    def __ne__(self, other):
        return not self.__eq__(other)

    def __str__(self):
        return '%s(%d)' % (self.device_type, self.device_id)

    __repr__ = __str__

    def __enter__(self):
        self._old_ctx = current_context()
        Context._state.value = self
        return self

    def __exit__(self, ptype, value, trace):
        Context._state.value = self._old_ctx

    @classmethod
    def from_codes(cls, dev_type, dev_id):
        """Context from the library's (dev_type, dev_id) codes."""
        ctx = cls.__new__(cls)
        ctx.device_typeid = int(dev_type)
        ctx.device_id = int(dev_id)
        ctx._old_ctx = None
        if ctx.device_typeid not in cls.devtype2str:
            raise ValueError('unknown device type code %d' % dev_type)
        return ctx


def cpu(device_id=0):
    """CPU context ``cpu(device_id)``; the id only tells arrays apart."""
    return Context('cpu', device_id)


def gpu(device_id=0):
    """GPU context; creating arrays on it fails unless the library supports GPUs."""
    return Context('gpu', device_id)


def cpu_pinned(device_id=0):
    """Pinned CPU memory context (what the local KVStore keeps its values on)."""
    return Context('cpu_pinned', device_id)


def current_context():
    """The default context of this thread (``cpu(0)`` unless changed by ``with ctx:``)."""
    value = getattr(Context._state, 'value', None)
    if value is None:
        value = Context('cpu', 0)
        Context._state.value = value
    return value
