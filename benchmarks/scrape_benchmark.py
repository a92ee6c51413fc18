#!/usr/bin/python3
"""A /metrics scrape of rankwatchd with many jobs: two daemon builds side by side, same run.

Both daemons (each in a consumer group of its own, so each reads every record) consume the same
simulated fleet — JOBS jobs of RANKS ranks — from one development broker; once both track every
job, their /metrics is scraped alternately ROUNDS times (each scrape timed from the request to
the last byte, over loopback TCP). Prints one JSON line with each build's median scrape seconds,
body size and series count, and the ratio subject/baseline.

Typical use: the baseline is a build of the previous commit (e.g. the hand-written registry),
the subject is this tree's build (prometheus-cpp):
    benchmarks/scrape_benchmark.py --baseline-bin /tmp/old/bin --bin build/bin --jobs 10000

Usage: benchmarks/scrape_benchmark.py --baseline-bin DIR [--bin build/bin] [--jobs 10000]
       [--ranks 4] [--steps 40] [--rounds 5]
"""
import argparse
import json
import os
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../tests/e2e"))
import harness  # noqa: E402


def start_daemon(fleet, bin_dir, brokers, group, max_jobs):
    saved = harness.BIN
    harness.BIN = bin_dir
    try:
        return fleet.start_daemon(brokers, extra=["--group", group, "--max-jobs", str(max_jobs),
                                                  "--log-level", "warn"])
    finally:
        harness.BIN = saved


def timed_scrape(daemon):
    start = time.monotonic()
    with urllib.request.urlopen("http://%s/metrics" % daemon.endpoints["metrics"], timeout=300) as r:
        body = r.read()
    return time.monotonic() - start, body


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline-bin", required=True, help="folder with the baseline rankwatchd")
    p.add_argument("--bin", default=harness.BIN, help="folder with the subject rankwatchd and rankwatch")
    p.add_argument("--jobs", type=int, default=10000)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    harness.BIN = os.path.abspath(a.bin)
    fleet = harness.Fleet()
    try:
        brokers = fleet.start_broker(partitions=16)
        daemons = {"baseline": start_daemon(fleet, os.path.abspath(a.baseline_bin), brokers, "scrape-base", a.jobs),
                   "subject": start_daemon(fleet, harness.BIN, brokers, "scrape-subj", a.jobs)}
        print("scrape: %d jobs x %d ranks x %d steps into both daemons" % (a.jobs, a.ranks, a.steps),
              file=sys.stderr, flush=True)
        # Paced below the development broker's 5 MiB a partition (simulate --rate).
        fleet.simulate(brokers, "--job", "scrape", "--jobs", str(a.jobs), "--ranks", str(a.ranks),
                       "--steps", str(a.steps), "--speed", "max", "--rate", "150000", timeout=1200)

        records = a.jobs * a.ranks * a.steps

        def settled(d):
            # Every step record counted (a scrape of the daemon's ingest counters only would do,
            # but /metrics is all or nothing: poll slowly, a scrape of 10,000 jobs is costly).
            s = harness.parse_metrics(timed_scrape(d)[1].decode())
            return (harness.metric(s, "rankwatch_events_total", kind="step") or 0) >= records
        for name, d in daemons.items():
            harness.wait_until(lambda: settled(d), 900, "%s to count every record" % name, interval=10)
        # Let the last steps' windows close and the diagnoses settle.
        time.sleep(5)
        times = {k: [] for k in daemons}
        sizes = {}
        series = {}
        for r in range(a.rounds):
            for name, d in daemons.items():
                seconds, body = timed_scrape(d)
                times[name].append(seconds)
                sizes[name] = len(body)
                series[name] = sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))
            print("round %d: %s" % (r + 1, " ".join("%s %.3f s" % (k, v[-1]) for k, v in times.items())),
                  file=sys.stderr, flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(json.dumps({"jobs": a.jobs, "ranks": a.ranks, "rounds": a.rounds,
                          "median_s": {k: round(v, 4) for k, v in med.items()},
                          "runs_s": {k: [round(x, 4) for x in v] for k, v in times.items()},
                          "bytes": sizes, "series": series,
                          "ratio_subject_over_baseline": round(med["subject"] / med["baseline"], 3)}))
    finally:
        fleet.close()


if __name__ == "__main__":
    main()
