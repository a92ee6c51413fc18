#!/usr/bin/python3
"""rankwatch's Flight Recorder analysis against NVIDIA's (nvidia-resiliency-ext's
`fr_attribution`, the analyzer the fixture sets come from), interleaved in one run, on folders
of dumps (issue #35).

    benchmarks/fr_vs_nvrx.py --nvrx NVRX [--runs 5] [--bench BIN] FOLDER...

NVRX is a checkout (or the bare git directory `fetch` brings) of NVIDIA/nvidia-resiliency-ext;
its analyzer runs from its source with Debian's /usr/bin/python3 and the standard library
(`python3 -m nvidia_resiliency_ext.attribution.trace_analyzer.fr_attribution --fr-path FOLDER
--emit-stdout`, no LLM, no health check). rankwatch's side is build/benchmarks/
fr_analysis_benchmark (what `rankwatch flight-recorder` does: find, read and analyse the dumps).
Each side is a process, timed from start to exit (interpreter start included for NVIDIA's), with
its peak RSS (GNU time, /usr/bin/time); the sides alternate, --runs runs each, and the medians
are printed with the ranks each side names: rankwatch's culprits, NVIDIA's "Missing Ranks" of
its final table.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Set, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "build", "benchmarks", "fr_analysis_benchmark")
MODULE = "nvidia_resiliency_ext.attribution.trace_analyzer.fr_attribution"
CULPRIT = re.compile(r"^culprit: rank (\d+)", re.M)


def nvrx_source(path: str, workdir: str) -> str:
    """The folder that holds the nvidia_resiliency_ext package: the checkout's src/, or its
    files written out of a bare git directory."""
    if os.path.isdir(os.path.join(path, "src", "nvidia_resiliency_ext")):
        return os.path.join(path, "src")
    archive = subprocess.run(["git", "-C", path, "archive", "HEAD", "src/nvidia_resiliency_ext"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", workdir], input=archive, check=True)
    return os.path.join(workdir, "src")


def run(cmd: List[str], env: Dict[str, str], workdir: str) -> Tuple[float, float, str]:
    """Wall seconds, peak RSS (MiB) and stdout of one run of `cmd`. The peak RSS is GNU time's:
    a child forked by this interpreter would carry the interpreter's own RSS into its maximum."""
    rss_file = os.path.join(workdir, "rss")
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss_file] + cmd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):  # the benchmark exits 1 when culprits differ
        raise SystemExit(f"{' '.join(cmd)}: exit status {proc.returncode}")
    with open(rss_file) as f:
        peak_kib = int(f.read().split()[-1])
    return wall, peak_kib / 1024.0, proc.stdout.decode()


def nvrx_named(text: str) -> Set[int]:
    """The ranks in the last column of NVIDIA's final table (PGID | ... | Missing Ranks)."""
    named: Set[int] = set()
    table = False
    for line in text.splitlines():
        if line.startswith("PGID") and "Missing Ranks" in line:
            table = True
        elif table and "|" in line:
            named.update(int(x) for x in line.rsplit("|", 1)[1].split(",") if x.strip().isdigit())
    return named


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--nvrx", required=True, help="NVIDIA/nvidia-resiliency-ext checkout or git dir")
    ap.add_argument("--bench", default=BENCH, help="fr_analysis_benchmark (default build/benchmarks/)")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        env = dict(os.environ, PYTHONPATH=nvrx_source(args.nvrx, work))
        for folder in args.folders:
            sides = {
                "rankwatch": [args.bench, folder],
                "nvrx": ["/usr/bin/python3", "-m", MODULE, "--fr-path", folder, "--emit-stdout"],
            }
            walls: Dict[str, List[float]] = {name: [] for name in sides}
            rss: Dict[str, List[float]] = {name: [] for name in sides}
            named: Dict[str, List[int]] = {}
            for _ in range(args.runs):
                for name, cmd in sides.items():
                    wall, peak, out = run(cmd, env, work)
                    walls[name].append(wall)
                    rss[name].append(peak)
                    named[name] = sorted({int(x) for x in CULPRIT.findall(out)} if name == "rankwatch"
                                         else nvrx_named(out))
            print(f"{folder}:")
            for name in sides:
                print(f"  {name:9} median {statistics.median(walls[name]) * 1000:8.1f} ms of {args.runs} "
                      f"(runs {', '.join(f'{w * 1000:.1f}' for w in walls[name])}), "
                      f"peak RSS {max(rss[name]):.0f} MiB, names {named[name]}")
            ratio = statistics.median(walls["nvrx"]) / statistics.median(walls["rankwatch"])
            print(f"  nvrx / rankwatch: {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
