"""rankwatch.identity: what init() picks from each launcher's environment (the variables as
torchrun, Slurm's srun, Kubernetes' downward API and Kubeflow's training operator set them)."""
import os
import tempfile
import unittest

from rankwatch import identity

TORCHRUN = dict(TORCHELASTIC_RUN_ID="7f3c", RANK="5", WORLD_SIZE="8", LOCAL_RANK="1", GROUP_RANK="2",
                LOCAL_WORLD_SIZE="4")
SLURM = dict(SLURM_JOB_ID="4242", SLURM_PROCID="6", SLURM_NTASKS="16", SLURM_LOCALID="2", SLURM_NODEID="1",
             SLURMD_NODENAME="gpu-17")
KUBEFLOW = dict(POD_NAME="trainer-worker-5", POD_NAMESPACE="research", NODE_NAME="gpu-17", RANK="6",
                WORLD_SIZE="16")


class SchedulerTest(unittest.TestCase):
    def test_torchrun_names_the_job_after_its_run_id(self):
        s = identity.scheduler(TORCHRUN, podinfo_labels="/nonexistent")
        self.assertEqual((s["scheduler"], s["job"], s["scheduler_job"]), ("torchrun", "torchrun-7f3c", "7f3c"))

    def test_torchrun_default_run_id_is_no_job_id(self):
        # torchrun's --rdzv-id defaults to "none" (without --standalone): two jobs would share it.
        s = identity.scheduler(dict(TORCHRUN, TORCHELASTIC_RUN_ID="none"), podinfo_labels="/nonexistent")
        self.assertEqual((s["scheduler"], s["job"]), ("torchrun", ""))

    def test_slurm(self):
        s = identity.scheduler(SLURM, podinfo_labels="/nonexistent")
        self.assertEqual((s["scheduler"], s["job"], s["scheduler_job"], s["node"]),
                         ("slurm", "slurm-4242", "4242", "gpu-17"))

    def test_torchrun_under_slurm_is_the_slurm_job(self):
        # Each node's torchrun has its own view; the Slurm job is the same on every node.
        s = identity.scheduler(dict(SLURM, **TORCHRUN), podinfo_labels="/nonexistent")
        self.assertEqual(s["job"], "slurm-4242")

    def test_kubeflow_pod_names_give_the_owner(self):
        s = identity.scheduler(KUBEFLOW, podinfo_labels="/nonexistent")
        self.assertEqual((s["scheduler"], s["job"], s["namespace"], s["owner"], s["pod"], s["node"]),
                         ("kubernetes", "research/trainer", "research", "trainer", "trainer-worker-5", "gpu-17"))
        master = identity.scheduler(dict(KUBEFLOW, POD_NAME="trainer-master-0"), podinfo_labels="/nonexistent")
        self.assertEqual(master["job"], "research/trainer")

    def test_downward_api_labels_win_over_the_pod_name(self):
        with tempfile.NamedTemporaryFile("w", suffix=".labels", delete=False) as f:
            f.write('app="x"\ntraining.kubeflow.org/job-name="llm-pretrain"\n')
        try:
            s = identity.scheduler(dict(KUBEFLOW, POD_NAME="llm-pretrain-worker-0-abcde"), podinfo_labels=f.name)
        finally:
            os.unlink(f.name)
        self.assertEqual((s["owner"], s["job"]), ("llm-pretrain", "research/llm-pretrain"))

    def test_a_pod_without_an_owner_names_no_job(self):
        s = identity.scheduler(dict(POD_NAME="notebook-7", POD_NAMESPACE="dev"), podinfo_labels="/nonexistent")
        self.assertEqual((s["scheduler"], s["pod"], s["job"]), ("kubernetes", "notebook-7", ""))
        s = identity.scheduler(dict(POD_NAME="notebook-7", POD_NAMESPACE="dev", RANKWATCH_OWNER="nb"),
                               podinfo_labels="/nonexistent")
        self.assertEqual(s["job"], "dev/nb")

    def test_no_scheduler(self):
        s = identity.scheduler({}, podinfo_labels="/nonexistent")
        self.assertEqual((s["scheduler"], s["job"]), ("", ""))


class DetectTest(unittest.TestCase):
    def test_torchrun_variables(self):
        who = identity.detect(env=TORCHRUN, device="cpu")
        self.assertEqual((who["rank"], who["world_size"], who["local_rank"]), (5, 8, 1))

    def test_slurm_variables(self):
        who = identity.detect(env=SLURM, device="cpu")
        self.assertEqual((who["rank"], who["world_size"], who["local_rank"], who["node"]), (6, 16, 2, "gpu-17"))

    def test_torchrun_wins_over_slurm_for_the_rank(self):
        who = identity.detect(env=dict(SLURM, **TORCHRUN), device="cpu")
        self.assertEqual((who["rank"], who["world_size"]), (5, 8))

    def test_kubernetes_node_name(self):
        self.assertEqual(identity.detect(env=KUBEFLOW, device="cpu")["node"], "gpu-17")

    def test_explicit_arguments_win(self):
        who = identity.detect(rank=1, world_size=2, local_rank=0, node="n", device="cpu", env=TORCHRUN)
        self.assertEqual((who["rank"], who["world_size"], who["node"]), (1, 2, "n"))


if __name__ == "__main__":
    unittest.main()
