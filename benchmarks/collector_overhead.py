#!/usr/bin/python3
"""Step-time overhead of the rankwatch collector on the PyTorch example
(collectors/python/examples/ddp_example.py: 4 ranks, DDP gloo on CPU): alternates runs with
and without the collector (--no-rankwatch) in the same session, publishing to a local
`rankwatch kafka`, and prints each run's median step time and CPU per step, the medians over
runs, and the spread of the per-pair ratios (each pair: one run with, one without, back to
back, in ABBA order so that drift in machine load cancels). CPU per step is the processes'
CPU time (every thread, the collector's included) per step: on a shared machine it is far
less noisy than wall time. benchmarks/collector_step_cost.py isolates the per-step cost.

--interleave instead compares within each run: the example pauses the collector for a random
half of its steps (--pause-random SEED, the same steps on every rank; rw.pause() takes every
hook off, so a paused step runs the uninstrumented loop). Each run's figure is its median
recorded step over its median paused step (a step's time: the median over ranks; 10 warm-up
steps left out); the headline is the median of the runs' figures (run_ratios_median). Also
printed: the same pooled over every run's steps, with a 95 % bootstrap interval (blocks of 20
consecutive steps resampled, as slow steps come in bursts), and with means. The same
processes, placement on the cores and machine load then serve both sides, and the random
choice keeps bursts of slow steps and the epoch's period from favouring either; separate runs
differ by a few per cent on this 2-core machine. The collector's threads stay up while it is
paused (they use ~0 CPU with nothing to send).

--steady-malloc runs the job with glibc's malloc thresholds fixed (tests/collectors/torch_job.py):
without, bursts of page faults make the example's steps 35 ms instead of 24 and spread
separate runs by -6 ... +11 %; with, by -2 ... +3 %.

    benchmarks/collector_overhead.py --build build --runs 8 --steps 200
    benchmarks/collector_overhead.py --build build --runs 12 --steps 1000 --interleave
    benchmarks/collector_overhead.py --build build --runs 12 --steps 1000 --interleave --steady-malloc
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "collectors"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--runs", type=int, default=8, help="pairs of runs (with, without)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--world", type=int, default=4, help="ranks (processes) of the job")
    p.add_argument("--job-args", default="", help="options for the example, e.g. \"--device-ms 12\"")
    p.add_argument("--steady-malloc", action="store_true",
                   help="run the job with glibc's malloc thresholds fixed (tests/collectors/torch_job.py)")
    p.add_argument("--interleave", action="store_true",
                   help="compare within each run: a random half of the steps with the collector paused")
    args = p.parse_args()
    os.environ.setdefault("RANKWATCH_PYTHON_DIR", os.path.join(args.build, "python"))
    import torch_job  # noqa: E402 (needs RANKWATCH_PYTHON_DIR)
    torch_job.PYTHON_DIR = os.environ["RANKWATCH_PYTHON_DIR"]

    workdir = tempfile.mkdtemp(prefix="rankwatch-overhead-")
    broker = subprocess.Popen([os.path.join(args.build, "bin", "rankwatch"), "kafka"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    brokers = broker.stdout.readline().strip()
    medians = {"with": [], "without": []}
    cpus = {"with": [], "without": []}
    thread_us = []
    try:
        if args.interleave:
            return interleaved(args, workdir, brokers)
        for i in range(args.runs):
            for mode in ("without", "with") if i % 2 == 0 else ("with", "without"):
                extra = args.job_args.split() + (["--no-rankwatch"] if mode == "without" else [])
                ranks = torch_job.TorchJob(workdir, "overhead-%d-%s" % (i, mode), brokers, args.steps,
                                           *extra, world=args.world,
                                           steady_malloc=args.steady_malloc).wait(timeout=args.steps * 2 + 120)
                # Per run: the median over ranks of each rank's median step (after 10 warm-up).
                m = statistics.median(statistics.median(r["step_seconds"][10:]) for r in ranks)
                cpu = statistics.mean(r["cpu_s_per_step"] for r in ranks)
                medians[mode].append(m)
                cpus[mode].append(cpu)
                threads = threads_us_per_step(ranks)
                if threads is not None:
                    thread_us.append(threads)
                print("run %d %-7s median step %.2f ms, CPU %.2f ms/step per rank%s" % (
                    i, mode, m * 1e3, cpu * 1e3,
                    "" if threads is None else ", collector threads %.1f us/step per rank" % threads), flush=True)
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
                      "cpu_per_step": summary(cpus),
                      "collector_threads_us_per_step": round(statistics.median(thread_us), 1) if thread_us else None}))


def threads_us_per_step(ranks):
    """CPU of the collector's own threads (sender, librdkafka) per step and rank, µs; None
    without the collector. /proc counts in 10-ms ticks: a run of a few seconds reads 0."""
    cpu = [r["collector"]["threads_cpu_s"] / r["steps"] for r in ranks if "threads_cpu_s" in r["collector"]]
    return statistics.mean(cpu) * 1e6 if cpu else None


BLOCK = 20  # consecutive steps resampled together: slow steps come in bursts of about 10


def pooled_ratio(blocks, stat):
    """stat(recorded steps) / stat(paused steps) - 1 over every (seconds, recorded) of `blocks`."""
    w = [s for b in blocks for s, rec in b if rec]
    wo = [s for b in blocks for s, rec in b if not rec]
    return stat(w) / stat(wo) - 1


def interleaved(args, workdir, brokers):
    import random
    import torch_job  # noqa: E402 (main() set it up)
    ratios, blocks, thread_us = [], [], []
    for i in range(args.runs):
        ranks = torch_job.TorchJob(workdir, "interleaved-%d" % i, brokers, args.steps, *args.job_args.split(),
                                   "--pause-random", str(i), world=args.world,
                                   steady_malloc=args.steady_malloc).wait(timeout=args.steps * 2 + 120)
        # A step's time: the median over ranks (they synchronise every step); 10 warm-up steps.
        steps = [(statistics.median(r["step_seconds"][k] for r in ranks), ranks[0]["recorded"][k])
                 for k in range(10, args.steps)]
        blocks += [steps[b:b + BLOCK] for b in range(0, len(steps), BLOCK)]
        ratios.append(pooled_ratio([steps], statistics.median))
        threads = threads_us_per_step(ranks)
        if threads is not None:
            thread_us.append(threads)
        print("run %d: median step %+.2f %% with the collector (means %+.2f %%), %d of %d steps recorded%s" % (
            i, ratios[-1] * 100, pooled_ratio([steps], statistics.mean) * 100, sum(r for _, r in steps),
            len(steps), "" if threads is None else ", collector threads %.1f us/step per rank" % threads),
            flush=True)
    ratios.sort()
    # 95 % interval of the pooled ratio: a bootstrap over blocks of consecutive steps.
    rng = random.Random(0)
    resampled = sorted(pooled_ratio(rng.choices(blocks, k=len(blocks)), statistics.median) for _ in range(1000))
    w = [s for b in blocks for s, rec in b if rec]
    wo = [s for b in blocks for s, rec in b if not rec]
    print(json.dumps({"runs": args.runs, "steps": args.steps, "world": args.world, "job_args": args.job_args,
                      "interleave": True,
                      "with_ms": round(statistics.median(w) * 1e3, 3),
                      "paused_ms": round(statistics.median(wo) * 1e3, 3),
                      "pooled_median_ratio": round(pooled_ratio(blocks, statistics.median), 4),
                      "pooled_median_ratio_95": [round(resampled[25], 4), round(resampled[974], 4)],
                      "pooled_mean_ratio": round(pooled_ratio(blocks, statistics.mean), 4),
                      "run_ratios_median": round(statistics.median(ratios), 4),
                      "run_ratios_min_max": [round(ratios[0], 4), round(ratios[-1], 4)],
                      # Not in the ratios above: paused steps too are sent while the threads
                      # ship the recorded ones (per step and rank, every step of the run).
                      "collector_threads_us_per_step": round(statistics.median(thread_us), 1) if thread_us else None}))


if __name__ == "__main__":
    main()
