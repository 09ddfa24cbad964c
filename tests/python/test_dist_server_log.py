"""A server's refusal of the optimizer a worker sent is shown once, whatever the server's
logging setup (``mxkv/kvstore/kvstore_server.py``, ``_loud``).

It used to be written to stderr and also logged whenever the 'mxkv.kvstore_server' logger had
a handler: with logging configured to the console (``logging.basicConfig()``, to stderr or to
stdout) every refusal was shown twice. Now it goes to the handlers logging passes it to, and
to stderr unless one of them wrote it to stdout or stderr: once on the console in every setup
below, and once more in a log file when logging writes one.

A command other than MXNet's 0-5 never reaches the server's controller: libmxkv's server
refuses it, and the worker's call raises naming it.
"""
import pytest

from test_dist import launch

WORKER = r'''
import logging
import os
import pickle
import sys

setup = os.environ['T_LOG']
path = os.environ['T_FILE'] + '.' + os.environ.get('DMLC_ROLE', 'worker')
if setup == 'stderr':
    logging.basicConfig()
elif setup == 'stdout':
    logging.basicConfig(stream=sys.stdout)
elif setup == 'file':
    logging.basicConfig(filename=path)
elif setup == 'stderr+file':
    logging.basicConfig(handlers=[logging.StreamHandler(), logging.FileHandler(path)])
elif setup == 'errors off':
    logging.basicConfig(level=logging.CRITICAL)
elif setup == 'own logger':
    # its own handler, not passed on to the root's
    own = logging.getLogger('mxkv.kvstore_server')
    own.addHandler(logging.StreamHandler(sys.stdout))
    own.propagate = False
    logging.basicConfig(stream=sys.stderr)
else:
    assert setup == 'none', setup

import mxkv as mx

kv = mx.kv.create('dist_sync')
# a function of the os module: refused by the server's unpickler (nothing is called)
kv._send_command_to_servers(0, pickle.dumps(os.getcwd, 0).decode())
try:
    kv._send_command_to_servers(7, 'x')
    print('COMMAND 7 ACCEPTED', flush=True)
except mx.base.MXNetError as err:
    print('COMMAND 7 REFUSED: %s' % str(err).splitlines()[0], flush=True)
kv.close()
print('DONE', flush=True)
'''

REFUSAL = 'mxkv server 0 refused the optimizer a worker sent'


@pytest.mark.parametrize('setup,in_file', [
    ('none', False), ('stderr', False), ('stdout', False), ('file', True),
    ('stderr+file', True), ('errors off', False), ('own logger', False)])
def test_a_refusal_is_shown_once(tmp_path, setup, in_file):
    script = tmp_path / 'worker.py'
    script.write_text(WORKER)
    log = tmp_path / 'log'
    code, out = launch(str(script), 1, 1, {'T_LOG': setup, 'T_FILE': str(log)}, timeout=60,
                       node_timeout=30)
    assert code == 0, out
    assert '[worker 0] DONE' in out, out
    shown = [line for line in out.splitlines()
             if line.startswith('[server 0]') and REFUSAL in line]
    assert len(shown) == 1, out
    assert "global posix.getcwd is not allowed" in shown[0], shown
    server_log = tmp_path / 'log.server'
    written = server_log.read_text().count(REFUSAL) if server_log.exists() else 0
    assert written == (1 if in_file else 0), (written, out)
    # the unknown command is the worker's error; the controller never saw it
    line = [l for l in out.splitlines() if l.startswith('[worker 0] COMMAND 7')]
    assert line and 'REFUSED' in line[0] and 'unknown server command 7' in line[0], out
    assert 'unknown command' not in out.replace('unknown server command', ''), out
