"""Where a rank sits in its job's parallel layout: its data-parallel replica, pipeline stage, and
tensor-, context- and expert-parallel ranks (the wire's ParallelLayout). rankwatchd's what-if
analysis needs it to tell a slow worker from an unbalanced pipeline (docs/whatif.md).

Three sources, in rankwatch.init()'s order: the `layout=` argument (a Layout, or a torch
DeviceMesh whose dims are named "dp", "pp", "tp", "cp", "ep"; torchtitan's "dp_replicate" and
"dp_shard" together make the data-parallel dim); else Megatron-core's parallel_state when the
training script imported it and initialised model parallelism; else none (flat data
parallelism).
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any, Protocol, cast


class DeviceMeshLike(Protocol):
    """What Layout.from_mesh reads of a torch.distributed.device_mesh.DeviceMesh (torch >= 2.2;
    torch.distributed._tensor.DeviceMesh before)."""

    @property
    def mesh_dim_names(self) -> tuple[str, ...] | None: ...

    def get_local_rank(self, mesh_dim: int) -> int: ...

    def size(self, mesh_dim: int) -> int: ...


# DeviceMesh dim name -> Layout field prefix.
MESH_DIMS = {"dp": "data", "pp": "pipeline", "tp": "tensor", "cp": "context", "ep": "expert"}
# torchtitan's hybrid-sharded data parallelism: replicas x shards, together the data dim.
_MESH_DATA_PARTS = ("dp_replicate", "dp_shard")
_KINDS = ("data", "pipeline", "tensor", "context", "expert")


@dataclasses.dataclass(frozen=True)
class Layout:
    """A rank's coordinates; each rank below its size, sizes of 1 for kinds not used. The data x
    pipeline x tensor x context sizes multiply to the job's world size (Megatron-core's data
    size, which excludes context parallelism); expert parallelism regroups a stage's ranks.
    virtual_stages: model chunks per stage (interleaved 1F1B), 1 when not interleaved."""

    data_rank: int = 0
    data_size: int = 1
    pipeline_rank: int = 0
    pipeline_size: int = 1
    tensor_rank: int = 0
    tensor_size: int = 1
    context_rank: int = 0
    context_size: int = 1
    expert_rank: int = 0
    expert_size: int = 1
    virtual_stages: int = 1

    def __post_init__(self) -> None:
        for kind in _KINDS:
            rank, size = getattr(self, kind + "_rank"), getattr(self, kind + "_size")
            if not isinstance(rank, int) or not isinstance(size, int) or size < 1 or not 0 <= rank < size:
                raise ValueError("rankwatch.Layout: %s_rank %r is not in [0, %s_size %r)" % (kind, rank, kind, size))
        if not isinstance(self.virtual_stages, int) or self.virtual_stages < 1:
            raise ValueError("rankwatch.Layout: virtual_stages %r is not a positive int" % (self.virtual_stages,))

    def as_dict(self) -> dict[str, int]:
        """The fields as keyword arguments (rankwatch._native.Collector.set_layout)."""
        return dataclasses.asdict(self)

    @property
    def world_size(self) -> int:
        """The ranks this layout spans: data x pipeline x tensor x context sizes."""
        return self.data_size * self.pipeline_size * self.tensor_size * self.context_size

    @classmethod
    def from_mesh(cls, mesh: DeviceMeshLike) -> Layout:
        """This rank's place in a torch DeviceMesh whose dims are named "dp", "pp", "tp", "cp",
        "ep" (or "dp_replicate" and "dp_shard" for the data dim). Dims of other names are a
        ValueError: the layout must cover every rank of the job."""
        names = tuple(mesh.mesh_dim_names or ())
        if not names:
            raise ValueError("rankwatch: the DeviceMesh has no dim names; name its dims %s"
                             % ", ".join(MESH_DIMS))
        fields: dict[str, int] = {}
        parts: dict[str, tuple[int, int]] = {}
        for i, name in enumerate(names):
            rank, size = int(mesh.get_local_rank(i)), int(mesh.size(i))
            if name in MESH_DIMS:
                fields[MESH_DIMS[name] + "_rank"], fields[MESH_DIMS[name] + "_size"] = rank, size
            elif name in _MESH_DATA_PARTS:
                parts[name] = (rank, size)
            else:
                raise ValueError("rankwatch: DeviceMesh dim %r is none of %s (or %s)"
                                 % (name, ", ".join(MESH_DIMS), " and ".join(_MESH_DATA_PARTS)))
        if parts:
            if "data_size" in fields:
                raise ValueError("rankwatch: the DeviceMesh has both a 'dp' dim and %s" % " / ".join(parts))
            replica, replicas = parts.get("dp_replicate", (0, 1))
            shard, shards = parts.get("dp_shard", (0, 1))
            fields["data_rank"], fields["data_size"] = replica * shards + shard, replicas * shards
        return cls(**fields)

    @classmethod
    def from_megatron(cls, parallel_state: Any = None) -> Layout | None:
        """This rank's place as Megatron-core's parallel_state says (the module given, else
        megatron.core.parallel_state when the script imported it), or None when model
        parallelism is not initialised. Calls get_{data_parallel, pipeline_model_parallel,
        tensor_model_parallel, context_parallel, expert_model_parallel}_{rank, world_size} and
        get_virtual_pipeline_model_parallel_world_size; those an older Megatron lacks count as
        not used."""
        ps = parallel_state if parallel_state is not None else sys.modules.get("megatron.core.parallel_state")
        if ps is None:
            return None
        initialized = getattr(ps, "model_parallel_is_initialized", None)
        if initialized is None or not initialized():
            return None

        def ask(name: str, default: int) -> int:
            getter = getattr(ps, name, None)
            if getter is None:
                return default
            try:
                value = getter()
            except (AssertionError, AttributeError, RuntimeError):  # its group was never made
                return default
            return default if value is None else int(value)

        fields: dict[str, int] = {}
        for kind, megatron in (("data", "data_parallel"), ("pipeline", "pipeline_model_parallel"),
                               ("tensor", "tensor_model_parallel"), ("context", "context_parallel"),
                               ("expert", "expert_model_parallel")):
            # Megatron says 0 for a size when torch.distributed is not initialised: 1 here.
            fields[kind + "_size"] = max(1, ask("get_%s_world_size" % megatron, 1))
            fields[kind + "_rank"] = ask("get_%s_rank" % megatron, 0)
        fields["virtual_stages"] = max(1, ask("get_virtual_pipeline_model_parallel_world_size", 1))
        return cls(**fields)


def resolve(layout: object) -> Layout:
    """A Layout from init()'s `layout=` argument: a Layout, or a DeviceMesh-like object."""
    if isinstance(layout, Layout):
        return layout
    if hasattr(layout, "mesh_dim_names") and hasattr(layout, "get_local_rank"):
        return Layout.from_mesh(cast(DeviceMeshLike, layout))
    raise TypeError("rankwatch: layout= takes a rankwatch.Layout or a torch DeviceMesh, not %s"
                    % type(layout).__name__)
