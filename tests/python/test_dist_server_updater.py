"""An updater that raises on a dist server (the optimizer a worker sent fails in update, e.g.
momentum given as the str '0.9', as argparse gives it without type=float).

No call of the server process waits for the push it serves, so the error was kept in a
per-thread slot nobody read: the job went on silently with the stored value unchanged.
MXNet 1.9.1's server prints 'Exception ignored on calling ctypes callback function' and
the traceback for every failing update, and the worker pulls the unchanged value (review
probes p10_updater_raises.py / p10m_updater_raises_mxnet.py: 1.0 in every round). Ours now
prints the traceback on the server's stderr for every failing update, with the key; the
worker's values are MXNet's.
"""
import pytest

from test_dist import launch

WORKER = r'''
import os
import mxkv as mx
kv = mx.kv.create(os.environ['T_KV'])
kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1, momentum='0.9'))
kv.init(3, mx.nd.ones((4,)))
for i in range(3):
    kv.push(3, mx.nd.ones((4,)))
    out = mx.nd.zeros((4,))
    kv._barrier()
    kv.pull(3, out=out)
    print('round %d pulled %s' % (i, out.asnumpy().tolist()), flush=True)
kv.close()
print('closed ok', flush=True)
'''


@pytest.mark.parametrize('kvtype', ['dist_sync', 'dist_async'])
def test_a_server_prints_an_updaters_traceback(tmp_path, kvtype):
    script = tmp_path / 'worker.py'
    script.write_text(WORKER)
    code, out = launch(str(script), 1, 1, {'T_KV': kvtype}, timeout=60, node_timeout=30)
    assert code == 0, out
    for i in range(3):
        assert '[worker 0] round %d pulled [1.0, 1.0, 1.0, 1.0]' % i in out, out
    # the server's lines only: the worker's lines come through the same launcher output and
    # may fall between two lines of a server traceback
    lines = [line for line in out.splitlines() if line.startswith('[server 0]')]
    heads = [i for i, line in enumerate(lines) if line == '[server 0] mxkv server: the '
             'updater raised on key 3; the stored value is left as it was:']
    assert len(heads) == 3, out
    for i in heads:
        assert lines[i + 1] == '[server 0] Traceback (most recent call last):', out
        tail = [line for line in lines[i + 1:] if line.startswith('[server 0] ')
                and not line.startswith('[server 0]  ')]
        assert tail[1] == ("[server 0] TypeError: '>' not supported between instances of "
                           "'str' and 'int'"), out
