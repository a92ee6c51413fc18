"""`rankwatch.init()` with no arguments on real 4-rank PyTorch DDP jobs (gloo on CPU,
collectors/python/examples/ddp_example.py, which passes no job id or brokers): started by
PyTorch's own `torchrun` (torch.distributed.run of the test environment's torch), by hand with the variables Slurm's srun sets, and with the Kubernetes
downward-API variables a Kubeflow PyTorchJob's pods get. Only $RANKWATCH_BROKERS says where
Kafka is. Each job must be diagnosed under the id the scheduler gives it, and the diagnosis must
say where its culprit runs (pod and node where given) — in gRPC, `rankwatch diagnose` and the
`rankwatch_job_info` metric."""
import os
import re
import subprocess
import sys
import unittest

from harness import BIN, DaemonTestCase, metric, parse_metrics, scrape, wait_until
from rankwatch.v1 import service_pb2
from torch_job import DIAGNOSED_JOB_ARGS, EXAMPLE, PYTHON_DIR, STEADY_MALLOC, TorchJob, torch_available

# PyTorch's torchrun: the console script is `python -m torch.distributed.run`.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
STEPS = int(os.environ.get("RANKWATCH_TEST_STEPS", "60"))
SLOW_INPUT = ("--fault-slow-input-ms", "30")
STRAGGLERS = ("STEP_STRAGGLER", "STEP_INPUT_STRAGGLER")


@unittest.skipUnless(torch_available(), "torch is not installed for this interpreter (scripts/venv.sh)")
class ZeroConfigTest(DaemonTestCase):

    def aligned(self, job):
        wait_until(lambda: metric(parse_metrics(scrape(self.daemon)), "rankwatch_steps_aligned_total",
                                  training_job=job) == STEPS, 60, "%s: every step aligned" % job)
        return self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job), timeout=10)

    def diagnose_text(self, job):
        r = subprocess.run([os.path.join(BIN, "rankwatch"), "diagnose", "--server", self.daemon.endpoints["grpc"],
                            "--job", job], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        print(r.stdout)
        return r.stdout

    def job_info(self, job):
        return [(labels, v) for name, labels, v in parse_metrics(scrape(self.daemon))
                if name == "rankwatch_job_info" and labels.get("training_job") == job]

    def test_torchrun(self):
        """torchrun --standalone: the job is named after the rendezvous' run id."""
        env = dict(os.environ, RANKWATCH_BROKERS=self.brokers, PYTHONPATH=PYTHON_DIR, OMP_NUM_THREADS="1",
                   GLIBC_TUNABLES=STEADY_MALLOC)
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "RANKWATCH_JOB", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(name, None)
        # The ranks inherit torchrun's stderr: each logs its one line there.
        r = subprocess.run([*TORCHRUN, "--standalone", "--nproc_per_node", "4", EXAMPLE, "--steps", str(STEPS),
                            *DIAGNOSED_JOB_ARGS],
                           capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        lines = re.findall(r"rankwatch: job '(torchrun-[^']+)' \(from torchrun\), rank (\d) of 4", r.stderr)
        print("\n".join(l for l in r.stderr.splitlines() if l.startswith("rankwatch: job")))
        self.assertEqual(sorted(int(rank) for _, rank in lines), [0, 1, 2, 3], "one line a rank:\n" + r.stderr[-3000:])
        picked = {job for job, _ in lines}
        self.assertEqual(len(picked), 1, picked)
        job = picked.pop()
        jobs = [j.training_job for j in self.stub.ListJobs(service_pb2.ListJobsRequest(), timeout=10).jobs]
        self.assertIn(job, jobs)
        d = self.aligned(job)
        self.assertEqual(d.step.window.world_size, 4)
        self.assertEqual((d.scheduler.scheduler, "torchrun-" + d.scheduler.job), ("torchrun", job))
        info = self.job_info(job)
        self.assertEqual(len(info), 1, info)
        self.assertEqual(info[0][0]["scheduler"], "torchrun")

    def test_slurm(self):
        """srun's variables: the Slurm job id names the job, SLURMD_NODENAME each rank's node."""
        def slurm(rank):
            return dict(SLURM_JOB_ID="4242", SLURM_PROCID=str(rank), SLURM_NTASKS="4",
                        SLURM_LOCALID=str(rank % 2), SLURM_NODEID=str(rank // 2),
                        SLURMD_NODENAME="slurm-node-%d" % (rank // 2))
        ranks = TorchJob(self.fleet.workdir, "slurm-4242", self.brokers, STEPS, *DIAGNOSED_JOB_ARGS,
                         "--fault-slow-input-rank", "3", *SLOW_INPUT, launcher_env=slurm).wait(timeout=240)
        self.assertEqual([r["steps"] for r in ranks], [STEPS] * 4)
        d = self.aligned("slurm-4242")
        self.assertEqual((d.scheduler.scheduler, d.scheduler.job), ("slurm", "4242"))
        self.assertIn(service_pb2.StepDiagnosisLabel.Name(d.step.label), STRAGGLERS, d.step.note)
        self.assertEqual(list(d.step.culprit_ranks), [3], d.step.note)
        self.assertEqual(d.step.culprit_node, "slurm-node-1")
        detail = self.stub.GetRankDetail(service_pb2.GetRankDetailRequest(training_job="slurm-4242", rank=0),
                                         timeout=10)
        self.assertEqual(detail.node, "slurm-node-0")
        self.assertIn("culprit: rank 3 on node slurm-node-1", self.diagnose_text("slurm-4242"))
        info = self.job_info("slurm-4242")
        self.assertEqual([(l["scheduler"], l["scheduler_job"], v) for l, v in info], [("slurm", "4242", 1.0)])

    def test_kubeflow_pytorchjob(self):
        """A PyTorchJob's pods: namespace/owner names the job; the culprit's pod and node are shown."""
        def pod(rank):
            name = "trainer-master-0" if rank == 0 else "trainer-worker-%d" % (rank - 1)
            # The training operator sets RANK and WORLD_SIZE itself (one process a pod).
            return dict(POD_NAME=name, POD_NAMESPACE="research", NODE_NAME="k8s-node-%d" % (rank // 2),
                        RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK="0")
        ranks = TorchJob(self.fleet.workdir, "research/trainer", self.brokers, STEPS, *DIAGNOSED_JOB_ARGS,
                         "--fault-slow-input-rank", "2", *SLOW_INPUT, launcher_env=pod).wait(timeout=240)
        self.assertEqual([r["steps"] for r in ranks], [STEPS] * 4)
        d = self.aligned("research/trainer")
        self.assertEqual((d.scheduler.scheduler, d.scheduler.namespace, d.scheduler.owner),
                         ("kubernetes", "research", "trainer"))
        self.assertEqual(list(d.step.culprit_ranks), [2], d.step.note)
        self.assertEqual(list(d.step.culprit_pods), ["trainer-worker-1"])
        self.assertEqual(d.step.culprit_node, "k8s-node-1")
        detail = self.stub.GetRankDetail(service_pb2.GetRankDetailRequest(training_job="research/trainer", rank=0),
                                         timeout=10)
        self.assertEqual((detail.pod, detail.node), ("trainer-master-0", "k8s-node-0"))
        summary = [j for j in self.stub.ListJobs(service_pb2.ListJobsRequest(), timeout=10).jobs
                   if j.training_job == "research/trainer"][0]
        self.assertEqual(list(summary.culprit_pods), ["trainer-worker-1"])
        self.assertIn("culprit: rank 2 \u2014 pod trainer-worker-1 on node k8s-node-1",
                      self.diagnose_text("research/trainer"))
        info = self.job_info("research/trainer")
        self.assertEqual([(l["scheduler"], l["namespace"], l["owner"], v) for l, v in info],
                         [("kubernetes", "research", "trainer", 1.0)])


if __name__ == "__main__":
    unittest.main()
