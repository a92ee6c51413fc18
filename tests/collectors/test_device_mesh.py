"""Issue #46, acceptance item 3: a real 2 x 2 DeviceMesh job's layout is read with no
configuration. 4-rank gloo jobs on CPU (tests/collectors/mesh_job.py) make their mesh with
torch's init_device_mesh and call rankwatch.init() with no layout, publishing to a real
`rankwatch kafka`; the batches read back must carry each rank's coordinates as the mesh says.
rankwatchd, reading the same topic, sees the pp x tp job's layout in its what-if analysis.
Also a real FSDP2 job (fully_shard over a 2-rank mesh): rankwatch's hooks record its forward,
backward, optimizer and collective phases."""
import os
import unittest
import uuid

from harness import Fleet, metric, parse_metrics, scrape, wait_until
from step_records import read_batches, steps_by_rank
from torch_job import TorchJob, torch_available

HERE = os.path.dirname(os.path.abspath(__file__))
MESH_JOB = os.path.join(HERE, "mesh_job.py")
HAVE_TORCH = torch_available()


def layout_fields(layout):
    return {f: getattr(layout, f) for f in ("data_rank", "data_size", "pipeline_rank", "pipeline_size",
                                            "tensor_rank", "tensor_size", "context_rank", "context_size")}


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class DeviceMeshJobTest(unittest.TestCase):
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

    def run_job(self, *args, world=4, steps=6):
        job = "mesh-%s" % uuid.uuid4().hex[:8]
        ranks = TorchJob(self.fleet.workdir, job, self.brokers, steps, *args, world=world,
                         script=MESH_JOB).wait(timeout=120)
        for r in ranks:
            print("rank %d: mesh %s, coordinate %s, layout from %r at init(), %r at the end: %s"
                  % (r["rank"], r["mesh"], r["coordinate"], r["source_at_init"], r["source"], r["layout"]))
            self.assertTrue(r["delivered"], "rank %d's batches were not all delivered" % r["rank"])
        return job, ranks, read_batches(self.brokers, job)

    def assert_layouts(self, ranks, batches, expected, found_at_init):
        """expected: rank -> the layout fields the mesh gives it; every batch of the rank sent
        after the layout was found carries them, and its last batch has them."""
        by_rank = {}
        for b in batches:
            by_rank.setdefault(b.source.rank, []).append(b)
        self.assertEqual(sorted(by_rank), list(range(len(ranks))))
        for r in ranks:
            rank = r["rank"]
            self.assertEqual(r["source"], "device_mesh")
            self.assertEqual(r["source_at_init"], "device_mesh" if found_at_init else "")
            want = expected[rank]
            self.assertEqual({k: v for k, v in r["layout"].items() if k in want}, want)
            with_layout = [b for b in by_rank[rank] if b.source.HasField("layout")]
            self.assertTrue(with_layout, "rank %d sent no layout" % rank)
            self.assertTrue(by_rank[rank][-1].source.HasField("layout"))
            for b in with_layout:
                got = layout_fields(b.source.layout)
                self.assertEqual({k: got[k] for k in want}, want, "rank %d" % rank)
            if found_at_init:
                self.assertEqual(len(with_layout), len(by_rank[rank]), "rank %d: every batch" % rank)

    def test_a_2x2_dp_tp_mesh_is_read_with_no_configuration(self):
        # The mesh exists before rankwatch.init(): found there. Ranks 0-3 of a (2, 2) mesh
        # ("dp", "tp"): dp = rank // 2, tp = rank % 2.
        job, ranks, batches = self.run_job("--shape", "2,2", "--names", "dp,tp")
        for r in ranks:
            self.assertEqual(r["mesh"], {"dp": [r["rank"] // 2, 2], "tp": [r["rank"] % 2, 2]})
        expected = {r["rank"]: dict(data_rank=r["mesh"]["dp"][0], data_size=2, tensor_rank=r["mesh"]["tp"][0],
                                    tensor_size=2, pipeline_rank=0, pipeline_size=1) for r in ranks}
        self.assert_layouts(ranks, batches, expected, found_at_init=True)
        steps = steps_by_rank(batches)
        self.assertEqual({rank: len(s) for rank, s in steps.items()}, {0: 6, 1: 6, 2: 6, 3: 6})

    def test_a_pp_tp_mesh_made_after_init_is_found_at_a_step_boundary(self):
        job, ranks, batches = self.run_job("--shape", "2,2", "--names", "pp,tp", "--mesh-after-init", steps=8)
        expected = {r["rank"]: dict(pipeline_rank=r["mesh"]["pp"][0], pipeline_size=2,
                                    tensor_rank=r["mesh"]["tp"][0], tensor_size=2, data_size=1)
                    for r in ranks}
        self.assert_layouts(ranks, batches, expected, found_at_init=False)
        # rankwatchd read the layout: its what-if analysis has the job's 1 x 2 x 2 shape, and
        # a worker (data rank, stage) is the ranks the mesh puts at that stage.
        wait_until(lambda: metric(parse_metrics(scrape(self.daemon)), "rankwatch_steps_aligned_total",
                                  training_job=job) == 8, 60, "%s: every step aligned" % job)
        whatif = wait_until(lambda: self.whatif(job), 30, "%s: a what-if analysis" % job)
        print("rankwatchd: what-if %s, data x pipeline x tensor = %d x %d x %d, workers %s" % (
            whatif.verdict, whatif.data_parallel_size, whatif.pipeline_size, whatif.tensor_parallel_size,
            [(w.data_rank, w.stage, list(w.ranks)) for w in whatif.slowdown_by_worker]))
        self.assertEqual((whatif.data_parallel_size, whatif.pipeline_size, whatif.tensor_parallel_size), (1, 2, 2))
        self.assertTrue(whatif.slowdown_by_worker)
        for w in whatif.slowdown_by_worker:
            self.assertEqual(sorted(w.ranks), sorted(r["rank"] for r in ranks if r["mesh"]["pp"][0] == w.stage))

    def whatif(self, job):
        d = self.stub.GetDiagnosis(self.service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)
        return d.whatif if d.HasField("whatif") and d.whatif.slowdown_by_worker else None

    def test_torchtitans_dp_replicate_dp_shard_make_the_data_dim(self):
        # torchtitan's hybrid sharding: replicas x shards, data rank = replica * shards + shard.
        job, ranks, batches = self.run_job("--shape", "2,2", "--names", "dp_replicate,dp_shard")
        expected = {r["rank"]: dict(data_rank=r["mesh"]["dp_replicate"][0] * 2 + r["mesh"]["dp_shard"][0],
                                    data_size=4, tensor_size=1, pipeline_size=1) for r in ranks}
        self.assertEqual(sorted(e["data_rank"] for e in expected.values()), [0, 1, 2, 3])
        self.assert_layouts(ranks, batches, expected, found_at_init=True)

    def test_a_mesh_with_unnamed_dims_leaves_no_layout_and_the_job_runs(self):
        job, ranks, batches = self.run_job("--shape", "2,2", "--names", "", world=4, steps=3)
        for r in ranks:
            self.assertEqual((r["source"], r["layout"]), ("", None))
        self.assertTrue(batches)
        self.assertFalse([b for b in batches if b.source.HasField("layout")])

    def test_fsdp2_on_cpu_records_the_step_phases(self):
        # FSDP2 (fully_shard) over a 1-D ("dp",) mesh of 2 ranks, gloo on CPU.
        job, ranks, batches = self.run_job("--shape", "2", "--names", "dp", "--fsdp", world=2, steps=8)
        self.assert_layouts(ranks, batches, {0: dict(data_rank=0, data_size=2), 1: dict(data_rank=1, data_size=2)},
                            found_at_init=True)
        self.assertEqual({b.source.training_strategy for b in batches}, {"fsdp"})
        self.assertTrue(all(b.source.sharded for b in batches))
        steps = steps_by_rank(batches)
        for rank in (0, 1):
            records = [steps[rank][k] for k in sorted(steps[rank])]
            self.assertEqual(len(records), 8)
            means = {p: sum(getattr(s, p + "_ns") for s in records) / len(records) / 1e6
                     for p in ("forward", "backward", "optimizer", "collective")}
            print("rank %d FSDP2 per-step means, ms: %s" % (
                rank, ", ".join("%s %.3f" % (p, v) for p, v in means.items())))
            for s in records:
                for p in ("forward", "backward", "optimizer", "collective"):
                    self.assertGreater(getattr(s, p + "_ns"), 0, "rank %d step %d: no %s" % (rank, s.step, p))


if __name__ == "__main__":
    unittest.main()
