"""Paths of deploy/ and helpers shared by the deploy tests."""
import json
import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
DEPLOY = os.path.join(ROOT, "deploy")
DASHBOARD = os.path.join(DEPLOY, "grafana/dashboards/rankwatch.json")
PROMETHEUS_DIR = os.path.join(DEPLOY, "prometheus")
RULE_FILES = [os.path.join(PROMETHEUS_DIR, "rules", f)
              for f in ("rankwatch-recording.yml", "rankwatch-alerts.yml")]

# Grafana's built-in variables, replaced the way Grafana would for a 1 s scrape interval.
GRAFANA_VARIABLES = {"$__rate_interval": "10s", "$__interval": "2s", "$__range": "1m"}


def load_dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def dashboard_panels(dashboard):
    """Every panel, rows' nested panels included."""
    for p in dashboard["panels"]:
        yield p
        for nested in p.get("panels", []):
            yield nested


def dashboard_queries(dashboard):
    """(panel title, refId, expr) of every PromQL target."""
    for p in dashboard_panels(dashboard):
        for t in p.get("targets", []):
            if t.get("expr"):
                yield p["title"], t["refId"], t["expr"]


def substitute(expr, training_job):
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    # Grafana escapes regex metacharacters of a value; the test's job names have none.
    assert re.fullmatch(r"[A-Za-z0-9_-]+", training_job), training_job
    expr = expr.replace("${training_job}", training_job).replace("$training_job", training_job)
    if "$" in expr:
        raise AssertionError("unreplaced variable in %r" % expr)
    return expr


# Metrics of the GPU-timeline analyses (issue #6): a query on one of them is skipped while the
# daemon does not export it at all.
_GPU_METRIC = re.compile(r"\b(rankwatch_(?:gpu_|idle_time_|kernel_time_|comm_comp_)[a-z_]*)")


def gpu_metrics_in(expr):
    return set(_GPU_METRIC.findall(expr))
