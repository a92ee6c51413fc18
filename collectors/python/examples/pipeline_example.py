#!/usr/bin/python3
"""A pipeline x data parallel PyTorch training script instrumented with rankwatch (gloo on
CPU, so it runs anywhere): the model is cut into --pipeline-stages stages; each data-parallel
replica runs its stages as a 1F1B pipeline (warm-up forwards, then one forward one backward,
then cool-down backwards, as Megatron-LM's non-interleaved schedule), sending activations to
the next stage and gradients to the previous one with torch.distributed send/recv; then each
stage all-reduces its gradients across its replicas, clips them by the global norm and steps
its optimizer.

    RANKWATCH_BROKERS=127.0.0.1:9092 torchrun --standalone --nproc_per_node 4 pipeline_example.py

4 processes = 2 stages x 2 data-parallel replicas. Rank = stage * replicas + data rank (the
order Megatron-core gives a data x pipeline layout): stage 0 holds ranks 0..dp-1.

rankwatch gets the rank's place in the layout (rankwatch.Layout) and one op scope around each
op of the schedule, named after the OSDI'25 what-if study's vocabulary (forward-compute,
forward-send, backward-recv, grads-all-reduce, optimizer-clip-main-grad, optimizer, ...) with
its microbatch; rankwatchd's what-if analysis replays them. The lines that concern rankwatch
are marked `# rankwatch`.

The `--fault-*` options inject what the acceptance tests (tests/collectors/test_pipeline_job.py)
expect rankwatch to diagnose; a real job has none. They live in the class `Faults` at the end
of the file; the lines that call it are marked `# fault injection`.

At the end each rank prints one JSON line: its coordinates, steps, per-step seconds, per-step
compute seconds (forward + backward; wall clock and the thread's CPU time), the sequence length
and global gradient norm of each step, and collector stats. --op-log DIR writes every op of
every step (name, microbatch, start and end, Unix ns) to DIR/rank<N>.json.
"""
import argparse
import gc
import json
import math
import os
import random
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import rankwatch  # rankwatch


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job", default=None, help="training job id (default: what rankwatch.init() picks)")
    p.add_argument("--brokers", default=None, help="Kafka brokers (default: $RANKWATCH_BROKERS)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--pipeline-stages", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=4, help="microbatches per step and replica")
    p.add_argument("--microbatch-size", type=int, default=4, help="sequences per microbatch")
    p.add_argument("--seq-len", type=int, default=24, help="tokens per sequence")
    p.add_argument("--hidden", type=int, default=96, help="width of every layer")
    p.add_argument("--layers", type=int, default=4, help="layers per stage")
    p.add_argument("--device-ms", type=float, default=0.0,
                   help="accelerator time of one layer's forward over one microbatch of --seq-len "
                        "tokens (backward: twice that), simulated with a sleep after the op's real "
                        "compute, as the host thread of a GPU job waits for its kernels; in "
                        "proportion to the layers and tokens of each op")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--clip-grad", type=float, default=1.0, help="global gradient norm bound")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--op-log", default=None, metavar="DIR",
                   help="write every op of every step (name, microbatch, start/end Unix ns) to "
                        "DIR/rank<N>.json")
    p.add_argument("--no-rankwatch", action="store_true", help="run without the collector")
    f = p.add_argument_group("fault injection (tests only; a real job has none)")
    f.add_argument("--fault-slow-worker", default=None, metavar="DP,STAGE",
                   help="the worker (data rank, stage) whose compute does extra real matrix products")
    f.add_argument("--fault-slow-factor", type=float, default=1.5,
                   help="that worker's forward and backward compute, in FLOPs, times this")
    f.add_argument("--fault-last-stage-layers-factor", type=float, default=1.0,
                   help="the last stage holds this many times --layers (a badly cut pipeline)")
    f.add_argument("--fault-heavy-stage", type=int, default=None, metavar="STAGE",
                   help="the stage that holds --fault-last-stage-layers-factor times the layers "
                        "(default: the last)")
    f.add_argument("--fault-random-seq-len", action="store_true",
                   help="each step the global batch's tokens split unevenly across the replicas: "
                        "each replica's sequence length is drawn between (1 - spread) and (1 + "
                        "spread) times --seq-len, then all scaled so that their mean is --seq-len; "
                        "the same on the replica's stages")
    f.add_argument("--fault-seq-len-spread", type=float, default=0.75)
    f.add_argument("--fault-gc-rank", type=int, default=-1, metavar="RANK",
                   help="this rank's step leaves a reference cycle, and every --fault-gc-every "
                        "steps the rank runs gc.collect() as its step begins: a full collection "
                        "its stage's peers wait for")
    f.add_argument("--fault-gc-every", type=int, default=5, metavar="N")
    return p.parse_args()


class Stage(nn.Module):
    """One pipeline stage: `layers` Linear + tanh blocks of width `hidden`. The first stage
    starts with a learned scale and shift of the inputs (as an embedding would, it makes the
    first block's input need its gradient: every stage's backward does the same work per
    layer); the last stage's loss (mean squared error) is computed by the caller."""

    def __init__(self, layers, hidden, first):
        super().__init__()
        self.embed = nn.Parameter(torch.ones(2, hidden)) if first else None
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))

    def forward(self, x):
        if self.embed is not None:
            x = x * self.embed[0] + self.embed[1]
        for block in self.blocks:
            x = torch.tanh(block(x))
        return x


class Pipeline:
    """One rank's part of the 1F1B schedule: its stage's module, its peers in the pipeline
    (the same data rank, the previous and next stage) and the op scopes."""

    def __init__(self, args, rw, module, stage, stages, data_rank, replicas, faults, op_log):
        self.args, self.rw, self.module, self.faults = args, rw, module, faults
        self.stage, self.stages = stage, stages
        self.first, self.last = stage == 0, stage == stages - 1
        self.prev = (stage - 1) * replicas + data_rank if not self.first else None
        self.next = (stage + 1) * replicas + data_rank if not self.last else None
        self.op_log = op_log
        self.step = 0
        self.compute_s = self.compute_cpu_s = 0.0

    def op(self, name, microbatch=None):
        return _Op(self, name, microbatch)

    # --- point-to-point: activations forward, gradients backward ---------------------------
    def recv_forward(self, i, shape):
        if self.first:
            return None
        x = torch.empty(shape)
        with self.op("forward-recv", i):
            dist.recv(x, self.prev)
        return x.requires_grad_()

    def send_forward(self, y, i):
        if not self.last:
            with self.op("forward-send", i):
                dist.isend(y.detach(), self.next).wait()

    def recv_backward(self, i, shape):
        if self.last:
            return None
        g = torch.empty(shape)
        with self.op("backward-recv", i):
            dist.recv(g, self.next)
        return g

    def send_backward(self, g, i):
        if not self.first:
            with self.op("backward-send", i):
                dist.isend(g, self.prev).wait()

    def send_forward_recv_backward(self, y, i_send, i_recv, shape):
        """Sends microbatch i_send's activations on while microbatch i_recv's gradient comes
        back: one exchange, both posted before either is waited for (Megatron-LM's
        batch_isend_irecv), so neither stage waits on the other's send. Its two ops span the
        same time, as the study's traces show them."""
        if self.last:
            return None
        return self.exchange(y.detach(), "forward-send", i_send, "backward-recv", i_recv, self.next, shape)

    def send_backward_recv_forward(self, g, i_send, i_recv, shape):
        if self.first:
            return None
        x = self.exchange(g, "backward-send", i_send, "forward-recv", i_recv, self.prev, shape)
        return x.requires_grad_()

    def exchange(self, tensor, send_op, i_send, recv_op, i_recv, peer, shape):
        received = torch.empty(shape)
        with self.op(recv_op, i_recv), self.op(send_op, i_send):
            pending = [dist.isend(tensor, peer), dist.irecv(received, peer)]
            for request in pending:
                request.wait()
        return received

    # --- compute ---------------------------------------------------------------------------
    def forward(self, i, x, target):
        with self.op("forward-compute", i):
            cpu_start = time.thread_time_ns()
            y = self.module(x)
            if self.last:
                y = nn.functional.mse_loss(y, target) / self.args.microbatches
            self.faults.extra_compute(cpu_start)  # fault injection
            self.device_time(x, 1)
        return y

    def backward(self, i, x, y, grad):
        with self.op("backward-compute", i):
            cpu_start = time.thread_time_ns()
            torch.autograd.backward(y, grad)
            self.faults.extra_compute(cpu_start)  # fault injection
            self.device_time(x, 2)
        return None if self.first else x.grad

    def device_time(self, x, passes):
        """--device-ms: the op's accelerator time, in proportion to the stage's layers and the
        microbatch's tokens (times the slow worker's factor)."""
        if self.args.device_ms > 0:
            tokens = x.shape[0] * x.shape[1] / (self.args.microbatch_size * self.args.seq_len)
            time.sleep(self.args.device_ms / 1e3 * passes * len(self.module.blocks) * tokens
                       * self.faults.device_factor)  # fault injection: the factor

    def run_1f1b(self, inputs, targets, shape):
        """One step's forward and backward passes over the microbatches (Megatron-LM's
        forward_backward_pipelining_without_interleaving)."""
        m = self.args.microbatches
        warmup = min(self.stages - self.stage - 1, m)
        remaining = m - warmup
        xs, ys = [], []

        def first_input(i, received):
            return inputs[i] if self.first else received

        for i in range(warmup):
            x = first_input(i, self.recv_forward(i, shape))
            y = self.forward(i, x, targets[i] if self.last else None)
            self.send_forward(y, i)
            xs.append(x)
            ys.append(y)
        x = first_input(warmup, self.recv_forward(warmup, shape)) if remaining > 0 else None
        for k in range(remaining):
            fi, bi = warmup + k, k
            y = self.forward(fi, x, targets[fi] if self.last else None)
            grad = self.send_forward_recv_backward(y, fi, bi, shape)
            xs.append(x)
            ys.append(y)
            dx = self.backward(bi, xs.pop(0), ys.pop(0), grad)
            if k == remaining - 1:
                self.send_backward(dx, bi)
            else:
                x = first_input(fi + 1, self.send_backward_recv_forward(dx, bi, fi + 1, shape))
        for j in range(warmup):
            bi = remaining + j
            grad = self.recv_backward(bi, shape)
            dx = self.backward(bi, xs.pop(0), ys.pop(0), grad)
            self.send_backward(dx, bi)


class _Op:
    """rankwatch's op scope, plus the script's own log of the op (--op-log) and its compute
    time (the JSON line)."""

    def __init__(self, pipeline, name, microbatch):
        self.p, self.name, self.microbatch = pipeline, name, microbatch
        self.scope = (pipeline.rw.op(name) if microbatch is None  # rankwatch
                      else pipeline.rw.op(name, microbatch=microbatch))  # rankwatch

    def __enter__(self):
        self.start, self.cpu = time.time_ns(), time.thread_time_ns()
        self.scope.__enter__()
        return self

    def __exit__(self, *exc):
        self.scope.__exit__(*exc)
        end = time.time_ns()
        if self.name in ("forward-compute", "backward-compute"):
            self.p.compute_s += (end - self.start) / 1e9
            self.p.compute_cpu_s += (time.thread_time_ns() - self.cpu) / 1e9
        if self.p.op_log is not None:
            self.p.op_log.append((self.p.step, self.name, self.microbatch, self.start, end))
        return False


def sequence_length(args, step, data_rank, replicas, faults):
    """The step's sequence length for this replica: both stages of the replica compute the
    same (the receiving stage sizes its buffers with it)."""
    return faults.seq_len(args.seq_len, step, data_rank, replicas) if faults.random_seq_len else args.seq_len


def main():
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    stages = args.pipeline_stages
    if world % stages:
        raise SystemExit("world size %d is not a multiple of --pipeline-stages %d" % (world, stages))
    replicas = world // stages
    stage, data_rank = divmod(rank, replicas)
    # Every rank creates every group, in the same order (torch.distributed's rule).
    dp_groups = [dist.new_group([s * replicas + d for d in range(replicas)]) for s in range(stages)]
    pp_groups = [dist.new_group([s * replicas + d for s in range(stages)]) for d in range(replicas)]
    dp_group, pp_group = dp_groups[stage], pp_groups[data_rank]

    rw = rankwatch.init(job=args.job, brokers=args.brokers, enabled=not args.no_rankwatch,  # rankwatch
                        layout=rankwatch.Layout(data_rank=data_rank, data_size=replicas,  # rankwatch
                                                pipeline_rank=stage, pipeline_size=stages,  # rankwatch
                                                tensor_rank=0, tensor_size=1))  # rankwatch
    faults = Faults(args, data_rank, stage, stages)
    layers = faults.stage_layers(args.layers)  # fault injection: the last stage's layers
    torch.manual_seed(args.seed * 1000 + stage)  # the same parameters in every replica of a stage
    module = Stage(layers, args.hidden, first=stage == 0)
    params = list(module.parameters())
    optimizer = torch.optim.Adam(params, lr=args.lr)
    data = torch.Generator().manual_seed(args.seed * 1000 + data_rank)
    op_log = [] if args.op_log else None
    pipe = Pipeline(args, rw, module, stage, stages, data_rank, replicas, faults, op_log)
    m, mbs, hidden = args.microbatches, args.microbatch_size, args.hidden

    step_seconds, compute_seconds, compute_cpu_seconds, seq_lens, grad_norms = [], [], [], [], []
    for step in range(args.steps):
        pipe.step, pipe.compute_s, pipe.compute_cpu_s = step, 0.0, 0.0
        t0 = time.perf_counter()
        with rw.step():  # rankwatch: one training step
            faults.collect_cycles(rank, step)
            seq = sequence_length(args, step, data_rank, replicas, faults)
            shape = (mbs, seq, hidden)
            inputs = targets = None
            if pipe.first or pipe.last:  # the stages that read the batch
                with pipe.op("data-loading"):
                    batch = torch.randn((m,) + shape, generator=data)
                    inputs = list(batch) if pipe.first else None
                    targets = list(torch.tanh(batch.flip(-1))) if pipe.last else None
            pipe.run_1f1b(inputs, targets, shape)
            with pipe.op("grads-all-reduce"):
                flat = torch.cat([q.grad.reshape(-1) for q in params])
                dist.all_reduce(flat, group=dp_group)
                flat /= replicas
                offset = 0
                for q in params:
                    q.grad.copy_(flat[offset:offset + q.numel()].view_as(q))
                    offset += q.numel()
            with pipe.op("optimizer-clip-main-grad"):
                # The global norm: this stage's squares summed over the replica's stages.
                squares = torch.stack([q.grad.pow(2).sum() for q in params]).sum().reshape(1)
                dist.all_reduce(squares, group=pp_group)
                norm = math.sqrt(squares.item())
                if norm > args.clip_grad:
                    for q in params:
                        q.grad.mul_(args.clip_grad / (norm + 1e-6))
            with pipe.op("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        step_seconds.append(time.perf_counter() - t0)
        compute_seconds.append(pipe.compute_s)
        compute_cpu_seconds.append(pipe.compute_cpu_s)
        seq_lens.append(seq)
        grad_norms.append(norm)

    stats = rw.stats()
    rw.close()  # rankwatch: this rank ended cleanly
    if args.op_log:
        with open(os.path.join(args.op_log, "rank%d.json" % rank), "w") as f:
            json.dump([{"step": s, "op": n, "microbatch": i, "start_ns": a, "end_ns": b}
                       for s, n, i, a, b in op_log], f)
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "data_rank": data_rank, "stage": stage, "layers": layers,
                      "steps": len(step_seconds), "median_step_s": statistics.median(step_seconds),
                      "step_seconds": step_seconds, "compute_seconds": compute_seconds,
                      "compute_cpu_seconds": compute_cpu_seconds,
                      "seq_lens": seq_lens, "grad_norms": grad_norms, "collector": stats}), flush=True)


# --- Fault injection (the --fault-* options): what the acceptance tests expect rankwatch to ---
# --- diagnose. A real job has none of this. -------------------------------------------------
class Faults:
    """The injected faults of one rank. The slow worker's extra time is real compute (matrix
    products), not sleeps."""

    def __init__(self, args, data_rank, stage, stages):
        self.args, self.stage, self.stages = args, stage, stages
        slow = None
        if args.fault_slow_worker:
            slow = tuple(int(v) for v in args.fault_slow_worker.split(","))
        self.extra = args.fault_slow_factor - 1 if slow == (data_rank, stage) else 0.0
        self.device_factor = 1 + self.extra  # its accelerator time (--device-ms) too
        # Operands of the extra products: 16 rows, a fraction of a millisecond each.
        self.rows = torch.randn(16, args.hidden)
        self.weight = torch.randn(args.hidden, args.hidden) / math.sqrt(args.hidden)
        self.random_seq_len = args.fault_random_seq_len

    def collect_cycles(self, rank, step):
        """--fault-gc-rank: a record of the step that points to itself (a reference cycle: only
        the garbage collector frees it), and every N steps a gc.collect() to free them, as code
        that knows it makes cycles does: a full collection visits every object the process
        tracks (about 100k with torch loaded), tens of milliseconds or more."""
        if rank != self.args.fault_gc_rank:
            return
        record = {"step": step}
        record["self"] = record
        del record
        if step % self.args.fault_gc_every == 0:
            gc.collect()

    def stage_layers(self, layers):
        """--fault-last-stage-layers-factor: the last stage (or --fault-heavy-stage) holds more
        layers than the others."""
        heavy = self.stages - 1 if self.args.fault_heavy_stage is None else self.args.fault_heavy_stage
        if self.stage == heavy:
            return round(layers * self.args.fault_last_stage_layers_factor)
        return layers

    def extra_compute(self, cpu_start_ns):
        """--fault-slow-worker: at the end of a forward or backward compute op, matrix products
        for (factor - 1) x the CPU time the op has taken so far, as a slower (or throttled)
        chip takes longer for the same work. CPU time, not wall time: the extra work is the
        same however busy the machine's other processes keep its cores."""
        if self.extra <= 0:
            return
        now = time.thread_time_ns()
        until = now + (now - cpu_start_ns) * self.extra
        while time.thread_time_ns() < until:
            torch.mm(self.rows, self.weight)

    def seq_len(self, base, step, data_rank, replicas):
        """--fault-random-seq-len: a global batch of a fixed token count split unevenly across
        the replicas, differently every step (as sequences of mixed lengths split by count).
        Every rank draws the step's lengths of all replicas from the same seed and takes its
        replica's."""
        spread = self.args.fault_seq_len_spread
        coin = random.Random("%d-%d" % (self.args.seed, step))
        draws = [coin.uniform(1 - spread, 1 + spread) for _ in range(replicas)]
        return max(1, round(base * draws[data_rank] * replicas / sum(draws)))


if __name__ == "__main__":
    main()
