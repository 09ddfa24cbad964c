"""Process helpers shared by the dist tests that start real OS processes
(test_dist.py, test_dist_faults.py, dist_fuzz.py).

Every process a test starts carries a unique tag in its environment
(``MXKV_TEST_TAG=<tag>``); :func:`tagged` finds the ones still alive through
/proc, so that a test can report and kill, by pid, anything its nodes left
behind.
"""
import os
import signal
import subprocess
import time


def tagged(tag):
    """pids of the processes whose environment holds MXKV_TEST_TAG=tag"""
    want = ('MXKV_TEST_TAG=%s' % tag).encode()
    pids = []
    for d in os.listdir('/proc'):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open('/proc/%s/environ' % d, 'rb') as f:
                if want in f.read().split(b'\0'):
                    pids.append(int(d))
        except OSError:
            pass
    return pids


def reap(tag, grace=10.0):
    """kill, by pid, the tagged processes still alive after `grace` seconds (nodes a
    launcher stopped may still be exiting) and return their pids"""
    deadline = time.time() + grace
    left = tagged(tag)
    while left and time.time() < deadline:
        time.sleep(0.1)   # polling /proc for exits, not a synchronisation
        left = tagged(tag)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


def communicate_or_stop(p, timeout):
    """(output, finished): the launcher `p`'s output once it exits within `timeout`
    seconds; otherwise it is sent SIGTERM (the launcher stops its nodes), killed after
    15 s more, and finished is False"""
    try:
        out, _ = p.communicate(timeout=timeout)
        return out, True
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        try:
            out, _ = p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        return out, False
