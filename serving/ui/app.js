// rankwatch web UI: one page for /ui/ (every job), /ui/jobs/<job>, /ui/jobs/<job>/ranks/<rank>,
// /ui/nodes/ (the fleet view of nodes) and /ui/nodes/<node>, drawn from the daemon's JSON API
// (/api/v1/, the protobuf JSON mapping of what gRPC serves). Read-only; no dependency, no
// network beyond this server. Polls every 2 s.
"use strict";

const REFRESH_MS = 2000;
const HEATMAP_REFRESH_MS = 5000;
const app = document.getElementById("app");
const crumbs = document.getElementById("crumbs");
const statusLine = document.getElementById("status");
let timer = null;

// --- helpers --------------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

async function api(path) {
  const r = await fetch("/api/v1/" + path, {headers: {Accept: "application/json"}});
  const body = await r.json().catch(() => ({error: "HTTP " + r.status}));
  if (!r.ok) throw new Error(body.error || "HTTP " + r.status);
  return body;
}

function jobPath(job) { return "jobs/" + encodeURIComponent(job); }
function jobUrl(job) { return "/ui/jobs/" + encodeURIComponent(job); }
function rankUrl(job, rank) { return jobUrl(job) + "/ranks/" + rank; }
function nodeUrl(node) { return "/ui/nodes/" + encodeURIComponent(node); }
// A link to the node's record in the fleet view of nodes.
function nodeLink(node, attrs) { return el("a", Object.assign({href: nodeUrl(node), class: "node-link", text: node}, attrs || {})); }

// Enum names without their prefix, lower case: STEP_COMPUTE_STRAGGLER -> compute_straggler.
function label(value, prefix) {
  if (!value) return "—";
  return String(value).replace(prefix, "").toLowerCase();
}
// The memory labels as the daemon names them (memory_creep, high_pressure, ...).
function memoryLabel(value) {
  const l = label(value, "MEMORY_");
  return l.startsWith("creep") ? "memory_" + l : l;
}
function severity(value) { return String(value || "SEVERITY_UNSPECIFIED").replace("SEVERITY_", ""); }
function badge(sev) {
  const s = severity(sev);
  return el("span", {class: "badge sev-" + s, text: s === "UNSPECIFIED" ? "ok" : s.toLowerCase()});
}
function ms(seconds) { return seconds === undefined || seconds === null ? "—" : (seconds * 1e3).toFixed(1) + " ms"; }
function pct(x) { return x === undefined || x === null ? "—" : (x * 100).toFixed(1) + " %"; }
function bytes(b) {
  b = Number(b || 0);
  if (!b) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let u = 0;
  while (b >= 1024 && u < units.length - 1) { b /= 1024; u++; }
  return b.toFixed(u ? 1 : 0) + " " + units[u];
}
function setStatus(text, error) {
  statusLine.textContent = text;
  statusLine.className = "status" + (error ? " error" : "");
}
function schedule(fn, ms) {
  clearTimeout(timer);
  timer = setTimeout(fn, ms);
}

// --- routing -------------------------------------------------------------------------------
function route() {
  const path = location.pathname;
  let m;
  if ((m = path.match(/^\/ui\/jobs\/(.+)\/ranks\/(\d+)\/?$/))) return rankPage(decodeURIComponent(m[1]), Number(m[2]));
  if ((m = path.match(/^\/ui\/jobs\/(.+?)\/?$/))) return jobPage(decodeURIComponent(m[1]));
  if ((m = path.match(/^\/ui\/nodes\/(.+?)\/?$/))) return nodePage(decodeURIComponent(m[1]));
  if (/^\/ui\/nodes\/?$/.test(path)) return nodesPage();
  return fleetPage();
}

function setCrumbs(...links) {
  crumbs.replaceChildren(...links.flatMap((l, i) => [i ? " / " : "", l]));
}

// --- fleet ---------------------------------------------------------------------------------
const fleetColumns = [
  {key: "job", title: "Job", get: j => j.trainingJob},
  {key: "ranks", title: "Ranks", num: true, get: j => j.worldSize},
  {key: "step", title: "Step diagnosis", get: j => label(j.stepLabel, "STEP_")},
  {key: "severity", title: "Severity", get: j => severityRank(j.stepSeverity, j.memorySeverity)},
  {key: "culprit", title: "Culprit", get: j => (j.culpritRanks || []).join(",")},
  {key: "memory", title: "Memory", get: j => memoryLabel(j.memoryLabel)},
  {key: "lost", title: "Lost rank-s", num: true, get: j => (j.lostTime || {}).totalStragglerRankSeconds + (j.lostTime || {}).totalHangRankSeconds},
  {key: "alerts", title: "Firing alerts", num: true, get: j => (j.firingAlerts || []).length},
  {key: "steps", title: "Aligned steps", num: true, get: j => Number(j.alignedSteps)},
];
const SEVERITIES = ["SEVERITY_UNSPECIFIED", "SEVERITY_INFO", "SEVERITY_WARN", "SEVERITY_CRIT"];
function severityRank(a, b) { return Math.max(SEVERITIES.indexOf(a), SEVERITIES.indexOf(b)); }
let fleetSort = {key: "severity", desc: true};

async function fleetPage() {
  setCrumbs(el("a", {href: "/ui/", text: "jobs"}));
  document.title = "rankwatch — jobs";
  let data;
  try {
    data = await api("jobs");
  } catch (e) {
    setStatus("cannot reach rankwatchd: " + e.message, true);
    return schedule(fleetPage, REFRESH_MS);
  }
  const jobs = data.jobs || [];
  const col = fleetColumns.find(c => c.key === fleetSort.key) || fleetColumns[0];
  jobs.sort((a, b) => {
    const x = col.get(a), y = col.get(b);
    const c = x < y ? -1 : x > y ? 1 : a.trainingJob.localeCompare(b.trainingJob);
    return fleetSort.desc ? -c : c;
  });
  const head = el("tr", {}, fleetColumns.map(c => el("th", {
    class: "sortable" + (c.num ? " num" : "") + (c.key === fleetSort.key ? (fleetSort.desc ? " sorted-desc" : " sorted-asc") : ""),
    text: c.title, "data-key": c.key,
    onclick: () => { fleetSort = {key: c.key, desc: c.key === fleetSort.key ? !fleetSort.desc : c.num || c.key === "severity"}; fleetPage(); },
  })));
  const rows = jobs.map(j => {
    const lost = (j.lostTime || {});
    const culprits = (j.culpritRanks || []).map((r, i) => {
      const pod = (j.culpritPods || [])[i];
      return el("a", {href: rankUrl(j.trainingJob, r), class: "culprit", text: "rank " + r + (pod ? " (" + pod + ")" : "")});
    });
    return el("tr", {"data-job": j.trainingJob},
      el("td", {}, el("a", {href: jobUrl(j.trainingJob), text: j.trainingJob})),
      el("td", {class: "num", text: j.worldSize}),
      el("td", {class: "step-label", text: label(j.stepLabel, "STEP_")}),
      el("td", {}, badge(SEVERITIES[severityRank(j.stepSeverity, j.memorySeverity)])),
      el("td", {}, culprits.length ? culprits.flatMap((c, i) => [i ? ", " : "", c]) : "—"),
      el("td", {class: "memory-label", text: memoryLabel(j.memoryLabel)}),
      el("td", {class: "num", text: ((lost.totalStragglerRankSeconds || 0) + (lost.totalHangRankSeconds || 0)).toFixed(1)}),
      el("td", {class: "num", text: (j.firingAlerts || []).length}),
      el("td", {class: "num", text: j.alignedSteps}));
  });
  app.replaceChildren(
    el("h1", {text: jobs.length + (jobs.length === 1 ? " job" : " jobs")}),
    jobs.length ? el("table", {id: "jobs"}, el("thead", {}, head), el("tbody", {}, rows))
                : el("p", {class: "muted", text: "No job has sent telemetry yet."}));
  setStatus("updated " + new Date().toLocaleTimeString());
  schedule(fleetPage, REFRESH_MS);
}

// --- nodes ---------------------------------------------------------------------------------
// The fleet view of nodes (docs/fleet.md): the nodes that were culprits of straggler alerts
// across jobs, by the rank-seconds they cost, and one node's record with the jobs it slowed.

// Rank-seconds as rank-hours, small costs kept visible (as `rankwatch nodes` prints them).
function rankHours(seconds) {
  const s = Number(seconds || 0);
  if (s <= 0) return "0";
  const h = s / 3600;
  if (h < 0.0005) return "<0.001";
  return h.toFixed(h >= 100 ? 0 : h >= 10 ? 1 : h >= 1 ? 2 : 3);
}
// A span of seconds as the daemon's flags write it: 7d, 24h, 90m, 45s.
function span(seconds) {
  const s = Number(seconds || 0);
  if (s >= 3 * 86400 && s % 86400 === 0) return s / 86400 + "d";
  if (s > 0 && s % 3600 === 0) return s / 3600 + "h";
  if (s > 0 && s % 60 === 0) return s / 60 + "m";
  return s + "s";
}
// A time (unix nanoseconds, a string in the JSON mapping) as "3 h ago", the date on hover.
function ago(ns) {
  const ms = Number(ns || 0) / 1e6;
  if (!ms) return el("span", {text: "—"});
  const s = Math.floor((Date.now() - ms) / 1000);
  const text = s < 1 ? "now" : s < 60 ? s + " s ago" : s < 3600 ? Math.floor(s / 60) + " min ago"
    : s < 86400 ? Math.floor(s / 3600) + " h ago" : Math.floor(s / 86400) + " d ago";
  return el("span", {text, title: new Date(ms).toLocaleString()});
}
function alertBadge(firing) {
  return firing ? el("span", {class: "badge sev-CRIT", text: "firing"}) : el("span", {class: "muted", text: "—"});
}
// The node alert's rule and whether the view has read every instance's records yet.
function nodeRule(data) {
  return "The node alert fires for a node that was the culprit of " + data.alertJobs + " jobs within " + span(data.alertWindowSeconds) +
    "; records are kept " + span(data.horizonSeconds) + "." +
    (data.complete ? "" : " The daemon is still reading the nodes topic: the view is not complete yet.");
}

async function nodesPage() {
  setCrumbs(el("a", {href: "/ui/nodes/", text: "nodes"}));
  document.title = "rankwatch — nodes";
  let data;
  try {
    data = await api("nodes");
  } catch (e) {
    app.replaceChildren(el("h1", {text: "Nodes"}), el("p", {class: "error", id: "nodes-error", text: e.message}));
    setStatus("", false);
    return schedule(nodesPage, REFRESH_MS);
  }
  const nodes = data.nodes || [];
  const total = data.nodesTotal || 0;
  const head = el("tr", {}, [["node"], ["jobs", 1], ["jobs in " + span(data.alertWindowSeconds), 1], ["episodes", 1],
    ["lost rank-hours", 1], ["first seen"], ["last seen"], ["node alert"]].map(([t, num]) => el("th", {class: num ? "num" : "", text: t})));
  const rows = nodes.map(n => el("tr", {"data-node": n.node},
    el("td", {}, nodeLink(n.node)),
    el("td", {class: "num jobs", text: n.jobs}),
    el("td", {class: "num jobs-in-window", text: n.jobsInAlertWindow}),
    el("td", {class: "num episodes", text: n.episodes}),
    el("td", {class: "num lost", title: Number(n.lostRankSeconds).toFixed(1) + " rank-s", text: rankHours(n.lostRankSeconds)}),
    el("td", {}, ago(n.firstUnixNs)),
    el("td", {}, ago(n.lastUnixNs)),
    el("td", {class: "alert"}, alertBadge(n.alertFiring))));
  app.replaceChildren(
    el("h1", {text: total + (total === 1 ? " culprit node" : " culprit nodes") + " within " + span(data.horizonSeconds) +
      (nodes.length < total ? " (the top " + nodes.length + " by lost rank-hours)" : "")}),
    el("p", {class: "muted", id: "nodes-rule", text: nodeRule(data)}),
    nodes.length ? el("table", {id: "nodes"}, el("thead", {}, head), el("tbody", {}, rows))
                 : el("p", {class: "muted", id: "nodes-empty", text: "No node has been the culprit of a straggler alert."}));
  setStatus("updated " + new Date().toLocaleTimeString());
  schedule(nodesPage, REFRESH_MS);
}

async function nodePage(node) {
  setCrumbs(el("a", {href: "/ui/nodes/", text: "nodes"}), nodeLink(node));
  document.title = "rankwatch — node " + node;
  let data;
  try {
    data = await api("nodes/" + encodeURIComponent(node));
  } catch (e) {
    app.replaceChildren(el("h1", {text: "node " + node}), el("p", {class: "error", id: "node-error", text: e.message}));
    setStatus("", false);
    return schedule(() => nodePage(node), REFRESH_MS);
  }
  const r = data.nodes[0];
  const jobs = r.byJob || [];
  app.replaceChildren(
    el("h1", {}, "node " + r.node + " ", alertBadge(r.alertFiring)),
    el("dl", {class: "kv", id: "node-summary"},
      el("dt", {text: "culprit in"}), el("dd", {id: "node-jobs-count", text: r.jobs + (r.jobs === 1 ? " job" : " jobs") + ", " + r.episodes + (r.episodes === 1 ? " episode" : " episodes")}),
      el("dt", {text: "lost"}), el("dd", {id: "node-lost", text: rankHours(r.lostRankSeconds) + " rank-hours (" + Number(r.lostRankSeconds).toFixed(1) + " rank-s) while its straggler alerts fired"}),
      el("dt", {text: "first seen"}), el("dd", {}, ago(r.firstUnixNs)),
      el("dt", {text: "last seen"}), el("dd", {}, ago(r.lastUnixNs)),
      el("dt", {text: "node alert"}), el("dd", {id: "node-alert", text: (r.alertFiring ? "firing: " : "not firing: ") + r.jobsInAlertWindow + " of " + data.alertJobs + " jobs within " + span(data.alertWindowSeconds)})),
    el("p", {class: "muted", text: nodeRule(data)}),
    el("h2", {text: "Jobs it slowed (newest first)"}),
    jobs.length ? el("table", {id: "node-jobs"},
      el("thead", {}, el("tr", {}, [["job"], ["namespace"], ["culprit ranks"], ["episodes", 1], ["lost rank-hours", 1], ["first seen"], ["last seen"], ["straggler alert"]]
        .map(([t, num]) => el("th", {class: num ? "num" : "", text: t})))),
      el("tbody", {}, jobs.map(j => el("tr", {"data-job": j.trainingJob},
        el("td", {}, el("a", {href: jobUrl(j.trainingJob), class: "job-link", text: j.trainingJob})),
        el("td", {text: j.namespace || "—"}),
        el("td", {}, (j.ranks || []).flatMap((k, i) => [i ? ", " : "", el("a", {href: rankUrl(j.trainingJob, k), text: String(k)})])),
        el("td", {class: "num", text: j.episodes}),
        el("td", {class: "num lost", title: Number(j.lostRankSeconds).toFixed(1) + " rank-s", text: rankHours(j.lostRankSeconds)}),
        el("td", {}, ago(j.firstUnixNs)),
        el("td", {}, ago(j.lastUnixNs)),
        el("td", {class: "alert"}, alertBadge(j.firing))))))
      : el("p", {class: "muted", text: "No job within the horizon."}));
  setStatus("updated " + new Date().toLocaleTimeString());
  schedule(() => nodePage(node), REFRESH_MS);
}

// --- job -----------------------------------------------------------------------------------
// The heatmap shows own time by default (the daemon's choice when the job's blocked time is
// known): under data-parallel synchronisation every rank's step time is the same, and the rank
// the others wait for shows in the time it spends on its own.
const jobState = {job: null, metric: "", grouping: "node", collapsed: new Set(), heatmap: null, heatmapAt: 0};

async function jobPage(job) {
  if (jobState.job !== job) Object.assign(jobState, {job, heatmap: null, heatmapAt: 0, collapsed: new Set()});
  setCrumbs(el("a", {href: "/ui/", text: "jobs"}), el("a", {href: jobUrl(job), text: job}));
  document.title = "rankwatch — " + job;
  let d, alerts, captures;
  try {
    const heatmap = !jobState.heatmap || Date.now() - jobState.heatmapAt > HEATMAP_REFRESH_MS ? loadHeatmap(job) : null;
    [d, alerts, captures] = await Promise.all([
      api(jobPath(job)),
      api(jobPath(job) + "/alerts?max=50").catch(() => ({alerts: []})),
      api(jobPath(job) + "/captures").catch(() => ({captures: []})),
    ]);
    await heatmap;
  } catch (e) {
    app.replaceChildren(el("h1", {text: job}), el("p", {class: "error", text: e.message}));
    setStatus("", false);
    return schedule(() => jobPage(job), REFRESH_MS);
  }
  const scroll = window.scrollY;
  app.replaceChildren(
    el("h1", {text: job}),
    el("div", {class: "cards"}, d.whatif ? whatifCard(d) : [], stepCard(d), memoryCard(d)),
    d.whatif ? whatifSection(d) : [],
    el("h2", {text: "Evidence"}), evidenceTable(d),
    el("h2", {text: "Ranks × steps"}), heatmapSection(job),
    el("h2", {text: "Memory over the job's life"}), memoryChart(d),
    el("h2", {text: "Alerts"}), alertTable(alerts.alerts || []),
    el("h2", {text: "Captures"}), captureTable(job, captures.captures || []));
  drawHeatmap();
  window.scrollTo(0, scroll);
  setStatus("updated " + new Date().toLocaleTimeString());
  schedule(() => jobPage(job), REFRESH_MS);
}

function stepCard(d) {
  const s = d.step || {};
  const culprits = (s.culpritRanks || []).map((r, i) => {
    const pod = (s.culpritPods || [])[i];
    return el("a", {href: rankUrl(d.trainingJob, r), class: "culprit", text: "rank " + r + (pod ? " — pod " + pod : "")});
  });
  return el("div", {class: "card", id: "step-card"},
    el("h2", {}, "Step time: ", el("span", {id: "step-label", text: label(s.label, "STEP_")}), " ", badge(s.severity)),
    el("dl", {class: "kv"},
      el("dt", {text: "culprit"}), el("dd", {id: "culprit"}, culprits.length ? culprits.flatMap((c, i) => [i ? ", " : "", c]) : "—",
        s.culpritNode ? [" on node ", nodeLink(s.culpritNode, {id: "culprit-node", title: "the node's record across jobs"})] : ""),
      el("dt", {text: "phase"}), el("dd", {text: label(s.culpritPhase, "PHASE_")}),
      el("dt", {text: "note"}), el("dd", {text: s.note || "—"}),
      el("dt", {text: "next step"}), el("dd", {text: s.nextStep || "—"}),
      el("dt", {text: "window"}), el("dd", {text: s.window ? "steps " + s.window.firstStep + "–" + s.window.lastStep + " (" + s.window.steps + "), " + s.window.ranksPresent + "/" + s.window.worldSize + " ranks" : "—"}),
      el("dt", {text: "shares"}), el("dd", {text: s.shares ? "input " + pct(s.shares.input) + ", wait " + pct(s.shares.wait) + ", compute " + pct(s.shares.compute) : "—"}),
      el("dt", {text: "lost time"}), el("dd", {text: d.lostTime ? d.lostTime.totalStragglerRankSeconds.toFixed(1) + " rank-s to stragglers, " + d.lostTime.totalHangRankSeconds.toFixed(1) + " to hangs" : "—"}),
      Number(d.inputLostMessages) > 0 ? [el("dt", {text: "input lost"}), el("dd", {class: "error", text: d.inputLostMessages + " messages never read: partial data"})] : []));
}

// Pipeline jobs: the what-if verdict (docs/whatif.md).
function whatifCard(d) {
  const w = d.whatif;
  const ranks = (w.culpritRanks || []).slice(0, 8).map(r => el("a", {href: rankUrl(d.trainingJob, r), class: "culprit", text: String(r)}));
  const where = w.culpritStage !== undefined && w.culpritStage >= 0
    ? (w.culpritDataRank >= 0 ? "data rank " + w.culpritDataRank + ", " : "") + "stage " + w.culpritStage : "—";
  return el("div", {class: "card", id: "whatif-card"},
    el("h2", {}, "Pipeline: ", el("span", {id: "whatif-verdict", text: (w.verdict || "none").replace(/_/g, " ")}), " ", badge(w.severity)),
    el("dl", {class: "kv"},
      el("dt", {text: "layout"}), el("dd", {text: "DP " + w.dataParallelSize + " × PP " + w.pipelineSize + " × TP " + w.tensorParallelSize}),
      el("dt", {text: "slowdown S"}), el("dd", {id: "whatif-slowdown", text: w.slowdown !== undefined ? Number(w.slowdown).toFixed(3) : "—"}),
      el("dt", {text: "step"}), el("dd", {text: w.actualStepMs !== undefined ? Number(w.actualStepMs).toFixed(1) + " ms simulated, " + Number(w.idealStepMs).toFixed(1) + " ms ideal" : "—"}),
      el("dt", {text: "culprit"}), el("dd", {id: "whatif-culprit"}, where, ranks.length ? " — ranks " : "", ranks.flatMap((c, i) => [i ? ", " : "", c])),
      el("dt", {text: "M_W / M_S"}), el("dd", {text: Number(w.mW || 0).toFixed(2) + " / " + Number(w.mS || 0).toFixed(2) + " (last stage; worst stage " + (w.mSStage || 0) + ": " + Number(w.mSWorst || 0).toFixed(2) + ")"}),
      el("dt", {text: "lost"}), el("dd", {text: Number(w.lostRankSeconds || 0).toFixed(1) + " rank-s in the window"}),
      el("dt", {text: "note"}), el("dd", {text: w.note || "—"}),
      el("dt", {text: "next step"}), el("dd", {text: w.nextStep || "—"})));
}

// The stage × data-parallel replica grid (a cell: min(S of its stage, S of its replica), the
// study's worker score) and S over the window's steps.
function whatifSection(d) {
  const w = d.whatif;
  const byStage = w.slowdownByStage || [], byDp = w.slowdownByDataRank || [];
  const parts = [el("h2", {text: "Stages × data-parallel replicas (what-if slowdown)"})];
  if (!byStage.length || !byDp.length) {
    parts.push(el("p", {class: "muted", id: "whatif-grid-empty", text: "Not decomposed: S is below the decomposition threshold, or too few steps."}));
  } else {
    const shown = byDp.slice(0, 64);
    const cell = v => {
      const x = Math.min(1, Math.max(0, (v - 1) / Math.max(0.05, (w.slowdown || 1) - 1)));
      return el("td", {class: "num", style: "background:rgba(215,25,28," + (0.08 + 0.6 * x).toFixed(2) + ")", text: v.toFixed(3)});
    };
    parts.push(el("table", {id: "whatif-grid"},
      el("tr", {}, el("th", {text: "stage \\ replica"}), shown.map((_, i) => el("th", {class: "num", text: String(i)})), el("th", {class: "num", text: "stage S"})),
      byStage.map((sv, s) => el("tr", {}, el("th", {text: String(s)}), shown.map(dv => cell(Math.min(sv, dv))), el("td", {class: "num", text: sv.toFixed(3)}))),
      el("tr", {}, el("th", {text: "replica S"}), shown.map(dv => el("td", {class: "num", text: dv.toFixed(3)})), el("td", {}))));
  }
  const groups = w.slowdownByOpGroup || [];
  if (groups.length) {
    parts.push(el("p", {class: "muted", id: "whatif-ops", text: "by op: " + groups.slice(0, 8).map(g => g.name + " " + Number(g.slowdown).toFixed(3)).join(", ")}));
  }
  const points = (w.perStep || []).map(p => ({step: Number(p.step), s: Number(p.slowdown)}));
  if (points.length >= 2) {
    const canvas = el("canvas", {id: "whatif-chart", width: 900, height: 160});
    requestAnimationFrame(() => drawSlowdown(canvas, points));
    parts.push(el("h2", {text: "S over time"}), canvas);
  }
  return el("div", {id: "whatif-section"}, parts);
}

function drawSlowdown(canvas, points) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, L = 50, B = 22, T = 8, R = 10;
  const yMax = Math.max(1.1, ...points.map(p => p.s)) * 1.02;
  const xMin = points[0].step, xMax = points[points.length - 1].step;
  const x = s => L + (s - xMin) / Math.max(1, xMax - xMin) * (W - L - R);
  const y = v => H - B - (v - 1) / (yMax - 1) * (H - B - T);
  ctx.clearRect(0, 0, W, H);
  ctx.fillStyle = "#6b7385"; ctx.font = "11px system-ui";
  for (let i = 0; i <= 4; i++) {
    const v = 1 + (yMax - 1) * i / 4;
    ctx.fillText(v.toFixed(2), 4, y(v) + 4);
    ctx.strokeStyle = "#eee"; ctx.beginPath(); ctx.moveTo(L, y(v)); ctx.lineTo(W - R, y(v)); ctx.stroke();
  }
  ctx.fillText("step " + xMin, L, H - 6);
  ctx.fillText("step " + xMax, W - R - 70, H - 6);
  ctx.strokeStyle = "#d7191c"; ctx.lineWidth = 2; ctx.beginPath();
  points.forEach((p, i) => (i ? ctx.lineTo : ctx.moveTo).call(ctx, x(p.step), y(p.s)));
  ctx.stroke();
  canvas.dataset.points = String(points.length);
}

function memoryCard(d) {
  const m = d.memory || {};
  return el("div", {class: "card", id: "memory-card"},
    el("h2", {}, "Memory: ", el("span", {id: "memory-label", text: memoryLabel(m.label)}), " ", badge(m.severity)),
    el("dl", {class: "kv"},
      el("dt", {text: "worst peak"}), el("dd", {text: m.allocated ? bytes(m.allocated.worstPeakBytes) + " (rank " + m.allocated.worstRank + ")" : "—"}),
      el("dt", {text: "median peak"}), el("dd", {text: m.allocated ? bytes(m.allocated.medianPeakBytes) : "—"}),
      el("dt", {text: "capacity"}), el("dd", {text: bytes(m.deviceCapacityBytes)}),
      el("dt", {text: "pressure"}), el("dd", {text: m.pressure ? pct(m.pressure) : "—"}),
      el("dt", {text: "steps to full"}), el("dd", {text: m.projectedStepsToFull !== undefined ? m.projectedStepsToFull : "—"}),
      el("dt", {text: "note"}), el("dd", {text: m.note || "—"})));
}

function evidenceTable(d) {
  const phases = ((d.step || {}).phases || []).filter(p => p.medianSeconds > 0 || p.worstSeconds > 0);
  if (!phases.length) return el("p", {class: "muted", text: "No phase evidence yet."});
  return el("table", {id: "evidence"},
    el("thead", {}, el("tr", {}, ["phase", "median", "worst", "worst rank", "skew", "top offenders"].map(t => el("th", {text: t})))),
    el("tbody", {}, phases.map(p => el("tr", {},
      el("td", {text: label(p.phase, "PHASE_")}),
      el("td", {class: "num", text: ms(p.medianSeconds)}),
      el("td", {class: "num", text: ms(p.worstSeconds)}),
      el("td", {class: "num"}, el("a", {href: rankUrl(d.trainingJob, p.worstRank), text: p.worstRank})),
      el("td", {class: "num", text: pct(p.skew)}),
      el("td", {text: (p.topOffenders || []).map(o => "rank " + o.rank + " +" + ms(o.excessSeconds)).join(", ") || "—"})))));
}

// The heatmap: one row per rank (grouped by node, collapsible, or flat), one column per step;
// colour = the value against the median of the window (blue below, yellow at, red above);
// culprit ranks marked in the left strip. Drawn on a canvas (one pixel row per rank at most),
// so a 16,384-rank job is one image.
const STRIP = 6;
// The heatmap in its binary form (/heatmap?format=f32): a JSON header, then the values as
// 32-bit floats (NaN where a rank did not report), nothing to parse.
async function fetchHeatmap(job, metric) {
  const r = await fetch("/api/v1/" + jobPath(job) + "/heatmap?format=f32" + (metric ? "&metric=" + encodeURIComponent(metric) : ""));
  if (!r.ok) throw new Error((await r.json().catch(() => ({}))).error || "HTTP " + r.status);
  const buf = await r.arrayBuffer();
  const size = new DataView(buf).getUint32(0, true);
  const h = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 4, size)));
  const offset = Math.ceil((4 + size) / 4) * 4;
  h.values = new Float32Array(buf, offset, (buf.byteLength - offset) / 4);
  return h;
}

async function loadHeatmap(job) {
  try {
    jobState.heatmap = await fetchHeatmap(job, jobState.metric);
  } catch (e) {  // a metric this job's steps do not hold: its default
    jobState.metric = "";
    jobState.heatmap = await fetchHeatmap(job, "");
  }
  jobState.metric = jobState.heatmap.metric;
  jobState.heatmapAt = Date.now();
}

function heatmapSection(job) {
  const h = jobState.heatmap;
  if (!h || !h.steps || !h.steps.length) return el("p", {class: "muted", text: "No stored steps yet."});
  const select = el("select", {id: "heatmap-metric", onchange: async e => {
      jobState.metric = e.target.value;
      await loadHeatmap(job);
      drawHeatmap();
    }},
    (h.metrics || []).map(k => el("option", {value: k, text: k.toLowerCase() + (k === "OWN" || k === "STEP" ? " time" : ""), selected: k === h.metric})));
  const grouping = el("select", {id: "heatmap-grouping", onchange: e => { jobState.grouping = e.target.value; drawHeatmap(); }},
    el("option", {value: "node", text: "grouped by node", selected: jobState.grouping === "node"}),
    el("option", {value: "rank", text: "flat by rank", selected: jobState.grouping === "rank"}));
  return el("div", {id: "heatmap-section"},
    el("div", {class: "controls"}, "value ", select, grouping,
      el("span", {class: "muted", text: h.worldSize + " ranks × " + h.steps.length + " steps (" + h.steps[0] + "–" + h.steps[h.steps.length - 1] + ")" + (h.truncated ? ", older steps left out" : "")})),
    el("div", {class: "heatmap-wrap"}, el("div", {class: "heatmap-labels", id: "heatmap-labels"}), el("canvas", {id: "heatmap"})),
    el("div", {class: "legend"}, "faster", el("span", {class: "swatch"}), "slower than the step's median rank (±50 %)",
      el("span", {class: "culprit", text: "▌culprit"}), el("span", {id: "heatmap-hover"})));
}

// Rows to draw: [{label, ranks:[...], node}] in order.
function heatmapRows(h) {
  const n = h.worldSize;
  if (jobState.grouping === "rank") return {rows: [...Array(n).keys()].map(r => ({ranks: [r]})), groups: []};
  const byNode = new Map();
  for (let r = 0; r < n; r++) {
    const node = (h.rankNodes || [])[r] || "(unknown node)";
    if (!byNode.has(node)) byNode.set(node, []);
    byNode.get(node).push(r);
  }
  const rows = [], groups = [];
  for (const [node, ranks] of [...byNode.entries()].sort((a, b) => a[1][0] - b[1][0])) {
    const start = rows.length;
    if (jobState.collapsed.has(node)) rows.push({ranks, node});  // one row: the worst of the node
    else for (const r of ranks) rows.push({ranks: [r], node});
    groups.push({node, start, end: rows.length, collapsed: jobState.collapsed.has(node), count: ranks.length});
  }
  return {rows, groups};
}

function drawHeatmap() {
  const h = jobState.heatmap;
  const canvas = document.getElementById("heatmap");
  if (!h || !canvas) return;
  const values = h.values || [];
  const steps = h.steps.length;
  const {rows, groups} = heatmapRows(h);
  // Pixel sizes: cells as large as fit in ~1000 x 600 px, at least one pixel; more rows than
  // pixels: rows share a pixel row (its worst value).
  const cellW = Math.max(1, Math.min(12, Math.floor(1000 / steps)));
  const rowsPerPx = Math.max(1, Math.ceil(rows.length / 4000));
  const pxRows = Math.ceil(rows.length / rowsPerPx);
  const cellH = Math.max(1, Math.min(12, Math.floor(600 / pxRows)));
  const width = STRIP + steps * cellW, height = pxRows * cellH;
  canvas.width = width;
  canvas.height = height;
  canvas.style.width = width + "px";
  canvas.style.height = height + "px";
  // Each step's median over the ranks: the colour scale's centre for that step's column, so a
  // rank stands out against its peers in the same step (a sample of 2,001 ranks a step).
  const n = h.worldSize;
  const stride = Math.max(1, Math.floor(n / 2001));
  const medians = new Float64Array(steps);
  for (let s = 0; s < steps; s++) {
    const col = [];
    for (let r = 0; r < n; r += stride) { const v = values[r * steps + s]; if (v === v) col.push(v); }
    col.sort((a, b) => a - b);
    medians[s] = col.length ? col[Math.floor(col.length / 2)] || 1e-9 : 1;
  }
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(width, height);
  const px = new Uint32Array(img.data.buffer);  // one RGBA pixel each (little-endian: ABGR)
  const rgba = c => (255 << 24 | c[2] << 16 | c[1] << 8 | c[0]) >>> 0;
  const GREY = rgba([235, 235, 235]), WHITE = rgba([255, 255, 255]), MARK = rgba([0, 184, 212]);
  const culprits = new Set(h.culpritRanks || []);
  const culpritY = [];
  const fill = (x0, y0, w, hgt, c) => {
    for (let y = y0; y < y0 + hgt; y++) px.fill(c, y * width + x0, y * width + x0 + w);
  };
  for (let pr = 0; pr < pxRows; pr++) {
    const y0 = pr * cellH;
    const k0 = pr * rowsPerPx, k1 = Math.min(rows.length, k0 + rowsPerPx);
    let isCulprit = false;
    for (let k = k0; k < k1; k++) for (const r of rows[k].ranks) if (culprits.has(r)) isCulprit = true;
    for (let s = 0; s < steps; s++) {
      let worst = NaN;
      for (let k = k0; k < k1; k++) {
        const ranks = rows[k].ranks;
        for (let i = 0; i < ranks.length; i++) {
          const v = values[ranks[i] * steps + s];
          if (v === v && !(v <= worst)) worst = v;
        }
      }
      fill(STRIP + s * cellW, y0, cellW, cellH, worst === worst ? PALETTE[paletteIndex(worst / medians[s])] : GREY);
    }
    fill(0, y0, STRIP, cellH, isCulprit ? MARK : WHITE);
    if (isCulprit) culpritY.push(y0);
  }
  ctx.putImageData(img, 0, 0);
  canvas.dataset.culpritY = culpritY.join(",");
  canvas.dataset.rowsPerPixel = rowsPerPx;
  canvas.dataset.drawnAt = String(performance.now());
  // Node labels (grouped): click to collapse or expand a node.
  const labels = document.getElementById("heatmap-labels");
  labels.replaceChildren();
  if (groups.length && rowsPerPx === 1 && cellH >= 8) {
    for (const g of groups) {
      labels.append(el("div", {class: "node", title: "click to " + (g.collapsed ? "expand" : "collapse"),
        style: "height:" + ((g.end - g.start) * cellH) + "px; line-height:" + cellH + "px",
        text: (g.collapsed ? "▸ " : "▾ ") + g.node + " (" + g.count + ")",
        onclick: () => { jobState.collapsed.has(g.node) ? jobState.collapsed.delete(g.node) : jobState.collapsed.add(g.node); drawHeatmap(); }}));
    }
  }
  canvas.onmousemove = e => {
    const rect = canvas.getBoundingClientRect();
    const s = Math.floor((e.clientX - rect.left - STRIP) / cellW);
    const k = Math.floor((e.clientY - rect.top) / cellH) * rowsPerPx;
    const hover = document.getElementById("heatmap-hover");
    if (s < 0 || s >= steps || k >= rows.length) { hover.textContent = ""; return; }
    const r = rows[k].ranks[0];
    const v = values[r * steps + s];
    hover.textContent = (rows[k].ranks.length > 1 ? "node " + rows[k].node : "rank " + r) + ", step " + h.steps[s] + ": " + (v === v ? v.toFixed(2) + " ms" : "—");
  };
  canvas.onclick = e => {
    const rect = canvas.getBoundingClientRect();
    const k = Math.floor((e.clientY - rect.top) / cellH) * rowsPerPx;
    if (k < rows.length && rows[k].ranks.length === 1) location.href = rankUrl(jobState.job, rows[k].ranks[0]);
  };
}

// ratio 1 = median: yellow; below (down to 0.5x): towards blue; above (up to 1.5x): towards
// red. 256 colours, as RGBA pixels.
const PALETTE = (() => {
  const lo = [44, 123, 182], mid = [255, 255, 191], hi = [215, 25, 28];
  const out = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let t = i / 255 * 2 - 1;
    const [a, b] = t < 0 ? [mid, lo] : [mid, hi];
    t = Math.abs(t);
    const c = [0, 1, 2].map(j => Math.round(a[j] + (b[j] - a[j]) * t));
    out[i] = (255 << 24 | c[2] << 16 | c[1] << 8 | c[0]) >>> 0;
  }
  return out;
})();
function paletteIndex(ratio) {
  const t = Math.max(-1, Math.min(1, (ratio - 1) / 0.5));
  return Math.round((t + 1) / 2 * 255);
}

// The memory trend: worst and median rank over the job's life, the capacity, and the projection
// to full along the trend.
function memoryChart(d) {
  const m = d.memory || {};
  const points = m.trendPoints || [];
  if (points.length < 2) return el("p", {class: "muted", id: "memory-chart-empty", text: "No memory reported yet."});
  const canvas = el("canvas", {id: "memory-chart", width: 900, height: 260});
  requestAnimationFrame(() => drawMemory(canvas, m, points));
  return el("div", {}, canvas,
    el("div", {class: "legend"}, el("span", {style: "color:#d7191c", text: "— worst rank"}),
      el("span", {style: "color:#2c7bb6", text: "— median rank"}),
      el("span", {style: "color:#888", text: "- - capacity, projection"})));
}

function drawMemory(canvas, m, points) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, L = 70, B = 24, T = 10, R = 10;
  const last = points[points.length - 1];
  const capacity = Number(m.deviceCapacityBytes || 0);
  const toFull = m.projectedStepsToFull !== undefined ? Number(m.projectedStepsToFull) : null;
  let xMax = last.step, yMax = Math.max(...points.map(p => p.worstBytes));
  if (capacity) yMax = Math.max(yMax, capacity);
  if (toFull !== null && toFull < 10 * last.step) xMax = last.step + toFull;
  const xMin = points[0].step;
  const x = s => L + (s - xMin) / Math.max(1, xMax - xMin) * (W - L - R);
  const y = b => H - B - b / Math.max(1, yMax * 1.05) * (H - B - T);
  ctx.clearRect(0, 0, W, H);
  ctx.fillStyle = "#6b7385";
  ctx.font = "11px system-ui";
  for (let i = 0; i <= 4; i++) {
    const b = yMax * 1.05 * i / 4;
    ctx.fillText(bytes(b), 4, y(b) + 4);
    ctx.strokeStyle = "#eee";
    ctx.beginPath(); ctx.moveTo(L, y(b)); ctx.lineTo(W - R, y(b)); ctx.stroke();
  }
  ctx.fillText("step " + Math.round(xMin), L, H - 6);
  ctx.fillText("step " + Math.round(xMax), W - R - 80, H - 6);
  const line = (key, colour) => {
    ctx.strokeStyle = colour; ctx.lineWidth = 2; ctx.setLineDash([]);
    ctx.beginPath();
    points.forEach((p, i) => (i ? ctx.lineTo : ctx.moveTo).call(ctx, x(p.step), y(p[key])));
    ctx.stroke();
  };
  line("medianBytes", "#2c7bb6");
  line("worstBytes", "#d7191c");
  ctx.setLineDash([5, 4]); ctx.strokeStyle = "#888"; ctx.lineWidth = 1;
  if (capacity) { ctx.beginPath(); ctx.moveTo(L, y(capacity)); ctx.lineTo(W - R, y(capacity)); ctx.stroke(); }
  if (toFull !== null && capacity) {
    ctx.beginPath(); ctx.moveTo(x(last.step), y(last.worstBytes)); ctx.lineTo(x(last.step + toFull), y(capacity)); ctx.stroke();
  }
  canvas.dataset.points = String(points.length);
}

// A pipeline job's straggler alert comes from its what-if verdict.
function alertNote(a) {
  const e = a.evidence || {}, w = e.whatif;
  if (a.kind === "ALERT_STRAGGLER" && w && w.verdict && w.verdict !== "none" && w.verdict !== "balanced") return w.note;
  return a.kind && a.kind.startsWith("ALERT_MEMORY") ? (e.memory || {}).note : (e.step || {}).note;
}

function alertTable(alerts) {
  if (!alerts.length) return el("p", {class: "muted", id: "alerts-empty", text: "No alert."});
  return el("table", {id: "alerts"},
    el("thead", {}, el("tr", {}, ["time", "alert", "subject", "state", "severity", "why"].map(t => el("th", {text: t})))),
    el("tbody", {}, alerts.map(a => el("tr", {},
      el("td", {text: new Date(Number(a.atUnixNs) / 1e6).toLocaleTimeString()}),
      el("td", {text: label(a.kind, "ALERT_")}),
      // A node's subject ("node:gpu-3") links to the node's record.
      el("td", {}, String(a.subject || "").startsWith("node:") ? nodeLink(a.subject.slice(5), {text: a.subject}) : a.subject),
      el("td", {text: label(a.state, "ALERT_")}),
      el("td", {}, badge(a.severity)),
      el("td", {text: alertNote(a) || "—"})))));
}

function captureTable(job, captures) {
  if (!captures.length) return el("p", {class: "muted", id: "captures-empty", text: "No capture."});
  return el("table", {id: "captures"},
    el("thead", {}, el("tr", {}, ["capture", "state", "ranks", "requested by", "top operator (culprit over reference, per step)"].map(t => el("th", {text: t})))),
    el("tbody", {}, captures.map(c => {
      const top = (c.comparison || [])[0];
      return el("tr", {},
        el("td", {text: c.id}),
        el("td", {text: label(c.state, "CAPTURE_") + (c.reason ? ": " + c.reason : "")}),
        el("td", {}, (c.ranks || []).flatMap((r, i) => [i ? ", " : "",
          el("a", {href: rankUrl(job, r.rank), text: r.rank + (r.role ? " (" + r.role + ")" : "")})])),
        el("td", {text: c.requestedBy || "—"}),
        el("td", {text: top ? top.name + " in " + top.phase + " +" + ms(top.excessSecondsPerStep) : "—"}));
    })));
}

// The newest capture of `rank` with a comparison (this rank as the culprit or the reference):
// operator by operator, self time per step on each, largest excess first.
function comparisonTable(rank, captures) {
  const c = captures.find(c => (c.comparison || []).length && (c.culpritRank === rank || c.referenceRank === rank));
  if (!c) return null;
  return el("div", {},
    el("h2", {text: "Capture " + c.id + ": rank " + c.culpritRank + " against rank " + c.referenceRank}),
    el("table", {id: "capture-comparison"},
      el("thead", {}, el("tr", {}, ["operator", "phase", "rank " + c.culpritRank, "rank " + c.referenceRank, "excess per step"].map(t => el("th", {text: t})))),
      el("tbody", {}, c.comparison.slice(0, 15).map(o => el("tr", {},
        el("td", {text: o.name}),
        el("td", {text: o.phase}),
        el("td", {class: "num", text: ms(o.culpritSecondsPerStep)}),
        el("td", {class: "num", text: ms(o.referenceSecondsPerStep)}),
        el("td", {class: "num", text: (o.excessSecondsPerStep >= 0 ? "+" : "") + ms(o.excessSecondsPerStep)}))))));
}

// --- rank ----------------------------------------------------------------------------------
// The rank's value of one metric step by step over the window against each step's median
// rank (own time by default).
const rankState = {metric: ""};

function drawRankChart(canvas, h) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, L = 64, B = 22, T = 8, R = 10;
  const steps = h.steps || [];
  const all = [...h.values, ...h.medians].filter(v => v !== null);
  const yMax = Math.max(1e-6, ...all) * 1.1;
  const x = i => L + i / Math.max(1, steps.length - 1) * (W - L - R);
  const y = v => H - B - v / yMax * (H - B - T);
  ctx.clearRect(0, 0, W, H);
  ctx.fillStyle = "#6b7385";
  ctx.font = "11px system-ui";
  for (let i = 0; i <= 4; i++) {
    const v = yMax * i / 4;
    ctx.fillText(v.toFixed(1) + " ms", 4, y(v) + 4);
    ctx.strokeStyle = "#eee";
    ctx.beginPath(); ctx.moveTo(L, y(v)); ctx.lineTo(W - R, y(v)); ctx.stroke();
  }
  if (steps.length) {
    ctx.fillText("step " + steps[0], L, H - 6);
    ctx.fillText("step " + steps[steps.length - 1], W - R - 70, H - 6);
  }
  const line = (values, colour) => {
    ctx.strokeStyle = colour; ctx.lineWidth = 2;
    ctx.beginPath();
    let pen = false;
    values.forEach((v, i) => {
      if (v === null) { pen = false; return; }
      (pen ? ctx.lineTo : ctx.moveTo).call(ctx, x(i), y(v));
      pen = true;
    });
    ctx.stroke();
  };
  line(h.medians, "#2c7bb6");
  line(h.values, "#d7191c");
  canvas.dataset.steps = String(steps.length);
}

async function rankSeries(job, rank) {
  const q = "?rank=" + rank + (rankState.metric ? "&metric=" + encodeURIComponent(rankState.metric) : "");
  try {
    return await api(jobPath(job) + "/heatmap" + q);
  } catch (e) {
    rankState.metric = "";
    return api(jobPath(job) + "/heatmap?rank=" + rank).catch(() => null);
  }
}

function rankSection(job, rank, h) {
  if (!h || !(h.steps || []).length) return el("p", {class: "muted", text: "No stored steps yet."});
  const canvas = el("canvas", {id: "rank-chart", width: 900, height: 240});
  const select = el("select", {id: "rank-metric", onchange: async e => {
      rankState.metric = e.target.value;
      const next = await rankSeries(job, rank);
      if (next) drawRankChart(canvas, next);
    }},
    (h.metrics || []).map(k => el("option", {value: k, text: k.toLowerCase() + (k === "OWN" || k === "STEP" ? " time" : ""), selected: k === h.metric})));
  requestAnimationFrame(() => drawRankChart(canvas, h));
  return el("div", {}, el("div", {class: "controls"}, "value ", select), canvas,
    el("div", {class: "legend"}, el("span", {style: "color:#d7191c", text: "— rank " + rank}),
      el("span", {style: "color:#2c7bb6", text: "— median rank of each step"})));
}

async function rankPage(job, rank) {
  setCrumbs(el("a", {href: "/ui/", text: "jobs"}), el("a", {href: jobUrl(job), text: job}), el("a", {href: rankUrl(job, rank), text: "rank " + rank}));
  document.title = "rankwatch — " + job + " rank " + rank;
  let r, captures, series;
  try {
    [r, captures, series] = await Promise.all([api(jobPath(job) + "/ranks/" + rank),
      api(jobPath(job) + "/captures").catch(() => ({captures: []})), rankSeries(job, rank)]);
    rankState.metric = series ? series.metric : "";
  } catch (e) {
    app.replaceChildren(el("h1", {text: job + " — rank " + rank}), el("p", {class: "error", text: e.message}));
    return schedule(() => rankPage(job, rank), REFRESH_MS);
  }
  const phases = r.phases || [];
  const max = Math.max(1e-9, ...phases.map(p => p.seconds));
  const mine = (captures.captures || []).filter(c => (c.ranks || []).some(x => x.rank === rank));
  const k = r.kernel;
  app.replaceChildren(
    el("h1", {text: job + " — rank " + rank}),
    el("dl", {class: "kv"},
      el("dt", {text: "node"}), el("dd", {id: "rank-node"}, r.node ? nodeLink(r.node) : "—"),
      el("dt", {text: "pod"}), el("dd", {text: r.pod || "—"}),
      el("dt", {text: "window"}), el("dd", {text: r.windowSteps + " steps to step " + r.lastStep}),
      el("dt", {text: "memory peaks"}), el("dd", {text: "allocated " + bytes(r.peakAllocatedBytes) + ", reserved " + bytes(r.peakReservedBytes)})),
    el("h2", {text: "Step by step against the median rank"}), rankSection(job, rank, series),
    el("h2", {text: "Phases against the median rank (per-step means over the window)"}),
    phases.length ? el("table", {id: "rank-phases"},
      el("thead", {}, el("tr", {}, ["phase", "this rank", "median rank", "excess", ""].map(t => el("th", {text: t})))),
      el("tbody", {}, phases.map(p => el("tr", {},
        el("td", {text: label(p.phase, "PHASE_")}),
        el("td", {class: "num", text: ms(p.seconds)}),
        el("td", {class: "num", text: ms(p.seconds - p.excessSeconds)}),
        el("td", {class: "num", text: (p.excessSeconds >= 0 ? "+" : "") + ms(p.excessSeconds)}),
        el("td", {}, el("span", {class: "bar", style: "width:" + Math.round(200 * (p.seconds - Math.max(0, p.excessSeconds)) / max) + "px"}),
          el("span", {class: "bar excess", style: "width:" + Math.round(200 * Math.max(0, p.excessSeconds) / max) + "px"}))))))
      : el("p", {class: "muted", text: "No steps in the window."}),
    el("h2", {text: "GPU timeline"}),
    k ? el("dl", {class: "kv", id: "rank-kernel"},
      el("dt", {text: "steps analysed"}), el("dd", {text: k.steps + " (" + k.firstStep + "–" + k.lastStep + ")"}),
      el("dt", {text: "kernel time"}), el("dd", {text: ms(k.kernelSeconds)}),
      el("dt", {text: "idle"}), el("dd", {text: ms(k.idleSeconds) + " (" + pct(k.idleShare) + "): host wait " + ms(k.idleHostWaitSeconds) + ", kernel wait " + ms(k.idleKernelWaitSeconds) + ", other " + ms(k.idleOtherSeconds)}),
      el("dt", {text: "compute"}), el("dd", {text: ms(k.computeSeconds)}),
      el("dt", {text: "communication"}), el("dd", {text: ms(k.communicationSeconds) + " (" + pct(k.communicationShare) + "), overlapped " + ms(k.commOverlapSeconds)}),
      el("dt", {text: "launches"}), el("dd", {text: k.launches + (k.launchDelayMaxSeconds ? ", longest delay " + ms(k.launchDelayMaxSeconds) : "")}),
      el("dt", {text: "stands apart"}), el("dd", {text: (k.outliers || []).join("; ") || "no"}))
      : el("p", {class: "muted", text: "No kernel events from this rank."}),
    el("h2", {text: "Captures of this rank"}), captureTable(job, mine), comparisonTable(rank, mine) || "");
  setStatus("updated " + new Date().toLocaleTimeString());
  schedule(() => rankPage(job, rank), REFRESH_MS);
}

route();
