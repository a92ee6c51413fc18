"""Real Flight Recorder dumps of a real hung 4-rank gloo job of torch 2.13 with two subgroups
(tests/collectors/fr_hang_job.py: the world, A = [0, 1, 2], B = [1, 2, 3]), through real
`rankwatch kafka`, `rankwatchd` and `rankwatch agent` processes (issue #46, acceptance 2). One
test per fault (one ctest each):

* missing: rank 3 never enters B's all_reduce (blocked in its data loading);
* size:    rank 2 calls B's all_reduce with an empty tensor (the others with 8 floats);
* p2p:     rank 1 is stuck in a send to rank 0, which never receives.

Each job hangs; the daemon (--hang-timeout 2s) diagnoses the hang and asks every rank for its
Flight Recorder dump; the collector's stacks thread answers with torch's _dump_fr_trace to
${TORCH_FR_DUMP_TEMP_FILE}${rank}; the node agent publishes the dumps; the daemon analyzes them.
Asserted: the job's diagnosis and its hang alert carry the verdict naming exactly the faulty
rank, within 5 s of the last dump written (the latency is printed). Then, on the same dump
files, `rankwatch flight-recorder --json` and PyTorch's own analyzer (`python -m
torch.distributed.flight_recorder.fr_trace`) side by side (printed), and their agreement:

* PyTorch's analyzer stops with a KeyError on torch 2.13's gloo dumps as written (they have no
  pg_config for gloo groups): asserted. On a copy with the job's groups filled into pg_config
  (fr_compare.with_pg_config) it runs, and what it says is asserted case by case below. It
  reports every group's first problem (the missing ranks of each collective, the ranks that
  differ from its reference record) and follows no waits from one group to another; rankwatch
  names the one rank the others wait for. Those are the deliberate differences.

The checked-in dumps of the three cases (tests/fixtures/flight-recorder/gloo-torch2.13/) are
held to the same verdicts offline by OfflineAgreementTest (no job, a few seconds), and
benchmarks/fr_vs_pytorch.py times both analyzers on them. RANKWATCH_FR_KEEP=DIR copies each
case's dumps to DIR/<case>/ (how the fixtures were made).

OfflineAgreementTest also runs both analyzers on the NCCL dump sets derived from the real hung
16-rank Megatron job nvrx-lock_gil_1st, one fault each (issue #47;
tests/fixtures/flight-recorder/derived/faults/, make_fault_sets.py)."""
import json
import os
import shutil
import time
import unittest

import grpc

import fr_compare
from alert_client import Watcher
from harness import BIN, Fleet, wait_until
from rankwatch.v1 import service_pb2, service_pb2_grpc
from torch_job import TorchJob, torch_available

HERE = os.path.dirname(os.path.abspath(__file__))
FR_HANG_JOB = os.path.join(HERE, "fr_hang_job.py")
FIXTURES = os.path.join(HERE, "..", "fixtures", "flight-recorder", "gloo-torch2.13")
DERIVED = os.path.join(HERE, "..", "fixtures", "flight-recorder", "derived", "faults")
FAULT_AT = 25
WORLD = 4
GROUP_B = [1, 2, 3]

# fault -> (culprit, rankwatch's reason and group ranks)
CASES = {"missing": (3, "missing", GROUP_B),
         "size": (2, "mismatch", GROUP_B),
         "p2p": (1, "missing", [0, 1, 2, 3])}


def check_agreement(test, fault, folder):
    """Both analyzers on `folder`'s dumps: printed side by side, agreement asserted."""
    culprit, reason, group_ranks = CASES[fault]
    rw = fr_compare.rankwatch_verdict(folder)
    raw = fr_compare.pytorch_verdict(folder)
    named = fr_compare.pytorch_verdict(fr_compare.with_pg_config(folder, folder + "-pg_config"))
    print("\n%-8s rankwatch flight-recorder: %s\n%-8s fr_trace (dumps as written): %s\n"
          "%-8s fr_trace (pg_config filled in): %s"
          % (fault, fr_compare.describe_rankwatch(rw), "", fr_compare.describe_pytorch(raw), "",
             fr_compare.describe_pytorch(named)))
    # rankwatch: exactly the faulty rank.
    test.assertEqual([c["rank"] for c in rw["culprits"]], [culprit], rw["summary"])
    test.assertEqual(rw["culprits"][0]["reason"], reason)
    test.assertEqual(rw["culprits"][0]["group_ranks"], group_ranks)
    # PyTorch, dumps as torch 2.13 writes them for gloo: no verdict (its group table is empty).
    test.assertNotEqual(raw["rc"], 0)
    test.assertIn("KeyError", raw["error"])
    test.assertEqual(raw["findings"], [])
    # PyTorch with the groups given: it runs, and its findings agree with rankwatch's culprit.
    f = named["findings"]
    test.assertEqual(named["rc"], 0, named["error"])
    by_group = {x["group"]: x for x in f}
    if fault == "missing":
        # B's all_reduce: the culprit missing, as rankwatch says. It also lists the world
        # all_reduce of the next step, where rank 0 waits for 1, 2 and 3 (1 and 2 wait in B for
        # 3): PyTorch does not follow the wait from group to group; rankwatch does, and names 3.
        test.assertEqual(by_group["2"]["kind"], "missing")
        test.assertEqual(by_group["2"]["ranks"], [culprit])
        test.assertEqual(by_group["0:default_pg"]["ranks"], [1, 2, 3])
    elif fault == "size":
        # B's all_reduce: a size mismatch. PyTorch compares each rank's record with one
        # reference record (the first rank's it reads, no majority), so it names either the
        # culprit or the two ranks that agree, depending on the order it reads the dumps;
        # rankwatch takes the majority of B (two of three) and names the culprit. It also lists
        # the world all_reduce where 0 and the culprit wait for 1 and 3 (stuck in B).
        b = by_group["2"]
        test.assertEqual(b["kind"], "errors")
        test.assertIn("SIZE_OR_SYNTAX_MISMATCH", b["errors"])
        test.assertIn(b["ranks"], ([culprit], sorted(set(GROUP_B) - {culprit})))
        test.assertEqual(by_group["0:default_pg"]["ranks"], sorted(set(GROUP_B) - {culprit}))
    else:
        # gloo's send is not in torch 2.13's Flight Recorder: both see the culprit missing from
        # the world all_reduce the others wait in, and only that.
        test.assertEqual([(x["group"], x["kind"], x["ranks"]) for x in f],
                         [("0:default_pg", "missing", [culprit])])
    return rw, raw, named


def check_derived(test, name, folder):
    """Both analyzers on a derived set (derived/faults/<name>, fault.json says its fault)."""
    with open(os.path.join(folder, "fault.json")) as f:
        fault = json.load(f)
    faulty = fault["faulty"]
    rw = fr_compare.rankwatch_verdict(folder)
    pt = fr_compare.pytorch_verdict(folder, "_dump_")
    missing_dumps = fault.get("missing_dumps", [])
    partial = (fr_compare.pytorch_verdict(folder, "_dump_", extra=["--allow-incomplete-ranks"])
               if missing_dumps else None)
    print("\n%-18s %s\n%-18s rankwatch flight-recorder: %s\n%-18s fr_trace: %s%s"
          % (name, fault["change"], "", fr_compare.describe_rankwatch(rw), "",
             fr_compare.describe_pytorch(pt),
             "\n%-18s fr_trace --allow-incomplete-ranks: %s"
             % ("", fr_compare.describe_pytorch(partial)) if partial else ""))
    # rankwatch: exactly the faulty rank, or nobody.
    test.assertEqual(sorted(c["rank"] for c in rw["culprits"]), faulty, rw["summary"])
    if missing_dumps:
        # Nobody, undecided, the rank without a dump named as such.
        test.assertEqual(rw["missing_dumps"], missing_dumps)
        test.assertTrue(rw["summary"].startswith("undecided: rank %d left no usable record"
                                                 % missing_dumps[0]), rw["summary"])
        test.assertTrue(rw["undecided"])
        # PyTorch refuses the set; allowed to go on, it cannot decide and names nobody.
        test.assertNotEqual(pt["rc"], 0)
        test.assertIn("Missing dump files from ranks {%d}" % missing_dumps[0], pt["error"])
        test.assertEqual(partial["rc"], 0, partial["error"])
        test.assertTrue(partial["findings"])
        for f in partial["findings"]:
            test.assertEqual((f["kind"], f["ranks"]), ("undecided", missing_dumps))
        return
    test.assertEqual(pt["rc"], 0, pt["error"])
    errors = [f for f in pt["findings"] if f["kind"] == "errors"]
    test.assertEqual([f for f in pt["findings"] if f["kind"] == "missing"], [])
    if not faulty or rw["culprits"][0]["reason"] == "not_completing":
        # Healed, and a rank whose device stopped reporting completions: every member recorded
        # every collective alike; PyTorch reads no counters (pg_status) and finds nothing.
        test.assertEqual(errors, [])
        return
    c = rw["culprits"][0]
    test.assertEqual(c["reason"], "mismatch")
    # The one collective with errors: the mismatched one. Its culprit is the faulty rank, or
    # the members that agree when it took the faulty rank's record as its reference (the first
    # member's it reads: it has no majority).
    test.assertEqual(len(errors), 1, errors)
    test.assertEqual(errors[0]["seq"], c["seq"])
    test.assertIn("SIZE_OR_SYNTAX_MISMATCH", errors[0]["errors"])
    test.assertIn(errors[0]["ranks"], (faulty, sorted(set(c["group_ranks"]) - set(faulty))))


class OfflineAgreementTest(unittest.TestCase):
    """The checked-in real dumps: both analyzers, no job."""

    def test_checked_in_dumps(self):
        tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), "rw-fr-offline-%d" % os.getpid())
        self.addCleanup(shutil.rmtree, tmp, True)
        for fault in CASES:
            with self.subTest(fault=fault):
                folder = os.path.join(tmp, fault)
                shutil.copytree(os.path.join(FIXTURES, fault), folder)
                check_agreement(self, fault, folder)

    def test_derived_fault_sets(self):
        """nvrx-lock_gil_1st with its two faulty ranks healed and one fault put in (fault.json):
        rankwatch names exactly the faulty rank, or nobody and "undecided" when a dump is
        missing; PyTorch's fr_trace, where it gives an answer, names the same rank."""
        tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), "rw-fr-derived-%d" % os.getpid())
        self.addCleanup(shutil.rmtree, tmp, True)
        for name in sorted(os.listdir(DERIVED)):
            with self.subTest(set=name):
                folder = os.path.join(tmp, name)
                shutil.copytree(os.path.join(DERIVED, name), folder)
                check_derived(self, name, folder)


@unittest.skipUnless(torch_available(), "torch is not installed")
class FlightRecorderHangTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fleet = Fleet()
        cls.brokers = cls.fleet.start_broker(partitions=2)
        cls.daemon = cls.fleet.start_daemon(cls.brokers, extra=["--hang-timeout", "2s",
                                                                "--flight-recorder-settle", "2s"])
        cls.server = cls.daemon.endpoints["grpc"]
        cls.stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(cls.server))

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def diagnosis(self, job):
        try:
            return self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)
        except grpc.RpcError:
            return None

    def run_case(self, fault):
        culprit = CASES[fault][0]
        t0 = time.monotonic()
        job = "fr-hang-" + fault
        folder = os.path.join(self.fleet.workdir, job)
        os.makedirs(folder)
        prefix = os.path.join(folder, fr_compare.PREFIX)
        # The node agent of the ranks' node (the host name, as the ranks say): an agent on
        # another node claiming rank 0 had rank 0's own batches rejected (a rank claimed by two
        # nodes), so steps aligned only at --align-timeout (10 s) and the hang came that late.
        self.fleet.start("agent-" + job, [os.path.join(BIN, "rankwatch"), "agent", "--brokers", self.brokers,
                                          "--job", job, "--world-size", str(WORLD), "--rank", "0",
                                          "--interval", "0.2", "--flight-recorder", prefix])
        watcher = Watcher(self.server, job=job)
        self.addCleanup(watcher.stop)
        # The job's environment: the recorder on (gloo records nothing without a buffer size),
        # its dumps under the agent's prefix.
        env = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": prefix}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            run = TorchJob(self.fleet.workdir, job, self.brokers, 100000, "--fault", fault,
                           "--culprit", str(culprit), "--fault-at", str(FAULT_AT),
                           script=FR_HANG_JOB, steady_malloc=False)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.addCleanup(run.kill)
        wait_until(lambda: (d := self.diagnosis(job)) is not None and d.step.label == service_pb2.STEP_HANG,
                   60, "the hang diagnosis of %s" % job)
        files = [prefix + str(r) for r in range(WORLD)]
        wait_until(lambda: all(os.path.exists(p) for p in files), 20, "every rank's dump")

        def verdict_in_alert():
            for a, received in watcher.alerts:
                if (a.kind == service_pb2.ALERT_HANG and a.evidence.flight_recorder.dumps == WORLD and
                        [c.rank for c in a.evidence.flight_recorder.culprits] == [culprit]):
                    return a, received
            return None

        def verdict_in_diagnosis():
            d = self.diagnosis(job)
            v = d.flight_recorder if d else None
            if v is not None and v.dumps == WORLD and [c.rank for c in v.culprits] == [culprit]:
                return d, time.time()
            return None

        d, diagnosis_at = wait_until(verdict_in_diagnosis, 10, "the verdict in %s's diagnosis" % job,
                                     interval=0.05)
        alert, alert_at = wait_until(verdict_in_alert, 10, "the hang alert with the verdict")
        last_dump = max(os.stat(p).st_mtime for p in files)
        print("\n%s: the 4 dumps written within %.2f s; the verdict %.2f s after the last one in the "
              "diagnosis, %.2f s in the hang alert: %s"
              % (job, last_dump - min(os.stat(p).st_mtime for p in files), diagnosis_at - last_dump,
                 alert_at - last_dump, d.flight_recorder.summary))
        self.assertLess(diagnosis_at - last_dump, 5.0)
        self.assertLess(alert_at - last_dump, 5.0)
        # Every rank was alive, hung, when it wrote its dump.
        self.assertTrue(all(p.poll() is None for p in run.procs), [p.poll() for p in run.procs])
        v = alert.evidence.flight_recorder
        self.assertEqual(d.step.label, service_pb2.STEP_HANG)
        self.assertEqual(sorted(v.read), list(range(WORLD)))
        c = v.culprits[0]
        self.assertEqual(c.reason, CASES[fault][1])
        self.assertEqual(list(c.group_ranks), CASES[fault][2])
        self.assertEqual(c.op.name, "all_reduce")
        self.assertTrue(v.summary.startswith("rank %d holds the job" % culprit), v.summary)
        run.kill()
        keep = os.environ.get("RANKWATCH_FR_KEEP")
        if keep:
            os.makedirs(os.path.join(keep, fault), exist_ok=True)
            for p in files:
                shutil.copy(p, os.path.join(keep, fault))
        check_agreement(self, fault, folder)
        print("%s: %.1f s in all" % (job, time.monotonic() - t0))
        return d

    def test_a_rank_missing_from_a_subgroup_all_reduce(self):
        self.run_case("missing")

    def test_a_rank_calling_a_subgroup_all_reduce_with_another_size(self):
        self.run_case("size")

    def test_a_rank_stuck_in_a_p2p_send(self):
        self.run_case("p2p")
        # The send is not in gloo's Flight Recorder; the hang stacks beside the verdict show it.
        d = wait_until(lambda: (d := self.diagnosis("fr-hang-p2p")) and d.hang_stacks.settled_unix_ns and d,
                       30, "the hang stacks")
        frames = [f.function for g in d.hang_stacks.groups if 1 in list(g.ranks) for f in g.frames]
        print("p2p: rank 1's stack: %s" % frames)
        self.assertIn("send", frames)
        self.assertIn("send_activations", frames)


if __name__ == "__main__":
    unittest.main()
