"""Every diagnosis label through the real pipeline: `rankwatch kafka`, `rankwatchd` and
`rankwatch simulate` as separate processes, each fleet built to show one label, checked over
Prometheus metrics and the gRPC GetDiagnosis of a grpcio client."""
import os
import time
import unittest

import grpc

from harness import BIN, Fleet, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2, service_pb2_grpc


class ScenarioTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fleet = Fleet()
        cls.brokers = cls.fleet.start_broker()
        cls.daemon = cls.fleet.start_daemon(cls.brokers)
        cls.stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(cls.daemon.endpoints["grpc"]))

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def run_fleet(self, job, ranks, steps, *args):
        self.fleet.simulate(self.brokers, "--job", job, "--ranks", str(ranks), "--steps", str(steps),
                            "--speed", "max", *args)
        wait_until(lambda: metric(parse_metrics(scrape(self.daemon)), "rankwatch_steps_aligned_total",
                                  training_job=job) == steps, 60, "%s aligned" % job)
        return self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)

    def assert_step(self, d, label, culprits=None, node=None, scope=None):
        self.assertEqual(service_pb2.StepDiagnosisLabel.Name(d.step.label), label, d.step.note)
        s = parse_metrics(scrape(self.daemon))
        self.assertEqual(metric(s, "rankwatch_step_diagnosis", training_job=d.training_job,
                                diagnosis=label.replace("STEP_", "").lower()), 1)
        if culprits is not None:
            self.assertEqual(list(d.step.culprit_ranks), culprits)
        if node is not None:
            self.assertEqual(d.step.culprit_node, node)
        if scope is not None:
            self.assertEqual(d.step.scope, scope)
            self.assertEqual(metric(s, "rankwatch_straggler_culprit_ranks", training_job=d.training_job,
                                    scope=service_pb2.Scope.Name(scope).replace("SCOPE_", "").lower(),
                                    node=d.step.culprit_node), len(d.step.culprit_ranks))
        elif "STRAGGLER" not in label:
            self.assertFalse([x for x in s if x[0] == "rankwatch_straggler_culprit_ranks"
                              and x[1].get("training_job") == d.training_job])

    def test_balanced(self):
        self.assert_step(self.run_fleet("s-balanced", 16, 60, "--sync", "none", "--fault", "wait:all:0.08"),
                         "STEP_BALANCED")

    def test_compute_bound(self):
        self.assert_step(self.run_fleet("s-compute-bound", 16, 60, "--sync", "none"), "STEP_COMPUTE_BOUND")

    def test_input_bound(self):
        self.assert_step(self.run_fleet("s-input-bound", 16, 60, "--fault", "input-bound:all:1.0"),
                         "STEP_INPUT_BOUND")

    def test_wait_heavy(self):
        self.assert_step(self.run_fleet("s-wait", 16, 60, "--sync", "none", "--fault", "wait:all:0.3"),
                         "STEP_WAIT_HEAVY")

    def test_input_straggler_under_ddp(self):
        self.assert_step(self.run_fleet("s-input", 32, 60, "--fault", "slow-input:21:4.0"),
                         "STEP_INPUT_STRAGGLER", culprits=[21], node="node-2", scope=service_pb2.SCOPE_RANK)

    def test_compute_straggler_under_ddp_with_collective_times(self):
        self.assert_step(self.run_fleet("s-compute", 64, 60, "--report-collective", "--fault", "slow-compute:42:0.2"),
                         "STEP_COMPUTE_STRAGGLER", culprits=[42], node="node-5")

    def test_a_lasting_straggler_fires_an_alert(self):
        self.run_fleet("s-alert", 16, 60, "--report-collective", "--fault", "slow-compute:7:0.3")
        wait_until(lambda: metric(parse_metrics(scrape(self.daemon)), "rankwatch_alerts_firing",
                                  training_job="s-alert", kind="straggler") == 1, 20, "a firing straggler alert")
        s = parse_metrics(scrape(self.daemon))
        self.assertGreaterEqual(metric(s, "rankwatch_alerts_total", kind="straggler", state="firing"), 1)
        self.assertEqual(metric(s, "rankwatch_alerts_firing", training_job="s-alert", kind="hang"), 0)
        self.assertIn("firing: s-alert|straggler|rank:7", self.daemon.stderr())

    def test_input_and_compute_straggler(self):
        self.assert_step(self.run_fleet("s-both", 16, 60, "--sync", "none", "--fault", "slow-input:3:3.0",
                                        "--fault", "slow-compute:3:0.3"),
                         "STEP_STRAGGLER", culprits=[3])

    def test_a_slow_node_is_named(self):
        d = self.run_fleet("s-node", 32, 60, "--report-collective", "--fault", "slow-compute:node2:0.3")
        self.assert_step(d, "STEP_COMPUTE_STRAGGLER", culprits=list(range(16, 24)), node="node-2",
                         scope=service_pb2.SCOPE_NODE)

    def test_memory_imbalance(self):
        d = self.run_fleet("s-imbalance", 16, 60, "--fault", "memory-imbalance:4:0.3")
        self.assertEqual(d.memory.label, service_pb2.MEMORY_IMBALANCE, d.memory.note)
        self.assertEqual(d.memory.allocated.worst_rank, 4)

    def test_memory_creep_early_then_confirmed_live(self):
        # A leak that starts after 100 healthy steps, published in real time (20 ms steps).
        job = "s-creep"
        proc = self.fleet.start("simulate", [
            os.path.join(BIN, "rankwatch"), "simulate", "--brokers", self.brokers, "--job", job, "--ranks", "8",
            "--steps", "260", "--step-ms", "20", "--speed", "realtime", "--fault", "memory-leak:all:64:100"])
        seen = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "memory_creep" not in seen:
            s = parse_metrics(scrape(self.daemon))
            for label in ("balanced", "memory_creep_early", "memory_creep"):
                if metric(s, "rankwatch_memory_diagnosis", training_job=job, diagnosis=label) == 1:
                    if not seen or seen[-1] != label:
                        seen.append(label)
            time.sleep(0.05)
        proc.stop()
        self.assertIn("memory_creep", seen, seen)
        self.assertIn("memory_creep_early", seen, seen)
        self.assertLess(seen.index("memory_creep_early"), seen.index("memory_creep"), seen)
        self.assertEqual(seen[0], "balanced", seen)


if __name__ == "__main__":
    unittest.main()
