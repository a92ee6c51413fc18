#!/usr/bin/python3
"""A small PyTorch DDP training script (gloo on CPU) that hangs where a user's code would, for
tests/collectors/test_hang.py. Started once per rank with RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT set, as torchrun does (tests/collectors/torch_job.py).

--hang says how, from step --hang-at on:
  load_shard  rank --hang-rank blocks forever in load_shard(), the script's data loading, before
              the step's forward pass; the other ranks go on into backward, where DDP's
              allreduce waits for it;
  barrier     every rank waits forever in wait_for_barrier_file() for a file nobody writes (an
              external barrier: every rank in the same place);
  die         rank --hang-rank kills itself (SIGKILL) in load_shard();
  none        no hang (the --steps steps, then a clean end).
Each rank prints one JSON line when it ends cleanly: rank, steps, median step seconds, the
collector's control counters, and with --dump-steps each step's (end Unix time, seconds)
(benchmarks/hang_stacks_overhead.py).
"""
import argparse
import json
import os
import signal
import statistics
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import rankwatch


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job", required=True)
    p.add_argument("--brokers", required=True)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--hang", choices=("load_shard", "barrier", "die", "none"), default="none")
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--hang-at", type=int, default=30)
    p.add_argument("--barrier-file", default="/nonexistent/rankwatch-barrier")
    p.add_argument("--step-ms", type=float, default=20.0, help="simulated device time a step")
    p.add_argument("--dump-steps", action="store_true", help="print every step's end and duration")
    p.add_argument("--stop-file", default="", help="end cleanly at the first step after it exists")
    return p.parse_args()


def load_shard(args, rank, step):
    """The script's own data loading: a batch of random features."""
    if step >= args.hang_at and rank == args.hang_rank:
        if args.hang == "load_shard":
            threading.Event().wait()  # a lock nobody will ever release
        elif args.hang == "die":
            os.kill(os.getpid(), signal.SIGKILL)
    return torch.randn(32, 64), torch.randn(32, 1)


def wait_for_barrier_file(path):
    """Every rank waits for a file another system was to write (an external barrier)."""
    while not os.path.exists(path):
        time.sleep(0.05)


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    rw = rankwatch.init(job=args.job, brokers=args.brokers)
    model = rw.instrument_ddp(DDP(rw.instrument_module(nn.Sequential(
        nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)))))
    opt = rw.instrument_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    times, ends = [], []
    for step in range(args.steps):
        if args.stop_file and step % 10 == 0:
            # Every rank decides together (a rank alone leaving would hang the others).
            flag = torch.tensor([1.0 if os.path.exists(args.stop_file) else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() > 0:
                break
        t0 = time.perf_counter()
        with rw.step():
            with rw.phase("dataloader"):
                x, y = load_shard(args, rank, step)
            if args.hang == "barrier" and step >= args.hang_at:
                wait_for_barrier_file(args.barrier_file)
            loss = nn.functional.mse_loss(model(x), y)
            time.sleep(args.step_ms / 2000.0)
            loss.backward()
            time.sleep(args.step_ms / 2000.0)
            opt.step()
            opt.zero_grad()
        times.append(time.perf_counter() - t0)
        ends.append(time.time())
    control = rw.stats()["control"]
    rw.close()
    out = {"rank": rank, "steps": len(times), "median_step_s": statistics.median(times),
           "control": control}
    if args.dump_steps:
        out["step_ends"] = ends
        out["step_s"] = times
    print(json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
