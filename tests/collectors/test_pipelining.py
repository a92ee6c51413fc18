"""Acceptance of issue #49, "torch.distributed.pipelining with no code change": real jobs on
torch.distributed.pipelining's own schedules (tests/collectors/pipelining_job.py: 4 processes,
gloo on CPU, 2 pipeline ranks x 2 data replicas from a ("dp", "pp") DeviceMesh, a gradient
all-reduce across the replicas), recorded by `rw.instrument_pipeline(schedule)` alone (plus
`rw.instrument_optimizer`), no rw.step() or rw.op() in the loop, published to `rankwatch kafka`
and diagnosed by `rankwatchd`.

One launch of the job runs every case one after the other, each a rankwatch job of its own, and
one daemon judges them all (CI time): for each schedule (Schedule1F1B, ScheduleInterleaved1F1B,
ScheduleInterleavedZeroBubble), the job balanced and recorded by hand (the script's own op scopes
around the same methods), then balanced, with a slow worker (data rank 1, pipeline rank 0: 1.5x
the device time), and with a heavy stage (pipeline rank 1 holds 1.5x the layers on both
replicas), recorded by the adapter.

1. test_a: the what-if verdict at the end of each adapter job: the slow worker named by its data
   rank and stage, the heavy stage by its stage, and the balanced job with no culprit and no
   alert of warning or critical severity.
2. test_b: the same job recorded by hand and by the adapter: the same layout (the adapter's from
   the mesh and the schedule), the same ops per rank and step (kind, microbatch, model chunk),
   each compute kind's median op within 5 % of the hand's (25 us for ops under 0.5 ms: the first
   stage's empty input-gradient part in zero-bubble schedules); each transfer kind's time a step
   (waits of a few hundred microseconds, mostly noise; median over the steps) within 5 % of the
   step.

RANKWATCH_TEST_STEPS sets the recorded steps per case (20); RANKWATCH_PIPELINING_SCHEDULES the
schedules (1f1b,interleaved,zb)."""
import os
import statistics
import time
import unittest

from harness import DaemonTestCase, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2, telemetry_pb2
from step_records import read_batches
from torch_job import TorchJob, torch_available

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "pipelining_job.py")
STEPS = int(os.environ.get("RANKWATCH_TEST_STEPS", "16"))
SCHEDULES = tuple(os.environ.get("RANKWATCH_PIPELINING_SCHEDULES", "1f1b,interleaved,zb").split(","))
PREFIX = "pipelining"
SEVERE = (service_pb2.SEVERITY_WARN, service_pb2.SEVERITY_CRIT)
COMPUTE = (telemetry_pb2.OP_FORWARD_COMPUTE, telemetry_pb2.OP_BACKWARD_COMPUTE,
           telemetry_pb2.OP_BACKWARD_WEIGHT_COMPUTE)
# (data rank, pipeline rank) -> rank: the mesh ("dp", "pp") of 2 x 2
RANK = {(d, s): d * 2 + s for d in range(2) for s in range(2)}


def job_id(schedule, fault, instrument="adapter"):
    return "%s-%s-%s-%s" % (PREFIX, schedule, fault, instrument)


def cases():
    out = []
    for s in SCHEDULES:
        out += ["%s:balanced:manual" % s, "%s:balanced:adapter" % s, "%s:slow:adapter" % s, "%s:heavy:adapter" % s]
    return out


@unittest.skipUnless(torch_available(), "torch is not installed for this interpreter (scripts/venv.sh)")
class PipeliningTest(DaemonTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        try:
            start = time.monotonic()
            args = [a for c in cases() for a in ("--case", c)]
            ranks = TorchJob(cls.fleet.workdir, PREFIX, cls.brokers, STEPS, *args, script=JOB).wait(timeout=400)
            cls.job_seconds = time.monotonic() - start
            cls.results = {}  # job -> [rank's case result]
            for r in ranks:
                for c in r["cases"]:
                    cls.results.setdefault(c["job"], []).append(dict(c, rank=r["rank"]))
            for job in cls.results:
                wait_until(lambda job=job: metric(parse_metrics(scrape(cls.daemon)), "rankwatch_steps_aligned_total",
                                                  training_job=job) == STEPS, 60, "%s: every step aligned" % job)
            time.sleep(1)  # the last evaluation of the last job's window
            cls.diagnoses = {job: cls.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job),
                                                        timeout=10) for job in cls.results}
            print("\n%d cases in one launch of 4 processes: %.1f s" % (len(cls.results), cls.job_seconds))
        except BaseException:
            super().tearDownClass()
            raise

    def alerts(self, job):
        """Every alert of `job` the daemon stored (pending, firing, resolved)."""
        return list(self.stub.WatchAlerts(service_pb2.WatchAlertsRequest(training_job=job, backlog_only=True),
                                          timeout=10))

    def describe(self, job):
        d = self.diagnoses[job]
        w = d.whatif
        steps = statistics.median(s for r in self.results[job] for s in r["step_seconds"]) * 1e3
        return ("%s: median step %.1f ms; what-if %s (S %.3f, by data rank %s, by stage %s, M_W %.2f, M_S %.2f), "
                "culprit data rank %d stage %d ranks %s, severity %s; analysed %d, skipped %d%s\n  note: %s" % (
                    job, steps, w.verdict, w.slowdown, ["%.3f" % v for v in w.slowdown_by_data_rank],
                    ["%.3f" % v for v in w.slowdown_by_stage], w.m_w, w.m_s, w.culprit_data_rank, w.culprit_stage,
                    list(w.culprit_ranks), service_pb2.Severity.Name(w.severity), w.analysed_steps,
                    w.skipped_steps, " (%s)" % w.skipped_reason if w.skipped_reason else "", w.note))

    # --- 1. the verdicts -----------------------------------------------------------------------
    def test_a_verdicts_of_each_schedule(self):
        for schedule in SCHEDULES:
            for fault, verdict, culprit in (("slow", ("slow_worker",), (1, 0)), ("heavy", ("stage_imbalance",), (-1, 1)),
                                            ("balanced", ("balanced", "unattributed"), (-1, -1))):
                job = job_id(schedule, fault)
                with self.subTest(job=job):
                    print(self.describe(job))
                    for r in self.results[job]:
                        self.assertEqual(r["layout_source"], "device_mesh", r)
                        self.assertEqual(r["collector"]["records_dropped"], 0, r["collector"])
                    w = self.diagnoses[job].whatif
                    self.assertEqual((w.data_parallel_size, w.pipeline_size), (2, 2))
                    self.assertIn(w.verdict, verdict, w.note)
                    self.assertEqual((w.culprit_data_rank, w.culprit_stage), culprit, w.note)
                    if fault == "slow":
                        self.assertEqual(list(w.culprit_ranks), [RANK[culprit]])
                    if fault == "balanced":
                        self.assertEqual(w.severity, service_pb2.SEVERITY_INFO, w.note)
                        severe = [(a.subject, service_pb2.Severity.Name(a.severity)) for a in self.alerts(job)
                                  if a.severity in SEVERE]
                        self.assertEqual(severe, [], "alerts of a balanced job")

    # --- 2. the adapter records what the hand records -----------------------------------------------
    def test_b_the_adapter_records_what_a_hand_instrumented_job_records(self):
        for schedule in SCHEDULES:
            manual, adapter = job_id(schedule, "balanced", "manual"), job_id(schedule, "balanced")
            with self.subTest(schedule=schedule):
                by_job = {}
                for job in (manual, adapter):
                    batches = read_batches(self.brokers, job)
                    layouts, steps = {}, {}
                    for b in batches:
                        layouts[b.source.rank] = (b.source.layout.data_rank, b.source.layout.data_size,
                                                  b.source.layout.pipeline_rank, b.source.layout.pipeline_size,
                                                  max(1, b.source.layout.virtual_stages))
                        for s in b.steps:
                            steps.setdefault(b.source.rank, {})[s.step] = s
                    by_job[job] = (layouts, steps)
                (hand_layout, hand), (auto_layout, auto) = by_job[manual], by_job[adapter]
                chunks = 1 if schedule == "1f1b" else 2
                self.assertEqual(hand_layout, {RANK[(d, s)]: (d, 2, s, 2, chunks) for d in range(2) for s in range(2)})
                self.assertEqual(auto_layout, hand_layout)
                print("\n%s: per rank and op kind (chunk), by hand / adapter, ms: compute, the median op; "
                      "transfers, the median step's total" % schedule)
                for rank in sorted(hand):
                    self.assertEqual(sorted(hand[rank]), list(range(STEPS)), rank)
                    self.assertEqual(sorted(auto[rank]), list(range(STEPS)), rank)
                    for step in range(STEPS):
                        ops = [sorted((o.type, o.microbatch, o.model_chunk) for o in steps[rank][step].ops
                                      if o.type != telemetry_pb2.OP_GC)  # GC pauses come when they come
                               for steps in (hand, auto)]
                        self.assertEqual(ops[1], ops[0], "rank %d step %d" % (rank, step))
                    step_ms = statistics.median(s.step_time_ns for s in hand[rank].values()) / 1e6
                    kinds = sorted({(o.type, o.model_chunk) for o in hand[rank][0].ops if o.type != telemetry_pb2.OP_GC})
                    line = []
                    for kind, chunk in kinds:
                        if kind == telemetry_pb2.OP_OPTIMIZER:
                            continue  # instrument_optimizer's, not the adapter's (and 0.4 ms of CPU: noise)
                        if kind in COMPUTE:  # each op a sleep of its device time: the median op
                            ms = [statistics.median(o.duration_us for s in steps[rank].values() for o in s.ops
                                                    if (o.type, o.model_chunk) == (kind, chunk)) / 1e3
                                  for steps in (hand, auto)]
                            bound = 0.05 * max(ms[0], 0.5)
                        else:  # waits: a step's total, within 5 % of the step
                            ms = [statistics.median(sum(o.duration_us for o in s.ops if (o.type, o.model_chunk) == (kind, chunk))
                                                    for s in steps[rank].values()) / 1e3 for steps in (hand, auto)]
                            bound = 0.05 * step_ms
                        line.append("%s/%d %.2f/%.2f" % (telemetry_pb2.OpType.Name(kind)[3:].lower(), chunk, *ms))
                        where = "rank %d %s chunk %d: by hand %.3f ms, adapter %.3f ms" % (
                            rank, telemetry_pb2.OpType.Name(kind), chunk, *ms)
                        self.assertLessEqual(abs(ms[1] - ms[0]), bound, where)
                    print("  rank %d (step %.1f ms): %s" % (rank, step_ms, ", ".join(line)))


if __name__ == "__main__":
    unittest.main()
