"""Where a rank sits in its job's parallel layout: its data-parallel replica, pipeline stage, and
tensor-, context- and expert-parallel ranks (the wire's ParallelLayout). rankwatchd's what-if
analysis needs it to tell a slow worker from an unbalanced pipeline (docs/whatif.md).

Four sources, in rankwatch.init()'s order: the `layout=` argument (a Layout, or a torch
DeviceMesh whose dims are named "dp", "pp", "tp", "cp", "ep"; torchtitan's "dp_replicate" and
"dp_shard" together make the data-parallel dim); else Megatron-core's parallel_state when the
training script imported it and initialised model parallelism; else the DeviceMesh the script
made (init_device_mesh), found by MeshWatch without being told; else none (flat data
parallelism).
"""
from __future__ import annotations

import dataclasses
import gc
import sys
import weakref
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


class MeshWatch:
    """Finds the torch DeviceMesh the training script made (init_device_mesh, DeviceMesh(...),
    DeviceMesh.from_group) with nothing said to rankwatch. torch keeps no registry of the meshes
    it made, so look() searches Python's heap (gc.get_objects(), 50-75 ms with torch loaded)
    for DeviceMesh objects, and only when a mesh may have appeared since the last look: once
    torch.distributed is initialised, and again whenever c10d's count of process groups moved
    (every mesh but a 1-D one over all ranks makes groups). Between those, a look is a dict
    lookup and two attribute reads, cheap enough for every step boundary. At most MAX_SCANS
    searches.

    Of the meshes found, only root meshes (not the slices and flattenings of another) that hold
    this rank count; the one with the most dims whose layout the caller accepts wins. A mesh
    whose dims are unnamed or named otherwise, or whose sizes do not make the world, is passed
    over with one log line (rejected())."""

    MAX_SCANS = 16

    def __init__(self) -> None:
        self._epoch: int | None = None  # the group count at the last search
        self._judged: weakref.WeakSet[Any] = weakref.WeakSet()  # meshes already said no to
        self._types: dict[type, bool] = {}  # type -> is a DeviceMesh (subclasses too)
        self.scans = 0

    def look(self) -> list[tuple[Any, Layout | ValueError]]:
        """The root meshes holding this rank not yet judged, most dims first, each with its
        Layout or the ValueError that says why it has none; [] when no mesh can have appeared
        since the last look (no search made)."""
        epoch = _mesh_epoch()
        if epoch is None or epoch == self._epoch or self.scans >= self.MAX_SCANS:
            return []
        self._epoch = epoch
        self.scans += 1
        mesh_class = getattr(sys.modules.get("torch.distributed.device_mesh"), "DeviceMesh", None)
        if not isinstance(mesh_class, type):
            return []
        found: list[Any] = []
        types = self._types
        for obj in gc.get_objects():
            t = type(obj)
            is_mesh = types.get(t)
            if is_mesh is None:
                # __mro__, not isinstance: DeviceMesh's metaclass (torch's opaque types) warns
                # on some objects an isinstance check meets.
                is_mesh = types[t] = mesh_class in t.__mro__
            if is_mesh and _is_root(obj) and obj not in found:
                found.append(obj)
        ranked: list[tuple[int, Any, Layout | ValueError]] = []
        for mesh in found:
            try:
                if mesh in self._judged or mesh.get_coordinate() is None:
                    continue  # said no to before, or this rank is not in it
                ndim = int(mesh.ndim)
            except Exception:  # pylint: disable=broad-except  # a mesh half made or torn down
                continue
            result: Layout | ValueError
            try:
                result = Layout.from_mesh(cast(DeviceMeshLike, mesh))
            except ValueError as e:
                result = e
            ranked.append((ndim, mesh, result))
        ranked.sort(key=lambda r: -r[0])
        return [(mesh, result) for _, mesh, result in ranked]

    def rejected(self, mesh: Any) -> None:
        """`mesh` gives no layout: not offered again."""
        try:
            self._judged.add(mesh)
        except TypeError:  # not weakly referenceable: offered again at the next search
            pass


def _mesh_epoch() -> int | None:
    """None when no DeviceMesh can exist yet (torch.distributed not imported or not
    initialised); else c10d's count of process groups made, which moves whenever a mesh makes
    its groups (-1 where this torch has no such count: one search)."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None:
        return None
    try:
        if not c10d.is_initialized():
            return None
    except Exception:  # pylint: disable=broad-except
        return None
    count = getattr(getattr(c10d, "_world", None), "group_count", None)
    return count if isinstance(count, int) else -1


def _is_root(mesh: Any) -> bool:
    """Whether `mesh` is a root mesh, not a slice (mesh["tp"]) or flattening of another: torch
    >= 2.6 links those to their root (_get_root_mesh()), older torch in _mesh_resources."""
    try:
        get_root = getattr(mesh, "_get_root_mesh", None)
        if callable(get_root):
            return get_root() is mesh
        env = getattr(sys.modules.get("torch.distributed.device_mesh"), "_mesh_resources", None)
        mapping = getattr(env, "child_to_root_mapping", None)
        return not isinstance(mapping, dict) or mapping.get(mesh, mesh) is mesh
    except Exception:  # pylint: disable=broad-except
        return False
