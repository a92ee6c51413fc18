"""One rank of a small job that steps and then hangs, without PyTorch: the `rankwatch` package
(RANKWATCH_PYTHON_DIR) records its steps, and after --steps steps the rank blocks — the culprit
rank in load_shard(), the others in wait_for_peers() — while the package's stack responder
answers the daemon's stacks request (docs/diagnoses.md, "Hang stacks").

    hang_ranks.py --job J --brokers B --rank R --world W [--steps 100] [--culprit 3]
"""
import argparse
import time

import rankwatch


def load_shard():
    while True:
        time.sleep(0.5)


def wait_for_peers():
    while True:
        time.sleep(0.5)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True)
    p.add_argument("--brokers", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--culprit", type=int, default=3)
    a = p.parse_args()
    rw = rankwatch.init(job=a.job, brokers=a.brokers, rank=a.rank, world_size=a.world,
                        local_rank=a.rank, node="node-0", device="cpu", memory=False,
                        watch_gc=False)
    for _ in range(a.steps):
        with rw.step():
            with rw.phase("forward"):
                time.sleep(0.01)
            with rw.phase("backward"):
                time.sleep(0.01)
    rw.flush()
    if a.rank == a.culprit:
        load_shard()
    else:
        wait_for_peers()


if __name__ == "__main__":
    main()
