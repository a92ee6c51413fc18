#!/usr/bin/python3
"""What rw.instrument_pipeline costs a step (issue #49), on the real job of the tests.

The 4-process torch.distributed.pipelining job (tests/collectors/pipelining_job.py: 2 pipeline
ranks x 2 replicas, gloo on CPU, ScheduleInterleaved1F1B with 2 stages a rank, 4 microbatches,
the device time of its layers as sleeps) recorded by the adapter alone against `rankwatch
kafka`, its steps in blocks of --block, alternately recorded and paused (rw.pause(): the
adapter's wrappers, the optimizer's and the GC callback come off and no step opens: the job runs
as without rankwatch), in one run. The first two blocks and the first step of every block are
left out.

Per rank: the median step time recorded and paused, the training thread's CPU time a step
recorded and paused (time.thread_time: what the wrappers, op scopes and step records cost the
thread the schedule runs on), and the ops of a recorded step (ops_recorded / recorded steps).
Prints each rank, then over the ranks (medians): the CPU the adapter adds a step, per op, and as
a share of the paused step; and the step time recorded / paused.

    RANKWATCH_PYTHON_DIR=build/python .venv/bin/python benchmarks/pipeline_adapter_cost.py --build build [--runs 2 --steps 400 --block 20]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "collectors"))


def split(values, paused, block):
    """(recorded, paused) values, without the first two blocks and each block's first step."""
    rec, pau = [], []
    for i, (v, p) in enumerate(zip(values, paused)):
        if i < 2 * block or i % block == 0:
            continue
        (pau if p else rec).append(v)
    return rec, pau


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--block", type=int, default=20)
    p.add_argument("--schedule", default="interleaved")
    p.add_argument("--device-ms", default="2", help="the job's device time per layer (the figures: 2)")
    args = p.parse_args()
    os.environ.setdefault("RANKWATCH_PYTHON_DIR", os.path.join(args.build, "python"))
    import torch_job
    torch_job.PYTHON_DIR = os.environ["RANKWATCH_PYTHON_DIR"]
    script = os.path.join(ROOT, "tests", "collectors", "pipelining_job.py")
    workdir = tempfile.mkdtemp(prefix="rankwatch-pipeline-adapter-")
    broker = subprocess.Popen([os.path.join(args.build, "bin", "rankwatch"), "kafka"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    brokers = broker.stdout.readline().strip()
    added, per_op, share, ratio = [], [], [], []
    try:
        for run in range(args.runs):
            ranks = torch_job.TorchJob(workdir, "adapter-cost-%d" % run, brokers, args.steps,
                                       "--case", "%s:balanced:adapter" % args.schedule,
                                       "--pause-every", str(args.block), "--flush-ms", "1000",
                                       "--device-ms", args.device_ms,
                                       script=script).wait(timeout=args.steps + 300)
            for r in ranks:
                c = r["cases"][0]
                wall_rec, wall_pau = split(c["step_seconds"], c["paused"], args.block)
                cpu_rec, cpu_pau = split(c["cpu_seconds"], c["paused"], args.block)
                recorded = sum(1 for v in c["paused"] if not v)
                ops = c["collector"]["ops_recorded"] / recorded
                step_rec, step_pau = statistics.median(wall_rec), statistics.median(wall_pau)
                cpu = statistics.median(cpu_rec) - statistics.median(cpu_pau)
                added.append(cpu)
                per_op.append(cpu / ops)
                share.append(cpu / step_pau)
                ratio.append(step_rec / step_pau)
                print("run %d rank %d: step %.2f ms recorded / %.2f ms paused (%+.2f %%); thread CPU %.3f / %.3f ms "
                      "a step: %+.1f us for %.1f ops = %+.2f us an op, %+.3f %% of the step" % (
                          run, r["rank"], step_rec * 1e3, step_pau * 1e3, (step_rec / step_pau - 1) * 100,
                          statistics.median(cpu_rec) * 1e3, statistics.median(cpu_pau) * 1e3, cpu * 1e6, ops,
                          cpu / ops * 1e6, cpu / step_pau * 100), flush=True)
    finally:
        broker.terminate()
        broker.wait()
    print("over %d rank-runs (medians): the adapter adds %.1f us of CPU a step, %.2f us an op, %.3f %% of the "
          "step; step time recorded / paused %+.2f %% (rank-runs %+.2f ... %+.2f %%)" % (
              len(added), statistics.median(added) * 1e6, statistics.median(per_op) * 1e6,
              statistics.median(share) * 100, (statistics.median(ratio) - 1) * 100, (min(ratio) - 1) * 100,
              (max(ratio) - 1) * 100))


if __name__ == "__main__":
    main()
