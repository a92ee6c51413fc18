#!/usr/bin/python3
"""Side by side, in one run: `zcat FILE > /dev/null` vs `rankwatch analyze FILE` (issue #6,
acceptance 3). Prints the median wall time of --runs runs and the peak RSS of each, against the
targets: analyze <= 2x zcat's time, analyze's peak RSS < 2x the decompressed size.

  benchmarks/analyze_benchmark.py [--bin build/bin/rankwatch] [--runs 7] [FILE]
"""
import argparse
import gzip
import os
import statistics
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(HERE, "..", "tests", "fixtures", "kineto", "hta-negative-queue-rank0", "rank0.json.gz")


def measure(cmd):
    """Wall seconds, peak RSS (KiB) and CPU seconds of one run of `cmd` (stdout discarded)."""
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.execvp(cmd[0], cmd)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed")
    return wall, usage.ru_maxrss, usage.ru_utime + usage.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file", nargs="?", default=DEFAULT)
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin", "rankwatch"))
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    with gzip.open(args.file) as f:
        decompressed = len(f.read())
    commands = {
        "zcat": ["zcat", args.file],
        "analyze": [args.bin, "analyze", "--quiet", args.file],
        "analyze --compat hta": [args.bin, "analyze", "--quiet", "--compat", "hta", args.file],
    }
    results = {name: [] for name in commands}
    for _ in range(args.runs):  # interleaved, so machine noise hits every command alike
        for name, cmd in commands.items():
            results[name].append(measure(cmd))
    print(f"file {args.file}: {os.path.getsize(args.file):,} bytes gzip, {decompressed:,} decompressed; "
          f"median of {args.runs} runs")
    zcat_time = statistics.median(w for w, _, _ in results["zcat"])
    zcat_cpu = statistics.median(c for _, _, c in results["zcat"])
    for name, runs in results.items():
        wall = statistics.median(w for w, _, _ in runs)
        cpu = statistics.median(c for _, _, c in runs)
        rss = max(r for _, r, _ in runs) * 1024
        print(f"  {name:22s} wall {wall * 1e3:7.1f} ms ({wall / zcat_time:4.2f}x zcat)   "
              f"cpu {cpu * 1e3:7.1f} ms ({cpu / zcat_cpu:4.2f}x zcat)   "
              f"peak RSS {rss / 1e6:6.1f} MB ({rss / decompressed:4.2f}x decompressed)")
    ok = True
    for name in ("analyze", "analyze --compat hta"):
        wall = statistics.median(w for w, _, _ in results[name])
        rss = max(r for _, r, _ in results[name]) * 1024
        ok &= wall <= 2 * zcat_time and rss < 2 * decompressed
    print("targets (<= 2x zcat time, < 2x decompressed RSS):", "met" if ok else "NOT met")


if __name__ == "__main__":
    main()
