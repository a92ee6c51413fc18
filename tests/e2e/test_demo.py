"""scripts/demo.sh: shows aligned steps within 30 s and stops everything it started on Ctrl-C."""
import os
import re
import signal
import subprocess
import time
import unittest
import urllib.request

from harness import BIN, metric, parse_metrics, wait_until

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is not running anymore.
    with open("/proc/%d/stat" % pid) as f:
        return f.read().split()[2] != "Z"


class DemoTest(unittest.TestCase):
    def test_demo_aligns_steps_within_30s_and_stops_cleanly_on_ctrl_c(self):
        env = dict(os.environ, RANKWATCH_BIN=os.path.abspath(BIN), DEMO_METRICS="127.0.0.1:0",
                   DEMO_GRPC="127.0.0.1:0", DEMO_UI="127.0.0.1:0")
        log = open(os.path.join(ROOT, "build", "demo-test.log"), "w+")
        demo = subprocess.Popen(["bash", os.path.join(ROOT, "scripts/demo.sh")], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        started = time.monotonic()
        try:
            def output():
                log.seek(0)
                return log.read()
            text = wait_until(lambda: "processes:" in output() and output(), 20, "the demo banner")
            metrics = re.search(r"metrics:\s+(http://\S+/metrics)", text).group(1)
            ui = re.search(r"web UI:\s+(http://\S+/ui/)", text).group(1)
            with urllib.request.urlopen(ui, timeout=5) as r:  # the banner's UI address serves it
                self.assertIn("<title>rankwatch</title>", r.read().decode())
            pids = [int(p) for p in re.findall(r"=(\d+)", re.search(r"processes:.*", text).group(0))]
            self.assertEqual(len(pids), 2)

            def aligned():
                with urllib.request.urlopen(metrics, timeout=5) as r:
                    v = metric(parse_metrics(r.read().decode()), "rankwatch_steps_aligned_total",
                               training_job="demo-job")
                return v and v > 0
            wait_until(aligned, 30 - (time.monotonic() - started), "aligned steps from the demo")

            def slow_rank_named():
                with urllib.request.urlopen(metrics, timeout=5) as r:
                    s = parse_metrics(r.read().decode())
                return (metric(s, "rankwatch_step_diagnosis", training_job="demo-job",
                               diagnosis="compute_straggler") == 1 and
                        metric(s, "rankwatch_step_worst_rank", training_job="demo-job", phase="compute") == 17)
            wait_until(slow_rank_named, 30, "the demo's slow rank 17 to be diagnosed")

            os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
            demo.wait(20)
            self.assertIn("demo: stopped", output())
            for pid in pids:
                self.assertFalse(alive(pid), "process %d survived the demo" % pid)
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait()
            log.close()


if __name__ == "__main__":
    unittest.main()
