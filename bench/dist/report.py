"""report (dist): distbench's CSV as bench/results/<date>-dist.{csv,md,png}.

    python bench/dist/report.py --csv RAW.csv --out-dir DIR [--date YYYY-MM-DD]
                                [--elapsed SECONDS] [--no-png] [--quiet]

Writes DIR/<date>-dist.csv (every row of RAW.csv, with GB/s where it
applies), DIR/<date>-dist.md (per-worker figures of MXNet 1.9.1 and libmxkv,
the ratio libmxkv/MXNet, the fraction of the loopback TCP limit measured in
the same run, issue 10's targets and PASS/MISS; "n/a" where a library's
distributed store was not available) and DIR/<date>-dist.png (a small chart),
and prints the Markdown. The table rows, cells and PASS/MISS rules are those
of the local report (bench/report.py, loaded from there). Exit status 1 if a
row has status FAIL, else 0.
"""
import argparse
import csv
import datetime
import importlib.util
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "bench_local_report", os.path.join(os.path.dirname(HERE), "report.py"))
local = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(local)
Row, cell, fmt, convert, fnum, load, sha, git_rev, cpu_model = (
    local.Row, local.cell, local.fmt, local.convert, local.fnum, local.load, local.sha,
    local.git_rev, local.cpu_model)
A, B = "mxnet", "mxkv"


def human(nbytes):
    return local.human(nbytes)


def loopback_limits(data):
    """{(figure, pairs): {"start"/"end": row}} and the limits used: the best repetition of
    start and end for GB/s (best of N), the lower median for the round trip."""
    got = {}
    for r in data:
        if r["lib"] != "machine" or r["status"] != "ok":
            continue
        pairs, _, when = r["variant"].partition(" ")
        got.setdefault((r["figure"][len("limit_"):], int(pairs.split("=")[1])), {})[when] = r
    used = {}
    for key, d in got.items():
        rows = list(d.values())
        if fnum(rows[0]["bytes_per_op"]) > 0:
            used[key] = max(fnum(x["bytes_per_op"]) / fnum(x["min"]) / 1e9 for x in rows)
        else:
            used[key] = min(fnum(x["median"]) for x in rows) * 1e6
    return got, used


def build(data, used):
    get = {(r["figure"], r["variant"], r["lib"]): r for r in data}

    def pair(fig, var):
        return convert_row(get.get((fig, var, A))), convert_row(get.get((fig, var, B)))

    def convert_row(r):
        if r is None:
            return None
        return convert(r, "µs" if r["figure"] == "pair" else "GB/s")

    size = next((int(r["size_bytes"]) for r in data if r["figure"] == "pushpull"), 64 << 20)
    hs = human(size)
    lim1, lim2 = used.get(("send_reply", 1)), used.get(("send_reply", 2))
    ln1 = "loopback %s send + reply" % hs
    ln2 = "loopback %s send + reply, 2 pairs at once (per pair)" % hs
    rows = []
    for var, w, s, lim, lname in (("1w1s", 1, 1, lim1, ln1), ("2w2s", 2, 2, lim2, ln2)):
        cl = "%d worker%s + %d server%s" % (w, "s" if w > 1 else "", s, "s" if s > 1 else "")
        a, b = pair("pushpull", var)
        if a or b:
            target = {"frac": 0.7} if w == 1 else {"ratio": 2}
            rows.append(Row("%s pushpull, %s, per worker" % (hs, cl), "GB/s", a, b, True,
                            target, lim, lname))
        a, b = pair("pushpull_split", var)
        if a or b:
            rows.append(Row("%s push then pull, %s, per worker" % (hs, cl), "GB/s", a, b,
                            True, {}, lim, lname))
        a, b = pair("pair", var)
        if a or b:
            rows.append(Row("1-element push + pull + wait, %s" % cl, "µs", a, b, False,
                            {"max": 60} if w == 1 else {}))
    return rows


def markdown(rows, data, meta, got, used, args):
    L = []
    mode = meta.get("mode", "full")
    L.append("# libmxkv vs MXNet 1.9.1 distributed KVStore benchmark — %s%s" % (
        args.date, " (smoke run)" if mode == "smoke" else ""))
    L.append("")
    L.append("Machine: %s cores (%s), %s. Every node on 127.0.0.1; MXNet's OpenMP and engine "
             "threads at their defaults (OMP_NUM_THREADS=%s, MXNET_* unset unless listed: "
             "%s)." % (meta.get("cores", "?"), cpu_model(), platform.platform(),
                       os.environ.get("OMP_NUM_THREADS", "unset"),
                       ", ".join("%s=%s" % (k, v) for k, v in sorted(os.environ.items())
                                 if k.startswith("MXNET_")) or "none"))
    L.append("")
    so = meta.get("mxkv_library", "")
    L.append("- mxkv: `%s`, sha256 %s; libmxkv source: git %s (when measured)" % (
        so, meta.get("mxkv_sha256") or (sha(so) if so else "?"),
        meta.get("git_rev") or git_rev()))
    L.append("- Command: `make bench-dist` (`bench/dist/distbench.py`, then "
             "`bench/dist/report.py`)%s" % (
                 "; smoke run: `make bench-dist-smoke`" if mode == "smoke" else ""))
    L.append("- Python %s (every node: `%s`), MXNet 1.9.1" % (meta.get("python", "?"),
                                                             meta.get("node_python", "?")))
    tun = meta.get("glibc_tunables", "")
    L.append("- Malloc settings: the launcher sets none (as MXNet's `tools/launch.py`); "
             "`GLIBC_TUNABLES` in the run's environment: %s. libmxkv keeps its own big "
             "blocks for reuse (`src/capi/bigalloc.rs`)" % ("`%s`" % tun if tun else "unset"))
    avail = meta.get("mxkv_dist", "")
    if avail.startswith("not available"):
        L.append("- **libmxkv's distributed store was not available in this run**: a 1 worker "
                 "+ 1 server probe job (`worker.py --lib mxkv --probe`) failed (%s). Its rows "
                 "are n/a; nothing is estimated. The same command measures it once "
                 "`mxkv.kv.create('dist_sync')` and the server role of `import mxkv` work." %
                 avail[len("not available: "):].replace("|", "/"))
    elif avail:
        L.append("- libmxkv's distributed store: %s (probe job passed)" % avail)
    run = "%s s" % meta.get("elapsed_s", "?")
    if args.elapsed:
        run = "%s s in total (benchmark %s)" % (args.elapsed, run)
    L.append("- Run time: %s; %s job%s per library and cluster, alternating the libraries; "
             "worker arguments `%s`." % (run, meta.get("rounds", "?"),
                                        "s" if meta.get("rounds") != "1" else "",
                                        meta.get("worker_args", "")))
    load = fnum(meta.get("other_load_cores", 0))
    L.append("- Other processes on the machine used on average %.2f cores during the run "
             "(load average %s at the start, %s at the end)%s." % (
                 load, meta.get("loadavg_start", "?"), meta.get("loadavg_end", "?"),
                 " — **the machine was not idle: absolute figures and the loopback limits "
                 "are depressed and noisy**" if load > 0.2 else " (machine otherwise idle)"))
    L.append("")
    counts = {}
    for r in rows:
        res = r.result().split(" ")[0]
        counts[res] = counts.get(res, 0) + 1
    L.append("Summary: " + ", ".join("%d %s" % (v, k) for k, v in sorted(counts.items())))
    L.append("")
    L.append("## Loopback TCP limits (127.0.0.1, measured in the same run)")
    L.append("")
    L.append("A client and an echo process (two Python processes, as a worker and a server "
             "are) over one TCP connection, kernel default buffer sizes, measured at the "
             "start and at the end of the run. GB/s = bytes of one value / time of one "
             "operation (the unit of the figures below). The limit used is the best "
             "repetition of the two measurements (best of N; a figure's median is held to "
             "it); for the round trip, the lower median. The Python ends cost little: the "
             "client receives 64 MB in about 20 `recv_into` calls of 3–4 MB, so the kernel's "
             "copies set the limit.")
    L.append("")
    L.append("| measurement | start: median [best] | end: median [best] | limit used |")
    L.append("|---|---|---|---|")
    descs = (("send_reply", 1, "%s sent, then %s sent back (the traffic of one pushpull)"),
             ("send_reply", 2, "same, 2 pairs at once, per pair (the traffic of 2 workers)"),
             ("stream", 1, "%s one way, 1-byte reply"),
             ("ping", 1, "1 byte there and back, TCP_NODELAY"),
             ("zmq_echo", 1, "%s sent and echoed back over libzmq DEALER/ROUTER, the transport "
              "the protocol prescribes (two Rust processes, `examples/zmq_echo.rs`, with "
              "glibc keeping freed memory): for comparison, not a limit used"),
             ("zmq_ping", 1, "2 bytes there and back over libzmq DEALER/ROUTER, the same "
              "two processes: the transport's own round trip, for comparison, not a limit "
              "used"))
    for fig, pairs, desc in descs:
        d = got.get((fig, pairs))
        if not d:
            continue
        sz = human(int(next(iter(d.values()))["size_bytes"]))
        desc = desc.replace("%s", sz)
        cells = []
        for when in ("start", "end"):
            r = d.get(when)
            if r is None:
                cells.append("—")
            elif fig in ("ping", "zmq_ping"):
                cells.append("%s µs [%s]" % (fmt(fnum(r["median"]) * 1e6),
                                             fmt(fnum(r["min"]) * 1e6)))
            else:
                b = fnum(r["bytes_per_op"])
                cells.append("%s GB/s [%s]" % (fmt(b / fnum(r["median"]) / 1e9),
                                               fmt(b / fnum(r["min"]) / 1e9)))
        lim = used[(fig, pairs)]
        L.append("| %s | %s | %s | %s |" % (
            desc, cells[0], cells[1], "—" if fig.startswith("zmq_") else "%s %s" % (
                fmt(lim), "µs" if fig == "ping" else "GB/s")))
    L.append("")
    L.append("## Results (per worker; medians, [min–max] over every timed operation of every "
             "worker and job)")
    L.append("")
    L.append("libmxkv/MXNet is the ratio of the figure in its own unit (GB/s: higher is "
             "better; µs: lower is). \"/ limit\" is the figure's GB/s over the loopback send "
             "+ reply limit above (1 pair for 1 worker, per pair of 2 for 2 workers).")
    L.append("")
    L.append("| figure | MXNet 1.9.1 | libmxkv | libmxkv/MXNet | MXNet / limit | "
             "libmxkv / limit | target | result |")
    L.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = r.ratio()
        tgt = r.target_text()
        if "frac" in r.target:
            tgt += " (≈ 2× MXNet or more)"
        L.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r.name, cell(r.a, r.unit), cell(r.b, r.unit),
            ("%s×" % fmt(ratio)) if ratio is not None else "—", fmt(r.frac(r.a)),
            fmt(r.frac(r.b)), tgt, r.result()))
    L.append("")
    fails = [d for d in data if d["status"] == "FAIL"]
    if fails:
        L.append("**FAIL** (wrong value, or a job that did not run to the end):")
        L.append("")
        for d in fails:
            L.append("- %s %s %s: %s" % (d["lib"], d["figure"], d["variant"], d["note"]))
        L.append("")
    L.append("## How it is measured")
    L.append("")
    if mode == "smoke":
        L.append("- **Smoke run**: %s values (split over the servers), one timed operation "
                 "each, 50 pairs, loopback on the same size; the figures are for checking "
                 "values, not for comparing speed." % human(int(next(
                     (r["size_bytes"] for r in data if r["figure"] == "pushpull"), 0))))
    L.append(
        "- `bench/dist/distbench.py` starts each cluster with the project's launcher, "
        "`python bindings/python/mxkv_launch.py -n W -s S --timeout T -- PYTHON "
        "bench/dist/worker.py --lib mxnet|mxkv`, every node on 127.0.0.1 with ports chosen "
        "at run time; every node runs that command, and `import mxnet` (`import mxkv`) "
        "runs the scheduler or server role inside the import and exits. Clusters: 1 worker "
        "+ 1 server and 2 workers + 2 servers; jobs alternate the libraries (MXNet, "
        "libmxkv, MXNet, …) and are repeated, and every worker's operations of every job are "
        "pooled per figure, so each figure is per worker. Each job runs under the launcher's "
        "`--timeout` and is stopped by its process id if the launcher outlives it.")
    L.append(
        "- `bench/dist/worker.py`, the same script through `import mxnet as mx` and "
        "`import mxkv as mx`: a `dist_sync` store without optimizer (the servers assign the "
        "sum of the workers' pushes), float32 keys of %s and of 1 element. Before each "
        "timed operation the worker fills its gradient (`grad[:] = …`, then "
        "`wait_to_read`) and enters a barrier (`kv._barrier()`); the timed region is "
        "`kv.pushpull(key, grad, out=out)` (or `kv.push(key, grad)`, `kv.pull(key, "
        "out=out)`) and `out.wait_to_read()`; a barrier follows, then the pulled value is "
        "compared bit for bit with the exact sum over the workers (worker r pushes "
        "`p·(r+1) + b(r, i)` with p[j] = j mod 1000 and b changing every operation, so a "
        "misplaced server slice or a stale value fails). Warm-up operations first (checked, "
        "not timed). 1-element: `push`, `pull`, `wait_to_read` per iteration, each timed on "
        "its own between two barriers around the whole loop, each pulled value checked "
        "after its iteration; the median is the figure. A wrong value fails the run." %
        human(int(next((r["size_bytes"] for r in data if r["figure"] == "pushpull"),
                       64 << 20))))
    L.append(
        "- GB/s = bytes of the value (%s = %d bytes) / seconds per operation, per worker; "
        "GB = 10⁹ bytes. A pushpull moves the value to the servers and the sum back, the "
        "traffic of the loopback send + reply." % (
            human(int(next((r["size_bytes"] for r in data if r["figure"] == "pushpull"),
                           64 << 20))),
            int(next((r["size_bytes"] for r in data if r["figure"] == "pushpull"),
                     64 << 20))))
    L.append(
        "- libmxkv's rows are measured only if a probe job passes first (1 worker + 1 "
        "server: create `dist_sync`, pushpull one element, check it; short timeout); "
        "otherwise they are n/a with the probe's error.")
    L.append(
        "- Targets (issue 10): %s pushpull with 1 worker + 1 server ≥ 0.7 of the loopback "
        "send + reply limit of the same run (≈ 2× MXNet or more); 1-element push + pull ≤ "
        "60 µs from Python (held at 1 worker + 1 server; the 2 + 2 figure is shown); %s "
        "pushpull with 2 workers + 2 servers ≥ 2× MXNet per worker." % (
            human(int(next((r["size_bytes"] for r in data if r["figure"] == "pushpull"),
                           64 << 20))),
            human(int(next((r["size_bytes"] for r in data if r["figure"] == "pushpull"),
                           64 << 20)))))
    L.append("")
    L.append("## MXNet 1.9.1 behaviour that shapes these figures")
    L.append("")
    L.append(
        "- In sync mode MXNet's server answers a push only when every worker has pushed "
        "that key (it merges, assigns the sum, then answers every queued request), so the "
        "workers of a cluster move in lockstep and a figure includes waiting for the "
        "slowest worker. A pushpull is one request per server slice with push and pull set; "
        "a value of `MXNET_KVSTORE_BIGARRAY_BOUND` (10⁶) elements or more is split over "
        "all servers, a smaller one goes to one server.")
    L.append(
        "- A pull is answered from the server's stored value without waiting for other "
        "workers' pushes; this benchmark's barriers and the push-before-pull order of each "
        "worker's own engine keep every pulled value the sum of its round.")
    L.append(
        "- MXNet's worker goes through its threaded engine for every push, pull and wait "
        "(on a `local` store a 1-element push + pull + `wait_to_read` from Python costs "
        "≈ 75 µs in the local benchmark), so a 1-element push + pull costs hundreds of µs "
        "though the loopback round trip is tens.")
    L.append(
        "- A pull is sent only once the same worker's push of that key has been answered "
        "(in MXNet the engine orders them; libmxkv's worker waits the same way, since a "
        "pull sent earlier would read the value from before the round): a 1-element push + "
        "pull is two round trips one after the other. Through libzmq each is at least the "
        "libzmq round trip measured above (2 bytes there and back): a message wakes the "
        "sender's I/O thread, the receiver's I/O thread and the receiver, each wake-up "
        "~10-20 µs on this kind of machine.")
    L.append(
        "- libmxkv's workers and servers talk over lanes (`src/dist/lane.rs`: one direct TCP "
        "connection per worker and server beside the van, the same ps-lite messages, found "
        "through a field of the server's registration that real MXNet nodes skip): the "
        "worker's calling thread writes its request and reads the answer itself, the "
        "server's lane thread reads, handles and answers, and while both watch for the "
        "next message nobody is woken. The loopback limits above are two Python processes "
        "with blocking reads (the 1-byte round trip pays two wake-ups), so a libmxkv figure "
        "can exceed its limit. `MXKV_LANE=0` sends everything through the van (the figures "
        "of bench/results before this change).")
    L.append("")
    return "\n".join(L)


def chart(rows, got, used, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gb = [r for r in rows if r.unit == "GB/s"]
    us = [r for r in rows if r.unit == "µs"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4),
                                   gridspec_kw={"width_ratios": [3, 2]})

    def val(x):
        return x["med"] if x is not None and x["status"] == "ok" else None

    for ax, items, unit in ((ax1, gb, "GB/s per worker"), (ax2, us, "µs (median)")):
        ys = list(range(len(items)))[::-1]
        for y, r in zip(ys, items):
            for dy, x, color, lab in ((0.18, r.a, "#1f77b4", "MXNet 1.9.1"),
                                      (-0.18, r.b, "#ff7f0e", "libmxkv")):
                v = val(x)
                if v is None:
                    ax.text(0.02, y + dy, "%s: %s" % (lab, "n/a" if x is None or
                                                     x["status"] == "na" else x["status"]),
                            va="center", fontsize=7, transform=ax.get_yaxis_transform())
                    continue
                ax.barh(y + dy, v, height=0.34, color=color, label=lab)
                ax.text(v, y + dy, " %s" % fmt(v), va="center", fontsize=7)
            if r.limit:
                ax.plot([r.limit] * 2, [y - 0.42, y + 0.42], color="black", lw=1.2,
                        label="loopback send + reply limit")
            if "frac" in r.target and r.limit:
                ax.plot([r.limit * r.target["frac"]] * 2, [y - 0.42, y + 0.42], color="green",
                        lw=1.2, ls="--", label="target (0.7 of the limit)")
            if "ratio" in r.target and val(r.a):
                ax.plot([val(r.a) * r.target["ratio"]] * 2, [y - 0.42, y + 0.42],
                        color="purple", lw=1.2, ls="--",
                        label="target (%g× MXNet)" % r.target["ratio"])
            if "max" in r.target:
                ax.plot([r.target["max"]] * 2, [y - 0.42, y + 0.42], color="green", lw=1.2,
                        ls="--", label="target (≤ %g µs)" % r.target["max"])
        ax.set_yticks(ys)
        ax.set_yticklabels([r.name.replace(", per worker", "").replace(", ", "\n", 1)
                            for r in items], fontsize=7)
        ax.set_xlabel(unit, fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_ylim(-0.6, len(items) - 0.4)
    ping = used.get(("ping", 1))
    if ping:
        ax2.axvline(ping, color="grey", lw=0.8, ls=":", label="loopback 1-byte round trip")
    ax2.set_xscale("log")
    vals = [v for r in us for v in (val(r.a), val(r.b)) if v] + [60.0] + ([ping] if ping else [])
    ax2.set_xlim(min(vals) / 2, max(vals) * 4)
    gbv = [v for r in gb for v in (val(r.a), val(r.b), r.limit) if v]
    if gbv:
        ax1.set_xlim(0, max(gbv) * 1.15)
    handles = {}
    for ax in (ax1, ax2):
        for hh, ll in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(ll, hh)
    fig.legend(handles.values(), handles.keys(), fontsize=7, loc="lower center",
               ncol=min(4, len(handles)), frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", required=True, help="distbench CSV")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--elapsed", help="total run time in seconds (from make)")
    ap.add_argument("--no-png", action="store_true")
    ap.add_argument("--quiet", action="store_true", help="do not print the Markdown")
    args = ap.parse_args()
    allrows = load(args.csv)
    meta = {r["variant"]: r["note"] for r in allrows if r["figure"] == "meta"}
    data = [r for r in allrows if r["figure"] != "meta"]
    got, used = loopback_limits(data)
    rows = build(data, used)
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, args.date + "-dist")
    with open(base + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(allrows[0].keys()) + ["gb_per_s"])
        w.writeheader()
        for r in allrows:
            r = dict(r)
            b, t = fnum(r["bytes_per_op"]), fnum(r["median"])
            r["gb_per_s"] = "%.4f" % (b / t / 1e9) if b > 0 and t > 0 else ""
            w.writerow(r)
    md = markdown(rows, data, meta, got, used, args)
    with open(base + ".md", "w") as f:
        f.write(md)
    if not args.no_png:
        chart(rows, got, used, base + ".png",
              "Distributed KVStore on 127.0.0.1: libmxkv vs MXNet 1.9.1, %s" % args.date)
    if not args.quiet:
        print(md)
        print("wrote %s.csv, %s.md%s" % (base, base, "" if args.no_png else ", %s.png" % base))
    return 1 if any(d["status"] == "FAIL" for d in data) else 0


if __name__ == "__main__":
    sys.exit(main())
