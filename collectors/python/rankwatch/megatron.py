"""Megatron-core's own op timers as rankwatch ops, with no change to the training script.

Megatron-core times each op of a pipeline step through `config.timers(name, log_level)
.start()` / `.stop()` (ModelParallelConfig.timers, and OptimizerConfig.timers for the
optimizer): its schedules (megatron/core/pipeline_parallel/schedules.py: forward_step,
forward_step_calc_loss, backward_step, the 'forward-backward' timer of each
forward_backward_* function), its p2p communicator (p2p_communication.py), finalize_model_grads
and the optimizers. The names are the what-if study's own (forward-compute, backward-compute,
forward-send, backward-recv, params-all-gather, ...; docs/whatif.md). Megatron's own Timers
synchronise the device at every start and stop and keep only totals; here each start/stop
becomes one op of the open step, through the collector's op scopes (rw.op), so that on a GPU the
op is timed on the device too.

How: `timers` of ModelParallelConfig (every TransformerConfig) and OptimizerConfig becomes a
property of the class, installed by instrument() (rw.instrument_megatron(), or by
rankwatch.init() by itself when the script imported megatron.core before it). Reading
`config.timers` gives a RankwatchTimers wrapping the timers the config holds (Megatron-LM's
Timers, a script's own, or none): each call is passed on to them, so Megatron's own logging works
as before, and recorded. Assigning `config.timers = x` stores x as before (Megatron-LM's train()
does so at its start and around evaluation), and x is wrapped from then on; assigning None where
timers were set turns recording off for that config (Megatron-LM's evaluate() does so: "don't
care about timing during evaluation"). A config that never held timers is recorded too.
pause() takes the property off (the configs hold their own timers again); close() too.

What each Megatron timer becomes (others are passed on only):

| Megatron timer | op |
|---|---|
| forward-compute, backward-compute, forward-recv, forward-send, backward-recv, backward-send | the same |
| forward-send-backward-recv, backward-send-forward-recv, forward-send-forward-recv, backward-send-backward-recv, forward-backward-send-forward-backward-recv (one batched p2p call) | one op per direction, each over the call's whole span (as in the study's traces) |
| all-grads-sync | grads-reduce-scatter with the distributed optimizer, else grads-all-reduce |
| layernorm-grads-all-reduce, non-tensor-parallel-grads-all-reduce (its name since 2024) | layernorm-grads-all-reduce |
| embedding-grads-all-reduce | the same, on the first and the last pipeline stage only (the stages that hold embeddings) |
| params-all-gather | the same; one timed after the step's schedule (the distributed optimizer's, at the end of optimizer.step) belongs to the next step, whose forward it gates: it is added to the next step |
| optimizer-clip-main-grad | the same |
| optimizer-inner-step | optimizer |
| optimizer (a train step's, where a config's timers time it) | optimizer, unless optimizer-inner-step was timed within it; the step ends there |
| forward-backward (each forward_backward_* call) | no op: the schedule's bounds (below) |

Microbatch and model chunk: forward_step is given its microbatch (current_microbatch) and model
chunk (vp_stage), read from its frame when 'forward-compute' starts. backward_step is given
neither: the k-th backward of a step runs the model chunk V - 1 - c_k, where c_k is the chunk of
the k-th forward (both schedules index Megatron's schedule table the same way), and each chunk's
backwards pop its forwards in order (input_tensors[chunk].pop(0)), so a backward's microbatch is
the oldest forwarded one of its chunk. A send carries the labels of the last compute of its
direction; a receive those of the next one (for forwards: Megatron's schedule table, rebuilt from
the schedule's num_microbatches, the config's virtual_pipeline_model_parallel_size and
microbatch_group_size_per_vp_stage).

Steps: ops go to the step the script opened (rw.step()). A script that opens none (Megatron-LM's
pretrain, a plain loop calling forward_backward_func) gets one step per forward_backward_func
call, opened when its 'forward-backward' timer starts and ended when the next call begins (so
the step holds the optimizer step and whatever the loop does before the next schedule), or at
close() (or when a config's timers time an 'optimizer' timer: at its stop; Megatron-LM's
train_step times it with its global timers, not a config's). A forward-only schedule (evaluation,
forward_only=True) records nothing and opens no step.

Not covered: the combined 1F1B schedule with overlapped MoE communication
(overlap_moe_expert_parallel_comm, combined_1f1b.py) times its forwards and backwards in other
functions (labels by order only); zero-bubble schedules' weight-gradient computes are not timed by
Megatron.
"""
from __future__ import annotations

import logging
import os
import sys
from collections import deque
from typing import TYPE_CHECKING, Any

from rankwatch import _native
from rankwatch import torch_hooks as _hooks

if TYPE_CHECKING:
    from rankwatch.collector import Collector

_log = logging.getLogger("rankwatch")
now_ns = _native.now_ns

# Megatron timer name -> the ops it is (a batched call's in the wire's order of op types: opened
# in that order, they sort the same by start and by type).
TIMER_OPS: dict[str, tuple[str, ...]] = {
    "forward-compute": ("forward-compute",),
    "backward-compute": ("backward-compute",),
    "forward-recv": ("forward-recv",),
    "forward-send": ("forward-send",),
    "backward-recv": ("backward-recv",),
    "backward-send": ("backward-send",),
    "forward-send-backward-recv": ("forward-send", "backward-recv"),
    "backward-send-forward-recv": ("forward-recv", "backward-send"),
    "forward-send-forward-recv": ("forward-send", "forward-recv"),
    "backward-send-backward-recv": ("backward-send", "backward-recv"),
    "forward-backward-send-forward-backward-recv": ("forward-send", "forward-recv", "backward-send",
                                                    "backward-recv"),
    "layernorm-grads-all-reduce": ("layernorm-grads-all-reduce",),
    "non-tensor-parallel-grads-all-reduce": ("layernorm-grads-all-reduce",),
    "embedding-grads-all-reduce": ("embedding-grads-all-reduce",),
    "optimizer-clip-main-grad": ("optimizer-clip-main-grad",),
    "optimizer-inner-step": ("optimizer",),
}
# Timers handled apart: the schedule's bounds, Megatron-LM's optimizer, the data-parallel ones.
_SCHEDULE, _OUTER_OPTIMIZER, _GRADS_SYNC, _PARAMS_GATHER = (
    "forward-backward", "optimizer", "all-grads-sync", "params-all-gather")
_OFF = "_rankwatch_timers_off"  # a config's __dict__ key: None was assigned over timers

_active: MegatronOps | None = None  # the recorder the installed property routes to
_installed: dict[type, object] = {}  # class -> its own `timers` class attribute before


def instrument(collector: Collector, config: Any = None, grads_sync: str | None = None,
               auto_steps: bool = True) -> MegatronOps:
    """Records Megatron-core's timed ops into `collector` (rw.instrument_megatron). `config`: a
    ModelParallelConfig / TransformerConfig / OptimizerConfig whose class (and that of its bases)
    gets the property; without it, the classes of the megatron.core the script imported.
    grads_sync: "grads-reduce-scatter" or "grads-all-reduce" for the all-grads-sync timer;
    default: the model's DDP config says (use_distributed_optimizer). auto_steps: open a step per
    forward_backward_func call where the script opens none."""
    global _active
    if grads_sync not in (None, "grads-reduce-scatter", "grads-all-reduce"):
        raise ValueError("rankwatch: grads_sync is 'grads-reduce-scatter' or 'grads-all-reduce', not %r"
                         % (grads_sync,))
    classes = _config_classes(config)
    if not classes:
        raise ValueError("rankwatch.instrument_megatron: no Megatron-core config class with a `timers` "
                         "field found (import megatron.core first, or pass the config)")
    ops = collector._megatron_ops
    if ops is None:
        ops = MegatronOps(collector, classes, grads_sync, auto_steps)
        collector._megatron_ops = ops
        collector._on_close.append(ops.finish)
        collector._attach(ops.attachment)
    else:
        ops.add_classes(classes)
        if grads_sync is not None:
            ops.grads_sync = grads_sync
        ops.auto_steps = auto_steps
    if _active is not None and _active is not ops:
        _active.finish()  # an earlier collector's: this one records from now on
    if not collector.paused:
        ops.attachment.on()
    return ops


def autoinstall(collector: Collector) -> None:
    """rankwatch.init()'s zero configuration: instrument() when the script imported megatron.core
    before init() (unless $RANKWATCH_MEGATRON_OPS=0)."""
    if os.environ.get("RANKWATCH_MEGATRON_OPS", "").strip().lower() in ("0", "false", "no", "off"):
        return
    if "megatron.core.model_parallel_config" not in sys.modules:
        return
    try:
        instrument(collector)
    except Exception as e:  # pylint: disable=broad-except  # never break init() over it
        _log.warning("rankwatch: Megatron-core's op timers not instrumented: %s", e)
        return
    _log.info("rankwatch: recording Megatron-core's timed ops (config.timers)")


def _config_classes(config: Any) -> list[type]:
    """The dataclasses defining a `timers` field: those in `config`'s class hierarchy, else
    megatron.core's ModelParallelConfig and OptimizerConfig as imported."""
    candidates: list[type] = []
    if config is not None:
        candidates = list(type(config).__mro__)
    else:
        for module, name in (("megatron.core.model_parallel_config", "ModelParallelConfig"),
                             ("megatron.core.optimizer.optimizer_config", "OptimizerConfig")):
            cls = getattr(sys.modules.get(module), name, None)
            if isinstance(cls, type):
                candidates.append(cls)
    found = []
    for cls in candidates:
        own = cls.__dict__
        if "timers" in own.get("__dataclass_fields__", {}) and ("timers" in own or cls in _installed):
            found.append(cls)
    return found


class _TimersSlot:
    """The `timers` property installed on a Megatron config class (a data descriptor: it wins
    over the instance's own attribute, which keeps the value assigned)."""

    def __get__(self, config: Any, owner: type | None = None) -> Any:
        if config is None:  # the class's own attribute: the dataclass default
            return None
        d = config.__dict__
        inner = d.get("timers")
        ops = _active
        if ops is None or (inner is None and d.get(_OFF)):
            return inner
        return RankwatchTimers(ops, inner, config)

    def __set__(self, config: Any, value: Any) -> None:
        d = config.__dict__
        if isinstance(value, RankwatchTimers):
            value = value.inner
        if value is None:
            if d.get("timers") is not None:
                d[_OFF] = True
        else:
            d.pop(_OFF, None)
        d["timers"] = value


_SLOT = _TimersSlot()


class RankwatchTimers:
    """What an instrumented config's `timers` returns: Megatron's Timers interface (called with
    a name and a log level, giving a timer with start() and stop()), passing every call on to
    the timers the config holds (`inner`, or none) and recording the ops the names stand for.
    Other attributes (log, write, ...) are the inner timers'."""
    __slots__ = ("_ops", "inner", "config")

    def __init__(self, ops: MegatronOps, inner: Any, config: Any) -> None:
        self._ops, self.inner, self.config = ops, inner, config

    def __call__(self, name: str, log_level: int | None = None) -> OpTimer:
        inner = self.inner
        timer = None
        if inner is not None:
            timer = inner(name) if log_level is None else inner(name, log_level=log_level)
        return OpTimer(self._ops, name, timer, self.config)

    def __getattr__(self, attr: str) -> Any:
        if self.inner is None:
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def __deepcopy__(self, memo: dict[int, object]) -> RankwatchTimers:
        return self  # dataclasses.asdict(config) deep-copies field values


class OpTimer:
    """One named timer: start() and stop() call the inner timer's (its barrier and device
    synchronisation first, so the op's host time matches Megatron's own) and open and close the
    op."""
    __slots__ = ("_ops", "name", "_inner", "_config")

    def __init__(self, ops: MegatronOps, name: str, inner: Any, config: Any) -> None:
        self._ops, self.name, self._inner, self._config = ops, name, inner, config

    def start(self, barrier: bool = False) -> None:
        if self._inner is not None:
            self._inner.start(barrier=barrier)
        self._ops.start(self.name, self._config)

    def stop(self, barrier: bool = False) -> None:
        if self._inner is not None:
            self._inner.stop(barrier=barrier)
        self._ops.stop(self.name)

    def elapsed(self, reset: bool = True, barrier: bool = False) -> float:
        return float(self._inner.elapsed(reset=reset, barrier=barrier)) if self._inner is not None else 0.0

    def reset(self) -> None:
        if self._inner is not None:
            self._inner.reset()

    def __getattr__(self, attr: str) -> Any:
        if self._inner is None:
            raise AttributeError(attr)
        return getattr(self._inner, attr)


def _caller_locals(depth: int) -> dict[str, Any]:
    """The local variables of the frame `depth` calls above the caller ({} if none)."""
    try:
        return sys._getframe(depth + 1).f_locals
    except (ValueError, AttributeError):
        return {}


def schedule_table(num_microbatches: int, chunks: int, group: int) -> list[tuple[int, int]]:
    """(microbatch, model chunk) of each forward of an interleaved schedule, in order: groups of
    `group` microbatches, each run through every chunk in turn, the last group taking the rest
    (Megatron-core's get_schedule_table; chunks = 1: the microbatches in order)."""
    group = max(1, group)
    table: list[tuple[int, int]] = []
    for low in range(0, num_microbatches, group):
        high = num_microbatches if low + group >= num_microbatches else low + group
        table.extend((mb, chunk) for chunk in range(chunks) for mb in range(low, high))
    return table


class MegatronOps:
    """The recorder behind every instrumented config's timers, one per collector: open op
    scopes by timer name, the labels of the schedule in progress, and the steps it opens."""

    def __init__(self, collector: Collector, classes: list[type], grads_sync: str | None,
                 auto_steps: bool) -> None:
        self._rw = collector
        self.classes = list(classes)
        self.grads_sync = grads_sync
        self.auto_steps = auto_steps
        self.attachment = _hooks.Attachment(self._install)
        self._open: dict[str, list[Any]] = {}  # timer name -> its open op scopes
        self._auto_step: Any = None  # the step scope this recorder opened, until it ends it
        self._skip = False  # inside a forward-only schedule
        self._after_schedule = False  # the step's schedule has ended (its optimizer follows)
        self._held: list[tuple[int, int]] = []  # params all-gathers for the next step
        self._outer_t0 = 0  # Megatron-LM's 'optimizer' timer's start
        self._inner_optimizer = False  # optimizer-inner-step timed within it
        self._timed: dict[str, int] = {}  # host start of ops timed by hand (params all-gather)
        self._new_schedule(None, {})

    # --- installation ------------------------------------------------------------------------
    def add_classes(self, classes: list[type]) -> None:
        for cls in classes:
            if cls not in self.classes:
                self.classes.append(cls)
                if self.attachment._detach is not None:
                    _install_class(cls)

    def _install(self) -> Any:
        global _active
        _active = self
        for cls in self.classes:
            _install_class(cls)

        def detach() -> None:
            global _active
            self._end_auto_step()
            if _active is self:
                _active = None
            for cls in self.classes:
                _uninstall_class(cls)
        return detach

    def finish(self) -> None:
        """The collector closes (or another takes over): the open step ends, the property comes
        off; ops timed later are not recorded."""
        self.attachment.off()

    # --- the schedule ------------------------------------------------------------------------
    def _new_schedule(self, config: Any, loc: dict[str, Any]) -> None:
        layout = self._rw.layout
        self._chunks = max(1, int(getattr(config, "virtual_pipeline_model_parallel_size", None) or
                                  (layout.virtual_stages if layout is not None else 1)))
        stages = layout.pipeline_size if layout is not None else 1
        self._embedding_stage = layout is None or layout.pipeline_rank in (0, stages - 1)
        m = loc.get("num_microbatches")
        group = getattr(config, "microbatch_group_size_per_vp_stage", None) or stages
        self._table = schedule_table(int(m), self._chunks, int(group)) if isinstance(m, int) else None
        self._fwd_labels: list[tuple[int, int]] = []
        self._bwd = 0
        self._fifo: dict[int, deque[int]] = {}
        self._last_fwd = (0, 0)
        self._last_bwd = (0, 0)

    def _next_forward(self) -> tuple[int, int]:
        k = len(self._fwd_labels)
        if self._table is not None and k < len(self._table):
            return self._table[k]
        return (k, 0) if self._chunks == 1 else self._last_fwd

    def _next_backward(self, pop: bool) -> tuple[int, int]:
        k = self._bwd
        if k < len(self._fwd_labels):
            mb, chunk = self._fwd_labels[k]
        elif self._table is not None and k < len(self._table):
            mb, chunk = self._table[k]  # its forward has not run yet (a receive ahead of it)
        elif self._table is not None or self._chunks > 1:
            return self._last_bwd  # no backward follows (a batched call's idle direction)
        else:
            mb, chunk = k, 0
        chunk = max(0, self._chunks - 1 - chunk)
        fifo = self._fifo.get(chunk)
        if fifo:
            mb = fifo.popleft() if pop else fifo[0]
        return (mb, chunk)

    def _labels(self, op: str, loc: dict[str, Any]) -> tuple[int, int]:
        if op == "forward-compute":
            mb, chunk = loc.get("current_microbatch"), loc.get("vp_stage")
            predicted = self._next_forward()
            labels = (mb if isinstance(mb, int) else predicted[0], chunk if isinstance(chunk, int) else
                      (predicted[1] if self._chunks > 1 else 0))
            self._fwd_labels.append(labels)
            self._fifo.setdefault(labels[1], deque()).append(labels[0])
            self._last_fwd = labels
            return labels
        if op == "backward-compute":
            labels = self._next_backward(pop=True)
            self._bwd += 1
            self._last_bwd = labels
            return labels
        if op == "forward-send":
            return self._last_fwd
        if op == "backward-send":
            return self._last_bwd
        if op == "forward-recv":
            return self._next_forward()
        if op == "backward-recv":
            return self._next_backward(pop=False)
        return (0, 0)

    def _end_auto_step(self) -> None:
        step, self._auto_step = self._auto_step, None
        if step is not None:
            step.__exit__(None, None, None)

    # --- timers ------------------------------------------------------------------------------
    def start(self, name: str, config: Any) -> None:
        rw = self._rw
        if name == _SCHEDULE:
            loc = _caller_locals(2)  # the forward_backward_* function that started it
            if loc.get("forward_only"):
                self._skip = True
                return
            self._skip = False
            if self.auto_steps:
                self._end_auto_step()
                if not rw._in_step and not rw.paused:
                    self._auto_step = rw.step()
                    self._auto_step.__enter__()
            for t0, t1 in self._held:
                rw.add_op(_PARAMS_GATHER, t0, t1)
            self._held.clear()
            self._after_schedule = False
            self._new_schedule(config, loc)
            return
        if self._skip:
            return
        if name == _OUTER_OPTIMIZER:
            self._outer_t0, self._inner_optimizer = now_ns(), False
            return
        if name == _PARAMS_GATHER and self._after_schedule:
            self._timed[name] = now_ns()  # for the next step: timed by hand, added then
            return
        ops: tuple[str, ...] | None
        if name == _GRADS_SYNC:
            ops = (self.grads_sync or self._grads_sync_kind(_caller_locals(2)),)
        elif name == _PARAMS_GATHER:
            ops = (_PARAMS_GATHER,)
        else:
            ops = TIMER_OPS.get(name)
            if ops is None:
                return
            if name == "optimizer-inner-step":
                self._inner_optimizer = True
            elif name == "embedding-grads-all-reduce" and not self._embedding_stage:
                return
        loc = _caller_locals(2) if name == "forward-compute" else {}
        scopes = []
        for op in ops:
            mb, chunk = self._labels(op, loc)
            scope = rw.op(op, microbatch=mb, chunk=chunk)
            scope.__enter__()
            scopes.append(scope)
        self._open[name] = scopes

    def stop(self, name: str) -> None:
        if name == _SCHEDULE:
            if self._skip:
                self._skip = False
            else:
                self._after_schedule = True
            return
        if self._skip:
            return
        scopes = self._open.pop(name, None)
        if scopes is not None:
            for scope in reversed(scopes):
                scope.__exit__(None, None, None)
            return
        if name == _PARAMS_GATHER:
            t0 = self._timed.pop(name, None)
            if t0 is not None:
                self._held.append((t0, now_ns()))
        elif name == _OUTER_OPTIMIZER and self._outer_t0:
            if not self._inner_optimizer:
                self._rw.add_op("optimizer", self._outer_t0, now_ns())
            self._outer_t0 = 0
            self._end_auto_step()  # Megatron-LM's train_step ends here

    def _grads_sync_kind(self, loc: dict[str, Any]) -> str:
        """finalize_model_grads' model chunks say whether the distributed optimizer shards the
        gradients (reduce-scatter) or every replica keeps them whole (all-reduce)."""
        model = loc.get("model")
        first = model[0] if isinstance(model, (list, tuple)) and model else model
        ddp_config = getattr(first, "ddp_config", None)
        if getattr(ddp_config, "use_distributed_optimizer", False):
            self.grads_sync = "grads-reduce-scatter"
            return self.grads_sync
        return "grads-all-reduce"


def _install_class(cls: type) -> None:
    if cls in _installed:
        return
    _installed[cls] = cls.__dict__.get("timers")
    setattr(cls, "timers", _SLOT)


def _uninstall_class(cls: type) -> None:
    if cls not in _installed:
        return
    setattr(cls, "timers", _installed.pop(cls))
