"""report: merge kvbench (C) and pybench (Python) results into CSV, Markdown, PNG.

    python bench/report.py --c C.csv [--py PY.csv] --out-dir DIR [--date YYYY-MM-DD]
                           [--elapsed SECONDS] [--no-png] [--quiet]

Writes DIR/<date>.csv (every measured row, with GB/s where it applies),
DIR/<date>.md (ratios libmxkv/MXNet per figure, fractions of the machine
limits, targets of issue 4 / issue 5 and PASS/MISS) and DIR/<date>.png (chart
of the ratios), and prints the Markdown table. Exit status 1 if any row has
status FAIL (a wrong value or a failed dense call), else 0.
"""
import argparse
import csv
import datetime
import hashlib
import os
import platform
import subprocess
import sys

A, B = "mxnet", "mxkv"  # library labels in the CSVs (from the .so file names)
BIG = 64 << 20


def load(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fnum(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return 0.0


def human(nbytes):
    nbytes = int(nbytes)
    if nbytes >= 1 << 20:
        return "%d MB" % (nbytes >> 20)
    if nbytes >= 1024:
        return "%d KB" % (nbytes >> 10)
    return "%d B" % nbytes


class Row:
    """One line of the Markdown table: a figure measured in both libraries."""

    def __init__(self, name, unit, a, b, higher_better, target=None, limit=None,
                 limit_name=None, note=""):
        self.name, self.unit, self.a, self.b = name, unit, a, b
        self.higher_better = higher_better
        self.target = target or {}  # {"ratio": x} (on the natural ratio), {"frac": x}, {"max": v}
        self.limit, self.limit_name = limit, limit_name
        self.note = note

    # a and b: dicts with "med", "min", "max" (in the row's unit) and "status", "note"
    def ok(self, r):
        return r is not None and r["status"] == "ok"

    def ratio(self):
        if self.ok(self.a) and self.ok(self.b) and self.a["med"] > 0:
            return self.b["med"] / self.a["med"]
        return None

    def advantage(self):
        """How many times better libmxkv is (> 1: better), whatever the unit."""
        r = self.ratio()
        if r is None or r == 0:
            return None
        return r if self.higher_better else 1.0 / r

    def frac(self, r):
        if self.limit and self.ok(r):
            return r["med"] / self.limit
        return None

    def target_text(self):
        t = []
        if "ratio" in self.target:
            t.append("≥ %g× MXNet" % self.target["ratio"])
        if "frac" in self.target:
            t.append("≥ %g of %s" % (self.target["frac"], self.limit_name))
        if "max" in self.target:
            t.append("≤ %g %s" % (self.target["max"], self.unit))
        if "maxval" in self.target:
            t.append(self.target["maxval"][1])
        return ", ".join(t) if t else "—"

    def result(self):
        for lib, r in (("MXNet", self.a), ("libmxkv", self.b)):
            if r is not None and r["status"] == "FAIL":
                return "FAIL (%s)" % lib
        if r_na(self.b):
            return "n/a (libmxkv)"
        if r_na(self.a):
            return "n/a (MXNet)"
        if not self.target:
            return "info"
        good = True
        if "ratio" in self.target:
            adv = self.advantage()
            good &= adv is not None and adv >= self.target["ratio"]
        if "frac" in self.target:
            fr = self.frac(self.b)
            good &= fr is not None and fr >= self.target["frac"]
        if "max" in self.target:
            good &= self.ok(self.b) and self.b["med"] <= self.target["max"]
        if "maxval" in self.target:
            good &= self.ok(self.b) and self.b["med"] <= self.target["maxval"][0]
        return "PASS" if good else "MISS"


def r_na(r):
    return r is None or r["status"] == "na"


def fmt(v):
    if v is None:
        return "—"
    a = abs(v)
    if a >= 100:
        return "%.0f" % v
    if a >= 10:
        return "%.1f" % v
    if a >= 1:
        return "%.2f" % v
    return "%.3g" % v


def cell(r, unit):
    if r is None:
        return "—"
    if r["status"] == "na":
        return "n/a"
    if r["status"] == "FAIL":
        return "FAIL"
    return "%s %s [%s–%s]" % (fmt(r["med"]), unit, fmt(r["min"]), fmt(r["max"]))


def convert(row, unit):
    """A CSV row as {med, min, max, status, note} in the display unit."""
    if row is None:
        return None
    st = row["status"]
    med, lo, hi = fnum(row["median"]), fnum(row["min"]), fnum(row["max"])
    b = fnum(row["bytes_per_op"])
    if unit == "GB/s":  # throughput: the fastest repetition is the max
        f = (lambda t: b / t / 1e9 if t > 0 else 0.0)
        out = {"med": f(med), "min": f(hi), "max": f(lo)}
    elif unit == "µs":
        out = {"med": med * 1e6, "min": lo * 1e6, "max": hi * 1e6}
    elif unit == "ms":
        out = {"med": med * 1e3, "min": lo * 1e3, "max": hi * 1e3}
    elif unit == "GiB":
        out = {"med": med / 2 ** 30, "min": lo / 2 ** 30, "max": hi / 2 ** 30}
    else:
        raise ValueError(unit)
    out["status"] = st
    out["note"] = row.get("note", "")
    return out


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
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return rev + (" (+ uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "?"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def build(rows_c, rows_py):
    data = [r for r in rows_c + rows_py if r["figure"] != "meta"]
    meta = {}
    for r in rows_c + rows_py:
        if r["figure"] == "meta":
            meta[r["source"] + ":" + r["variant"]] = r["note"]
    get = {}
    for r in data:
        get[(r["figure"], r["variant"], r["lib"])] = r

    def pair(fig, var):
        return get.get((fig, var, A)), get.get((fig, var, B))

    # machine limits: best of 1 and 2 threads, GB/s
    limits, limit_rows = {}, []
    for r in data:
        if r["lib"] != "machine":
            continue
        gbps = fnum(r["bytes_per_op"]) / fnum(r["median"]) / 1e9
        base = r["variant"].rsplit(" t=", 1)[0] if " t=" in r["variant"] else ""
        name = r["figure"].replace("limit_", "") + ((" " + base) if base else "")
        threads = r["variant"].rsplit("t=", 1)[1]
        limits[name] = max(limits.get(name, 0.0), gbps)
        limit_rows.append((name, threads, gbps, r))

    def lim(kind, k, at=""):
        # at: "" for the 64 MB limits, "@256KB" for the in-cache ones, "@inline-<size>"
        # for the ones timed in turn with the libraries in a figure of that size
        where = {"": "", "@256KB": " (256 KB, 1 thread)"}.get(at, " (timed in turn)")
        if kind == "fresh":  # the better of small pages and 2 MB pages
            small, huge = limits.get("fresh" + at), limits.get("fresh" + at + " huge")
            if huge is not None and (small is None or huge > small):
                return huge, "copy into fresh memory, 2 MB pages" + where
            return small, "copy into fresh memory" + where
        if kind == "memcpy" or k == 1:
            return limits.get("memcpy" + at), "memcpy" + where
        key = "%s%s %s=%d" % (kind, at, "n" if kind == "bcast" else "k", k)
        label = {"sum": "%d-input sum" % k, "bcast": "broadcast copy to %d" % k,
                 "sumcopy": "%d-input sum copied to %d outputs" % (k, k)}[kind]
        return limits.get(key), label + where

    def lim_turn(kind, k, size, fig):
        # the limit timed in turn with the figure when the run has it, else the one
        # measured at the start and end of the run at 64 MB (or, for pulls, 256 KB)
        v, label = lim(kind, k, "@inline-%s-%s" % (fig, human(size).replace(" ", "")))
        if v is not None:
            return v, label
        at = {BIG: "", 262144: "@256KB" if fig == "pull" else None}.get(size)
        return lim(kind, k, at) if at is not None else (None, None)

    out = []
    sizes = sorted({int(r["size_bytes"]) for r in data if r["figure"] == "push"})
    for k in (1, 2, 4, 8):
        for s in sizes:
            var = "k=%d %s" % (k, human(s).replace(" ", ""))
            a, b = pair("push", var)
            if a is None and b is None:
                continue
            big = s >= BIG
            limit, lname = lim_turn("sum", k, s, "push")
            if k == 1:
                target = {"frac": 0.7} if big else {}
                note = "MXNet aliases the caller's array (no copy)"
            else:
                target = {"ratio": 3, "frac": 0.7} if big else {"ratio": 3}
                note = ""
            out.append(Row("push %d input%s × %s" % (k, "s" if k > 1 else "", human(s)), "GB/s",
                           convert(a, "GB/s"), convert(b, "GB/s"), True, target, limit, lname,
                           note))
    for n in (1, 2, 8):
        for s in sizes:
            var = "n=%d %s" % (n, human(s).replace(" ", ""))
            a, b = pair("pull", var)
            if a is None and b is None:
                continue
            big = s >= BIG
            limit, lname = lim_turn("bcast", n, s, "pull")
            target = {"frac": 0.9} if big else {"ratio": 1.5}
            out.append(Row("pull into %d output%s × %s" % (n, "s" if n > 1 else "", human(s)),
                           "GB/s", convert(a, "GB/s"), convert(b, "GB/s"), True, target, limit,
                           lname))
    for k in (2, 8):
        for s in sizes:
            a, b = pair("pushpull", "k=%d %s" % (k, human(s).replace(" ", "")))
            if a is None and b is None:
                continue
            limit, lname = lim_turn("sumcopy", k, s, "pushpull")
            out.append(Row("pushpull %d in / %d out × %s" % (k, k, human(s)), "GB/s",
                           convert(a, "GB/s"), convert(b, "GB/s"), True, {"ratio": 3}, limit,
                           lname))
    for s in sizes:
        a, b = pair("init", human(s).replace(" ", ""))
        if a is None and b is None:
            continue
        limit, lname = lim_turn("fresh", 1, s, "init")
        out.append(Row("init, fresh key × %s" % human(s), "GB/s", convert(a, "GB/s"),
                       convert(b, "GB/s"), True, {"ratio": 2}, limit, lname))
    for var, what in (("async", "N pairs, then WaitAll"),
                      ("sync", "WaitToRead after each pull")):
        a, b = pair("pair", var)
        if a or b:
            out.append(Row("1-element push+pull pair, C (%s)" % what, "µs", convert(a, "µs"),
                           convert(b, "µs"), False, {"max": 0.5}))
    a, b = pair("keys1000", "one call")
    if a or b:
        out.append(Row("1000 keys × 1 KB, one Push call", "ms", convert(a, "ms"),
                       convert(b, "ms"), False, {"max": 0.5}))
    a, b = pair("keys1000", "1000 calls")
    if a or b:
        out.append(Row("1000 keys × 1 KB, 1000 Push calls", "ms", convert(a, "ms"),
                       convert(b, "ms"), False))
    for r in data:
        if r["figure"] == "rss" and r["variant"] != "baseline" and r["lib"] == A:
            a, b = pair("rss", r["variant"])
            big = "64MB" in r["variant"]
            out.append(Row("peak RSS, %s keys on 1 context (init, push 2 each, pull each)"
                           % r["variant"].replace("x", " × "), "GiB",
                           convert(a, "GiB"), convert(b, "GiB"), False,
                           {"max": 2.2} if big else {}))
            a, b = pair("rss", "baseline")
            out.append(Row("RSS baseline (dlopen + MXKVStoreCreate)", "GiB", convert(a, "GiB"),
                           convert(b, "GiB"), False))
            break
    rsp_pull = [r for r in data if r["figure"] == "rsp_pull" and r["lib"] == A]
    for r in rsp_pull:
        a, b = pair("rsp_pull", r["variant"])
        out.append(Row("row_sparse_pull %s" % r["variant"], "GB/s", convert(a, "GB/s"),
                       convert(b, "GB/s"), True, {"ratio": 5}))
        out.append(Row("  same, time per call", "ms", convert(a, "ms"), convert(b, "ms"),
                       False))
    for r in data:
        if r["figure"] == "rsp_push" and r["lib"] == A:
            a, b = pair("rsp_push", r["variant"])
            nv = r["variant"].split(" ")[0]
            out.append(Row("row_sparse push, %s (%s value%s)" % (
                r["variant"], nv, "s" if nv != "1" else ""), "GB/s", convert(a, "GB/s"),
                convert(b, "GB/s"), True, {"ratio": 5},
                note="MXNet aliases the caller's array (no copy)" if nv == "1" else ""))
    if len(rsp_pull) == 2:
        # per-row cost of the small pull over that of the large one: 1 = proportional
        small, large = rsp_pull[0]["variant"], rsp_pull[1]["variant"]
        ns, nl = int(small.split()[0]), int(large.split()[0])
        vals = []
        for lib in (A, B):
            rs, rl = get.get(("rsp_pull", small, lib)), get.get(("rsp_pull", large, lib))
            if rs is None or rl is None:
                st = "na"
            elif "FAIL" in (rs["status"], rl["status"]):
                st = "FAIL"
            elif rs["status"] != "ok" or rl["status"] != "ok":
                st = "na"
            else:
                st = "ok"
            if st != "ok":
                vals.append({"med": 0, "min": 0, "max": 0, "status": st, "note": ""})
                continue
            per_s = fnum(rs["median"]) / ns
            per_l = fnum(rl["median"]) / nl
            v = per_s / per_l
            vals.append({"med": v, "min": v, "max": v, "status": "ok", "note": ""})
        row = Row("row_sparse_pull: time per row at %d rows ÷ at %d rows (1 = cost "
                  "proportional to rows)" % (ns, nl), "×", vals[0], vals[1], False,
                  {"maxval": (2.0, "≤ 2 (proportional)")})
        out.append(row)
    for var, what in (("async", "N pairs, then waitall"),
                      ("sync", "wait_to_read after each pull")):
        a, b = pair("py_pair", var)
        if a or b:
            out.append(Row("1-element push+pull pair, Python (%s)" % what, "µs",
                           convert(a, "µs"), convert(b, "µs"), False, {"max": 4}))
    for fig, label in (("py_push", "Python push"), ("py_pull", "Python pull")):
        for r in data:
            if r["figure"] == fig and r["lib"] == A:
                a, b = pair(fig, r["variant"])
                out.append(Row("%s %s" % (label, r["variant"]), "GB/s", convert(a, "GB/s"),
                               convert(b, "GB/s"), True))
    for r in data:
        if r["figure"] == "py_params" and r["lib"] == A:
            a, b = pair("py_params", r["variant"])
            out.append(Row("Python nd.%s (%s)" % tuple(r["variant"].split(" ", 1)), "ms",
                           convert(a, "ms"), convert(b, "ms"), False))
    for r in data:
        if r["figure"] == "py_random" and r["lib"] == A:
            a, b = pair("py_random", r["variant"])
            kind, n, dtype = r["variant"].split(" ")
            unit = "µs" if int(n) < 10000 else "ms"
            out.append(Row("Python mx.random.%s, %s %s numbers" % (kind, n, dtype), unit,
                           convert(a, unit), convert(b, unit), False))
    return out, limits, limit_rows, meta, data


def markdown(rows, limits, limit_rows, meta, data, args):
    L = []
    date = args.date
    mode = meta.get("c:mode", "full")
    L.append("# libmxkv vs MXNet 1.9.1 KVStore benchmark — %s%s" % (
        date, " (smoke run)" if mode == "smoke" else ""))
    L.append("")
    cores = meta.get("c:cores", "?")
    ram = fnum(meta.get("c:ram_bytes", 0)) / 2 ** 30
    L.append("Machine: %s cores (%s), %.1f GiB RAM, %s. MXNet's OpenMP and engine threads at "
             "their defaults (OMP_NUM_THREADS=%s, MXNET_* unset unless listed: %s)." % (
                 cores, cpu_model(), ram, platform.platform(),
                 os.environ.get("OMP_NUM_THREADS", "unset"),
                 ", ".join("%s=%s" % (k, v) for k, v in sorted(os.environ.items())
                           if k.startswith("MXNET_")) or "none"))
    L.append("")
    for key, val in sorted(meta.items()):
        if key.startswith("c:lib_"):
            path = val.split(" (")[0]
            L.append("- %s: `%s` %s, sha256 %s" % (key[6:], path, val[len(path):].strip(),
                                                   sha(path)))
    L.append("- libmxkv source: git %s" % git_rev())
    L.append("- Python: %s, MXNet %s" % (meta.get("py:python", "?"),
                                         meta.get("py:mxnet_version", "?")))
    run = "C part %s s, Python part %s s" % (meta.get("c:elapsed_s", "?"),
                                            meta.get("py:elapsed_s", "?"))
    if args.elapsed:
        run = "%s s in total (%s)" % (args.elapsed, run)
    L.append("- Run time: %s. Peak RSS of the C benchmark process (both libraries loaded): "
             "%.2f GiB." % (run, fnum(meta.get("c:self_maxrss_bytes", 0)) / 2 ** 30))
    loads = [fnum(meta[k]) for k in ("c:other_load_cores", "py:other_load_cores") if k in meta]
    if loads:
        L.append("- Other processes on the machine used on average %s cores during the C and "
                 "Python parts%s." % (
                     " and ".join("%.2f" % x for x in loads),
                     " — **the machine was not idle: absolute figures and limits are "
                     "depressed and noisy; the A/B alternation keeps the ratios roughly fair**"
                     if max(loads) > 0.2 else " (machine otherwise idle)"))
    L.append("")
    counts = {}
    for r in rows:
        res = r.result().split(" ")[0]
        counts[res] = counts.get(res, 0) + 1
    L.append("Summary: " + ", ".join("%d %s" % (v, k) for k, v in sorted(counts.items())))
    L.append("")
    L.append("## Machine limits (plain C, float32, %s arrays, pthreads)" % human(
        int(next((r[3]["size_bytes"] for r in limit_rows), 0))))
    L.append("")
    L.append("Each kernel is measured at the start and at the end of the C run; the better "
             "median of the two is shown, and the best thread count is the limit. The figures "
             "are held to the same kernels timed in turn with the libraries (next table) "
             "where the run has them.")
    L.append("")

    def kernel_desc(name):
        kernel, _, at = name.partition("@")
        at, _, rest = at.partition(" ")
        kernel = (kernel + " " + rest).strip()
        moved = {"memcpy": "2S", "fresh": "2S", "fresh huge": "2S"}.get(kernel)
        if moved is None:
            k = int(kernel.split("=")[1])
            moved = "%dS" % (2 * k if kernel.startswith("sumcopy") else k + 1)
        desc = {"memcpy": "memcpy", "fresh": "copy into fresh memory (calloc per op, held)",
                "fresh huge": "copy into fresh memory, 2 MB pages (mmap + MADV_HUGEPAGE per "
                "op, held)"}.get(
            kernel, kernel.replace("sumcopy k=", "one-pass sum of k inputs, copied to k "
                                   "outputs, k=")
                          .replace("sum k=", "one-pass sum of k=")
                          .replace("bcast n=", "broadcast copy to n="))
        if at.startswith("inline-"):  # inline-<figure>-<size>
            fig, _, size = at[len("inline-"):].rpartition("-")
            desc += " — beside %s × %s" % (fig, size.replace("KB", " KB").replace("MB", " MB"))
        elif at:
            desc += " — %s, in cache" % at.replace("KB", " KB")
        return desc, moved

    byname = {}
    for name, threads, gbps, _ in limit_rows:
        d = byname.setdefault(name, {})
        d[threads] = max(d.get(threads, 0.0), gbps)
    for title, turn in (("", False), ("Timed in turn with the libraries: in each repetition "
                                      "of the figure of that size, after MXNet and libmxkv "
                                      "(2 ms apart), for as long as a library's turn (copies "
                                      "into fresh memory: as many as the library that ran "
                                      "most)", True)):
        if turn:
            L.append(title)
            L.append("")
        L.append("| kernel | bytes moved | 1 thread GB/s | 2 threads GB/s | limit used (best) |")
        L.append("|---|---|---|---|---|")
        for name, t in byname.items():
            if ("@inline-" in name) != turn:
                continue
            desc, moved = kernel_desc(name)
            L.append("| %s | %s | %s | %s | %s |" % (desc, moved, fmt(t.get("1")),
                                                    fmt(t.get("2")), fmt(limits[name])))
        L.append("")
    L.append("## Results (medians; [min–max] over the repetitions)")
    L.append("")
    L.append("libmxkv/MXNet is the ratio of the figure in its own unit: for GB/s higher is "
             "better for libmxkv, for µs, ms, GiB and × lower is. \"/ limit\" is the figure's "
             "GB/s over the figure's machine limit (at 64 MB and 4 MB, and for pulls at "
             "256 KB), timed in turn with the figure where the run has it.")
    L.append("")
    L.append("| figure | MXNet 1.9.1 | libmxkv | libmxkv/MXNet | MXNet / limit | "
             "libmxkv / limit | target | result |")
    L.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = r.ratio()
        L.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r.name + (" ¹" if r.note else ""), cell(r.a, r.unit), cell(r.b, r.unit),
            ("%s×" % fmt(ratio)) if ratio is not None else "—", fmt(r.frac(r.a)),
            fmt(r.frac(r.b)), r.target_text(), r.result()))
        if r.note and r.frac(r.a) is not None:  # push 1 input: MXNet's figure is nominal
            L[-1] = L[-1].replace("| %s |" % fmt(r.frac(r.a)), "| alias |", 1)
    L.append("")
    L.append("¹ MXNet 1.9.1's local store does not copy a single pushed value: the store "
             "entry becomes the caller's array itself (later writes into it change what Pull "
             "returns), so \"push 1 input\" costs MXNet only bookkeeping, and its GB/s are "
             "nominal. libmxkv copies. The target is the fraction of memcpy. The same holds for a "
             "single row_sparse value (MXNet's time there is its engine's bookkeeping, "
             "≈ 7–9 µs); there libmxkv adopts the value's parts without a copy when nothing "
             "else holds them, freezing them so that later writes by the caller still do not "
             "reach the store, and its time is the check of the row indices.")
    L.append("")
    nas = [(d["figure"], d["variant"], d["lib"], d["note"]) for d in data
           if d["status"] == "na"]
    fails = [(d["figure"], d["variant"], d["lib"], d["note"]) for d in data
             if d["status"] == "FAIL"]
    if nas:
        L.append("**n/a**: a library refused a call the figure needs (rc -1), so the figure "
                 "is not measured for it:")
        L.append("")
        seen = set()
        for fig, var, lib, note in nas:
            if (lib, note) in seen:
                continue
            seen.add((lib, note))
            L.append("- %s (%s %s and others like it): %s" % (lib, fig, var, note))
        L.append("")
    if fails:
        L.append("**FAIL** (wrong value or failed call):")
        L.append("")
        for fig, var, lib, note in fails:
            L.append("- %s %s %s: %s" % (lib, fig, var, note))
        L.append("")
    L.append("## How it is measured")
    L.append("")
    if mode == "smoke":
        L.append("- **Smoke run**: 4 KB values only, 3 repetitions of ≈ 2 ms, limits on 1 MB "
                 "arrays, RSS with 16 × 1 MB keys, a 10,000-row table and 100-row pushes; the "
                 "figures are for checking values, not for comparing speed.")
    L.append(
        "- `bench/kvbench.c` dlopens both libraries (RTLD_LOCAL) into one process and calls "
        "only the C API through dlsym. Per figure: set-up in both, one warm-up operation "
        "each, calibration of the operations per repetition (≈ 40 ms per repetition below "
        "64 MB, ≈ 50 ms at 64 MB, at least one operation), then repetitions alternating "
        "MXNet, libmxkv, MXNet, … (9 repetitions, 5 at 64 MB), each timed region ending with "
        "`MXNDArrayWaitAll`, with a 2 ms pause before each region so the other library's "
        "spinning pool threads go idle. Afterwards the values are pulled and compared "
        "exactly (all test values are exact in float32); a wrong value fails the run.")
    L.append(
        "- Values are float32 in a `local` store without updater; inputs of a k-input push "
        "live on cpu(0)…cpu(k-1), outputs of an n-output pull on cpu(0)…cpu(n-1), one key "
        "listed k (n) times in one call. pushpull: k inputs and k outputs.")
    L.append(
        "- **Bytes moved** per operation = bytes of all inputs read + all outputs written, "
        "the stored value counting as the output of push/init and the input of pull "
        "(S = size of one value): push k inputs (k+1)·S; pull into n outputs (n+1)·S; "
        "pushpull k/k 2k·S; init 2·S; memcpy 2·S; k-input sum (k+1)·S; broadcast copy to "
        "n (n+1)·S; row_sparse pull of m rows 2·m·264 B (256 B of data and 8 B of row id "
        "read, the same written); row_sparse push of v values of m rows (v·m + union)·264 B. "
        "GB = 10⁹ bytes.")
    L.append(
        "- Machine limits: plain C loops (gcc -O3, baseline x86-64), 1 and 2 pthreads, each "
        "thread on a contiguous half, 64 MB arrays from posix_memalign, measured at the start "
        "and at the end of the run, the best of thread counts and passes used as the limit. "
        "memcpy: the faster of one glibc memcpy per thread (non-temporal stores at this "
        "size) and 64 KB memcpy's (regular stores). The k-input sum is "
        "`out[i] = a0[i] + … + ak-1[i]` in one pass; the broadcast copy reads each 32 KB "
        "block of the source once and memcpy's it to the n outputs. The sum copied to k "
        "outputs (the work of a pushpull: k inputs read, the stored value and k outputs "
        "written, counted as 2k·S like the figure) sums each 16 KB block and memcpy's it to "
        "the outputs while in cache. The copy into fresh "
        "memory callocs a new 64 MB destination per operation (or maps it with 2 MB pages "
        "requested, as libmxkv does for arrays of 32 MiB or more) and keeps it until the "
        "measurement ends (as the init figure keeps its keys), so the kernel faults in and "
        "zeroes every page first: the limit of an init is the better of the two. On this VM that cost is set by the "
        "hypervisor more than by the guest: its balloon device reports freed guest memory to "
        "the host (virtio free page reporting), and the first touch of such memory costs a "
        "host page fault, so the same 64 MB copy took 8 ms or 120 ms minutes apart; memory bandwidth, shared "
        "with other guests, moves too (the 2-input sum ran at 36 GB/s at the start of one "
        "run and 21 GB/s at its end). So each figure at 64 MB, each but init at 4 MB, and each pull at 256 KB is "
        "held to its kernel timed in turn with the two libraries in each of its repetitions "
        "(\"timed in turn\"), on 1 and 2 threads at 64 MB and 4 MB and 1 thread at 256 KB. At 256 KB memcpy and the broadcast "
        "copies are measured on one thread with the arrays in cache (starting a second "
        "thread costs more than such a copy), the limits of the pulls of that size.")
    L.append(
        "- Pair latency: key of one float32; `async` = N × (Push, Pull) then one WaitAll; "
        "`sync` = N × (Push, Pull, WaitToRead(out)) — the issue's \"~10 µs\" for MXNet "
        "matches `sync`. Both are held to the target.")
    L.append(
        "- 1000 keys: keys 0…999 of 256 float32 each, one value per key, pushed in one "
        "`MXKVStorePush` of 1000 keys or in 1000 calls of one key.")
    L.append(
        "- Peak RSS: the benchmark re-executes itself in a child per library (fork + exec, "
        "`--rss-child`) that creates a store, inits 16 keys × 64 MB on cpu(0), pushes 2 "
        "values to each key, pulls each key (and checks it); the parent reads ru_maxrss via "
        "wait4. Includes one 64 MB host staging buffer, the same for both libraries. "
        "GiB = 2³⁰ bytes. The baseline child only loads the library and creates a store.")
    L.append(
        "- row_sparse: a 1,000,000 × 64 float32 table (all rows stored) as key 0; "
        "`MXKVStorePullRowSparse` of m rows (ids i·R/m, sorted, int64) into a row_sparse "
        "output; push of one row_sparse value of 1000 rows (and of two values whose rows "
        "half overlap, union 1500 rows) to key 1, checked by a row_sparse pull. Values are "
        "built as MXNet's Python does (`MXNDArrayCreateSparseEx` storage type 1, int64 aux, "
        "then `MXNDArraySyncCopyFromNDArray(dst, data, -1)` and `(dst, indices, 0)`): in "
        "MXNet 1.9.1 `MXNDArrayGetDataNDArray` / `GetAuxNDArray` return deep copies, so "
        "`SyncCopyFromCPU` into them returns 0 but never reaches the sparse array.")
    L.append(
        "- `bench/pybench.py`: `import mxnet` and `import mxkv` in one process, same "
        "alternation, `nd.waitall()` ending each region, values checked with numpy. "
        "`nd.save` / `nd.load` / `nd.load_frombuffer` rows: a named float32 set saved to "
        "and reloaded from a file in the page cache, as a training job checkpoints (each "
        "load's arrays freed before the next, so a library that keeps freed buffers "
        "reuses them); each library's file is checked to be MXNet's byte for byte and "
        "every loaded array to hold the saved bytes.")
    L.append("")
    L.append("## MXNet 1.9.1 behaviour that shapes these figures")
    L.append("")
    L.append(
        "- Single-value push without updater: the store entry becomes the caller's array "
        "(no copy), so MXNet's \"push 1 input\" is bookkeeping only (≈ 0.3–0.5 µs at any "
        "size); it is measured as MXNet does it, and only libmxkv's copy is held to a target.")
    L.append(
        "- Freed memory is pooled by both libraries: MXNet's CPU storage keeps every freed "
        "buffer for reuse by an array of the same rounded size (its default \"Naive\" "
        "pool), libmxkv keeps freed mappings of 32 MiB or more, up to 1 GiB "
        "(`MXKV_CPU_MEM_POOL_MB`). So an init at 64 MB after the earlier figures freed "
        "their 64 MB arrays may copy into memory already touched rather than fresh "
        "memory, and run above the fresh-memory limit (the limit of a copy into touched "
        "memory is memcpy); each library's own pool decides how often.")
    L.append(
        "- Multi-value push without updater: the entry becomes the key's merge buffer and "
        "the array made by Init is dropped, so after the RSS sequence MXNet holds a merge "
        "buffer and a copy buffer per key (2 × 16 × 64 MB), not three arrays per key.")
    L.append(
        "- `MXNDArrayGetDataNDArray` / `MXNDArrayGetAuxNDArray` return deep copies (filling "
        "them is silently lost), and `MXNDArraySyncCopyToCPU` on a row_sparse array fails "
        "(`Memory size do not match`): sparse values are filled with "
        "`SyncCopyFromNDArray` and read through the copies.")
    L.append(
        "- Every MXNet call goes through its threaded engine: a 4 KB multi-input push costs "
        "tens of µs whatever the bandwidth, and `WaitToRead` after each pull adds the "
        "engine worker's wake-up latency (large and variable in this VM when it is idle).")
    L.append("")
    return "\n".join(L)


def chart(rows, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = [(r.name, r.advantage(), r.result(), r.target.get("ratio")) for r in rows
             if r.unit != "×" and not r.name.startswith("  ") and not r.note]
    items = [it for it in items if it[1] is not None]
    if not items:
        return
    h = max(4.0, 0.26 * len(items) + 1.5)
    fig, ax = plt.subplots(figsize=(11, h))
    ys = list(range(len(items)))[::-1]
    colors = {"PASS": "#2ca02c", "MISS": "#d62728", "info": "#7f7f7f"}
    for y, (name, adv, res, tgt) in zip(ys, items):
        ax.barh(y, adv, color=colors.get(res.split(" ")[0], "#ff7f0e"), height=0.7)
        if tgt:
            ax.plot([tgt, tgt], [y - 0.4, y + 0.4], color="black", lw=1.5)
        ax.text(adv * 1.05, y, "%.2g×" % adv, va="center", fontsize=7)
    ax.set_yticks(ys)
    ax.set_yticklabels([it[0] for it in items], fontsize=7)
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xlabel("libmxkv advantage over MXNet 1.9.1 (×, log scale; > 1 = libmxkv better)\n"
                  "= libmxkv/MXNet for GB/s, MXNet/libmxkv for µs, ms, GiB", fontsize=8)
    ax.set_title(title + "\nbar colour: green PASS, red MISS, grey no target; black tick = "
                 "ratio target\npush of 1 input left out (MXNet aliases the caller's array; "
                 "see the table)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--c", required=True, help="kvbench CSV")
    ap.add_argument("--py", help="pybench CSV")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--elapsed", help="total run time in seconds (from make)")
    ap.add_argument("--no-png", action="store_true")
    ap.add_argument("--quiet", action="store_true", help="do not print the table")
    args = ap.parse_args()
    rows_c = load(args.c)
    rows_py = load(args.py) if args.py and os.path.exists(args.py) else []
    rows, limits, limit_rows, meta, data = build(rows_c, rows_py)
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, args.date)
    fields = list(rows_c[0].keys()) + ["gb_per_s"] if rows_c else []
    with open(base + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows_c + rows_py:
            r = dict(r)
            b, t = fnum(r["bytes_per_op"]), fnum(r["median"])
            r["gb_per_s"] = "%.4f" % (b / t / 1e9) if b > 0 and t > 0 and r["unit"] == "s" \
                else ""
            w.writerow(r)
    md = markdown(rows, limits, limit_rows, meta, data, args)
    with open(base + ".md", "w") as f:
        f.write(md)
    if not args.no_png:
        chart(rows, base + ".png", "libmxkv vs MXNet 1.9.1, %s" % args.date)
    if not args.quiet:
        print(md)
        print("wrote %s.csv, %s.md%s" % (base, base, "" if args.no_png else ", %s.png" % base))
    bad = [d for d in data if d["status"] == "FAIL"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
