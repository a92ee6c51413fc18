"""Straggler patterns on real jobs (issue #36): 4-rank PyTorch DDP jobs (gloo on CPU,
collectors/python/examples/ddp_example.py) in which one rank stalls periodically (a
synchronous checkpoint every N steps), one rank's step cost drifts up step over step (a logging
helper rescanning a growing history), nothing is wrong (balanced), or one rank leaks memory.
Each job's ground truth is what the job measured itself (each stall's duration, each step's
drift cost; its resident size for the leak), never the flags; `judge()` compares rankwatchd's
verdict with it. Shared by test_patterns.py (one ctest per case) and
benchmarks/patterns_real.py (many runs of each case).

`run_case()` needs a running broker and rankwatchd (`harness.Fleet`) and a gRPC stub of it; it
asks for the job's diagnosis every 0.3 s while the job runs, so that a verdict that ever
appeared (a false straggler in a balanced run) or the step at which the right one first
appeared is known, then once more when every step is aligned."""
import statistics
import threading
import time

import grpc

from harness import metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2
from step_records import read_batches, steps_by_rank
# The leak case runs test_memory_trend.py's job: 400 short steps (0.5 MiB a step on one rank is
# 200 MiB over the run), its rate measured the same way.
from test_memory_trend import FAST_JOB_ARGS, leak_rate_per_step, vm_rss_bytes
from torch_job import DIAGNOSED_JOB_ARGS, TorchJob

STRAGGLER_LABELS = ("STEP_STRAGGLER", "STEP_INPUT_STRAGGLER", "STEP_COMPUTE_STRAGGLER")
CREEP_LABELS = ("MEMORY_CREEP_EARLY", "MEMORY_CREEP")
MiB = 2**20

# Each case: the faulty rank, the job's steps and arguments. 100 steps: the whole run fits the
# daemon's 100-step window, so the verdict at the end sees every step since the fault began.
# A stall of 250 ms every 10 steps on ~35 ms steps (from step 20: stalls end steps 29, 39, ...,
# 99); a drift of 0.5 ms a step from step 20 (40 ms more by step 99). The balanced job runs 300
# steps, watched all along.
STALL_RANK, STALL_EVERY, STALL_MS = 1, 10, 250
DRIFT_RANK, DRIFT_MS_PER_STEP = 2, 0.5
LEAK_RANK, LEAK_MIB = 0, 0.5
FROM_STEP = 20
CASES = {
    "stall": dict(rank=STALL_RANK, steps=100, args=DIAGNOSED_JOB_ARGS + (
        "--fault-stall-rank", str(STALL_RANK), "--fault-stall-every", str(STALL_EVERY),
        "--fault-stall-ms", str(STALL_MS), "--fault-from-step", str(FROM_STEP))),
    "drift": dict(rank=DRIFT_RANK, steps=100, args=DIAGNOSED_JOB_ARGS + (
        "--fault-drift-rank", str(DRIFT_RANK), "--fault-drift-ms-per-step", str(DRIFT_MS_PER_STEP),
        "--fault-from-step", str(FROM_STEP))),
    "balanced": dict(rank=None, steps=300, args=DIAGNOSED_JOB_ARGS),
    "leak": dict(rank=LEAK_RANK, steps=400, args=FAST_JOB_ARGS + (
        "--fault-leak-mib-per-step", str(LEAK_MIB), "--fault-leak-rank", str(LEAK_RANK))),
}


class Watch:
    """While a job runs: its diagnosis every 0.3 s ((unix time, Diagnosis) in `diagnoses`) and,
    with `rss`, each rank's resident size every 0.1 s ((unix time, rank, bytes) in `rss`)."""

    def __init__(self, stub, name, procs=None):
        self.stub, self.name, self.procs = stub, name, procs
        self.diagnoses, self.rss = [], []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._diagnose, daemon=True)]
        if procs is not None:
            self._threads.append(threading.Thread(target=self._sample, daemon=True))
        for t in self._threads:
            t.start()

    def _diagnose(self):
        while not self._stop.wait(0.3):
            try:
                d = self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=self.name), timeout=5)
            except grpc.RpcError:
                continue  # the job is not known yet
            self.diagnoses.append((time.time(), d))

    def _sample(self):
        while not self._stop.wait(0.1):
            now = time.time()
            for rank, p in enumerate(self.procs):
                b = vm_rss_bytes(p.pid)
                if b is not None:
                    self.rss.append((now, rank, b))

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join()


def run_case(case, name, workdir, brokers, daemon, stub, timeout=240):
    """Runs `case` as job `name`; returns an outcome: {case, name, ranks (each rank's final JSON
    line), records ({rank: {step: StepRecord}} read back from Kafka), watch, final (the
    Diagnosis once every step is aligned)}."""
    spec = CASES[case]
    job = TorchJob(workdir, name, brokers, spec["steps"], *spec["args"])
    watch = Watch(stub, name, job.procs if case == "leak" else None)
    try:
        ranks = job.wait(timeout=timeout)
    finally:
        watch.stop()
    for r in ranks:
        if r["steps"] != spec["steps"] or r["collector"]["records_dropped"] or r["collector"]["batches_failed"]:
            raise AssertionError("rank %d: %d steps, collector %s" % (r["rank"], r["steps"], r["collector"]))
    wait_until(lambda: metric(parse_metrics(scrape(daemon)), "rankwatch_steps_aligned_total",
                              training_job=name) == spec["steps"], 60, "%s: every step aligned" % name)
    final = stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=name), timeout=10)
    records = steps_by_rank(read_batches(brokers, name)) if case != "leak" else {}
    return dict(case=case, name=name, ranks=ranks, records=records, watch=watch, final=final)


# --- ground truth ------------------------------------------------------------------------------
def own_excess(records, rank, step):
    """`rank`'s own time (step time - collective) at `step` minus the median rank's, seconds, from
    the step records the daemon diagnoses (None where a rank's record is missing)."""
    owns = {}
    for r, by_step in records.items():
        s = by_step.get(step)
        if s is None:
            return None
        owns[r] = (s.step_time_ns - s.collective_ns) / 1e9
    return owns[rank] - statistics.median(owns.values())


def truth(outcome):
    """What the job measured: stall (period, median stall seconds, the first stall's step, and
    the stall rank's median own-time excess at its stall steps in the records), drift (least-
    squares rate of the measured cost per step, the fault's first step, and the rate of the
    drift rank's own-time excess in the records), leak (the leaking rank's resident size against
    its steps after step 50, bytes a step)."""
    case, ranks, records = outcome["case"], outcome["ranks"], outcome["records"]
    rank = CASES[case]["rank"]
    if case == "stall":
        stalls = ranks[rank]["stall_fault"]
        for r in ranks:
            if r["rank"] != rank and r["stall_fault"]:
                raise AssertionError("rank %d stalled too" % r["rank"])
        steps = [s for s, _ in stalls]
        excess = [own_excess(records, rank, s) for s in steps]
        return dict(stalls=len(stalls), steps=steps, first=steps[0],
                    period=statistics.median(b - a for a, b in zip(steps, steps[1:])),
                    stall=statistics.median(sec for _, sec in stalls),
                    record_stall=statistics.median(e for e in excess if e is not None))
    if case == "drift":
        costs = ranks[rank]["drift_fault"]
        steps = [s for s, _ in costs]
        excess = [(s, own_excess(records, rank, s)) for s in steps]
        excess = [(s, e) for s, e in excess if e is not None]
        return dict(first=steps[0], rate=statistics.linear_regression(steps, [c for _, c in costs]).slope,
                    record_rate=statistics.linear_regression(*zip(*excess)).slope)
    if case == "leak":
        samples = [(t, b) for t, r, b in outcome["watch"].rss if r == rank]
        return dict(rate=leak_rate_per_step(samples, ranks[rank]["step_end_unix"], 50))
    return {}


# --- the verdict -------------------------------------------------------------------------------
def label(d):
    return service_pb2.StepDiagnosisLabel.Name(d.step.label)


def describe(d):
    """One line: the step verdict, its straggler evidence and the memory verdict."""
    s, m = d.step, d.memory
    line = "window %d-%d: %s, culprits %s" % (s.window.first_step, s.window.last_step, label(d),
                                               list(s.culprit_ranks))
    if s.HasField("straggler"):
        e = s.straggler
        line += (" | straggler rank %d, excess %.1f ms (noise %.1f, z %.1f, %d steps), since step %d, "
                 "pattern %r: period %.1f steps, stall %.1f ms, %d stalls, drift %.3f ms a step" % (
                     e.rank, e.excess_seconds * 1e3, e.noise_seconds * 1e3, e.z, e.steps, e.since_step,
                     e.pattern, e.period_steps, e.stall_seconds * 1e3, e.stalls, e.drift_seconds_per_step * 1e3))
    line += " | memory %s, creep %.3f MiB a step" % (service_pb2.MemoryDiagnosisLabel.Name(m.label),
                                                      m.creep_bytes_per_step / MiB)
    return line


def verdict_failures(case, d, t, figures=True):
    """What is wrong with diagnosis `d` of a `case` job whose truth is `t` ([] when right): its
    label, culprit and pattern, and with `figures` its period, stall, rate and since-step."""
    s, e = d.step, d.step.straggler
    if case == "leak":
        m = service_pb2.MemoryDiagnosisLabel.Name(d.memory.label)
        if m not in CREEP_LABELS:
            return ["memory label %s, not creep" % m]
        if not d.memory.HasField("creep_rank") or d.memory.creep_rank != CASES[case]["rank"]:
            return ["creep of %s, not of rank %d" % (
                "rank %d" % d.memory.creep_rank if d.memory.HasField("creep_rank") else "the job",
                CASES[case]["rank"])]
        rate = d.memory.creep_bytes_per_step
        if figures and t.get("rate") and abs(rate - t["rate"]) > 0.25 * t["rate"]:
            return ["creep %.3f MiB a step, rank %d's resident size grew %.3f" % (
                rate / 2**20, CASES[case]["rank"], t["rate"] / 2**20)]
        return []
    if case == "balanced":
        return ["straggler label %s, culprits %s" % (label(d), list(s.culprit_ranks))] \
            if label(d) in STRAGGLER_LABELS else []
    rank, out = CASES[case]["rank"], []
    if label(d) not in STRAGGLER_LABELS:
        return ["label %s, not a straggler" % label(d)]
    if list(s.culprit_ranks) != [rank]:
        return ["culprits %s, not [%d]" % (list(s.culprit_ranks), rank)]
    if not s.HasField("straggler"):
        return ["no straggler evidence (StepDiagnosis.straggler)"]
    if e.rank != rank:
        return ["straggler evidence of rank %d, not %d" % (e.rank, rank)]
    if case == "stall":
        if e.pattern != "periodic":
            return ["pattern %r, not 'periodic'" % e.pattern]
        if not figures:
            return []
        if abs(e.period_steps - t["period"]) > 1:
            out.append("period %.1f steps, measured %.1f" % (e.period_steps, t["period"]))
        if abs(e.stall_seconds - t["stall"]) > 0.25 * t["stall"]:
            out.append("stall %.1f ms, measured %.1f" % (e.stall_seconds * 1e3, t["stall"] * 1e3))
        # The culprit holds since the first stall (within one period: the first may go unseen).
        if abs(e.since_step - t["first"]) > t["period"]:
            out.append("since step %d, the first stall ended step %d" % (e.since_step, t["first"]))
    if case == "drift":
        if e.pattern != "drift":
            return ["pattern %r, not 'drift'" % e.pattern]
        if not figures:
            return []
        if abs(e.drift_seconds_per_step - t["rate"]) > 0.3 * t["rate"]:
            out.append("drift %.3f ms a step, measured %.3f" % (e.drift_seconds_per_step * 1e3, t["rate"] * 1e3))
        # The drift costs 0 at its first step and grows 0.5 ms a step, next to ~2 ms sd of
        # step-to-step noise in the own-time excess: no one sees where it starts to the step. A
        # since-step 10 steps early claims at most 5 ms (~15 % of a step) that were not there;
        # more than 10 steps before it began, or 30 steps (15 ms) after, is wrong.
        if not t["first"] - 10 <= e.since_step <= t["first"] + 30:
            out.append("since step %d, the drift began at step %d" % (e.since_step, t["first"]))
    return out


def judge(outcome):
    """(failures, facts): what is wrong with the run's verdicts (the final one; for a balanced
    run any straggler or creep verdict while it ran too), and the figures of the run: truth,
    the final verdict's figures, and the first step whose window got the right verdict (label,
    culprit and pattern; its figures are judged at the end)."""
    case, final = outcome["case"], outcome["final"]
    t = truth(outcome)
    failures = verdict_failures(case, final, t)
    watched = [d for _, d in outcome["watch"].diagnoses] + [final]
    facts = dict(truth=t, final="%s\n  step note: %s\n  memory note: %s" % (
        describe(final), final.step.note, final.memory.note))
    if case == "balanced":
        wrong = [describe(d) for d in watched if verdict_failures(case, d, t)]
        creep = [describe(d) for d in watched
                 if service_pb2.MemoryDiagnosisLabel.Name(d.memory.label) in CREEP_LABELS]
        facts.update(false_straggler=len(wrong) > 0, false_creep=len(creep) > 0)
        if wrong:
            failures.append("a straggler while it ran: %s (%d of %d diagnoses)" % (wrong[0], len(wrong), len(watched)))
        if creep:
            failures.append("a memory creep while it ran: %s (%d of %d diagnoses)" % (creep[0], len(creep), len(watched)))
        return failures, facts
    first_right = next((d for d in watched if not verdict_failures(case, d, t, figures=False)), None)
    onset = {"stall": t.get("first"), "drift": t.get("first"), "leak": 0}[case]
    window = (lambda d: d.memory.window) if case == "leak" else (lambda d: d.step.window)
    facts["detected_at"] = window(first_right).last_step if first_right is not None else None
    facts["detection_steps"] = (facts["detected_at"] - onset) if first_right is not None else None
    e, m = final.step.straggler, final.memory
    facts.update(period=e.period_steps, stall=e.stall_seconds, rate=e.drift_seconds_per_step,
                 since=e.since_step, pattern=e.pattern, creep=m.creep_bytes_per_step)
    return failures, facts
