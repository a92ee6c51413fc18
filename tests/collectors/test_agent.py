"""Acceptance of issue #7, item 4: `rankwatch agent` runs without NVML for
RANKWATCH_AGENT_S seconds (default 60; CI may set less) and publishes system samples the
daemon accepts; a trace file dropped into the watched directory is published exactly once. A
real Kineto trace (a fixture) is published as its kernel events: the daemon's per-step GPU
analyses of it equal `rankwatch analyze` on the same file.

Issue #17: a capture of two ranks whose traces the agent watches (`rankwatch capture --ranks 1
--reference 0`) is answered by the agent with each rank's next trace: both ranks DONE with their
first 2 profiler steps, every event received, and the comparison printed by `capture show`."""
import json
import os
import shutil
import subprocess
import time
import unittest

import grpc

from harness import BIN, Fleet, metric, parse_metrics, wait_until
from rankwatch.v1 import control_pb2, service_pb2, service_pb2_grpc
from test_kernel_live import FIXTURES, analyze, assert_same_steps, kernel_json

AGENT_S = float(os.environ.get("RANKWATCH_AGENT_S", "60"))


def scrape_address(address):
    import urllib.request
    with urllib.request.urlopen("http://%s/metrics" % address, timeout=5) as r:
        return parse_metrics(r.read().decode())


class AgentTest(unittest.TestCase):
    def test_samples_accepted_and_a_trace_published_once(self):
        fleet = Fleet()
        self.addCleanup(fleet.close)
        brokers = fleet.start_broker()
        daemon = fleet.start_daemon(brokers)
        from harness import scrape
        accepted = lambda kind: metric(parse_metrics(scrape(daemon)), "rankwatch_events_total", kind=kind) or 0
        rejected = lambda: sum(v for n, l, v in parse_metrics(scrape(daemon))
                               if n == "rankwatch_events_rejected_total")
        traces = os.path.join(fleet.workdir, "traces")
        os.makedirs(traces)
        agent = fleet.start("agent", [os.path.join(BIN, "rankwatch"), "agent", "--brokers", brokers,
                                      "--job", "node-agent-test", "--interval", "0.5",
                                      "--trace-dir", traces, "--metrics-listen", "127.0.0.1:0",
                                      "--nvml-library", "libnvidia-ml-absent.so.1",
                                      "--duration", str(AGENT_S)])
        address = json.loads(wait_until(lambda: agent.stdout().split("\n")[0] if "\n" in agent.stdout() else None,
                                        20, "the agent's metrics line"))["metrics"]
        self.assertIn("NVML not found", wait_until(lambda: agent.stderr(), 10, "the NVML info line"))
        wait_until(lambda: accepted("sample") >= 3, 30, "samples accepted by the daemon")

        # A Kineto trace appears, written in two parts; it must be published once.
        path = os.path.join(traces, "worker0.1700000000000.pt.trace.json")
        with open(path, "w") as f:
            f.write('{"traceEvents": [')
        time.sleep(0.7)
        with open(path, "a") as f:
            f.write("]}")
        published = lambda: metric(scrape_address(address), "rankwatch_agent_trace_files_total",
                                   result="published")
        wait_until(lambda: published() == 1, 20, "the trace file published")

        # A real trace of rank 0 (2 profiled steps): its kernel events reach the daemon's live
        # GPU analyses, step by step, equal to `rankwatch analyze` of the file.
        fixture = os.path.join(FIXTURES, "kineto", "hta-trace-filter-2rank", "sampled_rank-0.json.gz")
        shutil.copy(fixture, os.path.join(traces, "rank0.1700000000001.pt.trace.json.gz"))
        wait_until(lambda: published() == 2, 30, "the Kineto trace published")
        expected = {(s["rank"], s["step"]): s for s in analyze(fixture)["steps"]}
        self.assertEqual(len(expected), 2)
        live = wait_until(lambda: (lambda j: j if j and j["steps_analyzed"] == 2 else None)(
            kernel_json(daemon, "node-agent-test")), 30, "2 analysed (rank, step) windows")
        self.assertEqual(live["events"]["late"], 0)
        got = {(s["rank"], s["step"]): s for r in live["ranks"] for s in r["recent_steps"]}
        assert_same_steps(self, got, expected)
        kernel_events = metric(scrape_address(address), "rankwatch_agent_trace_kernel_events_total")
        self.assertEqual(kernel_events, live["events"]["accepted"])

        code = agent.proc.wait(timeout=AGENT_S + 30)
        self.assertEqual(code, 0, agent.stderr())
        summary = json.loads(agent.stdout().strip().splitlines()[-1])
        print("agent summary:", summary)
        self.assertEqual(summary["trace_files"], 2)  # each once, although they stayed there
        self.assertEqual(summary["trace_kernel_events"], kernel_events)
        self.assertGreaterEqual(summary["samples"], AGENT_S / 0.5 * 0.8)
        self.assertEqual(summary["batches_dropped"], 0)
        self.assertEqual(summary["failed"], 0)
        self.assertEqual(summary["delivered"], summary["batches_sent"])
        # Every batch the agent sent was accepted by the daemon, none rejected.
        wait_until(lambda: accepted("batch") >= summary["batches_sent"], 30, "every agent batch accepted")
        self.assertEqual(accepted("sample"), summary["samples"])
        self.assertEqual(rejected(), 0)

    def test_a_capture_is_answered_with_the_next_trace_of_each_rank_it_watches(self):
        fleet = Fleet()
        self.addCleanup(fleet.close)
        brokers = fleet.start_broker()
        daemon = fleet.start_daemon(brokers, extra=["--auto-capture", "false"])
        server = daemon.endpoints["grpc"]
        stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(server))
        job = "agent-capture"
        traces = os.path.join(fleet.workdir, "traces")
        os.makedirs(traces)
        agent = fleet.start("agent", [os.path.join(BIN, "rankwatch"), "agent", "--brokers", brokers,
                                      "--job", job, "--world-size", "2", "--interval", "0.2",
                                      "--trace-dir", traces, "--metrics-listen", "127.0.0.1:0",
                                      "--nvml-library", "libnvidia-ml-absent.so.1"])
        address = json.loads(wait_until(lambda: agent.stdout().split("\n")[0] if "\n" in agent.stdout() else None,
                                        20, "the agent's metrics line"))["metrics"]
        agent_metric = lambda name, **labels: metric(scrape_address(address), name, **labels) or 0
        two_ranks = os.path.join(FIXTURES, "kineto", "hta-trace-filter-2rank")

        def write_traces(prefix):
            for rank in (0, 1):
                shutil.copy(os.path.join(two_ranks, "sampled_rank-%d.json.gz" % rank),
                            os.path.join(traces, "%s.rank%d.pt.trace.json.gz" % (prefix, rank)))

        # The profiler's traces so far: the agent learns which ranks it speaks for.
        write_traces("first")
        wait_until(lambda: agent_metric("rankwatch_agent_trace_files_total", result="published") == 2, 30,
                   "the first two traces published")
        wait_until(lambda: any(j.training_job == job for j in stub.ListJobs(service_pb2.ListJobsRequest(),
                                                                            timeout=10).jobs),
                   30, "the daemon to know the job")
        capture = subprocess.Popen([os.path.join(BIN, "rankwatch"), "capture", "--server", server, "--job", job,
                                    "--ranks", "1", "--reference", "0", "--steps", "2", "--wait", "90"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   stdin=subprocess.DEVNULL)
        wait_until(lambda: agent_metric("rankwatch_agent_captures_total", result="requested") == 1, 30,
                   "the agent to take the request")
        # The agent has seen both ranks' traces: it accepts for both at once.
        c = wait_until(lambda: [x for x in stub.ListCaptures(service_pb2.ListCapturesRequest(training_job=job),
                                                             timeout=10).captures
                                if [r.state for r in x.ranks] == [control_pb2.CONTROL_ACCEPTED] * 2],
                       30, "both ranks accepted")[0]
        # The profiler writes its next traces: those answer the capture.
        write_traces("next")
        out, err = capture.communicate(timeout=120)
        print(out)
        self.assertEqual(capture.returncode, 0, err + out)
        self.assertIn(": done", out)
        c = stub.GetCapture(service_pb2.GetCaptureRequest(id=c.id), timeout=10).capture
        self.assertEqual(c.state, service_pb2.CAPTURE_DONE, c.reason)
        self.assertEqual((c.culprit_rank, c.reference_rank), (1, 0))
        for r in c.ranks:
            self.assertEqual(r.state, control_pb2.CONTROL_DONE)
            self.assertEqual(r.steps, 2)
            self.assertGreater(r.events_expected, 0)
            self.assertEqual(r.events_received, r.events_expected)
            self.assertGreater(r.profiled_step_seconds, 0)
        self.assertTrue(c.comparison)
        r = subprocess.run([os.path.join(BIN, "rankwatch"), "capture", "show", c.id, "--server", server],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(c.comparison[0].name[:40], r.stdout)  # long kernel names are cut
        self.assertFalse([op.name for op in c.comparison if op.name.startswith("ProfilerStep#")])
        self.assertEqual(agent_metric("rankwatch_agent_captures_total", result="done"), 2)
        self.assertEqual(agent_metric("rankwatch_agent_captures_total", result="failed"), 0)
        self.assertEqual(agent_metric("rankwatch_agent_trace_files_total", result="published"), 4)


if __name__ == "__main__":
    unittest.main()
