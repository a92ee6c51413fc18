"""The deploy/ monitoring stack against the real thing: `rankwatch kafka`, `rankwatchd` and a
faulty `rankwatch simulate` fleet, scraped every second by Debian's Prometheus loaded with
deploy/prometheus's rules. Every PromQL expression of the Grafana dashboard must run and
return data; every recording rule must produce series; the straggler and memory-creep alerts
must go pending or firing. Bounded: everything is stopped in tearDownClass, even on failure."""
import json
import os
import socket
import subprocess
import sys
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../e2e"))
from harness import BIN, Fleet, scrape, wait_until  # noqa: E402

import deploy_files  # noqa: E402

PROMETHEUS = "/usr/bin/prometheus"
JOB = "deploy-live"
GPU_JOB = "deploy-live-gpu"  # the Kineto fixture replayed: kernel events for the GPU panels
FIXTURES = os.environ.get("RANKWATCH_FIXTURES",
                          os.path.join(os.path.dirname(__file__), "..", "fixtures"))
DEADLINE_S = 50  # for the data each check needs to show up


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DashboardLiveTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fleet = Fleet()
        try:
            cls._start()
        except BaseException:
            cls.fleet.close()
            raise

    @classmethod
    def _start(cls):
        fleet = cls.fleet
        cls.brokers = fleet.start_broker()
        cls.daemon = fleet.start_daemon(cls.brokers)
        # 16 ranks, 150 ms steps in real time: rank 5 is 30 % slower in compute (a straggler) and
        # every rank leaks 96 MiB per step from ~40 GiB of 80: the daemon confirms the creep
        # (>= 10 % growth across its memory window) after ~100 steps (15 s) and turns to
        # high_pressure after ~370 (55 s), after the checks below.
        cls.simulator = fleet.start("simulate", [
            os.path.join(BIN, "rankwatch"), "simulate", "--brokers", cls.brokers, "--job", JOB,
            "--ranks", "16", "--steps", "100000", "--step-ms", "150", "--speed", "realtime",
            "--report-collective", "--fault", "slow-compute:5:0.3", "--fault", "memory-leak:all:96"])
        # GPU-timeline panels: a real 2-rank Kineto trace through Kafka (issue #6's live path).
        subprocess.run([os.path.join(BIN, "rankwatch"), "replay", "--brokers", cls.brokers, "--job", GPU_JOB,
                        os.path.join(FIXTURES, "kineto", "hta-trace-filter-2rank")],
                       check=True, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        config = os.path.join(fleet.workdir, "prometheus.yml")
        with open(config, "w") as f:
            json.dump({  # JSON is YAML
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": deploy_files.RULE_FILES,
                "scrape_configs": [{"job_name": "rankwatch",
                                    "static_configs": [{"targets": [cls.daemon.endpoints["metrics"]]}]}],
            }, f)
        for attempt in range(3):  # the free port may be taken between probe and bind
            port = free_port()
            cls.prometheus = fleet.start("prometheus", [
                PROMETHEUS, "--config.file=" + config,
                "--storage.tsdb.path=" + os.path.join(fleet.workdir, "tsdb-%d" % attempt),
                "--web.listen-address=127.0.0.1:%d" % port, "--log.level=warn"])
            cls.url = "http://127.0.0.1:%d" % port

            def ready():
                if cls.prometheus.proc.poll() is not None:
                    return "exited"
                try:
                    with urllib.request.urlopen(cls.url + "/-/ready", timeout=2) as r:
                        return r.status == 200 and "ready"
                except (urllib.error.URLError, ConnectionError):
                    return None
            if wait_until(ready, 30, "Prometheus to be ready") == "ready":
                return
        raise AssertionError("Prometheus did not start: " + cls.prometheus.stderr())

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def api(self, path, **params):
        url = "%s/api/v1/%s?%s" % (self.url, path, urllib.parse.urlencode(params, doseq=True))
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            return json.load(e)  # Prometheus answers a bad query with 400 and a JSON error

    def query(self, expr):
        """(error or None, result list) of an instant query."""
        body = self.api("query", query=expr)
        if body.get("status") != "success":
            return "%s: %s" % (body.get("errorType"), body.get("error")), []
        return None, body["data"]["result"]

    def test_every_dashboard_query_runs_and_returns_data(self):
        queries = list(deploy_files.dashboard_queries(deploy_files.load_dashboard()))
        self.assertGreaterEqual(len(queries), 25)
        # Every panel counts: one whose metric the daemon does not export fails below.
        pending = {}
        for title, ref, expr in queries:
            job = GPU_JOB if deploy_files.gpu_metrics_in(expr) else JOB
            pending[(title, ref)] = deploy_files.substitute(expr, job)
        self.assertGreaterEqual(len(pending), 20)
        # Poll until every query has data: rates need two scrapes, recording rules an evaluation,
        # the memory projection a window of steps.
        failures = {}
        deadline = time.monotonic() + DEADLINE_S
        while pending and time.monotonic() < deadline:
            for key, expr in list(pending.items()):
                error, result = self.query(expr)
                if error:
                    failures[key] = (expr, error)
                    del pending[key]
                elif result:
                    del pending[key]
            time.sleep(1)
        exported = scrape(self.daemon)
        for key, expr in pending.items():
            missing = [m for m in deploy_files.gpu_metrics_in(expr) if m not in exported]
            why = ("%s not exported by the daemon" % ", ".join(missing) if missing
                   else "empty result after %d s" % DEADLINE_S)
            failures[key] = (expr, why)
        self.assertFalse(failures, "dashboard queries that failed or returned nothing:\n" + "\n".join(
            "  %s [%s]: %s\n    %s" % (title, ref, why, expr) for (title, ref), (expr, why) in failures.items()))

    def test_the_training_job_variable_lists_the_job(self):
        variable = next(v for v in deploy_files.load_dashboard()["templating"]["list"] if v["name"] == "training_job")
        self.assertEqual(variable["query"]["query"], "label_values(rankwatch_steps_aligned_total, training_job)")
        wait_until(lambda: JOB in self.api("label/training_job/values",
                                           **{"match[]": "rankwatch_steps_aligned_total"}).get("data", []),
                   30, "the training_job label values")

    def test_every_recording_rule_produces_series(self):
        def empty_rules():
            groups = self.api("rules", type="record")["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            self.assertEqual(len(rules), 10)
            for r in rules:
                self.assertEqual(r["health"], "ok", r)
            return [r["name"] for r in rules if not self.query(r["name"])[1]]
        wait_until(lambda: not empty_rules(), DEADLINE_S, "every recording rule to have data", interval=1)

    def test_straggler_and_memory_creep_alerts_go_active_on_the_real_metrics(self):
        wanted = {"RankwatchStraggler", "RankwatchMemoryCreep"}
        deadline = time.monotonic() + DEADLINE_S
        while True:
            alerts = {a["labels"]["alertname"]: a for a in self.api("alerts")["data"]["alerts"]
                      if a["labels"].get("training_job") == JOB and a["state"] in ("pending", "firing")}
            if wanted <= alerts.keys() or time.monotonic() > deadline:
                break
            time.sleep(1)
        self.assertLessEqual(wanted, alerts.keys(), "active alerts: %s" % sorted(alerts))
        self.assertNotIn("RankwatchNodeStraggler", alerts)  # one slow rank is not a slow node
        self.assertNotIn("RankwatchJobHang", alerts)
        straggler = alerts["RankwatchStraggler"]
        self.assertEqual(straggler["labels"]["diagnosis"], "compute_straggler")
        self.assertGreater(float(straggler["value"]), 0.2)  # 30 % slower compute

    def test_the_container_health_check_speaks_grpc_health(self):
        check = os.path.join(deploy_files.DEPLOY, "docker/grpc_health_check.py")
        ok = subprocess.run(["/usr/bin/python3", check, self.daemon.endpoints["grpc"]],
                            capture_output=True, text=True, timeout=20)
        self.assertEqual(ok.returncode, 0, ok.stdout + ok.stderr)
        self.assertIn("SERVING", ok.stdout)
        down = subprocess.run(["/usr/bin/python3", check, "127.0.0.1:%d" % free_port(), "--timeout", "2"],
                              capture_output=True, text=True, timeout=20)
        self.assertEqual(down.returncode, 1, down.stdout + down.stderr)


if __name__ == "__main__":
    unittest.main()
