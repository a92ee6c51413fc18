#!/usr/bin/python3
"""What the device clock costs a step (issue #48), measured two ways.

1. In one process, interleaved: two collectors on one emulated asynchronous device
(tests/collectors/emulated_device.py), one with device timing and one without, step in blocks
of 50 in alternating order (ABBA); each step times forward, backward and optimizer phases and
an op in each (the marks, the read-back, set_device_times) and synchronises. The training
thread's CPU time per step (time.thread_time: the device's threads are the "GPU" and not
counted) with and without, medians, the difference as a share of the 4-rank job's step time.

2. End to end: the 4-rank gloo job on the emulated
asynchronous device (tests/collectors/async_device_job.py: DDP's sync as on a GPU, kernels of
8 + 16 + 4 ms, 4 ms of input, loss.item() every step), run with device timing on and off in
alternating order (ABBA) against `rankwatch kafka`. Each run reports every rank's median step
time and the CPU its process spent a step (the training thread's hooks, events and read-backs,
the emulated device's threads, the collector's sender). Prints per run, then the medians over
the runs: the step time ratio on / off and the CPU the device clock adds a step as a share of
the step time. The emulated device's events cost more host CPU than CUDA's (each is a queue
entry run by a Python thread), so the share is an upper bound of the CUDA path's.

    RANKWATCH_PYTHON_DIR=build/python benchmarks/device_clock_cost.py --build build [--runs 6 --steps 200]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "collectors"))


def in_process(brokers, steps):
    """Median training-thread CPU per step (s) with and without device timing, interleaved."""
    import rankwatch
    from emulated_device import Device
    device = Device()
    on = rankwatch.collector.Collector("device-clock-in-process-on", brokers, 0, 1, 0, "bench", "emulated:0",
                                       device_timing=device.clock())
    off = rankwatch.collector.Collector("device-clock-in-process-off", brokers, 0, 1, 0, "bench", "emulated:0",
                                        device_timing=False)
    cpu = {"on": [], "off": []}
    block = 50
    for b in range(steps // block):
        for mode in ("off", "on") if b % 2 == 0 else ("on", "off"):
            rw = on if mode == "on" else off
            for _ in range(block):
                t0 = time.thread_time()
                with rw.step():
                    for phase, op in (("forward", "forward-compute"), ("backward", "backward-compute"),
                                      ("optimizer", "optimizer")):
                        with rw.phase(phase), rw.op(op):
                            device.launch(0.05)
                    device.synchronize()
                cpu[mode].append(time.thread_time() - t0)
    stats = on.stats()
    on.close()
    off.close()
    device.close()
    assert stats["device_steps"] >= steps // 2 - 1 and stats["device_steps_missing"] == 0, stats
    return statistics.median(cpu["on"]), statistics.median(cpu["off"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--runs", type=int, default=6, help="runs of each setting, alternating (ABBA)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--in-process-steps", type=int, default=4000)
    args = p.parse_args()
    os.environ.setdefault("RANKWATCH_PYTHON_DIR", os.path.join(args.build, "python"))
    sys.path.insert(0, os.environ["RANKWATCH_PYTHON_DIR"])
    import torch_job
    torch_job.PYTHON_DIR = os.environ["RANKWATCH_PYTHON_DIR"]
    script = os.path.join(ROOT, "tests", "collectors", "async_device_job.py")
    workdir = tempfile.mkdtemp(prefix="rankwatch-device-clock-")
    broker = subprocess.Popen([os.path.join(args.build, "bin", "rankwatch"), "kafka"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    brokers = broker.stdout.readline().strip()
    try:
        cpu_on, cpu_off = in_process(brokers, args.in_process_steps)
    except BaseException:
        broker.terminate()
        raise
    print("in one process, training thread CPU per step: %.1f us with device timing, %.1f us without: "
          "+%.1f us a step" % (cpu_on * 1e6, cpu_off * 1e6, (cpu_on - cpu_off) * 1e6), flush=True)
    step = {"on": [], "off": []}
    cpu = {"on": [], "off": []}
    try:
        for i in range(args.runs):
            for mode in ("off", "on") if i % 2 == 0 else ("on", "off"):
                ranks = torch_job.TorchJob(workdir, "device-clock-%d-%s" % (i, mode), brokers, args.steps,
                                           "--device-timing", mode, script=script).wait(timeout=args.steps + 120)
                s = statistics.median(r["median_step_s"] for r in ranks)
                c = statistics.mean(r["cpu_s_per_step"] for r in ranks)
                if mode == "on":
                    for r in ranks:
                        st = r["collector"]
                        assert st["device_steps"] >= args.steps - 1 and st["device_steps_missing"] == 0, st
                step[mode].append(s)
                cpu[mode].append(c)
                print("run %d %-3s median step %.2f ms, CPU %.3f ms/step per rank" % (i, mode, s * 1e3, c * 1e3),
                      flush=True)
    finally:
        broker.terminate()
        broker.wait()
    if not args.runs:
        return
    on, off = statistics.median(step["on"]), statistics.median(step["off"])
    added_cpu = statistics.median(cpu["on"]) - statistics.median(cpu["off"])
    pairs = sorted(a / b - 1 for a, b in zip(step["on"], step["off"]))
    print("step time: on %.2f ms / off %.2f ms = %+.2f %% (runs' ratios %+.2f ... %+.2f %%)" % (
        on * 1e3, off * 1e3, (on / off - 1) * 100, pairs[0] * 100, pairs[-1] * 100))
    print("CPU the device clock adds, separate runs: %.1f us a step and rank = %.2f %% of the step time" % (
        added_cpu * 1e6, added_cpu / off * 100))
    print("CPU the device clock adds, in one process: %.1f us a step = %.2f %% of the job's %.2f ms step" % (
        (cpu_on - cpu_off) * 1e6, (cpu_on - cpu_off) / off * 100, off * 1e3))


if __name__ == "__main__":
    main()
