#!/usr/bin/python3
"""Per-step cost of the rankwatch Python instrumentation on one process, without the noise of
a 4-rank job: the PyTorch example's model, loop and hooks (DataLoader timing, step scope,
forward/backward hooks, optimizer.step, DDP comm hook, peak-RSS probe) in a 1-rank DDP job
(gloo on CPU, one thread), with and without the collector, interleaved step by step (ABBA)
so that drift in machine load cancels. Prints quartiles of the CPU time per step of the whole
process (every thread: hooks, the sender, librdkafka) and of the wall time per step; the
difference of the medians is what the collector costs a step.

    RANKWATCH_PYTHON_DIR=build/python benchmarks/collector_step_cost.py --build build
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Loop:
    """One training setup stepped one iteration at a time, the example's loop body."""

    def __init__(self, rw, model, loader, optimizer, loss_fn):
        self.rw, self.model, self.loader = rw, model, loader
        self.optimizer, self.loss_fn = optimizer, loss_fn
        self.batches = rw.dataloader(loader)

    def step(self):
        """One iteration; returns (process CPU seconds, wall seconds) it took."""
        cpu0, wall0 = time.process_time(), time.perf_counter()
        try:
            x, y = next(self.batches)
        except StopIteration:  # epoch end: not counted (both setups have the same epochs)
            self.batches = self.rw.dataloader(self.loader)
            x, y = next(self.batches)
            cpu0, wall0 = time.process_time(), time.perf_counter()
        with self.rw.step():
            loss = self.loss_fn(self.model(x), y)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        return time.process_time() - cpu0, time.perf_counter() - wall0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--steps", type=int, default=3000,
                   help="steps of each setup, interleaved one by one (ABBA)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--width", type=int, default=128)
    args = p.parse_args()
    sys.path.insert(0, os.environ.get("RANKWATCH_PYTHON_DIR", os.path.join(args.build, "python")))
    sys.path.insert(0, os.path.join(ROOT, "collectors", "python", "examples"))
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    import rankwatch
    from ddp_example import Net, SlowInput

    broker = subprocess.Popen([os.path.join(args.build, "bin", "rankwatch"), "kafka"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    brokers = broker.stdout.readline().strip()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    data = TensorDataset(torch.randn(args.batch * 64, 16), torch.randn(args.batch * 64, 1))
    loader = DataLoader(data, batch_size=args.batch, collate_fn=SlowInput(0.0), drop_last=True)
    loss_fn = nn.MSELoss()
    loops = {}
    for mode in ("without", "with"):
        rw = rankwatch.init(job="step-cost", brokers=brokers, enabled=(mode == "with"))
        model = DDP(Net(args.width))
        rw.instrument_ddp(model)
        rw.instrument_module(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        rw.instrument_optimizer(optimizer)
        loops[mode] = Loop(rw, model, loader, optimizer, loss_fn)
        for _ in range(50):  # warm-up
            loops[mode].step()
    results = {"with": [], "without": []}
    try:
        for i in range(args.steps):
            for mode in ("without", "with") if i % 2 == 0 else ("with", "without"):
                results[mode].append(loops[mode].step())
    finally:
        loops["with"].rw.close()
        broker.terminate()
        broker.wait()
    out = {"steps": args.steps}
    for k, name in ((0, "cpu"), (1, "wall")):
        w = sorted(r[k] for r in results["with"])
        wo = sorted(r[k] for r in results["without"])
        q = lambda v, f: v[int(f * (len(v) - 1))] * 1e6
        out[name + "_us_per_step_without"] = [round(q(wo, f), 1) for f in (0.25, 0.5, 0.75)]
        out[name + "_us_per_step_with"] = [round(q(w, f), 1) for f in (0.25, 0.5, 0.75)]
        out[name + "_median_diff_us"] = round(q(w, 0.5) - q(wo, 0.5), 1)
        out[name + "_median_ratio"] = round(statistics.median(w) / statistics.median(wo) - 1, 4)
    print("quartiles (25/50/75 %) per step, us:")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
