"""The `rankwatch` Python package on its own (one process, a real `rankwatch kafka`): pause()
takes every hook off and resume() puts it back, and paused steps are neither recorded nor
counted. The 4-rank jobs of test_pytorch_job check the same through the daemon."""
import os
import time
import unittest

from harness import Fleet
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


if __name__ == "__main__":
    unittest.main()
