#!/usr/bin/python3
"""rankwatch's what-if analysis against the OSDI'25 study's own Python analyzer, side by side in
one run, on the study's jobs (tests/fixtures/whatif-stragglers/AR and ST, and any other folder
laid out the same way).

    benchmarks/whatif_vs_study.py --study STUDY [--runs 5] [FOLDER ...]

STUDY is a checkout (or the bare git directory `fetch` brings) of ByteDance-Seed/
StragglerAnalysis; its analyzer needs Debian's python3-pandas, python3-numpy, python3-yaml and
python3-tqdm. Its input is a parquet file that Debian 12 cannot read (no pyarrow): the rows are
built from the job's Chrome trace, as the fixture's README describes, and handed to the
analyzer in place of `pandas.read_parquet`. Both sides are timed on the analysis alone (the
trace already parsed): the study's `WhatIfAnalyzer.work` (its dependency model, simulations and
decompositions) against `rankwatch whatif`'s analysis time (the dependency model, simulations,
decompositions, M_W and M_S), each the median of --runs runs. Prints one JSON line per job with
both medians, their ratio and both results' S (which must agree within 2 %).
"""
import argparse
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.environ.get("RANKWATCH_BIN", os.path.join(ROOT, "build", "bin"))
THREAD = re.compile(r"PP rank (\d+), TP rank (\d+)")


def study_analyzer(path, workdir):
    """A directory with the study's `analyzer` package: the checkout itself, or its files
    written out of a bare git directory."""
    if os.path.isdir(os.path.join(path, "analyzer")):
        return path
    out = os.path.join(workdir, "study")
    os.makedirs(out)
    archive = subprocess.run(["git", "-C", path, "archive", "HEAD", "analyzer"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", out], input=archive, check=True)
    return out


def rows_of(folder):
    """The study's trace rows from the Chrome trace (seconds, as its parquet holds them)."""
    import pandas as pd
    name = os.path.basename(os.path.normpath(folder))
    with gzip.open(os.path.join(folder, "timeline-%s.json.gz" % name)) as f:
        events = json.load(f)
    if isinstance(events, dict):
        events = events["traceEvents"]
    lanes = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            m = THREAD.search(e["args"]["name"])
            if m:
                lanes[(e["pid"], e["tid"])] = (int(m.group(1)), int(m.group(2)))
    meta = {}
    with open(os.path.join(folder, "meta-%s.yaml" % name)) as f:
        for line in f:
            k, _, v = line.partition(":")
            meta[k.strip()] = v.strip()
    pp, dp, tp = int(meta["pp_size"]), int(meta["dp_size"]), int(meta["tp_size"])
    rows = []
    for e in events:
        if e.get("ph") != "X":
            continue
        stage, tp_rank = lanes[(e["pid"], e["tid"])]
        a = e["args"]
        mc = int(a.get("model_chunk", 0) or 0)
        rows.append({"dp_rank": e["pid"], "stage": stage, "rank": (stage * dp + e["pid"]) * tp + tp_rank,
                     "step": int(a["step"]), "optype": e["name"], "start_ts": e["ts"] / 1e6,
                     "duration": e["dur"] / 1e6, "seq_id": int(a.get("seq_id", 0)), "mc": mc,
                     "mb_id": int(a.get("mb_id", -1) if a.get("mb_id") is not None else -1),
                     "gmc": mc * pp + stage})
    df = pd.DataFrame(rows)
    df["optype"] = df["optype"].astype("category")  # as the study's parquet stores it
    return df, meta


def time_study(analyzer_dir, folder, runs):
    sys.path[:0] = [analyzer_dir, os.path.join(analyzer_dir, "analyzer")]  # its timers import a sibling by name
    import pandas as pd
    from analyzer.metatypes import JobMeta
    from analyzer.wia import WhatIfAnalyzer
    df, meta = rows_of(folder)
    job = JobMeta(trial_name=meta["trial_name"], dp_size=int(meta["dp_size"]), pp_size=int(meta["pp_size"]),
                  tp_size=int(meta["tp_size"]), dsp_size=int(meta.get("dsp_size", 1)),
                  vpp_size=int(meta.get("vpp_size", 1)), world_size=int(meta["world_size"]))
    real_read = pd.read_parquet
    pd.read_parquet = lambda *_a, **_k: df.copy()
    times, slowdown = [], None
    try:
        for _ in range(runs):
            t0 = time.perf_counter()
            result = WhatIfAnalyzer("chrome-trace", root=None, steps=None).analyze(job)
            times.append(time.perf_counter() - t0)
            slowdown = result.blocking_slowdown
    finally:
        pd.read_parquet = real_read
    return times, slowdown


def time_rankwatch(folder, runs):
    times, slowdown = [], None
    for _ in range(runs):
        r = subprocess.run([os.path.join(BIN, "rankwatch"), "whatif", "--json", folder],
                           capture_output=True, text=True, check=True, timeout=300)
        out = json.loads(r.stdout)
        times.append(out["analysis_seconds"])
        slowdown = out["slowdown"]
    return times, slowdown


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--study", required=True, help="ByteDance-Seed/StragglerAnalysis checkout or git dir")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("folders", nargs="*", default=[os.path.join(ROOT, "tests", "fixtures", "whatif-stragglers", j)
                                                  for j in ("AR", "ST")])
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as work:
        analyzer_dir = study_analyzer(args.study, work)
        failed = False
        for folder in args.folders:
            # Interleaved, so that both sides see the same machine load.
            ours, theirs = [], []
            s_ours = s_theirs = None
            for _ in range(args.runs):
                t, s_ours = time_rankwatch(folder, 1)
                ours += t
                t, s_theirs = time_study(analyzer_dir, folder, 1)
                theirs += t
            m_ours, m_theirs = statistics.median(ours), statistics.median(theirs)
            agree = abs(s_ours - s_theirs) <= 0.02 * s_theirs
            failed |= not agree
            print(json.dumps({"job": os.path.basename(os.path.normpath(folder)), "runs": args.runs,
                              "rankwatch_s": round(m_ours, 5), "study_s": round(m_theirs, 4),
                              "speedup": round(m_theirs / m_ours, 1), "slowdown_rankwatch": round(s_ours, 4),
                              "slowdown_study": round(s_theirs, 4), "agree": agree}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
