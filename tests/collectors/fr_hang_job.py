#!/usr/bin/python3
"""A 4-rank PyTorch job (gloo on CPU) with two subgroups that hangs one of three ways, for
tests/collectors/test_fr_hang.py: its Flight Recorder dumps are real torch dumps, written when
rankwatchd asks for them (the collector's stacks thread answers with torch's _dump_fr_trace to
${TORCH_FR_DUMP_TEMP_FILE}${rank}). Started once per rank with RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT set, as torchrun does (tests/collectors/torch_job.py), and with
TORCH_FR_BUFFER_SIZE set (torch records nothing without it).

Groups: the world, A = [0, 1, 2] and B = [1, 2, 3]. Each step: the rank's gradient is summed
over the world, then over A, then over B (each rank in the groups it belongs to).

--fault says how it hangs at step --fault-at (rank --culprit):
  missing  the culprit blocks forever in prepare_bucket() before B's all_reduce (it is in B):
           B's other members wait for it in that all_reduce, rank 0 in the next step's world
           all_reduce;
  size     the culprit calls B's all_reduce with an empty tensor (prepare_bucket() gives it an
           empty shard): gloo moves no data for it and returns at once, so the culprit goes on to the
           next step's world all_reduce, while B's other members wait in B's all_reduce for data
           that never comes. (A non-empty tensor of another size is no hang on gloo: the rank
           that receives the longer message aborts, "Received data size doesn't match".) B has
           3 members, so the 2 that agree are the majority;
  p2p      the culprit sends its activations to rank --peer (dist.send) before the step's world
           all_reduce; the peer never posts the receive: gloo's send waits for it, forever, and
           the others wait for the culprit in the world all_reduce. (torch 2.13 records no gloo
           send or recv in the Flight Recorder: the dumps show the culprit missing from the
           world all_reduce, its stack shows it in send.)
  none     no hang (--steps steps, then a clean end).
"""
import argparse
import json
import threading
import time

import torch
import torch.distributed as dist

import rankwatch

GROUP_A = [0, 1, 2]
GROUP_B = [1, 2, 3]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job", required=True)
    p.add_argument("--brokers", required=True)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--fault", choices=("missing", "size", "p2p", "none"), default="none")
    p.add_argument("--culprit", type=int, default=-1)
    p.add_argument("--peer", type=int, default=0, help="p2p: the rank the culprit sends to")
    p.add_argument("--fault-at", type=int, default=20)
    p.add_argument("--step-ms", type=float, default=20.0, help="simulated device time a step")
    return p.parse_args()


def load_shard(args, rank, step):
    """The script's own data loading: a batch of random features."""
    return torch.randn(16, 32)


def prepare_bucket(args, rank, step, grad):
    """The script's own work on B's gradient bucket (blocks: --fault missing)."""
    if args.fault == "missing" and step == args.fault_at and rank == args.culprit:
        threading.Event().wait()  # a lock nobody will ever release
    if args.fault == "size" and step == args.fault_at and rank == args.culprit:
        return grad[:0]  # an empty shard
    return grad


def send_activations(args, rank, step, x):
    """--fault p2p: the culprit sends to a peer that never receives."""
    if args.fault == "p2p" and step == args.fault_at and rank == args.culprit:
        dist.send(x[0].contiguous(), dst=args.peer)


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    group_a = dist.new_group(GROUP_A)  # every rank creates every group, as torch requires
    group_b = dist.new_group(GROUP_B)
    torch.manual_seed(rank)
    rw = rankwatch.init(job=args.job, brokers=args.brokers)
    w = torch.randn(32, 8)
    for step in range(args.steps):
        with rw.step():
            with rw.phase("dataloader"):
                x = load_shard(args, rank, step)
            send_activations(args, rank, step, x)
            grad = (x @ w).sum(0)  # 8 floats
            time.sleep(args.step_ms / 1000.0)
            dist.all_reduce(grad)
            if rank in GROUP_A:
                dist.all_reduce(grad, group=group_a)
            if rank in GROUP_B:
                dist.all_reduce(prepare_bucket(args, rank, step, grad), group=group_b)
    out = {"rank": rank, "steps": args.steps}
    rw.close()
    print(json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
