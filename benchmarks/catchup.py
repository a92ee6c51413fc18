#!/usr/bin/python3
"""Catch-up: how fast `rankwatchd` reads a backlog, and how much memory it takes to, under
different librdkafka consumer settings. All real processes over loopback TCP on this machine.

A backlog is published once into the development broker (`rankwatch kafka`) with nobody
reading it: `rankwatch simulate --speed max`, --jobs jobs of --ranks ranks and --steps steps.
Then, for each run and each configuration in turn (interleaved, so the machine's drift falls on
every configuration alike), a fresh `rankwatchd` in a consumer group of its own, with a fresh
state directory and the configuration's `kafka:` properties, reads the whole backlog from its
start. Per daemon:
  * catch-up s: from the group's assignment to every step of every job aligned;
  * records/s: the backlog's records over that time;
  * peak RSS: the process's VmHWM (the kernel's high-water mark of resident memory) at the end;
  * lost: rankwatch_input_lost_messages_total, which must stay 0 (the development broker keeps
    5 MiB a partition; the backlog is sized and spread over --partitions to fit).
Prints one JSON line per daemon and a summary: the median of the runs per configuration and
its ratio to the first configuration (the baseline).

Usage: benchmarks/catchup.py [--runs 5] [--jobs 200] [--ranks 16] [--steps 1000]
       [--partitions 256] [--config NAME=KEY=VALUE,KEY=VALUE ...] [--bin build/bin]
       [--bin-for NAME=DIR ...] [--args-for NAME=ARGS ...]
--bin-for runs configuration NAME with the rankwatchd in DIR (another build, e.g. an older
commit's), the others with --bin's.
With no --config: "default" (the daemon's own settings: 16 MiB queued ahead, 4 MiB a fetch),
"queue-32MiB" (queued.max.messages.kbytes 32768) and "librdkafka" (librdkafka's defaults: 64 MiB
queued ahead, 50 MiB a fetch).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../tests/e2e"))
import harness  # noqa: E402

DEFAULT_CONFIGS = [
    "default=",
    "queue-32MiB=queued.max.messages.kbytes=32768",
    "librdkafka=queued.max.messages.kbytes=65536,fetch.max.bytes=52428800",
]


def parse_config(text):
    """NAME=KEY=VALUE,KEY=VALUE -> (name, {key: value})."""
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise SystemExit("--config %r: expected NAME=KEY=VALUE,... (or NAME= for the defaults)" % text)
    props = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise SystemExit("--config %r: %r is not KEY=VALUE" % (text, item))
        props[key] = value
    return name, props


def vm_hwm_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def aligned_and_lost(daemon):
    s = harness.parse_metrics(harness.scrape(daemon))
    aligned = sum(v for n, _, v in s if n == "rankwatch_steps_aligned_total")
    lost = sum(v for n, _, v in s if n == "rankwatch_input_lost_messages_total")
    return int(aligned), int(lost)


def catch_up(fleet, brokers, name, props, run, expected_steps, records, timeout, bin_dir=None,
             daemon_args=()):
    config = os.path.join(fleet.workdir, "%s-%d.yaml" % (name, run))
    with open(config, "w") as f:
        f.write(harness.FAST_GROUP)
        for key, value in props.items():
            f.write("  %s: \"%s\"\n" % (key, value))
    state = os.path.join(fleet.workdir, "state-%s-%d" % (name, run))
    started = time.monotonic()
    default_bin = harness.BIN
    harness.BIN = bin_dir or default_bin
    try:
        daemon = fleet.start_daemon(brokers, extra=["--config", config, "--group", "catchup-%s-%d" % (name, run)]
                                    + list(daemon_args), state_dir=state)
    finally:
        harness.BIN = default_bin
    assigned = time.monotonic()
    aligned, lost = 0, 0
    while time.monotonic() - assigned < timeout:
        aligned, lost = aligned_and_lost(daemon)
        if aligned >= expected_steps:
            break
        time.sleep(0.05)
    done = time.monotonic()
    peak = vm_hwm_bytes(daemon.proc.pid)
    wakeups = harness.metric(harness.parse_metrics(harness.scrape(daemon)),
                             "rankwatch_kafka_fetch_wakeups_total") or 0
    daemon.stop()
    daemon.close()
    shutil.rmtree(state, ignore_errors=True)
    if aligned < expected_steps:
        raise SystemExit("%s run %d: %d of %d steps aligned after %.0f s (lost %d)"
                         % (name, run, aligned, expected_steps, timeout, lost))
    return {
        "config": name,
        "run": run,
        "join_s": round(assigned - started, 2),
        "catch_up_s": round(done - assigned, 2),
        "records_per_s": round(records / (done - assigned)),
        "peak_rss_mib": round(peak / 2**20, 1),
        "lost": lost,
        "fetch_wakeups": int(wakeups),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--ranks", type=int, default=16)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--partitions", type=int, default=256)
    p.add_argument("--config", action="append", default=None,
                   help="NAME=KEY=VALUE,KEY=VALUE (repeatable; the first is the baseline)")
    p.add_argument("--timeout", type=float, default=300, help="seconds one daemon may take")
    p.add_argument("--bin", default=None, help="folder with rankwatch and rankwatchd (default build/bin)")
    p.add_argument("--bin-for", action="append", default=[],
                   help="NAME=DIR: configuration NAME runs the rankwatchd in DIR (repeatable)")
    p.add_argument("--args-for", action="append", default=[],
                   help="NAME=ARGS: configuration NAME's rankwatchd also gets ARGS, e.g. "
                        "'slow=--checkpoint-input-mib 1024' (repeatable)")
    args = p.parse_args()
    if args.bin:
        harness.BIN = args.bin
    configs = [parse_config(c) for c in (args.config or DEFAULT_CONFIGS)]
    if len({n for n, _ in configs}) != len(configs):
        raise SystemExit("--config names must differ")
    bin_for = {}
    for item in args.bin_for:
        name, sep, folder = item.partition("=")
        if not sep or name not in {n for n, _ in configs} or not os.path.isfile(os.path.join(folder, "rankwatchd")):
            raise SystemExit("--bin-for %r: expected NAME=DIR, NAME a --config name, DIR with rankwatchd" % item)
        bin_for[name] = os.path.abspath(folder)
    args_for = {}
    for item in args.args_for:
        name, sep, extra = item.partition("=")
        if not sep or name not in {n for n, _ in configs}:
            raise SystemExit("--args-for %r: expected NAME=ARGS, NAME a --config name" % item)
        args_for[name] = extra.split()
    records = args.jobs * args.ranks * args.steps
    expected_steps = args.jobs * args.steps
    fleet = harness.Fleet()
    results = []
    try:
        brokers = fleet.start_broker(args.partitions)
        t = time.monotonic()
        sim = fleet.simulate(brokers, "--job", "catchup", "--jobs", str(args.jobs), "--ranks", str(args.ranks),
                             "--steps", str(args.steps), "--speed", "max", "--compression", "zstd",
                             "--batch-steps", "50", "--report-collective", timeout=600)
        print(json.dumps({"backlog_records": records, "jobs": args.jobs, "ranks": args.ranks, "steps": args.steps,
                          "partitions": args.partitions, "published_s": round(time.monotonic() - t, 1),
                          "simulator": sim}), flush=True)
        for run in range(args.runs):
            for name, props in configs:
                r = catch_up(fleet, brokers, name, props, run, expected_steps, records, args.timeout,
                             bin_for.get(name), args_for.get(name, ()))
                print(json.dumps(r), flush=True)
                results.append(r)
        summary = {"runs": args.runs, "backlog_records": records, "configs": {}}
        base = None
        for name, props in configs:
            rs = [r for r in results if r["config"] == name]
            med = {k: statistics.median(r[k] for r in rs)
                   for k in ("catch_up_s", "records_per_s", "peak_rss_mib", "join_s")}
            med["catch_up_s_runs"] = [r["catch_up_s"] for r in rs]
            med["peak_rss_mib_runs"] = [r["peak_rss_mib"] for r in rs]
            med["lost"] = sum(r["lost"] for r in rs)
            med["kafka"] = props
            if name in bin_for:
                med["bin"] = bin_for[name]
            if name in args_for:
                med["args"] = args_for[name]
            if base is None:
                base = med
            med["catch_up_ratio"] = round(med["catch_up_s"] / base["catch_up_s"], 3)
            med["peak_rss_ratio"] = round(med["peak_rss_mib"] / base["peak_rss_mib"], 3)
            summary["configs"][name] = med
        print(json.dumps(summary), flush=True)
        if any(r["lost"] for r in results):
            raise SystemExit("input was lost: the backlog did not fit the development broker; "
                             "use more --partitions or a smaller backlog")
    finally:
        fleet.close()


if __name__ == "__main__":
    main()
