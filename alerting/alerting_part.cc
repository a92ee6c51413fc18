#include "alerting/alerting_part.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "alerting/alert_hub.h"
#include "evidence/hang_inspector.h"
#include "state/checkpoint_writer.h"

namespace rankwatch {

absl::Status AlertingPart::Start(PartContext& context) {
  (void)context;
  return absl::OkStatus();
}

absl::Status AlertingPart::Restored(PartContext& context) {
  const PartEnvironment& env = context.environment();
  AlertPresentationOptions presentation;
  presentation.runbook_url = options_.alert_runbook_url;
  presentation.ui_url = options_.ui_external_url.empty() ? env.ui_url : options_.ui_external_url;
  CheckpointWriter* writer = env.writer;
  auto persist = [writer](Checkpoint c) { writer->EnqueueNoWait(std::move(c), nullptr); };
  if (!options_.alertmanager.empty()) {
    AlertmanagerPushOptions o;
    o.urls = options_.alertmanager;
    o.http.ca_file = options_.alertmanager_ca;
    o.http.basic_auth_file = options_.alertmanager_basic_auth_file;
    o.http.bearer_token_file = options_.alertmanager_bearer_token_file;
    o.presentation = presentation;
    o.resend_interval = std::chrono::duration_cast<std::chrono::milliseconds>(
        options_.alertmanager_resend_interval);
    o.max_backoff = std::min(o.max_backoff, o.resend_interval);
    auto push = AlertmanagerPush::Create(o, env.alerts, env.store, persist, env.registry);
    if (!push.ok()) return push.status();
    alertmanager_ = std::move(*push);
    alertmanager_->Start();
  }
  if (!options_.action.empty()) {
    AlertActionsOptions o;
    for (const std::string& text : options_.action) o.rules.push_back(*ParseActionRule(text));
    o.webhooks = options_.action_webhook;
    o.secret_file = options_.action_secret_file;
    o.dry_run = options_.action_dry_run;
    o.http.ca_file = options_.action_ca;
    o.presentation = presentation;
    // Without hang stacks there is nothing to wait for.
    const bool hang_stacks = context.services().Find<HangInspector>() != nullptr;
    o.evidence_wait =
        hang_stacks
            ? std::chrono::duration_cast<std::chrono::milliseconds>(options_.action_evidence_wait)
            : std::chrono::milliseconds(0);
    auto actions = AlertActions::Create(o, env.alerts, env.store, persist, env.registry);
    if (!actions.ok()) return actions.status();
    actions_ = std::move(*actions);
    actions_->Start();
  }
  return absl::OkStatus();
}

}  // namespace rankwatch
