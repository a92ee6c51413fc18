"""DeepSpeed's pipeline instructions as rankwatch ops, with no change to the training script.

DeepSpeed's PipelineEngine (deepspeed/runtime/pipe/engine.py) runs a training batch
(train_batch) as the steps of a TrainSchedule (deepspeed/runtime/pipe/schedule.py), each a list
of PipeInstructions, and executes each instruction through its class-level _INSTRUCTION_MAP:
instruction class -> engine method, called as `MethodType(self._INSTRUCTION_MAP[type(cmd)],
self)(**cmd.kwargs)`. instrument() gives one engine a map of its own (an instance attribute, so
other engines and the class are untouched) whose methods time each instruction as an op of the
open step through the collector's op scopes (device events too on a GPU) and call DeepSpeed's:

| instruction | op |
|---|---|
| LoadMicroBatch | data-loading |
| ForwardPass | forward-compute |
| BackwardPass | backward-compute |
| SendActivation, RecvActivation | forward-send, forward-recv |
| SendGrad, RecvGrad | backward-send, backward-recv |
| ReduceGrads | grads-all-reduce |
| ReduceTiedGrads | embedding-grads-all-reduce, on stages that hold tied weights (the embeddings shared by the first and last stage); elsewhere not recorded |
| OptimizerStep | optimizer |

Microbatch: an instruction names a pipeline buffer (buffer_id), which the schedule reuses
(micro-batch id modulo the buffers). Forwards run the microbatches in order, so the n-th
ForwardPass of a batch is microbatch n; LoadMicroBatch and RecvActivation fill the buffer of the
next forward; SendActivation, RecvGrad, BackwardPass and SendGrad act on the microbatch whose
forward last used their buffer (DeepSpeed sends a buffer before it refills it). Model chunk: 0
(DeepSpeed's pipeline has one chunk a stage).

Steps: train_batch() is a step (opened around it when the script has none open); eval_batch()
records nothing. The layout comes from the engine's grid (PipelineParallelGrid): data-parallel
id and size, stage id and pipeline size, the slice (tensor) parallel rank and size; a layout given
to init() wins. pause() takes the map off; close() leaves it, recording nothing.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rankwatch import layout as _layout
from rankwatch import torch_hooks as _hooks

if TYPE_CHECKING:
    from rankwatch.collector import Collector

_log = logging.getLogger("rankwatch")

# Instruction class name -> op.
INSTRUCTION_OPS: dict[str, str] = {
    "LoadMicroBatch": "data-loading",
    "ForwardPass": "forward-compute",
    "BackwardPass": "backward-compute",
    "SendActivation": "forward-send",
    "RecvActivation": "forward-recv",
    "SendGrad": "backward-send",
    "RecvGrad": "backward-recv",
    "ReduceGrads": "grads-all-reduce",
    "ReduceTiedGrads": "embedding-grads-all-reduce",
    "OptimizerStep": "optimizer",
}
# Instructions that fill a buffer for the next forward, and those acting on a buffer's microbatch.
_NEXT_FORWARD = frozenset(("LoadMicroBatch", "RecvActivation"))
_BUFFER_MICROBATCH = frozenset(("SendActivation", "RecvGrad", "BackwardPass", "SendGrad"))


def layout_of(grid: Any) -> _layout.Layout:
    """The rank's place as a DeepSpeed PipelineParallelGrid says it."""
    return _layout.Layout(
        data_rank=int(grid.get_data_parallel_rank()), data_size=int(grid.get_data_parallel_world_size()),
        pipeline_rank=int(grid.get_stage_id()), pipeline_size=int(grid.get_pipe_parallel_world_size()),
        tensor_rank=int(grid.get_slice_parallel_rank()), tensor_size=int(grid.get_slice_parallel_world_size()))


class DeepSpeedOps:
    """One engine's instrumentation: its instruction map, train_batch and eval_batch wrappers,
    and the microbatch labels of the batch in progress."""

    def __init__(self, collector: Collector, engine: Any) -> None:
        self._rw = collector
        self.engine = engine
        self._forwards = 0
        self._buffers: dict[int, int] = {}  # buffer id -> the microbatch last forwarded in it
        self._eval = False
        try:
            tied = bool(engine.module.get_tied_weights_and_groups())
        except Exception:  # pylint: disable=broad-except  # no PipelineModule: nothing tied
            tied = False
        self._record_tied = tied
        self.attachment = _hooks.Attachment(self._install)

    def label(self, instruction: str, buffer_id: object) -> int:
        """The microbatch an instruction acts on (and the state it moves)."""
        if instruction == "ForwardPass":
            mb = self._forwards
            self._forwards += 1
            if isinstance(buffer_id, int):
                self._buffers[buffer_id] = mb
            return mb
        if instruction in _NEXT_FORWARD:
            if isinstance(buffer_id, int):
                self._buffers[buffer_id] = self._forwards
            return self._forwards
        if instruction in _BUFFER_MICROBATCH and isinstance(buffer_id, int):
            return self._buffers.get(buffer_id, 0)
        return 0

    def _timed(self, instruction: str, op: str, method: Callable[..., Any]) -> Callable[..., Any]:
        rw = self._rw

        def timed(engine: Any, **kwargs: Any) -> Any:
            if self._eval or rw.paused or (instruction == "ReduceTiedGrads" and not self._record_tied):
                return method(engine, **kwargs)
            mb = self.label(instruction, kwargs.get("buffer_id"))
            with rw.op(op, microbatch=mb):
                return method(engine, **kwargs)
        timed.__name__ = getattr(method, "__name__", "timed")
        timed.__wrapped__ = method  # type: ignore[attr-defined]
        return timed

    def _install(self) -> Callable[[], None]:
        engine = self.engine
        rw = self._rw
        base = type(engine)._INSTRUCTION_MAP
        timed_map = {}
        for cls, method in base.items():
            op = INSTRUCTION_OPS.get(cls.__name__)
            timed_map[cls] = method if op is None else self._timed(cls.__name__, op, method)
        train_batch, eval_batch = engine.train_batch, engine.eval_batch

        def timed_train_batch(*args: Any, **kwargs: Any) -> Any:
            self._forwards, self._buffers = 0, {}
            if rw._in_step or rw.paused:
                return train_batch(*args, **kwargs)
            with rw.step():
                return train_batch(*args, **kwargs)

        def untimed_eval_batch(*args: Any, **kwargs: Any) -> Any:
            self._eval = True
            try:
                return eval_batch(*args, **kwargs)
            finally:
                self._eval = False

        saved = {name: engine.__dict__[name] for name in ("_INSTRUCTION_MAP", "train_batch", "eval_batch")
                 if name in engine.__dict__}
        engine._INSTRUCTION_MAP = timed_map
        engine.train_batch = timed_train_batch
        engine.eval_batch = untimed_eval_batch

        def detach() -> None:
            for name in ("_INSTRUCTION_MAP", "train_batch", "eval_batch"):
                if name in saved:
                    setattr(engine, name, saved[name])
                else:
                    engine.__dict__.pop(name, None)
        return detach


def instrument(collector: Collector, engine: Any) -> DeepSpeedOps:
    """Records `engine`'s pipeline instructions into `collector` (rw.instrument_deepspeed) and
    takes the layout from its grid (unless init() was given one)."""
    if not hasattr(type(engine), "_INSTRUCTION_MAP"):
        raise TypeError("rankwatch.instrument_deepspeed: %s is no DeepSpeed PipelineEngine (it has no "
                        "_INSTRUCTION_MAP)" % type(engine).__name__)
    grid = getattr(engine, "grid", None)
    if grid is not None and collector.layout_source != "argument":
        try:
            found = layout_of(grid)
            collector.set_layout(found)
            collector.layout_source = "deepspeed"
            _log.info("rankwatch: parallel layout from DeepSpeed's grid: %s", found)
        except (ValueError, AttributeError, TypeError) as e:
            _log.warning("rankwatch: no parallel layout from DeepSpeed's grid: %s", e)
    collector.set_training_strategy("deepspeed_pipeline", sharded=False)
    ops = DeepSpeedOps(collector, engine)
    collector._attach(ops.attachment)
    if not collector.paused:
        ops.attachment.on()
    return ops
