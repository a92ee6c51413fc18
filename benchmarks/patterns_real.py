#!/usr/bin/python3
"""Straggler patterns and memory creep on real jobs, many runs (issue #36): each case of
tests/collectors/patterns.py (a real 4-rank PyTorch DDP job, gloo on CPU,
collectors/python/examples/ddp_example.py) run N times through one `rankwatch kafka` and one
`rankwatchd`:

- stall: rank 1 writes a synchronous checkpoint padded to 250 ms every 10th step from step 20;
  right when rank 1 is a straggler with pattern "periodic", period within 1 step and stall
  within 25 % of the job's measured one, since the first stall (within a period);
- drift: rank 2's end of step costs 0.5 ms more each step from step 20; right when pattern
  "drift", rate within 30 % of the measured one, since within -10 ... +30 steps of its start;
- balanced: 300 steps, no fault; wrong when any diagnosis asked for while it ran (every 0.3 s)
  or at the end had a straggler or a memory creep label;
- leak: rank 0 alone keeps 0.5 MiB a step (400 steps); right when `memory.label` is creep at the
  end, of rank 0 (`creep_rank`), at a rate within 25 % of the one measured from rank 0's resident
  size (printed beside the daemon's).

The ground truth is what each job measured itself, never the flags. The table gives per case
the runs right, the balanced runs with a false straggler or creep verdict, the median detection
delay (steps from the fault's first stall or step to the newest step of the first window whose
verdict had the right label, culprit and pattern), and measured against reported period, stall, rate and since-step (medians
over the runs). Each run's verdict and failures are printed as it ends; --json-out keeps them.

    RANKWATCH_PYTHON_DIR=build/python /usr/bin/python3 benchmarks/patterns_real.py --runs 12
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "collectors"))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
MiB = 2**20


def median(xs, scale=1.0, fmt="%.1f"):
    xs = [x for x in xs if x is not None]
    return fmt % (statistics.median(xs) * scale) if xs else "-"


def row(case, runs):
    """The table's row of `case` from its runs' (failures, facts)."""
    right = sum(1 for failures, _ in runs if not failures)
    facts = [f for _, f in runs]
    cells = {"case": case, "right": "%d/%d" % (right, len(runs))}
    if case == "balanced":
        cells["false"] = "straggler %d, creep %d" % (sum(f["false_straggler"] for f in facts),
                                                     sum(f["false_creep"] for f in facts))
        return cells
    detected = [f["detection_steps"] for f in facts]
    cells["detect"] = "%s (%d/%d seen)" % (median(detected, fmt="%.0f"),
                                            sum(d is not None for d in detected), len(detected))
    t = [f["truth"] for f in facts]
    if case == "stall":
        cells["measured"] = "period %s, stall %s ms, first %s" % (
            median([x["period"] for x in t]), median([x["stall"] for x in t], 1e3),
            median([x["first"] for x in t], fmt="%.0f"))
        cells["reported"] = "period %s, stall %s ms, since %s" % (
            median([f["period"] for f in facts]), median([f["stall"] for f in facts], 1e3),
            median([f["since"] for f in facts], fmt="%.0f"))
    elif case == "drift":
        cells["measured"] = "%s ms/step, from %s" % (median([x["rate"] for x in t], 1e3, "%.3f"),
                                                     median([x["first"] for x in t], fmt="%.0f"))
        cells["reported"] = "%s ms/step, since %s" % (median([f["rate"] for f in facts], 1e3, "%.3f"),
                                                      median([f["since"] for f in facts], fmt="%.0f"))
    elif case == "leak":
        cells["measured"] = "%s MiB/step (rank 0's RSS)" % median([x["rate"] for x in t], 1 / MiB, "%.3f")
        cells["reported"] = "%s MiB/step" % median([f["creep"] for f in facts], 1 / MiB, "%.3f")
    return cells


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--runs", type=int, default=12)
    p.add_argument("--cases", default="stall,drift,balanced,leak", help="comma-separated")
    p.add_argument("--json-out")
    args = p.parse_args()
    args.build = os.path.abspath(args.build)
    os.environ.setdefault("RANKWATCH_BIN", os.path.join(args.build, "bin"))
    os.environ.setdefault("RANKWATCH_PYTHON_DIR", os.path.join(args.build, "python"))
    sys.path.insert(0, os.path.join(args.build, "gen_py"))
    import grpc
    import harness
    import patterns
    from rankwatch.v1 import service_pb2_grpc

    cases = args.cases.split(",")
    for c in cases:
        if c not in patterns.CASES:
            p.error("unknown case %r (%s)" % (c, ", ".join(patterns.CASES)))
    results = {c: [] for c in cases}
    fleet = harness.Fleet()
    try:
        brokers = fleet.start_broker()
        daemon = fleet.start_daemon(brokers)
        stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(daemon.endpoints["grpc"]))
        for i in range(args.runs):
            for case in cases:  # interleaved: the machine's load changes alike for every case
                t0 = time.monotonic()
                name = "patterns-%s-%d" % (case, i)
                outcome = patterns.run_case(case, name, fleet.workdir, brokers, daemon, stub)
                failures, facts = patterns.judge(outcome)
                results[case].append((failures, facts))
                print("run %d %s (%.0f s): %s\n  truth %s\n  final %s" % (
                    i, case, time.monotonic() - t0, "right" if not failures else "; ".join(failures),
                    {k: v for k, v in facts["truth"].items() if k != "steps"}, facts["final"]), flush=True)
    finally:
        fleet.close()

    cols = ("case", "right", "false", "detect", "measured", "reported")
    heads = ("case", "runs right", "balanced: false verdicts", "detection delay, steps (median)",
             "measured (median)", "reported (median)")
    print("\n| " + " | ".join(heads) + " |\n|" + "---|" * len(cols))
    for case in cases:
        cells = row(case, results[case])
        print("| " + " | ".join(cells.get(c, "") for c in cols) + " |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({c: [{"failures": fl, "facts": fa} for fl, fa in r] for c, r in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
