#!/usr/bin/python3
"""Writes the Flight Recorder dumps of a large hung job, made by scaling a real job's layout
(issue #35, acceptance 5: the analysis of 16,384 ranks' dumps).

  benchmarks/fr_scale.py SRC OUT [--ranks 16384] [--fault-replica 0] [--faulty 9,14]
                         [--format pickle|json] [--prefix _dump_]

SRC holds the dumps of every rank of one hung job (`<prefix><rank>`, e.g.
tests/fixtures/flight-recorder/nvrx-lock_gil_1st, 16 ranks): that job is one model replica
of the scaled job, and replica k's ranks are r + R*k (R: SRC's ranks; --ranks a multiple of R).
Each process group of SRC becomes, in replica k:
  - a group whose ranks are all R (default_pg, INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP,
    EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP ...): all N ranks, the same group in every replica;
  - a data-parallel group (its description contains DATA_PARALLEL: DATA_PARALLEL_GROUP_WITH_CP
    [0, 4], TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP, EXPERT_DATA_PARALLEL_GROUP): the union over
    the replicas of its ranks shifted by R*k, so the data-parallel degree grows with N;
  - any other group (tensor, pipeline, expert, context, embedding, model parallel): its ranks
    shifted by R*k.
Group names (local to a rank), pg_status counters, entries and their sequence ids are kept; the
ranks strings of pg_config are rewritten, and so are the group-local ranks in the
point-to-point profiling names ("nccl:send 0->1"), which change where a group grows (default_pg's
are global ranks); the output sizes of an all-gather (input sizes of a reduce-scatter) in a
group that grows are scaled to its new size.

The faulty ranks (--faulty, default: the "Fault ranks:" line of SRC/fault_injection.log) keep
their dumps in replica --fault-replica only (default 0: ranks 9 and 14 of the fixtures). In the
other replicas each faulty rank f takes a healthy rank's dump, seen from f: the healthy rank s
and the permutation p of the replica's ranks (p(s) = f; p swaps two positions in every block
of d consecutive ranks, d the smallest that works) under which the replica's groups map onto
themselves; its pg_config names are f's own. So those replicas hold healthy ranks only, with
the same counters as their peers, and the ranks that hold the job are f + R*fault_replica.

The dumps are written as PyTorch writes them: a pickle (protocol 2, equal strings memoized,
pg_config keys in std::map order), or with --format json its JSON form (pg_status values as
strings, absent times as 0, no entries key when there are none). Existing `<prefix><digits>`
files in OUT are removed first; OUT/fr_scale.json records the parameters and the expected
culprits. Deterministic (no randomness: the same arguments give the same bytes); 16,384 ranks
take a few seconds and ~3 GB (pickle: the all-ranks string is written once a dump).
"""
import argparse
import json
import os
import pickle
import re
import sys
import time
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple

Dump = Dict[str, Any]
GroupKey = Tuple[str, FrozenSet[int]]

P2P_NAME = re.compile(r"(\d+)(->|<-)(\d+)")
ALL_GATHER = ("nccl:_all_gather_base", "nccl:all_gather", "nccl:allgather_into_tensor_coalesced")
REDUCE_SCATTER = ("nccl:_reduce_scatter_base", "nccl:reduce_scatter",
                  "nccl:reduce_scatter_tensor_coalesced")


def parse_ranks(text: str) -> Tuple[int, ...]:
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        raise ValueError(f"ranks string {text!r}")
    inner = body[1:-1].strip()
    return tuple(int(x) for x in inner.split(",")) if inner else ()


def ranks_str(ranks: Tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, ranks)) + "]"


def load_source(src: str, prefix: str) -> List[Dump]:
    if not os.path.isdir(src):
        raise SystemExit(f"{src}: not a folder")
    found: Dict[int, str] = {}
    pattern = re.compile(re.escape(prefix) + r"(\d+)$")
    for name in os.listdir(src):
        m = pattern.match(name)
        if m:
            found[int(m.group(1))] = os.path.join(src, name)
    if not found or sorted(found) != list(range(len(found))):
        raise SystemExit(f"{src}: expected {prefix}0 .. {prefix}R-1, found ranks {sorted(found)}")
    dumps = []
    for r in range(len(found)):
        with open(found[r], "rb") as f:
            raw = f.read()
        dumps.append(json.loads(raw) if raw.lstrip()[:1] == b"{" else pickle.loads(raw))
    return dumps


def fault_ranks(src: str) -> List[int]:
    path = os.path.join(src, "fault_injection.log")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        for line in f:
            if line.startswith("Fault ranks:"):
                return list(parse_ranks(line.split(":", 1)[1]))
    return []


class Layout:
    """The replica's groups (desc, rank set) -> ranks as listed, and each group's scaled form."""

    def __init__(self, dumps: List[Dump], replicas: int) -> None:
        self.size = len(dumps)
        self.replicas = replicas
        self.listed: Dict[GroupKey, Tuple[int, ...]] = {}
        self.member_of: List[Dict[GroupKey, str]] = []  # per rank: group -> its local name
        for r, d in enumerate(dumps):
            mine: Dict[GroupKey, str] = {}
            for name, g in d["pg_config"].items():
                ranks = parse_ranks(g["ranks"])
                key = (g["desc"], frozenset(ranks))
                self.listed.setdefault(key, ranks)
                mine[key] = name
            self.member_of.append(mine)
        self._strings: Dict[Tuple[int, ...], str] = {}
        self._scaled: Dict[GroupKey, Tuple[Tuple[int, ...], str]] = {}
        self._index: Dict[Tuple[GroupKey, int], Dict[int, int]] = {}

    def kind(self, key: GroupKey) -> str:
        desc, ranks = key
        if ranks == frozenset(range(self.size)):
            return "all"
        return "data" if "DATA_PARALLEL" in desc else "shift"

    def scaled(self, key: GroupKey, k: int) -> Tuple[Tuple[int, ...], str]:
        """The group's ranks in replica k and their string (made once for the groups that are
        the same in every replica)."""
        listed, kind, size = self.listed[key], self.kind(key), self.size
        if kind == "shift":
            shifted = tuple(x + size * k for x in listed)
            return shifted, ranks_str(shifted)
        cached = self._scaled.get(key)
        if cached is None:
            if kind == "all":
                ranks = tuple(range(size * self.replicas))
            else:
                ranks = tuple(sorted(x + size * j for j in range(self.replicas) for x in listed))
            cached = self._scaled[key] = (ranks, self._strings.setdefault(ranks, ranks_str(ranks)))
        return cached

    def local_index(self, key: GroupKey, k: int) -> Dict[int, int]:
        """Global rank -> its rank in the group, in replica k."""
        slot = (key, k if self.kind(key) == "shift" else -1)
        idx = self._index.get(slot)
        if idx is None:
            idx = self._index[slot] = {x: i for i, x in enumerate(self.scaled(key, k)[0])}
        return idx

    def maps_onto_itself(self, perm: List[int]) -> bool:
        for r, mine in enumerate(self.member_of):
            image = self.member_of[perm[r]]
            for desc, ranks in mine:
                if (desc, frozenset(perm[x] for x in ranks)) not in image:
                    return False
        return True


def sibling(layout: Layout, f: int, faulty: List[int]) -> Tuple[int, List[int]]:
    """A healthy rank s and an involution p of the replica's ranks with p(s) = f under which the
    groups map onto themselves: p swaps positions f % d and s % d in every block of d ranks."""
    size = layout.size
    for d in range(2, size + 1):
        if size % d:
            continue
        for s in range(f - f % d, f - f % d + d):
            if s == f or s in faulty:
                continue
            a, b = f % d, s % d
            perm = list(range(size))
            for base in range(0, size, d):
                perm[base + a], perm[base + b] = base + b, base + a
            if layout.maps_onto_itself(perm):
                return s, perm
    raise SystemExit(f"no healthy rank maps onto faulty rank {f} in this layout")


def rescale_sizes(entry: Dump, old_size: int, new_size: int) -> Optional[Dump]:
    """An all-gather's output (a reduce-scatter's input) is group-size times the other side."""
    name = entry.get("profiling_name", "")
    if name in ALL_GATHER:
        small, big = "input_sizes", "output_sizes"
    elif name in REDUCE_SCATTER:
        small, big = "output_sizes", "input_sizes"
    else:
        return None
    s, b = entry.get(small), entry.get(big)
    if not s or not b or not s[0] or not b[0] or b[0][0] != s[0][0] * old_size:
        return None
    out = dict(entry)
    out[big] = [[s[0][0] * new_size] + list(b[0][1:])] + list(b[1:])
    return out


def make_dump(layout: Layout, src: Dump, src_rank: int, perm: List[int], own_names: Dict[GroupKey, str],
              k: int) -> Dump:
    """`src` (rank src_rank of the replica) as rank perm[src_rank] of replica k sees it."""
    size = layout.size
    pg_config: Dict[str, Dump] = {}
    texts: Dict[str, str] = {}  # equal strings as one object: pickle memoizes them, as torch's does
    renamed: Dict[str, Tuple[str, Tuple[int, ...], Tuple[int, ...], GroupKey]] = {}
    for name, g in src["pg_config"].items():
        old = parse_ranks(g["ranks"])
        key = (g["desc"], frozenset(perm[x] for x in old))
        new, text = layout.scaled(key, k)
        new_name = own_names.get(key, name)
        text = texts.setdefault(text, text)
        pg_config[new_name] = {"name": new_name, "desc": g["desc"], "ranks": text}
        renamed[name] = (new_name, old, new, key)
    entries = []
    for e in src.get("entries") or []:
        pg_name = e["process_group"][0]
        if pg_name not in renamed:
            entries.append(e)
            continue
        new_name, old, new, key = renamed[pg_name]
        out = dict(e)
        out["process_group"] = (new_name, key[0])
        if new != tuple(perm[x] + size * k for x in old):  # local ranks change
            index = layout.local_index(key, k)

            def local(m: "re.Match[str]") -> str:
                a, b = (index[perm[old[int(m.group(i))]] + size * k] for i in (1, 3))
                return f"{a}{m.group(2)}{b}"

            out["profiling_name"] = P2P_NAME.sub(local, e["profiling_name"])
            if len(new) != len(old):
                out = rescale_sizes(out, len(old), len(new)) or out
        entries.append(out)
    dump = {key: value for key, value in src.items()}
    dump["pg_config"] = {name: pg_config[name] for name in sorted(pg_config)}
    if "entries" in src:
        dump["entries"] = entries
    return dump


def to_json(dump: Dump) -> bytes:
    """PyTorch's JSON form (FlightRecorder dump_json)."""
    out = dict(dump)
    out["pg_status"] = {uid: {k: str(v) for k, v in st.items()} for uid, st in dump["pg_status"].items()}
    entries = []
    for e in dump.get("entries") or []:
        e = dict(e)
        for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            if e.get(key) is None:
                e[key] = 0
        entries.append(e)
    out.pop("entries", None)
    if entries:
        out["entries"] = entries
    return json.dumps(out).encode()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("src", help="folder with the dumps of every rank of one job")
    ap.add_argument("out", help="folder to write into (created)")
    ap.add_argument("--ranks", type=int, default=16384, help="ranks of the scaled job (default 16384)")
    ap.add_argument("--fault-replica", type=int, default=0, help="replica that keeps the faults (default 0)")
    ap.add_argument("--faulty", help="faulty ranks of SRC, e.g. 9,14 (default: SRC/fault_injection.log)")
    ap.add_argument("--format", choices=("pickle", "json"), default="pickle")
    ap.add_argument("--prefix", default="_dump_", help="file name before the rank (default _dump_)")
    args = ap.parse_args()

    start = time.monotonic()
    dumps = load_source(args.src, args.prefix)
    size = len(dumps)
    if args.ranks < size or args.ranks % size:
        raise SystemExit(f"--ranks must be a multiple of SRC's {size} ranks")
    replicas = args.ranks // size
    if not 0 <= args.fault_replica < replicas:
        raise SystemExit(f"--fault-replica must be in [0, {replicas})")
    faulty = [int(x) for x in args.faulty.split(",") if x] if args.faulty is not None else fault_ranks(args.src)
    if any(not 0 <= f < size for f in faulty):
        raise SystemExit(f"faulty ranks {faulty} outside SRC's {size} ranks")
    layout = Layout(dumps, replicas)
    identity = list(range(size))
    # Per rank of the replica: (source rank, permutation) in the fault replica and in the others.
    healthy: Dict[int, Tuple[int, List[int]]] = {r: (r, identity) for r in range(size)}
    for f in faulty:
        healthy[f] = sibling(layout, f, faulty)

    os.makedirs(args.out, exist_ok=True)
    stale = re.compile(re.escape(args.prefix) + r"\d+$")
    for name in os.listdir(args.out):
        if stale.match(name):
            os.remove(os.path.join(args.out, name))
    encode: Callable[[Dump], bytes] = (to_json if args.format == "json"
                                       else lambda d: pickle.dumps(d, protocol=2))
    total = 0
    for k in range(replicas):
        for r in range(size):
            s, perm = (r, identity) if k == args.fault_replica else healthy[r]
            data = encode(make_dump(layout, dumps[s], s, perm, layout.member_of[r], k))
            with open(os.path.join(args.out, f"{args.prefix}{r + size * k}"), "wb") as fh:
                fh.write(data)
            total += len(data)
    culprits = sorted(f + size * args.fault_replica for f in faulty)
    manifest = {
        "source": os.path.abspath(args.src), "ranks": args.ranks, "replica_size": size,
        "fault_replica": args.fault_replica, "faulty": faulty, "expected_culprits": culprits,
        "stand_ins": {str(f): healthy[f][0] for f in faulty}, "format": args.format,
        "prefix": args.prefix, "bytes": total,
    }
    with open(os.path.join(args.out, "fr_scale.json"), "w") as fh:
        json.dump(manifest, fh, indent=1)
    print(f"fr_scale: {args.ranks} ranks ({replicas} replicas of {size}) in {args.out}: "
          f"{total / 2**20:.1f} MiB, {time.monotonic() - start:.1f} s; expected culprits "
          f"{','.join(map(str, culprits))}; healthy stand-ins "
          f"{', '.join(f'{f}<-{healthy[f][0]}' for f in faulty) or 'none'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
