"""Reads a job's step records back from the telemetry topic (the raw facts the daemon
diagnoses) and summarises them per rank: mean step time, each phase, wait, own time."""
import statistics
import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from rankwatch.v1 import telemetry_pb2

TOPIC = "rankwatch.telemetry"
PHASES = ("dataloader", "forward", "backward", "optimizer", "collective")


def read_batches(brokers, job, timeout=30):
    """Every Batch of `job` on the topic now (keyed by job id), in partition order."""
    c = Consumer({"bootstrap.servers": brokers, "group.id": "step-records-" + uuid.uuid4().hex,
                  "enable.auto.commit": False, "log_level": 3})
    try:
        partitions = c.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1] for p in partitions}
        c.assign([TopicPartition(TOPIC, p, 0) for p in ends])
        done = {p for p, end in ends.items() if end == 0}
        batches = []
        deadline = time.monotonic() + timeout
        while len(done) < len(ends):
            if time.monotonic() > deadline:
                raise AssertionError("reading %s back from %s took over %d s" % (job, TOPIC, timeout))
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            if m.offset() + 1 >= ends[m.partition()]:
                done.add(m.partition())
            if m.key() == job.encode():
                b = telemetry_pb2.Batch()
                b.ParseFromString(m.value())
                batches.append(b)
        return batches
    finally:
        c.close()


def steps_by_rank(batches):
    """{rank: {step: StepRecord}}"""
    out = {}
    for b in batches:
        for s in b.steps:
            out.setdefault(b.source.rank, {})[s.step] = s
    return out


def summary(steps, skip=5):
    """{rank: {steps, step, <phase>, wait, own, outside}}: per-step means in ms over the steps
    after the first `skip`. own = step - collective; outside = own - dataloader - (forward +
    backward + optimizer - collective), the time outside every measured phase; wait = step -
    (dataloader + forward + backward + optimizer), the spec's WAIT proxy."""
    rows = {}
    for rank, by_step in sorted(steps.items()):
        records = [by_step[k] for k in sorted(by_step)][skip:]

        def mean_ms(f):
            return statistics.mean(f(r) for r in records) / 1e6
        row = {"steps": len(records), "step": mean_ms(lambda r: r.step_time_ns)}
        for p in PHASES:
            row[p] = mean_ms(lambda r, p=p: getattr(r, p + "_ns"))
        row["wait"] = mean_ms(lambda r: max(0, r.step_time_ns - sum(getattr(r, p + "_ns") for p in PHASES[:4])))
        row["own"] = row["step"] - row["collective"]
        row["outside"] = row["own"] - row["dataloader"] - (
            row["forward"] + row["backward"] + row["optimizer"] - row["collective"])
        rows[rank] = row
    return rows


def own_spread(rows):
    """(median own ms, worst rank, worst - median ms, (max / median - 1), (min / median - 1))"""
    owns = {rank: row["own"] for rank, row in rows.items()}
    median = statistics.median(owns.values())
    worst = max(owns, key=owns.get)
    return median, worst, owns[worst] - median, owns[worst] / median - 1, min(owns.values()) / median - 1


def format_summary(rows):
    cols = ("step", "dataloader", "forward", "backward", "optimizer", "collective", "wait", "own", "outside")
    lines = ["per-step means, ms", "rank " + " ".join("%10s" % c for c in cols)]
    for rank, row in rows.items():
        lines.append("%4d " % rank + " ".join("%10.2f" % row[c] for c in cols))
    median, worst, excess, high, low = own_spread(rows)
    lines.append("own time: median %.2f ms; rank %d +%.2f ms (%+.1f %%); lowest %+.1f %%" % (
        median, worst, excess, high * 100, low * 100))
    return "\n".join(lines)
