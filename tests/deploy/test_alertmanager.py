"""deploy/alertmanager/alertmanager.yml against Debian's Alertmanager: amtool accepts it,
alerts route by severity, and a live Alertmanager on loopback inhibits rank-level alerts
explained by a hang or a slow node of the same job (and nothing else)."""
import datetime
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import deploy_files

AMTOOL = shutil.which("amtool")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
CONFIG = os.path.join(deploy_files.DEPLOY, "alertmanager/alertmanager.yml")


@unittest.skipUnless(AMTOOL, "amtool not installed (Debian package prometheus-alertmanager)")
class AmtoolTest(unittest.TestCase):
    def amtool(self, *args):
        return subprocess.run([AMTOOL, *args], capture_output=True, text=True, timeout=30)

    def test_check_config(self):
        r = self.amtool("check-config", CONFIG)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("SUCCESS", r.stdout)

    def test_routing_by_severity(self):
        for severity, receiver in (("critical", "oncall-pager"), ("warning", "training-chat"), ("info", "null")):
            r = self.amtool("config", "routes", "test", "--config.file=" + CONFIG,
                            "alertname=RankwatchStraggler", "training_job=llm", "severity=" + severity)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip(), receiver, severity)

    def test_pushed_node_alerts_go_to_the_oncall_grouped_by_node(self):
        r = self.amtool("config", "routes", "test", "--config.file=" + CONFIG, "--verify.receivers=oncall-pager",
                        "alertname=RankwatchNodeCulprit", "node=gpu-3", "severity=warning")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.strip(), "oncall-pager")


@unittest.skipUnless(ALERTMANAGER, "Alertmanager not installed (Debian package prometheus-alertmanager)")
class InhibitionTest(unittest.TestCase):
    def setUp(self):
        self.workdir = tempfile.mkdtemp(prefix="rankwatch-am-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = "http://127.0.0.1:%d/api/v2" % port
        self.log = open(os.path.join(self.workdir, "alertmanager.log"), "wb")
        self.proc = subprocess.Popen([ALERTMANAGER, "--config.file=" + CONFIG,
                                      "--storage.path=" + self.workdir,
                                      "--web.listen-address=127.0.0.1:%d" % port,
                                      "--cluster.listen-address=", "--log.level=warn"],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(self.url + "/status", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("Alertmanager did not start: " + open(self.log.name).read())
                time.sleep(0.2)

    def tearDown(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def post(self, alerts):
        now = datetime.datetime.now(datetime.timezone.utc)
        body = [{"labels": labels, "startsAt": now.isoformat(),
                 "endsAt": (now + datetime.timedelta(hours=1)).isoformat()} for labels in alerts]
        req = urllib.request.Request(self.url + "/alerts", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            self.assertEqual(r.status, 200)

    def states(self):
        with urllib.request.urlopen(self.url + "/alerts", timeout=5) as r:
            return {(a["labels"]["alertname"], a["labels"]["training_job"]): a["status"]["state"]
                    for a in json.load(r)}

    def test_hang_and_slow_node_inhibit_the_rank_level_alerts_of_their_job(self):
        def alert(name, job, severity, scope, category="step"):
            return {"alertname": name, "training_job": job, "severity": severity, "scope": scope,
                    "category": category}
        self.post([
            alert("RankwatchJobHang", "hung", "critical", "job"),
            alert("RankwatchStraggler", "hung", "warning", "rank"),
            alert("RankwatchMemoryImbalance", "hung", "warning", "rank", "memory"),
            alert("RankwatchMemoryCreep", "hung", "warning", "job", "memory"),
            alert("RankwatchNodeStraggler", "slow-node", "warning", "node"),
            alert("RankwatchStraggler", "slow-node", "warning", "rank"),
            alert("RankwatchStraggler", "other", "warning", "rank"),
        ])
        expected = {
            ("RankwatchJobHang", "hung"): "active",
            ("RankwatchStraggler", "hung"): "suppressed",
            ("RankwatchMemoryImbalance", "hung"): "suppressed",
            ("RankwatchMemoryCreep", "hung"): "active",        # not explained by the hang
            ("RankwatchNodeStraggler", "slow-node"): "active",
            ("RankwatchStraggler", "slow-node"): "suppressed",
            ("RankwatchStraggler", "other"): "active",         # another job: untouched
        }
        deadline = time.monotonic() + 10
        while self.states() != expected and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertEqual(self.states(), expected)


if __name__ == "__main__":
    unittest.main()
