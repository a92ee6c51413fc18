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
"""
import json
import math
import os
import shutil
import struct
import subprocess
import time
import unittest
import urllib.error
import urllib.request

from google.protobuf import json_format

from harness import BIN, DaemonTestCase, wait_until
from rankwatch.v1 import service_pb2

FIXTURES = os.environ.get("RANKWATCH_FIXTURES", os.path.join(os.path.dirname(os.path.abspath(__file__)), "../fixtures"))
ARTIFACTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../build/test-artifacts/web_ui")
JOB = "ui-demo/job"  # a '/' in the id, as Kubeflow namespaces give
CULPRIT = 37
CULPRIT_STRIP = [0, 184, 212]  # the culprit marker's colour (sinks/ui/app.js)


def browser_available():
    try:
        import selenium  # noqa: F401
    except ImportError:
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


PIPELINE_JOB = "ui-pipeline"


class WebUiTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ui = "http://" + cls.daemon.endpoints["ui"]
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
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By

        os.makedirs(ARTIFACTS, exist_ok=True)
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium")
        for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                     "--no-first-run", "--disable-background-networking", "--disable-component-update",
                     "--disable-sync", "--window-size=1400,1800",
                     "--user-data-dir=" + os.path.join(self.fleet.workdir, "chromium")):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
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


if __name__ == "__main__":
    unittest.main()
