"""The Python face of the collector: init(), step, phase and op scopes, the rank's parallel
layout, GC pauses, and the helpers that instrument a PyTorch training loop (see
rankwatch/torch_hooks.py and rankwatch/layout.py)."""
from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Literal, TypeVar

from rankwatch import _native
from rankwatch import capture as _capture
from rankwatch import deepspeed as _deepspeed
from rankwatch import device_clock as _device_clock
from rankwatch import identity as _identity
from rankwatch import layout as _layout
from rankwatch import megatron as _megatron
from rankwatch import pipelining as _pipelining
from rankwatch import stacks as _stacks
from rankwatch import torch_hooks as _hooks

_T = TypeVar("_T")
# What the instrument_* helpers hand back: the object they were given (a torch.nn.Module, an
# optimizer), with its type.
_Instrumented = TypeVar("_Instrumented")
# The scopes step(), phase(), op() and pause() return: `with` blocks whose value is not used.
Scope = AbstractContextManager[object]

PHASES = {
    "dataloader": _native.PHASE_DATALOADER,
    "forward": _native.PHASE_FORWARD,
    "backward": _native.PHASE_BACKWARD,
    "optimizer": _native.PHASE_OPTIMIZER,
    "collective": _native.PHASE_COLLECTIVE,
    "forward_backward": _native.PHASE_FORWARD_BACKWARD,
}
# The kinds of op a step is made of (rw.op(name)), the wire's OpType in kebab case:
# "forward-compute", "backward-send", "grads-all-reduce", "optimizer", "gc", ...
OPS: dict[str, int] = dict(_native.OP_TYPES)
OP_NAMES: tuple[str, ...] = tuple(sorted(OPS, key=OPS.__getitem__))
now_ns = _native.now_ns
_get_ident = threading.get_ident

_current: Collector | None = None
_log = logging.getLogger("rankwatch")


class _Phase:
    __slots__ = ("_native", "_phase", "_t0")

    def __init__(self, native: _native.Collector, phase: int) -> None:
        self._native, self._phase = native, phase
        self._t0: int

    def __enter__(self) -> _Phase:
        self._t0 = now_ns()
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self._native.add_phase(self._phase, self._t0, now_ns())
        return False


class _Op:
    __slots__ = ("_native", "_type", "_microbatch", "_chunk", "_t0")

    def __init__(self, native: _native.Collector, op_type: int, microbatch: int, chunk: int) -> None:
        self._native, self._type, self._microbatch, self._chunk = native, op_type, microbatch, chunk
        self._t0: int

    def __enter__(self) -> _Op:
        self._t0 = now_ns()
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self._native.add_op(self._type, self._microbatch, self._chunk, self._t0, now_ns())
        return False


class _DevicePhase:
    """A phase timed on the host and, with events on the current stream, on the device."""
    __slots__ = ("_native", "_timer", "_phase", "_t0", "_e0")

    def __init__(self, native: _native.Collector, timer: _device_clock.DeviceTimer, phase: int) -> None:
        self._native, self._timer, self._phase = native, timer, phase
        self._t0: int
        self._e0: _device_clock.Event

    def __enter__(self) -> _DevicePhase:
        self._e0 = self._timer.mark()
        self._t0 = now_ns()
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        t1 = now_ns()
        e1 = self._timer.mark()
        self._native.add_phase(self._phase, self._t0, t1)
        self._timer.phase(self._phase, self._e0, e1, self._t0)
        return False


class _DeviceOp:
    """An op timed on the host and on the device."""
    __slots__ = ("_native", "_timer", "_type", "_microbatch", "_chunk", "_t0", "_e0")

    def __init__(self, native: _native.Collector, timer: _device_clock.DeviceTimer, op_type: int,
                 microbatch: int, chunk: int) -> None:
        self._native, self._timer, self._type = native, timer, op_type
        self._microbatch, self._chunk = microbatch, chunk
        self._t0: int
        self._e0: _device_clock.Event

    def __enter__(self) -> _DeviceOp:
        self._e0 = self._timer.mark()
        self._t0 = now_ns()
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        t1 = now_ns()
        e1 = self._timer.mark()
        index = self._native.add_op(self._type, self._microbatch, self._chunk, self._t0, t1)
        self._timer.op(index, self._e0, e1, self._t0)
        return False


# Work the host does itself, timed on the host even when the device clock is on.
_HOST_PHASES = frozenset((_native.PHASE_DATALOADER,))
_HOST_OPS = frozenset((OPS["data-loading"], OPS["gc"]))


def _op_type(name: str) -> int:
    try:
        return OPS[name]
    except KeyError:
        raise ValueError("rankwatch: unknown op %r; the ops are %s" % (name, ", ".join(OP_NAMES))) from None


class _Step:
    __slots__ = ("_collector", "_step")

    def __init__(self, collector: Collector, step: int) -> None:
        self._collector, self._step = collector, step

    def __enter__(self) -> _Step:
        c = self._collector
        # Control requests (captures) begin between steps: one native call when none waits.
        if c._native.control_pending() or c._captures.busy:
            c._captures.before_step(self._step)
        if c._layout_pending:
            c._detect_layout()  # Megatron initialised after init(), a DeviceMesh made after it
        c._native.begin_step(self._step)
        if c._timer is not None:
            c._native.expect_device_times()  # the record waits for them (device_clock.py)
        c._training_ident = _get_ident()  # the thread a stacks answer marks as training
        c._in_step = True
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        c = self._collector
        c._collectives.at_step_end()  # before the step ends: its record carries the count
        c._end_step()
        if c._timer is not None:
            c._timer.end_step(self._step)
            c._report_device_times(c._timer.poll())
        c._in_step = False
        if c._captures.busy:
            c._captures.after_step()
        return False


class _MemoryProbe:
    """Per-step memory peaks: torch.cuda on a GPU rank, else the process's peak RSS with the
    process's memory capacity (its cgroup's memory limit, else the host's MemTotal)."""

    _capacity: int
    _rss: _native.ProcessPeakMemory
    end_step: Callable[[], None]  # records the step's peaks and ends the step

    def __init__(self, native: _native.Collector, device: str) -> None:
        self._cuda: Any = None  # the torch.cuda module on a GPU rank
        if device.startswith("cuda"):
            import torch
            self._cuda = torch.cuda
            self._capacity = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            torch.cuda.reset_peak_memory_stats()

            def end_step() -> None:
                native.record_memory(*self.take())
                native.end_step()
            self.end_step = end_step
        else:
            self._rss = _native.ProcessPeakMemory()
            # One native call ends a CPU rank's step: peak RSS read, recorded, step ended.
            self.end_step = functools.partial(native.end_step_with_peak_rss, self._rss)

    def take(self) -> tuple[int, int, int]:
        """(peak_allocated, peak_reserved, capacity) since the previous call; 0 = unknown."""
        if self._cuda is not None:
            peaks = (self._cuda.max_memory_allocated(), self._cuda.max_memory_reserved(), self._capacity)
            self._cuda.reset_peak_memory_stats()
            return peaks
        return (self._rss.take_peak_bytes(), 0, self._rss.capacity_bytes)


class Collector:
    """One training rank's collector. Create it with rankwatch.init()."""

    def __init__(self, job: str, brokers: str, rank: int, world_size: int, local_rank: int,
                 node: str, device: str, memory: bool = True,
                 scheduler: Mapping[str, object] | None = None, layout: object = None,
                 watch_gc: bool = True, device_timing: object = None, **options: Any) -> None:
        self.job, self.rank, self.world_size = job, rank, world_size
        steps_in_flight = int(options.pop("device_steps_in_flight", 8))
        self.local_rank, self.node, self.device = local_rank, node, device
        # The scheduler's names (rankwatch.identity.scheduler()); sent with every batch.
        self.scheduler = {k: str(v) for k, v in (scheduler or {}).items() if v}
        given = _layout.resolve(layout) if layout is not None else None
        self._native = _native.Collector(job, rank, world_size, node, local_rank, os.getpid(), device,
                                         brokers, take_stacks=True, scheduler=self.scheduler,
                                         watch_gc=watch_gc, **options)
        if given is not None:
            try:
                self._native.set_layout(**given.as_dict())
            except ValueError:
                self._native.close(False, 0)
                raise
        self._memory = _MemoryProbe(self._native, device) if memory else None
        self._end_step = self._memory.end_step if self._memory is not None else self._native.end_step
        self._next_step = 0
        self._closed = False
        clock = _resolve_device_clock(device, device_timing)
        # Phases and ops timed on the device too (docs/collectors.md, "Device time"); None: host.
        self._timer = _device_clock.DeviceTimer(clock, steps_in_flight) if clock is not None else None
        self._device_times_refused = 0
        self._gate = _hooks.Gate()
        self._captures = _capture.CaptureRunner(self._native)
        self._attachments: list[_hooks.Attachment] = []
        self._collectives_timed = False
        self._training_ident = _get_ident()
        self._in_step = False
        self._collectives = _stacks.CollectiveCounters(self._native)
        self._stacks = _stacks.StackResponder(self._native, self)
        # Every collection is a GC pause of the open step (gc.callbacks), until close().
        self._gc = _hooks.watch_gc(self._native) if watch_gc else None
        self._attach(self._gc)
        self._layout_pending = False
        self.layout_source = "argument" if given is not None else ""  # or "megatron", "device_mesh"
        self._megatron_looks = 2  # at init() and at the first step
        self._mesh_watch = _layout.MeshWatch()
        if given is None:
            self._layout_pending = True
            self._detect_layout()
        self._on_close: list[Callable[[], None]] = []  # framework adapters' ends (open steps)
        self._megatron_ops: _megatron.MegatronOps | None = None
        _megatron.autoinstall(self)  # Megatron-core's timed ops, when the script imported it

    # --- scopes ---------------------------------------------------------------------------
    def step(self, step: int | None = None) -> Scope:
        """Context manager around one training iteration. Steps count from 0 unless given;
        paused steps are not counted."""
        if not self._gate.open:
            return _NULL_SCOPE
        if step is None:
            step = self._next_step
        self._next_step = step + 1
        return _Step(self, step)

    def phase(self, name: str) -> Scope:
        """Context manager adding the time inside to `name` (dataloader, forward, backward,
        optimizer, collective, forward_backward) of the open step (or the next one). Scopes of
        one name must not nest; use separate objects per thread (phase_timer). With a device
        clock (init's device_timing) every phase but the dataloader is also timed on the device,
        by events on the calling thread's current stream at both ends: put a collective's scope
        on the stream it runs on (or around the wait that joins it to yours)."""
        if not self._gate.open:
            return _NULL_SCOPE
        phase = PHASES[name]
        if self._timer is not None and phase not in _HOST_PHASES:
            return _DevicePhase(self._native, self._timer, phase)
        return _Phase(self._native, phase)

    phase_timer = phase  # a fresh scope object each call: safe to use from another thread

    def add_phase(self, name: str, begin_ns: int, end_ns: int) -> None:
        """Adds [begin_ns, end_ns) (rankwatch.collector.now_ns clock) to a phase: host time,
        even with a device clock (a device time has no host begin and end to give)."""
        if self._gate.open:
            self._native.add_phase(PHASES[name], begin_ns, end_ns)

    def op(self, name: str, microbatch: int = 0, chunk: int = 0) -> Scope:
        """Context manager timing one op of the open step (or the next one), for rankwatchd's
        what-if analysis of pipeline-parallel jobs: `with rw.op("forward-compute",
        microbatch=i):`. `name` is one of OP_NAMES (forward-compute, backward-compute,
        forward-send, forward-recv, backward-send, backward-recv, tensor-parallel,
        grads-reduce-scatter, params-all-gather, grads-all-reduce, layernorm-grads-all-reduce,
        embedding-grads-all-reduce, optimizer-clip-main-grad, optimizer, gc, data-loading);
        another is a ValueError. `chunk`: the model chunk of an interleaved schedule. Scopes may
        nest and overlap; at most 4,096 ops a step are kept. A fresh object each call: safe
        from any thread. With a device clock an op but data-loading and gc is also timed on the
        device, by events on the current stream."""
        op_type = _op_type(name)
        if not self._gate.open:
            return _NULL_SCOPE
        if self._timer is not None and op_type not in _HOST_OPS:
            return _DeviceOp(self._native, self._timer, op_type, microbatch, chunk)
        return _Op(self._native, op_type, microbatch, chunk)

    def add_op(self, name: str, begin_ns: int, end_ns: int, microbatch: int = 0, chunk: int = 0) -> None:
        """Adds op `name` over [begin_ns, end_ns) (rankwatch.collector.now_ns clock), as op(),
        in host time."""
        op_type = _op_type(name)
        if self._gate.open:
            self._native.add_op(op_type, microbatch, chunk, begin_ns, end_ns)

    # --- the parallel layout ----------------------------------------------------------------
    def set_layout(self, layout: object) -> None:
        """Where this rank sits in the job's parallel layout (a rankwatch.Layout, or a torch
        DeviceMesh with dims named dp / pp / tp / cp / ep): carried by every batch from now on.
        ValueError when its data x pipeline x tensor x context sizes are not the world size."""
        resolved = _layout.resolve(layout)
        self._native.set_layout(**resolved.as_dict())
        self._layout_pending = False
        self.layout_source = "argument"

    @property
    def layout(self) -> _layout.Layout | None:
        """The rank's layout (set_layout, init's layout=, Megatron's, or that of the DeviceMesh
        the script made), or None (flat data parallelism). layout_source says which:
        "argument", "megatron", "device_mesh", or ""."""
        d = self._native.layout
        return None if d is None else _layout.Layout(**d)

    def _detect_layout(self) -> None:
        """The layout nobody gave: Megatron-core's, when the script imported parallel_state and
        initialised model parallelism (looked for at init() and at the first step), else that
        of the DeviceMesh the script made (rankwatch.layout.MeshWatch: at init() and at every
        step boundary until found; a search only when a mesh may have appeared)."""
        if self._megatron_looks:
            self._megatron_looks -= 1
            if self._detect_megatron():
                self._layout_pending = False
                return
        for mesh, found in self._mesh_watch.look():
            if isinstance(found, ValueError):
                self._mesh_watch.rejected(mesh)
                _log.log(logging.INFO if getattr(mesh, "ndim", 0) == 1 else logging.WARNING,
                         "rankwatch: no parallel layout from %r: %s", mesh, found)
                continue
            try:
                self._native.set_layout(**found.as_dict())
            except ValueError as e:
                self._mesh_watch.rejected(mesh)
                _log.warning("rankwatch: the parallel layout of %r, %s, does not fit: %s", mesh, found, e)
                continue
            self._layout_pending = False
            self.layout_source = "device_mesh"
            _log.info("rankwatch: parallel layout from %r: %s", mesh, found)
            return
        self._layout_pending = self._megatron_looks > 0 or self._mesh_watch.scans < self._mesh_watch.MAX_SCANS

    def _detect_megatron(self) -> bool:
        try:
            found = _layout.Layout.from_megatron()
        except ValueError as e:  # a rank outside its size: Megatron's state is half made
            _log.warning("rankwatch: Megatron's parallel layout is not usable: %s", e)
            return False
        if found is None:
            return False
        try:
            self._native.set_layout(**found.as_dict())
        except ValueError as e:
            _log.warning("rankwatch: Megatron's parallel layout %s does not fit: %s", found, e)
            return False
        self.layout_source = "megatron"
        _log.info("rankwatch: parallel layout from Megatron-core: %s", found)
        return True

    # --- device time --------------------------------------------------------------------------
    @property
    def device_clock(self) -> _device_clock.DeviceClock | None:
        """The clock phases and ops are timed on besides the host's (init's device_timing), or
        None: host time only (a CPU rank, or device timing turned off)."""
        return self._timer.clock if self._timer is not None else None

    def _report_device_times(self, steps: list[_device_clock.DeviceStep]) -> None:
        for d in steps:
            if not self._native.set_device_times(d.step, d.phases, d.ops, d.missing):
                self._device_times_refused += 1  # the record went without them (its deadline)

    def record_memory(self, peak_allocated: int, peak_reserved: int = 0, capacity: int = 0) -> None:
        """Records the open step's memory peaks (bytes; 0 = unknown), replacing the probe's."""
        if self._gate.open:
            self._native.record_memory(int(peak_allocated), int(peak_reserved), int(capacity))

    def record_kernels(self, events: Iterable[_native.KernelEvent]) -> None:
        """events: iterable of (name, category, ts_ns, dur_ns, stream, correlation, step)."""
        if self._gate.open:
            self._native.record_kernels(list(events))

    # --- pausing --------------------------------------------------------------------------
    def pause(self) -> Scope:
        """Stops recording until resume(): the hooks come off the modules, optimizer.step is
        unwrapped, step() and phase() scopes do nothing and do not count steps (the next
        recorded step follows the last one). For evaluation loops, whose forward passes would
        otherwise count as training, and for overhead measurements. Returns a context manager
        that resumes, `with rw.pause(): evaluate(model)`, unless it was paused already (then
        the outer pause decides)."""
        if not self._gate.open:
            return _NULL_SCOPE
        self._gate.open = False
        for a in self._attachments:
            a.off()
        return _Resume(self)

    def resume(self) -> None:
        """Records again after pause()."""
        if self._gate.open:
            return
        self._gate.open = True
        for a in self._attachments:
            a.on()
        if self._memory is not None:
            self._memory.take()  # the peak since the last step is the paused stretch's, no step's

    @property
    def paused(self) -> bool:
        """Whether pause() is in effect."""
        return not self._gate.open

    def _attach(self, attachment: _hooks.Attachment | None) -> None:
        if attachment is not None:
            self._attachments.append(attachment)
            if not self._gate.open:
                attachment.off()

    # --- PyTorch helpers (rankwatch/torch_hooks.py) ---------------------------------------
    def dataloader(self, iterable: Iterable[_T]) -> Iterator[_T]:
        """Yields from `iterable`, timing each fetch as the next step's dataloader phase."""
        return _hooks.timed_iter(self._native, iterable, self._gate)

    def instrument_module(self, module: _Instrumented) -> _Instrumented:
        """Times `module`'s forward (hooks) and backward (from its output's gradient to the end
        of the backward pass, DDP's gradient synchronisation included). Returns `module`."""
        self._attach(_hooks.instrument_module(self._native, module, compute=True, timer=self._timer))
        return module

    def instrument_optimizer(self, optimizer: _Instrumented) -> _Instrumented:
        """Times optimizer.step(). Returns `optimizer`."""
        self._attach(_hooks.instrument_optimizer(self._native, optimizer, timer=self._timer))
        return optimizer

    def instrument_ddp(self, ddp_model: _Instrumented, process_group: Any = None,
                       comm_hook: bool = False) -> _Instrumented:
        """Times DDP's gradient synchronisation as the collective phase: the part of the
        backward pass spent waiting for the allreduce once the local gradients are computed,
        where waiting for slower ranks shows. Two autograd callbacks a step; DDP's own comm
        hook (or yours) stays in place. comm_hook=True instead registers a Python comm hook
        timing each bucket's allreduce (replacing any other; ~140 us a step). Tells rankwatchd
        the job trains with "ddp". Returns `ddp_model`."""
        self.set_training_strategy("ddp", sharded=False)
        if comm_hook:
            _hooks.register_timed_allreduce(self._native, ddp_model, self._gate, process_group)
        else:
            self._attach(_hooks.instrument_module(self._native, ddp_model, sync=True, timer=self._timer))
        return ddp_model

    def instrument_fsdp(self, fsdp_model: _Instrumented | None = None) -> _Instrumented | None:
        """For sharded data parallelism (FullyShardedDataParallel, or fully_shard): tells
        rankwatchd the job trains with "fsdp" and shards its parameters (so forward waits for
        other ranks too), and times as the collective phase the time this process is blocked
        in the all-gathers and reduce-scatters FSDP issues (torch.distributed's
        all_gather_single, reduce_scatter_single (FSDP1 and FSDP2 in torch 2.13), all_gather
        (FSDP1's all-gather of CPU parameters), all_gather_into_tensor,
        reduce_scatter_tensor and their older _base names, wrapped
        process-wide; an asynchronous call is timed in its handle's wait()). On GPUs with
        NCCL these calls return once the collective is queued on a stream, so the collective
        phase shows only what the host waited for. Combine with instrument_module(model) for
        forward and backward. Returns `fsdp_model`."""
        self.set_training_strategy("fsdp", sharded=True)
        if not self._collectives_timed:
            self._collectives_timed = True
            self._attach(_hooks.instrument_collectives(self._native, timer=self._timer))
        return fsdp_model

    def instrument_megatron(self, config: _Instrumented | None = None, grads_sync: str | None = None,
                            auto_steps: bool = True) -> _Instrumented | None:
        """Records the ops Megatron-core times through config.timers (its schedules, p2p
        communication, finalize_model_grads, optimizers) as this rank's ops, with their
        microbatches and model chunks, wrapping whatever timers the configs hold
        (rankwatch/megatron.py). Done by init() itself when the script imported megatron.core
        before it. config: a ModelParallelConfig / TransformerConfig / OptimizerConfig (default:
        megatron.core's classes); grads_sync: "grads-reduce-scatter" or "grads-all-reduce" for
        all-grads-sync (default: the model's DDP config says); auto_steps: a step per
        forward_backward_func call where the script opens none. Returns `config`."""
        _megatron.instrument(self, config, grads_sync=grads_sync, auto_steps=auto_steps)
        return config

    def instrument_deepspeed(self, engine: _Instrumented) -> _Instrumented:
        """Records each pipeline instruction a DeepSpeed PipelineEngine executes as its op
        (forward-compute, backward-send, ...) with its microbatch, a step per train_batch(), and
        the layout from the engine's grid (rankwatch/deepspeed.py). Returns `engine`."""
        _deepspeed.instrument(self, engine)
        return engine

    def instrument_pipeline(self, schedule: _Instrumented) -> _Instrumented:
        """Records the ops of a torch.distributed.pipelining schedule (Schedule1F1B,
        ScheduleInterleaved1F1B, the zero-bubble schedules, ...), or of a stage or list of stages,
        with no change to the training loop: forward-compute, backward-compute,
        backward-weight-compute (zero-bubble "W") with microbatch and model chunk, and the
        transfers between stages (forward/backward-send/recv), timed where the schedule posts
        and waits for them (rankwatch/pipelining.py). Without rw.step() in the loop, each
        schedule.step() call begins a step, which ends when the next begins (or at pause() or
        close()). Sets the layout the stages give (pipeline rank and size, virtual stages, data
        replica) where none was found. Returns `schedule`."""
        _pipelining.instrument(self, schedule)
        return schedule

    def set_training_strategy(self, training_strategy: str, sharded: bool = False) -> None:
        """How the job trains ("ddp", "fsdp", "deepspeed_zero3", ...) and whether parameters
        are sharded across ranks: carried by every batch from now on (instrument_ddp and
        instrument_fsdp call it)."""
        self._native.set_training_strategy(str(training_strategy), bool(sharded))

    @property
    def training_strategy(self) -> str:
        """The strategy set_training_strategy() set ("" until then)."""
        return self._native.training_strategy

    @property
    def sharded(self) -> bool:
        """Whether the job shards its parameters (set_training_strategy)."""
        return self._native.sharded

    # --- lifecycle --------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The library's counters (steps, records, drops, bytes, ...) and `threads_cpu_s`: CPU
        seconds used so far by the collector's threads (its sender and librdkafka's), from
        /proc/self/task; absent where /proc is not readable. messages_oversized: batches dropped
        because they would not fit a Kafka message of max_message_bytes (their records count in
        records_dropped); ops_oversized: ops left out of steps too large for one message (in
        ops_dropped too); producer_restarts: Kafka producers recreated after a fatal error."""
        d = self._native.stats()
        if self._timer is not None:
            t = self._timer
            d.update(device_clock=t.clock.name, device_events=t.events, device_steps_in_flight=t.in_flight,
                     device_steps_given_up=t.steps_missing)
        cpu = _threads_cpu_s(("rw:", "rdk:"))
        if cpu is not None:
            d["threads_cpu_s"] = cpu
        return d

    @property
    def max_message_bytes(self) -> int:
        """The largest Kafka message this collector produces (librdkafka's message.max.bytes in
        effect: init's max_message_bytes, $RANKWATCH_MAX_MESSAGE_BYTES, or 1,000,000)."""
        return self._native.max_message_bytes

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Waits up to `timeout_s` for what is buffered to be delivered; True when it was."""
        return self._native.flush(int(timeout_s * 1000))

    def close(self, final: bool = True, timeout_s: float = 10.0) -> bool:
        """Ships what is left; `final` tells rankwatchd this rank ended cleanly (not a hang)."""
        global _current
        if self._closed:
            return True
        self._closed = True
        for finish in self._on_close:
            finish()
        if _current is self:
            _current = None
        if self._timer is not None:
            self._report_device_times(self._timer.drain())
        self._captures.close()
        self._stacks.stop()
        if self._gc is not None:
            self._gc.off()
        return self._native.close(final, int(timeout_s * 1000))


class NullCollector(Collector):
    """Same interface, records nothing (rankwatch.init(enabled=False) or RANKWATCH_DISABLE=1)."""

    def __init__(self) -> None:  # pylint: disable=super-init-not-called
        self._next_step = 0

    def step(self, step: int | None = None) -> Scope:
        return _NULL_SCOPE

    def phase(self, name: str) -> Scope:
        return _NULL_SCOPE

    phase_timer = phase

    def add_phase(self, name: str, begin_ns: int, end_ns: int) -> None:
        pass

    def op(self, name: str, microbatch: int = 0, chunk: int = 0) -> Scope:
        _op_type(name)
        return _NULL_SCOPE

    def add_op(self, name: str, begin_ns: int, end_ns: int, microbatch: int = 0, chunk: int = 0) -> None:
        _op_type(name)

    def set_layout(self, layout: object) -> None:
        _layout.resolve(layout)

    layout = None
    layout_source = ""
    device_clock = None

    def record_memory(self, peak_allocated: int, peak_reserved: int = 0, capacity: int = 0) -> None:
        pass

    def record_kernels(self, events: Iterable[_native.KernelEvent]) -> None:
        pass

    def dataloader(self, iterable: Iterable[_T]) -> Iterator[_T]:
        return iter(iterable)

    def instrument_module(self, module: _Instrumented) -> _Instrumented:
        return module

    def instrument_optimizer(self, optimizer: _Instrumented) -> _Instrumented:
        return optimizer

    def instrument_ddp(self, ddp_model: _Instrumented, process_group: Any = None,
                       comm_hook: bool = False) -> _Instrumented:
        return ddp_model

    def instrument_fsdp(self, fsdp_model: _Instrumented | None = None) -> _Instrumented | None:
        return fsdp_model

    def instrument_megatron(self, config: _Instrumented | None = None, grads_sync: str | None = None,
                            auto_steps: bool = True) -> _Instrumented | None:
        return config

    def instrument_deepspeed(self, engine: _Instrumented) -> _Instrumented:
        return engine

    def instrument_pipeline(self, schedule: _Instrumented) -> _Instrumented:
        return schedule

    def set_training_strategy(self, training_strategy: str, sharded: bool = False) -> None:
        pass

    training_strategy, sharded = "", False

    def stats(self) -> dict[str, Any]:
        return {}

    max_message_bytes = 0

    def flush(self, timeout_s: float = 10.0) -> bool:
        return True

    def close(self, final: bool = True, timeout_s: float = 10.0) -> bool:
        return True

    def pause(self) -> Scope:
        return _NULL_SCOPE

    def resume(self) -> None:
        pass

    paused = False


def _resolve_device_clock(device: str, device_timing: object) -> _device_clock.DeviceClock | None:
    """init's device_timing: a DeviceClock (an emulated device's, an accelerator torch has no
    clock_for), True / False, or None: $RANKWATCH_DEVICE_TIMING (0 / 1), else on wherever the
    rank's device has timing events (CUDA, ROCm, torch.Event's accelerators)."""
    if isinstance(device_timing, _device_clock.DeviceClock):
        return device_timing
    if device_timing is None:
        env = os.environ.get("RANKWATCH_DEVICE_TIMING", "").strip().lower()
        if env in ("0", "false", "no", "off"):
            return None
        device_timing = env in ("1", "true", "yes", "on") or None
    if device_timing is False:
        return None
    if not isinstance(device_timing, bool) and device_timing is not None:
        raise TypeError("rankwatch.init: device_timing must be True, False, None or a "
                        "rankwatch.device_clock.DeviceClock, not %r" % (device_timing,))
    clock = _device_clock.clock_for(device)
    if clock is None and device_timing:
        _log.warning("rankwatch: device timing asked for, but %s has no timing events: host time only", device)
    return clock


def _threads_cpu_s(prefixes: tuple[str, ...]) -> float | None:
    """CPU seconds (user + system) of this process's threads whose names start with one of
    `prefixes`; None when /proc/self/task cannot be read."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    ticks = 0
    for tid in tids:
        try:
            with open("/proc/self/task/%s/stat" % tid) as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if name.startswith(prefixes):
            ticks += int(rest[11]) + int(rest[12])  # utime, stime (fields 14 and 15)
    return ticks / os.sysconf("SC_CLK_TCK")


class _Resume:
    __slots__ = ("_collector",)

    def __init__(self, collector: Collector) -> None:
        self._collector = collector

    def __enter__(self) -> _Resume:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self._collector.resume()
        return False


class _NullScope:
    def __enter__(self) -> _NullScope:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        return False


_NULL_SCOPE: Scope = _NullScope()


def init(job: str | None = None, brokers: str | None = None, rank: int | None = None,
         world_size: int | None = None, local_rank: int | None = None, node: str | None = None,
         device: str | None = None, enabled: bool | None = None, memory: bool = True,
         layout: object = None, watch_gc: bool | None = None, max_message_bytes: int | None = None,
         device_timing: object = None, **options: Any) -> Collector:
    """Creates this process's collector (and makes it rankwatch.get()).

    With no arguments it works under torchrun, Slurm and Kubernetes (Kubeflow's PyTorchJob):
    job: $RANKWATCH_JOB, else the scheduler's job ("<namespace>/<owner>" on Kubernetes,
    "slurm-<SLURM_JOB_ID>", "torchrun-<TORCHELASTIC_RUN_ID>"; see rankwatch.identity).
    brokers: Kafka bootstrap servers, $RANKWATCH_BROKERS, else the first line of
    $RANKWATCH_BROKERS_FILE (default /etc/rankwatch/brokers, e.g. a mounted ConfigMap).
    rank / world_size / local_rank: from torch.distributed when initialised, else the launcher's
    environment (RANK / WORLD_SIZE / LOCAL_RANK, SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID).
    node: NODE_NAME or SLURMD_NODENAME, else the host name. device: cuda:<current device> when
    CUDA is available, else cpu. What was picked is logged once (logger "rankwatch").
    layout: where the rank sits in a pipeline / tensor / data parallel layout, a rankwatch.Layout
    or a torch DeviceMesh with dims named dp, pp, tp, cp, ep; without it, Megatron-core's
    parallel_state when the script imported it and initialised model parallelism (at init() or
    by the first step), else the DeviceMesh the script made with init_device_mesh, before
    init() or later (looked for at each step boundary until found), else none (flat data
    parallelism).
    watch_gc: every garbage collection is a GC pause of its step (gc.callbacks; gc_ns, gc_count
    and, from 1 ms, an op); default True, or $RANKWATCH_WATCH_GC=0 turns it off.
    max_message_bytes: the largest Kafka message the collector produces (librdkafka's
    message.max.bytes): set it to your brokers' and topic's limit; default
    $RANKWATCH_MAX_MESSAGE_BYTES, else 1,000,000 (Kafka's default), at least 16384. Batches,
    captures included, are cut below it; a step whose ops alone would not fit goes without them
    (stats()["ops_oversized"]), and what still does not fit is dropped and counted
    (stats()["messages_oversized"]), never retried.
    device_timing: time phases and ops on the device as well as on the host, with events
    recorded on the streams the work runs on and read back a step or more later, never waiting
    (docs/collectors.md, "Device time"): None (default) turns it on where the rank's device has
    timing events (CUDA, ROCm, torch.Event's accelerators), off on a CPU rank, unless
    $RANKWATCH_DEVICE_TIMING=0 or 1 says otherwise; True / False; or a
    rankwatch.device_clock.DeviceClock making the events. Option device_steps_in_flight (8): a
    step whose events have not completed when that many more steps have ended goes with host
    times (STEP_CLOCK_DEVICE_MISSING); device_hold_ms (10,000): the longest a step record waits
    for its device times.
    enabled: False (or $RANKWATCH_DISABLE=1) returns a NullCollector. options: collector
    buffer settings (flush_interval_ms=1000, sooner when kernel events half fill their buffer;
    step_ring_capacity=4096,
    max_pending_bytes=4 MiB, kafka_queue_max_messages=4 (at most 5), kafka_queue_max_kbytes=4096,
    properties={librdkafka property: value}, max_ops_per_step=4096, gc_op_min_ns=1 ms: shorter
    GC pauses count in gc_ns / gc_count without an op of their own). Never waits for Kafka.
    """
    global _current
    if enabled is None:
        enabled = os.environ.get("RANKWATCH_DISABLE", "") not in ("1", "true", "yes")
    if not enabled:
        _current = NullCollector()
        return _current
    sched = _identity.scheduler()
    job_from = "argument" if job else "$RANKWATCH_JOB" if os.environ.get("RANKWATCH_JOB") else sched["scheduler"]
    job = job or os.environ.get("RANKWATCH_JOB") or sched["job"]
    brokers, brokers_from = (brokers, "argument") if brokers else _default_brokers()
    if not job:
        raise ValueError("rankwatch.init: no training job id: pass job=, set $RANKWATCH_JOB, or run under "
                         "torchrun with --rdzv-id, Slurm or Kubernetes (POD_NAME, POD_NAMESPACE)")
    if not brokers:
        raise ValueError("rankwatch.init: no Kafka brokers: pass brokers=, set $RANKWATCH_BROKERS, or write "
                         "them to %s" % _brokers_file())
    who = _identity.detect(rank, world_size, local_rank, node, device)
    _log_picked("rankwatch: job %r (from %s), rank %d of %d (local %d) on %s, %s, brokers %s (from %s)%s" % (
        job, job_from, who["rank"], who["world_size"], who["local_rank"], who["node"], who["device"],
        brokers, brokers_from,
        "" if not sched["scheduler"] else ", scheduler %s%s%s" % (
            sched["scheduler"], " job " + sched["scheduler_job"] if sched["scheduler_job"] else "",
            " pod %s/%s" % (sched["namespace"], sched["pod"]) if sched["pod"] else "")))
    if watch_gc is None:
        watch_gc = os.environ.get("RANKWATCH_WATCH_GC", "1").lower() not in ("0", "false", "no")
    if max_message_bytes is None:
        max_message_bytes = _max_message_bytes_from_env()
    if max_message_bytes is not None:
        options["max_message_bytes"] = max_message_bytes
    if _current is not None:
        _current.close(final=False)
    _current = Collector(job, brokers, memory=memory, scheduler=sched, layout=layout, watch_gc=watch_gc,
                         device_timing=device_timing, **who, **options)
    return _current


def _log_picked(line: str) -> None:
    """Logs what init() picked, once a process: to the "rankwatch" logger at INFO, or to stderr
    when the application configured no logging at all (so it shows in a torchrun job's output)."""
    global _logged_identity
    if _logged_identity:
        return
    _logged_identity = True
    if logging.getLogger().hasHandlers() or _log.handlers:
        _log.info(line)
    else:
        sys.stderr.write(line + "\n")  # one write: ranks sharing a terminal do not interleave
        sys.stderr.flush()


_logged_identity = False


def _max_message_bytes_from_env() -> int | None:
    """$RANKWATCH_MAX_MESSAGE_BYTES as an int, or None when unset or empty (the library's default,
    1,000,000); a ValueError naming the variable when it is not a number."""
    value = os.environ.get("RANKWATCH_MAX_MESSAGE_BYTES", "").strip()
    if not value:
        return None
    try:
        return int(value.replace("_", ""))
    except ValueError:
        raise ValueError("rankwatch.init: $RANKWATCH_MAX_MESSAGE_BYTES=%r is not a number of bytes" % value) from None


def _brokers_file() -> str:
    return os.environ.get("RANKWATCH_BROKERS_FILE", "/etc/rankwatch/brokers")


def _default_brokers() -> tuple[str, str]:
    """($RANKWATCH_BROKERS or the brokers file's first line, where it came from), or ("", "")."""
    if os.environ.get("RANKWATCH_BROKERS"):
        return os.environ["RANKWATCH_BROKERS"], "$RANKWATCH_BROKERS"
    path = _brokers_file()
    try:
        with open(path) as f:
            line = f.readline().strip()
        if line:
            return line, path
    except OSError:
        pass
    return "", ""


def get() -> Collector | None:
    """The collector made by the last init(), or None."""
    return _current


def _sleep_s(seconds: float) -> None:  # for tests: a clock-independent pause
    time.sleep(seconds)
