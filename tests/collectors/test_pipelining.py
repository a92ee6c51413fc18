"""Acceptance of issue #49, "torch.distributed.pipelining with no code change": real jobs on
torch.distributed.pipelining's own schedules (tests/collectors/pipelining_job.py: 4 processes,
gloo on CPU, 2 pipeline ranks x 2 data replicas from a ("dp", "pp") DeviceMesh, a gradient
all-reduce across the replicas), recorded by `rw.instrument_pipeline(schedule)` alone (plus
`rw.instrument_optimizer`), no rw.step() or rw.op() in the loop, published to `rankwatch kafka`
and diagnosed by `rankwatchd`.

One launch of the job runs every case one after the other, each a rankwatch job of its own, and
one daemon judges them all (CI time): for each schedule (Schedule1F1B, ScheduleInterleaved1F1B,
ScheduleInterleavedZeroBubble), the job balanced, recorded by the adapter and by hand at once (the
script's own rw.op scopes around the same methods, into a second collector of each process and a
job of its own: two recordings of one run, so a loaded machine stretches both alike), then
balanced, with a slow worker (data rank 1, pipeline rank 0: 1.5x the device time) and with a
heavy stage (pipeline rank 1 holds 1.5x the layers on both replicas), recorded by the adapter
alone.

1. test_a: the what-if verdict at the end of each adapter job: the slow worker named by its data
   rank and stage, the heavy stage by its stage, and the balanced job with no culprit and no
   alert of warning or critical severity.
2. test_b: the same run recorded by hand and by the adapter: the same layout (the adapter's from
   the mesh and the schedule), the same ops per rank and step (kind, microbatch, model chunk),
   and each kind's ops within 5 % of the hand's (the median of the differences of the same ops,
   paired by step and microbatch; 25 us for ops under 0.5 ms: the first stage's empty
   input-gradient part in zero-bubble schedules, a send's post, short waits). The hand's scopes
   sit around the adapter's, so the hand's ops hold the adapter's own cost.

RANKWATCH_TEST_STEPS sets the recorded steps per case (16); RANKWATCH_PIPELINING_SCHEDULES the
schedules (1f1b,interleaved,zb); RANKWATCH_PIPELINING_DEVICE_MS each layer's device time (5)."""
import os
import statistics
import time
import unittest

from harness import DaemonTestCase, Fleet, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2, telemetry_pb2
from step_records import read_batches
from torch_job import TorchJob, torch_available

OPS = None  # rankwatch's op types (rankwatch.collector.OPS), for AdapterTest
try:
    from rankwatch.collector import OPS
except ImportError:  # the package is not built
    pass

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "pipelining_job.py")
STEPS = int(os.environ.get("RANKWATCH_TEST_STEPS", "16"))
# Each layer's device time a microbatch and pass. A balanced job on a loaded machine loses a
# few ms a step to late wake-ups whatever its ops last: with 3 ms a layer a CI run (two tests at
# once beside the sanitizer build) read S 1.050-1.063 and fired warnings; 5 ms halves that share.
DEVICE_MS = float(os.environ.get("RANKWATCH_PIPELINING_DEVICE_MS", "5"))
SCHEDULES = tuple(os.environ.get("RANKWATCH_PIPELINING_SCHEDULES", "1f1b,interleaved,zb").split(","))
PREFIX = "pipelining"
SEVERE = (service_pb2.SEVERITY_WARN, service_pb2.SEVERITY_CRIT)
TORCH = torch_available()  # once: a subprocess importing torch takes seconds
# (data rank, pipeline rank) -> rank: the mesh ("dp", "pp") of 2 x 2
RANK = {(d, s): d * 2 + s for d in range(2) for s in range(2)}


def job_id(schedule, fault, instrument="adapter"):
    return "%s-%s-%s-%s" % (PREFIX, schedule, fault, instrument)


def cases():
    out = []
    for s in SCHEDULES:
        out += ["%s:balanced:both" % s] + ["%s:%s:adapter" % (s, f) for f in ("balanced", "slow", "heavy")]
    return out


@unittest.skipUnless(TORCH, "torch is not installed for this interpreter (scripts/venv.sh)")
class PipeliningTest(DaemonTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        try:
            start = time.monotonic()
            args = [a for c in cases() for a in ("--case", c)]
            ranks = TorchJob(cls.fleet.workdir, PREFIX, cls.brokers, STEPS, "--device-ms", str(DEVICE_MS), *args,
                             script=JOB).wait(timeout=400)
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
            manual, adapter = job_id(schedule, "balanced", "manual"), job_id(schedule, "balanced", "both")
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
                print("\n%s: per rank and op kind (chunk), the median op by hand / adapter, ms" % schedule)
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
                            continue  # instrument_optimizer's, not the adapter's
                        # The same ops of one run, paired (step, microbatch): the median op of each
                        # recording, and the median of the pairs' differences.
                        ops = [{(n, o.microbatch): o.duration_us / 1e3 for n, s in steps[rank].items() for o in s.ops
                                if (o.type, o.model_chunk) == (kind, chunk)} for steps in (hand, auto)]
                        ms = [statistics.median(v.values()) for v in ops]
                        diff = statistics.median(abs(ops[0][k] - ops[1][k]) for k in ops[0])
                        bound = 0.05 * max(ms[0], 0.5)
                        off = sum(abs(ops[0][k] - ops[1][k]) > bound for k in ops[0])
                        line.append("%s/%d %.2f/%.2f%s" % (telemetry_pb2.OpType.Name(kind)[3:].lower(), chunk, *ms,
                                                           " (%d of %d ops apart)" % (off, len(ops[0])) if off else ""))
                        where = "rank %d %s chunk %d: by hand %.3f ms, adapter %.3f ms, median difference %.3f ms" % (
                            rank, telemetry_pb2.OpType.Name(kind), chunk, *ms, diff)
                        self.assertLessEqual(diff, bound, where)
                    print("  rank %d (step %.1f ms): %s" % (rank, step_ms, ", ".join(line)))


# --- the adapter in one process, on stand-ins for torch's stage and schedule -----------------------
class _P2POp:
    """A P2POp as the stage's get_*_ops return them: the adapter tags it."""


class _Stage:
    """The methods of a torch.distributed.pipelining stage the schedules call, each taking `ms`."""

    def __init__(self, index, num_stages, group_rank, mapping, ms=2.0):
        self.stage_index, self.num_stages, self.group_rank, self.group_size = index, num_stages, group_rank, 2
        self.stage_index_to_group_rank, self.ms = mapping, ms
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        self.group = None

    def _work(self):
        time.sleep(self.ms / 1e3)

    def forward_one_chunk(self, mb, *args, **kwargs):
        self._work()

    def backward_one_chunk(self, mb, loss=None, full_backward=True, last_backward=False):
        self._work()

    def backward_weight_one_chunk(self, mb, last_backward=False):
        self._work()

    def get_fwd_send_ops(self, mb):
        return [] if self.is_last else [_P2POp()]

    def get_fwd_recv_ops(self, mb):
        return [] if self.is_first else [_P2POp()]

    def get_bwd_send_ops(self, mb):
        return [] if self.is_first else [_P2POp()]

    def get_bwd_recv_ops(self, mb):
        return [] if self.is_last else [_P2POp()]


class _Schedule:
    """A runtime schedule's way with one microbatch on a V's rank 0 (stages 0 and 3 of 4): sends
    posted after their compute and waited for at the end of step(), a receive posted early and
    waited for before its forward, the loss after the last stage's forward, I and W apart, and
    an exchange posted and waited at once. Transfers go through the module functions the adapter
    wraps."""

    def __init__(self, stages, schedules):
        self._stages, self.s = stages, schedules
        self._has_backward, self._loss_fn = True, object()
        self.loss_ends = []

    def _maybe_compute_loss(self, stage, *args):
        if stage.is_last:
            time.sleep(0.002)  # the loss: part of the last stage's forward op
            self.loss_ends.append(time.monotonic_ns())  # rankwatch's clock (now_ns)

    def step(self, *args, **kwargs):
        s, (first, last) = self.s, self._stages
        recv = s._batch_p2p(last.get_fwd_recv_ops(0))       # posted early
        first.forward_one_chunk(0)
        self._maybe_compute_loss(first)
        sends = [s._batch_p2p(first.get_fwd_send_ops(0))]
        s._wait_batch_p2p(recv)                              # waited for before its forward
        last.forward_one_chunk(0)
        self._maybe_compute_loss(last)
        last.backward_one_chunk(0, full_backward=False)
        last.backward_weight_one_chunk(0)
        both = s._batch_p2p(last.get_bwd_send_ops(0) + first.get_bwd_recv_ops(0))
        s._wait_batch_p2p(both)                              # posted and waited at once
        first.backward_one_chunk(0, full_backward=False)
        first.backward_weight_one_chunk(0)
        time.sleep(0.001)
        for w in sends:
            s._wait_batch_p2p(w)                             # the sends, at the end of step()


class _Calls:
    """The native collector with its add_op and begin_step calls logged."""

    def __init__(self, native):
        self._n, self.log = native, []

    def add_op(self, *args):
        self.log.append(("op",) + tuple(args))
        return self._n.add_op(*args)

    def begin_step(self, step):
        self.log.append(("step", step))
        return self._n.begin_step(step)

    def set_device_times(self, step, phases, ops, missing=False):
        self.log.append(("device", step, len(ops), missing))
        return self._n.set_device_times(step, phases, ops, missing)

    def __getattr__(self, name):
        return getattr(self._n, name)


@unittest.skipUnless(TORCH, "torch is not installed for this interpreter (scripts/venv.sh)")
class AdapterTest(unittest.TestCase):
    """rw.instrument_pipeline on stand-ins (no job, no broker read back): the ops, their times,
    microbatch and chunk (a V's rank 0: stages 0 and 3 are chunks 0 and 1), the steps it opens,
    eval() and pause(); and the same with a device clock (an emulated device)."""

    @classmethod
    def setUpClass(cls):
        import torch.distributed.pipelining.schedules as schedules
        cls.schedules = schedules
        # torch's transfer functions, stood in for below the adapter's wrappers (this process
        # runs no real pipeline).
        cls.saved = (schedules._batch_p2p, schedules._wait_batch_p2p)
        schedules._batch_p2p = lambda ops, *a, **k: [object() for _ in ops]
        schedules._wait_batch_p2p = lambda works: time.sleep(0.0005 * len(works))
        from rankwatch import pipelining
        pipelining._patched = False  # the adapter wraps the stand-ins
        cls.fleet = Fleet()  # a broker: a collector with none waits for it at exit
        cls.brokers = cls.fleet.start_broker(partitions=1)

    def run_job(self, device_timing=False):
        import rankwatch
        rw = rankwatch.init(job="adapter-test", brokers=self.brokers, rank=0, world_size=4,
                            device_timing=device_timing, control_topic="", watch_gc=False)
        calls = rw._native = _Calls(rw._native)
        mapping = {0: 0, 1: 1, 2: 1, 3: 0}  # the V of 2 ranks
        stages = [_Stage(3, 4, 0, mapping), _Stage(0, 4, 0, mapping)]
        schedule = _Schedule(sorted(stages, key=lambda st: st.stage_index), self.schedules)
        self.assertIs(rw.instrument_pipeline(schedule), schedule)
        self.loss_ends = schedule.loss_ends
        for _ in range(3):
            schedule.step()
        schedule._has_backward = False  # eval(): forward only, recorded nowhere
        schedule.step()
        schedule._has_backward = True
        with rw.pause():
            schedule.step()
        schedule.step()
        rw.close(final=False, timeout_s=5)
        return calls.log, rw

    def check(self, log, host_times=True):
        steps = [e[1] for e in log if e[0] == "step"]
        self.assertEqual(steps, [0, 1, 2, 3])  # eval and the paused step opened none
        per_step, current = {}, None
        for e in log:
            if e[0] == "step":
                current = per_step.setdefault(e[1], [])
            elif e[0] == "op":
                current.append(e[1:])
        names = {v: k for k, v in OPS.items()}
        for step, ops in per_step.items():
            got = sorted((names[t], mb, chunk) for t, mb, chunk, _, _ in ops)
            self.assertEqual(got, sorted([
                ("forward-compute", 0, 0), ("forward-send", 0, 0), ("forward-recv", 0, 1),
                ("forward-compute", 0, 1), ("backward-compute", 0, 1), ("backward-weight-compute", 0, 1),
                ("backward-send", 0, 1), ("backward-recv", 0, 0), ("backward-compute", 0, 0),
                ("backward-weight-compute", 0, 0)]), step)
            by = {(names[t], chunk): (b, e) for t, mb, chunk, b, e in ops}
            ms = {k: (e - b) / 1e6 for k, (b, e) in by.items()}
            self.assertEqual(by[("backward-send", 1)], by[("backward-recv", 0)])  # the exchange
            if not host_times:
                continue
            # Orders, not durations (sleeps stretch on a loaded machine):
            # the last stage's forward holds its loss; the first's ends before its send's post;
            fc0, fs0, fr1, fc1 = (by[k] for k in (("forward-compute", 0), ("forward-send", 0),
                                                  ("forward-recv", 1), ("forward-compute", 1)))
            self.assertGreaterEqual(fc1[1], self.loss_ends[(0, 1, 2, 5)[step]])  # 3, 4: eval, paused
            self.assertGreaterEqual(ms[("forward-compute", 0)], 2.0)
            self.assertLessEqual(fc0[1], fs0[0])
            # a send waited for at the end of step() is its post; a receive posted before the
            # first stage's forward spans its wait alone, before its forward;
            self.assertLessEqual(fs0[1], fr1[0])
            self.assertLessEqual(fr1[1], fc1[0])
            # the exchange, posted and waited at once, spans both (the wait: 1 ms).
            self.assertGreaterEqual(ms[("backward-send", 1)], 1.0)

    def test_ops_steps_and_chunks(self):
        log, rw = self.run_job()
        self.check(log)
        self.assertEqual(rw.layout, None)  # group None and world 4: no regular order (stand-ins)

    def test_with_a_device_clock_the_ops_have_device_times(self):
        from emulated_device import Device
        device = Device()
        try:
            log, _ = self.run_job(device_timing=device.clock())
        finally:
            device.close()
        # Host times only roughly: the emulated device's streams are Python threads, which
        # hold the GIL the host's ops wait for.
        self.check(log, host_times=False)
        device_times = [e for e in log if e[0] == "device"]
        self.assertEqual([e[1] for e in device_times], [0, 1, 2, 3])
        self.assertTrue(all(e[2] == 10 and not e[3] for e in device_times), device_times)

    @classmethod
    def tearDownClass(cls):
        from rankwatch import pipelining
        cls.schedules._batch_p2p, cls.schedules._wait_batch_p2p = cls.saved
        pipelining._patched = False
        cls.fleet.close()


if __name__ == "__main__":
    unittest.main()
