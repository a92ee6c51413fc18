"""The control channel from the collector's side (one process, a real `rankwatch kafka`):
requests produced on `rankwatch.control` by a client rankwatch did not write (confluent-kafka),
a real training loop with the `rankwatch` package answering them, and the answers read back
from the telemetry topic. A capture profiles exactly the requested steps with torch.profiler
and ships its operator events tagged with the request id, then DONE; malformed, oversized and
expired requests are refused and counted, and requests for other jobs or ranks are not
answered at all. A Flight Recorder request is answered from the collector's own thread: REFUSED
"unsupported" where torch has no dump function (Debian's torch 1.13), else the dump written to
the job's TORCH_NCCL_DEBUG_INFO_TEMP_FILE prefix (TORCH_FR_DUMP_TEMP_FILE where set) and DONE."""
import os
import time
import unittest
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from harness import Fleet, wait_until
from rankwatch.v1 import control_pb2, telemetry_pb2
from torch_job import torch_available

TELEMETRY = "rankwatch.telemetry"
CONTROL = "rankwatch.control"


def request(job, rid, ranks=(), steps=3, deadline_s=60.0):
    r = control_pb2.ControlRequest(id=rid, training_job=job, ranks=list(ranks),
                                   issued_unix_ns=time.time_ns(),
                                   deadline_unix_ns=time.time_ns() + int(deadline_s * 1e9),
                                   requested_by="test_control")
    r.capture.steps = steps
    return r.SerializeToString()


def fr_request(job, rid, deadline_s=60.0):
    r = control_pb2.ControlRequest(id=rid, training_job=job, issued_unix_ns=time.time_ns(),
                                   deadline_unix_ns=time.time_ns() + int(deadline_s * 1e9),
                                   requested_by="test_control")
    r.flight_recorder.SetInParent()
    return r.SerializeToString()


@unittest.skipUnless(torch_available(), "torch is not installed for this interpreter (scripts/venv.sh)")
class ControlChannelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fleet = Fleet()
        cls.brokers = cls.fleet.start_broker(partitions=1)
        cls.producer = Producer({"bootstrap.servers": cls.brokers})

    @classmethod
    def tearDownClass(cls):
        cls.fleet.close()

    def send(self, key, payload):
        self.producer.produce(CONTROL, key=key, value=payload)
        self.assertEqual(self.producer.flush(10), 0)

    def batches(self, job):
        """Every batch of `job` on the telemetry topic so far."""
        c = Consumer({"bootstrap.servers": self.brokers, "group.id": "test-control-" + uuid.uuid4().hex,
                      "enable.auto.commit": False})
        c.assign([TopicPartition(TELEMETRY, 0, 0)])
        _, high = c.get_watermark_offsets(TopicPartition(TELEMETRY, 0), timeout=10)
        out = []
        while high > 0:
            m = c.poll(5)
            if m is None:
                break
            if not m.error():
                b = telemetry_pb2.Batch()
                b.ParseFromString(m.value())
                if b.source.training_job == job:
                    out.append(b)
                if m.offset() + 1 >= high:
                    break
        c.close()
        return out

    def test_a_capture_profiles_the_requested_steps_and_refusals_are_counted(self):
        import rankwatch
        import torch
        import torch.nn as nn
        job = "control-" + uuid.uuid4().hex[:8]
        rw = rankwatch.init(job=job, brokers=self.brokers, rank=1, world_size=2, flush_interval_ms=100)
        self.addCleanup(rw.close)
        model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        rw.instrument_module(model)
        rw.instrument_optimizer(optimizer)
        x, y = torch.randn(64, 256), torch.randn(64, 8)
        wait_until(lambda: rw.stats()["control"]["reading"], 30, "the control listener reading")

        step = [0]

        def train(n):
            for _ in range(n):
                with rw.step():
                    loss = nn.functional.mse_loss(model(x), y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                step[0] += 1

        train(5)
        self.send(job, request(job, "cap-1", ranks=[1], steps=3))
        self.send(job, request(job, "other-rank", ranks=[0], steps=3))       # not answered
        self.send("another-job", request("another-job", "other-job", steps=3))  # not answered
        self.send(job, b"\xff\xff not a request")                          # malformed, no id
        self.send(job, b"\x0a" * (70 << 10))                               # oversized
        self.send(job, request(job, "late", deadline_s=-1))                # expired
        wait_until(lambda: rw.stats()["control"]["messages"] >= 6, 30, "six control messages read")
        train(10)
        rw.flush()

        stats = rw.stats()["control"]
        self.assertEqual(stats["accepted"], 1)
        self.assertEqual(stats["refused"]["malformed"], 1)
        self.assertEqual(stats["refused"]["oversized"], 1)
        self.assertEqual(stats["refused"]["expired"], 1)
        self.assertEqual(stats["captures_sent"], 1)

        batches = self.batches(job)
        replies = [r for b in batches for r in b.control_replies]
        states = {(r.request_id, r.state) for r in replies}
        self.assertIn(("cap-1", control_pb2.CONTROL_ACCEPTED), states)
        self.assertIn(("cap-1", control_pb2.CONTROL_DONE), states)
        self.assertIn(("late", control_pb2.CONTROL_REFUSED), states)
        self.assertFalse({rid for rid, _ in states} & {"other-rank", "other-job"})
        done = [r for r in replies if r.request_id == "cap-1" and r.state == control_pb2.CONTROL_DONE][0]
        self.assertEqual(done.steps, 3)
        self.assertGreaterEqual(done.first_step, 5)
        self.assertGreater(done.profiled_step_ns, 0)

        captured = [b for b in batches if b.trace.capture_id == "cap-1"]
        self.assertTrue(captured)
        names, steps, events = set(), set(), 0
        for b in captured:
            self.assertEqual(b.trace.source_format, "torch.profiler")
            for k in b.kernels:
                names.add(b.strings[k.name])
                steps.add(k.step)
                events += 1
        self.assertEqual(events, done.events)
        self.assertEqual(steps, {done.first_step, done.first_step + 1, done.first_step + 2})
        self.assertTrue(any(n in names for n in ("aten::addmm", "aten::mm", "aten::linear")), names)
        # The capture's events never mix with the live batches: DONE comes after the last one.
        last_capture = max(i for i, b in enumerate(batches) if b.trace.capture_id == "cap-1")
        done_at = min(i for i, b in enumerate(batches)
                      if any(r.request_id == "cap-1" and r.state == control_pb2.CONTROL_DONE
                             for r in b.control_replies))
        self.assertGreater(done_at, last_capture)
        # Every step was still recorded, the profiled ones included.
        self.assertEqual(rw.stats()["steps_recorded"], 15)


    def replies(self, job, rid):
        return [r for b in self.batches(job) for r in b.control_replies if r.request_id == rid]

    def final_reply(self, job, rid):
        """The last word (DONE, REFUSED, FAILED) of the collector on request `rid`."""
        final = (control_pb2.CONTROL_DONE, control_pb2.CONTROL_REFUSED, control_pb2.CONTROL_FAILED)
        found = []
        wait_until(lambda: (found.extend(r for r in self.replies(job, rid) if r.state in final)
                            or found), 30, "the answer to " + rid)
        return found[0]

    def test_a_flight_recorder_request_is_answered_without_a_step(self):
        import rankwatch
        import torch
        job = "control-fr-" + uuid.uuid4().hex[:8]
        prefix = os.path.join(self.fleet.workdir, job + "_nccl_trace_rank_")
        before = os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
        os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = prefix
        self.addCleanup(lambda: os.environ.pop("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") if before is None
                        else os.environ.__setitem__("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", before))
        rw = rankwatch.init(job=job, brokers=self.brokers, rank=1, world_size=2, flush_interval_ms=100)
        self.addCleanup(rw.close)
        wait_until(lambda: rw.stats()["control"]["reading"], 30, "the control listener reading")
        c10d = torch._C._distributed_c10d
        # No step runs: the training thread may be stuck, the request must not wait for it.
        if not any(hasattr(c10d, n) for n in ("_dump_fr_trace", "_dump_nccl_trace")):  # torch 1.13
            self.send(job, fr_request(job, "fr-unsupported"))
            r = self.final_reply(job, "fr-unsupported")
            self.assertEqual(r.state, control_pb2.CONTROL_REFUSED)
            self.assertTrue(r.reason.startswith("unsupported"), r.reason)
            self.assertIn(torch.__version__, r.reason)
            self.assertFalse(os.path.exists(prefix + "1"))
        # A torch that has it: its bytes become the rank's dump file, then DONE.
        dump = b"\x80\x02}q\x00(X\x07\x00\x00\x00versionq\x01X\x03\x00\x00\x002.9q\x02u."
        # (_dump_fr_trace, the one the collector prefers: torch 2.x, every backend.)
        original = getattr(c10d, "_dump_fr_trace", None)
        c10d._dump_fr_trace = lambda: dump
        self.addCleanup(lambda: delattr(c10d, "_dump_fr_trace") if original is None
                        else setattr(c10d, "_dump_fr_trace", original))
        self.send(job, fr_request(job, "fr-done"))
        r = self.final_reply(job, "fr-done")
        self.assertEqual(r.state, control_pb2.CONTROL_DONE, r.reason)
        with open(prefix + "1", "rb") as f:
            self.assertEqual(f.read(), dump)
        self.assertEqual([n for n in os.listdir(self.fleet.workdir) if n.endswith(".tmp")], [])
        states = [x.state for x in self.replies(job, "fr-done")]
        self.assertEqual(states[0], control_pb2.CONTROL_ACCEPTED)  # the listener's, first


if __name__ == "__main__":
    unittest.main()
