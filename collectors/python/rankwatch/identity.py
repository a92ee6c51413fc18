"""Who this process is: rank, world size and local rank from torch.distributed when it is
initialised, else from the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK as torchrun
sets them; OMPI_COMM_WORLD_* under mpirun), the node from the host name."""
import os
import socket


def _env_int(*names, default):
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    return default


def detect(rank=None, world_size=None, local_rank=None, node=None, device=None):
    """Returns dict(rank, world_size, local_rank, node, device); explicit arguments win."""
    dist_rank = dist_world = None
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist_rank, dist_world = dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    if rank is None:
        rank = dist_rank if dist_rank is not None else _env_int("RANK", "OMPI_COMM_WORLD_RANK", default=0)
    if world_size is None:
        world_size = dist_world if dist_world is not None else _env_int(
            "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", default=1)
    if local_rank is None:
        local_rank = _env_int("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", default=0)
    if node is None:
        node = socket.gethostname()
    if device is None:
        device = "cpu"
        try:
            import torch
            if torch.cuda.is_available():
                device = "cuda:%d" % torch.cuda.current_device()
        except ImportError:
            pass
    return dict(rank=int(rank), world_size=int(world_size), local_rank=int(local_rank),
                node=str(node), device=str(device))
