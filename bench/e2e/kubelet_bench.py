#!/usr/bin/env python3
"""kubelet_bench: admission throughput and memory of the real `kdm kubelet`.

  1. `kdm kubelet --root T` and two `kdm plugin` processes: example.com/dev
     with --count 1000 (one device per pod below) and nvidia.com/gpu with
     --preset dgx1-v100;
  2. memory idle: the kubelet's peak RSS (VmHWM in /proc/<pid>/status) once
     both plugins are registered and node.json shows them (target 30 MB);
  3. throughput: 1,000 pod manifests of one example.com/dev device each are
     written into T/manifests (each written beside under a hidden name and
     renamed in, as editors do); the clock runs from the first write to the
     moment all 1,000 status files exist, and every one of them must say
     "Admitted"; pods per second = 1,000 / that time;
  4. memory with 1,000 admitted pods: VmHWM again (target 60 MB).

T is a fresh directory under $KDM_BENCH_DIR (default /tmp), which should be
a real disk (the checkpoint and every status file are fsync'ed).
Output: one JSON line per figure on stdout, appended to --json PATH too.
Exit 1 (with the reason) if anything misbehaves.

  bench/e2e/kubelet_bench.py --kdm build-release/bin/kdm [--pods 1000] [--json out.jsonl]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

DEV = "example.com/dev"
GPU = "nvidia.com/gpu"
MANIFEST = """apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  containers:
  - name: main
    resources: {{limits: {{{dev}: 1}}}}
"""


class Failure(Exception):
    pass


def wait_for(what, bound_s, pred, step_s=0.02):
    end = time.monotonic() + bound_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= end:
            raise Failure("timed out after %ss waiting for %s" % (bound_s, what))
        time.sleep(step_s)


def proc_status_kb(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise Failure("no %s in /proc/%d/status" % (field, pid))


def node_allocatable(root):
    try:
        with open(os.path.join(root, "status", "node.json")) as f:
            return json.load(f).get("allocatable", {})
    except (OSError, ValueError):
        return {}


def run(args):
    base = os.environ.get("KDM_BENCH_DIR") or "/tmp"
    root = tempfile.mkdtemp(prefix="kdm-kb-", dir=base)
    procs = []

    def spawn(name, argv):
        log = open(os.path.join(root, name + ".log"), "ab")
        p = subprocess.Popen([args.kdm] + argv, stdout=log, stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    figures = []
    try:
        kubelet = spawn("kubelet", ["kubelet", "--root", root])
        wait_for("node.json", 30, lambda: os.path.exists(os.path.join(root, "status", "node.json")))
        spawn("dev-plugin", ["plugin", "--root", root, "--resource", DEV,
                             "--count", str(args.pods)])
        spawn("gpu-plugin", ["plugin", "--root", root, "--resource", GPU,
                             "--preset", "dgx1-v100"])
        wait_for("both plugins in node.json", 30,
                 lambda: node_allocatable(root).get(DEV) == args.pods
                 and node_allocatable(root).get(GPU) == 8)
        time.sleep(args.settle)  # idle: let start-up work finish
        for p in procs:
            if p.poll() is not None:
                raise Failure("%s exited early with %s" % (p.args, p.returncode))
        idle_hwm = proc_status_kb(kubelet.pid, "VmHWM")
        idle_rss = proc_status_kb(kubelet.pid, "VmRSS")

        manifests = os.path.join(root, "manifests")
        status = os.path.join(root, "status")
        names = ["p-%d" % i for i in range(args.pods)]
        wanted = set("default_%s.json" % n for n in names)
        t0 = time.monotonic()
        for n in names:
            tmp = os.path.join(manifests, ".%s.yaml.tmp" % n)
            with open(tmp, "w") as f:
                f.write(MANIFEST.format(name=n, dev=DEV))
            os.rename(tmp, os.path.join(manifests, n + ".yaml"))
        written_s = time.monotonic() - t0

        def all_status_files():
            if kubelet.poll() is not None:
                raise Failure("kdm kubelet exited with %s" % kubelet.returncode)
            return wanted.issubset(os.listdir(status))

        wait_for("%d status files" % args.pods, args.timeout, all_status_files, 0.01)
        elapsed = time.monotonic() - t0
        phases = {}
        for n in wanted:
            with open(os.path.join(status, n)) as f:
                phase = json.load(f).get("phase")
            phases[phase] = phases.get(phase, 0) + 1
        if phases.get("Admitted", 0) != args.pods:
            raise Failure("not every pod was admitted: %s" % phases)
        busy_hwm = proc_status_kb(kubelet.pid, "VmHWM")
        busy_rss = proc_status_kb(kubelet.pid, "VmRSS")

        figures = [
            ("pods", args.pods, "count"),
            ("admit_wall_s", elapsed, "s"),
            ("manifests_written_s", written_s, "s"),
            ("admit_pods_per_s", args.pods / elapsed, "pods/s"),
            ("rss_idle_hwm_mb", idle_hwm / 1024.0, "MB"),
            ("rss_idle_now_mb", idle_rss / 1024.0, "MB"),
            ("rss_pods_hwm_mb", busy_hwm / 1024.0, "MB"),
            ("rss_pods_now_mb", busy_rss / 1024.0, "MB"),
        ]
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if args.keep:
            print("kept %s" % root, file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)

    lines = [json.dumps({"bench": "kubelet", "name": n, "value": v, "unit": u})
             for n, v, u in figures]
    print("\n".join(lines))
    if args.json:
        with open(args.json, "a") as f:
            f.write("\n".join(lines) + "\n")
    v = dict((n, val) for n, val, _ in figures)
    print("kubelet_bench: %d pods admitted in %.2f s (%.0f pods/s); kubelet peak RSS "
          "idle %.1f MB, with the pods %.1f MB" % (args.pods, v["admit_wall_s"],
          v["admit_pods_per_s"], v["rss_idle_hwm_mb"], v["rss_pods_hwm_mb"]),
          file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kdm", required=True, help="the kdm binary")
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--json", help="append the figures to this file")
    ap.add_argument("--timeout", type=float, default=300, help="bound on the admission, s")
    ap.add_argument("--settle", type=float, default=1.0, help="idle time before measuring, s")
    ap.add_argument("--keep", action="store_true", help="keep the directory")
    args = ap.parse_args()
    if args.pods < 1 or args.pods > 1024:
        ap.error("--pods: 1..1024 (kdm plugin --count's limit)")
    if not os.access(args.kdm, os.X_OK):
        ap.error("--kdm: %s is not an executable" % args.kdm)
    try:
        run(args)
    except Failure as e:
        print("kubelet_bench: FAILED: %s" % e, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
