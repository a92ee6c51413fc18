"""rankwatchd's settings at start: a bad value of any setting, by flag or in the config file, is
one line naming the setting and exit code 2, before the daemon binds a port or writes a file
(issue #33); the flag table of docs/operating.md is what the binary declares."""
import os
import shutil
import socket
import subprocess
import tempfile
import unittest

from harness import BIN

DAEMON = os.path.join(BIN, "rankwatchd")
DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../docs/operating.md")


class BadSettingsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="rankwatch-settings-")
        self.state = os.path.join(self.tmp, "state")
        # The metrics port is held open: a daemon that got as far as binding it would fail with
        # exit code 1, not 2.
        self.held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.held.bind(("127.0.0.1", 0))
        self.held.listen(1)
        self.metrics = "127.0.0.1:%d" % self.held.getsockname()[1]

    def tearDown(self):
        self.held.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start(self, args, config=None):
        cmd = [DAEMON, "--state-dir", self.state, "--metrics-listen", self.metrics,
               "--grpc-listen", "127.0.0.1:0", "--ui-listen", "127.0.0.1:0"]
        if config is not None:
            path = os.path.join(self.tmp, "rankwatchd.yaml")
            with open(path, "w") as f:
                f.write(config)
            cmd += ["--config", path]
        return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)

    def assert_refused(self, r, name):
        lines = r.stderr.strip().splitlines()
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn(name, lines[0])
        # Nothing was written: no state directory (its lock, the embedded broker's bootstrap
        # file, endpoints.json).
        self.assertFalse(os.path.exists(self.state), os.listdir(self.tmp))

    def test_a_bad_flag_value_is_refused_before_anything_starts(self):
        cases = [
            (["--capture-steps", "500"], "--capture-steps"),
            (["--session-timeout", "100ms"], "--session-timeout"),
            (["--log-level", "loud"], "--log-level"),
            (["--embedded-partitions", "0"], "--embedded-partitions"),
            (["--ui-listen", "127.0.0.1:99999"], "--ui-listen"),
            (["--grpc-tls-cert", "/nonexistent/cert.pem", "--grpc-tls-key", "/nonexistent/key.pem"],
             "--grpc-tls-cert"),
            (["--window-steps", "many"], "--window-steps"),
            (["--alertmanager", "http://admin:pw@am:9093"], "--alertmanager"),
            (["--action", "hang:critical=restart"], "--action"),
        ]
        for args, name in cases:
            with self.subTest(args=args):
                self.assert_refused(self.start(args), name)

    def test_a_bad_config_file_value_is_refused_before_anything_starts(self):
        path = os.path.join(self.tmp, "rankwatchd.yaml")
        cases = [
            ("memory-diagnosis:\n  window-steps: 0\n", "config %s: key 'memory-diagnosis.window-steps'" % path),
            ("capture-deadline: 2h\n", "config %s: key 'capture-deadline'" % path),
            ("step-diagnosis:\n  node-fraction: 2\n", "config %s: key 'step-diagnosis.node-fraction'" % path),
            ("alert-subscriber-queue: 0\n", "config %s: key 'alert-subscriber-queue'" % path),
            ("grpc-tls-cert: /dev/null\n", "grpc-tls-key"),  # checked once the file and flags are read
            ("action:\n  - hang=webhook\n", "action-webhook"),  # a webhook action, no webhook
        ]
        for config, name in cases:
            with self.subTest(config=config):
                self.assert_refused(self.start([], config=config), name)

    def test_good_settings_get_as_far_as_the_held_port(self):
        # The control: the same start with good values binds, fails on the held port with exit
        # code 1, and has created the state directory by then.
        r = self.start(["--capture-steps", "50"], config="memory-diagnosis:\n  window-steps: 10\n")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertTrue(os.path.isdir(self.state))
        self.assertFalse(os.path.exists(os.path.join(self.state, "endpoints.json")))


class FlagTableTest(unittest.TestCase):
    def test_the_operating_guide_shows_the_binarys_settings(self):
        r = subprocess.run([DAEMON, "--help-markdown"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(DOCS) as f:
            doc = f.read()
        begin = doc.index("<!-- settings table: begin")
        begin = doc.index("\n", begin) + 1
        end = doc.index("<!-- settings table: end -->")
        self.assertEqual(doc[begin:end], r.stdout,
                         "docs/operating.md differs from `rankwatchd --help-markdown`")
        for flag in ("--capture-steps", "--session-timeout", "`window-steps`"):
            self.assertIn(flag, doc[begin:end])


if __name__ == "__main__":
    unittest.main()
