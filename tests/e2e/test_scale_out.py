"""Scale-out: two daemon instances share the partitions of one consumer group through a state
changelog. Two instances start; a third joins while jobs run (partitions move to it with their
state); then one of the first two is killed with SIGKILL, and its partitions, whose state no
other instance ever had, come back from the changelog. Every job keeps being diagnosed, by
exactly one instance, and the diagnoses equal those of a single instance over the same input."""
import os
import signal
import time
import unittest

from harness import BIN, Fleet, fast_group_config, metric, parse_metrics, scrape, wait_until
from test_durability import diagnosis

JOBS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
STEPS = 1500


def aligned(daemon, job):
    try:
        return metric(parse_metrics(scrape(daemon)), "rankwatch_steps_aligned_total", training_job=job)
    except OSError:
        return None


class ScaleOutTest(unittest.TestCase):
    def setUp(self):
        self.fleet = Fleet()
        self.config = fast_group_config(self.fleet)

    def tearDown(self):
        self.fleet.close()

    def daemon(self, brokers, group, *extra):
        args = ["--group", group, "--config", self.config, "--checkpoint-interval", "200ms"] + list(extra)
        return self.fleet.start_daemon(brokers, extra=args)

    def test_partitions_move_with_their_state_and_a_killed_instance_loses_nothing(self):
        brokers = self.fleet.start_broker(partitions=4)
        changelog = ["--changelog-topic", "rankwatch.telemetry.changelog"]
        reference = self.daemon(brokers, "reference")
        first = self.daemon(brokers, "scaled", *changelog)
        second = self.daemon(brokers, "scaled", *changelog)
        sims = []
        for i, job in enumerate(JOBS):
            faults = ["--fault", "slow-compute:%d:0.3:300" % (i % 4)] if i % 2 == 0 else \
                     ["--fault", "memory-leak:all:64:1000"]
            sims.append(self.fleet.start("simulate-" + job, [
                os.path.join(BIN, "rankwatch"), "simulate", "--brokers", brokers, "--job", job,
                "--ranks", "8", "--steps", str(STEPS), "--step-ms", "10", "--speed", "realtime",
                "--report-collective", "--seed", str(i + 1)] + faults))
        time.sleep(3)
        # A third instance joins: the group hands it partitions, which move with their state.
        third = self.daemon(brokers, "scaled", *changelog)
        time.sleep(2)
        # The victim: one of the first two that owns jobs now. The assignor may leave an
        # instance only partition 3, to which none of the jobs hashes.
        owned = lambda d: metric(parse_metrics(scrape(d)), "rankwatch_jobs") or 0
        victim = wait_until(lambda: next((d for d in (second, first) if owned(d) > 0), None), 30,
                            "one of the first two instances to own jobs")
        victim_jobs = owned(victim)
        # The victim's jobs never were on another instance: only the changelog has their state.
        victim.stop(signal.SIGKILL)
        for sim in sims:
            self.assertEqual(sim.proc.wait(120), 0, sim.stderr())

        survivors = [d for d in (first, second, third) if d is not victim]

        def owner(job):
            for d in survivors:
                if aligned(d, job) == STEPS:
                    return d
            return None
        for job in JOBS:
            wait_until(lambda: aligned(reference, job) == STEPS, 60, "the reference daemon (%s)" % job)
            try:
                wait_until(lambda: owner(job), 90, "a surviving instance to finish %s" % job)
            except AssertionError:
                for d in survivors + [victim]:
                    if os.environ.get("RANKWATCH_KEEP_LOGS"):
                        with open(os.path.join(os.environ["RANKWATCH_KEEP_LOGS"], d.name + ".log"), "w") as f:
                            f.write(d.stderr())
                    print("---", d.name, "aligned", aligned(d, job) if d is not victim else "killed")
                    if d is not victim:
                        print("\n".join(l for l in scrape(d).splitlines()
                                        if ("rejected" in l or "timed_out" in l) and not l.startswith("#")))
                    print("\n".join(l for l in d.stderr().splitlines()
                                    if "partition" in l or job in l or "error" in l))
                raise
        time.sleep(1)  # final snapshots are published
        served = 0
        for d in survivors:
            s = parse_metrics(scrape(d))
            served += metric(s, "rankwatch_jobs")
            self.assertEqual(metric(s, "rankwatch_events_rejected_total", reason="duplicate"), 0)
            self.assertEqual(metric(s, "rankwatch_events_rejected_total", reason="late"), 0)
        self.assertEqual(served, len(JOBS))  # every job on exactly one instance
        self.assertGreater(victim_jobs, 0)
        self.assertTrue(any("state from the changelog" in d.stderr() for d in survivors))
        for job in JOBS:
            a, b = diagnosis(reference, job), diagnosis(owner(job), job)
            for d in (a, b):
                d.ClearField("evaluated_unix_ns")
                d.step.hang.Clear()
            self.assertEqual(a.aligned_steps, STEPS, job)
            self.assertEqual(a, b, job)


if __name__ == "__main__":
    unittest.main()
