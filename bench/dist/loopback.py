"""Loopback TCP limits on 127.0.0.1, for the distributed benchmark.

    python bench/dist/loopback.py [--size BYTES] [--reps N] [--pairs P] [--ping-iters N]

A client (this process) and an echo process (this script with ``--echo PORT``,
a separate Python process, as a worker and a server are) over one TCP
connection on 127.0.0.1:

  send+reply  the client sends SIZE bytes, the echo process receives all of
              them and sends SIZE bytes back: the traffic of one pushpull of
              SIZE bytes between one worker and its server(s). GB/s = SIZE /
              round time. With ``--pairs P``, P such client/echo pairs run at
              once (one client thread each, started together by a barrier),
              the traffic of P workers; a repetition lasts from the first pair's
              start to the last pair's end, and GB/s = SIZE / that time (per pair).
  stream      the client sends SIZE bytes, the echo process answers 1 byte
              when it has them all (one direction only).
  ping        1 byte there and back, TCP_NODELAY on both ends, each round
              trip timed on its own; µs.

Sockets keep the kernel's default buffer sizes (as ZeroMQ does). Every socket
has a timeout and every echo process is ended by its process id. Prints one
JSON object per measurement (all repetition times in seconds).
"""
import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

HOST = "127.0.0.1"
HDR = struct.Struct("<cQ")  # op, count
TIMEOUT = 60.0


def recv_exact(sock, view):
    n, got = len(view), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed the connection after %d of %d bytes" % (got, n))
        got += k


def echo(port, size):
    """The echo process: connect to the client and serve its requests until 'Q'."""
    sock = socket.create_connection((HOST, port), timeout=TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(max(size, 1))
    view = memoryview(buf)
    hdr = bytearray(HDR.size)
    one = bytearray(1)
    while True:
        recv_exact(sock, memoryview(hdr))
        op, n = HDR.unpack(hdr)
        if op == b"Q":
            break
        if op == b"B":  # bulk: all of it, then all of it back
            recv_exact(sock, view[:n])
            sock.sendall(view[:n])
        elif op == b"S":  # stream: all of it, then one byte
            recv_exact(sock, view[:n])
            sock.sendall(b"k")
        elif op == b"P":  # n one-byte round trips
            for _ in range(n):
                recv_exact(sock, memoryview(one))
                sock.sendall(one)
        else:
            raise ValueError("bad op %r" % op)
    sock.close()


class Pair(object):
    """A client socket and its echo process."""

    def __init__(self, size):
        lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            lst.bind((HOST, 0))
            lst.listen(1)
            lst.settimeout(TIMEOUT)
            port = lst.getsockname()[1]
            self.proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--echo", str(port),
                 "--size", str(size)], stdin=subprocess.DEVNULL)
            try:
                self.sock, _ = lst.accept()
            except BaseException:
                self.kill()
                raise
        finally:
            lst.close()
        self.sock.settimeout(TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray(size)
        for i in range(0, size, 4096):  # touch the pages before anything is timed
            self.buf[i] = (i >> 12) & 0xFF
        self.back = bytearray(size)
        self.view, self.bview = memoryview(self.buf), memoryview(self.back)

    def bulk(self, n):
        t0 = time.perf_counter()
        self.sock.sendall(HDR.pack(b"B", n))
        self.sock.sendall(self.view[:n])
        recv_exact(self.sock, self.bview[:n])
        return time.perf_counter() - t0

    def stream(self, n):
        ack = bytearray(1)
        t0 = time.perf_counter()
        self.sock.sendall(HDR.pack(b"S", n))
        self.sock.sendall(self.view[:n])
        recv_exact(self.sock, memoryview(ack))
        return time.perf_counter() - t0

    def ping(self, iters):
        self.sock.sendall(HDR.pack(b"P", iters))
        one = bytearray(b"x")
        back = memoryview(bytearray(1))
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            self.sock.sendall(one)
            recv_exact(self.sock, back)
            times.append(time.perf_counter() - t0)
        return times

    def check(self, n):
        if self.back[:n] != self.buf[:n]:
            raise RuntimeError("loopback: the echoed bytes differ from the ones sent")

    def close(self):
        try:
            self.sock.sendall(HDR.pack(b"Q", 0))
            self.sock.close()
            self.proc.wait(timeout=10)
        finally:
            self.kill()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()  # by its pid (Popen.kill)
            self.proc.wait(timeout=10)


def measure(size=64 << 20, reps=7, pairs=1, ping_iters=2000, warmup=1):
    """Returns a list of result dicts (see the module docstring)."""
    out = []
    ps = []
    try:
        for _ in range(pairs):
            ps.append(Pair(size))
        for fig, fn in (("send_reply", Pair.bulk), ("stream", Pair.stream)):
            if fig == "stream" and pairs > 1:
                continue
            times = [[] for _ in ps]
            bar = threading.Barrier(len(ps), timeout=TIMEOUT)
            errors = []

            def run(k, fn=fn, times=times, bar=bar, errors=errors):
                try:
                    for i in range(warmup + reps):
                        bar.wait()
                        t0 = time.perf_counter()
                        t = fn(ps[k], size)
                        if i >= warmup:
                            times[k].append((t0, t0 + t))
                    if fn is Pair.bulk:
                        ps[k].check(size)
                except BaseException as e:  # reported by the main thread
                    errors.append(e)
                    bar.abort()

            threads = [threading.Thread(target=run, args=(k,)) for k in range(len(ps))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(TIMEOUT * (reps + warmup + 1))
            if errors:
                raise errors[0]
            if any(t.is_alive() for t in threads):
                raise TimeoutError("loopback: a client thread did not finish")
            # with several pairs, a repetition lasts from the first start to the last end
            # (each pair moved SIZE in that time), as the workers of a sync round do
            flat = [max(ts[i][1] for ts in times) - min(ts[i][0] for ts in times)
                    for i in range(reps)]
            out.append({"figure": fig, "pairs": pairs, "size": size, "bytes_per_op": size,
                        "times": flat})
        if pairs == 1 and ping_iters:
            times = ps[0].ping(ping_iters + 50)[50:]
            out.append({"figure": "ping", "pairs": 1, "size": 1, "bytes_per_op": 0,
                        "times": [round(t, 9) for t in times]})
    finally:
        for p in ps:
            try:
                p.close()
            except Exception:
                p.kill()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--echo", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=64 << 20)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--ping-iters", type=int, default=2000)
    args = ap.parse_args()
    if args.echo is not None:
        echo(args.echo, args.size)
        return 0
    for r in measure(args.size, args.reps, args.pairs, args.ping_iters):
        if r["bytes_per_op"]:
            r["best_gb_s"] = r["size"] / min(r["times"]) / 1e9
            r["median_gb_s"] = r["size"] / statistics.median(r["times"]) / 1e9
        else:
            r["median_us"] = statistics.median(r["times"]) * 1e6
        print(json.dumps(r, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
