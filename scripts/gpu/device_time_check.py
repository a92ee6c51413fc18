#!/usr/bin/env python3
"""The GPU check of device time (docs/collectors.md, "Device time"): three 4-rank DDP jobs on
one GPU (several processes share it; gloo collectives on CUDA tensors) — balanced, a compute
straggler (rank 1's forward and backward apply 30 % more layers), an input straggler (rank 2's
input pipeline takes --input-straggler-ms more a batch) — timed by the collector's own hooks
(rankwatch.torch_hooks: instrument_module with DDP's synchronisation, instrument_optimizer) and
device clock (rankwatch.device_clock: CUDA events read back without waiting). Prints, per job
and rank, the host-timed against the device-timed phases, and writes each rank's step records
twice as JSON Lines, device-timed and host-timed:

    OUT/<job>/device/rank<R>.steps.jsonl   (clock STEP_CLOCK_DEVICE, host_phases beside)
    OUT/<job>/host/rank<R>.steps.jsonl     (the same steps on the host's clock)

rankwatch's verdicts come from replaying them into a daemon on a machine that has one:
scripts/gpu/replay_device_check.sh OUT.

Runs where the collector's native module cannot (a GPU machine with its own Python and torch,
no Kafka, nothing installed): it needs torch and this repository's collectors/python only, and
stands in for the native module with a recorder that writes the step records (the records'
layout is telemetry.proto's StepRecord in protobuf's JSON mapping). About 2 minutes on one GPU;
`--device cpu` runs the same jobs on the CPU (host time only) to try the whole path first.

    python3 scripts/gpu/device_time_check.py --out /tmp/device-check [--steps 60] [--device cuda]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
import types
from typing import Any

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PHASES = ("dataloader", "forward", "backward", "optimizer", "collective", "forward_backward")
# telemetry.proto's OpType numbers, kebab case (the names rankwatch._native.OP_TYPES has).
OP_TYPES = {"forward-compute": 1, "backward-compute": 2, "forward-send": 3, "forward-recv": 4,
            "backward-send": 5, "backward-recv": 6, "tensor-parallel": 7, "grads-reduce-scatter": 8,
            "params-all-gather": 9, "grads-all-reduce": 10, "layernorm-grads-all-reduce": 11,
            "embedding-grads-all-reduce": 12, "optimizer-clip-main-grad": 13, "optimizer": 14, "gc": 15,
            "data-loading": 16, "backward-weight-compute": 17}
JOBS = {"balanced": {}, "compute-straggler": {"compute_rank": 1}, "input-straggler": {"input_rank": 2}}


def load_collector_python() -> tuple[Any, Any]:
    """rankwatch.torch_hooks and rankwatch.device_clock from collectors/python, with a stand-in
    for the native module (its constants and clock; the hooks' recording goes to a Recorder)."""
    native = types.ModuleType("rankwatch._native")
    native.now_ns = time.monotonic_ns  # the native collector's clock: CLOCK_MONOTONIC
    for i, name in enumerate(PHASES):
        setattr(native, "PHASE_" + name.upper(), i)
    native.OP_TYPES = dict(OP_TYPES)
    package = types.ModuleType("rankwatch")
    package.__path__ = [os.path.join(REPO, "collectors", "python", "rankwatch")]
    sys.modules["rankwatch"], sys.modules["rankwatch._native"] = package, native
    import rankwatch.device_clock as device_clock
    import rankwatch.torch_hooks as torch_hooks
    return torch_hooks, device_clock


class Recorder:
    """What the hooks call on the native collector, writing each step, once its device times
    are in, as a device-timed and a host-timed StepRecord line."""

    def __init__(self, out: str, job: str, rank: int, world: int, device: str) -> None:
        self._files = {}
        for clock in ("device", "host"):
            os.makedirs(os.path.join(out, job, clock), exist_ok=True)
            self._files[clock] = open(os.path.join(out, job, clock, "rank%d.steps.jsonl" % rank), "w")
        self._who = {"rank": rank, "world_size": world, "node": socket.gethostname(), "device": device}
        self._host = [0] * len(PHASES)
        self._timed = 0
        self._ops = 0
        self._held: dict[int, dict[str, Any]] = {}
        self._step, self._t0 = 0, 0
        self.rows: list[dict[str, Any]] = []  # per step: host and device phases, ms

    def begin_step(self, step: int) -> None:
        self._step, self._t0 = step, time.monotonic_ns()

    def add_phase(self, phase: int, begin: int, end: int) -> None:
        self._host[phase] += max(0, end - begin)
        self._timed |= 1 << phase

    def add_op(self, op_type: int, microbatch: int, chunk: int, begin: int, end: int) -> int:
        self._ops += 1
        return self._ops - 1

    def expect_device_times(self) -> None:
        pass

    def end_step(self) -> None:
        now = time.monotonic_ns()
        self._held[self._step] = {"step": self._step, "step_time_ns": now - self._t0, "end_unix_ns": time.time_ns(),
                                  "host": {PHASES[i]: ns for i, ns in enumerate(self._host) if self._timed >> i & 1}}
        self._host, self._timed, self._ops = [0] * len(PHASES), 0, 0

    def set_device_times(self, step: int, phases: list[tuple[int, int]], ops: list[Any], missing: bool) -> bool:
        held = self._held.pop(step, None)
        if held is None:
            return False
        host = held.pop("host")
        device = {PHASES[p]: ns for p, ns in phases if PHASES[p] != "dataloader"}
        base = dict(held)
        host_record = dict(base, **{p + "_ns": ns for p, ns in host.items()})
        self._write("host", host_record)
        if missing or not device:
            self._write("device", dict(host_record, clock="STEP_CLOCK_DEVICE_MISSING" if missing else "STEP_CLOCK_HOST"))
        else:
            record = dict(host_record, **{p + "_ns": ns for p, ns in device.items()})
            record["clock"] = "STEP_CLOCK_DEVICE"
            record["host_phases"] = {p + "_ns": host[p] for p in device if p in host}
            self._write("device", record)
        self.rows.append({"step": step, "step_ms": held["step_time_ns"] / 1e6,
                          "host": {p: ns / 1e6 for p, ns in host.items()},
                          "device": {p: ns / 1e6 for p, ns in device.items()}, "missing": missing})
        return True

    def _write(self, clock: str, record: dict[str, Any]) -> None:
        self._files[clock].write(json.dumps(dict(self._who, record=record)) + "\n")

    def close(self) -> None:
        for f in self._files.values():
            f.close()


def run_rank(rank: int, world: int, port: int, a: argparse.Namespace, job: str, fault: dict[str, int],
             results: Any) -> None:
    import torch
    import torch.distributed as dist
    torch_hooks, device_clock = load_collector_python()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    device = torch.device("cuda:0" if a.device == "cuda" else "cpu")
    if a.device == "cuda":
        torch.cuda.set_device(0)
    else:
        torch.set_num_threads(1)
    width, layers, batch = (a.width, a.layers, a.batch) if a.device == "cuda" else (256, 6, 32)
    repeat = round(layers * 0.3) if fault.get("compute_rank") == rank else 0  # +30 % of the kernels

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))

        def forward(self, x: Any) -> Any:
            for layer in self.layers:
                x = torch.relu(layer(x))
            for layer in list(self.layers)[:repeat]:  # the straggler's extra kernels, same weights
                x = torch.relu(layer(x))
            return x

    rec = Recorder(a.out, job, rank, world, str(device))
    clock = device_clock.clock_for(str(device))
    timer = device_clock.DeviceTimer(clock) if clock is not None else None
    model = torch.nn.parallel.DistributedDataParallel(Net().to(device))
    torch_hooks.instrument_module(rec, model, compute=True, sync=True, timer=timer)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    torch_hooks.instrument_optimizer(rec, optimizer, timer=timer)
    input_ms = a.input_ms + (a.input_straggler_ms if fault.get("input_rank") == rank else 0.0)
    gate = torch_hooks.Gate()

    def batches() -> Any:
        while True:
            time.sleep(input_ms / 1e3)  # the host's input pipeline
            yield torch.randn(batch, width).to(device, non_blocking=True)

    loader = torch_hooks.timed_iter(rec, batches(), gate)
    for step in range(a.steps):
        x = next(loader)
        rec.begin_step(step)
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # where the host catches up with the device
        rec.end_step()
        if timer is not None:
            timer.end_step(step)
            for d in timer.poll():
                rec.set_device_times(d.step, d.phases, d.ops, d.missing)
        else:
            rec.set_device_times(step, [], [], False)
    if timer is not None:
        for d in timer.drain():
            rec.set_device_times(d.step, d.phases, d.ops, d.missing)
    rec.close()
    dist.destroy_process_group()
    results.put((rank, rec.rows[a.skip:], timer.steps_missing if timer else 0))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def print_job(job: str, rows_by_rank: dict[int, list[dict[str, Any]]], missing: dict[int, int]) -> None:
    print("\n== %s: per-step means, ms (host | device)" % job)
    print("rank %8s " % "step" + " ".join("%19s" % p for p in PHASES[:5]) + "  missing")
    for rank in sorted(rows_by_rank):
        rows = rows_by_rank[rank]

        def mean(clock: str, p: str) -> str:
            values = [r[clock][p] for r in rows if p in r[clock]]
            return "%8.2f" % statistics.mean(values) if values else "%8s" % "-"
        print("%4d %8.2f " % (rank, statistics.mean(r["step_ms"] for r in rows))
              + " ".join("%s |%s" % (mean("host", p), mean("device", p)) for p in PHASES[:5])
              + "  %d" % missing[rank])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="where the step records go")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the printed means")
    # Compute-heavy, parameter-light: each step all-reduces 4 x width^2 x layers bytes over gloo
    # (40 MB), while 4 ranks share the GPU's ~1 TFLOP a rank-step.
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=10)
    p.add_argument("--batch", type=int, default=16384)
    p.add_argument("--input-ms", type=float, default=5.0)
    p.add_argument("--input-straggler-ms", type=float, default=20.0)
    p.add_argument("--jobs", default=",".join(JOBS), help="which of %s" % ", ".join(JOBS))
    a = p.parse_args()
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    for job in a.jobs.split(","):
        t0 = time.monotonic()
        results = ctx.SimpleQueue()
        port = free_port()
        procs = [ctx.Process(target=run_rank, args=(r, a.world, port, a, job, JOBS[job], results))
                 for r in range(a.world)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=600)
            if proc.exitcode != 0:
                sys.exit("%s: a rank exited %s" % (job, proc.exitcode))
        rows, missing = {}, {}
        while not results.empty():
            rank, r, m = results.get()
            rows[rank], missing[rank] = r, m
        print_job(job, rows, missing)
        print("(%s: %.0f s)" % (job, time.monotonic() - t0))
    print("\nrecords in %s; verdicts: scripts/gpu/replay_device_check.sh %s" % (a.out, a.out))


if __name__ == "__main__":
    main()
