"""rankwatch's and PyTorch's Flight Recorder analyzers on the same dump files, side by side: for
tests/collectors/test_fr_hang.py and benchmarks/fr_vs_pytorch.py.

* rankwatch: `rankwatch flight-recorder --json DIR` -> the ranks that hold the job, with reason,
  group and operation.
* PyTorch: `python -m torch.distributed.flight_recorder.fr_trace DIR -p PREFIX` (shipped with
  torch 2.13) prints its findings group by group ("Not all ranks joining collective" with the
  missing ranks, "Collective sequence number: N has errors" with its culprit ranks); parsed
  here from its text (it has no machine-readable verdict).

torch 2.13 writes no usable pg_config for gloo groups (one entry, name "" and no ranks): PyTorch's
analyzer then stops with a KeyError before any verdict. `with_pg_config` writes a copy of the
dumps with the job's groups filled in (what the job knows: fr_hang_job.py's GROUPS), on which it
runs; rankwatch needs no such help (it matches gloo groups by name)."""
import glob
import json
import os
import pickle
import re
import subprocess
import sys

BIN = os.environ.get("RANKWATCH_BIN", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "../../build/bin"))
PREFIX = "fr_trace_rank_"

# fr_hang_job.py's process groups as torch names them: (name, description, ranks).
JOB_GROUPS = [("0", "default_pg", [0, 1, 2, 3]), ("1", "undefined", [0, 1, 2]),
              ("2", "undefined", [1, 2, 3])]


def rankwatch_cmd(folder):
    return [os.path.join(BIN, "rankwatch"), "flight-recorder", "--json", folder]


def pytorch_cmd(folder, prefix=PREFIX, python=sys.executable, extra=()):
    return [python, "-m", "torch.distributed.flight_recorder.fr_trace", folder, "-p", prefix,
            *extra]


def rankwatch_verdict(folder):
    """{"culprits": [{"rank", "reason", "group", "group_ranks", "op", "seq", "waiting",
    "blocked"}], "summary", "undecided" (lines), "missing_dumps" (ranks without a dump)}."""
    r = subprocess.run(rankwatch_cmd(folder), capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise AssertionError("rankwatch flight-recorder failed: %s" % r.stderr)
    v = json.loads(r.stdout)
    return {"summary": v["summary"], "undecided": v["undecided"],
            "missing_dumps": v["dumps"]["missing"],
            "culprits": [{"rank": c["rank"], "reason": c["reason"], "group": c["group"],
                          "group_ranks": c["group_ranks"], "op": c["op"]["name"],
                          "seq": c["op"]["seq"], "waiting": c["waiting"],
                          "blocked": c["blocked"]} for c in v["culprits"]]}


_FINDING = re.compile(r"^(Not all ranks joining collective, sequence number: (\d+)"
                      r"|Collective sequence number: (\d+) has errors)$")
# With --allow-incomplete-ranks, a collective whose group has members without a dump.
_UNDECIDED = re.compile(r"^We cannot decide what's wrong with this collective entry because we "
                        r"missed FR dumps from ranks \((.*)\)")


def parse_fr_trace(text):
    """fr_trace's findings: [{"kind": "missing"|"errors"|"undecided", "seq", "group", "op",
    "ranks", "errors"}] in its order. "missing": `ranks` are the missing ranks; "errors": `ranks`
    are the culprit ranks of its error message, `errors` its error types; "undecided" (it cannot
    decide: ranks without a dump, with --allow-incomplete-ranks): `ranks` are those ranks (its
    message names no collective)."""
    findings = []
    cur = None
    for line in text.splitlines():
        u = _UNDECIDED.match(line)
        if u:
            findings.append({"kind": "undecided", "seq": -1, "group": "", "op": "",
                             "ranks": sorted(int(x) for x in re.findall(r"\d+", u.group(1))),
                             "errors": []})
            cur = None
            continue
        m = _FINDING.match(line)
        if m:
            cur = {"kind": "missing" if m.group(2) else "errors",
                   "seq": int(m.group(2) or m.group(3)), "group": "", "op": "", "ranks": [],
                   "errors": []}
            findings.append(cur)
            continue
        if cur is None:
            continue
        if line.startswith("group info: "):
            cur["group"] = line[len("group info: "):]
        elif line.startswith("collective: "):
            cur["op"] = line[len("collective: "):]
        elif line.startswith("missing ranks: "):
            cur["ranks"] = sorted(int(x) for x in re.findall(r"\d+", line[len("missing ranks: "):]))
        elif line.startswith("error msg: "):
            cur["ranks"] = sorted({int(x) for x in re.findall(r"Culprit rank (\d+)", line)})
            cur["errors"] = sorted(set(re.findall(r"Error type: ([A-Z_]+)", line)))
    return findings


def pytorch_verdict(folder, prefix=PREFIX, python=sys.executable, extra=()):
    """{"rc", "error" (the exception's last line when it failed), "findings"}; `extra`: more
    fr_trace arguments (e.g. --allow-incomplete-ranks)."""
    r = subprocess.run(pytorch_cmd(folder, prefix, python, extra), capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    error = ""
    if r.returncode != 0:
        lines = [x for x in out.splitlines() if x.strip()]
        error = lines[-1] if lines else "exit %d" % r.returncode
    return {"rc": r.returncode, "error": error, "findings": parse_fr_trace(out)}


def with_pg_config(src, dst, groups=JOB_GROUPS, prefix=PREFIX):
    """Copies src's dumps to dst with pg_config holding each rank's groups (name, description,
    ranks as torch writes them for NCCL groups)."""
    os.makedirs(dst, exist_ok=True)
    for path in sorted(glob.glob(os.path.join(src, prefix + "*"))):
        rank = int(path[len(os.path.join(src, prefix)):])
        with open(path, "rb") as f:
            d = pickle.load(f)
        d["pg_config"] = {name: {"name": name, "desc": desc, "ranks": json.dumps(ranks)}
                          for name, desc, ranks in groups if rank in ranks}
        with open(os.path.join(dst, os.path.basename(path)), "wb") as f:
            pickle.dump(d, f, protocol=2)
    return dst


def describe_rankwatch(v):
    named = "; ".join("rank %d %s in %s %s #%d" % (c["rank"], c["reason"], c["group"],
                                                    "[%s]" % ",".join(map(str, c["group_ranks"])),
                                                    c["seq"]) for c in v["culprits"])
    if named:
        return named
    return v["summary"].split(";")[0] if v["summary"].startswith("undecided") else "none"


def describe_pytorch(v):
    if v["rc"] != 0 and not v["findings"]:
        return "failed: " + v["error"]
    parts = []
    for f in v["findings"]:
        if f["kind"] == "undecided":
            parts.append("cannot decide: no dump from ranks %s" % f["ranks"])
        elif f["kind"] == "missing":
            parts.append("group %s %s #%d: missing ranks %s" % (f["group"], f["op"], f["seq"], f["ranks"]))
        else:
            parts.append("group %s %s #%d: culprit ranks %s (%s)" % (f["group"], f["op"], f["seq"], f["ranks"],
                                                                   ",".join(f["errors"])))
    # One line per distinct finding (it repeats "cannot decide" for every collective).
    counted = {}
    for x in parts:
        counted[x] = counted.get(x, 0) + 1
    return "; ".join(x + (" (x%d)" % n if n > 1 else "") for x, n in counted.items()) or "no finding"
