"""`rankwatch timeline` (issue #17, acceptance 3): a simulated 8-rank job on two nodes with a
compute straggler on rank 5, through real `rankwatch kafka` and `rankwatchd` processes. The trace
the command writes is read back with Python's json (a parser the project did not write) and
checked against the Chrome trace event format: metadata, complete and instant events with the
fields a reader needs; one process per node named as the daemon names the rank's node, one thread
per rank; every phase slice inside its step's slice; the straggler's forward slices longer than
the others' (under DDP the others' backward holds their wait); the firing straggler alert on its
track. --group-by rank gives one process; bad ranges and unknown jobs get one-line errors."""
import json
import re
import os
import statistics
import subprocess
import unittest

import grpc

from alert_client import Watcher
from harness import BIN, Fleet, fast_group_config, wait_until
from rankwatch.v1 import service_pb2, service_pb2_grpc

RANKS = 8
RANKS_PER_NODE = 4
SLOW = 5
FAULT_FROM, FAULT_UNTIL = 100, 1400  # the slow rank's steps

PHASES = {"dataloader", "forward", "backward", "forward_backward", "optimizer", "wait"}


def check_chrome_trace(test, trace):
    """The Chrome trace event format's JSON object form, as Perfetto and chrome://tracing read it."""
    test.assertIsInstance(trace, dict)
    test.assertIn(trace.get("displayTimeUnit", "ms"), ("ms", "ns"))
    events = trace["traceEvents"]
    test.assertIsInstance(events, list)
    test.assertTrue(events)
    for e in events:
        test.assertIsInstance(e, dict)
        test.assertIsInstance(e["name"], str)
        test.assertIsInstance(e["pid"], int)
        ph = e["ph"]
        if ph == "M":
            test.assertIn(e["name"], ("process_name", "process_sort_index", "thread_name", "thread_sort_index"))
            test.assertIsInstance(e["args"], dict)
            if e["name"].startswith("thread"):
                test.assertIsInstance(e["tid"], int)
        elif ph == "X":
            test.assertIsInstance(e["tid"], int)
            test.assertIsInstance(e["ts"], (int, float))
            test.assertIsInstance(e["dur"], (int, float))
            test.assertGreaterEqual(e["dur"], 0)
        elif ph == "i":
            test.assertIsInstance(e["ts"], (int, float))
            test.assertIn(e["s"], ("g", "p", "t"))
        else:
            test.fail("unexpected event phase %r" % ph)
    return events


class TimelineTest(unittest.TestCase):
    def setUp(self):
        self.fleet = Fleet()
        self.brokers = self.fleet.start_broker()
        self.daemon = self.fleet.start_daemon(
            self.brokers, extra=["--window-steps", "20", "--config", fast_group_config(self.fleet)])
        self.server = self.daemon.endpoints["grpc"]

    def tearDown(self):
        self.fleet.close()

    def timeline(self, *args):
        r = subprocess.run([os.path.join(BIN, "rankwatch"), "timeline", "--server", self.server] + list(args),
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        return r.returncode, r.stdout, r.stderr

    def test_one_track_per_rank_grouped_by_node_with_the_straggler_and_its_alert(self):
        job = "tl"
        watcher = Watcher(self.server, job=job)
        sim = self.fleet.start("simulate-" + job, [
            os.path.join(BIN, "rankwatch"), "simulate", "--brokers", self.brokers, "--job", job,
            "--ranks", str(RANKS), "--ranks-per-node", str(RANKS_PER_NODE), "--steps", "1500",
            "--step-ms", "10", "--speed", "realtime", "--report-collective", "--seed", "3",
            "--fault", "slow-compute:%d:0.5:%d-%d" % (SLOW, FAULT_FROM, FAULT_UNTIL)])
        wait_until(lambda: any(a.state == service_pb2.ALERT_FIRING for a, _ in watcher.alerts), 60,
                   "the straggler alert to fire")
        watcher.stop()
        for a, _ in watcher.alerts:
            print("alert %s %s %s step %s: %s" % (service_pb2.AlertKind.Name(a.kind), a.subject,
                                                  service_pb2.AlertState.Name(a.state),
                                                  a.evidence.step.window.last_step, a.evidence.step.note))
        path = os.path.join(self.fleet.workdir, "timeline.json")
        fired_at = max(a.evidence.step.window.last_step for a, _ in watcher.alerts)

        # The timeline's steps can trail the alert's evaluation by a publication (seen: steps
        # 60-79 served after an alert at step 157): wait for it to reach the alert's step.
        def covers():
            code, out, err = self.timeline("--job", job, "-o", path)
            m = re.search(r"steps (\d+)-(\d+)", out)
            return code == 0 and m is not None and int(m.group(2)) >= fired_at
        wait_until(covers, 30, "the timeline to reach the alert's step %d" % fired_at)
        code, out, err = self.timeline("--job", job, "-o", path)
        self.assertEqual(code, 0, err)
        print(out)
        self.assertIn("wrote " + path, out)
        self.assertIn("%d ranks on 2 nodes" % RANKS, out)
        with open(path) as f:
            trace = json.load(f)
        events = check_chrome_trace(self, trace)

        # One process per node, named after the node the daemon gives each rank; one thread per rank.
        stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(self.server))
        node_of = {r: stub.GetRankDetail(service_pb2.GetRankDetailRequest(training_job=job, rank=r),
                                         timeout=10).node for r in range(RANKS)}
        self.assertEqual(len(set(node_of.values())), 2, node_of)
        processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
        threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
                   if e["ph"] == "M" and e["name"] == "thread_name"}
        self.assertEqual(sorted(processes.values()), sorted("node " + n for n in set(node_of.values())))
        self.assertEqual(sorted(tid for _, tid in threads), list(range(RANKS)))
        for (pid, tid), name in threads.items():
            self.assertEqual(processes[pid], "node " + node_of[tid])
            self.assertTrue(name.startswith("rank %d" % tid), name)
        self.assertIn("culprit", threads[[k for k in threads if k[1] == SLOW][0]])

        # Every rank has a slice per step, its phases inside it.
        slices = [e for e in events if e["ph"] == "X"]
        steps = {}
        for e in slices:
            if e["cat"] == "step":
                steps[(e["tid"], e["args"]["step"])] = e
        step_numbers = sorted({s for _, s in steps})
        self.assertGreaterEqual(len(step_numbers), 10)
        self.assertEqual(len(steps), RANKS * len(step_numbers), "a slice per rank and step")
        self.assertEqual(trace["otherData"]["first_step"], step_numbers[0])
        self.assertEqual(trace["otherData"]["last_step"], step_numbers[-1])
        compute = {r: [] for r in range(RANKS)}
        for e in slices:
            if e["cat"] != "phase":
                continue
            self.assertIn(e["name"], PHASES)
            parent = steps[(e["tid"], e["args"]["step"])]
            self.assertEqual(e["pid"], parent["pid"])
            # Microseconds since 1970 as doubles: ~0.25 us apart at this magnitude.
            self.assertGreaterEqual(e["ts"], parent["ts"] - 1)
            self.assertLessEqual(e["ts"] + e["dur"], parent["ts"] + parent["dur"] + 1)
            # Under DDP the others' backward holds their wait: forward, within the fault's steps
            # (the timeline may start before them when the alert fires early).
            if e["name"] == "forward" and FAULT_FROM <= e["args"]["step"] <= FAULT_UNTIL:
                compute[e["tid"]].append(e["dur"])
        medians = {r: statistics.median(v) for r, v in compute.items() if v}
        others = statistics.median(v for r, v in medians.items() if r != SLOW)
        print("median forward slice (us): rank %d %.0f, others %.0f" % (SLOW, medians[SLOW], others))
        self.assertGreater(medians[SLOW], 1.2 * others)

        # The straggler alert, firing, on the straggler's track.
        alerts = [e for e in events if e["ph"] == "i" and e["cat"] == "alert"]
        self.assertTrue(any(e["name"].startswith("straggler firing: rank:%d" % SLOW) and e["tid"] == SLOW
                            and e["s"] == "t" for e in alerts), alerts)

        # Grouped by rank: one process for the job, the same threads.
        code, out, err = self.timeline("--job", job, "--group-by", "rank", "-o", path)
        self.assertEqual(code, 0, err)
        with open(path) as f:
            events = check_chrome_trace(self, json.load(f))
        processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
        self.assertEqual(list(processes.values()), ["job " + job])
        self.assertEqual(sorted(e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"),
                         list(range(RANKS)))

        # A range: exactly those steps; one with nothing stored says what is.
        code, out, err = self.timeline("--job", job, "--steps", "%d-%d" % (step_numbers[0], step_numbers[2]),
                                       "-o", path)
        self.assertEqual(code, 0, err)
        with open(path) as f:
            got = {e["args"]["step"] for e in json.load(f)["traceEvents"] if e.get("cat") == "step"}
        self.assertEqual(got, set(step_numbers[:3]))
        code, out, err = self.timeline("--job", job, "--steps", "900000-", "-o", path)
        self.assertEqual(code, 1)
        self.assertIn("no stored steps of job 'tl' in 900000-; the daemon holds steps", err)
        code, out, err = self.timeline("--job", job, "--steps", "x-3", "-o", path)
        self.assertEqual(code, 2)
        self.assertIn("--steps x-3: expected A-B, A- or A", err)
        code, out, err = self.timeline("--job", "nope", "-o", path)
        self.assertEqual(code, 1)
        self.assertIn("no training job 'nope'", err)
        sim.stop()


if __name__ == "__main__":
    unittest.main()
