#!/usr/bin/python3
"""What asking for stacks costs a healthy job (issue #18, acceptance 4): a real 4-rank PyTorch
DDP job (tests/collectors/hang_job.py, gloo on CPU, no hang) publishes to `rankwatch kafka` and a
`rankwatchd`, while this script sends a stacks request (control.proto StacksAction, every rank)
once a second during alternate windows (on, off, on, ...) straight onto the control topic with
python3-confluent-kafka. Each collector answers from its own thread (rankwatch/stacks.py).

Within each run the steps are split by the window their end falls in (a step's time: the median
over ranks; the first warm-up seconds left out) and the run's figure is the median step time of
the "on" windows over that of the "off" windows: the same processes, placement and machine load
serve both sides. The headline is the median of the runs' ratios; each run also prints the
stacks requests each rank accepted (every request sent in an "on" window, when none was lost).

    benchmarks/hang_stacks_overhead.py --runs 4 --seconds 70
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "collectors"))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--seconds", type=float, default=90, help="length of each run")
    p.add_argument("--window", type=float, default=10, help="seconds of each on / off window")
    p.add_argument("--warmup", type=float, default=10, help="seconds left out at the start")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between requests when on")
    p.add_argument("--step-ms", type=float, default=20.0, help="the job's simulated device time a step")
    p.add_argument("--json-out")
    args = p.parse_args()
    args.build = os.path.abspath(args.build)
    os.environ.setdefault("RANKWATCH_BIN", os.path.join(args.build, "bin"))
    os.environ.setdefault("RANKWATCH_PYTHON_DIR", os.path.join(args.build, "python"))
    sys.path.insert(0, os.path.join(args.build, "gen_py"))
    import harness
    import torch_job
    from confluent_kafka import Producer
    from rankwatch.v1 import control_pb2

    fleet = harness.Fleet()
    runs = []
    try:
        brokers = fleet.start_broker()
        fleet.start_daemon(brokers)  # creates the control topic, reads the telemetry
        producer = Producer({"bootstrap.servers": brokers})
        steps = int(args.seconds * 1000 / args.step_ms) + 100  # more than the run lasts
        for i in range(args.runs):
            job = "stacks-overhead-%d" % i
            stop_file = os.path.join(fleet.workdir, job + ".stop")
            run = torch_job.TorchJob(fleet.workdir, job, brokers, steps, "--hang", "none",
                                     "--step-ms", str(args.step_ms), "--dump-steps",
                                     "--stop-file", stop_file,
                                     script=os.path.join(ROOT, "tests", "collectors", "hang_job.py"),
                                     steady_malloc=True)
            t0 = time.time()
            windows = []  # (start, end, on)
            sent = 0
            stop = threading.Event()

            def requester():
                nonlocal sent
                k = 0
                start = t0 + args.warmup
                while not stop.is_set() and time.time() < t0 + args.seconds:
                    w_start = start + k * args.window
                    on = k % 2 == 0
                    windows.append((w_start, w_start + args.window, on))
                    while time.time() < w_start + args.window and not stop.is_set():
                        if on:
                            now = time.time_ns()
                            r = control_pb2.ControlRequest(
                                id="%s-%d" % (job, sent), training_job=job, issued_unix_ns=now,
                                deadline_unix_ns=now + 10 * 10**9, requested_by="stacks overhead benchmark")
                            r.stacks.max_frames = 64
                            producer.produce("rankwatch.control", key=job, value=r.SerializeToString())
                            producer.poll(0)
                            sent += 1
                        time.sleep(args.interval)
                    k += 1

            while time.time() < t0 + args.warmup:
                time.sleep(0.2)
            thread = threading.Thread(target=requester, daemon=True)
            thread.start()
            while time.time() < t0 + args.seconds:
                time.sleep(0.5)
            stop.set()
            thread.join()
            producer.flush(10)
            with open(stop_file, "w"):
                pass  # the ranks end cleanly within ten steps
            ranks = run.wait(timeout=120)
            on, off = [], []
            n = min(len(r["step_s"]) for r in ranks)
            for k in range(n):
                end = statistics.median(r["step_ends"][k] for r in ranks)
                dur = statistics.median(r["step_s"][k] for r in ranks)
                for ws, we, is_on in windows:
                    if ws <= end < we:
                        (on if is_on else off).append(dur)
                        break
            accepted = [r["control"]["accepted"] for r in ranks]
            ratio = statistics.median(on) / statistics.median(off)
            runs.append({"run": i, "on_steps": len(on), "off_steps": len(off),
                         "on_median_ms": statistics.median(on) * 1e3,
                         "off_median_ms": statistics.median(off) * 1e3, "ratio": ratio,
                         "requests_sent": sent, "accepted_per_rank": accepted})
            print("run %d: on %.2f ms (%d steps), off %.2f ms (%d steps): ratio %.4f; %d requests, "
                  "accepted by each rank %s" % (i, statistics.median(on) * 1e3, len(on),
                                                statistics.median(off) * 1e3, len(off), ratio, sent,
                                                accepted), flush=True)
    finally:
        fleet.close()
    ratios = [r["ratio"] for r in runs]
    summary = {"runs": runs, "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
               "ratio_max": max(ratios)}
    print("step time with stacks requested every %.1f s / without: median %.4f (runs %.4f ... %.4f)"
          % (args.interval, summary["ratio_median"], summary["ratio_min"], summary["ratio_max"]))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
