"""End to end over real processes and TCP: `rankwatch kafka`, `rankwatchd`, `rankwatch
simulate`, plus clients rankwatch did not write (kcat, confluent-kafka, grpcio, promtool)."""
import json
import os
import shutil
import subprocess
import time
import unittest

import grpc
from confluent_kafka import Producer
from google.protobuf import json_format

from harness import BIN, Fleet, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2, service_pb2_grpc, telemetry_pb2

NOMINAL_MS = {"dataloader": 5, "forward": 30, "backward": 55, "optimizer": 8, "wait": 2, "step": 100}


class PipelineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fleet = Fleet()
        cls.brokers = cls.fleet.start_broker(partitions=6)
        cls.daemon = cls.fleet.start_daemon(cls.brokers)

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def samples(self):
        return parse_metrics(scrape(self.daemon))

    def wait_aligned(self, job, steps, timeout=60):
        wait_until(lambda: metric(self.samples(), "rankwatch_steps_aligned_total", training_job=job) == steps,
                   timeout, "%d aligned steps of %s" % (steps, job))

    def test_64_ranks_200_steps_are_aligned_and_measured(self):
        out = self.fleet.simulate(self.brokers, "--job", "sim64", "--ranks", "64", "--steps", "200",
                                  "--speed", "max", "--sync", "none")
        self.assertEqual(out["records"], 64 * 200)
        self.assertEqual(out["failed"], 0)
        self.wait_aligned("sim64", 200)
        s = self.samples()
        self.assertEqual(metric(s, "rankwatch_steps_timed_out_total", training_job="sim64"), 0)
        self.assertEqual(metric(s, "rankwatch_job_ranks", training_job="sim64", state="seen"), 64)
        for phase, ms in NOMINAL_MS.items():
            median = metric(s, "rankwatch_step_phase_seconds", training_job="sim64", phase=phase, stat="median")
            worst = metric(s, "rankwatch_step_phase_seconds", training_job="sim64", phase=phase, stat="worst")
            self.assertIsNotNone(median, phase)
            self.assertAlmostEqual(median, ms / 1000.0, delta=0.05 * ms / 1000.0, msg=phase)
            self.assertGreaterEqual(worst, median, phase)

    def test_one_producer_simulates_several_jobs(self):
        out = self.fleet.simulate(self.brokers, "--job", "multi", "--jobs", "3", "--ranks", "8", "--steps", "60",
                                  "--speed", "max", "--fault", "slow-compute:5:0.5")
        self.assertEqual(out["jobs"], 3)
        self.assertEqual(out["records"], 3 * 8 * 60)
        self.assertEqual(out["failed"], 0)
        jobs = ["multi-000", "multi-001", "multi-002"]
        for job in jobs:
            self.wait_aligned(job, 60)
        s = self.samples()
        self.assertIsNone(metric(s, "rankwatch_steps_aligned_total", training_job="multi"))
        stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(self.daemon.endpoints["grpc"]))
        for job in jobs:
            self.assertEqual(metric(s, "rankwatch_job_ranks", training_job=job, state="seen"), 8)
            d = stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)
            # Each job carries the fault, on the same rank; seeds differ (SEED, SEED+1, ...).
            self.assertEqual(list(d.step.culprit_ranks), [5], job)

    def test_ddp_slow_rank_makes_others_wait_in_collectives(self):
        self.fleet.simulate(self.brokers, "--job", "ddp", "--ranks", "16", "--steps", "120", "--speed", "max",
                            "--sync", "ddp", "--report-collective", "--fault", "slow-compute:5:0.3")
        self.wait_aligned("ddp", 120)
        s = self.samples()
        step = lambda stat: metric(s, "rankwatch_step_phase_seconds", training_job="ddp", phase="step", stat=stat)
        # Every rank leaves the step with the slow one: ~124 ms, no skew in step time.
        self.assertAlmostEqual(step("median"), 0.124, delta=0.01)
        self.assertLess(metric(s, "rankwatch_step_skew_ratio", training_job="ddp", phase="step"), 0.01)
        # The waiting ranks show ~24 ms extra collective time; forward shows the culprit's excess.
        self.assertGreater(metric(s, "rankwatch_step_phase_seconds", training_job="ddp", phase="collective",
                                  stat="median"), 0.02)
        self.assertAlmostEqual(metric(s, "rankwatch_step_skew_ratio", training_job="ddp", phase="forward"),
                               0.3, delta=0.05)
        # The diagnosis names the slow rank, never a rank that waits for it.
        self.assertEqual(metric(s, "rankwatch_step_diagnosis", training_job="ddp", diagnosis="compute_straggler"), 1)
        self.assertEqual(metric(s, "rankwatch_step_diagnosis", training_job="ddp", diagnosis="balanced"), 0)
        self.assertEqual(metric(s, "rankwatch_step_worst_rank", training_job="ddp", phase="compute"), 5)
        self.assertGreaterEqual(metric(s, "rankwatch_straggler_score", training_job="ddp", kind="compute"), 0.2)
        self.assertEqual(metric(s, "rankwatch_straggler_culprit_ranks", training_job="ddp", scope="rank",
                                node="node-0"), 1)
        last = metric(s, "rankwatch_job_last_record_timestamp_seconds", training_job="ddp")
        self.assertLess(abs(time.time() - last), 600)  # the simulator stamps records with wall time
        stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(self.daemon.endpoints["grpc"]))
        d = stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job="ddp"), timeout=10)
        self.assertEqual(d.step.label, service_pb2.STEP_COMPUTE_STRAGGLER)
        self.assertEqual(list(d.step.culprit_ranks), [5])
        self.assertEqual(d.step.culprit_node, "node-0")
        self.assertEqual(d.step.scope, service_pb2.SCOPE_RANK)
        self.assertIn("rank 5 on node-0 spends", d.step.note)
        self.assertEqual(d.step.window.steps, 100)

    def test_diagnose_cli(self):
        self.fleet.simulate(self.brokers, "--job", "cli", "--ranks", "16", "--steps", "60", "--speed", "max",
                            "--sync", "none", "--fault", "slow-input:9:3.0")
        self.wait_aligned("cli", 60)
        rw = os.path.join(BIN, "rankwatch")
        r = subprocess.run([rw, "diagnose", "--server", self.daemon.endpoints["grpc"], "--job", "cli"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertIn("job cli", lines[0])
        self.assertIn("STEP TIME  INPUT STRAGGLER", r.stdout)
        self.assertRegex(r.stdout, r"rank 9 on node-1 spends (29\d|30\d)% more time in dataloader")
        self.assertIn("median ms", r.stdout)
        self.assertIn("MEMORY     BALANCED", r.stdout)
        r = subprocess.run([rw, "diagnose", "--server", self.daemon.endpoints["grpc"], "--job", "cli", "--json"],
                           capture_output=True, text=True, timeout=30)
        doc = json.loads(r.stdout)
        self.assertEqual(doc["step"]["label"], "STEP_INPUT_STRAGGLER")
        self.assertEqual(doc["step"]["culprit_ranks"], [9])
        self.assertEqual(doc["step"]["culprit_node"], "node-1")
        self.assertEqual(doc["memory"]["label"], "MEMORY_BALANCED")
        r = subprocess.run([rw, "diagnose", "--server", self.daemon.endpoints["grpc"], "--job", "missing"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stderr.strip().count("\n"), 0)
        self.assertIn("knows no job 'missing'", r.stderr)
        r = subprocess.run([rw, "diagnose", "--server", "127.0.0.1:1", "--job", "cli", "--timeout", "2"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stderr.strip(), "rankwatch diagnose: cannot reach rankwatchd at 127.0.0.1:1")

    def test_ddp_slow_rank_is_named_without_collective_times(self):
        self.fleet.simulate(self.brokers, "--job", "ddp-nocoll", "--ranks", "16", "--steps", "60", "--speed", "max",
                            "--sync", "ddp", "--fault", "slow-compute:11:0.3")
        self.wait_aligned("ddp-nocoll", 60)
        stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(self.daemon.endpoints["grpc"]))
        d = stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job="ddp-nocoll"), timeout=10)
        self.assertEqual(d.step.label, service_pb2.STEP_COMPUTE_STRAGGLER, d.step.note)
        self.assertEqual(list(d.step.culprit_ranks), [11])

    def test_memory_diagnoses_live(self):
        self.fleet.simulate(self.brokers, "--job", "leaky", "--ranks", "16", "--steps", "100", "--speed", "max",
                            "--fault", "memory-leak:all:64")
        self.fleet.simulate(self.brokers, "--job", "full", "--ranks", "16", "--steps", "60", "--speed", "max",
                            "--fault", "memory-pressure:2:0.98")
        self.wait_aligned("leaky", 100)
        self.wait_aligned("full", 60)
        s = self.samples()
        self.assertEqual(metric(s, "rankwatch_memory_diagnosis", training_job="leaky", diagnosis="memory_creep"), 1)
        self.assertAlmostEqual(metric(s, "rankwatch_memory_creep_bytes_per_step", training_job="leaky",
                                      kind="allocated") / 2**20, 64, delta=3)
        self.assertGreater(metric(s, "rankwatch_memory_steps_to_full", training_job="leaky", kind="allocated"), 400)
        self.assertEqual(metric(s, "rankwatch_memory_diagnosis", training_job="full", diagnosis="high_pressure"), 1)
        self.assertEqual(metric(s, "rankwatch_memory_diagnosis_severity", training_job="full"), 2)
        stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(self.daemon.endpoints["grpc"]))
        d = stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job="full"), timeout=10)
        self.assertEqual(d.memory.label, service_pb2.MEMORY_HIGH_PRESSURE)
        self.assertEqual(d.memory.reserved.worst_rank, 2)
        self.assertEqual(d.memory.device_capacity_bytes, 80 * 2**30)
        self.assertGreaterEqual(d.memory.pressure, 0.97)
        d = stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job="leaky"), timeout=10)
        self.assertEqual(d.memory.label, service_pb2.MEMORY_CREEP)
        self.assertTrue(d.memory.HasField("projected_steps_to_full"))

    @unittest.skipUnless(shutil.which("kcat"), "kcat not installed")
    def test_garbage_from_kcat_is_rejected_and_the_daemon_keeps_serving(self):
        before = metric(self.samples(), "rankwatch_events_rejected_total", reason="malformed")
        r = subprocess.run(["kcat", "-P", "-b", self.brokers, "-t", "rankwatch.telemetry", "-k", "evil"],
                           input=b"\xff\xfe this is not a protobuf batch\n", capture_output=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        wait_until(lambda: metric(self.samples(), "rankwatch_events_rejected_total", reason="malformed") > before,
                   30, "the malformed message to be counted")
        # Still consuming and aligning after the bad input.
        self.fleet.simulate(self.brokers, "--job", "after-garbage", "--ranks", "4", "--steps", "10",
                            "--speed", "max")
        self.wait_aligned("after-garbage", 10)
        self.assertIsNone(self.daemon.proc.poll())

    def test_a_confluent_kafka_producer_is_understood(self):
        producer = Producer({"bootstrap.servers": self.brokers})
        for rank in range(2):
            batch = telemetry_pb2.Batch(schema_version=1)
            batch.source.training_job = "from-python"
            batch.source.rank = rank
            batch.source.world_size = 2
            for step in range(12):
                rec = batch.steps.add(step=step, step_time_ns=50_000_000)
                rec.forward_ns = 20_000_000 + rank * 10_000_000
            producer.produce("rankwatch.telemetry", key=b"from-python", value=batch.SerializeToString())
        self.assertEqual(producer.flush(30), 0)
        self.wait_aligned("from-python", 12)
        s = self.samples()
        self.assertAlmostEqual(metric(s, "rankwatch_step_phase_seconds", training_job="from-python",
                                      phase="forward", stat="worst"), 0.030, delta=1e-9)
        self.assertAlmostEqual(metric(s, "rankwatch_step_phase_seconds", training_job="from-python",
                                      phase="forward", stat="median"), 0.025, delta=1e-9)

    def test_grpc_service_with_a_grpcio_client(self):
        self.fleet.simulate(self.brokers, "--job", "grpc-job", "--ranks", "8", "--steps", "30", "--speed", "max")
        self.wait_aligned("grpc-job", 30)
        channel = grpc.insecure_channel(self.daemon.endpoints["grpc"])
        stub = service_pb2_grpc.RankWatchStub(channel)
        jobs = {j.training_job: j for j in stub.ListJobs(service_pb2.ListJobsRequest(), timeout=10).jobs}
        self.assertIn("grpc-job", jobs)
        self.assertEqual(jobs["grpc-job"].world_size, 8)
        self.assertEqual(jobs["grpc-job"].aligned_steps, 30)
        self.assertEqual(jobs["grpc-job"].last_aligned_step, 29)
        # grpc.health.v1.Health/Check with an empty request; SERVING is status 1 (b"\x08\x01").
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda x: x,
                                    response_deserializer=lambda b: b)
        self.assertEqual(check(b"", timeout=10), b"\x08\x01")
        d = stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job="grpc-job"), timeout=10)
        self.assertEqual(d.training_job, "grpc-job")
        self.assertEqual(d.aligned_steps, 30)
        self.assertNotEqual(d.step.label, service_pb2.STEP_DIAGNOSIS_UNSPECIFIED)
        with self.assertRaises(grpc.RpcError) as err:
            stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job="no-such-job"), timeout=10)
        self.assertEqual(err.exception.code(), grpc.StatusCode.NOT_FOUND)
        detail = stub.GetRankDetail(service_pb2.GetRankDetailRequest(training_job="grpc-job", rank=0), timeout=10)
        self.assertEqual(detail.rank, 0)
        self.assertGreater(len(detail.phases), 0)

    def test_step_records_as_json_lines_replay_with_their_clock(self):
        # Issue #48: step records recorded where there is no Kafka (a GPU box, its phases timed
        # on the device) replayed into a daemon elsewhere, their clock and host times kept.
        rw = os.path.join(BIN, "rankwatch")
        folder = os.path.join(self.fleet.workdir, "records")
        os.makedirs(folder)
        origin = time.time_ns() - 10**9
        for rank in range(2):
            with open(os.path.join(folder, "rank%d.steps.jsonl" % rank), "w") as f:
                for step in range(10):
                    late = rank == 1 and step == 3  # its events were not read in time
                    r = telemetry_pb2.StepRecord(
                        step=step, dataloader_ns=2_000_000, forward_ns=30_000_000, backward_ns=50_000_000,
                        optimizer_ns=6_000_000, step_time_ns=100_000_000, end_unix_ns=origin + step * 100_000_000,
                        ops_origin_unix_ns=origin + step * 100_000_000 - 90_000_000,
                        clock=telemetry_pb2.STEP_CLOCK_DEVICE_MISSING if late else telemetry_pb2.STEP_CLOCK_DEVICE)
                    if not late:
                        r.host_phases.forward_ns = 4_000_000
                        r.host_phases.backward_ns = 6_000_000
                        r.ops.add(type=telemetry_pb2.OP_FORWARD_COMPUTE, start_offset_us=2_500, duration_us=30_000,
                                  host_start_offset_us=2_100, host_duration_us=4_000)
                    f.write(json.dumps({"rank": rank, "world_size": 2, "node": "gpu-box", "device": "cuda:%d" % rank,
                                        "record": json_format.MessageToDict(r)}) + "\n")
        r = subprocess.run([rw, "replay", "--brokers", self.brokers, "--job", "jsonl-device", folder],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual((out["ranks"], out["world_size"], out["records"]), (2, 2, 20))
        self.wait_aligned("jsonl-device", 10)
        s = self.samples()
        records = lambda clock: metric(s, "rankwatch_step_records_total", training_job="jsonl-device", clock=clock)
        self.assertEqual((records("device"), records("device_missing"), records("host")), (19, 1, None))
        self.assertAlmostEqual(metric(s, "rankwatch_step_phase_seconds", training_job="jsonl-device",
                                      phase="forward", stat="median"), 0.030, places=9)
        stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(self.daemon.endpoints["grpc"]))
        d = stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job="jsonl-device"), timeout=10)
        t = d.step.timing
        self.assertEqual((t.clock, t.device_steps, t.host_steps, t.device_missing_steps), ("device", 19, 1, 1))
        r = subprocess.run([rw, "diagnose", "--server", self.daemon.endpoints["grpc"], "--job", "jsonl-device"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("timing  device (20 rank-steps), 1 with device times missing", r.stdout)
        r = subprocess.run([rw, "diagnose", "--server", self.daemon.endpoints["grpc"], "--job", "jsonl-device",
                            "--json"], capture_output=True, text=True, timeout=30)
        self.assertEqual(json.loads(r.stdout)["step"]["timing"]["device_steps"], "19")
        # A bad line is one line naming the file and the line, exit code 1.
        bad = os.path.join(self.fleet.workdir, "bad.steps.jsonl")
        with open(bad, "w") as f:
            f.write('{"rank": 0, "record": {"step": "1"}}\n{"rank": 0, "record": {"step": "two"}}\n')
        r = subprocess.run([rw, "replay", "--brokers", self.brokers, "--job", "jsonl-bad", bad],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn(bad + ":2: not a StepRecord", r.stderr)

    @unittest.skipUnless(shutil.which("promtool"), "promtool not installed")
    def test_exposition_passes_promtool(self):
        self.fleet.simulate(self.brokers, "--job", "lint", "--ranks", "2", "--steps", "10", "--speed", "max")
        self.wait_aligned("lint", 10)
        text = scrape(self.daemon)
        r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout + r.stderr, "")
        self.assertIn('rankwatch_build_info{version="', text)


class LifecycleTest(unittest.TestCase):
    def setUp(self):
        self.fleet = Fleet()

    def tearDown(self):
        self.fleet.close()

    def test_embedded_broker_and_clean_sigterm(self):
        daemon = self.fleet.start_daemon(brokers=None)
        self.assertIn("EMBEDDED", daemon.stderr())
        with open(os.path.join(daemon.state_dir, "bootstrap")) as f:
            brokers = f.read().strip()
        self.assertEqual(brokers, daemon.endpoints["brokers"])
        self.fleet.simulate(brokers, "--job", "embedded", "--ranks", "4", "--steps", "20", "--speed", "max")
        wait_until(lambda: metric(parse_metrics(scrape(daemon)), "rankwatch_steps_aligned_total",
                                  training_job="embedded") == 20, 60, "aligned steps")
        code, seconds = daemon.stop()
        self.assertEqual(code, 0, daemon.stderr())
        self.assertLess(seconds, 5.0)

    def test_broker_writes_its_bootstrap_file_and_stops_on_sigterm(self):
        path = os.path.join(self.fleet.workdir, "bootstrap.txt")
        broker = self.fleet.start("kafka", [os.path.join(BIN, "rankwatch"), "kafka", "--partitions", "3",
                                            "--topic", "other.topic", "--bootstrap-file", path])
        wait_until(lambda: os.path.exists(path), 15, "the bootstrap file")
        with open(path) as f:
            brokers = f.read().strip()
        self.assertEqual(broker.stdout().splitlines()[0], brokers)
        out = self.fleet.simulate(brokers, "--topic", "other.topic", "--job", "t", "--ranks", "2",
                                  "--steps", "5", "--speed", "max")
        self.assertEqual(out["delivered"], out["messages"])
        code, seconds = broker.stop()
        self.assertEqual(code, 0, broker.stderr())
        self.assertLess(seconds, 5.0)

    def test_a_job_that_stops_reporting_is_diagnosed_as_hung(self):
        daemon = self.fleet.start_daemon(brokers=None, extra=["--hang-timeout", "1s"])
        brokers = daemon.endpoints["brokers"]
        # Under DDP a hung rank stops every rank at that step.
        self.fleet.simulate(brokers, "--job", "hung", "--ranks", "8", "--steps", "60", "--speed", "max",
                            "--sync", "ddp", "--fault", "hang:3:0:30")
        wait_until(lambda: metric(parse_metrics(scrape(daemon)), "rankwatch_step_diagnosis", training_job="hung",
                                  diagnosis="hang") == 1, 30, "the hang diagnosis")
        stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(daemon.endpoints["grpc"]))
        d = stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job="hung"), timeout=10)
        self.assertEqual(d.step.label, service_pb2.STEP_HANG)
        self.assertEqual(d.step.severity, service_pb2.SEVERITY_CRIT)
        self.assertTrue(d.step.hang.whole_job_stalled)
        self.assertEqual(d.step.hang.lowest_last_step, 29)
        self.assertGreater(d.step.hang.seconds_since_last_aligned, 1.0)

    def test_vendor_iteration_traces_replay_into_aligned_steps(self):
        fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../fixtures")
        daemon = self.fleet.start_daemon(brokers=None, extra=["--align-timeout", "1s"])
        brokers = daemon.endpoints["brokers"]
        rw = os.path.join(BIN, "rankwatch")

        def replay(job, *paths):
            r = subprocess.run([rw, "replay", "--brokers", brokers, "--job", job] +
                               [os.path.join(fixtures, p) for p in paths],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            return json.loads(r.stdout.strip().splitlines()[-1])

        out = replay("msprof", "ascend-msprof-timeline")
        self.assertEqual((out["ranks"], out["records"]), (2, 20))
        out = replay("mindspore", "mindspore-step-trace-raw/cluster_propose")
        self.assertEqual((out["ranks"], out["world_size"], out["records"]), (2, 3, 10))  # ranks 0 and 2
        out = replay("npu", "ascend-pytorch-profiler")
        self.assertEqual((out["ranks"], out["records"]), (2, 2))

        def aligned(job):
            return metric(parse_metrics(scrape(daemon)), "rankwatch_steps_aligned_total", training_job=job)
        wait_until(lambda: aligned("msprof") == 10, 30, "msprof steps")
        wait_until(lambda: aligned("mindspore") == 5, 30, "MindSpore steps (rank 1 absent: by timeout)")
        wait_until(lambda: aligned("npu") == 1, 30, "torch_npu steps")
        s = parse_metrics(scrape(daemon))
        phase = lambda job, p, stat: metric(s, "rankwatch_step_phase_seconds", training_job=job, phase=p, stat=stat)
        # torch_npu step 50: rank 0 Preparing + Stage = 135.60925 ms, rank 1 119.52225 ms.
        self.assertAlmostEqual(phase("npu", "step", "worst"), 0.13560925, places=9)
        self.assertAlmostEqual(phase("npu", "step", "median"), (0.13560925 + 0.11952225) / 2, places=9)
        self.assertAlmostEqual(phase("npu", "collective", "worst"), 0.081515607, places=9)
        self.assertEqual(metric(s, "rankwatch_step_worst_rank", training_job="npu", phase="step"), 0)
        self.assertEqual(metric(s, "rankwatch_job_ranks", training_job="mindspore", state="present"), 2)
        stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(daemon.endpoints["grpc"]))
        d = stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job="msprof"), timeout=10)
        self.assertEqual(d.step.window.steps, 10)
        self.assertEqual(d.step.label, service_pb2.STEP_INPUT_BOUND)  # ~16 ms gaps vs ~15 ms iterations
        self.assertEqual(d.memory.label, service_pb2.MEMORY_NO_DATA)

        # Kineto traces are kernel events (issue #6, test_kernel_live.py); as step records they are not.
        r = subprocess.run([rw, "replay", "--brokers", brokers, "--job", "x", "--format", "steps",
                            os.path.join(fixtures, "kineto")], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no iteration traces", r.stderr)

    def test_a_second_daemon_on_the_same_state_dir_is_refused(self):
        first = self.fleet.start_daemon(brokers=None)
        r = subprocess.run([os.path.join(BIN, "rankwatchd"), "--state-dir", first.state_dir,
                            "--metrics-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--ui-listen", "127.0.0.1:0"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertIn("in use by another rankwatchd", r.stderr)

    def test_bad_arguments_exit_2_with_a_message(self):
        rw = os.path.join(BIN, "rankwatch")
        cases = [
            [rw, "simulate", "--brokers", "127.0.0.1:1", "--job", "j", "--ranks", "4", "--steps", "1",
             "--fault", "slow-compute:9"],
            [rw, "simulate", "--brokers", "127.0.0.1:1", "--job", "j", "--ranks", "4", "--steps", "1",
             "--fault", "melt:1"],
            [rw, "simulate", "--job", "j", "--ranks", "4", "--steps", "1"],
            [rw, "simulate", "--brokers", "127.0.0.1:1", "--job", "j", "--steps", "1"],
            [rw, "simulate", "--brokers", "127.0.0.1:1", "--job", "j", "--steps", "1",
             "--parallel", "dp=2,pp=x"],
            [rw, "simulate", "--brokers", "127.0.0.1:1", "--job", "j", "--steps", "1",
             "--parallel", "dp=2,pp=4", "--fault", "slow-worker:dp=2,pp=0"],
            [rw, "simulate", "--brokers", "127.0.0.1:1", "--job", "j", "--ranks", "4", "--steps", "1",
             "--fault", "stage-imbalance:stage=1"],
            [rw, "simulate", "--brokers", "b", "--job", "j", "--ranks", "4", "--steps", "1", "--speed", "warp"],
            [rw, "frobnicate"],
            [os.path.join(BIN, "rankwatchd"), "--window-steps", "many"],
        ]
        for args in cases:
            r = subprocess.run(args, capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2, " ".join(args) + "\n" + r.stderr)
            self.assertTrue(r.stderr.strip(), args)
        for prog in ([rw, "--help"], [rw, "simulate", "--help"], [rw, "kafka", "--help"],
                     [os.path.join(BIN, "rankwatchd"), "--help"]):
            r = subprocess.run(prog, capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 0, prog)
            self.assertIn("--", r.stdout)

    def test_config_file_keys_and_flags_override_them(self):
        cfg = os.path.join(self.fleet.workdir, "rankwatchd.yaml")
        with open(cfg, "w") as f:
            f.write("window-steps: 5\nalign-timeout: 300ms\nmetrics-listen: 127.0.0.1:1\n")
        daemon = self.fleet.start_daemon(brokers=None, extra=["--config", cfg])
        self.assertNotEqual(daemon.endpoints["metrics"], "127.0.0.1:1")  # the flag won
        brokers = daemon.endpoints["brokers"]
        # One rank of two never reports: steps close by the 300 ms alignment timeout.
        self.fleet.simulate(brokers, "--job", "cfg", "--ranks", "2", "--steps", "12", "--speed", "max",
                            "--sync", "none", "--fault", "hang:1")
        wait_until(lambda: metric(parse_metrics(scrape(daemon)), "rankwatch_steps_aligned_total",
                                  training_job="cfg") == 12, 30, "steps closed by timeout")
        s = parse_metrics(scrape(daemon))
        self.assertEqual(metric(s, "rankwatch_steps_timed_out_total", training_job="cfg"), 12)
        self.assertEqual(metric(s, "rankwatch_window_steps", training_job="cfg"), 5)
        self.assertEqual(metric(s, "rankwatch_job_ranks", training_job="cfg", state="present"), 1)


if __name__ == "__main__":
    unittest.main()
