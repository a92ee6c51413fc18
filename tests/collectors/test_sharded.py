"""The training strategy and sharding a collector reports (SourceIdentity.training_strategy,
.sharded), and the collectives rw.instrument_fsdp() times, against a real `rankwatch kafka`.

The FSDP tests run real 2-rank jobs (gloo on CPU, torch 2.13; tests/collectors/fsdp_job.py):
a small MLP sharded with FSDP1 (FullyShardedDataParallel, device_id cpu) and with FSDP2
(fully_shard on each Linear and the model; once more with model.unshard(async_op=True) before
each forward, FSDP2's explicit prefetch), instrumented with instrument_fsdp + instrument_module
+ instrument_optimizer. The batches read back must say "fsdp", sharded, and every step of both
ranks must carry forward, backward, optimizer and collective time. On steps 3, 5 and 7 rank 1
sleeps a known 80 ms right before its forward: rank 0 blocks in the forward's first all-gather
for about that long, so its collective phase on those steps is >= 0.8 x 80 ms and well above
its normal steps', while rank 1's own sleep stays out of its collective phase. Each rank's
final loss must equal an unsharded copy's trained on the same batches (the wrappers leave
FSDP's collectives intact). One more test, in this process (a 1-rank gloo group), checks that
torch's own functions are wrapped once, put back while paused, and that an asynchronous call
is timed in its handle's wait().

What the real jobs found: FSDP1 all-gathers CPU parameters with the list form
dist.all_gather (which instrument_fsdp did not wrap: its peers' waits went unrecorded), and
FSDP2 waits on an async all-gather's handle only if it is a torch Work (rankwatch's plain
wrapper made it skip the wait: the loss went NaN). Both are fixed in rankwatch/torch_hooks.py.

(Until torch 2.13 this test stood in fake all_gather / reduce_scatter functions blocking for
known times: Debian 12's torch 1.13 could not import torch.distributed.fsdp under Python 3.11,
and its gloo lacked the collectives FSDP issues.)"""
import os
import statistics
import unittest
import uuid

from harness import Fleet
from step_records import read_batches, steps_by_rank
from torch_job import TorchJob, free_port, torch_available

MS = 1_000_000
HERE = os.path.dirname(os.path.abspath(__file__))
FSDP_JOB = os.path.join(HERE, "fsdp_job.py")
STEPS = 10
DELAY_MS = 80
DELAY_STEPS = (3, 5, 7)  # rank 1 sleeps before the forward of these steps


@unittest.skipUnless(torch_available(), "torch is not installed for this interpreter (scripts/venv.sh)")
class TrainingStrategyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fleet = Fleet()
        cls.brokers = cls.fleet.start_broker()

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def collector(self, job):
        import rankwatch
        rw = rankwatch.init(job=job, brokers=self.brokers, rank=0, world_size=1, memory=False,
                            flush_interval_ms=100)
        self.addCleanup(rw.close)
        return rw

    def test_a_collector_says_nothing_until_told(self):
        rw = self.collector("strategy-none")
        self.assertEqual((rw.training_strategy, rw.sharded), ("", False))
        with rw.step():
            pass
        rw.set_training_strategy("deepspeed_zero3", sharded=True)
        self.assertEqual((rw.training_strategy, rw.sharded), ("deepspeed_zero3", True))
        with rw.step():
            pass
        self.assertTrue(rw.close())
        sources = [(b.source.training_strategy, b.source.sharded) for b in read_batches(self.brokers, "strategy-none")]
        self.assertEqual(sources[-1], ("deepspeed_zero3", True))
        self.assertEqual(set(sources) - {("", False)}, {("deepspeed_zero3", True)})

    def test_instrument_ddp_says_ddp(self):
        import torch
        import torch.distributed as dist
        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0, world_size=1)
        self.addCleanup(dist.destroy_process_group)
        rw = self.collector("strategy-ddp")
        model = DDP(nn.Linear(4, 1))
        rw.instrument_ddp(model)
        rw.instrument_module(model)
        self.assertEqual((rw.training_strategy, rw.sharded), ("ddp", False))
        for _ in range(3):
            with rw.step():
                model(torch.randn(2, 4)).sum().backward()
        self.assertTrue(rw.close())
        batches = read_batches(self.brokers, "strategy-ddp")
        self.assertTrue(batches)
        for b in batches:
            self.assertEqual((b.source.training_strategy, b.source.sharded), ("ddp", False))
        steps = steps_by_rank(batches)[0]
        self.assertEqual(sorted(steps), [0, 1, 2])
        self.assertTrue(all(s.HasField("collective_ns") for s in steps.values()))

    def test_instrument_fsdp_wraps_torchs_collectives_once_and_times_an_async_one_in_its_wait(self):
        # torch's own functions, in one 1-rank gloo process: each wrapped once (a second
        # instrument_fsdp wraps nothing again) and put back while paused; an asynchronous call
        # is timed in its handle's wait(), not from the call. (close() leaves the wrappers in
        # place, as it leaves the module hooks: it only ships the rest.)
        import time
        import torch
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d
        from rankwatch.torch_hooks import SHARDED_COLLECTIVES
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0, world_size=1)
        self.addCleanup(dist.destroy_process_group)
        real = {(m, n): m.__dict__[n] for m in (dist, c10d) for n in SHARDED_COLLECTIVES if n in m.__dict__}
        self.assertIn((dist, "all_gather_single"), real)
        self.assertIn((dist, "reduce_scatter_tensor"), real)
        rw = self.collector("strategy-fsdp")
        model = torch.nn.Linear(4, 4)
        self.assertIs(rw.instrument_fsdp(model), model)
        rw.instrument_fsdp(model)  # once is enough: nothing is wrapped twice
        self.assertEqual((rw.training_strategy, rw.sharded), ("fsdp", True))
        for (module, name), fn in real.items():
            self.assertIsNot(getattr(module, name), fn, name)
            self.assertIs(getattr(module, name).__wrapped__, fn, name)
        out, inp = torch.empty(4), torch.ones(4)

        def step(n):
            with rw.step(n):
                dist.all_gather_into_tensor(out, inp)                # calls all_gather_single: timed once
                dist.reduce_scatter_single(out, inp)
                time.sleep(0.003)                                    # not collective time
                work = dist.all_gather_single(out, inp, async_op=True)
                time.sleep(0.003)                                    # not collective time
                self.assertTrue(work.wait())
                self.assertTrue(work.is_completed())                 # the real handle's
                self.assertEqual(out.tolist(), [1.0] * 4)

        for n in range(3):
            step(n)
        with rw.pause():  # the real functions are back while paused
            for (module, name), fn in real.items():
                self.assertIs(getattr(module, name), fn, name)
        step(3)
        self.assertTrue(rw.close())
        batches = read_batches(self.brokers, "strategy-fsdp")
        for b in batches:
            self.assertEqual((b.source.training_strategy, b.source.sharded), ("fsdp", True))
        steps = steps_by_rank(batches)[0]
        self.assertEqual(sorted(steps), [0, 1, 2, 3])
        for n, s in sorted(steps.items()):
            print("1-rank step %d: collective %.3f ms of %.3f ms" % (n, s.collective_ns / MS, s.step_time_ns / MS))
            self.assertGreater(s.collective_ns, 0)
            # the 6 ms of sleeps around the calls stay out
            self.assertLess(s.collective_ns, s.step_time_ns - 6 * MS)

    def run_fsdp_job(self, version, *args):
        job = "fsdp%d-%s" % (version, uuid.uuid4().hex[:8])
        ranks = TorchJob(self.fleet.workdir, job, self.brokers, STEPS, "--fsdp", str(version),
                         "--delay-rank", "1", "--delay-ms", str(DELAY_MS),
                         "--delay-steps", ",".join(map(str, DELAY_STEPS)), *args,
                         world=2, script=FSDP_JOB).wait(timeout=120)
        name = " ".join(("FSDP%d" % version,) + args)
        for r in ranks:
            print("%s rank %d: loss %.6f, the unsharded model's on the same batches %.6f"
                  % (name, r["rank"], r["loss"], r["reference_loss"]))
            self.assertTrue(r["delivered"], "rank %d's batches were not all delivered" % r["rank"])
            self.assertEqual((r["strategy"], r["sharded"]), ("fsdp", True))
            # FSDP trained the model as it does without rankwatch (its collectives intact)
            self.assertAlmostEqual(r["loss"], r["reference_loss"], delta=1e-4 * max(1.0, r["reference_loss"]))
        self.assertEqual([r["delayed"] for r in ranks], [[], list(DELAY_STEPS)])
        batches = read_batches(self.brokers, job)
        self.assertEqual({b.source.rank for b in batches}, {0, 1})
        for b in batches:
            self.assertEqual((b.source.training_strategy, b.source.sharded), ("fsdp", True))
        steps = steps_by_rank(batches)
        for rank in (0, 1):
            self.assertEqual(sorted(steps[rank]), list(range(STEPS)), "rank %d" % rank)
            for n, s in sorted(steps[rank].items()):
                for phase in ("forward", "backward", "optimizer", "collective"):
                    self.assertGreater(getattr(s, phase + "_ns"), 0, "%s rank %d step %d: no %s"
                                       % (name, rank, n, phase))
        normal = [n for n in range(1, STEPS) if n not in DELAY_STEPS]  # step 0 warms up
        collective = {rank: {n: s.collective_ns / MS for n, s in steps[rank].items()} for rank in (0, 1)}
        for rank in (0, 1):
            print("%s rank %d collective ms, delayed steps %s: %s; normal steps: median %.2f, max %.2f"
                  % (name, rank, list(DELAY_STEPS),
                     ", ".join("%.2f" % collective[rank][n] for n in DELAY_STEPS),
                     statistics.median(collective[rank][n] for n in normal),
                     max(collective[rank][n] for n in normal)))
        # Rank 0 waited for rank 1's sleep in FSDP's all-gather.
        blocked, waited_for = collective[0], collective[1]
        for n in DELAY_STEPS:
            self.assertGreaterEqual(blocked[n], 0.8 * DELAY_MS, "%s step %d" % (name, n))
        # the delaying rank's sleep is not collective time
        self.assertLess(statistics.median(waited_for[n] for n in DELAY_STEPS), 0.5 * DELAY_MS, name)
        self.assertGreater(statistics.median(blocked[n] for n in DELAY_STEPS),
                           statistics.median(blocked[n] for n in normal) + 0.5 * DELAY_MS)

    def test_a_real_fsdp1_job_times_the_all_gather_a_delayed_rank_makes_its_peer_wait_in(self):
        self.run_fsdp_job(1)

    def test_a_real_fsdp2_job_times_the_all_gather_a_delayed_rank_makes_its_peer_wait_in(self):
        self.run_fsdp_job(2)

    def test_a_real_fsdp2_job_with_async_unshards_waits_on_them_and_times_the_wait(self):
        # model.unshard(async_op=True) before each forward: FSDP2 waits on the all-gather's
        # handle only if it is a torch Work, so rankwatch's timed handle must be one (a plain
        # wrapper left the all-gather unwaited: parameters read before they arrived, loss NaN).
        self.run_fsdp_job(2, "--async-unshard")


if __name__ == "__main__":
    unittest.main()
