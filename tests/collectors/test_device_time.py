"""Device time (issue #48): phases and ops timed with events on the device's streams, read back
without waiting, and rankwatchd's diagnosis of jobs whose host time is not their device time.

DeviceTimerTest: rankwatch.device_clock.DeviceTimer on the emulated asynchronous device
(emulated_device.py, streams run by threads of their own): it never waits for the device, it
gives up steps whose events are late, and it places device op times on the host's clock.

AsyncDeviceJobTest: real 4-rank gloo jobs on the emulated device (async_device_job.py): a
compute straggler (+30 % kernel time on one rank) is named with its phase and its excess within
10 %, an input straggler is named as input, a balanced job names nobody; and the compute
straggler's own test, run on host time (device timing off), fails: the host sees only kernel
launches and one wait at loss.item(), the same on every rank. RANKWATCH_TEST_STEPS sets the
steps (60)."""
import os
import statistics
import threading
import time
import unittest

from emulated_device import Device
from harness import DaemonTestCase, metric, parse_metrics, scrape, wait_until
from rankwatch.device_clock import DeviceTimer
from rankwatch.v1 import service_pb2
from step_records import format_summary, read_batches, steps_by_rank, summary
from torch_job import TorchJob, torch_available

STEPS = int(os.environ.get("RANKWATCH_TEST_STEPS", "60"))
HERE = os.path.dirname(os.path.abspath(__file__))
JOB_SCRIPT = os.path.join(HERE, "async_device_job.py")
FORWARD_MS, BACKWARD_MS, OPTIMIZER_MS = 8.0, 16.0, 4.0
FACTOR = 1.3
# What the compute straggler adds a step: 30 % of its kernel time; its peers' all-reduce waits
# for all of it (the optimizer's share one step later).
COMPUTE_EXCESS_MS = (FACTOR - 1) * (FORWARD_MS + BACKWARD_MS + OPTIMIZER_MS)
INPUT_EXCESS_MS = 10.0


class DeviceTimerTest(unittest.TestCase):

    def setUp(self):
        self.device = Device()
        self.timer = DeviceTimer(self.device.clock(), steps_in_flight=2)

    def tearDown(self):
        self.device.close()

    def timed_phase(self, phase, kernel_ms):
        begin, t0 = self.timer.mark(), time.monotonic_ns()
        self.device.launch(kernel_ms)
        t1 = time.monotonic_ns()
        self.timer.phase(phase, begin, self.timer.mark(), t0)
        return (t1 - t0) / 1e6

    def test_poll_never_waits_and_returns_the_device_time(self):
        host_ms = self.timed_phase(1, 150)
        self.timer.end_step(7)
        t0 = time.monotonic()
        self.assertEqual(self.timer.poll(), [])
        self.assertLess(time.monotonic() - t0, 0.05)
        self.assertEqual(self.timer.in_flight, 1)
        self.device.synchronize()
        (step,) = self.timer.poll()
        self.assertEqual((step.step, step.missing, step.ops), (7, False, []))
        ((phase, ns),) = step.phases
        self.assertEqual(phase, 1)
        self.assertGreaterEqual(ns / 1e6, 149)
        self.assertLess(ns / 1e6, 200)
        self.assertLess(host_ms, 20)  # the host only queued it

    def test_steps_whose_events_are_late_are_given_up_in_order(self):
        gate = threading.Event()
        self.device.compute.submit(gate.wait)  # a hung kernel
        for step in range(4):
            self.timed_phase(2, 1)
            self.timer.end_step(step)
        given_up = self.timer.poll()
        self.assertEqual([(s.step, s.missing) for s in given_up], [(0, True), (1, True)])
        self.assertEqual(self.timer.in_flight, 2)
        gate.set()
        self.device.synchronize()
        self.assertEqual([(s.step, s.missing) for s in self.timer.poll()], [(2, False), (3, False)])
        self.assertEqual(self.timer.steps_missing, 2)

    def test_op_times_are_placed_on_the_host_clock(self):
        # An op on an idle device runs when queued; one queued behind 100 ms of kernels, 100 ms
        # later than the host queued it.
        b0, h0 = self.timer.mark(), time.monotonic_ns()
        self.device.launch(5)
        self.timer.op(0, b0, self.timer.mark(), h0)
        self.device.launch(100)
        b1, h1 = self.timer.mark(), time.monotonic_ns()
        self.device.launch(5)
        self.timer.op(1, b1, self.timer.mark(), h1)
        self.timer.end_step(0)
        self.device.synchronize()
        (step,) = self.timer.poll()
        ops = {index: (begin, end) for index, begin, end in step.ops}
        self.assertLess(abs(ops[0][0] - h0) / 1e6, 3)
        self.assertGreaterEqual((ops[0][1] - ops[0][0]) / 1e6, 4.5)
        self.assertGreater((ops[1][0] - h1) / 1e6, 90)
        self.assertLess((ops[1][0] - h1) / 1e6, 130)

    def test_an_event_ending_two_phases_is_reused_once(self):
        begin, end = self.timer.mark(), self.timer.mark()
        self.timer.phase(2, begin, end, 0)
        self.timer.phase(4, begin, end, 0)
        self.timer.end_step(0)
        self.device.synchronize()
        self.assertEqual(len(self.timer.poll()), 1)
        marks = [self.timer.mark(), self.timer.mark(), self.timer.mark()]
        self.assertEqual(len({id(m) for m in marks}), 3)
        self.assertEqual(self.timer.events, 3)  # two reused, one new


class DeviceTimingSettingTest(unittest.TestCase):
    """init()'s device_timing: on where the device has timing events, off on a CPU."""

    def init(self, **kwargs):
        import rankwatch
        rw = rankwatch.init(job="device-setting", brokers="127.0.0.1:9", rank=0, world_size=1, local_rank=0,
                            node="n", control_topic="", **kwargs)
        self.addCleanup(rw.close, False, 0)
        return rw

    def test_a_cpu_rank_has_no_device_clock_even_when_asked(self):
        from rankwatch.device_clock import clock_for
        self.assertIsNone(clock_for("cpu"))
        self.assertIsNone(self.init(device="cpu").device_clock)
        with self.assertLogs("rankwatch", "WARNING"):
            self.assertIsNone(self.init(device="cpu", device_timing=True).device_clock)

    def test_a_given_clock_is_used_and_anything_else_refused(self):
        device = Device()
        self.addCleanup(device.close)
        self.assertEqual(self.init(device="emulated:0", device_timing=device.clock()).device_clock.name, "emulated")
        self.assertIsNone(self.init(device="emulated:0", device_timing=False).device_clock)
        with self.assertRaises(TypeError):
            self.init(device="cpu", device_timing="yes")


@unittest.skipUnless(torch_available(), "torch is not installed for this interpreter (scripts/venv.sh)")
class AsyncDeviceJobTest(DaemonTestCase):

    def run_job(self, job, *args):
        """Runs the job; prints its per-rank facts and diagnosis; returns (diagnosis, rows)."""
        ranks = TorchJob(self.fleet.workdir, job, self.brokers, STEPS, "--forward-ms", str(FORWARD_MS),
                         "--backward-ms", str(BACKWARD_MS), "--optimizer-ms", str(OPTIMIZER_MS),
                         *args, script=JOB_SCRIPT).wait(timeout=240)
        for r in ranks:
            self.assertEqual(r["steps"], STEPS)
            self.assertEqual(r["collector"]["records_dropped"], 0, r["collector"])
        wait_until(lambda: metric(parse_metrics(scrape(self.daemon)), "rankwatch_steps_aligned_total",
                                  training_job=job) == STEPS, 60, "%s: every step aligned" % job)
        d = self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)
        batches = read_batches(self.brokers, job)
        by_rank = steps_by_rank(batches)
        clocks = {rank: statistics.multimode(s.clock for s in steps.values()) for rank, steps in by_rank.items()}
        rows = summary(by_rank)
        print("\n%s %s\nclock by rank %s\n%s" % (job, " ".join(args), clocks, format_summary(rows)))
        print("diagnosis: %s, culprit ranks %s, cause %s, culprit phase %s, excess %.2f ms, timing %s\nnote: %s" % (
            service_pb2.StepDiagnosisLabel.Name(d.step.label), list(d.step.culprit_ranks),
            service_pb2.StragglerCause.Name(d.step.cause), service_pb2.Phase.Name(d.step.culprit_phase),
            d.step.straggler.excess_seconds * 1e3, _timing(d), d.step.note))
        return d, rows

    def check_compute_straggler(self, d, rank):
        self.assertEqual(list(d.step.culprit_ranks), [rank], d.step.note)
        self.assertEqual(service_pb2.StragglerCause.Name(d.step.cause), "CAUSE_COMPUTE", d.step.note)
        self.assertIn(service_pb2.Phase.Name(d.step.culprit_phase), ("PHASE_FORWARD", "PHASE_BACKWARD"),
                      d.step.note)
        excess_ms = d.step.straggler.excess_seconds * 1e3
        self.assertLess(abs(excess_ms - COMPUTE_EXCESS_MS), 0.1 * COMPUTE_EXCESS_MS,
                        "excess %.2f ms, injected %.2f ms" % (excess_ms, COMPUTE_EXCESS_MS))

    def test_a_compute_straggler_is_named_with_its_phase_and_excess(self):
        d, _ = self.run_job("device-compute", "--fault-compute-rank", "1", "--fault-compute-factor", str(FACTOR))
        self.check_compute_straggler(d, 1)
        self.assertEqual(_timing(d), "device")

    def test_on_host_time_the_compute_straggler_is_missed(self):
        d, _ = self.run_job("device-compute-host", "--fault-compute-rank", "1", "--fault-compute-factor",
                            str(FACTOR), "--device-timing", "off")
        self.assertEqual(_timing(d), "host")
        with self.assertRaises(AssertionError):
            self.check_compute_straggler(d, 1)

    def test_an_input_straggler_is_named_as_input(self):
        d, _ = self.run_job("device-input", "--fault-input-rank", "2", "--fault-input-ms", str(INPUT_EXCESS_MS))
        self.assertEqual(list(d.step.culprit_ranks), [2], d.step.note)
        self.assertEqual(service_pb2.StragglerCause.Name(d.step.cause), "CAUSE_INPUT", d.step.note)
        self.assertEqual(_timing(d), "device")

    def test_a_balanced_job_names_nobody(self):
        d, _ = self.run_job("device-balanced")
        self.assertEqual(list(d.step.culprit_ranks), [], d.step.note)
        self.assertEqual(_timing(d), "device")


def _timing(d):
    """The diagnosis' clock ("host", "device", "mixed"), or "?" from a daemon without it."""
    timing = getattr(d.step, "timing", None)
    return timing.clock if timing is not None and timing.clock else "?"


if __name__ == "__main__":
    unittest.main()
