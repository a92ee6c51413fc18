"""The action policy's webhooks (issue #38) against receivers the test runs (http.server), on a
4-rank job that steps and then hangs (hang_ranks.py with the `rankwatch` package, whose stack
responder answers the daemon's stacks request):

- `--action hang:critical=webhook` and two webhooks: each gets exactly one call for the firing
  hang alert, made once its stacks came and carrying them; the receiver that holds the daemon's
  secret verifies the signature, the one with another secret detects the mismatch; the outcome
  is counted in the metrics and logged;
- `--action-dry-run true`: nothing is called; the daemon logs what it would have done.
"""
import os
import subprocess
import sys
import time
import unittest

from harness import BIN, Fleet, metric, parse_metrics, scrape, wait_until
from webhook_receiver import Receiver

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.environ.get("RANKWATCH_PYTHON_DIR", os.path.join(HERE, "../../build/python"))
WORLD = 4


def package_built():
    return os.path.exists(os.path.join(PYTHON_DIR, "rankwatch", "__init__.py"))


@unittest.skipUnless(package_built(), "the rankwatch Python package is not built (pybind11-dev)")
class AlertActionsTest(unittest.TestCase):
    def setUp(self):
        self.fleet = Fleet()
        self.brokers = self.fleet.start_broker()
        self.secret = os.path.join(self.fleet.workdir, "secret")
        with open(self.secret, "w") as f:
            f.write("right-secret\n")

    def tearDown(self):
        self.fleet.close()

    def start_job(self, job):
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
        for rank in range(WORLD):
            self.fleet.start("rank-%d" % rank,
                             [sys.executable, os.path.join(HERE, "hang_ranks.py"), "--job", job,
                              "--brokers", self.brokers, "--rank", str(rank), "--world", str(WORLD),
                              "--steps", "60"], env=env)

    def daemon(self, *extra):
        return self.fleet.start_daemon(self.brokers, extra=["--hang-timeout", "4s", "--window-steps", "20",
                                                            "--action", "hang:critical=webhook",
                                                            "--action-secret-file", self.secret] + list(extra))

    def test_one_signed_call_per_firing_hang_alert_with_its_stacks(self):
        right = Receiver(secret=b"right-secret")
        wrong = Receiver(secret=b"another-secret")
        self.addCleanup(right.close)
        self.addCleanup(wrong.close)
        daemon = self.daemon("--action-webhook", right.url, "--action-webhook", wrong.url)
        self.start_job("hung")
        wait_until(lambda: right.received() and wrong.received(), 45, "the hang action's calls")
        time.sleep(3)  # the alert's re-publications (stacks, Flight Recorder) call nothing more
        for receiver in (right, wrong):
            posts = receiver.received()
            self.assertEqual(len(posts), 1, [p["json"] for p in posts])
        call = right.received()[0]
        self.assertTrue(call["signature_ok"], call["headers"])
        self.assertFalse(wrong.received()[0]["signature_ok"])  # the receiver sees the mismatch
        self.assertEqual(call["body"], wrong.received()[0]["body"])
        payload = call["json"]
        self.assertEqual(payload["kind"], "hang")
        self.assertEqual(payload["training_job"], "hung")
        self.assertEqual(payload["rule"], "hang:critical=webhook")
        self.assertEqual(payload["labels"]["alertname"], "RankwatchJobHang")
        self.assertEqual(call["headers"]["X-Rankwatch-Delivery"],
                         "%s@%d" % (payload["alert_id"], payload["firing_sequence"]))
        # Observe, collect evidence, then act: the stacks are in the payload.
        self.assertTrue(payload["hang_stacks"], payload)
        stacks = payload["alert"]["evidence"]["hang_stacks"]
        self.assertEqual(stacks["ranks_answered"], WORLD, stacks)
        wheres = [g.get("where", "") for g in stacks["groups"]]
        self.assertTrue(any("load_shard" in w for w in wheres), wheres)
        self.assertIn("hang_stacks", payload["annotations"])
        samples = parse_metrics(scrape(daemon))
        self.assertEqual(metric(samples, "rankwatch_alert_actions_total", kind="hang", outcome="delivered"), 1)
        self.assertIn("webhook delivered, with its stacks", daemon.stderr() + daemon.stdout())
        # The record, over gRPC.
        out = subprocess.run([os.path.join(BIN, "rankwatch"), "alerts", "--actions", "--server",
                              daemon.endpoints["grpc"], "--job", "hung"],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.strip().splitlines()
        self.assertEqual(len(lines), 1, out.stdout)
        self.assertIn("delivered hung|hang|job (rule hang:critical=webhook, 1 round, with stacks)", lines[0])

    def test_dry_run_calls_nothing_and_logs_the_action(self):
        receiver = Receiver()
        self.addCleanup(receiver.close)
        daemon = self.daemon("--action-webhook", receiver.url, "--action-dry-run", "true")
        self.start_job("dry")
        wait_until(lambda: "action (dry run) for dry|hang|job" in daemon.stderr() + daemon.stdout(), 45,
                   "the dry run's log line")
        log = daemon.stderr() + daemon.stdout()
        self.assertIn("would POST", log)
        self.assertIn(receiver.url, log)
        samples = parse_metrics(scrape(daemon))
        self.assertEqual(metric(samples, "rankwatch_alert_actions_total", kind="hang", outcome="dry_run"), 1)
        time.sleep(1)
        self.assertEqual(receiver.received(), [])


if __name__ == "__main__":
    unittest.main()
