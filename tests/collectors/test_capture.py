"""Captures on real 4-rank PyTorch DDP jobs (gloo on CPU, collectors/python/examples/ddp_example.py)
through real `rankwatch kafka` and `rankwatchd` processes (issue #17, acceptance 1 and 4):

* one rank multiplies two extra square matrices in its forward pass (a real matrix product): the
  straggler alert fires, rankwatchd captures the culprit and a typical rank without being asked,
  and `rankwatch capture show` lists an aten:: matrix-multiply operator in forward first among the
  culprit's excess, with its time on both ranks; the raw traces load as Kineto JSON; the job's
  diagnosis carries the comparison and `rankwatch timeline` marks the capture on both tracks; the
  alert raised after it (the straggler alert's resolution when the finished job is removed,
  --job-ttl 15s --job-retention 5s) carries it as evidence, the alert that triggered it does not;
* a balanced job is never captured;
* `rankwatch capture --ranks R --wait S` captures a named rank of a running job on demand.

RANKWATCH_TEST_STEPS sets the steps of the straggler job (240)."""
import json
import os
import signal
import statistics
import subprocess
import time
import unittest

import grpc

from harness import BIN, Fleet, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import control_pb2, service_pb2, service_pb2_grpc
from torch_job import DIAGNOSED_JOB_ARGS, TorchJob, torch_available

STEPS = int(os.environ.get("RANKWATCH_TEST_STEPS", "240"))
MATMUL_RANK = 2
# 512 x 512 by 512 x 512: ~270 MFLOP, 10-25 ms on one core of the development VM, against a
# ~35 ms step: over 20 % of the step.
MATMUL_SIZE = "512"


@unittest.skipUnless(torch_available(), "torch is not installed for this interpreter (scripts/venv.sh)")
class CaptureTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fleet = Fleet()
        cls.brokers = cls.fleet.start_broker()
        # A finished job is removed 15 + 5 s after its last input: its firing alerts resolve then.
        cls.daemon = cls.fleet.start_daemon(cls.brokers, extra=["--capture-steps", "5", "--job-ttl", "15s",
                                                                "--job-retention", "5s"])
        cls.server = cls.daemon.endpoints["grpc"]
        cls.stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(cls.server))

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def cli(self, *args, timeout=120):
        r = subprocess.run([os.path.join(BIN, "rankwatch"), "capture"] + list(args) + ["--server", self.server],
                           capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        return r.returncode, r.stdout, r.stderr

    def captures(self, job):
        return list(self.stub.ListCaptures(service_pb2.ListCapturesRequest(training_job=job), timeout=10).captures)

    def test_a_straggler_alert_captures_the_culprit_and_its_extra_matrix_product_leads(self):
        job = "capture-matmul"
        run = TorchJob(self.fleet.workdir, job, self.brokers, STEPS, *DIAGNOSED_JOB_ARGS,
                       "--fault-extra-matmul-rank", str(MATMUL_RANK), "--fault-extra-matmul-size",
                       MATMUL_SIZE)
        ranks = run.wait(timeout=400)
        wait_until(lambda: any(c.state == service_pb2.CAPTURE_DONE for c in self.captures(job)), 60,
                   "a finished capture of %s" % job)
        d = self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)
        print("\n%s: diagnosis %s, culprits %s: %s" % (job, service_pb2.StepDiagnosisLabel.Name(d.step.label),
                                                      list(d.step.culprit_ranks), d.step.note))
        print("step medians by rank (ms): %s" % [round(r["median_step_s"] * 1e3, 1) for r in ranks])
        caps = self.captures(job)
        done = [c for c in caps if c.state == service_pb2.CAPTURE_DONE]
        c = done[-1]  # the first one taken
        self.assertTrue(c.requested_by.startswith("straggler alert"), c.requested_by)
        self.assertEqual(c.culprit_rank, MATMUL_RANK)
        self.assertNotEqual(c.reference_rank, MATMUL_RANK)
        code, out, err = self.cli("show", c.id)
        print(out)
        self.assertEqual(code, 0, err)
        top = c.comparison[0]
        self.assertTrue(top.name.startswith("aten::") and "mm" in top.name, [op.name for op in c.comparison[:5]])
        self.assertEqual(top.phase, "forward")
        self.assertGreater(top.culprit_seconds_per_step, 0)
        self.assertGreater(top.excess_seconds_per_step, 0.5 * top.culprit_seconds_per_step)
        lines = out.splitlines()
        header = [i for i, line in enumerate(lines) if line.strip().startswith("operator")]
        self.assertTrue(header, out)
        self.assertIn(top.name, lines[header[0] + 1])
        # The cost of profiling: each rank's step time while profiled, against before.
        for r in c.ranks:
            self.assertEqual(r.state, control_pb2.CONTROL_DONE)
            self.assertEqual(r.steps, 5)
            self.assertGreater(r.profiled_step_seconds, 0)
            print("rank %d (%s): %.1f ms a step profiled, %.1f ms before" % (
                r.rank, r.role, r.profiled_step_seconds * 1e3, r.step_seconds_before * 1e3))
        # The raw traces, as Kineto JSON a Chrome-trace reader takes.
        out_dir = os.path.join(self.fleet.workdir, "traces")
        code, _, err = self.cli("show", c.id, "--out", out_dir)
        self.assertEqual(code, 0, err)
        files = sorted(os.listdir(out_dir))
        self.assertEqual(len(files), 2, files)
        for name in files:
            with open(os.path.join(out_dir, name)) as f:
                trace = json.load(f)
            events = trace["traceEvents"]
            self.assertTrue(events)
            for e in events[:50]:
                self.assertEqual(e["ph"], "X")
                self.assertIsInstance(e["ts"], (int, float))
                self.assertGreaterEqual(e["dur"], 0)
                self.assertIn("step", e["args"])
        code, out, _ = self.cli("list", "--job", job, "--json")
        self.assertEqual(code, 0)
        self.assertIn(c.id, [x["id"] for x in json.loads(out)["captures"]])
        # The diagnosis carries the comparison as evidence, and `rankwatch diagnose` prints it.
        d = self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)
        self.assertEqual(d.capture.id, c.id)
        self.assertEqual(d.capture.comparison[0].name, top.name)
        self.assertLessEqual(len(d.capture.comparison), 10)
        r = subprocess.run([os.path.join(BIN, "rankwatch"), "diagnose", "--server", self.server, "--job", job],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        capture_lines = r.stdout[r.stdout.index("CAPTURE"):].splitlines()
        self.assertIn(c.id, capture_lines[0])
        self.assertIn(top.name + " in forward", capture_lines[1])
        # The job's timeline shows the capture on the culprit's and the reference's tracks.
        path = os.path.join(self.fleet.workdir, "timeline.json")
        r = subprocess.run([os.path.join(BIN, "rankwatch"), "timeline", "--server", self.server, "--job", job,
                            "--steps", "0-", "-o", path], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        print(r.stdout)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        marks = {(e["tid"], e["name"]) for e in events if e.get("cat") == "capture"}
        self.assertIn((MATMUL_RANK, "capture %s (culprit)" % c.id), marks)
        self.assertIn((c.reference_rank, "capture %s (reference)" % c.id), marks)
        self.assertEqual(sorted(e["tid"] for e in events if e["name"] == "thread_name"), [0, 1, 2, 3])
        # Alerts raised after the capture carry its comparison as evidence, as the diagnosis does:
        # here the straggler alert's resolution when the finished job is removed (--job-ttl and
        # --job-retention).
        def alerts():
            return list(self.stub.WatchAlerts(service_pb2.WatchAlertsRequest(training_job=job, backlog_only=True),
                                              timeout=10))
        carried = wait_until(lambda: [a for a in alerts() if a.evidence.capture.id == c.id], 90,
                             "an alert of %s carrying capture %s" % (job, c.id))
        a = carried[0]
        print("alert %s (%s) carries capture %s: %s first" % (a.id, service_pb2.AlertState.Name(a.state), c.id,
                                                             a.evidence.capture.comparison[0].name))
        self.assertIn(a.state, (service_pb2.ALERT_FIRING, service_pb2.ALERT_RESOLVED))
        self.assertGreater(a.sequence, min(x.sequence for x in alerts() if x.id == c.alert_id))
        self.assertEqual(a.evidence.capture.comparison[0].name, top.name)
        self.assertLessEqual(len(a.evidence.capture.comparison), 10)
        trigger = [x for x in alerts() if x.id == c.alert_id and x.state == service_pb2.ALERT_FIRING]
        self.assertTrue(trigger, c.alert_id)
        self.assertFalse(trigger[0].evidence.HasField("capture"))  # raised before the capture

    def test_a_balanced_job_is_not_captured(self):
        job = "capture-balanced"
        TorchJob(self.fleet.workdir, job, self.brokers, 120, *DIAGNOSED_JOB_ARGS).wait(timeout=300)
        wait_until(lambda: metric(parse_metrics(scrape(self.daemon)), "rankwatch_steps_aligned_total",
                                  training_job=job) == 120, 60, "every step aligned")
        time.sleep(2)
        self.assertEqual(self.captures(job), [])

    def test_a_named_rank_is_captured_on_demand(self):
        job = "capture-on-demand"
        run = TorchJob(self.fleet.workdir, job, self.brokers, 400, *DIAGNOSED_JOB_ARGS)
        try:
            wait_until(lambda: (metric(parse_metrics(scrape(self.daemon)), "rankwatch_steps_aligned_total",
                                       training_job=job) or 0) >= 20, 120, "20 aligned steps")
            code, out, err = self.cli("--job", job, "--ranks", "1", "--steps", "3", "--wait", "60")
            print(out)
            self.assertEqual(code, 0, err + out)
            self.assertIn(": done", out)
            self.assertIn("rank 1", out)
            # A capture the daemon cannot send: an unknown job.
            code, _, err = self.cli("--job", "no-such-job", "--ranks", "0")
            self.assertEqual(code, 1)
            self.assertIn("no training job", err)
        finally:
            run.wait(timeout=400)


@unittest.skipUnless(torch_available(), "torch is not installed for this interpreter (scripts/venv.sh)")
class CaptureOutageTest(unittest.TestCase):
    """Acceptance 2: the broker hangs (SIGSTOP) while a capture is requested. The request
    expires at its deadline with a status naming the ranks that did not answer; nothing is
    retried after it (the daemon's producer gives a request up at the same deadline) and
    nothing acts on it (a request that reaches the collectors late is refused as expired);
    training goes on at its pace."""

    def test_a_request_during_a_broker_outage_expires_clearly_and_training_goes_on(self):
        fleet = Fleet()
        self.addCleanup(fleet.close)
        brokers = fleet.start_broker()
        broker = fleet.processes[-1].proc
        daemon = fleet.start_daemon(brokers, extra=["--capture-deadline", "4s", "--auto-capture", "false"])
        server = daemon.endpoints["grpc"]
        stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(server))
        job = "capture-outage"
        # ~3 s to 30 aligned steps, a 12-s outage, then over 5 s of steps after it: 700 steps
        # of ~35 ms.
        run = TorchJob(fleet.workdir, job, brokers, 700, *DIAGNOSED_JOB_ARGS)
        wait_until(lambda: (metric(parse_metrics(scrape(daemon)), "rankwatch_steps_aligned_total",
                                   training_job=job) or 0) >= 30, 120, "30 aligned steps")
        os.kill(broker.pid, signal.SIGSTOP)
        stopped = time.time()
        try:
            c = stub.RequestCapture(service_pb2.RequestCaptureRequest(training_job=job, ranks=[0], steps=3),
                                    timeout=10)
            wait_until(lambda: stub.GetCapture(service_pb2.GetCaptureRequest(id=c.id), timeout=10).capture.state
                       == service_pb2.CAPTURE_EXPIRED, 30, "the capture expired")
            expired = stub.GetCapture(service_pb2.GetCaptureRequest(id=c.id), timeout=10).capture
            print("\n%s: %s" % (c.id, expired.reason))
            self.assertEqual(expired.reason, "no answer from rank 0 before the request's deadline")
            time.sleep(max(0.0, 12 - (time.time() - stopped)))  # past the producer's timeout too
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        resumed = time.time()
        ranks = run.wait(timeout=400)
        # Nothing acted on after the outage: a request already on its way to the hung broker
        # may still arrive once it resumes, and is then refused as expired; none is accepted.
        for r in ranks:
            control = r["collector"]["control"]
            print("rank %d control channel: %s" % (r["rank"], control))
            self.assertEqual(control["accepted"], 0, control)
            refused = dict(control["refused"])
            self.assertLessEqual(refused.pop("expired"), 1 if r["rank"] == 0 else 0, control)
            self.assertEqual(sum(refused.values()), 0, control)
        self.assertEqual(stub.GetCapture(service_pb2.GetCaptureRequest(id=c.id), timeout=10).capture.state,
                         service_pb2.CAPTURE_EXPIRED)
        # Training at its pace: steps during the outage against the others, rank by rank.
        for r in ranks:
            during = [s for s, end in zip(r["step_seconds"], r["step_end_unix"]) if stopped <= end <= resumed]
            outside = [s for s, end in zip(r["step_seconds"], r["step_end_unix"])
                       if end < stopped or end > resumed + 5]
            ends = r["step_end_unix"]
            self.assertTrue(during and outside, "rank %d: %d steps ending %.1f s to %.1f s after the stop, "
                            "resumed at %.1f s" % (r["rank"], len(ends), ends[0] - stopped, ends[-1] - stopped,
                                                   resumed - stopped))
            ratio = statistics.median(during) / statistics.median(outside)
            print("rank %d: median step %.1f ms during the outage, %.1f ms outside it (x%.2f)" % (
                r["rank"], statistics.median(during) * 1e3, statistics.median(outside) * 1e3, ratio))
            self.assertLess(ratio, 1.25)


if __name__ == "__main__":
    unittest.main()
