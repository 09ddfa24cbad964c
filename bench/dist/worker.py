"""Distributed KVStore benchmark worker: the same script through ``mxnet`` and ``mxkv``.

    mxkv-launch -n W -s S --timeout T -- python bench/dist/worker.py --lib mxnet|mxkv [...]

Every node of the job runs this command (the launcher's contract, as MXNet's
``tools/launch.py``): ``import mxnet as mx`` (or ``import mxkv as mx``) on a
scheduler or server node runs that role and exits inside the import, so only
workers get past it. A library that returns from the import on such a node
does not run that role: the script says so (JSON line, ``"status": "na"``) and
exits 3. The library comes from ``--lib`` or else ``MXKV_BENCH_LIB``.

Each worker creates a ``dist_sync`` store (no optimizer: the servers assign
the sum of the workers' pushes) and measures, with a warm-up before each
figure and barriers (``kv._barrier()``) before and after every timed region:

  pushpull   ``kv.pushpull(key, grad, out=out)`` of SIZE bytes of float32
             (default 64 MiB), then ``out.wait_to_read()``; one timed region
             per operation, ``--reps`` of them
  pushpull_split  ``kv.push(key, grad)``, ``kv.pull(key, out=out)``,
             ``out.wait_to_read()`` (the same traffic in two calls)
  pair       1-element ``kv.push`` + ``kv.pull`` + ``wait_to_read`` of a
             second key, each iteration timed on its own (``--lat-iters``),
             between one pair of barriers

Every pulled value is checked, after its timed region, against the exact sum
over the workers: worker r pushes ``p * (r + 1) + b(r, i)`` in operation i
(p[j] = j mod 1000, so every element and every server's slice differs, and
b changes from one operation to the next, so a stale value is caught); all
values are exact in float32. ``KVBENCH_CORRUPT=1`` expects the sum plus one
(the check must then fail). ``--probe`` only creates the store, inits one
1-element key, pushpulls it once and checks it (the driver's availability test).

Output: one JSON object per line on stdout (the launcher prefixes
``[worker R] ``): ``{"event": "start", ...}``, one ``{"event": "figure", ...}``
per figure with every operation's time in seconds (``times``), and ``{"event": "end"}``.
Exit status 1 if a value was wrong, 3 if the library did not run a role.
"""
import argparse
import importlib
import json
import os
import sys
import time

KEY_BIG = 3
KEY_SMALL = 7
KEY_PROBE = 11


def emit(obj):
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", choices=("mxnet", "mxkv"),
                    default=os.environ.get("MXKV_BENCH_LIB") or None,
                    help="library to import as mx (default: $MXKV_BENCH_LIB)")
    ap.add_argument("--kvstore", default="dist_sync")
    ap.add_argument("--size", type=int, default=64 << 20,
                    help="bytes of the large value (float32, default 64 MiB)")
    ap.add_argument("--reps", type=int, default=7, help="timed operations per large figure")
    ap.add_argument("--warmup", type=int, default=2, help="untimed operations before each")
    ap.add_argument("--lat-iters", type=int, default=2000,
                    help="timed 1-element push+pull pairs")
    ap.add_argument("--tag", default="", help="copied into every JSON line (e.g. round)")
    ap.add_argument("--probe", action="store_true",
                    help="create the store, pushpull one element, check it, exit")
    args = ap.parse_args(argv)
    if args.lib is None:
        ap.error("--lib or MXKV_BENCH_LIB is required")
    if args.size < 4 or args.size % 4:
        ap.error("--size must be a positive multiple of 4")
    return args


def corrupt():
    return os.environ.get("KVBENCH_CORRUPT", "0") not in ("", "0")


def compare(np, got, want):
    """None if got equals want bit for bit, else a short description."""
    if corrupt():
        want = want + np.float32(1)
    if got.shape != want.shape:
        return "shape %s, expected %s" % (got.shape, want.shape)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    if bad.size:
        j = int(bad[0])
        return "element %d of %d is %r; expected %r (%d elements differ)" % (
            j, got.size, float(got[j]), float(want[j]), bad.size)
    return None


class Bench(object):
    def __init__(self, mx, np, args):
        self.mx, self.np, self.args = mx, np, args
        self.kv = mx.kv.create(args.kvstore)
        self.rank = self.kv.rank
        self.nw = self.kv.num_workers
        self.base = {"lib": args.lib, "rank": self.rank, "workers": self.nw,
                     "servers": int(os.environ.get("DMLC_NUM_SERVER", "0")), "tag": args.tag}
        self.failed = False

    def line(self, **kw):
        d = dict(self.base)
        d.update(kw)
        emit(d)

    # worker r, operation i: p * (r + 1) + b(r, i); the sum over workers is
    # p * W(W+1)/2 + (W * (i mod 7) + W(W-1)/2)
    def offset(self, r, i):
        return (i % 7) + r

    def want(self, p, i):
        np, w = self.np, self.nw
        a = np.float32(w * (w + 1) // 2)
        b = np.float32(sum(self.offset(r, i) for r in range(w)))
        return p * a + b

    def barrier(self):
        self.kv._barrier()

    def big(self, split):
        mx, np, kv, args = self.mx, self.np, self.kv, self.args
        n = args.size // 4
        p = (np.arange(n, dtype=np.int64) % 1000).astype(np.float32)
        kv.init(KEY_BIG + split, mx.nd.zeros((n,)))
        key = KEY_BIG + split
        grad = mx.nd.zeros((n,))
        out = mx.nd.zeros((n,))
        mx.nd.waitall()
        times, note = [], ""
        for i in range(args.warmup + args.reps):
            grad[:] = p * np.float32(self.rank + 1) + np.float32(self.offset(self.rank, i))
            out[:] = np.float32(-1)
            grad.wait_to_read()
            out.wait_to_read()
            self.barrier()
            t0 = time.perf_counter()
            if split:
                kv.push(key, grad)
                kv.pull(key, out=out)
            else:
                kv.pushpull(key, grad, out=out)
            out.wait_to_read()
            t1 = time.perf_counter()
            self.barrier()
            err = compare(np, out.asnumpy(), self.want(p, i))
            if err and not note:
                note = "operation %d: %s" % (i, err)
            if i >= args.warmup:
                times.append(t1 - t0)
        del grad, out
        self.failed |= bool(note)
        self.line(event="figure", figure="pushpull_split" if split else "pushpull",
                  size=args.size, bytes_per_op=args.size, times=times,
                  status="FAIL" if note else "ok", note=note)

    def pair(self):
        mx, np, kv, args = self.mx, self.np, self.kv, self.args
        kv.init(KEY_SMALL, mx.nd.zeros((1,)))
        a = mx.nd.zeros((1,))
        b = mx.nd.zeros((1,))
        mx.nd.waitall()
        w = self.nw
        total = w * (w + 1) // 2
        warm = max(args.warmup, 10)
        times, note = [], ""
        self.barrier()
        for i in range(warm + args.lat_iters):
            v = (i % 97) + 1
            a[:] = float((self.rank + 1) * v)
            a.wait_to_read()
            t0 = time.perf_counter()
            kv.push(KEY_SMALL, a)
            kv.pull(KEY_SMALL, out=b)
            b.wait_to_read()
            t1 = time.perf_counter()
            if i == warm - 1:
                self.barrier()  # the timed region starts together on every worker
            err = compare(np, b.asnumpy(), np.array([total * v], np.float32))
            if err and not note:
                note = "operation %d: %s" % (i, err)
            if i >= warm:
                times.append(t1 - t0)
        self.barrier()
        self.failed |= bool(note)
        self.line(event="figure", figure="pair", size=4, bytes_per_op=0,
                  times=[round(t, 9) for t in times], status="FAIL" if note else "ok",
                  note=note)

    def probe(self):
        mx, np, kv = self.mx, self.np, self.kv
        kv.init(KEY_PROBE, mx.nd.zeros((1,)))
        a = mx.nd.array(np.array([self.rank + 1], np.float32))
        out = mx.nd.zeros((1,))
        kv.pushpull(KEY_PROBE, a, out=out)
        w = self.nw
        err = compare(np, out.asnumpy(), np.array([w * (w + 1) // 2], np.float32))
        self.barrier()
        self.failed |= bool(err)
        self.line(event="probe", status="FAIL" if err else "ok", note=err or "")


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    role = os.environ.get("DMLC_ROLE", "")
    t_import = time.perf_counter()
    mx = importlib.import_module(args.lib)  # scheduler/server nodes serve and exit here
    if role in ("scheduler", "server"):
        emit({"event": "error", "lib": args.lib, "status": "na",
              "note": "import %s returned on a %s node: the library does not run that role"
                      % (args.lib, role)})
        return 3
    import numpy as np
    t0 = time.perf_counter()
    bench = Bench(mx, np, args)
    bench.line(event="start", pid=os.getpid(), version=getattr(mx, "__version__", "?"),
               library=getattr(getattr(mx, "base", None), "library_path", "") or "",
               import_s=t0 - t_import, create_s=time.perf_counter() - t0,
               python=sys.version.split()[0])
    if args.probe:
        bench.probe()
    else:
        bench.big(split=False)
        bench.big(split=True)
        bench.pair()
    bench.barrier()
    bench.line(event="end")
    failed = bench.failed
    # closing the store sends this worker's shutdown to the scheduler (MXNet: the handle's
    # destructor; mxkv: close()); without it the scheduler waits for this node
    close = getattr(bench.kv, "close", None)
    if close is not None:
        close()
    del bench
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
