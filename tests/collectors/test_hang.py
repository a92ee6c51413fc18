"""Hang stacks on real 4-rank PyTorch DDP jobs (gloo on CPU, tests/collectors/hang_job.py) through
real `rankwatch kafka` and `rankwatchd` processes (issue #18):

* rank 3 blocks forever in load_shard(), the script's data loading, before the step's allreduce:
  within 30 s of the hang diagnosis, `rankwatch diagnose` and the hang alert carry rank 3's stack
  with load_shard in it and the other ranks' shared stack; the collective counters name rank 3
  (it never entered the allreduce the others wait in); every process is alive when the stacks
  are taken;
* every rank waits in the same function for a file nobody writes (an external barrier): the
  stacks say that every rank is in the same place and name no culprit;
* rank 3 kills itself (SIGKILL) in load_shard(): it is named as gone, not as stuck.

The daemon runs with --hang-timeout 5s (a hang is diagnosed after 5 s without an aligned step)
and --auto-capture false: these jobs are not tuned for a step diagnosis, and a straggler alert
on their noise (0.4 ms a step outside the phases, say) captured two ranks, whose silence then
held the hang back for the capture's busy time (~30 s) in most runs. That bound is
capture_store_test's (BusyRanks) and job_pipeline_test's (NoteEvidenceBusy)."""
import os
import subprocess
import time
import unittest

import grpc

from alert_client import Watcher
from harness import BIN, Fleet, wait_until
from rankwatch.v1 import service_pb2, service_pb2_grpc
from torch_job import TorchJob, torch_available

HERE = os.path.dirname(os.path.abspath(__file__))
HANG_JOB = os.path.join(HERE, "hang_job.py")
HANG_AT = 40


@unittest.skipUnless(torch_available(), "torch is not installed for this interpreter (scripts/venv.sh)")
class HangStacksTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fleet = Fleet()
        cls.brokers = cls.fleet.start_broker()
        cls.daemon = cls.fleet.start_daemon(cls.brokers, extra=["--hang-timeout", "5s",
                                                               "--auto-capture", "false"])
        cls.server = cls.daemon.endpoints["grpc"]
        cls.stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(cls.server))

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def start(self, job, *args, hang_at=HANG_AT):
        run = TorchJob(self.fleet.workdir, job, self.brokers, 100000, "--hang-at", str(hang_at), *args,
                       script=HANG_JOB, steady_malloc=False)
        self.addCleanup(run.kill)
        return run

    def diagnosis(self, job):
        try:
            return self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)
        except grpc.RpcError:
            return None

    def hang_with_stacks(self, job):
        """Waits for the hang diagnosis, then for its settled stacks (within 30 s of it)."""
        wait_until(lambda: (d := self.diagnosis(job)) is not None and
                   d.step.label == service_pb2.STEP_HANG, 120, "the hang diagnosis of %s" % job)
        hung_at = time.monotonic()
        wait_until(lambda: self.diagnosis(job).hang_stacks.settled_unix_ns > 0, 30,
                   "the stacks of %s within 30 s of its hang diagnosis" % job)
        took = time.monotonic() - hung_at
        d = self.diagnosis(job)
        print("\n%s: stacks %.1f s after the hang diagnosis: %s" % (job, took, d.hang_stacks.summary))
        return d

    def diagnose_cli(self, job):
        r = subprocess.run([os.path.join(BIN, "rankwatch"), "diagnose", "--job", job, "--server", self.server],
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def test_a_rank_stuck_in_the_script_before_the_allreduce_is_named_with_its_stack(self):
        job = "hang-load-shard"
        watcher = Watcher(self.server, job=job)
        self.addCleanup(watcher.stop)
        run = self.start(job, "--hang", "load_shard", "--hang-rank", "3")
        d = self.hang_with_stacks(job)
        # The processes were alive when they answered, and still are.
        self.assertTrue(all(p.poll() is None for p in run.procs), [p.poll() for p in run.procs])
        h = d.hang_stacks
        self.assertEqual(h.ranks_asked, 4)
        self.assertEqual(h.ranks_answered, 4)
        self.assertEqual(list(h.gone_ranks), [])
        self.assertEqual(list(h.culprit_ranks), [3], h.summary)
        self.assertGreaterEqual(len(h.groups), 2)
        first = h.groups[0]
        self.assertEqual(list(first.ranks), [3])
        self.assertIn("load_shard", [f.function for f in first.frames])
        self.assertIn("load_shard", first.where)
        self.assertTrue(first.frames[-1].file.endswith("threading.py"), first.frames[-1])
        others = sorted(r for g in h.groups[1:] for r in g.ranks)
        self.assertEqual(others, [0, 1, 2])
        self.assertEqual(len(h.groups), 2, [(list(g.ranks), g.where) for g in h.groups])
        self.assertNotIn("load_shard", [f.function for f in h.groups[1].frames])
        self.assertIn("backward", [f.function for f in h.groups[1].frames])
        # The collective counters name rank 3 too: the others entered one more collective.
        self.assertEqual(len(h.collectives), 1)
        c = h.collectives[0]
        self.assertEqual(list(c.behind_ranks), [3])
        self.assertEqual(list(c.waiting_ranks), [0, 1, 2])
        self.assertTrue(h.summary.startswith("rank 3 never entered the collective"), h.summary)
        out = self.diagnose_cli(job)
        print(out)
        self.assertIn("STACKS", out)
        self.assertIn("in load_shard", out)
        # The hang alert, published again with the stacks once they came.
        wait_until(lambda: any(a.kind == service_pb2.ALERT_HANG and a.evidence.hang_stacks.request_id == h.request_id
                               for a, _ in watcher.alerts), 30, "the hang alert with the stacks")
        alert = [a for a, _ in watcher.alerts if a.evidence.hang_stacks.request_id == h.request_id][-1]
        self.assertEqual(list(alert.evidence.hang_stacks.culprit_ranks), [3])
        self.assertEqual(list(alert.evidence.hang_stacks.groups[0].ranks), [3])
        self.assertIn(alert.state, (service_pb2.ALERT_PENDING, service_pb2.ALERT_FIRING))
        # Every step the ranks ended carried the collective counter (each step one allreduce
        # and more): the daemon's per-rank view is not asserted here, the telemetry is.
        run.kill()

    def test_every_rank_in_the_same_place_names_no_culprit(self):
        job = "hang-barrier"
        self.start(job, "--hang", "barrier", "--barrier-file", os.path.join(self.fleet.workdir, "never"))
        d = self.hang_with_stacks(job)
        h = d.hang_stacks
        self.assertEqual(h.ranks_answered, 4)
        self.assertTrue(h.same_place, h.summary)
        self.assertEqual(list(h.culprit_ranks), [])
        self.assertEqual(len(h.groups), 1)
        self.assertEqual(list(h.groups[0].ranks), [0, 1, 2, 3])
        self.assertIn("wait_for_barrier_file", h.groups[0].where)
        self.assertIn("every rank that answered is in the same place", h.summary)
        for c in h.collectives:
            self.assertEqual(list(c.behind_ranks), [])

    def test_a_rank_that_dies_is_named_as_gone_not_as_stuck(self):
        # With gloo the other ranks' allreduce fails at once ("Connection reset by peer") and
        # their processes exit too (NCCL's would wait): every rank is gone when the hang is
        # diagnosed, and the stacks say so rather than naming anyone as stuck. Late enough that
        # the daemon knows the job (a job of a few seconds is not diagnosed): 100 steps of ~30 ms,
        # far more than the 8 aligned steps a diagnosis needs (300 took 7-8 s longer).
        job = "hang-die"
        run = self.start(job, "--hang", "die", "--hang-rank", "3", hang_at=100)
        d = self.hang_with_stacks(job)
        h = d.hang_stacks
        codes = [p.poll() for p in run.procs]
        print("exit codes: %s" % codes)
        self.assertEqual(codes[3], -9)
        self.assertIn(3, list(h.gone_ranks), h.summary)
        self.assertNotIn(3, list(h.culprit_ranks))
        for g in h.groups:
            self.assertNotIn(3, list(g.ranks))
        self.assertIn("gone", h.summary)


if __name__ == "__main__":
    unittest.main()
