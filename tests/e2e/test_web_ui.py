"""The web UI in a real browser, and its JSON API against gRPC.

A development broker, rankwatchd and a simulated 64-rank job (8 nodes of 8 ranks) whose rank 37
is 30 % slower in compute and whose memory creeps. Then:
- the JSON API answers with the same messages as gRPC for the same snapshot (ListJobs,
  GetDiagnosis, GetRankDetail, ListCaptures), read back with protobuf's own JSON parser;
- headless Chromium (Debian's chromium and chromium-driver, driven by Debian's python3-selenium)
  shows what a person would see: the fleet page lists the job with its diagnosis and culprit; the
  job page's heatmap marks the culprit's row (the pixels of the canvas are read back) and the
  memory chart is drawn; the rank page shows the culprit's forward excess and its chart over the
  window, and a replayed real Kineto trace's rank its GPU timeline. A screenshot of each page goes
  to build/test-artifacts/web_ui/;
- the API and the UI are read-only, and unknown paths and bad parameters are clear 4xx errors.

The fleet view of nodes (issue #38), in another daemon: three 16-rank jobs one after another,
each with another rank of node-1 slow (9, 10, 14; 8 ranks a node). node-1's record shows the 3
jobs, their ranks and their summed cost, and the node alert fires; the JSON API answers as
ListNodes does; `rankwatch nodes` and `rankwatch alerts` print it; in Chromium the Nodes page
lists node-1 with 3 jobs, a nonzero cost and the alert firing, its page links to the three jobs,
and a job page's culprit links to node-1's record (screenshots nodes.png, node.png).
"""
import importlib.util
import json
import math
import os
import shutil
import struct
import subprocess
import unittest
import urllib.error
import urllib.request

import grpc
from google.protobuf import json_format

from harness import BIN, DaemonTestCase, wait_until
from rankwatch.v1 import service_pb2

FIXTURES = os.environ.get("RANKWATCH_FIXTURES", os.path.join(os.path.dirname(os.path.abspath(__file__)), "../fixtures"))
ARTIFACTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../build/test-artifacts/web_ui")
JOB = "ui-demo/job"  # a '/' in the id, as Kubeflow namespaces give
CULPRIT = 37
CULPRIT_STRIP = [0, 184, 212]  # the culprit marker's colour (serving/ui/app.js)


def browser_available():
    if importlib.util.find_spec("selenium") is None:
        return False
    return shutil.which("chromium") is not None and shutil.which("chromedriver") is not None


def get(url, method="GET", data=None):
    """(status, JSON body) of a request, whatever the status."""
    req = urllib.request.Request(url, method=method, data=data)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def chromium(workdir):
    """A headless Chromium driven by Debian's chromium-driver, its profile in `workdir`."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.makedirs(ARTIFACTS, exist_ok=True)
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--window-size=1400,1800",
                 "--user-data-dir=" + os.path.join(workdir, "chromium")):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


class UiTestCase(DaemonTestCase):
    """A daemon with its UI (`cls.ui`), and its JSON API compared with its gRPC answers."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ui = "http://" + cls.daemon.endpoints["ui"]

    def api(self, path):
        status, body = get(self.ui + "/api/v1/" + path)
        self.assertEqual(status, 200, body)
        return body

    def same(self, grpc_call, path, message_type):
        """The API's answer parses into the message gRPC gives for the same snapshot: asked
        between two gRPC answers that agree (a re-evaluation in between is retried)."""
        for _ in range(5):
            before = grpc_call()
            body = self.api(path)
            after = grpc_call()
            if before == after:
                parsed = json_format.Parse(json.dumps(body), message_type())
                self.assertEqual(parsed, before, path)
                return body
        self.fail("the snapshot kept changing while %s was compared" % path)


PIPELINE_JOB = "ui-pipeline"


class WebUiTest(UiTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.fleet.simulate(cls.brokers, "--job", JOB, "--ranks", "64", "--ranks-per-node", "8", "--steps", "400",
                           "--step-ms", "20", "--speed", "max", "--sync", "ddp", "--report-collective",
                           "--fault", "slow-compute:%d:0.3" % CULPRIT, "--fault", "memory-leak:all:64")
        # A pipeline job (issue #34): its last stage holds 30 % more work.
        cls.fleet.simulate(cls.brokers, "--job", PIPELINE_JOB, "--parallel", "dp=2,pp=4,tp=1", "--steps", "30",
                           "--step-ms", "40", "--speed", "max", "--fault", "stage-imbalance:stage=3,factor=1.3")

        def diagnosed():
            try:
                d = cls.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=JOB), timeout=5)
            except Exception:  # noqa: BLE001 - NOT_FOUND until the first records
                return False
            return d.aligned_steps == 400 and list(d.step.culprit_ranks) == [CULPRIT] and d.memory.trend_points
        wait_until(diagnosed, 60, "the job diagnosed with its culprit and memory trend")

    def test_the_json_api_answers_as_grpc_does(self):
        quoted = urllib.request.quote(JOB, safe="")
        self.same(lambda: self.stub.ListJobs(service_pb2.ListJobsRequest(), timeout=5), "jobs",
                  service_pb2.ListJobsResponse)
        d = self.same(lambda: self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=JOB), timeout=5),
                      "jobs/" + quoted, service_pb2.Diagnosis)
        self.assertEqual(d["step"]["culpritRanks"], [CULPRIT])
        self.assertGreater(len(d["memory"]["trendPoints"]), 2)
        for rank in (CULPRIT, 0):
            self.same(lambda: self.stub.GetRankDetail(
                service_pb2.GetRankDetailRequest(training_job=JOB, rank=rank), timeout=5),
                "jobs/%s/ranks/%d" % (quoted, rank), service_pb2.RankDetail)
        self.same(lambda: self.stub.ListCaptures(service_pb2.ListCapturesRequest(training_job=JOB), timeout=5),
                  "jobs/%s/captures" % quoted, service_pb2.ListCapturesResponse)
        # The heatmap: the window's steps, rank by rank; the culprit's step time above the others'.
        # (The steps are read from the store: the first checkpoint after the job's end holds them.)
        h = wait_until(lambda: (lambda h: h if h["steps"] else None)(self.api("jobs/%s/heatmap" % quoted)), 20,
                       "the window's steps stored")
        self.assertEqual(h["worldSize"], 64)
        # The timeline without bounds: the newest stored steps (stored by now), as many as the window holds.
        timeline = self.same(lambda: self.stub.GetTimeline(service_pb2.GetTimelineRequest(training_job=JOB),
                                                           timeout=30),
                             "jobs/%s/timeline" % quoted, service_pb2.Timeline)
        self.assertGreater(len(timeline["steps"]), 10)
        self.assertEqual(h["culpritRanks"], [CULPRIT])
        steps = len(h["steps"])
        self.assertEqual(steps, int(d["step"]["window"]["steps"]))
        self.assertEqual(h["metric"], "OWN")
        self.assertEqual(h["metrics"][:2], ["STEP", "OWN"])
        self.assertIn("FORWARD", h["metrics"])
        own = h["values"]
        self.assertEqual(len(own), 64 * steps)
        forward = self.api("jobs/%s/heatmap?metric=FORWARD" % quoted)
        self.assertEqual(forward["metric"], "FORWARD")
        # The binary form the UI reads: the same header and values (float32, NaN for null).
        with urllib.request.urlopen(self.ui + "/api/v1/jobs/%s/heatmap?format=f32&metric=FORWARD" % quoted,
                                    timeout=10) as r:
            self.assertEqual(r.headers["Content-Type"], "application/octet-stream")
            blob = r.read()
        (size,) = struct.unpack_from("<I", blob, 0)
        header = json.loads(blob[4:4 + size])
        offset = (4 + size + 3) // 4 * 4
        values = struct.unpack_from("<%df" % (64 * steps), blob, offset)
        self.assertEqual(len(blob), offset + 4 * 64 * steps)
        self.assertEqual(header["steps"], forward["steps"])
        self.assertEqual(header["culpritRanks"], [CULPRIT])
        for got, want in zip(values, forward["values"]):
            if want is None:
                self.assertTrue(math.isnan(got))
            else:
                self.assertAlmostEqual(got, want, delta=1e-3)
        status, body = get(self.ui + "/api/v1/jobs/%s/heatmap?metric=NOPE" % quoted)
        self.assertEqual(status, 400, body)
        self.assertIn("FORWARD", body["error"])

        def mean(rank):
            values = [v for v in own[rank * steps:(rank + 1) * steps] if v is not None]
            return sum(values) / len(values)
        self.assertGreater(mean(CULPRIT), 1.15 * mean(0))
        # One rank against each step's median rank (the rank page's chart).
        one = self.api("jobs/%s/heatmap?rank=%d" % (quoted, CULPRIT))
        self.assertEqual(one["rank"], CULPRIT)
        self.assertEqual(one["values"], own[CULPRIT * steps:(CULPRIT + 1) * steps])
        self.assertEqual(len(one["medians"]), steps)
        self.assertTrue(all(v > m for v, m in zip(one["values"], one["medians"])))
        status, body = get(self.ui + "/api/v1/jobs/%s/heatmap?rank=64" % quoted)
        self.assertEqual(status, 404, body)

    def test_read_only_and_clear_errors(self):
        ui = self.ui
        cases = [
            ("GET", "/api/v1/jobs/no-such-job", 404, "no training job"),
            ("GET", "/api/v1/jobs/%s/ranks/64" % urllib.request.quote(JOB, safe=""), 404, "has 64 ranks"),
            ("GET", "/api/v1/jobs/%s/ranks/x" % urllib.request.quote(JOB, safe=""), 400, "rank"),
            ("GET", "/api/v1/jobs/%s/alerts?max=abc" % urllib.request.quote(JOB, safe=""), 400, "max"),
            ("GET", "/api/v1/nothing", 404, "no API resource"),
            ("GET", "/elsewhere", 404, "/ui/"),
            ("GET", "/ui/assets/missing.js", 404, "no UI asset"),
            ("POST", "/api/v1/jobs", 405, "read-only"),
            ("DELETE", "/api/v1/jobs/" + urllib.request.quote(JOB, safe=""), 405, "read-only"),
            ("PUT", "/ui/", 405, "read-only"),
        ]
        for method, path, status, words in cases:
            with self.subTest(method=method, path=path):
                got, body = get(ui + path, method=method, data=b"{}" if method in ("POST", "PUT") else None)
                self.assertEqual(got, status, body)
                self.assertIn(words, body["error"])

    @unittest.skipUnless(browser_available(), "needs chromium, chromium-driver and python3-selenium")
    def test_what_a_person_sees_in_chromium(self):
        from selenium.webdriver.common.by import By

        driver = chromium(self.fleet.workdir)
        try:
            # The fleet page: the job, its diagnosis and culprit.
            driver.get(self.ui + "/ui/")
            row = wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, 'tr[data-job="%s"]' % JOB), 20,
                             "the job on the fleet page")[0]
            self.assertEqual(row.find_element(By.CSS_SELECTOR, ".step-label").text, "compute_straggler")
            self.assertIn("rank %d" % CULPRIT, row.text)
            self.assertEqual(row.find_element(By.CSS_SELECTOR, ".memory-label").text, "memory_creep")
            driver.save_screenshot(os.path.join(ARTIFACTS, "fleet.png"))

            # The job page (its link): the diagnosis card, the heatmap with the culprit marked,
            # the memory chart.
            row.find_element(By.LINK_TEXT, JOB).click()
            canvas = wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "canvas#heatmap[data-culprit-y]"), 20,
                                "the heatmap")[0]
            self.assertEqual(driver.find_element(By.ID, "step-label").text, "compute_straggler")
            self.assertIn("rank %d" % CULPRIT, driver.find_element(By.ID, "culprit").text)
            ys = [int(y) for y in canvas.get_attribute("data-culprit-y").split(",") if y]
            self.assertEqual(len(ys), 1, "one culprit row")
            pixels = driver.execute_script(
                "const c = document.getElementById('heatmap'); const g = c.getContext('2d');"
                "return [Array.from(g.getImageData(1, arguments[0], 1, 1).data),"
                "        Array.from(g.getImageData(1, 0, 1, 1).data), c.height];", ys[0])
            self.assertEqual(pixels[0][:3], CULPRIT_STRIP, "the culprit's row is marked")
            self.assertEqual(pixels[1][:3], [255, 255, 255], "rank 0's row is not")
            # Grouped by node: rank 37 is the 6th rank of node 4 (ranks 32-39), so its row is the
            # 38th of 64 when every node is expanded.
            self.assertEqual(ys[0] * 64 // pixels[2], CULPRIT)
            points = wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "canvas#memory-chart[data-points]"), 20,
                                "the memory chart")[0]
            self.assertGreater(int(points.get_attribute("data-points")), 2)
            self.assertEqual(driver.find_element(By.ID, "memory-label").text, "memory_creep")
            driver.save_screenshot(os.path.join(ARTIFACTS, "job.png"))

            # The rank page of the culprit: its compute above the median rank's.
            driver.get(self.ui + "/ui/jobs/%s/ranks/%d" % (urllib.request.quote(JOB, safe=""), CULPRIT))
            table = wait_until(lambda: driver.find_elements(By.ID, "rank-phases"), 20, "the rank's phases")[0]
            chart = wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "canvas#rank-chart[data-steps]"), 20,
                               "the rank's chart")[0]
            self.assertGreater(int(chart.get_attribute("data-steps")), 10)
            # The simulated straggler's forward is 30 % longer (its backward shorter: the others
            # wait in theirs for its gradients).
            forward = [r.text for r in table.find_elements(By.TAG_NAME, "tr") if r.text.startswith("forward ")]
            self.assertEqual(len(forward), 1, table.text)
            self.assertIn("+", forward[0].split(" ms")[2])
            driver.save_screenshot(os.path.join(ARTIFACTS, "rank.png"))

            # A rank with kernel events (a real 2-rank Kineto trace replayed through Kafka): its
            # page shows the GPU timeline's breakdown, with the API's numbers.
            replay = subprocess.run([os.path.join(BIN, "rankwatch"), "replay", "--brokers", self.brokers, "--job",
                                     "ui-kineto", os.path.join(FIXTURES, "kineto", "hta-trace-filter-2rank")],
                                    capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
            self.assertEqual(replay.returncode, 0, replay.stderr)
            kernel = wait_until(lambda: (lambda r: r.get("kernel") if r.get("kernel", {}).get("steps") == 2 else None)(
                get(self.ui + "/api/v1/jobs/ui-kineto/ranks/1")[1]), 60, "rank 1's kernel analyses")
            driver.get(self.ui + "/ui/jobs/ui-kineto/ranks/1")
            section = wait_until(lambda: driver.find_elements(By.ID, "rank-kernel"), 20, "the GPU timeline")[0]
            self.assertIn("%.1f ms" % (kernel["kernelSeconds"] * 1e3), section.text)
            self.assertIn("communication", section.text)
            self.assertNotIn("null", driver.find_element(By.ID, "app").text)
            driver.save_screenshot(os.path.join(ARTIFACTS, "rank-kernel.png"))

            # A pipeline job's page: the what-if card, the stage x replica grid, S over time.
            driver.get(self.ui + "/ui/jobs/" + PIPELINE_JOB)
            verdict = wait_until(lambda: [e for e in driver.find_elements(By.ID, "whatif-verdict")
                                          if e.text == "stage imbalance"], 30, "the pipeline card's verdict")[0]
            self.assertEqual(verdict.text, "stage imbalance")
            self.assertIn("stage 3", driver.find_element(By.ID, "whatif-culprit").text)
            grid = driver.find_element(By.ID, "whatif-grid")
            rows = grid.find_elements(By.TAG_NAME, "tr")
            self.assertEqual(len(rows), 1 + 4 + 1)  # header, 4 stages, the replicas' S
            self.assertEqual(len(rows[1].find_elements(By.TAG_NAME, "td")), 2 + 1)  # 2 replicas, stage S
            stage_s = [float(r.find_elements(By.TAG_NAME, "td")[-1].text) for r in rows[1:5]]
            self.assertEqual(stage_s.index(max(stage_s)), 3)
            wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "canvas#whatif-chart[data-points]"), 20,
                       "S over time")
            self.assertNotIn("null", driver.find_element(By.ID, "app").text)
            driver.save_screenshot(os.path.join(ARTIFACTS, "job-pipeline.png"))
        finally:
            driver.quit()


NODE = "node-1"
NODE_JOBS = [("fleet-a", 9), ("fleet-b", 10), ("fleet-c", 14)]  # ranks 8-15 are node-1's


def run_cli(*args):
    return subprocess.run([os.path.join(BIN, "rankwatch")] + list(args), capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)


def click(driver, css):
    """Clicks the element `css` selects, again if the page redrew it in between (every 2 s)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def once():
        try:
            found = driver.find_elements(By.CSS_SELECTOR, css)
            if found:
                found[0].click()
                return True
        except StaleElementReferenceException:
            pass
        return False
    wait_until(once, 20, "to click " + css)


class NodesPageTest(UiTestCase):
    """The fleet view of nodes: three jobs one after another, each slowed by another rank of node-1.
    A job is finished after 15 s without input (its diagnosis frozen) rather than diagnosed as hung
    after 30 s while the next ones run."""
    daemon_args = ("--window-steps", "20", "--job-ttl", "15s")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        try:
            for job, rank in NODE_JOBS:
                cls.fleet.simulate(cls.brokers, "--job", job, "--ranks", "16", "--ranks-per-node", "8", "--steps",
                                   "600", "--step-ms", "10", "--speed", "realtime", "--report-collective",
                                   "--fault", "slow-compute:%d:0.5" % rank)
                wait_until(lambda: job in [j.training_job for j in cls.node().by_job], 30,
                           "node-1 charged with " + job)
            wait_until(lambda: cls.node().alert_firing, 30, "the node alert for node-1")
        except BaseException:
            cls.fleet.close()  # tearDownClass does not run after a failed setUpClass
            raise

    @classmethod
    def node(cls, name=NODE):
        """The node's record with its jobs; an empty one while the view holds none."""
        try:
            r = cls.stub.ListNodes(service_pb2.ListNodesRequest(node=name), timeout=5)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE and "fleet view" in (e.details() or ""):
                raise AssertionError("ListNodes: " + e.details()) from None
            return service_pb2.NodeRecord()
        return r.nodes[0] if r.nodes else service_pb2.NodeRecord()

    def test_node_1_holds_the_three_jobs_their_cost_and_the_node_alert(self):
        r = self.node()
        self.assertEqual(r.node, NODE)
        self.assertEqual(r.jobs, 3)
        self.assertEqual(sorted(j.training_job for j in r.by_job), [job for job, _ in NODE_JOBS])
        for j in r.by_job:
            rank = dict(NODE_JOBS)[j.training_job]
            self.assertIn(rank, j.ranks, j)
            self.assertGreaterEqual(j.episodes, 1, j)
            self.assertGreater(j.lost_rank_seconds, 0, j)
            # What the job lost to node-1 is part of what it lost to stragglers.
            d = self.stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=j.training_job), timeout=5)
            self.assertLessEqual(j.lost_rank_seconds, d.lost_time.total_straggler_rank_seconds * 1.05 + 1e-6,
                                 j.training_job)
            self.assertGreater(j.first_unix_ns, 0)
            self.assertGreaterEqual(j.last_unix_ns, j.first_unix_ns)
        lasts = [j.last_unix_ns for j in r.by_job]
        self.assertEqual(lasts, sorted(lasts, reverse=True), "newest first")
        self.assertAlmostEqual(r.lost_rank_seconds, sum(j.lost_rank_seconds for j in r.by_job), delta=1e-6)
        self.assertEqual(r.episodes, sum(j.episodes for j in r.by_job))
        self.assertEqual(r.jobs_in_alert_window, 3)
        self.assertTrue(r.alert_firing)
        # The top nodes: node-1 first, without its jobs.
        top = self.stub.ListNodes(service_pb2.ListNodesRequest(limit=5), timeout=5)
        self.assertEqual(top.nodes[0].node, NODE)
        self.assertEqual(len(top.nodes[0].by_job), 0)
        self.assertEqual(top.alert_jobs, 3)

    def test_the_json_api_answers_as_list_nodes_does(self):
        self.same(lambda: self.stub.ListNodes(service_pb2.ListNodesRequest(), timeout=5), "nodes",
                  service_pb2.ListNodesResponse)
        one = self.same(lambda: self.stub.ListNodes(service_pb2.ListNodesRequest(node=NODE), timeout=5),
                        "nodes/" + NODE, service_pb2.ListNodesResponse)
        self.assertEqual(one["nodes"][0]["jobs"], 3)
        status, body = get(self.ui + "/api/v1/nodes/node-99")
        self.assertEqual(status, 404, body)
        self.assertIn("no record of node 'node-99'", body["error"])
        status, body = get(self.ui + "/api/v1/nodes?limit=x")
        self.assertEqual(status, 400, body)

    def test_the_cli_prints_the_nodes_and_the_node_alert(self):
        server = self.daemon.endpoints["grpc"]
        out = run_cli("nodes", "--server", server)
        self.assertEqual(out.returncode, 0, out.stderr)
        rows = [line.split() for line in out.stdout.splitlines() if line.startswith(NODE + " ")]
        self.assertEqual(len(rows), 1, out.stdout)
        self.assertEqual(rows[0][1:3], ["3", "3"], out.stdout)  # jobs, jobs within the alert window
        self.assertNotEqual(rows[0][4], "0", out.stdout)        # lost rank-hours
        self.assertEqual(rows[0][-1], "firing", out.stdout)

        out = run_cli("nodes", "--server", server, "--node", NODE)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertTrue(out.stdout.startswith("node node-1: culprit in 3 jobs"), out.stdout)
        for job, rank in NODE_JOBS:
            line = [line.split() for line in out.stdout.splitlines() if line.startswith(job + " ")]
            self.assertEqual(len(line), 1, out.stdout)
            self.assertIn(str(rank), line[0][2].split(","), out.stdout)

        out = run_cli("nodes", "--server", server, "--node", "node-99")
        self.assertEqual(out.returncode, 1, out.stdout)
        self.assertIn("no record of node 'node-99'", out.stderr)

        out = run_cli("nodes", "--server", server, "--json")
        self.assertEqual(out.returncode, 0, out.stderr)
        parsed = json_format.Parse(out.stdout, service_pb2.ListNodesResponse())
        self.assertEqual(parsed.nodes[0].node, NODE)

        # The node alert, a fleet alert of no job, in the alert log.
        out = run_cli("alerts", "--server", server, "--kind", "node_culprit")
        self.assertEqual(out.returncode, 0, out.stderr)
        firing = [line for line in out.stdout.splitlines() if " firing " in line]
        self.assertEqual(len(firing), 1, out.stdout)
        self.assertIn(" node_culprit", firing[0])
        self.assertIn(" (fleet) node:node-1", firing[0])

    @unittest.skipUnless(browser_available(), "needs chromium, chromium-driver and python3-selenium")
    def test_the_nodes_page_in_chromium(self):
        from selenium.webdriver.common.by import By

        driver = chromium(self.fleet.workdir)
        # Read in one script: the page redraws itself every 2 s.
        row_of = ("const r = document.querySelector('#nodes tbody tr[data-node=\"' + arguments[0] + '\"]');"
                  "return r && {first: r.parentNode.firstChild === r, jobs: r.querySelector('.jobs').textContent,"
                  " lost: r.querySelector('.lost').textContent, alert: r.querySelector('.alert').textContent,"
                  " href: r.querySelector('a.node-link').getAttribute('href')};")
        jobs_of = ("return Array.from(document.querySelectorAll('#node-jobs tbody tr')).map(r =>"
                   " [r.dataset.job, r.querySelector('a.job-link').getAttribute('href')]);")
        try:
            # The Nodes page: node-1 first, with its 3 jobs, a cost and the node alert firing.
            driver.get(self.ui + "/ui/nodes/")
            row = wait_until(lambda: driver.execute_script(row_of, NODE), 20, "node-1 on the Nodes page")
            self.assertTrue(row["first"], row)
            self.assertEqual(row["jobs"], "3")
            self.assertNotIn(row["lost"], ("0", ""))
            self.assertEqual(row["alert"], "firing")
            self.assertEqual(row["href"], "/ui/nodes/node-1")
            driver.save_screenshot(os.path.join(ARTIFACTS, "nodes.png"))

            # Its record: the three jobs, each linking to its job's page.
            click(driver, '#nodes tr[data-node="node-1"] a.node-link')
            jobs = wait_until(lambda: driver.execute_script(jobs_of), 20, "node-1's jobs")
            self.assertEqual(sorted(jobs), [[job, "/ui/jobs/" + job] for job, _ in NODE_JOBS])
            self.assertIn("3 jobs", driver.find_element(By.ID, "node-jobs-count").text)
            self.assertTrue(driver.find_element(By.ID, "node-alert").text.startswith("firing"))
            self.assertNotIn("null", driver.find_element(By.ID, "app").text)
            driver.save_screenshot(os.path.join(ARTIFACTS, "node.png"))

            # A job's page: its culprit's node links to the node's record.
            driver.get(self.ui + "/ui/jobs/" + NODE_JOBS[0][0])
            link = wait_until(lambda: driver.execute_script(
                "const a = document.getElementById('culprit-node');"
                "return a && [a.textContent, a.getAttribute('href')];"), 20, "the culprit's node on the job page")
            self.assertEqual(link, [NODE, "/ui/nodes/node-1"])
            click(driver, "#culprit-node")
            wait_until(lambda: driver.current_url.endswith("/ui/nodes/node-1") and driver.execute_script(jobs_of), 20,
                       "node-1's page from the job's culprit")
        finally:
            driver.quit()


if __name__ == "__main__":
    unittest.main()
