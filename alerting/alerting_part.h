// AlertingPart: the alert log's outbound paths (docs/alerting.md) as a part of rankwatchd
// (parts/daemon_part.h): the Alertmanager push and the action policy with its webhooks, each on
// threads of its own, their delivery state saved through the checkpoint writer; both show alerts
// with the same presentation (links to the web UI, runbooks). They start once the jobs' state is
// restored, when the alert log knows which alerts fire.
//
// Not thread-safe: started on the main thread; the paths run on their own threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "alerting/alert_actions.h"
#include "alerting/alertmanager_push.h"
#include "operators/time.h"
#include "parts/daemon_part.h"

namespace rankwatch {

struct AlertingPartOptions {
  std::vector<std::string> alertmanager;       // Alertmanager URLs; none: no push
  std::string alertmanager_ca;                 // PEM CA of https Alertmanagers; none: the system's
  std::string alertmanager_basic_auth_file;    // "user:password"
  std::string alertmanager_bearer_token_file;  // a token
  Duration alertmanager_resend_interval = std::chrono::minutes(1);
  std::string ui_external_url;      // the web UI's URL for links; none: the UI's own address
  std::string alert_runbook_url;    // runbook_url template ({alertname}, {kind}, {training_job})
  std::vector<std::string> action;  // the action policy's rules, KIND[:SEVERITY]=ACTION
  std::vector<std::string> action_webhook;  // webhook URLs of `webhook` actions
  std::string action_secret_file;           // the HMAC key of the webhook signatures
  std::string action_ca;                    // PEM CA of https webhooks; none: the system's
  bool action_dry_run = false;              // log the actions, call nothing
  // A hang alert's action waits this long for the alert's re-publication with its stacks (when
  // a part fetches hang stacks).
  Duration action_evidence_wait = std::chrono::seconds(30);
};

class AlertingPart : public DaemonPart {
 public:
  explicit AlertingPart(AlertingPartOptions options) : options_(std::move(options)) {}

  std::string_view name() const override { return "alerting"; }
  absl::Status Start(PartContext& context) override;
  absl::Status Restored(PartContext& context) override;

 private:
  const AlertingPartOptions options_;
  std::unique_ptr<AlertmanagerPush> alertmanager_;
  std::unique_ptr<AlertActions> actions_;
};

}  // namespace rankwatch
