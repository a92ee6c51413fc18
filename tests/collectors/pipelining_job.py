#!/usr/bin/python3
"""A real pipeline x data parallel job on torch.distributed.pipelining (gloo on CPU), recorded by
rankwatch with one call (`rw.instrument_pipeline(schedule)`, --instrument adapter) or by hand
(--instrument manual: the script wraps the stage's methods and the schedule's transfers itself
with rw.op scopes and opens rw.step(), for comparison).

4 processes = 2 pipeline ranks x 2 data-parallel replicas. Process groups from a DeviceMesh
(--groups mesh, dims ("dp", "pp"): rank = data rank x 2 + pipeline rank) or from
dist.new_group (--groups new_group: rank = pipeline rank x 2 + data rank, Megatron's order).
Each replica runs a pipeline of torch's own schedule over --microbatches microbatches; after
schedule.step() each rank all-reduces its stages' gradients across the replicas (the stage's
data-parallel group), and steps Adam.

One launch runs several cases one after the other (--case SCHEDULE:FAULT[:INSTRUMENT],
repeatable), each a rankwatch job of its own (--job PREFIX: PREFIX-SCHEDULE-FAULT-INSTRUMENT),
with its own stages, schedule and optimizer; the ranks pass a barrier between cases. INSTRUMENT
both: the adapter and the script's own scopes record the same run at once, into two collectors
of the process and two jobs (PREFIX-SCHEDULE-FAULT-both, PREFIX-SCHEDULE-FAULT-manual):

| schedule | torch | stages per rank |
|---|---|---|
| 1f1b | Schedule1F1B | 1 (2 stages) |
| interleaved | ScheduleInterleaved1F1B | 2, loop placement: rank r holds stages r and r + 2 |
| zb | ScheduleInterleavedZeroBubble (ZB1P: backward split into input "I" and weight "W") | 2, loop placement |
| zbv | ScheduleZBVZeroBubble | 2, V placement: rank r holds stages r and 3 - r |

| fault | what |
|---|---|
| balanced | none |
| slow | the worker (data rank, pipeline rank) of --slow-worker (1,0): its stages' device time x --slow-factor (1.5) |
| heavy | the stages of pipeline rank --heavy-stage (1) hold --heavy-factor (1.5) x the layers, on every replica |

The model is --layers (8) Linear + tanh layers of width --hidden, cut evenly over the stages.
Its compute is small; each layer's accelerator time is simulated with sleeps as the host thread
of a GPU job waits for its kernels (--device-ms per layer and microbatch forward, the same again
for the input-gradient part of the backward, and for the weight-gradient part): a full backward
is twice a forward, a zero-bubble schedule's I and W one forward each.

Before the collector starts, --warmup-steps steps run unrecorded (the first initialises the
stages). Each rank prints one JSON line at the end: per case, its job, layout, per-step seconds (wall
clock, and the training thread's CPU time) and collector stats. --pause-every N (benchmarks):
every other block of N steps runs under rw.pause(), without any instrumentation."""
import argparse
import gc
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B,
                                          ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble)
from torch.distributed.pipelining import schedules as torch_schedules

import rankwatch
import rankwatch.collector
import rankwatch.identity

SCHEDULES = {"1f1b": (Schedule1F1B, 1, "loop"), "interleaved": (ScheduleInterleaved1F1B, 2, "loop"),
             "zb": (ScheduleInterleavedZeroBubble, 2, "loop"), "zbv": (ScheduleZBVZeroBubble, 2, "v")}
FAULTS = ("balanced", "slow", "heavy")
PP, DP = 2, 2


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job", default="pipelining", help="job id prefix")
    p.add_argument("--brokers", default=None)
    p.add_argument("--steps", type=int, default=20, help="recorded steps per case")
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--case", action="append", default=[], metavar="SCHEDULE:FAULT[:INSTRUMENT]")
    p.add_argument("--instrument", choices=("adapter", "manual", "both", "none"), default="adapter",
                   help="for cases that do not say: rankwatch's adapter, by hand, both at once (two jobs, "
                        "PREFIX-...-both and PREFIX-...-manual, over the same run), or no collector")
    p.add_argument("--groups", choices=("mesh", "new_group"), default="mesh")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--microbatch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=8)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--layers", type=int, default=8, help="layers of the whole model")
    p.add_argument("--device-ms", type=float, default=3.0)
    p.add_argument("--slow-worker", default="1,0", metavar="DP,PP")
    p.add_argument("--slow-factor", type=float, default=1.5)
    p.add_argument("--heavy-stage", type=int, default=1, metavar="PP")
    p.add_argument("--heavy-factor", type=float, default=1.5)
    p.add_argument("--flush-ms", type=int, default=10000,
                   help="the collectors' flush interval: with 10 s a short case reaches the daemon at its "
                        "end, judged once over all its steps")
    p.add_argument("--pause-every", type=int, default=0,
                   help="benchmark: every other block of N steps runs under rw.pause() (no instrumentation)")
    return p.parse_args()


class DeviceTime(torch.autograd.Function):
    """Identity whose backward sleeps `seconds`: the accelerator time of a backward part."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


class StageModule(nn.Module):
    """`layers` Linear + tanh layers. The first stage scales its input by a learned vector (its
    input then needs a gradient, as after an embedding). Forward sleeps layers x device time;
    the backward's input-gradient path and its weight-gradient path (a node on the first
    layer's weight: only the weight gradients need it) sleep the same each."""

    def __init__(self, layers, hidden, first, device_s):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(hidden)) if first else None
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))
        self.device_s = device_s * layers

    def forward(self, x):
        if self.scale is not None:
            x = x * self.scale
        x = DeviceTime.apply(x, self.device_s)
        weight = DeviceTime.apply(self.blocks[0].weight, self.device_s)
        x = torch.tanh(F.linear(x, weight, self.blocks[0].bias))
        for block in self.blocks[1:]:
            x = torch.tanh(block(x))
        time.sleep(self.device_s)
        return x


def local_stage_indices(kind, rank):
    _, n_local, style = SCHEDULES[kind]
    if n_local == 1:
        return [rank]
    if style == "v":
        return [rank, 2 * PP - 1 - rank]
    return [rank + k * PP for k in range(n_local)]


class Case:
    """One case's stages, schedule and optimizer on this rank."""

    def __init__(self, args, kind, fault, pp_rank, data_rank, pp_group):
        cls, n_local, _ = SCHEDULES[kind]
        self.num_stages = PP * n_local
        base = args.layers // self.num_stages
        slow = tuple(int(v) for v in args.slow_worker.split(","))
        factor = args.slow_factor if fault == "slow" and (data_rank, pp_rank) == slow else 1.0
        self.layers = round(base * args.heavy_factor) if fault == "heavy" and pp_rank == args.heavy_stage else base
        self.indices = local_stage_indices(kind, pp_rank)
        self.modules, self.stages = [], []
        for index in self.indices:
            torch.manual_seed(1000 + index)  # the same parameters on every replica
            module = StageModule(self.layers, args.hidden, index == 0, args.device_ms / 1e3 * factor)
            self.modules.append(module)
            self.stages.append(PipelineStage(module, index, self.num_stages, torch.device("cpu"), group=pp_group))
        self.has_first = 0 in self.indices
        self.has_last = self.num_stages - 1 in self.indices
        self.schedule = cls(self.stages if n_local > 1 else self.stages[0], args.microbatches, loss_fn=F.mse_loss)
        self.params = [p for m in self.modules for p in m.parameters()]
        self.optimizer = torch.optim.Adam(self.params, lr=1e-3)


def iteration(case, args, data, dp_group):
    """One training step: the pipeline schedule, the gradient all-reduce across replicas, Adam."""
    n = args.microbatches * args.microbatch_size
    x = torch.randn(n, args.seq_len, args.hidden, generator=data)
    target = torch.tanh(x.flip(-1))
    inputs = (x,) if case.has_first else ()
    kwargs = {"target": target, "losses": []} if case.has_last else {}
    case.schedule.step(*inputs, **kwargs)
    flat = torch.cat([p.grad.reshape(-1) for p in case.params])
    dist.all_reduce(flat, group=dp_group)
    flat /= DP
    offset = 0
    for p in case.params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
    case.optimizer.step()
    case.optimizer.zero_grad(set_to_none=True)


class ByHand:
    """The ops rw.instrument_pipeline records, recorded by the script itself: its own wrappers
    of the stages' methods (an op scope around each compute; the last stage's forward up to its
    loss) and of the schedule module's two transfer functions (a receive over its wait, a send
    over its post, both over post and wait when the schedule waits at once), and an op scope
    around optimizer.step."""

    def __init__(self, rw, case):
        self.rw, self.case = rw, case
        self.undo = []
        self.pending = None  # (stage, microbatch, chunk, start ns) of a forward awaiting its loss
        self.last_post = None
        self.posted = {}  # id(batch) -> (batch, labels, post start, post end), until its wait
        chunks = {id(s): i for i, s in enumerate(sorted(case.stages, key=lambda s: s.stage_index))}
        for stage in case.stages:
            chunk = chunks[id(stage)]
            self.patch(stage, "forward_one_chunk", self.forward(stage, chunk))
            self.patch(stage, "backward_one_chunk", self.compute("backward-compute", chunk))
            self.patch(stage, "backward_weight_one_chunk", self.compute("backward-weight-compute", chunk))
            for name, op in (("get_fwd_send_ops", "forward-send"), ("get_fwd_recv_ops", "forward-recv"),
                             ("get_bwd_send_ops", "backward-send"), ("get_bwd_recv_ops", "backward-recv")):
                self.patch(stage, name, self.tagger(op, chunk))
        self.patch(case.schedule, "_maybe_compute_loss", self.loss)
        self.patch(case.optimizer, "step", self.optimizer)
        self.patch(torch_schedules, "_batch_p2p", self.post)
        self.patch(torch_schedules, "_wait_batch_p2p", self.wait)

    def patch(self, obj, name, make):
        before = getattr(obj, name)
        own = obj.__dict__.get(name)  # the adapter's wrapper, when it records the same job too
        setattr(obj, name, make(before))
        self.undo.append(lambda: setattr(obj, name, before) if obj is torch_schedules or own is not None
                         else obj.__dict__.pop(name))

    def remove(self):
        for u in reversed(self.undo):
            u()

    def forward(self, stage, chunk):
        def make(method):
            def wrapper(mb, *args, **kwargs):
                t0 = rankwatch.collector.now_ns()
                out = method(mb, *args, **kwargs)
                if stage.is_last:
                    self.pending = (mb, chunk, t0)
                else:
                    self.rw.add_op("forward-compute", t0, rankwatch.collector.now_ns(), mb, chunk)
                self.last_post = None
                return out
            return wrapper
        return make

    def loss(self, method):
        def wrapper(*args, **kwargs):
            out = method(*args, **kwargs)
            if self.pending is not None:
                mb, chunk, t0 = self.pending
                self.pending = None
                self.rw.add_op("forward-compute", t0, rankwatch.collector.now_ns(), mb, chunk)
            return out
        return wrapper

    def compute(self, name, chunk):
        def make(method):
            def wrapper(mb, *args, **kwargs):
                with self.rw.op(name, microbatch=mb, chunk=chunk):
                    out = method(mb, *args, **kwargs)
                self.last_post = None
                return out
            return wrapper
        return make

    def tagger(self, name, chunk):
        def make(method):
            def wrapper(mb, *args, **kwargs):
                ops = method(mb, *args, **kwargs)
                for p in ops:
                    p.by_hand = (name, mb, chunk)
                return ops
            return wrapper
        return make

    def post(self, method):
        def wrapper(ops, *args, **kwargs):
            labels = [label for label in dict.fromkeys(getattr(p, "by_hand", None) for p in ops) if label]
            t0 = rankwatch.collector.now_ns()
            works = method(ops, *args, **kwargs)
            if labels:  # the batch object itself goes on to its wait (the adapter's, when it records too)
                self.posted[id(works)] = (works, labels, t0, rankwatch.collector.now_ns())
                self.last_post = works
            return works
        return wrapper

    def wait(self, method):
        def wrapper(works, *args, **kwargs):
            posted = self.posted.pop(id(works), None)
            if posted is None or posted[0] is not works:
                return method(works, *args, **kwargs)
            _, labels, p0, p1 = posted
            at_once, self.last_post = self.last_post is works, None
            t0 = p0 if at_once else rankwatch.collector.now_ns()
            out = method(works, *args, **kwargs)
            t1 = rankwatch.collector.now_ns()
            for name, mb, chunk in labels:
                if name.endswith("send") and not at_once:
                    self.rw.add_op(name, p0, p1, mb, chunk)
                else:
                    self.rw.add_op(name, t0, t1, mb, chunk)
            return out
        return wrapper

    def optimizer(self, method):
        def wrapper(*args, **kwargs):
            with self.rw.op("optimizer"):
                return method(*args, **kwargs)
        return wrapper


def main():
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == PP * DP, "4 processes"
    if args.groups == "mesh":
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (DP, PP), mesh_dim_names=("dp", "pp"))
        data_rank, pp_rank = divmod(rank, PP)
        pp_group, dp_group = mesh.get_group("pp"), mesh.get_group("dp")
    else:
        pp_rank, data_rank = divmod(rank, DP)
        dp_groups = [dist.new_group([s * DP + d for d in range(DP)]) for s in range(PP)]
        pp_groups = [dist.new_group([s * DP + d for s in range(PP)]) for d in range(DP)]
        pp_group, dp_group = pp_groups[data_rank], dp_groups[pp_rank]
    cases = []
    for spec in args.case or ["interleaved:balanced"]:
        parts = spec.split(":")
        kind, fault = parts[0], parts[1] if len(parts) > 1 else "balanced"
        if kind not in SCHEDULES or fault not in FAULTS:
            raise SystemExit("unknown case %r: schedules %s, faults %s" % (spec, ", ".join(SCHEDULES), ", ".join(FAULTS)))
        cases.append((kind, fault, parts[2] if len(parts) > 2 else args.instrument))

    results = []
    for kind, fault, instrument in cases:
        job = "%s-%s-%s-%s" % (args.job, kind, fault, instrument)
        case = Case(args, kind, fault, pp_rank, data_rank, pp_group)
        data = torch.Generator().manual_seed(data_rank)
        for _ in range(args.warmup_steps):
            iteration(case, args, data, dp_group)
        hand = hand_rw = None
        layout = rankwatch.Layout(data_rank=data_rank, data_size=DP, pipeline_rank=pp_rank, pipeline_size=PP,
                                  virtual_stages=len(case.stages))
        if instrument in ("adapter", "both"):
            rw = rankwatch.init(job=job, brokers=args.brokers, flush_interval_ms=args.flush_ms)
            rw.instrument_pipeline(case.schedule)
            rw.instrument_optimizer(case.optimizer)
        elif instrument == "manual":
            rw = rankwatch.init(job=job, brokers=args.brokers, flush_interval_ms=args.flush_ms, layout=layout)
        else:
            rw = rankwatch.init(enabled=False)
        if instrument == "both":
            # The same run recorded by hand too, into a collector of its own (a job of its own),
            # its wrappers around the adapter's: both see the same calls.
            hand_rw = rankwatch.collector.Collector(
                job[:-len("both")] + "manual", args.brokers, layout=layout, watch_gc=False, control_topic="",
                flush_interval_ms=args.flush_ms, **rankwatch.identity.detect())
        elif instrument == "manual":
            hand_rw = rw
        if hand_rw is not None:
            hand = ByHand(hand_rw, case)
        # What the set-up made stays out of the collections while the case runs: GC pauses of
        # a few ms, not the ~100 ms of a full collection over torch's objects (after init(): a
        # frozen DeviceMesh is out of gc.get_objects(), where rankwatch looks for it).
        gc.collect()
        gc.freeze()
        step_seconds, cpu_seconds, paused = [], [], []
        for step in range(args.steps):
            pause = args.pause_every > 0 and (step // args.pause_every) % 2 == 1
            if pause and not rw.paused:
                rw.pause()  # the adapter's wrappers come off: no instrumentation at all
            elif not pause and rw.paused:
                rw.resume()
            t0, c0 = time.perf_counter(), time.thread_time()
            if hand is not None and not pause:
                with hand.rw.step():
                    iteration(case, args, data, dp_group)
            else:
                iteration(case, args, data, dp_group)
            step_seconds.append(time.perf_counter() - t0)
            cpu_seconds.append(time.thread_time() - c0)
            paused.append(pause)
        if hand is not None:
            hand.remove()  # first: its wrappers sit around the adapter's
        recorded = [(rw, job, instrument)]
        if hand_rw is not None and hand_rw is not rw:
            recorded.append((hand_rw, hand_rw.job, "manual"))
        for collector, name, how in recorded:
            result = {"job": name, "schedule": kind, "fault": fault, "instrument": how,
                      "layers": case.layers, "stages": case.indices,
                      "layout": None if collector.layout is None else collector.layout.as_dict(),
                      "layout_source": collector.layout_source, "median_step_s": statistics.median(step_seconds),
                      "step_seconds": step_seconds, "cpu_seconds": cpu_seconds, "paused": paused,
                      "collector": collector.stats()}
            collector.close()
            results.append(result)
        gc.unfreeze()
        dist.barrier()
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "data_rank": data_rank, "pipeline_rank": pp_rank, "pid": os.getpid(),
                      "cases": results}), flush=True)


if __name__ == "__main__":
    main()
