"""deploy/prometheus against Debian's promtool: the config and rules are valid, the unit tests
pass (the straggler and memory-creep alerts fire, and stay quiet where they should)."""
import os
import shutil
import subprocess
import tempfile
import unittest

import deploy_files

PROMTOOL = "/usr/bin/promtool"


def promtool(*args, cwd=deploy_files.PROMETHEUS_DIR):
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


class PrometheusRulesTest(unittest.TestCase):
    def test_check_config(self):
        r = promtool("check", "config", "prometheus.yml")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("2 rule files found", r.stdout)

    def test_check_rules(self):
        r = promtool("check", "rules", *deploy_files.RULE_FILES)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_rule_unit_tests_pass(self):
        r = promtool("test", "rules", "tests/rankwatch-alerts_test.yml")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("SUCCESS", r.stdout + r.stderr)

    def test_rule_unit_tests_catch_a_straggler_rule_that_never_fires(self):
        # The unit tests must be able to fail: weaken the straggler rule and expect a failure.
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(deploy_files.PROMETHEUS_DIR, os.path.join(tmp, "prometheus"))
            alerts = os.path.join(tmp, "prometheus/rules/rankwatch-alerts.yml")
            with open(alerts) as f:
                text = f.read()
            broken = text.replace('diagnosis=~"straggler|input_straggler|compute_straggler"} == 1',
                                  'diagnosis=~"straggler|input_straggler"} == 1', 1)
            self.assertNotEqual(text, broken)
            with open(alerts, "w") as f:
                f.write(broken)
            r = promtool("test", "rules", "tests/rankwatch-alerts_test.yml", cwd=os.path.join(tmp, "prometheus"))
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("RankwatchStraggler", r.stdout + r.stderr)

    def test_every_alert_has_routing_labels(self):
        import yaml
        with open(deploy_files.RULE_FILES[1]) as f:
            groups = yaml.safe_load(f)["groups"]
        alerts = [r for g in groups for r in g["rules"]]
        names = {a["alert"] for a in alerts}
        for wanted in ("RankwatchStraggler", "RankwatchNodeStraggler", "RankwatchJobHang", "RankwatchMemoryCreep",
                       "RankwatchMemoryPressure", "RankwatchIngestLag", "RankwatchRejectedInput"):
            self.assertIn(wanted, names)
        for a in alerts:
            self.assertIn(a["labels"]["severity"], ("critical", "warning", "info"), a["alert"])
            self.assertIn(a["labels"]["scope"], ("rank", "node", "job", "daemon"), a["alert"])
            self.assertIn(a["labels"]["category"], ("step", "memory", "fleet", "pipeline"), a["alert"])
            self.assertTrue(a["annotations"]["summary"], a["alert"])


if __name__ == "__main__":
    unittest.main()
