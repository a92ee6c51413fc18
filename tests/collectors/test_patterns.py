"""Acceptance of issue #36's patterns on real jobs: a 4-rank PyTorch DDP job (gloo on CPU,
collectors/python/examples/ddp_example.py) through `rankwatch kafka` and `rankwatchd`, in which
- rank 1 writes a synchronous checkpoint (torch.save, fsynced, padded to 250 ms) at the end of
  every 10th step from step 20: rankwatchd must name rank 1 a straggler whose pattern is
  "periodic", its period within 1 step and its stall within 25 % of what the job measured;
- rank 2's logging helper costs 0.5 ms more each step from step 20: the pattern is "drift" at
  a rate within 30 % of the measured one;
- nothing is wrong: no straggler label in any diagnosis while it runs (asked every 0.3 s).
Each also checks the verdict's since-step (patterns.verdict_failures) and prints the job's
truth, the stall or drift as the step records show it, and every distinct verdict it saw."""
import unittest

from harness import DaemonTestCase
from patterns import describe, judge, run_case
from torch_job import torch_available


@unittest.skipUnless(torch_available(), "torch is not installed for this interpreter (scripts/venv.sh)")
class PatternsTest(DaemonTestCase):

    def check(self, case):
        outcome = run_case(case, "patterns-" + case, self.fleet.workdir, self.brokers, self.daemon, self.stub)
        failures, facts = judge(outcome)
        seen = []
        for _, d in outcome["watch"].diagnoses:
            line = describe(d).split(": ", 1)[1]
            if not seen or seen[-1][1] != line:
                seen.append((d.step.window.last_step, line))
        print("\n%s: truth %s\nverdicts while it ran (window's last step: verdict):\n%s\nfinal: %s" % (
            case, {k: v for k, v in facts["truth"].items() if k != "steps"},
            "\n".join("  %d: %s" % s for s in seen), facts["final"]))
        return outcome, failures, facts

    def test_a_periodic_stall_is_named_with_its_period_and_length(self):
        outcome, failures, facts = self.check("stall")
        t = facts["truth"]
        # The facts first: 8 stalls of ~250 ms, every 10 steps, seen as the rank's own time.
        self.assertEqual((t["stalls"], t["period"]), (8, 10), t)
        self.assertGreater(t["stall"], 0.24)
        self.assertLess(abs(t["record_stall"] - t["stall"]), 0.1 * t["stall"], t)
        self.assertEqual(failures, [])

    def test_a_drift_is_named_with_its_rate(self):
        outcome, failures, facts = self.check("drift")
        t = facts["truth"]
        self.assertLess(abs(t["rate"] - 0.5e-3), 0.05e-3, t)
        # The records hold CPU contention too: their slope came within 25 % of the measured rate.
        self.assertLess(abs(t["record_rate"] - t["rate"]), 0.25 * t["rate"], t)
        self.assertEqual(failures, [])

    def test_a_balanced_job_is_never_a_straggler(self):
        outcome, failures, facts = self.check("balanced")
        self.assertGreater(len(outcome["watch"].diagnoses), 10)  # it was watched while it ran
        self.assertEqual(failures, [])


if __name__ == "__main__":
    unittest.main()
