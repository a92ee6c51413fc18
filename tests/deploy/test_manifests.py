"""Static checks of deploy/: Kubernetes manifests parse as multi-document YAML with the fields
a cluster requires, derived manifests match their sources, the dashboard has what Grafana
provisioning needs, configs are accepted by the real rankwatchd, the systemd unit verifies,
and the Dockerfile fetches nothing but Debian packages."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

import deploy_files

DEPLOY = deploy_files.DEPLOY
K8S = os.path.join(DEPLOY, "kubernetes")
BIN = os.environ.get("RANKWATCH_BIN", os.path.join(deploy_files.ROOT, "build/bin"))
sys.path.insert(0, K8S)
import generate  # noqa: E402


# Strategic-merge patches of the overlays: partial objects.
PATCHES = {"kafka-sasl-ssl/config-from-secret.yaml"}


def k8s_documents(patches=False):
    """(file, document) of every manifest under deploy/kubernetes (kustomizations excluded)."""
    for path in sorted(glob.glob(os.path.join(K8S, "**/*.yaml"), recursive=True)):
        rel = os.path.relpath(path, K8S)
        if os.path.basename(path) == "kustomization.yaml" or (rel in PATCHES and not patches):
            continue
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc is not None:
                    yield os.path.relpath(path, K8S), doc


def pod_spec(doc):
    kind = doc["kind"]
    if kind == "Pod":
        return doc["spec"]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return doc["spec"]["template"]["spec"]
    return None


def by_kind(kind, name=None):
    return [d for _, d in k8s_documents() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


class KubernetesManifestTest(unittest.TestCase):
    def test_every_document_has_the_required_fields(self):
        docs = list(k8s_documents(patches=True))
        self.assertGreaterEqual(len(docs), 12)
        for path, d in docs:
            with self.subTest(path=path, kind=d.get("kind")):
                self.assertRegex(d.get("apiVersion", ""), r"^([a-z0-9.-]+/)?v\d+(alpha\d+|beta\d+)?$")
                self.assertRegex(d.get("kind", ""), r"^[A-Z][A-Za-z]+$")
                name = d["metadata"]["name"]
                self.assertRegex(name, r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
                spec = pod_spec(d)
                if spec is None or path in PATCHES:
                    continue
                containers = spec["containers"] + spec.get("initContainers", [])
                for c in containers:
                    self.assertTrue(c.get("name") and c.get("image"), c)
                    self.assertIn("requests", c.get("resources", {}), c["name"])
                volumes = {v["name"]: v for v in spec.get("volumes", [])}
                for c in containers:
                    for m in c.get("volumeMounts", []):
                        self.assertIn(m["name"], volumes, "%s mounts an undefined volume" % c["name"])

    def test_the_daemon_deployment(self):
        (dep,) = by_kind("Deployment", "rankwatchd")
        spec = pod_spec(dep)
        (c,) = spec["containers"]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        self.assertEqual(ports, {"metrics": 9466, "grpc": 7466, "ui": 8466})
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            self.assertEqual(c[probe]["grpc"]["port"], ports["grpc"], probe)
        self.assertTrue(spec["securityContext"]["runAsNonRoot"])
        self.assertIn("limits", c["resources"])
        # The state dir flag points at the PVC's mount, and the PVC exists.
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        state_dir = next(a.split("=", 1)[1] for a in c["args"] if a.startswith("--state-dir="))
        state_volume = next(n for n, p in mounts.items() if p == state_dir)
        claim = volumes[state_volume]["persistentVolumeClaim"]["claimName"]
        self.assertEqual(len(by_kind("PersistentVolumeClaim", claim)), 1)
        config = next(a.split("=", 1)[1] for a in c["args"] if a.startswith("--config="))
        self.assertEqual(os.path.dirname(config), mounts["config"])
        self.assertEqual(len(by_kind("ConfigMap", volumes["config"]["configMap"]["name"])), 1)
        self.assertEqual(dep["spec"]["strategy"]["type"], "Recreate")  # the state dir is locked

    def test_service_and_service_monitor_select_the_daemon(self):
        (dep,) = by_kind("Deployment", "rankwatchd")
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        (svc,) = by_kind("Service", "rankwatchd")
        self.assertLessEqual(svc["spec"]["selector"].items(), pod_labels.items())
        self.assertEqual({p["name"] for p in svc["spec"]["ports"]}, {"metrics", "grpc", "ui"})
        (sm,) = by_kind("ServiceMonitor")
        self.assertLessEqual(sm["spec"]["selector"]["matchLabels"].items(), svc["metadata"]["labels"].items())
        self.assertEqual(sm["spec"]["endpoints"][0]["port"], "metrics")

    def test_training_job_runs_the_agent_as_a_native_sidecar(self):
        (job,) = by_kind("Job")
        spec = pod_spec(job)
        (agent,) = [c for c in spec["initContainers"] if c["name"] == "rankwatch-agent"]
        self.assertEqual(agent.get("restartPolicy"), "Always")
        self.assertEqual(agent["args"][0], "agent")
        self.assertTrue(agent["command"][0].endswith("/rankwatch"))
        trainer = spec["containers"][0]
        for c in (agent, trainer):
            self.assertIn({"configMapRef": {"name": "rankwatch-collector"}}, c["envFrom"])
        self.assertEqual(len(by_kind("ConfigMap", "rankwatch-collector")), 1)
        rankwatch = os.path.join(BIN, "rankwatch")
        if os.path.exists(rankwatch):  # every flag of the sidecar is one `rankwatch agent` knows
            help_text = subprocess.run([rankwatch, "agent", "--help"], capture_output=True, text=True,
                                       timeout=10).stdout
            known = set(re.findall(r"(--[a-z][a-z-]*)", help_text))
            for arg in agent["args"][1:]:
                self.assertIn(arg.split("=", 1)[0], known, arg)

    def test_prometheus_rule_has_the_same_rules_as_deploy_prometheus(self):
        (rule,) = by_kind("PrometheusRule")
        groups = []
        for path in deploy_files.RULE_FILES:
            with open(path) as f:
                groups += yaml.safe_load(f)["groups"]
        self.assertEqual(rule["spec"]["groups"], groups)

    def test_dashboard_config_map_embeds_the_same_json_for_grafanas_sidecar(self):
        (cm,) = by_kind("ConfigMap", "rankwatch-grafana-dashboard")
        self.assertEqual(cm["metadata"]["labels"]["grafana_dashboard"], "1")
        self.assertEqual(json.loads(cm["data"]["rankwatch.json"]), deploy_files.load_dashboard())

    def test_generated_manifests_are_up_to_date(self):
        for name, make in generate.OUTPUTS.items():
            with open(os.path.join(K8S, name)) as f:
                self.assertEqual(f.read(), make(), "run /usr/bin/python3 deploy/kubernetes/generate.py")

    def test_kafka_overlay_mounts_its_secret_config_and_passes_sasl_ssl_through(self):
        (secret,) = by_kind("Secret", "rankwatchd-kafka")
        config = yaml.safe_load(secret["stringData"]["rankwatchd.yaml"])
        self.assertEqual(config["kafka"]["security.protocol"], "SASL_SSL")
        self.assertIn("sasl.mechanisms", config["kafka"])
        self.assertEqual(os.path.dirname(config["kafka"]["ssl.ca.location"]), "/etc/rankwatch")
        self.assertIn(os.path.basename(config["kafka"]["ssl.ca.location"]), secret["stringData"])

    @unittest.skipUnless(shutil.which("kubectl"), "kubectl not installed")
    def test_kustomize_renders_base_and_overlay(self):
        for d in ("base", "kafka-sasl-ssl"):
            r = subprocess.run(["kubectl", "kustomize", os.path.join(K8S, d)], capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            docs = [x for x in yaml.safe_load_all(r.stdout) if x]
            kinds = {x["kind"] for x in docs}
            self.assertLessEqual({"Deployment", "Service", "ServiceMonitor", "PrometheusRule", "ConfigMap",
                                  "PersistentVolumeClaim"}, kinds)
            (dep,) = [x for x in docs if x["kind"] == "Deployment"]
            (config,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"]
            self.assertEqual(set(config) - {"name"}, {"secret"} if d == "kafka-sasl-ssl" else {"configMap"})


class DashboardTest(unittest.TestCase):
    def test_stable_uid_variable_and_panels(self):
        d = deploy_files.load_dashboard()
        self.assertEqual(d["uid"], "rankwatch-training-jobs")
        names = [v["name"] for v in d["templating"]["list"]]
        self.assertIn("training_job", names)
        titles = " | ".join(p["title"] for p in deploy_files.dashboard_panels(d)).lower()
        for wanted in ("step-time diagnosis", "memory diagnosis", "median vs worst", "straggler scores", "skew",
                       "shares", "memory peaks", "memory creep", "gpu time breakdown", "ingest lag",
                       "rejected input", "aligned"):
            self.assertIn(wanted, titles)
        ids = [p["id"] for p in deploy_files.dashboard_panels(d)]
        self.assertEqual(len(ids), len(set(ids)))
        for title, ref, expr in deploy_files.dashboard_queries(d):
            self.assertNotRegex(expr, r'rankwatch_\w+\{[^}]*\bjob\s*=', "%s: the job label is training_job" % title)
            if "rankwatch_" in expr and "training_job" in expr:
                self.assertIn('training_job=~"$training_job"', expr, title)

    def test_provisioning_files(self):
        with open(os.path.join(DEPLOY, "grafana/provisioning/dashboards/rankwatch.yaml")) as f:
            provider = yaml.safe_load(f)["providers"][0]
        self.assertEqual(provider["type"], "file")
        with open(os.path.join(DEPLOY, "grafana/provisioning/datasources/rankwatch.yaml")) as f:
            ds = yaml.safe_load(f)["datasources"][0]
        self.assertEqual(ds["type"], "prometheus")


class DockerfileTest(unittest.TestCase):
    PATH = os.path.join(DEPLOY, "docker/Dockerfile")

    def instructions(self):
        with open(self.PATH) as f:
            text = re.sub(r"\\\n", " ", f.read())
        return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]

    def test_multi_stage_debian_non_root_with_grpc_health_check(self):
        lines = self.instructions()
        froms = [l.split()[1] for l in lines if l.startswith("FROM ")]
        self.assertGreaterEqual(len(froms), 2)
        for image in froms:
            self.assertRegex(image, r"^debian:bookworm(-slim)?$")
        user = [l for l in lines if l.startswith("USER ")][-1].split()[1]
        self.assertNotIn(user.split(":")[0], ("root", "0"))
        health = [l for l in lines if l.startswith("HEALTHCHECK ")]
        self.assertEqual(len(health), 1)
        self.assertIn("rankwatch-health-check", health[0])
        self.assertIn("COPY deploy/docker/grpc_health_check.py /usr/local/bin/rankwatch-health-check", lines)
        self.assertTrue(os.path.exists(os.path.join(deploy_files.ROOT, ".dockerignore")))

    def test_nothing_is_fetched_but_debian_packages(self):
        runs = [l for l in self.instructions() if l.startswith("RUN ")]
        self.assertTrue(runs)
        for run in runs:
            self.assertNotRegex(run, r"\b(curl|wget|git\s+clone|pip3?|npm|go\s+get|ADD)\b|https?://", run)
        for line in self.instructions():
            self.assertFalse(line.startswith("ADD "), "ADD can fetch URLs: use COPY")
        for run in runs:
            for command in re.split(r"&&|;", run[len("RUN "):]):
                words = command.split()
                if words and words[0] == "apt-get":
                    self.assertIn(words[1], ("update", "install"), command)

    # scripts/deps.sh packages the build does not need: test, demo and developer tools.
    NOT_FOR_THE_BUILD = {"ccache", "git", "kcat", "prometheus", "prometheus-alertmanager", "curl", "python3",
                         "python3-grpcio", "python3-protobuf", "python3-confluent-kafka", "python3-yaml",
                         "python3-numpy", "python3-torch",
                         # the Python wheel, for users' virtualenvs: the image does not ship it
                         "python3-venv", "python3-build", "python3-setuptools", "python3-wheel",
                         # the web UI's browser test
                         "chromium", "chromium-driver", "python3-selenium"}

    def test_build_stage_installs_the_build_dependencies_of_deps_sh(self):
        with open(os.path.join(deploy_files.ROOT, "scripts/deps.sh")) as f:
            deps = set(re.search(r"PACKAGES=\((.*?)\)", f.read(), re.S).group(1).split())
        build = " ".join(self.instructions()).split("FROM debian:bookworm-slim", 1)[0]
        installed = set(re.search(r"apt-get install (.*?)&&", build).group(1).split()) - {"-y", "-q", "--no-install-recommends"}
        self.assertEqual(set(), installed - deps, "the Dockerfile installs packages scripts/deps.sh does not list")
        self.assertEqual(set(), deps - installed - self.NOT_FOR_THE_BUILD,
                         "scripts/deps.sh lists packages the image build lacks: add them to the Dockerfile")

    def test_runtime_stage_has_every_library_the_programs_link(self):
        binaries = [os.path.join(BIN, b) for b in ("rankwatchd", "rankwatch")]
        if not all(os.path.exists(b) for b in binaries):
            self.skipTest("binaries not built")
        runtime = " ".join(self.instructions()).split("FROM debian:bookworm-slim", 1)[1]
        packages = set(re.findall(r"\b(lib[a-z0-9.+-]+|zlib1g|ca-certificates|python3-grpcio)\b", runtime))
        needed = set()
        for b in binaries:
            ldd = subprocess.run(["ldd", b], capture_output=True, text=True, timeout=30).stdout
            for path in re.findall(r"=> (/\S+)", ldd):
                for candidate in (os.path.realpath(path), path, re.sub(r"^/usr/lib/", "/lib/", os.path.realpath(path))):
                    r = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
                    if r.returncode == 0:
                        needed.add(r.stdout.split(":")[0])
                        break
        in_base_image = {"libc6", "libgcc-s1", "libstdc++6"}  # bookworm-slim's apt needs them
        self.assertEqual(set(), needed - packages - in_base_image)


class ConfigFilesTest(unittest.TestCase):
    """Every example config is read by the real rankwatchd: an unknown key or a bad value is a
    one-line error at start; a good config gets as far as Kafka."""

    def configs(self):
        yield "rankwatchd.example.yaml", open(os.path.join(DEPLOY, "rankwatchd.example.yaml")).read()
        yield "systemd/rankwatchd.yaml", open(os.path.join(DEPLOY, "systemd/rankwatchd.yaml")).read()
        (cm,) = by_kind("ConfigMap", "rankwatchd-config")
        yield "kubernetes ConfigMap", cm["data"]["rankwatchd.yaml"]
        (secret,) = by_kind("Secret", "rankwatchd-kafka")
        yield "kubernetes kafka Secret", secret["stringData"]["rankwatchd.yaml"]

    def test_rankwatchd_accepts_every_example_config(self):
        daemon = os.path.join(BIN, "rankwatchd")
        if not os.path.exists(daemon):
            self.skipTest("rankwatchd not built")
        for name, text in self.configs():
            with self.subTest(config=name), tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "rankwatchd.yaml")
                with open(path, "w") as f:
                    f.write(text)
                try:
                    r = subprocess.run([daemon, "--config", path, "--state-dir", os.path.join(tmp, "state"),
                                        "--metrics-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--ui-listen", "127.0.0.1:0"],
                                       capture_output=True, text=True, timeout=3)
                    out = r.stderr
                except subprocess.TimeoutExpired as e:  # still running: the config was fine
                    out = (e.stderr or b"").decode(errors="replace")
                self.assertNotIn("config " + path, out)

    def test_a_bad_key_is_caught_by_this_check(self):
        daemon = os.path.join(BIN, "rankwatchd")
        if not os.path.exists(daemon):
            self.skipTest("rankwatchd not built")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "bad.yaml")
            with open(path, "w") as f:
                f.write("brokers: 127.0.0.1:1\nwindow-step: 100\n")
            r = subprocess.run([daemon, "--config", path, "--state-dir", os.path.join(tmp, "state")],
                               capture_output=True, text=True, timeout=10)
            self.assertIn("config " + path, r.stderr)
            self.assertNotEqual(r.returncode, 0)


class SystemdUnitTest(unittest.TestCase):
    @unittest.skipUnless(shutil.which("systemd-analyze"), "systemd-analyze not installed")
    def test_unit_verifies(self):
        daemon = os.path.join(BIN, "rankwatchd")
        if not os.path.exists(daemon):
            self.skipTest("rankwatchd not built")
        with open(os.path.join(DEPLOY, "systemd/rankwatchd.service")) as f:
            unit = f.read()
        self.assertIn("ExecStart=/usr/local/bin/rankwatchd --config /etc/rankwatch/rankwatchd.yaml", unit)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "rankwatchd.service")
            with open(path, "w") as f:  # the installed path does not exist on a build machine
                f.write(unit.replace("/usr/local/bin/rankwatchd", os.path.abspath(daemon)))
            r = subprocess.run(["systemd-analyze", "verify", path], capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, SYSTEMD_LOG_LEVEL="warning"))
            problems = [l for l in (r.stdout + r.stderr).splitlines() if "rankwatchd.service" in l]
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual(problems, [])


if __name__ == "__main__":
    unittest.main()
