// How a rankwatch alert looks outside the daemon: the Alertmanager labels and annotations of
// an alert, its alert name (the names of deploy/prometheus/rules, so that pushed alerts and
// rule alerts route, group and inhibit alike in deploy/alertmanager/alertmanager.yml) and its
// web UI link. Shared by the Alertmanager push (alerting/alertmanager_push.h) and the action
// webhooks (alerting/alert_actions.h).
//
// Pure functions over a v1::Alert; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rankwatch/v1/service.pb.h"

namespace rankwatch {

struct AlertPresentationOptions {
  // The web UI's URL as its users reach it ("https://rankwatch.example.com"): alerts link to
  // their job's page. Empty: no link.
  std::string ui_url;
  // The runbook link; {alertname}, {kind} and {training_job} are replaced. Empty: none.
  std::string runbook_url;
};

using LabelList = std::vector<std::pair<std::string, std::string>>;  // sorted by name

struct PresentedAlert {
  LabelList labels;       // alertname, training_job, rank or node, namespace, pod, severity, ...
  LabelList annotations;  // summary (the diagnosis note), next_step, runbook_url, ...
  std::string generator_url;  // the web UI page of the job (or of the node); "" without a UI
};

// "straggler", "hang", "memory_creep", ..., "node_culprit" (the CLI's and the metrics' names).
std::string_view AlertKindLabel(v1::AlertKind kind);
// The kind of a name AlertKindLabel gives; ALERT_KIND_UNSPECIFIED for another.
v1::AlertKind AlertKindOfLabel(std::string_view label);
// "info", "warning", "critical" (the rules' severity label).
std::string_view SeverityLabel(v1::Severity severity);
// "RankwatchStraggler", "RankwatchNodeStraggler" (a straggler of node scope), "RankwatchJobHang",
// "RankwatchMemoryCreep", ..., "RankwatchNodeCulprit".
std::string AlertName(const v1::Alert& alert);

PresentedAlert Present(const v1::Alert& alert, const AlertPresentationOptions& options);

// Appends `pairs` as a JSON object of strings ({"alertname":"...",...}).
void AppendJsonObject(const LabelList& pairs, std::string* out);

}  // namespace rankwatch
