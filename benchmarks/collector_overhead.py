#!/usr/bin/python3
"""Step-time overhead of the rankwatch collector on the PyTorch example
(collectors/python/examples/ddp_example.py: 4 ranks, DDP gloo on CPU): alternates runs with
and without the collector (--no-rankwatch) in the same session, publishing to a local
`rankwatch kafka`, and prints each run's median step time and the median over runs.

    benchmarks/collector_overhead.py --build build --runs 5 --steps 200
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "collectors"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    os.environ.setdefault("RANKWATCH_PYTHON_DIR", os.path.join(args.build, "python"))
    import torch_job  # noqa: E402 (needs RANKWATCH_PYTHON_DIR)
    torch_job.PYTHON_DIR = os.environ["RANKWATCH_PYTHON_DIR"]

    workdir = tempfile.mkdtemp(prefix="rankwatch-overhead-")
    broker = subprocess.Popen([os.path.join(args.build, "daemon", "rankwatch"), "kafka"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    brokers = broker.stdout.readline().strip()
    medians = {"with": [], "without": []}
    try:
        for i in range(args.runs):
            for mode in ("without", "with") if i % 2 == 0 else ("with", "without"):
                extra = ["--no-rankwatch"] if mode == "without" else []
                ranks = torch_job.TorchJob(workdir, "overhead-%d-%s" % (i, mode), brokers, args.steps,
                                           *extra).wait(timeout=args.steps * 2 + 120)
                # Per run: the median over ranks of each rank's median step (after 10 warm-up).
                m = statistics.median(statistics.median(r["step_seconds"][10:]) for r in ranks)
                medians[mode].append(m)
                print("run %d %-7s median step %.2f ms" % (i, mode, m * 1e3), flush=True)
    finally:
        broker.terminate()
        broker.wait()
    w, wo = statistics.median(medians["with"]), statistics.median(medians["without"])
    print(json.dumps({"runs": args.runs, "steps": args.steps, "median_step_ms_with": round(w * 1e3, 3),
                      "median_step_ms_without": round(wo * 1e3, 3), "overhead_ratio": round(w / wo - 1, 4)}))


if __name__ == "__main__":
    main()
