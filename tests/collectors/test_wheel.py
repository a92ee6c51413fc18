"""The wheel (build/dist/rankwatch-<version>-cp311-cp311-linux_x86_64.whl, CMake target
rankwatch_wheel) installs with pip into a new virtualenv made with `python3 -m venv
--system-site-packages` (Debian's Python, as the extension is built for) beside PyTorch of the
tests' version, imports from there — not from the build folder — declares its version and schema
version, and runs the example DDP job, which rankwatchd diagnoses. The wheel itself installs
offline (--no-index): it has no dependencies to fetch."""
import glob
import os
import subprocess
import time
import unittest

from harness import Fleet, metric, parse_metrics, scrape, wait_until
from torch_job import DIAGNOSED_JOB_ARGS, TorchJob, torch_available, torch_version

BUILD = os.path.dirname(os.environ.get("RANKWATCH_PYTHON_DIR", ""))
STEPS = 30


def wheels():
    return sorted(glob.glob(os.path.join(BUILD, "dist", "rankwatch-*-cp311-*.whl")))


@unittest.skipUnless(torch_available(), "torch is not installed for this interpreter (scripts/venv.sh)")
class WheelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fleet = Fleet()

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def test_the_wheel_installs_into_a_virtualenv_and_runs_the_example_job(self):
        found = wheels()
        self.assertEqual(len(found), 1, "build the rankwatch_wheel target first: %s" % found)
        venv = os.path.join(self.fleet.workdir, "venv")
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], check=True,
                       timeout=120)
        python = os.path.join(venv, "bin", "python")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANKWATCH_PYTHON_DIR")}
        # A user's environment: PyTorch of the version the tests use (pip takes the CPU wheel
        # from the machine's wheel folder), then rankwatch's wheel.
        torch_pin = "torch==" + (os.environ.get("RANKWATCH_TORCH_VERSION") or torch_version())
        started = time.monotonic()
        r = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", torch_pin],
                           capture_output=True, text=True, timeout=600, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        print("%s installed in %.0f s" % (torch_pin, time.monotonic() - started))
        r = subprocess.run([python, "-m", "pip", "install", "--no-index", "--no-deps", found[0]],
                           capture_output=True, text=True, timeout=300, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        print(r.stdout.strip().splitlines()[-1])
        r = subprocess.run([python, "-c", "import rankwatch, json; print(json.dumps([rankwatch.__file__, "
                            "rankwatch.__version__, rankwatch.SCHEMA_VERSION]))"],
                           capture_output=True, text=True, timeout=120, env=env, cwd=self.fleet.workdir)
        self.assertEqual(r.returncode, 0, r.stderr)
        path, version, schema = __import__("json").loads(r.stdout)
        self.assertTrue(path.startswith(venv), "imported from %s, not the virtualenv" % path)
        self.assertIn(version, os.path.basename(found[0]))
        self.assertEqual(schema, 1)
        # The example job, run by the virtualenv's interpreter with nothing on PYTHONPATH.
        brokers = self.fleet.start_broker()
        daemon = self.fleet.start_daemon(brokers)
        ranks = TorchJob(self.fleet.workdir, "wheel-job", brokers, STEPS, *DIAGNOSED_JOB_ARGS,
                         python=python).wait(timeout=240)
        self.assertEqual([r["steps"] for r in ranks], [STEPS] * 4)
        wait_until(lambda: metric(parse_metrics(scrape(daemon)), "rankwatch_steps_aligned_total",
                                  training_job="wheel-job") == STEPS, 60, "every step aligned")


if __name__ == "__main__":
    unittest.main()
