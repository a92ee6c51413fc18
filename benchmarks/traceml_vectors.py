#!/usr/bin/python3
"""TraceML's own step-time and step-memory diagnosis test vectors, run through rankwatch.

The independent check that rankwatch's diagnoses agree with the reference tool where they
should. TraceML's tests are read at run time from a checkout of its repository (a bare git
mirror: --traceml-repo, --ref); nothing of TraceML is copied into rankwatch.

How a vector is obtained. The mirror's `src/` and `tests/` (at --ref) are unpacked into a
temporary sandbox, and a child process imports TraceML's step-time and step-memory test
modules there, with a small stand-in for pytest (approx, parametrize, param, raises,
monkeypatch) and, when the real packages are not installed, inert stand-ins for the display
libraries TraceML's renderers import (rich, ...). It wraps TraceML's diagnosis entry points and
rules, then runs every test case (parametrized cases expanded). Each time a test asks TraceML
for a diagnosis — the whole diagnosis (`diagnose_step_time_window`,
`build_step_memory[_summary]_diagnosis[_result]`) or one rule (`RankStragglerRule().evaluate`,
...) — the wrapper records the input TraceML saw and TraceML's own answer. The test's
assertions then check that answer, so a vector whose test passes carries the kind the test
expects. The comparison target is TraceML's *whole* diagnosis of that input (for a rule-level
test, the harness asks TraceML for it); the rule's own kind is shown beside it.

Inputs become rankwatch StepRecords, one job per distinct vector, one Batch per rank (`final`
set), on `rankwatch kafka` + `rankwatchd` (tests/e2e/harness.py's Fleet):
  * step time: TraceML's per-rank, per-step events when the test built them (its selected
    clock; a phase absent on a step stays absent), else its per-rank averages repeated for the
    window's steps (rule-level tests on averages: at least 64 steps, the factories' default,
    since TraceML's rules have no warm-up). dataloader = input_wait, forward, backward,
    optimizer = optimizer_step, step_time = input_wait + traced_step_time (the traced step
    alone when input wait is unmeasured); ms -> ns. TraceML's h2d has no rankwatch field: it
    stays inside the step time, outside every rankwatch phase. `fsdp` sets
    SourceIdentity.training_strategy "fsdp" and `sharded`.
  * step memory: TraceML's tests give cross-rank aggregates (the median- and worst-rank
    series), so one rank carries the worst series and two the median series (one rank when
    TraceML's world size is 1); a rule-level test's signals (worst peak, skew, pressure) become
    flat series with median = worst / (1 + skew) and capacity = worst / pressure. Capacity =
    TraceML's gpu_total_bytes. A creep rule fed a trend verdict (not data) is not a vector.
It waits until the daemon aligned every step of every job (rankwatch_steps_aligned_total) and
its diagnosis covers them, reads gRPC GetDiagnosis, and prints one row per distinct vector:
case, the test's expectation, TraceML's diagnosis, rankwatch's label (and culprit ranks where
TraceML names one), agree/differ, and a one-word reason for each difference. Counts close it.

A second TraceML answer is computed for every vector: TraceML's own diagnosis of exactly the
records published to rankwatch, rebuilt as TraceML events and run through its analyzer. Many
of TraceML's aggregate fixtures declare values no per-step data can produce (a residual of 0
while the step time exceeds the phases by 90 %); there the two TraceML answers differ, and the
counts are given against both.

Kinds compared: WARMUP -> no_data, RESIDUAL_HEAVY and H2D_BOUND -> wait_heavy (time outside
rankwatch's phases), H2D_STRAGGLER -> straggler (the same), CREEP_CONFIRMED -> memory_creep,
CREEP_EARLY -> memory_creep_early; the others by name. A straggler agrees only with the same
culprit rank.

Reasons (first that applies): window<8 (rankwatch needs 8 aligned steps), window (the vector
is longer than rankwatch's window), boundary (a share exactly at a label's threshold that
rankwatch computes just under it), no-forward (a synchronised job whose forward is absent or 0
on every rank and rankwatch names a straggler), fixture (TraceML itself says what rankwatch
says once the fixture is data), min-steps / creep / defaults / memory (memory thresholds),
h2d (TraceML-only H2D signal), fsdp, missing-signal (a phase or rank is absent), unsynced (a
straggler is involved and the ranks' step times differ by more than 2 %, which TraceML's
culprit model ignores), attribution (both name a straggler, differently: TraceML's 80 %
coverage knob, its culprit pairing), outside-phases (rankwatch names a rank's excess outside
every phase), straggler-model (one side only names a straggler), precedence (both see the
same signals and order them differently: TraceML by severity and impact, rankwatch first
match), culprit (same label, another rank).

Usage: benchmarks/traceml_vectors.py [--traceml-repo DIR] [--ref REF] [--only SUBSTRING]
       [--json] [--verbose] [--window-steps K] [--bin build/bin] [--extract-only]
Exit status: 0 when it ran (whatever the agreement), 2 when the TraceML repository is absent,
1 on a failure of the harness itself (a missing binary, a TraceML version without the hooked
API: v0.3.6 and later have it).
"""
import argparse
import dataclasses
import hashlib
import inspect
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_MIRROR = "/work/.mirror/traceopt-ai+traceml/repo"
TEST_GLOBS = ("tests/diagnostics/test_step_time", "tests/diagnostics/test_step_memory")
MIN_STEPS = 8          # rankwatch's step-time min-steps (docs/diagnoses.md)
RULE_LEVEL_STEPS = 64  # TraceML's factories' default window for rule-level tests

STEP_KIND_TO_RANKWATCH = {
    "NO_DATA": "no_data", "WARMUP": "no_data", "INCOMPLETE_DATA": "incomplete_data",
    "BALANCED": "balanced", "STRAGGLER": "straggler", "INPUT_STRAGGLER": "input_straggler",
    "COMPUTE_STRAGGLER": "compute_straggler", "H2D_STRAGGLER": "straggler",
    "INPUT_BOUND": "input_bound", "H2D_BOUND": "wait_heavy", "COMPUTE_BOUND": "compute_bound",
    "RESIDUAL_HEAVY": "wait_heavy",
}
MEMORY_KIND_TO_RANKWATCH = {
    "NO_DATA": "no_data", "HIGH_PRESSURE": "high_pressure", "IMBALANCE": "imbalance",
    "CREEP_CONFIRMED": "memory_creep", "CREEP_EARLY": "memory_creep_early",
    "BALANCED": "balanced",
}
STRAGGLER_KINDS = {"STRAGGLER", "INPUT_STRAGGLER", "COMPUTE_STRAGGLER", "H2D_STRAGGLER"}
RW_STRAGGLERS = {"straggler", "input_straggler", "compute_straggler"}


# ---------------------------------------------------------------------------------------------
# Child process: import TraceML's tests in the sandbox and record every diagnosis they ask for.
# ---------------------------------------------------------------------------------------------

def _install_pytest_stand_in():
    """A pytest module with what TraceML's diagnosis tests use; pytest itself is not needed."""
    import types

    pt = types.ModuleType("pytest")

    class Skipped(Exception):
        pass

    class Approx:
        def __init__(self, expected, rel=None, abs=None):
            self.expected, self.rel, self.abs = expected, rel, abs

        def _close(self, actual, expected):
            if isinstance(expected, dict):
                return (isinstance(actual, dict) and actual.keys() == expected.keys()
                        and all(self._close(actual[k], expected[k]) for k in expected))
            if isinstance(expected, (list, tuple)):
                return (isinstance(actual, (list, tuple)) and len(actual) == len(expected)
                        and all(self._close(a, e) for a, e in zip(actual, expected)))
            if actual is None or expected is None:
                return actual is expected
            try:
                a, e = float(actual), float(expected)
            except (TypeError, ValueError):
                return actual == expected
            if a == e:
                return True
            rel = 1e-6 if self.rel is None else self.rel
            tol = max(rel * abs(e), 1e-12 if self.abs is None else self.abs)
            return math.isfinite(a) and abs(a - e) <= tol

        def __eq__(self, other):
            return self._close(other, self.expected)

        def __ne__(self, other):
            return not self.__eq__(other)

        __hash__ = None

        def __repr__(self):
            return "approx(%r)" % (self.expected,)

    class Param:
        def __init__(self, *values, id=None, marks=()):
            self.values, self.id, self.marks = values, id, marks

    class Mark:
        def parametrize(self, argnames, argvalues, ids=None, **_):
            def deco(fn):
                fn.__dict__.setdefault("_tv_params", []).append((argnames, list(argvalues), ids))
                return fn
            return deco

        def skip(self, *a, **k):
            def deco(fn):
                fn._tv_skip = k.get("reason", "marked skip")
                return fn
            return deco if not (a and callable(a[0])) else deco(a[0])

        def skipif(self, condition, reason="skipif", **_):
            def deco(fn):
                if condition:
                    fn._tv_skip = reason
                return fn
            return deco

        def __getattr__(self, name):  # usefixtures, xfail, slow, ...: recorded as no-ops
            def mark(*a, **k):
                if a and callable(a[0]) and not k and len(a) == 1:
                    return a[0]
                return lambda fn: fn
            return mark

    class Raises:
        def __init__(self, exc, match=None):
            self.exc, self.match = exc, match

        def __enter__(self):
            return self

        def __exit__(self, et, ev, tb):
            if et is None:
                raise AssertionError("DID NOT RAISE %r" % (self.exc,))
            return issubclass(et, self.exc)

    class MonkeyPatch:
        def __init__(self):
            self._undo = []

        def setattr(self, target, name, value=None, raising=True):
            if isinstance(target, str):  # "module.attr" form
                mod, _, attr = target.rpartition(".")
                target, value, name = __import__(mod, fromlist=["_"]), name, attr
            self._undo.append((target, name, getattr(target, name)))
            setattr(target, name, value)

        def setitem(self, mapping, key, value):
            self._undo.append((mapping, key, mapping[key], "item"))
            mapping[key] = value

        def undo(self):
            for entry in reversed(self._undo):
                if len(entry) == 4:
                    entry[0][entry[1]] = entry[2]
                else:
                    setattr(entry[0], entry[1], entry[2])
            self._undo.clear()

    def skip(msg="", **_):
        raise Skipped(msg)

    def importorskip(name, *_, **__):
        try:
            return __import__(name)
        except ImportError:
            raise Skipped("no module " + name)

    pt.approx, pt.param, pt.mark, pt.raises = Approx, Param, Mark(), Raises
    pt.fixture = lambda *a, **k: (a[0] if a and callable(a[0]) else (lambda fn: fn))
    pt.skip, pt.importorskip, pt.Skipped, pt.MonkeyPatch, pt.Param = (
        skip, importorskip, Skipped, MonkeyPatch, Param)
    sys.modules["pytest"] = pt
    return pt


def _install_inert_modules(names):
    """Inert stand-ins for display-only dependencies that are not installed (rich, ...)."""
    import importlib.abc
    import importlib.machinery
    import types

    class Inert:
        def __init__(self, *a, **k):
            pass

        def __call__(self, *a, **k):
            return Inert()

        def __getattr__(self, name):
            return Inert()

        def __iter__(self):
            return iter(())

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in names:
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            m = types.ModuleType(spec.name)
            m.__path__ = []
            m.__getattr__ = lambda attr: Inert
            return m

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())


def _auto_id(name, value, index):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return str(value)
    return "%s%d" % (name, index)


def _expand_cases(fn, pt):
    """(case id suffix, kwargs) for every parametrized case of a test function."""
    combos = [([], {})]
    for argnames, argvalues, ids in getattr(fn, "_tv_params", []):
        names = ([n.strip() for n in argnames.split(",")] if isinstance(argnames, str)
                 else list(argnames))
        expanded = []
        for i, val in enumerate(argvalues):
            pid = None
            if isinstance(val, pt.Param):
                pid, vals = val.id, val.values
            else:
                vals = tuple(val) if len(names) > 1 else (val,)
            if pid is None and ids is not None and not callable(ids):
                pid = str(ids[i])
            if pid is None:
                pid = "-".join(_auto_id(n, v, i) for n, v in zip(names, vals))
            expanded.append((pid, dict(zip(names, vals))))
        combos = [(idl + [pid], dict(kw, **kw2)) for idl, kw in combos for pid, kw2 in expanded]
    return [("[%s]" % "-".join(idl) if idl else "", kw) for idl, kw in combos]


class _Recorder:
    """Wraps TraceML's diagnosis entry points and rules; turns each call a test makes into a
    plain-data vector (the input TraceML saw, TraceML's answer)."""

    def __init__(self):
        self.case = None
        self.depth = 0
        self.records = []
        self.unconvertible = []
        self.sources = {}   # id(window) -> (window, snapshot) for windows built from events
        self.contexts = {}  # id(context) -> (context, window)

    # --- step time -----------------------------------------------------------------------
    def install(self):
        import traceml_ai.diagnostics.step_time.api as st_api
        import traceml_ai.diagnostics.step_time.context as st_ctx
        import traceml_ai.diagnostics.step_time.policy as st_policy
        import traceml_ai.diagnostics.step_time.rules as st_rules
        import traceml_ai.diagnostics.step_memory.api as sm_api
        import traceml_ai.diagnostics.step_memory.rules as sm_rules
        import traceml_ai.step_time.analysis as analysis
        try:
            import traceml_ai.renderers.step_memory.schema as sm_schema
        except ImportError:
            sm_schema = None
        self.st_policy, self.sm_schema = st_policy, sm_schema
        rec = self

        orig_analyze = analysis.StepTimeAnalyzer.analyze

        def analyze(self_, snapshot, **kw):
            window = orig_analyze(self_, snapshot, **kw)
            rec.sources[id(window)] = (window, snapshot)
            return window
        analysis.StepTimeAnalyzer.analyze = analyze

        orig_context = st_ctx.build_step_time_context

        def build_context(*, window, thresholds):
            ctx = orig_context(window=window, thresholds=thresholds)
            rec.contexts[id(ctx)] = (ctx, window)
            return ctx

        orig_diagnose = st_api.diagnose_step_time_window
        self.orig_diagnose = orig_diagnose

        def diagnose(window, *, policy):
            rec.depth += 1
            try:
                result = orig_diagnose(window, policy=policy)
            finally:
                rec.depth -= 1
            if rec.depth == 0:
                rec._record_step(window, policy.thresholds, result.primary, None, None)
            return result

        for cls in (st_rules.RankStragglerRule, st_rules.InputBoundRule, st_rules.H2DBoundRule,
                    st_rules.ResidualHeavyRule, st_rules.ComputeBoundRule):
            self._wrap_step_rule(cls)

        orig_live = sm_api.build_step_memory_diagnosis
        orig_summary = sm_api.build_step_memory_summary_diagnosis_result
        self.orig_memory_summary = orig_summary

        def live(metrics, **kw):
            rec.depth += 1
            try:
                diag = orig_live(metrics, **kw)
            finally:
                rec.depth -= 1
            if rec.depth == 0:
                rec._record_memory(metrics, kw, diag.kind, "build_step_memory_diagnosis")
            return diag

        def summary(metrics, **kw):
            rec.depth += 1
            try:
                result = orig_summary(metrics, **kw)
            finally:
                rec.depth -= 1
            if rec.depth == 0:
                rec._record_memory(metrics, kw, result.primary.kind,
                                   "build_step_memory_summary_diagnosis_result")
            return result

        orig_run_rules = sm_rules.run_step_memory_summary_rules

        def run_rules(metric, **kw):
            rec.depth += 1
            try:
                issues = orig_run_rules(metric, **kw)
            finally:
                rec.depth -= 1
            if rec.depth == 0:
                rec._record_memory_rule(metric, "run_step_memory_summary_rules",
                                        issues[0] if issues else None)
            return issues

        for cls in (sm_rules.HighPressureRule, sm_rules.ImbalanceRule,
                    sm_rules.CreepConfirmedRule, sm_rules.CreepEarlyRule):
            self._wrap_memory_rule(cls)

        replacements = {
            id(orig_context): build_context, id(orig_diagnose): diagnose,
            id(orig_live): live, id(orig_summary): summary, id(orig_run_rules): run_rules,
        }
        for name, module in list(sys.modules.items()):
            if not name.startswith("traceml_ai") or module is None:
                continue
            for attr, value in list(vars(module).items()):
                if id(value) in replacements and callable(value):
                    setattr(module, attr, replacements[id(value)])

    def _wrap_step_rule(self, cls):
        rec, orig = self, cls.evaluate

        def evaluate(self_, context):
            issue = orig(self_, context)
            if rec.depth == 0:
                entry = rec.contexts.get(id(context))
                if entry is None:
                    rec._unconvertible("step rule %s on a context not built from a window"
                                       % cls.__name__)
                else:
                    rec._record_step(entry[1], context.thresholds, None, cls.__name__, issue)
            return issue
        cls.evaluate = evaluate

    def _wrap_memory_rule(self, cls):
        rec, orig = self, cls.evaluate

        def evaluate(self_, context):
            rec.depth += 1
            try:
                issue = orig(self_, context)
            finally:
                rec.depth -= 1
            if rec.depth == 0:
                rec._record_memory_rule(context, cls.__name__, issue)
            return issue
        cls.evaluate = evaluate

    def _unconvertible(self, why):
        self.unconvertible.append({"case": self.case, "why": why})

    # --- conversion ----------------------------------------------------------------------
    def _thresholds_delta(self, thresholds):
        default = dataclasses.asdict(self.st_policy.DEFAULT_THRESHOLDS)
        mine = dataclasses.asdict(thresholds)
        return {k: v for k, v in mine.items() if default.get(k) != v}

    def _step_input(self, window, min_steps):
        """Per-rank step records (ms, None = absent) of a TraceML window."""
        from traceml_ai.utils.training_strategy import normalize_training_strategy
        strategy = normalize_training_strategy(window.training_strategy)
        facts = tuple(window.rank_facts)
        if not facts:
            return None, "no per-rank rows (aggregate metrics only)"
        expected = tuple(sorted(set(int(r) for r in window.expected_ranks)
                                | set(f.global_rank for f in facts)))
        source = self.sources.get(id(window))
        ranks = {}
        if source is not None and source[0] is window and window.steps:
            clock = window.clock
            latest = {}
            for row in source[1].rows:
                key = (int(row.global_rank), int(row.step))
                if key not in latest or row.source_id > latest[key].source_id:
                    latest[key] = row

            def value(row, metric):
                v = row.metrics.get(metric)
                if v is None:
                    return None
                v = v.gpu_ms if clock == "gpu" else v.cpu_ms
                return None if v is None else float(v)
            for f in facts:
                records = []
                for step in window.steps:
                    row = latest[(f.global_rank, int(step))]
                    iw, traced = value(row, "input_wait"), value(row, "traced_step_time")
                    records.append({
                        "step": int(step), "dataloader": iw, "forward": value(row, "forward"),
                        "backward": value(row, "backward"),
                        "optimizer": value(row, "optimizer_step"), "h2d": value(row, "h2d"),
                        "step_time": (iw + traced) if iw is not None and traced is not None
                        else traced,
                    })
                ranks[str(f.global_rank)] = records
            mode, steps = "events", len(window.steps)
        else:
            steps = max(int(window.coverage.steps_used), min_steps)
            for f in facts:
                a = f.average
                st = a.step_time_ms if a.step_time_ms is not None else a.traced_step_time_ms
                record = {"dataloader": a.input_wait_ms, "forward": a.forward_ms,
                          "backward": a.backward_ms, "optimizer": a.optimizer_step_ms,
                          "h2d": a.h2d_ms, "residual": a.residual_ms, "step_time": st}
                ranks[str(f.global_rank)] = [dict(record, step=s) for s in range(steps)]
            mode = "averages"
        return {"type": "step", "mode": mode, "clock": window.clock, "strategy": strategy,
                "world": expected, "steps": steps, "ranks": ranks}, None

    def _record_step(self, window, thresholds, primary, rule, issue):
        try:
            if rule is None:
                data, why = self._step_input(window, 0)
            else:
                data, why = self._step_input(window, RULE_LEVEL_STEPS)
            if data is None:
                self._unconvertible("%s: %s" % (rule or "diagnosis", why))
                return
            if rule is not None:
                # TraceML's whole diagnosis of what is published (the rule's window, at the
                # number of steps published).
                w = window
                if data["mode"] == "averages" and data["steps"] != window.coverage.steps_used:
                    cov = dataclasses.replace(window.coverage, steps_used=data["steps"],
                                              expected_steps=data["steps"])
                    w = dataclasses.replace(window, coverage=cov)
                pol = self.st_policy.StepTimeDiagnosisPolicy(name="traceml-vectors",
                                                             thresholds=thresholds)
                self.depth += 1
                try:
                    primary = self.orig_diagnose(w, policy=pol).primary
                finally:
                    self.depth -= 1
            asserted = (primary.kind if rule is None
                        else ("%s -> %s" % (rule, issue.kind if issue is not None else "none")))
            culprit = None
            if primary.kind in STRAGGLER_KINDS:
                culprit = primary.worst_rank
            rerun = self._traceml_on_step_data(data, thresholds)
            self.records.append({
                "case": self.case, "domain": "step", "level": "rule" if rule else "diagnosis",
                "asserted": asserted, "traceml": primary.kind,
                "traceml_severity": primary.severity, "traceml_culprit": culprit,
                "traceml_published": rerun[0], "traceml_published_culprit": rerun[1],
                "thresholds": self._thresholds_delta(thresholds), "input": data,
            })
        except Exception as e:  # a vector the harness cannot read is counted, not fatal
            self._unconvertible("step %s: %s: %s" % (rule or "diagnosis", type(e).__name__, e))

    def _traceml_on_step_data(self, data, thresholds):
        """TraceML's own diagnosis of exactly the records published to rankwatch (rebuilt as
        TraceML events and run through its analyzer): (kind, culprit)."""
        from traceml_ai.step_time.analysis import StepTimeAnalyzer
        from traceml_ai.step_time.model import (StepTimeClockValues, StepTimeRepositorySnapshot,
                                                StepTimeSourceRow)
        gpu = data["clock"] == "gpu"
        rows = []
        for rank_s, records in data["ranks"].items():
            for r in records:
                metrics = {}
                for key, field in (("input_wait", "dataloader"), ("h2d", "h2d"),
                                   ("forward", "forward"), ("backward", "backward"),
                                   ("optimizer_step", "optimizer")):
                    if r.get(field) is not None:
                        metrics[key] = StepTimeClockValues(cpu_ms=r[field],
                                                           gpu_ms=r[field] if gpu else None)
                if r.get("step_time") is not None:
                    traced = r["step_time"] - (r.get("dataloader") or 0.0)
                    metrics["traced_step_time"] = StepTimeClockValues(
                        cpu_ms=traced, gpu_ms=traced if gpu else None)
                rows.append(StepTimeSourceRow(source_id=len(rows) + 1, global_rank=int(rank_s),
                                              step=int(r["step"]), metrics=metrics))
        snapshot = StepTimeRepositorySnapshot(rows=tuple(rows), global_ranks=tuple(data["world"]),
                                              training_strategy=data["strategy"])
        window = StepTimeAnalyzer().analyze(snapshot, window_size=data["steps"])
        policy = self.st_policy.StepTimeDiagnosisPolicy(name="traceml-vectors",
                                                        thresholds=thresholds)
        self.depth += 1
        try:
            primary = self.orig_diagnose(window, policy=policy).primary
        finally:
            self.depth -= 1
        return primary.kind, (primary.worst_rank if primary.kind in STRAGGLER_KINDS else None)

    def _traceml_on_memory_data(self, data):
        """TraceML's summary diagnosis of exactly the per-rank series published to rankwatch."""
        import statistics
        if self.sm_schema is None:
            return None
        s, n = self.sm_schema, data["steps"]
        ranks = 1 if data["world"] <= 1 else 3
        metrics = []
        for name, series in data["kinds"].items():
            per_rank = [[float(round(v)) for v in (series["worst"] if r == ranks - 1
                                                   else series["median"])[:n]]
                        for r in range(ranks)]
            peaks = [max(p) for p in per_rank]
            median_peak, worst_peak = statistics.median(peaks), max(peaks)
            skew = (worst_peak - median_peak) / median_peak if median_peak > 0 else 0.0
            metrics.append(s.StepMemoryCombinedMetric(
                metric=name, device="cuda:0",
                series=s.StepMemoryCombinedSeries(
                    steps=list(range(n)),
                    median=[statistics.median(p[i] for p in per_rank) for i in range(n)],
                    worst=[max(p[i] for p in per_rank) for i in range(n)]),
                summary=s.StepMemoryCombinedSummary(
                    window_size=n, steps_used=n, median_peak=median_peak, worst_peak=worst_peak,
                    worst_rank=peaks.index(worst_peak), skew_ratio=skew, skew_pct=skew),
                coverage=s.StepMemoryCombinedCoverage(
                    expected_steps=n, steps_used=n, completed_step=n, world_size=ranks,
                    ranks_present=ranks, incomplete=False)))
        self.depth += 1
        try:
            return self.orig_memory_summary(metrics, gpu_total_bytes=data["capacity"]).primary.kind
        finally:
            self.depth -= 1

    def _memory_input(self, metrics, capacity):
        if not metrics:
            return {"type": "memory", "world": 1, "steps": 60, "capacity": capacity,
                    "kinds": {}, "fixture_note": "no memory metrics: no memory published"}
        kinds, steps, world, notes = {}, None, 1, []
        for m in metrics:
            median, worst = list(m.series.median), list(m.series.worst)
            steps = len(worst) if steps is None else min(steps, len(worst))
            world = max(world, int(getattr(m.coverage, "world_size", 1) or 1))
            kinds[m.metric] = {"median": median, "worst": worst}
            med_peak, worst_peak = max(median), max(worst)
            series_skew = (worst_peak - med_peak) / med_peak if med_peak > 0 else 0.0
            declared = float(m.summary.skew_pct or 0.0)
            if abs(series_skew - declared) > 0.005:
                notes.append("%s: declared skew %.3f, its series %.3f" % (m.metric, declared,
                                                                         series_skew))
            if (abs(m.summary.worst_peak - worst_peak) > 1e-6 * max(1.0, worst_peak)
                    or abs(m.summary.median_peak - med_peak) > 1e-6 * max(1.0, med_peak)):
                notes.append("%s: declared peaks differ from its series" % m.metric)
        return {"type": "memory", "world": world, "steps": steps, "capacity": capacity,
                "kinds": kinds, "fixture_note": "; ".join(notes)}

    def _record_memory(self, metrics, kw, kind, fn):
        try:
            if kw.get("no_gpu_detected"):
                self._unconvertible("%s(no_gpu_detected=True): no GPU, nothing to publish" % fn)
                return
            data = self._memory_input(list(metrics), kw.get("gpu_total_bytes"))
            self.records.append({
                "case": self.case, "domain": "memory", "level": "diagnosis",
                "asserted": kind, "traceml": kind, "traceml_severity": None,
                "traceml_culprit": None, "thresholds": {}, "input": data, "via": fn,
                "traceml_published": self._traceml_on_memory_data(data),
                "traceml_published_culprit": None,
            })
        except Exception as e:
            self._unconvertible("memory %s: %s: %s" % (fn, type(e).__name__, e))

    def _record_memory_rule(self, signals, rule, issue):
        try:
            trend = signals.trend
            if rule in ("CreepConfirmedRule", "CreepEarlyRule") or trend.early or trend.confirmed:
                self._unconvertible("memory %s: fed a trend verdict (early=%s, confirmed=%s), "
                                    "not data" % (rule, trend.early, trend.confirmed))
                return
            worst = float(signals.worst_peak_bytes)
            skew = max(0.0, float(signals.skew_pct))
            median = worst / (1.0 + skew)
            pressure = signals.pressure_frac
            capacity = worst / pressure if pressure else None
            n = int(signals.steps_used)
            world = 1 if int(signals.ranks_seen) <= 1 else int(signals.ranks_seen)
            data = {"type": "memory", "world": world, "steps": n, "capacity": capacity,
                    "kinds": {signals.metric: {"median": [median] * n, "worst": [worst] * n}},
                    "fixture_note": ""}
            primary = None
            if self.sm_schema is not None:
                s = self.sm_schema
                metric = s.StepMemoryCombinedMetric(
                    metric=signals.metric, device=signals.device,
                    series=s.StepMemoryCombinedSeries(steps=list(range(n)), median=[median] * n,
                                                      worst=[worst] * n),
                    summary=s.StepMemoryCombinedSummary(
                        window_size=n, steps_used=n, median_peak=median, worst_peak=worst,
                        worst_rank=signals.worst_rank, skew_ratio=skew, skew_pct=skew),
                    coverage=s.StepMemoryCombinedCoverage(
                        expected_steps=n, steps_used=n, completed_step=n, world_size=world,
                        ranks_present=world, incomplete=False))
                self.depth += 1
                try:
                    primary = self.orig_memory_summary([metric], gpu_total_bytes=capacity).primary
                finally:
                    self.depth -= 1
            if primary is None:
                self._unconvertible("memory %s: TraceML's renderer schema unavailable" % rule)
                return
            self.records.append({
                "case": self.case, "domain": "memory", "level": "rule",
                "asserted": "%s -> %s" % (rule, issue.kind if issue is not None else "none"),
                "traceml": primary.kind, "traceml_severity": primary.severity,
                "traceml_culprit": None, "thresholds": {}, "input": data,
                "traceml_published": self._traceml_on_memory_data(data),
                "traceml_published_culprit": None,
            })
        except Exception as e:
            self._unconvertible("memory %s: %s: %s" % (rule, type(e).__name__, e))


def extract_in_sandbox(sandbox, test_files):
    """Child process: returns the JSON document of every vector the tests ask TraceML for."""
    os.chdir(sandbox)
    sys.path[:0] = [os.path.join(sandbox, "src"), sandbox]
    pt = _install_pytest_stand_in()
    inert = []
    for name in ("rich", "nicegui", "pynvml", "msgspec"):
        try:
            __import__(name)
        except ImportError:
            inert.append(name)
    _install_inert_modules(set(inert))

    rec = _Recorder()
    try:
        rec.install()
    except ImportError as e:
        return {"error": "this TraceML version lacks the diagnosis API the harness hooks "
                         "(traceml_ai.step_time.analysis and the window-based step-time "
                         "diagnosis, v0.3.6 and later): %s" % e}
    tests = []
    import importlib
    for path in test_files:
        modname = path[:-3].replace("/", ".")
        try:
            module = importlib.import_module(modname)
        except Exception as e:
            tests.append({"id": path, "status": "error",
                          "reason": "import: %s: %s" % (type(e).__name__, e)})
            continue
        for name, fn in sorted(vars(module).items(),
                               key=lambda kv: getattr(getattr(kv[1], "__code__", None),
                                                      "co_firstlineno", 0)):
            if not name.startswith("test_") or not inspect.isfunction(fn):
                continue
            for suffix, kwargs in _expand_cases(fn, pt):
                case = "%s::%s%s" % (os.path.basename(path)[:-3], name, suffix)
                entry = {"id": case}
                tests.append(entry)
                if getattr(fn, "_tv_skip", None):
                    entry.update(status="skipped", reason=fn._tv_skip)
                    continue
                args, mp, missing = dict(kwargs), None, []
                for p in inspect.signature(fn).parameters:
                    if p in args:
                        continue
                    if p == "monkeypatch":
                        mp = args[p] = pt.MonkeyPatch()
                    elif p == "tmp_path":
                        import pathlib
                        args[p] = pathlib.Path(tempfile.mkdtemp(dir=sandbox))
                    else:
                        missing.append(p)
                if missing:
                    entry.update(status="skipped", reason="fixture " + ", ".join(missing))
                    continue
                rec.case = case
                before = len(rec.records) + len(rec.unconvertible)
                try:
                    fn(**args)
                    entry["status"] = "passed"
                except pt.Skipped as e:
                    entry.update(status="skipped", reason=str(e))
                except AssertionError as e:
                    entry.update(status="failed", reason=str(e)[:200])
                except Exception as e:
                    entry.update(status="error", reason="%s: %s" % (type(e).__name__, str(e)[:200]))
                finally:
                    if mp is not None:
                        mp.undo()
                entry["captures"] = len(rec.records) + len(rec.unconvertible) - before
                rec.sources.clear()
                rec.contexts.clear()
    status = {t["id"]: t["status"] for t in tests}
    for r in rec.records:
        r["test_status"] = status.get(r["case"], "?")
    return {"inert_modules": inert, "tests": tests, "records": rec.records,
            "unconvertible": rec.unconvertible}


# ---------------------------------------------------------------------------------------------
# Parent: mirror -> sandbox -> vectors -> rankwatch -> comparison.
# ---------------------------------------------------------------------------------------------

def git(repo, *args):
    return subprocess.run(["git", "-C", repo] + list(args), capture_output=True, text=True,
                          check=True).stdout


def extract_vectors(repo, ref):
    commit = git(repo, "rev-parse", "--verify", ref + "^{commit}").strip()
    names = git(repo, "ls-tree", "-r", "--name-only", commit).splitlines()
    test_files = sorted(n for n in names if n.endswith(".py") and n.startswith(TEST_GLOBS))
    sandbox = tempfile.mkdtemp(prefix="traceml-vectors-")
    try:
        archive = subprocess.run(["git", "-C", repo, "archive", commit, "src", "tests"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", sandbox], input=archive, check=True)
        out = os.path.join(sandbox, "vectors.json")
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--_extract", sandbox,
                            "--_out", out] + test_files, capture_output=True, text=True,
                           timeout=600)
        if r.returncode != 0 or not os.path.exists(out):
            raise SystemExit("extracting TraceML's vectors failed:\n" + r.stderr[-3000:])
        with open(out) as f:
            doc = json.load(f)
        if "error" in doc:
            raise SystemExit("TraceML %s: %s" % (ref, doc["error"]))
    finally:
        shutil.rmtree(sandbox, ignore_errors=True)
    doc.update(commit=commit, ref=ref, test_files=test_files)
    return doc


def vector_key(rec):
    return hashlib.sha1(json.dumps([rec["input"], rec["thresholds"]], sort_keys=True)
                        .encode()).hexdigest()[:12]


def group_vectors(records):
    """One vector per distinct input: the cases (and their expectations) that use it."""
    vectors, by_key = [], {}
    for r in records:
        k = vector_key(r)
        if k not in by_key:
            by_key[k] = dict(r, key=k, cases=[], asserted_all=[], statuses=[])
            vectors.append(by_key[k])
        v = by_key[k]
        v["cases"].append(r["case"])
        if r["asserted"] not in v["asserted_all"]:
            v["asserted_all"].append(r["asserted"])
        v["statuses"].append(r.get("test_status", "?"))
    return vectors


def ns(ms):
    return None if ms is None else int(round(float(ms) * 1e6))


def build_batches(v, job, pb):
    """One Batch per rank (all its steps, `final` set)."""
    data = v["input"]
    now = time.time_ns()
    batches = []
    if data["type"] == "step":
        world = max(max(data["world"]) + 1, len(data["world"]))
        for rank_s, records in sorted(data["ranks"].items(), key=lambda kv: int(kv[0])):
            rank = int(rank_s)
            b = pb.Batch(schema_version=1, sequence=0, created_unix_ns=now, final=True)
            _identity(b.source, job, rank, world, data["strategy"])
            end = now - 10 ** 9 * 3600
            for r in records:
                st = ns(r["step_time"]) or 0
                end += st
                s = b.steps.add(step=int(r["step"]) + 1, step_time_ns=st, end_unix_ns=end)
                for field, key in (("dataloader_ns", "dataloader"), ("forward_ns", "forward"),
                                   ("backward_ns", "backward"), ("optimizer_ns", "optimizer")):
                    if r.get(key) is not None:
                        setattr(s, field, ns(r[key]))
            batches.append(b)
        return batches
    # memory: the aggregate series as ranks (the last one carries the worst-rank series)
    ranks = 1 if data["world"] <= 1 else 3
    n = data["steps"]
    for rank in range(ranks):
        b = pb.Batch(schema_version=1, sequence=0, created_unix_ns=now, final=True)
        _identity(b.source, job, rank, ranks, "")
        end = now - 10 ** 9 * 3600
        for i in range(n):
            end += 100 * 10 ** 6
            s = b.steps.add(step=i + 1, step_time_ns=100 * 10 ** 6, dataloader_ns=5 * 10 ** 6,
                            forward_ns=30 * 10 ** 6, backward_ns=50 * 10 ** 6,
                            optimizer_ns=10 * 10 ** 6, end_unix_ns=end)
            for name, series in data["kinds"].items():
                value = series["worst"][i] if rank == ranks - 1 else series["median"][i]
                field = ("peak_allocated_bytes" if "alloc" in name else "peak_reserved_bytes")
                setattr(s, field, int(round(value)))
            if data["capacity"] and data["kinds"]:
                s.device_capacity_bytes = int(round(data["capacity"]))
        batches.append(b)
    return batches


def _identity(src, job, rank, world, strategy):
    src.training_job, src.rank, src.world_size = job, rank, world
    src.node, src.local_rank, src.pid = "node-%d" % rank, 0, 1000 + rank
    src.device, src.collector = "cuda:0", "traceml-vectors"
    if strategy == "fsdp":
        src.training_strategy, src.sharded = "fsdp", True
    elif strategy:
        src.training_strategy = strategy


def run_rankwatch(vectors, bin_dir, daemon_args=(), timeout=120):
    """Publishes every vector as its own job; returns {key: {label, culprits, ...}}."""
    sys.path.insert(0, os.path.join(ROOT, "tests/e2e"))
    sys.path.insert(0, os.path.join(ROOT, "build/gen_py"))
    os.environ["RANKWATCH_BIN"] = bin_dir
    import harness
    harness.BIN = bin_dir
    import grpc
    from confluent_kafka import Producer
    from rankwatch.v1 import service_pb2, service_pb2_grpc, telemetry_pb2 as pb

    capacity = 100  # rankwatchd's default --window-steps
    if "--window-steps" in daemon_args:
        capacity = int(list(daemon_args)[list(daemon_args).index("--window-steps") + 1])
    step_names = {v: k for k, v in service_pb2.StepDiagnosisLabel.items()}
    # rankwatch's label names (rankwatch_memory_diagnosis{label=...}, docs/metrics.md)
    MEMORY_LABELS = {"MEMORY_NO_DATA": "no_data", "MEMORY_HIGH_PRESSURE": "high_pressure",
                     "MEMORY_IMBALANCE": "imbalance", "MEMORY_CREEP": "memory_creep",
                     "MEMORY_CREEP_EARLY": "memory_creep_early", "MEMORY_BALANCED": "balanced",
                     "MEMORY_DIAGNOSIS_UNSPECIFIED": "unspecified"}
    mem_names = {v: k for k, v in service_pb2.MemoryDiagnosisLabel.items()}
    fleet = harness.Fleet()
    results = {}
    try:
        brokers = fleet.start_broker(partitions=2)
        # A short alignment timeout: a vector may name a rank that never reports.
        daemon = fleet.start_daemon(brokers=brokers,
                                    extra=["--align-timeout", "1s"] + list(daemon_args))
        producer = Producer({"bootstrap.servers": brokers, "linger.ms": 5})
        jobs = {}
        for i, v in enumerate(vectors):
            job = "traceml-%03d-%s" % (i, v["key"][:6])
            jobs[job] = v
            for b in build_batches(v, job, pb):
                producer.produce("rankwatch.telemetry", key=job.encode(),
                                 value=b.SerializeToString())
        if producer.flush(30) != 0:
            raise SystemExit("could not deliver every batch to the broker")
        want = {job: v["input"]["steps"] for job, v in jobs.items()}
        last = {job: max(s.step for b in build_batches(v, job, pb) for s in b.steps)
                for job, v in jobs.items()}
        deadline = time.monotonic() + timeout
        pending = set(jobs)
        while pending and time.monotonic() < deadline:
            samples = harness.parse_metrics(harness.scrape(daemon))
            for job in list(pending):
                got = harness.metric(samples, "rankwatch_steps_aligned_total", training_job=job)
                if got is not None and got >= want[job]:
                    pending.discard(job)
            time.sleep(0.2)
        channel = grpc.insecure_channel(daemon.endpoints["grpc"])
        stub = service_pb2_grpc.RankWatchStub(channel)
        for job, v in jobs.items():
            res = {"job": job, "window_capacity": capacity}
            if job in pending:
                res["error"] = "not every step aligned within %d s" % timeout
            d = None
            until = time.monotonic() + 10
            while time.monotonic() < until:
                try:
                    d = stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job),
                                          timeout=5)
                except grpc.RpcError as e:
                    d, res["error"] = None, "GetDiagnosis: %s" % e.code().name
                # the diagnosis covers the last step (re-evaluated on the daemon's 20 ms tick)
                if d is not None and d.aligned_steps >= want[job] and (
                        d.step.window.last_step >= last[job] or
                        d.step.label == service_pb2.STEP_NO_DATA):
                    res.pop("error", None)
                    break
                time.sleep(0.1)
            if d is not None:
                res.update(
                    step=step_names[d.step.label].replace("STEP_", "").lower(),
                    memory=MEMORY_LABELS[mem_names[d.memory.label]],
                    culprits=list(d.step.culprit_ranks), aligned=d.aligned_steps,
                    cause=service_pb2.StragglerCause.Name(d.step.cause),
                    shares={"input": d.step.shares.input, "wait": d.step.shares.wait,
                            "compute": d.step.shares.compute},
                    scores={"input": d.step.scores.input, "compute": d.step.scores.compute,
                            "own": d.step.scores.own},
                    missing=[service_pb2.Phase.Name(m.phase) for m in d.step.missing],
                    memory_pressure=round(d.memory.pressure, 3),
                    memory_skew=round(max(d.memory.reserved.skew, d.memory.allocated.skew), 3),
                    note=d.step.note if v["domain"] == "step" else d.memory.note)
            results[v["key"]] = res
        channel.close()
    finally:
        fleet.close()
    return results


def _step_facts(data):
    """What the classification needs to know of a step vector."""
    missing, forward_seen, h2d = set(), False, False
    steps = {}
    for rank, records in data["ranks"].items():
        for r in records:
            for key in ("dataloader", "forward", "backward", "optimizer"):
                if r.get(key) is None:
                    missing.add(key)
            forward_seen |= (r.get("forward") or 0) > 0
            h2d |= (r.get("h2d") or 0) > 0
        steps[rank] = sum(r.get("step_time") or 0 for r in records) / max(1, len(records))
    values = sorted(steps.values())
    median = (values[(len(values) - 1) // 2] + values[len(values) // 2]) / 2 if values else 0
    synced = len(values) > 1 and median > 0 and (values[-1] - median) / median <= 0.02
    return {"missing": missing, "absent_ranks": len(data["world"]) > len(data["ranks"]),
            "forward_seen": forward_seen, "h2d": h2d, "synced": synced,
            "ranks": len(data["ranks"])}


# The share thresholds that decide a label (docs/diagnoses.md): input_bound, wait_heavy,
# compute_bound.
LABEL_SHARE_THRESHOLDS = (("input", 0.10), ("wait", 0.10), ("compute", 0.90))


def classify(v, rw, target="traceml"):
    """(agree, one-word reason) for a vector and rankwatch's answer. `target` is the TraceML
    answer compared: the test's ("traceml") or TraceML's on the published data."""
    data = v["input"]
    if "step" not in rw:
        return False, "no-answer"
    memory = v["domain"] == "memory"
    table = MEMORY_KIND_TO_RANKWATCH if memory else STEP_KIND_TO_RANKWATCH
    kind = v[target] if target == "traceml" else v["traceml_published"]
    culprit = v["traceml_culprit"] if target == "traceml" else v["traceml_published_culprit"]
    expected, got = table.get(kind, kind.lower()), rw["memory" if memory else "step"]
    if got == expected:
        if not memory and kind in STRAGGLER_KINDS and culprit is not None:
            if rw["culprits"] != [culprit]:
                return False, "culprit"
        return True, "h2d" if kind.startswith("H2D") else ""
    if not memory and got == "no_data" and data["steps"] < MIN_STEPS:
        return False, "window<8"
    if not memory and data["steps"] > rw.get("window_capacity", 100):
        return False, "window"  # rankwatch's window is its last K steps (--window-steps)
    shares = rw.get("shares", {})
    if (not memory and got not in RW_STRAGGLERS and
            any(0 < t - shares.get(k, 0) < 1e-9 for k, t in LABEL_SHARE_THRESHOLDS)):
        return False, "boundary"  # a share exactly at a label's threshold computed just under it
    facts = None if memory else _step_facts(data)
    if (not memory and got in RW_STRAGGLERS and facts["synced"] and not facts["forward_seen"]
            and data["strategy"] != "fsdp"):
        return False, "no-forward"
    republished = v.get("traceml_published")
    if (target == "traceml" and republished and republished != v["traceml"]
            and got == table.get(republished)):
        return False, "fixture"  # TraceML says what rankwatch says once the fixture is data
    if memory:
        if kind == "NO_DATA" and 48 <= data["steps"] < 50:
            return False, "min-steps"
        if "creep" in expected or "creep" in got:
            return False, "creep"
        return False, "defaults" if "imbalance" in (expected, got) else "memory"
    if kind.startswith("H2D") or facts["h2d"]:
        return False, "h2d"
    if data["strategy"] == "fsdp":
        return False, "fsdp"
    if facts["missing"] or facts["absent_ranks"] or "INCOMPLETE_DATA" in (kind,) or \
            got == "incomplete_data":
        return False, "missing-signal"
    straggler_involved = kind in STRAGGLER_KINDS or got in RW_STRAGGLERS
    if straggler_involved and facts["ranks"] > 1 and not facts["synced"]:
        return False, "unsynced"
    if kind in STRAGGLER_KINDS and got in RW_STRAGGLERS:
        return False, "attribution"
    if got in RW_STRAGGLERS and rw.get("cause") == "CAUSE_OUTSIDE":
        return False, "outside-phases"
    if straggler_involved:
        return False, "straggler-model"
    return False, "precedence"


def describe_input(v):
    """A short, readable form of a vector's per-rank input (first step), ms."""
    data = v["input"]
    if data["type"] == "memory":
        parts = []
        for name, s in data["kinds"].items():
            parts.append("%s median %s->%s worst %s->%s" % (
                name, _b(s["median"][0]), _b(s["median"][-1]), _b(s["worst"][0]),
                _b(s["worst"][-1])))
        cap = _b(data["capacity"]) if data["capacity"] else "?"
        return "%d steps, world %d, capacity %s; %s" % (data["steps"], data["world"], cap,
                                                       "; ".join(parts) or "no memory")
    rows = []
    for rank, recs in sorted(data["ranks"].items(), key=lambda kv: int(kv[0])):
        r = recs[-1]
        fields = []
        for key, short in (("dataloader", "dl"), ("h2d", "h2d"), ("forward", "fw"),
                           ("backward", "bw"), ("optimizer", "opt"), ("step_time", "step")):
            val = r.get(key)
            vals = {x.get(key) for x in recs}
            if len(vals) > 1:
                present = sum(1 for x in recs if x.get(key) is not None)
                fields.append("%s=%s(%d/%d)" % (short, _ms(val), present, len(recs))
                              if None in vals else "%s=varies" % short)
            elif val is not None:
                fields.append("%s=%s" % (short, _ms(val)))
        rows.append("r%s{%s}" % (rank, " ".join(fields)))
    extra = " fsdp" if data["strategy"] == "fsdp" else ""
    return "%d steps %s%s, world %d: %s" % (data["steps"], data["clock"], extra,
                                           len(data["world"]), " ".join(rows))


def _ms(x):
    return "-" if x is None else ("%g" % round(x, 3))


def _b(x):
    if x >= 2 ** 30:
        return "%.2fGiB" % (x / 2 ** 30)
    if x >= 2 ** 20:
        return "%.1fMiB" % (x / 2 ** 20)
    return "%gB" % round(x, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traceml-repo", default=DEFAULT_MIRROR,
                    help="TraceML's git repository (bare mirror or checkout)")
    ap.add_argument("--ref", default="HEAD", help="commit or tag of TraceML to read")
    ap.add_argument("--only", default=None, help="vectors whose case name contains this")
    ap.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/bin"))
    ap.add_argument("--window-steps", type=int, default=None,
                    help="rankwatchd --window-steps (default: the daemon's, 100)")
    ap.add_argument("--extract-only", action="store_true",
                    help="extract and list the vectors; start no daemon")
    ap.add_argument("--verbose", action="store_true", help="print each vector's input")
    ap.add_argument("--_extract", help=argparse.SUPPRESS)
    ap.add_argument("--_out", help=argparse.SUPPRESS)
    ap.add_argument("files", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._extract:
        doc = extract_in_sandbox(args._extract, args.files)
        with open(args._out, "w") as f:
            json.dump(doc, f)
        return 0

    repo = args.traceml_repo
    try:
        git(repo, "rev-parse", "--git-dir")
    except (subprocess.CalledProcessError, FileNotFoundError):
        print("TraceML's repository is not at %s: this benchmark reads its test vectors from "
              "there (--traceml-repo DIR)." % repo, file=sys.stderr)
        return 2
    for b in ("rankwatch", "rankwatchd"):
        if not args.extract_only and not os.access(os.path.join(args.bin, b), os.X_OK):
            print("missing binary %s/%s (build rankwatch first)" % (args.bin, b), file=sys.stderr)
            return 1

    doc = extract_vectors(repo, args.ref)
    vectors = group_vectors(doc["records"])
    if args.only:
        vectors = [v for v in vectors if any(args.only in c for c in v["cases"])]
    extra = ["--window-steps", str(args.window_steps)] if args.window_steps else []
    results = {} if args.extract_only else run_rankwatch(vectors, args.bin, extra)
    rows = [make_row(v, results.get(v["key"], {})) for v in vectors]
    summary = summarize(doc, rows)
    if args.json:
        print(json.dumps({"summary": summary, "rows": rows}, indent=1))
    else:
        print_report(doc, rows, summary, args.verbose)
    return 0


def make_row(v, rw):
    agree, reason = classify(v, rw) if rw else (None, "")
    agree_data, reason_data = classify(v, rw, target="published") if rw else (None, "")
    return {
        "case": v["cases"][0], "cases": v["cases"], "domain": v["domain"], "level": v["level"],
        "test_expects": v["asserted_all"],
        "tests_pass": all(s == "passed" for s in v["statuses"]),
        "traceml": v["traceml"], "traceml_severity": v["traceml_severity"],
        "traceml_culprit": v["traceml_culprit"],
        "traceml_on_published": v["traceml_published"],
        "traceml_on_published_culprit": v["traceml_published_culprit"],
        "rankwatch": rw.get("memory" if v["domain"] == "memory" else "step"),
        "rankwatch_culprits": rw.get("culprits"), "agree": agree, "reason": reason,
        "agree_on_published": agree_data, "reason_on_published": reason_data,
        "input": describe_input(v), "fixture_note": v["input"].get("fixture_note", ""),
        "rankwatch_detail": rw,
    }


def _count(rows, key="agree", reason="reason"):
    out = {"vectors": len(rows), "agree": sum(1 for r in rows if r[key]),
           "differ": sum(1 for r in rows if r[key] is False), "differ_by_reason": {}}
    for r in rows:
        if r[key] is False:
            out["differ_by_reason"][r[reason]] = out["differ_by_reason"].get(r[reason], 0) + 1
    out["differ_by_reason"] = dict(sorted(out["differ_by_reason"].items(),
                                          key=lambda kv: (-kv[1], kv[0])))
    return out


def summarize(doc, rows):
    tests = doc["tests"]
    status = {}
    for t in tests:
        status[t["status"]] = status.get(t["status"], 0) + 1
    not_extracted = {}
    for u in doc["unconvertible"]:
        why = ("creep rule fed a trend verdict, not data" if "trend verdict" in u["why"] else
               "aggregate metrics only, no per-rank rows" if "aggregate metrics" in u["why"]
               else u["why"])
        not_extracted[why] = not_extracted.get(why, 0) + 1
    return {
        "traceml_commit": doc["commit"], "ref": doc["ref"], "test_files": doc["test_files"],
        "test_cases": len(tests), "test_status": status,
        "test_cases_without_diagnosis": sum(1 for t in tests if t.get("captures", 0) == 0),
        "diagnoses_asked": len(doc["records"]) + len(doc["unconvertible"]),
        "not_extracted": not_extracted, "inert_modules": doc["inert_modules"],
        "vs_test": _count(rows),
        "vs_traceml_on_published": _count(rows, "agree_on_published", "reason_on_published"),
        "step": _count([r for r in rows if r["domain"] == "step"]),
        "memory": _count([r for r in rows if r["domain"] == "memory"]),
    }


def _label(kind, culprit):
    return kind + ("(r%s)" % culprit if culprit is not None else "")


def print_report(doc, rows, summary, verbose):
    print("TraceML %s (%s): %d test cases in %s" % (
        doc["commit"][:10], doc["ref"], len(doc["tests"]),
        ", ".join(os.path.basename(f) for f in doc["test_files"])))
    print()
    head = "%-3s %-62s %-30s %-22s %-22s %s" % ("#", "case", "test expects", "TraceML",
                                               "rankwatch", "verdict")
    print(head)
    print("-" * len(head))
    for i, r in enumerate(rows):
        tm = _label(r["traceml"], r["traceml_culprit"])
        rwl = "-" if r["rankwatch"] is None else r["rankwatch"]
        if r["rankwatch_culprits"] and (r["traceml_culprit"] is not None
                                        or r["rankwatch"] in RW_STRAGGLERS):
            rwl += "(r%s)" % ",".join(str(c) for c in r["rankwatch_culprits"])
        verdict = ("-" if r["agree"] is None else "agree" if r["agree"] else
                   "differ: " + r["reason"])
        if r["agree"] and r["reason"]:
            verdict += " (%s)" % r["reason"]
        case = r["case"] + (" (+%d)" % (len(r["cases"]) - 1) if len(r["cases"]) > 1 else "")
        if not r["tests_pass"]:
            case += " [test fails]"
        print("%-3d %-62s %-30s %-22s %-22s %s" % (i + 1, case[:62], "; ".join(r["test_expects"])
                                                   [:30], tm, rwl, verdict))
        if verbose or r["agree"] is False:
            print("      input: %s" % r["input"])
            if r["fixture_note"]:
                print("      fixture: %s" % r["fixture_note"])
            published = _label(r["traceml_on_published"], r["traceml_on_published_culprit"])
            if published != tm:
                print("      TraceML on the published data: %s" % published)
            d = r["rankwatch_detail"]
            if d.get("note") or d.get("error"):
                print("      rankwatch: %s" % (d.get("error") or d.get("note")))
    print()
    st = summary["test_status"]
    print("vectors %d: the distinct inputs of %d diagnoses asked for by %d test cases (%s)" % (
        len(rows), summary["diagnoses_asked"], summary["test_cases"],
        ", ".join("%d %s" % (n, s) for s, n in sorted(st.items()))))
    for title, c in (("against the test's expectation", summary["vs_test"]),
                     ("  of which step time", summary["step"]),
                     ("  of which memory", summary["memory"]),
                     ("against TraceML on the published data", summary["vs_traceml_on_published"])):
        print("%-40s agree %d, differ %d%s" % (
            title, c["agree"], c["differ"],
            (": " + ", ".join("%s %d" % kv for kv in c["differ_by_reason"].items()))
            if c["differ"] else ""))
    print("not extracted: %s; %d test cases ask TraceML for no diagnosis (window, renderer and "
          "schema tests)" % (", ".join("%d %s" % (n, w) for w, n in
                                       summary["not_extracted"].items()) or "none",
                             summary["test_cases_without_diagnosis"]))
    if summary["inert_modules"]:
        print("inert stand-ins for modules not installed here: %s" %
              ", ".join(summary["inert_modules"]))


if __name__ == "__main__":
    sys.exit(main())
