#!/usr/bin/python3
"""A complete PyTorch DDP training script instrumented with rankwatch (gloo on CPU, so it runs
anywhere; on GPUs use backend nccl and move the model and batches to cuda:LOCAL_RANK).

    RANKWATCH_BROKERS=127.0.0.1:9092 torchrun --standalone --nproc_per_node 4 ddp_example.py

rankwatch.init() then names the job after torchrun's run id ("torchrun-<id>"; under Slurm
"slurm-<SLURM_JOB_ID>", on Kubernetes "<namespace>/<owner>") and logs what it picked; --job
and --brokers (or $RANKWATCH_JOB, $RANKWATCH_BROKERS) say it explicitly. Under srun without
torchrun, the script maps Slurm's task ids to RANK/WORLD_SIZE/LOCAL_RANK for
torch.distributed, as Slurm training scripts do; MASTER_ADDR and MASTER_PORT must be set.
Or start the processes yourself with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
set, as torchrun does. rankwatchd then diagnoses the job: `rankwatch diagnose --job JOB`.

The lines that concern rankwatch are marked `# rankwatch`. `--no-rankwatch` runs the same loop
uninstrumented (for overhead comparisons). The `--fault-*` options inject the faults the
acceptance tests (tests/collectors/) expect rankwatch to diagnose; a real job has none. They
live in the class `Faults` at the end of the file; the lines of the loop that call it are
marked `# fault injection` and do nothing without a --fault-* option.
At the end each rank prints one JSON line: rank, steps, median step seconds, CPU seconds
per step (all threads, after 10 warm-up steps), collector stats, whether each step was
recorded (--pause-random), and what the faults really took, as measured: each gc.collect() of
--fault-gc-rank (seconds), each stall of --fault-stall-rank and each step's cost of
--fault-drift-rank ([step, seconds] pairs).
"""
import argparse
import gc
import json
import os
import random
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import rankwatch  # rankwatch


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job", default=None, help="training job id (default: what rankwatch.init() picks)")
    p.add_argument("--brokers", default=None, help="Kafka brokers (default: $RANKWATCH_BROKERS)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--width", type=int, default=128, help="width of the model's wide activation")
    p.add_argument("--input-ms", type=float, default=5.0,
                   help="per-batch input pipeline cost (decode/IO), simulated with a sleep")
    p.add_argument("--device-ms", type=float, default=0.0,
                   help="per-step accelerator time, simulated with sleeps, half in forward and half "
                        "in backward, as the host thread of a GPU job waits for its kernels")
    p.add_argument("--no-rankwatch", action="store_true", help="run without the collector")
    p.add_argument("--pause-random", type=int, default=None, metavar="SEED",
                   help="pause the collector (rw.pause()) for a random half of the steps, the "
                        "same steps on every rank (for overhead measurements within one run: "
                        "benchmarks/collector_overhead.py --interleave)")
    p.add_argument("--fault-slow-compute-rank", type=int, default=-1)
    p.add_argument("--fault-slow-compute", type=float, default=0.3,
                   help="extra compute time of that rank, as a fraction of its own compute "
                        "(spent at the end of its backward pass)")
    p.add_argument("--fault-slow-input-rank", type=int, default=-1)
    p.add_argument("--fault-slow-input-ms", type=float, default=30.0)
    p.add_argument("--fault-keep-losses", action="store_true",
                   help="every rank keeps its loss tensors with their graphs (a memory leak)")
    p.add_argument("--fault-extra-matmul-rank", type=int, default=-1,
                   help="this rank multiplies two --fault-extra-matmul-size square matrices in "
                        "its forward pass, a real extra matrix product (not a sleep)")
    p.add_argument("--fault-extra-matmul-size", type=int, default=320)
    p.add_argument("--fault-slow-rank", type=int, default=-1,
                   help="this rank spends --fault-slow-ms more per step, where --fault-slow-where says")
    p.add_argument("--fault-slow-ms", type=float, default=20.0)
    p.add_argument("--fault-slow-where", choices=("between", "autograd", "optimizer"),
                   default="between",
                   help="between: host code between forward and backward; autograd: the backward "
                        "of a custom autograd op applied to the model's output (before the "
                        "gradient reaches the model); optimizer: inside optimizer.step")
    p.add_argument("--fault-leak-mib-per-step", type=float, default=0.0, metavar="MIB",
                   help="every rank keeps a tensor a step with its graph, whose saved tensors "
                        "hold about MIB MiB (the kept.append(out) bug)")
    p.add_argument("--fault-leak-rank", type=int, default=-1, metavar="RANK",
                   help="only this rank leaks --fault-leak-mib-per-step (rank-0-only logging or "
                        "evaluation code that keeps its tensors); default: every rank")
    p.add_argument("--fault-warmup-steps", type=int, default=0, metavar="N",
                   help="every rank's memory grows --fault-warmup-mib-per-step MiB a step for the "
                        "first N steps (a cache filling once), then stays flat")
    p.add_argument("--fault-warmup-mib-per-step", type=float, default=0.0, metavar="MIB")
    p.add_argument("--fault-gc-rank", type=int, default=-1,
                   help="this rank's step leaves a reference cycle, and every --fault-gc-every "
                        "steps the rank runs gc.collect() to free them: a full collection, a "
                        "pause of tens of milliseconds or more")
    p.add_argument("--fault-gc-every", type=int, default=5, metavar="N")
    p.add_argument("--fault-stall-rank", type=int, default=-1, metavar="RANK",
                   help="this rank writes a synchronous checkpoint (torch.save of the model's and "
                        "optimizer's state to a file, fsynced) at the end of every "
                        "--fault-stall-every-th step, after optimizer.step and inside the step: "
                        "a periodic stall, padded with a sleep to --fault-stall-ms in all; each "
                        "stall as measured is in the final JSON line (stall_fault)")
    p.add_argument("--fault-stall-every", type=int, default=10, metavar="N")
    p.add_argument("--fault-stall-ms", type=float, default=250.0, metavar="MS")
    p.add_argument("--fault-drift-rank", type=int, default=-1, metavar="RANK",
                   help="this rank's end of step runs a logging helper that rescans the whole "
                        "loss history it keeps (statistics of every loss so far), padded with a "
                        "sleep to --fault-drift-ms-per-step x the steps since the fault began: a "
                        "cost that grows step over step from 0 (a drift); each step's cost as "
                        "measured is in the final JSON line (drift_fault)")
    p.add_argument("--fault-drift-ms-per-step", type=float, default=0.5, metavar="MS")
    p.add_argument("--fault-from-step", type=int, default=0, metavar="STEP",
                   help="the stall and the drift begin at this step (0-based, rankwatch's step "
                        "number): the first stall ends step STEP + N - 1, the drift costs 0 at "
                        "step STEP")
    p.add_argument("--collector-option", action="append", default=[], metavar="KEY=INT",
                   help="rankwatch.init buffer option, e.g. max_pending_bytes=65536")
    return p.parse_args()


class SlowInput:
    """collate_fn with an input pipeline cost (a sleep standing for decode and IO)."""

    def __init__(self, ms):
        self.seconds = ms / 1000.0

    def __call__(self, samples):
        time.sleep(self.seconds)
        xs, ys = zip(*samples)
        return torch.stack(xs), torch.stack(ys)


class SleepInBackward(torch.autograd.Function):
    """Identity whose backward sleeps when the gradient reaches it (accelerator time)."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


class Net(nn.Module):
    """Small in parameters and FLOPs, wide in activations (batch x 64 x width floats kept for
    backward), so that a leaked graph is visible in memory without slow matrix products.
    `device_seconds` per step stand for accelerator time (see --device-ms)."""

    def __init__(self, width, slow_fraction=0.0, device_seconds=0.0, extra_matmul=0):
        super().__init__()
        # fault injection: the operands of an extra matrix product in forward (not parameters)
        self.extra = torch.randn(extra_matmul, extra_matmul) if extra_matmul > 0 else None
        self.inp = nn.Linear(16, 64)
        self.scale = nn.Parameter(torch.randn(64, width) * 0.1)
        self.out = nn.Linear(64, 1)
        self.slow_fraction = slow_fraction
        self.device_seconds = device_seconds
        self.forward_seconds = []

    def forward(self, x):
        t0 = time.perf_counter()
        h = torch.relu(self.inp(x))
        if self.extra is not None:
            # fault injection: a wasted matrix product, as a user's leftover debug code might do
            h = h + torch.mm(self.extra, self.extra).mean() * 0
        if self.slow_fraction > 0 and len(self.forward_seconds) > 3:
            # The slow rank's extra time: fraction x (forward + backward; backward costs about
            # as much as forward here), spent when the gradient reaches h, at the end of the
            # backward pass. Its CPU work thus runs at the same time as the other ranks', as in
            # a job with one accelerator per rank; extra time spent earlier would let it
            # compute alone on a machine whose cores the ranks share, hiding half of it.
            extra = self.slow_fraction * 2 * statistics.median(self.forward_seconds[-20:])
            h = SleepInBackward.apply(h, extra)
        wide = torch.tanh(h.unsqueeze(-1) * self.scale)
        out = self.out(wide.mean(-1))
        if self.device_seconds > 0:
            time.sleep(self.device_seconds / 2)
            out = SleepInBackward.apply(out, self.device_seconds / 2)
        self.forward_seconds.append(time.perf_counter() - t0)
        return out


def main():
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:  # srun without torchrun
        os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_NTASKS"],
                          LOCAL_RANK=os.environ.get("SLURM_LOCALID", "0"))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    options = {k: int(v) for k, v in (o.split("=", 1) for o in args.collector_option)}
    rw = rankwatch.init(job=args.job, brokers=args.brokers,  # rankwatch
                        enabled=not args.no_rankwatch, **options)

    data = TensorDataset(torch.randn(args.batch * 64, 16), torch.randn(args.batch * 64, 1))
    input_ms = args.input_ms + (args.fault_slow_input_ms if rank == args.fault_slow_input_rank else 0)
    loader = DataLoader(data, batch_size=args.batch, sampler=DistributedSampler(data, seed=0),
                        collate_fn=SlowInput(input_ms), drop_last=True)
    slow = args.fault_slow_compute if rank == args.fault_slow_compute_rank else 0.0
    extra = args.fault_extra_matmul_size if rank == args.fault_extra_matmul_rank else 0
    model = DDP(Net(args.width, slow, args.device_ms / 1000.0, extra))
    rw.instrument_ddp(model)          # rankwatch: gradient synchronisation (collective)
    rw.instrument_module(model)       # rankwatch: forward and backward
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    faults = Faults(args, rank)
    faults.slow_optimizer(optimizer)  # fault injection (before rankwatch wraps optimizer.step)
    rw.instrument_optimizer(optimizer)  # rankwatch: optimizer.step
    loss_fn = nn.MSELoss()
    kept = []
    coin = random.Random(args.pause_random)

    step, step_seconds, step_ends, recorded, epoch = 0, [], [], [], 0
    last = time.perf_counter()
    while step < args.steps:
        loader.sampler.set_epoch(epoch)
        for x, y in rw.dataloader(loader):  # rankwatch: dataloader fetches
            recorded.append(not rw.paused)
            with rw.step():                  # rankwatch: one training step
                out = faults.slow_autograd(model(x))  # fault injection
                loss = loss_fn(out, y)
                faults.slow_between()                 # fault injection
                optimizer.zero_grad(set_to_none=True)
                loss.backward(retain_graph=args.fault_keep_losses)
                optimizer.step()
                if args.fault_keep_losses:
                    kept.append(loss)        # the bug: graphs (and activations) stay alive
                faults.grow_memory(out)               # fault injection
                faults.collect_cycles(loss)           # fault injection
                faults.end_of_step(step, loss, model, optimizer)  # fault injection
            now = time.perf_counter()  # whole iterations, dataloader fetch included
            step_seconds.append(now - last)
            step_ends.append(time.time())
            last = now
            step += 1
            if args.pause_random is not None:  # same seed, same steps on every rank
                (rw.pause if coin.random() < 0.5 else rw.resume)()
                last = time.perf_counter()  # the switch itself counts for neither side
            if step == 10:
                cpu_at_10 = time.process_time()  # every thread of this process, collector's too
            if step >= args.steps:
                break
        epoch += 1

    cpu_per_step = (time.process_time() - cpu_at_10) / (step - 10) if step > 10 else 0.0
    stats = rw.stats()
    rw.close()                                 # rankwatch: this rank ended cleanly
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "steps": step, "median_step_s": statistics.median(step_seconds),
                      "step_seconds": step_seconds, "step_end_unix": step_ends, "cpu_s_per_step": cpu_per_step,
                      "recorded": recorded, "gc_fault_seconds": faults.gc_seconds,
                      "stall_fault": faults.stalls, "drift_fault": faults.drifts,
                      "collector": stats}), flush=True)


# --- Fault injection (the --fault-* options): what the acceptance tests expect rankwatch to ---
# --- diagnose. A real job has none of this. -------------------------------------------------
class Faults:
    """The injected faults of one rank. Slowdowns are sleeps: the host thread of a GPU job
    waits for its kernels the same way, and sleeping ranks do not compete for the CPU cores
    that 4 ranks share on a small test machine."""

    def __init__(self, args, rank):
        slow = rank == args.fault_slow_rank and args.fault_slow_ms > 0
        self.slow_where = args.fault_slow_where if slow else None
        self.slow_seconds = args.fault_slow_ms / 1000.0
        leaks = args.fault_leak_rank < 0 or rank == args.fault_leak_rank
        self.leak_floats = int(args.fault_leak_mib_per_step * 2**20) // 4 if leaks else 0
        self.warmup_steps = args.fault_warmup_steps
        self.warmup_floats = int(args.fault_warmup_mib_per_step * 2**20) // 4
        self.steps = 0
        self.leaked = []  # the kept.append(out) bug's list
        self.cache = []   # the cache that fills during the first steps
        self.gc_every = args.fault_gc_every if rank == args.fault_gc_rank else 0
        self.gc_seconds = []  # each gc.collect() of --fault-gc-rank
        self.from_step = args.fault_from_step
        self.stall_every = args.fault_stall_every if rank == args.fault_stall_rank else 0
        self.stall_seconds = args.fault_stall_ms / 1000.0
        self.stalls = []  # [step, seconds] of each checkpoint of --fault-stall-rank, as measured
        self.drift_seconds = args.fault_drift_ms_per_step / 1000.0 if rank == args.fault_drift_rank else 0.0
        self.losses = []  # the loss history of --fault-drift-rank's logging helper
        self.log_line = ""
        self.drifts = []  # [step, seconds] of that helper each step, as measured

    def slow_between(self):
        """--fault-slow-where between: host code between forward and backward (outside every
        phase rankwatch measures)."""
        if self.slow_where == "between":
            time.sleep(self.slow_seconds)

    def slow_autograd(self, out):
        """--fault-slow-where autograd: a custom autograd op on the model's output whose
        backward is slow. It runs before the gradient reaches the model's output, so outside
        the backward phase rankwatch measures (which starts there)."""
        if self.slow_where == "autograd":
            return SleepInBackward.apply(out, self.slow_seconds)
        return out

    def slow_optimizer(self, optimizer):
        """--fault-slow-where optimizer: optimizer.step takes longer (wrapped here, before
        rankwatch wraps it, so the extra time is inside the optimizer phase)."""
        if self.slow_where != "optimizer":
            return
        step, seconds = optimizer.step, self.slow_seconds

        def slow_step(*args, **kwargs):
            result = step(*args, **kwargs)
            time.sleep(seconds)
            return result
        optimizer.step = slow_step

    def grow_memory(self, out):
        """--fault-leak-mib-per-step: a per-step metric computed from the model's output with
        autograd on and kept with its graph (`kept.append(metric)` where `metric.item()` was
        meant): the graph holds a fresh buffer of the given size, saved for a backward that
        never comes, so memory grows that much every step. --fault-warmup-*: a cache filled
        during the first steps, then left alone."""
        self.steps += 1
        if self.leak_floats > 0:
            weights = torch.ones(self.leak_floats)  # written, so resident
            # dot saves `weights` for its backward; the expanded mean is a view, no memory.
            metric = torch.dot(weights, out.mean().expand(self.leak_floats))
            self.leaked.append(metric)  # the bug: metric.item() was meant
        if self.warmup_floats > 0 and self.steps <= self.warmup_steps:
            self.cache.append(torch.ones(self.warmup_floats))

    def collect_cycles(self, loss):
        """--fault-gc-rank: a log record of the step that points to the step's loss record and
        back (a reference cycle: only the garbage collector frees it), and every N steps a
        gc.collect() to free them, as code that knows it makes cycles does. A full collection
        visits every object the process tracks (about 100k with torch loaded), whatever little
        garbage it finds: 60 ms on the 2-core test machine when idle, 200-300 ms when busy."""
        if self.gc_every <= 0:
            return
        record = {"loss": loss.item()}
        record["samples"] = {"step": self.steps, "record": record}
        del record
        if self.steps % self.gc_every == 0:
            t0 = time.perf_counter()
            gc.collect()
            self.gc_seconds.append(time.perf_counter() - t0)

    def end_of_step(self, step, loss, model, optimizer):
        """The end of step `step` (0-based), after optimizer.step and inside `rw.step()`, where
        training loops checkpoint and log: the step's time holds it, outside every measured
        phase. Records what each fault really took (the tests' ground truth)."""
        if step < self.from_step:
            return
        if self.stall_every > 0 and (step - self.from_step + 1) % self.stall_every == 0:
            t0 = time.perf_counter()
            self.checkpoint(step, model, optimizer)
            pad = self.stall_seconds - (time.perf_counter() - t0)
            if pad > 0:
                time.sleep(pad)  # a bigger model's checkpoint takes that much longer
            self.stalls.append([step, time.perf_counter() - t0])
        if self.drift_seconds > 0:
            t0 = time.perf_counter()
            self.losses.append(loss.item())
            # The rescan, whose cost grows with the history: a log line of running statistics.
            self.log_line = "step %d loss %.4f mean %.4f range %.4f" % (
                step, self.losses[-1], statistics.fmean(self.losses), max(self.losses) - min(self.losses))
            # Rescanning a few hundred floats takes microseconds; the sleep stands for a
            # history whose rescan costs drift_seconds more each step.
            pad = self.drift_seconds * (step - self.from_step) - (time.perf_counter() - t0)
            if pad > 0:
                time.sleep(pad)
            self.drifts.append([step, time.perf_counter() - t0])

    @staticmethod
    def checkpoint(step, model, optimizer):
        """--fault-stall-rank: a synchronous checkpoint, as `torch.save` on the training thread
        does: the model's and the optimizer's state written to a file and fsynced."""
        fd, path = tempfile.mkstemp(prefix="ddp_example_ckpt_", suffix=".pt")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save({"step": step, "model": model.state_dict(),
                            "optimizer": optimizer.state_dict()}, f)
                f.flush()
                os.fsync(f.fileno())
        finally:
            os.unlink(path)


if __name__ == "__main__":
    main()
