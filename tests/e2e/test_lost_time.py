"""Lost time, end to end (docs/spec/step-diagnosis.md section 3, "Lost time"): what a straggler
costs a job in rank-seconds, through the real pipeline (`rankwatch kafka`, `rankwatchd`,
`rankwatch simulate` as separate processes), checked against the cost the simulator injected.

Two 64-rank DDP jobs of 400 steps with the same seed, so the same per-rank jitter:
- `lt-faulty`: rank 21 is 30 % slower in compute (forward + backward x 1.3, the slow-compute
  fault) on steps 100-299;
- `lt-balanced`: no fault; what the jitter alone costs.

Definitions (spec): per aligned step the straggler loss is N x (max own - median own)
rank-seconds, attributed to the rank with the largest own time, own = step time - time blocked
waiting for other ranks (here the reported collective time). The injected cost: on each affected
step the slow rank's own time grows by 0.3 x (forward + backward) x the nominal step (its other
phases and the other ranks' own times do not change: they wait for it inside backward,
collectors/simulator/fleet_model.cc), so it costs N x that, summed over the affected steps. The jitter also
costs something on every step (the rank that happens to be slowest); on the 200 unaffected steps
of the faulty job that is what the balanced twin loses on the same steps (same seed), which the
check adds to the injected cost.

The metrics `rankwatch_job_lost_rank_seconds_total{training_job,cause}` and
`rankwatch_job_rank_seconds_total{training_job}` and the Diagnosis.lost_time of GetDiagnosis must
exist for this test to pass.
"""
import os
import re
import unittest

import grpc

from harness import Fleet, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2, service_pb2_grpc

RANKS = 64
STEPS = 400
STEP_MS = 100.0
SLOW_RANK = 21
MAGNITUDE = 0.3
FROM, UNTIL = 100, 300  # the fault holds for FROM <= step < UNTIL
RATE = 10000  # records/s offered: the development broker keeps 5 MiB per partition
FLEET_MODEL_H = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                             "../../collectors/simulator/fleet_model.h")


def nominal_share(name):
    """PhaseShares::<name> of the simulator (the nominal share of the step of a phase)."""
    with open(FLEET_MODEL_H) as f:
        m = re.search(r"static constexpr double %s = ([0-9.]+);" % name, f.read())
    if not m:
        raise AssertionError("PhaseShares::%s not found in %s" % (name, FLEET_MODEL_H))
    return float(m.group(1))


class LostTimeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fleet = Fleet()
        cls.brokers = cls.fleet.start_broker()
        cls.daemon = cls.fleet.start_daemon(cls.brokers)
        cls.stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(cls.daemon.endpoints["grpc"]))

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def publish(self, job, *fault):
        out = self.fleet.simulate(self.brokers, "--job", job, "--ranks", str(RANKS), "--steps", str(STEPS),
                                  "--step-ms", str(STEP_MS), "--report-collective", "--seed", "1",
                                  "--speed", "max", "--rate", str(RATE), *fault)
        self.assertEqual(out["failed"], 0, out)
        return out

    def test_lost_time_of_a_straggler_and_of_jitter(self):
        faulty, balanced = "lt-faulty", "lt-balanced"
        sim = {faulty: self.publish(faulty, "--fault", "slow-compute:%d:%g:%d-%d" % (SLOW_RANK, MAGNITUDE, FROM, UNTIL)),
               balanced: self.publish(balanced)}
        for job in (faulty, balanced):
            wait_until(lambda: metric(parse_metrics(scrape(self.daemon)), "rankwatch_steps_aligned_total",
                                      training_job=job) == STEPS, 60, "%s: %d steps aligned" % (job, STEPS))
        s = parse_metrics(scrape(self.daemon))
        diag = {job: self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)
                for job in (faulty, balanced)}

        # The cost the simulator injected, from its parameters.
        compute_share = nominal_share("kForward") + nominal_share("kBackward")
        extra_own_s = MAGNITUDE * compute_share * STEP_MS / 1000  # per affected step, slow rank
        injected = (UNTIL - FROM) * RANKS * extra_own_s

        lost = {job: metric(s, "rankwatch_job_lost_rank_seconds_total", training_job=job, cause="straggler")
                for job in (faulty, balanced)}
        hang = {job: metric(s, "rankwatch_job_lost_rank_seconds_total", training_job=job, cause="hang")
                for job in (faulty, balanced)}
        rank_s = {job: metric(s, "rankwatch_job_rank_seconds_total", training_job=job) for job in (faulty, balanced)}
        expected_rank_s = {job: RANKS * sim[job]["job_seconds"] for job in (faulty, balanced)}

        print("\ninjected: %d steps x %d ranks x %.2f x (forward + backward = %.2f of the step) x %.0f ms "
              "= %.1f rank-s (%.1f ms of own time per affected step on rank %d)"
              % (UNTIL - FROM, RANKS, MAGNITUDE, compute_share, STEP_MS, injected, extra_own_s * 1e3, SLOW_RANK))
        print("%-12s %14s %14s %14s %14s %10s" % ("job", "lost straggler", "lost hang", "rank-seconds",
                                                 "N x sum step", "lost/total"))
        for job in (faulty, balanced):
            print("%-12s %14s %14s %14s %14.1f %10s" % (
                job, "%.1f" % lost[job] if lost[job] is not None else "absent",
                "%.1f" % hang[job] if hang[job] is not None else "absent",
                "%.1f" % rank_s[job] if rank_s[job] is not None else "absent", expected_rank_s[job],
                "%.2f%%" % (100 * lost[job] / rank_s[job]) if lost[job] is not None and rank_s[job] else "-"))
        for job in (faulty, balanced):
            lt = diag[job].lost_time
            print("%-12s GetDiagnosis lost_time: total straggler %.1f, total %.1f, window straggler %.1f of %.1f; "
                  "top %s" % (job, lt.total_straggler_rank_seconds, lt.total_rank_seconds,
                              lt.window_straggler_rank_seconds, lt.window_rank_seconds,
                              [(c.rank, c.node, round(c.total_rank_seconds, 1)) for c in lt.top]))

        for job in (faulty, balanced):
            self.assertIsNotNone(lost[job], "rankwatchd does not export rankwatch_job_lost_rank_seconds_total"
                                            "{training_job=%r,cause=\"straggler\"}" % job)
            self.assertIsNotNone(rank_s[job], "rankwatchd does not export rankwatch_job_rank_seconds_total"
                                              "{training_job=%r}" % job)
            # Rank-seconds: N x the sum of the step times (under DDP every rank's step time).
            self.assertAlmostEqual(rank_s[job], expected_rank_s[job], delta=0.01 * expected_rank_s[job])
            self.assertEqual(hang[job] or 0, 0, "%s never hung" % job)

        # The faulty job loses the injected cost, plus what the jitter costs on its unaffected
        # steps (the balanced twin's loss on as many steps: same seed, same jitter).
        jitter_unaffected = lost[balanced] * (STEPS - (UNTIL - FROM)) / STEPS
        expected = injected + jitter_unaffected
        print("faulty job: lost %.1f rank-s = %.2f x injected; expected injected + jitter on the %d unaffected "
              "steps %.1f = %.1f (%+.1f%% of injected)"
              % (lost[faulty], lost[faulty] / injected, STEPS - (UNTIL - FROM), jitter_unaffected, expected,
                 100 * (lost[faulty] - expected) / injected))
        self.assertAlmostEqual(lost[faulty], expected, delta=0.10 * injected)

        # The slow rank is the top cost of the faulty job, and what it is charged is the injected
        # cost (the affected steps, where it is always the slowest; a few unaffected ones).
        top = diag[faulty].lost_time.top
        self.assertTrue(top, "faulty job: lost_time.top is empty")
        self.assertEqual(top[0].rank, SLOW_RANK)
        self.assertAlmostEqual(top[0].total_rank_seconds, injected, delta=0.10 * injected)
        self.assertAlmostEqual(diag[faulty].lost_time.total_straggler_rank_seconds, lost[faulty],
                               delta=0.01 * lost[faulty])

        # The balanced job's loss is jitter: spread over the ranks, no rank holds most of it.
        btop = diag[balanced].lost_time.top
        self.assertGreater(lost[balanced], 0)
        self.assertTrue(btop, "balanced job: lost_time.top is empty")
        share = btop[0].total_rank_seconds / diag[balanced].lost_time.total_straggler_rank_seconds
        print("balanced job: lost %.1f rank-s (%.1f%% of its rank-seconds, %.1f%% of the injected cost); "
              "top rank %d holds %.1f%% of it" % (lost[balanced], 100 * lost[balanced] / rank_s[balanced],
                                                  100 * lost[balanced] / injected, btop[0].rank, 100 * share))
        self.assertLess(share, 0.20)


if __name__ == "__main__":
    unittest.main()
