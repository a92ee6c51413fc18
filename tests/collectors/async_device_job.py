"""A data-parallel training job on an emulated asynchronous device (emulated_device.py), the
way a GPU job runs: one rank of a real gloo process group (RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set as torchrun sets them), a torch module whose forward and backward queue
kernels on the compute stream and return at once, DDP's gradient synchronisation as it runs on
a GPU (at the end of the backward pass an autograd callback queues the all-reduce on a
communication stream after the backward's kernels — gloo, run by that stream — and makes the
compute stream wait for it), an optimizer whose kernels follow, and `loss.item()`'s
synchronisation at the end of every step. The host's clock sees only launches and one long
wait; the device's sees the kernels and the all-reduce waiting for the slowest rank.

Instrumented as a user instruments a GPU DDP job (rw.instrument_ddp, rw.instrument_module,
rw.instrument_optimizer, rw.dataloader); nothing in the loop is timed by hand. Faults: --fault-compute-rank R
(R's kernels take --fault-compute-factor times as long: a compute straggler),
--fault-input-rank R (R's input pipeline takes --fault-input-ms more a batch: an input
straggler). --device-timing off records host time only. Prints one JSON line at the end."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd import Variable

import rankwatch
from emulated_device import Device


class Kernels(torch.autograd.Function):
    """x -> x, queueing `fwd_ms` of device time forward and `bwd_ms` backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, device: Device, fwd_ms: float, bwd_ms: float) -> torch.Tensor:
        device.launch(fwd_ms)
        ctx.device, ctx.bwd_ms = device, bwd_ms
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        ctx.device.launch(ctx.bwd_ms)
        return grad, None, None, None


class Model(torch.nn.Module):
    def __init__(self, device: Device, fwd_ms: float, bwd_ms: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1024))
        self.device, self.fwd_ms, self.bwd_ms = device, fwd_ms, bwd_ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Kernels.apply(x * self.weight, self.device, self.fwd_ms, self.bwd_ms)


class GradSync:
    """DDP's reducer on a GPU: once backward has computed the gradients (an autograd final
    callback, queued when the first gradient is ready, as DDP's is), every gradient's all-reduce
    is queued on the communication stream after the backward's kernels, and the compute stream
    waits for them; the host goes on."""

    def __init__(self, model: torch.nn.Module, device: Device) -> None:
        self.params, self.device, self.queued = list(model.parameters()), device, False
        for p in self.params:
            p.register_post_accumulate_grad_hook(self.grad_ready)

    def grad_ready(self, param: torch.Tensor) -> None:
        if not self.queued:
            self.queued = True
            Variable._execution_engine.queue_callback(self.finalize)

    def finalize(self) -> None:
        self.queued = False
        device = self.device
        backward_done = device.new_event()
        backward_done.record()
        device.comm.wait_event(backward_done)
        for p in self.params:
            device.comm.submit(lambda g=p.grad: dist.all_reduce(g))
        reduced = device.new_event()
        reduced.record(device.comm)
        device.compute.wait_event(reduced)


class Optimizer:
    """Queues `ms` of kernels on the compute stream (after the all-reduce, which the compute
    stream already waits for)."""

    def __init__(self, device: Device, ms: float) -> None:
        self.device, self.ms = device, ms

    def step(self) -> None:
        self.device.launch(self.ms)


def batches(input_ms: float):
    while True:
        time.sleep(input_ms / 1e3)  # the host's input pipeline (decode, augment, collate)
        yield torch.ones(1024)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True)
    p.add_argument("--brokers", required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--forward-ms", type=float, default=8.0)
    p.add_argument("--backward-ms", type=float, default=16.0)
    p.add_argument("--optimizer-ms", type=float, default=4.0)
    p.add_argument("--input-ms", type=float, default=4.0)
    p.add_argument("--device-timing", choices=("on", "off"), default="on")
    p.add_argument("--fault-compute-rank", type=int, default=-1)
    p.add_argument("--fault-compute-factor", type=float, default=1.3)
    p.add_argument("--fault-input-rank", type=int, default=-1)
    p.add_argument("--fault-input-ms", type=float, default=10.0)
    a = p.parse_args()
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    device = Device()
    rw = rankwatch.init(job=a.job, brokers=a.brokers, device="emulated:0",
                        device_timing=device.clock() if a.device_timing == "on" else False)
    factor = a.fault_compute_factor if rank == a.fault_compute_rank else 1.0
    input_ms = a.input_ms + (a.fault_input_ms if rank == a.fault_input_rank else 0.0)
    model = Model(device, a.forward_ms * factor, a.backward_ms * factor)
    GradSync(model, device)
    rw.instrument_ddp(model)
    rw.instrument_module(model)
    optimizer = rw.instrument_optimizer(Optimizer(device, a.optimizer_ms * factor))
    step_seconds = []
    step = 0
    warm = min(5, a.steps // 2)  # CPU per step counts from here
    cpu0 = time.process_time()
    for step, batch in enumerate(rw.dataloader(batches(input_ms))):
        if step == a.steps:
            break
        if step == warm:
            cpu0 = time.process_time()
        t0 = time.monotonic()
        with rw.step():
            model.zero_grad(set_to_none=True)
            loss = model(batch).sum()
            loss.backward()
            optimizer.step()
            device.synchronize()  # loss.item(): the host waits for the device
        step_seconds.append(time.monotonic() - t0)
    cpu_s_per_step = (time.process_time() - cpu0) / max(1, a.steps - warm)
    device.close()
    stats = rw.stats()
    rw.close()
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "steps": step, "median_step_s": statistics.median(step_seconds[warm:]),
                      "cpu_s_per_step": cpu_s_per_step, "collector": stats}))


if __name__ == "__main__":
    main()
