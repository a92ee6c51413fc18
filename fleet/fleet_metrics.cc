#include "fleet/fleet_metrics.h"

#include <utility>

namespace rankwatch {

FleetMetrics::FleetMetrics(PrometheusRegistry* r, const NodeTopic* topic) {
  nodes_ =
      r->Gauge("rankwatch_fleet_nodes",
               "Nodes in the fleet view: culprits of a straggler alert within the horizon.", {})
          ->WithLabels({});
  records_ = r->Gauge("rankwatch_fleet_node_records",
                      "(node, job) records the fleet view of nodes holds.", {})
                 ->WithLabels({});
  alerts_firing_ =
      r->Gauge(
           "rankwatch_node_alerts_firing",
           "Node alerts (a node culprit of several jobs) firing, whichever instance raised them.",
           {})
          ->WithLabels({});
  MetricFamily* topic_records = r->Counter(
      "rankwatch_nodes_topic_records_total",
      "Records of the nodes topic: published by this instance, not delivered, read (every "
      "instance's), ignored (not a record this build writes).",
      {"outcome"});
  MetricCell* published = topic_records->WithLabels({"published"});
  MetricCell* failed = topic_records->WithLabels({"failed"});
  MetricCell* read = topic_records->WithLabels({"read"});
  MetricCell* ignored = topic_records->WithLabels({"ignored"});
  if (topic != nullptr) {
    r->OnScrape([=] {
      published->Set(static_cast<double>(topic->published()));
      failed->Set(static_cast<double>(topic->failed()));
      read->Set(static_cast<double>(topic->read()));
      ignored->Set(static_cast<double>(topic->ignored()));
    });
  }
  node_jobs_ = r->Gauge("rankwatch_node_culprit_jobs",
                        "Jobs whose straggler alerts named the node (or one of its ranks) within "
                        "the horizon; the costliest nodes only (--max-exported-nodes).",
                        {"node"});
  node_lost_ = r->Gauge("rankwatch_node_lost_rank_seconds",
                        "Rank-seconds those jobs lost to the node while the alerts fired, within "
                        "the horizon.",
                        {"node"});
  node_window_jobs_ = r->Gauge(
      "rankwatch_node_culprit_jobs_in_alert_window",
      "Of those jobs, the ones that charged the node within the node alert's window.", {"node"});
}

void FleetMetrics::Publish(const v1::ListNodesResponse& top, const NodeLedger& ledger) {
  std::set<std::string> now;
  for (const v1::NodeRecord& n : top.nodes()) {
    now.insert(n.node());
    node_jobs_->WithLabels({n.node()})->Set(n.jobs());
    node_lost_->WithLabels({n.node()})->Set(n.lost_rank_seconds());
    node_window_jobs_->WithLabels({n.node()})->Set(n.jobs_in_alert_window());
  }
  for (const std::string& gone : exported_nodes_) {
    if (now.count(gone) > 0) continue;
    for (MetricFamily* f : {node_jobs_, node_lost_, node_window_jobs_}) f->RemoveSeries({gone});
  }
  exported_nodes_ = std::move(now);
  nodes_->Set(top.nodes_total());
  records_->Set(static_cast<double>(ledger.records()));
  alerts_firing_->Set(static_cast<double>(ledger.firing()));
}

}  // namespace rankwatch
