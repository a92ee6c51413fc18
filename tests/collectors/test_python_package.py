"""The `rankwatch` Python package on its own (one process, a real `rankwatch kafka`): pause()
takes every hook off and resume() puts it back, and paused steps are neither recorded nor
counted. The 4-rank jobs of test_pytorch_job check the same through the daemon. The message
size (issue #47): max_message_bytes and $RANKWATCH_MAX_MESSAGE_BYTES reach the native
collector, stats() carries its counters, and what it sends fits."""
import os
import time
import unittest
import uuid
from unittest import mock

from harness import Fleet
from step_records import read_batches
from torch_job import torch_available


@unittest.skipUnless(torch_available(), "torch is not installed for this interpreter (scripts/venv.sh)")
class PauseTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fleet = Fleet()
        cls.brokers = cls.fleet.start_broker()

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def test_pause_takes_the_instrumentation_off_and_resume_puts_it_back(self):
        import rankwatch
        import torch
        import torch.nn as nn
        rw = rankwatch.init(job="pause-test", brokers=self.brokers, rank=0, world_size=1)
        self.addCleanup(rw.close)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        class_step = type(optimizer).step
        rw.instrument_module(model)
        rw.instrument_optimizer(optimizer)
        rw.instrument_optimizer(optimizer)  # a second call wraps nothing more
        batches = [(torch.randn(2, 4), torch.randn(2, 1)) for _ in range(8)]

        def train(recorded):
            for x, y in rw.dataloader(batches):
                with rw.step():
                    loss = nn.functional.mse_loss(model(x), y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                recorded.append(rw.stats()["steps_recorded"])

        hooked = (len(model._forward_pre_hooks), len(model._forward_hooks))
        self.assertEqual(hooked, (1, 1))
        self.assertIn("step", optimizer.__dict__)  # the timing wrapper
        counts = []
        train(counts)
        self.assertEqual(counts[-1], 8)

        with rw.pause():
            self.assertTrue(rw.paused)
            self.assertEqual((len(model._forward_pre_hooks), len(model._forward_hooks)), (0, 0))
            self.assertNotIn("step", optimizer.__dict__)
            self.assertIs(optimizer.step.__func__, class_step)
            paused_counts = []
            train(paused_counts)
            self.assertEqual(paused_counts, [8] * 8)  # every batch still trained, none recorded
            with rw.pause():  # already paused: leaving this one does not resume
                pass
            self.assertTrue(rw.paused)
        self.assertFalse(rw.paused)
        self.assertEqual((len(model._forward_pre_hooks), len(model._forward_hooks)), (1, 1))
        self.assertIn("step", optimizer.__dict__)

        # A module instrumented while paused stays bare until resume().
        late = nn.Linear(4, 4)
        rw.pause()
        rw.instrument_module(late)
        self.assertEqual(len(late._forward_hooks), 0)
        rw.resume()
        self.assertEqual(len(late._forward_hooks), 1)

        train(counts)
        self.assertEqual(counts[-1], 16)
        self.assertEqual(rw.step()._step, 16)  # numbering goes on after the paused steps
        self.assertTrue(rw.flush(timeout_s=10))
        stats = rw.stats()
        self.assertEqual(stats["records_dropped"], 0, stats)
        # The collector's own CPU: its threads are named so that /proc tells them apart.
        names = set()
        for tid in os.listdir("/proc/self/task"):
            with open("/proc/self/task/%s/comm" % tid) as f:
                names.add(f.read().strip())
        self.assertIn("rw:sender", names)
        self.assertTrue(any(n.startswith("rdk:") for n in names), names)
        self.assertGreaterEqual(stats["threads_cpu_s"], 0.0)
        self.assertLessEqual(stats["threads_cpu_s"], time.process_time())

    def test_a_disabled_collector_can_be_paused_too(self):
        import rankwatch
        rw = rankwatch.init(enabled=False)
        with rw.pause():
            self.assertFalse(rw.paused)  # nothing to pause
        rw.resume()


class MessageSizeTest(unittest.TestCase):
    """max_message_bytes: from init()'s keyword or $RANKWATCH_MAX_MESSAGE_BYTES to librdkafka's
    message.max.bytes; an op-heavy step over it goes without its ops, counted; a stacks reply is
    cut to fit; every message read back fits (value + key + 36 bytes)."""

    @classmethod
    def setUpClass(cls):
        cls.fleet = Fleet()
        cls.brokers = cls.fleet.start_broker(partitions=1)

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def collector(self, **kwargs):
        import rankwatch
        job = "size-%s" % uuid.uuid4().hex[:8]
        rw = rankwatch.init(job=job, brokers=self.brokers, rank=0, world_size=1, flush_interval_ms=50,
                            memory=False, watch_gc=False, **kwargs)
        self.addCleanup(rw.close)
        return rw, job

    def test_the_environment_sets_the_limit_an_op_heavy_step_goes_without_its_ops_and_all_fits(self):
        with mock.patch.dict(os.environ, {"RANKWATCH_MAX_MESSAGE_BYTES": "32768"}):
            rw, job = self.collector()
        self.assertEqual(rw.max_message_bytes, 32768)
        self.assertEqual(rw._native.max_batch_bytes, 32768 - 1024)
        stats = rw.stats()
        for key in ("messages_oversized", "ops_oversized", "producer_restarts"):
            self.assertEqual(stats[key], 0, key)
        t = rw._native  # the ops of one step: 4,096 of them (~60 KB), over 32 KiB alone
        now = rankwatch_now()
        with rw.step():
            for i in range(4096):
                t.add_op(1 + i % 16, i % 64, 0, now + i * 1000, now + i * 1000 + 700)
        with rw.step():
            rw.add_op("optimizer", now, now + 1000)
        # A stacks reply of 64 threads of 64 deep frames (~270 KB asked): cut to fit.
        frames = [("/very/long/path/%s/module_%d.py" % ("x" * 200, i), i, "function_%s_%d" % ("y" * 100, i))
                  for i in range(64)]
        threads = [("thread-%d" % n, n, n == 0, frames, 0) for n in range(64)]
        t.reply_stacks("stacks-1", threads, [("default_pg", 1, 3, 3)], 1, False)
        self.assertTrue(rw.flush(timeout_s=10))
        stats = rw.stats()
        self.assertEqual(stats["ops_oversized"], 4096, stats)
        self.assertEqual(stats["ops_dropped"], 4096, stats)
        self.assertEqual(stats["messages_oversized"], 0, stats)
        self.assertEqual(stats["producer_restarts"], 0, stats)
        self.assertEqual(stats["records_dropped"], 0, stats)
        rw.close()
        batches = read_batches(self.brokers, job)
        for b in batches:
            self.assertLessEqual(len(b.SerializeToString()) + len(job) + 36, 32768)
        ops = [len(s.ops) for b in batches for s in b.steps]
        self.assertEqual(ops, [0, 1])  # step 0 without its ops, step 1 with its one
        replies = [r for b in batches for r in b.control_replies if r.request_id == "stacks-1"]
        self.assertEqual(len(replies), 1)
        kept = sum(len(th.frames) for th in replies[0].stacks)
        omitted = sum(th.frames_omitted for th in replies[0].stacks)
        self.assertGreater(kept, 0)
        self.assertEqual(kept + omitted, 64 * 64)

    def test_the_keyword_wins_over_the_environment_and_a_bad_value_is_refused(self):
        with mock.patch.dict(os.environ, {"RANKWATCH_MAX_MESSAGE_BYTES": "32768"}):
            rw, _ = self.collector(max_message_bytes=100_000)
        self.assertEqual(rw.max_message_bytes, 100_000)
        rw.close()
        rw, _ = self.collector()
        self.assertEqual(rw.max_message_bytes, 1_000_000)  # Kafka's default
        rw.close()
        with mock.patch.dict(os.environ, {"RANKWATCH_MAX_MESSAGE_BYTES": "1MB"}):
            with self.assertRaisesRegex(ValueError, "RANKWATCH_MAX_MESSAGE_BYTES"):
                self.collector()
        with self.assertRaisesRegex(ValueError, "max_message_bytes"):
            self.collector(max_message_bytes=1000)


def rankwatch_now():
    import rankwatch.collector
    return rankwatch.collector.now_ns()


if __name__ == "__main__":
    unittest.main()
