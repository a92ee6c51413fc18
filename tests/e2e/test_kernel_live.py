"""Issue #6, acceptance 2: a Kineto fixture replayed through Kafka (`rankwatch kafka`) into
`rankwatchd` gives the same per-(rank, step) numbers as `rankwatch analyze --format json` on the
same files (corrected mode), and the job-level metrics are the aggregates of those numbers."""
import json
import os
import subprocess
import unittest
import urllib.error
import urllib.request

import grpc

from harness import BIN, Fleet, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2, service_pb2_grpc

FIXTURES = os.environ.get("RANKWATCH_FIXTURES",
                          os.path.join(os.path.dirname(__file__), "..", "fixtures"))
TWO_RANKS = os.path.join(FIXTURES, "kineto", "hta-trace-filter-2rank")
# The per-step quantities `rankwatch analyze --format json` prints.
KEYS = ["gpu_ops", "kernel_time_us", "idle_time_us", "compute_time_us", "non_compute_time_us", "comm_time_us",
        "comm_comp_overlap_ratio", "launches", "short_kernels", "runtime_outliers", "launch_delay_outliers"]
IDLE_KEYS = ["host_wait_us", "kernel_wait_us", "other_us"]


def analyze(path):
    r = subprocess.run([os.path.join(BIN, "rankwatch"), "analyze", "--format", "json", "--quiet", path],
                       capture_output=True, text=True, timeout=120, check=True)
    return json.loads(r.stdout)


def assert_same_steps(test, got, expected):
    """`got` and `expected`: {(rank, step): per-step numbers}, as analyze's JSON prints them."""
    test.assertEqual(sorted(got), sorted(expected))
    for key, want in expected.items():
        for k in KEYS:
            test.assertEqual(got[key][k], want[k], "%s %s" % (key, k))
        for k in IDLE_KEYS:
            test.assertEqual(got[key]["idle"][k], want["idle"][k], "%s idle %s" % (key, k))


def kernel_json(daemon, job):
    url = "http://%s/kernel?training_job=%s" % (daemon.endpoints["metrics"], job)
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


class KernelLiveTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fleet = Fleet()
        cls.brokers = cls.fleet.start_broker(partitions=3)
        cls.daemon = cls.fleet.start_daemon(cls.brokers)

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def replay(self, job, *paths, extra=()):
        cmd = [os.path.join(BIN, "rankwatch"), "replay", "--brokers", self.brokers, "--job", job,
               "--chunk-events", "100"] + list(extra) + list(paths)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout.strip().splitlines()[-1])

    def test_replayed_fixture_equals_analyze_per_rank_and_step(self):
        expected = analyze(TWO_RANKS)
        steps = {(s["rank"], s["step"]): s for s in expected["steps"]}
        self.assertEqual(len(steps), 4)  # ranks 0 and 1, steps 551 and 552

        out = self.replay("kineto2", TWO_RANKS)
        self.assertEqual(out["ranks"], 2)
        self.assertEqual(out["steps"], 4)
        self.assertEqual(out["failed"], 0)
        self.assertGreater(out["messages"], 2 * 4)  # 100 events per message: several per step

        live = wait_until(lambda: (lambda j: j if j and j["steps_analyzed"] == 4 else None)(
            kernel_json(self.daemon, "kineto2")), 60, "4 analysed (rank, step) windows")
        self.assertEqual(live["events"]["late"], 0)
        self.assertEqual(live["events"]["unstepped"], 0)
        self.assertEqual(live["events"]["accepted"], out["kernel_events"])
        got = {(s["rank"], s["step"]): s for r in live["ranks"] for s in r["recent_steps"]}
        assert_same_steps(self, got, steps)

        # Per rank: the window totals are the sums over the rank's steps.
        for r in live["ranks"]:
            mine = [s for (rank, _), s in steps.items() if rank == r["rank"]]
            for k in ["gpu_ops", "kernel_time_us", "idle_time_us", "compute_time_us", "comm_time_us", "launches"]:
                self.assertAlmostEqual(r["total"][k], sum(s[k] for s in mine), places=6, msg=k)

        # The same per-rank totals over gRPC (GetRankDetail), in seconds.
        stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(self.daemon.endpoints["grpc"]))
        for rank in (0, 1):
            mine = [s for (r, _), s in steps.items() if r == rank]
            k = stub.GetRankDetail(service_pb2.GetRankDetailRequest(training_job="kineto2", rank=rank),
                                   timeout=10).kernel
            self.assertEqual(k.steps, 2)
            self.assertEqual(k.gpu_ops, sum(s["gpu_ops"] for s in mine))
            self.assertAlmostEqual(k.kernel_seconds, sum(s["kernel_time_us"] for s in mine) * 1e-6, places=9)
            self.assertAlmostEqual(k.idle_seconds, sum(s["idle_time_us"] for s in mine) * 1e-6, places=9)
            self.assertAlmostEqual(k.communication_seconds, sum(s["comm_time_us"] for s in mine) * 1e-6, places=9)

        # Job-level metrics: the aggregates of the same per-step numbers.
        kernel = sum(s["kernel_time_us"] for s in steps.values())
        m = parse_metrics(scrape(self.daemon))
        ratio = lambda cat: metric(m, "rankwatch_gpu_time_ratio", training_job="kineto2", category=cat)
        self.assertAlmostEqual(ratio("idle"), sum(s["idle_time_us"] for s in steps.values()) / kernel, places=9)
        self.assertAlmostEqual(ratio("compute"), sum(s["compute_time_us"] for s in steps.values()) / kernel,
                               places=9)
        self.assertAlmostEqual(ratio("idle") + ratio("compute") + ratio("non_compute"), 1.0, places=9)
        idle = {k: sum(s["idle"][k + "_us"] for s in steps.values()) for k in ["host_wait", "kernel_wait", "other"]}
        for reason, v in idle.items():
            self.assertAlmostEqual(metric(m, "rankwatch_idle_time_ratio", training_job="kineto2", reason=reason),
                                   v / sum(idle.values()), places=9, msg=reason)
        per_rank_overlap = []
        for rank in (0, 1):
            mine = [s for (r, _), s in steps.items() if r == rank]
            comm = sum(s["comm_time_us"] for s in mine)
            per_rank_overlap.append(sum(s["comm_time_us"] * s["comm_comp_overlap_ratio"] for s in mine) / comm)
        self.assertAlmostEqual(metric(m, "rankwatch_comm_comp_overlap_ratio", training_job="kineto2", stat="min"),
                               min(per_rank_overlap), places=6)
        self.assertAlmostEqual(metric(m, "rankwatch_comm_comp_overlap_ratio", training_job="kineto2",
                                      stat="median"), sum(per_rank_overlap) / 2, places=6)
        types = [s for s in m if s[0] == "rankwatch_kernel_time_ratio" and s[1].get("training_job") == "kineto2"]
        self.assertIn("COMPUTATION", [s[1]["type"] for s in types])
        self.assertIn("COMMUNICATION", [s[1]["type"] for s in types])
        self.assertAlmostEqual(sum(s[2] for s in types), 1.0, places=9)
        p50 = metric(m, "rankwatch_launch_delay_seconds", training_job="kineto2", quantile="0.5")
        pmax = metric(m, "rankwatch_launch_delay_seconds", training_job="kineto2", quantile="max")
        self.assertGreater(p50, 0)
        self.assertGreaterEqual(pmax, p50)
        self.assertEqual(metric(m, "rankwatch_kernel_steps_analyzed_total", training_job="kineto2"), 4)
        # Two ranks: neither stands apart from the other.
        self.assertIsNone(metric(m, "rankwatch_kernel_outlier_rank", training_job="kineto2", signal="idle"))

    def test_unknown_job_is_404_and_jobs_are_listed(self):
        self.assertIsNone(kernel_json(self.daemon, "nope"))
        with urllib.request.urlopen("http://%s/kernel" % self.daemon.endpoints["metrics"], timeout=5) as r:
            self.assertIsInstance(json.loads(r.read().decode())["jobs"], list)


if __name__ == "__main__":
    unittest.main()
