"""PyTorch instrumentation on top of the native collector: dataloader fetches, a module's
forward and backward, optimizer.step, DDP's gradient synchronisation, the all-gathers and
reduce-scatters of sharded data parallelism (FSDP), and Python's garbage collections. Tested
with torch 2.13 (tests/requirements.txt); the hooks are long-standing APIs of torch 2.x.

Where a helper knows which op of the step it times, it records that op too (the what-if
analysis's vocabulary, rw.op): a dataloader fetch is a data-loading op, optimizer.step an
optimizer op, a bucket's allreduce in the timed comm hook a grads-all-reduce op.

The torch objects (modules, optimizers, process groups, tensors) are typed Any: torch is imported
only inside the functions that need it, and the package does not depend on its type stubs."""
from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any, TypeVar

from rankwatch import _native
from rankwatch.device_clock import DeviceTimer

_T = TypeVar("_T")

now_ns = _native.now_ns
_FORWARD, _BACKWARD = _native.PHASE_FORWARD, _native.PHASE_BACKWARD
_OPTIMIZER, _COLLECTIVE = _native.PHASE_OPTIMIZER, _native.PHASE_COLLECTIVE
_DATALOADER = _native.PHASE_DATALOADER
_OP_DATA_LOADING = _native.OP_TYPES["data-loading"]
_OP_OPTIMIZER = _native.OP_TYPES["optimizer"]
_OP_GRADS_ALL_REDUCE = _native.OP_TYPES["grads-all-reduce"]


class Gate:
    """Whether the collector records (Collector.pause / resume); the dataloader wrapper reads
    it on every fetch. Hooks are removed while paused, not gated."""
    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open = True


class Attachment:
    """Instrumentation that pause() takes off and resume() puts back: `attach()` installs it
    and returns the function that removes it."""

    def __init__(self, attach: Callable[[], Callable[[], object]]) -> None:
        self._attach = attach
        self._detach: Callable[[], object] | None = None

    def on(self) -> None:
        if self._detach is None:
            self._detach = self._attach()

    def off(self) -> None:
        if self._detach is not None:
            self._detach()
            self._detach = None


def timed_iter(native: _native.Collector, iterable: Iterable[_T], gate: Gate) -> Iterator[_T]:
    """Yields from `iterable`, adding the time of each fetch to the dataloader phase (and a
    data-loading op) while `gate` is open."""
    it = iter(iterable)
    while True:
        if not gate.open:
            try:
                item = next(it)
            except StopIteration:
                return
            yield item
            continue
        t0 = now_ns()
        try:
            item = next(it)
        except StopIteration:
            return
        t1 = now_ns()
        native.add_phase(_DATALOADER, t0, t1)
        native.add_op(_OP_DATA_LOADING, 0, 0, t0, t1)
        yield item


def _first_grad_tensor(output: Any, tensor_type: type[Any]) -> Any:
    """The first tensor in `output` (nested lists, tuples, dicts) that requires a gradient, or
    None."""
    if isinstance(output, tensor_type):
        return output if output.requires_grad else None
    if isinstance(output, (list, tuple)):
        for o in output:
            t = _first_grad_tensor(o, tensor_type)
            if t is not None:
                return t
    if isinstance(output, dict):
        for o in output.values():
            t = _first_grad_tensor(o, tensor_type)
            if t is not None:
                return t
    return None


def instrument_module(native: _native.Collector, module: Any, compute: bool = False,
                      sync: bool = False, timer: DeviceTimer | None = None) -> Attachment | None:
    """Hooks `module` once; later calls only add what they ask for. Returns the Attachment of
    its hooks the first time, None after.

    compute: forward (pre-hook to hook) and backward, from the moment the output's gradient
    arrives until the end of the whole backward pass, DDP's gradient synchronisation included
    (as a plain loop timing loss.backward()).
    sync: the collective phase, the part of backward spent waiting for the gradient allreduce
    after the local backward computation ended (the exposed synchronisation, where waiting for
    slower ranks shows).

    Both ends are autograd-engine final callbacks queued when the output's gradient arrives:
    the first runs when the backward graph has been computed, before DDP's own (which waits
    for the allreduce); it queues the second, which runs after DDP's. No comm hook and no
    per-parameter hook is needed: two Python callbacks per step.

    timer: a device clock's (device_clock.DeviceTimer): each end also records an event on the
    current stream, so that forward, backward and the synchronisation are timed on the device
    too (the autograd engine runs a GPU's backward on its own thread, on the forward's stream;
    DDP's wait for its allreduce makes that stream wait, so the sync's device time is the
    stream's wait for its peers)."""
    from torch import Tensor
    from torch.autograd import Variable
    hooked: dict[str, int] | None = getattr(module, "_rankwatch_hooks", None)
    if hooked is not None:
        hooked["compute"] = hooked["compute"] or compute
        hooked["sync"] = hooked["sync"] or sync
        return None
    state: dict[str, int] = {"t0": 0, "compute": compute, "sync": sync}
    module._rankwatch_hooks = state
    queue_callback, add_phase = Variable._execution_engine.queue_callback, native.add_phase
    mark = timer.mark if timer is not None else None
    forward_event: list[Any] = [None]  # the forward's begin event (device time)

    def pre_hook(mod: Any, inputs: Any) -> None:
        if mark is not None:
            forward_event[0] = mark()
        state["t0"] = now_ns()

    def hook(mod: Any, inputs: Any, output: Any) -> None:
        t1 = now_ns()
        if state["compute"]:
            add_phase(_FORWARD, state["t0"], t1)
            if timer is not None:
                timer.phase(_FORWARD, forward_event[0], timer.mark(), state["t0"])
        tensor = _first_grad_tensor(output, Tensor)
        if tensor is None:
            return None

        def grad_hook(grad: Any) -> None:
            b0 = now_ns()
            begin = mark() if mark is not None else None
            computed: list[Any] = [0, None]

            def end_backward() -> None:
                t = now_ns()
                end = mark() if mark is not None else None
                if state["compute"]:
                    add_phase(_BACKWARD, b0, t)
                    if timer is not None:
                        timer.phase(_BACKWARD, begin, end, b0)
                if state["sync"]:
                    add_phase(_COLLECTIVE, computed[0], t)
                    if timer is not None:
                        timer.phase(_COLLECTIVE, computed[1], end, computed[0])

            def graph_computed() -> None:
                computed[0] = now_ns()
                if mark is not None and state["sync"]:
                    computed[1] = mark()
                queue_callback(end_backward)

            queue_callback(graph_computed)
            return None

        tensor.register_hook(grad_hook)
        return None

    def attach() -> Callable[[], object]:
        handles = (module.register_forward_pre_hook(pre_hook), module.register_forward_hook(hook))
        return lambda: [h.remove() for h in handles]

    hooks = Attachment(attach)
    hooks.on()
    return hooks


def instrument_optimizer(native: _native.Collector, optimizer: Any,
                         timer: DeviceTimer | None = None) -> Attachment | None:
    """Wraps optimizer.step (an instance attribute over the class's) once: the optimizer phase
    and an optimizer op, on the device too with a `timer`. Returns its Attachment the first
    time, None after."""
    if getattr(optimizer, "_rankwatch_timed", False):
        return None
    optimizer._rankwatch_timed = True
    step = optimizer.step
    before = optimizer.__dict__.get("step")

    def host_timed_step(*args: Any, **kwargs: Any) -> Any:
        t0 = now_ns()
        try:
            return step(*args, **kwargs)
        finally:
            t1 = now_ns()
            native.add_phase(_OPTIMIZER, t0, t1)
            native.add_op(_OP_OPTIMIZER, 0, 0, t0, t1)

    def device_timed_step(*args: Any, **kwargs: Any) -> Any:
        assert timer is not None
        begin = timer.mark()
        t0 = now_ns()
        try:
            return step(*args, **kwargs)
        finally:
            t1 = now_ns()
            end = timer.mark()
            native.add_phase(_OPTIMIZER, t0, t1)
            timer.phase(_OPTIMIZER, begin, end, t0)
            timer.op(native.add_op(_OP_OPTIMIZER, 0, 0, t0, t1), begin, end, t0)

    timed_step = host_timed_step if timer is None else device_timed_step

    def attach() -> Callable[[], None]:
        optimizer.step = timed_step

        def detach() -> None:
            if before is None:
                del optimizer.step
            else:
                optimizer.step = before
        return detach

    wrapper = Attachment(attach)
    wrapper.on()
    return wrapper


def register_timed_allreduce(native: _native.Collector, ddp_model: Any, gate: Gate,
                             process_group: Any = None) -> None:
    """A DDP comm hook (allreduce, averaging) timing each bucket's allreduce, waiting included:
    the collective phase and a grads-all-reduce op per bucket. Costs ~140 us a step (the hook
    and its completion callback run in Python). DDP cannot unregister a comm hook: while `gate`
    is closed it still averages, without timing."""
    import torch.distributed as dist

    def timed_allreduce(group: Any, bucket: Any) -> Any:
        t0 = now_ns()
        world = dist.get_world_size(group)
        tensor = bucket.buffer().div_(world)
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def done(f: Any) -> Any:
            if gate.open:
                t1 = now_ns()
                native.add_phase(_COLLECTIVE, t0, t1)
                native.add_op(_OP_GRADS_ALL_REDUCE, 0, 0, t0, t1)
            return f.value()[0]

        return fut.then(done)

    ddp_model.register_comm_hook(process_group, timed_allreduce)


# The torch.distributed functions sharded data parallelism (FSDP 1 and 2, torch 1.13 to 2.x)
# calls for its all-gathers and reduce-scatters; each is wrapped where it exists. torch 2.13's
# FSDP2 (fully_shard) calls all_gather_single and reduce_scatter_single, which the older names
# now call in turn (a nested call is timed once). FSDP1 (FullyShardedDataParallel) all-gathers
# CPU parameters with the list form, all_gather (torch 2.13's _flat_param.py): without it a CPU
# FSDP1 job's all-gathers, where a rank waits for a late peer, went untimed.
SHARDED_COLLECTIVES = ("all_gather_single", "all_gather_into_tensor", "_all_gather_base", "all_gather",
                       "reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base")


class _TimedWork:
    """The handle of an asynchronous collective (async_op=True): wait() is timed as the
    collective phase (on the device too with a timer: on a GPU, wait() makes the current
    stream wait for the collective's, and events around it time that wait); everything else
    goes to the real handle."""
    __slots__ = ("_work", "_add_phase", "_timer")

    def __init__(self, work: Any, add_phase: Callable[[int, int, int], None],
                 timer: DeviceTimer | None = None) -> None:
        self._work, self._add_phase, self._timer = work, add_phase, timer

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        timer = self._timer
        begin = timer.mark() if timer is not None else None
        t0 = now_ns()
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            t1 = now_ns()
            self._add_phase(_COLLECTIVE, t0, t1)
            if timer is not None:
                timer.phase(_COLLECTIVE, begin, timer.mark(), t0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


# The methods of torch.distributed's Work that a _TimedWork subclassing it hands to the real
# handle (the base class's own would answer for an empty Work); wait() is timed.
_WORK_METHODS = ("is_completed", "is_success", "exception", "source_rank", "_source_rank", "result",
                 "synchronize", "block_current_stream", "get_future", "get_future_result",
                 "_get_duration", "_get_op_type", "boxed")


def _timed_work_type(work_type: Any) -> Any:
    """_TimedWork as a subclass of torch.distributed's Work where it can be one: FSDP2 waits on
    an asynchronous all-gather's handle only if it is a Work (torch 2.13's
    foreach_all_gather_copy_out: `if isinstance(all_gather_work, dist.distributed_c10d.Work):
    all_gather_work.wait()`), so a plain wrapper made a job with async unshards (FSDP2's
    unshard(async_op=True), _set_unshard_async_op) read its parameters before they arrived
    (its loss went NaN). Where Work cannot be subclassed, the plain _TimedWork."""
    if not isinstance(work_type, type):
        return _TimedWork

    def init(self: Any, work: Any, add_phase: Callable[[int, int, int], None],
             timer: DeviceTimer | None = None) -> None:
        work_type.__init__(self)
        self._work, self._add_phase, self._timer = work, add_phase, timer

    def delegate(name: str) -> Callable[..., Any]:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(self._work, name)(*args, **kwargs)
        method.__name__ = name
        return method

    namespace: dict[str, Any] = {"__init__": init, "wait": _TimedWork.wait, "__getattr__": _TimedWork.__getattr__,
                                 "__doc__": _TimedWork.__doc__}
    namespace.update((name, delegate(name)) for name in _WORK_METHODS if hasattr(work_type, name))
    try:
        return type("_TimedWork", (work_type,), namespace)
    except TypeError:  # a final class
        return _TimedWork


def instrument_collectives(native: _native.Collector, names: Iterable[str] = SHARDED_COLLECTIVES,
                          timer: DeviceTimer | None = None) -> Attachment:
    """Wraps the torch.distributed functions `names` (those that exist, in torch.distributed
    and in torch.distributed.distributed_c10d) so that the time a caller is blocked in them
    is the collective phase: a synchronous call from start to return, an asynchronous one
    (async_op=True) in its handle's wait(). A call made from inside another wrapped call
    (_all_gather_base calls all_gather_into_tensor) is timed once. Returns the Attachment of
    the wrappers (process-wide; one per process is enough). With a device `timer`, events on
    the current stream around a synchronous call and around wait() time the stream's wait on
    the device too."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d
    modules: list[ModuleType] = [m for m in (dist, distributed_c10d)]
    add_phase = native.add_phase
    timed_work = _timed_work_type(getattr(distributed_c10d, "Work", None))
    inside = threading.local()

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if getattr(inside, "depth", 0):
                return fn(*args, **kwargs)
            inside.depth = 1
            begin = timer.mark() if timer is not None and not kwargs.get("async_op") else None
            t0 = now_ns()
            try:
                work = fn(*args, **kwargs)
            finally:
                inside.depth = 0
            if work is None:  # synchronous: it returned when the collective completed
                t1 = now_ns()
                add_phase(_COLLECTIVE, t0, t1)
                if timer is not None and begin is not None:
                    timer.phase(_COLLECTIVE, begin, timer.mark(), t0)
                return None
            return timed_work(work, add_phase, timer)
        timed.__wrapped__ = fn  # type: ignore[attr-defined]  # as functools.wraps sets it
        timed.__name__ = getattr(fn, "__name__", "collective")
        timed.__doc__ = getattr(fn, "__doc__", None)
        return timed

    def attach() -> Callable[[], None]:
        replaced: list[tuple[ModuleType, str, Callable[..., Any]]] = []
        wrappers: dict[Callable[..., Any], Callable[..., Any]] = {}
        for module in modules:
            for name in names:
                fn = module.__dict__.get(name)
                if fn is None:
                    continue
                if fn not in wrappers:  # the same function in both modules: one wrapper
                    wrappers[fn] = wrap(fn)
                setattr(module, name, wrappers[fn])
                replaced.append((module, name, fn))

        def detach() -> None:
            for module, name, fn in replaced:
                setattr(module, name, fn)
        return detach

    wrappers = Attachment(attach)
    wrappers.on()
    return wrappers


def watch_gc(native: _native.Collector) -> Attachment:
    """Python's garbage collections as GC pauses of the open step: a gc.callbacks entry (a
    native function, no Python frame) times each collection from "start" to "stop". Returns its
    Attachment (on: in gc.callbacks)."""
    watcher = _native.gc_callback(native)

    def attach() -> Callable[[], None]:
        gc.callbacks.append(watcher)

        def detach() -> None:
            if watcher in gc.callbacks:
                gc.callbacks.remove(watcher)
        return detach

    attachment = Attachment(attach)
    attachment.on()
    return attachment
