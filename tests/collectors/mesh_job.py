"""One rank of a real DeviceMesh job (gloo on CPU, torch 2.x) for test_device_mesh.py. The rank
makes its mesh with torch's init_device_mesh and calls rankwatch.init() with no layout: before
the mesh (--mesh-after-init, found at a step boundary) or after it (found at init()). Each
step trains a small MLP: tensor-parallel-free, the gradients are averaged over the mesh's
data-parallel dims (a real collective on the mesh's own groups). With --fsdp the model is
sharded with FSDP2 (torch.distributed.fsdp.fully_shard) over the whole mesh instead, and
rankwatch's hooks time forward, backward, optimizer and the all-gathers / reduce-scatters.

Prints one JSON line: the rank, what the mesh says (each dim's local rank and size), what
rankwatch found (layout_source at init() and at the end, the layout), and the step count.
Started by the test as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

import rankwatch

DATA_DIMS = ("dp", "dp_replicate", "dp_shard")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True)
    p.add_argument("--brokers", required=True)
    p.add_argument("--shape", default="2,2")
    p.add_argument("--names", default="dp,tp", help="the mesh's dim names; '' for none")
    p.add_argument("--mesh-after-init", action="store_true")
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--steps", type=int, default=6)
    a = p.parse_args()
    shape = tuple(int(n) for n in a.shape.split(","))
    names = tuple(a.names.split(",")) if a.names else None
    torch.manual_seed(0)

    def make_mesh():
        # Initialises the default process group itself (env://) when the script has not.
        return init_device_mesh("cpu", shape, mesh_dim_names=names)

    mesh = None if a.mesh_after_init else make_mesh()
    rw = rankwatch.init(job=a.job, brokers=a.brokers, flush_interval_ms=100)
    source_at_init = rw.layout_source
    if mesh is None:
        mesh = make_mesh()

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    if a.fsdp:
        from torch.distributed.fsdp import fully_shard
        flat = mesh if mesh.ndim == 1 else mesh._flatten()  # every rank shards the model
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=flat)
        fully_shard(model, mesh=flat)
        rw.instrument_fsdp(model)
    rw.instrument_module(model)
    optimizer = rw.instrument_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    # The data-parallel groups of the mesh (gradients averaged over them without FSDP).
    dp_groups = [mesh.get_group(i) for i, n in enumerate(names or ()) if n in DATA_DIMS]
    for _ in range(a.steps):
        x, y = torch.randn(16, 32), torch.randn(16, 1)
        with rw.step():
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            if not a.fsdp:
                for group in dp_groups:
                    for param in model.parameters():
                        dist.all_reduce(param.grad, group=group)
                        param.grad /= dist.get_world_size(group)
            optimizer.step()
    delivered = rw.flush(timeout_s=20)
    rw.close()
    line = {
        "rank": dist.get_rank(), "world": dist.get_world_size(),
        "mesh": {n: [mesh.get_local_rank(i), mesh.size(i)] for i, n in enumerate(names or ())},
        "coordinate": list(mesh.get_coordinate() or ()),
        "source_at_init": source_at_init, "source": rw.layout_source,
        "layout": rw.layout.as_dict() if rw.layout is not None else None,
        "delivered": delivered, "loss": loss.item(),
    }
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()
    dist.barrier()
    # No destroy_process_group(): in torch 2.13 a gloo rank then aborts now and then at exit
    # ("terminate called without an active exception") after its work is done.
    os._exit(0)


if __name__ == "__main__":
    main()
