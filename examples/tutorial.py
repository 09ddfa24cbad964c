"""The KVStore tutorial (MXNet's "Apache MXNet - KVStore and visualization", the
KVStore part) with ``import mxkv as mx`` in place of ``import mxnet as mx``.  Its output is byte-identical to real MXNet 1.9.1's
(tests/python/test_tutorial.py runs both and compares).

Run:  PYTHONPATH=bindings/python python examples/tutorial.py
(MXKV_TUTORIAL_BACKEND=mxnet runs the very same script on real MXNet.)
"""
import os

if os.environ.get('MXKV_TUTORIAL_BACKEND', 'mxkv') == 'mxnet':
    import mxnet as mx
else:
    import mxkv as mx

# --- Initialization: one (int, NDArray) pair, then pull it out
kv = mx.kv.create('local')  # create a local KVStore.
shape = (3, 3)
kv.init(3, mx.nd.ones(shape) * 2)
a = mx.nd.zeros(shape)
kv.pull(3, out=a)
print(a.asnumpy())

# --- Push, aggregate and update
kv.push(3, mx.nd.ones(shape) * 8)
kv.pull(3, out=a)  # pull out the value
print(a.asnumpy())

# values pushed to one key from several devices are summed first
contexts = [mx.cpu(i) for i in range(4)]
b = [mx.nd.ones(shape, ctx) for ctx in contexts]
kv.push(3, b)
kv.pull(3, out=a)
print(a.asnumpy())


# the updater combines each push with the stored value (default: ASSIGN)
def update(key, input, stored):
    print("update on key: %d" % key)
    stored += input * 2


kv._set_updater(update)
kv.pull(3, out=a)
print(a.asnumpy())

kv.push(3, mx.nd.ones(shape))
kv.pull(3, out=a)
print(a.asnumpy())

# --- Pull onto several devices in one call
b = [mx.nd.ones(shape, ctx) for ctx in contexts]
kv.pull(3, out=b)
print(b[1].asnumpy())

# --- Lists of key-value pairs, single device
keys = [5, 7, 9]
kv.init(keys, [mx.nd.ones(shape)] * len(keys))
kv.push(keys, [mx.nd.ones(shape)] * len(keys))
b = [mx.nd.zeros(shape)] * len(keys)
kv.pull(keys, out=b)
print(b[1].asnumpy())

# --- Lists of key-value pairs, multiple devices
b = [[mx.nd.ones(shape, ctx) for ctx in contexts]] * len(keys)
kv.push(keys, b)
kv.pull(keys, out=b)
print(b[1][1].asnumpy())
