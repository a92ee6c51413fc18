"""Runs collectors/python/examples/ddp_example.py as a real 4-process DDP job (gloo on CPU),
the way torchrun would: one process per rank with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
and MASTER_PORT set. Children import the `rankwatch` package from $RANKWATCH_PYTHON_DIR."""
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
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

# glibc's malloc gives tensors of a few MiB fresh pages from mmap, or trims them off its heap,
# whenever its adaptive thresholds say so: in a run of this job, half the backward passes of a
# rank took 500-2,000 minor page faults, each ~15 us on this VM, adding 7-25 ms to a 7 ms
# local backward at random, in bursts that lasted for some ranks' whole run (measured with
# getrusage(RUSAGE_THREAD) around the backward pass). That is real compute time and rankwatch
# rightly reports it, but it drowned the faults the tests inject (a balanced job came out a
# compute straggler 1 run in 2). Fixed thresholds keep freed memory for reuse: no faults after
# the first steps. A CPU training job that sees the same can set this too.
STEADY_MALLOC = "glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824"


def torch_version(python=sys.executable):
    """The torch version `python` has (without a local suffix such as +cpu), or None. This
    interpreter's is read from the installed distribution's metadata, where the import that
    follows finds it (milliseconds: a subprocess importing torch took 1-2 s, at the import of
    every test module; a torch that is there but does not import fails the jobs of the test);
    another interpreter's by importing torch in it."""
    if python == sys.executable:
        try:
            return importlib.metadata.version("torch").split("+")[0]
        except importlib.metadata.PackageNotFoundError:
            return None
    r = subprocess.run([python, "-c", "import torch, torch.distributed; print(torch.__version__)"],
                       capture_output=True, text=True)
    return r.stdout.strip().split("+")[0] if r.returncode == 0 else None


def torch_available():
    """Whether this interpreter has torch. Where ctest set RANKWATCH_TORCH_VERSION (the version
    scripts/venv.sh pins), any other version, or none, fails the test module at import: a test
    of a real job never skips itself on the machines the project tests on."""
    version, expected = torch_version(), os.environ.get("RANKWATCH_TORCH_VERSION")
    if expected and version != expected:
        raise RuntimeError("these tests run on torch %s; %s has %s: run scripts/venv.sh (or "
                           "scripts/test.sh) to make the test environment"
                           % (expected, sys.executable, version or "no torch"))
    return version is not None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TorchJob:
    """The ranks of one training job; `wait()` returns each rank's final JSON line."""

    def __init__(self, workdir, job, brokers, steps, *args, world=4, steady_malloc=True,
                 script=EXAMPLE, launcher_env=None, python=None):
        """launcher_env: None to start each rank as torchrun would (RANK, WORLD_SIZE, LOCAL_RANK)
        and pass --job and --brokers; else a function rank -> the launcher's variables for that
        rank (e.g. Slurm's), and the ranks get neither --job nor --brokers, only
        $RANKWATCH_BROKERS: rankwatch.init() finds the rest. python: an interpreter with the
        package installed (a virtualenv's): then nothing is put on PYTHONPATH."""
        port = free_port()
        self.job, self.procs, self.files = job, [], []
        for rank in range(world):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                       PYTHONPATH=PYTHON_DIR)
            if python is not None:
                del env["PYTHONPATH"]
            if launcher_env is None:
                env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
                identity = ["--job", job, "--brokers", brokers]
            else:
                for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "RANKWATCH_JOB"):
                    env.pop(name, None)
                env.update(launcher_env(rank), RANKWATCH_BROKERS=brokers)
                identity = []
            if steady_malloc:
                env["GLIBC_TUNABLES"] = STEADY_MALLOC
            out = open(os.path.join(workdir, "%s-rank%d.out" % (job.replace("/", "_"), rank)), "w+")
            err = open(os.path.join(workdir, "%s-rank%d.err" % (job.replace("/", "_"), rank)), "w+")
            self.files.append((out, err))
            cmd = [python or sys.executable, script] + identity + ["--steps", str(steps)] + list(args)
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
