"""Input loss is visible: a burst larger than the development broker keeps (5 MiB per
partition) is published faster than the daemon reads it, so retention deletes messages before
they are read. The daemon counts them in rankwatch_input_lost_messages_total{topic,partition}
and logs one warning per event naming the partition and the offsets; every message is either
read or counted as lost. A paced job loses nothing."""
import re
import time
import unittest

from harness import Fleet, metric, parse_metrics, scrape, wait_until

LOST = re.compile(r"kafka: (\S+) \[(\d+)\] lost (\d+) messages: the consumer should have read "
                  r"offset (\d+) next, the broker's log now starts at offset (\d+)")


class InputLossTest(unittest.TestCase):
    def setUp(self):
        self.fleet = Fleet()
        self.brokers = self.fleet.start_broker()
        self.daemon = self.fleet.start_daemon(self.brokers)

    def tearDown(self):
        self.fleet.close()

    def lost_series(self):
        return {l["partition"]: v for n, l, v in parse_metrics(scrape(self.daemon))
                if n == "rankwatch_input_lost_messages_total"}

    def test_a_burst_beyond_retention_is_counted_and_logged(self):
        # 256 ranks x 2,000 steps, all to one partition (one job), at full speed: ~26,000
        # messages, far more than 5 MiB.
        out = self.fleet.simulate(self.brokers, "--job", "burst", "--ranks", "256", "--steps", "2000",
                                  "--speed", "max", timeout=300)
        total = out["messages"]
        self.assertEqual(out["failed"], 0)
        wait_until(lambda: self.lost_series(), 60, "a loss counted")
        def warnings():
            return [m.groups() for m in LOST.finditer(self.daemon.stderr())]
        wait_until(warnings, 30, "a loss warning")
        events = warnings()  # usually one; more when the consumer fell behind more than once
        partitions = {p for _, p, _, _, _ in events}
        self.assertEqual(len(partitions), 1, events)  # one job: one partition
        lost = 0
        for topic, partition, count, expected, start in events:
            self.assertEqual(topic, "rankwatch.telemetry")
            self.assertEqual(int(start) - int(expected), int(count))
            lost += int(count)
            print("published %d messages; lost %s on partition %s (offsets %s-%d)" % (
                total, count, partition, expected, int(start) - 1))
        self.assertEqual(self.lost_series(), {partitions.pop(): float(lost)})
        # Every message is read or counted lost.
        wait_until(lambda: metric(parse_metrics(scrape(self.daemon)), "rankwatch_events_total",
                                  kind="batch") == total - lost, 60,
                   "every message after the loss read")

    def test_a_paced_job_loses_nothing(self):
        self.fleet.simulate(self.brokers, "--job", "paced", "--ranks", "16", "--steps", "200",
                            "--speed", "max", "--rate", "20000")
        wait_until(lambda: metric(parse_metrics(scrape(self.daemon)), "rankwatch_steps_aligned_total",
                                  training_job="paced") == 200, 60, "every step aligned")
        self.assertEqual(self.lost_series(), {})
        self.assertNotIn("lost", self.daemon.stderr())


if __name__ == "__main__":
    unittest.main()
