#include "alerting/alert_presentation.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "common/json_string.h"

namespace rankwatch {
namespace {

// The part of the URL path or query a name may take as it is (RFC 3986 unreserved).
std::string PercentEncode(std::string_view text) {
  std::string out;
  for (const char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    if (std::isalnum(byte) || ch == '-' || ch == '_' || ch == '.' || ch == '~') {
      out += ch;
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", byte);
      out += buf;
    }
  }
  return out;
}

void ReplaceAll(std::string* text, std::string_view from, const std::string& to) {
  for (size_t at = text->find(from); at != std::string::npos;
       at = text->find(from, at + to.size())) {
    text->replace(at, from.size(), to);
  }
}

bool IsMemoryKind(v1::AlertKind kind) {
  return kind == v1::ALERT_MEMORY_CREEP || kind == v1::ALERT_MEMORY_PRESSURE ||
         kind == v1::ALERT_MEMORY_IMBALANCE;
}

std::string_view ScopeLabel(v1::Scope scope) {
  switch (scope) {
    case v1::SCOPE_RANK: return "rank";
    case v1::SCOPE_NODE: return "node";
    case v1::SCOPE_JOB: return "job";
    default: return "";
  }
}

}  // namespace

std::string_view AlertKindLabel(v1::AlertKind kind) {
  switch (kind) {
    case v1::ALERT_STRAGGLER: return "straggler";
    case v1::ALERT_HANG: return "hang";
    case v1::ALERT_MEMORY_CREEP: return "memory_creep";
    case v1::ALERT_MEMORY_PRESSURE: return "memory_pressure";
    case v1::ALERT_MEMORY_IMBALANCE: return "memory_imbalance";
    case v1::ALERT_INPUT_BOUND: return "input_bound";
    case v1::ALERT_WAIT_HEAVY: return "wait_heavy";
    case v1::ALERT_NODE_CULPRIT: return "node_culprit";
    default: return "unknown";
  }
}

v1::AlertKind AlertKindOfLabel(std::string_view label) {
  for (int k = v1::AlertKind_MIN; k <= v1::AlertKind_MAX; ++k) {
    if (!v1::AlertKind_IsValid(k) || k == v1::ALERT_KIND_UNSPECIFIED) continue;
    if (AlertKindLabel(static_cast<v1::AlertKind>(k)) == label)
      return static_cast<v1::AlertKind>(k);
  }
  return v1::ALERT_KIND_UNSPECIFIED;
}

std::string_view SeverityLabel(v1::Severity severity) {
  switch (severity) {
    case v1::SEVERITY_CRIT: return "critical";
    case v1::SEVERITY_WARN: return "warning";
    default: return "info";
  }
}

std::string AlertName(const v1::Alert& alert) {
  switch (alert.kind()) {
    case v1::ALERT_STRAGGLER:
      return alert.scope() == v1::SCOPE_NODE || alert.subject().rfind("node:", 0) == 0
                 ? "RankwatchNodeStraggler"
                 : "RankwatchStraggler";
    case v1::ALERT_HANG: return "RankwatchJobHang";
    case v1::ALERT_MEMORY_CREEP: return "RankwatchMemoryCreep";
    case v1::ALERT_MEMORY_PRESSURE: return "RankwatchMemoryPressure";
    case v1::ALERT_MEMORY_IMBALANCE: return "RankwatchMemoryImbalance";
    case v1::ALERT_INPUT_BOUND: return "RankwatchInputBound";
    case v1::ALERT_WAIT_HEAVY: return "RankwatchWaitHeavy";
    case v1::ALERT_NODE_CULPRIT: return "RankwatchNodeCulprit";
    default: return "RankwatchAlert";
  }
}

PresentedAlert Present(const v1::Alert& alert, const AlertPresentationOptions& options) {
  PresentedAlert out;
  const std::string name = AlertName(alert);
  const v1::Diagnosis& d = alert.evidence();
  LabelList& labels = out.labels;
  labels.emplace_back("alertname", name);
  labels.emplace_back("severity", std::string(SeverityLabel(alert.severity())));
  labels.emplace_back("category", alert.kind() == v1::ALERT_NODE_CULPRIT ? "fleet"
                                  : IsMemoryKind(alert.kind())           ? "memory"
                                                                         : "step");
  if (!alert.training_job().empty()) labels.emplace_back("training_job", alert.training_job());
  std::string_view scope = ScopeLabel(alert.scope());
  const std::string& subject = alert.subject();
  std::string node;
  if (subject.rfind("rank:", 0) == 0) {
    const std::string rank = subject.substr(5);
    labels.emplace_back("rank", rank);
    if (scope.empty()) scope = "rank";
    // The culprit's pod, where the step diagnosis names the rank.
    const auto& ranks = d.step().culprit_ranks();
    for (int i = 0; i < ranks.size() && i < d.step().culprit_pods_size(); ++i) {
      if (std::to_string(ranks[i]) == rank && !d.step().culprit_pods(i).empty()) {
        labels.emplace_back("pod", d.step().culprit_pods(i));
        break;
      }
    }
  } else if (subject.rfind("node:", 0) == 0) {
    node = subject.substr(5);
    labels.emplace_back("node", node);
    if (scope.empty()) scope = "node";
  } else if (scope.empty() && !alert.training_job().empty()) {
    scope = "job";
  }
  if (!scope.empty()) labels.emplace_back("scope", std::string(scope));
  if (!d.scheduler().namespace_().empty())
    labels.emplace_back("namespace", d.scheduler().namespace_());
  std::sort(labels.begin(), labels.end());

  // The note and next step of the diagnosis that raised it.
  const bool memory = IsMemoryKind(alert.kind());
  std::string note = memory ? d.memory().note() : d.step().note();
  std::string next_step = memory ? d.memory().next_step() : d.step().next_step();
  if (note.empty() && d.has_whatif()) note = d.whatif().note();
  if (note.empty()) {
    note = (alert.training_job().empty() ? std::string() : alert.training_job() + ": ") +
           std::string(AlertKindLabel(alert.kind())) + " on " + subject;
  }
  LabelList& annotations = out.annotations;
  annotations.emplace_back("summary", note);
  if (!next_step.empty()) annotations.emplace_back("next_step", next_step);
  annotations.emplace_back("alert_id", alert.id());
  if (d.has_hang_stacks() && !d.hang_stacks().summary().empty()) {
    annotations.emplace_back("hang_stacks", d.hang_stacks().summary());
  }
  if (d.has_flight_recorder() && !d.flight_recorder().summary().empty()) {
    annotations.emplace_back("flight_recorder", d.flight_recorder().summary());
  }
  if (!options.runbook_url.empty()) {
    std::string url = options.runbook_url;
    ReplaceAll(&url, "{alertname}", name);
    ReplaceAll(&url, "{kind}", std::string(AlertKindLabel(alert.kind())));
    ReplaceAll(&url, "{training_job}", PercentEncode(alert.training_job()));
    annotations.emplace_back("runbook_url", url);
  }
  std::sort(annotations.begin(), annotations.end());

  if (!options.ui_url.empty()) {
    std::string base = options.ui_url;
    while (!base.empty() && base.back() == '/') base.pop_back();
    if (!alert.training_job().empty()) {
      out.generator_url = base + "/ui/jobs/" + PercentEncode(alert.training_job());
    } else if (!node.empty()) {
      out.generator_url = base + "/ui/nodes/" + PercentEncode(node);
    } else {
      out.generator_url = base + "/ui/";
    }
  }
  return out;
}

void AppendJsonObject(const LabelList& pairs, std::string* out) {
  *out += '{';
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (i > 0) *out += ',';
    *out += JsonString(pairs[i].first);
    *out += ':';
    *out += JsonString(pairs[i].second);
  }
  *out += '}';
}

}  // namespace rankwatch
