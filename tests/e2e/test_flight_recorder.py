"""PyTorch Flight Recorder dumps reach a running daemon live (issue #35, acceptance 4), through
real `rankwatchd` (its embedded broker) and two real `rankwatch agent` processes, one per "node":

* a 16-rank job hangs (the simulator, under DDP); the dumps of a real hung 16-rank Megatron-style
  job (tests/fixtures/flight-recorder/nvrx-lock_gil_1st) are written into the two agents' dump
  prefixes as PyTorch's watchdog writes them (`${TORCH_NCCL_DEBUG_INFO_TEMP_FILE}${rank}`, written
  in pieces to its final name): ranks 0-7 on node-0, 8-15 on node-1. Within 10 s of the last
  dump, the job's hang diagnosis carries the verdict: ranks 9 and 14 hold the job, missing from
  the expert-parallel group's all_to_all, each rank's dump read on its node, and `rankwatch
  diagnose` shows it;
* the dump request: on the hang diagnosis the daemon asks the job's ranks for their dumps; the
  agents write a byte into each rank's pipe (`${TORCH_NCCL_DEBUG_INFO_PIPE_FILE}${rank}.pipe`), as
  PyTorch's watchdog reads it, and a stand-in for that watchdog (this test: the FIFOs PyTorch would
  create, read the way it reads them) writes the rank's dump when asked; the verdict of the real
  GPU-error set (nvrx-gpu_error_2nd) names ranks 9 and 14 as not completing.
"""
import os
import subprocess
import threading
import time
import unittest

import grpc

from harness import BIN, Fleet, wait_until
from rankwatch.v1 import service_pb2, service_pb2_grpc

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures", "flight-recorder")
WORLD = 16


def write_like_pytorch(path, data):
    """PyTorch's DebugInfoWriter opens the final file name and writes the pickle; a reader can see
    it half-written."""
    with open(path, "wb") as f:
        half = len(data) // 2
        f.write(data[:half])
        f.flush()
        time.sleep(0.05)
        f.write(data[half:])


class Watchdog:
    """What PyTorch's NCCL watchdog does with TORCH_NCCL_DEBUG_INFO_PIPE_FILE: it creates the FIFO
    `${prefix}${rank}.pipe`, opens it to read without blocking, and dumps the Flight Recorder when
    it reads a byte. Here the dump written is a fixture rank's."""

    def __init__(self, pipe_prefix, dump_prefix, ranks, fixture_set):
        self.fds = {}
        for r in ranks:
            path = "%s%d.pipe" % (pipe_prefix, r)
            os.mkfifo(path)
            self.fds[r] = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.dump_prefix, self.fixture_set = dump_prefix, fixture_set
        self.asked = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            for r, fd in self.fds.items():
                try:
                    got = os.read(fd, 128)
                except BlockingIOError:
                    continue
                if got and r not in self.asked:
                    self.asked.add(r)
                    with open(os.path.join(self.fixture_set, "_dump_%d" % r), "rb") as f:
                        write_like_pytorch("%s%d" % (self.dump_prefix, r), f.read())
            time.sleep(0.02)

    def close(self):
        self.stop.set()
        self.thread.join(5)
        for fd in self.fds.values():
            os.close(fd)


class FlightRecorderLiveTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fleet = Fleet()
        cls.daemon = cls.fleet.start_daemon(None, extra=["--hang-timeout", "2s",
                                                         "--flight-recorder-settle", "2s"])
        cls.brokers = cls.daemon.endpoints["brokers"]
        cls.server = cls.daemon.endpoints["grpc"]
        cls.stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(cls.server))

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def node(self, job, index, watchdog_set=None):
        """Node `index` (ranks 8 x index ... + 7, named as the simulator names it): its dump and
        pipe prefixes, PyTorch's watchdog stand-in when `watchdog_set` is given, and its agent
        (the identity of its own samples: the node's first rank)."""
        name = "node-%d" % index
        d = os.path.join(self.fleet.workdir, job, name)
        os.makedirs(d)
        dumps, pipes = os.path.join(d, "nccl_trace_rank_"), os.path.join(d, "nccl_pipe_rank_")
        if watchdog_set:
            w = Watchdog(pipes, dumps, range(8 * index, 8 * index + 8), watchdog_set)
            self.addCleanup(w.close)
            self.watchdogs.append(w)
        self.fleet.start("agent-%s-%s" % (job, name),
                         [os.path.join(BIN, "rankwatch"), "agent", "--brokers", self.brokers, "--job", job,
                          "--world-size", str(WORLD), "--rank", str(8 * index), "--node", name,
                          "--interval", "0.2", "--flight-recorder", dumps, "--flight-recorder-pipe", pipes])
        return dumps

    def diagnosis(self, job):
        try:
            return self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)
        except grpc.RpcError:
            return None

    def hang(self, job):
        self.fleet.simulate(self.brokers, "--job", job, "--ranks", str(WORLD), "--steps", "40", "--speed", "max",
                            "--sync", "ddp", "--fault", "hang:3:0:20")
        wait_until(lambda: (d := self.diagnosis(job)) is not None and d.step.label == service_pb2.STEP_HANG,
                   60, "the hang diagnosis of %s" % job)

    def culprits(self, job):
        d = self.diagnosis(job)
        return sorted(c.rank for c in d.flight_recorder.culprits) if d else []

    def test_dumps_written_on_two_nodes_reach_the_hang_diagnosis(self):
        job = "fr-two-nodes"
        node_a = self.node(job, 0)
        node_b = self.node(job, 1)
        time.sleep(1.0)  # the agents' first poll: dumps already there are not theirs to publish
        self.hang(job)
        fixture_set = os.path.join(FIXTURES, "nvrx-lock_gil_1st")
        for r in range(WORLD):
            with open(os.path.join(fixture_set, "_dump_%d" % r), "rb") as f:
                write_like_pytorch("%s%d" % (node_a if r < 8 else node_b, r), f.read())
        last_dump = time.monotonic()
        wait_until(lambda: self.culprits(job) == [9, 14], 10,
                   "the Flight Recorder verdict within 10 s of the last dump")
        took = time.monotonic() - last_dump
        d = self.diagnosis(job)
        v = d.flight_recorder
        print("\n%s: verdict %.1f s after the last dump: %s" % (job, took, v.summary))
        self.assertLess(took, 10.0)
        self.assertEqual(d.step.label, service_pb2.STEP_HANG)
        self.assertEqual(v.dumps, WORLD)
        self.assertEqual(sorted(v.empty), [9, 14])
        for c in v.culprits:
            self.assertEqual(c.reason, "missing")
            self.assertEqual(c.group_desc, "EXPERT_MODEL_PARALLEL_GROUP")
            self.assertEqual(c.op.name, "all_to_all")
            self.assertEqual(c.op.seq, 45265)
        nodes = {r.rank: r.node for r in v.ranks}
        self.assertEqual(nodes.get(0), "node-0")
        self.assertEqual(nodes.get(9), "node-1")
        out = subprocess.run([os.path.join(BIN, "rankwatch"), "diagnose", "--job", job, "--server", self.server],
                             capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("FLIGHT RECORDER", out.stdout)
        self.assertIn("EXPERT_MODEL_PARALLEL_GROUP", out.stdout)

    def test_the_hang_asks_the_ranks_for_their_dumps_through_pytorchs_pipes(self):
        job = "fr-pipes"
        fixture_set = os.path.join(FIXTURES, "nvrx-gpu_error_2nd")
        self.watchdogs = []
        self.node(job, 0, fixture_set)
        self.node(job, 1, fixture_set)
        time.sleep(1.0)
        self.hang(job)
        wait_until(lambda: all(len(w.asked) == 8 for w in self.watchdogs), 30,
                   "every rank's pipe asked for a dump")
        last_dump = time.monotonic()
        wait_until(lambda: self.culprits(job) == [9, 14], 10,
                   "the verdict within 10 s of the last dump")
        v = self.diagnosis(job).flight_recorder
        print("\n%s: dumps asked through the pipes, verdict %.1f s after the last: %s" %
              (job, time.monotonic() - last_dump, v.summary))
        self.assertTrue(all(c.reason == "not_completing" for c in v.culprits))


if __name__ == "__main__":
    unittest.main()
