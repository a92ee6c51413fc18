#!/usr/bin/python3
"""How long a SIGKILLed (--stop-signal TERM: a stopped) rankwatchd, restarted on its state directory, takes to diagnose its jobs
again: each configuration in the same run, on one development broker, median of --kills.

A simulated job (--ranks ranks, 100-ms steps, published in real time as collectors do: every
rank's records once a second) runs throughout. For each configuration a daemon starts, aligns
the job's steps, and is then SIGKILLed and restarted at once on the same state directory
--kills times. Each restart is timed from the new process's start to:
  - served:   GetDiagnosis answers for the job (its state restored from the local store);
  - assigned: the consumer group has given the instance its partitions again;
  - live:     the job's aligned steps go past what was restored (new input diagnosed).

Configurations (each a daemon of its own group and state directory):
  session-10s  --session-timeout 10s: the consumer settings before this benchmark existed
  default      no flags: on the development broker, a dynamic member with a 3-s session
Any other: --config NAME='FLAGS' (e.g. --config session-6s='--session-timeout 6s').

Prints a line per restart and one JSON line with the medians and the ratio of each
configuration's median `live` to the first configuration's.

Usage: benchmarks/restart_time.py [--bin build/bin] [--kills 5] [--ranks 8]
       [--stop-signal KILL|TERM] [--config NAME='FLAGS' ...]
"""
import argparse
import json
import os
import shlex
import signal
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../tests/e2e"))
import harness  # noqa: E402

JOB = "restart-job"


def stub_for(address):
    import grpc
    from rankwatch.v1 import service_pb2_grpc
    return service_pb2_grpc.RankWatchStub(grpc.insecure_channel(address))


def aligned_steps(stub):
    """The job's aligned steps as the daemon serves them, or None while it does not answer."""
    import grpc
    from rankwatch.v1 import service_pb2
    try:
        return stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=JOB), timeout=1).aligned_steps
    except grpc.RpcError:
        return None


def endpoints(state_dir, pid):
    try:
        with open(os.path.join(state_dir, "endpoints.json")) as f:
            e = json.load(f)
        return e if e.get("pid") == pid else None
    except (OSError, ValueError):
        return None


def assigned(address):
    try:
        with urllib.request.urlopen("http://%s/metrics" % address, timeout=5) as r:
            samples = harness.parse_metrics(r.read().decode())
    except OSError:
        return False
    return (harness.metric(samples, "rankwatch_kafka_assigned_partitions") or 0) > 0


def start(fleet, brokers, name, flags, state_dir):
    args = [os.path.join(harness.BIN, "rankwatchd"), "--brokers", brokers, "--group", "restart-" + name,
            "--state-dir", state_dir, "--metrics-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--ui-listen", "127.0.0.1:0",
            "--control-topic", "", "--log-level", "info"] + flags
    return fleet.start("rankwatchd-" + name, args)


def time_restart(fleet, brokers, name, flags, state_dir):
    """Starts a daemon and times it; returns (process, {served, assigned, live} seconds)."""
    t0 = time.monotonic()
    p = start(fleet, brokers, name, flags, state_dir)
    marks = {}
    e = harness.wait_until(lambda: endpoints(state_dir, p.proc.pid) or p.proc.poll() is not None, 60,
                           "rankwatchd's endpoints")
    if p.proc.poll() is not None:
        raise AssertionError("rankwatchd exited: " + p.stderr())
    stub = stub_for(e["grpc"])
    restored = None
    deadline = time.monotonic() + 120
    while len(marks) < 3 and time.monotonic() < deadline:
        now = time.monotonic() - t0
        steps = aligned_steps(stub)
        if steps is not None and "served" not in marks:
            marks["served"], restored = now, steps
        if "assigned" not in marks and assigned(e["metrics"]):
            marks["assigned"] = now
        if steps is not None and restored is not None and steps > restored and "live" not in marks:
            marks["live"] = now
        time.sleep(0.05)
    if len(marks) < 3:
        raise AssertionError("%s: after 120 s only %s" % (name, marks))
    return p, marks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=harness.BIN)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--config", action="append", default=[], metavar="NAME='FLAGS'")
    ap.add_argument("--stop-signal", choices=("KILL", "TERM"), default="KILL",
                    help="how each daemon is stopped before its restart (TERM: a planned restart, "
                         "which checkpoints and leaves the group)")
    a = ap.parse_args()
    harness.BIN = os.path.abspath(a.bin)
    configs = [("session-10s", ["--session-timeout", "10s"]), ("default", [])]
    if a.config:
        configs = [(c.split("=", 1)[0], shlex.split(c.split("=", 1)[1])) for c in a.config]
    fleet = harness.Fleet()
    results = {}
    try:
        brokers = fleet.start_broker()
        fleet.start("simulate", [os.path.join(harness.BIN, "rankwatch"), "simulate", "--brokers", brokers,
                                 "--job", JOB, "--ranks", str(a.ranks), "--steps", "10000000",
                                 "--step-ms", "100", "--speed", "realtime"])
        for name, flags in configs:
            state_dir = os.path.join(fleet.workdir, "state-" + name)
            p, first = time_restart(fleet, brokers, name, flags, state_dir)
            print("%s: first start %s" % (name, {k: round(v, 2) for k, v in first.items()}), flush=True)
            runs = []
            for i in range(a.kills):
                time.sleep(3)  # a few checkpoints of new steps
                p.stop(getattr(signal, "SIG" + a.stop_signal))
                p, marks = time_restart(fleet, brokers, name, flags, state_dir)
                runs.append(marks)
                print("%s: restart %d: %s" % (name, i + 1, {k: round(v, 2) for k, v in marks.items()}),
                      flush=True)
            p.stop(signal.SIGTERM)
            results[name] = {k: round(statistics.median(r[k] for r in runs), 2) for k in ("served", "assigned", "live")}
            results[name]["live_runs"] = [round(r["live"], 2) for r in runs]
    finally:
        fleet.close()
    base = results[configs[0][0]]["live"]
    for name in results:
        results[name]["live_ratio"] = round(results[name]["live"] / base, 3)
    print(json.dumps({"kills": a.kills, "signal": a.stop_signal, "ranks": a.ranks, "results": results}))


if __name__ == "__main__":
    main()
