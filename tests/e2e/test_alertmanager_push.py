"""The Alertmanager push (issue #38) against Debian's real Alertmanager (prometheus-alertmanager)
on loopback, which notifies a receiver the test runs (webhook_configs, send_resolved):

- a straggler alert rankwatchd raises reaches Alertmanager with its labels (alertname, job, rank,
  pod, severity, scope), the diagnosis note as summary, the next step, the runbook and the web UI
  link (generatorURL), and stays active while it fires, re-sent with a later endsAt;
- Alertmanager stopped for 30 s loses nothing: the straggler that resolves during the outage
  arrives resolved (endsAt: rankwatch's resolve time), and one that fires during the outage
  arrives firing, once Alertmanager is back (restarted on its storage: its notification log
  remembers what it notified, the alerts themselves come from rankwatchd again).
"""
import datetime
import json
import os
import shutil
import socket
import subprocess
import time
import unittest
import urllib.error
import urllib.request

from alert_client import stored_alerts
from harness import BIN, Fleet, fast_group_config, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2
from webhook_receiver import Receiver

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
CONFIG = """route:
  receiver: test
  group_by: [alertname, training_job]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: test
    webhook_configs:
      - url: %s
        send_resolved: true
"""


class Alertmanager:
    """Alertmanager on a loopback port, its config and storage in `workdir`; start() again after
    stop() restarts it on the same port and storage."""

    def __init__(self, workdir, receiver_url):
        self.workdir = workdir
        self.config = os.path.join(workdir, "alertmanager.yml")
        with open(self.config, "w") as f:
            f.write(CONFIG % receiver_url)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.proc = None
        self.starts = 0

    def start(self):
        self.starts += 1
        log = open(os.path.join(self.workdir, "alertmanager-%d.log" % self.starts), "wb")
        self.proc = subprocess.Popen([ALERTMANAGER, "--config.file=" + self.config,
                                      "--storage.path=" + os.path.join(self.workdir, "am-data"),
                                      "--web.listen-address=127.0.0.1:%d" % self.port,
                                      "--cluster.listen-address=", "--log.level=warn"],
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        wait_until(lambda: self.ready() or self.proc.poll() is not None, 20, "Alertmanager to start")
        assert self.proc.poll() is None, "Alertmanager exited"

    def ready(self):
        try:
            with urllib.request.urlopen(self.url + "/api/v2/status", timeout=2):
                return True
        except (urllib.error.URLError, ConnectionError):
            return False

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)

    def stragglers(self):
        """Alertmanager's active straggler alerts, by training job."""
        with urllib.request.urlopen(self.url + "/api/v2/alerts?active=true", timeout=5) as r:
            return {a["labels"].get("training_job"): a for a in json.load(r)
                    if a["labels"]["alertname"] == "RankwatchStraggler"}


def parse_time(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def notified(receiver, job, status):
    """The straggler alerts of `job` the receiver was notified with `status` ("firing",
    "resolved")."""
    found = []
    for post in receiver.received():
        for a in (post["json"] or {}).get("alerts", []):
            if (a["labels"].get("training_job") == job and a["status"] == status
                    and a["labels"]["alertname"] == "RankwatchStraggler"):
                found.append(a)
    return found


def simulate(fleet, job, brokers, steps, fault):
    return fleet.start("simulate-" + job, [
        os.path.join(BIN, "rankwatch"), "simulate", "--brokers", brokers, "--job", job, "--ranks", "8",
        "--steps", str(steps), "--step-ms", "10", "--speed", "realtime", "--report-collective",
        "--fault", fault])


@unittest.skipUnless(ALERTMANAGER, "Alertmanager not installed (Debian package prometheus-alertmanager)")
class AlertmanagerPushTest(unittest.TestCase):
    def setUp(self):
        self.fleet = Fleet()
        self.receiver = Receiver()
        self.am = Alertmanager(self.fleet.workdir, self.receiver.url)
        self.am.start()

    def tearDown(self):
        if self.am.proc.poll() is None:
            self.am.stop()
        self.receiver.close()
        self.fleet.close()

    def firing(self, daemon, job):
        return metric(parse_metrics(scrape(daemon)), "rankwatch_alerts_firing", training_job=job,
                      kind="straggler")

    def test_a_straggler_reaches_alertmanager_and_an_outage_loses_nothing(self):
        brokers = self.fleet.start_broker()
        daemon = self.fleet.start_daemon(brokers, extra=[
            "--window-steps", "20", "--config", fast_group_config(self.fleet),
            "--alertmanager", self.am.url, "--alertmanager-resend-interval", "2s",
            "--ui-external-url", "http://rw.example:8466",
            "--alert-runbook-url", "https://runbooks.example/{alertname}"])
        simulate(self.fleet, "am1", brokers, 2000, "slow-compute:5:0.4:100-1600")

        # It reaches Alertmanager with what rankwatch knows, and its receiver.
        alert = wait_until(lambda: self.am.stragglers().get("am1"), 20, "the straggler in Alertmanager")
        labels = alert["labels"]
        self.assertEqual(labels["alertname"], "RankwatchStraggler")
        self.assertEqual(labels["rank"], "5")
        self.assertEqual(labels["scope"], "rank")
        self.assertIn(labels["severity"], ("warning", "critical"))
        self.assertEqual(alert["annotations"]["alert_id"], "am1|straggler|rank:5")
        self.assertIn("rank 5", alert["annotations"]["summary"])
        self.assertTrue(alert["annotations"]["next_step"])
        self.assertEqual(alert["annotations"]["runbook_url"], "https://runbooks.example/RankwatchStraggler")
        self.assertEqual(alert["generatorURL"], "http://rw.example:8466/ui/jobs/am1")
        wait_until(lambda: notified(self.receiver, "am1", "firing"), 10, "the receiver's firing notification")
        # Active while it fires: re-sent every 2 s, its endsAt (8 s ahead) moves on.
        first_end = parse_time(alert["endsAt"])
        time.sleep(9)
        alert = self.am.stragglers().get("am1")
        self.assertIsNotNone(alert, "the straggler expired in Alertmanager while it fires")
        self.assertEqual(alert["status"]["state"], "active")
        self.assertGreater(parse_time(alert["endsAt"]), first_end + datetime.timedelta(seconds=5))
        self.assertEqual(self.firing(daemon, "am1"), 1)

        # Alertmanager goes away for 30 s: am1 resolves, am2 fires meanwhile.
        self.am.stop()
        outage = time.monotonic()
        simulate(self.fleet, "am2", brokers, 5000, "slow-compute:2:0.4:50")
        wait_until(lambda: self.firing(daemon, "am1") == 0 and self.firing(daemon, "am2") == 1, 28,
                   "am1 to resolve and am2 to fire during the outage")
        failed = metric(parse_metrics(scrape(daemon)), "rankwatch_alertmanager_posts_failed_total",
                        target=self.am.url)
        self.assertGreater(failed, 0)
        time.sleep(max(0.0, 30 - (time.monotonic() - outage)))
        self.am.start()

        resolved = wait_until(lambda: notified(self.receiver, "am1", "resolved"), 20,
                              "am1's resolution after the outage")[0]
        wait_until(lambda: notified(self.receiver, "am2", "firing"), 20, "am2's firing after the outage")
        # endsAt is when rankwatch resolved it.
        stored = [a for a in stored_alerts(daemon.endpoints["grpc"], job="am1")
                  if a.state == service_pb2.ALERT_RESOLVED]
        self.assertEqual(len(stored), 1)
        at = datetime.datetime.fromtimestamp(stored[0].at_unix_ns / 1e9, datetime.timezone.utc)
        self.assertLess(abs(parse_time(resolved["endsAt"]) - at), datetime.timedelta(milliseconds=2))
        active = self.am.stragglers()
        self.assertNotIn("am1", active)
        self.assertEqual(active["am2"]["labels"]["rank"], "2")
        samples = parse_metrics(scrape(daemon))
        self.assertEqual(metric(samples, "rankwatch_alertmanager_pending_alerts", target=self.am.url), 0)
        self.assertGreaterEqual(metric(samples, "rankwatch_alertmanager_alerts_sent_total", target=self.am.url), 4)


if __name__ == "__main__":
    unittest.main()
