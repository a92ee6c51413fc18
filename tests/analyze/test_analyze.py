"""`rankwatch analyze` on the Kineto fixtures.

Acceptance 1 of issue #6: `--compat hta` on hta-trace-filter-2rank reproduces every file of
expected-hta/ (HTA's own outputs) at HTA's rounding; queue-length mean/std within the tie
bounds. The other fixtures are checked against an independent reimplementation of the spec's
temporal breakdown and against invariants that hold by definition.
"""
import csv
import gzip
import json
import math
import os
import subprocess
import tempfile
import unittest

BIN = os.environ.get("RANKWATCH_BIN", "../../build/bin/rankwatch")
FIX = os.path.join(os.environ.get("RANKWATCH_FIXTURES", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")), "kineto")
TWO_RANK = os.path.join(FIX, "hta-trace-filter-2rank")
EXPECTED = os.path.join(TWO_RANK, "expected-hta")


def run_csv(path, *flags):
    out = tempfile.mkdtemp(prefix="rw-analyze-")
    subprocess.run([BIN, "analyze", "--quiet", "--format", "csv", "--out", out, *flags, path],
                   check=True, capture_output=True, text=True)
    return out


def read(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def same_value(a, b, rel=1e-9):
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return math.isclose(x, y, rel_tol=rel, abs_tol=1e-9)


class HtaCompat(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.out = run_csv(TWO_RANK, "--compat", "hta", "--straggler-candidates", "1")

    def compare(self, name, skip_columns=()):
        want = read(os.path.join(EXPECTED, name))
        got = read(os.path.join(self.out, name))
        self.assertEqual(got[0], want[0], f"{name}: header")
        self.assertEqual(len(got), len(want), f"{name}: rows")
        for i, (g, w) in enumerate(zip(got[1:], want[1:]), start=2):
            self.assertEqual(len(g), len(w), f"{name}:{i}")
            for col, (x, y) in enumerate(zip(g, w)):
                if want[0][col] in skip_columns:
                    continue
                self.assertTrue(same_value(x, y), f"{name}:{i} {want[0][col]}: got {x!r}, HTA {y!r}")

    def test_every_expected_file_is_reproduced(self):
        files = [f for f in os.listdir(EXPECTED)
                 if f.endswith(".csv") and f not in ("queue_length_summary_tie_bounds.csv",
                                                     "queue_length_summary.csv")]
        self.assertEqual(len(files), 13)
        for name in sorted(files):
            with self.subTest(file=name):
                self.compare(name)

    def test_queue_length_within_tie_bounds(self):
        self.compare("queue_length_summary.csv", skip_columns=("queue_length_mean", "queue_length_std"))
        bounds = {}
        for row in read(os.path.join(EXPECTED, "queue_length_summary_tie_bounds.csv"))[1:]:
            bounds[(row[0], row[1], row[2])] = (float(row[5]), float(row[6]))
        got = read(os.path.join(self.out, "queue_length_summary.csv"))
        for row in got[1:]:
            for stat, value in (("mean", row[3]), ("std", row[4])):
                lo, hi = bounds[(row[0], row[1], stat)]
                v = float(value)
                self.assertTrue(lo - 1e-9 * abs(lo) <= v <= hi + 1e-9 * abs(hi),
                                f"rank {row[0]} stream {row[1]} {stat} {v} not in [{lo}, {hi}]")


def hta_temporal(path):
    """The spec's temporal breakdown (sections 1 and 4), written independently in Python."""
    with gzip.open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    is_float = any(isinstance(e.get("ts"), float) or "ts" not in e for e in events)
    rows = []
    for i, e in enumerate(events):
        if "dur" not in e or "cat" not in e or e["cat"] == "Trace":
            continue
        ts, dur = e["ts"], e["dur"]
        if is_float:
            end = ts + dur
            ts, dur = math.ceil(ts), math.floor(end) - math.ceil(ts)
        a = e.get("args", {})
        stream = a.get("stream", -1)
        stream = stream if isinstance(stream, int) else -1
        rows.append(dict(ts=ts, dur=dur, stream=stream, corr=a.get("correlation", -1), name=e["name"]))
    gpu_filter = lambda r: (r["stream"] >= 0 and r["corr"] >= 0) or r["name"] in ("Event Sync", "Context Sync")
    steps = {r["name"] for r in rows if r["name"].startswith("ProfilerStep#")}
    cpu = [r for r in rows if not gpu_filter(r)]
    if len(steps) >= 2:
        last = max(r["ts"] for r in cpu if r["name"] in steps)
        kept_cpu = [r for r in cpu if r["ts"] < last]
        count = {}
        for r in kept_cpu:
            count[r["corr"]] = count.get(r["corr"], 0) + 1
        gpu = [r for r in rows if gpu_filter(r) for _ in range(count.get(r["corr"], 0))]
        kept = gpu + kept_cpu
    else:
        kept = rows
    g = [r for r in kept if r["stream"] != -1]

    def union(items):
        items = sorted(((r["ts"], r["ts"] + r["dur"]) for r in items))
        groups = []
        for ts, end in items:
            if not groups or ts > groups[-1][2]:
                groups.append([ts, end, end])
            else:
                groups[-1][1] = max(groups[-1][1], end)
                groups[-1][2] = max(groups[-1][2], end)
        return groups

    def is_compute(n):
        import re
        if re.match(r"(^nccl.*)|(^hip)|(^hccl)|(.*ncclKernel.*)", n) or re.match(r"(^(hip)?Memcpy)|(^(hip)?Memset)|(^dma)", n):
            return False
        return not re.match(r"(^nccl)|(.*Memcpy)|(.*Memset)|(.*dma)|(^.*Sync)|(^Stream Wait Event)|(cuda.*LaunchKernel)|(^runFunction)|(^hip)|(^job_exe)|(^packet)|(^pe_exe)|(^cpum_exe_subgraph)|(^hccl)|(^collective_subgraph_execution)", n)

    u = union(g)
    kernel = u[-1][1] - u[0][0]
    busy = sum(e - t for t, e, _ in u)
    compute = sum(e - t for t, e, _ in union([r for r in g if is_compute(r["name"])]))
    return kernel - busy, compute, kernel


class OtherFixtures(unittest.TestCase):
    def check(self, fixture):
        path = os.path.join(FIX, fixture)
        trace_file = os.path.join(path, os.listdir(path)[0])
        out = run_csv(path, "--compat", "hta")
        row = read(os.path.join(out, "temporal_breakdown.csv"))[1]
        idle, compute, non_compute, kernel = (float(x) for x in row[1:5])
        want_idle, want_compute, want_kernel = hta_temporal(trace_file)
        self.assertAlmostEqual(idle, want_idle, places=6)
        self.assertAlmostEqual(compute, want_compute, places=6)
        self.assertAlmostEqual(kernel, want_kernel, places=6)
        self.assertAlmostEqual(idle + compute + non_compute, kernel, places=6)
        self.assertAlmostEqual(sum(float(x) for x in row[5:8]), 100.0, delta=0.02)
        for r in read(os.path.join(out, "idle_time_breakdown.csv"))[1:]:
            if r[4]:
                self.assertTrue(-1e-9 <= float(r[4]) <= 1.0 + 1e-9, r)
        overlap = read(os.path.join(out, "comm_comp_overlap.csv"))[1][1]
        self.assertTrue(0.0 <= float(overlap) <= 100.0)
        summary = read(os.path.join(out, "cuda_kernel_launch_stats_summary.csv"))[1]
        launches = read(os.path.join(out, "cuda_kernel_launch_stats.csv"))[1:]
        self.assertEqual(int(summary[1]), len(launches))
        self.assertEqual(int(summary[4]), sum(1 for r in launches if float(r[4]) > 100))
        for r in read(os.path.join(out, "queue_length_summary.csv"))[1:]:
            self.assertGreaterEqual(float(r[5]), 0.0, f"negative queue length: {r}")
        # Corrected mode and the other formats run too.
        for fmt in ("text", "json"):
            done = subprocess.run([BIN, "analyze", "--quiet", "--format", fmt, path],
                                  capture_output=True, text=True)
            self.assertEqual(done.returncode, 0, done.stderr)
        return out

    def test_negative_queue_rank0(self):
        out = self.check("hta-negative-queue-rank0")
        self.assertEqual(read(os.path.join(out, "profiler_steps.csv"))[1:], [["550"], ["551"], ["552"], ["553"]])

    def test_nccl_ddp_rank0_fractional_timestamps(self):
        out = self.check("hta-nccl-ddp-rank0")
        rows = read(os.path.join(out, "filtered_gpu_events.csv"))[1:]
        self.assertTrue(all(float(r[3]) == int(float(r[3])) for r in rows), "ns-rounding leaves whole µs")
        self.assertTrue(any(r[10] == "COMMUNICATION" and "ncclKernel_AllReduce" in r[9] for r in rows))

    def test_bad_file_names_file_and_reason(self):
        bad = os.path.join(tempfile.mkdtemp(), "broken.json")
        with open(bad, "w") as f:
            f.write('{"traceEvents": [{"ph": "X",')
        done = subprocess.run([BIN, "analyze", bad], capture_output=True, text=True)
        self.assertEqual(done.returncode, 1)
        self.assertIn(bad, done.stderr)


if __name__ == "__main__":
    unittest.main()
