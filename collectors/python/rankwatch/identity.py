"""Who this process is, from what the launcher already says.

Rank, world size and local rank: torch.distributed when it is initialised, else the launcher's
environment — torchrun (RANK, WORLD_SIZE, LOCAL_RANK), Slurm (SLURM_PROCID, SLURM_NTASKS,
SLURM_LOCALID), mpirun (OMPI_COMM_WORLD_*). The node: Kubernetes' NODE_NAME (downward API), Slurm's
SLURMD_NODENAME, else the host name.

The training job's id, when $RANKWATCH_JOB does not say it, comes from the scheduler
(`scheduler()`): a Kubernetes owner (Kubeflow's PyTorchJob) as "<namespace>/<owner>", a Slurm job
as "slurm-<SLURM_JOB_ID>", a torchrun rendezvous as "torchrun-<TORCHELASTIC_RUN_ID>". The outermost
scheduler names the job: torchrun under Slurm is the Slurm job, so every node's ranks agree.
"""
from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from typing import TypedDict

# Kubeflow names a PyTorchJob's pods <job>-master-<i> and <job>-worker-<i>; the training
# operator's newer releases label them with the job's name.
_KUBEFLOW_POD = re.compile(r"^(?P<owner>.+)-(master|worker|launcher)-\d+$")
_OWNER_LABELS = ("training.kubeflow.org/job-name", "job-name", "app.kubernetes.io/instance")
PODINFO_LABELS = "/etc/podinfo/labels"  # downward API volume (optional)


class Identity(TypedDict):
    """Who this process is (detect()): the keyword arguments rankwatch.init() gives Collector."""
    rank: int
    world_size: int
    local_rank: int
    node: str
    device: str


def _env_int(env: Mapping[str, str], *names: str, default: int) -> int:
    for name in names:
        value = env.get(name)
        if value is not None and value != "":
            return int(value)
    return default


def _pod_labels(path: str) -> dict[str, str]:
    """Labels from a downward-API labels file (key="value" per line), or {}."""
    labels: dict[str, str] = {}
    try:
        with open(path) as f:
            for line in f:
                key, sep, value = line.strip().partition("=")
                if sep:
                    labels[key] = value.strip().strip('"')
    except OSError:
        pass
    return labels


def scheduler(env: Mapping[str, str] | None = None,
              podinfo_labels: str = PODINFO_LABELS) -> dict[str, str]:
    """The scheduler's identity of this process, from its environment. Returns a dict:
    scheduler ("kubernetes", "slurm", "torchrun" or ""), job (the id rankwatch uses for the
    training job, "" when no scheduler says one), scheduler_job (the scheduler's own job id),
    namespace, owner, pod (Kubernetes), node (the scheduler's node name, "" when it gives none).
    """
    env = os.environ if env is None else env
    out = dict(scheduler="", job="", scheduler_job="", namespace="", owner="", pod="", node="")
    pod = env.get("POD_NAME", "")
    namespace = env.get("POD_NAMESPACE", "")
    if pod or namespace:
        out.update(scheduler="kubernetes", pod=pod, namespace=namespace, node=env.get("NODE_NAME", ""))
        owner = env.get("RANKWATCH_OWNER", "")
        if not owner:
            labels = _pod_labels(podinfo_labels)
            owner = next((labels[k] for k in _OWNER_LABELS if labels.get(k)), "")
        if not owner:
            m = _KUBEFLOW_POD.match(pod)
            owner = m.group("owner") if m else ""
        out["owner"] = owner
        if owner:
            out["scheduler_job"] = owner
            out["job"] = "%s/%s" % (namespace or "default", owner)
        return out
    slurm_job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if slurm_job:
        out.update(scheduler="slurm", scheduler_job=slurm_job, job="slurm-" + slurm_job,
                   node=env.get("SLURMD_NODENAME", ""))
        return out
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id:
        out.update(scheduler="torchrun", scheduler_job=run_id)
        # torchrun's default --rdzv-id is "none": not an id two jobs could be told apart by.
        if run_id != "none":
            out["job"] = "torchrun-" + run_id
    return out


def detect(rank: int | None = None, world_size: int | None = None, local_rank: int | None = None,
           node: str | None = None, device: str | None = None,
           env: Mapping[str, str] | None = None) -> Identity:
    """Returns dict(rank, world_size, local_rank, node, device); explicit arguments win."""
    env = os.environ if env is None else env
    dist_rank: int | None = None
    dist_world: int | None = None
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist_rank, dist_world = dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    if rank is None:
        rank = dist_rank if dist_rank is not None else _env_int(
            env, "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", default=0)
    if world_size is None:
        world_size = dist_world if dist_world is not None else _env_int(
            env, "WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", default=1)
    if local_rank is None:
        local_rank = _env_int(env, "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", default=0)
    if node is None:
        node = env.get("NODE_NAME") or env.get("SLURMD_NODENAME") or socket.gethostname()
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
