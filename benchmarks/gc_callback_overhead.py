#!/usr/bin/python3
"""What watching Python's garbage collections costs (rankwatch.init(watch_gc=True), the default):
the gc.callbacks entry rankwatch installs (a native function, no Python frame) times every
collection from "start" to "stop" and accounts it to the collector's open step.

Two measurements, each in interleaved rounds (median of the rounds), against the same loop
without any callback in the same run, and beside a plain Python callback doing the same work
(for scale):
  * per collection: gc.collect(0) on a near-empty young generation, the cheapest collection
    there is, so the callback's cost shows whole;
  * a Python-heavy loop that allocates container objects (tuples, lists, dicts) and lets CPython
    collect on its own (a gen-0 collection every 700 net allocations, the most GC-heavy loop
    there is): the overhead on the loop's time, measured, and the per-collection cost over the
    interval between collections (the measured figure is within the machine's noise of a few
    per cent when it is shared).
Times are the thread's CPU time (time.thread_time_ns), less disturbed by other processes than
the wall clock.

Usage: RANKWATCH_PYTHON_DIR=build/python taskset -c 1 benchmarks/gc_callback_overhead.py [--rounds 15]
"""
import argparse
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.environ.get("RANKWATCH_PYTHON_DIR", os.path.join(os.path.dirname(__file__), "../build/python")))
from rankwatch import _native  # noqa: E402


def python_callback(native):
    start = [0]
    now, add = _native.now_ns, native.add_gc_pause

    def callback(phase, info):
        if phase == "start":
            start[0] = now()
        else:
            add(start[0], now())
    return callback


def per_collection_ns(calls):
    collect = gc.collect
    t0 = time.thread_time_ns()
    for _ in range(calls):
        collect(0)
    return (time.thread_time_ns() - t0) / calls


def allocation_loop(n):
    """Container allocations (what the collector tracks) that stay alive for 10,000 iterations,
    so that the young generation fills (a collection every 700 net allocations): (ns per
    iteration, gen-0 collections)."""
    before = gc.get_stats()[0]["collections"]
    t0 = time.thread_time_ns()
    keep = []
    for i in range(n):
        keep.append((i, [i], {"i": i}))
        if len(keep) == 10_000:
            keep = []
    elapsed = time.thread_time_ns() - t0
    return elapsed / n, gc.get_stats()[0]["collections"] - before


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=100_000, help="gc.collect(0) calls a round")
    p.add_argument("--iterations", type=int, default=300_000, help="allocation loop iterations a round")
    args = p.parse_args()
    native = _native.Collector("gc-bench", 0, 1, "bench", 0, 0, "cpu", "127.0.0.1:1", control_topic="",
                               watch_gc=True, properties={"log_level": "0"})
    native.begin_step(0)
    variants = {"none": None, "rankwatch": _native.gc_callback(native),
                "python callback": python_callback(native),
                "empty python callback": lambda phase, info: None}
    per_call = {k: [] for k in variants}
    loop = {k: [] for k in variants}
    collections = {k: [] for k in variants}
    names = list(variants)
    for r in range(args.rounds + 1):  # the first round warms the allocator up: not counted
        for name in names[r % len(names):] + names[:r % len(names)]:  # each its turn first
            cb = variants[name]
            if cb is not None:
                gc.callbacks.append(cb)
            try:
                call_ns = per_collection_ns(args.calls)
                loop_ns, n = allocation_loop(args.iterations)
            finally:
                if cb is not None:
                    gc.callbacks.remove(cb)
            if r > 0:
                per_call[name].append(call_ns)
                loop[name].append(loop_ns)
                collections[name].append(n)
    native.end_step()
    pauses = native.stats()["gc_pauses"]
    native.close(False, 0)

    # Each round's variants ran back to back: compare within the round, then take the median.
    def overhead(series, name):
        return statistics.median(v / b - 1 for v, b in zip(series[name], series["none"]))

    base_call = statistics.median(per_call["none"])
    print("gc.collect(0), near-empty young generation: %.0f ns a collection without a callback" % base_call)
    for name in names[1:]:
        o = overhead(per_call, name)
        print("  %-22s +%5.0f ns a collection (%+.0f %%)" % (name, o * base_call, 100 * o))
    base_loop = statistics.median(loop["none"])
    n_coll = statistics.median(collections["none"])
    print("allocation loop: %.1f ns an iteration, %d gen-0 collections in %d iterations (one every %.0f us)"
          % (base_loop, n_coll, args.iterations, base_loop * args.iterations / max(1, n_coll) / 1000))
    interval_ns = base_loop * args.iterations / max(1, n_coll)
    for name in names[1:]:
        o = overhead(loop, name)
        print("  %-22s measured %+.2f %%; its cost a collection over the interval: %.2f %%"
              % (name, 100 * o, 100 * overhead(per_call, name) * base_call / interval_ns))
    print("pauses recorded: %d" % pauses)


if __name__ == "__main__":
    main()
