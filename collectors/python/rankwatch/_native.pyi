"""Types of rankwatch._native, the pybind11 extension built from collectors/python/native_module.cc
(the C++ collector library bound for this package). Written by hand: a binding added or changed
there is added or changed here too; scripts/check_python.sh checks the package against it."""
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NotRequired, TypedDict

VERSION: str
SCHEMA_VERSION: int
PHASE_DATALOADER: int
PHASE_FORWARD: int
PHASE_BACKWARD: int
PHASE_OPTIMIZER: int
PHASE_COLLECTIVE: int
PHASE_FORWARD_BACKWARD: int
# {"forward-compute": 1, "backward-compute": 2, ...}: the wire's OpType values by kebab name.
OP_TYPES: dict[str, int]

def now_ns() -> int:
    """Monotonic clock, ns: the clock of every *_ns argument."""

class ControlRequest(TypedDict):
    """An accepted control request (take_control_requests, wait_stack_requests)."""
    id: str
    action: str  # "capture", "stacks", "flight_recorder" or "unknown"
    ranks: list[int]
    deadline_unix_ns: int
    requested_by: str
    steps: NotRequired[int]  # capture
    cuda: NotRequired[bool]  # capture
    max_frames: NotRequired[int]  # stacks

# (name, category, ts_ns, dur_ns, stream, correlation, step[, tid])
KernelEvent = tuple[str, str, int, int, int, int, int] | tuple[str, str, int, int, int, int, int, int]
# (file, line, function)
StackFrame = tuple[str, int, str]
# (name, thread id, training, frames outermost first, frames omitted)
ThreadStack = tuple[str, int, bool, list[StackFrame], int]
# (group, group size, entered, completed)
CollectiveCount = tuple[str, int, int, int]

class ProcessPeakMemory:
    def __init__(self) -> None: ...
    def take_peak_bytes(self) -> int:
        """Peak RSS (bytes) since the previous call."""
    @property
    def resets(self) -> int: ...
    @property
    def status_reads(self) -> int: ...
    @property
    def capacity_bytes(self) -> int:
        """The process's memory capacity: its cgroup's limit, else MemTotal."""

class Collector:
    def __init__(
        self,
        training_job: str,
        rank: int,
        world_size: int,
        node: str,
        local_rank: int,
        pid: int,
        device: str,
        brokers: str,
        topic: str = ...,
        flush_interval_ms: int = ...,
        step_ring_capacity: int = ...,
        max_pending_bytes: int = ...,
        kafka_queue_max_messages: int = ...,
        kafka_queue_max_kbytes: int = ...,
        properties: Mapping[str, str] = ...,
        control_topic: str = ...,
        take_stacks: bool = ...,
        scheduler: Mapping[str, str] = ...,
        watch_gc: bool = ...,
        max_ops_per_step: int = ...,
        gc_op_min_ns: int = ...,
        max_message_bytes: int = ...,
        device_hold_ms: int = ...,
        device_hold_steps: int = ...,
    ) -> None: ...
    def begin_step(self, step: int, /) -> None: ...
    def end_step(self) -> None: ...
    def end_step_with_peak_rss(self, peak: ProcessPeakMemory) -> None: ...
    def add_phase(self, phase: int, begin_ns: int, end_ns: int, /) -> None: ...
    def add_op(self, type: int, microbatch: int, chunk: int, begin_ns: int, end_ns: int, /) -> int:
        """The op's index within its step (set_device_times names it so); -1: dropped."""
    def expect_device_times(self) -> None:
        """The open step's device times will follow (set_device_times): its record waits for them."""
    def set_device_times(
        self,
        step: int,
        phases: Sequence[tuple[int, int]],
        ops: Sequence[tuple[int, int, int]],
        missing: bool = ...,
    ) -> bool:
        """Step `step`'s device times: (phase, ns), (op index, begin ns, end ns) on now_ns()'s
        clock; False when no held step has that number (counted in device_times_late)."""
    def add_gc_pause(self, begin_ns: int, end_ns: int, /) -> None: ...
    def set_layout(
        self,
        *,
        data_rank: int = ...,
        data_size: int = ...,
        pipeline_rank: int = ...,
        pipeline_size: int = ...,
        tensor_rank: int = ...,
        tensor_size: int = ...,
        context_rank: int = ...,
        context_size: int = ...,
        expert_rank: int = ...,
        expert_size: int = ...,
        virtual_stages: int = ...,
    ) -> None:
        """ValueError when the layout does not fit the world size."""
    @property
    def layout(self) -> dict[str, int] | None: ...
    def set_training_strategy(self, training_strategy: str, sharded: bool = ...) -> None: ...
    @property
    def training_strategy(self) -> str: ...
    @property
    def sharded(self) -> bool: ...
    def record_memory(self, peak_allocated: int, peak_reserved: int = ..., capacity: int = ...) -> None: ...
    def record_collectives(self, entered: int) -> None: ...
    def record_kernels(self, events: Sequence[KernelEvent], /) -> None: ...
    def control_pending(self) -> bool: ...
    def take_control_requests(self) -> list[ControlRequest]: ...
    def wait_stack_requests(self, timeout_ms: int) -> list[ControlRequest]: ...
    def wake_stack_waiters(self) -> None: ...
    def reply_stacks(
        self,
        request_id: str,
        threads: Sequence[ThreadStack],
        collectives: Sequence[CollectiveCount],
        last_step: int,
        in_step: bool,
    ) -> None: ...
    def reply_control(
        self,
        request_id: str,
        state: str,
        reason: str = ...,
        first_step: int = ...,
        steps: int = ...,
        profiled_step_ns: int = ...,
    ) -> None: ...
    def send_capture(
        self,
        request_id: str,
        source_format: str,
        events: Sequence[KernelEvent],
        first_step: int,
        steps: int,
        profiled_step_ns: int,
    ) -> None: ...
    def flush(self, timeout_ms: int = ...) -> bool: ...
    def close(self, final: bool = ..., timeout_ms: int = ...) -> bool: ...
    def stats(self) -> dict[str, Any]: ...
    @property
    def memory_bound_bytes(self) -> int: ...
    @property
    def max_message_bytes(self) -> int:
        """The largest Kafka message produced (message.max.bytes in effect)."""
    @property
    def max_batch_bytes(self) -> int:
        """The serialized bytes one telemetry batch may have within it."""
    @property
    def max_reply_bytes(self) -> int:
        """The bytes one control reply may have (stacks replies are cut below it)."""

def gc_callback(collector: Collector) -> Callable[[str, Mapping[str, int]], None]:
    """A gc.callbacks entry: each collection is a GC pause of the collector's open step."""
