"""Process harness for rankwatch's end-to-end tests: real programs, real TCP on 127.0.0.1,
ports bound to 0 and discovered, every wait bounded in time.

Environment: RANKWATCH_BIN (folder with `rankwatch` and `rankwatchd`), PYTHONPATH including
the generated Python protobuf/gRPC modules (build/gen_py).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.request

BIN = os.environ.get("RANKWATCH_BIN", os.path.join(os.path.dirname(__file__), "../../build/bin"))

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """Prometheus text -> list of (name, {labels}, value)."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise ValueError("bad exposition line: %r" % line)
        labels = dict(_LABEL.findall(m.group(2) or ""))
        samples.append((m.group(1), labels, float(m.group(3))))
    return samples


def metric(samples, name, **labels):
    """Value of the one sample of `name` whose labels include `labels`, or None."""
    found = [v for n, l, v in samples if n == name and all(l.get(k) == w for k, w in labels.items())]
    if len(found) > 1:
        raise AssertionError("%s%s matches %d series" % (name, labels, len(found)))
    return found[0] if found else None


# Consumer-group settings that notice a killed or added instance within seconds (librdkafka's
# default session takes 45 s): for tests that start, kill and add daemons of one group. The
# development broker's rebalance after a member's session timed out waits the session less 1 s
# for the members to rejoin: a killed instance's partitions move on after about two sessions
# (11 s with the former 6-s session, 5 s with 3 s, rankwatchd's own default on that broker).
FAST_GROUP = "kafka:\n  session.timeout.ms: \"3000\"\n  heartbeat.interval.ms: \"500\"\n"


def fast_group_config(fleet):
    """Writes FAST_GROUP as a daemon config file in the fleet's workdir; returns its path."""
    path = os.path.join(fleet.workdir, "fast-group.yaml")
    with open(path, "w") as f:
        f.write(FAST_GROUP)
    return path


def wait_until(predicate, timeout, what, interval=0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError("timed out after %.0f s waiting for %s (last: %r)" % (timeout, what, last))


class Process:
    """A child process whose output goes to files in `workdir`."""

    def __init__(self, name, args, workdir, env=None):
        self.name = name
        self.stdout_path = os.path.join(workdir, name + ".out")
        self.stderr_path = os.path.join(workdir, name + ".err")
        self._out = open(self.stdout_path, "wb")
        self._err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._out, stderr=self._err,
                                     stdin=subprocess.DEVNULL, cwd=workdir, env=env)

    def stdout(self):
        with open(self.stdout_path, errors="replace") as f:
            return f.read()

    def stderr(self):
        with open(self.stderr_path, errors="replace") as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout=10):
        """Signals the process and returns (exit code, seconds it took to exit)."""
        if self.proc.poll() is not None:
            return self.proc.returncode, 0.0
        start = time.monotonic()
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        return code, time.monotonic() - start

    def close(self):
        self.stop(signal.SIGKILL if self.proc.poll() is None else signal.SIGTERM, timeout=5)
        self._out.close()
        self._err.close()


class Fleet:
    """A workdir plus the processes started in it; `close()` stops them all."""

    def __init__(self):
        self.workdir = tempfile.mkdtemp(prefix="rankwatch-e2e-")
        self.processes = []

    def start(self, name, args, env=None):
        p = Process("%s-%d" % (name, len(self.processes)), args, self.workdir, env=env)
        self.processes.append(p)
        return p

    def start_broker(self, partitions=6):
        p = self.start("kafka", [os.path.join(BIN, "rankwatch"), "kafka", "--partitions", str(partitions)])
        line = wait_until(lambda: p.stdout().split("\n")[0] if "\n" in p.stdout() else None, 15,
                          "the broker's bootstrap line")
        assert re.match(r"^127\.0\.0\.1:\d+", line), line
        return line

    def start_daemon(self, brokers=None, extra=(), state_dir=None, grpc_listen="127.0.0.1:0", env=None):
        state = state_dir or os.path.join(self.workdir, "state-%d" % len(self.processes))
        args = [os.path.join(BIN, "rankwatchd"), "--state-dir", state,
                "--metrics-listen", "127.0.0.1:0", "--grpc-listen", grpc_listen, "--ui-listen", "127.0.0.1:0"]
        if brokers:
            args += ["--brokers", brokers]
        p = self.start("rankwatchd", args + list(extra), env=env)
        endpoints_file = os.path.join(state, "endpoints.json")
        started = time.time()
        def endpoints_pid():
            with open(endpoints_file) as f:
                return json.load(f).get("pid")
        # A restart in the same state dir finds the previous endpoints file: wait for a new one.
        wait_until(lambda: (os.path.exists(endpoints_file) and os.path.getmtime(endpoints_file) >= started - 1
                            and endpoints_pid() == p.proc.pid)
                   or p.proc.poll() is not None, 20, "rankwatchd endpoints")
        if p.proc.poll() is not None:
            raise AssertionError("rankwatchd exited: " + p.stderr())
        with open(endpoints_file) as f:
            p.endpoints = json.load(f)
        p.state_dir = state
        # Ready when the consumer group has given this instance its partitions.
        wait_until(lambda: (metric(parse_metrics(scrape(p)), "rankwatch_kafka_assigned_partitions") or 0) > 0,
                   60, "rankwatchd to join the consumer group")
        return p

    def simulate(self, brokers, *args, timeout=120):
        cmd = [os.path.join(BIN, "rankwatch"), "simulate", "--brokers", brokers] + list(args)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise AssertionError("simulate failed (%d): %s" % (r.returncode, r.stderr))
        return json.loads(r.stdout.strip().splitlines()[-1])

    def close(self):
        for p in reversed(self.processes):
            p.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def scrape(daemon):
    with urllib.request.urlopen("http://%s/metrics" % daemon.endpoints["metrics"], timeout=5) as r:
        return r.read().decode()


class DaemonTestCase(unittest.TestCase):
    """A test class sharing one development broker and one rankwatchd (`cls.fleet`,
    `cls.brokers`, `cls.daemon`, and `cls.stub`, a gRPC client of it), stopped after its last
    test. `daemon_args`: extra rankwatchd arguments."""
    daemon_args = ()

    @classmethod
    def setUpClass(cls):
        import grpc  # the generated modules and grpc only where a test class needs them
        from rankwatch.v1 import service_pb2_grpc
        cls.fleet = Fleet()
        try:
            cls.brokers = cls.fleet.start_broker()
            cls.daemon = cls.fleet.start_daemon(cls.brokers, extra=cls.daemon_args)
        except BaseException:
            cls.fleet.close()
            raise
        cls.stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(cls.daemon.endpoints["grpc"]))

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()
