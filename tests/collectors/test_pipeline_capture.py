"""Acceptance of issue #47, item 1: evidence never silences the job it inspects.

A real pipeline job (collectors/python/examples/pipeline_example.py: 2 stages x 2 replicas, 1F1B
over 4 microbatches, every op of every microbatch recorded) whose worker (data rank 1, stage 1)
does 1.5x the compute. The what-if names it, its straggler alert fires, and rankwatchd captures
the culprit and a typical rank with the profiler (--capture-steps 5) without being asked. The
captured ranks' steps are the largest messages a collector sends (ops, then thousands of
profiler events): every step of every rank must still arrive, the capture complete, no hang
alert fire, and the what-if reach the job's last step. Once with the collectors' default
message limit (1,000,000 bytes, Kafka's), once with 256 KiB (RANKWATCH_MAX_MESSAGE_BYTES), where
the capture's events travel in more, smaller messages.

RANKWATCH_TEST_STEPS sets the steps (120)."""
import os
import unittest

from alert_client import Watcher
from harness import DaemonTestCase, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2
from step_records import read_batches
from torch_job import TorchJob, torch_available

HERE = os.path.dirname(os.path.abspath(__file__))
PIPELINE = os.path.join(HERE, "../../collectors/python/examples/pipeline_example.py")
STEPS = int(os.environ.get("RANKWATCH_TEST_STEPS", "120"))
PIPELINE_JOB_ARGS = ("--hidden", "48", "--device-ms", "4")  # as test_pipeline_job.py
SLOW_RANK = 3  # data rank 1, stage 1: rank = stage * 2 + data rank


@unittest.skipUnless(torch_available(), "torch is not installed for this interpreter (scripts/venv.sh)")
class PipelineCaptureTest(DaemonTestCase):
    daemon_args = ("--capture-steps", "5")

    def run_captured(self, job, max_message_bytes=None):
        watcher = Watcher(self.daemon.endpoints["grpc"], job=job)
        saved = os.environ.get("RANKWATCH_MAX_MESSAGE_BYTES")
        if max_message_bytes is not None:
            os.environ["RANKWATCH_MAX_MESSAGE_BYTES"] = str(max_message_bytes)
        try:
            run = TorchJob(self.fleet.workdir, job, self.brokers, STEPS, *PIPELINE_JOB_ARGS,
                           "--fault-slow-worker", "1,1", "--fault-slow-factor", "1.5", script=PIPELINE)
        finally:
            if saved is None:
                os.environ.pop("RANKWATCH_MAX_MESSAGE_BYTES", None)
            else:
                os.environ["RANKWATCH_MAX_MESSAGE_BYTES"] = saved
        try:
            ranks = run.wait(timeout=400)
            # Every step of every rank: aligned with all four ranks present, none timed out.
            wait_until(lambda: metric(parse_metrics(scrape(self.daemon)), "rankwatch_steps_aligned_total",
                                      training_job=job) == STEPS, 60, "%s: every step aligned" % job)
            captures = lambda: list(self.stub.ListCaptures(  # noqa: E731
                service_pb2.ListCapturesRequest(training_job=job), timeout=10).captures)
            wait_until(lambda: any(c.state == service_pb2.CAPTURE_DONE for c in captures()), 60,
                       "a finished capture of %s" % job)
            d = self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)
        finally:
            watcher.stop()
        samples = parse_metrics(scrape(self.daemon))
        alerts = [a for a, _ in watcher.alerts]
        caps = captures()
        print("\n%s: what-if %s (S %.3f, steps %d-%d, %d analysed, %d skipped: %s)" % (
            job, d.whatif.verdict, d.whatif.slowdown, d.whatif.first_step, d.whatif.last_step,
            d.whatif.analysed_steps, d.whatif.skipped_steps, d.whatif.skipped_reason))
        for c in caps:
            print("  capture %s %s by %s: %s" % (c.id, service_pb2.CaptureState.Name(c.state), c.requested_by,
                                                [(r.rank, r.events_received) for r in c.ranks]))
        for a in alerts:
            print("  alert %s %s" % (a.id, service_pb2.AlertState.Name(a.state)))
        for r in ranks:
            print("  rank %d collector: %s" % (r["rank"], r["collector"]))
        return ranks, d, alerts, caps, samples

    def check(self, job, max_message_bytes=None):
        ranks, d, alerts, caps, samples = self.run_captured(job, max_message_bytes)
        # Every message of the job on the topic, read back with confluent-kafka, within the limit;
        # the capture's events among them.
        batches = read_batches(self.brokers, job)
        sizes = [b.ByteSize() for b in batches]
        chunks = [b for b in batches if b.trace.capture_id]
        print("  %d messages, largest %d bytes; %d carry capture events" % (len(sizes), max(sizes), len(chunks)))
        self.assertLessEqual(max(sizes), max_message_bytes or 1000000)
        self.assertGreater(len(chunks), 0)
        for r in ranks:
            self.assertEqual(r["steps"], STEPS)
            c = r["collector"]
            self.assertEqual(c["records_dropped"], 0, c)
            self.assertEqual(c["batches_failed"], 0, c)
            for key in ("messages_oversized", "ops_oversized", "ops_dropped", "producer_restarts"):
                self.assertEqual(c[key], 0, (key, c))
        self.assertEqual(metric(samples, "rankwatch_steps_timed_out_total", training_job=job) or 0, 0,
                         "steps aligned with a rank missing")
        # The capture: asked by the straggler alert, of the slow worker, done with its events.
        done = [c for c in caps if c.state == service_pb2.CAPTURE_DONE]
        self.assertTrue(done, [service_pb2.CaptureState.Name(c.state) for c in caps])
        c = done[-1]
        self.assertTrue(c.requested_by.startswith("straggler alert"), c.requested_by)
        self.assertEqual(c.culprit_rank, SLOW_RANK)
        for r in c.ranks:
            self.assertGreater(r.events_received, 0, r)
            self.assertEqual(r.events_received, r.events_expected, r)
        # No hang, and the what-if analysed the job's steps to the last.
        self.assertEqual([a.id for a in alerts if a.kind == service_pb2.ALERT_HANG], [])
        self.assertEqual(d.whatif.last_step, STEPS - 1, d.whatif.skipped_reason)
        self.assertEqual(d.whatif.skipped_steps, 0, d.whatif.skipped_reason)
        self.assertEqual((d.whatif.verdict, d.whatif.culprit_data_rank, d.whatif.culprit_stage),
                         ("slow_worker", 1, 1), d.whatif.note)
        return c

    def test_a_capture_of_a_pipeline_job_silences_no_rank(self):
        self.check("pp-captured")

    def test_b_with_a_256_kib_message_limit(self):
        self.check("pp-captured-256k", max_message_bytes=256 * 1024)


if __name__ == "__main__":
    unittest.main()
