"""Runs collectors/python/examples/ddp_example.py as a real 4-process DDP job (gloo on CPU),
the way torchrun would: one process per rank with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
and MASTER_PORT set. Children import the `rankwatch` package from $RANKWATCH_PYTHON_DIR."""
import json
import os
import socket
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.environ.get("RANKWATCH_EXAMPLE",
                         os.path.join(HERE, "../../collectors/python/examples/ddp_example.py"))
PYTHON_DIR = os.environ.get("RANKWATCH_PYTHON_DIR", os.path.join(HERE, "../../build/python"))


# For jobs whose diagnosis a test asserts. 4 CPU-bound ranks on 2 shared cores queue for the
# CPU: equal ranks then differ in compute by up to 10 % for a whole run, and a slowed rank
# computes alone while the others wait, which hides half its slowdown. Per-step device time
# (12 ms, simulated with sleeps: the host thread of a GPU job waits for its kernels the same
# way), a narrower model and a 6 ms input pipeline keep the job under one core, the input share
# at ~0.2 and the compute share at ~0.8 (a balanced job, neither input- nor compute-bound).
DIAGNOSED_JOB_ARGS = ("--device-ms", "12", "--width", "64", "--input-ms", "6")


def torch_available():
    r = subprocess.run(["/usr/bin/python3", "-c", "import torch, torch.distributed"],
                       capture_output=True)
    return r.returncode == 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TorchJob:
    """The ranks of one training job; `wait()` returns each rank's final JSON line."""

    def __init__(self, workdir, job, brokers, steps, *args, world=4):
        port = free_port()
        self.job, self.procs, self.files = job, [], []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                       PYTHONPATH=PYTHON_DIR)
            out = open(os.path.join(workdir, "%s-rank%d.out" % (job, rank)), "w+")
            err = open(os.path.join(workdir, "%s-rank%d.err" % (job, rank)), "w+")
            self.files.append((out, err))
            cmd = ["/usr/bin/python3", EXAMPLE, "--job", job, "--brokers", brokers,
                   "--steps", str(steps)] + list(args)
            self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, env=env,
                                               stdin=subprocess.DEVNULL))
        self.started = time.time()

    def wait(self, timeout):
        deadline = time.monotonic() + timeout
        results = []
        for p, (out, err) in zip(self.procs, list(self.files)):
            try:
                code = p.wait(max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError("job %s: a rank ran past %d s" % (self.job, timeout))
            out.seek(0)
            err.seek(0)
            text = out.read()
            if code != 0:
                raise AssertionError("job %s: a rank exited %d: %s" % (self.job, code, err.read()[-3000:]))
            results.append(json.loads(text.strip().splitlines()[-1]))
        self.close()
        return sorted(results, key=lambda r: r["rank"])

    def close(self):
        for out, err in self.files:
            out.close()
            err.close()
        self.files = []

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.close()
