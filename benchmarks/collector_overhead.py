#!/usr/bin/python3
"""Step-time overhead of the rankwatch collector on the PyTorch example
(collectors/python/examples/ddp_example.py: 4 ranks, DDP gloo on CPU): alternates runs with
and without the collector (--no-rankwatch) in the same session, publishing to a local
`rankwatch kafka`, and prints each run's median step time and CPU per step, the medians over
runs, and the spread of the per-pair ratios (each pair: one run with, one without, back to
back, in ABBA order so that drift in machine load cancels). CPU per step is the processes'
CPU time (every thread, the collector's included) per step: on a shared machine it is far
less noisy than wall time. benchmarks/collector_step_cost.py isolates the per-step cost.

    benchmarks/collector_overhead.py --build build --runs 8 --steps 200
    benchmarks/collector_overhead.py --build build --runs 8 --steps 200 \
        --job-args="--device-ms 12 --width 64 --input-ms 6"

The example's defaults make 4 CPU-bound ranks on this 2-core machine: every microsecond of
CPU the collector (or the local broker) takes becomes step time. --job-args passes options to
the example; the second line is the tests' GPU-like job (device time simulated with sleeps),
under one core, as training with one accelerator per rank is.
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
    p.add_argument("--runs", type=int, default=8, help="pairs of runs (with, without)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--world", type=int, default=4, help="ranks (processes) of the job")
    p.add_argument("--job-args", default="", help="options for the example, e.g. \"--device-ms 12\"")
    args = p.parse_args()
    os.environ.setdefault("RANKWATCH_PYTHON_DIR", os.path.join(args.build, "python"))
    import torch_job  # noqa: E402 (needs RANKWATCH_PYTHON_DIR)
    torch_job.PYTHON_DIR = os.environ["RANKWATCH_PYTHON_DIR"]

    workdir = tempfile.mkdtemp(prefix="rankwatch-overhead-")
    broker = subprocess.Popen([os.path.join(args.build, "daemon", "rankwatch"), "kafka"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    brokers = broker.stdout.readline().strip()
    medians = {"with": [], "without": []}
    cpus = {"with": [], "without": []}
    try:
        for i in range(args.runs):
            for mode in ("without", "with") if i % 2 == 0 else ("with", "without"):
                extra = args.job_args.split() + (["--no-rankwatch"] if mode == "without" else [])
                ranks = torch_job.TorchJob(workdir, "overhead-%d-%s" % (i, mode), brokers, args.steps,
                                           *extra, world=args.world).wait(timeout=args.steps * 2 + 120)
                # Per run: the median over ranks of each rank's median step (after 10 warm-up).
                m = statistics.median(statistics.median(r["step_seconds"][10:]) for r in ranks)
                cpu = statistics.mean(r["cpu_s_per_step"] for r in ranks)
                medians[mode].append(m)
                cpus[mode].append(cpu)
                print("run %d %-7s median step %.2f ms, CPU %.2f ms/step per rank" % (i, mode, m * 1e3, cpu * 1e3),
                      flush=True)
    finally:
        broker.terminate()
        broker.wait()

    def summary(values):
        w, wo = statistics.median(values["with"]), statistics.median(values["without"])
        pairs = sorted(a / b - 1 for a, b in zip(values["with"], values["without"]))
        return {"with_ms": round(w * 1e3, 3), "without_ms": round(wo * 1e3, 3),
                "overhead_ratio": round(w / wo - 1, 4),
                "pair_ratios_median": round(statistics.median(pairs), 4),
                "pair_ratios_min_max": [round(pairs[0], 4), round(pairs[-1], 4)]}

    print(json.dumps({"runs": args.runs, "steps": args.steps, "world": args.world, "job_args": args.job_args,
                      "step_time": summary(medians),
                      "cpu_per_step": summary(cpus)}))


if __name__ == "__main__":
    main()
