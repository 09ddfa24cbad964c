"""distbench: the distributed KVStore benchmark, MXNet 1.9.1 and libmxkv in the same run.

    python bench/dist/distbench.py [--smoke] --csv FILE [--raw FILE.jsonl]
                                   [--libs mxnet,mxkv] [--configs 1x1,2x2] [--rounds R]

Runs, all on 127.0.0.1 with ports chosen at run time:

1. the loopback TCP limits (``loopback.py``: 64 MB send + reply with 1 and 2
   pairs at once, one-way stream, 1-byte ping-pong), at the start and again
   at the end of the run;
2. a probe of libmxkv's distributed store: a 1 worker + 1 server job of
   ``worker.py --lib mxkv --probe`` (create ``dist_sync``, pushpull one
   element, check it) under a short timeout. If it fails, libmxkv's rows are
   "n/a" with the reason and no libmxkv job is started: nothing is estimated;
3. ``rounds`` times, for each cluster (W workers + S servers) and each
   library in turn: one job of ``bindings/python/mxkv_launch.py -n W -s S
   --timeout T -- PYTHON bench/dist/worker.py --lib LIB``. Every node runs
   that command; ``import mxnet`` / ``import mxkv`` serves on the scheduler
   and server nodes. The per-operation times of every worker and round are
   pooled per figure (so a 2-worker figure is per worker).

Writes CSV rows in the format of bench/kvbench.c (source "dist"; lib mxnet,
mxkv or machine; unit s; times per operation; status ok, FAIL or na) and, with
``--raw``, every JSON line the workers and the loopback printed. Exit status 1
if a pulled value was wrong, 2 if a job of a library that passed its probe (or
of MXNet) failed to run, else 0.
"""
import argparse
import hashlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import loopback  # noqa: E402

LAUNCHER = os.path.join(ROOT, "bindings", "python", "mxkv_launch.py")
WORKER = os.path.join(HERE, "worker.py")
HEADER = ("source,figure,variant,size_bytes,lib,unit,median,min,max,reps,iters,"
          "bytes_per_op,status,note")
LINE = re.compile(r"^\[worker (\d+)\] (\{.*\})\s*$")
FIGURES = ("pushpull", "pushpull_split", "pair")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def clean(text):
    return " ".join(str(text).replace(",", ";").replace('"', "'").split())


def sha(path):
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()[:12]
    except OSError:
        return "?"


def git_rev():
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True, cwd=ROOT, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, cwd=ROOT,
                               timeout=30).stdout.strip()
        return rev + (" (+ uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


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


class Out(object):
    def __init__(self, path, raw):
        self.f = open(path, "w") if path else sys.stdout
        self.raw = open(raw, "w") if raw else None
        self.f.write(HEADER + "\n")

    def meta(self, name, value):
        self.f.write('dist,meta,%s,0,,,0,0,0,0,0,0,ok,"%s"\n' % (name, clean(value)))
        self.f.flush()

    def row(self, figure, variant, size, lib, times, bytes_per_op, status, note=""):
        if times:
            med, lo, hi = statistics.median(times), min(times), max(times)
        else:
            med = lo = hi = 0.0
        self.f.write('dist,%s,%s,%d,%s,s,%.9g,%.9g,%.9g,%d,%d,%d,%s,"%s"\n' % (
            figure, variant, size, lib, med, lo, hi, len(times), 1, bytes_per_op, status,
            clean(note)))
        self.f.flush()

    def keep(self, obj):
        if self.raw:
            self.raw.write(json.dumps(obj, separators=(",", ":")) + "\n")
            self.raw.flush()


def stop(proc):
    """End a launcher by its pid: SIGTERM makes it stop its nodes; SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate(timeout=20)


def on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def run_job(args, lib, workers, servers, worker_args, timeout, extra_env=None):
    """One launcher job. Returns (returncode, [worker JSON objects], stderr tail)."""
    env = dict(os.environ)
    env.update(extra_env or {})
    env["MXKV_BENCH_LIB"] = lib
    env.setdefault("MXKV_TIMEOUT_S", str(int(max(10, timeout - 5))))
    cmd = [sys.executable, LAUNCHER, "-n", str(workers), "-s", str(servers),
           "--timeout", str(timeout), "--grace", "3", "--shutdown-timeout", "20", "--",
           args.python, WORKER, "--lib", lib] + worker_args
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=timeout + 40)
    except subprocess.TimeoutExpired:
        out, err = stop(proc)
    except BaseException:  # SIGTERM/SIGINT of this driver: the job goes with it
        stop(proc)
        raise
    objs = []
    for line in out.decode("utf-8", "replace").splitlines():
        m = LINE.match(line)
        if m:
            try:
                objs.append(json.loads(m.group(2)))
            except ValueError:
                pass
    tail = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
    return proc.returncode, objs, tail


def why(rc, objs, tail):
    """The most telling reason a job failed."""
    for o in objs:
        if o.get("event") == "error":
            return o.get("note", "")
    errs = [ln for ln in tail if re.search(r"Error|error|refused|not |timed out|Timeout", ln)]
    pick = errs[-1] if errs else (tail[-1] if tail else "")
    return "job exit status %s%s" % (rc, (": " + pick.strip()[:300]) if pick else "")


def probe(args, lib, out):
    rc, objs, tail = run_job(args, lib, 1, 1, ["--probe"], args.probe_timeout)
    for o in objs:
        out.keep(dict(o, job="probe"))
    ok = rc == 0 and any(o.get("event") == "probe" and o.get("status") == "ok" for o in objs)
    return ok, ("" if ok else why(rc, objs, tail))


def limits(args, out, when):
    for pairs in (1, 2):
        try:
            res = loopback.measure(args.lb_size, args.lb_reps, pairs,
                                   args.ping_iters if pairs == 1 else 0)
        except Exception as e:  # a limit that cannot be measured is reported, not invented
            log("  loopback pairs=%d: %s" % (pairs, e))
            out.row("limit_send_reply", "pairs=%d %s" % (pairs, when), args.lb_size,
                    "machine", [], args.lb_size, "FAIL", str(e))
            continue
        for r in res:
            out.keep(dict(r, job="loopback", when=when))
            var = "pairs=%d %s" % (pairs, when)
            out.row("limit_" + r["figure"], var, r["size"], "machine", r["times"],
                    r["bytes_per_op"], "ok")
            t = r["times"]
            if r["bytes_per_op"]:
                shown = "best %.3f GB/s, median %.3f GB/s" % (
                    r["size"] / min(t) / 1e9, r["size"] / statistics.median(t) / 1e9)
            else:
                shown = "median %.1f us" % (statistics.median(t) * 1e6)
            log("  loopback %-10s %-14s %s" % (r["figure"], var, shown))


ZMQ_ECHO = os.path.join(ROOT, "target", "release", "examples", "zmq_echo")
# glibc tunables of the echo processes (not of any node): freed memory stays in the
# process, so each echo lands in memory already there, as libmxkv's kept blocks do
ZMQ_ECHO_TUNABLES = ("glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
                     "glibc.malloc.trim_threshold=1099511627776")


def zmq_limit(args, out, when):
    """libzmq alone, DEALER to ROUTER between two processes (examples/zmq_echo.rs, built by
    `make bench-dist`): the value echoed back (GB/s), and a 2-byte message echoed back (the
    transport's round trip, µs): what the transport the protocol prescribes does alone."""
    zmq_echo(args, out, when, "zmq_echo", args.lb_size, args.lb_reps)
    zmq_echo(args, out, when, "zmq_ping", 2, args.ping_iters)


def zmq_echo(args, out, when, figure, size, reps):
    var = "pairs=1 %s" % when
    per_op = size if figure == "zmq_echo" else 0
    if not os.path.exists(ZMQ_ECHO):
        out.row("limit_" + figure, var, size, "machine", [], per_op, "FAIL",
                "%s not built (cargo build --release --example zmq_echo)" % ZMQ_ECHO)
        return
    env = dict(os.environ, GLIBC_TUNABLES=ZMQ_ECHO_TUNABLES)
    server = subprocess.Popen([ZMQ_ECHO, "server"], stdout=subprocess.PIPE, env=env,
                              universal_newlines=True)
    try:
        port = server.stdout.readline().strip()
        warmup = 2 if per_op else 20
        r = subprocess.run([ZMQ_ECHO, "client", port, str(size), str(reps), str(warmup)],
                           stdout=subprocess.PIPE, env=env, universal_newlines=True,
                           timeout=120, check=True)
        res = json.loads(r.stdout)
        server.wait(timeout=30)
    except (subprocess.SubprocessError, ValueError) as e:
        out.row("limit_" + figure, var, size, "machine", [], per_op, "FAIL", str(e))
        return
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    out.keep(dict(res, job=figure, when=when))
    t = res["times"]
    out.row("limit_" + figure, var, size, "machine", t, per_op, "ok")
    if per_op:
        shown = "best %.3f GB/s, median %.3f GB/s" % (size / min(t) / 1e9,
                                                    size / statistics.median(t) / 1e9)
    else:
        shown = "median %.1f us" % (statistics.median(t) * 1e6)
    log("  libzmq %-11s %-14s %s" % (figure[4:], var, shown))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help="small sizes, one repetition, one round (values still checked)")
    ap.add_argument("--csv", help="output file (default: stdout)")
    ap.add_argument("--raw", help="also write every JSON line here")
    ap.add_argument("--libs", default="mxnet,mxkv")
    ap.add_argument("--configs", default="1x1,2x2", help="WxS cluster sizes")
    ap.add_argument("--rounds", type=int, help="jobs per library and cluster (default 2; 1 "
                    "with --smoke)")
    ap.add_argument("--no-loopback", action="store_true")
    ap.add_argument("--python", default=sys.executable,
                    help="python of every node (needs numpy, mxnet; default: this one)")
    ap.add_argument("--timeout", type=float, help="seconds per job (default 240; 60 smoke)")
    ap.add_argument("--probe-timeout", type=float, default=40.0)
    args = ap.parse_args()
    smoke = args.smoke
    rounds = args.rounds or (1 if smoke else 2)
    timeout = args.timeout or (60.0 if smoke else 240.0)
    # 4 MiB = 2**20 float32: at MXNet's big-array bound (10**6 elements), so split over
    # the servers like 64 MiB
    size = (4 << 20) if smoke else (64 << 20)
    # 3 warm-up operations: a libmxkv server holds 3 big blocks in its steady state (the
    # value received, the round's sum, the stored value still going out), and the first
    # touch of a fresh one is the kernel's (zero-fill, and compaction for huge pages)
    worker_args = (["--size", str(size), "--reps", "1", "--warmup", "1", "--lat-iters", "50"]
                   if smoke else ["--size", str(size), "--reps", "5", "--warmup", "3",
                                  "--lat-iters", "2000"])
    args.lb_size = size
    args.lb_reps = 2 if smoke else 10
    args.ping_iters = 100 if smoke else 2000
    libs = [x for x in args.libs.split(",") if x]
    configs = [tuple(int(v) for v in c.split("x")) for c in args.configs.split(",") if c]

    # the nodes find the bindings and the library the way `make bench` passes them
    pp = os.path.join(ROOT, "bindings", "python")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [pp] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != pp])
    so = os.path.join(ROOT, "target", "release", "libmxkv.so")
    if "MXKV_LIBRARY_PATH" not in os.environ and os.path.exists(so):
        os.environ["MXKV_LIBRARY_PATH"] = so

    signal.signal(signal.SIGTERM, on_sigterm)
    out = Out(args.csv, args.raw)
    t_start = time.perf_counter()
    busy0, own0 = machine_busy_s(), own_cpu_s()
    out.meta("mode", "smoke" if smoke else "full")
    out.meta("python", sys.version.split()[0])
    out.meta("node_python", args.python)
    out.meta("cores", os.cpu_count())
    out.meta("loadavg_start", open("/proc/loadavg").read().split()[0])
    so = os.environ.get("MXKV_LIBRARY_PATH", "")
    out.meta("mxkv_library", so)
    out.meta("mxkv_sha256", sha(so) if so else "")
    out.meta("git_rev", git_rev())
    out.meta("rounds", rounds)
    out.meta("worker_args", " ".join(worker_args))
    out.meta("job_timeout_s", timeout)
    out.meta("glibc_tunables", os.environ.get("GLIBC_TUNABLES", ""))

    if not args.no_loopback:
        log("== loopback TCP limits (start)")
        limits(args, out, "start")
        zmq_limit(args, out, "start")

    avail = {}
    for lib in libs:
        if lib == "mxnet":
            avail[lib] = (True, "")
            continue
        log("== probe: %s dist_sync, 1 worker + 1 server" % lib)
        avail[lib] = probe(args, lib, out)
        log("  %s" % ("available" if avail[lib][0] else "NOT AVAILABLE: " + avail[lib][1]))
        out.meta("%s_dist" % lib, "available" if avail[lib][0] else
                 "not available: " + avail[lib][1])

    samples = {}   # (figure, W, S, lib) -> [seconds]
    status = {}    # (figure, W, S, lib) -> (status, note)
    sizes = {"pushpull": size, "pushpull_split": size, "pair": 4}
    failed_value = failed_run = False
    for rnd in range(rounds):
        for (w, s) in configs:
            for lib in libs:
                if not avail[lib][0]:
                    continue
                tag = "r%d" % rnd
                log("== %s, %d worker%s + %d server%s, round %d" % (
                    lib, w, "s" if w > 1 else "", s, "s" if s > 1 else "", rnd + 1))
                t0 = time.perf_counter()
                rc, objs, tail = run_job(args, lib, w, s, worker_args + ["--tag", tag],
                                         timeout)
                for o in objs:
                    out.keep(dict(o, job="%s %dx%d" % (lib, w, s)))
                figs = [o for o in objs if o.get("event") == "figure"]
                for fig in FIGURES:
                    key = (fig, w, s, lib)
                    got = [o for o in figs if o.get("figure") == fig]
                    if len(got) < w:
                        note = why(rc, objs, tail)
                        status[key] = ("FAIL", "round %d: %d of %d workers reported; %s" % (
                            rnd + 1, len(got), w, note))
                        failed_run = True
                        continue
                    for o in got:
                        samples.setdefault(key, []).extend(o["times"])
                        if o.get("status") == "FAIL" and status.get(key, ("ok",))[0] != "FAIL":
                            status[key] = ("FAIL", "worker %s round %d: %s" % (
                                o.get("rank"), rnd + 1, o.get("note", "")))
                            failed_value = True
                    status.setdefault(key, ("ok", ""))
                    t = [x for o in got for x in o["times"]]  # this job's operations
                    if fig == "pair":
                        shown = "median %.1f us" % (statistics.median(t) * 1e6)
                    else:
                        shown = "median %.3f GB/s per worker" % (size / statistics.median(t)
                                                                 / 1e9)
                    log("  %-15s %s%s" % (fig, shown, "" if status[key][0] == "ok"
                                          else "  " + status[key][0] + " " + status[key][1]))
                if rc != 0 and not failed_value:
                    failed_run = True
                    log("  %s" % why(rc, objs, tail))
                log("  (%.1f s)" % (time.perf_counter() - t0))

    if not args.no_loopback:
        log("== loopback TCP limits (end)")
        limits(args, out, "end")
        zmq_limit(args, out, "end")

    for (w, s) in configs:
        for lib in libs:
            for fig in FIGURES:
                key = (fig, w, s, lib)
                var = "%dw%ds" % (w, s)
                bpo = sizes[fig] if fig != "pair" else 0
                if not avail[lib][0]:
                    out.row(fig, var, sizes[fig], lib, [], bpo, "na",
                            "%s dist_sync not available: %s" % (lib, avail[lib][1]))
                    continue
                st, note = status.get(key, ("FAIL", "not run"))
                out.row(fig, var, sizes[fig], lib, samples.get(key, []), bpo, st, note)

    elapsed = time.perf_counter() - t_start
    other = max(0.0, (machine_busy_s() - busy0) - (own_cpu_s() - own0))
    out.meta("elapsed_s", "%.1f" % elapsed)
    out.meta("other_load_cores", "%.2f" % (other / elapsed))
    out.meta("loadavg_end", open("/proc/loadavg").read().split()[0])
    if failed_value:
        log("distbench: a pulled value was wrong")
        return 1
    if failed_run:
        log("distbench: a job failed to run")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
