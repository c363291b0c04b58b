#!/usr/bin/env python3
"""report: ./run bench's one table, and bench/results.json.

Reads what ./run bench's benchmarks wrote into one directory:
  topology.json, checkpoint.json   Google Benchmark JSON (--benchmark_out)
  extender.json                     Google Benchmark JSON with repetitions
                                    (mean, p99 and min aggregates)
  e2e.jsonl                         one JSON object per figure, from
                                    alloc_e2e_bench, churn_bench,
                                    kubelet_bench.py and scheduling_bench
                                    ({"bench","name","value","unit"})
  loadavg-start                     /proc/loadavg when the run began
and prints one table: figure | value | floor | ratio | target | verdict,
where ratio = value / floor and verdict is "met", "MISSED", "-" (no
target) or "no data" (the benchmark did not produce the figure). The floors
and targets are the issue's (docs/performance.md explains each). The same
rows, the raw figures, the date, the load average and the commit go to the
--out JSON file.

  bench/report.py --dir build-release/bench-out --out bench/results.json
Exit status: 0, or 1 when a figure is missing.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys


def read_benchmarks(path):
    """The entries of a Google Benchmark JSON file that did not fail (none
    when the file is missing or not JSON)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return []
    return [b for b in data.get("benchmarks", []) if not b.get("error_occurred")]


def load_gbench(path):
    """Google Benchmark JSON -> {name: benchmark entry} (iterations only)."""
    out = {}
    for b in read_benchmarks(path):
        if b.get("run_type", "iteration") != "iteration":
            continue
        out[b["name"]] = b
    return out


def load_aggregates(path):
    """Google Benchmark JSON with repetitions -> {(run_name, aggregate): entry}.

    run_name is the case's name up to its options, e.g. "BM_Filter/cold:0"
    for "BM_Filter/cold:0/iterations:1/repeats:30/real_time"."""
    out = {}
    for b in read_benchmarks(path):
        if b.get("run_type") != "aggregate":
            continue
        parts = [p for p in b.get("run_name", b["name"]).split("/")
                 if not p.startswith(("iterations:", "repeats:", "real_time", "min_time:"))]
        out[("/".join(parts), b.get("aggregate_name", ""))] = b
    return out


def to_unit(b, key, unit):
    """A Google Benchmark time (real_time or cpu_time) converted to `unit`."""
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    return b[key] * scale[b.get("time_unit", "ns")] / scale[unit]


def load_e2e(path):
    out = {}
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    o = json.loads(line)
                    out["%s.%s" % (o["bench"], o["name"])] = o["value"]
    except (OSError, ValueError):
        pass
    return out


def worst(gb, prefix, sizes, key="cpu_time", unit="us"):
    """The largest time over `prefix`/size for the sizes present; None if none."""
    values = [to_unit(gb[n], key, unit) for n in ("%s/%d" % (prefix, s) for s in sizes) if n in gb]
    if len(values) != len(sizes):
        return None
    return max(values)


def fmt(value, unit):
    if value is None:
        return "n/a"
    if unit in ("pods/s",):
        return "%.0f %s" % (value, unit)
    if abs(value) >= 100:
        return "%.0f %s" % (value, unit)
    if abs(value) >= 10:
        return "%.1f %s" % (value, unit)
    return "%.2f %s" % (value, unit)


class Row:
    def __init__(self, figure, value, unit, floor=None, target=None, check=None):
        self.figure, self.value, self.unit = figure, value, unit
        self.floor, self.target, self.check = floor, target, check

    def ratio(self):
        if self.value is None or self.floor in (None, 0):
            return None
        return self.value / self.floor

    def verdict(self):
        if self.value is None:
            return "no data"
        if self.check is None:
            return "-"
        return "met" if self.check(self.value, self.ratio()) else "MISSED"

    def cells(self):
        r = self.ratio()
        return [self.figure, fmt(self.value, self.unit),
                fmt(self.floor, self.unit) if self.floor is not None else "-",
                "%.2fx" % r if r is not None else "-",
                self.target or "-", self.verdict()]

    def json(self):
        return {"figure": self.figure, "value": self.value, "unit": self.unit,
                "floor": self.floor, "ratio": self.ratio(), "target": self.target,
                "verdict": self.verdict()}


def rows(e2e, topo, ckpt, ext):
    g = e2e.get

    def x(case, aggregate):
        b = ext.get((case, aggregate))
        return to_unit(b, "real_time", "ms") if b else None

    dom_mean = x("BM_ParseFloorDom", "mean")
    us_to_ms = lambda v: None if v is None else v / 1000.0
    reg = g("churn.register_ms")
    ck = {}
    for store, prefix in (("sqlite", "BM_Sqlite"), ("json", "BM_KubeletJson")):
        for pods in (10, 10000):
            # Names carry the case's options: "BM_Sqlite/10/min_time:1.000/real_time".
            b = next((v for n, v in ckpt.items()
                      if n == "%s/%d" % (prefix, pods) or n.startswith("%s/%d/" % (prefix, pods))),
                     None)
            ck[(store, pods)] = to_unit(b, "real_time", "ms") if b else None
    return [
        Row("alloc e2e p50 (2 GPUs, dgx1-v100, SQLite FULL)", us_to_ms(g("alloc_e2e.alloc_p50_us")),
            "ms", floor=us_to_ms(g("alloc_e2e.floor_p50_us")), target="<= 2x floor",
            check=lambda v, r: r is not None and r <= 2.0),
        Row("alloc e2e p99", us_to_ms(g("alloc_e2e.alloc_p99_us")), "ms",
            floor=us_to_ms(g("alloc_e2e.floor_p50_us"))),
        Row("alloc e2e mean", us_to_ms(g("alloc_e2e.alloc_mean_us")), "ms",
            floor=us_to_ms(g("alloc_e2e.floor_p50_us"))),
        Row("  floor: 2 bare gRPC round trips p50", us_to_ms(g("alloc_e2e.floor_rtt2_p50_us")), "ms"),
        Row("  floor: 1 bare SQLite commit p50", us_to_ms(g("alloc_e2e.floor_commit_p50_us")), "ms"),
        Row("admission throughput (1,000 pods, kdm kubelet)", g("kubelet.admit_pods_per_s"),
            "pods/s"),
        Row("10k-device snapshot p50", g("churn.snapshot_p50_ms"), "ms", target="< 20 ms",
            check=lambda v, r: v < 20.0),
        Row("10k-device snapshot max", g("churn.snapshot_max_ms"), "ms"),
        Row("10k-device snapshot, process CPU each", g("churn.snapshot_cpu_ms"), "ms"),
        Row("100 plugins registered", None if reg is None else reg / 1000.0, "s",
            target="< 2 s", check=lambda v, r: v < 2.0),
        Row("checkpoint change, SQLite, 10 pods", ck[("sqlite", 10)], "ms"),
        Row("checkpoint change, SQLite, 10,000 pods", ck[("sqlite", 10000)], "ms",
            floor=ck[("sqlite", 10)], target="<= 2x SQLite@10",
            check=lambda v, r: r is not None and r <= 2.0),
        Row("checkpoint change, kubelet JSON, 10 pods", ck[("json", 10)], "ms"),
        Row("checkpoint change, kubelet JSON, 10,000 pods", ck[("json", 10000)], "ms",
            floor=ck[("sqlite", 10000)], target=">= 20x SQLite@10k",
            check=lambda v, r: r is not None and r >= 20.0),
        Row("allocator dgx1-v100 packed, worst of 1-8 (CPU)",
            worst(topo, "BM_Packed_Dgx1V100", range(1, 9)), "us", target="< 50 us",
            check=lambda v, r: v < 50.0),
        Row("allocator dgx2-16 packed, worst of 1-16 (CPU)",
            worst(topo, "BM_Packed_Dgx2", range(1, 17), unit="ms"), "ms", target="< 5 ms",
            check=lambda v, r: v < 5.0),
        Row("allocator dgx2-16 best-set, worst of 1-16 (CPU)",
            worst(topo, "BM_BestSet_Dgx2", range(1, 17), unit="ms"), "ms", target="< 5 ms",
            check=lambda v, r: v < 5.0),
        Row("allocator dgx2-16 packed, worst of 1-16 (wall)",
            worst(topo, "BM_Packed_Dgx2", range(1, 17), key="real_time", unit="ms"), "ms"),
        Row("kubelet peak RSS, idle, 2 plugins", g("kubelet.rss_idle_hwm_mb"), "MB",
            target="<= 30 MB", check=lambda v, r: v <= 30.0),
        Row("kubelet peak RSS, 1,000 pods admitted", g("kubelet.rss_pods_hwm_mb"), "MB",
            target="<= 60 MB", check=lambda v, r: v <= 60.0),
        # kdm extender (docs/extender.md "Speed"): 5,000 full Node objects in
        # each of the two requests; the floor parses both bodies with simdjson.
        Row("extender filter + prioritize, 5,000 nodes, p99", x("BM_FilterPrioritize/cold:0", "p99"),
            "ms", target="<= 100 ms", check=lambda v, r: v <= 100.0),
        Row("extender filter + prioritize, 5,000 nodes, mean",
            x("BM_FilterPrioritize/cold:0", "mean"), "ms",
            floor=None if dom_mean is None else 2 * dom_mean, target="<= 2x floor",
            check=lambda v, r: r is not None and r <= 2.0),
        Row("  floor: simdjson parse of both bodies, mean", None if dom_mean is None else 2 * dom_mean,
            "ms"),
        Row("extender filter + prioritize, new extender, p99",
            x("BM_FilterPrioritize/cold:1", "p99"), "ms"),
        Row("extender filter, 5,000 nodes, p99", x("BM_Filter/cold:0", "p99"), "ms"),
        Row("extender prioritize, 5,000 nodes, p99", x("BM_Prioritize/cold:0", "p99"), "ms"),
        Row("extender 5,000 NodeNames from the cache, p99",
            x("BM_NodeNamesFromCache/pods:0/published:0", "p99"), "ms", target="<= 10 ms",
            check=lambda v, r: v <= 10.0),
        # Issue 29: 2,000 pods assumed, against the same pods already
        # published (the same answers without the assumption cache).
        Row("  ... 2,000 pods assumed, p99", x("BM_NodeNamesFromCache/pods:2000/published:0", "p99"),
            "ms", floor=x("BM_NodeNamesFromCache/pods:2000/published:1", "p99"),
            target="<= 10 ms", check=lambda v, r: v <= 10.0),
        Row("  ... the same 2,000 pods published, p99",
            x("BM_NodeNamesFromCache/pods:2000/published:1", "p99"), "ms"),
    ] + scheduling_rows(g)


def scheduling_rows(g):
    """Issue 29: the scheduling simulation at full speed, before and after the
    extender's assumption cache (scheduling_bench)."""
    out = []
    for config in ("before", "after"):
        for policy, key in (("best-set", "best_set"), ("packed", "packed")):
            for start, skey in (("empty", "empty"), ("partly busy", "busy")):
                name = "scheduling.sim_%s_%s_%s_" % (config, key, skey)
                label = "sim %s, %s, %s: " % (config, policy, start)
                after = config == "after"
                out.append(Row(label + "regret", g(name + "regret_pct"), "%",
                               target="< 1 %" if after else None,
                               check=(lambda v, r: v < 1.0) if after else None))
                out.append(Row(label + "rejections", g(name + "rejections"), "pods",
                               target="0" if after else None,
                               check=(lambda v, r: v == 0) if after else None))
    return out


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="where the benchmarks wrote their output")
    ap.add_argument("--out", required=True, help="the results JSON file to write")
    args = ap.parse_args()

    e2e = load_e2e(os.path.join(args.dir, "e2e.jsonl"))
    topo = load_gbench(os.path.join(args.dir, "topology.json"))
    ckpt = load_gbench(os.path.join(args.dir, "checkpoint.json"))
    ext = load_aggregates(os.path.join(args.dir, "extender.json"))
    table = rows(e2e, topo, ckpt, ext)

    head = ["figure", "value", "floor", "ratio", "target", "verdict"]
    cells = [r.cells() for r in table]
    widths = [max(len(c[i]) for c in cells + [head]) for i in range(len(head))]
    line = lambda c: "  ".join(c[i].ljust(widths[i]) for i in range(len(head))).rstrip()
    load_start, load_end = read(os.path.join(args.dir, "loadavg-start")), read("/proc/loadavg")
    print()
    print(line(head))
    print(line(["-" * w for w in widths]))
    for c in cells:
        print(line(c))
    print("load average (1/5/15 min) at start: %s; at end: %s; %d CPUs" % (
        " ".join(load_start.split()[:3]), " ".join(load_end.split()[:3]), os.cpu_count() or 0))

    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": git_commit(),
        "cpus": os.cpu_count(),
        "loadavg_start": load_start,
        "loadavg_end": load_end,
        "figures": [r.json() for r in table],
        "raw": {"e2e": e2e,
                "topology": {n: {"real_time": b["real_time"], "cpu_time": b["cpu_time"],
                                 "time_unit": b.get("time_unit", "ns")} for n, b in topo.items()},
                "checkpoint": {n: {"real_time": b["real_time"], "cpu_time": b["cpu_time"],
                                   "time_unit": b.get("time_unit", "ns")}
                               for n, b in ckpt.items()},
                "extender": {"%s %s" % k: {"real_time": b["real_time"],
                                           "time_unit": b.get("time_unit", "ns")}
                             for k, b in ext.items()}},
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print("written: %s" % args.out)
    missing = [r.figure for r in table if r.value is None]
    if missing:
        print("missing figures: %s" % ", ".join(m.strip() for m in missing), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
