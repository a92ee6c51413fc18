#!/usr/bin/python3
"""End-to-end throughput: `rankwatch simulate --speed max` -> `rankwatch kafka` -> `rankwatchd`,
all real processes over loopback TCP on this machine (they share its cores).

For each offered rate (simulate --rate, records/s across the fleet) and run, it measures
  * e2e records/s: records / (simulator start -> rankwatchd aligned every step),
  * the daemon's lag: seconds from the simulator's last delivery to the last aligned step, and
    the largest rankwatch_ingest_lag_seconds seen (age of the batch being processed),
  * loss: records offered but never counted by the daemon. The development broker keeps only
    5 MiB per partition (librdkafka's mock cluster), so a daemon that falls behind loses data
    instead of lagging forever: loss > 0 means the rate is not sustained.
Baseline in the same run: the simulator alone at full speed into a broker with no daemon.
"Sustained" = the highest offered rate with no loss in any run and a median lag under 1 s.
Prints one JSON line per run and a summary line.

Usage: benchmarks/e2e_throughput.py [--rates 250000,400000,600000] [--runs 3]
       [--ranks 256] [--seconds 8] [--bin build/bin] [--fault SPEC ...]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../tests/e2e"))
import harness  # noqa: E402


def run_simulate(brokers, job, ranks, steps, rate=None, faults=()):
    args = [os.path.join(harness.BIN, "rankwatch"), "simulate", "--brokers", brokers, "--job", job,
            "--ranks", str(ranks), "--steps", str(steps), "--speed", "max", "--report-collective"]
    if rate:
        args += ["--rate", str(rate)]
    for f in faults:
        args += ["--fault", f]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def result_of(proc):
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise SystemExit("simulate failed")
    return json.loads(out.strip().splitlines()[-1])


def e2e_run(fleet, brokers, daemon, job, ranks, steps, rate, timeout, faults=()):
    records = ranks * steps
    start = time.monotonic()
    proc = run_simulate(brokers, job, ranks, steps, rate, faults)
    produced_at = None
    max_lag = 0.0
    last_change = start
    last_seen = -1
    while True:
        now = time.monotonic()
        if produced_at is None and proc.poll() is not None:
            produced_at = now
        s = harness.parse_metrics(harness.scrape(daemon))
        max_lag = max(max_lag, harness.metric(s, "rankwatch_ingest_lag_seconds") or 0.0)
        aligned = harness.metric(s, "rankwatch_steps_aligned_total", training_job=job) or 0
        if aligned != last_seen:
            last_seen, last_change = aligned, now
        if aligned >= steps or (produced_at and now - last_change > 3) or now - start > timeout:
            break
        time.sleep(0.02)
    done = time.monotonic()
    sim = result_of(proc)
    produced_at = produced_at or done
    consumed = int(sum(v for n, l, v in harness.parse_metrics(harness.scrape(daemon))
                       if n == "rankwatch_events_total" and l.get("kind") == "step"))
    return {
        "offered_records_per_s": rate,
        "simulator_records_per_s": round(sim["records_per_second"]),
        "e2e_records_per_s": round(records / (done - start)),
        "daemon_lag_after_producer_s": round(max(0.0, done - produced_at), 3),
        "max_ingest_lag_s": round(max_lag, 3),
        "aligned_steps": int(last_seen),
        "steps": steps,
        "consumed_so_far": consumed,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="250000,400000,600000")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument("--seconds", type=float, default=8, help="offered load duration per run")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--settle", type=float, default=2.0,
                   help="seconds between the daemon's assignment and the first run")
    p.add_argument("--bin", default=None, help="folder with rankwatch and rankwatchd (default build/bin)")
    p.add_argument("--fault", action="append", default=[],
                   help="a `rankwatch simulate --fault` of every measured job (e.g. slow-compute:17:0.5: "
                        "a straggler, whose alert charges its node in the fleet view)")
    args = p.parse_args()
    if args.bin:
        harness.BIN = args.bin
    rates = [int(r) for r in args.rates.split(",")]
    fleet = harness.Fleet()
    summary = {"ranks": args.ranks, "runs": args.runs, "rates": {}}
    try:
        # Baseline: the producer alone, as fast as it goes, into a broker nobody reads.
        base_brokers = fleet.start_broker(args.partitions)
        steps = max(1, int(400000 * args.seconds / args.ranks))
        base = [result_of(run_simulate(base_brokers, "baseline-%d" % i, args.ranks, steps))["records_per_second"]
                for i in range(args.runs)]
        summary["baseline_producer_records_per_s"] = round(statistics.median(base))
        print(json.dumps({"baseline_producer_records_per_s": [round(b) for b in base]}), flush=True)

        brokers = fleet.start_broker(args.partitions)
        daemon = fleet.start_daemon(brokers)
        # A daemon that has just been given its partitions reads them late for a moment
        # (librdkafka's first fetches after an assignment): at 2 M records/s the development
        # broker's 5 MiB hold only ~50 ms of a partition, so a run started at once lost its
        # first messages. Measured here: a daemon that was running before the load came.
        time.sleep(args.settle)
        consumed_before = 0
        sustained = 0
        for rate in rates:
            steps = max(1, int(rate * args.seconds / args.ranks))
            runs = []
            for i in range(args.runs):
                r = e2e_run(fleet, brokers, daemon, "e2e-%d-%d" % (rate, i), args.ranks, steps, rate, args.timeout,
                            args.fault)
                r["loss"] = args.ranks * steps - (r.pop("consumed_so_far") - consumed_before)
                consumed_before += args.ranks * steps - r["loss"]
                print(json.dumps(r), flush=True)
                runs.append(r)
            med = {k: statistics.median(r[k] for r in runs)
                   for k in ("e2e_records_per_s", "daemon_lag_after_producer_s", "max_ingest_lag_s")}
            med["lossless_runs"] = sum(1 for r in runs if r["loss"] == 0 and r["aligned_steps"] == r["steps"])
            med["e2e_over_baseline"] = round(med["e2e_records_per_s"] / summary["baseline_producer_records_per_s"], 3)
            summary["rates"][rate] = med
            if med["lossless_runs"] == args.runs and med["daemon_lag_after_producer_s"] < 1.0:
                sustained = max(sustained, rate)
        summary["sustained_records_per_s"] = sustained
        print(json.dumps(summary), flush=True)
    finally:
        fleet.close()


if __name__ == "__main__":
    main()
