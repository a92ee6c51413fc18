#!/usr/bin/python3
"""How long the web UI's job page takes to load and draw a 16,384-rank job in headless Chromium,
against a 64-rank job's page in the same run (Debian's chromium and chromium-driver, driven by
python3-selenium).

One development broker and one rankwatchd; two simulated DDP jobs published paced (`--rate`):
--ranks ranks (8 a node) and 64 ranks, each --steps steps with one rank 30 % slower in compute.
Once the daemon has stored both windows, each job page is opened --runs times, alternately, in a
fresh page load; a run's figure is the page's own clock (performance.now(), from the start of
the navigation) when the heatmap canvas finished drawing: HTML, script, the API calls (diagnosis,
alerts, captures, heatmap), JSON parsing and the draw. Also the heatmap API call alone (request
to last byte, Python's urllib, the binary form the UI reads) and its size.

Prints one line per run and a JSON summary with the medians and the ratio big / small.

Usage: benchmarks/ui_render.py [--bin build/bin] [--ranks 16384] [--steps 130] [--runs 5]
       [--rate 200000]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../tests/e2e"))
import harness  # noqa: E402


def fetch_seconds(url):
    start = time.monotonic()
    with urllib.request.urlopen(url, timeout=120) as r:
        body = r.read()
    return time.monotonic() - start, len(body), json.loads(body)


def fetch_binary_seconds(url):
    start = time.monotonic()
    with urllib.request.urlopen(url, timeout=120) as r:
        body = r.read()
    return time.monotonic() - start, len(body)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=harness.BIN)
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=130)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rate", type=int, default=200000, help="step records/s the simulator offers")
    a = ap.parse_args()
    harness.BIN = os.path.abspath(a.bin)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    fleet = harness.Fleet()
    driver = None
    try:
        brokers = fleet.start_broker()
        daemon = fleet.start_daemon(brokers, extra=["--log-level", "warn"])
        ui = "http://" + daemon.endpoints["ui"]
        jobs = {"big": ("ui-bench-%d" % a.ranks, a.ranks), "small": ("ui-bench-64", 64)}
        for name, ranks in jobs.values():
            started = time.monotonic()
            fleet.simulate(brokers, "--job", name, "--ranks", str(ranks), "--ranks-per-node", "8",
                           "--steps", str(a.steps), "--step-ms", "100", "--speed", "max", "--rate", str(a.rate),
                           "--sync", "ddp", "--report-collective", "--fault", "slow-compute:%d:0.3" % (ranks // 3),
                           timeout=1200)
            print("published %s: %d ranks x %d steps in %.1f s" % (name, ranks, a.steps, time.monotonic() - started),
                  flush=True)

        def stored(name):
            try:
                _, _, h = fetch_seconds(ui + "/api/v1/jobs/%s/heatmap" % name)
            except Exception:  # noqa: BLE001 - not yet
                return False
            return len(h["steps"]) >= min(100, a.steps)
        for name, _ in jobs.values():
            harness.wait_until(lambda: stored(name), 600, "the stored window of " + name, interval=1)

        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium")
        for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                     "--no-first-run", "--disable-background-networking", "--disable-component-update",
                     "--disable-sync", "--window-size=1400,1800",
                     "--user-data-dir=" + os.path.join(fleet.workdir, "chromium")):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
        results = {k: {"page_ms": [], "api_s": [], "api_bytes": 0} for k in jobs}
        for run in range(a.runs):
            for key, (name, ranks) in jobs.items():
                driver.get("about:blank")
                driver.get(ui + "/ui/jobs/" + name)
                canvas = harness.wait_until(
                    lambda: driver.find_elements(By.CSS_SELECTOR, "canvas#heatmap[data-drawn-at]"), 60,
                    "the heatmap of " + name, interval=0.02)[0]
                drawn = float(canvas.get_attribute("data-drawn-at"))
                seconds, size = fetch_binary_seconds(ui + "/api/v1/jobs/%s/heatmap?format=f32" % name)
                results[key]["page_ms"].append(drawn)
                results[key]["api_s"].append(seconds)
                results[key]["api_bytes"] = size
                print("run %d %s (%d ranks): page drawn at %.0f ms; heatmap API %.3f s, %.1f MB"
                      % (run + 1, key, ranks, drawn, seconds, size / 1e6), flush=True)
        summary = {k: {"ranks": jobs[k][1], "page_ms_median": round(statistics.median(v["page_ms"]), 1),
                       "page_ms": [round(x, 1) for x in v["page_ms"]],
                       "heatmap_api_s_median": round(statistics.median(v["api_s"]), 3),
                       "heatmap_api_mb": round(v["api_bytes"] / 1e6, 2)} for k, v in results.items()}
        summary["ratio_big_over_small"] = round(summary["big"]["page_ms_median"] / summary["small"]["page_ms_median"], 2)
        print(json.dumps(summary))
    finally:
        if driver is not None:
            driver.quit()
        fleet.close()


if __name__ == "__main__":
    main()
