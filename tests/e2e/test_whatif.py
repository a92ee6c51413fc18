"""Issue #34, acceptance 1: the what-if study's two shared jobs (tests/fixtures/whatif-stragglers),
replayed through Kafka into `rankwatchd`, give the study's own results within 2 %: the slowdown S,
S by data-parallel rank, by stage and by op type, M_W and M_S; AR is a slow worker (data rank 0,
stage 0), ST a stage imbalance (stage 3). `RANKWATCH_WHATIF_EXTRA` may name more folders laid out
the same way (a job of the study not in the repository) that must agree too."""
import json
import os
import subprocess
import unittest

from harness import BIN, DaemonTestCase, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2

FIXTURES = os.environ.get("RANKWATCH_FIXTURES",
                          os.path.join(os.path.dirname(__file__), "..", "fixtures"))
WHATIF = os.path.join(FIXTURES, "whatif-stragglers")
TOLERANCE = 0.02


def expected(folder):
    name = os.path.basename(os.path.normpath(folder))
    with open(os.path.join(folder, "result-%s.json" % name)) as f:
        result = json.load(f)
    with open(os.path.join(folder, "mw-%s.json" % name)) as f:
        mw = json.load(f)["Mw"]
    with open(os.path.join(folder, "ms-%s.json" % name)) as f:
        ms = json.load(f)["Ms"]
    return result, mw, ms


class WhatIfReplayTest(DaemonTestCase):
    def replay(self, job, folder):
        cmd = [os.path.join(BIN, "rankwatch"), "replay", "--brokers", self.brokers, "--job", job, folder]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout.strip().splitlines()[-1])

    def diagnosis(self, job, steps):
        def ready():
            try:
                d = self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job), timeout=5)
            except Exception:  # noqa: BLE001 - not there yet
                return None
            return d if d.HasField("whatif") and d.whatif.steps >= steps else None
        return wait_until(ready, 120, "the what-if of %s over %d steps" % (job, steps), interval=0.5)

    def assert_close(self, got, want, what):
        self.assertLessEqual(abs(got - want), TOLERANCE * abs(want), "%s: %.4f, the study %.4f" % (what, got, want))

    def assert_share_close(self, got, want, what):
        """M_W and M_S are shares of the slowdown (0..1, near 0 when the group explains nothing):
        within 2 percentage points."""
        self.assertLessEqual(abs(got - want), TOLERANCE, "%s: %.4f, the study %.4f" % (what, got, want))

    def check_job(self, folder, job):
        result, mw, ms = expected(folder)
        out = self.replay(job, folder)
        self.assertEqual(out["failed"], 0)
        steps = len(result["step_t_noblk"])
        d = self.diagnosis(job, steps)
        w = d.whatif
        meta = result["job_meta"]
        self.assertEqual((w.data_parallel_size, w.pipeline_size, w.tensor_parallel_size),
                         (meta["dp_size"], meta["pp_size"], meta["tp_size"]))
        self.assertGreaterEqual(w.steps, steps)  # a trace may hold steps the study left out (SE)
        self.assertEqual(w.skipped_steps, 0, w.skipped_reason)
        self.assert_close(w.slowdown, result["blocking_slowdown"], "S")
        for dp, want in result["blocking_decompose_by_dp_rank"].items():
            self.assert_close(w.slowdown_by_data_rank[int(dp)], want, "S of data rank %s" % dp)
        for stage, want in result["blocking_decompose_by_stage"].items():
            self.assert_close(w.slowdown_by_stage[int(stage)], want, "S of stage %s" % stage)
        groups = {g.name: g.slowdown for g in w.slowdown_by_op_group}
        for name, want in result["blocking_decompose_by_optype"].items():
            name = "grads-all-reduce" if name == "separate-grads-all-reduce" else name
            self.assertIn(name, groups)
            self.assert_close(groups[name], want, "S of %s" % name)
        self.assert_share_close(w.m_w, mw, "M_W")
        self.assert_share_close(w.m_s, ms, "M_S (the last stage)")
        return d

    def test_ar_is_one_slow_worker(self):
        d = self.check_job(os.path.join(WHATIF, "AR"), "whatif-ar")
        w = d.whatif
        self.assertEqual(w.verdict, "slow_worker", w.note)
        self.assertEqual((w.culprit_data_rank, w.culprit_stage), (0, 0), w.note)
        # The worker's ranks: data rank 0 of stage 0, its four tensor ranks.
        self.assertEqual(list(w.culprit_ranks), [0, 1, 2, 3])
        self.assertIn("data rank 0, stage 0", w.note)
        # The step-time diagnosis of a pipeline job says what the what-if says.
        self.assertEqual(service_pb2.StepDiagnosisLabel.Name(d.step.label), "STEP_STRAGGLER")
        self.assertEqual(list(d.step.culprit_ranks), [0, 1, 2, 3])
        self.assertTrue(d.step.note.startswith("pipeline job, what-if slow_worker: "), d.step.note)
        samples = parse_metrics(scrape(self.daemon))
        self.assertEqual(metric(samples, "rankwatch_whatif_verdict", training_job="whatif-ar",
                                verdict="slow_worker"), 1)
        self.assertAlmostEqual(metric(samples, "rankwatch_whatif_slowdown", training_job="whatif-ar"),
                               w.slowdown, places=6)
        # The flat diagnosis does not raise its own straggler alert beside the what-if's.
        r = subprocess.run([os.path.join(BIN, "rankwatch"), "diagnose", "--server",
                            self.daemon.endpoints["grpc"], "--job", "whatif-ar"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("WHAT-IF    slow worker", r.stdout)
        self.assertIn("stage\\dp", r.stdout)

    def test_st_is_a_stage_imbalance(self):
        d = self.check_job(os.path.join(WHATIF, "ST"), "whatif-st")
        w = d.whatif
        self.assertEqual(w.verdict, "stage_imbalance", w.note)
        self.assertEqual(w.culprit_stage, 3, w.note)
        self.assertGreater(w.move_fraction, 0.0)
        samples = parse_metrics(scrape(self.daemon))
        self.assertEqual(metric(samples, "rankwatch_whatif_verdict", training_job="whatif-st",
                                verdict="stage_imbalance"), 1)

    def test_simulated_3d_jobs_live(self):
        """`rankwatch simulate --parallel` jobs, live: a slow worker, a long last stage, and a
        balanced job that no verdict names; and torch's zero-bubble V schedule (weight-gradient
        ops, two model chunks a stage placed in a V) with a slow worker, and its balanced job."""
        one_f_one_b, zbv = "dp=2,pp=4,tp=2,mb=8", "dp=2,pp=4,tp=2,mb=8,schedule=zbv"
        cases = [
            ("sim-slow-worker", ["--fault", "slow-worker:dp=1,pp=2,factor=1.3"], "slow_worker", (1, 2), one_f_one_b),
            ("sim-stage", ["--fault", "stage-imbalance:stage=3,factor=1.3"], "stage_imbalance", (-1, 3), one_f_one_b),
            ("sim-balanced", [], "balanced", (-1, -1), one_f_one_b),
            ("sim-zbv-slow-worker", ["--fault", "slow-worker:dp=0,pp=1,factor=1.3"], "slow_worker", (0, 1), zbv),
            ("sim-zbv-balanced", [], "balanced", (-1, -1), zbv),
        ]
        for job, fault, verdict, _, parallel in cases:
            self.fleet.simulate(self.brokers, "--job", job, "--parallel", parallel, "--steps", "30",
                                "--step-ms", "40", "--speed", "max", *fault)
        for job, _, verdict, (dp, stage), _ in cases:
            with self.subTest(job=job):
                d = self.diagnosis(job, 20)
                w = d.whatif
                self.assertEqual(w.verdict, verdict, w.note)
                # The flat diagnosis does not blame the last stage's ranks of a balanced 1F1B job.
                label = service_pb2.StepDiagnosisLabel.Name(d.step.label)
                if verdict == "balanced":
                    self.assertNotIn("STRAGGLER", label, d.step.note)
                else:
                    self.assertEqual(label, "STEP_STRAGGLER", d.step.note)
                self.assertEqual((w.data_parallel_size, w.pipeline_size, w.tensor_parallel_size), (2, 4, 2))
                if stage >= 0:
                    self.assertEqual(w.culprit_stage, stage, w.note)
                if dp >= 0:
                    self.assertEqual(w.culprit_data_rank, dp, w.note)
                    # Megatron's order: rank = (stage x dp + data rank) x tp + tensor rank.
                    self.assertEqual(list(w.culprit_ranks), [(stage * 2 + dp) * 2, (stage * 2 + dp) * 2 + 1])

    def test_more_jobs_of_the_study(self):
        extra = [p for p in os.environ.get("RANKWATCH_WHATIF_EXTRA", "").split(":") if p]
        if not extra:
            self.skipTest("RANKWATCH_WHATIF_EXTRA names no other job of the study")
        for i, folder in enumerate(extra):
            with self.subTest(folder=folder):
                self.check_job(folder, "whatif-extra-%d" % i)


if __name__ == "__main__":
    unittest.main()
