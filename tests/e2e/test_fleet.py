"""The fleet view of nodes (docs/fleet.md) on real processes: three simulated jobs, one after
another, each with a slow rank on the same node (different ranks), read by two rankwatchd
instances of one consumer group. Both instances' views show the node with the three jobs and
what each lost to it (against the cost the simulator injected); the node alert fires once across
the two; the record and the alert survive a SIGKILL; `rankwatch nodes` prints the record."""
import os
import signal
import subprocess
import time
import unittest

import grpc

from harness import BIN, Fleet, fast_group_config, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2, service_pb2_grpc
from test_lost_time import nominal_share

RANKS, RANKS_PER_NODE, STEPS, STEP_MS, RATE = 16, 8, 600, 20, 2400
FROM, MAGNITUDE = 100, 1.0
SLOW_NODE = "node-1"
JOBS = (("fleet-a", 9), ("fleet-b", 10), ("fleet-c", 14))  # ranks 8-15 are on node-1


def stub(daemon):
    return service_pb2_grpc.RankWatchStub(grpc.insecure_channel(daemon.endpoints["grpc"]))


def node_record(daemon, node):
    r = stub(daemon).ListNodes(service_pb2.ListNodesRequest(node=node), timeout=10)
    return r.nodes[0] if r.nodes else None


def node_alerts(daemon):
    """The node-culprit alerts in the daemon's alert log, oldest first."""
    call = stub(daemon).WatchAlerts(service_pb2.WatchAlertsRequest(
        kinds=[service_pb2.ALERT_NODE_CULPRIT], backlog_only=True), timeout=10)
    return list(call)


class FleetViewTest(unittest.TestCase):
    def setUp(self):
        self.fleet = Fleet()
        self.config = fast_group_config(self.fleet)

    def tearDown(self):
        self.fleet.close()

    def daemon(self, brokers, name):
        return self.fleet.start_daemon(brokers, state_dir=os.path.join(self.fleet.workdir, name), extra=[
            "--group", "fleet", "--config", self.config, "--checkpoint-interval", "200ms"])

    def test_a_node_slow_in_three_jobs_is_recorded_alerted_and_survives_a_kill(self):
        brokers = self.fleet.start_broker(partitions=6)
        daemons = [self.daemon(brokers, "a"), self.daemon(brokers, "b")]
        wait_until(lambda: sum(metric(parse_metrics(scrape(d)), "rankwatch_kafka_assigned_partitions") or 0
                               for d in daemons) == 6, 60, "the two instances to share the 6 partitions")
        injected = {}
        for job, rank in JOBS:
            out = self.fleet.simulate(
                brokers, "--job", job, "--ranks", str(RANKS), "--ranks-per-node", str(RANKS_PER_NODE),
                "--steps", str(STEPS), "--step-ms", str(STEP_MS), "--report-collective", "--seed", "3",
                "--speed", "max", "--rate", str(RATE),
                "--fault", "slow-compute:%d:%g:%d" % (rank, MAGNITUDE, FROM))
            self.assertEqual(out["failed"], 0, out)
            injected[job] = (STEPS - FROM) * RANKS * MAGNITUDE * (nominal_share("kForward") + nominal_share("kBackward")) * STEP_MS / 1000

        # The simulated jobs end with the fault on: their records may still be firing.
        wait_until(lambda: all((node_record(d, SLOW_NODE) or service_pb2.NodeRecord()).jobs == 3
                               for d in daemons), 90, "both instances' views to hold 3 jobs on " + SLOW_NODE)
        views = [node_record(d, SLOW_NODE) for d in daemons]
        for v in views:
            print("\n%s: %d jobs, %d episodes, %.1f rank-s lost, alert firing %s" % (
                v.node, v.jobs, v.episodes, v.lost_rank_seconds, v.alert_firing))
            for j in v.by_job:
                print("  %s ranks %s episodes %d lost %.1f rank-s (injected %.1f, %.2fx)" % (
                    j.training_job, list(j.ranks), j.episodes, j.lost_rank_seconds, injected[j.training_job],
                    j.lost_rank_seconds / injected[j.training_job]))
        by_job = {j.training_job: j for j in views[0].by_job}
        self.assertEqual(sorted(by_job), [job for job, _ in JOBS])
        for job, rank in JOBS:
            j = by_job[job]
            self.assertEqual(list(j.ranks), [rank])
            self.assertGreaterEqual(j.episodes, 1)
            # The charge counts the steps from the straggler's onset while its alert fired.
            self.assertGreater(j.lost_rank_seconds, 0.6 * injected[job], job)
            self.assertLess(j.lost_rank_seconds, 1.3 * injected[job], job)
        self.assertAlmostEqual(views[0].lost_rank_seconds, sum(j.lost_rank_seconds for j in views[0].by_job))
        # Both instances hold the same view, whichever owned each job.
        wait_until(lambda: node_record(daemons[0], SLOW_NODE).lost_rank_seconds ==
                   node_record(daemons[1], SLOW_NODE).lost_rank_seconds, 30, "the two views to agree")

        # The node alert: once across the two instances.
        wait_until(lambda: sum(len(node_alerts(d)) for d in daemons) >= 1, 30, "the node alert")
        alerts = [(i, a) for i, d in enumerate(daemons) for a in node_alerts(d)]
        self.assertEqual(len(alerts), 1, alerts)
        owner, alert = alerts[0]
        print("node alert on instance %d: %s | %s" % (owner, alert.evidence.step.note, alert.evidence.step.next_step))
        self.assertEqual(alert.state, service_pb2.ALERT_FIRING)
        self.assertEqual(alert.subject, "node:" + SLOW_NODE)
        self.assertIn("culprit of 3 jobs in 24 h", alert.evidence.step.note)
        self.assertIn("drain it", alert.evidence.step.note)
        for d in daemons:
            self.assertTrue(node_record(d, SLOW_NODE).alert_firing)
        s = parse_metrics(scrape(daemons[owner]))
        self.assertEqual(metric(s, "rankwatch_node_culprit_jobs", node=SLOW_NODE), 3)
        self.assertEqual(metric(s, "rankwatch_node_alerts_firing"), 1)
        self.assertGreater(metric(s, "rankwatch_node_lost_rank_seconds", node=SLOW_NODE), 0)

        # SIGKILL the instance that raised it, restart it on its state: the same record, the alert
        # still firing and not raised again (by it, or by the other while it was away).
        before = node_record(daemons[owner], SLOW_NODE)
        daemons[owner].stop(signal.SIGKILL)
        daemons[owner] = self.daemon(brokers, "ab"[owner])
        wait_until(lambda: (node_record(daemons[owner], SLOW_NODE) or service_pb2.NodeRecord()).jobs == 3,
                   30, "the restarted instance's record")
        after = node_record(daemons[owner], SLOW_NODE)
        self.assertAlmostEqual(after.lost_rank_seconds, before.lost_rank_seconds, delta=1e-6)
        self.assertEqual(after.episodes, before.episodes)
        self.assertTrue(after.alert_firing)
        wait_until(lambda: sum(metric(parse_metrics(scrape(d)), "rankwatch_kafka_assigned_partitions") or 0
                               for d in daemons) == 6, 60, "the group to settle")
        time.sleep(7)  # node alerts are evaluated 5 s after the partitions settle
        alerts = [(i, a) for i, d in enumerate(daemons) for a in node_alerts(d)]
        self.assertEqual(len(alerts), 1, alerts)

        # `rankwatch nodes`, the command line's view.
        cli = subprocess.run([os.path.join(BIN, "rankwatch"), "nodes", "--server", daemons[owner].endpoints["grpc"],
                              "--node", SLOW_NODE], capture_output=True, text=True, timeout=30)
        print(cli.stdout)
        self.assertEqual(cli.returncode, 0, cli.stderr)
        for job, _ in JOBS:
            self.assertIn(job, cli.stdout)


if __name__ == "__main__":
    unittest.main()
