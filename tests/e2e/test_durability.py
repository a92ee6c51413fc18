"""Durable state: a daemon killed with SIGKILL again and again ends with exactly the steps and
diagnoses of a daemon that ran uninterrupted over the same input; a storage fault turns health
to NOT_SERVING while queries keep being answered."""
import os
import random
import shutil
import signal
import subprocess
import time
import unittest

import grpc

from harness import BIN, Fleet, fast_group_config, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2, service_pb2_grpc

# Short group timeouts so that a restarted instance rejoins quickly (the mock broker accepts them).


def health(address):
    check = grpc.insecure_channel(address).unary_unary(
        "/grpc.health.v1.Health/Check", request_serializer=lambda x: x, response_deserializer=lambda b: b)
    return check(b"", timeout=10)


def diagnosis(daemon, job):
    stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(daemon.endpoints["grpc"]))
    return stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)


class DurabilityTest(unittest.TestCase):
    def setUp(self):
        self.fleet = Fleet()
        self.config = fast_group_config(self.fleet)

    def tearDown(self):
        self.fleet.close()

    def daemon(self, brokers, state_dir, group):
        args = ["--group", group, "--config", self.config, "--checkpoint-interval", "200ms"]
        return self.fleet.start_daemon(brokers, extra=args, state_dir=state_dir)

    def test_sigkill_at_five_random_moments_loses_and_repeats_nothing(self):
        brokers = self.fleet.start_broker()
        reference = self.daemon(brokers, os.path.join(self.fleet.workdir, "reference"), "reference")
        state = os.path.join(self.fleet.workdir, "crashing")
        victim = self.daemon(brokers, state, "crashing")
        job, steps = "durable", 2400
        sim = self.fleet.start("simulate", [
            os.path.join(BIN, "rankwatch"), "simulate", "--brokers", brokers, "--job", job, "--ranks", "8",
            "--steps", str(steps), "--step-ms", "10", "--speed", "realtime", "--report-collective",
            "--fault", "slow-compute:5:0.3:500", "--fault", "memory-leak:all:64:2250"])
        rng = random.Random(7)
        for _ in range(5):
            time.sleep(rng.uniform(0.5, 3.0))
            victim.stop(signal.SIGKILL)
            victim = self.daemon(brokers, state, "crashing")
        self.assertEqual(sim.proc.wait(120), 0, sim.stderr())

        def aligned(d):
            return metric(parse_metrics(scrape(d)), "rankwatch_steps_aligned_total", training_job=job)
        wait_until(lambda: aligned(reference) == steps, 60, "the reference daemon")
        wait_until(lambda: aligned(victim) == steps, 90, "the restarted daemon to catch up")
        time.sleep(1)  # both publish their final snapshots
        s = parse_metrics(scrape(victim))
        self.assertEqual(metric(s, "rankwatch_events_rejected_total", reason="duplicate"), 0)
        self.assertEqual(metric(s, "rankwatch_events_rejected_total", reason="late"), 0)
        self.assertEqual(metric(s, "rankwatch_steps_timed_out_total", training_job=job), 0)
        a, b = diagnosis(reference, job), diagnosis(victim, job)
        self.assertEqual(a.aligned_steps, steps)
        self.assertEqual(b.aligned_steps, steps)
        for d in (a, b):
            d.ClearField("evaluated_unix_ns")
            d.step.hang.Clear()
        self.assertEqual(a.step.label, service_pb2.STEP_COMPUTE_STRAGGLER)
        self.assertEqual(a.memory.label, service_pb2.MEMORY_CREEP)
        self.assertEqual(a, b)

    def test_a_sigkilled_daemon_restarted_on_the_development_broker_rejoins_within_two_sessions(self):
        # Default group settings: the development broker ignores static membership, so the
        # daemon joins as a dynamic member with a 3-s session; the restarted member gets the
        # partitions once the killed one's session timed out and the group rebalanced (about
        # two sessions; it took ~20 s with the former 10-s session).
        brokers = self.fleet.start_broker()
        state = os.path.join(self.fleet.workdir, "restarting")
        first = self.fleet.start_daemon(brokers, extra=["--instance-id", "rw-test-0"], state_dir=state)
        self.assertIn("the development broker does not support static group membership", first.stderr())
        self.assertIn("3 s", first.stderr())
        job = "restarted"
        self.fleet.start("simulate", [
            os.path.join(BIN, "rankwatch"), "simulate", "--brokers", brokers, "--job", job, "--ranks", "4",
            "--steps", "100000", "--step-ms", "100", "--speed", "realtime"])
        def aligned_steps(d):
            try:
                return diagnosis(d, job).aligned_steps
            except grpc.RpcError as e:  # NOT_FOUND until the job's first records
                if e.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                return 0
        wait_until(lambda: aligned_steps(first) > 10, 60, "the job's first steps")
        first.stop(signal.SIGKILL)
        started = time.monotonic()
        second = self.fleet.start_daemon(brokers, extra=["--instance-id", "rw-test-0"], state_dir=state)
        # Served from the local store at once: the steps of the last checkpoint before the kill
        # (the killed daemon had aligned more than 10; its last checkpoint may hold fewer).
        restored = aligned_steps(second)
        self.assertGreater(restored, 0, "nothing restored from the state directory")
        wait_until(lambda: aligned_steps(second) > restored, 60, "new steps after the restart")
        seconds = time.monotonic() - started
        print("restart to live diagnoses: %.1f s" % seconds)
        self.assertLess(seconds, 3 * 3 + 5, "a restart waited longer than two sessions of 3 s and a start")

    @unittest.skipUnless(os.geteuid() == 0 and shutil.which("mount"), "needs root to mount a tmpfs")
    def test_a_storage_fault_turns_health_to_not_serving_and_queries_go_on(self):
        mnt = os.path.join(self.fleet.workdir, "disk")
        os.makedirs(mnt)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", mnt], capture_output=True)
        if r.returncode != 0:
            self.skipTest("cannot mount a tmpfs here: %s" % r.stderr.decode().strip())
        try:
            brokers = self.fleet.start_broker()
            daemon = self.daemon(brokers, os.path.join(mnt, "state"), "faulty")
            self.fleet.simulate(brokers, "--job", "f1", "--ranks", "4", "--steps", "20", "--speed", "max")
            wait_until(lambda: metric(parse_metrics(scrape(daemon)), "rankwatch_steps_aligned_total",
                                      training_job="f1") == 20, 30, "first job")
            self.assertEqual(health(daemon.endpoints["grpc"]), b"\x08\x01")  # SERVING
            # The disk fills up: the next checkpoint cannot be written.
            subprocess.run(["dd", "if=/dev/zero", "of=" + os.path.join(mnt, "filler"), "bs=1M"],
                           capture_output=True)
            self.fleet.simulate(brokers, "--job", "f2", "--ranks", "4", "--steps", "20", "--speed", "max")
            wait_until(lambda: metric(parse_metrics(scrape(daemon)), "rankwatch_state_healthy") == 0, 30,
                       "the storage error to be noticed")
            s = parse_metrics(scrape(daemon))
            self.assertGreaterEqual(metric(s, "rankwatch_state_errors_total"), 1)
            self.assertEqual(health(daemon.endpoints["grpc"]), b"\x08\x02")  # NOT_SERVING
            self.assertEqual(diagnosis(daemon, "f1").aligned_steps, 20)   # still answers
            self.assertIn("state checkpoint failed", daemon.stderr())
        finally:
            for p in self.fleet.processes:
                p.stop(signal.SIGKILL)
            subprocess.run(["umount", "-l", mnt])


if __name__ == "__main__":
    unittest.main()
