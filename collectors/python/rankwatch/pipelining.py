"""torch.distributed.pipelining's schedules as rankwatch ops, with no change to the training
loop: `rw.instrument_pipeline(schedule)` (or a stage, or a list of stages).

Every schedule of torch.distributed.pipelining (torch 2.4 and later; tested on 2.13:
Schedule1F1B, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble)
runs a stage's work through three methods of the stage, and its point-to-point transfers through
two functions of torch.distributed.pipelining.schedules:

| torch | op |
|---|---|
| `stage.forward_one_chunk(mb, ...)` (with the loss the schedule computes right after it on the last stage, `schedule._maybe_compute_loss`) | forward-compute |
| `stage.backward_one_chunk(mb, ...)`: a full backward, or the input-gradient part of a zero-bubble schedule (its "I" / "B" actions) | backward-compute |
| `stage.backward_weight_one_chunk(mb, ...)`: the weight-gradient part of a zero-bubble schedule ("W") | backward-weight-compute |
| the ops of `stage.get_fwd_send_ops(mb)` / `get_fwd_recv_ops(mb)` / `get_bwd_send_ops(mb)` / `get_bwd_recv_ops(mb)` (activations to the next stage, from the previous one; gradients to the previous stage, from the next one), timed where the schedule posts them (`schedules._batch_p2p`) and where it waits for them (`schedules._wait_batch_p2p`) | forward-send, forward-recv, backward-send, backward-recv |

Each op carries the microbatch the schedule gives the method and the model chunk: the stage's
index among the stages this rank holds (sorted by stage index: 0 and 1 for the loop-style
interleaved schedules' stages r and r + pp, and for the V schedules' r and 2 pp - 1 - r).

Transfers: a receive spans the schedule's wait for it (Schedule1F1B posts and waits at once; the
runtime schedules, Interleaved1F1B and the zero-bubble ones, post early and wait just before the
compute that needs it). A send spans its post: the runtime schedules wait for every send only at
the end of step(), where a send's op would follow every compute of the step. Ops posted and
waited at once (Schedule1F1B's exchanges: a send and a receive in one batch_isend_irecv) all span
the post and the wait, as in a hand-instrumented exchange. A transfer the schedule makes between
two stages of the same rank (the V schedules' local hand-over) is no transfer and no op.

Compute ops go through the collector's op scopes (rw.op), so a device clock (on a GPU) times them
on the device too; transfers are timed the same way, with events at the post and the wait.

Steps: ops go to the step the script opened (rw.step()). A script that opens none gets one step
per schedule.step() call, opened when step() is called and ended when the next step() call
begins (so the step holds what the loop does after step(): the gradient all-reduce, the
optimizer), or at pause() or close(). schedule.eval() (forward only) records nothing and opens
no step.

Layout: where the collector has none (no layout=, Megatron or DeviceMesh), the pipeline rank and
size of the stages' process group, the virtual stages (the stages the rank holds), and the data
replica: the ranks outside the pipeline group, the data rank read from the group's ranks when they
follow one of the two regular orders (rank = stage x replicas + data rank, Megatron's; or rank =
data rank x stages + stage, a ("dp", "pp") DeviceMesh's); tensor parallelism is not seen there
(give a DeviceMesh or layout=). With a layout already set (a DeviceMesh found, layout=), its
pipeline rank and size must be the group's; its virtual stages are set to the rank's stage count
when it said 1.

Thread-safety: the training thread (the schedule's); nothing here is shared with another thread.
The two functions of torch.distributed.pipelining.schedules are replaced once per process by
wrappers that pass every batch of untagged ops through unchanged."""
from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from rankwatch import _native
from rankwatch import layout as _layout
from rankwatch import torch_hooks as _hooks

if TYPE_CHECKING:
    from rankwatch.collector import Collector

_log = logging.getLogger("rankwatch")
now_ns = _native.now_ns
_MISSING = object()

_FORWARD, _BACKWARD, _WEIGHT = "forward-compute", "backward-compute", "backward-weight-compute"
# stage method -> (op type, whether its ops are sends)
_P2P_METHODS = {
    "get_fwd_send_ops": (_native.OP_TYPES["forward-send"], True),
    "get_fwd_recv_ops": (_native.OP_TYPES["forward-recv"], False),
    "get_bwd_send_ops": (_native.OP_TYPES["backward-send"], True),
    "get_bwd_recv_ops": (_native.OP_TYPES["backward-recv"], False),
}
_TAG = "_rankwatch_op"  # a P2POp's attribute: the _Tag of the op it belongs to
_PIPELINE = "_rankwatch_pipeline"  # a stage's attribute: the Pipeline recording it

# One transfer op: the P2POps one get_*_ops call returned (several tensors are one op):
# (its pipeline, op type, microbatch, model chunk, whether it is a send).
_Tag = tuple["Pipeline", int, int, int, bool]
# A posted batch's tagged ops, with the post's host times and device events (None without).
_Batch = tuple[list[_Tag], int, int, Any, Any]


class _Works(list[Any]):
    """What _batch_p2p returned (the transfers' Work handles), carrying their _Batch to the wait."""
    __slots__ = ("rankwatch_batch",)
    rankwatch_batch: _Batch


class Pipeline:
    """The recorder of one instrumented schedule (or stage, or stages): the wrappers of the
    stages' methods and the schedule's step(), the transfers in flight, the step it opened.

    Kept lean: an op costs the CPU tens of microseconds where its code runs cold (a rank that
    slept or waited since its last op: every op of a pipeline), about 1 us warm, so a compute
    op is a wrapper, two clock reads and one native add_op on the host (the collector's op
    scope, rw.op, with a device clock), and a transfer a tag, a clock read at its post and two
    at its wait."""

    def __init__(self, collector: Collector, schedule: Any, stages: list[Any]) -> None:
        self._rw = collector
        self._native = collector._native
        self._timer = collector._timer
        self.schedule, self.stages = schedule, stages
        self.chunks = _chunks(schedule, stages)
        self._last_post: _Works | None = None  # the batch posted last, while nothing else ran
        # The last stage's forward until the schedule computed its loss: (type, microbatch,
        # chunk, host start) on the host, the op scope with a device clock.
        self._pending_forward: Any = None
        self._step: Any = None  # the step scope this recorder opened, until it ends it
        self._eval = 0  # inside schedule.eval(): nothing recorded
        self.attachment = _hooks.Attachment(self._install)

    @property
    def recording(self) -> bool:
        return not self._eval and self._rw._gate.open and not self._rw._closed

    # --- installation ------------------------------------------------------------------------
    def _install(self) -> Callable[[], None]:
        _patch_schedules()
        undo: list[Callable[[], None]] = []
        for stage in self.stages:
            chunk = self.chunks.get(id(stage), 0)
            last_with_loss = self.schedule is not None and bool(getattr(stage, "is_last", False))
            undo.append(_wrap(stage, "forward_one_chunk", self._compute(_FORWARD, chunk, last_with_loss)))
            undo.append(_wrap(stage, "backward_one_chunk", self._compute(_BACKWARD, chunk, False)))
            if hasattr(stage, "backward_weight_one_chunk"):
                undo.append(_wrap(stage, "backward_weight_one_chunk", self._compute(_WEIGHT, chunk, False)))
            for name, (op_type, send) in _P2P_METHODS.items():
                if hasattr(stage, name):
                    undo.append(_wrap(stage, name, self._tagger(op_type, chunk, send)))
        if self.schedule is not None:
            undo.append(_wrap(self.schedule, "step", self._step_wrapper))
            if hasattr(self.schedule, "_maybe_compute_loss"):
                undo.append(_wrap(self.schedule, "_maybe_compute_loss", self._loss_wrapper))

        def detach() -> None:
            self.end_step()
            self._last_post = None
            for u in reversed(undo):
                u()
        return detach

    def finish(self) -> None:
        """The collector closes: the open step ends, the wrappers come off."""
        self.attachment.off()

    # --- steps --------------------------------------------------------------------------------
    def end_step(self) -> None:
        self._close_forward()
        step, self._step = self._step, None
        if step is not None:
            step.__exit__(None, None, None)

    def _step_wrapper(self, step: Callable[..., Any]) -> Callable[..., Any]:
        rw, schedule = self._rw, self.schedule

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not getattr(schedule, "_has_backward", True):  # eval(): forward only
                self._eval += 1
                try:
                    return step(*args, **kwargs)
                finally:
                    self._eval -= 1
            if self.recording and (self._step is not None or not rw._in_step):
                self.end_step()  # the previous step() call's
                scope = rw.step()
                scope.__enter__()
                self._step = scope
            return step(*args, **kwargs)
        return wrapper

    # --- compute ------------------------------------------------------------------------------
    def _compute(self, name: str, chunk: int, last_with_loss: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        op_type = _native.OP_TYPES[name]
        add_op, op_scope, schedule = self._native.add_op, self._rw.op, self.schedule

        def make(method: Callable[..., Any]) -> Callable[..., Any]:
            def host(*args: Any, **kwargs: Any) -> Any:
                if self._eval:
                    return method(*args, **kwargs)
                if self._pending_forward is not None:
                    self._close_forward()
                self._last_post = None
                mb = args[0] if args else next(iter(kwargs.values()), 0)
                t0 = now_ns()
                try:
                    out = method(*args, **kwargs)
                except BaseException:
                    add_op(op_type, mb, chunk, t0, now_ns())
                    raise
                if last_with_loss and schedule._loss_fn is not None:
                    self._pending_forward = (op_type, mb, chunk, t0)  # until the schedule computed its loss
                else:
                    add_op(op_type, mb, chunk, t0, now_ns())
                return out

            def device(*args: Any, **kwargs: Any) -> Any:
                if self._eval:
                    return method(*args, **kwargs)
                if self._pending_forward is not None:
                    self._close_forward()
                self._last_post = None
                mb = args[0] if args else next(iter(kwargs.values()), 0)
                scope = op_scope(name, mb, chunk)  # events on the current stream at both ends
                scope.__enter__()
                try:
                    out = method(*args, **kwargs)
                except BaseException:
                    scope.__exit__(None, None, None)
                    raise
                if last_with_loss and schedule._loss_fn is not None:
                    self._pending_forward = scope
                else:
                    scope.__exit__(None, None, None)
                return out
            return host if self._timer is None else device
        return make

    def _loss_wrapper(self, compute_loss: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self._last_post = None  # work between a post and its wait
            try:
                return compute_loss(*args, **kwargs)
            finally:
                if self._pending_forward is not None:
                    self._close_forward()
        return wrapper

    def _close_forward(self) -> None:
        pending, self._pending_forward = self._pending_forward, None
        if isinstance(pending, tuple):
            op_type, mb, chunk, t0 = pending
            self._native.add_op(op_type, mb, chunk, t0, now_ns())
        elif pending is not None:
            pending.__exit__(None, None, None)

    # --- transfers (timed by the wrappers of _batch_p2p and _wait_batch_p2p: _patch_schedules) -
    def _tagger(self, op_type: int, chunk: int, send: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def make(method: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                ops = method(*args, **kwargs)
                if ops and not self._eval:
                    tag = (self, op_type, args[0] if args else next(iter(kwargs.values()), 0), chunk, send)
                    for p in ops:
                        p._rankwatch_op = tag
                return ops
            return wrapper
        return make


def instrument(collector: Collector, target: Any) -> Pipeline:
    """Records the ops of `target` (a torch.distributed.pipelining schedule, a stage, or a list of
    stages) into `collector` (rw.instrument_pipeline), and sets the layout the stages give where
    the collector has none. Returns the recorder."""
    schedule, stages = _stages_of(target)
    for stage in stages:
        other = getattr(stage, _PIPELINE, None)
        if other is not None and not other._rw._closed:
            raise ValueError("rankwatch.instrument_pipeline: stage %s is instrumented already"
                             % getattr(stage, "stage_index", "?"))
    pipeline = Pipeline(collector, schedule, stages)
    for stage in stages:
        setattr(stage, _PIPELINE, pipeline)
    collector._on_close.append(pipeline.finish)
    collector._attach(pipeline.attachment)
    if not collector.paused:
        pipeline.attachment.on()
    _set_layout(collector, schedule, stages)
    return pipeline


def _stages_of(target: Any) -> tuple[Any, list[Any]]:
    """(schedule or None, the stages this rank runs)."""
    if hasattr(target, "forward_one_chunk"):
        return None, [target]
    if hasattr(target, "_stages"):  # PipelineScheduleMulti and its runtime schedules
        return target, list(target._stages)
    if hasattr(target, "_stage"):  # PipelineScheduleSingle: Schedule1F1B, ScheduleGPipe
        return target, [target._stage]
    if isinstance(target, Iterable) and not isinstance(target, (str, bytes)):
        stages = list(target)
        if stages and all(hasattr(s, "forward_one_chunk") for s in stages):
            return None, stages
    raise TypeError("rankwatch.instrument_pipeline takes a torch.distributed.pipelining schedule, "
                    "stage or list of stages, not %s" % type(target).__name__)


def _chunks(schedule: Any, stages: list[Any]) -> dict[int, int]:
    """id(stage) -> its model chunk: its index among the stages this rank holds, by stage index.
    A schedule knows them all; a lone stage's fellow stages come from its stage -> rank map."""
    if schedule is not None or len(stages) > 1:
        order = sorted(stages, key=lambda s: int(s.stage_index))
        return {id(s): i for i, s in enumerate(order)}
    stage = stages[0]
    mapping = getattr(stage, "stage_index_to_group_rank", None) or {}
    mine = sorted(i for i, r in mapping.items() if r == stage.group_rank)
    index = int(stage.stage_index)
    return {id(stage): mine.index(index) if index in mine else 0}


def _virtual_stages(schedule: Any, stages: list[Any]) -> int:
    if schedule is not None or len(stages) > 1:
        return len(stages)
    stage = stages[0]
    mapping = getattr(stage, "stage_index_to_group_rank", None) or {}
    return max(1, sum(1 for r in mapping.values() if r == stage.group_rank))


def _set_layout(collector: Collector, schedule: Any, stages: list[Any]) -> None:
    """The layout the stages say (module docstring), where the collector's says nothing else."""
    stage = stages[0]
    try:
        pp_rank, pp_size = int(stage.group_rank), int(stage.group_size)
    except (AttributeError, TypeError, ValueError):
        return
    if pp_size < 2:
        return
    vpp = _virtual_stages(schedule, stages)
    if collector._layout_pending:
        collector._detect_layout()  # a DeviceMesh made since init() or the last step boundary
    current = collector.layout
    if current is not None:
        if (current.pipeline_rank, current.pipeline_size) != (pp_rank, pp_size):
            _log.warning("rankwatch: the pipeline's stages say pipeline rank %d of %d, the layout %s "
                         "(from %s) says otherwise: layout kept", pp_rank, pp_size, current,
                         collector.layout_source or "?")
            return
        if current.virtual_stages == 1 and vpp > 1:
            collector._native.set_layout(**dataclasses.replace(current, virtual_stages=vpp).as_dict())
        return
    found = _layout_from_group(stage.group, pp_rank, pp_size, vpp, collector.world_size)
    if found is None:
        _log.warning("rankwatch: no parallel layout from the pipeline's process group (pipeline rank %d "
                     "of %d): its ranks follow neither rank = stage x replicas + replica nor rank = "
                     "replica x stages + stage; pass layout= to rankwatch.init", pp_rank, pp_size)
        return
    try:
        collector._native.set_layout(**found.as_dict())
    except ValueError as e:
        _log.warning("rankwatch: the pipeline's layout %s does not fit: %s", found, e)
        return
    collector._layout_pending = False
    collector.layout_source = "pipelining"
    _log.info("rankwatch: parallel layout from the pipeline's stages: %s", found)


def _layout_from_group(group: Any, pp_rank: int, pp_size: int, vpp: int, world: int) -> _layout.Layout | None:
    """The layout of a rank in pipeline group `group` (None: the default group) when its global
    ranks follow one of the two regular orders; None otherwise."""
    if world % pp_size:
        return None
    replicas = world // pp_size
    try:
        import torch.distributed as dist
        ranks = sorted(int(r) for r in dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
    except Exception:  # pylint: disable=broad-except  # torch.distributed not initialised
        return None
    if len(ranks) != pp_size:
        return None
    low = ranks[0]
    if low < replicas and ranks == [low + k * replicas for k in range(pp_size)]:
        data_rank = low  # rank = stage x replicas + data rank (Megatron's order)
    elif low % pp_size == 0 and ranks == list(range(low, low + pp_size)):
        data_rank = low // pp_size  # rank = data rank x stages + stage
    else:
        return None
    return _layout.Layout(data_rank=data_rank, data_size=replicas, pipeline_rank=pp_rank,
                          pipeline_size=pp_size, virtual_stages=vpp)


def _wrap(obj: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Callable[[], None]:
    """Sets obj.name (an instance attribute over its class's method) to make(obj.name); returns
    the function that puts back what was there."""
    before = obj.__dict__.get(name, _MISSING)
    setattr(obj, name, make(getattr(obj, name)))

    def undo() -> None:
        if before is _MISSING:
            obj.__dict__.pop(name, None)
        else:
            setattr(obj, name, before)
    return undo


_patched = False


def _patch_schedules() -> None:
    """Replaces torch.distributed.pipelining.schedules' _batch_p2p and _wait_batch_p2p (once per
    process) by wrappers that time the batches holding tagged ops and pass the others on."""
    global _patched
    if _patched:
        return
    schedules = importlib.import_module("torch.distributed.pipelining.schedules")
    found_batch = getattr(schedules, "_batch_p2p", None)
    found_wait = getattr(schedules, "_wait_batch_p2p", None)
    if not callable(found_batch) or not callable(found_wait):
        _log.warning("rankwatch: this torch's pipelining schedules have no _batch_p2p / _wait_batch_p2p: "
                     "their transfers are not recorded (compute ops are)")
        _patched = True
        return
    batch_p2p: Callable[..., Any] = found_batch
    wait_batch_p2p: Callable[..., Any] = found_wait

    def posted(p2p_ops: Any, *args: Any, **kwargs: Any) -> Any:
        tags: list[_Tag] | None = None
        for p in p2p_ops:
            tag = getattr(p, _TAG, None)
            if tag is not None:
                if tags is None:
                    tags = [tag]
                elif tag not in tags:
                    tags.append(tag)
        if tags is None:
            return batch_p2p(p2p_ops, *args, **kwargs)
        pipe = tags[0][0]
        if pipe._pending_forward is not None:
            pipe._close_forward()
        timer = pipe._timer
        e0 = timer.mark() if timer is not None else None
        t0 = now_ns()
        works = _Works(batch_p2p(p2p_ops, *args, **kwargs))
        t1 = now_ns()
        works.rankwatch_batch = (tags, t0, t1, e0, timer.mark() if timer is not None else None)
        pipe._last_post = works
        return works

    def waited(work: Any, *args: Any, **kwargs: Any) -> Any:
        batch: _Batch | None = getattr(work, "rankwatch_batch", None)
        if batch is None or args or kwargs:
            return wait_batch_p2p(work, *args, **kwargs)
        tags, t0, t1, e0, e1 = batch
        pipe = tags[0][0]
        at_once = pipe._last_post is work  # posted and waited with nothing between
        pipe._last_post = None
        if pipe._eval:
            return wait_batch_p2p(work)
        if pipe._pending_forward is not None:
            pipe._close_forward()
        timer = pipe._timer
        if at_once:
            w0, we0 = t0, e0
        else:
            we0 = timer.mark() if timer is not None else None
            w0 = now_ns()
        result = wait_batch_p2p(work)
        w1 = now_ns()
        we1 = timer.mark() if timer is not None else None
        add_op = pipe._native.add_op
        for _, op_type, mb, chunk, send in tags:
            if send and not at_once:  # a send waited for later: its post
                index = add_op(op_type, mb, chunk, t0, t1)
                if timer is not None:
                    timer.op(index, e0, e1, t0)
            else:
                index = add_op(op_type, mb, chunk, w0, w1)
                if timer is not None:
                    timer.op(index, we0, we1, w0)
        return result

    for fn, wrapped in ((posted, batch_p2p), (waited, wait_batch_p2p)):
        fn.__wrapped__ = wrapped  # type: ignore[attr-defined]
        fn.__name__, fn.__doc__ = wrapped.__name__, wrapped.__doc__
    setattr(schedules, "_batch_p2p", posted)
    setattr(schedules, "_wait_batch_p2p", waited)
    _patched = True
