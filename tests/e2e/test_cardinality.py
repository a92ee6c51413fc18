"""Junk job ids do not fill Prometheus. 50,000 ids, each one record of one rank of a
"4-rank job" that never completes a step, published by a client rankwatch did not write
(python3-confluent-kafka, the project's protobuf batches), are aligned at the default 10-s
timeout as one-rank steps but never become jobs: they get no per-job series, only a count. A
real job that arrives during the flood is diagnosed and exported. Everything at the default
settings. Prints the series count and the size of the scrape it measured.
"""
import os
import re
import time
import unittest

from confluent_kafka import Producer

from harness import BIN, Fleet, scrape, wait_until
from rankwatch.v1 import telemetry_pb2

TOPIC = "rankwatch.telemetry"
IDS = 50_000
CHUNK = 5_000  # ~300 KB a chunk: far below the development broker's 5 MiB per partition
MAX_SERIES = 100_000
MAX_BYTES = 10_000_000


def junk(i):
    b = telemetry_pb2.Batch(schema_version=1)
    b.source.training_job = "junk-%06d" % i
    b.source.rank = 0
    b.source.world_size = 4
    b.source.node = "node-0"
    r = b.steps.add(step=1, step_time_ns=100_000_000, forward_ns=30_000_000,
                    backward_ns=60_000_000)
    r.end_unix_ns = time.time_ns()
    return b.SerializeToString()


def value(text, name, labels=""):
    m = re.search(r"^%s%s (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return float(m.group(1)) if m else None


def series(text):
    return sum(1 for line in text.split("\n") if line and not line.startswith("#"))


class JunkIdsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fleet = Fleet()
        cls.brokers = cls.fleet.start_broker()
        cls.daemon = cls.fleet.start_daemon(cls.brokers)  # default settings
        cls.producer = Producer({"bootstrap.servers": cls.brokers, "linger.ms": 5,
                                 "compression.type": "lz4"})

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def batches(self):
        return value(scrape(self.daemon), "rankwatch_events_total", '{kind="batch"}') or 0

    def flood(self, first, count, base):
        """Publishes ids first..first+count in chunks, each read by the daemon before the next."""
        for start in range(first, first + count, CHUNK):
            for i in range(start, min(start + CHUNK, first + count)):
                self.producer.produce(TOPIC, junk(i), key=b"junk-%06d" % i)
                self.producer.poll(0)
            self.assertEqual(self.producer.flush(30), 0, "undelivered messages")
            done = min(start + CHUNK, first + count)
            wait_until(lambda: self.batches() >= base + done, 60, "%d ids read" % done)

    def test_fifty_thousand_junk_ids_and_a_real_job(self):
        started = time.monotonic()
        base = self.batches()
        self.flood(0, IDS // 2, base)
        # A real 8-rank job arrives during the flood (rank 3 computes 50 % slower).
        sim = self.fleet.start("simulate", [os.path.join(BIN, "rankwatch"), "simulate", "--brokers",
                                            self.brokers, "--job", "real", "--ranks", "8",
                                            "--steps", "300", "--step-ms", "20",
                                            "--fault", "slow-compute:3:0.5"])
        self.flood(IDS // 2, IDS - IDS // 2, base)
        wait_until(lambda: sim.proc.poll() is not None, 60, "the real job's end")
        self.assertEqual(sim.proc.returncode, 0, sim.stderr())
        label = '{training_job="real",diagnosis="compute_straggler"}'
        wait_until(lambda: value(scrape(self.daemon), "rankwatch_step_diagnosis", label) == 1, 60,
                   "the real job diagnosed as a compute straggler and exported")
        # Every junk id still in the table has had its one step aligned at the 10-s timeout and
        # been evaluated (the state that exported ~40 series per id before).
        time.sleep(12)
        text = scrape(self.daemon)
        n, size = series(text), len(text.encode())
        real = text.count('training_job="real"')
        candidates = value(text, "rankwatch_job_ids", '{state="candidate"}')
        print("%d one-record job ids + 1 real job, default settings: %d series, %d bytes scraped "
              "(%.2f MB); the real job %d series; rankwatch_jobs %d, job_ids candidate %d "
              "exported %d, evicted %d; %.0f s"
              % (IDS, n, size, size / 1e6, real, value(text, "rankwatch_jobs"), candidates,
                 value(text, "rankwatch_job_ids", '{state="exported"}'),
                 value(text, "rankwatch_jobs_evicted_total"), time.monotonic() - started))
        self.assertLess(n, MAX_SERIES)
        self.assertLess(size, MAX_BYTES)
        self.assertNotIn('training_job="junk-', text, "a junk id got per-job series")
        self.assertEqual(value(text, "rankwatch_steps_aligned_total", '{training_job="real"}'), 300)
        self.assertEqual(value(text, "rankwatch_job_ids", '{state="exported"}'), 1)
        self.assertGreater(candidates, 1000, "the junk ids in the table are counted")
        self.assertGreaterEqual(value(text, "rankwatch_jobs_evicted_total"), IDS + 1 - 10_000)
        self.assertEqual(value(text, "rankwatch_events_rejected_total",
                               '{reason="too_many_jobs"}'), 0)
        self.assertIsNone(self.daemon.proc.poll(), "rankwatchd exited: " + self.daemon.stderr())


if __name__ == "__main__":
    unittest.main()
