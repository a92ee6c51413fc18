"""rankwatch: per-step telemetry of a training rank for rankwatchd.

    import rankwatch
    rw = rankwatch.init(job="resnet-42", brokers="kafka:9092")
    model = rw.instrument_module(model)           # forward / backward timing (hooks)
    rw.instrument_optimizer(optimizer)            # optimizer.step timing
    rw.instrument_ddp(ddp_model)                  # gradient synchronisation (collective)
    # or, sharded: rw.instrument_fsdp(fsdp_model) # all-gathers and reduce-scatters (collective)
    for batch in rw.dataloader(loader):           # dataloader fetch timing
        with rw.step():
            ...
    with rw.pause():                              # evaluation: nothing recorded, hooks off
        evaluate(model)
    rw.close()                                     # tells rankwatchd the rank ended cleanly

Pipeline-parallel jobs also say where each rank sits and time the ops of each step, for
rankwatchd's what-if analysis (docs/whatif.md):

    rw = rankwatch.init(layout=rankwatch.Layout(data_rank=d, data_size=2, pipeline_rank=s,
                                                pipeline_size=4))   # or a DeviceMesh; else found
    with rw.step():
        for i, x in enumerate(microbatches):
            with rw.op("forward-recv", microbatch=i): ...
            with rw.op("forward-compute", microbatch=i): ...
            ...

Garbage collections are GC pauses of their step in every job (gc.callbacks; init(watch_gc=False)
or $RANKWATCH_WATCH_GC=0 turns that off).

Recording is a few atomic operations in the C++ library (rankwatch._native); a background
thread batches, compresses and publishes to Kafka. When Kafka is slow or down the oldest
telemetry is dropped and counted, never the training step delayed.

Memory peaks per step: from torch.cuda (max_memory_allocated / max_memory_reserved and the
device's total memory, peaks reset every step) when the rank uses a GPU; otherwise the
process's peak resident set size (the kernel's high-water mark, reset every step through
/proc/self/clear_refs; where that is not permitted, the lifetime peak), reported as
`peak_allocated` with the process's memory capacity: its cgroup's memory limit (cgroup v2
memory.max, v1 memory.limit_in_bytes), else the host's MemTotal. The peak is read with
getrusage (under 1 us) where that can be told apart from the floor exec leaves in it, else
from /proc/self/status (3-16 us; every step of a process started by a bigger one; see
collectors/lib/process_memory.h).
"""
# Let rankwatch.v1 (the generated protobuf modules, e.g. build/gen_py) live beside this package.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

from rankwatch import _native
from rankwatch.collector import OP_NAMES, Collector, NullCollector, init, get
from rankwatch.layout import Layout

__version__ = _native.VERSION
# The telemetry schema's major version this package writes (Batch.schema_version): rankwatchd
# accepts batches of its own version and older.
SCHEMA_VERSION = _native.SCHEMA_VERSION

__all__ = ["Collector", "NullCollector", "Layout", "OP_NAMES", "init", "get", "__version__",
           "SCHEMA_VERSION"]
