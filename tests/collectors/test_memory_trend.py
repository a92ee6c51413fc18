"""The lifetime memory trend on real jobs (issue #15, "catch slow leaks"): a 4-process PyTorch
DDP job (gloo on CPU) instrumented with the `rankwatch` package, publishing to `rankwatch kafka`,
diagnosed by `rankwatchd`.

- A slow leak, 0.5 MiB a step on every rank (the `kept.append(out)` bug: a metric kept with its
  graph), is too slow for the 100-step window (50 MiB across it, under the 256 MiB floor); the
  lifetime trend reports it within the job's 400 steps, at the rate the job really leaks: each
  rank's resident size sampled from outside while it runs, against the step it had reached
  (from the step end times the job prints), fitted by least squares.
- Memory that grows for the first 50 steps (a cache filling once), then stays flat, is never
  reported as creep during the run.

Memory per rank (issue #36; MemoryPerRankTest, its own ctest `collectors_memory_rank`):

- Rank 0 alone keeps 0.5 MiB of tensors a step (rank-0-only logging or evaluation code): the
  median rank stays flat, so the job's trend sees nothing; rank 0's own series is a creep on
  rank 0 within the job's 400 steps, at rank 0's own rate as measured from outside (its resident
  size), within 25 %.
"""
import bisect
import statistics
import threading
import time
import unittest

import grpc

from harness import Fleet, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2, service_pb2_grpc
from torch_job import TorchJob, torch_available

STEPS = 400
# Short steps (~20-30 ms on 2 shared cores): device time and input pipeline simulated with sleeps
# so the 4 ranks do not queue for the CPU (torch_job.DIAGNOSED_JOB_ARGS, shorter).
FAST_JOB_ARGS = ("--device-ms", "4", "--width", "64", "--input-ms", "2")
MiB = 2**20
CREEP = ("MEMORY_CREEP_EARLY", "MEMORY_CREEP")


def vm_rss_bytes(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class Watch:
    """While a job runs: each rank's resident size every 0.1 s, and the daemon's memory
    diagnosis of the job every 0.3 s."""

    def __init__(self, job, stub, name):
        self.job, self.stub, self.name = job, stub, name
        self.rss = []          # (unix time, rank, bytes)
        self.diagnoses = []    # (last step of the window, label, note)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._sample, daemon=True),
                         threading.Thread(target=self._diagnose, daemon=True)]
        for t in self._threads:
            t.start()

    def _sample(self):
        while not self._stop.wait(0.1):
            now = time.time()
            for rank, p in enumerate(self.job.procs):
                b = vm_rss_bytes(p.pid)
                if b is not None:
                    self.rss.append((now, rank, b))

    def _diagnose(self):
        while not self._stop.wait(0.3):
            try:
                d = self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=self.name), timeout=5)
            except grpc.RpcError:
                continue  # the job is not known yet
            m = d.memory
            self.diagnoses.append((m.window.last_step, service_pb2.MemoryDiagnosisLabel.Name(m.label), m.note))

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join()


def leak_rate_per_step(samples, step_ends, from_step):
    """Least-squares slope of one rank's resident size against the steps it had completed, over
    the samples taken after `from_step` steps (bytes per step)."""
    xs, ys = [], []
    for t, b in samples:
        done = bisect.bisect_right(step_ends, t)
        if from_step <= done < len(step_ends):
            xs.append(done)
            ys.append(b)
    if len(xs) < 10 or len(set(xs)) < 10:
        return None
    return statistics.linear_regression(xs, ys).slope


def measured_rates(ranks, watch, from_step=50):
    """Each rank's leak rate as measured from outside (resident size against progress, after
    `from_step` steps), by rank (bytes per step)."""
    rates = {}
    for r in ranks:
        samples = [(t, b) for t, rank, b in watch.rss if rank == r["rank"]]
        rates[r["rank"]] = leak_rate_per_step(samples, r["step_end_unix"], from_step)
    return rates


class DaemonTest(unittest.TestCase):
    """A broker and a daemon for the class; run_job runs a 400-step job under a Watch."""

    @classmethod
    def setUpClass(cls):
        cls.fleet = Fleet()
        cls.brokers = cls.fleet.start_broker()
        cls.daemon = cls.fleet.start_daemon(cls.brokers)
        cls.stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(cls.daemon.endpoints["grpc"]))

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def run_job(self, name, *args):
        job = TorchJob(self.fleet.workdir, name, self.brokers, STEPS, *FAST_JOB_ARGS, *args)
        watch = Watch(job, self.stub, name)
        try:
            ranks = job.wait(timeout=240)
        finally:
            watch.stop()
        recorded = sum(ranks[0]["recorded"])
        self.assertEqual(recorded, STEPS)
        for r in ranks:
            self.assertEqual(r["collector"]["records_dropped"], 0, r["collector"])
        wait_until(lambda: metric(parse_metrics(scrape(self.daemon)), "rankwatch_steps_aligned_total",
                                  training_job=name) == recorded, 60, "%s: every recorded step aligned" % name)
        d = self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=name), timeout=10).memory
        print("%s: %.1f ms a step; %s, %s (trend: %d steps, %.3f MiB a step, steady %s, lifetime_trend %s)" % (
            name, statistics.median(ranks[0]["step_seconds"]) * 1e3,
            service_pb2.MemoryDiagnosisLabel.Name(d.label), d.note, d.trend_steps,
            d.trend_bytes_per_step / MiB, d.trend_steady, d.lifetime_trend))
        return d, ranks, watch


@unittest.skipUnless(torch_available(), "torch is not installed for this interpreter (scripts/venv.sh)")
class MemoryTrendTest(DaemonTest):
    def test_slow_leak_is_creep_at_its_true_rate(self):
        d, ranks, watch = self.run_job("trend-leak", "--fault-leak-mib-per-step", "0.5")
        # The true rate: each rank's resident size against its progress, after 50 steps.
        by_rank = measured_rates(ranks, watch)
        for rank, rate in by_rank.items():
            self.assertIsNotNone(rate, "too few resident-size samples of rank %d" % rank)
        rates = [by_rank[r] for r in sorted(by_rank)]
        true_rate = statistics.median(rates)
        first = next((step for step, label, _ in watch.diagnoses if label in CREEP), None)
        print("trend-leak: measured %s MiB a step (median %.3f; injected 0.5); rankwatch %.3f; "
              "first reported as creep with the window ending at step %s" % (
                  ", ".join("%.3f" % (x / MiB) for x in rates), true_rate / MiB,
                  d.creep_bytes_per_step / MiB, first))
        self.assertIn(service_pb2.MemoryDiagnosisLabel.Name(d.label), CREEP, d.note)
        self.assertTrue(d.lifetime_trend, d.note)  # the window alone cannot see 50 MiB in 100 steps
        self.assertGreater(d.device_capacity_bytes, 0)  # a CPU rank's capacity: cgroup or MemTotal
        self.assertLess(abs(d.creep_bytes_per_step - true_rate), 0.25 * true_rate,
                        "rankwatch %.3f MiB a step, measured %.3f" % (d.creep_bytes_per_step / MiB, true_rate / MiB))
        self.assertIn("MiB a step over the job's", d.note)
        self.assertIn("; full in ~", d.note)

    def test_growth_that_levels_off_is_not_creep(self):
        d, _, watch = self.run_job("trend-warmup", "--fault-warmup-steps", "50", "--fault-warmup-mib-per-step", "2")
        creep = [(step, label, note) for step, label, note in watch.diagnoses if label in CREEP]
        self.assertEqual(creep, [], "reported as creep during the run")
        self.assertNotIn(service_pb2.MemoryDiagnosisLabel.Name(d.label), CREEP, d.note)
        self.assertGreaterEqual(d.trend_steps, STEPS - 10)  # the trend judged the whole run
        self.assertFalse(d.trend_steady, d.note)


@unittest.skipUnless(torch_available(), "torch is not installed for this interpreter (scripts/venv.sh)")
class MemoryPerRankTest(DaemonTest):
    def test_one_rank_leak_is_creep_on_that_rank_at_its_rate(self):
        name = "rank-leak"
        d, ranks, watch = self.run_job(name, "--fault-leak-mib-per-step", "0.5", "--fault-leak-rank", "0")
        rates = measured_rates(ranks, watch)
        for rank, rate in rates.items():
            self.assertIsNotNone(rate, "too few resident-size samples of rank %d" % rank)
        true_rate = rates[0]
        creeps = [(step, label, note) for step, label, note in watch.diagnoses if label in CREEP]
        first = creeps[0][0] if creeps else None
        print("%s: measured %s MiB a step by rank (injected 0.5 on rank 0); rankwatch %.3f on rank %s; "
              "first reported as creep with the window ending at step %s; rank trends: %s" % (
                  name, ", ".join("%d: %.3f" % (r, rates[r] / MiB) for r in sorted(rates)), d.creep_bytes_per_step / MiB,
                  d.creep_rank if d.HasField("creep_rank") else "-", first,
                  "; ".join("rank %d %.3f MiB a step +%.0f%%%s" % (t.rank, t.bytes_per_step / MiB, t.growth * 100,
                                                                   " steady" if t.steady else "")
                            for t in d.rank_trends)))
        # Named as a creep on rank 0, and only ever on rank 0, within the job's 400 steps.
        self.assertIn(service_pb2.MemoryDiagnosisLabel.Name(d.label), CREEP, d.note)
        self.assertTrue(d.HasField("creep_rank"), d.note)
        self.assertEqual(d.creep_rank, 0, d.note)
        self.assertFalse(d.creep_all_ranks)
        for step, label, note in creeps:
            self.assertIn("rank 0's", note, "step %d" % step)
        self.assertIsNotNone(first)
        # At rank 0's own rate, as measured from outside.
        self.assertLess(abs(d.creep_bytes_per_step - true_rate), 0.25 * true_rate,
                        "rankwatch %.3f MiB a step, measured %.3f" % (d.creep_bytes_per_step / MiB, true_rate / MiB))
        self.assertGreater(len(d.rank_trends), 0)
        self.assertEqual(d.rank_trends[0].rank, 0)
        self.assertTrue(d.rank_trends[0].steady)
        self.assertEqual(d.trend_ranks_followed, 4)
        self.assertIn("; full in ~", d.note)  # a CPU rank's capacity: cgroup or MemTotal
        # The metric of the culprit rank.
        samples = parse_metrics(scrape(self.daemon))
        rate = metric(samples, "rankwatch_memory_creep_rank_bytes_per_step", training_job=name, rank="0")
        self.assertIsNotNone(rate)
        self.assertAlmostEqual(rate, d.creep_bytes_per_step, delta=0.05 * d.creep_bytes_per_step)


if __name__ == "__main__":
    unittest.main()
