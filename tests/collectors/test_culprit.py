"""Acceptance of issue #15, item 1: the culprit is named wherever its time goes. Real 4-rank
PyTorch DDP jobs (gloo on CPU, collectors/python/examples/ddp_example.py) in which one rank
spends extra time (a sleep, as the host of a GPU job waits for its kernels) in host code
between forward and backward, in the backward of a custom autograd op applied to the model's
output (before the gradient reaches the instrumented model), or inside optimizer.step; and a
balanced job. rankwatchd must name that rank with a cause that says where the time went
(outside every measured phase, or the optimizer), and no straggler in the balanced job.

Each test also reads the job's step records back from Kafka and prints the raw facts per rank
(per-step means of step time, every phase, own time = step - collective), so that a failure
shows whether the data or the diagnosis is wrong. RANKWATCH_TEST_STEPS sets the steps (40)."""
import os
import unittest

from harness import DaemonTestCase, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2
from step_records import format_summary, own_spread, read_batches, steps_by_rank, summary
from torch_job import DIAGNOSED_JOB_ARGS, TorchJob, torch_available

STEPS = int(os.environ.get("RANKWATCH_TEST_STEPS", "40"))
# The slow rank's extra time a step: ~30 % of the balanced job's ~35 ms step on the
# development VM (own time ~26 ms), an own-time score near 0.2 against the 0.10 threshold.
SLOW_MS = "10"
STRAGGLER_LABELS = ("STEP_STRAGGLER", "STEP_INPUT_STRAGGLER", "STEP_COMPUTE_STRAGGLER")


@unittest.skipUnless(torch_available(), "torch is not installed for this interpreter (scripts/venv.sh)")
class CulpritTest(DaemonTestCase):

    def run_job(self, job, *args):
        """Runs the job, prints its per-rank facts and the diagnosis; returns (diagnosis, rows)."""
        ranks = TorchJob(self.fleet.workdir, job, self.brokers, STEPS, *DIAGNOSED_JOB_ARGS,
                         *args).wait(timeout=240)
        for r in ranks:
            self.assertEqual(r["steps"], STEPS)
            self.assertEqual(r["collector"]["records_dropped"], 0, r["collector"])
            self.assertEqual(r["collector"]["batches_failed"], 0, r["collector"])
        wait_until(lambda: metric(parse_metrics(scrape(self.daemon)), "rankwatch_steps_aligned_total",
                                  training_job=job) == STEPS, 60, "%s: every step aligned" % job)
        d = self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)
        batches = read_batches(self.brokers, job)
        for b in batches:
            self.assertEqual((b.source.training_strategy, b.source.sharded), ("ddp", False))
        rows = summary(steps_by_rank(batches))
        print("\n%s %s\n%s" % (job, " ".join(args), format_summary(rows)))
        print("diagnosis: %s, culprit ranks %s, cause %s, culprit phase %s, scores: own %.3f "
              "compute %.3f input %.3f\nnote: %s" % (
                  service_pb2.StepDiagnosisLabel.Name(d.step.label), list(d.step.culprit_ranks),
                  service_pb2.StragglerCause.Name(d.step.cause), service_pb2.Phase.Name(d.step.culprit_phase),
                  d.step.scores.own, d.step.scores.compute, d.step.scores.input, d.step.note))
        return d, rows

    def run_slow(self, job, rank, where):
        d, rows = self.run_job(job, "--fault-slow-rank", str(rank), "--fault-slow-ms", SLOW_MS,
                               "--fault-slow-where", where)
        # The facts first: the slow rank's own time is the highest, by most of the extra time.
        _, worst, excess, _, _ = own_spread(rows)
        self.assertEqual(worst, rank, "the slow rank's own time is not the highest")
        self.assertGreater(excess, 0.6 * float(SLOW_MS))
        self.assertIn(service_pb2.StepDiagnosisLabel.Name(d.step.label), STRAGGLER_LABELS, d.step.note)
        self.assertEqual(list(d.step.culprit_ranks), [rank], d.step.note)
        return d

    def test_time_between_forward_and_backward_is_outside_the_phases(self):
        d = self.run_slow("culprit-between", 2, "between")
        self.assertEqual(service_pb2.StragglerCause.Name(d.step.cause), "CAUSE_OUTSIDE", d.step.note)
        self.assertEqual(service_pb2.Phase.Name(d.step.culprit_phase), "PHASE_OUTSIDE", d.step.note)

    def test_a_slow_custom_autograd_op_is_outside_the_phases(self):
        d = self.run_slow("culprit-autograd", 1, "autograd")
        self.assertEqual(service_pb2.StragglerCause.Name(d.step.cause), "CAUSE_OUTSIDE", d.step.note)
        self.assertEqual(service_pb2.Phase.Name(d.step.culprit_phase), "PHASE_OUTSIDE", d.step.note)

    def test_a_slow_optimizer_step_is_compute_in_the_optimizer(self):
        d = self.run_slow("culprit-optimizer", 3, "optimizer")
        self.assertEqual(service_pb2.StragglerCause.Name(d.step.cause), "CAUSE_COMPUTE", d.step.note)
        self.assertEqual(service_pb2.Phase.Name(d.step.culprit_phase), "PHASE_OPTIMIZER", d.step.note)

    def test_a_balanced_job_has_no_culprit(self):
        d, rows = self.run_job("culprit-balanced")
        self.assertNotIn(service_pb2.StepDiagnosisLabel.Name(d.step.label), STRAGGLER_LABELS, d.step.note)
        self.assertEqual(list(d.step.culprit_ranks), [], d.step.note)


if __name__ == "__main__":
    unittest.main()
