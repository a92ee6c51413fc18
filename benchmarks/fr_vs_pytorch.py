#!/usr/bin/python3
"""rankwatch's Flight Recorder analysis against PyTorch's own (torch.distributed.flight_recorder,
shipped with torch 2.13), on the same real dumps, interleaved in one run (issue #46).

    benchmarks/fr_vs_pytorch.py [--runs 9] [--python PY] [FOLDER...]

FOLDER: folders of dumps named fr_trace_rank_<rank> (default: the three real hung gloo jobs of
tests/fixtures/flight-recorder/gloo-torch2.13: missing, size, p2p). PY: an interpreter with
torch (default: the project's .venv, else this one).

Two comparisons, each side alternating, --runs runs each, medians and their ratio:

* process to process: `rankwatch flight-recorder --json FOLDER` against `PY -m
  torch.distributed.flight_recorder.fr_trace FOLDER -p fr_trace_rank_`, from start to exit
  (PyTorch's includes starting the interpreter and importing torch: what a user waits for);
* the analysis alone: build/benchmarks/fr_analysis_benchmark's median (find, read and analyse
  the dumps, in process) against PyTorch's `read_dir` + `build_db` timed inside one process
  after torch is imported.

torch 2.13 writes no usable pg_config for gloo groups, and PyTorch's analyzer stops with a
KeyError on those dumps as written; it is timed (and its verdict shown) on a copy with the job's
groups filled in (tests/collectors/fr_compare.py with_pg_config), rankwatch on the dumps as
written. The verdicts of both are printed side by side."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "collectors"))
import fr_compare  # noqa: E402

BENCH = os.path.join(ROOT, "build", "benchmarks", "fr_analysis_benchmark")
FIXTURES = os.path.join(os.path.normpath(ROOT), "tests", "fixtures", "flight-recorder", "gloo-torch2.13")
VENV_PYTHON = os.path.join(ROOT, ".venv", "bin", "python")

# PyTorch's analysis in one process: import once, then time read_dir + build_db per run.
INNER = r"""
import io, contextlib, json, sys, time, logging
from torch.distributed.flight_recorder.components.builder import build_db
from torch.distributed.flight_recorder.components.config_manager import JobConfig
from torch.distributed.flight_recorder.components.loader import read_dir
logging.disable(logging.CRITICAL)
folder, prefix, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
times = []
for _ in range(runs):
    args = JobConfig().parse_args([folder, "-p", prefix])
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        details, version = read_dir(args)
        build_db(details, args, version)
    times.append(time.perf_counter() - t0)
print(json.dumps(times))
"""


def timed(cmd):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0, r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="*")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--python", default=VENV_PYTHON if os.path.exists(VENV_PYTHON) else sys.executable)
    ap.add_argument("--bench", default=BENCH)
    args = ap.parse_args()
    folders = args.folders or [os.path.join(FIXTURES, c) for c in ("missing", "size", "p2p")]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for folder in folders:
            name = os.path.basename(os.path.normpath(folder))
            named = fr_compare.with_pg_config(folder, os.path.join(work, name))
            rw_v = fr_compare.rankwatch_verdict(folder)
            pt_raw = fr_compare.pytorch_verdict(folder, python=args.python)
            pt_v = fr_compare.pytorch_verdict(named, python=args.python)
            rw_t, pt_t = [], []
            for _ in range(args.runs):
                t, r = timed(fr_compare.rankwatch_cmd(folder))
                assert r.returncode == 0, r.stderr
                rw_t.append(t)
                t, r = timed(fr_compare.pytorch_cmd(named, python=args.python))
                assert r.returncode == 0, r.stderr
                pt_t.append(t)
            # The analysis alone, each side in its own process.
            r = subprocess.run([args.bench, "--repeat", str(args.runs), folder], capture_output=True, text=True)
            m = re.search(r"median of \d+: .*total ([0-9.]+) ms", r.stdout)
            rw_a = float(m.group(1)) / 1000.0 if m else float("nan")
            r = subprocess.run([args.python, "-c", INNER, named, fr_compare.PREFIX, str(args.runs)],
                               capture_output=True, text=True)
            pt_a = statistics.median(json.loads(r.stdout.strip().splitlines()[-1])) if r.returncode == 0 else float("nan")
            rows.append((name, statistics.median(rw_t), statistics.median(pt_t), rw_a, pt_a))
            print("== %s (%s)" % (name, folder))
            print("  rankwatch flight-recorder      : %s" % fr_compare.describe_rankwatch(rw_v))
            print("  fr_trace, dumps as written     : %s" % fr_compare.describe_pytorch(pt_raw))
            print("  fr_trace, pg_config filled in  : %s" % fr_compare.describe_pytorch(pt_v))
            print("  process to process (median of %d): rankwatch %.1f ms, fr_trace %.1f ms: %.0f x"
                  % (args.runs, 1e3 * rows[-1][1], 1e3 * rows[-1][2], rows[-1][2] / rows[-1][1]))
            print("  analysis alone (median of %d):     rankwatch %.2f ms, PyTorch %.2f ms: %.1f x"
                  % (args.runs, 1e3 * rw_a, 1e3 * pt_a, pt_a / rw_a))
    print("\n| set | rankwatch (process) | fr_trace (process) | ratio | rankwatch (analysis) | PyTorch (analysis) | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, a, b, c, d in rows:
        print("| %s | %.1f ms | %.0f ms | %.0f x | %.2f ms | %.2f ms | %.1f x |" % (name, 1e3 * a, 1e3 * b, b / a, 1e3 * c, 1e3 * d, d / c))


if __name__ == "__main__":
    main()
