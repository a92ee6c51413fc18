"""Acceptance of issue #34, items 2 and 5: real PyTorch jobs (gloo on CPU) instrumented with the
`rankwatch` package, publishing to `rankwatch kafka`, diagnosed by `rankwatchd`.

Item 2: a pipeline x data parallel job (collectors/python/examples/pipeline_example.py: 4
processes = 2 stages x 2 replicas, 1F1B over 4 microbatches with send/recv between the stages,
a gradient all-reduce per stage, global-norm clipping, Adam) with (a) one worker slowed by
extra matrix products, (b) the last stage holding 1.5x the layers, (c) a random sequence length
per step and replica, (d) no fault. Item 5: a DDP job (collectors/python/examples/ddp_example.py)
whose rank 2 leaves reference cycles that its scheduled collections free, a pause of tens of
milliseconds every 5 steps.

Each test first checks the job itself from its own logs (every op of every step, each rank's
compute times): the schedule is 1F1B, data crosses the stages in order, the replicas agree on
the gradient norm, and the fault made the intended worker, stage or replica slower. CPU time
(each op's thread CPU time) for the size of a fault, since 4 ranks on 2 shared cores queue for
them; wall time only for its direction. It prints the facts per worker, then checks the daemon's
verdict. RANKWATCH_TEST_STEPS sets the steps (40)."""
import json
import os
import statistics
import unittest

from harness import DaemonTestCase, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2
from step_records import read_batches, steps_by_rank
from torch_job import DIAGNOSED_JOB_ARGS, TorchJob, torch_available

HERE = os.path.dirname(os.path.abspath(__file__))
PIPELINE = os.path.join(HERE, "../../collectors/python/examples/pipeline_example.py")
STEPS = int(os.environ.get("RANKWATCH_TEST_STEPS", "40"))
# Each op's real compute (layers of width 48: ~10 ms of CPU time a rank and step) plus its
# accelerator time (--device-ms: 4 ms per layer and microbatch forward, 8 backward), a sleep as
# the host thread of a GPU job waits for its kernels. With the compute alone, 4 ranks queueing
# for 2 cores (and other processes' load) stretch random ops: the study's own analyzer put a
# balanced run at S = 1.28-1.48 (load 5-9). With 2 ms of accelerator time a balanced run came
# out at S = 1.04-1.065 (load 2-10), at the verdicts' 1.05 threshold; with 4 ms (steps of
# ~270 ms) at 1.02-1.04 (load 2.5-3), against 1.12-1.24 with a fault.
PIPELINE_JOB_ARGS = ("--hidden", "48", "--device-ms", "4")
SKIP = 5  # warm-up steps left out of the per-worker facts
DP, PP, MICROBATCHES = 2, 2, 4

# The ops of one step of each stage (2 stages, 4 microbatches) in start order: 1F1B, as
# Megatron-LM's non-interleaved schedule. F/B = forward/backward-compute, FS/FR =
# forward-send/-recv (the activations), BS/BR = backward-send/-recv (their gradients); number =
# microbatch; X+Y = one exchange (both posted, then both waited for): Y's span inside X's.
EXPECTED_ORDER = {
    0: "data-loading F0 FS0 F1 BR0+FS1 B0 F2 BR1+FS2 B1 F3 BR2+FS3 B2 BR3 B3",
    1: "data-loading FR0 F0 B0 FR1+BS0 F1 B1 FR2+BS1 F2 B2 FR3+BS2 F3 B3 BS3",
}
TAIL = ["grads-all-reduce", "optimizer-clip-main-grad", "optimizer"]
SHORT = {"forward-compute": "F", "backward-compute": "B", "forward-send": "FS", "forward-recv": "FR",
         "backward-send": "BS", "backward-recv": "BR"}


def short(op):
    s = SHORT.get(op["op"])
    return op["op"] if s is None else "%s%d" % (s, op["microbatch"])


def median_after_warmup(values):
    return statistics.median(values[SKIP:])


@unittest.skipUnless(torch_available(), "torch is not installed for this interpreter (scripts/venv.sh)")
class PipelineJobTest(DaemonTestCase):

    def run_pipeline(self, job, *args):
        """Runs the pipeline job; checks its schedule; returns (diagnosis, ranks, facts) where
        facts[(data rank, stage)] = per-worker medians in ms (after warm-up)."""
        log_dir = os.path.join(self.fleet.workdir, job)
        os.makedirs(log_dir)
        ranks = TorchJob(self.fleet.workdir, job, self.brokers, STEPS, *PIPELINE_JOB_ARGS, "--op-log", log_dir,
                         *args, script=PIPELINE).wait(timeout=240)
        for r in ranks:
            self.assertEqual(r["steps"], STEPS)
            self.assertEqual(r["collector"]["records_dropped"], 0, r["collector"])
            self.assertEqual(r["collector"]["batches_failed"], 0, r["collector"])
        ops = {}
        for r in ranks:
            with open(os.path.join(log_dir, "rank%d.json" % r["rank"])) as f:
                ops[r["rank"]] = json.load(f)
        self.check_schedule(ranks, ops)
        facts = {}
        print("\n%s %s\nworker (dp, stage): step ms, compute ms (wall), compute ms (CPU), layers" % (
            job, " ".join(args)))
        for r in ranks:
            w = (r["data_rank"], r["stage"])
            facts[w] = {k: 1e3 * median_after_warmup(r[k + "_seconds"]) for k in ("step", "compute", "compute_cpu")}
            print("  %s: %6.1f %6.1f %6.1f  %d" % (w, facts[w]["step"], facts[w]["compute"],
                                                  facts[w]["compute_cpu"], r["layers"]))
        d = self.diagnosis(job)
        return d, ranks, facts

    def diagnosis(self, job):
        wait_until(lambda: metric(parse_metrics(scrape(self.daemon)), "rankwatch_steps_aligned_total",
                                  training_job=job) == STEPS, 60, "%s: every step aligned" % job)
        return self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)

    def check_schedule(self, ranks, ops):
        """Every step of every rank ran its stage's 1F1B order; activations reached the next
        stage after their forward ended there, gradients the previous stage after their
        backward; the replicas of a stage all-reduced together; every rank clipped with the
        same global gradient norm."""
        by_coord = {(r["data_rank"], r["stage"]): r["rank"] for r in ranks}
        self.assertEqual(sorted(by_coord), [(d, s) for d in range(DP) for s in range(PP)])
        steps = {}
        for rank, log in ops.items():
            for op in sorted(log, key=lambda o: o["start_ns"]):
                steps.setdefault((rank, op["step"]), []).append(op)
        for (rank, step), step_ops in steps.items():
            where = "rank %d step %d" % (rank, step)
            expected = EXPECTED_ORDER[ranks[rank]["stage"]].split() + TAIL
            self.assertEqual([short(o) for o in step_ops], [o for e in expected for o in e.split("+")], where)
            k = 0
            for e in expected:  # each op after the previous one, an exchange's two together
                if k > 0:
                    self.assertLessEqual(step_ops[k - 1]["end_ns"], step_ops[k]["start_ns"], where)
                if "+" in e:
                    outer, inner = step_ops[k], step_ops[k + 1]
                    self.assertLessEqual(inner["end_ns"], outer["end_ns"], where)  # sorted: starts in order
                    k += 1
                k += 1
        self.assertEqual(len(steps), len(ranks) * STEPS)

        def find(rank, step, name):
            return {short(o): o for o in steps[(rank, step)]}[name]
        for step in range(STEPS):
            for d in range(DP):
                first, last = by_coord[(d, 0)], by_coord[(d, PP - 1)]
                for i in range(MICROBATCHES):
                    self.assertLessEqual(find(first, step, "F%d" % i)["end_ns"],
                                         find(last, step, "F%d" % i)["start_ns"], (step, d, i))
                    self.assertLessEqual(find(last, step, "B%d" % i)["end_ns"],
                                         find(first, step, "B%d" % i)["start_ns"], (step, d, i))
            for s in range(PP):
                members = [by_coord[(d, s)] for d in range(DP)]
                reduces = [find(m, step, "grads-all-reduce") for m in members]
                self.assertLessEqual(max(o["start_ns"] for o in reduces), min(o["end_ns"] for o in reduces),
                                     "step %d stage %d: the all-reduce did not join its replicas" % (step, s))
        for r in ranks:
            self.assertEqual(r["grad_norms"], ranks[0]["grad_norms"], "rank %d's global norm" % r["rank"])

    def assert_verdict(self, d, verdict, data_rank=-1, stage=-1):
        w = d.whatif
        print("what-if: %s (S %.3f, by data rank %s, by stage %s, M_W %.2f, M_S %.2f), culprit "
              "data rank %d stage %d ranks %s\nnote: %s" % (
                  w.verdict, w.slowdown, ["%.3f" % v for v in w.slowdown_by_data_rank],
                  ["%.3f" % v for v in w.slowdown_by_stage], w.m_w, w.m_s, w.culprit_data_rank,
                  w.culprit_stage, list(w.culprit_ranks), w.note))
        self.assertTrue(d.HasField("whatif"), "no what-if section for a pipeline job")
        self.assertEqual((w.data_parallel_size, w.pipeline_size), (DP, PP))
        if isinstance(verdict, str):
            verdict = (verdict,)
        self.assertIn(w.verdict, verdict, w.note)
        self.assertEqual((w.culprit_data_rank, w.culprit_stage), (data_rank, stage), w.note)

    # --- (a) one slow worker ---------------------------------------------------------------
    def test_a_slow_worker_is_named_by_its_coordinates(self):
        d, ranks, facts = self.run_pipeline("pp-slow-worker", "--fault-slow-worker", "1,0",
                                            "--fault-slow-factor", "1.5")
        slow, peer = facts[(1, 0)], facts[(0, 0)]
        # Its compute took 1.5x the CPU time and the accelerator time of its peer's.
        self.assertGreater(slow["compute_cpu"], 1.3 * peer["compute_cpu"])
        for w, f in facts.items():
            if w != (1, 0):
                self.assertGreater(slow["compute"], 1.3 * f["compute"], w)
        self.assert_verdict(d, "slow_worker", data_rank=1, stage=0)
        self.assertEqual(list(d.whatif.culprit_ranks), [1])

    # --- (b) the last stage holds 1.5x the layers --------------------------------------------
    def test_a_longer_last_stage_is_a_stage_imbalance(self):
        d, ranks, facts = self.run_pipeline("pp-last-stage", "--fault-last-stage-layers-factor", "1.5")
        self.assertEqual([r["layers"] for r in ranks], [4, 4, 6, 6])
        for dp in range(DP):
            # The host's share of a layer (dispatch) is a few hundred microseconds of CPU on
            # torch 2.13, partly per step rather than per layer: 1.5x the layers took
            # 1.17-1.19x the CPU time (1.2x and more on torch 1.13); the device time, 1.5x.
            self.assertGreater(facts[(dp, 1)]["compute_cpu"], 1.1 * facts[(dp, 0)]["compute_cpu"], dp)
            self.assertGreater(facts[(dp, 1)]["compute"], 1.3 * facts[(dp, 0)]["compute"], dp)
        self.assert_verdict(d, "stage_imbalance", stage=1)

    # --- (c) a random sequence length per step and replica -------------------------------------
    def test_random_sequence_lengths_are_a_sequence_imbalance(self):
        d, ranks, facts = self.run_pipeline("pp-seq-len", "--fault-random-seq-len")
        by_coord = {(r["data_rank"], r["stage"]): r for r in ranks}
        for dp in range(DP):  # both stages of a replica had the replica's length
            self.assertEqual(by_coord[(dp, 0)]["seq_lens"], by_coord[(dp, 1)]["seq_lens"])
        seq = [by_coord[(dp, 0)]["seq_lens"] for dp in range(DP)]
        # The replica with the longer sequences changes from step to step ...
        longer = [0 if a > b else 1 for a, b in zip(*seq) if a != b]
        self.assertGreater(min(longer.count(0), longer.count(1)), len(longer) // 4, seq)
        # ... and where it is at least 1.5x longer, its compute took longer on both stages, in
        # CPU time and in wall time (8 to 40 tokens a sequence, 48 the two together).
        clear = [k for k in range(SKIP, STEPS) if max(seq[0][k], seq[1][k]) >= 1.5 * min(seq[0][k], seq[1][k])]
        self.assertGreater(len(clear), STEPS // 4)
        # CPU time is noisier: a step's ~4 ms of host CPU on torch 2.13 differs little with the
        # length, and the interpreter's own full collections (~120 ms, a few a run) land in
        # random steps: 18-19 of 22 clear steps agreed in CPU time (0.9 on torch 1.13), 14 of
        # 22 in a CI run beside other tests. The wall time, which the diagnosis reads, keeps 0.9.
        for s in range(PP):
            for kind, share in (("compute_cpu_seconds", 0.6), ("compute_seconds", 0.9)):
                t = [by_coord[(dp, s)][kind] for dp in range(DP)]
                agree = sum((seq[0][k] > seq[1][k]) == (t[0][k] > t[1][k]) for k in clear)
                self.assertGreaterEqual(agree, share * len(clear), "stage %d %s: %d of %d steps" % (
                    s, kind, agree, len(clear)))
        self.assert_verdict(d, "sequence_imbalance")

    # --- (d) no fault -------------------------------------------------------------------------
    def test_a_balanced_pipeline_has_no_culprit(self):
        d, ranks, facts = self.run_pipeline("pp-balanced")
        # Even work: the last stage also computes the loss, and a step's 4-5 ms of host CPU
        # on torch 2.13 varies with what else runs (1.21x once beside a C++ build; 1.5x would
        # be a fault's).
        cpu = [f["compute_cpu"] for f in facts.values()]
        self.assertLess(max(cpu), 1.3 * min(cpu), facts)
        # Balanced, or (on a loaded machine, where contention stretches random ops) slower than
        # ideal with nothing to blame: never a culprit, never an alert.
        self.assert_verdict(d, ("balanced", "unattributed"))
        self.assertEqual(service_pb2.Severity.Name(d.whatif.severity), "SEVERITY_INFO", d.whatif.note)

    # --- issue #34, item 5: GC pauses in a DDP job ------------------------------------------
    def test_ddp_rank_2_gc_pauses_are_named(self):
        job = "ddp-gc"
        ranks = TorchJob(self.fleet.workdir, job, self.brokers, STEPS, *DIAGNOSED_JOB_ARGS,
                         "--fault-gc-rank", "2", "--fault-gc-every", "5").wait(timeout=240)
        for r in ranks:
            self.assertEqual(r["steps"], STEPS)
            self.assertEqual(len(r["gc_fault_seconds"]), STEPS // 5 if r["rank"] == 2 else 0)
        pauses = [1e3 * s for s in ranks[2]["gc_fault_seconds"]]
        steps = [1e3 * s for s in ranks[2]["step_seconds"][SKIP:]]
        print("\n%s: rank 2's collections, ms: %s; median step %.1f ms" % (
            job, " ".join("%.1f" % p for p in pauses), statistics.median(steps)))
        # Each full collection visits the ~100k objects the process tracks: 50-140 ms measured
        # on a ~40 ms step, a quarter to a half of rank 2's time.
        self.assertGreater(statistics.median(pauses), 0.5 * statistics.median(steps))
        # The collector recorded the pauses (gc.callbacks) on rank 2, and much less elsewhere:
        # torch 2.x's import leaves ~170k objects tracked, so the interpreter's own automatic
        # full collections also take ~120 ms, a few times a run on every rank (0.39 x rank 2's
        # total in one run; next to none under torch 1.13).
        gc_ms = {rank: sum(s.gc_ns for s in by_step.values()) / 1e6
                 for rank, by_step in steps_by_rank(read_batches(self.brokers, job)).items()}
        print("GC recorded by the collector, ms over the run: %s" % {k: round(v, 1) for k, v in gc_ms.items()})
        self.assertGreater(gc_ms[2], 0.8 * sum(pauses))
        for rank in (0, 1, 3):
            self.assertLess(gc_ms[rank], 0.5 * gc_ms[2], rank)
        d = self.diagnosis(job)
        print("diagnosis: %s, culprit ranks %s, cause %s, scores: own %.3f compute %.3f input %.3f; GC: rank "
              "%d %.1f ms a step, median %.1f ms\nnote: %s" % (
                  service_pb2.StepDiagnosisLabel.Name(d.step.label), list(d.step.culprit_ranks),
                  service_pb2.StragglerCause.Name(d.step.cause), d.step.scores.own, d.step.scores.compute,
                  d.step.scores.input, d.step.gc.rank, d.step.gc.seconds * 1e3, d.step.gc.median_seconds * 1e3,
                  d.step.note))
        self.assertEqual(list(d.step.culprit_ranks), [2], d.step.note)
        self.assertEqual(service_pb2.StragglerCause.Name(d.step.cause), "CAUSE_GC", d.step.note)
        self.assertEqual(d.step.gc.rank, 2)
        self.assertFalse(d.HasField("whatif"), "a flat DDP job has no what-if")

if __name__ == "__main__":
    unittest.main()
