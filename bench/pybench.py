"""pybench: libmxkv against MXNet 1.9.1 through Python, in one process.

    python bench/pybench.py [--smoke] [--csv FILE]

``import mxnet`` and ``import mxkv`` (found through MXKV_LIBRARY_PATH or
PYTHONPATH=bindings/python) live side by side; every figure is set up in
both, warmed up, calibrated, then timed alternately (MXNet, libmxkv, MXNet,
...). Each timed region is ``iters`` operations followed by ``nd.waitall()``.
After the timing the pulled values are compared exactly with numpy's; a wrong
value makes the script exit 1.

Figures (float32, ``local`` store, no updater):
  py_pair   1-element push + pull (async: N pairs then waitall;
            sync: each pull followed by out.wait_to_read())
  py_push   k = 2 inputs on cpu(0), cpu(1)      bytes moved (k+1)S
  py_pull   n = 1 output                         bytes moved (n+1)S
  py_params nd.save / nd.load / nd.load_frombuffer of a parameter set, as a
            training job saves and reloads checkpoints (each load's arrays
            freed before the next; files in the page cache): a ResNet-50's
            267 arrays (256 B to 9 MB, 98 MB), 200 x 4 MB, 10,000 x 64 B.
            Checked: each library's file is byte for byte MXNet's, and every
            loaded array holds the saved bytes.        bytes moved S (the set)
  py_random mx.random.uniform / normal / randint of n numbers after a seed
            (MXNet's CPU sampler; checked: each library's numbers after
            the same seed are MXNet's bit for bit).    time per draw
Output: CSV rows in kvbench's format (source "py") on --csv FILE or stdout.
"""
import argparse
import gc
import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np

import mxnet
import mxkv

LIBS = [("mxnet", mxnet), ("mxkv", mxkv)]
HEADER = ("source,figure,variant,size_bytes,lib,unit,median,min,max,reps,iters,"
          "bytes_per_op,status,note")


def pattern(n, a, b):
    return ((np.arange(n) % 1000).astype(np.float32) * np.float32(a) + np.float32(b))


class Pair:
    """1-element push + pull of key 3 (value 42)."""
    figure = "py_pair"

    def __init__(self, sync):
        self.sync = sync
        self.variant = "sync" if sync else "async"
        self.size = 4
        self.bytes = 0

    def setup(self, mx):
        kv = mx.kv.create("local")
        kv.init(3, mx.nd.zeros((1,)))
        a = mx.nd.array(np.array([42], np.float32))
        b = mx.nd.zeros((1,))
        mx.nd.waitall()
        return kv, a, b

    def run(self, mx, st, iters):
        kv, a, b = st
        push, pull = kv.push, kv.pull
        if self.sync:
            for _ in range(iters):
                push(3, a)
                pull(3, out=b)
                b.wait_to_read()
        else:
            for _ in range(iters):
                push(3, a)
                pull(3, out=b)

    def check(self, mx, st):
        return compare(st[2].asnumpy(), np.array([42], np.float32))


class Push:
    figure = "py_push"

    def __init__(self, k, size):
        self.k, self.size = k, size
        self.variant = "k=%d %s" % (k, human(size))
        self.bytes = (k + 1) * size

    def setup(self, mx):
        n = self.size // 4
        kv = mx.kv.create("local")
        kv.init(0, mx.nd.zeros((n,)))
        ins = [mx.nd.array(pattern(n, 1, i + 1), ctx=mx.cpu(i)) for i in range(self.k)]
        out = mx.nd.zeros((n,))
        mx.nd.waitall()
        return kv, ins, out

    def run(self, mx, st, iters):
        kv, ins, _ = st
        for _ in range(iters):
            kv.push(0, ins)

    def check(self, mx, st):
        kv, _, out = st
        kv.pull(0, out=out)
        k = self.k
        return compare(out.asnumpy(), pattern(self.size // 4, k, k * (k + 1) // 2))


class Pull:
    figure = "py_pull"

    def __init__(self, n_out, size):
        self.n_out, self.size = n_out, size
        self.variant = "n=%d %s" % (n_out, human(size))
        self.bytes = (n_out + 1) * size

    def setup(self, mx):
        n = self.size // 4
        kv = mx.kv.create("local")
        kv.init(0, mx.nd.array(pattern(n, 0.5, 3)))
        outs = [mx.nd.zeros((n,), ctx=mx.cpu(i)) for i in range(self.n_out)]
        mx.nd.waitall()
        return kv, outs

    def run(self, mx, st, iters):
        kv, outs = st
        o = outs if len(outs) > 1 else outs[0]
        for _ in range(iters):
            kv.pull(0, out=o)

    def check(self, mx, st):
        for o in st[1]:
            err = compare(o.asnumpy(), pattern(self.size // 4, 0.5, 3))
            if err:
                return err
        return None


def resnet50_shapes():
    """The parameter shapes of a ResNet-50 v1 (conv weights; each batch norm's
    gamma, beta, moving mean and var; the classifier): 267 arrays, 98 MB."""
    shapes = []

    def conv(cin, cout, k):
        shapes.append((cout, cin, k, k))
        shapes.extend([(cout,)] * 4)
    conv(3, 64, 7)
    cin = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            conv(cin, width, 1)
            conv(width, width, 3)
            conv(width, width * 4, 1)
            if b == 0:
                conv(cin, width * 4, 1)
            cin = width * 4
    shapes += [(1000, 2048), (1000,)]
    return shapes


class Params:
    """nd.save / nd.load / nd.load_frombuffer of a named float32 parameter set."""
    figure = "py_params"
    files = {}  # (set name, lib) -> (path, the arrays' bytes by name)

    def __init__(self, op, set_name, shapes):
        self.op, self.set_name, self.shapes = op, set_name, shapes
        self.variant = "%s %s" % (op, set_name)
        self.size = self.bytes = sum(4 * int(np.prod(s)) for s in shapes)

    def setup(self, mx):
        key = (self.set_name, mx.__name__)
        if key not in Params.files:
            rng = np.random.RandomState(len(self.shapes))
            vals = {"arg:p%d" % i: rng.standard_normal(s).astype(np.float32)
                    for i, s in enumerate(self.shapes)}
            fd, path = tempfile.mkstemp(prefix="pybench-%s-" % mx.__name__, suffix=".params")
            os.close(fd)
            mx.nd.save(path, {k: mx.nd.array(v) for k, v in vals.items()})
            Params.files[key] = (path, {k: v.tobytes() for k, v in vals.items()})
        path, want = Params.files[key]
        with open(path, "rb") as f:
            buf = f.read()
        arrays = mx.nd.load(path) if self.op == "save" else None
        out = path + ".out"
        return path, want, buf, arrays, out

    def run(self, mx, st, iters):
        path, _, buf, arrays, out = st
        if self.op == "save":
            for _ in range(iters):
                mx.nd.save(out, arrays)
        elif self.op == "load":
            for _ in range(iters):
                mx.nd.load(path)
        else:
            for _ in range(iters):
                mx.nd.load_frombuffer(buf)

    def check(self, mx, st):
        path, want, buf, _, out = st
        try:
            if self.op == "save":
                with open(out, "rb") as f:
                    mine = f.read()
                with open(Params.files[(self.set_name, "mxnet")][0], "rb") as f:
                    if mine != f.read():
                        return "the saved file is not MXNet's byte for byte"
                return None
            got = mx.nd.load(path) if self.op == "load" else mx.nd.load_frombuffer(buf)
            if sorted(got) != sorted(want):
                return "names differ"
            for k, v in want.items():
                a = got[k].asnumpy()
                if a.dtype != np.float32 or a.tobytes() != v:
                    return "array %s differs" % k
            return None
        finally:
            if os.path.exists(out):
                os.unlink(out)

    @staticmethod
    def cleanup():
        for path, _ in Params.files.values():
            os.unlink(path)
        Params.files.clear()


class Random:
    """mx.random.<kind>(shape=(n,)) after one mx.random.seed: MXNet's CPU sampler (1024
    mt19937 engines), which libmxkv reproduces bit for bit."""
    figure = "py_random"
    drawn = {}  # variant -> MXNet's numbers after the check's seed

    def __init__(self, kind, n, dtype):
        self.kind, self.n, self.dtype = kind, n, dtype
        self.variant = "%s %s %s" % (kind, n, dtype)
        self.size = n * np.dtype(dtype).itemsize
        self.bytes = 0

    def draw(self, mx):
        if self.kind == "randint":
            return mx.random.randint(-7, 1000, shape=(self.n,), dtype=self.dtype)
        return getattr(mx.random, self.kind)(shape=(self.n,), dtype=self.dtype)

    def setup(self, mx):
        mx.random.seed(3)
        return None

    def run(self, mx, st, iters):
        for _ in range(iters):
            self.draw(mx)

    def check(self, mx, st):
        mx.random.seed(11)
        got = self.draw(mx).asnumpy()
        if mx is mxnet:
            Random.drawn[self.variant] = got
            return None
        want = Random.drawn.get(self.variant)
        if want is None:
            return "MXNet's draw is missing"
        return compare(got, want)


def compare(got, want):
    if os.environ.get("KVBENCH_CORRUPT", "0") not in ("", "0"):
        want = want + np.float32(1)
    if got.shape != want.shape:
        return "shape %s, expected %s" % (got.shape, want.shape)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    if bad.size:
        j = bad[0]
        return "element %d is %r; expected %r" % (j, float(got[j]), float(want[j]))
    return None


def human(nbytes):
    if nbytes >= 1 << 20:
        return "%dMB" % (nbytes >> 20)
    if nbytes >= 1024:
        return "%dKB" % (nbytes >> 10)
    return "%dB" % nbytes


def machine_busy_s():
    """CPU seconds the whole machine spent busy (incl. steal), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def own_cpu_s():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def timed(mx, fig, st, iters):
    t0 = time.perf_counter()
    fig.run(mx, st, iters)
    mx.nd.waitall()
    return time.perf_counter() - t0


def run_fig(fig, reps, rep_time, out, max_iters=10 ** 6):
    state, iters, times, status, note = {}, {}, {}, {}, {}
    for name, mx in LIBS:
        state[name] = fig.setup(mx)
        times[name], status[name], note[name] = [], "ok", ""
    for name, mx in LIBS:  # warm-up, calibration
        timed(mx, fig, state[name], 1)
        dt = timed(mx, fig, state[name], 1)
        it = max(1, min(max_iters, math.ceil(rep_time / max(dt, 1e-9))))
        dt = timed(mx, fig, state[name], it)
        iters[name] = max(1, min(max_iters, math.ceil(it * rep_time / max(dt, 1e-9))))
    for _ in range(reps):
        for name, mx in LIBS:
            gc.collect()
            time.sleep(0.002)
            times[name].append(timed(mx, fig, state[name], iters[name]) / iters[name])
    failed = False
    for name, mx in LIBS:
        err = fig.check(mx, state[name])
        if err:
            status[name], note[name], failed = "FAIL", err.replace(",", ";").replace('"', "'"), True
        t = times[name]
        med = statistics.median(t)
        out.write('py,%s,%s,%d,%s,s,%.9g,%.9g,%.9g,%d,%d,%d,%s,"%s"\n' % (
            fig.figure, fig.variant, fig.size, name, med, min(t), max(t), reps, iters[name],
            fig.bytes, status[name], note[name]))
        out.flush()
        if fig.bytes:
            shown = "%9.3f GB/s" % (fig.bytes / med / 1e9)
        else:
            shown = "%9.3f us/op" % (med * 1e6)
        print("  %-8s %-22s %-6s %s %s %s" % (fig.figure, fig.variant, name, shown,
                                               status[name], note[name]), file=sys.stderr)
    for name, mx in LIBS:
        del state[name]
    mx.nd.waitall()
    return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="one small size, few repetitions")
    ap.add_argument("--csv", help="output file (default: stdout)")
    args = ap.parse_args()
    out = open(args.csv, "w") if args.csv else sys.stdout
    out.write(HEADER + "\n")
    t_start = time.perf_counter()
    busy0, own0 = machine_busy_s(), own_cpu_s()
    out.write('py,meta,python,0,,,0,0,0,0,0,0,ok,"%s"\n' % sys.version.split()[0])
    out.write('py,meta,mxkv_library,0,,,0,0,0,0,0,0,ok,"%s"\n' % mxkv.base.library_path)
    out.write('py,meta,mxnet_version,0,,,0,0,0,0,0,0,ok,"%s"\n' % mxnet.__version__)
    reps = 3 if args.smoke else 9
    rep_time = 0.002 if args.smoke else 0.05
    sizes = [4096] if args.smoke else [4096, 4 << 20]
    figs = [Pair(False), Pair(True)]
    figs += [Push(2, s) for s in sizes]
    figs += [Pull(1, s) for s in sizes]
    if args.smoke:
        sets = [("20x4KB", [(1024,)] * 20)]
    else:
        sets = [("resnet50", resnet50_shapes()), ("200x4MB", [(1 << 20,)] * 200),
                ("10000x64B", [(4, 4)] * 10000)]
    figs += [Params(op, name, shapes) for name, shapes in sets
             for op in ("save", "load", "load_frombuffer")]
    draws = [(10, "float32")] + ([] if args.smoke else [(1 << 20, "float32"),
                                                       (1 << 20, "float64")])
    figs += [Random(kind, n, dt) for n, dt in draws for kind in ("uniform", "normal")]
    figs += [Random("randint", n, "int32") for n in sorted({n for n, _ in draws})]
    failed = False
    print("== Python (mxnet and mxkv in one process)", file=sys.stderr)
    try:
        for fig in figs:
            failed |= run_fig(fig, reps, rep_time, out)
    finally:
        Params.cleanup()
    elapsed = time.perf_counter() - t_start
    other = max(0.0, (machine_busy_s() - busy0) - (own_cpu_s() - own0))
    out.write('py,meta,elapsed_s,0,,,0,0,0,0,0,0,ok,"%.1f"\n' % elapsed)
    out.write('py,meta,other_load_cores,0,,,0,0,0,0,0,0,ok,"%.2f"\n' % (other / elapsed))
    out.flush()
    if failed:
        print("pybench: a pulled value was wrong", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if failed else 0)  # skip MXNet's engine teardown at interpreter exit


if __name__ == "__main__":
    main()
