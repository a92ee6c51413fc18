#include "fleet/fleet_part.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "alerting/alert_hub.h"
#include "common/wall_clock.h"
#include "state/checkpoint_writer.h"

namespace rankwatch {

absl::Status FleetPart::Start(PartContext& context) {
  environment_ = &context.environment();
  const PartEnvironment& env = *environment_;
  NodeLedgerOptions ledger;
  ledger.horizon = options_.node_horizon;
  ledger.alert_window = options_.node_alert_window;
  ledger.alert_jobs = static_cast<uint32_t>(options_.node_alert_jobs);
  ledger_ = std::make_unique<NodeLedger>(ledger);
  if (absl::Status s = ledger_->LoadFrom(*env.store); !s.ok()) return s;
  if (!options_.nodes_topic.empty()) {
    auto opened = NodeTopic::Open(
        {env.brokers, options_.nodes_topic, env.kafka, env.telemetry_topic}, ledger_.get());
    if (opened.ok()) {
      topic_ = std::move(*opened);
      telemetry_partitions_ = topic_->telemetry_partitions();
    } else {
      spdlog::warn("fleet view of nodes: not shared with other instances: {}",
                   std::string(opened.status().message()));
    }
  }
  if (topic_ == nullptr) ledger_->SetComplete(true);
  // The node alerts firing are tracked like a job's firing alerts, under the empty job (the
  // Alertmanager push re-sends only what the alert log tracks).
  env.alerts->SetFiring("", ledger_->FiringAlertIds());
  metrics_ = std::make_unique<FleetMetrics>(env.registry, topic_.get());
  context.HookTick(this);
  context.services().Offer<NodeView>(ledger_.get());
  context.Schedule("fleet", std::chrono::seconds(1), [this](TimePoint now) { EverySecond(now); });
  context.AtCheckpoint([this] {
    if (Checkpoint nodes = ledger_->TakeUnsaved(); !nodes.empty()) {
      environment_->writer->EnqueueNoWait(std::move(nodes), nullptr);
    }
  });
  return absl::OkStatus();
}

void FleetPart::OnTick(const TickView& tick, std::vector<v1::Alert>* alerts) {
  (void)alerts;
  if (!tick.node_charges->empty()) ledger_->Charge(*tick.node_charges);
}

void FleetPart::EverySecond(TimePoint now) {
  const int64_t wall = WallNowUnixNs();
  const PartitionOwnership* partitions = environment_->partitions;
  if (partitions == nullptr || partitions->assigned() == 0) {
    assigned_since_ = {};
  } else if (assigned_since_ == TimePoint{}) {
    assigned_since_ = now;
  }
  ledger_->Prune(wall);
  std::vector<v1::NodeRecord> records = ledger_->TakeUnpublished();
  if (topic_ != nullptr) topic_->Publish(records);
  // Node alerts once the view is whole and the partitions held a while (a restart must neither
  // resolve an alert on a partial view nor drop one as another instance's).
  if (ledger_->complete() && assigned_since_ != TimePoint{} &&
      now - assigned_since_ >= std::chrono::seconds(5)) {
    auto owns_node = [&](const std::string& node) {
      return telemetry_partitions_ <= 0 ||
             partitions->Owns(PartitionOfNode(node, telemetry_partitions_));
    };
    Checkpoint state;
    std::vector<v1::Alert> alerts = ledger_->EvaluateAlerts(wall, owns_node, &state);
    if (!alerts.empty() || !state.empty()) {
      environment_->alerts->Append(std::move(alerts), std::move(state));
    }
  }
  v1::ListNodesRequest top;
  top.set_limit(static_cast<uint32_t>(std::max<int64_t>(1, options_.max_exported_nodes)));
  v1::ListNodesResponse costliest = ledger_->ListNodes(top, wall);
  if (options_.max_exported_nodes == 0) costliest.clear_nodes();  // the count only
  metrics_->Publish(costliest, *ledger_);
  // Another instance may have resolved (or raised) a node alert: the nodes topic says so.
  environment_->alerts->SetFiring("", ledger_->FiringAlertIds());
}

void FleetPart::Stop() {
  if (topic_ != nullptr) topic_->Publish(ledger_->TakeUnpublished());
}

}  // namespace rankwatch
