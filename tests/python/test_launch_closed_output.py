"""mxkv-launch started with its stdout or stderr closed (``cmd >&-``, a daemon without
descriptors 1/2): Python then has ``sys.stdout``/``sys.stderr`` None.

The reader thread of each node's pipe died on ``None.write`` (AttributeError, with a
traceback), closed the pipe, and the node's next lines got SIGPIPE / BrokenPipeError: a
Python worker printing more than a line failed the job; the launcher also ended with a
traceback from ``sys.stdout.flush()`` and exit 1. Now the lines for the closed stream are
dropped (as for an output that goes away later) and the job runs as usual.
"""
import os
import subprocess
import sys

import pytest

from conftest import BINDINGS

LAUNCH = os.path.join(BINDINGS, 'mxkv_launch.py')

pytestmark = pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc')

NODE = r'''
import os, sys
for i in range(3000):                       # more than a pipe holds
    print('line %d of %s' % (i, os.environ['DMLC_ROLE']))
sys.stdout.flush()
sys.stderr.write('stderr of %s\n' % os.environ['DMLC_ROLE'])
sys.stderr.write('x' * 100000 + '\n')
sys.stderr.write('end of %s\n' % os.environ['DMLC_ROLE'])
'''


@pytest.mark.parametrize('closed', [1, 2])
def test_a_closed_output_of_the_launcher_drops_lines_and_the_job_runs(tmp_path, closed):
    script = tmp_path / 'node.py'
    script.write_text(NODE)
    out_file = tmp_path / 'out'
    with open(str(out_file), 'wb') as out:
        r = subprocess.run([sys.executable, LAUNCH, '-n', '2', '-s', '1', '--timeout', '60',
                            '--grace', '2', '--', sys.executable, str(script)],
                           stdout=out if closed == 2 else subprocess.DEVNULL,
                           stderr=out if closed == 1 else subprocess.DEVNULL,
                           pass_fds=(), preexec_fn=lambda: os.close(closed), timeout=90,
                           start_new_session=True)
    text = out_file.read_bytes().decode()
    assert r.returncode == 0, text[-3000:]
    assert 'Traceback' not in text and 'Error' not in text, text[-3000:]
    if closed == 1:       # stdout closed: the nodes' stderr lines are all there
        for role in ('scheduler', 'server 0', 'worker 0', 'worker 1'):
            assert '[%s] end of %s' % (role, role.split()[0]) in text, text[-3000:]
    else:                 # stderr closed: every stdout line is there
        for role in ('worker 0', 'worker 1'):
            assert '[%s] line 2999 of worker' % role in text, text[-3000:]
