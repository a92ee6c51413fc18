"""Acceptance of issue #47, item 2: verdicts that hold still on real jobs while another job loads
the machine.

Each run starts a second real 4-process DDP job without rankwatch (ddp_example.py
--no-rankwatch: gloo all-reduces, real compute) on the same cores, then one job under test
through `rankwatch kafka` and `rankwatchd`:

* a pipeline job (collectors/python/examples/pipeline_example.py: 2 stages x 2 replicas, 1F1B,
  every op recorded) whose stage 0 holds 1.5x the layers: `stage_imbalance` on stage 0 at the
  end, no alert of the job ever carried a `sequence_imbalance` verdict, and every warning or
  critical alert of the job named stage 0;
* the same pipeline job, balanced, whose rank 2 (data rank 0, stage 1) runs a full garbage
  collection as every 5th step begins: `gc_pauses` on rank 2 at the end, no `sequence_imbalance`
  alert, every warning or critical alert naming rank 2;
* a balanced pipeline job and a balanced DDP job: no alert of the job ever reached warning or
  critical severity (pending, firing or resolved).

While the job runs, its diagnosis is sampled every half second and the verdicts it went
through are printed. RANKWATCH_STABILITY_RUNS sets the runs of each case (1 in ctest;
scripts/acceptance/verdict_stability.sh runs 3); RANKWATCH_TEST_STEPS the steps of the
pipeline jobs (100)."""
import os
import threading
import time
import unittest

from alert_client import Watcher
from harness import DaemonTestCase, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2
from torch_job import DIAGNOSED_JOB_ARGS, TorchJob, torch_available

HERE = os.path.dirname(os.path.abspath(__file__))
PIPELINE = os.path.join(HERE, "../../collectors/python/examples/pipeline_example.py")
RUNS = int(os.environ.get("RANKWATCH_STABILITY_RUNS", "1"))
STEPS = int(os.environ.get("RANKWATCH_TEST_STEPS", "100"))
DDP_STEPS = 3 * STEPS
PIPELINE_JOB_ARGS = ("--hidden", "48", "--device-ms", "4")  # as test_pipeline_job.py
# The diagnosed DDP job of the other tests with a 1 ms input pipeline instead of 6 ms: with 6 ms
# the input takes ~20 % of a step, which is input-bound (a warning from 10 %), not balanced.
BALANCED_DDP_ARGS = ("--device-ms", "12", "--width", "64", "--input-ms", "1")
SEVERE = (service_pb2.SEVERITY_WARN, service_pb2.SEVERITY_CRIT)


class Sampler:
    """Samples a job's diagnosis every `interval` s in a thread: (time, what-if verdict, culprit
    stage, S, step label) whenever one of them changes."""

    def __init__(self, stub, job, interval=0.5):
        self.stub, self.job, self.interval = stub, job, interval
        self.changes = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        start, last = time.time(), None
        while not self._stop.is_set():
            try:
                d = self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=self.job), timeout=5)
            except Exception:  # the job is not known yet
                self._stop.wait(self.interval)
                continue
            w = d.whatif
            key = (w.verdict, w.culprit_stage, service_pb2.StepDiagnosisLabel.Name(d.step.label))
            if key != last:
                self.changes.append((round(time.time() - start, 1), w.verdict, w.culprit_stage,
                                     round(w.slowdown, 3), key[2]))
                last = key
            self._stop.wait(self.interval)

    def stop(self):
        self._stop.set()
        self._thread.join()


@unittest.skipUnless(torch_available(), "torch is not installed for this interpreter (scripts/venv.sh)")
class VerdictStabilityTest(DaemonTestCase):

    def setUp(self):
        # The other job on the machine: 4 processes, real compute and all-reduces, no rankwatch.
        self.load = TorchJob(self.fleet.workdir, "load-%s" % self.id().rsplit(".", 1)[-1], self.brokers,
                             1000000, "--no-rankwatch", *DIAGNOSED_JOB_ARGS)

    def tearDown(self):
        self.load.kill()

    def run_job(self, job, steps, *args, script=None):
        """Runs the job to its end under the load; returns (final diagnosis, its alerts, the
        sampled verdict changes)."""
        watcher = Watcher(self.daemon.endpoints["grpc"], job=job)
        sampler = Sampler(self.stub, job)
        kwargs = {} if script is None else {"script": script}
        try:
            TorchJob(self.fleet.workdir, job, self.brokers, steps, *args, **kwargs).wait(timeout=600)
            wait_until(lambda: metric(parse_metrics(scrape(self.daemon)), "rankwatch_steps_aligned_total",
                                      training_job=job) == steps, 60, "%s: every step aligned" % job)
            time.sleep(2)  # two more evaluations of the last window
            d = self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)
        finally:
            sampler.stop()
            watcher.stop()
        alerts = [a for a, _ in watcher.alerts]
        print("\n%s: load average %.1f; verdicts (s, what-if verdict, stage, S, step label):" % (
            job, os.getloadavg()[0]))
        for c in sampler.changes:
            print("  %s" % (c,))
        for a in alerts:
            print("  alert %s %s %s %s (what-if %s)" % (
                a.id, service_pb2.AlertState.Name(a.state), service_pb2.Severity.Name(a.severity), a.subject,
                a.evidence.whatif.verdict or "-"))
        print("  final: %s stage %d S %.3f; %s" % (d.whatif.verdict, d.whatif.culprit_stage, d.whatif.slowdown,
                                                   d.whatif.note or d.step.note))
        return d, alerts, sampler.changes

    def test_a_heavy_stage_0_is_a_stage_imbalance_every_run(self):
        for run in range(RUNS):
            with self.subTest(run=run):
                d, alerts, _ = self.run_job("pp-heavy-stage-%d" % run, STEPS, *PIPELINE_JOB_ARGS,
                                            "--fault-last-stage-layers-factor", "1.5", "--fault-heavy-stage", "0",
                                            script=PIPELINE)
                self.assertEqual((d.whatif.verdict, d.whatif.culprit_stage), ("stage_imbalance", 0), d.whatif.note)
                seq = [a for a in alerts if a.evidence.whatif.verdict == "sequence_imbalance"]
                self.assertEqual(seq, [], "a sequence_imbalance alert for a heavy stage")
                # Nor did the verdict flap to another culprit on the way.
                others = sorted({a.subject for a in alerts if a.severity in SEVERE} - {"stage:0"})
                self.assertEqual(others, [], "alerts naming another culprit than stage 0")

    def test_b_gc_pauses_on_rank_2_stay_gc_pauses(self):
        for run in range(RUNS):
            with self.subTest(run=run):
                d, alerts, _ = self.run_job("pp-gc-%d" % run, STEPS, *PIPELINE_JOB_ARGS, "--fault-gc-rank", "2",
                                            script=PIPELINE)
                self.assertEqual((d.whatif.verdict, list(d.whatif.culprit_ranks)), ("gc_pauses", [2]),
                                 d.whatif.note)
                seq = [a for a in alerts if a.evidence.whatif.verdict == "sequence_imbalance"]
                self.assertEqual(seq, [], "a sequence_imbalance alert beside GC pauses")
                others = sorted({a.subject for a in alerts if a.severity in SEVERE} - {"rank:2"})
                self.assertEqual(others, [], "alerts naming another culprit than rank 2")

    def test_c_a_balanced_pipeline_job_raises_no_alert(self):
        for run in range(RUNS):
            with self.subTest(run=run):
                d, alerts, _ = self.run_job("pp-balanced-%d" % run, STEPS, *PIPELINE_JOB_ARGS, script=PIPELINE)
                self.assertIn(d.whatif.verdict, ("balanced", "unattributed"), d.whatif.note)
                severe = [a for a in alerts if a.severity in SEVERE]
                self.assertEqual(severe, [], "alerts of a balanced pipeline job")

    def test_d_a_balanced_ddp_job_raises_no_alert(self):
        for run in range(RUNS):
            with self.subTest(run=run):
                d, alerts, _ = self.run_job("ddp-balanced-%d" % run, DDP_STEPS, *BALANCED_DDP_ARGS)
                severe = [a for a in alerts if a.severity in SEVERE]
                self.assertEqual(severe, [], "alerts of a balanced DDP job: %s" % d.step.note)


if __name__ == "__main__":
    unittest.main()
