"""Issue #49, item 3: the op records of Megatron-core's and DeepSpeed's own pipeline schedules,
with no change to the training loop (rankwatch/megatron.py, rankwatch/deepspeed.py), read back
from a real `rankwatch kafka`.

Real 2-stage jobs on CPU with gloo (tests/collectors/framework_job.py), 4 microbatches, 2 steps:
- Megatron-core (tests/requirements.txt): parallel_state.initialize_model_parallel and
  get_forward_backward_func()'s schedule, 1F1B (forward_backward_pipelining_without_interleaving)
  and interleaved with 2 model chunks a stage (forward_backward_pipelining_with_interleaving);
  rankwatch.init() alone finds the layout, instruments config.timers and opens a step per
  schedule call. Megatron's P2PCommunicator, forward_step and backward_step run unchanged; two
  test shims point its CUDA device at the CPU (framework_job.py says which).
- DeepSpeed: a PipelineModule trained by its PipelineEngine's train_batch() (TrainSchedule),
  instrumented by rw.instrument_deepspeed(engine).

Asserted: each step's ops, in order, with the study's names, microbatches and model chunks, as
the schedule's source runs them (cited at each expectation); the layout; that evaluation
(forward_only, eval_batch) recorded nothing; and that rankwatchd, reading the same topic,
analyses every step in its what-if model (none rejected)."""
import os
import unittest
import uuid

from harness import Fleet, wait_until
from step_records import read_batches, steps_by_rank
from torch_job import TorchJob, torch_available

from rankwatch.v1 import telemetry_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
FRAMEWORK_JOB = os.path.join(HERE, "framework_job.py")
HAVE_TORCH = torch_available()
STEPS, MICROBATCHES = 2, 4


def name(op_type):
    return telemetry_pb2.OpType.Name(op_type)[3:].lower().replace("_", "-")


def ops_of(record):
    """The step's ops as (name, microbatch, chunk), by start (a batched p2p call's two ops start
    together: then by type, the order rankwatch opens them in)."""
    return [(name(o.type), o.microbatch, o.model_chunk)
            for o in sorted(record.ops, key=lambda o: (o.start_offset_us, o.type))]


def fc(mb, chunk=0):
    return ("forward-compute", mb, chunk)


def bc(mb, chunk=0):
    return ("backward-compute", mb, chunk)


def op(kind, mb, chunk=0):
    return (kind, mb, chunk)


# Megatron-core 0.16.1, megatron/core/pipeline_parallel/schedules.py,
# forward_backward_pipelining_without_interleaving, 2 stages, 4 microbatches. Stage 0 warms up
# with 1 forward (num_warmup_microbatches = 2 - 0 - 1): forward_step ('forward-compute'),
# send_forward ('forward-send'); its recv_forward calls are untimed on the first stage
# (p2p_communication.py, P2PCommunicator.recv_forward: is_first_stage). Steady state, 3 times:
# forward_step, send_forward_recv_backward ('forward-send-backward-recv': a forward-send and a
# backward-recv), backward_step ('backward-compute'); send_backward_recv_forward and
# send_backward are untimed on the first stage. Cool-down: recv_backward ('backward-recv'),
# backward_step. Backwards pop the oldest forward (input_tensors.pop(0)).
MEGATRON_1F1B = {
    0: [fc(0), op("forward-send", 0),
        fc(1), op("forward-send", 1), op("backward-recv", 0), bc(0),
        fc(2), op("forward-send", 2), op("backward-recv", 1), bc(1),
        fc(3), op("forward-send", 3), op("backward-recv", 2), bc(2),
        op("backward-recv", 3), bc(3)],
    # Stage 1, the last: no warm-up; recv_forward ('forward-recv'), then 4 times forward_step,
    # send_forward_recv_backward (untimed on the last stage), backward_step, and
    # send_backward_recv_forward ('backward-send-forward-recv': a forward-recv of the next
    # microbatch and a backward-send), the last time send_backward ('backward-send').
    1: [op("forward-recv", 0), fc(0), bc(0), op("forward-recv", 1), op("backward-send", 0),
        fc(1), bc(1), op("forward-recv", 2), op("backward-send", 1),
        fc(2), bc(2), op("forward-recv", 3), op("backward-send", 2),
        fc(3), bc(3), op("backward-send", 3)],
}


def deepspeed_expected(stage):
    """The ops DeepSpeed's TrainSchedule (deepspeed/runtime/pipe/schedule.py) runs on `stage`
    of 2 over 4 microbatches, with the microbatch each instruction acts on, from the schedule's
    own step -> (micro_batch_id, is_forward) map: in a forward step RecvActivation,
    LoadMicroBatch and ForwardPass act on the step's microbatch and SendGrad on the previous
    step's; in a backward step RecvGrad and BackwardPass on the step's, SendActivation on the
    previous step's. ReduceTiedGrads: no tied weights here, not recorded."""
    from deepspeed.runtime.pipe import schedule
    from rankwatch.deepspeed import INSTRUCTION_OPS
    sched = schedule.TrainSchedule(micro_batches=MICROBATCHES, stages=2, stage_id=stage)
    out, prev = [], -1
    for step_id, cmds in enumerate(sched.steps()):
        mb, forward = sched._step_to_micro_batch(step_id)
        for cmd in cmds:
            kind = type(cmd).__name__
            if kind == "ReduceTiedGrads":
                continue
            on_prev = kind in ("SendGrad", "SendActivation")
            label = prev if on_prev else (mb if kind not in ("ReduceGrads", "OptimizerStep") else 0)
            out.append((INSTRUCTION_OPS[kind], label, 0))
        prev = mb
    return out


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class FrameworkOpsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import grpc
        from rankwatch.v1 import service_pb2, service_pb2_grpc
        cls.service_pb2 = service_pb2
        cls.fleet = Fleet()
        try:
            cls.brokers = cls.fleet.start_broker(partitions=1)
            cls.daemon = cls.fleet.start_daemon(cls.brokers)
        except BaseException:
            cls.fleet.close()
            raise
        cls.stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(cls.daemon.endpoints["grpc"]))

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def run_job(self, *args):
        job = "framework-%s" % uuid.uuid4().hex[:8]
        ranks = TorchJob(self.fleet.workdir, job, self.brokers, STEPS, "--microbatches", str(MICROBATCHES),
                         *args, world=2, script=FRAMEWORK_JOB).wait(timeout=240)
        for r in ranks:
            print("rank %d: stage %d, %.1f s, losses %s, layout from %r"
                  % (r["rank"], r["stage"], r["seconds"], r["losses"], r["layout_source"]))
            self.assertTrue(r["delivered"], "rank %d's batches were not all delivered" % r["rank"])
        batches = read_batches(self.brokers, job)
        self.assert_whatif_takes_every_step(job)
        return ranks, batches, steps_by_rank(batches)

    def assert_whatif_takes_every_step(self, job):
        """rankwatchd's what-if analysis (docs/whatif.md) builds its step model from these ops:
        every step is analysed, none skipped or rejected."""
        def whatif():
            d = self.stub.GetDiagnosis(self.service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)
            w = d.whatif if d.HasField("whatif") else None
            return w if w is not None and w.analysed_steps + w.skipped_steps >= STEPS else None
        w = wait_until(whatif, 30, "%s: the what-if of %d steps" % (job, STEPS))
        print("what-if: %d steps analysed, %d skipped %r; %d x %d x %d" % (
            w.analysed_steps, w.skipped_steps, w.skipped_reason, w.data_parallel_size, w.pipeline_size,
            w.tensor_parallel_size))
        self.assertEqual((w.analysed_steps, w.skipped_steps, w.pipeline_size), (STEPS, 0, 2), w.skipped_reason)

    def assert_layout(self, batches, virtual_stages=1):
        for b in batches:
            lay = b.source.layout
            self.assertEqual((lay.pipeline_rank, lay.pipeline_size, lay.data_size, lay.tensor_size,
                              max(1, lay.virtual_stages)),
                             (b.source.rank, 2, 1, 1, virtual_stages), "rank %d" % b.source.rank)

    def test_megatron_1f1b_ops_with_no_configuration(self):
        ranks, batches, steps = self.run_job("--framework", "megatron")
        for r in ranks:
            self.assertEqual(r["schedule"], "forward_backward_pipelining_without_interleaving")
            self.assertEqual(r["layout_source"], "megatron")
        self.assert_layout(batches)
        for rank in (0, 1):
            # Two training steps; the forward-only evaluation opened none.
            self.assertEqual(sorted(steps[rank]), list(range(STEPS)), "rank %d" % rank)
            for step, record in sorted(steps[rank].items()):
                self.assertEqual(ops_of(record), MEGATRON_1F1B[rank], "rank %d step %d" % (rank, step))

    def test_megatron_interleaved_ops_carry_their_model_chunks(self):
        from megatron.core.pipeline_parallel.schedules import get_schedule_table
        ranks, batches, steps = self.run_job("--framework", "megatron", "--vpp", "2")
        for r in ranks:
            self.assertEqual(r["schedule"], "forward_backward_pipelining_with_interleaving")
        self.assert_layout(batches, virtual_stages=2)
        # forward_backward_pipelining_with_interleaving runs forward k on model chunk
        # model_chunk_id_table[k] for microbatch microbatch_id_table[k] of
        # get_schedule_table(4 microbatches, 2 chunks, microbatch_group_size_per_vp_stage = 2),
        # and backward k on chunk 2 - 1 - model_chunk_id_table[k] (get_model_chunk_id(k,
        # forward=False)), each chunk's backwards popping its forwards in order.
        table = get_schedule_table(MICROBATCHES, 2, 2)
        want_forwards = [fc(mb, c) for mb, c in table]
        want_backwards = [bc(mb, 1 - c) for mb, c in table]
        for rank in (0, 1):
            self.assertEqual(sorted(steps[rank]), list(range(STEPS)), "rank %d" % rank)
            for step, record in sorted(steps[rank].items()):
                ops = ops_of(record)
                self.assertEqual([o for o in ops if o[0] == "forward-compute"], want_forwards)
                self.assertEqual([o for o in ops if o[0] == "backward-compute"], want_backwards)
                # A send carries the labels of the compute of its direction it follows (the
                # warm-up's last batched call sends no gradient yet: no backward precedes it).
                last = {}
                for o in ops:
                    direction = o[0].split("-")[0]
                    if o[0].endswith("-compute"):
                        last[direction] = o[1:]
                    elif o[0].endswith("-send") and direction in last:
                        self.assertEqual(o[1:], last[direction], "rank %d step %d: %s" % (rank, step, ops))
                # A receive carries those of the compute of its direction it precedes.
                for i, o in enumerate(ops):
                    if o[0].endswith("-recv"):
                        direction = o[0].split("-")[0]
                        following = [n for n in ops[i + 1:] if n[0] == direction + "-compute"]
                        if following:
                            self.assertEqual(o[1:], following[0][1:], "rank %d step %d: %s" % (rank, step, ops))
                if step == 0:
                    print("rank %d step 0: %s" % (rank, " ".join("%s:%d/%d" % o for o in ops)))
                # The p2p calls of forward_backward_pipelining_with_interleaving (2 stages, 8
                # virtual microbatches; warm-up 4 on stage 0, 2 on stage 1): the first stage's
                # initial recv_forward is untimed, the last stage's times 'forward-recv'; each
                # warm-up forward but the last is followed by send_forward_recv_forward
                # ('forward-send-forward-recv'), the last by
                # send_forward_backward_recv_forward_backward (all four directions), as is each
                # steady-state forward + backward pair; each cool-down backward by
                # send_backward_recv_backward. These batched calls are timed also where a
                # direction has no peer or nothing to send (the what-if makes those no-ops):
                # 8 forward sends, 8 + stage forward receives, 9 backward sends and receives.
                counts = {k: sum(1 for o in ops if o[0] == k) for k in
                          ("forward-send", "forward-recv", "backward-send", "backward-recv")}
                self.assertEqual(counts, {"forward-send": 8, "forward-recv": 8 + rank, "backward-send": 9,
                                          "backward-recv": 9}, "rank %d step %d" % (rank, step))

    def test_deepspeed_pipeline_engine_instructions(self):
        ranks, batches, steps = self.run_job("--framework", "deepspeed")
        for r in ranks:
            self.assertEqual(r["layout_source"], "deepspeed")
            self.assertEqual(r["ops_recorded_by_eval"], 0, "eval_batch recorded ops")
        self.assert_layout(batches)
        self.assertTrue(all(b.source.training_strategy == "deepspeed_pipeline" for b in batches))
        for rank in (0, 1):
            want = deepspeed_expected(rank)
            self.assertEqual(sorted(steps[rank]), list(range(STEPS)), "rank %d" % rank)
            for step, record in sorted(steps[rank].items()):
                self.assertEqual(ops_of(record), want, "rank %d step %d" % (rank, step))



class MegatronTimersTest(unittest.TestCase):
    """What the real jobs above do not reach, in one process: megatron-core's real config classes
    and its real Timers (as Megatron-LM's train() assigns them; log level 0, so its level-1 and
    level-2 timers are DummyTimers, as they must be on a CPU: its Timer synchronises CUDA),
    driven in the order its source makes the calls after a schedule's computes:
    finalize_model_grads (megatron/core/distributed/finalize_model_grads.py: 'all-grads-sync',
    'conditional-embedder-grads-all-reduce', 'non-tensor-parallel-grads-all-reduce',
    'embedding-grads-all-reduce'), MegatronOptimizer.step (optimizer/optimizer.py:
    'optimizer-copy-to-main-grad', 'optimizer-clip-main-grad', 'optimizer-count-zeros',
    'optimizer-inner-step', 'optimizer-copy-main-to-model-params') and then
    DistributedOptimizer.step_with_ready_grads' 'params-all-gather' (optimizer/distrib_optimizer.py),
    on a middle stage of 3 with the distributed optimizer."""

    def test_megatron_lm_timers_wrapped_and_the_optimizer_ops(self):
        import torch
        import rankwatch
        from megatron.core.model_parallel_config import ModelParallelConfig
        from megatron.core.optimizer import OptimizerConfig
        from megatron.core.timers import Timers
        from megatron.core.transformer.transformer_config import TransformerConfig
        from rankwatch.megatron import RankwatchTimers

        fleet = Fleet()
        self.addCleanup(fleet.close)
        brokers = fleet.start_broker(partitions=1)
        job = "megatron-timers-%s" % uuid.uuid4().hex[:8]
        rw = rankwatch.init(job=job, brokers=brokers, rank=1, world_size=3, flush_interval_ms=50, watch_gc=False,
                            layout=rankwatch.Layout(pipeline_rank=1, pipeline_size=3))
        self.addCleanup(rw.close)
        config = TransformerConfig(num_layers=3, hidden_size=8, num_attention_heads=1,
                                   pipeline_model_parallel_size=3, pipeline_dtype=torch.float32)
        optimizer_config = OptimizerConfig(use_distributed_optimizer=True)
        timers = Timers(0, "max")  # Megatron-LM's global timers (megatron/training/global_vars.py)
        config.timers = timers  # as megatron/training/training.py's train() does
        optimizer_config.timers = timers
        self.assertIsInstance(config.timers, RankwatchTimers)
        self.assertIs(config.timers.inner, timers)
        self.assertEqual(config.timers.log, timers.log)  # Megatron's own logging: its Timers'

        class Chunk:  # a DDP model chunk, as finalize_model_grads sees it
            class ddp_config:
                use_distributed_optimizer = True

        def forward_step(config, current_microbatch, vp_stage=None):
            config.timers("forward-compute", log_level=2).start()
            config.timers("forward-compute").stop()

        def backward_step(config):
            config.timers("backward-compute", log_level=2).start()
            config.timers("backward-compute").stop()

        def finalize_model_grads(model, config):
            for name in ("all-grads-sync", "conditional-embedder-grads-all-reduce",
                         "non-tensor-parallel-grads-all-reduce", "embedding-grads-all-reduce"):
                config.timers(name, log_level=1).start(barrier=False)
                config.timers(name).stop()

        def forward_backward_no_pipelining(config, model, num_microbatches=1, forward_only=False):
            config.timers("forward-backward", log_level=1).start(barrier=False)
            forward_step(config, current_microbatch=0)
            if not forward_only:
                backward_step(config)
                finalize_model_grads(model, config)
            config.timers("forward-backward").stop()

        def optimizer_step(config):
            timers = config.timers
            for name in ("optimizer-copy-to-main-grad", "optimizer-clip-main-grad", "optimizer-count-zeros",
                         "optimizer-inner-step", "optimizer-copy-main-to-model-params", "params-all-gather"):
                timers(name, log_level=1).start(barrier=False)
                timers(name).stop()

        for _ in range(2):
            forward_backward_no_pipelining(config, [Chunk()])
            optimizer_step(optimizer_config)
        # evaluate() (megatron/training/training.py): timing off, a forward-only schedule, back on.
        config.timers = None
        self.assertIsNone(config.timers)
        config.timers = timers
        forward_backward_no_pipelining(config, [Chunk()], forward_only=True)
        with rw.pause():
            self.assertIs(config.timers, timers)
            self.assertIsNone(ModelParallelConfig.__dict__["timers"])
        self.assertIsInstance(config.timers, RankwatchTimers)
        self.assertTrue(rw.flush(timeout_s=10))
        rw.close()
        steps = steps_by_rank(read_batches(brokers, job))[1]
        self.assertEqual(sorted(steps), [0, 1])  # the forward-only schedule opened no step
        want = [("forward-compute", 0, 0), ("backward-compute", 0, 0), ("grads-reduce-scatter", 0, 0),
                ("layernorm-grads-all-reduce", 0, 0), ("optimizer-clip-main-grad", 0, 0), ("optimizer", 0, 0)]
        self.assertEqual(ops_of(steps[0]), want)  # no embedding all-reduce on a middle stage
        # The distributed optimizer's all-gather at the end of step 0 is the first op of step 1.
        self.assertEqual(ops_of(steps[1]), [("params-all-gather", 0, 0)] + want)
        self.assertEqual(min(o.start_offset_us for o in steps[1].ops), 0)

if __name__ == "__main__":
    unittest.main()
