"""One rank of a real FSDP job (gloo on CPU, torch 2.x) for test_sharded.py: a small MLP sharded
with FSDP1 (FullyShardedDataParallel, --fsdp 1) or FSDP2 (fully_shard, --fsdp 2) over all
ranks, instrumented with rw.instrument_fsdp() + instrument_module + instrument_optimizer.

On the steps --delay-steps names, rank --delay-rank sleeps --delay-ms inside the step right
before its forward: the other ranks then block in FSDP's first all-gather of that forward for
about as long (the collective phase a straggler makes its peers wait in). With
--async-unshard (FSDP2) each step first calls model.unshard(async_op=True), FSDP2's explicit
prefetch: the forward then waits on the all-gather's handle (the async path instrument_fsdp
times in the handle's wait()).

Every rank trains on the same batches, so FSDP's averaged gradients are the local ones: an
unsharded copy of the model, trained here on the same batches without FSDP, gives the loss
the job must reach (reference_loss) if rankwatch's wrappers left FSDP's collectives intact.

Prints one JSON line: the rank, the world size, rankwatch's training strategy and sharding,
whether every batch was delivered, the loss and the reference loss, and the steps this rank
delayed. Started by the
test as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import rankwatch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True)
    p.add_argument("--brokers", required=True)
    p.add_argument("--fsdp", type=int, choices=(1, 2), default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--delay-rank", type=int, default=1)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--delay-steps", default="", help="comma-separated step numbers")
    p.add_argument("--async-unshard", action="store_true")
    a = p.parse_args()
    delay_steps = {int(n) for n in a.delay_steps.split(",") if n}
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 32, generator=g), torch.randn(16, 1, generator=g)) for _ in range(a.steps)]

    def make_model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    reference = make_model()
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.01)
    for x, y in batches:
        reference_loss = nn.functional.mse_loss(reference(x), y)
        reference_optimizer.zero_grad()
        reference_loss.backward()
        reference_optimizer.step()

    model = make_model()
    if a.fsdp == 1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model, device_id=torch.device("cpu"), use_orig_params=True)
    else:
        from torch.distributed.fsdp import fully_shard
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    rw = rankwatch.init(job=a.job, brokers=a.brokers, flush_interval_ms=100)
    rw.instrument_fsdp(model)
    rw.instrument_module(model)
    optimizer = rw.instrument_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    delayed = []
    for step, (x, y) in enumerate(batches):
        with rw.step(step):
            if rank == a.delay_rank and step in delay_steps:
                time.sleep(a.delay_ms / 1000)
                delayed.append(step)
            if a.async_unshard:
                model.unshard(async_op=True)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    delivered = rw.flush(timeout_s=20)
    line = {"rank": rank, "world": dist.get_world_size(), "fsdp": a.fsdp,
            "strategy": rw.training_strategy, "sharded": rw.sharded, "delivered": delivered,
            "loss": loss.item(), "reference_loss": reference_loss.item(), "delayed": delayed}
    rw.close()
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()
    dist.barrier()
    # No destroy_process_group(): in torch 2.13 a gloo rank then aborts now and then at exit
    # ("terminate called without an active exception") after its work is done (as mesh_job.py).
    os._exit(0)


if __name__ == "__main__":
    main()
