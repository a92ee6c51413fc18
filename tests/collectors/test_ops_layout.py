"""The `rankwatch` package's pipeline-parallel telemetry (issue #34), read back from a real
`rankwatch kafka`: the rank's parallel layout (given, from Megatron-core's parallel_state, from a
torch DeviceMesh), op scopes, GC pauses from gc.callbacks, and the ops the instrumentation
helpers record. One process.

The DeviceMeshes are real (torch 2.x's init_device_mesh over a 1-process gloo group, so every
dim has size 1; tests/collectors/test_device_mesh.py reads a real 2 x 2 mesh's coordinates in a
4-rank job). Megatron-core is a STAND-IN (a fake `megatron.core.parallel_state` package written
to a temporary folder on sys.path, with the real module's getter names and signatures):
megatron-core is not installed in the test environment (it is not in tests/requirements.txt,
and its parallel_state needs CUDA to initialise model parallelism)."""
import gc
import os
import socket
import sys
import tempfile
import textwrap
import time
import unittest
import uuid

from harness import Fleet
from step_records import read_batches

import rankwatch
from rankwatch.v1 import telemetry_pb2

# Megatron-core's parallel_state, as much of it as rankwatch reads: the getters of
# megatron/core/parallel_state.py (NVIDIA/Megatron-LM) over module globals a test sets.
MEGATRON_STAND_IN = textwrap.dedent('''
    """STAND-IN for megatron.core.parallel_state (tests/collectors/test_ops_layout.py)."""
    STATE = None  # dict of the values below once "initialised"

    def model_parallel_is_initialized():
        return STATE is not None

    def get_data_parallel_rank(with_context_parallel=False, partial_data_parallel=False):
        return STATE["dp"][0]

    def get_data_parallel_world_size(with_context_parallel=False, partial_data_parallel=False):
        return STATE["dp"][1]

    def get_pipeline_model_parallel_rank():
        return STATE["pp"][0]

    def get_pipeline_model_parallel_world_size():
        return STATE["pp"][1]

    def get_tensor_model_parallel_rank():
        return STATE["tp"][0]

    def get_tensor_model_parallel_world_size():
        return STATE["tp"][1]

    def get_context_parallel_rank():
        return STATE["cp"][0]

    def get_context_parallel_world_size():
        return STATE["cp"][1]

    def get_expert_model_parallel_rank():
        assert "ep" in STATE, "expert model parallel group is not initialized"
        return STATE["ep"][0]

    def get_expert_model_parallel_world_size():
        assert "ep" in STATE, "expert model parallel group is not initialized"
        return STATE["ep"][1]

    def get_virtual_pipeline_model_parallel_world_size():
        return STATE.get("vpp")  # None when not interleaved, as Megatron says
''')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def op_name(op_type):
    return telemetry_pb2.OpType.Name(op_type)


class OpsLayoutTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fleet = Fleet()
        cls.brokers = cls.fleet.start_broker(partitions=1)
        cls.megatron_dir = tempfile.mkdtemp(prefix="megatron-stand-in-")
        package = os.path.join(cls.megatron_dir, "megatron", "core")
        os.makedirs(package)
        for init in ("megatron/__init__.py", "megatron/core/__init__.py"):
            open(os.path.join(cls.megatron_dir, init), "w").close()
        with open(os.path.join(package, "parallel_state.py"), "w") as f:
            f.write(MEGATRON_STAND_IN)

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def collector(self, **kwargs):
        job = "ops-%s" % uuid.uuid4().hex[:8]
        args = dict(job=job, brokers=self.brokers, rank=5, world_size=16, flush_interval_ms=50)
        args.update(kwargs)
        rw = rankwatch.init(**args)
        self.addCleanup(rw.close)
        return rw, job

    def shipped(self, rw, job):
        self.assertTrue(rw.flush(timeout_s=10))
        rw.close()
        return read_batches(self.brokers, job)

    def megatron(self, state):
        """The stand-in, imported as megatron.core.parallel_state, with `state`."""
        sys.path.insert(0, self.megatron_dir)
        self.addCleanup(sys.path.remove, self.megatron_dir)
        import megatron.core.parallel_state as ps
        self.addCleanup(lambda: [sys.modules.pop(m) for m in list(sys.modules) if m.startswith("megatron")])
        ps.STATE = state
        return ps

    def test_a_given_layout_is_in_every_batch_and_one_that_does_not_fit_is_refused(self):
        layout = rankwatch.Layout(data_rank=1, data_size=2, pipeline_rank=2, pipeline_size=4,
                                  tensor_rank=1, tensor_size=2, virtual_stages=2)
        rw, job = self.collector(layout=layout)
        self.assertEqual(rw.layout, layout)
        self.assertEqual(rw.layout_source, "argument")
        with rw.step():
            pass
        batches = self.shipped(rw, job)
        self.assertTrue(batches)
        for b in batches:
            self.assertEqual((b.source.layout.data_rank, b.source.layout.pipeline_rank,
                              b.source.layout.pipeline_size, b.source.layout.tensor_size,
                              b.source.layout.virtual_stages), (1, 2, 4, 2, 2))
        with self.assertRaisesRegex(ValueError, "do not multiply to the world size 16"):
            self.collector(layout=rankwatch.Layout(pipeline_size=4))
        with self.assertRaisesRegex(ValueError, "pipeline_rank 4 is not in"):
            rankwatch.Layout(pipeline_rank=4, pipeline_size=4)
        with self.assertRaisesRegex(TypeError, "rankwatch.Layout or a torch DeviceMesh"):
            self.collector(layout=(2, 4, 2))

    def test_without_a_layout_megatrons_parallel_state_is_read(self):
        self.megatron({"dp": (1, 2), "pp": (3, 4), "tp": (0, 2), "cp": (0, 1), "ep": (1, 2), "vpp": 2})
        rw, _ = self.collector()
        self.assertEqual(rw.layout_source, "megatron")
        self.assertEqual(rw.layout, rankwatch.Layout(data_rank=1, data_size=2, pipeline_rank=3,
                                                     pipeline_size=4, tensor_rank=0, tensor_size=2,
                                                     expert_rank=1, expert_size=2, virtual_stages=2))

    def test_megatron_initialised_after_init_is_read_at_the_first_step(self):
        ps = self.megatron(None)  # imported, model parallelism not initialised yet
        rw, job = self.collector()
        self.assertIsNone(rw.layout)
        # An older Megatron without expert groups: the getter asserts, experts count as unused.
        ps.STATE = {"dp": (0, 4), "pp": (1, 2), "tp": (1, 2), "cp": (0, 1)}
        with rw.step():
            pass
        self.assertEqual(rw.layout_source, "megatron")
        self.assertEqual((rw.layout.data_size, rw.layout.pipeline_rank, rw.layout.expert_size,
                          rw.layout.virtual_stages), (4, 1, 1, 1))
        batches = self.shipped(rw, job)
        self.assertEqual(batches[-1].source.layout.pipeline_size, 2)

    def test_a_megatron_layout_that_does_not_fit_the_world_is_left_out(self):
        self.megatron({"dp": (0, 2), "pp": (0, 2), "tp": (0, 2), "cp": (0, 1), "ep": (0, 1)})
        with self.assertLogs("rankwatch", "WARNING") as logs:
            rw, _ = self.collector()  # 8 ranks in Megatron, 16 in the job
        self.assertIsNone(rw.layout)
        self.assertIn("does not fit", logs.output[0])

    def test_op_scopes_are_the_steps_ops(self):
        rw, job = self.collector()
        with self.assertRaisesRegex(ValueError, "unknown op 'forward'; the ops are forward-compute, "
                                                "backward-compute, forward-send"):
            rw.op("forward")
        self.assertEqual(len(rankwatch.OP_NAMES), 17)
        self.assertEqual(rankwatch.OP_NAMES[-1], "backward-weight-compute")
        with rw.step():
            for i in range(2):
                with rw.op("forward-recv", microbatch=i):
                    time.sleep(0.001)
                with rw.op("forward-compute", microbatch=i, chunk=1):
                    time.sleep(0.003)
            t = rankwatch.collector.now_ns()
            rw.add_op("optimizer", t, t + 2_000_000)
        with rw.pause():
            with rw.step():
                with rw.op("forward-compute"):  # paused: nothing
                    pass
        batches = self.shipped(rw, job)
        steps = [s for b in batches for s in b.steps]
        self.assertEqual(len(steps), 1)
        s = steps[0]
        got = [(op_name(o.type), o.microbatch, o.model_chunk) for o in s.ops]
        self.assertEqual(got, [("OP_FORWARD_RECV", 0, 0), ("OP_FORWARD_COMPUTE", 0, 1),
                               ("OP_FORWARD_RECV", 1, 0), ("OP_FORWARD_COMPUTE", 1, 1),
                               ("OP_OPTIMIZER", 0, 0)])
        self.assertGreaterEqual(s.ops[1].duration_us, 3000)
        self.assertGreaterEqual(s.ops[2].start_offset_us, s.ops[1].start_offset_us + s.ops[1].duration_us)
        self.assertEqual(s.ops[4].duration_us, 2000)
        self.assertGreater(s.ops_origin_unix_ns, 0)
        self.assertLessEqual(s.ops_origin_unix_ns, s.end_unix_ns)

    def test_gc_pauses_are_timed_per_step_by_default(self):
        rw, job = self.collector()

        class Node:
            def __init__(self):
                self.me = self  # a reference cycle: only the collector frees it

        with rw.step():
            garbage = [Node() for _ in range(200_000)]
            del garbage
            gc.collect()  # a full collection of 200,000 cycles: milliseconds
        with rw.step():
            pass
        stats = rw.stats()
        batches = self.shipped(rw, job)
        steps = {s.step: s for b in batches for s in b.steps}
        self.assertGreaterEqual(steps[0].gc_count, 1)
        self.assertGreater(steps[0].gc_ns, 1_000_000)
        # The long collection is an op too (from 1 ms); short ones count in gc_ns only.
        gc_ops = [o for o in steps[0].ops if o.type == telemetry_pb2.OP_GC]
        self.assertGreaterEqual(len(gc_ops), 1)
        self.assertGreaterEqual(max(o.duration_us for o in gc_ops), 1000)
        self.assertLessEqual(sum(o.duration_us for o in gc_ops) * 1000, steps[0].gc_ns + 1000 * len(gc_ops))
        self.assertTrue(steps[1].HasField("gc_ns"))  # watched: 0 is said, not left out
        self.assertGreaterEqual(stats["gc_pauses"], 1)
        self.assertFalse([c for c in gc.callbacks if getattr(c, "__name__", "") == "rankwatch_gc_callback"],
                         "close() took the callback off")

    def test_gc_watching_can_be_turned_off(self):
        before = len(gc.callbacks)
        rw, job = self.collector(watch_gc=False)
        self.assertEqual(len(gc.callbacks), before)
        os.environ["RANKWATCH_WATCH_GC"] = "0"
        self.addCleanup(os.environ.pop, "RANKWATCH_WATCH_GC")
        rw2, _ = self.collector()
        self.assertEqual(len(gc.callbacks), before)
        rw2.close()
        rw, job = self.collector(watch_gc=False)
        with rw.step():
            gc.collect()
        steps = [s for b in self.shipped(rw, job) for s in b.steps]
        self.assertEqual(len(steps), 1)
        self.assertFalse(steps[0].HasField("gc_ns"))
        self.assertEqual(len(steps[0].ops), 0)

    def test_the_helpers_record_their_ops(self):
        rw, job = self.collector(watch_gc=False)

        class Optimizer:  # anything with step(): instrument_optimizer wraps it
            def step(self):
                time.sleep(0.002)

        optimizer = rw.instrument_optimizer(Optimizer())

        def slow_batches():
            for i in range(2):
                time.sleep(0.002)
                yield i

        for _ in rw.dataloader(slow_batches()):
            with rw.step():
                optimizer.step()
        steps = [s for b in self.shipped(rw, job) for s in b.steps]
        self.assertEqual(len(steps), 2)
        for s in steps:
            self.assertEqual([op_name(o.type) for o in s.ops], ["OP_DATA_LOADING", "OP_OPTIMIZER"])
            self.assertEqual(s.ops[0].start_offset_us, 0)  # the fetch starts the step
            self.assertGreaterEqual(s.ops[1].duration_us, 2000)
            # The same spans as the phases they also time.
            self.assertLessEqual(abs(s.optimizer_ns / 1000 - s.ops[1].duration_us), 1)
            self.assertLessEqual(abs(s.dataloader_ns / 1000 - s.ops[0].duration_us), 1)

    def test_a_disabled_collector_still_checks_op_names(self):
        rw = rankwatch.init(enabled=False)
        with rw.op("backward-send", microbatch=3):
            pass
        with self.assertRaises(ValueError):
            rw.op("backward_send")
        self.assertIsNone(rw.layout)


class RealDeviceMeshTest(unittest.TestCase):
    """Real torch DeviceMeshes in this one process: a gloo group of 1 rank (made and destroyed
    by each test), meshes of shape (1,), (1, 1), (1, 1, 1)."""

    @classmethod
    def setUpClass(cls):
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        cls.dist, cls.init_device_mesh = dist, staticmethod(init_device_mesh)
        cls.fleet = Fleet()
        cls.brokers = cls.fleet.start_broker(partitions=1)

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def start_group(self):
        self.dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0, world_size=1)

        def stop():
            self.dist.destroy_process_group()
            gc.collect()  # the meshes go with their group: none is found by the next test
        self.addCleanup(stop)

    def mesh(self, shape, names):
        return self.init_device_mesh("cpu", shape, mesh_dim_names=names)

    def collector(self, **kwargs):
        job = "mesh-%s" % uuid.uuid4().hex[:8]
        rw = rankwatch.init(job=job, brokers=self.brokers, rank=0, world_size=1, flush_interval_ms=50, **kwargs)
        self.addCleanup(rw.close)
        return rw, job

    def test_a_device_mesh_given_is_the_layout(self):
        self.start_group()
        mesh = self.mesh((1, 1, 1), ("pp", "dp", "tp"))
        self.assertEqual(rankwatch.Layout.from_mesh(mesh), rankwatch.Layout())
        rw, job = self.collector(layout=mesh)
        self.assertEqual((rw.layout, rw.layout_source), (rankwatch.Layout(), "argument"))
        with self.assertRaisesRegex(ValueError, "'replicate' is none of dp, pp, tp, cp, ep"):
            rankwatch.Layout.from_mesh(self.mesh((1, 1), ("replicate", "shard")))
        with self.assertRaisesRegex(ValueError, "no dim names"):
            rankwatch.Layout.from_mesh(self.mesh((1,), None))
        with self.assertRaisesRegex(ValueError, "both a 'dp' dim and dp_shard"):
            rankwatch.Layout.from_mesh(self.mesh((1, 1), ("dp", "dp_shard")))

    def test_a_mesh_made_before_init_is_found_with_no_configuration(self):
        self.start_group()
        mesh = self.mesh((1, 1), ("dp", "tp"))
        mesh["tp"]  # a slice is no root mesh: not a candidate of its own
        rw, job = self.collector()
        self.assertEqual((rw.layout, rw.layout_source), (rankwatch.Layout(), "device_mesh"))
        with rw.step():
            pass
        self.assertTrue(rw.flush(timeout_s=10))
        rw.close()
        batches = read_batches(self.brokers, job)
        self.assertTrue(batches)
        self.assertTrue(all(b.source.HasField("layout") for b in batches))

    def test_a_mesh_made_after_init_is_found_at_the_next_step(self):
        rw, job = self.collector()  # torch.distributed not initialised: nothing to look for
        with rw.step():
            pass
        self.assertEqual((rw.layout, rw.layout_source, rw._mesh_watch.scans), (None, "", 0))
        self.start_group()
        mesh = self.mesh((1,), ("tp",))
        self.assertIsNone(rw.layout)  # until a step boundary
        with rw.step():
            pass
        self.assertEqual((rw.layout, rw.layout_source), (rankwatch.Layout(), "device_mesh"))
        self.assertFalse(rw._layout_pending)  # found: no more looking
        del mesh

    def test_a_mesh_rankwatch_cannot_read_leaves_no_layout_with_one_log_line(self):
        self.start_group()
        mesh = self.mesh((1, 1), ("replicate", "shard"))
        with self.assertLogs("rankwatch", "INFO") as logs:
            rw, job = self.collector()
            for _ in range(3):
                with rw.step():
                    pass
        said = [line for line in logs.output if "layout" in line]
        self.assertEqual(len(said), 1, logs.output)
        self.assertIn("WARNING:rankwatch:rankwatch: no parallel layout from DeviceMesh((replicate=1, shard=1)", said[0])
        self.assertIn("'replicate' is none of dp, pp, tp, cp, ep", said[0])
        self.assertEqual((rw.layout, rw.layout_source), (None, ""))
        # A mesh that does not make the world (1 rank here, 16 said): no layout, one line.
        ok = self.mesh((1,), ("dp",))
        with self.assertLogs("rankwatch", "WARNING") as logs:
            rw3 = rankwatch.init(job="mesh-big", brokers=self.brokers, rank=0, world_size=16)
            self.addCleanup(rw3.close)
        said = [line for line in logs.output if "DeviceMesh((dp=1)" in line]
        self.assertEqual(len(said), 1, logs.output)
        self.assertIn("does not fit", said[0])
        self.assertIsNone(rw3.layout)
        del mesh, ok


if __name__ == "__main__":
    unittest.main()
