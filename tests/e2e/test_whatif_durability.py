"""Issue #47: exact restarts of the what-if. A pipeline job (DP 2 x PP 4 x TP 2) with a slow worker
from step 30 runs in real time; a daemon is killed with SIGKILL after the onset has left the
what-if's 64-step window, and restarted on the same state directory. At the end its what-if
verdict, S (within 2 %) and since-step equal those of a reference daemon that ran through."""
import os
import signal
import time
import unittest

import grpc

from harness import BIN, Fleet, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2, service_pb2_grpc

JOB = "whatif-durable"
STEPS = 360
ONSET = 30
FAULT = "slow-worker:dp=1,pp=2,factor=1.3:%d" % ONSET


def diagnosis(daemon, job):
    stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(daemon.endpoints["grpc"]))
    return stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)


def aligned(daemon):
    try:
        return metric(parse_metrics(scrape(daemon)), "rankwatch_steps_aligned_total", training_job=JOB) or 0
    except OSError:  # the daemon is gone or not yet listening
        return 0


class WhatIfDurabilityTest(unittest.TestCase):
    def setUp(self):
        self.fleet = Fleet()

    def tearDown(self):
        self.fleet.close()

    def daemon(self, brokers, state_dir, group):
        args = ["--group", group, "--checkpoint-interval", "200ms"]
        return self.fleet.start_daemon(brokers, extra=args, state_dir=state_dir)

    def test_a_sigkilled_daemon_gives_the_verdict_s_and_since_step_of_one_that_ran_through(self):
        started = time.monotonic()
        brokers = self.fleet.start_broker()
        reference = self.daemon(brokers, os.path.join(self.fleet.workdir, "reference"), "reference")
        state = os.path.join(self.fleet.workdir, "crashing")
        victim = self.daemon(brokers, state, "crashing")
        sim = self.fleet.start("simulate", [
            os.path.join(BIN, "rankwatch"), "simulate", "--brokers", brokers, "--job", JOB,
            "--parallel", "dp=2,pp=4,tp=2,mb=8", "--steps", str(STEPS), "--step-ms", "40",
            "--speed", "realtime", "--fault", FAULT])
        # Killed once the onset left the window (step 30 + 64) and the verdict held for a while.
        wait_until(lambda: aligned(victim) >= 140, 60, "the victim's first 140 steps")
        before = diagnosis(victim, JOB)
        self.assertEqual(before.whatif.verdict, "slow_worker", before.whatif.note)
        self.assertGreater(before.whatif.first_step, ONSET)
        self.assertEqual(before.step.straggler.since_step, ONSET, before.step.note)
        victim.stop(signal.SIGKILL)
        victim = self.daemon(brokers, state, "crashing")
        # Served from the store at once: the what-if as the last checkpoint had it.
        restored = diagnosis(victim, JOB)
        self.assertEqual(restored.whatif.verdict, "slow_worker", restored.whatif.note)
        self.assertEqual(restored.step.straggler.since_step, ONSET, restored.step.note)
        self.assertEqual(sim.proc.wait(120), 0, sim.stderr())

        wait_until(lambda: aligned(reference) == STEPS, 60, "the reference daemon")
        wait_until(lambda: aligned(victim) == STEPS, 90, "the restarted daemon to catch up")
        time.sleep(1)  # both publish their final snapshots
        a, b = diagnosis(reference, JOB), diagnosis(victim, JOB)
        wa, wb = a.whatif, b.whatif
        # The reference: the slow worker, named since its onset long out of the window.
        self.assertEqual(wa.verdict, "slow_worker", wa.note)
        self.assertEqual((wa.culprit_data_rank, wa.culprit_stage), (1, 2), wa.note)
        self.assertEqual(a.step.straggler.since_step, ONSET, a.step.note)
        self.assertTrue(a.step.straggler.onset_in_window)
        self.assertIn("since step %d" % ONSET, a.step.note)
        # The restarted daemon: the same window, verdict, S and since-step.
        self.assertEqual(wb.verdict, wa.verdict, wb.note)
        self.assertEqual((wb.culprit_data_rank, wb.culprit_stage), (wa.culprit_data_rank, wa.culprit_stage))
        self.assertEqual(list(wb.culprit_ranks), list(wa.culprit_ranks))
        self.assertLessEqual(abs(wb.slowdown - wa.slowdown), 0.02 * wa.slowdown,
                             "S %.4f, the reference's %.4f" % (wb.slowdown, wa.slowdown))
        self.assertEqual(b.step.straggler.since_step, a.step.straggler.since_step, b.step.note)
        self.assertEqual(b.step.straggler.onset_in_window, a.step.straggler.onset_in_window)
        self.assertEqual((wa.since_step, wa.onset_known), (ONSET, True))  # the what-if's own
        self.assertEqual((wb.since_step, wb.onset_known), (wa.since_step, wa.onset_known))
        self.assertEqual((wb.first_step, wb.last_step, wb.steps), (wa.first_step, wa.last_step, wa.steps))
        self.assertEqual(wb.analysed_steps, wa.analysed_steps)
        self.assertEqual(wb.skipped_steps, 0, wb.skipped_reason)
        self.assertEqual(wa.analysed_steps, STEPS)
        self.assertEqual(b.step.label, a.step.label)
        s = parse_metrics(scrape(victim))
        self.assertEqual(metric(s, "rankwatch_events_rejected_total", reason="duplicate"), 0)
        self.assertEqual(metric(s, "rankwatch_steps_timed_out_total", training_job=JOB), 0)
        print("S %.4f (reference %.4f), since step %d; %.1f s" % (
            wb.slowdown, wa.slowdown, b.step.straggler.since_step, time.monotonic() - started))


if __name__ == "__main__":
    unittest.main()
